//! The [`Sink`] role: where a deployment's records go, and how a consumer reaches them.
//!
//! A sink is built from its [`SinkConfig`] when a pipeline is compiled ([`build`]); the
//! worker hands it each processed batch ([`Sink::deliver`]) and settles the batch's source
//! offsets, dead letters and script logs only once the sink has the records, so
//! `at_least_once` holds whatever the sink. A failure says whether a retry can help
//! ([`SinkError::is_retryable`]). Each sink type is a module beside this one, with its
//! typed config in `sluice-core`: [`managed`] is the first.

pub mod external;
pub mod managed;

use std::sync::Arc;

use serde_json::Value;
use sluice_bus::StreamLog;
use sluice_core::pipeline::SinkConfig;

use crate::delivery::{Delivery, SideTopics};
pub use managed::ManagedSink;

/// A failed delivery, classified for the worker: retryable failures hold the source and are
/// tried again (`at_least_once`); the others cannot succeed by waiting.
#[derive(Debug, thiserror::Error)]
#[error("sink {uid} failed: {source}")]
pub struct SinkError {
    pub uid: String,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
    pub retryable: bool,
    /// How long the receiver asked to wait before the next try (`Retry-After`).
    pub retry_after: Option<std::time::Duration>,
}

impl SinkError {
    /// Whether trying the same batch again later can succeed.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }
}

/// Where the batch's records came from: the consumer offsets it settles.
#[derive(Debug, Clone, Copy)]
pub struct Settle<'a> {
    /// The consumer group (a deployment's, or a replay's).
    pub group: &'a str,
    /// The topic the group read.
    pub source: &'a str,
    /// `(partition, next offset)` to commit.
    pub offsets: &'a [(u32, u64)],
}

/// How a consumer reaches a deployed sink: the deploy response's entry for it.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkConnection {
    pub uid: String,
    pub name: String,
    /// The sink's `type`.
    pub sink_type: &'static str,
    /// The managed topic, for sinks Sluice keeps.
    pub topic: String,
    /// Where its records are read over HTTP (API path, same key, read permission).
    pub records_url: String,
    /// Connection settings, by name.
    pub connection: Value,
    /// Ready-to-run consumers, by language.
    pub consumer_snippets: Value,
}

/// A running sink of one deployment.
#[async_trait::async_trait]
pub trait Sink: Send + Sync + std::fmt::Debug {
    /// The configuration the sink was built from.
    fn config(&self) -> &SinkConfig;

    /// The managed topic the sink writes, when Sluice keeps its records (created at deploy,
    /// read over HTTP, deleted at teardown).
    fn managed_topic(&self) -> Option<&str>;

    /// Delivers `delivery.out` and, once the sink has them, writes the batch's dead letters
    /// and script logs to `side` and commits `settle`'s offsets.
    ///
    /// # Errors
    /// [`SinkError`]; then the offsets did not move.
    async fn deliver(
        &self,
        log: &Arc<dyn StreamLog>,
        delivery: &Delivery,
        side: &SideTopics,
        settle: Settle<'_>,
    ) -> Result<(), SinkError>;

    /// How a consumer reaches this sink of pipeline `pipeline_id`.
    fn connection(&self, pipeline_id: &str) -> SinkConnection;

    /// Releases the sink's connections and clients: its deployment stopped running it.
    async fn close(&self) {}
}

/// The running sink of `config`, for pipeline `pipeline_id`. Pure: connecting happens at
/// the first delivery.
pub fn build(pipeline_id: &str, config: &SinkConfig) -> Arc<dyn Sink> {
    match config {
        SinkConfig::Kafka(_) => Arc::new(ManagedSink::new(pipeline_id, config.clone())),
    }
}
