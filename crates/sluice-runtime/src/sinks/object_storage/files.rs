//! The files of an `object_storage` sink: what one open file holds, when it is cut, its
//! name, and its bytes. Pure: no I/O.
//!
//! **Names.** A pipeline's file holds the records of one source partition from offset
//! `start` on, and is named `<prefix>/<chain>/<entity>/<date>/<pipeline>-<partition>-<start>`
//! (`start` zero-padded to 20 digits, so names sort by offset). `start` is where the
//! partition's committed offset stood when the file opened, and the offset is committed past
//! the file only once the object is written. So whatever happens between the write and the
//! commit (a crash, a failed commit, a redeploy), the next try starts at the same `start`
//! and writes the same name: the object is replaced, never doubled. `<date>` is the UTC day
//! the file's first record entered the source stream, which the same source position fixes.

use std::io::Write as _;
use std::time::Instant;

use flate2::Compression;
use flate2::write::GzEncoder;
use sluice_columnar::tables::Table;
use sluice_columnar::{Row, block_time, encode_file};

use crate::delivery::Origin;

/// How files are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Parquet,
    JsonlGzip,
}

impl Format {
    pub fn from_name(name: &str) -> Self {
        if name == "jsonl_gzip" { Self::JsonlGzip } else { Self::Parquet }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::JsonlGzip => "jsonl.gz",
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Parquet => "application/vnd.apache.parquet",
            Self::JsonlGzip => "application/x-ndjson",
        }
    }
}

/// When a file is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_rows: usize,
    pub max_bytes: usize,
    pub max_seconds: u64,
}

/// Where files go and how records are laid out in them.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `<prefix>/<chain>/<entity>` (no `/` at either end).
    pub base: String,
    pub entity: String,
    pub table: Table,
    pub format: Format,
}

impl Layout {
    /// The object key of a file whose first record entered the source at `first_ms`.
    pub fn key(&self, date: &str, name: &str) -> String {
        format!("{}/{date}/{name}.{}", self.base, self.format.extension())
    }

    /// The row of a record: its time is its block time, or `fallback_us` when it has none.
    pub fn row(&self, key: &[u8], value: &[u8], fallback_us: i64) -> Row {
        let record = String::from_utf8_lossy(value).into_owned();
        let time_us =
            block_time(&self.entity, &record).map_or(fallback_us, |t| t.timestamp_micros());
        Row { key: String::from_utf8_lossy(key).into_owned(), time_us, record }
    }

    /// The bytes of a file of `rows`.
    ///
    /// # Errors
    /// What the parquet writer or the compressor could not do.
    pub fn encode(&self, rows: &[Row]) -> Result<Vec<u8>, String> {
        match self.format {
            Format::Parquet => encode_file(&self.table, rows).map_err(|error| error.to_string()),
            Format::JsonlGzip => {
                let size = rows.iter().map(|row| row.record.len() + 1).sum::<usize>();
                let mut gz = GzEncoder::new(Vec::with_capacity(size / 6), Compression::fast());
                for row in rows {
                    gz.write_all(row.record.as_bytes()).map_err(|e| e.to_string())?;
                    gz.write_all(b"\n").map_err(|e| e.to_string())?;
                }
                gz.finish().map_err(|error| error.to_string())
            }
        }
    }
}

/// The UTC day (`YYYY-MM-DD`) of a Unix-millisecond time.
pub fn day_of_ms(at_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(at_ms)
        .map_or_else(|| "1970-01-01".to_owned(), |t| t.format("%Y-%m-%d").to_string())
}

/// The name (without directory and extension) of a pipeline's file.
pub fn file_name(owner: &str, partition: u32, start: u64) -> String {
    format!("{owner}-{partition}-{start:020}")
}

/// The open file of one source partition.
#[derive(Debug)]
pub struct OpenFile {
    /// The partition's committed offset: the first offset the file covers.
    pub start: u64,
    /// The offset after the last record the file has taken (its records, and those the
    /// transforms dropped): what is committed once the file is written.
    pub through: u64,
    /// The first record's append time (Unix ms), which dates the file.
    pub first_ms: Option<i64>,
    pub rows: Vec<Row>,
    /// The records' JSON bytes.
    pub bytes: usize,
    /// When the first record came (the age of the file).
    pub opened: Option<Instant>,
}

