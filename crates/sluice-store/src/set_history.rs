//! The set-history role ([`SetHistoryStore`]): every change of a set filter's values, kept
//! as the values it actually added and removed, and membership at a past time or block
//! answered by undoing the changes made since (docs/set-filter.md, "Set history").
//!
//! A change is written by the filter-value writer in the transaction of the change itself
//! ([`Store::record_set_change`]), so the history never disagrees with the set. Answering
//! "was X in the set at T" walks backwards from the set as it is now: the first change after
//! T that added X means X was not there at T, the first that removed X means it was, and no
//! such change means the answer is today's. So pruning old changes costs nothing but the
//! reach: a set's *horizon* (table `filter_set_history_horizons`) says the point before which
//! changes are missing, and a question about a point before it is refused.
//!
//! The value lists are encoded compactly, in parts (`set_history/lists.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sluice_filter::ValueSet;
use sqlx::Row as _;

mod lists;

pub(crate) use lists::ChangeLists;
use lists::{decode_values, encode_values, holds};

use crate::dialect::StoreBackend;
use crate::{FilterValueStore, Result, Store, StoreError};

/// What a change did to a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetChangeKind {
    /// `POST …/filter-values` (and a pipeline's inline `set_values` at create).
    Add,
    /// `DELETE …/filter-values`.
    Remove,
    /// `PUT …/filter-values`.
    Replace,
}

impl SetChangeKind {
    /// The name stored and shown: `add`, `remove`, `replace`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Remove => "remove",
            Self::Replace => "replace",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [Self::Add, Self::Remove, Self::Replace].into_iter().find(|kind| kind.as_str() == text)
    }
}

/// When a change took effect: its time and the source stream's head then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeStamp {
    pub at: DateTime<Utc>,
    /// The highest block (slot) ingested into the pipeline's source stream when the change
    /// was made; `None` when the process making it does not know (no ingester of that chain).
    pub position: Option<i64>,
}

impl ChangeStamp {
    /// Now, at an unknown position: what the store's own writers without a clock use.
    #[must_use]
    pub fn now() -> Self {
        Self { at: Utc::now(), position: None }
    }
}

/// The values one change added and removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangedValues {
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

/// One recorded change of a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetChange {
    /// Grows with every change of any set; the paging cursor.
    pub id: i64,
    pub changed_at: DateTime<Utc>,
    pub kind: SetChangeKind,
    /// Values in the request (repeats included).
    pub given: u64,
    /// Values that were not in the set before.
    pub added: u64,
    /// Values that were in the set and are not after.
    pub removed: u64,
    /// Values in the set after the change.
    pub count_after: u64,
    /// See [`ChangeStamp::position`].
    pub position: Option<i64>,
    /// The values themselves, when asked for.
    pub values: Option<ChangedValues>,
}

/// One page of a set's changes, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetChangePage {
    pub changes: Vec<SetChange>,
    /// Pass as `before` for the next (older) page; `None` when no change is older.
    pub next: Option<i64>,
}

/// A point in a set's past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryPoint {
    /// The set as it was at this instant: changes made after it are undone.
    Time(DateTime<Utc>),
    /// The set that applied to this block of the source stream: changes made when the
    /// stream's head was at this block or later are undone.
    Block(i64),
}

/// Whether a value was in a set at a past point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PastMembership {
    Known(bool),
    /// The history does not reach the point: changes before `reach` are not recorded.
    BeyondHistory(Reach),
}

/// The earliest point a set's history answers for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Times from this one on.
    Time(DateTime<Utc>),
    /// Blocks from this one on.
    Block(i64),
    /// No block: the changes before the horizon have no known position, and no recorded
    /// change has one either.
    NoBlock,
}

/// Readings of a set and its changes before one is answered although a change came between.
const CONSISTENT_READ_TRIES: u32 = 8;

/// Parts of value lists read per query while replaying (each at most about
/// 2 × [`lists::PART_BYTES`]).
const REPLAY_PAGE: i64 = 64;

