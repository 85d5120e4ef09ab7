//! Who is in the cluster and who runs what: the settings a node joins with, the reports the
//! nodes exchange each heartbeat, what a node knows of the others ([`Cluster`]), and the
//! assignment of a deployment's slots to the live nodes ([`assigned_slots`]). The parent
//! module acts on this state; nothing here does I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sluice_core::deployment::DeploymentRecord;

use crate::health::WorkerStatus;

/// How a node takes part in a cluster.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// This node's name, unique in the cluster.
    pub node_name: String,
    /// Where this node's API answers (shown by `GET /api/v1/nodes`).
    pub address: String,
    /// How often the node writes its heartbeat and reconciles.
    pub heartbeat: Duration,
    /// A node silent this long is dead: its workers move to the others.
    pub node_timeout: Duration,
    /// How long a lifecycle call waits for every node to follow it before answering.
    pub converge_timeout: Duration,
}

impl ClusterSettings {
    /// Defaults for node `node_name` answering at `address`: heartbeat every second, dead
    /// after 10 s, lifecycle calls wait up to 20 s for the others.
    pub fn new(node_name: impl Into<String>, address: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            address: address.into(),
            heartbeat: Duration::from_secs(1),
            node_timeout: Duration::from_secs(10),
            converge_timeout: Duration::from_secs(20),
        }
    }
}

/// What a node tells the others each heartbeat.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct NodeReport {
    pub address: String,
    pub started_at: Option<DateTime<Utc>>,
    pub workers: Vec<ReportedWorker>,
    /// Topics the node holds readers or a tail open on: a teardown deletes a pipeline's
    /// topics only once no node does (a Kafka client fetching a deleted topic can crash).
    #[serde(default)]
    pub open_topics: Vec<String>,
}

/// One worker a node runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ReportedWorker {
    pub pipeline_id: String,
    pub slot: usize,
    /// The deployment's workers in all (its pod size).
    pub workers: usize,
    /// The stored deployment it runs (`updated_at`).
    pub version: String,
    pub health: WorkerStatus,
}

/// A node as the others see it.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    pub name: String,
    pub age: Duration,
    pub report: NodeReport,
    /// The stored number of `report`: it is read again only when that moves.
    pub report_seq: i64,
}

/// A node of the cluster, for `GET /api/v1/nodes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub address: String,
    pub started_at: Option<DateTime<Utc>>,
    /// Since its last heartbeat.
    pub last_seen: Duration,
    /// The node that answers.
    pub is_self: bool,
    /// `(pipeline id, worker name)` of each worker it runs.
    pub workers: Vec<(String, String)>,
}

/// A node's cluster state.
pub(crate) struct Cluster {
    pub settings: ClusterSettings,
    pub(super) started_at: DateTime<Utc>,
    /// The other nodes, as last read, and when.
    pub(super) peers: RwLock<Vec<Peer>>,
    peers_read: std::sync::Mutex<Instant>,
    /// When this node last wrote its heartbeat.
    pub(super) last_heartbeat: std::sync::Mutex<Instant>,
    /// Each stored deployment as last read, by pipeline id: a round reads only the versions
    /// and then the records that changed (and knows the topics of one that is gone).
    pub(super) records: std::sync::Mutex<BTreeMap<String, DeploymentRecord>>,
    /// The store's deployments number when the deployments were last read, what was read
    /// (in order), and when: while the number stays, a round reads nothing more.
    pub(super) unchanged: std::sync::Mutex<Option<(i64, Records, Instant)>>,
}

/// Every stored deployment as one round read them, shared with the rounds that follow while
/// nothing changed.
pub(super) type Records = Arc<Vec<DeploymentRecord>>;

/// Longest a node goes on the deployments number alone before reading the versions anyway.
pub(super) const FULL_READ_EVERY: Duration = Duration::from_secs(30);

impl Cluster {
    pub(crate) fn new(settings: ClusterSettings, now: DateTime<Utc>) -> Self {
        Self {
            settings,
            started_at: now,
            peers: RwLock::default(),
            peers_read: std::sync::Mutex::new(Instant::now()),
            last_heartbeat: std::sync::Mutex::new(Instant::now()),
            records: std::sync::Mutex::default(),
            unchanged: std::sync::Mutex::default(),
        }
    }

    /// Whether this node wrote its heartbeat within the node timeout.
    pub(crate) fn heartbeat_fresh(&self) -> bool {
        self.last_heartbeat.lock().expect("heartbeat lock is never poisoned").elapsed()
            <= self.settings.node_timeout
    }

    pub(crate) fn name(&self) -> &str {
        &self.settings.node_name
    }

    /// The other nodes alive now.
    pub(crate) fn live_peers(&self) -> Vec<Peer> {
        let peers = self.peers.read().expect("peers lock is never poisoned");
        peers.iter().filter(|peer| peer.age <= self.settings.node_timeout).cloned().collect()
    }

