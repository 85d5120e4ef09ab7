//! [`PriceStore`] for a [`Store`] of any [`Dialect`](crate::Dialect): the reads and the
//! retention. Counting a batch is in `ingest.rs`.

use std::collections::HashMap;

use async_trait::async_trait;
use sluice_core::prices::{Candle, Granularity, TokenRef, Trade};
use sqlx::Row as _;

use crate::dialect::{Pool, Row, StoreBackend};
use crate::prices::trade_ids;
use crate::prices::{
    Applied, CANDLE_COLUMNS, PoolReserve, PricePoint, PriceStore, ROWS_PER_STATEMENT,
    SERIES_PER_READER, TokenInfo, amount_of, order_of, placeholders, placeholders_from,
};
use crate::{Result, Store};

impl<D: StoreBackend> Store<D> {
    /// The rows of one statement per [`ROWS_PER_STATEMENT`] tokens of `tokens`, in order:
    /// `select` writes the statement around a chunk's `VALUES` placeholders, one
    /// `(chain, address)` row per token, which it joins as `v.column1` and `v.column2`.
    async fn rows_per_token(
        &self,
        tokens: &[TokenRef],
        select: impl Fn(&str) -> String + Send + Sync,
    ) -> Result<Vec<Row<D>>> {
        let mut rows = Vec::new();
        for chunk in tokens.chunks(ROWS_PER_STATEMENT) {
            let sql = select(&placeholders(chunk.len(), 2));
            let mut query = sqlx::query(&sql);
            for token in chunk {
                query = query.bind(&token.chain).bind(&token.address);
            }
            rows.extend(query.fetch_all(&self.pool).await?);
        }
        Ok(rows)
    }

    pub(crate) fn candle_row(row: &Row<D>) -> Result<(i64, Candle)> {
        Ok((row.try_get("window_start")?, crate::prices::candle_of(row)?))
    }

    /// A history point from a row with the window start, OHLC and the two sums.
    fn point_row(row: &Row<D>) -> Result<PricePoint> {
        let usd = amount_of(row.try_get("usd_volume")?)?;
        let volume = amount_of(row.try_get("token_volume")?)?;
        Ok(PricePoint {
            start: row.try_get("window_start")?,
            price: usd.ratio(volume),
            open: row.try_get("open")?,
            high: row.try_get("high")?,
            close: row.try_get("close")?,
            low: row.try_get("low")?,
        })
    }

    /// Reads the packed points of `ranges` (series numbered from `first`), one row
    /// per series (`ord`, `points`, `unfilled`), ordered by series. `whole`: every
    /// point of every series fits in `limit`, so each series is read by itself;
    /// otherwise the first `limit` points across the series are grouped.
    async fn read_series(
        pool: &Pool<D>,
        whole: bool,
        ranges: &[(TokenRef, i64)],
        first: usize,
        step: i64,
        to: i64,
        limit: i64,
    ) -> Result<Vec<Row<D>>> {
        let sql = if whole {
            // One range scan of the key per series, concatenated as it goes (no
            // sort). `unfilled` probes the index of rows without a packed point
            // (empty once filled).
            format!(
                "SELECT v.column1 AS ord, \
                 (SELECT {} FROM price_candles p WHERE p.chain = v.column2 \
                 AND p.token = v.column3 AND p.granularity = $1 \
                 AND p.window_start >= v.column4 AND p.window_start < $2) AS points, \
                 EXISTS (SELECT 1 FROM {} WHERE p.chain = v.column2 \
                 AND p.token = v.column3 AND p.granularity = $1 \
                 AND p.window_start >= v.column4 AND p.window_start < $2 \
                 AND p.point IS NULL) AS unfilled \
                 FROM (VALUES {}) AS v WHERE $3 > 0 ORDER BY v.column1",
                D::CONCAT_POINTS,
                D::WITHOUT_POINT,
                placeholders_from(4, ranges.len(), 4),
            )
        } else {
            // The first `limit` points across series, in order; then grouped.
            format!(
                "SELECT ord, {} AS points, count(point) < count(*) AS unfilled \
                 FROM (SELECT v.column1 AS ord, p.window_start, p.point \
                 FROM (VALUES {}) AS v {} price_candles p \
                 ON p.chain = v.column2 AND p.token = v.column3 AND p.granularity = $1 \
                 AND p.window_start >= v.column4 AND p.window_start < $2 \
                 ORDER BY v.column1, p.window_start LIMIT $3) AS s \
                 GROUP BY ord ORDER BY ord",
                D::CONCAT_POINTS,
                placeholders_from(4, ranges.len(), 4),
                D::VALUES_JOIN
            )
        };
        let mut query = sqlx::query(&sql).bind(step).bind(to).bind(limit);
        for (index, (token, from)) in ranges.iter().enumerate() {
            query = query
                .bind((first + index) as i64)
                .bind(&token.chain)
                .bind(&token.address)
                .bind(*from);
        }
        Ok(query.fetch_all(pool).await?)
    }
}

