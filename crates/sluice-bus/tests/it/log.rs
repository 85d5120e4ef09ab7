use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use proptest::prelude::*;
use sluice_bus::{
    EmbeddedLog, KafkaLog, KafkaSettings, NewRecord, OffsetRange, Retention, StreamLog,
    TopicConfig, partition_for_key,
};
use sluice_core::clock::ManualClock;

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0).unwrap()))
}

fn record(key: &str, value: &str) -> NewRecord {
    NewRecord::new(key.to_owned(), value.to_owned())
}

fn config(partitions: u32) -> TopicConfig {
    TopicConfig { partitions, retention: Retention::default() }
}

/// A log under test, its clock, and what reopening it needs.
pub(crate) struct Fixture {
    pub clock: Arc<ManualClock>,
    pub log: Arc<dyn StreamLog>,
    backend: Backend,
}

enum Backend {
    Embedded { dir: tempfile::TempDir, log: Arc<EmbeddedLog> },
    Kafka(KafkaSettings),
}

impl Fixture {
    /// A fresh embedded log in a temporary directory.
    pub(crate) fn embedded() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock = clock();
        let log = Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap());
        Self { clock, log: log.clone(), backend: Backend::Embedded { dir, log } }
    }

    /// A log on the Kafka-API broker `scripts/test` starts (`SLUICE_TEST_KAFKA_URL`; the
    /// tests fail without it), under a topic prefix of its own so tests never meet.
    pub(crate) async fn kafka() -> Self {
        let url = std::env::var("SLUICE_TEST_KAFKA_URL")
            .expect("SLUICE_TEST_KAFKA_URL must name a Kafka-API broker; run scripts/test");
        let mut settings = KafkaSettings::parse(&url).unwrap();
        settings.topic_prefix = unique_prefix();
        // Kafka brokers apply retention by these timestamps: start at the real time.
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let log = Arc::new(KafkaLog::connect(settings.clone(), clock.clone()).await.unwrap());
        Self { clock, log, backend: Backend::Kafka(settings) }
    }

    /// The same log closed and opened again, as after a restart.
    pub(crate) async fn reopen(self) -> Self {
        let Self { clock, log, backend } = self;
        drop(log);
        match backend {
            Backend::Embedded { dir, log } => {
                let Ok(log) = Arc::try_unwrap(log) else { panic!("another handle is open") };
                log.close();
                let log = Arc::new(
                    EmbeddedLog::open(&dir.path().join("log.redb"), clock.clone()).unwrap(),
                );
                Self { clock, log: log.clone(), backend: Backend::Embedded { dir, log } }
            }
            Backend::Kafka(settings) => {
                let log =
                    Arc::new(KafkaLog::connect(settings.clone(), clock.clone()).await.unwrap());
                Self { clock, log, backend: Backend::Kafka(settings) }
            }
        }
    }
}

/// A topic prefix no other test uses.
pub(crate) fn unique_prefix() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("t{nanos:x}{:x}{n}.", std::process::id())
}

async fn appends_go_to_the_key_partition_in_order_and_read_back_from_any_offset(f: Fixture) {
    f.log.create_topic("base.log", config(4)).await.unwrap();
    let records: Vec<_> = (0..40).map(|i| record(&format!("k{}", i % 5), &i.to_string())).collect();
    let positions = f.log.append("base.log", records).await.unwrap();
    assert_eq!(positions.len(), 40);
    for (i, position) in positions.iter().enumerate() {
        assert_eq!(position.partition, partition_for_key(format!("k{}", i % 5).as_bytes(), 4));
    }
    let offsets = f.log.offsets("base.log").await.unwrap();
    assert_eq!(offsets.iter().map(|r| r.end).sum::<u64>(), 40);
    for partition in 0..4 {
        let all = f.log.read("base.log", partition, 0, 1000).await.unwrap();
        assert_eq!(all.len() as u64, offsets[partition as usize].end);
        // Dense offsets, and each key's values in append order.
        for (expected, record) in all.iter().enumerate() {
            assert_eq!(record.offset, expected as u64);
        }
        let mut last_by_key = std::collections::HashMap::new();
        for record in &all {
            let value: u64 = String::from_utf8_lossy(&record.value).parse().unwrap();
            if let Some(previous) = last_by_key.insert(record.key.clone(), value) {
                assert!(previous < value);
            }
        }
        if all.len() > 2 {
            let tail = f.log.read("base.log", partition, 2, 1).await.unwrap();
            assert_eq!(tail, vec![all[2].clone()]);
        }
    }
}

