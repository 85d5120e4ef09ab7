//! One Hyperliquid node's output directory, followed: per stream the file being read and
//! the byte offset past its last complete line.
//!
//! Exact resume, as the other ingesters' (see [`crate::sink`]): the lines a step reads from
//! one file go to each stream made of them in **one append**, each record carrying where its
//! line ends (`node_file`, `node_offset`); then the positions of every stream are stored.
//! The fill files feed two streams, `fill` and the `trade` stream paired from the fills: one
//! read of a line makes both, and each stream skips the lines it holds. At start the
//! ingester reads the furthest position each stream holds and appends no line up to it
//! again, and reads the files from the stored positions on. A `kill -9` between the append
//! and the stored position therefore neither repeats nor skips a line's records.
//!
//! A line is a record only once its newline is written; the rest of a file counts when the
//! node has moved on to a newer file (hourly rotation, or the next `replica_cmds` file).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_core::streams::StreamRecord;

use super::files::{self, FileRef, OpenFile, Source};
use super::records::{self, LineAt, Pairs, Position};
use super::{FileStart, HyperliquidConfig};
use crate::ChainError;
use crate::ingester::{Rounds, run_rounds};
use crate::sink::ChainSink;
use crate::status::ChainStatus;

/// A file being read and the streams made of its lines: one stream, or `fill` and the
/// `trade` stream made from the same fills (one read of the fill files for both).
#[derive(Debug)]
struct Feed {
    /// The first stream's source (the fills', when the trades are made on the way).
    source: Option<Source>,
    open: Option<OpenFile>,
    /// Past the last complete line read.
    offset: u64,
    /// Lines before `offset` (for `replica_cmds` heights).
    line: u64,
    outputs: Vec<Output>,
}

/// One stream made of a feed's lines.
#[derive(Debug)]
struct Output {
    entity: String,
    /// The furthest line end the stream holds: lines up to it are not appended again.
    written: Option<Position>,
    /// The furthest line end the stream held at start (lines up to it are read again).
    resumed_at: Option<Position>,
    /// Trades from fills: fills waiting for their other side.
    pairs: Pairs,
}

impl Feed {
    fn new(entity: String, written: Option<Position>) -> Self {
        let output = Output { entity, written, resumed_at: written, pairs: Pairs::default() };
        Self { source: None, open: None, offset: 0, line: 0, outputs: vec![output] }
    }

    fn entity(&self) -> &str {
        &self.outputs[0].entity
    }

    /// Where the next line starts, for comparing two feeds of one directory.
    fn at(&self) -> Option<Position> {
        self.open.as_ref().map(|open| (open.file.ordinal, self.offset))
    }
}

/// The stored position: per stream, the file, the offset to read on from, and the lines
/// before it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Stored {
    feeds: BTreeMap<String, StoredFeed>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredFeed {
    file: String,
    offset: u64,
    line: u64,
}

/// One Hyperliquid chain's ingester.
pub struct HyperliquidIngester {
    config: HyperliquidConfig,
    sink: Arc<dyn ChainSink>,
    status: Arc<ChainStatus>,
    feeds: Vec<Feed>,
    started: bool,
    /// The newest block number read, for the status.
    newest_block: Option<u64>,
    /// The last read's bytes, for the next read.
    buffer: Vec<u8>,
}

impl std::fmt::Debug for HyperliquidIngester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HyperliquidIngester")
            .field("chain", &self.config.name)
            .finish_non_exhaustive()
    }
}

/// Runs file work (reads, parsing) off the async worker threads when the runtime has
/// several.
pub(crate) fn blocking<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

fn io_error(path: &Path, error: &std::io::Error) -> ChainError {
    ChainError::Config(format!("reading {}: {error}", path.display()))
}

