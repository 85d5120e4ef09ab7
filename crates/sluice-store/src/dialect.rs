//! What differs between the databases, as one trait ([`Dialect`]), and what the role code
//! needs of a backend, as one bound ([`StoreBackend`]).
//!
//! Every role module (`identity`, `pipelines`, `filter_values`, `deployments`, `metrics`,
//! `datasets`, `prices`, ...) writes its SQL once, for any `D: StoreBackend`, against
//! [`Store<D>`](crate::Store). A backend is a type implementing [`Dialect`] in its own module
//! (`sqlite.rs`, `postgres.rs`), plus the bulk statements of each feature that are only fast
//! written per database, beside that feature ([`FilterValueSql`] in `filter_values/`,
//! [`DatasetSql`] in `datasets/`, [`PriceSql`] in `prices/`); nothing else in the crate names
//! a database.
//!
//! sqlx is generic over the database, but it cannot promise that every database encodes an
//! `i64` or reads a `&str`, so the role code needs bounds such as
//! `for<'q> i64: Encode<'q, Db> + Decode<'q, Db> + Type<Db>`. Rust implies a trait's
//! supertraits wherever the trait is a bound, but not its other `where` clauses, and these
//! bounds are about `i64`, not about the dialect. [`StoreBackend`] carries each of them as a
//! supertrait anyway, through [`Names`]: `Names<'q, i64, Is = i64, Is: Value<'q, Db>>` is a
//! supertrait (so implied), and once `Is` is replaced by what it equals it says
//! `i64: Value<'q, Db>`. So each generic impl names one bound, `D: StoreBackend`, and a role that
//! binds or reads a new type adds it to [`StoreBackend`] once. Both backends satisfy it through
//! its blanket implementation; a new backend that does not is told so by the compiler at its
//! `Store<…>` type.

use std::future::Future;

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};

use crate::Result;
pub use crate::datasets::DatasetSql;
pub use crate::filter_values::FilterValueSql;
pub use crate::prices::PriceSql;

/// A row of dialect `D`'s database.
pub type Row<D> = <<D as Dialect>::Db as Database>::Row;

/// A connection of dialect `D`'s database (a transaction dereferences to one).
pub type Conn<D> = <<D as Dialect>::Db as Database>::Connection;

/// The arguments of a statement of dialect `D`'s database.
pub type Args<'q, D> = <<D as Dialect>::Db as Database>::Arguments<'q>;

/// A statement of dialect `D`'s database, with its arguments.
pub type Query<'q, D> = sqlx::query::Query<'q, <D as Dialect>::Db, Args<'q, D>>;

/// The pool of dialect `D`'s database.
pub type Pool<D> = sqlx::Pool<<D as Dialect>::Db>;

/// A transaction of dialect `D`'s database.
pub type Tx<D> = sqlx::Transaction<'static, <D as Dialect>::Db>;

/// What a backend supplies: its sqlx database, the SQL fragments that differ between the
/// databases, and the statements that differ in kind (locks, signals, transaction modes).
/// Everything else is written once, in the role modules; a feature's bulk statements that
/// are only fast written per database are its own trait, beside it (see [`StoreBackend`]).
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

    /// A statement that serialises price writers, run first in every price write
    /// transaction; `None` when [`Dialect::begin_write`] already does.
    const LOCK_PRICES: Option<&'static str>;

    /// A statement run first in every transaction that stores events, so events commit in
    /// the order of their ids on every node (a reader that saw id N never misses a smaller
    /// id committed later); `None` when [`Dialect::begin_write`] already serialises writers.
    const LOCK_EVENTS: Option<&'static str>;

    /// Most events stored by one `INSERT` (12 values each). SQLite looks each `$N` up by
    /// name in a list of every placeholder of the statement, so binding costs the square of
    /// the placeholders per statement: 400 rows spent two thirds of a release build's time
    /// binding and held the event writer under 10,000 events/s (BENCHMARKS.md, "Service
    /// events"). PostgreSQL binds by position, and fewer, larger statements save round trips.
    const EVENTS_PER_INSERT: usize;

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
}

