//! Token prices: trades, the five candle granularities, and the candle arithmetic
//! (docs/contract.md §Token price records, `docs/prices.md`).
//!
//! Amounts are exact fixed-point numbers ([`Amount`], 18 decimal places in an `i128`), so
//! that sums do not depend on the order trades arrive in: a candle merged from finer candles
//! or from trades in any order is bit-for-bit the candle computed directly. Prices (`usd /
//! token`) are `f64`, computed once per trade (open, high, low, close) or once per window
//! (the volume-weighted price) from the exact sums.

use std::cmp::Ordering;
use std::fmt;

/// Retention of a granularity's candles, in seconds; `None` keeps them forever.
const DAY: i64 = 86_400;

/// A candle width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Granularity {
    S15,
    M1,
    M5,
    H1,
    D1,
}

impl Granularity {
    /// Every granularity, finest first.
    pub const ALL: [Granularity; 5] = [Self::S15, Self::M1, Self::M5, Self::H1, Self::D1];

    /// The names the API accepts, finest first.
    pub const NAMES: [&'static str; 5] = ["15s", "1m", "5m", "1h", "1d"];

    /// Width in seconds.
    pub const fn seconds(self) -> i64 {
        match self {
            Self::S15 => 15,
            Self::M1 => 60,
            Self::M5 => 300,
            Self::H1 => 3600,
            Self::D1 => DAY,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::S15 => "15s",
            Self::M1 => "1m",
            Self::M5 => "5m",
            Self::H1 => "1h",
            Self::D1 => "1d",
        }
    }

    /// The granularity named `name` (`15s`, `1m`, `5m`, `1h`, `1d`).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.name() == name)
    }

    /// The granularity of `seconds` width.
    pub fn from_seconds(seconds: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.seconds() == seconds)
    }

    /// How long candles are kept (docs/contract.md §Limits): 5 days for 15s, 30 days for 1m and 5m,
    /// forever (`None`) for 1h and 1d.
    pub const fn retention_seconds(self) -> Option<i64> {
        match self {
            Self::S15 => Some(5 * DAY),
            Self::M1 | Self::M5 => Some(30 * DAY),
            Self::H1 | Self::D1 => None,
        }
    }

    /// The retention in words, for messages ("5 days").
    pub fn retention_words(self) -> &'static str {
        match self {
            Self::S15 => "5 days",
            Self::M1 | Self::M5 => "30 days",
            Self::H1 | Self::D1 => "all history",
        }
    }

    /// Start (Unix seconds) of the window holding instant `micros` (Unix microseconds). Windows
    /// are aligned to the Unix epoch, so `1d` windows start at 00:00 UTC; an instant exactly
    /// on a boundary belongs to the window that starts there.
    pub const fn window_start(self, micros: i64) -> i64 {
        let seconds = micros.div_euclid(1_000_000);
        seconds - seconds.rem_euclid(self.seconds())
    }
}

impl fmt::Display for Granularity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Decimal places of an [`Amount`].
pub const AMOUNT_SCALE: u32 = 18;
const SCALE: i128 = 1_000_000_000_000_000_000;

/// An exact non-negative decimal with 18 places, as an integer count of 10^-18 units. Sums
/// saturate at `i128::MAX` (about 1.7e20 whole units) rather than wrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Amount(pub i128);

/// Why a decimal could not be read as an [`Amount`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("{0:?} is not a decimal number")]
    NotDecimal(String),
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("{0:?} is too large")]
    TooLarge(String),
}

impl Amount {
    pub const ZERO: Amount = Amount(0);

