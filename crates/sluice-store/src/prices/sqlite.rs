//! The bulk statements of a counted batch on SQLite: each takes the whole batch as one JSON
//! array of rows (`json_each($1)`), so a batch costs a few short statements instead of a
//! statement per 50 rows with a bind parameter per value, which SQLite parses and plans
//! again for each.
//!
//! Prices (`f64`) never travel as decimal text, which SQLite does not read back exactly in
//! every case: each is sent as an integer mantissa and a power of two and rebuilt with exact
//! multiplications ([`exact_real`]).

use std::fmt::Write as _;

use sluice_core::prices::{Candle, CandleKey, Trade};
use sqlx::Row as _;
use sqlx::SqliteConnection;

use crate::Result;
use crate::SqliteDialect;
use crate::prices::{CANDLE_COLUMNS, FilledPoint, PriceSql, candle_of, pack_point};
use crate::sqlite::push_json_str as push_str;

/// A JSON array holding one array per item; `row` appends the item's elements, separated by
/// commas, without the brackets.
fn json_rows<T>(
    items: impl Iterator<Item = T>,
    bytes_per_row: usize,
    mut row: impl FnMut(&mut String, T),
) -> String {
    let mut out = String::with_capacity(items.size_hint().0 * bytes_per_row + 2);
    out.push('[');
    for (index, item) in items.enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push('[');
        row(&mut out, item);
        out.push(']');
    }
    out.push(']');
    out
}

/// Appends a token's chain and address as two JSON strings.
fn push_token(out: &mut String, chain: &str, address: &str) {
    push_str(out, chain);
    out.push(',');
    push_str(out, address);
}

/// Appends `bytes` as a JSON string of hex digits (for `unhex`).
fn push_hex(out: &mut String, bytes: &[u8]) {
    out.push('"');
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out.push('"');
}

/// `value` as `(m, e)` with `value = m × 2^e` exactly, `m` odd (or zero). Prices are finite.
fn split_f64(value: f64) -> (i64, i64) {
    if value == 0.0 || !value.is_finite() {
        return (0, 0);
    }
    let bits = value.to_bits();
    let exponent = ((bits >> 52) & 0x7ff) as i64;
    let fraction = (bits & ((1 << 52) - 1)) as i64;
    let (mut m, mut e) =
        if exponent == 0 { (fraction, -1074) } else { (fraction | (1 << 52), exponent - 1075) };
    let zeros = m.trailing_zeros();
    m >>= zeros;
    e += i64::from(zeros);
    if bits >> 63 == 1 {
        m = -m;
    }
    (m, e)
}

/// SQL rebuilding an `f64` from a mantissa (JSON path `m`) and a power of two (`e`) with
/// multiplications and divisions by exact powers of two of at most 2^62, which are exact for
/// every price (|e| up to 186, far beyond what 10^-18 units allow).
fn exact_real(m: &str, e: &str) -> String {
    format!(
        "(CASE WHEN value->>'{e}' >= 0 \
         THEN CAST(value->>'{m}' AS REAL) * (1 << min(value->>'{e}', 62)) \
              * (1 << max(value->>'{e}' - 62, 0)) \
         ELSE CAST(value->>'{m}' AS REAL) / (1 << min(-(value->>'{e}'), 62)) \
              / (1 << min(max(-(value->>'{e}') - 62, 0), 62)) \
              / (1 << max(-(value->>'{e}') - 124, 0)) END)"
    )
}

impl PriceSql for SqliteDialect {
    async fn stored_candles(
        conn: &mut SqliteConnection,
        keys: &[(CandleKey, Candle)],
    ) -> Result<Vec<Option<Candle>>> {
        let list = json_rows(keys.iter(), 80, |out, (key, _)| {
            push_token(out, &key.token.chain, &key.token.address);
            let _ = write!(out, ",{},{}", key.granularity.seconds(), key.start);
        });
        // CROSS JOIN keeps the key list as the outer loop: one primary-key probe per key.
        let sql = format!(
            "SELECT j.key AS ord, p.{} FROM json_each($1) AS j CROSS JOIN price_candles p \
                ON p.chain = j.value->>0 AND p.token = j.value->>1 \
                AND p.granularity = j.value->>2 AND p.window_start = j.value->>3",
            CANDLE_COLUMNS.replace(", ", ", p.")
        );
        let mut out = vec![None; keys.len()];
        for row in sqlx::query(&sql).bind(list).fetch_all(&mut *conn).await? {
            let ord: i64 = row.try_get("ord")?;
            let candle = candle_of(&row)?;
            if let Some(slot) = usize::try_from(ord).ok().and_then(|i| out.get_mut(i)) {
                *slot = Some(candle);
            }
        }
        Ok(out)
    }

