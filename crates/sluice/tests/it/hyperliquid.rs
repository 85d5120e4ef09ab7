//! `sluice serve` with a Hyperliquid chain read from a node's output directory, written by
//! the test in the layout the `hyperliquid-dex/node` README documents while Sluice reads it:
//! lines appended in small pieces (partial lines), an hourly rotation and the next
//! `replica_cmds` file, the `--batch-by-block` and the plain layouts, `kill -9` and restart
//! (every block's events once), set-filter pipelines on one user and on one coin, and the
//! start error of a directory that does not exist.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::crash::{KEY, send};
use crate::process::{Server, data_dir_args, free_port, sluice};

/// Blocks up to this one go to the first hour's files (and the first `replica_cmds` file).
const ROTATE: u64 = 30;
const COINS: [&str; 3] = ["BTC", "ETH", "HYPE"];
const BASE_MS: i64 = 1_748_772_000_000; // 2025-06-01T10:00:00Z

fn user(i: u64) -> String {
    format!("0x{:040x}", 0xa000 + i % 10)
}

fn time_text(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap().format("%Y-%m-%dT%H:%M:%S%.3f").to_string()
}

/// Which files the node writes.
#[derive(Clone, Copy)]
enum Layout {
    /// `--write-fills --write-order-statuses --write-misc-events --batch-by-block` for
    /// fills and misc events, orders one per line; no trade files (trades come from fills).
    A,
    /// fills, trades and misc events one per line; orders by block.
    B,
}

/// Writes a node data directory as `hl-node` does.
struct Node {
    root: PathBuf,
    layout: Layout,
}

struct Trade {
    tid: u64,
    coin: &'static str,
    buyer: String,
    seller: String,
    oids: (u64, u64),
}

fn trades(b: u64) -> Vec<Trade> {
    (0..2)
        .map(|t| Trade {
            tid: b * 10 + t,
            coin: COINS[((b + t) % 3) as usize],
            buyer: user(b + t),
            seller: user(b + t + 5),
            oids: (b * 100 + t * 2, b * 100 + t * 2 + 1),
        })
        .collect()
}

fn block_ms(b: u64) -> i64 {
    BASE_MS + b as i64 * 100
}

fn fills(b: u64) -> Vec<Value> {
    let mut out = Vec::new();
    for trade in trades(b) {
        for (side, who, oid) in
            [("B", &trade.buyer, trade.oids.0), ("A", &trade.seller, trade.oids.1)]
        {
            out.push(json!([who, {
                "coin": trade.coin, "px": "104000.50", "sz": "0.0100", "side": side,
                "time": block_ms(b), "startPosition": "0.0",
                "dir": if side == "B" { "Open Long" } else { "Open Short" },
                "closedPnl": "0.0", "hash": format!("0x{:064x}", trade.tid), "oid": oid,
                "crossed": side == "A", "fee": "0.46", "tid": trade.tid, "feeToken": "USDC",
                "twapId": null
            }]));
        }
    }
    out
}

fn node_trades(b: u64) -> Vec<Value> {
    trades(b)
        .into_iter()
        .map(|t| {
            json!({
                "coin": t.coin, "side": "A", "time": time_text(block_ms(b)), "px": "104000.50",
                "sz": "0.0100", "hash": format!("0x{:064x}", t.tid), "trade_dir_override": "Na",
                "side_info": [
                    {"user": t.buyer, "start_pos": "0.0", "oid": t.oids.0, "twap_id": null, "cloid": null},
                    {"user": t.seller, "start_pos": "0.0", "oid": t.oids.1, "twap_id": null, "cloid": null}
                ]
            })
        })
        .collect()
}

fn order_oid(b: u64, k: u64) -> u64 {
    1_000_000 + b * 10 + k
}

