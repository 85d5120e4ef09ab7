//! The only host objects a script sees: `beam.contains` and `console`.
//!
//! Both are thin JavaScript wrappers (checking and converting arguments the way a JS user
//! expects) around two native functions that are passed in as arguments and never become
//! globals, so a script cannot call them with unchecked arguments or replace them.

use std::sync::Arc;

use rquickjs::{Ctx, Function};
use sluice_core::datasets::DatasetLookup;

/// Longest `console.*` message passed to the [`LogSink`]; longer ones are cut (on a char
/// boundary) and end with `…`. Keeps a script that logs whole records from flooding logs.
pub const MAX_LOG_MESSAGE_BYTES: usize = 4096;

/// Severity of a `console.*` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// `console.log`, `console.info`, `console.debug`.
    Info,
    /// `console.warn`.
    Warn,
    /// `console.error`.
    Error,
}

impl LogLevel {
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// Where a script's `console.*` lines go (the pipeline's logs). Called on the worker's thread
/// in the middle of a `transform` call: it must not block.
pub trait LogSink: Send + Sync + 'static {
    fn log(&self, level: LogLevel, message: &str);

    /// A call of `transform` begins: the lines until the next call are its lines. The
    /// engine calls it once per record it is given, even one it does not run (after an
    /// out-of-memory error), so the n-th record of a batch is the n-th call.
    fn call_started(&self) {}
}

/// A sink that drops every line (compile checks, benchmarks).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoLogs;

impl LogSink for NoLogs {
    fn log(&self, _: LogLevel, _: &str) {}
}

/// Runs once per context, before the user's script: defines `beam` and `console` as
/// non-writable, non-configurable globals.
const BOOTSTRAP: &str = r#"(function (nativeContains, nativeLog) {
  "use strict";
  const key = (value) => {
    if (typeof value === "string") return value;
    if (typeof value === "number") return String(value);
    throw new TypeError("beam.contains: values must be strings or numbers, got " +
      (value === null ? "null" : typeof value));
  };
  const beam = Object.freeze({
    contains(datasetName, values) {
      if (typeof datasetName !== "string") {
        throw new TypeError("beam.contains: datasetName must be a string");
      }
      const keys = Array.isArray(values) ? values.map(key) : [key(values)];
      return keys.length > 0 && nativeContains(datasetName, keys);
    },
  });
  const show = (value) => {
    if (typeof value === "string") return value;
    if (value !== null && typeof value === "object") {
      try {
        const text = JSON.stringify(value);
        if (text !== undefined) return text;
      } catch (_) {}
    }
    return String(value);
  };
  const line = (args) => Array.prototype.map.call(args, show).join(" ");
  const console = Object.freeze({
    log(...args) { nativeLog(0, line(args)); },
    info(...args) { nativeLog(0, line(args)); },
    debug(...args) { nativeLog(0, line(args)); },
    warn(...args) { nativeLog(1, line(args)); },
    error(...args) { nativeLog(2, line(args)); },
  });
  const fixed = { writable: false, enumerable: false, configurable: false };
  Object.defineProperty(globalThis, "beam", { value: beam, ...fixed });
  Object.defineProperty(globalThis, "console", { value: console, ...fixed });
})"#;

/// Installs `beam` and `console` in `ctx`'s global object.
pub(crate) fn install(
    ctx: &Ctx<'_>,
    lookup: Arc<dyn DatasetLookup>,
    owner_user_id: Arc<str>,
    log: Arc<dyn LogSink>,
) -> rquickjs::Result<()> {
    let contains = Function::new(ctx.clone(), move |dataset: String, values: Vec<String>| {
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        lookup.contains_any(&owner_user_id, &dataset, &values)
    })?;
    let native_log = Function::new(ctx.clone(), move |level: i32, message: String| {
        let level = match level {
            1 => LogLevel::Warn,
            2 => LogLevel::Error,
            _ => LogLevel::Info,
        };
        log.log(level, &truncate(&message, MAX_LOG_MESSAGE_BYTES));
    })?;
    let bootstrap: Function = ctx.eval(BOOTSTRAP)?;
    bootstrap.call::<_, ()>((contains, native_log))
}

fn truncate(message: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if message.len() <= max {
        return message.into();
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end]).into()
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn truncate_cuts_on_a_char_boundary() {
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(truncate("abcd", 3), "abc…");
        assert_eq!(truncate("aé", 2), "a…");
    }
}
