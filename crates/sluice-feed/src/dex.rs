//! DEX trades (`dex_trade`): swaps in constant-product pools, one record per token side of a
//! swap, so the price service has realistic trades to turn into candles.
//!
//! Each pool pairs a token with a quote (a stablecoin, WETH or SOL). Prices follow a small
//! random walk from realistic starting points (USDC at 1, WETH near 3,600, an invented meme
//! token at a fraction of a cent); `usd_amount` is the same on both sides of a swap,
//! `token_amount` is `usd_amount / price` in the token's units, and `token_reserve` is the
//! pool's balance of the token after the swap.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::{Map, Value, json};

use crate::blocks::BlockCursor;
use crate::chains::{Cadence, Token};
use crate::encoding::{random_address, random_base58, random_hash};

struct Side {
    address: String,
    decimals: u8,
    /// USD per token.
    price: f64,
    /// Whether the price stays pegged near 1.
    stable: bool,
    /// The pool's balance, in token units.
    reserve: f64,
}

struct Pool {
    address: String,
    sides: [Side; 2],
}

pub(crate) struct DexFeed {
    chain: String,
    solana: bool,
    blocks: BlockCursor,
    pools: Vec<Pool>,
    /// The next swap's second record, already built.
    pending: Option<Map<String, Value>>,
    next_log_index: u64,
    last_block: u64,
}

/// Starting USD price of a well-known token, by symbol.
fn known_price(symbol: &str) -> Option<(f64, bool)> {
    Some(match symbol {
        "USDC" | "USDT" | "DAI" | "USDbC" | "USDC.e" => (1.0, true),
        "WETH" => (3_600.0, false),
        "cbBTC" | "WBTC" => (104_000.0, false),
        "AERO" => (1.2, false),
        "WPOL" => (0.45, false),
        "SOL" => (170.0, false),
        _ => return None,
    })
}

impl DexFeed {
    pub(crate) fn new(chain: &str, rng: &mut StdRng, cadence: Cadence, tokens: &[Token]) -> Self {
        let solana = chain == "solana";
        let address = |rng: &mut StdRng| {
            if solana { random_base58(rng, 32) } else { random_address(rng) }
        };
        let side = |address: String, decimals: u8, price: f64, stable: bool, usd: f64| Side {
            address,
            decimals,
            price,
            stable,
            reserve: usd / price,
        };
        let known: Vec<(&Token, f64, bool)> = tokens
            .iter()
            .filter_map(|t| known_price(t.symbol).map(|(price, stable)| (t, price, stable)))
            .collect();
        let mut quotes: Vec<(String, u8, f64, bool)> = known
            .iter()
            .filter(|(t, ..)| matches!(t.symbol, "USDC" | "WETH" | "SOL" | "WPOL"))
            .map(|(t, price, stable)| (t.address.to_owned(), t.decimals, *price, *stable))
            .collect();
        if quotes.is_empty() {
            // A chain without well-known tokens: an invented stablecoin quotes every pool.
            quotes.push((address(rng), 6, 1.0, true));
        }
        let mut pools = Vec::new();
        // Pools of the chain's well-known tokens against each quote but themselves.
        for (token, price, stable) in &known {
            for quote in &quotes {
                if quote.0 == token.address || (*stable && quote.3) {
                    continue;
                }
                let depth = 10f64.powf(rng.gen_range(6.0..8.0));
                pools.push(Pool {
                    address: address(rng),
                    sides: [
                        side(token.address.to_owned(), token.decimals, *price, *stable, depth),
                        side(quote.0.clone(), quote.1, quote.2, quote.3, depth),
                    ],
                });
            }
        }
        // Stable/volatile pairs among the quotes (USDC/WETH), and a long tail of small tokens.
        for _ in 0..12 {
            let quote = quotes.choose(rng).expect("at least one quote").clone();
            let decimals = *[18u8, 18, 9, 6].choose(rng).expect("non-empty");
            let decimals = if solana { decimals.min(9) } else { decimals };
            let price = 10f64.powf(rng.gen_range(-6.0..1.0));
            let depth = 10f64.powf(rng.gen_range(4.0..6.5));
            pools.push(Pool {
                address: address(rng),
                sides: [
                    side(address(rng), decimals, price, false, depth),
                    side(quote.0, quote.1, quote.2, quote.3, depth),
                ],
            });
        }
        Self {
            chain: chain.to_owned(),
            solana,
            blocks: BlockCursor::new(cadence, (1, 12), false),
            pools,
            pending: None,
            next_log_index: 0,
            last_block: u64::MAX,
        }
    }

