//! The pipeline benchmark: records through log → set filter → managed sink with one worker.
//!
//! `cargo run --release -p sluice-runtime --example pipeline_bench -- [--records N]
//! [--values N] [--pipelines N] [--rate R] [--seconds S] [--match-percent P] [--phase both|throughput|latency]
//! [--bus kafka://host:port] [--sink managed|webhook|nats:nats://host:port|external_kafka:host:port]`
//! (defaults: 2 000 000 records, 1 000 000 values, 10 000 records/s for 20 s, 100 % matching,
//! both phases).
//!
//! With `--pipelines N` (default 1) the throughput phase runs N such pipelines on the one
//! stream, each with `--values` values of its own (a matching record matches one of them), and
//! drains them together: what the shared readers and the set filters evaluated together give
//! (docs/runtime.md "Shared readers"). The latency phase then runs on the first of them.
//!
//! Everything is real and in a temporary directory: the SQLite metadata store, the embedded
//! stream log (durable appends) and the runtime with `RuntimeSettings::default()`. The
//! pipeline reads `base/erc20_token_transfer`, keeps records whose `token_address` is in a set
//! of `--values` random addresses, and delivers to one `kafka` (managed) sink; pod size S (one
//! worker), `at_least_once`.
//!
//! - throughput: deploy (pins the offsets at the stream end), pause, append `--records`
//!   records of which 5 % match, deploy again and time until the deployment's committed
//!   offsets reach the end offsets.
//! - latency: with the pipeline deployed, append at `--rate` records/s in batches every 10 ms,
//!   each record stamped with `sent_at_us` just before its append; a reader long-polls the sink
//!   topic and takes now − `sent_at_us` for every record it sees.
//!
//! `--sink` swaps the managed sink for an external one: `webhook` (a receiver in this process
//! on a loopback port, which parses every body and takes the latency of every record),
//! `nats:<url>` (a JetStream stream with file storage, made for the run) or
//! `external_kafka:<host:port>` (a topic made for the run). The throughput phase then counts
//! what the sink acknowledged; the latency phase runs for `managed` and `webhook`.
//!
//! Prints one JSON line per measurement, then the same figures for people. Linux only (reads
//! `/proc/self/stat` for CPU time).
//!
//! This file holds the arguments, the setup and the throughput phase; the latency phase is in
//! `latency.rs`, the external sinks in `sinks.rs`, the record generator in `records.rs`.

#[path = "../common/cpu.rs"]
mod cpu;
mod latency;
mod records;
mod sinks;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_bus::{EmbeddedLog, KafkaLog, KafkaSettings, StreamLog, topics};
use sluice_core::catalog::Catalog;
use sluice_core::clock::{Clock, SystemClock};
use sluice_core::pipeline::{
    DeliveryGuarantee, Pipeline, PipelineConfig, PipelineSpec, PodSize, SinkConfig, Source,
    SourceType, Transform,
};
use sluice_core::streams::StreamRecord;
use sluice_runtime::{Counters, Runtime, RuntimeSettings};
use sluice_store::{MetadataStore, SqliteStore};

use self::cpu::process_cpu_secs;
use self::latency::latency;
use self::records::{Generator, SplitMix};
use self::sinks::external_sink;

/// The allocator the `sluice` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const CHAIN: &str = "base";
const ENTITY: &str = "erc20_token_transfer";
const TRANSFORM_UID: &str = "tf-bench";
const SINK_NAME: &str = "bench-out";
/// Records per `ingest` call in the throughput phase.
const INGEST_BATCH: usize = 5_000;
/// Values per `add_filter_values` call while the set is loaded into the store.
const VALUES_PER_ADD: usize = 100_000;
/// The share of records whose token is in the set (throughput phase).
const HIT_RATE_THROUGHPUT: f64 = 0.05;
/// Set values kept to build matching records from.
const SAMPLE_SIZE: usize = 10_000;
/// Non-matching records pick their token from this many addresses, as real traffic
/// concentrates on a few tokens.
const OTHER_TOKENS: usize = 2_000;
/// Interval between appends in the latency phase.
const LATENCY_TICK: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Both,
    Throughput,
    Latency,
}

