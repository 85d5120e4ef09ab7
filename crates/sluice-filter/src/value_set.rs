//! [`ValueSet`]: an exact set of normalised filter values, compact enough to hold tens of
//! millions of addresses.
//!
//! # Layout
//! Every value lives once in a single byte arena as `header, payload`:
//! - the header is a LEB128 varint of `payload_len << 1 | packed`;
//! - a *packed* value is one that reads `0x` followed by 2 to [`MAX_PACKED_BYTES`]`* 2`
//!   lowercase hex digits (an even number); its payload is the decoded bytes, so a 42-char
//!   address takes 21 bytes;
//! - every other value is stored as its UTF-8 bytes (a 1-byte header up to 63 bytes).
//!
//! Whether a value is packed is a function of the string alone, so each string has exactly
//! one encoding and comparing encodings is comparing strings. A hash table
//! (`value_set/table.rs`) holds the arena offset of every live entry in 64-byte groups (12
//! four-byte offsets while the arena is below 4 GiB, 7 eight-byte offsets after that), hashed
//! with foldhash over `(packed, payload)`. A lookup encodes the candidate the same way into a
//! stack buffer, so it never allocates, and almost always reads one table cache line (plus the
//! entry's bytes when a tag matches).
//!
//! A set of 42-char addresses takes 21 arena bytes and 6.4 table bytes (at the 10-in-12 load
//! limit) per value: 10 000 000 addresses measure 264 MiB.
//!
//! Removing a value only frees its slot; the bytes stay in the arena as garbage until garbage
//! outweighs live bytes, when the arena is rewritten with live entries only (briefly holding
//! the old and the new arena).

mod table;

use std::fmt;
use std::hash::{BuildHasher, Hasher};

use foldhash::fast::FixedState;

use self::table::{NarrowGroup, Table, WideGroup};

/// The longest decoded `0x…` hex value stored packed (64 bytes = 128 hex digits). Longer hex
/// values are stored as text; the bound keeps lookups allocation-free.
pub const MAX_PACKED_BYTES: usize = 64;

/// Values of at most this many bytes are lowercased on the stack by
/// [`ValueSet::contains_unnormalized`]; longer ASCII values allocate once.
pub const STACK_LOWERCASE_BYTES: usize = 256;

/// The fixed hash seed: sets are process-local and rebuilt from the store, so a per-process
/// random seed would buy nothing but non-reproducible benchmarks. Inputs are operator-chosen
/// filter values and record fields, and a hash-flooding record can only slow lookups of its
/// own field, never make them wrong.
const HASH_STATE: FixedState = FixedState::with_seed(0x5c1e_e5e7_f117_e700);

/// The arena grows by at least this much, and otherwise by an eighth of its size: small
/// steps keep the unused tail small (large reallocations are cheap remaps on Linux).
const MIN_ARENA_GROWTH: usize = 64 * 1024;

/// The largest entry offset a 4-byte slot holds.
const NARROW_OFFSET_LIMIT: usize = u32::MAX as usize;

/// An exact set of strings, stored compactly.
///
/// Values given to [`insert`](Self::insert), [`remove`](Self::remove) and
/// [`contains`](Self::contains) are taken as they are (callers pass values already in
/// normal form, see [`sluice_core::filter_values::normalize`]);
/// [`contains_unnormalized`](Self::contains_unnormalized) lowercases its argument first.
///
/// There is no size limit other than memory: offsets are 4 bytes until the arena passes
/// 4 GiB, and the table switches to 8-byte offsets (a one-time rebuild) when it does.
#[derive(Clone)]
pub struct ValueSet {
    arena: Vec<u8>,
    slots: Slots,
    /// Arena bytes (headers included) of live entries.
    live_bytes: usize,
    /// Arena bytes of removed entries not yet compacted away.
    garbage_bytes: usize,
    /// The largest entry offset kept in narrow slots; lowered only by unit tests, to reach
    /// the wide-slot path without a 4 GiB arena.
    narrow_offset_limit: usize,
}

#[derive(Clone)]
enum Slots {
    Narrow(Table<NarrowGroup>),
    Wide(Table<WideGroup>),
}

/// Runs `$body` with `$table` bound to whichever table the set uses.
macro_rules! with_table {
    ($slots:expr, $table:ident => $body:expr) => {
        match $slots {
            Slots::Narrow($table) => $body,
            Slots::Wide($table) => $body,
        }
    };
}

// After the macro, which it uses.
mod snapshot;

