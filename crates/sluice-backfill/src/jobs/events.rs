//! The `backfill.*` events: one per status a job moves to (docs/events.md).

use std::sync::Arc;

use sluice_core::backfill::{BackfillJob, BackfillStatus};
use sluice_core::events::{EventEmitter, NewEvent};
use sluice_store::StoreError;

use super::Backfills;

impl Backfills {
    /// Sends the jobs' events to `events` (default: nowhere).
    pub fn use_events(&self, events: Arc<dyn EventEmitter>) {
        *self.events.lock().expect("not poisoned") = events;
    }

    /// The event of `job` entering its status, from `from` (`None`: a new job).
    pub(super) fn emit_status(&self, job: &BackfillJob, from: Option<BackfillStatus>) {
        let event = NewEvent::backfill(
            job.updated_at,
            &job.organization_id,
            &job.job_id,
            &job.job_name,
            job.status.name(),
            from.map(BackfillStatus::name),
            job.error_message.as_deref(),
        );
        if let Some(event) = event {
            self.events.lock().expect("not poisoned").emit(event);
        }
    }

    /// Stores `job` when its stored status is one of `when` (as
    /// [`sluice_store::BackfillStore::update_backfill`]), with an event when that moved its
    /// status.
    pub(super) async fn transition(
        &self,
        job: &BackfillJob,
        when: &[BackfillStatus],
    ) -> Result<bool, StoreError> {
        let stored = self.store.update_backfill(job, when).await?;
        if stored && !when.contains(&job.status) {
            let from = if when.len() == 1 { when.first().copied() } else { None };
            self.emit_status(job, from);
        }
        Ok(stored)
    }
}
