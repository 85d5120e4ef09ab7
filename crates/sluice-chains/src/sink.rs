//! Where an ingester's records and position go.
//!
//! Exact resume without atomic appends across topics: the log may append to one topic and
//! crash before the next (Kafka's `append_and_commit` is append-then-commit), so the
//! position is not trusted alone. Each block's records go to a stream in **one append**,
//! blocks in increasing order, and every record carries `block_number`; at start the
//! ingester reads the highest `block_number` each finalized stream holds
//! ([`ChainSink::last_block`]) and skips, per stream, the blocks it already has. The
//! checkpoint (written after the streams) only says where to start reading the chain and
//! which unfinalized blocks the zerolag streams were given; it may lag the streams, never
//! lead them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_bus::{BusError, NewRecord, Retention, StreamLog, TopicConfig};
use sluice_core::streams::StreamRecord;

use crate::fetch::Header;

/// Errors of a sink. Whether retrying can help: [`SinkError::is_transient`].
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("stream log: {0}")]
    Log(#[from] BusError),
    #[error("appending to {stream} failed: {reason}")]
    Append { stream: String, reason: String, transient: bool },
    #[error("the stored position of chain {chain} is unreadable: {reason}")]
    Checkpoint { chain: String, reason: String },
}

impl SinkError {
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Log(error) => error.is_transient(),
            Self::Append { transient, .. } => *transient,
            Self::Checkpoint { .. } => false,
        }
    }
}

/// Where the ingester stands: the last block in the finalized streams, and the blocks past
/// it the zerolag streams were given (oldest first), so a restart can tell whether they were
/// reorged away while it was down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub finalized: Header,
    pub unfinalized: Vec<Header>,
}

/// The ingester's way out: the binary implements it over the runtime's ingest path.
#[async_trait]
pub trait ChainSink: Send + Sync + 'static {
    /// Appends `records` (all of one entity) to `chain.entity` (`.zerolag` when `zerolag`)
    /// in one step: durable, all or none, when this returns.
    async fn append(
        &self,
        chain: &str,
        entity: &str,
        zerolag: bool,
        records: Vec<StreamRecord>,
    ) -> Result<(), SinkError>;

    /// The highest `block_number` (`block_slot` on Solana) the finalized stream
    /// `chain.entity` holds.
    async fn last_block(&self, chain: &str, entity: &str) -> Result<Option<u64>, SinkError>;

    async fn load_checkpoint(&self, chain: &str) -> Result<Option<Checkpoint>, SinkError>;

    async fn save_checkpoint(&self, chain: &str, checkpoint: &Checkpoint) -> Result<(), SinkError>;

    /// The latest record (JSON text) of each partition of the finalized stream
    /// `chain.entity`, for ingesters whose records carry their own position (Hyperliquid).
    async fn tails(&self, chain: &str, entity: &str) -> Result<Vec<Vec<u8>>, SinkError>;

    /// A position of another shape than [`Checkpoint`] (the Hyperliquid ingester's files).
    async fn load_position(&self, chain: &str) -> Result<Option<serde_json::Value>, SinkError>;

    async fn save_position(
        &self,
        chain: &str,
        position: &serde_json::Value,
    ) -> Result<(), SinkError>;
}

/// Positions (and, for tests and tools, appends) kept in a [`StreamLog`]: the checkpoint
/// is the latest record of the one-partition topic `_sluice.chains.<chain>`.
#[derive(Clone)]
pub struct LogPositions {
    log: Arc<dyn StreamLog>,
}

impl std::fmt::Debug for LogPositions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogPositions").finish_non_exhaustive()
    }
}

/// The checkpoint topic keeps its records ten years (a stalled chain must not lose its
/// position) but at most 16 MiB (a checkpoint is a few KiB; the latest is all that counts).
const CHECKPOINT_TOPIC: TopicConfig = TopicConfig {
    partitions: 1,
    retention: Retention {
        max_age: Duration::from_secs(10 * 365 * 24 * 3600),
        max_bytes: Some(16 << 20),
    },
};

pub fn checkpoint_topic(chain: &str) -> String {
    format!("_sluice.chains.{chain}")
}

