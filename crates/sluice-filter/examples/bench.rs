//! The set-filter benchmark: memory of a set of random addresses, and one core's throughput
//! filtering `erc20_token_transfer`-like records by `token_address`, with
//! `SetFilter::passes_batch` and with `SetFilter::passes`.
//!
//! `cargo run --release -p sluice-filter --example bench -- [--values N] [--records N]
//! [--seconds S]` (defaults: 10 000 000 values, 1 000 000 records, 5 seconds per mode). Prints
//! one JSON line, then the same figures for people. Linux only (reads `/proc/self/statm` and
//! `/proc/self/schedstat`). Exits 1 if a run's count of passing records is wrong.

use std::hint::black_box;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_core::filter_expr::FilterExpr;
use sluice_filter::{SetFilter, ValueSet};

/// Every this many set values, one is kept to build matching records from.
const SAMPLE_EVERY: usize = 1000;
/// Records per `passes_batch` call: a consumer's poll batch.
const BATCH: usize = 512;
/// The share of records whose token is in the set.
const HIT_RATE: f64 = 0.05;
/// `/proc/self/statm` counts pages; 4 KiB on the x86-64 and aarch64 Linux we run on.
const PAGE_BYTES: u64 = 4096;

struct Args {
    values: usize,
    records: usize,
    seconds: f64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { values: 10_000_000, records: 1_000_000, seconds: 5.0 };
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = || format!("{flag}: not a number: {value}");
        match flag.as_str() {
            "--values" => args.values = value.parse().map_err(|_| bad())?,
            "--records" => args.records = value.parse().map_err(|_| bad())?,
            "--seconds" => args.seconds = value.parse().map_err(|_| bad())?,
            _ => {
                return Err(format!("unknown argument {flag}; use --values, --records, --seconds"));
            }
        }
    }
    Ok(args)
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };

    let rss_before = rss_bytes();
    let build_start = Instant::now();
    let mut rng = SmallRng::seed_from_u64(1);
    let mut set = ValueSet::with_capacity(args.values);
    let mut sample = Vec::with_capacity(args.values / SAMPLE_EVERY + 1);
    let mut address = [0; 42];
    for i in 0..args.values {
        random_hex(&mut rng, &mut address, 20);
        let text = std::str::from_utf8(&address).expect("hex digits are ASCII");
        set.insert(text);
        if i % SAMPLE_EVERY == 0 {
            sample.push(text.to_owned());
        }
    }
    let build_secs = build_start.elapsed().as_secs_f64();
    let heap_mib = mib(set.heap_bytes() as u64);
    let rss_growth_mib = mib(rss_bytes().saturating_sub(rss_before));

    let (owned, hits) = make_records(&mut SmallRng::seed_from_u64(2), args.records, &sample);
    // One buffer, as records arrive in a fetched batch.
    let buffer = owned.concat();
    let mut rest = buffer.as_slice();
    let records: Vec<&[u8]> = owned
        .iter()
        .map(|record| {
            let (record, after) = rest.split_at(record.len());
            rest = after;
            record
        })
        .collect();
    drop(owned);
    let record_bytes = buffer.len();
    let filter = SetFilter::new(
        &FilterExpr::parse("root = this.token_address").expect("the bench expression is valid"),
    );

    let duration = Duration::from_secs_f64(args.seconds);
    let per_record = run(duration, records.len(), hits, |passed| {
        for record in &records {
            *passed += usize::from(filter.passes(black_box(record), &set));
        }
    });
    let mut answers = Vec::with_capacity(BATCH);
    let batched = run(duration, records.len(), hits, |passed| {
        for batch in records.chunks(BATCH) {
            filter.passes_batch(black_box(batch), &set, &mut answers);
            *passed += answers.iter().filter(|&&answer| answer).count();
        }
    });

    let line = serde_json::json!({
        "values": args.values,
        "build_secs": round(build_secs),
        "heap_mib": round(heap_mib),
        "rss_growth_mib": round(rss_growth_mib),
        "records": records.len(),
        "avg_record_bytes": record_bytes / records.len().max(1),
        "hit_rate": round(hits as f64 / records.len().max(1) as f64),
        "batch_records_per_sec": batched.per_sec().round(),
        "batch_records_per_cpu_sec": batched.per_cpu_sec().round(),
        "single_records_per_sec": per_record.per_sec().round(),
        "single_records_per_cpu_sec": per_record.per_cpu_sec().round(),
    });
    println!("{line}");
    println!("set of {} addresses: built in {build_secs:.2} s", args.values);
    println!("  heap_bytes: {heap_mib:.1} MiB, RSS growth: {rss_growth_mib:.1} MiB");
    println!(
        "records: {} distinct, {} bytes on average, {:.1}% pass",
        records.len(),
        record_bytes / records.len().max(1),
        100.0 * hits as f64 / records.len().max(1) as f64,
    );
    for (name, result) in [("passes_batch", &batched), ("passes", &per_record)] {
        println!(
            "  {name:>12}: {:.2} M records/s on one thread ({:.2} M per CPU-second; {} records in {:.2} s, {:.2} s on CPU)",
            result.per_sec() / 1e6,
            result.per_cpu_sec() / 1e6,
            result.processed,
            result.secs,
            result.cpu_secs,
        );
    }
}

