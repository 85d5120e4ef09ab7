//! Deployment metrics as the workers record them: per pipeline, per minute of the injected
//! clock, a [`MetricSample`], plus totals since the process started (for Prometheus).
//!
//! Workers add to the current minute in memory ([`PipelineMetrics`]); a background job
//! (`MetricsHub::run_jobs`) writes each finished minute to the store every
//! [`FLUSH_EVERY`] and deletes samples older than [`RETENTION`] every [`RETENTION_EVERY`]. A
//! deployment that stops (pause, teardown, redeploy with other workers, shutdown) writes what
//! it has at once. Reads merge the stored minutes with the ones not written yet, so they see
//! every record a worker counted.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sluice_core::clock::Clock;
use sluice_store::metrics::Histogram;
use sluice_store::{MetadataStore, MetricSample};

/// How often finished minutes are written to the store.
pub const FLUSH_EVERY: Duration = Duration::from_secs(15);
/// How often samples older than [`RETENTION`] are deleted.
pub const RETENTION_EVERY: Duration = Duration::from_secs(3600);
/// How long samples are kept: the longest range (1w) plus a day.
pub const RETENTION: chrono::Duration = chrono::Duration::days(8);

const MINUTE_MS: i64 = 60_000;

/// Counts since the process started, for Prometheus (they only grow).
#[derive(Debug, Clone, Default)]
pub struct Totals {
    pub received: u64,
    pub sent: u64,
    pub processor_errors: u64,
    pub output_errors: u64,
    pub total_latency: Histogram,
    pub processing_latency: Histogram,
    /// The latest data age observed, ms.
    pub data_age_ms: Option<i64>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Minutes (start, unix ms) not written to the store yet.
    pending: BTreeMap<i64, MetricSample>,
    totals: Totals,
}

/// What one batch of a worker did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct BatchMetrics {
    pub received: u64,
    pub sent: u64,
    pub processor_errors: u64,
    pub output_errors: u64,
    pub sink_writes: u64,
    pub total_latency_ms: Option<f64>,
    pub processing_latency_ms: Option<f64>,
    pub data_age_ms: Option<i64>,
}

/// The metrics of one pipeline, shared by its workers across redeploys.
pub struct PipelineMetrics {
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for PipelineMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineMetrics").finish_non_exhaustive()
    }
}

impl PipelineMetrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds one batch to the current minute and the totals.
    pub(crate) fn record(&self, batch: BatchMetrics) {
        let now_ms = self.clock.now().timestamp_millis();
        let minute = now_ms.div_euclid(MINUTE_MS) * MINUTE_MS;
        let mut inner = self.lock();
        let sample = inner.pending.entry(minute).or_default();
        sample.received += batch.received;
        sample.sent += batch.sent;
        sample.processor_errors += batch.processor_errors;
        sample.output_errors += batch.output_errors;
        sample.sink_writes += batch.sink_writes;
        if let Some(ms) = batch.total_latency_ms {
            sample.total_latency.observe(ms);
        }
        if let Some(ms) = batch.processing_latency_ms {
            sample.processing_latency.observe(ms);
        }
        if let Some(age) = batch.data_age_ms {
            sample.observe_data_age(age, now_ms);
        }
        let totals = &mut inner.totals;
        totals.received += batch.received;
        totals.sent += batch.sent;
        totals.processor_errors += batch.processor_errors;
        totals.output_errors += batch.output_errors;
        if let Some(ms) = batch.total_latency_ms {
            totals.total_latency.observe(ms);
        }
        if let Some(ms) = batch.processing_latency_ms {
            totals.processing_latency.observe(ms);
        }
        if batch.data_age_ms.is_some() {
            totals.data_age_ms = batch.data_age_ms;
        }
    }

    /// Takes the pending minutes that started before `before_ms` (all with `None`).
    fn take(&self, before_ms: Option<i64>) -> Vec<(i64, MetricSample)> {
        let mut inner = self.lock();
        let keep = match before_ms {
            Some(before) => inner.pending.split_off(&before),
            None => BTreeMap::new(),
        };
        std::mem::replace(&mut inner.pending, keep).into_iter().collect()
    }

    /// Puts minutes back that could not be written.
    fn put_back(&self, samples: Vec<(i64, MetricSample)>) {
        let mut inner = self.lock();
        for (minute, sample) in samples {
            inner.pending.entry(minute).or_default().merge(&sample);
        }
    }

    fn pending_in(&self, from_ms: i64, until_ms: i64) -> Vec<(i64, MetricSample)> {
        let inner = self.lock();
        inner.pending.range(from_ms..until_ms).map(|(m, s)| (*m, s.clone())).collect()
    }

    pub fn totals(&self) -> Totals {
        self.lock().totals.clone()
    }
}

