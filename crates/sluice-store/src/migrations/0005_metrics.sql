-- Deployment metrics (docs/contract.md §Deployment metrics): one row per pipeline and minute
-- that the runtime flushed; a minute flushed twice (a pause in the middle of it) has two
-- rows, which readers add up. Times are unix milliseconds. Latency histograms are JSON
-- (`{"counts": [...], "count": n, "sum_ms": x}` over fixed bucket bounds, see
-- `sluice_store::metrics::LATENCY_BOUNDS_MS`). No foreign key: rows of a deleted pipeline are
-- deleted with it or by the retention job.
CREATE TABLE metric_samples (
    pipeline_id TEXT NOT NULL,
    minute_ms BIGINT NOT NULL,
    received BIGINT NOT NULL,
    sent BIGINT NOT NULL,
    processor_errors BIGINT NOT NULL,
    output_errors BIGINT NOT NULL,
    sink_writes BIGINT NOT NULL,
    total_latency TEXT NOT NULL,
    processing_latency TEXT NOT NULL,
    data_age_ms BIGINT,
    data_age_at_ms BIGINT
);

CREATE INDEX metric_samples_by_pipeline ON metric_samples (pipeline_id, minute_ms);
CREATE INDEX metric_samples_by_minute ON metric_samples (minute_ms);
