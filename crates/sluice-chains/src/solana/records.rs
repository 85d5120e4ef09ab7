//! A block's non-vote transactions as `nonvoting_transaction` records, in the shape of
//! `docs/streams.md`, written field by field ([`RecordWriter`]: the checks of the ingest
//! endpoint, no `Map` per record).

use chrono::{DateTime, SecondsFormat};
use sluice_core::streams::{RecordWriter, StreamRecord};

use super::block::{self, Account, Block, Instruction, TokenBalance, Version};
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

fn transaction(
    slot: u64,
    block: &Block<'_>,
    index: usize,
    entry: &block::Entry<'_>,
    timestamp: &str,
) -> Result<StreamRecord, ChainError> {
    let Some(meta) = &entry.meta else {
        return Err(malformed(slot, &format!("transaction {index} has no meta")));
    };
    let fee =
        meta.fee.ok_or_else(|| malformed(slot, &format!("transaction {index} has no fee")))?;
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
    let inner_sets = meta.inner_instructions.as_deref().unwrap_or_default();
    check_indexes(slot, accounts.len(), message, inner_sets)?;

    // About the record's size: each account as an object, the instructions, the logs,
    // balances and token balances, the rest.
    let instructions_size = |list: &[Instruction<'_>]| {
        list.iter().map(|i| i.accounts.len() * 4 + i.data.len() + 96).sum::<usize>()
    };
    let estimate = accounts.len() * 112
        + instructions_size(&message.instructions)
        + inner_sets.iter().map(|set| instructions_size(&set.instructions) + 32).sum::<usize>()
        + meta
            .log_messages
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|l| l.len() + 3)
            .sum::<usize>()
        + (meta.pre_balances.len() + meta.post_balances.len()) * 16
        + (meta.pre_token_balances.as_ref().map_or(0, Vec::len)
            + meta.post_token_balances.as_ref().map_or(0, Vec::len))
            * 320
        + 1024;
    let mut w =
        RecordWriter::with_capacity(ENTITY, estimate).map_err(|error| malformed(slot, &error))?;
    w.raw("account_keys", |out| account_keys(out, &accounts));
    w.str("block_hash", block.blockhash);
    w.serialize("block_height", &block.block_height);
    w.u64("block_slot", slot);
    w.str("block_timestamp", timestamp);
    w.serialize("compute_units_consumed", &meta.compute_units_consumed);
    w.serialize("err", &meta.err);
    w.u64("fee", fee);
    w.raw("inner_instructions", |out| {
        list(out, inner_sets, |out, set| {
            out.extend_from_slice(b"{\"index\":");
            text::integer(out, set.index);
            out.extend_from_slice(b",\"instructions\":");
            instructions(out, &accounts, &set.instructions);
            out.push(b'}');
        });
    });
    w.raw("instructions", |out| instructions(out, &accounts, &message.instructions));
    w.raw("log_messages", |out| match &meta.log_messages {
        Some(lines) => list(out, lines, |out, line| text::cow(out, line)),
        None => out.extend_from_slice(b"null"),
    });
    w.u64("parent_slot", block.parent_slot);
    w.raw("post_balances", |out| list(out, &meta.post_balances, |out, n| text::integer(out, *n)));
    w.raw("post_token_balances", |out| token_balances(out, meta.post_token_balances.as_deref()));
    w.raw("pre_balances", |out| list(out, &meta.pre_balances, |out, n| text::integer(out, *n)));
    w.raw("pre_token_balances", |out| token_balances(out, meta.pre_token_balances.as_deref()));
    w.str("recent_block_hash", message.recent_blockhash);
    w.raw("signatures", |out| list(out, &tx.signatures, |out, s| text::borrowed(out, s)));
    w.str("signer", fee_payer);
    w.raw("signers", |out| {
        list(out, &message.account_keys[..signers], |out, s| text::borrowed(out, s));
    });
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

