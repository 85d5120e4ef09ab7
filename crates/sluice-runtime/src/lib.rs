//! `sluice-runtime` owns running pipelines: the control side — one lifecycle owner per
//! pipeline that serialises every change to it, and the placement that decides where its
//! workers run (this process alone, or a share on each node of a cluster) — and the data
//! side — the workers that read a chain stream, apply the transforms and deliver to the sink
//! under the pipeline's delivery guarantee, the in-memory set-filter indexes that follow
//! filter-value changes live, and the chain-stream topics records are ingested into.
//!
//! Start at [`Runtime`], a thin facade built by [`Runtime::builder`]. A change of a pipeline
//! takes its [`LifecycleGuard`] ([`Runtime::lifecycle`]; the steps of each lifecycle call
//! are in `lifecycle`), which hands the workers to a `placement` (`placement/local.rs` or
//! `placement/cluster.rs`); what runs in this process, and how a stored pipeline becomes
//! workers, is `node`. Workers live in `worker`, set indexes in [`sets`] (loading through
//! the [`sets::SetSource`] seam), the compiled form of a pipeline in [`plan`], and where the
//! records go in [`sinks`] (the [`sinks::Sink`] trait and one module per sink type), fed by
//! [`delivery`] for workers and dead-letter replay alike. Health and counters are read from
//! snapshots and never wait on a lifecycle call. This crate must not depend on the API.

pub mod datasets;
pub mod delivery;
mod deployment;
pub mod events;
pub mod health;
mod lifecycle;
pub mod metrics;
mod node;
mod placement;
pub mod plan;
mod readers;
pub mod sets;
pub mod sinks;
mod worker;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use sluice_bus::{BusError, NewRecord, OffsetRange, Retention, StreamLog, TopicConfig, topics};
use sluice_core::catalog::Catalog;
use sluice_core::clock::Clock;
use sluice_core::datasets::DatasetLookup;
use sluice_core::deployment::DeploymentState;
use sluice_core::pipeline::Pipeline;
use sluice_core::streams::StreamRecord;
use sluice_store::{MetadataStore, Secrets, SecretsError, StoreError};

pub use delivery::Replayed;
pub use deployment::Counters;
pub use health::WorkerStatus;
pub use lifecycle::LifecycleGuard;
use metrics::MetricsHub;
use node::Node;
use placement::{ClusterPlacement, LocalPlacement, Placement};
pub use placement::{ClusterSettings, NodeInfo};
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
    /// Idle workers themselves never poll (`readers`).
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

/// The running side of Sluice, one per process: a facade over this process's pipelines
/// (`Node`), their lifecycle owners and the placement of their workers.
pub struct Runtime {
    node: Arc<Node>,
    placement: Arc<dyn Placement>,
    catalog: Arc<Catalog>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("settings", &self.node.settings).finish_non_exhaustive()
    }
}

/// How a [`Runtime`] starts: what the builder was given.
#[must_use = "a builder does nothing until `start`"]
pub struct RuntimeBuilder {
    store: Arc<dyn MetadataStore>,
    log: Arc<dyn StreamLog>,
    catalog: Arc<Catalog>,
    clock: Arc<dyn Clock>,
    settings: RuntimeSettings,
    set_source: Option<Arc<dyn SetSource>>,
    sink_env: SinkEnv,
    cluster: Option<ClusterSettings>,
    events: Option<Arc<events::Recorder>>,
}

