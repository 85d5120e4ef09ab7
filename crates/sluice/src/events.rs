//! Service events in `serve`: the `[events]` settings of the config file (each also an
//! environment variable `SLUICE_EVENTS_<NAME>`), and the task that samples the chain
//! ingesters' status for the chain watch.

use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use serde::Deserialize;
use sluice_api::chains::ChainStatusSource;
use sluice_runtime::events::chains::{ChainSample, ChainWatch};
use sluice_runtime::events::{EventSettings, Recorder};

/// The `[events]` table of the config file; every field optional (docs/events.md).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventFileSettings {
    retention_days: Option<u64>,
    sample_ms: Option<u64>,
    dead_letter_window_secs: Option<u64>,
    sink_failing_secs: Option<u64>,
    worker_stable_secs: Option<u64>,
    data_age_warning_secs: Option<u64>,
    chain_lag_secs: Option<u64>,
    chain_stall_secs: Option<u64>,
    notify_max_backoff_secs: Option<u64>,
}

/// One setting: `SLUICE_EVENTS_<NAME>` wins over the file, the file over the default.
fn setting(name: &str, file: Option<u64>, default: u64) -> anyhow::Result<u64> {
    let var = format!("SLUICE_EVENTS_{}", name.to_uppercase());
    let value = match std::env::var(&var) {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(n) => n,
            Err(_) => bail!("{var} must be a whole number, got '{text}'"),
        },
        Err(_) => file.unwrap_or(default),
    };
    if value == 0 {
        bail!("events.{name} must be at least 1");
    }
    Ok(value)
}

/// The event settings of `serve`.
///
/// # Errors
/// A value that is not a positive whole number.
pub fn resolve(file: &EventFileSettings) -> anyhow::Result<EventSettings> {
    let d = EventSettings::default();
    let secs = |name: &str, file: Option<u64>, default: Duration| {
        setting(name, file, default.as_secs()).map(Duration::from_secs)
    };
    let days = setting("retention_days", file.retention_days, 30)?;
    Ok(EventSettings {
        capacity: d.capacity,
        retention: Duration::from_secs(days * 24 * 3600),
        interval: Duration::from_millis(setting("sample_ms", file.sample_ms, 1000)?),
        dead_letter_window: secs(
            "dead_letter_window_secs",
            file.dead_letter_window_secs,
            d.dead_letter_window,
        )?,
        sink_failing_after: secs(
            "sink_failing_secs",
            file.sink_failing_secs,
            d.sink_failing_after,
        )?,
        worker_stable_after: secs(
            "worker_stable_secs",
            file.worker_stable_secs,
            d.worker_stable_after,
        )?,
        data_age_warning: secs(
            "data_age_warning_secs",
            file.data_age_warning_secs,
            d.data_age_warning,
        )?,
        chain_lag: secs("chain_lag_secs", file.chain_lag_secs, d.chain_lag)?,
        chain_stall: secs("chain_stall_secs", file.chain_stall_secs, d.chain_stall)?,
        notify_max_backoff: secs(
            "notify_max_backoff_secs",
            file.notify_max_backoff_secs,
            d.notify_max_backoff,
        )?,
    })
}

/// How often the chain watch reads stored chain thresholds again.
const THRESHOLDS_EVERY: u32 = 5;

/// Samples the chain ingesters every sampling interval into the chain watch.
pub fn watch_chains(
    status: Arc<dyn ChainStatusSource>,
    recorder: Arc<Recorder>,
) -> tokio::task::JoinHandle<()> {
    let interval = recorder.settings().interval;
    let mut watch = ChainWatch::new(recorder);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut round = 0u32;
        loop {
            tick.tick().await;
            if round % THRESHOLDS_EVERY == 0 {
                watch.read_thresholds().await;
            }
            round = round.wrapping_add(1);
            let samples: Vec<ChainSample> = status
                .statuses()
                .into_iter()
                .map(|s| ChainSample {
                    chain: s.chain,
                    head: s.head,
                    ingested: s.ingested,
                    lag_seconds: s.lag_seconds,
                    reorgs: s.reorgs,
                    last_reorg_depth: None,
                    last_error: s.last_error,
                })
                .collect();
            watch.observe(&samples);
        }
    })
}
