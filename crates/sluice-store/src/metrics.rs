//! Deployment metrics (docs/contract.md §Deployment metrics): what a pipeline's workers
//! counted, one [`MetricSample`] per pipeline and minute, kept so the history survives
//! restarts.
//!
//! [`MetricsStore`] is the role; [`MetadataStore`](crate::MetadataStore) includes it. Both
//! backends run the same portable SQL, written once for any [`Dialect`](crate::Dialect). A
//! minute may be stored in more than one row (the runtime flushes what it has when a
//! deployment stops mid-minute); readers [`MetricSample::merge`] them.

use async_trait::async_trait;
use serde_json::{Value, json};

use sqlx::Row as _;

use crate::dialect::{Row, StoreBackend};
use crate::{Result, Store, StoreError};

/// Upper bounds (inclusive, milliseconds) of the latency histogram buckets; one more bucket
/// counts everything above the last bound.
pub const LATENCY_BOUNDS_MS: [f64; 16] = [
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1_000.0, 2_500.0, 5_000.0, 10_000.0,
    30_000.0, 60_000.0, 300_000.0,
];

/// A latency histogram over [`LATENCY_BOUNDS_MS`].
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Observations per bucket; `counts[LATENCY_BOUNDS_MS.len()]` is the overflow bucket.
    pub counts: [u64; LATENCY_BOUNDS_MS.len() + 1],
    pub count: u64,
    pub sum_ms: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { counts: [0; LATENCY_BOUNDS_MS.len() + 1], count: 0, sum_ms: 0.0 }
    }
}

impl Histogram {
    /// Counts one observation of `ms` milliseconds (negative values count as 0).
    pub fn observe(&mut self, ms: f64) {
        let ms = if ms.is_finite() { ms.max(0.0) } else { 0.0 };
        let bucket = LATENCY_BOUNDS_MS
            .iter()
            .position(|bound| ms <= *bound)
            .unwrap_or(LATENCY_BOUNDS_MS.len());
        self.counts[bucket] += 1;
        self.count += 1;
        self.sum_ms += ms;
    }

    pub fn merge(&mut self, other: &Self) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum_ms += other.sum_ms;
    }

    /// The mean in milliseconds; `None` without observations.
    pub fn mean_ms(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ms / self.count as f64)
    }

    /// The `q` quantile (0..=1) in milliseconds, interpolated linearly inside its bucket
    /// (the overflow bucket answers its lower bound); `None` without observations.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * self.count as f64).max(1.0);
        let mut below = 0u64;
        for (index, &count) in self.counts.iter().enumerate() {
            if count == 0 {
                continue;
            }
            if (below + count) as f64 >= rank {
                let lower = if index == 0 { 0.0 } else { LATENCY_BOUNDS_MS[index - 1] };
                let Some(&upper) = LATENCY_BOUNDS_MS.get(index) else { return Some(lower) };
                let within = (rank - below as f64) / count as f64;
                return Some(lower + (upper - lower) * within);
            }
            below += count;
        }
        LATENCY_BOUNDS_MS.last().copied()
    }

    fn to_json(&self) -> String {
        json!({"counts": self.counts.to_vec(), "count": self.count, "sum_ms": self.sum_ms})
            .to_string()
    }

    fn from_json(text: &str) -> Result<Self> {
        let corrupt = |detail: String| StoreError::Corrupt { what: "latency histogram", detail };
        let value: Value = serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
        let mut histogram = Self::default();
        let counts = value["counts"].as_array().ok_or_else(|| corrupt(text.to_owned()))?;
        if counts.len() != histogram.counts.len() {
            return Err(corrupt(format!("{} buckets", counts.len())));
        }
        for (slot, count) in histogram.counts.iter_mut().zip(counts) {
            *slot = count.as_u64().ok_or_else(|| corrupt(text.to_owned()))?;
        }
        histogram.count = value["count"].as_u64().ok_or_else(|| corrupt(text.to_owned()))?;
        histogram.sum_ms = value["sum_ms"].as_f64().ok_or_else(|| corrupt(text.to_owned()))?;
        Ok(histogram)
    }
}

