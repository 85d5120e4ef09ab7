use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use sluice_backfill::archiver::{Archiver, ArchiverSettings};
use sluice_backfill::tables::{self, Table};
use sluice_backfill::warehouse::{Query, Warehouse};
use sluice_bus::forwarding::{Forwarding, Hooks};
use sluice_bus::{EmbeddedLog, NewRecord, Record, Retention, StreamLog, TopicConfig};
use sluice_core::catalog::Catalog;
use sluice_core::clock::ManualClock;

const BASE_US: i64 = 1_767_225_600_000_000; // 2026-01-01T00:00:00Z

fn transfer(n: u64) -> NewRecord {
    let time = chrono::DateTime::from_timestamp_micros(BASE_US + n as i64 * 1_000_000).unwrap();
    let record = serde_json::json!({
        "block_number": n, "block_timestamp": time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "transaction_hash": format!("0x{n:064x}"), "log_index": 0,
        "token_address": "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913",
        "from_address": "0x1111111111111111111111111111111111111111",
        "to_address": "0x2222222222222222222222222222222222222222", "amount_str": "1.5",
    });
    NewRecord::new(format!("0x{n:064x}:0").into_bytes(), record.to_string().into_bytes())
}

async fn stack(dir: &std::path::Path) -> (Arc<dyn StreamLog>, Table) {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let log: Arc<dyn StreamLog> =
        Arc::new(EmbeddedLog::open(&dir.join("log.redb"), clock).unwrap());
    let table = tables::table(&Catalog::default(), "base.assets.erc20_token_transfers").unwrap();
    let config = TopicConfig { partitions: 8, retention: Retention::default() };
    log.create_topic(&table.stream(), config).await.unwrap();
    (log, table)
}

fn keys(warehouse: &Warehouse, table: &Table) -> Vec<String> {
    let query = Query { start_us: i64::MIN, end_us: i64::MAX, filter: None };
    let mut keys = Vec::new();
    warehouse
        .scan(table, &query, |key, _| {
            keys.push(key.to_owned());
            Ok(())
        })
        .unwrap();
    keys.sort();
    keys
}

#[tokio::test]
async fn every_record_is_archived_once_across_restarts_and_appends_in_pieces() {
    let dir = tempfile::tempdir().unwrap();
    let (log, table) = stack(dir.path()).await;
    log.append(&table.stream(), (0..2500).map(transfer).collect()).await.unwrap();
    let settings = ArchiverSettings {
        max_rows_per_append: 1000,
        read_batch: 300,
        ..ArchiverSettings::default()
    };
    let warehouse = Warehouse::open(&dir.path().join("warehouse")).unwrap();
    let archiver = Archiver::new(warehouse.clone(), log.clone(), vec![table.clone()], settings);
    assert_eq!(archiver.drain().await.unwrap(), 2500);
    assert_eq!(archiver.drain().await.unwrap(), 0, "nothing twice");
    assert!(
        warehouse.manifest(&table.name).unwrap().files.len() >= 3,
        "appends of at most 1000 rows"
    );

    // A restart: a new warehouse handle and archiver over the same directory resume from the
    // manifest, not from the (informational) consumer group.
    log.delete_group(sluice_backfill::archiver::ARCHIVER_GROUP).await.unwrap();
    log.append(&table.stream(), (2500..3000).map(transfer).collect()).await.unwrap();
    let warehouse = Warehouse::open(&dir.path().join("warehouse")).unwrap();
    let archiver = Archiver::new(warehouse.clone(), log.clone(), vec![table.clone()], settings);
    assert_eq!(archiver.drain().await.unwrap(), 500);
    let archived = keys(&warehouse, &table);
    let mut expected: Vec<String> = (0..3000).map(|n| format!("0x{n:064x}:0")).collect();
    expected.sort();
    assert_eq!(archived, expected);
    // The group follows, for lag.
    let committed: u64 = log
        .committed(sluice_backfill::archiver::ARCHIVER_GROUP, &table.stream())
        .await
        .unwrap()
        .values()
        .sum();
    assert_eq!(committed, 3000);

    // Compaction merges the small files of the day, and a restart after it archives only
    // what is new: nothing lost, nothing twice.
    let files = warehouse.manifest(&table.name).unwrap().files.len();
    for from in (3000..5000).step_by(250) {
        log.append(&table.stream(), (from..from + 250).map(transfer).collect()).await.unwrap();
        archiver.drain().await.unwrap();
    }
    assert!(warehouse.manifest(&table.name).unwrap().files.len() >= files + 8);
    let done = archiver.compact().await.unwrap();
    assert!(done.merged >= 8 && done.written == 1, "{done:?}");
    assert_eq!(warehouse.manifest(&table.name).unwrap().files.len(), 1);
    log.append(&table.stream(), (5000..5100).map(transfer).collect()).await.unwrap();
    let warehouse = Warehouse::open(&dir.path().join("warehouse")).unwrap();
    let archiver = Archiver::new(warehouse.clone(), log.clone(), vec![table.clone()], settings);
    assert_eq!(archiver.drain().await.unwrap(), 100);
    let mut expected: Vec<String> = (0..5100).map(|n| format!("0x{n:064x}:0")).collect();
    expected.sort();
    assert_eq!(keys(&warehouse, &table), expected);
}

