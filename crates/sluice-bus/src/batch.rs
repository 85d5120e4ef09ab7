//! Record batches: how the embedded log stores records, many to a database entry (as Kafka
//! stores record batches in its segments).
//!
//! An append puts its records for one partition into batches of at most [`BATCH_BYTES`]
//! stored (a single larger record gets a batch of its own); every record of a batch has the
//! batch's append time. Layout, little-endian:
//!
//! ```text
//! version u8 (1) | count u32 | timestamp_ms i64 | crc32 u32 (of the body)
//! body: count × (key_len u32 | value_len u32 | key | value)
//! ```
//!
//! A read copies a stored batch out of the database once and hands out its records as
//! slices of that copy ([`Bytes`]), so no record is copied on its own.

use bytes::Bytes;

use crate::Record;

const VERSION: u8 = 1;
const HEADER: usize = 1 + 4 + 8 + 4;
const RECORD_HEADER: usize = 8;

/// The most a stored batch of more than one record holds: with the database's own leaf
/// header (24 bytes for one entry of this table) it fits a 256 KiB page. A batch even a
/// little larger takes a 512 KiB page, written whole at the commit: twice the bytes to disk.
/// Small enough that a read of a few records copies little.
pub(crate) const BATCH_BYTES: usize = 256 * 1024 - 64;

/// The stored size of one record in a batch: its lengths, key and value.
pub(crate) fn record_bytes(key_len: usize, value_len: usize) -> usize {
    RECORD_HEADER + key_len + value_len
}

/// How many of `records` (key and value lengths, in append order) the next batch takes: as
/// many as fit [`BATCH_BYTES`], and at least one. Answers the count and the batch's stored
/// size.
pub(crate) fn next_batch(records: impl Iterator<Item = (usize, usize)>) -> (usize, usize) {
    let (mut count, mut size) = (0, HEADER);
    for (key_len, value_len) in records {
        let record = record_bytes(key_len, value_len);
        if count > 0 && size + record > BATCH_BYTES {
            break;
        }
        count += 1;
        size += record;
    }
    (count, size)
}

/// Writes a batch into `stored`, whose length is the batch's stored size ([`next_batch`]),
/// as the database's own page memory: no copy of the batch is built first.
///
/// # Panics
/// When the records do not fill `stored` exactly (the caller sized it for them).
pub(crate) fn write<'r>(
    stored: &mut [u8],
    timestamp_ms: i64,
    records: impl Iterator<Item = (&'r [u8], &'r [u8])>,
) {
    let mut at = HEADER;
    let mut count = 0u32;
    for (key, value) in records {
        stored[at..at + 4].copy_from_slice(&(key.len() as u32).to_le_bytes());
        stored[at + 4..at + RECORD_HEADER].copy_from_slice(&(value.len() as u32).to_le_bytes());
        at += RECORD_HEADER;
        stored[at..at + key.len()].copy_from_slice(key);
        at += key.len();
        stored[at..at + value.len()].copy_from_slice(value);
        at += value.len();
        count += 1;
    }
    assert_eq!(at, stored.len(), "a batch is written into exactly its stored size");
    let crc = crc32fast::hash(&stored[HEADER..]);
    stored[..HEADER].copy_from_slice(&header_bytes(count, timestamp_ms, crc));
}

fn header_bytes(count: u32, timestamp_ms: i64, crc: u32) -> [u8; HEADER] {
    let mut header = [0u8; HEADER];
    header[0] = VERSION;
    header[1..5].copy_from_slice(&count.to_le_bytes());
    header[5..13].copy_from_slice(&timestamp_ms.to_le_bytes());
    header[13..17].copy_from_slice(&crc.to_le_bytes());
    header
}

/// The size a record counts for in a partition's retained bytes (`max_bytes` retention):
/// its key and value and 12 bytes of overhead. The same as before batches, so retention
/// limits keep their meaning.
pub(crate) fn accounted_size(key_len: usize, value_len: usize) -> u64 {
    (12 + key_len + value_len) as u64
}

