//! Watches: waking readers when a topic receives records, whoever appended them.
//!
//! Appends made through this process wake the topic's watchers at once. For appends made
//! elsewhere (another Sluice node, a user's producer), the first watch of a topic starts a
//! tail: a consumer assigned to the end of every partition of the topic, long-polling the
//! broker (its fetch waits up to `fetch.wait.max.ms` for data), on its own thread. Every
//! record it receives wakes the watchers and tells the readers the partition's new end. The
//! tail stops when the topic's last watch is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use super::Context;
use super::readers::Readers;
use crate::AppendWatch;

/// How long a tail's poll blocks before it checks whether anyone still watches.
const POLL: Duration = Duration::from_millis(500);
/// How long a tail waits for the partitions' ends when it starts.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running tail: its stop flag and its thread.
struct Running {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

struct Entry {
    sender: watch::Sender<u64>,
    tail: Option<Running>,
}

/// The watch channels of the topics being watched, by Kafka topic name.
#[derive(Default)]
pub(super) struct Tails {
    channels: Mutex<HashMap<String, Entry>>,
}

impl Tails {
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.channels.lock().expect("tail map mutex is never poisoned")
    }

    /// Wakes `topic`'s watchers (after an append through this process).
    pub(super) fn wake(&self, topic: &str) {
        if let Some(entry) = self.channels().get(topic) {
            entry.sender.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// A watch of `topic`; `start_tail` is called with the channel and a stop flag when no
    /// tail follows the topic, to follow appends made elsewhere.
    pub(super) fn watch(
        &self,
        topic: &str,
        start_tail: impl FnOnce(
            watch::Sender<u64>,
            Arc<AtomicBool>,
        ) -> Option<std::thread::JoinHandle<()>>,
    ) -> AppendWatch {
        let mut channels = self.channels();
        let entry = channels
            .entry(topic.to_owned())
            .or_insert_with(|| Entry { sender: watch::channel(0).0, tail: None });
        let receiver = entry.sender.subscribe();
        if entry.tail.as_ref().is_none_or(|running| running.thread.is_finished()) {
            let stop = Arc::new(AtomicBool::new(false));
            entry.tail = start_tail(entry.sender.clone(), stop.clone())
                .map(|thread| Running { stop, thread });
        }
        AppendWatch::new(receiver)
    }

    /// Stops `topic`'s tail (before the topic is deleted) and waits for its thread; its
    /// watchers stay, woken by appends through this process, and the next watch starts a
    /// new tail.
    pub(super) fn stop(&self, topic: &str) {
        let running = self.channels().get_mut(topic).and_then(|entry| entry.tail.take());
        if let Some(running) = running {
            running.stop.store(true, Ordering::Relaxed);
            if running.thread.join().is_err() {
                tracing::warn!(%topic, "a tail thread panicked");
            }
        }
    }

    /// The Kafka topics a tail follows now.
    pub(super) fn running(&self) -> Vec<String> {
        self.channels()
            .iter()
            .filter(|(_, entry)| entry.tail.as_ref().is_some_and(|r| !r.thread.is_finished()))
            .map(|(topic, _)| topic.clone())
            .collect()
    }

    /// Forgets `topic`'s channel when nobody watches it any more; true when forgotten.
    fn remove_if_unwatched(&self, topic: &str) -> bool {
        let mut channels = self.channels();
        match channels.get(topic) {
            Some(entry) if entry.sender.receiver_count() == 0 => {
                channels.remove(topic);
                true
            }
            Some(_) => false,
            None => true,
        }
    }
}

impl std::fmt::Debug for Tails {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tails").finish_non_exhaustive()
    }
}

/// Where a tail tells the ends it sees: the log's readers, under the topic's name there
/// (without the cluster's topic prefix).
pub(super) struct EndsTo {
    pub readers: Arc<Readers>,
    pub topic: String,
}

/// Follows the end of `topic`'s `partitions` on a thread of its own until nobody watches or
/// `stop` is set; `None` when the thread could not start.
pub(super) fn spawn(
    consumer: BaseConsumer<Context>,
    topic: String,
    partitions: Option<u32>,
    sender: watch::Sender<u64>,
    stop: Arc<AtomicBool>,
    tails: Arc<Tails>,
    ends: EndsTo,
) -> Option<std::thread::JoinHandle<()>> {
    let spawned = std::thread::Builder::new().name(format!("tail-{topic}")).spawn(move || {
        // Start where each partition ends now (as the broker answers it; an answer that is
        // too low only wakes watchers once more), then wake the watchers once: an append
        // made between the watch and this point is found by their next read.
        let partitions = partitions.or_else(|| {
            let metadata = consumer.fetch_metadata(Some(&topic), START_TIMEOUT).ok()?;
            let found = metadata.topics().iter().find(|t| t.name() == topic)?;
            u32::try_from(found.partitions().len()).ok().filter(|n| *n > 0)
        });
        let Some(partitions) = partitions else {
            tracing::debug!(%topic, "watch of a topic not found: appends of this process only");
            return;
        };
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions {
            let end = match consumer.fetch_watermarks(&topic, partition as i32, START_TIMEOUT) {
                Ok((_, high)) => Offset::Offset(high),
                Err(_) => Offset::End,
            };
            if list.add_partition_offset(&topic, partition as i32, end).is_err() {
                return;
            }
        }
        if let Err(error) = consumer.assign(&list) {
            tracing::warn!(%error, %topic, "cannot follow the topic; its watchers wait for their timeouts");
            return;
        }
        sender.send_modify(|n| *n = n.wrapping_add(1));
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if sender.receiver_count() == 0 && tails.remove_if_unwatched(&topic) {
                return;
            }
            match consumer.poll(POLL) {
                Some(Ok(message)) => {
                    let end = u64::try_from(message.offset()).unwrap_or(0) + 1;
                    ends.readers.learn_end(&ends.topic, message.partition() as u32, end);
                    sender.send_modify(|n| *n = n.wrapping_add(1));
                }
                Some(Err(error)) => {
                    tracing::debug!(%error, %topic, "tail poll failed");
                    std::thread::sleep(POLL);
                }
                None => {}
            }
        }
    });
    match spawned {
        Ok(thread) => Some(thread),
        Err(error) => {
            tracing::warn!(%error, "cannot start a tail thread; watchers wait for their timeouts");
            None
        }
    }
}
