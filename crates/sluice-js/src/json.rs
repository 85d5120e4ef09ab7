//! Records in and out of the engine as JSON, without QuickJS's `JSON.parse` and
//! `JSON.stringify` for plain data.
//!
//! QuickJS's own JSON functions tokenize and quote one character at a time: they were
//! nine tenths of a script stage's time on the benchmark transform. Here a record is parsed
//! in Rust and built with the engine's C API ([`crate::raw`]) from atoms cached across
//! records, and a returned record is written by walking it the same way.
//!
//! Parsing gives exactly what `JSON.parse` gives: the same values, own properties in the
//! same order (a repeated key keeps its first place and its last value; `__proto__` is an
//! own property), numbers correctly rounded, `-0` kept. Anything unusual — invalid UTF-8 or
//! JSON, a lone surrogate escape, nesting deeper than [`MAX_DEPTH`] — answers `None`, and
//! the caller runs `JSON.parse` instead, so its errors and edge cases stay the engine's.
//!
//! Writing gives byte for byte what `JSON.stringify` writes: keys in the engine's
//! own-property order, numbers by the engine's own `Number::toString` (integers below 2^53
//! are written directly: the same digits), strings escaped like ES2019's well-formed
//! `JSON.stringify`. Anything this writer does not replicate stops it with
//! [`Stop::Unsupported`] and the caller falls back to `JSON.stringify` for the whole record:
//! objects that are not ordinary objects with prototype `Object.prototype` or `null`
//! (dates, class instances, boxed primitives, typed arrays, proxies), arrays that are not
//! ordinary arrays with prototype `Array.prototype`, own or inherited `toJSON`, BigInts (so
//! that `JSON.stringify` throws its TypeError), strings that are not valid Unicode (lone
//! surrogates), and nesting deeper than [`MAX_DEPTH`] (cycles included).

use std::fmt::Write as _;

use rquickjs::{Array, Ctx, Object, Value};

use sluice_core::json::{find_string_special, unescape_into};

use crate::raw::{Atom, Class, Kind, Owned, Pending, Raw};

/// Deeper records go through `JSON.parse` / `JSON.stringify` (which also detects cycles).
const MAX_DEPTH: usize = 64;

/// Longer arrays go through `JSON.stringify` (a sparse array can claim billions of holes).
const MAX_ARRAY_LEN: usize = 1 << 20;

/// Keys kept in [`AtomCache`] at most, and their longest length; other keys get an atom
/// per use.
const MAX_CACHED_KEYS: usize = 4096;
const MAX_CACHED_KEY_BYTES: usize = 256;

/// Numbers below this are integers exactly when they have no fraction, and
/// `Number::toString` writes them as their plain digits.
const EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0;

/// Why native serialization stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Fall back to `JSON.stringify`.
    Unsupported,
    /// Reading a property threw (a getter), or the engine ran out of memory; the exception
    /// is pending in the context.
    Engine(rquickjs::Error),
    /// The text passed the byte limit given to [`Plain::write_object`].
    TooLarge,
}

impl From<Pending> for Stop {
    fn from(_: Pending) -> Self {
        Stop::Engine(rquickjs::Error::Exception)
    }
}

/// Property-key atoms kept across records (records of one stream share their keys), each
/// holding one reference: by key text for parsing, and the JSON text of each key for
/// writing. [`AtomCache::release`] must run before the context is freed.
#[derive(Default)]
pub(crate) struct AtomCache {
    by_text: foldhash::HashMap<Box<str>, Atom>,
    json_names: foldhash::HashMap<Atom, Box<[u8]>>,
}

impl AtomCache {
    /// Frees every cached atom.
    pub(crate) fn release(&mut self, ctx: &Ctx<'_>) {
        let raw = Raw::new(ctx);
        for (_, atom) in self.by_text.drain() {
            raw.free_atom(atom);
        }
        for (atom, _) in self.json_names.drain() {
            raw.free_atom(atom);
        }
    }

