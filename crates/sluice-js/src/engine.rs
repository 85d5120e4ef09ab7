//! [`ScriptEngine`]: one QuickJS runtime and context running one script's `transform`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rquickjs::context::EvalOptions;
use rquickjs::{Context, Ctx, Exception, Object, Runtime, Type, Value};
use sluice_core::datasets::DatasetLookup;

use crate::error::{RunError, ScriptError, ScriptErrorKind};
use crate::globals::{self, LogSink};
use crate::json::{self, AtomCache, Plain, Stop};
use crate::{Limits, Output};

/// The file name the engine gives the script; positions in messages refer to it.
const SCRIPT_NAME: &str = "script.js";

/// The non-writable global under which the loaded script's `transform` is kept, so that a
/// call always runs the function the script defined when it loaded.
const PINNED_TRANSFORM: &str = "__sluice_transform";

/// A running script: the runtime, its context with the script loaded, and the per-call
/// budget.
///
/// One per worker. QuickJS is single-threaded: an engine is `Send` (it can move between
/// threads, e.g. into a blocking task and back) but not `Sync`, and every call runs to
/// completion on the calling thread. A call blocks that thread for at most the call budget
/// (plus the time of one JSON parse/serialize of the record), so call it from a blocking
/// context (`spawn_blocking`, a dedicated thread), not directly on an async executor.
///
/// After [`RunError::TimedOut`] the engine is usable as is: QuickJS unwinds the interrupted
/// call cleanly. After [`RunError::OutOfMemory`] it refuses every call (answering
/// `OutOfMemory` again) until [`ScriptEngine::restart`] rebuilds it, which costs about as
/// much as [`ScriptEngine::new`] (a fresh runtime and one evaluation of the script).
pub struct ScriptEngine {
    /// Released by `Drop` while the context is alive.
    atoms: AtomCache,
    // Field order is drop order: the context before the runtime that owns it.
    context: Context,
    runtime: Runtime,
    budget: Arc<Budget>,
    setup: Setup,
    poisoned: bool,
}

impl std::fmt::Debug for ScriptEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptEngine")
            .field("limits", &self.setup.limits)
            .field("owner_user_id", &self.setup.owner_user_id)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

/// What is needed to (re)build an engine.
#[derive(Clone)]
struct Setup {
    source: Arc<str>,
    limits: Limits,
    lookup: Arc<dyn DatasetLookup>,
    owner_user_id: Arc<str>,
    log: Arc<dyn LogSink>,
}

/// The deadline of the call in progress, read by the interrupt handler QuickJS polls while
/// it runs bytecode.
struct Budget {
    epoch: Instant,
    /// Nanoseconds after `epoch`; `u64::MAX` when no call is in progress.
    deadline: AtomicU64,
    /// Set by the handler when it interrupted the call.
    fired: AtomicBool,
}

impl Budget {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            deadline: AtomicU64::new(u64::MAX),
            fired: AtomicBool::new(false),
        }
    }

    fn start(&self, budget: Duration) {
        let deadline = self.epoch.elapsed().saturating_add(budget).as_nanos();
        self.fired.store(false, Ordering::Relaxed);
        self.deadline.store(u64::try_from(deadline).unwrap_or(u64::MAX - 1), Ordering::Relaxed);
    }

    fn stop(&self) -> bool {
        self.deadline.store(u64::MAX, Ordering::Relaxed);
        self.fired.load(Ordering::Relaxed)
    }

    /// Whether the call in progress is past its deadline (without marking it interrupted).
    fn is_over(&self) -> bool {
        let deadline = self.deadline.load(Ordering::Relaxed);
        deadline != u64::MAX
            && u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX) > deadline
    }

    fn should_interrupt(&self) -> bool {
        let deadline = self.deadline.load(Ordering::Relaxed);
        if deadline == u64::MAX {
            return false;
        }
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let over = now > deadline;
        if over {
            self.fired.store(true, Ordering::Relaxed);
        }
        over
    }
}

impl ScriptEngine {
    /// Builds a runtime with `limits`, installs `beam` and `console`, and evaluates `source`
    /// (its top-level code runs once, under [`Limits::load_budget`]).
    ///
    /// `lookup` answers `beam.contains` for the datasets of `owner_user_id` (the pipeline's
    /// owner); `log` receives `console.*` lines.
    ///
    /// # Errors
    /// The script does not parse, its top-level code throws, runs over budget or out of
    /// memory, or it defines no `transform` function.
    pub fn new(
        source: &str,
        limits: Limits,
        lookup: Arc<dyn DatasetLookup>,
        owner_user_id: &str,
        log: Arc<dyn LogSink>,
    ) -> Result<Self, ScriptError> {
        Self::build(Setup {
            source: source.into(),
            limits,
            lookup,
            owner_user_id: owner_user_id.into(),
            log,
        })
    }

