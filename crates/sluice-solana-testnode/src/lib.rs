//! A local Solana JSON-RPC node for tests: no Solana validator installs from the package
//! registries this project reaches, so the Solana ingester's tests run against this.
//!
//! It answers `getSlot`, `getBlocks`, `getBlock` (`encoding: "json"`) and `getGenesisHash`
//! (single calls and batches) over HTTP/1.1 on a loopback port, from one of two chains:
//!
//! - [`Chain::Fixtures`]: the real mainnet blocks of `crates/sluice-chains/tests/fixtures/solana`
//!   at their own slots (see the README there), every other slot skipped;
//! - [`Chain::Generated`]: deterministic blocks from a first slot on, one slot per
//!   `slot_ms` of wall time, every slot ending in 7 skipped, each block a few vote and
//!   transfer transactions signed by one of [`SIGNERS`].
//!
//! [`Faults`] injects what real nodes and providers do: skipped slots listed by `getBlocks`
//! (answered with -32007, -32009 or a provider's "skipped" -32004), a first "not available"
//! -32004 for every block, HTTP 429s and connections dropped without an answer.
//!
//! It runs on plain threads inside the test process (no async runtime): it keeps serving
//! while the `sluice` under test is killed and restarted, and each test sets its own faults.
//! Must not depend on any Sluice crate: it stands for a node, not for our code.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Value, json};

/// Solana mainnet-beta's genesis hash.
pub const MAINNET_GENESIS_HASH: &str = "5eykt4UsFv8P8NJdTREpY1vzqKqZKvdpKuc147dw2N9d";

/// Fee payers of the generated transfers.
pub const SIGNERS: [&str; 4] = [
    "A11ceSigner1111111111111111111111111111111",
    "BobSigner11111111111111111111111111111111",
    "CaroSigner111111111111111111111111111111111",
    "DaveSigner111111111111111111111111111111111",
];

const SYSTEM_PROGRAM: &str = "11111111111111111111111111111111";
const VOTE_PROGRAM: &str = "Vote111111111111111111111111111111111111111";
/// The slots between the committed slot and the head.
const FINALIZED_LAG: u64 = 4;

/// The real blocks, by slot.
const FIXTURES: [(u64, &str); 4] = [
    (
        1_021_085,
        include_str!("../../sluice-chains/tests/fixtures/solana/slot-1021085-votes-only.json"),
    ),
    (100_000_000, include_str!("../../sluice-chains/tests/fixtures/solana/slot-100000000.json")),
    (154_808_473, include_str!("../../sluice-chains/tests/fixtures/solana/slot-154808473-v0.json")),
    (
        241_043_141,
        include_str!(
            "../../sluice-chains/tests/fixtures/solana/slot-241043141-failed.jsonParsed.json"
        ),
    ),
];

/// Which blocks the node serves.
#[derive(Debug, Clone)]
pub enum Chain {
    /// The real blocks at their slots; the head is 40 slots past the last one.
    Fixtures,
    /// Generated blocks from `first_slot` to `last_slot`, the head moving one slot per
    /// `slot_ms` from the node's start (beginning at `first_slot + initial`); with `slot_ms`
    /// 0 it moves only by [`TestNode::advance`].
    Generated { first_slot: u64, last_slot: u64, initial: u64, slot_ms: u64 },
}

/// What goes wrong, on purpose.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// `getBlocks` also lists skipped slots, and `getBlock` answers them with the three
    /// ways nodes say "skipped".
    pub list_skipped: bool,
    /// The first `getBlock` of each block answers -32004 "Block not available".
    pub not_available_first: bool,
    /// Every n-th HTTP request reading the chain (`getSlot`, `getBlocks`, `getBlock`) is
    /// answered 429 (0: never).
    pub http_429_every: u64,
    /// Every n-th HTTP request reading the chain is closed without an answer (0: never).
    pub drop_every: u64,
}

/// A running node; stops serving when dropped.
#[derive(Debug)]
pub struct TestNode {
    pub url: String,
    state: Arc<State>,
}

#[derive(Debug)]
struct State {
    chain: Chain,
    genesis_hash: String,
    faults: Faults,
    started: Instant,
    advanced: AtomicU64,
    requests: AtomicU64,
    asked: Mutex<HashSet<u64>>,
    stopped: AtomicBool,
    /// The failed fixture block in `json` encoding (converted from `jsonParsed`).
    converted: String,
    /// `getBlock` calls answered with a block.
    blocks_served: AtomicU64,
}

