//! A private Anvil per test, the test contracts, and transactions sent to them.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy_dyn_abi::{DynSolValue, JsonAbiExt};
use alloy_json_abi::Function;
use alloy_primitives::{Address, U256};
use serde_json::{Value, json};
use sluice_bus::{EmbeddedLog, Retention, StreamLog, TopicConfig};
use sluice_chains::rpc::{RpcClient, RpcSettings};
use sluice_chains::{ChainConfig, Finality, LogPositions, StartBlock};
use sluice_core::clock::SystemClock;

/// Anvil's first two dev accounts (unlocked: `eth_sendTransaction` signs for them).
pub const ALICE: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";
pub const BOB: &str = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8";

pub struct Anvil {
    child: Child,
    pub url: String,
    pub rpc: RpcClient,
}

impl Drop for Anvil {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Anvil {
    /// Starts Anvil on a free loopback port, mining a block per transaction.
    pub async fn start() -> Self {
        let binary = std::env::var("SLUICE_TEST_ANVIL_BIN")
            .expect("SLUICE_TEST_ANVIL_BIN must name an anvil binary; run scripts/test");
        let port = free_port();
        let child = Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--silent"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("anvil starts");
        let url = format!("http://127.0.0.1:{port}");
        let rpc = RpcClient::new(&url, RpcSettings { max_attempts: 1, ..RpcSettings::default() })
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while rpc.request("eth_blockNumber", json!([])).await.is_err() {
            assert!(Instant::now() < deadline, "anvil did not answer on {url}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child, url, rpc }
    }

    pub async fn call(&self, method: &'static str, params: Value) -> Value {
        self.rpc.request(method, params).await.unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    pub async fn head(&self) -> u64 {
        let n = self.call("eth_blockNumber", json!([])).await;
        u64::from_str_radix(n.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
    }

    pub async fn mine(&self, blocks: u64) {
        self.call("anvil_mine", json!([format!("0x{blocks:x}")])).await;
    }

    /// Sends a transaction from `from`; returns its receipt (Anvil mines it at once).
    pub async fn send(&self, from: &str, to: Option<&str>, data: Vec<u8>) -> Value {
        let mut tx = json!({"from": from, "data": format!("0x{}", alloy_primitives::hex::encode(data)), "gas": "0x1000000"});
        if let Some(to) = to {
            tx["to"] = json!(to);
        }
        let hash = self.call("eth_sendTransaction", json!([tx])).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let receipt = loop {
            let receipt = self.call("eth_getTransactionReceipt", json!([hash])).await;
            if !receipt.is_null() {
                break receipt;
            }
            assert!(Instant::now() < deadline, "transaction {hash} was not mined");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(receipt["status"], "0x1", "transaction failed: {receipt}");
        receipt
    }

    /// Deploys a compiled test contract; returns its address (lowercase).
    pub async fn deploy(&self, contract: &str, args: Vec<DynSolValue>) -> String {
        let path =
            format!("{}/tests/contracts/compiled/{contract}.json", env!("CARGO_MANIFEST_DIR"));
        let compiled: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut code =
            alloy_primitives::hex::decode(compiled["bytecode"].as_str().unwrap()).unwrap();
        if !args.is_empty() {
            code.extend(DynSolValue::Tuple(args).abi_encode_params());
        }
        let receipt = self.send(ALICE, None, code).await;
        receipt["contractAddress"].as_str().unwrap().to_ascii_lowercase()
    }

    /// Calls `signature` (`"transfer(address,uint256)"`) on `to` from `from`.
    pub async fn invoke(
        &self,
        from: &str,
        to: &str,
        signature: &str,
        args: Vec<DynSolValue>,
    ) -> Value {
        let function = Function::parse(signature).unwrap();
        let data = function.abi_encode_input(&args).unwrap();
        self.send(from, Some(to), data).await
    }

    /// Makes `calls` (`(from, to, signature, args)`) the transactions of one block, in order:
    /// mining waits while they are sent. Returns their receipts.
    pub async fn invoke_in_one_block(
        &self,
        calls: Vec<(&str, &str, &str, Vec<DynSolValue>)>,
    ) -> Vec<Value> {
        self.call("evm_setAutomine", json!([false])).await;
        let mut hashes = Vec::new();
        for (from, to, signature, args) in calls {
            let data = Function::parse(signature).unwrap().abi_encode_input(&args).unwrap();
            let tx = json!({"from": from, "to": to, "data": format!("0x{}", alloy_primitives::hex::encode(data)), "gas": "0x1000000"});
            hashes.push(self.call("eth_sendTransaction", json!([tx])).await);
        }
        self.call("evm_mine", json!([])).await;
        self.call("evm_setAutomine", json!([true])).await;
        let mut receipts = Vec::new();
        for hash in hashes {
            let receipt = self.call("eth_getTransactionReceipt", json!([hash])).await;
            assert_eq!(receipt["status"], "0x1", "transaction failed: {receipt}");
            receipts.push(receipt);
        }
        receipts
    }
}

pub fn address(text: &str) -> DynSolValue {
    DynSolValue::Address(text.parse::<Address>().unwrap())
}

pub fn uint(value: u128) -> DynSolValue {
    DynSolValue::Uint(U256::from(value), 256)
}

pub fn int(value: i128) -> DynSolValue {
    DynSolValue::Int(alloy_primitives::I256::try_from(value).unwrap(), 256)
}

pub fn text(value: &str) -> DynSolValue {
    DynSolValue::String(value.to_owned())
}

/// An embedded stream log in a temp dir with every EVM stream of `chain` created.
pub async fn stream_log(dir: &std::path::Path, chain: &str) -> Arc<dyn StreamLog> {
    let log: Arc<dyn StreamLog> =
        Arc::new(EmbeddedLog::open(&dir.join("log.redb"), Arc::new(SystemClock)).unwrap());
    let config = TopicConfig { partitions: 8, retention: Retention::default() };
    for entity in sluice_chains::records::ENTITIES {
        for zerolag in [false, true] {
            log.create_topic(&sluice_bus::topics::chain_stream(chain, entity, zerolag), config)
                .await
                .unwrap();
        }
    }
    log
}

/// Every record of a topic, parsed, in (partition, offset) order.
pub async fn records(log: &Arc<dyn StreamLog>, topic: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for (partition, range) in (0u32..).zip(log.offsets(topic).await.unwrap()) {
        let mut from = range.start;
        while from < range.end {
            let batch = log.read(topic, partition, from, 1000).await.unwrap();
            from = batch.last().map_or(range.end, |r| r.offset + 1);
            out.extend(
                batch.into_iter().map(|r| serde_json::from_slice::<Value>(&r.value).unwrap()),
            );
        }
    }
    out
}

/// A chain config for tests: chain `base`, depth finality, fast polling, from block 1.
pub fn config(url: &str, confirmations: u64) -> ChainConfig {
    let mut config = ChainConfig::new("base", url);
    config.finality = Finality::Depth(confirmations);
    config.start_block = StartBlock::Number(1);
    config.poll_interval = Duration::from_millis(20);
    config
}

pub fn positions(log: &Arc<dyn StreamLog>) -> Arc<LogPositions> {
    Arc::new(LogPositions::new(log.clone()))
}
