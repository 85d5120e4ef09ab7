//! The ids of counted trades, deduplicated in memory and stored compactly.
//!
//! A trade is identified by `(chain, transaction_hash, log_index)`; the store keeps the first
//! 16 bytes of the SHA-256 of those three ([`trade_id`]), so an id is a fixed 16 bytes
//! whatever the chain's hash format. Ids are grouped by the hour of the trade's block time
//! (its *bucket*): each counted batch appends one row per bucket it touched to
//! `price_trade_id_blocks` (migration 9), holding the new ids of that bucket concatenated,
//! tagged with the batch's write count (`price_writes.seq`). A batch therefore costs a few
//! rows, not a row (and an index entry) per trade.
//!
//! Membership is decided in memory ([`TradeIdMemory`]): a bucket is read from the store the
//! first time a trade of its hour arrives, then kept, up to a budget of ids (least recently
//! used buckets are dropped beyond it and read again when needed). Memory is current at the
//! write count it last saw; when the stored count has moved on (another process counted
//! trades on the same database), the rows written since are read first. Writers hold the
//! store's price lock, so the check-then-append is safe.

use std::collections::{BTreeSet, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use sha2::{Digest, Sha256};

/// A counted trade's id: the first 16 bytes of SHA-256(chain, 0, hash, 0, log index LE).
/// Two different trades share an id with probability about n² / 2^129 for n trades (below
/// 10^-19 for ten billion), which the dedup accepts.
pub(crate) type TradeId = u128;

/// Bytes of a stored id.
pub(crate) const ID_BYTES: usize = 16;

/// Seconds of block time per bucket.
pub(crate) const BUCKET_SECONDS: i64 = 3_600;

/// Most ids memory keeps (about 40 bytes each in the hash sets): 8 M ids, a little over
/// 300 MiB at most.
pub(crate) const MEMORY_BUDGET_IDS: usize = 8_000_000;

/// The id of the trade `(chain, transaction_hash, log_index)`.
pub(crate) fn trade_id(chain: &str, transaction_hash: &str, log_index: u64) -> TradeId {
    let mut hasher = Sha256::new();
    hasher.update(chain.as_bytes());
    hasher.update([0]);
    hasher.update(transaction_hash.as_bytes());
    hasher.update([0]);
    hasher.update(log_index.to_le_bytes());
    let digest = hasher.finalize();
    let mut first = [0; ID_BYTES];
    first.copy_from_slice(&digest[..ID_BYTES]);
    u128::from_le_bytes(first)
}

/// The bucket of a block time (Unix microseconds).
pub(crate) fn bucket_of(at_micros: i64) -> i64 {
    at_micros.div_euclid(1_000_000).div_euclid(BUCKET_SECONDS)
}

/// Ids concatenated as a stored block holds them.
pub(crate) fn pack_ids(ids: &[TradeId]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() * ID_BYTES);
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

/// The ids of a stored block; `None` when it is not a whole number of ids.
pub(crate) fn unpack_ids(bytes: &[u8]) -> Option<impl ExactSizeIterator<Item = TradeId> + '_> {
    (bytes.len() % ID_BYTES == 0).then(|| {
        bytes.chunks_exact(ID_BYTES).map(|chunk| {
            let mut raw = [0; ID_BYTES];
            raw.copy_from_slice(chunk);
            u128::from_le_bytes(raw)
        })
    })
}

/// Ids are uniformly distributed already: their low 64 bits are the hash.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    fn write_u128(&mut self, id: u128) {
        self.0 = id as u64;
    }
}

pub(crate) type IdSet = HashSet<TradeId, BuildHasherDefault<IdHasher>>;

struct Bucket {
    ids: IdSet,
    /// When the bucket was last used, in [`TradeIdMemory::clock`] ticks.
    used: u64,
}

/// The loaded buckets of counted ids.
pub(crate) struct TradeIdMemory {
    buckets: foldhash::HashMap<i64, Bucket>,
    /// The store's write count the loaded buckets match; `None` before the first sync.
    synced: Option<i64>,
    clock: u64,
    held: usize,
    budget: usize,
    /// Buckets this process appended blocks to since they were last compacted.
    written: BTreeSet<i64>,
}

impl std::fmt::Debug for TradeIdMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TradeIdMemory")
            .field("buckets", &self.buckets.len())
            .field("ids", &self.held)
            .field("synced", &self.synced)
            .finish_non_exhaustive()
    }
}

impl Default for TradeIdMemory {
    fn default() -> Self {
        Self::with_budget(MEMORY_BUDGET_IDS)
    }
}

impl TradeIdMemory {
    pub(crate) fn with_budget(budget: usize) -> Self {
        Self {
            buckets: foldhash::HashMap::default(),
            synced: None,
            clock: 0,
            held: 0,
            budget,
            written: BTreeSet::new(),
        }
    }

    /// The store's write count memory matches.
    pub(crate) fn synced(&self) -> Option<i64> {
        self.synced
    }

    /// Forgets every bucket (memory can no longer tell what it matches).
    pub(crate) fn clear(&mut self) {
        self.buckets.clear();
        self.held = 0;
        self.synced = None;
    }

    /// Records that memory matches the store's write count `seq`.
    pub(crate) fn mark_synced(&mut self, seq: i64) {
        self.synced = Some(seq);
    }

