//! One worker: reads its share of the source partitions in batches, runs the plan, delivers
//! to the sink and commits the source offsets after the sink acknowledged.
//!
//! `at_least_once`: a batch's offsets are committed only after its records are in the sink;
//! a failed sink write is retried with doubling backoff and the worker reads nothing further
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
            let mut progressed = false;
            for &partition in &partitions {
                let from = next[&partition];
                let records =
                    match self.log.read(&source, partition, from, self.settings.batch_size).await {
                        Ok(records) => records,
                        Err(error) => {
                            tracing::warn!(%error, %source, partition, "source read failed");
                            self.pause_for(self.settings.initial_backoff).await;
                            continue;
                        }
                    };
                let Some(last) = records.last().map(|r| r.offset) else { continue };
                progressed = true;
                if !self.process(&plan, &records).await {
                    // Stopped while the sink kept failing: offsets stay for the next start.
                    return;
                }
                next.insert(partition, last + 1);
                if let Err(error) = self.log.commit(&group, &source, &[(partition, last + 1)]).await
                {
                    // The next successful commit covers this batch; until then a restart
                    // would deliver it again, which at-least-once allows.
                    tracing::warn!(%error, %source, partition, "offset commit failed");
                }
                if self.stopping() {
                    return;
                }
            }
            if !progressed {
                let mut stop = self.stop.clone();
                tokio::select! {
                    _ = watch.wait(self.settings.idle_wait) => {}
                    _ = stop.changed() => {}
                }
            }
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

    /// Filters and delivers one batch. False when the worker was stopped before the batch
    /// was settled (its offsets must not be committed).
    async fn process(&self, plan: &BoundPlan, records: &[Record]) -> bool {
        Counters::add(&self.counters.received, records.len() as u64);
        let hold_ms = i64::try_from(self.settings.hold.as_millis()).unwrap_or(i64::MAX);
        let cutoff = self.clock.now().timestamp_millis().saturating_sub(hold_ms);
        let fresh: Vec<&Record> = records.iter().filter(|r| r.timestamp_ms >= cutoff).collect();
        let expired = records.len() - fresh.len();
        if expired > 0 {
            Counters::add(&self.counters.skipped_expired, expired as u64);
        }
        let kept = plan.filter_batch(&fresh, |record| &record.value);
        if kept.is_empty() {
            return true;
        }
        let out: Vec<NewRecord> =
            kept.iter().map(|r| NewRecord { key: r.key.clone(), value: r.value.clone() }).collect();
        let Some((_, sink)) = plan.plan.sink_topics.first() else { return true };
        let mut backoff = self.settings.initial_backoff;
        loop {
            match self.log.append(sink, out.clone()).await {
                Ok(_) => {
                    Counters::add(&self.counters.sent, out.len() as u64);
                    return true;
                }
                Err(error) => {
                    Counters::add(&self.counters.output_errors, 1);
                    if self.guarantee == DeliveryGuarantee::BestEffort {
                        tracing::warn!(%error, %sink, records = out.len(), "sink write failed; batch dropped (best_effort)");
                        Counters::add(&self.counters.dropped, out.len() as u64);
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
