//! The chain-ingest benchmark's two halves (`scripts/bench-chains` drives them):
//!
//! - `fill URL BLOCKS TXS_PER_BLOCK PER_TX`: deploys the test ERC-20 on a node (Anvil started
//!   with `--no-mining`) and mines `BLOCKS` blocks of `TXS_PER_BLOCK` transactions (explicit
//!   nonces, then `evm_mine`), each of `PER_TX` transfers (`mintMany`).
//! - `ingest URL all|erc20`: runs the ingester from block 1 to the head (finality depth 0)
//!   into an embedded stream log in a temp dir (durable appends), and prints one JSON line:
//!   blocks, records, seconds, blocks per second.
//! - `latency URL SAMPLES POLL_MS`: with the ingester following the tip (polling every
//!   `POLL_MS`), mines one block with one transfer at a random moment, `SAMPLES` times, and
//!   measures from `evm_mine`'s answer to the transfer's record being readable in the
//!   `.zerolag` stream; prints p50, p99 and max in milliseconds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy_dyn_abi::{DynSolValue, JsonAbiExt};
use alloy_primitives::{Address, U256};
use serde_json::{Value, json};
use sluice_bus::{EmbeddedLog, Retention, StreamLog, TopicConfig};
use sluice_chains::rpc::{Call, RpcClient, RpcSettings};
use sluice_chains::{ChainConfig, Finality, Ingester, LogPositions, StartBlock};
use sluice_core::clock::SystemClock;

/// The allocator `sluice serve` runs with (crates/sluice/src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ALICE: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("fill") => {
            let number = |i: usize| args[i].parse::<usize>().unwrap();
            fill(&args[1], number(2), number(3), number(4)).await;
        }
        Some("ingest") => ingest(&args[1], &args[2]).await,
        Some("latency") => {
            let ws_url = args.get(4).cloned();
            latency(&args[1], args[2].parse().unwrap(), args[3].parse().unwrap(), ws_url).await;
        }
        _ => {
            panic!(
                "usage: chain_bench fill URL BLOCKS TXS_PER_BLOCK PER_TX | ingest URL all|erc20 \
                 | latency URL SAMPLES POLL_MS [WS_URL]"
            )
        }
    }
}