fn orders(b: u64) -> Vec<Value> {
    (0..3)
        .map(|k| {
            json!({
                "time": time_text(block_ms(b)), "user": user(b + k),
                "hash": format!("0x{:064x}", order_oid(b, k)), "builder": null, "status": "open",
                "order": {
                    "coin": COINS[((b + k) % 3) as usize], "side": "B", "limitPx": "25.381",
                    "sz": "257.0", "oid": order_oid(b, k), "timestamp": block_ms(b),
                    "triggerCondition": "N/A", "isTrigger": false, "triggerPx": "0.0",
                    "children": [], "isPositionTpsl": false, "reduceOnly": false,
                    "orderType": "Limit", "origSz": "257.0", "tif": "Gtc", "cloid": null
                }
            })
        })
        .collect()
}

fn misc(b: u64) -> Vec<Value> {
    vec![json!({
        "time": time_text(block_ms(b)), "hash": format!("0x{:064x}", 0xbeef_0000 + b),
        "inner": {"CDeposit": {"user": user(b), "amount": "10.5"}}
    })]
}

fn replica(b: u64) -> Value {
    json!({"abci_block": {
        "time": time_text(block_ms(b)), "round": 5_000 + b, "parent_round": 4_999 + b,
        "proposer": user(b), "hardfork": {"version": 1, "round": 1},
        "signed_action_bundles": [[format!("0x{b:064x}"), {
            "signed_actions": [{"action": {"type": "order"}, "nonce": b}, {"action": {"type": "cancel"}, "nonce": b}],
            "broadcaster": user(b), "broadcaster_nonce": b
        }]]
    }, "resps": {"Full": []}})
}

impl Node {
    fn new(root: &Path, layout: Layout) -> Self {
        std::fs::create_dir_all(root).unwrap();
        Self { root: root.to_owned(), layout }
    }

    fn hour(b: u64) -> &'static str {
        if b <= ROTATE { "20250601/10" } else { "20250601/11" }
    }

    /// Appends `text` to `rel` in three pieces, each flushed, with a pause: Sluice sees
    /// partial lines.
    fn append(&self, rel: &str, text: &str) {
        let path = self.root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        let bytes = text.as_bytes();
        let cuts = [0, bytes.len() / 3, bytes.len() * 2 / 3, bytes.len()];
        for pair in cuts.windows(2) {
            file.write_all(&bytes[pair[0]..pair[1]]).unwrap();
            file.flush().unwrap();
            std::thread::sleep(Duration::from_micros(300));
        }
    }

    fn by_block(b: u64, events: Vec<Value>) -> String {
        let line = json!({
            "local_time": time_text(block_ms(b) + 7), "block_time": time_text(block_ms(b)),
            "block_number": b, "events": events
        });
        format!("{line}\n")
    }

    fn per_line(events: Vec<Value>) -> String {
        events.iter().map(|e| format!("{e}\n")).collect()
    }

    /// Writes every file's lines of block `b`.
    fn block(&self, b: u64) {
        let hour = Self::hour(b);
        let replica_file = if b <= ROTATE { 0 } else { ROTATE };
        self.append(
            &format!("replica_cmds/2025-06-01T09:59:00Z/20250601/{replica_file}"),
            &format!("{}\n", replica(b)),
        );
        match self.layout {
            Layout::A => {
                self.append(
                    &format!("node_fills_by_block/hourly/{hour}"),
                    &Self::by_block(b, fills(b)),
                );
                self.append(
                    &format!("node_order_statuses/hourly/{hour}"),
                    &Self::per_line(orders(b)),
                );
                self.append(
                    &format!("misc_events_by_block/hourly/{hour}"),
                    &Self::by_block(b, misc(b)),
                );
            }
            Layout::B => {
                self.append(&format!("node_fills/hourly/{hour}"), &Self::per_line(fills(b)));
                self.append(&format!("node_trades/hourly/{hour}"), &Self::per_line(node_trades(b)));
                self.append(
                    &format!("node_order_statuses_by_block/hourly/{hour}"),
                    &Self::by_block(b, orders(b)),
                );
                self.append(&format!("misc_events/hourly/{hour}"), &Self::per_line(misc(b)));
            }
        }
    }
}

