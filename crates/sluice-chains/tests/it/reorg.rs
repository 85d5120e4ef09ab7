//! Reorgs made on the node (snapshot, then revert to it and mine other blocks) and resumes
//! after a crash.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_chains::sink::{ChainSink, SinkError};
use sluice_chains::{Checkpoint, Ingester};

use crate::anvil::{
    ALICE, Anvil, BOB, address, config, positions, records, stream_log, text, uint,
};
use crate::ingest::ingest_until;

async fn step_until_zerolag(
    ingester: &mut Ingester,
    status: &sluice_chains::ChainStatus,
    block: u64,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while status.snapshot().zerolag_ingested < Some(block) {
        assert!(std::time::Instant::now() < deadline, "zerolag did not reach {block}");
        ingester.step().await.unwrap();
    }
}

#[tokio::test]
async fn a_reorg_puts_a_marker_and_the_replacement_in_zerolag_and_only_the_canonical_block_in_finalized()
 {
    let anvil = Anvil::start().await;
    let usdc = anvil.deploy("TestToken", vec![text("USD Coin"), text("USDC"), uint(6)]).await;
    anvil
        .invoke(ALICE, &usdc, "mint(address,uint256)", vec![address(ALICE), uint(1_000_000)])
        .await;
    let dir = tempfile::tempdir().unwrap();
    let log = stream_log(dir.path(), "base").await;
    let config = config(&anvil.url, 5);
    let status = Ingester::status_for(&config);
    let mut ingester = Ingester::new(config, positions(&log), status.clone()).unwrap();

    let snapshot = anvil.call("evm_snapshot", json!([])).await;
    let orphaned = anvil
        .invoke(ALICE, &usdc, "transfer(address,uint256)", vec![address(BOB), uint(111)])
        .await;
    let reorged_height = anvil.head().await;
    step_until_zerolag(&mut ingester, &status, reorged_height).await;
    let zerolag = records(&log, "base.erc20_token_transfer.zerolag").await;
    assert!(zerolag.iter().any(|r| r["transaction_hash"] == orphaned["transactionHash"]));

    assert_eq!(anvil.call("evm_revert", json!([snapshot])).await, json!(true));
    // Another block at the same height (another transaction, so another hash), then more.
    let canonical = anvil
        .invoke(ALICE, &usdc, "transfer(address,uint256)", vec![address(BOB), uint(222)])
        .await;
    assert_eq!(anvil.head().await, reorged_height);
    assert_ne!(canonical["blockHash"], orphaned["blockHash"]);
    anvil.mine(8).await;
    let finalized = anvil.head().await - 5;
    let snapshot = ingest_until(&mut ingester, &status, finalized).await;
    assert_eq!(snapshot.reorgs, 1);

    let zerolag = records(&log, "base.erc20_token_transfer.zerolag").await;
    let markers: Vec<&Value> = zerolag.iter().filter(|r| r["reorg"] == true).collect();
    assert_eq!(markers.len(), 1, "{zerolag:#?}");
    assert_eq!(markers[0]["block_hash"], orphaned["blockHash"]);
    assert_eq!(markers[0]["block_number"], reorged_height);
    assert!(zerolag.iter().any(|r| r["transaction_hash"] == canonical["transactionHash"]));
    // Every zerolag stream carries the marker, whether or not it had records of the block.
    for entity in
        ["log", "decoded_log", "erc721_token_transfer", "erc1155_token_transfer", "dex_trade"]
    {
        let stream = records(&log, &format!("base.{entity}.zerolag")).await;
        assert!(
            stream.iter().any(|r| r["reorg"] == true && r["block_hash"] == orphaned["blockHash"]),
            "{entity}"
        );
    }

    let finalized_records = records(&log, "base.erc20_token_transfer").await;
    assert!(
        finalized_records
            .iter()
            .all(|r| r["transaction_hash"] != orphaned["transactionHash"] && r["reorg"].is_null())
    );
    assert_eq!(
        finalized_records
            .iter()
            .filter(|r| r["transaction_hash"] == canonical["transactionHash"])
            .count(),
        1
    );
    let raw = records(&log, "base.log").await;
    assert!(raw.iter().all(|r| r["block_hash"] != orphaned["blockHash"]));
}

/// Count of each key (transaction hash, log index) in a finalized stream.
fn counts(records: &[Value]) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for r in records {
        *counts.entry(format!("{}:{}", r["transaction_hash"], r["log_index"])).or_insert(0) += 1;
    }
    counts
}

