//! `sluice serve` with a Solana chain, against the test node of `crates/sluice-solana-testnode`
//! (real mainnet blocks and generated ones, with skipped slots, "not available" answers,
//! 429s and dropped connections): exact records, a set filter on a signer, `kill -9`
//! mid-ingest, and the chain identity checks that refuse a start.

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_solana_testnode::{Chain, Faults, MAINNET_GENESIS_HASH, SIGNERS, TestNode};

use crate::crash::{KEY, send};
use crate::process::{Server, data_dir_args, free_port, sluice};

const FIXTURES: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../sluice-chains/tests/fixtures/solana");

fn serve_command(dir: &std::path::Path, port: u16, chain_table: &str) -> Command {
    let config = dir.join("sluice.toml");
    std::fs::write(&config, chain_table).unwrap();
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(&dir.join("data")))
        .args(["--config", config.to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    command
}

fn solana_table(url: &str, start_slot: &str, extra: &str) -> String {
    format!(
        "[[chains]]\nname = \"solana\"\nrpc_url = \"{url}\"\nstart_slot = {start_slot}\n\
         poll_interval_ms = 20\n{extra}"
    )
}

async fn status(client: &reqwest::Client, base: &str) -> Value {
    let (code, body) =
        send(client, reqwest::Method::GET, &format!("{base}/api/v1/chains"), None).await;
    if code != 200 {
        return Value::Null;
    }
    body["items"][0].clone()
}

async fn wait_ingested(client: &reqwest::Client, base: &str, slot: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let status = status(client, base).await;
        if status["ingested"].as_u64() >= Some(slot) {
            return status;
        }
        assert!(Instant::now() < deadline, "ingest did not reach slot {slot}: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every record of `solana.nonvoting_transaction` in the server's embedded log (the server
/// stopped).
async fn stored(dir: &std::path::Path) -> Vec<Value> {
    let log = sluice_bus::EmbeddedLog::open(
        &dir.join("data/log.redb"),
        Arc::new(sluice_core::clock::SystemClock),
    )
    .unwrap();
    let log: Arc<dyn sluice_bus::StreamLog> = Arc::new(log);
    let topic = "solana.nonvoting_transaction";
    let mut out = Vec::new();
    for (partition, range) in (0u32..).zip(log.offsets(topic).await.unwrap()) {
        for record in log.read(topic, partition, range.start, 1_000_000).await.unwrap() {
            assert_eq!(
                std::str::from_utf8(&record.key).unwrap(),
                serde_json::from_slice::<Value>(&record.value).unwrap()["txn_id"]
            );
            out.push(serde_json::from_slice(&record.value).unwrap());
        }
    }
    out
}

fn fixture(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario: real blocks served, ingested, and every record checked field by field"
)]
async fn real_mainnet_blocks_become_exact_records_without_the_votes() {
    let faults = Faults { not_available_first: true, ..Faults::default() };
    let node = TestNode::start(Chain::Fixtures, MAINNET_GENESIS_HASH, faults);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let table = solana_table(&node.url, "1021085", "max_slot_range = 500000\n");
    let server = Server::start(serve_command(dir.path(), port, &table), port);
    let at = wait_ingested(&client, &base, 241_043_141).await;
    assert_eq!(at["chain"], "solana");
    assert!(at["head"].as_u64().unwrap() >= 241_043_141, "{at}");
    assert!(server.terminate());

    let records = stored(dir.path()).await;
    let by_id: BTreeMap<&str, &Value> =
        records.iter().map(|r| (r["txn_id"].as_str().unwrap(), r)).collect();
    assert_eq!(by_id.len(), records.len(), "each transaction once");
    // Slot 100,000,000: transactions 3, 4, 6 and 7; the six votes (two failed) are left out.
    let block = fixture("slot-100000000.json");
    let mut expected: Vec<String> = [3, 4, 6, 7]
        .iter()
        .map(|i| {
            block["transactions"][i]["transaction"]["signatures"][0].as_str().unwrap().to_owned()
        })
        .collect();
    let v0 = fixture("slot-154808473-v0.json");
    let v0_id = v0["transactions"][0]["transaction"]["signatures"][0].as_str().unwrap();
    let failed = fixture("slot-241043141-failed.jsonParsed.json");
    let failed_id = failed["transactions"][0]["transaction"]["signatures"][0].as_str().unwrap();
    expected.extend([v0_id.to_owned(), failed_id.to_owned()]);
    expected.sort();
    assert_eq!(by_id.keys().map(|k| (*k).to_owned()).collect::<Vec<_>>(), expected);

    // One legacy transaction, field by field.
    let tx = &block["transactions"][7];
    let record = by_id[tx["transaction"]["signatures"][0].as_str().unwrap()];
    let parsed = fixture("slot-100000000.jsonParsed.json");
    assert_eq!(
        record["account_keys"],
        parsed["transactions"][7]["transaction"]["message"]["accountKeys"]
    );
    assert_eq!(record["block_slot"], 100_000_000);
    assert_eq!(record["block_height"], 89_586_871);
    assert_eq!(record["block_timestamp"], "2021-10-06T07:18:25Z");
    assert_eq!(record["block_hash"], "GdY1gj7F8vq1nCy4dgCZK42WV19bkfQ4cp2e9evK18ry");
    assert_eq!(record["parent_slot"], 99_999_999);
    assert_eq!(record["txn_index"], 7);
    assert_eq!(record["signatures"], tx["transaction"]["signatures"]);
    assert_eq!(record["signer"], tx["transaction"]["message"]["accountKeys"][0]);
    assert_eq!(record["signers"], json!([tx["transaction"]["message"]["accountKeys"][0]]));
    assert_eq!(record["fee"], tx["meta"]["fee"]);
    assert_eq!(record["success"], true);
    assert_eq!(record["err"], Value::Null);
    assert_eq!(record["version"], "legacy");
    assert_eq!(record["recent_block_hash"], tx["transaction"]["message"]["recentBlockhash"]);
    assert_eq!(record["log_messages"], tx["meta"]["logMessages"]);
    assert_eq!(record["pre_balances"], tx["meta"]["preBalances"]);
    assert_eq!(record["post_balances"], tx["meta"]["postBalances"]);
    let keys = tx["transaction"]["message"]["accountKeys"].as_array().unwrap();
    let instructions: Vec<Value> = tx["transaction"]["message"]["instructions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            json!({
                "program_id": keys[i["programIdIndex"].as_u64().unwrap() as usize],
                "accounts": i["accounts"],
                "data": i["data"],
                "stack_height": Value::Null,
            })
        })
        .collect();
    assert_eq!(record["instructions"], json!(instructions));
    // Instruction accounts are indexes into `account_keys`, which resolve them.
    for instruction in record["instructions"].as_array().unwrap() {
        for index in instruction["accounts"].as_array().unwrap() {
            let index = index.as_u64().unwrap() as usize;
            assert_eq!(record["account_keys"][index]["pubkey"], keys[index]);
        }
    }
    assert_eq!(record["instructions"][1]["program_id"], "11111111111111111111111111111111");

    // The version-0 transaction: the loaded addresses follow the message's keys.
    let record = by_id[v0_id];
    let meta = &v0["transactions"][0]["meta"];
    let keys = record["account_keys"].as_array().unwrap();
    let loaded: Vec<&Value> = keys.iter().filter(|k| k["source"] == "lookupTable").collect();
    let writable = meta["loadedAddresses"]["writable"].as_array().unwrap();
    let readonly = meta["loadedAddresses"]["readonly"].as_array().unwrap();
    assert_eq!(loaded.len(), writable.len() + readonly.len());
    for (key, expected) in loaded.iter().zip(writable.iter().chain(readonly)) {
        assert_eq!(&key["pubkey"], expected);
    }
    assert!(loaded[..writable.len()].iter().all(|k| k["writable"] == true));
    assert!(loaded[writable.len()..].iter().all(|k| k["writable"] == false));
    assert_eq!(record["version"], "0");
    assert_eq!(
        record["pre_token_balances"].as_array().unwrap().len(),
        meta["preTokenBalances"].as_array().unwrap().len()
    );

    // The failed transaction is kept, with its error.
    let record = by_id[failed_id];
    let meta = &failed["transactions"][0]["meta"];
    assert_eq!(record["success"], false);
    assert_eq!(record["err"], json!({"InstructionError": [3, "ProgramFailedToComplete"]}));
    assert_eq!(record["fee"], meta["fee"]);
    assert_eq!(record["compute_units_consumed"], meta["computeUnitsConsumed"]);
    assert_eq!(record["log_messages"], meta["logMessages"]);
    assert_eq!(record["signer"], "5yKF9m4HwZPA1cibk7JGEVtAGBL2Jx8PxcuB5EbHXRKq");
    assert_eq!(record["block_timestamp"], "2024-01-10T20:44:15Z");
    assert_eq!(
        record["instructions"][3]["program_id"],
        "GqCHpDuPPsyyMxtaQgYxyLLLWv1kZFyy2DD5z1cMNouR"
    );
    assert_eq!(
        record["instructions"][3]["data"],
        "17PaMpNf3J3wbnYksgzL4HB3hEU2iUL4SpGioLpjo1817ee8Gs3peEJg"
    );
    let token = &record["post_token_balances"][0];
    let theirs = &meta["postTokenBalances"][0];
    assert_eq!(token["mint"], theirs["mint"]);
    assert_eq!(token["amount"], theirs["uiTokenAmount"]["amount"]);
    assert_eq!(token["ui_amount_string"], theirs["uiTokenAmount"]["uiAmountString"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_set_filter_pipeline_on_one_signer_gets_exactly_its_transactions() {
    let (first, initial) = (5_000u64, 10u64);
    let chain =
        Chain::Generated { first_slot: first, last_slot: first + 1_000, initial, slot_ms: 0 };
    let faults =
        Faults { list_skipped: true, not_available_first: true, http_429_every: 7, drop_every: 11 };
    let node = TestNode::start(chain, "LocalGenesis1111111111111111111111111111111", faults);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let table = solana_table(
        &node.url,
        "\"latest\"",
        "genesis_hash = \"LocalGenesis1111111111111111111111111111111\"\n",
    );
    let _server = Server::start(serve_command(dir.path(), port, &table), port);
    // "latest": the slot after the finalized one at the first start.
    let start = node.finalized_slot() + 1;
    wait_ingested_head(&client, &base).await;

    let body = json!({
        "name": "bob", "description": "one signer's transactions",
        "pipeline_config": {
            "source": {"chain": "solana", "entity": "nonvoting_transaction"},
            "transforms": [{"type": "redis_set_filter", "uid": "tf-1", "filter_expr": "root = this.signer"}],
            "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}]
        }
    });
    let url = format!("{base}/api/v1/beam");
    let (code, created) = send(&client, reqwest::Method::POST, &url, Some(body.to_string())).await;
    assert_eq!(code, 200, "{created}");
    let beam = format!("{base}/api/v1/beam/{}", created["id"].as_str().unwrap());
    assert_eq!(send(&client, reqwest::Method::POST, &format!("{beam}/deploy"), None).await.0, 200);
    let values = json!({"values": [SIGNERS[1]]}).to_string();
    let url = format!("{beam}/transforms/tf-1/filter-values");
    assert_eq!(send(&client, reqwest::Method::POST, &url, Some(values)).await.0, 200);

    node.advance(60);
    let end = node.finalized_slot();
    let status =
        wait_ingested(&client, &base, (start..=end).rev().find(|s| s % 10 != 7).unwrap()).await;
    assert!(status["rpc_errors"].as_u64().unwrap() > 0, "faults were injected: {status}");
    let mut expected: Vec<String> = (start..=end)
        .filter(|slot| sluice_solana_testnode::is_produced(*slot))
        .flat_map(sluice_solana_testnode::transfers)
        .filter(|(_, signer)| *signer == SIGNERS[1])
        .map(|(signature, _)| signature)
        .collect();
    expected.sort();
    assert!(expected.len() > 10, "{}", expected.len());
    let sink = format!("{beam}/sinks/sk-1/records?limit=1000&wait_ms=200");
    let deadline = Instant::now() + Duration::from_secs(30);
    let records = loop {
        let (code, page) = send(&client, reqwest::Method::GET, &sink, None).await;
        assert_eq!(code, 200, "{page}");
        let records = page["records"].as_array().unwrap().clone();
        if records.len() >= expected.len() || Instant::now() > deadline {
            break records;
        }
    };
    let mut delivered: Vec<String> =
        records.iter().map(|r| r["value"]["txn_id"].as_str().unwrap().to_owned()).collect();
    delivered.sort();
    assert_eq!(delivered, expected, "exactly the signer's transactions");
    assert!(records.iter().all(|r| r["value"]["signer"] == SIGNERS[1]));

    // Slots show in /metrics as EVM blocks do.
    let response =
        client.get(format!("{base}/metrics")).header("x-api-key", KEY).send().await.unwrap();
    let metrics = response.text().await.unwrap();
    assert!(metrics.contains("sluice_chain_ingested_block{chain=\"solana\"}"), "{metrics}");
    assert!(metrics.contains("sluice_chain_lag_blocks{chain=\"solana\"}"), "{metrics}");
    assert!(status["lag_seconds"].is_u64(), "{status}");
}

/// Waits until the ingester has read the node's slot once.
async fn wait_ingested_head(client: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(client, base).await["head"].as_u64().is_none() {
        assert!(Instant::now() < deadline, "the ingester never read the slot");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_ingest_then_restart_leaves_every_slots_transactions_once() {
    let first = 20_000u64;
    let last = first + 240;
    let chain = Chain::Generated { first_slot: first, last_slot: last, initial: 30, slot_ms: 15 };
    let faults = Faults {
        list_skipped: true,
        not_available_first: false,
        http_429_every: 13,
        drop_every: 17,
    };
    let genesis = "LocalGenesis1111111111111111111111111111111";
    let node = TestNode::start(chain, genesis, faults);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    // Small steps, so that a kill lands between appends and checkpoints.
    let table = solana_table(
        &node.url,
        &first.to_string(),
        &format!("genesis_hash = \"{genesis}\"\nmax_batch = 2\nmax_concurrency = 2\n"),
    );
    for stop_at in [first + 20, first + 70, first + 130] {
        let mut server = Server::start(serve_command(dir.path(), port, &table), port);
        wait_ingested(&client, &base, stop_at).await;
        server.child.kill().unwrap();
        server.child.wait().unwrap();
    }
    let end = last - 4;
    let server = Server::start(serve_command(dir.path(), port, &table), port);
    wait_ingested(&client, &base, (first..=end).rev().find(|s| s % 10 != 7).unwrap()).await;
    assert!(server.terminate());

    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for record in stored(dir.path()).await {
        *seen.entry(record["txn_id"].as_str().unwrap().to_owned()).or_default() += 1;
    }
    let expected: Vec<String> = (first..=end)
        .filter(|slot| sluice_solana_testnode::is_produced(*slot))
        .flat_map(sluice_solana_testnode::transfers)
        .map(|(signature, _)| signature)
        .collect();
    assert!(seen.values().all(|n| *n == 1), "a transaction twice: {seen:?}");
    assert_eq!(seen.len(), expected.len(), "every slot's transactions");
    assert!(expected.iter().all(|s| seen.contains_key(s)));
}

/// Runs `command` to its exit (within 60 s).
fn run_to_exit(mut command: Command) -> Output {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve kept running: {:?}", child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_node_of_another_solana_cluster_refuses_the_start() {
    let chain = Chain::Generated { first_slot: 10, last_slot: 100, initial: 50, slot_ms: 0 };
    let node =
        TestNode::start(chain, "TestGenesis11111111111111111111111111111111", Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("{}/v2/abcdefghijklmnopqrstuvwxyz", node.url);
    let output = run_to_exit(serve_command(dir.path(), port, &solana_table(&url, "10", "")));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line =
        stderr.lines().find(|l| l.contains("genesis hash")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("chain solana"), "{line}");
    assert!(line.contains(&format!("{}/v2/***", node.url)), "the URL, key redacted: {line}");
    assert!(!line.contains("abcdefghijklmnopqrstuvwxyz"), "{line}");
    assert!(line.contains("TestGenesis11111111111111111111111111111111"), "{line}");
    assert!(line.contains(MAINNET_GENESIS_HASH), "{line}");
    // Refused before anything was created: no one-time key was printed.
    assert!(!String::from_utf8_lossy(&output.stdout).contains("shown only this once"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_evm_node_of_another_chain_id_or_family_refuses_the_start() {
    let anvil = crate::chains::Anvil::start().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let table = format!("[[chains]]\nname = \"base\"\nrpc_url = \"{}\"\n", anvil.url);
    let output = run_to_exit(serve_command(dir.path(), port, &table));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line =
        stderr.lines().find(|l| l.contains("chain id")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("chain base") && line.contains(&anvil.url), "{line}");
    assert!(line.contains("31337") && line.contains("8453"), "{line}");

    // An EVM node given as the Solana chain is a node of the wrong family.
    let output = run_to_exit(serve_command(dir.path(), port, &solana_table(&anvil.url, "1", "")));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("not a Solana node"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("chain solana") && line.contains("getGenesisHash"), "{line}");

    // A Solana node given as an EVM chain: the same.
    let node = TestNode::start(Chain::Fixtures, MAINNET_GENESIS_HASH, Faults::default());
    let table = format!("[[chains]]\nname = \"base\"\nrpc_url = \"{}\"\n", node.url);
    let output = run_to_exit(serve_command(dir.path(), port, &table));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is not an EVM node (eth_chainId answered error -32601"), "{stderr}");
}

/// Polls the chain status until it shows a `last_error`, for at most 5 s: well before a
/// step's retries (8 attempts, ~20 s) would give up.
async fn wait_last_error(client: &reqwest::Client, base: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let status = status(client, base).await;
        if let Some(error) = status["last_error"].as_str() {
            return error.to_owned();
        }
        assert!(Instant::now() < deadline, "no last_error yet: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_that_goes_down_shows_its_error_at_once() {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    // Down while ingesting: the step is still retrying when the status shows why.
    let chain = Chain::Generated { first_slot: 10, last_slot: 1_000_000, initial: 20, slot_ms: 10 };
    let genesis = "LocalGenesis1111111111111111111111111111111";
    let node = TestNode::start(chain, genesis, Faults::default());
    let url = node.url.clone();
    let table = solana_table(&url, "10", &format!("genesis_hash = \"{genesis}\"\n"));
    let dir = tempfile::tempdir().unwrap();
    let _server = Server::start(serve_command(dir.path(), port, &table), port);
    wait_ingested(&client, &base, 12).await;
    drop(node);
    let error = wait_last_error(&client, &base).await;
    // A request in flight when the node went sees its connection reset ("request failed");
    // the ones after it, a refused connection ("connection failed").
    let transport = error.contains("connection failed") || error.contains("request failed");
    assert!(error.contains(&url) && transport, "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn confirmed_commitment_reads_past_the_finalized_slot() {
    let chain = Chain::Generated { first_slot: 100, last_slot: 10_000, initial: 40, slot_ms: 0 };
    let genesis = "LocalGenesis1111111111111111111111111111111";
    let node = TestNode::start(chain, genesis, Faults::default());
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let extra = format!("genesis_hash = \"{genesis}\"\ncommitment = \"confirmed\"\n");
    let dir = tempfile::tempdir().unwrap();
    let _server = Server::start(
        serve_command(dir.path(), port, &solana_table(&node.url, "100", &extra)),
        port,
    );
    // The test node's head is 140, its confirmed slot 139 and its finalized slot 136.
    assert_eq!(node.finalized_slot(), 136);
    let status = wait_ingested(&client, &base, 139).await;
    assert_eq!(status["finalized"], 139, "the slot with the chosen commitment: {status}");
    assert_eq!(status["head"], 140, "{status}");
}
