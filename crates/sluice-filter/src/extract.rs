//! [`extract`]: the value at a path in a record's raw JSON bytes, found without building a
//! document.
//!
//! The walk reads each level's keys (or array elements) in order and skips the values it
//! does not need: strings by searching eight bytes at a time for `"` and `\`, containers by
//! counting depth (outside strings), scalars by their grammar. It stops at the value it
//! wants, so the cost is the bytes before that value.
//!
//! # What is checked
//! Everything the walk reads on its way must be well-formed JSON, and so must the value it
//! returns (string escapes, UTF-8, no raw control characters; number grammar), followed by
//! `,` or the enclosing closer. Inside a skipped container only the structure is checked
//! (strings terminated, brackets balanced and matching, at most [`MAX_SKIP_DEPTH`] levels),
//! and nothing after the returned value is read; a record malformed only there may still
//! yield a value. Keys without escapes are compared byte for byte and not otherwise checked.
//!
//! # Duplicate keys
//! The first occurrence of a key wins: the walk stops there. (`serde_json` keeps the last.)
//! Records never hold one: ingest refuses a record with a repeated key at any depth
//! (`sluice_core::json`), so on every stored record this walk and a JSON parser agree.

use std::borrow::Cow;

use sluice_core::filter_expr::PathSegment;
use sluice_core::json::{container_end, skip_ws, string_end};

/// How deeply nested a skipped container may be; deeper ones make the record malformed
/// (`serde_json` refuses nesting past 128 levels too).
pub const MAX_SKIP_DEPTH: u32 = sluice_core::json::MAX_CONTAINER_DEPTH;

/// A scalar found at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extracted<'a> {
    /// A JSON string, unescaped; borrowed from the record when it had no escapes.
    Str(Cow<'a, str>),
    /// A JSON number, as its literal text (`1e5`, `-0.50`), never reformatted.
    Number(&'a str),
}

impl Extracted<'_> {
    /// The string's text, or the number's literal text.
    pub fn text(&self) -> &str {
        match self {
            Self::Str(text) => text,
            Self::Number(literal) => literal,
        }
    }
}

/// The string or number at `path` in the JSON document `record`.
///
/// `None` when the path is missing (no such key, index past the end, a step into a scalar),
/// when the value there is an object, array, `true`, `false` or `null`, and when the bytes the
/// walk reads are not JSON (see the [module docs](self) for what is checked). An empty path
/// names the whole document.
pub fn extract<'a>(record: &'a [u8], path: &[PathSegment]) -> Option<Extracted<'a>> {
    let steps = path.iter().map(|segment| match segment {
        PathSegment::Field(name) => Step::Field { name: name.as_bytes(), plain: is_plain(name) },
        PathSegment::Index(index) => Step::Index(*index),
    });
    Some(match walk(record, steps)? {
        Scalar::Text { bytes, .. } => {
            Extracted::Str(Cow::Borrowed(std::str::from_utf8(bytes).ok()?))
        }
        Scalar::Number(bytes) => Extracted::Number(std::str::from_utf8(bytes).ok()?),
        Scalar::Unescaped(text) => Extracted::Str(Cow::Owned(text)),
    })
}

/// A path prepared once for walking many records: [`extract`]'s walk without the per-call
/// look at each key's characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PreparedPath(Vec<PreparedStep>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum PreparedStep {
    Field { name: Box<str>, plain: bool },
    Index(usize),
}

impl PreparedPath {
    pub(crate) fn new(path: &[PathSegment]) -> Self {
        Self(
            path.iter()
                .map(|segment| match segment {
                    PathSegment::Field(name) => {
                        PreparedStep::Field { name: name.as_str().into(), plain: is_plain(name) }
                    }
                    PathSegment::Index(index) => PreparedStep::Index(*index),
                })
                .collect(),
        )
    }

    /// What [`extract`] finds at this path, as the record's bytes where it can.
    #[inline]
    pub(crate) fn scalar<'a>(&self, record: &'a [u8]) -> Option<Scalar<'a>> {
        walk(
            record,
            self.0.iter().map(|step| match step {
                PreparedStep::Field { name, plain } => {
                    Step::Field { name: name.as_bytes(), plain: *plain }
                }
                PreparedStep::Index(index) => Step::Index(*index),
            }),
        )
    }
}