impl RuntimeBuilder {
    /// How workers behave (default: [`RuntimeSettings::default`]).
    pub fn settings(mut self, settings: RuntimeSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Where set-filter indexes load their values from (default: the store).
    pub fn set_source(mut self, source: Arc<dyn SetSource>) -> Self {
        self.set_source = Some(source);
        self
    }

    /// Secrets and the egress address sinks use (default: none).
    pub fn sinks(mut self, sink_env: SinkEnv) -> Self {
        self.sink_env = sink_env;
        self
    }

    /// Runs as a node of a cluster when `cluster` is given: its share of every deployment's
    /// workers, following the desired state that every node's lifecycle calls store (the
    /// store must be PostgreSQL and the log Kafka, shared by every node). Default: a node of
    /// its own, running every worker.
    pub fn cluster(mut self, cluster: Option<ClusterSettings>) -> Self {
        self.cluster = cluster;
        self
    }

    /// Records service events with `recorder` (docs/events.md): lifecycle calls, the
    /// monitor of this process's deployments and nodes, and notification delivery.
    pub fn events(mut self, recorder: Arc<events::Recorder>) -> Self {
        self.events = Some(recorder);
        self
    }

    /// Creates the chain-stream topics of the catalog, follows the shared set store's
    /// change feed when there is one, and places the stored deployments: a node of its own
    /// runs again every pipeline that was deployed when it last stopped (paused ones stay
    /// paused); a cluster node runs its share from its first round on.
    ///
    /// # Errors
    /// When the store or the log fails.
    pub async fn start(self) -> Result<Arc<Runtime>> {
        let store = self.store;
        let source = self.set_source.unwrap_or_else(|| Arc::new(StoreSetSource(store.clone())));
        let sets = Arc::new(SetIndexes::new(source));
        let sink_env = self.sink_env.clone();
        let node =
            Arc::new(Node::new(store, self.log, self.clock, self.settings, sets, self.sink_env));
        create_chain_topics(&node, &self.catalog).await?;
        if let Some(feed) = node.store.set_feed().await? {
            // A shared set store: every node's indexes follow its change feed.
            let datasets = Arc::new(datasets::FeedDatasets(Arc::downgrade(&node)));
            tokio::spawn(sets::follow_feed(Arc::downgrade(&node.sets), datasets, feed));
        }
        let placement: Arc<dyn Placement> = match self.cluster {
            Some(cluster) => ClusterPlacement::start(node.clone(), cluster),
            None => Arc::new(LocalPlacement::start(node.clone()).await?),
        };
        if let Some(recorder) = self.events {
            let _ = node.events.set(recorder.clone());
            events::monitor::Monitor::spawn(&node, &placement, recorder.clone());
            events::notify::spawn(recorder, sink_env);
        }
        Ok(Arc::new(Runtime { node, placement, catalog: self.catalog }))
    }
}

/// Creates every chain-stream topic of `catalog` (idempotent).
async fn create_chain_topics(node: &Node, catalog: &Catalog) -> Result<()> {
    let config = TopicConfig {
        partitions: CHAIN_STREAM_PARTITIONS,
        retention: Retention { max_age: node.settings.hold, max_bytes: None },
    };
    for entry in catalog.entries() {
        let topic = topics::chain_stream(&entry.chain, &entry.entity, false);
        node.log.create_topic(&topic, config).await?;
        if entry.zerolag {
            let topic = topics::chain_stream(&entry.chain, &entry.entity, true);
            node.log.create_topic(&topic, config).await?;
        }
    }
    Ok(())
}

impl Runtime {
    /// A runtime on `store` and `log`, ingesting the streams of `catalog`, with time from
    /// `clock`; [`RuntimeBuilder::start`] starts it.
    pub fn builder(
        store: Arc<dyn MetadataStore>,
        log: Arc<dyn StreamLog>,
        catalog: Arc<Catalog>,
        clock: Arc<dyn Clock>,
    ) -> RuntimeBuilder {
        RuntimeBuilder {
            store,
            log,
            catalog,
            clock,
            settings: RuntimeSettings::default(),
            set_source: None,
            sink_env: SinkEnv::default(),
            cluster: None,
            events: None,
        }
    }

    /// Waits for the turn of a change of `pipeline_id` and answers it: the pipeline's other
    /// changes, in this process and (through the placement: the pipeline's database lock on
    /// a cluster) on every node, wait until the guard drops. Take it before reading what the
    /// change depends on.
    ///
    /// # Errors
    /// A store failure while taking the database lock.
    pub async fn lifecycle(&self, pipeline_id: &str) -> Result<LifecycleGuard> {
        let mut guard = self.lifecycle_here(pipeline_id).await;
        guard.exclude_others().await?;
        Ok(guard)
    }

