//! The stream log on a Kafka cluster (any broker speaking the Kafka protocol), through
//! librdkafka (`rdkafka`, its bundled build).
//!
//! What lives where: every Sluice topic is a Kafka topic of the same name (after the
//! operator's `topic_prefix`), with the same partitions; a record's key is the Kafka key and
//! its partition is chosen by Sluice ([`partition_for_key`], as on the embedded log), so a
//! Kafka client reading a topic sees the same partitions and order. Append times are the
//! records' Kafka timestamps (`CreateTime`, set from Sluice's clock). Consumer-group offsets
//! are Kafka's committed offsets of the group of the same name (prefixed).
//!
//! - Appends go through one idempotent producer (`acks=all`); an append returns once the
//!   brokers acknowledged every record. A producer that is dead (librdkafka declared a
//!   fatal error, or the broker fenced its producer id or epoch, as a busy tansu did) is
//!   replaced by a new one ([`producer`]), and the records it did not get through are sent
//!   through that (`append_slice`).
//! - Reads: [`readers`]. Watches: [`tails`]. Group offsets: [`groups`].
//! - Clients: an admin client (group offsets too), a producer, a consumer for metadata and
//!   watermarks, [`readers::LANES`] fetching consumers and one tail consumer for the chain
//!   streams: a fixed set, whatever the number of groups, partitions read and streams
//!   watched. A pipeline's own topics (sink, dead letters, script log) get clients of their
//!   own while someone reads or watches them (see [`readers`] for why). librdkafka's
//!   blocking calls run on [`clients::BLOCKING_THREADS`] threads of the log's own.
//! - `append_and_commit` appends, then commits (at-least-once: a crash in between delivers
//!   the batch again); the embedded log does both in one transaction.
//! - Retention is the topics' `retention.ms` / `retention.bytes`, applied by the brokers;
//!   [`StreamLog::enforce_retention`] has nothing to do.
//!
//! This file is the `StreamLog` implementation; the clients' setup is in [`clients`], and what
//! grew on its own (readers, tails, group offsets, settings, the producer) is in the other
//! submodules.

mod clients;
mod groups;
mod producer;
mod readers;
mod settings;
mod tails;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};
use sluice_core::clock::Clock;

pub use settings::KafkaSettings;

use self::clients::{Blocking, Context, backend};
use self::groups::GroupOffsets;
use self::producer::{Producer, is_fenced, send};
use self::readers::Readers;
use self::tails::Tails;
use crate::topics::check_name;
use crate::{
    AppendWatch, BusError, ClientAccess, NewRecord, OffsetRange, Position, Record, Result,
    Retention, StreamLog, TopicConfig, partition_for_key,
};

/// How long a metadata, offset or admin request may take before it fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The stream log on a Kafka cluster.
#[derive(Clone)]
pub struct KafkaLog {
    inner: Arc<Inner>,
}

struct Inner {
    settings: KafkaSettings,
    clock: Arc<dyn Clock>,
    admin: Arc<AdminClient<Context>>,
    /// The producer, replaced when it dies ([`producer`]).
    producer: Producer,
    /// Metadata, watermarks and time lookups.
    meta: Arc<BaseConsumer<Context>>,
    /// Bounds the blocking calls running at once.
    blocking: Blocking,
    /// Topic configurations by Sluice name, as created or last read.
    topics: Mutex<HashMap<String, TopicConfig>>,
    /// Commits and reads the offsets of every consumer group (through `admin`).
    groups: GroupOffsets,
    readers: Arc<Readers>,
    tails: Arc<Tails>,
    tail_clients: tails::TailClients,
}

impl std::fmt::Debug for KafkaLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaLog").field("settings", &self.inner.settings).finish_non_exhaustive()
    }
}

impl KafkaLog {
    /// How many reader cursors are pooled: `(fetching, parked)`. Cursors unused for two
    /// seconds are parked (they stop fetching until their next read).
    pub fn pooled_cursors(&self) -> (usize, usize) {
        self.inner.readers.counts()
    }

    /// The cluster's settings (secrets redacted when shown).
    pub fn settings(&self) -> &KafkaSettings {
        &self.inner.settings
    }

