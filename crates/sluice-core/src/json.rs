//! JSON parsing that refuses duplicate object keys, at any depth.
//!
//! RFC 8259 leaves the meaning of `{"a":1,"a":2}` to the reader, and readers disagree:
//! `serde_json` (and so the sinks' and scripts' view of a record) keeps the last copy, the
//! set filter's raw-bytes extractor (`sluice-filter`) stops at the first. A record read two
//! ways could pass the filter on one value and be delivered with the other, so Sluice
//! accepts no document with a repeated key: every record ingested and every request body is
//! parsed here.
//!
//! The check costs one map lookup per key, the lookup the map insert does anyway: a serde
//! visitor builds the [`Map`] and inserts through the entry API, failing on an occupied
//! entry. The path of the repeated key is only assembled when there is one.
//!
//! Also, for the readers that walk a record's bytes themselves (the set filter's extractor,
//! the script engine's parser, the warehouse's field reader): [`find_quote_or_backslash`],
//! [`string_end`] and [`find_string_special`] to find where a string ends or needs care,
//! [`unescape_into`] to resolve its escapes, [`container_end`] and [`skip_ws`] to step over
//! what they do not read.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::map::Entry;
use serde_json::{Map, Number, Value};

use crate::validation::LocItem;

/// Why a document was refused.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// Not JSON (syntax, nesting past 128 levels, trailing characters).
    #[error("{0}")]
    Syntax(serde_json::Error),
    /// An object holds the key at the end of `path` twice; `path` leads to it from the root.
    #[error("duplicate key {}", describe_path(path))]
    DuplicateKey { path: Vec<LocItem> },
}

impl JsonError {
    /// The path of the repeated key, for a [`JsonError::DuplicateKey`].
    pub fn duplicate_path(&self) -> Option<&[LocItem]> {
        match self {
            Self::DuplicateKey { path } => Some(path),
            Self::Syntax(_) => None,
        }
    }
}

/// `"token_address"` or `"a"."b"[2]."c"`: a key path as a message shows it.
pub fn describe_path(path: &[LocItem]) -> String {
    let mut out = String::new();
    for (index, item) in path.iter().enumerate() {
        match item {
            LocItem::Field(name) => {
                if index > 0 {
                    out.push('.');
                }
                // Debug quoting escapes control characters and quotes in the key.
                out.push_str(&format!("{name:?}"));
            }
            LocItem::Index(at) => out.push_str(&format!("[{at}]")),
        }
    }
    out
}

/// Parses one JSON document, refusing a repeated key in any object.
///
/// # Errors
/// [`JsonError::Syntax`] for malformed JSON, [`JsonError::DuplicateKey`] for a repeated key.
pub fn parse(bytes: &[u8]) -> Result<Value, JsonError> {
    parse_with(bytes, None)
}

/// [`parse`] building everything (`None`) or only what `paths` names ([`parse_picked`]).
fn parse_with(bytes: &[u8], paths: Option<&Paths>) -> Result<Value, JsonError> {
    let duplicate = RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed = match paths {
        None => Strict { duplicate: &duplicate }.deserialize(&mut deserializer),
        Some(paths) => {
            Picker { duplicate: &duplicate, paths: Some(paths) }.deserialize(&mut deserializer)
        }
    }
    .and_then(|value| deserializer.end().map(|()| value));
    match (parsed, duplicate.into_inner()) {
        (_, Some(path)) => Err(JsonError::DuplicateKey { path }),
        (Ok(value), None) => Ok(value),
        (Err(error), None) => Err(JsonError::Syntax(error)),
    }
}

/// A [`Value`] visitor that fails on a repeated key. On failure it leaves the key's path in
/// `duplicate`: the innermost object starts it, every enclosing level prepends its step as
/// the error passes through.
#[derive(Clone, Copy)]
struct Strict<'a> {
    duplicate: &'a RefCell<Option<Vec<LocItem>>>,
}

