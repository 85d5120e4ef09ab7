//! `sluice-feed` generates realistic chain records for every catalog stream: EVM logs,
//! decoded logs and token transfers, DEX trades (`dex`), Solana non-vote transactions and Hyperliquid blocks,
//! trades, fills, orders and ledger events. `sluice feed` sends them to a running server, and
//! `sluice serve --demo` runs gentle in-process feeds, so a fresh install has data to filter.
//!
//! It depends on `sluice-core` only for the record schemas (`sluice_core::streams`), which
//! every generated record satisfies; it must not depend on the API, the runtime or any I/O
//! crate. Start reading at [`Generator`]; the per-family shapes are in `evm`, `solana` and
//! `hyperliquid`, block numbering in `blocks`.
//!
//! Generation is deterministic: one seed and one sequence of `now` values give the same
//! records. Heights and times follow each chain's cadence anchored to the wall clock, so the
//! records look current.

mod accounts;
mod blocks;
mod chains;
mod dex;
mod encoding;
mod evm;
mod hyperliquid;
mod solana;

use chrono::{DateTime, SecondsFormat, Utc};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value};

pub use chains::{Token, well_known_tokens};

use dex::DexFeed;
use evm::{EvmEntity, EvmFeed};
use hyperliquid::{HyperliquidEntity, HyperliquidFeed};
use solana::SolanaFeed;

/// Why a generator could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeedError {
    /// The caller asked for an entity without a record schema; not retryable.
    #[error("cannot generate {chain}/{entity}: unknown entity (no record schema)")]
    UnknownEntity { chain: String, entity: String },
}

enum Family {
    Evm(EvmFeed),
    Solana(SolanaFeed),
    Dex(DexFeed),
    Hyperliquid(HyperliquidFeed),
}

/// An endless, deterministic source of records for one chain stream.
pub struct Generator {
    chain: String,
    entity: &'static str,
    rng: StdRng,
    family: Family,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("chain", &self.chain)
            .field("entity", &self.entity)
            .finish()
    }
}

/// Streams of one seed must still differ, or every stream of a demo would carry the same
/// transaction hashes.
fn stream_seed(seed: u64, chain: &str, entity: &str) -> u64 {
    // FNV-1a: stable across Rust versions, unlike `DefaultHasher`.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in chain.bytes().chain([b'/']).chain(entity.bytes()) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    hash ^ seed
}

impl Generator {
    /// A generator of `chain`/`entity` records. The entity decides the record shape (see
    /// `docs/streams.md`); the chain decides block cadence and well-known tokens, and any
    /// chain name works (a chain the generator does not know gets a generic 2-second cadence
    /// and no well-known tokens).
    ///
    /// # Errors
    /// [`FeedError::UnknownEntity`] when `entity` has no schema in `sluice_core::streams`.
    pub fn new(chain: &str, entity: &str, seed: u64) -> Result<Self, FeedError> {
        let unknown = || FeedError::UnknownEntity { chain: chain.into(), entity: entity.into() };
        let schema = sluice_core::streams::entity_schema(entity).ok_or_else(unknown)?;
        let mut rng = StdRng::seed_from_u64(stream_seed(seed, chain, entity));
        let cadence = chains::cadence(chain);
        let tokens = well_known_tokens(chain);
        let evm =
            |entity, rng: &mut StdRng| Family::Evm(EvmFeed::new(entity, rng, cadence, tokens));
        let hyperliquid = |entity, rng: &mut StdRng| {
            Family::Hyperliquid(HyperliquidFeed::new(entity, rng, cadence))
        };
        let family = match schema.entity {
            "log" => evm(EvmEntity::Log, &mut rng),
            "decoded_log" => evm(EvmEntity::DecodedLog, &mut rng),
            "erc20_token_transfer" => evm(EvmEntity::Erc20, &mut rng),
            "erc721_token_transfer" => evm(EvmEntity::Erc721, &mut rng),
            "erc1155_token_transfer" => evm(EvmEntity::Erc1155, &mut rng),
            "dex_trade" => Family::Dex(DexFeed::new(chain, &mut rng, cadence, tokens)),
            "nonvoting_transaction" => Family::Solana(SolanaFeed::new(&mut rng, cadence, tokens)),
            "block" => hyperliquid(HyperliquidEntity::Block, &mut rng),
            "trade" => hyperliquid(HyperliquidEntity::Trade, &mut rng),
            "fill" => hyperliquid(HyperliquidEntity::Fill, &mut rng),
            "order" => hyperliquid(HyperliquidEntity::Order, &mut rng),
            "misc_event" => hyperliquid(HyperliquidEntity::MiscEvent, &mut rng),
            _ => return Err(unknown()),
        };
        Ok(Self { chain: chain.to_owned(), entity: schema.entity, rng, family })
    }

