//! Reading blocks and their logs: `eth_getLogs` over a block range sized adaptively, then the
//! range's blocks in one batch (with their transactions only when they have logs, for the
//! `from_address`/`to_address` of `log` records).
//!
//! Providers cap `eth_getLogs` by range and by result size, each differently: a "too many
//! results"/range error halves the range and the call is made again; a range that came back
//! with few logs doubles the next one, up to the configured maximum.

use std::borrow::Cow;
use std::collections::HashMap;

use alloy_primitives::B256;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::ChainError;
use crate::rpc::{Call, NodeError, RawResult, RpcClient};

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
    /// Empty for a block known only from its logs (see [`blocks`]).
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
    /// Unix seconds, when the node sends it with the log (`blockTimestamp`: Geth, Reth,
    /// Anvil and most providers do).
    pub block_timestamp: Option<i64>,
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
    header_of(rpc.call_raw(Call::new("eth_getBlockByNumber", json!([block, false]))).await?)
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
    rpc.batch_raw(calls).await?.into_iter().map(header_of).collect()
}

/// The header in an `eth_getBlockByNumber` answer (`None` for a block the node lacks).
fn header_of(answer: Result<RawResult, NodeError>) -> Result<Option<Header>, ChainError> {
    let raw = answer.map_err(|e| e.into_error("eth_getBlockByNumber"))?;
    parse_block(&raw, false).map(|block| block.map(|(header, _)| header))
}