async fn acknowledged_appends_and_commits_survive_reopening(f: Fixture) {
    f.log.create_topic("t", config(2)).await.unwrap();
    f.log.append("t", vec![record("a", "1"), record("b", "2"), record("a", "3")]).await.unwrap();
    f.log.commit("g", "t", &[(0, 1), (1, 2)]).await.unwrap();
    let before = f.log.offsets("t").await.unwrap();
    let f = f.reopen().await;
    assert_eq!(f.log.offsets("t").await.unwrap(), before);
    assert_eq!(
        f.log.committed("g", "t").await.unwrap().into_iter().collect::<Vec<_>>(),
        vec![(0, 1), (1, 2)]
    );
    // Offsets continue after a reopen; they are never reused.
    let next = f.log.append("t", vec![record("a", "4")]).await.unwrap();
    let partition = partition_for_key(b"a", 2) as usize;
    assert_eq!(next[0].offset, before[partition].end);
}

async fn create_is_idempotent_and_keeps_the_first_configuration(f: Fixture) {
    assert_eq!(f.log.create_topic("t", config(3)).await.unwrap(), config(3));
    assert_eq!(f.log.create_topic("t", config(8)).await.unwrap(), config(3));
    assert_eq!(f.log.topic("t").await.unwrap(), Some(config(3)));
    assert_eq!(f.log.topic("other").await.unwrap(), None);
    assert!(f.log.create_topic("bad name", config(1)).await.is_err());
    assert!(f.log.create_topic("t0", config(0)).await.is_err());
}

async fn unknown_topics_and_partitions_are_errors_and_change_nothing(f: Fixture) {
    f.log.create_topic("t", config(1)).await.unwrap();
    assert!(matches!(
        f.log.append("nope", vec![record("a", "1")]).await,
        Err(sluice_bus::BusError::UnknownTopic(_))
    ));
    assert!(matches!(
        f.log.read("t", 5, 0, 10).await,
        Err(sluice_bus::BusError::UnknownPartition { .. })
    ));
    assert!(f.log.commit("g", "nope", &[(0, 1)]).await.is_err());
    // A failed request in the same commit does not affect a good one.
    let (bad, good) = tokio::join!(
        f.log.append("nope", vec![record("a", "1")]),
        f.log.append("t", vec![record("a", "1")])
    );
    assert!(bad.is_err());
    assert_eq!(good.unwrap().len(), 1);
    assert_eq!(f.log.offsets("t").await.unwrap(), vec![OffsetRange { start: 0, end: 1 }]);
}

async fn deleting_a_topic_removes_its_records_and_group_offsets_only(f: Fixture) {
    f.log.create_topic("a", config(1)).await.unwrap();
    f.log.create_topic("b", config(1)).await.unwrap();
    f.log.append("a", vec![record("k", "1")]).await.unwrap();
    f.log.commit("g", "a", &[(0, 1)]).await.unwrap();
    f.log.commit("g", "b", &[(0, 0)]).await.unwrap();
    assert!(f.log.delete_topic("a").await.unwrap());
    assert!(!f.log.delete_topic("a").await.unwrap());
    assert_eq!(f.log.topic("a").await.unwrap(), None);
    assert!(f.log.committed("g", "a").await.unwrap().is_empty());
    assert_eq!(f.log.committed("g", "b").await.unwrap().len(), 1);
    // A new topic of the same name starts empty.
    f.log.create_topic("a", config(1)).await.unwrap();
    assert_eq!(f.log.offsets("a").await.unwrap(), vec![OffsetRange { start: 0, end: 0 }]);
    f.log.delete_group("g").await.unwrap();
    assert!(f.log.committed("g", "b").await.unwrap().is_empty());
}

