-- Datasets: see the SQLite script for the layout and why. The identity sequence keeps the
-- default CACHE 1, so a dataset created later has a greater seq. Values compare bytewise
-- (COLLATE "C"), as on SQLite: the listing is in the same order on both backends, and a
-- linguistic collation would make every index comparison several times slower.
CREATE TABLE datasets (
    seq BIGINT GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME datasets_seq_seq) UNIQUE,
    id TEXT PRIMARY KEY,
    owner_user_id TEXT NOT NULL REFERENCES users (id),
    name TEXT NOT NULL,
    entry_count BIGINT NOT NULL,
    version BIGINT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (owner_user_id, name)
);

CREATE TABLE dataset_entries (
    dataset_seq BIGINT NOT NULL,
    value TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (dataset_seq, value)
);
