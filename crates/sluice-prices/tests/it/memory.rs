//! History from the recent candles in memory equals history from the store, for the same
//! trades: windows still open, late trades, duplicates, every granularity, and paging with a
//! cursor across the edge of what memory holds. Memory answers without asking the store for
//! candles, and steps aside when another writer changed the stored candles.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use sluice_core::clock::ManualClock;
use sluice_core::prices::{Amount, Candle, Granularity, TokenRef, Trade, TradeOrder};
use sluice_prices::{HOT_HORIZON_SECONDS, HistoryPage, HistoryQuery, PriceService, PriceSettings};
use sluice_store::Result;
use sluice_store::prices::{Applied, PoolReserve, PricePoint, PriceStore, TokenInfo};

/// A price store that counts the history reads that reach it, and remembers the largest
/// batch it was given.
pub(crate) struct Counting {
    pub(crate) inner: Arc<dyn PriceStore>,
    pub(crate) history_reads: AtomicUsize,
    pub(crate) largest_batch: AtomicUsize,
    /// Trades handed to `apply_trades`, in all.
    pub(crate) trades_applied: AtomicUsize,
}

#[async_trait]
impl PriceStore for Counting {
    async fn apply_trades(
        &self,
        trades: &[Trade],
        keep_from: &(dyn Fn(Granularity) -> i64 + Sync),
    ) -> Result<Applied> {
        self.largest_batch.fetch_max(trades.len(), Ordering::SeqCst);
        self.trades_applied.fetch_add(trades.len(), Ordering::SeqCst);
        self.inner.apply_trades(trades, keep_from).await
    }
    async fn history(
        &self,
        token: &TokenRef,
        granularity: Granularity,
        from: i64,
        to: i64,
        limit: usize,
    ) -> Result<Vec<PricePoint>> {
        self.history_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.history(token, granularity, from, to, limit).await
    }
    async fn history_many(
        &self,
        ranges: &[(TokenRef, i64)],
        granularity: Granularity,
        to: i64,
        limit: usize,
    ) -> Result<Vec<(usize, PricePoint)>> {
        self.history_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.history_many(ranges, granularity, to, limit).await
    }
    async fn points_since(
        &self,
        granularity: Granularity,
        from: i64,
    ) -> Result<Vec<(TokenRef, PricePoint)>> {
        self.inner.points_since(granularity, from).await
    }
    async fn write_seq(&self) -> Result<i64> {
        self.inner.write_seq().await
    }
    async fn latest_candles(
        &self,
        token: &TokenRef,
        granularity: Granularity,
        from: i64,
        count: usize,
    ) -> Result<Vec<(i64, Candle)>> {
        self.inner.latest_candles(token, granularity, from, count).await
    }
    async fn tokens_traded_since(&self, since: i64) -> Result<Vec<TokenInfo>> {
        self.inner.tokens_traded_since(since).await
    }
    async fn decimals(&self, tokens: &[TokenRef]) -> Result<HashMap<TokenRef, u32>> {
        self.inner.decimals(tokens).await
    }
    async fn pool_reserves(&self, tokens: &[TokenRef]) -> Result<Vec<PoolReserve>> {
        self.inner.pool_reserves(tokens).await
    }
    async fn enforce_price_retention(
        &self,
        cutoffs: &[(Granularity, i64)],
        trades_before: i64,
    ) -> Result<u64> {
        self.inner.enforce_price_retention(cutoffs, trades_before).await
    }
    async fn compact_trade_ids(&self, before: i64) -> Result<u64> {
        self.inner.compact_trade_ids(before).await
    }
}

/// 2026-11-21T12:00:30Z: minute 12:00 is open.
fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 30).unwrap()
}

fn token(n: usize) -> TokenRef {
    TokenRef::new("base", &format!("0x{n:040x}"))
}

