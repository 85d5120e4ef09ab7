//! One worker: reads its share of the source partitions in batches, runs the plan, delivers
//! to the sink and commits the source offsets after the sink acknowledged.
//!
//! A batch is one round over the worker's partitions (up to `batch_size` records of each).
//! Its sink records and its source offsets are written in one step of the log
//! ([`StreamLog::append_and_commit`]): on the embedded log that is one durable transaction,
//! so a crash leaves both or neither, and a round costs one disk flush.
//!
//! `at_least_once`: a batch's offsets are committed only with (or after) its records in the
//! sink; a failed write is retried with doubling backoff and the worker reads nothing further
//! meanwhile (the source is held back). A stop during retries leaves the offsets where they
//! were, so the batch is delivered again after the next start. `best_effort`: a failed write
//! drops the batch (counted) and the offsets move on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_bus::{NewRecord, Record, StreamLog, topics};
use sluice_core::clock::Clock;
use sluice_core::pipeline::DeliveryGuarantee;
use tokio::sync::watch;

use crate::RuntimeSettings;
use crate::deployment::Counters;
use crate::plan::BoundPlan;

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
}

impl Worker {
    pub(crate) async fn run(mut self) {
        let mut plan = self.plan.borrow_and_update().clone();
        let source = plan.plan.source.clone();
        let group = topics::deployment_group(&plan.plan.pipeline_id);
        let Some(mut next) = self.start_offsets(&source, &group).await else { return };
        let mut watch = self.log.watch(&source);
        let mut partitions: Vec<u32> = next.keys().copied().collect();
        partitions.sort_unstable();
        tracing::debug!(config_id = %plan.plan.pipeline_id, worker = self.index, ?partitions, "worker started");
        while !self.stopping() {
            // A new configuration takes over here, between batches: no offset is skipped.
            if self.plan.has_changed().unwrap_or(false) {
                plan = self.plan.borrow_and_update().clone();
            }
            // One batch per round: up to `batch_size` records of each of this worker's
            // partitions, delivered and committed together.
            let mut batch = Vec::with_capacity(self.settings.batch_size * partitions.len());
            let mut offsets = Vec::with_capacity(partitions.len());
            for &partition in &partitions {
                let from = next[&partition];
                match self.log.read(&source, partition, from, self.settings.batch_size).await {
                    Ok(records) => {
                        let Some(last) = records.last().map(|r| r.offset) else { continue };
                        offsets.push((partition, last + 1));
                        batch.extend(records);
                    }
                    Err(error) => {
                        tracing::warn!(%error, %source, partition, "source read failed");
                        if !self.pause_for(self.settings.initial_backoff).await {
                            return;
                        }
                    }
                }
            }
            if offsets.is_empty() {
                let mut stop = self.stop.clone();
                tokio::select! {
                    _ = watch.wait(self.settings.idle_wait) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            if !self.process(&plan, batch, &group, &offsets).await {
                // Stopped while the sink kept failing: offsets stay for the next start.
                return;
            }
            next.extend(offsets.iter().copied());
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

    /// Filters and delivers one batch and commits its source `offsets` (in one step of the
    /// log when it can: [`StreamLog::append_and_commit`]). False when the worker was stopped
    /// before the batch was settled (its offsets must not be committed).
    async fn process(
        &self,
        plan: &BoundPlan,
        records: Vec<Record>,
        group: &str,
        offsets: &[(u32, u64)],
    ) -> bool {
        Counters::add(&self.counters.received, records.len() as u64);
        let hold_ms = i64::try_from(self.settings.hold.as_millis()).unwrap_or(i64::MAX);
        let cutoff = self.clock.now().timestamp_millis().saturating_sub(hold_ms);
        let read = records.len();
        let fresh: Vec<Record> = records.into_iter().filter(|r| r.timestamp_ms >= cutoff).collect();
        if fresh.len() < read {
            Counters::add(&self.counters.skipped_expired, (read - fresh.len()) as u64);
        }
        let keep = plan.filter_batch(&fresh, |record| &record.value);
        // The kept records move into the sink batch: nothing is copied.
        let out: Vec<NewRecord> = fresh
            .into_iter()
            .zip(keep)
            .filter_map(|(r, keep)| keep.then_some(NewRecord { key: r.key, value: r.value }))
            .collect();
        let sink = plan.plan.sink_topics.first().map_or("", |(_, topic)| topic.as_str());
        let source = plan.plan.source.as_str();
        let mut backoff = self.settings.initial_backoff;
        loop {
            let written = if sink.is_empty() {
                self.log.commit(group, source, offsets).await.map(|()| Vec::new())
            } else {
                self.log.append_and_commit(sink, &out, group, source, offsets).await
            };
            match written {
                Ok(_) => {
                    Counters::add(&self.counters.sent, out.len() as u64);
                    return true;
                }
                Err(error) => {
                    Counters::add(&self.counters.output_errors, 1);
                    if self.guarantee == DeliveryGuarantee::BestEffort {
                        tracing::warn!(%error, %sink, records = out.len(), "sink write failed; batch dropped (best_effort)");
                        Counters::add(&self.counters.dropped, out.len() as u64);
                        if let Err(error) = self.log.commit(group, source, offsets).await {
                            // The next successful commit covers this batch.
                            tracing::warn!(%error, %source, "offset commit failed");
                        }
                        return true;
                    }
                    tracing::warn!(%error, %sink, ?backoff, "sink write failed; retrying (at_least_once)");
                    if !self.pause_for(backoff).await {
                        return false;
                    }
                    backoff = (backoff * 2).min(self.settings.max_backoff);
                }
            }
        }
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
