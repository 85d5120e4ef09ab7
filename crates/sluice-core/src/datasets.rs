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
