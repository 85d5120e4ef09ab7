-- Filter values get an increasing `seq`, the cursor of the listing: a value added later has
-- a higher seq, so paging by `seq > cursor` neither skips nor repeats values while others add
-- to the set. SQLite cannot add a key column in place, so the table is rebuilt.
--
-- AUTOINCREMENT (not a plain rowid) so that a seq is never reused after the highest rows are
-- deleted; reuse would hide a new value behind a cursor already handed out. The index on
-- (pipeline_id, transform_uid) carries the rowid (`seq`) as its last key, so it serves
-- `WHERE pipeline_id = ? AND transform_uid = ? AND seq > ? ORDER BY seq`.
--
-- No foreign key to `pipelines`: checking it costs a lookup per inserted value, and sets are
-- loaded a million values at a time. The store keeps the invariant itself instead: every
-- writer first reads the pipeline row (and its config) in the same write transaction, and
-- deleting a pipeline deletes its values in the transaction that deletes the pipeline.
CREATE TABLE filter_values_v2 (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline_id TEXT NOT NULL,
    transform_uid TEXT NOT NULL,
    value TEXT NOT NULL,
    UNIQUE (pipeline_id, transform_uid, value)
);
INSERT INTO filter_values_v2 (pipeline_id, transform_uid, value)
    SELECT pipeline_id, transform_uid, value FROM filter_values
    ORDER BY pipeline_id, transform_uid, value;
DROP TABLE filter_values;
ALTER TABLE filter_values_v2 RENAME TO filter_values;
CREATE INDEX filter_values_by_seq ON filter_values (pipeline_id, transform_uid);

-- What the runtime runs: one row per deployed or paused pipeline. `pipeline` is the JSON of
-- the configuration snapshot taken at the last deploy.
CREATE TABLE deployments (
    pipeline_id TEXT PRIMARY KEY REFERENCES pipelines (id) ON DELETE CASCADE,
    state TEXT NOT NULL,
    pipeline TEXT NOT NULL,
    deployed_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
