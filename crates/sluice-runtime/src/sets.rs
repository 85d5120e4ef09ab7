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
//! this process's listener. With the values in the store's own tables,
//! [`SetIndexes::refresh`] compares each index's stored version with the one it loaded, and
//! loads the sets that changed again (the old values serve meanwhile). With a shared set
//! store (`--sets redis://…`) every node follows its change feed instead ([`follow_feed`]):
//! each entry brings one set to its next version and is applied in order; an entry that does
//! not follow the version an index holds (a gap: entries trimmed while this node was away),
//! or that says only "changed", makes the index load again. On a feed, changes told through
//! [`FilterValuesListener::changed`] are not applied (the feed brings them, with their
//! version); [`FilterValuesListener::caught_up`] lets the API answer once they are in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use sluice_core::filter_values::{FilterValuesChange, FilterValuesListener};
use sluice_filter::ValueSet;
use sluice_store::{
    DatasetFeedEntry, FeedEntry, MetadataStore, SetFeed, SetFeedChange, SetFeedEntry, StoreError,
};

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
    /// The change a feed entry carries (`None`: read the set again).
    fn from_feed(change: SetFeedChange) -> Option<Self> {
        match change {
            SetFeedChange::Added(values) => Some(Self::Added(values)),
            SetFeedChange::Removed(values) => Some(Self::Removed(values)),
            SetFeedChange::Replaced(values) => Some(Self::Replaced(values)),
            SetFeedChange::Reload | SetFeedChange::Dropped => None,
        }
    }

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

/// A change heard while an index loads: `version` is the stored `(set id, version)` a feed
/// entry brings the set to (`None`: told by this process, without one); `change` is `None`
/// when the entry says only that the set changed.
#[derive(Debug)]
struct Queued {
    version: Option<(i64, i64)>,
    change: Option<Change>,
}

/// How a feed entry's version stands to the version an index holds.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The index already holds it.
    Stale,
    /// The very next version: apply it.
    Next,
    /// Versions between are missing (or the set was made again): load the set again.
    Gap,
}

fn step(held: Option<(i64, i64)>, set: i64, version: i64) -> Step {
    match held {
        Some((id, v)) if id == set && version <= v => Step::Stale,
        Some((id, v)) if id == set && version == v + 1 => Step::Next,
        // Loaded before the set was ever written (so empty): its first write follows.
        None if version == 1 => Step::Next,
        _ => Step::Gap,
    }
}

/// Hears of the values added to a set before the set holds them (the shared readers'
/// filter groups list them as candidates: [`crate::readers`]).
pub(crate) trait SetObserver: Send + Sync {
    /// Unique in the process.
    fn id(&self) -> u64;

    /// Values of the lookup hashes `hashes` are being added to the set the observer knows
    /// as member `member`. Called under the set's write lock.
    fn adding(&self, member: u32, hashes: &mut dyn Iterator<Item = u64>);
}

/// One set filter's index.
#[derive(Default)]
pub struct SetHandle {
    values: RwLock<ValueSet>,
    /// Who hears of added values, with the member number each knows this set by.
    observers: Mutex<Vec<(Weak<dyn SetObserver>, u32)>>,
    /// `Some` while the index loads: changes wait here to be replayed.
    pending: Mutex<Option<Vec<Queued>>>,
    /// The stored version the values hold: read before they were loaded (they are at least
    /// that recent), then moved by each feed entry applied.
    version: Mutex<Option<(i64, i64)>>,
    /// On a feed: the stored version a refresh last found this index behind of. An index
    /// still behind of the same version at the next refresh missed an entry.
    behind: Mutex<Option<Option<(i64, i64)>>>,
}

impl std::fmt::Debug for SetHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetHandle").field("values", &self.values).finish_non_exhaustive()
    }
}

impl SetHandle {
    /// An index of fixed values, not loaded from the store nor following changes (a
    /// backfill's set filter, whose values come with the job).
    pub fn fixed(values: ValueSet) -> Arc<Self> {
        Arc::new(Self {
            values: RwLock::new(values),
            observers: Mutex::default(),
            pending: Mutex::new(None),
            version: Mutex::new(None),
            behind: Mutex::new(None),
        })
    }

    /// Runs `f` with the current values under the read lock.
    pub fn with<R>(&self, f: impl FnOnce(&ValueSet) -> R) -> R {
        f(&self.values.read().expect("set index lock is never poisoned"))
    }

