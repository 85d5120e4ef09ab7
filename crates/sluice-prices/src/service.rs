//! The price service: counts trades into the store, keeps each recently traded token's
//! latest minutes in memory, and answers the latest-price and history queries under the
//! rules of docs/contract.md §Token price endpoints (`docs/prices.md`).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use sluice_core::clock::Clock;
use sluice_core::prices::{Amount, Candle, Granularity, TokenRef, Trade, TradeOrder};
use sluice_store::StoreError;
use sluice_store::prices::{Applied, PricePoint, PriceStore};

use crate::cursor::HistoryCursor;
use crate::recent::{RecentCandles, horizon};

/// Seconds in a day.
const DAY: i64 = 86_400;

/// A token without a trade in this long gets no latest price (docs/contract.md §Limits).
pub const NO_TRADE_CUTOFF_SECONDS: i64 = 7 * DAY;

/// Trade ids are remembered this long; a trade older than this when it arrives is not
/// counted (it could not be told apart from one counted before). The longest finite
/// candle retention, so every window a late trade could still change is covered.
pub const DEDUP_HORIZON_SECONDS: i64 = 30 * DAY;

/// Most 1-minute candles kept in memory per token: the newest few, enough to find the most
/// recent completed minute even when the current one (or a trade stamped slightly ahead of
/// the clock) already has a window.
const HOT_MINUTES: usize = 4;

/// How long after an hour of block time ends its trade ids are compacted (seconds): trades
/// of the hour still arriving after that are appended and compacted on a later run.
const ID_COMPACTION_DELAY_SECONDS: i64 = 300;

/// Least time between two reloads of the recent candles after another writer changed the
/// stored ones (seconds): a reload reads a day of candles.
const RESYNC_INTERVAL_SECONDS: i64 = 600;

/// How the service behaves; tests use small pages.
#[derive(Debug, Clone, Copy)]
pub struct PriceSettings {
    /// Most price points per history page (the API has no page-size parameter).
    pub history_page_points: usize,
}

impl Default for PriceSettings {
    fn default() -> Self {
        // 50 tokens × a day of 1-minute windows (72,000 points) fit on one page.
        Self { history_page_points: 100_000 }
    }
}

/// Errors of the price service.
#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    /// The store failed; a retry may help.
    #[error("price store: {0}")]
    Store(#[from] StoreError),
    /// The stream log failed; a retry may help.
    #[error("stream log: {0}")]
    Bus(#[from] sluice_bus::BusError),
    /// A history cursor that this service did not make for this request.
    #[error("cursor is not valid for this request")]
    BadCursor,
}

/// A token's latest price, as `POST /api/v1/developer/prices` answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct LatestPrice {
    pub token: TokenRef,
    /// Time of the last trade of the window the price is from.
    pub timestamp: DateTime<Utc>,
    pub decimals: u32,
    pub price: f64,
    pub open: f64,
    pub high: f64,
    pub close: f64,
    pub low: f64,
    /// (Σ over the token's pools of the latest reserve) × `price`; `None` when no pool is
    /// known.
    pub total_liquidity_usd: Option<f64>,
}

/// The points of one token on a history page.
#[derive(Debug, Clone, PartialEq)]
pub struct HistorySeries {
    pub token: TokenRef,
    pub decimals: u32,
    pub points: Vec<PricePoint>,
}

/// One page of a history answer.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryPage {
    pub series: Vec<HistorySeries>,
    /// The opaque cursor of the next page; `None` on the last.
    pub cursor: Option<String>,
}

/// A checked history request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryQuery {
    pub tokens: Vec<TokenRef>,
    pub granularity: Granularity,
    /// Unix microseconds; windows whose start lies in `[start, end)`.
    pub start: i64,
    pub end: i64,
}

/// What one ingest call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngestReport {
    pub counted: usize,
    pub duplicates: usize,
    /// Trades older than the dedup horizon when they arrived.
    pub too_old: usize,
}