    /// The atom of `key`, and whether the caller must free it (when it is not cached).
    fn atom(&mut self, raw: Raw<'_>, key: &str) -> Result<(Atom, bool), Pending> {
        if let Some(&atom) = self.by_text.get(key) {
            return Ok((atom, false));
        }
        let atom = raw.atom(key)?;
        if self.by_text.len() < MAX_CACHED_KEYS && key.len() <= MAX_CACHED_KEY_BYTES {
            self.by_text.insert(key.into(), atom);
            return Ok((atom, false));
        }
        Ok((atom, true))
    }

    /// Appends `"key":` to `out`.
    fn write_name(&mut self, raw: Raw<'_>, atom: Atom, out: &mut Vec<u8>) -> Result<(), Stop> {
        if let Some(name) = self.json_names.get(&atom) {
            out.extend_from_slice(name);
            return Ok(());
        }
        let start = out.len();
        raw.with_atom_text(atom, |text| match std::str::from_utf8(text) {
            Ok(text) => {
                write_string(out, text);
                out.push(b':');
                Ok(())
            }
            // A lone surrogate: JSON.stringify escapes it.
            Err(_) => Err(Stop::Unsupported),
        })??;
        if self.json_names.len() < MAX_CACHED_KEYS && out.len() - start <= MAX_CACHED_KEY_BYTES {
            self.json_names.insert(raw.dup_atom(atom), out[start..].into());
        }
        Ok(())
    }
}

/// Parses `record` (a JSON object) into an engine value, exactly as `JSON.parse` would;
/// `Ok(None)` when the caller should run `JSON.parse` instead (see the module's notes).
///
/// # Errors
/// The engine failed (out of memory); the exception is pending.
pub(crate) fn parse<'js>(
    ctx: &Ctx<'js>,
    atoms: &mut AtomCache,
    record: &[u8],
) -> Result<Option<Value<'js>>, rquickjs::Error> {
    let Ok(text) = std::str::from_utf8(record) else { return Ok(None) };
    let mut parser =
        Parser { raw: Raw::new(ctx), source: text, at: 0, atoms, scratch: String::new() };
    parser.skip_space();
    if parser.peek() != Some(b'{') {
        return Ok(None);
    }
    match parser.object(1) {
        Ok(object) => {
            parser.skip_space();
            if parser.at == parser.source.len() {
                Ok(Some(object.into_value(ctx)))
            } else {
                Ok(None)
            }
        }
        Err(ParseStop::Fallback) => Ok(None),
        Err(ParseStop::Pending) => Err(rquickjs::Error::Exception),
    }
}

/// Why native parsing stopped.
enum ParseStop {
    /// Let `JSON.parse` do it (and report what is wrong).
    Fallback,
    /// The engine failed; the exception is pending.
    Pending,
}

impl From<Pending> for ParseStop {
    fn from(_: Pending) -> Self {
        ParseStop::Pending
    }
}

/// Where a parsed string's text is: a range of the record (ASCII quotes around it, so on
/// character boundaries), or the parser's scratch buffer.
enum Span {
    Source(usize, usize),
    Scratch,
}

struct Parser<'t, 'c, 'js> {
    raw: Raw<'js>,
    source: &'t str,
    at: usize,
    atoms: &'c mut AtomCache,
    /// Strings with escapes, unescaped.
    scratch: String,
}

impl<'js> Parser<'_, '_, 'js> {
    fn peek(&self) -> Option<u8> {
        self.source.as_bytes().get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Skips spaces, then expects `byte`.
    fn expect(&mut self, byte: u8) -> Result<(), ParseStop> {
        self.skip_space();
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(ParseStop::Fallback)
        }
    }