// Embedded only: retention is applied by the log itself (a Kafka cluster applies its topics'
// retention.ms / retention.bytes on its own schedule).

#[tokio::test]
async fn retention_removes_records_older_than_the_max_age_and_offsets_stay_dense() {
    let f = Fixture::embedded();
    let retention = Retention { max_age: Duration::from_secs(3600), max_bytes: None };
    f.log.create_topic("t", TopicConfig { partitions: 1, retention }).await.unwrap();
    f.log.append("t", vec![record("k", "old1"), record("k", "old2")]).await.unwrap();
    f.clock.advance(chrono::Duration::minutes(50));
    f.log.append("t", vec![record("k", "new")]).await.unwrap();
    assert_eq!(f.log.enforce_retention().await.unwrap(), 0);
    f.clock.advance(chrono::Duration::minutes(11));
    assert_eq!(f.log.enforce_retention().await.unwrap(), 2);
    assert_eq!(f.log.offsets("t").await.unwrap(), vec![OffsetRange { start: 2, end: 3 }]);
    let from_zero = f.log.read("t", 0, 0, 10).await.unwrap();
    assert_eq!(from_zero.len(), 1);
    assert_eq!(from_zero[0].offset, 2);
    assert_eq!(from_zero[0].value, &b"new"[..]);
}

#[tokio::test]
async fn retention_by_size_drops_the_oldest_records_first() {
    let f = Fixture::embedded();
    let retention = Retention { max_age: Duration::from_secs(3600), max_bytes: Some(100) };
    f.log.create_topic("t", TopicConfig { partitions: 1, retention }).await.unwrap();
    let value = "x".repeat(30); // 12 header + 1 key + 30 value = 43 bytes each
    f.log.append("t", (0..5).map(|_| record("k", &value)).collect()).await.unwrap();
    assert_eq!(f.log.enforce_retention().await.unwrap(), 3);
    assert_eq!(f.log.offsets("t").await.unwrap(), vec![OffsetRange { start: 3, end: 5 }]);
}

#[tokio::test]
async fn retention_by_size_inside_one_append_keeps_its_place_after_a_reopen() {
    let f = Fixture::embedded();
    let retention = Retention { max_age: Duration::from_secs(3600), max_bytes: Some(100) };
    f.log.create_topic("t", TopicConfig { partitions: 1, retention }).await.unwrap();
    let value = "x".repeat(30); // 43 bytes each, as above
    f.log.append("t", (0..5).map(|_| record("k", &value)).collect()).await.unwrap();
    assert_eq!(f.log.enforce_retention().await.unwrap(), 3);
    let f = f.reopen().await;
    assert_eq!(f.log.offsets("t").await.unwrap(), vec![OffsetRange { start: 3, end: 5 }]);
    assert_eq!(f.log.enforce_retention().await.unwrap(), 0);
    let offsets: Vec<u64> =
        f.log.read("t", 0, 0, 10).await.unwrap().iter().map(|r| r.offset).collect();
    assert_eq!(offsets, vec![3, 4]);
    f.log.append("t", vec![record("k", &value)]).await.unwrap();
    assert_eq!(f.log.enforce_retention().await.unwrap(), 1);
    let offsets: Vec<u64> =
        f.log.read("t", 0, 0, 10).await.unwrap().iter().map(|r| r.offset).collect();
    assert_eq!(offsets, vec![4, 5]);
    f.clock.advance(chrono::Duration::minutes(61));
    assert_eq!(f.log.enforce_retention().await.unwrap(), 2);
    assert_eq!(f.log.offsets("t").await.unwrap(), vec![OffsetRange { start: 6, end: 6 }]);
}

