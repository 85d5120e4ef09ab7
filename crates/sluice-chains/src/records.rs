//! A fetched block's logs turned into stream records of every EVM entity, in the shapes of
//! `docs/streams.md` (checked by [`StreamRecord::from_object`], as the ingest endpoint checks
//! them).

use std::collections::{HashMap, HashSet};

use alloy_dyn_abi::DynSolValue;
use alloy_primitives::{Address, B256, U256};
use chrono::{DateTime, SecondsFormat};
use serde_json::{Map, Value, json};
use sluice_core::streams::{InvalidRecord, RecordWriter, StreamRecord};

use crate::ChainError;
use crate::events;
use crate::fetch::{FetchedBlock, Header, RawLog};
use crate::tokens::{PoolBalances, Tokens};
use crate::usd::{Leg, UsdPrices};

/// Every entity an EVM ingester writes.
pub const ENTITIES: [&str; 6] = [
    "log",
    "decoded_log",
    "erc20_token_transfer",
    "erc721_token_transfer",
    "erc1155_token_transfer",
    "dex_trade",
];

const TRANSFER: &str = "Transfer(address,address,uint256)";
const TRANSFER_SINGLE: &str = "TransferSingle(address,address,address,uint256,uint256)";
const TRANSFER_BATCH: &str = "TransferBatch(address,address,address,uint256[],uint256[])";
const SWAP_V2: &str = "Swap(address,uint256,uint256,uint256,uint256,address)";
pub(crate) const SWAP_V3: &str = "Swap(address,address,int256,int256,uint160,uint128,int24)";
const SYNC: &str = "Sync(uint112,uint112)";

/// One block's records, by entity.
#[derive(Debug)]
pub struct BlockRecords {
    pub header: Header,
    pub by_entity: HashMap<&'static str, Vec<StreamRecord>>,
}

/// Token contracts (of transfers) and pools (of swaps) in `blocks`, whose metadata the
/// records need.
pub fn contracts(blocks: &[FetchedBlock]) -> (Vec<String>, Vec<String>) {
    let transfer = [
        events::selector(TRANSFER),
        events::selector(TRANSFER_SINGLE),
        events::selector(TRANSFER_BATCH),
    ];
    let swaps = [events::selector(SWAP_V2), events::selector(SWAP_V3)];
    let (mut tokens, mut pools) = (HashSet::new(), HashSet::new());
    for log in blocks.iter().flat_map(|b| &b.logs) {
        match log.topics.first() {
            Some(t) if transfer.contains(t) => tokens.insert(log.address.clone()),
            Some(t) if swaps.contains(t) => pools.insert(log.address.clone()),
            _ => false,
        };
    }
    (tokens.into_iter().collect(), pools.into_iter().collect())
}

/// What records are built from: the chain, the token cache, the V3 pools' balances and the
/// entities wanted (no record is built for the others).
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub chain: &'a str,
    pub tokens: &'a Tokens,
    pub balances: &'a PoolBalances,
    pub entities: &'a [(String, bool)],
}

/// The records of one block, of the entities `context` wants; `prices` values the block's
/// trades and learns from them (so blocks are built in order).
///
/// # Errors
/// [`ChainError::Malformed`] when a record fails the stream's checks (a node answer that
/// lacks what a key needs).
pub fn build(
    context: Context<'_>,
    prices: &mut UsdPrices,
    block: &FetchedBlock,
) -> Result<BlockRecords, ChainError> {
    let mut out = Builder {
        chain: context.chain,
        block,
        tokens: context.tokens,
        balances: context.balances,
        prices,
        entities: context.entities,
        time: timestamp(block.header.timestamp),
        by_entity: HashMap::new(),
    };
    for log in &block.logs {
        out.log(log)?;
    }
    if out.wants("dex_trade") {
        out.dex_trades()?;
    }
    Ok(BlockRecords { header: block.header.clone(), by_entity: out.by_entity })
}