    fn build(setup: Setup) -> Result<Self, ScriptError> {
        let engine_oom = |_| ScriptError {
            kind: ScriptErrorKind::OutOfMemory,
            message: "the script runtime could not be created".to_owned(),
            line: None,
            column: None,
        };
        let runtime = Runtime::new().map_err(engine_oom)?;
        let budget = Arc::new(Budget::new());
        let handler_budget = Arc::clone(&budget);
        runtime.set_interrupt_handler(Some(Box::new(move || handler_budget.should_interrupt())));
        let context = Context::full(&runtime).map_err(engine_oom)?;
        // The limit is set after the context exists so that the built-in objects count
        // against it but can never make creation fail under a tiny limit in tests.
        runtime.set_memory_limit(setup.limits.memory_bytes);
        let load_budget = setup.limits.load_budget();
        budget.start(load_budget);
        let loaded = context.with(|ctx| load(&ctx, &setup));
        let timed_out = budget.stop();
        if let Err(mut error) = loaded {
            if timed_out {
                error = ScriptError {
                    kind: ScriptErrorKind::TimedOut,
                    message: format!(
                        "the script's top-level code ran over the time budget of {} ms",
                        load_budget.as_millis()
                    ),
                    line: None,
                    column: None,
                };
            }
            return Err(error);
        }
        Ok(Self { atoms: AtomCache::default(), context, runtime, budget, setup, poisoned: false })
    }

    /// The limits this engine runs under.
    pub fn limits(&self) -> Limits {
        self.setup.limits
    }

    /// Whether the engine ran out of memory and refuses calls until [`Self::restart`].
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Replaces the runtime with a fresh one running the same script (after an OOM).
    ///
    /// # Errors
    /// As [`ScriptEngine::new`]; the old engine is kept (still poisoned) on error.
    pub fn restart(&mut self) -> Result<(), ScriptError> {
        *self = Self::build(self.setup.clone())?;
        Ok(())
    }

    /// Bytes the runtime currently has allocated (for metrics). Walks the whole heap: call
    /// it once per metrics interval, not per record.
    pub fn memory_used_bytes(&self) -> usize {
        usize::try_from(self.runtime.memory_usage().malloc_size).unwrap_or(usize::MAX)
    }

    /// Runs `transform` on one record (the bytes of a JSON object) and returns the records
    /// it produced, each the bytes of a JSON object: none (the script returned `null` or
    /// `undefined`), one (an object) or many (an array of objects).
    ///
    /// # Errors
    /// A per-record [`RunError`], or the fatal [`RunError::OutOfMemory`].
    pub fn run(&mut self, record: &[u8]) -> Result<Output, RunError> {
        let mut results = self.run_batch(std::iter::once(record));
        results.pop().expect("run_batch answers once per record")
    }

