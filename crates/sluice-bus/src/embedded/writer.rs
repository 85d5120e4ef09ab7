//! The writer thread: the one owner of the partitions' bookkeeping. It takes every request
//! waiting for it, applies them in one write transaction, commits that durably once, and only
//! then answers them all (group commit; see the parent module).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableTable, WriteTransaction};
use sluice_core::clock::Clock;
use tokio::sync::watch;

use super::{
    GROUPS, PARTITION_STATE, PartitionState, StoredTopic, TOPICS, batches_table,
    batches_table_name, corrupt,
};
use crate::batch;
use crate::record::partition_for_key;
use crate::{BusError, NewRecord, Position, Result, TopicConfig};

/// Most write requests applied in one commit.
const MAX_REQUESTS_PER_COMMIT: usize = 1024;

/// A write the writer thread applies inside its transaction. It answers with what to tell
/// its caller once the commit is known, and whether it hit a storage failure (which aborts
/// the whole transaction: it may have written part of its change).
pub(super) type Job = Box<dyn FnOnce(&mut Writer, &WriteTransaction) -> (Completion, bool) + Send>;

/// Tells a caller its result: given the commit's failure, if any.
pub(super) type Completion = Box<dyn FnOnce(Option<&str>) + Send>;

/// The state only the writer thread touches.
pub(super) struct Writer {
    pub(super) topics: HashMap<String, (StoredTopic, Vec<PartitionState>)>,
    pub(super) clock: Arc<dyn Clock>,
    /// Topics appended to in the current transaction, to wake their readers after commit.
    pub(super) touched: Vec<String>,
}

