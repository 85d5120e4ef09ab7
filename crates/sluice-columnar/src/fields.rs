//! The typed columns of a row, read from its record in one pass: the top-level fields a table
//! has are taken (strings borrowed from the record where they need no unescaping), every other
//! field skipped unparsed. This is what the archiver does per record, so it avoids building a
//! JSON map of every field.
//!
//! The walk over the members is this module's own: keys and skipped values are found with
//! `sluice_core::json`'s helpers (quotes searched sixteen bytes at a time), and only the
//! values a table wants are handed to `serde_json`. It checks the structure it walks (strings
//! end, brackets match within 128 levels, members are `"key": value` separated by commas),
//! not every byte of the values it skips: every record that reaches a [`Row`](super::Row)
//! was parsed as JSON when it was made (the stream's ingest, `sluice warehouse import`), so
//! this never decides whether a record is JSON, only where its fields are.

use std::borrow::Cow;
use std::fmt;

use serde::Deserializer as _;
use serde::de::{self, MapAccess, Visitor};
use serde_json::Value;
use sluice_core::json::{container_end, skip_ws, string_end, unescape_into};

/// One field's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar<'a> {
    Null,
    Bool(bool),
    Int(i64),
    /// An integer beyond `i64`.
    Big(u64),
    Float(f64),
    Text(Cow<'a, str>),
    /// An object or an array.
    Json(Value),
}

impl Scalar<'_> {
    /// As an `Int64` column reads it: an integer, or text that parses as one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Self::Int(n) => Some(*n),
            Self::Text(text) => text.parse().ok(),
            _ => None,
        }
    }

    /// As a `Float64` column reads it: a number, or text that parses as one.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Self::Int(n) => Some(*n as f64),
            Self::Big(n) => Some(*n as f64),
            Self::Float(x) => Some(*x),
            Self::Text(text) => text.parse().ok(),
            _ => None,
        }
    }

    /// As a text column reads it: strings as they are, anything else its JSON text; `None`
    /// for null.
    pub fn as_text(&self) -> Option<Cow<'_, str>> {
        match self {
            Self::Null => None,
            Self::Text(text) => Some(Cow::Borrowed(text.as_ref())),
            Self::Bool(b) => Some(Cow::Owned(b.to_string())),
            Self::Int(n) => Some(Cow::Owned(n.to_string())),
            Self::Big(n) => Some(Cow::Owned(n.to_string())),
            Self::Float(x) => Some(Cow::Owned(Value::from(*x).to_string())),
            Self::Json(value) => Some(Cow::Owned(value.to_string())),
        }
    }
}

/// The values of `wanted` (top-level field names) in `record`, in `wanted`'s order; `None`
/// for a field it lacks — and for every field when `record` is not a JSON object. A key that
/// appears twice gives its last value, as a JSON map would (records never repeat one).
pub fn fields<'a>(record: &'a str, wanted: &[&str]) -> Vec<Option<Scalar<'a>>> {
    let mut found = vec![None; wanted.len()];
    fields_into(record, wanted, &mut found);
    found
}

/// [`fields`] into `found` (one slot per wanted name, overwritten), for a caller that reads
/// many records into one buffer.
pub fn fields_into<'a>(record: &'a str, wanted: &[&str], found: &mut [Option<Scalar<'a>>]) {
    found.iter_mut().for_each(|slot| *slot = None);
    if walk_members(record, wanted, found).is_none() {
        found.iter_mut().for_each(|slot| *slot = None);
    }
}

/// Walks the members of the object `record`, filling `found` for the wanted keys; `None` when
/// the structure is not an object's.
fn walk_members<'a>(
    record: &'a str,
    wanted: &[&str],
    found: &mut [Option<Scalar<'a>>],
) -> Option<()> {
    let bytes = record.as_bytes();
    let mut pos = skip_ws(bytes, 0);
    if bytes.get(pos) != Some(&b'{') {
        return None;
    }
    pos = skip_ws(bytes, pos + 1);
    if bytes.get(pos) == Some(&b'}') {
        return Some(());
    }
    let mut unescaped = String::new();
    let mut next = 0;
    loop {
        if bytes.get(pos) != Some(&b'"') {
            return None;
        }
        let (key_end, escaped) = string_end(bytes, pos + 1)?;
        let key = if escaped {
            unescaped.clear();
            unescape_into(record.get(pos + 1..key_end)?, &mut unescaped)?;
            unescaped.as_str()
        } else {
            record.get(pos + 1..key_end)?
        };
        // Records of a stream list their keys in one order: the wanted name after the last
        // one found is tried first.
        let slot = match wanted.get(next) {
            Some(name) if *name == key => Some(next),
            _ => wanted.iter().position(|name| *name == key),
        };
        if let Some(slot) = slot {
            next = slot + 1;
        }
        pos = skip_ws(bytes, key_end + 1);
        if bytes.get(pos) != Some(&b':') {
            return None;
        }
        let start = skip_ws(bytes, pos + 1);
        let end = value_end(bytes, start)?;
        if let Some(slot) = slot {
            found[slot] = Some(scalar(record.get(start..end)?)?);
        }
        pos = skip_ws(bytes, end);
        match bytes.get(pos) {
            Some(b',') => pos = skip_ws(bytes, pos + 1),
            Some(b'}') => return Some(()),
            _ => return None,
        }
    }
}

