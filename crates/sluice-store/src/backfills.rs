//! The backfill role ([`BackfillStore`]): jobs, their states and progress.

use async_trait::async_trait;
use sluice_core::backfill::{BackfillJob, BackfillStatus};
use sqlx::Row as _;

use crate::dialect::{Row, StoreBackend};
use crate::{Result, Store, StoreError};

/// Stored backfill jobs. Every method is one statement.
#[async_trait]
pub trait BackfillStore: Send + Sync + 'static {
    async fn insert_backfill(&self, job: &BackfillJob) -> Result<()>;

    /// The job of this id, of any organization.
    async fn backfill(&self, job_id: &str) -> Result<Option<BackfillJob>>;

    /// The organization's jobs, oldest first.
    async fn list_backfills(&self, org_id: &str) -> Result<Vec<BackfillJob>>;

    /// Replaces the job when its stored status is one of `when`; false otherwise (it moved
    /// on meanwhile: a cancel, say).
    async fn update_backfill(&self, job: &BackfillJob, when: &[BackfillStatus]) -> Result<bool>;

    /// Jobs still staging or transporting (what a starting server resumes), oldest first.
    async fn active_backfills(&self) -> Result<Vec<BackfillJob>>;
}

fn job_of<D: StoreBackend>(row: &Row<D>) -> Result<BackfillJob> {
    let text: String = row.try_get("job")?;
    serde_json::from_str(&text)
        .map_err(|error| StoreError::Corrupt { what: "backfill job", detail: error.to_string() })
}

fn text_of(job: &BackfillJob) -> String {
    serde_json::to_string(job).expect("a backfill job serializes")
}

#[async_trait]
impl<D: StoreBackend> BackfillStore for Store<D> {
    async fn insert_backfill(&self, job: &BackfillJob) -> Result<()> {
        sqlx::query(
            "INSERT INTO backfill_jobs (job_id, seq, org_id, status, job, created_at, updated_at) \
             VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM backfill_jobs), $2, $3, $4, $5, $6)",
        )
        .bind(job.job_id.as_str())
        .bind(job.organization_id.as_str())
        .bind(job.status.name())
        .bind(text_of(job))
        .bind(sluice_core::time::format(job.created_at))
        .bind(sluice_core::time::format(job.updated_at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn backfill(&self, job_id: &str) -> Result<Option<BackfillJob>> {
        let row = sqlx::query("SELECT job FROM backfill_jobs WHERE job_id = $1")
            .bind(job_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(job_of::<D>).transpose()
    }

    async fn list_backfills(&self, org_id: &str) -> Result<Vec<BackfillJob>> {
        let rows = sqlx::query("SELECT job FROM backfill_jobs WHERE org_id = $1 ORDER BY seq")
            .bind(org_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(job_of::<D>).collect()
    }

    async fn update_backfill(&self, job: &BackfillJob, when: &[BackfillStatus]) -> Result<bool> {
        let allowed: Vec<&str> = when.iter().map(|s| s.name()).collect();
        // At most five statuses: bound one by one, so both backends take the same statement.
        let mut statement = String::from(
            "UPDATE backfill_jobs SET status = $1, job = $2, updated_at = $3 WHERE job_id = $4 AND status IN (",
        );
        for n in 0..allowed.len().max(1) {
            if n > 0 {
                statement.push_str(", ");
            }
            statement.push_str(&format!("${}", n + 5));
        }
        statement.push(')');
        let mut query = sqlx::query(&statement)
            .bind(job.status.name())
            .bind(text_of(job))
            .bind(sluice_core::time::format(job.updated_at))
            .bind(job.job_id.as_str());
        if allowed.is_empty() {
            query = query.bind("");
        }
        for status in allowed {
            query = query.bind(status);
        }
        let done = query.execute(&self.pool).await?;
        Ok(D::rows_affected(&done) == 1)
    }

    async fn active_backfills(&self) -> Result<Vec<BackfillJob>> {
        let rows = sqlx::query(
            "SELECT job FROM backfill_jobs WHERE status IN ('staging', 'transporting') \
             ORDER BY seq",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_of::<D>).collect()
    }
}
