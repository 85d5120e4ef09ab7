//! One chain's ingester: follows the node's head, writes every block's records to the
//! zerolag streams at the tip and to the finalized streams once final, detects reorgs by
//! parent hash, and resumes exactly after a crash (see [`crate::sink`] for how).
//!
//! State: `finalized` is the last block in the finalized streams; `unfinalized` the blocks
//! after it, in the zerolag streams (with their records, kept for when they become final).
//! Each step reads the next range after the newest known block, checks its first block's
//! parent against that block, appends it to the zerolag streams, then moves every block the
//! finality rule now covers to the finalized streams, after checking the newest of them is
//! still the node's block at that height. A mismatch is a reorg: the ingester finds the
//! newest block it has that the node still has, writes a reorg marker to every zerolag
//! stream for each block after it, drops them and reads on from there.
//!
//! The finalized streams' appends and the checkpoint after them run in a task of their own
//! (`writing`) while the next blocks are read and built; whatever writes next waits for it
//! first (`settle`). A failed write makes the ingester forget its position, exactly as a
//! crash would: the next step resumes from the stored checkpoint and the streams' tails.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sluice_core::streams::StreamRecord;

use crate::ChainError;
use crate::config::{ChainConfig, Finality, StartBlock};
use crate::fetch::{self, FetchedBlock, Header, RangeSizer};
use crate::records::{self, BlockRecords};
use crate::rpc::RpcClient;
use crate::sink::{ChainSink, Checkpoint, SinkError};
use crate::status::ChainStatus;
use crate::tokens::{PoolBalances, Tokens};
use crate::usd::UsdPrices;

/// Longest wait between attempts after errors.
const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(30);

/// A block in the zerolag streams and not yet final; `records` is `None` for blocks known
/// only from the checkpoint after a restart (they are read again when they become final).
#[derive(Debug)]
struct Pending {
    header: Header,
    records: Option<BlockRecords>,
}

/// A read of ranges running in its own task, with the range sizer it ends with.
type Prefetch = tokio::task::JoinHandle<Result<(Vec<FetchedBlock>, RangeSizer), ChainError>>;

/// One chain's ingester.
pub struct Ingester {
    config: ChainConfig,
    rpc: RpcClient,
    sink: Arc<dyn ChainSink>,
    status: Arc<ChainStatus>,
    tokens: Tokens,
    /// USD prices the chain's trades taught, for the next trades' USD values.
    prices: UsdPrices,
    sizer: RangeSizer,
    /// The read of the ranges after the ones being written, started before writing them
    /// while the ingester is behind the head: `(first block, task)`.
    prefetch: Option<(u64, Prefetch)>,
    finalized: Option<Header>,
    unfinalized: VecDeque<Pending>,
    /// Per finalized stream, the highest block it already holds: blocks up to it are not
    /// appended to it again (the streams may be ahead of the checkpoint after a crash).
    stream_tails: HashMap<String, u64>,
    /// The last finalize's appends and checkpoint, running while the next blocks are built;
    /// settled (awaited) before anything else is written.
    writing: Option<tokio::task::JoinHandle<Result<(), ChainError>>>,
}

impl Drop for Ingester {
    fn drop(&mut self) {
        if let Some((_, task)) = self.prefetch.take() {
            task.abort();
        }
        // As a crash at this moment: the streams may end up ahead of the checkpoint, which
        // a restart handles (`stream_tails`).
        if let Some(task) = self.writing.take() {
            task.abort();
        }
    }
}

impl std::fmt::Debug for Ingester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingester").field("chain", &self.config.name).finish_non_exhaustive()
    }
}

impl Ingester {
    /// # Errors
    /// [`ChainError::Config`] when the RPC client cannot be built.
    pub fn new(
        config: ChainConfig,
        sink: Arc<dyn ChainSink>,
        status: Arc<ChainStatus>,
    ) -> Result<Self, ChainError> {
        let rpc = RpcClient::new(&config.rpc_url, config.rpc.clone())?;
        status.set_rpc(rpc.counters().clone());
        Ok(Self {
            sizer: RangeSizer::new(config.max_block_range),
            prices: UsdPrices::new(&config.stablecoins),
            prefetch: None,
            config,
            rpc,
            sink,
            status,
            tokens: Tokens::default(),
            finalized: None,
            unfinalized: VecDeque::new(),
            stream_tails: HashMap::new(),
            writing: None,
        })
    }

    /// A new status for `config` (the URL redacted), for the API to read.
    pub fn status_for(config: &ChainConfig) -> Arc<ChainStatus> {
        Arc::new(ChainStatus::new(&config.name, &crate::rpc::redact_url(&config.rpc_url)))
    }