    /// The Kafka name of a Sluice topic or group.
    fn name(&self, topic: &str) -> String {
        self.inner.settings.name(topic)
    }

    /// The topic's configuration, from the cache or the cluster.
    async fn config_of(&self, topic: &str) -> Result<Option<TopicConfig>> {
        if let Some(config) = self.cached(topic) {
            return Ok(Some(config));
        }
        let name = self.name(topic);
        let meta = self.inner.meta.clone();
        let lookup = name.clone();
        let metadata = (self.inner.blocking)
            .run(move || meta.fetch_metadata(Some(&lookup), REQUEST_TIMEOUT))
            .await
            .map_err(backend)?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == name) else {
            return Ok(None);
        };
        match found.error().map(RDKafkaErrorCode::from) {
            None => {}
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => return Ok(None),
            Some(code) => return Err(backend(KafkaError::MetadataFetch(code))),
        }
        let partitions = u32::try_from(found.partitions().len()).unwrap_or(0);
        if partitions == 0 {
            return Ok(None);
        }
        let retention = self.retention_of(&name).await?;
        let config = TopicConfig { partitions, retention };
        self.inner.topics.lock().expect("topic cache mutex").insert(topic.to_owned(), config);
        Ok(Some(config))
    }

    fn cached(&self, topic: &str) -> Option<TopicConfig> {
        self.inner.topics.lock().expect("topic cache mutex").get(topic).copied()
    }

    async fn existing(&self, topic: &str) -> Result<TopicConfig> {
        self.config_of(topic).await?.ok_or_else(|| BusError::UnknownTopic(topic.to_owned()))
    }

    async fn partition_of(&self, topic: &str, partition: u32) -> Result<()> {
        if partition < self.existing(topic).await?.partitions {
            Ok(())
        } else {
            Err(BusError::UnknownPartition { topic: topic.to_owned(), partition })
        }
    }

    /// The topic's retention as the cluster has it configured.
    async fn retention_of(&self, name: &str) -> Result<Retention> {
        let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
        let described = self
            .inner
            .admin
            .describe_configs([&ResourceSpecifier::Topic(name)], &options)
            .await
            .map_err(backend)?;
        let mut retention = Retention::default();
        if let Some(Ok(resource)) = described.into_iter().next() {
            let value = |key: &str| {
                resource.get(key).and_then(|entry| entry.value.as_deref()?.parse::<i64>().ok())
            };
            if let Some(ms) = value("retention.ms").filter(|ms| *ms >= 0) {
                retention.max_age = Duration::from_millis(ms.unsigned_abs());
            }
            retention.max_bytes =
                value("retention.bytes").filter(|b| *b >= 0).map(i64::unsigned_abs);
        }
        Ok(retention)
    }

    /// Reads with a pooled cursor.
    async fn read_with_cursor(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<Record>> {
        self.read_placed(topic, partition, from, max, false).await
    }

    /// [`KafkaLog::read_with_cursor`]; with `fresh`, the cursor fetches from `from` afresh
    /// (a pooled cursor's view of the end may be old: appends made by other processes reach
    /// it only by its own fetches).
    async fn read_placed(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        fresh: bool,
    ) -> Result<Vec<Record>> {
        // On a task of its own: a caller that stops waiting does not take the cursor with it
        // (its lane stays the partition's until the read is done and the cursor is back).
        let log = self.clone();
        let topic = topic.to_owned();
        tokio::spawn(async move { log.read_in_task(&topic, partition, from, max, fresh).await })
            .await
            .map_err(|_| BusError::Closed)?
    }

    async fn read_in_task(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        fresh: bool,
    ) -> Result<Vec<Record>> {
        let readers = &self.inner.readers;
        let mut cursor = readers.cursor(topic, &self.name(topic), partition, from).await?;
        if fresh {
            cursor.replace();
        }
        if cursor.needs_placing(from) {
            let placed = self
                .inner
                .blocking
                .run(move || {
                    let placed = cursor.place(from);
                    Ok((cursor, placed))
                })
                .await;
            // Only a panic while placing loses the cursor; its lane then stays taken.
            let (back, placed) = placed.map_err(|_| BusError::Closed)?;
            cursor = back;
            if let Err(error) = placed {
                readers.put(topic, cursor);
                return Err(error);
            }
        }
        let known_end = readers.known_end(topic, partition);
        let read = cursor.read(from, max, known_end).await;
        readers.put(topic, cursor);
        read
    }

    /// The offsets of one partition: its earliest, and its end read from a fetch (a fetch's
    /// high watermark is exact on every broker this was run on; tansu 0.6 answers
    /// `ListOffsets(latest)` with the last record batch's base offset + 1). The fetch goes on
    /// until the cursor reaches the partition's end: with several processes appending, the
    /// batches after the listed one need not come in the first fetch.
    async fn partition_offsets(&self, topic: &str, partition: u32) -> Result<OffsetRange> {
        let name = self.name(topic);
        let meta = self.inner.meta.clone();
        let (low, high) = (self.inner.blocking)
            .run(move || meta.fetch_watermarks(&name, partition as i32, REQUEST_TIMEOUT))
            .await
            .map_err(backend)?;
        let start = u64::try_from(low).unwrap_or(0);
        let listed = u64::try_from(high).unwrap_or(0);
        let mut end = listed.max(start).max(self.inner.readers.known_end(topic, partition));
        let mut from = end.saturating_sub(1).max(start);
        let mut fresh = true;
        while end > start {
            let read = self.read_placed(topic, partition, from, usize::MAX, fresh).await?;
            fresh = false;
            match read.last() {
                Some(record) if record.offset + 1 > end => {
                    end = record.offset + 1;
                    from = end;
                }
                _ => break,
            }
        }
        self.inner.readers.learn_end(topic, partition, end);
        Ok(OffsetRange { start, end })
    }
}