impl HyperliquidIngester {
    pub fn new(
        config: HyperliquidConfig,
        sink: Arc<dyn ChainSink>,
        status: Arc<ChainStatus>,
    ) -> Self {
        Self {
            config,
            sink,
            status,
            feeds: Vec::new(),
            started: false,
            newest_block: None,
            buffer: Vec::new(),
        }
    }

    /// A new status for `config`, for the API to read.
    pub fn status_for(config: &HyperliquidConfig) -> Arc<ChainStatus> {
        Arc::new(ChainStatus::new(&config.name, &format!("file://{}", config.data_dir.display())))
    }

    /// Runs until the task is dropped: errors are logged, shown in the status and retried
    /// with backoff.
    pub async fn run(mut self) {
        let chain = self.config.name.clone();
        tracing::info!(%chain, data_dir = %self.config.data_dir.display(), "hyperliquid ingester starting");
        let wake = tokio::sync::Notify::new();
        let (status, poll) = (self.status.clone(), self.config.poll_interval);
        run_rounds(&mut self, &chain, &status, poll, &wake).await;
    }

    /// One round: every stream reads what its file holds past its position (up to
    /// `max_read_bytes`) and appends it. True when one moved.
    ///
    /// # Errors
    /// Unreadable files, sink failures.
    pub async fn step(&mut self) -> Result<bool, ChainError> {
        if !self.started {
            self.start().await?;
        }
        let mut moved = false;
        for index in 0..self.feeds.len() {
            moved |= self.step_feed(index).await?;
        }
        if moved {
            // One stored position per round, after every stream's append (it may lag the
            // streams, never lead them).
            if let Err(error) = self.save().await {
                self.started = false;
                return Err(error);
            }
        }
        self.report_lag(moved);
        Ok(moved)
    }

    async fn start(&mut self) -> Result<(), ChainError> {
        let chain = self.config.name.clone();
        let stored: Stored = match self.sink.load_position(&chain).await? {
            Some(value) => serde_json::from_value(value).map_err(|error| {
                ChainError::Config(format!("the stored position of {chain} is unreadable: {error}"))
            })?,
            None => Stored::default(),
        };
        self.feeds.clear();
        for entity in self.config.entities.clone() {
            let mut written = None;
            for tail in self.sink.tails(&chain, &entity).await? {
                written = written.max(record_position(&tail));
            }
            let mut feed = Feed::new(entity.clone(), written);
            if let Some(at) = stored.feeds.get(&entity) {
                self.resume_feed(&mut feed, at)?;
            } else if self.config.start == FileStart::Latest {
                self.start_at_latest(&mut feed)?;
            }
            tracing::info!(%chain, %entity, file = ?feed.open.as_ref().map(|o| &o.file.rel), offset = feed.offset, written = ?written, "stream position");
            self.feeds.push(feed);
        }
        for feed in &mut self.feeds {
            // As the first step would pick it (the joining below needs it).
            if feed.source.is_none() {
                feed.source = files::present_source(&self.config.data_dir, feed.entity());
            }
        }
        join_trades_to_fills(&mut self.feeds);
        self.started = true;
        self.save().await
    }

    /// Opens the stored file (or, when it was removed, the next one).
    fn resume_feed(&self, feed: &mut Feed, at: &StoredFeed) -> Result<(), ChainError> {
        let dir = &self.config.data_dir;
        let Some(file) = FileRef::parse(&at.file) else { return Ok(()) };
        let source = files::sources(feed.entity())
            .iter()
            .copied()
            .find(|s| at.file.starts_with(&format!("{}/", s.dir)));
        let Some(source) = source else { return Ok(()) };
        feed.source = Some(source);
        match OpenFile::open(dir, file.clone()) {
            Ok(open) => {
                feed.open = Some(open);
                feed.offset = at.offset;
                feed.line = at.line;
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(file = %at.file, "the stored file is gone; reading on from the next one");
                let next = files::list(dir, &source, Some(file.ordinal))
                    .map_err(|e| io_error(dir, &e))?
                    .into_iter()
                    .find(|f| *f > file);
                if let Some(next) = next {
                    feed.open = Some(
                        OpenFile::open(dir, next.clone())
                            .map_err(|e| io_error(&dir.join(&next.rel), &e))?,
                    );
                }
            }
            Err(error) => return Err(io_error(&dir.join(&at.file), &error)),
        }
        Ok(())
    }

