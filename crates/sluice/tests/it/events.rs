//! Service events through `sluice serve`: each kind made to happen for real, then seen in
//! `GET /api/v1/events`, in `GET /api/v1/events/stream` and at a notification webhook whose
//! signature is checked; another organization sees none of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::crash::{KEY, USDC, batch, send};
use crate::process::{Server, admin, data_dir_args, free_port, sluice};

pub(crate) const HOOK_SECRET: &str = "notification-signing-key-0123456789";

/// What a receiver got: for each request, its headers and body.
pub(crate) type Got = Arc<Mutex<Vec<(HashMap<String, String>, Vec<u8>)>>>;

/// A webhook receiver on `listener` that answers 200 and keeps every request.
pub(crate) fn receiver(listener: tokio::net::TcpListener) -> Got {
    let got: Got = Arc::default();
    let state = got.clone();
    let app = axum::Router::new().fallback(axum::routing::post(
        move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let state = state.clone();
            async move {
                let headers = headers
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                    .collect();
                state.lock().unwrap().push((headers, body.to_vec()));
                axum::http::StatusCode::OK
            }
        },
    ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    got
}

/// The events a notification receiver got, each request's signature checked with
/// `HOOK_SECRET` (HMAC-SHA256 of `<nonce>.<timestamp>.<body>`).
pub(crate) fn signed_events(got: &Got) -> Vec<Value> {
    let mut events = Vec::new();
    for (headers, body) in got.lock().unwrap().iter() {
        let nonce = &headers["x-webhook-nonce"];
        let timestamp = &headers["x-webhook-timestamp"];
        let mut mac = Hmac::<Sha256>::new_from_slice(HOOK_SECRET.as_bytes()).unwrap();
        mac.update(format!("{nonce}.{timestamp}.").as_bytes());
        mac.update(body);
        let expected: String =
            mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(headers["x-signature-256"], format!("sha256={expected}"), "bad signature");
        let items: Vec<Value> = serde_json::from_slice(body).unwrap();
        events.extend(items.into_iter().map(|item| item["value"].clone()));
    }
    events
}

/// Collects the messages of `GET /api/v1/events/stream` as they come; answers once the
/// stream answered (its start is fixed then: events stored from there on).
pub(crate) async fn follow(base: &str, key: &str) -> Arc<Mutex<Vec<Value>>> {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let out = seen.clone();
    let client = reqwest::Client::new();
    let url = format!("{base}/api/v1/events/stream");
    let mut response = client.get(url).header("x-api-key", key).send().await.unwrap();
    assert_eq!(response.status(), 200);
    tokio::spawn(async move {
        let mut buffer = String::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let message: String = buffer.drain(..end + 2).collect();
                for line in message.lines() {
                    if let Some(data) = line.strip_prefix("data:") {
                        out.lock().unwrap().push(serde_json::from_str(data.trim()).unwrap());
                    }
                }
            }
        }
    });
    seen
}

pub(crate) fn start(dir: &std::path::Path, port: u16) -> Server {
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(dir))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--warehouse-flush-secs", "1", "--backfill-chunk-rows", "40"])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY)
        .env("SLUICE_EVENTS_SAMPLE_MS", "200")
        .env("SLUICE_EVENTS_SINK_FAILING_SECS", "1")
        .env("SLUICE_EVENTS_WORKER_STABLE_SECS", "1");
    Server::start(command, port)
}

pub(crate) struct Api {
    pub(crate) client: reqwest::Client,
    pub(crate) base: String,
}

