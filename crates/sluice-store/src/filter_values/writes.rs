//! The three writes of a set filter's values (add, remove, replace), each in one
//! transaction that also records the change in the set history
//! ([`crate::set_history`]) with the stamp it is given.

use sluice_filter::ValueSet;

use super::snapshot_key;
use crate::dialect::StoreBackend;
use crate::redis_sets::SetRef;
use crate::set_history::{ChangeLists, ChangeStamp, SetChangeKind};
use crate::{Result, Store, StoreError};

/// The three writes of a set, each recording itself in the set history with `stamp`.
impl<D: StoreBackend> Store<D> {
    pub(crate) async fn add_stamped(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
        stamp: &ChangeStamp,
    ) -> Result<u64> {
        if let Some(redis) = &self.redis {
            return self
                .redis_change(redis, pipeline_id, transform_uid, values, SetChangeKind::Add, stamp)
                .await;
        }
        let mut slot = self.sets.lock(pipeline_id, transform_uid).await;
        let mut tx = D::begin_write(&self.pool).await?;
        if values.is_empty() {
            return Ok(0);
        }
        let found =
            self.table_members(&mut tx, &mut slot, pipeline_id, transform_uid, true).await?;
        let Some((set, version, mut members)) = found else {
            return Ok(0);
        };
        // The set decides what is new, repeats within the request included, as the
        // backend draws the values; the rows are appended in request order.
        let new: Vec<&str> =
            values.iter().map(String::as_str).filter(|value| members.insert(value)).collect();
        let added = D::insert_values(&mut tx, set, &mut new.iter().copied()).await?;
        let version = if added == 0 {
            version
        } else {
            Self::mark_written(&mut tx, set, added as i64).await?
        };
        let (uid, kind) = (transform_uid, SetChangeKind::Add);
        let count = members.len();
        Self::record_set_change(
            &mut tx,
            pipeline_id,
            uid,
            stamp,
            kind,
            values.len(),
            ChangeLists::added(&new),
            count,
        )
        .await?;
        tx.commit().await?;
        self.sets.put_back(pipeline_id, transform_uid, &mut slot, set, version, members);
        Ok(added)
    }

    pub(crate) async fn remove_stamped(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
        stamp: &ChangeStamp,
    ) -> Result<u64> {
        if let Some(redis) = &self.redis {
            return self
                .redis_change(
                    redis,
                    pipeline_id,
                    transform_uid,
                    values,
                    SetChangeKind::Remove,
                    stamp,
                )
                .await;
        }
        let mut slot = self.sets.lock(pipeline_id, transform_uid).await;
        let mut tx = D::begin_write(&self.pool).await?;
        let found =
            self.table_members(&mut tx, &mut slot, pipeline_id, transform_uid, false).await?;
        let Some((set, version, mut members)) = found else {
            return Ok(0);
        };
        let present: Vec<&str> =
            values.iter().map(String::as_str).filter(|value| members.remove(value)).collect();
        let version = if present.is_empty() {
            version
        } else {
            let removed = D::delete_values(&mut tx, set, &present, true).await?;
            if removed != present.len() as u64 {
                return Err(StoreError::Corrupt {
                    what: "filter values",
                    detail: format!(
                        "set {set}: {} values to remove were in memory, {removed} rows in the table",
                        present.len()
                    ),
                });
            }
            Self::mark_written(&mut tx, set, -(removed as i64)).await?
        };
        let (uid, kind, given, count) =
            (transform_uid, SetChangeKind::Remove, values.len(), members.len());
        Self::record_set_change(
            &mut tx,
            pipeline_id,
            uid,
            stamp,
            kind,
            given,
            ChangeLists::removed(&present),
            count,
        )
        .await?;
        tx.commit().await?;
        self.sets.put_back(pipeline_id, transform_uid, &mut slot, set, version, members);
        Ok(present.len() as u64)
    }

