//! `sluice-store` owns Sluice's durable metadata: identities and API keys, pipeline records,
//! sharing, set-filter values, deployments, datasets, deployment metrics and token price
//! candles, on SQLite (the embedded default, WAL) or PostgreSQL.
//!
//! Where to start reading:
//! - [`open`] picks the backend from a URL and gives one [`MetadataStore`]: every role, on
//!   one pool. A process opens it once (the price service takes
//!   [`MetadataStore::into_prices`] of the same store).
//! - Each role is a trait in its own module, with its SQL written once for any backend:
//!   [`IdentityStore`] (`identity.rs`), [`PipelineStore`] (`pipelines.rs`),
//!   [`FilterValueStore`] (`filter_values.rs`, its stored sets in `filter_values/sets.rs`,
//!   its in-memory sets in `filter_sets.rs`),
//!   [`DeploymentStore`] (`deployments.rs`), [`DatasetStore`] (`datasets.rs`),
//!   [`MetricsStore`] (`metrics.rs`), [`EventStore`] (`events.rs`, service events and
//!   notification destinations), [`NodeStore`] (`nodes.rs`, the cluster's nodes and
//!   locks) and [`PriceStore`] (`prices.rs`, `prices/role.rs`,
//!   `prices/ingest.rs`). All are implemented for [`Store<D>`](Store) (`store.rs`).
//! - What differs between the databases is the [`Dialect`] trait (`dialect.rs`); the two
//!   backends implement it in `sqlite.rs` and `postgres.rs`. A feature's bulk statements
//!   that are only fast written per database are a trait of that feature, implemented
//!   beside it (`filter_values/`, `datasets/`, `prices/`). The role code names one bound,
//!   [`StoreBackend`], which gathers all of that and the sqlx capabilities it uses.
//! - `migrations.rs` lists every schema change (SQL scripts, and data steps written in Rust).
//! - `redis_sets.rs`: set-filter values in Redis ([`RedisSets`], `--sets redis://…`), with
//!   the change feed ([`SetFeed`]) every node's indexes follow in `redis_sets/feed.rs`, log
//!   rewrites in `rewrite.rs` and the one-off upgrade from sorted sets in `upgrade.rs`; a
//!   [`Store`] uses it when opened with [`open_with_sets`] (or [`Store::with_redis_sets`]).
//!
//! `tests/it/conformance.rs` runs one suite against each backend. This crate must not depend
//! on the runtime or the API.

mod backfills;
mod datasets;
mod deployments;
pub mod dialect;
mod events;
mod filter_sets;
mod filter_values;
mod identity;
pub mod metrics;
mod migrations;
mod nodes;
mod pipelines;
mod postgres;
pub mod prices;
mod redis_sets;
pub mod secrets;
pub mod set_history;
mod set_snapshots;
mod sqlite;
mod store;
pub mod testing;

use std::sync::Arc;
use std::time::Duration;

use sluice_core::redaction::redact_password;

pub use backfills::BackfillStore;
pub use datasets::{DatasetStore, EntriesChange, EntryPage};
pub use deployments::DeploymentStore;
pub use dialect::{Dialect, StoreBackend};
pub use events::{EventQuery, EventStore, NotificationProgress};
pub use filter_values::{FilterValuePage, FilterValueStore};
pub use identity::{Identity, IdentityStore, KeyCandidate, NewApiKey, UnknownMembers};
pub use metrics::{MetricSample, MetricsStore};
pub use nodes::{CLUSTER_CHANNEL, ClusterLock, NodeBeat, NodeRow, NodeStore, RoleLock};
pub use pipelines::PipelineStore;
pub use postgres::{PgDialect, PgStore};
pub use prices::{PriceStore, open_prices};
pub use redis_sets::{
    DatasetFeedChange, DatasetFeedEntry, FeedEntry, RedisSets, SetFeed, SetFeedChange, SetFeedEntry,
};
pub use secrets::{SecretStore, Secrets, SecretsError};
pub use set_history::{
    ChangeStamp, ChangedValues, HistoryPoint, PastMembership, Reach, SetChange, SetChangeKind,
    SetChangePage, SetHistoryStore,
};
pub use sqlite::{SqliteDialect, SqliteStore};
pub use store::Store;

