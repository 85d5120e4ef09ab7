//! The two error types of the crate: [`ScriptError`] for a script that cannot be loaded, and
//! [`RunError`] for one call of `transform` that did not produce records.

use std::fmt;
use std::time::Duration;

/// Why a script could not be loaded (at create/update time, or when a worker builds its
/// engine). Always the user's script's fault except [`ScriptErrorKind::OutOfMemory`] when the
/// engine itself could not be created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}{}", Position(*line, *column))]
pub struct ScriptError {
    pub kind: ScriptErrorKind,
    /// The engine's message, e.g. `SyntaxError: unexpected token in expression: ';'`.
    pub message: String,
    /// 1-based line in the script, when the engine reports one.
    pub line: Option<u32>,
    /// 1-based column in the script, when the engine reports one.
    pub column: Option<u32>,
}

/// What kind of problem a [`ScriptError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptErrorKind {
    /// The source does not parse.
    Syntax,
    /// The script runs but defines no function called `transform`.
    MissingTransform,
    /// The script's top-level code threw.
    Threw,
    /// The script's top-level code ran over the time budget.
    TimedOut,
    /// The script's top-level code (or the engine's set-up) ran out of memory.
    OutOfMemory,
}

/// Why one call of `transform` produced no records.
///
/// Every variant but [`RunError::OutOfMemory`] is about that one record: the engine stays
/// usable and the caller goes on with the next record (and may dead-letter this one).
/// [`RunError::OutOfMemory`] is fatal to the engine: see [`RunError::is_fatal`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The input bytes are not one JSON object.
    #[error("record is not a JSON object: {message}")]
    BadInput { message: String },
    /// The script threw (or a value it returned could not be serialized, e.g. a BigInt or a
    /// cycle).
    #[error("transform threw {message}{}", Position(*line, *column))]
    Threw { message: String, line: Option<u32>, column: Option<u32> },
    /// The call ran over the per-call time budget and was interrupted.
    #[error("transform ran over its time budget of {} ms", budget.as_millis())]
    TimedOut { budget: Duration },
    /// `transform` returned something that is not an object, an array of objects, `null` or
    /// `undefined`.
    #[error(
        "transform returned {found}; expected an object, an array of objects, null or undefined"
    )]
    NotAnObject { found: String },
    /// `transform` returned an array longer than [`crate::Limits::max_fan_out`].
    #[error("transform returned {count} records; at most {limit} are allowed per input record")]
    TooManyRecords { count: usize, limit: usize },
    /// A returned record serializes to more than [`crate::Limits::max_record_bytes`].
    #[error("transform returned a record (index {index}) larger than {limit} bytes of JSON")]
    RecordTooLarge { index: usize, limit: usize },
    /// The returned records together serialize to more than
    /// [`crate::Limits::max_output_bytes`].
    #[error("transform returned more than {limit} bytes of JSON in all (at record index {index})")]
    OutputTooLarge { index: usize, limit: usize },
    /// The runtime hit its memory limit. The engine refuses further calls: the worker must
    /// be restarted (count it as an OOM kill) and build a new engine, or call
    /// [`crate::ScriptEngine::restart`].
    #[error("script runtime ran out of memory (limit {limit_bytes} bytes)")]
    OutOfMemory { limit_bytes: usize },
}

/// Whose fault a [`RunError`] is, for dead-lettering and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The record (its content does not suit the script, or it is not JSON).
    Record,
    /// The script (it exhausted the runtime's memory); retrying the same record on a fresh
    /// engine may or may not help.
    Worker,
}

impl RunError {
    /// Whether the engine is unusable after this error: the caller must restart the worker.
    pub fn is_fatal(&self) -> bool {
        matches!(self, RunError::OutOfMemory { .. })
    }

    /// Whether calling `transform` again on the same record may answer differently. The
    /// output caps are deterministic for a given script and record: retrying them only
    /// burns time.
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self,
            RunError::TooManyRecords { .. }
                | RunError::RecordTooLarge { .. }
                | RunError::OutputTooLarge { .. }
        )
    }

    /// Whose fault the error is.
    pub fn fault(&self) -> Fault {
        if self.is_fatal() { Fault::Worker } else { Fault::Record }
    }
}

struct Position(Option<u32>, Option<u32>);

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, self.1) {
            (Some(line), Some(column)) => write!(f, " (line {line}, column {column})"),
            (Some(line), None) => write!(f, " (line {line})"),
            _ => Ok(()),
        }
    }
}
