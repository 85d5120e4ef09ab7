//! A pipeline compiled for the workers: the source topic, the transform stages in order and
//! the sink. [`Plan`] is checked and pure; [`BoundPlan`] holds the live set indexes
//! its set filters test against and the dataset lookup its scripts call, and runs a batch
//! through every stage ([`BoundPlan::run`]).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use sluice_bus::topics;
use sluice_core::clock::Clock;
use sluice_core::datasets::DatasetLookup;
use sluice_core::filter_expr::FilterExpr;
use sluice_core::pipeline::{Pipeline, PodSize, Transform};
use sluice_filter::SetFilter;
use sluice_js::{LogLevel, LogSink, ScriptEngine};

use crate::sets::SetHandle;
use crate::sinks::{self, Sink, SinkContext};

/// Calls of `transform` a record gets before it is dead-lettered: the first and two retries
/// (on a fresh engine when the runtime ran out of memory). A record whose output breaks a
/// cap (fan-out, bytes per record, bytes per call: `sluice_js::Limits`) is dead-lettered
/// after the first call.
pub const SCRIPT_ATTEMPTS: u32 = 3;

/// Why a stored pipeline cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("transform {uid}: the script cannot run: {reason}")]
    BadScript { uid: String, reason: String },
    #[error("transform {uid}: {reason}")]
    BadFilterExpr { uid: String, reason: String },
    #[error("the pipeline has {0} sinks; exactly one is required")]
    SinkCount(usize),
    #[error(transparent)]
    Sink(#[from] sinks::SinkBuildError),
}

/// One transform, ready to run.
#[derive(Debug, Clone)]
pub enum Stage {
    SetFilter { uid: String, filter: SetFilter },
    Script { uid: String, source: Arc<str> },
}

/// Checks and compiles transforms into stages, in order.
///
/// # Errors
/// A filter expression that does not parse, or a script that does not load.
pub fn compile_stages(transforms: &[Transform]) -> Result<Vec<Stage>, PlanError> {
    transforms
        .iter()
        .map(|transform| match transform {
            Transform::SetFilter { uid, filter_expr } => {
                let expr = FilterExpr::parse(filter_expr).map_err(|error| {
                    PlanError::BadFilterExpr { uid: uid.clone(), reason: error.to_string() }
                })?;
                Ok(Stage::SetFilter { uid: uid.clone(), filter: SetFilter::new(&expr) })
            }
            Transform::Script { uid, script } => match sluice_js::compile_check(script) {
                Ok(()) => Ok(Stage::Script { uid: uid.clone(), source: script.as_str().into() }),
                Err(error) => {
                    Err(PlanError::BadScript { uid: uid.clone(), reason: error.to_string() })
                }
            },
        })
        .collect()
}

/// A pipeline compiled for the workers.
#[derive(Debug, Clone)]
pub struct Plan {
    pub pipeline_id: String,
    /// The pipeline's owner, whose datasets `beam.contains` sees.
    pub owner_user_id: String,
    /// Sets the memory limit of each worker's script runtimes.
    pub pod_size: PodSize,
    /// The chain-stream topic the pipeline reads.
    pub source: String,
    pub stages: Vec<Stage>,
    /// Where the records go (exactly one).
    pub sinks: Vec<Arc<dyn Sink>>,
}