impl Strict<'_> {
    fn prepend(self, item: LocItem) {
        if let Some(path) = self.duplicate.borrow_mut().as_mut() {
            path.insert(0, item);
        }
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        loop {
            match seq.next_element_seed(self) {
                Ok(Some(item)) => items.push(item),
                Ok(None) => return Ok(Value::Array(items)),
                Err(error) => {
                    self.prepend(LocItem::Index(items.len()));
                    return Err(error);
                }
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let value = match access.next_value_seed(self) {
                Ok(value) => value,
                Err(error) => {
                    self.prepend(LocItem::Field(key));
                    return Err(error);
                }
            };
            match map.entry(key) {
                Entry::Vacant(entry) => {
                    entry.insert(value);
                }
                Entry::Occupied(entry) => {
                    let key = entry.key().clone();
                    *self.duplicate.borrow_mut() = Some(vec![LocItem::Field(key.clone())]);
                    return Err(de::Error::custom(format_args!("duplicate key {key:?}")));
                }
            }
        }
        Ok(Value::Object(map))
    }
}

/// Member paths of a document, for [`parse_picked`]: `payload.order.oid` steps into nested
/// objects. A path that ends at a member takes its whole value.
#[derive(Debug, Clone, Default)]
pub struct Paths {
    whole: bool,
    members: Vec<(String, Paths)>,
}

impl Paths {
    /// No path: a document parsed with it is only checked.
    pub const fn new() -> Self {
        Self { whole: false, members: Vec::new() }
    }

    /// Adds the member at `dotted` (`"a.b"`: the member `b` of the object at `a`).
    pub fn add(&mut self, dotted: &str) {
        let mut node = self;
        for name in dotted.split('.') {
            let index = match node.members.iter().position(|(known, _)| known == name) {
                Some(index) => index,
                None => {
                    node.members.push((name.to_owned(), Paths::default()));
                    node.members.len() - 1
                }
            };
            node = &mut node.members[index].1;
        }
        node.whole = true;
    }

    fn member(&self, name: &str) -> Option<&Paths> {
        self.members.iter().find(|(known, _)| known == name).map(|(_, paths)| paths)
    }
}

/// Parses one JSON document as [`parse`] does, with the same errors (syntax, and a repeated
/// key at any depth with its path), but builds only what `paths` names: the objects on the
/// way hold only the members on a path, a path's last member is built whole, and anything
/// else (a non-object where a path steps further, a member on no path) is read, checked and
/// left `null`. For callers that read a few fields of a large document: it allocates for
/// what they read, not for every string and map of the document.
///
/// # Errors
/// As [`parse`].
pub fn parse_picked(bytes: &[u8], paths: &Paths) -> Result<Value, JsonError> {
    parse_with(bytes, Some(paths))
}

/// [`Strict`] that builds only the members on `paths` (none when `None`: the value is only
/// checked). Keys are compared borrowed from the document, as [`Strict`] compares them
/// unescaped.
#[derive(Clone, Copy)]
struct Picker<'a> {
    duplicate: &'a RefCell<Option<Vec<LocItem>>>,
    paths: Option<&'a Paths>,
}

/// An object key, borrowed when it has no escapes.
struct Key<'de>(std::borrow::Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, value: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(value)))
            }
            fn visit_str<E>(self, value: &str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(value.to_owned())))
            }
            fn visit_string<E>(self, value: String) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(value)))
            }
        }
        deserializer.deserialize_string(KeyVisitor)
    }
}

impl Picker<'_> {
    /// Whether the value is built whole ([`Strict`]), in part (an object on a path) or not.
    fn whole(self) -> bool {
        self.paths.is_some_and(|paths| paths.whole)
    }

    fn prepend(self, item: LocItem) {
        Strict { duplicate: self.duplicate }.prepend(item);
    }
}

