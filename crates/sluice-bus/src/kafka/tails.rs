//! Watches: waking readers when a topic receives records, whoever appended them.
//!
//! Appends made through this process wake the topic's watchers at once. For appends made
//! elsewhere (another Sluice node, a user's producer), the first watch of a topic has the
//! *tail* follow it: one consumer for every watched topic of the node (a client per topic
//! cost its threads for each), assigned the end of every partition of each, long-polling the
//! broker (its fetch waits up to `fetch.wait.max.ms` for data), on one thread. Every record
//! it receives wakes the topic's watchers and tells the readers the partition's new end. A
//! topic leaves the tail when its last watch is dropped; the thread stays while the log does.
//! A pipeline's own topics (sink, dead letters, script log) are each followed by a tail of
//! their own instead, which ends with its last watch: they are watched only while someone
//! reads them, and a shared client fetching a topic made a moment before crashed on the test
//! broker (see `readers`).
//!
//! A topic released before its deletion ([`Tails::stop`]) leaves the tail with the tail's
//! client: a new one follows the other topics (librdkafka 2.12.1 crashes when a topic it
//! knows is deleted and made again under the same name; see `readers`).

use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use super::Context;
use super::readers::Readers;
use crate::AppendWatch;

/// How long the tail's poll blocks before it looks at its requests (a new watch's topic is
/// followed at most this late, plus the time to find its ends).
const POLL: Duration = Duration::from_millis(100);
/// How often the tail drops the topics nobody watches any more.
const UNWATCHED_EVERY: Duration = Duration::from_secs(1);
/// How long the tail waits for a topic's partitions and their ends when it starts following.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long stopping a topic's tail may wait for the tail thread.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

struct Entry {
    sender: watch::Sender<u64>,
    /// Whether the tail follows the topic (or was asked to).
    followed: bool,
}

/// What the tail thread is asked to do.
enum Request {
    Follow(Follow),
    /// Stop following the topic, then answer.
    Stop {
        topic: String,
        done: mpsc::Sender<()>,
    },
}

/// A topic to follow.
pub(super) struct Follow {
    /// The Kafka topic name.
    pub topic: String,
    /// The topic's name for the readers (without the cluster prefix).
    pub readers_topic: String,
    /// Its partition count, when known.
    pub partitions: Option<u32>,
    /// Whether the shared tail follows it (else a tail of its own).
    pub shared: bool,
}

/// The tail that follows `topic`: "" for the shared one, else the topic's own.
fn tail_of(topic: &str, shared: bool) -> String {
    if shared { String::new() } else { topic.to_owned() }
}

/// Makes the tail's client (`None` when it cannot, which it logs).
pub(super) type MakeTail = Arc<dyn Fn() -> Option<BaseConsumer<Context>> + Send + Sync>;

/// What the tail thread is started with: how to make its client, and the log's metadata
/// client, which looks topics up for it (so that the tail's client never learns of a topic
/// it does not follow: one that does not exist yet, when a watch comes first, crashed it
/// once the topic was made).
pub(super) struct TailClients {
    pub make: MakeTail,
    pub meta: Arc<BaseConsumer<Context>>,
}

/// The watch channels of the topics being watched, by Kafka topic name, and the tail.
#[derive(Default)]
pub(super) struct Tails {
    channels: Mutex<HashMap<String, Entry>>,
    /// Requests to the running tail threads, by [`tail_of`].
    requests: Mutex<HashMap<String, mpsc::Sender<Request>>>,
}

