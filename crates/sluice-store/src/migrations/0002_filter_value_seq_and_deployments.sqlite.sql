-- Filter values get an increasing `seq`, the cursor of the listing: a value added later has
-- a higher seq, so paging by `seq > cursor` neither skips nor repeats values while others add
-- to the set. SQLite cannot add a key column in place, so the table is rebuilt.
-- AUTOINCREMENT (not a plain rowid) so that a seq is never reused after the highest rows are
-- deleted; reuse would hide a new value behind a cursor already handed out.
CREATE TABLE filter_values_v2 (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline_id TEXT NOT NULL REFERENCES pipelines (id) ON DELETE CASCADE,
    transform_uid TEXT NOT NULL,
    value TEXT NOT NULL,
    UNIQUE (pipeline_id, transform_uid, value)
);
INSERT INTO filter_values_v2 (pipeline_id, transform_uid, value)
    SELECT pipeline_id, transform_uid, value FROM filter_values
    ORDER BY pipeline_id, transform_uid, value;
DROP TABLE filter_values;
ALTER TABLE filter_values_v2 RENAME TO filter_values;
CREATE INDEX filter_values_by_seq ON filter_values (pipeline_id, transform_uid, seq);

-- What the runtime runs: one row per deployed or paused pipeline. `pipeline` is the JSON of
-- the configuration snapshot taken at the last deploy.
CREATE TABLE deployments (
    pipeline_id TEXT PRIMARY KEY REFERENCES pipelines (id) ON DELETE CASCADE,
    state TEXT NOT NULL,
    pipeline TEXT NOT NULL,
    deployed_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