impl<'de> DeserializeSeed<'de> for Picker<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        if self.whole() {
            return Strict { duplicate: self.duplicate }.deserialize(deserializer);
        }
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Picker<'_> {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        // Nothing on a path is inside an array: its items are only checked.
        let skip = Picker { paths: None, ..self };
        let mut index = 0;
        loop {
            match seq.next_element_seed(skip) {
                Ok(Some(_)) => index += 1,
                Ok(None) => return Ok(Value::Null),
                Err(error) => {
                    self.prepend(LocItem::Index(index));
                    return Err(error);
                }
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        // Past this many keys, a set finds a repeat (a linear search is cheaper before: the
        // keys' hashes first, so that the text of two keys is compared only when they match).
        const LINEAR: usize = 32;
        let mut map = Map::new();
        let mut keys: Vec<(u64, std::borrow::Cow<'de, str>)> = Vec::new();
        let mut set: Option<std::collections::HashSet<std::borrow::Cow<'de, str>>> = None;
        while let Some(Key(key)) = access.next_key::<Key<'de>>()? {
            let paths = self.paths.and_then(|paths| paths.member(&key));
            let value = match access.next_value_seed(Picker { paths, ..self }) {
                Ok(value) => value,
                Err(error) => {
                    self.prepend(LocItem::Field(key.into_owned()));
                    return Err(error);
                }
            };
            let repeated = match &mut set {
                Some(set) => !set.insert(key.clone()),
                None => {
                    let hash = fnv1a(key.as_bytes());
                    if keys.iter().any(|(h, known)| *h == hash && *known == key) {
                        true
                    } else {
                        keys.push((hash, key.clone()));
                        if keys.len() > LINEAR {
                            set = Some(keys.drain(..).map(|(_, key)| key).collect());
                        }
                        false
                    }
                }
            };
            if repeated {
                let key = key.into_owned();
                *self.duplicate.borrow_mut() = Some(vec![LocItem::Field(key.clone())]);
                return Err(de::Error::custom(format_args!("duplicate key {key:?}")));
            }
            if paths.is_some() {
                map.insert(key.into_owned(), value);
            }
        }
        Ok(if self.paths.is_some() { Value::Object(map) } else { Value::Null })
    }
}

/// FNV-1a, for telling short keys apart quickly.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Resolves the escapes of a JSON string's contents (the text between its quotes) and
/// appends the result to `out`; `None` for an invalid escape or a lone surrogate (`out`
/// then holds part of the string).
pub fn unescape_into(raw: &str, out: &mut String) -> Option<()> {
    let mut rest = raw;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let escape = *rest.as_bytes().get(at + 1)?;
        if !matches!(escape, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' | b'u') {
            return None;
        }
        // The escape is ASCII, so this slices at a char boundary.
        rest = &rest[at + 2..];
        let ch = match escape {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            _ => {
                let unit = hex4(rest)?;
                rest = &rest[4..];
                match unit {
                    0xd800..=0xdbff => {
                        let low = rest.strip_prefix("\\u").and_then(hex4)?;
                        if !(0xdc00..=0xdfff).contains(&low) {
                            return None;
                        }
                        rest = &rest[6..];
                        char::from_u32(0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00))?
                    }
                    _ => char::from_u32(unit)?,
                }
            }
        };
        out.push(ch);
    }
    out.push_str(rest);
    Some(())
}

/// The value of the four hex digits that start `text`.
fn hex4(text: &str) -> Option<u32> {
    let digits = text.get(..4)?;
    if !digits.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

/// The position of the first `"` or `\` in `bytes`: where a JSON string's text ends or has
/// an escape.
///
/// Sixteen bytes at a time (SSE2 on x86-64, two `u64` words elsewhere), then a word, then
/// single bytes: JSON keys and values are mostly short, where this beats `memchr2`'s
/// per-call dispatch and setup.
#[inline]
pub fn find_quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    find_in_string(bytes, false)
}

/// For a JSON string whose text starts at `start` (just past its opening quote): the
/// position of its closing quote, and whether the text has escapes. Escapes are skipped, not
/// checked; `None` when the string does not end.
#[inline]
pub fn string_end(bytes: &[u8], start: usize) -> Option<(usize, bool)> {
    let mut pos = start;
    let mut escaped = false;
    loop {
        let found = pos + find_quote_or_backslash(bytes.get(pos..)?)?;
        if bytes[found] == b'"' {
            return Some((found, escaped));
        }
        escaped = true;
        pos = found + 2;
    }
}

/// How deeply nested a container [`container_end`] skips may be (`serde_json`, which parses
/// every record at ingest, refuses nesting past 128 levels too).
pub const MAX_CONTAINER_DEPTH: u32 = 128;

