-- Set history (docs/set-filter.md, "Set history"): one row per change of a set filter's
-- values, its counts and, in `filter_set_change_values`, the values it actually added and
-- removed (not snapshots of the set), encoded compactly (`crates/sluice-store/src/set_history.rs`). `changed_ms` is the change's
-- time in Unix milliseconds; `position` is the pipeline's source stream head when the change
-- committed (the highest block ingested into that stream), NULL when this process did not
-- know it.
CREATE TABLE filter_set_changes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline_id TEXT NOT NULL REFERENCES pipelines (id) ON DELETE CASCADE,
    transform_uid TEXT NOT NULL,
    changed_ms BIGINT NOT NULL,
    kind TEXT NOT NULL,
    given BIGINT NOT NULL,
    added BIGINT NOT NULL,
    removed BIGINT NOT NULL,
    count_after BIGINT NOT NULL,
    position BIGINT
);
CREATE INDEX filter_set_changes_by_set ON filter_set_changes (pipeline_id, transform_uid, id);
CREATE INDEX filter_set_changes_by_time ON filter_set_changes (changed_ms);
-- The values of each change, in parts of about a mebibyte (a change may carry millions of
-- values): part `part` of the values it added and of those it removed. A change that added
-- and removed nothing has no part.
CREATE TABLE filter_set_change_values (
    change_id BIGINT NOT NULL REFERENCES filter_set_changes (id) ON DELETE CASCADE,
    part BIGINT NOT NULL,
    added_values BLOB NOT NULL,
    removed_values BLOB NOT NULL,
    PRIMARY KEY (change_id, part)
);
-- How far back a set's history reaches: changes at or before (`reaches_ms`,
-- `reaches_position`) are not recorded (pruned, or made before recording began). A row with
-- an empty `transform_uid` covers every set of the pipeline: this migration writes one for
-- every pipeline that exists now, whose earlier changes were never recorded.
CREATE TABLE filter_set_history_horizons (
    pipeline_id TEXT NOT NULL REFERENCES pipelines (id) ON DELETE CASCADE,
    transform_uid TEXT NOT NULL,
    reaches_ms BIGINT NOT NULL,
    reaches_position BIGINT,
    PRIMARY KEY (pipeline_id, transform_uid)
);
INSERT INTO filter_set_history_horizons (pipeline_id, transform_uid, reaches_ms, reaches_position)
SELECT id, '', CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), NULL FROM pipelines;
