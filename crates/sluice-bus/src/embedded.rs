//! The embedded stream log: one `redb` database file in the data directory.
//!
//! Tables:
//! - `topics`: topic name → its configuration (JSON).
//! - `records/<topic>`: `(partition, offset)` → the encoded record (see `record.rs`).
//! - `partitions`: `(topic, partition)` → next offset, retained bytes, last append time.
//! - `groups`: `(group, topic, partition)` → committed offset.
//!
//! Every write goes through one writer thread that takes all the requests waiting for it,
//! applies them in one write transaction and commits it durably (fsync) once, then answers
//! them all: under load many appends share a commit (group commit), and an append is
//! acknowledged only once it is on disk, so a `kill -9` never loses an acknowledged append.
//! The writer thread alone owns the partitions' bookkeeping; readers use their own read
//! transactions, which never block the writer.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};
use sluice_core::clock::Clock;
use tokio::sync::{oneshot, watch};

use crate::record::{decode, encode, key_of, partition_for_key, set_timestamp, timestamp_of};
use crate::topics::check_name;
use crate::{
    AppendWatch, BusError, NewRecord, OffsetRange, Position, Record, Result, Retention, StreamLog,
    TopicConfig,
};

const TOPICS: TableDefinition<&str, &[u8]> = TableDefinition::new("topics");
const PARTITIONS: TableDefinition<(&str, u32), (u64, u64, i64)> =
    TableDefinition::new("partitions");
const GROUPS: TableDefinition<(&str, &str, u32), u64> = TableDefinition::new("groups");

type RecordsTable<'a> = TableDefinition<'a, (u32, u64), &'static [u8]>;

fn records_table(name: &str) -> RecordsTable<'_> {
    TableDefinition::new(name)
}

fn records_table_name(topic: &str) -> String {
    format!("records/{topic}")
}

/// Most write requests applied in one commit.
const MAX_REQUESTS_PER_COMMIT: usize = 1024;

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
    next_offset: u64,
    bytes: u64,
    last_timestamp_ms: i64,
}

/// A write the writer thread applies inside its transaction. It answers with what to tell
/// its caller once the commit is known, and whether it hit a storage failure (which aborts
/// the whole transaction: it may have written part of its change).
type Job = Box<dyn FnOnce(&mut Writer, &WriteTransaction) -> (Completion, bool) + Send>;

/// Tells a caller its result: given the commit's failure, if any.
type Completion = Box<dyn FnOnce(Option<&str>) + Send>;

/// The state only the writer thread touches.
struct Writer {
    topics: HashMap<String, (StoredTopic, Vec<PartitionState>)>,
    clock: Arc<dyn Clock>,
    /// Topics appended to in the current transaction, to wake their readers after commit.
    touched: Vec<String>,
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
    let txn = db.begin_write().map_err(redb::Error::from)?;
    let mut topics = HashMap::new();
    {
        let table = txn.open_table(TOPICS).map_err(redb::Error::from)?;
        let partitions = txn.open_table(PARTITIONS).map_err(redb::Error::from)?;
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
                    let (next_offset, bytes, last_timestamp_ms) = row.value();
                    *state = PartitionState { next_offset, bytes, last_timestamp_ms };
                }
            }
            topics.insert(name, (stored, states));
        }
    }
    txn.commit().map_err(redb::Error::from)?;
    Ok(topics)
}

