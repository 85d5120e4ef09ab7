//! A block's non-vote transactions as `nonvoting_transaction` records, in the shape of
//! `docs/streams.md`, written field by field ([`RecordWriter`]: the checks of the ingest
//! endpoint, no `Map` per record).

use chrono::{DateTime, SecondsFormat};
use serde::Serialize;
use sluice_core::streams::{RecordWriter, StreamRecord};

use super::block::{self, Account, Block, Instruction, Meta, TokenBalance, Version};
use crate::ChainError;

/// The entity a Solana ingester writes.
pub const ENTITY: &str = "nonvoting_transaction";

/// One block's records and what the ingester keeps of the block.
#[derive(Debug)]
pub struct SlotRecords {
    pub slot: u64,
    pub blockhash: String,
    /// The block's time, or the one carried forward (see [`build`]).
    pub time: Option<i64>,
    pub records: Vec<StreamRecord>,
}

/// The records of the block at `slot` in `text` (a `getBlock` result). A block without a
/// time (early slots) takes `fallback_time`, the time of the block before it; if there is
/// none either, a block with non-vote transactions is an error (a record needs its time).
///
/// # Errors
/// [`ChainError::Malformed`] when the answer is not a block or a record cannot be built.
pub fn build(slot: u64, text: &str, fallback_time: Option<i64>) -> Result<SlotRecords, ChainError> {
    let block: Block<'_> = serde_json::from_str(text).map_err(|error| malformed(slot, &error))?;
    let time = block.block_time.or(fallback_time);
    let mut records = Vec::new();
    let mut timestamp: Option<String> = None;
    for (index, entry) in block.transactions.iter().enumerate() {
        if entry.is_simple_vote() {
            continue;
        }
        let stamp = match &timestamp {
            Some(stamp) => stamp.as_str(),
            None => {
                let seconds = time.ok_or_else(|| ChainError::Malformed {
                    method: "getBlock",
                    reason: format!(
                        "slot {slot} has no blockTime and no earlier block's time is known; \
                         start at a later slot"
                    ),
                })?;
                timestamp.insert(rfc3339(seconds)).as_str()
            }
        };
        records.push(transaction(slot, &block, index, entry, stamp)?);
    }
    Ok(SlotRecords { slot, blockhash: block.blockhash.to_owned(), time, records })
}

fn malformed(slot: u64, error: &dyn std::fmt::Display) -> ChainError {
    ChainError::Malformed { method: "getBlock", reason: format!("slot {slot}: {error}") }
}

fn rfc3339(seconds: i64) -> String {
    DateTime::from_timestamp(seconds, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[derive(Serialize)]
struct AccountOut<'a> {
    pubkey: &'a str,
    signer: bool,
    source: &'static str,
    writable: bool,
}

#[derive(Serialize)]
struct InstructionOut<'a> {
    accounts: Vec<&'a str>,
    data: &'a str,
    program_id: &'a str,
    stack_height: Option<u32>,
}

#[derive(Serialize)]
struct InnerOut<'a> {
    index: u16,
    instructions: Vec<InstructionOut<'a>>,
}

#[derive(Serialize)]
struct TokenBalanceOut<'a> {
    account_index: u16,
    amount: &'a str,
    decimals: u8,
    mint: &'a str,
    owner: Option<&'a str>,
    program_id: Option<&'a str>,
    ui_amount_string: &'a str,
}

fn token_balances<'a>(balances: Option<&'a Vec<TokenBalance<'a>>>) -> Vec<TokenBalanceOut<'a>> {
    balances
        .map(|list| {
            list.iter()
                .map(|b| TokenBalanceOut {
                    account_index: b.account_index,
                    amount: b.ui_token_amount.amount,
                    decimals: b.ui_token_amount.decimals,
                    mint: b.mint,
                    owner: b.owner,
                    program_id: b.program_id,
                    ui_amount_string: &b.ui_token_amount.ui_amount_string,
                })
                .collect()
        })
        .unwrap_or_default()
}

fn instruction<'a>(
    slot: u64,
    accounts: &[Account<'a>],
    instruction: &Instruction<'a>,
) -> Result<InstructionOut<'a>, ChainError> {
    let key = |index: u16| {
        accounts.get(usize::from(index)).map(|a| a.pubkey).ok_or_else(|| {
            malformed(slot, &format!("account index {index} past the transaction's accounts"))
        })
    };
    Ok(InstructionOut {
        accounts: instruction.accounts.iter().map(|i| key(*i)).collect::<Result<_, _>>()?,
        data: instruction.data,
        program_id: key(instruction.program_id_index)?,
        stack_height: instruction.stack_height,
    })
}

