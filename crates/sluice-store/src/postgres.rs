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

    /// Locks the pipeline row against other filter-value writers, updates and its deletion
    /// until commit. `NO KEY UPDATE` still lets other transactions insert rows that refer to
    /// the pipeline (their foreign-key checks take `KEY SHARE`).
    const LOCK_PIPELINE: &str =
        "SELECT pipeline_config FROM pipelines WHERE id = $1 FOR NO KEY UPDATE";

    /// A write transaction without JIT compilation. Bulk filter-value statements look
    /// expensive to the planner, which then JIT-compiles each 50,000-value chunk with
    /// optimisation and inlining: a second or more per statement, several times the work.
    async fn begin_write(&self) -> crate::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET LOCAL jit = off").execute(&mut *tx).await?;
        Ok(tx)
    }

    /// One `INSERT … SELECT … FROM UNNEST($3::text[])` per chunk instead of a row per value.
    ///
    /// No `ON CONFLICT DO NOTHING`: PostgreSQL implements it as a speculative insertion that
    /// costs about two and a half times a plain insert (an extra index probe and WAL record
    /// per row). Values that are present already are filtered out by an index probe instead
    /// (a `LIMIT`ed lateral subquery, which the planner cannot turn into a scan of the whole
    /// table), and not even that when the caller knows them absent or the set is empty, as
    /// on a first load. This is safe because the caller holds the pipeline lock, so nobody
    /// else writes this set meanwhile, and `values` holds each value once.
    async fn insert_values(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[&str],
        known_absent: bool,
    ) -> crate::Result<u64> {
        if values.is_empty() {
            return Ok(0);
        }
        let occupied = !known_absent
            && sqlx::query(
                "SELECT 1 AS hit FROM filter_values \
                 WHERE pipeline_id = $1 AND transform_uid = $2 LIMIT 1",
            )
            .bind(pipeline_id)
            .bind(transform_uid)
            .fetch_optional(&mut **tx)
            .await?
            .is_some();
        let sql = if occupied {
            "INSERT INTO filter_values (pipeline_id, transform_uid, value) \
             SELECT $1, $2, v FROM UNNEST($3::text[]) AS v \
             LEFT JOIN LATERAL (SELECT 1 AS hit FROM filter_values f \
                 WHERE f.pipeline_id = $1 AND f.transform_uid = $2 AND f.value = v LIMIT 1) AS present \
             ON true WHERE present.hit IS NULL"
        } else {
            "INSERT INTO filter_values (pipeline_id, transform_uid, value) \
             SELECT $1, $2, v FROM UNNEST($3::text[]) AS v"
        };
        let mut added = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            added += sqlx::query(sql)
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