/// The record that tells a zerolag consumer a block was reorged away: every record it got
/// with this `block_hash` is void. Keyed by the orphaned block's hash (as
/// `transaction_hash`) and `log_index` -1, so it never collides with a log's key.
pub fn reorg_marker(
    chain: &str,
    entity: &str,
    orphan: &Header,
) -> Result<StreamRecord, ChainError> {
    let mut record = Map::new();
    record.insert("reorg".into(), json!(true));
    record.insert("chain".into(), json!(chain));
    record.insert("block_number".into(), json!(orphan.number));
    record.insert("block_hash".into(), json!(orphan.hash));
    record.insert("block_timestamp".into(), json!(timestamp(orphan.timestamp)));
    record.insert("transaction_hash".into(), json!(orphan.hash));
    record.insert("log_index".into(), json!(-1));
    if entity == "erc1155_token_transfer" {
        record.insert("token_id".into(), json!("reorg"));
    }
    checked(entity, &record)
}

struct Builder<'a> {
    chain: &'a str,
    block: &'a FetchedBlock,
    tokens: &'a Tokens,
    balances: &'a PoolBalances,
    prices: &'a mut UsdPrices,
    entities: &'a [(String, bool)],
    /// The block's time as records carry it.
    time: String,
    by_entity: HashMap<&'static str, Vec<StreamRecord>>,
}