    /// Runs `transform` on each record in turn, entering the engine once for all of them;
    /// one result per record, in order. Each record gets its own time budget. Once a record
    /// runs the engine out of memory, it and every later record answer
    /// [`RunError::OutOfMemory`].
    pub fn run_batch<'r>(
        &mut self,
        records: impl IntoIterator<Item = &'r [u8]>,
    ) -> Vec<Result<Output, RunError>> {
        self.run_batch_within(records, usize::MAX)
    }

    /// As [`Self::run_batch`], but stops calling `transform` once the records produced so
    /// far take `output_budget` bytes of JSON or more: the answer then has fewer results
    /// than there were records, and the records after the last result were not run. The
    /// first record always runs, so a caller that runs the rest again later progresses.
    pub fn run_batch_within<'r>(
        &mut self,
        records: impl IntoIterator<Item = &'r [u8]>,
        output_budget: usize,
    ) -> Vec<Result<Output, RunError>> {
        let mut spent = 0usize;
        let records = records.into_iter();
        let mut results = Vec::with_capacity(records.size_hint().0);
        let limit_bytes = self.setup.limits.memory_bytes;
        if self.poisoned {
            results.extend(records.map(|_| Err(RunError::OutOfMemory { limit_bytes })));
            return results;
        }
        let budget = &self.budget;
        let call_budget = self.setup.limits.call_budget;
        let limits = self.setup.limits;
        let log = &self.setup.log;
        let mut poisoned = false;
        let atoms = &mut self.atoms;
        self.context.with(|ctx| {
            let transform =
                ctx.globals().get::<_, Value>(PINNED_TRANSFORM).map_err(|e| caught(&ctx, e));
            let plain = Plain::new(&ctx);
            for record in records {
                if spent >= output_budget {
                    break;
                }
                log.call_started();
                if poisoned {
                    results.push(Err(RunError::OutOfMemory { limit_bytes }));
                    continue;
                }
                budget.start(call_budget);
                let result = match &transform {
                    Ok(transform) => {
                        run_one(&ctx, atoms, plain.as_ref(), transform, record, &limits)
                    }
                    Err(Failure::OutOfMemory) => Err(Failure::OutOfMemory),
                    Err(Failure::Run(error)) => Err(Failure::Run(error.clone())),
                    Err(Failure::TooLarge) => Err(Failure::TooLarge),
                };
                let timed_out = budget.fired.load(Ordering::Relaxed);
                // Promise callbacks and `queueMicrotask` jobs the call queued run now, in
                // what is left of the budget, so that they cannot pile up in the runtime;
                // what they throw or return is ignored (they cannot change the output).
                while !timed_out && !budget.is_over() && ctx.execute_pending_job() {}
                budget.stop();
                let result = result.map_err(|failure| match failure {
                    _ if timed_out => RunError::TimedOut { budget: call_budget },
                    Failure::OutOfMemory => {
                        poisoned = true;
                        RunError::OutOfMemory { limit_bytes }
                    }
                    Failure::Run(error) => error,
                    // `run_one` names the record and the cap; this is only a fallback.
                    Failure::TooLarge => {
                        RunError::RecordTooLarge { index: 0, limit: limits.max_record_bytes }
                    }
                });
                if let Ok(output) = &result {
                    spent = spent.saturating_add(output.iter().map(Vec::len).sum());
                }
                results.push(result);
            }
        });
        self.poisoned = poisoned;
        results
    }
}

impl Drop for ScriptEngine {
    fn drop(&mut self) {
        // While unwinding (a panic inside the engine's lock), entering the context again
        // would panic twice; the runtime frees the atoms with everything else.
        if std::thread::panicking() {
            return;
        }
        let mut atoms = std::mem::take(&mut self.atoms);
        self.context.with(|ctx| atoms.release(&ctx));
    }
}

/// How a call failed, before the budget flag is consulted.
enum Failure {
    Run(RunError),
    OutOfMemory,
    /// A returned record's JSON passed the byte limit it was given.
    TooLarge,
}

fn run_one<'js>(
    ctx: &Ctx<'js>,
    atoms: &mut AtomCache,
    plain: Option<&Plain<'js>>,
    transform: &Value<'js>,
    record: &[u8],
    limits: &Limits,
) -> Result<Output, Failure> {
    let parsed = match json::parse(ctx, atoms, record) {
        Ok(Some(input)) => Ok(input),
        Ok(None) => ctx.json_parse(record),
        Err(error) => Err(error),
    };
    let input = match parsed {
        Ok(input) => input,
        Err(error) => {
            return Err(match caught(ctx, error) {
                Failure::Run(RunError::Threw { message, .. }) => {
                    Failure::Run(RunError::BadInput { message })
                }
                other => other,
            });
        }
    };
    if !is_plain_object(&input) {
        return Err(Failure::Run(RunError::BadInput { message: describe(&input) }));
    }
    let Some(function) = transform.as_function() else {
        return Err(Failure::Run(RunError::Threw {
            message: format!("TypeError: transform is {}, not a function", describe(transform)),
            line: None,
            column: None,
        }));
    };
    let output: Value = function.call((input,)).map_err(|error| caught(ctx, error))?;
    if output.is_undefined() || output.is_null() {
        return Ok(Vec::new());
    }
    // The caps are checked while the output is converted, before it can grow: the array's
    // length before any element is read, each record's bytes as they are written.
    let mut total = 0;
    let mut convert = |index: usize, element: Value<'js>| {
        let remaining = limits.max_output_bytes.saturating_sub(total);
        let limit = limits.max_record_bytes.min(remaining);
        match stringify(ctx, atoms, plain, element, limit) {
            Ok(text) => {
                total += text.len();
                Ok(text)
            }
            Err(Failure::TooLarge) if remaining < limits.max_record_bytes => {
                Err(Failure::Run(RunError::OutputTooLarge {
                    index,
                    limit: limits.max_output_bytes,
                }))
            }
            Err(Failure::TooLarge) => Err(Failure::Run(RunError::RecordTooLarge {
                index,
                limit: limits.max_record_bytes,
            })),
            Err(other) => Err(other),
        }
    };
    if let Some(array) = output.as_array() {
        // `Array::len` asserts an int length; a sparse array's length may be a float.
        let length: f64 = array.as_object().get("length").map_err(|error| caught(ctx, error))?;
        if length > limits.max_fan_out as f64 {
            return Err(Failure::Run(RunError::TooManyRecords {
                count: length as usize,
                limit: limits.max_fan_out,
            }));
        }
        let mut records = Vec::with_capacity(length as usize);
        for (index, element) in array.iter::<Value>().enumerate() {
            let element = element.map_err(|error| caught(ctx, error))?;
            if !is_plain_object(&element) {
                return Err(Failure::Run(RunError::NotAnObject {
                    found: format!("an array whose element {index} is {}", describe(&element)),
                }));
            }
            records.push(convert(index, element)?);
        }
        return Ok(records);
    }
    if !is_plain_object(&output) {
        return Err(Failure::Run(RunError::NotAnObject { found: describe(&output) }));
    }
    Ok(vec![convert(0, output)?])
}

