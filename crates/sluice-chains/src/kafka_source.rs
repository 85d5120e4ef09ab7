//! The Kafka source: a topic of the user's own Kafka cluster feeding one chain stream (any
//! chain, any entity). `docs/chains.md` ("Kafka sources") is the prose.
//!
//! Every message is one JSON record of the stream and goes through the ingest checks
//! ([`StreamRecord::parse`]); a message that fails them is dead-lettered, with its error, to
//! the source's own list (the topic [`dead_letter_topic`] of Sluice's log) and counted, and
//! the source reads on. Each batch goes: records to the stream in one append, dead letters
//! to their list, then the consumer group's offsets are committed. A crash anywhere before
//! the commit makes the next start read the batch again (at least once; the records' keys
//! make a redelivery visible to consumers, docs/streams.md). Under load the next batch is
//! polled and checked while one is written ([`KafkaSource::step`]); commits stay in order,
//! each after its batch is durable.
//!
//! The consumer is assigned every partition of the topic (it does not join the group's
//! rebalancing); the group holds the committed offsets. librdkafka does the fetching.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::json;
use sluice_bus::{NewRecord, Retention, StreamLog, TopicConfig};
use sluice_core::streams::StreamRecord;

use crate::sink::{ChainSink, SinkError};

/// The list of a source's bad messages.
pub fn dead_letter_topic(source: &str) -> String {
    format!("_sluice.sources.{source}.dead_letters")
}

/// Dead letters are kept 30 days (the user fixes the producer and replays them meanwhile).
const DEAD_LETTERS: TopicConfig = TopicConfig {
    partitions: 1,
    retention: Retention { max_age: Duration::from_secs(30 * 24 * 3600), max_bytes: Some(1 << 30) },
};

/// How often the lag behind the topic's end is measured.
const LAG_EVERY: Duration = Duration::from_secs(1);

/// One Kafka source.
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    /// Names the source in the status, the metrics and its dead-letter list.
    pub name: String,
    pub chain: String,
    pub entity: String,
    pub bootstrap_servers: String,
    pub topic: String,
    pub group_id: String,
    /// librdkafka client settings (`security.protocol`, `sasl.*`, `ssl.*`,
    /// `auto.offset.reset`).
    pub client: BTreeMap<String, String>,
    /// Messages per batch (one append, one commit).
    pub max_batch: usize,
}

/// Errors of a source. Whose fault: `Client` the configuration's (librdkafka refused a
/// setting); `Kafka` the user's cluster's (retrying can help); `Sink` Sluice's log's.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("Kafka source {source_name}: {reason}")]
    Client { source_name: String, reason: String },
    #[error("Kafka source {source_name}: {reason}")]
    Kafka { source_name: String, reason: String },
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("Kafka source dead letters: {0}")]
    Log(#[from] sluice_bus::BusError),
}

/// What `GET /api/v1/chains` and `/metrics` show of a source.
#[derive(Debug, Default)]
pub struct SourceStatus {
    pub records: AtomicU64,
    pub dead_letters: AtomicU64,
    /// Messages between the committed position and the topic's end (`u64::MAX`: unknown).
    pub lag_messages: AtomicU64,
    /// The newest block number seen in a record (`block_number`, `block_slot` or `height`),
    /// `u64::MAX` for none.
    pub block: AtomicU64,
    pub last_error: std::sync::Mutex<Option<String>>,
}

impl SourceStatus {
    fn new() -> Self {
        let status = Self::default();
        status.lag_messages.store(u64::MAX, Ordering::Relaxed);
        status.block.store(u64::MAX, Ordering::Relaxed);
        status
    }

    fn error(&self, error: Option<String>) {
        *self.last_error.lock().expect("status lock is never poisoned") = error;
    }

    /// The last error, if the last batch failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("status lock is never poisoned").clone()
    }

    fn get(value: &AtomicU64) -> Option<u64> {
        Some(value.load(Ordering::Relaxed)).filter(|v| *v != u64::MAX)
    }

    pub fn lag(&self) -> Option<u64> {
        Self::get(&self.lag_messages)
    }

    pub fn block(&self) -> Option<u64> {
        Self::get(&self.block)
    }
}