    /// The end of the stream's newest file (its last complete line).
    fn start_at_latest(&self, feed: &mut Feed) -> Result<(), ChainError> {
        let dir = &self.config.data_dir;
        let Some(source) = files::present_source(dir, feed.entity()) else { return Ok(()) };
        feed.source = Some(source);
        let Some(newest) = files::list(dir, &source, None).map_err(|e| io_error(dir, &e))?.pop()
        else {
            return Ok(());
        };
        let path = dir.join(&newest.rel);
        let open = OpenFile::open(dir, newest).map_err(|e| io_error(&path, &e))?;
        let replica = source.layout == files::Layout::Replica;
        let (end, lines) = open.end(replica).map_err(|e| io_error(&path, &e))?;
        feed.offset = end;
        feed.line = lines;
        feed.open = Some(open);
        Ok(())
    }

    /// Opens the stream's first file when it has none yet; false when there is none.
    fn open_first(&self, feed: &mut Feed) -> Result<bool, ChainError> {
        let dir = &self.config.data_dir;
        if feed.source.is_none() {
            feed.source = files::present_source(dir, feed.entity());
        }
        let Some(source) = feed.source else { return Ok(false) };
        let Some(first) =
            files::list(dir, &source, None).map_err(|e| io_error(dir, &e))?.into_iter().next()
        else {
            return Ok(false);
        };
        feed.open = Some(
            OpenFile::open(dir, first.clone()).map_err(|e| io_error(&dir.join(&first.rel), &e))?,
        );
        feed.offset = 0;
        feed.line = 0;
        Ok(true)
    }

    async fn step_feed(&mut self, index: usize) -> Result<bool, ChainError> {
        let dir = self.config.data_dir.clone();
        let max = self.config.max_read_bytes.max(4096);
        let mut feed = std::mem::replace(&mut self.feeds[index], placeholder());
        let outcome = self.advance(&mut feed, &dir, max).await;
        self.feeds[index] = feed;
        if outcome.is_err() {
            // Whether the append reached the stream is unknown: resume as after a crash.
            self.started = false;
        }
        outcome
    }

    async fn advance(
        &mut self,
        feed: &mut Feed,
        dir: &Path,
        max: usize,
    ) -> Result<bool, ChainError> {
        if feed.open.is_none() && !self.open_first(feed)? {
            return Ok(false);
        }
        let open = feed.open.as_ref().expect("opened above");
        let buffer = std::mem::take(&mut self.buffer);
        let chunk = blocking(|| open.read(feed.offset, max, false, buffer))
            .map_err(|e| io_error(&dir.join(&open.file.rel), &e))?;
        if !chunk.bytes.is_empty() {
            self.write(feed, &chunk.bytes).await?;
            self.buffer = chunk.bytes;
            return Ok(true);
        }
        self.buffer = chunk.bytes;
        // Nothing new: has the node moved on to a newer file?
        let source = feed.source.expect("a feed with a file has a source");
        let current = open.file.clone();
        let newer = files::list(dir, &source, Some(current.ordinal))
            .map_err(|e| io_error(dir, &e))?
            .into_iter()
            .find(|f| *f > current);
        let Some(next) = newer else { return Ok(false) };
        // The node writes a file to its end before it makes the next: read what it added
        // meanwhile, then take the rest (a last line without its newline) as final.
        let rest = blocking(|| open.read(feed.offset, max, true, Vec::new()))
            .map_err(|e| io_error(&dir.join(&current.rel), &e))?;
        if !rest.bytes.is_empty() {
            let mut bytes = rest.bytes;
            let complete = bytes.last() == Some(&b'\n');
            if !complete && rest.partial {
                return Ok(false);
            }
            if !complete {
                bytes.push(b'\n');
            }
            self.write(feed, &bytes).await?;
            // A final line without its newline: its offset is past the file's end.
            return Ok(true);
        }
        for output in &mut feed.outputs {
            let orphans = output.pairs.clear(output.resumed_at);
            if orphans > 0 {
                self.status.rejected(orphans as u64);
                self.status.error(Some(format!(
                    "{}: {orphans} fills without the other side of their trade",
                    current.rel
                )));
            }
        }
        tracing::debug!(chain = %self.config.name, entity = %feed.entity(), from = %current.rel, to = %next.rel, "next file");
        feed.open = Some(
            OpenFile::open(dir, next.clone()).map_err(|e| io_error(&dir.join(&next.rel), &e))?,
        );
        feed.offset = 0;
        feed.line = 0;
        Ok(true)
    }

