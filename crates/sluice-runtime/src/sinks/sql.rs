//! The `postgres` and `mysql` sinks: rows in a table of the user's own database, written
//! exactly once (docs/sinks.md "PostgreSQL and MySQL").
//!
//! **Exactly once.** Each batch is one transaction of the user's database: its rows, the
//! deletes of its reorg markers, and the position the batch brings the pipeline to —
//! `(consumer group, source topic, partition) → next offset` in `sluice_sink_offsets`, beside
//! the table. Only after that commit are the source offsets committed in the stream log. A
//! crash between the two leaves the database ahead of the log; at the next start the worker
//! reads the database's position ([`Sink::resume`]) and reads on from there, so the batch
//! is not written twice. A batch sent again whose position the database already holds (a
//! commit whose answer was lost) is skipped inside its transaction. Backfill chunks use the
//! same table, keyed by the chunk's id.
//!
//! What differs between the databases is a [`SqlBackend`]: [`super::postgres`] and
//! [`super::mysql`].

pub mod batch;
pub mod layout;
pub mod text;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use sluice_bus::{NewRecord, StreamLog};
use sluice_core::pipeline::{SinkConfig, SqlSinkConfig};
use tokio::sync::OnceCell;

use super::external::{Batch, Sent, Transport, TransportError};
use super::{Settle, Sink, SinkBuildError, SinkConnection, SinkError};
use crate::delivery::{Delivery, Origin, SideTopics};
pub use batch::BatchRows;
pub use layout::{BlockHash, Cell, ColumnType, Converted, Layout};

/// The table of positions, in the sink's schema (database).
pub const OFFSETS_TABLE: &str = "sluice_sink_offsets";

/// Whose fault a database error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The database is down, busy or the connection broke: a retry may pass.
    Unavailable,
    /// The rows themselves were refused (a value out of a column's range, a constraint of
    /// the user's): they are dead-lettered.
    Data,
    /// The table, a column or a privilege is missing, or the URL is wrong: the user must act.
    Config,
}

/// A failed database step.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct SqlError {
    pub message: String,
    pub fault: Fault,
}

impl SqlError {
    pub fn config(message: impl Into<String>) -> Self {
        Self { message: message.into(), fault: Fault::Config }
    }
}

/// A row: the record key and the cells, in the layout's column order, borrowing from the
/// record where they can.
pub type Row<'a> = (&'a str, Vec<Cell<'a>>);

/// One transaction of a sink.
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    /// The rows, made as they are taken; [`BatchRows::orphaned`] are the block hashes whose
    /// rows are deleted (after the rows are written).
    pub rows: &'a BatchRows<'a>,
    /// Where the write brings its consumer: `(partition, next offset)` of `source` for
    /// consumer `group`, stored in the same transaction.
    pub position: Settle<'a>,
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Applied,
    /// The database already held the position: the rows were there, nothing was written.
    AlreadyApplied,
}

/// One database's way of doing the sink's steps.
#[async_trait::async_trait]
pub trait SqlBackend: Send + Sync + std::fmt::Debug {
    /// Connects, creates the table and the offsets table when missing (`create`), and checks
    /// that both have the columns and privileges the sink needs.
    ///
    /// # Errors
    /// [`SqlError`].
    async fn prepare(&self, layout: &Layout, create: bool) -> Result<(), SqlError>;

    /// The positions `consumer` committed on `source`.
    ///
    /// # Errors
    /// [`SqlError`].
    async fn positions(
        &self,
        layout: &Layout,
        consumer: &str,
        source: &str,
    ) -> Result<Vec<(u32, u64)>, SqlError>;

    /// Writes one batch in one transaction, unless the database holds its position already
    /// (every partition at or past it).
    ///
    /// # Errors
    /// [`SqlError`]; nothing was written.
    async fn write(&self, layout: &Layout, write: Write<'_>) -> Result<Written, SqlError>;

    /// Where the rows go, for the deploy response (never a credential).
    fn connection(&self) -> Value;

    async fn close(&self);
}

/// How long a deploy waits for the database to answer.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Connects once with `options` (not through the pool, which would retry until its acquire
/// timeout) and closes again: whether database `name` answers within [`CONNECT_TIMEOUT`].
///
/// # Errors
/// The connect error as `classify` sorts it, or [`Fault::Unavailable`] on the timeout.
pub(super) async fn probe<C: sqlx::Connection>(
    options: &<C as sqlx::Connection>::Options,
    name: &str,
    classify: fn(&sqlx::Error) -> SqlError,
) -> Result<(), SqlError> {
    match tokio::time::timeout(CONNECT_TIMEOUT, C::connect_with(options)).await {
        Ok(Ok(conn)) => {
            drop(conn.close().await);
            Ok(())
        }
        Ok(Err(error)) => Err(classify(&error)),
        Err(_) => Err(SqlError {
            message: format!("{name}: connecting timed out"),
            fault: Fault::Unavailable,
        }),
    }
}

/// The positions of rows of `(part, next_offset)`, as [`SqlBackend::positions`] answers them;
/// a value out of range reads as 0.
pub(super) fn positions_of<R>(rows: &[R]) -> Vec<(u32, u64)>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    rows.iter()
        .map(|row| {
            let part: i32 = row.get(0);
            let next: i64 = row.get(1);
            (u32::try_from(part).unwrap_or_default(), u64::try_from(next).unwrap_or_default())
        })
        .collect()
}

