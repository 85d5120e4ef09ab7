//! Changes serialise per pipeline, in its lifecycle owner: one pipeline's slow call (a big
//! set loading) holds that pipeline's other changes, never another pipeline's calls, nor
//! health and counter reads.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use sluice_bus::{EmbeddedLog, NewRecord, StreamLog, topics};
use sluice_core::catalog::Catalog;
use sluice_core::clock::{Clock, SystemClock};
use sluice_core::deployment::DeploymentState;
use sluice_core::pipeline::{
    DeliveryGuarantee, ManagedSinkConfig, Pipeline, PipelineConfig, PipelineSpec, PodSize,
    SinkConfig, Source, SourceType, Transform,
};
use sluice_filter::ValueSet;
use sluice_runtime::sets::{SetSource, StoreSetSource};
use sluice_runtime::{Paused, Runtime, RuntimeSettings};
use sluice_store::{MetadataStore, SqliteStore, StoreError};
use tokio::sync::{Notify, Semaphore};

/// Loads sets from the store, but one pipeline's loads, past its first `free` ones, wait
/// until the test opens the gate: a 10M-value set that takes seconds to load, without the
/// seconds.
pub(crate) struct GatedSets {
    pub(crate) store: StoreSetSource,
    pub(crate) gated_pipeline: String,
    pub(crate) free: AtomicUsize,
    pub(crate) entered: Notify,
    pub(crate) gate: Semaphore,
}

#[async_trait::async_trait]
impl SetSource for GatedSets {
    async fn load_set(&self, pipeline_id: &str, uid: &str) -> Result<ValueSet, StoreError> {
        let free = || self.free.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok();
        if pipeline_id == self.gated_pipeline && !free() {
            self.entered.notify_one();
            let _open = self.gate.acquire().await.expect("the gate is never closed");
        }
        self.store.load_set(pipeline_id, uid).await
    }

    async fn set_version(
        &self,
        pipeline_id: &str,
        uid: &str,
    ) -> Result<Option<(i64, i64)>, StoreError> {
        self.store.set_version(pipeline_id, uid).await
    }
}

pub(crate) fn spec(name: &str) -> PipelineSpec {
    PipelineSpec {
        name: name.to_owned(),
        description: "lifecycle test".to_owned(),
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
            transforms: vec![Transform::SetFilter {
                uid: "tokens".to_owned(),
                filter_expr: "root = this.token_address".to_owned(),
            }],
            sinks: vec![SinkConfig::Kafka(ManagedSinkConfig {
                name: format!("{name}-out"),
                uid: format!("sink-{name}"),
            })],
        },
    }
}

fn transfer(n: u64, token: &str) -> NewRecord {
    let value = serde_json::json!({
        "id": format!("t{n}"),
        "token_address": token,
        "block_timestamp": "2026-11-23T00:00:00Z",
    });
    NewRecord::new(format!("t{n}").into_bytes(), value.to_string().into_bytes())
}

/// A SQLite store and an embedded log in `dir`, on the system clock.
pub(crate) async fn store_and_log(
    dir: &Path,
) -> (Arc<dyn MetadataStore>, Arc<dyn StreamLog>, Arc<dyn Clock>) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let url = format!("sqlite://{}", dir.join("meta.db").display());
    let store: Arc<dyn MetadataStore> = Arc::new(SqliteStore::open(&url).await.unwrap());
    let log: Arc<dyn StreamLog> =
        Arc::new(EmbeddedLog::open(&dir.join("log.redb"), clock.clone()).unwrap());
    (store, log, clock)
}