/// The JSON text of `value`, or [`Failure::TooLarge`] when it is longer than `limit` bytes.
fn stringify<'js>(
    ctx: &Ctx<'js>,
    atoms: &mut AtomCache,
    plain: Option<&Plain<'js>>,
    value: Value<'js>,
    limit: usize,
) -> Result<Vec<u8>, Failure> {
    if let (Some(plain), Type::Object) = (plain, value.type_of()) {
        let mut out = Vec::with_capacity(1024.min(limit + 1));
        match plain.write_object(atoms, &value, &mut out, limit) {
            Ok(()) if out.len() > limit => return Err(Failure::TooLarge),
            Ok(()) => return Ok(out),
            Err(Stop::Engine(error)) => return Err(caught(ctx, error)),
            Err(Stop::TooLarge) => return Err(Failure::TooLarge),
            Err(Stop::Unsupported) => {}
        }
    }
    // What the native writer does not replicate: the engine builds the text in its own heap,
    // under its memory limit, and it is checked before it is copied out.
    match ctx.json_stringify(value) {
        Ok(Some(text)) => {
            let text = text.to_cstring().map_err(|error| caught(ctx, error))?;
            let bytes = text.as_str().as_bytes();
            // QuickJS hands out UTF-8 already: copy it without validating it again.
            if bytes.len() > limit { Err(Failure::TooLarge) } else { Ok(bytes.to_vec()) }
        }
        // A `toJSON` that answers undefined.
        Ok(None) => Err(Failure::Run(RunError::NotAnObject {
            found: "an object that serializes to nothing".to_owned(),
        })),
        Err(error) => Err(caught(ctx, error)),
    }
}

/// An object that serializes as a JSON object: not an array, a function or a promise.
fn is_plain_object(value: &Value<'_>) -> bool {
    value.is_object() && !value.is_array() && !value.is_function() && !value.is_promise()
}

fn describe(value: &Value<'_>) -> String {
    if value.is_undefined() {
        "undefined".to_owned()
    } else if value.is_null() {
        "null".to_owned()
    } else if value.is_bool() {
        "a boolean".to_owned()
    } else if value.is_number() {
        "a number".to_owned()
    } else if value.is_string() {
        "a string".to_owned()
    } else if value.is_array() {
        "an array".to_owned()
    } else if value.is_function() {
        "a function".to_owned()
    } else if value.is_promise() {
        "a Promise (transform must be synchronous)".to_owned()
    } else if value.is_object() {
        "an object".to_owned()
    } else {
        format!("a {}", value.type_name())
    }
}

/// Turns an engine error into a failure, taking the pending exception if there is one.
fn caught(ctx: &Ctx<'_>, error: rquickjs::Error) -> Failure {
    match error {
        rquickjs::Error::Exception => {
            let thrown = ctx.catch();
            let Thrown { message, line, column, out_of_memory } = Thrown::from_value(&thrown);
            if out_of_memory {
                Failure::OutOfMemory
            } else {
                Failure::Run(RunError::Threw { message, line, column })
            }
        }
        rquickjs::Error::Allocation => Failure::OutOfMemory,
        other => {
            Failure::Run(RunError::Threw { message: other.to_string(), line: None, column: None })
        }
    }
}

/// A thrown JavaScript value, described.
struct Thrown {
    message: String,
    line: Option<u32>,
    column: Option<u32>,
    out_of_memory: bool,
}

