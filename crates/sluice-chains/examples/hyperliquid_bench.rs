//! The Hyperliquid ingester and the Kafka source, measured: BENCHMARKS.md §24 and
//! `scripts/bench-hyperliquid`.
//!
//! ```text
//! hyperliquid_bench files DIR BLOCKS EVENTS     # a node data dir: BLOCKS blocks of EVENTS fills
//!                                               # (by block) and EVENTS/2 order statuses
//! hyperliquid_bench ingest DIR LOG              # reads it all into durable records; events/s
//! hyperliquid_bench lag DIR LOG SECONDS BLOCKS_PER_S EVENTS
//!                                               # a writer appends while the ingester reads:
//!                                               # file append -> record readable, p50/p99
//! hyperliquid_bench produce BROKERS TOPIC N     # N fill messages to a new 4-partition topic
//! hyperliquid_bench source BROKERS TOPIC N LOG  # the Kafka source reads them: messages/s
//! hyperliquid_bench raw BROKERS TOPIC N         # a plain librdkafka consume loop: messages/s
//! ```
//!
//! `ingest` and `source` write to an embedded stream log of 8 partitions per stream (fsync
//! per append), as `sluice serve` does; run them under `taskset -c 0` for one core.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::json;
use sluice_bus::{EmbeddedLog, Retention, StreamLog, TopicConfig};
use sluice_chains::hyperliquid::{FileStart, HyperliquidConfig, HyperliquidIngester};
use sluice_chains::kafka_source::{KafkaSource, KafkaSourceConfig};
use sluice_chains::sink::{ChainSink, LogPositions};
use sluice_chains::status::ChainStatus;
use sluice_core::clock::SystemClock;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ENTITIES: [&str; 5] = ["block", "trade", "fill", "order", "misc_event"];
const BASE_MS: i64 = 1_748_772_000_000;

/// CPU seconds (user + system) this process has used: what the work cost, whatever else
/// the machine runs.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit(") ").next().unwrap().split(' ').collect();
    // utime and stime are fields 14 and 15 of the line (11 and 12 after the name), in ticks.
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn user(i: u64) -> String {
    format!("0x{:040x}", 0x5ac9_0000_u64 + i % 5_000)
}

fn time_text(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap().format("%Y-%m-%dT%H:%M:%S%.9f").to_string()
}

/// One fill as the node writes it (`[user, fill]`), about 400 bytes of JSON.
fn fill(b: u64, i: u64) -> serde_json::Value {
    let tid = b * 10_000 + i / 2;
    let side = if i % 2 == 0 { "B" } else { "A" };
    let coin = ["BTC", "ETH", "HYPE", "SOL"][(i % 4) as usize];
    json!([user(b * 7 + i), {
        "coin": coin, "px": "104123.5", "sz": "0.01234",
        "side": side, "time": BASE_MS + b as i64 * 70, "startPosition": "-1.5", "dir": "Open Long",
        "closedPnl": "0.0", "hash": format!("0x{tid:064x}"), "oid": 250_000_000_000_u64 + b * 10_000 + i,
        "crossed": side == "A", "fee": "0.578412", "tid": tid, "feeToken": "USDC", "twapId": null
    }])
}

fn order(b: u64, i: u64) -> serde_json::Value {
    json!({
        "time": time_text(BASE_MS + b as i64 * 70), "user": user(b * 3 + i),
        "hash": format!("0x{:064x}", b * 10_000 + i), "builder": null, "status": "open",
        "order": {"coin": "ETH", "side": "A", "limitPx": "2896.9", "sz": "1.25", "oid": 900_000_000_000_u64 + b * 10_000 + i,
            "timestamp": BASE_MS + b as i64 * 70, "triggerCondition": "N/A", "isTrigger": false,
            "triggerPx": "0.0", "children": [], "isPositionTpsl": false, "reduceOnly": false,
            "orderType": "Limit", "origSz": "1.25", "tif": "Alo", "cloid": null}
    })
}

fn by_block(b: u64, events: Vec<serde_json::Value>) -> String {
    let line = json!({"local_time": time_text(BASE_MS + b as i64 * 70 + 3), "block_time": time_text(BASE_MS + b as i64 * 70), "block_number": b, "events": events});
    format!("{line}\n")
}

