//! Hyperliquid records: blocks, trades, fills (one per side of a trade), order status
//! changes and miscellaneous ledger events, in Hyperliquid's own field names. The generator
//! wraps each as `{"payload": {...}}`, as Allium's Hyperliquid topics carry them.

use std::collections::VecDeque;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::{Map, Value, json};

use crate::accounts::Accounts;
use crate::blocks::{Block, BlockCursor};
use crate::chains::Cadence;
use crate::encoding::{hex, random_address, random_hash, random_hex};

/// A TWAP slice's fill carries the all-zero hash, as do funding and reward events.
const ZERO_HASH: &str = "0x0000000000000000000000000000000000000000000000000000000000000000";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HyperliquidEntity {
    Block,
    Trade,
    Fill,
    Order,
    MiscEvent,
}

struct Market {
    coin: &'static str,
    /// For spot pairs, the base token (spot fills pay buy-side fees in it).
    spot_base: Option<&'static str>,
    px: f64,
    px_decimals: usize,
    sz_decimals: usize,
    weight: u32,
}

const fn market(
    coin: &'static str,
    px: f64,
    px_decimals: usize,
    sz_decimals: usize,
    weight: u32,
) -> Market {
    Market { coin, spot_base: None, px, px_decimals, sz_decimals, weight }
}

fn markets() -> Vec<Market> {
    vec![
        market("BTC", 104_000.0, 0, 5, 30),
        market("ETH", 3_600.0, 1, 4, 20),
        market("HYPE", 38.0, 3, 2, 15),
        market("SOL", 170.0, 2, 2, 8),
        market("XRP", 2.2, 4, 0, 6),
        market("DOGE", 0.21, 5, 0, 4),
        market("kPEPE", 0.012, 6, 0, 4),
        market("FARTCOIN", 1.1, 4, 1, 3),
        // Spot: HYPE/USDC is spot index 107, written `@107`.
        Market { spot_base: Some("HYPE"), ..market("@107", 38.0, 4, 2, 8) },
        Market { spot_base: Some("PURR"), ..market("PURR/USDC", 0.2, 5, 0, 2) },
    ]
}

struct OpenOrder {
    user: String,
    market: usize,
    side: &'static str,
    limit_px: String,
    orig_sz: String,
    oid: u64,
    timestamp: i64,
    tif: &'static str,
    reduce_only: bool,
    cloid: Value,
}

pub(crate) struct HyperliquidFeed {
    entity: HyperliquidEntity,
    blocks: BlockCursor,
    users: Accounts,
    validators: Vec<String>,
    vaults: Vec<String>,
    markets: Vec<Market>,
    open_orders: VecDeque<OpenOrder>,
    pending: VecDeque<Map<String, Value>>,
    /// The block that already has its zero-hash batch (funding or rewards): keys of those
    /// events are time, type and user, so one batch per block keeps them distinct.
    zero_hash_block: Option<u64>,
    next_oid: u64,
}

fn decimal(value: f64, decimals: usize) -> String {
    format!("{value:.decimals$}")
}

impl HyperliquidFeed {
    pub(crate) fn new(entity: HyperliquidEntity, rng: &mut StdRng, cadence: Cadence) -> Self {
        let (plan, grow) = match entity {
            HyperliquidEntity::Block => ((1, 1), false),
            HyperliquidEntity::Trade => ((1, 30), true),
            HyperliquidEntity::Fill => ((2, 60), true),
            HyperliquidEntity::Order => ((5, 100), true),
            HyperliquidEntity::MiscEvent => ((1, 5), true),
        };
        Self {
            entity,
            blocks: BlockCursor::new(cadence, plan, grow),
            users: Accounts::new(rng, 1_000, random_address, 0.2),
            validators: (0..24).map(|_| random_address(rng)).collect(),
            vaults: (0..12).map(|_| random_address(rng)).collect(),
            markets: markets(),
            open_orders: VecDeque::new(),
            pending: VecDeque::new(),
            zero_hash_block: None,
            next_oid: rng.gen_range(90_000_000_000..95_000_000_000),
        }
    }

