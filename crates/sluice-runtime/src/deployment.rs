//! A running deployment: its workers, the plan they run, and their counters.

use std::collections::BTreeMap;
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
use crate::readers::SharedReaders;
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

/// The workers of one deployment that run in this process: all of them on a node of its
/// own, or the slots the cluster gives this node ([`crate::cluster`]). Worker `i` (slot `i`)
/// reads the source partitions `p` with `p % workers == i`, wherever it runs.
pub(crate) struct Running {
    plan: watch::Sender<Arc<BoundPlan>>,
    /// Every worker of the deployment, in all processes (from its pod size).
    workers: usize,
    /// The stored deployment this runs (its `updated_at`), to notice a newer one.
    version: String,
    /// The workers running here, by slot.
    slots: BTreeMap<usize, Slot>,
    guarantee: DeliveryGuarantee,
    log: Arc<dyn StreamLog>,
    clock: Arc<dyn Clock>,
    settings: RuntimeSettings,
    entity: Arc<str>,
    metrics: Arc<PipelineMetrics>,
    counters: Arc<Counters>,
    readers: Arc<SharedReaders>,
}

/// One worker and its supervisor.
struct Slot {
    stop: watch::Sender<bool>,
    supervisor: JoinHandle<()>,
    health: Arc<WorkerHealth>,
}

/// What readers (health, stats, `/metrics`) see of a running deployment: shared handles
/// the workers update, read without waiting on the deployment's lifecycle lock.
#[derive(Clone)]
pub(crate) struct RunningView {
    health: Vec<(usize, Arc<WorkerHealth>)>,
    clock: Arc<dyn Clock>,
    counters: Arc<Counters>,
    workers: usize,
    version: String,
}

impl RunningView {
    /// The health of each worker running here, in slot order.
    pub(crate) fn health(&self) -> Vec<WorkerStatus> {
        let now = self.clock.now();
        self.health.iter().map(|(_, health)| health.status(now)).collect()
    }

    /// The slots running here, with their health.
    pub(crate) fn slots(&self) -> Vec<(usize, WorkerStatus)> {
        let now = self.clock.now();
        self.health.iter().map(|(slot, health)| (*slot, health.status(now))).collect()
    }

    /// The stored deployment the workers run (its `updated_at`).
    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    /// Every worker of the deployment, here or elsewhere.
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }
}

/// How a deployment's workers run, whichever slots run here.
pub(crate) struct RunSpec {
    pub workers: usize,
    pub version: String,
    pub guarantee: DeliveryGuarantee,
    pub log: Arc<dyn StreamLog>,
    pub clock: Arc<dyn Clock>,
    pub settings: RuntimeSettings,
    /// The source's entity, to read block times.
    pub entity: Arc<str>,
    pub metrics: Arc<PipelineMetrics>,
    /// The node's shared readers of the chain streams.
    pub readers: Arc<SharedReaders>,
}

impl Running {
    /// A deployment running `plan` with no worker here yet ([`Running::start_slot`]).
    pub(crate) fn new(plan: Arc<BoundPlan>, spec: RunSpec) -> Self {
        let (plan, _) = watch::channel(plan);
        Self {
            plan,
            workers: spec.workers,
            version: spec.version,
            slots: BTreeMap::new(),
            guarantee: spec.guarantee,
            log: spec.log,
            clock: spec.clock,
            settings: spec.settings,
            entity: spec.entity,
            metrics: spec.metrics,
            counters: Arc::new(Counters::default()),
            readers: spec.readers,
        }
    }

    /// A deployment running every one of its workers here.
    pub(crate) fn start(plan: Arc<BoundPlan>, spec: RunSpec) -> Self {
        let mut running = Self::new(plan, spec);
        for slot in 0..running.workers {
            running.start_slot(slot);
        }
        running
    }

    /// Starts worker `slot` here, under a supervisor that restarts it with backoff when it
    /// panics or ends while the deployment runs. No effect when it runs already.
    pub(crate) fn start_slot(&mut self, slot: usize) {
        if self.slots.contains_key(&slot) || slot >= self.workers {
            return;
        }
        let (stop, stop_rx) = watch::channel(false);
        let pipeline_id = self.plan.borrow().plan.pipeline_id.clone();
        let health =
            Arc::new(WorkerHealth::new(format!("{pipeline_id}-worker-{slot}"), self.clock.now()));
        let worker = Worker {
            index: slot,
            workers: self.workers,
            guarantee: self.guarantee,
            log: self.log.clone(),
            clock: self.clock.clone(),
            settings: self.settings,
            plan: self.plan.subscribe(),
            stop: stop_rx,
            counters: self.counters.clone(),
            health: health.clone(),
            metrics: self.metrics.clone(),
            entity: self.entity.clone(),
            readers: self.readers.clone(),
        };
        let supervisor = tokio::spawn(supervise(worker));
        self.slots.insert(slot, Slot { stop, supervisor, health });
    }

    /// Stops the workers of `slots` running here (each finishes and commits its batch) and
    /// waits for them.
    pub(crate) async fn stop_slots(&mut self, slots: &[usize]) {
        let stopping: Vec<Slot> = slots.iter().filter_map(|slot| self.slots.remove(slot)).collect();
        for slot in &stopping {
            slot.stop.send_replace(true);
        }
        for slot in stopping {
            if let Err(error) = slot.supervisor.await {
                tracing::error!(%error, "a worker supervisor ended abnormally");
            }
        }
    }

    /// The slots running here.
    pub(crate) fn slots(&self) -> Vec<usize> {
        self.slots.keys().copied().collect()
    }

    /// What readers see of this deployment.
    pub(crate) fn view(&self) -> RunningView {
        RunningView {
            health: self.slots.iter().map(|(slot, s)| (*slot, s.health.clone())).collect(),
            clock: self.clock.clone(),
            counters: self.counters.clone(),
            workers: self.workers,
            version: self.version.clone(),
        }
    }

    /// Every worker of the deployment, here or elsewhere.
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// The stored deployment this runs.
    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    /// The source topic the workers read.
    pub(crate) fn source(&self) -> String {
        self.plan.borrow().plan.source.clone()
    }

    /// Hands the workers a new plan (of stored deployment `version`); each takes it at its
    /// next batch boundary.
    pub(crate) fn replace_plan(&mut self, plan: Arc<BoundPlan>, version: String) {
        self.plan.send_replace(plan);
        self.version = version;
    }

    /// The configuration the workers run.
    pub(crate) fn plan(&self) -> Arc<BoundPlan> {
        self.plan.borrow().clone()
    }

    /// Asks every worker here to stop after its current batch and waits for them.
    pub(crate) async fn stop(mut self) {
        let plan = self.plan();
        let slots = self.slots();
        self.stop_slots(&slots).await;
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
