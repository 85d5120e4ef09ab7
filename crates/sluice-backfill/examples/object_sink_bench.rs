//! The `object_storage` sink against the warehouse's parquet writer, side by side in one run,
//! on the same rows and the same S3-compatible server (`SLUICE_TEST_S3_URL`; run through
//! `scripts/bench/object-sink`, which starts moto).
//!
//! `cargo run --release -p sluice-backfill --example object_sink_bench -- [--rows N]
//! [--file-rows R]` (defaults 400,000 rows, 50,000 rows a file).
//!
//! - **writer**: the rows of each of 8 partitions, in files of R rows: each record's block
//!   time read, the file encoded with the warehouse's writer (`sluice_columnar::encode_file`,
//!   what an archiver append does) and PUT into a bucket, one file after another.
//! - **sink**: the same records delivered to an `object_storage` sink (`format: parquet`,
//!   `max_rows: R`) in worker-sized batches (2,000 records of each partition, with their
//!   source positions), which cuts, encodes and PUTs the same files into another bucket and
//!   commits the offsets past each file in an embedded log; timed until the last file is
//!   written (`close`).
//!
//! Prints one JSON line per side and the sink's rows/s as a ratio of the writer's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use sluice_backfill::storage::{Storage, testing::new_bucket};
use sluice_bus::{EmbeddedLog, NewRecord, Retention, StreamLog, TopicConfig};
use sluice_core::clock::SystemClock;
use sluice_core::pipeline::{DeliveryGuarantee, ObjectStorageSinkConfig, SinkConfig};
use sluice_core::secret::{ResolvedSecret, ResolvedSecrets, SecretValue};
use sluice_runtime::delivery::{Delivery, Origin, SideTopics};
use sluice_runtime::sinks::{self, Settle, SinkContext};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PARTITIONS: u32 = 8;
const SOURCE: &str = "base.erc20_token_transfer";
const BATCH: usize = 2000;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Record `n`: an ERC-20 transfer of about 500 bytes of JSON.
fn record(n: usize) -> (String, String) {
    let seconds = 1_795_000_000 + n as i64 / 20;
    let time = chrono::DateTime::from_timestamp(seconds, 0).expect("a valid time");
    let value = serde_json::json!({
        "block_number": 30_000_000 + n / 20,
        "block_timestamp": time.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        "block_hash": format!("0x{:064x}", n / 20),
        "transaction_hash": format!("0x{:064x}", n * 7 + 1),
        "transaction_index": n % 200,
        "log_index": n % 10,
        "token_address": format!("0x{:040x}", n % 20),
        "from_address": format!("0x{:040x}", n * 13 % 100_003),
        "to_address": format!("0x{:040x}", n * 17 % 100_019),
        "amount_str": format!("{}.{:06}", n % 100_000, n % 1_000_000),
        "amount": (n % 100_000) as f64 + 0.5,
        "raw_amount": format!("{}", n as u128 * 1_000_000_007),
    });
    (format!("0x{:064x}:{}", n * 7 + 1, n % 10), value.to_string())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
#[allow(
    clippy::too_many_lines,
    reason = "a benchmark run told step by step, each step timed in place and reported together"
)]
async fn main() -> Result<(), BoxError> {
    let rows = arg("--rows", 400_000);
    let file_rows = arg("--file-rows", 50_000);
    let endpoint = std::env::var("SLUICE_TEST_S3_URL")
        .map_err(|_| "SLUICE_TEST_S3_URL must name an S3-compatible server")?;
    // Record n is in partition n % 8, at offset n / 8.
    let records: Vec<(String, String)> = (0..rows).map(record).collect();
    let json_bytes: usize = records.iter().map(|(_, v)| v.len()).sum();
    let table = sluice_columnar::tables::layout("base", "erc20_token_transfer");

    // The warehouse's writer.
    let writer_bucket = tokio::task::spawn_blocking(|| new_bucket("writer")).await?;
    let started = Instant::now();
    let (written, writer_files) = {
        let (records, table) = (records.clone(), table.clone());
        tokio::task::spawn_blocking(move || -> Result<(usize, usize), BoxError> {
            let (mut bytes, mut files) = (0, 0);
            for partition in 0..PARTITIONS as usize {
                let mine: Vec<&(String, String)> =
                    records.iter().skip(partition).step_by(PARTITIONS as usize).collect();
                for (index, chunk) in mine.chunks(file_rows).enumerate() {
                    let rows: Vec<sluice_columnar::Row> = chunk
                        .iter()
                        .map(|(key, value)| sluice_columnar::Row {
                            key: key.clone(),
                            time_us: sluice_columnar::block_time("erc20_token_transfer", value)
                                .map_or(0, |t| t.timestamp_micros()),
                            record: value.clone(),
                        })
                        .collect();
                    let file = sluice_columnar::encode_file(&table, &rows)?;
                    bytes += file.len();
                    writer_bucket.put(&format!("{partition}-{index}.parquet"), file)?;
                    files += 1;
                }
            }
            Ok((bytes, files))
        })
        .await??
    };
    let writer_secs = started.elapsed().as_secs_f64();

    // The sink, in worker-sized batches.
    let sink_bucket = tokio::task::spawn_blocking(|| new_bucket("")).await?;
    let bucket = sink_bucket
        .location("")
        .trim_start_matches("s3://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let dir = tempfile::tempdir()?;
    let log: Arc<dyn StreamLog> =
        Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), Arc::new(SystemClock))?);
    let config = TopicConfig { partitions: PARTITIONS, retention: Retention::default() };
    log.create_topic(SOURCE, config).await?;
    let config = SinkConfig::ObjectStorage(ObjectStorageSinkConfig {
        name: "bench".to_owned(),
        bucket,
        prefix: "sink".to_owned(),
        region: "us-east-1".to_owned(),
        endpoint: Some(endpoint),
        path_style: true,
        access_key_id_secret: "ID".to_owned(),
        secret_access_key_secret: "KEY".to_owned(),
        session_token_secret: None,
        format: "parquet".to_owned(),
        max_rows: file_rows as u64,
        max_bytes: 1 << 30,
        max_seconds: 86_400,
        uid: "sk-bench".to_owned(),
    });
    let secret = |value: &str| ResolvedSecret {
        value: SecretValue::new(value.to_owned()),
        revision: "1".to_owned(),
    };
    let secrets: ResolvedSecrets =
        BTreeMap::from([("ID".to_owned(), secret("test")), ("KEY".to_owned(), secret("test"))]);
    let context = SinkContext {
        pipeline_id: "bench",
        secrets: &secrets,
        static_egress: false,
        egress: None,
        stream: ("base", "erc20_token_transfer"),
        guarantee: DeliveryGuarantee::AtLeastOnce,
    };
    let sink = sinks::build(&config, context)?;
    let side = SideTopics::new("bench");
    let per_partition = rows.div_ceil(PARTITIONS as usize);
    let started = Instant::now();
    for round in 0..per_partition.div_ceil(BATCH) {
        let (mut out, mut origins, mut offsets) = (Vec::new(), Vec::new(), Vec::new());
        for partition in 0..PARTITIONS {
            let first = round * BATCH;
            let mut next = None;
            for offset in first..first + BATCH {
                let n = offset * PARTITIONS as usize + partition as usize;
                let Some((key, value)) = records.get(n) else { break };
                out.push(NewRecord::new(key.clone(), value.clone()));
                origins.push(Origin {
                    partition,
                    offset: offset as u64,
                    timestamp_ms: 1_795_000_000_000,
                });
                next = Some(offset as u64 + 1);
            }
            offsets.extend(next.map(|next| (partition, next)));
        }
        let delivery = Delivery {
            out,
            dead: Vec::new(),
            logs: Vec::new(),
            made_at: chrono::Utc::now(),
            origins,
        };
        let settle = Settle { group: "bench", source: SOURCE, offsets: &offsets };
        sink.deliver(&log, &delivery, &side, settle).await?;
    }
    sink.close().await;
    let sink_secs = started.elapsed().as_secs_f64();
    let sink_files = tokio::task::spawn_blocking(move || sink_bucket.list("sink")).await??.len();

    let rate = |secs: f64| rows as f64 / secs;
    println!(
        "{}",
        serde_json::json!({"side": "writer", "rows": rows, "files": writer_files, "parquet_bytes": written, "json_bytes": json_bytes, "seconds": writer_secs, "rows_per_s": rate(writer_secs)})
    );
    println!(
        "{}",
        serde_json::json!({"side": "sink", "rows": rows, "files": sink_files, "seconds": sink_secs, "rows_per_s": rate(sink_secs)})
    );
    println!(
        "{rows} rows, {writer_files} vs {sink_files} files of {file_rows}: warehouse writer {:.0} rows/s, object_storage sink {:.0} rows/s, ratio {:.2}x",
        rate(writer_secs),
        rate(sink_secs),
        writer_secs / sink_secs
    );
    Ok(())
}