#[derive(Debug, Default)]
struct HotToken {
    decimals: u32,
    last_trade: Option<TradeOrder>,
    /// Newest 1-minute candles, newest first.
    minutes: Vec<(i64, Candle)>,
    /// Latest reserve per pool, with the trade it came from.
    pools: HashMap<String, (Amount, TradeOrder)>,
    /// Σ of the reserves in `pools`, kept exact as they change.
    reserves: Amount,
}

impl HotToken {
    /// Follows `trade` when it is the latest of the token (or of its pool). Trades mostly
    /// arrive in order, so this runs per trade: the stored orders are overwritten in place.
    fn note_trade(&mut self, trade: &Trade) {
        match &mut self.last_trade {
            Some(last) if trade.order <= *last => {}
            Some(last) => {
                self.decimals = trade.decimals;
                copy_order(last, &trade.order);
            }
            None => {
                self.decimals = trade.decimals;
                self.last_trade = Some(trade.order.clone());
            }
        }
        if let Some((pool, reserve)) = &trade.pool {
            match self.pools.get_mut(pool) {
                Some((_, order)) if trade.order <= *order => {}
                Some((stored, order)) => {
                    let old = std::mem::replace(stored, *reserve);
                    self.reserves = replace_in_sum(self.reserves, Some(old), *reserve);
                    copy_order(order, &trade.order);
                }
                None => self.set_pool(pool.clone(), *reserve, trade.order.clone()),
            }
        }
    }

    fn set_pool(&mut self, pool: String, reserve: Amount, order: TradeOrder) {
        let old = self.pools.insert(pool, (reserve, order)).map(|(old, _)| old);
        self.reserves = replace_in_sum(self.reserves, old, reserve);
    }

    fn put_minute(&mut self, start: i64, candle: Candle) {
        match self.minutes.iter_mut().find(|(s, _)| *s == start) {
            Some(slot) => slot.1 = candle,
            None => {
                self.minutes.push((start, candle));
                self.minutes.sort_by_key(|(start, _)| std::cmp::Reverse(*start));
                self.minutes.truncate(HOT_MINUTES);
            }
        }
    }
}

/// `sum` with the reserve `old` (if any) replaced by `new`.
fn replace_in_sum(sum: Amount, old: Option<Amount>, new: Amount) -> Amount {
    let without = old.map_or(sum, |old| Amount(sum.0.saturating_sub(old.0)));
    without.saturating_add(new)
}

/// Sets `into` to `from`, reusing `into`'s hash buffer.
fn copy_order(into: &mut TradeOrder, from: &TradeOrder) {
    into.at_micros = from.at_micros;
    into.block_number = from.block_number;
    into.log_index = from.log_index;
    into.transaction_hash.clone_from(&from.transaction_hash);
}

/// Token prices: ingest, latest, history, retention.
pub struct PriceService {
    store: Arc<dyn PriceStore>,
    clock: Arc<dyn Clock>,
    settings: PriceSettings,
    hot: RwLock<foldhash::HashMap<TokenRef, HotToken>>,
    /// Every token's recent history points, for history queries.
    recent: RwLock<RecentCandles>,
    /// Held by each ingest and reload, so that the batches of this service reach the store
    /// and memory in the same order (memory then stays matched to the store's write count).
    writing: tokio::sync::Mutex<()>,
    /// When the recent candles were last reloaded (Unix seconds).
    last_resync: std::sync::Mutex<Option<i64>>,
    /// The store's write count `hot` matches (`None`: another process counted trades into
    /// the same store since, so `hot` lacks them).
    hot_seq: std::sync::Mutex<Option<i64>>,
}

impl std::fmt::Debug for PriceService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PriceService").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// The first whole second at or after `micros`.
fn ceil_seconds(micros: i64) -> i64 {
    micros.div_euclid(1_000_000) + i64::from(micros.rem_euclid(1_000_000) != 0)
}

fn micros_to_time(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).unwrap_or_default()
}