impl Plan {
    /// Compiles a stored pipeline, building its sinks with `context` (the secrets it names,
    /// resolved).
    ///
    /// # Errors
    /// [`PlanError`] for what this build cannot run.
    pub fn compile(pipeline: &Pipeline, context: SinkContext<'_>) -> Result<Self, PlanError> {
        let config = &pipeline.pipeline_config;
        let source = topics::chain_stream(
            &config.source.chain,
            &config.source.entity,
            config.source.is_zerolag,
        );
        let stages = compile_stages(&config.transforms)?;
        if config.sinks.len() != 1 {
            return Err(PlanError::SinkCount(config.sinks.len()));
        }
        let sinks = config
            .sinks
            .iter()
            .map(|sink| sinks::build(sink, context))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            pipeline_id: pipeline.id.clone(),
            owner_user_id: pipeline.owner_org_team_user_id.clone(),
            pod_size: pipeline.pod_size,
            source,
            stages,
            sinks,
        })
    }

    /// `(sink uid, managed topic)` of each sink whose records Sluice keeps.
    pub fn sink_topics(&self) -> Vec<(String, String)> {
        self.sinks
            .iter()
            .filter_map(|sink| {
                Some((sink.config().uid().to_owned(), sink.managed_topic()?.to_owned()))
            })
            .collect()
    }

    /// [`Plan::sink_topics`] of a pipeline, without building its sinks.
    pub fn managed_topics(pipeline: &Pipeline) -> Vec<(String, String)> {
        pipeline
            .pipeline_config
            .sinks
            .iter()
            .filter(|sink| !sink.is_external())
            .map(|sink| (sink.uid().to_owned(), topics::sink_topic(&pipeline.id, sink.name())))
            .collect()
    }

    /// Uids of the set filters, in stage order.
    pub fn set_filter_uids(&self) -> impl Iterator<Item = &str> {
        self.stages.iter().filter_map(|stage| match stage {
            Stage::SetFilter { uid, .. } => Some(uid.as_str()),
            Stage::Script { .. } => None,
        })
    }

    /// Whether a stage runs a script (the batch then runs off the async executor).
    pub fn has_scripts(&self) -> bool {
        self.stages.iter().any(|stage| matches!(stage, Stage::Script { .. }))
    }

    /// Attaches the live set indexes, one per set filter in stage order, and the dataset
    /// lookup of its scripts.
    pub fn bind(
        self,
        sets: Vec<Arc<SetHandle>>,
        datasets: Arc<dyn DatasetLookup>,
        clock: Arc<dyn Clock>,
    ) -> BoundPlan {
        BoundPlan { plan: self, sets, datasets, clock }
    }
}

/// A plan with its live set indexes.
pub struct BoundPlan {
    pub plan: Plan,
    sets: Vec<Arc<SetHandle>>,
    datasets: Arc<dyn DatasetLookup>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for BoundPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundPlan").field("plan", &self.plan).finish_non_exhaustive()
    }
}

/// A record on its way through the stages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub key: Bytes,
    pub value: Bytes,
    /// The position, in the batch given to [`BoundPlan::run`], of the source record this
    /// item comes from (a fan-out's records share it); items stay in this order.
    pub origin: usize,
}

/// A record a transform failed on, every attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    /// The record as it entered the failing transform.
    pub item: Item,
    pub transform_uid: String,
    pub error: String,
    pub attempts: u32,
}

/// What a batch became.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Records for the sink, in order.
    pub out: Vec<Item>,
    /// Records for the dead-letter topic.
    pub failed: Vec<Failed>,
    /// Times a script runtime ran out of memory and was replaced.
    pub oom_restarts: u64,
    /// When a script stage's output reached the batch output budget
    /// ([`batch_output_budget`]): the position of the first source record that was not
    /// processed. That record and every later one left no trace in this outcome; the caller
    /// runs them again in a later batch.
    pub deferred_from: Option<usize>,
}

/// Most bytes of JSON a script stage produces for one batch before the rest of the batch
/// is left for the next one: the pod size's script memory per worker (S 64 MiB, M 96 MiB,
/// L 128 MiB, XL 256 MiB). With the per-call caps (`sluice_js::Limits`) it bounds what a
/// worker holds for a batch, whatever its scripts return.
pub fn batch_output_budget(pod_size: PodSize) -> usize {
    sluice_js::memory_limit_for(pod_size)
}

/// Most `console.*` lines one worker keeps per batch; the rest are counted in one last line.
pub const MAX_LOG_LINES_PER_BATCH: usize = 1000;

/// One `console.*` line of a script.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogLine {
    /// RFC 3339.
    pub timestamp: String,
    pub level: String,
    pub transform_uid: String,
    pub message: String,
}