impl Tails {
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.channels.lock().expect("tail map mutex is never poisoned")
    }

    /// Wakes `topic`'s watchers (after an append through this process, or one the tail saw).
    pub(super) fn wake(&self, topic: &str) {
        if let Some(entry) = self.channels().get(topic) {
            entry.sender.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// A watch of `follow.topic`; the tail is asked to follow the topic when it does not, and
    /// started (with the consumer `start` makes) when it is not running.
    pub(super) fn watch(
        self: &Arc<Self>,
        follow: Follow,
        readers: &Arc<Readers>,
        clients: &TailClients,
    ) -> AppendWatch {
        let mut channels = self.channels();
        let entry = channels
            .entry(follow.topic.clone())
            .or_insert_with(|| Entry { sender: watch::channel(0).0, followed: false });
        let receiver = entry.sender.subscribe();
        if !entry.followed {
            let key = tail_of(&follow.topic, follow.shared);
            entry.followed = self.request(key, Request::Follow(follow), readers, clients);
        }
        AppendWatch::new(receiver)
    }

    /// Sends a request to the tail thread, starting it first when `start` is given and it does
    /// not run; false when no tail runs.
    fn request(
        self: &Arc<Self>,
        key: String,
        request: Request,
        readers: &Arc<Readers>,
        clients: &TailClients,
    ) -> bool {
        let mut requests = self.requests.lock().expect("tail request mutex is never poisoned");
        let request = match requests.get(&key) {
            Some(sender) => match sender.send(request) {
                Ok(()) => return true,
                // The thread is gone: start it again.
                Err(mpsc::SendError(request)) => request,
            },
            None => request,
        };
        let Some(consumer) = (clients.make)() else { return false };
        let (sender, receiver) = mpsc::channel();
        let tail = Tail {
            consumer,
            requests: receiver,
            tails: Arc::downgrade(self),
            readers: readers.clone(),
            followed: HashMap::new(),
            known: HashSet::new(),
            make: clients.make.clone(),
            meta: clients.meta.clone(),
            key: key.clone(),
        };
        let spawned =
            std::thread::Builder::new().name("kafka-tail".to_owned()).spawn(move || tail.run());
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot start the tail thread; watchers wait for their timeouts");
            return false;
        }
        let sent = sender.send(request).is_ok();
        requests.insert(key, sender);
        sent
    }

    /// Stops following `topic` (before the topic is deleted) and waits until the tail has
    /// let it go; its watchers stay, woken by appends through this process, and the next
    /// watch follows it again. Blocks: run it on a blocking thread.
    pub(super) fn stop(&self, topic: &str, shared: bool) {
        // Asked even when nobody watches the topic now: the tail's client may have followed
        // it before, and must go before the topic does.
        if let Some(entry) = self.channels().get_mut(topic) {
            entry.followed = false;
        }
        let (done, stopped) = mpsc::channel();
        let sent = {
            let requests = self.requests.lock().expect("tail request mutex is never poisoned");
            requests.get(&tail_of(topic, shared)).is_some_and(|sender| {
                sender.send(Request::Stop { topic: topic.to_owned(), done }).is_ok()
            })
        };
        if sent && stopped.recv_timeout(STOP_TIMEOUT).is_err() {
            tracing::warn!(%topic, "the tail did not let a topic go in time");
        }
    }

    /// The Kafka topics the tail follows now.
    pub(super) fn running(&self) -> Vec<String> {
        self.channels()
            .iter()
            .filter(|(_, entry)| entry.followed)
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

    /// Notes that the tail could not follow `topic` (the next watch asks again).
    fn not_followed(&self, topic: &str) {
        if let Some(entry) = self.channels().get_mut(topic) {
            entry.followed = false;
        }
    }
}

impl std::fmt::Debug for Tails {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tails").finish_non_exhaustive()
    }
}

/// The tail thread's state.
struct Tail {
    consumer: BaseConsumer<Context>,
    requests: mpsc::Receiver<Request>,
    tails: Weak<Tails>,
    readers: Arc<Readers>,
    /// Followed topics: their partition count and their name for the readers.
    followed: HashMap<String, (u32, String)>,
    /// Every topic the client has followed (or looked up), followed now or not.
    known: HashSet<String>,
    make: MakeTail,
    /// Looks topics up (see [`TailClients`]).
    meta: Arc<BaseConsumer<Context>>,
    /// "" for the shared tail, else the one topic it follows.
    key: String,
}

