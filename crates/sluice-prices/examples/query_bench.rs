//! Latest-price and history latency with 10,000 tokens and 30 days of trades loaded.
//!
//! ```sh
//! cargo run --release -p sluice-prices --example query_bench -- <database url> [tokens] [days]
//! ```
//!
//! Loads, straight through `PriceService::ingest` (batches of the consumer's size, in time order, as the
//! consumer would): every one of `tokens` (default 10,000) trading every 12 hours for `days`
//! (default 30), and the first 200 tokens trading every minute over the last day. Then
//! starts a fresh service over the same database (loading the in-memory latest minutes) and
//! times the query functions the endpoints call, without HTTP:
//! - latest price of the 200 busy tokens (2,000 calls);
//! - history of 50 busy tokens × the last day at 1m (72,000 points, one page; 100 calls),
//!   answered from the recent candles in memory, and the same read from the store only.
//!
//! With `--reuse` as a fourth argument the load is skipped (the database already holds it
//! from an earlier run; the history range is then the last day before now).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use sluice_core::clock::SystemClock;
use sluice_core::prices::{Amount, Granularity, TokenRef, Trade, TradeOrder};
use sluice_prices::{ConsumerSettings, HistoryQuery, PriceService, PriceSettings};

/// The allocator the `sluice` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort_unstable();
    let index = ((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1;
    samples[index].as_secs_f64() * 1000.0
}

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: query_bench <database url> [tokens] [days]");
    let tokens: usize = args.next().map_or(10_000, |n| n.parse().unwrap());
    let days: i64 = args.next().map_or(30, |n| n.parse().unwrap());
    let reuse = args.next().is_some_and(|a| a == "--reuse");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(run(url, tokens, days, reuse));
}

#[allow(
    clippy::too_many_lines,
    reason = "a benchmark run told step by step, each step timed in place and reported together"
)]
async fn run(url: String, token_count: usize, days: i64, reuse: bool) {
    let addresses: Vec<TokenRef> =
        (0..token_count).map(|i| TokenRef::new("base", &format!("0x{i:040x}"))).collect();
    let now = Utc::now().timestamp();
    let mut trades: Vec<Trade> = Vec::new();
    let mut n = 0u64;
    let mut push = |token: &TokenRef, at: i64, trades: &mut Vec<Trade>| {
        n += 1;
        let price = 1.0 + (n % 1000) as f64 / 1000.0;
        let amount = Amount::parse(&format!("{}", 10 + n % 90)).unwrap();
        let usd = Amount::parse(&format!("{:.6}", price * (10 + n % 90) as f64)).unwrap();
        trades.push(Trade {
            token: token.clone(),
            decimals: 18,
            token_amount: amount,
            usd_amount: usd,
            // Each token trades in three pools.
            pool: Some((format!("{}-{}", token.address, n % 3), Amount::parse("1000000").unwrap())),
            order: TradeOrder {
                at_micros: at * 1_000_000,
                block_number: at as u64 / 2,
                log_index: n % 300,
                transaction_hash: format!("0x{n:064x}"),
            },
        });
    };
    for (index, token) in addresses.iter().enumerate() {
        // Every 12 hours, staggered across tokens.
        let mut at = now - days * 86_400 + (index as i64 * 7) % 43_200;
        while at < now {
            push(token, at, &mut trades);
            at += 43_200;
        }
    }
    for token in addresses.iter().take(200) {
        for minute in 0..1440 {
            push(token, now - 86_400 + minute * 60 + 7, &mut trades);
        }
    }
    trades.sort_by_key(|t| t.order.at_micros);
    println!("{} tokens, {} trades over {days} days", token_count, trades.len());

    let began = Instant::now();
    let store = sluice_store::open_prices(&url).await.unwrap();
    // Includes migrating and filling the packed history points of older rows, once.
    println!("store opened in {:.2} s", began.elapsed().as_secs_f64());
    let clock = Arc::new(SystemClock);
    if !reuse {
        let loader = PriceService::start(store.clone(), clock.clone(), PriceSettings::default())
            .await
            .unwrap();
        let began = Instant::now();
        for batch in trades.chunks(ConsumerSettings::default().batch_size) {
            loader.ingest(batch.to_vec()).await.unwrap();
        }
        let load = began.elapsed();
        println!(
            "loaded in {:.1} s ({:.0} trades/s, durable, through the store)",
            load.as_secs_f64(),
            trades.len() as f64 / load.as_secs_f64()
        );
    }
    drop(trades);

    let began = Instant::now();
    let service = PriceService::start(store, clock, PriceSettings::default()).await.unwrap();
    println!("fresh service loaded its memory in {:.2} s", began.elapsed().as_secs_f64());
    let (points, bytes) = service.recent_footprint();
    println!(
        "recent candles in memory: {points} points, {:.1} MiB, {:.1} bytes per point",
        bytes as f64 / 1_048_576.0,
        bytes as f64 / points.max(1) as f64
    );

    let busy: Vec<TokenRef> = addresses.iter().take(200).cloned().collect();
    let mut samples = Vec::new();
    for _ in 0..2_000 {
        let began = Instant::now();
        let items = service.latest(&busy, true);
        samples.push(began.elapsed());
        assert_eq!(items.len(), 200);
    }
    println!(
        "latest, 200 tokens: p50 {:.3} ms, p99 {:.3} ms",
        percentile(&mut samples, 0.5),
        percentile(&mut samples, 0.99)
    );

    let query = HistoryQuery {
        tokens: busy[..50].to_vec(),
        granularity: Granularity::M1,
        start: (now - 86_400) * 1_000_000,
        end: now * 1_000_000,
    };
    let memory = service.history(&query, None).await.unwrap();
    assert_eq!(memory, service.history_from_store(&query, None).await.unwrap());
    for from_memory in [true, false] {
        let mut samples = Vec::new();
        let mut points = 0;
        for _ in 0..100 {
            let began = Instant::now();
            let page = if from_memory {
                service.history(&query, None).await.unwrap()
            } else {
                service.history_from_store(&query, None).await.unwrap()
            };
            samples.push(began.elapsed());
            assert!(page.cursor.is_none());
            points = page.series.iter().map(|s| s.points.len()).sum::<usize>();
        }
        println!(
            "history{}, 50 tokens x 1 day at 1m ({points} points): p50 {:.2} ms, p99 {:.2} ms",
            if from_memory { "" } else { " from the store" },
            percentile(&mut samples, 0.5),
            percentile(&mut samples, 0.99)
        );
    }
}
