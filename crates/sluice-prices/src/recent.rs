//! Recent candles in memory: every token's history points of the last [`HOT_HORIZON_SECONDS`]
//! at every granularity, so that history over recent windows is answered without the store.
//!
//! The memory mirrors the store: it is loaded from it, and each counted batch puts in the
//! candles the store holds after the merge. It stays exact only while this service is the
//! only writer, which the store's write count tells: memory remembers the count its candles
//! match ([`RecentCandles::seq`]), and is used only while the store still has that count.

use std::collections::{HashMap, VecDeque};

use sluice_core::prices::{Candle, CandleKey, Granularity, TokenRef};
use sluice_store::prices::PricePoint;

/// How far back memory holds windows, at every granularity: a day, and an hour more so
/// that "the last 24 hours" asked a little after it was computed (or by a client whose clock
/// runs behind) is still served from memory.
pub const HOT_HORIZON_SECONDS: i64 = 25 * 3600;

/// A point as memory keeps it: 48 bytes.
pub(crate) type Point = PricePoint;

/// The recent points of one token, per granularity (in [`Granularity::ALL`] order), each
/// sorted by window start.
#[derive(Debug, Default)]
pub(crate) struct Series([VecDeque<Point>; 5]);

impl Series {
    fn of(&mut self, granularity: Granularity) -> &mut VecDeque<Point> {
        &mut self.0[granularity as usize]
    }

    /// Puts `point` in, replacing the point of the same window. Trades arrive mostly in
    /// time order, so this is usually an append.
    fn put(&mut self, granularity: Granularity, point: Point) {
        let points = self.of(granularity);
        match points.back() {
            None => points.push_back(point),
            Some(last) if last.start < point.start => points.push_back(point),
            Some(_) => match points.binary_search_by_key(&point.start, |p| p.start) {
                Ok(at) => points[at] = point,
                Err(at) => points.insert(at, point),
            },
        }
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(VecDeque::is_empty)
    }
}

/// Every token's recent points.
#[derive(Debug)]
pub(crate) struct RecentCandles {
    /// Per granularity: memory holds every stored window starting at or after this (Unix
    /// seconds). Moves forward only.
    from: [i64; 5],
    /// The store's write count these candles match; `None` when they may not match it
    /// (another writer, or a load that raced with a write).
    pub(crate) seq: Option<i64>,
    series: HashMap<TokenRef, Series>,
}

/// The first window of `granularity` that memory holds at `now` (Unix seconds).
pub(crate) fn horizon(granularity: Granularity, now: i64) -> i64 {
    granularity.window_start((now - HOT_HORIZON_SECONDS) * 1_000_000)
}

impl RecentCandles {
    /// Empty memory that holds nothing (every query goes to the store).
    pub(crate) fn empty() -> Self {
        Self { from: [i64::MAX; 5], seq: None, series: HashMap::new() }
    }

    /// Memory made of `points` per granularity, loaded from windows starting at or after
    /// `from` (per granularity), matching the store's write count `seq`.
    pub(crate) fn loaded(
        from: [i64; 5],
        seq: Option<i64>,
        points: Vec<(Granularity, Vec<(TokenRef, Point)>)>,
    ) -> Self {
        let mut series: HashMap<TokenRef, Series> = HashMap::new();
        for (granularity, rows) in points {
            for (token, point) in rows {
                series.entry(token).or_default().of(granularity).push_back(point);
            }
        }
        // The store hands points over in no promised order (one point per window each):
        // sorted once here rather than inserted in place one by one.
        for queues in series.values_mut() {
            for queue in &mut queues.0 {
                queue.make_contiguous().sort_unstable_by_key(|point| point.start);
            }
        }
        Self { from, seq, series }
    }

    /// Whether memory holds every stored window of `granularity` starting at or after `from`.
    pub(crate) fn covers(&self, granularity: Granularity, from: i64) -> bool {
        from >= self.from[granularity as usize]
    }

    /// The points of `token` at `granularity` with a window start in `starts`, at most
    /// `limit`, appended to `out` with `index`.
    pub(crate) fn points(
        &self,
        token: &TokenRef,
        granularity: Granularity,
        starts: std::ops::Range<i64>,
        limit: usize,
        index: usize,
        out: &mut Vec<(usize, Point)>,
    ) {
        let Some(series) = self.series.get(token) else { return };
        let points = &series.0[granularity as usize];
        let first = points.partition_point(|p| p.start < starts.start);
        out.extend(
            points
                .range(first..)
                .take_while(|p| p.start < starts.end)
                .take(limit)
                .map(|p| (index, *p)),
        );
    }

    /// Puts in the candles a counted batch left in the store, where memory holds their
    /// window; `seq` is the store's write count after the batch. Memory stays current when
    /// the batch was the only write since the count memory matched.
    pub(crate) fn apply(&mut self, candles: &[(CandleKey, Candle)], seq: Option<i64>) {
        for (key, candle) in candles {
            if !self.covers(key.granularity, key.start) {
                continue;
            }
            let point = Point {
                start: key.start,
                price: candle.price(),
                open: candle.open,
                high: candle.high,
                close: candle.close,
                low: candle.low,
            };
            match self.series.get_mut(&key.token) {
                Some(series) => series.put(key.granularity, point),
                None => {
                    let mut series = Series::default();
                    series.put(key.granularity, point);
                    self.series.insert(key.token.clone(), series);
                }
            }
        }
        if let Some(seq) = seq {
            self.seq = self.seq.filter(|known| *known + 1 == seq).map(|_| seq);
        }
    }

    /// Drops the windows that fell out of the horizon at `now` (Unix seconds).
    pub(crate) fn evict(&mut self, now: i64) {
        for granularity in Granularity::ALL {
            let index = granularity as usize;
            let from = horizon(granularity, now);
            if from <= self.from[index] {
                continue;
            }
            self.from[index] = from;
            for series in self.series.values_mut() {
                let points = series.of(granularity);
                let keep = points.partition_point(|p| p.start < from);
                points.drain(..keep);
            }
        }
        self.series.retain(|_, series| !series.is_empty());
    }

    /// Points held, and bytes they take: the queues' allocations (with their spare
    /// capacity), each token's map entry and address; not the map's spare slots or the
    /// allocator's own overhead.
    pub(crate) fn footprint(&self) -> (usize, usize) {
        let mut points = 0;
        let mut bytes = 0;
        for (token, series) in &self.series {
            bytes += std::mem::size_of::<(TokenRef, Series)>()
                + token.chain.capacity()
                + token.address.capacity();
            for queue in &series.0 {
                points += queue.len();
                bytes += queue.capacity() * std::mem::size_of::<Point>();
            }
        }
        (points, bytes)
    }
}
