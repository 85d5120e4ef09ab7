//! The in-memory dataset index: every dataset's entries, by owner and name, answering
//! `beam.contains` for scripts ([`DatasetLookup`]) without a round trip to the store, and
//! following every committed change ([`DatasetListener`]).
//!
//! **Loaded eagerly.** [`DatasetIndex::load`] reads every dataset at startup, before the
//! server takes requests: a script's lookup is synchronous and cannot wait for a lazy load,
//! and a dataset is small next to a filter set (at most a few million values; one set of
//! 1,000,000 addresses takes about 28 MiB, see BENCHMARKS.md). From then on the API tells
//! the index of every change after the store commits it, so a change is visible to the next
//! lookup once the API call that made it returns.
//!
//! **Order.** Changes to one dataset commit one after another, each taking the next
//! [`Dataset::version`]; requests running at once may report them in another order, so an
//! entry change applies only in version order (an early one waits in `pending` for the one
//! before it). A dataset deleted and created again under the same name is a new dataset with a
//! greater [`Dataset::seq`]: a late change to the old one is recognised and ignored.
//!
//! Running plans read datasets through a `DatasetSlot` (the index arrives after the
//! runtime started); with a shared set store the index also follows the store's change feed
//! (`FeedDatasets`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use sluice_core::datasets::{Dataset, DatasetChange, DatasetListener, DatasetLookup, DatasetRef};
use sluice_filter::ValueSet;
use sluice_store::MetadataStore;

use crate::Result;

/// Entries read from the store per page while the index loads.
const LOAD_PAGE: u32 = 100_000;

/// An entry change waiting for the versions before it.
#[derive(Debug)]
enum Pending {
    Add(Vec<String>),
    Remove(Vec<String>),
}

#[derive(Debug, Default)]
struct State {
    /// The version of the last change applied.
    version: u64,
    values: ValueSet,
    pending: BTreeMap<u64, Pending>,
}

impl State {
    fn apply(&mut self, version: u64, change: Pending) {
        if version <= self.version {
            // Already part of what the index holds (a change read by the load).
            return;
        }
        self.pending.insert(version, change);
        while let Some(change) = self.pending.remove(&(self.version + 1)) {
            match change {
                Pending::Add(values) => values.iter().for_each(|v| {
                    self.values.insert(v);
                }),
                Pending::Remove(values) => values.iter().for_each(|v| {
                    self.values.remove(v);
                }),
            }
            self.version += 1;
        }
    }
}

/// One dataset's entries.
#[derive(Debug)]
struct Entry {
    seq: i64,
    state: RwLock<State>,
}

/// Every dataset's entries, by owner user id, then dataset name.
#[derive(Debug, Default)]
pub struct DatasetIndex {
    owners: RwLock<HashMap<String, HashMap<String, Arc<Entry>>>>,
    /// The greatest seq deleted under each `(owner, name)`: changes to it or to an older
    /// dataset of that name are stale.
    dropped: Mutex<HashMap<(String, String), i64>>,
    /// The store's datasets number at the last [`DatasetIndex::refresh_if_changed`] that
    /// read the datasets, and when.
    checked: Mutex<Option<(i64, std::time::Instant)>>,
}

/// Longest [`DatasetIndex::refresh_if_changed`] goes on the datasets number alone.
const FULL_READ_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

impl DatasetIndex {
    /// An empty index (no dataset).
    pub fn new() -> Self {
        Self::default()
    }

    /// An index of every dataset in the store. Call it before the API takes requests: a
    /// change made during the load would be missed.
    ///
    /// # Errors
    /// A store failure.
    pub async fn load(store: &dyn MetadataStore) -> Result<Self> {
        let index = Self::new();
        let datasets = store.all_datasets().await?;
        let mut entries = 0;
        for dataset in &datasets {
            if let Some(values) = Self::read(store, dataset).await? {
                entries += values.len();
                index.install(dataset, values);
            }
        }
        let heap_bytes = index.stats().heap_bytes;
        tracing::info!(datasets = datasets.len(), entries, heap_bytes, "dataset index loaded");
        Ok(index)
    }