fn append(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

fn write_block(dir: &Path, b: u64, events: u64) {
    let hour = 10 + (b / 20_000) % 10;
    let fills = (0..events).map(|i| fill(b, i)).collect();
    append(&dir.join(format!("node_fills_by_block/hourly/20250601/{hour}")), &by_block(b, fills));
    let orders = (0..events / 2).map(|i| order(b, i)).collect();
    append(
        &dir.join(format!("node_order_statuses_by_block/hourly/20250601/{hour}")),
        &by_block(b, orders),
    );
}

async fn open_log(path: &Path) -> Arc<dyn StreamLog> {
    let log: Arc<dyn StreamLog> = Arc::new(EmbeddedLog::open(path, Arc::new(SystemClock)).unwrap());
    let config = TopicConfig { partitions: 8, retention: Retention::default() };
    for entity in ENTITIES {
        log.create_topic(&format!("hyperliquid.{entity}"), config).await.unwrap();
    }
    log
}

fn ingester(dir: &Path, log: &Arc<dyn StreamLog>) -> (HyperliquidIngester, Arc<ChainStatus>) {
    let mut config = HyperliquidConfig::new("hyperliquid", dir);
    config.start = FileStart::Earliest;
    let status = HyperliquidIngester::status_for(&config);
    let sink: Arc<dyn ChainSink> = Arc::new(LogPositions::new(log.clone()));
    (HyperliquidIngester::new(config, sink, status.clone()), status)
}

async fn records(log: &Arc<dyn StreamLog>, entity: &str) -> u64 {
    log.offsets(&format!("hyperliquid.{entity}"))
        .await
        .unwrap()
        .iter()
        .map(|r| r.end - r.start)
        .sum()
}

async fn ingest(dir: &Path, log_path: &Path) {
    let log = open_log(log_path).await;
    let (mut ingester, _) = ingester(dir, &log);
    let started = Instant::now();
    let cpu = cpu_seconds();
    while ingester.step().await.unwrap() {}
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    let (fills, orders, trades) =
        (records(&log, "fill").await, records(&log, "order").await, records(&log, "trade").await);
    let events = fills + orders;
    println!(
        "{}",
        json!({"tool": "sluice-hyperliquid", "events": events, "records": events + trades, "seconds": seconds,
               "events_per_s": (events as f64 / seconds).round(), "cpu_seconds": cpu,
               "events_per_cpu_s": (events as f64 / cpu).round(), "fills": fills, "orders": orders, "trades": trades})
    );
}

/// The highest `block_number` at each partition's tail of the fill stream.
async fn visible_block(log: &Arc<dyn StreamLog>) -> u64 {
    let positions = LogPositions::new(log.clone());
    positions.last_block_of_topic("hyperliquid.fill").await.unwrap().unwrap_or(0)
}

async fn lag(dir: &Path, log_path: &Path, seconds: u64, per_second: u64, events: u64) {
    let log = open_log(log_path).await;
    let (ingester, _) = ingester(dir, &log);
    let task = tokio::spawn(ingester.run());
    let written: Arc<Mutex<Vec<Instant>>> = Arc::new(Mutex::new(vec![Instant::now()]));
    let blocks = seconds * per_second;
    let writer = {
        let (dir, written) = (dir.to_owned(), written.clone());
        std::thread::spawn(move || {
            let every = Duration::from_secs_f64(1.0 / per_second as f64);
            let start = Instant::now();
            for b in 1..=blocks {
                let due = start + every * u32::try_from(b).unwrap();
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                write_block(&dir, b, events);
                written.lock().unwrap().push(Instant::now());
            }
        })
    };
    let mut seen = 0u64;
    let mut lags = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(seconds + 30);
    while seen < blocks && Instant::now() < deadline {
        let now_visible = visible_block(&log).await;
        let now = Instant::now();
        if now_visible > seen {
            let times = written.lock().unwrap();
            for b in seen + 1..=now_visible.min(times.len() as u64 - 1) {
                lags.push(now.duration_since(times[b as usize]).as_secs_f64() * 1000.0);
            }
            seen = now_visible;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    writer.join().unwrap();
    task.abort();
    lags.sort_by(f64::total_cmp);
    let pick = |q: f64| lags[((lags.len() as f64 * q) as usize).min(lags.len() - 1)];
    println!(
        "{}",
        json!({"tool": "sluice-hyperliquid-lag", "blocks": lags.len(), "events_per_block": events * 3 / 2,
               "blocks_per_s": per_second, "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": lags.last()})
    );
}

fn message(i: u64) -> String {
    let [user, fill] =
        <[serde_json::Value; 2]>::try_from(fill(i / 1_000, i % 1_000).as_array().unwrap().clone())
            .unwrap();
    let mut payload = fill;
    payload["user"] = user;
    json!({"payload": payload}).to_string()
}

async fn produce(brokers: &str, topic: &str, n: u64) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let new = NewTopic::new(topic, 4, TopicReplication::Fixed(1));
    admin.create_topics([&new], &AdminOptions::new()).await.unwrap();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap();
    let mut pending = Vec::new();
    for i in 0..n {
        let (key, value) = (i.to_string(), message(i));
        pending.push(
            producer
                .send_result(FutureRecord::to(topic).key(&key).payload(&value))
                .map_err(|_| ())
                .unwrap(),
        );
        if pending.len() >= 50_000 {
            for delivery in pending.drain(..) {
                delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
            }
        }
    }
    for delivery in pending {
        delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
}

async fn source(brokers: &str, topic: &str, n: u64, log_path: &Path) {
    let log = open_log(log_path).await;
    let config = KafkaSourceConfig {
        name: "bench".to_owned(),
        chain: "hyperliquid".to_owned(),
        entity: "fill".to_owned(),
        bootstrap_servers: brokers.to_owned(),
        topic: topic.to_owned(),
        group_id: format!("bench-{}", std::process::id()),
        client: Default::default(),
        max_batch: 5_000,
    };
    let sink: Arc<dyn ChainSink> = Arc::new(LogPositions::new(log.clone()));
    let mut source = KafkaSource::new(config, sink, log.clone()).unwrap();
    let status = source.status();
    let started = Instant::now();
    let cpu = cpu_seconds();
    let mut read = 0;
    while read < n {
        read += source.step().await.unwrap() as u64;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    let records = status.records.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "{}",
        json!({"tool": "sluice-kafka-source", "messages": read, "records": records, "seconds": seconds, "per_s": (read as f64 / seconds).round(), "cpu_seconds": cpu, "per_cpu_s": (read as f64 / cpu).round()})
    );
}

fn raw(brokers: &str, topic: &str, n: u64) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("raw-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        .create()
        .unwrap();
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let mut list = TopicPartitionList::new();
    for partition in metadata.topics()[0].partitions() {
        list.add_partition_offset(topic, partition.id(), Offset::Beginning).unwrap();
    }
    consumer.assign(&list).unwrap();
    let started = Instant::now();
    let cpu = cpu_seconds();
    let (mut read, mut bytes) = (0u64, 0usize);
    while read < n {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            bytes += message.unwrap().payload().map_or(0, <[u8]>::len);
            read += 1;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    println!(
        "{}",
        json!({"tool": "raw-librdkafka", "messages": read, "bytes": bytes, "seconds": seconds, "per_s": (read as f64 / seconds).round(), "cpu_seconds": cpu, "per_cpu_s": (read as f64 / cpu).round()})
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let arg = |i: usize| args[i].clone();
    let num = |i: usize| args[i].parse::<u64>().unwrap();
    match args.get(1).map(String::as_str) {
        Some("files") => {
            let dir = Path::new(&args[2]);
            for b in 1..=num(3) {
                write_block(dir, b, num(4));
            }
        }
        Some("ingest") => runtime.block_on(ingest(Path::new(&arg(2)), Path::new(&arg(3)))),
        Some("lag") => {
            // The ingester, the reader and the writer thread: several threads of work.
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(lag(Path::new(&arg(2)), Path::new(&arg(3)), num(4), num(5), num(6)));
        }
        Some("produce") => runtime.block_on(produce(&arg(2), &arg(3), num(4))),
        Some("source") => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(source(&arg(2), &arg(3), num(4), Path::new(&arg(5))));
        }
        Some("raw") => raw(&arg(2), &arg(3), num(4)),
        _ => eprintln!("usage: see the top of examples/hyperliquid_bench.rs"),
    }
}