/// Builds one stored batch in a buffer of its own (the conversion of a legacy log, which
/// does not know a batch's records in advance).
pub(crate) struct BatchBuilder {
    buf: Vec<u8>,
    count: u32,
    timestamp_ms: i64,
}

impl BatchBuilder {
    pub(crate) fn new(timestamp_ms: i64) -> Self {
        let mut buf = Vec::with_capacity(HEADER + 4096);
        buf.resize(HEADER, 0);
        Self { buf, count: 0, timestamp_ms }
    }

    pub(crate) fn push(&mut self, key: &[u8], value: &[u8]) {
        self.buf.reserve(record_bytes(key.len(), value.len()));
        self.buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(key);
        self.buf.extend_from_slice(value);
        self.count += 1;
    }

    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// Whether a record of these lengths may join the batch ([`BATCH_BYTES`]).
    pub(crate) fn fits(&self, key_len: usize, value_len: usize) -> bool {
        self.count == 0 || self.buf.len() + record_bytes(key_len, value_len) <= BATCH_BYTES
    }

    /// The stored bytes.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let crc = crc32fast::hash(&self.buf[HEADER..]);
        self.buf[..HEADER].copy_from_slice(&header_bytes(self.count, self.timestamp_ms, crc));
        self.buf
    }
}

/// What a batch's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchHeader {
    pub count: u32,
    pub timestamp_ms: i64,
}

/// The header of a stored batch, or why it is not one.
pub(crate) fn header(stored: &[u8]) -> Result<BatchHeader, &'static str> {
    if stored.len() < HEADER {
        return Err("batch shorter than its header");
    }
    if stored[0] != VERSION {
        return Err("unknown batch version");
    }
    Ok(BatchHeader {
        count: u32::from_le_bytes(stored[1..5].try_into().expect("4 bytes")),
        timestamp_ms: i64::from_le_bytes(stored[5..13].try_into().expect("8 bytes")),
    })
}

/// The records of a stored batch as `(key range, value range)` within `stored`, checked
/// against the checksum and the header's count.
fn spans(
    stored: &[u8],
) -> Result<impl Iterator<Item = (std::ops::Range<usize>, std::ops::Range<usize>)> + '_, &'static str>
{
    let head = header(stored)?;
    let crc = u32::from_le_bytes(stored[13..17].try_into().expect("4 bytes"));
    if crc32fast::hash(&stored[HEADER..]) != crc {
        return Err("batch checksum mismatch");
    }
    // The checksum held, so the lengths are the ones written; still, never index past the
    // end of the slice.
    let mut at = HEADER;
    let mut left = head.count;
    let mut broken = false;
    let iter = std::iter::from_fn(move || {
        if left == 0 || broken {
            return None;
        }
        let lengths = stored.get(at..at + RECORD_HEADER);
        let Some(lengths) = lengths else {
            broken = true;
            return None;
        };
        let key_len = u32::from_le_bytes(lengths[..4].try_into().expect("4 bytes")) as usize;
        let value_len = u32::from_le_bytes(lengths[4..].try_into().expect("4 bytes")) as usize;
        let key = at + RECORD_HEADER..at + RECORD_HEADER + key_len;
        let value = key.end..key.end + value_len;
        if value.end > stored.len() {
            broken = true;
            return None;
        }
        at = value.end;
        left -= 1;
        Some((key, value))
    });
    Ok(iter)
}

/// The accounted size ([`accounted_size`]) of each record of a stored batch, in order.
pub(crate) fn record_sizes(stored: &[u8]) -> Result<Vec<u64>, &'static str> {
    let count = header(stored)?.count as usize;
    let sizes: Vec<u64> = spans(stored)?.map(|(k, v)| accounted_size(k.len(), v.len())).collect();
    if sizes.len() == count { Ok(sizes) } else { Err("batch shorter than its count") }
}

