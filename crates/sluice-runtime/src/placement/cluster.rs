//! The cluster placement ([`ClusterPlacement`]): several `sluice serve` nodes on one
//! PostgreSQL and one Kafka cluster — who is alive, which node runs which worker of each
//! deployment, and how a node follows the desired state.
//!
//! - **Desired state** is the `deployments` table: deployed (with the pipeline as deployed
//!   and its `updated_at`, the *version*), paused, or gone. Lifecycle calls change it under
//!   the pipeline's cluster lock ([`sluice_store::NodeStore::cluster_lock`], which the
//!   pipeline's lifecycle owner takes through [`Placement::exclude`]), then signal the
//!   other nodes (`NOTIFY`).
//! - **Nodes** write a heartbeat row every [`ClusterSettings::heartbeat`] with a report of
//!   the workers they run; a node whose row is older than [`ClusterSettings::node_timeout`]
//!   (by the database's clock) is dead.
//! - **Assignment**: a deployment has `workers(pod_size)` slots; slot `i` of deployment `d`
//!   belongs to live node `(h(d) + i) mod n` of the `n` live nodes sorted by name, so each
//!   deployment's slots spread evenly and deployments start on different nodes. Worker `i`
//!   reads partitions `p` with `p mod workers = i`, on whichever node it runs.
//! - **Handoff**: a node starts a slot only once no other live node reports running a
//!   worker of that deployment on it (or any worker of another pod size), so a slot runs on
//!   one node at a time: the old owner finishes its batch, commits and reports it stopped;
//!   the new owner then reads from that commit. A node that dies stops reporting; after
//!   `node_timeout` its slots move.
//! - **Following**: every node reconciles its workers with the desired state every
//!   heartbeat interval, and at once when signalled. The heartbeat is written on a task of
//!   its own, so a round that waits on the broker does not make a running node look dead. A
//!   node that cannot write its heartbeat for `node_timeout` while it knew other live nodes
//!   stops its workers (the others take them over), so a node cut off from PostgreSQL does
//!   not go on running work that moved.
//!
//! The nodes' state and the assignment are in [`membership`], the heartbeat and the stop for
//! want of one in [`liveness`]; this file is the placement that acts on them (rounds,
//! reconciling).

mod liveness;
mod membership;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use sluice_core::deployment::{DeploymentRecord, DeploymentState};
use sluice_core::pipeline::Pipeline;

use async_trait::async_trait;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use sluice_core::datasets::DatasetListener;
use sluice_store::{ClusterLock, MetadataStore};

pub(crate) use self::membership::{Cluster, NodeReport, Peer, ReportedWorker, assigned_slots};
pub use self::membership::{ClusterSettings, NodeInfo};
use self::membership::{FULL_READ_EVERY, Records, parse_report};
use super::{Placement, pipeline_topics, version_of};
use crate::Result;
use crate::datasets::DatasetIndex;
use crate::deployment::Running;
use crate::health::WorkerStatus;
use crate::lifecycle::Lifecycle;
use crate::node::{Node, SecretUse};
use crate::plan::Plan;

/// How many deployments a round brings in line at once.
const RECONCILE_TOGETHER: usize = 16;

/// This node's share of every deployment, following the desired state in the database.
pub(crate) struct ClusterPlacement {
    node: Arc<Node>,
    cluster: Cluster,
}

impl ClusterPlacement {
    /// Joins the cluster: the deployments run as the cluster assigns them, from the first
    /// round on, and a filter-value change made here wakes the other nodes to refresh their
    /// indexes.
    pub(crate) fn start(node: Arc<Node>, settings: ClusterSettings) -> Arc<Self> {
        let store = node.store.clone();
        node.sets.on_change(Arc::new(move || signal_in_background(&store)));
        let cluster = Cluster::new(settings, node.clock.now());
        let placement = Arc::new(Self { node, cluster });
        tokio::spawn(follow(Arc::downgrade(&placement)));
        placement
    }

    /// Wakes the other nodes to follow a change of the desired state, after telling them
    /// what runs here now.
    async fn signal_cluster(&self) {
        self.heartbeat().await;
        if let Err(error) = self.node.store.signal_cluster().await {
            tracing::warn!(%error, "cannot signal the other nodes; they follow on their next heartbeat");
        }
    }

    /// This node's report: the workers it runs, the topics it holds open.
    fn node_report(&self) -> NodeReport {
        let cluster = &self.cluster;
        NodeReport {
            address: cluster.settings.address.clone(),
            started_at: Some(cluster.started_at),
            workers: self.local_workers(),
            open_topics: self.node.log.open_topics(),
        }
    }

