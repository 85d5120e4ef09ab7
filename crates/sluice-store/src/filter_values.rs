//! The filter-value role ([`FilterValueStore`]): the values of each set filter of a
//! pipeline. `filter_values/sets.rs` finds, locks, reads and records the stored sets;
//! `filter_values/sqlite.rs` and `postgres.rs` hold the bulk statements per database
//! ([`FilterValueSql`]); `filter_sets.rs` holds the in-memory copies that decide membership.

mod lost;
mod postgres;
mod sets;
mod sqlite;
mod writes;

use std::future::Future;

use async_trait::async_trait;
use sluice_filter::ValueSet;
use sqlx::Row as _;

use crate::dialect::{Dialect, StoreBackend};
use crate::set_history::{ChangeStamp, SetChangeKind};
use crate::set_snapshots::SnapshotKey;
use crate::{Result, Store};

/// The filter-value statements that are only fast written per database (a JSON array on
/// SQLite, `COPY` and arrays on PostgreSQL), implemented beside this module in `sqlite.rs` and
/// `postgres.rs` of `filter_values/`.
pub trait FilterValueSql: Dialect {
    /// Appends `values` (known to be absent, each once) to filter-value set `set_id` in
    /// order, with the pipeline lock held; returns the rows added.
    fn insert_values(
        tx: &mut sqlx::Transaction<'_, Self::Db>,
        set_id: i64,
        values: &mut (dyn Iterator<Item = &str> + Send),
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Deletes the rows of set `set_id` whose value is in `list` (`listed`) or not in it, in
    /// one statement (the table has no index on values), with the pipeline lock held;
    /// returns the rows deleted.
    fn delete_values(
        tx: &mut sqlx::Transaction<'_, Self::Db>,
        set_id: i64,
        list: &[&str],
        listed: bool,
    ) -> impl Future<Output = Result<u64>> + Send;
}

/// One page of a set filter's values, in the order they were added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilterValuePage {
    pub values: Vec<String>,
    /// The cursor of the next page (pass it as `after`); `None` when no value follows.
    pub next: Option<i64>,
}

/// The values of one request, each once, sorted.
///
/// Requests may repeat a value. Sorted rows go into a dataset's `(dataset_seq, value)` key in
/// key order, which keeps a large load appending to the same index pages instead of touching
/// pages all over the tree; a new pipeline's initial filter values only need the repeats out.
pub(crate) fn sorted_unique(values: &[String]) -> Vec<&str> {
    let mut sorted: Vec<&str> = values.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    sorted
}

/// The id of the set of pipeline `$1`'s transform `$2`, as a scalar subquery (NULL, so no
/// rows, when the set was never written).
pub(crate) const SET_ID: &str =
    "(SELECT id FROM filter_sets WHERE pipeline_id = $1 AND transform_uid = $2)";

/// Rows per read when a replace scans the set it replaces.
const SCAN_PAGE: i64 = 100_000;