impl Thrown {
    fn from_value(value: &Value<'_>) -> Self {
        // QuickJS throws `null` when it cannot even allocate the error object.
        if value.is_null() {
            return Self {
                message: "null".to_owned(),
                line: None,
                column: None,
                out_of_memory: true,
            };
        }
        if let Some(exception) = value.as_object().and_then(|o| Exception::from_object(o.clone())) {
            let name = exception.get::<_, String>("name").unwrap_or_else(|_| "Error".to_owned());
            let text = exception.message().unwrap_or_default();
            let (line, column) = exception.stack().as_deref().map_or((None, None), position);
            let out_of_memory = name == "InternalError" && text == "out of memory";
            let message = if text.is_empty() { name } else { format!("{name}: {text}") };
            return Self { message, line, column, out_of_memory };
        }
        Self { message: show(value), line: None, column: None, out_of_memory: false }
    }
}

/// A thrown non-Error value as a message: strings as they are, anything else as JSON when
/// possible.
fn show(value: &Value<'_>) -> String {
    if let Some(text) = value.as_string().and_then(|s| s.to_string().ok()) {
        return text;
    }
    value
        .ctx()
        .json_stringify(value.clone())
        .ok()
        .flatten()
        .and_then(|s| s.to_string().ok())
        .unwrap_or_else(|| describe(value))
}

/// The first `script.js:LINE:COLUMN` in a QuickJS stack trace.
fn position(stack: &str) -> (Option<u32>, Option<u32>) {
    let marker = format!("{SCRIPT_NAME}:");
    for (start, _) in stack.match_indices(&marker) {
        let mut parts = stack[start + marker.len()..].split(':');
        let line = parts.next().and_then(|n| n.parse::<u32>().ok());
        let column = parts.next().and_then(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        if line.is_some() {
            return (line, column);
        }
    }
    (None, None)
}

/// Evaluates the bootstrap and the script, and checks that `transform` is a function.
fn load(ctx: &Ctx<'_>, setup: &Setup) -> Result<(), ScriptError> {
    let script_error = |kind, error| -> ScriptError {
        match caught(ctx, error) {
            Failure::OutOfMemory => ScriptError {
                kind: ScriptErrorKind::OutOfMemory,
                message: format!(
                    "the script's top-level code ran out of memory (limit {} bytes)",
                    setup.limits.memory_bytes
                ),
                line: None,
                column: None,
            },
            Failure::Run(RunError::Threw { message, line, column }) => {
                let kind =
                    if message.starts_with("SyntaxError") { ScriptErrorKind::Syntax } else { kind };
                ScriptError { kind, message, line, column }
            }
            Failure::Run(other) => {
                ScriptError { kind, message: other.to_string(), line: None, column: None }
            }
            Failure::TooLarge => ScriptError {
                kind,
                message: "a value was too large".to_owned(),
                line: None,
                column: None,
            },
        }
    };
    globals::install(
        ctx,
        Arc::clone(&setup.lookup),
        Arc::clone(&setup.owner_user_id),
        Arc::clone(&setup.log),
    )
    .map_err(|error| script_error(ScriptErrorKind::OutOfMemory, error))?;
    let mut options = EvalOptions::default();
    options.global = true;
    options.strict = false;
    options.filename = Some(SCRIPT_NAME.to_owned());
    ctx.eval_with_options::<(), _>(setup.source.as_bytes(), options)
        .map_err(|error| script_error(ScriptErrorKind::Threw, error))?;
    // `transform` may be a lexical binding (`const transform = ...`), which is not a
    // property of the global object: read it with a global-scope expression.
    let transform: Value = ctx
        .eval("typeof transform === 'undefined' ? undefined : transform")
        .map_err(|error| script_error(ScriptErrorKind::Threw, error))?;
    if !transform.is_function() {
        return Err(ScriptError {
            kind: ScriptErrorKind::MissingTransform,
            message: format!(
                "the script must define a function named transform(record); transform is {}",
                describe(&transform)
            ),
            line: None,
            column: None,
        });
    }
    // Pinned where a call finds it in one property lookup and the script cannot replace it.
    Object::new(ctx.clone())
        .and_then(|descriptor| {
            descriptor.set("value", transform)?;
            let object: Object = ctx.globals().get("Object")?;
            let define: rquickjs::Function = object.get("defineProperty")?;
            define.call::<_, ()>((ctx.globals(), PINNED_TRANSFORM, descriptor))
        })
        .map_err(|error| script_error(ScriptErrorKind::OutOfMemory, error))
}

#[cfg(test)]
mod tests {
    use super::position;

    #[test]
    fn position_reads_the_first_frame_of_the_script() {
        assert_eq!(
            position("    at f (script.js:2:25)\n    at <eval> (script.js:3:1)\n"),
            (Some(2), Some(25))
        );
        assert_eq!(position("    at script.js:7:13\n"), (Some(7), Some(13)));
        assert_eq!(position("    at <native>\n"), (None, None));
    }
}
