//! The price store on SQLite and PostgreSQL: exact candle merges, duplicates, late trades,
//! decimals and reserves that follow the latest trade, history ranges and retention.

use std::sync::Arc;

use sluice_core::prices::{Amount, Granularity, TokenRef, Trade, TradeOrder};
use sluice_store::prices::{PricePoint, PriceStore};

on_both_backends!(
    |store| Arc::new(store) as Arc<dyn PriceStore>;
    candles_merge_exactly_and_duplicates_count_once,
    late_trades_update_the_window_they_belong_to,
    decimals_and_reserves_follow_the_latest_trade,
    history_returns_the_range_in_order_and_retention_removes_old_windows,
    history_of_many_series_comes_in_range_order_and_stops_at_the_limit,
    the_write_count_moves_with_each_batch_that_changes_candles,
    prices_are_stored_bit_for_bit,
    many_series_read_at_once_equal_each_read_alone,
    points_since_reads_every_token_traded_since,
);

/// 2025-11-21T12:00:00Z.
const T0: i64 = 1_763_726_400;

fn usdc() -> TokenRef {
    TokenRef::new("base", "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913")
}

fn trade(second: i64, log: u64, token: &str, usd: &str, pool: Option<(&str, &str)>) -> Trade {
    Trade {
        token: usdc(),
        decimals: 6,
        token_amount: Amount::parse(token).unwrap(),
        usd_amount: Amount::parse(usd).unwrap(),
        pool: pool.map(|(p, r)| (p.to_owned(), Amount::parse(r).unwrap())),
        order: TradeOrder {
            at_micros: (T0 + second) * 1_000_000,
            block_number: 100 + second as u64,
            log_index: log,
            transaction_hash: format!("0x{second:064x}"),
        },
    }
}

fn keep_all(_: Granularity) -> i64 {
    i64::MIN
}

async fn candles_merge_exactly_and_duplicates_count_once(store: Arc<dyn PriceStore>) {
    let first = store
        .apply_trades(
            &[trade(5, 1, "50", "100", None), trade(20, 1, "100", "300", None)],
            &keep_all,
        )
        .await
        .unwrap();
    assert_eq!(first.counted.len(), 2);
    assert_eq!(first.duplicates, 0);
    let again = store
        .apply_trades(&[trade(5, 1, "50", "100", None), trade(5, 1, "50", "100", None)], &keep_all)
        .await
        .unwrap();
    assert_eq!((again.counted.len(), again.duplicates), (0, 2));
    let minute = store.latest_candles(&usdc(), Granularity::M1, 0, 5).await.unwrap();
    assert_eq!(minute.len(), 1);
    let (start, candle) = &minute[0];
    assert_eq!(*start, T0);
    assert_eq!(candle.trade_count, 2);
    assert_eq!(candle.price(), 400.0 / 150.0);
    assert_eq!((candle.open, candle.close, candle.high, candle.low), (2.0, 3.0, 3.0, 2.0));
    let quarter = store.latest_candles(&usdc(), Granularity::S15, 0, 5).await.unwrap();
    assert_eq!(quarter.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![T0 + 15, T0]);
    // A batch of counted and new trades counts the new ones only.
    let mixed = store
        .apply_trades(
            &[
                trade(5, 1, "50", "100", None),
                trade(90, 1, "1", "1", None),
                trade(20, 1, "1", "1", None),
            ],
            &keep_all,
        )
        .await
        .unwrap();
    assert_eq!(mixed.counted, vec![1]);
    assert_eq!(mixed.duplicates, 2);
}

async fn late_trades_update_the_window_they_belong_to(store: Arc<dyn PriceStore>) {
    store.apply_trades(&[trade(30, 0, "10", "20", None)], &keep_all).await.unwrap();
    // Earlier in the same minute: becomes the open; arrives after the later trade.
    let late = store.apply_trades(&[trade(10, 0, "10", "10", None)], &keep_all).await.unwrap();
    // The merged candle of every granularity comes back, as stored.
    assert_eq!(late.candles.len(), 5);
    let (_, merged) =
        late.candles.iter().find(|(key, _)| key.granularity == Granularity::M1).unwrap();
    assert_eq!((merged.open, merged.close, merged.trade_count), (1.0, 2.0, 2));
    let day = store.latest_candles(&usdc(), Granularity::D1, 0, 1).await.unwrap();
    assert_eq!(day[0].1.price(), 1.5);
    assert_eq!(day[0].1.first.at_micros, (T0 + 10) * 1_000_000);
}