/// A trade of token `t` at `now() + seconds` (fractions of a second from `micros`), id `n`.
fn trade(t: usize, seconds: i64, micros: i64, n: u64, amount: u64, usd: u64) -> Trade {
    Trade {
        token: token(t),
        decimals: 6,
        token_amount: Amount(i128::from(amount) * 1_000_000_000_000_000),
        usd_amount: Amount(i128::from(usd) * 10_000_000_000_000_000),
        pool: None,
        order: TradeOrder {
            at_micros: (now().timestamp() + seconds) * 1_000_000 + micros,
            block_number: 1_000 + n,
            log_index: n % 3,
            transaction_hash: format!("0x{n:064x}"),
        },
    }
}

/// Trades of three tokens over the past 30 hours (reaching past the memory horizon), in
/// batches: busy token 0 every ~47 s, token 1 every ~7 minutes, token 2 a few times; some
/// trades in the open minute and one stamped a little ahead of the clock.
fn batches() -> Vec<Vec<Trade>> {
    let mut n = 0;
    let mut next = || {
        n += 1;
        n
    };
    let mut trades = Vec::new();
    let mut at = -30 * 3600;
    while at < 0 {
        let id = next();
        trades.push(trade(0, at, (id as i64 * 7919) % 1_000_000, id, 1 + id % 50, 3 + id % 97));
        if at % 7 == 0 {
            let id = next();
            trades.push(trade(1, at + 3, 0, id, 2 + id % 10, 5 + id % 13));
        }
        at += 47;
    }
    for seconds in [-26 * 3600, -3 * 3600, -61, 5, 20] {
        let id = next();
        trades.push(trade(2, seconds, 0, id, 3, 7 + id % 5));
    }
    let id = next();
    trades.push(trade(0, 40, 0, id, 1, 9)); // slightly ahead of the clock
    trades.sort_by_key(|t| t.order.at_micros);
    trades.chunks(400).map(<[Trade]>::to_vec).collect()
}

/// Every page of `query`, from memory (`true`) or the store.
async fn pages(service: &PriceService, query: &HistoryQuery, memory: bool) -> Vec<HistoryPage> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = if memory {
            service.history(query, cursor.as_deref()).await.unwrap()
        } else {
            service.history_from_store(query, cursor.as_deref()).await.unwrap()
        };
        cursor.clone_from(&page.cursor);
        out.push(page);
        if cursor.is_none() {
            return out;
        }
        // A cursor that does not move on would page forever: fail instead.
        assert!(out.len() < 100_000, "paging does not end");
    }
}

/// Queries over the last day at every granularity, some starting before the memory horizon,
/// some inside a window, one ending in the future.
fn queries() -> Vec<HistoryQuery> {
    let now = now().timestamp();
    let tokens = vec![token(0), token(1), token(2), token(3), token(0)];
    let mut out = Vec::new();
    for granularity in Granularity::ALL {
        for (from, to) in [
            (now - 86_400, now),
            (now - 86_400 + 7, now + 3600),
            (now - 3 * 3600 - 30, now - 3600),
            (now - HOT_HORIZON_SECONDS - 3600, now),
            (now - 29 * 3600, now - 20 * 3600),
        ] {
            out.push(HistoryQuery {
                tokens: tokens.clone(),
                granularity,
                start: from * 1_000_000,
                end: to * 1_000_000,
            });
        }
    }
    out
}

async fn fixture(
    page: usize,
) -> (tempfile::TempDir, Arc<Counting>, Arc<ManualClock>, Arc<PriceService>) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("p.db").display());
    let store = Arc::new(Counting {
        inner: sluice_store::open_prices(&url).await.unwrap(),
        history_reads: AtomicUsize::new(0),
        largest_batch: AtomicUsize::new(0),
        trades_applied: AtomicUsize::new(0),
    });
    let clock = Arc::new(ManualClock::new(now()));
    let service = PriceService::start(
        store.clone(),
        clock.clone(),
        PriceSettings { history_page_points: page },
    )
    .await
    .unwrap();
    (dir, store, clock, service)
}

async fn assert_memory_equals_store(service: &PriceService) {
    for query in queries() {
        let from_memory = pages(service, &query, true).await;
        let from_store = pages(service, &query, false).await;
        assert_eq!(from_memory, from_store, "{} from {}", query.granularity, query.start);
    }
}