fn run_writer(
    db: &Database,
    mut writer: Writer,
    receiver: &std::sync::mpsc::Receiver<Job>,
    watches: &Mutex<HashMap<String, watch::Sender<u64>>>,
) {
    while let Ok(first) = receiver.recv() {
        let mut jobs = vec![first];
        while jobs.len() < MAX_REQUESTS_PER_COMMIT {
            match receiver.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        // The bookkeeping before this transaction, restored if it does not commit.
        let before = writer.topics.clone();
        let txn = match db.begin_write() {
            Ok(txn) => txn,
            Err(error) => {
                // Dropping the jobs unanswered tells their callers the write did not happen.
                tracing::error!(%error, "stream log cannot begin a write");
                drop(jobs);
                continue;
            }
        };
        let mut completions = Vec::with_capacity(jobs.len());
        let mut storage_failed = false;
        for job in jobs {
            let (completion, failed) = job(&mut writer, &txn);
            storage_failed |= failed;
            completions.push(completion);
        }
        let committed = if storage_failed {
            let _ = txn.abort();
            Err("a write in the same transaction failed on storage; nothing was written".to_owned())
        } else {
            txn.commit().map_err(|error| {
                tracing::error!(%error, "stream log commit failed");
                format!("commit failed: {error}")
            })
        };
        match committed {
            Ok(()) => {
                for completion in completions {
                    completion(None);
                }
                let watches = watches.lock().expect("watch map mutex is never poisoned");
                for topic in writer.touched.drain(..) {
                    if let Some(sender) = watches.get(&topic) {
                        sender.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
            }
            Err(reason) => {
                writer.topics = before;
                writer.touched.clear();
                for completion in completions {
                    completion(Some(&reason));
                }
            }
        }
    }
}

impl Writer {
    fn create_topic(
        &mut self,
        txn: &WriteTransaction,
        topic: &str,
        config: TopicConfig,
    ) -> Result<TopicConfig> {
        if let Some((stored, _)) = self.topics.get(topic) {
            return Ok((*stored).into());
        }
        let stored = StoredTopic::from(config);
        let encoded = serde_json::to_vec(&stored).expect("a topic configuration serializes");
        txn.open_table(TOPICS)
            .map_err(redb::Error::from)?
            .insert(topic, encoded.as_slice())
            .map_err(redb::Error::from)?;
        txn.open_table(records_table(&records_table_name(topic))).map_err(redb::Error::from)?;
        self.topics.insert(
            topic.to_owned(),
            (stored, vec![PartitionState::default(); config.partitions as usize]),
        );
        Ok(config)
    }

    fn delete_topic(&mut self, txn: &WriteTransaction, topic: &str) -> Result<bool> {
        let Some((stored, _)) = self.topics.remove(topic) else { return Ok(false) };
        txn.open_table(TOPICS)
            .map_err(redb::Error::from)?
            .remove(topic)
            .map_err(redb::Error::from)?;
        let mut partitions = txn.open_table(PARTITIONS).map_err(redb::Error::from)?;
        for partition in 0..stored.partitions {
            partitions.remove((topic, partition)).map_err(redb::Error::from)?;
        }
        txn.delete_table(records_table(&records_table_name(topic))).map_err(redb::Error::from)?;
        let mut groups = txn.open_table(GROUPS).map_err(redb::Error::from)?;
        groups.retain(|(_, group_topic, _), _| group_topic != topic).map_err(redb::Error::from)?;
        Ok(true)
    }

    /// Appends records already [`encode`]d by the caller (their time stamp is set here).
    fn append(
        &mut self,
        txn: &WriteTransaction,
        topic: &str,
        records: Vec<Vec<u8>>,
    ) -> Result<Vec<Position>> {
        let now = self.clock.now().timestamp_millis();
        let Some((stored, states)) = self.topics.get_mut(topic) else {
            return Err(BusError::UnknownTopic(topic.to_owned()));
        };
        let mut table =
            txn.open_table(records_table(&records_table_name(topic))).map_err(redb::Error::from)?;
        let mut positions = Vec::with_capacity(records.len());
        let mut touched = vec![false; states.len()];
        for mut encoded in records {
            let partition = partition_for_key(key_of(&encoded), stored.partitions);
            let state = &mut states[partition as usize];
            // Append time never goes back within a partition, so seek by time can bisect.
            let timestamp_ms = now.max(state.last_timestamp_ms);
            set_timestamp(&mut encoded, timestamp_ms);
            table
                .insert((partition, state.next_offset), encoded.as_slice())
                .map_err(redb::Error::from)?;
            positions.push(Position { partition, offset: state.next_offset });
            state.next_offset += 1;
            state.bytes += encoded.len() as u64;
            state.last_timestamp_ms = timestamp_ms;
            touched[partition as usize] = true;
        }
        drop(table);
        let mut partitions = txn.open_table(PARTITIONS).map_err(redb::Error::from)?;
        for (partition, state) in states.iter().enumerate() {
            if touched[partition] {
                partitions
                    .insert(
                        (topic, partition as u32),
                        (state.next_offset, state.bytes, state.last_timestamp_ms),
                    )
                    .map_err(redb::Error::from)?;
            }
        }
        self.touched.push(topic.to_owned());
        Ok(positions)
    }

    /// Stores `group`'s next offsets on `topic`.
    fn commit(
        &self,
        txn: &WriteTransaction,
        group: &str,
        topic: &str,
        offsets: &[(u32, u64)],
    ) -> Result<()> {
        if !self.topics.contains_key(topic) {
            return Err(BusError::UnknownTopic(topic.to_owned()));
        }
        let mut groups = txn.open_table(GROUPS).map_err(redb::Error::from)?;
        for &(partition, offset) in offsets {
            groups.insert((group, topic, partition), offset).map_err(redb::Error::from)?;
        }
        Ok(())
    }

    fn enforce_retention(&mut self, txn: &WriteTransaction) -> Result<u64> {
        let now = self.clock.now().timestamp_millis();
        let mut removed = 0;
        for (topic, (stored, states)) in &mut self.topics {
            let cutoff = now.saturating_sub(i64::try_from(stored.max_age_ms).unwrap_or(i64::MAX));
            let mut table = txn
                .open_table(records_table(&records_table_name(topic)))
                .map_err(redb::Error::from)?;
            let mut partitions = txn.open_table(PARTITIONS).map_err(redb::Error::from)?;
            for (partition, state) in states.iter_mut().enumerate() {
                let partition = partition as u32;
                let mut changed = false;
                loop {
                    let first = table
                        .range((partition, 0)..(partition, u64::MAX))
                        .map_err(redb::Error::from)?
                        .next()
                        .transpose()
                        .map_err(redb::Error::from)?
                        .map(|(key, value)| {
                            (key.value().1, value.value().len() as u64, timestamp_of(value.value()))
                        });
                    let Some((offset, size, timestamp)) = first else { break };
                    let too_old = timestamp.is_some_and(|ts| ts < cutoff);
                    let too_big = stored.max_bytes.is_some_and(|max| state.bytes > max);
                    if !(too_old || too_big) {
                        break;
                    }
                    table.remove((partition, offset)).map_err(redb::Error::from)?;
                    state.bytes = state.bytes.saturating_sub(size);
                    removed += 1;
                    changed = true;
                }
                if changed {
                    partitions
                        .insert(
                            (topic.as_str(), partition),
                            (state.next_offset, state.bytes, state.last_timestamp_ms),
                        )
                        .map_err(redb::Error::from)?;
                }
            }
        }
        Ok(removed)
    }
}

fn first_retained(
    table: &impl ReadableTable<(u32, u64), &'static [u8]>,
    partition: u32,
) -> Result<Option<u64>> {
    Ok(table
        .range((partition, 0)..(partition, u64::MAX))
        .map_err(redb::Error::from)?
        .next()
        .transpose()
        .map_err(redb::Error::from)?
        .map(|(key, _)| key.value().1))
}

fn read_partition_state(db: &Database, topic: &str) -> Result<(StoredTopic, Vec<OffsetRange>)> {
    let txn = db.begin_read().map_err(redb::Error::from)?;
    let topics = txn.open_table(TOPICS).map_err(redb::Error::from)?;
    let stored: StoredTopic = match topics.get(topic).map_err(redb::Error::from)? {
        Some(config) => serde_json::from_slice(config.value())
            .map_err(|e| BusError::Corrupt(format!("topic {topic}: {e}")))?,
        None => return Err(BusError::UnknownTopic(topic.to_owned())),
    };
    let partitions = txn.open_table(PARTITIONS).map_err(redb::Error::from)?;
    let records =
        txn.open_table(records_table(&records_table_name(topic))).map_err(redb::Error::from)?;
    let mut ranges = Vec::with_capacity(stored.partitions as usize);
    for partition in 0..stored.partitions {
        let end = partitions
            .get((topic, partition))
            .map_err(redb::Error::from)?
            .map_or(0, |row| row.value().0);
        let start = first_retained(&records, partition)?.unwrap_or(end);
        ranges.push(OffsetRange { start, end });
    }
    Ok((stored, ranges))
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
            let topics = txn.open_table(TOPICS).map_err(redb::Error::from)?;
            let found = topics.get(name.as_str()).map_err(redb::Error::from)?;
            found
                .map(|config| {
                    serde_json::from_slice::<StoredTopic>(config.value())
                        .map(TopicConfig::from)
                        .map_err(|e| BusError::Corrupt(format!("topic {name}: {e}")))
                })
                .transpose()
        })
        .await
    }

    async fn append(&self, topic: &str, records: Vec<NewRecord>) -> Result<Vec<Position>> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let name = topic.to_owned();
        let encoded = records.iter().map(|r| encode(0, &r.key, &r.value)).collect();
        self.write(move |w, txn| w.append(txn, &name, encoded)).await
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<Record>> {
        let name = topic.to_owned();
        self.read_blocking(move |db| {
            let txn = db.begin_read().map_err(redb::Error::from)?;
            let topics = txn.open_table(TOPICS).map_err(redb::Error::from)?;
            let stored: StoredTopic = match topics.get(name.as_str()).map_err(redb::Error::from)? {
                Some(config) => serde_json::from_slice(config.value())
                    .map_err(|e| BusError::Corrupt(format!("topic {name}: {e}")))?,
                None => return Err(BusError::UnknownTopic(name)),
            };
            if partition >= stored.partitions {
                return Err(BusError::UnknownPartition { topic: name, partition });
            }
            let table = txn
                .open_table(records_table(&records_table_name(&name)))
                .map_err(redb::Error::from)?;
            let mut out = Vec::with_capacity(max.min(4096));
            for entry in
                table.range((partition, from)..(partition, u64::MAX)).map_err(redb::Error::from)?
            {
                if out.len() >= max {
                    break;
                }
                let (key, value) = entry.map_err(redb::Error::from)?;
                let offset = key.value().1;
                let record = decode(partition, offset, value.value()).ok_or_else(|| {
                    BusError::Corrupt(format!("{name}/{partition}@{offset}: bad record encoding"))
                })?;
                out.push(record);
            }
            Ok(out)
        })
        .await
    }

    async fn offsets(&self, topic: &str) -> Result<Vec<OffsetRange>> {
        let name = topic.to_owned();
        self.read_blocking(move |db| read_partition_state(db, &name).map(|(_, ranges)| ranges))
            .await
    }

    async fn offset_for_time(&self, topic: &str, partition: u32, timestamp_ms: i64) -> Result<u64> {
        let name = topic.to_owned();
        self.read_blocking(move |db| {
            let (stored, ranges) = read_partition_state(db, &name)?;
            if partition >= stored.partitions {
                return Err(BusError::UnknownPartition { topic: name, partition });
            }
            let OffsetRange { start, end } = ranges[partition as usize];
            let txn = db.begin_read().map_err(redb::Error::from)?;
            let table = txn
                .open_table(records_table(&records_table_name(&name)))
                .map_err(redb::Error::from)?;
            // Offsets are dense between start and end, and append times never decrease, so
            // the first offset at or after the time can be bisected.
            let (mut low, mut high) = (start, end);
            while low < high {
                let middle = low + (high - low) / 2;
                let timestamp = table
                    .get((partition, middle))
                    .map_err(redb::Error::from)?
                    .and_then(|value| timestamp_of(value.value()));
                match timestamp {
                    Some(ts) if ts < timestamp_ms => low = middle + 1,
                    Some(_) => high = middle,
                    // Removed by retention between the two read transactions: it was old.
                    None => low = middle + 1,
                }
            }
            Ok(low)
        })
        .await
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
        let encoded: Vec<(String, Vec<Vec<u8>>)> = appends
            .iter()
            .filter(|(_, records)| !records.is_empty())
            .map(|(topic, records)| {
                let records = records.iter().map(|r| encode(0, &r.key, &r.value)).collect();
                ((*topic).to_owned(), records)
            })
            .collect();
        let (group, source, offsets) = (group.to_owned(), source.to_owned(), offsets.to_vec());
        self.write(move |w, txn| {
            // Every topic is checked before anything is written: a failure other than a
            // storage one would not abort the transaction.
            if let Some((topic, _)) = encoded.iter().find(|(t, _)| !w.topics.contains_key(t)) {
                return Err(BusError::UnknownTopic(topic.clone()));
            }
            w.commit(txn, &group, &source, &offsets)?;
            for (topic, records) in encoded {
                w.append(txn, &topic, records)?;
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