/// Whether `stored` (the database's positions) covers every partition of `batch`.
pub fn already_applied(stored: &[(u32, u64)], batch: &[(u32, u64)]) -> bool {
    !batch.is_empty()
        && batch
            .iter()
            .all(|(partition, next)| stored.iter().any(|(p, at)| p == partition && at >= next))
}

/// The parts of a database URL a deploy response may show: no user, no password.
pub fn describe_url(url: &str, database: &'static str) -> Value {
    match url::Url::parse(url) {
        Ok(parsed) => json!({
            "database": database,
            "host": parsed.host_str().unwrap_or_default(),
            "port": parsed.port(),
            "dbname": parsed.path().trim_start_matches('/'),
        }),
        Err(_) => json!({"database": database}),
    }
}

/// The sink of `config` when it is a `postgres` or `mysql` one (`None` otherwise). Connecting
/// happens at [`Sink::prepare`] or the first delivery.
///
/// # Errors
/// [`SinkBuildError`]: the secret is missing, its URL is not one of the database's, or
/// `static_egress_ip` is asked for.
pub fn build(
    config: &SinkConfig,
    context: super::SinkContext<'_>,
) -> Result<Option<Arc<SqlSink>>, SinkBuildError> {
    let (sql, mysql) = match config {
        SinkConfig::Postgres(sql) => (sql, false),
        SinkConfig::Mysql(sql) => (sql, true),
        _ => return Ok(None),
    };
    let uid = config.uid().to_owned();
    if context.static_egress {
        let reason = format!(
            "static_egress_ip applies to webhook and sns sinks; a '{}' sink cannot send from a fixed address",
            config.type_name()
        );
        return Err(SinkBuildError::Egress { uid, reason });
    }
    let Some(secret) = context.secrets.get(&sql.connection) else {
        return Err(SinkBuildError::MissingSecret {
            uid,
            field: "connection",
            name: sql.connection.clone(),
        });
    };
    let url = secret.value.expose();
    let unusable = |reason: String| SinkBuildError::Unreachable {
        uid: uid.clone(),
        field: "connection",
        reason,
    };
    let backend: Arc<dyn SqlBackend> = if mysql {
        Arc::new(super::mysql::MySqlBackend::new(url, sql).map_err(unusable)?)
    } else {
        Arc::new(super::postgres::PgBackend::new(url, sql).map_err(unusable)?)
    };
    Ok(Some(Arc::new(SqlSink::new(config.clone(), sql, context.stream.1, backend))))
}

/// A `postgres` or `mysql` sink of one deployment (or a backfill's destination).
#[derive(Debug)]
pub struct SqlSink {
    config: SinkConfig,
    layout: Layout,
    create: bool,
    backend: Arc<dyn SqlBackend>,
    prepared: OnceCell<()>,
    /// Block hashes reorg markers voided since the sink started: rows of those blocks that
    /// arrive later (from a partition read behind the marker's) are not written.
    voided: Mutex<Arc<HashSet<String>>>,
}

impl SqlSink {
    pub fn new(
        config: SinkConfig,
        sql: &SqlSinkConfig,
        entity: &str,
        backend: Arc<dyn SqlBackend>,
    ) -> Self {
        Self {
            layout: Layout::new(sql, entity),
            create: sql.create_table,
            config,
            backend,
            prepared: OnceCell::new(),
            voided: Mutex::new(Arc::new(HashSet::new())),
        }
    }

    fn uid(&self) -> &str {
        self.config.uid()
    }

    fn sink_error(&self, error: SqlError) -> SinkError {
        SinkError {
            uid: self.uid().to_owned(),
            retryable: error.fault != Fault::Config,
            retry_after: None,
            source: Box::new(error),
        }
    }

    async fn ready(&self) -> Result<(), SqlError> {
        self.prepared
            .get_or_try_init(|| self.backend.prepare(&self.layout, self.create))
            .await
            .map(|_| ())
    }

    /// The batch of `records`, its markers' block hashes added to those voided.
    fn batch<'a>(&'a self, records: &'a [NewRecord], origins: &'a [Origin]) -> BatchRows<'a> {
        BatchRows::new(&self.layout, records, origins, &self.voided)
    }

    /// The dead letter of a record the sink could not write (the same shape as the other
    /// external sinks').
    fn dead_letter(&self, record: &NewRecord, reason: &str, delivery: &Delivery) -> NewRecord {
        let body = serde_json::from_slice::<Value>(&record.value)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&record.value).into_owned()));
        let value = json!({
            "sink_uid": self.uid(),
            "error": reason,
            "attempts": 1,
            "failed_at": sluice_core::time::format(delivery.made_at),
            "record": body,
        });
        NewRecord::new(
            record.key.clone(),
            serde_json::to_vec(&value).expect("a dead letter serializes"),
        )
    }
}

