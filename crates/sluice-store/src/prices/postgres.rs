//! The bulk statements of a counted batch on PostgreSQL: each binds the batch's columns as
//! arrays and reads them with `UNNEST`, one short statement per step instead of a statement
//! per 50 rows. Prices travel as `float8[]` in the binary protocol, exactly.

use sluice_core::prices::{Candle, CandleKey, Trade};
use sqlx::PgConnection;
use sqlx::Row as _;

use crate::PgDialect;
use crate::Result;
use crate::prices::{CANDLE_COLUMNS, FilledPoint, PriceSql, candle_of, pack_point};

impl PriceSql for PgDialect {
    async fn stored_candles(
        conn: &mut PgConnection,
        keys: &[(CandleKey, Candle)],
    ) -> Result<Vec<Option<Candle>>> {
        let chains: Vec<&str> = keys.iter().map(|(k, _)| k.token.chain.as_str()).collect();
        let tokens: Vec<&str> = keys.iter().map(|(k, _)| k.token.address.as_str()).collect();
        let granularities: Vec<i64> = keys.iter().map(|(k, _)| k.granularity.seconds()).collect();
        let starts: Vec<i64> = keys.iter().map(|(k, _)| k.start).collect();
        let sql = format!(
            "SELECT v.ord, p.{} FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[]) \
             WITH ORDINALITY AS v(chain, token, granularity, window_start, ord) \
             JOIN price_candles p ON p.chain = v.chain AND p.token = v.token \
             AND p.granularity = v.granularity AND p.window_start = v.window_start",
            CANDLE_COLUMNS.replace(", ", ", p.")
        );
        let rows = sqlx::query(&sql)
            .bind(&chains)
            .bind(&tokens)
            .bind(&granularities)
            .bind(&starts)
            .fetch_all(&mut *conn)
            .await?;
        let mut out = vec![None; keys.len()];
        for row in rows {
            let ord: i64 = row.try_get("ord")?;
            let candle = candle_of(&row)?;
            if let Some(slot) = usize::try_from(ord - 1).ok().and_then(|i| out.get_mut(i)) {
                *slot = Some(candle);
            }
        }
        Ok(out)
    }