/// What the role code needs of a backend, as one bound: its [`Dialect`], each feature's
/// per-database statements, and the sqlx capabilities the generic SQL uses (an executor,
/// arguments, and the column types it binds and reads). Implemented for every type that has
/// them all; each supertrait below of the form `Names<'q, T, Is = T, Is: Bound>` stands for
/// `T: Bound`, implied wherever `D: StoreBackend` is (see the module doc).
pub trait StoreBackend:
    Dialect
    + FilterValueSql
    + DatasetSql
    + PriceSql
    + for<'c> Names<
        'c,
        &'c mut Conn<Self>,
        Is = &'c mut Conn<Self>,
        Is: Executor<'c, Database = Self::Db>,
    > + for<'q> Names<'q, Args<'q, Self>, Is = Args<'q, Self>, Is: IntoArguments<'q, Self::Db>>
    + for<'q> Names<'q, i64, Is = i64, Is: Value<'q, Self::Db>>
    + for<'q> Names<'q, bool, Is = bool, Is: Value<'q, Self::Db>>
    + for<'q> Names<'q, f64, Is = f64, Is: Value<'q, Self::Db>>
    + for<'q> Names<'q, String, Is = String, Is: Value<'q, Self::Db>>
    + for<'q> Names<'q, &'q str, Is = &'q str, Is: Value<'q, Self::Db> + ColumnIndex<Row<Self>>>
    + for<'q> Names<'q, Vec<u8>, Is = Vec<u8>, Is: Value<'q, Self::Db>>
    + for<'q> Names<'q, &'q [u8], Is = &'q [u8], Is: Value<'q, Self::Db>>
    + for<'q> Names<'q, Option<i64>, Is = Option<i64>, Is: Value<'q, Self::Db>>
    + for<'q> Names<'q, Option<bool>, Is = Option<bool>, Is: Value<'q, Self::Db>>
    + for<'q> Names<'q, Option<String>, Is = Option<String>, Is: Value<'q, Self::Db>>
    + for<'q> Names<'q, Option<Vec<u8>>, Is = Option<Vec<u8>>, Is: Value<'q, Self::Db>>
    + for<'q> Names<'q, usize, Is = usize, Is: ColumnIndex<Row<Self>>>
{
}

impl<D> StoreBackend for D
where
    D: Dialect + FilterValueSql + DatasetSql + PriceSql,
    for<'c> &'c mut Conn<D>: Executor<'c, Database = D::Db>,
    for<'q> Args<'q, D>: IntoArguments<'q, D::Db>,
    for<'q> i64: Value<'q, D::Db>,
    for<'q> bool: Value<'q, D::Db>,
    for<'q> f64: Value<'q, D::Db>,
    for<'q> String: Value<'q, D::Db>,
    for<'q> &'q str: Value<'q, D::Db> + ColumnIndex<Row<D>>,
    for<'q> Vec<u8>: Value<'q, D::Db>,
    for<'q> &'q [u8]: Value<'q, D::Db>,
    for<'q> Option<i64>: Value<'q, D::Db>,
    for<'q> Option<bool>: Value<'q, D::Db>,
    for<'q> Option<String>: Value<'q, D::Db>,
    for<'q> Option<Vec<u8>>: Value<'q, D::Db>,
    usize: ColumnIndex<Row<D>>,
{
}

/// A type that `DB` binds as a statement argument and reads from a column (`'q`: how long a
/// bound argument or a read row is borrowed).
pub trait Value<'q, DB: Database>: Encode<'q, DB> + Decode<'q, DB> + Type<DB> {}

impl<'q, DB: Database, T> Value<'q, DB> for T where T: Encode<'q, DB> + Decode<'q, DB> + Type<DB> {}

/// Names a type: `<D as Names<'a, T>>::Is` is `T`, for every `D`. A bound on `Is` in a
/// supertrait of [`StoreBackend`] is a bound on `T` that Rust implies with `D: StoreBackend` (the
/// lifetime `'a` lets `T` borrow, as `&'a str` does, under a `for<'a>`).
pub trait Names<'a, T: ?Sized> {
    /// `T` itself.
    type Is: ?Sized;
}

impl<'a, D: ?Sized, T: ?Sized> Names<'a, T> for D {
    type Is = T;
}
