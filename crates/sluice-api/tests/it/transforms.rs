//! `PATCH …/transforms/{transform_uid}` and `PUT …/transforms`: statuses, add/remove/
//! update/reorder in one call, filter values of kept and removed set filters, and the
//! automatic redeploy of a deployed pipeline with no record lost.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use chrono::{TimeZone, Utc};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_api::{AppState, Limits};
use sluice_bus::EmbeddedLog;
use sluice_core::catalog::Catalog;
use sluice_core::clock::ManualClock;
use sluice_core::filter_values::{FilterValuesChange, FilterValuesListener};
use sluice_runtime::Runtime;
use sluice_store::{MetadataStore, SqliteStore};
use tower::ServiceExt;

use crate::harness::{Harness, User};
use crate::pipeline_stack::{OTHER, USDC, WETH, key_for, settings, settle, transfer};

const SCRIPT: &str = "function transform(r) { return r; }";

/// A pipeline with a set filter `tf-a` (values A1, A2), a script `tf-s` and a set filter
/// `tf-b` (value B1).
fn three_transforms() -> Value {
    json!({
        "name": "three",
        "description": "two set filters and a script",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [
                {"type": "redis_set_filter", "uid": "tf-a", "filter_expr": "root = this.token_address",
                 "set_values": ["A1", "A2"]},
                {"type": "v8", "uid": "tf-s", "script": SCRIPT},
                {"type": "redis_set_filter", "uid": "tf-b", "filter_expr": "root = this.from_address",
                 "set_values": ["B1"]}
            ],
            "sinks": [{"type": "kafka", "uid": "sk-out", "name": "out"}]
        }
    })
}

async fn patch(h: &Harness, path: &str, user: &User, body: Value) -> (StatusCode, Value) {
    h.call(Method::PATCH, path, Some(&user.key), Some(body)).await
}

async fn count(h: &Harness, id: &str, uid: &str, user: &User) -> (StatusCode, Value) {
    h.get(&format!("/api/v1/beam/{id}/transforms/{uid}/filter-values/count"), user).await
}

fn locs(body: &Value) -> Vec<Value> {
    body["detail"].as_array().unwrap().iter().map(|d| d["loc"].clone()).collect()
}

#[derive(Default)]
struct Dropped(Mutex<Vec<(String, String)>>);

impl FilterValuesListener for Dropped {
    fn changed(&self, pipeline_id: &str, transform_uid: &str, change: FilterValuesChange<'_>) {
        if change == FilterValuesChange::Dropped {
            self.0.lock().unwrap().push((pipeline_id.to_owned(), transform_uid.to_owned()));
        }
    }
}

#[tokio::test]
async fn patch_replaces_one_transform_in_place_and_keeps_its_filter_values() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let created = h.create(&ann, three_transforms()).await;
    let id = created["id"].as_str().unwrap();
    h.clock.advance(chrono::Duration::seconds(5));

    let path = format!("/api/v1/beam/{id}/transforms/tf-a");
    let (status, body) = patch(
        &h,
        &path,
        &ann,
        json!({"type": "redis_set_filter", "filter_expr": "root = this.to_address"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"type": "redis_set_filter", "uid": "tf-a", "filter_expr": "root = this.to_address"})
    );
    let (_, stored) = h.get(&format!("/api/v1/beam/{id}"), &ann).await;
    let transforms = &stored["pipeline_config"]["transforms"];
    assert_eq!(transforms[0], body);
    assert_eq!(transforms[1], created["pipeline_config"]["transforms"][1]);
    assert_eq!(transforms[2], created["pipeline_config"]["transforms"][2]);
    assert_ne!(stored["updated_at"], created["updated_at"]);
    assert_eq!(stored["created_at"], created["created_at"]);
    assert_eq!(count(&h, id, "tf-a", &ann).await.1["count"], 2);

    // `type` omitted: the transform keeps its type; a uid equal to the path's is accepted.
    let script = "function transform(r) { r.seen = true; return r; }";
    let path = format!("/api/v1/beam/{id}/transforms/tf-s");
    let (status, body) = patch(&h, &path, &ann, json!({"uid": "tf-s", "script": script})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"type": "v8", "uid": "tf-s", "script": script}));
    let (_, stored) = h.get(&format!("/api/v1/beam/{id}"), &ann).await;
    assert_eq!(stored["pipeline_config"]["transforms"][1], body);
}

