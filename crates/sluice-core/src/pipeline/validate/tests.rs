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
    value["pipeline_config"]["transforms"][0]["filter_expr"] = json!("root = this.payload.status");
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
    value["pipeline_config"]["transforms"][0]["filter_expr"] = json!("root = this.address");
    assert!(check(&value, BodyMode::Create).unwrap().spec.pipeline_config.source.is_zerolag);
}

#[test]
fn sinks_must_be_exactly_one_kafka_sink_with_a_topic_name() {
    let mut value = body();
    value["pipeline_config"]["sinks"] =
        json!([{"type": "kafka", "name": "a"}, {"type": "kafka", "name": "b"}]);
    let errors = check(&value, BodyMode::Create).unwrap_err();
    assert_eq!(locs(&errors), vec![json!(["body", "pipeline_config", "sinks"])]);

    value["pipeline_config"]["sinks"] =
        json!([{"type": "carrier_pigeon", "name": "has space", "uid": "", "url": "x"}]);
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
    assert_eq!(locs(&errors.finish(()).unwrap_err()), vec![json!(["body", "url"])]);
}

fn sink_errors(sink: Value) -> Result<SinkConfig, Vec<Value>> {
    let mut errors = crate::validation::Violations::default();
    let config = SinkConfig::validate(&sink, crate::validation::Loc::body(), &mut errors);
    match errors.finish(()) {
        Ok(()) => Ok(config.expect("no errors means a config")),
        Err(errors) => {
            assert!(config.is_none());
            Err(locs(&errors))
        }
    }
}

#[test]
fn webhook_sinks_take_http_urls_a_secret_name_and_a_compression() {
    let config = sink_errors(json!({
        "type": "webhook", "name": "hook", "url": "https://example.com/in?t=1",
        "hash_key": "WEBHOOK_KEY", "compression": "gzip", "uid": "sk-w"
    }))
    .unwrap();
    assert_eq!(config.secrets(), vec![("hash_key", "WEBHOOK_KEY")]);
    let stored = serde_json::to_value(&config).unwrap();
    assert_eq!(serde_json::from_value::<SinkConfig>(stored.clone()).unwrap(), config);
    assert_eq!(stored["compression"], "gzip");
    // Defaults: no signing, no compression; hash_key is not written when absent.
    let plain =
        sink_errors(json!({"type": "webhook", "name": "h", "url": "http://10.0.0.1:9000/"}))
            .unwrap();
    let stored = serde_json::to_value(&plain).unwrap();
    assert!(stored.get("hash_key").is_none());
    assert_eq!(stored["compression"], "none");
    for (field, bad) in [
        ("url", json!("ftp://example.com")),
        ("url", json!("not a url")),
        ("url", json!(7)),
        ("hash_key", json!("has space")),
        ("compression", json!("brotli")),
    ] {
        let mut sink = json!({"type": "webhook", "name": "h", "url": "https://e.com"});
        sink[field] = bad.clone();
        assert_eq!(sink_errors(sink).unwrap_err(), vec![json!(["body", field])], "{field}: {bad}");
    }
}

#[test]
fn external_kafka_sinks_need_sasl_secrets_exactly_with_a_sasl_protocol() {
    let ok = json!({
        "type": "external_kafka", "name": "k", "bootstrap_servers": "b1:9092, b2:9093",
        "topic": "transfers.v1", "security_protocol": "sasl_ssl", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username_secret": "KAFKA_USER", "sasl_password_secret": "KAFKA_PASS", "compression": "lz4"
    });
    let config = sink_errors(ok.clone()).unwrap();
    assert_eq!(
        config.secrets(),
        vec![("sasl_username_secret", "KAFKA_USER"), ("sasl_password_secret", "KAFKA_PASS")]
    );
    let mut missing = ok.clone();
    missing.as_object_mut().unwrap().remove("sasl_password_secret");
    assert_eq!(sink_errors(missing).unwrap_err(), vec![json!(["body", "sasl_password_secret"])]);
    let mut plaintext_with_user = ok.clone();
    plaintext_with_user["security_protocol"] = json!("plaintext");
    assert_eq!(sink_errors(plaintext_with_user).unwrap_err().len(), 3);
    let mut bad_servers = ok.clone();
    bad_servers["bootstrap_servers"] = json!("kafka://b1:9092");
    assert_eq!(sink_errors(bad_servers).unwrap_err(), vec![json!(["body", "bootstrap_servers"])]);
    let mut bad_topic = ok;
    bad_topic["topic"] = json!("a/b");
    assert_eq!(sink_errors(bad_topic).unwrap_err(), vec![json!(["body", "topic"])]);
    let plain = sink_errors(json!({
        "type": "external_kafka", "name": "k", "bootstrap_servers": "127.0.0.1:9092", "topic": "t"
    }))
    .unwrap();
    assert!(plain.secrets().is_empty());
}

