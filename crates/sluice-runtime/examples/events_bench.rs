//! The events benchmark (docs/events.md, BENCHMARKS.md "Service events").
//!
//! `cargo run --release -p sluice-runtime --example events_bench -- [--records N]
//! [--rounds R] [--events N] [--rate R] [--database URL] [--phase all|drain|write]
//! [--drain-events both|on|off] [--time-scale K] [--callgrind-dumps] [--side-rate N]
//! [--monitor-ms M]`
//!
//! - **drain, side by side**: the same pipeline (base/erc20_token_transfer, no transform,
//!   managed sink, one worker) drains `--records` (default 500 000) appended records,
//!   `--rounds` times (default 3) without service events and as many times with them,
//!   alternating: a recorder storing into the same SQLite store, the monitor sampling every
//!   100 ms (ten times the default; `--monitor-ms`), and a side task emitting 1 000 events/s
//!   (`--side-rate`, in hundreds; 0 for none), as a busy service would. Each run is a fresh data directory. Reports, per run and as medians with
//!   their spread, the drain rate by wall clock and by the CPU time the whole process spent
//!   during the drain (user + system, every thread: the workers, the recorder, the monitor,
//!   SQLite). CPU time is what the events cost the machine; unlike the wall clock it does not
//!   grow when other processes take the cores.
//! - **write and read back**: a recorder emits `--events` (default 100 000) events at
//!   `--rate` per second (default 10 000), paced every millisecond; reports how many were
//!   stored and dropped, and the time until the last was stored; then reads them all back
//!   with `list_events` pages of 1 000 and reports the rate. With `--database postgres://…`
//!   the same on PostgreSQL (the database must exist and be empty of Sluice tables or be a
//!   Sluice store).
//!
//! `--phase drain` runs only the drains, `--phase write` only the write and read back.
//! `--drain-events on|off` runs only the drains with (or without) events.
//!
//! **Counting instructions** (`scripts/bench-events --callgrind`): under `valgrind
//! --tool=callgrind`, `--callgrind-dumps` asks callgrind (through `callgrind_control`) to dump
//! its counters right before the drain starts and right after the last record is sent, so the
//! dump named `drain-end` holds the instructions every thread of the process executed during
//! the drain alone. Under callgrind the program runs tens of times slower, so the tasks that
//! run by the clock (the monitor's samples, the side task's 1 000 events/s, the wait for the
//! drain's end) would do tens of times more work per record than at native speed;
//! `--time-scale K` stretches their periods by K so that, at a slowdown of K, they do per
//! record what they do natively.
//!
//! Prints one JSON line per measurement.

#[path = "common/cpu.rs"]
mod cpu;

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

use self::cpu::process_cpu_secs;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    All,
    Drain,
    Write,
}

struct Args {
    records: usize,
    rounds: usize,
    events: usize,
    rate: usize,
    database: Option<String>,
    phase: Phase,
    /// Which drains to run: `None` both, alternating; `Some(true)` only with events.
    drain_events: Option<bool>,
    time_scale: u32,
    callgrind_dumps: bool,
    /// Events per second the side task emits (0: no side task).
    side_rate: u32,
    /// The monitor's sampling period, in milliseconds.
    monitor_ms: u64,
}

