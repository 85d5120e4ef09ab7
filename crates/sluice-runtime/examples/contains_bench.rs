//! The cost of `beam.contains` per call from a script, against the dataset index a server
//! keeps (`DatasetIndex`, the same one `sluice serve` loads).
//!
//! `cargo run --release -p sluice-runtime --example contains_bench -- [entries] [records]`
//! (defaults: 1 000 000 dataset entries, 200 000 records).
//!
//! Fills one dataset with `entries` random addresses, then runs three scripts over the same
//! records (`{"a": "<address>"}`, half of them in the dataset, in upper case so the lookup
//! lowercases them) through one `ScriptEngine`, the way a worker runs them: a baseline that
//! reads the field and keeps the record, one `beam.contains` with one value, and one with an
//! array of two values. Each script gets a warm-up pass, then the best of 5 passes counts.
//! The difference to the baseline is what a call costs. Checks the number of records kept.

use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use sluice_core::datasets::{DatasetChange, DatasetListener, DatasetLookup, DatasetRef};
use sluice_js::{Limits, NoLogs, ScriptEngine};
use sluice_runtime::datasets::DatasetIndex;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const OWNER: &str = "user-bench";
const PASSES: usize = 5;

fn address(rng: &mut impl Rng) -> String {
    let bytes: [u8; 20] = rng.r#gen();
    let mut out = String::with_capacity(42);
    out.push_str("0x");
    for byte in bytes {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a number"));
    let entries = args.next().unwrap_or(1_000_000);
    let records = args.next().unwrap_or(200_000);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);

    let index = Arc::new(DatasetIndex::new());
    let dataset = DatasetRef { owner_user_id: OWNER, name: "watched", seq: 1 };
    index.changed(dataset, DatasetChange::Created);
    let values: Vec<String> = (0..entries).map(|_| address(&mut rng)).collect();
    let started = Instant::now();
    for (version, chunk) in values.chunks(250_000).enumerate() {
        index.changed(dataset, DatasetChange::Added { version: version as u64 + 1, values: chunk });
    }
    let load = started.elapsed();

    let mut hits = 0;
    let inputs: Vec<Vec<u8>> = (0..records)
        .map(|i| {
            let value = if i % 2 == 0 {
                hits += 1;
                values[rng.gen_range(0..values.len())].to_uppercase().replace("0X", "0x")
            } else {
                address(&mut rng)
            };
            format!("{{\"a\":\"{value}\",\"b\":\"{}\"}}", address(&mut rng)).into_bytes()
        })
        .collect();
    assert!(index.contains_any(OWNER, "watched", &[values[0].as_str()]));

    let scripts = [
        (
            "baseline (no lookup)",
            "function transform(r){ return r.a.length > 0 ? r : null; }",
            records,
        ),
        (
            "beam.contains, 1 value",
            "function transform(r){ return beam.contains('watched', r.a) ? r : null; }",
            hits,
        ),
        (
            "beam.contains, 2 values",
            "function transform(r){ return beam.contains('watched', [r.b, r.a]) ? r : null; }",
            hits,
        ),
    ];
    println!(
        "dataset: {entries} entries loaded into the index in {:.2} s; {records} records, {hits} in the dataset",
        load.as_secs_f64()
    );
    let mut baseline_ns = 0.0;
    for (name, source, expected) in scripts {
        let lookup: Arc<dyn DatasetLookup> = index.clone();
        let limits = Limits::for_pod_size(sluice_core::pipeline::PodSize::S);
        let mut engine = ScriptEngine::new(source, limits, lookup, OWNER, Arc::new(NoLogs))
            .expect("the script loads");
        let mut best = f64::MAX;
        for pass in 0..=PASSES {
            let started = Instant::now();
            let kept: usize = engine
                .run_batch(inputs.iter().map(Vec::as_slice))
                .into_iter()
                .map(|result| result.expect("the script runs").len())
                .sum();
            let seconds = started.elapsed().as_secs_f64();
            assert_eq!(kept, expected, "{name}: records kept");
            if pass > 0 {
                best = best.min(seconds);
            }
        }
        let ns = best * 1e9 / records as f64;
        if baseline_ns == 0.0 {
            baseline_ns = ns;
        }
        println!(
            "{{\"bench\":\"beam_contains\",\"script\":\"{name}\",\"ns_per_record\":{ns:.0},\"ns_over_baseline\":{:.0},\"records_per_sec\":{:.0}}}",
            ns - baseline_ns,
            records as f64 / best
        );
    }
}
