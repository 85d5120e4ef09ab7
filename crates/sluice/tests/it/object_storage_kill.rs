//! `kill -9` of a server whose pipeline writes files to object storage (the S3-compatible
//! server `scripts/test` starts), under a steady feed: afterwards every acknowledged
//! matching record is in exactly one object — none lost, none in a second object that a
//! retry made.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use sluice_backfill::storage::Storage;

use crate::crash::{KEY, USDC, batch, send};
use crate::process::{Server, data_dir_args, free_port, sluice};

const KILLS: usize = 3;
const BATCH: u64 = 300;

fn start(dir: &std::path::Path, port: u16) -> Server {
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(dir))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    Server::start(command, port)
}

/// Every record number in the objects under `prefix`, with how many objects hold it.
fn numbers_in(storage: &dyn Storage, prefix: &str) -> (BTreeMap<u64, usize>, usize) {
    let mut seen = BTreeMap::new();
    let keys = storage.list(prefix).unwrap();
    for key in &keys {
        let bytes = storage.get(key).unwrap().unwrap();
        let mut text = String::new();
        flate2::read::GzDecoder::new(&bytes[..]).read_to_string(&mut text).unwrap();
        for line in text.lines() {
            let record: Value = serde_json::from_str(line).unwrap();
            *seen.entry(record["n"].as_u64().unwrap()).or_default() += 1;
        }
    }
    (seen, keys.len())
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkills_under_a_feed_leave_every_acknowledged_record_in_exactly_one_object() {
    let storage = tokio::task::spawn_blocking(|| sluice_backfill::storage::testing::new_bucket(""))
        .await
        .unwrap();
    let bucket =
        storage.location("").trim_start_matches("s3://").split('/').next().unwrap().to_owned();
    let endpoint = std::env::var("SLUICE_TEST_S3_URL").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let mut server = start(dir.path(), port);
    for (name, value) in [("S3_ID", "test"), ("S3_KEY", "test")] {
        let url = format!("{base}/api/v1/beam/secrets/{name}");
        let (status, body) =
            send(&client, Method::PUT, &url, Some(json!({"value": value}).to_string())).await;
        assert_eq!(status, 200, "{body}");
    }
    let body = json!({
        "name": "to-the-lake", "description": "files under kill -9",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "uid": "tf-1",
                            "filter_expr": "root = this.token_address", "set_values": [USDC]}],
            "sinks": [{"type": "object_storage", "uid": "sk-1", "name": "lake", "bucket": bucket,
                       "prefix": "kill", "endpoint": endpoint, "format": "jsonl_gzip",
                       "access_key_id_secret": "S3_ID", "secret_access_key_secret": "S3_KEY",
                       "max_rows": 250, "max_seconds": 1}]
        }
    });
    let (status, created) =
        send(&client, Method::POST, &format!("{base}/api/v1/beam"), Some(body.to_string())).await;
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let (status, deployed) =
        send(&client, Method::POST, &format!("{base}/api/v1/beam/{id}/deploy"), None).await;
    assert_eq!(status, 200, "{deployed}");

    // A feed of numbered batches; each request its own numbers (a cut one is not sent
    // again), so every number is in the source at most once.
    let ingest = format!("{base}/api/v1/streams/base/erc20_token_transfer/records");
    let mut acknowledged = Vec::new();
    let mut next = 0;
    for kill in 0..=KILLS {
        let until = Instant::now() + Duration::from_millis(2500);
        while Instant::now() < until {
            let (status, _) = send(&client, Method::POST, &ingest, Some(batch(next, BATCH))).await;
            if status == 200 {
                acknowledged.extend(next..next + BATCH);
            }
            next += BATCH;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        if kill < KILLS {
            server.child.kill().unwrap(); // SIGKILL
            server.child.wait().unwrap();
            drop(server);
            server = start(dir.path(), port);
        }
    }
    let expected: Vec<u64> = acknowledged.iter().copied().filter(|n| n % 3 != 0).collect();
    let storage = std::sync::Arc::new(storage);
    let deadline = Instant::now() + Duration::from_secs(120);
    let (seen, objects) = loop {
        let reading = storage.clone();
        let (seen, objects) =
            tokio::task::spawn_blocking(move || numbers_in(&*reading, "kill")).await.unwrap();
        if expected.iter().all(|n| seen.contains_key(n)) || Instant::now() > deadline {
            break (seen, objects);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let lost = expected.iter().filter(|n| !seen.contains_key(n)).count();
    let doubled = seen.values().filter(|count| **count > 1).count();
    println!(
        "object storage under {KILLS} kill -9: {} acknowledged matching, {lost} lost, {doubled} in two objects, {objects} objects",
        expected.len()
    );
    assert_eq!(lost, 0, "acknowledged records missing from the objects");
    assert_eq!(doubled, 0, "records written into a second object");
    assert!(seen.keys().all(|n| n % 3 != 0), "a record the filter rejects was written");
    drop(server);
}
