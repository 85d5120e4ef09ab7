//! Ingest throughput of the price service on one core.
//!
//! ```sh
//! cargo run --release -p sluice-prices --example ingest_bench -- [trades] [database url] [seed]
//! ```
//!
//! Generates `trades` (default 1,000,000) realistic Base `dex_trade` records with
//! `sluice-feed` (from `seed`, default the clock's seconds, so that a rerun on the same
//! database counts new trades), then times, on one thread: reading the records into trades
//! (the consumer's parse step) and folding them into candles of all five granularities in
//! batches of the consumer's size. With a database URL it also times counting them durably
//! into that store through `PriceService::ingest` (dedup, merge, write), batch by batch.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::Instant;

use chrono::{Duration, Utc};
use sluice_core::clock::SystemClock;
use sluice_core::prices::aggregate;
use sluice_prices::trade::parse_dex_trade;
use sluice_prices::{ConsumerSettings, PriceService, PriceSettings};

/// Time this thread has been on a CPU (Linux `/proc/thread-self/schedstat`), so the figure
/// per CPU-second can be told apart from waiting for a core on a loaded machine.
fn cpu_time() -> Option<std::time::Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(std::time::Duration::from_nanos(nanos))
}

/// The allocator the `sluice` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// CPU time of every thread of this process so far, in seconds (Linux `/proc/self/stat`,
/// clock ticks of 10 ms).
fn process_cpu_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses): utime and stime are the 12th
    // and 13th.
    let rest = &text[text.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: f64 = fields.next()?.parse().ok()?;
    let system: f64 = fields.next()?.parse().ok()?;
    Some((user + system) / 100.0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let count: usize = args.next().map_or(1_000_000, |n| n.parse().expect("trades is a number"));
    let url = args.next();
    let seed: u64 = args.next().map_or_else(
        || Utc::now().timestamp() as u64,
        |seed| seed.parse().expect("seed is a number"),
    );
    let batch_size = ConsumerSettings::default().batch_size;

    let mut generator = sluice_feed::Generator::new("base", "dex_trade", seed).unwrap();
    let start = Utc::now() - Duration::hours(6);
    let lines: Vec<Vec<u8>> = (0..count)
        .map(|i| {
            // Spread over six hours, as a busy chain's trades would be.
            let now = start + Duration::milliseconds((i as i64) * 21_600_000 / count as i64);
            serde_json::to_vec(&generator.next_record(now)).unwrap()
        })
        .collect();
    let bytes: usize = lines.iter().map(Vec::len).sum();
    println!(
        "{count} records (seed {seed}), {:.0} bytes each on average; batches of {batch_size}",
        bytes as f64 / count as f64
    );

    let cpu_began = cpu_time();
    let began = Instant::now();
    let trades: Vec<_> = lines.iter().map(|line| parse_dex_trade("base", line).unwrap()).collect();
    let parsed = began.elapsed();
    let mut candles = 0;
    for batch in trades.chunks(batch_size) {
        candles += aggregate(batch).len();
    }
    let total = began.elapsed();
    let cpu = cpu_time().zip(cpu_began).map(|(end, start)| end - start);
    let rate = |d: std::time::Duration| count as f64 / d.as_secs_f64();
    println!(
        "parse {:.0} trades/s; parse + candles {:.0} trades/s ({:.2} s, {candles} candle updates)",
        rate(parsed),
        rate(total),
        total.as_secs_f64()
    );
    if let Some(cpu) = cpu {
        println!(
            "parse + candles per CPU-second: {:.0} trades/s ({:.2} s on a CPU)",
            rate(cpu),
            cpu.as_secs_f64()
        );
    }

    if let Some(url) = url {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let store = sluice_store::open_prices(&url).await.unwrap();
            let service =
                PriceService::start(store, Arc::new(SystemClock), PriceSettings::default())
                    .await
                    .unwrap();
            // Owned batches, as the consumer parses them (not cloned while timed).
            let mut batches: Vec<Vec<_>> = Vec::new();
            let mut rest = trades.into_iter().peekable();
            while rest.peek().is_some() {
                batches.push(rest.by_ref().take(batch_size).collect());
            }
            println!("counting durably ({} batches)", batches.len());
            let process_began = process_cpu_seconds();
            let began = Instant::now();
            let mut counted = 0;
            for batch in batches {
                counted += service.ingest(batch).await.unwrap().counted;
            }
            let elapsed = began.elapsed();
            println!(
                "durable into {url}: {counted} trades in {:.2} s, {:.0} trades/s",
                elapsed.as_secs_f64(),
                counted as f64 / elapsed.as_secs_f64()
            );
            if let Some(cpu) =
                process_cpu_seconds().zip(process_began).map(|(end, start)| end - start)
            {
                // All threads of this process (SQLite's statements run on the driver's
                // worker thread; a PostgreSQL server's work is not in it).
                println!(
                    "durable, CPU of this process: {cpu:.2} s ({:.0} trades per CPU-second)",
                    counted as f64 / cpu
                );
            }
        });
    }
}
