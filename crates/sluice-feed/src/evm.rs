//! EVM records: raw and decoded logs, and ERC-20, ERC-721 and ERC-1155 transfers.
//!
//! Within a block, transactions follow each other with increasing `transaction_index`, each
//! emitting a few logs with block-wide increasing `log_index`; transfer streams skip the
//! indexes of the other logs a real transaction emits.

use std::collections::VecDeque;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::{Map, Value, json};

use crate::accounts::Accounts;
use crate::blocks::{Block, BlockCursor};
use crate::chains::{Cadence, Token};
use crate::encoding::{address_topic, format_units, hex, random_address, random_hash, uword, word};

const TRANSFER: &str = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef";
const APPROVAL: &str = "0x8c5be1e5ebec7d5bd14f71427d1e84f3dd0314c0f7b2291e5b200ac8c7c3b925";
const SWAP_V2: &str = "0xd78ad95fa46c994b6551d0da85fc275fe613ce37657fb8d5e3d130840159d822";
const SWAP_V3: &str = "0xc42079f94a6350d7e6235f29174924f928cc2ac818eb64fed8004e115fbcca67";
const SYNC: &str = "0x1c411e9a96e071241c2f21f7726b17ae89e3cab4c78be50e062b03a9fffbbad1";
const DEPOSIT: &str = "0xe1fffcc4923d04b559f4d29a8bfc6cda04eb5b0d3c460751c2402c5c5cc9109c";
const WITHDRAWAL: &str = "0x7fcf532c15f0a6db0bd6d0e038bea71d30d808c7d98cb3bf7268a95bf5081b65";
const ZERO_ADDRESS: &str = "0x0000000000000000000000000000000000000000";
/// `type(uint256).max`, the usual "unlimited" approval.
const MAX_UINT256: &str = "115792089237316195423570985484697920938463463374607431768211455";

/// Share of ERC-20 transfers (and token logs) on one of the chain's well-known tokens.
pub(crate) const WELL_KNOWN_SHARE: f64 = 0.25;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvmEntity {
    Log,
    DecodedLog,
    Erc20,
    Erc721,
    Erc1155,
}

#[derive(Debug, Clone)]
struct Asset {
    address: String,
    symbol: String,
    name: String,
    decimals: u8,
}

impl From<&Token> for Asset {
    fn from(token: &Token) -> Self {
        Self {
            address: token.address.to_owned(),
            symbol: token.symbol.to_owned(),
            name: token.name.to_owned(),
            decimals: token.decimals,
        }
    }
}

struct Transaction {
    hash: String,
    index: u64,
    from: String,
    to: String,
    logs_left: u32,
}

pub(crate) struct EvmFeed {
    entity: EvmEntity,
    blocks: BlockCursor,
    wallets: Accounts,
    well_known: Vec<Asset>,
    /// Share of token picks that are a well-known token.
    pub(crate) well_known_share: f64,
    tokens: Vec<Asset>,
    collections: Vec<Asset>,
    /// DEX pools, routers and other contracts.
    contracts: Vec<String>,
    transaction: Option<Transaction>,
    next_transaction_index: u64,
    next_log_index: u64,
    pending: VecDeque<Map<String, Value>>,
}

const SYLLABLES: &[&str] = &[
    "ba", "zor", "ki", "lu", "mo", "nex", "pe", "qua", "ri", "so", "ta", "vy", "wen", "xo", "dra",
    "fi", "gon", "hy", "jet", "ra",
];
const NAME_SUFFIXES: &[&str] = &["", " Token", " Coin", " Finance", " Protocol", " AI", " Inu"];
const ADJECTIVES: &[&str] =
    &["Based", "Pixel", "Cosmic", "Lazy", "Onchain", "Tiny", "Degen", "Neon", "Golden", "Quiet"];
const NOUNS: &[&str] =
    &["Punks", "Frogs", "Apes", "Cats", "Explorers", "Gardens", "Robots", "Wizards", "Badges"];

