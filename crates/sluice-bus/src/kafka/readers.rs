//! Reading partitions from an offset: cursors kept where the last read left them, all on a
//! fixed few fetching clients (*lanes*).
//!
//! A librdkafka client costs threads (its main thread, one per broker it talks to, one
//! internal), so a client per cursor made a node's threads grow with what it reads: ~1,500 at
//! ~120 deployed pipelines. Instead a node has [`LANES`] consumers (no group); a cursor is one
//! partition assigned to one lane, with the partition's own queue (`split_partition_queue`),
//! so it takes only its partition's records. Once placed at an offset, librdkafka keeps
//! fetching ahead for every partition a lane has (one fetch request per broker for all of
//! them), so the next read of the same reader (which asks for the offset the last one ended
//! at) takes what is already fetched. A lane holds a partition at one position only, so a
//! partition has at most one cursor per lane: a read elsewhere makes the partition's cursor
//! on a free lane, or moves an idle one there, or waits for one in use to come back.
//!
//! Reads do not hold a thread while they wait for a fetch: the partition queue wakes the
//! read when something arrives. `enable.partition.eof` tells when a cursor has fetched to the
//! end, so a read of an empty partition answers without waiting; the partition ends learnt
//! from appends and fetches let a read of records appended a moment ago wait for the fetch
//! that brings them instead of answering empty.
//!
//! A cursor unused for [`IDLE_PARK`] is *parked* ([`Readers::sweep`], every second): its
//! partition is taken out of the lane's assignment, so it fetches nothing. A partition at its
//! end otherwise long-polls the broker (in its lane's fetch, every `fetch.wait.max.ms`), and a
//! node keeps dozens of cursors the archiver reads once a minute. A cursor in steady use (a
//! worker's, read every round) stays assigned and keeps fetching ahead; a parked one is
//! assigned again where it stopped by its next read, which then waits for that fetch.
//!
//! A pipeline's own topics (its sink, dead letters and script log: read on demand, and deleted
//! and made again with the pipeline) are not read through the lanes but through cursors with
//! a client each, as many as [`MAX_PRIVATE`] per partition, closed when unused, so a lane only
//! ever has chain streams: the test broker (tansu) answers a fetch of a topic made a moment
//! before as an unknown topic with a leader hint that crashes librdkafka 2.12.1 (a lookup of
//! a topic without a name in its metadata cache), which a client made for the read did not
//! meet (it connects first).
//!
//! A topic released for deletion in this process is read through clients of its own from
//! then on too ([`Readers::is_own`]): made again under the same name, a fetch of it by a
//! shared client crashed librdkafka the same way (a new client for the read did not).
//!
//! A lane that has read a topic is replaced by a new client when the topic is released
//! before its deletion ([`Readers::forget`]), its cursors closed: librdkafka 2.12.1 corrupts
//! its metadata cache, and crashes, when a topic it knows is deleted and made again under the
//! same name (a pipeline's sink and dead-letter topics are, on teardown and deploy).
//!
//! The lanes, the pool of cursors and parking are one piece of bookkeeping under one lock,
//! here; a cursor's own reading is in [`cursor`].

mod cursor;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;
use tokio::sync::Notify;

pub(super) use self::cursor::Cursor;
use super::Context;
use crate::Result;

/// Fetching clients per node: the most cursors one partition can have, and the clients (with
/// their threads) a node's reads cost, whatever it reads.
pub(super) const LANES: usize = 2;
/// Longest wait for records a read knows are there (appended, not yet fetched), or for a
/// placed cursor's first fetch: generous, because a loaded machine or broker can take seconds.
const FETCH_WAIT: Duration = Duration::from_secs(30);
/// How often a waiting read looks at its queue even when not woken (a wake-up lost to a race
/// with librdkafka costs at most this).
const RECHECK: Duration = Duration::from_millis(100);
/// How long placing a cursor (a seek) may take.
const PLACE_TIMEOUT: Duration = Duration::from_secs(10);
/// A cursor unused this long is closed.
const IDLE_CLOSE: Duration = Duration::from_secs(120);
/// A cursor unused this long may be moved to serve another reader.
const IDLE_REUSE: Duration = Duration::from_secs(10);
/// A cursor unused this long stops fetching until its next read.
pub(super) const IDLE_PARK: Duration = Duration::from_secs(2);
/// Most cursors with a client of their own per partition (of a pipeline's own topic).
const MAX_PRIVATE: usize = 4;
/// The lane number of a cursor with a client of its own.
const PRIVATE: usize = usize::MAX;

/// A partition by its Sluice topic name (without the cluster prefix).
type PartitionKey = (String, u32);

