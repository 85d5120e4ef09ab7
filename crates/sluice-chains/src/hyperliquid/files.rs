//! The node's output directory: which directory each stream is read from, the order of its
//! files, and reading the complete lines a file holds past a position.
//!
//! Layouts (the `hyperliquid-dex/node` README): `replica_cmds/{start_time}/{date}/{height}`
//! (one block per line; the file named `h` holds blocks `h+1`, `h+2`, …), and for events
//! `<dir>/hourly/{date}/{hour}` with `<dir>` one of `node_fills`, `node_order_statuses`,
//! `node_trades`, `misc_events`, or their `_by_block` twins written with `--batch-by-block`
//! (one line per block: `{local_time, block_time, block_number, events}`).

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// What a stream's lines are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `replica_cmds`: one block per line.
    Replica,
    /// One event per line.
    Events,
    /// One block per line, `{block_number, block_time, events}`.
    ByBlock,
}

/// One directory a stream may be read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// Relative to the data directory.
    pub dir: &'static str,
    pub layout: Layout,
    /// The lines are fills and the records are the trades they pair into.
    pub trades_from_fills: bool,
}

const fn events(dir: &'static str, layout: Layout) -> Source {
    Source { dir, layout, trades_from_fills: false }
}

const fn paired(dir: &'static str, layout: Layout) -> Source {
    Source { dir, layout, trades_from_fills: true }
}

/// The five entities and the directories each may come from, in order of preference: the
/// `_by_block` layout first (it names the block of every event); trades from the node's
/// trade files, else from its fills (`--write-fills` turns `--write-trades` off).
pub const STREAMS: [(&str, &[Source]); 5] = [
    ("block", &[events("replica_cmds", Layout::Replica)]),
    (
        "fill",
        &[
            events("node_fills_by_block/hourly", Layout::ByBlock),
            events("node_fills/hourly", Layout::Events),
        ],
    ),
    (
        "order",
        &[
            events("node_order_statuses_by_block/hourly", Layout::ByBlock),
            events("node_order_statuses/hourly", Layout::Events),
        ],
    ),
    (
        "misc_event",
        &[
            events("misc_events_by_block/hourly", Layout::ByBlock),
            events("misc_events/hourly", Layout::Events),
        ],
    ),
    (
        "trade",
        &[
            events("node_trades_by_block/hourly", Layout::ByBlock),
            events("node_trades/hourly", Layout::Events),
            paired("node_fills_by_block/hourly", Layout::ByBlock),
            paired("node_fills/hourly", Layout::Events),
        ],
    ),
];

/// The sources of `entity`.
pub fn sources(entity: &str) -> &'static [Source] {
    STREAMS.iter().find(|(name, _)| *name == entity).map_or(&[], |(_, sources)| sources)
}

/// The first source of `entity` whose directory exists.
pub fn present_source(data_dir: &Path, entity: &str) -> Option<Source> {
    sources(entity).iter().copied().find(|source| data_dir.join(source.dir).is_dir())
}

/// One output file: its path relative to the data directory, and its place in the order of
/// its directory's files (`date * 100 + hour` for hourly files, the height in the name for
/// `replica_cmds`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileRef {
    pub ordinal: u64,
    pub rel: String,
}