    /// Turns complete lines (read at the feed's offset) into records and appends them, one
    /// append per stream (the caller stores the new position).
    async fn write(&mut self, feed: &mut Feed, bytes: &[u8]) -> Result<(), ChainError> {
        let open = feed.open.as_ref().expect("a feed that read has a file");
        let source = feed.source.expect("a feed with a file has a source");
        let (rel, ordinal) = (open.file.rel.clone(), open.file.ordinal);
        let mut out: Vec<Vec<StreamRecord>> = vec![Vec::new(); feed.outputs.len()];
        let mut rejected = vec![Vec::new(); feed.outputs.len()];
        let mut block = None;
        let mut position = feed.offset;
        blocking(|| {
            for line in lines(bytes) {
                let start = position;
                position += line.len() as u64;
                let text = line.strip_suffix(b"\n").unwrap_or(line);
                let text = text.strip_suffix(b"\r").unwrap_or(text);
                if text.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let at =
                    LineAt { file: &rel, position: (ordinal, position), start, index: feed.line };
                feed.line += 1;
                let built = match feed.outputs.as_mut_slice() {
                    [fills, trades] => {
                        let entities = (fills.entity.as_str(), trades.entity.as_str());
                        let (f, t) = records::build_fills_and_trades(
                            entities,
                            source.layout,
                            text,
                            &at,
                            &mut trades.pairs,
                        );
                        vec![f, t]
                    }
                    outputs => outputs
                        .iter_mut()
                        .map(|o| {
                            records::build(&o.entity, &source, text, &at, ordinal, &mut o.pairs)
                        })
                        .collect(),
                };
                for (index, built) in built.into_iter().enumerate() {
                    match built {
                        Ok(built) => {
                            if Some(at.position) > feed.outputs[index].written {
                                out[index].extend(built.records);
                            }
                            block = built.block.or(block);
                        }
                        Err(reason) => {
                            rejected[index].push(format!("{rel} at byte {start}: {reason}"));
                        }
                    }
                }
            }
        });
        for (output, out) in feed.outputs.iter().zip(out) {
            if !out.is_empty() {
                self.sink.append(&self.config.name, &output.entity, false, out).await?;
            }
        }
        feed.offset = position;
        for (output, rejected) in feed.outputs.iter_mut().zip(rejected) {
            output.written = output.written.max(Some((ordinal, position)));
            if let Some(last) = rejected.last() {
                tracing::warn!(chain = %self.config.name, entity = %output.entity, lines = rejected.len(), error = %last, "node lines rejected");
                self.status.rejected(rejected.len() as u64);
                self.status.error(Some(last.clone()));
            }
        }
        if let Some((number, time_ms)) = block
            && Some(number) > self.newest_block
        {
            self.newest_block = Some(number);
            self.status.ingested(number, time_ms.div_euclid(1000));
        }
        Ok(())
    }

