//! Repeated `kill -9` of a server under ingest load, with the count of what was acknowledged
//! against what the managed sink delivered after the last restart.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::crash::{KEY, USDC, batch, send};
use crate::process::{Server, data_dir_args, free_port, sluice};

/// Records per ingest request.
const BATCH: u64 = 500;
/// Acknowledged batches between two kills.
const BATCHES_PER_ROUND: usize = 20;
const KILLS: usize = 4;
/// Concurrent ingest clients.
const FEEDERS: u64 = 2;

/// What happened to the feeders' requests.
#[derive(Debug, Default, Clone)]
struct Tally {
    requests: usize,
    /// Cut by a kill after the connection was made.
    cut: usize,
    /// Refused while the server was down.
    down: usize,
    /// Answered with something else than 200.
    refused: Vec<String>,
}

/// A server on `dir`, with its metadata in `database_url` when given (else SQLite in `dir`).
fn start(dir: &std::path::Path, database_url: Option<&str>, port: u16) -> Server {
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(dir))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    if let Some(url) = database_url {
        command.env("SLUICE_DATABASE_URL", url);
    }
    Server::start(command, port)
}

#[tokio::test(flavor = "multi_thread")]
async fn four_sigkills_under_ingest_lose_no_acknowledged_record_and_duplicates_are_counted() {
    kill_loop(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn four_sigkills_with_metadata_in_postgres_lose_no_acknowledged_record() {
    let database_url = crate::process::fresh_postgres_database("kill_loop").await;
    kill_loop(Some(&database_url)).await;
}

/// Ingests from two clients while the server is SIGKILLed [`KILLS`] times and restarted on
/// the same data dir (and database); then every acknowledged matching record must be in the
/// sink. Prints the counts.
#[allow(
    clippy::too_many_lines,
    reason = "one scenario: ingest under repeated kills and restarts, then every acknowledged record checked"
)]
async fn kill_loop(database_url: Option<&str>) {
    let store = if database_url.is_some() { "PostgreSQL" } else { "SQLite" };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let ingest = format!("{base}/api/v1/streams/base/erc20_token_transfer/records");

    let mut server = start(dir.path(), database_url, port);
    let body = json!({
        "name": "kill-loop", "description": "at least once under kill -9",
        "delivery_guarantee": "at_least_once",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "uid": "tf-1",
                            "filter_expr": "root = this.token_address", "set_values": [USDC]}],
            "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}]
        }
    });
    let (status, created) =
        send(&client, Method::POST, &format!("{base}/api/v1/beam"), Some(body.to_string())).await;
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let (status, deployed) =
        send(&client, Method::POST, &format!("{base}/api/v1/beam/{id}/deploy"), None).await;
    assert_eq!(status, 200, "{deployed}");

    // Two feeders send numbered batches (each its own range of numbers) and retry a batch
    // until it is acknowledged; a request cut by a kill is unacknowledged (it may or may not
    // have been stored).
    let total_batches = BATCHES_PER_ROUND * (KILLS + 1);
    let acked = Arc::new(Mutex::new(Vec::<u64>::new()));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let feeders: Vec<_> = (0..FEEDERS)
        .map(|feeder| {
            let (client, ingest, acked, tally) =
                (client.clone(), ingest.clone(), acked.clone(), tally.clone());
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(240);
                let mut next = feeder * 10_000_000;
                while acked.lock().unwrap().len() < total_batches {
                    assert!(Instant::now() < deadline, "ingest made no progress");
                    let request = client
                        .post(&ingest)
                        .header("x-api-key", KEY)
                        .body(batch(next, BATCH))
                        .send()
                        .await;
                    let outcome = match request {
                        Ok(response) => Ok((response.status().as_u16(), response.text().await)),
                        Err(error) => Err(error),
                    };
                    let accepted = {
                        let mut counts = tally.lock().unwrap();
                        counts.requests += 1;
                        match outcome {
                            Ok((200, Ok(text))) => {
                                let answer: serde_json::Value =
                                    serde_json::from_str(&text).unwrap();
                                assert_eq!(answer["accepted"], BATCH, "{answer}");
                                true
                            }
                            // The answer was cut short by a kill.
                            Ok((200, Err(_))) => {
                                counts.cut += 1;
                                false
                            }
                            Ok((status, text)) => {
                                counts.refused.push(format!("{status} {text:?}"));
                                false
                            }
                            Err(error) if error.is_connect() => {
                                counts.down += 1;
                                false
                            }
                            Err(_) => {
                                counts.cut += 1;
                                false
                            }
                        }
                    };
                    if accepted {
                        acked.lock().unwrap().push(next);
                        next += BATCH;
                        continue;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect();

    // Kill whenever another round of batches was acknowledged, while the feeder keeps going.
    let deadline = Instant::now() + Duration::from_secs(240);
    for kill in 1..=KILLS {
        while acked.lock().unwrap().len() < kill * BATCHES_PER_ROUND {
            assert!(Instant::now() < deadline, "ingest made no progress before kill {kill}");
            assert!(!feeders.iter().any(|f| f.is_finished()), "a feeder stopped early");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server.child.kill().unwrap(); // SIGKILL
        server.child.wait().unwrap();
        drop(server);
        server = start(dir.path(), database_url, port);
    }
    for feeder in feeders {
        feeder.await.unwrap();
    }
    let tally = tally.lock().unwrap().clone();
    assert!(tally.refused.is_empty(), "ingest answered errors: {:?}", tally.refused);

    let acknowledged: BTreeSet<u64> =
        acked.lock().unwrap().iter().flat_map(|from| *from..from + BATCH).collect();
    let expected: BTreeSet<u64> = acknowledged.iter().copied().filter(|n| n % 3 != 0).collect();

    // Read the sink until every acknowledged matching record is there, then to its end.
    let records_url = format!("{base}/api/v1/beam/{id}/sinks/sk-1/records");
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    let mut offset = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let url = format!("{records_url}?offset={offset}&limit=10000&wait_ms=500");
        let (status, page) = send(&client, Method::GET, &url, None).await;
        assert_eq!(status, 200, "{page}");
        let records = page["records"].as_array().unwrap();
        for record in records {
            let n = record["value"]["n"].as_u64().unwrap();
            assert_ne!(n % 3, 0, "a record the filter rejects was delivered");
            *seen.entry(n).or_default() += 1;
        }
        offset = page["next_offset"].as_u64().unwrap();
        let complete = expected.iter().all(|n| seen.contains_key(n));
        if complete && records.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            break;
        }
    }
    let lost: Vec<u64> = expected.iter().copied().filter(|n| !seen.contains_key(n)).collect();
    let delivered: usize = seen.values().sum();
    let duplicates = delivered - seen.len();
    eprintln!(
        "kill -9 ({store} metadata): {KILLS} kills, {} ingest requests ({} acknowledged, {} cut by a kill, {} \
         refused while down), {} records acknowledged ({} matching the filter), {delivered} \
         delivered ({} distinct, {duplicates} duplicates), {} lost",
        tally.requests,
        acked.lock().unwrap().len(),
        tally.cut,
        tally.down,
        acknowledged.len(),
        expected.len(),
        seen.len(),
        lost.len(),
    );
    assert!(
        lost.is_empty(),
        "{} acknowledged records lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    drop(server);
}
