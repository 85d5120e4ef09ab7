//! `sluice-runtime` owns running pipelines: deployments and their lifecycle (SPEC "States
//! and transitions"), the workers that read a chain stream, apply the transforms and deliver
//! to the sink under the pipeline's delivery guarantee, the in-memory set-filter indexes that
//! follow filter-value changes live, and the chain-stream topics records are ingested into.
//!
//! Start at [`Runtime`]: `deploy`, `pause`, `teardown`, `ingest`. Each deployment has its
//! own lifecycle lock, so one pipeline's slow call never holds another's; health and counters
//! are read from snapshots. Workers live in `worker`, set indexes in [`sets`] (loading through
//! the [`sets::SetSource`] seam), the compiled form of a pipeline in [`plan`], and where the
//! records go in [`sinks`] (the [`sinks::Sink`] trait and one module per sink type), fed by
//! [`delivery`] for workers and dead-letter replay alike. This crate must not depend on the
//! API.

mod cluster;
pub mod datasets;
pub mod delivery;
mod deployment;
pub mod health;
pub mod metrics;
pub mod plan;
mod readers;
pub mod sets;
pub mod sinks;
mod worker;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sluice_bus::{BusError, NewRecord, OffsetRange, Retention, StreamLog, TopicConfig, topics};
use sluice_core::catalog::Catalog;
use sluice_core::clock::Clock;
use sluice_core::datasets::{DatasetLookup, NoDatasets};
use sluice_core::deployment::{DeploymentRecord, DeploymentState};
use sluice_core::pipeline::Pipeline;
use sluice_core::secret::ResolvedSecrets;
use sluice_core::streams::StreamRecord;
use sluice_store::{MetadataStore, Secrets, SecretsError, StoreError};
use tokio::sync::{Mutex, OwnedMutexGuard};

use cluster::Cluster;
pub use cluster::{ClusterSettings, NodeInfo};
pub use deployment::Counters;
use deployment::{RunSpec, Running, RunningView};
pub use health::WorkerStatus;
use metrics::MetricsHub;
pub use plan::PlanError;
use sets::{SetIndexes, SetSource, StoreSetSource};

/// Partitions of every chain-stream topic: enough for the largest pod size (XL, 8 workers)
/// to give each worker its own.
pub const CHAIN_STREAM_PARTITIONS: u32 = 8;

/// Partitions of a managed sink topic. One keeps the consumer's view simple (one offset)
/// while records of one key still arrive in order.
pub const SINK_PARTITIONS: u32 = 1;

/// Errors of the runtime, by whose fault.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The pipeline cannot run as configured (a user fix is needed).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The metadata store failed (retry may help).
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The stream log failed.
    #[error("stream log: {0}")]
    Bus(#[from] BusError),
    /// A sink did not take a batch.
    #[error(transparent)]
    Sink(#[from] sinks::SinkError),
    /// A chain stream that the catalog does not list.
    #[error("no chain stream {0}")]
    UnknownStream(String),
    /// Records checked as one entity sent to another entity's stream (a caller's bug).
    #[error("records of {checked_as} cannot enter {stream}")]
    WrongEntity { stream: String, checked_as: String },
    /// A replay of dead letters stopped (its transforms panicked).
    #[error("replay failed: {0}")]
    Replay(String),
    /// Organization secrets could not be read (a database failure, or a value sealed with
    /// a key this server does not have).
    #[error("secrets: {0}")]
    Secrets(#[from] SecretsError),
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// How workers behave; tests shorten the waits.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeSettings {
    /// Most records a worker reads from one partition per batch.
    pub batch_size: usize,
    /// How long a quiet stream's shared reader waits for the log's append watch before it
    /// looks for new records anyway (a safety net: the watch wakes it on every append).
    /// Idle workers themselves never poll ([`readers`]).
    pub idle_wait: Duration,
    /// First retry delay after a sink failure (`at_least_once`); doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Records older than this (by append time) are skipped, never delivered: the pause hold.
    pub hold: Duration,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        Self {
            batch_size: 2000,
            idle_wait: Duration::from_secs(1),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            hold: Retention::DEFAULT_MAX_AGE,
        }
    }
}

/// What sinks need from the process besides a pipeline's configuration.
#[derive(Debug, Clone, Default)]
pub struct SinkEnv {
    /// The organization secrets sinks name (`None`: no secret resolves).
    pub secrets: Option<Secrets>,
    /// The operator's outbound address for pipelines with `static_egress_ip`.
    pub egress: Option<IpAddr>,
}

/// The secrets a running deployment's sinks started with: `(sink uid, secret, revision)`.
#[derive(Debug, Clone, Default)]
struct SecretUse {
    org_id: String,
    used: Vec<(String, String, String)>,
}

/// What a deploy did, for the response.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployed {
    /// How a consumer reaches each sink, in the pipeline's order.
    pub sinks: Vec<sinks::SinkConnection>,
    /// Whether the pipeline was running before this deploy (a zero-downtime redeploy).
    pub was_running: bool,
}

/// Result of a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    Paused,
    AlreadyPaused,
    NotDeployed,
}