    pub(crate) fn next_record(&mut self, rng: &mut StdRng, now_ms: i64) -> Map<String, Value> {
        if let Some(record) = self.pending.take() {
            return record;
        }
        let (block, _) = self.blocks.next(rng, now_ms);
        if block.number != self.last_block {
            self.last_block = block.number;
            self.next_log_index = rng.gen_range(0..40);
        }
        let transaction_hash = if self.solana { random_base58(rng, 64) } else { random_hash(rng) };
        let pool_index = rng.gen_range(0..self.pools.len());
        let pool = &mut self.pools[pool_index];
        // Trade sizes are log-uniform from $5 to $200k.
        let usd = (10f64.powf(rng.gen_range(0.7..5.3)) * 100.0).round() / 100.0;
        let buying_first = rng.gen_bool(0.5);
        for (index, side) in pool.sides.iter_mut().enumerate() {
            if !side.stable {
                let drift =
                    rng.gen_range(-0.002..0.002) + if buying_first { 0.0002 } else { -0.0002 };
                side.price *= 1.0 + drift;
            } else {
                side.price = 1.0 + rng.gen_range(-0.0005..0.0005);
            }
            let amount = usd / side.price;
            let out = (index == 0) == buying_first;
            side.reserve =
                if out { (side.reserve - amount).max(amount) } else { side.reserve + amount };
        }
        let block_timestamp = crate::block_timestamp(block.time_ms);
        let mut records = pool.sides.iter().map(|side| {
            let amount = usd / side.price;
            let log_index = self.next_log_index;
            self.next_log_index += 1 + u64::from(rng.gen_bool(0.3));
            let mut record = Map::new();
            record.insert("chain".into(), json!(self.chain));
            record.insert("token_address".into(), json!(side.address));
            record.insert("token_decimals".into(), json!(side.decimals));
            record.insert("token_amount".into(), json!(units(amount, side.decimals)));
            record.insert("usd_amount".into(), json!(format!("{usd:.2}")));
            record.insert("pool_address".into(), json!(pool.address));
            record.insert("token_reserve".into(), json!(units(side.reserve, side.decimals)));
            record.insert("block_number".into(), json!(block.number));
            record.insert("block_timestamp".into(), json!(block_timestamp));
            record.insert("transaction_hash".into(), json!(transaction_hash));
            record.insert("log_index".into(), json!(log_index));
            record
        });
        let first = records.next().expect("a pool has two sides");
        self.pending = records.next();
        first
    }
}

/// `amount` as a decimal string with at most `decimals` places (and at most 9, which is all
/// an `f64` carries at these magnitudes), trailing zeros trimmed.
fn units(amount: f64, decimals: u8) -> String {
    let places = usize::from(decimals.min(9));
    let text = format!("{amount:.places$}");
    let text =
        if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.') } else { &text };
    if places == 0 && (text == "0" || text.is_empty()) {
        "1".to_owned()
    } else if text == "0" || text.is_empty() {
        // Never a zero amount: the smallest unit instead.
        format!("0.{}1", "0".repeat(places.saturating_sub(1)))
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_trim_and_never_give_zero() {
        assert_eq!(units(1.5, 6), "1.5");
        assert_eq!(units(2.0, 18), "2");
        assert_eq!(units(0.0, 6), "0.000001");
        assert_eq!(units(12.3456789, 2), "12.35");
    }
}