/// A scalar found by the walk, before it is made a [`Extracted`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scalar<'a> {
    /// A string without escapes: its bytes, valid UTF-8 without control characters, and
    /// whether they are all ASCII.
    Text { bytes: &'a [u8], ascii: bool },
    /// A number's literal (ASCII).
    Number(&'a [u8]),
    /// A string with escapes, resolved.
    Unescaped(String),
}

impl Scalar<'_> {
    /// The value's text as bytes, and whether they are all ASCII.
    #[inline]
    pub(crate) fn bytes(&self) -> (&[u8], bool) {
        match self {
            Self::Text { bytes, ascii } => (bytes, *ascii),
            Self::Number(bytes) => (bytes, true),
            Self::Unescaped(text) => (text.as_bytes(), text.is_ascii()),
        }
    }
}

/// One step of a path, as the walk takes it.
#[derive(Clone, Copy)]
enum Step<'p> {
    /// A key, and whether it holds neither `"` nor `\` (so a key written plainly in a record
    /// can be compared byte for byte).
    Field {
        name: &'p [u8],
        plain: bool,
    },
    Index(usize),
}

fn is_plain(name: &str) -> bool {
    !name.bytes().any(|byte| byte == b'"' || byte == b'\\')
}

#[inline]
fn walk<'a, 'p>(record: &'a [u8], steps: impl Iterator<Item = Step<'p>>) -> Option<Scalar<'a>> {
    let mut pos = skip_ws(record, 0);
    let mut closer = None;
    for step in steps {
        match step {
            Step::Field { name, plain } => {
                pos = find_field(record, pos, name, plain)?;
                closer = Some(b'}');
            }
            Step::Index(index) => {
                pos = find_index(record, pos, index)?;
                closer = Some(b']');
            }
        }
    }
    scalar_at(record, pos, closer)
}

/// The position of the value of key `name` in the object at `pos`; `name_is_plain` says
/// whether `name` holds neither `"` nor `\`.
#[inline]
fn find_field(record: &[u8], pos: usize, name: &[u8], name_is_plain: bool) -> Option<usize> {
    if record.get(pos) != Some(&b'{') {
        return None;
    }
    let mut pos = skip_ws(record, pos + 1);
    if record.get(pos) == Some(&b'}') {
        return None;
    }
    loop {
        if record.get(pos) != Some(&b'"') {
            return None;
        }
        let key_start = pos + 1;
        let name_end = key_start + name.len();
        // Most keys are written plainly: when the bytes are `name"`, that is the key. The
        // closing quote is checked first, as it rules out most keys without a comparison.
        let (key_end, is_match) = if name_is_plain
            && record.get(name_end) == Some(&b'"')
            && record.get(key_start..name_end) == Some(name)
        {
            (name_end, true)
        } else {
            let (key_end, escaped) = string_end(record, key_start)?;
            // A key without escapes that is `name` took the branch above.
            let is_match = escaped && unescaped_key_is(&record[key_start..key_end], name)?;
            (key_end, is_match)
        };
        pos = skip_ws(record, key_end + 1);
        if record.get(pos) != Some(&b':') {
            return None;
        }
        pos = skip_ws(record, pos + 1);
        if is_match {
            return Some(pos);
        }
        // Strings and numbers, the values records are made of, are skipped here; the rest
        // by a call.
        pos = match record.get(pos)? {
            b'"' => string_end(record, pos + 1)?.0 + 1,
            b'-' | b'0'..=b'9' => number_end(record, pos)?,
            _ => skip_value(record, pos)?,
        };
        pos = skip_ws(record, pos);
        match record.get(pos) {
            Some(b',') => pos = skip_ws(record, pos + 1),
            _ => return None,
        }
    }
}

/// The position of element `index` of the array at `pos`.
fn find_index(record: &[u8], pos: usize, index: usize) -> Option<usize> {
    if record.get(pos) != Some(&b'[') {
        return None;
    }
    let mut pos = skip_ws(record, pos + 1);
    if record.get(pos) == Some(&b']') {
        return None;
    }
    for _ in 0..index {
        pos = skip_ws(record, skip_value(record, pos)?);
        match record.get(pos) {
            Some(b',') => pos = skip_ws(record, pos + 1),
            _ => return None,
        }
    }
    Some(pos)
}

