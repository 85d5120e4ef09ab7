//! Counting a batch of trades ([`PriceStore::apply_trades`](crate::PriceStore::apply_trades)),
//! the counted trade ids it keeps, and the data steps of the migration list that fill rows
//! written by older versions.

use sluice_core::prices::{Candle, CandleKey, Granularity, TokenRef, Trade, aggregate};
use sqlx::Row as _;

use crate::dialect::{Conn, Row, StoreBackend};
use crate::prices::trade_ids::{self, IdSet, TradeId, TradeIdMemory};
use crate::prices::{Applied, CANDLE_COLUMNS, ROWS_PER_STATEMENT, placeholders};
use crate::{Result, Store};

impl<D: StoreBackend> Store<D> {
    /// [`PriceStore::apply_trades`].
    pub(crate) async fn apply(
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
        let mut applied = Applied { duplicates: trades.len() - unique.len(), ..Applied::default() };
        if unique.is_empty() {
            return Ok(applied);
        }
        let mut tx = D::begin_write(&self.pool).await?;
        if let Some(lock) = D::LOCK_PRICES {
            sqlx::query(lock).execute(&mut *tx).await?;
        }
        let seq: i64 = Self::read_write_seq(&mut *tx).await?;
        let mut memory = self.trade_ids.lock().await;
        // Trades mostly arrive in time order: each bucket once per run of its trades.
        let mut buckets: Vec<i64> = unique.iter().map(|(b, ..)| *b).collect();
        buckets.dedup();
        Self::sync_trade_ids(&mut tx, &mut memory, seq, buckets.into_iter()).await?;
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
        let stored = D::stored_candles(&mut tx, &deltas).await?;
        for ((_, candle), old) in deltas.iter_mut().zip(&stored) {
            if let Some(old) = old {
                candle.merge(old);
            }
        }
        if !deltas.is_empty() {
            D::write_candles(&mut tx, &deltas).await?;
        }
        let seq: i64 =
            sqlx::query("UPDATE price_writes SET seq = seq + 1 WHERE id = 1 RETURNING seq")
                .fetch_one(&mut *tx)
                .await?
                .try_get("seq")?;
        applied.write_seq = Some(seq);
        applied.candles = deltas;
        Self::write_id_blocks(&mut tx, seq, &counted).await?;

        // Decimals and reserves follow each token's (and pool's) latest trade.
        let mut tokens: foldhash::HashMap<&TokenRef, &Trade> = Default::default();
        let mut pools: foldhash::HashMap<(&TokenRef, &str), &Trade> = Default::default();
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
        D::write_tokens_and_pools(&mut tx, &tokens, &pools).await?;
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

    /// Adds the stored ids of `rows` (`bucket`, `ids`) to memory: whole buckets
    /// (`whole`), or blocks written by another process since memory's count.
    fn read_id_blocks(memory: &mut TradeIdMemory, rows: &[Row<D>], whole: bool) -> Result<()> {
        for row in rows {
            let bucket: i64 = row.try_get("bucket")?;
            let ids = Self::block_ids(row)?;
            if whole {
                memory.load(bucket, ids);
            } else {
                memory.catch_up(bucket, ids);
            }
        }
        Ok(())
    }

    /// The ids of a stored block (a row with `bucket` and `ids`).
    fn block_ids(row: &Row<D>) -> Result<impl ExactSizeIterator<Item = TradeId> + '_> {
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
        conn: &mut Conn<D>,
        memory: &mut TradeIdMemory,
        seq: i64,
        wanted: impl Iterator<Item = i64>,
    ) -> Result<()> {
        match memory.synced() {
            Some(synced) if synced == seq => {}
            Some(synced) if synced < seq => {
                let rows =
                    sqlx::query("SELECT bucket, ids FROM price_trade_id_blocks WHERE seq > $1")
                        .bind(synced)
                        .fetch_all(&mut *conn)
                        .await?;
                Self::read_id_blocks(memory, &rows, false)?;
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
            Self::read_id_blocks(memory, &rows, true)?;
            // Buckets without a stored block are loaded too: empty.
            for bucket in chunk {
                memory.load(*bucket, std::iter::empty());
            }
        }
        Ok(())
    }

    /// The store's write count (`price_writes.seq`), on a pool or in a transaction.
    pub(crate) async fn read_write_seq<'e>(
        executor: impl sqlx::Executor<'e, Database = D::Db>,
    ) -> Result<i64> {
        Ok(sqlx::query("SELECT seq FROM price_writes WHERE id = 1")
            .fetch_one(executor)
            .await?
            .try_get("seq")?)
    }

    /// Appends a block per bucket of `counted` (bucket, id), tagged with `seq`.
    async fn write_id_blocks(
        conn: &mut Conn<D>,
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

    /// Replaces the id blocks of `bucket` by one holding each id once, tagged
    /// with the current write count (a process that reads the blocks written
    /// after an older count gets ids it has already: harmless). Returns the rows
    /// removed.
    pub(crate) async fn compact_bucket(&self, bucket: i64) -> Result<u64> {
        let mut tx = D::begin_write(&self.pool).await?;
        if let Some(lock) = D::LOCK_PRICES {
            sqlx::query(lock).execute(&mut *tx).await?;
        }
        let rows = sqlx::query("SELECT bucket, ids FROM price_trade_id_blocks WHERE bucket = $1")
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
            ids.extend(Self::block_ids(row)?);
        }
        ids.sort_unstable();
        ids.dedup();
        let seq: i64 = Self::read_write_seq(&mut *tx).await?;
        sqlx::query("DELETE FROM price_trade_id_blocks WHERE bucket = $1")
            .bind(bucket)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO price_trade_id_blocks (bucket, seq, ids) VALUES ($1, $2, $3)")
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
    /// Returns the ids moved. Migration 11 runs it when the store opens.
    ///
    /// # Errors
    /// A database failure.
    pub async fn move_trade_ids(&self) -> Result<u64> {
        let mut moved = 0;
        loop {
            let mut tx = D::begin_write(&self.pool).await?;
            if let Some(lock) = D::LOCK_PRICES {
                sqlx::query(lock).execute(&mut *tx).await?;
            }
            // Checked under the price lock: another process may have finished and dropped
            // the table since this one's last batch.
            let exists: bool = sqlx::query_scalar(D::TABLE_EXISTS)
                .bind("price_trade_ids")
                .fetch_one(&mut *tx)
                .await?;
            if !exists {
                tx.commit().await?;
                return Ok(moved);
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
            Self::write_id_blocks(&mut tx, 0, &counted).await?;
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
    /// the rows filled. Migration 10 runs it when the store opens.
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
            let mut tx = D::begin_write(&self.pool).await?;
            if let Some(lock) = D::LOCK_PRICES {
                sqlx::query(lock).execute(&mut *tx).await?;
            }
            let rows = sqlx::query(&sql).fetch_all(&mut *tx).await?;
            let mut points = Vec::with_capacity(rows.len());
            for row in &rows {
                let (start, candle) = Self::candle_row(row)?;
                points.push(crate::prices::FilledPoint {
                    chain: row.try_get("chain")?,
                    token: row.try_get("token")?,
                    granularity: row.try_get("granularity")?,
                    start,
                    point: crate::prices::pack_point(start, &candle),
                });
            }
            if !points.is_empty() {
                D::write_points(&mut tx, &points).await?;
            }
            tx.commit().await?;
            if points.is_empty() {
                return Ok(filled);
            }
            filled += points.len() as u64;
        }
    }
}
