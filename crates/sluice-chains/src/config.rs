//! One chain's ingester configuration, as `[[chains]]` in the config file or
//! `--chain name=url` give it.

use std::time::Duration;

use crate::rpc::RpcSettings;

/// Where a chain without a stored position starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartBlock {
    /// The first block past the finality rule at the first start.
    Latest,
    Number(u64),
}

impl std::str::FromStr for StartBlock {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        if text == "latest" {
            return Ok(Self::Latest);
        }
        text.parse::<u64>()
            .map(Self::Number)
            .map_err(|_| format!("start_block {text:?} is neither a block number nor \"latest\""))
    }
}

/// When a block goes into the finalized streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finality {
    /// `confirmations` blocks deep: block `n` is final once the head is `n + confirmations`.
    Depth(u64),
    /// The node's `finalized` block tag (post-merge Ethereum, OP-stack chains).
    Tag,
}

/// Default confirmations per chain of the catalog; 12 for any other chain. Chosen so that a
/// reorg deeper than that has not been seen on the chain in normal operation: Polygon PoS
/// has had reorgs of dozens of blocks before its 2022 fork; OP-stack and ZK chains reorg only
/// with their sequencer.
pub fn default_confirmations(chain: &str) -> u64 {
    match chain {
        "ethereum" => 64,
        "polygon" => 128,
        "base" | "abstract" => 10,
        _ => 12,
    }
}

/// One chain's ingester.
#[derive(Debug, Clone)]
pub struct ChainConfig {
    /// The chain's catalog name (`base`).
    pub name: String,
    /// JSON-RPC URL over HTTP(S). May hold an API key: it is never logged as given.
    pub rpc_url: String,
    pub start_block: StartBlock,
    pub finality: Finality,
    /// Head polling interval.
    pub poll_interval: Duration,
    /// The node's WebSocket endpoint (`ws://`, `wss://`): when given, `newHeads` wakes the
    /// ingester as soon as a block arrives; the head is still polled as well.
    pub ws_url: Option<String>,
    /// Largest `eth_getLogs` block range tried.
    pub max_block_range: u64,
    /// Consecutive ranges read at once when behind the head.
    pub parallel_ranges: usize,
    /// Entities to write and whether each has a `.zerolag` twin (from the catalog).
    pub entities: Vec<(String, bool)>,
    /// Token addresses worth one US dollar per token, for `dex_trade` USD values (lowercase).
    pub stablecoins: Vec<String>,
    pub rpc: RpcSettings,
}

impl ChainConfig {
    /// A configuration with the defaults for `name`: every EVM entity with its zerolag twin,
    /// the chain's confirmations and stablecoins, a 1-second poll.
    pub fn new(name: &str, rpc_url: &str) -> Self {
        Self {
            name: name.to_owned(),
            rpc_url: rpc_url.to_owned(),
            start_block: StartBlock::Latest,
            finality: Finality::Depth(default_confirmations(name)),
            poll_interval: Duration::from_secs(1),
            ws_url: None,
            max_block_range: 2000,
            parallel_ranges: 4,
            entities: crate::records::ENTITIES.iter().map(|e| ((*e).to_owned(), true)).collect(),
            stablecoins: default_stablecoins(name).iter().map(|s| (*s).to_owned()).collect(),
            rpc: RpcSettings::default(),
        }
    }
}

/// USDC, USDT and DAI (and bridged variants) of the catalog's chains.
pub fn default_stablecoins(chain: &str) -> &'static [&'static str] {
    match chain {
        "ethereum" => &[
            "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48",
            "0xdac17f958d2ee523a2206206994597c13d831ec7",
            "0x6b175474e89094c44da98b954eedeac495271d0f",
        ],
        "base" => &[
            "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913",
            "0xd9aaec86b65d86f6a7b5b1b0c42ffa531710b6ca",
            "0x50c5725949a6f0c72e6c4a641f24049a917db0cb",
        ],
        "polygon" => &[
            "0x3c499c542cef5e3811e1192ce70d8cc03d5c3359",
            "0x2791bca1f2de4661ed88a30c99a7a9449aa84174",
            "0xc2132d05d31c914a87c6611c10748aeb04b58e8f",
            "0x8f3cf7ad23cd3cadbd9735aff958023239c6a063",
        ],
        "abstract" => &["0x84a71ccd554cc1b02749b35d22f684cc8ec987e1"],
        _ => &[],
    }
}
