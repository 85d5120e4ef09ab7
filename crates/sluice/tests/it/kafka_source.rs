//! `[[sources]]`: a topic of the user's own Kafka cluster feeding a chain stream, against the
//! Kafka-API broker `scripts/test` starts (`SLUICE_TEST_KAFKA_URL`; the tests fail without
//! it): JSON messages become records, a bad message is dead-lettered and counted, and a
//! server killed between reading and committing reads the batch again, losing nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};

use crate::crash::{KEY, send};
use crate::process::{Server, data_dir_args, free_port, sluice};

fn brokers() -> String {
    let url = std::env::var("SLUICE_TEST_KAFKA_URL")
        .expect("SLUICE_TEST_KAFKA_URL must name a Kafka-API broker; run scripts/test");
    url.strip_prefix("kafka://").unwrap().split('?').next().unwrap().to_owned()
}

/// A topic of its own per test, with `partitions`.
async fn topic(name: &str, partitions: i32) -> String {
    let topic = format!("{name}-{}-{}", std::process::id(), free_port());
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let new = NewTopic::new(&topic, partitions, TopicReplication::Fixed(1));
    let results = admin.create_topics([&new], &AdminOptions::new()).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    topic
}

fn fill(tid: u64) -> String {
    json!({"payload": {
        "user": format!("0x{:040x}", tid % 7), "coin": "BTC", "px": "104000.5", "sz": "0.01",
        "side": "B", "time": 1_748_772_000_000_i64 + tid as i64, "startPosition": "0.0",
        "dir": "Open Long", "closedPnl": "0.0", "hash": format!("0x{tid:064x}"), "oid": tid,
        "crossed": true, "fee": "0.1", "tid": tid, "feeToken": "USDC", "twapId": null
    }})
    .to_string()
}

async fn produce(topic: &str, messages: &[String]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let sends = messages.iter().enumerate().map(|(i, message)| {
        let key = i.to_string();
        let producer = &producer;
        async move {
            let record = FutureRecord::to(topic).key(&key).payload(message);
            producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
        }
    });
    futures_util::future::join_all(sends).await;
}

fn serve_command(dir: &Path, port: u16, topic: &str, extra: &str) -> Command {
    let config = dir.join("sluice.toml");
    let table = format!(
        "[[sources]]\nname = \"fills\"\nchain = \"hyperliquid\"\nentity = \"fill\"\n\
         bootstrap_servers = \"{}\"\ntopic = \"{topic}\"\ngroup_id = \"sluice-{topic}\"\n{extra}",
        brokers()
    );
    std::fs::write(&config, table).unwrap();
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(&dir.join("data")))
        .args(["--config", config.to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY);
    command
}

async fn status(client: &reqwest::Client, base: &str) -> Value {
    let (code, body) =
        send(client, reqwest::Method::GET, &format!("{base}/api/v1/chains"), None).await;
    if code != 200 {
        return Value::Null;
    }
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["source"] == "fills")
        .cloned()
        .unwrap_or(Value::Null)
}