impl ValueSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty set whose table holds `values` values without growing. The arena is not
    /// reserved ahead (the size of the values is unknown); it grows in steps of an eighth.
    pub fn with_capacity(values: usize) -> Self {
        Self {
            arena: Vec::new(),
            slots: Slots::Narrow(Table::with_capacity(values)),
            live_bytes: 0,
            garbage_bytes: 0,
            narrow_offset_limit: NARROW_OFFSET_LIMIT,
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        with_table!(&self.slots, table => table.len())
    }

    /// Whether the set holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes allocated by the arena and the table (capacity, not just what is used).
    pub fn heap_bytes(&self) -> usize {
        self.arena.capacity() + with_table!(&self.slots, table => table.allocation_size())
    }

    /// Adds `value`; returns whether it was new.
    pub fn insert(&mut self, value: &str) -> bool {
        let mut buf = [0; MAX_PACKED_BYTES];
        let (packed, payload) = encode(value.as_bytes(), &mut buf);
        let hash = hash(packed, payload);
        if self.find_offset(hash, packed, payload).is_some() {
            return false;
        }
        let offset = self.arena.len();
        if offset > self.narrow_offset_limit {
            self.widen();
        }
        self.push_entry(packed, payload);
        let arena = &self.arena;
        with_table!(&mut self.slots, table => {
            table.insert(hash, offset, |offset| rehash(arena, offset));
        });
        true
    }

    /// Removes `value`; returns whether it was present.
    pub fn remove(&mut self, value: &str) -> bool {
        let mut buf = [0; MAX_PACKED_BYTES];
        let (packed, payload) = encode(value.as_bytes(), &mut buf);
        let hash = hash(packed, payload);
        let arena = &self.arena;
        let removed = with_table!(&mut self.slots, table => {
            table.find(hash, |offset| entry_is(arena, offset, packed, payload)).map(|position| {
                let offset = table.offset_at(position);
                table.remove(hash, position);
                offset
            })
        });
        let Some(offset) = removed else {
            return false;
        };
        let size = entry_size(&self.arena, offset);
        self.live_bytes -= size;
        self.garbage_bytes += size;
        if self.garbage_bytes > self.live_bytes {
            self.compact();
        }
        true
    }

    /// Whether `value`, taken as it is, is in the set.
    #[inline]
    pub fn contains(&self, value: &str) -> bool {
        let mut buf = [0; MAX_PACKED_BYTES];
        let (packed, payload) = encode(value.as_bytes(), &mut buf);
        self.find_offset(hash(packed, payload), packed, payload).is_some()
    }

    /// Whether `value` (UTF-8), once lowercased as
    /// [`sluice_core::filter_values::normalize`] does, is in the set.
    ///
    /// ASCII values do not allocate up to [`STACK_LOWERCASE_BYTES`] bytes (and `0x…` hex of
    /// any case up to [`MAX_PACKED_BYTES`] decoded bytes is decoded straight from the input);
    /// other values go through `str::to_lowercase`. Bytes that are not UTF-8 are never in the
    /// set, whose values are all strings.
    #[inline]
    pub fn contains_unnormalized(&self, value: &[u8]) -> bool {
        self.contains_lowercased(value, value.is_ascii())
    }

    /// [`contains_unnormalized`](Self::contains_unnormalized) for a caller that knows
    /// whether `value` is all ASCII.
    #[inline]
    pub(crate) fn contains_lowercased(&self, value: &[u8], ascii: bool) -> bool {
        with_lowercase_encoding(value, ascii, |packed, payload| {
            self.find_offset(hash(packed, payload), packed, payload).is_some()
        })
        .unwrap_or(false)
    }

    /// Prepares the lookup of `value` (as [`contains_unnormalized`](Self::contains_unnormalized)
    /// takes it, with `ascii` saying whether it is all ASCII): its encoding and hash, kept
    /// for [`preload`](Self::preload) and [`contains_probe`](Self::contains_probe).
    #[inline]
    pub(crate) fn probe(value: &[u8], ascii: bool) -> Probe {
        with_lowercase_encoding(value, ascii, |packed, payload| {
            let hash = hash(packed, payload);
            let mut bytes = [0; PROBE_INLINE_BYTES];
            match bytes.get_mut(..payload.len()) {
                Some(inline) => {
                    inline.copy_from_slice(payload);
                    Probe::Ready { hash, packed, len: payload.len(), bytes }
                }
                None => Probe::Long,
            }
        })
        .unwrap_or(Probe::Absent)
    }

    /// Reads the memory the lookups of `probes` will read: each home group, then the entries
    /// whose tags match there. Doing it for a batch in tight loops lets the cache misses of
    /// the batch overlap, instead of each lookup waiting for its own.
    pub(crate) fn preload(&self, probes: &[Probe]) {
        let hashes = probes.iter().filter_map(|probe| match probe {
            Probe::Ready { hash, .. } => Some(*hash),
            Probe::Long | Probe::Absent => None,
        });
        let arena = &self.arena;
        let touched = with_table!(&self.slots, table => {
            let groups = hashes.clone().fold(0, |seen, hash| seen ^ table.touch(hash));
            hashes.fold(groups, |seen, hash| {
                table.candidates(hash).fold(seen, |seen, offset| seen ^ arena[offset])
            })
        });
        std::hint::black_box(touched);
    }

    /// Whether the value `probe` was made from is in the set; `value` is that value, for
    /// the probes too long to keep their encoding.
    #[inline]
    pub(crate) fn contains_probe(&self, probe: &Probe, value: &[u8]) -> bool {
        match probe {
            Probe::Ready { hash, packed, len, bytes } => {
                self.find_offset(*hash, *packed, &bytes[..*len]).is_some()
            }
            Probe::Long => self.contains_unnormalized(value),
            Probe::Absent => false,
        }
    }

    /// Whether the value `prepared` was made from ([`crate::SetFilter::prepare`]) is in the
    /// set: the lookup of [`SetFilter::passes`](crate::SetFilter::passes) without extracting
    /// the value again, so one record's value can be tested against many sets.
    #[inline]
    pub fn contains_prepared(&self, prepared: &Prepared) -> bool {
        match &prepared.long {
            Some(value) => self.contains_unnormalized(value),
            None => self.contains_probe(&prepared.probe, &[]),
        }
    }

    /// For each of `prepared`, whether the set holds its value (as
    /// [`contains_prepared`](Self::contains_prepared) answers), pushed onto `found` in
    /// order. Faster than a loop of single lookups when the set is much larger than the CPU
    /// caches: the table memory of a few values is read together, so their cache misses
    /// overlap (as in [`crate::SetFilter::passes_batch`]).
    pub fn contains_prepared_batch(&self, prepared: &[Prepared], found: &mut Vec<bool>) {
        found.reserve(prepared.len());
        let mut probes = [Probe::Absent; PRELOAD_BATCH];
        for chunk in prepared.chunks(PRELOAD_BATCH) {
            for (probe, value) in probes.iter_mut().zip(chunk) {
                *probe = value.probe;
            }
            self.preload(&probes[..chunk.len()]);
            found.extend(chunk.iter().map(|value| self.contains_prepared(value)));
        }
    }

    /// The lookup hash of `value`, taken as it is (in normal form, as
    /// [`insert`](Self::insert) takes it): what [`Prepared::hash`] gives for a record whose
    /// value lowercases to it. Indexes over many sets key on it.
    pub fn hash_of(value: &str) -> u64 {
        let mut buf = [0; MAX_PACKED_BYTES];
        let (packed, payload) = encode(value.as_bytes(), &mut buf);
        hash(packed, payload)
    }

    /// The lookup hash of every value (as [`hash_of`](Self::hash_of) gives), in no order.
    pub fn hashes(&self) -> impl Iterator<Item = u64> + '_ {
        let arena = &self.arena;
        let offsets: Box<dyn Iterator<Item = usize> + '_> = match &self.slots {
            Slots::Narrow(table) => Box::new(table.offsets()),
            Slots::Wide(table) => Box::new(table.offsets()),
        };
        offsets.map(move |offset| rehash(arena, offset))
    }

    /// Every value, as the text it was inserted as after lowercasing (a packed `0x…` value
    /// comes back in lowercase hex), in no order. Used where a set's values must be listed
    /// from memory, such as the values a replace removes (the store's set history).
    pub fn values(&self) -> impl Iterator<Item = String> + '_ {
        let arena = &self.arena;
        let offsets: Box<dyn Iterator<Item = usize> + '_> = match &self.slots {
            Slots::Narrow(table) => Box::new(table.offsets()),
            Slots::Wide(table) => Box::new(table.offsets()),
        };
        offsets.map(move |offset| decode_entry(entry_at(arena, offset)))
    }

    /// Removes every value, keeping the allocated memory.
    pub fn clear(&mut self) {
        self.arena.clear();
        with_table!(&mut self.slots, table => table.clear());
        self.live_bytes = 0;
        self.garbage_bytes = 0;
    }

    /// Releases unused arena and table capacity (for example after a bulk load).
    pub fn shrink_to_fit(&mut self) {
        self.compact();
        let arena = &self.arena;
        with_table!(&mut self.slots, table => table.shrink_to_fit(|offset| rehash(arena, offset)));
    }

    #[inline]
    fn find_offset(&self, hash: u64, packed: bool, payload: &[u8]) -> Option<usize> {
        let arena = &self.arena;
        with_table!(&self.slots, table => {
            table
                .find(hash, |offset| entry_is(arena, offset, packed, payload))
                .map(|position| table.offset_at(position))
        })
    }

    fn push_entry(&mut self, packed: bool, payload: &[u8]) {
        let tag = (payload.len() << 1) | usize::from(packed);
        let size = varint_len(tag) + payload.len();
        if self.arena.capacity() - self.arena.len() < size {
            let step = (self.arena.capacity() / 8).max(MIN_ARENA_GROWTH).max(size);
            self.arena.reserve_exact(step);
        }
        write_varint(&mut self.arena, tag);
        self.arena.extend_from_slice(payload);
        self.live_bytes += size;
    }

    /// Switches to 8-byte slots, once the arena outgrows 4-byte offsets.
    fn widen(&mut self) {
        let Slots::Narrow(narrow) = &self.slots else {
            return;
        };
        let arena = &self.arena;
        self.slots = Slots::Wide(narrow.convert(|offset| rehash(arena, offset)));
    }

    /// Rewrites the arena with live entries only. Offsets only move down, so slots keep their
    /// width, and hashes do not depend on offsets, so the table is not rehashed.
    fn compact(&mut self) {
        if self.garbage_bytes == 0 && self.arena.capacity() == self.arena.len() {
            return;
        }
        let mut arena = Vec::with_capacity(self.live_bytes);
        let old = &self.arena;
        with_table!(&mut self.slots, table => table.for_each_offset_mut(|start| {
            let moved_to = arena.len();
            arena.extend_from_slice(&old[start..start + entry_size(old, start)]);
            moved_to
        }));
        self.arena = arena;
        self.garbage_bytes = 0;
    }
}

