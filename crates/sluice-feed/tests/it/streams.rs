//! Every stream of the default catalog against `sluice_core::streams`.

use std::collections::HashSet;

use chrono::Duration;
use sluice_core::catalog::Catalog;
use sluice_core::streams::{entity_schema, event_time, record_key};
use sluice_feed::Generator;

use crate::{body, generate, start};

#[test]
fn every_default_catalog_stream_generates_records_with_a_key_a_current_event_time_and_schema_fields()
 {
    for entry in Catalog::default().entries() {
        let (chain, entity) = (entry.chain.as_str(), entry.entity.as_str());
        let schema = entity_schema(entity).unwrap();
        let names: HashSet<&str> = schema.fields.iter().map(|(name, _)| *name).collect();
        let required: Vec<&str> = schema
            .fields
            .iter()
            .filter(|(_, description)| !description.contains("absent"))
            .map(|(name, _)| *name)
            .collect();
        for (now, record) in generate(chain, entity, 1, 2_000, 100) {
            let key = record_key(entity, &record);
            assert!(key.is_ok(), "{chain}/{entity}: {key:?} for {record:?}");
            let at = event_time(entity, &record)
                .unwrap_or_else(|| panic!("{chain}/{entity}: no event time in {record:?}"));
            assert!(at <= now, "{chain}/{entity}: event time {at} after {now}");
            assert!(at > now - Duration::seconds(60), "{chain}/{entity}: {at} long before {now}");
            let fields = body(&record);
            for name in fields.keys() {
                assert!(names.contains(name.as_str()), "{chain}/{entity}: unlisted field {name}");
            }
            for name in &required {
                assert!(fields.contains_key(*name), "{chain}/{entity}: missing field {name}");
            }
        }
    }
}

#[test]
fn one_seed_and_one_clock_give_the_same_records_and_another_seed_does_not() {
    for entry in Catalog::default().entries() {
        let (chain, entity) = (entry.chain.as_str(), entry.entity.as_str());
        let first = generate(chain, entity, 42, 300, 100);
        assert_eq!(first, generate(chain, entity, 42, 300, 100), "{chain}/{entity}");
        assert_ne!(first, generate(chain, entity, 43, 300, 100), "{chain}/{entity}");
    }
}

#[test]
fn keys_are_unique_across_ten_thousand_records_of_every_stream() {
    for entry in Catalog::default().entries() {
        let (chain, entity) = (entry.chain.as_str(), entry.entity.as_str());
        let mut keys = HashSet::new();
        for (_, record) in generate(chain, entity, 3, 10_000, 100) {
            let key = record_key(entity, &record).unwrap();
            assert!(keys.insert(key.clone()), "{chain}/{entity}: duplicate key {key}");
        }
    }
}

#[test]
fn keys_stay_unique_when_the_clock_does_not_move() {
    for entry in Catalog::default().entries() {
        let (chain, entity) = (entry.chain.as_str(), entry.entity.as_str());
        let mut generator = Generator::new(chain, entity, 5).unwrap();
        let mut keys = HashSet::new();
        for _ in 0..3_000 {
            let record = generator.next_record(start());
            let key = record_key(entity, &record).unwrap();
            assert!(keys.insert(key.clone()), "{chain}/{entity}: duplicate key {key}");
            assert!(event_time(entity, &record).is_some());
        }
    }
}