pub(super) fn run_writer(
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
    pub(super) fn create_topic(
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
        txn.open_table(batches_table(&batches_table_name(topic))).map_err(redb::Error::from)?;
        self.topics.insert(
            topic.to_owned(),
            (stored, vec![PartitionState::default(); config.partitions as usize]),
        );
        Ok(config)
    }

    pub(super) fn delete_topic(&mut self, txn: &WriteTransaction, topic: &str) -> Result<bool> {
        let Some((stored, _)) = self.topics.remove(topic) else { return Ok(false) };
        txn.open_table(TOPICS)
            .map_err(redb::Error::from)?
            .remove(topic)
            .map_err(redb::Error::from)?;
        let mut partitions = txn.open_table(PARTITION_STATE).map_err(redb::Error::from)?;
        for partition in 0..stored.partitions {
            partitions.remove((topic, partition)).map_err(redb::Error::from)?;
        }
        txn.delete_table(batches_table(&batches_table_name(topic))).map_err(redb::Error::from)?;
        let mut groups = txn.open_table(GROUPS).map_err(redb::Error::from)?;
        groups.retain(|(_, group_topic, _), _| group_topic != topic).map_err(redb::Error::from)?;
        Ok(true)
    }

    /// Appends `records`, each to its key's partition: per partition, in batches of up to
    /// [`batch::BATCH_BYTES`] ([`batch::next_batch`]), stamped with one append time.
    pub(super) fn append(
        &mut self,
        txn: &WriteTransaction,
        topic: &str,
        records: &[NewRecord],
    ) -> Result<Vec<Position>> {
        let now = self.clock.now().timestamp_millis();
        let Some((stored, states)) = self.topics.get_mut(topic) else {
            return Err(BusError::UnknownTopic(topic.to_owned()));
        };
        let partition_of: Vec<u32> =
            records.iter().map(|r| partition_for_key(&r.key, stored.partitions)).collect();
        // The records' indexes grouped by partition, each group in append order.
        let mut order: Vec<usize> = (0..records.len()).collect();
        order.sort_by_key(|&i| partition_of[i]);
        let mut positions = vec![Position { partition: 0, offset: 0 }; records.len()];
        let mut table =
            txn.open_table(batches_table(&batches_table_name(topic))).map_err(redb::Error::from)?;
        let mut partitions = txn.open_table(PARTITION_STATE).map_err(redb::Error::from)?;
        for group in order.chunk_by(|&a, &b| partition_of[a] == partition_of[b]) {
            let partition = partition_of[group[0]];
            let state = &mut states[partition as usize];
            // Append time never goes back within a partition, so seek by time can bisect.
            let timestamp_ms = now.max(state.last_timestamp_ms);
            let mut rest = group;
            while !rest.is_empty() {
                let lengths = rest.iter().map(|&i| (records[i].key.len(), records[i].value.len()));
                let (count, size) = batch::next_batch(lengths);
                let (members, after) = rest.split_at(count);
                // Written straight into the database's page: no copy of the batch first.
                let mut stored = table
                    .insert_reserve((partition, state.next_offset), size)
                    .map_err(redb::Error::from)?;
                let parts = members.iter().map(|&i| (&records[i].key[..], &records[i].value[..]));
                batch::write(stored.as_mut(), timestamp_ms, parts);
                for &i in members {
                    let record = &records[i];
                    positions[i] = Position { partition, offset: state.next_offset };
                    state.next_offset += 1;
                    state.bytes += batch::accounted_size(record.key.len(), record.value.len());
                }
                rest = after;
            }
            state.last_timestamp_ms = timestamp_ms;
            partitions.insert((topic, partition), state.row()).map_err(redb::Error::from)?;
        }
        self.touched.push(topic.to_owned());
        Ok(positions)
    }

    /// Stores `group`'s next offsets on `topic`.
    pub(super) fn commit(
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

    /// Removes what is past each topic's retention, oldest first: whole batches older than
    /// `max_age`, then records (moving the partition's start) while it holds more than
    /// `max_bytes`.
    pub(super) fn enforce_retention(&mut self, txn: &WriteTransaction) -> Result<u64> {
        let now = self.clock.now().timestamp_millis();
        let mut removed = 0;
        for (topic, (stored, states)) in &mut self.topics {
            let cutoff = now.saturating_sub(i64::try_from(stored.max_age_ms).unwrap_or(i64::MAX));
            let mut table = txn
                .open_table(batches_table(&batches_table_name(topic)))
                .map_err(redb::Error::from)?;
            let mut partitions = txn.open_table(PARTITION_STATE).map_err(redb::Error::from)?;
            for (partition, state) in states.iter_mut().enumerate() {
                let partition = partition as u32;
                let before = *state;
                loop {
                    let first = table
                        .range((partition, 0)..(partition, u64::MAX))
                        .map_err(redb::Error::from)?
                        .next()
                        .transpose()
                        .map_err(redb::Error::from)?
                        .map(|(key, value)| {
                            let stored = value.value();
                            let sizes = batch::record_sizes(stored);
                            let timestamp = batch::header(stored).map(|h| h.timestamp_ms);
                            (key.value().1, sizes, timestamp)
                        });
                    let Some((base, sizes, timestamp)) = first else { break };
                    let sizes = sizes.map_err(|why| corrupt(topic, partition, base, why))?;
                    let timestamp =
                        timestamp.map_err(|why| corrupt(topic, partition, base, why))?;
                    let end = base + sizes.len() as u64;
                    state.start = state.start.max(base);
                    let live = &sizes[((state.start - base) as usize).min(sizes.len())..];
                    if timestamp < cutoff || end <= state.start {
                        removed += live.len() as u64;
                        state.bytes = state.bytes.saturating_sub(live.iter().sum());
                        state.start = end;
                        table.remove((partition, base)).map_err(redb::Error::from)?;
                        continue;
                    }
                    let Some(max) = stored.max_bytes else { break };
                    for size in live {
                        if state.bytes <= max {
                            break;
                        }
                        state.bytes = state.bytes.saturating_sub(*size);
                        state.start += 1;
                        removed += 1;
                    }
                    if state.start < end {
                        break;
                    }
                    table.remove((partition, base)).map_err(redb::Error::from)?;
                }
                if (state.start, state.bytes) != (before.start, before.bytes) {
                    partitions
                        .insert((topic.as_str(), partition), state.row())
                        .map_err(redb::Error::from)?;
                }
            }
        }
        Ok(removed)
    }
}