async fn fill(url: &str, blocks: usize, per_block: usize, per_tx: usize) {
    let rpc = RpcClient::new(url, RpcSettings::default()).unwrap();
    let path = format!("{}/tests/contracts/compiled/TestToken.json", env!("CARGO_MANIFEST_DIR"));
    let compiled: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut code = alloy_primitives::hex::decode(compiled["bytecode"].as_str().unwrap()).unwrap();
    code.extend(
        DynSolValue::Tuple(vec![
            DynSolValue::String("USD Coin".into()),
            DynSolValue::String("USDC".into()),
            DynSolValue::Uint(U256::from(6u8), 256),
        ])
        .abi_encode_params(),
    );
    let nonce = rpc.request("eth_getTransactionCount", json!([ALICE, "pending"])).await.unwrap();
    let mut nonce =
        u64::from_str_radix(nonce.as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    let hash = rpc
        .request(
            "eth_sendTransaction",
            json!([{"from": ALICE, "data": hex(&code), "gas": "0x1000000", "nonce": format!("0x{nonce:x}")}]),
        )
        .await
        .unwrap();
    nonce += 1;
    rpc.request("evm_mine", json!([])).await.unwrap();
    let receipt = rpc.request("eth_getTransactionReceipt", json!([hash])).await.unwrap();
    let token = receipt["contractAddress"].as_str().unwrap().to_owned();
    let function = alloy_json_abi::Function::parse("mintMany(address[],uint256)").unwrap();
    let started = Instant::now();
    let mut transfer = 0usize;
    for _ in 0..blocks {
        let calls = (0..per_block)
            .map(|_| {
                let recipients = (0..per_tx)
                    .map(|_| {
                        transfer += 1;
                        DynSolValue::Address(Address::from_word(U256::from(transfer).into()))
                    })
                    .collect();
                let data = function
                    .abi_encode_input(&[DynSolValue::Array(recipients), DynSolValue::Uint(U256::from(transfer), 256)])
                    .unwrap();
                let tx = json!([{"from": ALICE, "to": token, "data": hex(&data), "gas": "0x1000000", "nonce": format!("0x{nonce:x}")}]);
                nonce += 1;
                Call::new("eth_sendTransaction", tx)
            })
            .collect();
        for answer in rpc.batch(calls).await.unwrap() {
            answer.unwrap();
        }
        rpc.request("evm_mine", json!([])).await.unwrap();
    }
    let head = rpc.request("eth_blockNumber", json!([])).await.unwrap();
    println!(
        "{}",
        json!({"token": token, "blocks": blocks, "transfers": transfer, "head": head, "seconds": started.elapsed().as_secs_f64()})
    );
}

async fn ingest(url: &str, entities: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn StreamLog> =
        Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), Arc::new(SystemClock)).unwrap());
    let mut config = ChainConfig::new("base", url);
    config.finality = Finality::Depth(0);
    config.start_block = StartBlock::Number(1);
    config.poll_interval = Duration::from_millis(5);
    if entities == "erc20" {
        config.entities = vec![("erc20_token_transfer".to_owned(), false)];
    }
    let topic = TopicConfig { partitions: 8, retention: Retention::default() };
    for (entity, zerolag) in &config.entities {
        log.create_topic(&sluice_bus::topics::chain_stream("base", entity, false), topic)
            .await
            .unwrap();
        if *zerolag {
            log.create_topic(&sluice_bus::topics::chain_stream("base", entity, true), topic)
                .await
                .unwrap();
        }
    }
    let status = Ingester::status_for(&config);
    let names: Vec<String> = config.entities.iter().map(|(e, _)| e.clone()).collect();
    let mut ingester =
        Ingester::new(config, Arc::new(LogPositions::new(log.clone())), status.clone()).unwrap();
    let started = Instant::now();
    // The node is not mining: the head the first step reads is the end. (The ingester's own
    // RPC client reads it: a second client would add its TLS set-up, ~35 ms, to the wall time.)
    let head = loop {
        ingester.step().await.unwrap();
        let snapshot = status.snapshot();
        if let Some(head) = snapshot.head.filter(|head| snapshot.ingested >= Some(*head)) {
            break head;
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut records = 0u64;
    for entity in names {
        for range in
            log.offsets(&sluice_bus::topics::chain_stream("base", &entity, false)).await.unwrap()
        {
            records += range.end - range.start;
        }
    }
    let snapshot = status.snapshot();
    println!(
        "{}",
        json!({"entities": entities, "blocks": head, "finalized_records": records, "seconds": seconds,
               "blocks_per_second": head as f64 / seconds, "rpc_requests": snapshot.rpc_requests})
    );
}

async fn latency(url: &str, samples: usize, poll_ms: u64, ws_url: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn StreamLog> =
        Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), Arc::new(SystemClock)).unwrap());
    let mut config = ChainConfig::new("base", url);
    config.finality = Finality::Depth(10);
    config.start_block = StartBlock::Latest;
    config.poll_interval = Duration::from_millis(poll_ms);
    config.ws_url = ws_url;
    config.entities = vec![("erc20_token_transfer".to_owned(), true)];
    let topic = TopicConfig { partitions: 8, retention: Retention::default() };
    for zerolag in [false, true] {
        let name = sluice_bus::topics::chain_stream("base", "erc20_token_transfer", zerolag);
        log.create_topic(&name, topic).await.unwrap();
    }
    let rpc = RpcClient::new(url, RpcSettings::default()).unwrap();
    let token = rpc
        .request("eth_getTransactionReceipt", json!([latest_tx(&rpc).await]))
        .await
        .unwrap()["to"]
        .as_str()
        .unwrap()
        .to_owned();
    let status = Ingester::status_for(&config);
    let ingester =
        Ingester::new(config, Arc::new(LogPositions::new(log.clone())), status.clone()).unwrap();
    let task = tokio::spawn(ingester.run());
    let zerolag = sluice_bus::topics::chain_stream("base", "erc20_token_transfer", true);
    let count = |log: Arc<dyn StreamLog>, topic: String| async move {
        log.offsets(&topic).await.unwrap().iter().map(|r| r.end).sum::<u64>()
    };
    // Let the ingester reach the tip first.
    while status.snapshot().zerolag_ingested.is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let function = alloy_json_abi::Function::parse("mint(address,uint256)").unwrap();
    let mut millis = Vec::with_capacity(samples);
    for i in 0..samples {
        tokio::time::sleep(Duration::from_millis(rand_ms(i, poll_ms))).await;
        let before = count(log.clone(), zerolag.clone()).await;
        let data = function
            .abi_encode_input(&[
                DynSolValue::Address(Address::from_word(U256::from(7u8).into())),
                DynSolValue::Uint(U256::from(1u8), 256),
            ])
            .unwrap();
        rpc.request(
            "eth_sendTransaction",
            json!([{"from": ALICE, "to": token, "data": hex(&data), "gas": "0x100000"}]),
        )
        .await
        .unwrap();
        rpc.request("evm_mine", json!([])).await.unwrap();
        let mined = Instant::now();
        let mut watch = log.watch(&zerolag);
        while count(log.clone(), zerolag.clone()).await <= before {
            watch.wait(Duration::from_millis(5)).await;
        }
        millis.push(mined.elapsed().as_secs_f64() * 1000.0);
    }
    task.abort();
    millis.sort_by(f64::total_cmp);
    let at =
        |q: f64| millis[((millis.len() as f64 * q).ceil() as usize).clamp(1, millis.len()) - 1];
    println!(
        "{}",
        json!({"samples": samples, "poll_ms": poll_ms, "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": millis[millis.len() - 1]})
    );
}

/// A spread of waits over two poll intervals, the same every run.
fn rand_ms(i: usize, poll_ms: u64) -> u64 {
    (i as u64 * 7919) % (2 * poll_ms.max(1))
}

/// The hash of the newest transaction (the benchmark's last `mintMany`).
async fn latest_tx(rpc: &RpcClient) -> Value {
    let block = rpc.request("eth_getBlockByNumber", json!(["latest", false])).await.unwrap();
    block["transactions"][0].clone()
}

fn hex(bytes: &[u8]) -> String {
    format!("0x{}", alloy_primitives::hex::encode(bytes))
}