/// The string or number at `pos`, which must be followed by `,` or `closer` (or, for the
/// whole document, by nothing but whitespace).
#[inline]
fn scalar_at(record: &[u8], pos: usize, closer: Option<u8>) -> Option<Scalar<'_>> {
    let (value, end) = match record.get(pos)? {
        b'"' => {
            let (end, escaped) = string_end(record, pos + 1)?;
            let raw = &record[pos + 1..end];
            let ascii = is_printable_ascii(raw);
            if !ascii && (has_control_byte(raw) || std::str::from_utf8(raw).is_err()) {
                return None;
            }
            let value = if escaped {
                let text = std::str::from_utf8(raw).ok()?;
                Scalar::Unescaped(unescape(text)?)
            } else {
                Scalar::Text { bytes: raw, ascii }
            };
            (value, end + 1)
        }
        b'-' | b'0'..=b'9' => {
            let end = number_end(record, pos)?;
            (Scalar::Number(&record[pos..end]), end)
        }
        _ => return None,
    };
    let after = skip_ws(record, end);
    let terminated = match closer {
        Some(closer) => matches!(record.get(after), Some(&byte) if byte == b',' || byte == closer),
        None => after == record.len(),
    };
    terminated.then_some(value)
}

/// Whether every byte of `bytes` is ASCII and none is a control character (below 0x20):
/// such a string is valid UTF-8 that JSON may hold raw. Eight bytes at a time.
#[inline]
fn is_printable_ascii(bytes: &[u8]) -> bool {
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const LOWS: u64 = u64::from_ne_bytes([0x7f; 8]);
    const FROM_SPACE: u64 = u64::from_ne_bytes([0x80 - 0x20; 8]);
    // Per byte, no carries between bytes: the high bit of `(b & 0x7f) + 0x60` is set when
    // `b & 0x7f` is at least 0x20, and `!b`'s when `b` is ASCII.
    let good = |word: u64| !word & ((word & LOWS) + FROM_SPACE) & HIGHS == HIGHS;
    let mut words = bytes.chunks_exact(8);
    let words_good = words.by_ref().fold(true, |good_so_far, chunk| {
        good_so_far & good(u64::from_le_bytes(chunk.try_into().expect("eight bytes")))
    });
    words_good && words.remainder().iter().all(|&byte| (0x20..0x80).contains(&byte))
}

/// The position just past the value at `pos`.
#[inline]
fn skip_value(record: &[u8], pos: usize) -> Option<usize> {
    match record.get(pos)? {
        b'"' => string_end(record, pos + 1).map(|(end, _)| end + 1),
        b'{' | b'[' => container_end(record, pos),
        b'-' | b'0'..=b'9' => number_end(record, pos),
        b't' => literal_end(record, pos, b"true"),
        b'f' => literal_end(record, pos, b"false"),
        b'n' => literal_end(record, pos, b"null"),
        _ => None,
    }
}

fn literal_end(record: &[u8], pos: usize, literal: &[u8]) -> Option<usize> {
    let end = pos + literal.len();
    (record.get(pos..end)? == literal).then_some(end)
}

/// Whether `bytes` holds a byte JSON strings may not hold raw (below 0x20). A fold, not
/// `any`: without the early exit it compiles to vector code.
#[inline]
fn has_control_byte(bytes: &[u8]) -> bool {
    bytes.iter().fold(false, |found, &byte| found | (byte < 0x20))
}

/// The position just past the number at `pos`:
/// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
#[inline]
fn number_end(record: &[u8], pos: usize) -> Option<usize> {
    let digits_from = |pos: usize| {
        let end = digits_end(record, pos);
        (end > pos).then_some(end)
    };
    let mut pos = pos;
    if record.get(pos) == Some(&b'-') {
        pos += 1;
    }
    pos = match record.get(pos)? {
        b'0' => pos + 1,
        b'1'..=b'9' => digits_from(pos)?,
        _ => return None,
    };
    if record.get(pos) == Some(&b'.') {
        pos = digits_from(pos + 1)?;
    }
    if matches!(record.get(pos), Some(b'e' | b'E')) {
        pos += 1;
        if matches!(record.get(pos), Some(b'+' | b'-')) {
            pos += 1;
        }
        pos = digits_from(pos)?;
    }
    Some(pos)
}

