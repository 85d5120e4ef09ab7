//! The windows' bookkeeping: which batches stay, and when a run holds back.

use super::*;

const BATCH: usize = 10;

/// A segment of the records `from..to`, read asking for `asked`.
fn segment(from: u64, to: u64, asked: usize) -> Arc<Segment> {
    let records = (from..to)
        .map(|offset| Record {
            partition: 0,
            offset,
            timestamp_ms: 0,
            key: bytes::Bytes::new(),
            value: bytes::Bytes::from_static(b"{}"),
        })
        .collect();
    Arc::new(Segment::new(from, records, asked))
}

/// Windows with a run read (full reads) up to `front` from `front - 3 batches`, and one
/// behind it read up to `behind`.
fn two_runs(front: u64, behind: u64) -> Windows {
    let mut windows = Windows::default();
    let ahead = windows.run_at(front - 3 * BATCH as u64);
    for start in (front - 3 * BATCH as u64..front).step_by(BATCH) {
        windows.push(ahead, segment(start, start + BATCH as u64, BATCH), 100 * BATCH);
    }
    let back = windows.run_at(behind - BATCH as u64);
    windows.push(back, segment(behind - BATCH as u64, behind, BATCH), 100 * BATCH);
    windows
}

#[test]
fn a_run_draining_a_backlog_holds_back_for_a_moving_run_a_little_behind() {
    let mut windows = two_runs(1_000, 900);
    assert!(windows.hold(1_000, BATCH));
    // The run behind is the one that never waits.
    assert!(!windows.hold(900, BATCH));
}

#[test]
fn no_one_holds_back_at_the_tail_for_a_run_too_far_behind_or_one_not_moving() {
    // The front's last read was not full: it is at the stream's tail.
    let mut windows = two_runs(1_000, 900);
    let front = windows.runs.iter().position(|run| run.end == 1_000).unwrap();
    windows.push(front, segment(1_000, 1_004, BATCH), 100 * BATCH);
    assert!(!windows.hold(1_004, BATCH));
    // Further behind than HOLD_BATCHES.
    let far = 1_000 + HOLD_BATCHES * BATCH as u64 + BATCH as u64;
    let mut windows = two_runs(far + 30, 30);
    assert!(!windows.hold(far + 30, BATCH));
    // Behind, but received nothing for a while: paused, slow or failing.
    let mut windows = two_runs(1_000, 900);
    for run in &mut windows.runs {
        if run.end == 900 {
            run.pushed_at -= HOLD_ACTIVE * 2;
        }
    }
    assert!(!windows.hold(1_000, BATCH));
}

#[test]
fn a_run_that_reached_the_one_ahead_is_not_waited_for() {
    // The run behind ends where the run ahead starts: its pipelines read in that one now.
    let mut windows = two_runs(1_000, 970);
    assert!(!windows.hold(1_000, BATCH));
}

#[test]
fn holding_back_stops_when_the_budget_of_the_period_is_spent() {
    let mut windows = two_runs(1_000, 900);
    assert!(windows.hold(1_000, BATCH));
    windows.held = HOLD_BUDGET;
    assert!(!windows.hold(1_000, BATCH));
    // A new period, a new budget.
    windows.held_since = Some(Instant::now() - HOLD_PERIOD * 2);
    assert!(windows.hold(1_000, BATCH));
}

#[test]
fn held_time_is_wall_time_counted_once_however_many_workers_hold() {
    let mut windows = two_runs(1_000, 900);
    // A hundred workers look one after another: what is counted is at most the time that
    // passed, not a hundred workers' waits.
    let started = Instant::now();
    for _ in 0..100 {
        assert!(windows.hold(1_000, BATCH));
    }
    assert!(windows.held <= started.elapsed(), "{:?}", windows.held);
    // A look long after the last one counts at most HOLD_LOOK (no one held in between).
    windows.held_look = Some(Instant::now() - HOLD_PERIOD / 2);
    let before = windows.held;
    assert!(windows.hold(1_000, BATCH));
    assert!(windows.held - before <= HOLD_LOOK, "{:?}", windows.held - before);
}

#[test]
fn the_window_drops_the_least_recently_read_batches_never_the_newest_and_keeps_marks() {
    let mut windows = Windows::default();
    let old = windows.run_at(0);
    windows.push(old, segment(0, 10, BATCH), 2 * BATCH);
    let new = windows.run_at(500);
    windows.push(new, segment(500, 510, BATCH), 2 * BATCH);
    windows.push(new, segment(510, 520, BATCH), 2 * BATCH);
    // Over two batches: the old run's batch went, the run stays as a mark of its end.
    assert_eq!(windows.records, 2 * BATCH);
    assert!(windows.slice(5, BATCH).is_none());
    assert_eq!(windows.run_at(10), old);
    // A run alone keeps its newest batch whatever the share.
    let mut windows = Windows::default();
    let only = windows.run_at(0);
    windows.push(only, segment(0, 10, BATCH), 1);
    windows.push(only, segment(10, 20, BATCH), 1);
    assert_eq!(windows.records, BATCH);
    let (kept, range, more) = windows.slice(10, BATCH).unwrap();
    assert_eq!((kept.from, range, more), (10, 0..10, true));
}
