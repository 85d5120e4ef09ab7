//! Token metadata (`decimals()`, `name()`, `symbol()`) and pool tokens (`token0()`,
//! `token1()`), read with `eth_call` at the head once per address and cached for the
//! ingester's life. Many real tokens lack some of these (or answer `bytes32` names, like
//! MKR): a missing or undecodable answer is cached as `None`, and records carry null.

use std::collections::HashMap;

use alloy_dyn_abi::{DynSolType, DynSolValue};
use alloy_primitives::U256;
use serde_json::json;

use crate::ChainError;
use crate::fetch::FetchedBlock;
use crate::rpc::{Call, RpcClient};

const DECIMALS: &str = "0x313ce567";
const NAME: &str = "0x06fdde03";
const SYMBOL: &str = "0x95d89b41";
const TOKEN0: &str = "0x0dfe1681";
const TOKEN1: &str = "0xd21220a7";
const BALANCE_OF: &str = "0x70a08231";

/// What a token contract says about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenInfo {
    pub decimals: Option<u8>,
    pub name: Option<String>,
    pub symbol: Option<String>,
}

/// The cache.
#[derive(Debug, Default)]
pub struct Tokens {
    tokens: HashMap<String, TokenInfo>,
    pools: HashMap<String, Option<(String, String)>>,
}

impl Tokens {
    pub fn token(&self, address: &str) -> Option<&TokenInfo> {
        self.tokens.get(address)
    }

    /// `(token0, token1)` of a Uniswap-style pool, when it answered both.
    pub fn pool(&self, address: &str) -> Option<&(String, String)> {
        self.pools.get(address).and_then(Option::as_ref)
    }

    /// Reads what is not cached yet of `tokens` and `pools` (pools first, so their tokens
    /// are read too), in batches.
    ///
    /// # Errors
    /// RPC transport failures (a contract's revert is an answer, cached as unknown).
    pub async fn load(
        &mut self,
        rpc: &RpcClient,
        tokens: impl IntoIterator<Item = String>,
        pools: impl IntoIterator<Item = String>,
    ) -> Result<(), ChainError> {
        let mut pools: Vec<String> =
            pools.into_iter().filter(|p| !self.pools.contains_key(p)).collect();
        pools.sort();
        pools.dedup();
        if !pools.is_empty() {
            let calls =
                pools.iter().flat_map(|pool| [call(pool, TOKEN0), call(pool, TOKEN1)]).collect();
            let answers = rpc.batch(calls).await?;
            for (pool, pair) in pools.iter().zip(answers.chunks(2)) {
                let address = |index: usize| {
                    let bytes = decode_hex(pair[index].as_ref().ok()?.as_str()?)?;
                    match DynSolType::Address.abi_decode(&bytes).ok()? {
                        DynSolValue::Address(a) => Some(format!("{a:#x}")),
                        _ => None,
                    }
                };
                self.pools.insert(pool.clone(), address(0).zip(address(1)));
            }
        }
        let pool_tokens: Vec<String> =
            pools.iter().filter_map(|p| self.pool(p).cloned()).flat_map(|(a, b)| [a, b]).collect();
        let mut wanted: Vec<String> = tokens
            .into_iter()
            .chain(pool_tokens)
            .filter(|t| !self.tokens.contains_key(t))
            .collect();
        wanted.sort();
        wanted.dedup();
        if wanted.is_empty() {
            return Ok(());
        }
        let calls = wanted
            .iter()
            .flat_map(|t| [call(t, DECIMALS), call(t, NAME), call(t, SYMBOL)])
            .collect();
        let answers = rpc.batch(calls).await?;
        for (token, answer) in wanted.into_iter().zip(answers.chunks(3)) {
            let bytes = |index: usize| decode_hex(answer[index].as_ref().ok()?.as_str()?);
            let info = TokenInfo {
                decimals: bytes(0).and_then(|b| decode_decimals(&b)),
                name: bytes(1).and_then(|b| decode_text(&b)),
                symbol: bytes(2).and_then(|b| decode_text(&b)),
            };
            self.tokens.insert(token, info);
        }
        Ok(())
    }
}