/// One fetching client.
struct Lane {
    consumer: Arc<BaseConsumer<Context>>,
    /// Partitions assigned to it now (a new cursor goes to the least loaded lane).
    assigned: Arc<AtomicUsize>,
    /// Bumped when the client is replaced; cursors of an older one are closed.
    generation: u64,
    /// The topics it has had cursors on (Sluice names).
    topics: HashSet<String>,
}

/// Makes a lane's client.
pub(super) type MakeLane = Box<dyn Fn() -> Result<BaseConsumer<Context>> + Send + Sync>;

/// The cursors of one partition: those idle in the pool, and the lanes whose cursor is out
/// (reading, or being parked or closed).
#[derive(Default)]
struct Slots {
    idle: Vec<Cursor>,
    busy: Vec<usize>,
}

impl Slots {
    fn holds(&self, lane: usize) -> bool {
        self.busy.contains(&lane) || self.idle.iter().any(|c| c.lane == lane)
    }

    /// Marks one cursor of `lane` as back.
    fn unbusy(&mut self, lane: usize) {
        if let Some(at) = self.busy.iter().position(|&l| l == lane) {
            self.busy.swap_remove(at);
        }
    }
}

/// The lanes, their idle cursors by partition, and each partition's end as last learnt.
pub(super) struct Readers {
    /// Locked after `pool` when both are.
    lanes: Mutex<Vec<Lane>>,
    make_lane: MakeLane,
    /// Cursors of replaced lanes that came back from a read, closed by the next sweep.
    stale: Mutex<Vec<Cursor>>,
    /// Shared topics released for deletion in this process, read by own clients since.
    released: Mutex<HashSet<String>>,
    pool: Mutex<HashMap<PartitionKey, Slots>>,
    /// Signalled when a cursor comes back to the pool (a read waiting for one tries again).
    returned: Notify,
    ends: Mutex<HashMap<PartitionKey, u64>>,
}

/// What [`Readers::take`] found.
pub(super) enum Taken {
    Cursor(Cursor),
    /// Every lane's cursor of the partition is out: wait for one to come back.
    Wait,
}

impl Readers {
    /// Readers fetching through [`LANES`] clients `make_lane` makes.
    ///
    /// # Errors
    /// A client could not be made.
    pub(super) fn new(make_lane: MakeLane) -> Result<Self> {
        let mut lanes = Vec::with_capacity(LANES);
        for _ in 0..LANES {
            lanes.push(Lane {
                consumer: Arc::new(make_lane()?),
                assigned: Arc::default(),
                generation: 0,
                topics: HashSet::new(),
            });
        }
        Ok(Self {
            lanes: Mutex::new(lanes),
            make_lane,
            stale: Mutex::default(),
            released: Mutex::default(),
            pool: Mutex::default(),
            returned: Notify::new(),
            ends: Mutex::default(),
        })
    }

    fn lanes(&self) -> std::sync::MutexGuard<'_, Vec<Lane>> {
        self.lanes.lock().expect("reader lanes mutex is never poisoned")
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, HashMap<PartitionKey, Slots>> {
        self.pool.lock().expect("reader pool mutex is never poisoned")
    }

    /// A cursor of `partition` of `topic` (`name` on the cluster) that will read `from` next,
    /// when one is idle; else a new one on a free lane, or an idle one to move (one unused a
    /// while before a new one); waits while every lane's cursor of the partition is out.
    pub(super) async fn cursor(
        &self,
        topic: &str,
        name: &str,
        partition: u32,
        from: u64,
    ) -> Result<Cursor> {
        loop {
            let returned = self.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            if let Taken::Cursor(cursor) = self.take(topic, name, partition, from)? {
                return Ok(cursor);
            }
            returned.await;
        }
    }

    fn take(&self, topic: &str, name: &str, partition: u32, from: u64) -> Result<Taken> {
        let mut pool = self.pool();
        let slots = pool.entry((topic.to_owned(), partition)).or_default();
        let at = slots.idle.iter().position(|c| c.placed && c.next == from);
        if self.is_own(topic) {
            return self.take_private(slots, topic, name, partition, from);
        }
        let mut lanes = self.lanes();
        let free = (0..lanes.len())
            .filter(|&lane| !slots.holds(lane))
            .min_by_key(|&lane| lanes[lane].assigned.load(Ordering::Relaxed));
        let oldest = (0..slots.idle.len()).min_by_key(|&i| slots.idle[i].last_used);
        let movable = oldest.filter(|&i| slots.idle[i].last_used.elapsed() >= IDLE_REUSE);
        let cursor = if let Some(at) = at {
            slots.idle.swap_remove(at)
        } else if let (Some(lane), None) = (free, movable) {
            Cursor::new(lane, &mut lanes[lane], topic, name.to_owned(), partition)?
        } else if let Some(i) = movable.or(oldest) {
            slots.idle.swap_remove(i)
        } else {
            return Ok(Taken::Wait);
        };
        slots.busy.push(cursor.lane);
        Ok(Taken::Cursor(cursor))
    }

