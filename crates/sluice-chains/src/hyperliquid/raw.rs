//! Node lines read without building a value tree: an object's members are borrowed from the
//! line and written back as serde_json writes a parsed `Value` (keys in ascending order, each
//! once with its last value, strings and numbers in serde_json's spelling), so a record's text
//! is byte for byte what parsing the line into a `Value` and serialising it makes.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sluice_core::streams::{StreamRecord, entity_schema};

/// A string borrowed from the line when it has no escapes.
#[derive(Debug)]
pub struct Text<'a>(pub Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor;
        impl<'de> Visitor<'de> for StrVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(StrVisitor)
    }
}

/// A member's value: as the line wrote it, JSON text made for the record, or an object of
/// the line read once for several uses ([`Object::read_object`]).
#[derive(Debug, Clone)]
pub enum Member<'a> {
    Raw(&'a RawValue),
    Made(Vec<u8>),
    Object(Object<'a>),
}

/// An object's members in the order the line wrote them.
#[derive(Debug, Clone, Default)]
pub struct Object<'a> {
    pub members: Vec<(Cow<'a, str>, Member<'a>)>,
}

impl<'de> Deserialize<'de> for Object<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor;
        impl<'de> Visitor<'de> for MapVisitor {
            type Value = Object<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some((Text(key), value)) = map.next_entry::<Text<'de>, &RawValue>()? {
                    members.push((key, Member::Raw(value)));
                }
                Ok(Object { members })
            }
        }
        deserializer.deserialize_map(MapVisitor)
    }
}

impl<'a> Object<'a> {
    /// The value of `name` (its last copy, as a parsed map keeps).
    pub fn get(&self, name: &str) -> Option<&Member<'a>> {
        self.members.iter().rev().find(|(key, _)| key == name).map(|(_, value)| value)
    }

    /// The raw value of `name`, when the line wrote it.
    pub fn raw(&self, name: &str) -> Option<&'a RawValue> {
        match self.get(name) {
            Some(Member::Raw(raw)) => Some(raw),
            _ => None,
        }
    }

    /// About the length of the object's JSON text (room for a record of it).
    pub fn size(&self) -> usize {
        let member = |value: &Member<'_>| match value {
            Member::Raw(raw) => raw.get().len(),
            Member::Made(text) => text.len(),
            Member::Object(object) => object.size(),
        };
        self.members.iter().map(|(key, value)| key.len() + member(value) + 4).sum::<usize>() + 2
    }

    /// Reads the object at `name` (its last copy) once, for its key fields and its text.
    pub fn read_object(&mut self, name: &str) {
        let last = self.members.iter_mut().rev().find(|(key, _)| key == name);
        if let Some((_, member)) = last
            && let Member::Raw(raw) = member
            && raw.get().starts_with('{')
            && let Ok(object) = serde_json::from_str::<Object<'a>>(raw.get())
        {
            *member = Member::Object(object);
        }
    }

    /// Sets `name` (replacing the line's copies).
    pub fn set(&mut self, name: &'static str, value: Vec<u8>) {
        self.members.push((Cow::Borrowed(name), Member::Made(value)));
    }

    /// Writes the object as serde_json writes a `Map` of it.
    pub fn write(mut self, out: &mut Vec<u8>) -> Result<(), String> {
        self.members.sort_by(|a, b| a.0.cmp(&b.0));
        // A stable sort keeps copies of a key in line order; the last one stays.
        self.members.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                std::mem::swap(later, earlier);
            }
            same
        });
        out.push(b'{');
        for (index, (key, value)) in self.members.into_iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            match key {
                // A key borrowed from the line had no escapes, and JSON text holds no quote or
                // control character unescaped: it is already what `write_str` would write.
                Cow::Borrowed(key) => {
                    out.push(b'"');
                    out.extend_from_slice(key.as_bytes());
                    out.push(b'"');
                }
                Cow::Owned(key) => write_str(out, &key),
            }
            out.push(b':');
            match value {
                Member::Raw(raw) => write_value(out, raw)?,
                Member::Made(text) => out.extend_from_slice(&text),
                // What `write_value` makes of the object's text.
                Member::Object(object) => object.write(out)?,
            }
        }
        out.push(b'}');
        Ok(())
    }
}

/// A JSON string.
pub fn write_str(out: &mut Vec<u8>, text: &str) {
    if sluice_core::json::find_string_special(text.as_bytes()).is_none() {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, text);
    }
}

/// An integer.
pub fn write_int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// An integer serde_json reads and writes back unchanged (not `-0`, within `i64`).
fn plain_integer(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty()
        && digits.len() <= 18
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !(digits.len() < text.len() && digits.starts_with('0'))
}

