//! Shared readers: this node reads each (stream, partition) once, however many deployed
//! pipelines read it, and evaluates the set filters of all those pipelines together.
//!
//! - **Windows per partition.** Each (stream, partition) a worker of this node reads keeps
//!   its last batches read from the log as shared [`Segment`]s, in a few *runs* of
//!   contiguous batches. A worker asking for records inside a run gets a slice of a segment
//!   (nothing is read or copied). A worker at the end of a run — at the stream's tail, or
//!   where other pipelines behind are — reads the next batch from the log under the
//!   partition's lock and adds it to that run, so however many pipelines are at one
//!   position, exactly one of them reads it and the others take it from the run.
//! - **Behind, together.** A worker whose position is in no run (a paused pipeline resumed,
//!   a pipeline deployed while the others drain a backlog, one slower than the rest) starts
//!   a run of its own there; pipelines behind at the same place share it, and it joins the
//!   tail's run when it gets there. While several workers read a stream, one read brings
//!   [`SHARED_READ_BATCHES`] batches, and a worker behind the front of its run takes up to
//!   several batches a round from the window, so the workers of a run close up behind its
//!   front. A run draining a backlog holds back for a moment while another run a little
//!   behind it is catching up ([`Windows::hold`]), so the two become one; holding is
//!   bounded ([`HOLD_BUDGET`] in any [`HOLD_PERIOD`]) and only for a run that is moving, so
//!   a paused, slow or failing pipeline never holds the others back for long, and at the
//!   tail no one waits. A partition keeps at most [`MAX_RUNS`] runs and [`WINDOW_BATCHES`]
//!   batches, dropping the batches least recently read. Offsets, commits and every
//!   lifecycle semantic stay per pipeline: the windows only change where a worker's
//!   records come from.
//! - **Quiet streams cost no polling.** A worker with nothing to read waits for the window
//!   of one of its partitions to grow. One follower task per stream waits for the log's
//!   append watch (and, as a safety net, `idle_wait`) and reads the partitions that have
//!   waiting workers, once for all of them; so a thousand idle pipelines cost one watch per
//!   stream, not a thousand polls.
//! - **Filters evaluated together.** Pipelines whose first transform is a set filter join
//!   their stream's [`FilterGroup`] of that path. The first worker to look at a segment
//!   evaluates the group over it: each record's value is extracted and hashed once
//!   ([`SetFilter::prepare`]), looked up once in the group's [`Candidates`] (value hash →
//!   member sets), and each candidate confirmed by the member's own live set. Every other
//!   member takes its matches from that evaluation. A member that joined after a segment
//!   was evaluated tests its own set against the segment's prepared values.
//!
//! Live filter-value changes stay immediate: a value added reaches the group's candidates
//! under the set's write lock, before the set itself holds it ([`crate::sets::SetObserver`]),
//! and the records appended after the change answered are in segments read, and so
//! evaluated, after it.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use sluice_bus::{BusError, Record, StreamLog};
use sluice_filter::SetFilter;
use tokio::sync::watch;

use crate::sets::SetHandle;

mod groups;

pub(crate) use groups::Membership;
use groups::{Evaluation, FilterGroup};

/// Batches a partition's window keeps (the newest read is kept whatever its size): three
/// shared reads ([`SHARED_READ_BATCHES`]), enough for pipelines a few batches apart to share
/// reads — draining a backlog, a hundred pipelines on two cores drift several batches apart,
/// and with 4 a tenth of their reads fell out of the window (BENCHMARKS.md §19) — few enough
/// that a node reading many streams holds a bounded amount (24,000 records a partition at the
/// default batch size, and at most [`WINDOW_BYTES`]).
const WINDOW_BATCHES: usize = 3 * SHARED_READ_BATCHES;

/// Most bytes of records a partition's window keeps (the newest batch is kept whatever its
/// size): 128 MiB for a busy stream's 8 partitions.
const WINDOW_BYTES: usize = 16 << 20;

