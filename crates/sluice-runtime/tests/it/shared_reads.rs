//! Pipelines on one stream share its reads: each record is read from the log once per node,
//! the set filters of all the pipelines are evaluated together, and a pipeline that is
//! behind reads on its own until it catches up — each pipeline's deliveries stay exact.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_bus::forwarding::{Forwarding, Hooks};
use sluice_bus::{NewRecord, Record, StreamLog, topics};
use sluice_core::catalog::Catalog;
use sluice_core::filter_values::{FilterValuesChange, FilterValuesListener};
use sluice_core::pipeline::Pipeline;
use sluice_runtime::sets::StoreSetSource;
use sluice_runtime::{Paused, Runtime, RuntimeSettings};
use sluice_store::MetadataStore;

use crate::lifecycle::spec;

/// Counts the records read from the source stream.
#[derive(Default)]
struct SourceReads(AtomicU64);

impl Hooks for SourceReads {
    fn after_read(&self, topic: &str, _partition: u32, records: &[Record]) {
        if topic == source() {
            self.0.fetch_add(records.len() as u64, Ordering::Relaxed);
        }
    }
}

fn source() -> String {
    topics::chain_stream("base", "erc20_token_transfer", false)
}

fn transfer(n: u64, token: &str) -> NewRecord {
    let value = serde_json::json!({
        "id": format!("t{n}"),
        "token_address": token,
        "block_timestamp": "2026-11-23T00:00:00Z",
    });
    NewRecord::new(format!("t{n}").into_bytes(), value.to_string().into_bytes())
}

struct Node {
    _dir: tempfile::TempDir,
    store: Arc<dyn MetadataStore>,
    log: Arc<Forwarding<SourceReads>>,
    runtime: Arc<Runtime>,
    pipelines: Vec<Pipeline>,
}

/// A runtime on the embedded log with `count` deployed pipelines `p0`…, each filtering
/// `token_address` by its own token `0xt<i>` and the shared token `0xall`.
async fn node(count: usize, settings: RuntimeSettings) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let (store, embedded, clock) = crate::lifecycle::store_and_log(dir.path()).await;
    let log = Arc::new(Forwarding::new(embedded, SourceReads::default()));
    let identity = store.ensure_identity("acme", "data", "ann", false).await.unwrap();
    let mut pipelines = Vec::new();
    for i in 0..count {
        let name = format!("p{i}");
        let pipeline = Pipeline::new(
            name.clone(),
            spec(&name),
            identity.user.id.clone(),
            identity.org.id.clone(),
            clock.now(),
        );
        store.insert_pipeline(&pipeline, &identity.team.id, &[]).await.unwrap();
        store
            .add_filter_values(&pipeline.id, "tokens", &[format!("0xt{i}"), "0xall".to_owned()])
            .await
            .unwrap();
        pipelines.push(pipeline);
    }
    let runtime = Runtime::builder(store.clone(), log.clone(), Arc::new(Catalog::default()), clock)
        .settings(settings)
        .set_source(Arc::new(StoreSetSource(store.clone())))
        .start()
        .await
        .unwrap();
    for pipeline in &pipelines {
        runtime.deploy(pipeline).await.unwrap();
    }
    Node { _dir: dir, store, log, runtime, pipelines }
}

impl Node {
    /// The keys in pipeline `i`'s sink, in order, checked for duplicates.
    async fn delivered(&self, i: usize) -> Vec<String> {
        let pipeline = &self.pipelines[i];
        let topic = topics::sink_topic(&pipeline.id, &format!("{}-out", pipeline.name));
        let records = self.log.read(&topic, 0, 0, usize::MAX).await.unwrap();
        records.iter().map(|r| String::from_utf8(r.key.to_vec()).unwrap()).collect()
    }

