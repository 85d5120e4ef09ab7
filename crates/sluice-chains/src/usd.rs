//! USD values of DEX trades. A stablecoin (the chain's `stablecoins`) is worth one dollar. A
//! trade with a stablecoin leg is worth that leg's amount, and it prices the other token: its
//! USD value over the token's amount. A trade with no stablecoin leg is worth its priced
//! leg's amount times that price, and in turn prices its other token, one hop further.
//!
//! So on a real chain WETH is priced by its USDC pools (one hop) and a token traded only
//! against WETH by those trades (two hops); a price learned over more than [`MAX_HOPS`] hops
//! is not kept, as every hop adds a pool's spread. A price older than [`MAX_AGE_SECS`] of
//! block time is not used, and trades worth less than [`MIN_PRICING_USD`] price nothing (a
//! dust swap's ratio says little). When both legs are priced, the one fewer hops from a
//! stablecoin counts.
//!
//! The prices live in the ingester's memory, learned in block order: after a restart a
//! token's trades are valued again from its first trade against a stablecoin (or a priced
//! token) on.

use std::collections::{HashMap, HashSet};

/// Hops from a stablecoin a learned price may be.
pub const MAX_HOPS: u8 = 2;
/// Block-time age (seconds) after which a learned price is no longer used.
pub const MAX_AGE_SECS: i64 = 3600;
/// USD value a trade needs to set a price.
pub const MIN_PRICING_USD: f64 = 1.0;
/// Learned prices kept before the stale ones are dropped.
const PRUNE_AT: usize = 200_000;

#[derive(Debug, Clone, Copy)]
struct Learned {
    usd: f64,
    hops: u8,
    at: i64,
}

/// The prices one chain's trades taught so far.
#[derive(Debug, Default)]
pub struct UsdPrices {
    stablecoins: HashSet<String>,
    learned: HashMap<String, Learned>,
}

/// One leg of a trade: the token and the amount it moved, in token units.
#[derive(Debug, Clone, Copy)]
pub struct Leg<'a> {
    pub token: &'a str,
    pub amount: &'a str,
}

impl UsdPrices {
    pub fn new(stablecoins: &[String]) -> Self {
        Self { stablecoins: stablecoins.iter().cloned().collect(), learned: HashMap::new() }
    }

