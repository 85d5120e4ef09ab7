//! `sluice-js` runs a pipeline's script transform (`type: "v8"`): an embedded JavaScript
//! engine (QuickJS, through `rquickjs`, compiled from source with the machine's C compiler)
//! behind a small API shaped for a pipeline worker.
//!
//! It owns the engine dependency so no other crate links it; it depends only on
//! `sluice-core` (for [`DatasetLookup`] and [`PodSize`]) and must not depend on the store,
//! the bus, the runtime or the API. Start reading at [`compile_check`] (what the API calls
//! when a script is created or changed) and [`ScriptEngine`] (what a worker runs), then
//! `docs/scripts.md` for the contract users see.
//!
//! The contract: the script defines `function transform(record)`; the record is the parsed
//! JSON object; a returned object goes on, `null`/`undefined` drops the record, an array
//! emits each element (each must be an object). The globals `beam.contains(datasetName,
//! values)` and `console.log/info/debug/warn/error` are the only host access: no file
//! system, network, timers or modules.

mod engine;
mod error;
mod globals;
mod json;
mod raw;

use std::sync::Arc;
use std::time::Duration;

use sluice_core::datasets::{DatasetLookup, NoDatasets};
use sluice_core::pipeline::PodSize;

pub use engine::ScriptEngine;
pub use error::{Fault, RunError, ScriptError, ScriptErrorKind};
pub use globals::{LogLevel, LogSink, MAX_LOG_MESSAGE_BYTES, NoLogs};

/// The records one `transform` call produced, each the bytes of one JSON object: empty when
/// the record was dropped, more than one when the script fanned out.
pub type Output = Vec<Vec<u8>>;

/// Default time one `transform` call may run. Generous for per-record work (the benchmark script takes about a
/// microsecond) while keeping a stuck call from holding a worker's batch for long: at
/// 100 ms an infinite loop costs one batch a tenth of a second before it is cut off and the
/// record is treated as failed.
pub const DEFAULT_CALL_BUDGET: Duration = Duration::from_millis(100);

const MIB: usize = 1024 * 1024;

/// Memory limit of one worker's script runtime for a pipeline of `pod_size`.
///
/// S 64 MiB, M 96 MiB, L 128 MiB, XL 256 MiB per worker. A runtime holds the script, its
/// own state (lookup tables it builds) and one record at a time (a few KiB), so 64 MiB is
/// already ample for per-record work; bigger pods run more workers (1/2/4/8) and also get
/// more room per worker for scripts that keep larger tables. Totals per pod: S 64 MiB,
/// M 192 MiB, L 512 MiB, XL 2 GiB.
pub fn memory_limit_for(pod_size: PodSize) -> usize {
    match pod_size {
        PodSize::S => 64 * MIB,
        PodSize::M => 96 * MIB,
        PodSize::L => 128 * MIB,
        PodSize::XL => 256 * MIB,
    }
}

/// Most records one `transform` call may return (the length of the returned array), for
/// every pod size. Checked before any element is read: `new Array(1e6).fill(r)` costs the
/// worker nothing.
pub const MAX_FAN_OUT: usize = 1_000;

/// Most bytes of JSON one returned record may serialize to, for every pod size: the
/// serialization stops as soon as it passes this.
pub const MAX_OUTPUT_RECORD_BYTES: usize = MIB;

/// Most bytes of JSON all the records of one `transform` call may serialize to together,
/// for a pipeline of `pod_size`: a sixteenth of the runtime's memory limit (S 4 MiB, M 6 MiB,
/// L 8 MiB, XL 16 MiB).
pub fn output_limit_for(pod_size: PodSize) -> usize {
    memory_limit_for(pod_size) / 16
}

/// What a script runtime may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes the runtime may allocate; an allocation beyond it fails and the engine reports
    /// [`RunError::OutOfMemory`].
    pub memory_bytes: usize,
    /// Time one `transform` call may run.
    pub call_budget: Duration,
    /// Most records one call may return ([`RunError::TooManyRecords`] beyond).
    pub max_fan_out: usize,
    /// Most bytes of JSON one returned record may take ([`RunError::RecordTooLarge`]).
    pub max_record_bytes: usize,
    /// Most bytes of JSON the records of one call may take together
    /// ([`RunError::OutputTooLarge`]).
    pub max_output_bytes: usize,
}

/// Least time the script's top-level code may run when an engine is built: it may build
/// lookup tables, and it runs once per worker start, not per record.
pub const MIN_LOAD_BUDGET: Duration = Duration::from_secs(1);

impl Limits {
    /// Time the script's top-level code may run when an engine is built: the call budget,
    /// and at least [`MIN_LOAD_BUDGET`].
    pub fn load_budget(&self) -> Duration {
        self.call_budget.max(MIN_LOAD_BUDGET)
    }

    /// The limits of a worker of a pipeline of `pod_size`, with [`DEFAULT_CALL_BUDGET`],
    /// [`MAX_FAN_OUT`], [`MAX_OUTPUT_RECORD_BYTES`] and [`output_limit_for`].
    pub fn for_pod_size(pod_size: PodSize) -> Self {
        Self {
            memory_bytes: memory_limit_for(pod_size),
            call_budget: DEFAULT_CALL_BUDGET,
            max_fan_out: MAX_FAN_OUT,
            max_record_bytes: MAX_OUTPUT_RECORD_BYTES,
            max_output_bytes: output_limit_for(pod_size),
        }
    }
}

/// Checks that `source` parses, that its top-level code runs (under the limits of an `S`
/// worker, with every dataset empty and `console` discarded) and that it defines a function
/// named `transform`.
///
/// # Errors
/// A [`ScriptError`] whose message carries the engine's message and, when it reports one,
/// the line and column.
pub fn compile_check(source: &str) -> Result<(), ScriptError> {
    ScriptEngine::new(
        source,
        Limits::for_pod_size(PodSize::S),
        Arc::new(NoDatasets) as Arc<dyn DatasetLookup>,
        "",
        Arc::new(NoLogs),
    )
    .map(drop)
}
