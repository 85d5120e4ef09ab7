//! Node output lines turned into records of the five streams (docs/streams.md, "Hyperliquid
//! `block`" …): each record is `{"payload": {...}}` as the stream's other writers make it,
//! plus where it came from (`node_file`, `node_offset`: the file and the byte offset just
//! past its line) and `block_number` when the line names its block. Prices and sizes stay
//! the node's decimal strings; times become Unix milliseconds.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use sluice_core::streams::StreamRecord;

use super::files::{Layout, Source};
use super::raw;

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
        Value::String(text) => plain_time_ms(text).or_else(|| {
            chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
                .ok()
                .map(|t| t.and_utc().timestamp_millis())
        }),
        _ => None,
    }
}

/// The node's own spelling, `YYYY-MM-DDTHH:MM:SS` with 1 to 9 digits of fraction or none,
/// read without chrono's format parser (its cost showed in profiles: a time per order
/// status and per block); `None` for anything else, which chrono then reads (the same
/// format accepts more: no leap second here, a longer fraction).
fn plain_time_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let separators = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if b.len() < 19 || separators.iter().any(|(at, c)| b[*at] != *c) {
        return None;
    }
    let number = |digits: &[u8]| {
        digits
            .iter()
            .try_fold(0u32, |n, c| c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0')))
    };
    let nanos = match &b[19..] {
        [] => 0,
        [b'.', digits @ ..] if (1..=9).contains(&digits.len()) => {
            number(digits)? * 10u32.pow(9 - digits.len() as u32)
        }
        _ => return None,
    };
    let second = number(&b[17..19])?;
    if second > 59 {
        return None;
    }
    let date = chrono::NaiveDate::from_ymd_opt(
        i32::try_from(number(&b[0..4])?).ok()?,
        number(&b[5..7])?,
        number(&b[8..10])?,
    )?;
    let time = chrono::NaiveTime::from_hms_nano_opt(
        number(&b[11..13])?,
        number(&b[14..16])?,
        second,
        nanos,
    )?;
    Some(date.and_time(time).and_utc().timestamp_millis())
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
    if source.trades_from_fills || entity == "fill" {
        let (block, parts) = parsed_events(source.layout, line, &mut built, fill_parts)?;
        for (index, part) in parts.into_iter().enumerate() {
            let what = event_error(block, index);
            let (raw::Text(user), fields) = part.map_err(what)?;
            if source.trades_from_fills {
                if let Some(trade) = paired(&user, &fields, at, pairs).map_err(what)? {
                    built.records.push(trade.record(entity, at, block).map_err(what)?);
                }
            } else {
                let size = fields.size();
                let record = fill_record(entity, user, fields, size, at, block).map_err(what)?;
                built.records.push(record);
            }
        }
        return Ok(built);
    }
    if entity == "order" {
        let (block, parts) = parsed_events(source.layout, line, &mut built, order_fields)?;
        for (index, part) in parts.into_iter().enumerate() {
            let what = event_error(block, index);
            let fields = part.map_err(what)?;
            built.records.push(order(entity, fields, at, block).map_err(what)?);
        }
        return Ok(built);
    }
    let (block, events) = events(source.layout, line, &mut built)?;
    for (index, event) in events.into_iter().enumerate() {
        let what = event_error(block, index);
        let record = match entity {
            "misc_event" | "trade" => {
                let event: Value = serde_json::from_str(event.get()).map_err(|e| e.to_string())?;
                let payload = if entity == "trade" { trade(event) } else { misc_event(event) };
                payload.and_then(|payload| record(entity, at, block, payload))
            }
            other => Err(format!("no node output makes {other} records")),
        }
        .map_err(what)?;
        built.records.push(record);
    }
    Ok(built)
}