    /// Reads a decimal string (`"1234.5"`, `"1e-6"`, `"0.000001"`). Digits beyond the 18th
    /// decimal place are dropped (truncated toward zero).
    ///
    /// # Errors
    /// Not a decimal number, negative, or beyond the `i128` range.
    pub fn parse(text: &str) -> Result<Self, AmountError> {
        let not = || AmountError::NotDecimal(text.to_owned());
        let (mantissa, exponent) = match text.find(['e', 'E']) {
            Some(at) => (&text[..at], text[at + 1..].parse::<i32>().map_err(|_| not())?),
            None => (text, 0),
        };
        let mantissa = match mantissa.strip_prefix('-') {
            Some(rest) if rest.bytes().any(|b| b != b'0' && b != b'.') => {
                return Err(AmountError::Negative(text.to_owned()));
            }
            Some(rest) => rest,
            None => mantissa.strip_prefix('+').unwrap_or(mantissa),
        };
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        if (whole.is_empty() && fraction.is_empty())
            || !whole.bytes().all(|b| b.is_ascii_digit())
            || !fraction.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(not());
        }
        // value = digits × 10^(exponent − fraction.len()); in units of 10^-18.
        let shift = i64::from(exponent) - fraction.len() as i64 + i64::from(AMOUNT_SCALE);
        let too_large = || AmountError::TooLarge(text.to_owned());
        let mut units: i128 = 0;
        let digits = whole.bytes().chain(fraction.bytes()).map(|b| i128::from(b - b'0'));
        if shift >= 0 {
            for digit in digits {
                units = units
                    .checked_mul(10)
                    .and_then(|u| u.checked_add(digit))
                    .ok_or_else(too_large)?;
            }
            for _ in 0..shift {
                if units == 0 {
                    break;
                }
                units = units.checked_mul(10).ok_or_else(too_large)?;
            }
        } else {
            // Drop the last `-shift` digits.
            let all: Vec<i128> = digits.collect();
            let keep = all.len().saturating_sub(usize::try_from(-shift).unwrap_or(usize::MAX));
            for digit in &all[..keep] {
                units = units
                    .checked_mul(10)
                    .and_then(|u| u.checked_add(*digit))
                    .ok_or_else(too_large)?;
            }
        }
        Ok(Amount(units))
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    #[must_use]
    pub fn saturating_add(self, other: Amount) -> Amount {
        Amount(self.0.saturating_add(other.0))
    }

    /// The value as a float (for liquidity). Whole units and the fraction are converted
    /// apart, so values with few decimal places (`1500.5`) come out exact.
    pub fn to_f64(self) -> f64 {
        (self.0 / SCALE) as f64 + (self.0 % SCALE) as f64 / SCALE as f64
    }

    /// `self / other` as a float, computed from the exact integers: the same value whatever
    /// sums produced them.
    pub fn ratio(self, other: Amount) -> f64 {
        self.0 as f64 / other.0 as f64
    }

    /// `self × other`, exact (truncated to 18 places); `None` when it does not fit.
    pub fn checked_mul(self, other: Amount) -> Option<Amount> {
        // Split to keep the intermediate within i128: a×b/S = a×(b/S) + a×(b%S)/S.
        let (hi, lo) = (other.0 / SCALE, other.0 % SCALE);
        let whole = self.0.checked_mul(hi)?;
        let part = mul_div(self.0, lo, SCALE)?;
        whole.checked_add(part).map(Amount)
    }
}

/// `a × b / d` for non-negative `a`, `b < d`, without overflowing when the result fits.
fn mul_div(a: i128, b: i128, d: i128) -> Option<i128> {
    if let Some(product) = a.checked_mul(b) {
        return Some(product / d);
    }
    // a × b / d = a_hi × b + a_lo × b / d with a = a_hi × d + a_lo (d is the scale).
    let (a_hi, a_lo) = (a / SCALE, a % SCALE);
    let hi = a_hi.checked_mul(b)?;
    let lo = a_lo.checked_mul(b)? / d;
    hi.checked_add(lo)
}

impl fmt::Display for Amount {
    /// The exact decimal, without trailing zeros (`"1.5"`, `"3"`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, fraction) = (self.0 / SCALE, self.0 % SCALE);
        if fraction == 0 {
            return write!(f, "{whole}");
        }
        let digits = format!("{fraction:018}");
        write!(f, "{whole}.{}", digits.trim_end_matches('0'))
    }
}

