use std::borrow::Cow;

use proptest::prelude::*;
use serde_json::Value;
use sluice_core::filter_expr::PathSegment;
use sluice_filter::{Extracted, extract};

use crate::json_doc::{self, Doc};

/// What `serde_json` finds at `path`.
fn serde_at<'v>(value: &'v Value, path: &[PathSegment]) -> Option<&'v Value> {
    path.iter().try_fold(value, |node, segment| match segment {
        PathSegment::Field(name) => node.as_object()?.get(name),
        PathSegment::Index(index) => node.as_array()?.get(*index),
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn extract_agrees_with_serde_json_on_every_path(doc in json_doc::doc(), seed in any::<u64>()) {
        let bytes = json_doc::render(&doc, seed);
        let parsed: Value = serde_json::from_slice(&bytes)
            .map_err(|error| TestCaseError::fail(format!("generator made bad JSON: {error}")))?;
        for path in json_doc::paths(&doc) {
            let got = extract(&bytes, &path);
            match serde_at(&parsed, &path) {
                Some(Value::String(text)) => {
                    prop_assert_eq!(&got, &Some(Extracted::Str(Cow::Borrowed(text))), "{:?}", path);
                }
                Some(Value::Number(number)) => {
                    let Some(Extracted::Number(literal)) = got else {
                        return Err(TestCaseError::fail(format!("{path:?}: {got:?}")));
                    };
                    let reparsed: Value = serde_json::from_str(literal)?;
                    prop_assert_eq!(&reparsed, &Value::Number(number.clone()));
                    let Some(Doc::Num(generated)) = json_doc::at(&doc, &path) else {
                        return Err(TestCaseError::fail("serde and the generator disagree"));
                    };
                    prop_assert_eq!(literal, generated.as_str());
                }
                _ => prop_assert_eq!(&got, &None, "{:?}", path),
            }
        }
    }

    /// The set filter reads records with [`extract`], sinks and scripts with `serde_json`;
    /// ingest admits a record only when `sluice_core::json::parse` does. Whatever that parse
    /// admits, both readers see the same value at every path, and it refuses exactly the
    /// documents with a repeated key (which the two readers would read differently).
    #[test]
    fn what_ingest_admits_the_filter_and_serde_json_read_alike(
        doc in json_doc::doc_with_repeats(),
        seed in any::<u64>(),
    ) {
        let bytes = json_doc::render(&doc, seed);
        match sluice_core::json::parse(&bytes) {
            Err(sluice_core::json::JsonError::DuplicateKey { .. }) => {
                prop_assert!(json_doc::has_repeats(&doc), "refused without a repeat");
            }
            Err(error) => return Err(TestCaseError::fail(format!("bad JSON generated: {error}"))),
            Ok(parsed) => {
                prop_assert!(!json_doc::has_repeats(&doc), "admitted a repeated key");
                prop_assert_eq!(&parsed, &serde_json::from_slice::<Value>(&bytes)?);
                for path in json_doc::paths(&doc) {
                    let got = extract(&bytes, &path);
                    match serde_at(&parsed, &path) {
                        Some(Value::String(text)) => prop_assert_eq!(
                            got.as_ref().map(Extracted::text), Some(text.as_str()), "{:?}", path
                        ),
                        Some(Value::Number(number)) => {
                            let Some(Extracted::Number(literal)) = got else {
                                return Err(TestCaseError::fail(format!("{path:?}: {got:?}")));
                            };
                            let reparsed: Value = serde_json::from_str(literal)?;
                            prop_assert_eq!(&reparsed, &Value::Number(number.clone()));
                        }
                        _ => prop_assert_eq!(&got, &None, "{:?}", path),
                    }
                }
            }
        }
    }

    #[test]
    fn extract_never_panics_on_damaged_documents(
        doc in json_doc::doc(),
        seed in any::<u64>(),
        damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = json_doc::render(&doc, seed);
        for (at, byte) in damage {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        let truncated = &bytes[..cut.index(bytes.len() + 1)];
        for path in json_doc::paths(&doc) {
            let _ = extract(&bytes, &path);
            let _ = extract(truncated, &path);
        }
    }

    #[test]
    fn extract_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        for path in [vec![], vec![PathSegment::Field("a".into())], vec![PathSegment::Index(1)]] {
            let _ = extract(&bytes, &path);
        }
    }
}

#[test]
fn escaped_key_spellings_all_find_the_field() {
    let field = [PathSegment::Field("token_address".into())];
    for key in
        [r"tok\u0065n_address", r"\u0074oken_address", r"token\u005Faddress", "token_address"]
    {
        let record = format!(r#"{{"block_number":1,"{key}":"0xAB"}}"#);
        assert_eq!(
            extract(record.as_bytes(), &field),
            Some(Extracted::Str(Cow::Borrowed("0xAB"))),
            "{key}"
        );
    }
    let record = br#"{"token_addres":"0x1","token_address_":"0x2","tokenaddress":"0x3"}"#;
    assert_eq!(extract(record, &field), None);
}

#[test]
fn a_repeated_key_spelled_with_escapes_is_refused_before_the_readers_could_disagree() {
    let record = br#"{"token_address":"0xallowed","token_\u0061ddress":"0xother"}"#;
    let field = [PathSegment::Field("token_address".into())];
    assert_eq!(extract(record, &field), Some(Extracted::Str(Cow::Borrowed("0xallowed"))));
    let serde: Value = serde_json::from_slice(record).unwrap();
    assert_eq!(serde["token_address"], "0xother");
    let refused = sluice_core::json::parse(record).unwrap_err();
    assert_eq!(
        refused.duplicate_path(),
        Some(&[sluice_core::validation::LocItem::Field("token_address".into())][..])
    );
}

#[test]
fn strings_without_escapes_are_borrowed_from_the_record() {
    let record = br#"{"a":"plain","b":"esc\naped"}"#;
    let a = [PathSegment::Field("a".into())];
    let b = [PathSegment::Field("b".into())];
    assert!(matches!(extract(record, &a), Some(Extracted::Str(Cow::Borrowed("plain")))));
    assert!(
        matches!(extract(record, &b), Some(Extracted::Str(Cow::Owned(text))) if text == "esc\naped")
    );
}