/// One worker's script runtimes, by transform uid; built on first use and rebuilt when the
/// script changes (a redeploy). Their `console.*` lines collect here until the worker
/// writes them with its batch.
#[derive(Default)]
pub struct Engines {
    by_uid: HashMap<String, (Arc<str>, ScriptEngine)>,
    logs: Arc<LogBuffer>,
}

impl Engines {
    /// Drops the runtimes of scripts `plan` no longer has (a redeploy removed them).
    pub fn keep_only(&mut self, plan: &BoundPlan) {
        self.by_uid.retain(|uid, _| plan.stage_of(uid).is_some());
    }

    /// The script log lines since the last call (at most [`MAX_LOG_LINES_PER_BATCH`], and
    /// a line counting the dropped ones).
    pub fn take_logs(&self) -> Vec<LogLine> {
        let mut buffer = self.logs.0.lock().expect("log buffer lock is never poisoned");
        let lines = std::mem::take(&mut buffer.lines);
        let dropped = std::mem::take(&mut buffer.dropped);
        let mut lines: Vec<LogLine> = lines.into_iter().map(|(_, line)| line).collect();
        if dropped > 0 {
            let last = lines.last().cloned().unwrap_or(LogLine {
                timestamp: String::new(),
                level: String::new(),
                transform_uid: String::new(),
                message: String::new(),
            });
            lines.push(LogLine {
                timestamp: last.timestamp,
                level: "warn".to_owned(),
                transform_uid: last.transform_uid,
                message: format!(
                    "{dropped} more lines of this batch were dropped \
                     (at most {MAX_LOG_LINES_PER_BATCH} per batch)"
                ),
            });
        }
        lines
    }
}

/// A worker's script lines until its batch is written.
#[derive(Default)]
struct LogBuffer(std::sync::Mutex<Lines>);

#[derive(Default)]
struct Lines {
    /// Each line with the number of the `transform` call that wrote it.
    lines: Vec<(u64, LogLine)>,
    /// Lines not kept, over [`MAX_LOG_LINES_PER_BATCH`].
    dropped: u64,
    /// Calls started so far: the number of the current call.
    calls: u64,
}

impl LogBuffer {
    /// The number the next `transform` call will get.
    fn next_call(&self) -> u64 {
        self.0.lock().expect("log buffer lock is never poisoned").calls + 1
    }

    /// Forgets the lines of call `call`: an attempt that is retried, whose lines the
    /// final attempt's replace (one copy of a record's lines, not one per attempt).
    fn discard_call(&self, call: u64) {
        let mut buffer = self.0.lock().expect("log buffer lock is never poisoned");
        buffer.lines.retain(|(of, _)| *of != call);
    }
}

impl std::fmt::Debug for Engines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engines").field("scripts", &self.by_uid.len()).finish()
    }
}

/// `console.*` of a pipeline's scripts: kept for the pipeline's logs, and in the process log
/// at debug level.
struct ScriptLog {
    pipeline_id: String,
    uid: String,
    clock: Arc<dyn Clock>,
    buffer: Arc<LogBuffer>,
}

impl LogSink for ScriptLog {
    fn call_started(&self) {
        self.buffer.0.lock().expect("log buffer lock is never poisoned").calls += 1;
    }

    fn log(&self, level: LogLevel, message: &str) {
        let (config_id, transform) = (&self.pipeline_id, &self.uid);
        tracing::debug!(%config_id, %transform, level = level.name(), "script: {message}");
        let mut buffer = self.buffer.0.lock().expect("log buffer lock is never poisoned");
        if buffer.lines.len() >= MAX_LOG_LINES_PER_BATCH {
            buffer.dropped += 1;
            return;
        }
        let call = buffer.calls;
        buffer.lines.push((
            call,
            LogLine {
                timestamp: sluice_core::time::format(self.clock.now()),
                level: level.name().to_owned(),
                transform_uid: self.uid.clone(),
                message: message.to_owned(),
            },
        ));
    }
}

