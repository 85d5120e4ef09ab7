//! The log's producer: one idempotent producer for every append, replaced when it dies
//! (librdkafka declared a fatal error, or the broker fenced its producer id or epoch, which
//! librdkafka does not call fatal for an idempotent producer, yet every later produce fails).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};

use super::{Context, backend};
use crate::{BusError, NewRecord, Position, Result};

/// The producer appends go through, and how to make another.
pub(super) struct Producer {
    current: Mutex<Arc<FutureProducer<Context>>>,
    config: ClientConfig,
}

impl Producer {
    /// The first producer of `config`, reporting through `context`.
    pub(super) fn new(config: ClientConfig, context: &Context) -> Result<Self> {
        let first: FutureProducer<Context> =
            config.create_with_context(context.clone()).map_err(backend)?;
        Ok(Self { current: Mutex::new(Arc::new(first)), config })
    }

    /// The producer appends go through now.
    pub(super) fn current(&self) -> Arc<FutureProducer<Context>> {
        self.current.lock().expect("producer mutex is never poisoned").clone()
    }

    /// Replaces `dead` (when it is still the producer) if it is dead: librdkafka declared a
    /// fatal error, or the broker fenced it (`fenced`). Answers whether it was dead.
    pub(super) fn replace_if_dead(
        &self,
        dead: &Arc<FutureProducer<Context>>,
        fenced: bool,
    ) -> bool {
        let fatal = dead.client().fatal_error();
        if fatal.is_none() && !fenced {
            return false;
        }
        let mut current = self.current.lock().expect("producer mutex is never poisoned");
        if Arc::ptr_eq(&current, dead) {
            match self.config.create_with_context(Context::default()) {
                Ok(fresh) => {
                    tracing::warn!(reason = ?fatal, fenced, "Kafka producer failed fatally; replaced by a new one");
                    *current = Arc::new(fresh);
                }
                Err(error) => {
                    tracing::error!(%error, reason = ?fatal, fenced, "Kafka producer failed fatally and a new one could not be made");
                }
            }
        }
        true
    }
}

/// Sends `records[at]` for each of `which` through `producer` to the Kafka topic `name`:
/// each one's position, or why it failed (a record not sent after a refusal fails with
/// that refusal), stamped `now_ms`.
pub(super) async fn send(
    producer: &FutureProducer<Context>,
    name: &str,
    records: &[NewRecord],
    which: &[usize],
    partition_of: &impl Fn(&NewRecord) -> u32,
    now_ms: i64,
) -> Result<Vec<std::result::Result<Position, KafkaError>>> {
    let mut pending = Vec::with_capacity(which.len());
    let mut refused: Option<KafkaError> = None;
    for &at in which {
        let record = &records[at];
        if refused.is_some() {
            pending.push(None);
            continue;
        }
        let mut message = FutureRecord::to(name)
            .partition(partition_of(record) as i32)
            .key(&record.key[..])
            .payload(&record.value[..])
            .timestamp(now_ms);
        loop {
            match producer.send_result(message) {
                Ok(delivery) => {
                    pending.push(Some(delivery));
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    message = back;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((error, _)) => {
                    refused = Some(error);
                    pending.push(None);
                    break;
                }
            }
        }
    }
    let mut results = Vec::with_capacity(pending.len());
    for delivery in pending {
        let Some(delivery) = delivery else {
            let error = refused.clone().expect("a record not sent follows a refusal");
            results.push(Err(error));
            continue;
        };
        results.push(match delivery.await {
            Ok(Ok(delivered)) => Ok(Position {
                partition: u32::try_from(delivered.partition).unwrap_or(0),
                offset: u64::try_from(delivered.offset).unwrap_or(0),
            }),
            Ok(Err((error, _))) => Err(error),
            Err(_) => return Err(BusError::Closed),
        });
    }
    Ok(results)
}

/// Whether a produce failed because the broker no longer accepts the producer's id or epoch.
pub(super) fn is_fenced(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::UnknownProducerId
                | RDKafkaErrorCode::Fenced
        )
    )
}