/// The position of the first byte at or after `pos` that is not an ASCII digit (or the
/// record's end). Eight bytes at a time.
#[inline]
fn digits_end(record: &[u8], pos: usize) -> usize {
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const LOWS: u64 = u64::from_ne_bytes([0x7f; 8]);
    const ZEROS: u64 = u64::from_ne_bytes([b'0'; 8]);
    const FROM_TEN: u64 = u64::from_ne_bytes([0x80 - 10; 8]);
    let mut pos = pos;
    while let Some(chunk) = record.get(pos..pos + 8) {
        // A digit is a byte whose `b ^ b'0'` is below 10. Per byte, no carries between
        // bytes: the high bit of `(t & 0x7f) + 0x76` is set when `t & 0x7f` is 10 or more,
        // and `t`'s when `t` is 0x80 or more.
        let t = u64::from_le_bytes(chunk.try_into().expect("eight bytes")) ^ ZEROS;
        let other = (((t & LOWS) + FROM_TEN) | t) & HIGHS;
        if other != 0 {
            return pos + (other.trailing_zeros() / 8) as usize;
        }
        pos += 8;
    }
    while record.get(pos).is_some_and(u8::is_ascii_digit) {
        pos += 1;
    }
    pos
}

/// Whether the escaped key `raw` (between its quotes) reads `name`; `None` when the key is
/// not a valid JSON string.
fn unescaped_key_is(raw: &[u8], name: &[u8]) -> Option<bool> {
    if has_control_byte(raw) {
        return None;
    }
    let key = unescape(std::str::from_utf8(raw).ok()?)?;
    Some(key.as_bytes() == name)
}