    /// The workers this node runs, by pipeline and slot.
    fn local_workers(&self) -> Vec<ReportedWorker> {
        let cluster = &self.cluster;
        let views = self.node.views();
        let mut workers = Vec::new();
        for (pipeline_id, view) in views.iter() {
            for (slot, mut health) in view.slots() {
                health.node = Some(cluster.name().to_owned());
                workers.push(ReportedWorker {
                    pipeline_id: pipeline_id.clone(),
                    slot,
                    workers: view.workers(),
                    version: view.version().to_owned(),
                    health,
                });
            }
        }
        workers.sort_by(|a, b| (&a.pipeline_id, a.slot).cmp(&(&b.pipeline_id, b.slot)));
        workers
    }

    /// Reads the other nodes' rows.
    pub(crate) async fn refresh_peers(&self) -> bool {
        let cluster = &self.cluster;
        let beats = match self.node.store.node_beats().await {
            Ok(beats) => beats,
            Err(error) => {
                tracing::warn!(%error, "cannot read the cluster's nodes");
                return false;
            }
        };
        // Every node's age each round; a report only when its number moved (reports change
        // when workers start, stop or change state, not every heartbeat).
        let known = cluster.known_reports();
        let mut peers = Vec::with_capacity(beats.len());
        for beat in beats.into_iter().filter(|beat| beat.name != cluster.settings.node_name) {
            let (report_seq, report) = match known.get(&beat.name) {
                Some((seq, report)) if *seq == beat.report_seq => (*seq, report.clone()),
                _ => match self.node.store.node_report(&beat.name).await {
                    Ok(Some((seq, json))) => (seq, parse_report(&beat.name, &json)),
                    Ok(None) => continue, // gone since the ages were read
                    Err(error) => {
                        tracing::warn!(%error, "cannot read the cluster's nodes");
                        return false;
                    }
                },
            };
            let age = Duration::from_millis(u64::try_from(beat.age_ms).unwrap_or(0));
            peers.push(Peer { name: beat.name, age, report, report_seq });
        }
        cluster.set_peers(peers);
        true
    }

    /// One round of following the desired state: read the others, bring every deployment's
    /// workers here in line, and tell the others when that changed anything. (The heartbeat
    /// is written apart, see `beat`: a round may wait on the broker for longer than the node
    /// timeout.)
    pub(crate) async fn cluster_round(&self) {
        if self.counted_dead() {
            // The others take this node's work: start nothing here (the heartbeat stops
            // what runs, see `beat`).
            return;
        }
        if !self.refresh_peers().await {
            return;
        }
        self.refresh_indexes().await;
        let Some((records, gone)) = self.desired_state().await else { return };
        let seen: BTreeSet<&str> = records.iter().map(|r| r.pipeline_id.as_str()).collect();
        // A paused or gone pipeline's topics may be deleted by a teardown on another node:
        // nothing stays open on them here.
        let mut idle_topics: BTreeSet<String> = gone.iter().flat_map(pipeline_topics).collect();
        idle_topics.extend(
            records
                .iter()
                .filter(|r| r.state != DeploymentState::Deployed)
                .flat_map(pipeline_topics),
        );
        let stopped: Vec<String> =
            self.node.views().keys().filter(|id| !seen.contains(id.as_str())).cloned().collect();
        // Side by side: one pipeline that takes long (its workers finishing a batch against
        // a broker that does not answer) does not hold back the start of the others, such
        // as those of a node that just died.
        let wanted: Vec<(&str, Option<&DeploymentRecord>)> = records
            .iter()
            .map(|record| (record.pipeline_id.as_str(), Some(record)))
            .chain(stopped.iter().map(|id| (id.as_str(), None)))
            .collect();
        let mut wanted = wanted.into_iter();
        let mut going = FuturesUnordered::new();
        for (id, record) in wanted.by_ref().take(RECONCILE_TOGETHER) {
            going.push(self.reconcile(id, record));
        }
        let mut changed = false;
        while let Some(one) = going.next().await {
            changed |= one;
            if let Some((id, record)) = wanted.next() {
                going.push(self.reconcile(id, record));
            }
        }
        for topic in self.node.log.open_topics() {
            if idle_topics.contains(&topic) {
                self.node.log.release_topic(&topic).await;
                changed = true;
            }
        }
        if changed {
            self.signal_cluster().await;
        }
    }

    /// Takes in the filter values and datasets changed through other nodes.
    async fn refresh_indexes(&self) {
        if let Err(error) = self.node.sets.refresh().await {
            tracing::warn!(%error, "cannot refresh the set-filter indexes");
        }
        if let Some(index) = self.node.dataset_index()
            && let Err(error) = index.refresh_if_changed(self.node.store.as_ref()).await
        {
            tracing::warn!(%error, "cannot refresh the dataset index");
        }
    }

