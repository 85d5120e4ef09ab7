//! Integration tests of `sluice-store`: one conformance suite run on SQLite and PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use sluice_store::{PgStore, SqliteStore};

/// A store plus whatever keeps it alive (the SQLite temp dir).
struct Fixture<S: ?Sized> {
    store: Arc<S>,
    /// A second store opened on the same database, as another server process would.
    other: Arc<S>,
    /// The Redis (with its key prefix) the stores keep set-filter values in, if any.
    redis_url: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

/// A fresh SQLite file, seen through `view` (the store role a suite tests).
async fn sqlite<S: ?Sized>(view: impl Fn(SqliteStore) -> Arc<S>) -> Fixture<S> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
    let store = SqliteStore::open(&url).await.unwrap();
    // Opening again re-runs migrations, which must be a no-op.
    let other = SqliteStore::open(&url).await.unwrap();
    Fixture { store: view(store), other: view(other), redis_url: None, _dir: Some(dir) }
}

/// A fresh schema of the PostgreSQL server `scripts/test` starts (`SLUICE_TEST_POSTGRES_URL`;
/// the tests fail without it), seen through `view`.
async fn postgres<S: ?Sized>(view: impl Fn(PgStore) -> Arc<S>) -> Fixture<S> {
    let options = sluice_store::testing::fresh_postgres_schema().await;
    let store = PgStore::open_with(options.clone()).await.unwrap();
    let other = PgStore::open_with(options).await.unwrap();
    Fixture { store: view(store), other: view(other), redis_url: None, _dir: None }
}

/// A fresh PostgreSQL schema as [`postgres`] gives, with set-filter values in the Redis
/// server `scripts/test` starts (`SLUICE_TEST_REDIS_URL`; the tests fail without it), under
/// a key prefix of its own. Both stores share the prefix, as two nodes would.
async fn postgres_with_redis<S: ?Sized>(view: impl Fn(PgStore) -> Arc<S>) -> Fixture<S> {
    let url = std::env::var("SLUICE_TEST_REDIS_URL")
        .expect("SLUICE_TEST_REDIS_URL must name a Redis server; run scripts/test");
    let url = format!("{url}?prefix=t{}", uuid::Uuid::new_v4().simple());
    let options = sluice_store::testing::fresh_postgres_schema().await;
    let redis = || async { Arc::new(sluice_store::RedisSets::connect(&url).await.unwrap()) };
    let store = PgStore::open_with(options.clone()).await.unwrap().with_redis_sets(redis().await);
    let other = PgStore::open_with(options).await.unwrap().with_redis_sets(redis().await);
    Fixture { store: view(store), other: view(other), redis_url: Some(url), _dir: None }
}

/// Runs each named `async fn(Arc<S>)` of the calling module on PostgreSQL with the values
/// of set filters in Redis.
macro_rules! on_redis_sets {
    ($view:expr; $($name:ident),* $(,)?) => {
        mod on_redis_sets {
            use super::*;

            $(#[tokio::test]
            async fn $name() {
                let fixture = crate::postgres_with_redis($view).await;
                super::$name(fixture.store.clone()).await;
            })*
        }
    };
}

/// Runs each named `async fn(Arc<S>)` of the calling module once on SQLite and once on
/// PostgreSQL, the store seen through `$view` (e.g. `|s| Arc::new(s) as Arc<dyn MetadataStore>`).
macro_rules! on_both_backends {
    ($view:expr; $($name:ident),* $(,)?) => {
        mod on_sqlite {
            use super::*;

            $(#[tokio::test]
            async fn $name() {
                let fixture = crate::sqlite($view).await;
                super::$name(fixture.store.clone()).await;
            })*
        }
        mod on_postgres {
            use super::*;

            $(#[tokio::test]
            async fn $name() {
                let fixture = crate::postgres($view).await;
                super::$name(fixture.store.clone()).await;
            })*
        }
    };
}

mod conformance;
mod datasets;
mod events;
mod metrics;
mod nodes;
mod prices;
mod redis_log;
mod set_feed;
mod set_history;