    fn value(&mut self, depth: usize) -> Result<Owned<'js>, ParseStop> {
        self.skip_space();
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => {
                let text = match self.string()? {
                    Span::Source(start, end) => &self.source[start..end],
                    Span::Scratch => &self.scratch,
                };
                Ok(self.raw.string(text)?)
            }
            Some(b't') => self.literal(b"true").map(|()| self.raw.bool(true)),
            Some(b'f') => self.literal(b"false").map(|()| self.raw.bool(false)),
            Some(b'n') => self.literal(b"null").map(|()| self.raw.null()),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(ParseStop::Fallback),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), ParseStop> {
        if self.source.as_bytes()[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(())
        } else {
            Err(ParseStop::Fallback)
        }
    }

    /// At `{`.
    fn object(&mut self, depth: usize) -> Result<Owned<'js>, ParseStop> {
        if depth > MAX_DEPTH {
            return Err(ParseStop::Fallback);
        }
        self.at += 1;
        let raw = self.raw;
        let object = raw.object()?;
        self.skip_space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(object);
        }
        loop {
            self.skip_space();
            if self.peek() != Some(b'"') {
                return Err(ParseStop::Fallback);
            }
            let key = match self.string()? {
                Span::Source(start, end) => &self.source[start..end],
                Span::Scratch => &self.scratch,
            };
            let (atom, temporary) = self.atoms.atom(raw, key)?;
            let defined = self
                .expect(b':')
                .and_then(|()| self.value(depth))
                .and_then(|value| raw.define(&object, atom, value).map_err(ParseStop::from));
            if temporary {
                raw.free_atom(atom);
            }
            defined?;
            self.skip_space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(object);
                }
                _ => return Err(ParseStop::Fallback),
            }
        }
    }

    /// At `[`.
    fn array(&mut self, depth: usize) -> Result<Owned<'js>, ParseStop> {
        if depth > MAX_DEPTH {
            return Err(ParseStop::Fallback);
        }
        self.at += 1;
        let mut items = Vec::new();
        self.skip_space();
        if self.peek() == Some(b']') {
            self.at += 1;
        } else {
            loop {
                items.push(self.value(depth)?);
                self.skip_space();
                match self.peek() {
                    Some(b',') => self.at += 1,
                    Some(b']') => {
                        self.at += 1;
                        break;
                    }
                    _ => return Err(ParseStop::Fallback),
                }
            }
        }
        Ok(self.raw.array(items)?)
    }

    /// At `"`: where the string's text is, unescaped (in the record when it has no
    /// escapes).
    fn string(&mut self) -> Result<Span, ParseStop> {
        self.at += 1;
        let start = self.at;
        let text = self.source.as_bytes();
        let end = start + find_string_special(&text[start..]).ok_or(ParseStop::Fallback)?;
        match text[end] {
            b'"' => {
                self.at = end + 1;
                Ok(Span::Source(start, end))
            }
            b'\\' => self.escaped_string(start, end),
            _ => Err(ParseStop::Fallback),
        }
    }

    /// The rest of a string that starts at `start` and has an escape at `at`.
    fn escaped_string(&mut self, start: usize, mut at: usize) -> Result<Span, ParseStop> {
        let text = self.source.as_bytes();
        // The closing quote: an escape is two bytes (a `\u`'s hex digits hold no quote).
        loop {
            match text[at] {
                b'\\' => at += 2,
                b'"' => break,
                _ => return Err(ParseStop::Fallback),
            }
            let rest = text.get(at..).ok_or(ParseStop::Fallback)?;
            at += find_string_special(rest).ok_or(ParseStop::Fallback)?;
        }
        self.scratch.clear();
        // Bad escapes and lone surrogates are left to JSON.parse.
        unescape_into(&self.source[start..at], &mut self.scratch).ok_or(ParseStop::Fallback)?;
        self.at = at + 1;
        Ok(Span::Scratch)
    }

    /// At `-` or a digit: a JSON number, as the engine stores it.
    fn number(&mut self) -> Result<Owned<'js>, ParseStop> {
        let text = self.source.as_bytes();
        let start = self.at;
        let mut at = start;
        if text[at] == b'-' {
            at += 1;
        }
        let digits = |at: &mut usize| {
            let from = *at;
            while text.get(*at).is_some_and(u8::is_ascii_digit) {
                *at += 1;
            }
            *at - from
        };
        let int_start = at;
        match digits(&mut at) {
            0 => return Err(ParseStop::Fallback),
            // No leading zeros.
            n if n > 1 && text[int_start] == b'0' => return Err(ParseStop::Fallback),
            _ => {}
        }
        let mut integer = true;
        if text.get(at) == Some(&b'.') {
            at += 1;
            integer = false;
            if digits(&mut at) == 0 {
                return Err(ParseStop::Fallback);
            }
        }
        if let Some(b'e' | b'E') = text.get(at) {
            at += 1;
            integer = false;
            if let Some(b'+' | b'-') = text.get(at) {
                at += 1;
            }
            if digits(&mut at) == 0 {
                return Err(ParseStop::Fallback);
            }
        }
        self.at = at;
        let number = &self.source[start..at];
        // `-0` is a float in JavaScript.
        if integer && at - start <= 10 && number != "-0" {
            if let Ok(small) = number.parse::<i32>() {
                return Ok(self.raw.int(small));
            }
        }
        // Rust's parse is correctly rounded, as JavaScript's is.
        let number: f64 = number.parse().map_err(|_| ParseStop::Fallback)?;
        Ok(self.raw.float(number))
    }
}

