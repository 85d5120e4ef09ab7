//! The warehouse and staged chunks in S3-compatible object storage (`SLUICE_TEST_S3_URL`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use sluice_backfill::staging::{chunk_path, read_chunk, stage};
use sluice_backfill::storage::Storage;
use sluice_backfill::tables;
use sluice_backfill::warehouse::{Query, ROW_GROUP_ROWS, Row, Warehouse};
use sluice_core::catalog::Catalog;

const BASE_US: i64 = 1_767_225_600_000_000; // 2026-01-01
const DAY_US: i64 = 86_400_000_000;

fn row(n: i64, time_us: i64) -> Row {
    let record = serde_json::json!({
        "block_number": n, "transaction_hash": format!("0x{n:064x}"), "log_index": 0,
        "block_timestamp": chrono::DateTime::from_timestamp_micros(time_us).unwrap().to_rfc3339(),
        "token_address": if n % 2 == 0 { "0xaaaa" } else { "0xbbbb" },
    });
    Row { key: format!("0x{n:064x}:0"), time_us, record: record.to_string() }
}

#[test]
fn a_table_in_object_storage_commits_by_manifest_and_reads_only_the_window() {
    let storage: Arc<dyn Storage> = Arc::new(crate::s3("wh"));
    let table = tables::table(&Catalog::default(), "base.assets.erc20_token_transfers").unwrap();
    // Two days; the first has more rows than a row group, so its file has several.
    let per_day = ROW_GROUP_ROWS as i64 + 5_000;
    let step = DAY_US / per_day;
    let rows: Vec<Row> = (0..2 * per_day)
        .map(|n| row(n, BASE_US + (n % per_day) * step + (n / per_day) * DAY_US))
        .collect();
    {
        let warehouse = Warehouse::open_storage(storage.clone()).unwrap();
        warehouse.append(&table, rows, &[(0, 7)]).unwrap();
    }
    let objects = storage.list("").unwrap();
    assert!(objects.contains(&format!("{}/_manifest.json", table.name)), "{objects:?}");
    assert_eq!(objects.iter().filter(|o| o.ends_with(".parquet")).count(), 2, "a file a day");

    // A file an older append left (its version is the manifest's) goes when the warehouse
    // opens; one of a newer append (another process writing now) stays.
    let old = format!("{}/date=2026-01-01/part-00000001-0009.parquet", table.name);
    let newer = format!("{}/date=2026-01-01/part-00000002-0000.parquet", table.name);
    storage.put(&old, b"stale".to_vec()).unwrap();
    storage.put(&newer, b"in flight".to_vec()).unwrap();
    let warehouse = Warehouse::open_storage(storage.clone()).unwrap();
    assert_eq!(storage.get(&old).unwrap(), None);
    assert!(storage.get(&newer).unwrap().is_some());
    let manifest = warehouse.manifest(&table.name).unwrap();
    assert_eq!((manifest.rows(), manifest.offsets[&0]), (2 * per_day as u64, 7));

    // The last hour of day one: one file, its last row group; the start is in, the end out.
    let start = BASE_US + (per_day - 100) * step;
    let query = Query { start_us: start, end_us: BASE_US + (per_day - 10) * step, filter: None };
    let mut keys = Vec::new();
    let stats = warehouse
        .scan(&table, &query, |key, _| {
            keys.push(key.to_owned());
            Ok(())
        })
        .unwrap();
    assert_eq!(keys.len(), 90);
    assert_eq!(keys[0], format!("0x{:064x}:0", per_day - 100));
    assert_eq!((stats.files_read, stats.files_skipped), (1, 1));
    assert_eq!((stats.row_groups_read, stats.row_groups_skipped), (1, 1));

    // Staged chunks live beside it and go with their job.
    let staging = crate::s3("wh").child("_staging").unwrap();
    let query = Query {
        start_us: BASE_US,
        end_us: BASE_US + 2 * DAY_US,
        filter: Some(("token_address".to_owned(), vec!["0xAAAA".to_owned()])),
    };
    let staged =
        stage(&warehouse, &table, &query, &staging, "job-1", 50_000, &AtomicBool::new(false), None)
            .unwrap()
            .unwrap();
    assert_eq!((staged.rows, staged.chunks), (per_day as u64, 2));
    let first = read_chunk(&staging, &chunk_path("job-1", 0)).unwrap();
    assert_eq!(first.len(), 50_000);
    assert_eq!(first[0].0, format!("0x{:064x}:0", 0));
    assert_eq!(staging.list("job-1").unwrap().len(), 2);
    staging.delete_prefix("job-1").unwrap();
    assert!(staging.list("job-1").unwrap().is_empty());
    assert!(read_chunk(&staging, &chunk_path("job-1", 0)).is_err());
}

#[test]
fn a_warehouse_url_that_is_not_s3_is_refused_with_its_reason() {
    let error = sluice_backfill::storage::ObjectStorage::from_url("gs://bucket/x").unwrap_err();
    assert!(error.to_string().contains("expected s3://bucket[/prefix]"), "{error}");
}