/// [`REPLAY_PAGE`] parts of the value lists of a set's changes (`$1`, `$2`: pipeline and
/// uid), from part `$4` of change `$3` on, in change then part order.
const PARTS_FROM: &str = "SELECT v.change_id, v.part, v.added_values, v.removed_values \
     FROM filter_set_change_values v JOIN filter_set_changes c ON c.id = v.change_id \
     WHERE c.pipeline_id = $1 AND c.transform_uid = $2 \
     AND (v.change_id > $3 OR (v.change_id = $3 AND v.part >= $4)) \
     ORDER BY v.change_id, v.part LIMIT $5";

/// The history of set filters' values. Every method is one transaction, except
/// [`SetHistoryStore::was_filter_value`], which reads the set and its history consistently.
#[async_trait]
pub trait SetHistoryStore: Send + Sync + 'static {
    /// Up to `limit` (at least 1) changes of one transform's set older than change `before`
    /// (`None`: from the newest), newest first, with their values when `with_values`.
    ///
    /// # Errors
    /// A database failure, or a stored row this code cannot read.
    async fn set_changes(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        before: Option<i64>,
        limit: u32,
        with_values: bool,
    ) -> Result<SetChangePage>;

    /// Whether `value` (normalised by the caller) was in one transform's set at `at`.
    ///
    /// # Errors
    /// A database failure, or a stored row this code cannot read.
    async fn was_filter_value(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        value: &str,
        at: HistoryPoint,
    ) -> Result<PastMembership>;

    /// Deletes the changes made before `before`, moving each set's horizon past them;
    /// answers how many were deleted.
    ///
    /// # Errors
    /// A database failure; nothing is deleted then.
    async fn prune_set_history(&self, before: DateTime<Utc>) -> Result<u64>;
}

/// The horizon of one set: the latest time and position of the changes not recorded (`None`
/// fields: no horizon, or no known position).
#[derive(Debug, Default)]
struct Horizon {
    /// Whether any horizon row applies.
    exists: bool,
    time_ms: Option<i64>,
    /// Some row's changes have no known position.
    unknown_position: bool,
    position: Option<i64>,
}

