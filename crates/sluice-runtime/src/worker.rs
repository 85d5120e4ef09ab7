//! One worker: reads its share of the source partitions in batches, runs the plan, delivers
//! to the sink and commits the source offsets after the sink acknowledged.
//!
//! A batch is one round over the worker's partitions (up to `batch_size` records of each;
//! several batches' worth when a shared set filter passes few of them, [`ROUND_BATCHES`]).
//! Its sink records and its source offsets are written in one step of the log
//! ([`StreamLog::append_and_commit`]): on the embedded log that is one durable transaction,
//! so a crash leaves both or neither, and a round costs one disk flush. The next round is
//! read while a round is processed and delivered (on a task of its own); it is dropped and
//! read again when the round committed less than it read (a script stage left records for
//! the next batch), or when the worker stops.
//!
//! `at_least_once`: a batch's offsets are committed only with (or after) its records in the
//! sink; a failed write is retried with doubling backoff and the worker reads nothing further
//! meanwhile (the source is held back). A stop during retries leaves the offsets where they
//! were, so the batch is delivered again after the next start. `best_effort`: a failed write
//! drops the batch (counted) and the offsets move on.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sluice_bus::{StreamLog, topics};
use sluice_core::clock::Clock;
use sluice_core::pipeline::DeliveryGuarantee;
use tokio::sync::watch;

use crate::RuntimeSettings;
use crate::delivery::{Delivery, Origin, SideTopics};
use crate::deployment::Counters;
use crate::health::WorkerHealth;
use crate::metrics::{BatchMetrics, PipelineMetrics};
use crate::plan::{BoundPlan, Engines, Item, Outcome};
use crate::readers::{Chunk, Membership, SharedReaders, SharedStream};
use crate::sinks::Settle;

/// Reads a worker's rounds (on a task of its own when reading ahead) through the node's
/// shared reader of the source.
#[derive(Clone)]
struct Reader {
    stream: Arc<SharedStream>,
    batch_size: usize,
}

/// One round's reads: the records of every partition read, in partition order, the offset
/// after each partition's last record (partitions with none are left out), what the
/// partitions with nothing had seen (to wait on), and the reads that failed.
struct Round {
    /// The shared reader's wake count before the reads ([`SharedStream::wakes`]).
    wakes: u64,
    chunks: Vec<(u32, Chunk)>,
    offsets: Vec<(u32, u64)>,
    seen: Vec<(u32, u64)>,
    errors: Vec<(u32, String)>,
}

/// The next round's reads on their own task, cancelled when dropped (the worker stops, or
/// the reads start from the wrong place).
struct ReadAhead(tokio::task::JoinHandle<Round>);

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Round {
    /// A round whose reading task itself failed (it panicked or was cancelled).
    fn failed(error: String) -> Self {
        Self {
            wakes: 0,
            chunks: Vec::new(),
            offsets: Vec::new(),
            seen: Vec::new(),
            errors: vec![(0, error)],
        }
    }
}

/// Most batches of input a set-filter worker takes from a partition in one round, while
/// fewer than a batch of records pass its filter: a pipeline whose filter passes a few
/// records in a thousand then settles (delivers, commits) once per several batches, not
/// once per batch.
const ROUND_BATCHES: usize = 8;

impl Reader {
    /// Up to `batch_size` records of each of `partitions`, from `next`; with `membership`
    /// (the plan starts with the stream's shared set filter), up to [`ROUND_BATCHES`]
    /// batches while fewer than `batch_size` records pass it and more follow at once.
    async fn round(
        &self,
        partitions: &[u32],
        next: &HashMap<u32, u64>,
        membership: Option<&Membership>,
    ) -> Round {
        let mut round = Round {
            wakes: self.stream.wakes(),
            chunks: Vec::with_capacity(partitions.len()),
            offsets: Vec::with_capacity(partitions.len()),
            seen: Vec::new(),
            errors: Vec::new(),
        };
        let most = if membership.is_some() { ROUND_BATCHES } else { 1 } * self.batch_size;
        for &partition in partitions {
            let mut from = next[&partition];
            let (mut taken, mut passed) = (0, 0);
            // A batch at a time, so that what passes stays under two batches a partition.
            while taken < most && passed < self.batch_size {
                let max = self.batch_size.min(most - taken);
                // After the first, only what the window holds: a worker at the front of its
                // run reads one shared batch a round, and the workers behind it catch up.
                let chunk = match self.stream.read(partition, from, max, taken == 0).await {
                    Ok(chunk) => chunk,
                    // Later reads of the round are left for the next one.
                    Err(error) if taken == 0 => {
                        round.errors.push((partition, error.to_string()));
                        break;
                    }
                    Err(_) => break,
                };
                let Some(last) = chunk.records().last().map(|r| r.offset) else {
                    if taken == 0 {
                        round.seen.push((partition, chunk.pushes()));
                    }
                    break;
                };
                taken += chunk.records().len();
                from = last + 1;
                let more = chunk.more();
                if let Some(membership) = membership {
                    passed += chunk.passing(membership).len();
                }
                round.chunks.push((partition, chunk));
                if membership.is_none() || !more {
                    break;
                }
            }
            if taken > 0 {
                round.offsets.push((partition, from));
            }
        }
        round
    }
}

