//! A cluster node writes its heartbeat apart from its placement rounds: a round held up (here
//! by a set that takes long to load again; in a cluster, also by workers finishing a batch
//! against a broker that does not answer) must not leave the node without a heartbeat, or
//! the other nodes count it as dead and take its work while it still runs it.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use sluice_core::catalog::Catalog;
use sluice_core::pipeline::Pipeline;
use sluice_runtime::sets::StoreSetSource;
use sluice_runtime::{ClusterSettings, Runtime, RuntimeSettings};
use tokio::sync::{Notify, Semaphore};

use crate::lifecycle::{GatedSets, spec, store_and_log, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_keeps_writing_its_heartbeat_while_a_round_waits() {
    let dir = tempfile::tempdir().unwrap();
    let (store, log, clock) = store_and_log(dir.path()).await;
    let identity = store.ensure_identity("acme", "data", "ann", false).await.unwrap();
    let pipeline = Pipeline::new(
        "slow".to_owned(),
        spec("slow"),
        identity.user.id.clone(),
        identity.org.id.clone(),
        clock.now(),
    );
    store.insert_pipeline(&pipeline, &identity.team.id, &[]).await.unwrap();
    store.add_filter_values(&pipeline.id, "tokens", &["0xa".to_owned()]).await.unwrap();
    let sets = Arc::new(GatedSets {
        store: StoreSetSource(store.clone()),
        gated_pipeline: pipeline.id.clone(),
        free: AtomicUsize::new(usize::MAX),
        entered: Notify::new(),
        gate: Semaphore::new(0),
    });
    let settings = ClusterSettings {
        heartbeat: Duration::from_millis(100),
        node_timeout: Duration::from_secs(2),
        ..ClusterSettings::new("node-a", "http://127.0.0.1:1")
    };
    let runtime =
        Runtime::builder(store.clone(), log.clone(), Arc::new(Catalog::default()), clock.clone())
            .settings(RuntimeSettings {
                idle_wait: Duration::from_millis(20),
                ..RuntimeSettings::default()
            })
            .set_source(sets.clone())
            .cluster(Some(settings))
            .start()
            .await
            .unwrap();

    within("the deploy", runtime.deploy(&pipeline)).await.unwrap();

    // A value added through another node: the next round loads the set again, and that
    // load waits for the gate.
    sets.free.store(0, SeqCst);
    store.add_filter_values(&pipeline.id, "tokens", &["0xb".to_owned()]).await.unwrap();
    within("a round to load the set again", sets.entered.notified()).await;

    // The round waits for longer than the node timeout.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let beats = store.node_beats().await.unwrap();
    let age = beats.iter().find(|beat| beat.name == "node-a").expect("the node's row").age_ms;
    assert!(age < 1_000, "the heartbeat is {age} ms old while a round waits");
    assert!(runtime.in_cluster(), "the node counts itself out of the cluster");

    // Opened, the round goes on, and the workers ran throughout.
    sets.gate.add_permits(1_000);
    let health = within("the workers' health", runtime.worker_health(&pipeline.id)).await;
    assert_eq!(health.len(), 1);
}
