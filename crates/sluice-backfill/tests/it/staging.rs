//! Staging against a direct filter of the same rows, for random rows, windows and filters, in
//! a local directory and in object storage.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use proptest::prelude::*;
use sluice_backfill::staging::{chunk_path, read_chunk, stage};
use sluice_backfill::storage::{LocalStorage, Storage};
use sluice_backfill::tables;
use sluice_backfill::warehouse::{Query, Row, Warehouse};
use sluice_core::catalog::Catalog;

const BASE_US: i64 = 1_767_225_600_000_000; // 2026-01-01
const HOUR_US: i64 = 3_600_000_000;
const TOKENS: [&str; 3] = ["0xaaaa", "0xBBBB", "0xcccc"];

fn row(n: usize, hour_offset_us: i64, token: usize) -> Row {
    let time_us = BASE_US + hour_offset_us;
    let record = serde_json::json!({
        "n": n, "block_number": n, "transaction_hash": format!("0x{n:064x}"), "log_index": 0,
        "block_timestamp": chrono::DateTime::from_timestamp_micros(time_us).unwrap().to_rfc3339(),
        "token_address": TOKENS[token],
    });
    Row { key: format!("0x{n:064x}:0"), time_us, record: record.to_string() }
}

/// One case: `rows` (hour offset, token) appended in `appends` pieces to the warehouse in
/// `storage`, staged into `staging`.
#[allow(clippy::too_many_arguments)]
fn check(
    warehouse: &Warehouse,
    staging: &dyn Storage,
    rows: &[(i64, usize)],
    start: i64,
    length: i64,
    filter: Option<Vec<usize>>,
    chunk_rows: usize,
    appends: usize,
) -> Result<(), TestCaseError> {
    {
        let table =
            tables::table(&Catalog::default(), "base.assets.erc20_token_transfers").unwrap();
        let rows: Vec<Row> =
            rows.iter().enumerate().map(|(n, (at, token))| row(n, *at, *token)).collect();
        // Several appends: several files per day.
        for (i, part) in rows.chunks(rows.len().div_ceil(appends).max(1)).enumerate() {
            warehouse.append(&table, part.to_vec(), &[(0, i as u64 + 1)]).unwrap();
        }
        let query = Query {
            start_us: BASE_US + start,
            end_us: BASE_US + start + length,
            filter: filter.as_ref().map(|tokens| {
                (
                    "token_address".to_owned(),
                    tokens.iter().map(|t| TOKENS[*t].to_lowercase()).collect(),
                )
            }),
        };
        let staged = stage(
            warehouse,
            &table,
            &query,
            staging,
            "job",
            chunk_rows,
            &AtomicBool::new(false),
            None,
        )
        .unwrap()
        .unwrap();
        let mut keys = BTreeSet::new();
        for index in 0..staged.chunks {
            let chunk = read_chunk(staging, &chunk_path("job", index)).unwrap();
            prop_assert!(!chunk.is_empty() && chunk.len() <= chunk_rows);
            for (key, _) in chunk {
                prop_assert!(keys.insert(key), "a key twice");
            }
        }
        let expected: BTreeSet<String> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.time_us >= query.start_us && r.time_us < query.end_us)
            .filter(|(n, _)| {
                filter.as_ref().is_none_or(|tokens| tokens.contains(&rows_token(n, &rows)))
            })
            .map(|(_, r)| r.key.clone())
            .collect();
        prop_assert_eq!(staged.rows as usize, expected.len());
        prop_assert_eq!(staged.chunks as usize, expected.len().div_ceil(chunk_rows));
        prop_assert_eq!(keys, expected);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn staged_keys_are_exactly_the_rows_in_the_window_and_filter(
        // Up to 400 rows over 3 days (so files and days split), each with a token.
        rows in prop::collection::vec((0..72 * HOUR_US, 0usize..3), 0..400),
        start in 0..80 * HOUR_US,
        length in 1..40 * HOUR_US,
        filter in prop::option::of(prop::collection::vec(0usize..3, 1..3)),
        chunk_rows in 1usize..50,
        appends in 1usize..4,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let warehouse = Warehouse::open(&dir.path().join("w")).unwrap();
        let staging = LocalStorage::new(&dir.path().join("s")).unwrap();
        check(&warehouse, &staging, &rows, start, length, filter, chunk_rows, appends)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn in_object_storage_staged_keys_are_exactly_the_rows_in_the_window_and_filter(
        rows in prop::collection::vec((0..72 * HOUR_US, 0usize..3), 0..400),
        start in 0..80 * HOUR_US,
        length in 1..40 * HOUR_US,
        filter in prop::option::of(prop::collection::vec(0usize..3, 1..3)),
        chunk_rows in 1usize..50,
        appends in 1usize..4,
    ) {
        let storage = crate::s3("warehouse");
        let staging = storage.child("_staging").unwrap();
        let warehouse = Warehouse::open_storage(Arc::new(storage)).unwrap();
        check(&warehouse, &staging, &rows, start, length, filter, chunk_rows, appends)?;
    }
}

/// The token index of row `n` (read back from its record).
fn rows_token(n: &usize, rows: &[Row]) -> usize {
    let record: serde_json::Value = serde_json::from_str(&rows[*n].record).unwrap();
    TOKENS.iter().position(|t| *t == record["token_address"]).unwrap()
}
