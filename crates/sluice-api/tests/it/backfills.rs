//! Backfills through the HTTP API on the embedded log: records ingested, archived into the
//! warehouse, exported by a job to a managed destination and a webhook — with SQLite and a
//! local warehouse (the embedded default), and again with PostgreSQL and the warehouse in the
//! S3-compatible server `scripts/test` starts (`SLUICE_TEST_POSTGRES_URL`,
//! `SLUICE_TEST_S3_URL`; those tests fail without them).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use chrono::{TimeZone, Utc};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_api::{AppState, Limits};
use sluice_backfill::archiver::{Archiver, ArchiverSettings};
use sluice_backfill::jobs::{BackfillSettings, Backfills};
use sluice_backfill::storage::{LocalStorage, Storage};
use sluice_backfill::warehouse::Warehouse;
use sluice_bus::{EmbeddedLog, StreamLog};
use sluice_core::catalog::Catalog;
use sluice_core::clock::ManualClock;
use sluice_runtime::sets::StoreSetSource;
use sluice_runtime::{Runtime, SinkEnv};
use sluice_store::secrets::{Keyring, SecretsKey};
use sluice_store::{MetadataStore, Secrets, SqliteStore};
use tower::ServiceExt;

use crate::external_sinks::{Answer, Receiver};
use crate::pipeline_stack::{OTHER, USDC, key_for, settings};

/// Transfers are one a minute from this time on.
fn minute(n: u64) -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap() + chrono::Duration::minutes(n as i64)
}

fn transfer(n: u64) -> Value {
    json!({
        "n": n,
        "block_number": 1000 + n,
        "block_timestamp": sluice_core::time::format(minute(n)),
        "transaction_hash": format!("0x{n:064x}"),
        "log_index": 0,
        "token_address": if n % 2 == 1 { USDC } else { OTHER },
        "from_address": OTHER,
        "to_address": OTHER,
        "amount_str": "1.5",
    })
}

/// Where a stack keeps its metadata and its warehouse.
#[derive(Clone, Copy)]
enum Backend {
    /// SQLite and the local directory.
    Embedded,
    /// PostgreSQL and object storage.
    PostgresS3,
}

/// A fresh schema of the PostgreSQL `scripts/test` starts.
async fn postgres_store() -> Arc<dyn MetadataStore> {
    let options = sluice_store::testing::fresh_postgres_schema().await;
    Arc::new(sluice_store::PgStore::open_with(options).await.unwrap())
}

pub(crate) struct Stack {
    _dir: tempfile::TempDir,
    pub(crate) store: Arc<dyn MetadataStore>,
    staging: Arc<dyn Storage>,
    log: Arc<dyn StreamLog>,
    archiver: Archiver,
    pub(crate) state: AppState,
    pub(crate) operator: String,
    pub(crate) owner: String,
    stranger: String,
}

impl Stack {
    pub(crate) async fn new(chunk_rows: usize) -> Self {
        Self::on(Backend::Embedded, chunk_rows).await
    }