#[derive(Debug)]
struct Args {
    records: usize,
    values: usize,
    /// Pipelines on the stream, each with `values` values of its own.
    pipelines: usize,
    rate: u64,
    seconds: f64,
    match_percent: u32,
    phase: Phase,
    /// `kafka://…` to run on a Kafka cluster instead of the embedded log.
    bus: Option<String>,
    /// Share of matching records in the throughput phase (percent).
    throughput_match_percent: u32,
    sink: SinkChoice,
}

/// Where the pipeline delivers.
#[derive(Debug, Clone)]
enum SinkChoice {
    Managed,
    Webhook,
    Nats(String),
    ExternalKafka(String),
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        records: 2_000_000,
        values: 1_000_000,
        pipelines: 1,
        rate: 10_000,
        seconds: 20.0,
        match_percent: 100,
        phase: Phase::Both,
        bus: None,
        throughput_match_percent: (HIT_RATE_THROUGHPUT * 100.0) as u32,
        sink: SinkChoice::Managed,
    };
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = || format!("{flag}: not a valid value: {value}");
        match flag.as_str() {
            "--records" => args.records = value.parse().map_err(|_| bad())?,
            "--values" => args.values = value.parse().map_err(|_| bad())?,
            "--pipelines" => args.pipelines = value.parse().map_err(|_| bad())?,
            "--rate" => args.rate = value.parse().map_err(|_| bad())?,
            "--seconds" => args.seconds = value.parse().map_err(|_| bad())?,
            "--match-percent" => {
                args.match_percent = value.parse().map_err(|_| bad())?;
                if args.match_percent > 100 {
                    return Err(bad());
                }
            }
            "--bus" => args.bus = Some(value),
            "--sink" => {
                args.sink = match value.split_once(':') {
                    None if value == "managed" => SinkChoice::Managed,
                    None if value == "webhook" => SinkChoice::Webhook,
                    Some(("nats", url)) => SinkChoice::Nats(url.to_owned()),
                    Some(("external_kafka", servers)) => {
                        SinkChoice::ExternalKafka(servers.to_owned())
                    }
                    _ => return Err(bad()),
                }
            }
            "--throughput-match-percent" => {
                args.throughput_match_percent = value.parse().map_err(|_| bad())?;
                if args.throughput_match_percent > 100 {
                    return Err(bad());
                }
            }
            "--phase" => {
                args.phase = match value.as_str() {
                    "both" => Phase::Both,
                    "throughput" => Phase::Throughput,
                    "latency" => Phase::Latency,
                    _ => return Err(bad()),
                }
            }
            _ => {
                return Err(format!(
                    "unknown argument {flag}; use --records, --values, --pipelines, --rate, \
                     --seconds, --match-percent, --phase, --bus, --sink, \
                     --throughput-match-percent"
                ));
            }
        }
    }
    if args.values == 0 || args.pipelines == 0 {
        return Err("--values and --pipelines must be at least 1".to_owned());
    }
    if args.pipelines > 1 && !matches!(args.sink, SinkChoice::Managed) {
        return Err("--pipelines above 1 needs the managed sink".to_owned());
    }
    Ok(args)
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    if let Err(error) = run(&args).await {
        eprintln!("pipeline_bench failed: {error}");
        std::process::exit(1);
    }
}

