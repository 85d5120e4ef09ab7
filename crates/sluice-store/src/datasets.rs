//! Datasets (docs/contract.md §Dataset): named lists of string values owned by a user, and their
//! entries.
//!
//! [`DatasetStore`] is the role; [`MetadataStore`](crate::MetadataStore) includes it, so
//! whoever holds the store reaches datasets too. Both backends run the SQL written once in
//! the generic code below; the bulk entry statements and the write lock differ per database
//! and live in [`sqlite`] and [`postgres`] below.
//!
//! Every method takes the owner's user id and finds a dataset only among that user's: another
//! user's dataset is indistinguishable from a missing one. Values are stored as given (the
//! API normalises them); entries list in ascending bytewise order on both backends.

pub(crate) mod postgres;
pub(crate) mod sqlite;

use std::future::Future;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sluice_core::datasets::Dataset;
use sqlx::Row as _;

use crate::dialect::{Dialect, Row, StoreBackend};
use crate::filter_values::sorted_unique;
use crate::redis_sets::{DatasetFeedChange, DatasetFeedEntry};
use crate::{Result, Store, StoreError};

/// The dataset statements that differ per database: the write lock, and the bulk entry
/// statements that are only fast written per database; implemented in `sqlite.rs` and
/// `postgres.rs` of `datasets/`.
pub trait DatasetSql: Dialect {
    /// Selects the `datasets` columns of dataset `$1` owned by `$2` and holds off its other
    /// writers and its deletion until commit.
    const LOCK_DATASET: &'static str;

    /// Adds sorted, unique `values` to dataset `seq` (holding `size` entries now), skipping
    /// those present, with the dataset lock held; returns the rows added.
    fn insert_entries(
        tx: &mut sqlx::Transaction<'_, Self::Db>,
        seq: i64,
        values: &[&str],
        size: u64,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Deletes sorted, unique `values` from dataset `seq`, with the dataset lock held;
    /// returns the rows deleted.
    fn delete_entries(
        tx: &mut sqlx::Transaction<'_, Self::Db>,
        seq: i64,
        values: &[&str],
    ) -> impl Future<Output = Result<u64>> + Send;
}

/// What an entry change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntriesChange {
    /// Entries added (values not in the dataset before) or removed (values that were in it).
    pub count: u64,
    /// The dataset's [`Dataset::version`] after the change.
    pub version: u64,
}

/// Moves the number [`DatasetStore::datasets_seq`] reads; run in the transaction of every
/// write of a dataset.
const BUMP_DATASETS_SEQ: &str = "UPDATE datasets_seq SET seq = seq + 1 WHERE id = 1";

/// One page of a dataset's entries, in ascending order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryPage {
    pub values: Vec<String>,
    /// The cursor of the next page (the last value of this one); `None` when no entry
    /// follows.
    pub next: Option<String>,
    /// Entries in the dataset when the page was read.
    pub total_count: u64,
}

