//! What differs between the databases, as one trait: [`Dialect`].
//!
//! Every role module (`identity`, `pipelines`, `filter_values`, `deployments`, `metrics`,
//! `datasets`, `prices`) writes its SQL once, for any `D: Dialect`, against
//! [`Store<D>`](crate::Store). A backend is a type implementing [`Dialect`] in its own module
//! (`sqlite.rs`, `postgres.rs`); nothing else in the crate names a database.
//!
//! sqlx is generic over the database, but it cannot promise that every database encodes an
//! `i64` or reads a `&str`, and Rust does not carry a trait's `where` clauses to the code
//! that uses it. So each generic impl block repeats one `where` clause naming the column
//! types the role code binds and reads (the same text everywhere: copy it from any role
//! module, and add a type to every copy when a role needs a new one). Both backends satisfy
//! it; a new backend that does not is told so by the compiler at its `Store<…>` type.

use std::future::Future;

use sluice_core::prices::{Candle, CandleKey, Trade};
use sqlx::Database;

use crate::Result;
use crate::prices::FilledPoint;

/// A row of dialect `D`'s database.
pub type Row<D> = <<D as Dialect>::Db as Database>::Row;

/// A connection of dialect `D`'s database (a transaction dereferences to one).
pub type Conn<D> = <<D as Dialect>::Db as Database>::Connection;

/// A statement of dialect `D`'s database, with its arguments.
pub type Query<'q, D> =
    sqlx::query::Query<'q, <D as Dialect>::Db, <<D as Dialect>::Db as Database>::Arguments<'q>>;

/// The pool of dialect `D`'s database.
pub type Pool<D> = sqlx::Pool<<D as Dialect>::Db>;

/// A transaction of dialect `D`'s database.
pub type Tx<D> = sqlx::Transaction<'static, <D as Dialect>::Db>;

