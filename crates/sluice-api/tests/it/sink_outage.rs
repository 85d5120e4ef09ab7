//! A managed sink that cannot be written for a while: `at_least_once` holds the source and
//! delivers every record once the sink is back; `best_effort` drops and counts the batches
//! the outage rejects and goes on.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use chrono::{TimeZone, Utc};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_api::{AppState, Limits};
use sluice_bus::{EmbeddedLog, StreamLog};
use sluice_core::catalog::Catalog;
use sluice_core::clock::ManualClock;
use sluice_runtime::{Counters, Runtime};
use sluice_store::{MetadataStore, SqliteStore};
use tower::ServiceExt;

use crate::pipeline_stack::{
    Faults, FaultyLog, OTHER, SOURCE, USDC, key_for, settings, settle, transfer,
};

pub struct Stack {
    _dir: tempfile::TempDir,
    pub log: Arc<FaultyLog>,
    pub runtime: Arc<Runtime>,
    state: AppState,
    operator: String,
    pub owner: String,
}

impl Stack {
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock =
            Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0).unwrap()));
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store: Arc<dyn MetadataStore> = Arc::new(SqliteStore::open(&url).await.unwrap());
        let inner =
            Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
        let log = Arc::new(FaultyLog::new(inner, Faults::default()));
        let runtime = Runtime::builder(
            store.clone(),
            log.clone(),
            Arc::new(Catalog::default()),
            clock.clone(),
        )
        .settings(settings())
        .start()
        .await
        .unwrap();
        let state =
            AppState::new(store.clone(), Catalog::default(), clock.clone(), Limits::default())
                .with_runtime(runtime.clone());
        let operator = key_for(store.as_ref(), "sluice", "ops", "admin", true).await;
        let owner = key_for(store.as_ref(), "acme", "data", "ann", false).await;
        Self { _dir: dir, log, runtime, state, operator, owner }
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        key: &str,
        body: String,
    ) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("X-API-Key", key)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        let response = sluice_api::app(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// A deployed USDC filter pipeline with `guarantee`.
    async fn deployed(&self, guarantee: &str) -> String {
        let filter = json!([{"type": "redis_set_filter", "uid": "tf-usdc",
                             "filter_expr": "root = this.token_address", "set_values": [USDC]}]);
        self.deployed_with(guarantee, filter).await
    }

    /// A deployed pipeline with `guarantee` and `transforms`, whose sink is `sk-out`.
    pub async fn deployed_with(&self, guarantee: &str, transforms: Value) -> String {
        let body = json!({
            "name": "outage", "description": "transfers",
            "delivery_guarantee": guarantee,
            "pipeline_config": {
                "source": {"chain": "base", "entity": "erc20_token_transfer"},
                "transforms": transforms,
                "sinks": [{"type": "kafka", "uid": "sk-out", "name": "transfers"}]
            }
        });
        let (status, created) =
            self.call(Method::POST, "/api/v1/beam", &self.owner, body.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{created}");
        let id = created["id"].as_str().unwrap().to_owned();
        let path = format!("/api/v1/beam/{id}/deploy");
        let (status, deployed) = self.call(Method::POST, &path, &self.owner, "{}".into()).await;
        assert_eq!(status, StatusCode::OK, "{deployed}");
        id
    }

    /// Ingests transfers numbered `numbers`, USDC for odd ones and another token for even ones.
    pub async fn ingest(&self, numbers: std::ops::RangeInclusive<u64>) {
        let ndjson: String = numbers
            .map(|n| transfer(n, if n % 2 == 1 { USDC } else { OTHER }).to_string() + "\n")
            .collect();
        let path = "/api/v1/streams/base/erc20_token_transfer/records";
        let (status, body) = self.call(Method::POST, path, &self.operator, ndjson).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    /// The transfer numbers in the sink, in delivery order, repeats included.
    pub async fn sink(&self, id: &str) -> Vec<u64> {
        let path = format!("/api/v1/beam/{id}/sinks/sk-out/records?offset=0&limit=10000");
        let (status, page) = self.call(Method::GET, &path, &self.owner, String::new()).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        page["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["value"]["n"].as_u64().unwrap())
            .collect()
    }

    pub async fn counters(&self, id: &str) -> Arc<Counters> {
        self.runtime.counters(id).await.unwrap()
    }

    /// Polls until `counter` of deployment `id` reaches `at_least` (a generous deadline fails
    /// the test; it measures nothing).
    async fn wait_for(&self, id: &str, what: &str, at_least: u64, counter: fn(&Counters) -> u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while counter(self.counters(id).await.as_ref()) < at_least {
            assert!(tokio::time::Instant::now() < deadline, "{what} stayed below {at_least}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Source offsets the deployment has committed, summed over partitions.
    async fn committed(&self, id: &str) -> u64 {
        let group = sluice_bus::topics::deployment_group(id);
        self.log.committed(&group, SOURCE).await.unwrap().values().sum()
    }
}

fn sorted(mut numbers: Vec<u64>) -> Vec<u64> {
    numbers.sort_unstable();
    numbers
}

fn odd(numbers: std::ops::RangeInclusive<u64>) -> Vec<u64> {
    numbers.filter(|n| n % 2 == 1).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_holds_the_source_through_a_sink_outage_and_then_delivers_every_record_once()
{
    let stack = Stack::new().await;
    let id = stack.deployed("at_least_once").await;
    stack.ingest(1..=20).await;
    assert_eq!(sorted(stack.sink_waiting(&id, 10).await), odd(1..=20));
    settle(stack.log.as_ref(), &id).await;
    let committed_before = stack.committed(&id).await;

    stack.log.hooks().down.store(true, Ordering::SeqCst);
    stack.ingest(21..=60).await;
    // Several writes failed and were retried; meanwhile nothing new reached the sink and the
    // source offsets did not move: the outage holds the records back.
    stack.wait_for(&id, "output errors", 4, |c| Counters::get(&c.output_errors)).await;
    assert_eq!(sorted(stack.sink(&id).await), odd(1..=20));
    assert_eq!(stack.committed(&id).await, committed_before);
    assert_eq!(Counters::get(&stack.counters(&id).await.dropped), 0);

    stack.log.hooks().down.store(false, Ordering::SeqCst);
    stack.ingest(61..=70).await;
    settle(stack.log.as_ref(), &id).await;
    let delivered = stack.sink(&id).await;
    // Every matching record of before, during and after the outage, each exactly once (the
    // held batch is written in one transaction with its offsets).
    assert_eq!(sorted(delivered), odd(1..=70));
    let counters = stack.counters(&id).await;
    assert_eq!(Counters::get(&counters.dropped), 0);
    assert_eq!(Counters::get(&counters.sent), 35);
}

#[tokio::test(flavor = "multi_thread")]
async fn best_effort_drops_and_counts_what_a_sink_outage_rejects_and_goes_on() {
    let stack = Stack::new().await;
    let id = stack.deployed("best_effort").await;
    stack.ingest(1..=20).await;
    assert_eq!(sorted(stack.sink_waiting(&id, 10).await), odd(1..=20));
    settle(stack.log.as_ref(), &id).await;

    stack.log.hooks().down.store(true, Ordering::SeqCst);
    stack.ingest(21..=60).await;
    // The outage does not hold the source: the offsets move past the rejected batches.
    settle(stack.log.as_ref(), &id).await;
    let counters = stack.counters(&id).await;
    assert_eq!(Counters::get(&counters.dropped), 20, "the 20 matching records of the outage");
    assert!(Counters::get(&counters.output_errors) >= 1);
    assert_eq!(sorted(stack.sink(&id).await), odd(1..=20));

    stack.log.hooks().down.store(false, Ordering::SeqCst);
    stack.ingest(61..=70).await;
    settle(stack.log.as_ref(), &id).await;
    let mut expected = odd(1..=20);
    expected.extend(odd(61..=70));
    assert_eq!(sorted(stack.sink(&id).await), expected);
    let counters = stack.counters(&id).await;
    assert_eq!(Counters::get(&counters.sent), 15);
    assert_eq!(Counters::get(&counters.dropped), 20);
}

impl Stack {
    /// Reads the sink until it holds `count` records (or a generous deadline passes).
    async fn sink_waiting(&self, id: &str, count: usize) -> Vec<u64> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let numbers = self.sink(id).await;
            if numbers.len() >= count || tokio::time::Instant::now() > deadline {
                return numbers;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
