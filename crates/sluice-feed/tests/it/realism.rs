//! The records look like the chains they imitate.

use std::collections::HashMap;

use serde_json::Value;
use sluice_feed::well_known_tokens;

use crate::{body, generate};

fn is_hex(value: &Value, digits: usize) -> bool {
    value.as_str().is_some_and(|text| {
        text.len() == digits + 2
            && text.starts_with("0x")
            && text[2..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[test]
fn about_a_quarter_of_erc20_transfers_are_on_the_chains_well_known_tokens() {
    for chain in ["base", "polygon", "ethereum", "abstract"] {
        let tokens = well_known_tokens(chain);
        assert!(!tokens.is_empty(), "{chain}");
        let records = generate(chain, "erc20_token_transfer", 9, 10_000, 100);
        let known = records
            .iter()
            .filter(|(_, r)| {
                let address = r["token_address"].as_str().unwrap();
                tokens.iter().any(|t| t.address == address)
            })
            .count();
        let share = known as f64 / records.len() as f64;
        assert!((0.2..=0.3).contains(&share), "{chain}: {share}");
    }
    let base_usdc = "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913";
    let records = generate("base", "erc20_token_transfer", 9, 2_000, 100);
    let usdc = records.iter().find(|(_, r)| r["token_address"] == base_usdc).unwrap();
    assert_eq!(usdc.1["token_symbol"], "USDC");
}

#[test]
fn erc20_transfers_have_hex_of_the_right_lengths_and_consistent_decimal_amounts() {
    let decimals: HashMap<&str, u8> =
        well_known_tokens("base").iter().map(|t| (t.address, t.decimals)).collect();
    for (_, record) in generate("base", "erc20_token_transfer", 2, 2_000, 100) {
        for field in ["transaction_hash", "block_hash"] {
            assert!(is_hex(&record[field], 64), "{field}: {}", record[field]);
        }
        for field in ["token_address", "from_address", "to_address"] {
            assert!(is_hex(&record[field], 40), "{field}: {}", record[field]);
        }
        let raw = record["raw_amount_str"].as_str().unwrap();
        let amount = record["amount_str"].as_str().unwrap();
        assert!(raw.bytes().all(|b| b.is_ascii_digit()), "{raw}");
        assert!(amount.parse::<f64>().unwrap() > 0.0);
        if let Some(&decimals) = decimals.get(record["token_address"].as_str().unwrap()) {
            // The decimal string is the raw amount shifted by the token's decimals.
            let (whole, fraction) = amount.split_once('.').unwrap_or((amount, ""));
            assert!(fraction.len() <= usize::from(decimals));
            let padded = format!("{whole}{fraction:0<width$}", width = usize::from(decimals));
            assert_eq!(padded.trim_start_matches('0'), raw, "{amount} vs {raw}");
        }
    }
}

#[test]
fn evm_blocks_hold_several_records_with_increasing_numbers_and_log_indexes() {
    for entity in ["log", "erc20_token_transfer", "erc721_token_transfer", "erc1155_token_transfer"]
    {
        // Two records a second: a gentle demo feed.
        let records = generate("base", entity, 4, 2_000, 2);
        let mut blocks = 0;
        let mut previous: Option<(u64, u64)> = None;
        for (_, record) in &records {
            let number = record["block_number"].as_u64().unwrap();
            let log_index = record["log_index"].as_u64().unwrap();
            match previous {
                Some((block, index)) if block == number => {
                    // ERC-1155 batch items share their log's index.
                    assert!(log_index >= index, "{entity}: log index went back in {number}");
                }
                Some((block, _)) => {
                    assert!(number > block, "{entity}: block {number} after {block}");
                    blocks += 1;
                }
                None => blocks += 1,
            }
            previous = Some((number, log_index));
        }
        assert!(blocks > 10, "{entity}: {blocks} blocks");
        assert!(
            records.len() / blocks >= 2,
            "{entity}: {} records per block",
            records.len() / blocks
        );
    }
}

#[test]
fn heights_follow_the_chain_cadence_from_the_clock() {
    // Base: genesis 2023-06-15T00:35:47Z, one block every 2 seconds.
    let (_, record) = &generate("base", "log", 1, 1, 1)[0];
    let expected = (1_748_779_200 - 1_686_789_347) / 2;
    assert_eq!(record["block_number"], expected);
    assert_eq!(record["block_timestamp"], "2025-06-01T11:59:59Z");
}

#[test]
fn solana_transactions_use_base58_ids_and_balance_changes_add_up() {
    for (_, record) in generate("solana", "nonvoting_transaction", 6, 1_000, 100) {
        let id = record["txn_id"].as_str().unwrap();
        assert!((86..=88).contains(&id.len()), "{id}");
        assert_eq!(record["signatures"][0], record["txn_id"]);
        assert_eq!(record["account_keys"][0]["pubkey"], record["signer"]);
        assert_eq!(record["signers"][0], record["signer"]);
        assert_eq!(record["success"], record["err"].is_null());
        let total = |field: &str| -> u128 {
            record[field]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b["amount"].as_str().unwrap().parse::<u128>().unwrap())
                .sum()
        };
        assert_eq!(total("pre_token_balances"), total("post_token_balances"));
    }
}

#[test]
fn hyperliquid_fills_come_in_buyer_and_seller_pairs_of_one_trade() {
    let records = generate("hyperliquid", "fill", 8, 1_000, 100);
    for pair in records.chunks(2) {
        let (buyer, seller) = (body(&pair[0].1), body(&pair[1].1));
        assert_eq!(buyer["tid"], seller["tid"]);
        assert_eq!((buyer["side"].as_str(), seller["side"].as_str()), (Some("B"), Some("A")));
        assert_eq!(buyer["px"], seller["px"]);
        assert_ne!(buyer["crossed"], seller["crossed"], "exactly one side takes");
        assert!(is_hex(&buyer["hash"], 64));
    }
}

#[test]
fn hyperliquid_orders_open_before_they_fill_or_cancel() {
    let records = generate("hyperliquid", "order", 8, 3_000, 100);
    let mut open = std::collections::HashSet::new();
    let mut resolved = 0;
    for (_, record) in &records {
        let record = body(record);
        let oid = record["order"]["oid"].as_u64().unwrap();
        match record["status"].as_str().unwrap() {
            "open" => assert!(open.insert(oid)),
            status if status.ends_with("Rejected") => assert!(!open.contains(&oid)),
            _ => {
                assert!(open.remove(&oid), "{oid} resolved without being open");
                resolved += 1;
            }
        }
    }
    assert!(resolved > 500, "{resolved}");
}