/// Runs a partition keeps: the tail's, and a few for the pipelines behind it.
const MAX_RUNS: usize = 4;

/// How far (in batches) a run behind may be for the run ahead of it to hold back, so that
/// the one behind catches up and the two read as one ([`Windows::hold`]).
const HOLD_BATCHES: u64 = 32;

/// A run that received no batch for this long is not catching up (it is paused, slow or
/// failing): no one holds back for it.
const HOLD_ACTIVE: Duration = Duration::from_millis(100);

/// The longest a partition's readers hold back in any [`HOLD_PERIOD`]: a run behind that is
/// slow for its own reasons (a slow sink) costs the others at most a fifth of their time.
const HOLD_BUDGET: Duration = Duration::from_secs(1);
const HOLD_PERIOD: Duration = Duration::from_secs(5);

/// Holding back is counted in wall time, once however many workers wait in it: each
/// worker's look counts the time since the last look of any, up to this much (a gap longer
/// than it means no one was holding in between).
const HOLD_LOOK: Duration = Duration::from_millis(5);

/// Batches one read from the log brings while several workers read the stream: each worker
/// then takes a segment's worth in one step ([`ROUND_BATCHES`] in the worker), so a hundred
/// workers cost a hundred steps per four batches, not per batch.
const SHARED_READ_BATCHES: usize = 4;

/// The shared readers of this node, by stream.
pub(crate) struct SharedReaders {
    log: Arc<dyn StreamLog>,
    /// Records read from the log per batch (the workers' batch size).
    batch_size: usize,
    /// The followers' safety net: how long a quiet stream waits before looking again.
    idle_wait: Duration,
    streams: Mutex<HashMap<String, Weak<SharedStream>>>,
}

impl SharedReaders {
    pub(crate) fn new(log: Arc<dyn StreamLog>, batch_size: usize, idle_wait: Duration) -> Self {
        Self { log, batch_size: batch_size.max(1), idle_wait, streams: Mutex::default() }
    }

    /// The shared reader of `topic`, started on first use and stopped when its last worker
    /// drops it.
    pub(crate) fn stream(&self, topic: &str) -> Arc<SharedStream> {
        let mut streams = self.streams.lock().expect("shared streams lock is never poisoned");
        if let Some(stream) = streams.get(topic).and_then(Weak::upgrade) {
            return stream;
        }
        streams.retain(|_, stream| stream.strong_count() > 0);
        let (arrived, _) = watch::channel(0);
        let stream = Arc::new(SharedStream {
            topic: topic.into(),
            log: self.log.clone(),
            batch_size: self.batch_size,
            partitions: Mutex::default(),
            groups: Mutex::default(),
            arrived,
            workers: AtomicUsize::new(0),
            wakes: AtomicU64::new(0),
        });
        streams.insert(topic.to_owned(), Arc::downgrade(&stream));
        let appended = self.log.watch(topic);
        tokio::spawn(follow(Arc::downgrade(&stream), appended, self.idle_wait));
        stream
    }
}

/// One stream's shared reader: a window per partition, and the filter groups of the
/// pipelines reading it.
pub(crate) struct SharedStream {
    topic: Arc<str>,
    log: Arc<dyn StreamLog>,
    batch_size: usize,
    partitions: Mutex<HashMap<u32, Arc<Partition>>>,
    /// Filter groups by path (the path's debug form).
    groups: Mutex<HashMap<String, Weak<FilterGroup>>>,
    /// Moves each time any partition's window receives a batch: idle workers wait on it.
    arrived: watch::Sender<u64>,
    /// Workers reading this stream now ([`SharedStream::attach`]).
    workers: AtomicUsize,
    /// Moves each time the follower wakes: a worker that read before an append and starts
    /// waiting after the follower handled it (finding no one waiting) sees it moved and
    /// reads again instead of waiting for the next wake.
    wakes: AtomicU64,
}