impl Builder<'_> {
    fn wants(&self, entity: &str) -> bool {
        self.entities.iter().any(|(e, _)| e == entity)
    }

    fn push(
        &mut self,
        entity: &'static str,
        record: &Map<String, Value>,
    ) -> Result<(), ChainError> {
        let record = checked(entity, record)?;
        self.by_entity.entry(entity).or_default().push(record);
        Ok(())
    }

    /// The fields every log-derived record starts with.
    fn position(&self, log: &RawLog) -> Map<String, Value> {
        let mut record = Map::new();
        record.insert("transaction_hash".into(), json!(log.transaction_hash));
        record.insert("transaction_index".into(), json!(log.transaction_index));
        record.insert("log_index".into(), json!(log.log_index));
        record.insert("block_number".into(), json!(log.block_number));
        record.insert("block_timestamp".into(), json!(self.time));
        record.insert("block_hash".into(), json!(log.block_hash));
        record
    }

    fn log(&mut self, log: &RawLog) -> Result<(), ChainError> {
        let (wants_log, wants_decoded) = (self.wants("log"), self.wants("decoded_log"));
        if wants_log {
            let record = self.raw("log", log, None)?;
            self.by_entity.entry("log").or_default().push(record);
        }
        let Some(known) = events::lookup(&log.topics) else { return Ok(()) };
        let transfer_entity = match known.signature.as_str() {
            TRANSFER if known.topics == 3 => "erc20_token_transfer",
            TRANSFER => "erc721_token_transfer",
            TRANSFER_SINGLE | TRANSFER_BATCH => "erc1155_token_transfer",
            _ => "",
        };
        let wants_transfer = !transfer_entity.is_empty() && self.wants(transfer_entity);
        if !wants_decoded && !wants_transfer {
            return Ok(());
        }
        // ERC-20 transfers, the most common log, are read straight from the topics and data
        // unless `decoded_log` wants them decoded anyway (alloy's decoder names every value).
        if transfer_entity == "erc20_token_transfer" && !wants_decoded {
            let Some((from, to, value)) = erc20_parts(log) else { return Ok(()) };
            return self.erc20(log, from, to, value);
        }
        let Some(params) = events::decode(known, &log.topics, &log.data) else { return Ok(()) };
        if wants_decoded {
            let params = events::params_json(&params);
            let record = self.raw("decoded_log", log, Some((known, &params)))?;
            self.by_entity.entry("decoded_log").or_default().push(record);
        }
        if !wants_transfer {
            return Ok(());
        }
        match transfer_entity {
            "erc20_token_transfer" => {
                match (address(&params[0].1), address(&params[1].1), uint(&params[2].1)) {
                    (Some(from), Some(to), Some(value)) => self.erc20(log, from, to, value),
                    _ => Ok(()),
                }
            }
            "erc721_token_transfer" => self.erc721(log, &params),
            _ => self.erc1155(log, &known.event.name, &params),
        }
    }

    /// A `log` record, or with the event and its decoded `params` a `decoded_log` one:
    /// written field by field (in name order, the text a `Map` would give), as these are
    /// most of the records when every stream is written.
    fn raw(
        &self,
        entity: &'static str,
        log: &RawLog,
        decoded: Option<(&events::KnownEvent, &Value)>,
    ) -> Result<StreamRecord, ChainError> {
        let transaction = self.block.transactions.get(&log.transaction_hash);
        let mut w = RecordWriter::new(entity).map_err(|e| invalid(entity, &e))?;
        w.str("address", &log.address);
        w.str("block_hash", &log.block_hash);
        w.u64("block_number", log.block_number);
        w.str("block_timestamp", &self.time);
        w.str("data", &format!("0x{}", alloy_primitives::hex::encode(&log.data)));
        w.opt_str("from_address", transaction.map(|(from, _)| from.as_str()));
        w.u64("log_index", log.log_index);
        if let Some((known, params)) = decoded {
            w.str("name", &known.event.name);
            w.json("params", params);
            w.str("signature", &known.signature);
        }
        w.opt_str("to_address", transaction.and_then(|(_, to)| to.as_deref()));
        for (index, name) in ["topic0", "topic1", "topic2", "topic3"].into_iter().enumerate() {
            w.opt_str(name, log.topics.get(index).map(|t| format!("{t:#x}")).as_deref());
        }
        w.str("transaction_hash", &log.transaction_hash);
        w.u64("transaction_index", log.transaction_index);
        w.finish().map_err(|e| invalid(entity, &e))
    }

    fn token_fields(&self, record: &mut Map<String, Value>, address: &str) -> Option<u8> {
        let info = self.tokens.token(address);
        record.insert("token_address".into(), json!(address));
        record.insert("token_name".into(), json!(info.and_then(|i| i.name.clone())));
        record.insert("token_symbol".into(), json!(info.and_then(|i| i.symbol.clone())));
        info.and_then(|i| i.decimals)
    }

    fn erc20(
        &mut self,
        log: &RawLog,
        from: String,
        to: String,
        value: U256,
    ) -> Result<(), ChainError> {
        // The most common record: written field by field (in name order, the text a `Map`
        // would give) rather than through a `Map`.
        const ENTITY: &str = "erc20_token_transfer";
        let info = self.tokens.token(&log.address);
        let (raw, amount) = amount_texts(value, info.and_then(|i| i.decimals));
        let mut w = RecordWriter::new(ENTITY).map_err(|e| invalid(ENTITY, &e))?;
        w.f64("amount", number(&amount));
        w.str("amount_str", &amount);
        w.str("block_hash", &log.block_hash);
        w.u64("block_number", log.block_number);
        w.str("block_timestamp", &self.time);
        w.str("from_address", &from);
        w.u64("log_index", log.log_index);
        w.f64("raw_amount", number(&raw));
        w.str("raw_amount_str", &raw);
        w.str("to_address", &to);
        w.str("token_address", &log.address);
        w.opt_str("token_name", info.and_then(|i| i.name.as_deref()));
        w.opt_str("token_symbol", info.and_then(|i| i.symbol.as_deref()));
        w.str("transaction_hash", &log.transaction_hash);
        w.u64("transaction_index", log.transaction_index);
        let record = w.finish().map_err(|e| invalid(ENTITY, &e))?;
        self.by_entity.entry(ENTITY).or_default().push(record);
        Ok(())
    }

    fn erc721(&mut self, log: &RawLog, params: &[(String, DynSolValue)]) -> Result<(), ChainError> {
        let (Some(from), Some(to), Some(id)) =
            (address(&params[0].1), address(&params[1].1), uint(&params[2].1))
        else {
            return Ok(());
        };
        let mut record = Map::new();
        self.token_fields(&mut record, &log.address);
        record.insert("from_address".into(), json!(from));
        record.insert("to_address".into(), json!(to));
        record.insert("token_id".into(), json!(id.to_string()));
        record.extend(self.position(log));
        self.push("erc721_token_transfer", &record)
    }

    fn erc1155(
        &mut self,
        log: &RawLog,
        name: &str,
        params: &[(String, DynSolValue)],
    ) -> Result<(), ChainError> {
        let (Some(operator), Some(from), Some(to)) =
            (address(&params[0].1), address(&params[1].1), address(&params[2].1))
        else {
            return Ok(());
        };
        let items: Vec<(U256, U256)> = match (&params[3].1, &params[4].1) {
            (DynSolValue::Array(ids), DynSolValue::Array(values)) if ids.len() == values.len() => {
                ids.iter().zip(values).filter_map(|(i, v)| Some((uint(i)?, uint(v)?))).collect()
            }
            (id, value) => uint(id).zip(uint(value)).into_iter().collect(),
        };
        for (id, value) in items {
            let mut record = Map::new();
            record.insert("event_type".into(), json!(name));
            record.insert("operator".into(), json!(operator));
            record.insert("from_address".into(), json!(from));
            record.insert("to_address".into(), json!(to));
            self.token_fields(&mut record, &log.address);
            record.insert("token_id".into(), json!(id.to_string()));
            amounts(&mut record, value, Some(0));
            record.extend(self.position(log));
            self.push("erc1155_token_transfer", &record)?;
        }
        Ok(())
    }

    /// Two records per Uniswap V2 or V3 swap, one per token. Each side's `log_index` is that
    /// of the `Transfer` log that moved its token into or out of the pool in the swap's
    /// transaction (so the two sides have distinct keys and real positions).
    fn dex_trades(&mut self) -> Result<(), ChainError> {
        let (v2, v3) = (events::selector(SWAP_V2), events::selector(SWAP_V3));
        let mut used: HashSet<u64> = HashSet::new();
        for swap in &self.block.logs {
            let version = match swap.topics.first() {
                Some(t) if *t == v2 && swap.topics.len() == 3 => 2,
                Some(t) if *t == v3 && swap.topics.len() == 3 => 3,
                _ => continue,
            };
            let Some((token0, token1)) = self.tokens.pool(&swap.address).cloned() else { continue };
            let Some(known) = events::lookup(&swap.topics) else { continue };
            let Some(params) = events::decode(known, &swap.topics, &swap.data) else { continue };
            let raw: [U256; 2] = if version == 2 {
                let n = |i: usize| uint(&params[i].1).unwrap_or_default();
                [net(n(1), n(3)), net(n(2), n(4))]
            } else {
                let n = |i: usize| match &params[i].1 {
                    DynSolValue::Int(v, _) => v.unsigned_abs(),
                    _ => U256::ZERO,
                };
                [n(2), n(3)]
            };
            let reserves = if version == 2 {
                self.reserves(swap)
            } else {
                self.balances_after(swap, [&token0, &token1])
            };
            let decimals =
                [&token0, &token1].map(|t| self.tokens.token(t).and_then(|i| i.decimals));
            let (Some(d0), Some(d1)) = (decimals[0], decimals[1]) else { continue };
            let amounts = [units(raw[0], d0), units(raw[1], d1)];
            let legs = [
                Leg { token: &token0, amount: &amounts[0] },
                Leg { token: &token1, amount: &amounts[1] },
            ];
            let usd = self.prices.trade(legs, self.block.header.timestamp);
            for (side, token) in [&token0, &token1].into_iter().enumerate() {
                if raw[side].is_zero() {
                    continue;
                }
                let Some(log_index) = self.side_log_index(swap, token, &mut used) else { continue };
                let mut record = Map::new();
                record.insert("chain".into(), json!(self.chain));
                record.insert("token_address".into(), json!(token));
                record.insert("token_decimals".into(), json!(decimals[side]));
                record.insert("token_amount".into(), json!(amounts[side]));
                record.insert("usd_amount".into(), json!(usd));
                record.insert("pool_address".into(), json!(swap.address));
                if let Some(reserves) = reserves {
                    let d = if side == 0 { d0 } else { d1 };
                    record.insert("token_reserve".into(), json!(units(reserves[side], d)));
                }
                record.insert("block_number".into(), json!(swap.block_number));
                record.insert("block_timestamp".into(), json!(self.time));
                record.insert("block_hash".into(), json!(swap.block_hash));
                record.insert("transaction_hash".into(), json!(swap.transaction_hash));
                record.insert("log_index".into(), json!(log_index));
                self.push("dex_trade", &record)?;
            }
        }
        Ok(())
    }

    /// The pool's reserves after a V2 swap: its `Sync` log just before the `Swap`.
    fn reserves(&self, swap: &RawLog) -> Option<[U256; 2]> {
        let sync = events::selector(SYNC);
        let log = self.block.logs.iter().rev().find(|l| {
            l.log_index < swap.log_index
                && l.transaction_hash == swap.transaction_hash
                && l.address == swap.address
                && l.topics.first() == Some(&sync)
        })?;
        let params = events::decode(events::lookup(&log.topics)?, &log.topics, &log.data)?;
        Some([uint(&params[0].1)?, uint(&params[1].1)?])
    }

    /// A V3 pool's balances of its two tokens just after `swap`: its balances at the end of
    /// the block, less the `Transfer`s into it after the swap, plus those out of it. `None`
    /// when the node did not answer the balances (a state it no longer keeps).
    fn balances_after(&self, swap: &RawLog, tokens: [&String; 2]) -> Option<[U256; 2]> {
        let transfer = events::selector(TRANSFER);
        let pool = address_topic(&swap.address)?;
        let mut after = [U256::ZERO; 2];
        for (side, token) in tokens.into_iter().enumerate() {
            let mut balance = self.balances.get(self.block.header.number, &swap.address, token)?;
            for log in self.block.logs.iter().filter(|l| {
                l.log_index > swap.log_index
                    && &l.address == token
                    && l.topics.len() == 3
                    && l.topics[0] == transfer
            }) {
                let value = U256::try_from_be_slice(&log.data)?;
                if log.topics[2] == pool {
                    balance = balance.checked_sub(value)?;
                }
                if log.topics[1] == pool {
                    balance = balance.checked_add(value)?;
                }
            }
            after[side] = balance;
        }
        Some(after)
    }

    fn side_log_index(&self, swap: &RawLog, token: &str, used: &mut HashSet<u64>) -> Option<u64> {
        let transfer = events::selector(TRANSFER);
        let pool = address_topic(&swap.address)?;
        let found = self.block.logs.iter().rev().find(|l| {
            l.log_index < swap.log_index
                && l.transaction_hash == swap.transaction_hash
                && l.address == token
                && l.topics.len() == 3
                && l.topics[0] == transfer
                && (l.topics[1] == pool || l.topics[2] == pool)
                && !used.contains(&l.log_index)
        })?;
        used.insert(found.log_index);
        Some(found.log_index)
    }
}

