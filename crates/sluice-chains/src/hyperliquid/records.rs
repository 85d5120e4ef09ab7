//! Node output lines turned into records of the five streams (docs/streams.md, "Hyperliquid
//! `block`" …): each record is `{"payload": {...}}` as the stream's other writers make it,
//! plus where it came from (`node_file`, `node_offset`: the file and the byte offset just
//! past its line) and `block_number` when the line names its block. Prices and sizes stay
//! the node's decimal strings; times become Unix milliseconds.

use std::collections::HashMap;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Map, Value, json};
use sluice_core::streams::StreamRecord;

use super::files::{Layout, Source};

/// Where a line ends in the node's files: `(file ordinal, byte offset past the line)`.
/// Positions grow with the order the node wrote the lines in.
pub type Position = (u64, u64);

/// One line's place, for its records.
#[derive(Debug, Clone, Copy)]
pub struct LineAt<'a> {
    pub file: &'a str,
    pub position: Position,
    /// Where the line starts in its file.
    pub start: u64,
    /// Lines before it in its file (a `replica_cmds` line's height is the file's plus this
    /// plus one).
    pub index: u64,
}

/// What a line made.
#[derive(Debug, Default)]
pub struct Built {
    pub records: Vec<StreamRecord>,
    /// The newest block the line names, with its time (Unix ms).
    pub block: Option<(u64, i64)>,
}

/// A node time (`2024-07-26T08:26:25.899`, UTC, up to nanoseconds) or Unix ms as Unix ms.
pub fn time_ms(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(text) => chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
            .ok()
            .map(|t| t.and_utc().timestamp_millis()),
        _ => None,
    }
}

fn bad(what: impl Into<String>) -> String {
    what.into()
}

/// The record of `payload` at `at`.
fn record(
    entity: &str,
    at: &LineAt<'_>,
    block: Option<u64>,
    payload: Map<String, Value>,
) -> Result<StreamRecord, String> {
    let mut envelope = Map::new();
    if let Some(number) = block {
        envelope.insert("block_number".into(), json!(number));
    }
    envelope.insert("node_file".into(), json!(at.file));
    envelope.insert("node_offset".into(), json!(at.position.1));
    envelope.insert("payload".into(), Value::Object(payload));
    StreamRecord::from_object(entity, &envelope).map_err(|error| error.to_string())
}

#[derive(Deserialize)]
struct ReplicaLine {
    abci_block: AbciBlock,
}

#[derive(Deserialize)]
struct AbciBlock {
    time: String,
    #[serde(default)]
    round: Option<u64>,
    #[serde(default)]
    proposer: Option<String>,
    #[serde(default)]
    signed_action_bundles: Vec<(IgnoredAny, Bundle)>,
}

#[derive(Deserialize)]
struct Bundle {
    #[serde(default)]
    signed_actions: Vec<IgnoredAny>,
}

/// Builds a line's records. Trades from fills keep the fills whose other side has not been
/// read yet in `pairs`.
///
/// # Errors
/// Why the line is not a valid line of `source`; it makes no record.
pub fn build(
    entity: &str,
    source: &Source,
    line: &[u8],
    at: &LineAt<'_>,
    file_ordinal: u64,
    pairs: &mut Pairs,
) -> Result<Built, String> {
    let mut built = Built::default();
    if source.layout == Layout::Replica {
        let parsed: ReplicaLine = serde_json::from_slice(line).map_err(|e| e.to_string())?;
        let block = parsed.abci_block;
        let height = file_ordinal + at.index + 1;
        let time = time_ms(&Value::String(block.time.clone()))
            .ok_or_else(|| bad(format!("block time {:?} is not a time", block.time)))?;
        let txs: usize =
            block.signed_action_bundles.iter().map(|(_, b)| b.signed_actions.len()).sum();
        let mut payload = Map::new();
        payload.insert("height".into(), json!(height));
        payload.insert("blockTime".into(), json!(time));
        payload.insert("hash".into(), Value::Null);
        payload.insert("proposer".into(), json!(block.proposer));
        payload.insert("numTxs".into(), json!(txs));
        payload.insert("round".into(), json!(block.round));
        built.records.push(record(entity, at, Some(height), payload)?);
        built.block = Some((height, time));
        return Ok(built);
    }
    let value: Value = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    let (block, events) = match source.layout {
        Layout::ByBlock => {
            let Value::Object(mut batch) = value else {
                return Err(bad("a by-block line is not an object"));
            };
            let number = batch
                .get("block_number")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad("a by-block line has no block_number"))?;
            let time = batch.get("block_time").and_then(time_ms);
            let Some(Value::Array(events)) = batch.remove("events") else {
                return Err(bad("a by-block line has no events list"));
            };
            if let Some(time) = time {
                built.block = Some((number, time));
            }
            (Some(number), events)
        }
        _ => (None, vec![value]),
    };
    for (index, event) in events.into_iter().enumerate() {
        let what = |reason: String| {
            if block.is_some() { format!("event {index}: {reason}") } else { reason }
        };
        if source.trades_from_fills {
            let fill = Fill::read(event).map_err(what)?;
            if let Some(payload) = pairs.add(fill, at) {
                built.records.push(record(entity, at, block, payload).map_err(what)?);
            }
            continue;
        }
        let payload = match entity {
            "fill" => Fill::read(event).map(Fill::into_payload),
            "order" => order(event),
            "misc_event" => misc_event(event),
            "trade" => trade(event),
            other => Err(format!("no node output makes {other} records")),
        }
        .map_err(what)?;
        built.records.push(record(entity, at, block, payload).map_err(what)?);
    }
    Ok(built)
}