impl FileRef {
    /// The ordinal of a relative path of either layout; `None` for a path that is neither.
    pub fn parse(rel: &str) -> Option<Self> {
        let parts: Vec<&str> = rel.rsplitn(3, '/').collect();
        let [last, date, _] = parts[..] else { return None };
        let number = |text: &str| {
            (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
                .then(|| text.parse::<u64>().ok())
                .flatten()
        };
        let ordinal = if rel.starts_with("replica_cmds/") {
            number(last)?
        } else {
            let (date, hour) = (number(date)?, number(last)?);
            if date.to_string().len() != 8 || hour > 23 {
                return None;
            }
            date * 100 + hour
        };
        Some(Self { ordinal, rel: rel.to_owned() })
    }
}

/// Sub-directory or file names of `dir`, sorted; nothing when it does not exist.
fn names(dir: &Path) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut out = Vec::new();
    for entry in entries {
        out.push(entry?.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    Ok(out)
}

/// The files of `source` whose order is at least `from` (all with `None`), in order.
///
/// # Errors
/// A directory that cannot be read.
pub fn list(data_dir: &Path, source: &Source, from: Option<u64>) -> std::io::Result<Vec<FileRef>> {
    let root = data_dir.join(source.dir);
    let mut out = Vec::new();
    // Hourly: `{date}/{hour}`; replica_cmds: `{start_time}/{date}/{height}`.
    let tops: Vec<String> = if source.layout == Layout::Replica {
        names(&root)?.into_iter().map(|start| format!("{start}/")).collect()
    } else {
        vec![String::new()]
    };
    for top in tops {
        for date in names(&root.join(&top))? {
            let is_date = date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit());
            // An hourly date before the one asked for holds only earlier hours.
            let too_old = source.layout != Layout::Replica
                && from.is_some_and(|from| date.parse::<u64>().unwrap_or(0) < from / 100);
            if !is_date || too_old {
                continue;
            }
            for name in names(&root.join(&top).join(&date))? {
                let rel = format!("{}/{top}{date}/{name}", source.dir);
                if let Some(file) = FileRef::parse(&rel)
                    && from.is_none_or(|from| file.ordinal >= from)
                    && root.join(&top).join(&date).join(&name).is_file()
                {
                    out.push(file);
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The complete lines of a file past an offset.
#[derive(Debug, Default)]
pub struct Chunk {
    /// Bytes from the offset up to and including the last newline read.
    pub bytes: Vec<u8>,
    /// Whether bytes after the last newline were seen (a line still being written).
    pub partial: bool,
}

/// An open output file being followed.
#[derive(Debug)]
pub struct OpenFile {
    pub file: FileRef,
    path: PathBuf,
    handle: std::fs::File,
}

impl OpenFile {
    /// # Errors
    /// The file cannot be opened.
    pub fn open(data_dir: &Path, file: FileRef) -> std::io::Result<Self> {
        let path = data_dir.join(&file.rel);
        let handle = std::fs::File::open(&path)?;
        Ok(Self { file, path, handle })
    }

    /// The file's size and times now.
    pub fn metadata(&self) -> std::io::Result<std::fs::Metadata> {
        self.handle.metadata()
    }

    /// Reads up to `max` bytes at `offset` and keeps the complete lines (all of it when
    /// `to_end`: the file is finished, a last line without its newline counts). The chunk's
    /// bytes are `buffer`'s allocation (a reader passes the last chunk's back: fresh pages
    /// for every read of a few MiB cost more than the read).
    ///
    /// # Errors
    /// A read error.
    pub fn read(
        &self,
        offset: u64,
        max: usize,
        to_end: bool,
        buffer: Vec<u8>,
    ) -> std::io::Result<Chunk> {
        let len = self.handle.metadata()?.len();
        if len <= offset {
            return Ok(Chunk { bytes: empty(buffer), partial: false });
        }
        let want = usize::try_from((len - offset).min(max as u64)).unwrap_or(max);
        // The buffer's old bytes are read over (and cut off after what was read): only
        // growth is zeroed.
        let mut bytes = buffer;
        bytes.resize(want, 0);
        let mut filled = 0;
        while filled < want {
            let n = self.handle.read_at(&mut bytes[filled..], offset + filled as u64)?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        bytes.truncate(filled);
        // Bytes the file held past what was read.
        let more = len - offset > filled as u64;
        if to_end && !more {
            return Ok(Chunk { bytes, partial: false });
        }
        match bytes.iter().rposition(|b| *b == b'\n') {
            Some(end) => {
                let partial = more || end + 1 < bytes.len();
                bytes.truncate(end + 1);
                Ok(Chunk { bytes, partial })
            }
            // One line longer than `max`: read it whole.
            None if more => self.read_long_line(offset).map(|bytes| Chunk { bytes, partial: true }),
            None => Ok(Chunk { partial: !bytes.is_empty(), bytes: empty(bytes) }),
        }
    }

    /// Where reading starts at the end of the file: past its last newline, with the number
    /// of lines before it (counted only when `count_lines`, for `replica_cmds` heights).
    ///
    /// # Errors
    /// A read error.
    pub fn end(&self, count_lines: bool) -> std::io::Result<(u64, u64)> {
        let len = self.handle.metadata()?.len();
        let mut buffer = vec![0u8; 1 << 20];
        let (mut at, mut end) = (len, 0);
        while at > 0 {
            let from = at.saturating_sub(buffer.len() as u64);
            let part = &mut buffer[..usize::try_from(at - from).expect("at most 1 MiB")];
            self.handle.read_exact_at(part, from)?;
            if let Some(i) = part.iter().rposition(|b| *b == b'\n') {
                end = from + i as u64 + 1;
                break;
            }
            at = from;
        }
        let mut lines = 0;
        if count_lines {
            let mut done = 0;
            while done < end {
                let part =
                    usize::try_from((end - done).min(buffer.len() as u64)).expect("at most 1 MiB");
                self.handle.read_exact_at(&mut buffer[..part], done)?;
                lines += buffer[..part].iter().filter(|b| **b == b'\n').count() as u64;
                done += part as u64;
            }
        }
        Ok((end, lines))
    }

    fn read_long_line(&self, offset: u64) -> std::io::Result<Vec<u8>> {
        let mut handle = std::fs::File::open(&self.path)?;
        std::io::Seek::seek(&mut handle, std::io::SeekFrom::Start(offset))?;
        let mut rest = Vec::new();
        handle.read_to_end(&mut rest)?;
        match rest.iter().position(|b| *b == b'\n') {
            Some(end) => {
                rest.truncate(end + 1);
                Ok(rest)
            }
            None => Ok(Vec::new()),
        }
    }
}

fn empty(mut buffer: Vec<u8>) -> Vec<u8> {
    buffer.clear();
    buffer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_ordered_by_hour_or_height() {
        let hourly = FileRef::parse("node_fills/hourly/20250601/9").unwrap();
        assert_eq!(hourly.ordinal, 2025060109);
        let replica =
            FileRef::parse("replica_cmds/2025-06-01T00:00:00Z/20250601/808750000").unwrap();
        assert_eq!(replica.ordinal, 808_750_000);
        assert!(FileRef::parse("node_fills/hourly/2025/9").is_none());
        assert!(FileRef::parse("node_fills/hourly/20250601/24").is_none());
        assert!(FileRef::parse("node_fills/hourly/20250601/x").is_none());
    }

    #[test]
    fn listing_follows_dates_and_hours_and_skips_other_names() {
        let dir = tempfile::tempdir().unwrap();
        for rel in [
            "node_fills/hourly/20250601/23",
            "node_fills/hourly/20250601/9",
            "node_fills/hourly/20250602/0",
            "node_fills/hourly/20250602/notes",
        ] {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"").unwrap();
        }
        let source = sources("fill")[1];
        let all: Vec<u64> =
            list(dir.path(), &source, None).unwrap().iter().map(|f| f.ordinal).collect();
        assert_eq!(all, vec![2025060109, 2025060123, 2025060200]);
        let later: Vec<u64> = list(dir.path(), &source, Some(2025060110))
            .unwrap()
            .iter()
            .map(|f| f.ordinal)
            .collect();
        assert_eq!(later, vec![2025060123, 2025060200]);
    }

    #[test]
    fn a_line_without_its_newline_is_not_read_until_the_file_is_finished() {
        let dir = tempfile::tempdir().unwrap();
        let rel = "misc_events/hourly/20250601/0";
        std::fs::create_dir_all(dir.path().join("misc_events/hourly/20250601")).unwrap();
        std::fs::write(dir.path().join(rel), b"{\"a\":1}\n{\"b\":").unwrap();
        let file = OpenFile::open(dir.path(), FileRef::parse(rel).unwrap()).unwrap();
        let chunk = file.read(0, 1024, false, Vec::new()).unwrap();
        assert_eq!(chunk.bytes, b"{\"a\":1}\n");
        assert!(chunk.partial);
        let chunk = file.read(8, 1024, false, Vec::new()).unwrap();
        assert!(chunk.bytes.is_empty() && chunk.partial);
        assert_eq!(file.read(8, 1024, true, Vec::new()).unwrap().bytes, b"{\"b\":");
        // A line longer than the read size is read whole.
        assert_eq!(file.read(0, 3, false, Vec::new()).unwrap().bytes, b"{\"a\":1}\n");
    }
}
