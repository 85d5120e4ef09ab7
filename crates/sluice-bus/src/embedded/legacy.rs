//! Converting a log written before record batches: one entry per record in
//! `records/<topic>` (append time i64, key length u32, key, value), bookkeeping in
//! `partitions` (next offset, bytes, last append time). Each topic is converted in one
//! transaction (a crash leaves every topic either old or new, and the next open finishes),
//! runs of records with consecutive offsets and one append time becoming batches.

use std::collections::HashMap;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use super::{PARTITION_STATE, batches_table, batches_table_name, corrupt};
use crate::Result;
use crate::batch::BatchBuilder;

const OLD_PARTITIONS: TableDefinition<(&str, u32), (u64, u64, i64)> =
    TableDefinition::new("partitions");

type OldRecords<'a> = TableDefinition<'a, (u32, u64), &'static [u8]>;

const OLD_PREFIX: &str = "records/";

/// Converts every topic still stored the old way, then drops the old bookkeeping table.
pub(super) fn convert(db: &Database) -> Result<()> {
    let (topics, old_bookkeeping) = {
        let txn = db.begin_read().map_err(redb::Error::from)?;
        let names: Vec<String> = txn
            .list_tables()
            .map_err(redb::Error::from)?
            .map(|table| table.name().to_owned())
            .collect();
        let topics: Vec<String> =
            names.iter().filter_map(|n| n.strip_prefix(OLD_PREFIX)).map(str::to_owned).collect();
        (topics, names.iter().any(|n| n == OLD_PARTITIONS.name()))
    };
    for topic in &topics {
        convert_topic(db, topic)?;
        tracing::info!(%topic, "stream log topic converted to record batches");
    }
    if old_bookkeeping {
        let txn = db.begin_write().map_err(redb::Error::from)?;
        txn.delete_table(OLD_PARTITIONS).map_err(redb::Error::from)?;
        txn.commit().map_err(redb::Error::from)?;
    }
    Ok(())
}

/// A record as stored before batches: (append time, key, value).
fn decode(stored: &[u8]) -> Option<(i64, &[u8], &[u8])> {
    let timestamp = i64::from_le_bytes(stored.get(..8)?.try_into().ok()?);
    let key_len = u32::from_le_bytes(stored.get(8..12)?.try_into().ok()?) as usize;
    Some((timestamp, stored.get(12..12 + key_len)?, stored.get(12 + key_len..)?))
}

/// A batch being filled: its partition, base offset and append time.
struct Open {
    partition: u32,
    base: u64,
    timestamp_ms: i64,
    builder: BatchBuilder,
}