    /// The live nodes' names, this one included, sorted.
    pub(crate) fn live_names(&self) -> Vec<String> {
        let mut names: BTreeSet<String> =
            self.live_peers().into_iter().map(|peer| peer.name).collect();
        names.insert(self.name().to_owned());
        names.into_iter().collect()
    }

    pub(super) fn set_peers(&self, peers: Vec<Peer>) {
        *self.peers.write().expect("peers lock is never poisoned") = peers;
        *self.peers_read.lock().expect("peers read lock is never poisoned") = Instant::now();
    }

    /// How long until the first live peer that writes no further heartbeat counts as dead:
    /// a round then takes its work at once rather than up to a heartbeat later. `None`
    /// with no live peer.
    pub(crate) fn until_a_peer_may_die(&self) -> Option<Duration> {
        let since_read =
            self.peers_read.lock().expect("peers read lock is never poisoned").elapsed();
        let margin = self
            .live_peers()
            .iter()
            .map(|peer| self.settings.node_timeout.saturating_sub(peer.age))
            .min()?;
        // Just past the timeout, so the peer reads as dead then; never a busy loop.
        let until = (margin + Duration::from_millis(20)).saturating_sub(since_read);
        Some(until.max(Duration::from_millis(50)))
    }

    /// The reports of the peers as last read, with their numbers, by name.
    pub(super) fn known_reports(&self) -> BTreeMap<String, (i64, NodeReport)> {
        self.peers
            .read()
            .expect("peers lock is never poisoned")
            .iter()
            .map(|peer| (peer.name.clone(), (peer.report_seq, peer.report.clone())))
            .collect()
    }

    /// Whether another live node runs a worker of `pipeline_id` that a worker of slot
    /// `slot` (of `workers` in all) would overlap: the same slot, or any slot of another
    /// pod size.
    pub(crate) fn taken_elsewhere(&self, pipeline_id: &str, slot: usize, workers: usize) -> bool {
        self.live_peers().iter().any(|peer| {
            peer.report.workers.iter().any(|worker| {
                worker.pipeline_id == pipeline_id
                    && (worker.slot == slot || worker.workers != workers)
            })
        })
    }
}

/// A node's stored report (an unreadable one counts as empty, with a warning).
pub(super) fn parse_report(node: &str, json: &str) -> NodeReport {
    serde_json::from_str(json).unwrap_or_else(|error| {
        tracing::warn!(node, %error, "unreadable node report");
        NodeReport::default()
    })
}

/// The slots of a deployment of `workers` workers that node `me` runs, among `live` nodes
/// (sorted names).
///
/// Rendezvous (highest-random-weight) hashing with even loads: slot by slot, each goes to
/// the node that weighs most for that (deployment, slot) among the nodes not yet holding
/// their share, so no node holds more than one slot above another. A node's death moves
/// only its own slots while a deployment has no more workers than the nodes that stay
/// (every deployment of one worker): the others keep theirs and go on without a stop. A
/// larger deployment may also even out its slots among the others.
pub(crate) fn assigned_slots(
    pipeline_id: &str,
    workers: usize,
    live: &[String],
    me: &str,
) -> Vec<usize> {
    if !live.iter().any(|name| name == me) {
        return Vec::new();
    }
    let (share, above_share) = (workers / live.len(), workers % live.len());
    let mut held = vec![0; live.len()];
    let mut holding_more = 0;
    let mut mine = Vec::new();
    for slot in 0..workers {
        let open =
            |node: usize| held[node] < share || (held[node] == share && holding_more < above_share);
        let chosen = (0..live.len())
            .filter(|&node| open(node))
            .max_by_key(|&node| (slot_weight(pipeline_id, slot, &live[node]), &live[node]))
            .expect("the shares add up to the slots, so one node is always open");
        held[chosen] += 1;
        if held[chosen] > share {
            holding_more += 1;
        }
        if live[chosen] == me {
            mine.push(slot);
        }
    }
    mine
}

