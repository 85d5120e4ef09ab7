//! Reading a Solana node: `getSlot`, `getBlocks` (the produced slots of a range) and
//! `getBlock`, and what its errors mean.
//!
//! A slot can have no block: its leader skipped it. `getBlocks` lists only produced slots,
//! but a node or a provider behind a load balancer may still answer `getBlock` for a listed
//! slot with "skipped" — -32007 (skipped, or missing after a snapshot jump), -32009 (skipped,
//! or missing in long-term storage), or a -32004 whose message says skipped. Those are no
//! block. Any other -32004 ("Block not available for slot"), -32014 (block status not yet
//! available) or a `null` result means not available *yet*: the slot is asked again later,
//! never passed over.

use serde_json::json;

use super::Commitment;
use crate::ChainError;
use crate::rpc::{Call, NodeError, RawResult, RpcClient};

/// What `getBlock` gave for a slot.
#[derive(Debug)]
pub enum Fetched {
    Block(RawResult),
    /// The slot has no block.
    Skipped,
    /// The node does not have the block yet; ask again.
    NotYet(NodeError),
}

/// The node's processed slot (its head) and the newest slot at `commitment`, in one request.
///
/// # Errors
/// RPC failures.
pub async fn slots(rpc: &RpcClient, commitment: Commitment) -> Result<(u64, u64), ChainError> {
    let calls = vec![
        Call::new("getSlot", json!([{"commitment": "processed"}])),
        Call::new("getSlot", json!([{"commitment": commitment.as_str()}])),
    ];
    let mut answers = rpc.batch(calls).await?.into_iter().map(|answer| {
        let value = answer.map_err(|error| error.into_error("getSlot"))?;
        value.as_u64().ok_or_else(|| ChainError::Malformed {
            method: "getSlot",
            reason: format!("not a slot number: {value}"),
        })
    });
    let head = answers.next().expect("two answers")?;
    let at_commitment = answers.next().expect("two answers")?;
    Ok((head.max(at_commitment), at_commitment))
}

/// The produced slots in `from..=to`, ascending.
///
/// # Errors
/// RPC failures and node errors.
pub async fn produced(
    rpc: &RpcClient,
    from: u64,
    to: u64,
    commitment: Commitment,
) -> Result<Vec<u64>, ChainError> {
    let params = json!([from, to, {"commitment": commitment.as_str()}]);
    let raw = rpc
        .call_raw(Call::new("getBlocks", params))
        .await?
        .map_err(|error| error.into_error("getBlocks"))?;
    let mut slots: Vec<u64> = serde_json::from_str(raw.get()).map_err(|error| {
        ChainError::Malformed { method: "getBlocks", reason: error.to_string() }
    })?;
    slots.retain(|slot| (from..=to).contains(slot));
    slots.sort_unstable();
    slots.dedup();
    Ok(slots)
}

/// The blocks of `slots` (batched and sent concurrently by the client), in order.
///
/// # Errors
/// RPC failures, and node errors other than the skipped and not-yet ones.
pub async fn blocks(
    rpc: &RpcClient,
    slots: &[u64],
    commitment: Commitment,
) -> Result<Vec<Fetched>, ChainError> {
    let calls = slots
        .iter()
        .map(|slot| {
            Call::new(
                "getBlock",
                json!([slot, {
                    "encoding": "json",
                    "transactionDetails": "full",
                    "maxSupportedTransactionVersion": 0,
                    "rewards": false,
                    "commitment": commitment.as_str(),
                }]),
            )
        })
        .collect();
    rpc.batch_raw(calls).await?.into_iter().map(classify).collect()
}

fn classify(answer: Result<RawResult, NodeError>) -> Result<Fetched, ChainError> {
    match answer {
        Ok(raw) if raw.get().trim() == "null" => {
            Ok(Fetched::NotYet(NodeError { code: 0, message: "the node answered null".to_owned() }))
        }
        Ok(raw) => Ok(Fetched::Block(raw)),
        Err(error) if is_skipped(&error) => Ok(Fetched::Skipped),
        Err(error) if matches!(error.code, -32004 | -32014) => Ok(Fetched::NotYet(error)),
        Err(error) => Err(error.into_error("getBlock")),
    }
}

/// Whether a `getBlock` error says the slot has no block.
pub fn is_skipped(error: &NodeError) -> bool {
    matches!(error.code, -32007 | -32009)
        || error.code == -32004 && error.message.to_ascii_lowercase().contains("skipped")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(code: i64, message: &str) -> NodeError {
        NodeError { code, message: message.to_owned() }
    }

    #[test]
    fn skipped_and_not_yet_are_told_apart() {
        let skipped = |e: NodeError| matches!(classify(Err(e)), Ok(Fetched::Skipped));
        let not_yet = |e: NodeError| matches!(classify(Err(e)), Ok(Fetched::NotYet(_)));
        assert!(skipped(error(
            -32007,
            "Slot 5 was skipped, or missing due to ledger jump to recent snapshot"
        )));
        assert!(skipped(error(-32009, "Slot 5 was skipped, or missing in long-term storage")));
        assert!(skipped(error(-32004, "Block not available for slot 5: slot was skipped")));
        assert!(not_yet(error(-32004, "Block not available for slot 5")));
        assert!(not_yet(error(-32014, "Block status not yet available for slot 5")));
        assert!(classify(Err(error(-32602, "Invalid params"))).is_err());
    }
}
