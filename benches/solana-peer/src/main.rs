//! Deserialises `getBlock` results (one JSON text per line of the corpus file) into Agave's
//! `UiConfirmedBlock` with serde_json, as an RPC client built on Agave's types does, and
//! reports non-vote transactions per second. Single-threaded.
//!
//! Usage: solana-peer CORPUS ROUNDS

use std::time::Instant;

use solana_transaction_status::{EncodedTransaction, UiConfirmedBlock, UiMessage};

const VOTE_PROGRAM: &str = "Vote111111111111111111111111111111111111111";

/// The simple-vote rule on the decoded block (counted outside the timed loop: the peer is
/// timed on deserialising alone).
fn non_votes(block: &UiConfirmedBlock) -> usize {
    let Some(transactions) = &block.transactions else { return 0 };
    transactions
        .iter()
        .filter(|tx| {
            let EncodedTransaction::Json(ui) = &tx.transaction else { return true };
            let UiMessage::Raw(message) = &ui.message else { return true };
            let legacy = tx.version.as_ref().is_none_or(|v| format!("{v:?}").contains("Legacy"));
            let vote = ui.signatures.len() < 3
                && legacy
                && message.instructions.len() == 1
                && message
                    .account_keys
                    .get(usize::from(message.instructions[0].program_id_index))
                    .is_some_and(|k| k == VOTE_PROGRAM);
            !vote
        })
        .count()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let corpus = std::fs::read_to_string(&args[1]).expect("corpus file");
    let rounds: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(3);
    let lines: Vec<&str> = corpus.lines().filter(|l| !l.is_empty()).collect();
    let count: usize = lines
        .iter()
        .map(|line| non_votes(&serde_json::from_str(line).expect("a UiConfirmedBlock")))
        .sum();
    for round in 0..rounds {
        let started = Instant::now();
        for line in &lines {
            let block: UiConfirmedBlock = serde_json::from_str(line).expect("a UiConfirmedBlock");
            std::hint::black_box(&block);
        }
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "{{\"tool\": \"agave-ui-confirmed-block\", \"round\": {round}, \"non_vote_transactions\": {count}, \"seconds\": {seconds:.4}, \"per_second\": {:.0}}}",
            count as f64 / seconds
        );
    }
}