impl BoundPlan {
    /// Runs a batch through every stage in order: set filters keep or drop records, scripts
    /// reshape, drop or fan them out. A record a script fails on ([`SCRIPT_ATTEMPTS`]
    /// calls) leaves the batch as [`Failed`]; the others go on. When a script runtime runs
    /// out of memory it is replaced by a fresh one (counted) and the record is tried again.
    ///
    /// Blocking: with scripts, call it off the async executor.
    pub fn run(&self, items: Vec<Item>, engines: &mut Engines) -> Outcome {
        self.run_from(0, items, engines)
    }

    /// The first stage when it is a set filter, with its live set: what a worker's shared
    /// reader evaluates together with the other pipelines on the stream
    /// (`crate::readers`), so the worker runs the plan from stage 1.
    pub fn first_set_filter(&self) -> Option<(&SetFilter, &Arc<SetHandle>)> {
        match (self.plan.stages.first(), self.sets.first()) {
            (Some(Stage::SetFilter { filter, .. }), Some(set)) => Some((filter, set)),
            _ => None,
        }
    }

    /// The stage index of transform `uid`, if the plan has it.
    pub fn stage_of(&self, uid: &str) -> Option<usize> {
        self.plan.stages.iter().position(|stage| match stage {
            Stage::SetFilter { uid: stage_uid, .. } | Stage::Script { uid: stage_uid, .. } => {
                stage_uid == uid
            }
        })
    }

    /// Replays dead letters, each `(first stage, record)` from its stage, in order, until
    /// what they produced reaches `budget` bytes (sink records and records failed again):
    /// memory stays bounded by the budget plus one call's output however much the fixed
    /// scripts return. Answers the outcome and how many of `letters` were run; the rest are
    /// for the next step.
    pub fn replay_within(
        &self,
        letters: Vec<(usize, Item)>,
        engines: &mut Engines,
        budget: usize,
    ) -> (Outcome, usize) {
        let mut all = Outcome::default();
        let mut bytes = 0;
        let mut run = 0;
        for (first, item) in letters {
            let outcome = self.run_from(first, vec![item], engines);
            bytes += outcome.out.iter().map(|item| item.value.len()).sum::<usize>();
            bytes += outcome.failed.iter().map(|failed| failed.item.value.len()).sum::<usize>();
            all.out.extend(outcome.out);
            all.failed.extend(outcome.failed);
            all.oom_restarts += outcome.oom_restarts;
            run += 1;
            if bytes >= budget {
                break;
            }
        }
        (all, run)
    }

    /// As [`BoundPlan::run`], starting at stage `first` (replaying a dead letter from the
    /// transform that failed on it).
    pub fn run_from(&self, first: usize, items: Vec<Item>, engines: &mut Engines) -> Outcome {
        let mut outcome = Outcome::default();
        let mut items = items;
        let first = first.min(self.plan.stages.len());
        let skipped_sets = self.plan.stages[..first]
            .iter()
            .filter(|stage| matches!(stage, Stage::SetFilter { .. }))
            .count();
        let mut sets = self.sets.iter().skip(skipped_sets);
        for stage in &self.plan.stages[first..] {
            if items.is_empty() {
                break;
            }
            match stage {
                Stage::SetFilter { filter, .. } => {
                    let set = sets.next().expect("a bound plan has one set per set filter");
                    let mut passed = Vec::with_capacity(items.len());
                    set.with(|set| filter.passes_batch(&values_of(&items), set, &mut passed));
                    let mut answers = passed.into_iter();
                    items.retain(|_| answers.next().unwrap_or(false));
                }
                Stage::Script { uid, source } => {
                    items = self.run_script(uid, source, items, engines, &mut outcome);
                    if let Some(deferred) = outcome.deferred_from {
                        // Earlier stages' dead letters of deferred records go too: the
                        // records run again, from the first stage, in a later batch.
                        outcome.failed.retain(|failed| failed.item.origin < deferred);
                        items.retain(|item| item.origin < deferred);
                    }
                }
            }
        }
        outcome.out = items;
        outcome
    }

