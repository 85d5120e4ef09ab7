//! Solana non-vote transactions: transfers, token transfers and swaps, with the program logs
//! and token balance changes they leave.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::{Map, Value, json};

use crate::accounts::Accounts;
use crate::blocks::BlockCursor;
use crate::chains::{Cadence, Token};
use crate::encoding::{base58, format_units, random_base58};

const SYSTEM_PROGRAM: &str = "11111111111111111111111111111111";
const TOKEN_PROGRAM: &str = "TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA";
const COMPUTE_BUDGET: &str = "ComputeBudget111111111111111111111111111111";
const JUPITER: &str = "JUP6LkbZbjS1jKKwapdHNy74zcZ3tLUZoi5QNyVTaV4";
const SIGNATURE_FEE: u64 = 5_000;

fn random_key(rng: &mut StdRng) -> String {
    random_base58(rng, 32)
}

struct Mint {
    address: String,
    decimals: u8,
}

pub(crate) struct SolanaFeed {
    blocks: BlockCursor,
    wallets: Accounts,
    well_known: Vec<Mint>,
    mints: Vec<Mint>,
    block_height: Option<(u64, u64)>,
    recent_block_hash: String,
    next_txn_index: u64,
}

impl SolanaFeed {
    pub(crate) fn new(rng: &mut StdRng, cadence: Cadence, well_known: &[Token]) -> Self {
        let mint = |address: String, decimals| Mint { address, decimals };
        Self {
            blocks: BlockCursor::new(cadence, (10, 200), true),
            wallets: Accounts::new(rng, 500, random_key, 0.3),
            well_known: well_known.iter().map(|t| mint(t.address.to_owned(), t.decimals)).collect(),
            mints: (0..60)
                .map(|_| mint(random_key(rng), *[6u8, 9].choose(rng).expect("non-empty")))
                .collect(),
            block_height: None,
            recent_block_hash: random_key(rng),
            next_txn_index: 0,
        }
    }

    fn is_mint(&self, key: &str) -> bool {
        self.well_known.iter().chain(&self.mints).any(|m| m.address == key)
    }

    fn pick_mint(&self, rng: &mut StdRng) -> &Mint {
        if !self.well_known.is_empty() && rng.gen_bool(crate::evm::WELL_KNOWN_SHARE) {
            self.well_known.choose(rng).expect("non-empty")
        } else {
            self.mints.choose(rng).expect("mints are generated")
        }
    }