/// A fill line's event: `[user, {fill in the API's fills format}]`.
#[derive(Debug, Clone)]
pub struct Fill {
    user: String,
    fields: Map<String, Value>,
}

impl Fill {
    fn read(event: Value) -> Result<Self, String> {
        let Value::Array(mut pair) = event else {
            return Err(bad("a fill is not [user, fill]"));
        };
        let (Some(Value::Object(fields)), Some(Value::String(user)), None) =
            (pair.pop(), pair.pop(), pair.pop())
        else {
            return Err(bad("a fill is not [user, fill]"));
        };
        Ok(Self { user, fields })
    }

    fn into_payload(mut self) -> Map<String, Value> {
        self.fields.insert("user".into(), Value::String(self.user));
        self.fields
    }

    fn side_info(&self) -> Value {
        let get = |name: &str| self.fields.get(name).cloned().unwrap_or(Value::Null);
        json!({
            "user": self.user,
            "oid": get("oid"),
            "startPosition": get("startPosition"),
            "twapId": get("twapId"),
            "cloid": get("cloid"),
        })
    }
}

/// Fills waiting for the other side of their trade, by trade id, with where their line
/// started (a restart must read again from the earliest of them).
#[derive(Debug, Default)]
pub struct Pairs {
    /// By trade id: the fill, where its line starts and where it ends.
    waiting: HashMap<u64, (Fill, u64, Position)>,
}

impl Pairs {
    /// Where reading must start again for the waiting fills (the earliest line start).
    pub fn earliest_start(&self) -> Option<u64> {
        self.waiting.values().map(|(_, start, _)| *start).min()
    }

    /// Forgets the waiting fills (their file ended); answers how many of them were read
    /// for the first time (past `reread`: a fill read again after a restart may have been
    /// paired before it).
    pub fn clear(&mut self, reread: Option<Position>) -> usize {
        let n = self.waiting.values().filter(|(_, _, end)| Some(*end) > reread).count();
        self.waiting.clear();
        n
    }

    /// Adds a fill; answers the trade when it completes a pair.
    fn add(&mut self, fill: Fill, at: &LineAt<'_>) -> Option<Map<String, Value>> {
        let tid = fill.fields.get("tid").and_then(Value::as_u64)?;
        let Some((other, _, _)) = self.waiting.remove(&tid) else {
            self.waiting.insert(tid, (fill, at.start, at.position));
            return None;
        };
        let is_buy = |f: &Fill| f.fields.get("side").and_then(Value::as_str) == Some("B");
        let (buyer, seller) = if is_buy(&fill) { (fill, other) } else { (other, fill) };
        let crossed = |f: &Fill| f.fields.get("crossed").and_then(Value::as_bool) == Some(true);
        let side = if crossed(&seller) && !crossed(&buyer) { "A" } else { "B" };
        let get = |name: &str| buyer.fields.get(name).cloned().unwrap_or(Value::Null);
        let mut trade = Map::new();
        for name in ["coin", "px", "sz", "time", "hash", "tid"] {
            trade.insert(name.into(), get(name));
        }
        trade.insert("side".into(), json!(side));
        trade.insert("users".into(), json!([buyer.user, seller.user]));
        trade.insert("buyer".into(), buyer.side_info());
        trade.insert("seller".into(), seller.side_info());
        Some(trade)
    }
}

