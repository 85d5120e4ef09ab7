//! A node of its own: every worker of every deployment runs in this process, started,
//! changed and stopped by the lifecycle call itself; nothing else needs telling.

use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::datasets::DatasetListener;
use sluice_core::deployment::{DeploymentRecord, DeploymentState};
use sluice_store::ClusterLock;

use super::{NodeInfo, Placement, version_of};
use crate::Result;
use crate::datasets::DatasetIndex;
use crate::deployment::RunningView;
use crate::health::WorkerStatus;
use crate::lifecycle::Lifecycle;
use crate::node::{Node, SecretUse};
use crate::plan::Plan;

/// Every worker here.
pub(crate) struct LocalPlacement {
    node: Arc<Node>,
}

impl LocalPlacement {
    /// Runs again every pipeline that was deployed when the process last stopped (paused
    /// ones stay paused); one that cannot run is logged and left stored as it is.
    ///
    /// # Errors
    /// When the stored deployments cannot be read.
    pub(crate) async fn start(node: Arc<Node>) -> Result<Self> {
        let mut deployed = node
            .store
            .list_deployments()
            .await?
            .into_iter()
            .filter(|record| record.state == DeploymentState::Deployed);
        // A node restarted with a thousand deployed pipelines runs them again within
        // seconds: several at a time, as each waits mostly on its own store reads and set
        // load.
        let mut resuming = tokio::task::JoinSet::new();
        loop {
            while resuming.len() < RESUME_AT_ONCE {
                let Some(record) = deployed.next() else { break };
                resuming.spawn(resume(node.clone(), record));
            }
            match resuming.join_next().await {
                None => break,
                Some(Ok(())) => {}
                Some(Err(error)) => tracing::error!(%error, "resuming a deployed pipeline failed"),
            }
        }
        Ok(Self { node })
    }
}

/// Deployed pipelines [`LocalPlacement::start`] resumes at once.
const RESUME_AT_ONCE: usize = 16;

/// Runs a stored deployment again; one that cannot run is logged and left stored as it is.
async fn resume(node: Arc<Node>, record: DeploymentRecord) {
    let owner = node.lifecycles.get(&record.pipeline_id);
    let mut running = owner.running().await;
    let started = async {
        let (plan, uses) = node.compile(&record.pipeline).await?;
        // Deployed by an older version, it may lack a topic this one writes.
        node.create_pipeline_topics(&plan).await?;
        node.pin_start_offsets(&plan).await?;
        let bound = node.bind(plan).await?;
        let version = version_of(&record);
        Ok::<_, crate::RuntimeError>((node.start_workers(&record.pipeline, bound, version), uses))
    };
    match started.await {
        Ok((workers, uses)) => {
            node.set_running(&record.pipeline_id, &mut running, workers, uses);
            tracing::info!(config_id = %record.pipeline_id, "resumed deployed pipeline");
        }
        Err(error) => {
            tracing::error!(%error, config_id = %record.pipeline_id, "cannot resume deployed pipeline");
        }
    }
}

#[async_trait]
impl Placement for LocalPlacement {
    async fn exclude(&self, _pipeline_id: &str) -> Result<Option<ClusterLock>> {
        Ok(None)
    }

    async fn deploy(
        &self,
        owner: &Lifecycle,
        record: &DeploymentRecord,
        _was_deployed: bool,
        plan: Plan,
        uses: SecretUse,
    ) -> Result<bool> {
        let node = &self.node;
        let (id, pipeline) = (&record.pipeline_id, &record.pipeline);
        let version = version_of(record);
        let source = plan.source.clone();
        let bound = node.bind(plan).await?;
        let mut running = owner.running().await;
        if node.is_shut_down() {
            // Shutdown stops what runs and starts nothing after (checked under the slot, which
            // shutdown takes after raising the flag): the stored deployment runs at the next
            // start.
            return Ok(running.is_some());
        }
        let was_running = match running.as_mut() {
            Some(current)
                if current.workers() == pipeline.pod_size.workers()
                    && current.source() == source =>
            {
                node.replace_plan(id, current, bound, version, uses);
                true
            }
            Some(_) => {
                node.stop_running(id, &mut running).await;
                let started = node.start_workers(pipeline, bound, version);
                node.set_running(id, &mut running, started, uses);
                true
            }
            None => {
                let started = node.start_workers(pipeline, bound, version);
                node.set_running(id, &mut running, started, uses);
                false
            }
        };
        Ok(was_running)
    }

    async fn await_stopped(&self, _pipeline_id: &str) {}

    async fn await_released(&self, _topics: &[String]) {}

    async fn announce(&self) {}

    fn worker_health(&self, pipeline_id: &str) -> Vec<WorkerStatus> {
        self.node.views().get(pipeline_id).map(RunningView::health).unwrap_or_default()
    }

    fn all_worker_health(&self) -> Vec<(String, Vec<WorkerStatus>)> {
        let mut all: Vec<(String, Vec<WorkerStatus>)> =
            self.node.views().iter().map(|(id, view)| (id.clone(), view.health())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    fn nodes(&self) -> Option<Vec<NodeInfo>> {
        None
    }

    fn in_cluster(&self) -> bool {
        true
    }

    fn dataset_listener(&self, index: Arc<DatasetIndex>) -> Arc<dyn DatasetListener> {
        index
    }

    async fn leave(&self) {}
}
