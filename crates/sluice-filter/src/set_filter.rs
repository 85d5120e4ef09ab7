//! [`SetFilter`]: the stage that keeps a record when the value at its path is in a set.

use sluice_core::filter_expr::{FilterExpr, PathSegment};

use crate::extract::{PreparedPath, Scalar};
use crate::value_set::{Prepared, Probe, ValueSet};

/// Tests records against a [`ValueSet`] by the value at one path.
///
/// A record passes when the value at the path is
/// - a JSON string whose lowercased text is in the set, or
/// - a JSON number whose literal text, lowercased, is in the set (`1E5` is looked up as
///   `1e5`, never as `100000`).
///
/// A record does not pass when the path is missing, when the value there is an object,
/// array, boolean or null, or when the record is not JSON. Duplicate keys: the first wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetFilter {
    path: Vec<PathSegment>,
    prepared: PreparedPath,
}

impl SetFilter {
    /// The filter for a parsed `filter_expr`.
    pub fn new(expr: &FilterExpr) -> Self {
        Self { path: expr.path().to_vec(), prepared: PreparedPath::new(expr.path()) }
    }

    /// The path of the value tested.
    pub fn path(&self) -> &[PathSegment] {
        &self.path
    }

    /// Whether `record` (the raw bytes of a JSON document) passes.
    #[inline]
    pub fn passes(&self, record: &[u8], set: &ValueSet) -> bool {
        self.prepared.scalar(record).is_some_and(|value| {
            let (bytes, ascii) = value.bytes();
            set.contains_lowercased(bytes, ascii)
        })
    }

    /// Each record's value at the path, extracted once and prepared for lookups in any
    /// number of sets ([`ValueSet::contains_prepared`]): `prepared[i]` is for `records[i]`.
    /// Testing one prepared value against a set answers what [`passes`](Self::passes) does.
    pub fn prepare<R: AsRef<[u8]>>(&self, records: &[R]) -> Vec<Prepared> {
        preload_records(records);
        records
            .iter()
            .map(|record| match self.prepared.scalar(record.as_ref()) {
                Some(value) => {
                    let (bytes, ascii) = value.bytes();
                    Prepared::of(bytes, ascii)
                }
                None => Prepared::ABSENT,
            })
            .collect()
    }

    /// Whether each of `records` passes: clears `passed`, then pushes one answer per record,
    /// the same as [`passes`](Self::passes) gives.
    ///
    /// Faster than calling `passes` in a loop when the set is much larger than the CPU
    /// caches: values are extracted from a few records at a time and their table memory read
    /// together, so the cache misses of those lookups overlap rather than queue.
    pub fn passes_batch<R: AsRef<[u8]>>(
        &self,
        records: &[R],
        set: &ValueSet,
        passed: &mut Vec<bool>,
    ) {
        passed.clear();
        passed.reserve(records.len());
        let mut values: [Option<Scalar<'_>>; BATCH] = std::array::from_fn(|_| None);
        let mut probes = [Probe::Absent; BATCH];
        for chunk in records.chunks(BATCH) {
            preload_records(chunk);
            for ((value, probe), record) in values.iter_mut().zip(&mut probes).zip(chunk) {
                *value = self.prepared.scalar(record.as_ref());
                *probe = match value {
                    Some(value) => {
                        let (bytes, ascii) = value.bytes();
                        ValueSet::probe(bytes, ascii)
                    }
                    None => Probe::Absent,
                };
            }
            let (values, probes) = (&values[..chunk.len()], &probes[..chunk.len()]);
            set.preload(probes);
            passed.extend(values.iter().zip(probes).map(|(value, probe)| {
                value.as_ref().is_some_and(|value| set.contains_probe(probe, value.bytes().0))
            }));
        }
    }
}

/// Records whose lookups [`SetFilter::passes_batch`] prepares together: enough misses in
/// flight to hide most of the memory latency, few enough to stay in L1.
const BATCH: usize = 32;

/// How far into each record [`preload_records`] reads.
const PRELOAD_RECORD_BYTES: usize = 1024;

/// Reads one byte per cache line of the start of each record, in a tight loop, so that the
/// extraction after it does not wait for records one miss at a time.
fn preload_records<R: AsRef<[u8]>>(records: &[R]) {
    let touched = records.iter().fold(0, |seen, record| {
        let record = record.as_ref();
        let start = &record[..record.len().min(PRELOAD_RECORD_BYTES)];
        start.iter().step_by(64).fold(seen, |seen, &byte| seen ^ byte)
    });
    std::hint::black_box(touched);
}

impl From<&FilterExpr> for SetFilter {
    fn from(expr: &FilterExpr) -> Self {
        Self::new(expr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(expr: &str) -> SetFilter {
        SetFilter::new(&FilterExpr::parse(expr).unwrap())
    }

    #[test]
    fn passes_records_whose_value_lowercases_into_the_set() {
        let set: ValueSet =
            ["0x00000000219ab540356cbb839cbe05303d7705fa", "usdc", "1e5"].into_iter().collect();
        let by_token = filter("root = this.token_address");
        let passes = |record: &str| by_token.passes(record.as_bytes(), &set);
        assert!(passes(r#"{"n":1,"token_address":"0x00000000219ab540356cbb839cbe05303d7705fa"}"#));
        assert!(passes(r#"{"token_address":"0x00000000219AB540356CBB839cBE05303d7705Fa"}"#));
        assert!(passes(r#"{"token_address":"USDC"}"#));
        assert!(passes(r#"{"token_address":1E5}"#));
        assert!(!passes(r#"{"token_address":100000}"#));
        assert!(!passes(r#"{"token_address":"usdt"}"#));
        assert!(!passes(r#"{"token_address":["usdc"]}"#));
        assert!(!passes(r#"{"token_address":null}"#));
        assert!(!passes(r#"{"other":"usdc"}"#));
        assert!(!passes("not json"));
    }

    #[test]
    fn follows_nested_paths_with_indexes() {
        let set: ValueSet = ["b"].into_iter().collect();
        let topic = filter("root = this.log.topics.1");
        assert!(topic.passes(br#"{"log":{"topics":["a","B"]}}"#, &set));
        assert!(!topic.passes(br#"{"log":{"topics":["b"]}}"#, &set));
    }
}