/// The value whose JSON text is `text`, read by `serde_json` (strings without escapes stay
/// borrowed).
fn scalar(text: &str) -> Option<Scalar<'_>> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = deserializer.deserialize_any(ScalarVisitor).ok()?;
    deserializer.end().ok()?;
    Some(value)
}

/// The position just past the value at `pos`: a string, a number or literal (the run of
/// bytes that may make one up), or a container (strings skipped, brackets matched).
fn value_end(bytes: &[u8], pos: usize) -> Option<usize> {
    match bytes.get(pos)? {
        b'"' => string_end(bytes, pos + 1).map(|(end, _)| end + 1),
        b'{' | b'[' => container_end(bytes, pos),
        b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
            let rest = &bytes[pos..];
            let len = rest
                .iter()
                .position(
                    |byte| !matches!(byte, b'0'..=b'9' | b'a'..=b'z' | b'+' | b'-' | b'.' | b'E'),
                )
                .unwrap_or(rest.len());
            Some(pos + len)
        }
        _ => None,
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Int(n))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Scalar<'de>, E> {
        Ok(i64::try_from(n).map_or(Scalar::Big(n), Scalar::Int))
    }

    fn visit_f64<E>(self, x: f64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Float(x))
    }

    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Text(Cow::Borrowed(text)))
    }

    fn visit_str<E>(self, text: &str) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Text(Cow::Owned(text.to_owned())))
    }

    fn visit_string<E>(self, text: String) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Text(Cow::Owned(text)))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scalar<'de>, A::Error> {
        let value = serde::Deserialize::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(Scalar::Json(value))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Scalar<'de>, A::Error> {
        let value = serde::Deserialize::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
        Ok(Scalar::Json(value))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Every field as the JSON-map read it replaces saw it.
    fn via_map(record: &str, name: &str) -> (Option<i64>, Option<f64>, Option<String>) {
        let map: serde_json::Map<String, Value> = serde_json::from_str(record).unwrap_or_default();
        let value = map.get(name);
        let int = value.and_then(|v| v.as_i64().or_else(|| v.as_str()?.parse().ok()));
        let float = value.and_then(|v| v.as_f64().or_else(|| v.as_str()?.parse().ok()));
        let text = match value {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(text.clone()),
            Some(other) => Some(other.to_string()),
        };
        (int, float, text)
    }

    #[test]
    fn every_kind_of_value_reads_as_a_full_parse_reads_it() {
        let record = r#"{"a": 7, "b": -3, "c": 18446744073709551615, "d": 1.5, "e": 1e300,
            "f": "12", "g": "x\"y\u00e9", "h": true, "i": null, "j": {"k": [1, {"l": 2}]},
            "m": [1, 2.0, "3"], "n": "1.25", "o": 1.0, "skipped": {"deep": [[[]]]}}"#;
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "m", "n", "o", "absent"];
        let found = fields(record, &names);
        for (name, value) in names.iter().zip(&found) {
            let (int, float, text) = via_map(record, name);
            let value = value.as_ref();
            assert_eq!(value.and_then(Scalar::as_i64), int, "{name} as integer");
            assert_eq!(value.and_then(Scalar::as_f64), float, "{name} as float");
            assert_eq!(
                value.and_then(|v| v.as_text().map(Cow::into_owned)),
                text,
                "{name} as text"
            );
        }
        assert!(matches!(found[6], Some(Scalar::Text(Cow::Owned(_)))), "escaped text is unescaped");
        assert!(matches!(found[5], Some(Scalar::Text(Cow::Borrowed(_)))), "plain text is borrowed");
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e300f64..1e300).prop_map(Value::from),
            "[a-z\"\\\\\u{e9}\u{1f600}\n\t ]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-c\"]{1,3}", inner, 0..4)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// For any object, written compactly or pretty, every top-level field (and one that
        /// is absent) reads as the full parse reads it.
        #[test]
        fn the_walk_reads_every_field_as_a_full_parse(
            members in proptest::collection::btree_map("[a-d\"\\\\\u{e9}]{1,4}", json_value(), 0..6),
            pretty in any::<bool>(),
        ) {
            let object = Value::Object(members.into_iter().collect());
            let record = if pretty {
                serde_json::to_string_pretty(&object).unwrap()
            } else {
                serde_json::to_string(&object).unwrap()
            };
            let mut names: Vec<String> = object.as_object().unwrap().keys().cloned().collect();
            names.push("absent".to_owned());
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let found = fields(&record, &names);
            for (name, value) in names.iter().zip(&found) {
                let (int, float, text) = via_map(&record, name);
                let value = value.as_ref();
                prop_assert_eq!(value.and_then(Scalar::as_i64), int, "{} as integer in {}", name, record);
                let got = value.and_then(Scalar::as_f64);
                prop_assert!(got == float || got.zip(float).is_some_and(|(a, b)| a.is_nan() && b.is_nan()), "{} as float in {}", name, record);
                prop_assert_eq!(value.and_then(|v| v.as_text().map(Cow::into_owned)), text, "{} as text in {}", name, record);
            }
        }
    }

    #[test]
    fn what_is_not_an_object_has_no_fields() {
        assert_eq!(fields("[1, 2]", &["a"]), vec![None]);
        assert_eq!(fields("{\"a\": 1, ", &["a"]), vec![None]);
        assert_eq!(fields("not json", &["a"]), vec![None]);
    }
}
