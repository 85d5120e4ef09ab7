use serde_json::{Value, json};

use super::*;
use crate::validation::LocItem;

fn body() -> Value {
    json!({
        "name": "usdc",
        "description": "USDC transfers",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "filter_expr": "root = this.token_address"}],
            "sinks": [{"type": "kafka", "name": "usdc-transfers"}]
        }
    })
}

fn check(value: &Value, mode: BodyMode) -> Result<ValidatedPipeline, Vec<Violation>> {
    validate_pipeline_body(value.as_object().unwrap(), &Catalog::default(), mode)
}

fn locs(errors: &[Violation]) -> Vec<Value> {
    errors.iter().map(|e| serde_json::to_value(&e.loc).unwrap()).collect()
}

#[test]
fn minimal_body_gets_defaults_catalog_type_and_generated_uids() {
    let valid = check(&body(), BodyMode::Create).unwrap();
    let spec = valid.spec;
    assert_eq!(spec.pod_size, PodSize::S);
    assert_eq!(spec.delivery_guarantee, DeliveryGuarantee::AtLeastOnce);
    assert_eq!(spec.tags, None);
    assert!(!spec.static_egress_ip);
    assert_eq!(spec.pipeline_config.source.source_type, crate::pipeline::SourceType::Pubsub);
    assert!(!spec.pipeline_config.source.is_zerolag);
    assert!(spec.pipeline_config.transforms[0].uid().starts_with("tf-"));
    assert!(spec.pipeline_config.sinks[0].uid().starts_with("sk-"));
    assert!(valid.initial_filter_values.is_empty());
}

#[test]
fn given_uids_are_kept_and_client_source_type_is_overridden() {
    let mut value = body();
    value["pipeline_config"]["source"] =
        json!({"type": "pubsub", "chain": "hyperliquid", "entity": "order"});
    value["pipeline_config"]["transforms"][0]["uid"] = json!("tf-001");
    value["pipeline_config"]["sinks"][0]["uid"] = json!("sk-001");
    let spec = check(&value, BodyMode::Update).unwrap().spec;
    assert_eq!(spec.pipeline_config.source.source_type, crate::pipeline::SourceType::Kafka);
    assert_eq!(spec.pipeline_config.transforms[0].uid(), "tf-001");
    assert_eq!(spec.pipeline_config.sinks[0].uid(), "sk-001");
}

#[test]
fn server_managed_fields_are_ignored_and_unknown_fields_rejected() {
    let mut value = body();
    value["id"] = json!("mine");
    value["created_at"] = json!("whenever");
    assert!(check(&value, BodyMode::Create).is_ok());
    value["pod_sise"] = json!("M");
    let errors = check(&value, BodyMode::Create).unwrap_err();
    assert_eq!(locs(&errors), vec![json!(["body", "pod_sise"])]);
    assert_eq!(errors[0].kind, "extra_forbidden");
}

#[test]
fn every_violation_is_reported_together_with_precise_locs() {
    let value = json!({
        "description": 5,
        "tags": ["a", 1],
        "static_egress_ip": "yes",
        "pod_size": "XXL",
        "delivery_guarantee": "exactly_once",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "block", "is_zerolag": true},
            "transforms": [
                {"type": "redis_set_filter", "filter_expr": "root = this.address.lowercase()"},
                {"type": "v8", "script": "   "},
                {"type": "wasm"}
            ],
            "sinks": []
        }
    });
    let errors = check(&value, BodyMode::Create).unwrap_err();
    let expected = vec![
        json!(["body", "name"]),
        json!(["body", "description"]),
        json!(["body", "tags", 1]),
        json!(["body", "static_egress_ip"]),
        json!(["body", "pod_size"]),
        json!(["body", "delivery_guarantee"]),
        json!(["body", "pipeline_config", "source", "entity"]),
        json!(["body", "pipeline_config", "transforms", 0, "filter_expr"]),
        json!(["body", "pipeline_config", "transforms", 1, "script"]),
        json!(["body", "pipeline_config", "transforms", 2, "type"]),
        json!(["body", "pipeline_config", "sinks"]),
    ];
    assert_eq!(locs(&errors), expected, "{errors:#?}");
    assert_eq!(errors[0].kind, "missing");
    assert_eq!(errors[4].msg, "Input should be 'S', 'M', 'L' or 'XL'");
    assert!(errors[7].msg.contains("root = this.<field>"));
    assert!(errors[10].msg.contains("exactly one sink"));
}

#[test]
fn missing_pipeline_config_parts_are_each_reported() {
    let value = json!({"name": "n", "description": "", "pipeline_config": {}});
    let errors = check(&value, BodyMode::Create).unwrap_err();
    assert_eq!(
        locs(&errors),
        vec![
            json!(["body", "pipeline_config", "source"]),
            json!(["body", "pipeline_config", "transforms"]),
            json!(["body", "pipeline_config", "sinks"]),
        ]
    );
}