/// A token on a chain. Addresses spelled `0x` + hex are lowercased (checksummed and
/// lowercase spellings are one token); others (Solana mints, Hyperliquid coins) are kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenRef {
    pub chain: String,
    pub address: String,
}

impl TokenRef {
    pub fn new(chain: &str, address: &str) -> Self {
        Self { chain: chain.to_ascii_lowercase(), address: normalize_address(address) }
    }
}

/// Lowercases `0x` hex addresses; leaves every other spelling as it is.
pub fn normalize_address(address: &str) -> String {
    let is_hex = address.len() > 2
        && (address.starts_with("0x") || address.starts_with("0X"))
        && address[2..].bytes().all(|b| b.is_ascii_hexdigit());
    if is_hex { address.to_ascii_lowercase() } else { address.to_owned() }
}

/// Where a trade sits in its chain's order: block time, block number, log index, and the
/// transaction hash to make the order total. Open and close of a window are its first and
/// last trade in this order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TradeOrder {
    /// Block time, Unix microseconds.
    pub at_micros: i64,
    pub block_number: u64,
    pub log_index: u64,
    pub transaction_hash: String,
}

impl TradeOrder {
    /// A text form whose byte order is the trade order (for storage):
    /// `<micros, 20 digits>:<block, 20>:<log, 20>:<hash>`.
    pub fn to_key(&self) -> String {
        // Offsetting by 2^63 makes every i64 a non-negative u64 that sorts the same way.
        let at = (self.at_micros as u64) ^ (1 << 63);
        format!(
            "{at:020}:{:020}:{:020}:{}",
            self.block_number, self.log_index, self.transaction_hash
        )
    }

    /// Reads [`TradeOrder::to_key`].
    pub fn from_key(key: &str) -> Option<Self> {
        let mut parts = key.splitn(4, ':');
        let at: u64 = parts.next()?.parse().ok()?;
        let block_number = parts.next()?.parse().ok()?;
        let log_index = parts.next()?.parse().ok()?;
        let transaction_hash = parts.next()?.to_owned();
        Some(Self { at_micros: (at ^ (1 << 63)) as i64, block_number, log_index, transaction_hash })
    }
}

/// One DEX trade of a token, as the price service reads it from a stream record.
#[derive(Debug, Clone, PartialEq)]
pub struct Trade {
    pub token: TokenRef,
    pub decimals: u32,
    /// Token units traded (already divided by 10^decimals).
    pub token_amount: Amount,
    /// The trade's value in USD.
    pub usd_amount: Amount,
    /// The pool traded in and its balance of the token after the trade, when known.
    pub pool: Option<(String, Amount)>,
    pub order: TradeOrder,
}

impl Trade {
    /// USD per token unit.
    pub fn price(&self) -> f64 {
        self.usd_amount.ratio(self.token_amount)
    }
}

/// The trades of one window of one token, summarised.
#[derive(Debug, Clone, PartialEq)]
pub struct Candle {
    pub open: f64,
    pub high: f64,
    pub low: f64,
    pub close: f64,
    /// Σ usd_amount.
    pub usd_volume: Amount,
    /// Σ token_amount.
    pub token_volume: Amount,
    pub trade_count: u64,
    /// The first and last trade in [`TradeOrder`].
    pub first: TradeOrder,
    pub last: TradeOrder,
}

impl Candle {
    /// The candle of one trade.
    pub fn of(trade: &Trade) -> Self {
        let price = trade.price();
        Self {
            open: price,
            high: price,
            low: price,
            close: price,
            usd_volume: trade.usd_amount,
            token_volume: trade.token_amount,
            trade_count: 1,
            first: trade.order.clone(),
            last: trade.order.clone(),
        }
    }