/// A running source.
pub struct KafkaSource {
    config: KafkaSourceConfig,
    sink: Arc<dyn ChainSink>,
    log: Arc<dyn StreamLog>,
    status: Arc<SourceStatus>,
    consumer: Option<BaseConsumer>,
    /// The offsets committed so far, by partition (for the lag).
    committed: Arc<std::sync::Mutex<HashMap<i32, i64>>>,
    /// Stops the lag thread.
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// A batch polled and checked while the previous one was written (see [`Self::step`]).
    pending: Option<Batch>,
}

/// librdkafka's close of a consumer that has a group can wait for the coordinator (40 s
/// against some brokers); it runs on a thread of its own so that neither a retry nor the
/// process's exit waits for it.
fn close_in_background(consumer: Option<BaseConsumer>) {
    if let Some(consumer) = consumer {
        let spawned = std::thread::Builder::new()
            .name("sluice-source-close".to_owned())
            .spawn(move || drop(consumer));
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot start the thread that closes a Kafka consumer");
        }
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        close_in_background(self.consumer.take());
    }
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource").field("name", &self.config.name).finish_non_exhaustive()
    }
}

/// The librdkafka settings of `config`'s consumer.
pub fn client_config(config: &KafkaSourceConfig) -> ClientConfig {
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", &config.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        // A broker that holds an idle fetch for the whole wait (tansu) adds it to every
        // batch once the source has caught up; Kafka answers as soon as records arrive.
        .set("fetch.wait.max.ms", "100")
        // The source is slower than the fetching (every message is checked and made
        // durable), so librdkafka's queue fills up; by default it then postpones the next
        // fetch by a second, and the source, having drained the queue meanwhile, waits for
        // it (most of the source's wall time in the benchmark, BENCHMARKS.md).
        .set("fetch.queue.backoff.ms", "10")
        .set("client.id", "sluice-source");
    for (name, value) in &config.client {
        client.set(name, value);
    }
    client
}

impl KafkaSource {
    /// # Errors
    /// [`SourceError::Client`] when librdkafka refuses a setting.
    pub fn new(
        config: KafkaSourceConfig,
        sink: Arc<dyn ChainSink>,
        log: Arc<dyn StreamLog>,
    ) -> Result<Self, SourceError> {
        // Made once here so that a refused setting stops the start.
        let consumer: BaseConsumer = client_config(&config).create().map_err(|error| {
            SourceError::Client { source_name: config.name.clone(), reason: error.to_string() }
        })?;
        close_in_background(Some(consumer));
        Ok(Self {
            config,
            sink,
            log,
            status: Arc::new(SourceStatus::new()),
            consumer: None,
            committed: Arc::default(),
            stop: Arc::default(),
            pending: None,
        })
    }

    pub fn status(&self) -> Arc<SourceStatus> {
        self.status.clone()
    }

