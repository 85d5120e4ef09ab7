//! Dataset statements particular to SQLite.

use crate::datasets::DatasetSql;
use crate::sqlite::json_array;
use crate::{Result, SqliteDialect};

/// Values per bulk statement, passed as one JSON array (see the filter-value statements in
/// `filter_values/sqlite.rs` for why JSON rather than a bind parameter per value).
const VALUES_PER_STATEMENT: usize = 50_000;

impl DatasetSql for SqliteDialect {
    /// SQLite has one writer at a time and `BEGIN IMMEDIATE` takes that lock at the start, so
    /// reading the row inside the write transaction locks it.
    const LOCK_DATASET: &str = "SELECT seq, id, owner_user_id, name, entry_count, \
        version, created_at, updated_at FROM datasets WHERE id = $1 AND owner_user_id = $2";

    /// SQLite checks the primary key as part of the insert, so `ON CONFLICT DO NOTHING` costs no
    /// more than the insert itself.
    async fn insert_entries(
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        seq: i64,
        values: &[&str],
        _size: u64,
    ) -> Result<u64> {
        let mut added = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            // `WHERE true` tells SQLite's parser that ON CONFLICT is the upsert clause.
            added += sqlx::query(
                "INSERT INTO dataset_entries (dataset_seq, value) \
                 SELECT $1, value FROM json_each($2) WHERE true ON CONFLICT DO NOTHING",
            )
            .bind(seq)
            .bind(json_array(chunk))
            .execute(&mut **tx)
            .await?
            .rows_affected();
        }
        Ok(added)
    }

    async fn delete_entries(
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        seq: i64,
        values: &[&str],
    ) -> Result<u64> {
        let mut removed = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            removed += sqlx::query(
                "DELETE FROM dataset_entries \
                 WHERE dataset_seq = $1 AND value IN (SELECT value FROM json_each($2))",
            )
            .bind(seq)
            .bind(json_array(chunk))
            .execute(&mut **tx)
            .await?
            .rows_affected();
        }
        Ok(removed)
    }
}
