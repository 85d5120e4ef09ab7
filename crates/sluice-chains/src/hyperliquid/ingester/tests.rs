use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use serde_json::json;
use sluice_bus::{EmbeddedLog, Retention, StreamLog, TopicConfig};
use sluice_core::clock::SystemClock;

use super::*;
use crate::sink::{Checkpoint, LogPositions, SinkError};

/// A sink that fails its `fail_at`-th append or position save (counted together) without
/// doing it: a crash between the fill and the trade append, or between the appends and the
/// stored position.
struct Crashing {
    inner: LogPositions,
    calls: AtomicUsize,
    fail_at: usize,
}

impl Crashing {
    fn call(&self) -> Result<(), SinkError> {
        if self.calls.fetch_add(1, Ordering::Relaxed) + 1 == self.fail_at {
            return Err(SinkError::Append {
                stream: "test".into(),
                reason: "crashed".into(),
                transient: false,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl ChainSink for Crashing {
    async fn append(
        &self,
        chain: &str,
        entity: &str,
        zerolag: bool,
        records: Vec<StreamRecord>,
    ) -> Result<(), SinkError> {
        self.call()?;
        self.inner.append(chain, entity, zerolag, records).await
    }
    async fn last_block(&self, chain: &str, entity: &str) -> Result<Option<u64>, SinkError> {
        self.inner.last_block(chain, entity).await
    }
    async fn load_checkpoint(&self, chain: &str) -> Result<Option<Checkpoint>, SinkError> {
        self.inner.load_checkpoint(chain).await
    }
    async fn save_checkpoint(&self, chain: &str, checkpoint: &Checkpoint) -> Result<(), SinkError> {
        self.inner.save_checkpoint(chain, checkpoint).await
    }
    async fn tails(&self, chain: &str, entity: &str) -> Result<Vec<Vec<u8>>, SinkError> {
        self.inner.tails(chain, entity).await
    }
    async fn load_position(&self, chain: &str) -> Result<Option<Value>, SinkError> {
        self.inner.load_position(chain).await
    }
    async fn save_position(&self, chain: &str, position: &Value) -> Result<(), SinkError> {
        self.call()?;
        self.inner.save_position(chain, position).await
    }
}

/// Block `b`'s fills (tid, side): trade `2b` whole, and where `b` is not the first or the
/// last block of its file, the seller of trade `2b - 1` and the buyer of trade `2b + 1` (so
/// that fills wait a line for their other side).
fn block_fills(b: u64, first: bool, last: bool) -> Vec<(u64, &'static str)> {
    let mut fills = vec![(b * 2, "B"), (b * 2, "A")];
    if !first {
        fills.push((b * 2 - 1, "A"));
    }
    if !last {
        fills.push((b * 2 + 1, "B"));
    }
    fills
}

fn by_block_line(b: u64, fills: &[(u64, &str)]) -> String {
    let fill = |(tid, side): &(u64, &str)| {
        let seller = u64::from(*side == "A");
        json!([format!("0x{:040x}", tid * 2 + seller), {
            "coin": "BTC", "px": "104000.5", "sz": "0.01", "side": side, "time": 1_748_772_000_000_u64 + b,
            "startPosition": "0.0", "dir": "Open Long", "closedPnl": "0.0", "hash": format!("0x{tid:064x}"),
            "oid": tid * 10 + seller, "crossed": seller == 1, "fee": "0.4", "tid": tid,
            "feeToken": "USDC", "twapId": null
        }])
    };
    let events: Vec<Value> = fills.iter().map(fill).collect();
    let line =
        json!({"block_number": b, "block_time": "2025-06-01T10:00:00.000", "events": events});
    format!("{line}\n")
}

async fn stored(log: &Arc<dyn StreamLog>, entity: &str) -> BTreeMap<String, usize> {
    let topic = format!("hyperliquid.{entity}");
    let mut keys = BTreeMap::new();
    for (partition, range) in (0u32..).zip(log.offsets(&topic).await.unwrap()) {
        for record in log.read(&topic, partition, range.start, 100_000).await.unwrap() {
            *keys.entry(String::from_utf8(record.key.to_vec()).unwrap()).or_default() += 1;
        }
    }
    keys
}

#[tokio::test]
async fn fills_and_their_trades_read_in_one_pass_are_each_appended_once_across_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let last = 60;
    let mut expected_fills = Vec::new();
    for b in 1..=last {
        // Blocks past 40 go to the next hour's file (a rotation).
        let hour = if b <= 40 { 10 } else { 11 };
        let fills = block_fills(b, b == 1 || b == 41, b == 40 || b == last);
        expected_fills.extend(fills.iter().map(|(tid, side)| format!("{tid}:{side}")));
        let path = data.join(format!("node_fills_by_block/hourly/20250601/{hour}"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        file.write_all(by_block_line(b, &fills).as_bytes()).unwrap();
    }
    let log: Arc<dyn StreamLog> =
        Arc::new(EmbeddedLog::open(&dir.path().join("log.redb"), Arc::new(SystemClock)).unwrap());
    for entity in ["fill", "trade"] {
        let config = TopicConfig { partitions: 4, retention: Retention::default() };
        log.create_topic(&format!("hyperliquid.{entity}"), config).await.unwrap();
    }
    let mut config = HyperliquidConfig::new("hyperliquid", &data);
    config.entities = vec!["fill".into(), "trade".into()];
    config.start = FileStart::Earliest;
    // A few lines per step: many steps, each a place to crash.
    config.max_read_bytes = 4096;
    let mut crashes = 0;
    // Each run crashes at its n-th append or save (0: runs to the end).
    for fail_at in [3, 4, 5, 2, 6, 7, 3, 9, 4, 0] {
        let sink = Arc::new(Crashing {
            inner: LogPositions::new(log.clone()),
            calls: AtomicUsize::new(0),
            fail_at,
        });
        let status = HyperliquidIngester::status_for(&config);
        let mut ingester = HyperliquidIngester::new(config.clone(), sink, status.clone());
        loop {
            match ingester.step().await {
                Ok(true) => {}
                Ok(false) => break,
                Err(_) => {
                    crashes += 1;
                    break;
                }
            }
        }
        assert_eq!(status.snapshot().rejected, 0);
    }
    assert_eq!(crashes, 9, "every run but the last crashed");
    let fills = stored(&log, "fill").await;
    let trades = stored(&log, "trade").await;
    assert!(fills.values().all(|n| *n == 1), "a fill appended twice: {fills:?}");
    assert!(trades.values().all(|n| *n == 1), "a trade appended twice: {trades:?}");
    expected_fills.sort();
    assert_eq!(fills.keys().cloned().collect::<Vec<_>>(), expected_fills);
    // Every tid whose two fills were written: one trade each.
    let mut expected: Vec<String> = (1..=2 * last + 1)
        .filter(|tid| ["B", "A"].iter().all(|side| fills.contains_key(&format!("{tid}:{side}"))))
        .map(|tid| tid.to_string())
        .collect();
    expected.sort();
    assert_eq!(expected.len() as u64, 2 * last - 2, "tids 2..=120 but 81");
    assert_eq!(trades.keys().cloned().collect::<Vec<_>>(), expected);
}
