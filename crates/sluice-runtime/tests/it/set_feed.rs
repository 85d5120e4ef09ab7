//! Set indexes following the Redis set store's change feed: every change another node makes
//! reaches the index in order, and a gap (entries trimmed before they were read) or a change
//! too large to carry loads the set again.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::clock::{Clock, SystemClock};
use sluice_core::filter_values::FilterValuesListener;
use sluice_core::pipeline::{Pipeline, Transform};
use sluice_runtime::sets::{SetIndexes, StoreSetSource, follow_feed};
use sluice_store::{MetadataStore, PgStore, RedisSets};

use crate::lifecycle::spec;

/// Two stores as two nodes: one PostgreSQL schema, one Redis key prefix.
async fn two_nodes() -> (Arc<dyn MetadataStore>, Arc<dyn MetadataStore>, String) {
    let url = std::env::var("SLUICE_TEST_REDIS_URL")
        .expect("SLUICE_TEST_REDIS_URL must name a Redis server; run scripts/test");
    let url = format!("{url}?prefix=t{}", sluice_core::ids::new_id().replace('-', ""));
    let options = sluice_store::testing::fresh_postgres_schema().await;
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let redis = Arc::new(RedisSets::connect(&url).await.unwrap());
        let store = PgStore::open_with(options.clone()).await.unwrap().with_redis_sets(redis);
        nodes.push(Arc::new(store) as Arc<dyn MetadataStore>);
    }
    let prefix = url.split("prefix=").nth(1).unwrap().to_owned();
    (nodes.remove(0), nodes.remove(0), prefix)
}

/// Polls `check` for up to three seconds.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    for _ in 0..300 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within three seconds");
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_follows_another_nodes_changes_and_loads_again_after_a_gap() {
    let (here, there, prefix) = two_nodes().await;
    let identity = here.ensure_identity("acme", "data", "ann", false).await.unwrap();
    let clock = SystemClock;
    let pipeline = Pipeline::new(
        "p".into(),
        spec("p"),
        identity.user.id.clone(),
        identity.org.id.clone(),
        clock.now(),
    );
    assert!(matches!(pipeline.pipeline_config.transforms[0], Transform::SetFilter { .. }));
    let (id, uid) = (pipeline.id.clone(), "tokens");
    here.insert_pipeline(&pipeline, &identity.team.id, &[]).await.unwrap();
    there.add_filter_values(&id, uid, &strings(&["0xa", "0xb"])).await.unwrap();

    let indexes = Arc::new(SetIndexes::new(Arc::new(StoreSetSource(here.clone()))));
    // A feed opened now, read only later: what happens in between waits in the stream.
    let feed = here.set_feed().await.unwrap().unwrap();
    let index = indexes.acquire(&id, uid).await.unwrap();
    assert!(index.with(|set| set.contains("0xa") && set.contains("0xb")));

    // Changes made before the reader starts, then trimmed away but for the last: the
    // reader sees a version it cannot reach from the one it holds.
    there.add_filter_values(&id, uid, &strings(&["0xc"])).await.unwrap();
    there.remove_filter_values(&id, uid, &strings(&["0xa"])).await.unwrap();
    let mut redis = redis::Client::open(std::env::var("SLUICE_TEST_REDIS_URL").unwrap())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis::cmd("XTRIM")
        .arg(format!("{prefix}:feed"))
        .arg("MAXLEN")
        .arg(0)
        .query_async(&mut redis)
        .await
        .unwrap();
    there.add_filter_values(&id, uid, &strings(&["0xd"])).await.unwrap();
    let follower = tokio::spawn(follow_feed(Arc::downgrade(&indexes), Arc::new(()), feed));
    eventually("the gap is noticed and the set loaded again", || {
        index.with(|set| set.len() == 3 && set.contains("0xc") && !set.contains("0xa"))
    })
    .await;
    let stored = here.filter_set_version(&id, uid).await.unwrap();
    assert!(indexes.caught_up(&id, uid, stored));
    assert!(indexes.follows_feed());

    // Each change of the other node, in order.
    there.add_filter_values(&id, uid, &strings(&["0xe", "0xf"])).await.unwrap();
    there.remove_filter_values(&id, uid, &strings(&["0xe"])).await.unwrap();
    let stored = here.filter_set_version(&id, uid).await.unwrap();
    eventually("the index holds the stored version", || indexes.caught_up(&id, uid, stored)).await;
    assert!(index.with(|set| set.contains("0xf") && !set.contains("0xe") && set.len() == 4));

    // A change told through this process's listener is left to the feed.
    indexes.changed(
        &id,
        uid,
        sluice_core::filter_values::FilterValuesChange::Added(&strings(&["0xnot-stored"])),
    );
    assert!(!index.with(|set| set.contains("0xnot-stored")));

    // A replace too large to carry: the index loads the set again.
    let many: Vec<String> = (0..100_001).map(|i| format!("0x{i:040x}")).collect();
    there.replace_filter_values(&id, uid, &many).await.unwrap();
    eventually("the large replace is loaded", || index.with(|set| set.len() == 100_001)).await;
    assert!(index.with(|set| !set.contains("0xf")));

    // Emptied: the set is dropped, and the index empty.
    there.replace_filter_values(&id, uid, &[]).await.unwrap();
    eventually("the emptied set is empty here", || index.with(|set| set.is_empty())).await;
    assert!(indexes.caught_up(&id, uid, None));
    follower.abort();
}