#[tokio::test]
async fn an_append_gathers_at_most_its_bytes_of_records() {
    let dir = tempfile::tempdir().unwrap();
    let (log, table) = stack(dir.path()).await;
    let records: Vec<NewRecord> = (0..2000).map(transfer).collect();
    let size: usize = records.iter().map(|r| r.value.len()).sum();
    log.append(&table.stream(), records).await.unwrap();
    // A tenth of the records' bytes (about 200 records) an append, read 50 records at a time,
    // so an append passes its bound by less than one read: nine or ten appends, however many
    // rows each may hold.
    let settings = ArchiverSettings {
        max_bytes_per_append: size / 10,
        read_batch: 50,
        ..ArchiverSettings::default()
    };
    let warehouse = Warehouse::open(&dir.path().join("warehouse")).unwrap();
    let archiver = Archiver::new(warehouse.clone(), log.clone(), vec![table.clone()], settings);
    assert_eq!(archiver.drain().await.unwrap(), 2000);
    let manifest = warehouse.manifest(&table.name).unwrap();
    let rows: Vec<u64> = manifest.files.iter().map(|file| file.rows).collect();
    assert!(rows.len() >= 9 && rows.iter().all(|r| *r <= 250), "rows of each append: {rows:?}");
    let mut expected: Vec<String> = (0..2000).map(|n| format!("0x{n:064x}:0")).collect();
    expected.sort();
    assert_eq!(keys(&warehouse, &table), expected, "every record once");
}

/// Rows `warehouse` holds of `table`, once they reach `want` (or after 10 s).
async fn rows_reaching(warehouse: &Warehouse, table: &Table, want: u64) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let rows = warehouse.manifest(&table.name).unwrap().rows();
        if rows >= want || std::time::Instant::now() > deadline {
            return rows;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_busy_stream_is_archived_as_records_wait_not_only_when_the_flush_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let (log, table) = stack(dir.path()).await;
    // A flush an hour; a busy table drained in between once 100 records wait.
    let settings = ArchiverSettings {
        flush_every: std::time::Duration::from_secs(3600),
        flush_records: 100,
        check_every: std::time::Duration::from_millis(20),
        ..ArchiverSettings::default()
    };
    let warehouse = Warehouse::open(&dir.path().join("warehouse")).unwrap();
    let archiver = Archiver::new(warehouse.clone(), log.clone(), vec![table.clone()], settings);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(archiver.run(stopped));
    let append = |range: std::ops::Range<u64>| {
        let (log, topic) = (log.clone(), table.stream());
        async move { log.append(&topic, range.map(transfer).collect()).await.unwrap() }
    };
    append(0..150).await;
    assert_eq!(rows_reaching(&warehouse, &table, 150).await, 150, "150 waiting: drained");
    // Fewer than 100 waiting: they wait for the flush...
    append(150..200).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(warehouse.manifest(&table.name).unwrap().rows(), 150);
    // ...until 100 do.
    append(200..260).await;
    assert_eq!(rows_reaching(&warehouse, &table, 260).await, 260);
    // Stopping flushes the rest: every record once.
    append(260..280).await;
    stop.send(true).unwrap();
    running.await.unwrap();
    let mut expected: Vec<String> = (0..280).map(|n| format!("0x{n:064x}:0")).collect();
    expected.sort();
    assert_eq!(keys(&warehouse, &table), expected);
}

#[tokio::test]
async fn a_record_is_archived_as_the_stream_carried_it_and_typed_columns_filter() {
    let dir = tempfile::tempdir().unwrap();
    let (log, table) = stack(dir.path()).await;
    log.append(&table.stream(), (0..100).map(transfer).collect()).await.unwrap();
    let warehouse = Warehouse::open(&dir.path().join("warehouse")).unwrap();
    Archiver::new(warehouse.clone(), log, vec![table.clone()], ArchiverSettings::default())
        .drain()
        .await
        .unwrap();
    let query = Query {
        start_us: BASE_US + 10_000_000,
        end_us: BASE_US + 20_000_000,
        filter: Some(("block_number".to_owned(), vec!["12".to_owned(), "25".to_owned()])),
    };
    let mut got = Vec::new();
    warehouse
        .scan(&table, &query, |key, record| {
            got.push((key.to_owned(), record.to_owned()));
            Ok(())
        })
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, String::from_utf8(transfer(12).value.to_vec()).unwrap());
}

/// Counts the reads that found nothing (a partition read at its end: on Kafka each waits
/// `fetch_wait_ms`).
#[derive(Default)]
struct EmptyReads(AtomicU32);

impl Hooks for EmptyReads {
    fn after_read(&self, _topic: &str, _partition: u32, records: &[Record]) {
        if records.is_empty() {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[tokio::test]
async fn a_drain_reads_only_partitions_with_something_new() {
    let dir = tempfile::tempdir().unwrap();
    let (inner, table) = stack(dir.path()).await;
    let log = Arc::new(Forwarding::new(inner, EmptyReads::default()));
    // A few records: some of the 8 partitions get none.
    log.append(&table.stream(), (0..3).map(transfer).collect()).await.unwrap();
    let warehouse = Warehouse::open(&dir.path().join("warehouse")).unwrap();
    let archiver = Archiver::new(
        warehouse.clone(),
        log.clone(),
        vec![table.clone()],
        ArchiverSettings::default(),
    );
    assert_eq!(archiver.drain().await.unwrap(), 3);
    assert_eq!(archiver.drain().await.unwrap(), 0);
    log.append(&table.stream(), (3..5).map(transfer).collect()).await.unwrap();
    assert_eq!(archiver.drain().await.unwrap(), 2);
    assert_eq!(keys(&warehouse, &table).len(), 5);
    assert_eq!(log.hooks().0.load(Ordering::SeqCst), 0, "no read found a partition empty");
}
