//! `sluice-bus` owns Sluice's stream log: topics split into partitions, appends, reads from
//! an offset, consumer groups with committed offsets, seek by timestamp and retention by age
//! and size — the shape of Kafka, so that a Kafka implementation can take the same place.
//!
//! Start at [`StreamLog`], the role; [`EmbeddedLog`] is the embedded implementation, durable
//! in the data directory on `redb` (one database file, appends acknowledged only after a
//! durable commit, many concurrent appends grouped into one commit). Topic names for chain
//! streams and sinks are built in [`topics`]. This crate must not depend on the store, the
//! runtime or the API.

mod batch;
mod embedded;
pub mod forwarding;
mod kafka;
mod record;
pub mod topics;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

pub use embedded::EmbeddedLog;
pub use kafka::{KafkaLog, KafkaSettings};
pub use record::{NewRecord, Record, partition_for_key};

/// The appends of [`StreamLog::append_and_commit`] that carry records: a topic with none is
/// neither checked nor written.
pub(crate) fn non_empty<'a>(
    appends: &'a [(&'a str, &'a [NewRecord])],
) -> impl Iterator<Item = (&'a str, &'a [NewRecord])> {
    appends.iter().copied().filter(|(_, records)| !records.is_empty())
}

/// Errors of a stream log.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("topic {0} does not exist")]
    UnknownTopic(String),
    #[error("topic {topic} has no partition {partition}")]
    UnknownPartition { topic: String, partition: u32 },
    #[error("invalid topic name {name:?}: {reason}")]
    InvalidTopicName { name: String, reason: &'static str },
    #[error("invalid topic configuration: {0}")]
    InvalidConfig(&'static str),
    /// The backend (the embedded database, a broker client) failed; its own error is the
    /// source, and whether a retry can help is decided where that error is understood.
    #[error("stream log storage failed: {source}")]
    Backend {
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        transient: bool,
    },
    #[error("stored log data is corrupt: {0}")]
    Corrupt(String),
    #[error("stream log write not committed: {0}")]
    CommitFailed(String),
    #[error("the stream log could not apply the write (see the server log)")]
    WriteNotApplied,
    #[error("the stream log has shut down")]
    Closed,
    #[error("invalid stream log URL {url}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("cannot reach the stream log at {url}: {reason}")]
    Unreachable { url: String, reason: String },
}

impl BusError {
    /// Whether trying again later can succeed (storage hiccups, shutdown in progress), as
    /// opposed to a caller mistake.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Backend { transient, .. } => *transient,
            Self::CommitFailed(_)
            | Self::WriteNotApplied
            | Self::Closed
            | Self::Unreachable { .. } => true,
            Self::UnknownTopic(_)
            | Self::UnknownPartition { .. }
            | Self::InvalidTopicName { .. }
            | Self::InvalidConfig(_)
            | Self::InvalidUrl { .. }
            | Self::Corrupt(_) => false,
        }
    }
}

pub type Result<T, E = BusError> = std::result::Result<T, E>;

/// How long and how much a topic keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Records older than this (by append time) are removed.
    pub max_age: Duration,
    /// Per partition: the oldest records are removed while the partition holds more bytes.
    pub max_bytes: Option<u64>,
}

impl Retention {
    /// Two days: how long a paused pipeline's data waits (docs/contract.md §Limits).
    pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(2 * 24 * 3600);
}

impl Default for Retention {
    fn default() -> Self {
        Self { max_age: Self::DEFAULT_MAX_AGE, max_bytes: None }
    }
}

/// A topic's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicConfig {
    pub partitions: u32,
    pub retention: Retention,
}

/// Where one appended record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub partition: u32,
    pub offset: u64,
}

/// The offsets a partition holds: `start` is the first retained, `end` the next to be
/// written (`start == end` when it is empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OffsetRange {
    pub start: u64,
    pub end: u64,
}