fn checked(entity: &str, record: &Map<String, Value>) -> Result<StreamRecord, ChainError> {
    StreamRecord::from_object(entity, record).map_err(|error| invalid(entity, &error))
}

fn invalid(entity: &str, error: &InvalidRecord) -> ChainError {
    ChainError::Malformed {
        method: "eth_getLogs",
        reason: format!("a {entity} record fails the stream's checks: {error}"),
    }
}

fn address_topic(address: &str) -> Option<B256> {
    format!("0x{:0>64}", address.trim_start_matches("0x")).parse().ok()
}

/// `Transfer(address indexed from, address indexed to, uint256 value)` read as alloy's
/// decoder reads it: the addresses are the topics' last 20 bytes, the value the data's first
/// word (a shorter data does not decode).
fn erc20_parts(log: &RawLog) -> Option<(String, String, U256)> {
    let [_, from, to] = log.topics.as_slice() else { return None };
    let value = U256::try_from_be_slice(log.data.get(..32)?)?;
    let address = |topic: &B256| format!("{:#x}", Address::from_word(*topic));
    Some((address(from), address(to), value))
}

fn net(into: U256, out: U256) -> U256 {
    if into >= out { into - out } else { out - into }
}

fn address(value: &DynSolValue) -> Option<String> {
    match value {
        DynSolValue::Address(a) => Some(format!("{a:#x}")),
        _ => None,
    }
}

