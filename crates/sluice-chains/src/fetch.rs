//! Reading blocks and their logs: `eth_getLogs` over a block range sized adaptively, then the
//! range's blocks in one batch (with their transactions only when they have logs, for the
//! `from_address`/`to_address` of `log` records).
//!
//! Providers cap `eth_getLogs` by range and by result size, each differently: a "too many
//! results"/range error halves the range and the call is made again; a range that came back
//! with few logs doubles the next one, up to the configured maximum.

use std::collections::HashMap;

use alloy_primitives::B256;
use serde_json::{Value, json};

use crate::ChainError;
use crate::rpc::{Call, RpcClient};

/// Logs per range the adaptive sizing aims at: under half of it the range grows, over twice
/// it shrinks (providers commonly cap one answer at 10,000 logs).
const CHEAP_LOGS: usize = 10_000;

/// What a block contributes: its header, its logs and the senders/recipients of the
/// transactions that emitted them.
#[derive(Debug, Clone)]
pub struct FetchedBlock {
    pub header: Header,
    pub logs: Vec<RawLog>,
    /// transaction hash → (from, to).
    pub transactions: HashMap<String, (String, Option<String>)>,
}

/// What the finality and reorg bookkeeping needs of a block.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Header {
    pub number: u64,
    pub hash: String,
    pub parent_hash: String,
    /// Unix seconds.
    pub timestamp: i64,
}

/// One log as the node sent it (hex lowercased).
#[derive(Debug, Clone)]
pub struct RawLog {
    pub address: String,
    pub topics: Vec<B256>,
    pub data: Vec<u8>,
    pub block_number: u64,
    pub block_hash: String,
    pub transaction_hash: String,
    pub transaction_index: u64,
    pub log_index: u64,
}

/// The adaptive `eth_getLogs` range.
#[derive(Debug, Clone)]
pub struct RangeSizer {
    current: u64,
    max: u64,
}

impl RangeSizer {
    pub fn new(max: u64) -> Self {
        let max = max.max(1);
        Self { current: max.min(100), max }
    }

    pub fn current(&self) -> u64 {
        self.current
    }

    fn shrink(&mut self) -> bool {
        if self.current == 1 {
            return false;
        }
        self.current = (self.current / 2).max(1);
        true
    }

    fn observe(&mut self, span: u64, logs: usize) {
        if logs < CHEAP_LOGS / 2 && span == self.current {
            self.current = (self.current * 2).min(self.max);
        } else if logs > CHEAP_LOGS * 2 {
            self.current = (self.current / 2).max(1);
        }
    }
}

/// The head block number.
///
/// # Errors
/// RPC failures.
pub async fn block_number(rpc: &RpcClient) -> Result<u64, ChainError> {
    let value = rpc.request("eth_blockNumber", json!([])).await?;
    quantity(&value).ok_or_else(|| malformed("eth_blockNumber", "not a hex quantity"))
}

/// The header of a block by tag (`finalized`, `latest`) or number; `None` when the node has
/// no such block.
///
/// # Errors
/// RPC failures.
pub async fn header(rpc: &RpcClient, block: Value) -> Result<Option<Header>, ChainError> {
    let value = rpc.request("eth_getBlockByNumber", json!([block, false])).await?;
    if value.is_null() {
        return Ok(None);
    }
    parse_header(&value).map(Some)
}

/// Headers of many blocks by number, in one batch; `None` for blocks the node lacks.
///
/// # Errors
/// RPC failures.
pub async fn headers(rpc: &RpcClient, numbers: &[u64]) -> Result<Vec<Option<Header>>, ChainError> {
    let calls = numbers
        .iter()
        .map(|n| Call::new("eth_getBlockByNumber", json!([hex_quantity(*n), false])))
        .collect();
    rpc.batch(calls)
        .await?
        .into_iter()
        .map(|answer| {
            let value = answer.map_err(|e| ChainError::Node {
                method: "eth_getBlockByNumber",
                code: e.code,
                message: e.message,
            })?;
            if value.is_null() { Ok(None) } else { parse_header(&value).map(Some) }
        })
        .collect()
}

