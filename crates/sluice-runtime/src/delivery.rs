//! Delivery of one processed batch, shared by workers and dead-letter replay: the sink's
//! records, the dead letters and the script log lines are written together with the
//! consumer offsets that the batch settles, in one step of the log
//! ([`StreamLog::append_and_commit`]): on the embedded log one durable transaction, so a
//! crash leaves all of it or none.

use std::sync::Arc;

use sluice_bus::{BusError, NewRecord, StreamLog, topics};

use crate::plan::{Engines, Failed, LogLine, Outcome};

/// The topics one pipeline's batches write.
#[derive(Debug, Clone)]
pub(crate) struct DeliveryTopics {
    /// The managed sink's topic.
    pub sink: String,
    pub dead_letters: String,
    pub logs: String,
}

impl DeliveryTopics {
    pub(crate) fn new(pipeline_id: &str, sink: String) -> Self {
        Self {
            sink,
            dead_letters: topics::dead_letter_topic(pipeline_id),
            logs: topics::logs_topic(pipeline_id),
        }
    }
}

/// What one batch writes besides its offsets.
#[derive(Debug, Default)]
pub(crate) struct Delivery {
    /// Records for the sink, in order.
    pub out: Vec<NewRecord>,
    /// Records a transform failed on.
    pub dead: Vec<NewRecord>,
    /// The scripts' `console.*` lines of the batch.
    pub logs: Vec<NewRecord>,
}

impl Delivery {
    /// The records `outcome` produced, and the log lines the scripts of `engines` wrote while
    /// producing them; `now` stamps the dead letters.
    pub(crate) fn of(
        outcome: Outcome,
        engines: &Engines,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Self {
        Self {
            out: outcome
                .out
                .into_iter()
                .map(|item| NewRecord { key: item.key, value: item.value })
                .collect(),
            dead: outcome.failed.into_iter().map(|failed| dead_letter(failed, now)).collect(),
            logs: engines.take_logs().iter().map(log_record).collect(),
        }
    }

    /// Writes the batch to `topics` and commits `offsets` of `source` for `group`, in one
    /// step of the log.
    ///
    /// # Errors
    /// The log's failure; then nothing of the batch was written (on the embedded log) and
    /// the offsets did not move.
    pub(crate) async fn write(
        &self,
        log: &Arc<dyn StreamLog>,
        topics: &DeliveryTopics,
        group: &str,
        source: &str,
        offsets: &[(u32, u64)],
    ) -> Result<(), BusError> {
        let appends: [(&str, &[NewRecord]); 3] = [
            (&topics.sink, &self.out),
            (&topics.dead_letters, &self.dead),
            (&topics.logs, &self.logs),
        ];
        log.append_and_commit(&appends, group, source, offsets).await.map(|_| ())
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
    NewRecord {
        key: item.key,
        value: serde_json::to_vec(&value).expect("a dead letter serializes"),
    }
}

/// A script log line as a record of the logs topic (keyed by its transform).
fn log_record(line: &LogLine) -> NewRecord {
    NewRecord {
        key: line.transform_uid.as_bytes().to_vec(),
        value: serde_json::to_vec(line).expect("a log line serializes"),
    }
}
