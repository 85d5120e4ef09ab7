//! The cluster role ([`NodeStore`]): which `sluice serve` nodes are alive and what each runs,
//! a lock per pipeline that lifecycle calls of every node take, and a wake-up signal for
//! changes of the desired state.
//!
//! On PostgreSQL the lock is a transaction-scoped advisory lock and the signal is
//! `LISTEN`/`NOTIFY`. On SQLite (one process) the lock is nothing, the process's own lock
//! serialises, and there is no signal: a node there has no peers to hear from.

use async_trait::async_trait;
use sqlx::Row as _;

use crate::dialect::StoreBackend;
use crate::{Result, Store};

/// The channel nodes signal each other on after a change of the desired state (a deploy,
/// pause or teardown) or of what they run.
pub const CLUSTER_CHANNEL: &str = "sluice_cluster";

/// One node's row: its name, how long ago (by the database's clock) it last wrote, and its
/// report (JSON the runtime writes and reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub name: String,
    pub age_ms: i64,
    pub report: String,
    /// Moves whenever `report` changes (and only then).
    pub report_seq: i64,
}

/// One node's liveness without its report: name, heartbeat age (ms) and report number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBeat {
    pub name: String,
    pub age_ms: i64,
    pub report_seq: i64,
}

/// A pipeline's cluster-wide lifecycle lock, held until [`ClusterLock::release`] or drop.
#[derive(Debug)]
pub struct ClusterLock(Option<sqlx::Transaction<'static, sqlx::Postgres>>);

impl ClusterLock {
    /// A lock that holds nothing (one process: its own lock is enough).
    pub(crate) fn local() -> Self {
        Self(None)
    }

    pub(crate) fn held(tx: sqlx::Transaction<'static, sqlx::Postgres>) -> Self {
        Self(Some(tx))
    }

    /// Lets the next node's lifecycle call of the pipeline go.
    pub async fn release(mut self) {
        if let Some(tx) = self.0.take()
            && let Err(error) = tx.commit().await
        {
            // The connection is gone, and its session's locks with it.
            tracing::warn!(%error, "releasing a pipeline's cluster lock");
        }
    }
}

impl Drop for ClusterLock {
    fn drop(&mut self) {
        // Dropped on an error path (or a cancelled call): end the transaction, so the
        // connection goes back to the pool without the lock.
        if let Some(tx) = self.0.take()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            handle.spawn(async move {
                if let Err(error) = tx.rollback().await {
                    tracing::warn!(%error, "releasing a pipeline's cluster lock");
                }
            });
        }
    }
}

/// A role one node of a cluster plays at a time (the archiver of a shared warehouse): held
/// while the database session that took it lives, given up when dropped.
#[derive(Debug)]
pub struct RoleLock(Option<sqlx::pool::PoolConnection<sqlx::Postgres>>);

impl RoleLock {
    /// A role held without a lock (one process).
    pub(crate) fn local() -> Self {
        Self(None)
    }

    pub(crate) fn held_by(connection: sqlx::pool::PoolConnection<sqlx::Postgres>) -> Self {
        Self(Some(connection))
    }

    /// Whether the role is still this process's: its session answers (a session that
    /// broke lost its locks, and another node may hold the role now).
    pub async fn still_held(&mut self) -> bool {
        match &mut self.0 {
            None => true,
            Some(connection) => sqlx::query("SELECT 1").execute(&mut **connection).await.is_ok(),
        }
    }
}

impl Drop for RoleLock {
    fn drop(&mut self) {
        // Closing the session gives the lock up; a connection back in the pool would keep it.
        if let Some(connection) = self.0.take() {
            drop(connection.detach());
        }
    }
}