fn args() -> Args {
    let mut args = Args {
        records: 500_000,
        rounds: 3,
        events: 100_000,
        rate: 10_000,
        database: None,
        phase: Phase::All,
        drain_events: None,
        time_scale: 1,
        callgrind_dumps: false,
        side_rate: 1000,
        monitor_ms: 100,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--callgrind-dumps" {
            args.callgrind_dumps = true;
            continue;
        }
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--records" => args.records = value.parse().expect("--records N"),
            "--rounds" => args.rounds = value.parse().expect("--rounds N"),
            "--events" => args.events = value.parse().expect("--events N"),
            "--rate" => args.rate = value.parse().expect("--rate N"),
            "--database" => args.database = Some(value),
            "--phase" => {
                args.phase = match value.as_str() {
                    "all" => Phase::All,
                    "drain" => Phase::Drain,
                    "write" => Phase::Write,
                    other => panic!("--phase all|drain|write, not {other:?}"),
                }
            }
            "--drain-events" => {
                args.drain_events = match value.as_str() {
                    "both" => None,
                    "on" => Some(true),
                    "off" => Some(false),
                    other => panic!("--drain-events both|on|off, not {other:?}"),
                }
            }
            "--time-scale" => {
                args.time_scale = value.parse().expect("--time-scale K (a whole number ≥ 1)");
                assert!(args.time_scale >= 1, "--time-scale K must be at least 1");
            }
            "--side-rate" => args.side_rate = value.parse().expect("--side-rate EVENTS_PER_SEC"),
            "--monitor-ms" => args.monitor_ms = value.parse().expect("--monitor-ms MS"),
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// Asks callgrind to dump its counters (and start counting afresh), named `hint`; waits
/// until it did. Only under `valgrind --tool=callgrind`.
fn callgrind_dump(hint: &str) {
    let status = std::process::Command::new("callgrind_control")
        .args(["-d", hint, &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("callgrind_control runs (valgrind is installed)");
    assert!(status.success(), "callgrind_control -d {hint} failed: is this run under callgrind?");
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

/// What one drain measured.
struct DrainRun {
    /// Records per second of wall clock.
    rate: f64,
    /// Records per CPU second of the whole process during the drain.
    cpu_rate: f64,
    secs: f64,
    cpu_secs: f64,
    /// Events the recorder stored during the drain (0 without events).
    events_stored: u64,
}

/// One drain of `records` records; with events, the clocked tasks' periods are stretched
/// `time_scale` times.
async fn drain(args: &Args, with_events: bool) -> Result<DrainRun, BoxError> {
    let (records, time_scale) = (args.records, args.time_scale);
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
        let settings = EventSettings {
            interval: Duration::from_millis(args.monitor_ms) * time_scale,
            ..EventSettings::default()
        };
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
    if args.callgrind_dumps {
        callgrind_dump("drain-start");
    }
    // A busy service: 1,000 events/s (`--side-rate`) from elsewhere while the pipeline drains,
    // ten every 10 ms or as many as the rate asks.
    let per_tick = (args.side_rate / 100) as usize;
    let side = recorder.clone().filter(|_| per_tick > 0).map(|recorder| {
        let org = identity.org.id.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10) * time_scale);
            loop {
                tick.tick().await;
                for _ in 0..per_tick {
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
    let stored_before = recorder.as_ref().map_or(0, |recorder| recorder.stored());
    let cpu_start = process_cpu_secs();
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
        tokio::time::sleep(Duration::from_millis(2) * time_scale).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu_secs = process_cpu_secs() - cpu_start;
    if let Some(side) = side {
        side.abort();
    }
    if args.callgrind_dumps {
        callgrind_dump("drain-end");
    }
    let events_stored =
        recorder.as_ref().map_or(0, |recorder| recorder.stored().saturating_sub(stored_before));
    runtime.shutdown().await;
    Ok(DrainRun {
        rate: records as f64 / secs,
        cpu_rate: records as f64 / cpu_secs.max(0.01),
        secs,
        cpu_secs,
        events_stored,
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The smallest and the largest of `values`.
fn spread(values: &[f64]) -> (f64, f64) {
    values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(*v), hi.max(*v)))
}

/// The drains, alternating (or only those `only` names); prints each and the medians.
async fn drains(args: &Args) -> Result<(), BoxError> {
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        // Alternating, so drift of the machine spreads over both.
        let order = match args.drain_events {
            Some(only) => vec![only],
            None if round % 2 == 0 => vec![false, true],
            None => vec![true, false],
        };
        for with_events in order {
            let run = drain(args, with_events).await?;
            println!(
                "{}",
                serde_json::json!({
                    "bench": "drain_run", "events": with_events,
                    "records_per_sec": run.rate.round(),
                    "records_per_cpu_sec": run.cpu_rate.round(),
                    "secs": (run.secs * 1000.0).round() / 1000.0,
                    "cpu_secs": (run.cpu_secs * 100.0).round() / 100.0,
                    "events_stored": run.events_stored,
                })
            );
            if with_events { on.push(run) } else { off.push(run) }
        }
    }
    if off.is_empty() || on.is_empty() {
        return Ok(());
    }
    let summary = |runs: &[DrainRun], pick: fn(&DrainRun) -> f64| {
        let values: Vec<f64> = runs.iter().map(pick).collect();
        let (lo, hi) = spread(&values);
        (median(values), lo, hi)
    };
    let (off_wall, off_wall_lo, off_wall_hi) = summary(&off, |r| r.rate);
    let (on_wall, on_wall_lo, on_wall_hi) = summary(&on, |r| r.rate);
    let (off_cpu, off_cpu_lo, off_cpu_hi) = summary(&off, |r| r.cpu_rate);
    let (on_cpu, on_cpu_lo, on_cpu_hi) = summary(&on, |r| r.cpu_rate);
    let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
    println!(
        "{}",
        serde_json::json!({
            "bench": "drain", "records": args.records, "rounds": args.rounds,
            "without_events": off_wall.round(), "with_events": on_wall.round(),
            "ratio": round3(on_wall / off_wall),
            "without_events_range": [off_wall_lo.round(), off_wall_hi.round()],
            "with_events_range": [on_wall_lo.round(), on_wall_hi.round()],
            "cpu_without_events": off_cpu.round(), "cpu_with_events": on_cpu.round(),
            "cpu_ratio": round3(on_cpu / off_cpu),
            "cpu_without_events_range": [off_cpu_lo.round(), off_cpu_hi.round()],
            "cpu_with_events_range": [on_cpu_lo.round(), on_cpu_hi.round()],
        })
    );
    Ok(())
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
    if args.phase != Phase::Write {
        drains(&args).await?;
    }
    if args.phase == Phase::Drain {
        return Ok(());
    }
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