/// Up to `parallel` consecutive ranges from `from` (each of the sizer's current size, none
/// past `to`), read concurrently, as one checked run of blocks. A range that came back
/// shorter (its size halved on a provider's error) ends the run there; the sizer keeps the
/// smallest size any range used.
///
/// # Errors
/// As [`blocks`].
pub async fn ranges(
    rpc: &RpcClient,
    sizer: &mut RangeSizer,
    from: u64,
    to: u64,
    parallel: usize,
    with_transactions: bool,
) -> Result<Vec<FetchedBlock>, ChainError> {
    let size = sizer.current();
    let mut starts = Vec::new();
    let mut start = from;
    while start <= to && starts.len() < parallel.max(1) {
        starts.push(start);
        start = start.saturating_add(size);
    }
    let mut sizers: Vec<RangeSizer> = starts.iter().map(|_| sizer.clone()).collect();
    let reads = starts.iter().zip(sizers.iter_mut()).map(|(start, sizer)| {
        let end = to.min(start.saturating_add(size - 1));
        blocks(rpc, sizer, *start, end, with_transactions)
    });
    let results = futures_util::future::join_all(reads).await;
    let mut run: Vec<FetchedBlock> = Vec::new();
    for (result, start) in results.into_iter().zip(&starts) {
        let Ok(chunk) = result else {
            if run.is_empty() {
                return result;
            }
            break;
        };
        let expected = run.last().map_or(from, |b| b.header.number + 1);
        if *start != expected {
            break;
        }
        if let (Some(last), Some(first)) = (run.last(), chunk.first()) {
            if first.header.parent_hash != last.header.hash {
                return Err(ChainError::Inconsistent { from, to });
            }
        }
        run.extend(chunk);
    }
    if let Some(smallest) = sizers.into_iter().min_by_key(RangeSizer::current) {
        *sizer = smallest;
    }
    Ok(run)
}

/// Blocks `from..=` up to `to` (fewer when the range sizer says so), checked consistent:
/// every log's block hash is its block's, and each block's parent is the previous one. With
/// `with_transactions`, blocks that have logs are read with their transactions (for `log`'s
/// sender and recipient).
///
/// # Errors
/// RPC failures; [`ChainError::Inconsistent`] when the node's chain changed under the reads.
pub async fn blocks(
    rpc: &RpcClient,
    sizer: &mut RangeSizer,
    from: u64,
    to: u64,
    with_transactions: bool,
) -> Result<Vec<FetchedBlock>, ChainError> {
    let (to, logs) = loop {
        let end = to.min(from + sizer.current() - 1);
        let filter = json!([{"fromBlock": hex_quantity(from), "toBlock": hex_quantity(end)}]);
        match rpc.call(Call::new("eth_getLogs", filter)).await? {
            Ok(value) => {
                let logs = parse_logs(&value)?;
                sizer.observe(end - from + 1, logs.len());
                break (end, logs);
            }
            Err(error) if error.is_range_too_large() && sizer.shrink() => {
                tracing::debug!(from, end, message = %error.message, "eth_getLogs range too large; halving");
            }
            Err(error) => {
                return Err(ChainError::Node {
                    method: "eth_getLogs",
                    code: error.code,
                    message: error.message,
                });
            }
        }
    };
    let mut by_block: HashMap<u64, Vec<RawLog>> = HashMap::new();
    for log in logs {
        by_block.entry(log.block_number).or_default().push(log);
    }
    let calls = (from..=to)
        .map(|n| {
            let full = with_transactions && by_block.contains_key(&n);
            Call::new("eth_getBlockByNumber", json!([hex_quantity(n), full]))
        })
        .collect();
    let answers = rpc.batch(calls).await?;
    let mut blocks = Vec::with_capacity(answers.len());
    for (number, answer) in (from..=to).zip(answers) {
        let value = answer.map_err(|e| ChainError::Node {
            method: "eth_getBlockByNumber",
            code: e.code,
            message: e.message,
        })?;
        if value.is_null() {
            // Behind a load balancer, one node may not have the head another reported.
            return Err(ChainError::Inconsistent { from, to });
        }
        let header = parse_header(&value)?;
        if header.number != number {
            return Err(malformed("eth_getBlockByNumber", "a block of another number"));
        }
        let mut logs = by_block.remove(&number).unwrap_or_default();
        logs.sort_by_key(|log| log.log_index);
        if logs.iter().any(|log| log.block_hash != header.hash) {
            return Err(ChainError::Inconsistent { from, to });
        }
        let transactions =
            if logs.is_empty() { HashMap::new() } else { parse_transactions(&value) };
        if let Some(previous) = blocks.last().map(|b: &FetchedBlock| &b.header) {
            if header.parent_hash != previous.hash {
                return Err(ChainError::Inconsistent { from, to });
            }
        }
        blocks.push(FetchedBlock { header, logs, transactions });
    }
    Ok(blocks)
}

