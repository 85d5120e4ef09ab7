//! The chain watch: turns samples of the chain ingesters' status (taken by the binary, which
//! owns the ingesters) into `chain.lagging`, `chain.stalled`, `chain.reorg` and
//! `chain.recovered` events. A chain is stalled when no new block was ingested for
//! [`EventSettings::chain_stall`](super::EventSettings) and lagging when its data is more
//! than [`EventSettings::chain_lag`](super::EventSettings) behind its head; it recovers when
//! neither holds any more. Keys name the block where it happened, so several nodes watching
//! the same chain store one event.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use sluice_core::events::{EventEmitter, NewEvent, Severity};

use super::Recorder;

/// One chain ingester's status at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSample {
    pub chain: String,
    /// The node's head block.
    pub head: Option<u64>,
    /// The last block ingested (finalized streams).
    pub ingested: Option<u64>,
    /// Seconds between the head's time and the last ingested block's time.
    pub lag_seconds: Option<i64>,
    /// Reorgs seen since start.
    pub reorgs: u64,
    /// Depth of the latest reorg, when known.
    pub last_reorg_depth: Option<u64>,
    pub last_error: Option<String>,
}

/// Per-chain thresholds (`None`: the settings' defaults).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChainThresholds {
    pub lag_seconds: Option<u64>,
    pub stall_seconds: Option<u64>,
}

/// The subject under which a chain's thresholds are stored.
pub fn chain_subject(chain: &str) -> String {
    format!("chain:{chain}")
}

#[derive(Debug, Default)]
struct Seen {
    /// The highest block ingested, and when it was first seen.
    block: Option<u64>,
    since: Option<DateTime<Utc>>,
    reorgs: Option<u64>,
    stalled: bool,
    lagging: bool,
}

/// The watch over every chain of this process.
pub struct ChainWatch {
    recorder: Arc<Recorder>,
    seen: HashMap<String, Seen>,
    thresholds: HashMap<String, ChainThresholds>,
}

impl ChainWatch {
    pub fn new(recorder: Arc<Recorder>) -> Self {
        Self { recorder, seen: HashMap::new(), thresholds: HashMap::new() }
    }

    /// Reads the chains' stored thresholds again.
    pub async fn read_thresholds(&mut self) {
        let Ok(all) = self.recorder.store().all_thresholds().await else { return };
        self.thresholds = all
            .into_iter()
            .filter_map(|(subject, settings)| {
                let chain = subject.strip_prefix("chain:")?.to_owned();
                Some((chain, serde_json::from_str(&settings).ok()?))
            })
            .collect();
    }

    /// Emits the events `samples` show, compared with the previous samples.
    pub fn observe(&mut self, samples: &[ChainSample]) {
        let now = self.recorder.now();
        for sample in samples {
            let settings = *self.recorder.settings();
            let set = self.thresholds.get(&sample.chain).copied().unwrap_or_default();
            let stall = set.stall_seconds.map_or(settings.chain_stall, Duration::from_secs);
            let lag = set.lag_seconds.map_or(settings.chain_lag, Duration::from_secs);
            let seen = self.seen.entry(sample.chain.clone()).or_default();
            for event in observe_one(seen, sample, now, stall, lag) {
                self.recorder.emit(event);
            }
        }
    }
}

