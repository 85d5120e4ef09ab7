//! One owner per pipeline: every change to a pipeline goes through its [`Lifecycle`], one at
//! a time, in the order the changes arrive — an edit of its configuration (and the redeploy a
//! transform edit makes), a deploy, pause, teardown or delete, a dead-letter replay, a
//! filter-value change. Changes of different pipelines never wait for each other.
//!
//! A change holds a [`LifecycleGuard`] from before it reads the pipeline until it is done
//! (the API takes it with [`crate::Runtime::lifecycle`] and passes it along). The guard also
//! keeps other processes' changes of the pipeline out ([`Placement::exclude`]: the
//! pipeline's database lock on a cluster, nothing on a node of its own) until it drops; a
//! filter-value change takes only the turn here ([`crate::Runtime::lifecycle_here`]),
//! because the store orders the writers of a set across nodes itself, and any lifecycle
//! call made on such a guard takes the exclusion first. The guard's lifecycle calls are
//! [`LifecycleGuard::deploy`], [`LifecycleGuard::pause`], [`LifecycleGuard::teardown`] and
//! [`LifecycleGuard::replay_dead_letters`]; what each does, in order:
//!
//! - **deploy**: compile the pipeline (a 422 changes nothing), create
//!   the sink, dead-letter and log topics and pin the source offsets of partitions never
//!   read at the stream's end (so records appended right after the answer are delivered),
//!   store the deployment, then let the placement run it and answer once it runs.
//! - **pause**: stop the workers here and store the pause (together, so nothing starts them
//!   in between), then wait until no node runs one.
//! - **teardown**: the same pause first (a teardown cut short leaves the pipeline paused;
//!   tearing it down again finishes it), wait until no node holds its topics open, delete
//!   its topics, consumer group and stored deployment, release its set indexes, and tell the
//!   other nodes.
//! - **replay**: feed the dead letters through the running (or stored) configuration
//!   ([`crate::delivery::replay`]); the pipeline's other changes wait for it.
//!
//! Each owner also holds the pipeline's workers running in this process. Those are taken
//! separately and briefly (by the call that starts or stops them, and by a cluster's rounds,
//! which must follow other nodes' changes while a change here waits for the database lock),
//! so health, stats and `/metrics`, which read [`Node::views`], never wait on a change.

use std::collections::HashMap;
use std::sync::Arc;

use sluice_bus::topics;
use sluice_core::deployment::{DeploymentRecord, DeploymentState};
use sluice_core::pipeline::Pipeline;
use sluice_store::ClusterLock;
use tokio::sync::{Mutex, MutexGuard, OwnedMutexGuard};

use crate::delivery::{self, Replayed};
use crate::deployment::Running;
use crate::node::Node;
use crate::placement::{Placement, pipeline_topics};
use crate::plan::Plan;
use crate::{Deployed, Paused, Result, sinks};

/// Every pipeline's owner in this process, by pipeline id. An owner stays for the life of
/// the process (a few hundred bytes per pipeline ever touched), so two changes of one
/// pipeline can never hold different owners.
#[derive(Default)]
pub(crate) struct Lifecycles(std::sync::Mutex<HashMap<String, Arc<Lifecycle>>>);

impl Lifecycles {
    /// The owner of `pipeline_id`, made on first use. The map's lock is held only here,
    /// never across an await.
    pub(crate) fn get(&self, pipeline_id: &str) -> Arc<Lifecycle> {
        self.0
            .lock()
            .expect("lifecycle map lock is never poisoned")
            .entry(pipeline_id.to_owned())
            .or_insert_with(|| Arc::new(Lifecycle::new(pipeline_id)))
            .clone()
    }

    /// Every owner made so far.
    pub(crate) fn all(&self) -> Vec<Arc<Lifecycle>> {
        self.0.lock().expect("lifecycle map lock is never poisoned").values().cloned().collect()
    }
}

/// The owner of one pipeline: the turn its changes take, and its workers running here.
pub(crate) struct Lifecycle {
    pipeline_id: String,
    /// Held by a change from start to end; tokio's mutex is fair, so changes go in the order
    /// they arrived.
    turn: Arc<Mutex<()>>,
    /// The pipeline's workers running here (`None`: none).
    running: Mutex<Option<Running>>,
}

