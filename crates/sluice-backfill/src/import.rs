//! Importing history a user already has into a warehouse table: NDJSON, one stream record
//! per line, or parquet ([`parquet_to_ndjson`]: a row's columns become the record's fields),
//! checked exactly as the ingest endpoint checks records of the table's entity (a JSON
//! object, its key fields, its block time).
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

/// Whether `head` (a file's first bytes) starts a parquet file.
pub fn is_parquet(head: &[u8]) -> bool {
    head.starts_with(b"PAR1")
}

/// The rows of a parquet file as NDJSON, one record per row: each column a field of the
/// record (timestamps as RFC 3339 text in UTC, decimals as decimal text, nulls left out). A
/// file of the warehouse or of a staged chunk (a `_record` column) gives back its records as
/// they were.
///
/// # Errors
/// When `file` is not a parquet file, or has a column of a type records cannot carry (lists,
/// structs, maps, binary).
pub fn parquet_to_ndjson(file: bytes::Bytes) -> Result<Vec<u8>, ImportError> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let invalid = |detail: String| {
        ImportError::Read(std::io::Error::new(std::io::ErrorKind::InvalidData, detail))
    };
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|builder| builder.with_batch_size(8192).build())
        .map_err(|error| invalid(format!("not a readable parquet file: {error}")))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|error| invalid(error.to_string()))?;
        let schema = batch.schema();
        if let Some(records) = batch.column_by_name(crate::tables::RECORD_COLUMN) {
            let records = records
                .as_any()
                .downcast_ref::<arrow_array::StringArray>()
                .ok_or_else(|| invalid("a _record column that is not text".to_owned()))?;
            for record in records.iter().flatten() {
                out.extend_from_slice(record.as_bytes());
                out.push(b'\n');
            }
            continue;
        }
        let columns: Vec<(&str, &arrow_array::ArrayRef)> = schema
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(field, column)| (field.name().as_str(), column))
            .filter(|(name, _)| !name.starts_with('_'))
            .collect();
        for row in 0..batch.num_rows() {
            let mut record = serde_json::Map::new();
            for (name, column) in &columns {
                if let Some(value) =
                    json_value(column, row).map_err(|e| invalid(format!("column {name}: {e}")))?
                {
                    record.insert((*name).to_owned(), value);
                }
            }
            serde_json::to_writer(&mut out, &record).expect("a map serializes");
            out.push(b'\n');
        }
    }
    Ok(out)
}