/// The longest `Retry-After` a sink's receiver is obeyed for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

#[derive(Clone)]
pub(crate) struct Worker {
    pub index: usize,
    pub workers: usize,
    pub guarantee: DeliveryGuarantee,
    pub log: Arc<dyn StreamLog>,
    pub clock: Arc<dyn Clock>,
    pub settings: RuntimeSettings,
    pub plan: watch::Receiver<Arc<BoundPlan>>,
    pub stop: watch::Receiver<bool>,
    pub counters: Arc<Counters>,
    pub health: Arc<WorkerHealth>,
    pub metrics: Arc<PipelineMetrics>,
    /// The source's entity, to read records' block times ([`sluice_core::streams::event_time`]).
    pub entity: Arc<str>,
    /// The node's shared readers, through which the source is read.
    pub readers: Arc<SharedReaders>,
}

impl Worker {
    pub(crate) async fn run(mut self) {
        let mut plan = self.plan.borrow_and_update().clone();
        let source = plan.plan.source.clone();
        let group = topics::deployment_group(&plan.plan.pipeline_id);
        let side = SideTopics::new(&plan.plan.pipeline_id);
        // Only for the start: a sink kept past a redeploy that replaced it would keep its
        // state alive (the object-storage sink writes its open files when that goes).
        let first_sink = plan.plan.sinks.first().cloned();
        let Some(mut next) = self.start_offsets(&source, &group, first_sink.as_deref()).await
        else {
            return;
        };
        drop(first_sink);
        let reader =
            Reader { stream: self.readers.stream(&source), batch_size: self.settings.batch_size };
        let _attached = reader.stream.attach();
        // The plan's first set filter, evaluated with the other pipelines on the stream.
        let mut membership = join(&reader.stream, &plan, None);
        // This worker's script runtimes; they move into the blocking task that runs a batch
        // and come back with its outcome.
        let mut engines = Engines::default();
        let mut partitions: Vec<u32> = next.keys().copied().collect();
        partitions.sort_unstable();
        tracing::debug!(config_id = %plan.plan.pipeline_id, worker = self.index, ?next, "worker started");
        // The next round's reads run while this round is processed and delivered (the
        // worker's one sequence of steps would otherwise leave the log idle meanwhile).
        let mut ahead: Option<ReadAhead> = None;
        while !self.stopping() {
            // One batch per round: up to `batch_size` records of each of this worker's
            // partitions (or several batches' worth, see `Reader::round`), delivered and
            // committed together.
            let round = match ahead.take() {
                Some(mut reading) => {
                    (&mut reading.0).await.unwrap_or_else(|error| Round::failed(error.to_string()))
                }
                None => reader.round(&partitions, &next, membership.as_deref()).await,
            };
            for (partition, error) in &round.errors {
                tracing::warn!(%error, %source, partition, "source read failed");
                if !self.pause_for(self.settings.initial_backoff).await {
                    return;
                }
            }
            if round.offsets.is_empty() {
                if round.errors.is_empty() {
                    // Nothing new: wait for the shared reader to bring some (no polling).
                    let mut stop = self.stop.clone();
                    reader.stream.wait(&round.seen, round.wakes, &mut stop).await;
                }
                continue;
            }
            // A new configuration takes over here, between batches: no offset is skipped.
            // Checked after the read, so a record appended after the change was handed over
            // (after a PATCH answered) is never run by the old configuration.
            if self.plan.has_changed().unwrap_or(false) {
                plan = self.plan.borrow_and_update().clone();
                engines.keep_only(&plan);
                membership = join(&reader.stream, &plan, membership);
            }
            let mut after = next.clone();
            after.extend(round.offsets.iter().copied());
            let reading = reader.clone();
            let read_partitions = partitions.clone();
            let read_membership = membership.clone();
            ahead = Some(ReadAhead(tokio::spawn(async move {
                reading.round(&read_partitions, &after, read_membership.as_deref()).await
            })));
            let batch = Batch { chunks: &round.chunks, membership: membership.as_deref() };
            let settled =
                self.process(&plan, batch, &mut engines, &group, &side, &round.offsets).await;
            let Some(committed) = settled else {
                // Stopped while the sink kept failing: offsets stay for the next start.
                return;
            };
            if committed != round.offsets {
                // Records were left for the next batch: read again from them.
                ahead = None;
            }
            next.extend(committed);
            // The other workers' turn first: a worker woken at once by its own read-ahead
            // would otherwise run round after round and leave the pipelines sharing its
            // stream's windows behind them.
            tokio::task::yield_now().await;
        }
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// This worker's partitions and where to read each (committed at deploy), or where the
    /// sink's own positions say, when they are ahead ([`Sink::resume`]; never past the end).
    ///
    /// [`Sink::resume`]: crate::sinks::Sink::resume
    async fn start_offsets(
        &self,
        source: &str,
        group: &str,
        sink: Option<&dyn crate::sinks::Sink>,
    ) -> Option<HashMap<u32, u64>> {
        let mut backoff = self.settings.initial_backoff;
        loop {
            let found = async {
                let topic = self.log.topic(source).await?;
                let committed = self.log.committed(group, source).await?;
                Ok::<_, sluice_bus::BusError>((topic, committed))
            }
            .await;
            let resumed = match (&found, sink) {
                (Ok((Some(_), _)), Some(sink)) => sink.resume(group, source).await,
                _ => Ok(Vec::new()),
            };
            match (found, resumed) {
                (Ok((Some(topic), committed)), Ok(resumed)) => {
                    let mine: Vec<u32> = (0..topic.partitions)
                        .filter(|p| *p as usize % self.workers == self.index)
                        .collect();
                    match self.place(source, &mine, &committed, &resumed).await {
                        Ok(next) => return Some(next),
                        Err(error) => tracing::warn!(%error, %source, "cannot read source offsets"),
                    }
                }
                (Ok((None, _)), _) => {
                    tracing::error!(%source, "source topic does not exist; worker stops");
                    return None;
                }
                (Err(error), _) => tracing::warn!(%error, %source, "cannot read source offsets"),
                (_, Err(error)) => {
                    self.health.sink_failed(self.clock.now(), error.to_string());
                    tracing::warn!(%error, %source, "cannot read the sink's own positions");
                }
            }
            if !self.pause_for(backoff).await {
                return None;
            }
            backoff = (backoff * 2).min(self.settings.max_backoff);
        }
    }

    /// Where each of `partitions` starts: its committed offset, or the sink's own position
    /// when that is ahead (and not past the end), or the end when nothing is committed. The
    /// stream's ends are read only when one of these needs them: a resumed pipeline with
    /// every partition committed and no sink position ahead asks the log for nothing more
    /// (on Kafka, ends are two requests and a fetch per partition).
    async fn place(
        &self,
        source: &str,
        partitions: &[u32],
        committed: &BTreeMap<u32, u64>,
        resumed: &[(u32, u64)],
    ) -> sluice_bus::Result<HashMap<u32, u64>> {
        let sink_at = |p: u32| resumed.iter().find(|(q, _)| *q == p).map(|r| r.1);
        let needs_end =
            |p: &u32| committed.get(p).is_none_or(|at| sink_at(*p).is_some_and(|s| s > *at));
        let ends = if partitions.iter().any(needs_end) {
            Some(self.log.offsets(source).await?)
        } else {
            None
        };
        Ok(partitions
            .iter()
            .map(|&p| {
                let Some(ends) = &ends else { return (p, committed[&p]) };
                let end = ends[p as usize].end;
                let at = committed.get(&p).copied().unwrap_or(end);
                (p, sink_at(p).filter(|s| *s > at && *s <= end).unwrap_or(at))
            })
            .collect())
    }

    /// Runs one batch through the plan, delivers it with its dead letters and commits its
    /// source offsets ([`crate::sinks::Sink::deliver`]): `read_to` (past the batch), or, when a script stage
    /// reached the batch output budget, the first record of each partition left for the next
    /// batch. Answers the offsets committed; `None` when the worker was stopped before the
    /// batch was settled (its offsets must not be committed).
    async fn process(
        &self,
        plan: &Arc<BoundPlan>,
        batch: Batch<'_>,
        engines: &mut Engines,
        group: &str,
        side: &SideTopics,
        read_to: &[(u32, u64)],
    ) -> Option<Vec<(u32, u64)>> {
        let mut metrics = BatchMetrics::default();
        let started = std::time::Instant::now();
        // The first set filter ran already when the stream's shared reader evaluated it
        // with the other pipelines' (or runs here, over this batch, for records read alone).
        let prefiltered = batch.membership.filter(|_| plan.first_set_filter().is_some());
        // Records move on as shared `Bytes`: nothing is copied. Only script stages can leave
        // records for the next batch, so only then are the records' positions kept, to
        // commit up to the first one left.
        // A sink that cuts its output at source positions gets every record's.
        let wants_origins = plan.plan.sinks.first().is_some_and(|sink| sink.wants_origins());
        let track_positions = plan.plan.has_scripts() || wants_origins;
        let fresh = self.fresh_records(&batch, prefiltered, track_positions);
        if fresh.expired > 0 {
            Counters::add(&self.counters.skipped_expired, fresh.expired as u64);
        }
        let first_stage = usize::from(prefiltered.is_some());
        let outcome = run_plan(plan, first_stage, fresh.items, engines).await?;
        metrics.processing_latency_ms = Some(started.elapsed().as_secs_f64() * 1000.0);
        let offsets = commit_offsets(outcome.deferred_from, read_to, &fresh.positions);
        let offsets = offsets.as_slice();
        // Records from each partition's committed offset on are read again, and counted then
        // (only a script stage's deferral leaves any).
        let again: usize = if outcome.deferred_from.is_none() {
            0
        } else {
            batch
                .chunks
                .iter()
                .map(|(partition, chunk)| {
                    let from =
                        offsets.iter().find(|(p, _)| p == partition).map_or(u64::MAX, |o| o.1);
                    chunk.records().iter().filter(|record| record.offset >= from).count()
                })
                .sum()
        };
        let received = (fresh.read - again) as u64;
        Counters::add(&self.counters.received, received);
        metrics.received = received;
        Counters::add(&self.counters.oom_restarts, outcome.oom_restarts);
        Counters::add(&self.counters.dead_lettered, outcome.failed.len() as u64);
        metrics.processor_errors = outcome.failed.len() as u64;
        if outcome.oom_restarts > 0 {
            self.health.oom_killed(
                self.clock.now(),
                outcome.oom_restarts,
                "script runtime ran out of memory; killed and restarted".to_owned(),
            );
        }
        let origins = if wants_origins { fresh.positions.as_slice() } else { &[] };
        let delivery = Delivery::of(outcome, engines, self.clock.now(), origins);
        // What was read and processed counts now; what is delivered counts when it is.
        self.metrics.record(metrics);
        let Some(sink) = plan.plan.sinks.first() else { return Some(offsets.to_vec()) };
        let settle = Settle { group, source: plan.plan.source.as_str(), offsets };
        let ages = (fresh.oldest_append_ms, fresh.newest_block_ms);
        self.deliver(sink.as_ref(), &delivery, side, settle, ages).await
    }

    /// The records of `batch` younger than the hold (and, with `prefiltered`, passing the
    /// first set filter), as the plan's items.
    fn fresh_records(
        &self,
        batch: &Batch<'_>,
        prefiltered: Option<&Membership>,
        track_positions: bool,
    ) -> FreshRecords {
        let hold_ms = i64::try_from(self.settings.hold.as_millis()).unwrap_or(i64::MAX);
        let cutoff = self.clock.now().timestamp_millis().saturating_sub(hold_ms);
        let mut fresh = FreshRecords::default();
        for (_, chunk) in batch.chunks {
            let records = chunk.records();
            fresh.read += records.len();
            let all_fresh = chunk.oldest_timestamp_ms() >= cutoff;
            if !all_fresh {
                fresh.expired += records.iter().filter(|r| r.timestamp_ms < cutoff).count();
            }
            let first_fresh = records.iter().find(|r| r.timestamp_ms >= cutoff);
            if let Some(first) = first_fresh {
                fresh.oldest_append_ms = Some(
                    fresh
                        .oldest_append_ms
                        .map_or(first.timestamp_ms, |at| at.min(first.timestamp_ms)),
                );
            }
            if let Some(at) = records
                .last()
                .filter(|last| last.timestamp_ms >= cutoff)
                .and_then(|last| self.block_time_ms(last))
            {
                fresh.newest_block_ms =
                    Some(fresh.newest_block_ms.map_or(at, |newest| newest.max(at)));
            }
            let (positions, items) = (&mut fresh.positions, &mut fresh.items);
            let mut keep = |record: &sluice_bus::Record| {
                if record.timestamp_ms < cutoff {
                    return;
                }
                if track_positions {
                    positions.push(Origin {
                        partition: record.partition,
                        offset: record.offset,
                        timestamp_ms: record.timestamp_ms,
                    });
                }
                let origin = items.len();
                items.push(Item { key: record.key.clone(), value: record.value.clone(), origin });
            };
            match prefiltered {
                Some(membership) => {
                    chunk.passing(membership).into_iter().for_each(|index| keep(&records[index]));
                }
                None => records.iter().for_each(&mut keep),
            }
        }
        fresh
    }

    /// Writes `delivery` to `sink` and settles the batch, as the delivery guarantee asks of a
    /// failure: `best_effort` drops the batch and commits; `at_least_once` retries with
    /// backoff until the sink takes it or the worker is stopped (`None`). `ages` are the
    /// batch's oldest append and newest block times, for the latency metrics.
    async fn deliver(
        &self,
        sink: &dyn crate::sinks::Sink,
        delivery: &Delivery,
        side: &SideTopics,
        settle: Settle<'_>,
        (oldest_append_ms, newest_block_ms): (Option<i64>, Option<i64>),
    ) -> Option<Vec<(u32, u64)>> {
        let Settle { group, source, offsets } = settle;
        let out = &delivery.out;
        let sink_uid = sink.config().uid();
        let mut backoff = self.settings.initial_backoff;
        loop {
            let written = sink.deliver(&self.log, delivery, side, settle).await;
            match written {
                Ok(_) => {
                    self.health.sink_delivered();
                    let mut metrics = BatchMetrics { sink_writes: 1, ..BatchMetrics::default() };
                    Counters::add(&self.counters.sent, out.len() as u64);
                    let now_ms = self.clock.now().timestamp_millis();
                    metrics.sent = out.len() as u64;
                    if !out.is_empty() {
                        metrics.total_latency_ms =
                            oldest_append_ms.map(|at| (now_ms - at).max(0) as f64);
                        metrics.data_age_ms = newest_block_ms.map(|at| (now_ms - at).max(0));
                    }
                    self.metrics.record(metrics);
                    return Some(offsets.to_vec());
                }
                Err(error) => {
                    Counters::add(&self.counters.output_errors, 1);
                    if self.guarantee == DeliveryGuarantee::AtLeastOnce {
                        self.health.sink_failed(self.clock.now(), error.to_string());
                    }
                    if self.guarantee == DeliveryGuarantee::BestEffort {
                        tracing::warn!(%error, sink_uid, records = out.len(), "sink write failed; batch dropped (best_effort)");
                        Counters::add(&self.counters.dropped, out.len() as u64);
                        self.metrics.record(BatchMetrics {
                            output_errors: 1,
                            sink_writes: 1,
                            ..BatchMetrics::default()
                        });
                        if let Err(error) = self.log.commit(group, source, offsets).await {
                            // The next successful commit covers this batch.
                            tracing::warn!(%error, %source, "offset commit failed");
                        }
                        return Some(offsets.to_vec());
                    }
                    if error.is_retryable() {
                        tracing::warn!(%error, sink_uid, ?backoff, "sink write failed; retrying (at_least_once)");
                    } else {
                        // Waiting will not fix it, but nothing may be lost: the source stays
                        // held, tried again at the longest backoff until an operator acts
                        // (a redeploy, a teardown).
                        backoff = self.settings.max_backoff;
                        tracing::error!(%error, sink_uid, ?backoff, "sink rejects the batch; the source is held (at_least_once)");
                    }
                    self.metrics.record(BatchMetrics {
                        output_errors: 1,
                        sink_writes: 1,
                        ..BatchMetrics::default()
                    });
                    // Jittered, so many workers do not retry in step; a receiver's
                    // `Retry-After` is honoured up to five minutes.
                    let jittered = backoff.mul_f64(rand::random::<f64>().mul_add(0.5, 0.5));
                    let wait = error
                        .retry_after
                        .map_or(jittered, |asked| asked.min(MAX_RETRY_AFTER).max(jittered));
                    if !self.pause_for(wait).await {
                        return None;
                    }
                    backoff = (backoff * 2).min(self.settings.max_backoff);
                }
            }
        }
    }

    /// The block time (unix ms) of `record`, when its entity has one.
    fn block_time_ms(&self, record: &sluice_bus::Record) -> Option<i64> {
        let value: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&record.value).ok()?;
        sluice_core::streams::event_time(&self.entity, &value).map(|at| at.timestamp_millis())
    }