struct Partition {
    /// Held only for the bookkeeping, never across a read of the log: a worker whose records
    /// the window holds takes them while another reads the log.
    windows: Mutex<Windows>,
    /// Held while reading the log for this partition, so that one worker reads each batch
    /// and the others wait for it (then find it in the window).
    reading: tokio::sync::Mutex<()>,
    /// Batches the window received so far: a worker that saw `n` and found nothing waits
    /// until it moves.
    pushes: AtomicU64,
    /// Workers waiting for this partition's window to grow.
    waiting: AtomicUsize,
}

impl Partition {
    fn windows(&self) -> std::sync::MutexGuard<'_, Windows> {
        self.windows.lock().expect("partition windows lock is never poisoned")
    }

    /// Up to `max` records from `from` when the window holds them (with the batch count
    /// they were found at).
    fn slice(&self, from: u64, max: usize) -> Option<Chunk> {
        let mut windows = self.windows();
        let pushes = self.pushes.load(Ordering::Acquire);
        let (segment, range, more) = windows.slice(from, max)?;
        Some(Chunk { pushes, more, kind: ChunkKind::Shared { segment, range } })
    }
}

/// What a partition keeps of its last reads: a few runs of contiguous batches. The run at
/// the tail serves the pipelines there; a run further back serves the pipelines behind
/// together (deployed later, resumed, slower), so they too read each batch once.
#[derive(Default)]
struct Windows {
    runs: Vec<Run>,
    /// Records and bytes in every run.
    records: usize,
    bytes: usize,
    /// Counts reads, to find the run least recently read.
    reads: u64,
    /// Time spent holding back since `held_since` ([`HOLD_BUDGET`]).
    held: Duration,
    held_since: Option<Instant>,
    /// When a reader last decided to hold back ([`HOLD_LOOK`]).
    held_look: Option<Instant>,
    /// The last read of the log found nothing at this offset, and the follower's wake count
    /// was this when it started ([`SharedStream::wakes`]): until the follower wakes (the log
    /// says something was appended, or `idle_wait` passed), another read there would find
    /// nothing too, so it is not made. On Kafka a read at a partition's end can wait for a
    /// fetch (up to `fetch.wait.max.ms`) under this lock, and a hundred workers each reading
    /// the end once in turn made a drain wait seconds (BENCHMARKS.md §19).
    nothing_at: Option<(u64, u64)>,
}

/// Contiguous batches, oldest first.
struct Run {
    segments: VecDeque<Arc<Segment>>,
    /// Where the next read of this run starts.
    end: u64,
    /// The read count when this run was last read.
    used: u64,
    /// When this run last received a batch (or was made).
    pushed_at: Instant,
    /// Its last read brought all it asked for: the run is draining a backlog.
    full: bool,
}

impl Windows {
    /// The records from `from` on (up to `max`), when a run holds `from`; and whether more
    /// may follow them at once (the run holds more, or its last read was full).
    fn slice(&mut self, from: u64, max: usize) -> Option<(Arc<Segment>, Range<usize>, bool)> {
        self.reads += 1;
        let reads = self.reads;
        let run = self.runs.iter_mut().find(|run| {
            run.segments.front().is_some_and(|first| first.from <= from) && from < run.end
        })?;
        run.used = reads;
        let at = run.segments.iter().position(|segment| from < segment.to)?;
        let segment = &run.segments[at];
        let start = segment.records.partition_point(|record| record.offset < from);
        let end = segment.records.len().min(start.saturating_add(max));
        let more = end < segment.records.len() || at + 1 < run.segments.len() || run.full;
        (start < end).then(|| (segment.clone(), start..end, more))
    }

    /// The run whose next read starts at `from`, made when there is none (the least recently
    /// read run goes when there are [`MAX_RUNS`]).
    fn run_at(&mut self, from: u64) -> usize {
        if let Some(found) = self.runs.iter().position(|run| run.end == from) {
            return found;
        }
        if self.runs.len() >= MAX_RUNS {
            let stalest = self.stalest().expect("MAX_RUNS is above zero");
            self.drop_run(stalest);
        }
        let pushed_at = Instant::now();
        self.runs.push(Run {
            segments: VecDeque::new(),
            end: from,
            used: self.reads,
            pushed_at,
            full: false,
        });
        self.runs.len() - 1
    }