    /// Every stored deployment, and those gone since the last round: the versions read, and
    /// a record read again only when its version or state moved. `None` when the store
    /// fails (what was known stays known).
    async fn desired_state(&self) -> Option<(Records, Vec<DeploymentRecord>)> {
        let cluster = &self.cluster;
        // Read first: a write after it moves it again for the next round.
        let seq = match self.node.store.deployments_seq().await {
            Ok(seq) => Some(seq),
            Err(error) => {
                tracing::warn!(%error, "cannot read the deployments number");
                None
            }
        };
        {
            let unchanged = cluster.unchanged.lock().expect("unchanged lock is never poisoned");
            if let (Some(seq), Some((known, records, read_at))) = (seq, &*unchanged)
                && *known == seq
                && read_at.elapsed() < FULL_READ_EVERY
            {
                return Some((Arc::clone(records), Vec::new()));
            }
        }
        let versions = match self.node.store.deployment_versions().await {
            Ok(versions) => versions,
            Err(error) => {
                tracing::warn!(%error, "cannot read the desired state");
                return None;
            }
        };
        let mut known =
            std::mem::take(&mut *cluster.records.lock().expect("records lock is never poisoned"));
        let mut records = Vec::with_capacity(versions.len());
        let mut failed = false;
        for (id, state, version) in versions {
            let current = known
                .remove(&id)
                .filter(|record| record.state == state && version_of(record) == version);
            let record = match current {
                Some(record) => Some(record),
                None => match self.node.store.deployment(&id).await {
                    Ok(record) => record,
                    Err(error) => {
                        tracing::warn!(%error, config_id = %id, "cannot read a deployment");
                        failed = true;
                        None
                    }
                },
            };
            records.extend(record);
        }
        let mut now_known: BTreeMap<String, DeploymentRecord> =
            records.iter().map(|record| (record.pipeline_id.clone(), record.clone())).collect();
        if failed {
            // A deployment that could not be read is not taken for gone.
            now_known.append(&mut known);
            *cluster.records.lock().expect("records lock is never poisoned") = now_known;
            *cluster.unchanged.lock().expect("unchanged lock is never poisoned") = None;
            return None;
        }
        *cluster.records.lock().expect("records lock is never poisoned") = now_known;
        let records = Arc::new(records);
        *cluster.unchanged.lock().expect("unchanged lock is never poisoned") =
            seq.map(|seq| (seq, Arc::clone(&records), Instant::now()));
        Some((records, known.into_values().collect()))
    }

    /// Brings the workers of one deployment on this node in line with its stored `record`
    /// (`None`: not deployed). True when what this node reports changed: a worker started
    /// or stopped, or its workers took a newer deployment.
    pub(crate) async fn reconcile(
        &self,
        pipeline_id: &str,
        record: Option<&DeploymentRecord>,
    ) -> bool {
        let cluster = &self.cluster;
        let owner = self.node.lifecycles.get(pipeline_id);
        let mut running = owner.running().await;
        // A node shutting down starts nothing.
        let record = record.filter(|_| !self.node.is_shut_down());
        let Some(record) = record.filter(|r| r.state == DeploymentState::Deployed) else {
            let was = running.is_some();
            self.node.stop_running(pipeline_id, &mut running).await;
            return was;
        };
        let pipeline = &record.pipeline;
        let workers = pipeline.pod_size.workers();
        let version = version_of(record);
        let mine = assigned_slots(pipeline_id, workers, &cluster.live_names(), cluster.name());
        let mut changed = false;
        if running.as_ref().is_some_and(|current| current.version() != version) {
            changed = self.take_new_version(pipeline_id, pipeline, &version, &mut running).await;
        }
        if running.is_none() && !mine.is_empty() {
            let started = async {
                let (plan, uses) = self.node.compile(pipeline).await?;
                let bound = self.node.bind(plan).await?;
                Ok::<_, crate::RuntimeError>((
                    self.node.new_running(pipeline, bound, version.clone()),
                    uses,
                ))
            };
            match started.await {
                Ok((fresh, uses)) => self.node.set_running(pipeline_id, &mut running, fresh, uses),
                Err(error) => {
                    tracing::error!(%error, config_id = %pipeline_id, "cannot run deployment here");
                    return changed;
                }
            }
        }
        let Some(current) = running.as_mut() else { return changed };
        let here: BTreeSet<usize> = current.slots().into_iter().collect();
        let wanted: BTreeSet<usize> = mine.iter().copied().collect();
        let leaving: Vec<usize> = here.difference(&wanted).copied().collect();
        if !leaving.is_empty() {
            current.stop_slots(&leaving).await;
            changed = true;
        }
        for slot in wanted.difference(&here) {
            if !cluster.taken_elsewhere(pipeline_id, *slot, workers) {
                current.start_slot(*slot);
                changed = true;
            }
        }
        if current.slots().is_empty() && mine.is_empty() {
            self.node.stop_running(pipeline_id, &mut running).await;
        } else if changed {
            self.node.show(pipeline_id, current);
        }
        if changed {
            tracing::info!(config_id = %pipeline_id, slots = ?running.as_ref().map(|r| r.slots()), "this node's workers changed");
        }
        changed
    }

