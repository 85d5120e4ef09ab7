//! An RPC endpoint that rate-limits, fails, drops connections and caps `eth_getLogs`
//! ranges is survived: a small HTTP proxy in front of the real Anvil injects the faults. The
//! same proxy plays a node whose logs lack `blockTimestamp`, and counts the headers read.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use sluice_chains::Ingester;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::anvil::{
    ALICE, Anvil, BOB, address, config, positions, records, stream_log, text, uint,
};
use crate::ingest::ingest_until;

/// What the proxy does besides forwarding.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Of every 7 requests: one 429 (Retry-After 0), one 503, one connection closed without
    /// an answer; an `eth_getLogs` over more than 3 blocks is refused as providers do ("query
    /// returned more than 10000 results").
    Faults,
    /// Answers as a node that sends logs without `blockTimestamp` (older Geth, some
    /// providers).
    NoLogTimes,
    /// Forwards only (and counts).
    Forward,
}

/// What the proxy saw: requests, and `eth_getBlockByNumber` calls.
#[derive(Default)]
struct Seen {
    requests: AtomicU64,
    block_reads: AtomicU64,
}

/// Starts the proxy; returns its URL.
async fn proxy(upstream: String, mode: Mode) -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Seen::default());
    let counts = seen.clone();
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let (client, upstream, counts) = (client.clone(), upstream.clone(), counts.clone());
            tokio::spawn(async move {
                let _ = serve(socket, client, upstream, mode, counts).await;
            });
        }
    });
    (url, seen)
}

async fn serve(
    mut socket: TcpStream,
    client: reqwest::Client,
    upstream: String,
    mode: Mode,
    seen: Arc<Seen>,
) -> std::io::Result<()> {
    loop {
        let Some(body) = read_request(&mut socket).await? else { return Ok(()) };
        let n = seen.requests.fetch_add(1, Ordering::Relaxed);
        let calls = serde_json::from_slice::<Value>(&body).unwrap_or_default();
        let block_reads = calls.as_array().map_or(0, |calls| {
            calls.iter().filter(|c| c["method"] == "eth_getBlockByNumber").count()
        });
        seen.block_reads.fetch_add(block_reads as u64, Ordering::Relaxed);
        let faults = mode == Mode::Faults;
        let (status, extra, answer) = match n % 7 {
            1 if faults => (429, "Retry-After: 0\r\n", "rate limited".to_owned()),
            3 if faults => (503, "", "unavailable".to_owned()),
            5 if faults => return Ok(()),
            _ => match too_wide(&body).filter(|_| faults) {
                Some(id) => (200, "", json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32005, "message": "query returned more than 10000 results"}}).to_string()),
                None => {
                    let response = client.post(&upstream).header("content-type", "application/json").body(body).send().await;
                    match response {
                        Ok(response) => {
                            let text = response.text().await.unwrap_or_default();
                            let text = if mode == Mode::NoLogTimes {
                                let mut answer: Value = serde_json::from_str(&text).unwrap();
                                strip_block_times(&mut answer);
                                answer.to_string()
                            } else {
                                text
                            };
                            (200, "", text)
                        }
                        Err(_) => (502, "", "upstream".to_owned()),
                    }
                }
            },
        };
        let head = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n",
            answer.len()
        );
        socket.write_all(head.as_bytes()).await?;
        socket.write_all(answer.as_bytes()).await?;
    }
}

fn strip_block_times(value: &mut Value) {
    match value {
        Value::Object(object) => {
            object.remove("blockTimestamp");
            object.values_mut().for_each(strip_block_times);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_block_times),
        _ => {}
    }
}

/// The id of a lone `eth_getLogs` call over more than 3 blocks (wrapped in a batch answer
/// when the request was a batch).
fn too_wide(body: &[u8]) -> Option<Value> {
    let request: Value = serde_json::from_slice(body).ok()?;
    let call = match &request {
        Value::Array(calls) if calls.len() == 1 => &calls[0],
        _ => return None,
    };
    if call["method"] != "eth_getLogs" {
        return None;
    }
    let number = |field: &str| {
        u64::from_str_radix(call["params"][0][field].as_str()?.trim_start_matches("0x"), 16).ok()
    };
    let span = number("toBlock")? - number("fromBlock")? + 1;
    (span > 3).then(|| call["id"].clone())
}