/// The metrics of every pipeline of the process.
pub struct MetricsHub {
    store: Arc<dyn MetadataStore>,
    clock: Arc<dyn Clock>,
    pipelines: Mutex<HashMap<String, Arc<PipelineMetrics>>>,
    /// Held while minutes move from memory to the store, so a read sees each minute once.
    moving: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for MetricsHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsHub").finish_non_exhaustive()
    }
}

impl MetricsHub {
    pub(crate) fn new(store: Arc<dyn MetadataStore>, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            clock,
            pipelines: Mutex::new(HashMap::new()),
            moving: tokio::sync::Mutex::new(()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<PipelineMetrics>>> {
        self.pipelines.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The metrics of `pipeline_id`, created on first use.
    pub(crate) fn pipeline(&self, pipeline_id: &str) -> Arc<PipelineMetrics> {
        self.map()
            .entry(pipeline_id.to_owned())
            .or_insert_with(|| {
                Arc::new(PipelineMetrics { clock: self.clock.clone(), inner: Mutex::default() })
            })
            .clone()
    }

    /// Totals since the process started of every pipeline that ran, by pipeline id.
    pub fn totals(&self) -> Vec<(String, Totals)> {
        let mut all: Vec<(String, Totals)> =
            self.map().iter().map(|(id, metrics)| (id.clone(), metrics.totals())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Writes pending minutes of `pipeline_id` (or of every pipeline) that started before
    /// `before_ms` (or all of them) to the store. Minutes that fail stay pending.
    pub(crate) async fn flush(&self, pipeline_id: Option<&str>, before_ms: Option<i64>) {
        let _moving = self.moving.lock().await;
        let pipelines: Vec<(String, Arc<PipelineMetrics>)> = self
            .map()
            .iter()
            .filter(|(id, _)| pipeline_id.is_none_or(|wanted| wanted == id.as_str()))
            .map(|(id, m)| (id.clone(), m.clone()))
            .collect();
        for (id, metrics) in pipelines {
            let samples = metrics.take(before_ms);
            if samples.is_empty() {
                continue;
            }
            if let Err(error) = self.store.append_metric_samples(&id, &samples).await {
                tracing::warn!(%error, config_id = %id, "cannot store metrics; kept for the next flush");
                metrics.put_back(samples);
            }
        }
    }

    /// The samples of `pipeline_id` whose minute starts in `from_ms..until_ms`, stored and
    /// pending, merged by minute in order.
    ///
    /// # Errors
    /// A store failure.
    pub async fn samples(
        &self,
        pipeline_id: &str,
        from_ms: i64,
        until_ms: i64,
    ) -> sluice_store::Result<Vec<(i64, MetricSample)>> {
        let _moving = self.moving.lock().await;
        let stored = self.store.metric_samples(pipeline_id, from_ms, until_ms).await?;
        let pending = self.map().get(pipeline_id).map(|m| m.pending_in(from_ms, until_ms));
        let mut merged: BTreeMap<i64, MetricSample> = stored.into_iter().collect();
        for (minute, sample) in pending.unwrap_or_default() {
            merged.entry(minute).or_default().merge(&sample);
        }
        Ok(merged.into_iter().collect())
    }

    /// Forgets `pipeline_id`: its pending minutes and its stored samples (a deleted pipeline).
    ///
    /// # Errors
    /// A store failure.
    pub async fn forget(&self, pipeline_id: &str) -> sluice_store::Result<()> {
        let _moving = self.moving.lock().await;
        self.map().remove(pipeline_id);
        self.store.delete_pipeline_metrics(pipeline_id).await?;
        Ok(())
    }

    /// Deletes stored samples older than [`RETENTION`]; returns the rows deleted.
    ///
    /// # Errors
    /// A store failure.
    pub async fn apply_retention(&self) -> sluice_store::Result<u64> {
        let before = (self.clock.now() - RETENTION).timestamp_millis();
        self.store.delete_metric_samples_before(before).await
    }

    /// The background job: flushes finished minutes every [`FLUSH_EVERY`] and applies the
    /// retention every [`RETENTION_EVERY`]; ends when the hub is dropped.
    pub(crate) async fn run_jobs(hub: Weak<Self>) {
        let mut flush = tokio::time::interval(FLUSH_EVERY);
        let mut retention = tokio::time::interval(RETENTION_EVERY);
        loop {
            tokio::select! {
                _ = flush.tick() => {
                    let Some(hub) = hub.upgrade() else { return };
                    let minute = hub.clock.now().timestamp_millis().div_euclid(MINUTE_MS) * MINUTE_MS;
                    hub.flush(None, Some(minute)).await;
                }
                _ = retention.tick() => {
                    let Some(hub) = hub.upgrade() else { return };
                    match hub.apply_retention().await {
                        Ok(deleted) if deleted > 0 => tracing::info!(deleted, "old metric samples deleted"),
                        Ok(_) => {}
                        Err(error) => tracing::warn!(%error, "metrics retention failed"),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use sluice_core::clock::ManualClock;
    use sluice_store::SqliteStore;

    async fn hub() -> (Arc<MetricsHub>, Arc<ManualClock>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
        let store: Arc<dyn MetadataStore> = Arc::new(SqliteStore::open(&url).await.unwrap());
        let clock =
            Arc::new(ManualClock::new(chrono::Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 30).unwrap()));
        (Arc::new(MetricsHub::new(store, clock.clone())), clock, dir)
    }

    fn batch(received: u64, sent: u64, age: Option<i64>) -> BatchMetrics {
        BatchMetrics {
            received,
            sent,
            sink_writes: 1,
            total_latency_ms: Some(5.0),
            data_age_ms: age,
            ..BatchMetrics::default()
        }
    }

    #[tokio::test]
    async fn reads_see_every_minute_once_whether_written_or_pending() {
        let (hub, clock, _dir) = hub().await;
        let metrics = hub.pipeline("p1");
        let t0 = clock.now().timestamp_millis().div_euclid(MINUTE_MS) * MINUTE_MS;
        metrics.record(batch(10, 4, Some(100)));
        clock.advance(chrono::Duration::minutes(1));
        metrics.record(batch(5, 5, None));
        let all = |samples: &[(i64, MetricSample)]| -> (u64, u64, usize) {
            let received = samples.iter().map(|(_, s)| s.received).sum();
            let sent = samples.iter().map(|(_, s)| s.sent).sum();
            (received, sent, samples.len())
        };
        let before = hub.samples("p1", 0, i64::MAX).await.unwrap();
        assert_eq!(all(&before), (15, 9, 2));
        // The background flush writes finished minutes only.
        hub.flush(None, Some(t0 + MINUTE_MS)).await;
        assert_eq!(hub.store.metric_samples("p1", 0, i64::MAX).await.unwrap().len(), 1);
        assert_eq!(hub.samples("p1", 0, i64::MAX).await.unwrap(), before);
        // A stop writes the rest; more of the same minute merges with it.
        hub.flush(Some("p1"), None).await;
        metrics.record(batch(1, 0, None));
        let after = hub.samples("p1", 0, i64::MAX).await.unwrap();
        assert_eq!(all(&after), (16, 9, 2));
        assert_eq!(after[0].1.data_age_ms, Some(100));
        assert_eq!(after[1].1.total_latency.count, 2);
        let totals = metrics.totals();
        assert_eq!((totals.received, totals.sent, totals.data_age_ms), (16, 9, Some(100)));
        // Retention removes what is older than 8 days.
        clock.advance(chrono::Duration::days(8));
        assert_eq!(hub.apply_retention().await.unwrap(), 2);
        hub.forget("p1").await.unwrap();
        assert!(hub.samples("p1", 0, i64::MAX).await.unwrap().is_empty());
        assert!(hub.totals().is_empty());
    }
}
