//! The warehouse: per table, parquet files partitioned by the day of `block_timestamp`
//! (`<table>/date=YYYY-MM-DD/part-<version>-<n>.parquet`), rows sorted by time inside a file and
//! written in row groups of [`ROW_GROUP_ROWS`], so a window reads only the files and row groups
//! whose time range meets it. The files live in a [`Storage`]: a local directory (the embedded
//! default) or S3-compatible object storage.
//!
//! Each table has a manifest (`<table>/_manifest.json`): the files that belong to it and the
//! source offsets archived so far. An append writes its files durably, then replaces the
//! manifest atomically. The manifest is the commit: a file it does not list (left by a crash
//! between the two steps) is not part of the table and is deleted when the warehouse opens; the
//! archiver resumes from the manifest's offsets, so a restart neither loses nor duplicates
//! rows.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex};

use arrow_array::{
    Array, ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::file::metadata::RowGroupMetaData;
use parquet::file::statistics::Statistics;
use serde::{Deserialize, Serialize};

use crate::storage::{LocalStorage, ObjectReader, Storage};

mod compaction;
use crate::tables::{ColumnKind, KEY_COLUMN, RECORD_COLUMN, TIME_COLUMN, Table};
pub use compaction::{
    COMPACT_MIN_FILES, COMPACTED_FILE_ROWS, Compacted, RETIRE_AFTER_US, Retired, SMALL_FILE_ROWS,
};
use sluice_columnar::FileEncoder;
pub use sluice_columnar::{ROW_GROUP_ROWS, Row};

const MANIFEST: &str = "_manifest.json";

/// How a file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fetch {
    /// The column chunks it reads fetched first, from object storage in as few requests as
    /// can be (a scan).
    Ahead,
    /// Each page as it is reached, in small batches: a merge holds a batch of every file it
    /// merges, and no more of any.
    AsRead,
}

impl Fetch {
    fn batch_rows(self) -> usize {
        match self {
            Fetch::Ahead => 8_192,
            Fetch::AsRead => 1_024,
        }
    }
}

/// What can go wrong with the warehouse.
#[derive(Debug, thiserror::Error)]
pub enum WarehouseError {
    #[error("warehouse file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parquet file {path}: {source}")]
    Parquet {
        path: String,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("manifest of {table} cannot be read: {detail}")]
    Manifest { table: String, detail: String },
    #[error(
        "the warehouse {0} is in use by another process (a running server); stop it, or import through it"
    )]
    InUse(String),
}

type Result<T, E = WarehouseError> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WarehouseError + '_ {
    move |source| WarehouseError::Io { path: path.display().to_string(), source }
}

/// The error of `path` of `storage`.
pub(crate) fn io_at(
    storage: &dyn Storage,
    path: &str,
) -> impl FnOnce(std::io::Error) -> WarehouseError {
    let path = storage.location(path);
    move |source| WarehouseError::Io { path, source }
}

/// The parquet error of `path` of `storage`.
pub(crate) fn pq_at(
    storage: &dyn Storage,
    path: &str,
) -> impl FnOnce(parquet::errors::ParquetError) -> WarehouseError {
    let path = storage.location(path);
    move |source| WarehouseError::Parquet { path, source }
}

/// One file of a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative to the table's directory.
    pub path: String,
    pub rows: u64,
    /// Smallest and largest `block_timestamp`, Unix microseconds.
    pub min_time_us: i64,
    pub max_time_us: i64,
    pub bytes: u64,
}

/// A table's manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Grows with every append.
    pub version: u64,
    pub files: Vec<FileEntry>,
    /// The next source offset to archive, per partition of the table's stream.
    pub offsets: BTreeMap<u32, u64>,
    /// Files a compaction merged away, waiting to be deleted.
    #[serde(default)]
    pub retired: Vec<Retired>,
}

impl Manifest {
    pub fn rows(&self) -> u64 {
        self.files.iter().map(|f| f.rows).sum()
    }

