//! Which values each filter-value set holds, kept in memory beside the store.
//!
//! `filter_values` is an append-only list per set, keyed `(set_id, seq)` (migration 6), with no
//! index on the value: a unique key over tens of millions of random addresses made every bulk
//! load rewrite pages all over it. Membership is decided here instead, by an exact
//! [`ValueSet`] per set, the same compact structure the workers filter with:
//!
//! - a writer takes its set's [`Slot`] lock, *then* the pipeline lock in the database, and
//!   compares the slot with the set's stored `(id, version)`; every write of a set increments
//!   `version` in its transaction. A slot that is empty or behind (another process wrote, or
//!   the set was dropped and made again) is reloaded from the table under those locks;
//! - a writer takes the values out of the slot while it works and puts them back only after
//!   its commit, so a failed write leaves the slot empty and the next user reloads it.
//!
//! Slots stay loaded while the values cached in all slots stay within a budget; past it, the
//! least recently used slots that nobody holds are emptied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sluice_filter::ValueSet;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::redis_sets::LogState;
use crate::set_snapshots::SetSnapshots;

/// Values the store keeps loaded across all sets by default: ~530 MiB of 42-character
/// addresses. A set larger than the budget is still kept while it is the one in use.
pub const DEFAULT_CACHED_VALUES: usize = 20_000_000;

/// The values of one set as of a stored version.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub set_id: i64,
    pub version: i64,
    pub values: ValueSet,
    /// With the values in Redis: where the set's log stood when they were current.
    pub log: LogState,
}

/// One set's place in the cache; its lock orders the set's writers in this process.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub loaded: Option<Loaded>,
}

impl Slot {
    /// The loaded values if they are those of stored set `set_id` at `version`.
    pub(crate) fn take_current(&mut self, set_id: i64, version: i64) -> Option<ValueSet> {
        match self.loaded.take() {
            Some(loaded) if loaded.set_id == set_id && loaded.version == version => {
                Some(loaded.values)
            }
            _ => None,
        }
    }

    pub(crate) fn is_current(&self, set_id: i64, version: i64) -> bool {
        self.loaded.as_ref().is_some_and(|l| l.set_id == set_id && l.version == version)
    }
}

#[derive(Debug)]
struct Entry {
    slot: Arc<AsyncMutex<Slot>>,
    /// When the slot was last handed out, in [`SetCache::clock`] ticks.
    used: u64,
    /// Values the slot held when last put back.
    values: usize,
}

/// Every slot, by `(pipeline id, transform uid)`.
#[derive(Debug)]
pub(crate) struct SetCache {
    entries: Mutex<Entries>,
    budget: usize,
    /// Snapshots of large sets beside the store, for fast restarts.
    pub snapshots: SetSnapshots,
}

#[derive(Debug, Default)]
struct Entries {
    by_set: HashMap<(String, String), Entry>,
    clock: u64,
}

impl SetCache {
    pub(crate) fn new(budget: usize) -> Self {
        Self { entries: Mutex::default(), budget, snapshots: SetSnapshots::default() }
    }

    /// A cache with the default budget, for a store to share among its clones.
    pub(crate) fn shared() -> Arc<Self> {
        Arc::new(Self::new(DEFAULT_CACHED_VALUES))
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().expect("set cache lock is never poisoned")
    }

    /// Locks the slot of pipeline `pipeline_id`'s set filter `uid`, making it when missing.
    pub(crate) async fn lock(&self, pipeline_id: &str, uid: &str) -> OwnedMutexGuard<Slot> {
        let slot = {
            let mut entries = self.entries();
            entries.clock += 1;
            let used = entries.clock;
            let entry = entries
                .by_set
                .entry((pipeline_id.to_owned(), uid.to_owned()))
                .or_insert_with(|| Entry { slot: Arc::default(), used, values: 0 });
            entry.used = used;
            entry.slot.clone()
        };
        slot.lock_owned().await
    }

    /// Puts `values`, the set `set_id` at `version`, back into `slot`, then empties the least
    /// recently used other slots while the cache holds more than its budget.
    pub(crate) fn put_back(
        &self,
        pipeline_id: &str,
        uid: &str,
        slot: &mut Slot,
        set_id: i64,
        version: i64,
        values: ValueSet,
    ) {
        let log = LogState::default();
        self.keep(pipeline_id, uid, slot, Loaded { set_id, version, values, log });
    }

