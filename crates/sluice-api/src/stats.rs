//! Worker health (`GET …/deploy/stats`), deployment metrics (`GET …/deploy/metrics`) and the
//! Prometheus exposition (`GET /metrics`). Semantics and choices: `docs/metrics.md`.

use std::collections::HashSet;
use std::fmt::Write as _;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::IntoResponse;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use sluice_core::deployment::DeploymentState;
use sluice_core::permission::Permission;

use sluice_runtime::WorkerStatus;
use sluice_store::MetricSample;
use sluice_store::metrics::{Histogram, LATENCY_BOUNDS_MS};
use utoipa::{IntoParams, ToSchema};

use crate::auth::{self, Caller};
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{PathParams, Query};
use crate::state::AppState;

/// One worker of a deployment.
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkerHealthItem {
    /// `<config_id>-worker-<index>`.
    pub name: String,
    /// `Running`, `Restarting` (waiting to start again after a failure) or
    /// `CrashLoopBackOff` (waiting, and crash-looping).
    pub status: String,
    /// Running and reading its partitions.
    pub is_ready: bool,
    /// Restarted 3 or more times within the last 5 minutes.
    pub is_crash_looping: bool,
    /// Its latest restart, within the last 5 minutes, was its script engine killed for memory.
    pub is_oom_killed: bool,
    /// Restarts (crashes and OOM kills) since the deployment started its workers.
    pub restart_count: u64,
    /// When the worker, or its latest restart, started (ISO 8601 UTC).
    pub start_time: String,
    /// Script engines of this worker killed for memory since the deployment started.
    pub oom_kill_count: u64,
    /// When it last restarted; null if never.
    pub last_restart_time: Option<String>,
    /// Why it last restarted, or, while blocked on its sink, the sink's error; null if
    /// neither.
    pub last_error: Option<String>,
    /// Its sink keeps failing its batch (`at_least_once`): it retries and holds the source.
    /// `status` is then `BlockedOnSink`.
    pub is_blocked_on_sink: bool,
    /// Since when it is blocked on its sink; null when it is not.
    pub blocked_since: Option<String>,
    /// The node it runs on, when several `sluice serve` nodes share the work; absent on a
    /// node of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// The `workers_health` object (docs/contract.md §Deployment worker health).
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkersHealth {
    pub total_workers: usize,
    /// Ready and not crash-looping.
    pub healthy_workers: usize,
    /// Not ready, or crash-looping (`total_workers - healthy_workers`).
    pub unhealthy_workers: usize,
    pub crashing_workers: usize,
    pub oom_killed_workers: usize,
    pub workers: Vec<WorkerHealthItem>,
}

/// Where a pipeline is in its deployment lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeploymentStatus {
    /// Workers run (or are being restarted).
    Deployed,
    /// Workers are stopped; offsets, sinks and topics are kept.
    Paused,
    /// Never deployed, or torn down.
    NotDeployed,
}

/// `{"workers_health": {...}}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatsBody {
    pub workers_health: WorkersHealth,
    /// (ours) `deployed`, `paused` or `not_deployed`.
    pub status: DeploymentStatus,
    /// (ours) When the pipeline was deployed: kept through pauses, resumes and redeploys,
    /// reset by a teardown; null when it is not deployed (ISO 8601 UTC).
    #[schema(format = DateTime)]
    pub deployed_at: Option<String>,
    /// Uids of sinks that use an organization secret changed or deleted since the workers
    /// started: they keep the old value until the pipeline is redeployed.
    pub stale_sinks: Vec<String>,
}