fn invented_token(rng: &mut StdRng) -> Asset {
    let syllables = rng.gen_range(2..=3);
    let mut stem: String =
        (0..syllables).map(|_| *SYLLABLES.choose(rng).expect("non-empty")).collect();
    if let Some(first) = stem.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    let symbol: String = stem.chars().filter(|c| c.is_ascii_alphabetic()).take(5).collect();
    let name = format!("{stem}{}", NAME_SUFFIXES.choose(rng).expect("non-empty"));
    let decimals = *[18u8, 18, 18, 18, 9, 6].choose(rng).expect("non-empty");
    Asset { address: random_address(rng), symbol: symbol.to_ascii_uppercase(), name, decimals }
}

fn invented_collection(rng: &mut StdRng) -> Asset {
    let adjective = ADJECTIVES.choose(rng).expect("non-empty");
    let noun = NOUNS.choose(rng).expect("non-empty");
    let symbol = format!("{}{}", &adjective[..1], &noun[..1]).to_ascii_uppercase();
    Asset { address: random_address(rng), symbol, name: format!("{adjective} {noun}"), decimals: 0 }
}

/// Typical transfer size in whole tokens, as a range of powers of ten.
fn magnitude(symbol: &str) -> (f64, f64) {
    match symbol {
        "USDC" | "USDT" | "DAI" | "USDbC" | "USDC.e" => (-1.0, 5.0),
        "WETH" => (-4.0, 1.5),
        "cbBTC" | "WBTC" => (-5.0, 0.5),
        _ => (0.0, 6.5),
    }
}

/// A random transfer amount of `asset` in base units.
fn raw_amount(rng: &mut StdRng, asset: &Asset) -> u128 {
    let (low, high) = magnitude(&asset.symbol);
    let exponent = rng.gen_range(low..high) + f64::from(asset.decimals);
    let raw = 10f64.powf(exponent) as u128;
    // People often send round amounts.
    let round = 10u128.pow(u32::from(asset.decimals.saturating_sub(2)));
    let raw = if rng.gen_bool(0.3) && raw > round { raw / round * round } else { raw };
    raw.max(1)
}

fn insert_amounts(record: &mut Map<String, Value>, raw: u128, decimals: u8) {
    let amount = format_units(raw, decimals);
    record.insert("raw_amount_str".into(), json!(raw.to_string()));
    record.insert("raw_amount".into(), json!(raw as f64));
    record.insert("amount".into(), json!(amount.parse::<f64>().unwrap_or(0.0)));
    record.insert("amount_str".into(), json!(amount));
}

/// The parts of one log.
struct LogEvent {
    address: String,
    topics: Vec<String>,
    data: String,
    name: &'static str,
    signature: &'static str,
    params: Value,
}

impl EvmFeed {
    pub(crate) fn new(
        entity: EvmEntity,
        rng: &mut StdRng,
        cadence: Cadence,
        well_known: &[Token],
    ) -> Self {
        let plan = match entity {
            EvmEntity::Log => (20, 200),
            EvmEntity::DecodedLog => (10, 120),
            EvmEntity::Erc20 => (5, 60),
            EvmEntity::Erc721 => (1, 8),
            EvmEntity::Erc1155 => (1, 6),
        };
        Self {
            entity,
            blocks: BlockCursor::new(cadence, plan, true),
            wallets: Accounts::new(rng, 400, random_address, 0.25),
            well_known: well_known.iter().map(Asset::from).collect(),
            well_known_share: WELL_KNOWN_SHARE,
            tokens: (0..80).map(|_| invented_token(rng)).collect(),
            collections: (0..40).map(|_| invented_collection(rng)).collect(),
            contracts: (0..60).map(|_| random_address(rng)).collect(),
            transaction: None,
            next_transaction_index: 0,
            next_log_index: 0,
            pending: VecDeque::new(),
        }
    }