#[test]
fn nats_and_sns_sinks_check_their_addresses_and_credentials() {
    let nats = sink_errors(json!({
        "type": "nats", "name": "n", "url": "nats://127.0.0.1:4222", "subject": "chain.transfers",
        "username": "app", "password_secret": "NATS_PASS"
    }))
    .unwrap();
    assert_eq!(nats.secrets(), vec![("password_secret", "NATS_PASS")]);
    for (field, bad) in [
        ("subject", json!("chain.*")),
        ("url", json!("http://127.0.0.1:4222")),
        ("url", json!("nats://user:pw@127.0.0.1:4222")),
    ] {
        let mut sink = json!({"type": "nats", "name": "n", "url": "nats://h:4222", "subject": "s"});
        sink[field] = bad;
        assert_eq!(sink_errors(sink).unwrap_err(), vec![json!(["body", field])]);
    }
    let lone_user = json!({"type": "nats", "name": "n", "url": "nats://h:4222", "subject": "s", "username": "u"});
    assert_eq!(sink_errors(lone_user).unwrap_err(), vec![json!(["body", "password_secret"])]);

    let sns = sink_errors(json!({
        "type": "sns", "name": "s", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:alerts",
        "access_key_id_secret": "AWS_ID", "secret_access_key_secret": "AWS_KEY"
    }))
    .unwrap();
    assert_eq!(sns.secrets().len(), 2);
    assert_eq!(
        crate::pipeline::sink::topic_arn_region("arn:aws:sns:eu-west-1:1:t"),
        Some("eu-west-1")
    );
    let bad = json!({"type": "sns", "name": "s", "topic_arn": "arn:aws:sqs:eu-west-1:1:q",
        "endpoint": "127.0.0.1:4566"});
    assert_eq!(
        sink_errors(bad).unwrap_err(),
        vec![
            json!(["body", "topic_arn"]),
            json!(["body", "endpoint"]),
            json!(["body", "access_key_id_secret"]),
            json!(["body", "secret_access_key_secret"]),
        ]
    );
}

#[test]
fn a_filter_path_must_name_a_field_of_the_source_records() {
    let filter_loc = json!(["body", "pipeline_config", "transforms", 0, "filter_expr"]);
    let with = |entity: &str, expr: &str| {
        let mut value = body();
        value["pipeline_config"]["source"] = json!({"chain": "base", "entity": entity});
        if entity == "order" {
            value["pipeline_config"]["source"]["chain"] = json!("hyperliquid");
        }
        value["pipeline_config"]["transforms"][0]["filter_expr"] = json!(expr);
        check(&value, BodyMode::Create)
    };
    let errors = with("erc20_token_transfer", "root = this.token_adress").unwrap_err();
    assert_eq!(locs(&errors), vec![filter_loc.clone()]);
    assert_eq!(errors[0].kind, "value_error");
    assert!(errors[0].msg.contains("no field `token_adress`"), "{}", errors[0].msg);
    assert!(errors[0].msg.contains("token_address"), "names the known fields: {}", errors[0].msg);
    for bad in ["root = this.token_address.x", "root = this.0", "root = this.log_index.0"] {
        let errors = with("erc20_token_transfer", bad).unwrap_err();
        assert_eq!(locs(&errors), vec![filter_loc.clone()], "{bad}");
    }
    for bad in ["root = this.payload", "root = this.payload.coin", "root = this.coin"] {
        assert!(with("order", bad).is_err(), "{bad}");
    }
    for good in [("log", "root = this.topic0"), ("decoded_log", "root = this.params.from")] {
        assert!(with(good.0, good.1).is_ok(), "{good:?}");
    }
    for good in ["root = this.status", "root = this.payload.status", "root = this.order.coin"] {
        assert!(with("order", good).is_ok(), "{good}");
    }
    for good in ["root = this.payload.order.oid", "root = this.user"] {
        assert!(with("order", good).is_ok(), "{good}");
    }
}

#[test]
fn entities_without_a_record_schema_take_any_filter_path() {
    let catalog = Catalog::from_file_text(
        "[[sources]]\nchain = \"x\"\nentity = \"custom\"\nsource_type = \"kafka\"\n",
    )
    .unwrap();
    let mut value = body();
    value["pipeline_config"]["source"] = json!({"chain": "x", "entity": "custom"});
    value["pipeline_config"]["transforms"][0]["filter_expr"] = json!("root = this.anything.0");
    assert!(validate_pipeline_body(value.as_object().unwrap(), &catalog, BodyMode::Create).is_ok());
}
