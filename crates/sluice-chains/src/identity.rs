//! Chain identity: before a chain is ingested, its node must say it is that chain. An EVM
//! node's `eth_chainId` must be the catalog's chain id, a Solana node's `getGenesisHash` the
//! catalog's genesis hash (or the operator's override of either, for a test or private
//! chain). A node of the other family answers the method with an error (method not found):
//! that is a wrong family, not a mismatch. `docs/chains.md` ("Chain identity") is the prose.

use std::time::Duration;

use serde_json::{Value, json};

use crate::rpc::{Call, RpcClient, RpcSettings, redact_url};

/// What a chain's node must report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// An EVM node; `None`: the catalog knows no chain id (only the family is checked).
    Evm { chain_id: Option<u64> },
    /// A Solana node; `None`: the catalog knows no genesis hash.
    Solana { genesis_hash: Option<String> },
}

impl Expected {
    fn family(&self) -> &'static str {
        match self {
            Self::Evm { .. } => "an EVM",
            Self::Solana { .. } => "a Solana",
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Self::Evm { .. } => "chain id",
            Self::Solana { .. } => "genesis hash",
        }
    }

    fn expected(&self) -> String {
        match self {
            Self::Evm { chain_id: Some(id) } => id.to_string(),
            Self::Solana { genesis_hash: Some(hash) } => hash.clone(),
            _ => "not set in the catalog".to_owned(),
        }
    }

    /// The `[[chains]]` setting that overrides the expected value.
    fn setting(&self) -> &'static str {
        match self {
            Self::Evm { .. } => "chain_id",
            Self::Solana { .. } => "genesis_hash",
        }
    }
}

/// Why a chain's node was not accepted. `Mismatch` and `WrongFamily` are the operator's
/// (the URL or the override is wrong; retrying cannot help); `Unreachable` the node's or the
/// network's (retrying can help).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "chain {chain}: the node at {url} reports {what} {found}, but {chain}'s {what} is \
         {expected} (a test or private chain: set {setting} = {found_setting} in its [[chains]] \
         table)"
    )]
    Mismatch {
        chain: String,
        url: String,
        what: &'static str,
        expected: String,
        found: String,
        setting: &'static str,
        found_setting: String,
    },
    #[error(
        "chain {chain}: the node at {url} is not {family} node ({method} answered {answer}); \
         {chain}'s {what} is {expected}"
    )]
    WrongFamily {
        chain: String,
        url: String,
        family: &'static str,
        method: &'static str,
        answer: String,
        what: &'static str,
        expected: String,
    },
    #[error("chain {chain}: cannot check the node at {url}: {reason}")]
    Unreachable { chain: String, url: String, reason: String },
}

impl IdentityError {
    /// Whether asking again later can help (the node was not reached).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
    }
}

/// Asks the node at `rpc_url` who it is and compares with `expected`. Answers what the node
/// reported (the chain id in decimal, or the genesis hash).
///
/// # Errors
/// [`IdentityError`]: another chain, another family, or no answer within `timeout` (two
/// attempts).
pub async fn check(
    chain: &str,
    rpc_url: &str,
    expected: &Expected,
    timeout: Duration,
) -> Result<String, IdentityError> {
    let url = redact_url(rpc_url);
    let settings = RpcSettings { timeout, max_attempts: 2, ..RpcSettings::default() };
    let unreachable = |reason: String| IdentityError::Unreachable {
        chain: chain.to_owned(),
        url: url.clone(),
        reason,
    };
    let rpc = RpcClient::new(rpc_url, settings).map_err(|error| unreachable(error.to_string()))?;
    let method = match expected {
        Expected::Evm { .. } => "eth_chainId",
        Expected::Solana { .. } => "getGenesisHash",
    };
    let answer = rpc
        .call(Call::new(method, json!([])))
        .await
        .map_err(|error| unreachable(error.to_string()))?;
    let wrong_family = |answer: String| IdentityError::WrongFamily {
        chain: chain.to_owned(),
        url: url.clone(),
        family: expected.family(),
        method,
        answer,
        what: expected.what(),
        expected: expected.expected(),
    };
    let value =
        answer.map_err(|error| wrong_family(format!("error {}: {}", error.code, error.message)))?;
    let found = match expected {
        Expected::Evm { .. } => value
            .as_str()
            .and_then(|hex| u64::from_str_radix(hex.trim_start_matches("0x"), 16).ok())
            .map(|id| id.to_string()),
        Expected::Solana { .. } => {
            value.as_str().filter(|hash| !hash.is_empty()).map(str::to_owned)
        }
    }
    .ok_or_else(|| wrong_family(short(&value)))?;
    let matches = match expected {
        Expected::Evm { chain_id: Some(id) } => found == id.to_string(),
        Expected::Solana { genesis_hash: Some(hash) } => &found == hash,
        _ => true,
    };
    if !matches {
        let found_setting = match expected {
            Expected::Evm { .. } => found.clone(),
            Expected::Solana { .. } => format!("{found:?}"),
        };
        return Err(IdentityError::Mismatch {
            chain: chain.to_owned(),
            url,
            what: expected.what(),
            expected: expected.expected(),
            found,
            setting: expected.setting(),
            found_setting,
        });
    }
    Ok(found)
}

/// A JSON answer shortened for an error line.
fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}