/// Errors of the metadata store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration {version} ({name}) failed: {source}")]
    Migration { version: i64, name: &'static str, source: sqlx::Error },
    #[error("stored {what} could not be read: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error(
        "unsupported URL '{0}': use sqlite://<path> or postgres://… for the store, redis://… for sets"
    )]
    UnsupportedUrl(String),
    /// A URL of a supported kind that does not parse (the URL shown without its password).
    #[error("invalid URL '{url}': {reason}")]
    InvalidUrl { url: String, reason: String },
    /// A database or Redis that did not accept a connection (the URL shown without its
    /// password): an external fault; trying again once it is up helps.
    #[error("cannot connect to {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The set store (Redis) lost the values of a set the database says holds values, and
    /// the set history cannot rebuild them (docs/set-filter.md, "When Redis loses the
    /// values"): the set is unavailable until its values are replaced.
    #[error(
        "the set store lost the values of set filter {transform_uid} of pipeline \
         {pipeline_id}, and its history cannot rebuild them ({reason}); replace them with \
         PUT /api/v1/beam/{pipeline_id}/transforms/{transform_uid}/filter-values"
    )]
    SetLost { pipeline_id: String, transform_uid: String, reason: String },
}

impl StoreError {
    /// Whether the database or Redis could not be reached or is going away (a connection
    /// refused, cut or timed out; a server shutting down or starting up): a fault of the
    /// moment, which an API call answers with 503 rather than 500.
    pub fn is_unavailable(&self) -> bool {
        match self {
            // A lost set is a 503 too: its values come back with a replace.
            Self::Redis(_) | Self::Unreachable { .. } | Self::SetLost { .. } => true,
            Self::Database(error) => match error {
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed => true,
                // SQLSTATE 08 (connection exception) and 57P (operator intervention:
                // shutdown, crash shutdown, cannot connect now).
                sqlx::Error::Database(db) => {
                    db.code().is_some_and(|code| code.starts_with("08") || code.starts_with("57P"))
                }
                _ => false,
            },
            _ => false,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Every role of the metadata store, as one handle: what the API and the runtime hold
/// ([`open`] gives one). Each role is a trait of its own module; a [`Store`] of either
/// backend plays them all.
pub trait MetadataStore:
    IdentityStore
    + PipelineStore
    + FilterValueStore
    + SetHistoryStore
    + DeploymentStore
    + DatasetStore
    + MetricsStore
    + PriceStore
    + SecretStore
    + BackfillStore
    + NodeStore
    + EventStore
    + Send
    + Sync
    + 'static
{
    /// The same store as a price-role handle (what the price service takes), sharing this
    /// store's pool and memory.
    fn into_prices(self: Arc<Self>) -> Arc<dyn PriceStore>;
}

impl<T> MetadataStore for T
where
    T: IdentityStore
        + PipelineStore
        + FilterValueStore
        + SetHistoryStore
        + DeploymentStore
        + DatasetStore
        + MetricsStore
        + PriceStore
        + SecretStore
        + BackfillStore
        + NodeStore
        + EventStore,
{
    fn into_prices(self: Arc<Self>) -> Arc<dyn PriceStore> {
        self
    }
}

/// Opens the store a URL names, creating and migrating the database as needed:
/// `sqlite://<path>` (file created when missing) or `postgres://…`.
///
/// # Errors
/// An unsupported URL, a connection failure or a failed migration.
pub async fn open(url: &str) -> Result<Arc<dyn MetadataStore>> {
    open_with_sets(url, None).await
}

/// Opens the store as [`open`] does, with set-filter values in the Redis `sets` names
/// (`redis://…`, see [`RedisSets::connect`]) when given. Sets that hold values in the
/// store's own tables and are not in Redis yet are copied there first, in cursor order.
///
/// # Errors
/// As [`open`]; an unsupported set-store URL, a Redis that does not answer, or a failed
/// copy.
pub async fn open_with_sets(url: &str, sets: Option<&str>) -> Result<Arc<dyn MetadataStore>> {
    let redis = match sets {
        None => None,
        Some(sets) if sets.starts_with("redis://") => {
            Some(Arc::new(RedisSets::connect(sets).await?))
        }
        Some(sets) => return Err(StoreError::UnsupportedUrl(redact_password(sets))),
    };
    if url.starts_with("sqlite:") {
        with_sets(SqliteStore::open(url).await?, redis).await
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        with_sets(PgStore::open(url).await?, redis).await
    } else {
        Err(StoreError::UnsupportedUrl(redact_password(url)))
    }
}

/// `store`, with its set-filter values in `redis` when given: the sets the store's tables
/// still hold are moved there first (the same steps for either backend).
async fn with_sets<D: dialect::StoreBackend>(
    store: Store<D>,
    redis: Option<Arc<RedisSets>>,
) -> Result<Arc<dyn MetadataStore>>
where
    Store<D>: MetadataStore,
{
    let Some(redis) = redis else {
        return Ok(Arc::new(store));
    };
    let upgraded = redis.upgrade_sorted_sets().await?;
    if upgraded > 0 {
        tracing::info!(sets = upgraded, "filter-value sets moved to Redis logs");
    }
    let copied = store.copy_sets_to(&redis).await?;
    if copied > 0 {
        tracing::info!(sets = copied, "filter-value sets copied from the store's tables to Redis");
    }
    Ok(Arc::new(store.with_redis_sets(redis)))
}

/// Checks, creating and changing nothing, that the database `url` names and the set store
/// `sets` names accept a connection within `within` each: PostgreSQL and Redis get one
/// connection, closed again; a SQLite file has nothing to reach. `serve` runs this before
/// it creates anything, so a server that is down is one line at once rather than a pool
/// that retries for half a minute.
///
/// # Errors
/// [`StoreError::Unreachable`] or [`StoreError::InvalidUrl`] naming the URL (without its
/// password) and why; [`StoreError::UnsupportedUrl`] for another kind of URL.
pub async fn check_reachable(url: &str, sets: Option<&str>, within: Duration) -> Result<()> {
    let database = async {
        if url.starts_with("sqlite:") {
            Ok(())
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            within_time(url, within, PgStore::check_reachable(url)).await
        } else {
            Err(StoreError::UnsupportedUrl(redact_password(url)))
        }
    };
    let sets = async {
        match sets {
            None => Ok(()),
            Some(sets) if sets.starts_with("redis://") => {
                within_time(sets, within, RedisSets::check_reachable(sets)).await
            }
            Some(sets) => Err(StoreError::UnsupportedUrl(redact_password(sets))),
        }
    };
    tokio::try_join!(database, sets).map(drop)
}

async fn within_time(
    url: &str,
    within: Duration,
    check: impl std::future::Future<Output = Result<()>>,
) -> Result<()> {
    tokio::time::timeout(within, check).await.unwrap_or_else(|_| {
        Err(StoreError::Unreachable {
            url: redact_password(url),
            reason: format!("no answer within {} s", within.as_secs()),
        })
    })
}

/// Why a connection failed, in a few words ("connection refused"), or the error's own text
/// when it is not one of the usual network failures (a name that does not resolve).
pub(crate) fn io_reason(error: &std::io::Error) -> String {
    use std::io::ErrorKind::{
        ConnectionRefused, ConnectionReset, HostUnreachable, NetworkUnreachable, TimedOut,
    };
    match error.kind() {
        kind @ (ConnectionRefused | ConnectionReset | HostUnreachable | NetworkUnreachable
        | TimedOut) => kind.to_string(),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::StoreError;

    #[test]
    fn a_database_that_cannot_be_reached_is_unavailable_and_other_errors_are_not() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        for unavailable in [
            StoreError::Database(sqlx::Error::Io(io)),
            StoreError::Database(sqlx::Error::PoolTimedOut),
            StoreError::Database(sqlx::Error::PoolClosed),
            StoreError::Unreachable { url: "postgres://db".into(), reason: "refused".into() },
        ] {
            assert!(unavailable.is_unavailable(), "{unavailable}");
        }
        for other in [
            StoreError::Database(sqlx::Error::RowNotFound),
            StoreError::Corrupt { what: "a pipeline", detail: "bad json".into() },
            StoreError::UnsupportedUrl("ftp://x".into()),
        ] {
            assert!(!other.is_unavailable(), "{other}");
        }
    }
}