impl WorkersHealth {
    fn from_statuses(statuses: Vec<WorkerStatus>) -> Self {
        let healthy = statuses.iter().filter(|w| w.is_ready && !w.is_crash_looping).count();
        Self {
            total_workers: statuses.len(),
            healthy_workers: healthy,
            unhealthy_workers: statuses.len() - healthy,
            crashing_workers: statuses.iter().filter(|w| w.is_crash_looping).count(),
            oom_killed_workers: statuses.iter().filter(|w| w.is_oom_killed).count(),
            workers: statuses
                .into_iter()
                .map(|w| WorkerHealthItem {
                    name: w.name,
                    status: w.status,
                    node: w.node,
                    is_ready: w.is_ready,
                    is_crash_looping: w.is_crash_looping,
                    is_oom_killed: w.is_oom_killed,
                    restart_count: w.restart_count,
                    start_time: sluice_core::time::format(w.start_time),
                    oom_kill_count: w.oom_kill_count,
                    last_restart_time: w.last_restart_time.map(sluice_core::time::format),
                    last_error: w.last_error,
                    is_blocked_on_sink: w.is_blocked_on_sink,
                    blocked_since: w.blocked_since.map(sluice_core::time::format),
                })
                .collect(),
        }
    }
}

/// Health of the pipeline's workers (read permission). A pipeline that is not deployed, or
/// is paused, has no workers: every count is 0.
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/deploy/stats", tag = "deployments",
    params(("config_id" = String, Path, description = "Pipeline id")),
    responses(
        (status = 200, description = "Worker health", body = StatsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such pipeline", body = ErrorBody),
        (status = 503, description = "This process runs no pipelines", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn deploy_stats(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<StatsBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    caller.pipeline(&state, &config_id, Permission::Read).await?;
    query.expect_none()?;
    let runtime = state.runtime()?;
    let deployment = state.store.deployment(&config_id).await?;
    let statuses = runtime.worker_health(&config_id).await;
    let stale_sinks = runtime.stale_sinks(&config_id).await?;
    let status = match deployment.as_ref().map(|record| record.state) {
        Some(DeploymentState::Deployed) => DeploymentStatus::Deployed,
        Some(DeploymentState::Paused) => DeploymentStatus::Paused,
        None => DeploymentStatus::NotDeployed,
    };
    Ok(Json(StatsBody {
        workers_health: WorkersHealth::from_statuses(statuses),
        status,
        deployed_at: deployment.map(|record| sluice_core::time::format(record.deployed_at)),
        stale_sinks,
    }))
}

/// The seven metric types (docs/contract.md §Deployment metrics), in response order.
pub const METRIC_TYPES: [&str; 7] = [
    "messages_received",
    "messages_sent",
    "total_latency",
    "processing_latency",
    "processor_error",
    "output_error",
    "data_age",
];

/// The time ranges of the metrics endpoint.
pub const TIME_RANGES: [&str; 3] = ["1h", "1d", "1w"];

/// Query of `GET …/deploy/metrics`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MetricsQuery {
    /// `1h` (60 one-minute points), `1d` (96 fifteen-minute points) or `1w` (168 one-hour
    /// points); default `1h`.
    pub time_range: Option<String>,
    /// `true` returns one summary, `false` (default) time-series points.
    pub aggregated: Option<String>,
    /// Comma-separated metric types (default all): `messages_received`, `messages_sent`,
    /// `total_latency`, `processing_latency`, `processor_error`, `output_error`, `data_age`.
    pub metrics: Option<String>,
}

/// A time range of the metrics endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    name: &'static str,
    /// Width of a point.
    step: Duration,
    /// Points in the range.
    points: i64,
}

impl Range {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "1h" => Some(Self { name: "1h", step: Duration::minutes(1), points: 60 }),
            "1d" => Some(Self { name: "1d", step: Duration::minutes(15), points: 96 }),
            "1w" => Some(Self { name: "1w", step: Duration::hours(1), points: 168 }),
            _ => None,
        }
    }

    fn minutes(self) -> f64 {
        (self.step.num_minutes() * self.points) as f64
    }

    /// Start (unix ms) of the first point and the end of the last one, the last point being
    /// the one `now` falls in.
    fn bounds(self, now: DateTime<Utc>) -> (i64, i64) {
        let step = self.step.num_milliseconds();
        let last = now.timestamp_millis().div_euclid(step) * step;
        (last - (self.points - 1) * step, last + step)
    }
}

struct Checked {
    range: Range,
    aggregated: bool,
    metrics: Vec<&'static str>,
}