    /// The end of the run furthest on: where the stream's tail was last read.
    fn tail(&self) -> Option<u64> {
        self.runs.iter().map(|run| run.end).max()
    }

    /// Whether a read of the log at `from` should wait: `from` ends a run that is draining a
    /// backlog (its last read was full), and another run, up to [`HOLD_BATCHES`] behind, is
    /// catching up (it received a batch in the last [`HOLD_ACTIVE`]), and this partition has
    /// held back less than [`HOLD_BUDGET`] in this [`HOLD_PERIOD`]. Holding back lets the
    /// run behind (pipelines resumed or deployed a moment later) reach this one, after which
    /// they read each batch once; a tail that is not behind never waits.
    fn hold(&mut self, from: u64, batch_size: usize) -> bool {
        let draining = self.runs.iter().any(|run| run.end == from && run.full);
        if !draining {
            return false;
        }
        let since = *self.held_since.get_or_insert_with(Instant::now);
        if since.elapsed() > HOLD_PERIOD {
            self.held_since = Some(Instant::now());
            self.held = Duration::ZERO;
        }
        if self.held >= HOLD_BUDGET {
            return false;
        }
        let reach = HOLD_BATCHES * batch_size as u64;
        // A run whose end another run holds has caught up: its pipelines read there now.
        let caught_up = |end: u64| {
            self.runs.iter().any(|run| {
                run.segments.front().is_some_and(|first| first.from <= end) && end < run.end
            })
        };
        let hold = self.runs.iter().any(|run| {
            run.end < from
                && from - run.end <= reach
                && run.pushed_at.elapsed() < HOLD_ACTIVE
                && !caught_up(run.end)
        });
        if hold {
            // The several workers at this run's end each look every millisecond while they
            // hold: the time since the last look of any is held time, counted once.
            let now = Instant::now();
            if let Some(last) = self.held_look.replace(now) {
                self.held += now.saturating_duration_since(last).min(HOLD_LOOK);
            }
        }
        hold
    }

    fn stalest(&self) -> Option<usize> {
        (0..self.runs.len()).min_by_key(|&index| self.runs[index].used)
    }

    fn drop_run(&mut self, index: usize) {
        let run = self.runs.swap_remove(index);
        for segment in run.segments {
            self.records -= segment.records.len();
            self.bytes -= segment.bytes;
        }
    }

    /// Adds a batch read at the end of run `index`, then drops the oldest batches of the
    /// least recently read runs while the partition holds more than its share (never the
    /// batch just read). A run whose batches all went stays, empty, as a mark of where its
    /// pipelines read next.
    fn push(&mut self, index: usize, segment: Arc<Segment>, max_records: usize) {
        self.records += segment.records.len();
        self.bytes += segment.bytes;
        let newest = segment.to;
        let run = &mut self.runs[index];
        run.end = newest;
        run.used = self.reads;
        run.pushed_at = Instant::now();
        run.full = segment.full;
        run.segments.push_back(segment);
        while self.records > max_records || self.bytes > WINDOW_BYTES {
            let stalest = (0..self.runs.len())
                .filter(|&at| {
                    let run = &self.runs[at];
                    run.segments.len() > usize::from(run.end == newest)
                })
                .min_by_key(|&at| self.runs[at].used);
            let Some(stalest) = stalest else { break };
            if let Some(oldest) = self.runs[stalest].segments.pop_front() {
                self.records -= oldest.records.len();
                self.bytes -= oldest.bytes;
            }
        }
    }
}

/// One batch read from the log at the tail, shared by every worker that reads it.
pub(crate) struct Segment {
    /// The offset the read started at (records before the first one do not exist).
    from: u64,
    /// The offset after the last record.
    to: u64,
    records: Vec<Record>,
    bytes: usize,
    /// The read brought all it asked for: the log may hold more right after it.
    full: bool,
    /// The oldest append time of the records (they are skipped past the pause hold).
    oldest_ms: i64,
    /// Evaluations of filter groups over the records, by group id.
    evaluations: Mutex<Vec<(u64, Arc<OnceLock<Evaluation>>)>>,
}

