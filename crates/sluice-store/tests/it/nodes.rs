//! The cluster role: node heartbeats with the database's clock, the per-pipeline cluster
//! lock, and the signal nodes wake each other with.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_store::MetadataStore;

async fn heartbeats_read_back_with_their_age_and_go_when_removed(store: Arc<dyn MetadataStore>) {
    assert!(store.nodes().await.unwrap().is_empty());
    store.heartbeat("node-b", r#"{"round":1}"#).await.unwrap();
    store.heartbeat("node-a", "{}").await.unwrap();
    store.heartbeat("node-b", r#"{"round":2}"#).await.unwrap();
    let nodes = store.nodes().await.unwrap();
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-a", "node-b"]);
    assert_eq!(nodes[1].report, r#"{"round":2}"#);
    assert!(nodes.iter().all(|n| (0..5_000).contains(&n.age_ms)), "{nodes:?}");

    tokio::time::sleep(Duration::from_millis(300)).await;
    store.heartbeat("node-b", "{}").await.unwrap();
    let nodes = store.nodes().await.unwrap();
    assert!(nodes[0].age_ms >= 250, "node-a aged by the database's clock: {nodes:?}");
    assert!(nodes[1].age_ms < nodes[0].age_ms, "node-b just wrote: {nodes:?}");

    // A stopping node removes itself; rows silent longer than `stale_ms` go with it.
    assert_eq!(store.remove_nodes(Some("node-b"), 3_600_000).await.unwrap(), 1);
    assert_eq!(store.nodes().await.unwrap().len(), 1);
    assert_eq!(store.remove_nodes(None, 100).await.unwrap(), 1, "node-a is 300 ms silent");
    assert!(store.nodes().await.unwrap().is_empty());
}

/// A report's number moves when the report changes, and only then: what lets nodes read
/// only the reports that changed.
async fn report_numbers_move_only_when_a_report_changes(store: Arc<dyn MetadataStore>) {
    store.heartbeat("node-a", r#"{"w":1}"#).await.unwrap();
    store.heartbeat("node-b", "{}").await.unwrap();
    let first = store.node_beats().await.unwrap();
    assert_eq!(first.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["node-a", "node-b"]);
    for _ in 0..3 {
        store.heartbeat("node-a", r#"{"w":1}"#).await.unwrap();
    }
    assert_eq!(store.node_beats().await.unwrap()[0].report_seq, first[0].report_seq);
    store.heartbeat("node-a", r#"{"w":2}"#).await.unwrap();
    let beats = store.node_beats().await.unwrap();
    assert_eq!(beats[0].report_seq, first[0].report_seq + 1);
    assert_eq!(beats[1].report_seq, first[1].report_seq, "node-b's report did not change");
    assert_eq!(
        store.node_report("node-a").await.unwrap(),
        Some((beats[0].report_seq, r#"{"w":2}"#.to_owned()))
    );
    assert_eq!(store.nodes().await.unwrap()[0].report_seq, beats[0].report_seq);
    assert_eq!(store.node_report("node-z").await.unwrap(), None);
}

on_both_backends!(|s| Arc::new(s) as Arc<dyn MetadataStore>;
    heartbeats_read_back_with_their_age_and_go_when_removed,
    report_numbers_move_only_when_a_report_changes,
);

#[tokio::test]
async fn on_postgres_the_cluster_lock_holds_off_another_process_and_signals_reach_it() {
    let fixture = crate::postgres(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
    let lock = fixture.store.cluster_lock("pipeline-1").await.unwrap();
    let other = fixture.other.clone();
    let waiter = tokio::spawn(async move {
        let lock = other.cluster_lock("pipeline-1").await.unwrap();
        let at = Instant::now();
        lock.release().await;
        at
    });
    // Another pipeline's lock is free meanwhile.
    fixture.other.cluster_lock("pipeline-2").await.unwrap().release().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the second process waits for the lock");
    let released = Instant::now();
    lock.release().await;
    assert!(waiter.await.unwrap() >= released);

    // A lock dropped on an error path is released too.
    drop(fixture.store.cluster_lock("pipeline-1").await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), fixture.other.cluster_lock("pipeline-1"))
        .await
        .expect("a dropped lock is released")
        .unwrap()
        .release()
        .await;

    let mut signals = fixture.other.listen_cluster().await.unwrap().expect("PostgreSQL listens");
    fixture.store.signal_cluster().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), signals.recv())
        .await
        .expect("the signal arrives")
        .expect("the listener runs");
}

#[tokio::test]
async fn on_postgres_a_role_is_one_process_s_until_it_lets_go() {
    let fixture = crate::postgres(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
    let mut held = fixture.store.try_role("archiver").await.unwrap().expect("nobody holds it");
    assert!(held.still_held().await);
    assert!(fixture.other.try_role("archiver").await.unwrap().is_none(), "held elsewhere");
    assert!(fixture.store.try_role("archiver").await.unwrap().is_none(), "once per session");
    let other_role = fixture.other.try_role("another role").await.unwrap();
    assert!(other_role.is_some(), "roles are independent");
    drop(held);
    // The session that held it closes; the role is free for the other process.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if fixture.other.try_role("archiver").await.unwrap().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "a dropped role is given up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn on_sqlite_one_process_needs_no_cluster_lock_and_hears_no_signals() {
    let fixture = crate::sqlite(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
    let first = fixture.store.cluster_lock("pipeline-1").await.unwrap();
    let second =
        tokio::time::timeout(Duration::from_secs(1), fixture.other.cluster_lock("pipeline-1"))
            .await
            .expect("no wait on SQLite: the process's own lock serialises")
            .unwrap();
    first.release().await;
    second.release().await;
    assert!(fixture.store.listen_cluster().await.unwrap().is_none());
    let mut role = fixture.store.try_role("archiver").await.unwrap().expect("always taken");
    assert!(role.still_held().await);
    fixture.store.signal_cluster().await.unwrap();
}