/// A fill line's records for the `fill` stream and the trades its fills pair into, from one
/// read of the line: each result is what [`build`] answers for that stream (`fill_source`
/// and its trades twin read the same directory).
pub fn build_fills_and_trades(
    (fill_entity, trade_entity): (&str, &str),
    layout: Layout,
    line: &[u8],
    at: &LineAt<'_>,
    pairs: &mut Pairs,
) -> (Result<Built, String>, Result<Built, String>) {
    let mut fills = Built::default();
    let (block, parts) = match parsed_events(layout, line, &mut fills, fill_parts) {
        Ok(read) => read,
        Err(reason) => return (Err(reason.clone()), Err(reason)),
    };
    let trades = Built { records: Vec::new(), block: fills.block };
    let (mut fills, mut trades) = (Ok(fills), Ok(trades));
    for (index, part) in parts.into_iter().enumerate() {
        let what = event_error(block, index);
        let (user, fields) = match part {
            Ok((raw::Text(user), fields)) => (user, fields),
            Err(reason) => {
                // Both streams stop at a bad event, as each does reading the line alone.
                let reason = what(reason);
                if fills.is_ok() {
                    fills = Err(reason.clone());
                }
                if trades.is_ok() {
                    trades = Err(reason);
                }
                continue;
            }
        };
        // The trade side first: it borrows the fields the fill record then takes.
        if let Ok(built) = &mut trades {
            match paired(&user, &fields, at, pairs)
                .and_then(|trade| trade.map(|t| t.record(trade_entity, at, block)).transpose())
            {
                Ok(record) => built.records.extend(record),
                Err(reason) => trades = Err(what(reason)),
            }
        }
        if let Ok(built) = &mut fills {
            let size = fields.size();
            match fill_record(fill_entity, user, fields, size, at, block) {
                Ok(record) => built.records.push(record),
                Err(reason) => fills = Err(what(reason)),
            }
        }
    }
    (fills, trades)
}

/// Adds a fill to the waiting ones; the trade when it completes a pair.
fn paired(
    user: &str,
    fields: &raw::Object<'_>,
    at: &LineAt<'_>,
    pairs: &mut Pairs,
) -> Result<Option<Trade>, String> {
    Ok(pairs.add(Side::read(user, fields)?, at))
}

/// How an event's error is told: with its place in a by-block line.
fn event_error(block: Option<u64>, index: usize) -> impl Fn(String) -> String + Copy {
    move |reason| if block.is_some() { format!("event {index}: {reason}") } else { reason }
}

/// A line's events, each read as an `E` by `each`: in the same pass as the line when the
/// whole line reads so, else the long way ([`events`], then `each` per event), which makes
/// the same values or the same errors.
#[allow(clippy::type_complexity)]
fn parsed_events<'a, E: Deserialize<'a>>(
    layout: Layout,
    line: &'a [u8],
    built: &mut Built,
    each: fn(&'a RawValue) -> Result<E, String>,
) -> Result<(Option<u64>, Vec<Result<E, String>>), String> {
    // Text checked as UTF-8 once is read without checking each value again.
    let text = std::str::from_utf8(line).ok();
    if layout != Layout::ByBlock {
        if let Some(Ok(event)) = text.map(serde_json::from_str::<E>) {
            return Ok((None, vec![Ok(event)]));
        }
    } else if let Some(Ok(batch)) = text.map(serde_json::from_str::<ByBlockOf<'_, E>>)
        && let (Some(number), Some(events)) =
            (batch.block_number.and_then(|raw| raw::value(raw).as_u64()), batch.events)
    {
        if let Some(time) = batch.block_time.and_then(|raw| time_ms(&raw::value(raw))) {
            built.block = Some((number, time));
        }
        return Ok((Some(number), events.into_iter().map(Ok).collect()));
    }
    let (block, events) = events(layout, line, built)?;
    Ok((block, events.into_iter().map(each).collect()))
}

/// A line's events: a by-block line's list (its block noted in `built`), else the line.
fn events<'a>(
    layout: Layout,
    line: &'a [u8],
    built: &mut Built,
) -> Result<(Option<u64>, Vec<&'a RawValue>), String> {
    if layout != Layout::ByBlock {
        let event: &RawValue = serde_json::from_slice(line).map_err(|e| e.to_string())?;
        return Ok((None, vec![event]));
    }
    // One pass over the line; a line this does not read (a repeated field, say) is read
    // member by member below, as a parsed map reads it.
    if let Ok(batch) = serde_json::from_slice::<ByBlock<'_>>(line) {
        if let (Some(number), Some(events)) =
            (batch.block_number.and_then(|raw| raw::value(raw).as_u64()), batch.events)
        {
            if let Some(time) = batch.block_time.and_then(|raw| time_ms(&raw::value(raw))) {
                built.block = Some((number, time));
            }
            return Ok((Some(number), events));
        }
    }
    let batch: raw::Object<'_> = serde_json::from_slice(line).map_err(|e| {
        if e.is_data() { bad("a by-block line is not an object") } else { e.to_string() }
    })?;
    let number = batch
        .raw("block_number")
        .and_then(|raw| raw::value(raw).as_u64())
        .ok_or_else(|| bad("a by-block line has no block_number"))?;
    let time = batch.raw("block_time").and_then(|raw| time_ms(&raw::value(raw)));
    let events: Vec<&RawValue> = batch
        .raw("events")
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .ok_or_else(|| bad("a by-block line has no events list"))?;
    if let Some(time) = time {
        built.block = Some((number, time));
    }
    Ok((Some(number), events))
}