    /// Every entry of `dataset`; `None` when it was deleted meanwhile.
    async fn read(store: &dyn MetadataStore, dataset: &Dataset) -> Result<Option<ValueSet>> {
        let owner = &dataset.owner_user_id;
        let mut values = ValueSet::with_capacity(usize::try_from(dataset.entry_count).unwrap_or(0));
        let mut after: Option<String> = None;
        loop {
            let page =
                store.list_dataset_entries(owner, &dataset.id, after.as_deref(), LOAD_PAGE).await?;
            let Some(page) = page else { return Ok(None) };
            for value in &page.values {
                values.insert(value);
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(Some(values)),
            }
        }
    }

    /// [`DatasetIndex::refresh`], when the store's datasets number moved since the last
    /// call that read (or 30 s passed): what a cluster node runs every round, reading one
    /// row while no dataset changes.
    ///
    /// # Errors
    /// A store failure.
    pub async fn refresh_if_changed(&self, store: &dyn MetadataStore) -> Result<usize> {
        // Read first: a write after it moves it again for the next call.
        let seq = store.datasets_seq().await?;
        {
            let checked = self.checked.lock().expect("datasets number lock is never poisoned");
            if let Some((known, at)) = *checked
                && known == seq
                && at.elapsed() < FULL_READ_EVERY
            {
                return Ok(0);
            }
        }
        let changed = self.refresh(store).await?;
        *self.checked.lock().expect("datasets number lock is never poisoned") =
            Some((seq, std::time::Instant::now()));
        Ok(changed)
    }

    /// Reads again every dataset changed, created or deleted through another process (a
    /// node of a cluster: its changes do not pass through this process's listener), by
    /// comparing each stored dataset's `(seq, version)` with the index's; answers how many
    /// changed. A change made through this process meanwhile is in what is read, or
    /// applies on top by its version.
    ///
    /// # Errors
    /// A store failure.
    pub async fn refresh(&self, store: &dyn MetadataStore) -> Result<usize> {
        let stored = store.all_datasets().await?;
        let mut changed = 0;
        let mut live = std::collections::HashSet::new();
        for dataset in &stored {
            live.insert((dataset.owner_user_id.clone(), dataset.name.clone()));
            let current = self.lookup(&dataset.owner_user_id, &dataset.name).is_some_and(|entry| {
                entry.seq == dataset.seq
                    && entry.state.read().expect("dataset entry lock is never poisoned").version
                        >= dataset.version
            });
            if current {
                continue;
            }
            if let Some(values) = Self::read(store, dataset).await? {
                self.install(dataset, values);
                changed += 1;
            }
        }
        // Deleted elsewhere.
        let gone: Vec<(String, String, i64)> = {
            let owners = self.owners.read().expect("dataset index lock is never poisoned");
            owners
                .iter()
                .flat_map(|(owner, names)| {
                    names.iter().map(move |(name, entry)| (owner.clone(), name.clone(), entry.seq))
                })
                .filter(|(owner, name, _)| !live.contains(&(owner.clone(), name.clone())))
                .collect()
        };
        for (owner, name, seq) in gone {
            // Only when it is still gone: a dataset created here meanwhile stays.
            if store.dataset_by_name(&owner, &name).await?.is_none() {
                self.drop_dataset(DatasetRef { owner_user_id: &owner, name: &name, seq });
                changed += 1;
            }
        }
        if changed > 0 {
            tracing::info!(changed, "datasets changed elsewhere: index read again");
        }
        Ok(changed)
    }

    fn install(&self, dataset: &Dataset, values: ValueSet) {
        let state = State { version: dataset.version, values, pending: BTreeMap::new() };
        let entry = Arc::new(Entry { seq: dataset.seq, state: RwLock::new(state) });
        self.owners
            .write()
            .expect("dataset index lock is never poisoned")
            .entry(dataset.owner_user_id.clone())
            .or_default()
            .insert(dataset.name.clone(), entry);
    }

    /// Datasets and entries held, and the bytes their sets allocate.
    pub fn stats(&self) -> IndexStats {
        let owners = self.owners.read().expect("dataset index lock is never poisoned");
        let mut stats = IndexStats::default();
        for entry in owners.values().flat_map(HashMap::values) {
            let state = entry.state.read().expect("dataset entry lock is never poisoned");
            stats.datasets += 1;
            stats.entries += state.values.len();
            stats.heap_bytes += state.values.heap_bytes();
        }
        stats
    }

