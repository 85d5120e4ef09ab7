//! The hash table of a [`ValueSet`](super::ValueSet): arena offsets in cache-line groups.
//!
//! A group is 64 bytes, aligned: one tag byte per slot (0 = empty, otherwise a byte of the
//! hash), an overflow count, and the slots' arena offsets. A value lives in its home group
//! (chosen by the hash) or, when that is full, in one of the groups after it; every group
//! it passed counts it in its overflow count. A lookup reads the home group, compares tags,
//! and goes on to the next group only while the overflow count says something was pushed
//! past (the F14 scheme). With at most 10 values per 12-slot group, a lookup almost always
//! reads one cache line, and that line can be read ahead ([`Table::touch`]), which is what
//! lets a batch of lookups wait for their cache misses together.
//!
//! Removal empties the slot and takes the value out of the overflow counts it added to, so
//! there are no tombstones. Counts that ever reach their maximum stay there (lookups then
//! just read one group further).

/// One cache line of slots.
pub(super) trait Group: Copy {
    /// Slots per group.
    const SLOTS: usize;
    /// Values per group before the table grows: 5/6 of the slots.
    const MAX_LOAD: usize = Self::SLOTS * 5 / 6;
    const EMPTY: Self;

    fn tags(&self) -> &[u8];
    fn tags_mut(&mut self) -> &mut [u8];
    fn offset(&self, slot: usize) -> usize;
    fn set_offset(&mut self, slot: usize, offset: usize);
    fn overflowed(&self) -> bool;
    fn add_overflow(&mut self);
    fn remove_overflow(&mut self);
}

/// Twelve 4-byte offsets, for arenas up to 4 GiB.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct NarrowGroup {
    tags: [u8; 12],
    overflow: u32,
    offsets: [u32; 12],
}

/// Seven 8-byte offsets, for arenas past 4 GiB.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct WideGroup {
    tags: [u8; 7],
    overflow: u8,
    offsets: [u64; 7],
}

const _: () = assert!(size_of::<NarrowGroup>() == 64 && size_of::<WideGroup>() == 64);

/// The [`Group`] methods both layouts share: the tags, the offsets (each came from a
/// `usize`, so reads back losslessly) and the overflow count, whose type is `$overflow`. A
/// saturated count stays: the group can no longer tell when nothing overflowed it.
macro_rules! shared_group_methods {
    ($overflow:ty) => {
        #[inline]
        fn tags(&self) -> &[u8] {
            &self.tags
        }

        fn tags_mut(&mut self) -> &mut [u8] {
            &mut self.tags
        }

        #[inline]
        fn offset(&self, slot: usize) -> usize {
            self.offsets[slot] as usize
        }

        #[inline]
        fn overflowed(&self) -> bool {
            self.overflow != 0
        }

        fn add_overflow(&mut self) {
            self.overflow = self.overflow.saturating_add(1);
        }

        fn remove_overflow(&mut self) {
            if self.overflow != <$overflow>::MAX {
                self.overflow -= 1;
            }
        }
    };
}

impl Group for NarrowGroup {
    const SLOTS: usize = 12;
    const EMPTY: Self = Self { tags: [0; 12], overflow: 0, offsets: [0; 12] };

    shared_group_methods!(u32);

    fn set_offset(&mut self, slot: usize, offset: usize) {
        self.offsets[slot] =
            u32::try_from(offset).expect("the set widens before an offset outgrows u32");
    }
}

impl Group for WideGroup {
    const SLOTS: usize = 7;
    const EMPTY: Self = Self { tags: [0; 7], overflow: 0, offsets: [0; 7] };

    shared_group_methods!(u8);

    fn set_offset(&mut self, slot: usize, offset: usize) {
        self.offsets[slot] = offset as u64;
    }
}

/// Where a value sits: group and slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Position {
    group: usize,
    slot: usize,
}

/// Arena offsets keyed by the hash of the entry they point at. The table never sees the
/// entries: callers pass `eq` to compare and `rehash` to hash the entry at an offset.
#[derive(Clone)]
pub(super) struct Table<G> {
    groups: Vec<G>,
    len: usize,
}

impl<G: Group> Table<G> {
    /// A table that holds `values` values without growing.
    pub(super) fn with_capacity(values: usize) -> Self {
        Self { groups: vec![G::EMPTY; Self::groups_for(values)], len: 0 }
    }

