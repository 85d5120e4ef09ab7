//! [`SetFilter`]: the stage that keeps a record when the value at its path is in a set.

use sluice_core::filter_expr::{FilterExpr, PathSegment};

use crate::extract::{Extracted, extract};
use crate::value_set::ValueSet;

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
}

impl SetFilter {
    /// The filter for a parsed `filter_expr`.
    pub fn new(expr: &FilterExpr) -> Self {
        Self { path: expr.path().to_vec() }
    }

    /// The path of the value tested.
    pub fn path(&self) -> &[PathSegment] {
        &self.path
    }

    /// Whether `record` (the raw bytes of a JSON document) passes.
    #[inline]
    pub fn passes(&self, record: &[u8], set: &ValueSet) -> bool {
        match extract(record, &self.path) {
            Some(Extracted::Str(text)) => set.contains_unnormalized(text.as_bytes()),
            Some(Extracted::Number(literal)) => set.contains_unnormalized(literal.as_bytes()),
            None => false,
        }
    }
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
