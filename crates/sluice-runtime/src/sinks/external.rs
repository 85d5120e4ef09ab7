//! Sinks outside Sluice — a webhook, the user's Kafka cluster, a NATS JetStream stream, a
//! notification topic — share one delivery rule, kept here: a [`Transport`] sends the
//! batch's records and answers once the receiver acknowledged them; only then are the
//! batch's dead letters and script logs written and its source offsets committed, in one step
//! of the log. So `at_least_once` holds whatever the receiver does:
//!
//! - acknowledged: settled;
//! - [`TransportError::Retryable`] (connection refused, a timeout, 408/429/5xx, a broker
//!   unavailable): nothing is settled; the worker holds the source and tries the same batch
//!   again after a backoff (at least the receiver's `Retry-After`);
//! - [`TransportError::Rejected`] (the receiver refuses these records for good: a 4xx, a
//!   record over its size limit): the records become dead letters carrying the reason, the
//!   batch is settled and the pipeline goes on. A transport may also reject single records
//!   of an otherwise acknowledged batch ([`Sent::rejected`]).
//!
//! The batch id ([`Batch::id`]) is a digest of the sink and the source offsets the batch
//! settles: a batch sent again after a failure carries the same id, so a receiver can drop
//! the duplicate. After a restart the batch boundaries may differ; every record also
//! carries its stream key, unique per record of a chain stream.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sluice_bus::{NewRecord, StreamLog};
use sluice_core::pipeline::SinkConfig;

use super::{Settle, Sink, SinkConnection, SinkError};
use crate::delivery::{Delivery, SideTopics};

/// One batch for a [`Transport`].
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// Stable for the same sink and source offsets (an idempotency key).
    pub id: &'a str,
    /// In source order; a record's `key` is its stream key.
    pub records: &'a [NewRecord],
}

/// What the receiver acknowledged.
#[derive(Debug, Default)]
pub struct Sent {
    /// Records the receiver refused for good, by index in the batch, with the reason; every
    /// other record was acknowledged.
    pub rejected: Vec<(usize, String)>,
}

/// A send that did not get every record acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The receiver is down, slow or busy: waiting may help. Nothing of the batch counts as
    /// delivered (some records may have arrived: they are sent again).
    #[error("{message}")]
    Retryable {
        message: String,
        /// How long the receiver asked to wait (`Retry-After`).
        retry_after: Option<Duration>,
    },
    /// The receiver refuses the whole batch for good (`message` says why: a status and an
    /// excerpt of the response, never a credential). Its records are dead-lettered.
    #[error("{message}")]
    Rejected { message: String },
}

impl TransportError {
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::Retryable { message: message.into(), retry_after: None }
    }

    pub fn rejected(message: impl Into<String>) -> Self {
        Self::Rejected { message: message.into() }
    }
}

/// How records reach one external system.
#[async_trait::async_trait]
pub trait Transport: Send + Sync + std::fmt::Debug {
    /// Sends `batch.records` in order, each keyed with its stream key; answers once the
    /// receiver acknowledged every record not in [`Sent::rejected`]. Records of one key
    /// arrive in the order given.
    ///
    /// # Errors
    /// [`TransportError`].
    async fn send(&self, batch: Batch<'_>) -> Result<Sent, TransportError>;

    /// Where the records go, for the deploy response (never a credential).
    fn connection(&self) -> Value;

    /// Whether the receiver answers with these settings (checked at deploy).
    ///
    /// # Errors
    /// Why not, naming no credential.
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }

    /// Releases connections and clients; called when the deployment stops with this sink.
    async fn close(&self) {}
}

/// A sink that sends to an external system through a [`Transport`].
#[derive(Debug)]
pub struct ExternalSink {
    config: SinkConfig,
    transport: Arc<dyn Transport>,
}

impl ExternalSink {
    pub fn new(config: SinkConfig, transport: Arc<dyn Transport>) -> Self {
        Self { config, transport }
    }

    fn batch_id(&self, settle: Settle<'_>) -> String {
        let mut digest = Sha256::new();
        digest.update(self.config.uid().as_bytes());
        digest.update([0]);
        digest.update(settle.group.as_bytes());
        digest.update([0]);
        digest.update(settle.source.as_bytes());
        for (partition, offset) in settle.offsets {
            digest.update(partition.to_be_bytes());
            digest.update(offset.to_be_bytes());
        }
        let digest = digest.finalize();
        digest[..16].iter().map(|byte| format!("{byte:02x}")).collect()
    }

    fn error(&self, source: TransportError, retryable: bool) -> SinkError {
        let retry_after = match &source {
            TransportError::Retryable { retry_after, .. } => *retry_after,
            TransportError::Rejected { .. } => None,
        };
        SinkError {
            uid: self.config.uid().to_owned(),
            source: Box::new(source),
            retryable,
            retry_after,
        }
    }
}

#[async_trait::async_trait]
impl Sink for ExternalSink {
    fn config(&self) -> &SinkConfig {
        &self.config
    }

    fn managed_topic(&self) -> Option<&str> {
        None
    }

    async fn deliver(
        &self,
        log: &Arc<dyn StreamLog>,
        delivery: &Delivery,
        side: &SideTopics,
        settle: Settle<'_>,
    ) -> Result<(), SinkError> {
        let mut refused = Vec::new();
        if !delivery.out.is_empty() {
            let id = self.batch_id(settle);
            match self.transport.send(Batch { id: &id, records: &delivery.out }).await {
                Ok(sent) => {
                    for (index, reason) in sent.rejected {
                        if let Some(record) = delivery.out.get(index) {
                            refused.push(self.dead_letter(record, &reason, delivery));
                        }
                    }
                }
                Err(TransportError::Rejected { message }) => {
                    tracing::warn!(sink_uid = self.config.uid(), records = delivery.out.len(), reason = %message, "sink refused the batch; its records are dead-lettered");
                    refused.extend(
                        delivery
                            .out
                            .iter()
                            .map(|record| self.dead_letter(record, &message, delivery)),
                    );
                }
                Err(error @ TransportError::Retryable { .. }) => {
                    return Err(self.error(error, true));
                }
            }
        }
        let dead: Vec<NewRecord>;
        let dead = if refused.is_empty() {
            &delivery.dead
        } else {
            dead = delivery.dead.iter().cloned().chain(refused).collect();
            &dead
        };
        super::settle_side(log, self.config.uid(), side, dead, &delivery.logs, settle).await
    }

    fn connection(&self, _pipeline_id: &str) -> SinkConnection {
        SinkConnection::unmanaged(&self.config, self.transport.connection())
    }

    async fn check_connection(&self) -> Result<(), super::SinkBuildError> {
        self.transport.check().await.map_err(|reason| super::SinkBuildError::Client {
            uid: self.config.uid().to_owned(),
            reason,
        })
    }

    async fn close(&self) {
        self.transport.close().await;
    }
}

impl ExternalSink {
    /// The dead letter of a record the receiver refused: the same shape as a transform's,
    /// with `sink_uid` instead of `transform_uid` (a replay sends it to the sink again).
    fn dead_letter(&self, record: &NewRecord, reason: &str, delivery: &Delivery) -> NewRecord {
        let body = serde_json::from_slice::<Value>(&record.value)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&record.value).into_owned()));
        let value = json!({
            "sink_uid": self.config.uid(),
            "error": reason,
            "attempts": 1,
            "failed_at": sluice_core::time::format(delivery.made_at),
            "record": body,
        });
        NewRecord::new(
            record.key.clone(),
            serde_json::to_vec(&value).expect("a dead letter serializes"),
        )
    }
}
