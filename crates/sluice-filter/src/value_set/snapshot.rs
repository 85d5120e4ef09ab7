//! A [`ValueSet`] written to bytes and read back, so a large set is ready soon after a
//! restart without reading every value from the store again.
//!
//! Layout (integers little-endian): the magic `SLUICESET\x01`, the value count (u64), the
//! arena length (u64), the live entries of the arena (each `header, payload` as in memory,
//! garbage left out), then a checksum (u64) of everything before it. Reading checks the
//! magic, the checksum and every entry's bounds, and rebuilds the hash table from the
//! entries; anything wrong is an error, never a wrong set. The checksum is foldhash with a
//! fixed seed: a snapshot written by a build with another foldhash reads as corrupt, and the
//! caller loads the set from the store instead.

use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};

use foldhash::fast::FixedState;

use super::{Slots, Table, ValueSet, entry_size, rehash};

const MAGIC: &[u8; 10] = b"SLUICESET\x01";
const CHECKSUM_STATE: FixedState = FixedState::with_seed(0x736e_6170_7368_6f74);

/// Bytes checksummed per block: the checksum of a stream does not depend on how it was cut
/// into writes or reads.
const BLOCK: usize = 64 * 1024;

/// Checksums what passes through, in blocks of [`BLOCK`] bytes.
struct Summing<T> {
    inner: T,
    hasher: foldhash::fast::FoldHasher,
    block: Vec<u8>,
}

impl<T> Summing<T> {
    fn new(inner: T) -> Self {
        Self { inner, hasher: CHECKSUM_STATE.build_hasher(), block: Vec::with_capacity(BLOCK) }
    }

    fn sum(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let take = (BLOCK - self.block.len()).min(bytes.len());
            self.block.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.block.len() == BLOCK {
                self.hasher.write(&self.block);
                self.block.clear();
            }
        }
    }

    /// The checksum of everything so far.
    fn checksum(&mut self) -> u64 {
        self.hasher.write(&self.block);
        self.block.clear();
        self.hasher.finish()
    }
}

impl<W: Write> Summing<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.sum(bytes);
        self.inner.write_all(bytes)
    }
}

impl<R: Read> Summing<R> {
    fn take(&mut self, into: &mut [u8]) -> io::Result<()> {
        self.inner.read_exact(into)?;
        self.sum(into);
        Ok(())
    }

    fn take_u64(&mut self) -> io::Result<u64> {
        let mut bytes = [0; 8];
        self.take(&mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }
}

fn corrupt(reason: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("value set snapshot: {reason}"))
}

impl ValueSet {
    /// Writes the set's values (see the module docs); [`ValueSet::read_snapshot`] reads them
    /// back.
    ///
    /// # Errors
    /// What `out` returns.
    pub fn write_snapshot(&self, out: impl Write) -> io::Result<()> {
        let mut out = Summing::new(io::BufWriter::with_capacity(1 << 20, out));
        out.put(MAGIC)?;
        out.put(&(self.len() as u64).to_le_bytes())?;
        out.put(&(self.live_bytes as u64).to_le_bytes())?;
        let arena = &self.arena;
        with_table!(&self.slots, table => {
            for offset in table.offsets() {
                out.put(&arena[offset..offset + entry_size(arena, offset)])?;
            }
        });
        let checksum = out.checksum();
        out.inner.write_all(&checksum.to_le_bytes())?;
        out.inner.flush()
    }

    /// Reads a set [`ValueSet::write_snapshot`] wrote.
    ///
    /// # Errors
    /// `InvalidData` when the bytes are not a whole, intact snapshot; what `input` returns.
    pub fn read_snapshot(input: impl Read) -> io::Result<Self> {
        let mut input = Summing::new(io::BufReader::with_capacity(1 << 20, input));
        let mut magic = [0; MAGIC.len()];
        input.take(&mut magic)?;
        if &magic != MAGIC {
            return Err(corrupt("not a snapshot of this format"));
        }
        let count = usize::try_from(input.take_u64()?).map_err(|_| corrupt("count"))?;
        let arena_len = usize::try_from(input.take_u64()?).map_err(|_| corrupt("length"))?;
        // Every entry takes at least one byte: a count above the length is a lie.
        if count > arena_len {
            return Err(corrupt("more values than bytes"));
        }
        let mut arena = Vec::new();
        arena.try_reserve_exact(arena_len).map_err(|_| corrupt("too large to hold"))?;
        arena.resize(arena_len, 0);
        input.take(&mut arena)?;
        let expected = input.checksum();
        let mut stored = [0; 8];
        input.inner.read_exact(&mut stored)?;
        if u64::from_le_bytes(stored) != expected {
            return Err(corrupt("checksum mismatch"));
        }
        let entries = entry_offsets(&arena)?;
        if entries.len() != count {
            return Err(corrupt("value count mismatch"));
        }
        let mut set = ValueSet::with_capacity(count);
        if arena_len > set.narrow_offset_limit {
            set.slots = Slots::Wide(Table::with_capacity(count));
        }
        {
            let arena = &arena;
            with_table!(&mut set.slots, table => {
                for &offset in &entries {
                    table.insert(rehash(arena, offset), offset, |at| rehash(arena, at));
                }
            });
        }
        set.live_bytes = arena_len;
        set.arena = arena;
        Ok(set)
    }
}

