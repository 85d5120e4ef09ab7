//! The cluster backend: PostgreSQL.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The first key of pipelines' cluster lifecycle locks (`pg_advisory_xact_lock(int, int)`),
/// apart from the price writers' single-key lock.
const CLUSTER_LOCK_CLASS: i32 = 0x51C3;

/// The first key of roles one node plays at a time (`pg_try_advisory_lock(int, int)`).
const ROLE_LOCK_CLASS: i32 = 0x51C4;

/// The PostgreSQL [`Dialect`](crate::Dialect).
#[derive(Debug, Clone, Copy)]
pub struct PgDialect;

/// Metadata in a PostgreSQL database.
pub type PgStore = crate::Store<PgDialect>;

impl PgStore {
    /// Connects to and migrates the database at `url` (`postgres://…`).
    ///
    /// # Errors
    /// A malformed URL, a connection failure or a failed migration.
    pub async fn open(url: &str) -> crate::Result<Self> {
        Self::open_with(PgConnectOptions::from_str(url)?).await
    }

    /// Opens one connection to the database at `url` and closes it, migrating nothing.
    ///
    /// # Errors
    /// [`StoreError::InvalidUrl`](crate::StoreError::InvalidUrl) or
    /// [`StoreError::Unreachable`](crate::StoreError::Unreachable), saying why.
    pub async fn check_reachable(url: &str) -> crate::Result<()> {
        use sqlx::Connection as _;
        let shown = || sluice_core::redaction::redact_password(url);
        let options = PgConnectOptions::from_str(url).map_err(|error| {
            crate::StoreError::InvalidUrl { url: shown(), reason: error.to_string() }
        })?;
        let connection = sqlx::PgConnection::connect_with(&options).await.map_err(|error| {
            let reason = match &error {
                sqlx::Error::Io(io) => crate::io_reason(io),
                sqlx::Error::Database(database) => database.message().to_owned(),
                other => other.to_string(),
            };
            crate::StoreError::Unreachable { url: shown(), reason }
        })?;
        // The answer is in; a failed goodbye changes nothing.
        let _ = connection.close().await;
        Ok(())
    }

    /// Like [`PgStore::open`] with explicit options (tests use a private `search_path`).
    ///
    /// # Errors
    /// A connection failure or a failed migration.
    pub async fn open_with(options: PgConnectOptions) -> crate::Result<Self> {
        let pool = PgPoolOptions::new().max_connections(16).connect_with(options).await?;
        let store = Self::on_pool(pool);
        store.migrate().await?;
        Ok(store)
    }
}

impl crate::Dialect for PgDialect {
    type Db = sqlx::Postgres;

    const BACKEND: crate::migrations::Backend = crate::migrations::Backend::Postgres;

    /// `json_agg` of text gives a JSON array of strings (`COALESCE` for an empty page).
    const JSON_AGG: &str = "COALESCE(json_agg(value), '[]')::text";