    /// The USD value of a trade of `legs` at block time `at` (a decimal string > 0), or
    /// `None` when neither leg is priced; learns the other leg's price from it.
    pub fn trade(&mut self, legs: [Leg<'_>; 2], at: i64) -> Option<String> {
        if let Some(stable) = legs.iter().position(|leg| self.stablecoins.contains(leg.token)) {
            let value = positive(legs[stable].amount)?;
            self.learn(legs[1 - stable], value, 1, at);
            return Some(legs[stable].amount.to_owned());
        }
        let (priced, learned) = (0..2)
            .filter_map(|i| {
                let learned = self.learned.get(legs[i].token)?;
                (at.saturating_sub(learned.at) <= MAX_AGE_SECS).then_some((i, *learned))
            })
            .min_by_key(|(_, learned)| learned.hops)?;
        let value = positive(legs[priced].amount)? * learned.usd;
        if !(value.is_finite() && value > 0.0) {
            return None;
        }
        if learned.hops < MAX_HOPS {
            self.learn(legs[1 - priced], value, learned.hops + 1, at);
        }
        Some(decimal(value))
    }

    /// The latest USD price learned for `token` (tests and status).
    pub fn price(&self, token: &str) -> Option<f64> {
        self.learned.get(token).map(|l| l.usd)
    }

    fn learn(&mut self, leg: Leg<'_>, value: f64, hops: u8, at: i64) {
        if value < MIN_PRICING_USD || self.stablecoins.contains(leg.token) {
            return;
        }
        let Some(amount) = positive(leg.amount) else { return };
        let usd = value / amount;
        if !(usd.is_finite() && usd > 0.0) {
            return;
        }
        if let Some(old) = self.learned.get(leg.token) {
            // A price nearer a stablecoin stands until it is stale.
            if old.hops < hops && at.saturating_sub(old.at) <= MAX_AGE_SECS {
                return;
            }
        }
        if self.learned.len() >= PRUNE_AT {
            self.learned.retain(|_, l| at.saturating_sub(l.at) <= MAX_AGE_SECS);
        }
        self.learned.insert(leg.token.to_owned(), Learned { usd, hops, at });
    }
}

fn positive(amount: &str) -> Option<f64> {
    amount.parse::<f64>().ok().filter(|a| a.is_finite() && *a > 0.0)
}

/// A USD value as a plain decimal (no exponent), to 12 significant digits: the inputs are
/// ratios of two trades, so more digits would be noise.
fn decimal(value: f64) -> String {
    let digits = 12 - (value.log10().floor() as i32 + 1);
    let text = format!("{value:.prec$}", prec = usize::try_from(digits.max(0)).unwrap_or(0));
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USDC: &str = "0xusdc";
    const WETH: &str = "0xweth";
    const PEPE: &str = "0xpepe";
    const DOGE: &str = "0xdoge";

    fn leg<'a>(token: &'a str, amount: &'a str) -> Leg<'a> {
        Leg { token, amount }
    }

    fn prices() -> UsdPrices {
        UsdPrices::new(&[USDC.to_owned()])
    }

    #[test]
    fn a_stable_leg_values_the_trade_and_prices_the_other_token() {
        let mut p = prices();
        assert_eq!(
            p.trade([leg(WETH, "0.5"), leg(USDC, "1500.25")], 100).as_deref(),
            Some("1500.25")
        );
        assert_eq!(p.price(WETH), Some(3000.5));
        assert_eq!(p.price(USDC), None);
    }

    #[test]
    fn a_priced_leg_values_the_trade_two_hops_out_and_no_further() {
        let mut p = prices();
        p.trade([leg(USDC, "3000"), leg(WETH, "1")], 100);
        // PEPE/WETH: valued by WETH's price; PEPE learns 2 hops out.
        assert_eq!(p.trade([leg(PEPE, "1000000"), leg(WETH, "0.25")], 101).as_deref(), Some("750"));
        assert_eq!(p.price(PEPE), Some(0.00075));
        // DOGE/PEPE: valued by PEPE, but DOGE (3 hops) learns nothing.
        assert_eq!(p.trade([leg(DOGE, "10"), leg(PEPE, "2000")], 102).as_deref(), Some("1.5"));
        assert_eq!(p.price(DOGE), None);
        assert_eq!(p.trade([leg(DOGE, "10"), leg(WETH, "0.001")], 103).as_deref(), Some("3"));
    }

    #[test]
    fn unpriced_trades_are_none_and_the_nearer_price_counts() {
        let mut p = prices();
        assert_eq!(p.trade([leg(PEPE, "1"), leg(WETH, "1")], 1), None);
        p.trade([leg(USDC, "2000"), leg(WETH, "1")], 2);
        p.trade([leg(PEPE, "100"), leg(WETH, "1")], 3); // PEPE = 20 USD, 2 hops
        // A trade with both priced uses WETH (1 hop): 0.5 WETH = 1000 USD.
        assert_eq!(p.trade([leg(PEPE, "1"), leg(WETH, "0.5")], 4).as_deref(), Some("1000"));
        // A price nearer a stablecoin is not overwritten by a farther one: PEPE priced
        // directly (1 hop) values a PEPE/WETH trade, which would price WETH at 2 hops.
        p.trade([leg(USDC, "20"), leg(PEPE, "1")], 5);
        assert_eq!(p.trade([leg(PEPE, "1"), leg(WETH, "1")], 6).as_deref(), Some("20"));
        assert_eq!(p.price(WETH), Some(2000.0));
    }

    #[test]
    fn dust_prices_nothing_and_stale_prices_are_not_used() {
        let mut p = prices();
        p.trade([leg(USDC, "0.5"), leg(WETH, "1")], 10);
        assert_eq!(p.price(WETH), None);
        p.trade([leg(USDC, "2000"), leg(WETH, "1")], 10);
        assert_eq!(p.trade([leg(PEPE, "1"), leg(WETH, "1")], 10 + MAX_AGE_SECS + 1), None);
        // A stale nearer price gives way to a fresh farther one.
        p.trade([leg(USDC, "2500"), leg(PEPE, "1")], 10 + MAX_AGE_SECS + 2);
        p.trade([leg(PEPE, "2"), leg(WETH, "1")], 10 + MAX_AGE_SECS + 3);
        assert_eq!(p.price(WETH), Some(5000.0));
    }

    #[test]
    fn zero_amounts_have_no_value() {
        let mut p = prices();
        assert_eq!(p.trade([leg(USDC, "0"), leg(WETH, "1")], 1), None);
    }

    #[test]
    fn values_print_as_plain_decimals() {
        assert_eq!(decimal(750.0), "750");
        assert_eq!(decimal(0.1 + 0.2), "0.3");
        assert_eq!(decimal(1e-9), "0.000000001");
        assert_eq!(decimal(123_456_789_012_345.0), "123456789012345");
        assert_eq!(decimal(2.0 / 3.0), "0.666666666667");
    }
}
