//! One processed batch as records to write, shared by workers and dead-letter replay: the
//! sink's records, the dead letters and the script log lines. The batch's [`Sink`] delivers
//! them and settles its offsets ([`Sink::deliver`]).
//!
//! [`Sink`]: crate::sinks::Sink
//! [`Sink::deliver`]: crate::sinks::Sink::deliver

use sluice_bus::{NewRecord, topics};

use crate::plan::{Engines, Failed, LogLine, Outcome};

/// The topics a pipeline's batches write besides the sink.
#[derive(Debug, Clone)]
pub struct SideTopics {
    pub dead_letters: String,
    pub logs: String,
}

impl SideTopics {
    pub fn new(pipeline_id: &str) -> Self {
        Self {
            dead_letters: topics::dead_letter_topic(pipeline_id),
            logs: topics::logs_topic(pipeline_id),
        }
    }
}

/// What one batch writes besides its offsets.
#[derive(Debug)]
pub struct Delivery {
    /// Records for the sink, in order.
    pub out: Vec<NewRecord>,
    /// Records a transform failed on.
    pub dead: Vec<NewRecord>,
    /// The scripts' `console.*` lines of the batch.
    pub logs: Vec<NewRecord>,
    /// When the batch was processed (stamps the dead letters).
    pub made_at: chrono::DateTime<chrono::Utc>,
}

impl Delivery {
    /// The records `outcome` produced, and the log lines the scripts of `engines` wrote while
    /// producing them; `now` stamps the dead letters.
    pub fn of(outcome: Outcome, engines: &Engines, now: chrono::DateTime<chrono::Utc>) -> Self {
        Self {
            out: outcome.out.into_iter().map(|item| NewRecord::new(item.key, item.value)).collect(),
            dead: outcome.failed.into_iter().map(|failed| dead_letter(failed, now)).collect(),
            logs: engines.take_logs().iter().map(log_record).collect(),
            made_at: now,
        }
    }
}

/// The dead-letter record of a record a transform failed on: the same key, and a JSON object
/// with the transform, the error, the attempts, when, and the record itself.
fn dead_letter(failed: Failed, now: chrono::DateTime<chrono::Utc>) -> NewRecord {
    let Failed { item, transform_uid, error, attempts } = failed;
    let record = serde_json::from_slice::<serde_json::Value>(&item.value).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&item.value).into_owned())
    });
    let value = serde_json::json!({
        "transform_uid": transform_uid,
        "error": error,
        "attempts": attempts,
        "failed_at": sluice_core::time::format(now),
        "record": record,
    });
    NewRecord::new(item.key, serde_json::to_vec(&value).expect("a dead letter serializes"))
}

/// A script log line as a record of the logs topic (keyed by its transform).
fn log_record(line: &LogLine) -> NewRecord {
    NewRecord::new(
        line.transform_uid.as_bytes().to_vec(),
        serde_json::to_vec(line).expect("a log line serializes"),
    )
}
