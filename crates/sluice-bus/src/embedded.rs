//! The embedded stream log: one `redb` database file in the data directory.
//!
//! Tables:
//! - `topics`: topic name → its configuration (JSON).
//! - `batches/<topic>`: `(partition, base offset)` → a record batch (see `batch.rs`): the
//!   records one append put in one partition, up to 256 KiB to an entry, all with the
//!   append's time. Reads copy a batch once and hand out its records as slices.
//! - `partition_state`: `(topic, partition)` → first retained offset, next offset, retained
//!   bytes, last append time. Retention removes whole batches, and moves the first retained
//!   offset inside a batch when `max_bytes` asks for part of one (the rest of that batch
//!   stays stored, unread, until it is all past).
//! - `groups`: `(group, topic, partition)` → committed offset.
//!
//! A database written before batches (one entry per record in `records/<topic>`, bookkeeping
//! in `partitions`) is converted when opened, one topic per transaction.
//!
//! Every write goes through one writer thread that takes all the requests waiting for it,
//! applies them in one write transaction and commits it durably (fsync) once, then answers
//! them all: under load many appends share a commit (group commit), and an append is
//! acknowledged only once it is on disk, so a `kill -9` never loses an acknowledged append.
//! The writer thread alone owns the partitions' bookkeeping; readers use their own read
//! transactions, which never block the writer. The writer is in [`writer`]; a conversion
//! from the layout before batches in [`legacy`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};
use sluice_core::clock::Clock;
use tokio::sync::{oneshot, watch};

use crate::batch;
use crate::topics::check_name;
use crate::{
    AppendWatch, BusError, NewRecord, OffsetRange, Position, Record, Result, Retention, StreamLog,
    TopicConfig,
};

mod legacy;
mod writer;

use self::writer::{Completion, Job, Writer, run_writer};

const TOPICS: TableDefinition<&str, &[u8]> = TableDefinition::new("topics");
/// `(topic, partition)` → `(start, next, bytes, last_timestamp_ms)`.
const PARTITION_STATE: TableDefinition<(&str, u32), (u64, u64, u64, i64)> =
    TableDefinition::new("partition_state");
const GROUPS: TableDefinition<(&str, &str, u32), u64> = TableDefinition::new("groups");

type BatchesTable<'a> = TableDefinition<'a, (u32, u64), &'static [u8]>;

fn batches_table(name: &str) -> BatchesTable<'_> {
    TableDefinition::new(name)
}

fn batches_table_name(topic: &str) -> String {
    format!("batches/{topic}")
}

fn corrupt(topic: &str, partition: u32, base: u64, why: &str) -> BusError {
    BusError::Corrupt(format!("{topic}/{partition} batch at {base}: {why}"))
}

/// A topic's configuration as stored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct StoredTopic {
    partitions: u32,
    max_age_ms: u64,
    max_bytes: Option<u64>,
}

impl From<TopicConfig> for StoredTopic {
    fn from(config: TopicConfig) -> Self {
        Self {
            partitions: config.partitions,
            max_age_ms: u64::try_from(config.retention.max_age.as_millis()).unwrap_or(u64::MAX),
            max_bytes: config.retention.max_bytes,
        }
    }
}

impl From<StoredTopic> for TopicConfig {
    fn from(stored: StoredTopic) -> Self {
        Self {
            partitions: stored.partitions,
            retention: Retention {
                max_age: Duration::from_millis(stored.max_age_ms),
                max_bytes: stored.max_bytes,
            },
        }
    }
}

/// Bookkeeping of one partition, kept by the writer.
#[derive(Debug, Clone, Copy, Default)]
struct PartitionState {
    /// The first retained offset.
    start: u64,
    next_offset: u64,
    bytes: u64,
    last_timestamp_ms: i64,
}

impl PartitionState {
    fn from_row((start, next_offset, bytes, last_timestamp_ms): (u64, u64, u64, i64)) -> Self {
        Self { start, next_offset, bytes, last_timestamp_ms }
    }

    fn row(self) -> (u64, u64, u64, i64) {
        (self.start, self.next_offset, self.bytes, self.last_timestamp_ms)
    }
}

/// The embedded [`StreamLog`].
pub struct EmbeddedLog {
    db: Arc<Database>,
    requests: std::sync::mpsc::Sender<Job>,
    watches: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
    writer: std::thread::JoinHandle<()>,
}

impl std::fmt::Debug for EmbeddedLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedLog").finish_non_exhaustive()
    }
}

