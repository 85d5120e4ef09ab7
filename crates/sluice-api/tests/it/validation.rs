//! Every 422 rule of the pipeline body, through the API, with its `loc` and `type`.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Harness, pipeline_body};

type Mutation = fn(&mut Value);

/// `(what, how to break a valid body, expected loc, expected type)`.
#[allow(clippy::too_many_lines, reason = "a table of every 422 rule, one entry per rule")]
fn rules() -> Vec<(&'static str, Mutation, Value, &'static str)> {
    vec![
        (
            "name missing",
            |b| {
                b.as_object_mut().unwrap().remove("name");
            },
            json!(["body", "name"]),
            "missing",
        ),
        ("name empty", |b| b["name"] = json!("  "), json!(["body", "name"]), "value_error"),
        ("name not a string", |b| b["name"] = json!(7), json!(["body", "name"]), "string_type"),
        (
            "description missing",
            |b| {
                b.as_object_mut().unwrap().remove("description");
            },
            json!(["body", "description"]),
            "missing",
        ),
        ("tags not a list", |b| b["tags"] = json!("a"), json!(["body", "tags"]), "list_type"),
        (
            "tag not a string",
            |b| b["tags"] = json!(["a", 2]),
            json!(["body", "tags", 1]),
            "string_type",
        ),
        (
            "static_egress_ip not a boolean",
            |b| b["static_egress_ip"] = json!("yes"),
            json!(["body", "static_egress_ip"]),
            "bool_type",
        ),
        ("pod_size unknown", |b| b["pod_size"] = json!("XXL"), json!(["body", "pod_size"]), "enum"),
        (
            "delivery_guarantee unknown",
            |b| b["delivery_guarantee"] = json!("exactly_once"),
            json!(["body", "delivery_guarantee"]),
            "enum",
        ),
        (
            "unknown field",
            |b| b["pod_sise"] = json!("M"),
            json!(["body", "pod_sise"]),
            "extra_forbidden",
        ),
        (
            "pipeline_config missing",
            |b| {
                b.as_object_mut().unwrap().remove("pipeline_config");
            },
            json!(["body", "pipeline_config"]),
            "missing",
        ),
        (
            "pipeline_config not an object",
            |b| b["pipeline_config"] = json!([]),
            json!(["body", "pipeline_config"]),
            "dict_type",
        ),
        (
            "source missing",
            |b| {
                b["pipeline_config"].as_object_mut().unwrap().remove("source");
            },
            json!(["body", "pipeline_config", "source"]),
            "missing",
        ),
        (
            "chain missing",
            |b| {
                b["pipeline_config"]["source"].as_object_mut().unwrap().remove("chain");
            },
            json!(["body", "pipeline_config", "source", "chain"]),
            "missing",
        ),
        (
            "chain not in catalog",
            |b| b["pipeline_config"]["source"]["chain"] = json!("dogechain"),
            json!(["body", "pipeline_config", "source", "chain"]),
            "value_error",
        ),
        (
            "entity not on chain",
            |b| b["pipeline_config"]["source"]["entity"] = json!("order"),
            json!(["body", "pipeline_config", "source", "entity"]),
            "value_error",
        ),
        (
            "zerolag unsupported",
            |b| {
                b["pipeline_config"]["source"] =
                    json!({"chain": "hyperliquid", "entity": "fill", "is_zerolag": true})
            },
            json!(["body", "pipeline_config", "source", "is_zerolag"]),
            "value_error",
        ),
        (
            "unknown source field",
            |b| b["pipeline_config"]["source"]["network"] = json!("x"),
            json!(["body", "pipeline_config", "source", "network"]),
            "extra_forbidden",
        ),
        (
            "transforms missing",
            |b| {
                b["pipeline_config"].as_object_mut().unwrap().remove("transforms");
            },
            json!(["body", "pipeline_config", "transforms"]),
            "missing",
        ),
        (
            "transforms not a list",
            |b| b["pipeline_config"]["transforms"] = json!({}),
            json!(["body", "pipeline_config", "transforms"]),
            "list_type",
        ),
        (
            "transform type unknown",
            |b| b["pipeline_config"]["transforms"][0]["type"] = json!("wasm"),
            json!(["body", "pipeline_config", "transforms", 0, "type"]),
            "enum",
        ),
        (
            "filter_expr missing",
            |b| {
                b["pipeline_config"]["transforms"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("filter_expr");
            },
            json!(["body", "pipeline_config", "transforms", 0, "filter_expr"]),
            "missing",
        ),
        (
            "filter_expr unsupported",
            |b| {
                b["pipeline_config"]["transforms"][0]["filter_expr"] =
                    json!("root = this.address.lowercase()")
            },
            json!(["body", "pipeline_config", "transforms", 0, "filter_expr"]),
            "value_error",
        ),
        (
            "script empty",
            |b| b["pipeline_config"]["transforms"] = json!([{"type": "v8", "script": ""}]),
            json!(["body", "pipeline_config", "transforms", 0, "script"]),
            "value_error",
        ),
        (
            "script missing",
            |b| b["pipeline_config"]["transforms"] = json!([{"type": "v8"}]),
            json!(["body", "pipeline_config", "transforms", 0, "script"]),
            "missing",
        ),
        (
            "uid too long",
            |b| b["pipeline_config"]["transforms"][0]["uid"] = json!("u".repeat(129)),
            json!(["body", "pipeline_config", "transforms", 0, "uid"]),
            "value_error",
        ),
        (
            "uid repeated",
            |b| {
                b["pipeline_config"]["transforms"] = json!([
                    {"type": "redis_set_filter", "uid": "x", "filter_expr": "root = this.a"},
                    {"type": "redis_set_filter", "uid": "x", "filter_expr": "root = this.b"}
                ])
            },
            json!(["body", "pipeline_config", "transforms", 1, "uid"]),
            "value_error",
        ),
        (
            "set_values not strings",
            |b| b["pipeline_config"]["transforms"][0]["set_values"] = json!([1]),
            json!(["body", "pipeline_config", "transforms", 0, "set_values", 0]),
            "string_type",
        ),
        (
            "sinks missing",
            |b| {
                b["pipeline_config"].as_object_mut().unwrap().remove("sinks");
            },
            json!(["body", "pipeline_config", "sinks"]),
            "missing",
        ),
        (
            "no sink",
            |b| b["pipeline_config"]["sinks"] = json!([]),
            json!(["body", "pipeline_config", "sinks"]),
            "value_error",
        ),
        (
            "two sinks",
            |b| {
                b["pipeline_config"]["sinks"] =
                    json!([{"type": "kafka", "name": "a"}, {"type": "kafka", "name": "b"}])
            },
            json!(["body", "pipeline_config", "sinks"]),
            "value_error",
        ),
        (
            "sink type unsupported",
            |b| b["pipeline_config"]["sinks"][0]["type"] = json!("pubsub"),
            json!(["body", "pipeline_config", "sinks", 0, "type"]),
            "value_error",
        ),
        (
            "sink name not a topic name",
            |b| b["pipeline_config"]["sinks"][0]["name"] = json!("usdc transfers!"),
            json!(["body", "pipeline_config", "sinks", 0, "name"]),
            "value_error",
        ),
        (
            "sink name missing",
            |b| {
                b["pipeline_config"]["sinks"][0].as_object_mut().unwrap().remove("name");
            },
            json!(["body", "pipeline_config", "sinks", 0, "name"]),
            "missing",
        ),
        (
            "sink not an object",
            |b| b["pipeline_config"]["sinks"] = json!(["kafka"]),
            json!(["body", "pipeline_config", "sinks", 0]),
            "dict_type",
        ),
    ]
}

#[tokio::test]
async fn each_rule_is_a_422_with_its_loc_on_create_and_update() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let stored = h.create(&ann, pipeline_body("kept")).await;
    let path = format!("/api/v1/beam/{}", stored["id"].as_str().unwrap());
    for (what, mutate, loc, kind) in rules() {
        let mut body = pipeline_body("p");
        mutate(&mut body);
        let mut answers = vec![h.post("/api/v1/beam", &ann, body.clone()).await];
        // Inline set_values exist only on create; on update they are rejected as such.
        if !what.starts_with("set_values") {
            answers.push(h.put(&path, &ann, body.clone()).await);
        }
        for (status, answer) in answers {
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {answer}");
            let detail = answer["detail"].as_array().unwrap();
            assert_eq!(detail.len(), 1, "{what}: {answer}");
            assert_eq!(detail[0]["loc"], loc, "{what}");
            assert_eq!(detail[0]["type"], kind, "{what}");
            assert!(!detail[0]["msg"].as_str().unwrap().is_empty());
        }
    }
    // Nothing was created, and the stored pipeline was not touched by the failed updates.
    let (_, list) = h.get("/api/v1/beam", &ann).await;
    assert_eq!(list, json!([stored]));
}