    /// Puts `loaded` into `slot`, then empties the least recently used other slots while the
    /// cache holds more than its budget.
    pub(crate) fn keep(&self, pipeline_id: &str, uid: &str, slot: &mut Slot, loaded: Loaded) {
        let len = loaded.values.len();
        slot.loaded = Some(loaded);
        let mut entries = self.entries();
        let key = (pipeline_id.to_owned(), uid.to_owned());
        if let Some(entry) = entries.by_set.get_mut(&key) {
            entry.values = len;
        }
        let mut total: usize = entries.by_set.values().map(|e| e.values).sum();
        if total <= self.budget {
            return;
        }
        let mut others: Vec<(u64, &(String, String))> =
            entries.by_set.iter().filter(|(k, _)| **k != key).map(|(k, e)| (e.used, k)).collect();
        others.sort_unstable();
        let others: Vec<(String, String)> = others.into_iter().map(|(_, k)| k.clone()).collect();
        for other in others {
            if total <= self.budget {
                break;
            }
            let entry = entries.by_set.get_mut(&other).expect("listed above");
            // A slot in use is skipped: its holder puts it back later.
            if let Ok(mut held) = entry.slot.try_lock() {
                held.loaded = None;
                total -= entry.values;
                entry.values = 0;
            }
        }
    }

    /// Every slot, with the pipeline and transform it belongs to.
    pub(crate) fn slots(&self) -> Vec<(String, String, Arc<AsyncMutex<Slot>>)> {
        self.entries()
            .by_set
            .iter()
            .map(|((pipeline, uid), entry)| (pipeline.clone(), uid.clone(), entry.slot.clone()))
            .collect()
    }

    /// Forgets the slots of pipeline `pipeline_id` (every set filter, or only `uid`) once its
    /// sets were dropped. A writer that holds one keeps working on its own copy, which no
    /// later lookup finds.
    pub(crate) fn forget(&self, pipeline_id: &str, uid: Option<&str>) {
        self.entries()
            .by_set
            .retain(|(pipeline, set), _| pipeline != pipeline_id || uid.is_some_and(|u| u != set));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_of(values: &[&str]) -> ValueSet {
        let mut set = ValueSet::new();
        values.iter().for_each(|v| {
            set.insert(v);
        });
        set
    }

    #[tokio::test]
    async fn a_slot_is_current_only_for_its_set_and_version() {
        let cache = SetCache::new(100);
        let mut slot = cache.lock("p", "t").await;
        cache.put_back("p", "t", &mut slot, 7, 3, set_of(&["0xa"]));
        assert!(slot.is_current(7, 3));
        assert!(!slot.is_current(7, 4));
        assert!(!slot.is_current(8, 3));
        assert!(slot.take_current(7, 4).is_none(), "a stale slot is not handed out");
        assert!(slot.loaded.is_none(), "and taking it empties the slot");
    }

    #[tokio::test]
    async fn over_budget_the_least_recently_used_free_slots_are_emptied() {
        let cache = SetCache::new(4);
        let mut held = cache.lock("p", "c").await;
        cache.put_back("p", "c", &mut held, 1, 1, set_of(&["x"]));
        for uid in ["a", "b", "e"] {
            let mut slot = cache.lock("p", uid).await;
            cache.put_back("p", uid, &mut slot, 1, 1, set_of(&["x"]));
        }
        // "b" is used again: "a" is now the least recently used free slot, then "e".
        drop(cache.lock("p", "b").await);
        let mut d = cache.lock("p", "d").await;
        cache.put_back("p", "d", &mut d, 1, 1, set_of(&["x", "y"]));
        assert!(held.loaded.is_some(), "a held slot is never emptied under its holder");
        assert!(d.loaded.is_some(), "the slot just put back stays");
        drop((held, d));
        assert!(cache.lock("p", "a").await.loaded.is_none(), "least recently used: emptied");
        assert!(cache.lock("p", "e").await.loaded.is_none(), "next: emptied, still over");
        assert!(cache.lock("p", "b").await.loaded.is_some(), "within budget again: kept");
    }

    #[tokio::test]
    async fn forgetting_a_pipeline_drops_its_slots_only() {
        let cache = SetCache::new(100);
        for (pipeline, uid) in [("p", "a"), ("p", "b"), ("q", "a")] {
            let mut slot = cache.lock(pipeline, uid).await;
            cache.put_back(pipeline, uid, &mut slot, 1, 1, set_of(&["x"]));
        }
        cache.forget("p", Some("a"));
        assert!(cache.lock("p", "a").await.loaded.is_none());
        assert!(cache.lock("p", "b").await.loaded.is_some());
        cache.forget("p", None);
        assert!(cache.lock("p", "b").await.loaded.is_none());
        assert!(cache.lock("q", "a").await.loaded.is_some());
    }
}