#[tokio::test]
async fn history_from_memory_equals_history_from_the_store() {
    for page in [100_000, 50, 7] {
        let (_dir, store, _clock, service) = fixture(page).await;
        let batches = batches();
        for batch in &batches {
            service.ingest(batch.clone()).await.unwrap();
        }
        // Duplicates (a whole batch again, and a trade with other amounts but the same id)
        // and late trades (earlier in windows already counted, some becoming the open).
        service.ingest(batches[3].clone()).await.unwrap();
        let mut changed = batches[5][0].clone();
        changed.usd_amount = Amount(changed.usd_amount.0 * 3);
        let report = service.ingest(vec![changed]).await.unwrap();
        assert_eq!((report.counted, report.duplicates), (0, 1));
        let late = vec![
            trade(0, -3600, 0, 90_001, 5, 500),
            trade(0, -600, -1, 90_002, 2, 1),
            trade(1, -20 * 3600, 0, 90_003, 1, 1_000),
            trade(2, -2, 0, 90_004, 1, 2),
            trade(0, 29, 999_999, 90_005, 4, 4),
        ];
        assert_eq!(service.ingest(late).await.unwrap().counted, 5);
        assert_memory_equals_store(&service).await;

        // A day at 1m of token 0 comes from memory, without a history read of the store.
        let before = store.history_reads.load(Ordering::SeqCst);
        let query =
            &queries()[Granularity::ALL.iter().position(|g| *g == Granularity::M1).unwrap() * 5];
        let answer = pages(&service, query, true).await;
        assert!(
            answer[0].series[0].points.len() >= 1000.min(page),
            "{}",
            answer[0].series[0].points.len()
        );
        assert_eq!(store.history_reads.load(Ordering::SeqCst), before);

        // A service started on the same store loads the same memory.
        let restarted = PriceService::start(
            store.clone(),
            Arc::new(ManualClock::new(now())),
            PriceSettings { history_page_points: page },
        )
        .await
        .unwrap();
        assert_eq!(restarted.recent_footprint().0, service.recent_footprint().0);
        assert_memory_equals_store(&restarted).await;
    }
}

#[tokio::test]
async fn paging_crosses_the_edge_of_memory_without_a_gap() {
    let (_dir, store, _clock, service) = fixture(10).await;
    for batch in batches() {
        service.ingest(batch).await.unwrap();
    }
    // Starts two hours before the memory horizon, at 5m: the first pages come from the
    // store, the cursor then moves into the windows memory holds.
    let now = now().timestamp();
    let query = HistoryQuery {
        tokens: vec![token(0)],
        granularity: Granularity::M5,
        start: (now - HOT_HORIZON_SECONDS - 7200) * 1_000_000,
        end: now * 1_000_000,
    };
    let before = store.history_reads.load(Ordering::SeqCst);
    let from_memory = pages(&service, &query, true).await;
    let store_reads = store.history_reads.load(Ordering::SeqCst) - before;
    assert!(
        store_reads > 0 && store_reads < from_memory.len(),
        "{store_reads} of {}",
        from_memory.len()
    );
    assert_eq!(from_memory, pages(&service, &query, false).await);
    let starts: Vec<i64> = from_memory
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| &s.points)
        .map(|p| p.start)
        .collect();
    assert_eq!(starts.len(), (HOT_HORIZON_SECONDS + 7200) as usize / 300);
    assert!(starts.windows(2).all(|w| w[1] == w[0] + 300));
}