impl Segment {
    fn new(from: u64, records: Vec<Record>, asked: usize) -> Self {
        let to = records.last().map_or(from, |record| record.offset + 1);
        let bytes = records.iter().map(|record| record.key.len() + record.value.len()).sum();
        let oldest_ms = records.iter().map(|record| record.timestamp_ms).min().unwrap_or(i64::MAX);
        let full = records.len() >= asked;
        Self { from, to, records, bytes, full, oldest_ms, evaluations: Mutex::default() }
    }

    /// The group's evaluation of this segment, made by the first worker to ask.
    fn evaluation(&self, group: &FilterGroup) -> Arc<OnceLock<Evaluation>> {
        let mut evaluations =
            self.evaluations.lock().expect("segment evaluations lock is never poisoned");
        if let Some((_, found)) = evaluations.iter().find(|(id, _)| *id == group.id) {
            return found.clone();
        }
        let made = Arc::new(OnceLock::new());
        evaluations.push((group.id, made.clone()));
        made
    }
}

/// What a worker read of one partition: a slice of a shared segment, or records it read on
/// its own.
pub(crate) struct Chunk {
    /// The window's batch count when this was read: a worker that found nothing waits
    /// until it moves.
    pushes: u64,
    /// More records may follow at once: a read right after this one is not (as far as the
    /// window knows) at the stream's tail.
    more: bool,
    kind: ChunkKind,
}

enum ChunkKind {
    Shared { segment: Arc<Segment>, range: Range<usize> },
    Own(Vec<Record>),
}

impl Chunk {
    pub(crate) fn records(&self) -> &[Record] {
        match &self.kind {
            ChunkKind::Shared { segment, range } => &segment.records[range.clone()],
            ChunkKind::Own(records) => records,
        }
    }

    /// The window's batch count when this was read.
    pub(crate) fn pushes(&self) -> u64 {
        self.pushes
    }

    /// Whether more records may follow these at once (else the stream's tail is near).
    pub(crate) fn more(&self) -> bool {
        self.more
    }

    /// At most the oldest append time of the records (cheap: a shared segment's, which
    /// may be older than this slice's).
    pub(crate) fn oldest_timestamp_ms(&self) -> i64 {
        match &self.kind {
            ChunkKind::Shared { segment, .. } => segment.oldest_ms,
            ChunkKind::Own(records) => {
                records.iter().map(|record| record.timestamp_ms).min().unwrap_or(i64::MAX)
            }
        }
    }

    /// Which of `records()` pass `membership`'s set filter, as indexes into `records()`, in
    /// order: from the segment's group evaluation when there is one, else by the member's
    /// own set.
    pub(crate) fn passing(&self, membership: &Membership) -> Vec<usize> {
        let ChunkKind::Shared { segment, range } = &self.kind else {
            return membership.test(self.records());
        };
        let evaluation = segment.evaluation(&membership.group);
        let evaluation = evaluation.get_or_init(|| membership.group.evaluate(&segment.records));
        let wanted = range.clone();
        match evaluation.matches_of(membership.member) {
            Some(matches) => {
                let first = matches.partition_point(|&index| (index as usize) < wanted.start);
                matches[first..]
                    .iter()
                    .map(|&index| index as usize)
                    .take_while(|index| *index < wanted.end)
                    .map(|index| index - range.start)
                    .collect()
            }
            // Joined after this segment was evaluated: its own set, over the prepared values.
            None => membership.group.set_of(membership.member).map_or_else(Vec::new, |set| {
                set.with(|values| {
                    wanted
                        .filter(|&index| values.contains_prepared(&evaluation.prepared[index]))
                        .map(|index| index - range.start)
                        .collect()
                })
            }),
        }
    }
}

