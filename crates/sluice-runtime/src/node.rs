//! What this process runs: every pipeline's lifecycle owner (with the workers it runs
//! here), what health, stats and `/metrics` read of them, and how a stored pipeline becomes
//! workers here — compile it with its secrets, bind its set indexes and datasets, start it.
//!
//! The lifecycle owners ([`crate::lifecycle`]) and both placements ([`crate::placement`])
//! work through one [`Node`]; nothing here decides *where* work runs or *when* a change
//! happens. Readers never wait on a lifecycle call: they read [`Node::views`], a snapshot
//! the lifecycle call that starts or stops workers updates while it holds them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use sluice_bus::{Retention, StreamLog, TopicConfig, topics};
use sluice_core::clock::Clock;
use sluice_core::datasets::DatasetLookup;
use sluice_core::pipeline::Pipeline;
use sluice_core::secret::ResolvedSecrets;
use sluice_store::{MetadataStore, SecretsError};

use crate::datasets::{DatasetIndex, DatasetSlot};
use crate::deployment::{RunSpec, Running, RunningView};
use crate::lifecycle::Lifecycles;
use crate::metrics::MetricsHub;
use crate::plan::{BoundPlan, Plan};
use crate::readers::SharedReaders;
use crate::sets::SetIndexes;
use crate::{Result, RuntimeSettings, SINK_PARTITIONS, SinkEnv, sinks};

/// The secrets a running deployment's sinks started with: `(sink uid, secret, revision)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct SecretUse {
    pub org_id: String,
    pub used: Vec<(String, String, String)>,
}

/// This process's pipelines and the shared handles their workers use.
pub(crate) struct Node {
    pub store: Arc<dyn MetadataStore>,
    pub log: Arc<dyn StreamLog>,
    pub clock: Arc<dyn Clock>,
    pub settings: RuntimeSettings,
    pub sets: Arc<SetIndexes>,
    /// What `beam.contains` in scripts asks; every dataset is empty until the runtime is
    /// given an index.
    pub datasets: Arc<DatasetSlot>,
    /// The process's dataset index, read again on a cluster when other nodes change datasets.
    pub dataset_index: RwLock<Option<Arc<DatasetIndex>>>,
    /// What the workers measured, by pipeline.
    pub metrics: Arc<MetricsHub>,
    /// This node's shared readers of the chain streams ([`crate::readers`]).
    readers: Arc<SharedReaders>,
    /// Every pipeline's lifecycle owner.
    pub lifecycles: Lifecycles,
    /// Secrets and the egress address for sinks.
    sink_env: SinkEnv,
    /// What health, stats and `/metrics` read of each deployment running here, updated by
    /// whoever starts or stops its workers while holding them.
    views: RwLock<HashMap<String, RunningView>>,
    /// The secrets each running deployment's sinks started with (stale-sink checks).
    secret_uses: RwLock<HashMap<String, SecretUse>>,
    /// Set at shutdown: nothing starts any more.
    shut_down: AtomicBool,
    /// Where this process's service events go, once the runtime was given a recorder.
    pub events: std::sync::OnceLock<Arc<crate::events::Recorder>>,
}