    pub(crate) fn next_record(&mut self, rng: &mut StdRng, now_ms: i64) -> Map<String, Value> {
        if let Some(record) = self.pending.pop_front() {
            return record;
        }
        let (block, new_block) = self.blocks.next(rng, now_ms);
        if new_block {
            self.transaction = None;
            self.next_transaction_index = rng.gen_range(0..3);
            self.next_log_index = 0;
        }
        // Transfers are a subset of a transaction's logs: skip the others' indexes.
        let (logs_per_transaction, skip) = match self.entity {
            EvmEntity::Log | EvmEntity::DecodedLog => (1..=6, 0..=1),
            _ => (1..=3, 0..=3),
        };
        if self.transaction.as_ref().is_none_or(|t| t.logs_left == 0) {
            let index = self.next_transaction_index;
            self.next_transaction_index += 1 + rng.gen_range(skip.clone());
            self.next_log_index += rng.gen_range(skip.clone());
            self.transaction = Some(Transaction {
                hash: random_hash(rng),
                index,
                from: self.wallets.pick(rng),
                to: self.contracts.choose(rng).expect("contracts are generated").clone(),
                logs_left: rng.gen_range(logs_per_transaction),
            });
        }
        let log_index = self.next_log_index;
        self.next_log_index += 1 + rng.gen_range(skip);
        let transaction = self.transaction.as_mut().expect("set just above");
        transaction.logs_left -= 1;

        let mut record = Map::new();
        match self.entity {
            EvmEntity::Log | EvmEntity::DecodedLog => {
                let decoded = self.entity == EvmEntity::DecodedLog;
                let event = self.log_event(rng, decoded);
                self.insert_log(&mut record, event, decoded);
            }
            EvmEntity::Erc20 => self.insert_erc20(rng, &mut record),
            EvmEntity::Erc721 => self.insert_erc721(rng, &mut record),
            EvmEntity::Erc1155 => {
                let items = self.erc1155_items(rng);
                let mut items = items.into_iter();
                record = items.next().expect("at least one item");
                for mut item in items {
                    self.insert_position(&mut item, &block, log_index);
                    self.pending.push_back(item);
                }
            }
        }
        self.insert_position(&mut record, &block, log_index);
        record
    }

    /// Block, transaction and log position fields.
    fn insert_position(&self, record: &mut Map<String, Value>, block: &Block, log_index: u64) {
        let transaction = self.transaction.as_ref().expect("a record belongs to a transaction");
        record.insert("transaction_hash".into(), json!(transaction.hash));
        record.insert("transaction_index".into(), json!(transaction.index));
        record.insert("log_index".into(), json!(log_index));
        record.insert("block_number".into(), json!(block.number));
        record.insert("block_timestamp".into(), json!(crate::block_timestamp(block.time_ms)));
        record.insert("block_hash".into(), json!(hex(&block.hash)));
    }

    fn pick_token(&self, rng: &mut StdRng) -> Asset {
        if !self.well_known.is_empty() && rng.gen_bool(self.well_known_share) {
            self.well_known.choose(rng).expect("non-empty").clone()
        } else {
            self.tokens.choose(rng).expect("tokens are generated").clone()
        }
    }

    /// The chain's wrapped native token, for WETH deposit and withdrawal logs.
    fn wrapped_native(&self, rng: &mut StdRng) -> Asset {
        let wrapped = self.well_known.iter().find(|t| matches!(t.symbol.as_str(), "WETH" | "WPOL"));
        wrapped.cloned().unwrap_or_else(|| self.pick_token(rng))
    }

    fn contract(&self, rng: &mut StdRng) -> String {
        self.contracts.choose(rng).expect("contracts are generated").clone()
    }