fn uint(value: &DynSolValue) -> Option<U256> {
    match value {
        DynSolValue::Uint(n, _) => Some(*n),
        DynSolValue::Int(n, _) if !n.is_negative() => Some(n.into_raw()),
        _ => None,
    }
}

/// `raw_amount_str`, `raw_amount`, `amount_str`, `amount`; without decimals the amount
/// stays in base units (documented for tokens without `decimals()`).
fn amounts(record: &mut Map<String, Value>, raw: U256, decimals: Option<u8>) {
    let (raw_text, amount) = amount_texts(raw, decimals);
    record.insert("raw_amount".into(), json!(number(&raw_text)));
    record.insert("raw_amount_str".into(), json!(raw_text));
    record.insert("amount".into(), json!(number(&amount)));
    record.insert("amount_str".into(), json!(amount));
}

/// `raw` in base units and shifted by `decimals` (base units without them), as text.
fn amount_texts(raw: U256, decimals: Option<u8>) -> (String, String) {
    (raw.to_string(), units(raw, decimals.unwrap_or(0)))
}

/// An amount's JSON number (beyond f64's range: its largest value).
fn number(text: &str) -> f64 {
    text.parse::<f64>().unwrap_or(f64::MAX)
}

/// `raw` shifted by `decimals`, exact, trailing zeros trimmed: `1234560000` with 6 decimals
/// is `"1234.56"`.
pub fn units(raw: U256, decimals: u8) -> String {
    let digits = raw.to_string();
    let decimals = usize::from(decimals);
    if decimals == 0 {
        return digits;
    }
    let padded = format!("{digits:0>width$}", width = decimals + 1);
    let (whole, fraction) = padded.split_at(padded.len() - decimals);
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() { whole.to_owned() } else { format!("{whole}.{fraction}") }
}

