//! What the generator knows about each chain: its block cadence (anchored to one real,
//! approximate height and time so that generated heights look current) and its well-known
//! tokens.

/// A real token contract of a chain, used for a share of generated transfers so that filters
/// on well-known addresses match something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    /// Contract address (EVM, lowercase `0x` hex) or mint (Solana, base58).
    pub address: &'static str,
    pub symbol: &'static str,
    pub name: &'static str,
    pub decimals: u8,
}

const fn token(
    address: &'static str,
    symbol: &'static str,
    name: &'static str,
    decimals: u8,
) -> Token {
    Token { address, symbol, name, decimals }
}

const BASE: &[Token] = &[
    token("0x833589fcd6edb6e08f4c7c32d4f71b54bda02913", "USDC", "USD Coin", 6),
    token("0x4200000000000000000000000000000000000006", "WETH", "Wrapped Ether", 18),
    token("0x50c5725949a6f0c72e6c4a641f24049a917db0cb", "DAI", "Dai Stablecoin", 18),
    token("0xd9aaec86b65d86f6a7b5b1b0c42ffa531710b6ca", "USDbC", "USD Base Coin", 6),
    token("0xcbb7c0000ab88b473b1f5afd9ef808440eed33bf", "cbBTC", "Coinbase Wrapped BTC", 8),
    token("0x940181a94a35a4569e4529a3cdfb74e38fd98631", "AERO", "Aerodrome", 18),
];

const POLYGON: &[Token] = &[
    token("0x3c499c542cef5e3811e1192ce70d8cc03d5c3359", "USDC", "USD Coin", 6),
    token("0x2791bca1f2de4661ed88a30c99a7a9449aa84174", "USDC.e", "USD Coin (PoS)", 6),
    token("0xc2132d05d31c914a87c6611c10748aeb04b58e8f", "USDT", "(PoS) Tether USD", 6),
    token("0x7ceb23fd6bc0add59e62ac25578270cff1b9f619", "WETH", "Wrapped Ether", 18),
    token(
        "0x0d500b1d8e8ef31e21c99d1db9a6444d3adf1270",
        "WPOL",
        "Wrapped Polygon Ecosystem Token",
        18,
    ),
    token("0x8f3cf7ad23cd3cadbd9735aff958023239c6a063", "DAI", "(PoS) Dai Stablecoin", 18),
];

const ETHEREUM: &[Token] = &[
    token("0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48", "USDC", "USD Coin", 6),
    token("0xdac17f958d2ee523a2206206994597c13d831ec7", "USDT", "Tether USD", 6),
    token("0xc02aaa39b223fe8d0a0e5c4f27ead9083c756cc2", "WETH", "Wrapped Ether", 18),
    token("0x6b175474e89094c44da98b954eedeac495271d0f", "DAI", "Dai Stablecoin", 18),
    token("0x2260fac5e5542a773aa44fbcfedf7c193bc2c599", "WBTC", "Wrapped BTC", 8),
];

const ABSTRACT: &[Token] = &[
    token("0x84a71ccd554cc1b02749b35d22f684cc8ec987e1", "USDC.e", "Bridged USDC (Stargate)", 6),
    token("0x3439153eb7af838ad19d56e1571fbd09333c2809", "WETH", "Wrapped Ether", 18),
];

const SOLANA: &[Token] = &[
    token("EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v", "USDC", "USD Coin", 6),
    token("Es9vMFrzaCERmJfrF4H2FYD4KCoNkY11McCe8BenwNYB", "USDT", "USDT", 6),
    token("So11111111111111111111111111111111111111112", "SOL", "Wrapped SOL", 9),
];

/// The well-known tokens the generator uses for `chain` (empty for chains it has none for).
pub fn well_known_tokens(chain: &str) -> &'static [Token] {
    match chain {
        "base" => BASE,
        "polygon" => POLYGON,
        "ethereum" => ETHEREUM,
        "abstract" => ABSTRACT,
        "solana" => SOLANA,
        _ => &[],
    }
}

/// Block cadence: block `anchor_number` was produced at `anchor_ms`, and one block follows
/// every `interval_ms`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cadence {
    pub(crate) anchor_number: u64,
    pub(crate) anchor_ms: i64,
    pub(crate) interval_ms: i64,
}

pub(crate) fn cadence(chain: &str) -> Cadence {
    let (anchor_number, anchor_seconds, interval_ms) = match chain {
        // Genesis, 2023-06-15T00:35:47Z; exactly 2 s blocks.
        "base" => (0, 1_686_789_347, 2_000),
        // The merge, 2022-09-15T06:42:59Z; 12 s slots (missed slots ignored).
        "ethereum" => (15_537_394, 1_663_224_179, 12_000),
        // Approximate: 2024-11-20T00:00:00Z.
        "polygon" => (65_000_000, 1_732_060_800, 2_000),
        // Approximate: mainnet launch, 2025-01-27.
        "abstract" => (0, 1_737_936_000, 1_000),
        // Slot, approximate: 2024-11-01T00:00:00Z; 400 ms slots.
        "solana" => (300_000_000, 1_730_419_200, 400),
        // Approximate: 2025-06-01T00:00:00Z.
        "hyperliquid" => (600_000_000, 1_748_736_000, 80),
        // Chains added by an operator's catalog file.
        _ => (10_000_000, 1_704_067_200, 2_000),
    };
    Cadence { anchor_number, anchor_ms: anchor_seconds * 1000, interval_ms }
}
