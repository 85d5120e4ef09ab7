//! Token price storage: candles of every granularity, the trades already counted (so a
//! trade sent twice counts once), each token's decimals and each pool's latest reserve.
//!
//! [`PriceStore`] is one of the roles of [`crate::MetadataStore`]: the price service takes
//! the store the process opened ([`MetadataStore::into_prices`](crate::MetadataStore::into_prices)).
//! The SQL is written once for any [`Dialect`]: the reads in `role.rs`,
//! counting a batch in `ingest.rs`; the bulk statements of a batch are per database
//! ([`PriceSql`], implemented in `sqlite.rs` and `postgres.rs` here). Migration 4 makes the
//! tables.
//!
//! Writers are serialised (SQLite's write lock; a transaction-scoped advisory lock on
//! PostgreSQL), because merging a late trade into a stored candle reads the candle and writes
//! the merged one back.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::prices::{Amount, Candle, CandleKey, Granularity, TokenRef, Trade, TradeOrder};

use crate::dialect::{Conn, Dialect};
use crate::{Result, StoreError};

mod ingest;
pub(crate) mod postgres;
mod role;
pub(crate) mod sqlite;
pub(crate) mod trade_ids;

pub(crate) use trade_ids::TradeIdMemory;

/// The bulk statements of a counted batch, only fast written per database (a JSON array of
/// rows on SQLite, arrays and `UNNEST` on PostgreSQL); implemented in `sqlite.rs` and
/// `postgres.rs` here.
pub trait PriceSql: Dialect {
    /// The stored candle of each key, by position (`None`: not stored).
    fn stored_candles(
        conn: &mut Conn<Self>,
        keys: &[(CandleKey, Candle)],
    ) -> impl Future<Output = Result<Vec<Option<Candle>>>> + Send;

    /// Writes `candles` (merged already), replacing the stored ones of the same keys.
    fn write_candles(
        conn: &mut Conn<Self>,
        candles: &[(CandleKey, Candle)],
    ) -> impl Future<Output = Result<()>> + Send;

    /// Stores each of `points` in the candle row of its key.
    fn write_points(
        conn: &mut Conn<Self>,
        points: &[FilledPoint],
    ) -> impl Future<Output = Result<()>> + Send;

    /// Sets each token's decimals and each pool's reserve from `tokens` and `pools` (the
    /// latest trade of each), where they are newer than the stored ones.
    fn write_tokens_and_pools(
        conn: &mut Conn<Self>,
        tokens: &[&Trade],
        pools: &[&Trade],
    ) -> impl Future<Output = Result<()>> + Send;
}

/// What [`PriceStore::apply_trades`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// Positions in the batch of the trades counted for the first time.
    pub counted: Vec<usize>,
    /// Trades of the batch that were counted before (or repeated within the batch).
    pub duplicates: usize,
    /// Every stored candle the new trades touched, after the merge: what the store holds now.
    pub candles: Vec<(CandleKey, Candle)>,
    /// The store's write count after this call ([`PriceStore::write_seq`]); `None` when no
    /// candle changed.
    pub write_seq: Option<i64>,
}

/// One point of a price history.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PricePoint {
    /// Window start, Unix seconds.
    pub start: i64,
    /// Volume-weighted average price.
    pub price: f64,
    pub open: f64,
    pub high: f64,
    pub close: f64,
    pub low: f64,
}

/// A token's decimals and its last trade, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub token: TokenRef,
    pub decimals: u32,
    pub last_trade: TradeOrder,
}

/// A pool's latest balance of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolReserve {
    pub token: TokenRef,
    pub pool: String,
    pub reserve: Amount,
    pub last_trade: TradeOrder,
}