    pub(crate) fn next_record(&mut self, rng: &mut StdRng, now_ms: i64) -> Map<String, Value> {
        if let Some(record) = self.pending.pop_front() {
            return record;
        }
        let (block, _) = self.blocks.next(rng, now_ms);
        match self.entity {
            HyperliquidEntity::Block => self.block(rng, &block),
            HyperliquidEntity::Trade => self.trade(rng, &block),
            HyperliquidEntity::Fill => {
                let mut fills = self.fills(rng, &block);
                let first = fills.remove(0);
                self.pending.extend(fills);
                first
            }
            HyperliquidEntity::Order => self.order(rng, &block),
            HyperliquidEntity::MiscEvent => {
                let mut events = self.misc_events(rng, &block);
                let first = events.remove(0);
                self.pending.extend(events);
                first
            }
        }
    }

    fn block(&self, rng: &mut StdRng, block: &Block) -> Map<String, Value> {
        let busy: f64 = rng.r#gen();
        let mut record = Map::new();
        record.insert("height".into(), json!(block.number));
        record.insert("blockTime".into(), json!(block.time_ms));
        record.insert("hash".into(), json!(hex(&block.hash)));
        record.insert("proposer".into(), json!(self.validators.choose(rng).expect("validators")));
        record.insert("numTxs".into(), json!((busy * busy * 4_000.0) as u64));
        record
    }

    fn pick_market(&mut self, rng: &mut StdRng) -> usize {
        let total: u32 = self.markets.iter().map(|m| m.weight).sum();
        let mut roll = rng.gen_range(0..total);
        let index = self
            .markets
            .iter()
            .position(|m| {
                if roll < m.weight {
                    return true;
                }
                roll -= m.weight;
                false
            })
            .expect("the roll is below the total weight");
        let market = &mut self.markets[index];
        market.px *= 1.0 + rng.gen_range(-0.0008..0.0008);
        index
    }

    /// A size worth between $10 and $200k at the market's price.
    fn size(rng: &mut StdRng, market: &Market) -> f64 {
        let notional = 10f64.powf(rng.gen_range(1.0..5.3));
        let unit = 10f64.powi(-(market.sz_decimals as i32));
        ((notional / market.px / unit).round() * unit).max(unit)
    }

    fn trade(&mut self, rng: &mut StdRng, block: &Block) -> Map<String, Value> {
        let index = self.pick_market(rng);
        let market = &self.markets[index];
        let sz = Self::size(rng, market);
        let mut record = Map::new();
        record.insert("coin".into(), json!(market.coin));
        record.insert("side".into(), json!(if rng.gen_bool(0.5) { "B" } else { "A" }));
        record.insert("px".into(), json!(decimal(market.px, market.px_decimals)));
        record.insert("sz".into(), json!(decimal(sz, market.sz_decimals)));
        let hash = if rng.gen_bool(0.03) { ZERO_HASH.to_owned() } else { random_hash(rng) };
        record.insert("hash".into(), json!(hash));
        record.insert("time".into(), json!(block.time_ms));
        record.insert("tid".into(), json!(rng.gen_range(0..1u64 << 50)));
        record.insert("users".into(), json!([self.users.pick(rng), self.users.pick(rng)]));
        record
    }

