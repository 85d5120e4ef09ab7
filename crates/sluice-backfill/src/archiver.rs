//! The archiver: reads every finalized chain stream that has a table and appends its records
//! to the warehouse, every [`ArchiverSettings::flush_every`] (`--warehouse-flush-secs`), and
//! sooner for a table once [`ArchiverSettings::flush_records`] records wait in its stream.
//!
//! Where it reads from is the table's manifest (the offsets of the last append), not a
//! consumer group: the rows and the offsets they came from are committed together, so a
//! restart resumes exactly after the last append — nothing lost, nothing twice. Afterwards the
//! same offsets are committed to the consumer group [`ARCHIVER_GROUP`], for anyone watching
//! lag. A record older than the stream keeps (2 days) is gone before it can be archived; the
//! archiver logs how many when it finds such a gap.
//!
//! After each flush it compacts: the small files a day gathers are merged
//! ([`Warehouse::compact`]).

use std::sync::Arc;
use std::time::Duration;

use sluice_bus::StreamLog;

use tokio::sync::watch;

use sluice_columnar::block_time;

use crate::tables::Table;
use crate::warehouse::{Compacted, Row, Warehouse, WarehouseError};

/// The consumer group the archiver commits its offsets to (informational).
pub const ARCHIVER_GROUP: &str = "sluice-warehouse-archiver";

/// How the archiver runs.
#[derive(Debug, Clone, Copy)]
pub struct ArchiverSettings {
    /// How often buffered records are written (default 60 s).
    pub flush_every: Duration,
    /// Records waiting in a busy table's stream that start its drain before `flush_every` has
    /// passed; a table is busy when its records came at this many a flush or more. A busy
    /// stream is then archived as it comes, an append or so at a time, not in one flush a
    /// minute of hundreds of megabytes, whose memory showed as that much more RSS for the
    /// seconds it took.
    pub flush_records: u64,
    /// How often the streams are checked for `flush_records` (at most `flush_every`).
    pub check_every: Duration,
    /// Most rows one append writes.
    pub max_rows_per_append: usize,
    /// Most bytes of records one append gathers: an append holds its rows in memory to sort
    /// them, so this bounds the archiver's memory whatever the records' size.
    pub max_bytes_per_append: usize,
    /// Records read per partition per read call.
    pub read_batch: usize,
}

impl Default for ArchiverSettings {
    fn default() -> Self {
        Self {
            flush_every: Duration::from_secs(60),
            flush_records: 65_536,
            check_every: Duration::from_secs(5),
            max_rows_per_append: 500_000,
            max_bytes_per_append: 32 << 20,
            read_batch: 10_000,
        }
    }
}

