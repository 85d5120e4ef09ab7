use std::collections::HashSet;

use proptest::prelude::*;
use sluice_core::filter_expr::{FilterExpr, PathSegment};
use sluice_filter::{SetFilter, ValueSet};

use crate::json_doc::{self, Doc};

const TRANSFER: &str = r#"{"block_number":19000000,"block_timestamp":1705149296,
  "transaction_hash":"0x5c504ed432cb51138bcf09aa5e8a410dd4a1e204ef84bfed1be16dfba1b22060",
  "log_index":7,"token_address":"0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48",
  "from_address":"0x28c6c06298d514db089934071355e5743bf21d60","amount_str":"1500.25",
  "token_symbol":"USDC","decimals":6}"#;

fn filter(expr: &str) -> SetFilter {
    SetFilter::new(&FilterExpr::parse(expr).unwrap())
}

#[test]
fn a_transfer_passes_by_token_address_in_any_case() {
    let set: ValueSet = ["0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48"].into_iter().collect();
    assert!(filter("root = this.token_address").passes(TRANSFER.as_bytes(), &set));
    assert!(!filter("root = this.from_address").passes(TRANSFER.as_bytes(), &set));
    assert!(!filter("root = this.missing").passes(TRANSFER.as_bytes(), &set));
}

#[test]
fn symbols_and_numbers_are_matched_by_their_text() {
    let set: ValueSet = ["usdc", "6", "1500.25"].into_iter().collect();
    assert!(filter("root = this.token_symbol").passes(TRANSFER.as_bytes(), &set));
    assert!(filter("root = this.decimals").passes(TRANSFER.as_bytes(), &set));
    assert!(filter("root = this.amount_str").passes(TRANSFER.as_bytes(), &set));
    assert!(!filter("root = this.log_index").passes(TRANSFER.as_bytes(), &set));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A record passes exactly when the value at the path is a string or number whose
    /// (lowercased) text is in the set.
    #[test]
    fn passes_iff_the_lowercased_scalar_is_in_the_set(
        doc in json_doc::doc(),
        seed in any::<u64>(),
        chosen in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let bytes = json_doc::render(&doc, seed);
        let paths = json_doc::paths(&doc);
        let scalar_text = |path: &[PathSegment]| match json_doc::at(&doc, path) {
            Some(Doc::Str(text) | Doc::Num(text)) => Some(text.to_lowercase()),
            _ => None,
        };
        let members: HashSet<String> =
            chosen.iter().filter_map(|index| scalar_text(&paths[index.index(paths.len())])).collect();
        let set: ValueSet = members.iter().map(String::as_str).collect();
        for path in &paths {
            // Only paths a filter_expr can spell (identifier keys) are filters.
            let Ok(expr) = FilterExpr::parse(&expr_text(path)) else { continue };
            if expr.path() != path.as_slice() {
                continue;
            }
            let expected = scalar_text(path).is_some_and(|text| members.contains(&text));
            prop_assert_eq!(SetFilter::new(&expr).passes(&bytes, &set), expected, "{:?}", path);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The batch answer is the per-record answer, across chunk boundaries and for records
    /// that are not JSON.
    #[test]
    fn passes_batch_answers_like_passes(
        docs in proptest::collection::vec((json_doc::doc(), any::<u64>()), 0..40),
        noise in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 0..5),
    ) {
        let mut records: Vec<Vec<u8>> = docs
            .iter()
            .map(|(doc, seed)| {
                let doc = Doc::Obj(vec![("a".into(), doc.clone()), ("b".into(), Doc::Str("x".into()))]);
                json_doc::render(&doc, *seed)
            })
            .collect();
        records.extend(noise);
        let texts: Vec<String> = docs
            .iter()
            .filter_map(|(doc, _)| match doc {
                Doc::Str(text) | Doc::Num(text) => Some(text.to_lowercase()),
                _ => None,
            })
            .step_by(2)
            .collect();
        let set: ValueSet = texts.iter().map(String::as_str).collect();
        for expr in ["root = this.a", "root = this.b", "root = this.a.0"] {
            let filter = filter(expr);
            let mut batch = vec![true; 3];
            filter.passes_batch(&records, &set, &mut batch);
            let single: Vec<bool> = records.iter().map(|record| filter.passes(record, &set)).collect();
            prop_assert_eq!(&batch, &single, "{}", expr);
        }
    }
}

#[test]
fn passes_batch_finds_members_in_every_position_of_a_long_batch() {
    let set: ValueSet = ["0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48"].into_iter().collect();
    let other = TRANSFER.replace("0xA0b86991", "0xB0b86991");
    let records: Vec<&[u8]> =
        (0..100).map(|i| if i % 7 == 3 { TRANSFER.as_bytes() } else { other.as_bytes() }).collect();
    let mut passed = Vec::new();
    filter("root = this.token_address").passes_batch(&records, &set, &mut passed);
    assert_eq!(passed, (0..100).map(|i| i % 7 == 3).collect::<Vec<_>>());
}

/// `path` spelled as `root = this.<path>` (which may not parse: keys are printed as they are).
fn expr_text(path: &[PathSegment]) -> String {
    let mut text = "root = this".to_owned();
    for segment in path {
        match segment {
            PathSegment::Field(name) => {
                text.push('.');
                text.push_str(name);
            }
            PathSegment::Index(index) => text.push_str(&format!(".{index}")),
        }
    }
    text
}
