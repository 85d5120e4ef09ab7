//! The few QuickJS C calls the JSON paths make directly, wrapped so that the rest of the
//! crate stays safe code.
//!
//! `rquickjs`'s public API costs about 1,500 instructions per property defined or read
//! (a Rust string turned into an atom, hashed, and freed each time, plus reference
//! counting on every wrapper); a record has a dozen or more properties, so that overhead
//! was most of a script stage's time. The calls here take pre-made atoms and hand out
//! string bytes without copying them.
//!
//! This module, `sluice_core::json`'s SSE2 search and `sluice-bus`'s Kafka group offsets
//! (`kafka/groups.rs`) are the only code of the workspace that may use `unsafe` (the
//! workspace forbids it; `sluice-js` denies it and allows it here). What every block
//! relies on:
//! - [`Raw`] is made from a [`Ctx`] and lives no longer than it, so its context pointer is
//!   valid for every call, and the engine is single-threaded: nothing else runs while a
//!   call here does.
//! - Every value handed out is an [`Owned`]: it holds one reference count, freed when it
//!   drops, or passed on exactly once by [`Owned::into_raw`] to a call that takes it.
//!   Values borrowed from an `Owned` or a [`Value`] are only used while that holds them.
//! - Atoms are plain numbers: an [`Atom`] carries no reference of its own. Whoever made or
//!   duplicated one frees it once ([`Raw::free_atom`]); `AtomCache` in `json.rs` keeps
//!   its atoms alive until the engine releases it before the context is freed.
//! - A call that fails leaves an exception pending in the context and answers
//!   [`Pending`]; the caller turns it into `rquickjs::Error::Exception`, which takes it.

#![allow(unsafe_code)]

use std::ffi::c_int;
use std::marker::PhantomData;

use rquickjs::qjs;
use rquickjs::{Ctx, Value};

/// An exception is pending in the context (the caller takes it).
#[derive(Debug)]
pub(crate) struct Pending;

/// A property key interned by the engine (see the module's notes on ownership).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Atom(qjs::JSAtom);

impl Atom {
    /// `"toJSON"`, built into the engine (never freed).
    pub(crate) const TO_JSON: Atom = Atom(qjs::JS_ATOM_toJSON as qjs::JSAtom);
    /// `"length"`, built into the engine (never freed).
    pub(crate) const LENGTH: Atom = Atom(qjs::JS_ATOM_length as qjs::JSAtom);
}

/// The context, for the calls below.
#[derive(Clone, Copy)]
pub(crate) struct Raw<'js> {
    ctx: *mut qjs::JSContext,
    _context: PhantomData<&'js ()>,
}

/// One reference to a value, freed on drop.
pub(crate) struct Owned<'js> {
    raw: Raw<'js>,
    value: qjs::JSValue,
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        // SAFETY: `value` holds one reference (module notes) and the context is alive.
        unsafe { qjs::JS_FreeValue(self.raw.ctx, self.value) }
    }
}

impl<'js> Owned<'js> {
    /// Gives up the reference to a call that takes it.
    fn into_raw(self) -> qjs::JSValue {
        let value = self.value;
        std::mem::forget(self);
        value
    }

    /// As an `rquickjs` value (which then owns the reference).
    pub(crate) fn into_value(self, ctx: &Ctx<'js>) -> Value<'js> {
        // SAFETY: the reference passes to the `Value`, which frees it on drop; it comes
        // from this context.
        unsafe { Value::from_raw(ctx.clone(), self.into_raw()) }
    }

    /// What kind of value this is.
    pub(crate) fn kind(&self) -> Kind {
        kind_of(self.value)
    }
}

/// The kinds of value the JSON writer tells apart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Null,
    Undefined,
    Bool(bool),
    Int(i32),
    Float(f64),
    String,
    Object,
    Symbol,
    /// BigInts and engine-internal tags.
    Other,
}

