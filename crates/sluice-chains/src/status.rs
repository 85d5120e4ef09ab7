//! What `GET /api/v1/chains` and `/metrics` show of an ingester: written by the ingester,
//! read by the API through a shared [`ChainStatus`].

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::rpc::RpcCounters;

/// Reads one series' value from a snapshot.
type Pick = fn(&StatusSnapshot) -> Option<f64>;

/// One chain's live status.
#[derive(Debug)]
pub struct ChainStatus {
    chain: String,
    rpc_url: String,
    inner: Mutex<Inner>,
    rpc: Mutex<Option<Arc<RpcCounters>>>,
}

#[derive(Debug, Default, Clone)]
struct Inner {
    head: Option<u64>,
    head_timestamp: Option<i64>,
    finalized_target: Option<u64>,
    ingested: Option<u64>,
    ingested_timestamp: Option<i64>,
    zerolag: Option<u64>,
    reorgs: u64,
    last_error: Option<String>,
    rejected: u64,
    lag_bytes: Option<u64>,
}

/// A copy of the status, as the API renders it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StatusSnapshot {
    pub chain: String,
    /// The RPC URL with secrets hidden.
    pub rpc_url: String,
    /// The node's head block.
    pub head: Option<u64>,
    /// The highest block the finality rule makes final.
    pub finalized: Option<u64>,
    /// The last block in the finalized streams.
    pub ingested: Option<u64>,
    /// The last block in the zerolag streams.
    pub zerolag_ingested: Option<u64>,
    /// `head - ingested`.
    pub lag_blocks: Option<u64>,
    /// Head block time minus the ingested block's time.
    pub lag_seconds: Option<i64>,
    pub reorgs: u64,
    pub rpc_requests: u64,
    pub rpc_errors: u64,
    pub rpc_retries: u64,
    pub last_error: Option<String>,
    /// Lines of a node's files that made no record (Hyperliquid).
    pub rejected: u64,
    /// Bytes of a node's files not read yet (Hyperliquid).
    pub lag_bytes: Option<u64>,
}

impl ChainStatus {
    pub fn new(chain: &str, redacted_rpc_url: &str) -> Self {
        Self {
            chain: chain.to_owned(),
            rpc_url: redacted_rpc_url.to_owned(),
            inner: Mutex::new(Inner::default()),
            rpc: Mutex::new(None),
        }
    }

    pub fn chain(&self) -> &str {
        &self.chain
    }

    fn update(&self, change: impl FnOnce(&mut Inner)) {
        change(&mut self.inner.lock().expect("status lock is never poisoned"));
    }

    pub(crate) fn set_rpc(&self, counters: Arc<RpcCounters>) {
        *self.rpc.lock().expect("status lock is never poisoned") = Some(counters);
    }

    pub(crate) fn head(&self, number: u64, timestamp: Option<i64>, target: u64) {
        self.update(|s| {
            s.head = Some(number);
            if timestamp.is_some() {
                s.head_timestamp = timestamp;
            }
            s.finalized_target = Some(target);
        });
    }

    pub(crate) fn ingested(&self, number: u64, timestamp: i64) {
        self.update(|s| {
            s.ingested = Some(number);
            s.ingested_timestamp = Some(timestamp);
        });
    }

    pub(crate) fn rejected(&self, lines: u64) {
        self.update(|s| s.rejected += lines);
    }

    pub(crate) fn lag_bytes(&self, bytes: u64, newest_write: Option<i64>) {
        self.update(|s| {
            s.lag_bytes = Some(bytes);
            s.head_timestamp = newest_write.or(s.head_timestamp);
        });
    }

    pub(crate) fn zerolag(&self, number: u64) {
        self.update(|s| s.zerolag = Some(number));
    }

    pub(crate) fn reorg(&self) {
        self.update(|s| s.reorgs += 1);
    }

    /// Sets (or clears) the error the status shows.
    pub fn error(&self, error: Option<String>) {
        self.update(|s| s.last_error = error);
    }

    pub fn snapshot(&self) -> StatusSnapshot {
        let s = self.inner.lock().expect("status lock is never poisoned").clone();
        let rpc = self.rpc.lock().expect("status lock is never poisoned").clone();
        let count = |pick: fn(&RpcCounters) -> u64| rpc.as_deref().map_or(0, pick);
        StatusSnapshot {
            chain: self.chain.clone(),
            rpc_url: self.rpc_url.clone(),
            head: s.head,
            finalized: s.finalized_target,
            ingested: s.ingested,
            zerolag_ingested: s.zerolag,
            lag_blocks: s.head.zip(s.ingested).map(|(h, i)| h.saturating_sub(i)),
            lag_seconds: s.head_timestamp.zip(s.ingested_timestamp).map(|(h, i)| (h - i).max(0)),
            reorgs: s.reorgs,
            rpc_requests: count(|c| c.requests.load(Ordering::Relaxed)),
            rpc_errors: count(|c| c.errors.load(Ordering::Relaxed)),
            rpc_retries: count(|c| c.retries.load(Ordering::Relaxed)),
            // A step's error, or while requests are failing the last one's at once.
            last_error: s.last_error.or_else(|| rpc.as_deref().and_then(RpcCounters::failing)),
            rejected: s.rejected,
            lag_bytes: s.lag_bytes,
        }
    }

    /// Prometheus text of every chain's status.
    pub fn metrics_text(statuses: &[Arc<ChainStatus>]) -> String {
        let mut out = String::new();
        let series: [(&str, &str, Pick); 10] = [
            ("sluice_chain_head_block", "gauge", |s| s.head.map(|v| v as f64)),
            ("sluice_chain_finalized_block", "gauge", |s| s.finalized.map(|v| v as f64)),
            ("sluice_chain_ingested_block", "gauge", |s| s.ingested.map(|v| v as f64)),
            ("sluice_chain_lag_blocks", "gauge", |s| s.lag_blocks.map(|v| v as f64)),
            ("sluice_chain_lag_seconds", "gauge", |s| s.lag_seconds.map(|v| v as f64)),
            ("sluice_chain_reorgs_total", "counter", |s| Some(s.reorgs as f64)),
            ("sluice_chain_rpc_requests_total", "counter", |s| Some(s.rpc_requests as f64)),
            ("sluice_chain_rpc_errors_total", "counter", |s| Some(s.rpc_errors as f64)),
            ("sluice_chain_rejected_total", "counter", |s| Some(s.rejected as f64)),
            ("sluice_chain_lag_bytes", "gauge", |s| s.lag_bytes.map(|v| v as f64)),
        ];
        let snapshots: Vec<StatusSnapshot> = statuses.iter().map(|s| s.snapshot()).collect();
        for (name, kind, pick) in series {
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            for snapshot in &snapshots {
                if let Some(value) = pick(snapshot) {
                    out.push_str(&format!("{name}{{chain=\"{}\"}} {value}\n", snapshot.chain));
                }
            }
        }
        out
    }
}
