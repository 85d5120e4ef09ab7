//! Reading trades out of stream records: `<chain>.dex_trade` records (`docs/streams.md`) and
//! Hyperliquid `trade` records (coin as the token, `px` × `sz` as the USD value).
//!
//! Records are deserialized into borrowed structs with hand-written visitors for amounts and
//! times, so a record costs one pass over its bytes and no JSON tree.

use std::borrow::Cow;
use std::fmt;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use sluice_core::prices::{Amount, AmountError, TokenRef, Trade, TradeOrder};

/// Why a stream record is not a usable trade. Always the record's fault: the same record
/// will never be usable, so it is skipped (and counted), never retried.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TradeError {
    #[error("not a trade record: {0}")]
    Malformed(String),
    #[error("{field}: {source}")]
    Amount { field: &'static str, source: AmountError },
    #[error("{0} must be greater than zero")]
    NotPositive(&'static str),
    #[error("{0} is not a valid time")]
    Time(&'static str),
}

/// An amount written as a decimal string or a JSON number.
struct AmountField(Result<Amount, AmountError>);

impl<'de> Deserialize<'de> for AmountField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = AmountField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a decimal string or a number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<AmountField, E> {
                Ok(AmountField(Amount::parse(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<AmountField, E> {
                Ok(AmountField(Amount::parse(&v.to_string())))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<AmountField, E> {
                Ok(AmountField(Amount::parse(&v.to_string())))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<AmountField, E> {
                Ok(AmountField(Amount::parse(&v.to_string())))
            }
        }
        d.deserialize_any(V)
    }
}

/// A time as RFC 3339 or zone-less text, or an integer in the given unit.
#[derive(Clone, Copy)]
enum TimeField<'a> {
    Text(&'a str),
    Integer(i64),
}

impl<'de: 'a, 'a> Deserialize<'de> for TimeField<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TimeField<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a time string or an integer")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<TimeField<'de>, E> {
                Ok(TimeField::Text(v))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<TimeField<'de>, E> {
                Err(E::custom("escaped time strings are not supported"))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<TimeField<'de>, E> {
                i64::try_from(v).map(TimeField::Integer).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<TimeField<'de>, E> {
                Ok(TimeField::Integer(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl TimeField<'_> {
    /// Unix microseconds; integers are `unit_micros` microseconds each.
    fn micros(self, unit_micros: i64) -> Option<i64> {
        match self {
            Self::Integer(n) => n.checked_mul(unit_micros),
            Self::Text(text) => {
                let at: DateTime<Utc> = match DateTime::parse_from_rfc3339(text) {
                    Ok(at) => at.with_timezone(&Utc),
                    Err(_) => ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"]
                        .iter()
                        .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())?
                        .and_utc(),
                };
                Some(at.timestamp_micros())
            }
        }
    }
}

/// A log index or block number, as an integer or a decimal string.
struct Index(u64);

impl<'de> Deserialize<'de> for Index {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Index;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Index, E> {
                Ok(Index(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Index, E> {
                u64::try_from(v).map(Index).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Index, E> {
                v.parse().map(Index).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct DexTradeRecord<'a> {
    #[serde(borrow)]
    token_address: Cow<'a, str>,
    token_decimals: u32,
    token_amount: AmountField,
    usd_amount: AmountField,
    #[serde(borrow, default)]
    pool_address: Option<Cow<'a, str>>,
    #[serde(default)]
    token_reserve: Option<AmountField>,
    #[serde(default)]
    block_number: Option<Index>,
    #[serde(borrow)]
    block_timestamp: TimeField<'a>,
    #[serde(borrow)]
    transaction_hash: Cow<'a, str>,
    log_index: Index,
}

fn amount(field: &'static str, value: AmountField) -> Result<Amount, TradeError> {
    value.0.map_err(|source| TradeError::Amount { field, source })
}

fn positive(field: &'static str, value: AmountField) -> Result<Amount, TradeError> {
    let amount = amount(field, value)?;
    if amount.is_zero() { Err(TradeError::NotPositive(field)) } else { Ok(amount) }
}

/// The trade in a `<chain>.dex_trade` record. The chain is the stream's, whatever the
/// record's `chain` field says.
///
/// # Errors
/// [`TradeError`] when a required field is missing or malformed, or an amount is zero.
pub fn parse_dex_trade(chain: &str, bytes: &[u8]) -> Result<Trade, TradeError> {
    let record: DexTradeRecord<'_> =
        serde_json::from_slice(bytes).map_err(|e| TradeError::Malformed(e.to_string()))?;
    let at_micros =
        record.block_timestamp.micros(1_000_000).ok_or(TradeError::Time("block_timestamp"))?;
    let pool = match (record.pool_address, record.token_reserve) {
        (Some(pool), Some(reserve)) if !pool.is_empty() => {
            Some((pool.into_owned(), amount("token_reserve", reserve)?))
        }
        _ => None,
    };
    Ok(Trade {
        token: TokenRef::new(chain, &record.token_address),
        decimals: record.token_decimals,
        token_amount: positive("token_amount", record.token_amount)?,
        usd_amount: positive("usd_amount", record.usd_amount)?,
        pool,
        order: TradeOrder {
            at_micros,
            block_number: record.block_number.map_or(0, |n| n.0),
            log_index: record.log_index.0,
            transaction_hash: sluice_core::prices::normalize_address(&record.transaction_hash),
        },
    })
}

#[derive(Deserialize)]
struct HyperliquidTrade<'a> {
    #[serde(borrow)]
    coin: Cow<'a, str>,
    #[serde(borrow)]
    px: Cow<'a, str>,
    #[serde(borrow)]
    sz: Cow<'a, str>,
    #[serde(borrow, default)]
    hash: Option<Cow<'a, str>>,
    #[serde(borrow)]
    time: TimeField<'a>,
    tid: Index,
}

#[derive(Deserialize)]
struct HyperliquidEnvelope<'a> {
    #[serde(borrow)]
    payload: HyperliquidTrade<'a>,
}

/// Chain name the price service files Hyperliquid trades under.
pub const HYPERLIQUID: &str = "hyperliquid";

/// The trade in a Hyperliquid `trade` record (wrapped as `{"payload": {...}}` or bare): the
/// coin is the token, `sz` the amount, `px × sz` the USD value, `tid` the log index. The
/// decimals are the number of decimal places of `sz` (Hyperliquid has no token decimals).
///
/// # Errors
/// [`TradeError`] when a required field is missing or malformed, or `px` or `sz` is zero.
pub fn parse_hyperliquid_trade(bytes: &[u8]) -> Result<Trade, TradeError> {
    let record = match serde_json::from_slice::<HyperliquidEnvelope<'_>>(bytes) {
        Ok(envelope) => envelope.payload,
        Err(_) => serde_json::from_slice::<HyperliquidTrade<'_>>(bytes)
            .map_err(|e| TradeError::Malformed(e.to_string()))?,
    };
    let px = positive("px", AmountField(Amount::parse(&record.px)))?;
    let sz = positive("sz", AmountField(Amount::parse(&record.sz)))?;
    let usd = px.checked_mul(sz).ok_or(TradeError::Amount {
        field: "px",
        source: AmountError::TooLarge(format!("{} × {}", record.px, record.sz)),
    })?;
    if usd.is_zero() {
        return Err(TradeError::NotPositive("px × sz"));
    }
    let decimals = record.sz.split_once('.').map_or(0, |(_, fraction)| fraction.len() as u32);
    Ok(Trade {
        token: TokenRef::new(HYPERLIQUID, &record.coin),
        decimals,
        token_amount: sz,
        usd_amount: usd,
        pool: None,
        order: TradeOrder {
            at_micros: record.time.micros(1_000).ok_or(TradeError::Time("time"))?,
            block_number: 0,
            log_index: record.tid.0,
            transaction_hash: record.hash.map_or_else(String::new, |h| h.to_ascii_lowercase()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dex_trades_read_every_field() {
        let line = br#"{"chain":"base","token_address":"0x833589FCD6eDb6E08f4c7C32D4f71b54bdA02913","token_decimals":6,"token_amount":"1500.25","usd_amount":"1500.1","pool_address":"0xpool","token_reserve":"1000000","block_number":12,"block_timestamp":"2026-11-21T12:00:05Z","transaction_hash":"0xAB","log_index":3}"#;
        let trade = parse_dex_trade("base", line).unwrap();
        assert_eq!(trade.token.address, "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913");
        assert_eq!(trade.decimals, 6);
        assert_eq!(trade.token_amount, Amount::parse("1500.25").unwrap());
        assert_eq!(trade.pool, Some(("0xpool".into(), Amount::parse("1000000").unwrap())));
        assert_eq!(trade.order.at_micros, 1_795_262_405_000_000);
        assert_eq!((trade.order.block_number, trade.order.log_index), (12, 3));
        assert_eq!(trade.order.transaction_hash, "0xab");
    }

    #[test]
    fn bad_dex_trades_say_why() {
        let zero = br#"{"token_address":"0x1","token_decimals":6,"token_amount":"0","usd_amount":"1","block_timestamp":1,"transaction_hash":"0x1","log_index":1}"#;
        assert_eq!(parse_dex_trade("base", zero), Err(TradeError::NotPositive("token_amount")));
        let negative = br#"{"token_address":"0x1","token_decimals":6,"token_amount":"1","usd_amount":"-1","block_timestamp":1,"transaction_hash":"0x1","log_index":1}"#;
        assert!(matches!(
            parse_dex_trade("base", negative),
            Err(TradeError::Amount { field: "usd_amount", .. })
        ));
        let no_time = br#"{"token_address":"0x1","token_decimals":6,"token_amount":"1","usd_amount":"1","block_timestamp":"soon","transaction_hash":"0x1","log_index":1}"#;
        assert_eq!(parse_dex_trade("base", no_time), Err(TradeError::Time("block_timestamp")));
        assert!(matches!(parse_dex_trade("base", b"{}"), Err(TradeError::Malformed(_))));
    }

    #[test]
    fn hyperliquid_trades_price_the_coin_at_px() {
        let wrapped = br#"{"payload":{"coin":"BTC","side":"B","px":"97000.5","sz":"0.0123","hash":"0xAB","time":1763726405123,"tid":77,"users":["0x1","0x2"]}}"#;
        let trade = parse_hyperliquid_trade(wrapped).unwrap();
        assert_eq!(trade.token, TokenRef::new("hyperliquid", "BTC"));
        assert_eq!(trade.usd_amount, Amount::parse("1193.10615").unwrap());
        assert_eq!(trade.price(), 97000.5);
        assert_eq!(trade.decimals, 4);
        assert_eq!(trade.order.at_micros, 1_763_726_405_123_000);
        assert_eq!(trade.order.log_index, 77);
        let bare = br#"{"coin":"@107","px":"38","sz":"2","time":1,"tid":1}"#;
        assert_eq!(parse_hyperliquid_trade(bare).unwrap().token.address, "@107");
    }
}
