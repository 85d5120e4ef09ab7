//! Three `sluice serve` nodes on one PostgreSQL, one Kafka-API broker and one Redis (all
//! started by `scripts/test`): lifecycle calls on any node, work spread over the nodes and
//! moved when one is killed, nothing acknowledged lost, a restarted node taking work again,
//! and a filter value added on one node filtering on all within a second.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::crash::{KEY, batch, send};
use crate::process::{Server, data_dir_args, free_port, sluice};

const SECRETS_KEY: &str = "4f2c1b0a9e8d7c6b5a49382716051f2e3d4c5b6a79881726354a5b6c7d8e9f00";

/// One node: its name, port and data directory (kept across a restart).
struct Node {
    name: String,
    port: u16,
    dir: tempfile::TempDir,
    server: Option<Server>,
}

impl Node {
    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

struct Cluster {
    database_url: String,
    /// The set store every node shares (`--sets`).
    sets: String,
    bus: String,
    prefix: String,
    nodes: Vec<Node>,
}

impl Cluster {
    /// Nodes `names` (not started) on a fresh PostgreSQL database, topic prefix and Redis
    /// key prefix of their own, all named after `label`.
    async fn new(label: &str, names: &[&str]) -> Self {
        let bus = std::env::var("SLUICE_TEST_KAFKA_URL")
            .expect("SLUICE_TEST_KAFKA_URL must name a Kafka-API broker; run scripts/test");
        let redis = std::env::var("SLUICE_TEST_REDIS_URL")
            .expect("SLUICE_TEST_REDIS_URL must name a Redis server; run scripts/test");
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        Self {
            database_url: crate::process::fresh_postgres_database(label).await,
            sets: format!("{redis}?prefix={label}{nanos:x}"),
            bus,
            prefix: format!("{label}{nanos:x}."),
            nodes: names
                .iter()
                .map(|name| Node {
                    name: (*name).to_owned(),
                    port: free_port(),
                    dir: tempfile::tempdir().unwrap(),
                    server: None,
                })
                .collect(),
        }
    }

    fn start_node(&mut self, index: usize) {
        let node = &self.nodes[index];
        let mut command = sluice();
        command
            .arg("serve")
            .args(data_dir_args(node.dir.path()))
            .args(["--listen", &format!("127.0.0.1:{}", node.port)])
            .args(["--bus", &self.bus, "--bus-topic-prefix", &self.prefix])
            .args(["--node-name", &node.name, "--node-timeout-secs", "3"])
            .args(["--sets", &self.sets])
            .env("SLUICE_DATABASE_URL", &self.database_url)
            .env("SLUICE_SECRETS_KEY", SECRETS_KEY)
            .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
        let server = Server::start(command, node.port);
        self.nodes[index].server = Some(server);
    }

    /// Fails when a node's process exited.
    fn assert_alive(&mut self) {
        for node in &mut self.nodes {
            if let Some(server) = &mut node.server
                && let Some(status) = server.child.try_wait().unwrap()
            {
                panic!("{} exited: {status}", node.name);
            }
        }
    }
}

/// The pipeline's workers as node `base` reports them: worker name → node.
async fn workers(client: &reqwest::Client, base: &str, id: &str) -> BTreeMap<String, String> {
    let url = format!("{base}/api/v1/beam/{id}/deploy/stats");
    let response = client.get(&url).header("x-api-key", KEY).send().await;
    let response = response.unwrap_or_else(|error| panic!("GET {url}: {error:?}"));
    assert_eq!(response.status(), 200, "{url}");
    let stats: Value = response.json().await.unwrap();
    stats["workers_health"]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["name"].as_str().unwrap().to_owned(), w["node"].as_str().unwrap().to_owned()))
        .collect()
}