fn serve_command(dir: &Path, port: u16, node: &Path) -> Command {
    let config = dir.join("sluice.toml");
    let table = format!(
        "[[chains]]\nname = \"hyperliquid\"\ndata_dir = \"{}\"\nstart = \"earliest\"\npoll_interval_ms = 5\n",
        node.display()
    );
    std::fs::write(&config, table).unwrap();
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(&dir.join("data")))
        .args(["--config", config.to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    command
}

async fn status(client: &reqwest::Client, base: &str) -> Value {
    let (code, body) =
        send(client, reqwest::Method::GET, &format!("{base}/api/v1/chains"), None).await;
    if code != 200 {
        return Value::Null;
    }
    body["items"][0].clone()
}

/// Waits until the ingester has block `b` and nothing of the files is left unread.
async fn wait_caught_up(client: &reqwest::Client, base: &str, b: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = status(client, base).await;
        if status["ingested"].as_u64() >= Some(b) && status["lag_bytes"] == 0 {
            return status;
        }
        assert!(Instant::now() < deadline, "ingest did not reach block {b}: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_ingested(client: &reqwest::Client, base: &str, b: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while status(client, base).await["ingested"].as_u64() < Some(b) {
        assert!(Instant::now() < deadline, "ingest did not reach block {b}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The stopped server's log.
fn open_log(dir: &Path) -> Arc<dyn sluice_bus::StreamLog> {
    let log = sluice_bus::EmbeddedLog::open(
        &dir.join("data/log.redb"),
        Arc::new(sluice_core::clock::SystemClock),
    )
    .unwrap();
    Arc::new(log)
}

/// Every record of `hyperliquid.<entity>` in `log`, by key (a key twice fails the test).
async fn stored(log: &Arc<dyn sluice_bus::StreamLog>, entity: &str) -> BTreeMap<String, Value> {
    let topic = format!("hyperliquid.{entity}");
    let mut out = BTreeMap::new();
    for (partition, range) in (0u32..).zip(log.offsets(&topic).await.unwrap()) {
        for record in log.read(&topic, partition, range.start, 1_000_000).await.unwrap() {
            let key = String::from_utf8(record.key.to_vec()).unwrap();
            let value: Value = serde_json::from_slice(&record.value).unwrap();
            if let Some(old) = out.insert(key.clone(), value) {
                panic!("{entity} record {key} twice: {old}");
            }
        }
    }
    out
}

fn expected_keys(
    entity: &str,
    blocks: std::ops::RangeInclusive<u64>,
    layout: Layout,
) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for b in blocks {
        match entity {
            "block" => {
                keys.insert(b.to_string());
            }
            "fill" => keys.extend(
                trades(b).iter().flat_map(|t| [format!("{}:B", t.tid), format!("{}:A", t.tid)]),
            ),
            "trade" => keys.extend(trades(b).iter().map(|t| match layout {
                Layout::A => t.tid.to_string(),
                Layout::B => {
                    sluice_chains::hyperliquid::records::derived_tid(t.oids.0, t.oids.1).to_string()
                }
            })),
            "order" => {
                keys.extend((0..3).map(|k| format!("{}:open:{}", order_oid(b, k), block_ms(b))))
            }
            "misc_event" => {
                keys.insert(format!(
                    "{}:0x{:064x}:CDeposit:{}",
                    block_ms(b),
                    0xbeef_0000 + b,
                    user(b)
                ));
            }
            _ => unreachable!(),
        }
    }
    keys
}

async fn check_every_stream(
    dir: &Path,
    last: u64,
    layout: Layout,
) -> BTreeMap<&'static str, BTreeMap<String, Value>> {
    let mut all = BTreeMap::new();
    let log = open_log(dir);
    for entity in ["block", "fill", "trade", "order", "misc_event"] {
        let records = stored(&log, entity).await;
        let keys: BTreeSet<String> = records.keys().cloned().collect();
        assert_eq!(
            keys,
            expected_keys(entity, 1..=last, layout),
            "{entity}: every block's records once"
        );
        all.insert(entity, records);
    }
    all
}

#[tokio::test(flavor = "multi_thread")]
async fn node_files_written_in_pieces_become_exact_records_across_the_hourly_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::new(&dir.path().join("hl/data"), Layout::A);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let server = Server::start(serve_command(dir.path(), port, &node.root), port);
    let last = 2 * ROTATE;
    for b in 1..=last {
        node.block(b);
        if b == 12 {
            // A line the node never writes: rejected, counted and named, the rest goes on.
            node.append("node_order_statuses/hourly/20250601/10", "{\"time\": \"yesterday\"}\n");
        }
    }
    let at = wait_caught_up(&client, &base, last).await;
    assert_eq!(at["chain"], "hyperliquid");
    assert_eq!(at["rejected"], 1, "{at}");
    let error = at["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("node_order_statuses/hourly/20250601/10 at byte"), "{at}");
    let metrics =
        client.get(format!("{base}/metrics")).header("x-api-key", KEY).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(metrics.contains("sluice_chain_rejected_total{chain=\"hyperliquid\"} 1"), "{metrics}");
    assert!(metrics.contains("sluice_chain_lag_bytes{chain=\"hyperliquid\"} 0"), "{metrics}");
    assert!(server.terminate());

    let all = check_every_stream(dir.path(), last, Layout::A).await;
    // Field by field: a fill of the second hour, as the node wrote it plus its user.
    let fill = &all["fill"]["400:A"];
    let (user_and_fill, b) = (&fills(40)[1], 40);
    assert_eq!(fill["block_number"], b);
    assert_eq!(fill["node_file"], "node_fills_by_block/hourly/20250601/11");
    let mut expected = user_and_fill[1].clone();
    expected["user"] = user_and_fill[0].clone();
    assert_eq!(fill["payload"], expected);
    assert_eq!(fill["payload"]["px"], "104000.50", "decimal strings as written");
    let trade = &all["trade"]["400"]["payload"];
    assert_eq!(trade["users"], json!([user(40), user(45)]));
    assert_eq!(trade["side"], "A");
    assert_eq!(trade["buyer"]["oid"], 4000);
    assert_eq!(trade["seller"]["oid"], 4001);
    let order = &all["order"][&format!("{}:open:{}", order_oid(7, 1), block_ms(7))]["payload"];
    assert_eq!(order["time"], block_ms(7));
    assert_eq!(order["order"]["limitPx"], "25.381");
    assert_eq!(order["user"], user(8));
    let block = &all["block"]["31"];
    assert_eq!(block["node_file"], "replica_cmds/2025-06-01T09:59:00Z/20250601/30");
    assert_eq!(block["payload"]["numTxs"], 2);
    assert_eq!(block["payload"]["hash"], Value::Null);
    assert_eq!(block["payload"]["blockTime"], block_ms(31));
    assert_eq!(block["payload"]["proposer"], user(31));
    let event = &all["misc_event"].values().next().unwrap()["payload"];
    assert_eq!(event["type"], "CDeposit");
    assert_eq!(event["inner"]["CDeposit"]["amount"], "10.5");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_while_the_node_writes_then_restart_leaves_every_blocks_events_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("hl/data");
    let node = Node::new(&root, Layout::B);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let last = 150;
    let writer = std::thread::spawn(move || {
        for b in 1..=last {
            node.block(b);
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    for stop_at in [10, 45, 90] {
        let mut server = Server::start(serve_command(dir.path(), port, &root), port);
        wait_ingested(&client, &base, stop_at).await;
        server.child.kill().unwrap();
        server.child.wait().unwrap();
    }
    writer.join().unwrap();
    let server = Server::start(serve_command(dir.path(), port, &root), port);
    let at = wait_caught_up(&client, &base, last).await;
    assert_eq!(at["rejected"], 0, "{at}");
    assert!(server.terminate());
    let all = check_every_stream(dir.path(), last, Layout::B).await;
    let trade = all["trade"].values().find(|t| t["payload"]["buyer"]["oid"] == 13_200).unwrap();
    assert_eq!(trade["payload"]["users"], json!([user(132), user(137)]));
    assert_eq!(trade["payload"]["tradeDirOverride"], "Na");
    assert!(
        all["order"].values().all(|o| o["block_number"].is_u64()),
        "by-block lines name their block"
    );
}

async fn pipeline(
    client: &reqwest::Client,
    base: &str,
    entity: &str,
    expr: &str,
    value: &str,
) -> String {
    let body = json!({
        "name": format!("one {entity}"), "description": "a set filter",
        "pipeline_config": {
            "source": {"chain": "hyperliquid", "entity": entity},
            "transforms": [{"type": "redis_set_filter", "uid": "tf-1", "filter_expr": expr}],
            "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}]
        }
    });
    let url = format!("{base}/api/v1/beam");
    let (code, created) = send(client, reqwest::Method::POST, &url, Some(body.to_string())).await;
    assert_eq!(code, 200, "{created}");
    let beam = format!("{base}/api/v1/beam/{}", created["id"].as_str().unwrap());
    assert_eq!(send(client, reqwest::Method::POST, &format!("{beam}/deploy"), None).await.0, 200);
    let values = json!({"values": [value]}).to_string();
    let url = format!("{beam}/transforms/tf-1/filter-values");
    assert_eq!(send(client, reqwest::Method::POST, &url, Some(values)).await.0, 200);
    beam
}

async fn delivered(client: &reqwest::Client, beam: &str, want: usize) -> Vec<Value> {
    let sink = format!("{beam}/sinks/sk-1/records?limit=1000&wait_ms=200");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, page) = send(client, reqwest::Method::GET, &sink, None).await;
        assert_eq!(code, 200, "{page}");
        let records = page["records"].as_array().unwrap().clone();
        if records.len() >= want || Instant::now() > deadline {
            return records;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn set_filter_pipelines_on_one_user_one_coin_and_one_order_id_get_exactly_their_records() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::new(&dir.path().join("hl/data"), Layout::A);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let _server = Server::start(serve_command(dir.path(), port, &node.root), port);
    let bob = user(3);
    let by_user = pipeline(&client, &base, "fill", "root = this.payload.user", &bob).await;
    let by_coin = pipeline(&client, &base, "order", "root = this.payload.order.coin", "ETH").await;
    // An order id: the seller's fill of trade 70 (block 7) has order id 701.
    let by_oid = pipeline(&client, &base, "fill", "root = this.payload.oid", "701").await;
    let last = 40;
    for b in 1..=last {
        node.block(b);
    }
    wait_caught_up(&client, &base, last).await;
    let mut want_fills: Vec<String> = Vec::new();
    let mut want_orders: Vec<u64> = Vec::new();
    for b in 1..=last {
        for trade in trades(b) {
            if trade.buyer == bob {
                want_fills.push(format!("{}:B", trade.tid));
            }
            if trade.seller == bob {
                want_fills.push(format!("{}:A", trade.tid));
            }
        }
        want_orders.extend(
            (0..3).filter(|k| COINS[((b + k) % 3) as usize] == "ETH").map(|k| order_oid(b, k)),
        );
    }
    want_fills.sort();
    want_orders.sort_unstable();
    let fills = delivered(&client, &by_user, want_fills.len()).await;
    let mut got: Vec<String> = fills
        .iter()
        .map(|r| {
            format!(
                "{}:{}",
                r["value"]["payload"]["tid"],
                r["value"]["payload"]["side"].as_str().unwrap()
            )
        })
        .collect();
    got.sort();
    assert_eq!(got, want_fills, "exactly the user's fills");
    let orders = delivered(&client, &by_coin, want_orders.len()).await;
    let mut got: Vec<u64> =
        orders.iter().map(|r| r["value"]["payload"]["order"]["oid"].as_u64().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, want_orders, "exactly the coin's orders");
    let one = delivered(&client, &by_oid, 1).await;
    assert_eq!(one.len(), 1, "{one:?}");
    assert_eq!(one[0]["value"]["payload"]["oid"], 701);
    assert_eq!(one[0]["value"]["payload"]["side"], "A");
}

#[test]
fn a_data_directory_that_does_not_exist_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("hl/nothing-here");
    let output = sluice()
        .arg("serve")
        .args(data_dir_args(&dir.path().join("data")))
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--chain", &format!("hyperliquid=file://{}", missing.display())])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let line = stderr.lines().last().unwrap_or_default();
    assert!(line.starts_with("error: "), "{stderr}");
    assert!(line.contains(&format!("{} does not exist", missing.display())), "{stderr}");
    assert!(!dir.path().join("data").exists(), "nothing is made before the checks pass");
}