impl LogPositions {
    /// The last record of chain `chain`'s checkpoint topic as a `T` (`None`: nothing saved
    /// yet); the topic is made when missing.
    async fn load_last<T: serde::de::DeserializeOwned>(
        &self,
        chain: &str,
    ) -> Result<Option<T>, SinkError> {
        let topic = checkpoint_topic(chain);
        self.log.create_topic(&topic, CHECKPOINT_TOPIC).await?;
        let Some(range) = self.log.offsets(&topic).await?.into_iter().next() else {
            return Ok(None);
        };
        if range.end <= range.start {
            return Ok(None);
        }
        let Some(record) = self.log.read(&topic, 0, range.end - 1, 1).await?.pop() else {
            return Ok(None);
        };
        serde_json::from_slice(&record.value).map(Some).map_err(|error| SinkError::Checkpoint {
            chain: chain.to_owned(),
            reason: error.to_string(),
        })
    }

    /// Appends `value`, keyed by the chain, to chain `chain`'s checkpoint topic (made when
    /// missing): what [`Self::load_last`] reads next.
    async fn save_last(&self, chain: &str, value: Vec<u8>) -> Result<(), SinkError> {
        let topic = checkpoint_topic(chain);
        self.log.create_topic(&topic, CHECKPOINT_TOPIC).await?;
        self.log.append(&topic, vec![NewRecord::new(chain.as_bytes().to_vec(), value)]).await?;
        Ok(())
    }

    pub fn new(log: Arc<dyn StreamLog>) -> Self {
        Self { log }
    }

    /// The latest record of every partition of `topic`, parsed for `block_number` (or
    /// `block_slot`, which Solana records carry instead).
    ///
    /// # Errors
    /// Log failures.
    pub async fn last_block_of_topic(&self, topic: &str) -> Result<Option<u64>, SinkError> {
        let mut last = None;
        for value in self.tails_of_topic(topic).await? {
            let number = serde_json::from_slice::<serde_json::Value>(&value).ok().and_then(|v| {
                v.get("block_number")
                    .or_else(|| v.get("block_slot"))
                    .and_then(serde_json::Value::as_u64)
            });
            last = last.max(number);
        }
        Ok(last)
    }

    /// The latest record of every partition of `topic` (none when it does not exist).
    ///
    /// # Errors
    /// Log failures.
    pub async fn tails_of_topic(&self, topic: &str) -> Result<Vec<Vec<u8>>, SinkError> {
        let mut out = Vec::new();
        if self.log.topic(topic).await?.is_none() {
            return Ok(out);
        }
        for (partition, range) in (0u32..).zip(self.log.offsets(topic).await?) {
            if range.end <= range.start {
                continue;
            }
            for record in self.log.read(topic, partition, range.end - 1, 1).await? {
                out.push(record.value.to_vec());
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl ChainSink for LogPositions {
    async fn append(
        &self,
        chain: &str,
        entity: &str,
        zerolag: bool,
        records: Vec<StreamRecord>,
    ) -> Result<(), SinkError> {
        let topic = sluice_bus::topics::chain_stream(chain, entity, zerolag);
        let records = records
            .into_iter()
            .map(|r| {
                let (key, value) = r.into_parts();
                NewRecord::new(key, value)
            })
            .collect();
        self.log.append(&topic, records).await?;
        Ok(())
    }

    async fn last_block(&self, chain: &str, entity: &str) -> Result<Option<u64>, SinkError> {
        self.last_block_of_topic(&sluice_bus::topics::chain_stream(chain, entity, false)).await
    }

    async fn tails(&self, chain: &str, entity: &str) -> Result<Vec<Vec<u8>>, SinkError> {
        self.tails_of_topic(&sluice_bus::topics::chain_stream(chain, entity, false)).await
    }

    async fn load_position(&self, chain: &str) -> Result<Option<serde_json::Value>, SinkError> {
        self.load_last(chain).await
    }

    async fn save_position(
        &self,
        chain: &str,
        position: &serde_json::Value,
    ) -> Result<(), SinkError> {
        self.save_last(chain, serde_json::to_vec(position).expect("a JSON value serializes")).await
    }

    async fn load_checkpoint(&self, chain: &str) -> Result<Option<Checkpoint>, SinkError> {
        self.load_last(chain).await
    }

    async fn save_checkpoint(&self, chain: &str, checkpoint: &Checkpoint) -> Result<(), SinkError> {
        self.save_last(chain, serde_json::to_vec(checkpoint).expect("a checkpoint serializes"))
            .await
    }
}
