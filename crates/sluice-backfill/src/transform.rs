//! A job's `transforms`, run on every row as it is staged: the pipeline transform stages
//! (`sluice_runtime::plan`), with a set filter's values fixed by the job and scripts seeing
//! the creator's datasets. Staged chunks hold the output, so a resumed transport delivers
//! exactly what was staged. A row a script fails on is counted and not delivered; the first
//! such error is kept on the job.

use std::sync::Arc;

use sluice_core::backfill::BackfillTransform;
use sluice_core::clock::Clock;
use sluice_core::datasets::DatasetLookup;
use sluice_core::pipeline::PodSize;
use sluice_filter::ValueSet;
use sluice_runtime::plan::{BoundPlan, Engines, Item, Plan, PlanError, compile_stages};
use sluice_runtime::sets::SetHandle;

/// The transforms of one job, ready to run.
pub struct RowTransformer {
    bound: BoundPlan,
    engines: Engines,
    /// Rows a script failed on.
    pub failed: u64,
    /// The first failure: `transform <uid>: <error>`.
    pub first_error: Option<String>,
}

impl std::fmt::Debug for RowTransformer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowTransformer").field("failed", &self.failed).finish_non_exhaustive()
    }
}

impl RowTransformer {
    /// The transformer of job `job_id` created by `owner_user_id`; `None` without transforms.
    ///
    /// # Errors
    /// A transform that does not compile (the API checked it; a script may still fail to load
    /// on a later build).
    pub fn new(
        job_id: &str,
        owner_user_id: &str,
        transforms: &[BackfillTransform],
        datasets: Arc<dyn DatasetLookup>,
        clock: Arc<dyn Clock>,
    ) -> Result<Option<Self>, PlanError> {
        if transforms.is_empty() {
            return Ok(None);
        }
        let pipeline_transforms: Vec<_> =
            transforms.iter().map(BackfillTransform::transform).collect();
        let plan = Plan {
            pipeline_id: format!("backfill-{job_id}"),
            owner_user_id: owner_user_id.to_owned(),
            pod_size: PodSize::default(),
            source: String::new(),
            stages: compile_stages(&pipeline_transforms)?,
            sinks: Vec::new(),
        };
        let sets = transforms
            .iter()
            .filter(|t| matches!(t, BackfillTransform::SetFilter { .. }))
            .map(|t| {
                let mut values = ValueSet::new();
                for value in t.set_values() {
                    values.insert(value);
                }
                SetHandle::fixed(values)
            })
            .collect();
        Ok(Some(Self {
            bound: plan.bind(sets, datasets, clock),
            engines: Engines::default(),
            failed: 0,
            first_error: None,
        }))
    }

    /// Runs `rows` (`(key, record)`) through every transform; answers what comes out, in
    /// order. Blocking (scripts run here).
    pub fn apply(&mut self, rows: &[(String, String)]) -> Vec<(String, String)> {
        let mut out = Vec::with_capacity(rows.len());
        let mut start = 0;
        while start < rows.len() {
            let items = rows[start..]
                .iter()
                .enumerate()
                .map(|(origin, (key, value))| Item {
                    key: bytes::Bytes::copy_from_slice(key.as_bytes()),
                    value: bytes::Bytes::copy_from_slice(value.as_bytes()),
                    origin,
                })
                .collect();
            let outcome = self.bound.run(items, &mut self.engines);
            // Script console lines have nowhere to go for a job (they are in the process log
            // at debug level).
            drop(self.engines.take_logs());
            for failed in outcome.failed {
                self.failed += 1;
                self.first_error.get_or_insert_with(|| {
                    format!("transform {}: {}", failed.transform_uid, failed.error)
                });
            }
            out.extend(outcome.out.into_iter().map(|item| {
                (
                    String::from_utf8_lossy(&item.key).into_owned(),
                    String::from_utf8_lossy(&item.value).into_owned(),
                )
            }));
            // A script stage whose output reached its budget left the rest for another run.
            start = match outcome.deferred_from {
                Some(from) => start + from.max(1),
                None => rows.len(),
            };
        }
        out
    }
}