/// A by-block line's members this reads, its events read as `E`.
#[derive(Deserialize)]
#[serde(bound(deserialize = "E: Deserialize<'de>, 'de: 'a"))]
struct ByBlockOf<'a, E> {
    #[serde(borrow, default)]
    block_number: Option<&'a RawValue>,
    #[serde(borrow, default)]
    block_time: Option<&'a RawValue>,
    #[serde(default = "Option::default")]
    events: Option<Vec<E>>,
}

type ByBlock<'a> = ByBlockOf<'a, &'a RawValue>;

/// A fill line's event: `[user, {fill in the API's fills format}]`.
type FillParts<'a> = (raw::Text<'a>, raw::Object<'a>);

fn fill_parts(event: &RawValue) -> Result<FillParts<'_>, String> {
    serde_json::from_str(event.get()).map_err(|_| bad("a fill is not [user, fill]"))
}

fn order_fields(event: &RawValue) -> Result<raw::Object<'_>, String> {
    serde_json::from_str(event.get()).map_err(|_| bad("an order status is not an object"))
}

/// A fill's record from its parts (`size`: the event's length, for the text's capacity).
fn fill_record(
    entity: &str,
    user: Cow<'_, str>,
    mut fields: raw::Object<'_>,
    size: usize,
    at: &LineAt<'_>,
    block: Option<u64>,
) -> Result<StreamRecord, String> {
    let mut name = Vec::with_capacity(user.len() + 2);
    raw::write_str(&mut name, &user);
    fields.set("user", name);
    let keys = raw::key_fields(entity, &fields);
    let mut text = raw::envelope(at.file, at.position.1, block, size + 16);
    fields.write(&mut text)?;
    raw::finish(entity, text, &keys)
}

/// An order status, its time as Unix ms.
fn order(
    entity: &str,
    mut fields: raw::Object<'_>,
    at: &LineAt<'_>,
    block: Option<u64>,
) -> Result<StreamRecord, String> {
    let size = fields.size();
    // The order object is read once, for its `oid` (a key field) and for the record's text.
    fields.read_object("order");
    let time = fields.get("time").map(raw::member_value).ok_or_else(|| bad("no time"))?;
    let ms = time_ms(&time).ok_or_else(|| format!("time {time} is not a time"))?;
    let mut text = Vec::with_capacity(16);
    raw::write_int(&mut text, ms);
    fields.set("time", text);
    let keys = raw::key_fields(entity, &fields);
    let mut text = raw::envelope(at.file, at.position.1, block, size);
    fields.write(&mut text)?;
    raw::finish(entity, text, &keys)
}

/// The fields of a fill a trade is made of, as the JSON text a record writes: the trade's
/// own (from the buyer's fill) and the side's.
const TRADE_FIELDS: [&str; 6] = ["coin", "px", "sz", "time", "hash", "tid"];
const SIDE_FIELDS: [&str; 4] = ["oid", "startPosition", "twapId", "cloid"];

/// One side of a trade, kept until the other side's fill is read.
#[derive(Debug, Clone)]
pub struct Side {
    user: String,
    tid: Option<u64>,
    buy: bool,
    crossed: bool,
    /// The JSON text of [`TRADE_FIELDS`] then [`SIDE_FIELDS`], by end offset in `text`
    /// (`null` for a field the fill lacks).
    text: Vec<u8>,
    ends: [usize; 10],
}

