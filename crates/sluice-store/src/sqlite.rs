//! The embedded default: one SQLite file in WAL mode.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

/// Metadata in a SQLite database file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: sqlx::SqlitePool,
}

impl SqliteStore {
    /// Opens (creating when missing) and migrates the database at `url` (`sqlite://<path>`).
    ///
    /// # Errors
    /// A malformed URL, an unopenable file or a failed migration.
    pub async fn open(url: &str) -> crate::Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // WAL + NORMAL is durable across process crashes; only an OS crash can lose the
            // last transactions.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new().max_connections(8).connect_with(options).await?;
        let store = Self { pool };
        store.migrate().await?;
        Ok(store)
    }
}

/// Values per bulk filter-value statement. Each is one bind parameter (the pipeline id and
/// uid are bound once, as `$1` and `$2`), so this stays under SQLite's limit of 32,766.
const VALUES_PER_STATEMENT: usize = 10_000;

impl SqliteStore {
    const BACKEND: crate::migrations::Backend = crate::migrations::Backend::Sqlite;

    /// SQLite has one writer at a time; `BEGIN IMMEDIATE` (below) already serialises
    /// filter-value writers, so this only checks the pipeline exists.
    const LOCK_PIPELINE: &str = "SELECT id FROM pipelines WHERE id = $1";

    /// A transaction that takes the write lock at once. A deferred transaction that reads
    /// first and writes later fails (it is not retried after `busy_timeout`) when another
    /// connection wrote in between.
    async fn begin_write(&self) -> crate::Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// `INSERT … VALUES ($1, $2, $3), ($1, $2, $4), …` per chunk: one prepared statement (cached
    /// for full chunks) per 10,000 values.
    async fn insert_values(
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[&str],
    ) -> crate::Result<u64> {
        let mut added = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            let mut sql = String::with_capacity(80 + chunk.len() * 16);
            sql.push_str("INSERT INTO filter_values (pipeline_id, transform_uid, value) VALUES ");
            push_value_rows(&mut sql, chunk.len());
            sql.push_str(" ON CONFLICT DO NOTHING");
            let mut query = sqlx::query(&sql).bind(pipeline_id).bind(transform_uid);
            for value in chunk {
                query = query.bind(*value);
            }
            added += query.execute(&mut **tx).await?.rows_affected();
        }
        Ok(added)
    }

    async fn delete_values(
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[&str],
    ) -> crate::Result<u64> {
        let mut removed = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            let mut sql = String::with_capacity(100 + chunk.len() * 8);
            sql.push_str(
                "DELETE FROM filter_values WHERE pipeline_id = $1 AND transform_uid = $2 AND value IN (",
            );
            for index in 0..chunk.len() {
                if index > 0 {
                    sql.push_str(", ");
                }
                sql.push('$');
                sql.push_str(&(index + 3).to_string());
            }
            sql.push(')');
            let mut query = sqlx::query(&sql).bind(pipeline_id).bind(transform_uid);
            for value in chunk {
                query = query.bind(*value);
            }
            removed += query.execute(&mut **tx).await?.rows_affected();
        }
        Ok(removed)
    }
}

/// `($1, $2, $3), ($1, $2, $4), …` for `rows` values.
fn push_value_rows(sql: &mut String, rows: usize) {
    use std::fmt::Write as _;
    for index in 0..rows {
        if index > 0 {
            sql.push_str(", ");
        }
        let _ = write!(sql, "($1, $2, ${})", index + 3);
    }
}

crate::sql::metadata_store_impl!(SqliteStore, sqlx::Sqlite);
