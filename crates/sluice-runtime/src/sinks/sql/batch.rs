//! A batch's records as a SQL sink writes them: rows made as the database takes them, so that
//! converting a record overlaps the database's work on the rows before it.
//!
//! Two things must be known before the first row is written: which block hashes the batch's
//! reorg markers void (a row of such a block is not written, wherever it stands in the
//! batch), and whether there is anything to write at all. [`BatchRows::new`] finds the
//! markers in a first pass that parses only a record that can be one: a marker's `reorg`
//! field is spelled out in its bytes (`"reorg"`), or hidden behind a `\u` escape.
//! Everything else is converted once, by [`BatchRows::rows`], while the backend sends.
//!
//! A batch may begin before the position the database holds: another worker of the same
//! pipeline (on a node that was stopped or cut off long enough for its work to move) wrote
//! part of it while this one read it. The backend reads that position under its lock and
//! tells [`BatchRows::skip_written`]; rows of records before it are then not written again.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use sluice_bus::NewRecord;

use super::Row;
use super::layout::{BlockHash, Cell, Converted, Layout};
use crate::delivery::Origin;

/// The records of one batch (or a backfill chunk), to be written as one transaction.
#[derive(Debug)]
pub struct BatchRows<'a> {
    layout: &'a Layout,
    records: &'a [NewRecord],
    /// Where each record came from (empty when not known: a backfill chunk).
    origins: &'a [Origin],
    /// `(partition, next offset)` the database held when the write began: records before
    /// it are not rows again ([`BatchRows::skip_written`]).
    written: OnceLock<Vec<(u32, u64)>>,
    /// The indexes of the batch's reorg markers (ascending), none of them a row.
    markers: Vec<usize>,
    /// The block hashes the batch's markers void, in the batch's order.
    orphaned: Vec<String>,
    /// Every block hash voided so far, the batch's own included.
    voided: Arc<HashSet<String>>,
    /// The index of the column holding a row's block hash, when a marker can void rows.
    hash_column: Option<usize>,
    /// How far [`BatchRows::rows`] converted, and the records that cannot be rows.
    progress: Mutex<Progress>,
}

#[derive(Debug, Default)]
struct Progress {
    converted: usize,
    refused: Vec<(usize, String)>,
}

impl<'a> BatchRows<'a> {
    /// The batch of `records`, which came from `origins` (index by index, or empty);
    /// `voided` holds the block hashes earlier markers voided and gains the batch's own.
    pub fn new(
        layout: &'a Layout,
        records: &'a [NewRecord],
        origins: &'a [Origin],
        voided: &Mutex<Arc<HashSet<String>>>,
    ) -> Self {
        let (mut markers, mut orphaned) = (Vec::new(), Vec::new());
        if layout.block_hash.is_some() {
            for (index, record) in records.iter().enumerate() {
                if let Some(hash) = layout.marker(&record.key, &record.value) {
                    markers.push(index);
                    orphaned.push(hash);
                }
            }
        }
        let voided = {
            let mut known = voided.lock().expect("voided set lock is never poisoned");
            if !orphaned.is_empty() {
                Arc::make_mut(&mut known).extend(orphaned.iter().cloned());
            }
            Arc::clone(&known)
        };
        let hash_column = match &layout.block_hash {
            Some(BlockHash::Column(name)) if !voided.is_empty() => {
                layout.columns.iter().position(|c| &c.name == name)
            }
            _ => None,
        };
        Self {
            layout,
            records,
            origins,
            written: OnceLock::new(),
            markers,
            orphaned,
            voided,
            hash_column,
            progress: Mutex::new(Progress::default()),
        }
    }

    /// Whether the batch holds a record that may become a row.
    pub fn may_have_rows(&self) -> bool {
        self.records.len() > self.markers.len()
    }

    /// Whether there is nothing to write: no record that may be a row, and no marker.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The block hashes whose rows the batch's markers delete.
    pub fn orphaned(&self) -> &[String] {
        &self.orphaned
    }

    /// The batch's rows, converted as they are taken. A record that cannot be a row is
    /// noted with its reason ([`BatchRows::refused`]); a row of a voided block is left out.
    pub fn rows(&self) -> impl Iterator<Item = Row<'a>> + '_ {
        Rows { batch: self, next: 0, marker: 0, refused: Vec::new() }
    }