/// The offset of every entry of `arena`, checking that each lies within it.
fn entry_offsets(arena: &[u8]) -> io::Result<Vec<usize>> {
    let mut offsets = Vec::new();
    let mut at = 0;
    while at < arena.len() {
        let (tag, header) = checked_varint(arena, at).ok_or_else(|| corrupt("bad entry header"))?;
        let end = at
            .checked_add(header)
            .and_then(|start| start.checked_add(tag >> 1))
            .filter(|end| *end <= arena.len())
            .ok_or_else(|| corrupt("entry past the end"))?;
        if tag & 1 == 1 && (tag >> 1) > super::MAX_PACKED_BYTES {
            return Err(corrupt("packed entry too long"));
        }
        offsets.push(at);
        at = end;
    }
    Ok(offsets)
}

/// A LEB128 value at `at` and its length, when it is whole and fits a `usize`.
fn checked_varint(bytes: &[u8], at: usize) -> Option<(usize, usize)> {
    let mut value: usize = 0;
    for (i, byte) in bytes.get(at..)?.iter().take(10).enumerate() {
        let bits = usize::from(byte & 0x7f).checked_shl(7 * i as u32)?;
        value |= bits;
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ValueSet {
        let mut set = ValueSet::new();
        for i in 0..5_000u32 {
            set.insert(&format!("0x{i:040x}"));
        }
        set.insert("plain text value");
        set.insert(&"y".repeat(300));
        for i in (0..5_000u32).step_by(3) {
            set.remove(&format!("0x{i:040x}"));
        }
        set
    }

    #[test]
    fn a_snapshot_reads_back_the_same_values_without_garbage() {
        let set = sample();
        let mut bytes = Vec::new();
        set.write_snapshot(&mut bytes).unwrap();
        let back = ValueSet::read_snapshot(bytes.as_slice()).unwrap();
        assert_eq!(back.len(), set.len());
        assert_eq!(back.garbage_bytes, 0);
        for i in 0..5_000u32 {
            let value = format!("0x{i:040x}");
            assert_eq!(back.contains(&value), set.contains(&value), "{value}");
        }
        assert!(back.contains("plain text value") && back.contains(&"y".repeat(300)));
        assert!(!back.contains("absent"));
        // It stays a working set.
        let mut back = back;
        assert!(back.insert("new") && back.remove("plain text value"));
        assert_eq!(back.len(), set.len());
    }

    #[test]
    fn a_damaged_or_cut_snapshot_is_an_error() {
        let mut bytes = Vec::new();
        sample().write_snapshot(&mut bytes).unwrap();
        let mut flipped = bytes.clone();
        flipped[100] ^= 1;
        assert!(ValueSet::read_snapshot(flipped.as_slice()).is_err());
        assert!(ValueSet::read_snapshot(&bytes[..bytes.len() - 1]).is_err());
        assert!(ValueSet::read_snapshot(&bytes[..20]).is_err());
        assert!(ValueSet::read_snapshot(&b"SLUICESET\x02"[..]).is_err());
        let mut empty = Vec::new();
        ValueSet::new().write_snapshot(&mut empty).unwrap();
        assert_eq!(ValueSet::read_snapshot(empty.as_slice()).unwrap().len(), 0);
    }

    #[test]
    fn headers_past_the_end_are_refused() {
        assert!(entry_offsets(&[0x85]).is_err()); // unfinished varint
        assert!(entry_offsets(&[0x10, 1, 2]).is_err()); // payload of 8 bytes, 2 present
        assert_eq!(entry_offsets(&[0x04, 1, 2, 0x00]).unwrap(), vec![0, 3]);
    }
}