async fn seek_by_time_finds_the_first_record_at_or_after_the_time(f: Fixture) {
    f.log.create_topic("t", config(1)).await.unwrap();
    let t0 = f.clock.now_ms();
    for _ in 0..5 {
        f.log.append("t", vec![record("k", "v")]).await.unwrap();
        f.clock.advance(chrono::Duration::seconds(10));
    }
    assert_eq!(f.log.offset_for_time("t", 0, t0 - 1).await.unwrap(), 0);
    assert_eq!(f.log.offset_for_time("t", 0, t0).await.unwrap(), 0);
    assert_eq!(f.log.offset_for_time("t", 0, t0 + 1).await.unwrap(), 1);
    assert_eq!(f.log.offset_for_time("t", 0, t0 + 20_000).await.unwrap(), 2);
    assert_eq!(f.log.offset_for_time("t", 0, t0 + 1_000_000).await.unwrap(), 5);
}

async fn a_watch_wakes_when_its_topic_is_appended_to(f: Fixture) {
    let f = Arc::new(f);
    f.log.create_topic("t", config(1)).await.unwrap();
    let mut watch = f.log.watch("t");
    let writer = f.clone();
    let append = tokio::spawn(async move {
        writer.log.append("t", vec![record("k", "v")]).await.unwrap();
    });
    // Generous timeout: the test checks the wake-up happened, not how fast.
    assert!(watch.wait(Duration::from_secs(60)).await, "the append did not wake the watch");
    append.await.unwrap();
    assert_eq!(f.log.read("t", 0, 0, 10).await.unwrap().len(), 1);
}

trait NowMs {
    fn now_ms(&self) -> i64;
}

impl NowMs for ManualClock {
    fn now_ms(&self) -> i64 {
        sluice_core::clock::Clock::now(self).timestamp_millis()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Whatever the mix of appends and retention, every partition's offsets stay dense from
    /// its start to its end, the end counts every append, and reads return exactly the
    /// retained records in order.
    #[test]
    fn offsets_stay_dense_under_appends_and_retention(
        batches in prop::collection::vec((prop::collection::vec(0u8..6, 1..20), 0u32..3), 1..12)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let f = Fixture::embedded();
            let retention = Retention { max_age: Duration::from_secs(60), max_bytes: Some(400) };
            f.log.create_topic("t", TopicConfig { partitions: 3, retention }).await.unwrap();
            let mut appended = [0u64; 3];
            for (keys, minutes) in batches {
                let records: Vec<_> = keys.iter().map(|k| record(&format!("key{k}"), "value")).collect();
                for position in f.log.append("t", records).await.unwrap() {
                    appended[position.partition as usize] += 1;
                }
                f.clock.advance(chrono::Duration::seconds(i64::from(minutes) * 40));
                f.log.enforce_retention().await.unwrap();
            }
            let offsets = f.log.offsets("t").await.unwrap();
            for partition in 0..3u32 {
                let range = offsets[partition as usize];
                prop_assert_eq!(range.end, appended[partition as usize]);
                let records = f.log.read("t", partition, 0, 10_000).await.unwrap();
                prop_assert_eq!(records.len() as u64, range.end - range.start);
                for (i, record) in records.iter().enumerate() {
                    prop_assert_eq!(record.offset, range.start + i as u64);
                }
            }
            Ok(())
        })?;
    }
}

