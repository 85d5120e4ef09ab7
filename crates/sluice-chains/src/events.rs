//! The well-known event ABIs `decoded_log` decodes, and the decoding itself (alloy's dynamic
//! ABI decoder; no hand-written ABI code).
//!
//! ERC-20 and ERC-721 share `Transfer` and `Approval` signatures and differ only in how many
//! arguments are indexed, so an event is chosen by its topic0 *and* its number of topics.

use std::collections::HashMap;
use std::sync::OnceLock;

use alloy_dyn_abi::{DynSolValue, EventExt};
use alloy_json_abi::Event;
use alloy_primitives::B256;
use serde_json::{Map, Value, json};

/// Human-readable declarations of every event `decoded_log` knows (docs/chains.md lists them).
pub const KNOWN_EVENTS: &[&str] = &[
    // ERC-20
    "event Transfer(address indexed from, address indexed to, uint256 value)",
    "event Approval(address indexed owner, address indexed spender, uint256 value)",
    // ERC-721
    "event Transfer(address indexed from, address indexed to, uint256 indexed tokenId)",
    "event Approval(address indexed owner, address indexed approved, uint256 indexed tokenId)",
    "event ApprovalForAll(address indexed owner, address indexed operator, bool approved)",
    // ERC-1155
    "event TransferSingle(address indexed operator, address indexed from, address indexed to, uint256 id, uint256 value)",
    "event TransferBatch(address indexed operator, address indexed from, address indexed to, uint256[] ids, uint256[] values)",
    "event URI(string value, uint256 indexed id)",
    // WETH
    "event Deposit(address indexed dst, uint256 wad)",
    "event Withdrawal(address indexed src, uint256 wad)",
    // Uniswap V2 pairs and factory
    "event Swap(address indexed sender, uint256 amount0In, uint256 amount1In, uint256 amount0Out, uint256 amount1Out, address indexed to)",
    "event Mint(address indexed sender, uint256 amount0, uint256 amount1)",
    "event Burn(address indexed sender, uint256 amount0, uint256 amount1, address indexed to)",
    "event Sync(uint112 reserve0, uint112 reserve1)",
    "event PairCreated(address indexed token0, address indexed token1, address pair, uint256 index)",
    // Uniswap V3 pools and factory
    "event Swap(address indexed sender, address indexed recipient, int256 amount0, int256 amount1, uint160 sqrtPriceX96, uint128 liquidity, int24 tick)",
    "event Mint(address sender, address indexed owner, int24 indexed tickLower, int24 indexed tickUpper, uint128 amount, uint256 amount0, uint256 amount1)",
    "event Burn(address indexed owner, int24 indexed tickLower, int24 indexed tickUpper, uint128 amount, uint256 amount0, uint256 amount1)",
    "event PoolCreated(address indexed token0, address indexed token1, uint24 indexed fee, int24 tickSpacing, address pool)",
];

/// A known event, ready to decode.
#[derive(Debug)]
pub struct KnownEvent {
    pub event: Event,
    /// The same event marked anonymous: [`lookup`] already matched topic0, so decoding skips
    /// alloy's check of it (which hashes the signature again for every log).
    decoder: Event,
    /// `Transfer(address,address,uint256)`.
    pub signature: String,
    /// Topics a log of it has: topic0 plus one per indexed argument.
    pub topics: usize,
}

fn table() -> &'static HashMap<(B256, usize), KnownEvent> {
    static TABLE: OnceLock<HashMap<(B256, usize), KnownEvent>> = OnceLock::new();
    TABLE.get_or_init(|| {
        KNOWN_EVENTS
            .iter()
            .map(|text| {
                let event = Event::parse(text).expect("the known event declarations parse");
                let topics = 1 + event.inputs.iter().filter(|input| input.indexed).count();
                let decoder = Event { anonymous: true, ..event.clone() };
                let known = KnownEvent { signature: event.signature(), topics, decoder, event };
                ((known.event.selector(), topics), known)
            })
            .collect()
    })
}

/// The known event a log with these topics is, if any.
pub fn lookup(topics: &[B256]) -> Option<&'static KnownEvent> {
    table().get(&(*topics.first()?, topics.len()))
}

/// topic0 of an event declaration in [`KNOWN_EVENTS`] (by its signature).
pub fn selector(signature: &str) -> B256 {
    alloy_primitives::keccak256(signature.as_bytes())
}

/// The decoded arguments of a log of `known`, by name, in declaration order; `None` when the
/// log does not decode as the event says (a contract reusing a name with other types).
pub fn decode(
    known: &KnownEvent,
    topics: &[B256],
    data: &[u8],
) -> Option<Vec<(String, DynSolValue)>> {
    let decoded = known.decoder.decode_log_parts(topics.iter().skip(1).copied(), data).ok()?;
    let (mut indexed, mut body) = (decoded.indexed.into_iter(), decoded.body.into_iter());
    known
        .event
        .inputs
        .iter()
        .map(|input| {
            let value = if input.indexed { indexed.next() } else { body.next() }?;
            Some((input.name.clone(), value))
        })
        .collect()
}

/// `params` of a `decoded_log` record: integers as decimal strings, addresses and bytes as
/// lowercase hex, arrays as arrays.
pub fn params_json(params: &[(String, DynSolValue)]) -> Value {
    let mut object = Map::new();
    for (name, value) in params {
        object.insert(name.clone(), value_json(value));
    }
    Value::Object(object)
}

pub fn value_json(value: &DynSolValue) -> Value {
    match value {
        DynSolValue::Address(address) => json!(format!("{address:#x}")),
        DynSolValue::Bool(b) => json!(b),
        DynSolValue::Uint(n, _) => json!(n.to_string()),
        DynSolValue::Int(n, _) => json!(n.to_string()),
        DynSolValue::FixedBytes(word, size) => {
            json!(format!("0x{}", alloy_primitives::hex::encode(&word[..*size])))
        }
        DynSolValue::Bytes(bytes) => json!(format!("0x{}", alloy_primitives::hex::encode(bytes))),
        DynSolValue::String(text) => json!(text),
        DynSolValue::Array(items) | DynSolValue::FixedArray(items) | DynSolValue::Tuple(items) => {
            Value::Array(items.iter().map(value_json).collect())
        }
        DynSolValue::Function(function) => {
            json!(format!("0x{}", alloy_primitives::hex::encode(function.as_slice())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erc20_and_erc721_transfers_are_told_apart_by_their_topics() {
        let transfer = selector("Transfer(address,address,uint256)");
        let erc20 = lookup(&[transfer, B256::ZERO, B256::ZERO]).unwrap();
        let erc721 = lookup(&[transfer, B256::ZERO, B256::ZERO, B256::ZERO]).unwrap();
        assert_eq!(erc20.event.inputs[2].name, "value");
        assert_eq!(erc721.event.inputs[2].name, "tokenId");
        assert!(lookup(&[transfer]).is_none());
    }

    #[test]
    fn every_known_event_has_a_distinct_selector_and_topic_count() {
        assert_eq!(table().len(), KNOWN_EVENTS.len());
    }
}