/// Values whose lookups [`ValueSet::contains_prepared_batch`] prepares together.
const PRELOAD_BATCH: usize = 32;

/// Encodings up to this long are kept in a [`Probe`]; longer ones are made again.
const PROBE_INLINE_BYTES: usize = 32;

/// A record's value at a set filter's path, extracted and hashed once
/// ([`crate::SetFilter::prepare`]) to be looked up in any number of sets
/// ([`ValueSet::contains_prepared`]).
#[derive(Debug, Clone)]
pub struct Prepared {
    probe: Probe,
    /// The value itself when its encoding is too long for the probe (rare: over 32 bytes
    /// once encoded), with its hash.
    long: Option<Box<[u8]>>,
    hash: Option<u64>,
}

impl Prepared {
    /// No value: the path is missing, holds no string or number, or the record is not JSON.
    pub const ABSENT: Self = Self { probe: Probe::Absent, long: None, hash: None };

    /// Prepares `value` (a string's text or a number's literal, not yet lowercased).
    pub(crate) fn of(value: &[u8], ascii: bool) -> Self {
        match ValueSet::probe(value, ascii) {
            probe @ Probe::Ready { hash, .. } => Self { probe, long: None, hash: Some(hash) },
            Probe::Absent => Self::ABSENT,
            Probe::Long => {
                let hash = with_lowercase_encoding(value, ascii, hash);
                Self { probe: Probe::Long, long: Some(value.into()), hash }
            }
        }
    }

