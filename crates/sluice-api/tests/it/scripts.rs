//! `v8` transforms are compiled on create and update: a broken script is a 422 on its
//! `script` field carrying the engine's message and line, and nothing is stored.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Harness, pipeline_body};

fn with_transforms(transforms: Value) -> Value {
    let mut body = pipeline_body("scripted");
    body["pipeline_config"]["transforms"] = transforms;
    body
}

fn only_detail(answer: &Value) -> &Value {
    let detail = answer["detail"].as_array().expect("a 422 detail array");
    assert_eq!(detail.len(), 1, "{answer}");
    &detail[0]
}

#[tokio::test]
async fn a_syntax_error_is_a_422_on_the_script_with_the_engine_message_and_line() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let body = with_transforms(json!([
        {"type": "redis_set_filter", "filter_expr": "root = this.token_address"},
        {"type": "v8", "script": "function transform(r) {\n  r.x = ;\n  return r;\n}"}
    ]));
    let (status, answer) = h.post("/api/v1/beam", &ann, body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let detail = only_detail(&answer);
    assert_eq!(detail["loc"], json!(["body", "pipeline_config", "transforms", 1, "script"]));
    assert_eq!(detail["type"], "value_error");
    let msg = detail["msg"].as_str().unwrap();
    assert!(msg.starts_with("SyntaxError: unexpected token"), "{msg}");
    assert!(msg.contains("line 2"), "{msg}");
    let (_, listed) = h.get("/api/v1/beam", &ann).await;
    assert_eq!(listed, json!([]), "nothing was stored");
}

#[tokio::test]
async fn a_script_without_transform_is_a_422() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let body = with_transforms(json!([
        {"type": "v8", "script": "function transfrom(r) { return r; }"}
    ]));
    let (status, answer) = h.post("/api/v1/beam", &ann, body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let detail = only_detail(&answer);
    assert_eq!(detail["loc"], json!(["body", "pipeline_config", "transforms", 0, "script"]));
    assert!(detail["msg"].as_str().unwrap().contains("function named transform"), "{answer}");
}

#[tokio::test]
async fn every_broken_script_is_reported_and_top_level_failures_count() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let body = with_transforms(json!([
        {"type": "v8", "script": "function transform(r) { return r; }"},
        {"type": "v8", "script": "const transform = 1;"},
        {"type": "v8", "script": "function transform(r) { return r; }\nundefinedThing.x;"},
        {"type": "v8", "script": "while (true) {}\nfunction transform(r) { return r; }"}
    ]));
    let (status, answer) = h.post("/api/v1/beam", &ann, body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let detail = answer["detail"].as_array().unwrap();
    let locs: Vec<&Value> = detail.iter().map(|d| &d["loc"][3]).collect();
    assert_eq!(locs, vec![&json!(1), &json!(2), &json!(3)], "{answer}");
    let msgs: Vec<&str> = detail.iter().map(|d| d["msg"].as_str().unwrap()).collect();
    assert!(msgs[0].contains("transform is a number"), "{}", msgs[0]);
    assert!(msgs[1].starts_with("ReferenceError") && msgs[1].contains("line 2"), "{}", msgs[1]);
    assert!(msgs[2].contains("time budget"), "{}", msgs[2]);
}

#[tokio::test]
async fn a_broken_script_on_update_is_a_422_and_keeps_the_stored_pipeline() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let good = with_transforms(json!([
        {"type": "v8", "uid": "s1", "script": "function transform(r) { return r; }"}
    ]));
    let created = h.create(&ann, good).await;
    let id = created["id"].as_str().unwrap();
    let broken = with_transforms(json!([
        {"type": "v8", "uid": "s1", "script": "function transform(r) {\n\n  return r.;\n}"}
    ]));
    let (status, answer) = h.put(&format!("/api/v1/beam/{id}"), &ann, broken).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let detail = only_detail(&answer);
    assert_eq!(detail["loc"], json!(["body", "pipeline_config", "transforms", 0, "script"]));
    assert!(detail["msg"].as_str().unwrap().contains("line 3"), "{answer}");
    let (_, stored) = h.get(&format!("/api/v1/beam/{id}"), &ann).await;
    assert_eq!(stored, created, "the stored pipeline is unchanged");

    let fixed = with_transforms(json!([
        {"type": "v8", "uid": "s1", "script": "const transform = (r) => ({ ...r, seen: true });"}
    ]));
    let (status, updated) = h.put(&format!("/api/v1/beam/{id}"), &ann, fixed).await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!(
        updated["pipeline_config"]["transforms"][0]["script"],
        "const transform = (r) => ({ ...r, seen: true });"
    );
}

#[tokio::test]
async fn valid_scripts_using_beam_and_console_are_accepted() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let script = "console.log('loading');\nfunction transform(r) {\n  if (!beam.contains('whales', [r.from_address, r.to_address])) return null;\n  return [r, { ...r, copy: true }];\n}";
    let created = h.create(&ann, with_transforms(json!([{"type": "v8", "script": script}]))).await;
    assert_eq!(created["pipeline_config"]["transforms"][0]["script"], script);
}