impl TestNode {
    /// Starts a node on a free loopback port.
    ///
    /// # Panics
    /// When no port can be bound.
    pub fn start(chain: Chain, genesis_hash: &str, faults: Faults) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        let state = Arc::new(State {
            chain,
            genesis_hash: genesis_hash.to_owned(),
            faults,
            started: Instant::now(),
            advanced: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            asked: Mutex::new(HashSet::new()),
            stopped: AtomicBool::new(false),
            converted: json_from_parsed(FIXTURES[3].1),
            blocks_served: AtomicU64::new(0),
        });
        let serving = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if serving.stopped.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let state = serving.clone();
                std::thread::spawn(move || {
                    let _ = state.serve(stream);
                });
            }
        });
        Self { url, state }
    }

    /// The newest slot with `finalized` commitment now.
    pub fn finalized_slot(&self) -> u64 {
        self.state.committed()
    }

    /// Moves a generated chain's head `slots` further (one with `slot_ms` 0).
    pub fn advance(&self, slots: u64) {
        self.state.advanced.fetch_add(slots, Ordering::Relaxed);
    }

    /// `getBlock` calls answered with a block so far.
    pub fn blocks_served(&self) -> u64 {
        self.state.blocks_served.load(Ordering::Relaxed)
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::Relaxed);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
    }
}

/// Whether a generated chain has a block at `slot`.
pub fn is_produced(slot: u64) -> bool {
    slot % 10 != 7
}

/// The generated non-vote transactions of `slot`: (signature, fee payer), in block order.
pub fn transfers(slot: u64) -> Vec<(String, &'static str)> {
    (0..transactions_in(slot))
        .filter(|i| !is_vote(*i))
        .map(|i| (signature(slot, i), SIGNERS[((slot + i) % 4) as usize]))
        .collect()
}

fn transactions_in(slot: u64) -> u64 {
    3 + slot % 4
}

fn is_vote(index: u64) -> bool {
    index % 2 == 0
}

fn signature(slot: u64, index: u64) -> String {
    base58(&bytes(slot.wrapping_mul(1000).wrapping_add(index) ^ 0x5157, 64))
}

fn blockhash(slot: u64) -> String {
    base58(&bytes(slot ^ 0xb10c, 32))
}

/// Deterministic bytes from a seed (splitmix64).
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out.truncate(len);
    // No leading zero bytes: base58 would write them as '1's and change the length.
    if out[0] == 0 {
        out[0] = 1;
    }
    out
}

/// Bitcoin-alphabet base58, as Solana writes keys and signatures.
pub fn base58(input: &[u8]) -> String {
    sluice_core::base58::encode(input)
}

/// The `json` encoding of a `jsonParsed` block (see the fixtures' README for what is lost).
fn json_from_parsed(text: &str) -> String {
    let mut block: Value = serde_json::from_str(text).expect("the fixture is JSON");
    for entry in block["transactions"].as_array_mut().expect("transactions") {
        let message = &mut entry["transaction"]["message"];
        let keys = message["accountKeys"].as_array().expect("account keys").clone();
        let flag = |k: &Value, name: &str| k[name].as_bool().unwrap_or(false);
        let signed = keys.iter().filter(|k| flag(k, "signer")).count();
        let readonly_signed =
            keys.iter().filter(|k| flag(k, "signer") && !flag(k, "writable")).count();
        let readonly_unsigned =
            keys.iter().filter(|k| !flag(k, "signer") && !flag(k, "writable")).count();
        let pubkeys: Vec<String> =
            keys.iter().map(|k| k["pubkey"].as_str().expect("pubkey").to_owned()).collect();
        let index = |key: &str| pubkeys.iter().position(|p| p == key).expect("a known key");
        let compile = |instruction: &Value| {
            let program = index(instruction["programId"].as_str().expect("program id"));
            let accounts: Vec<usize> = instruction["accounts"]
                .as_array()
                .map(|list| list.iter().map(|a| index(a.as_str().expect("key"))).collect())
                .unwrap_or_default();
            json!({
                "programIdIndex": program,
                "accounts": accounts,
                "data": instruction["data"].as_str().unwrap_or(""),
                "stackHeight": instruction["stackHeight"],
            })
        };
        let instructions: Vec<Value> =
            message["instructions"].as_array().expect("instructions").iter().map(compile).collect();
        message["instructions"] = json!(instructions);
        message["accountKeys"] = json!(pubkeys);
        message["header"] = json!({
            "numRequiredSignatures": signed,
            "numReadonlySignedAccounts": readonly_signed,
            "numReadonlyUnsignedAccounts": readonly_unsigned,
        });
        if let Some(sets) = entry["meta"]["innerInstructions"].as_array_mut() {
            for set in sets {
                let compiled: Vec<Value> =
                    set["instructions"].as_array().expect("inner").iter().map(compile).collect();
                set["instructions"] = json!(compiled);
            }
        }
    }
    block.to_string()
}

