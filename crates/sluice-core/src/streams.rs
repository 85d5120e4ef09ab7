//! Record schemas of the chain streams: for every catalog entity, its fields, the fields that
//! make a record's stable key, and the field that carries its event (block) time.
//!
//! The key partitions a stream (by key hash, so the records of one key stay in order), and it
//! is what consumers de-duplicate on, so it must identify one record and be the same every
//! time that record is sent. `docs/streams.md` is the prose version of the tables below.
//!
//! Entity names are global: an entity means the same record shape on every chain that has it
//! (`log` is the same on `base`, `ethereum` and an operator-added `arbitrum`).
//!
//! The checked records themselves ([`StreamRecord`], [`RecordWriter`]) are in `records.rs`.

mod records;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::{Map, Value};

pub use self::records::{InvalidRecord, RecordWriter, StreamRecord};

/// How an integer event time is read. RFC 3339 strings are accepted whatever the unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    /// Unix seconds (EVM and Solana block timestamps).
    Seconds,
    /// Unix milliseconds (Hyperliquid `time` and `blockTime`).
    Millis,
}

/// The shape of one entity's records.
#[derive(Debug, PartialEq, Eq)]
pub struct EntitySchema {
    /// Catalog entity name.
    pub entity: &'static str,
    /// Every field a record carries, with its JSON type (and format where it has one).
    pub fields: &'static [(&'static str, &'static str)],
    /// Fields whose values, joined with `:`, make the record key. A dotted name
    /// (`order.oid`) reads a field of a nested object.
    pub key_fields: &'static [&'static str],
    /// The event-time field.
    pub time_field: &'static str,
    /// Unit of `time_field` when it is a JSON integer.
    pub time_unit: TimeUnit,
    /// A wrapper object the fields may be nested in (`{"payload": {...}}` for Hyperliquid,
    /// as Allium's topics carry them). When the record has an object under this name, key
    /// and time fields are read from it; otherwise from the record itself.
    pub envelope: Option<&'static str>,
}