fn check(query: &Query) -> Result<Checked, ApiError> {
    let mut params = query.parse()?;
    let range = params.one_of("time_range", &TIME_RANGES).unwrap_or("1h");
    let aggregated = params.bool("aggregated").unwrap_or(false);
    let mut metrics = Vec::new();
    match params.raw("metrics").map(str::to_owned) {
        None => metrics.extend(METRIC_TYPES),
        Some(list) => {
            for name in list.split(',').map(str::trim) {
                match METRIC_TYPES.iter().find(|known| **known == name) {
                    Some(known) if !metrics.contains(known) => metrics.push(*known),
                    Some(_) => {}
                    None => params.reject(
                        "metrics",
                        "enum",
                        format!(
                            "unknown metric type '{name}'; expected a comma-separated list of {}",
                            METRIC_TYPES.join(", ")
                        ),
                    ),
                }
            }
        }
    }
    params.finish()?;
    let range = Range::parse(range)
        .ok_or_else(|| ApiError::Internal(format!("time range {range} has no definition")))?;
    Ok(Checked { range, aggregated, metrics })
}

/// One point of a series.
#[derive(Debug, Serialize, ToSchema)]
pub struct MetricPoint {
    /// Start of the point's interval (ISO 8601 UTC).
    pub timestamp: String,
    pub value: f64,
}

/// One metric type's series.
#[derive(Debug, Serialize, ToSchema)]
pub struct MetricSeries {
    pub metric_type: String,
    pub points: Vec<MetricPoint>,
}

/// `aggregated=false`: a series per metric type.
#[derive(Debug, Serialize, ToSchema)]
pub struct MetricsBody {
    pub config_id: String,
    pub metrics: Vec<MetricSeries>,
}

/// Latency percentiles in milliseconds; null without a batch in the range.
#[derive(Debug, Serialize, ToSchema)]
pub struct LatencySummary {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    /// Always `ms`.
    pub unit: &'static str,
}

/// Latency of one processing path.
#[derive(Debug, Serialize, ToSchema)]
pub struct PathLatency {
    /// `transforms`: the pipeline's whole transform chain.
    pub path: String,
    pub latency: LatencySummary,
}

/// Counts over the whole range.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct MetricTotals {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages_received: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages_sent: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processor_error: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_error: Option<u64>,
}

/// `aggregated=true` (docs/metrics.md §`aggregated=true`). Fields of metric types not asked
/// for are left out.
#[derive(Debug, Serialize, ToSchema)]
pub struct AggregatedMetricsBody {
    /// The config id.
    pub pipeline_id: String,
    /// Echo of the query.
    pub time_range: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages_received_per_min: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages_sent_per_min: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_latency: Option<LatencySummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processing_latency: Option<Vec<PathLatency>>,
    /// Records a transform failed on / records received (0 when none was received).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processor_error_rate: Option<f64>,
    /// Failed sink writes / sink writes (0 when none was attempted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_error_rate: Option<f64>,
    /// The `data_age` metric: how old the newest delivered record was, by its block time, at the
    /// latest delivery in the range; null when nothing with a block time was delivered.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<i64>)]
    pub data_age_ms: Option<Option<i64>>,
    /// The same value under the hosted service's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<i64>)]
    pub data_freshness_ms: Option<Option<i64>>,
    /// Counts over the range, of the count metric types asked for.
    pub totals: MetricTotals,
}

/// A response of the metrics endpoint.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum MetricsResponse {
    Series(MetricsBody),
    Aggregated(Box<AggregatedMetricsBody>),
}

