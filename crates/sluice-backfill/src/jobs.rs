//! Backfill jobs run: staging (the export query into chunks), then transporting (each chunk
//! to every destination), at least once, resumable.
//!
//! - **Staging** runs the window and filter over the warehouse table and writes chunks of at
//!   most [`BackfillSettings::chunk_rows`] rows to `<staging>/<job_id>/`; `num_chunks` is set
//!   when it ends. A restart stages again from the start.
//! - **Transporting** sends chunk after chunk to every destination: one message per row, the
//!   row's stream key as its key, through the same transports as pipeline sinks (a managed
//!   `kafka` destination appends to the job's topic `backfill.<job_id>.<name>`, read with
//!   `GET {base_url}/backfills/{job_id}/sinks/{uid}/records`). A chunk counts (`chunks_left`
//!   drops) once every destination acknowledged it; a restart resumes at the first chunk not
//!   counted, so a chunk may be delivered twice, never skipped. A destination that is down
//!   is retried with backoff; one that refuses records for good fails the job
//!   (`error_message`).
//! - **Cancel** moves the job to `cancelled` at once; its runner stops at the next chunk
//!   (or retry). Every state change is a compare-and-set on the stored status, so a runner
//!   never overwrites a cancel. Staging files go when the job ends, however it ends.
//!
//! Jobs survive a restart in any state ([`Backfills::resume`]); at most
//! [`BackfillSettings::max_running`] run at once, the others wait their turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_bus::{NewRecord, Retention, StreamLog, TopicConfig};
use sluice_core::backfill::{
    BackfillJob, BackfillRequest, BackfillStatus, PARTITION_KEY, TableCheck,
};
use sluice_core::catalog::Catalog;
use sluice_core::clock::Clock;
use sluice_core::datasets::{DatasetLookup, NoDatasets};
use sluice_core::pipeline::SinkConfig;
use sluice_core::secret::ResolvedSecrets;
use sluice_runtime::SinkEnv;
use sluice_runtime::sinks::external::{Batch, Transport, TransportError};
use sluice_runtime::sinks::{self, SinkContext};
use sluice_store::{MetadataStore, StoreError};
use tokio::sync::Semaphore;

mod events;

use crate::staging;
use crate::storage::Storage;
use crate::tables::{self, Table};
use crate::transform::RowTransformer;
use crate::warehouse::{Query, Warehouse, WarehouseError};

