//! Service events (docs/events.md): the [`Recorder`] that stores them off the hot path, the
//! [`monitor`] that turns this process's snapshots (worker health, counters, data age,
//! nodes) into events, the [`chains`] watch that does the same for chain ingesters, and
//! [`notify`], which delivers them to each organization's notification destinations.
//!
//! Emitting never waits: [`Recorder::emit`] puts the event on a bounded channel (dropped and
//! counted when full) and one writer task stores batches of them. Readers (the API's list
//! and stream, the notifier) read the store, woken by [`Recorder::subscribe`]; on a cluster
//! they also look on a timer, for the events other nodes stored.

pub mod chains;
pub(crate) mod lifecycle;
pub mod monitor;
pub mod notify;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::clock::Clock;
use sluice_core::events::{EventEmitter, NewEvent};
use sluice_store::MetadataStore;
use tokio::sync::{mpsc, watch};

/// How long events are kept.
pub const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// How events are recorded and watched; `docs/events.md` lists the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventSettings {
    /// Events waiting for the writer at most; more are dropped (and counted).
    pub capacity: usize,
    /// How long events are kept.
    pub retention: Duration,
    /// How often the monitor samples this process's deployments and the chain watch its
    /// ingesters.
    pub interval: Duration,
    /// At most one `dead_letters.recorded` event per pipeline in this window.
    pub dead_letter_window: Duration,
    /// A sink that has failed a batch for this long is `sink.failing`.
    pub sink_failing_after: Duration,
    /// A worker with no restart for this long after crash-looping or an OOM kill is
    /// `worker.recovered`.
    pub worker_stable_after: Duration,
    /// The data age over which a pipeline is `lag.data_age_over`, unless it sets its own.
    pub data_age_warning: Duration,
    /// A chain whose data lags its head by more than this is `chain.lagging`.
    pub chain_lag: Duration,
    /// A chain that ingested no new block for this long is `chain.stalled`.
    pub chain_stall: Duration,
    /// Longest wait between two attempts of a failing notification destination.
    pub notify_max_backoff: Duration,
}

impl Default for EventSettings {
    fn default() -> Self {
        Self {
            capacity: 10_000,
            retention: RETENTION,
            interval: Duration::from_secs(1),
            dead_letter_window: Duration::from_secs(60),
            sink_failing_after: Duration::from_secs(30),
            worker_stable_after: Duration::from_secs(60),
            data_age_warning: Duration::from_secs(300),
            chain_lag: Duration::from_secs(300),
            chain_stall: Duration::from_secs(120),
            notify_max_backoff: Duration::from_secs(60),
        }
    }
}

/// Events written per statement by the writer task at most.
const WRITE_BATCH: usize = 1000;

/// Where this process's events go: a bounded channel to one writer task.
pub struct Recorder {
    tx: mpsc::Sender<NewEvent>,
    dropped: AtomicU64,
    stored: AtomicU64,
    /// The largest id this process stored (wakes readers).
    last_id: watch::Sender<i64>,
    store: Arc<dyn MetadataStore>,
    clock: Arc<dyn Clock>,
    settings: EventSettings,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl EventEmitter for Recorder {
    fn emit(&self, event: NewEvent) {
        if let Err(error) = self.tx.try_send(event) {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                let kind = match &error {
                    mpsc::error::TrySendError::Full(e) | mpsc::error::TrySendError::Closed(e) => {
                        e.kind
                    }
                };
                tracing::warn!(dropped, kind, "event dropped: the event writer is behind");
            }
        }
    }
}

impl Recorder {
    /// A recorder storing into `store`; starts its writer and retention tasks.
    pub fn start(
        store: Arc<dyn MetadataStore>,
        clock: Arc<dyn Clock>,
        settings: EventSettings,
    ) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(settings.capacity.max(1));
        let (last_id, _) = watch::channel(0);
        let recorder = Arc::new(Self {
            tx,
            dropped: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            last_id,
            store,
            clock,
            settings,
        });
        tokio::spawn(write(Arc::downgrade(&recorder), rx));
        tokio::spawn(purge(Arc::downgrade(&recorder)));
        recorder
    }

    /// Wakes when this process stored events (the value is the largest id stored).
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.last_id.subscribe()
    }

    pub fn settings(&self) -> &EventSettings {
        &self.settings
    }

    pub fn store(&self) -> &Arc<dyn MetadataStore> {
        &self.store
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Events dropped because the writer was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Events this process stored.
    pub fn stored(&self) -> u64 {
        self.stored.load(Ordering::Relaxed)
    }

    /// The time to stamp an event with.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.clock.now()
    }
}

/// The writer task: stores what arrives, a batch at a time, until every emitter is gone. A
/// store failure keeps the batch and tries it again (meanwhile the channel fills and new
/// events are dropped rather than waiting).
async fn write(recorder: std::sync::Weak<Recorder>, mut rx: mpsc::Receiver<NewEvent>) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    let mut backoff = Duration::from_millis(100);
    while rx.recv_many(&mut batch, WRITE_BATCH).await > 0 {
        loop {
            let Some(recorder) = recorder.upgrade() else { return };
            match recorder.store.insert_events(&batch).await {
                Ok(stored) => {
                    recorder.stored.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    if let Some(last) = stored.last() {
                        recorder.last_id.send_replace(*last);
                    }
                    backoff = Duration::from_millis(100);
                    break;
                }
                Err(error) => {
                    tracing::warn!(%error, events = batch.len(), "cannot store events; retrying");
                    drop(recorder);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        batch.clear();
    }
}

/// Deletes events older than the retention, at start and every hour.
async fn purge(recorder: std::sync::Weak<Recorder>) {
    loop {
        {
            let Some(recorder) = recorder.upgrade() else { return };
            let retention = chrono::Duration::from_std(recorder.settings.retention)
                .unwrap_or(chrono::Duration::days(30));
            let before = recorder.clock.now() - retention;
            match recorder.store.purge_events(before).await {
                Ok(0) => {}
                Ok(purged) => tracing::info!(purged, "events past their retention deleted"),
                Err(error) => tracing::warn!(%error, "cannot delete old events"),
            }
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}
