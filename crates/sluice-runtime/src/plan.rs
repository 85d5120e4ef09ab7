//! A pipeline compiled for the workers: the source topic, the transform stages in order and
//! the sink topics. [`Plan`] is checked and pure; [`BoundPlan`] holds the live set indexes
//! its set filters test against.

use std::sync::Arc;

use sluice_bus::topics;
use sluice_core::filter_expr::FilterExpr;
use sluice_core::pipeline::{Pipeline, Transform};
use sluice_filter::SetFilter;

use crate::sets::SetHandle;

/// Why a stored pipeline cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "transform {uid} is a v8 script: script transforms cannot run in this build yet \
         (the script engine is not part of it); remove the transform to deploy"
    )]
    ScriptsUnsupported { uid: String },
    #[error("transform {uid}: {reason}")]
    BadFilterExpr { uid: String, reason: String },
    #[error(
        "sink {uid} has type {sink_type:?}; this build delivers only to `kafka` (managed) sinks"
    )]
    UnsupportedSink { uid: String, sink_type: String },
    #[error("the pipeline has {0} sinks; exactly one is required")]
    SinkCount(usize),
}

/// One transform, ready to run.
#[derive(Debug, Clone)]
pub enum Stage {
    SetFilter { uid: String, filter: SetFilter },
}

/// A pipeline compiled for the workers.
#[derive(Debug, Clone)]
pub struct Plan {
    pub pipeline_id: String,
    /// The chain-stream topic the pipeline reads.
    pub source: String,
    pub stages: Vec<Stage>,
    /// `(sink uid, managed topic)`.
    pub sink_topics: Vec<(String, String)>,
}

impl Plan {
    /// Compiles a stored pipeline.
    ///
    /// # Errors
    /// [`PlanError`] for what this build cannot run.
    pub fn compile(pipeline: &Pipeline) -> Result<Self, PlanError> {
        let config = &pipeline.pipeline_config;
        let source = topics::chain_stream(
            &config.source.chain,
            &config.source.entity,
            config.source.is_zerolag,
        );
        let stages = config
            .transforms
            .iter()
            .map(|transform| match transform {
                Transform::SetFilter { uid, filter_expr } => {
                    let expr = FilterExpr::parse(filter_expr).map_err(|error| {
                        PlanError::BadFilterExpr { uid: uid.clone(), reason: error.to_string() }
                    })?;
                    Ok(Stage::SetFilter { uid: uid.clone(), filter: SetFilter::new(&expr) })
                }
                Transform::Script { uid, .. } => {
                    Err(PlanError::ScriptsUnsupported { uid: uid.clone() })
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if config.sinks.len() != 1 {
            return Err(PlanError::SinkCount(config.sinks.len()));
        }
        let sink_topics = config
            .sinks
            .iter()
            .map(|sink| {
                if sink.sink_type == "kafka" {
                    Ok((sink.uid.clone(), topics::sink_topic(&pipeline.id, &sink.name)))
                } else {
                    Err(PlanError::UnsupportedSink {
                        uid: sink.uid.clone(),
                        sink_type: sink.sink_type.clone(),
                    })
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { pipeline_id: pipeline.id.clone(), source, stages, sink_topics })
    }

    /// Uids of the set filters, in stage order.
    pub fn set_filter_uids(&self) -> impl Iterator<Item = &str> {
        self.stages.iter().map(|Stage::SetFilter { uid, .. }| uid.as_str())
    }

    /// Attaches the live set indexes, one per set filter in stage order.
    pub(crate) fn bind(self, sets: Vec<Arc<SetHandle>>) -> BoundPlan {
        BoundPlan { plan: self, sets }
    }
}

/// A plan with its live set indexes.
#[derive(Debug)]
pub struct BoundPlan {
    pub plan: Plan,
    sets: Vec<Arc<SetHandle>>,
}

impl BoundPlan {
    /// Which records of a batch pass every stage: one answer per record. Each stage tests
    /// the survivors of the one before in a single batched lookup
    /// ([`SetFilter::passes_batch`]), holding the set's read lock once for the whole batch
    /// (the hot path).
    pub fn filter_batch<T>(&self, records: &[T], bytes: impl Fn(&T) -> &[u8]) -> Vec<bool> {
        let mut alive: Vec<usize> = (0..records.len()).collect();
        let mut values: Vec<&[u8]> = Vec::with_capacity(records.len());
        let mut passed = Vec::with_capacity(records.len());
        let mut sets = self.sets.iter();
        for stage in &self.plan.stages {
            if alive.is_empty() {
                break;
            }
            match stage {
                Stage::SetFilter { filter, .. } => {
                    let set = sets.next().expect("a bound plan has one set per set filter");
                    values.clear();
                    values.extend(alive.iter().map(|&i| bytes(&records[i])));
                    set.with(|set| filter.passes_batch(&values, set, &mut passed));
                }
            }
            let mut answers = passed.iter();
            alive.retain(|_| *answers.next().expect("one answer per surviving record"));
        }
        let mut keep = vec![false; records.len()];
        for i in alive {
            keep[i] = true;
        }
        keep
    }
}
