//! `sluice serve` with a chain: records made on a real Anvil node reach a set-filter
//! pipeline's sink, `GET /api/v1/chains` reports progress, and `kill -9` mid-ingest then a
//! restart leaves every block exactly once in the finalized streams.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy_dyn_abi::{DynSolValue, JsonAbiExt};
use serde_json::{Value, json};

use crate::crash::{KEY, send};
use crate::process::{Server, data_dir_args, free_port, sluice};

const ALICE: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";
const BOB: &str = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8";

pub struct Anvil {
    child: Child,
    pub url: String,
    client: reqwest::Client,
}

impl Drop for Anvil {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Anvil {
    pub async fn start() -> Self {
        let binary = std::env::var("SLUICE_TEST_ANVIL_BIN")
            .expect("SLUICE_TEST_ANVIL_BIN must name an anvil binary; run scripts/test");
        let port = free_port();
        let child = Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--silent"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let anvil = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while anvil.try_call("eth_blockNumber", json!([])).await.is_none() {
            assert!(Instant::now() < deadline, "anvil did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anvil
    }

    async fn try_call(&self, method: &str, params: Value) -> Option<Value> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let answer: Value =
            self.client.post(&self.url).json(&body).send().await.ok()?.json().await.ok()?;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        Some(answer["result"].clone())
    }

    pub(crate) async fn call(&self, method: &str, params: Value) -> Value {
        self.try_call(method, params).await.expect("anvil answers")
    }

