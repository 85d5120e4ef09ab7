//! A backfill job survives `kill -9` mid-transport: the restarted server resumes at the first
//! chunk not acknowledged and every row reaches the destination — on the embedded default, and
//! on PostgreSQL with the warehouse in the S3-compatible server `scripts/test` starts.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::crash::{KEY, USDC, batch, send};
use crate::process::{Server, data_dir_args, free_port, sluice};

/// A bucket of the S3-compatible server `scripts/test` starts (`SLUICE_TEST_S3_URL`).
struct Bucket {
    endpoint: String,
    name: String,
}

impl Bucket {
    async fn new(client: &reqwest::Client, name: &str) -> Self {
        let endpoint = std::env::var("SLUICE_TEST_S3_URL").expect(
            "SLUICE_TEST_S3_URL must name the S3-compatible server (scripts/test starts moto)",
        );
        let name = format!("{name}-{}", std::process::id());
        // moto makes a bucket on an unsigned PUT.
        let answer = client.put(format!("{endpoint}/{name}")).send().await.unwrap();
        assert!(answer.status().is_success(), "{:?}", answer.text().await);
        Self { endpoint, name }
    }

    /// The keys under `prefix`.
    async fn keys(&self, client: &reqwest::Client, prefix: &str) -> Vec<String> {
        let url = format!("{}/{}?list-type=2&prefix={prefix}", self.endpoint, self.name);
        let text = client.get(url).send().await.unwrap().text().await.unwrap();
        text.split("<Key>")
            .skip(1)
            .filter_map(|k| k.split_once("</Key>"))
            .map(|(k, _)| k.to_owned())
            .collect()
    }
}

fn start(
    dir: &std::path::Path,
    port: u16,
    database_url: Option<&str>,
    bucket: Option<&Bucket>,
) -> Server {
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(dir))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--warehouse-flush-secs", "1", "--backfill-chunk-rows", "40"])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    if let Some(bucket) = bucket {
        command
            .args(["--warehouse-url", &format!("s3://{}/wh", bucket.name)])
            .env("AWS_ENDPOINT", &bucket.endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test");
    }
    if let Some(url) = database_url {
        command.env("SLUICE_DATABASE_URL", url);
    }
    Server::start(command, port)
}

