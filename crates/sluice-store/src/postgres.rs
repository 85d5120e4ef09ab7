//! The cluster backend: PostgreSQL.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Metadata in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: sqlx::PgPool,
}

impl PgStore {
    /// Connects to and migrates the database at `url` (`postgres://…`).
    ///
    /// # Errors
    /// A malformed URL, a connection failure or a failed migration.
    pub async fn open(url: &str) -> crate::Result<Self> {
        Self::open_with(PgConnectOptions::from_str(url)?).await
    }

    /// Like [`PgStore::open`] with explicit options (tests use a private `search_path`).
    ///
    /// # Errors
    /// A connection failure or a failed migration.
    pub async fn open_with(options: PgConnectOptions) -> crate::Result<Self> {
        let pool = PgPoolOptions::new().max_connections(16).connect_with(options).await?;
        let store = Self { pool };
        store.migrate().await?;
        Ok(store)
    }
}

crate::sql::metadata_store_impl!(PgStore, sqlx::Postgres);
