//! Importing history a user already has into a warehouse table: NDJSON, one stream record
//! per line, checked exactly as the ingest endpoint checks records of the table's entity
//! (a JSON object, its key fields, its block time).
//!
//! Keys are unique per table: a record whose key the table already holds (from the archiver
//! or an earlier import) is counted and skipped, and so is a key repeated within the import,
//! so running the same import twice adds nothing the second time. Rows are appended in
//! pieces of [`IMPORT_PIECE_ROWS`]; an import that fails midway keeps the pieces it
//! appended, and running it again adds only what is missing.

use std::collections::HashSet;
use std::io::BufRead;

use sluice_core::streams::{StreamRecord, event_time};

use crate::tables::Table;
use crate::warehouse::{Query, Row, Warehouse, WarehouseError};

/// Rows per append of an import.
pub const IMPORT_PIECE_ROWS: usize = 500_000;
/// Rejected lines described in a report (the rest are only counted).
pub const MAX_REJECTIONS_SHOWN: usize = 100;

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ImportReport {
    /// Lines read (blank lines are not counted).
    pub read: u64,
    /// Rows added to the table.
    pub imported: u64,
    /// Rows whose key the table (or an earlier line) already had.
    pub already_there: u64,
    /// Lines that are not valid records of the table's entity.
    pub rejected: u64,
    /// The first of them: `(line number, reason)`.
    pub rejections: Vec<(u64, String)>,
}

/// What went wrong importing.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Warehouse(#[from] WarehouseError),
    #[error("reading the input: {0}")]
    Read(#[from] std::io::Error),
}

/// Imports the NDJSON records of `input` into `table`.
///
/// # Errors
/// The input cannot be read, or the warehouse cannot be written; pieces appended before stay.
pub fn import_ndjson(
    warehouse: &Warehouse,
    table: &Table,
    input: impl BufRead,
) -> Result<ImportReport, ImportError> {
    let mut report = ImportReport::default();
    let mut rows: Vec<Row> = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line?;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        report.read += 1;
        let number = index as u64 + 1;
        match StreamRecord::parse(table.entity, text.as_bytes()) {
            Ok(record) => {
                let map: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_slice(record.value()).unwrap_or_default();
                let Some(time) = event_time(table.entity, &map) else {
                    reject(&mut report, number, "no block time".to_owned());
                    continue;
                };
                rows.push(Row {
                    key: record.key().to_owned(),
                    time_us: time.timestamp_micros(),
                    record: text.to_owned(),
                });
            }
            Err(error) => reject(&mut report, number, error.to_string()),
        }
    }
    // Keys already in the table, over the time range the import covers.
    let (Some(min), Some(max)) =
        (rows.iter().map(|r| r.time_us).min(), rows.iter().map(|r| r.time_us).max())
    else {
        return Ok(report);
    };
    let mut seen: HashSet<String> = HashSet::new();
    let query = Query { start_us: min, end_us: max.saturating_add(1), filter: None };
    warehouse.scan(table, &query, |key, _| {
        seen.insert(key.to_owned());
        Ok(())
    })?;
    let before = rows.len();
    rows.retain(|row| seen.insert(row.key.clone()));
    report.already_there = (before - rows.len()) as u64;
    while !rows.is_empty() {
        let rest = rows.split_off(rows.len().min(IMPORT_PIECE_ROWS));
        let piece = std::mem::replace(&mut rows, rest);
        let count = piece.len() as u64;
        warehouse.append(table, piece, &[])?;
        report.imported += count;
    }
    Ok(report)
}

fn reject(report: &mut ImportReport, line: u64, reason: String) {
    report.rejected += 1;
    if report.rejections.len() < MAX_REJECTIONS_SHOWN {
        report.rejections.push((line, reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::catalog::Catalog;

    fn line(n: u64) -> String {
        serde_json::json!({
            "block_number": n, "block_timestamp": format!("2026-01-0{}T00:00:00Z", 1 + n % 3),
            "transaction_hash": format!("0x{n:064x}"), "log_index": 0,
            "token_address": "0xabc", "from_address": "0x1", "to_address": "0x2", "amount_str": "1",
        })
        .to_string()
    }

    #[test]
    fn records_are_checked_counted_and_imported_once() {
        let dir = tempfile::tempdir().unwrap();
        let warehouse = Warehouse::open(dir.path()).unwrap();
        let table =
            crate::tables::table(&Catalog::default(), "base.assets.erc20_token_transfers").unwrap();
        let mut input: Vec<String> = (0..30).map(line).collect();
        input.push(line(5)); // a repeat within the file
        input.push(String::new());
        input.push("{\"block_number\": 1}".to_owned()); // no key
        input.push("not json".to_owned());
        let text = input.join("\n");
        let report = import_ndjson(&warehouse, &table, text.as_bytes()).unwrap();
        assert_eq!(
            (report.read, report.imported, report.already_there, report.rejected),
            (33, 30, 1, 2)
        );
        assert_eq!(report.rejections[0].0, 33);
        assert_eq!(warehouse.manifest(&table.name).unwrap().rows(), 30);
        // Again: nothing new.
        let again = import_ndjson(&warehouse, &table, text.as_bytes()).unwrap();
        assert_eq!((again.imported, again.already_there), (0, 31));
        assert_eq!(warehouse.manifest(&table.name).unwrap().rows(), 30);
    }
}