    fn run_script(
        &self,
        uid: &str,
        source: &Arc<str>,
        items: Vec<Item>,
        engines: &mut Engines,
        outcome: &mut Outcome,
    ) -> Vec<Item> {
        let logs = engines.logs.clone();
        let engine = match self.engine(uid, source, engines) {
            Ok(engine) => engine,
            Err(error) => {
                // Checked at deploy, so only a runtime that cannot be created lands here.
                outcome.failed.extend(items.into_iter().map(|item| Failed {
                    item,
                    transform_uid: uid.to_owned(),
                    error: error.clone(),
                    attempts: 1,
                }));
                return Vec::new();
            }
        };
        // The n-th record's first call is `first_call + n` (see `LogSink::call_started`).
        let first_call = logs.next_call();
        let budget = batch_output_budget(self.plan.pod_size);
        let results = engine.run_batch_within(items.iter().map(|item| &item.value[..]), budget);
        let mut items = items;
        let not_run = items.split_off(results.len());
        if let Some(first_not_run) = not_run.first() {
            let first_origin = items.first().map_or(first_not_run.origin, |item| item.origin);
            if first_not_run.origin > first_origin {
                // The worker takes these records (and the rest of their fan-out) next time.
                let deferred = first_not_run.origin;
                outcome.deferred_from =
                    Some(outcome.deferred_from.map_or(deferred, |d| d.min(deferred)));
            } else {
                // A fan-out of one source record that alone passes the budget: deferring
                // would never progress, so the rest of it is dead-lettered.
                outcome.failed.extend(not_run.into_iter().filter(|item| item.origin == first_origin).map(|item| Failed {
                    item,
                    transform_uid: uid.to_owned(),
                    error: format!(
                        "the records of one source record passed the batch output budget of {budget} bytes"
                    ),
                    attempts: 1,
                }));
            }
        }
        let mut next = Vec::with_capacity(items.len());
        for (index, (item, first)) in items.into_iter().zip(results).enumerate() {
            let mut result = first;
            let mut attempts = 1;
            let mut call = first_call + index as u64;
            // An output cap is deterministic: the same record breaks it every time.
            while result.as_ref().is_err_and(sluice_js::RunError::is_retryable)
                && attempts < SCRIPT_ATTEMPTS
            {
                if engine.is_poisoned() {
                    outcome.oom_restarts += 1;
                    tracing::warn!(config_id = %self.plan.pipeline_id, transform = uid, "script runtime ran out of memory; restarted");
                    if engine.restart().is_err() {
                        break;
                    }
                }
                // The retry's lines replace this attempt's: one copy per record.
                logs.discard_call(call);
                call = logs.next_call();
                result = engine.run(&item.value);
                attempts += 1;
            }
            match result {
                Ok(outputs) if outputs.len() == 1 => {
                    let value = outputs.into_iter().next().expect("one output");
                    next.push(Item { key: item.key, value: value.into(), origin: item.origin });
                }
                Ok(outputs) => {
                    // Fan-out: each output gets the source key plus its position, stable
                    // across retries and redeploys, so consumers can still de-duplicate.
                    for (index, value) in outputs.into_iter().enumerate() {
                        let mut key = item.key.to_vec();
                        key.extend_from_slice(format!("#{index}").as_bytes());
                        next.push(Item {
                            key: key.into(),
                            value: value.into(),
                            origin: item.origin,
                        });
                    }
                }
                Err(error) => {
                    outcome.failed.push(Failed {
                        item,
                        transform_uid: uid.to_owned(),
                        error: error.to_string(),
                        attempts,
                    });
                }
            }
        }
        if engine.is_poisoned() {
            outcome.oom_restarts += 1;
            let _ = engine.restart();
        }
        next
    }

