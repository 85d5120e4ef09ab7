//! Reading partitions from an offset: a pool of cursors, one consumer per partition each,
//! kept where the last read left them.
//!
//! A cursor is a librdkafka consumer assigned to one partition (no group): once placed at an
//! offset, librdkafka keeps fetching ahead in the background, so the next read of the same
//! reader (which asks for the offset the last one ended at) takes what is already fetched.
//! Cursors are found again by the offset they will read next; a read elsewhere places an idle
//! cursor (or a new one) there. `enable.partition.eof` tells when a cursor has fetched to the
//! end, so a read of an empty partition answers without waiting; [`Ends`] remembers each
//! partition's end as appends and fetches learn it, so a read of records appended a moment
//! ago waits for the fetch that brings them instead of answering empty.
//!
//! A cursor unused for [`IDLE_PARK`] is *parked* ([`Readers::sweep`], every second):
//! unassigned, so it fetches nothing. A consumer at the end of its partition otherwise
//! long-polls the broker for as long as it lives (every `fetch.wait.max.ms`), and a node
//! keeps dozens of cursors the archiver reads once a minute (every partition of every chain
//! stream). A cursor in steady use (a worker's, read every round) stays assigned and keeps
//! fetching ahead; a parked one is assigned again where it stopped by its next read, which
//! then waits for a fetch as a new cursor's does.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::Context;
use crate::{Record, Result};

/// Longest wait for records a read knows are there (appended, not yet fetched), or for a new
/// cursor's first fetch: generous, because a new cursor connects first, and a loaded machine
/// or broker can take seconds for that.
const FETCH_WAIT: Duration = Duration::from_secs(30);
/// A cursor unused this long is closed.
const IDLE_CLOSE: Duration = Duration::from_secs(120);
/// A cursor unused this long may be moved to serve another reader.
const IDLE_REUSE: Duration = Duration::from_secs(10);
/// A cursor unused this long stops fetching until its next read.
pub(super) const IDLE_PARK: Duration = Duration::from_secs(2);
/// Most cursors kept per partition.
const MAX_PER_PARTITION: usize = 8;

type PartitionKey = (String, u32);

/// One consumer assigned to one partition.
pub(super) struct Cursor {
    consumer: BaseConsumer<Context>,
    /// The Kafka topic name (with the prefix).
    topic: String,
    partition: u32,
    /// The offset the next record fetched will have, as far as this cursor knows.
    next: u64,
    /// Whether the cursor has fetched everything up to `next`.
    at_end: bool,
    placed: bool,
    /// Whether it has fetched a record since it was placed (then `next` is a known end).
    fetched: bool,
    /// Whether it is unassigned while unused (it fetches nothing meanwhile).
    parked: bool,
    last_used: Instant,
}

impl Cursor {
    pub(super) fn new(consumer: BaseConsumer<Context>, topic: String, partition: u32) -> Self {
        Self {
            consumer,
            topic,
            partition,
            next: 0,
            at_end: false,
            placed: false,
            fetched: false,
            parked: false,
            last_used: Instant::now(),
        }
    }

    /// Unassigns the consumer, keeping where the cursor will read next. Blocks while
    /// librdkafka takes the assignment back.
    fn park(&mut self) {
        match self.consumer.unassign() {
            Ok(()) => self.parked = true,
            // It goes on fetching.
            Err(error) => {
                tracing::debug!(%error, topic = %self.topic, partition = self.partition, "parking a cursor failed");
            }
        }
    }

