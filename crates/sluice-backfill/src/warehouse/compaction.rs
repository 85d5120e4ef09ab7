//! Compaction: the archiver appends a file per day every flush (a minute by default), so a day
//! of a busy table gathers over a thousand small files. Once a day has [`COMPACT_MIN_FILES`]
//! files of fewer than [`SMALL_FILE_ROWS`] rows, they are merged, in time order, into files of
//! up to [`COMPACTED_FILE_ROWS`] rows, in one manifest commit.
//!
//! A merged file leaves the manifest's `files` at that commit but not the storage: it is
//! *retired* and deleted by a compaction at least [`RETIRE_AFTER_US`] later, so a scan that
//! started from the older manifest (a staging job, another process) still finds every file it
//! was told about.

use std::collections::{BTreeMap, HashSet};

use arrow_array::{StringArray, TimestampMicrosecondArray};
use serde::{Deserialize, Serialize};

use parquet::arrow::arrow_reader::ParquetRecordBatchReader;

use super::{Fetch, FileEntry, Result, Row, Warehouse, column, day_of, io_at, pq_at};
use crate::tables::{KEY_COLUMN, RECORD_COLUMN, TIME_COLUMN, Table};

/// A file under this many rows is small.
pub const SMALL_FILE_ROWS: u64 = 262_144;
/// Small files a day gathers before they are merged.
pub const COMPACT_MIN_FILES: usize = 8;
/// Most rows of a merged file.
pub const COMPACTED_FILE_ROWS: u64 = 1_048_576;
/// How long a merged file stays in storage after it left the manifest: one hour.
pub const RETIRE_AFTER_US: i64 = 3_600_000_000;

/// A file that left the manifest and waits to be deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    pub path: String,
    /// When it left the manifest, Unix microseconds.
    pub since_us: i64,
}

/// What a compaction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Files merged (and retired).
    pub merged: usize,
    /// Files the merges wrote.
    pub written: usize,
    /// Retired files deleted.
    pub deleted: usize,
}

impl Warehouse {
    /// Merges the small files of each day of `table`, and deletes files retired at least
    /// [`RETIRE_AFTER_US`] before `now_us`.
    ///
    /// # Errors
    /// A file that cannot be read or written, or the manifest that cannot be committed;
    /// nothing is committed then.
    pub fn compact(&self, table: &Table, now_us: i64) -> Result<Compacted> {
        let _one_at_a_time = self.appending.lock().expect("not poisoned");
        let mut manifest = self.manifest(&table.name)?;
        let mut done = Compacted::default();
        let (due, waiting): (Vec<Retired>, Vec<Retired>) = std::mem::take(&mut manifest.retired)
            .into_iter()
            .partition(|retired| now_us.saturating_sub(retired.since_us) >= RETIRE_AFTER_US);
        manifest.retired = waiting;
        let groups = plan(&manifest.files);
        if groups.is_empty() && due.is_empty() {
            return Ok(done);
        }
        if !groups.is_empty() {
            manifest.version += 1;
            let mut merged: HashSet<usize> = HashSet::new();
            let mut written = Vec::new();
            for (n, group) in groups.iter().enumerate() {
                let entries: Vec<&FileEntry> =
                    group.iter().map(|index| &manifest.files[*index]).collect();
                let Some(file) = self.merge(table, &entries, manifest.version, n)? else {
                    continue;
                };
                written.push(file);
                merged.extend(group.iter().copied());
            }
            let files = std::mem::take(&mut manifest.files);
            for (index, file) in files.into_iter().enumerate() {
                if merged.contains(&index) {
                    manifest.retired.push(Retired { path: file.path, since_us: now_us });
                } else {
                    manifest.files.push(file);
                }
            }
            done.merged = merged.len();
            done.written = written.len();
            manifest.files.extend(written);
            manifest.files.sort_by_key(|f| f.min_time_us);
        }
        self.commit(&table.name, &manifest)?;
        for retired in due {
            let path = format!("{}/{}", table.name, retired.path);
            self.storage.delete(&path).map_err(io_at(&*self.storage, &path))?;
            done.deleted += 1;
        }
        Ok(done)
    }