#[async_trait]
impl StreamLog for KafkaLog {
    async fn create_topic(&self, topic: &str, config: TopicConfig) -> Result<TopicConfig> {
        check_name(topic)?;
        check_name(&self.name(topic))?;
        if config.partitions == 0 || config.partitions > 1024 {
            return Err(BusError::InvalidConfig("a topic has 1 to 1024 partitions"));
        }
        if let Some(existing) = self.config_of(topic).await? {
            return Ok(existing);
        }
        let name = self.name(topic);
        let retention_ms = config.retention.max_age.as_millis().to_string();
        let retention_bytes =
            config.retention.max_bytes.map_or_else(|| "-1".to_owned(), |b| b.to_string());
        let partitions = i32::try_from(config.partitions).unwrap_or(1);
        let replication = TopicReplication::Fixed(self.inner.settings.replication_factor);
        let new_topic = NewTopic::new(&name, partitions, replication)
            .set("retention.ms", &retention_ms)
            .set("retention.bytes", &retention_bytes)
            .set("message.timestamp.type", "CreateTime");
        let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
        let results =
            self.inner.admin.create_topics([&new_topic], &options).await.map_err(backend)?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(backend(KafkaError::AdminOp(code))),
            }
        }
        // Another node may have made it first, with its own configuration.
        self.inner.topics.lock().expect("topic cache mutex").remove(topic);
        Ok(self.config_of(topic).await?.unwrap_or(config))
    }

    async fn delete_topic(&self, topic: &str) -> Result<bool> {
        let name = self.name(topic);
        // Readers and the tail of the topic close first: none is left fetching a topic
        // that is gone (librdkafka 2.12.1 crashed on tansu when one was).
        self.release_topic(topic).await;
        let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
        let results = self.inner.admin.delete_topics(&[&name], &options).await.map_err(backend)?;
        self.inner.topics.lock().expect("topic cache mutex").remove(topic);
        let mut deleted = true;
        for result in results {
            match result {
                Ok(_) => {}
                Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => deleted = false,
                Err((_, code)) => return Err(backend(KafkaError::AdminOp(code))),
            }
        }
        Ok(deleted)
    }

    async fn topic(&self, topic: &str) -> Result<Option<TopicConfig>> {
        self.config_of(topic).await
    }

    async fn append(&self, topic: &str, records: Vec<NewRecord>) -> Result<Vec<Position>> {
        self.append_slice(topic, &records).await
    }

    /// Appends, then commits: at-least-once (a crash in between delivers the batch again).
    /// Every topic is checked first, so a missing one fails the call before anything is
    /// written.
    async fn append_and_commit(
        &self,
        appends: &[(&str, &[NewRecord])],
        group: &str,
        source: &str,
        offsets: &[(u32, u64)],
    ) -> Result<()> {
        self.existing(source).await?;
        for (topic, _) in crate::non_empty(appends) {
            self.existing(topic).await?;
        }
        for (topic, records) in crate::non_empty(appends) {
            self.append_slice(topic, records).await?;
        }
        self.commit(group, source, offsets).await
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<Record>> {
        self.partition_of(topic, partition).await?;
        if max == 0 {
            return Ok(Vec::new());
        }
        self.read_with_cursor(topic, partition, from, max).await
    }

    async fn offsets(&self, topic: &str) -> Result<Vec<OffsetRange>> {
        let config = self.existing(topic).await?;
        let mut ranges = Vec::with_capacity(config.partitions as usize);
        for partition in 0..config.partitions {
            ranges.push(self.partition_offsets(topic, partition).await?);
        }
        Ok(ranges)
    }

    async fn offset_for_time(&self, topic: &str, partition: u32, timestamp_ms: i64) -> Result<u64> {
        self.partition_of(topic, partition).await?;
        let range = self.partition_offsets(topic, partition).await?;
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(
            &self.name(topic),
            partition as i32,
            Offset::Offset(timestamp_ms),
        )
        .map_err(backend)?;
        let meta = self.inner.meta.clone();
        let found = (self.inner.blocking)
            .run(move || meta.offsets_for_times(list, REQUEST_TIMEOUT))
            .await
            .map_err(backend)?;
        let hint = match found.elements().first().map(|element| element.offset()) {
            Some(Offset::Offset(at)) => {
                u64::try_from(at).unwrap_or(0).clamp(range.start, range.end)
            }
            _ => range.end,
        };
        // The broker's answer is checked (tansu 0.6 answers the first offset for times it
        // cannot place): right when the record there is at or after the time and the one
        // before is earlier. Otherwise a binary search by the records' own timestamps,
        // which never decrease within a partition (Sluice stamps them with its clock).
        let at_or_after = |offset: u64| async move {
            let record = self.read_with_cursor(topic, partition, offset, 1).await?;
            Ok::<_, BusError>(record.first().is_none_or(|r| r.timestamp_ms >= timestamp_ms))
        };
        let hint_ok = (hint == range.end || at_or_after(hint).await?)
            && (hint == range.start || !at_or_after(hint - 1).await?);
        if hint_ok {
            return Ok(hint);
        }
        let (mut low, mut high) = (range.start, range.end);
        while low < high {
            let middle = low + (high - low) / 2;
            if at_or_after(middle).await? {
                high = middle;
            } else {
                low = middle + 1;
            }
        }
        Ok(low)
    }

    async fn commit(&self, group: &str, topic: &str, offsets: &[(u32, u64)]) -> Result<()> {
        let config = self.existing(topic).await?;
        let name = self.name(topic);
        let mut list = Vec::with_capacity(offsets.len());
        for &(partition, offset) in offsets {
            if partition >= config.partitions {
                return Err(BusError::UnknownPartition { topic: topic.to_owned(), partition });
            }
            list.push((name.as_str(), partition as i32, i64::try_from(offset).unwrap_or(i64::MAX)));
        }
        if offsets.is_empty() {
            return Ok(());
        }
        self.inner.groups.commit(&self.name(group), &list, REQUEST_TIMEOUT).await.map_err(backend)
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<BTreeMap<u32, u64>> {
        let Some(config) = self.config_of(topic).await? else { return Ok(BTreeMap::new()) };
        let partitions = (0..config.partitions).map(|partition| partition as i32);
        let found = self
            .inner
            .groups
            .committed(&self.name(group), &self.name(topic), partitions, REQUEST_TIMEOUT)
            .await
            .map_err(backend)?;
        Ok(found
            .into_iter()
            .filter_map(|(partition, offset)| {
                Some((u32::try_from(partition).ok()?, u64::try_from(offset).ok()?))
            })
            .collect())
    }

    async fn delete_group(&self, group: &str) -> Result<()> {
        let name = self.name(group);
        // Sent to the group's coordinator: librdkafka keeps it as long as a commit (see
        // `groups`), and this call stops waiting after its own timeout.
        let options = AdminOptions::new().request_timeout(Some(groups::LIBRDKAFKA_PATIENCE));
        let deleted = self.inner.admin.delete_groups(&[&name], &options);
        let results = tokio::time::timeout(REQUEST_TIMEOUT, deleted)
            .await
            .map_err(|_| backend(KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut)))?
            .map_err(backend)?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::GroupIdNotFound)) => {}
                Err((_, code)) => return Err(backend(KafkaError::AdminOp(code))),
            }
        }
        Ok(())
    }

    async fn enforce_retention(&self) -> Result<u64> {
        // The brokers apply each topic's retention.ms / retention.bytes themselves.
        Ok(0)
    }

    fn watch(&self, topic: &str) -> AppendWatch {
        let follow = tails::Follow {
            topic: self.name(topic),
            readers_topic: topic.to_owned(),
            partitions: self.cached(topic).map(|config| config.partitions),
            shared: !self.inner.readers.is_own(topic),
        };
        self.inner.tails.watch(follow, &self.inner.readers, &self.inner.tail_clients)
    }

    async fn release_topic(&self, topic: &str) {
        let (readers, tails) = (self.inner.readers.clone(), self.inner.tails.clone());
        let (topic_name, name) = (topic.to_owned(), self.name(topic));
        // Which tail follows it now (after this, its own would).
        let shared = !readers.is_own(topic);
        let released = (self.inner.blocking)
            .run(move || {
                readers.forget(&topic_name);
                tails.stop(&name, shared);
                Ok(())
            })
            .await;
        if released.is_err() {
            tracing::warn!(%topic, "releasing a topic failed");
        }
    }

    fn open_topics(&self) -> Vec<String> {
        let prefixed = self.name("");
        let mut topics = self.inner.readers.topics();
        topics.extend(
            self.inner
                .tails
                .running()
                .into_iter()
                .filter_map(|name| name.strip_prefix(&prefixed).map(str::to_owned)),
        );
        topics.sort_unstable();
        topics.dedup();
        topics
    }

    fn client_access(&self, topic: &str) -> Option<ClientAccess> {
        let settings = &self.inner.settings;
        Some(ClientAccess {
            bootstrap_servers: settings.bootstrap_servers.clone(),
            topic: self.name(topic),
            group_id: self.name(&format!("consumer.{topic}")),
            security_protocol: settings.security_protocol().to_owned(),
            sasl_mechanism: settings.client_setting("sasl.mechanism").map(str::to_owned),
            username: settings.consumer_username.clone(),
            password: settings.consumer_password.clone(),
        })
    }

    async fn ready(&self) -> Result<()> {
        let meta = self.inner.meta.clone();
        (self.inner.blocking)
            .run(move || meta.fetch_metadata(None, Duration::from_secs(3)))
            .await
            .map_err(|error| BusError::Unreachable {
                url: self.inner.settings.redacted(),
                reason: error.to_string(),
            })?;
        Ok(())
    }
}