    async fn save(&mut self) -> Result<(), ChainError> {
        let mut stored = Stored::default();
        for feed in &self.feeds {
            let Some(open) = &feed.open else { continue };
            // Fills still waiting for their other side are read again after a restart (with
            // the fills read on the way, which are not appended again).
            let waiting = feed.outputs.iter().filter_map(|o| o.pairs.earliest_start()).min();
            let offset = waiting.unwrap_or(feed.offset).min(feed.offset);
            for output in &feed.outputs {
                stored.feeds.insert(
                    output.entity.clone(),
                    StoredFeed { file: open.file.rel.clone(), offset, line: feed.line },
                );
            }
        }
        let value = serde_json::to_value(&stored).expect("positions serialize");
        self.sink.save_position(&self.config.name, &value).await?;
        Ok(())
    }

    /// Bytes the current files hold past each stream's position, and their newest write.
    /// After a step that moved, a stream may have read its file to the end with a newer one
    /// waiting (it moves on at its next step): 0 is only shown after a step that did not move,
    /// when every stream has looked for a newer file.
    fn report_lag(&self, moved: bool) {
        let mut bytes = 0;
        let mut newest = None;
        for feed in &self.feeds {
            let Some(open) = &feed.open else { continue };
            if let Ok(meta) = open.metadata() {
                bytes += meta.len().saturating_sub(feed.offset);
                let modified =
                    meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                newest = newest.max(modified.map(|d| d.as_secs() as i64));
            }
        }
        if !moved || bytes > 0 {
            self.status.lag_bytes(bytes, newest);
        }
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.config.data_dir.clone()
    }
}

/// The lines of `bytes`, each with its newline (the last one without, when it has none).
fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    let ends = memchr::memchr_iter(b'\n', bytes).map(|at| at + 1).chain([bytes.len()]);
    ends.filter_map(move |end| {
        let line = (end > start).then(|| &bytes[start..end]);
        start = end;
        line
    })
}

fn placeholder() -> Feed {
    Feed { source: None, open: None, offset: 0, line: 0, outputs: Vec::new() }
}

/// Makes the `trade` stream that pairs fills read the fill stream's files with it: one feed
/// from the earlier of their two positions (each stream skips the lines it holds). Feeds of
/// other directories, or whose files are not known yet, stay apart.
fn join_trades_to_fills(feeds: &mut Vec<Feed>) {
    let find = |feeds: &[Feed], entity: &str| feeds.iter().position(|f| f.entity() == entity);
    let (Some(fill), Some(trade)) = (find(feeds, "fill"), find(feeds, "trade")) else { return };
    let same_dir = match (feeds[fill].source, feeds[trade].source) {
        (Some(f), Some(t)) => !f.trades_from_fills && t.trades_from_fills && f.dir == t.dir,
        _ => false,
    };
    if !same_dir || feeds[fill].open.is_some() != feeds[trade].open.is_some() {
        return;
    }
    let mut trades = feeds.remove(trade);
    let fill = find(feeds, "fill").expect("found above");
    let fills = &mut feeds[fill];
    let mut outputs = std::mem::take(&mut trades.outputs);
    if trades.at() < fills.at() {
        // Read from the trades' position with the fills' source.
        trades.source = fills.source;
        trades.outputs = std::mem::take(&mut fills.outputs);
        *fills = trades;
    }
    fills.outputs.append(&mut outputs);
}

/// Where a record's line ends, from its `node_file` and `node_offset` (`None` for records
/// another writer appended).
fn record_position(text: &[u8]) -> Option<Position> {
    let value: Value = serde_json::from_slice(text).ok()?;
    let file = FileRef::parse(value.get("node_file")?.as_str()?)?;
    Some((file.ordinal, value.get("node_offset")?.as_u64()?))
}

impl Rounds for HyperliquidIngester {
    async fn step(&mut self) -> Result<bool, ChainError> {
        HyperliquidIngester::step(self).await
    }
}

#[cfg(test)]
mod tests;