fn kind_of(value: qjs::JSValue) -> Kind {
    // SAFETY: reading the tag and the matching union field of a valid value.
    unsafe {
        match qjs::JS_VALUE_GET_TAG(value) {
            qjs::JS_TAG_NULL => Kind::Null,
            qjs::JS_TAG_UNDEFINED => Kind::Undefined,
            qjs::JS_TAG_BOOL => Kind::Bool(qjs::JS_VALUE_GET_BOOL(value)),
            qjs::JS_TAG_INT => Kind::Int(qjs::JS_VALUE_GET_INT(value)),
            qjs::JS_TAG_FLOAT64 => Kind::Float(qjs::JS_VALUE_GET_FLOAT64(value)),
            qjs::JS_TAG_STRING | qjs::JS_TAG_STRING_ROPE => Kind::String,
            qjs::JS_TAG_OBJECT => Kind::Object,
            qjs::JS_TAG_SYMBOL => Kind::Symbol,
            _ => Kind::Other,
        }
    }
}

/// The own enumerable string keys of an object, in the engine's order; freed on drop.
pub(crate) struct Keys<'js> {
    raw: Raw<'js>,
    table: *mut qjs::JSPropertyEnum,
    len: u32,
}

impl Keys<'_> {
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    /// The key at `index` (< `len`); valid while `self` is.
    pub(crate) fn get(&self, index: usize) -> Atom {
        assert!(index < self.len(), "key index out of range");
        // SAFETY: the engine allocated `len` entries at `table`, kept until drop.
        Atom(unsafe { (*self.table.add(index)).atom })
    }
}

impl Drop for Keys<'_> {
    fn drop(&mut self) {
        // SAFETY: the table and the atom references in it came from
        // JS_GetOwnPropertyNames and are freed once, here.
        unsafe { qjs::JS_FreePropertyEnum(self.raw.ctx, self.table, self.len) }
    }
}

impl<'js> Raw<'js> {
    pub(crate) fn new(ctx: &Ctx<'js>) -> Self {
        Self { ctx: ctx.as_raw().as_ptr(), _context: PhantomData }
    }