    fn apply(&self, change: Change) {
        let mut pending = self.pending.lock().expect("pending-changes lock is never poisoned");
        match pending.as_mut() {
            Some(queue) => queue.push(Queued { version: None, change: Some(change) }),
            None => self.write(&change),
        }
    }

    /// Applies `change` to the values; observers hear of added values first, under the
    /// same write lock, so no reader sees the set hold a value its observers do not list.
    fn write(&self, change: &Change) {
        let mut values = self.values.write().expect("set index lock is never poisoned");
        if let Change::Added(added) | Change::Replaced(added) = change {
            self.announce(&mut added.iter().map(|value| ValueSet::hash_of(value)));
        }
        change.apply(&mut values);
    }

    /// Replaces the values with `set` (a load), observers hearing of every value first.
    fn replace(&self, set: ValueSet) {
        let mut values = self.values.write().expect("set index lock is never poisoned");
        self.announce(&mut set.hashes());
        *values = set;
    }

    /// Tells every observer of values being added; drops observers that are gone.
    fn announce(&self, hashes: &mut dyn Iterator<Item = u64>) {
        let mut observers = self.observers.lock().expect("set observers lock is never poisoned");
        observers.retain(|(observer, _)| observer.strong_count() > 0);
        match observers.as_slice() {
            [] => {}
            [(observer, member)] => {
                if let Some(observer) = observer.upgrade() {
                    observer.adding(*member, hashes);
                }
            }
            many => {
                let hashes: Vec<u64> = hashes.collect();
                for (observer, member) in many {
                    if let Some(observer) = observer.upgrade() {
                        observer.adding(*member, &mut hashes.iter().copied());
                    }
                }
            }
        }
    }

    /// Lets `observer` hear of values added from now on, as member `member`.
    pub(crate) fn observe(&self, observer: Weak<dyn SetObserver>, member: u32) {
        let _values = self.values.write().expect("set index lock is never poisoned");
        self.observers
            .lock()
            .expect("set observers lock is never poisoned")
            .push((observer, member));
    }

    /// Stops telling the observer of id `id`.
    pub(crate) fn unobserve(&self, id: u64) {
        self.observers
            .lock()
            .expect("set observers lock is never poisoned")
            .retain(|(observer, _)| observer.upgrade().is_some_and(|o| o.id() != id));
    }

    fn held_version(&self) -> Option<(i64, i64)> {
        *self.version.lock().expect("set version lock is never poisoned")
    }

    fn is_loading(&self) -> bool {
        self.pending.lock().expect("pending-changes lock is never poisoned").is_some()
    }
}

/// Every loaded index, by `(pipeline id, transform uid)`.
pub struct SetIndexes {
    source: Arc<dyn SetSource>,
    handles: Mutex<HashMap<(String, String), Arc<SetHandle>>>,
    /// Called after each change heard (a cluster node tells the others to refresh); not on
    /// a feed, which tells them itself.
    on_change: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
    /// Whether a change feed keeps the indexes current ([`follow_feed`]).
    on_feed: AtomicBool,
}

impl std::fmt::Debug for SetIndexes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetIndexes").finish_non_exhaustive()
    }
}

impl SetIndexes {
    pub fn new(source: Arc<dyn SetSource>) -> Self {
        Self {
            source,
            handles: Mutex::new(HashMap::new()),
            on_change: Mutex::new(None),
            on_feed: AtomicBool::new(false),
        }
    }

