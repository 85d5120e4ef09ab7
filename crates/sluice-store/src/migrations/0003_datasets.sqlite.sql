-- Datasets: named lists of string values owned by a user (docs/contract.md §Dataset).
--
-- `seq` is the small internal number entries are stored under (as filter_sets.id is for
-- filter values): every entry's index row holds an integer instead of the 36-character id.
-- AUTOINCREMENT so a seq is never reused: a dataset created later always has a greater seq,
-- which is how in-memory indexes tell a dataset from an older one of the same name.
-- `entry_count` is kept by every writer (they hold the write lock), so `total_count` is one
-- row read; `version` counts entry changes, so in-memory indexes apply them in commit order.
CREATE TABLE datasets (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    owner_user_id TEXT NOT NULL REFERENCES users (id),
    name TEXT NOT NULL,
    entry_count BIGINT NOT NULL,
    version BIGINT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (owner_user_id, name)
);

-- One row per entry. WITHOUT ROWID: the primary key is the table, so an entry costs one
-- b-tree row, membership is one probe, and the listing (ascending by value, the cursor being
-- the last value) is a range read of the key. No foreign key (a lookup per inserted entry):
-- whoever deletes a dataset deletes its entries in the same transaction.
CREATE TABLE dataset_entries (
    dataset_seq INTEGER NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (dataset_seq, value)
) WITHOUT ROWID;
