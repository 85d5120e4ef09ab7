//! A pipeline on a server whose metadata (pipelines, filter values, deployment state) lives
//! in PostgreSQL: deploy, live filter change, and a restart that runs it again.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::crash::{KEY, USDC, batch, send};
use crate::process::{Server, data_dir_args, free_port, sluice};

fn start(dir: &std::path::Path, database_url: &str, port: u16) -> Server {
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(dir))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_DATABASE_URL", database_url)
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    Server::start(command, port)
}

/// Transfer numbers in the sink, sorted, waiting until at least `count` are there.
async fn delivered(client: &reqwest::Client, url: &str, count: usize) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, page) =
            send(client, reqwest::Method::GET, &format!("{url}?limit=10000&wait_ms=200"), None)
                .await;
        assert_eq!(status, 200, "{page}");
        let numbers: Vec<u64> = page["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["value"]["n"].as_u64().unwrap())
            .collect();
        if numbers.len() >= count || Instant::now() > deadline {
            // Order holds per key (per source partition), not across keys.
            let mut numbers = numbers;
            numbers.sort_unstable();
            return numbers;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pipelines_run_on_postgres_follow_filter_changes_and_survive_a_restart() {
    let database_url = crate::process::fresh_postgres_database("runtime").await;

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let server = start(dir.path(), &database_url, port);
    let body = json!({
        "name": "pg", "description": "on postgres",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "uid": "tf-1", "filter_expr": "root = this.token_address"}],
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
    let beam = format!("{base}/api/v1/beam/{id}");
    assert_eq!(send(&client, reqwest::Method::POST, &format!("{beam}/deploy"), None).await.0, 200);
    let values = json!({"values": [USDC.to_uppercase().replace("0X", "0x")]}).to_string();
    let (status, added) = send(
        &client,
        reqwest::Method::POST,
        &format!("{beam}/transforms/tf-1/filter-values"),
        Some(values),
    )
    .await;
    assert_eq!((status, added["added"].clone()), (200, Value::from(1)));

    let ingest = format!("{base}/api/v1/streams/base/erc20_token_transfer/records");
    assert_eq!(send(&client, reqwest::Method::POST, &ingest, Some(batch(0, 30))).await.0, 200);
    let sink = format!("{beam}/sinks/sk-1/records");
    let expected: Vec<u64> = (0..30).filter(|n| n % 3 != 0).collect();
    assert_eq!(delivered(&client, &sink, expected.len()).await, expected);

    assert!(server.terminate());
    let _server = start(dir.path(), &database_url, port);
    assert_eq!(send(&client, reqwest::Method::POST, &ingest, Some(batch(30, 30))).await.0, 200);
    let expected: Vec<u64> = (0..60).filter(|n| n % 3 != 0).collect();
    assert_eq!(delivered(&client, &sink, expected.len()).await, expected);
}