#[async_trait]
impl<D: StoreBackend> SetHistoryStore for Store<D> {
    async fn set_changes(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        before: Option<i64>,
        limit: u32,
        with_values: bool,
    ) -> Result<SetChangePage> {
        let limit = limit.max(1);
        let rows = sqlx::query(
            "SELECT id, changed_ms, kind, given, added, removed, count_after, position \
             FROM filter_set_changes WHERE pipeline_id = $1 AND transform_uid = $2 AND id < $3 \
             ORDER BY id DESC LIMIT $4",
        )
        .bind(pipeline_id)
        .bind(transform_uid)
        .bind(before.unwrap_or(i64::MAX))
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.pool)
        .await?;
        let more = rows.len() > limit as usize;
        let mut changes = Vec::with_capacity(rows.len().min(limit as usize));
        for row in rows.iter().take(limit as usize) {
            let values = if with_values {
                Some(self.change_values(row.try_get("id")?).await?)
            } else {
                None
            };
            let kind: String = row.try_get("kind")?;
            changes.push(SetChange {
                id: row.try_get("id")?,
                changed_at: time_of(row.try_get("changed_ms")?)?,
                kind: SetChangeKind::parse(&kind).ok_or_else(|| corrupt(format!("kind {kind}")))?,
                given: count(row.try_get("given")?),
                added: count(row.try_get("added")?),
                removed: count(row.try_get("removed")?),
                count_after: count(row.try_get("count_after")?),
                position: row.try_get("position")?,
                values,
            });
        }
        let next = if more { changes.last().map(|change| change.id) } else { None };
        Ok(SetChangePage { changes, next })
    }

    async fn was_filter_value(
        &self,
        pipeline_id: &str,
        transform_uid: &str,
        value: &str,
        at: HistoryPoint,
    ) -> Result<PastMembership> {
        // The set now and the changes since must be of one moment: read the changes, then
        // the set, and start again if a change was made in between. Writers of one set are
        // rare; under a storm of them the last reading is answered after a few tries.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let horizon = self.horizon(pipeline_id, transform_uid).await?;
            let marks = self.change_marks(pipeline_id, transform_uid).await?;
            if let Some(reach) = beyond(&horizon, &marks, at) {
                return Ok(PastMembership::BeyondHistory(reach));
            }
            let first = first_undone(&horizon, &marks, at);
            let now = self.has_filter_value(pipeline_id, transform_uid, value).await?;
            let last = marks.last().map(|mark| mark.id);
            if attempt < CONSISTENT_READ_TRIES
                && self.last_change_id(pipeline_id, transform_uid).await? != last
            {
                continue;
            }
            let Some(first) = first else {
                return Ok(PastMembership::Known(now));
            };
            let answer = self.first_touch(pipeline_id, transform_uid, value, first).await?;
            return Ok(PastMembership::Known(answer.unwrap_or(now)));
        }
    }

    async fn prune_set_history(&self, before: DateTime<Utc>) -> Result<u64> {
        let cutoff = before.timestamp_millis();
        let mut tx = D::begin_write(&self.pool).await?;
        let pruned = sqlx::query(
            "SELECT pipeline_id, transform_uid, MAX(changed_ms) AS reaches_ms, \
             MAX(position) AS reaches_position, COUNT(position) AS positioned, COUNT(*) AS n \
             FROM filter_set_changes WHERE changed_ms < $1 GROUP BY pipeline_id, transform_uid",
        )
        .bind(cutoff)
        .fetch_all(&mut *tx)
        .await?;
        let mut deleted = 0;
        for row in &pruned {
            let pipeline_id: String = row.try_get("pipeline_id")?;
            let uid: String = row.try_get("transform_uid")?;
            let reaches_ms: i64 = row.try_get("reaches_ms")?;
            let position: Option<i64> = row.try_get("reaches_position")?;
            let old = sqlx::query(
                "SELECT reaches_ms, reaches_position FROM filter_set_history_horizons \
                 WHERE pipeline_id = $1 AND transform_uid = $2",
            )
            .bind(&pipeline_id)
            .bind(&uid)
            .fetch_optional(&mut *tx)
            .await?;
            let (mut ms, mut pos) = (reaches_ms, position);
            if let Some(old) = old {
                ms = ms.max(old.try_get("reaches_ms")?);
                pos = pos.max(old.try_get("reaches_position")?);
            }
            Self::set_horizon(&mut tx, &pipeline_id, &uid, ms, pos).await?;
            deleted += count(row.try_get("n")?);
        }
        sqlx::query("DELETE FROM filter_set_changes WHERE changed_ms < $1")
            .bind(cutoff)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(deleted)
    }
}

/// The id, time and position of one recorded change.
#[derive(Debug, Clone, Copy)]
struct Mark {
    id: i64,
    changed_ms: i64,
    position: Option<i64>,
}

/// The earliest point the history answers for, when `at` is before it.
fn beyond(horizon: &Horizon, marks: &[Mark], at: HistoryPoint) -> Option<Reach> {
    if !horizon.exists {
        return None;
    }
    match at {
        HistoryPoint::Time(time) => {
            let floor = horizon.time_ms?;
            (time.timestamp_millis() < floor)
                .then(|| DateTime::from_timestamp_millis(floor).map_or(Reach::NoBlock, Reach::Time))
        }
        HistoryPoint::Block(block) => {
            // Changes with no known position before the horizon happened before every
            // recorded change, so before the first recorded position.
            let mut floor = horizon.position;
            if horizon.unknown_position {
                match marks.iter().find_map(|mark| mark.position) {
                    Some(first) => floor = floor.max(Some(first)),
                    None => return Some(Reach::NoBlock),
                }
            }
            let floor = floor?;
            (block <= floor).then_some(Reach::Block(floor.saturating_add(1)))
        }
    }
}