    /// The lookup hash of the lowercased value (as [`ValueSet::hash_of`] gives for it);
    /// `None` when there is no value, which no set holds.
    #[inline]
    pub fn hash(&self) -> Option<u64> {
        self.hash
    }
}

/// A value prepared for lookup by [`ValueSet::probe`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Probe {
    /// The hash and encoding of the lowercased value.
    Ready { hash: u64, packed: bool, len: usize, bytes: [u8; PROBE_INLINE_BYTES] },
    /// An encoding too long to keep.
    Long,
    /// Nothing to look up: no value, or one that is not UTF-8 (so in no set).
    Absent,
}

impl Default for ValueSet {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ValueSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValueSet")
            .field("len", &self.len())
            .field("heap_bytes", &self.heap_bytes())
            .field("garbage_bytes", &self.garbage_bytes)
            .finish_non_exhaustive()
    }
}

impl<'a> Extend<&'a str> for ValueSet {
    fn extend<I: IntoIterator<Item = &'a str>>(&mut self, values: I) {
        for value in values {
            self.insert(value);
        }
    }
}

impl<'a> FromIterator<&'a str> for ValueSet {
    fn from_iter<I: IntoIterator<Item = &'a str>>(values: I) -> Self {
        let values = values.into_iter();
        let mut set = Self::with_capacity(values.size_hint().0);
        set.extend(values);
        set
    }
}

