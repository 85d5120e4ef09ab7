//! A running deployment: its workers, the plan they run, and their counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_bus::StreamLog;
use sluice_core::clock::Clock;
use sluice_core::pipeline::DeliveryGuarantee;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::RuntimeSettings;
use crate::plan::BoundPlan;
use crate::worker::Worker;

/// What a deployment's workers counted since they started.
#[derive(Debug, Default)]
pub struct Counters {
    /// Records read from the source.
    pub received: AtomicU64,
    /// Records delivered to the sink.
    pub sent: AtomicU64,
    /// Records not delivered because they were older than the hold when read.
    pub skipped_expired: AtomicU64,
    /// Records dropped after a sink failure (`best_effort`).
    pub dropped: AtomicU64,
    /// Failed sink writes.
    pub output_errors: AtomicU64,
    /// Records a transform failed on, written to the dead-letter topic.
    pub dead_lettered: AtomicU64,
    /// Script runtimes replaced after running out of memory.
    pub oom_restarts: AtomicU64,
}

impl Counters {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The workers of one deployment.
pub(crate) struct Running {
    plan: watch::Sender<Arc<BoundPlan>>,
    stop: watch::Sender<bool>,
    workers: Vec<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Running {
    /// Starts `workers` workers; worker `i` reads the source partitions `p` with
    /// `p % workers == i`.
    pub(crate) fn start(
        plan: Arc<BoundPlan>,
        workers: usize,
        guarantee: DeliveryGuarantee,
        log: Arc<dyn StreamLog>,
        clock: Arc<dyn Clock>,
        settings: RuntimeSettings,
    ) -> Self {
        let (plan_tx, plan_rx) = watch::channel(plan);
        let (stop_tx, stop_rx) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let handles = (0..workers)
            .map(|index| {
                let worker = Worker {
                    index,
                    workers,
                    guarantee,
                    log: log.clone(),
                    clock: clock.clone(),
                    settings,
                    plan: plan_rx.clone(),
                    stop: stop_rx.clone(),
                    counters: counters.clone(),
                };
                tokio::spawn(worker.run())
            })
            .collect();
        Self { plan: plan_tx, stop: stop_tx, workers: handles, counters }
    }

    pub(crate) fn workers(&self) -> usize {
        self.workers.len()
    }

    /// The source topic the workers read.
    pub(crate) fn source(&self) -> String {
        self.plan.borrow().plan.source.clone()
    }

    /// Hands the workers a new plan; each takes it at its next batch boundary.
    pub(crate) fn replace_plan(&self, plan: Arc<BoundPlan>) {
        self.plan.send_replace(plan);
    }

    /// The configuration the workers run.
    pub(crate) fn plan(&self) -> Arc<BoundPlan> {
        self.plan.borrow().clone()
    }

    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// Asks every worker to stop after its current batch and waits for them.
    pub(crate) async fn stop(self) {
        self.stop.send_replace(true);
        for worker in self.workers {
            if let Err(error) = worker.await {
                tracing::error!(%error, "a worker ended abnormally");
            }
        }
    }
}
