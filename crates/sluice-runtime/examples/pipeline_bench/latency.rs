//! Phase b, latency: records appended at a steady rate, each stamped with its send time, and
//! the time each takes to reach the sink.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_bus::{StreamLog, topics};
use sluice_core::pipeline::Pipeline;
use sluice_core::streams::StreamRecord;
use sluice_runtime::Runtime;

use crate::records::Generator;
use crate::sinks::Receiver;
use crate::{Args, BoxError, CHAIN, ENTITY, LATENCY_TICK, SINK_NAME, report, round3};

/// Phase b: records appended at a steady rate; ingest-to-sink latency of each.
pub(crate) async fn latency(
    runtime: &Runtime,
    log: &Arc<dyn StreamLog>,
    pipeline: &Pipeline,
    generator: &mut Generator,
    args: &Args,
    receiver: Option<&Arc<Receiver>>,
) -> Result<(), BoxError> {
    runtime.deploy(pipeline).await?;
    let sink = topics::sink_topic(&pipeline.id, SINK_NAME);
    let total = (args.rate as f64 * args.seconds) as u64;
    let hit_rate = f64::from(args.match_percent) / 100.0;

    // The reader starts at the sink's current end before anything is sent; a webhook's
    // receiver starts from nothing.
    let (expected_tx, expected_rx) = tokio::sync::watch::channel(None::<u64>);
    let reader = match receiver {
        None => {
            let from = log.offsets(&sink).await?.first().map_or(0, |range| range.end);
            tokio::spawn(read_latencies(log.clone(), sink, from, expected_rx))
        }
        Some(receiver) => {
            receiver.latencies_us.lock().expect("not poisoned").clear();
            tokio::spawn(received_latencies(receiver.clone(), expected_rx))
        }
    };

    let start = Instant::now();
    let mut ticks = tokio::time::interval(LATENCY_TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent = 0u64;
    let mut hits = 0u64;
    let mut slowest_append = Duration::ZERO;
    while sent < total {
        ticks.tick().await;
        // Catches up after a slow append: the rate holds over the run.
        let due = ((start.elapsed().as_secs_f64() * args.rate as f64) as u64).min(total);
        if due <= sent {
            continue;
        }
        let sent_at_us = chrono::Utc::now().timestamp_micros();
        let batch: Vec<StreamRecord> = (sent..due)
            .map(|_| {
                let (record, hit) = generator.record(hit_rate, Some(sent_at_us));
                hits += u64::from(hit);
                record
            })
            .collect();
        let append_start = Instant::now();
        runtime.ingest(CHAIN, ENTITY, false, batch).await?;
        slowest_append = slowest_append.max(append_start.elapsed());
        sent = due;
    }
    let send_secs = start.elapsed().as_secs_f64();
    expected_tx.send_replace(Some(hits));
    let mut latencies = reader.await??;
    let received = latencies.len() as u64;
    if received != hits {
        return Err(format!("{received} records reached the sink, {hits} were expected").into());
    }
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        let rank = ((p / 100.0) * latencies.len() as f64).ceil() as usize;
        latencies
            .get(rank.clamp(1, latencies.len().max(1)) - 1)
            .map_or(f64::NAN, |us| *us as f64 / 1000.0)
    };
    let (p50, p90, p99, max) = (pct(50.0), pct(90.0), pct(99.0), pct(100.0));
    let achieved = sent as f64 / send_secs;
    report(
        serde_json::json!({
            "bench": "pipeline_latency",
            "sink": pipeline.pipeline_config.sinks[0].type_name(),
            "rate_target": args.rate,
            "rate_achieved": achieved.round(),
            "seconds": round3(send_secs),
            "records": sent,
            "match_percent": args.match_percent,
            "delivered": received,
            "tick_ms": LATENCY_TICK.as_millis(),
            "slowest_append_ms": round3(slowest_append.as_secs_f64() * 1000.0),
            "p50_ms": round3(p50),
            "p90_ms": round3(p90),
            "p99_ms": round3(p99),
            "max_ms": round3(max),
        }),
        &[
            format!(
                "latency: {sent} records at {achieved:.0}/s (target {}) for {send_secs:.1} s, \
                 {}% matching, appended every {} ms; {received} delivered",
                args.rate,
                args.match_percent,
                LATENCY_TICK.as_millis()
            ),
            format!(
                "  ingest-to-sink ms: p50 {p50:.2}, p90 {p90:.2}, p99 {p99:.2}, max {max:.2} \
                 (slowest append {:.2} ms)",
                slowest_append.as_secs_f64() * 1000.0
            ),
        ],
    );
    Ok(())
}

/// Long-polls the sink topic from `from`; returns now − `sent_at_us` of every record, in
/// microseconds, once it has seen as many as `expected` says (or 60 s after it was told).
async fn read_latencies(
    log: Arc<dyn StreamLog>,
    sink: String,
    mut from: u64,
    expected: tokio::sync::watch::Receiver<Option<u64>>,
) -> Result<Vec<i64>, BoxError> {
    let mut watch = log.watch(&sink);
    let mut latencies = Vec::new();
    let mut told_at: Option<Instant> = None;
    loop {
        let records = log.read(&sink, 0, from, 10_000).await?;
        let now_us = chrono::Utc::now().timestamp_micros();
        for record in &records {
            let sent_at = sent_at_us(&record.value).ok_or("a sink record has no sent_at_us")?;
            latencies.push(now_us - sent_at);
        }
        if let Some(last) = records.last() {
            from = last.offset + 1;
            continue;
        }
        if let Some(expected) = *expected.borrow() {
            let told = *told_at.get_or_insert_with(Instant::now);
            if latencies.len() as u64 >= expected || told.elapsed() > Duration::from_secs(60) {
                return Ok(latencies);
            }
        }
        watch.wait(Duration::from_millis(100)).await;
    }
}

/// The latencies the webhook receiver took, once it has as many as `expected` says (or 60 s
/// after it was told).
async fn received_latencies(
    receiver: Arc<Receiver>,
    mut expected: tokio::sync::watch::Receiver<Option<u64>>,
) -> Result<Vec<i64>, BoxError> {
    let want = loop {
        if let Some(want) = *expected.borrow_and_update() {
            break want;
        }
        expected.changed().await?;
    };
    let told = Instant::now();
    loop {
        let have = receiver.latencies_us.lock().expect("not poisoned").len() as u64;
        if have >= want || told.elapsed() > Duration::from_secs(60) {
            return Ok(std::mem::take(&mut *receiver.latencies_us.lock().expect("not poisoned")));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The `sent_at_us` number of a record, found without parsing the whole document.
pub(crate) fn sent_at_us(value: &[u8]) -> Option<i64> {
    const FIELD: &[u8] = b"\"sent_at_us\":";
    let at = value.windows(FIELD.len()).position(|window| window == FIELD)? + FIELD.len();
    let digits = value[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&value[at..at + digits]).ok()?.parse().ok()
}