/// Calls `then` with the encoding of `value` lowercased; `None` when `value` is not UTF-8.
/// `ascii` says whether `value` is all ASCII.
#[inline]
fn with_lowercase_encoding<T>(
    value: &[u8],
    ascii: bool,
    then: impl FnOnce(bool, &[u8]) -> T,
) -> Option<T> {
    debug_assert_eq!(ascii, value.is_ascii());
    if !ascii {
        let lower = std::str::from_utf8(value).ok()?.to_lowercase();
        let mut buf = [0; MAX_PACKED_BYTES];
        let (packed, payload) = encode(lower.as_bytes(), &mut buf);
        return Some(then(packed, payload));
    }
    let mut hex = [0; MAX_PACKED_BYTES];
    if let Some(len) = pack_hex(value, true, &mut hex) {
        return Some(then(true, &hex[..len]));
    }
    // Not packable once lowercased either: `pack_hex` ignoring case is exactly "the
    // lowercased value is packable", so the lowercased value is stored as text.
    if value.len() <= STACK_LOWERCASE_BYTES {
        let mut lower = [0; STACK_LOWERCASE_BYTES];
        let lower = &mut lower[..value.len()];
        lower.copy_from_slice(value);
        lower.make_ascii_lowercase();
        Some(then(false, lower))
    } else {
        Some(then(false, &value.to_ascii_lowercase()))
    }
}

/// The encoding of `value`: `(true, decoded bytes)` when it is packable `0x…` lowercase hex,
/// otherwise `(false, value)`.
#[inline]
fn encode<'a>(value: &'a [u8], buf: &'a mut [u8; MAX_PACKED_BYTES]) -> (bool, &'a [u8]) {
    match pack_hex(value, false, buf) {
        Some(len) => (true, &buf[..len]),
        None => (false, value),
    }
}

/// Decodes `0x` + an even number (2 to `2 * MAX_PACKED_BYTES`) of hex digits into `buf`,
/// returning the decoded length. With `ignore_case`, `0X` and `A`-`F` are accepted too, which
/// makes this "is the ASCII-lowercased value packable".
#[inline]
fn pack_hex(value: &[u8], ignore_case: bool, buf: &mut [u8; MAX_PACKED_BYTES]) -> Option<usize> {
    let digits = hex_digits(value, ignore_case)?;
    // Eight digits a round as one word, then pairs by table; one check at the end, as
    // mixed-case addresses would make per-digit branches unpredictable.
    let mut words = digits.chunks_exact(8);
    let mut invalid = 0;
    for (out, chunk) in buf.chunks_exact_mut(4).zip(words.by_ref()) {
        let (bytes, bad) = decode_hex_word(chunk.try_into().expect("eight bytes"), ignore_case);
        invalid |= bad;
        out.copy_from_slice(&bytes);
    }
    let table = if ignore_case { &HEX_ANY_CASE } else { &HEX_LOWER };
    let done = (digits.len() - words.remainder().len()) / 2;
    for (out, pair) in buf[done..].iter_mut().zip(words.remainder().chunks_exact(2)) {
        let (high, low) = (table[usize::from(pair[0])], table[usize::from(pair[1])]);
        invalid |= u64::from((high | low) & NOT_HEX);
        *out = (high << 4) | (low & 0x0f);
    }
    (invalid == 0).then_some(digits.len() / 2)
}

/// The digits of a value shaped like a packable one: `0x` (or `0X` with `ignore_case`) and an
/// even number, 2 to `2 * MAX_PACKED_BYTES`, of bytes after it (not yet checked as digits).
#[inline]
fn hex_digits(value: &[u8], ignore_case: bool) -> Option<&[u8]> {
    let digits = match value {
        [b'0', b'x', digits @ ..] => digits,
        [b'0', b'X', digits @ ..] if ignore_case => digits,
        _ => return None,
    };
    let even = !digits.is_empty() && digits.len() % 2 == 0;
    (even && digits.len() <= 2 * MAX_PACKED_BYTES).then_some(digits)
}

