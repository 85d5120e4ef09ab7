//! The trade consumer: a round reads at most its batch size from all partitions together,
//! and a backlog spread over several partitions is counted completely, none starved.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{TimeZone, Utc};
use sluice_bus::{
    EmbeddedLog, KafkaLog, KafkaSettings, NewRecord, Retention, StreamLog, TopicConfig,
};
use sluice_core::clock::ManualClock;
use sluice_core::prices::{Granularity, TokenRef};
use sluice_prices::{ConsumerSettings, GROUP, PriceService, PriceSettings, TradeSource};

use crate::memory::Counting;

fn record(n: u64) -> NewRecord {
    let value = serde_json::json!({
        "chain": "base",
        "token_address": "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913",
        "token_decimals": 6,
        "token_amount": "1",
        "usd_amount": "1",
        "block_number": 100 + n,
        "block_timestamp": "2026-11-21T12:00:05Z",
        "transaction_hash": format!("0x{n:064x}"),
        "log_index": 0,
    });
    NewRecord::new(n.to_le_bytes().to_vec(), serde_json::to_vec(&value).unwrap())
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 21, 12, 1, 0).unwrap()))
}

#[tokio::test]
async fn rounds_read_at_most_the_batch_size_from_all_partitions_together() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock();
    let log = Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
    rounds_read_at_most_the_batch_size(dir, clock, log).await;
}

/// The same on the Kafka-API broker `scripts/test` starts (`SLUICE_TEST_KAFKA_URL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_rounds_read_at_most_the_batch_size_from_all_partitions_together() {
    let url = std::env::var("SLUICE_TEST_KAFKA_URL")
        .expect("SLUICE_TEST_KAFKA_URL must name a Kafka-API broker; run scripts/test");
    let mut settings = KafkaSettings::parse(&url).unwrap();
    settings.topic_prefix = format!("prices{}.", uuid::Uuid::new_v4().simple());
    let clock = clock();
    let log = Arc::new(KafkaLog::connect(settings, clock.clone()).await.unwrap());
    rounds_read_at_most_the_batch_size(tempfile::tempdir().unwrap(), clock, log).await;
}

