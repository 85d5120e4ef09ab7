//! Serializing a script's output record to JSON bytes without QuickJS's `JSON.stringify`.
//!
//! QuickJS's `JSON.stringify` spends most of a record's time quoting strings one character
//! at a time (two thirds of the engine's time per record in the benchmark). Plain data — what
//! `JSON.parse` produced and scripts usually return — is written here instead, byte for byte
//! as `JSON.stringify` would write it: keys in the engine's own-property order, numbers by
//! the engine's own `Number::toString`, strings escaped like ES2019's well-formed
//! `JSON.stringify`. Anything this writer does not replicate stops it with [`Stop::Unsupported`] and the
//! caller falls back to `JSON.stringify` for the whole record: objects whose prototype is not
//! `Object.prototype` or `null` (dates, class instances, boxed primitives, typed arrays),
//! arrays whose prototype is not `Array.prototype`, proxies, own or inherited `toJSON`,
//! BigInts (so that `JSON.stringify` throws its TypeError), strings that are not valid
//! Unicode (lone surrogates), and nesting deeper than [`MAX_DEPTH`] (cycles included).

use std::fmt::Write as _;

use rquickjs::{Array, Atom, Coerced, Ctx, FromJs, Object, Type, Value};

/// Deeper records go through `JSON.stringify`, which also detects cycles.
const MAX_DEPTH: usize = 64;

/// Longer arrays go through `JSON.stringify` (a sparse array can claim billions of holes).
const MAX_ARRAY_LEN: usize = 1 << 20;

/// Why native serialization stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Fall back to `JSON.stringify`.
    Unsupported,
    /// Reading a property threw (a getter); the exception is pending in the context.
    Engine(rquickjs::Error),
    /// The text passed the byte limit given to [`Plain::write_object`].
    TooLarge,
}

impl From<rquickjs::Error> for Stop {
    fn from(error: rquickjs::Error) -> Self {
        Stop::Engine(error)
    }
}

/// The prototypes plain data may have, read once per batch.
pub(crate) struct Plain<'js> {
    object_prototype: Object<'js>,
    array_prototype: Object<'js>,
}

impl<'js> Plain<'js> {
    /// The context's `Object.prototype` and `Array.prototype`, taken from fresh values (not
    /// from the globals `Object` and `Array`, which a script may have replaced).
    pub(crate) fn new(ctx: &Ctx<'js>) -> Option<Self> {
        let object_prototype = Object::new(ctx.clone()).ok()?.get_prototype()?;
        let array_prototype = Array::new(ctx.clone()).ok()?.as_object().get_prototype()?;
        Some(Self { object_prototype, array_prototype })
    }