/// Fails on an instruction naming an account past the transaction's accounts: a reader must
/// be able to resolve every index of a record, and the writers below index without failing.
fn check_indexes(
    slot: u64,
    accounts: usize,
    message: &block::Message<'_>,
    inner_sets: &[block::InnerInstructions<'_>],
) -> Result<(), ChainError> {
    let all =
        message.instructions.iter().chain(inner_sets.iter().flat_map(|set| &set.instructions));
    for instruction in all {
        let past = std::iter::once(&instruction.program_id_index)
            .chain(&instruction.accounts)
            .find(|&&i| usize::from(i) >= accounts);
        if let Some(past) = past {
            return Err(malformed(
                slot,
                &format!("account index {past} past the transaction's accounts"),
            ));
        }
    }
    Ok(())
}

/// `{pubkey, signer, source, writable}` for each account.
fn account_keys(out: &mut Vec<u8>, accounts: &[Account<'_>]) {
    list(out, accounts, |out, account| {
        out.extend_from_slice(b"{\"pubkey\":");
        text::borrowed(out, account.pubkey);
        out.extend_from_slice(if account.signer {
            b",\"signer\":true"
        } else {
            b",\"signer\":false"
        });
        out.extend_from_slice(if account.from_lookup_table {
            b",\"source\":\"lookupTable\""
        } else {
            b",\"source\":\"transaction\""
        });
        out.extend_from_slice(if account.writable {
            b",\"writable\":true}"
        } else {
            b",\"writable\":false}"
        });
    });
}

/// A JSON array of `items`, each written by `item`.
fn list<T>(out: &mut Vec<u8>, items: &[T], mut item: impl FnMut(&mut Vec<u8>, &T)) {
    out.push(b'[');
    for (n, value) in items.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        item(out, value);
    }
    out.push(b']');
}

/// `{accounts, data, program_id, stack_height}` for each instruction: the accounts as
/// indexes into `account_keys` (as the node gives them; keys would make the record a sixth
/// larger), the program as its key. Every index was checked against `accounts`.
fn instructions(out: &mut Vec<u8>, accounts: &[Account<'_>], list_of: &[Instruction<'_>]) {
    list(out, list_of, |out, instruction| {
        out.extend_from_slice(b"{\"accounts\":");
        list(out, &instruction.accounts, |out, &i| text::integer(out, i));
        out.extend_from_slice(b",\"data\":");
        text::borrowed(out, instruction.data);
        out.extend_from_slice(b",\"program_id\":");
        text::borrowed(out, accounts[usize::from(instruction.program_id_index)].pubkey);
        out.extend_from_slice(b",\"stack_height\":");
        match instruction.stack_height {
            Some(height) => text::integer(out, height),
            None => out.extend_from_slice(b"null"),
        }
        out.push(b'}');
    });
}

fn token_balances(out: &mut Vec<u8>, balances: Option<&[TokenBalance<'_>]>) {
    list(out, balances.unwrap_or_default(), |out, b| {
        out.extend_from_slice(b"{\"account_index\":");
        text::integer(out, b.account_index);
        out.extend_from_slice(b",\"amount\":");
        text::borrowed(out, b.ui_token_amount.amount);
        out.extend_from_slice(b",\"decimals\":");
        text::integer(out, b.ui_token_amount.decimals);
        out.extend_from_slice(b",\"mint\":");
        text::borrowed(out, b.mint);
        out.extend_from_slice(b",\"owner\":");
        text::opt_borrowed(out, b.owner);
        out.extend_from_slice(b",\"program_id\":");
        text::opt_borrowed(out, b.program_id);
        out.extend_from_slice(b",\"ui_amount_string\":");
        text::cow(out, &b.ui_token_amount.ui_amount_string);
        out.push(b'}');
    });
}

/// JSON values written as serde_json writes them, without its escape scan where none can
/// be needed.
mod text {
    use std::borrow::Cow;

    /// A string borrowed from the node's answer by serde_json: it borrows a string only when
    /// the text has no escape sequence, and rejects raw control characters, so the string
    /// holds nothing JSON must escape and is written between quotes as it is.
    pub(super) fn borrowed(out: &mut Vec<u8>, value: &str) {
        out.reserve(value.len() + 2);
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    }

    pub(super) fn opt_borrowed(out: &mut Vec<u8>, value: Option<&str>) {
        match value {
            Some(value) => borrowed(out, value),
            None => out.extend_from_slice(b"null"),
        }
    }

    /// A string that serde_json may have unescaped into an owned copy (log lines): escaped
    /// again when owned.
    #[allow(clippy::ptr_arg, reason = "whether the string was unescaped is the point")]
    pub(super) fn cow(out: &mut Vec<u8>, value: &Cow<'_, str>) {
        match value {
            Cow::Borrowed(value) => borrowed(out, value),
            Cow::Owned(value) => {
                serde_json::to_writer(out, value).expect("a string always serializes");
            }
        }
    }

    pub(super) fn integer(out: &mut Vec<u8>, value: impl itoa::Integer) {
        out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }
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
    fn instruction_accounts_are_indexes_that_resolve_to_the_nodes_keys() {
        let text = fixture("slot-100000000.json");
        let node: Value = serde_json::from_str(&text).unwrap();
        let block = build(100_000_000, &text, None).unwrap();
        let mut inner_seen = 0;
        for record in values(&block) {
            let tx = &node["transactions"][record["txn_index"].as_u64().unwrap() as usize];
            let keys = tx["transaction"]["message"]["accountKeys"].as_array().unwrap();
            let theirs = tx["transaction"]["message"]["instructions"].as_array().unwrap();
            let sets = tx["meta"]["innerInstructions"].as_array().unwrap();
            let inner = record["inner_instructions"].as_array().unwrap();
            assert_eq!(inner.len(), sets.len());
            let pairs = record["instructions"].as_array().unwrap().iter().zip(theirs).chain(
                inner.iter().zip(sets).flat_map(|(ours, set)| {
                    assert_eq!(ours["index"], set["index"]);
                    let ours = ours["instructions"].as_array().unwrap();
                    let set = set["instructions"].as_array().unwrap();
                    inner_seen += set.len();
                    ours.iter().zip(set)
                }),
            );
            for (ours, node_instruction) in pairs {
                assert_eq!(ours["accounts"], node_instruction["accounts"]);
                for index in ours["accounts"].as_array().unwrap() {
                    let index = index.as_u64().unwrap() as usize;
                    assert_eq!(record["account_keys"][index]["pubkey"], keys[index]);
                }
                let program = node_instruction["programIdIndex"].as_u64().unwrap() as usize;
                assert_eq!(ours["program_id"], keys[program]);
                assert_eq!(ours["data"], node_instruction["data"]);
            }
        }
        assert!(inner_seen > 0, "the fixture has inner instructions");
    }

    #[test]
    fn records_are_serde_jsons_compact_text() {
        for (slot, name) in
            [(100_000_000, "slot-100000000.json"), (154_808_473, "slot-154808473-v0.json")]
        {
            for record in build(slot, &fixture(name), None).unwrap().records {
                let value: Value = serde_json::from_slice(record.value()).unwrap();
                assert_eq!(serde_json::to_vec(&value).unwrap(), record.value(), "{name}");
            }
        }
    }

    #[test]
    fn a_non_vote_without_a_fee_is_malformed_and_a_vote_without_one_is_left_out() {
        let mut block: Value = serde_json::from_str(&fixture("slot-100000000.json")).unwrap();
        // Transaction 0 is a vote, 3 is not.
        block["transactions"][0]["meta"].as_object_mut().unwrap().remove("fee");
        let records = build(100_000_000, &block.to_string(), None).unwrap().records;
        assert_eq!(records.len(), 4);
        block["transactions"][3]["meta"].as_object_mut().unwrap().remove("fee");
        let error = build(100_000_000, &block.to_string(), None).unwrap_err();
        assert!(error.to_string().contains("transaction 3 has no fee"), "{error}");
    }

    #[test]
    fn a_block_of_votes_without_height_or_time_gives_nothing() {
        let block = build(1_021_085, &fixture("slot-1021085-votes-only.json"), None).unwrap();
        assert!(block.records.is_empty());
        assert_eq!(block.time, None);
    }
}