async fn decimals_and_reserves_follow_the_latest_trade(store: Arc<dyn PriceStore>) {
    let mut newer = trade(40, 0, "1", "1", Some(("0xpool", "500")));
    newer.decimals = 18;
    store.apply_trades(&[newer], &keep_all).await.unwrap();
    // An older trade arriving later changes neither.
    store
        .apply_trades(&[trade(10, 0, "1", "1", Some(("0xpool", "900")))], &keep_all)
        .await
        .unwrap();
    store
        .apply_trades(&[trade(20, 0, "1", "1", Some(("0xother", "7.5")))], &keep_all)
        .await
        .unwrap();
    let decimals = store.decimals(&[usdc(), TokenRef::new("base", "0x00")]).await.unwrap();
    assert_eq!(decimals.len(), 1);
    assert_eq!(decimals[&usdc()], 18);
    let pools = store.pool_reserves(&[usdc()]).await.unwrap();
    let reserves: Vec<(String, String)> =
        pools.iter().map(|p| (p.pool.clone(), p.reserve.to_string())).collect();
    assert_eq!(reserves, vec![("0xother".into(), "7.5".into()), ("0xpool".into(), "500".into())]);
    let traded = store.tokens_traded_since((T0 + 40) * 1_000_000).await.unwrap();
    assert_eq!(traded.len(), 1);
    assert!(store.tokens_traded_since((T0 + 41) * 1_000_000).await.unwrap().is_empty());
}

async fn history_returns_the_range_in_order_and_retention_removes_old_windows(
    store: Arc<dyn PriceStore>,
) {
    let trades: Vec<Trade> =
        (0..10).map(|m| trade(m * 60 + 59, 0, "2", &format!("{}", 2 * (m + 1)), None)).collect();
    // Windows before `T0 + 120` are not kept at 15s.
    let keep = |g: Granularity| if g == Granularity::S15 { T0 + 120 } else { i64::MIN };
    store.apply_trades(&trades, &keep).await.unwrap();
    let points = store.history(&usdc(), Granularity::M1, T0 + 60, T0 + 300, 100).await.unwrap();
    let starts: Vec<i64> = points.iter().map(|p| p.start).collect();
    assert_eq!(starts, vec![T0 + 60, T0 + 120, T0 + 180, T0 + 240]);
    assert_eq!(
        points[0],
        PricePoint { start: T0 + 60, price: 2.0, open: 2.0, high: 2.0, close: 2.0, low: 2.0 }
    );
    let limited = store.history(&usdc(), Granularity::M1, T0, T0 + 600, 3).await.unwrap();
    assert_eq!(limited.len(), 3);
    let fine = store.history(&usdc(), Granularity::S15, T0, T0 + 600, 100).await.unwrap();
    assert_eq!(fine.first().unwrap().start, T0 + 165);
    let removed =
        store.enforce_price_retention(&[(Granularity::M1, T0 + 300)], T0 + 200).await.unwrap();
    // Five minute windows; trade ids are kept by whole hours of block time, and the hour
    // of T0 + 200 is not over.
    assert_eq!(removed, 5);
    let left = store.history(&usdc(), Granularity::M1, T0, T0 + 600, 100).await.unwrap();
    assert_eq!(left.first().unwrap().start, T0 + 300);
    let again = store.apply_trades(&trades[..1], &keep).await.unwrap();
    assert_eq!((again.counted.len(), again.duplicates), (0, 1));
    // Once the hour is past the horizon its ids go (one block), so the trade counts again.
    let removed = store.enforce_price_retention(&[], T0 + 3600).await.unwrap();
    assert_eq!(removed, 1);
    let again = store.apply_trades(&trades[..1], &keep).await.unwrap();
    assert_eq!((again.counted.len(), again.duplicates), (1, 0));
    let hours = store.history(&usdc(), Granularity::H1, T0, T0 + 3600, 100).await.unwrap();
    assert_eq!(hours.len(), 1);
}