    async fn write_candles(
        conn: &mut SqliteConnection,
        candles: &[(CandleKey, Candle)],
    ) -> Result<()> {
        let list = json_rows(candles.iter(), 330, |out, (key, candle)| {
            push_token(out, &key.token.chain, &key.token.address);
            let _ = write!(out, ",{},{}", key.granularity.seconds(), key.start);
            for price in [candle.open, candle.high, candle.low, candle.close] {
                let (m, e) = split_f64(price);
                let _ = write!(out, ",{m},{e}");
            }
            let _ = write!(
                out,
                ",\"{}\",\"{}\",{},",
                candle.usd_volume.0, candle.token_volume.0, candle.trade_count as i64
            );
            push_str(out, &candle.first.to_key());
            out.push(',');
            push_str(out, &candle.last.to_key());
            out.push(',');
            push_hex(out, &pack_point(key.start, candle));
        });
        let sql = format!(
            "WITH rows AS MATERIALIZED (SELECT jsonb(value) AS value FROM json_each($1)) \
                INSERT INTO price_candles (chain, token, granularity, {CANDLE_COLUMNS}, point) \
                SELECT value->>0, value->>1, value->>2, value->>3, {}, {}, {}, {}, \
                value->>12, value->>13, value->>14, value->>15, value->>16, unhex(value->>17) \
                FROM rows WHERE true \
    \
                    ON CONFLICT (chain, token, granularity, window_start) DO UPDATE SET \
                open = excluded.open, high = excluded.high, low = excluded.low, \
                close = excluded.close, usd_volume = excluded.usd_volume, \
                token_volume = excluded.token_volume, trade_count = excluded.trade_count, \
                first_trade = excluded.first_trade, last_trade = excluded.last_trade, \
                point = excluded.point",
            exact_real("$[4]", "$[5]"),
            exact_real("$[6]", "$[7]"),
            exact_real("$[8]", "$[9]"),
            exact_real("$[10]", "$[11]"),
        );
        sqlx::query(&sql).bind(list).execute(&mut *conn).await?;
        Ok(())
    }

    async fn write_points(conn: &mut SqliteConnection, points: &[FilledPoint]) -> Result<()> {
        let list = json_rows(points.iter(), 200, |out, point| {
            push_token(out, &point.chain, &point.token);
            let _ = write!(out, ",{},{},", point.granularity, point.start);
            push_hex(out, &point.point);
        });
        sqlx::query(
            "UPDATE price_candles SET point = unhex(j.value->>4) FROM json_each($1) AS j \
                WHERE price_candles.chain = j.value->>0 AND price_candles.token = j.value->>1 \
                AND price_candles.granularity = j.value->>2 \
                AND price_candles.window_start = j.value->>3",
        )
        .bind(list)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn write_tokens_and_pools(
        conn: &mut SqliteConnection,
        tokens: &[&Trade],
        pools: &[&Trade],
    ) -> Result<()> {
        if !tokens.is_empty() {
            let list = json_rows(tokens.iter(), 160, |out, trade| {
                push_token(out, &trade.token.chain, &trade.token.address);
                let _ = write!(out, ",{},", trade.decimals);
                push_str(out, &trade.order.to_key());
            });
            sqlx::query(
                   "INSERT INTO price_tokens (chain, token, decimals, last_trade) \
                    SELECT value->>0, value->>1, value->>2, value->>3 FROM json_each($1) WHERE true \
                    ON CONFLICT (chain, token) DO UPDATE SET decimals = excluded.decimals, \
                    last_trade = excluded.last_trade WHERE excluded.last_trade > price_tokens.last_trade",
               )
               .bind(list)
               .execute(&mut *conn)
               .await?;
        }
        if !pools.is_empty() {
            let list = json_rows(pools.iter(), 220, |out, trade| {
                let (pool, reserve) =
                    trade.pool.as_ref().expect("only trades with a pool are listed");
                push_token(out, &trade.token.chain, &trade.token.address);
                out.push(',');
                push_str(out, pool);
                let _ = write!(out, ",\"{}\",", reserve.0);
                push_str(out, &trade.order.to_key());
            });
            sqlx::query(
                "INSERT INTO price_pools (chain, token, pool, reserve, last_trade) \
                    SELECT value->>0, value->>1, value->>2, value->>3, value->>4 FROM json_each($1) \
                    WHERE true ON CONFLICT (chain, token, pool) DO UPDATE SET \
                    reserve = excluded.reserve, last_trade = excluded.last_trade \
                    WHERE excluded.last_trade > price_pools.last_trade",
            )
            .bind(list)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::split_f64;

    #[test]
    fn floats_split_into_an_odd_mantissa_and_a_power_of_two() {
        for value in [1.0, 0.1, 7.0 / 3.0, 1e-30, 3.5e30, 97_000.5, f64::MIN_POSITIVE, 5e-324] {
            let (m, e) = split_f64(value);
            assert!(m % 2 == 1 || m == 0, "{value}");
            let back = (m as f64) * 2f64.powi(e as i32);
            if value > 1e-300 {
                assert_eq!(back.to_bits(), value.to_bits(), "{value}");
            }
        }
        assert_eq!(split_f64(0.0), (0, 0));
        assert_eq!(split_f64(-2.0), (-1, 1));
    }
}
