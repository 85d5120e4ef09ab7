//! In-memory set-filter indexes, shared by a deployment's workers and kept current with
//! every committed filter-value change.
//!
//! The store is the source of truth. An index is built when a deployment first needs it:
//! it is registered *before* the store is read, changes that arrive while it loads are
//! queued and replayed over the loaded snapshot in order (each change is idempotent), so no
//! change committed around the load is lost. Changes reach running workers at once: the next
//! batch sees them.
//!
//! Changes made through another process (another node of a cluster) do not pass through
//! this process's listener: [`SetIndexes::refresh`] compares each index's stored version with
//! the one it loaded, and loads the sets that changed again (the old values serve meanwhile).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use sluice_core::filter_values::{FilterValuesChange, FilterValuesListener};
use sluice_filter::ValueSet;
use sluice_store::{MetadataStore, StoreError};

use crate::Result;

/// Where an index reads a set's values when it loads: the metadata store
/// ([`StoreSetSource`]) in one process; the seam a shared set store plugs into.
#[async_trait::async_trait]
pub trait SetSource: Send + Sync + 'static {
    /// Every value of one set filter's set.
    ///
    /// # Errors
    /// When the values cannot be read.
    async fn load_set(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
    ) -> Result<ValueSet, StoreError>;

    /// The set's stored version (`None`: never written, or not versioned by this source):
    /// when it differs from the version an index loaded, the index loads again.
    ///
    /// # Errors
    /// When the version cannot be read.
    async fn set_version(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
    ) -> Result<Option<(i64, i64)>, StoreError> {
        let _ = (pipeline_id, transform_uid);
        Ok(None)
    }
}

/// Sets read from the metadata store.
pub struct StoreSetSource(pub Arc<dyn MetadataStore>);

#[async_trait::async_trait]
impl SetSource for StoreSetSource {
    async fn load_set(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
    ) -> Result<ValueSet, StoreError> {
        self.0.filter_value_set(pipeline_id, transform_uid).await
    }

    async fn set_version(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
    ) -> Result<Option<(i64, i64)>, StoreError> {
        self.0.filter_set_version(pipeline_id, transform_uid).await
    }
}

/// A change, owned, queued while an index loads.
#[derive(Debug, Clone)]
enum Change {
    Added(Vec<String>),
    Removed(Vec<String>),
    Replaced(Vec<String>),
}

impl Change {
    fn apply(&self, set: &mut ValueSet) {
        match self {
            Self::Added(values) => values.iter().for_each(|v| {
                set.insert(v);
            }),
            Self::Removed(values) => values.iter().for_each(|v| {
                set.remove(v);
            }),
            Self::Replaced(values) => {
                set.clear();
                values.iter().for_each(|v| {
                    set.insert(v);
                });
            }
        }
    }
}

/// One set filter's index.
#[derive(Debug, Default)]
pub struct SetHandle {
    values: RwLock<ValueSet>,
    /// `Some` while the index loads: changes wait here to be replayed.
    pending: Mutex<Option<Vec<Change>>>,
    /// The stored version read before the values were loaded (the values are at least that
    /// recent).
    version: Mutex<Option<(i64, i64)>>,
}

impl SetHandle {
    /// An index of fixed values, not loaded from the store nor following changes (a
    /// backfill's set filter, whose values come with the job).
    pub fn fixed(values: ValueSet) -> Arc<Self> {
        Arc::new(Self {
            values: RwLock::new(values),
            pending: Mutex::new(None),
            version: Mutex::new(None),
        })
    }

    /// Runs `f` with the current values under the read lock.
    pub fn with<R>(&self, f: impl FnOnce(&ValueSet) -> R) -> R {
        f(&self.values.read().expect("set index lock is never poisoned"))
    }

    fn apply(&self, change: Change) {
        let mut pending = self.pending.lock().expect("pending-changes lock is never poisoned");
        match pending.as_mut() {
            Some(queue) => queue.push(change),
            None => {
                change.apply(&mut self.values.write().expect("set index lock is never poisoned"))
            }
        }
    }
}

/// Every loaded index, by `(pipeline id, transform uid)`.
pub struct SetIndexes {
    source: Arc<dyn SetSource>,
    handles: Mutex<HashMap<(String, String), Arc<SetHandle>>>,
    /// Called after each change heard (a cluster node tells the others to refresh).
    on_change: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

impl std::fmt::Debug for SetIndexes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetIndexes").finish_non_exhaustive()
    }
}

impl SetIndexes {
    pub fn new(source: Arc<dyn SetSource>) -> Self {
        Self { source, handles: Mutex::new(HashMap::new()), on_change: Mutex::new(None) }
    }

    /// Calls `hook` after every change this process hears of.
    pub fn on_change(&self, hook: Arc<dyn Fn() + Send + Sync>) {
        *self.on_change.lock().expect("change hook lock is never poisoned") = Some(hook);
    }