/// The first recorded change made after `at` (`None`: none; the set now is the answer).
///
/// A change without a position is taken to have been made at the position of the change
/// before it (or of the horizon): positions only grow, so it was made at that block or later.
fn first_undone(horizon: &Horizon, marks: &[Mark], at: HistoryPoint) -> Option<i64> {
    match at {
        HistoryPoint::Time(time) => {
            let ms = time.timestamp_millis();
            marks.iter().find(|mark| mark.changed_ms > ms).map(|mark| mark.id)
        }
        HistoryPoint::Block(block) => {
            let mut effective = horizon.position;
            marks
                .iter()
                .find(|mark| {
                    effective = mark.position.or(effective);
                    effective.is_some_and(|position| position >= block)
                })
                .map(|mark| mark.id)
        }
    }
}

impl<D: StoreBackend> Store<D> {
    /// Records one change of the set of `pipeline_id`'s `uid` in `tx`, the change's own
    /// transaction, with the values it actually added and removed (`lists`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn record_set_change(
        tx: &mut sqlx::Transaction<'_, D::Db>,
        pipeline_id: &str,
        uid: &str,
        stamp: &ChangeStamp,
        kind: SetChangeKind,
        given: usize,
        lists: ChangeLists,
        count_after: usize,
    ) -> Result<()> {
        let (added, removed) = lists.counts();
        let row = sqlx::query(
            "INSERT INTO filter_set_changes (pipeline_id, transform_uid, changed_ms, kind, given, \
             added, removed, count_after, position) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
        )
        .bind(pipeline_id)
        .bind(uid)
        .bind(stamp.at.timestamp_millis())
        .bind(kind.as_str())
        .bind(given as i64)
        .bind(added as i64)
        .bind(removed as i64)
        .bind(count_after as i64)
        .bind(stamp.position)
        .fetch_one(&mut **tx)
        .await?;
        let id: i64 = row.try_get("id")?;
        let (added, removed) = lists.into_parts();
        let parts = added.len().max(removed.len());
        let (mut added, mut removed) = (added.into_iter(), removed.into_iter());
        for part in 0..parts {
            sqlx::query(
                "INSERT INTO filter_set_change_values (change_id, part, added_values, \
                 removed_values) VALUES ($1, $2, $3, $4)",
            )
            .bind(id)
            .bind(part as i64)
            .bind(added.next().unwrap_or_default())
            .bind(removed.next().unwrap_or_default())
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    /// The set of `pipeline_id`'s `uid` as its recorded changes leave it, rebuilt from the
    /// last change made to an empty set (its count before it was 0) on; with the count the
    /// last change recorded. `None` when no recorded change was made to an empty set: the
    /// changes that made the values before are pruned (or never were recorded), so the
    /// history cannot rebuild the set. Call in the transaction that holds the pipeline lock.
    pub(crate) async fn replay_history(
        tx: &mut sqlx::Transaction<'_, D::Db>,
        pipeline_id: &str,
        uid: &str,
    ) -> Result<Option<(ValueSet, u64)>> {
        let rows = sqlx::query(
            "SELECT id, added, removed, count_after FROM filter_set_changes \
             WHERE pipeline_id = $1 AND transform_uid = $2 ORDER BY id",
        )
        .bind(pipeline_id)
        .bind(uid)
        .fetch_all(&mut **tx)
        .await?;
        let mut start = None;
        let mut last_count = 0;
        for row in &rows {
            let (id, added, removed, after): (i64, i64, i64, i64) = (
                row.try_get("id")?,
                row.try_get("added")?,
                row.try_get("removed")?,
                row.try_get("count_after")?,
            );
            if after - added + removed == 0 {
                start = Some(id);
            }
            last_count = count(after);
        }
        let Some(start) = start else { return Ok(None) };
        let mut values = ValueSet::with_capacity(usize::try_from(last_count).unwrap_or(0));
        let (mut change, mut part) = (start, 0_i64);
        loop {
            let rows = sqlx::query(PARTS_FROM)
                .bind(pipeline_id)
                .bind(uid)
                .bind(change)
                .bind(part)
                .bind(REPLAY_PAGE)
                .fetch_all(&mut **tx)
                .await?;
            // A change never both adds and removes one value, so within a change the order
            // of its parts does not matter; across changes it is the changes' order.
            for row in &rows {
                for value in decode_values(&row.try_get::<Vec<u8>, _>("added_values")?)? {
                    values.insert(&value);
                }
                for value in decode_values(&row.try_get::<Vec<u8>, _>("removed_values")?)? {
                    values.remove(&value);
                }
            }
            match rows.last() {
                Some(last) if rows.len() as i64 == REPLAY_PAGE => {
                    change = last.try_get("change_id")?;
                    part = last.try_get::<i64, _>("part")? + 1;
                }
                _ => return Ok(Some((values, last_count))),
            }
        }
    }

    /// The values change `id` added and removed.
    async fn change_values(&self, id: i64) -> Result<ChangedValues> {
        let rows = sqlx::query(
            "SELECT added_values, removed_values FROM filter_set_change_values \
             WHERE change_id = $1 ORDER BY part",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        let mut values = ChangedValues::default();
        for row in &rows {
            values.added.extend(decode_values(&row.try_get::<Vec<u8>, _>("added_values")?)?);
            values.removed.extend(decode_values(&row.try_get::<Vec<u8>, _>("removed_values")?)?);
        }
        Ok(values)
    }

    /// Forgets the history of a set whose transform left its pipeline: a transform brought
    /// back under the same uid starts from an empty set, and its history from `at` (the
    /// pipeline update that removed it).
    pub(crate) async fn forget_set_history(
        tx: &mut sqlx::Transaction<'_, D::Db>,
        pipeline_id: &str,
        uid: &str,
        at: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query("DELETE FROM filter_set_changes WHERE pipeline_id = $1 AND transform_uid = $2")
            .bind(pipeline_id)
            .bind(uid)
            .execute(&mut **tx)
            .await?;
        Self::set_horizon(tx, pipeline_id, uid, at.timestamp_millis(), None).await
    }

    async fn set_horizon(
        tx: &mut sqlx::Transaction<'_, D::Db>,
        pipeline_id: &str,
        uid: &str,
        reaches_ms: i64,
        reaches_position: Option<i64>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO filter_set_history_horizons (pipeline_id, transform_uid, reaches_ms, \
             reaches_position) VALUES ($1, $2, $3, $4) ON CONFLICT (pipeline_id, transform_uid) \
             DO UPDATE SET reaches_ms = excluded.reaches_ms, \
             reaches_position = excluded.reaches_position",
        )
        .bind(pipeline_id)
        .bind(uid)
        .bind(reaches_ms)
        .bind(reaches_position)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// The horizon of a set: its own row and its pipeline's (empty uid), combined.
    async fn horizon(&self, pipeline_id: &str, uid: &str) -> Result<Horizon> {
        let rows = sqlx::query(
            "SELECT reaches_ms, reaches_position FROM filter_set_history_horizons \
             WHERE pipeline_id = $1 AND (transform_uid = $2 OR transform_uid = '')",
        )
        .bind(pipeline_id)
        .bind(uid)
        .fetch_all(&self.pool)
        .await?;
        let mut horizon = Horizon::default();
        for row in &rows {
            horizon.exists = true;
            horizon.time_ms = horizon.time_ms.max(Some(row.try_get("reaches_ms")?));
            let position: Option<i64> = row.try_get("reaches_position")?;
            horizon.unknown_position |= position.is_none();
            horizon.position = horizon.position.max(position);
        }
        Ok(horizon)
    }

    /// Every recorded change of a set, oldest first, without its values.
    async fn change_marks(&self, pipeline_id: &str, uid: &str) -> Result<Vec<Mark>> {
        let rows = sqlx::query(
            "SELECT id, changed_ms, position FROM filter_set_changes \
             WHERE pipeline_id = $1 AND transform_uid = $2 ORDER BY id",
        )
        .bind(pipeline_id)
        .bind(uid)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Mark {
                    id: row.try_get("id")?,
                    changed_ms: row.try_get("changed_ms")?,
                    position: row.try_get("position")?,
                })
            })
            .collect()
    }

    async fn last_change_id(&self, pipeline_id: &str, uid: &str) -> Result<Option<i64>> {
        let row = sqlx::query(
            "SELECT MAX(id) AS last FROM filter_set_changes \
             WHERE pipeline_id = $1 AND transform_uid = $2",
        )
        .bind(pipeline_id)
        .bind(uid)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get("last")?)
    }

    /// Whether `value` was in the set just before change `first`, from the first change
    /// from `first` on that added (then it was not) or removed it (then it was); `None` when
    /// no change since touched it.
    async fn first_touch(
        &self,
        pipeline_id: &str,
        uid: &str,
        value: &str,
        first: i64,
    ) -> Result<Option<bool>> {
        let needle = encode_values(&[value]);
        let (mut change, mut part) = (first, 0);
        loop {
            // A value is never both added and removed by one change, so the first part that
            // holds it, in change order, decides.
            let rows = sqlx::query(PARTS_FROM)
                .bind(pipeline_id)
                .bind(uid)
                .bind(change)
                .bind(part)
                .bind(REPLAY_PAGE)
                .fetch_all(&self.pool)
                .await?;
            for row in &rows {
                let added: Vec<u8> = row.try_get("added_values")?;
                if holds(&added, &needle)? {
                    return Ok(Some(false));
                }
                let removed: Vec<u8> = row.try_get("removed_values")?;
                if holds(&removed, &needle)? {
                    return Ok(Some(true));
                }
            }
            match rows.last() {
                Some(last) if rows.len() as i64 == REPLAY_PAGE => {
                    change = last.try_get("change_id")?;
                    part = last.try_get::<i64, _>("part")? + 1;
                }
                _ => return Ok(None),
            }
        }
    }
}