/// Durable datasets and their entries. Every method is one transaction.
#[async_trait]
pub trait DatasetStore: Send + Sync + 'static {
    /// Creates an empty dataset `name` for `owner_user_id`, created and updated `at`.
    /// `None` when the owner already has a dataset of that name.
    ///
    /// # Errors
    /// A database failure; nothing is created then.
    async fn create_dataset(
        &self,
        owner_user_id: &str,
        name: &str,
        at: DateTime<Utc>,
    ) -> Result<Option<Dataset>>;

    /// The owner's datasets, oldest first; with `names` not empty, only those of these names.
    ///
    /// # Errors
    /// A database failure.
    async fn list_datasets(&self, owner_user_id: &str, names: &[String]) -> Result<Vec<Dataset>>;

    /// The owner's dataset `id`.
    ///
    /// # Errors
    /// A database failure.
    async fn dataset(&self, owner_user_id: &str, id: &str) -> Result<Option<Dataset>>;

    /// The owner's dataset called `name`.
    ///
    /// # Errors
    /// A database failure.
    async fn dataset_by_name(&self, owner_user_id: &str, name: &str) -> Result<Option<Dataset>>;

    /// Deletes the owner's dataset `id` and every entry of it; returns it as it was, `None`
    /// when the owner has no such dataset. Waits for entry writers of the dataset to finish.
    ///
    /// # Errors
    /// A database failure; nothing is deleted then.
    async fn delete_dataset(&self, owner_user_id: &str, id: &str) -> Result<Option<Dataset>>;

    /// Adds `values` (repeats count once) to the owner's dataset `id`; `count` is how many
    /// were not in it before. Takes the dataset's next version, and sets `updated_at` to `at`
    /// when something was added. `None` when the owner has no such dataset. Writers of one
    /// dataset are serialised.
    ///
    /// # Errors
    /// A database failure; nothing is added then.
    async fn add_dataset_entries(
        &self,
        owner_user_id: &str,
        id: &str,
        values: &[String],
        at: DateTime<Utc>,
    ) -> Result<Option<EntriesChange>>;

    /// Removes `values` from the owner's dataset `id`, ignoring values not in it; `count` is
    /// how many were removed. Otherwise as [`DatasetStore::add_dataset_entries`].
    ///
    /// # Errors
    /// A database failure; nothing is removed then.
    async fn remove_dataset_entries(
        &self,
        owner_user_id: &str,
        id: &str,
        values: &[String],
        at: DateTime<Utc>,
    ) -> Result<Option<EntriesChange>>;

    /// Up to `limit` (at least 1) entries of the owner's dataset `id` that sort after `after`
    /// (`None`: from the first), ascending. Paging with [`EntryPage::next`] lists every entry
    /// present throughout once; an entry added meanwhile is listed when it sorts after the
    /// cursor. `None` when the owner has no such dataset.
    ///
    /// # Errors
    /// A database failure.
    async fn list_dataset_entries(
        &self,
        owner_user_id: &str,
        id: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Option<EntryPage>>;

    /// Whether `value` is an entry of the owner's dataset `id`; `None` when the owner has no
    /// such dataset.
    ///
    /// # Errors
    /// A database failure.
    async fn has_dataset_entry(
        &self,
        owner_user_id: &str,
        id: &str,
        value: &str,
    ) -> Result<Option<bool>>;

    /// Every dataset of every user, oldest first (what a starting process indexes).
    ///
    /// # Errors
    /// A database failure.
    async fn all_datasets(&self) -> Result<Vec<Dataset>>;

    /// A number that moves with every write of any dataset: while it stays,
    /// [`DatasetStore::all_datasets`] answers the same.
    ///
    /// # Errors
    /// A database failure.
    async fn datasets_seq(&self) -> Result<i64>;
}

/// The columns of a `datasets` row, in the order [`dataset_row`] reads them.
pub(crate) const DATASET_COLUMNS: &str =
    "seq, id, owner_user_id, name, entry_count, version, created_at, updated_at";

/// Rows per read when an insert or a load reads a dataset's entries.
pub(crate) const SCAN_PAGE: i64 = 50_000;

/// A `datasets` row as stored.
pub(crate) struct DatasetRow {
    pub seq: i64,
    pub id: String,
    pub owner_user_id: String,
    pub name: String,
    pub entry_count: i64,
    pub version: i64,
    pub created_at: String,
    pub updated_at: String,
}

impl DatasetRow {
    pub(crate) fn into_dataset(self) -> Result<Dataset> {
        let corrupt = |detail: String| StoreError::Corrupt {
            what: "dataset",
            detail: format!("{}: {detail}", self.id),
        };
        let timestamp = |text: &str| {
            sluice_core::time::parse(text).map_err(|e| corrupt(format!("timestamp {text:?}: {e}")))
        };
        let count =
            |n: i64, what: &str| u64::try_from(n).map_err(|_| corrupt(format!("{what} {n}")));
        Ok(Dataset {
            created_at: timestamp(&self.created_at)?,
            updated_at: timestamp(&self.updated_at)?,
            entry_count: count(self.entry_count, "entry_count")?,
            version: count(self.version, "version")?,
            seq: self.seq,
            id: self.id,
            owner_user_id: self.owner_user_id,
            name: self.name,
        })
    }
}

fn dataset_row<D: StoreBackend>(row: &Row<D>) -> Result<Dataset> {
    DatasetRow {
        seq: row.try_get("seq")?,
        id: row.try_get("id")?,
        owner_user_id: row.try_get("owner_user_id")?,
        name: row.try_get("name")?,
        entry_count: row.try_get("entry_count")?,
        version: row.try_get("version")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    }
    .into_dataset()
}

impl<D: StoreBackend> Store<D> {
    /// The one dataset where `condition` holds, with `$1` bound to `first` and `$2` to
    /// `second` (each caller names the owner, so no other user's dataset is found).
    async fn dataset_where(
        &self,
        condition: &str,
        first: &str,
        second: &str,
    ) -> Result<Option<Dataset>> {
        let row = sqlx::query(&format!("SELECT {DATASET_COLUMNS} FROM datasets WHERE {condition}"))
            .bind(first)
            .bind(second)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(dataset_row::<D>).transpose()
    }