    /// Makes `share` (0 to 1) of an EVM stream's token picks a well-known token of the
    /// chain (`docs/streams.md`; 0.25 by default); other streams are unchanged. A demo uses a
    /// high share so that a filter on USDC soon has records to pass.
    #[must_use]
    pub fn with_well_known_share(mut self, share: f64) -> Self {
        if let Family::Evm(feed) = &mut self.family {
            feed.well_known_share = share.clamp(0.0, 1.0);
        }
        self
    }

    pub fn chain(&self) -> &str {
        &self.chain
    }

    pub fn entity(&self) -> &str {
        self.entity
    }

    /// The next record of the stream, as of `now`: its block is the chain's block at `now`
    /// or, while that block still has records to give, the current one. Records of a
    /// Hyperliquid stream come wrapped as `{"payload": {...}}`.
    pub fn next_record(&mut self, now: DateTime<Utc>) -> Map<String, Value> {
        let now_ms = now.timestamp_millis();
        match &mut self.family {
            Family::Evm(feed) => feed.next_record(&mut self.rng, now_ms),
            Family::Solana(feed) => feed.next_record(&mut self.rng, now_ms),
            Family::Dex(feed) => feed.next_record(&mut self.rng, now_ms),
            Family::Hyperliquid(feed) => {
                let mut wrapped = Map::new();
                wrapped.insert(
                    "payload".into(),
                    Value::Object(feed.next_record(&mut self.rng, now_ms)),
                );
                wrapped
            }
        }
    }
}

/// `count` records of `generator` as NDJSON (one JSON object per line, each line ending in
/// `\n`), the body the ingest endpoint takes.
pub fn ndjson_batch(generator: &mut Generator, count: usize, now: DateTime<Utc>) -> Vec<u8> {
    let mut body = Vec::with_capacity(count * 600);
    for _ in 0..count {
        let record = generator.next_record(now);
        serde_json::to_writer(&mut body, &record)
            .expect("a JSON map with string keys always serialises");
        body.push(b'\n');
    }
    body
}

/// Block time as EVM and Solana records carry it: RFC 3339, whole seconds, UTC.
fn block_timestamp(time_ms: i64) -> String {
    DateTime::from_timestamp(time_ms.div_euclid(1000), 0)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn unknown_entities_are_refused_and_any_chain_is_accepted() {
        assert_eq!(
            Generator::new("base", "transaction", 1).unwrap_err(),
            FeedError::UnknownEntity { chain: "base".into(), entity: "transaction".into() }
        );
        let generator = Generator::new("arbitrum", "log", 1).unwrap();
        assert_eq!((generator.chain(), generator.entity()), ("arbitrum", "log"));
    }

    #[test]
    fn streams_of_one_seed_differ() {
        let now = Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 0).unwrap();
        let mut base = Generator::new("base", "erc20_token_transfer", 1).unwrap();
        let mut polygon = Generator::new("polygon", "erc20_token_transfer", 1).unwrap();
        assert_ne!(
            base.next_record(now)["transaction_hash"],
            polygon.next_record(now)["transaction_hash"]
        );
    }

    #[test]
    fn ndjson_batch_writes_one_object_per_line() {
        let now = Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 0).unwrap();
        let mut generator = Generator::new("hyperliquid", "fill", 7).unwrap();
        let body = ndjson_batch(&mut generator, 5, now);
        let text = String::from_utf8(body).unwrap();
        assert!(text.ends_with('\n'));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5);
        for line in lines {
            let value: Value = serde_json::from_str(line).unwrap();
            assert!(value["payload"]["tid"].is_u64());
        }
    }

    #[test]
    fn block_timestamps_are_whole_seconds_in_utc() {
        assert_eq!(block_timestamp(1_748_779_205_999), "2025-06-01T12:00:05Z");
    }
}