/// How jobs run.
#[derive(Debug, Clone, Copy)]
pub struct BackfillSettings {
    /// Rows per staged chunk (`--backfill-chunk-rows`, default 100,000).
    pub chunk_rows: usize,
    /// Jobs running at once.
    pub max_running: usize,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for BackfillSettings {
    fn default() -> Self {
        Self {
            chunk_rows: 100_000,
            max_running: 2,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// Errors of the job service.
#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Warehouse(#[from] WarehouseError),
    #[error("stream log: {0}")]
    Bus(#[from] sluice_bus::BusError),
    #[error("{0}")]
    Destination(String),
    #[error("the job's transforms cannot run: {0}")]
    Transform(#[from] sluice_runtime::plan::PlanError),
    #[error("a backfill task ended abnormally: {0}")]
    Task(String),
}

/// What a cancel did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancelled {
    Cancelled(Box<BackfillJob>),
    /// It had ended already, in this status.
    AlreadyFinished(BackfillStatus),
    NotFound,
}

/// The topic a managed (`kafka`) destination of a job appends to.
pub fn destination_topic(job_id: &str, sink_name: &str) -> String {
    format!("backfill.{job_id}.{sink_name}")
}

/// A table as `GET /backfills/tables` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    pub name: String,
    pub backfillable: bool,
    pub columns: Vec<(String, &'static str)>,
    pub rows: u64,
    /// `(min, max)` block time, Unix microseconds.
    pub time_range_us: Option<(i64, i64)>,
}

/// The backfill service of a process.
pub struct Backfills {
    store: Arc<dyn MetadataStore>,
    warehouse: Warehouse,
    log: Arc<dyn StreamLog>,
    catalog: Arc<Catalog>,
    clock: Arc<dyn Clock>,
    staging: Arc<dyn Storage>,
    sink_env: SinkEnv,
    settings: BackfillSettings,
    slots: Arc<Semaphore>,
    /// Cancel signals of the jobs running in this process.
    running: Mutex<HashMap<String, Arc<AtomicBool>>>,
    /// What scripts of jobs' transforms see of datasets (`beam.contains`).
    datasets: Mutex<Arc<dyn DatasetLookup>>,
    /// Where the jobs' events go ([`Backfills::use_events`]).
    events: Mutex<Arc<dyn sluice_core::events::EventEmitter>>,
}

impl std::fmt::Debug for Backfills {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backfills").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl Backfills {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<dyn MetadataStore>,
        warehouse: Warehouse,
        log: Arc<dyn StreamLog>,
        catalog: Arc<Catalog>,
        clock: Arc<dyn Clock>,
        staging: Arc<dyn Storage>,
        sink_env: SinkEnv,
        settings: BackfillSettings,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            warehouse,
            log,
            catalog,
            clock,
            staging,
            sink_env,
            slots: Arc::new(Semaphore::new(settings.max_running.max(1))),
            settings,
            running: Mutex::default(),
            datasets: Mutex::new(Arc::new(NoDatasets)),
            events: Mutex::new(Arc::new(sluice_core::events::NoEvents)),
        })
    }

    /// Answers `beam.contains` of jobs' scripts from `lookup` (the runtime's, which follows
    /// the dataset index).
    pub fn use_datasets(&self, lookup: Arc<dyn DatasetLookup>) {
        *self.datasets.lock().expect("not poisoned") = lookup;
    }

    /// What validation needs to know of table `name`.
    pub fn table_check(&self, name: &str) -> TableCheck {
        match tables::table(&self.catalog, name) {
            None => TableCheck::Unknown,
            Some(table) if !table.is_backfillable() => TableCheck::NotBackfillable,
            Some(table) => TableCheck::Columns {
                columns: table
                    .columns
                    .iter()
                    .filter(|(n, _)| !n.starts_with('_'))
                    .map(|(n, _)| (*n).to_owned())
                    .collect(),
                entity: table.entity.to_owned(),
            },
        }
    }

    /// Every table, with its columns, rows and time range.
    ///
    /// # Errors
    /// A manifest that cannot be read.
    pub fn tables(&self) -> Result<Vec<TableInfo>, BackfillError> {
        tables::tables(&self.catalog)
            .into_iter()
            .map(|table| {
                let manifest = self.warehouse.manifest(&table.name)?;
                Ok(TableInfo {
                    backfillable: table.is_backfillable(),
                    columns: table
                        .columns
                        .iter()
                        .filter(|(n, _)| !n.starts_with('_'))
                        .map(|(n, kind)| {
                            let type_name = match kind {
                                tables::ColumnKind::Int => "integer",
                                tables::ColumnKind::Float => "double",
                                tables::ColumnKind::Time => "timestamp",
                                tables::ColumnKind::Text => "string",
                            };
                            ((*n).to_owned(), type_name)
                        })
                        .collect(),
                    rows: manifest.rows(),
                    time_range_us: manifest.time_range(),
                    name: table.name,
                })
            })
            .collect()
    }

    /// Stores a new job (staging) for `request`, makes the topics of its managed destinations
    /// and starts it.
    ///
    /// # Errors
    /// A store or log failure.
    pub async fn create(
        self: &Arc<Self>,
        org_id: &str,
        user_id: &str,
        request: BackfillRequest,
    ) -> Result<BackfillJob, BackfillError> {
        let job_id = sluice_core::ids::new_id();
        let now = self.clock.now();
        let (filter_column, filter_values) = match request.filter {
            Some((column, values)) => (Some(column), Some(values)),
            None => (None, None),
        };
        let job = BackfillJob {
            workflow_id: BackfillJob::workflow_id_of(org_id, &job_id),
            job_id,
            organization_id: org_id.to_owned(),
            status: BackfillStatus::Staging,
            job_name: request.job_name,
            table: request.table,
            partition_key: PARTITION_KEY.to_owned(),
            backfill_start: request.start,
            backfill_end: request.end,
            filter_column,
            filter_values,
            destinations: request.destinations,
            static_egress_ip: request.static_egress_ip,
            transforms: request.transforms,
            rows_failed: 0,
            transform_error: None,
            num_chunks: None,
            chunks_left: 0,
            error_message: None,
            rows_staged: 0,
            rows_delivered: 0,
            created_by: user_id.to_owned(),
            created_at: now,
            updated_at: now,
            time_completed: None,
        };
        for sink in job.destinations.iter().filter(|s| !s.is_external()) {
            let config = TopicConfig { partitions: 1, retention: Retention::default() };
            self.log.create_topic(&destination_topic(&job.job_id, sink.name()), config).await?;
        }
        self.store.insert_backfill(&job).await?;
        self.emit_status(&job, None);
        tracing::info!(job_id = %job.job_id, table = %job.table, "backfill job created");
        self.spawn(job.job_id.clone());
        Ok(job)
    }

    /// Starts every job a previous process left staging or transporting; answers how many.
    ///
    /// # Errors
    /// A store failure.
    pub async fn resume(self: &Arc<Self>) -> Result<usize, BackfillError> {
        let jobs = self.store.active_backfills().await?;
        for job in &jobs {
            tracing::info!(job_id = %job.job_id, status = job.status.name(), "resuming backfill job");
            self.spawn(job.job_id.clone());
        }
        Ok(jobs.len())
    }

    /// Cancels a job of `org_id` that is still staging or transporting.
    ///
    /// # Errors
    /// A store failure.
    pub async fn cancel(&self, org_id: &str, job_id: &str) -> Result<Cancelled, BackfillError> {
        loop {
            let Some(mut job) =
                self.store.backfill(job_id).await?.filter(|j| j.organization_id == org_id)
            else {
                return Ok(Cancelled::NotFound);
            };
            if !job.status.is_active() {
                return Ok(Cancelled::AlreadyFinished(job.status));
            }
            let was = job.status;
            job.status = BackfillStatus::Cancelled;
            job.updated_at = self.clock.now();
            if self.transition(&job, &[was]).await? {
                if let Some(flag) = self.running.lock().expect("not poisoned").get(job_id) {
                    flag.store(true, Ordering::Relaxed);
                }
                tracing::info!(job_id, "backfill job cancelled");
                return Ok(Cancelled::Cancelled(Box::new(job)));
            }
            // It moved on meanwhile (staging -> transporting): look again.
        }
    }

    fn spawn(self: &Arc<Self>, job_id: String) {
        let flag = Arc::new(AtomicBool::new(false));
        self.running.lock().expect("not poisoned").insert(job_id.clone(), flag.clone());
        let service = self.clone();
        tokio::spawn(async move {
            let Ok(_slot) = service.slots.clone().acquire_owned().await else { return };
            if let Err(error) = service.run(&job_id, &flag).await {
                tracing::warn!(job_id, %error, "backfill job stopped on an error");
                service.fail(&job_id, &error.to_string()).await;
            }
            service.running.lock().expect("not poisoned").remove(&job_id);
            // Staging files go when the job has ended, however it ended.
            if service.finished(&job_id).await {
                let staging = service.staging.clone();
                let removed =
                    tokio::task::spawn_blocking(move || staging.delete_prefix(&job_id)).await;
                if let Ok(Err(error)) = removed {
                    tracing::warn!(%error, "cannot remove a finished backfill's staged chunks");
                }
            }
        });
    }

    async fn finished(&self, job_id: &str) -> bool {
        matches!(self.store.backfill(job_id).await, Ok(Some(job)) if !job.status.is_active())
    }

    async fn fail(&self, job_id: &str, message: &str) {
        let Ok(Some(mut job)) = self.store.backfill(job_id).await else { return };
        job.status = BackfillStatus::Failed;
        job.error_message = Some(message.to_owned());
        job.updated_at = self.clock.now();
        if let Err(error) =
            self.transition(&job, &[BackfillStatus::Staging, BackfillStatus::Transporting]).await
        {
            tracing::error!(job_id, %error, "cannot record a backfill job's failure");
        }
    }

    async fn run(&self, job_id: &str, cancelled: &Arc<AtomicBool>) -> Result<(), BackfillError> {
        loop {
            let Some(job) = self.store.backfill(job_id).await? else { return Ok(()) };
            match job.status {
                BackfillStatus::Staging => {
                    if !self.stage(job, cancelled).await? {
                        return Ok(());
                    }
                }
                BackfillStatus::Transporting => return self.transport(job, cancelled).await,
                _ => return Ok(()),
            }
        }
    }

    /// Stages `job`; false when it stopped (cancelled).
    async fn stage(
        &self,
        mut job: BackfillJob,
        cancelled: &Arc<AtomicBool>,
    ) -> Result<bool, BackfillError> {
        let Some(table) = tables::table(&self.catalog, &job.table) else {
            return Err(BackfillError::Destination(format!(
                "table {} no longer exists",
                job.table
            )));
        };
        let query = Query {
            start_us: job.backfill_start.timestamp_micros(),
            end_us: job.backfill_end.timestamp_micros(),
            filter: job.filter_column.clone().zip(job.filter_values.clone()),
        };
        let (warehouse, staging, dir, rows, flag) = (
            self.warehouse.clone(),
            self.staging.clone(),
            job.job_id.clone(),
            self.settings.chunk_rows.max(1),
            cancelled.clone(),
        );
        let (job_id, owner, transforms, datasets, clock) = (
            job.job_id.clone(),
            job.created_by.clone(),
            job.transforms.clone(),
            self.datasets.lock().expect("not poisoned").clone(),
            self.clock.clone(),
        );
        let (staged, transformed) = tokio::task::spawn_blocking(move || {
            let mut transformer =
                RowTransformer::new(&job_id, &owner, &transforms, datasets, clock)?;
            let staged = staging::stage(
                &warehouse,
                &table,
                &query,
                &*staging,
                &dir,
                rows,
                &flag,
                transformer.as_mut(),
            )?;
            Ok::<_, BackfillError>((staged, transformer))
        })
        .await
        .map_err(|error| BackfillError::Task(error.to_string()))??;
        let Some(staged) = staged else { return Ok(false) };
        if let Some(transformer) = transformed {
            job.rows_failed = transformer.failed;
            job.transform_error = transformer.first_error;
        }
        job.status = BackfillStatus::Transporting;
        job.num_chunks = Some(staged.chunks);
        job.chunks_left = staged.chunks;
        job.rows_staged = staged.rows;
        job.updated_at = self.clock.now();
        tracing::info!(job_id = %job.job_id, chunks = staged.chunks, rows = staged.rows, "backfill staged");
        Ok(self.transition(&job, &[BackfillStatus::Staging]).await?)
    }

    async fn transport(
        &self,
        mut job: BackfillJob,
        cancelled: &Arc<AtomicBool>,
    ) -> Result<(), BackfillError> {
        let destinations = self.destinations(&job).await?;
        let total = job.num_chunks.unwrap_or(0);
        while job.chunks_left > 0 {
            if cancelled.load(Ordering::Relaxed) {
                return Ok(());
            }
            let index = total - job.chunks_left;
            let (storage, path) = (self.staging.clone(), staging::chunk_path(&job.job_id, index));
            let rows = tokio::task::spawn_blocking(move || staging::read_chunk(&*storage, &path))
                .await
                .map_err(|error| BackfillError::Task(error.to_string()))??;
            let records: Vec<NewRecord> =
                rows.into_iter().map(|(key, record)| NewRecord::new(key, record)).collect();
            for destination in &destinations {
                if !self.deliver(&job, index, destination, &records, cancelled).await? {
                    return Ok(());
                }
            }
            job.chunks_left -= 1;
            job.rows_delivered += records.len() as u64;
            job.updated_at = self.clock.now();
            if job.chunks_left == 0 {
                job.status = BackfillStatus::Completed;
                job.time_completed = Some(job.updated_at);
            }
            if !self.transition(&job, &[BackfillStatus::Transporting]).await? {
                return Ok(());
            }
        }
        if job.status == BackfillStatus::Transporting {
            // Nothing was staged: done at once.
            job.status = BackfillStatus::Completed;
            job.updated_at = self.clock.now();
            job.time_completed = Some(job.updated_at);
            self.transition(&job, &[BackfillStatus::Transporting]).await?;
        }
        tracing::info!(job_id = %job.job_id, rows = job.rows_delivered, "backfill completed");
        Ok(())
    }

    async fn destinations(&self, job: &BackfillJob) -> Result<Vec<Destination>, BackfillError> {
        let table = tables::table(&self.catalog, &job.table)
            .ok_or_else(|| BackfillError::Destination(format!("no table {}", job.table)))?;
        let mut resolved = ResolvedSecrets::new();
        if let Some(secrets) = &self.sink_env.secrets {
            for sink in &job.destinations {
                for (_, name) in sink.secrets() {
                    if let Ok(found) = secrets.resolve(&job.organization_id, &[name]).await {
                        resolved.extend(found);
                    }
                }
            }
        }
        let context = SinkContext {
            pipeline_id: &job.job_id,
            secrets: &resolved,
            static_egress: job.static_egress_ip,
            egress: self.sink_env.egress,
            stream: (&table.chain, table.entity),
            guarantee: sluice_core::pipeline::DeliveryGuarantee::AtLeastOnce,
        };
        job.destinations
            .iter()
            .map(|sink| {
                let transport = sinks::transport(sink, context)
                    .map_err(|error| BackfillError::Destination(error.to_string()))?;
                Ok(match transport {
                    Some(transport) => {
                        Destination::External { uid: sink.uid().to_owned(), transport }
                    }
                    None => {
                        Destination::Managed { topic: destination_topic(&job.job_id, sink.name()) }
                    }
                })
            })
            .collect()
    }

    /// Delivers one chunk to one destination, retrying what may pass later; false when the
    /// job was cancelled meanwhile.
    async fn deliver(
        &self,
        job: &BackfillJob,
        index: u64,
        destination: &Destination,
        records: &[NewRecord],
        cancelled: &AtomicBool,
    ) -> Result<bool, BackfillError> {
        let mut backoff = self.settings.initial_backoff;
        loop {
            if cancelled.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let outcome = match destination {
                Destination::Managed { topic } => {
                    match self.log.append(topic, records.to_vec()).await {
                        Ok(_) => Ok(()),
                        Err(error) if error.is_transient() => Err((error.to_string(), None)),
                        Err(error) => return Err(error.into()),
                    }
                }
                Destination::External { uid, transport } => {
                    let id = format!("{}-{index}", job.job_id);
                    match transport.send(Batch { id: &id, records }).await {
                        Ok(sent) if sent.rejected.is_empty() => Ok(()),
                        Ok(sent) => {
                            let (row, reason) = &sent.rejected[0];
                            return Err(BackfillError::Destination(format!(
                                "destination {uid} refused {} record(s) of chunk {index} (first: row {row}: {reason})",
                                sent.rejected.len()
                            )));
                        }
                        Err(TransportError::Rejected { message }) => {
                            return Err(BackfillError::Destination(format!(
                                "destination {uid} refused chunk {index}: {message}"
                            )));
                        }
                        Err(TransportError::Retryable { message, retry_after }) => {
                            Err((format!("destination {uid}: {message}"), retry_after))
                        }
                    }
                }
            };
            match outcome {
                Ok(()) => return Ok(true),
                Err((message, retry_after)) => {
                    tracing::warn!(job_id = %job.job_id, chunk = index, %message, ?backoff, "backfill delivery failed; retrying");
                    let wait = retry_after
                        .map_or(backoff, |asked| asked.min(Duration::from_secs(300)).max(backoff));
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(self.settings.max_backoff);
                }
            }
        }
    }

    /// The destination topic of a job's managed sink `uid` (for reading it), if any.
    pub fn managed_topic(job: &BackfillJob, uid: &str) -> Option<String> {
        job.destinations
            .iter()
            .find(|sink| sink.uid() == uid && matches!(sink, SinkConfig::Kafka(_)))
            .map(|sink| destination_topic(&job.job_id, sink.name()))
    }

    /// Imports NDJSON records into the table `name` ([`crate::import`]); `None` when there is
    /// no such table.
    ///
    /// # Errors
    /// A warehouse that cannot be written.
    pub async fn import(
        &self,
        name: &str,
        ndjson: Vec<u8>,
    ) -> Result<Option<crate::import::ImportReport>, BackfillError> {
        let Some(table) = tables::table(&self.catalog, name) else { return Ok(None) };
        let warehouse = self.warehouse.clone();
        let report = tokio::task::spawn_blocking(move || {
            crate::import::import_ndjson(&warehouse, &table, ndjson.as_slice())
        })
        .await
        .map_err(|error| BackfillError::Task(error.to_string()))?;
        match report {
            Ok(report) => Ok(Some(report)),
            Err(crate::import::ImportError::Warehouse(error)) => Err(error.into()),
            Err(crate::import::ImportError::Read(error)) => {
                Err(BackfillError::Task(error.to_string()))
            }
        }
    }

    /// The table backfills read, for tests and tools.
    pub fn table(&self, name: &str) -> Option<Table> {
        tables::table(&self.catalog, name)
    }
}

enum Destination {
    Managed { topic: String },
    External { uid: String, transport: Arc<dyn Transport> },
}