    fn groups_for(values: usize) -> usize {
        values.div_ceil(G::MAX_LOAD).max(1)
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn allocation_size(&self) -> usize {
        self.groups.capacity() * size_of::<G>()
    }

    /// The group `hash` starts at: the high bits of the hash scaled to the group count (so
    /// any group count works, not just powers of two).
    #[inline]
    fn home(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.groups.len() as u128) >> 64) as usize
    }

    #[inline]
    fn next(&self, group: usize) -> usize {
        if group + 1 == self.groups.len() { 0 } else { group + 1 }
    }

    /// The tag: the low byte of the hash (the high bits choose the group), never 0.
    #[inline]
    fn tag(hash: u64) -> u8 {
        (hash as u8).max(1)
    }

    /// Reads the home group of `hash`, so that a lookup soon after finds it in cache.
    #[inline]
    pub(super) fn touch(&self, hash: u64) -> u8 {
        self.groups[self.home(hash)].tags()[0]
    }

    /// The offsets in the home group of `hash` whose tags match it: where a lookup will
    /// compare entries (unless the value was pushed past its home group).
    pub(super) fn candidates(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let slots = &self.groups[self.home(hash)];
        let mut matches = tag_matches(slots.tags(), Self::tag(hash));
        std::iter::from_fn(move || {
            let slot = (matches != 0).then(|| matches.trailing_zeros() as usize)?;
            matches &= matches - 1;
            Some(slots.offset(slot))
        })
    }

    /// The position of the entry with `hash` for which `eq(offset)` holds.
    #[inline]
    pub(super) fn find(&self, hash: u64, mut eq: impl FnMut(usize) -> bool) -> Option<Position> {
        let tag = Self::tag(hash);
        let mut group = self.home(hash);
        loop {
            let slots = &self.groups[group];
            let mut matches = tag_matches(slots.tags(), tag);
            while matches != 0 {
                let slot = matches.trailing_zeros() as usize;
                if eq(slots.offset(slot)) {
                    return Some(Position { group, slot });
                }
                matches &= matches - 1;
            }
            if !slots.overflowed() {
                return None;
            }
            group = self.next(group);
        }
    }

    pub(super) fn offset_at(&self, position: Position) -> usize {
        self.groups[position.group].offset(position.slot)
    }

    /// Adds `offset` (an entry not in the table) under `hash`, growing first if the table is
    /// at its load limit.
    pub(super) fn insert(&mut self, hash: u64, offset: usize, rehash: impl Fn(usize) -> u64) {
        if self.len + 1 > self.groups.len() * G::MAX_LOAD {
            let groups = (self.groups.len() * 2).max(Self::groups_for(self.len + 1));
            self.rebuild(groups, &rehash);
        }
        self.place(hash, offset);
        self.len += 1;
    }

    /// Puts `offset` in the first free slot from the home group on; there is one, as the
    /// load limit keeps a sixth of the slots free.
    fn place(&mut self, hash: u64, offset: usize) {
        let tag = Self::tag(hash);
        let mut group = self.home(hash);
        loop {
            let slots = &mut self.groups[group];
            if let Some(slot) = slots.tags().iter().position(|&tag| tag == 0) {
                slots.tags_mut()[slot] = tag;
                slots.set_offset(slot, offset);
                return;
            }
            slots.add_overflow();
            group = self.next(group);
        }
    }

    /// Removes the entry at `position`, found by [`find`](Self::find) with `hash`.
    pub(super) fn remove(&mut self, hash: u64, position: Position) {
        self.groups[position.group].tags_mut()[position.slot] = 0;
        let mut group = self.home(hash);
        while group != position.group {
            self.groups[group].remove_overflow();
            group = self.next(group);
        }
        self.len -= 1;
    }

    /// Empties the table, keeping its memory.
    pub(super) fn clear(&mut self) {
        self.groups.fill(G::EMPTY);
        self.len = 0;
    }

    /// Every stored offset, to be rewritten in place (hashes do not depend on offsets).
    pub(super) fn for_each_offset_mut(&mut self, mut rewrite: impl FnMut(usize) -> usize) {
        for slots in &mut self.groups {
            for slot in 0..G::SLOTS {
                if slots.tags()[slot] != 0 {
                    let offset = rewrite(slots.offset(slot));
                    slots.set_offset(slot, offset);
                }
            }
        }
    }

    /// Every stored offset.
    pub(super) fn offsets(&self) -> impl Iterator<Item = usize> + '_ {
        self.groups.iter().flat_map(|slots| {
            (0..G::SLOTS).filter(|&slot| slots.tags()[slot] != 0).map(|slot| slots.offset(slot))
        })
    }

    /// Shrinks to the smallest size that holds the current values.
    pub(super) fn shrink_to_fit(&mut self, rehash: impl Fn(usize) -> u64) {
        let groups = Self::groups_for(self.len);
        if groups < self.groups.len() || self.groups.capacity() > self.groups.len() {
            self.rebuild(groups, &rehash);
        }
    }

    /// Moves every offset into a table of `groups` groups.
    fn rebuild(&mut self, groups: usize, rehash: &impl Fn(usize) -> u64) {
        let mut rebuilt = Self { groups: vec![G::EMPTY; groups], len: self.len };
        for offset in self.offsets() {
            rebuilt.place(rehash(offset), offset);
        }
        *self = rebuilt;
    }

    /// A table of another group type holding the same offsets.
    pub(super) fn convert<H: Group>(&self, rehash: impl Fn(usize) -> u64) -> Table<H> {
        let mut converted =
            Table { groups: vec![H::EMPTY; Table::<H>::groups_for(self.len)], len: self.len };
        for offset in self.offsets() {
            converted.place(rehash(offset), offset);
        }
        converted
    }
}

