//! Datasets seen from a running pipeline: how a script's `beam.contains(name, values)` asks
//! whether any of `values` is in its owner's dataset `name`.
//!
//! The store holds the entries; the process keeps an in-memory index of them that follows
//! every committed change, and hands the script engine a [`DatasetLookup`] so a call never
//! makes a round trip to the store.

/// Answers dataset membership for scripts, from memory.
pub trait DatasetLookup: Send + Sync + 'static {
    /// Whether any of `values` is an entry of the dataset called `dataset` that belongs to
    /// the user `owner_user_id` (a pipeline's `owner_org_team_user_id`). Values are compared
    /// in their normalised form ([`crate::filter_values::normalize`]): the implementation
    /// lowercases them. An unknown dataset contains nothing.
    fn contains_any(&self, owner_user_id: &str, dataset: &str, values: &[&str]) -> bool;
}

/// A lookup for a process that keeps no dataset index: every dataset is empty.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoDatasets;

impl DatasetLookup for NoDatasets {
    fn contains_any(&self, _: &str, _: &str, _: &[&str]) -> bool {
        false
    }
}

/// A stored dataset (docs/contract.md §Dataset; the API adds `type`, always `postgres`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    pub id: String,
    /// The user that owns it; nobody else sees it.
    pub owner_user_id: String,
    /// Unique among the owner's datasets.
    pub name: String,
    /// The store's internal number for the dataset: never reused, and greater for a dataset
    /// created later, so an index can tell a dataset from a deleted one of the same name.
    pub seq: i64,
    /// Entries in the dataset.
    pub entry_count: u64,
    /// How many entry changes were committed to the dataset: each add or delete of entries
    /// takes the next number, in commit order.
    pub version: u64,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Creation, or the last entry change that added or removed an entry.
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// Which dataset a change is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatasetRef<'a> {
    pub owner_user_id: &'a str,
    pub name: &'a str,
    /// [`Dataset::seq`].
    pub seq: i64,
}

impl<'a> DatasetRef<'a> {
    pub fn of(dataset: &'a Dataset) -> Self {
        Self { owner_user_id: &dataset.owner_user_id, name: &dataset.name, seq: dataset.seq }
    }
}

/// A change to a dataset, already committed to the store. Values are normalised
/// ([`crate::filter_values::normalize`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetChange<'a> {
    /// The dataset was created, empty, at version 0.
    Created,
    /// These values were added (some may have been present already); the change has this
    /// [`Dataset::version`].
    Added { version: u64, values: &'a [String] },
    /// These values were removed (some may have been absent), at this version.
    Removed { version: u64, values: &'a [String] },
    /// The dataset is gone, and its entries with it.
    Dropped,
}

/// Hears committed dataset changes, so an in-memory index follows the store.
///
/// Changes to one dataset are committed in version order but may be heard in another order
/// when requests run concurrently; a listener orders them by version (and tells datasets of
/// one name apart by [`DatasetRef::seq`]).
pub trait DatasetListener: Send + Sync + 'static {
    fn changed(&self, dataset: DatasetRef<'_>, change: DatasetChange<'_>);
}

/// A listener for a process that keeps no dataset index (tools, and API tests that run no
/// pipelines): the store alone holds the entries.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoDatasetIndex;

impl DatasetListener for NoDatasetIndex {
    fn changed(&self, _: DatasetRef<'_>, _: DatasetChange<'_>) {}
}
