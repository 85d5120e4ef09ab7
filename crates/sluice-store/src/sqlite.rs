//! The embedded default: one SQLite file in WAL mode.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

/// The SQLite [`Dialect`](crate::Dialect).
#[derive(Debug, Clone, Copy)]
pub struct SqliteDialect;

/// Metadata in a SQLite database file.
pub type SqliteStore = crate::Store<SqliteDialect>;

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
            .foreign_keys(true)
            // Up to 64 MiB of page cache per connection (allocated as used; SQLite's default
            // is 2 MiB): a set of millions of values has an index of hundreds of MiB, and
            // inserting into it misses the cache on almost every value with the default.
            .pragma("cache_size", "-65536")
            // Checkpoints run in the background (below), not in the request that happens to
            // cross the threshold; this high threshold is only a safety net.
            .pragma("wal_autocheckpoint", WAL_SAFETY_CHECKPOINT_PAGES.to_string());
        let pool = SqlitePoolOptions::new().max_connections(8).connect_with(options).await?;
        let store = Self::on_pool(pool);
        store.migrate().await?;
        tokio::spawn(checkpoint_in_background(store.pool.clone()));
        Ok(store)
    }
}

/// How often the background checkpointer copies committed WAL pages into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);
/// WAL pages after which the committing connection checkpoints by itself (about 400 MiB):
/// reached only when the background checkpointer falls far behind.
const WAL_SAFETY_CHECKPOINT_PAGES: u32 = 100_000;

/// Copies committed WAL pages into the database file every [`CHECKPOINT_EVERY`], so that a
/// large write (a million filter values) does not pay for its checkpoint before it answers:
/// with SQLite's default the connection that commits past 1,000 WAL pages checkpoints inline,
/// which was about 30 % of the time of a bulk filter-value load. `PASSIVE` never blocks
/// readers or writers. Ends when the pool is closed.
async fn checkpoint_in_background(pool: sqlx::SqlitePool) {
    let mut ticks = tokio::time::interval(CHECKPOINT_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if pool.is_closed() {
            return;
        }
        if let Err(error) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&pool).await {
            if pool.is_closed() {
                return;
            }
            tracing::warn!(%error, "background WAL checkpoint failed");
        }
    }
}

impl crate::Dialect for SqliteDialect {
    type Db = sqlx::Sqlite;

    const BACKEND: crate::migrations::Backend = crate::migrations::Backend::Sqlite;

    const JSON_AGG: &str = "json_group_array(value)";

    /// SQLite reads `WHERE set_id = ? AND seq > ? ORDER BY seq` along the key by itself.
    const INDEX_ORDER: &'static [&'static str] = &[];

    /// SQLite has one writer at a time, and `BEGIN IMMEDIATE` (below) takes that lock at the
    /// start, so reading the row inside a write transaction is enough.
    const LOCK_PIPELINE: &str = "SELECT pipeline_config FROM pipelines WHERE id = $1";

    /// `BEGIN IMMEDIATE` already serialises price writers.
    const LOCK_PRICES: Option<&'static str> = None;
    const LOCK_EVENTS: Option<&'static str> = None;
    const EVENTS_PER_INSERT: usize = 16;

    /// Whether the table named `$1` exists (a bool).
    const TABLE_EXISTS: &str =
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = $1)";

    /// `CROSS JOIN` makes SQLite keep the left side (the keys) as the outer loop; with a
    /// plain join and no statistics it may scan the whole candle table per statement.
    const VALUES_JOIN: &str = "CROSS JOIN";

    /// The packed points of a group (migration 8), concatenated as one blob: `group_concat`
    /// keeps a blob's bytes as they are (text in the database's encoding, UTF-8), and the
    /// cast hands them out as a blob. In no promised order (the reader sorts them by window
    /// start, which each point holds): an `ORDER BY` here sorts every group, which took
    /// more time than the rest of a history read.
    const CONCAT_POINTS: &str = "CAST(group_concat(point, '') AS BLOB)";

    /// Candle rows without a packed point, through their (partial) index: SQLite's planner
    /// would otherwise scan the series' rows of the primary key a second time.
    const WITHOUT_POINT: &str = "price_candles p INDEXED BY price_candles_without_point";

    const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

    /// One process uses a SQLite file: its own per-pipeline lock serialises.
    async fn cluster_lock(
        _pool: &sqlx::Pool<Self::Db>,
        _key: &str,
    ) -> crate::Result<crate::nodes::ClusterLock> {
        Ok(crate::nodes::ClusterLock::local())
    }

    async fn try_role(
        _pool: &sqlx::Pool<Self::Db>,
        _key: &str,
    ) -> crate::Result<Option<crate::nodes::RoleLock>> {
        Ok(Some(crate::nodes::RoleLock::local()))
    }

    async fn signal(_pool: &sqlx::Pool<Self::Db>, _channel: &str) -> crate::Result<()> {
        Ok(())
    }

    async fn listen(
        _pool: &sqlx::Pool<Self::Db>,
        _channel: &str,
    ) -> crate::Result<Option<tokio::sync::mpsc::Receiver<()>>> {
        Ok(None)
    }

    fn rows_affected(done: &<Self::Db as sqlx::Database>::QueryResult) -> u64 {
        done.rows_affected()
    }

    /// A transaction that takes the write lock at once. A deferred transaction that reads
    /// first and writes later fails (it is not retried after `busy_timeout`) when another
    /// connection wrote in between.
    async fn begin_write(pool: &sqlx::Pool<Self::Db>) -> crate::Result<crate::dialect::Tx<Self>> {
        Ok(pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// A deferred transaction reads from one WAL snapshot, taken at its first read.
    async fn begin_snapshot(
        pool: &sqlx::Pool<Self::Db>,
    ) -> crate::Result<crate::dialect::Tx<Self>> {
        Ok(pool.begin().await?)
    }
}

/// `values` as a JSON array of strings. Values that need no escaping (the usual addresses and
/// symbols) are copied as they are, which is most of the cost of building the array.
pub(crate) fn json_array(values: &[&str]) -> String {
    let mut out = String::with_capacity(values.iter().map(|v| v.len() + 3).sum::<usize>() + 2);
    out.push('[');
    for (index, value) in values.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        push_json_str(&mut out, value);
    }
    out.push(']');
    out
}

/// Appends `value` as a JSON string. Values that need no escaping (the usual addresses,
/// hashes and symbols) are copied as they are.
pub(crate) fn push_json_str(out: &mut String, value: &str) {
    if value.bytes().all(|byte| byte >= 0x20 && byte != b'"' && byte != b'\\') {
        out.push('"');
        out.push_str(value);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(value).expect("a string serializes"));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_array_matches_serde_json() {
        let values =
            ["0xab", "", "say \"hi\"", "back\\slash", "tab\there", "ünï€ode", "\u{7f}\u{1}"];
        let expected = serde_json::to_string(&values).unwrap();
        assert_eq!(super::json_array(&values), expected);
        assert_eq!(super::json_array(&[]), "[]");
    }
}