    #[allow(
        clippy::too_many_lines,
        reason = "one transaction drawn in a fixed order from the seeded generator: the order of \
                  the draws fixes every seed's records, and reads best in one place"
    )]
    pub(crate) fn next_record(&mut self, rng: &mut StdRng, now_ms: i64) -> Map<String, Value> {
        let (block, new_block) = self.blocks.next(rng, now_ms);
        if new_block {
            // Block height counts produced blocks: about 7% of slots are skipped.
            let height = match self.block_height {
                None => block.number / 100 * 93,
                Some((slot, height)) => height + ((block.number - slot) * 93 / 100).max(1),
            };
            self.block_height = Some((block.number, height));
            self.next_txn_index = rng.gen_range(0..20);
        }
        let (_, block_height) = self.block_height.expect("set on the first block");
        let txn_index = self.next_txn_index;
        self.next_txn_index += 1 + rng.gen_range(0..8);

        let signer = self.wallets.pick(rng);
        let signature_count = if rng.gen_bool(0.9) { 1 } else { 2 };
        let signatures: Vec<String> =
            (0..signature_count).map(|_| random_base58(rng, 64)).collect();
        let priority_fee: u64 = if rng.gen_bool(0.7) { rng.gen_range(0..200_000) } else { 0 };
        let mut account_keys = vec![signer.clone()];
        if signature_count == 2 {
            account_keys.push(self.wallets.pick(rng));
        }
        let mut log_messages = Vec::new();
        let mut pre_balances = Vec::new();
        let mut post_balances = Vec::new();
        let failed = rng.gen_bool(0.04);
        let units_limit = 200_000 + rng.gen_range(0..1_200_000);

        let invoke =
            |program: &str, depth: u32, lines: &[&str], units: u32, messages: &mut Vec<String>| {
                messages.push(format!("Program {program} invoke [{depth}]"));
                messages.extend(lines.iter().map(|line| format!("Program log: {line}")));
                if depth == 1 || program != SYSTEM_PROGRAM {
                    messages.push(format!(
                        "Program {program} consumed {units} of {units_limit} compute units"
                    ));
                }
                messages.push(format!("Program {program} success"));
            };
        invoke(COMPUTE_BUDGET, 1, &[], 150, &mut log_messages);

        let kind = rng.gen_range(0..100);
        let (main_program, instruction) = if kind < 30 {
            let to = self.wallets.pick(rng);
            account_keys.push(to);
            account_keys.push(SYSTEM_PROGRAM.to_owned());
            if !failed {
                invoke(SYSTEM_PROGRAM, 1, &[], 150, &mut log_messages);
            }
            (SYSTEM_PROGRAM, 1)
        } else {
            let mint = self.pick_mint(rng);
            let (mint_address, decimals) = (mint.address.clone(), mint.decimals);
            let source = self.wallets.pick(rng);
            let destination = self.wallets.pick(rng);
            let recipient = self.wallets.pick(rng);
            account_keys.extend([source, destination]);
            let raw: u64 = 10f64.powf(rng.gen_range(0.0..6.0) + f64::from(decimals)) as u64;
            let before_source: u64 = raw.saturating_add(rng.gen_range(0..raw.max(1)));
            let before_destination: u64 = rng.gen_range(0..raw.max(1).saturating_mul(3));
            let moved = if failed { 0 } else { raw };
            let balance = |index: usize, owner: &str, amount: u64| {
                json!({
                    "account_index": index,
                    "mint": mint_address,
                    "owner": owner,
                    "amount": amount.to_string(),
                    "decimals": decimals,
                    "ui_amount_string": format_units(u128::from(amount), decimals),
                })
            };
            let source_index = account_keys.len() - 2;
            pre_balances.push(balance(source_index, &signer, before_source));
            pre_balances.push(balance(source_index + 1, &recipient, before_destination));
            post_balances.push(balance(source_index, &signer, before_source - moved));
            post_balances.push(balance(source_index + 1, &recipient, before_destination + moved));
            let swap = kind >= 65;
            if swap {
                account_keys.push(JUPITER.to_owned());
                if !failed {
                    invoke(
                        JUPITER,
                        1,
                        &["Instruction: Route"],
                        rng.gen_range(40_000..180_000),
                        &mut log_messages,
                    );
                    // The token transfer the route made, logged inside it.
                    let last = log_messages.pop().expect("invoke logged success");
                    let consumed = log_messages.pop().expect("invoke logged units");
                    invoke(TOKEN_PROGRAM, 2, &["Instruction: Transfer"], 4_645, &mut log_messages);
                    log_messages.extend([consumed, last]);
                }
            } else if !failed {
                invoke(
                    TOKEN_PROGRAM,
                    1,
                    &["Instruction: TransferChecked"],
                    6_200,
                    &mut log_messages,
                );
            }
            account_keys.push(TOKEN_PROGRAM.to_owned());
            account_keys.push(mint_address.clone());
            (if swap { JUPITER } else { TOKEN_PROGRAM }, if swap { 6001 } else { 1 })
        };
        let err = if failed {
            log_messages.push(format!("Program {main_program} invoke [1]"));
            log_messages.push(format!(
                "Program {main_program} failed: custom program error: {instruction:#x}"
            ));
            json!({"InstructionError": [1, {"Custom": instruction}]})
        } else {
            Value::Null
        };
        account_keys.push(COMPUTE_BUDGET.to_owned());

        let block_hash = base58(&block.hash);
        let recent_block_hash = self.recent_block_hash.clone();
        if new_block {
            self.recent_block_hash = block_hash.clone();
        }
        // Accounts as the ingester writes them: signers first, programs and mints read-only.
        let read_only = [SYSTEM_PROGRAM, TOKEN_PROGRAM, COMPUTE_BUDGET, JUPITER];
        let accounts: Vec<Value> = account_keys
            .iter()
            .enumerate()
            .map(|(index, key)| {
                let signer = index < signature_count;
                let program = read_only.contains(&key.as_str());
                let mint = !signer && self.is_mint(key);
                json!({"pubkey": key, "signer": signer, "source": "transaction",
                    "writable": signer || !(program || mint)})
            })
            .collect();
        let index_of = |key: &str| account_keys.iter().position(|k| k == key).unwrap_or(0);
        let instructions = vec![
            json!({"program_id": COMPUTE_BUDGET, "accounts": [], "data": random_base58(rng, 9),
                "stack_height": null}),
            json!({"program_id": main_program,
                "accounts": account_keys.iter().enumerate()
                    .filter(|(_, k)| !read_only.contains(&k.as_str()))
                    .map(|(index, _)| index).collect::<Vec<_>>(),
                "data": random_base58(rng, 12), "stack_height": null}),
        ];
        let fee = SIGNATURE_FEE * signature_count as u64 + priority_fee / 10;
        let pre_lamports: Vec<u64> =
            account_keys.iter().map(|_| rng.gen_range(1_000_000..50_000_000_000)).collect();
        let mut post_lamports = pre_lamports.clone();
        post_lamports[index_of(&signer)] -= fee;
        let mut record = Map::new();
        record.insert("account_keys".into(), json!(accounts));
        record.insert("block_slot".into(), json!(block.number));
        record.insert("block_height".into(), json!(block_height));
        record.insert("block_timestamp".into(), json!(crate::block_timestamp(block.time_ms)));
        record.insert("block_hash".into(), json!(block_hash));
        record.insert("txn_id".into(), json!(signatures[0]));
        record.insert("txn_index".into(), json!(txn_index));
        record.insert("signatures".into(), json!(signatures));
        record.insert("fee".into(), json!(fee));
        record.insert("success".into(), json!(!failed));
        record.insert("err".into(), err);
        record.insert("compute_units_consumed".into(), json!(rng.gen_range(300..units_limit)));
        record.insert("version".into(), json!("legacy"));
        record.insert("parent_slot".into(), json!(block.number.saturating_sub(1)));
        record.insert("recent_block_hash".into(), json!(recent_block_hash));
        record.insert("signer".into(), json!(signer));
        record.insert("signers".into(), json!(account_keys[..signature_count]));
        record.insert("instructions".into(), json!(instructions));
        record.insert("inner_instructions".into(), json!([]));
        record.insert("log_messages".into(), json!(log_messages));
        record.insert("pre_balances".into(), json!(pre_lamports));
        record.insert("post_balances".into(), json!(post_lamports));
        record.insert("pre_token_balances".into(), json!(pre_balances));
        record.insert("post_token_balances".into(), json!(post_balances));
        record
    }
}