    /// The owner's dataset `id`, locked against its other writers until `tx` ends.
    /// With a shared set store, tells every node's dataset index of a committed change
    /// through the feed. A failure is logged: the change is committed, and nodes find it
    /// by its version when they next refresh.
    async fn publish_dataset(&self, dataset: &Dataset, version: u64, change: DatasetFeedChange) {
        let Some(redis) = &self.redis else { return };
        let entry = DatasetFeedEntry {
            owner_user_id: dataset.owner_user_id.clone(),
            name: dataset.name.clone(),
            seq: dataset.seq,
            version,
            change,
        };
        if let Err(error) = redis.publish_dataset(&entry).await {
            tracing::warn!(%error, dataset = %dataset.name, "a dataset change was not put on the feed; nodes see it at their next refresh");
        }
    }

    async fn lock_dataset(
        tx: &mut sqlx::Transaction<'_, D::Db>,
        owner_user_id: &str,
        id: &str,
    ) -> Result<Option<Dataset>> {
        let row = sqlx::query(D::LOCK_DATASET)
            .bind(id)
            .bind(owner_user_id)
            .fetch_optional(&mut **tx)
            .await?;
        row.as_ref().map(dataset_row::<D>).transpose()
    }

    /// Stores the effect of an entry change on the dataset row: the new count, the
    /// next version, and `updated_at` when an entry came or went.
    async fn record_change(
        tx: &mut sqlx::Transaction<'_, D::Db>,
        dataset: &Dataset,
        entry_count: u64,
        at: DateTime<Utc>,
    ) -> Result<u64> {
        let version = dataset.version + 1;
        let updated_at = if entry_count == dataset.entry_count { dataset.updated_at } else { at };
        sqlx::query(
            "UPDATE datasets SET entry_count = $2, version = $3, updated_at = $4 \
             WHERE seq = $1",
        )
        .bind(dataset.seq)
        .bind(entry_count as i64)
        .bind(version as i64)
        .bind(sluice_core::time::format(updated_at))
        .execute(&mut **tx)
        .await?;
        sqlx::query(BUMP_DATASETS_SEQ).execute(&mut **tx).await?;
        Ok(version)
    }
}

#[async_trait]
impl<D: StoreBackend> DatasetStore for Store<D> {
    async fn create_dataset(
        &self,
        owner_user_id: &str,
        name: &str,
        at: DateTime<Utc>,
    ) -> Result<Option<Dataset>> {
        let id = sluice_core::ids::new_id();
        let at = sluice_core::time::format(at);
        let mut tx = self.pool.begin().await?;
        let created = sqlx::query(
            "INSERT INTO datasets (id, owner_user_id, name, entry_count, version, \
             created_at, updated_at) VALUES ($1, $2, $3, 0, 0, $4, $4) \
             ON CONFLICT (owner_user_id, name) DO NOTHING",
        )
        .bind(&id)
        .bind(owner_user_id)
        .bind(name)
        .bind(&at)
        .execute(&mut *tx)
        .await
        .map(|done| D::rows_affected(&done))?;
        if created == 0 {
            return Ok(None);
        }
        let row = sqlx::query(&format!("SELECT {DATASET_COLUMNS} FROM datasets WHERE id = $1"))
            .bind(&id)
            .fetch_one(&mut *tx)
            .await?;
        let dataset = dataset_row::<D>(&row)?;
        sqlx::query(BUMP_DATASETS_SEQ).execute(&mut *tx).await?;
        tx.commit().await?;
        self.publish_dataset(&dataset, 0, DatasetFeedChange::Created).await;
        Ok(Some(dataset))
    }

    async fn list_datasets(&self, owner_user_id: &str, names: &[String]) -> Result<Vec<Dataset>> {
        // A user has few datasets: filtering by name here keeps the SQL portable.
        let rows = sqlx::query(&format!(
            "SELECT {DATASET_COLUMNS} FROM datasets WHERE owner_user_id = $1 ORDER BY seq"
        ))
        .bind(owner_user_id)
        .fetch_all(&self.pool)
        .await?;
        let mut datasets = Vec::with_capacity(rows.len());
        for row in &rows {
            let dataset = dataset_row::<D>(row)?;
            if names.is_empty() || names.contains(&dataset.name) {
                datasets.push(dataset);
            }
        }
        Ok(datasets)
    }

    async fn dataset(&self, owner_user_id: &str, id: &str) -> Result<Option<Dataset>> {
        self.dataset_where("id = $1 AND owner_user_id = $2", id, owner_user_id).await
    }

    async fn dataset_by_name(&self, owner_user_id: &str, name: &str) -> Result<Option<Dataset>> {
        self.dataset_where("owner_user_id = $1 AND name = $2", owner_user_id, name).await
    }