async fn history_of_many_series_comes_in_range_order_and_stops_at_the_limit(
    store: Arc<dyn PriceStore>,
) {
    let mut trades: Vec<Trade> =
        (0..5).map(|m| trade(m * 60, 0, "1", &format!("{}", m + 1), None)).collect();
    let mut other = trade(30, 7, "1", "9", None);
    other.token = TokenRef::new("base", "0x00000000000000000000000000000000000000aa");
    trades.push(other.clone());
    store.apply_trades(&trades, &keep_all).await.unwrap();
    let never = TokenRef::new("base", "0x00");
    let ranges = vec![(other.token.clone(), T0), (never, T0), (usdc(), T0 + 120), (usdc(), T0)];
    let found = store.history_many(&ranges, Granularity::M1, T0 + 240, 100).await.unwrap();
    let got: Vec<(usize, i64)> = found.iter().map(|(i, p)| (*i, p.start)).collect();
    assert_eq!(
        got,
        vec![
            (0, T0),
            (2, T0 + 120),
            (2, T0 + 180),
            (3, T0),
            (3, T0 + 60),
            (3, T0 + 120),
            (3, T0 + 180)
        ]
    );
    assert_eq!(found[0].1.price, 9.0);
    let limited = store.history_many(&ranges, Granularity::M1, T0 + 240, 2).await.unwrap();
    assert_eq!(limited.iter().map(|(i, p)| (*i, p.start)).collect::<Vec<_>>(), got[..2]);
    // Every token's points from a window start on, as history gives them (once sorted).
    let since = store.points_since(Granularity::M1, T0 + 60).await.unwrap();
    assert_eq!(since.len(), 4);
    assert!(since.iter().all(|(token, _)| *token == usdc()));
    let history = store.history(&usdc(), Granularity::M1, T0 + 60, i64::MAX, 100).await.unwrap();
    let mut since: Vec<PricePoint> = since.into_iter().map(|(_, p)| p).collect();
    since.sort_by_key(|point| point.start);
    assert_eq!(since, history);
}

async fn the_write_count_moves_with_each_batch_that_changes_candles(store: Arc<dyn PriceStore>) {
    let start = store.write_seq().await.unwrap();
    let first = store.apply_trades(&[trade(5, 0, "1", "1", None)], &keep_all).await.unwrap();
    assert_eq!(first.write_seq, Some(start + 1));
    // Only duplicates: no candle changes, no count.
    let again = store.apply_trades(&[trade(5, 0, "1", "1", None)], &keep_all).await.unwrap();
    assert_eq!(again.write_seq, None);
    let second = store.apply_trades(&[trade(6, 0, "1", "1", None)], &keep_all).await.unwrap();
    assert_eq!(second.write_seq, Some(start + 2));
    assert_eq!(store.write_seq().await.unwrap(), start + 2);
}

async fn prices_are_stored_bit_for_bit(store: Arc<dyn PriceStore>) {
    // Prices with long binary expansions, tiny and huge ones (10^-18 units on both sides).
    let cases = [
        ("3", "1"),
        ("7", "3"),
        ("0.1", "0.3"),
        ("170000000000000000000", "0.000000000000000001"),
        ("0.000000000000000001", "170000000000000000000"),
        ("1234567.891011121314151617", "0.000000000000000007"),
        ("2", "97000.5"),
    ];
    for (n, (token, usd)) in cases.iter().enumerate() {
        let mut trade = trade(n as i64 * 60, 0, token, usd, None);
        trade.token = TokenRef::new("base", &format!("0x{n:040x}"));
        store.apply_trades(std::slice::from_ref(&trade), &keep_all).await.unwrap();
        let stored = store.latest_candles(&trade.token, Granularity::M1, 0, 1).await.unwrap();
        let candle = &stored[0].1;
        let expected = trade.price();
        for value in [candle.open, candle.high, candle.low, candle.close] {
            assert_eq!(
                value.to_bits(),
                expected.to_bits(),
                "{token} for {usd}: {value} vs {expected}"
            );
        }
        // History (packed points) gives the same bits, price included.
        let start = trade.order.at_micros / 1_000_000;
        let ranges = [(trade.token.clone(), start)];
        let points = store.history_many(&ranges, Granularity::M1, start + 60, 10).await.unwrap();
        let point = points[0].1;
        for value in [point.price, point.open, point.high, point.close, point.low] {
            assert_eq!(value.to_bits(), expected.to_bits(), "history of {token} for {usd}");
        }
    }
}