    /// Merges `files` (each in time order) into one file of commit `version`, the `n`th it
    /// writes, in time order (then key order; rows equal in both keep the order of `files`),
    /// as the rows come: what it holds is a batch of each file and the row group being
    /// written, never the rows. Answers the file written, or `None` when the files hold no
    /// rows (nothing is written then).
    fn merge(
        &self,
        table: &Table,
        files: &[&FileEntry],
        version: u64,
        n: usize,
    ) -> Result<Option<FileEntry>> {
        let mut cursors = Vec::with_capacity(files.len());
        for entry in files {
            if let Some(cursor) = Cursor::open(self, table, entry)? {
                cursors.push(cursor);
            }
        }
        let Some(first) = cursors.iter().map(Cursor::time).min() else { return Ok(None) };
        let relative = format!("date={}/part-{version:08}-{n:04}.parquet", day_of(first));
        let path = format!("{}/{relative}", table.name);
        let (mut rows, mut last) = (0, first);
        let bytes = self.write_file(table, &path, |file| {
            let mut batch = Vec::with_capacity(MERGE_WRITE_ROWS);
            while let Some(next) = earliest(&cursors) {
                let row = cursors[next].row();
                last = row.time_us;
                batch.push(row);
                if !cursors[next].advance()? {
                    cursors.remove(next);
                }
                if batch.len() == MERGE_WRITE_ROWS || cursors.is_empty() {
                    rows += batch.len() as u64;
                    file.write(&batch).map_err(pq_at(&*self.storage, &path))?;
                    batch.clear();
                }
            }
            Ok(())
        })?;
        Ok(Some(FileEntry { path: relative, rows, min_time_us: first, max_time_us: last, bytes }))
    }
}

/// Rows a merge gathers before it writes them.
const MERGE_WRITE_ROWS: usize = 8_192;

/// The index of the cursor whose row comes first (by time, then key; the first of equals).
fn earliest(cursors: &[Cursor]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (index, cursor) in cursors.iter().enumerate() {
        let better = best
            .is_none_or(|b| (cursor.time(), cursor.key()) < (cursors[b].time(), cursors[b].key()));
        if better {
            best = Some(index);
        }
    }
    best
}

/// One file being merged, at a row.
struct Cursor {
    reader: ParquetRecordBatchReader,
    times: TimestampMicrosecondArray,
    keys: StringArray,
    records: StringArray,
    at: usize,
}

impl Cursor {
    /// `entry` of `table` at its first row; `None` when it has none.
    fn open(warehouse: &Warehouse, table: &Table, entry: &FileEntry) -> Result<Option<Self>> {
        let (reader, _, _) = warehouse.read_file(table, entry, |_| true, None, Fetch::AsRead)?;
        let Some(reader) = reader else { return Ok(None) };
        let mut cursor = Self {
            reader,
            times: TimestampMicrosecondArray::from(Vec::<i64>::new()),
            keys: StringArray::from(Vec::<&str>::new()),
            records: StringArray::from(Vec::<&str>::new()),
            at: 0,
        };
        Ok(cursor.next_batch()?.then_some(cursor))
    }

    /// Reads the next batch with rows; false at the file's end.
    fn next_batch(&mut self) -> Result<bool> {
        for batch in self.reader.by_ref() {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            self.times = column::<TimestampMicrosecondArray>(&batch, TIME_COLUMN)?.clone();
            self.keys = column::<StringArray>(&batch, KEY_COLUMN)?.clone();
            self.records = column::<StringArray>(&batch, RECORD_COLUMN)?.clone();
            self.at = 0;
            return Ok(true);
        }
        Ok(false)
    }

    /// Moves to the next row; false at the file's end.
    fn advance(&mut self) -> Result<bool> {
        self.at += 1;
        if self.at < self.times.len() {
            return Ok(true);
        }
        self.next_batch()
    }

    fn time(&self) -> i64 {
        self.times.value(self.at)
    }

    fn key(&self) -> &str {
        self.keys.value(self.at)
    }