/// Records filtered in one timed run.
struct Run {
    processed: usize,
    secs: f64,
    cpu_secs: f64,
}

impl Run {
    fn per_sec(&self) -> f64 {
        self.processed as f64 / self.secs
    }

    /// On a shared machine the thread is not always on a core; per CPU-second is what one
    /// core would do.
    fn per_cpu_sec(&self) -> f64 {
        self.processed as f64 / self.cpu_secs
    }
}

/// Runs `pass` (one pass over all records, adding how many passed) for at least `duration`,
/// and checks the count against `hits`.
fn run(duration: Duration, records: usize, hits: usize, mut pass: impl FnMut(&mut usize)) -> Run {
    let start = Instant::now();
    let cpu_start = cpu_secs();
    let mut processed = 0;
    while start.elapsed() < duration {
        let mut passed = 0;
        pass(&mut passed);
        if passed != hits {
            eprintln!("wrong result: {passed} records passed, expected {hits}");
            std::process::exit(1);
        }
        processed += records;
    }
    Run { processed, secs: start.elapsed().as_secs_f64(), cpu_secs: cpu_secs() - cpu_start }
}

/// Writes `0x` and `bytes` random bytes as lowercase hex into `out`.
fn random_hex(rng: &mut SmallRng, out: &mut [u8], bytes: usize) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out[..2].copy_from_slice(b"0x");
    for i in 0..bytes {
        let byte: u8 = rng.r#gen();
        out[2 + 2 * i] = DIGITS[usize::from(byte >> 4)];
        out[3 + 2 * i] = DIGITS[usize::from(byte & 15)];
    }
}

fn random_hex_string(rng: &mut SmallRng, bytes: usize) -> String {
    let mut out = vec![0; 2 + 2 * bytes];
    random_hex(rng, &mut out, bytes);
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// Spells an address the ways records do: lowercase, checksum-like mixed case, or upper.
fn respell(rng: &mut SmallRng, address: &str) -> String {
    match rng.gen_range(0..3) {
        0 => address.to_owned(),
        1 => address
            .char_indices()
            .map(|(i, ch)| if i > 1 && rng.gen_bool(0.5) { ch.to_ascii_uppercase() } else { ch })
            .collect(),
        _ => format!("0x{}", address[2..].to_ascii_uppercase()),
    }
}

/// `count` transfer records; returns them and how many carry a token in the set.
fn make_records(rng: &mut SmallRng, count: usize, sample: &[String]) -> (Vec<Vec<u8>>, usize) {
    const TOKENS: [(&str, &str, u32); 5] = [
        ("USDC", "USD Coin", 6),
        ("USDT", "Tether USD", 6),
        ("WETH", "Wrapped Ether", 18),
        ("DAI", "Dai Stablecoin", 18),
        ("PEPE", "Pepe", 18),
    ];
    let mut hits = 0;
    let records = (0..count)
        .map(|i| {
            let is_hit = !sample.is_empty() && rng.gen_bool(HIT_RATE);
            let token = if is_hit {
                hits += 1;
                let member = &sample[rng.gen_range(0..sample.len())];
                respell(rng, member)
            } else {
                let fresh = random_hex_string(rng, 20);
                respell(rng, &fresh)
            };
            let (symbol, name, decimals) = TOKENS[rng.gen_range(0..TOKENS.len())];
            let whole: u64 = rng.gen_range(1..1_000_000);
            let cents: u64 = rng.gen_range(0..100);
            let block = 19_000_000 + i as u64 / 150;
            format!(
                concat!(
                    r#"{{"block_number":{block},"block_timestamp":"2024-02-{day:02}T{hour:02}:{minute:02}:{second:02}Z","#,
                    r#""block_hash":"{block_hash}","transaction_hash":"{tx_hash}","log_index":{log_index},"#,
                    r#""token_address":"{token}","from_address":"{from}","to_address":"{to}","#,
                    r#""raw_amount_str":"{whole}{cents:02}{zeros}","amount_str":"{whole}.{cents:02}","#,
                    r#""token_symbol":"{symbol}","token_name":"{name}"}}"#
                ),
                block = block,
                day = 1 + block % 28,
                hour = rng.gen_range(0..24),
                minute = rng.gen_range(0..60),
                second = rng.gen_range(0..60),
                block_hash = random_hex_string(rng, 32),
                tx_hash = random_hex_string(rng, 32),
                log_index = rng.gen_range(0..400),
                token = token,
                from = random_hex_string(rng, 20),
                to = random_hex_string(rng, 20),
                whole = whole,
                cents = cents,
                zeros = "0".repeat(decimals as usize - 2),
                symbol = symbol,
                name = name,
            )
            .into_bytes()
        })
        .collect();
    (records, hits)
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages = statm.split_whitespace().nth(1).and_then(|field| field.parse::<u64>().ok());
    pages.unwrap_or(0) * PAGE_BYTES
}

/// CPU time of this (single-threaded) process's main thread, from `/proc/self/schedstat`.
fn cpu_secs() -> f64 {
    let schedstat = std::fs::read_to_string("/proc/self/schedstat").unwrap_or_default();
    let nanos = schedstat.split_whitespace().next().and_then(|field| field.parse::<u64>().ok());
    nanos.unwrap_or(0) as f64 / 1e9
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}