fn malformed(method: &'static str, reason: &str) -> ChainError {
    ChainError::Malformed { method, reason: reason.to_owned() }
}

pub fn hex_quantity(n: u64) -> String {
    format!("0x{n:x}")
}

fn quantity(value: &Value) -> Option<u64> {
    u64::from_str_radix(value.as_str()?.strip_prefix("0x")?, 16).ok()
}

fn lower(value: Option<&Value>) -> Option<String> {
    value.and_then(Value::as_str).map(str::to_ascii_lowercase)
}

fn parse_header(value: &Value) -> Result<Header, ChainError> {
    let bad = || malformed("eth_getBlockByNumber", "a block without number, hash, parent or time");
    Ok(Header {
        number: value.get("number").and_then(quantity).ok_or_else(bad)?,
        hash: lower(value.get("hash")).ok_or_else(bad)?,
        parent_hash: lower(value.get("parentHash")).ok_or_else(bad)?,
        timestamp: value
            .get("timestamp")
            .and_then(quantity)
            .and_then(|t| i64::try_from(t).ok())
            .ok_or_else(bad)?,
    })
}

fn parse_transactions(block: &Value) -> HashMap<String, (String, Option<String>)> {
    let Some(transactions) = block.get("transactions").and_then(Value::as_array) else {
        return HashMap::new();
    };
    transactions
        .iter()
        .filter_map(|tx| {
            let hash = lower(tx.get("hash"))?;
            let from = lower(tx.get("from"))?;
            Some((hash, (from, lower(tx.get("to")))))
        })
        .collect()
}

fn parse_logs(value: &Value) -> Result<Vec<RawLog>, ChainError> {
    let bad = |reason: &str| malformed("eth_getLogs", reason);
    let items = value.as_array().ok_or_else(|| bad("not an array"))?;
    let mut logs = Vec::with_capacity(items.len());
    for item in items {
        // Nodes send logs of a removed (reorged) block only on subscriptions; skip them anyway.
        if item.get("removed").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        let topics = item
            .get("topics")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("a log without topics"))?
            .iter()
            .map(|t| t.as_str().and_then(|t| t.parse::<B256>().ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("a topic that is not 32 bytes of hex"))?;
        let data = item.get("data").and_then(Value::as_str).unwrap_or("0x");
        let data = alloy_primitives::hex::decode(data).map_err(|_| bad("data is not hex"))?;
        logs.push(RawLog {
            address: lower(item.get("address")).ok_or_else(|| bad("a log without address"))?,
            topics,
            data,
            block_number: item
                .get("blockNumber")
                .and_then(quantity)
                .ok_or_else(|| bad("no blockNumber"))?,
            block_hash: lower(item.get("blockHash")).ok_or_else(|| bad("no blockHash"))?,
            transaction_hash: lower(item.get("transactionHash"))
                .ok_or_else(|| bad("no transactionHash"))?,
            transaction_index: item
                .get("transactionIndex")
                .and_then(quantity)
                .ok_or_else(|| bad("no transactionIndex"))?,
            log_index: item.get("logIndex").and_then(quantity).ok_or_else(|| bad("no logIndex"))?,
        });
    }
    Ok(logs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_halves_on_errors_and_grows_when_cheap() {
        let mut sizer = RangeSizer::new(1000);
        assert_eq!(sizer.current(), 100);
        sizer.observe(100, 10);
        assert_eq!(sizer.current(), 200);
        sizer.observe(50, 10);
        assert_eq!(sizer.current(), 200, "a short range at the head says nothing");
        sizer.observe(200, 30_000);
        assert_eq!(sizer.current(), 100);
        assert!(sizer.shrink());
        assert_eq!(sizer.current(), 50);
        for _ in 0..10 {
            sizer.shrink();
        }
        assert!(!sizer.shrink(), "one block is as small as it gets");
    }
}
