//! The SQL sink benchmark: `--rows` ERC-20 transfers through a `postgres` or `mysql` sink's
//! `Sink::deliver`, in batches of `--batch` (16,000: one round of a size-S worker at full
//! load, 2,000 records from each of 8 partitions), each batch one transaction with its
//! position, then the embedded log's commit — what a worker does. It also writes the same
//! rows as a tab-separated file (`--tsv`), in the format `psql \copy` (PostgreSQL) or
//! `LOAD DATA LOCAL INFILE` (MySQL) reads, so `scripts/bench-sql-sinks` can load the very
//! same rows with the database's own bulk loader beside it.
//!
//! `cargo run --release -p sluice-runtime --example sql_sink_bench -- --url <database URL>
//! --table <name> --tsv <file> [--rows N] [--batch N] [--mode insert|upsert]`
//!
//! Prints one JSON line: `{"sink", "rows", "batches", "seconds", "rows_per_s",
//! "cpu_seconds", "convert_seconds"}`: the CPU the process used while delivering (the sink's
//! own share of the wall time; the rest is waiting on the database), and the time making the
//! records rows once, alone (the part of that CPU that is conversion).

#[path = "common/cpu.rs"]
mod cpu;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use sluice_bus::{EmbeddedLog, NewRecord, Retention, StreamLog, TopicConfig};
use sluice_core::clock::{Clock, SystemClock};
use sluice_core::pipeline::{SinkConfig, SqlColumns, SqlSinkConfig, SqlWriteMode};
use sluice_core::secret::{ResolvedSecret, SecretValue};
use sluice_runtime::delivery::{Delivery, SideTopics};
use sluice_runtime::sinks::sql::{Cell, Converted, Layout};
use sluice_runtime::sinks::{self, Settle, SinkContext};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const ENTITY: &str = "erc20_token_transfer";

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn record(n: u64) -> (Vec<u8>, Vec<u8>) {
    let value = json!({
        "token_address": "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913",
        "token_name": "USD Coin",
        "token_symbol": "USDC",
        "from_address": format!("0x{:040x}", n * 7919),
        "to_address": format!("0x{:040x}", n * 104_729),
        "raw_amount_str": format!("{}", n * 1_000_003),
        "raw_amount": (n * 1_000_003) as f64,
        "amount_str": format!("{}.{:06}", n, n % 1_000_000),
        "amount": n as f64 + 0.25,
        "transaction_hash": format!("0x{n:064x}"),
        "transaction_index": n % 200,
        "log_index": n % 10,
        "block_number": 30_000_000 + n / 100,
        "block_timestamp": "2026-11-21T12:00:00Z",
        "block_hash": format!("0x{:064x}", 30_000_000 + n / 100),
    });
    (format!("0x{n:064x}:{}", n % 10).into_bytes(), value.to_string().into_bytes())
}

/// One row as a line of a bulk loader's tab-separated input.
fn tsv_line(out: &mut String, cells: &[Cell], mysql: bool) {
    use std::fmt::Write as _;
    for (index, cell) in cells.iter().enumerate() {
        if index > 0 {
            out.push('\t');
        }
        match cell {
            Cell::Null => out.push_str("\\N"),
            Cell::Int(n) => {
                let _ = write!(out, "{n}");
            }
            Cell::Float(f) => {
                let _ = write!(out, "{f:?}");
            }
            Cell::Bool(b) => out.push_str(match (mysql, b) {
                (true, true) => "1",
                (true, false) => "0",
                (false, true) => "t",
                (false, false) => "f",
            }),
            Cell::Text(text) | Cell::Json(text) => {
                for c in text.chars() {
                    match c {
                        '\\' => out.push_str("\\\\"),
                        '\t' => out.push_str("\\t"),
                        '\n' => out.push_str("\\n"),
                        c => out.push(c),
                    }
                }
            }
            Cell::Time(at) if mysql => {
                let _ = write!(out, "{}", at.format("%Y-%m-%d %H:%M:%S%.6f"));
            }
            Cell::Time(at) => {
                let _ = write!(out, "{}", at.format("%Y-%m-%d %H:%M:%S%.6f+00"));
            }
        }
    }
    out.push('\n');
}