/// redb's failures are I/O or storage trouble: worth a retry, never the caller's mistake.
impl From<redb::Error> for BusError {
    fn from(error: redb::Error) -> Self {
        Self::Backend { source: Box::new(error), transient: true }
    }
}

impl EmbeddedLog {
    /// Opens (creating it when missing) the log database at `path`; append times come from
    /// `clock`.
    ///
    /// # Errors
    /// When the file cannot be opened or its contents cannot be read.
    pub fn open(path: &Path, clock: Arc<dyn Clock>) -> Result<Self> {
        let db = Database::create(path).map_err(redb::Error::from)?;
        let topics = load_topics(&db)?;
        let db = Arc::new(db);
        let watches: Arc<Mutex<HashMap<String, watch::Sender<u64>>>> = Arc::default();
        let (requests, receiver) = std::sync::mpsc::channel::<Job>();
        let writer = Writer { topics, clock, touched: Vec::new() };
        let (thread_db, thread_watches) = (db.clone(), watches.clone());
        let writer = std::thread::Builder::new()
            .name("sluice-log-writer".to_owned())
            .spawn(move || run_writer(&thread_db, writer, &receiver, &thread_watches))
            .map_err(|error| BusError::from(redb::Error::Io(error)))?;
        Ok(Self { db, requests, watches, writer })
    }

    /// Finishes the writes under way and closes the database file, so that it can be opened
    /// again (by this process or another).
    pub fn close(self) {
        let Self { db, requests, watches: _, writer } = self;
        drop(requests);
        if writer.join().is_err() {
            tracing::error!("the stream log writer thread panicked");
        }
        drop(db);
    }

    /// Runs `apply` in the writer's next transaction; answers after the commit.
    async fn write<T: Send + 'static>(
        &self,
        apply: impl FnOnce(&mut Writer, &WriteTransaction) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (reply, answer) = oneshot::channel::<Result<T>>();
        let job: Job = Box::new(move |writer, txn| {
            let result = apply(writer, txn);
            let storage_failed = matches!(result, Err(BusError::Backend { .. }));
            let completion: Completion = Box::new(move |commit_failure| {
                let _ = reply.send(match commit_failure {
                    None => result,
                    Some(reason) => Err(BusError::CommitFailed(reason.to_owned())),
                });
            });
            (completion, storage_failed)
        });
        self.requests.send(job).map_err(|_| BusError::Closed)?;
        answer.await.map_err(|_| BusError::WriteNotApplied)?
    }

    /// Runs a read on a blocking thread: redb reads are synchronous.
    async fn read_blocking<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Database) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || read(&db)).await.map_err(|_| BusError::Closed)?
    }
}

fn load_topics(db: &Database) -> Result<HashMap<String, (StoredTopic, Vec<PartitionState>)>> {
    legacy::convert(db)?;
    let txn = db.begin_write().map_err(redb::Error::from)?;
    let mut topics = HashMap::new();
    {
        let table = txn.open_table(TOPICS).map_err(redb::Error::from)?;
        let partitions = txn.open_table(PARTITION_STATE).map_err(redb::Error::from)?;
        txn.open_table(GROUPS).map_err(redb::Error::from)?;
        for entry in table.iter().map_err(redb::Error::from)? {
            let (name, config) = entry.map_err(redb::Error::from)?;
            let name = name.value().to_owned();
            let stored: StoredTopic = serde_json::from_slice(config.value())
                .map_err(|e| BusError::Corrupt(format!("topic {name}: {e}")))?;
            let mut states = vec![PartitionState::default(); stored.partitions as usize];
            for (partition, state) in states.iter_mut().enumerate() {
                if let Some(row) =
                    partitions.get((name.as_str(), partition as u32)).map_err(redb::Error::from)?
                {
                    *state = PartitionState::from_row(row.value());
                }
            }
            topics.insert(name, (stored, states));
        }
    }
    txn.commit().map_err(redb::Error::from)?;
    Ok(topics)
}

