//! Where a pipeline's workers run: the [`Placement`] role, with [`LocalPlacement`] (a node
//! of its own runs every worker, and changes them when a lifecycle call says so) and
//! [`ClusterPlacement`] (the desired state in the database, each node running its share of
//! every deployment and following the others' changes: [`cluster`]).
//!
//! The lifecycle owners ([`crate::lifecycle`]) call a placement at fixed points of each call
//! and never ask which one they have.

mod cluster;
mod local;

use async_trait::async_trait;
use sluice_core::datasets::DatasetListener;
use sluice_core::deployment::DeploymentRecord;
use sluice_store::ClusterLock;

pub(crate) use cluster::ClusterPlacement;
pub use cluster::{ClusterSettings, NodeInfo};
pub(crate) use local::LocalPlacement;

use crate::Result;
use crate::datasets::DatasetIndex;
use crate::health::WorkerStatus;
use crate::lifecycle::Lifecycle;
use crate::node::SecretUse;
use crate::plan::Plan;

/// Where workers run, and how a lifecycle call reaches them.
#[async_trait]
pub(crate) trait Placement: Send + Sync + 'static {
    /// Keeps other processes' changes of `pipeline_id` out until the answer drops: the
    /// pipeline's database lock on a cluster; nothing on a node of its own, whose lifecycle
    /// owner is the only one.
    ///
    /// # Errors
    /// A store failure.
    async fn exclude(&self, pipeline_id: &str) -> Result<Option<ClusterLock>>;

    /// Runs `record`, just stored as deployed (`plan` and `uses` compiled from it), where its
    /// workers belong, and answers once they run it: a redeploy of the same shape swaps the
    /// plan at the workers' next batch boundary; otherwise the old workers finish and commit
    /// their batch and new ones start from the committed offsets. Answers whether the
    /// pipeline was running before (`was_deployed`: whether it was stored as deployed).
    ///
    /// # Errors
    /// A set index that cannot load (a node of its own; a cluster node logs it and goes on
    /// with its next round).
    async fn deploy(
        &self,
        owner: &Lifecycle,
        record: &DeploymentRecord,
        was_deployed: bool,
        plan: Plan,
        uses: SecretUse,
    ) -> Result<bool>;

    /// The pipeline's workers here stopped and its pause is stored: answers once no worker
    /// of it runs anywhere.
    async fn await_stopped(&self, pipeline_id: &str);

    /// Answers once no other process holds any of `topics` open (a teardown deletes them
    /// next, and a Kafka client fetching a deleted topic can crash).
    async fn await_released(&self, topics: &[String]);

    /// The desired state changed without a worker to wait for (a teardown finished): the
    /// other processes hear it now rather than on their next round.
    async fn announce(&self);

    /// The health of each worker of a running deployment, wherever it runs, in slot order.
    fn worker_health(&self, pipeline_id: &str) -> Vec<WorkerStatus>;

    /// The health of every running deployment's workers, by pipeline id.
    fn all_worker_health(&self) -> Vec<(String, Vec<WorkerStatus>)>;

    /// The live nodes, this one first; `None` on a node of its own.
    fn nodes(&self) -> Option<Vec<NodeInfo>>;

    /// Whether the other nodes count this one alive (always, on a node of its own).
    fn in_cluster(&self) -> bool;

    /// What hears the dataset changes made through this process's API, given the index that
    /// answers `beam.contains` here.
    fn dataset_listener(
        &self,
        index: std::sync::Arc<DatasetIndex>,
    ) -> std::sync::Arc<dyn DatasetListener>;

    /// Every worker here stopped for shutdown: the others take this process's work.
    async fn leave(&self);
}

/// Every topic a deployment writes (its managed sinks', dead letters', script logs').
pub(crate) fn pipeline_topics(record: &DeploymentRecord) -> Vec<String> {
    let id = &record.pipeline_id;
    let mut topics: Vec<String> =
        Plan::managed_topics(&record.pipeline).into_iter().map(|(_, topic)| topic).collect();
    topics.push(sluice_bus::topics::dead_letter_topic(id));
    topics.push(sluice_bus::topics::logs_topic(id));
    topics
}

/// The version of a stored deployment: workers running an older one take the newer.
pub(crate) fn version_of(record: &DeploymentRecord) -> String {
    sluice_core::time::format(record.updated_at)
}