fn observe_one(
    seen: &mut Seen,
    sample: &ChainSample,
    now: DateTime<Utc>,
    stall: Duration,
    lag: Duration,
) -> Vec<NewEvent> {
    let mut events = Vec::new();
    let chain = sample.chain.as_str();
    let event = |kind, severity, message: String, details, key: String| {
        NewEvent::chain(
            now,
            kind,
            severity,
            chain,
            message,
            details,
            format!("{kind}:{chain}:{key}"),
        )
    };
    if let (Some(before), true) = (seen.reorgs, sample.reorgs > seen.reorgs.unwrap_or(0)) {
        let depth = sample.last_reorg_depth;
        let message = match depth {
            Some(depth) => format!("{chain}: reorg of depth {depth}"),
            None => format!("{chain}: reorg"),
        };
        let details = json!({"depth": depth, "reorgs": sample.reorgs, "head": sample.head});
        let key = format!("{}", sample.reorgs - before);
        events.push(event(
            "chain.reorg",
            Severity::Warning,
            message,
            details,
            format!("{key}:{}", sample.head.unwrap_or(0)),
        ));
    }
    seen.reorgs = Some(sample.reorgs);
    if sample.ingested.is_some() && sample.ingested > seen.block {
        seen.block = sample.ingested;
        seen.since = Some(now);
    } else if seen.since.is_none() {
        seen.since = Some(now);
    }
    let block = seen.block.unwrap_or(0);
    let quiet = seen.since.map_or(chrono::Duration::zero(), |since| now - since);
    let stalled = quiet >= chrono::Duration::from_std(stall).unwrap_or_default();
    let lag_limit = i64::try_from(lag.as_secs()).unwrap_or(i64::MAX);
    let lagging = sample.lag_seconds.is_some_and(|secs| secs > lag_limit);
    if stalled && !seen.stalled {
        let details = json!({
            "last_block": seen.block, "head": sample.head, "stalled_seconds": quiet.num_seconds(),
            "threshold_seconds": stall.as_secs(), "error": sample.last_error,
        });
        let message = format!("{chain}: no new block for {} s (last {block})", quiet.num_seconds());
        events.push(event("chain.stalled", Severity::Error, message, details, block.to_string()));
    }
    if lagging && !seen.lagging {
        let details = json!({
            "lag_seconds": sample.lag_seconds, "threshold_seconds": lag.as_secs(),
            "head": sample.head, "ingested": sample.ingested,
        });
        let message = format!("{chain}: {} s behind its head", sample.lag_seconds.unwrap_or(0));
        events.push(event("chain.lagging", Severity::Warning, message, details, block.to_string()));
    }
    if (seen.stalled || seen.lagging) && !stalled && !lagging {
        let details =
            json!({"block": seen.block, "head": sample.head, "lag_seconds": sample.lag_seconds});
        let message = format!("{chain}: ingesting again (block {block})");
        events.push(event("chain.recovered", Severity::Info, message, details, block.to_string()));
    }
    seen.stalled = stalled;
    seen.lagging = lagging;
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ingested: u64, reorgs: u64) -> ChainSample {
        ChainSample {
            chain: "base".into(),
            head: Some(ingested),
            ingested: Some(ingested),
            lag_seconds: Some(0),
            reorgs,
            last_reorg_depth: Some(2),
            last_error: None,
        }
    }

    #[test]
    fn a_chain_that_stops_is_stalled_once_then_recovers_when_blocks_come_again() {
        let mut seen = Seen::default();
        let t0 = Utc::now();
        let (stall, lag) = (Duration::from_secs(10), Duration::from_secs(60));
        let at = |s| t0 + chrono::Duration::seconds(s);
        assert!(observe_one(&mut seen, &sample(5, 0), at(0), stall, lag).is_empty());
        assert!(observe_one(&mut seen, &sample(5, 0), at(9), stall, lag).is_empty());
        let kinds = |events: Vec<NewEvent>| events.iter().map(|e| e.kind).collect::<Vec<_>>();
        assert_eq!(
            kinds(observe_one(&mut seen, &sample(5, 0), at(10), stall, lag)),
            ["chain.stalled"]
        );
        assert!(observe_one(&mut seen, &sample(5, 0), at(30), stall, lag).is_empty());
        assert_eq!(
            kinds(observe_one(&mut seen, &sample(6, 1), at(31), stall, lag)),
            ["chain.reorg", "chain.recovered"]
        );
        assert!(observe_one(&mut seen, &sample(7, 1), at(32), stall, lag).is_empty());
    }
}
