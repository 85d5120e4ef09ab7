//! The Solana ingester: a Solana JSON-RPC node turned into the `nonvoting_transaction`
//! stream, with an exact resume after a crash. `docs/chains.md` ("Solana") is the prose.
//!
//! Start at [`ingester::SolanaIngester`]: it lists produced slots with `getBlocks`
//! ([`fetch`]), reads their blocks with `getBlock`, reads each answer in place ([`block`],
//! which also holds the vote rule) and writes its non-vote transactions ([`records`]).
//! There is no zerolag stream: records are written once the block has the configured
//! commitment (`finalized` by default), so there are no reorgs to undo.

pub mod block;
pub mod fetch;
pub mod ingester;
pub mod records;

use std::time::Duration;

use crate::config::StartBlock;
use crate::rpc::RpcSettings;

pub use ingester::SolanaIngester;

/// The commitment a block must have before its transactions are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commitment {
    /// Rooted by a supermajority: never rolled back (~13 s behind the tip on mainnet).
    Finalized,
    /// Voted on by a supermajority (optimistic confirmation): ~1 s behind the tip; a
    /// confirmed block has never been rolled back on mainnet, but the protocol allows it.
    Confirmed,
}

impl Commitment {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Finalized => "finalized",
            Self::Confirmed => "confirmed",
        }
    }
}

impl std::str::FromStr for Commitment {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "finalized" => Ok(Self::Finalized),
            "confirmed" => Ok(Self::Confirmed),
            other => Err(format!("commitment {other:?} is not \"finalized\" or \"confirmed\"")),
        }
    }
}

/// One Solana chain's ingester.
#[derive(Debug, Clone)]
pub struct SolanaConfig {
    /// The chain's catalog name (`solana`).
    pub name: String,
    /// JSON-RPC URL over HTTP(S). May hold an API key: it is never logged as given.
    pub rpc_url: String,
    /// The node's WebSocket endpoint: `slotSubscribe` wakes the ingester at each slot; the
    /// slot is still polled as well.
    pub ws_url: Option<String>,
    /// Where a chain without a stored position starts: a slot, or `Latest` (the slot after
    /// the newest one with the commitment at the first start).
    pub start: StartBlock,
    pub commitment: Commitment,
    /// How often the node's slot is polled while caught up.
    pub poll_interval: Duration,
    /// Slots per `getBlocks` call (the method allows at most 500,000).
    pub max_slot_range: u64,
    /// Blocks read (and appended in one append) per step.
    pub blocks_per_step: usize,
    pub rpc: RpcSettings,
}

impl SolanaConfig {
    /// A configuration with the defaults: `finalized`, from the latest slot, a 400 ms poll
    /// (one slot), 4 blocks per JSON-RPC batch (a mainnet block is 1–5 MB of JSON).
    pub fn new(name: &str, rpc_url: &str) -> Self {
        Self {
            name: name.to_owned(),
            rpc_url: rpc_url.to_owned(),
            ws_url: None,
            start: StartBlock::Latest,
            commitment: Commitment::Finalized,
            poll_interval: Duration::from_millis(400),
            max_slot_range: 10_000,
            blocks_per_step: 32,
            rpc: RpcSettings { max_batch: 4, ..RpcSettings::default() },
        }
    }
}
