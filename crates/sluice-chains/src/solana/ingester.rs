//! One Solana chain's ingester: follows the newest slot with the configured commitment,
//! lists the produced slots after its position (`getBlocks`), reads their blocks in batches
//! (`getBlock`) and appends their non-vote transactions to `<chain>.nonvoting_transaction`.
//!
//! Exact resume, as the EVM ingester's (see [`crate::sink`]): the blocks of a step go to the
//! stream in **one append**, slots in increasing order, every record carrying `block_slot`;
//! then the checkpoint (the last slot covered, produced or skipped) is stored. At start the
//! ingester reads the highest `block_slot` the stream holds and does not append a slot up to
//! it again, and reads the chain from the checkpoint on. A `kill -9` between the append and
//! the checkpoint therefore neither repeats nor skips a slot's transactions.

use std::collections::VecDeque;
use std::sync::Arc;

use sluice_core::streams::StreamRecord;

use super::SolanaConfig;
use super::fetch::{self, Fetched};
use super::records::{self, ENTITY};
use crate::ChainError;
use crate::config::StartBlock;
use crate::fetch::Header;
use crate::ingester::{AbortOnDrop, Rounds, run_rounds};
use crate::rpc::RpcClient;
use crate::sink::{ChainSink, Checkpoint};
use crate::status::ChainStatus;

/// One Solana chain's ingester.
pub struct SolanaIngester {
    config: SolanaConfig,
    rpc: RpcClient,
    sink: Arc<dyn ChainSink>,
    status: Arc<ChainStatus>,
    /// The first slot not yet covered; `None` until started (or after a failed append,
    /// which makes the ingester resume as after a crash).
    next: Option<u64>,
    /// Produced slots `getBlocks` listed and not yet written, and the last slot of the
    /// listed range.
    listed: VecDeque<u64>,
    listed_until: u64,
    /// The highest slot the stream holds: slots up to it are not appended again.
    tail: Option<u64>,
    /// The last written block's hash and time, for the checkpoint and for blocks without a
    /// time (which take the time of the block before them).
    last_hash: String,
    last_time: Option<i64>,
}

impl std::fmt::Debug for SolanaIngester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SolanaIngester").field("chain", &self.config.name).finish_non_exhaustive()
    }
}

impl SolanaIngester {
    /// # Errors
    /// [`ChainError::Config`] when the RPC client cannot be built.
    pub fn new(
        config: SolanaConfig,
        sink: Arc<dyn ChainSink>,
        status: Arc<ChainStatus>,
    ) -> Result<Self, ChainError> {
        let rpc = RpcClient::new(&config.rpc_url, config.rpc.clone())?;
        status.set_rpc(rpc.counters().clone());
        Ok(Self {
            config,
            rpc,
            sink,
            status,
            next: None,
            listed: VecDeque::new(),
            listed_until: 0,
            tail: None,
            last_hash: String::new(),
            last_time: None,
        })
    }

    /// A new status for `config` (the URL redacted), for the API to read.
    pub fn status_for(config: &SolanaConfig) -> Arc<ChainStatus> {
        Arc::new(ChainStatus::new(&config.name, &crate::rpc::redact_url(&config.rpc_url)))
    }

    /// Runs until the task is dropped: errors are logged, shown in the status and retried
    /// with backoff.
    pub async fn run(mut self) {
        let chain = self.config.name.clone();
        tracing::info!(%chain, rpc = %self.rpc.display_url(), commitment = self.config.commitment.as_str(), "solana ingester starting");
        let wake = Arc::new(tokio::sync::Notify::new());
        let _slots = self.config.ws_url.clone().map(|ws_url| {
            AbortOnDrop(tokio::spawn(crate::heads::follow_subscription(
                chain.clone(),
                ws_url,
                crate::heads::SOLANA_SLOTS,
                wake.clone(),
            )))
        });
        let (status, poll) = (self.status.clone(), self.config.poll_interval);
        run_rounds(&mut self, &chain, &status, poll, &wake).await;
    }