/// What a backend supplies: its sqlx database, the SQL fragments that differ between the
/// databases, and the statements that are only fast written per database (bulk loads,
/// transaction modes). Everything else is written once, in the role modules.
///
/// Placeholders are `$N` on both databases (SQLite accepts them), upserts are
/// `INSERT … ON CONFLICT … DO UPDATE SET x = excluded.x`, and `RETURNING` works on both, so
/// none of those needs an item here.
pub trait Dialect: Send + Sync + Sized + 'static {
    /// The sqlx database.
    type Db: Database;

    /// Which script of a per-backend migration this database runs.
    const BACKEND: crate::migrations::Backend;

    /// The aggregate that gathers the text column `value` of a group into one JSON array,
    /// as text (`'[]'` for no rows).
    const JSON_AGG: &'static str;

    /// Statements that make the rest of a transaction read a filter-value set's rows along
    /// its `(set_id, seq)` key instead of sorting them.
    const INDEX_ORDER: &'static [&'static str];

    /// Selects `pipeline_config` of pipeline `$1` and holds off its other filter-value
    /// writers, its updates and its deletion until commit (run in a [`Dialect::begin_write`]
    /// transaction).
    const LOCK_PIPELINE: &'static str;

    /// Selects the `datasets` columns of dataset `$1` owned by `$2` and holds off its other
    /// writers and its deletion until commit.
    const LOCK_DATASET: &'static str;

    /// A statement that serialises price writers, run first in every price write
    /// transaction; `None` when [`Dialect::begin_write`] already does.
    const LOCK_PRICES: Option<&'static str>;

    /// A statement run first in every transaction that stores events, so events commit in
    /// the order of their ids on every node (a reader that saw id N never misses a smaller
    /// id committed later); `None` when [`Dialect::begin_write`] already serialises writers.
    const LOCK_EVENTS: Option<&'static str>;

    /// Selects whether the table named `$1` exists (a bool).
    const TABLE_EXISTS: &'static str;

    /// The join that makes a list of keys (`VALUES …`) drive index lookups into a table.
    const VALUES_JOIN: &'static str;

    /// The aggregate that concatenates packed price points (`point`) into one value.
    const CONCAT_POINTS: &'static str;

    /// `price_candles p`, read through its index of rows without a packed point.
    const WITHOUT_POINT: &'static str;

    /// The database's clock as milliseconds since the epoch (an `i64` expression).
    const NOW_MS: &'static str;

    /// Waits for and takes the cluster-wide lifecycle lock of pipeline `key`.
    fn cluster_lock(
        pool: &Pool<Self>,
        key: &str,
    ) -> impl Future<Output = Result<crate::nodes::ClusterLock>> + Send;

    /// Takes role `key` if no other process holds it.
    fn try_role(
        pool: &Pool<Self>,
        key: &str,
    ) -> impl Future<Output = Result<Option<crate::nodes::RoleLock>>> + Send;

    /// Signals the other processes listening on `channel`.
    fn signal(pool: &Pool<Self>, channel: &str) -> impl Future<Output = Result<()>> + Send;

    /// Hears signals on `channel` from now on; `None` where the database has none.
    fn listen(
        pool: &Pool<Self>,
        channel: &str,
    ) -> impl Future<Output = Result<Option<tokio::sync::mpsc::Receiver<()>>>> + Send;

    /// Rows a statement changed (sqlx has no trait for it).
    fn rows_affected(done: &<Self::Db as Database>::QueryResult) -> u64;

    /// A transaction that will write: it must not fail later because another connection
    /// wrote in between its reads and its writes.
    fn begin_write(pool: &Pool<Self>) -> impl Future<Output = Result<Tx<Self>>> + Send;

    /// A read-only transaction whose reads all see one committed state, without blocking
    /// writers.
    fn begin_snapshot(pool: &Pool<Self>) -> impl Future<Output = Result<Tx<Self>>> + Send;

    /// Appends `values` (known to be absent, each once) to filter-value set `set_id` in
    /// order, with the pipeline lock held; returns the rows added.
    fn insert_values(
        tx: &mut sqlx::Transaction<'_, Self::Db>,
        set_id: i64,
        values: &mut (dyn Iterator<Item = &str> + Send),
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Deletes the rows of set `set_id` whose value is in `list` (`listed`) or not in it, in
    /// one statement (the table has no index on values), with the pipeline lock held;
    /// returns the rows deleted.
    fn delete_values(
        tx: &mut sqlx::Transaction<'_, Self::Db>,
        set_id: i64,
        list: &[&str],
        listed: bool,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Adds sorted, unique `values` to dataset `seq` (holding `size` entries now), skipping
    /// those present, with the dataset lock held; returns the rows added.
    fn insert_entries(
        tx: &mut sqlx::Transaction<'_, Self::Db>,
        seq: i64,
        values: &[&str],
        size: u64,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Deletes sorted, unique `values` from dataset `seq`, with the dataset lock held;
    /// returns the rows deleted.
    fn delete_entries(
        tx: &mut sqlx::Transaction<'_, Self::Db>,
        seq: i64,
        values: &[&str],
    ) -> impl Future<Output = Result<u64>> + Send;

    /// The stored candle of each key, by position (`None`: not stored).
    fn stored_candles(
        conn: &mut <Self::Db as Database>::Connection,
        keys: &[(CandleKey, Candle)],
    ) -> impl Future<Output = Result<Vec<Option<Candle>>>> + Send;

    /// Writes `candles` (merged already), replacing the stored ones of the same keys.
    fn write_candles(
        conn: &mut <Self::Db as Database>::Connection,
        candles: &[(CandleKey, Candle)],
    ) -> impl Future<Output = Result<()>> + Send;

    /// Stores each of `points` in the candle row of its key.
    fn write_points(
        conn: &mut <Self::Db as Database>::Connection,
        points: &[FilledPoint],
    ) -> impl Future<Output = Result<()>> + Send;

    /// Sets each token's decimals and each pool's reserve from `tokens` and `pools` (the
    /// latest trade of each), where they are newer than the stored ones.
    fn write_tokens_and_pools(
        conn: &mut <Self::Db as Database>::Connection,
        tokens: &[&Trade],
        pools: &[&Trade],
    ) -> impl Future<Output = Result<()>> + Send;
}
