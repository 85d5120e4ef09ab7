//! The `object_storage` sink: files of records (Parquet, or gzip JSON lines) in an
//! S3-compatible bucket, under `<prefix>/<chain>/<entity>/<date>/`, cut by rows, bytes and
//! age (`max_rows`, `max_bytes`, `max_seconds`). Requests go through `object_store` (the
//! client the warehouse uses), files are encoded with the warehouse's writer
//! (`sluice_columnar`).
//!
//! **Exactly once by name** ([`files`]): one file per source partition, named by the offset
//! it starts at; a partition's offset is committed past a file only after the file is
//! written, so a retry writes the same name again. A file stays open across batches: the
//! worker goes on reading while the sink holds the file's offsets uncommitted (the source's
//! committed offset is the file's start). A file is written when the next record would take
//! it over `max_rows` or `max_bytes` (cut exactly there), when a batch leaves it at its
//! limits, or when it is `max_seconds` old (checked every second, between batches too).
//! Batches the transforms emptied commit at once. Dead letters and script logs are written
//! with each batch.
//!
//! Failures: a write that fails is retryable (the worker holds the source, `at_least_once`,
//! and the same batch comes again: records the sink already holds are not taken twice).
//! Under `best_effort` the failed file is dropped with its records and its offsets move on.
//!
//! The sink's open files outlive a configuration swap (a redeploy at a batch boundary hands
//! them to the new sink: [`shared_state`]); stopping the deployment writes them, and so does
//! a swap to another sink (the state's `Drop`).

pub mod files;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, PutPayload, RetryConfig};
use serde_json::{Value, json};
use sluice_bus::StreamLog;
use sluice_core::pipeline::{DeliveryGuarantee, ObjectStorageSinkConfig, SinkConfig};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use super::external::{Batch, Sent, Transport, TransportError};
use super::{Settle, Sink, SinkBuildError, SinkConnection, SinkError};
use crate::delivery::{Delivery, SideTopics};
use files::{Format, Layout, Limits, OpenFile, day_of_ms};

/// Where a sink writes: the bucket's client and the files' layout.
pub struct Target {
    store: Arc<dyn ObjectStore>,
    layout: Layout,
    limits: Limits,
    /// The pipeline (or backfill job) whose files these are: part of every name.
    owner: String,
    guarantee: DeliveryGuarantee,
    connection: Value,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target").field("connection", &self.connection).finish_non_exhaustive()
    }
}