impl State {
    fn head(&self) -> u64 {
        match &self.chain {
            Chain::Fixtures => FIXTURES[3].0 + 40,
            Chain::Generated { first_slot, last_slot, initial, slot_ms } => {
                let moved = if *slot_ms == 0 {
                    self.advanced.load(Ordering::Relaxed)
                } else {
                    self.started.elapsed().as_millis() as u64 / slot_ms
                };
                (first_slot + initial + moved).min(*last_slot)
            }
        }
    }

    fn committed(&self) -> u64 {
        self.head().saturating_sub(FINALIZED_LAG)
    }

    /// The newest slot with the commitment a call's config names (`finalized` by default).
    fn at_commitment(&self, config: &Value) -> u64 {
        match config["commitment"].as_str() {
            Some("processed") => self.head(),
            Some("confirmed") => self.head().saturating_sub(1),
            _ => self.committed(),
        }
    }

    fn first_slot(&self) -> u64 {
        match &self.chain {
            Chain::Fixtures => 0,
            Chain::Generated { first_slot, .. } => *first_slot,
        }
    }

    fn produced(&self, slot: u64) -> bool {
        match &self.chain {
            Chain::Fixtures => FIXTURES.iter().any(|(s, _)| *s == slot),
            Chain::Generated { .. } => slot >= self.first_slot() && is_produced(slot),
        }
    }

    fn serve(&self, stream: TcpStream) -> std::io::Result<()> {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                break;
            }
            if let Some((name, value)) = trimmed.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let mut stream = stream;
        // Faults hit the chain's reads, not the probes a start makes (`getGenesisHash`, and
        // an `eth_blockNumber` reachability check): a test restarts its server at any point,
        // and each start must get past them.
        let text = String::from_utf8_lossy(&body);
        let reads_chain = text.contains("\"getSlot\"") || text.contains("\"getBlock");
        if reads_chain {
            let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
            if self.faults.drop_every > 0 && n % self.faults.drop_every == 0 {
                return stream.shutdown(std::net::Shutdown::Both);
            }
            if self.faults.http_429_every > 0 && n % self.faults.http_429_every == 0 {
                let text = "rate limited";
                return write!(
                    stream,
                    "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
            }
        }
        let answer = match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Array(calls)) => {
                let answers: Vec<String> = calls.iter().map(|call| self.answer(call)).collect();
                format!("[{}]", answers.join(","))
            }
            Ok(call) => self.answer(&call),
            Err(_) => {
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#
                    .to_owned()
            }
        };
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            answer.len()
        )?;
        stream.write_all(answer.as_bytes())
    }

    fn answer(&self, call: &Value) -> String {
        let id = call.get("id").cloned().unwrap_or(Value::Null);
        let params = call.get("params").cloned().unwrap_or(Value::Null);
        let result = match call.get("method").and_then(Value::as_str).unwrap_or("") {
            "getGenesisHash" => Ok(json!(self.genesis_hash).to_string()),
            "getSlot" => Ok(self.at_commitment(&params[0]).to_string()),
            "getBlocks" => self.blocks(&params),
            "getBlock" => self.block(&params),
            _ => Err((-32601, "Method not found".to_owned())),
        };
        match result {
            Ok(text) => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{text}}}"#),
            Err((code, message)) => {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
                    .to_string()
            }
        }
    }

    fn blocks(&self, params: &Value) -> Result<String, (i64, String)> {
        let start = params[0].as_u64().ok_or((-32602, "Invalid params".to_owned()))?;
        let committed = self.at_commitment(&params[2]);
        let end = params[1].as_u64().unwrap_or(committed).min(committed);
        if end.saturating_sub(start) > 500_000 {
            return Err((-32602, "Slot range too large; max 500000".to_owned()));
        }
        let slots: Vec<u64> = match &self.chain {
            Chain::Fixtures => {
                FIXTURES.iter().map(|(s, _)| *s).filter(|s| (start..=end).contains(s)).collect()
            }
            Chain::Generated { .. } => (start.max(self.first_slot())..=end)
                .filter(|s| is_produced(*s) || self.faults.list_skipped)
                .collect(),
        };
        Ok(json!(slots).to_string())
    }

    fn block(&self, params: &Value) -> Result<String, (i64, String)> {
        let slot = params[0].as_u64().ok_or((-32602, "Invalid params".to_owned()))?;
        if params[1]["encoding"] != "json" || params[1]["maxSupportedTransactionVersion"] != 0 {
            return Err((-32602, "this test node serves encoding json, version 0".to_owned()));
        }
        if slot > self.at_commitment(&params[1]) {
            return Err((-32004, format!("Block not available for slot {slot}")));
        }
        if !self.produced(slot) {
            return Err(match slot % 3 {
                0 => (
                    -32007,
                    format!(
                        "Slot {slot} was skipped, or missing due to ledger jump to recent snapshot"
                    ),
                ),
                1 => (-32009, format!("Slot {slot} was skipped, or missing in long-term storage")),
                _ => (-32004, format!("Block not available for slot {slot}: slot was skipped")),
            });
        }
        if self.faults.not_available_first
            && self.asked.lock().expect("never poisoned").insert(slot)
        {
            return Err((-32004, format!("Block not available for slot {slot}")));
        }
        self.blocks_served.fetch_add(1, Ordering::Relaxed);
        Ok(match &self.chain {
            Chain::Fixtures if slot == FIXTURES[3].0 => self.converted.clone(),
            Chain::Fixtures => {
                FIXTURES.iter().find(|(s, _)| *s == slot).expect("produced").1.to_owned()
            }
            Chain::Generated { .. } => generated_block(slot, self.first_slot()).to_string(),
        })
    }
}