/// Why no key could be built for a record. The fault is always the record's (or the
/// caller's entity name); retrying the same record cannot help.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordError {
    #[error("unknown entity {entity:?}: no record schema")]
    UnknownEntity { entity: String },
    #[error("{entity} record has no key field `{field}`")]
    MissingKeyField { entity: String, field: &'static str },
    #[error(
        "{entity} record key field `{field}` is {}, expected a non-empty string or an integer",
        describe(value)
    )]
    InvalidKeyField { entity: String, field: &'static str, value: Value },
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the non-integer number {n}"),
        Value::String(_) => "an empty string".to_owned(),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

const HEX32: &str = "string, 0x + 64 hex";
const ADDRESS: &str = "string, 0x + 40 hex";
const TIMESTAMP: &str = "string, RFC 3339 UTC (or integer Unix seconds)";
const MILLIS: &str = "integer, Unix milliseconds";
const DECIMAL: &str = "string, decimal number";

/// The fields of a raw EVM log, then `extra`: a decoded log is a raw log with its decoding
/// added, written so the two lists cannot drift apart.
macro_rules! evm_log_fields {
    ($($extra:expr),* $(,)?) => {
        &[
            ("block_number", "integer"),
            ("block_timestamp", TIMESTAMP),
            ("block_hash", HEX32),
            ("transaction_hash", HEX32),
            ("transaction_index", "integer"),
            ("log_index", "integer"),
            ("address", ADDRESS),
            ("data", "string, 0x + hex"),
            ("topic0", HEX32),
            ("topic1", "string (0x + 64 hex) or null"),
            ("topic2", "string (0x + 64 hex) or null"),
            ("topic3", "string (0x + 64 hex) or null"),
            ("from_address", ADDRESS),
            ("to_address", "string (0x + 40 hex) or null"),
            $($extra),*
        ]
    };
}

/// `fields`, then where the log of a token transfer stands (its transaction, log index and
/// block): the common tail of the ERC-20, ERC-721 and ERC-1155 transfer lists.
macro_rules! transfer_fields {
    ($($field:expr),* $(,)?) => {
        &[
            $($field,)*
            ("transaction_hash", HEX32),
            ("transaction_index", "integer"),
            ("log_index", "integer"),
            ("block_number", "integer"),
            ("block_timestamp", TIMESTAMP),
            ("block_hash", HEX32),
        ]
    };
}

const LOG_FIELDS: &[(&str, &str)] = evm_log_fields!();

const DECODED_LOG_FIELDS: &[(&str, &str)] = evm_log_fields!(
    ("name", "string, event name"),
    ("signature", "string, event signature"),
    ("params", "object, decoded parameters (uint/int as decimal strings)"),
);

const ERC20_FIELDS: &[(&str, &str)] = transfer_fields!(
    ("token_address", ADDRESS),
    ("token_name", "string"),
    ("token_symbol", "string"),
    ("from_address", ADDRESS),
    ("to_address", ADDRESS),
    ("raw_amount_str", "string, decimal integer"),
    ("raw_amount", "number (approximate)"),
    ("amount_str", DECIMAL),
    ("amount", "number (approximate)"),
);

const ERC721_FIELDS: &[(&str, &str)] = transfer_fields!(
    ("token_address", ADDRESS),
    ("token_name", "string"),
    ("token_symbol", "string"),
    ("from_address", ADDRESS),
    ("to_address", ADDRESS),
    ("token_id", "string, decimal integer"),
);

const ERC1155_FIELDS: &[(&str, &str)] = transfer_fields!(
    ("event_type", "string, TransferSingle or TransferBatch"),
    ("operator", ADDRESS),
    ("from_address", ADDRESS),
    ("to_address", ADDRESS),
    ("token_address", ADDRESS),
    ("token_name", "string"),
    ("token_symbol", "string"),
    ("token_id", "string, decimal integer"),
    ("raw_amount_str", "string, decimal integer"),
    ("raw_amount", "number (approximate)"),
    ("amount_str", DECIMAL),
    ("amount", "number (approximate)"),
);

const SOLANA_TRANSACTION_FIELDS: &[(&str, &str)] = &[
    ("block_slot", "integer, the slot"),
    ("block_height", "integer, or null when the node has none (early slots)"),
    ("block_timestamp", TIMESTAMP),
    ("block_hash", "string, base58"),
    ("parent_slot", "integer"),
    ("txn_id", "string, base58 signature"),
    ("txn_index", "integer"),
    ("signatures", "array of strings, base58"),
    ("signer", "string, base58, the fee payer"),
    ("signers", "array of strings, base58, every required signer"),
    ("fee", "integer, lamports"),
    ("success", "boolean"),
    ("err", "object, string or null"),
    ("compute_units_consumed", "integer or null"),
    ("version", "string, legacy or 0"),
    ("recent_block_hash", "string, base58"),
    ("account_keys", "array of objects {pubkey, signer, writable, source}"),
    (
        "instructions",
        "array of objects {program_id, accounts (indexes into account_keys), data, stack_height}",
    ),
    ("inner_instructions", "array of objects {index, instructions}"),
    ("log_messages", "array of strings, or null"),
    ("pre_balances", "array of integers, lamports"),
    ("post_balances", "array of integers, lamports"),
    ("pre_token_balances", "array of objects"),
    ("post_token_balances", "array of objects"),
];

const HL_BLOCK_FIELDS: &[(&str, &str)] = &[
    ("height", "integer"),
    ("blockTime", MILLIS),
    ("hash", "string (0x + 64 hex), or null where the source does not give it"),
    ("proposer", ADDRESS),
    ("numTxs", "integer"),
    ("round", "integer or null, the consensus round; absent outside node files"),
];

const HL_TRADE_FIELDS: &[(&str, &str)] = &[
    ("coin", "string"),
    ("side", "string, A (ask/sell aggressor) or B (bid/buy aggressor)"),
    ("px", DECIMAL),
    ("sz", DECIMAL),
    ("hash", HEX32),
    ("time", MILLIS),
    ("tid", "integer"),
    ("users", "array of two addresses, [buyer, seller]"),
    ("buyer", "object {user, oid, startPosition, twapId, cloid}; absent outside node files"),
    ("seller", "object {user, oid, startPosition, twapId, cloid}; absent outside node files"),
    ("tradeDirOverride", "string; absent outside node trade files"),
];

const HL_FILL_FIELDS: &[(&str, &str)] = &[
    ("user", ADDRESS),
    ("coin", "string"),
    ("px", DECIMAL),
    ("sz", DECIMAL),
    ("side", "string, A or B"),
    ("time", MILLIS),
    ("startPosition", DECIMAL),
    ("dir", "string"),
    ("closedPnl", DECIMAL),
    ("hash", HEX32),
    ("oid", "integer"),
    ("crossed", "boolean"),
    ("fee", DECIMAL),
    ("feeToken", "string"),
    ("tid", "integer"),
    ("builderFee", "string, decimal; absent without a builder"),
    ("builderAddress", "string (0x + 40 hex); absent without a builder"),
    ("twapId", "integer or null"),
    ("liquidation", "object {liquidatedUser, markPx, method}; absent unless a liquidation"),
];

const HL_ORDER_FIELDS: &[(&str, &str)] = &[
    ("time", MILLIS),
    ("user", ADDRESS),
    ("hash", "string (0x + 64 hex) or null"),
    ("builder", "object or null"),
    ("status", "string, Hyperliquid order status (open, filled, canceled, ...)"),
    (
        "order",
        "object {coin, side, limitPx, sz, origSz, oid, timestamp, orderType, tif, reduceOnly, cloid}",
    ),
];

const HL_MISC_EVENT_FIELDS: &[(&str, &str)] = &[
    ("time", MILLIS),
    ("hash", HEX32),
    ("type", "string, the kind of event (Funding, CDeposit, CWithdrawal, ...)"),
    ("user", ADDRESS),
    ("inner", "object {<type>: {...}}"),
];

const DEX_TRADE_FIELDS: &[(&str, &str)] = &[
    ("chain", "string, the chain the trade happened on"),
    ("token_address", "string, the token priced by this trade (0x + 40 hex, or a base58 mint)"),
    ("token_decimals", "integer, the token's decimals"),
    ("token_amount", "string, decimal number of token units traded (already scaled by decimals)"),
    ("usd_amount", "string, decimal USD value of the trade"),
    ("pool_address", "string, the pool (pair) traded in"),
    ("token_reserve", "string, decimal token units the pool holds after the trade"),
    ("block_number", "integer (slot on Solana)"),
    ("block_timestamp", TIMESTAMP),
    ("transaction_hash", "string, 0x + 64 hex (base58 signature on Solana)"),
    ("log_index", "integer (instruction index on Solana)"),
];

const EVM_LOG_KEY: &[&str] = &["transaction_hash", "log_index"];

const fn block_timestamped(
    entity: &'static str,
    fields: &'static [(&'static str, &'static str)],
    key_fields: &'static [&'static str],
) -> EntitySchema {
    EntitySchema {
        entity,
        fields,
        key_fields,
        time_field: "block_timestamp",
        time_unit: TimeUnit::Seconds,
        envelope: None,
    }
}