    /// Pages of a set (`WHERE set_id = ? AND seq > ? ORDER BY seq LIMIT n`) must walk the
    /// `(set_id, seq)` key. Until ANALYZE has seen a set, the planner takes it for a few rows
    /// and picks a bitmap scan of everything past the cursor plus a sort: observed as two
    /// seconds per page of a fresh 10 M-value set. These make that plan the last resort for
    /// the rest of the transaction.
    const INDEX_ORDER: &'static [&'static str] = &[
        "SET LOCAL enable_sort = off",
        "SET LOCAL enable_bitmapscan = off",
        "SET LOCAL enable_seqscan = off",
    ];

    /// Locks the pipeline row against other filter-value writers, updates and its deletion
    /// until commit. `NO KEY UPDATE` still lets other transactions insert rows that refer to
    /// the pipeline (their foreign-key checks take `KEY SHARE`).
    const LOCK_PIPELINE: &str =
        "SELECT pipeline_config FROM pipelines WHERE id = $1 FOR NO KEY UPDATE";

    /// Price writers of every process take this transaction-scoped lock (the number is
    /// arbitrary, fixed), so two never merge into the same candle at once.
    const LOCK_PRICES: Option<&'static str> = Some("SELECT pg_advisory_xact_lock(6105211300)");
    const LOCK_EVENTS: Option<&'static str> = Some("SELECT pg_advisory_xact_lock(6105211301)");
    const EVENTS_PER_INSERT: usize = 400;

    /// Whether the table named `$1` exists (a bool).
    const TABLE_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables \
        WHERE schemaname = current_schema() AND tablename = $1)";

    /// PostgreSQL plans the join by its statistics (and allows no `ON` after `CROSS JOIN`).
    const VALUES_JOIN: &str = "JOIN";

    /// The packed points of a group (migration 8), concatenated in no promised order (the
    /// reader sorts them by window start, which each point holds).
    const CONCAT_POINTS: &str = "string_agg(point, ''::bytea)";

    /// Candle rows without a packed point (the planner takes their partial index).
    const WITHOUT_POINT: &str = "price_candles p";

    const NOW_MS: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";

    /// A transaction-scoped advisory lock in the class of pipeline lifecycle locks, keyed
    /// by a hash of the pipeline id (two ids sharing a hash only wait for each other).
    async fn cluster_lock(
        pool: &sqlx::Pool<Self::Db>,
        key: &str,
    ) -> crate::Result<crate::nodes::ClusterLock> {
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(CLUSTER_LOCK_CLASS)
            .bind(key)
            .execute(&mut *tx)
            .await?;
        Ok(crate::nodes::ClusterLock::held(tx))
    }

    /// A session-scoped advisory lock in the class of roles, on a connection kept out of
    /// the pool for as long as the role is held.
    async fn try_role(
        pool: &sqlx::Pool<Self::Db>,
        key: &str,
    ) -> crate::Result<Option<crate::nodes::RoleLock>> {
        let mut connection = pool.acquire().await?;
        let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
            .bind(ROLE_LOCK_CLASS)
            .bind(key)
            .fetch_one(&mut *connection)
            .await?;
        Ok(taken.then(|| crate::nodes::RoleLock::held_by(connection)))
    }

    async fn signal(pool: &sqlx::Pool<Self::Db>, channel: &str) -> crate::Result<()> {
        sqlx::query("SELECT pg_notify($1, '')").bind(channel).execute(pool).await?;
        Ok(())
    }

    /// `LISTEN` on a connection of its own, forwarded by a task; sqlx reconnects it after a
    /// lost connection (signals sent meanwhile are lost).
    async fn listen(
        pool: &sqlx::Pool<Self::Db>,
        channel: &str,
    ) -> crate::Result<Option<tokio::sync::mpsc::Receiver<()>>> {
        let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
        listener.listen(channel).await?;
        let (sender, receiver) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    // A full channel already holds a wake-up.
                    Ok(_) => {
                        if let Err(tokio::sync::mpsc::error::TrySendError::Closed(())) =
                            sender.try_send(())
                        {
                            return;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cluster signal listener; reconnecting");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        if sender.is_closed() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Some(receiver))
    }

    fn rows_affected(done: &<Self::Db as sqlx::Database>::QueryResult) -> u64 {
        done.rows_affected()
    }

    /// A write transaction without JIT compilation. Bulk filter-value statements look
    /// expensive to the planner, which then JIT-compiles each 50,000-value chunk with
    /// optimisation and inlining: a second or more per statement, several times the work.
    async fn begin_write(pool: &sqlx::Pool<Self::Db>) -> crate::Result<crate::dialect::Tx<Self>> {
        let mut tx = pool.begin().await?;
        sqlx::query("SET LOCAL jit = off").execute(&mut *tx).await?;
        Ok(tx)
    }

    /// `REPEATABLE READ`: every statement of the transaction sees the snapshot of its first.
    async fn begin_snapshot(
        pool: &sqlx::Pool<Self::Db>,
    ) -> crate::Result<crate::dialect::Tx<Self>> {
        Ok(pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await?)
    }
}