/// What a pipeline's workers did in one minute.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricSample {
    /// Records read from the source.
    pub received: u64,
    /// Records delivered to the sink.
    pub sent: u64,
    /// Records a transform failed on (dead-lettered).
    pub processor_errors: u64,
    /// Failed sink writes.
    pub output_errors: u64,
    /// Sink writes attempted (successful and failed), the base of the output error rate.
    pub sink_writes: u64,
    /// Per delivered batch: delivery time minus the time its oldest record was appended to
    /// the source stream.
    pub total_latency: Histogram,
    /// Per batch: time spent in the transforms.
    pub processing_latency: Histogram,
    /// Age of the newest delivered record (by its block time) at its delivery, as of the last
    /// delivery in the minute.
    pub data_age_ms: Option<i64>,
    /// When that delivery happened (unix ms), to pick the latest when merging.
    pub data_age_at_ms: Option<i64>,
}

impl MetricSample {
    /// Adds `other` to this sample; the data age is the later observation of the two.
    pub fn merge(&mut self, other: &Self) {
        self.received += other.received;
        self.sent += other.sent;
        self.processor_errors += other.processor_errors;
        self.output_errors += other.output_errors;
        self.sink_writes += other.sink_writes;
        self.total_latency.merge(&other.total_latency);
        self.processing_latency.merge(&other.processing_latency);
        if other.data_age_at_ms.is_some() && other.data_age_at_ms >= self.data_age_at_ms {
            self.data_age_ms = other.data_age_ms;
            self.data_age_at_ms = other.data_age_at_ms;
        }
    }

    /// Notes a data age of `age_ms` observed at `at_ms`, unless a later one is known.
    pub fn observe_data_age(&mut self, age_ms: i64, at_ms: i64) {
        if self.data_age_at_ms.is_none_or(|known| at_ms >= known) {
            self.data_age_ms = Some(age_ms);
            self.data_age_at_ms = Some(at_ms);
        }
    }
}

