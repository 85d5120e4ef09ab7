use std::collections::HashSet;

use proptest::prelude::*;
use sluice_filter::ValueSet;

#[derive(Debug, Clone)]
enum Op {
    Insert(usize),
    Remove(usize),
    Contains(usize),
    /// Looks the value up with some letters uppercased.
    ContainsUnnormalized(usize, u64),
    Clear,
}

/// Values that stress the encoding: packed addresses and hashes, hex that must not pack
/// (odd length, uppercase, `0X`, too long, empty), text, unicode, long text.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "0x[0-9a-f]{40}",
        "0x[0-9a-f]{0,9}",
        "0x[0-9a-fA-F]{2,4}",
        "0X[0-9a-f]{2}",
        "0x[0-9a-f]{126,130}",
        "[a-z0-9 _.-]{0,12}",
        "\\PC{0,6}",
        "[A-Za-z\u{df}\u{130}\u{3a3}]{0,4}",
        Just(String::new()),
        "[a-z]{60,300}",
    ]
}

fn op(pool: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..pool).prop_map(Op::Insert),
        3 => (0..pool).prop_map(Op::Remove),
        2 => (0..pool).prop_map(Op::Contains),
        2 => (0..pool, any::<u64>()).prop_map(|(i, mask)| Op::ContainsUnnormalized(i, mask)),
        1 => Just(Op::Clear),
    ]
}

fn scenario() -> impl Strategy<Value = (Vec<String>, Vec<Op>)> {
    proptest::collection::vec(value(), 1..24).prop_flat_map(|pool| {
        let ops = proptest::collection::vec(op(pool.len()), 0..300);
        (Just(pool), ops)
    })
}

/// `value` with the characters picked by `mask` uppercased.
fn mixed_case(value: &str, mask: u64) -> String {
    value
        .chars()
        .enumerate()
        .map(
            |(i, ch)| {
                if mask >> (i % 64) & 1 == 1 { ch.to_uppercase().collect() } else { ch.to_string() }
            },
        )
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn value_set_behaves_like_a_hash_set((pool, ops) in scenario()) {
        let mut set = ValueSet::new();
        let mut model = HashSet::new();
        for op in ops {
            match op {
                Op::Insert(i) => prop_assert_eq!(set.insert(&pool[i]), model.insert(pool[i].clone())),
                Op::Remove(i) => prop_assert_eq!(set.remove(&pool[i]), model.remove(&pool[i])),
                Op::Contains(i) => prop_assert_eq!(set.contains(&pool[i]), model.contains(&pool[i])),
                Op::ContainsUnnormalized(i, mask) => {
                    let probe = mixed_case(&pool[i], mask);
                    prop_assert_eq!(
                        set.contains_unnormalized(probe.as_bytes()),
                        model.contains(&probe.to_lowercase()),
                        "{:?}", probe
                    );
                }
                Op::Clear => {
                    set.clear();
                    model.clear();
                }
            }
            prop_assert_eq!(set.len(), model.len());
            prop_assert_eq!(set.is_empty(), model.is_empty());
        }
        for value in &pool {
            prop_assert_eq!(set.contains(value), model.contains(value), "{:?}", value);
        }
        set.shrink_to_fit();
        for value in &pool {
            prop_assert_eq!(set.contains(value), model.contains(value), "{:?}", value);
        }
    }
}

#[test]
fn values_differing_only_in_case_or_packing_are_distinct() {
    let mut set = ValueSet::new();
    assert!(set.insert("0x0a"));
    assert!(set.insert("0x0A"));
    assert!(set.insert("0X0a"));
    assert!(!set.insert("0x0a"));
    assert_eq!(set.len(), 3);
    assert!(set.remove("0x0A"));
    assert!(set.contains("0x0a") && set.contains("0X0a") && !set.contains("0x0A"));
    // Unnormalised lookups lowercase first, so every spelling finds "0x0a".
    for probe in ["0x0a", "0x0A", "0X0A", "0X0a"] {
        assert!(set.contains_unnormalized(probe.as_bytes()), "{probe}");
    }
    assert!(!set.contains_unnormalized(b"0x0a\xff"));
}

#[test]
fn heap_bytes_counts_the_arena_and_the_table() {
    let empty = ValueSet::new();
    let mut set = ValueSet::with_capacity(1000);
    assert!(set.heap_bytes() > empty.heap_bytes());
    let before = set.heap_bytes();
    set.extend(
        (0..1000).map(|i| format!("0x{i:040x}")).collect::<Vec<_>>().iter().map(String::as_str),
    );
    assert_eq!(set.len(), 1000);
    // 1000 packed addresses need 21 000 arena bytes on top of the table reserved ahead.
    assert!(set.heap_bytes() >= before + 21_000);
}
