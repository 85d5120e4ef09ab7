//! The events benchmark (docs/events.md, BENCHMARKS.md §25).
//!
//! `cargo run --release -p sluice-runtime --example events_bench -- [--records N]
//! [--rounds R] [--events N] [--rate R] [--database URL]`
//!
//! - **drain, side by side**: the same pipeline (base/erc20_token_transfer, no transform,
//!   managed sink, one worker) drains `--records` (default 500 000) appended records,
//!   `--rounds` times (default 3) without service events and as many times with them,
//!   alternating: a recorder storing into the same SQLite store, the monitor sampling every
//!   100 ms (ten times the default), and a side task emitting 1 000 events/s, as a busy
//!   service would. Each run is a fresh data directory. Reports the median drain rate of
//!   each and their ratio.
//! - **write and read back**: a recorder emits `--events` (default 100 000) events at
//!   `--rate` per second (default 10 000), paced every millisecond; reports how many were
//!   stored and dropped, and the time until the last was stored; then reads them all back
//!   with `list_events` pages of 1 000 and reports the rate. With `--database postgres://…`
//!   the same on PostgreSQL (the database must exist and be empty of Sluice tables or be a
//!   Sluice store).
//!
//! Prints one JSON line per measurement.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_bus::{EmbeddedLog, StreamLog};
use sluice_core::catalog::Catalog;
use sluice_core::clock::{Clock, SystemClock};
use sluice_core::events::{EventEmitter, NewEvent, Severity};
use sluice_core::pipeline::{
    DeliveryGuarantee, ManagedSinkConfig, Pipeline, PipelineConfig, PipelineSpec, PodSize,
    SinkConfig, Source, SourceType,
};
use sluice_core::streams::StreamRecord;
use sluice_runtime::events::{EventSettings, Recorder};
use sluice_runtime::{Counters, Runtime, RuntimeSettings};
use sluice_store::{EventQuery, MetadataStore, SqliteStore};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    records: usize,
    rounds: usize,
    events: usize,
    rate: usize,
    database: Option<String>,
}

