//! Filter groups: the pipelines on one stream whose first transform is a set filter of one
//! path, evaluated together over each shared segment ([`super`] module docs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use sluice_bus::Record;
use sluice_filter::{Candidates, Prepared, SetFilter};

use crate::sets::{SetHandle, SetObserver};

/// A member whose set holds more values than this is looked up directly for each record
/// (a few records' lookups at a time, so their memory reads overlap) instead of being
/// listed in its group's candidates: listing would copy every hash, and a lookup in a large
/// candidate index costs what the set's own lookup does.
const LARGE_MEMBER: usize = 100_000;

/// Pipelines on one stream whose first transform is a set filter of one path.
pub(crate) struct FilterGroup {
    /// Unique in the process: names the group's evaluations in segments.
    pub(super) id: u64,
    filter: SetFilter,
    index: RwLock<GroupIndex>,
}

#[derive(Default)]
struct GroupIndex {
    candidates: Candidates,
    /// By member number; `None` once it left (numbers are never reused, so stale
    /// candidates of a member that left name no one).
    members: Vec<Option<Member>>,
}

struct Member {
    set: Arc<SetHandle>,
    /// Workers of this node that joined with this set.
    workers: usize,
    /// Listed in the candidates (else looked up directly: a large set, or one whose values
    /// are still being listed).
    listed: bool,
    /// Too large to list ([`LARGE_MEMBER`]): always looked up directly.
    large: bool,
}

/// What a group's evaluation of one segment found.
pub(super) struct Evaluation {
    /// Each record's prepared value.
    pub(super) prepared: Vec<Prepared>,
    /// The records (indexes into the segment) each evaluated member's set holds, in order.
    matches: HashMap<u32, Vec<u32>>,
}

impl Evaluation {
    pub(super) fn matches_of(&self, member: u32) -> Option<&[u32]> {
        self.matches.get(&member).map(Vec::as_slice)
    }
}

static NEXT_GROUP: AtomicU64 = AtomicU64::new(1);

impl FilterGroup {
    pub(super) fn new(filter: SetFilter) -> Self {
        Self { id: NEXT_GROUP.fetch_add(1, Ordering::Relaxed), filter, index: RwLock::default() }
    }

