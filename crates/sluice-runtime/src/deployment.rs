//! A running deployment: its workers, the plan they run, and their counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_bus::StreamLog;
use sluice_core::clock::Clock;
use sluice_core::pipeline::DeliveryGuarantee;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::RuntimeSettings;
use crate::health::{WorkerHealth, WorkerStatus};
use crate::metrics::PipelineMetrics;
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
    /// The supervisor task of each worker.
    workers: Vec<JoinHandle<()>>,
    view: RunningView,
}

/// What readers (health, stats, `/metrics`) see of a running deployment: shared handles
/// the workers update, read without waiting on the deployment's lifecycle lock.
#[derive(Clone)]
pub(crate) struct RunningView {
    health: Vec<Arc<WorkerHealth>>,
    clock: Arc<dyn Clock>,
    counters: Arc<Counters>,
}

impl RunningView {
    /// The health of each worker, in worker order.
    pub(crate) fn health(&self) -> Vec<WorkerStatus> {
        let now = self.clock.now();
        self.health.iter().map(|health| health.status(now)).collect()
    }

    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }
}

impl Running {
    /// Starts `workers` workers, each under a supervisor that restarts it with backoff when
    /// it panics or ends while the deployment runs; worker `i` reads the source partitions `p`
    /// with `p % workers == i`. `entity` is the source's entity (to read block times).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        plan: Arc<BoundPlan>,
        workers: usize,
        guarantee: DeliveryGuarantee,
        log: Arc<dyn StreamLog>,
        clock: Arc<dyn Clock>,
        settings: RuntimeSettings,
        entity: Arc<str>,
        metrics: Arc<PipelineMetrics>,
    ) -> Self {
        let (plan_tx, plan_rx) = watch::channel(plan);
        let (stop_tx, stop_rx) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let pipeline_id = plan_rx.borrow().plan.pipeline_id.clone();
        let health: Vec<Arc<WorkerHealth>> = (0..workers)
            .map(|index| {
                Arc::new(WorkerHealth::new(format!("{pipeline_id}-worker-{index}"), clock.now()))
            })
            .collect();
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
                    health: health[index].clone(),
                    metrics: metrics.clone(),
                    entity: entity.clone(),
                };
                tokio::spawn(supervise(worker))
            })
            .collect();
        Self {
            plan: plan_tx,
            stop: stop_tx,
            workers: handles,
            view: RunningView { health, clock, counters },
        }
    }

    /// What readers see of this deployment.
    pub(crate) fn view(&self) -> RunningView {
        self.view.clone()
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

    /// Asks every worker to stop after its current batch and waits for them.
    pub(crate) async fn stop(self) {
        let plan = self.plan();
        self.stop.send_replace(true);
        for worker in self.workers {
            if let Err(error) = worker.await {
                tracing::error!(%error, "a worker supervisor ended abnormally");
            }
        }
        // No worker delivers any more: the sinks' clients and connections go.
        for sink in &plan.plan.sinks {
            sink.close().await;
        }
    }
}

/// Runs `worker` until its deployment stops, starting it again after a backoff each time its
/// task panics or ends on its own. The backoff doubles with each restart within the
/// crash-loop window, from `initial_backoff` up to `max_backoff`.
async fn supervise(worker: Worker) {
    let mut stop = worker.stop.clone();
    loop {
        let outcome = tokio::spawn(worker.clone().run()).await;
        if *stop.borrow() {
            return;
        }
        let error = match outcome {
            Ok(()) => "the worker ended while its deployment runs".to_owned(),
            Err(error) if error.is_panic() => {
                let panic = error.into_panic();
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_owned());
                format!("the worker panicked: {message}")
            }
            Err(error) => format!("the worker task failed: {error}"),
        };
        let recent = worker.health.crashed(worker.clock.now(), error.clone());
        let exponent = u32::try_from(recent.saturating_sub(1)).unwrap_or(u32::MAX).min(16);
        let backoff = worker
            .settings
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(exponent))
            .min(worker.settings.max_backoff);
        tracing::error!(worker = worker.index, %error, ?backoff, restarts_in_window = recent, "worker failed; restarting");
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return;
        }
        worker.health.restarted(worker.clock.now());
    }
}