    /// `(min, max)` `block_timestamp` over the files, Unix microseconds.
    pub fn time_range(&self) -> Option<(i64, i64)> {
        let min = self.files.iter().map(|f| f.min_time_us).min()?;
        let max = self.files.iter().map(|f| f.max_time_us).max()?;
        Some((min, max))
    }
}

/// What a scan reads.
#[derive(Debug, Clone)]
pub struct Query {
    /// Inclusive, Unix microseconds.
    pub start_us: i64,
    /// Exclusive.
    pub end_us: i64,
    /// `column IN values`: text columns compare lowercased (addresses and hashes are
    /// lowercase in the streams), integer columns by value.
    pub filter: Option<(String, Vec<String>)>,
}

/// What a scan did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanStats {
    pub files_read: usize,
    pub files_skipped: usize,
    pub row_groups_read: usize,
    pub row_groups_skipped: usize,
    pub rows_matched: u64,
}

/// The warehouse in one storage.
#[derive(Debug, Clone)]
pub struct Warehouse {
    storage: Arc<dyn Storage>,
    manifests: Arc<Mutex<HashMap<String, Manifest>>>,
    /// Appends of this process, one at a time (the archiver and imports share a handle).
    appending: Arc<Mutex<()>>,
    /// The directory's lock, held while this handle lives ([`Warehouse::open_exclusive`]).
    _lock: Option<Arc<File>>,
}

impl Warehouse {
    /// Opens (creating) the warehouse in the directory `root`, deleting files no manifest
    /// lists.
    ///
    /// # Errors
    /// When the directory cannot be made or read, or a manifest does not parse.
    pub fn open(root: &Path) -> Result<Self> {
        let storage = LocalStorage::new(root).map_err(io(root))?;
        Self::opened(Arc::new(storage), None)
    }

