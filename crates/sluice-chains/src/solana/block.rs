//! A `getBlock` answer (`encoding: "json"`, `transactionDetails: "full"`) read in place, in
//! one pass: strings borrow from the answer's text. A transaction's `meta` comes before the
//! message that tells a vote, so every `meta` is read, votes' too: that takes 17 % fewer
//! instructions than skipping each as raw text and reading the non-votes' again (a
//! non-vote's metadata is several times a vote's; BENCHMARKS.md, "Solana ingest").

use std::borrow::Cow;

use serde::Deserialize;

/// The vote program: a transaction whose only instruction calls it is a vote.
pub const VOTE_PROGRAM: &str = "Vote111111111111111111111111111111111111111";

/// The upgradeable BPF loader: while a transaction references it, the programs it invokes
/// stay writable (they may be upgraded); otherwise they are demoted to read-only.
const UPGRADEABLE_LOADER: &str = "BPFLoaderUpgradeab1e11111111111111111111111";

/// Accounts the runtime never lets a transaction write (builtin programs and sysvars): a
/// message that asks for them writable gets them read-only. Agave's `ReservedAccountKeys`,
/// every feature active.
const RESERVED: &[&str] = &[
    "AddressLookupTab1e1111111111111111111111111",
    "BPFLoader1111111111111111111111111111111111",
    "BPFLoader2111111111111111111111111111111111",
    UPGRADEABLE_LOADER,
    "ComputeBudget111111111111111111111111111111",
    "Config1111111111111111111111111111111111111",
    "Ed25519SigVerify111111111111111111111111111",
    "Feature111111111111111111111111111111111111",
    "KeccakSecp256k11111111111111111111111111111",
    "LoaderV411111111111111111111111111111111111",
    "NativeLoader1111111111111111111111111111111",
    "Secp256r1SigVerify1111111111111111111111111",
    "Stake11111111111111111111111111111111111111",
    "StakeConfig11111111111111111111111111111111",
    "Sysvar1111111111111111111111111111111111111",
    "Sysvar1nstructions1111111111111111111111111",
    "SysvarC1ock11111111111111111111111111111111",
    "SysvarEpochRewards1111111111111111111111111",
    "SysvarEpochSchedu1e111111111111111111111111",
    "SysvarFees111111111111111111111111111111111",
    "SysvarLastRestartS1ot1111111111111111111111",
    "SysvarRecentB1ockHashes11111111111111111111",
    "SysvarRent111111111111111111111111111111111",
    "SysvarRewards111111111111111111111111111111",
    "SysvarS1otHashes111111111111111111111111111",
    "SysvarS1otHistory11111111111111111111111111",
    "SysvarStakeHistory1111111111111111111111111",
    "11111111111111111111111111111111",
    VOTE_PROGRAM,
    "ZkE1Gama1Proof11111111111111111111111111111",
];

/// One block as `getBlock` answers it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Block<'a> {
    /// `null` on early slots.
    #[serde(default)]
    pub block_height: Option<u64>,
    /// Unix seconds; `null` on early slots.
    #[serde(default)]
    pub block_time: Option<i64>,
    #[serde(borrow)]
    pub blockhash: &'a str,
    pub parent_slot: u64,
    #[serde(borrow)]
    pub previous_blockhash: &'a str,
    #[serde(borrow, default)]
    pub transactions: Vec<Entry<'a>>,
}

/// One transaction with its status metadata.
#[derive(Debug, Deserialize)]
pub struct Entry<'a> {
    #[serde(borrow)]
    pub transaction: Transaction<'a>,
    #[serde(borrow, default)]
    pub meta: Option<Meta<'a>>,
    /// `"legacy"` or `0`; absent from nodes that predate versioned transactions (legacy).
    #[serde(borrow, default)]
    pub version: Option<Version<'a>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum Version<'a> {
    Number(u64),
    Text(&'a str),
}

#[derive(Debug, Deserialize)]
pub struct Transaction<'a> {
    #[serde(borrow)]
    pub signatures: Vec<&'a str>,
    #[serde(borrow)]
    pub message: Message<'a>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message<'a> {
    #[serde(borrow)]
    pub account_keys: Vec<&'a str>,
    pub header: MessageHeader,
    #[serde(borrow)]
    pub instructions: Vec<Instruction<'a>>,
    #[serde(borrow)]
    pub recent_blockhash: &'a str,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageHeader {
    pub num_required_signatures: u16,
    pub num_readonly_signed_accounts: u16,
    pub num_readonly_unsigned_accounts: u16,
}

/// An instruction with its program and accounts as indexes into the account keys.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instruction<'a> {
    pub program_id_index: u16,
    pub accounts: Vec<u16>,
    /// Base58.
    #[serde(borrow)]
    pub data: &'a str,
    #[serde(default)]
    pub stack_height: Option<u32>,
}

