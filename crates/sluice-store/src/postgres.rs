//! The cluster backend: PostgreSQL.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Metadata in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PgStore {
    pub(crate) pool: sqlx::PgPool,
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

    /// One `INSERT … SELECT … FROM UNNEST($2::text[])` per chunk instead of a row per value.
    ///
    /// No `ON CONFLICT DO NOTHING`: PostgreSQL implements it as a speculative insertion that
    /// costs about two and a half times a plain insert (an extra index probe and WAL record
    /// per row). Values already present are left out instead, which is safe because the
    /// caller holds the pipeline lock (nobody else writes this set meanwhile) and `values`
    /// holds each value once:
    /// - when the set holds at most as many values as the request (its kept count says so),
    ///   the set is read (a read costs less than a probe) and only the missing values are
    ///   inserted, plainly: the usual bulk load into a new or small set;
    /// - otherwise each value is probed in the membership key by a `LIMIT`ed lateral
    ///   subquery (15% faster than `ON CONFLICT` on 100,000-value batches into a growing
    ///   set). The membership key is the only index on plain `set_id` (migration 2), so the
    ///   probe cannot be planned as a scan of the set.
    async fn insert_values(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        set_id: i64,
        values: &[&str],
        known_absent: bool,
    ) -> crate::Result<u64> {
        if values.is_empty() {
            return Ok(0);
        }
        let mut present = std::collections::HashSet::new();
        let size: i64 = if known_absent {
            0
        } else {
            sqlx::query("SELECT value_count FROM filter_sets WHERE id = $1")
                .bind(set_id)
                .fetch_one(&mut **tx)
                .await?
                .try_get("value_count")?
        };
        let read_all = size <= values.len() as i64
            && (size == 0
                || Self::scan_set(tx, set_id, Some(values.len()), |value| {
                    present.insert(value);
                })
                .await?);
        let missing: Vec<&str>;
        let (values, sql) = if read_all {
            missing = if present.is_empty() {
                values.to_vec()
            } else {
                values.iter().copied().filter(|v| !present.contains(*v)).collect()
            };
            (
                missing.as_slice(),
                "INSERT INTO filter_values (set_id, value) SELECT $1, v FROM UNNEST($2::text[]) AS v",
            )
        } else {
            (
                values,
                "INSERT INTO filter_values (set_id, value) \
                 SELECT $1, v FROM UNNEST($2::text[]) AS v \
                 LEFT JOIN LATERAL (SELECT 1 AS hit FROM filter_values f \
                     WHERE f.set_id = $1 AND f.value = v LIMIT 1) AS present \
                 ON true WHERE present.hit IS NULL",
            )
        };
        let mut added = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            added +=
                sqlx::query(sql).bind(set_id).bind(chunk).execute(&mut **tx).await?.rows_affected();
        }
        Ok(added)
    }

    /// Finds each value's row by a probe of the membership key and deletes the rows found by
    /// their row ids. The plain `set_id = $1 AND value = ANY($2)` leaves the access path to
    /// the planner, which read the whole table (or, for a set id its statistics have not
    /// seen, the whole set) for every chunk.
    async fn delete_values(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        set_id: i64,
        values: &[&str],
    ) -> crate::Result<u64> {
        let mut removed = 0;
        for chunk in values.chunks(VALUES_PER_STATEMENT) {
            removed += sqlx::query(
                "DELETE FROM filter_values WHERE ctid = ANY(ARRAY(\
                 SELECT hit.ctid FROM UNNEST($2::text[]) AS v CROSS JOIN LATERAL \
                 (SELECT f.ctid FROM filter_values f WHERE f.set_id = $1 AND f.value = v LIMIT 1) AS hit))",
            )
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
