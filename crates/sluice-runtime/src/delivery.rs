//! One processed batch as records to write, shared by workers and dead-letter replay: the
//! sink's records, the dead letters and the script log lines. The batch's [`Sink`] delivers
//! them and settles its offsets ([`Sink::deliver`]). Also the replay of a pipeline's dead
//! letters (`replay`), which its lifecycle owner runs.
//!
//! [`Sink`]: crate::sinks::Sink
//! [`Sink::deliver`]: crate::sinks::Sink::deliver

use std::sync::Arc;

use sluice_bus::{BusError, NewRecord, StreamLog, topics};
use sluice_core::clock::Clock;

use crate::plan::{BoundPlan, Engines, Failed, Item, LogLine, Outcome, batch_output_budget};
use crate::{Result, RuntimeError, sinks};

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
    /// Where each record of `out` came from, for a sink that asks
    /// ([`Sink::wants_origins`](crate::sinks::Sink::wants_origins)); empty otherwise.
    pub origins: Vec<Origin>,
}

/// Where a record came from: its source partition and offset, and when it was appended
/// there (Unix milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    pub partition: u32,
    pub offset: u64,
    pub timestamp_ms: i64,
}

impl Delivery {
    /// The records `outcome` produced, and the log lines the scripts of `engines` wrote while
    /// producing them; `now` stamps the dead letters. `positions` (by input index, empty
    /// when not tracked) give each record's origin.
    pub fn of(
        outcome: Outcome,
        engines: &Engines,
        now: chrono::DateTime<chrono::Utc>,
        positions: &[Origin],
    ) -> Self {
        let origins = if positions.is_empty() {
            Vec::new()
        } else {
            outcome.out.iter().filter_map(|item| positions.get(item.origin).copied()).collect()
        };
        Self {
            origins,
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

/// Dead letters read per step of a replay.
const REPLAY_CHUNK: usize = 1000;

/// What a replay of dead letters did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Dead letters fed through the transforms again.
    pub replayed: u64,
    /// Records that reached the sink.
    pub delivered: u64,
    /// Records that failed again (new dead letters, after the cursor).
    pub dead_lettered: u64,
    /// The replay cursor afterwards: the first dead letter not replayed.
    pub next_offset: u64,
}

/// The first dead letter of `pipeline_id` not replayed yet (0 when none was).
///
/// # Errors
/// A log failure.
pub async fn dead_letter_cursor(log: &Arc<dyn StreamLog>, pipeline_id: &str) -> Result<u64> {
    let topic = topics::dead_letter_topic(pipeline_id);
    match log.committed(&topics::replay_group(pipeline_id), &topic).await {
        Ok(committed) => Ok(committed.get(&0).copied().unwrap_or(0)),
        Err(BusError::UnknownTopic(_)) => Ok(0),
        Err(error) => Err(error.into()),
    }
}

/// Feeds the dead letters of `plan`'s pipeline not replayed yet through `plan`, each from
/// the transform that failed on it (from the first when that transform is gone): what
/// passes goes to the sink, what fails again becomes a new dead letter, and the replay
/// cursor moves past them, all in one log step per chunk (up to [`REPLAY_CHUNK`] letters,
/// fewer once their output reaches the pod size's batch budget).
///
/// # Errors
/// A log or sink failure, or transforms that panicked.
pub(crate) async fn replay(
    log: &Arc<dyn StreamLog>,
    clock: &dyn Clock,
    plan: &Arc<BoundPlan>,
) -> Result<Replayed> {
    let pipeline_id = plan.plan.pipeline_id.as_str();
    let Some(sink) = plan.plan.sinks.first().cloned() else {
        return Ok(Replayed::default());
    };
    let side = SideTopics::new(pipeline_id);
    let dead_topic = side.dead_letters.clone();
    let group = topics::replay_group(pipeline_id);
    let end = match log.offsets(&dead_topic).await {
        Ok(ranges) => ranges.first().map_or(0, |range| range.end),
        Err(BusError::UnknownTopic(_)) => return Ok(Replayed::default()),
        Err(error) => return Err(error.into()),
    };
    // A sink that keeps its own positions (a SQL sink) may be past the log's cursor.
    let cursor = dead_letter_cursor(log, pipeline_id).await?;
    let own = sink.resume(&group, &dead_topic).await?;
    let next_offset = own.iter().find(|(p, _)| *p == 0).map_or(cursor, |r| r.1.clamp(cursor, end));
    let mut report = Replayed { next_offset, ..Replayed::default() };
    let mut engines = Engines::default();
    while report.next_offset < end {
        let want =
            usize::try_from(end - report.next_offset).unwrap_or(usize::MAX).min(REPLAY_CHUNK);
        let letters = log.read(&dead_topic, 0, report.next_offset, want).await?;
        let Some(read_to) = letters.last().map(|r| r.offset + 1) else { break };
        // Letters that cannot be read back are passed over (with the cursor).
        let (offsets, items): (Vec<u64>, Vec<(usize, Item)>) = letters
            .into_iter()
            .filter_map(|letter| {
                let offset = letter.offset;
                replay_item(plan, letter).map(|item| (offset, item))
            })
            .unzip();
        let moved_plan = plan.clone();
        let budget = batch_output_budget(plan.plan.pod_size);
        let (outcome, run, back) = tokio::task::spawn_blocking(move || {
            let (outcome, run) = moved_plan.replay_within(items, &mut engines, budget);
            (outcome, run, engines)
        })
        .await
        .map_err(|error| RuntimeError::Replay(error.to_string()))?;
        engines = back;
        report.replayed += run as u64;
        // Up to the first letter not run yet; all read when every one was run.
        let next = offsets.get(run).copied().unwrap_or(read_to);
        let delivery = Delivery::of(outcome, &engines, clock.now(), &[]);
        // The replay group's offset on the dead-letter topic is the replay cursor.
        let settle = sinks::Settle { group: &group, source: &dead_topic, offsets: &[(0, next)] };
        sink.deliver(log, &delivery, &side, settle).await?;
        report.delivered += delivery.out.len() as u64;
        report.dead_lettered += delivery.dead.len() as u64;
        report.next_offset = next;
    }
    Ok(report)
}

/// A dead letter as a record to feed again, with the stage it starts at.
fn replay_item(plan: &BoundPlan, letter: sluice_bus::Record) -> Option<(usize, Item)> {
    let body: serde_json::Value = serde_json::from_slice(&letter.value).ok()?;
    // A record a sink refused is already the transforms' output: it goes straight to the
    // sink again.
    let first = if body.get("sink_uid").is_some_and(serde_json::Value::is_string) {
        plan.plan.stages.len()
    } else {
        body["transform_uid"].as_str().and_then(|uid| plan.stage_of(uid)).unwrap_or(0)
    };
    let value = serde_json::to_vec(body.get("record")?).ok()?;
    Some((first, Item { key: letter.key, value: value.into(), origin: 0 }))
}
