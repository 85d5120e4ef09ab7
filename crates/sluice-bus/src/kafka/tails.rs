//! Watches: waking readers when a topic receives records, whoever appended them.
//!
//! Appends made through this process wake the topic's watchers at once. For appends made
//! elsewhere (another Sluice node, a user's producer), the first watch of a topic starts a
//! tail: a consumer assigned to the end of every partition of the topic, long-polling the
//! broker (its fetch waits up to `fetch.wait.max.ms` for data), on its own thread. Every
//! record it receives wakes the watchers and tells the readers the partition's new end. The
//! tail stops when the topic's last watch is dropped.

use std::collections::HashMap;
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

/// The watch channels of the topics being watched, by Kafka topic name.
#[derive(Default)]
pub(super) struct Tails {
    channels: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Tails {
    /// Wakes `topic`'s watchers (after an append through this process).
    pub(super) fn wake(&self, topic: &str) {
        let channels = self.channels.lock().expect("tail map mutex is never poisoned");
        if let Some(sender) = channels.get(topic) {
            sender.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// A watch of `topic`; `start_tail` is called with the channel when the topic had no
    /// watch yet, to follow appends made elsewhere.
    pub(super) fn watch(
        &self,
        topic: &str,
        start_tail: impl FnOnce(watch::Sender<u64>),
    ) -> AppendWatch {
        let mut channels = self.channels.lock().expect("tail map mutex is never poisoned");
        if let Some(sender) = channels.get(topic) {
            return AppendWatch::new(sender.subscribe());
        }
        let (sender, receiver) = watch::channel(0);
        channels.insert(topic.to_owned(), sender.clone());
        start_tail(sender);
        AppendWatch::new(receiver)
    }

    /// Forgets `topic`'s channel once its tail stopped (nobody watches).
    fn remove_if_unwatched(&self, topic: &str) -> bool {
        let mut channels = self.channels.lock().expect("tail map mutex is never poisoned");
        match channels.get(topic) {
            Some(sender) if sender.receiver_count() == 0 => {
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

/// Follows the end of `topic`'s `partitions` on a thread of its own until nobody watches.
pub(super) fn spawn(
    consumer: BaseConsumer<Context>,
    topic: String,
    partitions: u32,
    sender: watch::Sender<u64>,
    tails: Arc<Tails>,
    readers: Arc<Readers>,
) {
    let mut list = TopicPartitionList::new();
    for partition in 0..partitions {
        if let Err(error) = list.add_partition_offset(&topic, partition as i32, Offset::End) {
            tracing::warn!(%error, %topic, "cannot follow the topic; its watchers wait for their timeouts");
            return;
        }
    }
    if let Err(error) = consumer.assign(&list) {
        tracing::warn!(%error, %topic, "cannot follow the topic; its watchers wait for their timeouts");
        return;
    }
    let spawned = std::thread::Builder::new().name(format!("tail-{topic}")).spawn(move || {
        loop {
            if sender.receiver_count() == 0 && tails.remove_if_unwatched(&topic) {
                return;
            }
            match consumer.poll(POLL) {
                Some(Ok(message)) => {
                    let end = u64::try_from(message.offset()).unwrap_or(0) + 1;
                    readers.learn_end(&topic, message.partition() as u32, end);
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
    if let Err(error) = spawned {
        tracing::warn!(%error, "cannot start a tail thread; watchers wait for their timeouts");
    }
}