/// Decodes eight hex digits into four bytes, in a `u64` (SWAR); the second value is non-zero
/// when one of them is not a hex digit (lowercase, or either case with `ignore_case`).
#[inline]
fn decode_hex_word(digits: &[u8; 8], ignore_case: bool) -> ([u8; 4], u64) {
    const fn bytes(byte: u8) -> u64 {
        u64::from_ne_bytes([byte; 8])
    }
    let word = u64::from_le_bytes(*digits);
    // Setting 0x20 lowercases `A`-`F` (and turns 0x10-0x19 into digits: ruled out below).
    let lower = if ignore_case { word | bytes(0x20) } else { word };
    // Read every byte as a digit: its low four bits, plus 9 when 0x40 is set (`a`-`f`).
    // Each byte stays below 0x19, so nothing carries into the next.
    let nibbles = (lower & bytes(0x0f)) + ((lower >> 6) & bytes(0x01)) * 9;
    // Then write each nibble back as a lowercase digit: a byte that was one reads the same
    // (`g`-`o` would too, as 16-24: those are ruled out by size).
    let letters = ((nibbles + bytes(0x80 - 10)) >> 7) & bytes(0x01);
    let respelled = nibbles + bytes(b'0') + letters * (b'a' - b'0' - 10) as u64;
    let mut invalid = (respelled ^ lower) | ((nibbles + bytes(0x80 - 16)) & bytes(0x80));
    if ignore_case {
        // Every hex digit of either case has 0x20 or 0x40 set; 0x10-0x19 have neither.
        invalid |= !(word | (word << 1)) & bytes(0x40);
    }
    // Pair the nibbles into bytes, then gather the bytes: 16-bit lanes, then 32-bit.
    let pairs = ((nibbles << 4) | (nibbles >> 8)) & 0x00ff_00ff_00ff_00ff;
    let pairs = (pairs | (pairs >> 8)) & 0x0000_ffff_0000_ffff;
    let packed = (pairs | (pairs >> 16)) as u32;
    (packed.to_le_bytes(), invalid)
}

/// The mark for "not a hex digit" in the digit tables.
const NOT_HEX: u8 = 0x80;
const HEX_LOWER: [u8; 256] = hex_table(false);
const HEX_ANY_CASE: [u8; 256] = hex_table(true);

/// Digit values by byte, [`NOT_HEX`] for everything else.
const fn hex_table(upper_too: bool) -> [u8; 256] {
    let mut table = [NOT_HEX; 256];
    let mut digit = 0;
    while digit < 16 {
        let lower = b"0123456789abcdef"[digit];
        let upper = b"0123456789ABCDEF"[digit];
        table[lower as usize] = digit as u8;
        if upper_too {
            table[upper as usize] = digit as u8;
        }
        digit += 1;
    }
    table
}

#[inline]
fn hash(packed: bool, payload: &[u8]) -> u64 {
    let mut hasher = HASH_STATE.build_hasher();
    hasher.write_u8(u8::from(packed));
    hasher.write(payload);
    hasher.finish()
}

fn rehash(arena: &[u8], offset: usize) -> u64 {
    let (packed, payload) = entry_at(arena, offset);
    hash(packed, payload)
}

/// Whether the entry at `offset` encodes `(packed, payload)`.
#[inline]
fn entry_is(arena: &[u8], offset: usize, packed: bool, payload: &[u8]) -> bool {
    let tag = (payload.len() << 1) | usize::from(packed);
    // Almost every entry has a one-byte header; compare it before decoding anything.
    if tag < 0x80 {
        return arena[offset] as usize == tag
            && &arena[offset + 1..offset + 1 + payload.len()] == payload;
    }
    let (stored, header) = read_varint(arena, offset);
    stored == tag && &arena[offset + header..offset + header + payload.len()] == payload
}

fn entry_at(arena: &[u8], offset: usize) -> (bool, &[u8]) {
    let (tag, header) = read_varint(arena, offset);
    let start = offset + header;
    (tag & 1 == 1, &arena[start..start + (tag >> 1)])
}