/// The weight of `node` for one slot of a deployment: FNV-1a of the three, mixed by
/// SplitMix64's finaliser so that names differing by a byte weigh unrelated amounts.
fn slot_weight(pipeline_id: &str, slot: usize, node: &str) -> u64 {
    let mut key = Vec::with_capacity(pipeline_id.len() + node.len() + 10);
    key.extend_from_slice(pipeline_id.as_bytes());
    key.push(0);
    key.extend_from_slice(node.as_bytes());
    key.push(0);
    key.extend_from_slice(&(slot as u64).to_le_bytes());
    let mut weight = sluice_core::hash::fnv1a(&key);
    weight = (weight ^ (weight >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    weight = (weight ^ (weight >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    weight ^ (weight >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn every_slot_has_exactly_one_node_and_slots_spread_evenly() {
        let live = names(&["a", "b", "c"]);
        for workers in [1, 2, 4, 8] {
            let mut all: Vec<usize> = Vec::new();
            let mut counts = Vec::new();
            for me in &live {
                let mine = assigned_slots("pipeline-x", workers, &live, me);
                counts.push(mine.len());
                all.extend(mine);
            }
            all.sort_unstable();
            assert_eq!(all, (0..workers).collect::<Vec<_>>());
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(max - min <= 1, "{workers} workers over 3 nodes: {counts:?}");
        }
    }

    /// Every node's slots of deployment `id`, by node.
    fn slots_by_node(id: &str, workers: usize, live: &[String]) -> BTreeMap<String, Vec<usize>> {
        live.iter().map(|me| (me.clone(), assigned_slots(id, workers, live, me))).collect()
    }

    /// Over 200 deployments of `workers` workers, each of 4 nodes dying and coming back in
    /// turn: the slots a node other than that one had to stop for no reason of its own (on
    /// the death: one it ran and no longer runs; on the return: one it ran that was not the
    /// returning node's before), and the slots the dying nodes held.
    fn moves_on_death_and_return(workers: usize) -> (usize, usize) {
        let live = names(&["node-0", "node-1", "node-2", "node-3"]);
        let (mut needless, mut dead_held) = (0, 0);
        for dead in &live {
            let after: Vec<String> = live.iter().filter(|name| *name != dead).cloned().collect();
            for i in 0..200 {
                let id = format!("pipeline-{i}");
                let with = slots_by_node(&id, workers, &live);
                let without = slots_by_node(&id, workers, &after);
                dead_held += with[dead].len();
                for other in &after {
                    needless += with[other].iter().filter(|s| !without[other].contains(s)).count();
                    needless += without[other]
                        .iter()
                        .filter(|s| !with[other].contains(s) && !with[dead].contains(s))
                        .count();
                }
            }
        }
        (needless, dead_held)
    }

    #[test]
    fn a_death_moves_only_the_dead_nodes_slots_of_one_worker_deployments() {
        let (needless, dead_held) = moves_on_death_and_return(1);
        assert_eq!(needless, 0);
        assert_eq!(dead_held, 200, "each deployment's slot is on one of the 4 nodes");
    }

    #[test]
    fn a_death_moves_few_other_slots_of_larger_deployments() {
        // Slot by slot with even loads, the dead node's slot can take another's place, which
        // moves on in turn: at most about one other slot for each that had to move, where
        // (hash + slot) mod n moved about four.
        for workers in [2, 3, 4, 8] {
            let (needless, dead_held) = moves_on_death_and_return(workers);
            assert!(
                needless * 4 <= dead_held * 5,
                "{workers} workers: {needless} needless moves for {dead_held} slots of dead nodes"
            );
        }
    }

    #[test]
    fn a_node_not_alive_runs_nothing_and_one_node_runs_everything() {
        assert!(assigned_slots("p", 4, &names(&["a", "b"]), "c").is_empty());
        assert_eq!(assigned_slots("p", 4, &names(&["a"]), "a"), vec![0, 1, 2, 3]);
    }

    #[test]
    fn deployments_of_one_slot_start_on_different_nodes() {
        let live = names(&["a", "b", "c"]);
        let owners: BTreeSet<String> = (0..30)
            .map(|i| {
                let id = format!("pipeline-{i}");
                live.iter().find(|me| assigned_slots(&id, 1, &live, me) == vec![0]).unwrap().clone()
            })
            .collect();
        assert_eq!(owners.len(), 3);
    }

    #[test]
    fn the_next_round_comes_as_the_oldest_live_peer_would_pass_the_timeout() {
        let cluster = Cluster::new(ClusterSettings::new("me", "here"), Utc::now());
        assert_eq!(cluster.until_a_peer_may_die(), None);
        let peer = |name: &str, age_ms| Peer {
            name: name.to_owned(),
            age: Duration::from_millis(age_ms),
            report: NodeReport::default(),
            report_seq: 0,
        };
        // Dead already (past 10 s) counts for nothing; of the live ones, the oldest.
        cluster.set_peers(vec![peer("a", 2_000), peer("b", 8_500), peer("c", 12_000)]);
        let until = cluster.until_a_peer_may_die().unwrap();
        assert!(until <= Duration::from_millis(1_520), "{until:?}");
        assert!(until >= Duration::from_millis(1_000), "{until:?}");
        // One at the edge is checked again soon, never at once.
        cluster.set_peers(vec![peer("a", 10_000)]);
        assert_eq!(cluster.until_a_peer_may_die(), Some(Duration::from_millis(50)));
    }
}