/// A webhook receiver that takes 30 ms per request and keeps every record's `n`.
async fn slow_receiver() -> (String, Arc<Mutex<Vec<u64>>>) {
    let got: Arc<Mutex<Vec<u64>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let state = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let state = state.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let items: Vec<Value> = serde_json::from_slice(&body).unwrap();
                state
                    .lock()
                    .unwrap()
                    .extend(items.iter().map(|i| i["value"]["n"].as_u64().unwrap()));
                axum::http::StatusCode::OK
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

async fn job(client: &reqwest::Client, base: &str, job_id: &str) -> Value {
    let (status, job) =
        send(client, reqwest::Method::GET, &format!("{base}/api/v1/beam/backfills/{job_id}"), None)
            .await;
    assert_eq!(status, 200, "{job}");
    job
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_transport_then_restart_delivers_every_row() {
    sigkill_mid_transport(None, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_postgres_and_s3_sigkill_mid_transport_then_restart_delivers_every_row() {
    let database = crate::process::fresh_postgres_database("backfill").await;
    sigkill_mid_transport(Some(database), true).await;
}

#[allow(
    clippy::too_many_lines,
    reason = "one scenario in the order it happens: a backfill started, the server killed mid-transport, restarted, and every row checked"
)]
async fn sigkill_mid_transport(database: Option<String>, in_s3: bool) {
    let database = database.as_deref();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let bucket = if in_s3 { Some(Bucket::new(&client, "sluice-backfill").await) } else { None };
    let mut server = start(dir.path(), port, database, bucket.as_ref());
    let base = server.base.clone();
    // 1,200 transfers; two of every three are USDC (batch()).
    let ingest = format!("{base}/api/v1/streams/base/erc20_token_transfer/records");
    for from in (0..1200).step_by(400) {
        let (status, body) =
            send(&client, reqwest::Method::POST, &ingest, Some(batch(from, 400))).await;
        assert_eq!(status, 200, "{body}");
    }
    // The archiver flushes every second: wait until the warehouse has them all.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, tables) = send(
            &client,
            reqwest::Method::GET,
            &format!("{base}/api/v1/beam/backfills/tables"),
            None,
        )
        .await;
        let rows = tables.as_array().and_then(|t| {
            t.iter()
                .find(|t| t["name"] == "base.assets.erc20_token_transfers")
                .map(|t| t["row_count"].clone())
        });
        if rows == Some(json!(1200)) {
            break;
        }
        assert!(Instant::now() < deadline, "never archived: {tables}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (hook, got) = slow_receiver().await;
    let body = json!({
        "job_name": "usdc", "table": "base.assets.erc20_token_transfers",
        "backfill_window": {"partition_key": "block_timestamp",
                            "start": "2026-11-21T00:00:00Z", "end": "2026-11-22T00:00:00Z"},
        "filter": {"column": "token_address", "values": [USDC]},
        "destinations": [{"type": "webhook", "name": "hook", "url": hook}],
    });
    let (status, created) = send(
        &client,
        reqwest::Method::POST,
        &format!("{base}/api/v1/beam/backfills"),
        Some(body.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    let job_id = created["job_id"].as_str().unwrap().to_owned();
    // Mid-transport: some chunks acknowledged, most not.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = job(&client, &base, &job_id).await;
        let (total, left) = (state["num_chunks"].as_u64(), state["chunks_left"].as_u64().unwrap());
        if state["status"] == "transporting" && total.is_some_and(|t| left < t && left > 5) {
            break;
        }
        assert!(
            Instant::now() < deadline && state["status"] != "completed",
            "never caught mid-transport: {state}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    drop(server);

    let port = free_port();
    let server = start(dir.path(), port, database, bucket.as_ref());
    let base = server.base.clone();
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = loop {
        let state = job(&client, &base, &job_id).await;
        if state["status"] == "completed" {
            break state;
        }
        assert!(Instant::now() < deadline && state["status"] == "transporting", "{state}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let expected: BTreeSet<u64> = (0..1200).filter(|n| n % 3 != 0).collect();
    assert_eq!(done["rows_staged"], expected.len());
    assert_eq!(done["num_chunks"], expected.len().div_ceil(40));
    let delivered: BTreeSet<u64> = got.lock().unwrap().iter().copied().collect();
    assert_eq!(delivered, expected, "every row, at least once");
    // `sluice backfill watch` ends at once on a completed job, with the full bar.
    let watched = sluice()
        .args(["backfill", "watch", &job_id, "--url", &base, "--api-key", KEY])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&watched.stdout);
    assert!(watched.status.success(), "{printed} {}", String::from_utf8_lossy(&watched.stderr));
    assert!(printed.contains("[####################] 20/20 chunks  100%  completed"), "{printed}");
    // Where the files were: the data dir, or the bucket (and then nothing in the data dir).
    match &bucket {
        None => assert!(dir.path().join("warehouse/base.assets.erc20_token_transfers").is_dir()),
        Some(bucket) => {
            assert!(!dir.path().join("warehouse").exists());
            let keys = bucket.keys(&client, "wh/").await;
            assert!(
                keys.contains(&"wh/base.assets.erc20_token_transfers/_manifest.json".to_owned()),
                "{keys:?}"
            );
            // The job's staged chunks go once it ended.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !bucket.keys(&client, &format!("wh/_staging/{job_id}/")).await.is_empty() {
                assert!(Instant::now() < deadline, "staged chunks stayed in the bucket");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(server.terminate());
}

/// Rows of the erc20 table, as `GET …/backfills/tables` counts them.
async fn table_rows(client: &reqwest::Client, base: &str) -> Value {
    let (status, tables) =
        send(client, reqwest::Method::GET, &format!("{base}/api/v1/beam/backfills/tables"), None)
            .await;
    assert_eq!(status, 200, "{tables}");
    tables
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "base.assets.erc20_token_transfers")
        .unwrap()["row_count"]
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn history_imports_offline_then_through_the_server_and_never_twice() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("history.ndjson");
    std::fs::write(&file, batch(0, 300)).unwrap();
    let data = data_dir_args(dir.path());
    let import = |extra: &[&str]| {
        let mut command = sluice();
        command.args(["warehouse", "import", "--table", "base.assets.erc20_token_transfers"]);
        command.args(extra).arg(&file);
        command.output().unwrap()
    };
    // Offline, on a data dir no server runs on.
    let offline: Vec<&str> = data.iter().map(String::as_str).collect();
    let out = import(&offline);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("300 lines read: 300 imported, 0 already there")
    );

    let port = free_port();
    let server = start(dir.path(), port, None, None);
    let base = server.base.clone();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    assert_eq!(table_rows(&client, &base).await, 300);
    // While the server runs, the data dir is its own.
    let out = import(&offline);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Through the server: the same file again adds nothing, a longer one adds the rest.
    std::fs::write(&file, batch(0, 500) + "{\"not\": \"a record\"}\n").unwrap();
    let out = import(&["--url", &base, "--api-key", KEY]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("501 lines read: 200 imported, 300 already there, 1 rejected"),
        "{printed}"
    );
    assert!(!out.status.success(), "a rejected line is an error");
    assert_eq!(table_rows(&client, &base).await, 500);
    assert!(server.terminate());

    // The warehouse's own parquet files import into another data dir (parquet is told by its
    // first bytes, whatever the file is called).
    let other = tempfile::tempdir().unwrap();
    let mut imported = 0;
    for day in std::fs::read_dir(dir.path().join("warehouse/base.assets.erc20_token_transfers"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|d| d.path().is_dir())
    {
        for part in std::fs::read_dir(day.path()).unwrap().filter_map(Result::ok) {
            let copy = other.path().join(format!("history-{imported}.data"));
            std::fs::copy(part.path(), &copy).unwrap();
            let out = sluice()
                .args(["warehouse", "import", "--table", "base.assets.erc20_token_transfers"])
                .args(data_dir_args(other.path()))
                .arg(&copy)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let printed = String::from_utf8_lossy(&out.stdout);
            let count: u64 = printed
                .split(" imported")
                .next()
                .unwrap()
                .rsplit(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            imported += count;
        }
    }
    assert_eq!(imported, 500, "every row of the parquet files");
}