    async fn delete_dataset(&self, owner_user_id: &str, id: &str) -> Result<Option<Dataset>> {
        let mut tx = D::begin_write(&self.pool).await?;
        let Some(dataset) = Self::lock_dataset(&mut tx, owner_user_id, id).await? else {
            return Ok(None);
        };
        sqlx::query("DELETE FROM dataset_entries WHERE dataset_seq = $1")
            .bind(dataset.seq)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM datasets WHERE seq = $1")
            .bind(dataset.seq)
            .execute(&mut *tx)
            .await?;
        sqlx::query(BUMP_DATASETS_SEQ).execute(&mut *tx).await?;
        tx.commit().await?;
        self.publish_dataset(&dataset, 0, DatasetFeedChange::Dropped).await;
        Ok(Some(dataset))
    }

    async fn add_dataset_entries(
        &self,
        owner_user_id: &str,
        id: &str,
        values: &[String],
        at: DateTime<Utc>,
    ) -> Result<Option<EntriesChange>> {
        let values = sorted_unique(values);
        let mut tx = D::begin_write(&self.pool).await?;
        let Some(dataset) = Self::lock_dataset(&mut tx, owner_user_id, id).await? else {
            return Ok(None);
        };
        let added = D::insert_entries(&mut tx, dataset.seq, &values, dataset.entry_count).await?;
        let version =
            Self::record_change(&mut tx, &dataset, dataset.entry_count + added, at).await?;
        tx.commit().await?;
        if self.redis.is_some() {
            let values = values.iter().map(|v| (*v).to_owned()).collect();
            self.publish_dataset(&dataset, version, DatasetFeedChange::Added(values)).await;
        }
        Ok(Some(EntriesChange { count: added, version }))
    }

    async fn remove_dataset_entries(
        &self,
        owner_user_id: &str,
        id: &str,
        values: &[String],
        at: DateTime<Utc>,
    ) -> Result<Option<EntriesChange>> {
        let values = sorted_unique(values);
        let mut tx = D::begin_write(&self.pool).await?;
        let Some(dataset) = Self::lock_dataset(&mut tx, owner_user_id, id).await? else {
            return Ok(None);
        };
        let removed = D::delete_entries(&mut tx, dataset.seq, &values).await?;
        let left = dataset.entry_count.saturating_sub(removed);
        let version = Self::record_change(&mut tx, &dataset, left, at).await?;
        tx.commit().await?;
        if self.redis.is_some() {
            let values = values.iter().map(|v| (*v).to_owned()).collect();
            self.publish_dataset(&dataset, version, DatasetFeedChange::Removed(values)).await;
        }
        Ok(Some(EntriesChange { count: removed, version }))
    }

    async fn list_dataset_entries(
        &self,
        owner_user_id: &str,
        id: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Option<EntryPage>> {
        let Some(dataset) = self.dataset(owner_user_id, id).await? else {
            return Ok(None);
        };
        let limit = limit.max(1);
        // One row more than asked tells whether another page follows.
        let rows = match after {
            Some(after) => {
                sqlx::query(
                    "SELECT value FROM dataset_entries WHERE dataset_seq = $1 \
                     AND value > $2 ORDER BY value LIMIT $3",
                )
                .bind(dataset.seq)
                .bind(after)
                .bind(i64::from(limit) + 1)
                .fetch_all(&self.pool)
                .await?
            }
            None => {
                sqlx::query(
                    "SELECT value FROM dataset_entries WHERE dataset_seq = $1 \
                     ORDER BY value LIMIT $2",
                )
                .bind(dataset.seq)
                .bind(i64::from(limit) + 1)
                .fetch_all(&self.pool)
                .await?
            }
        };
        let more = rows.len() > limit as usize;
        let values: Vec<String> = rows
            .iter()
            .take(limit as usize)
            .map(|row| row.try_get("value"))
            .collect::<Result<_, _>>()?;
        let next = if more { values.last().cloned() } else { None };
        Ok(Some(EntryPage { values, next, total_count: dataset.entry_count }))
    }

    async fn has_dataset_entry(
        &self,
        owner_user_id: &str,
        id: &str,
        value: &str,
    ) -> Result<Option<bool>> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM dataset_entries e \
             WHERE e.dataset_seq = d.seq AND e.value = $3) AS hits \
             FROM datasets d WHERE d.id = $1 AND d.owner_user_id = $2",
        )
        .bind(id)
        .bind(owner_user_id)
        .bind(value)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| Ok(row.try_get::<i64, _>("hits")? > 0)).transpose()
    }

    async fn all_datasets(&self) -> Result<Vec<Dataset>> {
        let rows = sqlx::query(&format!("SELECT {DATASET_COLUMNS} FROM datasets ORDER BY seq"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(dataset_row::<D>).collect()
    }

    async fn datasets_seq(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT seq FROM datasets_seq WHERE id = 1")
            .fetch_one(&self.pool)
            .await?
            .try_get("seq")?)
    }
}
