//! Worker health (`GET …/deploy/stats`), metrics (`GET …/deploy/metrics`) and Prometheus
//! (`GET /metrics`) end to end through the HTTP API, with a real runtime and embedded log.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use chrono::{TimeZone, Utc};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_api::{AppState, Limits};
use sluice_bus::EmbeddedLog;
use sluice_core::catalog::Catalog;
use sluice_core::clock::ManualClock;
use sluice_runtime::Runtime;
use sluice_store::{MetadataStore, SqliteStore};
use tower::ServiceExt;

use crate::pipeline_stack::{Faults, FaultyLog, OTHER, USDC, key_for, settings, settle, transfer};

struct Stack {
    _dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    store: Arc<dyn MetadataStore>,
    log: Arc<FaultyLog>,
    runtime: Arc<Runtime>,
    state: AppState,
    operator: String,
    owner: String,
    stranger: String,
}

impl Stack {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock =
            Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0).unwrap()));
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store: Arc<dyn MetadataStore> = Arc::new(SqliteStore::open(&url).await.unwrap());
        let inner =
            Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
        let log = Arc::new(FaultyLog::new(inner, Faults::default()));
        let operator = key_for(store.as_ref(), "sluice", "ops", "admin", true).await;
        let owner = key_for(store.as_ref(), "acme", "data", "ann", false).await;
        let stranger = key_for(store.as_ref(), "other", "team", "eve", false).await;
        store.set_org_flags("acme", Some(true), Some(true)).await.unwrap();
        let (runtime, state) = Self::serve(&store, &log, &clock).await;
        Self { _dir: dir, clock, store, log, runtime, state, operator, owner, stranger }
    }

    async fn serve(
        store: &Arc<dyn MetadataStore>,
        log: &Arc<FaultyLog>,
        clock: &Arc<ManualClock>,
    ) -> (Arc<Runtime>, AppState) {
        let catalog = Arc::new(Catalog::default());
        let runtime = Runtime::builder(store.clone(), log.clone(), catalog, clock.clone())
            .settings(settings())
            .start()
            .await
            .unwrap();
        let state =
            AppState::new(store.clone(), Catalog::default(), clock.clone(), Limits::default())
                .with_runtime(runtime.clone());
        (runtime, state)
    }

    async fn restart(&mut self) {
        self.runtime.shutdown().await;
        let (runtime, state) = Self::serve(&self.store, &self.log, &self.clock).await;
        self.runtime = runtime;
        self.state = state;
    }

    async fn raw(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<String>,
    ) -> (StatusCode, String) {
        let headers: Vec<(&str, &str)> = key.map(|key| ("X-API-Key", key)).into_iter().collect();
        self.raw_with(method, path, &headers, body).await
    }

    async fn raw_with(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<String>,
    ) -> (StatusCode, String) {
        let mut request =
            Request::builder().method(method).uri(path).header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(body.map_or_else(Body::empty, Body::from)).unwrap();
        let response = sluice_api::app(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let (status, text) = self.raw(method, path, Some(key), body.map(|b| b.to_string())).await;
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        let (status, body) = self.call(Method::GET, path, &self.owner, None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        body
    }

    async fn create(&self, transforms: Value, pod_size: &str) -> String {
        let body = json!({
            "name": "usdc",
            "description": "USDC transfers",
            "pod_size": pod_size,
            "pipeline_config": {
                "source": {"chain": "base", "entity": "erc20_token_transfer"},
                "transforms": transforms,
                "sinks": [{"type": "kafka", "uid": "sk-out", "name": "transfers"}]
            }
        });
        let (status, created) =
            self.call(Method::POST, "/api/v1/beam", &self.owner, Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{created}");
        created["id"].as_str().unwrap().to_owned()
    }

    async fn action(&self, id: &str, action: &str) {
        let path = format!("/api/v1/beam/{id}/{action}");
        let (status, body) = self.call(Method::POST, &path, &self.owner, Some(json!({}))).await;
        assert_eq!(status, StatusCode::OK, "{action}: {body}");
    }

    async fn ingest(&self, transfers: &[(u64, &str)]) {
        let ndjson: String =
            transfers.iter().map(|(n, token)| transfer(*n, token).to_string() + "\n").collect();
        let (status, body) = self
            .raw(
                Method::POST,
                "/api/v1/streams/base/erc20_token_transfer/records",
                Some(&self.operator),
                Some(ndjson),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    /// Waits until the sink holds `count` records (a generous deadline fails the test).
    async fn delivered(&self, id: &str, count: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let page =
                self.get(&format!("/api/v1/beam/{id}/sinks/sk-out/records?limit=10000")).await;
            let got = page["records"].as_array().unwrap().len();
            if got >= count {
                assert_eq!(got, count);
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "only {got} of {count} delivered");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the deployment has read everything ingested so far.
    async fn settle(&self, id: &str) {
        settle(self.log.as_ref(), id).await;
    }

    /// Waits until this runtime's metrics count `sent` records of `id` as sent since it
    /// started. A worker records a delivery just after its commit, so a reader that saw the
    /// commit (`delivered`, `settle`) may still be a moment ahead of the metrics.
    async fn counted(&self, id: &str, sent: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let totals = self.runtime.metrics().totals();
            let got = totals.iter().find(|(p, _)| p == id).map_or(0, |(_, t)| t.sent);
            if got >= sent {
                assert_eq!(got, sent);
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "only {got} of {sent} counted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn health(&self, id: &str) -> Value {
        let body = self.get(&format!("/api/v1/beam/{id}/deploy/stats")).await;
        body["workers_health"].clone()
    }

    /// Polls the stats until `done` holds for them (a generous deadline fails the test).
    async fn health_until(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let health = self.health(id).await;
            if done(&health) {
                return health;
            }
            assert!(tokio::time::Instant::now() < deadline, "stats never got there: {health}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn usdc_filter() -> Value {
    json!([{"type": "redis_set_filter", "uid": "tf-tokens",
            "filter_expr": "root = this.token_address", "set_values": [USDC]}])
}

fn zero_workers(health: &Value) {
    assert_eq!(
        *health,
        json!({"total_workers": 0, "healthy_workers": 0, "unhealthy_workers": 0,
               "crashing_workers": 0, "oom_killed_workers": 0, "workers": []})
    );
}

#[tokio::test]
async fn stats_list_the_workers_of_a_deployed_pipeline_and_none_when_paused_or_torn_down() {
    let stack = Stack::new().await;
    let id = stack.create(usdc_filter(), "M").await;
    zero_workers(&stack.health(&id).await);
    // Strangers see no such pipeline; without a key it is 401.
    let path = format!("/api/v1/beam/{id}/deploy/stats");
    let (status, _) = stack.call(Method::GET, &path, &stack.stranger, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = stack.raw(Method::GET, &path, None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    stack.action(&id, "deploy").await;
    let health = stack.health(&id).await;
    assert_eq!(health["total_workers"], 2, "{health}");
    assert_eq!(health["healthy_workers"], 2);
    assert_eq!(health["unhealthy_workers"], 0);
    assert_eq!(health["crashing_workers"], 0);
    assert_eq!(health["oom_killed_workers"], 0);
    let workers = health["workers"].as_array().unwrap();
    for (index, worker) in workers.iter().enumerate() {
        assert_eq!(worker["name"], format!("{id}-worker-{index}"));
        assert_eq!(worker["status"], "Running");
        assert_eq!(worker["is_ready"], true);
        assert_eq!(worker["is_crash_looping"], false);
        assert_eq!(worker["is_oom_killed"], false);
        assert_eq!(worker["restart_count"], 0);
        assert_eq!(worker["start_time"], "2026-11-21T12:00:00.000000Z");
        assert_eq!(worker["last_error"], Value::Null);
    }

    stack.action(&id, "pause").await;
    zero_workers(&stack.health(&id).await);
    stack.clock.advance(chrono::Duration::seconds(30));
    stack.action(&id, "deploy").await;
    let health = stack.health(&id).await;
    assert_eq!(health["total_workers"], 2);
    assert_eq!(health["workers"][0]["start_time"], "2026-11-21T12:00:30.000000Z");
    stack.action(&id, "teardown").await;
    zero_workers(&stack.health(&id).await);
}

#[tokio::test]
async fn a_crashing_worker_is_restarted_with_backoff_shows_as_crash_looping_and_still_delivers() {
    let stack = Stack::new().await;
    let id = stack.create(usdc_filter(), "S").await;
    stack.action(&id, "deploy").await;
    stack.log.hooks().panics.store(3, Ordering::SeqCst);
    let health = stack
        .health_until(&id, |h| {
            h["workers"][0]["restart_count"] == 3
                && h["healthy_workers"] == 0
                && h["workers"][0]["is_ready"] == true
        })
        .await;
    let worker = &health["workers"][0];
    assert_eq!(health["total_workers"], 1);
    assert_eq!(health["crashing_workers"], 1, "{health}");
    assert_eq!(health["unhealthy_workers"], 1);
    assert_eq!(worker["is_crash_looping"], true);
    assert_eq!(worker["is_oom_killed"], false);
    assert!(worker["last_error"].as_str().unwrap().contains("injected read failure"), "{worker}");
    // The restarted worker goes on delivering.
    stack.ingest(&[(1, USDC), (2, OTHER), (3, USDC)]).await;
    stack.delivered(&id, 2).await;
    // Five minutes later the restarts are old: healthy again, the count stays.
    stack.clock.advance(chrono::Duration::minutes(6));
    let health = stack.health(&id).await;
    assert_eq!(health["healthy_workers"], 1, "{health}");
    assert_eq!(health["crashing_workers"], 0);
    assert_eq!(health["workers"][0]["restart_count"], 3);
    assert_eq!(health["workers"][0]["status"], "Running");
}

#[tokio::test]
async fn a_script_over_its_memory_limit_is_an_oom_kill_in_the_stats() {
    let stack = Stack::new().await;
    let bomb = "function transform(r) { if (r.n === 2) { const a = []; while (true) { a.push(new Array(100000).fill(r.n)); } } return r; }";
    let id = stack.create(json!([{"type": "v8", "uid": "js", "script": bomb}]), "S").await;
    stack.action(&id, "deploy").await;
    stack.ingest(&[(1, USDC), (2, USDC), (3, USDC)]).await;
    stack.delivered(&id, 2).await;
    stack.settle(&id).await;
    let health = stack.health(&id).await;
    let worker = &health["workers"][0];
    assert_eq!(health["oom_killed_workers"], 1, "{health}");
    assert_eq!(worker["is_oom_killed"], true);
    assert!(worker["oom_kill_count"].as_u64().unwrap() >= 1);
    assert_eq!(worker["restart_count"], worker["oom_kill_count"]);
    assert_eq!(worker["is_ready"], true);
    // The record that blew the memory up is a processor error in the metrics.
    let metrics = stack.get(&format!("/api/v1/beam/{id}/deploy/metrics?aggregated=true")).await;
    assert_eq!(metrics["totals"]["processor_error"], 1, "{metrics}");
    assert_eq!(metrics["totals"]["messages_sent"], 2);
}

fn series<'a>(body: &'a Value, metric_type: &str) -> &'a Vec<Value> {
    body["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric_type"] == metric_type)
        .unwrap_or_else(|| panic!("no {metric_type} in {body}"))["points"]
        .as_array()
        .unwrap()
}

fn sum(points: &[Value]) -> f64 {
    points.iter().map(|p| p["value"].as_f64().unwrap()).sum()
}

#[tokio::test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario in the order it happens: records in, counters checked, a restart, counters checked again"
)]
async fn metrics_count_what_was_received_and_sent_and_survive_a_restart() {
    let mut stack = Stack::new().await;
    let id = stack.create(usdc_filter(), "M").await;
    stack.action(&id, "deploy").await;
    // Records whose block time is 45 s before they are read and delivered.
    stack.clock.advance(chrono::Duration::seconds(45));
    let transfers: Vec<(u64, &str)> =
        (1..=10).map(|n| (n, if n % 3 == 0 { USDC } else { OTHER })).collect();
    stack.ingest(&transfers).await; // 10 received, 3 match
    stack.delivered(&id, 3).await;
    stack.settle(&id).await;
    stack.counted(&id, 3).await;

    let check = |body: &Value| {
        assert_eq!(body["config_id"], id.as_str());
        let types: Vec<&str> = body["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["metric_type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                "messages_received",
                "messages_sent",
                "total_latency",
                "processing_latency",
                "processor_error",
                "output_error",
                "data_age"
            ]
        );
        assert_eq!(sum(series(body, "messages_received")), 10.0, "{body}");
        assert_eq!(sum(series(body, "messages_sent")), 3.0);
        assert_eq!(sum(series(body, "processor_error")), 0.0);
        assert_eq!(sum(series(body, "output_error")), 0.0);
        let age = series(body, "data_age");
        assert_eq!(age.len(), 1, "{body}");
        assert_eq!(age[0]["value"], 45_000.0);
        assert_eq!(series(body, "total_latency").len(), 1);
        assert!(series(body, "processing_latency")[0]["value"].as_f64().unwrap() >= 0.0);
    };
    let hour = stack.get(&format!("/api/v1/beam/{id}/deploy/metrics")).await;
    check(&hour);
    let received = series(&hour, "messages_received");
    assert_eq!(received.len(), 60);
    assert_eq!(received[59]["timestamp"], "2026-11-21T12:00:00.000000Z");
    assert_eq!(received[0]["timestamp"], "2026-11-21T11:01:00.000000Z");
    assert_eq!(received[59]["value"], 10.0);
    let day = stack.get(&format!("/api/v1/beam/{id}/deploy/metrics?time_range=1d")).await;
    check(&day);
    assert_eq!(series(&day, "messages_sent").len(), 96);
    let week = stack.get(&format!("/api/v1/beam/{id}/deploy/metrics?time_range=1w")).await;
    check(&week);
    assert_eq!(series(&week, "messages_sent").len(), 168);

    let path = format!("/api/v1/beam/{id}/deploy/metrics?aggregated=true&time_range=1h");
    let summary = stack.get(&path).await;
    assert_eq!(summary["pipeline_id"], id.as_str());
    assert_eq!(summary["time_range"], "1h");
    assert_eq!(summary["totals"]["messages_received"], 10, "{summary}");
    assert_eq!(summary["totals"]["messages_sent"], 3);
    assert_eq!(summary["messages_received_per_min"], 10.0 / 60.0);
    assert_eq!(summary["messages_sent_per_min"], 3.0 / 60.0);
    assert_eq!(summary["processor_error_rate"], 0.0);
    assert_eq!(summary["output_error_rate"], 0.0);
    assert_eq!(summary["data_age_ms"], 45_000);
    assert_eq!(summary["data_freshness_ms"], 45_000);
    assert_eq!(summary["total_latency"]["unit"], "ms");
    let (p50, p99) = (&summary["total_latency"]["p50"], &summary["total_latency"]["p99"]);
    assert!(p50.as_f64().unwrap() <= p99.as_f64().unwrap(), "{summary}");
    assert_eq!(summary["processing_latency"][0]["path"], "transforms");
    assert!(summary["processing_latency"][0]["latency"]["p90"].is_number());

    // Only what was asked for, in the order asked.
    let path = format!("/api/v1/beam/{id}/deploy/metrics?metrics=data_age,messages_sent");
    let some = stack.get(&path).await;
    let types: Vec<&str> = some["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["metric_type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["data_age", "messages_sent"]);
    let path = format!("/api/v1/beam/{id}/deploy/metrics?metrics=messages_sent&aggregated=true");
    let some = stack.get(&path).await;
    assert_eq!(some["messages_sent_per_min"], 3.0 / 60.0);
    assert!(
        some.get("messages_received_per_min").is_none() && some.get("data_age_ms").is_none(),
        "{some}"
    );

    // A restart keeps the history (the stopping runtime writes it to the store).
    stack.restart().await;
    check(&stack.get(&format!("/api/v1/beam/{id}/deploy/metrics")).await);
    // Later records add to it.
    stack.clock.advance(chrono::Duration::minutes(2));
    stack.ingest(&[(11, USDC), (12, OTHER)]).await;
    stack.delivered(&id, 4).await;
    stack.settle(&id).await;
    stack.counted(&id, 1).await; // since the restart
    let hour = stack.get(&format!("/api/v1/beam/{id}/deploy/metrics")).await;
    assert_eq!(sum(series(&hour, "messages_received")), 12.0);
    assert_eq!(sum(series(&hour, "messages_sent")), 4.0);
    assert_eq!(series(&hour, "messages_sent")[59]["value"], 1.0);
    // An hour and a half later the first minute has left the 1h range but not the 1d one.
    stack.clock.advance(chrono::Duration::minutes(90));
    let hour = stack.get(&format!("/api/v1/beam/{id}/deploy/metrics")).await;
    assert_eq!(sum(series(&hour, "messages_received")), 0.0);
    let day = stack.get(&format!("/api/v1/beam/{id}/deploy/metrics?time_range=1d")).await;
    assert_eq!(sum(series(&day, "messages_received")), 12.0);
}

#[tokio::test]
async fn bad_metrics_queries_are_422_and_strangers_get_404() {
    let stack = Stack::new().await;
    let id = stack.create(usdc_filter(), "S").await;
    for (query, loc, needle) in [
        ("time_range=2h", "time_range", "'1h', '1d' or '1w'"),
        ("time_range=", "time_range", "'1h', '1d' or '1w'"),
        ("aggregated=yes", "aggregated", "valid boolean"),
        ("metrics=messages_sent,bogus", "metrics", "bogus"),
        ("metrics=", "metrics", "unknown metric type ''"),
        ("metrics=processor_errors", "metrics", "processor_errors"),
    ] {
        let path = format!("/api/v1/beam/{id}/deploy/metrics?{query}");
        let (status, body) = stack.call(Method::GET, &path, &stack.owner, None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{query}: {body}");
        let detail = &body["detail"][0];
        assert_eq!(detail["loc"], json!(["query", loc]), "{query}: {body}");
        assert!(detail["msg"].as_str().unwrap().contains(needle), "{query}: {body}");
    }
    // Every violation at once.
    let path = format!("/api/v1/beam/{id}/deploy/metrics?time_range=1y&aggregated=1&metrics=x");
    let (status, body) = stack.call(Method::GET, &path, &stack.owner, None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["detail"].as_array().unwrap().len(), 3, "{body}");
    let path = format!("/api/v1/beam/{id}/deploy/metrics");
    let (status, _) = stack.call(Method::GET, &path, &stack.stranger, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A pipeline never deployed has empty counts.
    let body = stack.get(&path).await;
    assert_eq!(sum(series(&body, "messages_received")), 0.0);
    assert!(series(&body, "data_age").is_empty());
}

/// Parses Prometheus text format: `name{labels} value` samples by their name and labels.
fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.split_whitespace().collect();
            assert!(matches!(words.first(), Some(&"HELP" | &"TYPE")), "{line}");
            if words[0] == "TYPE" {
                assert!(["counter", "gauge", "histogram"].contains(&words[2]), "{line}");
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        assert!(
            series[..name_end].chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "{line}");
        }
        assert!(samples.insert(series.to_owned(), value).is_none(), "duplicate {line}");
    }
    samples
}

#[tokio::test]
async fn prometheus_exposes_the_counters_and_latency_histograms_per_pipeline_to_an_operator() {
    let stack = Stack::new().await;
    let id = stack.create(usdc_filter(), "S").await;
    stack.action(&id, "deploy").await;
    let transfers: Vec<(u64, &str)> =
        (1..=7).map(|n| (n, if n <= 2 { USDC } else { OTHER })).collect();
    stack.ingest(&transfers).await;
    stack.delivered(&id, 2).await;
    stack.settle(&id).await;
    stack.counted(&id, 2).await;
    let (status, text) = stack.raw(Method::GET, "/metrics", Some(&stack.operator), None).await;
    assert_eq!(status, StatusCode::OK);
    let samples = parse_prometheus(&text);
    let at = |name: &str, labels: &str| {
        let key = format!("{name}{{config_id=\"{id}\"{labels}}}");
        *samples.get(&key).unwrap_or_else(|| panic!("no {key} in\n{text}"))
    };
    assert_eq!(at("sluice_pipeline_messages_received_total", ""), 7.0);
    assert_eq!(at("sluice_pipeline_messages_sent_total", ""), 2.0);
    assert_eq!(at("sluice_pipeline_processor_errors_total", ""), 0.0);
    assert_eq!(at("sluice_pipeline_output_errors_total", ""), 0.0);
    for histogram in
        ["sluice_pipeline_total_latency_seconds", "sluice_pipeline_processing_latency_seconds"]
    {
        let count = at(&format!("{histogram}_count"), "");
        assert!(count >= 1.0, "{text}");
        assert_eq!(at(&format!("{histogram}_bucket"), ",le=\"+Inf\""), count);
        // Buckets are cumulative.
        let buckets: Vec<f64> = samples
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{histogram}_bucket{{config_id=\"{id}\"")))
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(buckets.len(), 17);
        assert!(buckets.iter().all(|b| *b <= count));
    }
    assert_eq!(at("sluice_pipeline_data_age_seconds", ""), 0.0);
    assert_eq!(at("sluice_pipeline_workers", ",health=\"total\""), 1.0);
    assert_eq!(at("sluice_pipeline_workers", ",health=\"healthy\""), 1.0);
    assert_eq!(at("sluice_pipeline_worker_restarts", ""), 0.0);
}

/// The `config_id` labels of a Prometheus exposition.
fn labelled_pipelines(text: &str) -> std::collections::BTreeSet<String> {
    parse_prometheus(text)
        .keys()
        .filter_map(|series| series.split("config_id=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn prometheus_needs_a_key_or_the_metrics_token_and_shows_a_tenant_only_its_pipelines() {
    let mut stack = Stack::new().await;
    stack.state = stack.state.clone().with_metrics_token("prometheus-scrape-token-1234");
    let ours = stack.create(usdc_filter(), "S").await;
    stack.action(&ours, "deploy").await;
    // The stranger's org has the pipeline service too, and its own deployed pipeline.
    stack.store.set_org_flags("other", Some(true), Some(true)).await.unwrap();
    let body = json!({
        "name": "theirs", "description": "", "pod_size": "S",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": usdc_filter(),
            "sinks": [{"type": "kafka", "uid": "sk-out", "name": "transfers"}]
        }
    });
    let (status, created) =
        stack.call(Method::POST, "/api/v1/beam", &stack.stranger, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let theirs = created["id"].as_str().unwrap().to_owned();
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/api/v1/beam/{theirs}/deploy"),
            &stack.stranger,
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    stack.ingest(&[(1, USDC)]).await;
    stack.delivered(&ours, 1).await;
    stack.counted(&ours, 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !stack.runtime.metrics().totals().iter().any(|(id, t)| *id == theirs && t.sent == 1) {
        assert!(tokio::time::Instant::now() < deadline, "their pipeline never delivered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let both: std::collections::BTreeSet<String> = [ours.clone(), theirs.clone()].into();

    // No key, a wrong key, a wrong token: 401 in the error shape.
    for headers in [
        vec![],
        vec![("X-API-Key", "slk_0000000000000000000000000000000000000000")],
        vec![("Authorization", "Bearer wrong-token")],
    ] {
        let (status, text) = stack.raw_with(Method::GET, "/metrics", &headers, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{headers:?}: {text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        assert!(body["detail"].is_string(), "{text}");
    }
    // The token and an operator's key see every pipeline.
    let headers = [("Authorization", "Bearer prometheus-scrape-token-1234")];
    let (status, text) = stack.raw_with(Method::GET, "/metrics", &headers, None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(labelled_pipelines(&text), both);
    let (status, text) = stack.raw(Method::GET, "/metrics", Some(&stack.operator), None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(labelled_pipelines(&text), both);
    // A tenant's key sees only what it may read: never the other tenant's pipeline ids.
    let (status, text) = stack.raw(Method::GET, "/metrics", Some(&stack.owner), None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(labelled_pipelines(&text), [ours.clone()].into());
    assert!(!text.contains(&theirs), "{text}");
    let (status, text) = stack.raw(Method::GET, "/metrics", Some(&stack.stranger), None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(labelled_pipelines(&text), [theirs.clone()].into());
    assert!(!text.contains(&ours), "{text}");
}

#[tokio::test]
async fn deleting_a_pipeline_deletes_its_stored_metrics() {
    let stack = Stack::new().await;
    let id = stack.create(usdc_filter(), "S").await;
    let kept = stack.create(usdc_filter(), "S").await;
    stack.action(&id, "deploy").await;
    stack.action(&kept, "deploy").await;
    stack.ingest(&[(1, USDC)]).await;
    stack.delivered(&id, 1).await;
    stack.delivered(&kept, 1).await;
    stack.settle(&id).await;
    stack.settle(&kept).await;
    stack.counted(&id, 1).await;
    stack.counted(&kept, 1).await;
    stack.action(&id, "pause").await; // writes its minute to the store
    stack.action(&kept, "pause").await;
    assert_eq!(stack.store.metric_samples(&id, 0, i64::MAX).await.unwrap().len(), 1);
    let (status, body) =
        stack.call(Method::DELETE, &format!("/api/v1/beam/{id}"), &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(stack.store.metric_samples(&id, 0, i64::MAX).await.unwrap().is_empty());
    let left = stack.store.metric_samples(&kept, 0, i64::MAX).await.unwrap();
    assert_eq!(left[0].1.received, 1);
    let body = stack.get(&format!("/api/v1/beam/{kept}/deploy/metrics")).await;
    assert_eq!(sum(series(&body, "messages_received")), 1.0);
}

#[tokio::test]
async fn failed_sink_writes_are_output_errors_and_the_held_batch_is_sent_once() {
    let stack = Stack::new().await;
    let id = stack.create(usdc_filter(), "S").await;
    stack.action(&id, "deploy").await;
    // Paused while the records arrive, so the resumed worker reads all four in one round
    // (a running worker may see an append's partitions in two rounds: two sink writes).
    stack.action(&id, "pause").await;
    stack.log.hooks().failures.store(3, Ordering::SeqCst);
    stack.ingest(&[(1, USDC), (2, OTHER), (3, USDC), (4, USDC)]).await;
    stack.action(&id, "deploy").await;
    stack.delivered(&id, 3).await;
    stack.settle(&id).await;
    stack.counted(&id, 3).await;
    let hour = stack.get(&format!("/api/v1/beam/{id}/deploy/metrics")).await;
    // Three failed writes, then the held batch went through: 4 read, 3 sent, once each.
    assert_eq!(sum(series(&hour, "output_error")), 3.0, "{hour}");
    assert_eq!(sum(series(&hour, "messages_received")), 4.0);
    assert_eq!(sum(series(&hour, "messages_sent")), 3.0);
    let summary = stack.get(&format!("/api/v1/beam/{id}/deploy/metrics?aggregated=true")).await;
    assert_eq!(summary["output_error_rate"], 3.0 / 4.0, "{summary}");
    assert_eq!(summary["totals"]["output_error"], 3);
    let (_, text) = stack.raw(Method::GET, "/metrics", Some(&stack.owner), None).await;
    let samples = parse_prometheus(&text);
    assert_eq!(samples[&format!("sluice_pipeline_output_errors_total{{config_id=\"{id}\"}}")], 3.0);
}

#[tokio::test]
async fn stats_say_whether_a_pipeline_is_deployed_paused_or_not_and_since_when() {
    let h = crate::harness::Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let id =
        h.create(&ann, crate::harness::pipeline_body("p")).await["id"].as_str().unwrap().to_owned();
    let stats = || async {
        let (status, body) = h.get(&format!("/api/v1/beam/{id}/deploy/stats"), &ann).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        (body["status"].clone(), body["deployed_at"].clone())
    };
    let post = |action: &'static str| {
        let path = format!("/api/v1/beam/{id}/{action}");
        let h = &h;
        let ann = &ann;
        async move {
            let (status, body) = h.call(Method::POST, &path, Some(&ann.key), None).await;
            assert_eq!(status, StatusCode::OK, "{action}: {body}");
        }
    };
    assert_eq!(stats().await, (json!("not_deployed"), Value::Null));
    let now = || sluice_core::clock::Clock::now(h.clock.as_ref());
    let first = sluice_core::time::format(now());
    post("deploy").await;
    assert_eq!(stats().await, (json!("deployed"), json!(first)));
    // Pauses, resumes and redeploys keep the time of the deployment.
    h.clock.advance(chrono::Duration::minutes(3));
    post("pause").await;
    assert_eq!(stats().await, (json!("paused"), json!(first)));
    h.clock.advance(chrono::Duration::minutes(3));
    post("deploy").await;
    post("deploy").await;
    assert_eq!(stats().await, (json!("deployed"), json!(first)));
    // A teardown ends it; the next deploy is a new deployment.
    post("teardown").await;
    assert_eq!(stats().await, (json!("not_deployed"), Value::Null));
    h.clock.advance(chrono::Duration::minutes(3));
    let second = sluice_core::time::format(now());
    post("deploy").await;
    assert_eq!(stats().await, (json!("deployed"), json!(second)));
}