fn generated_block(slot: u64, first_slot: u64) -> Value {
    let parent =
        (first_slot..slot).rev().find(|s| is_produced(*s)).unwrap_or(slot.saturating_sub(1));
    let transactions: Vec<Value> = (0..transactions_in(slot))
        .map(|index| {
            let signature = signature(slot, index);
            if is_vote(index) {
                let voter = base58(&bytes(slot * 7 + index, 32));
                json!({
                    "transaction": {
                        "signatures": [signature],
                        "message": {
                            "accountKeys": [voter, base58(&bytes(index + 99, 32)),
                                "SysvarS1otHashes111111111111111111111111111",
                                "SysvarC1ock11111111111111111111111111111111", VOTE_PROGRAM],
                            "header": {"numRequiredSignatures": 1, "numReadonlySignedAccounts": 0,
                                "numReadonlyUnsignedAccounts": 3},
                            "instructions": [{"programIdIndex": 4, "accounts": [1, 2, 3, 0],
                                "data": "2ZjTR1vUs2pHXyTM4rXr", "stackHeight": null}],
                            "recentBlockhash": blockhash(parent),
                        }
                    },
                    "meta": {"err": null, "fee": 5000, "preBalances": [1, 2, 1, 1, 1],
                        "postBalances": [1, 2, 1, 1, 1], "innerInstructions": [],
                        "logMessages": ["Program Vote111111111111111111111111111111111111111 invoke [1]",
                            "Program Vote111111111111111111111111111111111111111 success"],
                        "preTokenBalances": [], "postTokenBalances": [], "rewards": null,
                        "loadedAddresses": {"writable": [], "readonly": []},
                        "status": {"Ok": null}, "computeUnitsConsumed": 2100},
                    "version": "legacy",
                })
            } else {
                let signer = SIGNERS[((slot + index) % 4) as usize];
                let recipient = base58(&bytes(slot * 13 + index, 32));
                json!({
                    "transaction": {
                        "signatures": [signature],
                        "message": {
                            "accountKeys": [signer, recipient, SYSTEM_PROGRAM],
                            "header": {"numRequiredSignatures": 1, "numReadonlySignedAccounts": 0,
                                "numReadonlyUnsignedAccounts": 1},
                            "instructions": [{"programIdIndex": 2, "accounts": [0, 1],
                                "data": "3Bxs4h24hBtQy9rw", "stackHeight": null}],
                            "recentBlockhash": blockhash(parent),
                        }
                    },
                    "meta": {"err": null, "fee": 5000,
                        "preBalances": [1_000_000_000u64, 0, 1], "postBalances": [999_994_000u64, 1000, 1],
                        "innerInstructions": [],
                        "logMessages": ["Program 11111111111111111111111111111111 invoke [1]",
                            "Program 11111111111111111111111111111111 success"],
                        "preTokenBalances": [], "postTokenBalances": [], "rewards": null,
                        "loadedAddresses": {"writable": [], "readonly": []},
                        "status": {"Ok": null}, "computeUnitsConsumed": 150},
                    "version": "legacy",
                })
            }
        })
        .collect();
    json!({
        "blockHeight": slot - slot / 10,
        "blockTime": 1_700_000_000 + slot * 2 / 5,
        "blockhash": blockhash(slot),
        "parentSlot": parent,
        "previousBlockhash": blockhash(parent),
        "transactions": transactions,
    })
}