    /// Up to `max` records from `from` on: every record below `known_end` (the partition's
    /// end as last learnt elsewhere) up to `max`, and whatever else is already fetched.
    /// Blocks while it waits for a fetch (at most [`FETCH_WAIT`]), so run it on a blocking
    /// thread.
    pub(super) fn read(&mut self, from: u64, max: usize, known_end: u64) -> Result<Vec<Record>> {
        if !self.placed || self.next != from || self.parked {
            let mut list = TopicPartitionList::new();
            let offset = Offset::Offset(i64::try_from(from).unwrap_or(i64::MAX));
            list.add_partition_offset(&self.topic, self.partition as i32, offset)
                .map_err(super::backend)?;
            self.consumer.assign(&list).map_err(super::backend)?;
            self.placed = true;
            self.parked = false;
            self.fetched = false;
            self.next = from;
            self.at_end = false;
        }
        let mut records = Vec::new();
        let started = Instant::now();
        while records.len() < max {
            // Wait while records known to be there are not in hand yet, or while the cursor
            // has not fetched at all; otherwise take only what is already fetched.
            let waiting = self.next < known_end || (records.is_empty() && !self.at_end);
            let timeout =
                if waiting { FETCH_WAIT.saturating_sub(started.elapsed()) } else { Duration::ZERO };
            if waiting && timeout.is_zero() {
                break;
            }
            match self.consumer.poll(timeout) {
                None => {
                    if !waiting {
                        break;
                    }
                }
                Some(Ok(message)) => {
                    let offset = u64::try_from(message.offset()).unwrap_or(0);
                    if offset < from {
                        // Asked past the end: the consumer went back to the earliest
                        // record. Nothing is there yet.
                        self.placed = false;
                        return Ok(Vec::new());
                    }
                    records.push(Record {
                        partition: self.partition,
                        offset,
                        timestamp_ms: message.timestamp().to_millis().unwrap_or(0),
                        key: bytes::Bytes::copy_from_slice(message.key().unwrap_or_default()),
                        value: bytes::Bytes::copy_from_slice(message.payload().unwrap_or_default()),
                    });
                    self.next = offset + 1;
                    self.fetched = true;
                    self.at_end = false;
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {
                    self.at_end = true;
                    // Done, unless records known to be there are still being fetched.
                    if self.next >= known_end {
                        break;
                    }
                }
                Some(Err(error)) => {
                    self.placed = false;
                    if records.is_empty() {
                        return Err(super::backend(error));
                    }
                    break;
                }
            }
        }
        self.last_used = Instant::now();
        Ok(records)
    }

    /// Makes the next read place the cursor again, fetching afresh instead of trusting
    /// what it fetched before (and whether that was the end).
    pub(super) fn replace(&mut self) {
        self.placed = false;
    }

    /// The end this cursor saw, when it has fetched to it.
    pub(super) fn end_seen(&self) -> Option<u64> {
        self.at_end.then_some(self.next)
    }
}

/// Idle cursors by partition, and each partition's end as last learnt.
#[derive(Default)]
pub(super) struct Readers {
    idle: Mutex<HashMap<PartitionKey, Vec<Cursor>>>,
    ends: Mutex<HashMap<PartitionKey, u64>>,
}

impl Readers {
    /// A cursor of the partition that will read `from` next, when one is idle; else an idle
    /// one to move, when one has been unused a while and the partition has its fill.
    pub(super) fn take(&self, topic: &str, partition: u32, from: u64) -> Option<Cursor> {
        let mut idle = self.idle.lock().expect("reader pool mutex is never poisoned");
        let cursors = idle.get_mut(&(topic.to_owned(), partition))?;
        let at = cursors.iter().position(|c| c.placed && c.next == from).or_else(|| {
            let oldest = (0..cursors.len()).min_by_key(|&i| cursors[i].last_used)?;
            let movable = cursors.len() >= MAX_PER_PARTITION
                || cursors[oldest].last_used.elapsed() >= IDLE_REUSE;
            movable.then_some(oldest)
        });
        at.map(|at| cursors.swap_remove(at))
    }