/// The credentials of a target, from organization secrets.
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl Target {
    /// The target of `config` for records of `chain`'s `entity`, written for `owner`.
    ///
    /// # Errors
    /// A client the settings do not make (the reason names no credential).
    pub fn new(
        config: &ObjectStorageSinkConfig,
        credentials: Credentials,
        (chain, entity): (&str, &str),
        owner: &str,
        guarantee: DeliveryGuarantee,
    ) -> Result<Self, String> {
        let endpoint = config
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", config.region));
        // The worker retries a failed write with its own backoff (holding the source): a
        // request is tried once, and fails within the timeout.
        let retry = RetryConfig {
            max_retries: 0,
            retry_timeout: Duration::from_secs(30),
            ..RetryConfig::default()
        };
        let options = ClientOptions::new()
            .with_timeout(Duration::from_secs(60))
            .with_connect_timeout(Duration::from_secs(10))
            .with_allow_http(endpoint.starts_with("http://"));
        let mut builder = AmazonS3Builder::new()
            .with_endpoint(&endpoint)
            .with_region(&config.region)
            .with_bucket_name(&config.bucket)
            .with_virtual_hosted_style_request(!config.path_style)
            .with_access_key_id(credentials.access_key_id)
            .with_secret_access_key(credentials.secret_access_key)
            .with_retry(retry)
            .with_client_options(options);
        if let Some(token) = credentials.session_token {
            builder = builder.with_token(token);
        }
        let store = builder.build().map_err(|error| format!("S3 client: {error}"))?;
        let base = [config.prefix.as_str(), chain, entity]
            .into_iter()
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join("/");
        let format = Format::from_name(&config.format);
        let connection = json!({
            "transport": "object_storage",
            "bucket": config.bucket,
            "prefix": config.prefix,
            "region": config.region,
            "endpoint": endpoint,
            "path_style": config.path_style,
            "format": config.format,
            "max_rows": config.max_rows,
            "max_bytes": config.max_bytes,
            "max_seconds": config.max_seconds,
            "objects": format!("{base}/<YYYY-MM-DD>/{owner}-<partition>-<first offset>.{}", format.extension()),
        });
        let table = sluice_columnar::tables::layout(chain, entity);
        let layout = Layout { base, entity: entity.to_owned(), table, format };
        let limits = Limits {
            max_rows: usize::try_from(config.max_rows).unwrap_or(usize::MAX),
            max_bytes: usize::try_from(config.max_bytes).unwrap_or(usize::MAX),
            max_seconds: config.max_seconds,
        };
        Ok(Self {
            store: Arc::new(store),
            layout,
            limits,
            owner: owner.to_owned(),
            guarantee,
            connection,
        })
    }

    /// Writes `bytes` at `key`, replacing what is there.
    async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), TransportError> {
        let path = ObjectPath::from(key);
        self.store
            .put(&path, PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|error| TransportError::retryable(format!("writing {key}: {error}")))
    }

    /// Encodes `file` and writes it as `key`.
    async fn write(&self, key: &str, rows: &[sluice_columnar::Row]) -> Result<(), TransportError> {
        let bytes = self.layout.encode(rows).map_err(TransportError::rejected)?;
        self.put(key, bytes).await
    }

    /// Whether the bucket answers with these credentials: a listing of the sink's directory.
    ///
    /// # Errors
    /// Why not (no credential in it).
    pub async fn check(&self) -> Result<(), String> {
        let base = ObjectPath::from(self.layout.base.as_str());
        match self.store.list_with_delimiter(Some(&base)).await {
            Ok(_) => Ok(()),
            Err(error) => Err(format!("the bucket cannot be listed with these settings: {error}")),
        }
    }
}

/// One partition's open file, locked while a batch or the age check works on it.
type FileSlot = Arc<AsyncMutex<OpenFile>>;

/// What the sinks of one pipeline's sink share across a configuration swap.
#[derive(Default)]
pub struct SharedState {
    /// Open files by `(group, source, partition)`.
    files: Mutex<HashMap<(String, String, u32), FileSlot>>,
    /// The target the age check writes with (the newest sink's).
    target: RwLock<Option<Arc<Target>>>,
    /// The log offsets are committed in, from the first batch.
    log: RwLock<Option<Arc<dyn StreamLog>>>,
    ticker: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for SharedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedState").finish_non_exhaustive()
    }
}

impl Drop for SharedState {
    /// No sink of this pipeline's sink is left (a redeploy swapped it for another sink): the
    /// files still open are written now. Their offsets are not committed here: the worker
    /// has read past them, and the next sink's commits cover them.
    fn drop(&mut self) {
        let files: Vec<_> =
            self.files.get_mut().map(std::mem::take).unwrap_or_default().into_iter().collect();
        let target = self.target.get_mut().ok().and_then(Option::take);
        let (Some(target), Ok(runtime)) = (target, tokio::runtime::Handle::try_current()) else {
            return;
        };
        runtime.spawn(async move {
            for ((_, _, partition), slot) in files {
                let file = slot.lock().await;
                if file.rows.is_empty() {
                    continue;
                }
                let key = file.key(&target.layout, &target.owner, partition);
                if let Err(error) = target.write(&key, &file.rows).await {
                    tracing::warn!(%error, key, "an object storage file of a replaced sink was not written");
                }
            }
        });
    }
}

/// Live states by `<pipeline>/<sink uid>`: a sink built while an older one of the same sink
/// still runs takes over its open files.
static LIVE: LazyLock<Mutex<HashMap<String, Weak<SharedState>>>> = LazyLock::new(Mutex::default);

/// The state of `pipeline`'s sink `uid`: the running one's, or a new one.
pub fn shared_state(pipeline: &str, uid: &str) -> Arc<SharedState> {
    let mut live = LIVE.lock().expect("not poisoned");
    live.retain(|_, state| state.strong_count() > 0);
    let key = format!("{pipeline}/{uid}");
    if let Some(state) = live.get(&key).and_then(Weak::upgrade) {
        return state;
    }
    let state = Arc::new(SharedState::default());
    live.insert(key, Arc::downgrade(&state));
    state
}