impl KafkaLog {
    /// Appends records (as [`StreamLog::append`]) without taking them. When the producer
    /// died during the append, the records it did not get through are sent once more through
    /// a new one (all of them if one got through after one that failed in the same
    /// partition, so that a partition's order holds).
    async fn append_slice(&self, topic: &str, records: &[NewRecord]) -> Result<Vec<Position>> {
        let config = self.existing(topic).await?;
        let name = self.name(topic);
        let partition_of = |record: &NewRecord| partition_for_key(&record.key, config.partitions);
        let now_ms = self.inner.clock.now().timestamp_millis();
        let producer = self.inner.producer.current();
        let all: Vec<usize> = (0..records.len()).collect();
        let mut sent = send(&producer, &name, records, &all, &partition_of, now_ms).await?;
        let failed: Vec<usize> = (0..records.len()).filter(|&at| sent[at].is_err()).collect();
        let fenced = failed.iter().any(|&at| sent[at].as_ref().is_err_and(is_fenced));
        if !failed.is_empty() && self.inner.producer.replace_if_dead(&producer, fenced) {
            let mut failed_seen: HashMap<u32, bool> = HashMap::new();
            let in_order = records.iter().zip(&sent).all(|(record, result)| {
                let seen = failed_seen.entry(partition_of(record)).or_default();
                *seen |= result.is_err();
                result.is_err() || !*seen
            });
            let again = if in_order { failed } else { all };
            tracing::debug!(
                topic,
                records = again.len(),
                "append failed on a dead producer; sent again"
            );
            let fresh = self.inner.producer.current();
            let resent = send(&fresh, &name, records, &again, &partition_of, now_ms).await?;
            for (at, result) in again.into_iter().zip(resent) {
                sent[at] = result;
            }
        }
        let mut positions = Vec::with_capacity(records.len());
        for result in sent {
            positions.push(result.map_err(|error| self.produce_error(topic, error))?);
        }
        let mut ends: BTreeMap<u32, u64> = BTreeMap::new();
        for position in &positions {
            let end = ends.entry(position.partition).or_default();
            *end = (*end).max(position.offset + 1);
        }
        for (partition, end) in ends {
            self.inner.readers.learn_end(topic, partition, end);
        }
        self.inner.tails.wake(&name);
        Ok(positions)
    }