#[async_trait]
impl<D: StoreBackend> PriceStore for Store<D> {
    async fn apply_trades(
        &self,
        trades: &[Trade],
        keep_from: &(dyn Fn(Granularity) -> i64 + Sync),
    ) -> Result<Applied> {
        self.apply(trades, keep_from).await
    }

    async fn history(
        &self,
        token: &TokenRef,
        granularity: Granularity,
        from: i64,
        to: i64,
        limit: usize,
    ) -> Result<Vec<PricePoint>> {
        let rows = sqlx::query(
            "SELECT window_start, open, high, low, close, usd_volume, token_volume \
             FROM price_candles WHERE chain = $1 AND token = $2 AND granularity = $3 \
             AND window_start >= $4 AND window_start < $5 \
             ORDER BY window_start LIMIT $6",
        )
        .bind(&token.chain)
        .bind(&token.address)
        .bind(granularity.seconds())
        .bind(from)
        .bind(to)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(Self::point_row).collect()
    }

    async fn history_many(
        &self,
        ranges: &[(TokenRef, i64)],
        granularity: Granularity,
        to: i64,
        limit: usize,
    ) -> Result<Vec<(usize, PricePoint)>> {
        if ranges.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        // Each series comes back as one row: its packed points concatenated, so
        // the driver's per-row cost is paid per series, not per window.
        let step = granularity.seconds();
        let most: i128 = ranges
            .iter()
            .map(|(_, from)| (i128::from(to) - i128::from(*from)).max(0) / i128::from(step) + 1)
            .sum();
        let whole = most <= limit as i128;
        let limit_arg = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = if whole && ranges.len() >= 2 * SERIES_PER_READER {
            // Two halves on two connections at once (SQLite's WAL readers and
            // PostgreSQL's backends run in parallel).
            let middle = ranges.len() / 2;
            let (mut first, second) = tokio::try_join!(
                Self::read_series(&self.pool, true, &ranges[..middle], 0, step, to, limit_arg),
                Self::read_series(&self.pool, true, &ranges[middle..], middle, step, to, limit_arg),
            )?;
            first.extend(second);
            first
        } else {
            Self::read_series(&self.pool, whole, ranges, 0, step, to, limit_arg).await?
        };
        let mut out = Vec::with_capacity(limit.min(1 << 20));
        for row in &rows {
            if out.len() >= limit {
                break;
            }
            let ord: i64 = row.try_get("ord")?;
            let index = usize::try_from(ord)
                .ok()
                .filter(|i| *i < ranges.len())
                .ok_or_else(|| crate::prices::corrupt(format!("series {ord}")))?;
            let unfilled: bool = row.try_get("unfilled")?;
            if unfilled {
                // Rows written before migration 8 and not filled yet: the same
                // points from their columns.
                let (token, from) = &ranges[index];
                let room = limit - out.len();
                let points = self.history(token, granularity, *from, to, room).await?;
                out.extend(points.into_iter().map(|point| (index, point)));
                continue;
            }
            let bytes: Option<Vec<u8>> = row.try_get("points")?;
            let bytes = bytes.unwrap_or_default();
            let points = crate::prices::unpack_points(&bytes).ok_or_else(|| {
                crate::prices::corrupt(format!("{} packed point bytes", bytes.len()))
            })?;
            let first = out.len();
            out.extend(points.map(|point| (index, point)));
            // Concatenated in the order read (the window order of the key scan,
            // but not promised): a sort of sorted points is one pass.
            out[first..].sort_unstable_by_key(|(_, point)| point.start);
            out.truncate(limit);
        }
        Ok(out)
    }