#[tokio::test]
async fn a_restart_behind_the_streams_appends_every_block_exactly_once() {
    let anvil = Anvil::start().await;
    let usdc = anvil.deploy("TestToken", vec![text("USD Coin"), text("USDC"), uint(6)]).await;
    for i in 0..20u128 {
        anvil.invoke(ALICE, &usdc, "mint(address,uint256)", vec![address(BOB), uint(i + 1)]).await;
    }
    anvil.mine(2).await;
    let dir = tempfile::tempdir().unwrap();
    let log = stream_log(dir.path(), "base").await;
    let sink = positions(&log);
    let mut config = config(&anvil.url, 2);
    config.max_block_range = 4;
    let status = Ingester::status_for(&config);
    let mut ingester = Ingester::new(config.clone(), sink.clone(), status.clone()).unwrap();
    ingest_until(&mut ingester, &status, 12).await;
    drop(ingester);
    // A crash after the streams were appended but before the checkpoint was: put back an
    // older checkpoint (block 5), as if the last ones were never written.
    let rpc = anvil.rpc.clone();
    let header = |n: u64| {
        let rpc = rpc.clone();
        async move {
            sluice_chains::fetch::header(&rpc, json!(format!("0x{n:x}"))).await.unwrap().unwrap()
        }
    };
    let old = Checkpoint {
        finalized: header(5).await,
        unfinalized: vec![header(6).await, header(7).await],
    };
    sink.save_checkpoint("base", &old).await.unwrap();
    for i in 0..5u128 {
        anvil
            .invoke(ALICE, &usdc, "mint(address,uint256)", vec![address(BOB), uint(100 + i)])
            .await;
    }
    anvil.mine(2).await;
    let head = anvil.head().await;
    let status = Ingester::status_for(&config);
    let mut ingester = Ingester::new(config, sink, status.clone()).unwrap();
    ingest_until(&mut ingester, &status, head - 2).await;

    for entity in ["erc20_token_transfer", "log", "decoded_log"] {
        let stream = records(&log, &format!("base.{entity}")).await;
        let counts = counts(&stream);
        assert_eq!(counts.len(), 25, "{entity}: 25 mints");
        assert!(counts.values().all(|c| *c == 1), "{entity}: a record twice: {counts:?}");
    }
}

/// A sink whose finalized appends fail now and then: of every five, the second before writing
/// (nothing written) and the fourth after writing (written, then an error, as a crash between
/// the append and the checkpoint). With two streams per finalize, two of every three
/// attempts fail, one of them after the first stream was written.
struct Flaky {
    inner: Arc<sluice_chains::LogPositions>,
    finalized_appends: AtomicU64,
}

#[async_trait::async_trait]
impl ChainSink for Flaky {
    async fn append(
        &self,
        chain: &str,
        entity: &str,
        zerolag: bool,
        records: Vec<sluice_core::streams::StreamRecord>,
    ) -> Result<(), SinkError> {
        let n = if zerolag { 1 } else { self.finalized_appends.fetch_add(1, Ordering::Relaxed) };
        let fail = || SinkError::Append {
            stream: entity.to_owned(),
            reason: "injected".to_owned(),
            transient: true,
        };
        if n % 5 == 1 {
            return Err(fail());
        }
        self.inner.append(chain, entity, zerolag, records).await?;
        if n % 5 == 3 { Err(fail()) } else { Ok(()) }
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

    async fn load_position(&self, chain: &str) -> Result<Option<serde_json::Value>, SinkError> {
        self.inner.load_position(chain).await
    }

    async fn save_position(
        &self,
        chain: &str,
        position: &serde_json::Value,
    ) -> Result<(), SinkError> {
        self.inner.save_position(chain, position).await
    }
}

/// The finalized appends run while the next blocks are built; when one fails (before or
/// after writing), the ingester resumes from the stored position and the finalized streams
/// still hold every block exactly once.
#[tokio::test]
async fn failed_finalized_writes_lose_and_repeat_nothing() {
    let anvil = Anvil::start().await;
    let usdc = anvil.deploy("TestToken", vec![text("USD Coin"), text("USDC"), uint(6)]).await;
    for i in 0..30u128 {
        anvil.invoke(ALICE, &usdc, "mint(address,uint256)", vec![address(BOB), uint(i + 1)]).await;
    }
    anvil.mine(2).await;
    let head = anvil.head().await;
    let dir = tempfile::tempdir().unwrap();
    let log = stream_log(dir.path(), "base").await;
    let sink = Arc::new(Flaky { inner: positions(&log), finalized_appends: AtomicU64::new(0) });
    let mut config = config(&anvil.url, 2);
    config.max_block_range = 3;
    config.entities = vec![("erc20_token_transfer".to_owned(), false), ("log".to_owned(), false)];
    let status = Ingester::status_for(&config);
    let mut ingester = Ingester::new(config, sink.clone(), status.clone()).unwrap();
    let (mut failures, deadline) = (0, Instant::now() + Duration::from_secs(60));
    while status.snapshot().ingested < Some(head - 2) {
        assert!(Instant::now() < deadline, "stuck: {:?}", status.snapshot());
        if ingester.step().await.is_err() {
            failures += 1;
        }
    }
    // The last writes may still be in flight: a step with nothing new settles them.
    while ingester.step().await.is_err() {
        failures += 1;
    }
    assert!(failures >= 3, "faults were injected: {failures}");
    for entity in ["erc20_token_transfer", "log"] {
        let stream = records(&log, &format!("base.{entity}")).await;
        let counts = counts(&stream);
        assert_eq!(counts.len(), 30, "{entity}: 30 mints");
        assert!(counts.values().all(|c| *c == 1), "{entity}: a record twice: {counts:?}");
    }
}
