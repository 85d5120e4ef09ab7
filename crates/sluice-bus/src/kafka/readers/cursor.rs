//! A cursor: one partition on one lane (or on a client of its own), kept where its last read
//! left it. How it is placed at an offset, parked and read, waiting on its partition queue
//! instead of a thread; the parent module decides which cursor serves which read.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::Notify;

use super::{FETCH_WAIT, Lane, PLACE_TIMEOUT, RECHECK};
use crate::kafka::{Context, backend};
use crate::{BusError, Record, Result};

/// One partition on one lane.
pub(in crate::kafka) struct Cursor {
    pub(super) lane: usize,
    pub(super) generation: u64,
    pub(super) consumer: Arc<BaseConsumer<Context>>,
    pub(super) lane_load: Arc<AtomicUsize>,
    pub(super) queue: PartitionQueue<Context>,
    /// Woken by librdkafka when the partition queue receives something.
    pub(super) wake: Arc<Notify>,
    /// The Kafka topic name (with the prefix).
    pub(super) topic: String,
    pub(super) partition: u32,
    /// The offset the next record fetched will have, as far as this cursor knows.
    pub(super) next: u64,
    /// Whether the cursor has fetched everything up to `next`.
    pub(super) at_end: bool,
    pub(super) placed: bool,
    /// Whether the partition is in the lane's assignment.
    pub(super) assigned: bool,
    /// Whether it has fetched a record since it was placed (then `next` is a known end).
    pub(super) fetched: bool,
    /// Whether it was taken out of the lane's assignment while unused.
    pub(super) parked: bool,
    pub(super) last_used: Instant,
}

/// What one look at a partition queue found.
enum Polled {
    Record(Record),
    End,
    Nothing,
    Failed(KafkaError),
}

impl Cursor {
    pub(super) fn new(
        lane: usize,
        on: &mut Lane,
        topic: &str,
        name: String,
        partition: u32,
    ) -> Result<Self> {
        on.topics.insert(topic.to_owned());
        let topic = name;
        let mut queue =
            on.consumer.split_partition_queue(&topic, partition as i32).ok_or_else(|| {
                BusError::InvalidTopicName { name: topic.clone(), reason: "contains a NUL byte" }
            })?;
        let wake = Arc::new(Notify::new());
        let woken = wake.clone();
        queue.set_nonempty_callback(move || woken.notify_one());
        Ok(Self {
            lane,
            generation: on.generation,
            consumer: on.consumer.clone(),
            lane_load: on.assigned.clone(),
            queue,
            wake,
            topic,
            partition,
            next: 0,
            at_end: false,
            placed: false,
            assigned: false,
            fetched: false,
            parked: false,
            last_used: Instant::now(),
        })
    }

    pub(super) fn list(&self, offset: Option<u64>) -> Result<TopicPartitionList> {
        let mut list = TopicPartitionList::new();
        match offset {
            Some(at) => {
                let at = Offset::Offset(i64::try_from(at).unwrap_or(i64::MAX));
                list.add_partition_offset(&self.topic, self.partition as i32, at)
                    .map_err(backend)?;
            }
            None => {
                list.add_partition(&self.topic, self.partition as i32);
            }
        }
        Ok(list)
    }