/// Durable candles and the bookkeeping that keeps them exact.
#[async_trait]
pub trait PriceStore: Send + Sync + 'static {
    /// Counts `trades` in one transaction: trades whose `(chain, transaction_hash, log_index)`
    /// was counted before are skipped; the others are merged into the stored candle of each
    /// granularity (only windows starting at or after `keep_from(granularity)`, Unix
    /// seconds), each token's decimals and pool reserves follow its latest trade, and the
    /// trade ids are remembered.
    ///
    /// # Errors
    /// A database failure; nothing is applied then.
    async fn apply_trades(
        &self,
        trades: &[Trade],
        keep_from: &(dyn Fn(Granularity) -> i64 + Sync),
    ) -> Result<Applied>;

    /// Up to `limit` points of `token` at `granularity` whose window starts in
    /// `[from, to)` (Unix seconds), oldest first.
    ///
    /// # Errors
    /// A database failure, or a stored row that cannot be read.
    async fn history(
        &self,
        token: &TokenRef,
        granularity: Granularity,
        from: i64,
        to: i64,
        limit: usize,
    ) -> Result<Vec<PricePoint>>;

    /// Points of several series at `granularity` in one query: for each `(token, from)` of
    /// `ranges`, the windows starting in `[from, to)`; ordered by the range's index in
    /// `ranges`, then window start; at most `limit` points in all. Each point comes with its
    /// range's index.
    ///
    /// # Errors
    /// A database failure, or a stored row that cannot be read.
    async fn history_many(
        &self,
        ranges: &[(TokenRef, i64)],
        granularity: Granularity,
        to: i64,
        limit: usize,
    ) -> Result<Vec<(usize, PricePoint)>>;

    /// Every token's points at `granularity` whose window starts at or after `from` (to load
    /// them into memory), in no promised order (PostgreSQL's plan decides it).
    ///
    /// # Errors
    /// A database failure, or a stored row that cannot be read.
    async fn points_since(
        &self,
        granularity: Granularity,
        from: i64,
    ) -> Result<Vec<(TokenRef, PricePoint)>>;

    /// How many [`PriceStore::apply_trades`] calls changed candles, ever. Memory that
    /// mirrors the stored candles is current while this is the count it last saw.
    ///
    /// # Errors
    /// A database failure.
    async fn write_seq(&self) -> Result<i64>;

    /// The latest `count` candles of `token` at `granularity` with a window starting at or
    /// after `from`, newest first.
    ///
    /// # Errors
    /// A database failure, or a stored row that cannot be read.
    async fn latest_candles(
        &self,
        token: &TokenRef,
        granularity: Granularity,
        from: i64,
        count: usize,
    ) -> Result<Vec<(i64, Candle)>>;

    /// Tokens whose last trade is at or after `since` (Unix microseconds).
    ///
    /// # Errors
    /// A database failure, or a stored row that cannot be read.
    async fn tokens_traded_since(&self, since: i64) -> Result<Vec<TokenInfo>>;

    /// The stored decimals of each of `tokens` that has any.
    ///
    /// # Errors
    /// A database failure.
    async fn decimals(&self, tokens: &[TokenRef]) -> Result<HashMap<TokenRef, u32>>;

    /// Every pool's latest reserve of each of `tokens`.
    ///
    /// # Errors
    /// A database failure, or a stored row that cannot be read.
    async fn pool_reserves(&self, tokens: &[TokenRef]) -> Result<Vec<PoolReserve>>;

    /// Removes candles past their granularity's retention (window start before
    /// `cutoff(granularity)`, for granularities with a retention) and the remembered ids of
    /// trades in whole hours of block time before `trades_before` (Unix seconds; the hour it
    /// falls in is kept). Returns the rows removed (candles and id blocks).
    ///
    /// # Errors
    /// A database failure.
    async fn enforce_price_retention(
        &self,
        cutoffs: &[(Granularity, i64)],
        trades_before: i64,
    ) -> Result<u64>;

    /// Merges the blocks of counted trade ids of each hour of block time this store appended
    /// to and that ended before `before` (Unix seconds) into one block per hour, so that an
    /// hour written by many small batches is read back as one row. Returns the rows removed.
    ///
    /// # Errors
    /// A database failure; the hours not yet merged are tried again on the next call.
    async fn compact_trade_ids(&self, before: i64) -> Result<u64>;
}

/// Opens the store a URL names ([`crate::open`]) and gives its price role: for tools and
/// tests that need only prices. A process that also serves metadata takes
/// [`MetadataStore::into_prices`](crate::MetadataStore::into_prices) of the store it opened
/// instead, so that one pool serves every role.
///
/// # Errors
/// An unsupported URL, a connection failure or a failed migration.
pub async fn open_prices(url: &str) -> Result<Arc<dyn PriceStore>> {
    Ok(crate::open(url).await?.into_prices())
}

/// Rows per multi-row statement: 500 rows of at most 13 values stay far below SQLite's and
/// PostgreSQL's limits on bound parameters.
pub(crate) const ROWS_PER_STATEMENT: usize = 50;

/// `($1, $2), ($3, $4), …` for `rows` rows of `width` values, numbered from `$1`.
pub(crate) fn placeholders(rows: usize, width: usize) -> String {
    placeholders_from(1, rows, width)
}