    fn owned(self, value: qjs::JSValue) -> Result<Owned<'js>, Pending> {
        // SAFETY: reading a tag.
        if unsafe { qjs::JS_VALUE_GET_TAG(value) } == qjs::JS_TAG_EXCEPTION {
            return Err(Pending);
        }
        Ok(Owned { raw: self, value })
    }

    /// A new reference to an `rquickjs` value.
    pub(crate) fn dup(self, value: &Value<'js>) -> Owned<'js> {
        // SAFETY: `value` is alive; the new reference is owned by the result.
        Owned { raw: self, value: unsafe { qjs::JS_DupValue(self.ctx, value.as_raw()) } }
    }

    pub(crate) fn null(self) -> Owned<'js> {
        Owned { raw: self, value: qjs::JS_NULL }
    }

    pub(crate) fn bool(self, truth: bool) -> Owned<'js> {
        Owned { raw: self, value: if truth { qjs::JS_TRUE } else { qjs::JS_FALSE } }
    }

    pub(crate) fn int(self, number: i32) -> Owned<'js> {
        Owned { raw: self, value: qjs::JS_MKVAL(qjs::JS_TAG_INT, number) }
    }

    /// A number (stored as an int when it is one, as the engine does).
    pub(crate) fn float(self, number: f64) -> Owned<'js> {
        Owned { raw: self, value: qjs::JS_NewFloat64(number) }
    }

    pub(crate) fn string(self, text: &str) -> Result<Owned<'js>, Pending> {
        // SAFETY: the engine copies `text.len()` bytes of valid UTF-8.
        self.owned(unsafe {
            qjs::JS_NewStringLen(self.ctx, text.as_ptr().cast(), text.len() as qjs::size_t)
        })
    }

    pub(crate) fn object(self) -> Result<Owned<'js>, Pending> {
        // SAFETY: a fresh object, owned by the result.
        self.owned(unsafe { qjs::JS_NewObject(self.ctx) })
    }

    /// An array of `items`, in order (their references pass to it, even on failure).
    pub(crate) fn array(self, items: Vec<Owned<'js>>) -> Result<Owned<'js>, Pending> {
        let Ok(count) = c_int::try_from(items.len()) else {
            // Never reached: records are far smaller. Throw as the engine would.
            drop(items);
            // SAFETY: throws in this context.
            unsafe { qjs::JS_ThrowOutOfMemory(self.ctx) };
            return Err(Pending);
        };
        let values: Vec<qjs::JSValue> = items.into_iter().map(Owned::into_raw).collect();
        // SAFETY: JS_NewArrayFrom takes the `count` references at `values`.
        self.owned(unsafe { qjs::JS_NewArrayFrom(self.ctx, count, values.as_ptr()) })
    }

    /// Defines `key` on `object` as an enumerable, writable, configurable data property,
    /// replacing an own property of that name in place (as `JSON.parse` does).
    pub(crate) fn define(
        self,
        object: &Owned<'js>,
        key: Atom,
        value: Owned<'js>,
    ) -> Result<(), Pending> {
        // SAFETY: `object` is alive; the value's reference passes to the call.
        let done = unsafe {
            qjs::JS_DefinePropertyValue(
                self.ctx,
                object.value,
                key.0,
                value.into_raw(),
                qjs::JS_PROP_C_W_E as c_int,
            )
        };
        if done < 0 { Err(Pending) } else { Ok(()) }
    }

    /// The atom of `name` (UTF-8), with one reference for the caller.
    pub(crate) fn atom(self, name: &str) -> Result<Atom, Pending> {
        // SAFETY: the engine reads `name.len()` bytes.
        let atom = unsafe {
            qjs::JS_NewAtomLen(self.ctx, name.as_ptr().cast(), name.len() as qjs::size_t)
        };
        if atom == qjs::JS_ATOM_NULL as qjs::JSAtom { Err(Pending) } else { Ok(Atom(atom)) }
    }

    /// One more reference to `atom`.
    pub(crate) fn dup_atom(self, atom: Atom) -> Atom {
        // SAFETY: `atom` is alive (held by the caller).
        Atom(unsafe { qjs::JS_DupAtom(self.ctx, atom.0) })
    }

    /// Frees one reference to `atom`.
    pub(crate) fn free_atom(self, atom: Atom) {
        // SAFETY: the caller owns this reference (module notes).
        unsafe { qjs::JS_FreeAtom(self.ctx, atom.0) }
    }

    /// Calls `f` with the UTF-8 (WTF-8 for lone surrogates) bytes of `atom`'s name.
    pub(crate) fn with_atom_text<T>(
        self,
        atom: Atom,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, Pending> {
        let mut len: qjs::size_t = 0;
        // SAFETY: the text stays valid until JS_FreeCString below.
        let text = unsafe { qjs::JS_AtomToCStringLen(self.ctx, &raw mut len, atom.0) };
        if text.is_null() {
            return Err(Pending);
        }
        // SAFETY: `len` bytes at `text`, alive until freed below.
        let result = f(unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len as usize) });
        // SAFETY: freed once.
        unsafe { qjs::JS_FreeCString(self.ctx, text) };
        Ok(result)
    }

    /// Calls `f` with the UTF-8 bytes of `value` as a string (`String(value)`; WTF-8 for
    /// lone surrogates). An ASCII string's own bytes are lent without a copy.
    pub(crate) fn with_text<T>(
        self,
        value: &Owned<'js>,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, Pending> {
        let mut len: qjs::size_t = 0;
        // SAFETY: the text stays valid until JS_FreeCString below.
        let text = unsafe { qjs::JS_ToCStringLen2(self.ctx, &raw mut len, value.value, false) };
        if text.is_null() {
            return Err(Pending);
        }
        // SAFETY: `len` bytes at `text`, alive until freed below.
        let result = f(unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len as usize) });
        // SAFETY: freed once.
        unsafe { qjs::JS_FreeCString(self.ctx, text) };
        Ok(result)
    }

    /// `object[key]` (getters run).
    pub(crate) fn get(self, object: &Owned<'js>, key: Atom) -> Result<Owned<'js>, Pending> {
        // SAFETY: `object` is alive; the result is a new reference.
        self.owned(unsafe { qjs::JS_GetProperty(self.ctx, object.value, key.0) })
    }

    /// `object[index]` (getters run).
    pub(crate) fn get_index(self, object: &Owned<'js>, index: u32) -> Result<Owned<'js>, Pending> {
        // SAFETY: `object` is alive; the result is a new reference.
        self.owned(unsafe { qjs::JS_GetPropertyUint32(self.ctx, object.value, index) })
    }

    /// `key in object` (the prototype chain included; proxies' traps run).
    pub(crate) fn has(self, object: &Owned<'js>, key: Atom) -> Result<bool, Pending> {
        // SAFETY: `object` is alive.
        match unsafe { qjs::JS_HasProperty(self.ctx, object.value, key.0) } {
            found if found < 0 => Err(Pending),
            found => Ok(found > 0),
        }
    }

    /// The own enumerable string keys of `object`.
    pub(crate) fn keys(self, object: &Owned<'js>) -> Result<Keys<'js>, Pending> {
        let mut table = std::ptr::null_mut();
        let mut len = 0u32;
        // SAFETY: on success the engine hands over a table of `len` entries.
        let failed = unsafe {
            qjs::JS_GetOwnPropertyNames(
                self.ctx,
                &raw mut table,
                &raw mut len,
                object.value,
                (qjs::JS_GPN_STRING_MASK | qjs::JS_GPN_ENUM_ONLY) as c_int,
            )
        };
        if failed < 0 { Err(Pending) } else { Ok(Keys { raw: self, table, len }) }
    }

    /// The object's class: [`Class::Object`] and [`Class::Array`] are exactly the engine's
    /// ordinary objects and arrays (no proxies, functions, dates, boxed primitives...).
    pub(crate) fn class(self, object: &Owned<'js>) -> Class {
        // SAFETY: reading an object's class id.
        match unsafe { qjs::JS_GetClassID(object.value) } {
            CLASS_OBJECT => Class::Object,
            CLASS_ARRAY => Class::Array,
            _ => Class::Other,
        }
    }

    /// Whether `object`'s prototype is `prototype` (`null` for none). Only for objects of
    /// [`Class::Object`] or [`Class::Array`], whose prototype lookup runs no script.
    pub(crate) fn has_prototype(self, object: &Owned<'js>, prototype: Option<&Owned<'js>>) -> bool {
        // SAFETY: `object` is alive; the result is a new reference, freed by `Owned`.
        let found =
            Owned { raw: self, value: unsafe { qjs::JS_GetPrototype(self.ctx, object.value) } };
        match (kind_of(found.value), prototype) {
            (Kind::Null, None) => true,
            // SAFETY: both are objects; comparing their pointers.
            (Kind::Object, Some(expected)) => unsafe {
                qjs::JS_VALUE_GET_PTR(found.value) == qjs::JS_VALUE_GET_PTR(expected.value)
            },
            _ => false,
        }
    }

    /// Whether `value` can be called.
    pub(crate) fn is_function(self, value: &Owned<'js>) -> bool {
        // SAFETY: `value` is alive.
        unsafe { qjs::JS_IsFunction(self.ctx, value.value) }
    }
}

/// `JS_CLASS_OBJECT` and `JS_CLASS_ARRAY` in quickjs.c's class enumeration, which the
/// bindings do not export; checked against fresh values by the tests below.
const CLASS_OBJECT: qjs::JSClassID = 1;
const CLASS_ARRAY: qjs::JSClassID = 2;

/// See [`Raw::class`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Object,
    Array,
    Other,
}

#[cfg(test)]
mod tests {
    use rquickjs::{Context, Runtime, Value};

    use super::{Class, Raw};

    #[test]
    fn class_ids_are_the_engines_ordinary_objects_and_arrays() {
        let runtime = Runtime::new().expect("runtime");
        let context = Context::full(&runtime).expect("context");
        context.with(|ctx| {
            let raw = Raw::new(&ctx);
            let class = |source: &str| {
                let value: Value = ctx.eval(source).expect("evaluates");
                raw.class(&raw.dup(&value))
            };
            assert_eq!(class("({a: 1})"), Class::Object);
            assert_eq!(class("Object.create(null)"), Class::Object);
            assert_eq!(class("[1, 2]"), Class::Array);
            assert_eq!(class("new Array(5)"), Class::Array);
            for other in [
                "new Date(0)",
                "(function () {})",
                "new Proxy({}, {})",
                "new Proxy([], {})",
                "(function () { return arguments; })(1)",
                "new Number(1)",
                "new Uint8Array(2)",
                "new Map()",
                "new Error('x')",
            ] {
                assert_eq!(class(other), Class::Other, "{other}");
            }
        });
    }
}