    /// Runs until the task is dropped: errors are logged, shown in the status and retried
    /// with backoff.
    pub async fn run(mut self) {
        let chain = self.config.name.clone();
        tracing::info!(%chain, rpc = %self.rpc.display_url(), "chain ingester starting");
        // New heads over WebSocket wake the idle wait early; the poll stays as the fallback.
        let wake = Arc::new(tokio::sync::Notify::new());
        let _heads = self.config.ws_url.clone().map(|ws_url| {
            AbortOnDrop(tokio::spawn(crate::heads::follow(chain.clone(), ws_url, wake.clone())))
        });
        let (status, poll) = (self.status.clone(), self.config.poll_interval);
        run_rounds(&mut self, &chain, &status, poll, &wake).await;
    }

    /// One round: start (or resume) if needed, read the next range, finalize what is final.
    /// True when it did something (so the next round starts without waiting).
    ///
    /// # Errors
    /// RPC and sink failures, a deep reorg.
    pub async fn step(&mut self) -> Result<bool, ChainError> {
        // The last finalize's writes: a failure shows (and is recovered from) at once.
        if self.writing.as_ref().is_some_and(tokio::task::JoinHandle::is_finished) {
            self.settle().await?;
        }
        let head = fetch::block_number(&self.rpc).await?;
        let target = self.final_target(head).await?;
        self.status.head(head, None, target);
        if self.finalized.is_none() {
            self.start(target).await?;
        }
        let mut progressed = false;
        let tip = self.tip().clone();
        if tip.number < head {
            let blocks = match self.read_from(tip.number + 1, head, target).await {
                Err(ChainError::Inconsistent { .. }) => return Ok(false),
                other => other?,
            };
            // Behind the head: read the next ranges while these are written.
            if let Some(last) = blocks.last().map(|b| b.header.number).filter(|n| *n < head) {
                self.start_prefetch(last + 1, head, target);
            }
            let first = blocks.first().expect("a range has a block");
            if first.header.parent_hash != tip.hash {
                self.reorg().await?;
                return Ok(true);
            }
            let built = self.build(&blocks).await?;
            self.append_zerolag(&built).await?;
            if let Some(last) = blocks.last() {
                self.status.head(
                    head,
                    Some(last.header.timestamp).filter(|_| last.header.number == head),
                    target,
                );
                self.status.zerolag(last.header.number);
            }
            self.unfinalized.extend(
                built.into_iter().map(|r| Pending { header: r.header.clone(), records: Some(r) }),
            );
            progressed = true;
        }
        match self.finalize(target).await? {
            // The finalize's own task saves the checkpoint after its appends.
            Finalized::Writing => return Ok(true),
            Finalized::Done => progressed = true,
            Finalized::Nothing => {}
        }
        if progressed {
            self.save().await?;
        } else {
            // Idle: nothing else would wait for the last writes.
            self.settle().await?;
        }
        Ok(progressed)
    }

    /// Waits for the last finalize's appends and checkpoint. If they failed, the ingester
    /// forgets its position, as after a crash: the next step resumes from the stored
    /// checkpoint and the streams' tails, so no block is lost or written twice.
    async fn settle(&mut self) -> Result<(), ChainError> {
        let Some(task) = self.writing.take() else { return Ok(()) };
        let outcome = match task.await {
            Ok(outcome) => outcome,
            Err(error) => Err(ChainError::Sink(SinkError::Append {
                stream: format!("{}'s finalized streams", self.config.name),
                reason: format!("the writer task stopped: {error}"),
                transient: true,
            })),
        };
        if outcome.is_err() {
            if let Some((_, task)) = self.prefetch.take() {
                task.abort();
            }
            self.finalized = None;
            self.unfinalized.clear();
            self.stream_tails.clear();
        }
        outcome
    }

    /// The blocks from `from` on (up to `head`; those up to `target` are final, read
    /// sparsely): the prefetched ones when they start there.
    async fn read_from(
        &mut self,
        from: u64,
        head: u64,
        target: u64,
    ) -> Result<Vec<FetchedBlock>, ChainError> {
        if let Some((start, task)) = self.prefetch.take() {
            if start == from {
                if let Ok(result) = task.await {
                    let (blocks, sizer) = result?;
                    self.sizer = sizer;
                    return Ok(blocks);
                }
            } else {
                task.abort();
            }
        }
        let with_transactions = self.with_transactions();
        fetch::ranges(
            &self.rpc,
            &mut self.sizer,
            (from, head),
            self.config.parallel_ranges,
            with_transactions,
            target,
        )
        .await
    }