    fn read_index(&self) -> std::sync::RwLockReadGuard<'_, GroupIndex> {
        self.index.read().expect("filter group lock is never poisoned")
    }

    fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, GroupIndex> {
        self.index.write().expect("filter group lock is never poisoned")
    }

    /// Adds a worker of the set `set`; answers its member number.
    ///
    /// The set's observer is registered before its values are listed, so a value added
    /// meanwhile is listed by the observer; until the listing is done the member is
    /// looked up directly, so no record is missed in between.
    pub(super) fn join(self: &Arc<Self>, set: &Arc<SetHandle>) -> u32 {
        let member = {
            let mut index = self.write_index();
            let found = index.members.iter().position(|member| {
                member.as_ref().is_some_and(|member| Arc::ptr_eq(&member.set, set))
            });
            if let Some(found) = found {
                if let Some(member) = index.members[found].as_mut() {
                    member.workers += 1;
                }
                return u32::try_from(found).expect("fewer than 2^32 members");
            }
            index.members.push(Some(Member {
                set: set.clone(),
                workers: 1,
                listed: false,
                large: false,
            }));
            u32::try_from(index.members.len() - 1).expect("fewer than 2^32 members")
        };
        let observer: Arc<dyn SetObserver> = self.clone();
        set.observe(Arc::downgrade(&observer), member);
        let hashes: Option<Vec<u64>> =
            set.with(|values| (values.len() <= LARGE_MEMBER).then(|| values.hashes().collect()));
        let mut index = self.write_index();
        if let Some(hashes) = &hashes {
            for &hash in hashes {
                index.candidates.add(hash, member);
            }
        }
        if let Some(Some(joined)) = index.members.get_mut(member as usize) {
            joined.listed = hashes.is_some();
            joined.large = hashes.is_none();
        }
        member
    }

    /// A worker of member `member` leaves; the member goes with its last worker.
    fn leave(&self, member: u32) {
        let set = {
            let mut index = self.write_index();
            let Some(slot) = index.members.get_mut(member as usize) else { return };
            let Some(joined) = slot.as_mut() else { return };
            joined.workers -= 1;
            if joined.workers > 0 {
                return;
            }
            slot.take().map(|joined| joined.set)
        };
        if let Some(set) = set {
            set.unobserve(self.id);
        }
    }

    pub(super) fn set_of(&self, member: u32) -> Option<Arc<SetHandle>> {
        self.read_index().members.get(member as usize)?.as_ref().map(|member| member.set.clone())
    }

    /// Evaluates every member over `records`: one extraction and one candidates lookup per
    /// record, then one exact lookup per candidate in the member's own set (and a direct
    /// lookup per record for members not listed).
    pub(super) fn evaluate(&self, records: &[Record]) -> Evaluation {
        let values: Vec<&[u8]> = records.iter().map(|record| &record.value[..]).collect();
        let prepared = self.filter.prepare(&values);
        // Candidates are found under the group's lock and confirmed after it is released:
        // a set's writer holds the set's lock while it takes the group's (to list values it
        // adds), so the group's lock is never held while a set's is taken.
        let mut found: Vec<(u32, u32)> = Vec::new();
        let mut listed: Vec<(u32, Arc<SetHandle>)> = Vec::new();
        let mut direct: Vec<(u32, Arc<SetHandle>)> = Vec::new();
        {
            let index = self.read_index();
            for (record, value) in prepared.iter().enumerate() {
                let Some(hash) = value.hash() else { continue };
                for &member in index.candidates.get(hash) {
                    found.push((member, record as u32));
                }
            }
            for (number, member) in index.members.iter().enumerate() {
                let (Some(member), Ok(number)) = (member, u32::try_from(number)) else {
                    continue;
                };
                let to = if member.listed { &mut listed } else { &mut direct };
                to.push((number, member.set.clone()));
            }
        }
        let mut matches: HashMap<u32, Vec<u32>> = HashMap::new();
        for (member, _) in listed.iter().chain(&direct) {
            matches.insert(*member, Vec::new());
        }
        // By member, then record: each member's set is locked once.
        found.sort_unstable();
        for run in found.chunk_by(|a, b| a.0 == b.0) {
            let member = run[0].0;
            let Some((_, set)) = listed.iter().find(|(number, _)| *number == member) else {
                continue;
            };
            let kept = matches.entry(member).or_default();
            set.with(|values| {
                kept.extend(
                    run.iter()
                        .map(|(_, record)| *record)
                        .filter(|&record| values.contains_prepared(&prepared[record as usize])),
                );
            });
        }
        let mut found = Vec::with_capacity(prepared.len());
        for (member, set) in &direct {
            found.clear();
            set.with(|values| values.contains_prepared_batch(&prepared, &mut found));
            let kept = matches.entry(*member).or_default();
            kept.extend(
                found
                    .iter()
                    .enumerate()
                    .filter(|(_, held)| **held)
                    .map(|(record, _)| record as u32),
            );
        }
        Evaluation { prepared, matches }
    }
}

impl SetObserver for FilterGroup {
    fn id(&self) -> u64 {
        self.id
    }

    fn adding(&self, member: u32, hashes: &mut dyn Iterator<Item = u64>) {
        let mut index = self.write_index();
        // A large member is looked up directly, never listed.
        let listable = index
            .members
            .get(member as usize)
            .and_then(Option::as_ref)
            .is_some_and(|member| !member.large);
        if listable {
            for hash in hashes {
                index.candidates.add(hash, member);
            }
        }
    }
}

/// A worker's place in a filter group; leaves it when dropped.
pub(crate) struct Membership {
    pub(super) group: Arc<FilterGroup>,
    pub(super) member: u32,
}

impl Membership {
    /// Whether this membership is of `filter`'s path with the set `set`.
    pub(crate) fn is_for(&self, filter: &SetFilter, set: &Arc<SetHandle>) -> bool {
        self.group.filter.path() == filter.path()
            && self.group.set_of(self.member).is_some_and(|own| Arc::ptr_eq(&own, set))
    }

    /// Which of `records` pass by this member's own set, as indexes into `records`.
    pub(super) fn test(&self, records: &[Record]) -> Vec<usize> {
        let Some(set) = self.group.set_of(self.member) else { return Vec::new() };
        let mut passed = Vec::with_capacity(records.len());
        let values: Vec<&[u8]> = records.iter().map(|record| &record.value[..]).collect();
        set.with(|values_set| self.group.filter.passes_batch(&values, values_set, &mut passed));
        passed.iter().enumerate().filter(|(_, pass)| **pass).map(|(index, _)| index).collect()
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.group.leave(self.member);
    }
}