const fn hyperliquid(
    entity: &'static str,
    fields: &'static [(&'static str, &'static str)],
    key_fields: &'static [&'static str],
    time_field: &'static str,
) -> EntitySchema {
    EntitySchema {
        entity,
        fields,
        key_fields,
        time_field,
        time_unit: TimeUnit::Millis,
        envelope: Some("payload"),
    }
}

static SCHEMAS: [EntitySchema; 12] = [
    block_timestamped("log", LOG_FIELDS, EVM_LOG_KEY),
    block_timestamped("decoded_log", DECODED_LOG_FIELDS, EVM_LOG_KEY),
    block_timestamped("erc20_token_transfer", ERC20_FIELDS, EVM_LOG_KEY),
    block_timestamped("erc721_token_transfer", ERC721_FIELDS, EVM_LOG_KEY),
    // A TransferBatch log holds several (token_id, amount) items under one log_index.
    block_timestamped(
        "erc1155_token_transfer",
        ERC1155_FIELDS,
        &["transaction_hash", "log_index", "token_id"],
    ),
    // One record per token side of a swap: the pair's two tokens are two records with the
    // same transaction hash and distinct log indexes.
    block_timestamped("dex_trade", DEX_TRADE_FIELDS, EVM_LOG_KEY),
    block_timestamped("nonvoting_transaction", SOLANA_TRANSACTION_FIELDS, &["txn_id"]),
    hyperliquid("block", HL_BLOCK_FIELDS, &["height"], "blockTime"),
    hyperliquid("trade", HL_TRADE_FIELDS, &["tid"], "time"),
    // One fill per side of a trade; the hash is all zeros for TWAP fills, so it adds nothing.
    hyperliquid("fill", HL_FILL_FIELDS, &["tid", "side"], "time"),
    // One record per status change of an order.
    hyperliquid("order", HL_ORDER_FIELDS, &["order.oid", "status", "time"], "time"),
    // Funding events share the all-zero hash, one per user and funding time.
    hyperliquid("misc_event", HL_MISC_EVENT_FIELDS, &["time", "hash", "type", "user"], "time"),
];