    /// The records that cannot be rows (index in the batch, reason), converting whatever
    /// [`BatchRows::rows`] did not reach (a batch the database already held is not written).
    pub fn refused(&self) -> Vec<(usize, String)> {
        let done = self.progress.lock().expect("progress lock is never poisoned").converted;
        if done < self.records.len() {
            let mut rest = Rows { batch: self, next: 0, marker: 0, refused: Vec::new() };
            rest.skip_to(done);
            rest.by_ref().for_each(drop);
        }
        self.progress.lock().expect("progress lock is never poisoned").refused.clone()
    }

    /// Tells the batch the positions the database holds (`(partition, next offset)`, read
    /// under the write's lock): a record whose origin is before its partition's position was
    /// written by an earlier transaction and is not a row of this one. Its refusal, if it
    /// cannot be a row, is still reported (dead letters are at least once).
    pub fn skip_written(&self, stored: &[(u32, u64)]) {
        if !self.origins.is_empty() && !stored.is_empty() {
            drop(self.written.set(stored.to_vec()));
        }
    }

    /// Whether record `index` is before the position the database held.
    fn written(&self, index: usize) -> bool {
        let (Some(stored), Some(origin)) = (self.written.get(), self.origins.get(index)) else {
            return false;
        };
        stored
            .iter()
            .any(|&(partition, next)| partition == origin.partition && origin.offset < next)
    }

    /// Whether `cells` belong to a block a marker voided.
    fn voided(&self, cells: &[Cell<'_>]) -> bool {
        self.hash_column.is_some_and(|index| match &cells[index] {
            Cell::Text(hash) => self.voided.contains(hash.as_ref()),
            _ => false,
        })
    }
}

/// The iterator of [`BatchRows::rows`]; what it reached is recorded when it is dropped.
struct Rows<'b, 'a> {
    batch: &'b BatchRows<'a>,
    next: usize,
    /// The position in `batch.markers` of the first marker at or after `next`.
    marker: usize,
    refused: Vec<(usize, String)>,
}

impl Rows<'_, '_> {
    fn skip_to(&mut self, index: usize) {
        self.next = index;
        self.marker = self.batch.markers.partition_point(|&m| m < index);
    }
}

impl<'a> Iterator for Rows<'_, 'a> {
    type Item = Row<'a>;

    fn next(&mut self) -> Option<Row<'a>> {
        let batch = self.batch;
        while let Some(record) = batch.records.get(self.next) {
            let index = self.next;
            self.next += 1;
            if batch.markers.get(self.marker) == Some(&index) {
                self.marker += 1;
                continue;
            }
            match batch.layout.convert(&record.key, &record.value) {
                Ok(Converted::Row { key, cells })
                    if !batch.voided(&cells) && !batch.written(index) =>
                {
                    return Some((key, cells));
                }
                Ok(_) => {}
                Err(reason) => self.refused.push((index, reason)),
            }
        }
        None
    }
}

