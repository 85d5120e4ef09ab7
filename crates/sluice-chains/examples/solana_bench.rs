//! The Solana ingester's own work, from `getBlock` JSON to durable records: BENCHMARKS.md's
//! Solana section and `scripts/bench-solana`.
//!
//! ```text
//! solana_bench corpus FILE BLOCKS   # writes BLOCKS getBlock results, one per line
//! solana_bench run FILE ROUNDS      # reads them into records, appended durably
//! ```
//!
//! The corpus is made of the real mainnet transactions of `tests/fixtures/solana` (the votes
//! of slots 100,000,000 and 1,021,085; the legacy non-votes of slot 100,000,000 and the
//! version-0 one of slot 154,808,473), each copy with a signature of its own: 900 votes and
//! 450 non-votes per block, about a mainnet block's mix.
//!
//! `run` does per block what the ingester does with an answer (`solana::records::build`),
//! and appends each 32 blocks' records in one durable append to an embedded stream log of 8
//! partitions (fsync per append), as a step does. One thread of work: run it under
//! `taskset -c 0` for one core.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use sluice_bus::{EmbeddedLog, Retention, StreamLog, TopicConfig};
use sluice_chains::sink::{ChainSink, LogPositions};
use sluice_chains::solana::block::Block;
use sluice_chains::solana::records;
use sluice_core::clock::SystemClock;

#[path = "../../sluice-runtime/examples/common/cpu.rs"]
mod cpu;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const VOTES_PER_BLOCK: usize = 900;
const NON_VOTES_PER_BLOCK: usize = 450;
const BLOCKS_PER_APPEND: usize = 32;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/solana/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A base58 signature of 88 characters made from `n`.
fn signature(n: u64) -> String {
    const ALPHABET: &[u8] = b"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
    let mut out = String::with_capacity(88);
    let mut state = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    out.push('5');
    while out.len() < 88 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.push(char::from(ALPHABET[(state % 58) as usize]));
    }
    out
}

fn corpus(path: &str, blocks: usize) {
    let legacy = fixture("slot-100000000.json");
    let v0 = fixture("slot-154808473-v0.json");
    let early = fixture("slot-1021085-votes-only.json");
    let is_vote = |tx: &Value| {
        let message = &tx["transaction"]["message"];
        let keys = message["accountKeys"].as_array().unwrap();
        let instructions = message["instructions"].as_array().unwrap();
        instructions.len() == 1
            && keys[instructions[0]["programIdIndex"].as_u64().unwrap() as usize]
                == "Vote111111111111111111111111111111111111111"
    };
    let all: Vec<Value> = [&legacy, &v0, &early]
        .iter()
        .flat_map(|b| b["transactions"].as_array().unwrap().clone())
        .collect();
    let votes: Vec<&Value> = all.iter().filter(|t| is_vote(t)).collect();
    let others: Vec<&Value> = all.iter().filter(|t| !is_vote(t)).collect();
    let mut out = String::new();
    let mut n = 0u64;
    for index in 0..blocks {
        let slot = 300_000_000 + index as u64;
        let mut block = legacy.clone();
        block["parentSlot"] = Value::from(slot - 1);
        block["blockHeight"] = Value::from(slot - 20_000_000);
        block["blockTime"] = Value::from(1_760_000_000 + index as u64);
        block.as_object_mut().unwrap().remove("rewards");
        let mut transactions = Vec::with_capacity(VOTES_PER_BLOCK + NON_VOTES_PER_BLOCK);
        for i in 0..VOTES_PER_BLOCK + NON_VOTES_PER_BLOCK {
            // Two votes, then a non-vote, as a block interleaves them.
            let mut tx = if i % 3 == 2 {
                others[i % others.len()].clone()
            } else {
                votes[i % votes.len()].clone()
            };
            n += 1;
            tx["transaction"]["signatures"][0] = Value::from(signature(n));
            if tx.get("version").is_none() {
                tx["version"] = Value::from("legacy");
            }
            transactions.push(tx);
        }
        block["transactions"] = Value::from(transactions);
        out.push_str(&block.to_string());
        out.push('\n');
    }
    std::fs::write(path, out).unwrap();
}

async fn run(path: &str, rounds: usize) {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    for round in 0..rounds {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn StreamLog> = Arc::new(
            EmbeddedLog::open(&dir.path().join("log.redb"), Arc::new(SystemClock)).unwrap(),
        );
        let topic = TopicConfig { partitions: 8, retention: Retention::default() };
        log.create_topic(
            &sluice_bus::topics::chain_stream("solana", records::ENTITY, false),
            topic,
        )
        .await
        .unwrap();
        let sink = LogPositions::new(log.clone());
        let started = Instant::now();
        let cpu_started = cpu::process_cpu_secs();
        let (mut count, mut bytes, mut build_seconds) = (0usize, 0usize, 0.0f64);
        // The ingester's step: `max_concurrency × max_batch` blocks (32 by default).
        let per_append = std::env::var("SOLANA_BENCH_BLOCKS_PER_APPEND")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(BLOCKS_PER_APPEND);
        for (chunk_index, chunk) in lines.chunks(per_append).enumerate() {
            let built = Instant::now();
            let mut appended = Vec::new();
            for (i, line) in chunk.iter().enumerate() {
                let slot = 300_000_000 + (chunk_index * per_append + i) as u64;
                let block = records::build(slot, line, None).unwrap();
                appended.extend(block.records);
            }
            build_seconds += built.elapsed().as_secs_f64();
            count += appended.len();
            bytes += appended.iter().map(|r| r.value().len()).sum::<usize>();
            sink.append("solana", records::ENTITY, false, appended).await.unwrap();
        }
        let seconds = started.elapsed().as_secs_f64();
        let cpu_seconds = cpu::process_cpu_secs() - cpu_started;
        let input: usize = lines.iter().map(|l| l.len()).sum();
        // Not part of the timed work: reading the answers into the borrowed block alone.
        let parsed = Instant::now();
        for line in &lines {
            let block: Block<'_> = serde_json::from_str(line).unwrap();
            std::hint::black_box(&block);
        }
        let parse_seconds = parsed.elapsed().as_secs_f64();
        println!(
            "{{\"tool\": \"sluice\", \"round\": {round}, \"non_vote_transactions\": {count}, \"seconds\": {seconds:.4}, \"per_second\": {:.0}, \"cpu_seconds\": {cpu_seconds:.2}, \"build_seconds\": {build_seconds:.4}, \"append_seconds\": {:.4}, \"parse_only_seconds\": {parse_seconds:.4}, \"input_mb\": {:.1}, \"records_mb\": {:.1}}}",
            count as f64 / seconds,
            seconds - build_seconds,
            input as f64 / 1e6,
            bytes as f64 / 1e6
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("corpus") => corpus(&args[2], args[3].parse().unwrap()),
        Some("run") => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .max_blocking_threads(1)
                .build()
                .unwrap();
            runtime.block_on(run(&args[2], args.get(3).and_then(|r| r.parse().ok()).unwrap_or(3)));
        }
        _ => eprintln!("usage: solana_bench corpus FILE BLOCKS | run FILE ROUNDS"),
    }
}