impl Api {
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        send(&self.client, method, &url, body.map(|b| b.to_string())).await
    }

    async fn pipeline(&self, name: &str, transforms: Value, sink: Value) -> String {
        let body = json!({
            "name": name, "description": "events",
            "pipeline_config": {
                "source": {"chain": "base", "entity": "erc20_token_transfer"},
                "transforms": transforms, "sinks": [sink]
            }
        });
        let (status, created) = self.call(reqwest::Method::POST, "/api/v1/beam", Some(body)).await;
        assert_eq!(status, 200, "{created}");
        created["id"].as_str().unwrap().to_owned()
    }

    async fn ingest(&self, from: u64, count: u64) {
        let url = format!("{}/api/v1/streams/base/erc20_token_transfer/records", self.base);
        let (status, body) =
            send(&self.client, reqwest::Method::POST, &url, Some(batch(from, count))).await;
        assert_eq!(status, 200, "{body}");
    }

    /// Every event the bootstrap key sees, following the cursor.
    pub(crate) async fn events(&self, key: &str, query: &str) -> Vec<Value> {
        let mut all = Vec::new();
        let mut cursor: Option<i64> = None;
        loop {
            let mut url = format!("{}/api/v1/events?limit=50{query}", self.base);
            if let Some(cursor) = cursor {
                url.push_str(&format!("&cursor={cursor}"));
            }
            let answer = self.client.get(url).header("x-api-key", key).send().await.unwrap();
            assert_eq!(answer.status(), 200);
            let page: Value = answer.json().await.unwrap();
            all.extend(page["items"].as_array().unwrap().iter().cloned());
            match page["cursor"].as_i64() {
                Some(next) => cursor = Some(next),
                None => return all,
            }
        }
    }
}

