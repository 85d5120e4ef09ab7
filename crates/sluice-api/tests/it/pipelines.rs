//! Create, list, read, update and delete through the HTTP API.

use axum::http::{Method, StatusCode};
use chrono::Duration;
use serde_json::{Value, json};
use sluice_api::Limits;

use crate::harness::{Harness, pipeline_body};

#[tokio::test]
async fn create_fills_defaults_server_fields_uids_and_catalog_source_type() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let created = h.create(&ann, pipeline_body("usdc")).await;
    assert_eq!(created["name"], "usdc");
    assert_eq!(created["description"], "USDC transfers on Base");
    assert_eq!(created["tags"], Value::Null);
    assert_eq!(created["static_egress_ip"], false);
    assert_eq!(created["pod_size"], "S");
    assert_eq!(created["delivery_guarantee"], "at_least_once");
    assert_eq!(created["owner_org_team_user_id"], ann.id());
    assert_eq!(created["organization_id"], ann.identity.org.id.as_str());
    assert_eq!(created["created_at"], "2026-11-21T12:00:00.000000Z");
    assert_eq!(created["updated_at"], created["created_at"]);
    let config = &created["pipeline_config"];
    assert_eq!(
        config["source"],
        json!({"type": "pubsub", "chain": "base", "entity": "erc20_token_transfer", "is_zerolag": false})
    );
    assert!(config["transforms"][0]["uid"].as_str().unwrap().starts_with("tf-"));
    assert!(config["sinks"][0]["uid"].as_str().unwrap().starts_with("sk-"));
    assert!(!created["id"].as_str().unwrap().is_empty());

    let (status, read) =
        h.get(&format!("/api/v1/beam/{}", created["id"].as_str().unwrap()), &ann).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read, created);
}

#[tokio::test]
async fn create_keeps_given_uids_and_options_and_ignores_server_managed_fields() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let mut body = pipeline_body("p");
    body["id"] = json!("chosen-id");
    body["owner_org_team_user_id"] = json!("someone-else");
    body["organization_id"] = json!("other-org");
    body["created_at"] = json!("2000-01-01T00:00:00Z");
    body["tags"] = json!(["usdc", "base"]);
    body["static_egress_ip"] = json!(true);
    body["pod_size"] = json!("XL");
    body["delivery_guarantee"] = json!("best_effort");
    body["pipeline_config"]["source"] =
        json!({"type": "kafka", "chain": "polygon", "entity": "log", "is_zerolag": true});
    body["pipeline_config"]["transforms"][0]["filter_expr"] = json!("root = this.address");
    body["pipeline_config"]["transforms"][0]["uid"] = json!("tf-001");
    body["pipeline_config"]["sinks"][0]["uid"] = json!("sk-001");
    let created = h.create(&ann, body).await;
    assert_ne!(created["id"], "chosen-id");
    assert_eq!(created["owner_org_team_user_id"], ann.id());
    assert_eq!(created["organization_id"], ann.identity.org.id.as_str());
    assert_eq!(created["created_at"], "2026-11-21T12:00:00.000000Z");
    assert_eq!(created["tags"], json!(["usdc", "base"]));
    assert_eq!(created["static_egress_ip"], true);
    assert_eq!(created["pod_size"], "XL");
    assert_eq!(created["delivery_guarantee"], "best_effort");
    assert_eq!(
        created["pipeline_config"]["source"]["type"], "pubsub",
        "source type comes from the catalog"
    );
    assert_eq!(created["pipeline_config"]["source"]["is_zerolag"], true);
    assert_eq!(created["pipeline_config"]["transforms"][0]["uid"], "tf-001");
    assert_eq!(created["pipeline_config"]["sinks"][0]["uid"], "sk-001");
}