async fn read_request(socket: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let header_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let read = socket.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buffer.len() < header_end + length {
        let read = socket.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    Ok(Some(buffer[header_end..header_end + length].to_vec()))
}

#[tokio::test]
async fn an_endpoint_that_errors_rate_limits_and_caps_ranges_is_survived() {
    let anvil = Anvil::start().await;
    let usdc = anvil.deploy("TestToken", vec![text("USD Coin"), text("USDC"), uint(6)]).await;
    let mut hashes = Vec::new();
    for i in 0..15u128 {
        let receipt = anvil
            .invoke(ALICE, &usdc, "mint(address,uint256)", vec![address(BOB), uint(i + 1)])
            .await;
        hashes.push(receipt["transactionHash"].clone());
    }
    anvil.mine(2).await;
    let head = anvil.head().await;
    let (proxy, seen) = proxy(anvil.url.clone(), Mode::Faults).await;
    let dir = tempfile::tempdir().unwrap();
    let log = stream_log(dir.path(), "base").await;
    let mut config = config(&proxy, 2);
    config.rpc.base_backoff = std::time::Duration::from_millis(5);
    let status = Ingester::status_for(&config);
    let mut ingester = Ingester::new(config, positions(&log), status.clone()).unwrap();
    let snapshot = ingest_until(&mut ingester, &status, head - 2).await;
    assert!(snapshot.rpc_errors >= 3, "faults were injected and counted: {snapshot:?}");
    assert!(seen.requests.load(Ordering::Relaxed) > 10);

    let transfers = records(&log, "base.erc20_token_transfer").await;
    assert_eq!(transfers.len(), 15, "every mint once");
    for hash in &hashes {
        let one: Vec<&Value> =
            transfers.iter().filter(|r| &r["transaction_hash"] == hash).collect();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0]["token_symbol"], "USDC", "metadata read through the faults");
    }
}

/// Blocks the finality rule already covers are read sparsely: a header only for a range's
/// ends and for blocks whose logs lack `blockTimestamp`. Against a node that sends the times
/// and one that does not, the records are the same and their times and hashes are the
/// blocks' own; with the times, far fewer headers are read than there are blocks.
#[tokio::test]
async fn final_blocks_are_timed_from_their_logs_or_else_their_headers() {
    let anvil = Anvil::start().await;
    let usdc = anvil.deploy("TestToken", vec![text("USD Coin"), text("USDC"), uint(6)]).await;
    for i in 0..6u128 {
        anvil.invoke(ALICE, &usdc, "mint(address,uint256)", vec![address(BOB), uint(i + 1)]).await;
        anvil.mine(3).await;
    }
    let head = anvil.head().await;
    let mut runs = Vec::new();
    for mode in [Mode::Forward, Mode::NoLogTimes] {
        let (url, seen) = proxy(anvil.url.clone(), mode).await;
        let dir = tempfile::tempdir().unwrap();
        let log = stream_log(dir.path(), "base").await;
        let mut config = config(&url, 2);
        // `log` and `decoded_log` would read every block with logs whole (for the senders).
        config.entities = vec![("erc20_token_transfer".to_owned(), true)];
        let status = Ingester::status_for(&config);
        let mut ingester = Ingester::new(config, positions(&log), status.clone()).unwrap();
        ingest_until(&mut ingester, &status, head - 2).await;
        let mut transfers = records(&log, "base.erc20_token_transfer").await;
        transfers.sort_by_key(|r| r["block_number"].as_u64());
        runs.push((transfers, seen.block_reads.load(Ordering::Relaxed)));
    }
    let ((with_times, forward_reads), (without_times, stripped_reads)) = (&runs[0], &runs[1]);
    assert_eq!(with_times.len(), 6, "six mints");
    assert_eq!(with_times, without_times);
    for record in with_times {
        let number = format!("0x{:x}", record["block_number"].as_u64().unwrap());
        let header = anvil.call("eth_getBlockByNumber", json!([number, false])).await;
        let time =
            u64::from_str_radix(header["timestamp"].as_str().unwrap().trim_start_matches("0x"), 16)
                .unwrap();
        let time = chrono::DateTime::from_timestamp(i64::try_from(time).unwrap(), 0).unwrap();
        assert_eq!(
            record["block_timestamp"],
            time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
        assert_eq!(record["block_hash"], header["hash"]);
    }
    assert!(
        *forward_reads < head / 2,
        "{forward_reads} headers read for {head} blocks with the logs' times"
    );
    assert!(*stripped_reads >= forward_reads + 6, "each block with logs read by its header");
}
