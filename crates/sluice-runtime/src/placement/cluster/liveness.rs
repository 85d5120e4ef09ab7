//! How a node stays alive in the others' eyes: its heartbeat, written on a task of its own
//! apart from the placement rounds, and the stop of its workers once the others count it as
//! dead.

use std::sync::{Arc, Weak};
use std::time::Instant;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::{ClusterPlacement, RECONCILE_TOGETHER};

impl ClusterPlacement {
    /// Writes this node's heartbeat; false when the store did not take it.
    pub(crate) async fn heartbeat(&self) -> bool {
        let cluster = &self.cluster;
        if self.node.is_shut_down() {
            // Gone from the nodes table for good: do not write the row back.
            return false;
        }
        let report =
            serde_json::to_string(&self.node_report()).expect("a node report always serialises");
        match self.node.store.heartbeat(cluster.name(), &report).await {
            Ok(()) => {
                *cluster.last_heartbeat.lock().expect("heartbeat lock is never poisoned") =
                    Instant::now();
                true
            }
            Err(error) => {
                tracing::warn!(%error, "cannot write this node's heartbeat");
                false
            }
        }
    }

    /// Whether the other nodes count this node as dead: it has written no heartbeat for the
    /// node timeout while it knew other live nodes. (A node that was alone goes on: nobody
    /// can take its work, and stopping would turn a PostgreSQL restart into a processing
    /// stop.)
    pub(super) fn counted_dead(&self) -> bool {
        !self.cluster.heartbeat_fresh() && !self.cluster.live_peers().is_empty()
    }

    /// Stops this node's workers in the background once the others count it as dead (they
    /// take its work), unless a stop is still under way (`stopping`). The stop ends as soon
    /// as the heartbeat is written again.
    fn stop_when_counted_dead(self: &Arc<Self>, stopping: &mut Option<JoinHandle<()>>) {
        if !self.counted_dead() || stopping.as_ref().is_some_and(|stop| !stop.is_finished()) {
            return;
        }
        let placement = Arc::clone(self);
        *stopping = Some(tokio::spawn(async move {
            let silent = placement
                .cluster
                .last_heartbeat
                .lock()
                .expect("heartbeat lock is never poisoned")
                .elapsed();
            tracing::error!(
                ?silent,
                "no heartbeat written for the node timeout: stopping this node's workers"
            );
            let stopped = placement.stop_while_counted_dead().await;
            tracing::warn!(stopped, "this node's workers stopped for want of a heartbeat");
        }));
    }

    /// Stops the workers of this node's deployments, up to [`RECONCILE_TOGETHER`] at once
    /// (one whose workers are slow to stop does not hold back the others), for as long as
    /// the others count this node as dead: a deployment reached once its heartbeat is
    /// written again keeps running (the rounds may have started it again meanwhile). Answers
    /// how many deployments stopped.
    pub(crate) async fn stop_while_counted_dead(&self) -> usize {
        let ids: Vec<String> = self.node.views().keys().cloned().collect();
        let mut ids = ids.iter();
        let mut going = FuturesUnordered::new();
        for id in ids.by_ref().take(RECONCILE_TOGETHER) {
            going.push(self.stop_if_counted_dead(id));
        }
        let mut stopped = 0;
        while let Some(one) = going.next().await {
            stopped += usize::from(one);
            if let Some(id) = ids.next() {
                going.push(self.stop_if_counted_dead(id));
            }
        }
        stopped
    }

    /// Stops the workers of deployment `pipeline_id` here if the others still count this
    /// node as dead once its turn comes; true when some stopped.
    async fn stop_if_counted_dead(&self, pipeline_id: &str) -> bool {
        let owner = self.node.lifecycles.get(pipeline_id);
        let mut running = owner.running().await;
        if !self.counted_dead() || running.is_none() {
            return false;
        }
        self.node.stop_running(pipeline_id, &mut running).await;
        true
    }
}

/// Writes this node's heartbeat every [`ClusterSettings::heartbeat`] until the placement
/// goes, apart from the rounds: a round that waits on the broker (workers finishing a batch
/// against a broker that does not answer) must not leave the node without a heartbeat, or
/// the others count it as dead and take its work while it still runs. A write that takes
/// half the node timeout is given up and tried again at the next beat. A node the others
/// count as dead stops its workers.
pub(super) async fn beat(placement: Weak<ClusterPlacement>) {
    let mut beats = match placement.upgrade() {
        Some(placement) => tokio::time::interval(placement.cluster.settings.heartbeat),
        None => return,
    };
    beats.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first tick is at once, and `follow` has just written the first heartbeat.
    beats.tick().await;
    let mut stopping = None;
    loop {
        beats.tick().await;
        let Some(placement) = placement.upgrade() else { return };
        if placement.node.is_shut_down() {
            return;
        }
        let patience = placement.cluster.settings.node_timeout / 2;
        let wrote = match tokio::time::timeout(patience, placement.heartbeat()).await {
            Ok(wrote) => wrote,
            Err(_) => {
                tracing::warn!(
                    ?patience,
                    "writing this node's heartbeat takes too long; trying again"
                );
                false
            }
        };
        if !wrote {
            placement.stop_when_counted_dead(&mut stopping);
        }
    }
}
