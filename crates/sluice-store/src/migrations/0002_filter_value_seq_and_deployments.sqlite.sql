-- Filter values move to a table keyed by a small set id, and get an increasing `seq`, the
-- cursor of the listing: a value added later has a higher seq, so paging by `seq > cursor`
-- neither skips nor repeats values while others add to the set.
--
-- `filter_sets` names each set once, (pipeline_id, transform_uid) -> id, so the two indexes
-- every value needs hold an integer instead of a 36-character pipeline id and the uid:
-- half the index bytes, cheaper comparisons, and about twice the insert rate on a load of a
-- million values (measured), for sets meant to reach 10M+ values.
-- `value_count` is kept by every writer (they hold the pipeline lock), so counting a set of
-- 10M values is one row read, not a scan.
--
-- AUTOINCREMENT (not a plain rowid) so that neither a seq nor a set id is reused after the
-- highest rows are deleted; reuse would hide a new value behind a cursor already handed out.
-- The listing's index carries the rowid (`seq`) as its last key, so it serves
-- `WHERE set_id + 0 = ? AND seq > ? ORDER BY seq`; it indexes `set_id + 0` rather than
-- set_id so that statements on `set_id = ? AND value …` can only use the membership key
-- (see the PostgreSQL script, whose planner needed that).
--
-- No foreign key on filter_values: checking it costs a lookup per inserted value. The store
-- keeps the invariant itself: every writer first reads the pipeline row (and its config) in
-- the same write transaction, and whoever deletes a set or its pipeline deletes its values
-- in that transaction.
CREATE TABLE filter_sets (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline_id TEXT NOT NULL REFERENCES pipelines (id) ON DELETE CASCADE,
    transform_uid TEXT NOT NULL,
    value_count BIGINT NOT NULL,
    UNIQUE (pipeline_id, transform_uid)
);
INSERT INTO filter_sets (pipeline_id, transform_uid, value_count)
    SELECT pipeline_id, transform_uid, COUNT(*) FROM filter_values GROUP BY 1, 2 ORDER BY 1, 2;

CREATE TABLE filter_values_v2 (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    set_id INTEGER NOT NULL,
    value TEXT NOT NULL,
    UNIQUE (set_id, value)
);
INSERT INTO filter_values_v2 (set_id, value)
    SELECT s.id, v.value FROM filter_values v
    JOIN filter_sets s ON s.pipeline_id = v.pipeline_id AND s.transform_uid = v.transform_uid
    ORDER BY s.id, v.value;
DROP TABLE filter_values;
ALTER TABLE filter_values_v2 RENAME TO filter_values;
CREATE INDEX filter_values_page ON filter_values (set_id + 0);

-- What the runtime runs: one row per deployed or paused pipeline. `pipeline` is the JSON of
-- the configuration snapshot taken at the last deploy.
CREATE TABLE deployments (
    pipeline_id TEXT PRIMARY KEY REFERENCES pipelines (id) ON DELETE CASCADE,
    state TEXT NOT NULL,
    pipeline TEXT NOT NULL,
    deployed_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