pub fn timestamp(seconds: i64) -> String {
    DateTime::from_timestamp(seconds, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_shift_exactly_and_trim_zeros() {
        assert_eq!(units(U256::from(1_234_560_000u64), 6), "1234.56");
        assert_eq!(units(U256::from(5u64), 18), "0.000000000000000005");
        assert_eq!(units(U256::from(7_000_000u64), 6), "7");
        assert_eq!(units(U256::ZERO, 6), "0");
        assert_eq!(units(U256::MAX, 0), U256::MAX.to_string());
    }

    #[test]
    fn erc20_transfers_read_directly_equal_alloys_decoding() {
        let transfer = events::selector(TRANSFER);
        let word = |fill: u8, low: u8| {
            let mut w = [fill; 32];
            w[31] = low;
            B256::from(w)
        };
        let datas: [Vec<u8>; 4] = [vec![7; 32], vec![1; 64], vec![2; 31], Vec::new()];
        for (topics, data) in [
            (vec![transfer, word(0, 1), word(0, 2)], &datas[0]),
            // Dirty high bytes in an address topic, and data longer than one word.
            (vec![transfer, word(0xff, 3), word(0xab, 4)], &datas[1]),
            (vec![transfer, word(0, 1), word(0, 2)], &datas[2]),
            (vec![transfer, word(0, 1), word(0, 2)], &datas[3]),
        ] {
            let log = RawLog {
                address: String::new(),
                topics: topics.clone(),
                data: data.clone(),
                block_number: 1,
                block_hash: String::new(),
                transaction_hash: String::new(),
                transaction_index: 0,
                log_index: 0,
                block_timestamp: None,
            };
            let known = events::lookup(&topics).unwrap();
            let decoded = events::decode(known, &topics, data).and_then(|params| {
                Some((address(&params[0].1)?, address(&params[1].1)?, uint(&params[2].1)?))
            });
            assert_eq!(erc20_parts(&log), decoded, "data of {} bytes", data.len());
        }
    }

    #[test]
    fn reorg_markers_pass_every_streams_checks() {
        let orphan = Header {
            number: 7,
            hash: format!("0x{}", "ab".repeat(32)),
            parent_hash: String::new(),
            timestamp: 1_700_000_000,
        };
        for entity in ENTITIES {
            let marker = reorg_marker("base", entity, &orphan).unwrap();
            assert_eq!(marker.key().split(':').next(), Some(orphan.hash.as_str()));
        }
    }
}