    /// Appends the JSON text of `object` (a plain object) to `out`.
    ///
    /// Checked at every record, since a script may give a prototype a `toJSON` at any call.
    ///
    /// Stops with [`Stop::TooLarge`] once `out` holds more than `limit` bytes, so a small
    /// object that refers to one large string many times never grows `out` far past it.
    pub(crate) fn write_object(
        &self,
        object: &Object<'js>,
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Result<(), Stop> {
        for prototype in [&self.object_prototype, &self.array_prototype] {
            if prototype.contains_key("toJSON")? {
                return Err(Stop::Unsupported);
            }
        }
        let mut writer = Writer { plain: self, limit };
        writer.write_object_at(object, out, 0)
    }
}

/// One serialization: the prototypes and the byte limit.
struct Writer<'p, 'js> {
    plain: &'p Plain<'js>,
    limit: usize,
}

impl<'js> Writer<'_, 'js> {
    fn write_value(
        &mut self,
        value: Value<'js>,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), Stop> {
        if out.len() > self.limit {
            return Err(Stop::TooLarge);
        }
        match value.type_of() {
            Type::Null => out.extend_from_slice(b"null"),
            Type::Bool => {
                let truth = value.as_bool().ok_or(Stop::Unsupported)?;
                out.extend_from_slice(if truth { b"true" } else { b"false" });
            }
            Type::Int => {
                let int = value.as_int().ok_or(Stop::Unsupported)?;
                let _ = write!(Utf8Sink(out), "{int}");
            }
            Type::Float => {
                let number = value.as_float().ok_or(Stop::Unsupported)?;
                if number.is_finite() {
                    // The engine's own Number::toString (shortest round-trip digits, ties to
                    // even), exactly what JSON.stringify writes. Rust's shortest formatting
                    // was tried: no faster, and it differs on exact ties.
                    let Coerced(text) = Coerced::<String>::from_js(&value.ctx().clone(), value)?;
                    out.extend_from_slice(text.as_bytes());
                } else {
                    out.extend_from_slice(b"null");
                }
            }
            Type::String => {
                let text = value.as_string().ok_or(Stop::Unsupported)?;
                // `to_string` fails on lone surrogates: JSON.stringify escapes those.
                let text = text.to_string().map_err(|_| Stop::Unsupported)?;
                if out.len() + text.len() > self.limit {
                    return Err(Stop::TooLarge);
                }
                write_string(out, &text);
            }
            Type::Array => {
                let array = value.into_array().ok_or(Stop::Unsupported)?;
                self.write_array(&array, out, depth + 1)?;
            }
            Type::Object => {
                let object = value.into_object().ok_or(Stop::Unsupported)?;
                self.write_object_at(&object, out, depth + 1)?;
            }
            _ => return Err(Stop::Unsupported),
        }
        Ok(())
    }

    fn write_object_at(
        &mut self,
        object: &Object<'js>,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), Stop> {
        if depth > MAX_DEPTH {
            return Err(Stop::Unsupported);
        }
        match object.get_prototype() {
            None => {}
            Some(prototype) if prototype == self.plain.object_prototype => {}
            Some(_) => return Err(Stop::Unsupported),
        }
        out.push(b'{');
        let mut first = true;
        for key in object.keys::<Atom>() {
            let key = key?;
            let value: Value = object.get(key.clone())?;
            let name = key.to_string()?;
            if name == "toJSON" {
                return Err(Stop::Unsupported);
            }
            if skipped_in_object(&value) {
                continue;
            }
            if !first {
                out.push(b',');
            }
            first = false;
            write_string(out, &name);
            out.push(b':');
            self.write_value(value, out, depth)?;
        }
        out.push(b'}');
        Ok(())
    }

    fn write_array(
        &mut self,
        array: &Array<'js>,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), Stop> {
        if depth > MAX_DEPTH {
            return Err(Stop::Unsupported);
        }
        match array.as_object().get_prototype() {
            Some(prototype) if prototype == self.plain.array_prototype => {}
            _ => return Err(Stop::Unsupported),
        }
        if array.as_object().contains_key("toJSON")? {
            return Err(Stop::Unsupported);
        }
        // `Array::len` asserts an int length; a sparse array's length may be a float.
        let length: f64 = array.as_object().get("length")?;
        if !(0.0..=MAX_ARRAY_LEN as f64).contains(&length) {
            return Err(Stop::Unsupported);
        }
        out.push(b'[');
        for index in 0..length as usize {
            if index > 0 {
                out.push(b',');
            }
            let value: Value = array.get(index)?;
            if skipped_in_object(&value) {
                out.extend_from_slice(b"null");
            } else {
                self.write_value(value, out, depth)?;
            }
        }
        out.push(b']');
        Ok(())
    }
}

/// Values `JSON.stringify` leaves out of objects (and writes as `null` in arrays).
fn skipped_in_object(value: &Value<'_>) -> bool {
    matches!(
        value.type_of(),
        Type::Undefined | Type::Uninitialized | Type::Function | Type::Constructor | Type::Symbol
    )
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
    for (index, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..index]);
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