    /// The two fills of one trade: the buyer's (`B`) and the seller's (`A`).
    fn fills(&mut self, rng: &mut StdRng, block: &Block) -> Vec<Map<String, Value>> {
        let index = self.pick_market(rng);
        let market = &self.markets[index];
        let sz = Self::size(rng, market);
        let notional = sz * market.px;
        let twap = rng.gen_bool(0.03);
        let hash = if twap { ZERO_HASH.to_owned() } else { random_hash(rng) };
        let tid = rng.gen_range(0..1u64 << 50);
        let buyer_takes = rng.gen_bool(0.5);
        let liquidated_side = if rng.gen_bool(0.01) { Some(rng.gen_bool(0.5)) } else { None };
        let builder = rng.gen_bool(0.08).then(|| self.vaults[0].clone());
        let mut fills = Vec::with_capacity(2);
        for buyer in [true, false] {
            let user = self.users.pick(rng);
            let crossed = buyer == buyer_takes;
            let start = if rng.gen_bool(0.3) { 0.0 } else { rng.gen_range(-5.0..5.0) * sz };
            let (start, dir, closing) = match (market.spot_base, buyer) {
                (Some(_), true) => (start.abs(), "Buy", false),
                (Some(_), false) => (start.abs() + sz, "Sell", false),
                (None, true) if start < 0.0 => (start, "Close Short", true),
                (None, true) => (start, "Open Long", false),
                (None, false) if start > 0.0 => (start, "Close Long", true),
                (None, false) => (start, "Open Short", false),
            };
            let rate = if crossed { 0.00045 } else { 0.00015 };
            let (fee, fee_token) = match market.spot_base {
                Some(base) if buyer => (sz * rate, base),
                _ => (notional * rate, "USDC"),
            };
            let closed_pnl = if closing {
                decimal(notional * rng.gen_range(-0.03..0.03), 6)
            } else {
                "0.0".to_owned()
            };
            let mut fill = Map::new();
            fill.insert("user".into(), json!(user));
            fill.insert("coin".into(), json!(market.coin));
            fill.insert("px".into(), json!(decimal(market.px, market.px_decimals)));
            fill.insert("sz".into(), json!(decimal(sz, market.sz_decimals)));
            fill.insert("side".into(), json!(if buyer { "B" } else { "A" }));
            fill.insert("time".into(), json!(block.time_ms));
            fill.insert("startPosition".into(), json!(decimal(start, market.sz_decimals)));
            fill.insert("dir".into(), json!(dir));
            fill.insert("closedPnl".into(), json!(closed_pnl));
            fill.insert("hash".into(), json!(hash));
            fill.insert("oid".into(), json!(self.next_oid));
            self.next_oid += rng.gen_range(1..40);
            fill.insert("crossed".into(), json!(crossed));
            fill.insert("fee".into(), json!(decimal(fee, 6)));
            fill.insert("feeToken".into(), json!(fee_token));
            fill.insert("tid".into(), json!(tid));
            let twap_id = (twap && crossed).then(|| rng.gen_range(100_000..2_000_000u64));
            fill.insert("twapId".into(), json!(twap_id));
            if let (Some(address), true) = (&builder, crossed) {
                fill.insert("builderFee".into(), json!(decimal(notional * 0.0001, 6)));
                fill.insert("builderAddress".into(), json!(address));
            }
            if liquidated_side == Some(buyer) {
                let mark = market.px * (1.0 + rng.gen_range(-0.001..0.001));
                fill.insert(
                    "liquidation".into(),
                    json!({
                        "liquidatedUser": user,
                        "markPx": decimal(mark, market.px_decimals),
                        "method": "market",
                    }),
                );
            }
            fills.push(fill);
        }
        fills
    }

    fn order(&mut self, rng: &mut StdRng, block: &Block) -> Map<String, Value> {
        let resolve =
            !self.open_orders.is_empty() && (self.open_orders.len() >= 500 || rng.gen_bool(0.45));
        let (order, status, hash) = if resolve {
            let pick = rng.gen_range(0..self.open_orders.len());
            let order = self.open_orders.remove(pick).expect("index is in range");
            let (status, hash) = match rng.gen_range(0..100) {
                0..35 => ("filled", json!(random_hash(rng))),
                35..90 => ("canceled", json!(random_hash(rng))),
                90..95 => ("marginCanceled", Value::Null),
                _ => ("reduceOnlyCanceled", Value::Null),
            };
            (order, status, hash)
        } else {
            let index = self.pick_market(rng);
            let market = &self.markets[index];
            let buy = rng.gen_bool(0.5);
            // Resting orders sit a little away from the market.
            let offset = rng.gen_range(0.0..0.02) * if buy { -1.0 } else { 1.0 };
            let tif = *["Gtc", "Gtc", "Gtc", "Alo", "Ioc"].choose(rng).expect("non-empty");
            let order = OpenOrder {
                user: self.users.pick(rng),
                market: index,
                side: if buy { "B" } else { "A" },
                limit_px: decimal(market.px * (1.0 + offset), market.px_decimals),
                orig_sz: decimal(Self::size(rng, market), market.sz_decimals),
                oid: self.next_oid,
                timestamp: block.time_ms,
                tif,
                reduce_only: rng.gen_bool(0.1),
                cloid: if rng.gen_bool(0.3) { json!(random_hex(rng, 16)) } else { Value::Null },
            };
            self.next_oid += rng.gen_range(1..40);
            let status = match (tif, rng.gen_range(0..100)) {
                ("Alo", 0..20) => "badAloPxRejected",
                ("Ioc", 0..30) => "iocCancelRejected",
                (_, 0..3) => "perpMarginRejected",
                _ => "open",
            };
            (order, status, json!(random_hash(rng)))
        };
        let market = &self.markets[order.market];
        let remaining = if status == "filled" { decimal(0.0, 1) } else { order.orig_sz.clone() };
        let builder =
            if rng.gen_bool(0.1) { json!({"b": self.vaults[0], "f": 10}) } else { Value::Null };
        let mut record = Map::new();
        record.insert("time".into(), json!(block.time_ms));
        record.insert("user".into(), json!(order.user));
        record.insert("hash".into(), hash);
        record.insert("builder".into(), builder);
        record.insert("status".into(), json!(status));
        record.insert(
            "order".into(),
            json!({
                "coin": market.coin,
                "side": order.side,
                "limitPx": order.limit_px,
                "sz": remaining,
                "origSz": order.orig_sz,
                "oid": order.oid,
                "timestamp": order.timestamp,
                "orderType": "Limit",
                "tif": order.tif,
                "reduceOnly": order.reduce_only,
                "cloid": order.cloid,
            }),
        );
        if status == "open" {
            self.open_orders.push_back(order);
        }
        record
    }