    fn start_prefetch(&mut self, from: u64, head: u64, target: u64) {
        let (rpc, mut sizer) = (self.rpc.clone(), self.sizer.clone());
        let (parallel, with_transactions) = (self.config.parallel_ranges, self.with_transactions());
        let task = tokio::spawn(async move {
            let range = (from, head);
            let blocks =
                fetch::ranges(&rpc, &mut sizer, range, parallel, with_transactions, target).await?;
            Ok((blocks, sizer))
        });
        self.prefetch = Some((from, task));
    }

    /// The records of `blocks`, in order, after reading the token metadata and pool
    /// balances they need.
    async fn build(&mut self, blocks: &[FetchedBlock]) -> Result<Vec<BlockRecords>, ChainError> {
        let (tokens, pools) = records::contracts(blocks);
        self.tokens.load(&self.rpc, tokens, pools).await?;
        let balances = if self.config.entities.iter().any(|(e, _)| e == "dex_trade") {
            PoolBalances::load(&self.rpc, &self.tokens, blocks).await?
        } else {
            PoolBalances::default()
        };
        let context = records::Context {
            chain: &self.config.name,
            tokens: &self.tokens,
            balances: &balances,
            entities: &self.config.entities,
        };
        blocks.iter().map(|block| records::build(context, &mut self.prices, block)).collect()
    }

    /// Only `log` and `decoded_log` need the transactions (their sender and recipient).
    fn with_transactions(&self) -> bool {
        self.config.entities.iter().any(|(e, _)| e == "log" || e == "decoded_log")
    }

    fn tip(&self) -> &Header {
        self.unfinalized
            .back()
            .map(|p| &p.header)
            .or(self.finalized.as_ref())
            .expect("started before reading")
    }

    async fn final_target(&self, head: u64) -> Result<u64, ChainError> {
        match self.config.finality {
            Finality::Depth(confirmations) => Ok(head.saturating_sub(confirmations)),
            Finality::Tag => Ok(fetch::header(&self.rpc, json!("finalized"))
                .await?
                .map_or(0, |h| h.number)
                .min(head)),
        }
    }

    /// Loads the checkpoint (or starts at `start_block`) and the streams' tails; zerolag
    /// blocks of the checkpoint the node no longer has get reorg markers.
    async fn start(&mut self, target: u64) -> Result<(), ChainError> {
        let chain = self.config.name.clone();
        for (entity, _) in &self.config.entities {
            if let Some(last) = self.sink.last_block(&chain, entity).await? {
                self.stream_tails.insert(entity.clone(), last);
            }
        }
        match self.sink.load_checkpoint(&chain).await? {
            Some(checkpoint) => {
                tracing::info!(%chain, finalized = checkpoint.finalized.number, unfinalized = checkpoint.unfinalized.len(), "resuming from the stored position");
                self.finalized = Some(checkpoint.finalized);
                self.unfinalized = checkpoint
                    .unfinalized
                    .into_iter()
                    .map(|header| Pending { header, records: None })
                    .collect();
                self.check_unfinalized().await?;
            }
            None => {
                // Genesis has no logs and no parent to check against: block 1 is the earliest.
                let first = match self.config.start_block {
                    StartBlock::Number(n) => n.max(1),
                    StartBlock::Latest => target + 1,
                };
                // The block before the first is the position: its hash anchors the parent check.
                let anchor = fetch::header(&self.rpc, json!(fetch::hex_quantity(first - 1)))
                    .await?
                    .ok_or_else(|| {
                        ChainError::Config(format!("start_block {first} is past the node's head"))
                    })?;
                tracing::info!(%chain, first, "starting without a stored position");
                self.finalized = Some(anchor);
            }
        }
        if let Some(finalized) = &self.finalized {
            self.status.ingested(finalized.number, finalized.timestamp);
        }
        Ok(())
    }

    /// After a restart: the checkpoint's zerolag blocks the node no longer has are orphans.
    async fn check_unfinalized(&mut self) -> Result<(), ChainError> {
        if self.unfinalized.is_empty() {
            return Ok(());
        }
        let numbers: Vec<u64> = self.unfinalized.iter().map(|p| p.header.number).collect();
        let canonical = fetch::headers(&self.rpc, &numbers).await?;
        let first_bad = self
            .unfinalized
            .iter()
            .zip(&canonical)
            .position(|(p, c)| c.as_ref().map(|c| &c.hash) != Some(&p.header.hash));
        if let Some(index) = first_bad {
            let orphans: Vec<Header> = self.unfinalized.drain(index..).map(|p| p.header).collect();
            self.mark_orphans(&orphans).await?;
        }
        Ok(())
    }