impl PriceService {
    /// A service over `store`, with the latest minutes of every token traded in the past 7
    /// days loaded into memory.
    ///
    /// # Errors
    /// A store failure while loading.
    pub async fn start(
        store: Arc<dyn PriceStore>,
        clock: Arc<dyn Clock>,
        settings: PriceSettings,
    ) -> Result<Arc<Self>, PriceError> {
        let service = Arc::new(Self {
            store,
            clock,
            settings,
            hot: RwLock::new(foldhash::HashMap::default()),
            recent: RwLock::new(RecentCandles::empty()),
            writing: tokio::sync::Mutex::new(()),
            last_resync: std::sync::Mutex::new(None),
            hot_seq: std::sync::Mutex::new(None),
        });
        service.load().await?;
        service.load_recent().await?;
        Ok(service)
    }

    fn now_micros(&self) -> i64 {
        self.clock.now().timestamp_micros()
    }

    async fn load(&self) -> Result<(), PriceError> {
        let before = self.store.write_seq().await?;
        let since = self.now_micros() - NO_TRADE_CUTOFF_SECONDS * 1_000_000;
        let infos = self.store.tokens_traded_since(since).await?;
        let tokens = infos.into_iter().map(|info| {
            let hot = HotToken {
                decimals: info.decimals,
                last_trade: Some(info.last_trade),
                ..HotToken::default()
            };
            (info.token, hot)
        });
        let loaded = self.read_hot(tokens, since).await?;
        tracing::info!(tokens = loaded.len(), "loaded recently traded tokens");
        *self.hot.write().expect("price memory lock is never poisoned") = loaded;
        let after = self.store.write_seq().await?;
        *self.hot_seq.lock().expect("hot write count lock is never poisoned") =
            (before == after).then_some(after);
        Ok(())
    }

    /// `tokens` as the store holds them: each one's latest minutes with trades since `since`
    /// and its pools' reserves, over what `tokens` brings.
    async fn read_hot(
        &self,
        tokens: impl IntoIterator<Item = (TokenRef, HotToken)>,
        since: i64,
    ) -> Result<foldhash::HashMap<TokenRef, HotToken>, PriceError> {
        let from = Granularity::M1.window_start(since);
        let mut read = foldhash::HashMap::default();
        for (token, mut hot) in tokens {
            hot.minutes =
                self.store.latest_candles(&token, Granularity::M1, from, HOT_MINUTES).await?;
            read.insert(token, hot);
        }
        let tokens: Vec<TokenRef> = read.keys().cloned().collect();
        for reserve in self.store.pool_reserves(&tokens).await? {
            if let Some(hot) = read.get_mut(&reserve.token) {
                hot.set_pool(reserve.pool, reserve.reserve, reserve.last_trade);
            }
        }
        Ok(read)
    }

    /// Loads the recent candles of every token from the store. They match the store's
    /// write count when no write happened meanwhile (this service's own are held off).
    async fn load_recent(&self) -> Result<(), PriceError> {
        let _writing = self.writing.lock().await;
        let now = self.now_micros().div_euclid(1_000_000);
        *self.last_resync.lock().expect("resync time lock is never poisoned") = Some(now);
        let before = self.store.write_seq().await?;
        let mut from = [i64::MAX; 5];
        let mut points = Vec::with_capacity(Granularity::ALL.len());
        for granularity in Granularity::ALL {
            from[granularity as usize] = horizon(granularity, now);
            let rows = self.store.points_since(granularity, from[granularity as usize]).await?;
            points.push((granularity, rows));
        }
        let after = self.store.write_seq().await?;
        let recent = RecentCandles::loaded(from, (before == after).then_some(after), points);
        let (count, bytes) = recent.footprint();
        tracing::info!(
            points = count,
            bytes,
            matched = recent.seq.is_some(),
            "loaded recent candles"
        );
        *self.recent.write().expect("recent candles lock is never poisoned") = recent;
        Ok(())
    }

    /// The recent candles' footprint: points held and the bytes they take.
    pub fn recent_footprint(&self) -> (usize, usize) {
        self.recent.read().expect("recent candles lock is never poisoned").footprint()
    }