impl Lifecycle {
    fn new(pipeline_id: &str) -> Self {
        Self {
            pipeline_id: pipeline_id.to_owned(),
            turn: Arc::default(),
            running: Mutex::new(None),
        }
    }

    pub(crate) fn pipeline_id(&self) -> &str {
        &self.pipeline_id
    }

    /// The pipeline's workers here, held while they are started, changed or stopped.
    pub(crate) async fn running(&self) -> MutexGuard<'_, Option<Running>> {
        self.running.lock().await
    }
}

/// A change of one pipeline in progress: the pipeline's other changes wait until it drops.
pub struct LifecycleGuard {
    owner: Arc<Lifecycle>,
    node: Arc<Node>,
    placement: Arc<dyn Placement>,
    _turn: OwnedMutexGuard<()>,
    /// Whether other nodes' changes are kept out yet (taken by the first lifecycle call).
    excluded: bool,
    /// What keeps them out until the guard drops (`None` on a node of its own).
    _exclusion: Option<ClusterLock>,
}

impl std::fmt::Debug for LifecycleGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LifecycleGuard")
            .field("pipeline_id", &self.owner.pipeline_id)
            .field("excluded", &self.excluded)
            .finish_non_exhaustive()
    }
}

impl LifecycleGuard {
    /// Waits for the turn of `pipeline_id`'s change.
    pub(crate) async fn take(
        node: Arc<Node>,
        placement: Arc<dyn Placement>,
        pipeline_id: &str,
    ) -> Self {
        let owner = node.lifecycles.get(pipeline_id);
        let turn = owner.turn.clone().lock_owned().await;
        Self { owner, node, placement, _turn: turn, excluded: false, _exclusion: None }
    }

    /// The pipeline this change is of.
    pub fn pipeline_id(&self) -> &str {
        &self.owner.pipeline_id
    }

    /// Keeps other nodes' changes of the pipeline out until this guard drops.
    pub(crate) async fn exclude_others(&mut self) -> Result<()> {
        if !self.excluded {
            self._exclusion = self.placement.exclude(&self.owner.pipeline_id).await?;
            self.excluded = true;
        }
        Ok(())
    }

    /// Deploys `pipeline` (the guard's): not deployed → deployed, reading from the stream's
    /// end; paused → deployed, resuming from the kept offsets; deployed → deployed with the
    /// new configuration at a batch boundary, no gap in offsets. Idempotent.
    ///
    /// # Errors
    /// A configuration the runtime cannot run (nothing changed then), or a store or log
    /// failure.
    pub async fn deploy(&mut self, pipeline: &Pipeline) -> Result<Deployed> {
        let result = self.deploy_steps(pipeline).await;
        crate::events::lifecycle::deployed(&self.node, pipeline, &result);
        result
    }

    async fn deploy_steps(&mut self, pipeline: &Pipeline) -> Result<Deployed> {
        debug_assert_eq!(pipeline.id, self.owner.pipeline_id, "a guard deploys its own pipeline");
        let node = self.node.clone();
        let (plan, uses) = node.compile(pipeline).await?;
        // A sink that cannot work as configured (its database unreachable, a table it
        // cannot write) is refused here, before anything changes.
        for sink in &plan.sinks {
            sink.prepare().await.map_err(crate::PlanError::Sink)?;
            sink.check_connection().await.map_err(crate::PlanError::from)?;
        }
        self.exclude_others().await?;
        let now = node.clock.now();
        let existing = node.store.deployment(&pipeline.id).await?;
        node.create_pipeline_topics(&plan).await?;
        node.pin_start_offsets(&plan).await?;
        let record = DeploymentRecord {
            pipeline_id: pipeline.id.clone(),
            state: DeploymentState::Deployed,
            pipeline: pipeline.clone(),
            deployed_at: existing.as_ref().map_or(now, |e| e.deployed_at),
            updated_at: now,
        };
        node.store.put_deployment(&record).await?;
        let sinks = self.connections(&plan);
        let was_deployed = existing.is_some_and(|e| e.state == DeploymentState::Deployed);
        let was_running =
            self.placement.deploy(&self.owner, &record, was_deployed, plan, uses).await?;
        tracing::info!(config_id = %pipeline.id, was_running, "pipeline deployed");
        Ok(Deployed { sinks, was_running })
    }