    /// Takes the partition out of the lane's assignment. Blocks while librdkafka does.
    pub(super) fn unassign(&mut self) -> Result<()> {
        if !self.assigned {
            return Ok(());
        }
        self.consumer.incremental_unassign(&self.list(None)?).map_err(backend)?;
        self.assigned = false;
        self.lane_load.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// Unassigns the partition, keeping where the cursor will read next. Blocks.
    pub(super) fn park(&mut self) {
        match self.unassign() {
            Ok(()) => self.parked = true,
            // It goes on fetching.
            Err(error) => {
                tracing::debug!(%error, topic = %self.topic, partition = self.partition, "parking a cursor failed");
            }
        }
    }

    /// Closes the cursor: its partition leaves the lane. Blocks.
    pub(super) fn close(mut self) {
        if let Err(error) = self.unassign() {
            tracing::warn!(%error, topic = %self.topic, partition = self.partition, "closing a cursor failed");
        }
    }

    /// Whether a read from `from` must place the cursor first ([`Cursor::place`]).
    pub(in crate::kafka) fn needs_placing(&self, from: u64) -> bool {
        !self.placed || self.next != from || !self.assigned
    }

    /// Makes the cursor fetch from `from`: assigns its partition there, or seeks there when it
    /// is assigned. Blocks while librdkafka does, so run it on a blocking thread.
    pub(in crate::kafka) fn place(&mut self, from: u64) -> Result<()> {
        let list = self.list(Some(from))?;
        let at = Offset::Offset(i64::try_from(from).unwrap_or(i64::MAX));
        let sought = self.assigned
            && self.consumer.seek(&self.topic, self.partition as i32, at, PLACE_TIMEOUT).is_ok();
        if !sought {
            if self.assigned {
                // A seek failed (the partition was between fetch states): assign it afresh.
                self.unassign()?;
            }
            match self.consumer.incremental_assign(&list) {
                Ok(()) => {
                    self.lane_load.fetch_add(1, Ordering::Relaxed);
                }
                // The lane has the partition already (from a cursor lost to a panic, which
                // never gave it back): take it over where it is.
                Err(error) => {
                    if self
                        .consumer
                        .seek(&self.topic, self.partition as i32, at, PLACE_TIMEOUT)
                        .is_err()
                    {
                        return Err(backend(error));
                    }
                }
            }
            self.assigned = true;
        }
        self.placed = true;
        self.parked = false;
        self.fetched = false;
        self.next = from;
        self.at_end = false;
        Ok(())
    }

    /// Takes the next item of the partition queue without waiting.
    fn poll_now(&self) -> Polled {
        match self.queue.poll(Duration::ZERO) {
            None => Polled::Nothing,
            Some(Ok(message)) => Polled::Record(Record {
                partition: self.partition,
                offset: u64::try_from(message.offset()).unwrap_or(0),
                timestamp_ms: message.timestamp().to_millis().unwrap_or(0),
                key: bytes::Bytes::copy_from_slice(message.key().unwrap_or_default()),
                value: bytes::Bytes::copy_from_slice(message.payload().unwrap_or_default()),
            }),
            Some(Err(KafkaError::PartitionEOF(_))) => Polled::End,
            Some(Err(error)) => Polled::Failed(error),
        }
    }

    /// Up to `max` records from `from` on, the cursor placed there: every record below
    /// `known_end` (the partition's end as last learnt elsewhere) up to `max`, and whatever
    /// else is already fetched. Waits (at most [`FETCH_WAIT`]) without holding a thread.
    pub(in crate::kafka) async fn read(
        &mut self,
        from: u64,
        max: usize,
        known_end: u64,
    ) -> Result<Vec<Record>> {
        let mut records = Vec::new();
        let started = Instant::now();
        while records.len() < max {
            // Wait while records known to be there are not in hand yet, or while the cursor
            // has not fetched at all; otherwise take only what is already fetched.
            let waiting = self.next < known_end || (records.is_empty() && !self.at_end);
            match self.poll_now() {
                Polled::Nothing => {
                    let left = FETCH_WAIT.saturating_sub(started.elapsed());
                    if !waiting || left.is_zero() {
                        break;
                    }
                    let _ = tokio::time::timeout(left.min(RECHECK), self.wake.notified()).await;
                }
                Polled::Record(record) => {
                    if record.offset < from {
                        // Asked past the end: the consumer went back to the earliest
                        // record. Nothing is there yet.
                        self.placed = false;
                        return Ok(Vec::new());
                    }
                    self.next = record.offset + 1;
                    self.fetched = true;
                    self.at_end = false;
                    records.push(record);
                }
                Polled::End => {
                    self.at_end = true;
                    // Done, unless records known to be there are still being fetched.
                    if self.next >= known_end {
                        break;
                    }
                }
                Polled::Failed(error) => {
                    self.placed = false;
                    if records.is_empty() {
                        return Err(backend(error));
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
    pub(in crate::kafka) fn replace(&mut self) {
        self.placed = false;
    }

    /// The end this cursor saw, when it has fetched to it.
    pub(in crate::kafka) fn end_seen(&self) -> Option<u64> {
        self.at_end.then_some(self.next)
    }
}