#[tokio::test]
async fn patch_to_another_type_drops_the_filter_values_and_tells_the_set_indexes() {
    let dropped = Arc::new(Dropped::default());
    let h = Harness::with_listener(dropped.clone()).await;
    let ann = h.user("acme", "data", "ann").await;
    let id = h.create(&ann, three_transforms()).await["id"].as_str().unwrap().to_owned();

    let path = format!("/api/v1/beam/{id}/transforms/tf-b");
    let (status, body) = patch(&h, &path, &ann, json!({"type": "v8", "script": SCRIPT})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"type": "v8", "uid": "tf-b", "script": SCRIPT}));
    assert_eq!(dropped.0.lock().unwrap().clone(), vec![(id.clone(), "tf-b".to_owned())]);
    // A script has no filter values.
    assert_eq!(count(&h, &id, "tf-b", &ann).await.0, StatusCode::UNPROCESSABLE_ENTITY);

    // Back to a set filter: a new, empty set — the old values are gone for good.
    let (status, _) = patch(
        &h,
        &path,
        &ann,
        json!({"type": "redis_set_filter", "filter_expr": "root = this.from_address"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(count(&h, &id, "tf-b", &ann).await.1["count"], 0);
    assert_eq!(count(&h, &id, "tf-a", &ann).await.1["count"], 2);
}

#[tokio::test]
async fn concurrent_edits_of_one_pipeline_never_undo_each_other() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let id = h.create(&ann, three_transforms()).await["id"].as_str().unwrap().to_owned();
    for round in 0..5 {
        let script = format!("function transform(r) {{ r.round = {round}; return r; }}");
        let expr =
            if round % 2 == 0 { "root = this.from_address" } else { "root = this.token_address" };
        let paths =
            ["tf-a", "tf-s", "tf-b"].map(|uid| format!("/api/v1/beam/{id}/transforms/{uid}"));
        let (a, s, b) = tokio::join!(
            patch(&h, &paths[0], &ann, json!({"filter_expr": expr})),
            patch(&h, &paths[1], &ann, json!({"script": script})),
            patch(&h, &paths[2], &ann, json!({"filter_expr": expr})),
        );
        assert_eq!((a.0, s.0, b.0), (StatusCode::OK, StatusCode::OK, StatusCode::OK));
        let (_, stored) = h.get(&format!("/api/v1/beam/{id}"), &ann).await;
        let transforms = &stored["pipeline_config"]["transforms"];
        assert_eq!(transforms[0]["filter_expr"], expr, "round {round}: {transforms}");
        assert_eq!(transforms[1]["script"], script.as_str(), "round {round}: {transforms}");
        assert_eq!(transforms[2]["filter_expr"], expr, "round {round}: {transforms}");
    }
}

#[tokio::test]
async fn patch_answers_404_403_and_422_and_changes_nothing_then() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let bob = h.user("acme", "readers", "bob").await;
    let eve = h.user("acme", "elsewhere", "eve").await;
    let id = h.create(&ann, three_transforms()).await["id"].as_str().unwrap().to_owned();
    let (status, body) = h
        .put(&format!("/api/v1/beam/{id}/permissions"), &ann, json!({"readers": [bob.id()]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, before) = h.get(&format!("/api/v1/beam/{id}"), &ann).await;

    let path = format!("/api/v1/beam/{id}/transforms/tf-s");
    let good = json!({"type": "v8", "script": SCRIPT});
    let missing = patch(&h, "/api/v1/beam/nope/transforms/tf-s", &ann, good.clone()).await;
    assert_eq!(missing.0, StatusCode::NOT_FOUND);
    assert_eq!(patch(&h, &path, &eve, good.clone()).await.0, StatusCode::NOT_FOUND);
    let (status, body) = patch(&h, &path, &bob, good.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let unknown = format!("/api/v1/beam/{id}/transforms/tf-zzz");
    let (status, body) = patch(&h, &unknown, &ann, good.clone()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["detail"].as_str().unwrap().contains("tf-zzz"), "{body}");
    let (status, _) = h.call(Method::PATCH, &path, None, Some(good.clone())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (status, body) =
        patch(&h, &path, &ann, json!({"type": "v8", "script": "function ("})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(locs(&body), vec![json!(["body", "script"])]);
    let no_fn = json!({"type": "v8", "script": "const x = 1;"});
    let (status, body) = patch(&h, &path, &ann, no_fn).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body["detail"][0]["msg"].as_str().unwrap().contains("transform"), "{body}");
    let bad_expr = json!({"type": "redis_set_filter", "filter_expr": "this is not bloblang"});
    let (status, body) = patch(&h, &path, &ann, bad_expr).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(locs(&body), vec![json!(["body", "filter_expr"])]);
    let (status, body) = patch(&h, &path, &ann, json!({"uid": "tf-other", "script": SCRIPT})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(locs(&body), vec![json!(["body", "uid"])]);
    let (status, body) = patch(&h, &path, &ann, json!({"type": "lua", "script": SCRIPT})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["detail"][0]["type"], "enum");
    let (status, body) = patch(&h, &path, &ann, json!({"type": "v8"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["detail"][0]["type"], "missing");
    let set_values = json!({"type": "redis_set_filter", "filter_expr": "root = this.from_address",
                            "set_values": ["x"]});
    let (status, body) = patch(&h, &path, &ann, set_values).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(locs(&body), vec![json!(["body", "set_values"])]);
    let (status, _) = patch(&h, &path, &ann, Value::String("[1]".into())).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    h.store.set_org_flags("acme", None, Some(false)).await.unwrap();
    let (status, body) = patch(&h, &path, &ann, good).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body["detail"].as_str().unwrap().contains("custom_transforms"), "{body}");

    let (_, after) = h.get(&format!("/api/v1/beam/{id}"), &ann).await;
    assert_eq!(after, before);
    assert_eq!(count(&h, &id, "tf-a", &ann).await.1["count"], 2);
}

#[tokio::test]
async fn a_filter_path_naming_no_field_of_the_source_is_422_on_create_patch_and_put() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let typo = "root = this.token_adress";
    let mut body = three_transforms();
    body["pipeline_config"]["transforms"][0]["filter_expr"] = json!(typo);
    let (status, answer) = h.post("/api/v1/beam", &ann, body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(
        locs(&answer),
        vec![json!(["body", "pipeline_config", "transforms", 0, "filter_expr"])]
    );
    let msg = answer["detail"][0]["msg"].as_str().unwrap();
    assert!(msg.contains("token_adress") && msg.contains("token_address"), "{msg}");

    let id = h.create(&ann, three_transforms()).await["id"].as_str().unwrap().to_owned();
    let before = h.get(&format!("/api/v1/beam/{id}"), &ann).await.1;
    let path = format!("/api/v1/beam/{id}/transforms/tf-a");
    let (status, answer) = patch(&h, &path, &ann, json!({"filter_expr": typo})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(locs(&answer), vec![json!(["body", "filter_expr"])]);

    let list = json!([
        {"type": "redis_set_filter", "uid": "tf-a", "filter_expr": "root = this.token_address"},
        {"type": "redis_set_filter", "uid": "tf-b", "filter_expr": "root = this.to_address.0"}
    ]);
    let put = format!("/api/v1/beam/{id}/transforms");
    let (status, answer) = h.put(&put, &ann, list).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(locs(&answer), vec![json!(["body", 1, "filter_expr"])]);
    assert_eq!(h.get(&format!("/api/v1/beam/{id}"), &ann).await.1, before, "nothing changed");
}

#[tokio::test]
async fn put_adds_removes_updates_and_reorders_in_one_call() {
    let dropped = Arc::new(Dropped::default());
    let h = Harness::with_listener(dropped.clone()).await;
    let ann = h.user("acme", "data", "ann").await;
    let created = h.create(&ann, three_transforms()).await;
    let id = created["id"].as_str().unwrap();
    h.clock.advance(chrono::Duration::seconds(5));

    let new_script = "function transform(r) { return null; }";
    let list = json!([
        {"type": "v8", "uid": "tf-s", "script": new_script},             // updated, moved first
        {"type": "redis_set_filter", "filter_expr": "root = this.to_address"},   // new
        {"type": "redis_set_filter", "uid": "tf-a", "filter_expr": "root = this.from_address"} // kept
        // tf-b removed
    ]);
    let (status, body) = h.put(&format!("/api/v1/beam/{id}/transforms"), &ann, list).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answered = body.as_array().unwrap();
    assert_eq!(answered.len(), 3);
    assert_eq!(answered[0], json!({"type": "v8", "uid": "tf-s", "script": new_script}));
    let new_uid = answered[1]["uid"].as_str().unwrap();
    assert!(!["tf-a", "tf-b", "tf-s", ""].contains(&new_uid), "{new_uid}");
    assert_eq!(answered[1]["filter_expr"], "root = this.to_address");
    assert_eq!(
        answered[2],
        json!({"type": "redis_set_filter", "uid": "tf-a", "filter_expr": "root = this.from_address"})
    );

    let (_, stored) = h.get(&format!("/api/v1/beam/{id}"), &ann).await;
    assert_eq!(stored["pipeline_config"]["transforms"], body);
    assert_ne!(stored["updated_at"], created["updated_at"]);
    assert_eq!(stored["pipeline_config"]["sinks"], created["pipeline_config"]["sinks"]);
    assert_eq!(stored["name"], created["name"]);

    // Kept uid: values survive. Removed uid: values deleted, and the indexes heard it.
    assert_eq!(count(&h, id, "tf-a", &ann).await.1["count"], 2);
    assert_eq!(count(&h, id, new_uid, &ann).await.1["count"], 0);
    assert_eq!(count(&h, id, "tf-b", &ann).await.0, StatusCode::NOT_FOUND);
    assert_eq!(dropped.0.lock().unwrap().clone(), vec![(id.to_owned(), "tf-b".to_owned())]);
    let readd = json!([{"type": "redis_set_filter", "uid": "tf-b", "filter_expr": "root = this.from_address"}]);
    let (status, body) = h.put(&format!("/api/v1/beam/{id}/transforms"), &ann, readd).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(count(&h, id, "tf-b", &ann).await.1["count"], 0);
    assert_eq!(count(&h, id, "tf-a", &ann).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn put_answers_404_403_and_422_and_changes_nothing_then() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let bob = h.user("acme", "readers", "bob").await;
    let eve = h.user("acme", "elsewhere", "eve").await;
    let id = h.create(&ann, three_transforms()).await["id"].as_str().unwrap().to_owned();
    let (status, _) = h
        .put(&format!("/api/v1/beam/{id}/permissions"), &ann, json!({"readers": [bob.id()]}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, before) = h.get(&format!("/api/v1/beam/{id}"), &ann).await;

    let path = format!("/api/v1/beam/{id}/transforms");
    let good = json!([{"type": "v8", "script": SCRIPT}]);
    let missing = h.put("/api/v1/beam/nope/transforms", &ann, good.clone()).await;
    assert_eq!(missing.0, StatusCode::NOT_FOUND);
    assert_eq!(h.put(&path, &eve, good.clone()).await.0, StatusCode::NOT_FOUND);
    assert_eq!(h.put(&path, &bob, good.clone()).await.0, StatusCode::FORBIDDEN);

    let (status, body) = h.put(&path, &ann, json!([])).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(locs(&body), vec![json!(["body"])]);
    assert_eq!(body["detail"][0]["type"], "too_short");
    let duplicate = json!([
        {"type": "v8", "uid": "tf-s", "script": SCRIPT},
        {"type": "redis_set_filter", "uid": "tf-s", "filter_expr": "root = this.from_address"}
    ]);
    let (status, body) = h.put(&path, &ann, duplicate).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(locs(&body), vec![json!(["body", 1, "uid"])]);
    let broken = json!([
        {"type": "v8", "script": SCRIPT},
        {"type": "v8", "script": "function transform(r) { return r; "},
        {"type": "redis_set_filter"}
    ]);
    let (status, body) = h.put(&path, &ann, broken).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(locs(&body), vec![json!(["body", 2, "filter_expr"])]);
    let bad_script = json!([{"type": "redis_set_filter", "uid": "tf-a", "filter_expr": "root = this.from_address"},
                            {"type": "v8", "script": "function transform(r) { return r; "}]);
    let (status, body) = h.put(&path, &ann, bad_script).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(locs(&body), vec![json!(["body", 1, "script"])]);
    let (status, body) = h.put(&path, &ann, json!({"transforms": []})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["detail"][0]["type"], "list_type");
    let (status, body) = h.put(&path, &ann, Value::String("[".into())).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["detail"][0]["type"], "json_invalid");

    h.store.set_org_flags("acme", None, Some(false)).await.unwrap();
    let (status, _) = h.put(&path, &ann, good).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let (_, after) = h.get(&format!("/api/v1/beam/{id}"), &ann).await;
    assert_eq!(after, before);
    assert_eq!(count(&h, &id, "tf-a", &ann).await.1["count"], 2);
    assert_eq!(count(&h, &id, "tf-b", &ann).await.1["count"], 1);
}

// ---- Deployed pipelines: a real runtime over an embedded log (as in deployments.rs). ----

struct Stack {
    _dir: tempfile::TempDir,
    log: Arc<EmbeddedLog>,
    state: AppState,
    operator: String,
    owner: String,
}

impl Stack {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock =
            Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0).unwrap()));
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store: Arc<dyn MetadataStore> = Arc::new(SqliteStore::open(&url).await.unwrap());
        let log = Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
        let operator = key_for(store.as_ref(), "sluice", "team", "admin", true).await;
        let owner = key_for(store.as_ref(), "acme", "team", "ann", false).await;
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
        let state = AppState::new(store, Catalog::default(), clock, Limits::default())
            .with_runtime(runtime);
        Self { _dir: dir, log, state, operator, owner }
    }

    async fn call(&self, method: Method, path: &str, body: Option<String>) -> (StatusCode, Value) {
        let key = if path.starts_with("/api/v1/streams") { &self.operator } else { &self.owner };
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("X-API-Key", key)
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, Body::from))
            .unwrap();
        let response = sluice_api::app(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn ok(&self, method: Method, path: &str, body: Value) -> Value {
        let (status, answer) = self.call(method, path, Some(body.to_string())).await;
        assert_eq!(status, StatusCode::OK, "{path}: {answer}");
        answer
    }

    /// A pipeline passing the tokens in `values` through set filter `tf-tokens`.
    async fn create(&self, values: &[&str]) -> String {
        let body = json!({
            "name": "tokens", "description": "token transfers",
            "pipeline_config": {
                "source": {"chain": "base", "entity": "erc20_token_transfer"},
                "transforms": [{"type": "redis_set_filter", "uid": "tf-tokens",
                                "filter_expr": "root = this.token_address", "set_values": values}],
                "sinks": [{"type": "kafka", "uid": "sk-out", "name": "transfers"}]
            }
        });
        let created = self.ok(Method::POST, "/api/v1/beam", body).await;
        created["id"].as_str().unwrap().to_owned()
    }

    async fn ingest(&self, transfers: &[(u64, &str)]) {
        let ndjson: String =
            transfers.iter().map(|(n, token)| transfer(*n, token).to_string() + "\n").collect();
        let (status, body) = self
            .call(Method::POST, "/api/v1/streams/base/erc20_token_transfer/records", Some(ndjson))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    /// Ingests one transfer of [`kind`] per number.
    async fn ingest_kinds(&self, numbers: &[u64]) {
        let ndjson: String = numbers
            .iter()
            .map(|n| {
                let (token, to) = kind(*n);
                let mut record = transfer(*n, token);
                record["to_address"] = json!(to);
                record.to_string() + "\n"
            })
            .collect();
        let (status, body) = self
            .call(Method::POST, "/api/v1/streams/base/erc20_token_transfer/records", Some(ndjson))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    async fn records(&self, id: &str) -> Vec<Value> {
        let path = format!("/api/v1/beam/{id}/sinks/sk-out/records?limit=10000");
        let (status, page) = self.call(Method::GET, &path, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        page["records"].as_array().unwrap().iter().map(|r| r["value"].clone()).collect()
    }

    /// Waits until the deployment has read everything ingested so far (a generous deadline
    /// fails the test; it measures nothing).
    async fn settle(&self, id: &str) {
        settle(self.log.as_ref(), id).await;
    }

    async fn deployment_state(&self, id: &str) -> Option<sluice_core::deployment::DeploymentState> {
        self.state.runtime().unwrap().state(id).await.unwrap()
    }
}

fn numbers(records: &[Value]) -> Vec<u64> {
    let mut numbers: Vec<u64> = records.iter().map(|r| r["n"].as_u64().unwrap()).collect();
    numbers.sort_unstable();
    numbers
}

/// What the four kinds of transfer of the redeploy test match: the old configuration passes
/// USDC tokens, the new one transfers to the USDC contract address.
fn kind(n: u64) -> (&'static str, &'static str) {
    match n % 4 {
        0 => (USDC, USDC),   // token and recipient: both configurations pass it
        1 => (USDC, OTHER),  // only the old one
        2 => (WETH, USDC),   // only the new one
        _ => (OTHER, OTHER), // neither
    }
}

#[tokio::test]
async fn put_on_a_deployed_pipeline_redeploys_it_under_load_with_no_record_lost() {
    let stack = Arc::new(Stack::new().await);
    let id = stack.create(&[USDC]).await;
    stack.ok(Method::POST, &format!("/api/v1/beam/{id}/deploy"), json!({})).await;
    let batch = |b: u64| -> Vec<u64> { (b * 40..b * 40 + 40).collect() };

    // Before the call: one batch, read under the old configuration.
    stack.ingest_kinds(&batch(0)).await;
    stack.settle(&id).await;
    // During the call: the feeder yields between batches, so they interleave with the PUT.
    let feeder = {
        let stack = stack.clone();
        tokio::spawn(async move {
            for b in 1..25u64 {
                stack.ingest_kinds(&batch(b)).await;
                tokio::task::yield_now().await;
            }
        })
    };
    // The set filter keeps its uid (and its values) but tests the recipient now, and a
    // script that tags each record follows it.
    let script = "function transform(r) { r.tagged = true; return r; }";
    let answered = stack
        .ok(
            Method::PUT,
            &format!("/api/v1/beam/{id}/transforms"),
            json!([
                {"type": "redis_set_filter", "uid": "tf-tokens", "filter_expr": "root = this.to_address"},
                {"type": "v8", "uid": "tf-tag", "script": script}
            ]),
        )
        .await;
    assert_eq!(answered[1]["uid"], "tf-tag");
    feeder.await.unwrap();
    // After the call (and after the workers caught up with it): new configuration only.
    stack.settle(&id).await;
    stack.ingest_kinds(&[5000, 5001, 5002, 5003]).await;
    stack.settle(&id).await;
    assert_eq!(
        stack.deployment_state(&id).await,
        Some(sluice_core::deployment::DeploymentState::Deployed)
    );

    let records = stack.records(&id).await;
    let delivered = numbers(&records);
    let mut unique = delivered.clone();
    unique.dedup();
    assert_eq!(delivered, unique, "a record was delivered twice");
    // Nothing that both configurations pass is lost; nothing that neither passes arrives.
    let both: Vec<u64> = (0..1000).chain(5000..5004).filter(|n| n % 4 == 0).collect();
    assert_eq!(unique.iter().copied().filter(|n| n % 4 == 0).collect::<Vec<_>>(), both);
    assert!(unique.iter().all(|n| n % 4 != 3), "{unique:?}");
    // Each record went through one whole configuration: the old one (untagged) or the new
    // one (tagged), never a mix.
    for record in &records {
        let n = record["n"].as_u64().unwrap();
        match n % 4 {
            1 => assert_eq!(
                record.get("tagged"),
                None,
                "{n} passed the old filter with the new script"
            ),
            2 => assert_eq!(
                record["tagged"], true,
                "{n} passed the new filter without the new script"
            ),
            _ => {}
        }
        if n < 40 {
            assert_eq!(record.get("tagged"), None, "{n} was read before the change");
        }
        if n >= 5000 {
            assert_eq!(record["tagged"], true, "{n} was ingested after the change");
        }
    }
    assert!(unique.contains(&1) && !unique.contains(&2), "{unique:?}");
    assert!(unique.contains(&5002) && !unique.contains(&5001), "{unique:?}");
}

#[tokio::test]
async fn patch_on_a_deployed_pipeline_applies_at_once_and_on_a_paused_one_at_the_next_deploy() {
    let stack = Stack::new().await;
    let id = stack.create(&[USDC]).await;
    stack.ok(Method::POST, &format!("/api/v1/beam/{id}/deploy"), json!({})).await;
    stack.ingest(&[(1, USDC)]).await;
    stack.settle(&id).await;

    let path = format!("/api/v1/beam/{id}/transforms/tf-tokens");
    let by_sender = json!({"filter_expr": "root = this.from_address"});
    stack.ok(Method::PATCH, &path, by_sender).await;
    // Kept uid, kept values: USDC now has to be the sender, which OTHER is not.
    stack.ingest(&[(2, USDC)]).await;
    stack.settle(&id).await;
    assert_eq!(numbers(&stack.records(&id).await), vec![1]);
    let values = format!("{path}/filter-values");
    stack.ok(Method::POST, &values, json!({"values": [OTHER]})).await;
    stack.ingest(&[(3, WETH)]).await;
    stack.settle(&id).await;
    assert_eq!(numbers(&stack.records(&id).await), vec![1, 3]);

    // Paused: the change is stored, the pipeline stays paused and runs it once deployed.
    stack.ok(Method::POST, &format!("/api/v1/beam/{id}/pause"), json!({})).await;
    let script = "function transform(r) { return {n: r.n, paused_change: true}; }";
    let patched = stack.ok(Method::PATCH, &path, json!({"type": "v8", "script": script})).await;
    assert_eq!(patched["type"], "v8");
    assert_eq!(
        stack.deployment_state(&id).await,
        Some(sluice_core::deployment::DeploymentState::Paused)
    );
    stack.ingest(&[(4, OTHER)]).await;
    stack.ok(Method::POST, &format!("/api/v1/beam/{id}/deploy"), json!({})).await;
    stack.settle(&id).await;
    let records = stack.records(&id).await;
    assert_eq!(numbers(&records), vec![1, 3, 4]);
    assert_eq!(records.iter().find(|r| r["n"] == 4).unwrap()["paused_change"], true);

    // Not deployed: only stored; nothing starts.
    stack.ok(Method::POST, &format!("/api/v1/beam/{id}/teardown"), json!({})).await;
    stack.ok(Method::PATCH, &path, json!({"script": SCRIPT})).await;
    assert_eq!(stack.deployment_state(&id).await, None);
}