/// The `object_storage` sink of a pipeline.
#[derive(Debug)]
pub struct ObjectStorageSink {
    config: SinkConfig,
    target: Arc<Target>,
    state: Arc<SharedState>,
}

impl ObjectStorageSink {
    pub fn new(config: SinkConfig, target: Target, state: Arc<SharedState>) -> Self {
        let target = Arc::new(target);
        *state.target.write().expect("not poisoned") = Some(target.clone());
        Self { config, target, state }
    }

    fn error(&self, source: TransportError) -> SinkError {
        SinkError {
            uid: self.config.uid().to_owned(),
            retryable: matches!(source, TransportError::Retryable { .. }),
            retry_after: None,
            source: Box::new(source),
        }
    }

    /// The open files of `partitions`, locked (in partition order), each made at the
    /// group's committed offset when new.
    async fn lock_files(
        &self,
        log: &Arc<dyn StreamLog>,
        settle: Settle<'_>,
        partitions: &[u32],
    ) -> Result<BTreeMap<u32, OwnedMutexGuard<OpenFile>>, SinkError> {
        let mut committed: Option<BTreeMap<u32, u64>> = None;
        let mut locked = BTreeMap::new();
        for &partition in partitions {
            let key = (settle.group.to_owned(), settle.source.to_owned(), partition);
            let slot = self.state.files.lock().expect("not poisoned").get(&key).cloned();
            let slot = match slot {
                Some(slot) => slot,
                None => {
                    if committed.is_none() {
                        let found = log
                            .committed(settle.group, settle.source)
                            .await
                            .map_err(|error| SinkError::settling(self.config.uid(), error))?;
                        committed = Some(found);
                    }
                    let start = committed.as_ref().and_then(|c| c.get(&partition)).copied();
                    let slot = Arc::new(AsyncMutex::new(OpenFile::new(start.unwrap_or(0))));
                    self.state
                        .files
                        .lock()
                        .expect("not poisoned")
                        .entry(key)
                        .or_insert(slot)
                        .clone()
                }
            };
            locked.insert(partition, slot.lock_owned().await);
        }
        Ok(locked)
    }

    /// Takes a worker batch: each record into its partition's file (writing a file the record
    /// would take over its limits first), then writes the files the batch left due.
    async fn take(
        &self,
        log: &Arc<dyn StreamLog>,
        delivery: &Delivery,
        settle: Settle<'_>,
    ) -> Result<Vec<(u32, u64)>, SinkError> {
        let mut partitions: Vec<u32> = settle.offsets.iter().map(|(p, _)| *p).collect();
        partitions.extend(delivery.origins.iter().map(|origin| origin.partition));
        partitions.sort_unstable();
        partitions.dedup();
        let mut files = self.lock_files(log, settle, &partitions).await?;
        let now = Instant::now();
        let target = &self.target;
        let mut outcome = Ok(());
        for (record, origin) in delivery.out.iter().zip(&delivery.origins) {
            let Some(file) = files.get_mut(&origin.partition) else { continue };
            if origin.offset < file.through {
                // Taken already: the same batch again after a failure.
                continue;
            }
            let row = target.layout.row(&record.key, &record.value, origin.timestamp_ms * 1000);
            if file.full_with(row.record.len(), &target.limits) {
                // Cut exactly here: this record starts the next file.
                if let Err(error) =
                    self.flush(log, settle, origin.partition, file, origin.offset).await
                {
                    outcome = Err(error);
                    break;
                }
            }
            file.push(row, *origin, now);
        }
        if outcome.is_ok() {
            for &(partition, end) in settle.offsets {
                if let Some(file) = files.get_mut(&partition) {
                    file.through = file.through.max(end);
                }
            }
            for (partition, file) in &mut files {
                if file.due(&target.limits, now) {
                    let through = file.through;
                    if let Err(error) = self.flush(log, settle, *partition, file, through).await {
                        outcome = Err(error);
                        break;
                    }
                }
            }
        }
        if let Err(error) = outcome {
            if self.target.guarantee == DeliveryGuarantee::BestEffort {
                // The failed files go with their records; their offsets move on.
                for (partition, file) in &mut files {
                    let end = settle
                        .offsets
                        .iter()
                        .find(|(p, _)| p == partition)
                        .map_or(file.through, |o| o.1);
                    if !file.rows.is_empty() {
                        tracing::warn!(
                            sink_uid = self.config.uid(),
                            partition,
                            records = file.rows.len(),
                            "object storage file dropped (best_effort)"
                        );
                    }
                    let next = end.max(file.through);
                    file.reset(next);
                }
            }
            return Err(self.error(error));
        }
        // Partitions whose file holds nothing commit at once.
        let mut empty = Vec::new();
        for (partition, file) in &mut files {
            if file.rows.is_empty() && file.through > file.start {
                empty.push((*partition, file.through));
                file.start = file.through;
            }
        }
        Ok(empty)
    }