    /// Adds the trades `other` summarises (a disjoint set of trades of the same window or of
    /// a finer window inside it). Commutative and associative.
    pub fn merge(&mut self, other: &Candle) {
        if other.first < self.first {
            self.first = other.first.clone();
            self.open = other.open;
        }
        if other.last > self.last {
            self.last = other.last.clone();
            self.close = other.close;
        }
        self.high = max_f64(self.high, other.high);
        self.low = min_f64(self.low, other.low);
        self.usd_volume = self.usd_volume.saturating_add(other.usd_volume);
        self.token_volume = self.token_volume.saturating_add(other.token_volume);
        self.trade_count += other.trade_count;
    }

    /// The volume-weighted average price: Σ usd_amount / Σ token_amount.
    pub fn price(&self) -> f64 {
        self.usd_volume.ratio(self.token_volume)
    }
}

fn max_f64(a: f64, b: f64) -> f64 {
    match a.partial_cmp(&b) {
        Some(Ordering::Less) => b,
        _ => a,
    }
}

fn min_f64(a: f64, b: f64) -> f64 {
    match a.partial_cmp(&b) {
        Some(Ordering::Greater) => b,
        _ => a,
    }
}

/// A stored candle's address: token, granularity and window start (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CandleKey {
    pub token: TokenRef,
    pub granularity: Granularity,
    pub start: i64,
}

/// A candle being built, borrowing its first and last trade's order.
#[derive(Clone, Copy)]
struct Partial<'a> {
    open: f64,
    high: f64,
    low: f64,
    close: f64,
    usd_volume: Amount,
    token_volume: Amount,
    trade_count: u64,
    first: &'a TradeOrder,
    last: &'a TradeOrder,
}

impl<'a> Partial<'a> {
    fn merge(&mut self, other: &Partial<'a>) {
        if other.first < self.first {
            self.first = other.first;
            self.open = other.open;
        }
        if other.last > self.last {
            self.last = other.last;
            self.close = other.close;
        }
        self.high = max_f64(self.high, other.high);
        self.low = min_f64(self.low, other.low);
        self.usd_volume = self.usd_volume.saturating_add(other.usd_volume);
        self.token_volume = self.token_volume.saturating_add(other.token_volume);
        self.trade_count += other.trade_count;
    }

    fn into_candle(self) -> Candle {
        Candle {
            open: self.open,
            high: self.high,
            low: self.low,
            close: self.close,
            usd_volume: self.usd_volume,
            token_volume: self.token_volume,
            trade_count: self.trade_count,
            first: self.first.clone(),
            last: self.last.clone(),
        }
    }
}