/// The values of set filters. Every method is one transaction.
#[async_trait]
pub trait FilterValueStore: Send + Sync + 'static {
    /// Number of filter values of one transform.
    async fn filter_value_count(&self, pipeline_id: &str, transform_uid: &str) -> Result<u64>;

    /// Adds `values` (normalised by the caller; repeats within `values` count once) to the
    /// set of one transform. Returns how many were not in the set before.
    ///
    /// Values are stored only for a set filter of the stored pipeline configuration: when
    /// the pipeline does not exist or `transform_uid` is not one of its set filters (say a
    /// concurrent update removed it), nothing changes and the answer is 0. Writers of one
    /// pipeline are serialised, so values committed later always list after values
    /// committed earlier.
    ///
    /// # Errors
    /// A database failure; nothing is added then.
    async fn add_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
    ) -> Result<u64>;

    /// Removes `values` from the set of one transform; values not in it are ignored. Returns
    /// how many were removed (0 when `transform_uid` is not a set filter of a stored
    /// pipeline).
    ///
    /// # Errors
    /// A database failure; nothing is removed then.
    async fn remove_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
    ) -> Result<u64>;

    /// Makes the set of one transform exactly `values` (empty clears it), atomically: readers
    /// see the old set or the new one. Returns the number of values in the set after (0, and
    /// nothing changes, when `transform_uid` is not a set filter of a stored pipeline, as for
    /// [`FilterValueStore::add_filter_values`]). Values in both the old and the new set keep their
    /// cursor position; new ones list after every value already there.
    ///
    /// # Errors
    /// A database failure; the old set stays then.
    async fn replace_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
    ) -> Result<u64>;

    /// [`FilterValueStore::add_filter_values`], [`FilterValueStore::remove_filter_values`] or
    /// [`FilterValueStore::replace_filter_values`] (by `kind`), recorded in the set history
    /// (docs/set-filter.md, "Set history") as made at `stamp`. The three methods record their
    /// change as made now, at an unknown position.
    ///
    /// # Errors
    /// As the method `kind` names.
    async fn change_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
        kind: SetChangeKind,
        stamp: ChangeStamp,
    ) -> Result<u64>;

    /// Up to `limit` (at least 1) values of one transform that were added after cursor
    /// `after` (`None`: from the start), oldest first. Paging with [`FilterValuePage::next`]
    /// while others add values neither skips nor repeats a value; values added meanwhile
    /// appear on a later page.
    ///
    /// # Errors
    /// A database failure.
    async fn list_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<FilterValuePage>;

    /// Every value of one transform's set as of one committed write (empty when the set was
    /// never written): what a set filter's index starts from. Copied from the store's own
    /// copy when that is current, else read without blocking writers.
    ///
    /// # Errors
    /// A database failure.
    async fn filter_value_set(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
    ) -> Result<sluice_filter::ValueSet>;

    /// The stored `(set id, version)` of one transform's set (`None`: never written, or
    /// dropped). Every write of a set gives it a new version; a set dropped and made again
    /// has a new id.
    ///
    /// # Errors
    /// A database failure.
    async fn filter_set_version(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
    ) -> Result<Option<(i64, i64)>>;

    /// Whether `value` (normalised by the caller) is in the set of one transform.
    ///
    /// # Errors
    /// A database failure.
    async fn has_filter_value(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        value: &str,
    ) -> Result<bool>;

    /// A reader of the change feed every write of a shared set store appends to (`None`
    /// when the values live in this store's own tables, which have no feed).
    ///
    /// # Errors
    /// When the set store does not answer.
    async fn set_feed(&self) -> Result<Option<crate::SetFeed>>;

    /// Keeps snapshots of large sets in `dir` from now on: the first use of a set after a
    /// restart reads its snapshot (when it is of the set's current version) instead of every
    /// value from the database.
    fn keep_set_snapshots(&self, dir: std::path::PathBuf);

    /// Writes the snapshot of every loaded large set whose snapshot is behind; answers how
    /// many were written.
    ///
    /// # Errors
    /// None today (a failed write is logged and skipped); kept for backends that may fail.
    async fn save_set_snapshots(&self) -> Result<usize>;
}

#[async_trait]
impl<D: StoreBackend> FilterValueStore for Store<D> {
    async fn filter_value_count(&self, pipeline_id: &str, transform_uid: &str) -> Result<u64> {
        if let Some(redis) = &self.redis {
            return match self.redis_set(redis, pipeline_id, transform_uid).await? {
                Some((_, state)) => Ok(u64::try_from(state.count).unwrap_or(0)),
                None => Ok(0),
            };
        }
        let row = sqlx::query(
            "SELECT value_count FROM filter_sets WHERE pipeline_id = $1 AND transform_uid = $2",
        )
        .bind(pipeline_id)
        .bind(transform_uid)
        .fetch_optional(&self.pool)
        .await?;
        let count = row.map(|row| row.try_get::<i64, _>("value_count")).transpose()?;
        Ok(count.map_or(0, |count| u64::try_from(count).unwrap_or(0)))
    }