/// The position just past the object or array at `pos`, checking only that strings end,
/// brackets match and nesting stays within [`MAX_CONTAINER_DEPTH`]; `None` otherwise.
pub fn container_end(bytes: &[u8], pos: usize) -> Option<usize> {
    // Bit `n` says whether the container at depth `n + 1` (counted from the innermost) is an
    // array; `MAX_CONTAINER_DEPTH` bits.
    let mut arrays: u128 = 0;
    let mut depth = 0;
    let mut pos = pos;
    while let Some(&byte) = bytes.get(pos) {
        match byte {
            b'"' => pos = string_end(bytes, pos + 1)?.0,
            b'{' | b'[' => {
                if depth == MAX_CONTAINER_DEPTH {
                    return None;
                }
                arrays = (arrays << 1) | u128::from(byte == b'[');
                depth += 1;
            }
            b'}' | b']' => {
                if depth == 0 || (arrays & 1 == 1) != (byte == b']') {
                    return None;
                }
                arrays >>= 1;
                depth -= 1;
                if depth == 0 {
                    return Some(pos + 1);
                }
            }
            _ => {}
        }
        pos += 1;
    }
    None
}

/// The position of the first byte at or after `pos` that is not JSON whitespace.
#[inline]
pub fn skip_ws(bytes: &[u8], mut pos: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\r' | b'\t') = bytes.get(pos) {
        pos += 1;
    }
    pos
}

/// The position of the first byte of `bytes` that a JSON string cannot hold as it is: `"`,
/// `\` or a control character (below 0x20). Sixteen bytes at a time, as
/// [`find_quote_or_backslash`].
#[inline]
pub fn find_string_special(bytes: &[u8]) -> Option<usize> {
    find_in_string(bytes, true)
}