    /// A reorg was seen: drop the zerolag blocks the node no longer has, marking each.
    async fn reorg(&mut self) -> Result<(), ChainError> {
        if let Some((_, task)) = self.prefetch.take() {
            task.abort();
        }
        let numbers: Vec<u64> = self.unfinalized.iter().map(|p| p.header.number).collect();
        let canonical = fetch::headers(&self.rpc, &numbers).await?;
        let keep = self
            .unfinalized
            .iter()
            .zip(&canonical)
            .take_while(|(p, c)| c.as_ref().map(|c| &c.hash) == Some(&p.header.hash))
            .count();
        if keep == 0 {
            self.check_finalized_anchor().await?;
        }
        let orphans: Vec<Header> = self.unfinalized.drain(keep..).map(|p| p.header).collect();
        if orphans.is_empty() {
            // The node's view moved between two reads; the next step reads again.
            return Ok(());
        }
        tracing::warn!(chain = %self.config.name, orphans = orphans.len(), from = orphans.first().map(|h| h.number), "reorg: dropping blocks the node no longer has");
        self.status.reorg();
        self.mark_orphans(&orphans).await?;
        self.save().await
    }

    /// The finalized anchor must still be the node's; otherwise the reorg went deeper than
    /// the finality rule and nothing written can be taken back.
    async fn check_finalized_anchor(&self) -> Result<(), ChainError> {
        let Some(finalized) = &self.finalized else { return Ok(()) };
        let theirs = fetch::header(&self.rpc, json!(fetch::hex_quantity(finalized.number))).await?;
        match theirs {
            Some(theirs) if theirs.hash == finalized.hash => Ok(()),
            theirs => Err(ChainError::DeepReorg {
                number: finalized.number,
                ours: finalized.hash.clone(),
                theirs: theirs.map_or_else(|| "no block".to_owned(), |h| h.hash),
            }),
        }
    }

    async fn mark_orphans(&mut self, orphans: &[Header]) -> Result<(), ChainError> {
        if orphans.is_empty() {
            return Ok(());
        }
        self.settle().await?;
        for (entity, zerolag) in &self.config.entities {
            if !zerolag {
                continue;
            }
            let markers = orphans
                .iter()
                .map(|orphan| records::reorg_marker(&self.config.name, entity, orphan))
                .collect::<Result<Vec<_>, _>>()?;
            self.sink.append(&self.config.name, entity, true, markers).await?;
        }
        Ok(())
    }

    async fn append_zerolag(&mut self, blocks: &[BlockRecords]) -> Result<(), ChainError> {
        self.settle().await?;
        for (entity, zerolag) in &self.config.entities {
            if !zerolag {
                continue;
            }
            let records = collect(blocks.iter(), entity);
            if !records.is_empty() {
                self.sink.append(&self.config.name, entity, true, records).await?;
            }
        }
        Ok(())
    }

    /// Moves the blocks up to `target` to the finalized streams: their appends and then the
    /// checkpoint run in a task of their own ([`Finalized::Writing`]) while the next blocks
    /// are read and built; whatever writes next settles it first.
    async fn finalize(&mut self, target: u64) -> Result<Finalized, ChainError> {
        let ready = self.unfinalized.iter().take_while(|p| p.header.number <= target).count();
        if ready == 0 {
            return Ok(Finalized::Nothing);
        }
        let newest = self.unfinalized[ready - 1].header.clone();
        let theirs = fetch::header(&self.rpc, json!(fetch::hex_quantity(newest.number))).await?;
        if theirs.as_ref().map(|h| &h.hash) != Some(&newest.hash) {
            self.reorg().await?;
            return Ok(Finalized::Done);
        }
        // Blocks known only from the checkpoint are read again; the parent chain links them
        // to `newest`, which the node just confirmed.
        if self.unfinalized.iter().take(ready).any(|p| p.records.is_none()) {
            self.reload(ready).await?;
        }
        self.settle().await?;
        let mut blocks: Vec<BlockRecords> =
            self.unfinalized.drain(..ready).map(|p| p.records.expect("reloaded above")).collect();
        let mut appends = Vec::new();
        for (entity, _) in &self.config.entities {
            let after = self.stream_tails.get(entity).copied().map_or(0, |t| t + 1);
            // The blocks are ours now: their records move to the append, not copied.
            let records: Vec<StreamRecord> = blocks
                .iter_mut()
                .filter(|b| b.header.number >= after)
                .filter_map(|b| b.by_entity.remove(entity.as_str()))
                .flatten()
                .collect();
            if !records.is_empty() {
                appends.push((entity.clone(), records));
            }
        }
        self.finalized = Some(newest.clone());
        let checkpoint = self.checkpoint().expect("finalized was just set");
        let (sink, status, chain) =
            (self.sink.clone(), self.status.clone(), self.config.name.clone());
        self.writing = Some(tokio::spawn(async move {
            for (entity, records) in appends {
                sink.append(&chain, &entity, false, records).await?;
            }
            sink.save_checkpoint(&chain, &checkpoint).await?;
            status.ingested(newest.number, newest.timestamp);
            Ok(())
        }));
        Ok(Finalized::Writing)
    }