impl SharedStream {
    fn partition(&self, partition: u32) -> Arc<Partition> {
        let mut partitions =
            self.partitions.lock().expect("shared partitions lock is never poisoned");
        partitions
            .entry(partition)
            .or_insert_with(|| {
                Arc::new(Partition {
                    windows: Mutex::default(),
                    reading: tokio::sync::Mutex::new(()),
                    pushes: AtomicU64::new(0),
                    waiting: AtomicUsize::new(0),
                })
            })
            .clone()
    }

    /// Up to `max` records of `partition` from offset `from`: from the window when `from` is
    /// inside it; else, when `fresh`, read from the log once for everyone (after holding
    /// back a moment for a run catching up, [`Windows::hold`]); else nothing.
    ///
    /// # Errors
    /// A log failure.
    pub(crate) async fn read(
        &self,
        partition: u32,
        from: u64,
        max: usize,
        fresh: bool,
    ) -> Result<Chunk, BusError> {
        let part = self.partition(partition);
        if let Some(chunk) = part.slice(from, max) {
            return Ok(chunk);
        }
        let pushes = part.pushes.load(Ordering::Acquire);
        if !fresh {
            return Ok(Chunk { pushes, more: false, kind: ChunkKind::Own(Vec::new()) });
        }
        let mut reading = part.reading.lock().await;
        let (pushes, wakes) = loop {
            // Read by the worker this one waited for, perhaps.
            if let Some(chunk) = part.slice(from, max) {
                return Ok(chunk);
            }
            let pushes = part.pushes.load(Ordering::Acquire);
            let wakes = self.wakes.load(Ordering::SeqCst);
            let hold = {
                let mut windows = part.windows();
                if windows.nothing_at == Some((from, wakes)) {
                    return Ok(Chunk { pushes, more: false, kind: ChunkKind::Own(Vec::new()) });
                }
                windows.hold(from, self.batch_size)
            };
            if !hold {
                break (pushes, wakes);
            }
            drop(reading);
            tokio::time::sleep(Duration::from_millis(1)).await;
            reading = part.reading.lock().await;
        };
        // At the end of a run (the tail, or where others behind are), or the first here:
        // one read for every worker at this position, under the reading lock. A lone reader
        // needs no batch but the newest, and reads one at a time: keeping more would only
        // hold memory (and make every batch land in fresh pages).
        let shared = self.workers.load(Ordering::Relaxed) > 1;
        let asked = if shared { SHARED_READ_BATCHES * self.batch_size } else { self.batch_size };
        let records = self.log.read(&self.topic, partition, from, asked).await?;
        let (segment, pushes) = {
            let mut windows = part.windows();
            // Nothing yet: the run is marked here all the same, for the follower to read at.
            let run = windows.run_at(from);
            if records.is_empty() {
                windows.nothing_at = Some((from, wakes));
                return Ok(Chunk { pushes, more: false, kind: ChunkKind::Own(Vec::new()) });
            }
            tracing::trace!(
                topic = %self.topic, partition, from, records = records.len(),
                runs = windows.runs.len(), held = ?windows.held, "shared reader: log read"
            );
            let segment = Arc::new(Segment::new(from, records, asked));
            let batches = if shared { WINDOW_BATCHES } else { 1 };
            windows.push(run, segment.clone(), batches * self.batch_size);
            (segment, part.pushes.fetch_add(1, Ordering::AcqRel) + 1)
        };
        drop(reading);
        self.arrived.send_modify(|count| *count += 1);
        let range = 0..segment.records.len().min(max);
        let more = range.end < segment.records.len() || segment.full;
        Ok(Chunk { pushes, more, kind: ChunkKind::Shared { segment, range } })
    }

    /// Counts a worker as reading this stream until the guard drops (windows keep several
    /// batches only while more than one does).
    pub(crate) fn attach(self: &Arc<Self>) -> Attached {
        self.workers.fetch_add(1, Ordering::Relaxed);
        Attached(self.clone())
    }