    /// Writes `file` of `partition` and commits `next` (the offset after what it covers).
    async fn flush(
        &self,
        log: &Arc<dyn StreamLog>,
        settle: Settle<'_>,
        partition: u32,
        file: &mut OpenFile,
        next: u64,
    ) -> Result<(), TransportError> {
        let key = file.key(&self.target.layout, &self.target.owner, partition);
        self.target.write(&key, &file.rows).await?;
        log.append_and_commit(&[], settle.group, settle.source, &[(partition, next)])
            .await
            .map_err(|error| {
                TransportError::retryable(format!("committing after {key}: {error}"))
            })?;
        tracing::debug!(key, rows = file.rows.len(), "object storage file written");
        file.reset(next);
        Ok(())
    }

    /// A batch without source positions (a dead-letter replay): its records in one file at
    /// once, named by the group's committed offset.
    async fn write_whole(
        &self,
        log: &Arc<dyn StreamLog>,
        delivery: &Delivery,
        settle: Settle<'_>,
    ) -> Result<(), SinkError> {
        if delivery.out.is_empty() {
            return Ok(());
        }
        let committed = log
            .committed(settle.group, settle.source)
            .await
            .map_err(|error| SinkError::settling(self.config.uid(), error))?;
        let start =
            settle.offsets.first().and_then(|(p, _)| committed.get(p)).copied().unwrap_or(0);
        let fallback_us = delivery.made_at.timestamp_micros();
        let rows: Vec<_> = delivery
            .out
            .iter()
            .map(|record| self.target.layout.row(&record.key, &record.value, fallback_us))
            .collect();
        let date = day_of_ms(rows[0].time_us / 1000);
        let name = format!("{}-replay-{start:020}", self.target.owner);
        let key = self.target.layout.key(&date, &name);
        self.target.write(&key, &rows).await.map_err(|error| self.error(error))
    }

    /// Starts the age check once the sink has a log to commit in.
    fn start_ticker(&self, log: &Arc<dyn StreamLog>, group: &str, source: &str) {
        let mut ticker = self.state.ticker.lock().expect("not poisoned");
        if ticker.is_some() {
            return;
        }
        *self.state.log.write().expect("not poisoned") = Some(log.clone());
        let state = Arc::downgrade(&self.state);
        let (group, source) = (group.to_owned(), source.to_owned());
        *ticker = Some(tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(state) = state.upgrade() else { return };
                write_aged(&state, &group, &source).await;
            }
        }));
    }
}

/// Writes the files of `state` that are `max_seconds` old and not in a batch's hands.
async fn write_aged(state: &SharedState, group: &str, source: &str) {
    let target = state.target.read().expect("not poisoned").clone();
    let log = state.log.read().expect("not poisoned").clone();
    let (Some(target), Some(log)) = (target, log) else { return };
    let slots: Vec<(u32, FileSlot)> = state
        .files
        .lock()
        .expect("not poisoned")
        .iter()
        .filter(|((g, s, _), _)| g == group && s == source)
        .map(|((_, _, partition), slot)| (*partition, slot.clone()))
        .collect();
    let now = Instant::now();
    for (partition, slot) in slots {
        let Ok(mut file) = slot.try_lock() else { continue };
        if !file.due(&target.limits, now) {
            continue;
        }
        let key = file.key(&target.layout, &target.owner, partition);
        let next = file.through;
        let written = async {
            target.write(&key, &file.rows).await?;
            log.append_and_commit(&[], group, source, &[(partition, next)])
                .await
                .map_err(|error| TransportError::retryable(error.to_string()))
        };
        match written.await {
            Ok(()) => file.reset(next),
            // The next batch (or tick) tries again; under at_least_once the batch holds the
            // source until it passes.
            Err(error) => tracing::warn!(%error, key, "object storage file not written yet"),
        }
    }
}