    /// A failed produce; a topic deleted behind this process is forgotten.
    fn produce_error(&self, topic: &str, error: KafkaError) -> BusError {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownTopicOrPartition) {
            self.inner.topics.lock().expect("topic cache mutex").remove(topic);
            return BusError::UnknownTopic(topic.to_owned());
        }
        backend(error)
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::producer::Producer as _;

    use super::*;

    #[test]
    fn a_fenced_producer_id_or_epoch_is_a_dead_producer() {
        for fenced in [RDKafkaErrorCode::ProducerFenced, RDKafkaErrorCode::InvalidProducerEpoch] {
            assert!(is_fenced(&KafkaError::MessageProduction(fenced)), "{fenced:?}");
        }
        for other in [RDKafkaErrorCode::QueueFull, RDKafkaErrorCode::MessageTimedOut] {
            assert!(!is_fenced(&KafkaError::MessageProduction(other)), "{other:?}");
        }
    }

    /// librdkafka declares a producer dead (fatal) when the broker fences its producer id; a
    /// busy test broker did, and every later append failed until the process restarted.
    /// `rd_kafka_test_fatal_error` is librdkafka's own way to make one for a test.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(unsafe_code)]
    async fn an_append_after_the_producer_died_goes_through_a_new_producer() {
        let url = std::env::var("SLUICE_TEST_KAFKA_URL")
            .expect("SLUICE_TEST_KAFKA_URL must name a Kafka-API broker; run scripts/test");
        let mut settings = KafkaSettings::parse(&url).unwrap();
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        settings.topic_prefix = format!("fatal{nanos:x}.");
        let clock: Arc<dyn Clock> = Arc::new(sluice_core::clock::SystemClock);
        let log = KafkaLog::connect(settings, clock).await.unwrap();
        let config = TopicConfig { partitions: 1, retention: Retention::default() };
        log.create_topic("base.fatal", config).await.unwrap();
        let one = NewRecord::new("k".to_owned(), "1".to_owned());
        log.append("base.fatal", vec![one]).await.unwrap();
        let dead = log.inner.producer.current();
        let reason = c"fenced by the test";
        // SAFETY: the client pointer is live (`dead` holds the producer) and `reason` is a
        // NUL-terminated string that outlives the call, which copies it.
        let raised = unsafe {
            rdkafka::bindings::rd_kafka_test_fatal_error(
                dead.client().native_ptr(),
                rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_PRODUCER_FENCED,
                reason.as_ptr(),
            )
        };
        assert_eq!(raised, rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
        assert!(dead.client().fatal_error().is_some());
        let two = NewRecord::new("k".to_owned(), "2".to_owned());
        log.append("base.fatal", vec![two]).await.unwrap();
        assert!(!Arc::ptr_eq(&log.inner.producer.current(), &dead), "the dead producer was kept");
        let read = log.read("base.fatal", 0, 0, 10).await.unwrap();
        let values: Vec<&[u8]> = read.iter().map(|record| &record.value[..]).collect();
        assert_eq!(values, [&b"1"[..], &b"2"[..]]);
    }
}