/// Every entity with a record schema, in catalog order.
pub fn entity_schemas() -> &'static [EntitySchema] {
    &SCHEMAS
}

/// The schema of `entity`, if it has one.
pub fn entity_schema(entity: &str) -> Option<&'static EntitySchema> {
    SCHEMAS.iter().find(|schema| schema.entity == entity)
}

/// Why a filter path can name no value of `entity`'s records: its first field (after the
/// envelope, which a path may name or skip) is not one of the schema's fields, it steps into
/// a field that is neither an object nor an array, or it starts with an array index (records
/// are objects). `None` when the path may name a value, and for an entity without a schema
/// (an operator-added catalog entry), whose records have no known fields.
///
/// Only the levels the schema describes are checked: what lies inside an object or array
/// field (`params.*`, `order.*`, `topics.<n>`) is not.
pub fn unknown_filter_path(
    entity: &str,
    path: &[crate::filter_expr::PathSegment],
) -> Option<String> {
    use crate::filter_expr::PathSegment;
    let schema = entity_schema(entity)?;
    let names: Vec<&str> = schema.fields.iter().map(|(name, _)| *name).collect();
    let known = || match schema.envelope {
        Some(envelope) => format!(
            "{entity} records have the fields {} (written directly or under `{envelope}`)",
            names.join(", ")
        ),
        None => format!("{entity} records have the fields {}", names.join(", ")),
    };
    let mut rest = path;
    if let (Some(envelope), Some(PathSegment::Field(first))) = (schema.envelope, rest.first()) {
        if first == envelope && !names.contains(&envelope) {
            rest = &rest[1..];
            if rest.is_empty() {
                return Some(format!(
                    "filter_expr path names the `{envelope}` object, not a field in it; {}",
                    known()
                ));
            }
        }
    }
    match rest.first()? {
        PathSegment::Index(index) => Some(format!(
            "filter_expr path starts with the array index {index}, but a record is an object; {}",
            known()
        )),
        PathSegment::Field(name) => {
            let Some((_, kind)) = schema.fields.iter().find(|(field, _)| field == name) else {
                return Some(format!("no field `{name}` in {entity} records; {}", known()));
            };
            let is_container = kind.starts_with("object") || kind.starts_with("array");
            (rest.len() > 1 && !is_container).then(|| {
                format!(
                    "filter_expr path steps into `{name}`, which is a {kind} and has no fields or elements"
                )
            })
        }
    }
}

/// The fields of `record` the schema's names refer to: inside the envelope when the record
/// has one, else the record itself.
fn body<'a>(schema: &EntitySchema, record: &'a Map<String, Value>) -> &'a Map<String, Value> {
    match schema.envelope.and_then(|name| record.get(name)) {
        Some(Value::Object(inner)) => inner,
        _ => record,
    }
}

fn lookup<'a>(record: &'a Map<String, Value>, dotted: &str) -> Option<&'a Value> {
    let mut segments = dotted.split('.');
    let mut value = record.get(segments.next()?)?;
    for segment in segments {
        value = value.as_object()?.get(segment)?;
    }
    Some(value)
}

/// Builds the stable key of `record`: the values of the entity's key fields joined with `:`
/// (`"0xab…:7"`).
///
/// Integers are written in decimal. A string is taken as is, except that a `0x` hex string
/// is lowercased (the checksummed and the lowercase spelling of one hash are one key), and a
/// `%` or `:` inside it is percent-encoded so that distinct records never share a key. For
/// entities with an envelope (Hyperliquid), fields are read under `payload` when the record
/// is wrapped and from the record itself when it is not.
///
/// # Errors
/// [`RecordError::UnknownEntity`] for an entity without a schema;
/// [`RecordError::MissingKeyField`] when a key field is absent;
/// [`RecordError::InvalidKeyField`] when it is not a non-empty string or an integer.
pub fn record_key(entity: &str, record: &Map<String, Value>) -> Result<String, RecordError> {
    let schema = entity_schema(entity)
        .ok_or_else(|| RecordError::UnknownEntity { entity: entity.into() })?;
    let body = body(schema, record);
    let mut key = String::with_capacity(80);
    for (index, &field) in schema.key_fields.iter().enumerate() {
        if index > 0 {
            key.push(':');
        }
        let value = lookup(body, field)
            .ok_or_else(|| RecordError::MissingKeyField { entity: entity.into(), field })?;
        let invalid =
            || RecordError::InvalidKeyField { entity: entity.into(), field, value: value.clone() };
        match value {
            Value::Number(n) if n.is_u64() || n.is_i64() => key.push_str(&n.to_string()),
            Value::String(s) if !s.is_empty() => push_key_part(&mut key, s),
            _ => return Err(invalid()),
        }
    }
    Ok(key)
}

