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

use super::{FileEntry, Result, Row, Warehouse, column, day_of, encode_file, io_at, pq_at};
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
                let mut rows = Vec::new();
                for index in group {
                    rows.extend(self.read_rows(table, &manifest.files[*index])?);
                }
                rows.sort_by(|a, b| a.time_us.cmp(&b.time_us).then_with(|| a.key.cmp(&b.key)));
                let (Some(first), Some(last)) = (rows.first(), rows.last()) else { continue };
                let relative = format!(
                    "date={}/part-{:08}-{n:04}.parquet",
                    day_of(first.time_us),
                    manifest.version
                );
                let path = format!("{}/{relative}", table.name);
                let file = encode_file(table, &rows).map_err(pq_at(&*self.storage, &path))?;
                let bytes = file.len() as u64;
                self.storage.put(&path, file).map_err(io_at(&*self.storage, &path))?;
                written.push(FileEntry {
                    path: relative,
                    rows: rows.len() as u64,
                    min_time_us: first.time_us,
                    max_time_us: last.time_us,
                    bytes,
                });
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

    /// Every row of one file of `table`.
    fn read_rows(&self, table: &Table, entry: &FileEntry) -> Result<Vec<Row>> {
        let (reader, _, _) = self.read_file(table, entry, |_| true, None)?;
        let mut rows = Vec::with_capacity(entry.rows as usize);
        for batch in reader.into_iter().flatten() {
            let batch = batch?;
            let times = column::<TimestampMicrosecondArray>(&batch, TIME_COLUMN)?;
            let keys = column::<StringArray>(&batch, KEY_COLUMN)?;
            let records = column::<StringArray>(&batch, RECORD_COLUMN)?;
            for row in 0..batch.num_rows() {
                rows.push(Row {
                    key: keys.value(row).to_owned(),
                    time_us: times.value(row),
                    record: records.value(row).to_owned(),
                });
            }
        }
        Ok(rows)
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