/// Durable metric samples. Every method is one transaction.
#[async_trait]
pub trait MetricsStore: Send + Sync + 'static {
    /// Stores samples of `pipeline_id`, each with the start of its minute (unix ms). A minute
    /// already stored gets another row; readers merge them.
    ///
    /// # Errors
    /// A database failure; nothing is stored then.
    async fn append_metric_samples(
        &self,
        pipeline_id: &str,
        samples: &[(i64, MetricSample)],
    ) -> Result<()>;

    /// The stored samples of `pipeline_id` whose minute starts in `from_ms..until_ms`, by
    /// minute (rows of one minute merged).
    ///
    /// # Errors
    /// A database failure, or a row that cannot be read.
    async fn metric_samples(
        &self,
        pipeline_id: &str,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<(i64, MetricSample)>>;

    /// Deletes every sample of every pipeline whose minute starts before `before_ms` (the
    /// retention job); returns the rows deleted.
    ///
    /// # Errors
    /// A database failure.
    async fn delete_metric_samples_before(&self, before_ms: i64) -> Result<u64>;

    /// Deletes every sample of `pipeline_id`; returns the rows deleted.
    ///
    /// # Errors
    /// A database failure.
    async fn delete_pipeline_metrics(&self, pipeline_id: &str) -> Result<u64>;
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(what: &'static str, n: i64) -> Result<u64> {
    u64::try_from(n).map_err(|_| StoreError::Corrupt { what, detail: n.to_string() })
}

fn sample_row<D: StoreBackend>(row: &Row<D>) -> Result<(i64, MetricSample)> {
    let total: String = row.try_get("total_latency")?;
    let processing: String = row.try_get("processing_latency")?;
    Ok((
        row.try_get("minute_ms")?,
        MetricSample {
            received: to_u64("received", row.try_get("received")?)?,
            sent: to_u64("sent", row.try_get("sent")?)?,
            processor_errors: to_u64("processor_errors", row.try_get("processor_errors")?)?,
            output_errors: to_u64("output_errors", row.try_get("output_errors")?)?,
            sink_writes: to_u64("sink_writes", row.try_get("sink_writes")?)?,
            total_latency: Histogram::from_json(&total)?,
            processing_latency: Histogram::from_json(&processing)?,
            data_age_ms: row.try_get("data_age_ms")?,
            data_age_at_ms: row.try_get("data_age_at_ms")?,
        },
    ))
}

#[async_trait]
impl<D: StoreBackend> MetricsStore for Store<D> {
    async fn append_metric_samples(
        &self,
        pipeline_id: &str,
        samples: &[(i64, MetricSample)],
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for (minute_ms, sample) in samples {
            sqlx::query(
                "INSERT INTO metric_samples (pipeline_id, minute_ms, received, sent, \
                 processor_errors, output_errors, sink_writes, total_latency, \
                 processing_latency, data_age_ms, data_age_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(pipeline_id)
            .bind(*minute_ms)
            .bind(to_i64(sample.received))
            .bind(to_i64(sample.sent))
            .bind(to_i64(sample.processor_errors))
            .bind(to_i64(sample.output_errors))
            .bind(to_i64(sample.sink_writes))
            .bind(sample.total_latency.to_json())
            .bind(sample.processing_latency.to_json())
            .bind(sample.data_age_ms)
            .bind(sample.data_age_at_ms)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn metric_samples(
        &self,
        pipeline_id: &str,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<(i64, MetricSample)>> {
        let rows = sqlx::query(
            "SELECT minute_ms, received, sent, processor_errors, output_errors, \
             sink_writes, total_latency, processing_latency, data_age_ms, \
             data_age_at_ms FROM metric_samples \
             WHERE pipeline_id = $1 AND minute_ms >= $2 AND minute_ms < $3 \
             ORDER BY minute_ms",
        )
        .bind(pipeline_id)
        .bind(from_ms)
        .bind(until_ms)
        .fetch_all(&self.pool)
        .await?;
        let mut out: Vec<(i64, MetricSample)> = Vec::new();
        for row in &rows {
            let (minute, sample) = sample_row::<D>(row)?;
            match out.last_mut() {
                Some((last, merged)) if *last == minute => merged.merge(&sample),
                _ => out.push((minute, sample)),
            }
        }
        Ok(out)
    }

    async fn delete_metric_samples_before(&self, before_ms: i64) -> Result<u64> {
        Ok(sqlx::query("DELETE FROM metric_samples WHERE minute_ms < $1")
            .bind(before_ms)
            .execute(&self.pool)
            .await
            .map(|done| D::rows_affected(&done))?)
    }

    async fn delete_pipeline_metrics(&self, pipeline_id: &str) -> Result<u64> {
        Ok(sqlx::query("DELETE FROM metric_samples WHERE pipeline_id = $1")
            .bind(pipeline_id)
            .execute(&self.pool)
            .await
            .map(|done| D::rows_affected(&done))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_fall_in_the_bucket_of_their_rank() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile_ms(0.5), None);
        for ms in [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 700.0] {
            h.observe(ms);
        }
        let p50 = h.quantile_ms(0.5).unwrap();
        assert!((2.5..=5.0).contains(&p50), "{p50}");
        let p99 = h.quantile_ms(0.99).unwrap();
        assert!((500.0..=1000.0).contains(&p99), "{p99}");
        assert_eq!(h.mean_ms(), Some(72.7));
        let mut big = Histogram::default();
        big.observe(1e9);
        assert_eq!(big.quantile_ms(0.5), Some(300_000.0));
    }

    #[test]
    fn histograms_survive_json() {
        let mut h = Histogram::default();
        h.observe(0.5);
        h.observe(42.0);
        assert_eq!(Histogram::from_json(&h.to_json()).unwrap(), h);
        assert!(Histogram::from_json("{\"counts\": [1]}").is_err());
    }

    #[test]
    fn merging_adds_counts_and_keeps_the_later_data_age() {
        let mut a = MetricSample { received: 2, sent: 1, ..MetricSample::default() };
        a.observe_data_age(500, 10);
        let mut b = MetricSample { received: 3, processor_errors: 1, ..MetricSample::default() };
        b.observe_data_age(70, 20);
        a.merge(&b);
        assert_eq!((a.received, a.sent, a.processor_errors), (5, 1, 1));
        assert_eq!((a.data_age_ms, a.data_age_at_ms), (Some(70), Some(20)));
        a.merge(&MetricSample::default());
        assert_eq!(a.data_age_ms, Some(70));
    }
}
