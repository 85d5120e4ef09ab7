//! `sluice-columnar` owns the columnar layout of stream records: a table's typed columns,
//! from the stream schemas of `sluice_core::streams` ([`tables`]), the one-pass read of a
//! record's top-level fields ([`fields`]), and the parquet file of rows ([`FileEncoder`],
//! [`encode_file`]).
//! The warehouse (`sluice-backfill`) and the object-storage sink (`sluice-runtime`) write
//! their files with it, so a file of either reads the same. It does no I/O and must not
//! depend on the runtime, the store or the API.

pub mod fields;
pub mod tables;

use std::sync::Arc;

use arrow_array::builder::{
    Float64Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

use fields::Scalar;
use tables::{ColumnKind, KEY_COLUMN, RECORD_COLUMN, Table};

/// Rows per row group: the unit a window skips or reads.
pub const ROW_GROUP_ROWS: usize = 65_536;

/// One row of a file: a stream record with its key and time.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub key: String,
    /// The time column's value, Unix microseconds.
    pub time_us: i64,
    /// The record's JSON text, as the stream carried it.
    pub record: String,
}

/// The block time of a record of `entity`: its time field read alone when it is a top-level
/// field of a flat record (the common case), else the whole record parsed
/// ([`sluice_core::streams::event_time`] knows every shape).
///
/// # Errors
/// What is wrong with the record.
pub fn block_time(
    entity: &str,
    record: &str,
) -> Result<chrono::DateTime<chrono::Utc>, &'static str> {
    use sluice_core::streams::{entity_schema, event_time, time_value};
    if let Some(schema) = entity_schema(entity).filter(|s| s.envelope.is_none()) {
        let value = match fields::fields(record, &[schema.time_field]).pop().flatten() {
            Some(Scalar::Text(text)) => Some(serde_json::Value::String(text.into_owned())),
            Some(Scalar::Int(n)) => Some(serde_json::Value::from(n)),
            _ => None,
        };
        if let Some(time) = value.and_then(|v| time_value(entity, &v)) {
            return Ok(time);
        }
    }
    let Ok(map) = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(record) else {
        return Err("that is not a JSON object");
    };
    event_time(entity, &map).ok_or("without a block time")
}
/// Rows per arrow batch handed to the parquet writer, which gathers them into row groups of
/// [`ROW_GROUP_ROWS`]: a batch copies its rows' text once more, so a small one keeps that copy
/// small.
const WRITE_BATCH_ROWS: usize = 8_192;

/// A parquet file of a table's layout, written as its rows come (in time order). What it holds
/// is the row group being encoded, compressed, and one batch of rows, never the file's rows:
/// a file of a million rows written into a local file takes tens of megabytes, not the
/// hundreds its records' text does.
pub struct FileEncoder<'t, W: std::io::Write + Send> {
    table: &'t Table,
    writer: ArrowWriter<W>,
}

impl<'t, W: std::io::Write + Send> FileEncoder<'t, W> {
    /// A file of `table`'s layout written into `sink`.
    ///
    /// # Errors
    /// A schema parquet cannot write.
    pub fn new(table: &'t Table, sink: W) -> Result<Self, parquet::errors::ParquetError> {
        let mut props = WriterProperties::builder()
            .set_max_row_group_size(ROW_GROUP_ROWS)
            .set_compression(parquet::basic::Compression::SNAPPY);
        // The key and the record are unique per row: a dictionary of them never pays, and
        // min/max statistics of them help no query (scans prune by time).
        for unique in [KEY_COLUMN, RECORD_COLUMN] {
            let column = parquet::schema::types::ColumnPath::from(unique);
            props = props
                .set_column_dictionary_enabled(column.clone(), false)
                .set_column_statistics_enabled(
                    column,
                    parquet::file::properties::EnabledStatistics::None,
                );
        }
        let writer = ArrowWriter::try_new(sink, table.schema.clone(), Some(props.build()))?;
        Ok(Self { table, writer })
    }

    /// Writes `rows`, which follow the rows written before in time.
    ///
    /// # Errors
    /// A row group parquet cannot write.
    pub fn write(&mut self, rows: &[Row]) -> Result<(), parquet::errors::ParquetError> {
        for slice in rows.chunks(WRITE_BATCH_ROWS) {
            self.writer.write(&batch_of(self.table, slice)?)?;
        }
        Ok(())
    }

    /// Ends the file (its last row group and footer) and answers its sink.
    ///
    /// # Errors
    /// A row group or footer parquet cannot write.
    pub fn finish(self) -> Result<W, parquet::errors::ParquetError> {
        self.writer.into_inner()
    }
}