async fn wait_for(client: &reqwest::Client, base: &str, records: u64, rejected: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = status(client, base).await;
        if status["records"].as_u64() >= Some(records)
            && status["rejected"].as_u64() >= Some(rejected)
        {
            return status;
        }
        assert!(Instant::now() < deadline, "the source did not read {records} records: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The stopped server's log.
fn open_log(dir: &Path) -> Arc<dyn sluice_bus::StreamLog> {
    let log = sluice_bus::EmbeddedLog::open(
        &dir.join("data/log.redb"),
        Arc::new(sluice_core::clock::SystemClock),
    )
    .unwrap();
    Arc::new(log)
}

/// Every record of `topic` in `log`.
async fn stored(log: &Arc<dyn sluice_bus::StreamLog>, topic: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    if log.topic(topic).await.unwrap().is_none() {
        return out;
    }
    for (partition, range) in (0u32..).zip(log.offsets(topic).await.unwrap()) {
        for record in log.read(topic, partition, range.start, 1_000_000).await.unwrap() {
            let key = String::from_utf8(record.key.to_vec()).unwrap();
            out.push((key, serde_json::from_slice(&record.value).unwrap()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn json_messages_become_records_and_bad_ones_are_dead_lettered_and_counted() {
    let topic = topic("fills", 2).await;
    let mut messages: Vec<String> = (1..=200).map(fill).collect();
    messages.insert(50, "{not json".to_owned());
    messages.insert(120, json!({"payload": {"coin": "BTC", "time": 1}}).to_string());
    messages
        .insert(160, r#"{"payload": {"tid": 9, "tid": 10, "side": "B", "time": 1}}"#.to_owned());
    produce(&topic, &messages).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let server = Server::start(serve_command(dir.path(), port, &topic, "max_batch = 40\n"), port);
    let at = wait_for(&client, &base, 200, 3).await;
    assert_eq!(at["chain"], "hyperliquid");
    assert_eq!(at["entity"], "fill");
    assert_eq!((at["records"].as_u64(), at["rejected"].as_u64()), (Some(200), Some(3)), "{at}");
    let metrics =
        client.get(format!("{base}/metrics")).header("x-api-key", KEY).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    let series = "sluice_source_dead_letters_total{source=\"fills\",chain=\"hyperliquid\",entity=\"fill\"} 3";
    assert!(metrics.contains(series), "{metrics}");
    assert!(server.terminate());

    let log = open_log(dir.path());
    let records = stored(&log, "hyperliquid.fill").await;
    assert_eq!(records.len(), 200, "each message once");
    let by_key: BTreeMap<String, Value> = records.into_iter().collect();
    assert_eq!(by_key.len(), 200);
    let expected: Value = serde_json::from_str(&fill(7)).unwrap();
    assert_eq!(by_key["7:B"], expected, "the message as sent");
    let dead = stored(&log, "_sluice.sources.fills.dead_letters").await;
    assert_eq!(dead.len(), 3, "{dead:?}");
    // The three went to different partitions, which Kafka reads in no fixed order.
    let letter = |sent: &str| {
        let found =
            dead.iter().find(|(_, d)| d["value"].as_str().is_some_and(|v| v.contains(sent)));
        found.map(|(_, d)| d.clone()).unwrap_or_else(|| panic!("no dead letter {sent}: {dead:?}"))
    };
    let not_json = letter("{not json");
    assert_eq!(not_json["value"], "{not json");
    assert!(not_json["error"].as_str().unwrap().contains("invalid JSON"), "{not_json}");
    assert_eq!(not_json["topic"], topic.as_str());
    assert!(not_json["offset"].is_i64());
    let no_tid = letter(r#""coin":"BTC""#);
    assert!(no_tid["error"].as_str().unwrap().contains("tid"), "{no_tid}");
    let twice = letter(r#""tid": 10"#);
    assert!(twice["error"].as_str().unwrap().contains("duplicate key"), "{twice}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_between_reading_and_committing_reads_again_and_loses_nothing() {
    let topic = topic("fills-kill", 3).await;
    let total = 6_000u64;
    let messages: Vec<String> = (1..=total).map(fill).collect();
    produce(&topic, &messages).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    // Small batches, so that kills land between a batch's append and its commit.
    let command = || serve_command(dir.path(), port, &topic, "max_batch = 25\n");
    for stop_at in [300, 700, 1_500] {
        let mut server = Server::start(command(), port);
        wait_for(&client, &base, stop_at, 0).await;
        server.child.kill().unwrap();
        server.child.wait().unwrap();
    }
    let server = Server::start(command(), port);
    // The log already holds what earlier runs wrote: wait for the lag to read 0 and the
    // source to append nothing more for 5 s (the lag is measured once a second, and against
    // this broker one reading can say 0 early, so it alone cannot end the wait).
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut settled: Option<(Instant, Value)> = None;
    loop {
        let at = status(&client, &base).await;
        if at["lag_messages"] != 0
            || settled.as_ref().is_none_or(|(_, seen)| at["records"] != *seen)
        {
            settled = (at["lag_messages"] == 0).then(|| (Instant::now(), at["records"].clone()));
        } else if settled
            .as_ref()
            .is_some_and(|(since, _)| since.elapsed() > Duration::from_secs(5))
        {
            break;
        }
        assert!(Instant::now() < deadline, "the source did not catch up: {at}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(server.terminate());
    let records = stored(&open_log(dir.path()), "hyperliquid.fill").await;
    let mut by_key: BTreeMap<String, usize> = BTreeMap::new();
    for (key, _) in &records {
        *by_key.entry(key.clone()).or_default() += 1;
    }
    let expected: Vec<String> = (1..=total).map(|tid| format!("{tid}:B")).collect();
    assert_eq!(by_key.keys().cloned().collect::<Vec<_>>().len(), expected.len(), "nothing lost");
    assert!(expected.iter().all(|k| by_key.contains_key(k)), "nothing lost");
    // What was read again carries the same key: a consumer sees the redelivery.
    assert!(records.len() >= expected.len());
    eprintln!("{} records for {} messages", records.len(), total);
}