    pub(crate) fn is_loaded(&self, bucket: i64) -> bool {
        self.buckets.contains_key(&bucket)
    }

    /// Adds a bucket read whole from the store (`ids` may repeat across its blocks).
    pub(crate) fn load(&mut self, bucket: i64, ids: impl ExactSizeIterator<Item = TradeId>) {
        self.clock += 1;
        let used = self.clock;
        let slot =
            self.buckets.entry(bucket).or_insert_with(|| Bucket { ids: IdSet::default(), used });
        let before = slot.ids.len();
        slot.ids.reserve(ids.len());
        slot.ids.extend(ids);
        slot.used = used;
        self.held += slot.ids.len() - before;
    }

    /// Adds ids written by another process to the buckets that are loaded (the others are
    /// read whole when first needed).
    pub(crate) fn catch_up(&mut self, bucket: i64, ids: impl IntoIterator<Item = TradeId>) {
        if let Some(slot) = self.buckets.get_mut(&bucket) {
            let before = slot.ids.len();
            slot.ids.extend(ids);
            self.held += slot.ids.len() - before;
        }
    }

    /// Whether `id` of a loaded `bucket` was counted.
    pub(crate) fn contains(&self, bucket: i64, id: TradeId) -> bool {
        self.buckets.get(&bucket).is_some_and(|slot| slot.ids.contains(&id))
    }

    /// Adds counted ids to their loaded buckets.
    pub(crate) fn insert(&mut self, counted: impl IntoIterator<Item = (i64, TradeId)>) {
        self.clock += 1;
        let used = self.clock;
        for (bucket, id) in counted {
            if let Some(slot) = self.buckets.get_mut(&bucket) {
                slot.used = used;
                if slot.ids.insert(id) {
                    self.held += 1;
                }
            }
        }
    }

    /// Drops least recently used buckets while memory holds more than its budget, keeping
    /// the bucket used last whatever its size.
    pub(crate) fn trim(&mut self) {
        while self.held > self.budget && self.buckets.len() > 1 {
            let Some((&oldest, _)) = self.buckets.iter().min_by_key(|(_, slot)| slot.used) else {
                return;
            };
            if let Some(slot) = self.buckets.remove(&oldest) {
                self.held -= slot.ids.len();
            }
        }
    }

    /// Notes the buckets a committed batch appended blocks to.
    pub(crate) fn note_written(&mut self, buckets: impl IntoIterator<Item = i64>) {
        self.written.extend(buckets);
    }

    /// Takes the written buckets before `bucket` (to compact them).
    pub(crate) fn take_written_before(&mut self, bucket: i64) -> Vec<i64> {
        let later = self.written.split_off(&bucket);
        std::mem::replace(&mut self.written, later).into_iter().collect()
    }

    /// Drops the buckets before `bucket` (past the dedup horizon).
    pub(crate) fn forget_before(&mut self, bucket: i64) {
        let mut held = self.held;
        self.buckets.retain(|&b, slot| {
            let keep = b >= bucket;
            if !keep {
                held -= slot.ids.len();
            }
            keep
        });
        self.held = held;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_tell_the_three_parts_apart() {
        let id = trade_id("base", "0xabc", 7);
        assert_eq!(id, trade_id("base", "0xabc", 7));
        assert_ne!(id, trade_id("base", "0xabc", 8));
        assert_ne!(id, trade_id("ethereum", "0xabc", 7));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(trade_id("ab", "c", 0), trade_id("a", "bc", 0));
        // Stored ids must never change across versions: a fixed value (checked with
        // Python's hashlib).
        assert_eq!(
            format!("{:032x}", trade_id("base", "0x01", 0)),
            "3ad675bf1e4aa1128bd3142b615c8f8a"
        );
        let packed = pack_ids(&[id, 1, u128::MAX]);
        assert_eq!(packed.len(), 48);
        let back: Vec<TradeId> = unpack_ids(&packed).expect("whole ids").collect();
        assert_eq!(back, vec![id, 1, u128::MAX]);
        assert!(unpack_ids(&packed[1..]).is_none());
    }

    #[test]
    fn buckets_are_hours_of_block_time() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(3_599_999_999), 0);
        assert_eq!(bucket_of(3_600_000_000), 1);
        assert_eq!(bucket_of(-1), -1);
    }

    #[test]
    fn memory_counts_only_loaded_buckets_and_keeps_its_budget() {
        let mut memory = TradeIdMemory::with_budget(3);
        memory.load(1, [10, 11].into_iter());
        memory.insert([(1, 12), (2, 20)]);
        assert!(memory.contains(1, 12));
        // Bucket 2 was not loaded: its id is not kept (it is read with the bucket).
        assert!(!memory.contains(2, 20));
        memory.catch_up(1, [11, 13]);
        memory.catch_up(3, [30]);
        assert!(memory.contains(1, 13) && !memory.is_loaded(3));
        memory.load(2, [20].into_iter());
        // Five ids over a budget of three: the least recently used bucket (1) goes.
        memory.trim();
        assert!(!memory.is_loaded(1) && memory.is_loaded(2));
        memory.forget_before(3);
        assert!(!memory.is_loaded(2));
        memory.note_written([5, 1, 7]);
        assert_eq!(memory.take_written_before(7), vec![1, 5]);
        assert_eq!(memory.take_written_before(8), vec![7]);
        assert!(memory.take_written_before(100).is_empty());
    }
}