async fn run(args: &Args) -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store: Arc<dyn MetadataStore> = Arc::new(
        SqliteStore::open(&format!("sqlite://{}", dir.path().join("meta.db").display())).await?,
    );
    let log: Arc<dyn StreamLog> = match &args.bus {
        None => Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone())?),
        Some(url) => {
            // Topics of this run only: a prefix of its own.
            let mut settings = KafkaSettings::parse(url)?;
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
            settings.topic_prefix = format!("bench{:x}.", nanos.as_nanos());
            Arc::new(KafkaLog::connect(settings, clock.clone()).await?)
        }
    };
    let kind = if args.bus.is_some() { "kafka" } else { "embedded" };
    report(serde_json::json!({"bench": "pipeline_log", "log": kind}), &[]);
    let runtime =
        Runtime::builder(store.clone(), log.clone(), Arc::new(Catalog::default()), clock.clone())
            .settings(RuntimeSettings::default())
            .start()
            .await?;

    let identity = store.ensure_identity("bench", "bench", "bench", false).await?;
    let (sink, receiver) = external_sink(&args.sink).await?;
    let mut pipelines = Vec::with_capacity(args.pipelines);
    for n in 0..args.pipelines {
        let pipeline = Pipeline::new(
            format!("pipeline-bench-{n}"),
            bench_spec(sink.clone()),
            identity.user.id.clone(),
            identity.org.id.clone(),
            clock.now(),
        );
        store.insert_pipeline(&pipeline, &identity.team.id, &[]).await?;
        pipelines.push(pipeline);
    }
    let pipeline = pipelines[0].clone();

    let mut rng = SplitMix(0x5eed);
    let load_start = Instant::now();
    // A matching record picks from the union of every pipeline's sample: it matches one.
    let mut sample = Vec::new();
    for pipeline in &pipelines {
        sample.extend(load_values(store.as_ref(), &pipeline.id, args.values, &mut rng).await?);
    }
    let load_secs = load_start.elapsed().as_secs_f64();
    let others: Vec<String> = (0..OTHER_TOKENS).map(|_| rng.address()).collect();

    // The first deploy builds the set index from the store and pins the offsets at the end.
    let deploy_start = Instant::now();
    for pipeline in &pipelines {
        runtime.deploy(pipeline).await?;
    }
    let deploy_secs = deploy_start.elapsed().as_secs_f64();
    let index_len = runtime
        .set_indexes()
        .acquire(&pipeline.id, TRANSFORM_UID)
        .await?
        .with(sluice_filter::ValueSet::len);
    report(
        serde_json::json!({
            "bench": "pipeline_setup",
            "values": args.values,
            "pipelines": args.pipelines,
            "index_values": index_len,
            "store_load_secs": round3(load_secs),
            "first_deploy_secs": round3(deploy_secs),
        }),
        &[
            format!(
                "setup: {} filter values into SQLite in {load_secs:.2} s (add_filter_values, \
                 {VALUES_PER_ADD} per call)",
                args.values
            ),
            format!(
                "  first deploy (set index of {index_len} values loaded) in {deploy_secs:.2} s"
            ),
        ],
    );

    let mut generator = Generator { rng, sample, others, next: 0 };
    if args.phase != Phase::Latency {
        let hit_rate = f64::from(args.throughput_match_percent) / 100.0;
        throughput(&runtime, log.as_ref(), &pipelines, &mut generator, args.records, hit_rate)
            .await?;
    }
    let measures_latency = matches!(args.sink, SinkChoice::Managed | SinkChoice::Webhook);
    if args.phase != Phase::Throughput && measures_latency {
        latency(&runtime, &log, &pipeline, &mut generator, args, receiver.as_ref()).await?;
    }
    runtime.shutdown().await;
    Ok(())
}

fn bench_spec(sink: SinkConfig) -> PipelineSpec {
    PipelineSpec {
        name: "pipeline-bench".to_owned(),
        description: "pipeline_bench example".to_owned(),
        tags: None,
        static_egress_ip: false,
        pod_size: PodSize::S,
        delivery_guarantee: DeliveryGuarantee::AtLeastOnce,
        pipeline_config: PipelineConfig {
            source: Source {
                source_type: SourceType::Pubsub,
                chain: CHAIN.to_owned(),
                entity: ENTITY.to_owned(),
                is_zerolag: false,
            },
            transforms: vec![Transform::SetFilter {
                uid: TRANSFORM_UID.to_owned(),
                filter_expr: "root = this.token_address".to_owned(),
            }],
            sinks: vec![sink],
        },
    }
}