/// [`placeholders`] numbered from `$first`.
pub(crate) fn placeholders_from(first: usize, rows: usize, width: usize) -> String {
    let mut out = String::with_capacity(rows * width * 5);
    for row in 0..rows {
        if row > 0 {
            out.push_str(", ");
        }
        out.push('(');
        for column in 0..width {
            if column > 0 {
                out.push_str(", ");
            }
            out.push('$');
            out.push_str(&(first + row * width + column).to_string());
        }
        out.push(')');
    }
    out
}

pub(crate) fn corrupt(detail: String) -> StoreError {
    StoreError::Corrupt { what: "price candle", detail }
}

/// The candle in a row holding [`CANDLE_COLUMNS`].
pub(crate) fn candle_of<'r, R>(row: &'r R) -> Result<Candle>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    f64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    &'r str: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let count: i64 = row.try_get("trade_count")?;
    Ok(Candle {
        open: row.try_get("open")?,
        high: row.try_get("high")?,
        low: row.try_get("low")?,
        close: row.try_get("close")?,
        usd_volume: amount_of(row.try_get("usd_volume")?)?,
        token_volume: amount_of(row.try_get("token_volume")?)?,
        trade_count: u64::try_from(count).unwrap_or(0),
        first: order_of(row.try_get("first_trade")?)?,
        last: order_of(row.try_get("last_trade")?)?,
    })
}

pub(crate) fn amount_of(text: &str) -> Result<Amount> {
    text.parse::<i128>().map(Amount).map_err(|e| corrupt(format!("amount {text:?}: {e}")))
}

pub(crate) fn order_of(text: &str) -> Result<TradeOrder> {
    TradeOrder::from_key(text).ok_or_else(|| corrupt(format!("trade order {text:?}")))
}

/// Candle rows per transaction when filling packed points (migration 8).
pub(crate) const FILL_BATCH: usize = 20_000;

/// A packed point to store in the candle row of its key (a step of migration 10).
pub struct FilledPoint {
    pub chain: String,
    pub token: String,
    pub granularity: i64,
    pub start: i64,
    pub point: [u8; POINT_BYTES],
}

/// A history read of at least twice this many series (all fitting in the page) is split in
/// two reads on two connections at once.
pub(crate) const SERIES_PER_READER: usize = 8;

/// Bytes of a packed history point (migration 8's `point` column).
pub(crate) const POINT_BYTES: usize = 48;

/// The history point of a candle, packed: window start (`i64`), then price, open, high,
/// close and low (`f64` bits), each little-endian.
pub(crate) fn pack_point(start: i64, candle: &Candle) -> [u8; POINT_BYTES] {
    let mut out = [0; POINT_BYTES];
    out[..8].copy_from_slice(&start.to_le_bytes());
    for (slot, value) in out[8..].chunks_exact_mut(8).zip([
        candle.price(),
        candle.open,
        candle.high,
        candle.close,
        candle.low,
    ]) {
        slot.copy_from_slice(&value.to_bits().to_le_bytes());
    }
    out
}

/// Points packed by [`pack_point`] and concatenated; `None` when `bytes` is not a whole
/// number of points.
pub(crate) fn unpack_points(bytes: &[u8]) -> Option<impl Iterator<Item = PricePoint> + '_> {
    if bytes.len() % POINT_BYTES != 0 {
        return None;
    }
    Some(bytes.chunks_exact(POINT_BYTES).map(|point| {
        let word = |i: usize| {
            let mut raw = [0; 8];
            raw.copy_from_slice(&point[i * 8..i * 8 + 8]);
            u64::from_le_bytes(raw)
        };
        PricePoint {
            start: word(0) as i64,
            price: f64::from_bits(word(1)),
            open: f64::from_bits(word(2)),
            high: f64::from_bits(word(3)),
            close: f64::from_bits(word(4)),
            low: f64::from_bits(word(5)),
        }
    }))
}

pub(crate) const CANDLE_COLUMNS: &str = "window_start, open, high, low, close, usd_volume, \
    token_volume, trade_count, first_trade, last_trade";

#[cfg(test)]
mod tests {
    #[test]
    fn placeholders_number_rows_in_order() {
        assert_eq!(super::placeholders(2, 3), "($1, $2, $3), ($4, $5, $6)");
        assert_eq!(super::placeholders(1, 1), "($1)");
    }
}