    fn lookup(&self, owner: &str, name: &str) -> Option<Arc<Entry>> {
        let owners = self.owners.read().expect("dataset index lock is never poisoned");
        owners.get(owner)?.get(name).cloned()
    }

    /// The entry a change to `dataset` applies to, created (empty, version 0) when the change
    /// is heard before the creation; `None` when the change is stale.
    fn entry_for(&self, dataset: DatasetRef<'_>) -> Option<Arc<Entry>> {
        if let Some(entry) = self.lookup(dataset.owner_user_id, dataset.name) {
            if entry.seq == dataset.seq {
                return Some(entry);
            }
        }
        let dropped = self.dropped.lock().expect("dropped-datasets lock is never poisoned");
        let key = (dataset.owner_user_id.to_owned(), dataset.name.to_owned());
        if dropped.get(&key).is_some_and(|&seq| seq >= dataset.seq) {
            return None;
        }
        let mut owners = self.owners.write().expect("dataset index lock is never poisoned");
        let names = owners.entry(key.0).or_default();
        match names.get(dataset.name) {
            Some(entry) if entry.seq > dataset.seq => None,
            Some(entry) if entry.seq == dataset.seq => Some(entry.clone()),
            // Absent, or an older dataset of that name whose deletion is not heard yet: only
            // one dataset of a name exists at a time, so the older one is gone.
            _ => {
                let entry =
                    Arc::new(Entry { seq: dataset.seq, state: RwLock::new(State::default()) });
                names.insert(key.1, entry.clone());
                Some(entry)
            }
        }
    }

    fn drop_dataset(&self, dataset: DatasetRef<'_>) {
        let mut dropped = self.dropped.lock().expect("dropped-datasets lock is never poisoned");
        let key = (dataset.owner_user_id.to_owned(), dataset.name.to_owned());
        let seq = dropped.entry(key).or_insert(dataset.seq);
        *seq = (*seq).max(dataset.seq);
        let mut owners = self.owners.write().expect("dataset index lock is never poisoned");
        if let Some(names) = owners.get_mut(dataset.owner_user_id) {
            if names.get(dataset.name).is_some_and(|entry| entry.seq <= dataset.seq) {
                names.remove(dataset.name);
            }
            if names.is_empty() {
                owners.remove(dataset.owner_user_id);
            }
        }
    }
}

/// What a [`DatasetIndex`] holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IndexStats {
    pub datasets: usize,
    pub entries: usize,
    /// Bytes allocated by the entry sets.
    pub heap_bytes: usize,
}

impl DatasetLookup for DatasetIndex {
    fn contains_any(&self, owner_user_id: &str, dataset: &str, values: &[&str]) -> bool {
        let Some(entry) = self.lookup(owner_user_id, dataset) else { return false };
        let state = entry.state.read().expect("dataset entry lock is never poisoned");
        values.iter().any(|value| state.values.contains_unnormalized(value.as_bytes()))
    }
}

impl DatasetListener for DatasetIndex {
    fn changed(&self, dataset: DatasetRef<'_>, change: DatasetChange<'_>) {
        let (version, pending) = match change {
            DatasetChange::Created => {
                self.entry_for(dataset);
                return;
            }
            DatasetChange::Dropped => {
                self.drop_dataset(dataset);
                return;
            }
            DatasetChange::Added { version, values } => (version, Pending::Add(values.to_vec())),
            DatasetChange::Removed { version, values } => {
                (version, Pending::Remove(values.to_vec()))
            }
        };
        if let Some(entry) = self.entry_for(dataset) {
            entry
                .state
                .write()
                .expect("dataset entry lock is never poisoned")
                .apply(version, pending);
        }
    }
}

/// The dataset lookup of the process, replaceable after the runtime started (the index is
/// loaded after it): plans hold the slot, so running pipelines see the replacement.
pub(crate) struct DatasetSlot(RwLock<Arc<dyn DatasetLookup>>);

