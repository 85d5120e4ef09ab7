//! The typed columns of a row, read from its record in one pass: the top-level fields a table
//! has are taken (strings borrowed from the record where they need no unescaping), every other
//! field skipped unparsed. This is what the archiver does per record, so it avoids building a
//! JSON map of every field.

use std::borrow::Cow;
use std::fmt;

use serde::Deserializer as _;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

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
/// for a field it lacks — and for every field when `record` is not a JSON object.
pub fn fields<'a>(record: &'a str, wanted: &[&str]) -> Vec<Option<Scalar<'a>>> {
    let mut found = vec![None; wanted.len()];
    let mut deserializer = serde_json::Deserializer::from_str(record);
    if deserializer.deserialize_map(Fields { wanted, found: &mut found }).is_err() {
        found.iter_mut().for_each(|slot| *slot = None);
    }
    found
}

struct Fields<'w, 'f, 'a> {
    wanted: &'w [&'w str],
    found: &'f mut [Option<Scalar<'a>>],
}

impl<'de> Visitor<'de> for Fields<'_, '_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match self.wanted.iter().position(|w| *w == key) {
                Some(index) => self.found[index] = Some(map.next_value_seed(ScalarSeed)?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar<'de>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Scalar<'de>, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
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

    #[test]
    fn what_is_not_an_object_has_no_fields() {
        assert_eq!(fields("[1, 2]", &["a"]), vec![None]);
        assert_eq!(fields("{\"a\": 1, ", &["a"]), vec![None]);
        assert_eq!(fields("not json", &["a"]), vec![None]);
    }
}