    fn follows_a_feed(&self) -> bool {
        self.on_feed.load(Ordering::Relaxed)
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

    /// Loads the index's values (its `pending` queue set by the caller), replays what was
    /// heard meanwhile, and lets changes apply directly again. A feed entry that does not
    /// follow (a gap) makes it load once more.
    async fn load(&self, handle: &SetHandle, pipeline_id: &str, uid: &str) -> Result<()> {
        loop {
            let version = self.source.set_version(pipeline_id, uid).await?;
            let mut set = self.source.load_set(pipeline_id, uid).await?;
            // Replay, then let changes apply directly; both under the pending lock so no
            // change slips between the two.
            let mut pending =
                handle.pending.lock().expect("pending-changes lock is never poisoned");
            let mut held = version;
            let mut gap = false;
            for queued in pending.as_mut().map(std::mem::take).unwrap_or_default() {
                let Some((set_id, v)) = queued.version else {
                    // Told by this process after its commit: idempotent, replayed in order.
                    if let Some(change) = &queued.change {
                        change.apply(&mut set);
                    }
                    continue;
                };
                match (step(held, set_id, v), &queued.change) {
                    (Step::Stale, _) => {}
                    (Step::Next, Some(change)) => {
                        change.apply(&mut set);
                        held = Some((set_id, v));
                    }
                    _ => gap = true,
                }
            }
            if gap {
                // What was read is older than what followed; the queue stays open.
                continue;
            }
            *pending = None;
            tracing::debug!(
                config_id = pipeline_id,
                transform_uid = uid,
                values = set.len(),
                ?held,
                "set index loaded"
            );
            handle.replace(set);
            *handle.version.lock().expect("set version lock is never poisoned") = held;
            return Ok(());
        }
    }

    /// Loads an index again while its old values serve; changes heard meanwhile queue and
    /// are replayed over what is read. Nothing happens when it is loading already.
    async fn reload(&self, handle: &SetHandle, pipeline_id: &str, uid: &str) -> Result<()> {
        {
            let mut pending =
                handle.pending.lock().expect("pending-changes lock is never poisoned");
            if pending.is_some() {
                return Ok(());
            }
            *pending = Some(Vec::new());
        }
        let loaded = self.load(handle, pipeline_id, uid).await;
        if loaded.is_err() {
            // The old values stay; what was queued is lost, which the version shows: the
            // next entry or refresh loads again.
            *handle.pending.lock().expect("pending-changes lock is never poisoned") = None;
        }
        loaded
    }

    /// Loads again every index whose set changed without this process hearing it (its
    /// stored version moved); answers how many. Changes made through this process in the
    /// meantime are in what is loaded, or move the version again for the next refresh.
    ///
    /// On a feed, an index behind of its stored version is loaded again only when it is
    /// still behind of that same version at the next refresh: the entry may be on its way.
    ///
    /// # Errors
    /// The first store failure: every other index is still checked (one set the store
    /// cannot answer for keeps its old values, and holds back no other).
    pub async fn refresh(&self) -> Result<usize> {
        let handles: Vec<((String, String), Arc<SetHandle>)> = self
            .handles
            .lock()
            .expect("set index map lock is never poisoned")
            .iter()
            .map(|(key, handle)| (key.clone(), handle.clone()))
            .collect();
        let mut reloaded = 0;
        let mut failed = None;
        for ((pipeline_id, uid), handle) in handles {
            if handle.is_loading() {
                continue;
            }
            let stored = match self.source.set_version(&pipeline_id, &uid).await {
                Ok(stored) => stored,
                Err(error) => {
                    failed.get_or_insert(error.into());
                    continue;
                }
            };
            let held = handle.held_version();
            let current = match (held, stored) {
                (Some((a, held)), Some((b, stored))) => a == b && held >= stored,
                (held, stored) => held == stored,
            };
            {
                let mut behind = handle.behind.lock().expect("behind lock is never poisoned");
                if current {
                    *behind = None;
                    continue;
                }
                if self.follows_a_feed() && *behind != Some(stored) {
                    *behind = Some(stored);
                    continue;
                }
                *behind = None;
            }
            tracing::info!(config_id = %pipeline_id, transform_uid = %uid, ?held, ?stored, "set changed unheard: index loaded again");
            match self.reload(&handle, &pipeline_id, &uid).await {
                Ok(()) => reloaded += 1,
                Err(error) => {
                    failed.get_or_insert(error);
                }
            }
        }
        failed.map_or(Ok(reloaded), Err)
    }

    /// Applies one entry of the change feed to the index of its set (when loaded): the
    /// next version is applied, an older one skipped, and a gap or an entry without values
    /// loads the set again.
    ///
    /// # Errors
    /// A store failure while loading again (the old values stay).
    pub async fn apply_feed(&self, entry: SetFeedEntry) -> Result<()> {
        let SetFeedEntry { pipeline_id, transform_uid, set_id, version, change } = entry;
        let Some(handle) = self.handle(&pipeline_id, &transform_uid) else { return Ok(()) };
        if change == SetFeedChange::Dropped {
            self.handles
                .lock()
                .expect("set index map lock is never poisoned")
                .remove(&(pipeline_id, transform_uid));
            return Ok(());
        }
        let change = Change::from_feed(change);
        {
            let mut pending =
                handle.pending.lock().expect("pending-changes lock is never poisoned");
            if let Some(queue) = pending.as_mut() {
                queue.push(Queued { version: Some((set_id, version)), change });
                return Ok(());
            }
            let mut held = handle.version.lock().expect("set version lock is never poisoned");
            match (step(*held, set_id, version), &change) {
                (Step::Stale, _) => return Ok(()),
                (Step::Next, Some(change)) => {
                    handle.write(change);
                    *held = Some((set_id, version));
                    return Ok(());
                }
                _ => {}
            }
        }
        tracing::info!(config_id = %pipeline_id, transform_uid = %transform_uid, set_id, version, held = ?handle.held_version(), "set feed: a gap or a large change; index loaded again");
        self.reload(&handle, &pipeline_id, &transform_uid).await
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
        if self.follows_a_feed() {
            // The feed brings it to this node and every other, in order with every other
            // node's changes: no signal needed either.
            return;
        }
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

    fn follows_feed(&self) -> bool {
        self.follows_a_feed()
    }

    /// Whether the index of the set, if loaded, holds the stored version `stored`.
    fn caught_up(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        stored: Option<(i64, i64)>,
    ) -> bool {
        let Some(handle) = self.handle(pipeline_id, transform_uid) else { return true };
        if handle.is_loading() {
            return false;
        }
        match (handle.held_version(), stored) {
            (Some((a, held)), Some((b, stored))) => a == b && held >= stored,
            (_, None) => handle.with(ValueSet::is_empty),
            (None, Some(_)) => false,
        }
    }
}

/// Where the dataset entries of the feed go (the runtime's dataset index).
#[async_trait::async_trait]
pub trait DatasetFeedTarget: Send + Sync + 'static {
    async fn apply(&self, entry: DatasetFeedEntry);
}

/// Drops dataset entries: for a process that keeps no dataset index.
#[async_trait::async_trait]
impl DatasetFeedTarget for () {
    async fn apply(&self, _: DatasetFeedEntry) {}
}

/// Feeds every entry of the set store's change feed to `indexes` while they exist (dataset
/// entries to `datasets`), and refreshes the set indexes every few seconds (an entry lost
/// with a connection, or trimmed, shows as a stored version the index does not hold).
pub async fn follow_feed(
    indexes: Weak<SetIndexes>,
    datasets: Arc<dyn DatasetFeedTarget>,
    mut feed: SetFeed,
) {
    const REFRESH_EVERY: Duration = Duration::from_secs(5);
    const TRIM_EVERY: Duration = Duration::from_secs(60);
    const FEED_AGE: Duration = Duration::from_secs(600);
    if let Some(indexes) = indexes.upgrade() {
        indexes.on_feed.store(true, Ordering::Relaxed);
    }
    let mut refreshed = Instant::now();
    let mut trimmed = Instant::now();
    loop {
        let read = feed.next(Duration::from_secs(1)).await;
        let Some(indexes) = indexes.upgrade() else { return };
        match read {
            Ok(entries) => apply_feed_entries(&indexes, datasets.as_ref(), entries).await,
            Err(error) => {
                tracing::warn!(%error, "set feed: read failed; reading again in a second");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        if refreshed.elapsed() >= REFRESH_EVERY {
            refreshed = Instant::now();
            if let Err(error) = indexes.refresh().await {
                tracing::warn!(%error, "cannot refresh the set-filter indexes");
            }
        }
        if trimmed.elapsed() >= TRIM_EVERY {
            trimmed = Instant::now();
            // A bulk load's large entries go once every node had minutes to read them.
            if let Err(error) = feed.trim(FEED_AGE).await {
                tracing::warn!(%error, "cannot trim the set feed");
            }
        }
    }
}

/// Entries read from the change feed: set changes to `indexes`, dataset changes to
/// `datasets`.
async fn apply_feed_entries(
    indexes: &SetIndexes,
    datasets: &dyn DatasetFeedTarget,
    entries: Vec<FeedEntry>,
) {
    for entry in entries {
        match entry {
            FeedEntry::Set(entry) => {
                if let Err(error) = indexes.apply_feed(entry).await {
                    tracing::warn!(%error, "set feed: cannot load a set index again");
                }
            }
            FeedEntry::Dataset(entry) => datasets.apply(entry).await,
        }
    }
}