    async fn on(backend: Backend, chunk_rows: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 3, 10, 0, 0, 0).unwrap()));
        let store: Arc<dyn MetadataStore> = match backend {
            Backend::Embedded => {
                let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
                Arc::new(SqliteStore::open(&url).await.unwrap())
            }
            Backend::PostgresS3 => postgres_store().await,
        };
        let log: Arc<dyn StreamLog> =
            Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
        let secrets =
            Secrets::new(store.clone(), Keyring::new(SecretsKey::generate().unwrap(), Vec::new()));
        let env = SinkEnv { secrets: Some(secrets.clone()), egress: None };
        let catalog = Arc::new(Catalog::default());
        let runtime = Runtime::builder(store.clone(), log.clone(), catalog.clone(), clock.clone())
            .settings(settings())
            .set_source(Arc::new(StoreSetSource(store.clone())))
            .sinks(env.clone())
            .start()
            .await
            .unwrap();
        let (warehouse, staging): (Warehouse, Arc<dyn Storage>) = match backend {
            Backend::Embedded => (
                Warehouse::open(&dir.path().join("warehouse")).unwrap(),
                Arc::new(LocalStorage::new(&dir.path().join("staging")).unwrap()),
            ),
            Backend::PostgresS3 => {
                let bucket = sluice_backfill::storage::testing::new_bucket("warehouse");
                let staging = bucket.child("_staging").unwrap();
                (Warehouse::open_storage(Arc::new(bucket)).unwrap(), Arc::new(staging))
            }
        };
        let archiver = Archiver::new(
            warehouse.clone(),
            log.clone(),
            sluice_backfill::tables::tables(&catalog),
            ArchiverSettings::default(),
        );
        let backfill_settings = BackfillSettings {
            chunk_rows,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
            ..BackfillSettings::default()
        };
        let backfills = Backfills::new(
            store.clone(),
            warehouse,
            log.clone(),
            catalog,
            clock.clone(),
            staging.clone(),
            env,
            backfill_settings,
        );
        let state = AppState::new(store.clone(), Catalog::default(), clock, Limits::default())
            .with_runtime(runtime)
            .with_sinks(secrets, None)
            .with_backfills(backfills);
        let operator = key_for(store.as_ref(), "sluice", "ops", "root", true).await;
        let owner = key_for(store.as_ref(), "acme", "data", "ann", false).await;
        let stranger = key_for(store.as_ref(), "globex", "data", "gus", false).await;
        Self { _dir: dir, store, staging, log, archiver, state, operator, owner, stranger }
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
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// Ingests transfers `numbers` and archives them into the warehouse.
    pub(crate) async fn history(&self, numbers: std::ops::Range<u64>) {
        let ndjson: String = numbers.map(|n| transfer(n).to_string() + "\n").collect();
        let request = Request::builder()
            .method(Method::POST)
            .uri("/api/v1/streams/base/erc20_token_transfer/records")
            .header("X-API-Key", &self.operator)
            .body(Body::from(ndjson))
            .unwrap();
        let response = sluice_api::app(self.state.clone()).oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        self.archiver.drain().await.unwrap();
    }

    pub(crate) async fn create(&self, body: Value) -> String {
        let (status, created) =
            self.call(Method::POST, "/api/v1/beam/backfills", &self.owner, Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{created}");
        let job_id = created["job_id"].as_str().unwrap().to_owned();
        assert!(created["workflow_id"].as_str().unwrap().starts_with("beam-backfill-"));
        assert!(created["workflow_id"].as_str().unwrap().ends_with(&job_id));
        job_id
    }

    pub(crate) async fn job(&self, job_id: &str) -> Value {
        let (status, job) = self
            .call(Method::GET, &format!("/api/v1/beam/backfills/{job_id}"), &self.owner, None)
            .await;
        assert_eq!(status, StatusCode::OK, "{job}");
        job
    }

    /// Polls the job until its status is `status` (a generous deadline fails the test).
    pub(crate) async fn until(&self, job_id: &str, status: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let job = self.job(job_id).await;
            if job["status"] == status {
                return job;
            }
            assert!(tokio::time::Instant::now() < deadline, "job never {status}: {job}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether a job's staged chunks are gone.
    fn staged_gone(&self, job_id: &str) -> bool {
        self.staging.list(job_id).unwrap().is_empty()
    }

    /// Waits until a job's staged chunks are gone (they go just after it ended).
    async fn until_staged_gone(&self, job_id: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !self.staged_gone(job_id) {
            assert!(tokio::time::Instant::now() < deadline, "staged chunks stayed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The transfer numbers a job's managed destination holds.
    async fn delivered(&self, job_id: &str, uid: &str) -> Vec<u64> {
        let path =
            format!("/api/v1/beam/backfills/{job_id}/sinks/{uid}/records?offset=0&limit=10000");
        let (status, page) = self.call(Method::GET, &path, &self.owner, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        page["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["value"]["n"].as_u64().unwrap())
            .collect()
    }
}

pub(crate) fn body(start: u64, end: u64, destinations: Value) -> Value {
    json!({
        "job_name": "usdc in march",
        "table": "base.assets.erc20_token_transfers",
        "backfill_window": {"partition_key": "block_timestamp",
                            "start": sluice_core::time::format(minute(start)),
                            "end": sluice_core::time::format(minute(end))},
        "filter": {"column": "token_address", "values": [USDC.to_uppercase().replace("0X", "0x")]},
        "destinations": destinations,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_delivers_exactly_the_window_and_filter_in_chunks_and_completes() {
    delivers_the_window_and_filter(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_postgres_and_s3_a_job_delivers_exactly_the_window_and_filter_in_chunks() {
    delivers_the_window_and_filter(Backend::PostgresS3).await;
}

async fn delivers_the_window_and_filter(backend: Backend) {
    let stack = Stack::on(backend, 7).await;
    stack.history(0..200).await;
    let receiver = Receiver::start().await;
    let destinations = json!([
        {"type": "kafka", "uid": "sk-topic", "name": "usdc-history"},
        {"type": "webhook", "uid": "sk-hook", "name": "hook", "url": receiver.url()},
    ]);
    // Minutes 10 (in) to 60 (out): the odd ones are USDC.
    let job_id = stack.create(body(10, 60, destinations)).await;
    let job = stack.until(&job_id, "completed").await;
    let expected: Vec<u64> = (10..60).filter(|n| n % 2 == 1).collect();
    assert_eq!(job["num_chunks"], expected.len().div_ceil(7));
    assert_eq!(job["chunks_left"], 0);
    assert_eq!(job["rows_staged"], expected.len());
    assert_eq!(job["rows_delivered"], expected.len());
    assert!(job["time_completed"].is_string());
    assert_eq!(job["partition_key"], "block_timestamp");
    assert_eq!(job["filter_values"], json!([USDC]), "filter values are lowercased");
    let mut topic = stack.delivered(&job_id, "sk-topic").await;
    topic.sort_unstable();
    assert_eq!(topic, expected);
    let hooked: BTreeSet<u64> = receiver.numbers().into_iter().collect();
    assert_eq!(hooked.into_iter().collect::<Vec<_>>(), expected);
    // Staging files are gone once the job ended.
    stack.until_staged_gone(&job_id).await;
    // A window edge exactly at a row: minute 11 is in when it starts there, out when it ends there.
    let edge =
        stack.create(body(11, 12, json!([{"type": "kafka", "uid": "sk-a", "name": "a"}]))).await;
    stack.until(&edge, "completed").await;
    assert_eq!(stack.delivered(&edge, "sk-a").await, vec![11]);
    let none =
        stack.create(body(12, 13, json!([{"type": "kafka", "uid": "sk-b", "name": "b"}]))).await;
    let job = stack.until(&none, "completed").await;
    assert_eq!(job["num_chunks"], 0);
    assert!(stack.delivered(&none, "sk-b").await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_are_listed_per_organization_and_cancel_answers_409_once_ended() {
    listed_per_organization(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_postgres_and_s3_jobs_are_listed_per_organization_and_cancel_answers_409() {
    listed_per_organization(Backend::PostgresS3).await;
}

async fn listed_per_organization(backend: Backend) {
    let stack = Stack::on(backend, 100).await;
    stack.history(0..20).await;
    let first = stack.create(body(0, 20, json!([{"type": "kafka", "name": "one"}]))).await;
    let second = stack.create(body(0, 10, json!([{"type": "kafka", "name": "two"}]))).await;
    let (status, jobs) =
        stack.call(Method::GET, "/api/v1/beam/backfills", &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> =
        jobs.as_array().unwrap().iter().map(|j| j["job_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [first.as_str(), second.as_str()], "creation order");
    for field in [
        "job_id",
        "workflow_id",
        "organization_id",
        "status",
        "job_name",
        "table",
        "partition_key",
        "backfill_start",
        "backfill_end",
        "filter_column",
        "filter_values",
        "destinations",
        "static_egress_ip",
        "num_chunks",
        "chunks_left",
    ] {
        assert!(jobs[0].get(field).is_some(), "{field} in {}", jobs[0]);
    }
    let (_, theirs) =
        stack.call(Method::GET, "/api/v1/beam/backfills", &stack.stranger, None).await;
    assert_eq!(theirs, json!([]));
    let (status, _) = stack
        .call(Method::GET, &format!("/api/v1/beam/backfills/{first}"), &stack.stranger, None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = stack
        .call(
            Method::POST,
            &format!("/api/v1/beam/backfills/{first}/cancel"),
            &stack.stranger,
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    stack.until(&first, "completed").await;
    let (status, error) = stack
        .call(
            Method::POST,
            &format!("/api/v1/beam/backfills/{first}/cancel"),
            &stack.owner,
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_held_by_a_down_destination_is_cancelled_at_the_next_chunk() {
    cancelled_in_transport(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_postgres_and_s3_a_job_held_by_a_down_destination_is_cancelled() {
    cancelled_in_transport(Backend::PostgresS3).await;
}

async fn cancelled_in_transport(backend: Backend) {
    let stack = Stack::on(backend, 3).await;
    stack.history(0..40).await;
    let receiver = Receiver::start().await;
    receiver.set(Answer::Refuse(503));
    let destinations =
        json!([{"type": "webhook", "uid": "sk-hook", "name": "hook", "url": receiver.url()}]);
    let job_id = stack.create(body(0, 40, destinations.clone())).await;
    let job = stack.until(&job_id, "transporting").await;
    assert_eq!(job["num_chunks"], 7, "20 USDC rows in chunks of 3");
    assert_eq!(job["chunks_left"], 7, "nothing acknowledged while the webhook refuses");
    // Two jobs run at once: with a second one held too, a third waits in staging, where a
    // cancel ends it before it staged anything.
    let second = stack.create(body(0, 40, destinations.clone())).await;
    stack.until(&second, "transporting").await;
    let waiting = stack.create(body(0, 40, destinations)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let job = stack.job(&waiting).await;
    assert_eq!((job["status"].as_str(), job["num_chunks"].as_u64()), (Some("staging"), None));
    let (status, answer) = stack
        .call(
            Method::POST,
            &format!("/api/v1/beam/backfills/{waiting}/cancel"),
            &stack.owner,
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(stack.job(&waiting).await["status"], "cancelled");
    let (status, answer) = stack
        .call(
            Method::POST,
            &format!("/api/v1/beam/backfills/{second}/cancel"),
            &stack.owner,
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, answer) = stack
        .call(
            Method::POST,
            &format!("/api/v1/beam/backfills/{job_id}/cancel"),
            &stack.owner,
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("cancelled"));
    let job = stack.job(&job_id).await;
    assert_eq!(job["status"], "cancelled");
    // The runner lets go: its staging files go, and a recovered receiver gets nothing more.
    stack.until_staged_gone(&job_id).await;
    receiver.set(Answer::Accept);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(receiver.numbers().is_empty());
    for id in [&job_id, &second, &waiting] {
        let job = stack.job(id).await;
        assert_eq!(job["status"], "cancelled");
        stack.until_staged_gone(id).await;
    }
    assert_eq!(stack.job(&waiting).await["rows_staged"], 0, "it never staged");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_destination_that_refuses_for_good_fails_the_job_with_its_reason() {
    let stack = Stack::new(100).await;
    stack.history(0..10).await;
    let receiver = Receiver::start().await;
    receiver.set(Answer::RejectContaining("\"n\"".to_owned()));
    let destinations =
        json!([{"type": "webhook", "uid": "sk-hook", "name": "hook", "url": receiver.url()}]);
    let job_id = stack.create(body(0, 10, destinations)).await;
    let job = stack.until(&job_id, "failed").await;
    let message = job["error_message"].as_str().unwrap();
    assert!(message.contains("sk-hook") && message.contains("HTTP 400"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_bodies_are_422s_at_their_field_and_tables_are_listed() {
    let stack = Stack::new(100).await;
    stack.history(0..30).await;
    let cases = [
        (
            json!({"partition_key": "block_number"}),
            json!(["body", "backfill_window", "partition_key"]),
        ),
        (
            json!({"end": sluice_core::time::format(minute(0))}),
            json!(["body", "backfill_window", "end"]),
        ),
    ];
    for (window_change, loc) in cases {
        let mut b = body(5, 10, json!([{"type": "kafka", "name": "x"}]));
        for (key, value) in window_change.as_object().unwrap() {
            b["backfill_window"][key] = value.clone();
        }
        let (status, error) =
            stack.call(Method::POST, "/api/v1/beam/backfills", &stack.owner, Some(b)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(error["detail"][0]["loc"], loc);
    }
    let mut b = body(
        5,
        10,
        json!([{"type": "webhook", "name": "h", "url": "https://e.com", "hash_key": "NOPE"}]),
    );
    let (status, error) =
        stack.call(Method::POST, "/api/v1/beam/backfills", &stack.owner, Some(b.clone())).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(error["detail"][0]["loc"], json!(["body", "destinations", 0, "hash_key"]));
    b["table"] = json!("ethereum.assets.erc20_token_transfers");
    let (status, error) =
        stack.call(Method::POST, "/api/v1/beam/backfills", &stack.owner, Some(b)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        error["detail"].as_array().unwrap().iter().any(|e| e["loc"] == json!(["body", "table"]))
    );
    let (status, jobs) =
        stack.call(Method::GET, "/api/v1/beam/backfills", &stack.owner, None).await;
    assert_eq!((status, jobs), (StatusCode::OK, json!([])), "nothing was stored");

    let (status, tables) =
        stack.call(Method::GET, "/api/v1/beam/backfills/tables", &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK);
    let transfers = tables
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "base.assets.erc20_token_transfers")
        .unwrap();
    assert_eq!(transfers["row_count"], 30);
    assert_eq!(transfers["backfillable"], true);
    assert_eq!(transfers["min_block_timestamp"], sluice_core::time::format(minute(0)));
    assert_eq!(transfers["max_block_timestamp"], sluice_core::time::format(minute(29)));
    assert!(
        transfers["columns"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "block_timestamp" && c["type"] == "timestamp")
    );
    let _ = &stack.log;
}

#[tokio::test(flavor = "multi_thread")]
async fn transforms_filter_and_reshape_every_row_before_delivery() {
    let stack = Stack::new(4).await;
    stack.history(0..60).await;
    let mut body = body(0, 60, json!([{"type": "kafka", "uid": "sk-out", "name": "out"}]));
    body.as_object_mut().unwrap().remove("filter");
    // Only USDC (the odd minutes), then a script that adds a field and throws on every 5th.
    body["transforms"] = json!([
        {"type": "redis_set_filter", "uid": "usdc", "filter_expr": "root = this.token_address",
         "set_values": [USDC.to_uppercase().replace("0X", "0x")]},
        {"type": "v8", "uid": "shape", "script":
            "function transform(r) { if (r.n % 5 === 0) { throw new Error('no fives'); } r.doubled = r.n * 2; return r; }"},
    ]);
    let job_id = stack.create(body.clone()).await;
    let job = stack.until(&job_id, "completed").await;
    let expected: Vec<u64> = (0..60).filter(|n| n % 2 == 1 && n % 5 != 0).collect();
    assert_eq!(job["rows_staged"], expected.len());
    assert_eq!(job["num_chunks"], expected.len().div_ceil(4), "chunks hold the transformed rows");
    assert_eq!(job["rows_failed"], 6, "15, 25, … 55");
    assert!(job["transform_error"].as_str().unwrap().contains("transform shape"), "{job}");
    assert_eq!(job["transforms"][0]["set_values"], json!([USDC]), "values are lowercased");
    let path = format!("/api/v1/beam/backfills/{job_id}/sinks/sk-out/records?offset=0&limit=100");
    let (_, page) = stack.call(Method::GET, &path, &stack.owner, None).await;
    let records = page["records"].as_array().unwrap();
    let numbers: Vec<u64> = records.iter().map(|r| r["value"]["n"].as_u64().unwrap()).collect();
    assert_eq!(numbers, expected, "in time order");
    assert!(records.iter().all(|r| r["value"]["doubled"] == r["value"]["n"].as_u64().unwrap() * 2));

    // A script that does not load is a 422 at its field; scripts need custom_transforms.
    let mut broken = body.clone();
    broken["transforms"][1]["script"] = json!("function transform(r) {");
    let (status, error) =
        stack.call(Method::POST, "/api/v1/beam/backfills", &stack.owner, Some(broken)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    assert_eq!(error["detail"][0]["loc"], json!(["body", "transforms", 1, "script"]));
    stack.store.set_org_flags("acme", None, Some(false)).await.unwrap();
    let (status, error) =
        stack.call(Method::POST, "/api/v1/beam/backfills", &stack.owner, Some(body)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{error}");
    assert!(error["detail"].as_str().unwrap().contains("custom_transforms"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_object_storage_destination_gets_each_chunk_as_files_named_by_the_job_and_chunk() {
    let stack = Stack::new(4).await;
    stack.history(0..40).await;
    let admin = stack.store.ensure_identity("acme", "data", "ada", false).await.unwrap();
    stack.store.set_org_admin(&admin.user.id, true).await.unwrap();
    let admin = sluice_api::auth::issue_key(stack.store.as_ref(), &admin.user.id, None)
        .await
        .unwrap()
        .unwrap();
    for name in ["S3_ID", "S3_KEY"] {
        let path = format!("/api/v1/beam/secrets/{name}");
        let (status, body) =
            stack.call(Method::PUT, &path, &admin, Some(json!({"value": "test"}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let bucket = tokio::task::spawn_blocking(|| sluice_backfill::storage::testing::new_bucket(""))
        .await
        .unwrap();
    let name =
        bucket.location("").trim_start_matches("s3://").split('/').next().unwrap().to_owned();
    let destinations = json!([{"type": "object_storage", "uid": "sk-s3", "name": "lake",
        "bucket": name, "endpoint": std::env::var("SLUICE_TEST_S3_URL").unwrap(),
        "prefix": "history", "format": "jsonl_gzip",
        "access_key_id_secret": "S3_ID", "secret_access_key_secret": "S3_KEY"}]);
    let job_id = stack.create(body(10, 30, destinations)).await;
    let job = stack.until(&job_id, "completed").await;
    let chunks = job["num_chunks"].as_u64().unwrap();
    let objects = tokio::task::spawn_blocking(move || {
        let keys = bucket.list("history").unwrap();
        keys.into_iter()
            .map(|key| (key.clone(), bucket.get(&key).unwrap().unwrap()))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let mut numbers = Vec::new();
    let mut names = BTreeSet::new();
    for (key, bytes) in objects {
        use std::io::Read as _;
        let mut text = String::new();
        flate2::read::GzDecoder::new(&bytes[..]).read_to_string(&mut text).unwrap();
        numbers.extend(
            text.lines()
                .map(|line| serde_json::from_str::<Value>(line).unwrap()["n"].as_u64().unwrap()),
        );
        names.insert(key);
    }
    let expected: BTreeSet<String> = (0..chunks)
        .map(|chunk| {
            format!("history/base/erc20_token_transfer/2026-03-01/{job_id}-{chunk}-0.jsonl.gz")
        })
        .collect();
    assert_eq!(names, expected);
    numbers.sort_unstable();
    assert_eq!(numbers, (11..30).step_by(2).collect::<Vec<u64>>());
}