    pub(crate) async fn head(&self) -> u64 {
        let n = self.call("eth_blockNumber", json!([])).await;
        u64::from_str_radix(n.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
    }

    async fn send(&self, to: Option<&str>, data: Vec<u8>) -> Value {
        let mut tx = json!({"from": ALICE, "data": format!("0x{}", alloy_primitives::hex::encode(data)), "gas": "0x1000000"});
        if let Some(to) = to {
            tx["to"] = json!(to);
        }
        let hash = self.call("eth_sendTransaction", json!([tx])).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let receipt = self.call("eth_getTransactionReceipt", json!([hash])).await;
            if !receipt.is_null() {
                assert_eq!(receipt["status"], "0x1");
                return receipt;
            }
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Deploys a compiled test contract of `crates/sluice-chains/tests/contracts`.
    async fn deploy(&self, contract: &str, args: Vec<DynSolValue>) -> String {
        let path = format!(
            "{}/../sluice-chains/tests/contracts/compiled/{contract}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let compiled: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut code =
            alloy_primitives::hex::decode(compiled["bytecode"].as_str().unwrap()).unwrap();
        code.extend(DynSolValue::Tuple(args).abi_encode_params());
        let receipt = self.send(None, code).await;
        receipt["contractAddress"].as_str().unwrap().to_ascii_lowercase()
    }

    /// A token with 6 decimals.
    async fn token(&self, name: &str, symbol: &str) -> String {
        let args = vec![
            DynSolValue::String(name.to_owned()),
            DynSolValue::String(symbol.to_owned()),
            DynSolValue::Uint(alloy_primitives::U256::from(6u8), 256),
        ];
        self.deploy("TestToken", args).await
    }

    /// Calls `signature` on `to` from Alice.
    async fn invoke(&self, to: &str, signature: &str, args: Vec<DynSolValue>) -> Value {
        let function = alloy_json_abi::Function::parse(signature).unwrap();
        self.send(Some(to), function.abi_encode_input(&args).unwrap()).await
    }

    async fn mint(&self, token: &str, amount: u64) -> Value {
        let args = vec![
            DynSolValue::Address(BOB.parse().unwrap()),
            DynSolValue::Uint(alloy_primitives::U256::from(amount), 256),
        ];
        self.invoke(token, "mint(address,uint256)", args).await
    }
}

/// `sluice serve` reading chain `base` from `anvil`; `extra` is more of its `[[chains]]` table.
fn start(dir: &std::path::Path, port: u16, anvil: &str, start_block: &str, extra: &str) -> Server {
    let config = dir.join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[[chains]]\nname = \"base\"\nrpc_url = \"{anvil}\"\nstart_block = {start_block}\n\
             chain_id = 31337\nconfirmations = 2\nmax_block_range = 3\npoll_interval_ms = 20\n{extra}"
        ),
    )
    .unwrap();
    let data = dir.join("data");
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(&data))
        .args(["--config", config.to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    Server::start(command, port)
}

async fn chain_status(client: &reqwest::Client, base: &str) -> Value {
    let (status, body) =
        send(client, reqwest::Method::GET, &format!("{base}/api/v1/chains"), None).await;
    if status != 200 {
        return Value::Null;
    }
    body["items"][0].clone()
}

pub(crate) async fn wait_ingested(client: &reqwest::Client, base: &str, block: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = chain_status(client, base).await;
        if status["ingested"].as_u64() >= Some(block) {
            return status;
        }
        assert!(Instant::now() < deadline, "ingest did not reach {block}: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_set_filter_pipeline_delivers_the_tokens_transfers_made_on_the_node() {
    let anvil = Anvil::start().await;
    let usdc = anvil.token("USD Coin", "USDC").await;
    let other = anvil.token("Other", "OTH").await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let _server = start(dir.path(), port, &anvil.url, "\"latest\"", "");
    let body = json!({
        "name": "usdc", "description": "USDC transfers from the node",
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
    let beam = format!("{base}/api/v1/beam/{}", created["id"].as_str().unwrap());
    assert_eq!(send(&client, reqwest::Method::POST, &format!("{beam}/deploy"), None).await.0, 200);
    let values = json!({"values": [usdc]}).to_string();
    let url = format!("{beam}/transforms/tf-1/filter-values");
    assert_eq!(send(&client, reqwest::Method::POST, &url, Some(values)).await.0, 200);

    let mut expected = Vec::new();
    for amount in 1..=5u64 {
        let receipt = anvil.mint(&usdc, amount * 1_000_000).await;
        expected.push(receipt["transactionHash"].as_str().unwrap().to_owned());
        anvil.mint(&other, amount).await;
    }
    anvil.call("anvil_mine", json!(["0x3"])).await;
    let status = wait_ingested(&client, &base, anvil.head().await - 2).await;
    assert_eq!(status["rpc_url"], json!(anvil.url));
    assert_eq!(status["lag_blocks"], 2);

    let sink = format!("{beam}/sinks/sk-1/records?limit=1000&wait_ms=200");
    let deadline = Instant::now() + Duration::from_secs(30);
    let records = loop {
        let (status, page) = send(&client, reqwest::Method::GET, &sink, None).await;
        assert_eq!(status, 200, "{page}");
        let records = page["records"].as_array().unwrap().clone();
        if records.len() >= expected.len() || Instant::now() > deadline {
            break records;
        }
    };
    let mut delivered: Vec<String> = records
        .iter()
        .map(|r| r["value"]["transaction_hash"].as_str().unwrap().to_owned())
        .collect();
    delivered.sort();
    expected.sort();
    assert_eq!(delivered, expected, "exactly the USDC transfers");
    assert!(records.iter().all(
        |r| r["value"]["token_address"] == json!(usdc) && r["value"]["token_symbol"] == "USDC"
    ));

    let (_, metrics) = {
        let response =
            client.get(format!("{base}/metrics")).header("x-api-key", KEY).send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    };
    assert!(metrics.contains("sluice_chain_ingested_block{chain=\"base\"}"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_ingest_then_restart_leaves_every_block_once_in_the_finalized_streams() {
    let anvil = Anvil::start().await;
    let usdc = anvil.token("USD Coin", "USDC").await;
    let mut hashes = Vec::new();
    for amount in 1..=60u64 {
        hashes
            .push(anvil.mint(&usdc, amount).await["transactionHash"].as_str().unwrap().to_owned());
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    // Killed three times at growing heights, transfers still being made in between.
    for (round, stop_at) in [8u64, 25, 45].into_iter().enumerate() {
        let mut server = start(dir.path(), port, &anvil.url, "1", "");
        wait_ingested(&client, &base, stop_at).await;
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        for amount in 0..5u64 {
            let receipt = anvil.mint(&usdc, 1000 * (round as u64 + 1) + amount).await;
            hashes.push(receipt["transactionHash"].as_str().unwrap().to_owned());
        }
    }
    anvil.call("anvil_mine", json!(["0x2"])).await;
    let head = anvil.head().await;
    let server = start(dir.path(), port, &anvil.url, "1", "");
    wait_ingested(&client, &base, head - 2).await;
    assert!(server.terminate());

    let log = sluice_bus::EmbeddedLog::open(
        &dir.path().join("data/log.redb"),
        Arc::new(sluice_core::clock::SystemClock),
    )
    .unwrap();
    let log: Arc<dyn sluice_bus::StreamLog> = Arc::new(log);
    for entity in ["erc20_token_transfer", "log", "decoded_log"] {
        let topic = format!("base.{entity}");
        let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
        for (partition, range) in (0u32..).zip(log.offsets(&topic).await.unwrap()) {
            let records = log.read(&topic, partition, range.start, 100_000).await.unwrap();
            for record in records {
                let value: Value = serde_json::from_slice(&record.value).unwrap();
                *seen.entry(value["transaction_hash"].as_str().unwrap().to_owned()).or_default() +=
                    1;
            }
        }
        assert_eq!(seen.len(), hashes.len(), "{entity}: every mint");
        assert!(seen.values().all(|n| *n == 1), "{entity}: a record twice: {seen:?}");
        assert!(hashes.iter().all(|h| seen.contains_key(h)));
    }
}

/// Uniswap-style trades made on the node reach the price endpoints through `dex_trade`: WETH
/// priced by its USDC pair (a stablecoin leg), PEPE by its V3 pool against WETH (a priced
/// leg), and both tokens' liquidity from the pools' reserves, the V3 pool's included.
#[tokio::test(flavor = "multi_thread")]
async fn trades_on_the_node_price_tokens_through_stable_and_priced_legs() {
    let anvil = Anvil::start().await;
    let usdc = anvil.token("USD Coin", "USDC").await;
    let weth = anvil.token("Wrapped Ether", "WETH").await;
    let pepe = anvil.token("Pepe", "PEPE").await;
    let address = |a: &str| DynSolValue::Address(a.parse().unwrap());
    let uint = |n: u64| DynSolValue::Uint(alloy_primitives::U256::from(n), 256);
    let int = |n: i64| DynSolValue::Int(alloy_primitives::I256::try_from(n).unwrap(), 256);
    let pair = anvil.deploy("TestPair", vec![address(&usdc), address(&weth)]).await;
    let pool = anvil.deploy("TestPoolV3", vec![address(&pepe), address(&weth)]).await;
    let (mint, transfer, approve) =
        ("mint(address,uint256)", "transfer(address,uint256)", "approve(address,uint256)");
    // Amounts in base units of 6 decimals.
    for token in [&usdc, &weth, &pepe] {
        anvil.invoke(token, mint, vec![address(ALICE), uint(10_000_000_000_000)]).await;
    }
    // WETH: 1,000 USDC and 1 WETH in the pair, then 200 USDC in for 0.1 WETH out (2,000 USD).
    anvil.invoke(&usdc, transfer, vec![address(&pair), uint(1_000_000_000)]).await;
    anvil.invoke(&weth, transfer, vec![address(&pair), uint(1_000_000)]).await;
    anvil.invoke(&pair, "sync()", vec![]).await;
    anvil.invoke(&usdc, approve, vec![address(&pair), uint(200_000_000)]).await;
    let swap_from = "swapFrom(uint256,uint256,uint256,uint256,address)";
    let v2 = vec![uint(200_000_000), uint(0), uint(0), uint(100_000), address(ALICE)];
    anvil.invoke(&pair, swap_from, v2).await;
    // PEPE: 1,000,000 PEPE and 2 WETH in the V3 pool, then 10,000 PEPE in for 0.01 WETH out:
    // 20 USD, so 0.002 USD a PEPE, and 1,010,000 PEPE left in the pool.
    anvil.invoke(&pepe, transfer, vec![address(&pool), uint(1_000_000_000_000)]).await;
    anvil.invoke(&weth, transfer, vec![address(&pool), uint(2_000_000)]).await;
    anvil.invoke(&pepe, approve, vec![address(&pool), uint(10_000_000_000)]).await;
    let v3 = vec![
        int(10_000_000_000),
        int(-10_000),
        address(ALICE),
        DynSolValue::Uint(alloy_primitives::U256::from(1u8) << 96, 160),
        DynSolValue::Uint(alloy_primitives::U256::from(1u8), 128),
        DynSolValue::Int(alloy_primitives::I256::ZERO, 24),
    ];
    anvil.invoke(&pool, "swap(int256,int256,address,uint160,uint128,int24)", v3).await;
    anvil.call("anvil_mine", json!(["0x3"])).await;

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let _server =
        start(dir.path(), port, &anvil.url, "1", &format!("stablecoins = [\"{usdc}\"]\n"));
    wait_ingested(&client, &base, anvil.head().await - 2).await;

    let url = format!("{base}/api/v1/developer/prices?with_liquidity_info=true");
    let tokens =
        json!([{"chain": "base", "token_address": weth}, {"chain": "base", "token_address": pepe}]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let items = loop {
        let (status, body) =
            send(&client, reqwest::Method::POST, &url, Some(tokens.to_string())).await;
        assert_eq!(status, 200, "{body}");
        let items = body["items"].as_array().cloned().unwrap_or_default();
        if items.len() == 2 || Instant::now() > deadline {
            break items;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let price = |token: &str| {
        let item = items.iter().find(|i| i["address"] == json!(token));
        item.unwrap_or_else(|| panic!("{token} priced: {items:?}")).clone()
    };
    let close = |value: &Value, expected: f64| {
        let value = value.as_f64().unwrap_or_else(|| panic!("a number: {value}"));
        assert!((value - expected).abs() < expected * 1e-9, "{value} against {expected}");
    };
    close(&price(&weth)["price"], 2000.0);
    close(&price(&pepe)["price"], 0.002);
    close(&price(&pepe)["total_liquidity_usd"], 1_010_000.0 * 0.002);
    // WETH's liquidity: 0.9 WETH left in the V2 pair and 1.99 in the V3 pool, at 2,000.
    close(&price(&weth)["total_liquidity_usd"], (0.9 + 1.99) * 2000.0);
}