async fn many_series_read_at_once_equal_each_read_alone(store: Arc<dyn PriceStore>) {
    // Enough series for a read split over two connections; some without points.
    let mut trades = Vec::new();
    let mut ranges = Vec::new();
    for n in 0..21_i64 {
        let token = TokenRef::new("base", &format!("0x{n:040x}"));
        for m in 0..n % 4 {
            let mut trade =
                trade(m * 60 + n, n as u64, &format!("{}", m + 1), &format!("{}.25", n + 3), None);
            trade.token = token.clone();
            trades.push(trade);
        }
        ranges.push((token, T0 + (n % 2) * 60));
    }
    store.apply_trades(&trades, &keep_all).await.unwrap();
    let mut alone = Vec::new();
    for (index, (token, from)) in ranges.iter().enumerate() {
        let points = store.history(token, Granularity::M1, *from, T0 + 600, 100).await.unwrap();
        alone.extend(points.into_iter().map(|point| (index, point)));
    }
    assert!(alone.len() > 10);
    let many = store.history_many(&ranges, Granularity::M1, T0 + 600, 1000).await.unwrap();
    assert_eq!(many, alone);
    let cut = store.history_many(&ranges, Granularity::M1, T0 + 600, 7).await.unwrap();
    assert_eq!(cut[..], alone[..7]);
}

async fn points_since_reads_every_token_traded_since(store: Arc<dyn PriceStore>) {
    // More tokens than one load statement reads (2,000), one of them with three windows.
    let mut trades = Vec::new();
    for n in 0..2_001_u64 {
        let mut t = trade(60 + (n % 7) as i64, n, "1", &format!("{}", n + 1), None);
        t.token = TokenRef::new("base", &format!("0x{n:040x}"));
        trades.push(t);
    }
    for m in [2, 3] {
        let mut t = trade(m * 60, 9_000 + m as u64, "2", "5", None);
        t.token = TokenRef::new("base", &format!("0x{:040x}", 1_999));
        trades.push(t);
    }
    // Traded before `from` only: not loaded.
    let mut old = trade(0, 1, "1", "1", None);
    old.token = TokenRef::new("base", "0x00000000000000000000000000000000000000ff");
    trades.push(old);
    store.apply_trades(&trades, &keep_all).await.unwrap();
    let loaded = store.points_since(Granularity::M1, T0 + 60).await.unwrap();
    assert_eq!(loaded.len(), 2_001 + 2);
    let mut by_token: std::collections::HashMap<TokenRef, Vec<PricePoint>> = Default::default();
    for (token, point) in loaded {
        by_token.entry(token).or_default().push(point);
    }
    assert_eq!(by_token.len(), 2_001);
    // In no promised order: sorted, each token's points are its history.
    for (token, points) in &mut by_token {
        points.sort_by_key(|point| point.start);
        let history = store.history(token, Granularity::M1, T0 + 60, i64::MAX, 100).await.unwrap();
        assert_eq!(*points, history, "{token:?}");
    }
    let busy = &by_token[&TokenRef::new("base", &format!("0x{:040x}", 1_999))];
    assert_eq!(busy.iter().map(|p| p.start).collect::<Vec<_>>(), vec![T0 + 60, T0 + 120, T0 + 180]);
}