    /// The follower's wake count: take it before reading, to give [`SharedStream::wait`].
    pub(crate) fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::SeqCst)
    }

    /// Waits until the window of one of `seen`'s partitions received a batch after the
    /// count given (each `(partition, Chunk::pushes)` of a read that found nothing), or the
    /// follower woke since `wakes` (taken before those reads), or `stop` changes.
    pub(crate) async fn wait(
        &self,
        seen: &[(u32, u64)],
        wakes: u64,
        stop: &mut watch::Receiver<bool>,
    ) {
        let parts: Vec<(Arc<Partition>, u64)> =
            seen.iter().map(|&(partition, pushes)| (self.partition(partition), pushes)).collect();
        let _waiting = Waiting::new(&parts);
        let mut arrived = self.arrived.subscribe();
        // Counted as waiting first, then the wake count checked; the follower counts its
        // wake first, then looks for waiting workers: one of the two sees the other.
        if self.wakes.load(Ordering::SeqCst) != wakes {
            return;
        }
        loop {
            let moved =
                parts.iter().any(|(part, pushes)| part.pushes.load(Ordering::Acquire) != *pushes);
            if moved || *stop.borrow() {
                return;
            }
            tokio::select! {
                changed = arrived.changed() => if changed.is_err() { return },
                _ = stop.changed() => return,
            }
        }
    }

    /// Reads the next batch of each partition that has waiting workers (the follower's
    /// round).
    async fn read_for_waiting(&self) {
        let waited: Vec<(u32, Arc<Partition>)> = self
            .partitions
            .lock()
            .expect("shared partitions lock is never poisoned")
            .iter()
            .filter(|(_, part)| part.waiting.load(Ordering::SeqCst) > 0)
            .map(|(partition, part)| (*partition, part.clone()))
            .collect();
        for (partition, part) in waited {
            let Some(end) = part.windows().tail() else { continue };
            if let Err(error) = self.read(partition, end, self.batch_size, true).await {
                tracing::debug!(%error, topic = %self.topic, partition, "shared reader: read failed; the workers retry");
            }
        }
    }

    /// Joins the filter group of `filter`'s path on this stream with the set `set` (one
    /// member per set, however many workers share it).
    pub(crate) fn join(&self, filter: &SetFilter, set: &Arc<SetHandle>) -> Membership {
        let key = format!("{:?}", filter.path());
        let group = {
            let mut groups = self.groups.lock().expect("filter groups lock is never poisoned");
            match groups.get(&key).and_then(Weak::upgrade) {
                Some(group) => group,
                None => {
                    groups.retain(|_, group| group.strong_count() > 0);
                    let group = Arc::new(FilterGroup::new(filter.clone()));
                    groups.insert(key, Arc::downgrade(&group));
                    group
                }
            }
        };
        let member = group.join(set);
        Membership { group, member }
    }
}

/// A worker reading a stream ([`SharedStream::attach`]).
pub(crate) struct Attached(Arc<SharedStream>);

impl Drop for Attached {
    fn drop(&mut self) {
        self.0.workers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a worker as waiting on its partitions while it waits.
struct Waiting<'a>(&'a [(Arc<Partition>, u64)]);

impl<'a> Waiting<'a> {
    fn new(parts: &'a [(Arc<Partition>, u64)]) -> Self {
        for (part, _) in parts {
            part.waiting.fetch_add(1, Ordering::SeqCst);
        }
        Self(parts)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        for (part, _) in self.0 {
            part.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Reads the partitions of a stream that have waiting workers when the log says records
/// were appended, and every `idle_wait` in case a wake-up was missed; stops with the stream.
async fn follow(
    stream: Weak<SharedStream>,
    mut appended: sluice_bus::AppendWatch,
    idle_wait: Duration,
) {
    loop {
        appended.wait(idle_wait).await;
        let Some(stream) = stream.upgrade() else { return };
        stream.wakes.fetch_add(1, Ordering::SeqCst);
        stream.read_for_waiting().await;
    }
}

#[cfg(test)]
mod tests;