    /// The turn of a change of `pipeline_id` in this process only: for a filter-value change,
    /// which the store orders across nodes itself (docs/runtime.md, "The control side"). A
    /// lifecycle call made with it keeps the other nodes out from then on.
    pub async fn lifecycle_here(&self, pipeline_id: &str) -> LifecycleGuard {
        LifecycleGuard::take(self.node.clone(), self.placement.clone(), pipeline_id).await
    }

    /// Deploys `pipeline` in a change of its own ([`LifecycleGuard::deploy`]).
    ///
    /// # Errors
    /// As [`LifecycleGuard::deploy`].
    pub async fn deploy(&self, pipeline: &Pipeline) -> Result<Deployed> {
        self.lifecycle(&pipeline.id).await?.deploy(pipeline).await
    }

    /// Pauses a pipeline in a change of its own ([`LifecycleGuard::pause`]).
    ///
    /// # Errors
    /// As [`LifecycleGuard::pause`].
    pub async fn pause(&self, pipeline_id: &str) -> Result<Paused> {
        self.lifecycle(pipeline_id).await?.pause().await
    }

    /// Tears a deployment down in a change of its own ([`LifecycleGuard::teardown`]).
    ///
    /// # Errors
    /// As [`LifecycleGuard::teardown`].
    pub async fn teardown(&self, pipeline_id: &str) -> Result<bool> {
        self.lifecycle(pipeline_id).await?.teardown().await
    }

    /// Replays a pipeline's dead letters in a change of its own
    /// ([`LifecycleGuard::replay_dead_letters`]).
    ///
    /// # Errors
    /// As [`LifecycleGuard::replay_dead_letters`].
    pub async fn replay_dead_letters(&self, pipeline_id: &str) -> Result<Option<Replayed>> {
        self.lifecycle(pipeline_id).await?.replay_dead_letters().await
    }

    /// Checks that `pipeline` could be deployed as it is (its transforms compile, its sinks
    /// build with the secrets they name), without deploying it.
    ///
    /// # Errors
    /// [`RuntimeError::Plan`] naming what is wrong; a store failure.
    pub async fn check_deployable(&self, pipeline: &Pipeline) -> Result<()> {
        self.node.compile(pipeline).await.map(|_| ())
    }

    /// Stops every worker here (each finishes and commits its batch); deployments stay
    /// stored as they are, so the next start runs them again.
    pub async fn shutdown(&self) {
        self.node.shut_down();
        self.node.stop_all().await;
        self.placement.leave().await;
    }

    /// The set indexes, which must hear every filter-value change (give them to the API).
    pub fn set_indexes(&self) -> Arc<SetIndexes> {
        self.node.sets.clone()
    }

    /// The dataset lookup scripts see (`beam.contains`): follows [`Runtime::use_datasets`].
    pub fn datasets(&self) -> Arc<dyn DatasetLookup> {
        self.node.datasets.clone()
    }

    /// Answers scripts' `beam.contains` from `lookup` (the process's dataset index), in
    /// running pipelines too.
    pub fn use_datasets(&self, lookup: Arc<dyn DatasetLookup>) {
        self.node.use_datasets(lookup);
    }

    /// Answers scripts' `beam.contains` from `index` and keeps it current: the returned
    /// listener is what the API tells of dataset changes (on a cluster it also wakes the
    /// other nodes, whose rounds read the changed datasets again).
    pub fn follow_datasets(
        &self,
        index: Arc<datasets::DatasetIndex>,
    ) -> Arc<dyn sluice_core::datasets::DatasetListener> {
        self.node.set_dataset_index(index.clone());
        self.placement.dataset_listener(index)
    }

    /// Where this process's service events go (`None`: it records none).
    pub fn events(&self) -> Option<Arc<events::Recorder>> {
        self.node.events.get().cloned()
    }

    /// The metrics the workers recorded, of every pipeline.
    pub fn metrics(&self) -> &Arc<MetricsHub> {
        &self.node.metrics
    }