/// A value as serde_json writes it once parsed: copied when that is the line's text, else
/// parsed (objects and arrays member by member) and written.
pub fn write_value(out: &mut Vec<u8>, raw: &RawValue) -> Result<(), String> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'{') => {
            let object: Object<'_> = serde_json::from_str(text).map_err(|e| e.to_string())?;
            object.write(out)
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text).map_err(|e| e.to_string())?;
            out.push(b'[');
            for (index, item) in items.into_iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_value(out, item)?;
            }
            out.push(b']');
            Ok(())
        }
        Some(b'"') if !text.contains('\\') => {
            out.extend_from_slice(text.as_bytes());
            Ok(())
        }
        Some(b't' | b'f' | b'n') => {
            out.extend_from_slice(text.as_bytes());
            Ok(())
        }
        _ if plain_integer(text) => {
            out.extend_from_slice(text.as_bytes());
            Ok(())
        }
        _ => {
            let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
            serde_json::to_writer(&mut *out, &value).map_err(|e| e.to_string())
        }
    }
}

/// A value parsed (for the few fields a record's key and time are read from).
pub fn value(raw: &RawValue) -> Value {
    let text = raw.get();
    // What serde_json makes of the two common cases, without a parser for each.
    match text.as_bytes().first() {
        Some(b'"') if !text.contains('\\') => {
            return Value::String(text[1..text.len() - 1].to_owned());
        }
        Some(b'-') if plain_integer(text) => {
            if let Ok(n) = text.parse::<i64>() {
                return Value::from(n);
            }
        }
        Some(b'0'..=b'9') if plain_integer(text) => {
            if let Ok(n) = text.parse::<u64>() {
                return Value::from(n);
            }
        }
        _ => {}
    }
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// A member's value parsed.
pub fn member_value(member: &Member<'_>) -> Value {
    match member {
        Member::Raw(raw) => value(raw),
        Member::Made(text) => serde_json::from_slice(text).unwrap_or(Value::Null),
        Member::Object(object) => {
            let mut text = Vec::with_capacity(object.size());
            match object.clone().write(&mut text) {
                Ok(()) => serde_json::from_slice(&text).unwrap_or(Value::Null),
                Err(_) => Value::Null,
            }
        }
    }
}

/// The entity's key and time fields of a payload, for [`StreamRecord::written`]: the dotted
/// key fields (`order.oid`) step into nested objects.
pub fn key_fields(entity: &str, payload: &Object<'_>) -> Map<String, Value> {
    let mut fields = Map::new();
    let Some(schema) = entity_schema(entity) else {
        return fields;
    };
    for name in schema.key_fields.iter().chain([&schema.time_field]) {
        let mut path = name.split('.');
        let Some(first) = path.next() else { continue };
        let Some(member) = payload.get(first) else { continue };
        let rest: Vec<&str> = path.collect();
        let leaf = match (rest.as_slice(), member) {
            ([], member) => member_value(member),
            (rest, Member::Raw(raw)) => nested_raw(raw, rest),
            ([segment, rest @ ..], Member::Object(object)) => match object.get(segment) {
                Some(Member::Raw(raw)) => nested_raw(raw, rest),
                Some(member) => nested(member_value(member), rest),
                None => Value::Null,
            },
            (rest, member) => nested(member_value(member), rest),
        };
        let mut leaf = leaf;
        for segment in rest.iter().rev() {
            let mut wrapped = Map::new();
            wrapped.insert((*segment).into(), leaf);
            leaf = Value::Object(wrapped);
        }
        match (fields.get_mut(first), leaf) {
            (Some(Value::Object(known)), Value::Object(more)) => known.extend(more),
            (_, leaf) => {
                fields.insert(first.into(), leaf);
            }
        }
    }
    fields
}

/// [`nested`] of a raw value, parsing only the members on the path (an order's whole
/// `order` object parsed into a map cost more than the rest of its record).
fn nested_raw(raw: &RawValue, path: &[&str]) -> Value {
    let mut raw = raw;
    for segment in path {
        if !raw.get().starts_with('{') {
            return Value::Null;
        }
        let Ok(object) = serde_json::from_str::<Object<'_>>(raw.get()) else {
            return Value::Null;
        };
        match object.raw(segment) {
            Some(inner) => raw = inner,
            None => return Value::Null,
        }
    }
    value(raw)
}

fn nested(mut value: Value, path: &[&str]) -> Value {
    for segment in path {
        value = match value {
            Value::Object(mut map) => map.remove(*segment).unwrap_or(Value::Null),
            _ => return Value::Null,
        };
    }
    value
}

/// The start of a wrapped record: `{"block_number":…,"node_file":…,"node_offset":…,"payload":`
/// (the envelope's keys in ascending order); the payload and a closing `}` follow.
pub fn envelope(file: &str, offset: u64, block: Option<u64>, room: usize) -> Vec<u8> {
    let mut text = Vec::with_capacity(room + file.len() + 80);
    text.push(b'{');
    if let Some(number) = block {
        text.extend_from_slice(b"\"block_number\":");
        write_int(&mut text, number);
        text.push(b',');
    }
    text.extend_from_slice(b"\"node_file\":");
    write_str(&mut text, file);
    text.extend_from_slice(b",\"node_offset\":");
    write_int(&mut text, offset);
    text.extend_from_slice(b",\"payload\":");
    text
}

/// A wrapped record from its text (see [`envelope`]) and its payload's key and time fields.
pub fn finish(
    entity: &str,
    mut text: Vec<u8>,
    fields: &Map<String, Value>,
) -> Result<StreamRecord, String> {
    text.push(b'}');
    StreamRecord::written(entity, text, fields).map_err(|error| error.to_string())
}