/// Metrics of the pipeline's workers (read permission), kept across restarts, from the
/// point the clock is in back over the range. Counts are per point; latencies are the mean
/// in milliseconds of the batches of the point (points without a batch are left out); data
/// age is in milliseconds.
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/deploy/metrics", tag = "deployments",
    params(("config_id" = String, Path, description = "Pipeline id"), MetricsQuery),
    responses(
        (status = 200, description = "Time series, or with `aggregated=true` one summary", body = MetricsResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such pipeline", body = ErrorBody),
        (status = 422, description = "Bad query parameter", body = ValidationErrorBody),
        (status = 503, description = "This process runs no pipelines", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn deploy_metrics(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    query: Query,
) -> Result<Json<MetricsResponse>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    caller.pipeline(&state, &config_id, Permission::Read).await?;
    let checked = check(&query)?;
    let runtime = state.runtime()?;
    let (from, until) = checked.range.bounds(state.clock.now());
    let samples = runtime.metrics().samples(&config_id, from, until).await?;
    if checked.aggregated {
        return Ok(Json(MetricsResponse::Aggregated(Box::new(aggregate(
            config_id,
            checked.range,
            &checked.metrics,
            &samples,
        )))));
    }
    // Merge the minutes into the range's points.
    let step = checked.range.step.num_milliseconds();
    let mut points: Vec<MetricSample> =
        vec![MetricSample::default(); checked.range.points as usize];
    for (minute, sample) in &samples {
        if let Ok(index) = usize::try_from((minute - from) / step) {
            if let Some(point) = points.get_mut(index) {
                point.merge(sample);
            }
        }
    }
    let timestamp = |index: usize| {
        DateTime::from_timestamp_millis(from + index as i64 * step)
            .map(sluice_core::time::format)
            .unwrap_or_default()
    };
    let metrics = checked
        .metrics
        .iter()
        .map(|metric_type| {
            let value = |point: &MetricSample| -> Option<f64> {
                match *metric_type {
                    "messages_received" => Some(point.received as f64),
                    "messages_sent" => Some(point.sent as f64),
                    "processor_error" => Some(point.processor_errors as f64),
                    "output_error" => Some(point.output_errors as f64),
                    "total_latency" => point.total_latency.mean_ms(),
                    "processing_latency" => point.processing_latency.mean_ms(),
                    _ => point.data_age_ms.map(|ms| ms as f64),
                }
            };
            MetricSeries {
                metric_type: (*metric_type).to_owned(),
                points: points
                    .iter()
                    .enumerate()
                    .filter_map(|(index, point)| {
                        value(point).map(|value| MetricPoint { timestamp: timestamp(index), value })
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(Json(MetricsResponse::Series(MetricsBody { config_id, metrics })))
}

fn summary(histogram: &Histogram) -> LatencySummary {
    LatencySummary {
        p50: histogram.quantile_ms(0.5),
        p90: histogram.quantile_ms(0.9),
        p99: histogram.quantile_ms(0.99),
        unit: "ms",
    }
}

fn aggregate(
    config_id: String,
    range: Range,
    metrics: &[&str],
    samples: &[(i64, MetricSample)],
) -> AggregatedMetricsBody {
    let mut all = MetricSample::default();
    for (_, sample) in samples {
        all.merge(sample);
    }
    let wants = |name: &str| metrics.contains(&name);
    let ratio = |part: u64, whole: u64| if whole == 0 { 0.0 } else { part as f64 / whole as f64 };
    AggregatedMetricsBody {
        pipeline_id: config_id,
        time_range: range.name.to_owned(),
        messages_received_per_min: wants("messages_received")
            .then(|| all.received as f64 / range.minutes()),
        messages_sent_per_min: wants("messages_sent").then(|| all.sent as f64 / range.minutes()),
        total_latency: wants("total_latency").then(|| summary(&all.total_latency)),
        processing_latency: wants("processing_latency").then(|| {
            vec![PathLatency {
                path: "transforms".to_owned(),
                latency: summary(&all.processing_latency),
            }]
        }),
        processor_error_rate: wants("processor_error")
            .then(|| ratio(all.processor_errors, all.received)),
        output_error_rate: wants("output_error").then(|| ratio(all.output_errors, all.sink_writes)),
        data_age_ms: wants("data_age").then_some(all.data_age_ms),
        data_freshness_ms: wants("data_age").then_some(all.data_age_ms),
        totals: MetricTotals {
            messages_received: wants("messages_received").then_some(all.received),
            messages_sent: wants("messages_sent").then_some(all.sent),
            processor_error: wants("processor_error").then_some(all.processor_errors),
            output_error: wants("output_error").then_some(all.output_errors),
        },
    }
}

/// Prometheus text exposition: per pipeline that ran in this process since it started
/// (label `config_id`), the counters, the latency histograms in seconds and the latest data
/// age; per running deployment, its workers by health. `Authorization: Bearer <token>` with
/// the server's metrics token, or an operator's API key, shows every pipeline; any other API
/// key shows only the pipelines it may read (so labels never reveal another tenant's
/// pipelines); no key and no token is 401.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain", body = String),
        (status = 401, description = "Missing or unknown API key or metrics token", body = ErrorBody),
    ),
    security(("api_key" = []), ("metrics_token" = []))
)]
pub async fn prometheus(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Query,
) -> Result<impl IntoResponse, ApiError> {
    let visible = metrics_scope(&state, &headers).await?;
    query.expect_none()?;
    Ok((
        [(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)],
        exposition(&state, visible.as_ref()).await,
    ))
}

/// The content type of the Prometheus text format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The Prometheus text of the pipelines in `visible` (`None`: every pipeline).
pub async fn exposition(state: &AppState, visible: Option<&HashSet<String>>) -> String {
    let shown = |id: &str| visible.is_none_or(|ids| ids.contains(id));
    let mut out = String::new();
    if let Some(runtime) = state.runtime.as_ref() {
        let mut totals = runtime.metrics().totals();
        totals.retain(|(id, _)| shown(id));
        write_counters(&mut out, &totals);
        write_latencies(&mut out, &totals);
        write_data_ages(&mut out, &totals);
        let mut health = runtime.all_worker_health().await;
        health.retain(|(id, _)| shown(id));
        write_workers(&mut out, &health);
    }
    // Chain ingesters are the server's, not a tenant's: every caller sees them.
    if let Some(chains) = state.chains.as_ref() {
        out.push_str(&chains.metrics_text());
    }
    out
}

/// The pipelines' counters (`…_total`).
fn write_counters(out: &mut String, totals: &[(String, sluice_runtime::metrics::Totals)]) {
    let counters: [(&str, &str, CountOf); 4] = [
        ("messages_received", "Records read from the source.", |t| t.received),
        ("messages_sent", "Records delivered to the sink.", |t| t.sent),
        ("processor_errors", "Records a transform failed on (dead-lettered).", |t| {
            t.processor_errors
        }),
        ("output_errors", "Failed sink writes.", |t| t.output_errors),
    ];
    for (name, help, get) in counters {
        let _ = writeln!(out, "# HELP sluice_pipeline_{name}_total {help}");
        let _ = writeln!(out, "# TYPE sluice_pipeline_{name}_total counter");
        for (id, t) in totals {
            let _ = writeln!(
                out,
                "sluice_pipeline_{name}_total{{config_id=\"{}\"}} {}",
                escape(id),
                get(t)
            );
        }
    }
}

/// The latency histograms (`…_seconds`).
fn write_latencies(out: &mut String, totals: &[(String, sluice_runtime::metrics::Totals)]) {
    let histograms: [(&str, &str, HistogramOf); 2] = [
        (
            "total_latency",
            "Per delivered batch: delivery time minus the source append time of its oldest record.",
            |t| &t.total_latency,
        ),
        ("processing_latency", "Per batch: time in the transforms.", |t| &t.processing_latency),
    ];
    for (name, help, get) in histograms {
        let metric = format!("sluice_pipeline_{name}_seconds");
        let _ = writeln!(out, "# HELP {metric} {help}");
        let _ = writeln!(out, "# TYPE {metric} histogram");
        for (id, t) in totals {
            let histogram = get(t);
            let id = escape(id);
            let mut cumulative = 0;
            for (bound, count) in LATENCY_BOUNDS_MS.iter().zip(histogram.counts.iter()) {
                cumulative += count;
                let le = bound / 1000.0;
                let _ =
                    writeln!(out, "{metric}_bucket{{config_id=\"{id}\",le=\"{le}\"}} {cumulative}");
            }
            let _ = writeln!(
                out,
                "{metric}_bucket{{config_id=\"{id}\",le=\"+Inf\"}} {}",
                histogram.count
            );
            let _ =
                writeln!(out, "{metric}_sum{{config_id=\"{id}\"}} {}", histogram.sum_ms / 1000.0);
            let _ = writeln!(out, "{metric}_count{{config_id=\"{id}\"}} {}", histogram.count);
        }
    }
}

/// The age of each pipeline's newest delivered record.
fn write_data_ages(out: &mut String, totals: &[(String, sluice_runtime::metrics::Totals)]) {
    let _ = writeln!(
        out,
        "# HELP sluice_pipeline_data_age_seconds Age of the newest delivered record by its block time, at the latest delivery."
    );
    let _ = writeln!(out, "# TYPE sluice_pipeline_data_age_seconds gauge");
    for (id, t) in totals {
        if let Some(ms) = t.data_age_ms {
            let _ = writeln!(
                out,
                "sluice_pipeline_data_age_seconds{{config_id=\"{}\"}} {}",
                escape(id),
                ms as f64 / 1000.0
            );
        }
    }
}

/// The workers of running deployments by health, and their restarts.
fn write_workers(out: &mut String, health: &[(String, Vec<sluice_runtime::WorkerStatus>)]) {
    let _ = writeln!(
        out,
        "# HELP sluice_pipeline_workers Workers of running deployments, by health (a worker may count in several)."
    );
    let _ = writeln!(out, "# TYPE sluice_pipeline_workers gauge");
    for (id, statuses) in health {
        let workers = WorkersHealth::from_statuses(statuses.clone());
        let id = escape(id);
        for (kind, n) in [
            ("total", workers.total_workers),
            ("healthy", workers.healthy_workers),
            ("unhealthy", workers.unhealthy_workers),
            ("crashing", workers.crashing_workers),
            ("oom_killed", workers.oom_killed_workers),
            ("blocked_on_sink", statuses.iter().filter(|w| w.is_blocked_on_sink).count()),
        ] {
            let _ = writeln!(
                out,
                "sluice_pipeline_workers{{config_id=\"{id}\",health=\"{kind}\"}} {n}"
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP sluice_pipeline_worker_restarts Restarts of running deployments' workers since they started."
    );
    let _ = writeln!(out, "# TYPE sluice_pipeline_worker_restarts gauge");
    for (id, statuses) in health {
        let restarts: u64 = statuses.iter().map(|w| w.restart_count).sum();
        let _ = writeln!(
            out,
            "sluice_pipeline_worker_restarts{{config_id=\"{}\"}} {restarts}",
            escape(id)
        );
    }
}

/// The pipelines a `/metrics` request may see: `None` for all (the metrics token or an
/// operator's key), else the ids the key's user may read.
async fn metrics_scope(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<HashSet<String>>, ApiError> {
    if let Some(token) = state.metrics_token.as_deref()
        && auth::bearer_matches(headers, token)
    {
        return Ok(None);
    }
    if headers.get(auth::API_KEY_HEADER).is_none() && headers.contains_key(header::AUTHORIZATION) {
        return Err(ApiError::Unauthorized("Invalid metrics token"));
    }
    let caller = auth::authenticate(headers, state).await?;
    if caller.is_operator {
        return Ok(None);
    }
    if !caller.flags.pipelines {
        return Ok(Some(HashSet::new()));
    }
    let readable = state.store.list_readable_pipelines(&caller).await?;
    Ok(Some(readable.into_iter().map(|pipeline| pipeline.id).collect()))
}

type CountOf = fn(&sluice_runtime::metrics::Totals) -> u64;
type HistogramOf = fn(&sluice_runtime::metrics::Totals) -> &Histogram;

/// A label value as the text format wants it.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_range_ends_with_the_point_now_falls_in() {
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 12, 34, 56).unwrap();
        let minute = 60_000;
        let (from, until) = Range::parse("1h").unwrap().bounds(now);
        let last = Utc.with_ymd_and_hms(2026, 1, 1, 12, 34, 0).unwrap().timestamp_millis();
        assert_eq!((until - from) / minute, 60);
        assert_eq!(until, last + minute);
        let (from, until) = Range::parse("1d").unwrap().bounds(now);
        assert_eq!((until - from) / minute, 96 * 15);
        assert_eq!(until, Utc.with_ymd_and_hms(2026, 1, 1, 12, 45, 0).unwrap().timestamp_millis());
        let (from, until) = Range::parse("1w").unwrap().bounds(now);
        assert_eq!((until - from) / minute, 168 * 60);
        assert_eq!(from % (60 * minute), 0);
        assert!(Range::parse("2h").is_none());
    }
}