/// The batches of `records`, made before the clock starts: a worker's come out of its
/// script, whatever the sink; only what the sink does with them is timed.
fn deliveries(records: Vec<NewRecord>, batch: usize, clock: &dyn Clock) -> Vec<Delivery> {
    records
        .chunks(batch)
        .map(|chunk| Delivery {
            out: chunk.to_vec(),
            dead: Vec::new(),
            logs: Vec::new(),
            made_at: clock.now(),
            origins: Vec::new(),
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let url = arg(&args, "--url").ok_or("--url <database URL> is required")?;
    let table = arg(&args, "--table").unwrap_or_else(|| "bench_sink".to_owned());
    let tsv = arg(&args, "--tsv").ok_or("--tsv <file> is required")?;
    let rows: u64 = arg(&args, "--rows").map_or(Ok(200_000), |v| v.parse())?;
    let batch: usize = arg(&args, "--batch").map_or(Ok(16_000), |v| v.parse())?;
    let mode = match arg(&args, "--mode").as_deref() {
        Some("upsert") => SqlWriteMode::Upsert,
        _ => SqlWriteMode::Insert,
    };
    let mysql = url.starts_with("mysql://") || url.starts_with("mariadb://");
    let sql = SqlSinkConfig {
        name: "bench".to_owned(),
        connection: "BENCH_DB".to_owned(),
        schema: None,
        table,
        mode,
        create_table: true,
        columns: SqlColumns::Auto,
        uid: "sk-bench".to_owned(),
    };
    let config =
        if mysql { SinkConfig::Mysql(sql.clone()) } else { SinkConfig::Postgres(sql.clone()) };
    let secrets = BTreeMap::from([(
        "BENCH_DB".to_owned(),
        ResolvedSecret { value: SecretValue::new(url.clone()), revision: "1".to_owned() },
    )]);
    let context = SinkContext {
        pipeline_id: "bench",
        secrets: &secrets,
        static_egress: false,
        egress: None,
        stream: ("base", ENTITY),
        guarantee: sluice_core::pipeline::DeliveryGuarantee::AtLeastOnce,
    };
    let sink = sinks::build(&config, context)?;
    sink.prepare().await?;

    let records: Vec<NewRecord> = (0..rows)
        .map(|n| {
            let (key, value) = record(n);
            NewRecord::new(key, value)
        })
        .collect();
    // The same rows for the bulk loader.
    let layout = Layout::new(&sql, ENTITY);
    // The records made rows once, timed alone: the part of the sink's CPU that is conversion.
    let converting = Instant::now();
    let rows_of: Vec<_> = records.iter().map(|r| layout.convert(&r.key, &r.value)).collect();
    let convert_seconds = converting.elapsed().as_secs_f64();
    let mut text = String::with_capacity(records.len() * 600);
    for converted in rows_of {
        if let Ok(Converted::Row { cells, .. }) = converted {
            tsv_line(&mut text, &cells, mysql);
        }
    }
    std::fs::File::create(&tsv)?.write_all(text.as_bytes())?;

    let dir = tempfile::tempdir()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let log: Arc<dyn StreamLog> =
        Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone())?);
    let side = SideTopics::new("bench");
    let source = "base.erc20_token_transfer";
    for (topic, partitions) in
        [(side.dead_letters.as_str(), 1), (side.logs.as_str(), 1), (source, 8)]
    {
        log.create_topic(topic, TopicConfig { partitions, retention: Retention::default() })
            .await?;
    }
    let group = format!("deploy.bench-{}", std::process::id());
    let deliveries = deliveries(records, batch, clock.as_ref());
    let started = Instant::now();
    let cpu_started = cpu::process_cpu_secs();
    let mut batches = 0;
    for (index, delivery) in deliveries.iter().enumerate() {
        // Eight partitions, as a size-S worker reads them.
        let offsets: Vec<(u32, u64)> =
            (0..8).map(|p| (p, (index as u64 + 1) * batch as u64)).collect();
        let settle = Settle { group: &group, source, offsets: &offsets };
        sink.deliver(&log, delivery, &side, settle).await?;
        batches += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu::process_cpu_secs() - cpu_started;
    sink.close().await;
    println!(
        "{}",
        json!({
            "sink": config.type_name(),
            "rows": rows,
            "batches": batches,
            "seconds": seconds,
            "rows_per_s": rows as f64 / seconds,
            "cpu_seconds": cpu,
            "convert_seconds": convert_seconds,
        })
    );
    Ok(())
}