    /// [`Warehouse::open`], holding the directory's lock (`.lock`, `flock`) for as long as the
    /// handle (or a clone) lives: one process at a time appends to a warehouse.
    ///
    /// # Errors
    /// [`WarehouseError::InUse`] when another process holds it; as [`Warehouse::open`].
    pub fn open_exclusive(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root).map_err(io(root))?;
        let path = root.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|_| WarehouseError::InUse(root.display().to_string()))?;
        let storage = LocalStorage::new(root).map_err(io(root))?;
        Self::opened(Arc::new(storage), Some(Arc::new(file)))
    }

    /// Opens the warehouse in `storage` (object storage, typically). Files no manifest lists
    /// are deleted only when an append of an older version left them: another process may be
    /// writing the newer ones.
    ///
    /// # Errors
    /// When the storage cannot be listed, or a manifest does not parse.
    pub fn open_storage(storage: Arc<dyn Storage>) -> Result<Self> {
        Self::opened(storage, None)
    }

    /// Where the warehouse keeps its files.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    fn opened(storage: Arc<dyn Storage>, lock: Option<Arc<File>>) -> Result<Self> {
        let sweep_all = lock.is_some() || storage.local_path("").is_some();
        let warehouse =
            Self { storage, manifests: Arc::default(), appending: Arc::default(), _lock: lock };
        let objects = warehouse.storage.list("").map_err(io_at(&*warehouse.storage, ""))?;
        let mut by_table: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for object in &objects {
            if let Some((table, rest)) = object.split_once('/') {
                if !table.starts_with(['_', '.']) {
                    by_table.entry(table).or_default().push(rest);
                }
            }
        }
        for (table, files) in by_table {
            let manifest = warehouse.manifest(table)?;
            warehouse.remove_unlisted(table, &manifest, &files, sweep_all)?;
        }
        Ok(warehouse)
    }

    /// The manifest of `table` (empty when the table has no files yet).
    ///
    /// # Errors
    /// A manifest that cannot be read.
    pub fn manifest(&self, table: &str) -> Result<Manifest> {
        if let Some(found) = self.manifests.lock().expect("not poisoned").get(table) {
            return Ok(found.clone());
        }
        let path = format!("{table}/{MANIFEST}");
        let manifest = match self.storage.get(&path).map_err(io_at(&*self.storage, &path))? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|error| {
                WarehouseError::Manifest { table: table.to_owned(), detail: error.to_string() }
            })?,
            None => Manifest::default(),
        };
        self.manifests.lock().expect("not poisoned").insert(table.to_owned(), manifest.clone());
        Ok(manifest)
    }

    /// Deletes the files of `table` its manifest does not list: every one when this process
    /// owns the warehouse, else those an older append left.
    fn remove_unlisted(
        &self,
        table: &str,
        manifest: &Manifest,
        files: &[&str],
        sweep_all: bool,
    ) -> Result<()> {
        let listed: HashSet<&str> = manifest
            .files
            .iter()
            .map(|f| f.path.as_str())
            .chain(manifest.retired.iter().map(|r| r.path.as_str()))
            .collect();
        for file in files {
            if *file == MANIFEST || listed.contains(file) {
                continue;
            }
            let old = version_of(file).is_some_and(|version| version <= manifest.version);
            if sweep_all || old {
                tracing::warn!(
                    table,
                    file,
                    "removing a warehouse file no manifest lists (left by a crash)"
                );
                let path = format!("{table}/{file}");
                self.storage.delete(&path).map_err(io_at(&*self.storage, &path))?;
            }
        }
        Ok(())
    }

    /// Appends `rows` to `table` and records `offsets` as archived, in one manifest commit.
    /// Rows are split by day and sorted by time; each day gets a new file.
    ///
    /// # Errors
    /// A file or the manifest that cannot be written; nothing is committed then.
    pub fn append(
        &self,
        table: &Table,
        mut rows: Vec<Row>,
        offsets: &[(u32, u64)],
    ) -> Result<Manifest> {
        let _one_at_a_time = self.appending.lock().expect("not poisoned");
        let mut manifest = self.manifest(&table.name)?;
        manifest.version += 1;
        rows.sort_by(|a, b| a.time_us.cmp(&b.time_us).then_with(|| a.key.cmp(&b.key)));
        let mut start = 0;
        let mut n = 0;
        while start < rows.len() {
            let day_number = rows[start].time_us.div_euclid(DAY_US);
            let end = rows[start..]
                .iter()
                .position(|r| r.time_us.div_euclid(DAY_US) != day_number)
                .map_or(rows.len(), |p| start + p);
            let day = day_of(rows[start].time_us);
            let relative = format!("date={day}/part-{:08}-{n:04}.parquet", manifest.version);
            let path = format!("{}/{relative}", table.name);
            let day_rows = &rows[start..end];
            let bytes = self.write_file(table, &path, |file| {
                file.write(day_rows).map_err(pq_at(&*self.storage, &path))
            })?;
            manifest.files.push(FileEntry {
                path: relative,
                rows: (end - start) as u64,
                min_time_us: rows[start].time_us,
                max_time_us: rows[end - 1].time_us,
                bytes,
            });
            start = end;
            n += 1;
        }
        for (partition, next) in offsets {
            let at = manifest.offsets.entry(*partition).or_default();
            *at = (*at).max(*next);
        }
        self.commit(&table.name, &manifest)?;
        Ok(manifest)
    }

    /// Writes the parquet file `path` of `table` with the rows `fill` writes (in time order)
    /// into the encoder it is given, straight into storage ([`Storage::put_with`]); answers
    /// the file's length. Nothing is written when `fill` fails, and its error is answered.
    fn write_file(
        &self,
        table: &Table,
        path: &str,
        mut fill: impl FnMut(&mut FileEncoder<'_, &mut (dyn std::io::Write + Send)>) -> Result<()>,
    ) -> Result<u64> {
        let mut failed = None;
        let written = self.storage.put_with(path, &mut |sink| {
            let outcome = (|| {
                let mut file =
                    FileEncoder::new(table, sink).map_err(pq_at(&*self.storage, path))?;
                fill(&mut file)?;
                file.finish().map_err(pq_at(&*self.storage, path))?;
                Ok(())
            })();
            outcome.map_err(|error: WarehouseError| {
                failed = Some(error);
                std::io::Error::other("the file's rows could not be written")
            })
        });
        match (written, failed) {
            (Ok(length), _) => Ok(length),
            (Err(_), Some(error)) => Err(error),
            (Err(error), None) => Err(io_at(&*self.storage, path)(error)),
        }
    }

    fn commit(&self, table: &str, manifest: &Manifest) -> Result<()> {
        let path = format!("{table}/{MANIFEST}");
        let text = serde_json::to_vec(manifest).expect("a manifest serializes");
        self.storage.put(&path, text).map_err(io_at(&*self.storage, &path))?;
        self.manifests.lock().expect("not poisoned").insert(table.to_owned(), manifest.clone());
        Ok(())
    }

    /// Calls `on_row(key, record)` for every row of `table` in `query`'s window and filter,
    /// in file order (time order within a file). Files and row groups whose time range misses
    /// the window are not read.
    ///
    /// # Errors
    /// A file that cannot be read.
    pub fn scan(
        &self,
        table: &Table,
        query: &Query,
        mut on_row: impl FnMut(&str, &str) -> Result<()>,
    ) -> Result<ScanStats> {
        let manifest = self.manifest(&table.name)?;
        let mut stats = ScanStats::default();
        let filter = query.filter.as_ref().map(|(column, values)| {
            let kind = table.column(column).unwrap_or(ColumnKind::Text);
            let set: HashSet<String> = values.iter().map(|v| v.to_lowercase()).collect();
            (column.clone(), kind, set)
        });
        let time_index = table
            .columns
            .iter()
            .position(|(n, _)| *n == TIME_COLUMN)
            .expect("every table has a time column");
        for entry in &manifest.files {
            if entry.max_time_us < query.start_us || entry.min_time_us >= query.end_us {
                stats.files_skipped += 1;
                continue;
            }
            stats.files_read += 1;
            let meets = |group: &RowGroupMetaData| match group.column(time_index).statistics() {
                Some(Statistics::Int64(s)) => match (s.min_opt(), s.max_opt()) {
                    (Some(min), Some(max)) => *max >= query.start_us && *min < query.end_us,
                    _ => true,
                },
                _ => true,
            };
            let extra = filter.as_ref().map(|(column, _, _)| column.as_str());
            let (reader, read, skipped) =
                self.read_file(table, entry, meets, extra, Fetch::Ahead)?;
            stats.row_groups_read += read;
            stats.row_groups_skipped += skipped;
            let Some(reader) = reader else { continue };
            for batch in reader {
                let batch = batch?;
                let times = column::<TimestampMicrosecondArray>(&batch, TIME_COLUMN)?;
                let keys = column::<StringArray>(&batch, KEY_COLUMN)?;
                let records = column::<StringArray>(&batch, RECORD_COLUMN)?;
                let filter_column =
                    filter.as_ref().map(|(name, _, _)| batch.column_by_name(name).cloned());
                for row in 0..batch.num_rows() {
                    let time = times.value(row);
                    if time < query.start_us || time >= query.end_us {
                        continue;
                    }
                    if let (Some((_, kind, set)), Some(Some(values))) = (&filter, &filter_column) {
                        if !matches_filter(values, *kind, row, set) {
                            continue;
                        }
                    }
                    stats.rows_matched += 1;
                    on_row(keys.value(row), records.value(row))?;
                }
            }
        }
        Ok(stats)
    }

    /// A reader of one file of `table`: the row groups `meets` keeps, decoding the time, key
    /// and record columns and `extra`, read as `fetch` says. Answers it (`None` when no row
    /// group is kept) with the row groups kept and skipped.
    fn read_file(
        &self,
        table: &Table,
        entry: &FileEntry,
        meets: impl Fn(&RowGroupMetaData) -> bool,
        extra: Option<&str>,
        fetch: Fetch,
    ) -> Result<(Option<ParquetRecordBatchReader>, usize, usize)> {
        let path = format!("{}/{}", table.name, entry.path);
        let file = ObjectReader::open(&self.storage, &path, entry.bytes)
            .map_err(io_at(&*self.storage, &path))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file.clone())
            .map_err(pq_at(&*self.storage, &path))?;
        let metadata = builder.metadata().clone();
        let groups: Vec<usize> = (0..metadata.num_row_groups())
            .filter(|index| meets(metadata.row_group(*index)))
            .collect();
        let skipped = metadata.num_row_groups() - groups.len();
        if groups.is_empty() {
            return Ok((None, 0, skipped));
        }
        let indices: Vec<usize> = table
            .columns
            .iter()
            .enumerate()
            .filter(|(_, (name, _))| {
                [TIME_COLUMN, KEY_COLUMN, RECORD_COLUMN].contains(name) || extra == Some(*name)
            })
            .map(|(i, _)| i)
            .collect();
        let ranges: Vec<_> = groups
            .iter()
            .flat_map(|g| {
                let group = metadata.row_group(*g);
                indices.iter().map(move |c| {
                    let (start, length) = group.column(*c).byte_range();
                    start..start + length
                })
            })
            .collect();
        if fetch == Fetch::Ahead {
            file.prefetch(ranges).map_err(io_at(&*self.storage, &path))?;
        }
        let mask = ProjectionMask::roots(metadata.file_metadata().schema_descr(), indices);
        let read = groups.len();
        let reader = builder
            .with_row_groups(groups)
            .with_projection(mask)
            .with_batch_size(fetch.batch_rows())
            .build()
            .map_err(pq_at(&*self.storage, &path))?;
        Ok((Some(reader), read, skipped))
    }
}

fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> Result<&'a T> {
    batch.column_by_name(name).and_then(|c| c.as_any().downcast_ref::<T>()).ok_or_else(|| {
        WarehouseError::Arrow(arrow_schema::ArrowError::SchemaError(format!(
            "column {name} missing or of another type"
        )))
    })
}

fn matches_filter(values: &ArrayRef, kind: ColumnKind, row: usize, set: &HashSet<String>) -> bool {
    if values.is_null(row) {
        return false;
    }
    match kind {
        ColumnKind::Int => values
            .as_any()
            .downcast_ref::<Int64Array>()
            .is_some_and(|a| set.contains(&a.value(row).to_string())),
        _ => values
            .as_any()
            .downcast_ref::<StringArray>()
            .is_some_and(|a| set.contains(&a.value(row).to_lowercase())),
    }
}

/// Microseconds in a day (UTC days have no leap seconds in Unix time).
const DAY_US: i64 = 86_400_000_000;

/// `YYYY-MM-DD` of a Unix-microsecond time (UTC).
fn day_of(time_us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(time_us)
        .map_or_else(|| "1970-01-01".to_owned(), |t| t.format("%Y-%m-%d").to_string())
}

/// The version in a file name `date=…/part-<version>-<n>.parquet`.
fn version_of(file: &str) -> Option<u64> {
    let name = file.rsplit('/').next()?;
    name.strip_prefix("part-")?.split('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::catalog::Catalog;

    fn transfer(n: u64, time_us: i64, token: &str) -> Row {
        let record = serde_json::json!({
            "block_number": n, "block_timestamp": chrono::DateTime::from_timestamp_micros(time_us).unwrap().to_rfc3339(),
            "transaction_hash": format!("0x{n:064x}"), "log_index": 0, "token_address": token,
            "from_address": "0x1", "to_address": "0x2", "amount_str": "1.5", "amount": 1.5,
        });
        Row { key: format!("0x{n:064x}:0"), time_us, record: record.to_string() }
    }

    const DAY_US: i64 = 86_400_000_000;

    #[test]
    fn a_window_reads_only_what_meets_it_with_the_start_in_and_the_end_out() {
        let dir = tempfile::tempdir().unwrap();
        let warehouse = Warehouse::open(dir.path()).unwrap();
        let table =
            crate::tables::table(&Catalog::default(), "base.assets.erc20_token_transfers").unwrap();
        let base = 1_767_225_600_000_000; // 2026-01-01
        // Three days, one row per minute; every 3rd row USDC.
        let rows: Vec<Row> = (0..3 * 1440)
            .map(|i| {
                transfer(
                    i,
                    base + i as i64 * 60_000_000,
                    if i % 3 == 0 { "0xUSDC" } else { "0xother" },
                )
            })
            .collect();
        warehouse.append(&table, rows, &[(0, 4320)]).unwrap();
        let manifest = warehouse.manifest(&table.name).unwrap();
        assert_eq!(manifest.files.len(), 3, "one file per day");
        assert_eq!(manifest.rows(), 4320);
        assert_eq!(manifest.offsets[&0], 4320);
        // Day two exactly: starts at its first row (included), ends at day three's first (excluded).
        let query = Query { start_us: base + DAY_US, end_us: base + 2 * DAY_US, filter: None };
        let mut keys = Vec::new();
        let stats = warehouse
            .scan(&table, &query, |key, _| {
                keys.push(key.to_owned());
                Ok(())
            })
            .unwrap();
        assert_eq!(keys.len(), 1440);
        assert_eq!(keys[0], format!("0x{:064x}:0", 1440));
        assert_eq!(stats.files_read, 1);
        assert_eq!(stats.files_skipped, 2);
        // A filter on a text column compares lowercased.
        let query = Query {
            start_us: base,
            end_us: base + 3 * DAY_US,
            filter: Some(("token_address".to_owned(), vec!["0xusdc".to_owned()])),
        };
        let stats = warehouse
            .scan(&table, &query, |_, record| {
                assert!(record.contains("0xUSDC"));
                Ok(())
            })
            .unwrap();
        assert_eq!(stats.rows_matched, 1440);
        // An integer column by value.
        let query = Query {
            start_us: base,
            end_us: base + 3 * DAY_US,
            filter: Some(("block_number".to_owned(), vec!["7".to_owned(), "9".to_owned()])),
        };
        assert_eq!(warehouse.scan(&table, &query, |_, _| Ok(())).unwrap().rows_matched, 2);
    }

    #[test]
    fn one_process_at_a_time_holds_the_warehouse() {
        let dir = tempfile::tempdir().unwrap();
        let held = Warehouse::open_exclusive(dir.path()).unwrap();
        assert!(matches!(Warehouse::open_exclusive(dir.path()), Err(WarehouseError::InUse(_))));
        drop(held);
        Warehouse::open_exclusive(dir.path()).unwrap();
    }

    #[test]
    fn files_no_manifest_lists_are_removed_and_the_manifest_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let table = crate::tables::table(&Catalog::default(), "base.dex.trades").unwrap();
        {
            let warehouse = Warehouse::open(dir.path()).unwrap();
            let row = Row {
                key: "k".to_owned(),
                time_us: 1_767_225_600_000_000,
                record: "{}".to_owned(),
            };
            warehouse.append(&table, vec![row], &[(3, 10)]).unwrap();
        }
        // A file written by an append that crashed before its manifest commit.
        let stray = dir.path().join("base.dex.trades/date=2026-01-01/part-00000009-0000.parquet");
        std::fs::write(&stray, b"half").unwrap();
        let warehouse = Warehouse::open(dir.path()).unwrap();
        assert!(!stray.exists());
        let manifest = warehouse.manifest("base.dex.trades").unwrap();
        assert_eq!(manifest.rows(), 1);
        assert_eq!(manifest.offsets[&3], 10);
    }
}
