//! The stored sets behind the filter-value role: finding, locking, reading and recording
//! a set, in the store's tables or in Redis.

use sluice_filter::ValueSet;
use sqlx::Row as _;

use super::SCAN_PAGE;
use super::lost::Found;
use crate::dialect::StoreBackend;
use crate::filter_sets::{Loaded, Slot};
use crate::redis_sets::{LogState, RedisSets, SetRef};
use crate::set_history::{ChangeLists, ChangeStamp, SetChangeKind};
use crate::set_snapshots::SnapshotKey;
use crate::{Result, Store, StoreError};

impl<D: StoreBackend> Store<D> {
    /// Copies every set that holds values in the tables and is not in `redis` yet (it has
    /// no version there) to `redis`, in cursor order; answers how many. Run before the store
    /// serves with its values in Redis.
    pub(crate) async fn copy_sets_to(&self, redis: &RedisSets) -> Result<usize> {
        let rows = sqlx::query(
            "SELECT id, pipeline_id, transform_uid FROM filter_sets WHERE value_count > 0 \
             AND EXISTS (SELECT 1 FROM filter_values v WHERE v.set_id = filter_sets.id)",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut copied = 0;
        for row in &rows {
            let (id, pipeline_id, transform_uid): (i64, String, String) =
                (row.try_get("id")?, row.try_get("pipeline_id")?, row.try_get("transform_uid")?);
            // Under the pipeline's lock, as any writer of the set: another node copying or
            // writing it meanwhile waits, then finds it in Redis.
            let mut tx = D::begin_write(&self.pool).await?;
            if !Self::lock_set_filter(&mut tx, &pipeline_id, &transform_uid).await?
                || redis.version(id).await? > 0
            {
                continue;
            }
            let set = SetRef { pipeline_id: &pipeline_id, transform_uid: &transform_uid, id };
            let (mut members, mut at) = (ValueSet::new(), LogState::default());
            let mut after = 0_i64;
            loop {
                let rows = sqlx::query(
                    "SELECT seq, value FROM filter_values WHERE set_id = $1 AND seq > $2 \
                     ORDER BY seq LIMIT $3",
                )
                .bind(id)
                .bind(after)
                .bind(SCAN_PAGE)
                .fetch_all(&mut *tx)
                .await?;
                let Some(last) = rows.last() else { break };
                after = last.try_get("seq")?;
                let values: Vec<String> =
                    rows.iter().map(|row| row.try_get("value")).collect::<Result<_, _>>()?;
                (_, at) = redis.add(set, &mut members, at, &values).await?;
            }
            tx.commit().await?;
            copied += 1;
        }
        Ok(copied)
    }

    /// Redis mode: locks pipeline `id` in `tx` and answers the id of its set `uid` when
    /// `uid` is one of its set filters; `create` makes the set when missing (clearing
    /// whatever a rolled-back write may have left under the new id). A set Redis lost is
    /// restored first (`lost.rs`); one the history cannot restore is an error, unless
    /// `replacing`: a replace gives it its values, under a new id.
    pub(super) async fn redis_set_for_write(
        redis: &RedisSets,
        tx: &mut sqlx::Transaction<'_, D::Db>,
        id: &str,
        uid: &str,
        create: bool,
        replacing: bool,
    ) -> Result<Option<i64>> {
        if !Self::lock_set_filter(tx, id, uid).await? {
            return Ok(None);
        }
        if let Some((set, _)) = Self::set_row(tx, id, uid, false).await? {
            match Self::restore_if_lost(redis, tx, id, uid, set).await {
                Ok(Found::Set(set, _)) => return Ok(Some(set)),
                // Restored empty: dropped, made again below when the write adds.
                Ok(Found::None) => {}
                Err(StoreError::SetLost { .. }) if replacing => {
                    tracing::warn!(
                        pipeline_id = id,
                        transform_uid = uid,
                        "a replace gives a set the set store lost its values again"
                    );
                    Self::drop_set(tx, set).await?;
                }
                Err(error) => return Err(error),
            }
        }
        if !create {
            return Ok(None);
        }
        let (set, _) = Self::set_row(tx, id, uid, true).await?.ok_or(sqlx::Error::RowNotFound)?;
        redis.clear(set).await?;
        Ok(Some(set))
    }

    /// Redis mode: the values of set `set` now, from the slot's copy when it is of that set
    /// (brought up to date from the log), else read whole; the slot is left empty. Exact with
    /// the pipeline locked.
    pub(super) async fn redis_members(
        redis: &RedisSets,
        slot: &mut Slot,
        set: i64,
    ) -> Result<(ValueSet, LogState)> {
        let copy = slot.loaded.take().filter(|loaded| loaded.set_id == set);
        redis.current(set, copy.map(|loaded| (loaded.values, loaded.log))).await
    }

    /// Redis mode: adds (`add`) or removes `values` of pipeline `pipeline_id`'s set `uid`
    /// under the pipeline's lock; answers how many were new (or were there). An add of no
    /// values writes nothing; a removal from a set never written finds nothing to remove.
    pub(super) async fn redis_change(
        &self,
        redis: &RedisSets,
        pipeline_id: &str,
        transform_uid: &str,
        values: &[String],
        kind: SetChangeKind,
        stamp: &ChangeStamp,
    ) -> Result<u64> {
        let add = kind == SetChangeKind::Add;
        let mut slot = self.sets.lock(pipeline_id, transform_uid).await;
        let mut tx = D::begin_write(&self.pool).await?;
        if add && values.is_empty() {
            return Ok(0);
        }
        let Some(id) =
            Self::redis_set_for_write(redis, &mut tx, pipeline_id, transform_uid, add, false)
                .await?
        else {
            // A lost set restored empty was dropped: that stays.
            tx.commit().await?;
            return Ok(0);
        };
        let (mut members, at) = Self::redis_members(redis, &mut slot, id).await?;
        let set = SetRef { pipeline_id, transform_uid, id };
        // What the change does, each value once, before it is done to `members`.
        let mut seen = ValueSet::with_capacity(values.len());
        let touched: Vec<&str> = values
            .iter()
            .map(String::as_str)
            .filter(|value| members.contains(value) != add && seen.insert(value))
            .collect();
        let lists = if add { ChangeLists::added(&touched) } else { ChangeLists::removed(&touched) };
        let (changed, at) = if add {
            redis.add(set, &mut members, at, values).await?
        } else {
            redis.remove(set, &mut members, at, values).await?
        };
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
        self.keep_redis(pipeline_id, transform_uid, &mut slot, id, at, members);
        Ok(changed)
    }

    /// Table mode: locks pipeline `pipeline_id` in `tx` and answers its set `uid` as
    /// `(set id, version, values)` when `uid` is one of its set filters and the set exists;
    /// `create` makes the set when missing.
    pub(super) async fn table_members(
        &self,
        tx: &mut sqlx::Transaction<'_, D::Db>,
        slot: &mut Slot,
        pipeline_id: &str,
        transform_uid: &str,
        create: bool,
    ) -> Result<Option<(i64, i64, ValueSet)>> {
        if !Self::lock_set_filter(tx, pipeline_id, transform_uid).await? {
            return Ok(None);
        }
        let row = Self::set_row(tx, pipeline_id, transform_uid, create).await?;
        let row = if create { Some(row.ok_or(sqlx::Error::RowNotFound)?) } else { row };
        let Some((set, version)) = row else {
            return Ok(None);
        };
        let key = super::snapshot_key(pipeline_id, transform_uid, set, version);
        let members = self.current_values(tx, slot, key).await?;
        Ok(Some((set, version, members)))
    }

    /// Redis mode: puts `members`, set `set` as of `at`, back into `slot`.
    pub(super) fn keep_redis(
        &self,
        pipeline_id: &str,
        uid: &str,
        slot: &mut Slot,
        set: i64,
        at: LogState,
        members: ValueSet,
    ) {
        let loaded = Loaded { set_id: set, version: at.version, values: members, log: at };
        self.sets.keep(pipeline_id, uid, slot, loaded);
    }

    /// The id of pipeline `id`'s set `uid` (`None`: never written, or dropped).
    pub(super) async fn set_id(&self, id: &str, uid: &str) -> Result<Option<i64>> {
        let row =
            sqlx::query("SELECT id FROM filter_sets WHERE pipeline_id = $1 AND transform_uid = $2")
                .bind(id)
                .bind(uid)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|row| row.try_get("id")).transpose()?)
    }

    /// Locks pipeline `id` against other filter-value writers, updates and deletion
    /// until `tx` ends, and tells whether `uid` is one of its set filters. Writers that
    /// get false change nothing.
    ///
    /// This is what stands in for a foreign key on `filter_values`: values are only
    /// written for a set filter of a pipeline that exists while the row is locked.
    /// Serialising the writers of a pipeline also makes `seq` order commit order, which
    /// keeps the listing cursor from skipping a value committed late.
    pub(super) async fn lock_set_filter(
        tx: &mut sqlx::Transaction<'_, D::Db>,
        id: &str,
        uid: &str,
    ) -> Result<bool> {
        let Some(row) = sqlx::query(D::LOCK_PIPELINE).bind(id).fetch_optional(&mut **tx).await?
        else {
            return Ok(false);
        };
        let config: sluice_core::pipeline::PipelineConfig =
            serde_json::from_str(row.try_get("pipeline_config")?).map_err(|e| {
                StoreError::Corrupt {
                    what: "pipeline",
                    detail: format!("{id}: pipeline_config: {e}"),
                }
            })?;
        Ok(config.transforms.iter().any(|t| t.is_set_filter() && t.uid() == uid))
    }

    /// The stored `(id, version)` of the set of pipeline `id`'s transform `uid`;
    /// `create` makes it when missing, else `None` means the set was never written.
    /// Call with the pipeline locked.
    pub(crate) async fn set_row(
        tx: &mut sqlx::Transaction<'_, D::Db>,
        id: &str,
        uid: &str,
        create: bool,
    ) -> Result<Option<(i64, i64)>> {
        if create {
            sqlx::query(
                "INSERT INTO filter_sets (pipeline_id, transform_uid, value_count) \
                 VALUES ($1, $2, 0) ON CONFLICT (pipeline_id, transform_uid) DO NOTHING",
            )
            .bind(id)
            .bind(uid)
            .execute(&mut **tx)
            .await?;
        }
        let row = sqlx::query(
            "SELECT id, version FROM filter_sets WHERE pipeline_id = $1 AND transform_uid = $2",
        )
        .bind(id)
        .bind(uid)
        .fetch_optional(&mut **tx)
        .await?;
        Ok(row
            .map(|row| Ok::<_, sqlx::Error>((row.try_get("id")?, row.try_get("version")?)))
            .transpose()?)
    }

    /// The values of stored set `set_id` at `version`: the slot's when they are
    /// current, else read from the table (in seq order, a page at a time). The slot is
    /// left empty either way; the caller puts the values back after its commit. Call
    /// with the pipeline locked.
    pub(super) async fn current_values(
        &self,
        tx: &mut sqlx::Transaction<'_, D::Db>,
        slot: &mut Slot,
        key: SnapshotKey,
    ) -> Result<ValueSet> {
        if let Some(values) = slot.take_current(key.set_id, key.version) {
            return Ok(values);
        }
        if let Some(values) = self.sets.snapshots.load(&key).await {
            return Ok(values);
        }
        Self::read_set(tx, key.set_id).await
    }

    /// Every value of stored set `set_id`, read a page of [`SCAN_PAGE`] at a time.
    pub(super) async fn read_set(
        tx: &mut sqlx::Transaction<'_, D::Db>,
        set_id: i64,
    ) -> Result<ValueSet> {
        let count: i64 = sqlx::query("SELECT value_count FROM filter_sets WHERE id = $1")
            .bind(set_id)
            .fetch_one(&mut **tx)
            .await?
            .try_get("value_count")?;
        let mut values = ValueSet::with_capacity(usize::try_from(count).unwrap_or(0));
        // A page arrives as one row holding a JSON array: a row per value costs
        // several times more in the drivers than the set's own work.
        let sql = format!(
            "SELECT COUNT(*) AS n, MAX(seq) AS last, {} AS page FROM \
             (SELECT seq, value FROM filter_values WHERE set_id = $1 AND seq > $2 \
              ORDER BY seq LIMIT $3) AS p",
            D::JSON_AGG
        );
        for statement in D::INDEX_ORDER {
            sqlx::query(statement).execute(&mut **tx).await?;
        }
        let mut after = 0_i64;
        loop {
            let row = sqlx::query(&sql)
                .bind(set_id)
                .bind(after)
                .bind(SCAN_PAGE)
                .fetch_one(&mut **tx)
                .await?;
            let n: i64 = row.try_get("n")?;
            if n == 0 {
                break;
            }
            let page: Vec<String> =
                serde_json::from_str(row.try_get::<&str, _>("page")?).map_err(|e| {
                    StoreError::Corrupt {
                        what: "filter values",
                        detail: format!("set {set_id}: page after seq {after}: {e}"),
                    }
                })?;
            for value in &page {
                values.insert(value);
            }
            if n < SCAN_PAGE {
                break;
            }
            after = row.try_get("last")?;
        }
        tracing::debug!(set_id, values = values.len(), "filter set read");
        Ok(values)
    }

    /// Records a write of set `set_id` that changed its size by `change`, and
    /// returns the set's new version.
    pub(crate) async fn mark_written(
        tx: &mut sqlx::Transaction<'_, D::Db>,
        set_id: i64,
        change: i64,
    ) -> Result<i64> {
        Ok(sqlx::query(
            "UPDATE filter_sets SET value_count = value_count + $2, version = version + 1 \
             WHERE id = $1 RETURNING version",
        )
        .bind(set_id)
        .bind(change)
        .fetch_one(&mut **tx)
        .await?
        .try_get("version")?)
    }

    /// Deletes one set and its values.
    pub(crate) async fn drop_set(tx: &mut sqlx::Transaction<'_, D::Db>, set_id: i64) -> Result<()> {
        sqlx::query("DELETE FROM filter_values WHERE set_id = $1")
            .bind(set_id)
            .execute(&mut **tx)
            .await?;
        sqlx::query("DELETE FROM filter_sets WHERE id = $1")
            .bind(set_id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}