fn object(event: Value, what: &str) -> Result<Map<String, Value>, String> {
    match event {
        Value::Object(map) => Ok(map),
        _ => Err(format!("{what} is not an object")),
    }
}

/// Replaces the node's time text at `name` by Unix ms.
fn retime(map: &mut Map<String, Value>, name: &str) -> Result<(), String> {
    let value = map.get(name).ok_or_else(|| format!("no {name}"))?;
    let ms = time_ms(value).ok_or_else(|| format!("{name} {value} is not a time"))?;
    map.insert(name.into(), json!(ms));
    Ok(())
}

fn order(event: Value) -> Result<Map<String, Value>, String> {
    let mut map = object(event, "an order status")?;
    retime(&mut map, "time")?;
    Ok(map)
}

/// A trade line: `side_info[0]` is the buyer, `side_info[1]` the seller. The node writes no
/// trade id: `tid` is made from the two order ids (docs/streams.md).
fn trade(event: Value) -> Result<Map<String, Value>, String> {
    let mut map = object(event, "a trade")?;
    retime(&mut map, "time")?;
    let Some(Value::Array(sides)) = map.remove("side_info") else {
        return Err(bad("a trade has no side_info"));
    };
    let [buyer, seller] =
        <[Value; 2]>::try_from(sides).map_err(|_| bad("side_info is not two sides"))?;
    let side = |value: Value| -> Result<Value, String> {
        let side = object(value, "a side_info entry")?;
        let get = |name: &str| side.get(name).cloned().unwrap_or(Value::Null);
        Ok(json!({
            "user": get("user"),
            "oid": get("oid"),
            "startPosition": get("start_pos"),
            "twapId": get("twap_id"),
            "cloid": get("cloid"),
        }))
    };
    let (buyer, seller) = (side(buyer)?, side(seller)?);
    let (Some(buy_oid), Some(sell_oid)) = (buyer["oid"].as_u64(), seller["oid"].as_u64()) else {
        return Err(bad("a side has no order id"));
    };
    map.insert("tid".into(), json!(derived_tid(buy_oid, sell_oid)));
    map.insert("users".into(), json!([buyer["user"], seller["user"]]));
    if let Some(value) = map.remove("trade_dir_override") {
        map.insert("tradeDirOverride".into(), value);
    }
    map.insert("buyer".into(), buyer);
    map.insert("seller".into(), seller);
    Ok(map)
}

/// A trade id from the order ids of its two sides (an order pair matches once): FNV-1a of
/// `buyer:seller`, kept to 50 bits like the node's ids.
pub fn derived_tid(buyer_oid: u64, seller_oid: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in format!("{buyer_oid}:{seller_oid}").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash & ((1 << 50) - 1)
}

/// A miscellaneous event, `{time, hash, inner: {<Kind>: {...}}}`: the kind goes to `type`
/// and the account it concerns to `user` (the zero address when it names none).
fn misc_event(event: Value) -> Result<Map<String, Value>, String> {
    let mut map = object(event, "a misc event")?;
    retime(&mut map, "time")?;
    let (kind, user) = {
        let inner =
            map.get("inner").and_then(Value::as_object).ok_or_else(|| bad("no inner object"))?;
        let (kind, fields) = match (inner.len(), inner.iter().next()) {
            (1, Some(entry)) => entry,
            _ => return Err(bad("inner does not hold exactly one event")),
        };
        let pick = |v: &Value| v.as_str().map(str::to_owned);
        let user = ["user", "delegator", "validator"]
            .iter()
            .find_map(|name| fields.get(*name).and_then(pick))
            .or_else(|| fields.pointer("/delta/user").and_then(pick))
            .or_else(|| fields.pointer("/users/0").and_then(pick))
            .unwrap_or_else(|| format!("0x{}", "0".repeat(40)));
        (kind.clone(), user)
    };
    if !map.contains_key("hash") {
        return Err(bad("no hash"));
    }
    map.insert("type".into(), json!(kind));
    map.insert("user".into(), json!(user));
    Ok(map)
}

#[cfg(test)]
mod tests;