/// What went wrong archiving.
#[derive(Debug, thiserror::Error)]
pub enum ArchiverError {
    #[error(transparent)]
    Warehouse(#[from] WarehouseError),
    #[error("stream log: {0}")]
    Bus(#[from] sluice_bus::BusError),
    #[error("the warehouse append task ended abnormally: {0}")]
    Task(String),
}

/// The text of a stream record's bytes (always UTF-8: ingest parses them as JSON), checked
/// the fast way; invalid sequences would become U+FFFD.
fn utf8_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// Archives `tables` from `log` into `warehouse`.
#[derive(Clone)]
pub struct Archiver {
    warehouse: Warehouse,
    log: Arc<dyn StreamLog>,
    tables: Vec<Table>,
    settings: ArchiverSettings,
}

impl std::fmt::Debug for Archiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archiver")
            .field("tables", &self.tables.len())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Archiver {
    pub fn new(
        warehouse: Warehouse,
        log: Arc<dyn StreamLog>,
        tables: Vec<Table>,
        settings: ArchiverSettings,
    ) -> Self {
        Self { warehouse, log, tables, settings }
    }

    /// Archives until `stop` turns true, then once more (what was read is written). Every
    /// table is drained each [`ArchiverSettings::flush_every`]; a busy one also in between,
    /// once `flush_records` records wait. A table is busy when its last drain came at a pace
    /// of `flush_records` or more a flush (and until its first drain): a quiet table costs no
    /// reads between flushes (on Kafka, its stream's ends are requests).
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let settings = self.settings;
        let started = tokio::time::Instant::now();
        // Per table: whether it is busy, and when it was last drained.
        let mut paces = vec![(true, started); self.tables.len()];
        let mut flushed = started;
        loop {
            let stopping = tokio::select! {
                () = tokio::time::sleep(settings.check_every.min(settings.flush_every)) => false,
                _ = stop.changed() => true,
            };
            // A stop that came while the last round ran is seen here, so that this round is
            // the last flush.
            let stopping = stopping || *stop.borrow();
            let due = stopping || flushed.elapsed() >= settings.flush_every;
            let mut archived = 0;
            for (table, (busy, drained)) in self.tables.iter().zip(&mut paces) {
                let early = !due && *busy && self.waiting(table).await >= settings.flush_records;
                if !(due || early) {
                    continue;
                }
                match self.drain_table(table).await {
                    Ok(rows) => {
                        let since = drained.elapsed().as_secs_f64().max(1e-3);
                        let per_flush = rows as f64 / since * settings.flush_every.as_secs_f64();
                        *busy = per_flush >= settings.flush_records as f64;
                        *drained = tokio::time::Instant::now();
                        archived += rows;
                    }
                    Err(error) => {
                        tracing::warn!(table = %table.name, %error, "archiving failed; the next flush tries again");
                    }
                }
            }
            if due {
                flushed = tokio::time::Instant::now();
                if archived > 0 {
                    tracing::info!(rows = archived, "archived chain records into the warehouse");
                }
            }
            if due || archived > 0 {
                if let Err(error) = self.compact().await {
                    tracing::warn!(%error, "compacting the warehouse failed; the next flush tries again");
                }
            }
            if stopping {
                return;
            }
        }
    }

    /// The records `table`'s stream holds past what was archived (0 when it cannot be read
    /// now: the next flush tries).
    async fn waiting(&self, table: &Table) -> u64 {
        let (Ok(manifest), Ok(ranges)) =
            (self.warehouse.manifest(&table.name), self.log.offsets(&table.stream()).await)
        else {
            return 0;
        };
        ranges
            .iter()
            .enumerate()
            .map(|(p, range)| {
                let archived = manifest.offsets.get(&(p as u32)).copied().unwrap_or(0);
                range.end.saturating_sub(archived.max(range.start))
            })
            .sum()
    }

    /// Appends everything the streams hold past each table's manifest; answers the rows
    /// archived.
    ///
    /// # Errors
    /// A log read or a warehouse write that failed (what was appended before stays).
    pub async fn drain(&self) -> Result<u64, ArchiverError> {
        let mut total = 0;
        for table in &self.tables {
            total += self.drain_table(table).await?;
        }
        Ok(total)
    }

    /// Compacts every table ([`Warehouse::compact`]); answers what was done in all.
    ///
    /// # Errors
    /// A warehouse read or write that failed (tables compacted before stay so).
    pub async fn compact(&self) -> Result<Compacted, ArchiverError> {
        let (warehouse, tables) = (self.warehouse.clone(), self.tables.clone());
        tokio::task::spawn_blocking(move || {
            let now_us = chrono::Utc::now().timestamp_micros();
            let mut all = Compacted::default();
            for table in &tables {
                let done = warehouse.compact(table, now_us)?;
                if done != Compacted::default() {
                    tracing::info!(table = %table.name, merged = done.merged, written = done.written, deleted = done.deleted, "compacted warehouse files");
                }
                all.merged += done.merged;
                all.written += done.written;
                all.deleted += done.deleted;
            }
            Ok(all)
        })
        .await
        .map_err(|error| ArchiverError::Task(error.to_string()))?
    }

    async fn drain_table(&self, table: &Table) -> Result<u64, ArchiverError> {
        let topic = table.stream();
        let Some(config) = self.log.topic(&topic).await? else { return Ok(0) };
        let manifest = self.warehouse.manifest(&table.name)?;
        let ranges = self.log.offsets(&topic).await?;
        // Each pass reads up to the ends the log has now, and no further: what is appended
        // meanwhile waits for the next flush. A read at a partition's end is not free (on
        // Kafka it waits `fetch_wait_ms` for records that may come), so partitions with
        // nothing new are not read at all.
        let mut next: Vec<(u32, u64)> = (0..config.partitions)
            .map(|p| {
                let archived = manifest.offsets.get(&p).copied().unwrap_or(0);
                let start = ranges.get(p as usize).map_or(0, |r| r.start);
                if archived < start {
                    tracing::warn!(table = %table.name, partition = p, lost = start - archived, "records left the stream before they were archived");
                }
                (p, archived.max(start))
            })
            .collect();
        let mut archived = 0;
        let settings = &self.settings;
        loop {
            let mut rows = Vec::new();
            let mut bytes = 0;
            let mut moved = false;
            for (partition, from) in &mut next {
                let end = ranges.get(*partition as usize).map_or(0, |range| range.end);
                while rows.len() < settings.max_rows_per_append
                    && bytes < settings.max_bytes_per_append
                    && *from < end
                {
                    let want = settings
                        .read_batch
                        .min(settings.max_rows_per_append - rows.len())
                        .min(usize::try_from(end - *from).unwrap_or(usize::MAX));
                    let records = self.log.read(&topic, *partition, *from, want).await?;
                    let Some(last) = records.last().map(|r| r.offset) else { break };
                    for record in records {
                        bytes += record.value.len();
                        let text = utf8_text(&record.value);
                        let time = match block_time(table.entity, &text) {
                            Ok(time) => time,
                            Err(problem) => {
                                tracing::warn!(table = %table.name, offset = record.offset, "a stream record {problem} is not archived");
                                continue;
                            }
                        };
                        rows.push(Row {
                            key: utf8_text(&record.key),
                            time_us: time.timestamp_micros(),
                            record: text,
                        });
                    }
                    *from = last + 1;
                    moved = true;
                }
            }
            if !moved {
                return Ok(archived);
            }
            let count = rows.len() as u64;
            let (warehouse, table_owned, offsets) =
                (self.warehouse.clone(), table.clone(), next.clone());
            tokio::task::spawn_blocking(move || warehouse.append(&table_owned, rows, &offsets))
                .await
                .map_err(|error| ArchiverError::Task(error.to_string()))??;
            archived += count;
            if let Err(error) = self.log.commit(ARCHIVER_GROUP, &topic, &next).await {
                tracing::debug!(%error, "archiver group commit failed (informational only)");
            }
        }
    }
}