impl Drop for Rows<'_, '_> {
    fn drop(&mut self) {
        let mut progress = self.batch.progress.lock().expect("progress lock is never poisoned");
        // Only what no earlier pass reached is new.
        if self.next > progress.converted {
            let from = progress.converted;
            progress.refused.extend(self.refused.drain(..).filter(|(index, _)| *index >= from));
            progress.converted = self.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::sql::layout::tests::config;
    use sluice_core::pipeline::SqlColumns;

    fn record(key: &str, value: &str) -> NewRecord {
        NewRecord::new(key.as_bytes().to_vec(), value.as_bytes().to_vec())
    }

    fn transfer(hash: &str, index: u32) -> NewRecord {
        record(
            &format!("0x{index}:0"),
            &format!(
                r#"{{"transaction_hash":"0x{index}","log_index":0,"block_hash":"{hash}","block_number":7}}"#
            ),
        )
    }

    #[test]
    fn markers_anywhere_in_the_batch_void_its_rows_and_later_batches_rows() {
        let layout = Layout::new(&config(SqlColumns::Auto), "erc20_token_transfer");
        let voided = Mutex::new(Arc::new(HashSet::new()));
        let records = [
            transfer("0xa", 1),
            transfer("0xb", 2),
            record("bad", r#"{"log_index":"not a number"}"#),
            // A marker after the row it voids, and one whose field name is escaped.
            record("m1", r#"{"reorg":true,"block_hash":"0xa"}"#),
            record("m2", r#"{"re\u006frg":true,"block_hash":"0xc"}"#),
        ];
        let batch = BatchRows::new(&layout, &records, &[], &voided);
        assert_eq!(batch.orphaned(), ["0xa", "0xc"]);
        assert!(batch.may_have_rows());
        let keys: Vec<&str> = batch.rows().map(|(key, _)| key).collect();
        assert_eq!(keys, ["0x2:0"]);
        let refused = batch.refused();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].0, 2);

        let later = [transfer("0xc", 3), transfer("0xd", 4)];
        let batch = BatchRows::new(&layout, &later, &[], &voided);
        assert!(batch.orphaned().is_empty());
        let keys: Vec<&str> = batch.rows().map(|(key, _)| key).collect();
        assert_eq!(keys, ["0x4:0"]);
    }

    #[test]
    fn records_before_the_position_the_database_holds_are_not_rows_again() {
        let layout = Layout::new(&config(SqlColumns::Auto), "erc20_token_transfer");
        let voided = Mutex::new(Arc::new(HashSet::new()));
        // Offsets 10..13 of partition 0 and 20..21 of partition 1, as a worker read them.
        let records = [
            transfer("0xa", 1),
            transfer("0xa", 2),
            record("bad", r#"{"log_index":"x"}"#),
            transfer("0xa", 3),
            transfer("0xa", 4),
        ];
        let origin = |partition, offset| Origin { partition, offset, timestamp_ms: 0 };
        let origins = [origin(0, 10), origin(0, 11), origin(0, 12), origin(1, 20), origin(0, 13)];
        let keys = |batch: &BatchRows<'_>| -> Vec<String> {
            batch.rows().map(|(key, _)| key.to_owned()).collect()
        };
        // Another worker wrote partition 0 up to offset 12 (not 12 itself); partition 1 not
        // at all.
        let batch = BatchRows::new(&layout, &records, &origins, &voided);
        batch.skip_written(&[(0, 12), (1, 5)]);
        assert_eq!(keys(&batch), ["0x3:0", "0x4:0"]);
        let refused: Vec<usize> = batch.refused().into_iter().map(|(index, _)| index).collect();
        assert_eq!(refused, [2], "a refusal is reported whoever wrote its batch");
        // Nothing held yet, or no origins known: every record is a row.
        let fresh = BatchRows::new(&layout, &records, &origins, &voided);
        fresh.skip_written(&[]);
        assert_eq!(keys(&fresh).len(), 4);
        let unknown = BatchRows::new(&layout, &records, &[], &voided);
        unknown.skip_written(&[(0, 100), (1, 100)]);
        assert_eq!(keys(&unknown).len(), 4);
    }

    #[test]
    fn refusals_are_found_once_whether_or_not_the_rows_were_taken() {
        let layout = Layout::new(&config(SqlColumns::Auto), "erc20_token_transfer");
        let voided = Mutex::new(Arc::new(HashSet::new()));
        let records = [
            record("bad1", r#"{"log_index":"x"}"#),
            transfer("0xa", 1),
            record("bad2", r#"{"block_number":true}"#),
        ];
        // Not taken at all (the database already held the batch).
        let untouched = BatchRows::new(&layout, &records, &[], &voided);
        let indexes = |refused: Vec<(usize, String)>| -> Vec<usize> {
            refused.into_iter().map(|(index, _)| index).collect()
        };
        assert_eq!(indexes(untouched.refused()), [0, 2]);
        // Taken in part, then the rest.
        let partly = BatchRows::new(&layout, &records, &[], &voided);
        assert_eq!(partly.rows().next().map(|(key, _)| key), Some("0x1:0"));
        assert_eq!(indexes(partly.refused()), [0, 2]);
        assert_eq!(indexes(partly.refused()), [0, 2]);
        // Taken whole.
        let whole = BatchRows::new(&layout, &records, &[], &voided);
        assert_eq!(whole.rows().count(), 1);
        assert_eq!(indexes(whole.refused()), [0, 2]);
    }
}