#[async_trait::async_trait]
impl Sink for SqlSink {
    fn config(&self) -> &SinkConfig {
        &self.config
    }

    fn managed_topic(&self) -> Option<&str> {
        None
    }

    /// A batch that begins before the position the database holds skips what is written.
    fn wants_origins(&self) -> bool {
        true
    }

    async fn deliver(
        &self,
        log: &Arc<dyn StreamLog>,
        delivery: &Delivery,
        side: &SideTopics,
        settle: Settle<'_>,
    ) -> Result<(), SinkError> {
        self.ready().await.map_err(|error| self.sink_error(error))?;
        let batch = self.batch(&delivery.out, &delivery.origins);
        let position = settle;
        let mut dead = Vec::new();
        if !batch.is_empty() {
            let write = Write { rows: &batch, position };
            match self.backend.write(&self.layout, write).await {
                Ok(_) => {
                    dead = batch
                        .refused()
                        .iter()
                        .filter_map(|(index, reason)| {
                            Some(self.dead_letter(delivery.out.get(*index)?, reason, delivery))
                        })
                        .collect();
                }
                Err(error) if error.fault == Fault::Data => {
                    // The database refuses the batch's values: its records are dead letters,
                    // and the position moves on with no rows.
                    let records = delivery.out.len();
                    tracing::warn!(sink_uid = self.uid(), records, %error, "database refused the batch; its records are dead-lettered");
                    dead = delivery
                        .out
                        .iter()
                        .map(|record| self.dead_letter(record, &error.message, delivery))
                        .collect();
                    let none = self.batch(&[], &[]);
                    let empty = Write { rows: &none, position };
                    self.backend
                        .write(&self.layout, empty)
                        .await
                        .map_err(|error| self.sink_error(error))?;
                }
                Err(error) => return Err(self.sink_error(error)),
            }
        }
        // Dead letters and script logs go first, without the offsets: the rows are committed
        // by then only when the database holds the position too (a crash after it skips
        // the batch, so its dead letters must already be in the log).
        dead.extend(delivery.dead.iter().cloned());
        if !dead.is_empty() || !delivery.logs.is_empty() {
            let unsettled = Settle { offsets: &[], ..settle };
            super::settle_side(log, self.uid(), side, &dead, &delivery.logs, unsettled).await?;
        }
        log.commit(settle.group, settle.source, settle.offsets)
            .await
            .map_err(|error| SinkError::settling(self.uid(), error))
    }

    fn connection(&self, _pipeline_id: &str) -> SinkConnection {
        let mut connection = self.backend.connection();
        if let Value::Object(map) = &mut connection {
            map.insert("schema".to_owned(), json!(self.layout.schema));
            map.insert("table".to_owned(), json!(self.layout.table));
            map.insert("mode".to_owned(), json!(self.layout.mode));
            map.insert("columns".to_owned(), json!(self.layout.column_names().collect::<Vec<_>>()));
            map.insert("offsets_table".to_owned(), json!(OFFSETS_TABLE));
        }
        SinkConnection::unmanaged(&self.config, connection)
    }

    async fn prepare(&self) -> Result<(), SinkBuildError> {
        self.ready().await.map_err(|error| SinkBuildError::Unreachable {
            uid: self.uid().to_owned(),
            field: "connection",
            reason: error.message,
        })
    }

    async fn resume(&self, group: &str, source: &str) -> Result<Vec<(u32, u64)>, SinkError> {
        self.ready().await.map_err(|error| self.sink_error(error))?;
        self.backend
            .positions(&self.layout, group, source)
            .await
            .map_err(|error| self.sink_error(error))
    }

    async fn close(&self) {
        self.backend.close().await;
    }
}

/// A SQL sink as a backfill destination: each chunk is one transaction, its id the position
/// (so a chunk delivered again after a restart is skipped).
#[async_trait::async_trait]
impl Transport for SqlSink {
    async fn send(&self, batch: Batch<'_>) -> Result<Sent, TransportError> {
        let failed = |error: SqlError| match error.fault {
            Fault::Unavailable => TransportError::retryable(error.message),
            Fault::Data | Fault::Config => TransportError::rejected(error.message),
        };
        self.ready().await.map_err(failed)?;
        let rows = self.batch(batch.records, &[]);
        let source = format!("backfill:{}", self.layout.table);
        let position = Settle { group: batch.id, source: &source, offsets: &[(0, 1)] };
        self.backend.write(&self.layout, Write { rows: &rows, position }).await.map_err(failed)?;
        Ok(Sent { rejected: rows.refused() })
    }

    fn connection(&self) -> Value {
        Sink::connection(self, "").connection
    }

    async fn close(&self) {
        self.backend.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::already_applied;

    #[test]
    fn a_batch_is_applied_only_when_every_partition_is_at_or_past_it() {
        assert!(already_applied(&[(0, 10), (1, 5)], &[(0, 10), (1, 4)]));
        assert!(!already_applied(&[(0, 10)], &[(0, 10), (1, 4)]));
        assert!(!already_applied(&[(0, 9)], &[(0, 10)]));
        assert!(!already_applied(&[(0, 9)], &[]));
    }
}
