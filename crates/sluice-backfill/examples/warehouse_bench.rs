//! The warehouse benchmark: archive, stage and transport on one core's worth of work.
//!
//! `cargo run --release -p sluice-backfill --example warehouse_bench -- [--rows N]
//! [--dir DIR] [--window-hours H] [--chunk-rows R] [--reuse true]` (defaults: 10,000,000
//! rows, a temporary directory, a 48-hour window of the 10-day table, 100,000 rows per chunk;
//! `--reuse true` keeps the table a previous run left in `--dir` and skips the append;
//! `--archive-rows N` runs phase 0 first).
//!
//! 0. **archive** (with `--archive-rows N`): N records of the same shape in the chain stream
//!    of an embedded log (8 partitions), then the archiver's drain of them into a new
//!    warehouse, timed end to end (log reads, each record's block time, appends).
//! 1. **append**: N `erc20_token_transfer` records (about 600 bytes of JSON each, one every
//!    86 ms over 10 days, 20 tokens) go into `base.assets.erc20_token_transfers` in appends of
//!    500,000 rows — what the archiver does after reading the stream (the JSON parse for the
//!    typed columns, the day split and sort, parquet encoding, fsync, the manifest commit).
//! 2. **stage**: the export of a window with `token_address IN (3 tokens)` into chunks — what a
//!    job's staging does. The same query for DuckDB is printed (and written to
//!    `<dir>/duckdb.sql`) to run side by side: `scripts/bench/warehouse-duckdb <dir>`.
//! 3. **transport**: the chunks appended to a topic of the embedded log (a managed
//!    destination), in chunk order.
//!
//! Prints one JSON line per phase, then the same for people.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use sluice_backfill::archiver::{Archiver, ArchiverSettings};
use sluice_backfill::staging::{chunk_path, read_chunk, stage};
use sluice_backfill::storage::LocalStorage;
use sluice_backfill::tables;
use sluice_backfill::warehouse::{Query, Row, Warehouse};
use sluice_bus::{EmbeddedLog, NewRecord, Retention, StreamLog, TopicConfig};
use sluice_core::catalog::Catalog;
use sluice_core::clock::SystemClock;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The allocator the `sluice` binary runs with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const START_US: i64 = 1_767_225_600_000_000; // 2026-01-01T00:00:00Z
const SPAN_US: i64 = 10 * 86_400_000_000;
const APPEND_ROWS: usize = 500_000;
const TOKENS: usize = 20;

fn token(i: usize) -> String {
    format!("0x{:040x}", 0xa0b0_c0d0_u64 + i as u64)
}

/// Transfer `n` of the generated table: about 600 bytes of JSON, one every `step_us`.
fn transfer(n: usize, step_us: i64) -> Row {
    let time_us = START_US + n as i64 * step_us;
    let at = chrono::DateTime::from_timestamp_micros(time_us).expect("in range");
    let record = serde_json::json!({
        "amount": 1234.5678, "amount_str": "1234.567800", "block_hash": format!("0x{:064x}", n / 7),
        "block_number": 30_000_000 + n / 7, "block_timestamp": sluice_core::time::format(at),
        "from_address": format!("0x{:040x}", n * 31), "log_index": n % 7,
        "to_address": format!("0x{:040x}", n * 17), "token_address": token(n % TOKENS),
        "token_decimals": 6, "token_name": "USD Coin", "token_symbol": "USDC",
        "transaction_hash": format!("0x{n:064x}"), "transaction_index": n % 150,
        "value": "1234567800",
    })
    .to_string();
    Row { key: format!("0x{n:064x}:{}", n % 7), time_us, record }
}