fn convert_topic(db: &Database, topic: &str) -> Result<()> {
    let old_name = format!("{OLD_PREFIX}{topic}");
    let txn = db.begin_write().map_err(redb::Error::from)?;
    {
        let old = txn.open_table(OldRecords::new(&old_name)).map_err(redb::Error::from)?;
        let new_name = batches_table_name(topic);
        let mut batches = txn.open_table(batches_table(&new_name)).map_err(redb::Error::from)?;
        let mut starts: HashMap<u32, u64> = HashMap::new();
        let mut open: Option<Open> = None;
        for entry in old.iter().map_err(redb::Error::from)? {
            let (key, value) = entry.map_err(redb::Error::from)?;
            let (partition, offset) = key.value();
            let (timestamp_ms, record_key, record_value) = decode(value.value())
                .ok_or_else(|| corrupt(topic, partition, offset, "bad record encoding"))?;
            starts.entry(partition).or_insert(offset);
            let continues = open.as_ref().is_some_and(|o| {
                o.partition == partition
                    && o.timestamp_ms == timestamp_ms
                    && o.base + u64::from(o.builder.count()) == offset
                    && o.builder.fits(record_key.len(), record_value.len())
            });
            if !continues {
                if let Some(done) = open.take() {
                    batches
                        .insert((done.partition, done.base), done.builder.finish().as_slice())
                        .map_err(redb::Error::from)?;
                }
                open = Some(Open {
                    partition,
                    base: offset,
                    timestamp_ms,
                    builder: BatchBuilder::new(timestamp_ms),
                });
            }
            if let Some(open) = open.as_mut() {
                open.builder.push(record_key, record_value);
            }
        }
        if let Some(done) = open {
            batches
                .insert((done.partition, done.base), done.builder.finish().as_slice())
                .map_err(redb::Error::from)?;
        }
        let mut old_partitions = txn.open_table(OLD_PARTITIONS).map_err(redb::Error::from)?;
        let rows: Vec<(u32, (u64, u64, i64))> = old_partitions
            .range((topic, 0)..=(topic, u32::MAX))
            .map_err(redb::Error::from)?
            .map(|entry| entry.map(|(key, row)| (key.value().1, row.value())))
            .collect::<Result<_, _>>()
            .map_err(redb::Error::from)?;
        let mut states = txn.open_table(PARTITION_STATE).map_err(redb::Error::from)?;
        for (partition, (next, bytes, last_timestamp_ms)) in rows {
            let start = starts.get(&partition).copied().unwrap_or(next);
            states
                .insert((topic, partition), (start, next, bytes, last_timestamp_ms))
                .map_err(redb::Error::from)?;
            old_partitions.remove((topic, partition)).map_err(redb::Error::from)?;
        }
    }
    txn.delete_table(OldRecords::new(&old_name)).map_err(redb::Error::from)?;
    txn.commit().map_err(redb::Error::from)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::{TimeZone, Utc};
    use sluice_core::clock::ManualClock;

    use super::*;
    use crate::{EmbeddedLog, NewRecord, OffsetRange, StreamLog};

    /// Writes a log the way the version before batches did: topic `t` of two partitions;
    /// partition 0 holds offsets 2..6 (0 and 1 removed by retention), two appends at
    /// different times; partition 1 was never appended to.
    fn old_log(path: &std::path::Path) {
        let db = Database::create(path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let topics: TableDefinition<&str, &[u8]> = TableDefinition::new("topics");
            let config = br#"{"partitions":2,"max_age_ms":172800000,"max_bytes":null}"#;
            txn.open_table(topics).unwrap().insert("t", &config[..]).unwrap();
            let mut records = txn.open_table(OldRecords::new("records/t")).unwrap();
            let mut bytes = 0;
            for offset in 2..6u64 {
                let timestamp: i64 = if offset < 4 { 1_000 } else { 2_000 };
                let value = format!("v{offset}");
                let mut stored = timestamp.to_le_bytes().to_vec();
                stored.extend_from_slice(&1u32.to_le_bytes());
                stored.extend_from_slice(b"k");
                stored.extend_from_slice(value.as_bytes());
                bytes += stored.len() as u64;
                records.insert((0, offset), stored.as_slice()).unwrap();
            }
            txn.open_table(OLD_PARTITIONS).unwrap().insert(("t", 0), (6, bytes, 2_000)).unwrap();
            let groups: TableDefinition<(&str, &str, u32), u64> = TableDefinition::new("groups");
            txn.open_table(groups).unwrap().insert(("g", "t", 0), 3).unwrap();
        }
        txn.commit().unwrap();
    }

    #[tokio::test]
    async fn a_log_from_before_batches_is_converted_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.redb");
        old_log(&path);
        let clock = Arc::new(ManualClock::new(Utc.timestamp_millis_opt(5_000).unwrap()));
        let log = EmbeddedLog::open(&path, clock.clone()).unwrap();
        assert_eq!(
            log.offsets("t").await.unwrap(),
            vec![OffsetRange { start: 2, end: 6 }, OffsetRange { start: 0, end: 0 }]
        );
        let records = log.read("t", 0, 0, 10).await.unwrap();
        let read: Vec<_> =
            records.iter().map(|r| (r.offset, r.timestamp_ms, r.value.to_vec())).collect();
        assert_eq!(
            read,
            vec![
                (2, 1_000, b"v2".to_vec()),
                (3, 1_000, b"v3".to_vec()),
                (4, 2_000, b"v4".to_vec()),
                (5, 2_000, b"v5".to_vec())
            ]
        );
        assert_eq!(log.offset_for_time("t", 0, 1_500).await.unwrap(), 4);
        assert_eq!(log.committed("g", "t").await.unwrap().get(&0), Some(&3));
        // Appends go on from the old end, and the converted log reopens as it is.
        let key = (0..)
            .map(|n| format!("k{n}"))
            .find(|k| crate::partition_for_key(k.as_bytes(), 2) == 0)
            .unwrap();
        let at = log.append("t", vec![NewRecord::new(key, "new")]).await.unwrap();
        assert_eq!((at[0].partition, at[0].offset), (0, 6));
        log.close();
        let log = EmbeddedLog::open(&path, clock).unwrap();
        assert_eq!(log.read("t", 0, 5, 10).await.unwrap().len(), 2);
        log.close();
        let db = Database::open(&path).unwrap();
        let txn = db.begin_read().unwrap();
        let names: Vec<String> = txn.list_tables().unwrap().map(|t| t.name().to_owned()).collect();
        assert!(!names.iter().any(|n| n == "records/t" || n == "partitions"), "{names:?}");
    }
}