/// A partition's bookkeeping as last committed, from the `partition_state` table; `None`
/// when it was never appended to (or the topic does not exist, which the caller tells apart).
fn partition_state(
    table: &impl ReadableTable<(&'static str, u32), (u64, u64, u64, i64)>,
    topic: &str,
    partition: u32,
) -> Result<Option<PartitionState>> {
    let row = table.get((topic, partition)).map_err(redb::Error::from)?;
    Ok(row.map(|row| PartitionState::from_row(row.value())))
}

/// The topic's stored configuration, or [`BusError::UnknownTopic`].
fn stored_topic(txn: &redb::ReadTransaction, topic: &str) -> Result<StoredTopic> {
    let topics = txn.open_table(TOPICS).map_err(redb::Error::from)?;
    let found = topics.get(topic).map_err(redb::Error::from)?;
    let Some(config) = found else { return Err(BusError::UnknownTopic(topic.to_owned())) };
    serde_json::from_slice(config.value())
        .map_err(|e| BusError::Corrupt(format!("topic {topic}: {e}")))
}

/// The state of `partition` of `topic`, checking that both exist.
fn checked_partition_state(
    txn: &redb::ReadTransaction,
    topic: &str,
    partition: u32,
) -> Result<PartitionState> {
    // A partition with a state row exists: the topic's configuration need not be read.
    let table = txn.open_table(PARTITION_STATE).map_err(redb::Error::from)?;
    if let Some(state) = partition_state(&table, topic, partition)? {
        return Ok(state);
    }
    let stored = stored_topic(txn, topic)?;
    if partition >= stored.partitions {
        return Err(BusError::UnknownPartition { topic: topic.to_owned(), partition });
    }
    Ok(PartitionState::default())
}

/// The base offset and header of the stored batch holding `offset`, if any.
fn batch_holding(
    table: &impl ReadableTable<(u32, u64), &'static [u8]>,
    topic: &str,
    partition: u32,
    offset: u64,
) -> Result<Option<(u64, batch::BatchHeader)>> {
    let found = table
        .range((partition, 0)..=(partition, offset))
        .map_err(redb::Error::from)?
        .next_back()
        .transpose()
        .map_err(redb::Error::from)?;
    let Some((key, value)) = found else { return Ok(None) };
    let base = key.value().1;
    let header =
        batch::header(value.value()).map_err(|why| corrupt(topic, partition, base, why))?;
    Ok((offset < base + u64::from(header.count)).then_some((base, header)))
}

fn read_records(
    db: &Database,
    topic: &str,
    partition: u32,
    from: u64,
    max: usize,
) -> Result<Vec<Record>> {
    let txn = db.begin_read().map_err(redb::Error::from)?;
    let state = checked_partition_state(&txn, topic, partition)?;
    let from = from.max(state.start);
    if from >= state.next_offset || max == 0 {
        return Ok(Vec::new());
    }
    let table =
        txn.open_table(batches_table(&batches_table_name(topic))).map_err(redb::Error::from)?;
    let first = batch_holding(&table, topic, partition, from)?.map_or(from, |(base, _)| base);
    let mut out = Vec::with_capacity(max.min((state.next_offset - from) as usize).min(65_536));
    for entry in
        table.range((partition, first)..(partition, u64::MAX)).map_err(redb::Error::from)?
    {
        if out.len() >= max {
            break;
        }
        let (key, value) = entry.map_err(redb::Error::from)?;
        let base = key.value().1;
        // One copy of the batch; its records are slices of it.
        let stored = Bytes::copy_from_slice(value.value());
        batch::read_into(&stored, partition, base, from, max, &mut out)
            .map_err(|why| corrupt(topic, partition, base, why))?;
    }
    Ok(out)
}

fn offset_for_time(db: &Database, topic: &str, partition: u32, timestamp_ms: i64) -> Result<u64> {
    let txn = db.begin_read().map_err(redb::Error::from)?;
    let state = checked_partition_state(&txn, topic, partition)?;
    let table =
        txn.open_table(batches_table(&batches_table_name(topic))).map_err(redb::Error::from)?;
    // Offsets are dense between start and end, a batch's records share its time, and append
    // times never decrease: bisect over batches.
    let (mut low, mut high) = (state.start, state.next_offset);
    while low < high {
        let middle = low + (high - low) / 2;
        match batch_holding(&table, topic, partition, middle)? {
            Some((base, header)) if header.timestamp_ms < timestamp_ms => {
                low = base + u64::from(header.count);
            }
            // Every offset from `low` to the batch's end has a time at or after the one asked.
            Some((base, _)) => high = base.max(low),
            None => return Err(corrupt(topic, partition, middle, "no batch holds this offset")),
        }
    }
    Ok(low)
}

#[async_trait]
impl StreamLog for EmbeddedLog {
    async fn create_topic(&self, topic: &str, config: TopicConfig) -> Result<TopicConfig> {
        check_name(topic)?;
        if config.partitions == 0 || config.partitions > 1024 {
            return Err(BusError::InvalidConfig("a topic has 1 to 1024 partitions"));
        }
        let name = topic.to_owned();
        self.write(move |w, txn| w.create_topic(txn, &name, config)).await
    }

    async fn delete_topic(&self, topic: &str) -> Result<bool> {
        let name = topic.to_owned();
        self.write(move |w, txn| w.delete_topic(txn, &name)).await
    }

    async fn topic(&self, topic: &str) -> Result<Option<TopicConfig>> {
        let name = topic.to_owned();
        self.read_blocking(move |db| {
            let txn = db.begin_read().map_err(redb::Error::from)?;
            match stored_topic(&txn, &name) {
                Ok(stored) => Ok(Some(stored.into())),
                Err(BusError::UnknownTopic(_)) => Ok(None),
                Err(error) => Err(error),
            }
        })
        .await
    }

    async fn append(&self, topic: &str, records: Vec<NewRecord>) -> Result<Vec<Position>> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let name = topic.to_owned();
        self.write(move |w, txn| w.append(txn, &name, &records)).await
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<Record>> {
        let name = topic.to_owned();
        self.read_blocking(move |db| read_records(db, &name, partition, from, max)).await
    }

    async fn offsets(&self, topic: &str) -> Result<Vec<OffsetRange>> {
        let name = topic.to_owned();
        self.read_blocking(move |db| {
            let txn = db.begin_read().map_err(redb::Error::from)?;
            let stored = stored_topic(&txn, &name)?;
            let table = txn.open_table(PARTITION_STATE).map_err(redb::Error::from)?;
            (0..stored.partitions)
                .map(|partition| {
                    let state = partition_state(&table, &name, partition)?.unwrap_or_default();
                    Ok(OffsetRange { start: state.start, end: state.next_offset })
                })
                .collect()
        })
        .await
    }

    async fn offset_for_time(&self, topic: &str, partition: u32, timestamp_ms: i64) -> Result<u64> {
        let name = topic.to_owned();
        self.read_blocking(move |db| offset_for_time(db, &name, partition, timestamp_ms)).await
    }

    async fn commit(&self, group: &str, topic: &str, offsets: &[(u32, u64)]) -> Result<()> {
        let (group, topic, offsets) = (group.to_owned(), topic.to_owned(), offsets.to_vec());
        self.write(move |w, txn| w.commit(txn, &group, &topic, &offsets)).await
    }

    async fn append_and_commit(
        &self,
        appends: &[(&str, &[NewRecord])],
        group: &str,
        source: &str,
        offsets: &[(u32, u64)],
    ) -> Result<()> {
        // Sharing the records' bytes, not copying them: the writer thread needs its own
        // handles.
        let appends: Vec<(String, Vec<NewRecord>)> = crate::non_empty(appends)
            .map(|(topic, records)| (topic.to_owned(), records.to_vec()))
            .collect();
        let (group, source, offsets) = (group.to_owned(), source.to_owned(), offsets.to_vec());
        self.write(move |w, txn| {
            // Every topic is checked before anything is written: a failure other than a
            // storage one would not abort the transaction.
            if let Some((topic, _)) = appends.iter().find(|(t, _)| !w.topics.contains_key(t)) {
                return Err(BusError::UnknownTopic(topic.clone()));
            }
            w.commit(txn, &group, &source, &offsets)?;
            for (topic, records) in &appends {
                w.append(txn, topic, records)?;
            }
            Ok(())
        })
        .await
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<BTreeMap<u32, u64>> {
        let (group, topic) = (group.to_owned(), topic.to_owned());
        self.read_blocking(move |db| {
            let txn = db.begin_read().map_err(redb::Error::from)?;
            let groups = txn.open_table(GROUPS).map_err(redb::Error::from)?;
            let mut out = BTreeMap::new();
            let range =
                (group.as_str(), topic.as_str(), 0)..=(group.as_str(), topic.as_str(), u32::MAX);
            for entry in groups.range(range).map_err(redb::Error::from)? {
                let (key, offset) = entry.map_err(redb::Error::from)?;
                out.insert(key.value().2, offset.value());
            }
            Ok(out)
        })
        .await
    }

    async fn delete_group(&self, group: &str) -> Result<()> {
        let group = group.to_owned();
        self.write(move |_, txn| {
            let mut groups = txn.open_table(GROUPS).map_err(redb::Error::from)?;
            groups.retain(|(g, _, _), _| g != group).map_err(redb::Error::from)?;
            Ok(())
        })
        .await
    }

    async fn enforce_retention(&self) -> Result<u64> {
        self.write(|w, txn| w.enforce_retention(txn)).await
    }

    fn watch(&self, topic: &str) -> AppendWatch {
        let mut watches = self.watches.lock().expect("watch map mutex is never poisoned");
        let sender = watches.entry(topic.to_owned()).or_insert_with(|| watch::channel(0).0);
        AppendWatch::new(sender.subscribe())
    }
}
