-- Filter values get an increasing `seq`, the cursor of the listing (see the SQLite script for
-- why, and for why there is no foreign key to `pipelines`). The table is rebuilt as on SQLite
-- so both keep the same column order; constraints and the identity sequence are named so the
-- old table's names do not collide.
--
-- The primary key (pipeline_id, transform_uid, seq) is also the index the listing pages
-- through; with the membership key that makes two indexes per value, which is what a
-- million-value load pays for. The sequence keeps its default CACHE 1: cached ranges per
-- session would hand out seqs out of commit order.
CREATE TABLE filter_values_v2 (
    seq BIGINT GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME filter_values_seq_seq),
    pipeline_id TEXT NOT NULL,
    transform_uid TEXT NOT NULL,
    value TEXT NOT NULL,
    CONSTRAINT filter_values_seq_pkey PRIMARY KEY (pipeline_id, transform_uid, seq),
    CONSTRAINT filter_values_member_key UNIQUE (pipeline_id, transform_uid, value)
);
INSERT INTO filter_values_v2 (pipeline_id, transform_uid, value)
    SELECT pipeline_id, transform_uid, value FROM filter_values
    ORDER BY pipeline_id, transform_uid, value;
DROP TABLE filter_values;
ALTER TABLE filter_values_v2 RENAME TO filter_values;

CREATE TABLE deployments (
    pipeline_id TEXT PRIMARY KEY REFERENCES pipelines (id) ON DELETE CASCADE,
    state TEXT NOT NULL,
    pipeline TEXT NOT NULL,
    deployed_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