    #[allow(
        clippy::too_many_lines,
        reason = "one match over every kind of log the feed makes, each arm beside its share of \
                  the rolls"
    )]
    fn log_event(&self, rng: &mut StdRng, decodable_only: bool) -> LogEvent {
        let roll = rng.gen_range(0..if decodable_only { 90 } else { 100 });
        match roll {
            0..40 => {
                let token = self.pick_token(rng);
                let (from, to) = (self.wallets.pick(rng), self.wallets.pick(rng));
                let value = raw_amount(rng, &token);
                LogEvent {
                    topics: vec![TRANSFER.into(), address_topic(&from), address_topic(&to)],
                    data: format!("0x{}", uword(value)),
                    name: "Transfer",
                    signature: "Transfer(address,address,uint256)",
                    params: json!({"from": from, "to": to, "value": value.to_string()}),
                    address: token.address,
                }
            }
            40..48 => {
                let token = self.pick_token(rng);
                let owner = self.wallets.pick(rng);
                let spender = self.contract(rng);
                let (data, value) = if rng.gen_bool(0.6) {
                    (format!("0x{}", "f".repeat(64)), MAX_UINT256.to_owned())
                } else {
                    let value = raw_amount(rng, &token);
                    (format!("0x{}", uword(value)), value.to_string())
                };
                LogEvent {
                    topics: vec![APPROVAL.into(), address_topic(&owner), address_topic(&spender)],
                    data,
                    name: "Approval",
                    signature: "Approval(address,address,uint256)",
                    params: json!({"owner": owner, "spender": spender, "value": value}),
                    address: token.address,
                }
            }
            48..62 => {
                let address = self.contract(rng);
                let router = self.contracts[0].clone();
                let recipient = self.wallets.pick(rng);
                let amount0: i128 = rng.gen_range(10i128.pow(6)..10i128.pow(22));
                let amount1: i128 = -rng.gen_range(10i128.pow(6)..10i128.pow(22));
                let (amount0, amount1) =
                    if rng.gen_bool(0.5) { (amount0, amount1) } else { (amount1, amount0) };
                let sqrt_price: u128 = rng.gen_range(2u128.pow(64)..2u128.pow(100));
                let liquidity: u128 = rng.gen_range(10u128.pow(15)..10u128.pow(24));
                let tick: i128 = rng.gen_range(-887_272..887_272);
                LogEvent {
                    address,
                    topics: vec![SWAP_V3.into(), address_topic(&router), address_topic(&recipient)],
                    data: format!(
                        "0x{}{}{}{}{}",
                        word(amount0),
                        word(amount1),
                        uword(sqrt_price),
                        uword(liquidity),
                        word(tick)
                    ),
                    name: "Swap",
                    signature: "Swap(address,address,int256,int256,uint160,uint128,int24)",
                    params: json!({
                        "sender": router, "recipient": recipient,
                        "amount0": amount0.to_string(), "amount1": amount1.to_string(),
                        "sqrtPriceX96": sqrt_price.to_string(), "liquidity": liquidity.to_string(),
                        "tick": tick.to_string(),
                    }),
                }
            }
            62..72 => {
                let address = self.contract(rng);
                let reserve0: u128 = rng.gen_range(10u128.pow(12)..10u128.pow(26));
                let reserve1: u128 = rng.gen_range(10u128.pow(12)..10u128.pow(26));
                LogEvent {
                    address,
                    topics: vec![SYNC.into()],
                    data: format!("0x{}{}", uword(reserve0), uword(reserve1)),
                    name: "Sync",
                    signature: "Sync(uint112,uint112)",
                    params: json!({"reserve0": reserve0.to_string(), "reserve1": reserve1.to_string()}),
                }
            }
            72..82 => {
                let address = self.contract(rng);
                let router = self.contracts[0].clone();
                let to = self.wallets.pick(rng);
                let amount_in: u128 = rng.gen_range(10u128.pow(6)..10u128.pow(22));
                let amount_out: u128 = rng.gen_range(10u128.pow(6)..10u128.pow(22));
                let zero_first = rng.gen_bool(0.5);
                let amounts: [u128; 4] = if zero_first {
                    [0, amount_in, amount_out, 0]
                } else {
                    [amount_in, 0, 0, amount_out]
                };
                LogEvent {
                    address,
                    topics: vec![SWAP_V2.into(), address_topic(&router), address_topic(&to)],
                    data: format!("0x{}", amounts.iter().map(|&a| uword(a)).collect::<String>()),
                    name: "Swap",
                    signature: "Swap(address,uint256,uint256,uint256,uint256,address)",
                    params: json!({
                        "sender": router, "to": to,
                        "amount0In": amounts[0].to_string(), "amount1In": amounts[1].to_string(),
                        "amount0Out": amounts[2].to_string(), "amount1Out": amounts[3].to_string(),
                    }),
                }
            }
            82..90 => {
                let token = self.wrapped_native(rng);
                let account = self.wallets.pick(rng);
                let wad = raw_amount(rng, &token);
                let deposit = roll < 86;
                let (topic0, name, signature, param) = if deposit {
                    (DEPOSIT, "Deposit", "Deposit(address,uint256)", "dst")
                } else {
                    (WITHDRAWAL, "Withdrawal", "Withdrawal(address,uint256)", "src")
                };
                let mut params = Map::new();
                params.insert(param.into(), json!(account));
                params.insert("wad".into(), json!(wad.to_string()));
                LogEvent {
                    address: token.address,
                    topics: vec![topic0.into(), address_topic(&account)],
                    data: format!("0x{}", uword(wad)),
                    name,
                    signature,
                    params: Value::Object(params),
                }
            }
            _ => {
                // An event of a contract nobody decoded.
                let topics = (0..rng.gen_range(1..=4)).map(|_| random_hash(rng)).collect();
                let words = rng.gen_range(0..=4);
                let data: String = (0..words).map(|_| uword(rng.r#gen::<u128>())).collect();
                LogEvent {
                    address: self.contract(rng),
                    topics,
                    data: format!("0x{data}"),
                    name: "",
                    signature: "",
                    params: Value::Null,
                }
            }
        }
    }

    fn insert_log(&self, record: &mut Map<String, Value>, event: LogEvent, decoded: bool) {
        let transaction = self.transaction.as_ref().expect("a log belongs to a transaction");
        record.insert("address".into(), json!(event.address));
        record.insert("data".into(), json!(event.data));
        for index in 0..4 {
            record.insert(format!("topic{index}"), json!(event.topics.get(index)));
        }
        record.insert("from_address".into(), json!(transaction.from));
        record.insert("to_address".into(), json!(transaction.to));
        if decoded {
            record.insert("name".into(), json!(event.name));
            record.insert("signature".into(), json!(event.signature));
            record.insert("params".into(), event.params);
        }
    }

    /// Mints come from and burns go to the zero address.
    fn transfer_parties(&self, rng: &mut StdRng, mint_share: f64) -> (String, String) {
        let roll: f64 = rng.r#gen();
        if roll < mint_share {
            (ZERO_ADDRESS.to_owned(), self.wallets.pick(rng))
        } else if roll < mint_share * 1.5 {
            (self.wallets.pick(rng), ZERO_ADDRESS.to_owned())
        } else {
            (self.wallets.pick(rng), self.wallets.pick(rng))
        }
    }

    fn insert_token(record: &mut Map<String, Value>, asset: &Asset) {
        record.insert("token_address".into(), json!(asset.address));
        record.insert("token_name".into(), json!(asset.name));
        record.insert("token_symbol".into(), json!(asset.symbol));
    }

    fn insert_erc20(&self, rng: &mut StdRng, record: &mut Map<String, Value>) {
        let token = self.pick_token(rng);
        let (from, to) = self.transfer_parties(rng, 0.03);
        Self::insert_token(record, &token);
        record.insert("from_address".into(), json!(from));
        record.insert("to_address".into(), json!(to));
        insert_amounts(record, raw_amount(rng, &token), token.decimals);
    }

    fn insert_erc721(&self, rng: &mut StdRng, record: &mut Map<String, Value>) {
        let collection = self.collections.choose(rng).expect("collections are generated");
        let (from, to) = self.transfer_parties(rng, 0.1);
        Self::insert_token(record, collection);
        record.insert("from_address".into(), json!(from));
        record.insert("to_address".into(), json!(to));
        record.insert("token_id".into(), json!(rng.gen_range(1..10_000u32).to_string()));
    }

    /// One TransferSingle item, or the items of a TransferBatch (distinct token ids).
    fn erc1155_items(&self, rng: &mut StdRng) -> Vec<Map<String, Value>> {
        let collection = self.collections.choose(rng).expect("collections are generated");
        let (from, to) = self.transfer_parties(rng, 0.15);
        let operator = if rng.gen_bool(0.7) {
            if from == ZERO_ADDRESS { to.clone() } else { from.clone() }
        } else {
            self.contracts.choose(rng).expect("contracts are generated").clone()
        };
        let (event_type, count) = if rng.gen_bool(0.75) {
            ("TransferSingle", 1)
        } else {
            ("TransferBatch", rng.gen_range(2..=5))
        };
        let ids = rand::seq::index::sample(rng, 200, count);
        ids.into_iter()
            .map(|id| {
                let mut item = Map::new();
                item.insert("event_type".into(), json!(event_type));
                item.insert("operator".into(), json!(operator));
                item.insert("from_address".into(), json!(from));
                item.insert("to_address".into(), json!(to));
                Self::insert_token(&mut item, collection);
                item.insert("token_id".into(), json!(id.to_string()));
                let raw: u128 = if rng.gen_bool(0.6) { 1 } else { rng.gen_range(2..=50) };
                insert_amounts(&mut item, raw, 0);
                item
            })
            .collect()
    }
}