/// Waits until `check` holds of the workers node `base` reports.
async fn wait_for_workers(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    within: Duration,
    what: &str,
    check: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, String> {
    let deadline = Instant::now() + within;
    loop {
        let seen = workers(client, base, id).await;
        if check(&seen) {
            return seen;
        }
        assert!(Instant::now() < deadline, "{what}: workers seen from {base}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads the sink from `offset` on until every number of `expected` arrived; answers what
/// arrived and the next offset.
async fn read_until(
    client: &reqwest::Client,
    records_url: &str,
    offset: u64,
    expected: &BTreeSet<u64>,
    delivered: &mut BTreeSet<u64>,
) -> u64 {
    read_until_widened(client, records_url, offset, expected, delivered, u64::MAX).await
}

/// [`read_until`], where records from number `widened_from` on match whatever their token
/// (a filter value added for the other token).
async fn read_until_widened(
    client: &reqwest::Client,
    records_url: &str,
    mut offset: u64,
    expected: &BTreeSet<u64>,
    delivered: &mut BTreeSet<u64>,
    widened_from: u64,
) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !expected.is_subset(delivered) {
        assert!(
            Instant::now() < deadline,
            "never delivered: {:?}",
            expected.difference(delivered).take(10).collect::<Vec<_>>()
        );
        let url = format!("{records_url}?offset={offset}&limit=10000&wait_ms=300");
        let (status, page) = send(client, reqwest::Method::GET, &url, None).await;
        assert_eq!(status, 200, "{page}");
        for record in page["records"].as_array().unwrap() {
            let n = record["value"]["n"].as_u64().unwrap();
            assert!(n % 3 != 0 || n >= widened_from, "a non-matching record {n} was delivered");
            delivered.insert(n);
        }
        offset = page["next_offset"].as_u64().unwrap();
    }
    offset
}

fn matching(from: u64, to: u64) -> BTreeSet<u64> {
    (from..to).filter(|n| n % 3 != 0).collect()
}

#[tokio::test(flavor = "multi_thread")]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario across three nodes in the order it happens: deploy, lifecycle calls from each node, a kill, and what each node then runs"
)]
async fn three_nodes_share_a_deployment_follow_each_others_lifecycle_calls_and_survive_a_kill() {
    let mut cluster = Cluster::new("cluster", &["node-a", "node-b", "node-c"]).await;
    for index in 0..3 {
        cluster.start_node(index);
    }
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let [a, b, c] = [0, 1, 2].map(|i| cluster.nodes[i].base());

    // Every node sees the three.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, nodes) =
            send(&client, reqwest::Method::GET, &format!("{c}/api/v1/nodes"), None).await;
        assert_eq!(status, 200, "{nodes}");
        let names: BTreeSet<&str> = nodes["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["name"].as_str().unwrap())
            .collect();
        if names == BTreeSet::from(["node-a", "node-b", "node-c"]) {
            assert_eq!(nodes["items"][0]["name"], "node-c");
            assert_eq!(nodes["items"][0]["is_self"], true);
            break;
        }
        assert!(Instant::now() < deadline, "nodes seen: {nodes}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Created and deployed on A: its four workers spread over the three nodes.
    let body = json!({
        "name": "cluster", "description": "three nodes", "pod_size": "L",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "uid": "tf-1", "filter_expr": "root = this.token_address", "set_values": [crate::crash::USDC]}],
            "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}]
        }
    });
    let (status, created) =
        send(&client, reqwest::Method::POST, &format!("{a}/api/v1/beam"), Some(body.to_string()))
            .await;
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let (status, deployed) =
        send(&client, reqwest::Method::POST, &format!("{a}/api/v1/beam/{id}/deploy"), None).await;
    assert_eq!(status, 200, "{deployed}");
    // The deploy answers once every node runs its share; B sees them within its next
    // heartbeat.
    wait_for_workers(
        &client,
        &b,
        &id,
        Duration::from_secs(5),
        "four workers on three nodes",
        |seen| seen.len() == 4 && seen.values().collect::<BTreeSet<_>>().len() == 3,
    )
    .await;

    // Records ingested on C reach the sink, read on B.
    let ingest = |base: &str| format!("{base}/api/v1/streams/base/erc20_token_transfer/records");
    let records_url = format!("{b}/api/v1/beam/{id}/sinks/sk-1/records");
    let mut delivered = BTreeSet::new();
    assert_eq!(send(&client, reqwest::Method::POST, &ingest(&c), Some(batch(0, 300))).await.0, 200);
    let mut offset = read_until(&client, &records_url, 0, &matching(0, 300), &mut delivered).await;

    // Paused on B: no node runs a worker, and nothing new is delivered.
    let (status, paused) =
        send(&client, reqwest::Method::POST, &format!("{b}/api/v1/beam/{id}/pause"), None).await;
    assert_eq!(status, 200, "{paused}");
    assert!(workers(&client, &b, &id).await.is_empty(), "the pause answers once all stopped");
    for base in [&a, &c] {
        wait_for_workers(&client, base, &id, Duration::from_secs(5), "paused", BTreeMap::is_empty)
            .await;
    }
    let (status, nodes) =
        send(&client, reqwest::Method::GET, &format!("{a}/api/v1/nodes"), None).await;
    assert_eq!(status, 200);
    for node in nodes["items"].as_array().unwrap() {
        assert_eq!(node["workers"], json!([]), "{nodes}");
    }
    assert_eq!(
        send(&client, reqwest::Method::POST, &ingest(&a), Some(batch(300, 300))).await.0,
        200
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let url = format!("{records_url}?offset={offset}&limit=10000&wait_ms=200");
    let (status, page) = send(&client, reqwest::Method::GET, &url, None).await;
    assert_eq!(status, 200);
    assert_eq!(page["records"], json!([]), "delivered while paused");

    // Resumed on C: everything from the pause on arrives.
    let (status, resumed) =
        send(&client, reqwest::Method::POST, &format!("{c}/api/v1/beam/{id}/deploy"), None).await;
    assert_eq!(status, 200, "{resumed}");
    wait_for_workers(&client, &a, &id, Duration::from_secs(5), "resumed", |seen| seen.len() == 4)
        .await;
    offset = read_until(&client, &records_url, offset, &matching(0, 600), &mut delivered).await;

    cluster.assert_alive();
    // A steady feed into B while C is killed: C's workers move to A and B within 30 s, and
    // every acknowledged matching record is delivered.
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(u64, u64)>::new()));
    let feeder = {
        let (client, url, acked) = (client.clone(), ingest(&b), acked.clone());
        tokio::spawn(async move {
            let mut next = 600u64;
            while next < 4600 {
                let (status, _) =
                    send(&client, reqwest::Method::POST, &url, Some(batch(next, 50))).await;
                if status == 200 {
                    acked.lock().unwrap().push((next, 50));
                    next += 50;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().len() < 10 {
        assert!(Instant::now() < deadline, "ingest made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut killed = cluster.nodes[2].server.take().unwrap();
    killed.child.kill().unwrap(); // SIGKILL: no goodbye, its heartbeat just stops
    killed.child.wait().unwrap();
    let killed_at = Instant::now();
    drop(killed);
    let moved = wait_for_workers(
        &client,
        &a,
        &id,
        Duration::from_secs(30),
        "the killed node's workers move to the others",
        |seen| seen.len() == 4 && seen.values().all(|node| node != "node-c"),
    )
    .await;
    let failover = killed_at.elapsed();
    println!("failover after kill -9: {failover:?}; workers now {moved:?}");
    feeder.await.unwrap();
    let expected: BTreeSet<u64> = acked
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(from, count)| *from..from + count)
        .filter(|n| n % 3 != 0)
        .chain(matching(0, 600))
        .collect();
    offset = read_until(&client, &records_url, offset, &expected, &mut delivered).await;

    // C comes back under its name and takes a share again.
    cluster.start_node(2);
    wait_for_workers(
        &client,
        &b,
        &id,
        Duration::from_secs(30),
        "the restarted node takes workers again",
        |seen| seen.len() == 4 && seen.values().any(|node| node == "node-c"),
    )
    .await;
    assert_eq!(
        send(&client, reqwest::Method::POST, &ingest(&c), Some(batch(4600, 300))).await.0,
        200
    );
    let expected: BTreeSet<u64> = expected.union(&matching(4600, 4900)).copied().collect();
    offset = read_until(&client, &records_url, offset, &expected, &mut delivered).await;

    // A filter value added on A filters on every node: the other token's records (every
    // third) now pass too, whichever node's worker reads their partition.
    let (status, added) = send(
        &client,
        reqwest::Method::POST,
        &format!("{a}/api/v1/beam/{id}/transforms/tf-1/filter-values"),
        Some(json!({"values": ["0x1111111111111111111111111111111111111111"]}).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{added}");
    // Every node's index follows the Redis change feed: a second is plenty.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        send(&client, reqwest::Method::POST, &ingest(&b), Some(batch(4900, 300))).await.0,
        200
    );
    let expected: BTreeSet<u64> = expected.union(&(4900..5200).collect()).copied().collect();
    read_until_widened(&client, &records_url, offset, &expected, &mut delivered, 4900).await;

    // A dataset entry added on B reaches the scripts of a pipeline whose workers run on
    // every node.
    let script = "function transform(record) { return beam.contains('watched', [record.to_address]) ? record : null; }";
    let body = json!({
        "name": "watch", "description": "dataset across nodes", "pod_size": "L",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "v8", "uid": "tf-js", "script": script}],
            "sinks": [{"type": "kafka", "uid": "sk-1", "name": "watched"}]
        }
    });
    let (status, created) =
        send(&client, reqwest::Method::POST, &format!("{c}/api/v1/beam"), Some(body.to_string()))
            .await;
    assert_eq!(status, 200, "{created}");
    let watch = created["id"].as_str().unwrap().to_owned();
    let (status, _) =
        send(&client, reqwest::Method::POST, &format!("{c}/api/v1/beam/{watch}/deploy"), None)
            .await;
    assert_eq!(status, 200);
    let (status, dataset) = send(
        &client,
        reqwest::Method::POST,
        &format!("{a}/api/v1/beam/datasets"),
        Some(json!({"name": "watched"}).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{dataset}");
    let watch_url = format!("{c}/api/v1/beam/{watch}/sinks/sk-1/records");
    assert_eq!(
        send(&client, reqwest::Method::POST, &ingest(&a), Some(batch(6000, 100))).await.0,
        200
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, added) = send(
        &client,
        reqwest::Method::POST,
        &format!("{b}/api/v1/beam/datasets/entries"),
        Some(
            json!({"name": "watched", "values": ["0x3333333333333333333333333333333333333333"]})
                .to_string(),
        ),
    )
    .await;
    assert_eq!((status, added["count"].clone()), (200, json!(1)), "{added}");
    // The change goes to every node's dataset index on the same feed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        send(&client, reqwest::Method::POST, &ingest(&a), Some(batch(6100, 100))).await.0,
        200
    );
    // Every record arriving after the entry passes, on whichever node its partition's
    // worker runs (without the entry a node's scripts drop them). Records sent before it
    // may pass too: a worker may run them after the entry was added.
    let mut watched = BTreeSet::new();
    read_until_widened(&client, &watch_url, 0, &(6100..6200).collect(), &mut watched, 0).await;
    assert!(watched.iter().all(|n| (6000..6200).contains(n)), "{watched:?}");

    cluster.assert_alive();
    // Torn down on A: no node runs a worker, and the sink topic is gone.
    let (status, torn) =
        send(&client, reqwest::Method::POST, &format!("{a}/api/v1/beam/{id}/teardown"), None).await;
    assert_eq!(status, 200, "{torn}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.assert_alive();
    for base in [&a, &b, &c] {
        wait_for_workers(
            &client,
            base,
            &id,
            Duration::from_secs(5),
            "torn down",
            BTreeMap::is_empty,
        )
        .await;
    }
    let (status, gone) = send(&client, reqwest::Method::GET, &records_url, None).await;
    assert_ne!(status, 200, "{gone}");
    let _: Value = gone;
}

/// A node on one shared S3 warehouse (moto, started by `scripts/test`), its log lines kept.
fn start_archiving_node(
    name: &str,
    database_url: &str,
    bus: &str,
    prefix: &str,
    bucket_url: &str,
    endpoint: &str,
) -> (Server, std::sync::mpsc::Receiver<String>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(dir.path()))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--bus", bus, "--bus-topic-prefix", prefix])
        .args(["--node-name", name, "--warehouse-url", bucket_url])
        .env("SLUICE_DATABASE_URL", database_url)
        .env("SLUICE_SECRETS_KEY", SECRETS_KEY)
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY)
        .env("AWS_ENDPOINT", endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test");
    let (server, lines) = Server::start_logged(command, port);
    (server, lines, dir)
}

/// Waits up to `within` for a line containing `text` among `lines` (what was read is kept
/// in `seen`).
fn logged(
    lines: &std::sync::mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    text: &str,
    within: Duration,
) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if seen.iter().any(|line| line.contains(text)) {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        if let Ok(line) = lines.recv_timeout(left.min(Duration::from_millis(200))) {
            seen.push(line);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_on_one_shared_warehouse_archive_one_at_a_time_and_take_over_from_a_dead_one() {
    const ARCHIVES: &str = "this node archives the shared warehouse";
    let bus = std::env::var("SLUICE_TEST_KAFKA_URL")
        .expect("SLUICE_TEST_KAFKA_URL must name a Kafka-API broker; run scripts/test");
    let endpoint = std::env::var("SLUICE_TEST_S3_URL")
        .expect("SLUICE_TEST_S3_URL must name the S3-compatible server (scripts/test starts moto)");
    let bucket = format!("shared-{}", std::process::id());
    let client = reqwest::Client::new();
    // moto makes a bucket on an unsigned PUT.
    assert!(client.put(format!("{endpoint}/{bucket}")).send().await.unwrap().status().is_success());
    let database_url = crate::process::fresh_postgres_database("archivers").await;
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let prefix = format!("archivers{nanos:x}.");
    let url = format!("s3://{bucket}/wh");
    let mut nodes: Vec<_> = ["node-a", "node-b"]
        .into_iter()
        .map(|name| start_archiving_node(name, &database_url, &bus, &prefix, &url, &endpoint))
        .collect();
    let mut seen = [Vec::new(), Vec::new()];
    // One of them takes the role; the other waits (it tries every 5 s).
    let deadline = Instant::now() + Duration::from_secs(20);
    let archiving = loop {
        if let Some(index) = (0..2)
            .find(|&i| logged(&nodes[i].1, &mut seen[i], ARCHIVES, Duration::from_millis(100)))
        {
            break index;
        }
        assert!(Instant::now() < deadline, "no node took the archiver role");
    };
    let waiting = 1 - archiving;
    assert!(
        !logged(&nodes[waiting].1, &mut seen[waiting], ARCHIVES, Duration::from_secs(7)),
        "both nodes archive"
    );
    // The archiving node dies: the other takes over once the database ends its session.
    let (mut server, _, _) = nodes.remove(archiving);
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let survivor = &nodes[0];
    assert!(
        logged(&survivor.1, &mut seen[waiting], ARCHIVES, Duration::from_secs(20)),
        "the survivor did not take the archiver role"
    );
}

/// Two nodes both run the price service on the same streams: trades posted to either node,
/// some of them twice (to both), are each counted once in the candles they share.
#[tokio::test(flavor = "multi_thread")]
async fn two_nodes_count_each_trade_once() {
    let mut cluster = Cluster::new("prices", &["node-a", "node-b"]).await;
    cluster.start_node(0);
    cluster.start_node(1);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let [a, b] = [0, 1].map(|i| cluster.nodes[i].base());

    // Trades 0..40 of one token: 0..20 posted to A, 15..40 to B, so 15..20 arrive twice.
    let token = "0x00000000000000000000000000000000000000aa";
    let at = (chrono::Utc::now() - chrono::Duration::seconds(90)).to_rfc3339();
    let trades = |range: std::ops::Range<u64>| -> String {
        range
            .map(|n| {
                json!({
                    "chain": "base", "token_address": token, "token_decimals": 18,
                    "token_amount": format!("{}", n + 1), "usd_amount": format!("{}", 2 * (n + 1)),
                    "pool_address": "0x0000000000000000000000000000000000000abc",
                    "token_reserve": "1000", "block_number": 1, "log_index": n,
                    "block_timestamp": at, "transaction_hash": format!("0x{:064x}", 7),
                })
                .to_string()
                    + "\n"
            })
            .collect()
    };
    let ingest = |base: &str| format!("{base}/api/v1/streams/base/dex_trade/records");
    assert_eq!(send(&client, reqwest::Method::POST, &ingest(&a), Some(trades(0..20))).await.0, 200);
    assert_eq!(
        send(&client, reqwest::Method::POST, &ingest(&b), Some(trades(15..40))).await.0,
        200
    );

    let pool = sqlx::PgPool::connect(&cluster.database_url).await.unwrap();
    // The trade count of the token's day candle, as stored.
    let counted = || async {
        let row: (Option<i64>,) = sqlx::query_as(
            "SELECT MAX(trade_count) FROM price_candles WHERE token = $1 AND \
             granularity = (SELECT MAX(granularity) FROM price_candles WHERE token = $1)",
        )
        .bind(token)
        .fetch_one(&pool)
        .await
        .unwrap();
        row.0.unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while counted().await < 40 {
        assert!(Instant::now() < deadline, "trades counted: {}", counted().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Both nodes have read everything by now; nothing more is counted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(counted().await, 40, "each trade counted once in the day's candle");
    // Every node answers the same price: Σ usd / Σ token = 2.
    for base in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, answer) = send(
                &client,
                reqwest::Method::POST,
                &format!("{base}/api/v1/developer/prices"),
                Some(json!([{"chain": "base", "token_address": token}]).to_string()),
            )
            .await;
            assert_eq!(status, 200, "{answer}");
            if answer["items"][0]["price"] == 2.0 {
                break;
            }
            assert!(Instant::now() < deadline, "{base} answers {answer}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    cluster.assert_alive();
}