#[tokio::test]
async fn inline_set_values_become_lowercased_initial_filter_values() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let mut body = pipeline_body("p");
    body["pipeline_config"]["transforms"][0]["uid"] = json!("usdc-filter");
    body["pipeline_config"]["transforms"][0]["set_values"] = json!([
        "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
        "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913",
        "0xABC"
    ]);
    let created = h.create(&ann, body).await;
    assert!(created["pipeline_config"]["transforms"][0].get("set_values").is_none());
    let id = created["id"].as_str().unwrap();
    assert_eq!(h.store.filter_value_count(id, "usdc-filter").await.unwrap(), 2);
}

#[tokio::test]
async fn update_replaces_editable_fields_keeps_server_fields_and_bumps_updated_at() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let mut body = pipeline_body("p");
    body["pipeline_config"]["transforms"][0]["uid"] = json!("f");
    body["pipeline_config"]["transforms"][0]["set_values"] = json!(["0xa"]);
    let created = h.create(&ann, body).await;
    let id = created["id"].as_str().unwrap().to_owned();
    h.clock.advance(Duration::seconds(90));

    let mut update = created.clone();
    update["name"] = json!("renamed");
    update["pod_size"] = json!("M");
    update["created_at"] = json!("1999-01-01T00:00:00Z");
    update["owner_org_team_user_id"] = json!("hijack");
    update["id"] = json!("other");
    let (status, updated) = h.put(&format!("/api/v1/beam/{id}"), &ann, update).await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!(updated["id"], id.as_str());
    assert_eq!(updated["name"], "renamed");
    assert_eq!(updated["pod_size"], "M");
    assert_eq!(updated["owner_org_team_user_id"], ann.id());
    assert_eq!(updated["created_at"], created["created_at"]);
    assert_eq!(updated["updated_at"], "2026-11-21T12:01:30.000000Z");
    assert_eq!(
        updated["pipeline_config"], created["pipeline_config"],
        "a kept uid keeps its transform"
    );
    assert_eq!(
        h.store.filter_value_count(&id, "f").await.unwrap(),
        1,
        "values of a kept set filter survive"
    );
    let (_, read) = h.get(&format!("/api/v1/beam/{id}"), &ann).await;
    assert_eq!(read, updated);

    // Replacing the set filter with a script drops its values.
    let mut update = pipeline_body("renamed");
    update["pipeline_config"]["transforms"] =
        json!([{"type": "v8", "uid": "f", "script": "function transform(r) { return r; }"}]);
    let (status, _) = h.put(&format!("/api/v1/beam/{id}"), &ann, update).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h.store.filter_value_count(&id, "f").await.unwrap(), 0);
}

#[tokio::test]
async fn update_and_delete_of_an_unknown_id_are_404() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let (status, body) = h.put("/api/v1/beam/nope", &ann, pipeline_body("p")).await;
    assert_eq!(
        (status, body),
        (StatusCode::NOT_FOUND, json!({"detail": "Pipeline nope not found"}))
    );
    let (status, _) = h.delete("/api/v1/beam/nope", &ann).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = h.get("/api/v1/beam/nope", &ann).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn delete_answers_with_a_message_and_removes_the_pipeline_and_its_values() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let mut body = pipeline_body("p");
    body["pipeline_config"]["transforms"][0]["uid"] = json!("f");
    body["pipeline_config"]["transforms"][0]["set_values"] = json!(["0xa", "0xb"]);
    let id = h.create(&ann, body).await["id"].as_str().unwrap().to_owned();
    let (status, answer) = h.delete(&format!("/api/v1/beam/{id}"), &ann).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer, json!({"message": format!("Pipeline {id} successfully deleted")}));
    assert_eq!(h.get(&format!("/api/v1/beam/{id}"), &ann).await.0, StatusCode::NOT_FOUND);
    assert_eq!(h.store.filter_value_count(&id, "f").await.unwrap(), 0);
    assert_eq!(h.get("/api/v1/beam", &ann).await.1, json!([]));
}