/// The candles of every granularity that `trades` touch, one per key.
///
/// Trades are folded into 15-second candles first (one hash lookup per trade, nothing
/// cloned), which are then rolled up into the coarser granularities: every coarser window is
/// a union of whole 15-second windows, and merging is associative and commutative, so the
/// result is the candle of the trades themselves.
pub fn aggregate<'a>(
    trades: impl IntoIterator<Item = &'a Trade>,
) -> std::collections::HashMap<CandleKey, Candle> {
    use std::collections::HashMap;
    // foldhash: SipHash over the token's strings cost more than the folding itself.
    let mut fine: foldhash::HashMap<(&'a TokenRef, i64), Partial<'a>> =
        foldhash::HashMap::default();
    for trade in trades {
        let price = trade.price();
        let one = Partial {
            open: price,
            high: price,
            low: price,
            close: price,
            usd_volume: trade.usd_amount,
            token_volume: trade.token_amount,
            trade_count: 1,
            first: &trade.order,
            last: &trade.order,
        };
        let start = Granularity::S15.window_start(trade.order.at_micros);
        match fine.entry((&trade.token, start)) {
            std::collections::hash_map::Entry::Occupied(mut slot) => slot.get_mut().merge(&one),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(one);
            }
        }
    }
    let mut coarse: foldhash::HashMap<(&'a TokenRef, Granularity, i64), Partial<'a>> =
        foldhash::HashMap::default();
    for ((token, start), partial) in &fine {
        for granularity in &Granularity::ALL[1..] {
            let key = (*token, *granularity, granularity.window_start(start * 1_000_000));
            match coarse.entry(key) {
                std::collections::hash_map::Entry::Occupied(mut slot) => {
                    slot.get_mut().merge(partial);
                }
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(*partial);
                }
            }
        }
    }
    let mut out = HashMap::with_capacity(fine.len() + coarse.len());
    for ((token, start), partial) in fine {
        let key = CandleKey { token: token.clone(), granularity: Granularity::S15, start };
        out.insert(key, partial.into_candle());
    }
    for ((token, granularity, start), partial) in coarse {
        out.insert(CandleKey { token: token.clone(), granularity, start }, partial.into_candle());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_parse_exactly() {
        assert_eq!(Amount::parse("1").unwrap(), Amount(SCALE));
        assert_eq!(Amount::parse("1.5").unwrap(), Amount(SCALE + SCALE / 2));
        assert_eq!(Amount::parse("0.000000000000000001").unwrap(), Amount(1));
        assert_eq!(Amount::parse("0.0000000000000000019").unwrap(), Amount(1));
        assert_eq!(Amount::parse("1e-6").unwrap(), Amount(SCALE / 1_000_000));
        assert_eq!(Amount::parse("2.5E3").unwrap(), Amount(2500 * SCALE));
        assert_eq!(Amount::parse(".5").unwrap(), Amount(SCALE / 2));
        assert_eq!(Amount::parse("-0").unwrap(), Amount(0));
        assert!(matches!(Amount::parse("-1"), Err(AmountError::Negative(_))));
        for bad in ["", ".", "abc", "1.2.3", "1e", "0x10", " 1"] {
            assert!(matches!(Amount::parse(bad), Err(AmountError::NotDecimal(_))), "{bad}");
        }
        assert!(matches!(Amount::parse("1e30"), Err(AmountError::TooLarge(_))));
        assert_eq!(Amount::parse("123.450").unwrap().to_string(), "123.45");
        assert_eq!(Amount::parse("7").unwrap().to_string(), "7");
    }

    #[test]
    fn products_are_exact() {
        let px = Amount::parse("97000.5").unwrap();
        let sz = Amount::parse("0.0123").unwrap();
        assert_eq!(px.checked_mul(sz).unwrap(), Amount::parse("1193.10615").unwrap());
        let big = Amount::parse("100000000000").unwrap();
        assert_eq!(
            big.checked_mul(Amount::parse("3.25").unwrap()).unwrap().to_string(),
            "325000000000"
        );
    }

    #[test]
    fn windows_align_to_the_epoch_and_boundaries_open_a_window() {
        let at = 1_700_000_040_000_000; // 2023-11-14T22:14:00Z, a minute boundary
        assert_eq!(Granularity::M1.window_start(at), 1_700_000_040);
        assert_eq!(Granularity::M1.window_start(at - 1), 1_700_000_040 - 60);
        assert_eq!(Granularity::D1.window_start(at) % 86_400, 0);
        assert_eq!(Granularity::S15.window_start(-1), -15);
    }

    #[test]
    fn trade_order_keys_sort_like_the_order() {
        let order = |at, block, log| TradeOrder {
            at_micros: at,
            block_number: block,
            log_index: log,
            transaction_hash: "0xab".into(),
        };
        let mut orders = vec![order(5, 1, 2), order(-3, 9, 9), order(5, 1, 1), order(5, 0, 7)];
        let mut keys: Vec<String> = orders.iter().map(TradeOrder::to_key).collect();
        orders.sort();
        keys.sort();
        let decoded: Vec<TradeOrder> =
            keys.iter().map(|k| TradeOrder::from_key(k).unwrap()).collect();
        assert_eq!(decoded, orders);
    }
}
