//! The cluster backend: PostgreSQL.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Metadata in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PgStore {
    pub(crate) pool: sqlx::PgPool,
    pub(crate) sets: std::sync::Arc<crate::filter_sets::SetCache>,
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
        let store = Self { pool, sets: crate::filter_sets::SetCache::shared() };
        store.migrate().await?;
        Ok(store)
    }
}

/// Values per bulk filter-value statement, bound as one `text[]`: big enough that a million
/// values take 20 round trips, small enough to keep each statement's memory modest.
const VALUES_PER_STATEMENT: usize = 50_000;

impl PgStore {
    const BACKEND: crate::migrations::Backend = crate::migrations::Backend::Postgres;

    /// Locks the pipeline row against other filter-value writers, updates and its deletion
    /// until commit. `NO KEY UPDATE` still lets other transactions insert rows that refer to
    /// the pipeline (their foreign-key checks take `KEY SHARE`).
    const LOCK_PIPELINE: &str =
        "SELECT pipeline_config FROM pipelines WHERE id = $1 FOR NO KEY UPDATE";

    /// Price writers of every process take this transaction-scoped lock (the number is
    /// arbitrary, fixed), so two never merge into the same candle at once.
    const LOCK_PRICES: Option<&str> = Some("SELECT pg_advisory_xact_lock(6105211300)");

    /// PostgreSQL plans the join by its statistics (and allows no `ON` after `CROSS JOIN`).
    const VALUES_JOIN: &str = "JOIN";

    /// A write transaction without JIT compilation. Bulk filter-value statements look
    /// expensive to the planner, which then JIT-compiles each 50,000-value chunk with
    /// optimisation and inlining: a second or more per statement, several times the work.
    async fn begin_write(&self) -> crate::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET LOCAL jit = off").execute(&mut *tx).await?;
        Ok(tx)
    }

    /// Appends `values` to set `set_id` in order, one `INSERT … SELECT … FROM UNNEST` per
    /// chunk; the identity sequence numbers the rows as they come.
    async fn insert_values(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        set_id: i64,
        values: &[&str],
    ) -> crate::Result<u64> {
        let mut added = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            added += sqlx::query(
                "INSERT INTO filter_values (set_id, value) SELECT $1, v FROM UNNEST($2::text[]) AS v",
            )
            .bind(set_id)
            .bind(chunk)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        }
        Ok(added)
    }

    async fn delete_rows(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        set_id: i64,
        seqs: &[i64],
    ) -> crate::Result<u64> {
        let mut removed = 0;
        for chunk in seqs.chunks(VALUES_PER_STATEMENT) {
            removed += sqlx::query("DELETE FROM filter_values WHERE set_id = $1 AND seq = ANY($2)")
                .bind(set_id)
                .bind(chunk)
                .execute(&mut **tx)
                .await?
                .rows_affected();
        }
        Ok(removed)
    }
}

crate::sql::metadata_store_impl!(PgStore, sqlx::Postgres);
crate::prices::price_store_impl!(PgStore, sqlx::Postgres);
