//! Candles rolled up from finer windows, or built from trades arriving in any order and any
//! batching (through the real store), equal the candles computed directly from the trades.

use std::collections::HashMap;

use proptest::prelude::*;
use sluice_core::prices::{
    Amount, Candle, CandleKey, Granularity, TokenRef, Trade, TradeOrder, aggregate,
};

/// 2026-11-21T00:00:00Z.
const DAY_START: i64 = 1_795_219_200;

fn trades_strategy() -> impl Strategy<Value = Vec<Trade>> {
    let trade = (
        0..2usize,               // token
        0i64..2 * 86_400 * 1000, // milliseconds into two days
        1u64..1_000_000_000,     // token amount, 10^-6 units
        1u64..1_000_000_000,     // usd amount, 10^-4 units
        0u64..4,                 // log index
    );
    prop::collection::vec(trade, 1..60).prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(n, (token, ms, amount, usd, log))| Trade {
                token: TokenRef::new("base", ["0xaa", "0xbb"][token]),
                decimals: 6,
                token_amount: Amount(i128::from(amount) * 1_000_000_000_000),
                usd_amount: Amount(i128::from(usd) * 100_000_000_000_000),
                pool: None,
                order: TradeOrder {
                    at_micros: (DAY_START * 1000 + ms) * 1000,
                    block_number: (ms / 2000) as u64,
                    log_index: log,
                    transaction_hash: format!("0x{n:04x}"),
                },
            })
            .collect()
    })
}

/// Candles of `coarse` made by merging the candles of the next finer granularity.
fn roll_up(fine: &HashMap<CandleKey, Candle>, coarse: Granularity) -> HashMap<CandleKey, Candle> {
    let mut out: HashMap<CandleKey, Candle> = HashMap::new();
    // Merge in a scrambled order: merging must not depend on it.
    let mut keys: Vec<&CandleKey> = fine.keys().collect();
    keys.sort_by_key(|k| (k.start.wrapping_mul(7919) % 1009, k.token.clone()));
    for key in keys {
        let target = CandleKey {
            token: key.token.clone(),
            granularity: coarse,
            start: coarse.window_start(key.start * 1_000_000),
        };
        match out.get_mut(&target) {
            Some(candle) => candle.merge(&fine[key]),
            None => {
                out.insert(target, fine[key].clone());
            }
        }
    }
    out
}

/// Candles of every granularity computed straight from the trades, window by window,
/// independently of `aggregate` (which rolls up internally).
fn direct(trades: &[Trade]) -> HashMap<CandleKey, Candle> {
    let mut out: HashMap<CandleKey, Candle> = HashMap::new();
    for granularity in Granularity::ALL {
        for trade in trades {
            let key = CandleKey {
                token: trade.token.clone(),
                granularity,
                start: granularity.window_start(trade.order.at_micros),
            };
            match out.get_mut(&key) {
                Some(candle) => candle.merge(&Candle::of(trade)),
                None => {
                    out.insert(key, Candle::of(trade));
                }
            }
        }
    }
    out
}

fn of_granularity(all: &HashMap<CandleKey, Candle>, g: Granularity) -> HashMap<CandleKey, Candle> {
    all.iter().filter(|(k, _)| k.granularity == g).map(|(k, c)| (k.clone(), c.clone())).collect()
}

proptest! {
    #[test]
    fn rolled_up_candles_equal_direct_candles_whatever_the_arrival_order(
        trades in trades_strategy(),
        seed in any::<u64>(),
    ) {
        let direct = direct(&trades);
        prop_assert_eq!(&aggregate(&trades), &direct);
        // Arrival order: a permutation of the trades, counted one by one into 15s candles.
        let mut shuffled = trades.clone();
        let mut state = seed | 1;
        for i in (1..shuffled.len()).rev() {
            state ^= state << 13; state ^= state >> 7; state ^= state << 17;
            shuffled.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let mut fine: HashMap<CandleKey, Candle> = HashMap::new();
        for trade in &shuffled {
            let one = aggregate(std::iter::once(trade));
            for (key, candle) in one.into_iter().filter(|(k, _)| k.granularity == Granularity::S15) {
                match fine.get_mut(&key) {
                    Some(existing) => existing.merge(&candle),
                    None => { fine.insert(key, candle); }
                }
            }
        }
        prop_assert_eq!(&fine, &of_granularity(&direct, Granularity::S15));
        let mut level = fine;
        for coarse in [Granularity::M1, Granularity::M5, Granularity::H1, Granularity::D1] {
            level = roll_up(&level, coarse);
            prop_assert_eq!(&level, &of_granularity(&direct, coarse), "at {}", coarse);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn stored_candles_equal_direct_candles_whatever_the_batching(
        trades in trades_strategy(),
        cuts in prop::collection::vec(0usize..60, 0..6),
        reverse in any::<bool>(),
    ) {
        let direct = direct(&trades);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let stored = runtime.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("p.db").display());
            let store = sluice_store::open_prices(&url).await.unwrap();
            let mut order = trades.clone();
            if reverse {
                order.reverse();
            }
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (order.len() + 1)).collect();
            cuts.sort_unstable();
            let mut from = 0;
            for cut in cuts.into_iter().chain([order.len()]) {
                if cut > from {
                    store.apply_trades(&order[from..cut], &|_| i64::MIN).await.unwrap();
                    from = cut;
                }
            }
            // Sending everything again counts nothing twice.
            store.apply_trades(&order, &|_| i64::MIN).await.unwrap();
            let mut stored = HashMap::new();
            for key in direct.keys() {
                let candles = store
                    .latest_candles(&key.token, key.granularity, key.start, 1_000)
                    .await
                    .unwrap();
                let (start, candle) = candles.last().unwrap().clone();
                stored.insert(CandleKey { start, ..key.clone() }, candle);
            }
            stored
        });
        prop_assert_eq!(stored, direct);
    }
}