#[tokio::test]
async fn list_returns_the_callers_pipelines_oldest_first() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    for name in ["first", "second", "third"] {
        h.create(&ann, pipeline_body(name)).await;
        h.clock.advance(Duration::seconds(1));
    }
    let (status, list) = h.get("/api/v1/beam", &ann).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> =
        list.as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["first", "second", "third"]);
}

#[tokio::test]
async fn trailing_slashes_are_accepted() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let (status, created) = h.post("/api/v1/beam/", &ann, pipeline_body("p")).await;
    assert_eq!(status, StatusCode::OK);
    let id = created["id"].as_str().unwrap();
    assert_eq!(h.get(&format!("/api/v1/beam/{id}/"), &ann).await.0, StatusCode::OK);
    assert_eq!(h.get("/api/v1/beam/sources/", &ann).await.0, StatusCode::OK);
}

#[tokio::test]
async fn sources_lists_the_catalog() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let (status, body) = h.get("/api/v1/beam/sources", &ann).await;
    assert_eq!(status, StatusCode::OK);
    let sources = body["sources"].as_array().unwrap();
    assert_eq!(sources.len(), 24);
    assert!(sources.contains(&json!({
        "chain": "hyperliquid", "entity": "order", "zerolag": false,
        "consolidated": false, "default_size": "M", "source_type": "kafka"
    })));
    assert!(sources.contains(&json!({
        "chain": "ethereum", "entity": "log", "zerolag": true,
        "consolidated": false, "default_size": "S", "source_type": "pubsub"
    })));
}

#[tokio::test]
async fn org_flags_gate_the_pipeline_service_and_script_transforms() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let mut script_body = pipeline_body("s");
    script_body["pipeline_config"]["transforms"] =
        json!([{"type": "v8", "script": "function transform(r) { return r; }"}]);
    let existing = h.create(&ann, pipeline_body("p")).await["id"].as_str().unwrap().to_owned();

    h.store.set_org_flags("acme", None, Some(false)).await.unwrap();
    let (status, body) = h.post("/api/v1/beam", &ann, script_body.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body["detail"].as_str().unwrap().contains("custom_transforms"));
    let (status, _) = h.put(&format!("/api/v1/beam/{existing}"), &ann, script_body.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(h.post("/api/v1/beam", &ann, pipeline_body("plain")).await.0, StatusCode::OK);

    h.store.set_org_flags("acme", Some(false), Some(true)).await.unwrap();
    let forbidden = [
        (Method::GET, "/api/v1/beam/sources".to_owned(), None),
        (Method::GET, "/api/v1/beam".to_owned(), None),
        (Method::POST, "/api/v1/beam".to_owned(), Some(pipeline_body("x"))),
        (Method::GET, format!("/api/v1/beam/{existing}"), None),
        (Method::PUT, format!("/api/v1/beam/{existing}"), Some(pipeline_body("x"))),
        (Method::DELETE, format!("/api/v1/beam/{existing}"), None),
        (Method::GET, format!("/api/v1/beam/{existing}/permissions"), None),
        (Method::PUT, format!("/api/v1/beam/{existing}/permissions"), Some(json!({}))),
    ];
    for (method, path, body) in forbidden {
        let (status, answer) = h.call(method.clone(), &path, Some(&ann.key), body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}");
        assert!(answer["detail"].as_str().unwrap().contains("not enabled"));
    }

    h.store.set_org_flags("acme", Some(true), None).await.unwrap();
    assert_eq!(h.post("/api/v1/beam", &ann, script_body).await.0, StatusCode::OK);
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_with_a_detail() {
    let h = Harness::with_limits(Limits { max_body_bytes: 1024, ..Limits::default() }).await;
    let ann = h.user("acme", "data", "ann").await;
    let mut body = pipeline_body("p");
    body["description"] = json!("x".repeat(2000));
    let (status, answer) = h.post("/api/v1/beam", &ann, body).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer, json!({"detail": "request body is larger than the limit of 1024 bytes"}));
    assert_eq!(h.get("/api/v1/beam", &ann).await.1, json!([]), "nothing was stored");
}
