//! `kill -9` of a serving process mid-stream loses nothing on an `at_least_once` pipeline.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::process::{Server, data_dir_args, free_port, sluice};

pub const KEY: &str = "slk_crashtest00000000000000000000000000000000";
pub const USDC: &str = "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913";

/// Which stream log a server runs on: `None` for the embedded one, or `(bus URL, topic
/// prefix)`.
type Bus = Option<(String, String)>;

fn start(dir: &std::path::Path, port: u16, bus: &Bus) -> Server {
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(dir))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    if let Some((url, prefix)) = bus {
        command.args(["--bus", url, "--bus-topic-prefix", prefix]);
    }
    Server::start(command, port)
}

/// The Kafka-API broker `scripts/test` starts, under a topic prefix of this test's own.
fn kafka_bus() -> Bus {
    let url = std::env::var("SLUICE_TEST_KAFKA_URL")
        .expect("SLUICE_TEST_KAFKA_URL must name a Kafka-API broker; run scripts/test");
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    Some((url, format!("crash{nanos:x}.")))
}

pub async fn send(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<String>,
) -> (u16, Value) {
    let mut request = client.request(method, url).header("x-api-key", KEY);
    if let Some(body) = body {
        request = request.body(body);
    }
    match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        }
        // The server may die mid-request; that request was not acknowledged.
        Err(_) => (0, Value::Null),
    }
}

pub fn batch(from: u64, count: u64) -> String {
    (from..from + count)
        .map(|n| {
            json!({
                "n": n,
                "block_number": 5000 + n / 10,
                "block_timestamp": "2026-11-21T12:00:00Z",
                "transaction_hash": format!("0x{n:064x}"),
                "log_index": n % 10,
                "token_address": if n % 3 == 0 { "0x1111111111111111111111111111111111111111" } else { USDC },
                "from_address": "0x2222222222222222222222222222222222222222",
                "to_address": "0x3333333333333333333333333333333333333333",
            })
            .to_string()
                + "\n"
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_stream_loses_no_acknowledged_matching_record() {
    sigkill_mid_stream(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_kafka_sigkill_mid_stream_loses_no_acknowledged_matching_record() {
    sigkill_mid_stream(kafka_bus()).await;
}

async fn sigkill_mid_stream(bus: Bus) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let ingest = format!("{base}/api/v1/streams/base/erc20_token_transfer/records");

    let mut server = start(dir.path(), port, &bus);
    let body = json!({
        "name": "crash", "description": "at least once",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "uid": "tf-1", "filter_expr": "root = this.token_address", "set_values": [USDC]}],
            "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}]
        }
    });
    let (status, created) = send(
        &client,
        reqwest::Method::POST,
        &format!("{base}/api/v1/beam"),
        Some(body.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let (status, deployed) =
        send(&client, reqwest::Method::POST, &format!("{base}/api/v1/beam/{id}/deploy"), None)
            .await;
    assert_eq!(status, 200, "{deployed}");

    // Feed batches from a task while the server is killed underneath it; remember every
    // batch the server acknowledged.
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(u64, u64)>::new()));
    let feeder = {
        let (client, ingest, acked) = (client.clone(), ingest.clone(), acked.clone());
        tokio::spawn(async move {
            let mut next = 0u64;
            for _ in 0..400 {
                let (status, _) =
                    send(&client, reqwest::Method::POST, &ingest, Some(batch(next, 50))).await;
                if status == 200 {
                    acked.lock().unwrap().push((next, 50));
                    next += 50;
                } else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if next >= 6000 {
                    break;
                }
            }
        })
    };
    // Kill once some batches went through, while more are flowing.
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().len() < 20 {
        assert!(Instant::now() < deadline, "ingest made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    drop(server);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let server = start(dir.path(), port, &bus);
    feeder.await.unwrap();

    let expected: BTreeSet<u64> = acked
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(from, count)| *from..from + count)
        .filter(|n| n % 3 != 0)
        .collect();
    assert!(expected.len() > 500, "too little was acknowledged to prove anything");
    let records_url = format!("{base}/api/v1/beam/{id}/sinks/sk-1/records");
    let mut delivered = BTreeSet::new();
    let mut offset = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !expected.is_subset(&delivered) {
        assert!(
            Instant::now() < deadline,
            "missing after restart: {:?}",
            expected.difference(&delivered).take(10).collect::<Vec<_>>()
        );
        let url = format!("{records_url}?offset={offset}&limit=10000&wait_ms=500");
        let (status, page) = send(&client, reqwest::Method::GET, &url, None).await;
        assert_eq!(status, 200, "{page}");
        for record in page["records"].as_array().unwrap() {
            let n = record["value"]["n"].as_u64().unwrap();
            assert_ne!(n % 3, 0, "a non-matching record was delivered");
            delivered.insert(n);
        }
        offset = page["next_offset"].as_u64().unwrap();
    }
    drop(server);
}