    /// Counts `trades` (durably, before this returns) and updates the in-memory latest
    /// minutes. Trades older than the 30-day dedup horizon are not counted.
    ///
    /// # Errors
    /// A store failure; nothing is counted then, and the same trades may be given again.
    pub async fn ingest(&self, trades: Vec<Trade>) -> Result<IngestReport, PriceError> {
        let now = self.now_micros() / 1_000_000;
        let horizon = (now - DEDUP_HORIZON_SECONDS) * 1_000_000;
        let total = trades.len();
        let trades: Vec<Trade> =
            trades.into_iter().filter(|t| t.order.at_micros >= horizon).collect();
        let too_old = total - trades.len();
        if trades.is_empty() {
            return Ok(IngestReport { too_old, ..IngestReport::default() });
        }
        let keep_from = move |granularity: Granularity| match granularity.retention_seconds() {
            Some(retention) => now - retention,
            None => i64::MIN,
        };
        let _writing = self.writing.lock().await;
        let Applied { counted, duplicates, candles, write_seq } =
            self.store.apply_trades(&trades, &keep_from).await?;
        {
            let mut hot = self.hot.write().expect("price memory lock is never poisoned");
            for trade in counted.iter().map(|&position| &trades[position]) {
                match hot.get_mut(&trade.token) {
                    Some(entry) => entry.note_trade(trade),
                    None => hot.entry(trade.token.clone()).or_default().note_trade(trade),
                }
            }
            for (key, candle) in &candles {
                if key.granularity == Granularity::M1 {
                    hot.entry(key.token.clone()).or_default().put_minute(key.start, candle.clone());
                }
            }
        }
        if let Some(seq) = write_seq {
            let mut hot_seq = self.hot_seq.lock().expect("hot write count lock is never poisoned");
            *hot_seq = hot_seq.filter(|known| *known + 1 == seq).map(|_| seq);
        }
        self.recent
            .write()
            .expect("recent candles lock is never poisoned")
            .apply(&candles, write_seq);
        Ok(IngestReport { counted: counted.len(), duplicates, too_old })
    }

    /// The latest price of each of `tokens` that traded in the past 7 days, in request order
    /// (a token asked for twice is answered twice): the most recent completed minute with
    /// trades, or, when the token traded only in the current minute, that minute so far.
    pub fn latest(&self, tokens: &[TokenRef], with_liquidity: bool) -> Vec<LatestPrice> {
        let hot = self.hot.read().expect("price memory lock is never poisoned");
        latest_in(&hot, tokens, with_liquidity, self.now_micros())
    }

    /// [`PriceService::latest`], from memory while it matches the store's write count, else
    /// read from the store: another process counts trades into the same store (the other
    /// nodes of a cluster), and this one's memory lacks theirs.
    ///
    /// # Errors
    /// A store failure.
    pub async fn latest_checked(
        &self,
        tokens: &[TokenRef],
        with_liquidity: bool,
    ) -> Result<Vec<LatestPrice>, PriceError> {
        let stored = self.store.write_seq().await?;
        if *self.hot_seq.lock().expect("hot write count lock is never poisoned") == Some(stored) {
            return Ok(self.latest(tokens, with_liquidity));
        }
        let now = self.now_micros();
        let mut unique: Vec<TokenRef> = tokens.to_vec();
        unique.sort();
        unique.dedup();
        // Tokens without stored decimals never traded: nothing to read for them.
        let decimals = self.store.decimals(&unique).await?;
        let known = unique.into_iter().filter_map(|token| {
            let decimals = *decimals.get(&token)?;
            Some((token, HotToken { decimals, ..HotToken::default() }))
        });
        let read = self.read_hot(known, now - NO_TRADE_CUTOFF_SECONDS * 1_000_000).await?;
        Ok(latest_in(&read, tokens, with_liquidity, now))
    }
}

