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
use crate::transform::RowTransformer;
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

/// Rows given to a job's transforms at a time.
const TRANSFORM_ROWS: usize = 4096;

/// Runs the export query of a job into chunks under `dir` of `storage` (emptied first),
/// through `transform` when the job has transforms (chunks hold its output). Stops early,
/// answering `None`, when `cancelled` turns true (checked at each chunk).
///
/// # Errors
/// A warehouse or chunk file that cannot be read or written.
#[allow(clippy::too_many_arguments)]
pub fn stage(
    warehouse: &Warehouse,
    table: &Table,
    query: &Query,
    storage: &dyn Storage,
    dir: &str,
    chunk_rows: usize,
    cancelled: &AtomicBool,
    mut transform: Option<&mut RowTransformer>,
) -> Result<Option<Staged>, WarehouseError> {
    storage.delete_prefix(dir).map_err(io_at(storage, dir))?;
    let mut chunker = Chunker {
        storage,
        dir,
        chunk_rows,
        buffer: Vec::with_capacity(chunk_rows.min(100_000)),
        chunks: 0,
        rows: 0,
        wrote_since_check: false,
    };
    let mut pending: Vec<(String, String)> = Vec::new();
    let mut stopped = false;
    warehouse.scan(table, query, |key, record| {
        if stopped {
            return Ok(());
        }
        let row = (key.to_owned(), record.to_owned());
        match transform.as_deref_mut() {
            None => chunker.push(row)?,
            Some(transform) => {
                pending.push(row);
                if pending.len() == TRANSFORM_ROWS {
                    for row in transform.apply(&std::mem::take(&mut pending)) {
                        chunker.push(row)?;
                    }
                }
            }
        }
        stopped = chunker.wrote_since_check && cancelled.load(Ordering::Relaxed);
        chunker.wrote_since_check = false;
        Ok(())
    })?;
    if let Some(transform) = transform.filter(|_| !stopped) {
        for row in transform.apply(&pending) {
            chunker.push(row)?;
        }
    }
    if stopped || cancelled.load(Ordering::Relaxed) {
        return Ok(None);
    }
    chunker.finish()?;
    Ok(Some(Staged { chunks: chunker.chunks, rows: chunker.rows }))
}

/// Cuts rows into chunks of `chunk_rows` as they come.
struct Chunker<'a> {
    storage: &'a dyn Storage,
    dir: &'a str,
    chunk_rows: usize,
    buffer: Vec<(String, String)>,
    chunks: u64,
    rows: u64,
    /// Whether a chunk was written since the caller last looked (cancel checks go there).
    wrote_since_check: bool,
}

impl Chunker<'_> {
    fn push(&mut self, row: (String, String)) -> Result<(), WarehouseError> {
        self.buffer.push(row);
        if self.buffer.len() >= self.chunk_rows {
            self.write()?;
        }
        Ok(())
    }

    fn write(&mut self) -> Result<(), WarehouseError> {
        write_chunk(self.storage, &chunk_path(self.dir, self.chunks), &self.buffer)?;
        self.chunks += 1;
        self.rows += self.buffer.len() as u64;
        self.buffer.clear();
        self.wrote_since_check = true;
        Ok(())
    }

    fn finish(&mut self) -> Result<(), WarehouseError> {
        if !self.buffer.is_empty() {
            self.write()?;
        }
        Ok(())
    }
}