fn transaction(
    slot: u64,
    block: &Block<'_>,
    index: usize,
    entry: &block::Entry<'_>,
    timestamp: &str,
) -> Result<StreamRecord, ChainError> {
    let meta: Meta<'_> = match entry.meta {
        Some(raw) => serde_json::from_str(raw.get()).map_err(|error| malformed(slot, &error))?,
        None => return Err(malformed(slot, &format!("transaction {index} has no meta"))),
    };
    let tx = &entry.transaction;
    let message = &tx.message;
    let accounts = block::accounts(message, meta.loaded_addresses.as_ref());
    let signature = *tx
        .signatures
        .first()
        .ok_or_else(|| malformed(slot, &format!("transaction {index} has no signature")))?;
    let signers =
        usize::from(message.header.num_required_signatures).min(message.account_keys.len());
    let fee_payer = message
        .account_keys
        .first()
        .ok_or_else(|| malformed(slot, &format!("transaction {index} has no accounts")))?;

    // About the record's size: the metadata's text, each account as an object, the rest.
    let estimate = entry.meta.map_or(0, |raw| raw.get().len()) + accounts.len() * 96 + 1024;
    let mut w =
        RecordWriter::with_capacity(ENTITY, estimate).map_err(|error| malformed(slot, &error))?;
    let account_list: Vec<AccountOut<'_>> = accounts
        .iter()
        .map(|a| AccountOut {
            pubkey: a.pubkey,
            signer: a.signer,
            source: if a.from_lookup_table { "lookupTable" } else { "transaction" },
            writable: a.writable,
        })
        .collect();
    w.serialize("account_keys", &account_list);
    w.str("block_hash", block.blockhash);
    w.serialize("block_height", &block.block_height);
    w.u64("block_slot", slot);
    w.str("block_timestamp", timestamp);
    w.serialize("compute_units_consumed", &meta.compute_units_consumed);
    w.serialize("err", &meta.err);
    w.u64("fee", meta.fee);
    let inner: Vec<InnerOut<'_>> = match &meta.inner_instructions {
        Some(sets) => sets
            .iter()
            .map(|set| {
                Ok(InnerOut {
                    index: set.index,
                    instructions: set
                        .instructions
                        .iter()
                        .map(|i| instruction(slot, &accounts, i))
                        .collect::<Result<_, ChainError>>()?,
                })
            })
            .collect::<Result<_, ChainError>>()?,
        None => Vec::new(),
    };
    w.serialize("inner_instructions", &inner);
    let outer: Vec<InstructionOut<'_>> = message
        .instructions
        .iter()
        .map(|i| instruction(slot, &accounts, i))
        .collect::<Result<_, _>>()?;
    w.serialize("instructions", &outer);
    w.serialize("log_messages", &meta.log_messages);
    w.u64("parent_slot", block.parent_slot);
    w.serialize("post_balances", &meta.post_balances);
    w.serialize("post_token_balances", &token_balances(meta.post_token_balances.as_ref()));
    w.serialize("pre_balances", &meta.pre_balances);
    w.serialize("pre_token_balances", &token_balances(meta.pre_token_balances.as_ref()));
    w.str("recent_block_hash", message.recent_blockhash);
    w.serialize("signatures", &tx.signatures);
    w.str("signer", fee_payer);
    w.serialize("signers", &message.account_keys[..signers]);
    w.serialize("success", &meta.err.is_none());
    w.str("txn_id", signature);
    w.u64("txn_index", index as u64);
    match entry.version {
        None => w.str("version", "legacy"),
        Some(Version::Text(text)) => w.str("version", text),
        Some(Version::Number(n)) => w.str("version", &n.to_string()),
    }
    w.finish().map_err(|error| malformed(slot, &error))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/tests/fixtures/solana/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(path).expect("the fixture is in the repository")
    }

    fn values(block: &SlotRecords) -> Vec<Value> {
        block.records.iter().map(|r| serde_json::from_slice(r.value()).expect("JSON")).collect()
    }

    #[test]
    fn votes_are_left_out_and_account_flags_match_json_parsed() {
        let block = build(100_000_000, &fixture("slot-100000000.json"), None).unwrap();
        let records = values(&block);
        // 10 transactions: 6 votes (two of them failed) and 4 others.
        let indexes: Vec<u64> = records.iter().map(|r| r["txn_index"].as_u64().unwrap()).collect();
        assert_eq!(indexes, vec![3, 4, 6, 7]);
        let parsed: Value =
            serde_json::from_str(&fixture("slot-100000000.jsonParsed.json")).unwrap();
        for record in &records {
            let index = record["txn_index"].as_u64().unwrap() as usize;
            let theirs = &parsed["transactions"][index]["transaction"]["message"]["accountKeys"];
            assert_eq!(&record["account_keys"], theirs, "transaction {index}");
            assert_eq!(record["block_timestamp"], "2021-10-06T07:18:25Z");
            assert_eq!(record["block_height"], 89_586_871);
            assert_eq!(record["parent_slot"], 99_999_999);
            assert_eq!(record["version"], "legacy");
            assert_eq!(record["success"], true);
            assert_eq!(record["signer"], record["account_keys"][0]["pubkey"]);
        }
        assert_eq!(block.records[0].key(), records[0]["txn_id"].as_str().unwrap());
    }

    #[test]
    fn a_v0_transaction_lists_its_loaded_addresses() {
        let block = build(154_808_473, &fixture("slot-154808473-v0.json"), None).unwrap();
        let records = values(&block);
        assert_eq!(records.len(), 1);
        let keys = records[0]["account_keys"].as_array().unwrap();
        assert_eq!(keys.len(), 6 + 24 + 11);
        assert_eq!(records[0]["version"], "0");
        assert_eq!(keys[6]["source"], "lookupTable");
        assert_eq!(keys[6]["pubkey"], "8SheGtsopRUDzdiD6v6BR9a6bqZ9QwywYQY99Fp5meNf");
        assert_eq!(keys[6]["writable"], true);
        assert_eq!(keys[40]["pubkey"], "HaNqpJUQeH2t6SB3tDJAtKV52fJM9rV1mGZrRrqMRZo1");
        assert_eq!(keys[40]["writable"], false);
        assert_eq!(records[0]["signers"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_block_of_votes_without_height_or_time_gives_nothing() {
        let block = build(1_021_085, &fixture("slot-1021085-votes-only.json"), None).unwrap();
        assert!(block.records.is_empty());
        assert_eq!(block.time, None);
    }
}