    /// Whether `topic` is read (and watched) through clients of its own rather than the shared
    /// ones: a pipeline's own topic, or one released for deletion before (see the module's
    /// notes).
    pub(super) fn is_own(&self, topic: &str) -> bool {
        crate::topics::is_pipeline_topic(topic)
            || self
                .released
                .lock()
                .expect("released topics mutex is never poisoned")
                .contains(topic)
    }

    /// [`Readers::take`] for a topic read through clients of its own.
    fn take_private(
        &self,
        slots: &mut Slots,
        topic: &str,
        name: &str,
        partition: u32,
        from: u64,
    ) -> Result<Taken> {
        let at = slots.idle.iter().position(|c| c.placed && c.next == from);
        let oldest = (0..slots.idle.len()).min_by_key(|&i| slots.idle[i].last_used);
        let full = slots.idle.len() + slots.busy.len() >= MAX_PRIVATE;
        let movable = oldest.filter(|&i| full || slots.idle[i].last_used.elapsed() >= IDLE_REUSE);
        let cursor = if let Some(at) = at {
            slots.idle.swap_remove(at)
        } else if let Some(i) = movable {
            slots.idle.swap_remove(i)
        } else if !full {
            let mut own = Lane {
                consumer: Arc::new((self.make_lane)()?),
                assigned: Arc::default(),
                generation: 0,
                topics: HashSet::new(),
            };
            Cursor::new(PRIVATE, &mut own, topic, name.to_owned(), partition)?
        } else {
            return Ok(Taken::Wait);
        };
        slots.busy.push(cursor.lane);
        Ok(Taken::Cursor(cursor))
    }

    /// Returns a cursor to the pool after a read.
    pub(super) fn put(&self, topic: &str, cursor: Cursor) {
        // What a cursor read is there: the end is at least past it (appends made by other
        // processes are learnt only this way).
        let read_to = if cursor.placed && cursor.fetched { cursor.next } else { 0 };
        let end = cursor.end_seen().unwrap_or(read_to);
        self.learn_end(topic, cursor.partition, end);
        let current = match cursor.lane {
            PRIVATE => cursor.generation,
            lane => self.lanes()[lane].generation,
        };
        if cursor.generation == current {
            self.give_back((topic.to_owned(), cursor.partition), cursor);
        } else {
            // Its lane was replaced while it read: the next sweep closes it.
            self.release(&[((topic.to_owned(), cursor.partition), cursor.lane)]);
            self.stale.lock().expect("stale cursors mutex is never poisoned").push(cursor);
        }
        self.returned.notify_waiters();
    }

    fn give_back(&self, key: PartitionKey, cursor: Cursor) {
        let mut pool = self.pool();
        let slots = pool.entry(key).or_default();
        slots.unbusy(cursor.lane);
        slots.idle.push(cursor);
    }

    /// Releases the lanes of cursors that were closed.
    fn release(&self, closed: &[(PartitionKey, usize)]) {
        let mut pool = self.pool();
        for (key, lane) in closed {
            if let Some(slots) = pool.get_mut(key) {
                slots.unbusy(*lane);
            }
        }
        pool.retain(|_, slots| !slots.idle.is_empty() || !slots.busy.is_empty());
    }

    /// Takes the idle cursors `pick` chooses out of the pool, their lanes kept busy until they
    /// come back.
    fn take_idle(
        &self,
        mut pick: impl FnMut(&PartitionKey, &Cursor) -> bool,
    ) -> Vec<(PartitionKey, Cursor)> {
        let mut pool = self.pool();
        let mut taken = Vec::new();
        for (key, slots) in pool.iter_mut() {
            let mut kept = Vec::with_capacity(slots.idle.len());
            for cursor in std::mem::take(&mut slots.idle) {
                if pick(key, &cursor) {
                    slots.busy.push(cursor.lane);
                    taken.push((key.clone(), cursor));
                } else {
                    kept.push(cursor);
                }
            }
            slots.idle = kept;
        }
        taken
    }