    /// A newer deployment of a deployment `running` here: the new plan at the next batch
    /// boundary when the workers keep their number and source, else the workers stop (the
    /// caller starts new ones). True when something changed.
    async fn take_new_version(
        &self,
        pipeline_id: &str,
        pipeline: &Pipeline,
        version: &str,
        running: &mut Option<Running>,
    ) -> bool {
        let (plan, uses) = match self.node.compile(pipeline).await {
            Ok(compiled) => compiled,
            Err(error) => {
                tracing::error!(%error, config_id = %pipeline_id, "cannot run the new deployment here");
                return false;
            }
        };
        let workers = pipeline.pod_size.workers();
        let same_shape = running
            .as_ref()
            .is_some_and(|current| current.workers() == workers && current.source() == plan.source);
        if !same_shape {
            self.node.stop_running(pipeline_id, running).await;
            return true;
        }
        match self.node.bind(plan).await {
            Ok(bound) => {
                if let Some(current) = running.as_mut() {
                    current.replace_plan(bound, version.to_owned());
                }
                self.node.secret_uses_mut().insert(pipeline_id.to_owned(), uses);
                true
            }
            Err(error) => {
                tracing::error!(%error, config_id = %pipeline_id, "cannot run the new deployment here");
                false
            }
        }
    }

    /// Waits until the reports of every live node (this one's included) are what `done`
    /// asks, or the converge timeout passes; false on timeout.
    pub(crate) async fn converge(&self, done: impl Fn(&[NodeReport]) -> bool) -> bool {
        let cluster = &self.cluster;
        let deadline = Instant::now() + cluster.settings.converge_timeout;
        loop {
            let mut all = vec![self.node_report()];
            all.extend(cluster.live_peers().into_iter().map(|peer| peer.report));
            if done(&all) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.refresh_peers().await;
        }
    }

    /// The workers on every live node, by pipeline id, each pipeline's in slot order.
    pub(crate) fn cluster_workers(&self) -> BTreeMap<String, Vec<WorkerStatus>> {
        let cluster = &self.cluster;
        let mut by_slot: BTreeMap<String, BTreeMap<usize, WorkerStatus>> = BTreeMap::new();
        let peers = cluster.live_peers().into_iter().flat_map(|peer| peer.report.workers);
        // This node's own view comes last: it is the freshest.
        for worker in peers.chain(self.local_workers()) {
            by_slot.entry(worker.pipeline_id).or_default().insert(worker.slot, worker.health);
        }
        by_slot.into_iter().map(|(id, slots)| (id, slots.into_values().collect())).collect()
    }

    /// The live nodes, this one first.
    pub(crate) fn node_infos(&self) -> Vec<NodeInfo> {
        let cluster = &self.cluster;
        let info =
            |name: String, report: NodeReport, last_seen: Duration, is_self: bool| NodeInfo {
                name,
                address: report.address,
                started_at: report.started_at,
                last_seen,
                is_self,
                workers: report
                    .workers
                    .into_iter()
                    .map(|worker| (worker.pipeline_id, worker.health.name))
                    .collect(),
            };
        let mut nodes = vec![info(
            cluster.name().to_owned(),
            self.node_report(),
            cluster.last_heartbeat.lock().expect("heartbeat lock is never poisoned").elapsed(),
            true,
        )];
        for peer in cluster.live_peers() {
            nodes.push(info(peer.name, peer.report, peer.age, false));
        }
        nodes
    }
}

#[async_trait]
impl Placement for ClusterPlacement {
    /// The pipeline's advisory lock in PostgreSQL, so two nodes' changes never interleave.
    async fn exclude(&self, pipeline_id: &str) -> Result<Option<ClusterLock>> {
        Ok(Some(self.node.store.cluster_lock(pipeline_id).await?))
    }