    /// The index of one set filter, loading it from the store the first time.
    ///
    /// # Errors
    /// A store failure while loading (the half-built index is dropped).
    pub async fn acquire(&self, pipeline_id: &str, uid: &str) -> Result<Arc<SetHandle>> {
        let key = (pipeline_id.to_owned(), uid.to_owned());
        let handle = {
            let mut handles = self.handles.lock().expect("set index map lock is never poisoned");
            if let Some(handle) = handles.get(&key) {
                return Ok(handle.clone());
            }
            let handle = Arc::new(SetHandle {
                pending: Mutex::new(Some(Vec::new())),
                ..SetHandle::default()
            });
            handles.insert(key.clone(), handle.clone());
            handle
        };
        match self.load(&handle, pipeline_id, uid).await {
            Ok(()) => Ok(handle),
            Err(error) => {
                self.handles.lock().expect("set index map lock is never poisoned").remove(&key);
                Err(error)
            }
        }
    }

    async fn load(&self, handle: &SetHandle, pipeline_id: &str, uid: &str) -> Result<()> {
        let version = self.source.set_version(pipeline_id, uid).await?;
        let mut set = self.source.load_set(pipeline_id, uid).await?;
        *handle.version.lock().expect("set version lock is never poisoned") = version;
        // Replay what changed during the load, then let changes apply directly; both under
        // the pending lock so no change slips between the two.
        let mut pending = handle.pending.lock().expect("pending-changes lock is never poisoned");
        for change in pending.take().unwrap_or_default() {
            change.apply(&mut set);
        }
        tracing::debug!(
            config_id = pipeline_id,
            transform_uid = uid,
            values = set.len(),
            "set index loaded"
        );
        *handle.values.write().expect("set index lock is never poisoned") = set;
        Ok(())
    }

    /// Loads again every index whose set another process changed since it loaded (its
    /// stored version moved); answers how many. Changes made through this process in the
    /// meantime are in what is loaded, or move the version again for the next refresh.
    ///
    /// # Errors
    /// A store failure (the indexes checked before it are refreshed).
    pub async fn refresh(&self) -> Result<usize> {
        let handles: Vec<((String, String), Arc<SetHandle>)> = self
            .handles
            .lock()
            .expect("set index map lock is never poisoned")
            .iter()
            .map(|(key, handle)| (key.clone(), handle.clone()))
            .collect();
        let mut reloaded = 0;
        for ((pipeline_id, uid), handle) in handles {
            if handle.pending.lock().expect("pending-changes lock is never poisoned").is_some() {
                continue; // still loading
            }
            let stored = self.source.set_version(&pipeline_id, &uid).await?;
            if stored == *handle.version.lock().expect("set version lock is never poisoned") {
                continue;
            }
            let set = self.source.load_set(&pipeline_id, &uid).await?;
            tracing::info!(config_id = %pipeline_id, transform_uid = %uid, values = set.len(), ?stored, "set changed elsewhere: index loaded again");
            *handle.values.write().expect("set index lock is never poisoned") = set;
            *handle.version.lock().expect("set version lock is never poisoned") = stored;
            reloaded += 1;
        }
        Ok(reloaded)
    }

    /// Drops every index of a pipeline (after teardown or delete).
    pub fn release_pipeline(&self, pipeline_id: &str) {
        self.handles
            .lock()
            .expect("set index map lock is never poisoned")
            .retain(|(pipeline, _), _| pipeline != pipeline_id);
    }

    fn handle(&self, pipeline_id: &str, uid: &str) -> Option<Arc<SetHandle>> {
        let handles = self.handles.lock().expect("set index map lock is never poisoned");
        handles.get(&(pipeline_id.to_owned(), uid.to_owned())).cloned()
    }
}

impl FilterValuesListener for SetIndexes {
    fn changed(&self, pipeline_id: &str, transform_uid: &str, change: FilterValuesChange<'_>) {
        let hook = self.on_change.lock().expect("change hook lock is never poisoned").clone();
        if let Some(hook) = hook {
            hook();
        }
        // Only loaded indexes follow changes; the others read the store when they load.
        let Some(handle) = self.handle(pipeline_id, transform_uid) else { return };
        let change = match change {
            FilterValuesChange::Added(values) => Change::Added(values.to_vec()),
            FilterValuesChange::Removed(values) => Change::Removed(values.to_vec()),
            FilterValuesChange::Replaced(values) => Change::Replaced(values.to_vec()),
            FilterValuesChange::Dropped => {
                self.handles
                    .lock()
                    .expect("set index map lock is never poisoned")
                    .remove(&(pipeline_id.to_owned(), transform_uid.to_owned()));
                return;
            }
        };
        handle.apply(change);
    }
}