/// The text of an entry: packed bytes as `0x` and lowercase hex, others as stored.
fn decode_entry((packed, payload): (bool, &[u8])) -> String {
    if !packed {
        return String::from_utf8_lossy(payload).into_owned();
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(2 + payload.len() * 2);
    text.push_str("0x");
    for byte in payload {
        text.push(char::from(HEX[usize::from(byte >> 4)]));
        text.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    text
}

fn entry_size(arena: &[u8], offset: usize) -> usize {
    let (tag, header) = read_varint(arena, offset);
    header + (tag >> 1)
}

fn varint_len(mut value: usize) -> usize {
    let mut len = 1;
    while value >= 0x80 {
        value >>= 7;
        len += 1;
    }
    len
}

fn write_varint(out: &mut Vec<u8>, mut value: usize) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Decodes the varint at `offset`: `(value, bytes read)`. Only ever reads headers this module
/// wrote.
fn read_varint(arena: &[u8], offset: usize) -> (usize, usize) {
    let mut value = 0;
    let mut shift = 0;
    let mut at = offset;
    loop {
        let byte = arena[at];
        value |= usize::from(byte & 0x7f) << shift;
        at += 1;
        if byte < 0x80 {
            return (value, at - offset);
        }
        shift += 7;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    const ADDRESS: &str = "0x00000000219ab540356cbb839cbe05303d7705fa";

    #[test]
    fn an_address_takes_twenty_one_arena_bytes() {
        let mut set = ValueSet::new();
        assert!(set.insert(ADDRESS));
        assert_eq!(set.live_bytes, 21);
        assert!(set.insert("usdc"));
        assert_eq!(set.live_bytes, 21 + 5);
    }

    #[test]
    fn packed_and_text_encodings_of_look_alike_values_stay_distinct() {
        let mut set = ValueSet::new();
        // "0x6162" packs to the bytes b"ab", which are also the text payload of "ab".
        assert!(set.insert("0x6162"));
        assert!(!set.contains("ab"));
        assert!(set.insert("ab"));
        assert!(set.contains("0x6162") && set.contains("ab"));
        assert!(!set.contains("0x6162 "));
        // Not packable: odd length, uppercase, too long, empty hex.
        for value in ["0x616", "0x6A", "0X6a", "0x", &format!("0x{}", "ab".repeat(65))] {
            let mut buf = [0; MAX_PACKED_BYTES];
            assert!(!encode(value.as_bytes(), &mut buf).0, "{value}");
        }
        let longest = format!("0x{}", "ab".repeat(64));
        let mut buf = [0; MAX_PACKED_BYTES];
        assert!(encode(longest.as_bytes(), &mut buf).0);
    }

    #[test]
    fn long_values_use_multi_byte_headers() {
        let mut set = ValueSet::new();
        let long = "x".repeat(70_000);
        assert!(set.insert(&long));
        assert_eq!(set.live_bytes, 3 + 70_000);
        assert!(set.contains(&long));
        assert!(!set.contains(&long[1..]));
        assert!(set.remove(&long));
        assert!(set.is_empty());
    }

    #[test]
    fn garbage_is_compacted_once_it_outweighs_live_values() {
        let mut set = ValueSet::new();
        for i in 0..100 {
            set.insert(&format!("value-{i:03}"));
        }
        for i in 0..50 {
            assert!(set.remove(&format!("value-{i:03}")));
        }
        assert_eq!(set.garbage_bytes, 50 * 10);
        assert!(set.remove("value-050"));
        assert_eq!(set.garbage_bytes, 0);
        assert_eq!(set.arena.len(), set.live_bytes);
        assert_eq!(set.len(), 49);
        for i in 0..100 {
            assert_eq!(set.contains(&format!("value-{i:03}")), i > 50, "{i}");
        }
    }

    #[test]
    fn sets_past_the_narrow_offset_limit_switch_to_wide_slots() {
        let mut set = ValueSet::new();
        set.narrow_offset_limit = 100;
        for i in 0..50 {
            set.insert(&format!("value-{i:03}"));
        }
        assert!(matches!(set.slots, Slots::Wide(_)));
        for i in 0..60 {
            assert_eq!(set.contains(&format!("value-{i:03}")), i < 50, "{i}");
        }
    }

    #[test]
    fn unnormalized_lookups_lowercase_ascii_hex_and_unicode() {
        let mut set = ValueSet::new();
        set.extend([ADDRESS, "usdc", "straße", "ǆ", "0x0a"]);
        assert!(set.contains_unnormalized(ADDRESS.to_uppercase().replace("0X", "0x").as_bytes()));
        assert!(set.contains_unnormalized(ADDRESS.to_uppercase().as_bytes()));
        assert!(set.contains_unnormalized(b"USDC"));
        assert!(set.contains_unnormalized("STRAßE".as_bytes()));
        assert!(set.contains_unnormalized("ǅ".as_bytes()));
        assert!(set.contains_unnormalized(b"0X0A"));
        assert!(!set.contains_unnormalized(b"0x0a0"));
        assert!(!set.contains_unnormalized(b"\xff"));
        let long = "Q".repeat(STACK_LOWERCASE_BYTES + 1);
        assert!(!set.contains_unnormalized(long.as_bytes()));
        set.insert(&long.to_lowercase());
        assert!(set.contains_unnormalized(long.as_bytes()));
    }

    #[test]
    fn probed_lookups_answer_like_unnormalized_lookups() {
        let long_hex = format!("0x{}", "ab".repeat(70));
        let long_text = "T".repeat(100);
        let mut set: ValueSet =
            [ADDRESS, "usdc", "straße", long_hex.as_str()].into_iter().collect();
        set.insert(&long_text.to_lowercase());
        let upper = ADDRESS.to_uppercase();
        let probes: Vec<&[u8]> = vec![
            upper.as_bytes(),
            b"USDC",
            b"usdt",
            "STRAßE".as_bytes(),
            long_hex.as_bytes(),
            long_text.as_bytes(),
            b"\xff\xfe",
            b"",
        ];
        let prepared: Vec<Probe> =
            probes.iter().map(|value| ValueSet::probe(value, value.is_ascii())).collect();
        assert!(matches!(prepared[5], Probe::Long) && matches!(prepared[6], Probe::Absent));
        set.preload(&prepared);
        for (value, probe) in probes.iter().zip(&prepared) {
            assert_eq!(
                set.contains_probe(probe, value),
                set.contains_unnormalized(value),
                "{value:?}"
            );
        }
        let found = probes.iter().zip(&prepared).filter(|(v, p)| set.contains_probe(p, v)).count();
        assert_eq!(found, 5);
    }

    #[test]
    fn values_lists_every_live_value_in_its_text() {
        let mut set: ValueSet = ["0xabcd", "0x0A", "usdc", "0x0a", "gone"].into_iter().collect();
        assert!(set.remove("gone"));
        let mut values: Vec<String> = set.values().collect();
        values.sort();
        assert_eq!(values, ["0x0A", "0x0a", "0xabcd", "usdc"]);
    }

    #[test]
    fn shrink_to_fit_keeps_every_value() {
        let mut set: ValueSet = ["a", "b", ADDRESS].into_iter().collect();
        set.remove("a");
        set.shrink_to_fit();
        assert_eq!(set.arena.capacity(), set.live_bytes);
        assert!(set.contains("b") && set.contains(ADDRESS) && !set.contains("a"));
    }

    /// What `pack_hex` must give, a digit at a time (the shape checked as `pack_hex` does).
    fn pack_hex_reference(value: &[u8], ignore_case: bool) -> Option<Vec<u8>> {
        let digits = hex_digits(value, ignore_case)?;
        let digit = |byte: u8| match byte {
            b'0'..=b'9' => Some(byte - b'0'),
            b'a'..=b'f' => Some(byte - b'a' + 10),
            b'A'..=b'F' if ignore_case => Some(byte - b'A' + 10),
            _ => None,
        };
        digits.chunks_exact(2).map(|pair| Some((digit(pair[0])? << 4) | digit(pair[1])?)).collect()
    }

    proptest! {
        /// The word-at-a-time decoding agrees with a digit at a time, with at most one byte
        /// that is not a hex digit (often one that could be mistaken for one: 0x10-0x19,
        /// `/`, `:`, `@`, `G`, `` ` ``, `g`, high bytes) at any position of any length.
        #[test]
        fn hex_packing_matches_a_digit_at_a_time(
            mut digits in proptest::collection::vec(
                proptest::sample::select(b"0123456789abcdefABCDEF".to_vec()),
                0..140,
            ),
            odd in proptest::option::of((
                any::<proptest::sample::Index>(),
                prop_oneof![
                    3 => proptest::sample::select(
                        vec![0x10, 0x15, 0x19, 0x1a, 0x0f, b'/', b':', b'@', b'G', b'`', b'g', 0x80, 0xb0, 0xe1],
                    ),
                    1 => any::<u8>(),
                ],
            )),
            upper_x in any::<bool>(),
            ignore_case in any::<bool>(),
        ) {
            if let Some((at, byte)) = odd.filter(|_| !digits.is_empty()) {
                let at = at.index(digits.len());
                digits[at] = byte;
            }
            let mut value = if upper_x { b"0X".to_vec() } else { b"0x".to_vec() };
            value.extend_from_slice(&digits);
            let mut buf = [0; MAX_PACKED_BYTES];
            let got = pack_hex(&value, ignore_case, &mut buf).map(|len| buf[..len].to_vec());
            prop_assert_eq!(got, pack_hex_reference(&value, ignore_case));
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(String),
        Remove(String),
        Contains(String),
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            "0x[0-9a-f]{0,6}",
            "[a-c0-9]{0,3}",
            "0x[0-9a-f]{40}".prop_map(|v| v[..6].to_owned() + "0".repeat(36).as_str()),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            value().prop_map(Op::Insert),
            value().prop_map(Op::Remove),
            value().prop_map(Op::Contains),
        ]
    }

    proptest! {
        /// The model test of `tests/it`, on wide slots and with entries past the limit.
        #[test]
        fn wide_slots_behave_like_a_hash_set(ops in proptest::collection::vec(op(), 0..200)) {
            let mut set = ValueSet::new();
            set.narrow_offset_limit = 40;
            let mut model = HashSet::new();
            for op in ops {
                match op {
                    Op::Insert(v) => prop_assert_eq!(set.insert(&v), model.insert(v)),
                    Op::Remove(v) => prop_assert_eq!(set.remove(&v), model.remove(&v)),
                    Op::Contains(v) => prop_assert_eq!(set.contains(&v), model.contains(&v)),
                }
                prop_assert_eq!(set.len(), model.len());
            }
            for v in &model {
                prop_assert!(set.contains(v));
            }
        }
    }
}
