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

/// Values per bulk filter-value statement, bound as one `text[]`: big enough that a million
/// values take 20 round trips, small enough to keep each statement's memory modest.
const VALUES_PER_STATEMENT: usize = 50_000;

impl PgStore {
    const BACKEND: crate::migrations::Backend = crate::migrations::Backend::Postgres;

    /// Locks the pipeline row against other filter-value writers (and against its deletion)
    /// until commit. `NO KEY UPDATE` still lets other transactions insert rows that refer to
    /// the pipeline (their foreign-key checks take `KEY SHARE`).
    const LOCK_PIPELINE: &str = "SELECT id FROM pipelines WHERE id = $1 FOR NO KEY UPDATE";

    async fn begin_write(&self) -> crate::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        Ok(self.pool.begin().await?)
    }

    /// One `INSERT … SELECT … FROM UNNEST($3::text[])` per chunk instead of a row per value.
    async fn insert_values(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[&str],
    ) -> crate::Result<u64> {
        let mut added = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            added += sqlx::query(
                "INSERT INTO filter_values (pipeline_id, transform_uid, value) \
                 SELECT $1, $2, v FROM UNNEST($3::text[]) AS v ON CONFLICT DO NOTHING",
            )
            .bind(pipeline_id)
            .bind(transform_uid)
            .bind(chunk)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        }
        Ok(added)
    }

    async fn delete_values(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[&str],
    ) -> crate::Result<u64> {
        let mut removed = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            removed += sqlx::query(
                "DELETE FROM filter_values \
                 WHERE pipeline_id = $1 AND transform_uid = $2 AND value = ANY($3::text[])",
            )
            .bind(pipeline_id)
            .bind(transform_uid)
            .bind(chunk)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        }
        Ok(removed)
    }
}

crate::sql::metadata_store_impl!(PgStore, sqlx::Postgres);
