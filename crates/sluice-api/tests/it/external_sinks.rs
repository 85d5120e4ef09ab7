//! Sinks outside Sluice through the HTTP API, on the embedded log: organization secrets,
//! a webhook receiver in this test (a real HTTP server on a loopback port: signed batches,
//! retries, dead letters, outages), and the user's own Kafka cluster (the Kafka-API broker
//! `scripts/test` starts, `SLUICE_TEST_KAFKA_URL`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode};
use chrono::{TimeZone, Utc};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_api::{AppState, Limits};
use sluice_bus::{EmbeddedLog, KafkaLog, KafkaSettings, StreamLog, TopicConfig};
use sluice_core::catalog::Catalog;
use sluice_core::clock::ManualClock;
use sluice_runtime::sets::StoreSetSource;
use sluice_runtime::{Runtime, SinkEnv};
use sluice_store::secrets::{Keyring, SecretsKey};
use sluice_store::{MetadataStore, Secrets, SqliteStore};
use tower::ServiceExt;

use crate::pipeline_stack::{
    Faults, FaultyLog, OTHER, SOURCE, USDC, key_for, settings, settle, transfer,
};

const HOOK_SECRET: &str = "whsec-0123456789-abcdef";

/// One request the receiver got.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    headers: HeaderMap,
    body: Bytes,
}

impl Received {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
    }

    /// The body, inflated when it was sent gzipped.
    fn json(&self) -> Vec<Value> {
        let raw = if self.header("content-encoding") == "gzip" {
            use std::io::Read as _;
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&self.body[..]).read_to_end(&mut out).unwrap();
            out
        } else {
            self.body.to_vec()
        };
        serde_json::from_slice(&raw).unwrap()
    }
}

/// How the receiver answers.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    Accept,
    /// Every request: this status, with `Retry-After: 1`.
    Refuse(u16),
    /// Requests whose body holds this text: 400 with a message; others: 200.
    RejectContaining(String),
}

#[derive(Clone)]
pub(crate) struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    refused: Arc<Mutex<u64>>,
    answer: Arc<Mutex<Answer>>,
    address: SocketAddr,
}