    /// Returns a cursor to the pool after a read.
    pub(super) fn put(&self, topic: &str, cursor: Cursor) {
        // What a cursor read is there: the end is at least past it (appends made by other
        // processes are learnt only this way).
        let read_to = if cursor.placed && cursor.fetched { cursor.next } else { 0 };
        let end = cursor.end_seen().unwrap_or(read_to);
        self.learn_end(topic, cursor.partition, end);
        let mut idle = self.idle.lock().expect("reader pool mutex is never poisoned");
        let cursors = idle.entry((topic.to_owned(), cursor.partition)).or_default();
        if cursors.len() < MAX_PER_PARTITION {
            cursors.push(cursor);
            return;
        }
        // Closed outside the lock: closing a consumer can wait for its fetch in flight.
        drop(idle);
        drop(cursor);
    }

    /// Parks the pooled cursors unused for [`IDLE_PARK`] and closes those unused for
    /// [`IDLE_CLOSE`] (outside the pool's lock: closing a consumer can wait for its fetch in
    /// flight). Blocks while librdkafka takes assignments back: run it on a blocking
    /// thread. A cursor being parked is out of the pool meanwhile (a read then makes another).
    pub(super) fn sweep(&self) {
        let (mut resting, closed) = {
            let mut idle = self.idle.lock().expect("reader pool mutex is never poisoned");
            let (mut resting, mut closed) = (Vec::new(), Vec::new());
            for (key, cursors) in idle.iter_mut() {
                for cursor in std::mem::take(cursors) {
                    let unused = cursor.last_used.elapsed();
                    if unused >= IDLE_CLOSE {
                        closed.push(cursor);
                    } else if unused >= IDLE_PARK && cursor.placed && !cursor.parked {
                        resting.push((key.clone(), cursor));
                    } else {
                        cursors.push(cursor);
                    }
                }
            }
            idle.retain(|_, cursors| !cursors.is_empty());
            (resting, closed)
        };
        drop(closed);
        if resting.is_empty() {
            return;
        }
        for (_, cursor) in &mut resting {
            cursor.park();
        }
        let mut over = Vec::new();
        let mut idle = self.idle.lock().expect("reader pool mutex is never poisoned");
        for (key, cursor) in resting {
            let cursors = idle.entry(key).or_default();
            if cursors.len() < MAX_PER_PARTITION {
                cursors.push(cursor);
            } else {
                over.push(cursor);
            }
        }
        drop(idle);
        drop(over);
    }

    /// How many pooled cursors fetch, and how many are parked.
    pub(super) fn counts(&self) -> (usize, usize) {
        let idle = self.idle.lock().expect("reader pool mutex is never poisoned");
        let parked = idle.values().flatten().filter(|c| c.parked).count();
        (idle.values().map(Vec::len).sum::<usize>() - parked, parked)
    }

    /// Records that `partition` of `topic` holds offsets below `end`.
    pub(super) fn learn_end(&self, topic: &str, partition: u32, end: u64) {
        let mut ends = self.ends.lock().expect("ends mutex is never poisoned");
        let known = ends.entry((topic.to_owned(), partition)).or_insert(0);
        *known = (*known).max(end);
    }

    /// The partition's end as last learnt (0 when nothing is known).
    pub(super) fn known_end(&self, topic: &str, partition: u32) -> u64 {
        let ends = self.ends.lock().expect("ends mutex is never poisoned");
        ends.get(&(topic.to_owned(), partition)).copied().unwrap_or(0)
    }

    /// The topics with a cursor in the pool.
    pub(super) fn topics(&self) -> Vec<String> {
        let idle = self.idle.lock().expect("reader pool mutex is never poisoned");
        idle.iter()
            .filter(|(_, cursors)| cursors.iter().any(|c| c.last_used.elapsed() < IDLE_CLOSE))
            .map(|((topic, _), _)| topic.clone())
            .collect()
    }

    /// Forgets a topic (deleted): its cursors close and its ends start again from zero.
    pub(super) fn forget(&self, topic: &str) {
        self.idle
            .lock()
            .expect("reader pool mutex is never poisoned")
            .retain(|(t, _), _| t != topic);
        self.ends.lock().expect("ends mutex is never poisoned").retain(|(t, _), _| t != topic);
    }
}

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readers").finish_non_exhaustive()
    }
}