/// Candle rows written before migration 8 (no packed point) are read from their columns,
/// then filled by [`SqliteStore::fill_history_points`] / [`PgStore::fill_history_points`],
/// with the same answers before and after.
async fn older_rows_are_read_then_filled(
    store: Arc<dyn PriceStore>,
    clear: impl std::future::Future<Output = ()>,
    fill: impl std::future::Future<Output = u64>,
) {
    let mut trades: Vec<Trade> = (0..5)
        .map(|m| trade(m * 60 + m, 0, &format!("{}.5", m + 1), &format!("{}", 7 * m + 3), None))
        .collect();
    let mut other = trade(30, 7, "3", "1", None);
    other.token = TokenRef::new("base", "0x00000000000000000000000000000000000000aa");
    trades.push(other.clone());
    store.apply_trades(&trades, &keep_all).await.unwrap();
    let ranges = vec![(other.token.clone(), T0), (usdc(), T0 + 60)];
    let read = |limit| store.history_many(&ranges, Granularity::M1, T0 + 600, limit);
    let (all, cut) = (read(100).await.unwrap(), read(3).await.unwrap());
    assert_eq!(all.len(), 5);
    assert_eq!(cut[..], all[..3]);
    let loaded = store.points_since(Granularity::M1, T0).await.unwrap();
    assert_eq!(loaded.len(), 6);
    clear.await;
    assert_eq!(read(100).await.unwrap(), all);
    assert_eq!(read(3).await.unwrap(), cut);
    let mut again = store.points_since(Granularity::M1, T0).await.unwrap();
    let key = |(token, point): &(TokenRef, PricePoint)| (token.clone(), point.start);
    let mut loaded = loaded;
    loaded.sort_by_key(key);
    again.sort_by_key(key);
    assert_eq!(again, loaded);
    // Windows: 6 at 15s and at 1m, then one per token at 5m, 1h and 1d.
    assert_eq!(fill.await, 6 + 6 + 2 + 2 + 2);
    assert_eq!(read(100).await.unwrap(), all);
    assert_eq!(read(3).await.unwrap(), cut);
}

/// The store's one-time steps after a migration, and several stores on one database.
mod filling {
    use std::str::FromStr;

    use sluice_store::{PgStore, SqliteStore};

    use super::*;