impl Tail {
    /// Follows topics until the log is gone.
    fn run(mut self) {
        let mut swept = Instant::now();
        loop {
            loop {
                match self.requests.try_recv() {
                    // A topic's own tail ends with its topic (its client first).
                    Ok(Request::Stop { done, .. }) if !self.key.is_empty() => {
                        self.retire_now();
                        drop(self);
                        let _ = done.send(());
                        return;
                    }
                    Ok(request) => self.serve(request),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            }
            if !self.key.is_empty() && self.followed.is_empty() && self.retire() {
                return;
            }
            let Some(tails) = self.tails.upgrade() else { return };
            if swept.elapsed() >= UNWATCHED_EVERY {
                swept = Instant::now();
                let unwatched: Vec<String> = self
                    .followed
                    .keys()
                    .filter(|topic| tails.remove_if_unwatched(topic))
                    .cloned()
                    .collect();
                for topic in unwatched {
                    self.leave(&topic);
                }
            }
            if self.followed.is_empty() {
                drop(tails);
                // Nothing to fetch: wait for a request.
                match self.requests.recv_timeout(UNWATCHED_EVERY) {
                    Ok(request) => self.serve(request),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
                continue;
            }
            match self.consumer.poll(POLL) {
                Some(Ok(message)) => {
                    let topic = message.topic();
                    if let Some((_, readers_topic)) = self.followed.get(topic) {
                        let end = u64::try_from(message.offset()).unwrap_or(0) + 1;
                        self.readers.learn_end(readers_topic, message.partition() as u32, end);
                        tails.wake(topic);
                    }
                }
                Some(Err(error)) => tracing::debug!(%error, "tail poll failed"),
                None => {}
            }
        }
    }

    /// Ends a topic's own tail: no request reaches it any more (one that came meanwhile is
    /// served, and then it goes on: false).
    fn retire(&mut self) -> bool {
        let Some(tails) = self.tails.upgrade() else { return true };
        let mut requests = tails.requests.lock().expect("tail request mutex is never poisoned");
        match self.requests.try_recv() {
            Ok(request) => {
                drop(requests);
                self.serve(request);
                false
            }
            Err(_) => {
                requests.remove(&self.key);
                true
            }
        }
    }

    /// Ends a topic's own tail at once: no request reaches it any more, and those that came
    /// meanwhile are answered (a follow as not followed, so the next watch asks again).
    fn retire_now(&mut self) {
        let Some(tails) = self.tails.upgrade() else { return };
        let mut requests = tails.requests.lock().expect("tail request mutex is never poisoned");
        requests.remove(&self.key);
        drop(requests);
        while let Ok(request) = self.requests.try_recv() {
            match request {
                Request::Follow(follow) => tails.not_followed(&follow.topic),
                Request::Stop { done, .. } => {
                    let _ = done.send(());
                }
            }
        }
    }

    fn serve(&mut self, request: Request) {
        match request {
            Request::Follow(follow) => {
                if !self.follow(&follow) {
                    if let Some(tails) = self.tails.upgrade() {
                        tails.not_followed(&follow.topic);
                    }
                }
            }
            Request::Stop { topic, done } => {
                self.leave(&topic);
                if self.known.contains(&topic) {
                    self.replace_client();
                }
                let _ = done.send(());
            }
        }
    }

    /// Assigns the end of every partition of the topic; true when followed.
    fn follow(&mut self, follow: &Follow) -> bool {
        let topic = &follow.topic;
        if self.followed.contains_key(topic) {
            return true;
        }
        // Start where each partition ends now (as the broker answers it; an answer that is
        // too low only wakes watchers once more), then wake the watchers once: an append
        // made between the watch and this point is found by their next read.
        let partitions = follow.partitions.or_else(|| {
            let metadata = self.meta.fetch_metadata(Some(topic), START_TIMEOUT).ok()?;
            let found = metadata.topics().iter().find(|t| t.name() == topic)?;
            u32::try_from(found.partitions().len()).ok().filter(|n| *n > 0)
        });
        let Some(partitions) = partitions else {
            tracing::debug!(%topic, "watch of a topic not found: appends of this process only");
            return false;
        };
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions {
            let end = match self.meta.fetch_watermarks(topic, partition as i32, START_TIMEOUT) {
                Ok((_, high)) => Offset::Offset(high),
                Err(_) => Offset::End,
            };
            if list.add_partition_offset(topic, partition as i32, end).is_err() {
                return false;
            }
        }
        self.known.insert(topic.clone());
        if let Err(error) = self.consumer.incremental_assign(&list) {
            tracing::warn!(%error, %topic, "cannot follow the topic; its watchers wait for their timeouts");
            return false;
        }
        self.followed.insert(topic.clone(), (partitions, follow.readers_topic.clone()));
        if let Some(tails) = self.tails.upgrade() {
            tails.wake(topic);
        }
        true
    }

    /// Follows the other topics with a new client, the old one closed (after a topic it
    /// followed is released for deletion).
    fn replace_client(&mut self) {
        let Some(fresh) = (self.make)() else {
            tracing::warn!("cannot replace the tail's client; it keeps a released topic");
            return;
        };
        drop(std::mem::replace(&mut self.consumer, fresh));
        self.known.clear();
        let followed = std::mem::take(&mut self.followed);
        for (topic, (partitions, readers_topic)) in followed {
            let follow =
                Follow { topic, readers_topic, partitions: Some(partitions), shared: true };
            if !self.follow(&follow) {
                if let Some(tails) = self.tails.upgrade() {
                    tails.not_followed(&follow.topic);
                }
            }
        }
    }

    /// Stops following the topic (the client still knows it).
    fn leave(&mut self, topic: &str) {
        let Some((partitions, _)) = self.followed.remove(topic) else { return };
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(topic, partition as i32);
        }
        if let Err(error) = self.consumer.incremental_unassign(&list) {
            tracing::warn!(%error, %topic, "the tail could not let a topic go");
        }
    }
}