/// Up to `parallel` consecutive ranges from `from` (each of the sizer's current size, none
/// past `to`), read concurrently, as one checked run of blocks. A range that came back
/// shorter (its size halved on a provider's error) ends the run there; the sizer keeps the
/// smallest size any range used. `final_up_to`: as [`blocks`].
///
/// # Errors
/// As [`blocks`].
pub async fn ranges(
    rpc: &RpcClient,
    sizer: &mut RangeSizer,
    (from, to): (u64, u64),
    parallel: usize,
    with_transactions: bool,
    final_up_to: u64,
) -> Result<Vec<FetchedBlock>, ChainError> {
    let size = sizer.current();
    // Ranges of the sizer's size; one that would cross `final_up_to` ends there, so the
    // final part is read sparsely.
    let mut spans = Vec::new();
    let mut start = from;
    while start <= to && spans.len() < parallel.max(1) {
        let mut end = to.min(start.saturating_add(size - 1));
        if start <= final_up_to {
            end = end.min(final_up_to);
        }
        spans.push((start, end));
        start = end + 1;
    }
    let mut sizers: Vec<RangeSizer> = spans.iter().map(|_| sizer.clone()).collect();
    let reads = spans
        .iter()
        .zip(sizers.iter_mut())
        .map(|(span, sizer)| blocks(rpc, sizer, *span, with_transactions, final_up_to));
    let results = futures_util::future::join_all(reads).await;
    let mut run: Vec<FetchedBlock> = Vec::new();
    for (result, (start, _)) in results.into_iter().zip(&spans) {
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
/// A range that ends at or below `final_up_to` (blocks the finality rule already covers,
/// where a reorg would be a deep one that nothing can take back) is read sparsely: the
/// headers of its first and last blocks only (they link it to the blocks before and after),
/// plus those of blocks whose logs lack `blockTimestamp` or whose transactions are wanted.
/// Its other blocks with logs are known from their logs (number, hash, time; no parent hash)
/// and its blocks without logs are left out: they carry no records.
///
/// # Errors
/// RPC failures; [`ChainError::Inconsistent`] when the node's chain changed under the reads.
pub async fn blocks(
    rpc: &RpcClient,
    sizer: &mut RangeSizer,
    (from, to): (u64, u64),
    with_transactions: bool,
    final_up_to: u64,
) -> Result<Vec<FetchedBlock>, ChainError> {
    let (to, logs) = loop {
        let end = to.min(from + sizer.current() - 1);
        let filter = json!([{"fromBlock": hex_quantity(from), "toBlock": hex_quantity(end)}]);
        match rpc.call_raw(Call::new("eth_getLogs", filter)).await? {
            Ok(raw) => {
                let logs = parse_logs(&raw)?;
                sizer.observe(end - from + 1, logs.len());
                break (end, logs);
            }
            Err(error) if error.is_range_too_large() && sizer.shrink() => {
                tracing::debug!(from, end, message = %error.message, "eth_getLogs range too large; halving");
            }
            Err(error) => return Err(error.into_error("eth_getLogs")),
        }
    };
    let mut by_block: HashMap<u64, Vec<RawLog>> = HashMap::new();
    for log in logs {
        by_block.entry(log.block_number).or_default().push(log);
    }
    let sparse = to <= final_up_to;
    let wanted: Vec<u64> = (from..=to)
        .filter(|n| {
            !sparse
                || *n == from
                || *n == to
                || by_block.get(n).is_some_and(|logs| {
                    with_transactions || logs.iter().any(|log| log.block_timestamp.is_none())
                })
        })
        .collect();
    let calls = wanted
        .iter()
        .map(|n| {
            let full = with_transactions && by_block.contains_key(n);
            Call::new("eth_getBlockByNumber", json!([hex_quantity(*n), full]))
        })
        .collect();
    let mut answers = wanted.into_iter().zip(rpc.batch_raw(calls).await?).peekable();
    let mut blocks: Vec<FetchedBlock> = Vec::new();
    for number in from..=to {
        let mut logs = by_block.remove(&number).unwrap_or_default();
        let answer = answers.next_if(|(n, _)| *n == number).map(|(_, answer)| answer);
        let (header, transactions) = match answer {
            Some(answer) => {
                let raw = answer.map_err(|e| e.into_error("eth_getBlockByNumber"))?;
                // Behind a load balancer, one node may not have the head another reported.
                parse_block(&raw, !logs.is_empty())?.ok_or(ChainError::Inconsistent { from, to })?
            }
            None if logs.is_empty() => continue,
            None => {
                let header = Header {
                    number,
                    hash: logs[0].block_hash.clone(),
                    parent_hash: String::new(),
                    timestamp: logs[0]
                        .block_timestamp
                        .expect("only blocks with times are left unread"),
                };
                (header, HashMap::new())
            }
        };
        if header.number != number {
            return Err(malformed("eth_getBlockByNumber", "a block of another number"));
        }
        logs.sort_by_key(|log| log.log_index);
        if logs.iter().any(|log| log.block_hash != header.hash) {
            return Err(ChainError::Inconsistent { from, to });
        }
        if let Some(previous) = blocks.last().map(|b| &b.header) {
            let linked = previous.number + 1 == number && !header.parent_hash.is_empty();
            if linked && header.parent_hash != previous.hash {
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
    hex_number(value.as_str()?)
}

fn hex_number(text: &str) -> Option<u64> {
    u64::from_str_radix(text.strip_prefix("0x")?, 16).ok()
}

/// A block as `eth_getBlockByNumber` answers it, the fields read borrowed from the answer's
/// text (hex never holds escapes, but `Cow` takes them if a node sends some).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockWire<'a> {
    #[serde(borrow)]
    number: Option<Cow<'a, str>>,
    #[serde(borrow)]
    hash: Option<Cow<'a, str>>,
    #[serde(borrow)]
    parent_hash: Option<Cow<'a, str>>,
    #[serde(borrow)]
    timestamp: Option<Cow<'a, str>>,
    /// Hashes, or whole transactions when asked for them: parsed only when wanted.
    #[serde(borrow, default)]
    transactions: Vec<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct TransactionWire<'a> {
    #[serde(borrow)]
    hash: Option<Cow<'a, str>>,
    #[serde(borrow)]
    from: Option<Cow<'a, str>>,
    #[serde(borrow)]
    to: Option<Cow<'a, str>>,
}

/// A block's header and (with `with_transactions`, when the answer holds whole
/// transactions) the senders and recipients of its transactions; `None` for `null` (a block
/// the node does not have).
fn parse_block(
    raw: &RawResult,
    with_transactions: bool,
) -> Result<Option<ParsedBlock>, ChainError> {
    let bad = || malformed("eth_getBlockByNumber", "a block without number, hash, parent or time");
    let Some(block): Option<BlockWire<'_>> = serde_json::from_str(raw.get()).map_err(|_| bad())?
    else {
        return Ok(None);
    };
    let header = Header {
        number: block.number.as_deref().and_then(hex_number).ok_or_else(bad)?,
        hash: block.hash.ok_or_else(bad)?.to_ascii_lowercase(),
        parent_hash: block.parent_hash.ok_or_else(bad)?.to_ascii_lowercase(),
        timestamp: block
            .timestamp
            .as_deref()
            .and_then(hex_number)
            .and_then(|t| i64::try_from(t).ok())
            .ok_or_else(bad)?,
    };
    let mut transactions = HashMap::new();
    if with_transactions {
        for tx in block.transactions.iter().filter(|tx| tx.get().starts_with('{')) {
            let Ok(tx) = serde_json::from_str::<TransactionWire<'_>>(tx.get()) else { continue };
            if let (Some(hash), Some(from)) = (tx.hash, tx.from) {
                let to = tx.to.map(|to| to.to_ascii_lowercase());
                transactions.insert(hash.to_ascii_lowercase(), (from.to_ascii_lowercase(), to));
            }
        }
    }
    Ok(Some((header, transactions)))
}

type ParsedBlock = (Header, HashMap<String, (String, Option<String>)>);

/// A log as `eth_getLogs` answers it (borrowed, as [`BlockWire`]).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogWire<'a> {
    #[serde(borrow)]
    address: Option<Cow<'a, str>>,
    #[serde(borrow)]
    topics: Option<Vec<Cow<'a, str>>>,
    #[serde(borrow)]
    data: Option<Cow<'a, str>>,
    #[serde(borrow)]
    block_number: Option<Cow<'a, str>>,
    #[serde(borrow)]
    block_hash: Option<Cow<'a, str>>,
    #[serde(borrow)]
    transaction_hash: Option<Cow<'a, str>>,
    #[serde(borrow)]
    transaction_index: Option<Cow<'a, str>>,
    #[serde(borrow)]
    log_index: Option<Cow<'a, str>>,
    #[serde(borrow)]
    block_timestamp: Option<Cow<'a, str>>,
    removed: Option<bool>,
}

fn parse_logs(raw: &RawResult) -> Result<Vec<RawLog>, ChainError> {
    let bad = |reason: &str| malformed("eth_getLogs", reason);
    let items: Vec<LogWire<'_>> =
        serde_json::from_str(raw.get()).map_err(|_| bad("not an array of logs"))?;
    let mut logs = Vec::with_capacity(items.len());
    for item in items {
        // Nodes send logs of a removed (reorged) block only on subscriptions; skip them anyway.
        if item.removed == Some(true) {
            continue;
        }
        let topics = item
            .topics
            .ok_or_else(|| bad("a log without topics"))?
            .iter()
            .map(|t| t.parse::<B256>().ok())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("a topic that is not 32 bytes of hex"))?;
        let data = item.data.as_deref().unwrap_or("0x");
        let data = alloy_primitives::hex::decode(data).map_err(|_| bad("data is not hex"))?;
        let number = |field: Option<Cow<'_, str>>, what: &str| {
            field.as_deref().and_then(hex_number).ok_or_else(|| bad(what))
        };
        let text = |field: Option<Cow<'_, str>>, what: &str| {
            field.map(|f| f.to_ascii_lowercase()).ok_or_else(|| bad(what))
        };
        logs.push(RawLog {
            address: text(item.address, "a log without address")?,
            topics,
            data,
            block_number: number(item.block_number, "no blockNumber")?,
            block_hash: text(item.block_hash, "no blockHash")?,
            transaction_hash: text(item.transaction_hash, "no transactionHash")?,
            transaction_index: number(item.transaction_index, "no transactionIndex")?,
            log_index: number(item.log_index, "no logIndex")?,
            block_timestamp: item
                .block_timestamp
                .as_deref()
                .and_then(hex_number)
                .and_then(|t| i64::try_from(t).ok()),
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