/// `rows` (sorted by time) as the bytes of one parquet file of `table`'s layout.
///
/// # Errors
/// A row group parquet cannot write.
pub fn encode_file(table: &Table, rows: &[Row]) -> Result<Vec<u8>, parquet::errors::ParquetError> {
    // About a fifth of the records' JSON, from the measured 590 → 105 bytes a row: room for
    // the file from the start rather than doubling into it.
    let estimate = rows.iter().map(|r| r.record.len()).sum::<usize>() / 5;
    let mut encoder = FileEncoder::new(table, Vec::with_capacity(estimate))?;
    encoder.write(rows)?;
    encoder.finish()
}

/// The arrow batch of `rows`: every column from the record's JSON.
fn batch_of(table: &Table, rows: &[Row]) -> Result<RecordBatch, arrow_schema::ArrowError> {
    // The record's own fields (not the time, key and record columns, which come from the row).
    let wanted: Vec<&str> = table
        .columns
        .iter()
        .filter(|(name, kind)| {
            *kind != ColumnKind::Time && *name != KEY_COLUMN && *name != RECORD_COLUMN
        })
        .map(|(name, _)| *name)
        .collect();
    // One buffer for every row's fields, `wanted.len()` slots a row.
    let width = wanted.len();
    let mut parsed: Vec<Option<fields::Scalar<'_>>> = vec![None; rows.len() * width];
    if width > 0 {
        for (row, found) in rows.iter().zip(parsed.chunks_exact_mut(width)) {
            fields::fields_into(&row.record, &wanted, found);
        }
    }
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(table.columns.len());
    for (name, kind) in &table.columns {
        let field = wanted.iter().position(|w| w == name);
        let parsed = &parsed;
        let values =
            || (0..rows.len()).map(move |row| field.and_then(|i| parsed[row * width + i].as_ref()));
        let array: ArrayRef = match (*name, kind) {
            (KEY_COLUMN, _) => strings(rows.iter().map(|r| Some(r.key.as_str()))),
            (RECORD_COLUMN, _) => strings(rows.iter().map(|r| Some(r.record.as_str()))),
            (_, ColumnKind::Time) => {
                let mut builder = TimestampMicrosecondBuilder::with_capacity(rows.len());
                for row in rows {
                    builder.append_value(row.time_us);
                }
                Arc::new(builder.finish().with_timezone("UTC"))
            }
            (_, ColumnKind::Int) => {
                let mut builder = Int64Builder::with_capacity(rows.len());
                for value in values() {
                    builder.append_option(value.and_then(fields::Scalar::as_i64));
                }
                Arc::new(builder.finish())
            }
            (_, ColumnKind::Float) => {
                let mut builder = Float64Builder::with_capacity(rows.len());
                for value in values() {
                    builder.append_option(value.and_then(fields::Scalar::as_f64));
                }
                Arc::new(builder.finish())
            }
            (_, ColumnKind::Text) => strings(values().map(|v| v.and_then(fields::Scalar::as_text))),
        };
        arrays.push(array);
    }
    RecordBatch::try_new(table.schema.clone(), arrays)
}

/// A string column of `values`, its buffer sized exactly first: a column of records is
/// hundreds of megabytes, which growing by doubling would copy and fault in twice over.
fn strings<S: AsRef<str>>(values: impl Iterator<Item = Option<S>> + Clone) -> ArrayRef {
    let (count, bytes) = values.clone().fold((0, 0), |(count, bytes), value| {
        (count + 1, bytes + value.map_or(0, |v| v.as_ref().len()))
    });
    let mut builder = StringBuilder::with_capacity(count, bytes);
    for value in values {
        builder.append_option(value);
    }
    Arc::new(builder.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::streams::event_time;

    #[test]
    fn the_block_time_is_read_as_the_full_parse_reads_it() {
        let entity = "erc20_token_transfer";
        for record in [
            r#"{"a": {"deep": [1]}, "block_timestamp": "2026-03-01T10:00:00.5+02:00"}"#,
            r#"{"block_timestamp": "2026-03-01 08:00:00.5", "x": 1}"#,
            r#"{"block_timestamp": "2026-03-01T08:00:00.5Z"}"#,
        ] {
            let map: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(record).unwrap();
            let expected = event_time(entity, &map).unwrap();
            assert_eq!(block_time(entity, record), Ok(expected), "{record}");
            assert_eq!(expected.timestamp_micros(), 1_772_352_000_500_000);
        }
        assert_eq!(block_time(entity, "[1]"), Err("that is not a JSON object"));
        assert_eq!(block_time(entity, r#"{"block_number": 1}"#), Err("without a block time"));
        assert_eq!(
            block_time(entity, r#"{"block_timestamp": "yesterday"}"#),
            Err("without a block time")
        );
    }
}