    /// One round: start (or resume) if needed, list the next produced slots, read up to
    /// `blocks_per_step` of them and append their records. True when it moved.
    ///
    /// # Errors
    /// RPC and sink failures; a listed slot whose block is not available yet when it is the
    /// first of the step.
    pub async fn step(&mut self) -> Result<bool, ChainError> {
        let commitment = self.config.commitment;
        let (head, committed) = fetch::slots(&self.rpc, commitment).await?;
        // The head's time is not read (it would cost a block); the processed slot is now.
        self.status.head(head, Some(chrono::Utc::now().timestamp()), committed);
        let next = match self.next {
            Some(next) => next,
            None => self.start(committed).await?,
        };
        if self.listed.is_empty() {
            if next > committed {
                return Ok(false);
            }
            let to = committed.min(next.saturating_add(self.config.max_slot_range.max(1) - 1));
            self.listed = fetch::produced(&self.rpc, next, to, commitment).await?.into();
            self.listed_until = to;
            if self.listed.is_empty() {
                // A range of skipped slots only.
                self.next = Some(to + 1);
                self.save(to).await?;
                return Ok(true);
            }
        }
        let chunk: Vec<u64> =
            self.listed.iter().take(self.config.blocks_per_step.max(1)).copied().collect();
        let fetched = fetch::blocks(&self.rpc, &chunk, commitment).await?;
        let mut built = Vec::new();
        let mut done = 0;
        let mut time = self.last_time;
        for (slot, answer) in chunk.iter().zip(fetched) {
            match answer {
                Fetched::Block(raw) => {
                    let block = records::build(*slot, raw.get(), time)?;
                    time = block.time.or(time);
                    built.push(block);
                }
                Fetched::Skipped => {}
                Fetched::NotYet(error) if done == 0 => {
                    return Err(ChainError::Node {
                        method: "getBlock",
                        code: error.code,
                        message: format!("slot {slot} is not available yet: {}", error.message),
                    });
                }
                // The slots before it are written; the next step asks for it again.
                Fetched::NotYet(_) => break,
            }
            done += 1;
        }
        let after = self.tail.map_or(0, |tail| tail + 1);
        let appended: Vec<StreamRecord> = built
            .iter_mut()
            .filter(|block| block.slot >= after)
            .flat_map(|block| std::mem::take(&mut block.records))
            .collect();
        if !appended.is_empty() {
            if let Err(error) = self.sink.append(&self.config.name, ENTITY, false, appended).await {
                // Whether it reached the stream is unknown: resume as after a crash.
                self.forget();
                return Err(error.into());
            }
        }
        self.listed.drain(..done);
        let covered = if self.listed.is_empty() { self.listed_until } else { chunk[done - 1] };
        if let Some(last) = built.last() {
            self.last_hash.clone_from(&last.blockhash);
            self.status.ingested(last.slot, time.unwrap_or_default());
        }
        self.last_time = time;
        self.next = Some(covered + 1);
        self.save(covered).await?;
        Ok(true)
    }

    /// Loads the checkpoint (or starts at `start`) and the stream's tail; answers the first
    /// slot to read.
    async fn start(&mut self, committed: u64) -> Result<u64, ChainError> {
        let chain = self.config.name.clone();
        self.tail = self.sink.last_block(&chain, ENTITY).await?;
        self.listed.clear();
        let next = match self.sink.load_checkpoint(&chain).await? {
            Some(checkpoint) => {
                let position = checkpoint.finalized;
                tracing::info!(%chain, slot = position.number, tail = ?self.tail, "resuming from the stored position");
                self.last_hash = position.hash;
                self.last_time = (position.timestamp != 0).then_some(position.timestamp);
                if let Some(time) = self.last_time {
                    self.status.ingested(position.number, time);
                }
                position.number + 1
            }
            None => {
                let first = match self.config.start {
                    StartBlock::Number(slot) => slot,
                    StartBlock::Latest => committed + 1,
                };
                tracing::info!(%chain, first, "starting without a stored position");
                // Stored at once: a crash before the first append must not make "latest"
                // mean a later slot at the next start.
                self.save(first.saturating_sub(1)).await?;
                first
            }
        };
        self.next = Some(next);
        Ok(next)
    }

    /// Forgets the position: the next step resumes from the checkpoint and the stream's tail.
    fn forget(&mut self) {
        self.next = None;
        self.listed.clear();
    }

    async fn save(&mut self, covered: u64) -> Result<(), ChainError> {
        let checkpoint = Checkpoint {
            finalized: Header {
                number: covered,
                hash: self.last_hash.clone(),
                parent_hash: String::new(),
                timestamp: self.last_time.unwrap_or_default(),
            },
            unfinalized: Vec::new(),
        };
        if let Err(error) = self.sink.save_checkpoint(&self.config.name, &checkpoint).await {
            self.forget();
            return Err(error.into());
        }
        Ok(())
    }
}

impl Rounds for SolanaIngester {
    async fn step(&mut self) -> Result<bool, ChainError> {
        SolanaIngester::step(self).await
    }
}