impl OpenFile {
    pub fn new(start: u64) -> Self {
        Self { start, through: start, first_ms: None, rows: Vec::new(), bytes: 0, opened: None }
    }

    /// Whether `bytes` more bytes in one more row would go over `limits`.
    pub fn full_with(&self, bytes: usize, limits: &Limits) -> bool {
        !self.rows.is_empty()
            && (self.rows.len() >= limits.max_rows || self.bytes + bytes > limits.max_bytes)
    }

    /// Whether the file is at its limits already, or older than `max_seconds`.
    pub fn due(&self, limits: &Limits, now: Instant) -> bool {
        !self.rows.is_empty()
            && (self.rows.len() >= limits.max_rows
                || self.bytes >= limits.max_bytes
                || self.opened.is_some_and(|at| {
                    now.saturating_duration_since(at).as_secs() >= limits.max_seconds
                }))
    }

    /// Takes `row`, which came from `origin`.
    pub fn push(&mut self, row: Row, origin: Origin, now: Instant) {
        if self.rows.is_empty() {
            self.first_ms = Some(origin.timestamp_ms);
            self.opened = Some(now);
        }
        self.bytes += row.record.len();
        self.rows.push(row);
        self.through = self.through.max(origin.offset + 1);
    }

    /// The file's object key under `layout`, for `owner` and `partition`.
    pub fn key(&self, layout: &Layout, owner: &str, partition: u32) -> String {
        let date = day_of_ms(self.first_ms.unwrap_or(0));
        layout.key(&date, &file_name(owner, partition, self.start))
    }

    /// Empties the file: the next one starts at `next`.
    pub fn reset(&mut self, next: u64) {
        *self = Self::new(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(offset: u64) -> Origin {
        Origin { partition: 3, offset, timestamp_ms: 1_795_000_000_000 + offset as i64 }
    }

    fn layout(format: Format) -> Layout {
        Layout {
            base: "lake/base/erc20_token_transfer".to_owned(),
            entity: "erc20_token_transfer".to_owned(),
            table: sluice_columnar::tables::layout("base", "erc20_token_transfer"),
            format,
        }
    }

    #[test]
    fn a_file_is_named_by_its_partition_and_first_offset_and_dated_by_its_first_record() {
        let layout = layout(Format::Parquet);
        let mut file = OpenFile::new(40);
        let now = Instant::now();
        file.push(layout.row(b"k", br#"{"n":1}"#, 0), origin(41), now);
        file.push(layout.row(b"k2", br#"{"n":2}"#, 0), origin(45), now);
        assert_eq!(file.through, 46);
        // 1_795_000_000_041 ms is 2026-11-18T11:06:40.041Z.
        assert_eq!(
            file.key(&layout, "pl-1", 3),
            "lake/base/erc20_token_transfer/2026-11-18/pl-1-3-00000000000000000040.parquet"
        );
        file.reset(46);
        assert_eq!((file.start, file.through, file.rows.len()), (46, 46, 0));
    }

    #[test]
    fn a_file_is_due_at_its_rows_its_bytes_or_its_age() {
        let limits = Limits { max_rows: 2, max_bytes: 10, max_seconds: 60 };
        let layout = layout(Format::JsonlGzip);
        let now = Instant::now();
        let mut file = OpenFile::new(0);
        assert!(!file.due(&limits, now + std::time::Duration::from_secs(3600)), "empty");
        file.push(layout.row(b"a", b"{}", 0), origin(0), now);
        assert!(!file.due(&limits, now));
        assert!(file.due(&limits, now + std::time::Duration::from_secs(60)));
        assert!(!file.full_with(8, &limits));
        assert!(file.full_with(9, &limits), "2 + 9 bytes is over 10");
        file.push(layout.row(b"b", b"{}", 0), origin(1), now);
        assert!(file.due(&limits, now) && file.full_with(1, &limits));
    }

    #[test]
    fn jsonl_gzip_holds_one_record_a_line() {
        use std::io::Read as _;
        let layout = layout(Format::JsonlGzip);
        let rows = vec![layout.row(b"a", br#"{"n":1}"#, 0), layout.row(b"b", br#"{"n":2}"#, 0)];
        let bytes = layout.encode(&rows).unwrap();
        let mut text = String::new();
        flate2::read::GzDecoder::new(&bytes[..]).read_to_string(&mut text).unwrap();
        assert_eq!(text, "{\"n\":1}\n{\"n\":2}\n");
    }
}