/// A transaction's status metadata (a vote's is read but not used).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta<'a> {
    #[serde(default)]
    pub err: Option<serde_json::Value>,
    /// Required of a non-vote transaction (its record has it); a vote's is not read.
    #[serde(default)]
    pub fee: Option<u64>,
    #[serde(borrow, default)]
    pub inner_instructions: Option<Vec<InnerInstructions<'a>>>,
    #[serde(borrow, default)]
    pub log_messages: Option<Vec<Cow<'a, str>>>,
    #[serde(default)]
    pub pre_balances: Vec<u64>,
    #[serde(default)]
    pub post_balances: Vec<u64>,
    #[serde(borrow, default)]
    pub pre_token_balances: Option<Vec<TokenBalance<'a>>>,
    #[serde(borrow, default)]
    pub post_token_balances: Option<Vec<TokenBalance<'a>>>,
    #[serde(borrow, default)]
    pub loaded_addresses: Option<LoadedAddresses<'a>>,
    #[serde(default)]
    pub compute_units_consumed: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub struct InnerInstructions<'a> {
    pub index: u16,
    #[serde(borrow)]
    pub instructions: Vec<Instruction<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenBalance<'a> {
    pub account_index: u16,
    #[serde(borrow)]
    pub mint: &'a str,
    #[serde(borrow, default)]
    pub owner: Option<&'a str>,
    #[serde(borrow, default)]
    pub program_id: Option<&'a str>,
    #[serde(borrow)]
    pub ui_token_amount: UiTokenAmount<'a>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UiTokenAmount<'a> {
    #[serde(borrow)]
    pub amount: &'a str,
    pub decimals: u8,
    #[serde(borrow)]
    pub ui_amount_string: Cow<'a, str>,
}

/// Accounts a version-0 transaction loaded from address lookup tables.
#[derive(Debug, Default, Deserialize)]
pub struct LoadedAddresses<'a> {
    #[serde(borrow, default)]
    pub writable: Vec<&'a str>,
    #[serde(borrow, default)]
    pub readonly: Vec<&'a str>,
}

impl Entry<'_> {
    /// Whether the transaction is legacy (no `version`, or `"legacy"`).
    pub fn is_legacy(&self) -> bool {
        matches!(self.version, None | Some(Version::Text("legacy")))
    }

    /// The validator's simple-vote rule (Agave's `is_simple_vote_transaction`): one or two
    /// signatures, a legacy message, and exactly one instruction, whose program is the vote
    /// program.
    pub fn is_simple_vote(&self) -> bool {
        let message = &self.transaction.message;
        self.transaction.signatures.len() < 3
            && self.is_legacy()
            && message.instructions.len() == 1
            && message
                .account_keys
                .get(usize::from(message.instructions[0].program_id_index))
                .is_some_and(|program| *program == VOTE_PROGRAM)
    }
}

/// One account a transaction references: its key, whether it signed, whether the
/// transaction may write it, and where the key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Account<'a> {
    pub pubkey: &'a str,
    pub signer: bool,
    pub writable: bool,
    /// From an address lookup table (a version-0 transaction's loaded addresses).
    pub from_lookup_table: bool,
}

/// Every account of a transaction in index order: the message's keys, then the loaded
/// writable and read-only addresses. Writability as `jsonParsed` reports it: the header's
/// flags, with reserved accounts and invoked programs demoted to read-only (unless the
/// upgradeable loader is present), as the runtime does.
pub fn accounts<'a>(
    message: &Message<'a>,
    loaded: Option<&LoadedAddresses<'a>>,
) -> Vec<Account<'a>> {
    let header = message.header;
    let statics = message.account_keys.len();
    let signed = usize::from(header.num_required_signatures);
    let signed_writable = signed.saturating_sub(usize::from(header.num_readonly_signed_accounts));
    let unsigned_writable_end =
        statics.saturating_sub(usize::from(header.num_readonly_unsigned_accounts));
    let empty = LoadedAddresses::default();
    let loaded = loaded.unwrap_or(&empty);
    let mut all: Vec<Account<'a>> =
        Vec::with_capacity(statics + loaded.writable.len() + loaded.readonly.len());
    for (index, pubkey) in message.account_keys.iter().enumerate() {
        let writable =
            if index < signed { index < signed_writable } else { index < unsigned_writable_end };
        all.push(Account { pubkey, signer: index < signed, writable, from_lookup_table: false });
    }
    for pubkey in &loaded.writable {
        all.push(Account { pubkey, signer: false, writable: true, from_lookup_table: true });
    }
    for pubkey in &loaded.readonly {
        all.push(Account { pubkey, signer: false, writable: false, from_lookup_table: true });
    }
    let upgradeable_present = all.iter().any(|a| a.pubkey == UPGRADEABLE_LOADER);
    for (index, account) in all.iter_mut().enumerate() {
        if !account.writable {
            continue;
        }
        let invoked = !upgradeable_present
            && message.instructions.iter().any(|i| usize::from(i.program_id_index) == index);
        if invoked || RESERVED.contains(&account.pubkey) {
            account.writable = false;
        }
    }
    all
}