    /// Sleeps for `length` unless stopped first; false when stopped.
    async fn pause_for(&self, length: Duration) -> bool {
        let mut stop = self.stop.clone();
        if *stop.borrow() {
            return false;
        }
        tokio::select! {
            () = tokio::time::sleep(length) => true,
            _ = stop.changed() => false,
        }
    }
}

/// What [`Worker::process`] takes of a batch: the fresh records as the plan's items, their
/// positions (when kept), and what the counters and metrics need.
#[derive(Default)]
struct FreshRecords {
    items: Vec<Item>,
    positions: Vec<Origin>,
    /// Records read, fresh or not.
    read: usize,
    /// Records older than the hold.
    expired: usize,
    oldest_append_ms: Option<i64>,
    newest_block_ms: Option<i64>,
}

/// Runs `items` through `plan` from stage `first_stage`; `None` when a script stage panicked
/// (the batch is not settled; a restart delivers it again).
async fn run_plan(
    plan: &Arc<BoundPlan>,
    first_stage: usize,
    items: Vec<Item>,
    engines: &mut Engines,
) -> Option<Outcome> {
    if !plan.plan.has_scripts() {
        return Some(plan.run_from(first_stage, items, engines));
    }
    // Scripts block their thread for up to their time budget per record.
    let (moved_plan, mut moved) = (plan.clone(), std::mem::take(engines));
    let joined = tokio::task::spawn_blocking(move || {
        let outcome = moved_plan.run_from(first_stage, items, &mut moved);
        (outcome, moved)
    })
    .await;
    match joined {
        Ok((outcome, back)) => {
            *engines = back;
            Some(outcome)
        }
        Err(error) => {
            tracing::error!(%error, "script stage panicked; worker stops");
            None
        }
    }
}