/// The running side of Sluice: one per process.
pub struct Runtime {
    store: Arc<dyn MetadataStore>,
    log: Arc<dyn StreamLog>,
    catalog: Arc<Catalog>,
    clock: Arc<dyn Clock>,
    sets: Arc<SetIndexes>,
    /// What `beam.contains` in scripts asks; every dataset is empty until
    /// [`Runtime::use_datasets`].
    datasets: Arc<DatasetSlot>,
    settings: RuntimeSettings,
    /// What the workers measured, by pipeline.
    metrics: Arc<MetricsHub>,
    /// This node's shared readers of the chain streams ([`readers`]).
    readers: Arc<readers::SharedReaders>,
    /// One lifecycle lock per pipeline, holding its running workers (`None`: not running).
    /// Lifecycle calls of one pipeline serialise on its lock and never wait for another
    /// pipeline's; the map's own lock is held only to find or add an entry, never across an
    /// await. Entries stay for the life of the process (one small lock per pipeline ever
    /// touched), so two calls can never hold different locks for one pipeline.
    lifecycles: std::sync::Mutex<HashMap<String, Arc<Mutex<Option<Running>>>>>,
    /// What health, stats and `/metrics` read of each running deployment, updated by the
    /// lifecycle call that starts or stops its workers while it holds that pipeline's lock.
    views: RwLock<HashMap<String, RunningView>>,
    /// Secrets and the egress address for sinks.
    sink_env: SinkEnv,
    /// The secrets each running deployment's sinks started with (stale-sink checks).
    secret_uses: RwLock<HashMap<String, SecretUse>>,
    /// This node's part in a cluster (`None`: a node of its own, running every worker).
    cluster: Option<Arc<Cluster>>,
    /// The process's dataset index, read again on a cluster when other nodes change datasets.
    dataset_index: RwLock<Option<Arc<datasets::DatasetIndex>>>,
    /// Set by [`Runtime::shutdown`]: the cluster loop stops following.
    shut_down: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl Runtime {
    /// Creates the chain-stream topics of the catalog and runs again every pipeline that was
    /// deployed when the process last stopped (paused ones stay paused).
    ///
    /// # Errors
    /// When the store or the log fails, or a stored deployment cannot run.
    pub async fn start(
        store: Arc<dyn MetadataStore>,
        log: Arc<dyn StreamLog>,
        catalog: Arc<Catalog>,
        clock: Arc<dyn Clock>,
        settings: RuntimeSettings,
    ) -> Result<Arc<Self>> {
        let sets = Arc::new(StoreSetSource(store.clone()));
        Self::start_with_set_source(store, log, catalog, clock, settings, sets).await
    }

    /// [`Runtime::start`], with set-filter indexes loading their values from `sets`.
    ///
    /// # Errors
    /// As [`Runtime::start`].
    pub async fn start_with_set_source(
        store: Arc<dyn MetadataStore>,
        log: Arc<dyn StreamLog>,
        catalog: Arc<Catalog>,
        clock: Arc<dyn Clock>,
        settings: RuntimeSettings,
        sets: Arc<dyn SetSource>,
    ) -> Result<Arc<Self>> {
        Self::start_with_sinks(store, log, catalog, clock, settings, sets, SinkEnv::default()).await
    }

    /// [`Runtime::start_with_set_source`], with sinks resolving secrets and binding the
    /// egress address through `sink_env`.
    ///
    /// # Errors
    /// As [`Runtime::start`].
    pub async fn start_with_sinks(
        store: Arc<dyn MetadataStore>,
        log: Arc<dyn StreamLog>,
        catalog: Arc<Catalog>,
        clock: Arc<dyn Clock>,
        settings: RuntimeSettings,
        sets: Arc<dyn SetSource>,
        sink_env: SinkEnv,
    ) -> Result<Arc<Self>> {
        Self::start_node(store, log, catalog, clock, settings, sets, sink_env, None).await
    }

    /// [`Runtime::start_with_sinks`], as a node of a cluster when `cluster` is given: it runs
    /// its share of every deployment's workers and follows the desired state that every
    /// node's lifecycle calls store ([`ClusterSettings`]; the store must be PostgreSQL and
    /// the log Kafka, shared by every node).
    ///
    /// # Errors
    /// As [`Runtime::start`].
    #[allow(clippy::too_many_arguments)]
    pub async fn start_node(
        store: Arc<dyn MetadataStore>,
        log: Arc<dyn StreamLog>,
        catalog: Arc<Catalog>,
        clock: Arc<dyn Clock>,
        settings: RuntimeSettings,
        sets: Arc<dyn SetSource>,
        sink_env: SinkEnv,
        cluster: Option<ClusterSettings>,
    ) -> Result<Arc<Self>> {
        let sets = Arc::new(SetIndexes::new(sets));
        let cluster = cluster.map(|settings| Arc::new(Cluster::new(settings, clock.now())));
        let metrics = Arc::new(MetricsHub::new(store.clone(), clock.clone()));
        tokio::spawn(MetricsHub::run_jobs(Arc::downgrade(&metrics)));
        let readers = Arc::new(readers::SharedReaders::new(
            log.clone(),
            settings.batch_size,
            settings.idle_wait,
        ));
        let runtime = Arc::new(Self {
            store,
            log,
            catalog,
            clock,
            sets,
            datasets: Arc::new(DatasetSlot(std::sync::RwLock::new(Arc::new(NoDatasets)))),
            readers,
            settings,
            metrics,
            lifecycles: std::sync::Mutex::default(),
            views: RwLock::default(),
            sink_env,
            secret_uses: RwLock::default(),
            cluster,
            dataset_index: RwLock::default(),
            shut_down: std::sync::atomic::AtomicBool::new(false),
        });
        runtime.create_chain_topics().await?;
        if let Some(feed) = runtime.store.set_feed().await? {
            // A shared set store: every node's indexes follow its change feed.
            let datasets = Arc::new(FeedDatasets(Arc::downgrade(&runtime)));
            tokio::spawn(sets::follow_feed(Arc::downgrade(&runtime.sets), datasets, feed));
        }
        if let Some(cluster) = &runtime.cluster {
            // A filter-value change made here wakes the other nodes to refresh their
            // indexes.
            let store = runtime.store.clone();
            runtime.sets.on_change(Arc::new(move || signal_in_background(&store)));
            // The deployments run as the cluster assigns them, from the first round on.
            tokio::spawn(cluster::follow(Arc::downgrade(&runtime), cluster.clone()));
            return Ok(runtime);
        }
        for record in runtime.store.list_deployments().await? {
            if record.state == DeploymentState::Deployed {
                let mut running = runtime.lifecycle(&record.pipeline_id).await;
                let started = async {
                    let (plan, uses) = runtime.compile(&record.pipeline).await?;
                    // Deployed by an older version, it may lack a topic this one writes.
                    runtime.create_pipeline_topics(&plan).await?;
                    runtime.pin_start_offsets(&plan).await?;
                    let bound = runtime.bind(plan).await?;
                    let version = cluster::version_of(&record);
                    Ok::<_, RuntimeError>((
                        runtime.start_workers(&record.pipeline, bound, version),
                        uses,
                    ))
                };
                match started.await {
                    Ok((workers, uses)) => {
                        runtime.set_running(&record.pipeline_id, &mut running, workers, uses);
                        tracing::info!(config_id = %record.pipeline_id, "resumed deployed pipeline");
                    }
                    Err(error) => {
                        tracing::error!(%error, config_id = %record.pipeline_id, "cannot resume deployed pipeline");
                    }
                }
            }
        }
        Ok(runtime)
    }

    /// The set indexes, which must hear every filter-value change (give them to the API).
    pub fn set_indexes(&self) -> Arc<SetIndexes> {
        self.sets.clone()
    }

    /// The dataset lookup scripts see (`beam.contains`): follows [`Runtime::use_datasets`].
    pub fn datasets(&self) -> Arc<dyn DatasetLookup> {
        self.datasets.clone()
    }

    /// Answers scripts' `beam.contains` from `lookup` (the process's dataset index), in
    /// running pipelines too.
    pub fn use_datasets(&self, lookup: Arc<dyn DatasetLookup>) {
        *self.datasets.0.write().expect("dataset lookup lock is never poisoned") = lookup;
    }

    /// The dataset index [`Runtime::follow_datasets`] keeps current, if any.
    fn dataset_index(&self) -> Option<Arc<datasets::DatasetIndex>> {
        self.dataset_index.read().expect("dataset index lock is never poisoned").clone()
    }

    /// Answers scripts' `beam.contains` from `index` and keeps it current: the returned
    /// listener is what the API tells of dataset changes (on a cluster it also wakes the
    /// other nodes, whose rounds read the changed datasets again).
    pub fn follow_datasets(
        &self,
        index: Arc<datasets::DatasetIndex>,
    ) -> Arc<dyn sluice_core::datasets::DatasetListener> {
        self.use_datasets(index.clone());
        *self.dataset_index.write().expect("dataset index lock is never poisoned") =
            Some(index.clone());
        match &self.cluster {
            None => index,
            Some(_) => Arc::new(SignallingDatasets { index, store: self.store.clone() }),
        }
    }

    /// The dead-letter topic of a deployed (or paused) pipeline; `None` when it is not
    /// deployed.
    ///
    /// # Errors
    /// A store failure.
    pub async fn dead_letter_topic(&self, pipeline_id: &str) -> Result<Option<String>> {
        Ok(self
            .store
            .deployment(pipeline_id)
            .await?
            .map(|_| topics::dead_letter_topic(pipeline_id)))
    }

    /// The first dead letter not replayed yet (0 when none was).
    ///
    /// # Errors
    /// A log failure.
    pub async fn dead_letter_cursor(&self, pipeline_id: &str) -> Result<u64> {
        let topic = topics::dead_letter_topic(pipeline_id);
        match self.log.committed(&topics::replay_group(pipeline_id), &topic).await {
            Ok(committed) => Ok(committed.get(&0).copied().unwrap_or(0)),
            Err(BusError::UnknownTopic(_)) => Ok(0),
            Err(error) => Err(error.into()),
        }
    }

    /// Feeds the dead letters not replayed yet through the pipeline's current transforms,
    /// each from the transform that failed on it (from the first when that transform is
    /// gone): what passes goes to the sink, what fails again becomes a new dead letter, and
    /// the replay cursor moves past them, all in one log step per chunk. `None` when the
    /// pipeline is not deployed. Works on a paused pipeline too.
    ///
    /// # Errors
    /// A store or log failure.
    pub async fn replay_dead_letters(&self, pipeline_id: &str) -> Result<Option<Replayed>> {
        // This pipeline's lifecycle calls wait: a teardown must not remove the topics under
        // the replay. Other pipelines' calls do not.
        let running = self.lifecycle(pipeline_id).await;
        let Some(record) = self.store.deployment(pipeline_id).await? else { return Ok(None) };
        let plan = match running.as_ref() {
            Some(current) => current.plan(),
            None => self.bind(self.compile(&record.pipeline).await?.0).await?,
        };
        let Some(sink) = plan.plan.sinks.first().cloned() else {
            return Ok(Some(Replayed::default()));
        };
        let side = delivery::SideTopics::new(pipeline_id);
        let dead_topic = side.dead_letters.clone();
        let group = topics::replay_group(pipeline_id);
        let end = match self.log.offsets(&dead_topic).await {
            Ok(ranges) => ranges.first().map_or(0, |range| range.end),
            Err(BusError::UnknownTopic(_)) => return Ok(Some(Replayed::default())),
            Err(error) => return Err(error.into()),
        };
        let mut report = Replayed {
            next_offset: self.dead_letter_cursor(pipeline_id).await?,
            ..Replayed::default()
        };
        let mut engines = plan::Engines::default();
        while report.next_offset < end {
            let want =
                usize::try_from(end - report.next_offset).unwrap_or(usize::MAX).min(REPLAY_CHUNK);
            let letters = self.log.read(&dead_topic, 0, report.next_offset, want).await?;
            let Some(read_to) = letters.last().map(|r| r.offset + 1) else { break };
            // Letters that cannot be read back are passed over (with the cursor).
            let (offsets, items): (Vec<u64>, Vec<(usize, plan::Item)>) = letters
                .into_iter()
                .filter_map(|letter| {
                    let offset = letter.offset;
                    replay_item(&plan, letter).map(|item| (offset, item))
                })
                .unzip();
            let moved_plan = plan.clone();
            let budget = plan::batch_output_budget(plan.plan.pod_size);
            let (outcome, run, back) = tokio::task::spawn_blocking(move || {
                let (outcome, run) = moved_plan.replay_within(items, &mut engines, budget);
                (outcome, run, engines)
            })
            .await
            .map_err(|error| RuntimeError::Replay(error.to_string()))?;
            engines = back;
            report.replayed += run as u64;
            // Up to the first letter not run yet; all read when every one was run.
            let next = offsets.get(run).copied().unwrap_or(read_to);
            let delivery = delivery::Delivery::of(outcome, &engines, self.clock.now());
            // The replay group's offset on the dead-letter topic is the replay cursor.
            let settle =
                sinks::Settle { group: &group, source: &dead_topic, offsets: &[(0, next)] };
            sink.deliver(&self.log, &delivery, &side, settle).await?;
            report.delivered += delivery.out.len() as u64;
            report.dead_lettered += delivery.dead.len() as u64;
            report.next_offset = next;
        }
        tracing::info!(config_id = %pipeline_id, ?report, "dead letters replayed");
        Ok(Some(report))
    }

    /// The last `limit` lines the pipeline's scripts logged, oldest first (empty when the
    /// pipeline is not deployed).
    ///
    /// # Errors
    /// A log failure.
    pub async fn script_logs(&self, pipeline_id: &str, limit: usize) -> Result<Vec<plan::LogLine>> {
        let topic = topics::logs_topic(pipeline_id);
        let range = match self.log.offsets(&topic).await {
            Ok(ranges) => ranges.first().copied().unwrap_or(OffsetRange { start: 0, end: 0 }),
            Err(BusError::UnknownTopic(_)) => return Ok(Vec::new()),
            Err(error) => return Err(error.into()),
        };
        let from = range.end.saturating_sub(limit as u64).max(range.start);
        let records = self.log.read(&topic, 0, from, limit).await?;
        Ok(records.iter().filter_map(|record| serde_json::from_slice(&record.value).ok()).collect())
    }

    pub fn log(&self) -> &Arc<dyn StreamLog> {
        &self.log
    }

    async fn create_chain_topics(&self) -> Result<()> {
        let config = TopicConfig {
            partitions: CHAIN_STREAM_PARTITIONS,
            retention: Retention { max_age: self.settings.hold, max_bytes: None },
        };
        for entry in self.catalog.entries() {
            self.log
                .create_topic(&topics::chain_stream(&entry.chain, &entry.entity, false), config)
                .await?;
            if entry.zerolag {
                self.log
                    .create_topic(&topics::chain_stream(&entry.chain, &entry.entity, true), config)
                    .await?;
            }
        }
        Ok(())
    }

    /// Appends records to a chain stream; durable when this returns. Records are
    /// [`StreamRecord`]s, so each was checked (one JSON object, no repeated key, key and time
    /// fields) for the stream's entity.
    ///
    /// # Errors
    /// [`RuntimeError::UnknownStream`] when the catalog has no such stream,
    /// [`RuntimeError::WrongEntity`] for a record checked as another entity, or a log failure.
    pub async fn ingest(
        &self,
        chain: &str,
        entity: &str,
        zerolag: bool,
        records: Vec<StreamRecord>,
    ) -> Result<usize> {
        let known = self
            .catalog
            .entries()
            .iter()
            .any(|e| e.chain == chain && e.entity == entity && (!zerolag || e.zerolag));
        let topic = topics::chain_stream(chain, entity, zerolag);
        if !known {
            return Err(RuntimeError::UnknownStream(topic));
        }
        if let Some(record) = records.iter().find(|record| record.entity() != entity) {
            return Err(RuntimeError::WrongEntity {
                stream: topic,
                checked_as: record.entity().to_owned(),
            });
        }
        let count = records.len();
        let records = records
            .into_iter()
            .map(|record| {
                let (key, value) = record.into_parts();
                NewRecord::new(key, value)
            })
            .collect();
        self.log.append(&topic, records).await?;
        Ok(count)
    }

    /// Deploys `pipeline` (SPEC: not deployed → deployed; paused → deployed, resuming from
    /// the kept offsets; deployed → deployed with the new configuration at a batch boundary,
    /// no gap in offsets). Idempotent.
    ///
    /// # Errors
    /// A configuration the runtime cannot run, or a store or log failure.
    pub async fn deploy(&self, pipeline: &Pipeline) -> Result<Deployed> {
        let (plan, uses) = self.compile(pipeline).await?;
        // On a cluster, one lifecycle call of a pipeline at a time on every node.
        let cluster_lock = self.cluster_lock(&pipeline.id).await?;
        let mut running = self.lifecycle(&pipeline.id).await;
        let now = self.clock.now();
        let existing = self.store.deployment(&pipeline.id).await?;
        // Sink topics and source offsets exist before the answer, so records that arrive
        // right after the deploy returns are delivered.
        self.create_pipeline_topics(&plan).await?;
        self.pin_start_offsets(&plan).await?;
        let record = DeploymentRecord {
            pipeline_id: pipeline.id.clone(),
            state: DeploymentState::Deployed,
            pipeline: pipeline.clone(),
            deployed_at: existing.as_ref().map_or(now, |e| e.deployed_at),
            updated_at: now,
        };
        self.store.put_deployment(&record).await?;
        let version = cluster::version_of(&record);
        let sinks = plan
            .sinks
            .iter()
            .map(|sink| {
                let mut connection = sink.connection(&pipeline.id);
                let access = sink.managed_topic().and_then(|topic| self.log.client_access(topic));
                if let Some(access) = access {
                    sinks::managed::add_kafka_access(&mut connection, &access);
                }
                connection
            })
            .collect();
        if let (Some(cluster), Some(lock)) = (&self.cluster, cluster_lock) {
            drop(running);
            let was_running =
                existing.as_ref().is_some_and(|e| e.state == DeploymentState::Deployed);
            // The freshest view of who is alive, and the others hear what runs here before
            // they start anything.
            self.refresh_peers(cluster).await;
            self.reconcile(cluster, &pipeline.id, Some(&record)).await;
            self.signal_cluster().await;
            let workers = pipeline.pod_size.workers();
            let everywhere = self
                .converge(cluster, |nodes| {
                    let at_version: std::collections::BTreeSet<usize> = nodes
                        .iter()
                        .flat_map(|node| &node.workers)
                        .filter(|w| w.pipeline_id == pipeline.id && w.version == version)
                        .map(|w| w.slot)
                        .collect();
                    at_version.len() == workers
                })
                .await;
            if !everywhere {
                tracing::warn!(config_id = %pipeline.id, "not every node runs the deployment yet; they follow it on their next rounds");
            }
            lock.release().await;
            tracing::info!(config_id = %pipeline.id, was_running, "pipeline deployed");
            return Ok(Deployed { sinks, was_running });
        }
        let source = plan.source.clone();
        let bound = self.bind(plan).await?;
        let was_running = match running.as_mut() {
            Some(current)
                if current.workers() == pipeline.pod_size.workers()
                    && current.source() == source =>
            {
                current.replace_plan(bound, version);
                let view = current.view();
                self.views_mut().insert(pipeline.id.clone(), view);
                self.secret_uses_mut().insert(pipeline.id.clone(), uses);
                true
            }
            Some(_) => {
                self.stop_running(&pipeline.id, &mut running).await;
                let started = self.start_workers(pipeline, bound, version);
                self.set_running(&pipeline.id, &mut running, started, uses);
                true
            }
            None => {
                let started = self.start_workers(pipeline, bound, version);
                self.set_running(&pipeline.id, &mut running, started, uses);
                false
            }
        };
        tracing::info!(config_id = %pipeline.id, was_running, "pipeline deployed");
        Ok(Deployed { sinks, was_running })
    }

    /// On a cluster, waits for and takes the pipeline's cluster-wide lifecycle lock.
    async fn cluster_lock(&self, pipeline_id: &str) -> Result<Option<sluice_store::ClusterLock>> {
        match &self.cluster {
            Some(_) => Ok(Some(self.store.cluster_lock(pipeline_id).await?)),
            None => Ok(None),
        }
    }

    /// Wakes the other nodes of a cluster to follow a change of the desired state, after
    /// telling them what runs here now.
    async fn signal_cluster(&self) {
        if let Some(cluster) = &self.cluster {
            self.heartbeat(cluster).await;
        }
        if let Err(error) = self.store.signal_cluster().await {
            tracing::warn!(%error, "cannot signal the other nodes; they follow on their next heartbeat");
        }
    }

    /// On a cluster: waits until no live node runs a worker of `pipeline_id`.
    async fn converge_stopped(&self, pipeline_id: &str) {
        let Some(cluster) = &self.cluster else { return };
        let stopped = self
            .converge(cluster, |nodes| {
                nodes.iter().flat_map(|node| &node.workers).all(|w| w.pipeline_id != pipeline_id)
            })
            .await;
        if !stopped {
            tracing::warn!(config_id = %pipeline_id, "a node still reports workers of the pipeline");
        }
    }

    /// On a cluster: waits until no other live node holds any of `topics` open.
    async fn converge_released(&self, topics: &[String]) {
        let Some(cluster) = &self.cluster else { return };
        let released = self
            .converge(cluster, |nodes| {
                nodes
                    .iter()
                    .skip(1)
                    .all(|node| !node.open_topics.iter().any(|t| topics.contains(t)))
            })
            .await;
        if !released {
            tracing::warn!(?topics, "a node still holds topics open that a teardown deletes");
        }
    }

    /// Pauses a deployed pipeline: its workers finish their batch and stop; offsets, sinks
    /// and topics stay. No effect on a pipeline that is not deployed.
    ///
    /// # Errors
    /// A store failure.
    pub async fn pause(&self, pipeline_id: &str) -> Result<Paused> {
        let cluster_lock = self.cluster_lock(pipeline_id).await?;
        let mut running = self.lifecycle(pipeline_id).await;
        let Some(mut record) = self.store.deployment(pipeline_id).await? else {
            return Ok(Paused::NotDeployed);
        };
        if record.state == DeploymentState::Paused {
            return Ok(Paused::AlreadyPaused);
        }
        self.stop_running(pipeline_id, &mut running).await;
        record.state = DeploymentState::Paused;
        record.updated_at = self.clock.now();
        self.store.put_deployment(&record).await?;
        drop(running);
        if let Some(lock) = cluster_lock {
            self.signal_cluster().await;
            self.converge_stopped(pipeline_id).await;
            lock.release().await;
        }
        tracing::info!(config_id = %pipeline_id, "pipeline paused");
        Ok(Paused::Paused)
    }

    /// Tears a deployment down: workers stop, its sink topics and source offsets are removed
    /// (the next deploy reads from the stream's end), the configuration stays. True when
    /// there was a deployment.
    ///
    /// # Errors
    /// A store or log failure.
    pub async fn teardown(&self, pipeline_id: &str) -> Result<bool> {
        let cluster_lock = self.cluster_lock(pipeline_id).await?;
        let mut running = self.lifecycle(pipeline_id).await;
        self.stop_running(pipeline_id, &mut running).await;
        let Some(mut record) = self.store.deployment(pipeline_id).await? else {
            return Ok(false);
        };
        if cluster_lock.is_some() && record.state == DeploymentState::Deployed {
            // Every node's workers stop (and commit) before the topics and offsets go; a
            // teardown cut short leaves the deployment paused, and a new one finishes it.
            record.state = DeploymentState::Paused;
            record.updated_at = self.clock.now();
            self.store.put_deployment(&record).await?;
            self.signal_cluster().await;
            self.converge_stopped(pipeline_id).await;
        }
        if cluster_lock.is_some() {
            self.converge_released(&cluster::pipeline_topics(&record)).await;
        }
        for (_, topic) in &plan::Plan::managed_topics(&record.pipeline) {
            self.log.delete_topic(topic).await?;
        }
        self.log.delete_topic(&topics::dead_letter_topic(pipeline_id)).await?;
        self.log.delete_topic(&topics::logs_topic(pipeline_id)).await?;
        self.log.delete_group(&topics::deployment_group(pipeline_id)).await?;
        self.store.delete_deployment(pipeline_id).await?;
        self.sets.release_pipeline(pipeline_id);
        if let Some(lock) = cluster_lock {
            self.signal_cluster().await;
            lock.release().await;
        }
        tracing::info!(config_id = %pipeline_id, "pipeline torn down");
        Ok(true)
    }

    /// The stored deployment state of a pipeline (`None`: not deployed).
    ///
    /// # Errors
    /// A store failure.
    pub async fn state(&self, pipeline_id: &str) -> Result<Option<DeploymentState>> {
        Ok(self.store.deployment(pipeline_id).await?.map(|record| record.state))
    }

    /// The managed topic of a deployed (or paused) pipeline's sink; `None` when the
    /// pipeline is not deployed or has no such sink.
    ///
    /// # Errors
    /// A store failure.
    pub async fn sink_topic(&self, pipeline_id: &str, sink_uid: &str) -> Result<Option<String>> {
        let Some(record) = self.store.deployment(pipeline_id).await? else { return Ok(None) };
        Ok(plan::Plan::managed_topics(&record.pipeline)
            .into_iter()
            .find(|(uid, _)| uid == sink_uid)
            .map(|(_, topic)| topic))
    }

    /// The counters of a running deployment. Never waits on a lifecycle call.
    pub async fn counters(&self, pipeline_id: &str) -> Option<Arc<Counters>> {
        self.views().get(pipeline_id).map(RunningView::counters)
    }

    /// Stops every worker (each finishes and commits its batch); deployments stay stored as
    /// they are, so the next start runs them again.
    pub async fn shutdown(&self) {
        self.shut_down.store(true, std::sync::atomic::Ordering::SeqCst);
        let lifecycles: Vec<(String, Arc<Mutex<Option<Running>>>)> = self
            .lifecycles
            .lock()
            .expect("lifecycle map lock is never poisoned")
            .iter()
            .map(|(id, lifecycle)| (id.clone(), lifecycle.clone()))
            .collect();
        for (id, lifecycle) in lifecycles {
            let mut running = lifecycle.lock_owned().await;
            if let Some(deployment) = running.take() {
                self.views_mut().remove(&id);
                deployment.stop().await;
            }
        }
        self.metrics.flush(None, None).await;
        if let Some(cluster) = &self.cluster {
            // The others take this node's work at once instead of after the node timeout.
            let stale = i64::try_from(Duration::from_secs(86_400).as_millis()).unwrap_or(i64::MAX);
            if let Err(error) = self.store.remove_nodes(Some(cluster.name()), stale).await {
                tracing::warn!(%error, "cannot remove this node from the cluster's nodes");
            }
            if let Err(error) = self.store.signal_cluster().await {
                tracing::warn!(%error, "cannot signal the other nodes");
            }
        }
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The live nodes of the cluster, this one first; `None` on a node of its own.
    pub fn nodes(&self) -> Option<Vec<NodeInfo>> {
        self.cluster.as_ref().map(|cluster| self.node_infos(cluster))
    }

    /// On a cluster: whether this node wrote its heartbeat within the node timeout (the
    /// others count it alive).
    pub fn in_cluster(&self) -> bool {
        self.cluster.as_ref().is_none_or(|cluster| cluster.heartbeat_fresh())
    }

    /// The health of each worker of a running deployment, in worker order; empty when the
    /// pipeline is not deployed or paused (it has no workers). Never waits on a lifecycle
    /// call.
    pub async fn worker_health(&self, pipeline_id: &str) -> Vec<WorkerStatus> {
        if let Some(cluster) = &self.cluster {
            return self.cluster_workers(cluster).remove(pipeline_id).unwrap_or_default();
        }
        self.views().get(pipeline_id).map(RunningView::health).unwrap_or_default()
    }

    /// The health of the workers of every running deployment, by pipeline id. Never waits
    /// on a lifecycle call.
    pub async fn all_worker_health(&self) -> Vec<(String, Vec<WorkerStatus>)> {
        if let Some(cluster) = &self.cluster {
            return self.cluster_workers(cluster).into_iter().collect();
        }
        let mut all: Vec<(String, Vec<WorkerStatus>)> =
            self.views().iter().map(|(id, view)| (id.clone(), view.health())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Takes the lifecycle lock of one pipeline: lifecycle calls of that pipeline run one at
    /// a time; other pipelines are not affected.
    async fn lifecycle(&self, pipeline_id: &str) -> OwnedMutexGuard<Option<Running>> {
        let lifecycle = self
            .lifecycles
            .lock()
            .expect("lifecycle map lock is never poisoned")
            .entry(pipeline_id.to_owned())
            .or_default()
            .clone();
        lifecycle.lock_owned().await
    }

    /// Records `started` as the pipeline's running workers (in its lifecycle slot and in
    /// what readers see); the caller holds the pipeline's lifecycle lock.
    fn set_running(
        &self,
        pipeline_id: &str,
        slot: &mut OwnedMutexGuard<Option<Running>>,
        started: Running,
        uses: SecretUse,
    ) {
        self.views_mut().insert(pipeline_id.to_owned(), started.view());
        self.secret_uses_mut().insert(pipeline_id.to_owned(), uses);
        **slot = Some(started);
    }

    /// Stops the pipeline's workers, if any run, and flushes their metrics; the caller holds
    /// the pipeline's lifecycle lock.
    async fn stop_running(&self, pipeline_id: &str, slot: &mut OwnedMutexGuard<Option<Running>>) {
        if let Some(current) = slot.take() {
            self.views_mut().remove(pipeline_id);
            self.secret_uses_mut().remove(pipeline_id);
            current.stop().await;
            self.metrics.flush(Some(pipeline_id), None).await;
        }
    }

    fn secret_uses_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, SecretUse>> {
        self.secret_uses.write().expect("secret uses lock is never poisoned")
    }

    /// Compiles `pipeline` with the current values of the secrets its sinks name; answers
    /// the plan and which secret revisions it holds.
    async fn compile(&self, pipeline: &Pipeline) -> Result<(plan::Plan, SecretUse)> {
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
        };
        Ok((plan::Plan::compile(pipeline, context)?, uses))
    }

    /// Checks that `pipeline` could be deployed as it is (its transforms compile, its sinks
    /// build with the secrets they name), without deploying it.
    ///
    /// # Errors
    /// [`RuntimeError::Plan`] naming what is wrong; a store failure.
    pub async fn check_deployable(&self, pipeline: &Pipeline) -> Result<()> {
        self.compile(pipeline).await.map(|_| ())
    }

    /// Uids of the running deployment's sinks that use a secret changed (or deleted) since
    /// its workers started: they run with the old value until the pipeline is redeployed.
    /// Empty when the pipeline does not run.
    ///
    /// # Errors
    /// A store failure.
    pub async fn stale_sinks(&self, pipeline_id: &str) -> Result<Vec<String>> {
        let uses = self
            .secret_uses
            .read()
            .expect("secret uses lock is never poisoned")
            .get(pipeline_id)
            .cloned();
        let (Some(uses), Some(secrets)) = (uses, &self.sink_env.secrets) else {
            return Ok(Vec::new());
        };
        let names: Vec<&str> = uses.used.iter().map(|used| used.1.as_str()).collect();
        let current = secrets.revisions(&uses.org_id, &names).await?;
        let mut stale: Vec<String> = uses
            .used
            .iter()
            .filter(|(_, name, revision)| current.get(name) != Some(revision))
            .map(|(uid, _, _)| uid.clone())
            .collect();
        stale.dedup();
        Ok(stale)
    }

    fn views(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, RunningView>> {
        self.views.read().expect("deployment views lock is never poisoned")
    }

    fn views_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, RunningView>> {
        self.views.write().expect("deployment views lock is never poisoned")
    }

    /// The metrics the workers recorded, of every pipeline.
    pub fn metrics(&self) -> &Arc<MetricsHub> {
        &self.metrics
    }

    /// Commits the stream's end offsets for partitions the deployment has never read, so
    /// that a first deploy (or one after a teardown) starts at the end.
    async fn pin_start_offsets(&self, plan: &plan::Plan) -> Result<()> {
        let group = topics::deployment_group(&plan.pipeline_id);
        let committed = self.log.committed(&group, &plan.source).await?;
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

    /// The topics a deployment writes: its sinks', its dead letters' and its script logs'
    /// (one partition each, kept 2 days). Idempotent.
    async fn create_pipeline_topics(&self, plan: &plan::Plan) -> Result<()> {
        let config = TopicConfig { partitions: SINK_PARTITIONS, retention: Retention::default() };
        for (_, topic) in &plan.sink_topics() {
            self.log.create_topic(topic, config).await?;
        }
        self.log.create_topic(&topics::dead_letter_topic(&plan.pipeline_id), config).await?;
        self.log.create_topic(&topics::logs_topic(&plan.pipeline_id), config).await?;
        Ok(())
    }

    async fn bind(&self, plan: plan::Plan) -> Result<Arc<plan::BoundPlan>> {
        let mut sets = Vec::new();
        for uid in plan.set_filter_uids() {
            sets.push(self.sets.acquire(&plan.pipeline_id, uid).await?);
        }
        Ok(Arc::new(plan.bind(sets, self.datasets.clone(), self.clock.clone())))
    }

    /// Starts the workers of `bound`, compiled from `pipeline`; its start offsets must be
    /// pinned already.
    fn start_workers(
        &self,
        pipeline: &Pipeline,
        bound: Arc<plan::BoundPlan>,
        version: String,
    ) -> Running {
        Running::start(bound, self.run_spec(pipeline, version))
    }

    /// A deployment of `bound` (compiled from `pipeline`) with no worker started yet.
    fn new_running(
        &self,
        pipeline: &Pipeline,
        bound: Arc<plan::BoundPlan>,
        version: String,
    ) -> Running {
        Running::new(bound, self.run_spec(pipeline, version))
    }

    fn run_spec(&self, pipeline: &Pipeline, version: String) -> RunSpec {
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
}

/// The dataset lookup of the process, replaceable after the runtime started (the index is
/// loaded after it): plans hold the slot, so running pipelines see the replacement.
struct DatasetSlot(std::sync::RwLock<Arc<dyn DatasetLookup>>);

impl DatasetLookup for DatasetSlot {
    fn contains_any(&self, owner_user_id: &str, dataset: &str, values: &[&str]) -> bool {
        self.0.read().expect("dataset lookup lock is never poisoned").contains_any(
            owner_user_id,
            dataset,
            values,
        )
    }
}

/// A dataset listener of a cluster node: the index hears the change, the other nodes a
/// signal.
struct SignallingDatasets {
    index: Arc<datasets::DatasetIndex>,
    store: Arc<dyn MetadataStore>,
}

impl sluice_core::datasets::DatasetListener for SignallingDatasets {
    fn changed(
        &self,
        dataset: sluice_core::datasets::DatasetRef<'_>,
        change: sluice_core::datasets::DatasetChange<'_>,
    ) {
        self.index.changed(dataset, change);
        signal_in_background(&self.store);
    }
}

/// Wakes the other nodes of a cluster from a listener, which cannot wait.
fn signal_in_background(store: &Arc<dyn MetadataStore>) {
    let store = store.clone();
    tokio::spawn(async move {
        if let Err(error) = store.signal_cluster().await {
            tracing::warn!(%error, "cannot signal the other nodes");
        }
    });
}

/// Dead letters read per step of a replay.
const REPLAY_CHUNK: usize = 1000;

/// What a replay of dead letters did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Dead letters fed through the transforms again.
    pub replayed: u64,
    /// Records that reached the sink.
    pub delivered: u64,
    /// Records that failed again (new dead letters, after the cursor).
    pub dead_lettered: u64,
    /// The replay cursor afterwards: the first dead letter not replayed.
    pub next_offset: u64,
}

/// A dead letter as a record to feed again, with the stage it starts at.
fn replay_item(plan: &plan::BoundPlan, letter: sluice_bus::Record) -> Option<(usize, plan::Item)> {
    let body: serde_json::Value = serde_json::from_slice(&letter.value).ok()?;
    // A record a sink refused is already the transforms' output: it goes straight to the
    // sink again.
    let first = if body.get("sink_uid").is_some_and(serde_json::Value::is_string) {
        plan.plan.stages.len()
    } else {
        body["transform_uid"].as_str().and_then(|uid| plan.stage_of(uid)).unwrap_or(0)
    };
    let value = serde_json::to_vec(body.get("record")?).ok()?;
    Some((first, plan::Item { key: letter.key, value: value.into(), origin: 0 }))
}

/// Dataset changes from the shared set store's feed, applied to the runtime's dataset index
/// by their versions (a change this node made and applied already is skipped).
struct FeedDatasets(std::sync::Weak<Runtime>);

#[async_trait::async_trait]
impl sets::DatasetFeedTarget for FeedDatasets {
    async fn apply(&self, entry: sluice_store::DatasetFeedEntry) {
        use sluice_core::datasets::{DatasetChange, DatasetListener as _, DatasetRef};
        use sluice_store::DatasetFeedChange;
        let Some(runtime) = self.0.upgrade() else { return };
        let Some(index) = runtime.dataset_index() else { return };
        let dataset =
            DatasetRef { owner_user_id: &entry.owner_user_id, name: &entry.name, seq: entry.seq };
        let version = entry.version;
        match &entry.change {
            DatasetFeedChange::Created => index.changed(dataset, DatasetChange::Created),
            DatasetFeedChange::Dropped => index.changed(dataset, DatasetChange::Dropped),
            DatasetFeedChange::Added(values) => {
                index.changed(dataset, DatasetChange::Added { version, values });
            }
            DatasetFeedChange::Removed(values) => {
                index.changed(dataset, DatasetChange::Removed { version, values });
            }
            DatasetFeedChange::Reload => {
                if let Err(error) = index.refresh(runtime.store.as_ref()).await {
                    tracing::warn!(%error, "dataset feed: cannot read changed datasets again");
                }
            }
        }
    }
}