#[tokio::test]
async fn memory_steps_aside_when_another_writer_changed_the_candles_and_is_reloaded() {
    let (_dir, store, clock, service) = fixture(100_000).await;
    for batch in batches() {
        service.ingest(batch).await.unwrap();
    }
    // Another service writes to the same store: this one's memory no longer matches it.
    let other =
        PriceService::start(store.clone(), clock.clone(), PriceSettings::default()).await.unwrap();
    other.ingest(vec![trade(0, -100, 0, 77_777, 1, 100_000)]).await.unwrap();
    let query = &queries()[5]; // 1m, the last day
    let before = store.history_reads.load(Ordering::SeqCst);
    let answer = pages(&service, query, true).await;
    assert!(store.history_reads.load(Ordering::SeqCst) > before, "the store answered");
    assert_eq!(answer, pages(&other, query, true).await);
    assert!(
        answer[0].series[0].points.iter().any(|p| p.high == 1_000_000.0),
        "the other writer's trade is in the answer"
    );
    // The retention job reloads it (at most every ten minutes); memory answers again.
    service.enforce_retention().await.unwrap();
    let before = store.history_reads.load(Ordering::SeqCst);
    assert_eq!(pages(&service, query, true).await, answer);
    assert!(store.history_reads.load(Ordering::SeqCst) > before, "not reloaded yet");
    clock.advance(chrono::Duration::minutes(11));
    service.enforce_retention().await.unwrap();
    let before = store.history_reads.load(Ordering::SeqCst);
    assert_eq!(pages(&service, query, true).await, answer);
    assert_eq!(store.history_reads.load(Ordering::SeqCst), before);

    // Time passes: windows leave memory, queries still agree.
    clock.advance(chrono::Duration::hours(3));
    service.enforce_retention().await.unwrap();
    assert_memory_equals_store(&service).await;
}

/// The latest price answers from memory while it matches the store, and from the store once
/// another writer (another node) counted a trade this service never saw.
#[tokio::test]
async fn the_latest_price_comes_from_the_store_when_another_writer_counted_trades() {
    let (_dir, store, clock, service) = fixture(100_000).await;
    service.ingest(vec![trade(0, -100, 0, 1, 1, 200)]).await.unwrap();
    let asked = [token(0), token(1)];
    let mine = service.latest_checked(&asked, true).await.unwrap();
    assert_eq!(mine, service.latest(&asked, true), "memory answers while it matches");
    assert_eq!(mine.len(), 1);
    let other =
        PriceService::start(store.clone(), clock.clone(), PriceSettings::default()).await.unwrap();
    // Token 1 traded only through the other writer; token 0 again at another price.
    other.ingest(vec![trade(1, -90, 0, 2, 1, 300), trade(0, -80, 0, 3, 1, 500)]).await.unwrap();
    assert_eq!(service.latest(&asked, true).len(), 1, "this memory lacks token 1");
    let checked = service.latest_checked(&asked, true).await.unwrap();
    assert_eq!(checked, other.latest(&asked, true), "both answer what the store holds");
    assert_eq!(checked.len(), 2);
    // Once the retention job reloads (at most every ten minutes), memory answers again.
    clock.advance(chrono::Duration::minutes(11));
    service.enforce_retention().await.unwrap();
    other.enforce_retention().await.unwrap();
    assert_eq!(service.latest(&asked, true), other.latest_checked(&asked, true).await.unwrap());
}

/// The memory a service loads from PostgreSQL (whose reads come in no promised order) equals
/// the store, as on SQLite.
#[tokio::test]
async fn memory_loaded_from_postgres_equals_the_store() {
    use std::str::FromStr;
    let url = std::env::var("SLUICE_TEST_POSTGRES_URL")
        .expect("SLUICE_TEST_POSTGRES_URL must name a PostgreSQL database; run scripts/test");
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await.unwrap();
    let options = sqlx::postgres::PgConnectOptions::from_str(&url)
        .unwrap()
        .options([("search_path", &schema)]);
    let store: Arc<dyn PriceStore> =
        Arc::new(sluice_store::PgStore::open_with(options).await.unwrap());
    let settings = PriceSettings { history_page_points: 50 };
    let clock = Arc::new(ManualClock::new(now()));
    let service = PriceService::start(store.clone(), clock, settings).await.unwrap();
    for batch in batches() {
        service.ingest(batch).await.unwrap();
    }
    assert_memory_equals_store(&service).await;
    let restarted =
        PriceService::start(store, Arc::new(ManualClock::new(now())), settings).await.unwrap();
    assert_eq!(restarted.recent_footprint().0, service.recent_footprint().0);
    assert_memory_equals_store(&restarted).await;
}
