//! One worker: reads its share of the source partitions in batches, runs the plan, delivers
//! to the sink and commits the source offsets after the sink acknowledged.
//!
//! A batch is one round over the worker's partitions (up to `batch_size` records of each).
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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_bus::{Record, StreamLog, topics};
use sluice_core::clock::Clock;
use sluice_core::pipeline::DeliveryGuarantee;
use tokio::sync::watch;

use crate::RuntimeSettings;
use crate::delivery::{Delivery, SideTopics};
use crate::deployment::Counters;
use crate::health::WorkerHealth;
use crate::metrics::{BatchMetrics, PipelineMetrics};
use crate::plan::{BoundPlan, Engines, Item};
use crate::sinks::Settle;

/// Reads a worker's rounds (on a task of its own when reading ahead).
struct Reader {
    log: Arc<dyn StreamLog>,
    source: Arc<str>,
    batch_size: usize,
}

/// One round's reads: the records of every partition read, in partition order, the offset
/// after each partition's last record (partitions with none are left out), and the reads
/// that failed.
struct Round {
    records: Vec<Record>,
    offsets: Vec<(u32, u64)>,
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
        Self { records: Vec::new(), offsets: Vec::new(), errors: vec![(0, error)] }
    }
}

impl Reader {
    /// Up to `batch_size` records of each of `partitions`, from `next`.
    async fn round(&self, partitions: &[u32], next: &HashMap<u32, u64>) -> Round {
        let mut round = Round {
            records: Vec::with_capacity(self.batch_size * partitions.len()),
            offsets: Vec::with_capacity(partitions.len()),
            errors: Vec::new(),
        };
        for &partition in partitions {
            let from = next[&partition];
            match self.log.read(&self.source, partition, from, self.batch_size).await {
                Ok(records) => {
                    let Some(last) = records.last().map(|r| r.offset) else { continue };
                    round.offsets.push((partition, last + 1));
                    round.records.extend(records);
                }
                Err(error) => round.errors.push((partition, error.to_string())),
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
}

impl Worker {
    pub(crate) async fn run(mut self) {
        let mut plan = self.plan.borrow_and_update().clone();
        let source = plan.plan.source.clone();
        let group = topics::deployment_group(&plan.plan.pipeline_id);
        let side = SideTopics::new(&plan.plan.pipeline_id);
        let Some(mut next) = self.start_offsets(&source, &group).await else { return };
        let mut watch = self.log.watch(&source);
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
            // partitions, delivered and committed together.
            let round = match ahead.take() {
                Some(mut reading) => {
                    (&mut reading.0).await.unwrap_or_else(|error| Round::failed(error.to_string()))
                }
                None => self.reader(&source).round(&partitions, &next).await,
            };
            for (partition, error) in &round.errors {
                tracing::warn!(%error, %source, partition, "source read failed");
                if !self.pause_for(self.settings.initial_backoff).await {
                    return;
                }
            }
            if round.offsets.is_empty() {
                let mut stop = self.stop.clone();
                tokio::select! {
                    _ = watch.wait(self.settings.idle_wait) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            // A new configuration takes over here, between batches: no offset is skipped.
            // Checked after the read, so a record appended after the change was handed over
            // (after a PATCH answered) is never run by the old configuration.
            if self.plan.has_changed().unwrap_or(false) {
                plan = self.plan.borrow_and_update().clone();
                engines.keep_only(&plan);
            }
            let mut after = next.clone();
            after.extend(round.offsets.iter().copied());
            let reader = self.reader(&source);
            let read_partitions = partitions.clone();
            ahead = Some(ReadAhead(tokio::spawn(async move {
                reader.round(&read_partitions, &after).await
            })));
            let settled = self
                .process(&plan, round.records, &mut engines, &group, &side, &round.offsets)
                .await;
            let Some(committed) = settled else {
                // Stopped while the sink kept failing: offsets stay for the next start.
                return;
            };
            if committed != round.offsets {
                // Records were left for the next batch: read again from them.
                ahead = None;
            }
            next.extend(committed);
        }
    }

    fn reader(&self, source: &str) -> Reader {
        Reader {
            log: self.log.clone(),
            source: source.into(),
            batch_size: self.settings.batch_size,
        }
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// This worker's partitions and where to read each (committed at deploy).
    async fn start_offsets(&self, source: &str, group: &str) -> Option<HashMap<u32, u64>> {
        let mut backoff = self.settings.initial_backoff;
        loop {
            let found = async {
                let topic = self.log.topic(source).await?;
                let committed = self.log.committed(group, source).await?;
                let ends = self.log.offsets(source).await?;
                Ok::<_, sluice_bus::BusError>((topic, committed, ends))
            }
            .await;
            match found {
                Ok((Some(topic), committed, ends)) => {
                    return Some(
                        (0..topic.partitions)
                            .filter(|p| *p as usize % self.workers == self.index)
                            .map(|p| {
                                let at = committed.get(&p).copied().unwrap_or(ends[p as usize].end);
                                (p, at)
                            })
                            .collect(),
                    );
                }
                Ok((None, ..)) => {
                    tracing::error!(%source, "source topic does not exist; worker stops");
                    return None;
                }
                Err(error) => tracing::warn!(%error, %source, "cannot read source offsets"),
            }
            if !self.pause_for(backoff).await {
                return None;
            }
            backoff = (backoff * 2).min(self.settings.max_backoff);
        }
    }

    /// Runs one batch through the plan, delivers it with its dead letters and commits its
    /// source offsets ([`crate::sinks::Sink::deliver`]): `read_to` (past the batch), or, when a script stage
    /// reached the batch output budget, the first record of each partition left for the next
    /// batch. Answers the offsets committed; `None` when the worker was stopped before the
    /// batch was settled (its offsets must not be committed).
    async fn process(
        &self,
        plan: &Arc<BoundPlan>,
        records: Vec<Record>,
        engines: &mut Engines,
        group: &str,
        side: &SideTopics,
        read_to: &[(u32, u64)],
    ) -> Option<Vec<(u32, u64)>> {
        let mut metrics = BatchMetrics::default();
        let hold_ms = i64::try_from(self.settings.hold.as_millis()).unwrap_or(i64::MAX);
        let cutoff = self.clock.now().timestamp_millis().saturating_sub(hold_ms);
        let read = records.len();
        let oldest_append_ms =
            records.iter().filter(|r| r.timestamp_ms >= cutoff).map(|r| r.timestamp_ms).min();
        let newest_block_ms = self.newest_block_time_ms(&records, cutoff);
        let started = std::time::Instant::now();
        // The records move through the stages and into the sink batch: nothing is copied.
        // Only script stages can leave records for the next batch, so only then are the
        // records' positions kept, to commit up to the first one left.
        let track_positions = plan.plan.has_scripts();
        let mut positions: Vec<(u32, u64)> = Vec::new();
        let items: Vec<Item> = records
            .into_iter()
            .filter(|r| r.timestamp_ms >= cutoff)
            .enumerate()
            .map(|(origin, r)| {
                if track_positions {
                    positions.push((r.partition, r.offset));
                }
                Item { key: r.key, value: r.value, origin }
            })
            .collect();
        let kept = items.len();
        if items.len() < read {
            Counters::add(&self.counters.skipped_expired, (read - items.len()) as u64);
        }
        let outcome = if plan.plan.has_scripts() {
            // Scripts block their thread for up to their time budget per record.
            let (moved_plan, mut moved) = (plan.clone(), std::mem::take(engines));
            let joined = tokio::task::spawn_blocking(move || {
                let outcome = moved_plan.run(items, &mut moved);
                (outcome, moved)
            })
            .await;
            match joined {
                Ok((outcome, back)) => {
                    *engines = back;
                    outcome
                }
                Err(error) => {
                    // A panic in a script stage: the batch is not settled; a restart
                    // delivers it again.
                    tracing::error!(%error, "script stage panicked; worker stops");
                    return None;
                }
            }
        } else {
            plan.run(items, engines)
        };
        metrics.processing_latency_ms = Some(started.elapsed().as_secs_f64() * 1000.0);
        // Records left for the next batch are read again from their offset.
        let offsets: Vec<(u32, u64)> = match outcome.deferred_from {
            None => read_to.to_vec(),
            Some(deferred) => read_to
                .iter()
                .map(|&(partition, end)| {
                    let first_left = positions
                        .get(deferred..)
                        .unwrap_or_default()
                        .iter()
                        .find(|(p, _)| *p == partition);
                    (partition, first_left.map_or(end, |&(_, offset)| offset))
                })
                .collect(),
        };
        let offsets = offsets.as_slice();
        // Deferred records are read again, and counted then.
        let deferred = outcome.deferred_from.map_or(0, |from| kept.saturating_sub(from));
        let received = (read - deferred) as u64;
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
        let delivery = Delivery::of(outcome, engines, self.clock.now());
        let out = &delivery.out;
        // What was read and processed counts now; what is delivered counts when it is.
        self.metrics.record(std::mem::take(&mut metrics));
        let Some(sink) = plan.plan.sinks.first() else { return Some(offsets.to_vec()) };
        let sink_uid = sink.config().uid();
        let source = plan.plan.source.as_str();
        let settle = Settle { group, source, offsets };
        let mut backoff = self.settings.initial_backoff;
        loop {
            let written = sink.deliver(&self.log, &delivery, side, settle).await;
            match written {
                Ok(_) => {
                    self.health.sink_delivered();
                    metrics.sink_writes = 1;
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

    /// The newest block time (unix ms) among the last unexpired record of each partition of
    /// `records` (a partition's records are in order, so its last is its newest).
    fn newest_block_time_ms(&self, records: &[Record], cutoff: i64) -> Option<i64> {
        records
            .iter()
            .enumerate()
            .filter(|(i, r)| {
                r.timestamp_ms >= cutoff
                    && records.get(i + 1).is_none_or(|next| next.partition != r.partition)
            })
            .filter_map(|(_, r)| {
                let value: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_slice(&r.value).ok()?;
                sluice_core::streams::event_time(&self.entity, &value)
            })
            .map(|at| at.timestamp_millis())
            .max()
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