/// The latest price of each of `tokens` in `hot`, as [`PriceService::latest`] answers.
fn latest_in(
    hot: &foldhash::HashMap<TokenRef, HotToken>,
    tokens: &[TokenRef],
    with_liquidity: bool,
    now: i64,
) -> Vec<LatestPrice> {
    let current_minute = Granularity::M1.window_start(now);
    let cutoff = now - NO_TRADE_CUTOFF_SECONDS * 1_000_000;
    let mut out = Vec::with_capacity(tokens.len());
    for token in tokens {
        let Some(entry) = hot.get(token) else { continue };
        let completed = entry.minutes.iter().find(|(start, _)| *start < current_minute);
        let open = entry.minutes.iter().find(|(start, _)| *start == current_minute);
        let recent = |found: Option<&(i64, Candle)>| {
            found.is_some_and(|(_, candle)| candle.last.at_micros >= cutoff)
        };
        let chosen = if recent(completed) {
            completed
        } else if recent(open) {
            open
        } else {
            None
        };
        let Some((_, candle)) = chosen else { continue };
        let price = candle.price();
        let total_liquidity_usd = (with_liquidity && !entry.pools.is_empty()).then(|| {
            let reserves = entry
                .pools
                .values()
                .fold(Amount::ZERO, |sum, (reserve, _)| sum.saturating_add(*reserve));
            reserves.to_f64() * price
        });
        out.push(LatestPrice {
            token: token.clone(),
            timestamp: micros_to_time(candle.last.at_micros),
            decimals: entry.decimals,
            price,
            open: candle.open,
            high: candle.high,
            close: candle.close,
            low: candle.low,
            total_liquidity_usd,
        });
    }
    out
}

impl PriceService {
    /// The earliest start a history request at `granularity` may have now (Unix
    /// microseconds), or `None` when the granularity keeps all history.
    pub fn earliest_start(&self, granularity: Granularity) -> Option<i64> {
        granularity.retention_seconds().map(|seconds| self.now_micros() - seconds * 1_000_000)
    }

    /// One page of `query`'s answer, from `cursor` on (`None`: the first page). Points are
    /// ordered by token (request order), then window start; a token without points in the
    /// range has no series.
    ///
    /// Series whose asked range lies within the recent candles are read from memory while
    /// it matches the store; the others from the store, in one query. Both give the same
    /// points.
    ///
    /// # Errors
    /// [`PriceError::BadCursor`] for a cursor not made for this query, or a store failure.
    pub async fn history(
        &self,
        query: &HistoryQuery,
        cursor: Option<&str>,
    ) -> Result<HistoryPage, PriceError> {
        self.page(query, cursor, true).await
    }

    /// [`PriceService::history`] read from the store only, never from memory: the reference
    /// the memory answers are checked against, and the path of ranges memory does not hold.
    ///
    /// # Errors
    /// As [`PriceService::history`].
    pub async fn history_from_store(
        &self,
        query: &HistoryQuery,
        cursor: Option<&str>,
    ) -> Result<HistoryPage, PriceError> {
        self.page(query, cursor, false).await
    }