/// Appends to `out` the records of `batch` (stored at `base` in `partition`) whose offsets
/// are at or after `from`, until `out` holds `max`. The records are slices of `batch`.
pub(crate) fn read_into(
    batch: &Bytes,
    partition: u32,
    base: u64,
    from: u64,
    max: usize,
    out: &mut Vec<Record>,
) -> Result<(), &'static str> {
    let head = header(batch)?;
    let before = out.len();
    let mut seen = 0u32;
    for (offset, (key, value)) in (base..).zip(spans(batch)?) {
        seen += 1;
        if offset < from {
            continue;
        }
        if out.len() >= max {
            return Ok(());
        }
        out.push(Record {
            partition,
            offset,
            timestamp_ms: head.timestamp_ms,
            key: batch.slice(key),
            value: batch.slice(value),
        });
    }
    if seen == head.count {
        Ok(())
    } else {
        out.truncate(before);
        Err("batch shorter than its count")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(records: &[(&[u8], &[u8])]) -> Bytes {
        let mut builder = BatchBuilder::new(-7);
        for (key, value) in records {
            builder.push(key, value);
        }
        Bytes::from(builder.finish())
    }

    #[test]
    fn a_batch_round_trips_and_reads_from_an_offset() {
        let batch = built(&[(b"k1", b"one"), (b"", b""), (b"k3", b"three")]);
        assert_eq!(header(&batch), Ok(BatchHeader { count: 3, timestamp_ms: -7 }));
        let mut out = Vec::new();
        read_into(&batch, 2, 10, 11, 100, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!((out[0].partition, out[0].offset, out[0].timestamp_ms), (2, 11, -7));
        assert_eq!((&out[0].key[..], &out[0].value[..]), (&b""[..], &b""[..]));
        assert_eq!((&out[1].key[..], &out[1].value[..]), (&b"k3"[..], &b"three"[..]));
        assert_eq!(record_sizes(&batch).unwrap(), vec![17, 12, 19]);
        // `max` counts what `out` holds in all.
        let mut capped = vec![out[0].clone()];
        read_into(&batch, 2, 10, 0, 2, &mut capped).unwrap();
        assert_eq!(capped.len(), 2);
        assert_eq!(capped[1].offset, 10);
    }

    #[test]
    fn damage_is_detected_not_read() {
        let batch = built(&[(b"k", b"value")]).to_vec();
        let mut flipped = batch.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let mut out = Vec::new();
        assert!(read_into(&Bytes::from(flipped), 0, 0, 0, 10, &mut out).is_err());
        assert!(read_into(&Bytes::from(batch[..10].to_vec()), 0, 0, 0, 10, &mut out).is_err());
        let mut versioned = batch.clone();
        versioned[0] = 9;
        assert!(read_into(&Bytes::from(versioned), 0, 0, 0, 10, &mut out).is_err());
        let mut miscounted = batch;
        miscounted[1] = 2;
        assert!(read_into(&Bytes::from(miscounted.clone()), 0, 0, 0, 10, &mut out).is_err());
        assert!(record_sizes(&miscounted).is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn a_batch_stays_within_its_size_and_a_large_record_gets_one_alone() {
        let mut builder = BatchBuilder::new(0);
        let value = vec![b'x'; 1000];
        while builder.fits(1, value.len()) {
            builder.push(b"k", &value);
        }
        assert_eq!(builder.count() as usize, (BATCH_BYTES - HEADER) / 1009);
        assert!(builder.finish().len() <= BATCH_BYTES);
        let lengths = [(1, 1000); 300];
        let (count, size) = next_batch(lengths.iter().copied());
        assert_eq!((count, size), ((BATCH_BYTES - HEADER) / 1009, HEADER + count * 1009));
        assert_eq!(
            next_batch([(1, BATCH_BYTES), (1, 1)].into_iter()),
            (1, HEADER + 9 + BATCH_BYTES)
        );
        let empty = BatchBuilder::new(0);
        assert!(empty.fits(1, BATCH_BYTES));
    }

    #[test]
    fn a_batch_written_in_place_is_the_built_one() {
        let records: [(&[u8], &[u8]); 3] = [(b"k1", b"one"), (b"", b""), (b"k3", b"three")];
        let (count, size) = next_batch(records.iter().map(|(k, v)| (k.len(), v.len())));
        assert_eq!(count, 3);
        let mut stored = vec![0u8; size];
        write(&mut stored, -7, records.iter().copied());
        assert_eq!(Bytes::from(stored), built(&records));
    }
}