fn push_key_part(key: &mut String, part: &str) {
    let is_hex = part.len() > 2
        && (part.starts_with("0x") || part.starts_with("0X"))
        && part[2..].bytes().all(|b| b.is_ascii_hexdigit());
    if is_hex {
        key.push_str(&part.to_ascii_lowercase());
        return;
    }
    for c in part.chars() {
        match c {
            '%' => key.push_str("%25"),
            ':' => key.push_str("%3A"),
            c => key.push(c),
        }
    }
}

/// The event (block) time of `record`, read from the entity's time field (under the envelope
/// when the record is wrapped).
///
/// Accepted: an RFC 3339 string; a zone-less `YYYY-MM-DD[T ]HH:MM:SS[.fraction]` string, read
/// as UTC (warehouse exports and Hyperliquid node files write those); a JSON integer in the
/// entity's [`TimeUnit`]. `None` for an unknown entity, a missing field, anything else, or a
/// time chrono cannot represent.
pub fn event_time(entity: &str, record: &Map<String, Value>) -> Option<DateTime<Utc>> {
    let schema = entity_schema(entity)?;
    time_value(entity, body(schema, record).get(schema.time_field)?)
}

/// The time a value of `entity`'s time field stands for, as [`event_time`] reads it (for a
/// caller that found the field without parsing the whole record).
pub fn time_value(entity: &str, value: &Value) -> Option<DateTime<Utc>> {
    let schema = entity_schema(entity)?;
    match value {
        Value::String(text) => parse_time_text(text),
        Value::Number(n) => {
            let n = n.as_i64()?;
            match schema.time_unit {
                TimeUnit::Seconds => DateTime::from_timestamp(n, 0),
                TimeUnit::Millis => DateTime::from_timestamp_millis(n),
            }
        }
        _ => None,
    }
}