/// Waits (up to a generous deadline) for `future`; the deadline only stops a hung test.
pub(crate) async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_proceeds_while_another_pipelines_set_is_loading() {
    let dir = tempfile::tempdir().unwrap();
    let (store, log, clock) = store_and_log(dir.path()).await;
    let identity = store.ensure_identity("acme", "data", "ann", false).await.unwrap();
    let mut pipelines = Vec::new();
    for name in ["a", "b"] {
        let pipeline = Pipeline::new(
            name.to_owned(),
            spec(name),
            identity.user.id.clone(),
            identity.org.id.clone(),
            clock.now(),
        );
        store.insert_pipeline(&pipeline, &identity.team.id, &[]).await.unwrap();
        store.add_filter_values(&pipeline.id, "tokens", &[format!("0x{name}")]).await.unwrap();
        pipelines.push(pipeline);
    }
    let (a, b) = (pipelines[0].clone(), pipelines[1].clone());
    let sets = Arc::new(GatedSets {
        store: StoreSetSource(store.clone()),
        gated_pipeline: b.id.clone(),
        free: AtomicUsize::new(0),
        entered: Notify::new(),
        gate: Semaphore::new(0),
    });
    let runtime =
        Runtime::builder(store.clone(), log.clone(), Arc::new(Catalog::default()), clock.clone())
            .settings(RuntimeSettings {
                idle_wait: Duration::from_millis(20),
                ..RuntimeSettings::default()
            })
            .set_source(sets.clone())
            .start()
            .await
            .unwrap();

    // B's deploy starts loading its set and stays there until the gate opens.
    let deploying_b = tokio::spawn({
        let (runtime, b) = (runtime.clone(), b.clone());
        async move { runtime.deploy(&b).await }
    });
    within("B's set load to start", sets.entered.notified()).await;

    // Meanwhile A deploys, answers health and counters, pauses and deploys again.
    within("A's deploy", runtime.deploy(&a)).await.unwrap();
    assert_eq!(within("A's health", runtime.worker_health(&a.id)).await.len(), 1);
    assert!(within("A's counters", runtime.counters(&a.id)).await.is_some());
    assert_eq!(within("every health", runtime.all_worker_health()).await.len(), 1);
    assert_eq!(within("A's pause", runtime.pause(&a.id)).await.unwrap(), Paused::Paused);
    within("A's second deploy", runtime.deploy(&a)).await.unwrap();
    // B's own lifecycle calls wait for B's deploy: a pause cannot finish while it loads.
    let pausing_b = tokio::spawn({
        let (runtime, id) = (runtime.clone(), b.id.clone());
        async move { runtime.pause(&id).await }
    });
    // Every other change of B (an edit, a filter-value change) waits its turn too; A's
    // changes do not.
    let b_change = tokio::spawn({
        let (runtime, id) = (runtime.clone(), b.id.clone());
        async move { drop(runtime.lifecycle_here(&id).await) }
    });
    drop(within("A's turn", runtime.lifecycle(&a.id)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!pausing_b.is_finished(), "B's pause must wait for B's deploy");
    assert!(!b_change.is_finished(), "B's other changes must wait for B's deploy");
    assert!(!deploying_b.is_finished(), "B's deploy must wait for its set");

    // A delivers while B is still loading.
    let source = topics::chain_stream("base", "erc20_token_transfer", false);
    log.append(&source, vec![transfer(1, "0xa"), transfer(2, "0xb")]).await.unwrap();
    let a_sink = topics::sink_topic(&a.id, "a-out");
    within("A's delivery", async {
        loop {
            if log.offsets(&a_sink).await.unwrap().iter().map(|r| r.end).sum::<u64>() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    // Opened, B's deploy finishes first, then its waiting pause runs.
    sets.gate.add_permits(1);
    within("B's deploy", deploying_b).await.unwrap().unwrap();
    assert_eq!(within("B's pause", pausing_b).await.unwrap().unwrap(), Paused::Paused);
    within("B's change", b_change).await.unwrap();
    assert_eq!(runtime.state(&b.id).await.unwrap(), Some(DeploymentState::Paused));
    assert!(runtime.worker_health(&b.id).await.is_empty());
    runtime.shutdown().await;
}