/// Phase 0: `rows` transfers in the chain stream of an embedded log (not timed), then the
/// archiver's drain of them into a new warehouse (timed): log reads, the block time of each
/// record, appends.
async fn archive(dir: &std::path::Path, rows: usize) -> Result<(), BoxError> {
    let table = tables::table(&Catalog::default(), "base.assets.erc20_token_transfers")
        .ok_or("no table")?;
    let log: Arc<dyn StreamLog> =
        Arc::new(EmbeddedLog::open(&dir.join("archive-log.redb"), Arc::new(SystemClock))?);
    let config = TopicConfig { partitions: 8, retention: Retention::default() };
    log.create_topic(&table.stream(), config).await?;
    let step_us = SPAN_US / rows.max(1) as i64;
    for from in (0..rows).step_by(APPEND_ROWS) {
        let records = (from..(from + APPEND_ROWS).min(rows))
            .map(|n| {
                let row = transfer(n, step_us);
                NewRecord::new(row.key.into_bytes(), row.record.into_bytes())
            })
            .collect();
        log.append(&table.stream(), records).await?;
    }
    let warehouse = Warehouse::open(&dir.join("archive-warehouse"))?;
    let archiver = Archiver::new(warehouse, log, vec![table], ArchiverSettings::default());
    // A profiling aid, as in pipeline_bench: say when the drain starts, with the process id.
    if let Some(pause) =
        std::env::var("WAREHOUSE_BENCH_PAUSE_BEFORE_DRAIN").ok().and_then(|s| s.parse::<f64>().ok())
    {
        eprintln!("drain starts in {pause} s (pid {})", std::process::id());
        tokio::time::sleep(std::time::Duration::from_secs_f64(pause)).await;
    }
    let (wall, cpu) = (Instant::now(), process_cpu_secs());
    let archived = archiver.drain().await?;
    let secs = wall.elapsed().as_secs_f64();
    let cpu = process_cpu_secs() - cpu;
    println!(
        "{}",
        serde_json::json!({"bench": "warehouse_archive", "rows": archived, "secs": secs,
            "rows_per_sec": (archived as f64 / secs).round(), "process_cpu_secs": cpu})
    );
    eprintln!(
        "archive (log → warehouse): {archived} rows in {secs:.2} s ({cpu:.2} CPU-s): {:.0} rows/s",
        archived as f64 / secs
    );
    Ok(())
}

fn process_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