/// Uniswap V3 pools' balances of their two tokens at the end of blocks: `balanceOf(pool)`
/// called at the block's hash, for the blocks of a batch that have V3 swaps. A V3 swap
/// carries no reserves (a V2 pair's `Sync` does); its `token_reserve` comes from these.
#[derive(Debug, Default)]
pub struct PoolBalances {
    /// (block number, pool, token) → the balance, `None` when the node did not answer it
    /// (a full node keeps only recent states).
    balances: HashMap<(u64, String, String), Option<U256>>,
}

impl PoolBalances {
    pub fn get(&self, block: u64, pool: &str, token: &str) -> Option<U256> {
        *self.balances.get(&(block, pool.to_owned(), token.to_owned()))?
    }

    /// The balances `blocks`' V3 swaps need, read in batches; `tokens` must know the pools.
    ///
    /// # Errors
    /// RPC transport failures (a call the node refuses is an unknown balance).
    pub async fn load(
        rpc: &RpcClient,
        tokens: &Tokens,
        blocks: &[FetchedBlock],
    ) -> Result<Self, ChainError> {
        let swap = crate::events::selector(crate::records::SWAP_V3);
        let mut wanted: Vec<(u64, &str, &str, &str)> = Vec::new();
        for block in blocks {
            for log in &block.logs {
                if log.topics.first() != Some(&swap) || log.topics.len() != 3 {
                    continue;
                }
                let Some((token0, token1)) = tokens.pool(&log.address) else { continue };
                for token in [token0, token1] {
                    wanted.push((block.header.number, &block.header.hash, &log.address, token));
                }
            }
        }
        wanted.sort_unstable();
        wanted.dedup();
        let calls = wanted
            .iter()
            .map(|(_, hash, pool, token)| {
                let data = format!("{BALANCE_OF}{:0>64}", pool.trim_start_matches("0x"));
                Call::new("eth_call", json!([{"to": token, "data": data}, {"blockHash": hash}]))
            })
            .collect();
        let answers = rpc.batch(calls).await?;
        let balances = wanted
            .into_iter()
            .zip(answers)
            .map(|((number, _, pool, token), answer)| {
                let balance = answer.ok().and_then(|v| decode_hex(v.as_str()?)).and_then(|bytes| {
                    match DynSolType::Uint(256).abi_decode(&bytes).ok()? {
                        DynSolValue::Uint(n, _) => Some(n),
                        _ => None,
                    }
                });
                ((number, pool.to_owned(), token.to_owned()), balance)
            })
            .collect();
        Ok(Self { balances })
    }
}

fn call(to: &str, data: &str) -> Call {
    Call::new("eth_call", json!([{"to": to, "data": data}, "latest"]))
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let bytes = alloy_primitives::hex::decode(text).ok()?;
    (!bytes.is_empty()).then_some(bytes)
}

fn decode_decimals(bytes: &[u8]) -> Option<u8> {
    match DynSolType::Uint(256).abi_decode(bytes).ok()? {
        DynSolValue::Uint(n, _) => u8::try_from(n).ok().filter(|d| *d <= 77),
        _ => None,
    }
}

/// An ABI `string`, or a `bytes32` padded with zeros (early tokens).
fn decode_text(bytes: &[u8]) -> Option<String> {
    if let Ok(DynSolValue::String(text)) = DynSolType::String.abi_decode(bytes) {
        return (!text.is_empty()).then_some(text);
    }
    if bytes.len() == 32 {
        let end = bytes.iter().position(|b| *b == 0).unwrap_or(32);
        return std::str::from_utf8(&bytes[..end])
            .ok()
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_decode_from_strings_and_from_bytes32() {
        let string = DynSolValue::String("USD Coin".into()).abi_encode();
        assert_eq!(decode_text(&string).as_deref(), Some("USD Coin"));
        let mut word = [0u8; 32];
        word[..3].copy_from_slice(b"MKR");
        assert_eq!(decode_text(&word).as_deref(), Some("MKR"));
        assert_eq!(decode_text(&[0u8; 32]), None);
    }
}
