//! Integration tests of the script engine, through its public API.

mod compile;
mod json;
mod limits;
mod transform;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_core::datasets::{DatasetLookup, NoDatasets};
use sluice_js::{Limits, LogLevel, LogSink, NoLogs, Output, RunError, ScriptEngine};

/// Datasets held in memory: `(owner, dataset, value)`; values compared lowercased.
pub struct TestDatasets(pub Vec<(&'static str, &'static str, &'static str)>);

impl DatasetLookup for TestDatasets {
    fn contains_any(&self, owner: &str, dataset: &str, values: &[&str]) -> bool {
        values.iter().any(|value| {
            let value = value.to_lowercase();
            self.0.iter().any(|(o, d, v)| *o == owner && *d == dataset && *v == value)
        })
    }
}

/// Keeps every `console.*` line.
#[derive(Default)]
pub struct CapturedLogs(pub Mutex<Vec<(LogLevel, String)>>);

impl LogSink for CapturedLogs {
    fn log(&self, level: LogLevel, message: &str) {
        self.0.lock().expect("log lock").push((level, message.to_owned()));
    }
}

pub fn limits() -> Limits {
    Limits {
        memory_bytes: 32 * 1024 * 1024,
        call_budget: Duration::from_millis(100),
        ..Limits::for_pod_size(sluice_core::pipeline::PodSize::S)
    }
}

/// An engine with no datasets and no logs.
pub fn load(source: &str) -> ScriptEngine {
    ScriptEngine::new(source, limits(), Arc::new(NoDatasets), "user-1", Arc::new(NoLogs))
        .expect("the test script loads")
}

/// Runs one record given as JSON text, answering the output records as JSON values.
pub fn run(engine: &mut ScriptEngine, record: &str) -> Result<Vec<serde_json::Value>, RunError> {
    engine.run(record.as_bytes()).map(|output| parse(&output))
}

pub fn parse(output: &Output) -> Vec<serde_json::Value> {
    output
        .iter()
        .map(|bytes| serde_json::from_slice(bytes).expect("the engine outputs JSON"))
        .collect()
}

pub fn text(output: &Output) -> Vec<String> {
    output.iter().map(|bytes| String::from_utf8(bytes.clone()).expect("UTF-8 output")).collect()
}