#[test]
fn catalog_rules_name_what_is_available() {
    let mut value = body();
    value["pipeline_config"]["source"] = json!({"chain": "dogechain", "entity": "log"});
    let errors = check(&value, BodyMode::Create).unwrap_err();
    assert_eq!(locs(&errors), vec![json!(["body", "pipeline_config", "source", "chain"])]);
    assert!(errors[0].msg.contains("'base'"));

    value["pipeline_config"]["source"] =
        json!({"chain": "solana", "entity": "nonvoting_transaction", "is_zerolag": true});
    let errors = check(&value, BodyMode::Create).unwrap_err();
    assert_eq!(locs(&errors), vec![json!(["body", "pipeline_config", "source", "is_zerolag"])]);

    value["pipeline_config"]["source"] =
        json!({"chain": "polygon", "entity": "log", "is_zerolag": true});
    assert!(check(&value, BodyMode::Create).unwrap().spec.pipeline_config.source.is_zerolag);
}

#[test]
fn sinks_must_be_exactly_one_kafka_sink_with_a_topic_name() {
    let mut value = body();
    value["pipeline_config"]["sinks"] =
        json!([{"type": "kafka", "name": "a"}, {"type": "kafka", "name": "b"}]);
    let errors = check(&value, BodyMode::Create).unwrap_err();
    assert_eq!(locs(&errors), vec![json!(["body", "pipeline_config", "sinks"])]);

    value["pipeline_config"]["sinks"] = json!([{"type": "sns", "name": "has space", "uid": ""}]);
    let errors = check(&value, BodyMode::Create).unwrap_err();
    assert_eq!(
        locs(&errors),
        vec![
            json!(["body", "pipeline_config", "sinks", 0, "type"]),
            json!(["body", "pipeline_config", "sinks", 0, "name"]),
            json!(["body", "pipeline_config", "sinks", 0, "uid"]),
        ]
    );
    for bad in ["..", "", "a/b", &"x".repeat(MAX_SINK_NAME_LEN + 1)] {
        assert!(check_topic_name(bad).is_err(), "{bad}");
    }
    assert!(check_topic_name("usdc-transfers.v2_x").is_ok());
}

#[test]
fn transform_uids_must_be_unique_and_bounded() {
    let mut value = body();
    value["pipeline_config"]["transforms"] = json!([
        {"type": "v8", "uid": "x", "script": "function transform(r) { return r; }"},
        {"type": "redis_set_filter", "uid": "x", "filter_expr": "root = this.a"},
        {"type": "v8", "uid": "y".repeat(129), "script": "function transform(r) { return r; }"}
    ]);
    let errors = check(&value, BodyMode::Create).unwrap_err();
    assert_eq!(
        locs(&errors),
        vec![
            json!(["body", "pipeline_config", "transforms", 2, "uid"]),
            json!(["body", "pipeline_config", "transforms", 1, "uid"]),
        ]
    );
}

#[test]
fn inline_set_values_become_lowercased_initial_values_on_create_only() {
    let mut value = body();
    value["pipeline_config"]["transforms"][0]["uid"] = json!("tf-1");
    value["pipeline_config"]["transforms"][0]["set_values"] = json!(["0xAB", "0xab", "0xCd"]);
    let valid = check(&value, BodyMode::Create).unwrap();
    assert_eq!(
        valid.initial_filter_values,
        vec![("tf-1".to_owned(), vec!["0xab".to_owned(), "0xcd".to_owned()])]
    );

    let errors = check(&value, BodyMode::Update).unwrap_err();
    assert_eq!(
        locs(&errors),
        vec![json!(["body", "pipeline_config", "transforms", 0, "set_values"])]
    );
    assert!(errors[0].msg.contains("filter-values"));
}

#[test]
fn transform_type_defaults_to_v8() {
    let mut value = body();
    value["pipeline_config"]["transforms"] =
        json!([{"script": "function transform(r) { return r; }"}]);
    let spec = check(&value, BodyMode::Create).unwrap().spec;
    assert!(matches!(spec.pipeline_config.transforms[0], Transform::Script { .. }));
    let _ = LocItem::from(0usize);
}

#[test]
fn a_sink_config_is_typed_by_its_type_and_stored_in_the_api_shape() {
    let sink = json!({"type": "kafka", "name": "out", "uid": "sk-1"});
    let mut errors = crate::validation::Violations::default();
    let config = SinkConfig::validate(&sink, crate::validation::Loc::body(), &mut errors).unwrap();
    assert!(errors.is_empty());
    assert_eq!(
        config,
        SinkConfig::Kafka(ManagedSinkConfig { name: "out".to_owned(), uid: "sk-1".to_owned() })
    );
    assert_eq!((config.type_name(), config.name(), config.uid()), ("kafka", "out", "sk-1"));
    // Pipelines stored before the enum read back unchanged, and are written the same way.
    assert_eq!(serde_json::to_value(&config).unwrap(), sink);
    assert_eq!(serde_json::from_value::<SinkConfig>(sink).unwrap(), config);

    let mut errors = crate::validation::Violations::default();
    let webhook = json!({"type": "webhook", "name": "out"});
    assert!(SinkConfig::validate(&webhook, crate::validation::Loc::body(), &mut errors).is_none());
    assert_eq!(locs(&errors.finish(()).unwrap_err()), vec![json!(["body", "type"])]);
}