/// Adds `count` random addresses to the pipeline's set in the store; returns a sample of them.
async fn load_values(
    store: &dyn MetadataStore,
    pipeline_id: &str,
    count: usize,
    rng: &mut SplitMix,
) -> Result<Vec<String>, BoxError> {
    let keep_every = (count / SAMPLE_SIZE).max(1);
    let mut sample = Vec::with_capacity(SAMPLE_SIZE + 1);
    let mut added = 0;
    while added < count {
        let chunk: Vec<String> =
            (0..VALUES_PER_ADD.min(count - added)).map(|_| rng.address()).collect();
        sample.extend(chunk.iter().step_by(keep_every).cloned());
        store.add_filter_values(pipeline_id, TRANSFORM_UID, &chunk).await?;
        added += chunk.len();
    }
    Ok(sample)
}

/// What [`append_backlog`] appended.
struct Backlog {
    /// Records whose token is in the set.
    hits: usize,
    bytes: usize,
    /// Time in the append calls.
    append_secs: f64,
    /// Wall time, generating the records included.
    ingest_wall: f64,
}

/// Appends `records` generated records in batches of [`INGEST_BATCH`].
async fn append_backlog(
    runtime: &Runtime,
    generator: &mut Generator,
    records: usize,
    hit_rate: f64,
) -> Result<Backlog, BoxError> {
    let mut append_time = Duration::ZERO;
    let mut hits = 0usize;
    let mut bytes = 0usize;
    let ingest_start = Instant::now();
    let mut appended = 0;
    while appended < records {
        let size = INGEST_BATCH.min(records - appended);
        let batch: Vec<StreamRecord> = (0..size)
            .map(|_| {
                let (record, hit) = generator.record(hit_rate, None);
                hits += usize::from(hit);
                bytes += record.value().len();
                record
            })
            .collect();
        let start = Instant::now();
        runtime.ingest(CHAIN, ENTITY, false, batch).await?;
        append_time += start.elapsed();
        appended += size;
    }
    let ingest_wall = ingest_start.elapsed().as_secs_f64();
    Ok(Backlog { hits, bytes, append_secs: append_time.as_secs_f64(), ingest_wall })
}

