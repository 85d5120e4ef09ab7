//! Integration tests of `sluice-feed`: every catalog stream, through the public API only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod realism;
mod streams;

use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::{Map, Value};
use sluice_feed::Generator;

/// A fixed start, so that tests do not depend on the day they run.
pub fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 0).unwrap()
}

/// `count` records of `chain`/`entity` generated at `rate` records per second from
/// [`start`], each with the `now` it was generated at.
pub fn generate(
    chain: &str,
    entity: &str,
    seed: u64,
    count: usize,
    rate: u32,
) -> Vec<(DateTime<Utc>, Map<String, Value>)> {
    let mut generator = Generator::new(chain, entity, seed).unwrap();
    let step = Duration::microseconds(1_000_000 / i64::from(rate));
    (0..count)
        .map(|index| {
            let now = start() + step * index as i32;
            (now, generator.next_record(now))
        })
        .collect()
}

/// The record's own fields: Hyperliquid records are wrapped in `payload`.
pub fn body(record: &Map<String, Value>) -> &Map<String, Value> {
    match record.get("payload") {
        Some(Value::Object(inner)) => inner,
        _ => record,
    }
}