/// The prototypes plain data may have, read once per batch.
pub(crate) struct Plain<'js> {
    raw: Raw<'js>,
    object_prototype: Owned<'js>,
    array_prototype: Owned<'js>,
}

impl<'js> Plain<'js> {
    /// The context's `Object.prototype` and `Array.prototype`, taken from fresh values (not
    /// from the globals `Object` and `Array`, which a script may have replaced).
    pub(crate) fn new(ctx: &Ctx<'js>) -> Option<Self> {
        let raw = Raw::new(ctx);
        let object_prototype = Object::new(ctx.clone()).ok()?.get_prototype()?;
        let array_prototype = Array::new(ctx.clone()).ok()?.as_object().get_prototype()?;
        Some(Self {
            raw,
            object_prototype: raw.dup(object_prototype.as_value()),
            array_prototype: raw.dup(array_prototype.as_value()),
        })
    }

    /// Appends the JSON text of `object` (a plain object) to `out`.
    ///
    /// Checked at every record, since a script may give a prototype a `toJSON` at any call.
    ///
    /// Stops with [`Stop::TooLarge`] once `out` holds more than `limit` bytes, so a small
    /// object that refers to one large string many times never grows `out` far past it.
    pub(crate) fn write_object(
        &self,
        atoms: &mut AtomCache,
        object: &Value<'js>,
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Result<(), Stop> {
        let raw = self.raw;
        for prototype in [&self.object_prototype, &self.array_prototype] {
            if raw.has(prototype, Atom::TO_JSON)? {
                return Err(Stop::Unsupported);
            }
        }
        let object = raw.dup(object);
        if raw.class(&object) != Class::Object {
            return Err(Stop::Unsupported);
        }
        let mut writer = Writer { raw, plain: self, atoms, limit };
        writer.write_object_at(&object, out, 0)
    }
}

/// One serialization: the prototypes, the key cache and the byte limit.
struct Writer<'p, 'js> {
    raw: Raw<'js>,
    plain: &'p Plain<'js>,
    atoms: &'p mut AtomCache,
    limit: usize,
}

impl<'js> Writer<'_, 'js> {
    fn write_value(
        &mut self,
        value: Owned<'js>,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), Stop> {
        if out.len() > self.limit {
            return Err(Stop::TooLarge);
        }
        match value.kind() {
            Kind::Null => out.extend_from_slice(b"null"),
            Kind::Bool(truth) => out.extend_from_slice(if truth { b"true" } else { b"false" }),
            Kind::Int(int) => {
                let _ = write!(Utf8Sink(out), "{int}");
            }
            Kind::Float(number) if !number.is_finite() => out.extend_from_slice(b"null"),
            Kind::Float(number) if number.fract() == 0.0 && number.abs() < EXACT_INTEGERS => {
                // Exact, and -0 writes as 0, as Number::toString does.
                let _ = write!(Utf8Sink(out), "{}", number as i64);
            }
            Kind::Float(_) => {
                // The engine's own Number::toString (shortest round-trip digits), exactly
                // what JSON.stringify writes. Rust's shortest formatting was tried: no
                // faster, and it differs on exact ties.
                self.raw.with_text(&value, |text| out.extend_from_slice(text))?;
            }
            Kind::String => {
                let limit = self.limit;
                self.raw.with_text(&value, |text| {
                    // Lone surrogates come out as invalid UTF-8: JSON.stringify escapes them.
                    let text = std::str::from_utf8(text).map_err(|_| Stop::Unsupported)?;
                    if out.len() + text.len() > limit {
                        return Err(Stop::TooLarge);
                    }
                    write_string(out, text);
                    Ok(())
                })??;
            }
            Kind::Object => match self.raw.class(&value) {
                Class::Object => self.write_object_at(&value, out, depth + 1)?,
                Class::Array => self.write_array(&value, out, depth + 1)?,
                Class::Other => return Err(Stop::Unsupported),
            },
            Kind::Undefined | Kind::Symbol | Kind::Other => return Err(Stop::Unsupported),
        }
        Ok(())
    }

