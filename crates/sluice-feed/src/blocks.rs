//! Which block the next record belongs to.
//!
//! Block numbers and times follow the chain's cadence anchored to wall-clock time, so a feed
//! started now produces current-looking heights. A block holds a planned number of records;
//! when they are used up but the chain would not have produced the next block yet (the feed
//! runs faster than the sample of the chain it imitates), the block keeps growing instead of
//! running ahead of the clock — except for one-record-per-block streams, whose next block
//! then gets the time of the call (never less than a millisecond after the previous one).

use rand::Rng;
use rand::rngs::StdRng;

use crate::chains::Cadence;

/// A block whose record plan is used up moves on after this long even if records remain, so
/// a slow feed does not keep stamping old block times.
const STALE_MS: i64 = 3_000;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub(crate) number: u64,
    /// Unix milliseconds.
    pub(crate) time_ms: i64,
    pub(crate) hash: [u8; 32],
    remaining: u32,
}

pub(crate) struct BlockCursor {
    cadence: Cadence,
    /// Records per block, inclusive range, at least 1.
    plan: (u32, u32),
    grow: bool,
    current: Option<Block>,
}

impl BlockCursor {
    /// `plan`: how many records a block holds (inclusive range). With `grow`, a block keeps
    /// taking records until the chain's clock reaches the next block.
    pub(crate) fn new(cadence: Cadence, plan: (u32, u32), grow: bool) -> Self {
        Self { cadence, plan: (plan.0.max(1), plan.1.max(plan.0.max(1))), grow, current: None }
    }

    fn number_at(&self, now_ms: i64) -> u64 {
        let Cadence { anchor_number, anchor_ms, interval_ms } = self.cadence;
        let blocks = (now_ms - anchor_ms).div_euclid(interval_ms);
        anchor_number.saturating_add_signed(blocks)
    }

    fn time_of(&self, number: u64) -> i64 {
        let Cadence { anchor_number, anchor_ms, interval_ms } = self.cadence;
        anchor_ms + (number as i64 - anchor_number as i64) * interval_ms
    }

    /// The block of the next record, and whether it is a new block.
    pub(crate) fn next(&mut self, rng: &mut StdRng, now_ms: i64) -> (Block, bool) {
        let next_due = self.current.map(|block| self.time_of(block.number + 1));
        if let (Some(block), Some(next_due)) = (&mut self.current, next_due) {
            let chain_moved_on = now_ms >= next_due;
            let stale = now_ms - block.time_ms >= STALE_MS;
            if block.remaining > 0 && !(stale && chain_moved_on) {
                block.remaining -= 1;
                return (*block, false);
            }
            if self.grow && !chain_moved_on {
                return (*block, false);
            }
        }
        let previous = self.current;
        let at_clock = self.number_at(now_ms);
        let number = previous.map_or(at_clock, |p| at_clock.max(p.number + 1));
        let scheduled = self.time_of(number);
        let time_ms = if scheduled <= now_ms {
            scheduled
        } else {
            previous.map_or(now_ms, |p| now_ms.max(p.time_ms + 1))
        };
        let mut hash = [0u8; 32];
        rng.fill(&mut hash);
        let remaining = rng.gen_range(self.plan.0..=self.plan.1) - 1;
        let block = Block { number, time_ms, hash, remaining };
        self.current = Some(block);
        (block, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const BASE: Cadence = Cadence { anchor_number: 0, anchor_ms: 1_000_000, interval_ms: 2_000 };

    #[test]
    fn first_block_is_the_chain_height_at_the_clock() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut cursor = BlockCursor::new(BASE, (3, 3), true);
        let (block, new) = cursor.next(&mut rng, 1_000_000 + 2_000 * 50 + 700);
        assert!(new);
        assert_eq!(block.number, 50);
        assert_eq!(block.time_ms, 1_000_000 + 2_000 * 50);
    }

    #[test]
    fn a_growing_block_waits_for_the_chain_clock_then_jumps_to_the_current_height() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut cursor = BlockCursor::new(BASE, (2, 2), true);
        let t0 = 1_000_000;
        assert!(cursor.next(&mut rng, t0).1);
        assert!(!cursor.next(&mut rng, t0).1);
        // Plan used up, but the next block is not due: the block grows.
        for _ in 0..10 {
            let (block, new) = cursor.next(&mut rng, t0 + 1_999);
            assert!(!new);
            assert_eq!(block.number, 0);
        }
        let (block, new) = cursor.next(&mut rng, t0 + 2_000 * 7 + 1);
        assert!(new);
        assert_eq!((block.number, block.time_ms), (7, t0 + 14_000));
    }

    #[test]
    fn one_record_blocks_advance_on_every_call_without_running_ahead_of_the_clock() {
        let mut rng = StdRng::seed_from_u64(1);
        let hl = Cadence { anchor_number: 100, anchor_ms: 0, interval_ms: 80 };
        let mut cursor = BlockCursor::new(hl, (1, 1), false);
        let now = 8_000;
        let mut last = cursor.next(&mut rng, now).0;
        for _ in 0..20 {
            let (block, new) = cursor.next(&mut rng, now);
            assert!(new);
            assert_eq!(block.number, last.number + 1);
            assert_eq!(block.time_ms, last.time_ms.max(now - 1) + 1);
            last = block;
        }
    }
}