/// Resolves the escapes of a JSON string's contents; `None` for an invalid escape or a lone
/// surrogate.
fn unescape(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    sluice_core::json::unescape_into(raw, &mut out)?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(text: &str) -> Vec<PathSegment> {
        text.split('.')
            .map(|segment| match segment.parse() {
                Ok(index) => PathSegment::Index(index),
                Err(_) => PathSegment::Field(segment.to_owned()),
            })
            .collect()
    }

    fn get<'a>(record: &'a str, at: &str) -> Option<Extracted<'a>> {
        extract(record.as_bytes(), &path(at))
    }

    fn string(text: &str) -> Option<Extracted<'_>> {
        Some(Extracted::Str(Cow::Borrowed(text)))
    }

    #[test]
    fn finds_strings_and_numbers_past_other_fields() {
        let record = r#" { "a" : {"x":[1,"}]\"",{}]} , "n":-1.5E+3,"token":"0xAb" , "z":null } "#;
        assert_eq!(get(record, "token"), string("0xAb"));
        assert_eq!(get(record, "n"), Some(Extracted::Number("-1.5E+3")));
        assert_eq!(get(record, "a.x.1"), string("}]\""));
        assert!(matches!(get(record, "a.x.1"), Some(Extracted::Str(Cow::Owned(_)))));
        assert_eq!(get(record, "a.x.0"), Some(Extracted::Number("1")));
    }

    #[test]
    fn missing_paths_and_non_scalars_yield_nothing() {
        let record = r#"{"a":{"b":[true,false,null,{},[]]},"s":"x"}"#;
        for at in ["b", "a.c", "a.b.5", "a.b.0", "a.b.1", "a.b.2", "a.b.3", "a.b.4", "a", "s.0"] {
            assert_eq!(get(record, at), None, "{at}");
        }
        assert_eq!(get(r#"{"a":[]}"#, "a.0"), None);
        assert_eq!(get("{}", "a"), None);
    }

    #[test]
    fn the_first_of_duplicate_keys_wins() {
        assert_eq!(get(r#"{"a":"first","a":"second"}"#, "a"), string("first"));
    }

    #[test]
    fn escaped_keys_match_their_unescaped_name() {
        let record = r#"{"tok\u0065n_address":"0x1","token\"":"0x2","\ud83d\ude00":"3"}"#;
        assert_eq!(get(record, "token_address"), string("0x1"));
        assert_eq!(get(record, "token\""), string("0x2"));
        assert_eq!(get(record, "😀"), string("3"));
        assert_eq!(get(r#"{"a\q":"1","b":"2"}"#, "b"), None);
    }

    #[test]
    fn string_escapes_are_resolved() {
        let record = r#"{"s":"a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00z"}"#;
        assert_eq!(
            get(record, "s"),
            Some(Extracted::Str(Cow::Owned("a\"\\/\u{8}\u{c}\n\r\té😀z".to_owned())))
        );
        for bad in [
            r#"{"s":"\ud83d"}"#,
            r#"{"s":"\ude00"}"#,
            r#"{"s":"\x"}"#,
            r#"{"s":"\u12"}"#,
            r#"{"s":"\é"}"#,
        ] {
            assert_eq!(get(bad, "s"), None, "{bad}");
        }
    }

    #[test]
    fn malformed_records_yield_nothing() {
        for bad in [
            "",
            "{",
            r#"{"a""#,
            r#"{"a":"#,
            r#"{"a":"x"#,
            r#"{"a" "x"}"#,
            r#"{"a":"x""#,
            r#"{"a":"x"]"#,
            r#"{"a":"x" "b":1}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":-}"#,
            r#"{"a":1e}"#,
            r#"{"a":12x}"#,
            "{\"a\":\"tab\there\"}",
            r#"{"b":[1}],"a":"x"}"#,
            r#"{"b":tru,"a":"x"}"#,
            r#"{"b":"x",}"#,
            r#"{"b":"x",,"a":"x"}"#,
            r#"["x",]"#,
        ] {
            let at = if bad.starts_with('[') { "1" } else { "a" };
            assert_eq!(get(bad, at), None, "{bad}");
        }
        assert_eq!(extract(b"{\"a\":\"\xff\"}", &path("a")), None);
        // Documented limit: what follows the returned value (but its separator) is not read.
        assert_eq!(get(r#"{"a":"x",}"#, "a"), string("x"));
    }

    #[test]
    fn containers_nested_past_the_limit_are_malformed() {
        let nest = |depth: usize| {
            format!(r#"{{"deep":{}{},"a":"x"}}"#, "[".repeat(depth), "]".repeat(depth))
        };
        assert_eq!(get(&nest(MAX_SKIP_DEPTH as usize), "a"), string("x"));
        assert_eq!(get(&nest(MAX_SKIP_DEPTH as usize + 1), "a"), None);
    }

    #[test]
    fn word_at_a_time_checks_see_every_position() {
        for len in 0..40 {
            for at in 0..len {
                let with = |odd: &str| {
                    let mut text = "a".repeat(len);
                    text.replace_range(at..at + 1, odd);
                    format!(r#"{{"s":"{text}","n":1}}"#)
                };
                assert_eq!(get(&with("\t"), "s"), None, "control byte at {at} of {len}");
                assert_eq!(get(&with("\u{7f}"), "s"), string(&with("\u{7f}")[6..6 + len]));
                let accented = with("é");
                assert_eq!(get(&accented, "s"), string(&accented[6..6 + len + 1]));
                let mut bad = with("é").into_bytes();
                bad[6 + at] = 0xff;
                assert_eq!(extract(&bad, &path("s")), None, "0xff at {at} of {len}");
            }
            let digits = "7".repeat(len + 1);
            for end in [",", "}", "x,", ".5,", "e3}", " ,"] {
                let record = format!(r#"{{"n":{digits}{end}"s":"x"}}"#);
                let expected = match end {
                    "," | "}" | " ," => Some(Extracted::Number(&record[5..5 + len + 1])),
                    ".5," => Some(Extracted::Number(&record[5..5 + len + 3])),
                    "e3}" => Some(Extracted::Number(&record[5..5 + len + 3])),
                    _ => None,
                };
                assert_eq!(get(&record, "n"), expected, "{record}");
                let s_found = matches!(end, "," | " ," | ".5,");
                assert_eq!(get(&record, "s").is_some(), s_found, "{record}");
            }
        }
    }

    #[test]
    fn an_empty_path_names_the_whole_document() {
        assert_eq!(extract(b" 42 ", &[]), Some(Extracted::Number("42")));
        assert_eq!(extract(b"\"x\"", &[]), string("x"));
        assert_eq!(extract(b"42 1", &[]), None);
        assert_eq!(extract(b"{}", &[]), None);
    }
}