/// Deploys the paused `pipelines` again and waits until each has committed `ends` of
/// `source`.
async fn resume_and_drain(
    runtime: &Arc<Runtime>,
    log: &dyn StreamLog,
    pipelines: &[Pipeline],
    source: &str,
    ends: &[u64],
) -> Result<(), BoxError> {
    // Resumed together, so they start the backlog side by side (one after the other, the
    // first would be far into it before the last starts).
    let mut resuming = tokio::task::JoinSet::new();
    for pipeline in pipelines {
        let (runtime, pipeline) = (runtime.clone(), pipeline.clone());
        resuming.spawn(async move { runtime.deploy(&pipeline).await.map(|_| ()) });
    }
    while let Some(deployed) = resuming.join_next().await {
        deployed??;
    }
    // Pipelines are checked in turn, from the first not done yet: the bench's own reads of
    // committed offsets stay a small part of the process's CPU however many pipelines run.
    let mut draining = pipelines.iter().peekable();
    while let Some(pipeline) = draining.peek() {
        let committed = log.committed(&topics::deployment_group(&pipeline.id), source).await?;
        let done = ends
            .iter()
            .enumerate()
            .all(|(partition, end)| committed.get(&(partition as u32)).is_some_and(|c| c >= end));
        if done {
            draining.next();
        } else {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    Ok(())
}

/// Phase a: a backlog of `records` appended while paused, then drained by one worker.
async fn throughput(
    runtime: &Arc<Runtime>,
    log: &dyn StreamLog,
    pipelines: &[Pipeline],
    generator: &mut Generator,
    records: usize,
    hit_rate: f64,
) -> Result<(), BoxError> {
    let source = topics::chain_stream(CHAIN, ENTITY, false);
    let pipeline = &pipelines[0];
    let mut sink_before = 0;
    for pipeline in pipelines {
        runtime.pause(&pipeline.id).await?;
        sink_before +=
            total_end(log, &topics::sink_topic(&pipeline.id, SINK_NAME)).await.unwrap_or(0);
    }

    let Backlog { hits, bytes, append_secs, ingest_wall } =
        append_backlog(runtime, generator, records, hit_rate).await?;

    let ends: Vec<u64> = log.offsets(&source).await?.iter().map(|range| range.end).collect();
    // A profiling aid: `PIPELINE_BENCH_PAUSE_BEFORE_DRAIN=<seconds>` says when the drain
    // starts, with the process id, so a profiler can attach to the drain alone.
    if let Some(pause) = std::env::var("PIPELINE_BENCH_PAUSE_BEFORE_DRAIN")
        .ok()
        .and_then(|secs| secs.parse::<f64>().ok())
    {
        eprintln!("drain starts in {pause} s (pid {})", std::process::id());
        tokio::time::sleep(Duration::from_secs_f64(pause)).await;
    }
    let cpu_start = process_cpu_secs();
    let start = Instant::now();
    resume_and_drain(runtime, log, pipelines, &source, &ends).await?;
    let drain_secs = start.elapsed().as_secs_f64();
    let drain_cpu = process_cpu_secs() - cpu_start;
    let counters = runtime.counters(&pipeline.id).await.ok_or("the pipeline is not running")?;
    // An external sink's records are counted as the sink acknowledged them (the counters
    // start with the workers this deploy started).
    let delivered = if pipeline.pipeline_config.sinks[0].is_external() {
        // The worker counts a batch just after its commit: give the last one a moment.
        let counted = Instant::now();
        while Counters::get(&counters.sent) < hits as u64
            && counted.elapsed() < Duration::from_secs(5)
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Counters::get(&counters.sent)
    } else {
        let mut after = 0;
        for pipeline in pipelines {
            after += total_end(log, &topics::sink_topic(&pipeline.id, SINK_NAME)).await?;
        }
        after - sink_before
    };
    if delivered != hits as u64 {
        return Err(format!("{delivered} records reached the sink, {hits} were expected").into());
    }

    let per_sec = records as f64 / drain_secs;
    let append_rate = records as f64 / append_secs;
    report(
        serde_json::json!({
            "bench": "pipeline_throughput",
            "pipelines": pipelines.len(),
            "sink": pipeline.pipeline_config.sinks[0].type_name(),
            "records": records,
            "avg_record_bytes": bytes / records.max(1),
            "matching": hits,
            "delivered": delivered,
            "received_counter": Counters::get(&counters.received),
            "drain_secs": round3(drain_secs),
            "drain_process_cpu_secs": round3(drain_cpu),
            "records_per_sec": per_sec.round(),
            "records_per_process_cpu_sec": (records as f64 / drain_cpu).round(),
        }),
        &[
            format!(
                "throughput: {records} records ({} bytes on average, {hits} matching) through log \
                 → set filter → {} sink, {} pipeline(s) of one worker, in {drain_secs:.2} s",
                bytes / records.max(1),
                pipeline.pipeline_config.sinks[0].type_name(),
                pipelines.len()
            ),
            format!(
                "  {:.0} records/s ({:.0} per process CPU-second; {drain_cpu:.2} s CPU, all threads)",
                per_sec,
                records as f64 / drain_cpu
            ),
        ],
    );
    report(
        serde_json::json!({
            "bench": "pipeline_ingest",
            "records": records,
            "batch": INGEST_BATCH,
            "append_secs": round3(append_secs),
            "append_records_per_sec": append_rate.round(),
            "append_mib_per_sec": round3(bytes as f64 / append_secs / (1024.0 * 1024.0)),
            "wall_secs_with_generation": round3(ingest_wall),
        }),
        &[format!(
            "ingest: {records} records appended in batches of {INGEST_BATCH} in {append_secs:.2} s \
             of append calls: {append_rate:.0} records/s, {:.1} MiB/s (durable; {ingest_wall:.2} s \
             wall including generating the records)",
            bytes as f64 / append_secs / (1024.0 * 1024.0)
        )],
    );
    Ok(())
}

async fn total_end(log: &dyn StreamLog, topic: &str) -> Result<u64, BoxError> {
    Ok(log.offsets(topic).await?.iter().map(|range| range.end).sum())
}

fn report(line: serde_json::Value, readable: &[String]) {
    println!("{line}");
    for text in readable {
        println!("{text}");
    }
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}