    /// Runs until the task is dropped: a failed batch is logged, shown in the status, and
    /// read again from the committed offsets after a backoff.
    pub async fn run(mut self) {
        let name = self.config.name.clone();
        tracing::info!(source = %name, topic = %self.config.topic, chain = %self.config.chain, entity = %self.config.entity, "kafka source starting");
        watch_lag(&self.config, self.committed.clone(), self.status.clone(), self.stop.clone());
        let mut failures = 0u32;
        loop {
            match self.step().await {
                Ok(read) => {
                    if failures > 0 {
                        self.status.error(None);
                    }
                    failures = 0;
                    if read == 0 {
                        // An idle poll awaited nothing: let the task be cancelled (and
                        // others run) between polls.
                        tokio::task::yield_now().await;
                    }
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(source = %name, %error, failures, "kafka source batch failed; reading again from the committed offsets");
                    self.status.error(Some(error.to_string()));
                    // A new consumer starts at the committed offsets (a batch read ahead
                    // is read again).
                    self.pending = None;
                    close_in_background(self.consumer.take());
                    let delay =
                        Duration::from_millis(100 << failures.min(8)).min(Duration::from_secs(30));
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    fn kafka_error(&self, reason: impl std::fmt::Display) -> SourceError {
        SourceError::Kafka { source_name: self.config.name.clone(), reason: reason.to_string() }
    }

    /// Assigns every partition of the topic, each from the group's committed offset.
    fn connect(&self) -> Result<BaseConsumer, SourceError> {
        let consumer: BaseConsumer = client_config(&self.config).create().map_err(|error| {
            SourceError::Client { source_name: self.config.name.clone(), reason: error.to_string() }
        })?;
        let metadata = consumer
            .fetch_metadata(Some(&self.config.topic), Duration::from_secs(10))
            .map_err(|e| self.kafka_error(e))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == self.config.topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(self.kafka_error(format!(
                "topic {} has no partitions (does it exist?)",
                self.config.topic
            )));
        }
        let mut list = TopicPartitionList::new();
        for partition in partitions {
            list.add_partition_offset(&self.config.topic, partition, Offset::Stored)
                .map_err(|e| self.kafka_error(e))?;
        }
        consumer.assign(&list).map_err(|e| self.kafka_error(e))?;
        // Where each partition stands, for the lag (the start of the topic where the group
        // has committed nothing).
        let committed =
            consumer.committed(Duration::from_secs(10)).map_err(|e| self.kafka_error(e))?;
        let mut offsets = self.committed.lock().expect("offsets lock is never poisoned");
        for element in committed.elements() {
            let at = match element.offset() {
                Offset::Offset(at) => at,
                _ => 0,
            };
            offsets.entry(element.partition()).or_insert(at);
        }
        drop(offsets);
        Ok(consumer)
    }

    /// One batch made durable: its good messages appended, its bad ones dead-lettered, then
    /// its offsets committed. Answers the messages it held (0: the poll found none).
    ///
    /// Under load the next batch is polled and checked while this one's append is written:
    /// a full batch (`max_batch` messages) starts its append, the next batch is read
    /// meanwhile and kept for the next step, and only then is this one committed. A batch
    /// that is not full is finished at once (a quiet topic waits for no further poll).
    ///
    /// # Errors
    /// Kafka and log failures; nothing of the failed batch is committed then (a batch read
    /// ahead is dropped and read again from the committed offsets).
    pub async fn step(&mut self) -> Result<usize, SourceError> {
        if self.consumer.is_none() {
            self.pending = None;
            let consumer = crate::hyperliquid::ingester::blocking(|| self.connect())?;
            self.consumer = Some(consumer);
        }
        let batch = match self.pending.take() {
            Some(batch) => batch,
            None => self.poll()?,
        };
        let read = batch.read;
        if read == 0 {
            return Ok(0);
        }
        if read < self.config.max_batch.max(1) {
            self.finish(batch).await?;
            return Ok(read);
        }
        // The append is handed to the log's writer at its first poll, before the next batch
        // is read; the commit waits for both.
        let (done, next) =
            futures_util::future::join(self.finish(batch), async { self.poll() }).await;
        done?;
        self.pending = Some(next?).filter(|next| next.read > 0);
        Ok(read)
    }

    /// Polls up to `max_batch` messages (waiting up to 100 ms for the first) and checks each.
    fn poll(&self) -> Result<Batch, SourceError> {
        let consumer = self.consumer.as_ref().expect("connected before polling");
        let max = self.config.max_batch.max(1);
        let mut batch = Batch::default();
        let started = Instant::now();
        let polled: Result<(), rdkafka::error::KafkaError> =
            crate::hyperliquid::ingester::blocking(|| {
                let mut wait = Duration::from_millis(100);
                while batch.read < max {
                    let Some(message) = consumer.poll(wait) else { break };
                    wait = Duration::ZERO;
                    let message = message?;
                    batch.read += 1;
                    batch.next_offset(message.partition(), message.offset() + 1);
                    let payload = message.payload().unwrap_or_default();
                    match StreamRecord::parse(&self.config.entity, payload) {
                        Ok(record) => batch.records.push(record),
                        Err(error) => {
                            batch.dead.push(dead_letter(&message, payload, &error.to_string()));
                        }
                    }
                }
                Ok(())
            });
        polled.map_err(|e| self.kafka_error(e))?;
        tracing::debug!(source = %self.config.name, read = batch.read, poll_ms = started.elapsed().as_millis() as u64, "kafka source poll");
        Ok(batch)
    }

    /// Appends a batch's records, dead-letters its bad messages, then commits its offsets.
    async fn finish(&self, batch: Batch) -> Result<(), SourceError> {
        let Batch { read, records, dead, next } = batch;
        let started = Instant::now();
        let (appended, rejected) = (records.len() as u64, dead.len() as u64);
        // The newest record's block (records of a batch are in the topic's order).
        let block = records.last().and_then(|record| block_of(record.value()));
        if !records.is_empty() {
            self.sink.append(&self.config.chain, &self.config.entity, false, records).await?;
        }
        if !dead.is_empty() {
            let topic = dead_letter_topic(&self.config.name);
            self.log.create_topic(&topic, DEAD_LETTERS).await?;
            self.log.append(&topic, dead).await?;
            tracing::warn!(source = %self.config.name, count = rejected, "kafka source messages dead-lettered");
        }
        let mut list = TopicPartitionList::new();
        for (partition, offset) in &next {
            list.add_partition_offset(&self.config.topic, *partition, Offset::Offset(*offset))
                .map_err(|e| self.kafka_error(e))?;
        }
        let consumer = self.consumer.as_ref().expect("connected before polling");
        let durable_at = Instant::now();
        crate::hyperliquid::ingester::blocking(|| consumer.commit(&list, CommitMode::Sync))
            .map_err(|e| self.kafka_error(format!("committing offsets: {e}")))?;
        tracing::debug!(source = %self.config.name, read, append_ms = (durable_at - started).as_millis() as u64, commit_ms = durable_at.elapsed().as_millis() as u64, "kafka source batch");
        self.status.records.fetch_add(appended, Ordering::Relaxed);
        self.status.dead_letters.fetch_add(rejected, Ordering::Relaxed);
        if let Some(block) = block {
            self.status.block.fetch_max(block, Ordering::Relaxed);
        }
        self.committed.lock().expect("offsets lock is never poisoned").extend(next);
        Ok(())
    }
}

/// Messages polled and checked, not yet durable.
#[derive(Debug, Default)]
struct Batch {
    read: usize,
    records: Vec<StreamRecord>,
    dead: Vec<NewRecord>,
    /// By partition, the offset past its last message.
    next: Vec<(i32, i64)>,
}

impl Batch {
    fn next_offset(&mut self, partition: i32, offset: i64) {
        // Messages come in runs of one partition: the last entry is nearly always it.
        match self.next.iter_mut().rev().find(|(p, _)| *p == partition) {
            Some(entry) => entry.1 = offset,
            None => self.next.push((partition, offset)),
        }
    }
}

/// Measures the lag behind the topic's end every [`LAG_EVERY`] on a thread of its own (a
/// watermark request can take a second against some brokers; the batches never wait for it):
/// the high watermark of each partition minus the offset committed for it.
fn watch_lag(
    config: &KafkaSourceConfig,
    committed: Arc<std::sync::Mutex<HashMap<i32, i64>>>,
    status: Arc<SourceStatus>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let Ok(consumer) = client_config(config).create::<BaseConsumer>() else { return };
    let topic = config.topic.clone();
    let spawned =
        std::thread::Builder::new().name("sluice-source-lag".to_owned()).spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let offsets: Vec<(i32, i64)> = committed
                    .lock()
                    .expect("offsets lock is never poisoned")
                    .iter()
                    .map(|(p, o)| (*p, *o))
                    .collect();
                // Nothing known before the consumer is assigned.
                let mut lag = (!offsets.is_empty()).then_some(0u64);
                for (partition, at) in offsets {
                    match consumer.fetch_watermarks(&topic, partition, Duration::from_secs(5)) {
                        Ok((_, high)) => {
                            lag = lag.map(|l| l + u64::try_from(high - at).unwrap_or(0))
                        }
                        Err(_) => lag = None,
                    }
                }
                if let Some(lag) = lag {
                    status.lag_messages.store(lag, Ordering::Relaxed);
                }
                std::thread::sleep(LAG_EVERY);
            }
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "cannot start the thread that measures a Kafka source's lag");
    }
}

/// The dead letter of a message: where it was, its key and text, and why it was refused.
fn dead_letter(
    message: &rdkafka::message::BorrowedMessage<'_>,
    payload: &[u8],
    error: &str,
) -> NewRecord {
    let key = format!("{}/{}/{}", message.topic(), message.partition(), message.offset());
    let value = json!({
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "key": message.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        "value": String::from_utf8_lossy(payload),
        "error": error,
        "dead_lettered_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    });
    NewRecord::new(key, serde_json::to_vec(&value).expect("a JSON value serializes"))
}

/// A record's block: `block_number`, `block_slot`, or a Hyperliquid block's `height`.
fn block_of(value: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Blocks {
        block_number: Option<u64>,
        block_slot: Option<u64>,
        payload: Option<Height>,
    }
    #[derive(serde::Deserialize)]
    struct Height {
        height: Option<u64>,
    }
    let blocks: Blocks = serde_json::from_slice(value).ok()?;
    blocks.block_number.or(blocks.block_slot).or(blocks.payload.and_then(|p| p.height))
}