#[tokio::test]
async fn several_violations_are_reported_together() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let mut body = pipeline_body("p");
    body["pod_size"] = json!("XXL");
    body["pipeline_config"]["sinks"] = json!([]);
    body["pipeline_config"]["transforms"][0]["filter_expr"] = json!("this.address");
    let (status, answer) = h.post("/api/v1/beam", &ann, body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let locs: Vec<&Value> =
        answer["detail"].as_array().unwrap().iter().map(|d| &d["loc"]).collect();
    assert_eq!(
        locs,
        [
            &json!(["body", "pod_size"]),
            &json!(["body", "pipeline_config", "transforms", 0, "filter_expr"]),
            &json!(["body", "pipeline_config", "sinks"]),
        ]
    );
    let filter_msg = answer["detail"][1]["msg"].as_str().unwrap();
    assert!(
        filter_msg.contains("root = this.<field>"),
        "the message names the supported form: {filter_msg}"
    );
}

#[tokio::test]
async fn malformed_bodies_are_422() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let (status, answer) = h.post("/api/v1/beam", &ann, Value::String("{not json".into())).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(answer["detail"][0]["type"], "json_invalid");
    assert_eq!(answer["detail"][0]["loc"], json!(["body"]));
    let (status, answer) = h.post("/api/v1/beam", &ann, json!([1, 2])).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(answer["detail"][0]["type"], "dict_type");
}

