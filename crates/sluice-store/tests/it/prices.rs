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
    assert_eq!(first.new_trades.len(), 2);
    assert_eq!(first.duplicates, 0);
    let again = store
        .apply_trades(&[trade(5, 1, "50", "100", None), trade(5, 1, "50", "100", None)], &keep_all)
        .await
        .unwrap();
    assert_eq!((again.new_trades.len(), again.duplicates), (0, 2));
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
    assert_eq!(mixed.new_trades, vec![trade(90, 1, "1", "1", None)]);
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
    // Five minute windows and the ids of trades before T0 + 200 (three of them).
    assert_eq!(removed, 5 + 3);
    let left = store.history(&usdc(), Granularity::M1, T0, T0 + 600, 100).await.unwrap();
    assert_eq!(left.first().unwrap().start, T0 + 300);
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
    // Every token's points from a window start on, oldest first, as history gives them.
    let since = store.points_since(Granularity::M1, T0 + 60).await.unwrap();
    assert_eq!(since.len(), 4);
    assert!(since.iter().all(|(token, _)| *token == usdc()));
    let history = store.history(&usdc(), Granularity::M1, T0 + 60, i64::MAX, 100).await.unwrap();
    assert_eq!(since.into_iter().map(|(_, p)| p).collect::<Vec<PricePoint>>(), history);
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
    clear.await;
    assert_eq!(read(100).await.unwrap(), all);
    assert_eq!(read(3).await.unwrap(), cut);
    // Windows: 6 at 15s and at 1m, then one per token at 5m, 1h and 1d.
    assert_eq!(fill.await, 6 + 6 + 2 + 2 + 2);
    assert_eq!(read(100).await.unwrap(), all);
    assert_eq!(read(3).await.unwrap(), cut);
}

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
        let url = std::env::var("SLUICE_TEST_POSTGRES_URL")
            .expect("SLUICE_TEST_POSTGRES_URL must name a PostgreSQL database; run scripts/test");
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        let admin = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await.unwrap();
        let options = sqlx::postgres::PgConnectOptions::from_str(&url)
            .unwrap()
            .options([("search_path", &schema)]);
        let store = PgStore::open_with(options.clone()).await.unwrap();
        let raw = sqlx::PgPool::connect_with(options).await.unwrap();
        let clear = async {
            sqlx::query("UPDATE price_candles SET point = NULL").execute(&raw).await.unwrap();
        };
        let filler = store.clone();
        let fill = async move { filler.fill_history_points().await.unwrap() };
        older_rows_are_read_then_filled(Arc::new(store), clear, fill).await;
    }
}