/// Bit `i` set when `tags[i] == tag`; written as a fold so it compiles to a vector compare.
#[inline]
fn tag_matches(tags: &[u8], tag: u8) -> u32 {
    tags.iter()
        .enumerate()
        .fold(0, |mask, (i, &candidate)| mask | (u32::from(candidate == tag) << i))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hashes chosen so that every value has home group 0: all but the first twelve
    /// overflow, exercising the overflow counts.
    fn colliding(i: usize) -> u64 {
        (i as u64 * 0x9e37) & 0xffff
    }

    #[test]
    fn values_pushed_past_full_groups_are_found_and_removed() {
        let mut table = Table::<NarrowGroup>::with_capacity(40);
        let rehash = |offset: usize| colliding(offset);
        for i in 0..30 {
            table.insert(colliding(i), i, rehash);
        }
        assert_eq!(table.len(), 30);
        for i in 0..30 {
            assert!(table.find(colliding(i), |offset| offset == i).is_some(), "{i}");
        }
        for i in (0..30).step_by(2) {
            let position = table.find(colliding(i), |offset| offset == i).unwrap();
            table.remove(colliding(i), position);
        }
        for i in 0..30 {
            assert_eq!(table.find(colliding(i), |offset| offset == i).is_some(), i % 2 == 1);
        }
        // Every count is back to exactly what the remaining values need.
        let mut expected = vec![0; table.groups.len()];
        for i in (1..30).step_by(2) {
            let position = table.find(colliding(i), |offset| offset == i).unwrap();
            for count in &mut expected[..position.group] {
                *count += 1;
            }
        }
        let counts: Vec<u32> = table.groups.iter().map(|group| group.overflow).collect();
        assert_eq!(counts, expected);
    }

    #[test]
    fn tables_grow_past_their_load_limit_and_keep_every_offset() {
        let mut table = Table::<WideGroup>::with_capacity(0);
        let hash = |offset: usize| (offset as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for i in 0..1000 {
            table.insert(hash(i), i, hash);
        }
        assert!(table.groups.len() * WideGroup::MAX_LOAD >= 1000);
        let mut offsets: Vec<usize> = table.offsets().collect();
        offsets.sort_unstable();
        assert_eq!(offsets, (0..1000).collect::<Vec<_>>());
        let narrow: Table<NarrowGroup> = table.convert(hash);
        for i in 0..1000 {
            assert!(narrow.find(hash(i), |offset| offset == i).is_some());
        }
    }

    #[test]
    fn tag_matches_marks_equal_bytes() {
        assert_eq!(tag_matches(&[1, 2, 1, 0, 1], 1), 0b10101);
        assert_eq!(tag_matches(&[0; 12], 7), 0);
    }
}