#[tokio::main]
#[allow(
    clippy::too_many_lines,
    reason = "a benchmark run told step by step, each step timed in place and reported together"
)]
async fn main() -> Result<(), BoxError> {
    let mut rows: usize = 10_000_000;
    let mut dir_arg: Option<std::path::PathBuf> = None;
    let mut window_hours: i64 = 48;
    let mut chunk_rows: usize = 100_000;
    let mut reuse = false;
    let mut archive_rows: usize = 0;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rows" => rows = value.parse()?,
            "--dir" => dir_arg = Some(value.into()),
            "--window-hours" => window_hours = value.parse()?,
            "--chunk-rows" => chunk_rows = value.parse()?,
            "--reuse" => reuse = value == "true",
            "--archive-rows" => archive_rows = value.parse()?,
            _ => return Err(format!("unknown argument {flag}").into()),
        }
    }
    let temp = tempfile::tempdir()?;
    let dir = dir_arg.unwrap_or_else(|| temp.path().to_owned());
    if archive_rows > 0 {
        std::fs::create_dir_all(&dir)?;
        archive(&dir, archive_rows).await?;
    }
    let warehouse = Warehouse::open(&dir.join("warehouse"))?;
    let table = tables::table(&Catalog::default(), "base.assets.erc20_token_transfers")
        .ok_or("no table")?;

    // 1. Append (skipped with `--reuse true` on a `--dir` that has the table already).
    if reuse && warehouse.manifest(&table.name)?.rows() > 0 {
        rows = 0;
    }
    let step_us = SPAN_US / rows.max(1) as i64;
    let mut appended = 0;
    let mut bytes = 0usize;
    let (wall, cpu) = (Instant::now(), process_cpu_secs());
    let mut build_secs = 0.0;
    while appended < rows {
        let build = Instant::now();
        let batch: Vec<Row> = (appended..(appended + APPEND_ROWS).min(rows))
            .map(|n| {
                let row = transfer(n, step_us);
                bytes += row.record.len();
                row
            })
            .collect();
        build_secs += build.elapsed().as_secs_f64();
        appended += batch.len();
        warehouse.append(&table, batch, &[(0, appended as u64)])?;
    }
    let append_wall = wall.elapsed().as_secs_f64() - build_secs;
    let append_cpu = process_cpu_secs() - cpu;
    let manifest = warehouse.manifest(&table.name)?;
    let parquet_bytes: u64 = manifest.files.iter().map(|f| f.bytes).sum();
    println!(
        "{}",
        serde_json::json!({"bench": "warehouse_append", "rows": rows, "json_bytes": bytes,
            "parquet_bytes": parquet_bytes, "files": manifest.files.len(),
            "secs": append_wall, "rows_per_sec": (rows as f64 / append_wall).round(),
            "process_cpu_secs_incl_generation": append_cpu})
    );

    // 2. Stage a window with a 3-token filter.
    let start_us = START_US + 3 * 86_400_000_000;
    let end_us = start_us + window_hours * 3_600_000_000;
    let tokens: Vec<String> = (0..3).map(token).collect();
    let query =
        Query { start_us, end_us, filter: Some(("token_address".to_owned(), tokens.clone())) };
    let staging = LocalStorage::new(&dir.join("staging"))?;
    let (wall, cpu) = (Instant::now(), process_cpu_secs());
    let staged = stage(
        &warehouse,
        &table,
        &query,
        &staging,
        "bench",
        chunk_rows,
        &AtomicBool::new(false),
        None,
    )?
    .ok_or("cancelled")?;
    let stage_secs = wall.elapsed().as_secs_f64();
    let stage_cpu = process_cpu_secs() - cpu;
    println!(
        "{}",
        serde_json::json!({"bench": "warehouse_stage", "rows_staged": staged.rows, "chunks": staged.chunks,
            "secs": stage_secs, "process_cpu_secs": stage_cpu})
    );
    let fmt = |us: i64| {
        sluice_core::time::format(chrono::DateTime::from_timestamp_micros(us).expect("in range"))
    };
    let in_list = tokens.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
    let sql = format!(
        "COPY (SELECT * FROM read_parquet('{}/warehouse/{}/*/*.parquet') \
         WHERE block_timestamp >= TIMESTAMPTZ '{}' AND block_timestamp < TIMESTAMPTZ '{}' \
         AND lower(token_address) IN ({in_list})) TO '{}/duckdb-out.parquet' (FORMAT parquet, COMPRESSION snappy);",
        dir.display(),
        table.name,
        fmt(start_us),
        fmt(end_us),
        dir.display()
    );
    std::fs::write(dir.join("duckdb.sql"), &sql)?;

    // 3. Transport the chunks to a managed destination topic.
    let clock = Arc::new(SystemClock);
    let log = EmbeddedLog::open(&dir.join("log.redb"), clock)?;
    let topic = "backfill.bench.out";
    log.create_topic(topic, TopicConfig { partitions: 1, retention: Retention::default() }).await?;
    let (wall, cpu) = (Instant::now(), process_cpu_secs());
    let mut sent = 0u64;
    for index in 0..staged.chunks {
        let rows = read_chunk(&staging, &chunk_path("bench", index))?;
        sent += rows.len() as u64;
        let records =
            rows.into_iter().map(|(k, r)| NewRecord::new(k.into_bytes(), r.into_bytes())).collect();
        log.append(topic, records).await?;
    }
    let transport_secs = wall.elapsed().as_secs_f64();
    let transport_cpu = process_cpu_secs() - cpu;
    println!(
        "{}",
        serde_json::json!({"bench": "warehouse_transport_managed", "rows": sent, "secs": transport_secs,
            "rows_per_sec": (sent as f64 / transport_secs).round(), "process_cpu_secs": transport_cpu})
    );
    eprintln!(
        "append: {rows} rows ({:.0} MB JSON → {:.0} MB parquet in {} files) in {append_wall:.2} s: {:.0} rows/s",
        bytes as f64 / 1e6,
        parquet_bytes as f64 / 1e6,
        manifest.files.len(),
        rows as f64 / append_wall
    );
    eprintln!(
        "stage: {} rows in {} chunks in {stage_secs:.2} s ({stage_cpu:.2} CPU-s)",
        staged.rows, staged.chunks
    );
    eprintln!(
        "transport (managed topic): {sent} rows in {transport_secs:.2} s: {:.0} rows/s",
        sent as f64 / transport_secs
    );
    eprintln!("DuckDB, same query and output format: {}", dir.join("duckdb.sql").display());
    drop(temp);
    Ok(())
}