/// Sets a webhook notification destination for `kinds`, signed with `HOOK_SECRET` (an
/// organization secret); answers what its receiver gets.
pub(crate) async fn signed_destination(api: &Api, kinds: Value) -> Got {
    let (status, body) = api
        .call(
            reqwest::Method::PUT,
            "/api/v1/beam/secrets/hook-key",
            Some(json!({"value": HOOK_SECRET})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/notify", listener.local_addr().unwrap());
    let hook = receiver(listener);
    let destinations = json!({"destinations": [
        {"sink": {"type": "webhook", "name": "ops", "url": url, "hash_key": "hook-key"},
         "kinds": kinds},
    ]});
    let (status, body) =
        api.call(reqwest::Method::PUT, "/api/v1/notifications", Some(destinations)).await;
    assert_eq!(status, 200, "{body}");
    hook
}

pub(crate) fn has(events: &[Value], kind: &str, subject: &str) -> bool {
    events.iter().any(|e| {
        e["kind"] == kind
            && [&e["pipeline_id"], &e["job_id"], &e["chain"], &e["node"]]
                .iter()
                .any(|s| s.as_str() == Some(subject))
    })
}

/// Waits until `kind` of `subject` is in the API, the stream and the webhook.
pub(crate) async fn seen_everywhere(
    api: &Api,
    stream: &Arc<Mutex<Vec<Value>>>,
    hook: &Got,
    kind: &str,
    subject: &str,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = api.events(KEY, &format!("&kind={kind}")).await;
        let streamed = has(&stream.lock().unwrap(), kind, subject);
        let hooked = has(&signed_events(hook), kind, subject);
        if let (Some(event), true, true) = (
            listed.iter().find(|e| has(std::slice::from_ref(e), kind, subject)).cloned(),
            streamed,
            hooked,
        ) {
            return event;
        }
        assert!(
            Instant::now() < deadline,
            "{kind} of {subject}: listed {}, streamed {streamed}, hooked {hooked}",
            listed.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario: each kind of event made for real, then read back through the API, the stream and a webhook"
)]
async fn each_kind_made_for_real_reaches_the_api_the_stream_and_a_signed_webhook_and_no_other_org()
{
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let api = Api { client, base: server.base.clone() };
    let store = data_dir_args(dir.path());
    let store: Vec<&str> = store.iter().map(String::as_str).collect();
    let other = String::from_utf8(
        admin(&["create-key", "--org", "rival", "--team", "t", "--user", "eve"], &store, &[])
            .stdout,
    )
    .unwrap()
    .trim()
    .to_owned();

    let hook = signed_destination(
        &api,
        json!(["pipeline.*", "dead_letters.*", "worker.*", "sink.*", "backfill.*", "lag.*"]),
    )
    .await;
    let stream = follow(&api.base, KEY).await;
    let rival_stream = follow(&api.base, &other).await;

    // A script that throws on every record: dead letters, aggregated with their count.
    let throws = json!([{"type": "v8", "uid": "tf-throw",
        "script": "function transform(r) { throw new Error('no ' + r.n); }"}]);
    let managed = json!({"type": "kafka", "uid": "sk-1", "name": "out"});
    let dead = api.pipeline("throws", throws, managed.clone()).await;
    let (status, body) =
        api.call(reqwest::Method::POST, &format!("/api/v1/beam/{dead}/deploy"), None).await;
    assert_eq!(status, 200, "{body}");
    seen_everywhere(&api, &stream, &hook, "pipeline.created", &dead).await;
    seen_everywhere(&api, &stream, &hook, "pipeline.deployed", &dead).await;
    api.ingest(0, 30).await;
    let event = seen_everywhere(&api, &stream, &hook, "dead_letters.recorded", &dead).await;
    assert!(event["details"]["count"].as_u64().unwrap() >= 1, "{event}");
    assert_eq!(event["severity"], "warning");
    api.ingest(30, 30).await;
    // Still one event within the minute, whatever more failed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let recorded =
        api.events(KEY, &format!("&kind=dead_letters.recorded&pipeline_id={dead}")).await;
    assert_eq!(recorded.len(), 1, "{recorded:?}");

    // A worker OOM: a script that hoards memory.
    let hoards = json!([{"type": "v8", "uid": "tf-hoard",
        "script": "function transform(r) { const h = []; while (true) h.push(new Array(100000).fill(r.n)); }"}]);
    let oom = api.pipeline("hoards", hoards, managed.clone()).await;
    let (status, body) =
        api.call(reqwest::Method::POST, &format!("/api/v1/beam/{oom}/deploy"), None).await;
    assert_eq!(status, 200, "{body}");
    api.ingest(60, 1).await;
    let event = seen_everywhere(&api, &stream, &hook, "worker.oom_killed", &oom).await;
    assert_eq!(event["severity"], "error");

    // A deploy that fails: the webhook sink names a secret deleted since the pipeline was made.
    let (status, _) = api
        .call(reqwest::Method::PUT, "/api/v1/beam/secrets/gone-key", Some(json!({"value": "x"})))
        .await;
    assert_eq!(status, 200);
    let missing = json!({"type": "webhook", "uid": "sk-w", "name": "w",
        "url": "http://127.0.0.1:9/x", "hash_key": "gone-key"});
    let failing = api.pipeline("fails", json!([]), missing).await;
    let (status, _) =
        api.call(reqwest::Method::DELETE, "/api/v1/beam/secrets/gone-key", None).await;
    assert!(status == 200 || status == 204, "{status}");
    let (status, body) =
        api.call(reqwest::Method::POST, &format!("/api/v1/beam/{failing}/deploy"), None).await;
    assert_eq!(status, 422, "{body}");
    let event = seen_everywhere(&api, &stream, &hook, "pipeline.deploy_failed", &failing).await;
    assert!(event["details"]["error"].as_str().unwrap().contains("gone-key"), "{event}");
    seen_everywhere(&api, &stream, &hook, "sink.secret_missing", &failing).await;

    // A sink receiver that is down, then comes back.
    let down_port = free_port();
    let down = json!({"type": "webhook", "uid": "sk-d", "name": "d",
        "url": format!("http://127.0.0.1:{down_port}/in")});
    let flaky = api.pipeline("flaky", json!([]), down).await;
    let (status, body) =
        api.call(reqwest::Method::POST, &format!("/api/v1/beam/{flaky}/deploy"), None).await;
    assert_eq!(status, 200, "{body}");
    api.ingest(100, 5).await;
    let event = seen_everywhere(&api, &stream, &hook, "sink.failing", &flaky).await;
    assert_eq!(event["details"]["sink_uid"], "sk-d");
    let back = receiver(tokio::net::TcpListener::bind(("127.0.0.1", down_port)).await.unwrap());
    seen_everywhere(&api, &stream, &hook, "sink.recovered", &flaky).await;
    assert!(!back.lock().unwrap().is_empty(), "the held records arrived");
    // Its records are days old: over the default data age threshold (300 s); under a
    // threshold of 30 days, set through the API, it is back under. The whole number may be
    // written as a float (`2592000.0`), as JSON Schema's `integer` allows; a fraction may not.
    seen_everywhere(&api, &stream, &hook, "lag.data_age_over", &flaky).await;
    let path = format!("/api/v1/beam/{flaky}/thresholds");
    let (status, set) = api
        .call(reqwest::Method::PUT, &path, Some(json!({"data_age_warning_seconds": 2_592_000.0})))
        .await;
    assert_eq!((status, &set["is_default"]), (200, &json!(false)), "{set}");
    assert_eq!(set["data_age_warning_seconds"], 2_592_000, "{set}");
    for refused in [json!(0), json!(1.5)] {
        let body = json!({"data_age_warning_seconds": refused});
        let (status, _) = api.call(reqwest::Method::PUT, &path, Some(body)).await;
        assert_eq!(status, 422, "{refused}");
    }
    seen_everywhere(&api, &stream, &hook, "lag.data_age_recovered", &flaky).await;

    // Backfills: one to completion (an empty window), one cancelled.
    let job = |name: &str, end: &str, hook: &str| {
        json!({
            "job_name": name, "table": "base.assets.erc20_token_transfers",
            "backfill_window": {"partition_key": "block_timestamp",
                                "start": "2026-11-21T00:00:00Z", "end": end},
            "filter": {"column": "token_address", "values": [USDC]},
            "destinations": [{"type": "webhook", "name": "hook", "url": hook}],
        })
    };
    let sink_url = format!("http://127.0.0.1:{down_port}/in");
    let (status, done) = api
        .call(
            reqwest::Method::POST,
            "/api/v1/beam/backfills",
            Some(job("empty", "2026-11-21T00:00:01Z", &sink_url)),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    let done = done["job_id"].as_str().unwrap().to_owned();
    seen_everywhere(&api, &stream, &hook, "backfill.completed", &done).await;
    // The second needs rows in the warehouse and a receiver slow enough to cancel in time.
    let slow = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let slow_url = format!("http://{}/slow", slow.local_addr().unwrap());
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(axum::routing::post(|| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            axum::http::StatusCode::OK
        }));
        axum::serve(slow, app).await.unwrap();
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let job_id = loop {
        let (status, created) = api
            .call(
                reqwest::Method::POST,
                "/api/v1/beam/backfills",
                Some(job("slow", "2026-11-22T00:00:00Z", &slow_url)),
            )
            .await;
        assert_eq!(status, 200, "{created}");
        let job_id = created["job_id"].as_str().unwrap().to_owned();
        let (_, state) =
            api.call(reqwest::Method::GET, &format!("/api/v1/beam/backfills/{job_id}"), None).await;
        if state["num_chunks"].as_u64().unwrap_or(0) > 0 || state["status"] == "staging" {
            break job_id;
        }
        assert!(Instant::now() < deadline, "the warehouse never had rows: {state}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let (status, body) = api
        .call(reqwest::Method::POST, &format!("/api/v1/beam/backfills/{job_id}/cancel"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    seen_everywhere(&api, &stream, &hook, "backfill.cancelled", &job_id).await;

    // Pause and teardown of the throwing pipeline; the badge list shows the open problems.
    let (status, badges) = api.call(reqwest::Method::GET, "/api/v1/events/pipelines", None).await;
    assert_eq!(status, 200, "{badges}");
    let flagged: Vec<&str> = badges["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["pipeline_id"].as_str().unwrap())
        .collect();
    assert!(flagged.contains(&dead.as_str()) && flagged.contains(&failing.as_str()), "{badges}");
    // The flaky sink recovered and its data age is under its threshold: no badge.
    let flaky_badge =
        badges["items"].as_array().unwrap().iter().find(|b| b["pipeline_id"] == flaky.as_str());
    assert!(flaky_badge.is_none(), "{badges}");
    let (status, _) =
        api.call(reqwest::Method::POST, &format!("/api/v1/beam/{dead}/teardown"), None).await;
    assert_eq!(status, 200);
    seen_everywhere(&api, &stream, &hook, "pipeline.torn_down", &dead).await;

    // The notification destination's delivery is visible.
    let (status, notifications) =
        api.call(reqwest::Method::GET, "/api/v1/notifications", None).await;
    assert_eq!(status, 200, "{notifications}");
    let delivery = &notifications["destinations"][0]["status"];
    assert!(delivery["delivered_count"].as_i64().unwrap() > 5, "{notifications}");
    assert_eq!(delivery["failures"], 0);

    // Another organization sees none of it: not listed, not streamed, not by pipeline.
    let rival = api.events(&other, "").await;
    assert_eq!(rival, Vec::<Value>::new());
    assert_eq!(*rival_stream.lock().unwrap(), Vec::<Value>::new());
    let url = format!("{}/api/v1/events?pipeline_id={dead}", api.base);
    let answer = api.client.get(url).header("x-api-key", &other).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.json::<Value>().await.unwrap()["items"], json!([]));
    drop(server);
}