    fn row(&self) -> Row {
        Row {
            key: self.key().to_owned(),
            time_us: self.time(),
            record: self.records.value(self.at).to_owned(),
        }
    }
}

/// The merges to make: per day with at least [`COMPACT_MIN_FILES`] small files, those files in
/// time order, cut into groups of up to [`COMPACTED_FILE_ROWS`] rows (groups of one stay).
fn plan(files: &[FileEntry]) -> Vec<Vec<usize>> {
    let mut by_day: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (index, file) in files.iter().enumerate() {
        if file.rows < SMALL_FILE_ROWS {
            let day = file.path.split('/').next().unwrap_or_default();
            by_day.entry(day).or_default().push(index);
        }
    }
    let mut groups = Vec::new();
    for (_, mut small) in by_day {
        if small.len() < COMPACT_MIN_FILES {
            continue;
        }
        small.sort_by_key(|i| files[*i].min_time_us);
        let mut group: Vec<usize> = Vec::new();
        let mut rows = 0;
        for index in small {
            if !group.is_empty() && rows + files[index].rows > COMPACTED_FILE_ROWS {
                groups.push(std::mem::take(&mut group));
                rows = 0;
            }
            rows += files[index].rows;
            group.push(index);
        }
        groups.push(group);
    }
    groups.retain(|g| g.len() > 1);
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::warehouse::Query;
    use sluice_core::catalog::Catalog;

    const BASE_US: i64 = 1_767_225_600_000_000; // 2026-01-01
    const MINUTE_US: i64 = 60_000_000;

    fn row(n: i64) -> Row {
        let time_us = BASE_US + n * MINUTE_US;
        let record = serde_json::json!({"n": n, "block_timestamp": chrono::DateTime::from_timestamp_micros(time_us).unwrap().to_rfc3339()});
        Row { key: format!("k{n:06}"), time_us, record: record.to_string() }
    }

    fn keys(warehouse: &Warehouse, table: &Table, start: i64, end: i64) -> Vec<String> {
        let query = Query {
            start_us: BASE_US + start * MINUTE_US,
            end_us: BASE_US + end * MINUTE_US,
            filter: None,
        };
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

    #[test]
    fn a_day_of_small_files_becomes_one_and_the_old_ones_go_an_hour_later() {
        let dir = tempfile::tempdir().unwrap();
        let warehouse = Warehouse::open(dir.path()).unwrap();
        let table = crate::tables::table(&Catalog::default(), "base.dex.trades").unwrap();
        // Twelve flushes of a day (1,440 minutes), 120 rows each, and one flush of day two.
        for flush in 0..12 {
            let rows = (flush * 120..(flush + 1) * 120).map(row).collect();
            warehouse.append(&table, rows, &[(0, flush as u64 + 1)]).unwrap();
        }
        warehouse.append(&table, (1440..1450).map(row).collect(), &[(0, 13)]).unwrap();
        let before = warehouse.manifest(&table.name).unwrap();
        assert_eq!(before.files.len(), 13);
        let all = keys(&warehouse, &table, 0, 2000);
        let window = keys(&warehouse, &table, 100, 700);

        let now = BASE_US + 2 * 86_400_000_000;
        let done = warehouse.compact(&table, now).unwrap();
        assert_eq!(done, Compacted { merged: 12, written: 1, deleted: 0 });
        let after = warehouse.manifest(&table.name).unwrap();
        assert_eq!(after.files.len(), 2, "day one merged; day two's one file stays");
        assert_eq!(after.rows(), before.rows());
        assert_eq!(after.offsets, before.offsets, "offsets are untouched");
        assert_eq!(after.retired.len(), 12);
        assert_eq!(keys(&warehouse, &table, 0, 2000), all);
        assert_eq!(keys(&warehouse, &table, 100, 700), window);
        // Merged files stay in storage (a scan of the older manifest may read them)...
        let on_disk = || warehouse.storage.list(&table.name).unwrap().len();
        assert_eq!(on_disk(), 1 + 2 + 12, "manifest, two files, twelve retired");
        // ...also across a reopen (retired files are not strays)...
        let warehouse = Warehouse::open(dir.path()).unwrap();
        assert_eq!(on_disk(), 15);
        assert_eq!(warehouse.compact(&table, now + 1).unwrap(), Compacted::default());
        // ...and go an hour later.
        let done = warehouse.compact(&table, now + RETIRE_AFTER_US).unwrap();
        assert_eq!(done.deleted, 12);
        assert_eq!(on_disk(), 3);
        assert_eq!(keys(&warehouse, &table, 0, 2000), all);
        assert!(warehouse.manifest(&table.name).unwrap().retired.is_empty());
    }

    #[test]
    fn a_merge_writes_every_row_once_in_time_then_key_order() {
        let dir = tempfile::tempdir().unwrap();
        let warehouse = Warehouse::open(dir.path()).unwrap();
        let table = crate::tables::table(&Catalog::default(), "base.dex.trades").unwrap();
        let at = |second: i64, key: String| Row {
            record: format!(r#"{{"key": "{key}"}}"#),
            key,
            time_us: BASE_US + second * 1_000_000,
        };
        // Nine files of one day whose times interleave (file f holds the seconds f, f + 9,
        // f + 18, ...), each also holding a row at every ninth second under a key that sorts
        // the files the other way round; several read batches each and several merge batches.
        let mut all = Vec::new();
        for f in 0..9i64 {
            let mut rows: Vec<Row> = (0..1_300)
                .flat_map(|i| {
                    let own = at(f + 9 * i, format!("k{:06}", f + 9 * i));
                    let shared = at(9 * i, format!("s{:02}-{i:06}", 8 - f));
                    [own, shared]
                })
                .collect();
            rows.sort_by(|a, b| (a.time_us, &a.key).cmp(&(b.time_us, &b.key)));
            all.extend(rows.iter().cloned());
            warehouse.append(&table, rows, &[(0, f as u64 + 1)]).unwrap();
        }
        let done = warehouse.compact(&table, BASE_US).unwrap();
        assert_eq!(done, Compacted { merged: 9, written: 1, deleted: 0 });
        let manifest = warehouse.manifest(&table.name).unwrap();
        let [file] = manifest.files.as_slice() else { panic!("{:?}", manifest.files) };
        all.sort_by(|a, b| (a.time_us, &a.key).cmp(&(b.time_us, &b.key)));
        assert_eq!(file.rows, all.len() as u64);
        assert_eq!(
            (file.min_time_us, file.max_time_us),
            (all[0].time_us, all[all.len() - 1].time_us)
        );
        // A scan reads the one file in its order: the rows, each once, sorted.
        let query = Query { start_us: i64::MIN, end_us: i64::MAX, filter: None };
        let mut read = Vec::new();
        warehouse
            .scan(&table, &query, |key, record| {
                read.push((key.to_owned(), record.to_owned()));
                Ok(())
            })
            .unwrap();
        let expected: Vec<(String, String)> = all.into_iter().map(|r| (r.key, r.record)).collect();
        assert_eq!(read.len(), expected.len());
        assert!(read == expected, "the merged file's rows are not the inputs in order");
    }

    #[test]
    fn groups_hold_at_most_the_merged_file_rows_and_big_files_are_left_alone() {
        let file = |rows: u64, at: i64| FileEntry {
            path: "date=2026-01-01/x.parquet".to_owned(),
            rows,
            min_time_us: at,
            max_time_us: at,
            bytes: 1,
        };
        // Seven small files: below the threshold, nothing.
        let files: Vec<FileEntry> = (0..7).map(|i| file(10, i)).collect();
        assert!(plan(&files).is_empty());
        // Ten of 200k rows and one big one: groups of five (1M rows), the big one apart.
        let mut files: Vec<FileEntry> = (0..10).map(|i| file(200_000, i)).collect();
        files.push(file(5_000_000, 99));
        let groups = plan(&files);
        assert_eq!(groups, vec![vec![0, 1, 2, 3, 4], vec![5, 6, 7, 8, 9]]);
    }
}