impl Receiver {
    pub(crate) async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener).await
    }

    async fn serve(listener: tokio::net::TcpListener) -> Self {
        let receiver = Self {
            got: Arc::default(),
            refused: Arc::default(),
            answer: Arc::new(Mutex::new(Answer::Accept)),
            address: listener.local_addr().unwrap(),
        };
        let state = receiver.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let state = state.clone();
                async move { state.answer(headers, body) }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        receiver
    }

    fn answer(&self, headers: HeaderMap, body: Bytes) -> axum::response::Response {
        use axum::response::IntoResponse as _;
        let answer = self.answer.lock().unwrap().clone();
        let text = String::from_utf8_lossy(&body).into_owned();
        let refuse = |status: u16, message: &str| {
            *self.refused.lock().unwrap() += 1;
            let mut response =
                (StatusCode::from_u16(status).unwrap(), message.to_owned()).into_response();
            response.headers_mut().insert("retry-after", "1".parse().unwrap());
            response
        };
        match answer {
            Answer::Refuse(status) => refuse(status, "down for maintenance"),
            Answer::RejectContaining(needle) if text.contains(&needle) => {
                refuse(400, "record 3 is not welcome here")
            }
            _ => {
                self.got.lock().unwrap().push(Received { headers, body });
                StatusCode::NO_CONTENT.into_response()
            }
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/hook", self.address)
    }

    pub(crate) fn set(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    fn requests(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    /// Transfer numbers received, in arrival order, repeats included.
    pub(crate) fn numbers(&self) -> Vec<u64> {
        self.requests()
            .iter()
            .flat_map(|r| r.json())
            .map(|item| item["value"]["n"].as_u64().unwrap())
            .collect()
    }

    /// Waits until `count` records arrived (a generous deadline fails the test).
    pub(crate) async fn wait_for(&self, count: usize) -> Vec<u64> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let numbers = self.numbers();
            if numbers.len() >= count {
                return numbers;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {count} records arrived",
                numbers.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub(crate) struct Stack {
    _dir: tempfile::TempDir,
    store: Arc<dyn MetadataStore>,
    pub(crate) log: Arc<dyn StreamLog>,
    /// The same log, whose faults a test injects.
    pub(crate) faulty: Arc<FaultyLog>,
    pub(crate) runtime: Arc<Runtime>,
    state: AppState,
    operator: String,
    /// Owns the pipelines; an ordinary member of `acme`.
    pub(crate) owner: String,
    /// An org admin of `acme`.
    admin: String,
    /// A member of another organization.
    stranger: String,
}

impl Stack {
    pub(crate) async fn new() -> Self {
        Self::with_egress(None).await
    }

    /// A stack whose `static_egress_ip` pipelines send from `egress`.
    async fn with_egress(egress: Option<std::net::IpAddr>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock =
            Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0).unwrap()));
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store: Arc<dyn MetadataStore> = Arc::new(SqliteStore::open(&url).await.unwrap());
        let inner =
            Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
        let faulty = Arc::new(FaultyLog::new(inner, Faults::default()));
        let log: Arc<dyn StreamLog> = faulty.clone();
        let keyring = Keyring::new(SecretsKey::generate().unwrap(), Vec::new());
        let secrets = Secrets::new(store.clone(), keyring);
        let env = SinkEnv { secrets: Some(secrets.clone()), egress };
        let runtime = Runtime::builder(
            store.clone(),
            log.clone(),
            Arc::new(Catalog::default()),
            clock.clone(),
        )
        .settings(settings())
        .set_source(Arc::new(StoreSetSource(store.clone())))
        .sinks(env)
        .start()
        .await
        .unwrap();
        let state = AppState::new(store.clone(), Catalog::default(), clock, Limits::default())
            .with_runtime(runtime.clone())
            .with_sinks(secrets, egress);
        let operator = key_for(store.as_ref(), "sluice", "ops", "root", true).await;
        let owner = key_for(store.as_ref(), "acme", "data", "ann", false).await;
        let admin_identity = store.ensure_identity("acme", "data", "ada", false).await.unwrap();
        store.set_org_admin(&admin_identity.user.id, true).await.unwrap();
        let admin = sluice_api::auth::issue_key(store.as_ref(), &admin_identity.user.id, None)
            .await
            .unwrap()
            .unwrap();
        let stranger = key_for(store.as_ref(), "globex", "data", "gus", false).await;
        Self { _dir: dir, store, log, faulty, runtime, state, operator, owner, admin, stranger }
    }

    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("X-API-Key", key)
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        let response = sluice_api::app(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(HOOK_SECRET), "a response shows a secret value: {text}");
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// `/metrics` as the owner sees it.
    pub(crate) async fn metrics(&self) -> String {
        let request = Request::builder()
            .uri("/metrics")
            .header("X-API-Key", &self.owner)
            .body(Body::empty())
            .unwrap();
        let response = sluice_api::app(self.state.clone()).oneshot(request).await.unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    pub(crate) async fn put_secret(&self, name: &str, value: &str) {
        let path = format!("/api/v1/beam/secrets/{name}");
        let (status, body) =
            self.call(Method::PUT, &path, &self.admin, Some(json!({"value": value}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    pub(crate) fn pipeline(guarantee: &str, sink: Value) -> Value {
        json!({
            "name": "hooked", "description": "USDC transfers to the user's systems",
            "delivery_guarantee": guarantee,
            "pipeline_config": {
                "source": {"chain": "base", "entity": "erc20_token_transfer"},
                "transforms": [{"type": "redis_set_filter", "uid": "tf-usdc",
                                "filter_expr": "root = this.token_address", "set_values": [USDC]}],
                "sinks": [sink]
            }
        })
    }

    /// Creates and deploys a pipeline; answers its id and the deploy response.
    pub(crate) async fn deployed(&self, guarantee: &str, sink: Value) -> (String, Value) {
        self.deployed_body(Self::pipeline(guarantee, sink)).await
    }

    pub(crate) async fn deployed_body(&self, body: Value) -> (String, Value) {
        let (status, created) =
            self.call(Method::POST, "/api/v1/beam", &self.owner, Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{created}");
        let id = created["id"].as_str().unwrap().to_owned();
        let (status, deployed) = self
            .call(Method::POST, &format!("/api/v1/beam/{id}/deploy"), &self.owner, Some(json!({})))
            .await;
        assert_eq!(status, StatusCode::OK, "{deployed}");
        (id, deployed)
    }

    /// Ingests transfers numbered `numbers`: USDC for odd ones, another token for even ones.
    pub(crate) async fn ingest(&self, numbers: std::ops::RangeInclusive<u64>) {
        self.ingest_again(numbers, 0).await;
    }

    /// As [`Stack::ingest`], with `n` moved up by `shift` but the keys of the unshifted
    /// numbers: the same keys again, later.
    async fn ingest_again(&self, numbers: std::ops::RangeInclusive<u64>, shift: u64) {
        let ndjson: String = numbers
            .map(|n| {
                let mut record = transfer(n, if n % 2 == 1 { USDC } else { OTHER });
                record["n"] = json!(n + shift);
                record.to_string() + "\n"
            })
            .collect();
        let request = Request::builder()
            .method(Method::POST)
            .uri("/api/v1/streams/base/erc20_token_transfer/records")
            .header("X-API-Key", &self.operator)
            .body(Body::from(ndjson))
            .unwrap();
        let response = sluice_api::app(self.state.clone()).oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }

    pub(crate) async fn stats(&self, id: &str) -> Value {
        let (status, stats) = self
            .call(Method::GET, &format!("/api/v1/beam/{id}/deploy/stats"), &self.owner, None)
            .await;
        assert_eq!(status, StatusCode::OK, "{stats}");
        stats
    }

    /// Waits until the deployment's worker reports it is blocked on its sink; answers its
    /// health entry (a generous deadline fails the test).
    pub(crate) async fn blocked_worker(&self, id: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let worker = self.stats(id).await["workers_health"]["workers"][0].clone();
            if worker["status"] == "BlockedOnSink" {
                assert_eq!(worker["is_blocked_on_sink"], true);
                assert!(worker["blocked_since"].is_string(), "{worker}");
                return worker;
            }
            assert!(tokio::time::Instant::now() < deadline, "never blocked: {worker}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(crate) async fn committed(&self, id: &str) -> u64 {
        let group = sluice_bus::topics::deployment_group(id);
        self.log.committed(&group, SOURCE).await.unwrap().values().sum()
    }
}

pub(crate) fn odd(numbers: std::ops::RangeInclusive<u64>) -> Vec<u64> {
    numbers.filter(|n| n % 2 == 1).collect()
}

pub(crate) fn distinct(numbers: &[u64]) -> Vec<u64> {
    numbers.iter().copied().collect::<BTreeSet<_>>().into_iter().collect()
}

/// Numbers `n` and `n + 10_000` share a key: `n` must come first.
fn assert_in_order_per_key(numbers: &[u64]) {
    let position = |n: u64| numbers.iter().position(|m| *m == n);
    for &n in numbers.iter().filter(|n| **n < 10_000) {
        if let Some(later) = position(n + 10_000) {
            assert!(
                position(n).unwrap() < later,
                "{} arrived before {n} of the same key",
                n + 10_000
            );
        }
    }
}

fn hmac_hex(key: &str, message: &[u8]) -> String {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a request's signature headers against `key`, as a receiver would.
fn verify(request: &Received, key: &str) {
    let timestamp = request.header("x-webhook-timestamp");
    let nonce = request.header("x-webhook-nonce");
    let parsed = uuid::Uuid::parse_str(nonce).expect("the nonce is a UUID");
    assert_eq!(parsed.get_version_num(), 4);
    let sent_at: i64 = timestamp.parse().unwrap();
    assert!((Utc::now().timestamp() - sent_at).abs() < 300, "timestamp {timestamp}");
    let mut signed = format!("{nonce}.{timestamp}.").into_bytes();
    signed.extend_from_slice(&request.body);
    assert_eq!(request.header("x-signature-256"), format!("sha256={}", hmac_hex(key, &signed)));
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_are_managed_by_org_admins_and_operators_and_never_shown() {
    let stack = Stack::new().await;
    let path = "/api/v1/beam/secrets/WEBHOOK_KEY";
    let body = json!({"value": HOOK_SECRET});
    // An ordinary member may not write; an org admin and an operator may.
    let (status, _) = stack.call(Method::PUT, path, &stack.owner, Some(body.clone())).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, stored) = stack.call(Method::PUT, path, &stack.admin, Some(body.clone())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stored["name"], "WEBHOOK_KEY");
    assert!(stored.get("value").is_none());
    let (status, _) = stack
        .call(Method::PUT, "/api/v1/beam/secrets/OPS_KEY", &stack.operator, Some(body.clone()))
        .await;
    assert_eq!(status, StatusCode::OK);
    // Members list names and times, never values; other organizations see none of them.
    let (status, listed) =
        stack.call(Method::GET, "/api/v1/beam/secrets", &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["name"], "WEBHOOK_KEY");
    assert!(listed[0]["updated_at"].is_string());
    let (_, theirs) = stack.call(Method::GET, "/api/v1/beam/secrets", &stack.stranger, None).await;
    assert_eq!(theirs, json!([]));
    // Bad input: a bad name, a missing or empty value, an extra field.
    for (path, body) in [
        ("/api/v1/beam/secrets/has%20space", json!({"value": "v"})),
        (path, json!({})),
        (path, json!({"value": ""})),
        (path, json!({"value": "v", "extra": 1})),
    ] {
        let (status, error) = stack.call(Method::PUT, path, &stack.admin, Some(body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
        assert!(error["detail"][0]["loc"].is_array());
    }
    // A pipeline may name only secrets its organization has.
    let sink = json!({"type": "webhook", "uid": "sk-hook", "name": "hook",
                      "url": "https://example.com/in", "hash_key": "MISSING_KEY"});
    let (status, error) = stack
        .call(
            Method::POST,
            "/api/v1/beam",
            &stack.owner,
            Some(Stack::pipeline("at_least_once", sink)),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        error["detail"][0]["loc"],
        json!(["body", "pipeline_config", "sinks", 0, "hash_key"])
    );
    // static_egress_ip on a server without an egress address is refused.
    let sink = json!({"type": "webhook", "uid": "sk-hook", "name": "hook", "url": "https://example.com/in"});
    let mut body = Stack::pipeline("at_least_once", sink);
    body["static_egress_ip"] = json!(true);
    let (status, error) = stack.call(Method::POST, "/api/v1/beam", &stack.owner, Some(body)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(error["detail"][0]["loc"], json!(["body", "static_egress_ip"]));
    assert!(error["detail"][0]["msg"].as_str().unwrap().contains("--egress-bind-addr"));
    // Deleting: members may not; an admin may, once.
    let (status, _) = stack.call(Method::DELETE, path, &stack.owner, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = stack.call(Method::DELETE, path, &stack.admin, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = stack.call(Method::DELETE, path, &stack.admin, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The value is sealed at rest.
    stack.put_secret("WEBHOOK_KEY", HOOK_SECRET).await;
    let acme = stack.store.ensure_identity("acme", "data", "ann", false).await.unwrap().org.id;
    let raw = stack.store.secret(&acme, "WEBHOOK_KEY").await.unwrap().unwrap();
    assert!(!raw.sealed.bytes.windows(HOOK_SECRET.len()).any(|w| w == HOOK_SECRET.as_bytes()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_gets_signed_ordered_batches_and_offsets_move_only_after_its_2xx() {
    let stack = Stack::new().await;
    let receiver = Receiver::start().await;
    stack.put_secret("WEBHOOK_KEY", HOOK_SECRET).await;
    let sink = json!({"type": "webhook", "uid": "sk-hook", "name": "hook", "url": receiver.url(),
                      "hash_key": "WEBHOOK_KEY", "compression": "gzip"});
    let (id, deployed) = stack.deployed("at_least_once", sink).await;
    let connection = &deployed["sinks"][0]["connection"];
    assert_eq!(connection["transport"], "webhook");
    assert_eq!(connection["signed"], true);
    stack.ingest(1..=2400).await;
    // The same keys again, later: each key's records must arrive in that order.
    stack.ingest_again(1..=2400, 10_000).await;
    let numbers = receiver.wait_for(2400).await;
    settle(stack.log.as_ref(), &id).await;
    assert_eq!(numbers.len(), 2400, "every USDC transfer once");
    let first: Vec<u64> = numbers.iter().copied().filter(|n| *n < 10_000).collect();
    assert_eq!(distinct(&first), odd(1..=2400));
    assert_in_order_per_key(&numbers);
    let requests = receiver.requests();
    assert!(requests.len() >= 5, "2400 records come in several requests of at most 500");
    let mut batch_ids = BTreeSet::new();
    for request in &requests {
        verify(request, HOOK_SECRET);
        assert_eq!(request.header("content-type"), "application/json");
        assert_eq!(request.header("content-encoding"), "gzip");
        let items = request.json();
        assert!(items.len() <= 500);
        for item in &items {
            let n = item["value"]["n"].as_u64().unwrap() % 10_000;
            assert_eq!(
                item["key"],
                format!("0x{n:064x}:{}", n % 10),
                "each record carries its stream key"
            );
        }
        assert_eq!(request.header("idempotency-key"), request.header("x-sluice-batch-id"));
        assert!(batch_ids.insert(request.header("x-sluice-batch-id").to_owned()));
    }
    let stats = stack.stats(&id).await;
    assert_eq!(stats["stale_sinks"], json!([]));
    assert_eq!(stats["workers_health"]["workers"][0]["status"], "Running");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_without_hash_key_gets_no_signature_headers() {
    let stack = Stack::new().await;
    let receiver = Receiver::start().await;
    let sink = json!({"type": "webhook", "uid": "sk-hook", "name": "hook", "url": receiver.url()});
    let (_, _) = stack.deployed("at_least_once", sink).await;
    stack.ingest(1..=4).await;
    receiver.wait_for(2).await;
    for request in receiver.requests() {
        for header in
            ["x-webhook-timestamp", "x-webhook-nonce", "x-signature-256", "content-encoding"]
        {
            assert!(request.headers.get(header).is_none(), "{header}");
        }
        assert_eq!(request.json().len(), 2);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sixty_second_webhook_outage_holds_the_source_and_loses_nothing() {
    let stack = Stack::new().await;
    let receiver = Receiver::start().await;
    let sink = json!({"type": "webhook", "uid": "sk-hook", "name": "hook", "url": receiver.url()});
    let (id, _) = stack.deployed("at_least_once", sink).await;
    stack.ingest(1..=10).await;
    receiver.wait_for(5).await;
    settle(stack.log.as_ref(), &id).await;
    let committed_before = stack.committed(&id).await;

    receiver.set(Answer::Refuse(503));
    let outage = tokio::time::Instant::now();
    stack.ingest(11..=400).await;
    // The worker is blocked on its sink, says so, and holds the source.
    let worker = stack.blocked_worker(&id).await;
    assert!(worker["last_error"].as_str().unwrap().contains("503"), "{worker}");
    while outage.elapsed() < Duration::from_secs(60) {
        assert_eq!(stack.committed(&id).await, committed_before, "offsets moved during the outage");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(*receiver.refused.lock().unwrap() >= 5, "the worker kept retrying");
    let metrics = stack.runtime.counters(&id).await.unwrap();
    assert!(sluice_runtime::Counters::get(&metrics.output_errors) >= 5);

    receiver.set(Answer::Accept);
    let numbers = receiver.wait_for(200).await;
    settle(stack.log.as_ref(), &id).await;
    assert_eq!(distinct(&numbers), odd(1..=400), "every record arrived");
    let worker = stack.stats(&id).await["workers_health"]["workers"][0].clone();
    assert_eq!(worker["status"], "Running");
    assert_eq!(worker["is_blocked_on_sink"], false);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_down_at_the_socket_level_is_retried_until_it_listens() {
    let stack = Stack::new().await;
    // A port nobody listens on yet.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let sink = json!({"type": "webhook", "uid": "sk-hook", "name": "hook",
                      "url": format!("http://{address}/hook")});
    let (id, _) = stack.deployed("at_least_once", sink).await;
    stack.ingest(1..=20).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while sluice_runtime::Counters::get(&stack.runtime.counters(&id).await.unwrap().output_errors)
        < 2
    {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let worker = stack.stats(&id).await["workers_health"]["workers"][0].clone();
    assert!(worker["last_error"].as_str().unwrap().contains("cannot connect"), "{worker}");
    assert_eq!(stack.committed(&id).await, 0);
    let metrics = stack.metrics().await;
    let blocked =
        format!("sluice_pipeline_workers{{config_id=\"{id}\",health=\"blocked_on_sink\"}} 1");
    assert!(metrics.contains(&blocked), "{metrics}");
    let receiver = Receiver::serve(tokio::net::TcpListener::bind(address).await.unwrap()).await;
    let numbers = receiver.wait_for(10).await;
    assert_eq!(distinct(&numbers), odd(1..=20));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_webhook_batch_is_dead_lettered_with_the_status_and_the_pipeline_goes_on() {
    let stack = Stack::new().await;
    let receiver = Receiver::start().await;
    receiver.set(Answer::RejectContaining("\"n\":3,".to_owned()));
    let sink = json!({"type": "webhook", "uid": "sk-hook", "name": "hook", "url": receiver.url()});
    // A script counts how often a record went through it.
    let mut body = Stack::pipeline("at_least_once", sink);
    body["pipeline_config"]["transforms"].as_array_mut().unwrap().push(json!({
        "type": "v8", "uid": "tf-count",
        "script": "function transform(r) { r.hops = (r.hops || 0) + 1; return r; }"
    }));
    let (id, _) = stack.deployed_body(body).await;
    stack.ingest(1..=10).await;
    settle(stack.log.as_ref(), &id).await;
    stack.ingest(11..=20).await;
    settle(stack.log.as_ref(), &id).await;
    let numbers = receiver.numbers();
    assert!(!numbers.contains(&3));
    assert!(odd(11..=20).iter().all(|n| numbers.contains(n)), "later batches went on: {numbers:?}");
    let (status, letters) = stack
        .call(
            Method::GET,
            &format!("/api/v1/beam/{id}/dead-letters?offset=0&limit=100"),
            &stack.owner,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{letters}");
    let records = letters["dead_letters"].as_array().unwrap();
    let dead: Vec<u64> = records.iter().map(|r| r["record"]["n"].as_u64().unwrap()).collect();
    assert!(dead.contains(&3), "{letters}");
    assert_eq!(dead.len() + numbers.len(), 10, "every record is delivered or dead-lettered");
    let letter = &records[0];
    assert_eq!(letter["sink_uid"], "sk-hook");
    assert_eq!(letter["transform_uid"], Value::Null);
    let error = letter["error"].as_str().unwrap();
    assert!(error.contains("HTTP 400") && error.contains("not welcome"), "{error}");
    // Fixed on the receiver's side, a replay delivers them.
    receiver.set(Answer::Accept);
    let (status, replayed) = stack
        .call(
            Method::POST,
            &format!("/api/v1/beam/{id}/dead-letters/replay"),
            &stack.owner,
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{replayed}");
    let requests = receiver.requests();
    let three: Vec<Value> =
        requests.iter().flat_map(|r| r.json()).filter(|item| item["value"]["n"] == 3).collect();
    // Replayed straight to the sink: the transforms do not run on their own output again.
    assert_eq!(three.len(), 1);
    assert_eq!(three[0]["value"]["hops"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn best_effort_drops_and_counts_what_a_down_webhook_refuses() {
    let stack = Stack::new().await;
    let receiver = Receiver::start().await;
    receiver.set(Answer::Refuse(503));
    let sink = json!({"type": "webhook", "uid": "sk-hook", "name": "hook", "url": receiver.url()});
    let (id, _) = stack.deployed("best_effort", sink).await;
    stack.ingest(1..=20).await;
    settle(stack.log.as_ref(), &id).await;
    let counters = stack.runtime.counters(&id).await.unwrap();
    assert_eq!(sluice_runtime::Counters::get(&counters.dropped), 10);
    receiver.set(Answer::Accept);
    stack.ingest(21..=24).await;
    assert_eq!(distinct(&receiver.wait_for(2).await), vec![21, 23]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_secret_marks_the_sink_stale_and_workers_keep_the_old_value_until_redeployed() {
    let stack = Stack::new().await;
    let receiver = Receiver::start().await;
    stack.put_secret("WEBHOOK_KEY", HOOK_SECRET).await;
    let sink = json!({"type": "webhook", "uid": "sk-hook", "name": "hook", "url": receiver.url(),
                      "hash_key": "WEBHOOK_KEY"});
    let (id, _) = stack.deployed("at_least_once", sink).await;
    stack.put_secret("WEBHOOK_KEY", "the-rotated-key").await;
    assert_eq!(stack.stats(&id).await["stale_sinks"], json!(["sk-hook"]));
    stack.ingest(1..=2).await;
    receiver.wait_for(1).await;
    verify(&receiver.requests()[0], HOOK_SECRET);
    let (status, _) = stack
        .call(Method::POST, &format!("/api/v1/beam/{id}/deploy"), &stack.owner, Some(json!({})))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stack.stats(&id).await["stale_sinks"], json!([]));
    stack.ingest(3..=4).await;
    receiver.wait_for(2).await;
    verify(receiver.requests().last().unwrap(), "the-rotated-key");
    // A deleted secret: stale, and a deploy names what is missing.
    let (status, _) =
        stack.call(Method::DELETE, "/api/v1/beam/secrets/WEBHOOK_KEY", &stack.admin, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(stack.stats(&id).await["stale_sinks"], json!(["sk-hook"]));
    let (status, error) = stack
        .call(Method::POST, &format!("/api/v1/beam/{id}/deploy"), &stack.owner, Some(json!({})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(error["detail"][0]["msg"].as_str().unwrap().contains("WEBHOOK_KEY"), "{error}");
}

fn kafka_url() -> String {
    std::env::var("SLUICE_TEST_KAFKA_URL")
        .expect("SLUICE_TEST_KAFKA_URL must name the Kafka-API broker (scripts/test starts one)")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_external_kafka_sink_produces_keyed_records_to_the_users_topic() {
    let stack = Stack::new().await;
    let url = kafka_url();
    let settings = KafkaSettings::parse(&url).unwrap();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let cluster = KafkaLog::connect(settings, clock).await.unwrap();
    let topic = format!("users-topic-{}", uuid::Uuid::new_v4().simple());
    cluster
        .create_topic(
            &topic,
            TopicConfig { partitions: 1, retention: sluice_bus::Retention::default() },
        )
        .await
        .unwrap();
    let brokers = url.trim_start_matches("kafka://").split('?').next().unwrap().to_owned();
    let sink = json!({"type": "external_kafka", "uid": "sk-kafka", "name": "theirs",
                      "bootstrap_servers": brokers, "topic": topic, "compression": "gzip"});
    let (id, deployed) = stack.deployed("at_least_once", sink).await;
    assert_eq!(deployed["sinks"][0]["connection"]["topic"], topic);
    stack.ingest(1..=200).await;
    stack.ingest_again(1..=200, 10_000).await;
    settle(stack.log.as_ref(), &id).await;
    // Committed means acknowledged by the brokers: every record is there now.
    let records = cluster.read(&topic, 0, 0, 1000).await.unwrap();
    let numbers: Vec<u64> = records
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.value).unwrap()["n"].as_u64().unwrap())
        .collect();
    // Once each (the source's 8 partitions interleave; a key's records stay in order).
    assert_eq!(numbers.len(), 200);
    let first: Vec<u64> = numbers.iter().copied().filter(|n| *n < 10_000).collect();
    assert_eq!(distinct(&first), odd(1..=200));
    assert_in_order_per_key(&numbers);
    for record in &records {
        let n =
            serde_json::from_slice::<Value>(&record.value).unwrap()["n"].as_u64().unwrap() % 10_000;
        assert_eq!(record.key, format!("0x{n:064x}:{}", n % 10).into_bytes());
    }
    let (status, _) = stack
        .call(Method::POST, &format!("/api/v1/beam/{id}/teardown"), &stack.owner, Some(json!({})))
        .await;
    assert!(status.is_success());
    cluster.delete_topic(&topic).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nats_sink_publishes_every_record_to_jetstream_before_committing() {
    use sluice_runtime::sinks::nats::{Connection, NatsAuth};
    let url = std::env::var("SLUICE_TEST_NATS_URL")
        .expect("SLUICE_TEST_NATS_URL must name a nats-server -js (scripts/test starts one)");
    let stack = Stack::new().await;
    let name = format!("API_{}", uuid::Uuid::new_v4().simple());
    let mut admin = Connection::open(&url, &NatsAuth::None, false).await.unwrap();
    let config = json!({"name": name, "subjects": [format!("{name}.>")], "storage": "memory"});
    let created = admin
        .request(&format!("$JS.API.STREAM.CREATE.{name}"), config.to_string().as_bytes())
        .await
        .unwrap();
    assert!(serde_json::from_slice::<Value>(&created).unwrap().get("error").is_none());
    let sink = json!({"type": "nats", "uid": "sk-nats", "name": "jetstream", "url": url,
                      "subject": format!("{name}.usdc")});
    let (id, deployed) = stack.deployed("at_least_once", sink).await;
    assert_eq!(deployed["sinks"][0]["connection"]["transport"], "nats");
    stack.ingest(1..=300).await;
    settle(stack.log.as_ref(), &id).await;
    // Committed means JetStream acknowledged: all 150 USDC transfers are in the stream.
    let info = admin.request(&format!("$JS.API.STREAM.INFO.{name}"), b"").await.unwrap();
    let info: Value = serde_json::from_slice(&info).unwrap();
    assert_eq!(info["state"]["messages"], 150, "{info}");
    // A stream that stops capturing the subject: the worker is blocked, nothing is committed.
    let deleted = admin.request(&format!("$JS.API.STREAM.DELETE.{name}"), b"").await.unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&deleted).unwrap()["success"], true);
    let before = stack.committed(&id).await;
    stack.ingest(301..=310).await;
    let worker = stack.blocked_worker(&id).await;
    assert!(worker["last_error"].as_str().unwrap().contains("no responders"), "{worker}");
    assert_eq!(stack.committed(&id).await, before);
    // The stream is back: the held records arrive.
    admin
        .request(&format!("$JS.API.STREAM.CREATE.{name}"), config.to_string().as_bytes())
        .await
        .unwrap();
    settle(stack.log.as_ref(), &id).await;
    let info = admin.request(&format!("$JS.API.STREAM.INFO.{name}"), b"").await.unwrap();
    let info: Value = serde_json::from_slice(&info).unwrap();
    assert_eq!(info["state"]["messages"], 5, "{info}");
}

/// Runs the SNS test helper (`tests/it/scripts/sns_queue.py`) with the moto venv's Python
/// (`SLUICE_TEST_MOTO_PYTHON`); answers its JSON.
fn sns_helper(args: &[&str]) -> Value {
    let python = std::env::var("SLUICE_TEST_MOTO_PYTHON")
        .expect("SLUICE_TEST_MOTO_PYTHON must name the moto venv's python (scripts/test makes it)");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/scripts/sns_queue.py");
    let output = std::process::Command::new(python).arg(script).args(args).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn sns_endpoint() -> String {
    std::env::var("SLUICE_TEST_SNS_URL").expect(
        "SLUICE_TEST_SNS_URL must name the SNS-compatible server (scripts/test starts moto)",
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_sns_sink_publishes_one_signed_message_per_record_with_its_key() {
    let endpoint = sns_endpoint();
    let stack = Stack::new().await;
    let name = format!("sluice-{}", uuid::Uuid::new_v4().simple());
    let made = tokio::task::spawn_blocking({
        let (endpoint, name) = (endpoint.clone(), name.clone());
        move || sns_helper(&["setup", &endpoint, &name])
    })
    .await
    .unwrap();
    let topic_arn = made["topic_arn"].as_str().unwrap().to_owned();
    let queue_url = made["queue_url"].as_str().unwrap().to_owned();
    stack.put_secret("AWS_ID", "test").await;
    stack.put_secret("AWS_KEY", "test").await;
    let sink = json!({"type": "sns", "uid": "sk-sns", "name": "topic", "topic_arn": topic_arn,
                      "endpoint": endpoint, "access_key_id_secret": "AWS_ID",
                      "secret_access_key_secret": "AWS_KEY"});
    let (id, deployed) = stack.deployed("at_least_once", sink).await;
    assert_eq!(deployed["sinks"][0]["connection"]["topic_arn"], topic_arn);
    stack.ingest(1..=50).await;
    settle(stack.log.as_ref(), &id).await;
    // Committed means SNS took every message: the subscribed queue has all 25.
    let got = tokio::task::spawn_blocking({
        let (endpoint, queue_url) = (endpoint.clone(), queue_url.clone());
        move || sns_helper(&["drain", &endpoint, &queue_url, "25", "30"])
    })
    .await
    .unwrap();
    let got = got.as_array().unwrap();
    let mut numbers = Vec::new();
    for message in got {
        let record: Value = serde_json::from_str(message["message"].as_str().unwrap()).unwrap();
        let n = record["n"].as_u64().unwrap();
        assert_eq!(message["attributes"]["sluice_key"], format!("0x{n:064x}:{}", n % 10));
        assert!(message["attributes"]["sluice_batch_id"].is_string());
        numbers.push(n);
    }
    assert_eq!(numbers.len(), 25);
    assert_eq!(distinct(&numbers), odd(1..=50));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_sns_topic_that_does_not_exist_refuses_the_batch_into_dead_letters() {
    let endpoint = sns_endpoint();
    let stack = Stack::new().await;
    stack.put_secret("AWS_ID", "test").await;
    stack.put_secret("AWS_KEY", "test").await;
    let missing =
        format!("arn:aws:sns:us-east-1:123456789012:missing-{}", uuid::Uuid::new_v4().simple());
    let sink = json!({"type": "sns", "uid": "sk-sns", "name": "topic", "topic_arn": missing,
                      "endpoint": endpoint, "access_key_id_secret": "AWS_ID",
                      "secret_access_key_secret": "AWS_KEY"});
    let (id, _) = stack.deployed("at_least_once", sink).await;
    stack.ingest(1..=4).await;
    settle(stack.log.as_ref(), &id).await;
    let (status, letters) = stack
        .call(
            Method::GET,
            &format!("/api/v1/beam/{id}/dead-letters?offset=0&limit=100"),
            &stack.owner,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let letters = letters["dead_letters"].as_array().unwrap();
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert_eq!(letters[0]["sink_uid"], "sk-sns");
    let error = letters[0]["error"].as_str().unwrap();
    assert!(error.contains("NotFound"), "{error}");
    assert!(!error.contains("test"), "no credential in the error: {error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn static_egress_ip_webhooks_send_from_the_operators_address() {
    let stack = Stack::with_egress(Some("127.0.0.1".parse().unwrap())).await;
    let (status, me) = stack.call(Method::GET, "/api/v1/me", &stack.admin, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me["is_org_admin"], true);
    let receiver = Receiver::start().await;
    let sink = json!({"type": "webhook", "uid": "sk-hook", "name": "hook", "url": receiver.url()});
    let mut body = Stack::pipeline("at_least_once", sink);
    body["static_egress_ip"] = json!(true);
    let (_, _) = stack.deployed_body(body).await;
    stack.ingest(1..=2).await;
    assert_eq!(receiver.wait_for(1).await, vec![1]);
    // A sink type that cannot bind an address is refused with the reason.
    let sink = json!({"type": "nats", "uid": "sk-n", "name": "n", "url": "nats://127.0.0.1:4222",
                      "subject": "s"});
    let mut body = Stack::pipeline("at_least_once", sink);
    body["static_egress_ip"] = json!(true);
    let (status, error) = stack.call(Method::POST, "/api/v1/beam", &stack.owner, Some(body)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(error["detail"][0]["msg"].as_str().unwrap().contains("'nats' sink cannot"), "{error}");
}