    /// Reads the records of the first `count` unfinalized blocks that lack them.
    async fn reload(&mut self, count: usize) -> Result<(), ChainError> {
        let from = self.unfinalized[0].header.number;
        let to = self.unfinalized[count - 1].header.number;
        let mut fetched = Vec::new();
        let mut next = from;
        while next <= to {
            let with_transactions = self.with_transactions();
            let range = (next, to);
            let blocks =
                fetch::blocks(&self.rpc, &mut self.sizer, range, with_transactions, 0).await?;
            next = blocks.last().map_or(to, |b| b.header.number) + 1;
            fetched.extend(blocks);
        }
        // Every block, by number: the pending ones may be a sparse run (blocks read from
        // their logs alone leave out those without logs).
        let mut built: HashMap<u64, BlockRecords> =
            self.build(&fetched).await?.into_iter().map(|r| (r.header.number, r)).collect();
        for pending in self.unfinalized.iter_mut().take(count) {
            let block = built.remove(&pending.header.number);
            if block.as_ref().map(|b| &b.header.hash) != Some(&pending.header.hash) {
                return Err(ChainError::Inconsistent { from, to });
            }
            if pending.records.is_none() {
                pending.records = block;
            }
        }
        Ok(())
    }

    async fn save(&mut self) -> Result<(), ChainError> {
        self.settle().await?;
        let Some(checkpoint) = self.checkpoint() else { return Ok(()) };
        self.sink.save_checkpoint(&self.config.name, &checkpoint).await?;
        Ok(())
    }

    fn checkpoint(&self) -> Option<Checkpoint> {
        Some(Checkpoint {
            finalized: self.finalized.clone()?,
            unfinalized: self.unfinalized.iter().map(|p| p.header.clone()).collect(),
        })
    }
}

/// What a finalize did.
enum Finalized {
    /// No block was final yet.
    Nothing,
    /// Its writes (and the checkpoint) run in the ingester's `writing` task.
    Writing,
    /// It wrote already (a reorg's markers and checkpoint).
    Done,
}

/// Copies of the records of `entity` of `blocks`, in block order.
fn collect<'a>(blocks: impl Iterator<Item = &'a BlockRecords>, entity: &str) -> Vec<StreamRecord> {
    blocks
        .filter_map(|b| b.by_entity.get(entity))
        .flat_map(|records| records.iter().cloned())
        .collect()
}

/// An ingester's rounds, as [`run_rounds`] drives them.
pub(crate) trait Rounds {
    /// One round; true when it moved (so the next starts without waiting).
    async fn step(&mut self) -> Result<bool, ChainError>;
}

impl Rounds for Ingester {
    async fn step(&mut self) -> Result<bool, ChainError> {
        Ingester::step(self).await
    }
}

/// Runs `ingester`'s rounds until the task is dropped: after a round that did not move it
/// waits `poll` (or until `wake`); a failed round is logged, shown in `status` and tried
/// again after a backoff doubling from `poll` up to [`MAX_ERROR_BACKOFF`].
pub(crate) async fn run_rounds(
    ingester: &mut impl Rounds,
    chain: &str,
    status: &ChainStatus,
    poll: Duration,
    wake: &tokio::sync::Notify,
) {
    let mut failures = 0u32;
    loop {
        match ingester.step().await {
            Ok(progressed) => {
                if failures > 0 {
                    status.error(None);
                }
                failures = 0;
                if !progressed {
                    tokio::select! {
                        () = tokio::time::sleep(poll) => {}
                        () = wake.notified() => {}
                    }
                }
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::warn!(%chain, %error, failures, "chain ingester step failed; retrying");
                status.error(Some(error.to_string()));
                let delay = poll.saturating_mul(1 << failures.min(5)).min(MAX_ERROR_BACKOFF);
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Stops a task when dropped (a heads or slots follower ends with its ingester).
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