fn parse_time_text(text: &str) -> Option<DateTime<Utc>> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Some(at.with_timezone(&Utc));
    }
    ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())
        .map(|naive| naive.and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_record_is_byte_for_byte_the_map_built_one() {
        let object = serde_json::json!({
            "amount": 1234.56, "amount_str": "1234.56", "block_hash": "0xAB\"c",
            "block_number": 7, "block_timestamp": "2026-01-02T03:04:05Z",
            "from_address": "0x01", "log_index": 3, "params": {"b": [1, "x"], "a": null},
            "raw_amount": 1.23456e9, "token_name": null, "transaction_hash": "0xDEADbeef",
        });
        let expected =
            StreamRecord::from_object("erc20_token_transfer", object.as_object().unwrap()).unwrap();
        let mut w = RecordWriter::new("erc20_token_transfer").unwrap();
        w.f64("amount", 1234.56);
        w.str("amount_str", "1234.56");
        w.str("block_hash", "0xAB\"c");
        w.u64("block_number", 7);
        w.str("block_timestamp", "2026-01-02T03:04:05Z");
        w.str("from_address", "0x01");
        w.u64("log_index", 3);
        w.json("params", &serde_json::json!({"b": [1, "x"], "a": null}));
        w.f64("raw_amount", 1.23456e9);
        w.opt_str("token_name", None);
        w.str("transaction_hash", "0xDEADbeef");
        assert_eq!(w.finish().unwrap(), expected);
    }

    #[test]
    fn a_written_record_gets_the_same_checks() {
        let write = |fields: &[(&'static str, Option<&str>)]| {
            let mut w = RecordWriter::new("erc20_token_transfer").unwrap();
            for (name, value) in fields {
                w.opt_str(name, *value);
            }
            w.finish()
        };
        let time = ("block_timestamp", Some("2026-01-02T03:04:05Z"));
        let hash = ("transaction_hash", Some("0x01"));
        assert!(matches!(
            write(&[time, hash]),
            Err(InvalidRecord::Key(RecordError::MissingKeyField { field: "log_index", .. }))
        ));
        let mut w = RecordWriter::new("erc20_token_transfer").unwrap();
        w.str("block_timestamp", "yesterday");
        w.u64("log_index", 1);
        w.str("transaction_hash", "0x01");
        assert!(matches!(w.finish(), Err(InvalidRecord::Time { .. })));
        let mut w = RecordWriter::new("erc20_token_transfer").unwrap();
        w.str("transaction_hash", "0x01");
        w.u64("log_index", 1);
        assert!(matches!(w.finish(), Err(InvalidRecord::DuplicateKey { .. })), "out of order");
        let mut w = RecordWriter::new("erc20_token_transfer").unwrap();
        w.str("block_timestamp", "2026-01-02T03:04:05Z");
        w.u64("log_index", 1);
        w.str("transaction_hash", "");
        assert!(matches!(w.finish(), Err(InvalidRecord::Key(RecordError::InvalidKeyField { .. }))));
        assert!(RecordWriter::new("no_such_entity").is_err());
    }
    use crate::catalog::Catalog;
    use chrono::TimeZone;
    use serde_json::json;

    fn map(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn every_default_catalog_entity_has_a_schema_whose_key_and_time_fields_are_listed() {
        for entry in Catalog::default().entries() {
            let schema = entity_schema(&entry.entity)
                .unwrap_or_else(|| panic!("no schema for {}", entry.entity));
            let names: Vec<&str> = schema.fields.iter().map(|(name, _)| *name).collect();
            assert!(names.contains(&schema.time_field), "{}", schema.entity);
            for field in schema.key_fields {
                let top = field.split('.').next().unwrap();
                assert!(names.contains(&top), "{} key {field}", schema.entity);
            }
        }
        let mut entities: Vec<&str> = entity_schemas().iter().map(|s| s.entity).collect();
        entities.sort_unstable();
        entities.dedup();
        assert_eq!(entities.len(), entity_schemas().len());
    }

    #[test]
    fn evm_key_is_lowercased_transaction_hash_and_log_index() {
        let record = map(json!({
            "transaction_hash": "0xABCDEF0123", "log_index": 7, "block_number": 12345,
            "block_timestamp": "2025-06-01T12:00:05Z",
        }));
        assert_eq!(record_key("log", &record).unwrap(), "0xabcdef0123:7");
        assert_eq!(record_key("erc20_token_transfer", &record).unwrap(), "0xabcdef0123:7");
        let as_string = map(json!({"transaction_hash": "0xabcdef0123", "log_index": "7"}));
        assert_eq!(record_key("decoded_log", &as_string).unwrap(), "0xabcdef0123:7");
    }

    #[test]
    fn erc1155_batch_items_differ_by_token_id() {
        let item =
            |id: &str| map(json!({"transaction_hash": "0x01", "log_index": 3, "token_id": id}));
        let a = record_key("erc1155_token_transfer", &item("1")).unwrap();
        let b = record_key("erc1155_token_transfer", &item("2")).unwrap();
        assert_eq!(a, "0x01:3:1");
        assert_ne!(a, b);
    }

    #[test]
    fn solana_key_keeps_base58_case() {
        let record = map(
            json!({"txn_id": "5VERv8NMvzbJMEkV8xnrLkEaWRtSz9CosKDYjCJjBRnbJLgp8uirBgmQpjKhoR4tjF3ZpRzrFmBV6UjKdiSZkQUW"}),
        );
        assert_eq!(
            record_key("nonvoting_transaction", &record).unwrap(),
            "5VERv8NMvzbJMEkV8xnrLkEaWRtSz9CosKDYjCJjBRnbJLgp8uirBgmQpjKhoR4tjF3ZpRzrFmBV6UjKdiSZkQUW"
        );
    }

    #[test]
    fn hyperliquid_fields_are_read_under_payload_or_at_top_level() {
        let fill = json!({"tid": 118906512037719_u64, "side": "B", "time": 1717243200123_i64});
        let wrapped = map(json!({"payload": fill.clone(), "source": "hyperliquid"}));
        let bare = map(fill);
        assert_eq!(record_key("fill", &wrapped).unwrap(), "118906512037719:B");
        assert_eq!(record_key("fill", &bare).unwrap(), "118906512037719:B");
        let at = Utc.timestamp_millis_opt(1_717_243_200_123).unwrap();
        assert_eq!(event_time("fill", &wrapped), Some(at));
        assert_eq!(event_time("fill", &bare), Some(at));

        let block = map(json!({"payload": {"height": 42, "blockTime": 1717243200000_i64}}));
        assert_eq!(record_key("block", &block).unwrap(), "42");
        assert_eq!(
            event_time("block", &block),
            Some(Utc.timestamp_millis_opt(1_717_243_200_000).unwrap())
        );
    }

    #[test]
    fn order_key_reads_the_nested_oid_and_separates_status_changes() {
        let order = |status: &str, time: i64| {
            map(json!({"payload": {"time": time, "status": status, "order": {"oid": 9001}}}))
        };
        assert_eq!(record_key("order", &order("open", 1000)).unwrap(), "9001:open:1000");
        assert_ne!(
            record_key("order", &order("open", 1000)).unwrap(),
            record_key("order", &order("filled", 2000)).unwrap()
        );
        let missing = map(json!({"payload": {"time": 1, "status": "open", "order": {}}}));
        assert_eq!(
            record_key("order", &missing),
            Err(RecordError::MissingKeyField { entity: "order".into(), field: "order.oid" })
        );
    }

    #[test]
    fn separators_inside_string_parts_are_escaped_so_keys_stay_distinct() {
        let a = map(json!({"time": 1, "hash": "0x00", "type": "a:b", "user": "c"}));
        let b = map(json!({"time": 1, "hash": "0x00", "type": "a", "user": "b:c"}));
        let ka = record_key("misc_event", &a).unwrap();
        let kb = record_key("misc_event", &b).unwrap();
        assert_eq!(ka, "1:0x00:a%3Ab:c");
        assert_ne!(ka, kb);
    }

    #[test]
    fn key_errors_name_the_entity_field_and_value() {
        assert_eq!(
            record_key("transaction", &Map::new()),
            Err(RecordError::UnknownEntity { entity: "transaction".into() })
        );
        assert_eq!(
            record_key("log", &map(json!({"log_index": 1}))),
            Err(RecordError::MissingKeyField { entity: "log".into(), field: "transaction_hash" })
        );
        for bad in [json!(null), json!(1.5), json!(""), json!(true), json!([1]), json!({})] {
            let record = map(json!({"transaction_hash": "0x01", "log_index": bad.clone()}));
            let error = record_key("log", &record).unwrap_err();
            assert_eq!(
                error,
                RecordError::InvalidKeyField {
                    entity: "log".into(),
                    field: "log_index",
                    value: bad
                }
            );
            assert!(error.to_string().contains("log_index"), "{error}");
        }
        let negative = map(json!({"transaction_hash": "0x01", "log_index": -1}));
        assert_eq!(record_key("log", &negative).unwrap(), "0x01:-1");
    }

    #[test]
    fn event_time_reads_rfc3339_zone_less_text_and_integers_in_the_entity_unit() {
        let at = Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 5).unwrap();
        for value in [
            json!("2025-06-01T12:00:05Z"),
            json!("2025-06-01T14:00:05+02:00"),
            json!("2025-06-01 12:00:05"),
            json!("2025-06-01T12:00:05.000"),
            json!(at.timestamp()),
        ] {
            let record = map(json!({"block_timestamp": value.clone()}));
            assert_eq!(event_time("erc20_token_transfer", &record), Some(at), "{value}");
            assert_eq!(event_time("nonvoting_transaction", &record), Some(at), "{value}");
        }
        let ms = map(json!({"payload": {"time": at.timestamp_millis()}}));
        assert_eq!(event_time("trade", &ms), Some(at));
        let text = map(json!({"payload": {"time": "2025-06-01T12:00:05.000000000"}}));
        assert_eq!(event_time("order", &text), Some(at));
    }

    #[test]
    fn event_time_is_none_when_absent_malformed_or_unknown() {
        assert_eq!(event_time("log", &Map::new()), None);
        assert_eq!(event_time("log", &map(json!({"block_timestamp": "yesterday"}))), None);
        assert_eq!(event_time("log", &map(json!({"block_timestamp": 1.5}))), None);
        assert_eq!(event_time("log", &map(json!({"block_timestamp": i64::MAX}))), None);
        assert_eq!(event_time("nope", &map(json!({"block_timestamp": 1}))), None);
    }
}