    #[allow(
        clippy::too_many_lines,
        reason = "one match over every kind of miscellaneous event the feed makes, each arm \
                  beside its share of the rolls"
    )]
    fn misc_events(&mut self, rng: &mut StdRng, block: &Block) -> Vec<Map<String, Value>> {
        let event = |kind: &str, user: &str, hash: &str, inner: Value| {
            let mut record = Map::new();
            record.insert("time".into(), json!(block.time_ms));
            record.insert("hash".into(), json!(hash));
            record.insert("type".into(), json!(kind));
            record.insert("user".into(), json!(user));
            let mut wrapper = Map::new();
            wrapper.insert(kind.to_owned(), inner);
            record.insert("inner".into(), Value::Object(wrapper));
            record
        };
        let roll = rng.gen_range(0..100);
        let batch_free = self.zero_hash_block != Some(block.number);
        if batch_free && roll < 22 {
            self.zero_hash_block = Some(block.number);
            if roll < 15 {
                let count = rng.gen_range(3..=12);
                let users = self.users.distinct(rng, count);
                return users
                    .iter()
                    .map(|user| {
                        let index = self.pick_market(rng);
                        let market = &self.markets[index];
                        let szi = rng.gen_range(-5.0..5.0) * Self::size(rng, market);
                        let rate = rng.gen_range(-0.00002..0.00005);
                        let inner = json!({
                            "coin": market.coin,
                            "usdc": decimal(-szi * market.px * rate, 6),
                            "szi": decimal(szi, market.sz_decimals),
                            "fundingRate": decimal(rate, 8),
                        });
                        event("Funding", user, ZERO_HASH, inner)
                    })
                    .collect();
            }
            let count = rng.gen_range(2..=6);
            let validators = rand::seq::index::sample(rng, self.validators.len(), count);
            return validators
                .into_iter()
                .map(|index| {
                    let validator = &self.validators[index];
                    let reward = decimal(rng.gen_range(0.5..40.0), 8);
                    event(
                        "ValidatorRewards",
                        validator,
                        ZERO_HASH,
                        json!({"validator": validator, "reward": reward}),
                    )
                })
                .collect();
        }
        let user = self.users.pick(rng);
        let hash = random_hash(rng);
        let usd = decimal(10f64.powf(rng.gen_range(1.0..5.5)), 2);
        let vault = self.vaults.choose(rng).expect("vaults are generated").clone();
        let record = match roll % 7 {
            0 => event("CDeposit", &user, &hash, json!({"user": user, "amount": usd})),
            1 => event(
                "CWithdrawal",
                &user,
                &hash,
                json!({"user": user, "amount": usd, "isFinalized": rng.gen_bool(0.8)}),
            ),
            2 => event(
                "VaultDeposit",
                &user,
                &hash,
                json!({"vault": vault, "user": user, "usdc": usd}),
            ),
            3 => event(
                "VaultWithdrawal",
                &user,
                &hash,
                json!({"vault": vault, "user": user, "requestedUsd": usd}),
            ),
            4 | 5 => event(
                "SpotTransfer",
                &user,
                &hash,
                json!({
                    "token": "USDC", "amount": usd, "usdcValue": usd, "user": user,
                    "destination": self.users.pick(rng), "fee": "0.0",
                }),
            ),
            _ => {
                let index = self.pick_market(rng);
                let market = &self.markets[index];
                let szi = rng.gen_range(-5.0..5.0) * Self::size(rng, market);
                event(
                    "LedgerLiquidation",
                    &user,
                    &hash,
                    json!({
                        "accountValue": decimal(rng.gen_range(0.0..5_000.0), 6),
                        "leverageType": "Cross",
                        "liquidatedPositions": [{"coin": market.coin, "szi": decimal(szi, market.sz_decimals)}],
                    }),
                )
            }
        };
        vec![record]
    }
}