/// The JSON value of `array[row]`; `None` for a null.
fn json_value(
    array: &arrow_array::ArrayRef,
    row: usize,
) -> Result<Option<serde_json::Value>, String> {
    use arrow_array::cast::AsArray as _;
    use arrow_array::types::{
        Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
        UInt32Type, UInt64Type,
    };
    use arrow_schema::{DataType, TimeUnit};
    use serde_json::Value;
    if array.is_null(row) {
        return Ok(None);
    }
    let value = match array.data_type() {
        DataType::Utf8 => Value::from(array.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => Value::from(array.as_string::<i64>().value(row)),
        DataType::Utf8View => Value::from(array.as_string_view().value(row)),
        DataType::Boolean => Value::from(array.as_boolean().value(row)),
        DataType::Int8 => Value::from(array.as_primitive::<Int8Type>().value(row)),
        DataType::Int16 => Value::from(array.as_primitive::<Int16Type>().value(row)),
        DataType::Int32 => Value::from(array.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => Value::from(array.as_primitive::<Int64Type>().value(row)),
        DataType::UInt8 => Value::from(array.as_primitive::<UInt8Type>().value(row)),
        DataType::UInt16 => Value::from(array.as_primitive::<UInt16Type>().value(row)),
        DataType::UInt32 => Value::from(array.as_primitive::<UInt32Type>().value(row)),
        DataType::UInt64 => Value::from(array.as_primitive::<UInt64Type>().value(row)),
        DataType::Float32 => Value::from(f64::from(array.as_primitive::<Float32Type>().value(row))),
        DataType::Float64 => Value::from(array.as_primitive::<Float64Type>().value(row)),
        DataType::Decimal128(_, scale) => {
            let raw = array.as_primitive::<arrow_array::types::Decimal128Type>().value(row);
            Value::from(decimal_text(raw, *scale))
        }
        DataType::Timestamp(unit, _) => {
            let raw = match unit {
                TimeUnit::Second => array
                    .as_primitive::<arrow_array::types::TimestampSecondType>()
                    .value(row)
                    .saturating_mul(1_000_000),
                TimeUnit::Millisecond => array
                    .as_primitive::<arrow_array::types::TimestampMillisecondType>()
                    .value(row)
                    .saturating_mul(1_000),
                TimeUnit::Microsecond => {
                    array.as_primitive::<arrow_array::types::TimestampMicrosecondType>().value(row)
                }
                TimeUnit::Nanosecond => {
                    array.as_primitive::<arrow_array::types::TimestampNanosecondType>().value(row)
                        / 1_000
                }
            };
            let at = chrono::DateTime::from_timestamp_micros(raw)
                .ok_or_else(|| format!("timestamp {raw} out of range"))?;
            Value::from(sluice_core::time::format(at))
        }
        other => return Err(format!("type {other} cannot be a record field")),
    };
    Ok(Some(value))
}

/// `raw` × 10^-`scale` as decimal text.
fn decimal_text(raw: i128, scale: i8) -> String {
    if scale <= 0 {
        return (raw * 10i128.pow(u32::from(scale.unsigned_abs()))).to_string();
    }
    let digits = raw.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    let fraction = fraction.trim_end_matches('0');
    let sign = if raw < 0 { "-" } else { "" };
    if fraction.is_empty() { format!("{sign}{whole}") } else { format!("{sign}{whole}.{fraction}") }
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

    #[test]
    fn a_parquet_file_of_typed_columns_imports_like_its_ndjson() {
        use arrow_array::{
            ArrayRef, Decimal128Array, Int64Array, RecordBatch, StringArray,
            TimestampMillisecondArray,
        };
        use std::sync::Arc;
        let n = 4;
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("block_number", Arc::new(Int64Array::from_iter_values(0..n))),
            (
                "block_timestamp",
                Arc::new(
                    TimestampMillisecondArray::from_iter_values(
                        (0..n).map(|i| 1_767_225_600_000 + i * 1_000),
                    )
                    .with_timezone("UTC"),
                ),
            ),
            (
                "transaction_hash",
                Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("0x{i:064x}")))),
            ),
            ("log_index", Arc::new(Int64Array::from_iter_values((0..n).map(|_| 0)))),
            (
                "token_address",
                Arc::new(StringArray::from(vec![
                    Some("0xabc"),
                    None,
                    Some("0xabc"),
                    Some("0xabc"),
                ])),
            ),
            (
                "amount",
                Arc::new(
                    Decimal128Array::from_iter_values([1_500_000, -25, 0, 10])
                        .with_precision_and_scale(38, 6)
                        .unwrap(),
                ),
            ),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let mut file = Vec::new();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(&mut file, batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        assert!(is_parquet(&file));
        let ndjson = parquet_to_ndjson(bytes::Bytes::from(file)).unwrap();
        let lines: Vec<serde_json::Value> = ndjson
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[1]["block_timestamp"], "2026-01-01T00:00:01.000000Z");
        assert_eq!(lines[0]["amount"], "1.5");
        assert_eq!(lines[1]["amount"], "-0.000025");
        assert_eq!(lines[2]["amount"], "0");
        assert!(lines[1].get("token_address").is_none(), "a null is left out");
        let dir = tempfile::tempdir().unwrap();
        let warehouse = Warehouse::open(dir.path()).unwrap();
        let table =
            crate::tables::table(&Catalog::default(), "base.assets.erc20_token_transfers").unwrap();
        let report = import_ndjson(&warehouse, &table, ndjson.as_slice()).unwrap();
        assert_eq!((report.imported, report.rejected), (4, 0));
        assert!(parquet_to_ndjson(bytes::Bytes::from_static(b"PAR1 not really")).is_err());
    }
}
