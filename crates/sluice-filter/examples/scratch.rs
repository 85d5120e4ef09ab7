use sluice_core::filter_expr::FilterExpr;
use sluice_filter::{Extracted, ValueSet, extract};
use std::hint::black_box;

fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/self/schedstat").unwrap();
    s.split_whitespace().next().unwrap().parse::<u64>().unwrap() as f64 / 1e9
}

fn best(name: &str, n: usize, mut f: impl FnMut() -> usize) {
    let mut best = f64::MAX;
    let mut k = 0;
    for _ in 0..15 {
        let c = std::time::Instant::now();
        for _ in 0..n {
            k += f();
        }
        best = best.min(c.elapsed().as_secs_f64() * 1e9 / n as f64);
    }
    println!("{name}: {best:.1} ns wall (min of 15) {k}");
}

fn main() {
    let rec: &[u8] = br#"{"block_number":19000123,"block_timestamp":"2024-02-12T11:22:33Z","block_hash":"0x5c504ed432cb51138bcf09aa5e8a410dd4a1e204ef84bfed1be16dfba1b22060","transaction_hash":"0x5c504ed432cb51138bcf09aa5e8a410dd4a1e204ef84bfed1be16dfba1b22060","log_index":123,"token_address":"0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48","from_address":"0x28c6c06298d514db089934071355e5743bf21d60","to_address":"0x28c6c06298d514db089934071355e5743bf21d60","raw_amount_str":"150025000000000000000","amount_str":"1500.25","token_symbol":"USDC","token_name":"USD Coin"}"#;
    let expr = FilterExpr::parse("root = this.token_address").unwrap();
    let path = expr.path();
    best("extract", 200_000, || match extract(black_box(rec), black_box(path)) {
        Some(Extracted::Str(s)) => s.len(),
        _ => 0,
    });
    let set: ValueSet = ["0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48"].into_iter().collect();
    let v = b"0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB49";
    best("contains", 200_000, || set.contains_unnormalized(black_box(v)) as usize);
    let mut big = ValueSet::with_capacity(10_000_000);
    let mut x: u64 = 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..10_000_000 {
        let v = format!("0x{:016x}{:016x}{:08x}", next(), next(), next() as u32);
        big.insert(&v);
    }
    let probes: Vec<String> = (0..100_000)
        .map(|_| format!("0x{:016X}{:016x}{:08x}", next(), next(), next() as u32))
        .collect();
    let mut i = 0;
    best("big contains tight loop", 100_000, || {
        i = (i + 1) % probes.len();
        big.contains_unnormalized(black_box(probes[i].as_bytes())) as usize
    });
    let mut i = 0;
    best("big contains + extract", 100_000, || {
        i = (i + 1) % probes.len();
        let e = match extract(black_box(rec), black_box(path)) {
            Some(Extracted::Str(s)) => s.len(),
            _ => 0,
        };
        e + big.contains_unnormalized(black_box(probes[i].as_bytes())) as usize
    });
    for mb in [2usize, 16, 32, 80, 300] {
        let buf = vec![1u8; mb << 20];
        let mut y: u64 = 88172645463325252;
        best(&format!("random byte read in {mb} MB"), 200_000, || {
            y ^= y << 13;
            y ^= y >> 7;
            y ^= y << 17;
            black_box(&buf)[(y as usize) % buf.len()] as usize
        });
    }
    best("count quotes", 200_000, || black_box(rec).iter().filter(|&&b| b == b'"').count());
}
