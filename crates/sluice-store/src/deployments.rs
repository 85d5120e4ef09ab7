//! The deployment role ([`DeploymentStore`]): which pipelines are deployed, as what.

use async_trait::async_trait;
use sluice_core::deployment::{DeploymentRecord, DeploymentState};
use sluice_core::time;
use sqlx::Row as _;

use crate::dialect::{Row, StoreBackend};
use crate::{Result, Store, StoreError};

/// A `deployments` row as stored.
pub(crate) struct DeploymentRow {
    pub pipeline_id: String,
    pub state: String,
    pub pipeline: String,
    pub deployed_at: String,
    pub updated_at: String,
}

/// The text columns of a deployment, ready to bind.
pub(crate) struct DeploymentText {
    pub pipeline: String,
    pub deployed_at: String,
    pub updated_at: String,
}

pub(crate) fn deployment_text(record: &DeploymentRecord) -> Result<DeploymentText> {
    Ok(DeploymentText {
        pipeline: serde_json::to_string(&record.pipeline).map_err(|detail| {
            StoreError::Corrupt { what: "deployment", detail: detail.to_string() }
        })?,
        deployed_at: time::format(record.deployed_at),
        updated_at: time::format(record.updated_at),
    })
}

impl DeploymentRow {
    pub(crate) fn into_record(self) -> Result<DeploymentRecord> {
        let id = &self.pipeline_id;
        let corrupt = |detail: String| StoreError::Corrupt {
            what: "deployment",
            detail: format!("{id}: {detail}"),
        };
        let timestamp =
            |text: &str| time::parse(text).map_err(|e| corrupt(format!("timestamp {text:?}: {e}")));
        Ok(DeploymentRecord {
            state: DeploymentState::from_name(&self.state)
                .ok_or_else(|| corrupt(format!("state {:?}", self.state)))?,
            pipeline: serde_json::from_str(&self.pipeline)
                .map_err(|e| corrupt(format!("pipeline: {e}")))?,
            deployed_at: timestamp(&self.deployed_at)?,
            updated_at: timestamp(&self.updated_at)?,
            pipeline_id: self.pipeline_id,
        })
    }
}

/// Stored deployments. Every method is one transaction.
#[async_trait]
pub trait DeploymentStore: Send + Sync + 'static {
    /// Stores a pipeline's deployment, replacing the one stored for that pipeline.
    ///
    /// # Errors
    /// A database failure, including when `record.pipeline_id` names no stored pipeline.
    async fn put_deployment(&self, record: &DeploymentRecord) -> Result<()>;

    /// The stored deployment of a pipeline; `None` when it is not deployed.
    ///
    /// # Errors
    /// A database failure, or a stored record that cannot be read.
    async fn deployment(&self, pipeline_id: &str) -> Result<Option<DeploymentRecord>>;

    /// Every stored deployment, oldest `deployed_at` first (what a starting runtime resumes).
    ///
    /// # Errors
    /// A database failure, or a stored record that cannot be read.
    async fn list_deployments(&self) -> Result<Vec<DeploymentRecord>>;

    /// Every stored deployment's pipeline id, state and version (its `updated_at` as stored,
    /// the text [`sluice_core::time::format`] gives): what a cluster node compares with what
    /// it runs each second, reading a whole record only when it changed.
    ///
    /// # Errors
    /// A database failure, or a stored state that cannot be read.
    async fn deployment_versions(&self) -> Result<Vec<(String, DeploymentState, String)>>;

    /// Forgets a pipeline's deployment (teardown); false when none was stored. Deleting the
    /// pipeline deletes its deployment too.
    ///
    /// # Errors
    /// A database failure.
    async fn delete_deployment(&self, pipeline_id: &str) -> Result<bool>;

    /// A number that moves with every write of any deployment (a pipeline's deletion
    /// included): while it stays, [`DeploymentStore::deployment_versions`] answers the same.
    ///
    /// # Errors
    /// A database failure.
    async fn deployments_seq(&self) -> Result<i64>;
}

/// Moves the number [`DeploymentStore::deployments_seq`] reads; run in the transaction of
/// every write of `deployments`.
pub(crate) const BUMP_DEPLOYMENTS_SEQ: &str =
    "UPDATE deployments_seq SET seq = seq + 1 WHERE id = 1";

impl<D: StoreBackend> Store<D> {
    fn deployment_row(row: &Row<D>) -> Result<DeploymentRecord> {
        DeploymentRow {
            pipeline_id: row.try_get("pipeline_id")?,
            state: row.try_get("state")?,
            pipeline: row.try_get("pipeline")?,
            deployed_at: row.try_get("deployed_at")?,
            updated_at: row.try_get("updated_at")?,
        }
        .into_record()
    }
}

#[async_trait]
impl<D: StoreBackend> DeploymentStore for Store<D> {
    async fn put_deployment(&self, record: &DeploymentRecord) -> Result<()> {
        let text = deployment_text(record)?;
        let mut tx = D::begin_write(&self.pool).await?;
        sqlx::query(
            "INSERT INTO deployments (pipeline_id, state, pipeline, deployed_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (pipeline_id) DO UPDATE SET \
             state = excluded.state, pipeline = excluded.pipeline, \
             deployed_at = excluded.deployed_at, updated_at = excluded.updated_at",
        )
        .bind(&record.pipeline_id)
        .bind(record.state.name())
        .bind(&text.pipeline)
        .bind(&text.deployed_at)
        .bind(&text.updated_at)
        .execute(&mut *tx)
        .await?;
        sqlx::query(BUMP_DEPLOYMENTS_SEQ).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn deployment(&self, pipeline_id: &str) -> Result<Option<DeploymentRecord>> {
        let row = sqlx::query(
            "SELECT pipeline_id, state, pipeline, deployed_at, updated_at FROM deployments \
             WHERE pipeline_id = $1",
        )
        .bind(pipeline_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(Self::deployment_row).transpose()
    }

    async fn list_deployments(&self) -> Result<Vec<DeploymentRecord>> {
        let rows = sqlx::query(
            "SELECT pipeline_id, state, pipeline, deployed_at, updated_at FROM deployments \
             ORDER BY deployed_at, pipeline_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(Self::deployment_row).collect()
    }

    async fn deployment_versions(&self) -> Result<Vec<(String, DeploymentState, String)>> {
        let rows = sqlx::query(
            "SELECT pipeline_id, state, updated_at FROM deployments ORDER BY deployed_at, pipeline_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get("pipeline_id")?;
                let state: String = row.try_get("state")?;
                let state =
                    DeploymentState::from_name(&state).ok_or_else(|| StoreError::Corrupt {
                        what: "deployment",
                        detail: format!("{id}: state {state:?}"),
                    })?;
                Ok((id, state, row.try_get("updated_at")?))
            })
            .collect()
    }

    async fn delete_deployment(&self, pipeline_id: &str) -> Result<bool> {
        let mut tx = D::begin_write(&self.pool).await?;
        let done = sqlx::query("DELETE FROM deployments WHERE pipeline_id = $1")
            .bind(pipeline_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(BUMP_DEPLOYMENTS_SEQ).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(D::rows_affected(&done) == 1)
    }

    async fn deployments_seq(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT seq FROM deployments_seq WHERE id = 1")
            .fetch_one(&self.pool)
            .await?
            .try_get("seq")?)
    }
}