    async fn points_since(
        &self,
        granularity: Granularity,
        from: i64,
    ) -> Result<Vec<(TokenRef, PricePoint)>> {
        // Driven by the tokens that traded since `from` (a window starting then
        // holds only later trades), each read as one range of the primary key:
        // the window-start index would instead look every row up at random.
        let since = sluice_core::prices::TradeOrder {
            at_micros: from.saturating_mul(1_000_000),
            block_number: 0,
            log_index: 0,
            transaction_hash: String::new(),
        }
        .to_key();
        let sql = format!(
            "SELECT p.chain, p.token, p.window_start, p.open, p.high, p.low, p.close, \
             p.usd_volume, p.token_volume FROM price_tokens t {} price_candles p \
             ON p.chain = t.chain AND p.token = t.token AND p.granularity = $1 \
             AND p.window_start >= $2 WHERE t.last_trade >= $3",
            D::VALUES_JOIN
        );
        let rows = sqlx::query(&sql)
            .bind(granularity.seconds())
            .bind(from)
            .bind(since)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let token =
                    TokenRef { chain: row.try_get("chain")?, address: row.try_get("token")? };
                Ok((token, Self::point_row(row)?))
            })
            .collect()
    }

    async fn write_seq(&self) -> Result<i64> {
        Self::read_write_seq(&self.pool).await
    }

    async fn latest_candles(
        &self,
        token: &TokenRef,
        granularity: Granularity,
        from: i64,
        count: usize,
    ) -> Result<Vec<(i64, Candle)>> {
        let sql = format!(
            "SELECT {CANDLE_COLUMNS} FROM price_candles WHERE chain = $1 AND token = $2 \
             AND granularity = $3 AND window_start >= $4 \
             ORDER BY window_start DESC LIMIT $5"
        );
        let rows = sqlx::query(&sql)
            .bind(&token.chain)
            .bind(&token.address)
            .bind(granularity.seconds())
            .bind(from)
            .bind(i64::try_from(count).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(Self::candle_row).collect()
    }

    async fn tokens_traded_since(&self, since: i64) -> Result<Vec<TokenInfo>> {
        let since = sluice_core::prices::TradeOrder {
            at_micros: since,
            block_number: 0,
            log_index: 0,
            transaction_hash: String::new(),
        }
        .to_key();
        let rows = sqlx::query(
            "SELECT chain, token, decimals, last_trade FROM price_tokens \
             WHERE last_trade >= $1 ORDER BY chain, token",
        )
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let decimals: i64 = row.try_get("decimals")?;
                Ok(TokenInfo {
                    token: TokenRef {
                        chain: row.try_get("chain")?,
                        address: row.try_get("token")?,
                    },
                    decimals: u32::try_from(decimals).unwrap_or(0),
                    last_trade: order_of(row.try_get("last_trade")?)?,
                })
            })
            .collect()
    }

    async fn decimals(&self, tokens: &[TokenRef]) -> Result<HashMap<TokenRef, u32>> {
        let rows = self
            .rows_per_token(tokens, |values| {
                format!(
                    "SELECT p.chain, p.token, p.decimals FROM (VALUES {values}) AS v \
                     {} price_tokens p ON p.chain = v.column1 AND p.token = v.column2",
                    D::VALUES_JOIN
                )
            })
            .await?;
        let mut out = HashMap::new();
        for row in rows {
            let decimals: i64 = row.try_get("decimals")?;
            out.insert(
                TokenRef { chain: row.try_get("chain")?, address: row.try_get("token")? },
                u32::try_from(decimals).unwrap_or(0),
            );
        }
        Ok(out)
    }

    async fn pool_reserves(&self, tokens: &[TokenRef]) -> Result<Vec<PoolReserve>> {
        let rows = self
            .rows_per_token(tokens, |values| {
                format!(
                    "SELECT p.chain, p.token, p.pool, p.reserve, p.last_trade \
                     FROM (VALUES {values}) AS v {} price_pools p \
                     ON p.chain = v.column1 AND p.token = v.column2 \
                     ORDER BY p.chain, p.token, p.pool",
                    D::VALUES_JOIN
                )
            })
            .await?;
        let mut out = Vec::new();
        for row in rows {
            out.push(PoolReserve {
                token: TokenRef { chain: row.try_get("chain")?, address: row.try_get("token")? },
                pool: row.try_get("pool")?,
                reserve: amount_of(row.try_get("reserve")?)?,
                last_trade: order_of(row.try_get("last_trade")?)?,
            });
        }
        Ok(out)
    }

    async fn enforce_price_retention(
        &self,
        cutoffs: &[(Granularity, i64)],
        trades_before: i64,
    ) -> Result<u64> {
        let mut removed = 0;
        for (granularity, cutoff) in cutoffs {
            removed += sqlx::query(
                "DELETE FROM price_candles WHERE granularity = $1 AND window_start < $2",
            )
            .bind(granularity.seconds())
            .bind(cutoff)
            .execute(&self.pool)
            .await
            .map(|done| D::rows_affected(&done))?;
        }
        // Whole hours before the horizon; the hour it falls in stays.
        let bucket = trade_ids::bucket_of(trades_before.saturating_mul(1_000_000));
        let mut memory = self.trade_ids.lock().await;
        removed += sqlx::query("DELETE FROM price_trade_id_blocks WHERE bucket < $1")
            .bind(bucket)
            .execute(&self.pool)
            .await
            .map(|done| D::rows_affected(&done))?;
        memory.forget_before(bucket);
        Ok(removed)
    }

    async fn compact_trade_ids(&self, before: i64) -> Result<u64> {
        let limit = trade_ids::bucket_of(before.saturating_mul(1_000_000));
        let due = self.trade_ids.lock().await.take_written_before(limit);
        let mut removed = 0;
        for (done, bucket) in due.iter().enumerate() {
            match self.compact_bucket(*bucket).await {
                Ok(rows) => removed += rows,
                Err(error) => {
                    let mut memory = self.trade_ids.lock().await;
                    memory.note_written(due[done..].iter().copied());
                    return Err(error);
                }
            }
        }
        Ok(removed)
    }
}
