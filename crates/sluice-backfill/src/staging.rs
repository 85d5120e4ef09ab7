//! Staged chunks of a backfill job: parquet files of at most `chunk_rows` rows, each row the
//! stream key and the record's JSON (`_key`, `_record`), under `<job_id>/` of the staging
//! storage (`<data dir>/staging`, or `_staging/` beside the warehouse in object storage).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow_array::{Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::properties::WriterProperties;

use crate::storage::Storage;
use crate::tables::{KEY_COLUMN, RECORD_COLUMN, Table};
use crate::warehouse::{Query, Warehouse, WarehouseError, io_at, pq_at};

/// The path of chunk `index` of a job's staging directory `dir`.
pub fn chunk_path(dir: &str, index: u64) -> String {
    format!("{dir}/chunk-{index:06}.parquet")
}

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new(KEY_COLUMN, DataType::Utf8, false),
        Field::new(RECORD_COLUMN, DataType::Utf8, false),
    ]))
}

/// Writes one chunk (durably).
///
/// # Errors
/// When the file cannot be written.
pub fn write_chunk(
    storage: &dyn Storage,
    path: &str,
    rows: &[(String, String)],
) -> Result<(), WarehouseError> {
    let keys = StringArray::from_iter_values(rows.iter().map(|(k, _)| k.as_str()));
    let records = StringArray::from_iter_values(rows.iter().map(|(_, r)| r.as_str()));
    let batch = RecordBatch::try_new(schema(), vec![Arc::new(keys), Arc::new(records)])?;
    let props =
        WriterProperties::builder().set_compression(parquet::basic::Compression::SNAPPY).build();
    let mut writer =
        ArrowWriter::try_new(Vec::new(), schema(), Some(props)).map_err(pq_at(storage, path))?;
    writer.write(&batch).map_err(pq_at(storage, path))?;
    let bytes = writer.into_inner().map_err(pq_at(storage, path))?;
    storage.put(path, bytes).map_err(io_at(storage, path))
}

/// Reads one chunk's rows, in order.
///
/// # Errors
/// When the file cannot be read.
pub fn read_chunk(
    storage: &dyn Storage,
    path: &str,
) -> Result<Vec<(String, String)>, WarehouseError> {
    let Some(bytes) = storage.get(path).map_err(io_at(storage, path))? else {
        return Err(io_at(storage, path)(std::io::ErrorKind::NotFound.into()));
    };
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(pq_at(storage, path))?
        .build()
        .map_err(pq_at(storage, path))?;
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch?;
        let column = |i: usize| batch.column(i).as_any().downcast_ref::<StringArray>().cloned();
        let (Some(keys), Some(records)) = (column(0), column(1)) else {
            return Err(WarehouseError::Arrow(arrow_schema::ArrowError::SchemaError(
                "a chunk without its two text columns".to_owned(),
            )));
        };
        for row in 0..batch.num_rows() {
            if !keys.is_null(row) {
                rows.push((keys.value(row).to_owned(), records.value(row).to_owned()));
            }
        }
    }
    Ok(rows)
}

/// What staging made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Staged {
    pub chunks: u64,
    pub rows: u64,
}

/// Runs the export query of a job into chunks under `dir` of `storage` (emptied first). Stops
/// early, answering `None`, when `cancelled` turns true (checked at each chunk).
///
/// # Errors
/// A warehouse or chunk file that cannot be read or written.
pub fn stage(
    warehouse: &Warehouse,
    table: &Table,
    query: &Query,
    storage: &dyn Storage,
    dir: &str,
    chunk_rows: usize,
    cancelled: &AtomicBool,
) -> Result<Option<Staged>, WarehouseError> {
    storage.delete_prefix(dir).map_err(io_at(storage, dir))?;
    let mut buffer: Vec<(String, String)> = Vec::with_capacity(chunk_rows.min(100_000));
    let mut chunks = 0;
    let mut rows = 0;
    let mut stopped = false;
    warehouse.scan(table, query, |key, record| {
        if stopped {
            return Ok(());
        }
        buffer.push((key.to_owned(), record.to_owned()));
        if buffer.len() == chunk_rows {
            write_chunk(storage, &chunk_path(dir, chunks), &buffer)?;
            chunks += 1;
            rows += buffer.len() as u64;
            buffer.clear();
            stopped = cancelled.load(Ordering::Relaxed);
        }
        Ok(())
    })?;
    if stopped || cancelled.load(Ordering::Relaxed) {
        return Ok(None);
    }
    if !buffer.is_empty() {
        write_chunk(storage, &chunk_path(dir, chunks), &buffer)?;
        chunks += 1;
        rows += buffer.len() as u64;
    }
    Ok(Some(Staged { chunks, rows }))
}