    async fn page(
        &self,
        query: &HistoryQuery,
        cursor: Option<&str>,
        use_memory: bool,
    ) -> Result<HistoryPage, PriceError> {
        let fingerprint = HistoryCursor::fingerprint(query);
        let position = match cursor {
            None => HistoryCursor { token: 0, from: i64::MIN, fingerprint },
            Some(text) => HistoryCursor::decode(text)
                .filter(|c| c.fingerprint == fingerprint && c.token < query.tokens.len())
                .ok_or(PriceError::BadCursor)?,
        };
        // Windows whose start (whole seconds) lies in [start, end), and still retained.
        let mut from = ceil_seconds(query.start);
        if let Some(earliest) = self.earliest_start(query.granularity) {
            from = from.max(ceil_seconds(earliest));
        }
        let to = ceil_seconds(query.end);
        let ranges: Vec<(usize, i64)> = (position.token..query.tokens.len())
            .map(|index| {
                (index, if index == position.token { from.max(position.from) } else { from })
            })
            .collect();
        let page = self.settings.history_page_points.max(1);
        // One point more than a page tells whether another page follows.
        let wanted = page + 1;
        let mut rows: Vec<(usize, PricePoint)> = Vec::new();
        let mut rest = ranges.as_slice();
        if use_memory {
            let seq = self.store.write_seq().await?;
            let recent = self.recent.read().expect("recent candles lock is never poisoned");
            if recent.seq == Some(seq) {
                while let Some(((index, token_from), tail)) = rest.split_first() {
                    if !recent.covers(query.granularity, *token_from) || rows.len() >= wanted {
                        break;
                    }
                    let room = wanted - rows.len();
                    let token = &query.tokens[*index];
                    recent.points(
                        token,
                        query.granularity,
                        *token_from..to,
                        room,
                        *index,
                        &mut rows,
                    );
                    rest = tail;
                }
            }
        }
        if !rest.is_empty() && rows.len() < wanted {
            let asked: Vec<(TokenRef, i64)> = rest
                .iter()
                .map(|(index, token_from)| (query.tokens[*index].clone(), *token_from))
                .collect();
            let found =
                self.store.history_many(&asked, query.granularity, to, wanted - rows.len()).await?;
            rows.extend(found.into_iter().map(|(at, point)| (rest[at].0, point)));
        }
        let cursor = (rows.len() > page).then(|| {
            let (index, next) = rows[page];
            rows.truncate(page);
            HistoryCursor { token: index, from: next.start, fingerprint }.encode()
        });
        let decimals = self.store.decimals(&query.tokens[position.token..]).await?;
        let mut series: Vec<HistorySeries> = Vec::new();
        let mut current = None;
        for (index, point) in rows {
            match series.last_mut() {
                Some(last) if current == Some(index) => last.points.push(point),
                _ => {
                    let token = query.tokens[index].clone();
                    let decimals = decimals.get(&token).copied().unwrap_or(0);
                    series.push(HistorySeries { token, decimals, points: vec![point] });
                    current = Some(index);
                }
            }
        }
        Ok(HistoryPage { series, cursor })
    }

    /// Removes candles past their retention and trade ids past the dedup horizon, compacts
    /// the trade ids of ended hours, forgets in-memory tokens without a trade in 7 days and
    /// recent candles past the memory horizon, and reloads the recent candles when another
    /// writer changed the stored ones. Returns the rows removed.
    ///
    /// # Errors
    /// A store failure.
    pub async fn enforce_retention(&self) -> Result<u64, PriceError> {
        let now = self.now_micros() / 1_000_000;
        let cutoffs: Vec<(Granularity, i64)> = Granularity::ALL
            .into_iter()
            .filter_map(|g| g.retention_seconds().map(|r| (g, now - r)))
            .collect();
        let mut removed =
            self.store.enforce_price_retention(&cutoffs, now - DEDUP_HORIZON_SECONDS).await?;
        // Hours of trade ids written in many batches become one row each, a few minutes after
        // the hour (of block time) ended.
        removed += self.store.compact_trade_ids(now - ID_COMPACTION_DELAY_SECONDS).await?;
        let cutoff = (now - NO_TRADE_CUTOFF_SECONDS) * 1_000_000;
        self.hot
            .write()
            .expect("price memory lock is never poisoned")
            .retain(|_, hot| hot.last_trade.as_ref().is_some_and(|last| last.at_micros >= cutoff));
        self.recent.write().expect("recent candles lock is never poisoned").evict(now);
        // Memory another writer made stale is reloaded, but not more often than every
        // RESYNC_INTERVAL_SECONDS: with writers in several processes it goes stale again at
        // once, and history is then answered from the store.
        let stored = self.store.write_seq().await?;
        let stale =
            self.recent.read().expect("recent candles lock is never poisoned").seq != Some(stored);
        let last = *self.last_resync.lock().expect("resync time lock is never poisoned");
        let hot_stale =
            *self.hot_seq.lock().expect("hot write count lock is never poisoned") != Some(stored);
        if (stale || hot_stale) && last.is_none_or(|last| now - last >= RESYNC_INTERVAL_SECONDS) {
            self.load_recent().await?;
            let _writing = self.writing.lock().await;
            self.load().await?;
        }
        Ok(removed)
    }
}
