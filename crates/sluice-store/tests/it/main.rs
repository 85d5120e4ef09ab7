//! Integration tests of `sluice-store`: one conformance suite run on SQLite and PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::str::FromStr;
use std::sync::Arc;

use sluice_store::{PgStore, SqliteStore};
use sqlx::postgres::PgConnectOptions;

/// A store plus whatever keeps it alive (the SQLite temp dir).
struct Fixture<S: ?Sized> {
    store: Arc<S>,
    /// A second store opened on the same database, as another server process would.
    other: Arc<S>,
    _dir: Option<tempfile::TempDir>,
}

/// A fresh SQLite file, seen through `view` (the store role a suite tests).
async fn sqlite<S: ?Sized>(view: impl Fn(SqliteStore) -> Arc<S>) -> Fixture<S> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
    let store = SqliteStore::open(&url).await.unwrap();
    // Opening again re-runs migrations, which must be a no-op.
    let other = SqliteStore::open(&url).await.unwrap();
    Fixture { store: view(store), other: view(other), _dir: Some(dir) }
}

/// A fresh schema of the PostgreSQL server `scripts/test` starts (`SLUICE_TEST_POSTGRES_URL`;
/// the tests fail without it), seen through `view`.
async fn postgres<S: ?Sized>(view: impl Fn(PgStore) -> Arc<S>) -> Fixture<S> {
    let url = std::env::var("SLUICE_TEST_POSTGRES_URL")
        .expect("SLUICE_TEST_POSTGRES_URL must name a PostgreSQL database; run scripts/test");
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await.unwrap();
    admin.close().await;
    let options = PgConnectOptions::from_str(&url).unwrap().options([("search_path", &schema)]);
    let store = PgStore::open_with(options.clone()).await.unwrap();
    let other = PgStore::open_with(options).await.unwrap();
    Fixture { store: view(store), other: view(other), _dir: None }
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
mod metrics;
mod prices;