async fn append_and_commit_writes_records_and_offsets_together_or_not_at_all(f: Fixture) {
    f.log.create_topic("base.src", config(2)).await.unwrap();
    f.log.create_topic("sink.out", config(1)).await.unwrap();
    let out = [record("a", "1"), record("b", "2")];
    f.log.create_topic("dead.out", config(1)).await.unwrap();
    let dead = [record("c", "3")];
    let appends: [(&str, &[NewRecord]); 2] = [("sink.out", &out), ("dead.out", &dead)];
    f.log.append_and_commit(&appends, "g", "base.src", &[(0, 7), (1, 3)]).await.unwrap();
    let sunk = f.log.read("sink.out", 0, 0, 10).await.unwrap();
    assert_eq!(sunk.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(f.log.read("dead.out", 0, 0, 10).await.unwrap()[0].value, &b"3"[..]);
    let committed: Vec<_> = f.log.committed("g", "base.src").await.unwrap().into_iter().collect();
    assert_eq!(committed, vec![(0, 7), (1, 3)]);

    // No records: only the offsets move.
    f.log.append_and_commit(&[("sink.out", &[])], "g", "base.src", &[(0, 9)]).await.unwrap();
    assert_eq!(f.log.committed("g", "base.src").await.unwrap()[&0], 9);
    assert_eq!(f.log.offsets("sink.out").await.unwrap()[0].end, 2);

    // An unknown sink or source topic fails and changes neither the sink nor the offsets.
    let gone = f
        .log
        .append_and_commit(&[("sink.out", &out), ("sink.gone", &out)], "g", "base.src", &[(0, 20)])
        .await;
    assert!(matches!(gone, Err(sluice_bus::BusError::UnknownTopic(t)) if t == "sink.gone"));
    let bad = f.log.append_and_commit(&[("sink.out", &out)], "g", "base.none", &[(0, 20)]).await;
    assert!(matches!(bad, Err(sluice_bus::BusError::UnknownTopic(t)) if t == "base.none"));
    assert_eq!(f.log.committed("g", "base.src").await.unwrap()[&0], 9);
    assert_eq!(f.log.offsets("sink.out").await.unwrap()[0].end, 2);

    // Both survive reopening.
    let f = f.reopen().await;
    assert_eq!(f.log.read("sink.out", 0, 0, 10).await.unwrap().len(), 2);
    assert_eq!(f.log.committed("g", "base.src").await.unwrap()[&1], 3);
}

/// Appends big enough to be stored in several pieces (the embedded log's batches are
/// 256 KiB) read back record by record from any offset, in any slice, and seek by time
/// lands on an append's first record.
async fn big_appends_read_back_exactly_from_any_offset(f: Fixture) {
    f.log.create_topic("t", config(1)).await.unwrap();
    let value = |n: usize| format!("{n:06}-{}", "x".repeat(300));
    let t0 = f.clock.now_ms();
    f.log.append("t", (0..2000).map(|n| record("k", &value(n))).collect()).await.unwrap();
    f.clock.advance(chrono::Duration::seconds(10));
    f.log.append("t", (2000..2500).map(|n| record("k", &value(n))).collect()).await.unwrap();
    for (from, max) in [(0, 2500), (1, 3), (799, 500), (843, 1), (1999, 2), (2499, 10), (2500, 10)]
    {
        let read = f.log.read("t", 0, from, max).await.unwrap();
        let want: Vec<u64> = (from..2500).take(max).collect();
        assert_eq!(read.iter().map(|r| r.offset).collect::<Vec<_>>(), want, "from {from}");
        for r in &read {
            assert_eq!(&r.value[..], value(r.offset as usize).as_bytes());
            assert_eq!(&r.key[..], b"k");
        }
    }
    assert_eq!(f.log.offset_for_time("t", 0, t0 + 1).await.unwrap(), 2000);
    assert_eq!(f.log.offset_for_time("t", 0, t0).await.unwrap(), 0);
}

on_both_logs!(
    big_appends_read_back_exactly_from_any_offset,
    appends_go_to_the_key_partition_in_order_and_read_back_from_any_offset,
    acknowledged_appends_and_commits_survive_reopening,
    create_is_idempotent_and_keeps_the_first_configuration,
    unknown_topics_and_partitions_are_errors_and_change_nothing,
    deleting_a_topic_removes_its_records_and_group_offsets_only,
    seek_by_time_finds_the_first_record_at_or_after_the_time,
    a_watch_wakes_when_its_topic_is_appended_to,
    append_and_commit_writes_records_and_offsets_together_or_not_at_all,
);