/// The offsets to commit after a batch read up to `read_to`: there, unless a script stage
/// deferred the records from source position `deferred` on; those are read again from their
/// offset, so each partition commits up to its first record left.
fn commit_offsets(
    deferred: Option<usize>,
    read_to: &[(u32, u64)],
    positions: &[Origin],
) -> Vec<(u32, u64)> {
    let Some(deferred) = deferred else { return read_to.to_vec() };
    read_to
        .iter()
        .map(|&(partition, end)| {
            let first_left = positions
                .get(deferred..)
                .unwrap_or_default()
                .iter()
                .find(|origin| origin.partition == partition);
            (partition, first_left.map_or(end, |origin| origin.offset))
        })
        .collect()
}

/// One round's records as the worker processes them.
struct Batch<'a> {
    /// Each partition's records, in partition order.
    chunks: &'a [(u32, Chunk)],
    /// The worker's place in its stream's filter group, when the plan starts with a set
    /// filter.
    membership: Option<&'a Membership>,
}

/// The worker's membership in its stream's filter group for `plan`: kept when `current` is
/// for the same filter and set, made anew otherwise; `None` when the plan does not start
/// with a set filter.
fn join(
    stream: &SharedStream,
    plan: &BoundPlan,
    current: Option<Arc<Membership>>,
) -> Option<Arc<Membership>> {
    let (filter, set) = plan.first_set_filter()?;
    match current {
        Some(current) if current.is_for(filter, set) => Some(current),
        _ => Some(Arc::new(stream.join(filter, set))),
    }
}
