-- Filter values move to a table keyed by a small set id and get an increasing `seq`, the
-- cursor of the listing; see the SQLite script for why, and for why filter_values has no
-- foreign key. Constraints, indexes and identity sequences are named so the old table's
-- names do not collide.
--
-- Two indexes per value: the membership key (set_id, value), which is the primary key, and
-- the listing's (set_id + 0, seq). The `+ 0` is deliberate: an index that starts with plain
-- set_id is a candidate for every `set_id = ? AND value …` statement, and for a set id its
-- statistics have not seen yet the planner estimates the set at one row and picks it,
-- then reads the whole set (and sorts it) for every statement: observed as minutes for a
-- 50,000-value chunk. The listing query spells `set_id + 0` to use it; nothing else can.
--
-- The value sequence keeps its default CACHE 1: cached ranges per session would hand out
-- seqs out of commit order. Values compare bytewise (COLLATE "C"), as on SQLite: they are
-- identifiers, not words, and a linguistic default collation (en_US.UTF-8 and the like)
-- would make every index comparison several times slower.
CREATE TABLE filter_sets (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline_id TEXT NOT NULL REFERENCES pipelines (id) ON DELETE CASCADE,
    transform_uid TEXT NOT NULL,
    value_count BIGINT NOT NULL,
    UNIQUE (pipeline_id, transform_uid)
);
INSERT INTO filter_sets (pipeline_id, transform_uid, value_count)
    SELECT pipeline_id, transform_uid, COUNT(*) FROM filter_values GROUP BY 1, 2 ORDER BY 1, 2;

CREATE TABLE filter_values_v2 (
    seq BIGINT GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME filter_values_seq_seq),
    set_id BIGINT NOT NULL,
    value TEXT COLLATE "C" NOT NULL,
    CONSTRAINT filter_values_member_pkey PRIMARY KEY (set_id, value)
);
INSERT INTO filter_values_v2 (set_id, value)
    SELECT s.id, v.value FROM filter_values v
    JOIN filter_sets s ON s.pipeline_id = v.pipeline_id AND s.transform_uid = v.transform_uid
    ORDER BY s.id, v.value;
DROP TABLE filter_values;
ALTER TABLE filter_values_v2 RENAME TO filter_values;
CREATE INDEX filter_values_page ON filter_values ((set_id + 0), seq);

CREATE TABLE deployments (
    pipeline_id TEXT PRIMARY KEY REFERENCES pipelines (id) ON DELETE CASCADE,
    state TEXT NOT NULL,
    pipeline TEXT NOT NULL,
    deployed_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
