//! The stop of a node's workers for want of a heartbeat.

use std::time::{Duration, Instant};

use sluice_bus::EmbeddedLog;
use sluice_core::clock::{Clock, SystemClock};
use sluice_core::pipeline::{
    DeliveryGuarantee, ManagedSinkConfig, Pipeline, PipelineConfig, PipelineSpec, PodSize,
    SinkConfig, Source, SourceType,
};
use sluice_store::SqliteStore;

use super::*;
use crate::lifecycle::LifecycleGuard;
use crate::sets::{SetIndexes, StoreSetSource};
use crate::{RuntimeSettings, SinkEnv};

fn spec() -> PipelineSpec {
    PipelineSpec {
        name: "fenced".to_owned(),
        description: String::new(),
        tags: None,
        static_egress_ip: false,
        pod_size: PodSize::S,
        delivery_guarantee: DeliveryGuarantee::AtLeastOnce,
        pipeline_config: PipelineConfig {
            source: Source {
                source_type: SourceType::Pubsub,
                chain: "base".to_owned(),
                entity: "erc20_token_transfer".to_owned(),
                is_zerolag: false,
            },
            transforms: Vec::new(),
            sinks: vec![SinkConfig::Kafka(ManagedSinkConfig {
                name: "fenced-out".to_owned(),
                uid: "sink".to_owned(),
            })],
        },
    }
}

/// A node the others count as dead stops its workers, but one whose heartbeat is written
/// again before a deployment's turn comes (the turn waits for a round that holds the
/// deployment) leaves that deployment running: the rounds may have started it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stops_its_workers_only_while_the_others_count_it_dead() {
    let dir = tempfile::tempdir().unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let url = format!("sqlite://{}", dir.path().join("meta.db").display());
    let store: Arc<dyn MetadataStore> = Arc::new(SqliteStore::open(&url).await.unwrap());
    let log = Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
    let identity = store.ensure_identity("acme", "data", "ann", false).await.unwrap();
    let pipeline = Pipeline::new(
        "fenced".to_owned(),
        spec(),
        identity.user.id.clone(),
        identity.org.id.clone(),
        clock.now(),
    );
    store.insert_pipeline(&pipeline, &identity.team.id, &[]).await.unwrap();
    let sets = Arc::new(SetIndexes::new(Arc::new(StoreSetSource(store.clone()))));
    let settings =
        RuntimeSettings { idle_wait: Duration::from_millis(20), ..RuntimeSettings::default() };
    let node = Arc::new(Node::new(store, log, clock, settings, sets, SinkEnv::default()));
    crate::create_chain_topics(&node, &sluice_core::catalog::Catalog::default()).await.unwrap();
    // Rounds and heartbeats an hour apart: the test says when this node last wrote one.
    let cluster = ClusterSettings {
        heartbeat: Duration::from_secs(3_600),
        node_timeout: Duration::from_secs(60),
        ..ClusterSettings::new("node-a", "http://127.0.0.1:1")
    };
    let placement = ClusterPlacement::start(node.clone(), cluster);
    LifecycleGuard::take(node.clone(), placement.clone(), &pipeline.id)
        .await
        .deploy(&pipeline)
        .await
        .unwrap();
    assert!(node.views().contains_key(&pipeline.id), "the deployment runs here");

    // Another node is alive, and this one has written no heartbeat for two timeouts.
    placement.cluster.set_peers(vec![Peer {
        name: "node-b".to_owned(),
        age: Duration::ZERO,
        report: NodeReport::default(),
        report_seq: 1,
    }]);
    let silent_since = Instant::now().checked_sub(Duration::from_secs(120)).unwrap();
    let set_last_heartbeat = |at: Instant| {
        *placement.cluster.last_heartbeat.lock().unwrap() = at;
    };
    set_last_heartbeat(silent_since);
    assert!(placement.counted_dead());

    // A round holds the deployment while the stop begins; the heartbeat is written again
    // before the stop's turn comes.
    let owner = node.lifecycles.get(&pipeline.id);
    let held = owner.running().await;
    let stopping = tokio::spawn({
        let placement = placement.clone();
        async move { placement.stop_while_counted_dead().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!stopping.is_finished(), "the stop waits for the deployment's turn");
    set_last_heartbeat(Instant::now());
    drop(held);
    assert_eq!(stopping.await.unwrap(), 0, "nothing stops once the heartbeat is back");
    assert!(node.views().contains_key(&pipeline.id), "the deployment still runs here");

    // Still counted dead when its turn comes: it stops.
    set_last_heartbeat(silent_since);
    assert_eq!(placement.stop_while_counted_dead().await, 1);
    assert!(!node.views().contains_key(&pipeline.id), "the deployment stopped here");
}
