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

crate::sql::metadata_store_impl!(SqliteStore, sqlx::Sqlite);
