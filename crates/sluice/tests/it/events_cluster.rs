//! Service events of chains and nodes through `sluice serve`: an Anvil node that stops
//! mining makes its chain stalled, then recovered; a cluster node killed is lost, stored
//! once although every other node sees it. Each is seen in the API, the stream and at a
//! signed webhook.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::chains::Anvil;
use crate::crash::KEY;
use crate::events::{Api, follow, seen_everywhere, signed_destination};
use crate::process::{Server, admin, data_dir_args, free_port, sluice};

#[tokio::test(flavor = "multi_thread")]
async fn an_anvil_node_that_stops_mining_makes_its_chain_stalled_then_recovered() {
    let anvil = Anvil::start().await;
    anvil.call("evm_setIntervalMining", json!([1])).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[[chains]]\nname = \"base\"\nrpc_url = \"{}\"\nstart_block = \"latest\"\n\
             chain_id = 31337\nconfirmations = 2\nmax_block_range = 3\npoll_interval_ms = 20\n\n\
             [events]\nsample_ms = 200\nchain_stall_secs = 3\n",
            anvil.url
        ),
    )
    .unwrap();
    let port = free_port();
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(&dir.path().join("data")))
        .args(["--config", config.to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    let server = Server::start(command, port);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let api = Api { client, base: server.base.clone() };
    let hook = signed_destination(&api, json!(["chain.*"])).await;
    let stream = follow(&api.base, KEY).await;
    // Blocks come every second: nothing stalls.
    let (status, thresholds) =
        api.call(reqwest::Method::GET, "/api/v1/chains/base/thresholds", None).await;
    assert_eq!((status, thresholds["stall_seconds"].clone()), (200, json!(3)), "{thresholds}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while api.call(reqwest::Method::GET, "/api/v1/chains", None).await.1["items"][0]["ingested"]
        .as_u64()
        .is_none()
    {
        assert!(Instant::now() < deadline, "the chain was never ingested");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(api.events(KEY, "&kind=chain.stalled").await.is_empty(), "stalled while mining");

    // Mining stops: no new block, so the chain is stalled once the threshold passed.
    anvil.call("evm_setIntervalMining", json!([0])).await;
    let stalled = seen_everywhere(&api, &stream, &hook, "chain.stalled", "base").await;
    assert_eq!(stalled["severity"], "error");
    assert!(stalled["details"]["stalled_seconds"].as_i64().unwrap() >= 3, "{stalled}");
    assert!(stalled["organization_id"].is_null(), "a service-wide event: {stalled}");
    // Mining again: recovered.
    anvil.call("evm_setIntervalMining", json!([1])).await;
    let recovered = seen_everywhere(&api, &stream, &hook, "chain.recovered", "base").await;
    assert!(recovered["id"].as_i64() > stalled["id"].as_i64());
    assert_eq!(api.events(KEY, "&kind=chain.stalled").await.len(), 1, "stalled once");
    drop(server);
}

/// A node of a cluster on the servers `scripts/test` starts.
fn start_node(
    dir: &std::path::Path,
    port: u16,
    name: &str,
    database: &str,
    prefix: &str,
) -> Server {
    let bus = std::env::var("SLUICE_TEST_KAFKA_URL")
        .expect("SLUICE_TEST_KAFKA_URL must name a Kafka-API broker; run scripts/test");
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(dir))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--bus", &bus, "--bus-topic-prefix", prefix])
        .args(["--node-name", name, "--node-timeout-secs", "3"])
        .env("SLUICE_DATABASE_URL", database)
        .env(
            "SLUICE_SECRETS_KEY",
            "5f2c1b0a9e8d7c6b5a49382716051f2e3d4c5b6a79881726354a5b6c7d8e9f00",
        )
        .env("SLUICE_EVENTS_SAMPLE_MS", "200")
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    Server::start(command, port)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_node_killed_is_lost_once_though_every_other_node_sees_it() {
    let database = crate::process::fresh_postgres_database("events_nodes").await;
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let prefix = format!("ev{nanos:x}.");
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let a = start_node(dirs[0].path(), ports[0], "node-a", &database, &prefix);
    let api = Api {
        client: reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap(),
        base: a.base.clone(),
    };
    let hook = signed_destination(&api, json!(["node.*", "pipeline.*"])).await;
    let stream = follow(&api.base, KEY).await;
    let mut b = start_node(dirs[1].path(), ports[1], "node-b", &database, &prefix);
    let c = start_node(dirs[2].path(), ports[2], "node-c", &database, &prefix);
    seen_everywhere(&api, &stream, &hook, "node.joined", "node-b").await;
    seen_everywhere(&api, &stream, &hook, "node.joined", "node-c").await;
    // A pipeline created on node c: one event, written by c, seen through a.
    let body = json!({"name": "spread", "description": "d", "pod_size": "L",
        "pipeline_config": {"source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [], "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}]}});
    let on_c = Api { client: api.client.clone(), base: c.base.clone() };
    let (status, created) = on_c.call(reqwest::Method::POST, "/api/v1/beam", Some(body)).await;
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let (status, deployed) =
        on_c.call(reqwest::Method::POST, &format!("/api/v1/beam/{id}/deploy"), None).await;
    assert_eq!(status, 200, "{deployed}");
    seen_everywhere(&api, &stream, &hook, "pipeline.deployed", &id).await;

    b.child.kill().unwrap(); // SIGKILL
    b.child.wait().unwrap();
    let lost = seen_everywhere(&api, &stream, &hook, "node.lost", "node-b").await;
    assert_eq!(lost["severity"], "error");
    assert!(lost["details"]["workers_moved"].is_array(), "{lost}");
    // Nodes a and c both saw it; it is stored once. The pipeline's events too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = api.events(KEY, "").await;
    let count = |kind: &str, subject: &str| {
        all.iter()
            .filter(|e| e["kind"] == kind && (e["node"] == subject || e["pipeline_id"] == subject))
            .count()
    };
    assert_eq!(count("node.lost", "node-b"), 1, "{all:?}");
    assert_eq!(count("pipeline.created", &id), 1);
    assert_eq!(count("pipeline.deployed", &id), 1);
    // The same through node c.
    let on_c_all = on_c.events(KEY, "&kind=node.lost").await;
    assert_eq!(on_c_all.len(), 1, "{on_c_all:?}");

    // Node events are for operators; another organization sees none of these.
    let store = ["--database-url", database.as_str()];
    let other = String::from_utf8(
        admin(&["create-key", "--org", "rival", "--team", "t", "--user", "eve"], &store, &[])
            .stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    assert_eq!(api.events(&other, "").await, Vec::<Value>::new());
    drop((a, c));
}
