//! End to end through the HTTP API with a real runtime and embedded log: deploy, ingest,
//! filter, deliver, pause, resume, tear down, redeploy, restart.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use chrono::{TimeZone, Utc};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_api::{AppState, Limits};
use sluice_bus::{EmbeddedLog, KafkaLog, KafkaSettings, StreamLog};
use sluice_core::catalog::Catalog;
use sluice_core::clock::ManualClock;
use sluice_runtime::Runtime;
use sluice_runtime::datasets::DatasetIndex;
use sluice_store::{MetadataStore, SqliteStore};
use tower::ServiceExt;

use crate::pipeline_stack::{OTHER, USDC, WETH, key_for, settings, settle, transfer};

struct Stack {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    store: Arc<dyn MetadataStore>,
    log: Arc<dyn StreamLog>,
    runtime: Arc<Runtime>,
    state: AppState,
    operator: String,
    owner: String,
    reader: String,
}

impl Stack {
    /// A stack on the embedded log.
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock = Self::clock();
        let log = Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
        Self::on(dir, clock, log).await
    }

    /// A stack on the Kafka-API broker `scripts/test` starts (`SLUICE_TEST_KAFKA_URL`; the
    /// test fails without it), under a topic prefix of its own.
    async fn kafka() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock = Self::clock();
        let log = Arc::new(KafkaLog::connect(kafka_settings(), clock.clone()).await.unwrap());
        Self::on(dir, clock, log).await
    }

    fn clock() -> Arc<ManualClock> {
        Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0).unwrap()))
    }

    async fn on(dir: tempfile::TempDir, clock: Arc<ManualClock>, log: Arc<dyn StreamLog>) -> Self {
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store: Arc<dyn MetadataStore> = Arc::new(SqliteStore::open(&url).await.unwrap());
        let operator = key_for(store.as_ref(), "sluice", "ops", "admin", true).await;
        let owner = key_for(store.as_ref(), "acme", "data", "ann", false).await;
        let reader = key_for(store.as_ref(), "acme", "data2", "bob", false).await;
        let (runtime, state) = Self::serve(&store, &log, &clock).await;
        Self { dir, clock, store, log, runtime, state, operator, owner, reader }
    }

    async fn serve(
        store: &Arc<dyn MetadataStore>,
        log: &Arc<dyn StreamLog>,
        clock: &Arc<ManualClock>,
    ) -> (Arc<Runtime>, AppState) {
        let catalog = Arc::new(Catalog::default());
        let runtime = Runtime::builder(store.clone(), log.clone(), catalog, clock.clone())
            .settings(settings())
            .start()
            .await
            .unwrap();
        let datasets = Arc::new(DatasetIndex::load(store.as_ref()).await.unwrap());
        runtime.use_datasets(datasets.clone());
        let state =
            AppState::new(store.clone(), Catalog::default(), clock.clone(), Limits::default())
                .with_runtime(runtime.clone())
                .with_dataset_listener(datasets);
        (runtime, state)
    }

    /// Stops this runtime and starts another over the same store and log, as a server
    /// restart does.
    async fn restart(&mut self) {
        self.runtime.shutdown().await;
        let (runtime, state) = Self::serve(&self.store, &self.log, &self.clock).await;
        self.runtime = runtime;
        self.state = state;
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        key: &str,
        body: Option<Body>,
    ) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("X-API-Key", key)
            .header("content-type", "application/json")
            .body(body.unwrap_or_else(Body::empty))
            .unwrap();
        let response = sluice_api::app(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, value)
    }

    async fn post(&self, path: &str, key: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, key, Some(Body::from(body.to_string()))).await
    }

    async fn create(&self, filter_values: &[&str], extra: Value) -> String {
        let mut body = json!({
            "name": "usdc",
            "description": "USDC and WETH transfers",
            "pipeline_config": {
                "source": {"chain": "base", "entity": "erc20_token_transfer"},
                "transforms": [{"type": "redis_set_filter", "uid": "tf-tokens",
                                "filter_expr": "root = this.token_address",
                                "set_values": filter_values}],
                "sinks": [{"type": "kafka", "uid": "sk-out", "name": "transfers"}]
            }
        });
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        let (status, created) = self.post("/api/v1/beam", &self.owner, body).await;
        assert_eq!(status, StatusCode::OK, "{created}");
        created["id"].as_str().unwrap().to_owned()
    }

    /// Creates a pipeline of `transforms` over Base transfers into the managed sink `sk-out`,
    /// deploys it, and answers its id.
    async fn deploy_with(&self, transforms: Value) -> String {
        let body = json!({
            "name": "scripted", "description": "a deployed pipeline of a test",
            "pipeline_config": {
                "source": {"chain": "base", "entity": "erc20_token_transfer"},
                "transforms": transforms,
                "sinks": [{"type": "kafka", "uid": "sk-out", "name": "transfers"}]
            }
        });
        let (status, created) = self.post("/api/v1/beam", &self.owner, body).await;
        assert_eq!(status, StatusCode::OK, "{created}");
        let id = created["id"].as_str().unwrap().to_owned();
        self.action(&id, "deploy").await;
        id
    }

    async fn action(&self, id: &str, action: &str) -> Value {
        let (status, body) =
            self.post(&format!("/api/v1/beam/{id}/{action}"), &self.owner, json!({})).await;
        assert_eq!(status, StatusCode::OK, "{action}: {body}");
        body
    }

    /// Ingests transfers `(n, token)` into base.erc20_token_transfer.
    async fn ingest(&self, transfers: &[(u64, &str)]) {
        let ndjson: String =
            transfers.iter().map(|(n, token)| transfer(*n, token).to_string() + "\n").collect();
        let (status, body) = self
            .call(
                Method::POST,
                "/api/v1/streams/base/erc20_token_transfer/records",
                &self.operator,
                Some(Body::from(ndjson)),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["accepted"], transfers.len());
    }

    /// Reads the sink from offset 0 until it holds `count` records (or a generous deadline
    /// passes, which fails the test) and returns their transfer numbers, sorted: records of
    /// different keys may come from different partitions, so only per-key order is defined.
    async fn delivered(&self, id: &str, count: usize) -> Vec<u64> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let numbers = self.sink_now(id).await;
            if numbers.len() >= count || tokio::time::Instant::now() > deadline {
                return numbers;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn sink_now(&self, id: &str) -> Vec<u64> {
        let mut numbers: Vec<u64> =
            self.sink_records(id).await.iter().map(|r| r["value"]["n"].as_u64().unwrap()).collect();
        numbers.sort_unstable();
        numbers
    }

    /// The sink's records in delivery order.
    async fn sink_records(&self, id: &str) -> Vec<Value> {
        let path = format!("/api/v1/beam/{id}/sinks/sk-out/records?limit=10000");
        let (status, page) = self.call(Method::GET, &path, &self.owner, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        page["records"].as_array().unwrap().clone()
    }

    /// Waits until the deployment has read everything ingested so far.
    async fn settle(&self, id: &str) {
        settle(self.log.as_ref(), id).await;
    }
}

async fn deploy_delivers_only_matching_records_in_order_from_the_end_of_the_stream(stack: Stack) {
    stack.ingest(&[(1, USDC)]).await; // before the deploy: never delivered
    let id = stack.create(&[&USDC.to_uppercase().replace("0X", "0x")], json!({})).await;
    let deployed = stack.action(&id, "deploy").await;
    assert_eq!(deployed["status"], "deployed");
    assert_eq!(deployed["message"], format!("Pipeline {id} successfully deployed"));
    let sink = &deployed["sinks"][0];
    assert_eq!(sink["uid"], "sk-out");
    assert_eq!(sink["topic"], format!("sink.{id}.transfers"));
    assert_eq!(sink["records_url"], format!("/api/v1/beam/{id}/sinks/sk-out/records"));
    assert!(sink["consumer_snippets"]["curl"].as_str().unwrap().contains("records"));

    // Mixed case in the record still matches: values and extracted fields are lowercased.
    let upper = USDC.to_uppercase().replace("0X", "0x");
    stack.ingest(&[(2, USDC), (3, WETH), (4, &upper), (5, OTHER), (6, USDC)]).await;
    assert_eq!(stack.delivered(&id, 3).await, vec![2, 4, 6]);
    stack.settle(&id).await;
    assert_eq!(stack.sink_now(&id).await, vec![2, 4, 6]);

    // Records of one key arrive in the order they were ingested, with the key attached.
    let same_key = |n: u64| {
        let mut record = transfer(n, USDC);
        record["transaction_hash"] = json!(format!("0x{:064x}", 777));
        record["log_index"] = json!(1);
        record.to_string() + "\n"
    };
    for n in [10, 11, 12] {
        let (status, _) = stack
            .call(
                Method::POST,
                "/api/v1/streams/base/erc20_token_transfer/records",
                &stack.operator,
                Some(Body::from(same_key(n))),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(stack.delivered(&id, 6).await, vec![2, 4, 6, 10, 11, 12]);
    let keyed: Vec<u64> = stack
        .sink_records(&id)
        .await
        .iter()
        .filter(|r| r["key"] == format!("0x{:064x}:1", 777))
        .map(|r| r["value"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(keyed, vec![10, 11, 12]);
}

async fn a_value_added_after_deploy_lets_its_records_through_without_a_redeploy(stack: Stack) {
    let id = stack.create(&[USDC], json!({})).await;
    stack.action(&id, "deploy").await;
    stack.ingest(&[(1, WETH), (2, USDC)]).await;
    assert_eq!(stack.delivered(&id, 1).await, vec![2]);
    stack.settle(&id).await;
    let path = format!("/api/v1/beam/{id}/transforms/tf-tokens/filter-values");
    let (status, body) =
        stack.post(&path, &stack.owner, json!({"values": [WETH.to_uppercase()]})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    stack.ingest(&[(3, WETH), (4, OTHER)]).await;
    assert_eq!(stack.delivered(&id, 2).await, vec![2, 3]);
    let (status, _) = stack
        .call(
            Method::DELETE,
            &path,
            &stack.owner,
            Some(Body::from(json!({"values": [USDC]}).to_string())),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    stack.ingest(&[(5, USDC), (6, WETH)]).await;
    assert_eq!(stack.delivered(&id, 3).await, vec![2, 3, 6]);
}

async fn pause_holds_records_and_resume_skips_those_older_than_two_days(stack: Stack) {
    let id = stack.create(&[USDC], json!({})).await;
    stack.action(&id, "deploy").await;
    stack.ingest(&[(1, USDC)]).await;
    assert_eq!(stack.delivered(&id, 1).await, vec![1]);
    assert_eq!(
        stack.action(&id, "pause").await["message"],
        format!("Pipeline {id} successfully paused")
    );
    stack.ingest(&[(2, USDC)]).await; // will be older than 2 days at resume
    stack.clock.advance(chrono::Duration::hours(47));
    stack.ingest(&[(3, USDC)]).await; // held, within 2 days at resume
    stack.clock.advance(chrono::Duration::hours(1) + chrono::Duration::seconds(1));
    // Nothing moves while paused.
    assert_eq!(stack.sink_now(&id).await, vec![1]);
    stack.action(&id, "deploy").await;
    stack.ingest(&[(4, USDC)]).await;
    assert_eq!(stack.delivered(&id, 3).await, vec![1, 3, 4]);
    stack.settle(&id).await;
    assert_eq!(stack.sink_now(&id).await, vec![1, 3, 4]);
    let counters = stack.runtime.counters(&id).await.unwrap();
    assert_eq!(sluice_runtime::Counters::get(&counters.skipped_expired), 1);
}

#[tokio::test]
async fn pause_of_a_pipeline_that_is_not_deployed_has_no_effect() {
    let stack = Stack::new().await;
    let id = stack.create(&[USDC], json!({})).await;
    let body = stack.action(&id, "pause").await;
    assert!(body["message"].as_str().unwrap().contains("not deployed"), "{body}");
    assert_eq!(stack.runtime.state(&id).await.unwrap(), None);
    let body = stack.action(&id, "teardown").await;
    assert!(body["message"].as_str().unwrap().contains("not deployed"), "{body}");
}

async fn teardown_then_deploy_never_delivers_what_arrived_in_between(stack: Stack) {
    let id = stack.create(&[USDC], json!({})).await;
    stack.action(&id, "deploy").await;
    stack.ingest(&[(1, USDC)]).await;
    assert_eq!(stack.delivered(&id, 1).await, vec![1]);
    let body = stack.action(&id, "teardown").await;
    assert_eq!(body["message"], format!("Pipeline {id} successfully torn down"));
    // The managed topic went with the deployment.
    let (status, _) = stack
        .call(Method::GET, &format!("/api/v1/beam/{id}/sinks/sk-out/records"), &stack.owner, None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    stack.ingest(&[(2, USDC), (3, USDC)]).await; // the gap
    stack.action(&id, "deploy").await;
    stack.ingest(&[(4, USDC)]).await;
    assert_eq!(stack.delivered(&id, 1).await, vec![4]);
    stack.settle(&id).await;
    assert_eq!(stack.sink_now(&id).await, vec![4]);
    // The config is kept.
    let (status, _) =
        stack.call(Method::GET, &format!("/api/v1/beam/{id}"), &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK);
}

async fn redeploying_under_load_with_changing_worker_counts_loses_nothing(stack: Stack) {
    let stack = Arc::new(stack);
    let id = stack.create(&[USDC], json!({})).await;
    stack.action(&id, "deploy").await;
    let feeder = {
        let stack = stack.clone();
        tokio::spawn(async move {
            for batch in 0..40u64 {
                let transfers: Vec<(u64, &str)> = (0..25)
                    .map(|i| (batch * 25 + i, if i % 2 == 0 { USDC } else { WETH }))
                    .collect();
                stack.ingest(&transfers).await;
                tokio::task::yield_now().await;
            }
        })
    };
    for (round, size) in ["M", "S", "L", "S", "XL", "S"].iter().enumerate() {
        let path = format!("/api/v1/beam/{id}");
        let body = json!({
            "name": "usdc", "description": format!("round {round}"), "pod_size": size,
            "pipeline_config": {
                "source": {"chain": "base", "entity": "erc20_token_transfer"},
                "transforms": [{"type": "redis_set_filter", "uid": "tf-tokens", "filter_expr": "root = this.token_address"}],
                "sinks": [{"type": "kafka", "uid": "sk-out", "name": "transfers"}]
            }
        });
        let (status, updated) =
            stack.call(Method::PUT, &path, &stack.owner, Some(Body::from(body.to_string()))).await;
        assert_eq!(status, StatusCode::OK, "{updated}");
        stack.action(&id, "deploy").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    feeder.await.unwrap();
    let expected: Vec<u64> = (0..1000).filter(|n| n % 25 % 2 == 0).collect();
    let mut got = stack.delivered(&id, expected.len()).await;
    got.sort_unstable();
    got.dedup();
    assert_eq!(got, expected);
}

async fn a_restart_runs_deployed_pipelines_again_and_leaves_paused_ones_paused(mut stack: Stack) {
    let running = stack.create(&[USDC], json!({})).await;
    let paused = stack.create(&[USDC], json!({})).await;
    stack.action(&running, "deploy").await;
    stack.action(&paused, "deploy").await;
    stack.action(&paused, "pause").await;
    stack.restart().await;
    stack.ingest(&[(1, USDC)]).await;
    assert_eq!(stack.delivered(&running, 1).await, vec![1]);
    stack.settle(&running).await;
    assert_eq!(stack.sink_now(&paused).await, Vec::<u64>::new());
    assert_eq!(
        stack.runtime.state(&paused).await.unwrap(),
        Some(sluice_core::deployment::DeploymentState::Paused)
    );
    // Resuming delivers what was held.
    stack.action(&paused, "deploy").await;
    assert_eq!(stack.delivered(&paused, 1).await, vec![1]);
}

async fn a_deployment_from_before_dead_letters_gets_its_topics_at_restart(mut stack: Stack) {
    let script = "function transform(r) {\n  console.log('n', r.n);\n  if (r.n === 2) throw new Error('two');\n  return r;\n}";
    let id = stack.deploy_with(json!([{"type": "v8", "uid": "tf-s", "script": script}])).await;
    // An older version deployed it: no dead-letter or logs topic.
    stack.runtime.shutdown().await;
    {
        assert!(stack.log.delete_topic(&sluice_bus::topics::dead_letter_topic(&id)).await.unwrap());
        assert!(stack.log.delete_topic(&sluice_bus::topics::logs_topic(&id)).await.unwrap());
    }
    stack.restart().await;
    // The batch writes a log line and a dead letter: both topics must exist again.
    stack.ingest(&[(1, USDC), (2, OTHER)]).await;
    stack.settle(&id).await;
    assert_eq!(stack.sink_now(&id).await, vec![1]);
    let path = format!("/api/v1/beam/{id}/dead-letters");
    let (status, page) = stack.call(Method::GET, &path, &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["dead_letters"][0]["record"]["n"], 2);
}

async fn deleting_a_deployed_pipeline_tears_it_down(stack: Stack) {
    let id = stack.create(&[USDC], json!({})).await;
    stack.action(&id, "deploy").await;
    let (status, _) =
        stack.call(Method::DELETE, &format!("/api/v1/beam/{id}"), &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stack.runtime.state(&id).await.unwrap(), None);
    assert_eq!(stack.log.topic(&format!("sink.{id}.transfers")).await.unwrap(), None);
}

#[tokio::test]
async fn lifecycle_calls_need_edit_and_hide_pipelines_from_strangers() {
    let stack = Stack::new().await;
    let id = stack.create(&[USDC], json!({})).await;
    let reader_id = {
        let (_, me) = stack.call(Method::GET, "/api/v1/me", &stack.reader, None).await;
        me["user_id"].as_str().unwrap().to_owned()
    };
    let (status, body) = stack
        .call(
            Method::PUT,
            &format!("/api/v1/beam/{id}/permissions"),
            &stack.owner,
            Some(Body::from(
                json!({"editors": [], "readers": [reader_id], "viewer_teams": []}).to_string(),
            )),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stranger = key_for(stack.store.as_ref(), "other", "t", "eve", false).await;
    for action in ["deploy", "pause", "teardown"] {
        let path = format!("/api/v1/beam/{id}/{action}");
        assert_eq!(
            stack.post(&path, &stack.reader, json!({})).await.0,
            StatusCode::FORBIDDEN,
            "{action}"
        );
        assert_eq!(
            stack.post(&path, &stranger, json!({})).await.0,
            StatusCode::NOT_FOUND,
            "{action}"
        );
        assert_eq!(
            stack.post(&path, "slk_0000000000000000000000000000000000000000", json!({})).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    stack.action(&id, "deploy").await;
    let records = format!("/api/v1/beam/{id}/sinks/sk-out/records");
    assert_eq!(stack.call(Method::GET, &records, &stack.reader, None).await.0, StatusCode::OK);
    assert_eq!(stack.call(Method::GET, &records, &stranger, None).await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        stack.call(Method::GET, &format!("{records}?limit=0"), &stack.owner, None).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
}

async fn ingest_takes_every_line_or_none_and_names_the_bad_lines(stack: Stack) {
    let path = "/api/v1/streams/base/erc20_token_transfer/records";
    let good = transfer(1, USDC).to_string();
    let mut missing_key = transfer(2, USDC);
    missing_key.as_object_mut().unwrap().remove("log_index");
    let body = format!("{good}\n\n{{not json\n[1,2]\n{missing_key}\n{good}\n");
    let (status, errors) =
        stack.call(Method::POST, path, &stack.operator, Some(Body::from(body))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{errors}");
    let locs: Vec<Value> =
        errors["detail"].as_array().unwrap().iter().map(|d| d["loc"].clone()).collect();
    assert_eq!(locs, vec![json!(["body", 3]), json!(["body", 4]), json!(["body", 5])]);
    let ends: u64 =
        stack.log.offsets("base.erc20_token_transfer").await.unwrap().iter().map(|r| r.end).sum();
    assert_eq!(ends, 0, "a rejected request appends nothing");

    assert_eq!(
        stack.call(Method::POST, path, &stack.owner, Some(Body::from(good.clone()))).await.0,
        StatusCode::FORBIDDEN
    );
    let unknown = "/api/v1/streams/base/nothing/records";
    assert_eq!(
        stack.call(Method::POST, unknown, &stack.operator, Some(Body::from(good.clone()))).await.0,
        StatusCode::NOT_FOUND
    );
    let solana_zerolag = "/api/v1/streams/solana/nonvoting_transaction/records?zerolag=true";
    assert_eq!(
        stack.call(Method::POST, solana_zerolag, &stack.operator, Some(Body::from("{}"))).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("{path}?zerolag=true"),
            &stack.operator,
            Some(Body::from(good)),
        )
        .await;
    assert_eq!((status, body["accepted"].as_u64()), (StatusCode::OK, Some(1)));
    let _ = &stack.dir;
}

/// An open `…/records/stream` response, read event by event.
struct EventStream {
    body: Body,
    buffer: String,
}

impl EventStream {
    async fn open(stack: &Stack, id: &str, query: &str, last_event_id: Option<&str>) -> Self {
        let mut request = Request::builder()
            .uri(format!("/api/v1/beam/{id}/sinks/sk-out/records/stream{query}"))
            .header("X-API-Key", &stack.owner);
        if let Some(last) = last_event_id {
            request = request.header("Last-Event-ID", last);
        }
        let response = sluice_api::app(stack.state.clone())
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Self { body: response.into_body(), buffer: String::new() }
    }

    /// The next event as `(event, id, data)`, skipping keep-alive comments; fails the test
    /// when none comes within a generous deadline.
    async fn next(&mut self) -> (String, String, Value) {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::new(), String::new(), Value::Null);
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        id = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = serde_json::from_str(v).unwrap();
                    }
                }
                if !event.is_empty() {
                    return (event, id, data);
                }
                continue;
            }
            let frame = tokio::time::timeout(Duration::from_secs(30), self.body.frame())
                .await
                .expect("an event within 30 s")
                .expect("the stream is still open")
                .unwrap();
            if let Ok(bytes) = frame.into_data() {
                self.buffer.push_str(std::str::from_utf8(&bytes).unwrap());
            }
        }
    }
}

#[tokio::test]
async fn ingest_rejects_a_record_with_a_repeated_key_at_any_depth_and_appends_nothing() {
    let stack = Stack::new().await;
    let path = "/api/v1/streams/base/erc20_token_transfer/records";
    let good = transfer(1, USDC).to_string();
    // The filter's raw reader takes the first copy, the sink's and scripts' JSON the last:
    // accepted, this record would pass a filter on USDC and be delivered as OTHER.
    let bypass = transfer(2, OTHER).to_string().replacen(
        r#""token_address":"#,
        &format!(r#""token_address":"{USDC}","token_address":"#),
        1,
    );
    let nested =
        transfer(3, USDC).to_string().replacen('{', r#"{"extra":{"a":[{"b":1,"b":2}]},"#, 1);
    let escaped = transfer(4, USDC).to_string().replacen(
        r#""token_address":"#,
        &format!(r#""token_\u0061ddress":"{USDC}","token_address":"#),
        1,
    );
    let body = format!("{good}\n{bypass}\n{nested}\n{escaped}\n");
    let (status, errors) =
        stack.call(Method::POST, path, &stack.operator, Some(Body::from(body))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{errors}");
    let detail: Vec<(Value, Value, Value)> = errors["detail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["loc"].clone(), d["msg"].clone(), d["type"].clone()))
        .collect();
    assert_eq!(
        detail,
        vec![
            (
                json!(["body", 2]),
                json!(r#"line 2: duplicate key "token_address""#),
                json!("json_duplicate_key")
            ),
            (
                json!(["body", 3]),
                json!(r#"line 3: duplicate key "extra"."a"[0]."b""#),
                json!("json_duplicate_key")
            ),
            (
                json!(["body", 4]),
                json!(r#"line 4: duplicate key "token_address""#),
                json!("json_duplicate_key")
            ),
        ]
    );
    let ends: u64 =
        stack.log.offsets("base.erc20_token_transfer").await.unwrap().iter().map(|r| r.end).sum();
    assert_eq!(ends, 0, "a rejected request appends nothing");
    let _ = &stack.dir;
}

async fn the_live_tail_streams_new_records_resumes_after_last_event_id_and_ends_at_teardown(
    stack: Stack,
) {
    let id = stack.create(&[USDC], json!({})).await;
    let deployed = stack.action(&id, "deploy").await;
    let stream_url = format!("/api/v1/beam/{id}/sinks/sk-out/records/stream");
    assert_eq!(deployed["sinks"][0]["connection"]["stream_url"], stream_url);
    assert!(
        deployed["sinks"][0]["consumer_snippets"]["curl_live"]
            .as_str()
            .unwrap()
            .contains(&stream_url)
    );
    stack.ingest(&[(1, USDC), (2, OTHER)]).await;
    assert_eq!(stack.delivered(&id, 1).await, vec![1]);

    // Without an offset the tail starts at the end: only records delivered from now on.
    let mut live = EventStream::open(&stack, &id, "", None).await;
    stack.ingest(&[(3, USDC), (4, OTHER), (5, USDC)]).await;
    let (event, event_id, data) = live.next().await;
    assert_eq!((event.as_str(), event_id.as_str()), ("record", "1"));
    assert_eq!(data["offset"], 1);
    assert_eq!(data["value"]["n"], 3);
    assert_eq!(data["key"], format!("0x{:064x}:3", 3));
    assert_eq!(live.next().await.2["value"]["n"], 5);

    // From an offset, and resuming after a Last-Event-ID (which wins over the query).
    let mut from_start = EventStream::open(&stack, &id, "?offset=0", None).await;
    let numbers: Vec<Value> =
        [from_start.next().await.2, from_start.next().await.2, from_start.next().await.2]
            .iter()
            .map(|d| d["value"]["n"].clone())
            .collect();
    assert_eq!(numbers, vec![json!(1), json!(3), json!(5)]);
    let mut resumed = EventStream::open(&stack, &id, "?offset=0", Some("1")).await;
    assert_eq!(resumed.next().await.1, "2");

    // Teardown removes the sink: an open tail says so and closes.
    stack.action(&id, "teardown").await;
    let (event, _, data) = live.next().await;
    assert_eq!(event, "end");
    assert!(data["detail"].as_str().unwrap().contains("torn down"));

    // A bad Last-Event-ID is a 422; a stranger gets 404.
    let request = Request::builder()
        .uri(format!("/api/v1/beam/{id}/sinks/sk-out/records/stream"))
        .header("X-API-Key", &stack.owner)
        .header("Last-Event-ID", "abc")
        .body(Body::empty())
        .unwrap();
    let response = sluice_api::app(stack.state.clone()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let path = format!("/api/v1/beam/{id}/sinks/sk-out/records/stream");
    let (status, _) = stack.call(Method::GET, &path, &stack.reader, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

async fn scripts_reshape_drop_and_fan_out_and_failing_records_become_dead_letters(stack: Stack) {
    let script = r#"
function transform(r) {
  if (r.n === 13) throw new Error("unlucky " + r.n);
  if (r.n === 21) { while (true) {} }
  if (r.n === 23) { const hoard = []; while (true) hoard.push(new Array(100000).fill(r.n)); }
  if (r.n % 2 === 0) return null;
  if (r.n === 7) return [{n: 7, part: 1}, {n: 7, part: 2}];
  return {n: r.n, token: r.token_address.toUpperCase()};
}"#;
    let id = stack
        .deploy_with(json!([
            {"type": "redis_set_filter", "uid": "tf-usdc",
             "filter_expr": "root = this.token_address", "set_values": [USDC]},
            {"type": "v8", "uid": "tf-shape", "script": script}
        ]))
        .await;

    let mut transfers: Vec<(u64, &str)> = (1..=24).map(|n| (n, USDC)).collect();
    transfers.push((25, OTHER)); // the set filter drops it before the script sees it
    stack.ingest(&transfers).await;
    stack.settle(&id).await;

    let delivered = stack.sink_records(&id).await;
    let mut shaped: Vec<(String, Value)> = delivered
        .iter()
        .map(|r| (r["key"].as_str().unwrap().to_owned(), r["value"].clone()))
        .collect();
    shaped.sort_by_key(|(_, value)| (value["n"].as_u64(), value["part"].as_u64()));
    let numbers: Vec<u64> = shaped.iter().map(|(_, v)| v["n"].as_u64().unwrap()).collect();
    assert_eq!(numbers, vec![1, 3, 5, 7, 7, 9, 11, 15, 17, 19]);
    assert_eq!(shaped[0].1, json!({"n": 1, "token": USDC.to_uppercase()}));
    // Fan-out: each output keeps the source key plus its position.
    let key7 = format!("0x{:064x}:7", 7);
    assert_eq!(shaped[3], (format!("{key7}#0"), json!({"n": 7, "part": 1})));
    assert_eq!(shaped[4], (format!("{key7}#1"), json!({"n": 7, "part": 2})));
    assert_eq!(shaped[5].0, format!("0x{:064x}:9", 9));

    // The throwing record, the endless loop and the memory bomb are set aside, each after
    // every attempt, with its error; the records around them flowed.
    let (status, page) = stack
        .call(Method::GET, &format!("/api/v1/beam/{id}/dead-letters"), &stack.owner, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let dead = page["dead_letters"].as_array().unwrap();
    let mut by_n: Vec<(u64, &Value)> =
        dead.iter().map(|d| (d["record"]["n"].as_u64().unwrap(), d)).collect();
    by_n.sort_by_key(|(n, _)| *n);
    assert_eq!(by_n.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![13, 21, 23]);
    for (_, letter) in &by_n {
        assert_eq!(letter["transform_uid"], "tf-shape");
        assert_eq!(letter["attempts"], 3);
    }
    let error = |i: usize| by_n[i].1["error"].as_str().unwrap().to_owned();
    assert!(error(0).contains("unlucky 13") && error(0).contains("line 3"), "{}", error(0));
    assert!(error(1).contains("time budget"), "{}", error(1));
    assert!(error(2).contains("out of memory"), "{}", error(2));
    assert_eq!(by_n[0].1["key"], format!("0x{:064x}:3", 13));
    assert_eq!(page["next_offset"], 3);

    let counters = stack.runtime.counters(&id).await.unwrap();
    assert_eq!(sluice_runtime::Counters::get(&counters.dead_lettered), 3);
    assert!(sluice_runtime::Counters::get(&counters.oom_restarts) >= 1);
    assert_eq!(sluice_runtime::Counters::get(&counters.sent), 10);

    // Strangers do not see them; teardown removes them.
    let path = format!("/api/v1/beam/{id}/dead-letters");
    assert_eq!(stack.call(Method::GET, &path, &stack.reader, None).await.0, StatusCode::NOT_FOUND);
    stack.action(&id, "teardown").await;
    assert_eq!(stack.call(Method::GET, &path, &stack.owner, None).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_script_output_over_a_cap_dead_letters_its_record_once_and_others_flow() {
    let stack = Stack::new().await;
    let script = r#"
function transform(r) {
  if (r.n === 2) return new Array(1000000).fill(r);
  if (r.n === 3) { r.blob = "x".repeat(30 * 1024 * 1024); return r; }
  if (r.n === 4) return new Array(10).fill({n: r.n});
  return r;
}"#;
    let id = stack.deploy_with(json!([{"type": "v8", "uid": "tf-big", "script": script}])).await;
    stack.ingest(&[(1, USDC), (2, USDC), (3, USDC), (4, USDC), (5, USDC)]).await;
    stack.settle(&id).await;

    let delivered = stack.sink_records(&id).await;
    let mut numbers: Vec<u64> =
        delivered.iter().map(|r| r["value"]["n"].as_u64().unwrap()).collect();
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!(numbers, vec![1, 4, 5], "the records under the caps flowed");
    assert_eq!(delivered.len(), 1 + 10 + 1, "a fan-out under the cap is delivered whole");

    let (status, page) = stack
        .call(Method::GET, &format!("/api/v1/beam/{id}/dead-letters"), &stack.owner, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let mut dead: Vec<(u64, String, u64)> = page["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let error = d["error"].as_str().unwrap().to_owned();
            (d["record"]["n"].as_u64().unwrap(), error, d["attempts"].as_u64().unwrap())
        })
        .collect();
    dead.sort();
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!(dead[0].0, 2);
    assert!(
        dead[0].1.contains("1000000 records") && dead[0].1.contains("at most 1000"),
        "{}",
        dead[0].1
    );
    assert_eq!(dead[1].0, 3);
    assert!(dead[1].1.contains("larger than 1048576 bytes"), "{}", dead[1].1);
    // A cap is broken the same way every time: no retries.
    assert_eq!((dead[0].2, dead[1].2), (1, 1));
    stack.action(&id, "teardown").await;
}

#[tokio::test]
async fn a_script_sees_dataset_entries_added_after_deploy() {
    let stack = Stack::new().await;
    let (status, dataset) =
        stack.post("/api/v1/beam/datasets", &stack.owner, json!({"name": "watched"})).await;
    assert_eq!(status, StatusCode::OK, "{dataset}");
    let dataset_id = dataset["id"].as_str().unwrap().to_owned();
    let script = "function transform(r) {\n  return beam.contains('watched', [r.from_address, r.to_address]) ? r : null;\n}";
    let id = stack.deploy_with(json!([{"type": "v8", "uid": "tf-watch", "script": script}])).await;

    stack.ingest(&[(1, USDC), (2, WETH)]).await;
    stack.settle(&id).await;
    assert_eq!(stack.sink_now(&id).await, Vec::<u64>::new());

    // Every transfer's sender and receiver is OTHER; watching it (in upper case) lets the
    // next ones through with no redeploy.
    let path = format!("/api/v1/beam/datasets/{dataset_id}/entries");
    let (status, added) =
        stack.post(&path, &stack.owner, json!({"values": [OTHER.to_uppercase()]})).await;
    assert_eq!((status, added["count"].as_u64()), (StatusCode::OK, Some(1)));
    stack.ingest(&[(3, USDC), (4, WETH)]).await;
    assert_eq!(stack.delivered(&id, 2).await, vec![3, 4]);

    // Another user's dataset of the same name is not the owner's.
    let (status, _) = stack
        .call(
            Method::DELETE,
            &path,
            &stack.owner,
            Some(Body::from(json!({"values": [OTHER]}).to_string())),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, theirs) =
        stack.post("/api/v1/beam/datasets", &stack.reader, json!({"name": "watched"})).await;
    assert_eq!(status, StatusCode::OK, "{theirs}");
    let their_entries = format!("/api/v1/beam/datasets/{}/entries", theirs["id"].as_str().unwrap());
    assert_eq!(
        stack.post(&their_entries, &stack.reader, json!({"values": [OTHER]})).await.0,
        StatusCode::OK
    );
    stack.ingest(&[(5, USDC)]).await;
    stack.settle(&id).await;
    assert_eq!(stack.sink_now(&id).await, vec![3, 4]);
}

#[tokio::test]
async fn a_batch_whose_script_output_passes_the_budget_is_finished_in_the_next_batch() {
    let stack = Stack::new().await;
    // About 4 MB per record (under the per-call caps): the 20 records read as one batch
    // pass the S budget of 64 MiB after 17 of them.
    let script = "const s = 'x'.repeat(999000);\nfunction transform(r) { return [{n: r.n, s}, {n: r.n, s}, {n: r.n, s}, {n: r.n, s}]; }";
    let id = stack.deploy_with(json!([{"type": "v8", "uid": "tf-s", "script": script}])).await;
    let transfers: Vec<(u64, &str)> = (1..=20).map(|n| (n, USDC)).collect();
    stack.ingest(&transfers).await;
    stack.settle(&id).await;

    let sink = sluice_bus::topics::sink_topic(&id, "transfers");
    let ends = stack.log.offsets(&sink).await.unwrap();
    let total: u64 = ends.iter().map(|r| r.end).sum();
    assert_eq!(total, 80, "every record's four outputs, once: none lost, none repeated");
    let mut keys = Vec::new();
    for (partition, _) in ends.iter().enumerate() {
        for record in stack.log.read(&sink, partition as u32, 0, 100).await.unwrap() {
            keys.push(String::from_utf8(record.key.to_vec()).unwrap());
        }
    }
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 80);
    let counters = stack.runtime.counters(&id).await.unwrap();
    assert_eq!(sluice_runtime::Counters::get(&counters.received), 20);
    assert_eq!(sluice_runtime::Counters::get(&counters.dead_lettered), 0);
    let _ = ends;
    stack.action(&id, "teardown").await;
}

#[tokio::test]
async fn console_lines_of_a_retried_record_are_kept_once_from_its_last_attempt() {
    let stack = Stack::new().await;
    let script = r#"
let tries = 0;
function transform(r) {
  if (r.n === 2) {
    tries += 1;
    console.log('record 2 try ' + tries);
    if (tries < 3) throw new Error('flaky ' + tries);
    return r;
  }
  if (r.n === 3) { console.warn('record 3 always fails'); throw new Error('bad 3'); }
  console.log('record ' + r.n);
  return r;
}"#;
    let id = stack.deploy_with(json!([{"type": "v8", "uid": "tf-s", "script": script}])).await;
    stack.ingest(&[(1, USDC), (2, USDC), (3, USDC), (4, USDC)]).await;
    stack.settle(&id).await;
    assert_eq!(stack.sink_now(&id).await, vec![1, 2, 4], "2 succeeded on its third call");

    let (status, logs) = stack
        .call(Method::GET, &format!("/api/v1/beam/{id}/logs?limit=1000"), &stack.owner, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{logs}");
    let mut lines: Vec<&str> =
        logs["logs"].as_array().unwrap().iter().map(|l| l["message"].as_str().unwrap()).collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        vec!["record 1", "record 2 try 3", "record 3 always fails", "record 4"],
        "one copy per record, from its last call"
    );
    stack.action(&id, "teardown").await;
}

#[allow(
    clippy::cognitive_complexity,
    reason = "one scenario in the order it happens: a failing script, its dead letters, the fix, the replay and the console lines"
)]
async fn dead_letters_replay_through_the_fixed_script_and_console_lines_are_readable(stack: Stack) {
    let body = |script: &str| {
        json!({
            "name": "replayed", "description": "fails on 13 until fixed",
            "pipeline_config": {
                "source": {"chain": "base", "entity": "erc20_token_transfer"},
                "transforms": [{"type": "v8", "uid": "tf-s", "script": script}],
                "sinks": [{"type": "kafka", "uid": "sk-out", "name": "transfers"}]
            }
        })
    };
    let broken = "function transform(r) {\n  console.log('saw', r.n);\n  if (r.n === 13) throw new Error('bad ' + r.n);\n  return r;\n}";
    let (status, created) = stack.post("/api/v1/beam", &stack.owner, body(broken)).await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    stack.action(&id, "deploy").await;
    stack.ingest(&[(12, USDC), (13, USDC), (14, USDC)]).await;
    stack.settle(&id).await;
    assert_eq!(stack.sink_now(&id).await, vec![12, 14]);

    // The script's console lines, oldest first, newest `limit`.
    let (status, logs) = stack
        .call(Method::GET, &format!("/api/v1/beam/{id}/logs?limit=1000"), &stack.owner, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{logs}");
    let lines: Vec<&str> =
        logs["logs"].as_array().unwrap().iter().map(|l| l["message"].as_str().unwrap()).collect();
    // 13 is tried three times; its lines are kept once, from the last call.
    assert_eq!(lines.iter().filter(|l| **l == "saw 13").count(), 1, "{lines:?}");
    assert!(lines.contains(&"saw 12") && lines.contains(&"saw 14"));
    assert_eq!(logs["logs"][0]["transform_uid"], "tf-s");
    assert_eq!(logs["logs"][0]["level"], "info");
    let (_, last) = stack
        .call(Method::GET, &format!("/api/v1/beam/{id}/logs?limit=1"), &stack.owner, None)
        .await;
    assert_eq!(last["logs"].as_array().unwrap().len(), 1);
    let (status, _) = stack
        .call(Method::GET, &format!("/api/v1/beam/{id}/logs?limit=0"), &stack.owner, None)
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // Replaying with the script still broken dead-letters the record again.
    let replay = format!("/api/v1/beam/{id}/dead-letters/replay");
    let (status, report) = stack.post(&replay, &stack.owner, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!((report["replayed"].as_u64(), report["delivered"].as_u64()), (Some(1), Some(0)));
    assert_eq!(
        (report["dead_lettered"].as_u64(), report["next_offset"].as_u64()),
        (Some(1), Some(1))
    );

    // Fix the script, redeploy, replay: the record reaches the sink, nothing is pending.
    let fixed = "function transform(r) { r.fixed = true; return r; }";
    let (status, updated) = stack
        .call(
            Method::PUT,
            &format!("/api/v1/beam/{id}"),
            &stack.owner,
            Some(Body::from(body(fixed).to_string())),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    stack.action(&id, "deploy").await;
    // Strangers cannot replay (nor see the pipeline).
    assert_eq!(stack.post(&replay, &stack.reader, json!({})).await.0, StatusCode::NOT_FOUND);
    let (status, report) = stack.post(&replay, &stack.owner, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!((report["replayed"].as_u64(), report["delivered"].as_u64()), (Some(1), Some(1)));
    assert_eq!(
        (report["dead_lettered"].as_u64(), report["next_offset"].as_u64()),
        (Some(0), Some(2))
    );
    assert_eq!(stack.sink_now(&id).await, vec![12, 13, 14]);
    let replayed =
        stack.sink_records(&id).await.into_iter().find(|r| r["value"]["n"] == 13).unwrap();
    assert_eq!(replayed["value"]["fixed"], true);
    assert_eq!(replayed["key"], format!("0x{:064x}:3", 13));

    let letters = format!("/api/v1/beam/{id}/dead-letters");
    let (_, pending) = stack.call(Method::GET, &letters, &stack.owner, None).await;
    assert_eq!(pending["dead_letters"], json!([]));
    assert_eq!(pending["next_offset"], 2);
    let (_, history) =
        stack.call(Method::GET, &format!("{letters}?offset=0"), &stack.owner, None).await;
    assert_eq!(history["dead_letters"].as_array().unwrap().len(), 2);
    // A second replay has nothing to do.
    let (_, again) = stack.post(&replay, &stack.owner, json!({})).await;
    assert_eq!((again["replayed"].as_u64(), again["next_offset"].as_u64()), (Some(0), Some(2)));
}

/// Status and JSON body of a tail request that is expected to fail before streaming.
async fn tail_error(
    stack: &Stack,
    id: &str,
    query: &str,
    last_event_id: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .uri(format!("/api/v1/beam/{id}/sinks/sk-out/records/stream{query}"))
        .header("X-API-Key", &stack.owner);
    if let Some(last) = last_event_id {
        request = request.header("Last-Event-ID", last);
    }
    let response = sluice_api::app(stack.state.clone())
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    if status == StatusCode::OK {
        return (status, Value::Null);
    }
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

async fn an_offset_past_the_end_of_a_sink_is_a_416_naming_the_valid_range(stack: Stack) {
    let id = stack.create(&[USDC], json!({})).await;
    stack.action(&id, "deploy").await;
    stack.ingest(&[(1, USDC), (2, USDC)]).await;
    assert_eq!(stack.delivered(&id, 2).await, vec![1, 2]);
    let records = format!("/api/v1/beam/{id}/sinks/sk-out/records");

    // At the end: the next record is not written yet, so an empty page to poll.
    let (status, page) =
        stack.call(Method::GET, &format!("{records}?offset=2"), &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["records"], json!([]));
    assert_eq!(page["next_offset"], 2);

    for offset in ["3", "1000"] {
        let path = format!("{records}?offset={offset}");
        let (status, body) = stack.call(Method::GET, &path, &stack.owner, None).await;
        assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{body}");
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains(&format!("offset {offset} is out of range")), "{body}");
        assert!(detail.contains("[0, 2]"), "{body}");
    }

    // The dead letters too: none yet, so only offset 0 is in range.
    let dead = format!("/api/v1/beam/{id}/dead-letters");
    let (status, page) =
        stack.call(Method::GET, &format!("{dead}?offset=0"), &stack.owner, None).await;
    assert_eq!((status, page["dead_letters"].clone()), (StatusCode::OK, json!([])), "{page}");
    let (status, body) =
        stack.call(Method::GET, &format!("{dead}?offset=1"), &stack.owner, None).await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("[0, 0]"), "{body}");

    // The live tail too.
    let (status, body) = tail_error(&stack, &id, "?offset=3", None).await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("[0, 2]"), "{body}");
    let (status, _) = tail_error(&stack, &id, "?offset=2", None).await;
    assert_eq!(status, StatusCode::OK);
}

async fn a_last_event_id_past_the_end_is_a_416_and_never_replays_the_sink(stack: Stack) {
    let id = stack.create(&[USDC], json!({})).await;
    stack.action(&id, "deploy").await;
    stack.ingest(&[(1, USDC), (2, USDC)]).await;
    assert_eq!(stack.delivered(&id, 2).await, vec![1, 2]);

    for last in ["18446744073709551615", "2", "99"] {
        let (status, body) = tail_error(&stack, &id, "", Some(last)).await;
        assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{last}: {body}");
        assert!(body["detail"].as_str().unwrap().contains("last record is 1"), "{body}");
    }
    // Not an offset at all: a 422.
    let (status, body) = tail_error(&stack, &id, "", Some("18446744073709551616")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["header", "Last-Event-ID"]));

    // Resuming after the last record waits for the next one.
    let mut resumed = EventStream::open(&stack, &id, "", Some("1")).await;
    stack.ingest(&[(3, USDC)]).await;
    let (event, event_id, data) = resumed.next().await;
    assert_eq!((event.as_str(), event_id.as_str()), ("record", "2"));
    assert_eq!(data["value"]["n"], 3);
}

/// The Kafka bus settings of the test broker, under a topic prefix no other test uses.
pub fn kafka_settings() -> KafkaSettings {
    let url = std::env::var("SLUICE_TEST_KAFKA_URL")
        .expect("SLUICE_TEST_KAFKA_URL must name a Kafka-API broker; run scripts/test");
    let mut settings = KafkaSettings::parse(&url).unwrap();
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    settings.topic_prefix = format!("t{nanos:x}.");
    settings
}

/// The delivery tests that matter for a stream log, on the embedded log and on Kafka.
mod on_both_logs {
    use super::Stack;

    macro_rules! on_both_logs {
        ($($name:ident),* $(,)?) => {
            mod embedded {
                $(#[tokio::test]
                async fn $name() {
                    super::super::$name(super::Stack::new().await).await;
                })*
            }
            mod kafka {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::super::$name(super::Stack::kafka().await).await;
                })*
            }
        };
    }

    on_both_logs!(
        deploy_delivers_only_matching_records_in_order_from_the_end_of_the_stream,
        pause_holds_records_and_resume_skips_those_older_than_two_days,
        teardown_then_deploy_never_delivers_what_arrived_in_between,
        redeploying_under_load_with_changing_worker_counts_loses_nothing,
        a_restart_runs_deployed_pipelines_again_and_leaves_paused_ones_paused,
        a_value_added_after_deploy_lets_its_records_through_without_a_redeploy,
        a_deployment_from_before_dead_letters_gets_its_topics_at_restart,
        deleting_a_deployed_pipeline_tears_it_down,
        ingest_takes_every_line_or_none_and_names_the_bad_lines,
        the_live_tail_streams_new_records_resumes_after_last_event_id_and_ends_at_teardown,
        scripts_reshape_drop_and_fan_out_and_failing_records_become_dead_letters,
        dead_letters_replay_through_the_fixed_script_and_console_lines_are_readable,
        an_offset_past_the_end_of_a_sink_is_a_416_naming_the_valid_range,
        a_last_event_id_past_the_end_is_a_416_and_never_replays_the_sink,
    );
}

/// On the Kafka bus, the deploy response is all a Kafka client needs: its Python snippet,
/// run as given against the real broker, reads exactly the matching records, each with its
/// stream key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_a_python_client_reads_the_sink_with_only_what_deploy_returned() {
    let stack = Stack::kafka().await;
    let id = stack.create(&[USDC], json!({})).await;
    let deployed = stack.action(&id, "deploy").await;
    let sink = &deployed["sinks"][0];
    assert_eq!(sink["connection"]["transport"], "kafka", "{sink}");
    assert_eq!(sink["connection"]["security_protocol"], "PLAINTEXT");
    stack.ingest(&[(1, USDC), (2, WETH), (3, USDC), (4, OTHER), (5, USDC)]).await;
    assert_eq!(stack.delivered(&id, 3).await, vec![1, 3, 5]);
    let expected: Vec<(String, u64)> = stack
        .sink_records(&id)
        .await
        .iter()
        .map(|r| (r["key"].as_str().unwrap().to_owned(), r["value"]["n"].as_u64().unwrap()))
        .collect();

    let snippet = sink["consumer_snippets"]["python"].as_str().unwrap().to_owned();
    let python = std::env::var("SLUICE_TEST_KAFKA_PYTHON").expect(
        "SLUICE_TEST_KAFKA_PYTHON must name a Python with confluent_kafka; run scripts/test",
    );
    let read = tokio::task::spawn_blocking(move || read_lines(&python, &snippet, 3)).await.unwrap();
    let mut got: Vec<(String, u64)> = read
        .iter()
        .map(|line| {
            let record: Value = serde_json::from_str(line).unwrap();
            (record["key"].as_str().unwrap().to_owned(), record["value"]["n"].as_u64().unwrap())
        })
        .collect();
    got.sort();
    let mut expected = expected;
    expected.sort();
    assert_eq!(got, expected);
}

/// Runs `script` with `python` until it printed `count` lines (or a generous deadline, which
/// fails the test), then stops it.
fn read_lines(python: &str, script: &str, count: usize) -> Vec<String> {
    use std::io::BufRead as _;
    let mut child = std::process::Command::new(python)
        .args(["-c", script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut lines = Vec::new();
    while lines.len() < count {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match receiver.recv_timeout(left) {
            Ok(line) => lines.push(line),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        lines.len(),
        count,
        "the client printed {lines:?}; its stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    lines
}

#[tokio::test]
async fn a_node_of_its_own_lists_itself_with_its_workers_to_operators_only() {
    let stack = Stack::new().await;
    let id = stack.create(&[USDC], json!({"pod_size": "M"})).await;
    stack.action(&id, "deploy").await;
    let (status, body) = stack.call(Method::GET, "/api/v1/nodes", &stack.operator, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let nodes = body["items"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{body}");
    assert_eq!(nodes[0]["is_self"], true);
    let workers: Vec<&str> = nodes[0]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(workers, [format!("{id}-worker-0"), format!("{id}-worker-1")]);
    assert!(nodes[0]["workers"].as_array().unwrap().iter().all(|w| w["config_id"] == id.as_str()));
    // Worker health on a node of its own names no node.
    let (_, stats) = stack
        .call(Method::GET, &format!("/api/v1/beam/{id}/deploy/stats"), &stack.owner, None)
        .await;
    assert!(stats["workers_health"]["workers"][0].get("node").is_none(), "{stats}");

    let (status, body) = stack.call(Method::GET, "/api/v1/nodes", &stack.owner, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    stack.action(&id, "pause").await;
    let (_, body) = stack.call(Method::GET, "/api/v1/nodes", &stack.operator, None).await;
    assert_eq!(body["items"][0]["workers"], json!([]));
}