    pub fn log(&self) -> &Arc<dyn StreamLog> {
        &self.node.log
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
        self.node.log.append(&topic, records).await?;
        Ok(count)
    }

    /// The stored deployment state of a pipeline (`None`: not deployed).
    ///
    /// # Errors
    /// A store failure.
    pub async fn state(&self, pipeline_id: &str) -> Result<Option<DeploymentState>> {
        Ok(self.node.store.deployment(pipeline_id).await?.map(|record| record.state))
    }

    /// The managed topic of a deployed (or paused) pipeline's sink; `None` when the
    /// pipeline is not deployed or has no such sink.
    ///
    /// # Errors
    /// A store failure.
    pub async fn sink_topic(&self, pipeline_id: &str, sink_uid: &str) -> Result<Option<String>> {
        let Some(record) = self.node.store.deployment(pipeline_id).await? else {
            return Ok(None);
        };
        Ok(plan::Plan::managed_topics(&record.pipeline)
            .into_iter()
            .find(|(uid, _)| uid == sink_uid)
            .map(|(_, topic)| topic))
    }

    /// The dead-letter topic of a deployed (or paused) pipeline; `None` when it is not
    /// deployed.
    ///
    /// # Errors
    /// A store failure.
    pub async fn dead_letter_topic(&self, pipeline_id: &str) -> Result<Option<String>> {
        Ok(self
            .node
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
        delivery::dead_letter_cursor(&self.node.log, pipeline_id).await
    }

    /// The last `limit` lines the pipeline's scripts logged, oldest first (empty when the
    /// pipeline is not deployed).
    ///
    /// # Errors
    /// A log failure.
    pub async fn script_logs(&self, pipeline_id: &str, limit: usize) -> Result<Vec<plan::LogLine>> {
        let log = &self.node.log;
        let topic = topics::logs_topic(pipeline_id);
        let range = match log.offsets(&topic).await {
            Ok(ranges) => ranges.first().copied().unwrap_or(OffsetRange { start: 0, end: 0 }),
            Err(BusError::UnknownTopic(_)) => return Ok(Vec::new()),
            Err(error) => return Err(error.into()),
        };
        let from = range.end.saturating_sub(limit as u64).max(range.start);
        let records = log.read(&topic, 0, from, limit).await?;
        Ok(records.iter().filter_map(|record| serde_json::from_slice(&record.value).ok()).collect())
    }

    /// The counters of a deployment running here. Never waits on a lifecycle call.
    pub async fn counters(&self, pipeline_id: &str) -> Option<Arc<Counters>> {
        self.node.views().get(pipeline_id).map(deployment::RunningView::counters)
    }

    /// The health of each worker of a running deployment, in worker order (on a cluster,
    /// wherever each runs); empty when the pipeline is not deployed or paused. Never waits
    /// on a lifecycle call.
    pub async fn worker_health(&self, pipeline_id: &str) -> Vec<WorkerStatus> {
        self.placement.worker_health(pipeline_id)
    }

    /// The health of the workers of every running deployment, by pipeline id. Never waits
    /// on a lifecycle call.
    pub async fn all_worker_health(&self) -> Vec<(String, Vec<WorkerStatus>)> {
        self.placement.all_worker_health()
    }

    /// The live nodes of the cluster, this one first; `None` on a node of its own.
    pub fn nodes(&self) -> Option<Vec<NodeInfo>> {
        self.placement.nodes()
    }

    /// On a cluster: whether this node wrote its heartbeat within the node timeout (the
    /// others count it alive). Always true on a node of its own.
    pub fn in_cluster(&self) -> bool {
        self.placement.in_cluster()
    }

    /// Uids of the running deployment's sinks that use a secret changed (or deleted) since
    /// its workers started: they run with the old value until the pipeline is redeployed.
    /// Empty when the pipeline does not run.
    ///
    /// # Errors
    /// A store failure.
    pub async fn stale_sinks(&self, pipeline_id: &str) -> Result<Vec<String>> {
        let uses = self.node.secret_uses(pipeline_id);
        let (Some(uses), Some(secrets)) = (uses, self.node.sink_secrets()) else {
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
}