impl Side {
    fn read(user: &str, fields: &raw::Object<'_>) -> Result<Self, String> {
        let mut text = Vec::with_capacity(256);
        let mut ends = [0; 10];
        for (index, name) in TRADE_FIELDS.iter().chain(&SIDE_FIELDS).enumerate() {
            match fields.raw(name) {
                Some(value) => raw::write_value(&mut text, value)?,
                None => text.extend_from_slice(b"null"),
            }
            ends[index] = text.len();
        }
        let parsed = |name: &str| fields.raw(name).map(raw::value).unwrap_or(Value::Null);
        Ok(Self {
            user: user.to_owned(),
            tid: parsed("tid").as_u64(),
            buy: parsed("side").as_str() == Some("B"),
            crossed: parsed("crossed").as_bool() == Some(true),
            text,
            ends,
        })
    }

    fn field(&self, index: usize) -> &[u8] {
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        &self.text[start..self.ends[index]]
    }

    /// `{"cloid":…,"oid":…,"startPosition":…,"twapId":…,"user":…}`
    fn write_info(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        for (name, index) in [("cloid", 9), ("oid", 6), ("startPosition", 7), ("twapId", 8)] {
            out.push(b'"');
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":");
            out.extend_from_slice(self.field(index));
            out.push(b',');
        }
        out.extend_from_slice(b"\"user\":");
        raw::write_str(out, &self.user);
        out.push(b'}');
    }
}

/// A trade made of two fills.
pub struct Trade {
    buyer: Side,
    seller: Side,
}

impl Trade {
    /// The trade's record: its fields in ascending name order, as a parsed map writes them.
    fn record(
        &self,
        entity: &str,
        at: &LineAt<'_>,
        block: Option<u64>,
    ) -> Result<StreamRecord, String> {
        let (buyer, seller) = (&self.buyer, &self.seller);
        let side = if seller.crossed && !buyer.crossed { "A" } else { "B" };
        let mut text = raw::envelope(at.file, at.position.1, block, 640);
        let field = |text: &mut Vec<u8>, name: &str, first: bool| {
            if !first {
                text.push(b',');
            }
            text.push(b'"');
            text.extend_from_slice(name.as_bytes());
            text.extend_from_slice(b"\":");
        };
        text.push(b'{');
        field(&mut text, "buyer", true);
        buyer.write_info(&mut text);
        for (name, index) in [("coin", 0), ("hash", 4), ("px", 1)] {
            field(&mut text, name, false);
            text.extend_from_slice(buyer.field(index));
        }
        field(&mut text, "seller", false);
        seller.write_info(&mut text);
        field(&mut text, "side", false);
        raw::write_str(&mut text, side);
        for (name, index) in [("sz", 2), ("tid", 5), ("time", 3)] {
            field(&mut text, name, false);
            text.extend_from_slice(buyer.field(index));
        }
        field(&mut text, "users", false);
        text.push(b'[');
        raw::write_str(&mut text, &buyer.user);
        text.push(b',');
        raw::write_str(&mut text, &seller.user);
        text.extend_from_slice(b"]}");
        let parse =
            |index: usize| serde_json::from_slice(buyer.field(index)).unwrap_or(Value::Null);
        let mut keys = Map::new();
        keys.insert("tid".into(), parse(5));
        keys.insert("time".into(), parse(3));
        raw::finish(entity, text, &keys)
    }
}

/// Fills waiting for the other side of their trade, by trade id, with where their line
/// started (a restart must read again from the earliest of them).
#[derive(Debug, Default)]
pub struct Pairs {
    /// By trade id: the fill, where its line starts and where it ends.
    waiting: HashMap<u64, (Side, u64, Position)>,
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
    fn add(&mut self, fill: Side, at: &LineAt<'_>) -> Option<Trade> {
        let tid = fill.tid?;
        let Some((other, _, _)) = self.waiting.remove(&tid) else {
            self.waiting.insert(tid, (fill, at.start, at.position));
            return None;
        };
        let (buyer, seller) = if fill.buy { (fill, other) } else { (other, fill) };
        Some(Trade { buyer, seller })
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
