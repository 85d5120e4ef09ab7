//! What differs between the databases, as one trait: [`Dialect`].
//!
//! Every role module ([`crate::identity`], [`crate::pipelines`], [`crate::filter_values`],
//! [`crate::deployments`], [`crate::metrics`], [`crate::datasets`], [`crate::prices`]) writes
//! its SQL once, for any `D: Dialect`, against [`Store<D>`](crate::Store). A backend is a type
//! implementing [`Dialect`] in its own module ([`crate::sqlite`], [`crate::postgres`]).

use sqlx::Database;

/// A transaction of dialect `D`'s database.
pub type Tx<D> = sqlx::Transaction<'static, <D as Dialect>::Db>;

/// A row of dialect `D`'s database.
pub type Row<D> = <<D as Dialect>::Db as Database>::Row;

/// The pool of dialect `D`'s database.
pub type Pool<D> = sqlx::Pool<<D as Dialect>::Db>;

/// What a backend supplies: its sqlx database, the SQL fragments that differ between
/// databases, and the statements that only make sense written per database (bulk loads,
/// transaction modes). Everything else is written once, in the role modules.
///
/// Placeholders are `$N` on both databases (SQLite accepts them), upserts are
/// `INSERT … ON CONFLICT … DO UPDATE SET x = excluded.x` and `RETURNING` works on both, so
/// none of those needs an item here.
pub trait Dialect: Send + Sync + Sized + 'static {
    /// The sqlx database.
    type Db: Database;

    /// Which script of a per-backend migration this database runs.
    const BACKEND: crate::migrations::Backend;

    /// Rows a statement changed (sqlx has no trait for it).
    fn rows_affected(done: &<Self::Db as Database>::QueryResult) -> u64;
}