#[async_trait::async_trait]
impl Sink for ObjectStorageSink {
    fn config(&self) -> &SinkConfig {
        &self.config
    }

    fn managed_topic(&self) -> Option<&str> {
        None
    }

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
        let positioned = delivery.origins.len() == delivery.out.len();
        let commit = if positioned {
            self.start_ticker(log, settle.group, settle.source);
            self.take(log, delivery, settle).await?
        } else {
            self.write_whole(log, delivery, settle).await?;
            settle.offsets.to_vec()
        };
        let settle = Settle { offsets: &commit, ..settle };
        let uid = self.config.uid();
        super::settle_side(log, uid, side, &delivery.dead, &delivery.logs, settle).await
    }

    fn connection(&self, _pipeline_id: &str) -> SinkConnection {
        SinkConnection::unmanaged(&self.config, self.target.connection.clone())
    }

    async fn check_connection(&self) -> Result<(), SinkBuildError> {
        self.target
            .check()
            .await
            .map_err(|reason| SinkBuildError::Client { uid: self.config.uid().to_owned(), reason })
    }

    /// Writes every open file and commits past it (what cannot be written stays
    /// uncommitted, for the next start), and stops the age check.
    async fn close(&self) {
        if let Some(ticker) = self.state.ticker.lock().expect("not poisoned").take() {
            ticker.abort();
        }
        let log = self.state.log.read().expect("not poisoned").clone();
        let slots: Vec<_> = self.state.files.lock().expect("not poisoned").drain().collect();
        let Some(log) = log else { return };
        for ((group, source, partition), slot) in slots {
            let mut file = slot.lock().await;
            let settle = Settle { group: &group, source: &source, offsets: &[] };
            let next = file.through;
            let outcome = if file.rows.is_empty() {
                if next > file.start {
                    log.commit(&group, &source, &[(partition, next)])
                        .await
                        .map_err(|e| TransportError::retryable(e.to_string()))
                } else {
                    Ok(())
                }
            } else {
                self.flush(&log, settle, partition, &mut file, next).await
            };
            if let Err(error) = outcome {
                tracing::warn!(%error, partition, "object storage file not written at stop; the next start writes it");
            }
        }
    }
}

/// The `object_storage` destination of a backfill: each chunk in files named by the chunk
/// (`<job>-<chunk>-<n>`, so a chunk delivered again replaces its files), cut by `max_rows`
/// and `max_bytes`, dated by their first record's block time.
#[derive(Debug)]
pub struct ObjectStorageTransport {
    target: Target,
}

impl ObjectStorageTransport {
    pub fn new(target: Target) -> Self {
        Self { target }
    }
}

#[async_trait::async_trait]
impl Transport for ObjectStorageTransport {
    async fn send(&self, batch: Batch<'_>) -> Result<Sent, TransportError> {
        let limits = &self.target.limits;
        let mut part = 0;
        let mut rows: Vec<sluice_columnar::Row> = Vec::new();
        let mut bytes = 0;
        let mut records = batch.records.iter().peekable();
        while let Some(record) = records.next() {
            let row = self.target.layout.row(&record.key, &record.value, 0);
            bytes += row.record.len();
            rows.push(row);
            let next_bytes = records.peek().map_or(0, |next| next.value.len());
            let last = records.peek().is_none();
            if last || rows.len() >= limits.max_rows || bytes + next_bytes > limits.max_bytes {
                let date = day_of_ms(rows[0].time_us / 1000);
                let name = format!("{}-{part}", batch.id);
                self.target.write(&self.target.layout.key(&date, &name), &rows).await?;
                part += 1;
                rows.clear();
                bytes = 0;
            }
        }
        Ok(Sent::default())
    }

    fn connection(&self) -> Value {
        self.target.connection.clone()
    }
}