    /// How a consumer reaches each sink of `plan`, in the pipeline's order.
    fn connections(&self, plan: &Plan) -> Vec<sinks::SinkConnection> {
        plan.sinks
            .iter()
            .map(|sink| {
                let mut connection = sink.connection(&plan.pipeline_id);
                let topic = sink.managed_topic();
                if let Some(access) = topic.and_then(|topic| self.node.log.client_access(topic)) {
                    sinks::managed::add_kafka_access(&mut connection, &access);
                }
                connection
            })
            .collect()
    }

    /// Pauses a deployed pipeline: its workers finish their batch and stop; offsets, sinks
    /// and topics stay. No effect on a pipeline that is not deployed.
    ///
    /// # Errors
    /// A store failure.
    pub async fn pause(&mut self) -> Result<Paused> {
        self.exclude_others().await?;
        let (node, id) = (self.node.clone(), self.owner.pipeline_id.as_str());
        let mut running = self.owner.running().await;
        let Some(mut record) = node.store.deployment(id).await? else {
            return Ok(Paused::NotDeployed);
        };
        if record.state == DeploymentState::Paused {
            return Ok(Paused::AlreadyPaused);
        }
        node.stop_running(id, &mut running).await;
        record.state = DeploymentState::Paused;
        record.updated_at = node.clock.now();
        node.store.put_deployment(&record).await?;
        drop(running);
        self.placement.await_stopped(id).await;
        tracing::info!(config_id = %id, "pipeline paused");
        crate::events::lifecycle::changed(&node, &record.pipeline, "pipeline.paused");
        Ok(Paused::Paused)
    }

    /// Tears the deployment down: workers stop, its sink topics and source offsets are
    /// removed (the next deploy reads from the stream's end), the configuration stays. True
    /// when there was a deployment.
    ///
    /// # Errors
    /// A store or log failure.
    pub async fn teardown(&mut self) -> Result<bool> {
        self.exclude_others().await?;
        let (node, id) = (self.node.clone(), self.owner.pipeline_id.as_str());
        let mut running = self.owner.running().await;
        node.stop_running(id, &mut running).await;
        let Some(mut record) = node.store.deployment(id).await? else {
            return Ok(false);
        };
        if record.state == DeploymentState::Deployed {
            // Paused first: a teardown cut short leaves the pipeline paused, and tearing it
            // down again finishes it.
            record.state = DeploymentState::Paused;
            record.updated_at = node.clock.now();
            node.store.put_deployment(&record).await?;
        }
        drop(running);
        // Every worker stops (and commits) before the topics and offsets go.
        self.placement.await_stopped(id).await;
        self.placement.await_released(&pipeline_topics(&record)).await;
        for (_, topic) in &Plan::managed_topics(&record.pipeline) {
            node.log.delete_topic(topic).await?;
        }
        node.log.delete_topic(&topics::dead_letter_topic(id)).await?;
        node.log.delete_topic(&topics::logs_topic(id)).await?;
        node.log.delete_group(&topics::deployment_group(id)).await?;
        node.store.delete_deployment(id).await?;
        node.sets.release_pipeline(id);
        self.placement.announce().await;
        tracing::info!(config_id = %id, "pipeline torn down");
        crate::events::lifecycle::changed(&node, &record.pipeline, "pipeline.torn_down");
        Ok(true)
    }

    /// Feeds the dead letters not replayed yet through the pipeline's current transforms
    /// (`delivery::replay`). `None` when the pipeline is not deployed; works on a paused
    /// pipeline too. The pipeline's other changes wait: a teardown must not remove the
    /// topics under the replay.
    ///
    /// # Errors
    /// A store or log failure.
    pub async fn replay_dead_letters(&mut self) -> Result<Option<Replayed>> {
        self.exclude_others().await?;
        let (node, id) = (self.node.clone(), self.owner.pipeline_id.as_str());
        let Some(record) = node.store.deployment(id).await? else { return Ok(None) };
        let running = self.owner.running().await.as_ref().map(Running::plan);
        let plan = match running {
            Some(plan) => plan,
            None => node.bind(node.compile(&record.pipeline).await?.0).await?,
        };
        let report = delivery::replay(&node.log, node.clock.as_ref(), &plan).await?;
        tracing::info!(config_id = %id, ?report, "dead letters replayed");
        crate::events::lifecycle::replayed(&node, &record.pipeline, &report);
        Ok(Some(report))
    }
}