    /// Brings this node's share in line at once (with the freshest view of who is alive,
    /// so the others hear what runs here before they start anything), wakes the others and
    /// waits until every slot runs the new version somewhere.
    async fn deploy(
        &self,
        _owner: &Lifecycle,
        record: &DeploymentRecord,
        was_deployed: bool,
        _plan: Plan,
        _uses: SecretUse,
    ) -> Result<bool> {
        let id = record.pipeline_id.as_str();
        let version = version_of(record);
        self.refresh_peers().await;
        self.reconcile(id, Some(record)).await;
        self.signal_cluster().await;
        let workers = record.pipeline.pod_size.workers();
        let everywhere = self
            .converge(|nodes| {
                let at_version: BTreeSet<usize> = nodes
                    .iter()
                    .flat_map(|node| &node.workers)
                    .filter(|w| w.pipeline_id == id && w.version == version)
                    .map(|w| w.slot)
                    .collect();
                at_version.len() == workers
            })
            .await;
        if !everywhere {
            tracing::warn!(config_id = %id, "not every node runs the deployment yet; they follow it on their next rounds");
        }
        Ok(was_deployed)
    }

    async fn await_stopped(&self, pipeline_id: &str) {
        self.signal_cluster().await;
        let stopped = self
            .converge(|nodes| {
                nodes.iter().flat_map(|node| &node.workers).all(|w| w.pipeline_id != pipeline_id)
            })
            .await;
        if !stopped {
            tracing::warn!(config_id = %pipeline_id, "a node still reports workers of the pipeline");
        }
    }

    async fn await_released(&self, topics: &[String]) {
        let released = self
            .converge(|nodes| {
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

    async fn announce(&self) {
        self.signal_cluster().await;
    }

    fn worker_health(&self, pipeline_id: &str) -> Vec<WorkerStatus> {
        self.cluster_workers().remove(pipeline_id).unwrap_or_default()
    }

    fn all_worker_health(&self) -> Vec<(String, Vec<WorkerStatus>)> {
        self.cluster_workers().into_iter().collect()
    }

    fn nodes(&self) -> Option<Vec<NodeInfo>> {
        Some(self.node_infos())
    }

    fn in_cluster(&self) -> bool {
        self.cluster.heartbeat_fresh()
    }

    /// The index hears the change, the other nodes a signal (their rounds read the changed
    /// datasets again).
    fn dataset_listener(&self, index: Arc<DatasetIndex>) -> Arc<dyn DatasetListener> {
        Arc::new(SignallingDatasets { index, store: self.node.store.clone() })
    }

    /// The others take this node's work at once instead of after the node timeout.
    async fn leave(&self) {
        let stale = i64::try_from(Duration::from_secs(86_400).as_millis()).unwrap_or(i64::MAX);
        if let Err(error) = self.node.store.remove_nodes(Some(self.cluster.name()), stale).await {
            tracing::warn!(%error, "cannot remove this node from the cluster's nodes");
        }
        if let Err(error) = self.node.store.signal_cluster().await {
            tracing::warn!(%error, "cannot signal the other nodes");
        }
    }
}

/// Follows the desired state until the placement goes: the first heartbeat (the others see
/// this node before it starts anything), then heartbeats of their own (`beat`), and a round
/// every heartbeat interval and at once when another node signals or a lifecycle call here
/// asks.
async fn follow(placement: Weak<ClusterPlacement>) {
    let listener = match placement.upgrade() {
        Some(placement) => {
            placement.heartbeat().await;
            tokio::spawn(liveness::beat(Arc::downgrade(&placement)));
            placement.node.store.listen_cluster().await.unwrap_or_else(|error| {
                tracing::warn!(%error, "cannot listen for the other nodes' signals; following on the heartbeat alone");
                None
            })
        }
        None => return,
    };
    let mut listener = listener;
    loop {
        let heartbeat = {
            let Some(placement) = placement.upgrade() else { return };
            if placement.node.is_shut_down() {
                return;
            }
            placement.cluster_round().await;
            let cluster = &placement.cluster;
            let heartbeat = cluster.settings.heartbeat;
            cluster.until_a_peer_may_die().map_or(heartbeat, |expiry| expiry.min(heartbeat))
        };
        let signal = async {
            match listener.as_mut() {
                Some(receiver) => {
                    if receiver.recv().await.is_none() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep(heartbeat) => {}
            () = signal => {}
        }
    }
}

/// A dataset listener of a cluster node: the index hears the change, the other nodes a
/// signal.
struct SignallingDatasets {
    index: Arc<DatasetIndex>,
    store: Arc<dyn MetadataStore>,
}

impl DatasetListener for SignallingDatasets {
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