/// A durable, partitioned, append-only log of keyed records.
///
/// Records with the same key always go to the same partition
/// ([`partition_for_key`]), so they keep their order. Offsets are per partition, dense,
/// and never reused, even after retention removed the records that had them.
#[async_trait]
pub trait StreamLog: Send + Sync + 'static {
    /// Creates the topic, or returns the existing one's configuration unchanged.
    ///
    /// # Errors
    /// A bad name or configuration, or a storage failure.
    async fn create_topic(&self, topic: &str, config: TopicConfig) -> Result<TopicConfig>;

    /// Deletes the topic, its records and every group offset on it. False when it did not
    /// exist.
    async fn delete_topic(&self, topic: &str) -> Result<bool>;

    /// The topic's configuration, when it exists.
    async fn topic(&self, topic: &str) -> Result<Option<TopicConfig>>;

    /// Appends records, each to the partition of its key, stamped with the log's clock.
    /// When this returns, the records are durable.
    async fn append(&self, topic: &str, records: Vec<NewRecord>) -> Result<Vec<Position>>;

    /// Appends records to one or more topics (each as [`StreamLog::append`]: `appends` is
    /// `(topic, records)`) and stores `group`'s next offsets on `source` (as
    /// [`StreamLog::commit`]) as one step: after a crash either all of it happened or none,
    /// so a consumer that delivers through this never delivers a batch twice nor commits one
    /// it did not deliver (Kafka: a transactional producer sending the consumer's offsets to
    /// its transaction). With no records it only commits.
    ///
    /// This default appends, then commits (a crash in between delivers the batch again,
    /// which at-least-once allows); logs that can do it atomically override it.
    ///
    /// # Errors
    /// As `append` and `commit`; when it fails, the offsets were not committed.
    async fn append_and_commit(
        &self,
        appends: &[(&str, &[NewRecord])],
        group: &str,
        source: &str,
        offsets: &[(u32, u64)],
    ) -> Result<()> {
        for (topic, records) in non_empty(appends) {
            self.append(topic, records.to_vec()).await?;
        }
        self.commit(group, source, offsets).await
    }

    /// Up to `max` records of one partition from offset `from` on (records before the
    /// retained start are gone; reading from there starts at the first retained one).
    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize)
    -> Result<Vec<Record>>;

    /// The retained offsets of every partition, by partition.
    async fn offsets(&self, topic: &str) -> Result<Vec<OffsetRange>>;

    /// The first offset of `partition` whose append time is at or after `timestamp_ms`
    /// (the end offset when there is none).
    async fn offset_for_time(&self, topic: &str, partition: u32, timestamp_ms: i64) -> Result<u64>;

    /// Stores the next offset `group` will read, per partition of `topic`.
    async fn commit(&self, group: &str, topic: &str, offsets: &[(u32, u64)]) -> Result<()>;

    /// The offsets `group` committed on `topic`, by partition (missing: never committed).
    async fn committed(&self, group: &str, topic: &str) -> Result<BTreeMap<u32, u64>>;

    /// Forgets every offset `group` committed.
    async fn delete_group(&self, group: &str) -> Result<()>;

    /// Removes records past their topic's retention; returns how many were removed.
    async fn enforce_retention(&self) -> Result<u64>;

    /// Resolves when `topic` may have new records since the last call on this watch.
    fn watch(&self, topic: &str) -> AppendWatch;

    /// Whether the log can serve requests now (a cluster log: a broker answers).
    ///
    /// # Errors
    /// [`BusError::Unreachable`] saying why not.
    async fn ready(&self) -> Result<()> {
        Ok(())
    }

    /// Closes what this process holds open on `topic` (readers fetching ahead, a tail
    /// following appends) because another process is about to delete it; reading or
    /// watching it again opens them again. No effect on the embedded log.
    async fn release_topic(&self, topic: &str) {
        let _ = topic;
    }

    /// The topics this process holds readers or a tail open on (what another process must
    /// wait for before deleting one).
    fn open_topics(&self) -> Vec<String> {
        Vec::new()
    }

    /// How a Kafka client reaches `topic` of this log, when one can (a Kafka cluster); `None`
    /// for the embedded log, whose topics are read over Sluice's HTTP API.
    fn client_access(&self, topic: &str) -> Option<ClientAccess> {
        let _ = topic;
        None
    }
}

/// What a Kafka client needs to read a topic of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAccess {
    pub bootstrap_servers: String,
    /// The topic's name on the cluster.
    pub topic: String,
    /// A consumer-group id (or prefix) for the reader's own consumers.
    pub group_id: String,
    pub security_protocol: String,
    pub sasl_mechanism: Option<String>,
    /// The consumer credentials the operator configured for readers, if any.
    pub username: Option<String>,
    pub password: Option<String>,
}

/// Wakes a reader when a topic receives records.
#[derive(Debug)]
pub struct AppendWatch(tokio::sync::watch::Receiver<u64>);

impl AppendWatch {
    pub(crate) fn new(receiver: tokio::sync::watch::Receiver<u64>) -> Self {
        Self(receiver)
    }

    /// Waits until something was appended since this watch last woke (or was made), or
    /// until `timeout`; true when woken by an append (or by the log shutting down).
    pub async fn wait(&mut self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.0.changed()).await.is_ok()
    }
}