    /// The worker's runtime for script `uid`, built (or rebuilt for a changed script) here.
    fn engine<'e>(
        &self,
        uid: &str,
        source: &Arc<str>,
        engines: &'e mut Engines,
    ) -> Result<&'e mut ScriptEngine, String> {
        let current = engines.by_uid.get(uid).is_some_and(|(built, _)| built == source);
        if !current {
            let log = ScriptLog {
                pipeline_id: self.plan.pipeline_id.clone(),
                uid: uid.to_owned(),
                clock: self.clock.clone(),
                buffer: engines.logs.clone(),
            };
            let engine = ScriptEngine::new(
                source,
                sluice_js::Limits::for_pod_size(self.plan.pod_size),
                self.datasets.clone(),
                &self.plan.owner_user_id,
                Arc::new(log),
            )
            .map_err(|error| format!("the script cannot run: {error}"))?;
            engines.by_uid.insert(uid.to_owned(), (source.clone(), engine));
        }
        Ok(&mut engines.by_uid.get_mut(uid).expect("just ensured").1)
    }
}

fn values_of(items: &[Item]) -> Vec<&[u8]> {
    items.iter().map(|item| &item.value[..]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::clock::SystemClock;
    use sluice_core::datasets::NoDatasets;

    fn scripted(script: &str) -> BoundPlan {
        let plan = Plan {
            pipeline_id: "p".to_owned(),
            owner_user_id: "u".to_owned(),
            pod_size: PodSize::S,
            source: "base.erc20_token_transfer".to_owned(),
            stages: vec![Stage::Script { uid: "tf-s".to_owned(), source: script.into() }],
            sinks: Vec::new(),
        };
        plan.bind(Vec::new(), Arc::new(NoDatasets), Arc::new(SystemClock))
    }

    fn items(count: usize) -> Vec<Item> {
        (0..count)
            .map(|origin| Item {
                key: format!("k{origin}").into(),
                value: format!(r#"{{"n":{origin}}}"#).into(),
                origin,
            })
            .collect()
    }

    #[test]
    fn a_replay_step_stops_at_the_output_budget_and_leaves_the_rest_for_the_next() {
        // About 1 MB per replayed record: a 2.5 MB budget takes three, then stops.
        let plan = scripted(
            "const s = 'x'.repeat(1000000);\nfunction transform(r) { return {n: r.n, s}; }",
        );
        let letters: Vec<(usize, Item)> = items(10).into_iter().map(|item| (0, item)).collect();
        let mut engines = Engines::default();
        let (outcome, run) = plan.replay_within(letters.clone(), &mut engines, 2_500_000);
        assert_eq!((run, outcome.out.len()), (3, 3));
        let (outcome, run) = plan.replay_within(letters, &mut engines, usize::MAX);
        assert_eq!((run, outcome.out.len()), (10, 10));
    }

    #[test]
    fn a_batch_stops_at_the_output_budget_and_leaves_the_rest_untouched() {
        // Four records of ~1 MB per call: under every per-call cap, 4 MB a call.
        let plan = scripted(
            "const s = 'x'.repeat(999000); function transform(r) { return [{n: r.n, s}, {n: r.n, s}, {n: r.n, s}, {n: r.n, s}]; }",
        );
        let mut engines = Engines::default();
        let budget = batch_output_budget(PodSize::S);
        assert_eq!(budget, 64 * 1024 * 1024);
        let outcome = plan.run(items(20), &mut engines);
        // 16 calls are 63.9 MB; the 17th passes the budget and is the last one run.
        assert_eq!(outcome.deferred_from, Some(17));
        assert_eq!(outcome.out.len(), 17 * 4);
        assert!(outcome.out.iter().all(|item| item.origin < 17));
        let held: usize = outcome.out.iter().map(|item| item.value.len()).sum();
        assert!(held < budget + sluice_js::output_limit_for(PodSize::S), "{held}");
        assert!(outcome.failed.is_empty());

        let outcome = plan.run(items(3), &mut engines);
        assert_eq!((outcome.deferred_from, outcome.out.len()), (None, 12));
    }
}
