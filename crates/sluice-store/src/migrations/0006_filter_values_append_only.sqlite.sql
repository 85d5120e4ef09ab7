-- Filter values become an append-only list per set, and membership moves to memory
-- (crates/sluice-store/src/filter_sets.rs, docs/set-filter.md).
--
-- The unique `(set_id, value)` key made every bulk load into a large set rewrite pages all
-- over a random-key B-tree: loading 10,000,000 values slowed to a quarter of the rate of the
-- first million (BENCHMARKS.md §4). The table is now clustered on `(set_id, seq)` alone, so
-- adding values appends to the end of its set, listing pages by cursor read one range, and
-- one B-tree is written per value instead of three. Which values a set holds is decided by
-- the store's in-memory set, checked against `filter_sets.version`, which every write of the
-- set increments in its transaction.
--
-- `seq` is no longer an AUTOINCREMENT rowid: `filter_value_seq` hands out seqs, continuing
-- from the highest ever given, so a seq is still never reused (a cursor handed out before a
-- set was cleared or dropped never hides a later value).
ALTER TABLE filter_sets ADD COLUMN version BIGINT NOT NULL DEFAULT 0;

CREATE TABLE filter_value_seq (last BIGINT NOT NULL);
INSERT INTO filter_value_seq (last) SELECT MAX(
    COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'filter_values'), 0),
    COALESCE((SELECT MAX(seq) FROM filter_values), 0));

CREATE TABLE filter_values_v3 (
    set_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (set_id, seq)
) WITHOUT ROWID;
INSERT INTO filter_values_v3 (set_id, seq, value)
    SELECT set_id, seq, value FROM filter_values ORDER BY set_id, seq;
DROP TABLE filter_values;
ALTER TABLE filter_values_v3 RENAME TO filter_values;