fn count(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

pub(crate) fn corrupt(detail: String) -> StoreError {
    StoreError::Corrupt { what: "filter set history", detail }
}

fn time_of(ms: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| corrupt(format!("time {ms} ms")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(id: i64, changed_ms: i64, position: Option<i64>) -> Mark {
        Mark { id, changed_ms, position }
    }

    #[test]
    fn changes_without_a_position_take_the_one_before() {
        let horizon = Horizon::default();
        let marks = [mark(1, 10, None), mark(2, 20, Some(100)), mark(3, 30, None)];
        let at = |block| first_undone(&horizon, &marks, HistoryPoint::Block(block));
        assert_eq!(at(50), Some(2));
        assert_eq!(at(100), Some(2));
        assert_eq!(at(101), None, "change 3 counts as made at block 100");
        let at = |ms| first_undone(&horizon, &marks, HistoryPoint::Time(time_of(ms).unwrap()));
        assert_eq!(at(10), Some(2));
        assert_eq!(at(9), Some(1));
        assert_eq!(at(30), None);
    }

    #[test]
    fn points_before_the_horizon_are_beyond_the_history() {
        let unknown =
            Horizon { exists: true, time_ms: Some(1_000), unknown_position: true, position: None };
        let time = |ms| HistoryPoint::Time(time_of(ms).unwrap());
        assert_eq!(beyond(&unknown, &[], time(999)), Some(Reach::Time(time_of(1_000).unwrap())));
        assert_eq!(beyond(&unknown, &[], time(1_000)), None);
        assert_eq!(beyond(&unknown, &[], HistoryPoint::Block(5)), Some(Reach::NoBlock));
        let marks = [mark(1, 2_000, None), mark(2, 3_000, Some(40))];
        assert_eq!(beyond(&unknown, &marks, HistoryPoint::Block(40)), Some(Reach::Block(41)));
        assert_eq!(beyond(&unknown, &marks, HistoryPoint::Block(41)), None);
        assert_eq!(beyond(&Horizon::default(), &[], HistoryPoint::Block(0)), None);
    }
}