fn args() -> Args {
    let mut args =
        Args { records: 500_000, rounds: 3, events: 100_000, rate: 10_000, database: None };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--records" => args.records = value.parse().expect("--records N"),
            "--rounds" => args.rounds = value.parse().expect("--rounds N"),
            "--events" => args.events = value.parse().expect("--events N"),
            "--rate" => args.rate = value.parse().expect("--rate N"),
            "--database" => args.database = Some(value),
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

fn record(n: usize) -> StreamRecord {
    let value = serde_json::json!({
        "amount": "1.5", "amount_str": "1.5", "block_hash": format!("0x{:064x}", n / 100),
        "block_number": 1000 + n / 100, "block_timestamp": "2026-11-21T12:00:00Z",
        "from_address": "0x2222222222222222222222222222222222222222", "log_index": n % 100,
        "raw_amount": "1500000", "raw_amount_str": "1500000",
        "to_address": "0x3333333333333333333333333333333333333333",
        "token_address": "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913",
        "token_name": "USD Coin", "token_symbol": "USDC",
        "transaction_hash": format!("0x{n:064x}"),
    })
    .to_string();
    StreamRecord::parse("erc20_token_transfer", value.as_bytes()).expect("a valid record")
}

fn spec() -> PipelineSpec {
    PipelineSpec {
        name: "events-bench".to_owned(),
        description: "events_bench example".to_owned(),
        tags: None,
        static_egress_ip: false,
        pod_size: PodSize::S,
        delivery_guarantee: DeliveryGuarantee::AtLeastOnce,
        pipeline_config: PipelineConfig {
            source: Source {
                source_type: SourceType::Pubsub,
                chain: "base".to_owned(),
                entity: "erc20_token_transfer".to_owned(),
                is_zerolag: false,
            },
            transforms: Vec::new(),
            sinks: vec![SinkConfig::Kafka(ManagedSinkConfig {
                uid: "sk-bench".to_owned(),
                name: "bench-out".to_owned(),
            })],
        },
    }
}

/// One drain of `records` records; answers records per second.
async fn drain(records: usize, with_events: bool) -> Result<f64, BoxError> {
    let dir = tempfile::tempdir()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store: Arc<dyn MetadataStore> = Arc::new(
        SqliteStore::open(&format!("sqlite://{}", dir.path().join("meta.db").display())).await?,
    );
    let log: Arc<dyn StreamLog> =
        Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone())?);
    let mut builder =
        Runtime::builder(store.clone(), log.clone(), Arc::new(Catalog::default()), clock.clone())
            .settings(RuntimeSettings::default());
    let recorder = with_events.then(|| {
        let settings =
            EventSettings { interval: Duration::from_millis(100), ..EventSettings::default() };
        Recorder::start(store.clone(), clock.clone(), settings)
    });
    if let Some(recorder) = &recorder {
        builder = builder.events(recorder.clone());
    }
    let runtime = builder.start().await?;
    let identity = store.ensure_identity("bench", "bench", "bench", false).await?;
    let pipeline = Pipeline::new(
        "events-bench".to_owned(),
        spec(),
        identity.user.id.clone(),
        identity.org.id.clone(),
        clock.now(),
    );
    store.insert_pipeline(&pipeline, &identity.team.id, &[]).await?;
    runtime.deploy(&pipeline).await?;
    runtime.pause(&pipeline.id).await?;
    for from in (0..records).step_by(5000) {
        let batch = (from..(from + 5000).min(records)).map(record).collect();
        runtime.ingest("base", "erc20_token_transfer", false, batch).await?;
    }
    // A busy service: 1,000 events/s from elsewhere while the pipeline drains.
    let side = recorder.clone().map(|recorder| {
        let org = identity.org.id.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            loop {
                tick.tick().await;
                for _ in 0..10 {
                    recorder.emit(NewEvent::pipeline(
                        recorder.now(),
                        "pipeline.updated",
                        Severity::Info,
                        &org,
                        "elsewhere",
                        "bench".to_owned(),
                        serde_json::json!({"name": "bench"}),
                    ));
                }
            }
        })
    });
    let start = Instant::now();
    runtime.deploy(&pipeline).await?;
    loop {
        let sent = match runtime.counters(&pipeline.id).await {
            Some(counters) => Counters::get(&counters.sent),
            None => 0,
        };
        if sent as usize >= records {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    if let Some(side) = side {
        side.abort();
    }
    runtime.shutdown().await;
    Ok(records as f64 / secs)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Emits `count` events at `rate` per second, then reads them back.
async fn write_and_read(
    store: Arc<dyn MetadataStore>,
    backend: &str,
    count: usize,
    rate: usize,
) -> Result<(), BoxError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let first = store.last_event_id().await?;
    let recorder = Recorder::start(store.clone(), clock, EventSettings::default());
    let start = Instant::now();
    let per_ms = rate as f64 / 1000.0;
    let mut emitted = 0usize;
    while emitted < count {
        let due = ((start.elapsed().as_secs_f64() * 1000.0 + 1.0) * per_ms) as usize;
        while emitted < due.min(count) {
            recorder.emit(NewEvent::pipeline(
                recorder.now(),
                "dead_letters.recorded",
                Severity::Warning,
                "bench-org",
                &format!("p{}", emitted % 100),
                format!("{emitted} records dead-lettered"),
                serde_json::json!({"count": emitted, "window_seconds": 60}),
            ));
            emitted += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let emit_secs = start.elapsed().as_secs_f64();
    while recorder.stored() + recorder.dropped() < count as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stored_secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "bench": "events_write", "backend": backend, "events": count, "rate_asked": rate,
            "emit_secs": (emit_secs * 1000.0).round() / 1000.0,
            "all_stored_secs": (stored_secs * 1000.0).round() / 1000.0,
            "stored": recorder.stored(), "dropped": recorder.dropped(),
            "write_rate": (recorder.stored() as f64 / stored_secs).round(),
        })
    );
    let start = Instant::now();
    let mut read = 0usize;
    let mut after = first;
    loop {
        let query = EventQuery {
            org_id: Some("bench-org".to_owned()),
            after_id: Some(after),
            limit: 1000,
            ..EventQuery::default()
        };
        let page = store.list_events(&query).await?;
        let Some(last) = page.last() else { break };
        after = last.id;
        read += page.len();
    }
    let read_secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "bench": "events_read", "backend": backend, "events": read,
            "read_secs": (read_secs * 1000.0).round() / 1000.0,
            "read_rate": (read as f64 / read_secs).round(),
        })
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = args();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        // Alternating, so drift of the machine spreads over both.
        let (first, second) = if round % 2 == 0 { (false, true) } else { (true, false) };
        for with_events in [first, second] {
            let rate = drain(args.records, with_events).await?;
            println!(
                "{}",
                serde_json::json!({"bench": "drain_run", "events": with_events, "records_per_sec": rate.round()})
            );
            if with_events { on.push(rate) } else { off.push(rate) }
        }
    }
    let (off, on) = (median(off), median(on));
    println!(
        "{}",
        serde_json::json!({
            "bench": "drain", "records": args.records, "rounds": args.rounds,
            "without_events": off.round(), "with_events": on.round(),
            "ratio": (on / off * 1000.0).round() / 1000.0,
        })
    );
    let dir = tempfile::tempdir()?;
    let sqlite: Arc<dyn MetadataStore> = Arc::new(
        SqliteStore::open(&format!("sqlite://{}", dir.path().join("events.db").display())).await?,
    );
    write_and_read(sqlite, "sqlite", args.events, args.rate).await?;
    if let Some(url) = &args.database {
        let pg = sluice_store::open(url).await?;
        write_and_read(pg, "postgres", args.events, args.rate).await?;
    }
    Ok(())
}