/// Nodes, their reports, the per-pipeline cluster lock and the change signal.
#[async_trait]
pub trait NodeStore: Send + Sync + 'static {
    /// Writes node `name`'s report and marks it alive now.
    ///
    /// # Errors
    /// A database failure.
    async fn heartbeat(&self, name: &str, report: &str) -> Result<()>;

    /// Every node row, by name, with its age.
    ///
    /// # Errors
    /// A database failure.
    async fn nodes(&self) -> Result<Vec<NodeRow>>;

    /// Every node's name, heartbeat age and report number, by name: what a node reads each
    /// second, reading a report ([`NodeStore::node_report`]) only when its number moved.
    ///
    /// # Errors
    /// A database failure.
    async fn node_beats(&self) -> Result<Vec<NodeBeat>>;

    /// Node `name`'s report and its number (`None`: no such node).
    ///
    /// # Errors
    /// A database failure.
    async fn node_report(&self, name: &str) -> Result<Option<(i64, String)>>;

    /// Forgets node `name` (it stops), and rows that have not written for `stale_ms`.
    ///
    /// # Errors
    /// A database failure.
    async fn remove_nodes(&self, name: Option<&str>, stale_ms: i64) -> Result<u64>;

    /// Waits for and takes pipeline `pipeline_id`'s lifecycle lock, shared by every node on
    /// this database.
    ///
    /// # Errors
    /// A database failure.
    async fn cluster_lock(&self, pipeline_id: &str) -> Result<ClusterLock>;

    /// Takes role `role` when no other process holds it (`None`: another does). Always
    /// taken on SQLite (one process).
    ///
    /// # Errors
    /// A database failure.
    async fn try_role(&self, role: &str) -> Result<Option<RoleLock>>;

    /// Wakes every node listening on [`CLUSTER_CHANNEL`] (no effect on SQLite).
    ///
    /// # Errors
    /// A database failure.
    async fn signal_cluster(&self) -> Result<()>;

    /// Signals on [`CLUSTER_CHANNEL`] from now on (`None` on SQLite). A signal lost while
    /// the listener reconnects is not replayed: listeners also look on a timer.
    ///
    /// # Errors
    /// A database failure.
    async fn listen_cluster(&self) -> Result<Option<tokio::sync::mpsc::Receiver<()>>>;
}

#[async_trait]
impl<D: StoreBackend> NodeStore for Store<D> {
    async fn heartbeat(&self, name: &str, report: &str) -> Result<()> {
        let now = D::NOW_MS;
        sqlx::query(&format!(
            "INSERT INTO nodes (name, heartbeat_ms, report, report_seq) VALUES ($1, {now}, $2, 1) \
             ON CONFLICT (name) DO UPDATE SET heartbeat_ms = excluded.heartbeat_ms, \
             report_seq = CASE WHEN nodes.report = excluded.report THEN nodes.report_seq \
             ELSE nodes.report_seq + 1 END, report = excluded.report"
        ))
        .bind(name)
        .bind(report)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<NodeRow>> {
        let now = D::NOW_MS;
        let rows = sqlx::query(&format!(
            "SELECT name, {now} - heartbeat_ms AS age_ms, report, report_seq FROM nodes ORDER BY name"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(NodeRow {
                    name: row.try_get("name")?,
                    age_ms: row.try_get("age_ms")?,
                    report: row.try_get("report")?,
                    report_seq: row.try_get("report_seq")?,
                })
            })
            .collect()
    }

    async fn node_beats(&self) -> Result<Vec<NodeBeat>> {
        let now = D::NOW_MS;
        let rows = sqlx::query(&format!(
            "SELECT name, {now} - heartbeat_ms AS age_ms, report_seq FROM nodes ORDER BY name"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(NodeBeat {
                    name: row.try_get("name")?,
                    age_ms: row.try_get("age_ms")?,
                    report_seq: row.try_get("report_seq")?,
                })
            })
            .collect()
    }

    async fn node_report(&self, name: &str) -> Result<Option<(i64, String)>> {
        let row = sqlx::query("SELECT report_seq, report FROM nodes WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row
            .map(|row| Ok::<_, sqlx::Error>((row.try_get("report_seq")?, row.try_get("report")?)))
            .transpose()?)
    }

    async fn remove_nodes(&self, name: Option<&str>, stale_ms: i64) -> Result<u64> {
        let now = D::NOW_MS;
        let done =
            sqlx::query(&format!("DELETE FROM nodes WHERE name = $1 OR heartbeat_ms < {now} - $2"))
                .bind(name.unwrap_or(""))
                .bind(stale_ms)
                .execute(&self.pool)
                .await?;
        Ok(D::rows_affected(&done))
    }

    async fn cluster_lock(&self, pipeline_id: &str) -> Result<ClusterLock> {
        D::cluster_lock(&self.pool, pipeline_id).await
    }

    async fn try_role(&self, role: &str) -> Result<Option<RoleLock>> {
        D::try_role(&self.pool, role).await
    }

    async fn signal_cluster(&self) -> Result<()> {
        D::signal(&self.pool, CLUSTER_CHANNEL).await
    }

    async fn listen_cluster(&self) -> Result<Option<tokio::sync::mpsc::Receiver<()>>> {
        D::listen(&self.pool, CLUSTER_CHANNEL).await
    }
}