    /// Waits until pipeline `i`'s sink holds `count` records.
    async fn wait_for(&self, i: usize, count: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let held = self.delivered(i).await.len();
            if held >= count {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "p{i} holds {held} of {count}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn append(&self, records: Vec<NewRecord>) {
        for chunk in records.chunks(500) {
            self.log.append(&source(), chunk.to_vec()).await.unwrap();
        }
    }
}

fn keys(range: impl Iterator<Item = u64>) -> BTreeSet<String> {
    range.map(|n| format!("t{n}")).collect()
}

fn as_set(delivered: &[String]) -> BTreeSet<String> {
    let set: BTreeSet<String> = delivered.iter().cloned().collect();
    assert_eq!(set.len(), delivered.len(), "a record was delivered twice");
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_on_one_stream_read_each_record_once_and_each_gets_exactly_its_matches() {
    const PIPELINES: usize = 30;
    const RECORDS: u64 = 3_000;
    let node = node(PIPELINES, RuntimeSettings::default()).await;
    // Every tenth record is for everyone; the others for one pipeline each.
    let token = |n: u64| {
        if n % 10 == 0 { "0xall".to_owned() } else { format!("0xt{}", n % PIPELINES as u64) }
    };
    node.append((0..RECORDS).map(|n| transfer(n, &token(n))).collect()).await;
    for i in 0..PIPELINES {
        let expected =
            keys((0..RECORDS).filter(|n| n % 10 == 0 || n % PIPELINES as u64 == i as u64));
        node.wait_for(i, expected.len()).await;
        assert_eq!(as_set(&node.delivered(i).await), expected, "p{i}");
    }
    // Thirty pipelines, and each record read about once (a worker may read a partition's
    // records on its own when it started reading before the others).
    let read = node.log.hooks().0.load(Ordering::Relaxed);
    assert!(read <= 2 * RECORDS, "{read} source records read for {RECORDS} appended");
    node.runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_behind_the_window_reads_alone_catches_up_and_delivers_exactly_once() {
    // Small batches, so the window (a few batches per partition) is passed quickly.
    let settings = RuntimeSettings { batch_size: 25, ..RuntimeSettings::default() };
    let node = node(3, settings).await;
    let lagging = node.pipelines[0].id.clone();
    node.append((0..100).map(|n| transfer(n, "0xall")).collect()).await;
    node.wait_for(0, 100).await;
    assert_eq!(node.runtime.pause(&lagging).await.unwrap(), Paused::Paused);
    // Far more than the windows hold while it is paused; the others keep delivering.
    node.append((100..4_100).map(|n| transfer(n, "0xall")).collect()).await;
    node.wait_for(1, 4_100).await;
    node.runtime.deploy(&node.pipelines[0]).await.unwrap();
    // And more while it catches up.
    node.append((4_100..5_000).map(|n| transfer(n, "0xall")).collect()).await;
    for i in 0..3 {
        node.wait_for(i, 5_000).await;
        assert_eq!(as_set(&node.delivered(i).await), keys(0..5_000), "p{i}");
    }
    node.runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_added_to_one_pipeline_of_a_group_applies_at_once_and_to_it_alone() {
    let node = node(10, RuntimeSettings::default()).await;
    node.append(vec![transfer(0, "0xnew"), transfer(1, "0xall")]).await;
    node.wait_for(3, 1).await;
    // Added to p3 alone, as the API does: stored, then told to the indexes.
    let added = vec!["0xnew".to_owned()];
    node.store.add_filter_values(&node.pipelines[3].id, "tokens", &added).await.unwrap();
    node.runtime.set_indexes().changed(
        &node.pipelines[3].id,
        "tokens",
        FilterValuesChange::Added(&added),
    );
    node.append(vec![transfer(2, "0xnew"), transfer(3, "0xall")]).await;
    node.wait_for(3, 3).await;
    for i in 0..10 {
        node.wait_for(i, 2).await;
    }
    // One more round for anything that would arrive late.
    node.append(vec![transfer(4, "0xall")]).await;
    for i in 0..10 {
        node.wait_for(i, if i == 3 { 4 } else { 3 }).await;
        let expected =
            if i == 3 { keys([1, 2, 3, 4].into_iter()) } else { keys([1, 3, 4].into_iter()) };
        assert_eq!(as_set(&node.delivered(i).await), expected, "p{i}");
    }
    // Removed again: records after the removal pass no more.
    node.store.remove_filter_values(&node.pipelines[3].id, "tokens", &added).await.unwrap();
    node.runtime.set_indexes().changed(
        &node.pipelines[3].id,
        "tokens",
        FilterValuesChange::Removed(&added),
    );
    node.append(vec![transfer(5, "0xnew"), transfer(6, "0xall")]).await;
    node.wait_for(3, 5).await;
    assert_eq!(as_set(&node.delivered(3).await), keys([1, 2, 3, 4, 6].into_iter()));
    node.runtime.shutdown().await;
}