impl Node {
    pub(crate) fn new(
        store: Arc<dyn MetadataStore>,
        log: Arc<dyn StreamLog>,
        clock: Arc<dyn Clock>,
        settings: RuntimeSettings,
        sets: Arc<SetIndexes>,
        sink_env: SinkEnv,
    ) -> Self {
        let metrics = Arc::new(MetricsHub::new(store.clone(), clock.clone()));
        tokio::spawn(MetricsHub::run_jobs(Arc::downgrade(&metrics)));
        let readers =
            Arc::new(SharedReaders::new(log.clone(), settings.batch_size, settings.idle_wait));
        Self {
            store,
            log,
            clock,
            settings,
            sets,
            datasets: Arc::new(DatasetSlot::empty()),
            dataset_index: RwLock::default(),
            metrics,
            readers,
            lifecycles: Lifecycles::default(),
            sink_env,
            views: RwLock::default(),
            secret_uses: RwLock::default(),
            shut_down: AtomicBool::new(false),
            events: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn shut_down(&self) {
        self.shut_down.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// Answers scripts' `beam.contains` from `lookup`, in running pipelines too.
    pub(crate) fn use_datasets(&self, lookup: Arc<dyn DatasetLookup>) {
        self.datasets.replace(lookup);
    }

    /// The dataset index the runtime keeps current, if it was given one.
    pub(crate) fn dataset_index(&self) -> Option<Arc<DatasetIndex>> {
        self.dataset_index.read().expect("dataset index lock is never poisoned").clone()
    }

    pub(crate) fn set_dataset_index(&self, index: Arc<DatasetIndex>) {
        self.use_datasets(index.clone());
        *self.dataset_index.write().expect("dataset index lock is never poisoned") = Some(index);
    }

    /// Compiles `pipeline` with the current values of the secrets its sinks name; answers
    /// the plan and which secret revisions it holds.
    pub(crate) async fn compile(&self, pipeline: &Pipeline) -> Result<(Plan, SecretUse)> {
        let mut resolved = ResolvedSecrets::new();
        let mut uses = SecretUse { org_id: pipeline.organization_id.clone(), used: Vec::new() };
        for sink in &pipeline.pipeline_config.sinks {
            for (_, name) in sink.secrets() {
                let Some(secrets) = &self.sink_env.secrets else { continue };
                if !resolved.contains_key(name) {
                    match secrets.resolve(&pipeline.organization_id, &[name]).await {
                        Ok(found) => resolved.extend(found),
                        // The sink's build names what is missing.
                        Err(SecretsError::Missing(_)) => continue,
                        Err(error) => return Err(error.into()),
                    }
                }
                if let Some(found) = resolved.get(name) {
                    uses.used.push((
                        sink.uid().to_owned(),
                        name.to_owned(),
                        found.revision.clone(),
                    ));
                }
            }
        }
        let context = sinks::SinkContext {
            pipeline_id: &pipeline.id,
            secrets: &resolved,
            static_egress: pipeline.static_egress_ip,
            egress: self.sink_env.egress,
            stream: (
                &pipeline.pipeline_config.source.chain,
                &pipeline.pipeline_config.source.entity,
            ),
            guarantee: pipeline.delivery_guarantee,
        };
        Ok((Plan::compile(pipeline, context)?, uses))
    }

    /// `plan` with the set indexes and datasets its transforms read (a set index loads here
    /// when no deployment held it yet).
    pub(crate) async fn bind(&self, plan: Plan) -> Result<Arc<BoundPlan>> {
        let mut sets = Vec::new();
        for uid in plan.set_filter_uids() {
            sets.push(self.sets.acquire(&plan.pipeline_id, uid).await?);
        }
        Ok(Arc::new(plan.bind(sets, self.datasets.clone(), self.clock.clone())))
    }

    /// The topics a deployment writes: its sinks', its dead letters' and its script logs'
    /// (one partition each, kept 2 days). Idempotent.
    pub(crate) async fn create_pipeline_topics(&self, plan: &Plan) -> Result<()> {
        let config = TopicConfig { partitions: SINK_PARTITIONS, retention: Retention::default() };
        for (_, topic) in &plan.sink_topics() {
            self.log.create_topic(topic, config).await?;
        }
        self.log.create_topic(&topics::dead_letter_topic(&plan.pipeline_id), config).await?;
        self.log.create_topic(&topics::logs_topic(&plan.pipeline_id), config).await?;
        Ok(())
    }

    /// Commits the stream's end offsets for partitions the deployment has never read, so
    /// that a first deploy (or one after a teardown) starts at the end.
    pub(crate) async fn pin_start_offsets(&self, plan: &Plan) -> Result<()> {
        let group = topics::deployment_group(&plan.pipeline_id);
        let committed = self.log.committed(&group, &plan.source).await?;
        // A pipeline deployed before (paused, restarted) has every partition committed: then
        // the stream's ends are not needed, and not asked for (on Kafka that is two requests
        // and a fetch per partition).
        if let Some(topic) = self.log.topic(&plan.source).await?
            && (0..topic.partitions).all(|partition| committed.contains_key(&partition))
        {
            return Ok(());
        }
        let ends = self.log.offsets(&plan.source).await?;
        let missing: Vec<(u32, u64)> = ends
            .iter()
            .enumerate()
            .filter(|(partition, _)| !committed.contains_key(&(*partition as u32)))
            .map(|(partition, range)| (partition as u32, range.end))
            .collect();
        if !missing.is_empty() {
            self.log.commit(&group, &plan.source, &missing).await?;
        }
        Ok(())
    }

    /// How a deployment of `pipeline` (stored as `version`) runs, whichever slots run here.
    /// The one place a [`RunSpec`] is made.
    pub(crate) fn run_spec(&self, pipeline: &Pipeline, version: String) -> RunSpec {
        RunSpec {
            workers: pipeline.pod_size.workers(),
            version,
            guarantee: pipeline.delivery_guarantee,
            log: self.log.clone(),
            clock: self.clock.clone(),
            settings: self.settings,
            entity: Arc::from(pipeline.pipeline_config.source.entity.as_str()),
            metrics: self.metrics.pipeline(&pipeline.id),
            readers: self.readers.clone(),
        }
    }

    /// Records `started` as the pipeline's running workers (in its owner's slot and in what
    /// readers see); the caller holds the slot.
    pub(crate) fn set_running(
        &self,
        pipeline_id: &str,
        slot: &mut Option<Running>,
        started: Running,
        uses: SecretUse,
    ) {
        self.views_mut().insert(pipeline_id.to_owned(), started.view());
        self.secret_uses_mut().insert(pipeline_id.to_owned(), uses);
        *slot = Some(started);
    }

    /// Hands the running workers in `slot` a new plan (stored as `version`): each takes it at
    /// its next batch boundary.
    pub(crate) fn replace_plan(
        &self,
        pipeline_id: &str,
        current: &mut Running,
        bound: Arc<BoundPlan>,
        version: String,
        uses: SecretUse,
    ) {
        current.replace_plan(bound, version);
        self.views_mut().insert(pipeline_id.to_owned(), current.view());
        self.secret_uses_mut().insert(pipeline_id.to_owned(), uses);
    }

    /// Shows readers what runs in `current` now (after slots started or stopped).
    pub(crate) fn show(&self, pipeline_id: &str, current: &Running) {
        self.views_mut().insert(pipeline_id.to_owned(), current.view());
    }

    /// Stops the pipeline's workers here, if any run, and flushes their metrics; the caller
    /// holds the slot.
    pub(crate) async fn stop_running(&self, pipeline_id: &str, slot: &mut Option<Running>) {
        if let Some(current) = slot.take() {
            self.views_mut().remove(pipeline_id);
            self.secret_uses_mut().remove(pipeline_id);
            current.stop().await;
            self.metrics.flush(Some(pipeline_id), None).await;
        }
    }

    /// Stops every worker here (each finishes and commits its batch), for shutdown.
    pub(crate) async fn stop_all(&self) {
        for owner in self.lifecycles.all() {
            let mut running = owner.running().await;
            if let Some(deployment) = running.take() {
                self.views_mut().remove(owner.pipeline_id());
                deployment.stop().await;
            }
        }
        self.metrics.flush(None, None).await;
    }

    pub(crate) fn views(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, RunningView>> {
        self.views.read().expect("deployment views lock is never poisoned")
    }

    fn views_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, RunningView>> {
        self.views.write().expect("deployment views lock is never poisoned")
    }

    pub(crate) fn secret_uses(&self, pipeline_id: &str) -> Option<SecretUse> {
        self.secret_uses
            .read()
            .expect("secret uses lock is never poisoned")
            .get(pipeline_id)
            .cloned()
    }

    pub(crate) fn secret_uses_mut(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, HashMap<String, SecretUse>> {
        self.secret_uses.write().expect("secret uses lock is never poisoned")
    }

    /// The secrets of every sink, for stale-sink checks.
    pub(crate) fn sink_secrets(&self) -> Option<&sluice_store::Secrets> {
        self.sink_env.secrets.as_ref()
    }

    /// Starts every worker of `bound` here; its start offsets must be pinned already.
    pub(crate) fn start_workers(
        &self,
        pipeline: &Pipeline,
        bound: Arc<BoundPlan>,
        version: String,
    ) -> Running {
        Running::start(bound, self.run_spec(pipeline, version))
    }

    /// A deployment of `bound` with no worker started here yet (a cluster starts its slots).
    pub(crate) fn new_running(
        &self,
        pipeline: &Pipeline,
        bound: Arc<BoundPlan>,
        version: String,
    ) -> Running {
        Running::new(bound, self.run_spec(pipeline, version))
    }
}
