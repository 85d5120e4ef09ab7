//! [`Candidates`]: which of many sets may hold a value, found with one lookup.
//!
//! Many pipelines filter one stream by the same path, each with its own set. Testing every
//! record against every set costs one lookup per set; this index answers, from a record's
//! prepared value ([`crate::Prepared::hash`]), the few sets that may hold it, so a record
//! costs one lookup however many sets there are, plus one exact lookup per candidate in its
//! own set.
//!
//! It is keyed by the values' 64-bit lookup hashes, not the values: a candidate is only a
//! candidate. Two values of one hash, or a value removed from a set but still listed here,
//! make a candidate that the set's own lookup then refuses; nothing is ever missed as long as
//! every value of every member set was [`add`](Candidates::add)ed.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::value_set::ValueSet;

/// Sets, numbered by their caller, that may hold a value, by the value's lookup hash.
#[derive(Debug, Default, Clone)]
pub struct Candidates {
    by_hash: HashMap<u64, Members, BuildHasherDefault<Prehashed>>,
    /// `(hash, member)` pairs held.
    pairs: usize,
}

/// The members listed under one hash: almost always one.
#[derive(Debug, Clone)]
enum Members {
    One([u32; 1]),
    Many(Vec<u32>),
}

impl Candidates {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lists `member` under `hash` (no effect when it is listed already).
    pub fn add(&mut self, hash: u64, member: u32) {
        match self.by_hash.entry(hash) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Members::One([member]));
            }
            std::collections::hash_map::Entry::Occupied(mut slot) => match slot.get_mut() {
                Members::One([one]) if *one == member => return,
                Members::One([one]) => {
                    let one = *one;
                    slot.insert(Members::Many(vec![one, member]));
                }
                Members::Many(many) if many.contains(&member) => return,
                Members::Many(many) => many.push(member),
            },
        }
        self.pairs += 1;
    }

    /// Lists `member` under the hash of every value of `set`.
    pub fn add_set(&mut self, set: &ValueSet, member: u32) {
        self.by_hash.reserve(set.len());
        for hash in set.hashes() {
            self.add(hash, member);
        }
    }

    /// The members that may hold a value of lookup hash `hash`.
    #[inline]
    pub fn get(&self, hash: u64) -> &[u32] {
        match self.by_hash.get(&hash) {
            Some(Members::One(one)) => one,
            Some(Members::Many(many)) => many,
            None => &[],
        }
    }

    /// `(hash, member)` pairs listed: the work [`add`](Self::add) did, stale ones included.
    pub fn pairs(&self) -> usize {
        self.pairs
    }

    /// Whether nothing is listed.
    pub fn is_empty(&self) -> bool {
        self.pairs == 0
    }
}

/// The keys are already the output of a good hash ([`ValueSet::hash_of`]): used as they are.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; fold anything else in all the same.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SetFilter;
    use sluice_core::filter_expr::FilterExpr;

    #[test]
    fn a_record_finds_exactly_the_sets_holding_its_value_after_confirmation() {
        let sets: Vec<ValueSet> = vec![
            ["0xabc0000000000000000000000000000000000001", "usdc"].into_iter().collect(),
            ["usdc", "1e5"].into_iter().collect(),
            ["dai"].into_iter().collect(),
        ];
        let mut index = Candidates::new();
        for (member, set) in sets.iter().enumerate() {
            index.add_set(set, member as u32);
        }
        assert_eq!(index.pairs(), 5);
        let filter = SetFilter::new(&FilterExpr::parse("root = this.token").unwrap());
        let records = [
            r#"{"token":"0xABC0000000000000000000000000000000000001"}"#,
            r#"{"token":"USDC"}"#,
            r#"{"token":1E5}"#,
            r#"{"token":"weth"}"#,
            r#"{"other":"dai"}"#,
            "not json",
        ];
        let prepared = filter.prepare(&records);
        let found: Vec<Vec<u32>> = prepared
            .iter()
            .map(|value| {
                let Some(hash) = value.hash() else { return Vec::new() };
                let mut members: Vec<u32> = index
                    .get(hash)
                    .iter()
                    .copied()
                    .filter(|&m| sets[m as usize].contains_prepared(value))
                    .collect();
                members.sort_unstable();
                members
            })
            .collect();
        assert_eq!(found, vec![vec![0], vec![0, 1], vec![1], vec![], vec![], vec![]]);
        // The same answers as each set's own filter.
        for (record, members) in records.iter().zip(&found) {
            for (member, set) in sets.iter().enumerate() {
                assert_eq!(
                    filter.passes(record.as_bytes(), set),
                    members.contains(&(member as u32)),
                    "{record} in set {member}"
                );
            }
        }
    }

    #[test]
    fn hashes_of_inserted_values_match_the_lookup_hashes_of_records() {
        let values = ["0x00000000219ab540356cbb839cbe05303d7705fa", "usdc", "ünï", "1e5"];
        let set: ValueSet = values.into_iter().collect();
        let mut hashes: Vec<u64> = set.hashes().collect();
        hashes.sort_unstable();
        let mut expected: Vec<u64> = values.iter().map(|v| ValueSet::hash_of(v)).collect();
        expected.sort_unstable();
        assert_eq!(hashes, expected);
        let filter = SetFilter::new(&FilterExpr::parse("root = this.v").unwrap());
        let prepared = filter
            .prepare(&[r#"{"v":"0x00000000219AB540356CBB839CBE05303D7705FA"}"#, r#"{"v":"ÜNÏ"}"#]);
        assert_eq!(prepared[0].hash(), Some(ValueSet::hash_of(values[0])));
        assert_eq!(prepared[1].hash(), Some(ValueSet::hash_of(values[2])));
    }

    #[test]
    fn long_values_are_prepared_and_found() {
        let long = "a".repeat(200);
        let set: ValueSet = [long.as_str()].into_iter().collect();
        let filter = SetFilter::new(&FilterExpr::parse("root = this.v").unwrap());
        let record = format!(r#"{{"v":"{}"}}"#, long.to_uppercase());
        let prepared = filter.prepare(&[record.as_str()]);
        assert_eq!(prepared[0].hash(), Some(ValueSet::hash_of(&long)));
        assert!(set.contains_prepared(&prepared[0]));
    }
}
