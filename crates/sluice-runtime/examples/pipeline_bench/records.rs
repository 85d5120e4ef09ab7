//! The records a run appends: `erc20_token_transfer` records shaped like the feed's, from a
//! seeded generator so every run appends the same ones.

use sluice_core::streams::StreamRecord;

use crate::ENTITY;

/// Builds `erc20_token_transfer` records shaped like the feed's: the same fields, keys in
/// the order serde_json writes them (alphabetical), unique `<transaction_hash>:<log_index>`.
pub(crate) struct Generator {
    pub(crate) rng: SplitMix,
    /// Addresses in the set.
    pub(crate) sample: Vec<String>,
    /// Addresses not in the set.
    pub(crate) others: Vec<String>,
    pub(crate) next: u64,
}

impl Generator {
    /// One record; true when its token is in the set.
    pub(crate) fn record(
        &mut self,
        hit_rate: f64,
        sent_at_us: Option<i64>,
    ) -> (StreamRecord, bool) {
        const TOKENS: [(&str, &str); 5] = [
            ("USDC", "USD Coin"),
            ("USDT", "Tether USD"),
            ("WETH", "Wrapped Ether"),
            ("DAI", "Dai Stablecoin"),
            ("PEPE", "Pepe"),
        ];
        let n = self.next;
        self.next += 1;
        let hit = self.rng.unit() < hit_rate;
        let token = if hit {
            &self.sample[self.rng.below(self.sample.len())]
        } else {
            &self.others[self.rng.below(self.others.len())]
        };
        // Four logs per transaction, 150 transactions per block; `mix` is a bijection, so
        // transaction hashes never repeat.
        let (tx, log_index) = (n / 4, n % 4);
        let block = 20_000_000 + tx / 150;
        let tx_hash = format!(
            "0x{:016x}{:016x}{:016x}{:016x}",
            mix(tx),
            mix(tx ^ (1 << 63)),
            mix(!tx),
            mix(tx + 7)
        );
        let block_hash = format!(
            "0x{:016x}{:016x}{:016x}{:016x}",
            mix(block),
            mix(block ^ (1 << 62)),
            mix(!block),
            mix(block + 11)
        );
        let (symbol, name) = TOKENS[self.rng.below(TOKENS.len())];
        let whole = 1 + self.rng.below(1_000_000);
        let cents = self.rng.below(100);
        let from = &self.others[self.rng.below(self.others.len())];
        let to = self.rng.address();
        let sent_at = sent_at_us.map(|us| format!(r#""sent_at_us":{us},"#)).unwrap_or_default();
        let value = format!(
            concat!(
                r#"{{"amount":{whole}.{cents:02},"amount_str":"{whole}.{cents:02}","#,
                r#""block_hash":"{block_hash}","block_number":{block},"#,
                r#""block_timestamp":"2025-06-{day:02} {hour:02}:{minute:02}:{second:02}","#,
                r#""from_address":"{from}","log_index":{log_index},"#,
                r#""raw_amount":{whole}{cents:02}0000000000000000,"#,
                r#""raw_amount_str":"{whole}{cents:02}0000000000000000",{sent_at}"#,
                r#""to_address":"{to}","token_address":"{token}","token_name":"{name}","#,
                r#""token_symbol":"{symbol}","transaction_hash":"{tx_hash}","#,
                r#""transaction_index":{tx_index}}}"#
            ),
            whole = whole,
            cents = cents,
            block_hash = block_hash,
            block = block,
            day = 1 + block % 28,
            hour = tx % 24,
            minute = tx % 60,
            second = (tx / 2) % 60,
            from = from,
            log_index = log_index,
            sent_at = sent_at,
            to = to,
            token = token,
            name = name,
            symbol = symbol,
            tx_hash = tx_hash,
            tx_index = tx % 150,
        );
        let record = StreamRecord::parse(ENTITY, value.as_bytes())
            .expect("the generator writes valid erc20_token_transfer records");
        (record, hit)
    }
}

/// SplitMix64: small, fast and good enough for test data (no dependency needed).
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    pub(crate) fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound.max(1) as u64) as usize
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A random lowercase `0x` address (the stored, normalised form).
    pub(crate) fn address(&mut self) -> String {
        let (a, b, c) = (self.next_u64(), self.next_u64(), self.next_u64());
        format!("0x{a:016x}{b:016x}{:08x}", c >> 32)
    }
}

/// The SplitMix64 finaliser: a bijection on `u64`.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
