//! Chain ingesters: an EVM JSON-RPC node turned into Sluice's chain streams (`log`,
//! `decoded_log`, `erc20/721/1155_token_transfer`, `dex_trade` and their `.zerolag` twins),
//! with finality, reorgs and an exact resume; a Solana JSON-RPC node turned into
//! `nonvoting_transaction` ([`solana`]); a Hyperliquid node's output files turned into its
//! five streams ([`hyperliquid`]); the user's Kafka topics feeding any chain stream
//! ([`kafka_source`]); and the chain identity check both run at start
//! ([`identity`]). `docs/chains.md` is the prose version.
//!
//! Must not depend on `sluice-api` or `sluice-runtime`: records leave through a
//! [`ChainSink`] that the binary implements over the runtime's ingest path (the same checks as
//! `POST /api/v1/streams/…/records`). It depends on `sluice-bus` only to keep its position in
//! the stream log ([`LogPositions`]).
//!
//! Start reading at [`ingester::Ingester`]: it drives [`fetch`] (JSON-RPC reading with an
//! adaptive `eth_getLogs` range, over [`rpc::RpcClient`]), [`records`] (logs to records,
//! with [`events`] for ABI decoding and [`tokens`] for token metadata) and the finality and
//! reorg bookkeeping, and reports into a [`status::ChainStatus`].

pub mod config;
pub mod events;
pub mod fetch;
pub mod heads;
pub mod hyperliquid;
pub mod identity;
pub mod ingester;
pub mod kafka_source;
pub mod records;
pub mod rpc;
pub mod sink;
pub mod solana;
pub mod status;
pub mod tokens;
pub mod usd;

pub use config::{ChainConfig, Finality, StartBlock};
pub use hyperliquid::{HyperliquidConfig, HyperliquidIngester};
pub use ingester::Ingester;
pub use sink::{ChainSink, Checkpoint, LogPositions, SinkError};
pub use solana::{SolanaConfig, SolanaIngester};
pub use status::{ChainStatus, StatusSnapshot};

/// Errors of an ingester. Whose fault: `Config` the operator's; `Rpc`/`Node`/`Inconsistent`
/// the node's or the network's (retrying later can help); `Sink` the stream log's (retrying
/// can help when it says so); `DeepReorg` the chain's, and retrying cannot help until the
/// operator raises `confirmations` and restarts from an earlier block.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("chain configuration: {0}")]
    Config(String),
    #[error("RPC request to {url} failed: {reason}")]
    Rpc { url: String, reason: String },
    #[error("node answered {method} with error {code}: {message}")]
    Node { method: &'static str, code: i64, message: String },
    #[error("node answer to {method} is malformed: {reason}")]
    Malformed { method: &'static str, reason: String },
    #[error("the node's view changed while reading blocks {from}..={to} (a reorg at the tip)")]
    Inconsistent { from: u64, to: u64 },
    #[error(
        "block {number} was finalized as {ours} but the node now has {theirs}: a reorg deeper \
         than the finality rule; raise `confirmations`"
    )]
    DeepReorg { number: u64, ours: String, theirs: String },
    #[error(transparent)]
    Sink(#[from] SinkError),
}