#[tokio::test]
async fn a_body_with_a_repeated_key_at_any_depth_is_422_at_that_key() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let body = pipeline_body("p").to_string();
    let top = body.replacen(r#""name":"p""#, r#""name":"p","name":"q""#, 1);
    let nested = body.replacen(
        r#""entity":"erc20_token_transfer""#,
        r#""entity":"erc20_token_transfer","entity":"log""#,
        1,
    );
    for (raw, loc, msg) in [
        (top, json!(["body", "name"]), r#"Duplicate key "name""#),
        (
            nested,
            json!(["body", "pipeline_config", "source", "entity"]),
            r#"Duplicate key "pipeline_config"."source"."entity""#,
        ),
    ] {
        assert_ne!(raw, body);
        let (status, answer) = h.post("/api/v1/beam", &ann, Value::String(raw)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        assert_eq!(answer["detail"][0]["type"], "json_duplicate_key", "{answer}");
        assert_eq!(answer["detail"][0]["loc"], loc);
        assert_eq!(answer["detail"][0]["msg"], msg);
    }
    let (status, listed) = h.get("/api/v1/beam", &ann).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!listed.to_string().contains(r#""name":"q""#), "nothing was created: {listed}");

    let id = h.create(&ann, pipeline_body("p")).await["id"].as_str().unwrap().to_owned();
    let uid = h.get(&format!("/api/v1/beam/{id}"), &ann).await.1["pipeline_config"]["transforms"]
        [0]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let values = format!("/api/v1/beam/{id}/transforms/{uid}/filter-values");
    let raw = r#"{"values":["0xa"],"values":["0xb"]}"#.to_owned();
    let (status, answer) = h.post(&values, &ann, Value::String(raw)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["detail"][0]["type"], "json_duplicate_key");
    assert_eq!(answer["detail"][0]["loc"], json!(["body", "values"]));
}

#[tokio::test]
async fn inline_set_values_are_rejected_on_update_with_a_pointer_to_filter_values() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let id = h.create(&ann, pipeline_body("p")).await["id"].as_str().unwrap().to_owned();
    let mut body = pipeline_body("p");
    body["pipeline_config"]["transforms"][0]["set_values"] = json!(["0xa"]);
    let (status, answer) = h.put(&format!("/api/v1/beam/{id}"), &ann, body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        answer["detail"][0]["loc"],
        json!(["body", "pipeline_config", "transforms", 0, "set_values"])
    );
    assert!(answer["detail"][0]["msg"].as_str().unwrap().contains("filter-values"));
}