    async fn add_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
    ) -> Result<u64> {
        self.add_stamped(pipeline_id, transform_uid, values, &ChangeStamp::now()).await
    }

    async fn remove_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
    ) -> Result<u64> {
        self.remove_stamped(pipeline_id, transform_uid, values, &ChangeStamp::now()).await
    }

    async fn replace_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
    ) -> Result<u64> {
        self.replace_stamped(pipeline_id, transform_uid, values, &ChangeStamp::now()).await
    }

    async fn change_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
        kind: SetChangeKind,
        stamp: ChangeStamp,
    ) -> Result<u64> {
        match kind {
            SetChangeKind::Add => {
                self.add_stamped(pipeline_id, transform_uid, values, &stamp).await
            }
            SetChangeKind::Remove => {
                self.remove_stamped(pipeline_id, transform_uid, values, &stamp).await
            }
            SetChangeKind::Replace => {
                self.replace_stamped(pipeline_id, transform_uid, values, &stamp).await
            }
        }
    }

    async fn list_filter_values(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<FilterValuePage> {
        if let Some(redis) = &self.redis {
            return match self.redis_set(redis, pipeline_id, transform_uid).await? {
                Some((set, _)) => redis.page(set, after, limit).await,
                None => Ok(FilterValuePage::default()),
            };
        }
        let limit = limit.max(1);
        let mut tx = self.pool.begin().await?;
        for statement in D::INDEX_ORDER {
            sqlx::query(statement).execute(&mut *tx).await?;
        }
        // One row more than asked tells whether another page follows.
        let rows = sqlx::query(&format!(
            "SELECT seq, value FROM filter_values \
             WHERE set_id = {SET_ID} AND seq > $3 ORDER BY seq LIMIT $4"
        ))
        .bind(pipeline_id)
        .bind(transform_uid)
        .bind(after.unwrap_or(0))
        .bind(i64::from(limit) + 1)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let more = rows.len() > limit as usize;
        let page = &rows[..rows.len().min(limit as usize)];
        let next = match page.last() {
            Some(last) if more => Some(last.try_get::<i64, _>("seq")?),
            _ => None,
        };
        let values = page.iter().map(|row| row.try_get("value")).collect::<Result<_, _>>()?;
        Ok(FilterValuePage { values, next })
    }

    async fn filter_value_set(&self, pipeline_id: &str, transform_uid: &str) -> Result<ValueSet> {
        if let Some(redis) = &self.redis {
            return match self.redis_set(redis, pipeline_id, transform_uid).await? {
                Some((set, _)) => redis.load(set).await,
                None => Ok(ValueSet::new()),
            };
        }
        // Slot first, connection second, as every user of a slot does.
        {
            let slot = self.sets.lock(pipeline_id, transform_uid).await;
            if let Some(loaded) = &slot.loaded {
                let row = sqlx::query("SELECT version FROM filter_sets WHERE id = $1")
                    .bind(loaded.set_id)
                    .fetch_optional(&self.pool)
                    .await?;
                if let Some(row) = row {
                    if slot.is_current(loaded.set_id, row.try_get("version")?) {
                        return Ok(loaded.values.clone());
                    }
                }
            }
        }
        // Read without taking the slot: the store keeps no copy of a set nobody writes.
        let mut tx = D::begin_snapshot(&self.pool).await?;
        let Some((set, version)) =
            Self::set_row(&mut tx, pipeline_id, transform_uid, false).await?
        else {
            return Ok(ValueSet::new());
        };
        let key = snapshot_key(pipeline_id, transform_uid, set, version);
        if let Some(values) = self.sets.snapshots.load(&key).await {
            return Ok(values);
        }
        let values = Self::read_set(&mut tx, set).await?;
        tx.commit().await?;
        if self.sets.snapshots.due(&key, values.len()) {
            // Written from a copy in the background: the caller (a deploy) does not wait.
            let (sets, copy) = (self.sets.clone(), values.clone());
            tokio::spawn(async move { sets.snapshots.save(key, copy).await });
        }
        Ok(values)
    }

    async fn filter_set_version(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
    ) -> Result<Option<(i64, i64)>> {
        if let Some(redis) = &self.redis {
            return match self.redis_set(redis, pipeline_id, transform_uid).await? {
                Some((set, state)) => Ok(Some((set, state.version))),
                None => Ok(None),
            };
        }
        let row = sqlx::query(
            "SELECT id, version FROM filter_sets WHERE pipeline_id = $1 AND transform_uid = $2",
        )
        .bind(pipeline_id)
        .bind(transform_uid)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row
            .map(|row| row.try_get("id").and_then(|id| Ok((id, row.try_get("version")?))))
            .transpose()?)
    }

    async fn set_feed(&self) -> Result<Option<crate::SetFeed>> {
        match &self.redis {
            Some(redis) => Ok(Some(redis.feed().await?)),
            None => Ok(None),
        }
    }

    fn keep_set_snapshots(&self, dir: std::path::PathBuf) {
        self.sets.snapshots.keep_in(dir);
    }

    async fn save_set_snapshots(&self) -> Result<usize> {
        if self.redis.is_some() {
            // Redis holds the sets, and a node reads a set from its log as fast as from a file.
            return Ok(0);
        }
        let mut written = 0;
        for (pipeline_id, uid, slot) in self.sets.slots() {
            let mut slot = slot.lock().await;
            let Some(loaded) = slot.loaded.take() else { continue };
            let key = snapshot_key(&pipeline_id, &uid, loaded.set_id, loaded.version);
            if !self.sets.snapshots.due(&key, loaded.values.len()) {
                slot.loaded = Some(loaded);
                continue;
            }
            let (set_id, version, log) = (loaded.set_id, loaded.version, loaded.log);
            // On a panic of the writer the slot stays empty and is read again when used.
            if let Some(values) = self.sets.snapshots.save(key, loaded.values).await {
                slot.loaded = Some(crate::filter_sets::Loaded { set_id, version, values, log });
                written += 1;
            }
        }
        Ok(written)
    }

    async fn has_filter_value(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        value: &str,
    ) -> Result<bool> {
        if let Some(redis) = &self.redis {
            let Some((set, _)) = self.redis_set(redis, pipeline_id, transform_uid).await? else {
                return Ok(false);
            };
            let mut slot = self.sets.lock(pipeline_id, transform_uid).await;
            // Without the pipeline lock: the copy is that of the log's state read first.
            let (members, at) = Self::redis_members(redis, &mut slot, set).await?;
            let hit = members.contains(value);
            self.keep_redis(pipeline_id, transform_uid, &mut slot, set, at, members);
            return Ok(hit);
        }
        let mut slot = self.sets.lock(pipeline_id, transform_uid).await;
        let row = sqlx::query(
            "SELECT id, version FROM filter_sets WHERE pipeline_id = $1 AND transform_uid = $2",
        )
        .bind(pipeline_id)
        .bind(transform_uid)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(false) };
        let (set, version): (i64, i64) = (row.try_get("id")?, row.try_get("version")?);
        if let Some(loaded) = slot.loaded.as_ref().filter(|_| slot.is_current(set, version)) {
            return Ok(loaded.values.contains(value));
        }
        // Not loaded (or behind): read it from one snapshot, which is one version.
        let mut tx = D::begin_snapshot(&self.pool).await?;
        let Some((set, version)) =
            Self::set_row(&mut tx, pipeline_id, transform_uid, false).await?
        else {
            return Ok(false);
        };
        let members = self
            .current_values(
                &mut tx,
                &mut slot,
                snapshot_key(pipeline_id, transform_uid, set, version),
            )
            .await?;
        tx.commit().await?;
        let hit = members.contains(value);
        self.sets.put_back(pipeline_id, transform_uid, &mut slot, set, version, members);
        Ok(hit)
    }
}

pub(crate) fn snapshot_key(
    pipeline_id: &str,
    transform_uid: &str,
    set_id: i64,
    version: i64,
) -> SnapshotKey {
    SnapshotKey {
        pipeline_id: pipeline_id.to_owned(),
        transform_uid: transform_uid.to_owned(),
        set_id,
        version,
    }
}
