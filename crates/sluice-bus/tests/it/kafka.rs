//! What only the Kafka log does: several processes on one cluster, and a cluster that is not
//! there.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use sluice_bus::{BusError, KafkaLog, KafkaSettings, NewRecord, StreamLog, TopicConfig};
use sluice_core::clock::ManualClock;

use crate::log::unique_prefix;

async fn two_processes() -> (KafkaLog, KafkaLog) {
    let [one, two] = processes().await;
    (one, two)
}

/// `N` clients of one cluster under one topic prefix, as `N` processes would be.
async fn processes<const N: usize>() -> [KafkaLog; N] {
    let url = std::env::var("SLUICE_TEST_KAFKA_URL")
        .expect("SLUICE_TEST_KAFKA_URL must name a Kafka-API broker; run scripts/test");
    let mut settings = KafkaSettings::parse(&url).unwrap();
    settings.topic_prefix = unique_prefix();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let mut logs = Vec::new();
    for _ in 0..N {
        logs.push(KafkaLog::connect(settings.clone(), clock.clone()).await.unwrap());
    }
    logs.try_into().unwrap_or_else(|_| unreachable!())
}

fn record(key: &str, value: &str) -> NewRecord {
    NewRecord::new(key.to_owned(), value.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_made_by_another_process_wake_watches_and_are_read() {
    let (reader, writer) = two_processes().await;
    let config = TopicConfig { partitions: 2, retention: Default::default() };
    reader.create_topic("base.log", config).await.unwrap();
    assert_eq!(writer.topic("base.log").await.unwrap(), Some(config));
    // The reader has read to the end before anything is there.
    assert!(reader.read("base.log", 0, 0, 10).await.unwrap().is_empty());
    let mut watch = reader.watch("base.log");
    let positions =
        writer.append("base.log", vec![record("k", "1"), record("k", "2")]).await.unwrap();
    let partition = positions[0].partition;
    // Generous timeout: the test checks the wake-up happened, not how fast.
    assert!(
        watch.wait(Duration::from_secs(60)).await,
        "another process's append did not wake the watch"
    );
    let mut read = Vec::new();
    for _ in 0..100 {
        read.extend(reader.read("base.log", partition, read.len() as u64, 10).await.unwrap());
        if read.len() == 2 {
            break;
        }
        watch.wait(Duration::from_millis(200)).await;
    }
    assert_eq!(read.iter().map(|r| &r.value[..]).collect::<Vec<_>>(), [b"1", b"2"]);
    assert_eq!(reader.offsets("base.log").await.unwrap()[partition as usize].end, 2);
    // Offsets committed by one process are the other's.
    writer.commit("g", "base.log", &[(partition, 2)]).await.unwrap();
    assert_eq!(reader.committed("g", "base.log").await.unwrap()[&partition], 2);
}

/// A cursor unused for two seconds is parked (it stops fetching, which at the end of a
/// partition is a long-poll of the broker every `fetch.wait.max.ms`); read on from where it
/// stopped, it finds what another process appended meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_parked_while_unused_reads_on_from_where_it_stopped() {
    let (reader, writer) = two_processes().await;
    let config = TopicConfig { partitions: 1, retention: Default::default() };
    writer.create_topic("t", config).await.unwrap();
    writer.append("t", vec![record("k", "1"), record("k", "2")]).await.unwrap();
    assert_eq!(reader.read("t", 0, 0, 10).await.unwrap().len(), 2);
    assert_eq!(reader.pooled_cursors(), (1, 0));
    let parked = async {
        while reader.pooled_cursors() != (0, 1) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), parked).await.expect("the cursor is parked");

    // Appended elsewhere, with no watch here to learn of it: the read fetches afresh.
    writer.append("t", vec![record("k", "3")]).await.unwrap();
    let read = reader.read("t", 0, 2, 10).await.unwrap();
    assert_eq!(read.iter().map(|r| &r.value[..]).collect::<Vec<_>>(), [b"3"]);
    assert_eq!(reader.pooled_cursors(), (1, 0), "the same cursor, fetching again");
    assert!(reader.read("t", 0, 3, 10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_past_the_end_is_empty_and_does_not_go_back_to_the_start() {
    let (log, _) = two_processes().await;
    let config = TopicConfig { partitions: 1, retention: Default::default() };
    log.create_topic("t", config).await.unwrap();
    log.append("t", vec![record("k", "1"), record("k", "2")]).await.unwrap();
    assert!(log.read("t", 0, 5, 10).await.unwrap().is_empty());
    assert_eq!(log.read("t", 0, 1, 10).await.unwrap()[0].value, &b"2"[..]);
    assert!(log.read("t", 0, 2, 10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_does_not_answer_is_a_clear_error_naming_its_url() {
    // A free port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let settings =
        KafkaSettings::parse(&format!("kafka://127.0.0.1:{port}?sasl.password=hunter2")).unwrap();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let error = KafkaLog::connect(settings, clock).await.unwrap_err();
    let shown = error.to_string();
    assert!(matches!(error, BusError::Unreachable { .. }), "{shown}");
    assert!(shown.contains(&format!("kafka://127.0.0.1:{port}")), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_process_sees_the_exact_ends_of_partitions_two_others_append_to() {
    let [one, two, three] = processes().await;
    let config = TopicConfig { partitions: 8, retention: Default::default() };
    one.create_topic("base.ends", config).await.unwrap();
    // Interleaved appends of different sizes from two producers, as two nodes' workers make.
    let mut total = 0u64;
    for round in 0..20u64 {
        let (first, second) = (round % 5 + 1, (round * 7) % 4 + 1);
        let records = |n: u64, tag: &str| {
            (0..n).map(|i| record(&format!("k{round}{tag}{i}"), "v")).collect::<Vec<_>>()
        };
        one.append("base.ends", records(first, "a")).await.unwrap();
        two.append("base.ends", records(second, "b")).await.unwrap();
        total += first + second;
    }
    // Asked before it read anything: it knows only what the broker answers.
    let ends = three.offsets("base.ends").await.unwrap();
    let mut actual = Vec::new();
    for partition in 0..8 {
        actual.push(three.read("base.ends", partition, 0, 10_000).await.unwrap().len() as u64);
    }
    assert_eq!(actual.iter().sum::<u64>(), total);
    let seen: Vec<u64> = ends.iter().map(|range| range.end).collect();
    assert_eq!(seen, actual, "the ends a third process reads");
}

/// The process's thread count (`Threads:` of /proc/self/status). nextest runs each test in
/// a process of its own, so this counts this test's threads only.
fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|line| line.starts_with("Threads:")).unwrap();
    line["Threads:".len()..].trim().parse().unwrap()
}

/// Commits and reads the offsets of groups `groups`, reads every partition of topics
/// `topics` at several positions at once, and watches those topics (the watches are kept).
async fn use_groups_readers_and_watches(
    log: &KafkaLog,
    groups: std::ops::Range<usize>,
    topics: std::ops::Range<usize>,
    watches: &mut Vec<sluice_bus::AppendWatch>,
) {
    const PARTITIONS: u32 = 4;
    let config = TopicConfig { partitions: PARTITIONS, retention: Default::default() };
    log.create_topic("offsets", config).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for group in groups {
        let log = log.clone();
        tasks.spawn(async move {
            let name = format!("deployment.{group}");
            let offsets = [(0, group as u64), (3, group as u64 + 7)];
            log.commit(&name, "offsets", &offsets).await.unwrap();
            let committed = log.committed(&name, "offsets").await.unwrap();
            assert_eq!(committed.into_iter().collect::<Vec<_>>(), offsets, "{name}");
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    // Every topic gets the same keys, so the partitions' ends are known here.
    let records: Vec<_> = (0..40).map(|i| record(&format!("k{i}"), &i.to_string())).collect();
    let mut ends = [0u64; PARTITIONS as usize];
    for record in &records {
        ends[sluice_bus::partition_for_key(&record.key, PARTITIONS) as usize] += 1;
    }
    for topic in topics.clone() {
        let topic = format!("stream.{topic}");
        log.create_topic(&topic, config).await.unwrap();
        log.append(&topic, records.clone()).await.unwrap();
        watches.push(log.watch(&topic));
    }
    // Readers at the start, in the middle and at the end of every partition, all at once.
    for topic in topics {
        for partition in 0..PARTITIONS {
            let end = ends[partition as usize];
            for from in [0, end / 2, end] {
                let log = log.clone();
                let topic = format!("stream.{topic}");
                tasks.spawn(async move {
                    let read = log.read(&topic, partition, from, 1000).await.unwrap();
                    let offsets: Vec<u64> = read.iter().map(|r| r.offset).collect();
                    assert_eq!(offsets, (from..end).collect::<Vec<_>>(), "{topic}/{partition}");
                });
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// A node commits for every deployment's group, reads many partitions and watches many
/// topics: its librdkafka clients (and so its threads) are a fixed few, whatever the counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_do_not_grow_with_groups_readers_and_watched_topics() {
    let [log] = processes().await;
    let mut watches = Vec::new();
    use_groups_readers_and_watches(&log, 0..20, 0..2, &mut watches).await;
    let few = threads();
    use_groups_readers_and_watches(&log, 20..300, 2..40, &mut watches).await;
    let many = threads();
    // Seen when it fails, or with --no-capture (before the change: 219 and 3,497).
    eprintln!("threads: {few} after 20 groups and 2 topics, {many} after 300 groups and 40 topics");
    assert!(many <= few + 4, "threads grew from {few} to {many}");
    assert!(many <= 48, "{many} threads");
}

/// A deployment torn down (its group deleted) and deployed again commits to a group of the
/// same name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_deleted_is_committed_to_again() {
    let [log] = processes().await;
    let config = TopicConfig { partitions: 2, retention: Default::default() };
    log.create_topic("t", config).await.unwrap();
    log.commit("g", "t", &[(0, 1)]).await.unwrap();
    log.delete_group("g").await.unwrap();
    assert!(log.committed("g", "t").await.unwrap().is_empty());
    log.commit("g", "t", &[(0, 2)]).await.unwrap();
    assert_eq!(log.committed("g", "t").await.unwrap().into_iter().collect::<Vec<_>>(), [(0, 2)]);
}

/// A stream read and watched through the shared clients, deleted and made again under the
/// same name, is read and watched again (the clients that knew it were replaced: librdkafka
/// 2.12.1 crashed in its metadata cache otherwise), and other streams read on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_and_made_again_is_read_and_watched_again() {
    let [log] = processes().await;
    let config = TopicConfig { partitions: 2, retention: Default::default() };
    for topic in ["base.kept", "base.again"] {
        log.create_topic(topic, config).await.unwrap();
        log.append(topic, vec![record("a", "1"), record("b", "2")]).await.unwrap();
    }
    let _kept = log.watch("base.kept");
    let watch = log.watch("base.again");
    for topic in ["base.kept", "base.again"] {
        let read: usize = records_in(&log, topic, config.partitions).await;
        assert_eq!(read, 2, "{topic}");
    }
    drop(watch);
    assert!(log.delete_topic("base.again").await.unwrap());
    log.create_topic("base.again", config).await.unwrap();
    let mut watch = log.watch("base.again");
    log.append("base.again", vec![record("c", "3")]).await.unwrap();
    assert!(watch.wait(Duration::from_secs(60)).await, "the new topic's append woke the watch");
    assert_eq!(records_in(&log, "base.again", config.partitions).await, 1);
    log.append("base.kept", vec![record("d", "4")]).await.unwrap();
    assert_eq!(records_in(&log, "base.kept", config.partitions).await, 3);
}

/// How many records every partition of `topic` holds, read from the start.
async fn records_in(log: &KafkaLog, topic: &str, partitions: u32) -> usize {
    let mut total = 0;
    for partition in 0..partitions {
        total += log.read(topic, partition, 0, 100).await.unwrap().len();
    }
    total
}

/// A private tansu broker (`SLUICE_TEST_TANSU_BIN`, set by `scripts/test`; the test fails
/// without it) listening on `port`, its records in memory; killed when dropped.
struct PrivateBroker(std::process::Child);

impl PrivateBroker {
    fn start(port: u16) -> Self {
        let tansu = std::env::var("SLUICE_TEST_TANSU_BIN")
            .expect("SLUICE_TEST_TANSU_BIN must name a tansu binary; run scripts/test");
        let listener = format!("tcp://127.0.0.1:{port}");
        let child = std::process::Command::new(tansu)
            .args(["broker", "--listener-url", &listener, "--advertised-listener-url", &listener])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let broker = Self(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "tansu did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        broker
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Group offsets are read and written through requests to the group's coordinator.
/// librdkafka 2.12 aborts the process when such a request times out while the coordinator
/// is away and the coordinator then comes back (confluentinc/librdkafka issue 4605): here
/// the calls made during the outage fail as worth retrying, and the process lives on once
/// the broker is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_offset_calls_that_outlast_a_broker_outage_do_not_abort_the_process() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let broker = PrivateBroker::start(port);
    let mut settings = KafkaSettings::parse(&format!("kafka://127.0.0.1:{port}")).unwrap();
    settings.topic_prefix = unique_prefix();
    let log = KafkaLog::connect(settings, Arc::new(ManualClock::new(Utc::now()))).await.unwrap();
    let config = TopicConfig { partitions: 2, retention: Default::default() };
    log.create_topic("base.outage", config).await.unwrap();
    // The coordinator is found and known.
    log.commit("g", "base.outage", &[(0, 1), (1, 2)]).await.unwrap();
    assert_eq!(log.committed("g", "base.outage").await.unwrap().get(&1), Some(&2));

    drop(broker);
    let (read, commit, delete) = tokio::join!(
        log.committed("g", "base.outage"),
        log.commit("g", "base.outage", &[(0, 3)]),
        log.delete_group("g"),
    );
    for outcome in [read.map(|_| ()), commit, delete] {
        let error = outcome.expect_err("the broker is away");
        assert!(error.is_transient(), "{error}");
    }

    let _broker = PrivateBroker::start(port);
    // What waited in librdkafka is sent now; the broker (its records were in memory) answers
    // a read of a group it does not know with no offsets.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match log.committed("g", "base.outage").await {
            Ok(_) => break,
            Err(error) => {
                assert!(std::time::Instant::now() < deadline, "the broker came back: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    log.committed("g", "base.outage").await.unwrap();
}