/// The search of both functions above; `controls` is a constant once inlined.
#[inline(always)]
fn find_in_string(bytes: &[u8], controls: bool) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const SPACES: u64 = u64::from_ne_bytes([0x20; 8]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    const BACKSLASHES: u64 = u64::from_ne_bytes([b'\\'; 8]);
    // The high bit of every byte of `word` below `limit` (and maybe of bytes after the
    // first such byte, through borrows: the lowest set bit is exact).
    let below = |word: u64, limit: u64| word.wrapping_sub(limit) & !word & HIGHS;
    let special = |chunk: &[u8; 8]| {
        let word = u64::from_le_bytes(*chunk);
        let found = below(word ^ QUOTES, ONES) | below(word ^ BACKSLASHES, ONES);
        if controls { found | below(word, SPACES) } else { found }
    };
    // Sixteen bytes a round, one branch for them: strings of hashes and addresses are 40-66
    // bytes, where the loop's own bookkeeping costs as much as the search.
    let mut pos = 0;
    while let Some(pair) = bytes.get(pos..pos + 16) {
        #[cfg(target_arch = "x86_64")]
        {
            let found = sse2::special_bytes(pair.try_into().expect("sixteen bytes"), controls);
            if found != 0 {
                return Some(pos + found.trailing_zeros() as usize);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let (low, high) = pair.split_at(8);
            let low = special(low.try_into().expect("eight bytes"));
            let high = special(high.try_into().expect("eight bytes"));
            if low | high != 0 {
                let at =
                    if low != 0 { low.trailing_zeros() / 8 } else { 8 + high.trailing_zeros() / 8 };
                return Some(pos + at as usize);
            }
        }
        pos += 16;
    }
    if let Some(chunk) = bytes.get(pos..pos + 8) {
        let found = special(chunk.try_into().expect("eight bytes"));
        if found != 0 {
            return Some(pos + (found.trailing_zeros() / 8) as usize);
        }
        pos += 8;
    }
    bytes[pos..]
        .iter()
        .position(|&byte| byte == b'"' || byte == b'\\' || (controls && byte < 0x20))
        .map(|at| pos + at)
}

/// Sixteen bytes at a time with SSE2, part of every x86-64 CPU.
///
/// The one module of `sluice-core` that may use `unsafe` (the crate denies it): the
/// intrinsics are `unsafe` to call outside a `#[target_feature]` function even where the
/// target has the feature.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod sse2 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };

    /// Bit `i` is set when byte `i` of `chunk` is `"` or `\\` (or, with `controls`, below
    /// 0x20).
    #[inline(always)]
    pub(super) fn special_bytes(chunk: &[u8; 16], controls: bool) -> u32 {
        // SAFETY: SSE2 is in the x86-64 baseline, so these instructions exist on every CPU
        // this build runs on; the load reads exactly the sixteen bytes `chunk` borrows, and
        // `loadu` needs no alignment.
        unsafe {
            let bytes = _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>());
            let mut found = _mm_or_si128(
                _mm_cmpeq_epi8(bytes, _mm_set1_epi8(b'"' as i8)),
                _mm_cmpeq_epi8(bytes, _mm_set1_epi8(b'\\' as i8)),
            );
            if controls {
                // `min(b, 0x1f) == b` exactly when `b` is at most 0x1f (unsigned).
                let low = _mm_cmpeq_epi8(_mm_min_epu8(bytes, _mm_set1_epi8(0x1f)), bytes);
                found = _mm_or_si128(found, low);
            }
            _mm_movemask_epi8(found) as u32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_picked_parse_fails_as_the_full_parse_and_builds_what_its_paths_name() {
        let mut paths = Paths::new();
        for path in ["a.b", "c", "p.q.r", "p.q", "s.t"] {
            paths.add(path);
        }
        let many = |repeat: bool| {
            let mut members: Vec<String> = (0..40).map(|i| format!("\"k{i}\":{i}")).collect();
            if repeat {
                members.push("\"k7\":1".into());
            }
            format!("{{\"a\":{{{}}}}}", members.join(","))
        };
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let docs = [
            r#"{"a":{"b":1,"x":[1,{"y":2,"y":3}]},"c":"z"}"#.to_owned(),
            r#"{"a":1,"a":2}"#.to_owned(),
            r#"{"\u0061":1,"a":2}"#.to_owned(),
            r#"{"a":{"b":[1,2}}"#.to_owned(),
            r#"{"a":1} x"#.to_owned(),
            r#"[1,2,{"k":1,"k":2}]"#.to_owned(),
            r#""text""#.to_owned(),
            "1e400".to_owned(),
            r#"{"a":"\ud800"}"#.to_owned(),
            "{\"a\":\"\u{1}\"}".to_owned(),
            r#"{"c":{"d":{"e":1}},"a":{"b":{"z":[true,null,-0.5,"s\n"]},"b2":2},"s":"x"}"#
                .to_owned(),
            r#"{"p":{"q":{"r":{"deep":[1]},"o":"x"}},"p2":1,"s":{"t":7,"u":{"v":1,"v":2}}}"#
                .to_owned(),
            r#"{"p":{"q":{"r":1}},"p":{}}"#.to_owned(),
            r#"{"c":{"x":1},"c":2}"#.to_owned(),
            many(false),
            many(true),
            deep,
        ];
        for doc in &docs {
            let full = parse(doc.as_bytes());
            let picked = parse_picked(doc.as_bytes(), &paths);
            match (&full, &picked) {
                (Ok(full), Ok(picked)) => {
                    for pointer in ["/a/b", "/c", "/p/q", "/p/q/r", "/s/t"] {
                        let want = full.pointer(pointer);
                        // Only objects are stepped into: a path through anything else is cut.
                        let reachable = pointer.rsplit_once('/').is_some_and(|(up, _)| {
                            up.is_empty() || full.pointer(up).is_some_and(Value::is_object)
                        });
                        let want = want.filter(|_| reachable);
                        assert_eq!(picked.pointer(pointer), want, "{doc} at {pointer}");
                    }
                    assert!(picked.pointer("/a/x").is_none() && picked.get("p2").is_none());
                }
                (Err(full), Err(picked)) => {
                    assert_eq!(full.to_string(), picked.to_string(), "{doc}");
                    assert_eq!(full.duplicate_path(), picked.duplicate_path(), "{doc}");
                }
                _ => panic!("{doc}: {full:?} but picked {picked:?}"),
            }
            assert_eq!(full.is_ok(), picked.is_ok());
            if let (Ok(full), Ok(picked)) = (full, picked) {
                assert_eq!(full.is_object(), picked.is_object(), "{doc}");
            }
        }
        assert!(
            parse_picked(many(true).as_bytes(), &Paths::new())
                .unwrap_err()
                .duplicate_path()
                .is_some()
        );
    }

    #[test]
    fn the_word_at_a_time_search_finds_the_first_quote_or_backslash() {
        for len in 0..40 {
            for (at, special) in (0..len).flat_map(|at| [(at, b'"'), (at, b'\\')]) {
                let mut bytes: Vec<u8> =
                    (0..len).map(|i| b"ab\x00\x7f\xff\x22\x5b"[i % 6] ^ 1).collect();
                bytes[at] = special;
                if at + 3 < len {
                    bytes[at + 3] = b'"';
                }
                assert_eq!(find_quote_or_backslash(&bytes), Some(at), "{bytes:?}");
            }
            let plain = vec![b'a'; len];
            assert_eq!(find_quote_or_backslash(&plain), None);
        }
    }

    #[test]
    fn special_bytes_are_found_at_every_position_among_any_bytes() {
        let naive = |bytes: &[u8]| bytes.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
        // Every special byte and its neighbours (0x1f/0x20, 0x21/0x23, 0x5b/0x5d, high bytes
        // that differ from them only in the top bit), at every offset of a 40-byte run: two
        // sixteen-byte rounds, a word and single bytes.
        for special in [
            b'"', b'\\', 0x00, 0x1f, 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0x9f,
            0xff,
        ] {
            for filler in [b'a', 0x20, 0x7f, 0x80, 0xff, 0xa2] {
                for at in 0..40 {
                    let mut bytes = vec![filler; 40];
                    bytes[at] = special;
                    for len in 0..=40 {
                        assert_eq!(
                            find_string_special(&bytes[..len]),
                            naive(&bytes[..len]),
                            "{bytes:?}[..{len}]"
                        );
                    }
                }
            }
        }
    }

    fn duplicate(text: &str) -> Option<String> {
        match parse(text.as_bytes()) {
            Err(JsonError::DuplicateKey { path }) => Some(describe_path(&path)),
            Err(JsonError::Syntax(error)) => panic!("{text}: syntax error {error}"),
            Ok(_) => None,
        }
    }

    #[test]
    fn a_repeated_key_at_any_depth_is_refused_with_its_path() {
        assert_eq!(duplicate(r#"{"a":1,"a":2}"#).as_deref(), Some(r#""a""#));
        assert_eq!(
            duplicate(r#"{"a":"x","b":{"c":[1,{"d":1,"d":1}]}}"#).as_deref(),
            Some(r#""b"."c"[1]."d""#)
        );
        assert_eq!(duplicate(r#"[{"a":1},{"a":2,"\u0061":3}]"#).as_deref(), Some(r#"[1]."a""#));
        assert_eq!(duplicate(r#"{"a":{"x":1},"b":{"x":1}}"#), None);
    }

    #[test]
    fn documents_without_repeats_read_as_serde_json_reads_them() {
        for text in [
            r#"{"a":[1,-2,3.5,1e400,true,null,"s\u00e9"],"b":{"c":{}},"d":18446744073709551615}"#,
            "[]",
            "\"x\"",
            " 12 ",
        ] {
            let expected: Result<Value, _> = serde_json::from_str(text);
            match expected {
                Ok(expected) => assert_eq!(parse(text.as_bytes()).unwrap(), expected, "{text}"),
                Err(_) => assert!(matches!(parse(text.as_bytes()), Err(JsonError::Syntax(_)))),
            }
        }
    }

    #[test]
    fn malformed_documents_are_syntax_errors() {
        for text in ["", "{", r#"{"a":1}x"#, r#"{"a":1,}"#, "[1,]"] {
            assert!(matches!(parse(text.as_bytes()), Err(JsonError::Syntax(_))), "{text}");
        }
    }
}