impl DatasetSlot {
    /// A slot where every dataset is empty.
    pub(crate) fn empty() -> Self {
        Self(RwLock::new(Arc::new(sluice_core::datasets::NoDatasets)))
    }

    pub(crate) fn replace(&self, lookup: Arc<dyn DatasetLookup>) {
        *self.0.write().expect("dataset lookup lock is never poisoned") = lookup;
    }
}

impl DatasetLookup for DatasetSlot {
    fn contains_any(&self, owner_user_id: &str, dataset: &str, values: &[&str]) -> bool {
        self.0.read().expect("dataset lookup lock is never poisoned").contains_any(
            owner_user_id,
            dataset,
            values,
        )
    }
}

/// Dataset changes from the shared set store's feed, applied to the node's dataset index by
/// their versions (a change this node made and applied already is skipped).
pub(crate) struct FeedDatasets(pub std::sync::Weak<crate::node::Node>);

#[async_trait::async_trait]
impl crate::sets::DatasetFeedTarget for FeedDatasets {
    async fn apply(&self, entry: sluice_store::DatasetFeedEntry) {
        use sluice_store::DatasetFeedChange;
        let Some(node) = self.0.upgrade() else { return };
        let Some(index) = node.dataset_index() else { return };
        let dataset =
            DatasetRef { owner_user_id: &entry.owner_user_id, name: &entry.name, seq: entry.seq };
        let version = entry.version;
        match &entry.change {
            DatasetFeedChange::Created => index.changed(dataset, DatasetChange::Created),
            DatasetFeedChange::Dropped => index.changed(dataset, DatasetChange::Dropped),
            DatasetFeedChange::Added(values) => {
                index.changed(dataset, DatasetChange::Added { version, values });
            }
            DatasetFeedChange::Removed(values) => {
                index.changed(dataset, DatasetChange::Removed { version, values });
            }
            DatasetFeedChange::Reload => {
                if let Err(error) = index.refresh(node.store.as_ref()).await {
                    tracing::warn!(%error, "dataset feed: cannot read changed datasets again");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use sluice_store::{DatasetStore as _, IdentityStore as _};

    use super::*;

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    fn at(owner: &'static str, name: &'static str, seq: i64) -> DatasetRef<'static> {
        DatasetRef { owner_user_id: owner, name, seq }
    }

    #[test]
    fn changes_apply_in_version_order_whatever_order_they_are_heard_in() {
        let index = DatasetIndex::new();
        let d = at("ann", "wallets", 1);
        index.changed(d, DatasetChange::Created);
        let (add, remove) = (strings(&["0xa"]), strings(&["0xa"]));
        // Version 2 (remove) is heard before version 1 (add): it waits.
        index.changed(d, DatasetChange::Removed { version: 2, values: &remove });
        assert!(!index.contains_any("ann", "wallets", &["0xa"]));
        index.changed(d, DatasetChange::Added { version: 1, values: &add });
        assert!(!index.contains_any("ann", "wallets", &["0xa"]), "added, then removed");
        let again = strings(&["0xa", "0xb"]);
        index.changed(d, DatasetChange::Added { version: 3, values: &again });
        assert!(index.contains_any("ann", "wallets", &["0xZZ", "0XA"]), "lookups lowercase");
        assert!(!index.contains_any("bob", "wallets", &["0xa"]), "other owners see nothing");
        assert!(!index.contains_any("ann", "tokens", &["0xa"]));
        assert!(!index.contains_any("ann", "wallets", &[]));
        // A replay of an applied version changes nothing.
        index.changed(d, DatasetChange::Removed { version: 3, values: &strings(&["0xb"]) });
        assert!(index.contains_any("ann", "wallets", &["0xb"]));
    }

    #[test]
    fn a_dataset_created_again_ignores_late_changes_to_the_deleted_one() {
        let index = DatasetIndex::new();
        let (old, new) = (at("ann", "w", 1), at("ann", "w", 5));
        index.changed(old, DatasetChange::Added { version: 1, values: &strings(&["x"]) });
        assert!(index.contains_any("ann", "w", &["x"]), "a change heard before its creation");
        index.changed(old, DatasetChange::Created);
        // The new dataset is heard before the old one's deletion.
        index.changed(new, DatasetChange::Created);
        assert!(!index.contains_any("ann", "w", &["x"]));
        index.changed(old, DatasetChange::Dropped);
        index.changed(new, DatasetChange::Added { version: 1, values: &strings(&["y"]) });
        index.changed(old, DatasetChange::Added { version: 2, values: &strings(&["z"]) });
        index.changed(old, DatasetChange::Created);
        assert!(index.contains_any("ann", "w", &["y"]));
        assert!(!index.contains_any("ann", "w", &["z"]));
        index.changed(new, DatasetChange::Dropped);
        assert!(!index.contains_any("ann", "w", &["y"]));
        // A late change to a deleted dataset does not bring it back.
        index.changed(new, DatasetChange::Added { version: 2, values: &strings(&["y"]) });
        assert!(!index.contains_any("ann", "w", &["y"]));
        assert_eq!(index.stats(), IndexStats::default());
    }

    #[tokio::test]
    async fn load_reads_every_dataset_and_later_changes_apply_after_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = sluice_store::SqliteStore::open(&url).await.unwrap();
        let ann = store.ensure_identity("o", "t", "ann", false).await.unwrap().user.id;
        let bob = store.ensure_identity("o", "t", "bob", false).await.unwrap().user.id;
        let now = chrono::Utc::now();
        let d = store.create_dataset(&ann, "w", now).await.unwrap().unwrap();
        let many: Vec<String> = (0..250_001).map(|i| format!("0x{i:040x}")).collect();
        store.add_dataset_entries(&ann, &d.id, &many, now).await.unwrap();
        store.add_dataset_entries(&ann, &d.id, &strings(&["0xb"]), now).await.unwrap();
        let e = store.create_dataset(&bob, "w", now).await.unwrap().unwrap();

        let index = DatasetIndex::load(&store).await.unwrap();
        let stats = index.stats();
        assert_eq!((stats.datasets, stats.entries), (2, 250_002));
        assert!(index.contains_any(&ann, "w", &["0xB"]));
        assert!(index.contains_any(&ann, "w", &[&format!("0x{:040x}", 250_000)]));
        assert!(!index.contains_any(&bob, "w", &["0xb"]));

        // A change the load already read (version 2) is not applied twice; the next is.
        let dref = DatasetRef::of(&d);
        index.changed(dref, DatasetChange::Removed { version: 2, values: &strings(&["0xb"]) });
        assert!(index.contains_any(&ann, "w", &["0xb"]));
        let change = store.remove_dataset_entries(&ann, &d.id, &strings(&["0xb"]), now).await;
        let version = change.unwrap().unwrap().version;
        index.changed(dref, DatasetChange::Removed { version, values: &strings(&["0xb"]) });
        assert!(!index.contains_any(&ann, "w", &["0xb"]));
        index.changed(DatasetRef::of(&e), DatasetChange::Dropped);
        assert_eq!(index.stats().datasets, 1);
    }

    /// A change made through another process is read when the datasets number moved, and
    /// nothing is read while it stays.
    #[tokio::test]
    async fn refresh_if_changed_reads_only_after_the_datasets_number_moved() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let here = sluice_store::SqliteStore::open(&url).await.unwrap();
        let there = sluice_store::SqliteStore::open(&url).await.unwrap();
        let ann = here.ensure_identity("o", "t", "ann", false).await.unwrap().user.id;
        let now = chrono::Utc::now();
        let d = here.create_dataset(&ann, "w", now).await.unwrap().unwrap();
        let index = DatasetIndex::load(&here).await.unwrap();
        assert_eq!(index.refresh_if_changed(&here).await.unwrap(), 0);

        there.add_dataset_entries(&ann, &d.id, &strings(&["0xa"]), now).await.unwrap();
        assert_eq!(index.refresh_if_changed(&here).await.unwrap(), 1, "read again");
        assert!(index.contains_any(&ann, "w", &["0xa"]));
        there.create_dataset(&ann, "v", now).await.unwrap().unwrap();
        assert_eq!(index.refresh_if_changed(&here).await.unwrap(), 1);
        assert_eq!(index.stats().datasets, 2);
        assert_eq!(index.refresh_if_changed(&here).await.unwrap(), 0, "nothing moved");
    }
}