    async fn write_candles(conn: &mut PgConnection, candles: &[(CandleKey, Candle)]) -> Result<()> {
        let column =
            |f: fn(&(CandleKey, Candle)) -> f64| -> Vec<f64> { candles.iter().map(f).collect() };
        let chains: Vec<&str> = candles.iter().map(|(k, _)| k.token.chain.as_str()).collect();
        let tokens: Vec<&str> = candles.iter().map(|(k, _)| k.token.address.as_str()).collect();
        let granularities: Vec<i64> =
            candles.iter().map(|(k, _)| k.granularity.seconds()).collect();
        let starts: Vec<i64> = candles.iter().map(|(k, _)| k.start).collect();
        let usd: Vec<String> = candles.iter().map(|(_, c)| c.usd_volume.0.to_string()).collect();
        let volume: Vec<String> =
            candles.iter().map(|(_, c)| c.token_volume.0.to_string()).collect();
        let counts: Vec<i64> = candles.iter().map(|(_, c)| c.trade_count as i64).collect();
        let firsts: Vec<String> = candles.iter().map(|(_, c)| c.first.to_key()).collect();
        let lasts: Vec<String> = candles.iter().map(|(_, c)| c.last.to_key()).collect();
        let points: Vec<Vec<u8>> =
            candles.iter().map(|(k, c)| pack_point(k.start, c).to_vec()).collect();
        sqlx::query(&format!(
            "INSERT INTO price_candles (chain, token, granularity, {CANDLE_COLUMNS}, point) \
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::float8[], \
             $6::float8[], $7::float8[], $8::float8[], $9::text[], $10::text[], $11::int8[], \
             $12::text[], $13::text[], $14::bytea[]) \
             ON CONFLICT (chain, token, granularity, window_start) DO UPDATE SET \
             open = excluded.open, high = excluded.high, low = excluded.low, \
             close = excluded.close, usd_volume = excluded.usd_volume, \
             token_volume = excluded.token_volume, trade_count = excluded.trade_count, \
             first_trade = excluded.first_trade, last_trade = excluded.last_trade, \
             point = excluded.point"
        ))
        .bind(&chains)
        .bind(&tokens)
        .bind(&granularities)
        .bind(&starts)
        .bind(column(|(_, c)| c.open))
        .bind(column(|(_, c)| c.high))
        .bind(column(|(_, c)| c.low))
        .bind(column(|(_, c)| c.close))
        .bind(&usd)
        .bind(&volume)
        .bind(&counts)
        .bind(&firsts)
        .bind(&lasts)
        .bind(&points)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn write_points(conn: &mut PgConnection, points: &[FilledPoint]) -> Result<()> {
        let chains: Vec<&str> = points.iter().map(|p| p.chain.as_str()).collect();
        let tokens: Vec<&str> = points.iter().map(|p| p.token.as_str()).collect();
        let granularities: Vec<i64> = points.iter().map(|p| p.granularity).collect();
        let starts: Vec<i64> = points.iter().map(|p| p.start).collect();
        let packed: Vec<Vec<u8>> = points.iter().map(|p| p.point.to_vec()).collect();
        sqlx::query(
            "UPDATE price_candles p SET point = v.point \
             FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::bytea[]) \
             AS v(chain, token, granularity, window_start, point) \
             WHERE p.chain = v.chain AND p.token = v.token AND p.granularity = v.granularity \
             AND p.window_start = v.window_start",
        )
        .bind(&chains)
        .bind(&tokens)
        .bind(&granularities)
        .bind(&starts)
        .bind(&packed)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn write_tokens_and_pools(
        conn: &mut PgConnection,
        tokens: &[&Trade],
        pools: &[&Trade],
    ) -> Result<()> {
        if !tokens.is_empty() {
            let chains: Vec<&str> = tokens.iter().map(|t| t.token.chain.as_str()).collect();
            let addresses: Vec<&str> = tokens.iter().map(|t| t.token.address.as_str()).collect();
            let decimals: Vec<i64> = tokens.iter().map(|t| i64::from(t.decimals)).collect();
            let orders: Vec<String> = tokens.iter().map(|t| t.order.to_key()).collect();
            sqlx::query(
                "INSERT INTO price_tokens (chain, token, decimals, last_trade) \
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::text[]) \
                 ON CONFLICT (chain, token) DO UPDATE SET decimals = excluded.decimals, \
                 last_trade = excluded.last_trade WHERE excluded.last_trade > price_tokens.last_trade",
            )
            .bind(&chains)
            .bind(&addresses)
            .bind(&decimals)
            .bind(&orders)
            .execute(&mut *conn)
            .await?;
        }
        if !pools.is_empty() {
            let chains: Vec<&str> = pools.iter().map(|t| t.token.chain.as_str()).collect();
            let addresses: Vec<&str> = pools.iter().map(|t| t.token.address.as_str()).collect();
            let mut names = Vec::with_capacity(pools.len());
            let mut reserves = Vec::with_capacity(pools.len());
            for trade in pools {
                let (pool, reserve) =
                    trade.pool.as_ref().expect("only trades with a pool are listed");
                names.push(pool.as_str());
                reserves.push(reserve.0.to_string());
            }
            let orders: Vec<String> = pools.iter().map(|t| t.order.to_key()).collect();
            sqlx::query(
                "INSERT INTO price_pools (chain, token, pool, reserve, last_trade) \
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) \
                 ON CONFLICT (chain, token, pool) DO UPDATE SET reserve = excluded.reserve, \
                 last_trade = excluded.last_trade WHERE excluded.last_trade > price_pools.last_trade",
            )
            .bind(&chains)
            .bind(&addresses)
            .bind(&names)
            .bind(&reserves)
            .bind(&orders)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }
}