    #[tokio::test]
    async fn older_rows_are_read_then_filled_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store = SqliteStore::open(&url).await.unwrap();
        let raw = sqlx::SqlitePool::connect(&url).await.unwrap();
        let clear = async {
            sqlx::query("UPDATE price_candles SET point = NULL").execute(&raw).await.unwrap();
        };
        let filler = store.clone();
        let fill = async move { filler.fill_history_points().await.unwrap() };
        older_rows_are_read_then_filled(Arc::new(store), clear, fill).await;
    }

    #[tokio::test]
    async fn older_rows_are_read_then_filled_on_postgres() {
        let (options, raw) = fresh_schema().await;
        let store = PgStore::open_with(options).await.unwrap();
        let clear = async {
            sqlx::query("UPDATE price_candles SET point = NULL").execute(&raw).await.unwrap();
        };
        let filler = store.clone();
        let fill = async move { filler.fill_history_points().await.unwrap() };
        older_rows_are_read_then_filled(Arc::new(store), clear, fill).await;
    }

    /// Ids counted by another store on the same database (another process) are duplicates
    /// here too, also for an hour this store had read before they were written.
    async fn ids_counted_elsewhere_are_duplicates(
        a: Arc<dyn PriceStore>,
        b: Arc<dyn PriceStore>,
        c: Arc<dyn PriceStore>,
    ) {
        // b reads the hour of T0 (and counts one trade of it).
        let first = b.apply_trades(&[trade(1, 0, "1", "1", None)], &keep_all).await.unwrap();
        assert_eq!(first.counted.len(), 1);
        let elsewhere = trade(2, 0, "1", "2", None);
        assert_eq!(
            a.apply_trades(std::slice::from_ref(&elsewhere), &keep_all)
                .await
                .unwrap()
                .counted
                .len(),
            1
        );
        let mixed = b
            .apply_trades(
                &[elsewhere, trade(3, 0, "1", "3", None), trade(1, 0, "1", "1", None)],
                &keep_all,
            )
            .await
            .unwrap();
        assert_eq!((mixed.counted.len(), mixed.duplicates), (1, 2));
        let candle = b.latest_candles(&usdc(), Granularity::M1, 0, 1).await.unwrap();
        assert_eq!(candle[0].1.trade_count, 3);
        // b wrote two blocks of T0's hour, a one: compacted only once the hour has ended,
        // then one row.
        assert_eq!(b.compact_trade_ids(T0 + 3599).await.unwrap(), 0);
        assert_eq!(b.compact_trade_ids(T0 + 3600).await.unwrap(), 2);
        assert_eq!(b.compact_trade_ids(T0 + 3600).await.unwrap(), 0);
        // A store reading the hour afresh finds all three trades.
        let replay: Vec<Trade> = (1..4).map(|s| trade(s, 0, "1", &s.to_string(), None)).collect();
        let replayed = c.apply_trades(&replay, &keep_all).await.unwrap();
        assert_eq!((replayed.counted.len(), replayed.duplicates), (0, 3));
        let later = a.apply_trades(&[trade(4, 0, "1", "1", None)], &keep_all).await.unwrap();
        assert_eq!(later.counted.len(), 1);
    }

    /// Ids stored a row per trade (before migration 9) are moved into blocks: the trades
    /// stay duplicates, and the old table is gone.
    async fn ids_stored_a_row_per_trade_are_moved(
        store: Arc<dyn PriceStore>,
        make_old_rows: impl std::future::Future<Output = ()>,
        mv: impl std::future::Future<Output = u64>,
    ) {
        make_old_rows.await;
        assert_eq!(mv.await, 3);
        let again: Vec<Trade> = (0..3).map(|n| trade(n * 4000, n as u64, "1", "1", None)).collect();
        let applied = store.apply_trades(&again, &keep_all).await.unwrap();
        assert_eq!((applied.counted.len(), applied.duplicates), (0, 3));
        let other = store.apply_trades(&[trade(0, 9, "1", "1", None)], &keep_all).await.unwrap();
        assert_eq!(other.counted.len(), 1);
    }

    /// The old table as migration 7 made it (in place of the empty one `open` leaves for
    /// `open_prices` to move), holding the ids of three trades in three hours; one script both
    /// backends run.
    fn old_ids_script() -> String {
        let rows: Vec<String> = (0..3)
            .map(|n: i64| {
                let t = trade(n * 4000, n as u64, "1", "1", None);
                let time = t.order.at_micros / 1_000_000;
                format!("({time}, '{}', '{}', {n})", t.token.chain, t.order.transaction_hash)
            })
            .collect();
        format!(
            "DROP TABLE IF EXISTS price_trade_ids; \
             CREATE TABLE price_trade_ids (block_time BIGINT NOT NULL, chain TEXT NOT NULL, \
             transaction_hash TEXT NOT NULL, log_index BIGINT NOT NULL, \
             PRIMARY KEY (block_time, chain, transaction_hash, log_index)); \
             INSERT INTO price_trade_ids VALUES {};",
            rows.join(", ")
        )
    }

    #[tokio::test]
    async fn ids_counted_elsewhere_are_duplicates_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let a = sluice_store::open_prices(&url).await.unwrap();
        let b = sluice_store::open_prices(&url).await.unwrap();
        let c = sluice_store::open_prices(&url).await.unwrap();
        ids_counted_elsewhere_are_duplicates(a, b, c).await;
    }

    #[tokio::test]
    async fn ids_counted_elsewhere_are_duplicates_on_postgres() {
        let (options, _) = fresh_schema().await;
        let a = PgStore::open_with(options.clone()).await.unwrap();
        let b = PgStore::open_with(options.clone()).await.unwrap();
        let c = PgStore::open_with(options).await.unwrap();
        ids_counted_elsewhere_are_duplicates(Arc::new(a), Arc::new(b), Arc::new(c)).await;
    }

    #[tokio::test]
    async fn ids_stored_a_row_per_trade_are_moved_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store = SqliteStore::open(&url).await.unwrap();
        let raw = sqlx::SqlitePool::connect(&url).await.unwrap();
        let make = async {
            sqlx::raw_sql(&old_ids_script()).execute(&raw).await.unwrap();
        };
        let mover = store.clone();
        let mv = async move { mover.move_trade_ids().await.unwrap() };
        ids_stored_a_row_per_trade_are_moved(Arc::new(store.clone()), make, mv).await;
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name = 'price_trade_ids'")
                .fetch_one(&raw)
                .await
                .unwrap();
        assert_eq!(left, 0);
        assert_eq!(store.move_trade_ids().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn ids_stored_a_row_per_trade_are_moved_on_postgres() {
        let (options, raw) = fresh_schema().await;
        let store = PgStore::open_with(options).await.unwrap();
        let make = async {
            sqlx::raw_sql(&old_ids_script()).execute(&raw).await.unwrap();
        };
        let mover = store.clone();
        let mv = async move { mover.move_trade_ids().await.unwrap() };
        ids_stored_a_row_per_trade_are_moved(Arc::new(store.clone()), make, mv).await;
        let left: bool = sqlx::query_scalar("SELECT to_regclass('price_trade_ids') IS NULL")
            .fetch_one(&raw)
            .await
            .unwrap();
        assert!(left);
        assert_eq!(store.move_trade_ids().await.unwrap(), 0);
    }

    /// A statement run on the database behind the store's back (a count for a `SELECT`).
    type Sql = std::pin::Pin<Box<dyn std::future::Future<Output = i64> + Send>>;

    /// The data steps of the migration list (migrations 10 and 11) run when a store opens a
    /// database that has not had them: ids stored a row per trade are moved into blocks and
    /// candle rows get their packed point, before the store answers.
    async fn data_steps_run_when_a_store_opens<S, F>(
        open: impl Fn() -> F,
        run: impl Fn(&str) -> Sql,
    ) where
        S: PriceStore,
        F: std::future::Future<Output = S>,
    {
        let first = open().await;
        let counted: Vec<Trade> = (0..2).map(|n| trade(n * 60, 9, "1", "1", None)).collect();
        first.apply_trades(&counted, &keep_all).await.unwrap();
        drop(first);
        // As an older version left the database: the old id table, rows without a point, and
        // neither data step recorded.
        run(&old_ids_script()).await;
        run("UPDATE price_candles SET point = NULL").await;
        run("DELETE FROM sluice_schema_migrations WHERE version IN (10, 11)").await;
        let store = open().await;
        assert_eq!(run("SELECT count(*) FROM price_candles WHERE point IS NULL").await, 0);
        assert_eq!(
            run("SELECT count(*) FROM sluice_schema_migrations WHERE version IN (10, 11)").await,
            2
        );
        let again: Vec<Trade> = (0..3).map(|n| trade(n * 4000, n as u64, "1", "1", None)).collect();
        let applied = store.apply_trades(&again, &keep_all).await.unwrap();
        assert_eq!((applied.counted.len(), applied.duplicates), (0, 3));
    }

    #[tokio::test]
    async fn data_steps_run_when_a_store_opens_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let raw = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc")).await.unwrap();
        let run = |sql: &str| -> Sql {
            let (raw, sql) = (raw.clone(), sql.to_owned());
            Box::pin(async move {
                if sql.starts_with("SELECT") {
                    sqlx::query_scalar(&sql).fetch_one(&raw).await.unwrap()
                } else {
                    sqlx::raw_sql(&sql).execute(&raw).await.unwrap();
                    0
                }
            })
        };
        data_steps_run_when_a_store_opens(|| async { SqliteStore::open(&url).await.unwrap() }, run)
            .await;
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name = 'price_trade_ids'")
                .fetch_one(&raw)
                .await
                .unwrap();
        assert_eq!(left, 0);
    }

    #[tokio::test]
    async fn data_steps_run_when_a_store_opens_on_postgres() {
        let (options, raw) = fresh_schema().await;
        let run = |sql: &str| -> Sql {
            let (raw, sql) = (raw.clone(), sql.to_owned());
            Box::pin(async move {
                if sql.starts_with("SELECT") {
                    sqlx::query_scalar(&sql).fetch_one(&raw).await.unwrap()
                } else {
                    sqlx::raw_sql(&sql).execute(&raw).await.unwrap();
                    0
                }
            })
        };
        let open = || {
            let options = options.clone();
            async move { PgStore::open_with(options).await.unwrap() }
        };
        data_steps_run_when_a_store_opens(open, run).await;
        let left: bool = sqlx::query_scalar("SELECT to_regclass('price_trade_ids') IS NULL")
            .fetch_one(&raw)
            .await
            .unwrap();
        assert!(left);
    }

    /// Connection options of a new schema in the test database, and a pool on it.
    async fn fresh_schema() -> (sqlx::postgres::PgConnectOptions, sqlx::PgPool) {
        let url = std::env::var("SLUICE_TEST_POSTGRES_URL")
            .expect("SLUICE_TEST_POSTGRES_URL must name a PostgreSQL database; run scripts/test");
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        let admin = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await.unwrap();
        let options = sqlx::postgres::PgConnectOptions::from_str(&url)
            .unwrap()
            .options([("search_path", &schema)]);
        let raw = sqlx::PgPool::connect_with(options.clone()).await.unwrap();
        (options, raw)
    }
}
