//! A set whose values Redis lost (docs/set-filter.md, "When Redis loses the values").
//!
//! Every write of a set puts its values in Redis *before* its database transaction commits,
//! so a set the database names always has a version in Redis, unless Redis lost it (restarted
//! without persistence, or evicted keys). Before a set so lost is read or written, it is
//! rebuilt from the set history in the database, which records exactly what each committed
//! change added and removed, and written to Redis under a new set id: every node's index then
//! sees a set it does not hold (as for a set dropped and made again) and reads it whole. When
//! the history cannot rebuild it (the changes that made it are pruned), the set answers
//! [`StoreError::SetLost`] until a replace gives it its values again; the nodes meanwhile
//! keep filtering with the values they hold.

use sqlx::Row as _;

use crate::dialect::StoreBackend;
use crate::redis_sets::{LogState, RedisSets, SetRef};
use crate::{Result, Store, StoreError};

/// What a lost set came to.
pub(super) enum Found {
    /// The set, as Redis holds it (restored or not lost): its id and where its log stands.
    Set(i64, LogState),
    /// No set: it was never written, or it held no values.
    None,
}

impl<D: StoreBackend> Store<D> {
    /// Redis mode: the id of pipeline `pipeline_id`'s set `uid` and where its log stands,
    /// the set restored first when Redis lost it (`None`: never written, or empty).
    pub(super) async fn redis_set(
        &self,
        redis: &RedisSets,
        pipeline_id: &str,
        uid: &str,
    ) -> Result<Option<(i64, LogState)>> {
        let Some(id) = self.set_id(pipeline_id, uid).await? else { return Ok(None) };
        let state = redis.state(id).await?;
        if state.version > 0 {
            return Ok(Some((id, state)));
        }
        // Slot first, then the pipeline lock, as every writer of the set.
        let mut slot = self.sets.lock(pipeline_id, uid).await;
        slot.loaded = None;
        let mut tx = D::begin_write(&self.pool).await?;
        if !Self::lock_set_filter(&mut tx, pipeline_id, uid).await? {
            return Ok(None);
        }
        let Some((id, _)) = Self::set_row(&mut tx, pipeline_id, uid, false).await? else {
            return Ok(None);
        };
        let found = Self::restore_if_lost(redis, &mut tx, pipeline_id, uid, id).await?;
        tx.commit().await?;
        Ok(match found {
            Found::Set(id, state) => Some((id, state)),
            Found::None => None,
        })
    }

    /// Under the pipeline lock held by `tx`: set `id` as Redis holds it; when Redis lost it
    /// (no version there) while the database says it holds values, the set rebuilt from its
    /// history and written to Redis under a new id ([`Found::None`] when it rebuilds empty:
    /// the set is dropped).
    ///
    /// # Errors
    /// [`StoreError::SetLost`] when the history cannot rebuild the set.
    pub(super) async fn restore_if_lost(
        redis: &RedisSets,
        tx: &mut sqlx::Transaction<'_, D::Db>,
        pipeline_id: &str,
        uid: &str,
        id: i64,
    ) -> Result<Found> {
        let state = redis.state(id).await?;
        if state.version > 0 {
            return Ok(Found::Set(id, state));
        }
        let recorded: i64 = sqlx::query("SELECT value_count FROM filter_sets WHERE id = $1")
            .bind(id)
            .fetch_one(&mut **tx)
            .await?
            .try_get("value_count")?;
        let replayed = Self::replay_history(tx, pipeline_id, uid).await?;
        let lost = |reason: String| StoreError::SetLost {
            pipeline_id: pipeline_id.to_owned(),
            transform_uid: uid.to_owned(),
            reason,
        };
        let values = match replayed {
            Some((values, count)) if values.len() as u64 == count => values,
            Some((values, count)) => {
                return Err(lost(format!(
                    "its history rebuilds {} values where its last change left {count}",
                    values.len()
                )));
            }
            // No change recorded that made the set from empty. A set that holds no values
            // by the database's count lost nothing (a set of the store's own tables emptied
            // by removals, before its values moved to Redis).
            None if recorded == 0 => return Ok(Found::Set(id, state)),
            None => {
                return Err(lost(format!(
                    "it held {recorded} values, and the changes that made them are no longer \
                     in its history"
                )));
            }
        };
        Self::drop_set(tx, id).await?;
        if values.is_empty() {
            tracing::warn!(pipeline_id, transform_uid = uid, "the set store lost an empty set");
            return Ok(Found::None);
        }
        let (new, _) =
            Self::set_row(tx, pipeline_id, uid, true).await?.ok_or(sqlx::Error::RowNotFound)?;
        redis.clear(new).await?;
        let listed: Vec<String> = values.values().collect();
        let set = SetRef { pipeline_id, transform_uid: uid, id: new };
        let (members, at) = redis.replace(set, &listed).await?;
        Self::record_count(tx, new, members.len()).await?;
        tracing::warn!(
            pipeline_id,
            transform_uid = uid,
            values = members.len(),
            lost_set = id,
            restored_set = new,
            "the set store had lost this set's values: restored from the set history"
        );
        Ok(Found::Set(new, at))
    }

    /// Redis mode: records in the database how many values set `id` holds after a write, so
    /// that a set Redis loses is known to have held values.
    pub(crate) async fn record_count(
        tx: &mut sqlx::Transaction<'_, D::Db>,
        id: i64,
        count: usize,
    ) -> Result<()> {
        sqlx::query("UPDATE filter_sets SET value_count = $2 WHERE id = $1")
            .bind(id)
            .bind(i64::try_from(count).unwrap_or(i64::MAX))
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}