async fn rounds_read_at_most_the_batch_size(
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    log: Arc<dyn StreamLog>,
) {
    let topic = "base.dex_trade";
    log.create_topic(topic, TopicConfig { partitions: 4, retention: Retention::default() })
        .await
        .unwrap();
    log.append(topic, (0..40).map(record).collect()).await.unwrap();
    let backlog: Vec<u64> =
        log.offsets(topic).await.unwrap().iter().map(|range| range.end - range.start).collect();
    assert!(backlog.iter().filter(|n| **n > 0).count() > 1, "{backlog:?}");

    let url = format!("sqlite://{}", dir.path().join("p.db").display());
    let store = Arc::new(Counting {
        inner: sluice_store::open_prices(&url).await.unwrap(),
        history_reads: AtomicUsize::new(0),
        largest_batch: AtomicUsize::new(0),
        trades_applied: AtomicUsize::new(0),
    });
    let service =
        PriceService::start(store.clone(), clock.clone(), PriceSettings::default()).await.unwrap();
    let settings = ConsumerSettings {
        batch_size: 7,
        idle_wait: Duration::from_millis(5),
        idle_wait_max: Duration::from_millis(20),
        retry_wait: Duration::from_millis(5),
    };
    let consumer = sluice_prices::spawn_consumer(
        service.clone(),
        log.clone(),
        vec![(topic.to_owned(), TradeSource::Dex { chain: "base".into() })],
        settings,
    );
    let ends: Vec<u64> = log.offsets(topic).await.unwrap().iter().map(|range| range.end).collect();
    for _ in 0..500 {
        let committed = log.committed(GROUP, topic).await.unwrap();
        let done = ends
            .iter()
            .enumerate()
            .all(|(p, end)| *end == 0 || committed.get(&(p as u32)) == Some(end));
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    consumer.abort();
    assert_eq!(store.largest_batch.load(Ordering::SeqCst), 7);
    let token = TokenRef::new("base", "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913");
    let minute = store.inner.latest_candles(&token, Granularity::M1, 0, 1).await.unwrap();
    assert_eq!(minute[0].1.trade_count, 40);
}

/// Until every partition of `topic` has its end committed by the price group.
async fn all_committed(log: &dyn StreamLog, topic: &str) {
    let ends: Vec<u64> = log.offsets(topic).await.unwrap().iter().map(|range| range.end).collect();
    for _ in 0..1_000 {
        let committed = log.committed(GROUP, topic).await.unwrap();
        if ends
            .iter()
            .enumerate()
            .all(|(p, end)| *end == 0 || committed.get(&(p as u32)) == Some(end))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the trades of {topic} were not all committed");
}

/// Two nodes share the partitions: each reads only its own, every trade is counted once, and
/// when one goes the other takes its partitions over from the group's commit.
#[tokio::test]
async fn nodes_share_the_partitions_and_take_over_from_the_commit_of_one_that_went() {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock();
    let log: Arc<dyn StreamLog> =
        Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
    let topic = "base.dex_trade";
    log.create_topic(topic, TopicConfig { partitions: 4, retention: Retention::default() })
        .await
        .unwrap();
    let owned: Vec<usize> =
        (0..4).map(|p| usize::from(sluice_prices::reads_partition(topic, p, (1, 2)))).collect();
    assert!(owned.contains(&0) && owned.contains(&1), "both nodes own partitions: {owned:?}");

    let url = format!("sqlite://{}", dir.path().join("p.db").display());
    let nodes = Arc::new(AtomicUsize::new(2));
    let mut stores = Vec::new();
    let mut consumers = Vec::new();
    for index in 0..2 {
        let store = Arc::new(Counting {
            inner: sluice_store::open_prices(&url).await.unwrap(),
            history_reads: AtomicUsize::new(0),
            largest_batch: AtomicUsize::new(0),
            trades_applied: AtomicUsize::new(0),
        });
        let service = PriceService::start(store.clone(), clock.clone(), PriceSettings::default())
            .await
            .unwrap();
        let nodes = nodes.clone();
        let share: sluice_prices::Share = Arc::new(move || (index, nodes.load(Ordering::SeqCst)));
        let settings = ConsumerSettings {
            idle_wait: Duration::from_millis(5),
            idle_wait_max: Duration::from_millis(20),
            ..Default::default()
        };
        let streams = vec![(topic.to_owned(), TradeSource::Dex { chain: "base".into() })];
        consumers.push(tokio::spawn(sluice_prices::consume(
            service,
            log.clone(),
            streams,
            settings,
            share,
        )));
        stores.push(store);
    }
    let positions = log.append(topic, (0..40).map(record).collect()).await.unwrap();
    all_committed(log.as_ref(), topic).await;
    let applied: Vec<usize> =
        stores.iter().map(|store| store.trades_applied.load(Ordering::SeqCst)).collect();
    let of_node_1 = positions
        .iter()
        .filter(|at| sluice_prices::reads_partition(topic, at.partition, (1, 2)))
        .count();
    assert_eq!(applied, [40 - of_node_1, of_node_1], "each node counted its partitions only");

    // Node 1 goes; node 0 alone reads every partition from where the group committed.
    consumers.pop().unwrap().abort();
    nodes.store(1, Ordering::SeqCst);
    log.append(topic, (40..80).map(record).collect()).await.unwrap();
    all_committed(log.as_ref(), topic).await;
    assert_eq!(stores[0].trades_applied.load(Ordering::SeqCst), 40 - of_node_1 + 40);
    consumers.pop().unwrap().abort();
    let token = TokenRef::new("base", "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913");
    let minute = stores[0].inner.latest_candles(&token, Granularity::M1, 0, 1).await.unwrap();
    assert_eq!(minute[0].1.trade_count, 80);
}