    /// [`Self::replace_stamped`] when the values live in Redis.
    async fn redis_replace(
        &self,
        redis: &crate::RedisSets,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
        stamp: &ChangeStamp,
    ) -> Result<u64> {
        let mut slot = self.sets.lock(pipeline_id, transform_uid).await;
        slot.loaded = None;
        let mut tx = D::begin_write(&self.pool).await?;
        let create = !values.is_empty();
        let Some(id) =
            Self::redis_set_for_write(redis, &mut tx, pipeline_id, transform_uid, create, true)
                .await?
        else {
            // An emptied set the set store lost is dropped.
            tx.commit().await?;
            return Ok(0);
        };
        let set = SetRef { pipeline_id, transform_uid, id };
        let (before, _) = Self::redis_members(redis, &mut slot, id).await?;
        slot.loaded = None;
        let kind = SetChangeKind::Replace;
        if values.is_empty() {
            let gone = ChangeLists::removed(before.values());
            Self::record_set_change(&mut tx, pipeline_id, transform_uid, stamp, kind, 0, gone, 0)
                .await?;
            // As on the tables: an emptied set is dropped, and its next write makes a
            // new one.
            Self::drop_set(&mut tx, id).await?;
            tx.commit().await?;
            // The set is gone either way (its id is no longer named); other nodes'
            // indexes find that by its version if the feed entry is not written.
            if let Err(error) = redis.drop_set(set, true).await {
                tracing::warn!(%error, pipeline_id, transform_uid, "an emptied set's values stay in Redis under an id nothing names");
            }
            return Ok(0);
        }
        let (members, at) = redis.replace(set, values).await?;
        let lists = difference(&before, &members, values);
        let count = members.len();
        Self::record_set_change(
            &mut tx,
            pipeline_id,
            transform_uid,
            stamp,
            kind,
            values.len(),
            lists,
            count,
        )
        .await?;
        Self::record_count(&mut tx, id, count).await?;
        tx.commit().await?;
        let count = members.len() as u64;
        self.keep_redis(pipeline_id, transform_uid, &mut slot, id, at, members);
        Ok(count)
    }

    pub(crate) async fn replace_stamped(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
        stamp: &ChangeStamp,
    ) -> Result<u64> {
        if let Some(redis) = &self.redis {
            return self.redis_replace(redis, pipeline_id, transform_uid, values, stamp).await;
        }
        let mut slot = self.sets.lock(pipeline_id, transform_uid).await;
        slot.loaded = None;
        let mut tx = D::begin_write(&self.pool).await?;
        if !Self::lock_set_filter(&mut tx, pipeline_id, transform_uid).await? {
            return Ok(0);
        }
        if values.is_empty() {
            let mut gone = ChangeLists::default();
            if let Some((set, version)) =
                Self::set_row(&mut tx, pipeline_id, transform_uid, false).await?
            {
                let key = snapshot_key(pipeline_id, transform_uid, set, version);
                let members = self.current_values(&mut tx, &mut slot, key).await?;
                gone = ChangeLists::removed(members.values());
                slot.loaded = None;
                Self::drop_set(&mut tx, set).await?;
            }
            let kind = SetChangeKind::Replace;
            Self::record_set_change(&mut tx, pipeline_id, transform_uid, stamp, kind, 0, gone, 0)
                .await?;
            tx.commit().await?;
            return Ok(0);
        }
        let (set, version) = Self::set_row(&mut tx, pipeline_id, transform_uid, true)
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        let members = self
            .current_values(
                &mut tx,
                &mut slot,
                snapshot_key(pipeline_id, transform_uid, set, version),
            )
            .await?;
        // Only the difference is written: values in both sets keep their rows (and so
        // their cursor position), and re-sending a mostly unchanged list writes little.
        let mut wanted = ValueSet::with_capacity(values.len());
        let kept: Vec<&str> =
            values.iter().map(String::as_str).filter(|value| wanted.insert(value)).collect();
        let new: Vec<&str> =
            kept.iter().copied().filter(|value| !members.contains(value)).collect();
        let stale = members.len() - (kept.len() - new.len());
        let mut removed = 0;
        if stale > 0 {
            removed = D::delete_values(&mut tx, set, &kept, false).await?;
        }
        if removed != stale as u64 {
            return Err(StoreError::Corrupt {
                what: "filter values",
                detail: format!(
                    "set {set}: {stale} stale values in memory, {removed} rows deleted"
                ),
            });
        }
        D::insert_values(&mut tx, set, &mut new.iter().copied()).await?;
        let version = Self::mark_written(&mut tx, set, new.len() as i64 - removed as i64).await?;
        let lists = if stale == 0 {
            ChangeLists::added(&new)
        } else {
            ChangeLists::of(&new, members.values().filter(|value| !wanted.contains(value)))
        };
        let (kind, given, count) = (SetChangeKind::Replace, values.len(), wanted.len());
        Self::record_set_change(
            &mut tx,
            pipeline_id,
            transform_uid,
            stamp,
            kind,
            given,
            lists,
            count,
        )
        .await?;
        tx.commit().await?;
        let count = wanted.len() as u64;
        self.sets.put_back(pipeline_id, transform_uid, &mut slot, set, version, wanted);
        Ok(count)
    }
}

/// What a replace of `before` by `values` (now `after`) added, in request order, and removed.
fn difference(before: &ValueSet, after: &ValueSet, values: &[String]) -> ChangeLists {
    let mut seen = ValueSet::with_capacity(values.len());
    let new = values
        .iter()
        .map(String::as_str)
        .filter(|value| !before.contains(value) && seen.insert(value));
    ChangeLists::of(new, before.values().filter(|value| !after.contains(value)))
}