    fn write_object_at(
        &mut self,
        object: &Owned<'js>,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), Stop> {
        let raw = self.raw;
        if depth > MAX_DEPTH
            || !(raw.has_prototype(object, Some(&self.plain.object_prototype))
                || raw.has_prototype(object, None))
        {
            return Err(Stop::Unsupported);
        }
        let keys = raw.keys(object)?;
        out.push(b'{');
        let mut first = true;
        for index in 0..keys.len() {
            let key = keys.get(index);
            if key == Atom::TO_JSON {
                return Err(Stop::Unsupported);
            }
            let value = raw.get(object, key)?;
            if self.skipped_in_object(&value) {
                continue;
            }
            if !first {
                out.push(b',');
            }
            first = false;
            self.atoms.write_name(raw, key, out)?;
            self.write_value(value, out, depth)?;
        }
        out.push(b'}');
        Ok(())
    }

    fn write_array(
        &mut self,
        array: &Owned<'js>,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), Stop> {
        let raw = self.raw;
        if depth > MAX_DEPTH
            || !raw.has_prototype(array, Some(&self.plain.array_prototype))
            || raw.has(array, Atom::TO_JSON)?
        {
            return Err(Stop::Unsupported);
        }
        let length = match raw.get(array, Atom::LENGTH)?.kind() {
            Kind::Int(length) => usize::try_from(length).map_err(|_| Stop::Unsupported)?,
            _ => return Err(Stop::Unsupported),
        };
        if length > MAX_ARRAY_LEN {
            return Err(Stop::Unsupported);
        }
        out.push(b'[');
        for index in 0..length {
            if index > 0 {
                out.push(b',');
            }
            // At most MAX_ARRAY_LEN.
            let value = raw.get_index(array, index as u32)?;
            if self.skipped_in_object(&value) {
                out.extend_from_slice(b"null");
            } else {
                self.write_value(value, out, depth)?;
            }
        }
        out.push(b']');
        Ok(())
    }

    /// Values `JSON.stringify` leaves out of objects (and writes as `null` in arrays).
    fn skipped_in_object(&self, value: &Owned<'js>) -> bool {
        match value.kind() {
            Kind::Undefined | Kind::Symbol => true,
            Kind::Object => self.raw.is_function(value),
            _ => false,
        }
    }
}

/// `fmt::Write` into a byte vector (only ever given ASCII here).
struct Utf8Sink<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Utf8Sink<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Writes `text` as a JSON string the way `JSON.stringify` quotes it.
pub(crate) fn write_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    let bytes = text.as_bytes();
    let mut start = 0;
    while let Some(found) = find_string_special(&bytes[start..]) {
        let index = start + found;
        out.extend_from_slice(&bytes[start..index]);
        let byte = bytes[index];
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            _ => b"",
        };
        if escape.is_empty() {
            let _ = write!(Utf8Sink(out), "\\u{byte:04x}");
        } else {
            out.extend_from_slice(escape);
        }
        start = index + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::write_string;

    #[test]
    fn strings_are_escaped_as_json_stringify_does() {
        let mut out = Vec::new();
        write_string(&mut out, "a\"b\\c\n\r\t\u{8}\u{c}\u{1}\u{1f} é \u{2028} 😀");
        assert_eq!(
            String::from_utf8(out).expect("UTF-8"),
            "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f é \u{2028} 😀\""
        );
    }
}
