//! Metric samples, run on a fresh SQLite file and in a fresh PostgreSQL schema of the server
//! `scripts/test` starts (`SLUICE_TEST_POSTGRES_URL`; the tests fail without it).

use std::sync::Arc;

use sluice_store::metrics::Histogram;
use sluice_store::{MetadataStore, MetricSample};

on_both_backends!(
    |store| Arc::new(store) as Arc<dyn MetadataStore>;
    samples_round_trip_exactly_and_rows_of_one_minute_merge,
    reads_are_per_pipeline_and_bounded_by_the_range,
    retention_and_pipeline_deletion_remove_only_their_rows,
);

const MINUTE: i64 = 60_000;
const T0: i64 = 1_790_000_000_000 / MINUTE * MINUTE;

fn sample(received: u64, latencies: &[f64], age: Option<(i64, i64)>) -> MetricSample {
    let mut total_latency = Histogram::default();
    let mut processing_latency = Histogram::default();
    for ms in latencies {
        total_latency.observe(*ms);
        processing_latency.observe(*ms / 2.0);
    }
    let mut sample = MetricSample {
        received,
        sent: received / 2,
        processor_errors: 1,
        output_errors: 2,
        sink_writes: 3,
        total_latency,
        processing_latency,
        ..MetricSample::default()
    };
    if let Some((age_ms, at_ms)) = age {
        sample.observe_data_age(age_ms, at_ms);
    }
    sample
}

async fn samples_round_trip_exactly_and_rows_of_one_minute_merge(store: Arc<dyn MetadataStore>) {
    let first = sample(10, &[0.5, 12.0, 70_000.0, 1e7], Some((1_500, T0 + 5_000)));
    let second = sample(4, &[3.0], None);
    store
        .append_metric_samples("p1", &[(T0, first.clone()), (T0 + MINUTE, second.clone())])
        .await
        .unwrap();
    let read = store.metric_samples("p1", T0, T0 + 10 * MINUTE).await.unwrap();
    assert_eq!(read, vec![(T0, first.clone()), (T0 + MINUTE, second.clone())]);
    // The same minute flushed again (a pause mid-minute): readers see one merged sample.
    let later = sample(6, &[40.0], Some((900, T0 + 50_000)));
    store.append_metric_samples("p1", &[(T0, later.clone())]).await.unwrap();
    let read = store.metric_samples("p1", T0, T0 + 10 * MINUTE).await.unwrap();
    let mut merged = first;
    merged.merge(&later);
    assert_eq!(read, vec![(T0, merged.clone()), (T0 + MINUTE, second)]);
    assert_eq!(merged.received, 16);
    assert_eq!(merged.total_latency.count, 5);
    assert_eq!(merged.data_age_ms, Some(900));
    // Nothing is half-written: an empty append stores nothing.
    store.append_metric_samples("p1", &[]).await.unwrap();
    assert_eq!(store.metric_samples("p1", T0, T0 + 10 * MINUTE).await.unwrap().len(), 2);
}

async fn reads_are_per_pipeline_and_bounded_by_the_range(store: Arc<dyn MetadataStore>) {
    let rows: Vec<(i64, MetricSample)> =
        (0..10).map(|i| (T0 + i * MINUTE, sample(i as u64 + 1, &[], None))).collect();
    store.append_metric_samples("p1", &rows).await.unwrap();
    store.append_metric_samples("p2", &[(T0, sample(99, &[], None))]).await.unwrap();
    let read = store.metric_samples("p1", T0 + 2 * MINUTE, T0 + 5 * MINUTE).await.unwrap();
    let minutes: Vec<i64> = read.iter().map(|(m, _)| (m - T0) / MINUTE).collect();
    assert_eq!(minutes, vec![2, 3, 4]);
    assert_eq!(read.iter().map(|(_, s)| s.received).sum::<u64>(), 3 + 4 + 5);
    let other = store.metric_samples("p2", T0, T0 + MINUTE).await.unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].1.received, 99);
    assert!(store.metric_samples("p3", T0, T0 + 100 * MINUTE).await.unwrap().is_empty());
}

async fn retention_and_pipeline_deletion_remove_only_their_rows(store: Arc<dyn MetadataStore>) {
    let rows: Vec<(i64, MetricSample)> =
        (0..5).map(|i| (T0 + i * MINUTE, sample(1, &[], None))).collect();
    store.append_metric_samples("p1", &rows).await.unwrap();
    store.append_metric_samples("p2", &rows).await.unwrap();
    assert_eq!(store.delete_metric_samples_before(T0 + 2 * MINUTE).await.unwrap(), 4);
    let left = store.metric_samples("p1", 0, i64::MAX).await.unwrap();
    assert_eq!(left.iter().map(|(m, _)| (m - T0) / MINUTE).collect::<Vec<_>>(), vec![2, 3, 4]);
    assert_eq!(store.delete_pipeline_metrics("p2").await.unwrap(), 3);
    assert!(store.metric_samples("p2", 0, i64::MAX).await.unwrap().is_empty());
    assert_eq!(store.metric_samples("p1", 0, i64::MAX).await.unwrap().len(), 3);
}