    /// Parks the pooled cursors unused for [`IDLE_PARK`] and closes those unused for
    /// [`IDLE_CLOSE`], outside the pool's lock; serves the lanes' own queues (client errors).
    /// Blocks while librdkafka changes assignments: run it on a blocking thread.
    pub(super) fn sweep(&self) {
        let consumers: Vec<_> = self.lanes().iter().map(|lane| lane.consumer.clone()).collect();
        for consumer in consumers {
            // Only events other than records come here (every partition has its own queue);
            // the context logs them.
            for _ in 0..100 {
                if consumer.poll(Duration::ZERO).is_none() {
                    break;
                }
            }
        }
        let stale =
            std::mem::take(&mut *self.stale.lock().expect("stale cursors mutex is never poisoned"));
        for cursor in stale {
            cursor.close();
        }
        let taken = self.take_idle(|_, cursor| {
            let unused = cursor.last_used.elapsed();
            unused >= IDLE_CLOSE || (unused >= IDLE_PARK && cursor.placed && !cursor.parked)
        });
        if taken.is_empty() {
            return;
        }
        let mut closed = Vec::new();
        for (key, mut cursor) in taken {
            if cursor.last_used.elapsed() >= IDLE_CLOSE {
                closed.push((key, cursor.lane));
                cursor.close();
            } else {
                cursor.park();
                self.give_back(key, cursor);
            }
        }
        self.release(&closed);
        self.returned.notify_waiters();
    }

    /// How many pooled cursors fetch, and how many are parked.
    pub(super) fn counts(&self) -> (usize, usize) {
        let pool = self.pool();
        let idle = || pool.values().flat_map(|slots| &slots.idle);
        let parked = idle().filter(|c| c.parked).count();
        (idle().count() - parked, parked)
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
        let pool = self.pool();
        pool.iter()
            .filter(|(_, slots)| {
                !slots.busy.is_empty()
                    || slots.idle.iter().any(|c| c.last_used.elapsed() < IDLE_CLOSE)
            })
            .map(|((topic, _), _)| topic.clone())
            .collect()
    }

    /// Forgets a topic (about to be deleted): the lanes that read it are replaced by new
    /// clients (see the module's notes), their cursors closed, and the topic's ends start
    /// again from zero. Blocks: run it on a blocking thread.
    pub(super) fn forget(&self, topic: &str) {
        self.released
            .lock()
            .expect("released topics mutex is never poisoned")
            .insert(topic.to_owned());
        // Cursors with clients of their own close with their clients.
        let own = self.take_idle(|(t, _), cursor| t == topic && cursor.lane == PRIVATE);
        let mut closed = Vec::new();
        for (key, cursor) in own {
            closed.push((key, PRIVATE));
            cursor.close();
        }
        self.release(&closed);
        let knew: Vec<usize> = {
            let lanes = self.lanes();
            (0..lanes.len()).filter(|&lane| lanes[lane].topics.contains(topic)).collect()
        };
        let mut replaced = Vec::new();
        for lane in knew {
            let fresh = match (self.make_lane)() {
                Ok(fresh) => fresh,
                Err(error) => {
                    tracing::warn!(%error, %topic, "cannot replace a reader client; it keeps the topic");
                    continue;
                }
            };
            let generation = {
                let mut pool = self.pool();
                let mut lanes = self.lanes();
                let generation = lanes[lane].generation + 1;
                let old_lane = std::mem::replace(
                    &mut lanes[lane],
                    Lane {
                        consumer: Arc::new(fresh),
                        assigned: Arc::default(),
                        generation,
                        topics: HashSet::new(),
                    },
                );
                drop(lanes);
                replaced.push(Arc::downgrade(&old_lane.consumer));
                // Cursors of the old client out of the pool now; those reading come back stale.
                let mut old = Vec::new();
                for slots in pool.values_mut() {
                    let (gone, kept) =
                        std::mem::take(&mut slots.idle).into_iter().partition(|c| c.lane == lane);
                    slots.idle = kept;
                    old.extend(gone);
                }
                pool.retain(|_, slots| !slots.idle.is_empty() || !slots.busy.is_empty());
                drop(pool);
                // Closed (and the old client with the last of them) outside the locks.
                for cursor in old {
                    cursor.close();
                }
                generation
            };
            tracing::debug!(%topic, lane, generation, "replaced a reader client");
        }
        self.returned.notify_waiters();
        // The old clients must be gone before the topic is: wait for the reads still using
        // them to come back, and close their cursors.
        let started = Instant::now();
        loop {
            let stale = std::mem::take(
                &mut *self.stale.lock().expect("stale cursors mutex is never poisoned"),
            );
            for cursor in stale {
                cursor.close();
            }
            if replaced.iter().all(|old| old.strong_count() == 0) {
                break;
            }
            if started.elapsed() >= FETCH_WAIT + PLACE_TIMEOUT {
                tracing::warn!(%topic, "a replaced reader client is still in use; the topic goes anyway");
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.ends.lock().expect("ends mutex is never poisoned").retain(|(t, _), _| t != topic);
    }
}

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readers").finish_non_exhaustive()
    }
}
