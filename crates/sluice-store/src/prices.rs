//! Token price storage: candles of every granularity, the trades already counted (so a
//! trade sent twice counts once), each token's decimals and each pool's latest reserve.
//!
//! [`PriceStore`] is a role of its own, beside [`crate::MetadataStore`]: the price service
//! opens it from the same database URL ([`open_prices`]). Both backends run the SQL below
//! (expanded per pool type by `price_store_impl!`); migration 4 makes the tables.
//!
//! Writers are serialised (SQLite's write lock; a transaction-scoped advisory lock on
//! PostgreSQL), because merging a late trade into a stored candle reads the candle and writes
//! the merged one back.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::prices::{Amount, Candle, CandleKey, Granularity, TokenRef, Trade, TradeOrder};

use crate::{PgStore, Result, SqliteStore, StoreError};

pub(crate) mod postgres;
pub(crate) mod sqlite;
pub(crate) mod trade_ids;

pub(crate) use trade_ids::TradeIdMemory;

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

/// Opens the price store a URL names (`sqlite://…` or `postgres://…`), migrating as needed.
/// Candle rows written before migration 8 get their packed history point first
/// ([`SqliteStore::fill_history_points`]), and trade ids stored a row per trade before
/// migration 9 are moved into blocks ([`SqliteStore::move_trade_ids`]).
///
/// # Errors
/// An unsupported URL, a connection failure or a failed migration.
pub async fn open_prices(url: &str) -> Result<Arc<dyn PriceStore>> {
    if url.starts_with("sqlite:") {
        let store = SqliteStore::open(url).await?;
        store.fill_history_points().await?;
        store.move_trade_ids().await?;
        Ok(Arc::new(store))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = PgStore::open(url).await?;
        store.fill_history_points().await?;
        store.move_trade_ids().await?;
        Ok(Arc::new(store))
    } else {
        Err(StoreError::UnsupportedUrl(url.to_owned()))
    }
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

/// Implements [`PriceStore`] for a store type with a `pool: sqlx::Pool<$db>` field, an
/// inherent `begin_write`, a `const LOCK_PRICES: Option<&str>` statement that serialises
/// price writers (run first in every write transaction), a `const VALUES_JOIN: &str`, the
/// join that makes a list of keys (`VALUES …`) drive index lookups into a table, a
/// `const CONCAT_POINTS: &str` aggregate that concatenates packed points (`point`) into one
/// value, and a `const WITHOUT_POINT: &str` naming `price_candles p` read through its index of
/// rows without a packed point.
macro_rules! price_store_impl {
    ($store:ty, $db:ty, $d:ty) => {
        const _: () = {
            use std::collections::HashMap;

            use sluice_core::prices::{
                Candle, CandleKey, Granularity, TokenRef, Trade, aggregate,
            };
            use sqlx::Row as _;

            use crate::Result;
            use crate::prices::trade_ids::{self, IdSet, TradeId, TradeIdMemory};
            use crate::prices::{
                Applied, CANDLE_COLUMNS, PoolReserve, PriceStore, PricePoint, ROWS_PER_STATEMENT,
                SERIES_PER_READER, TokenInfo, amount_of, order_of, placeholders, placeholders_from,
            };

            type DbRow = <$db as sqlx::Database>::Row;

            fn candle_row(row: &DbRow) -> Result<(i64, Candle)> {
                Ok((row.try_get("window_start")?, crate::prices::candle_of(row)?))
            }

            /// A history point from a row with the window start, OHLC and the two sums.
            fn point_row(row: &DbRow) -> Result<PricePoint> {
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
                pool: &sqlx::Pool<$db>,
                whole: bool,
                ranges: &[(TokenRef, i64)],
                first: usize,
                step: i64,
                to: i64,
                limit: i64,
            ) -> Result<Vec<DbRow>> {
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
                        <$d as crate::Dialect>::CONCAT_POINTS,
                        <$d as crate::Dialect>::WITHOUT_POINT,
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
                        <$d as crate::Dialect>::CONCAT_POINTS,
                        placeholders_from(4, ranges.len(), 4),
                        <$d as crate::Dialect>::VALUES_JOIN
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

            type Conn = <$db as sqlx::Database>::Connection;

            /// Adds the stored ids of `rows` (`bucket`, `ids`) to memory: whole buckets
            /// (`whole`), or blocks written by another process since memory's count.
            fn read_id_blocks(memory: &mut TradeIdMemory, rows: &[DbRow], whole: bool) -> Result<()> {
                for row in rows {
                    let bucket: i64 = row.try_get("bucket")?;
                    let ids = block_ids(row)?;
                    if whole {
                        memory.load(bucket, ids);
                    } else {
                        memory.catch_up(bucket, ids);
                    }
                }
                Ok(())
            }

            /// The ids of a stored block (a row with `bucket` and `ids`).
            fn block_ids(row: &DbRow) -> Result<impl ExactSizeIterator<Item = TradeId> + '_> {
                let bytes: &[u8] = row.try_get("ids")?;
                trade_ids::unpack_ids(bytes).ok_or_else(|| crate::StoreError::Corrupt {
                    what: "trade id block",
                    detail: format!(
                        "{} bytes in bucket {}",
                        bytes.len(),
                        row.try_get::<i64, _>("bucket").unwrap_or_default()
                    ),
                })
            }

            /// Brings the counted ids in memory up to the store's write count `seq` (read in
            /// this write transaction) and loads the buckets of `wanted` memory lacks.
            async fn sync_trade_ids(
                conn: &mut Conn,
                memory: &mut TradeIdMemory,
                seq: i64,
                wanted: impl Iterator<Item = i64>,
            ) -> Result<()> {
                match memory.synced() {
                    Some(synced) if synced == seq => {}
                    Some(synced) if synced < seq => {
                        let rows = sqlx::query(
                            "SELECT bucket, ids FROM price_trade_id_blocks WHERE seq > $1",
                        )
                        .bind(synced)
                        .fetch_all(&mut *conn)
                        .await?;
                        read_id_blocks(memory, &rows, false)?;
                    }
                    _ => memory.clear(),
                }
                memory.mark_synced(seq);
                let mut missing: Vec<i64> = wanted.filter(|b| !memory.is_loaded(*b)).collect();
                missing.sort_unstable();
                missing.dedup();
                for chunk in missing.chunks(ROWS_PER_STATEMENT * 10) {
                    let list: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
                    let sql = format!(
                        "SELECT bucket, ids FROM price_trade_id_blocks WHERE bucket IN ({})",
                        list.join(", ")
                    );
                    let mut query = sqlx::query(&sql);
                    for bucket in chunk {
                        query = query.bind(*bucket);
                    }
                    let rows = query.fetch_all(&mut *conn).await?;
                    read_id_blocks(memory, &rows, true)?;
                    // Buckets without a stored block are loaded too: empty.
                    for bucket in chunk {
                        memory.load(*bucket, std::iter::empty());
                    }
                }
                Ok(())
            }

            /// The store's write count (`price_writes.seq`), on a pool or in a transaction.
            async fn read_write_seq<'e>(
                executor: impl sqlx::Executor<'e, Database = $db>,
            ) -> Result<i64> {
                Ok(sqlx::query("SELECT seq FROM price_writes WHERE id = 1")
                    .fetch_one(executor)
                    .await?
                    .try_get("seq")?)
            }

            /// Appends a block per bucket of `counted` (bucket, id), tagged with `seq`.
            async fn write_id_blocks(
                conn: &mut Conn,
                seq: i64,
                counted: &[(i64, TradeId)],
            ) -> Result<()> {
                let mut by_bucket: foldhash::HashMap<i64, Vec<TradeId>> = Default::default();
                for (bucket, id) in counted {
                    by_bucket.entry(*bucket).or_default().push(*id);
                }
                let blocks: Vec<(i64, Vec<u8>)> = by_bucket
                    .into_iter()
                    .map(|(bucket, ids)| (bucket, trade_ids::pack_ids(&ids)))
                    .collect();
                for chunk in blocks.chunks(ROWS_PER_STATEMENT) {
                    let sql = format!(
                        "INSERT INTO price_trade_id_blocks (bucket, seq, ids) VALUES {}",
                        placeholders(chunk.len(), 3)
                    );
                    let mut query = sqlx::query(&sql);
                    for (bucket, ids) in chunk {
                        query = query.bind(*bucket).bind(seq).bind(ids.as_slice());
                    }
                    query.execute(&mut *conn).await?;
                }
                Ok(())
            }

            impl $store {
                /// Replaces the id blocks of `bucket` by one holding each id once, tagged
                /// with the current write count (a process that reads the blocks written
                /// after an older count gets ids it has already: harmless). Returns the rows
                /// removed.
                async fn compact_bucket(&self, bucket: i64) -> Result<u64> {
                    let mut tx = <$d as crate::Dialect>::begin_write(&self.pool).await?;
                    if let Some(lock) = <$d as crate::Dialect>::LOCK_PRICES {
                        sqlx::query(lock).execute(&mut *tx).await?;
                    }
                    let rows = sqlx::query(
                        "SELECT bucket, ids FROM price_trade_id_blocks WHERE bucket = $1",
                    )
                    .bind(bucket)
                    .fetch_all(&mut *tx)
                    .await?;
                    if rows.len() < 2 {
                        return Ok(0);
                    }
                    // Blocks of one hour never share an id; sorting and dropping repeats
                    // anyway costs 16 bytes an id, where a hash set would take 40.
                    let mut ids: Vec<TradeId> = Vec::new();
                    for row in &rows {
                        ids.extend(block_ids(row)?);
                    }
                    ids.sort_unstable();
                    ids.dedup();
                    let seq: i64 = read_write_seq(&mut *tx).await?;
                    sqlx::query("DELETE FROM price_trade_id_blocks WHERE bucket = $1")
                        .bind(bucket)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(
                        "INSERT INTO price_trade_id_blocks (bucket, seq, ids) VALUES ($1, $2, $3)",
                    )
                    .bind(bucket)
                    .bind(seq)
                    .bind(trade_ids::pack_ids(&ids))
                    .execute(&mut *tx)
                    .await?;
                    tx.commit().await?;
                    Ok(rows.len() as u64 - 1)
                }

                /// Moves trade ids stored a row per trade (`price_trade_ids`, before
                /// migration 9) into blocks, a page at a time, then drops that table.
                /// Returns the ids moved. [`crate::open_prices`] runs it.
                ///
                /// # Errors
                /// A database failure.
                pub async fn move_trade_ids(&self) -> Result<u64> {
                    let exists: bool = sqlx::query_scalar(<$d as crate::Dialect>::TABLE_EXISTS)
                        .bind("price_trade_ids")
                        .fetch_one(&self.pool)
                        .await?;
                    if !exists {
                        return Ok(0);
                    }
                    let mut moved = 0;
                    loop {
                        let mut tx = <$d as crate::Dialect>::begin_write(&self.pool).await?;
                        if let Some(lock) = <$d as crate::Dialect>::LOCK_PRICES {
                            sqlx::query(lock).execute(&mut *tx).await?;
                        }
                        let rows = sqlx::query(
                            "SELECT block_time, chain, transaction_hash, log_index \
                             FROM price_trade_ids \
                             ORDER BY block_time, chain, transaction_hash, log_index LIMIT 100000",
                        )
                        .fetch_all(&mut *tx)
                        .await?;
                        let Some(last) = rows.last() else {
                            sqlx::query("DROP TABLE price_trade_ids").execute(&mut *tx).await?;
                            tx.commit().await?;
                            tracing::info!(moved, "trade ids moved into blocks");
                            return Ok(moved);
                        };
                        let mut counted = Vec::with_capacity(rows.len());
                        for row in &rows {
                            let time: i64 = row.try_get("block_time")?;
                            let chain: &str = row.try_get("chain")?;
                            let hash: &str = row.try_get("transaction_hash")?;
                            let log: i64 = row.try_get("log_index")?;
                            counted.push((
                                trade_ids::bucket_of(time.saturating_mul(1_000_000)),
                                trade_ids::trade_id(chain, hash, log as u64),
                            ));
                        }
                        write_id_blocks(&mut tx, 0, &counted).await?;
                        sqlx::query(
                            "DELETE FROM price_trade_ids WHERE (block_time, chain, \
                             transaction_hash, log_index) <= ($1, $2, $3, $4)",
                        )
                        .bind(last.try_get::<i64, _>("block_time")?)
                        .bind(last.try_get::<&str, _>("chain")?)
                        .bind(last.try_get::<&str, _>("transaction_hash")?)
                        .bind(last.try_get::<i64, _>("log_index")?)
                        .execute(&mut *tx)
                        .await?;
                        tx.commit().await?;
                        moved += rows.len() as u64;
                    }
                }

                /// Fills the packed history point of every candle row written before
                /// migration 8, a batch at a time, each batch in a write transaction (so a
                /// concurrent candle write cannot be overwritten by a stale point). Returns
                /// the rows filled. [`crate::open_prices`] runs it.
                ///
                /// # Errors
                /// A database failure, or a stored row that cannot be read.
                pub async fn fill_history_points(&self) -> Result<u64> {
                    let sql = format!(
                        "SELECT chain, token, granularity, {CANDLE_COLUMNS} FROM price_candles \
                         WHERE point IS NULL ORDER BY chain, token, granularity, window_start \
                         LIMIT {}",
                        crate::prices::FILL_BATCH
                    );
                    let mut filled = 0;
                    loop {
                        let mut tx = <$d as crate::Dialect>::begin_write(&self.pool).await?;
                        if let Some(lock) = <$d as crate::Dialect>::LOCK_PRICES {
                            sqlx::query(lock).execute(&mut *tx).await?;
                        }
                        let rows = sqlx::query(&sql).fetch_all(&mut *tx).await?;
                        let mut points = Vec::with_capacity(rows.len());
                        for row in &rows {
                            let (start, candle) = candle_row(row)?;
                            points.push(crate::prices::FilledPoint {
                                chain: row.try_get("chain")?,
                                token: row.try_get("token")?,
                                granularity: row.try_get("granularity")?,
                                start,
                                point: crate::prices::pack_point(start, &candle),
                            });
                        }
                        if !points.is_empty() {
                            <$d as crate::Dialect>::write_points(&mut tx, &points).await?;
                        }
                        tx.commit().await?;
                        if points.is_empty() {
                            return Ok(filled);
                        }
                        filled += points.len() as u64;
                    }
                }
            }

            #[async_trait::async_trait]
            impl PriceStore for $store {
                async fn apply_trades(
                    &self,
                    trades: &[Trade],
                    keep_from: &(dyn Fn(Granularity) -> i64 + Sync),
                ) -> Result<Applied> {
                    // Each trade's bucket and id; a trade repeated within the batch once.
                    let mut seen = IdSet::default();
                    let mut unique = Vec::with_capacity(trades.len());
                    for (position, trade) in trades.iter().enumerate() {
                        let id = trade_ids::trade_id(
                            &trade.token.chain,
                            &trade.order.transaction_hash,
                            trade.order.log_index,
                        );
                        if seen.insert(id) {
                            let bucket = trade_ids::bucket_of(trade.order.at_micros);
                            unique.push((bucket, id, position));
                        }
                    }
                    drop(seen);
                    let mut applied =
                        Applied { duplicates: trades.len() - unique.len(), ..Applied::default() };
                    if unique.is_empty() {
                        return Ok(applied);
                    }
                    let mut tx = <$d as crate::Dialect>::begin_write(&self.pool).await?;
                    if let Some(lock) = <$d as crate::Dialect>::LOCK_PRICES {
                        sqlx::query(lock).execute(&mut *tx).await?;
                    }
                    let seq: i64 = read_write_seq(&mut *tx).await?;
                    let mut memory = self.trade_ids.lock().await;
                    // Trades mostly arrive in time order: each bucket once per run of its trades.
                    let mut buckets: Vec<i64> = unique.iter().map(|(b, ..)| *b).collect();
                    buckets.dedup();
                    sync_trade_ids(&mut tx, &mut memory, seq, buckets.into_iter()).await?;
                    // The trades whose id was not counted before are the new ones.
                    let mut counted: Vec<(i64, TradeId)> = Vec::with_capacity(unique.len());
                    let mut positions: Vec<usize> = Vec::with_capacity(unique.len());
                    for (bucket, id, position) in unique {
                        if !memory.contains(bucket, id) {
                            counted.push((bucket, id));
                            positions.push(position);
                        }
                    }
                    applied.duplicates = trades.len() - positions.len();
                    if positions.is_empty() {
                        tx.commit().await?;
                        return Ok(applied);
                    }

                    let fresh = || positions.iter().map(|&position| &trades[position]);
                    let mut deltas: Vec<(CandleKey, Candle)> = aggregate(fresh())
                        .into_iter()
                        .filter(|(key, _)| key.start >= keep_from(key.granularity))
                        .collect();
                    deltas.sort_by(|a, b| a.0.cmp(&b.0));
                    // Merge with the stored candles of the same keys, then write them back.
                    let stored = <$d as crate::Dialect>::stored_candles(&mut tx, &deltas).await?;
                    for ((_, candle), old) in deltas.iter_mut().zip(&stored) {
                        if let Some(old) = old {
                            candle.merge(old);
                        }
                    }
                    if !deltas.is_empty() {
                        <$d as crate::Dialect>::write_candles(&mut tx, &deltas).await?;
                    }
                    let seq: i64 = sqlx::query(
                        "UPDATE price_writes SET seq = seq + 1 WHERE id = 1 RETURNING seq",
                    )
                    .fetch_one(&mut *tx)
                    .await?
                    .try_get("seq")?;
                    applied.write_seq = Some(seq);
                    applied.candles = deltas;
                    write_id_blocks(&mut tx, seq, &counted).await?;

                    // Decimals and reserves follow each token's (and pool's) latest trade.
                    let mut tokens: foldhash::HashMap<&TokenRef, &Trade> = Default::default();
                    let mut pools: foldhash::HashMap<(&TokenRef, &str), &Trade> =
                        Default::default();
                    for trade in fresh() {
                        let latest = tokens.entry(&trade.token).or_insert(trade);
                        if trade.order > latest.order {
                            *latest = trade;
                        }
                        if let Some((pool, _)) = &trade.pool {
                            let latest = pools.entry((&trade.token, pool.as_str())).or_insert(trade);
                            if trade.order > latest.order {
                                *latest = trade;
                            }
                        }
                    }
                    let mut tokens: Vec<&Trade> = tokens.into_values().collect();
                    tokens.sort_by(|a, b| a.token.cmp(&b.token));
                    let mut pools: Vec<&Trade> = pools.into_values().collect();
                    pools.sort_by(|a, b| (&a.token, &a.pool).cmp(&(&b.token, &b.pool)));
                    <$d as crate::Dialect>::write_tokens_and_pools(&mut tx, &tokens, &pools).await?;
                    tx.commit().await?;
                    // Memory learns the ids only once they are stored.
                    memory.note_written(counted.iter().map(|(bucket, _)| *bucket));
                    memory.insert(counted);
                    memory.mark_synced(seq);
                    memory.trim();
                    drop(memory);
                    applied.counted = positions;
                    Ok(applied)
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
                    rows.iter().map(point_row).collect()
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
                        .map(|(_, from)| {
                            (i128::from(to) - i128::from(*from)).max(0) / i128::from(step) + 1
                        })
                        .sum();
                    let whole = most <= limit as i128;
                    let limit_arg = i64::try_from(limit).unwrap_or(i64::MAX);
                    let rows = if whole && ranges.len() >= 2 * SERIES_PER_READER {
                        // Two halves on two connections at once (SQLite's WAL readers and
                        // PostgreSQL's backends run in parallel).
                        let middle = ranges.len() / 2;
                        let (mut first, second) = tokio::try_join!(
                            read_series(&self.pool, true, &ranges[..middle], 0, step, to, limit_arg),
                            read_series(&self.pool, true, &ranges[middle..], middle, step, to, limit_arg),
                        )?;
                        first.extend(second);
                        first
                    } else {
                        read_series(&self.pool, whole, ranges, 0, step, to, limit_arg).await?
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
                        <$d as crate::Dialect>::VALUES_JOIN
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
                            Ok((token, point_row(row)?))
                        })
                        .collect()
                }

                async fn write_seq(&self) -> Result<i64> {
                    read_write_seq(&self.pool).await
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
                    rows.iter().map(candle_row).collect()
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
                    let mut out = HashMap::new();
                    for chunk in tokens.chunks(ROWS_PER_STATEMENT) {
                        let sql = format!(
                            "SELECT p.chain, p.token, p.decimals FROM (VALUES {}) AS v \
                             {} price_tokens p ON p.chain = v.column1 AND p.token = v.column2",
                            placeholders(chunk.len(), 2),
                            <$d as crate::Dialect>::VALUES_JOIN
                        );
                        let mut query = sqlx::query(&sql);
                        for token in chunk {
                            query = query.bind(&token.chain).bind(&token.address);
                        }
                        for row in query.fetch_all(&self.pool).await? {
                            let decimals: i64 = row.try_get("decimals")?;
                            out.insert(
                                TokenRef { chain: row.try_get("chain")?, address: row.try_get("token")? },
                                u32::try_from(decimals).unwrap_or(0),
                            );
                        }
                    }
                    Ok(out)
                }

                async fn pool_reserves(&self, tokens: &[TokenRef]) -> Result<Vec<PoolReserve>> {
                    let mut out = Vec::new();
                    for chunk in tokens.chunks(ROWS_PER_STATEMENT) {
                        let sql = format!(
                            "SELECT p.chain, p.token, p.pool, p.reserve, p.last_trade \
                             FROM (VALUES {}) AS v {} price_pools p \
                             ON p.chain = v.column1 AND p.token = v.column2 \
                             ORDER BY p.chain, p.token, p.pool",
                            placeholders(chunk.len(), 2),
                            <$d as crate::Dialect>::VALUES_JOIN
                        );
                        let mut query = sqlx::query(&sql);
                        for token in chunk {
                            query = query.bind(&token.chain).bind(&token.address);
                        }
                        for row in query.fetch_all(&self.pool).await? {
                            out.push(PoolReserve {
                                token: TokenRef {
                                    chain: row.try_get("chain")?,
                                    address: row.try_get("token")?,
                                },
                                pool: row.try_get("pool")?,
                                reserve: amount_of(row.try_get("reserve")?)?,
                                last_trade: order_of(row.try_get("last_trade")?)?,
                            });
                        }
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
                        .await?
                        .rows_affected();
                    }
                    // Whole hours before the horizon; the hour it falls in stays.
                    let bucket = trade_ids::bucket_of(trades_before.saturating_mul(1_000_000));
                    let mut memory = self.trade_ids.lock().await;
                    removed += sqlx::query("DELETE FROM price_trade_id_blocks WHERE bucket < $1")
                        .bind(bucket)
                        .execute(&self.pool)
                        .await?
                        .rows_affected();
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
        };
    };
}

pub(crate) use price_store_impl;

#[cfg(test)]
mod tests {
    #[test]
    fn placeholders_number_rows_in_order() {
        assert_eq!(super::placeholders(2, 3), "($1, $2, $3), ($4, $5, $6)");
        assert_eq!(super::placeholders(1, 1), "($1)");
    }
}
