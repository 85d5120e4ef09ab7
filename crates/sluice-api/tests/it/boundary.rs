//! The request boundary: authentication and permission are decided before any input is
//! parsed, and every query, path and body failure is a JSON 422 naming the parameter with a
//! pydantic-style `type`.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{Harness, pipeline_body};

const INGEST: &str = "/api/v1/streams/base/erc20_token_transfer/records";

/// The one violation of a 422, asserting there is exactly one.
fn only_violation(status: StatusCode, body: &Value) -> &Value {
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let detail = body["detail"].as_array().unwrap();
    assert_eq!(detail.len(), 1, "{body}");
    &detail[0]
}

#[tokio::test]
async fn ingest_decides_the_key_and_the_role_before_reading_the_query() {
    let h = Harness::new().await;
    let path = format!("{INGEST}?zerolag=maybe");
    let line = Value::String("{\"not\": \"a record\"}\n".to_owned());

    let (status, body) = h.call(Method::POST, &path, None, Some(line.clone())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("API key"), "{body}");

    let user = h.user("acme", "data", "ann").await;
    let (status, body) = h.call(Method::POST, &path, Some(&user.key), Some(line.clone())).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("operator"), "{body}");

    let identity = h.store.ensure_identity("sluice", "ops", "root", true).await.unwrap();
    let key = sluice_api::auth::issue_key(h.store.as_ref(), &identity.user.id, None)
        .await
        .unwrap()
        .unwrap();
    let (status, body) = h.call(Method::POST, &path, Some(&key), Some(line)).await;
    let violation = only_violation(status, &body);
    assert_eq!(violation["loc"], json!(["query", "zerolag"]));
    assert_eq!(violation["type"], "bool_parsing");
}

#[tokio::test]
async fn query_errors_name_the_parameter_with_a_pydantic_type() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let id = h.create(&ann, pipeline_body("p")).await["id"].as_str().unwrap().to_owned();
    let records = format!("/api/v1/beam/{id}/sinks/sk/records");
    for (query, param, kind) in [
        ("limit=-1", "limit", "greater_than_equal"),
        ("limit=0", "limit", "greater_than_equal"),
        ("limit=10001", "limit", "less_than_equal"),
        ("limit=ten", "limit", "int_parsing"),
        ("offset=-1", "offset", "greater_than_equal"),
        ("offset=1.5", "offset", "int_parsing"),
        ("offset=99999999999999999999", "offset", "less_than_equal"),
        ("wait_ms=30001", "wait_ms", "less_than_equal"),
    ] {
        let (status, body) = h.get(&format!("{records}?{query}"), &ann).await;
        let violation = only_violation(status, &body);
        assert_eq!(violation["loc"], json!(["query", param]), "{query}: {body}");
        assert_eq!(violation["type"], kind, "{query}: {body}");
    }
    // Every bad parameter is reported at once.
    let (status, body) = h.get(&format!("{records}?limit=-1&offset=x&wait_ms=-5"), &ann).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["detail"].as_array().unwrap().len(), 3, "{body}");

    let logs = format!("/api/v1/beam/{id}/logs?limit=1001");
    let violation_body = h.get(&logs, &ann).await;
    let violation = only_violation(violation_body.0, &violation_body.1);
    assert_eq!(violation["loc"], json!(["query", "limit"]));
    assert_eq!(violation["type"], "less_than_equal");

    let metrics = format!("/api/v1/beam/{id}/deploy/metrics?time_range=2h");
    let (status, body) = h.get(&metrics, &ann).await;
    assert_eq!(only_violation(status, &body)["type"], "enum");

    let (status, body) =
        h.get(&format!("/api/v1/beam/{id}/transforms/x/filter-values/check"), &ann).await;
    // The transform is checked first (permission and existence), then the query.
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // A parameter the route does not declare is a 422 naming it (spec.rs walks every route).
    let (status, body) = h.get(&format!("/api/v1/beam/{id}?bogus=1"), &ann).await;
    let violation = only_violation(status, &body);
    assert_eq!(violation["loc"], json!(["query", "bogus"]));
    assert_eq!(violation["type"], "extra_forbidden");
    // ...after the permission check, as every query rule: a stranger still gets the 404.
    let eve = h.user("evil", "corp", "eve").await;
    let (status, body) = h.get(&format!("/api/v1/beam/{id}?bogus=1"), &eve).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn a_stranger_with_a_bad_query_or_body_learns_only_that_the_pipeline_is_not_theirs() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let eve = h.user("evil", "corp", "eve").await;
    let id = h.create(&ann, pipeline_body("p")).await["id"].as_str().unwrap().to_owned();

    let (status, body) = h.get(&format!("/api/v1/beam/{id}/sinks/sk/records?limit=-1"), &eve).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = h.get(&format!("/api/v1/beam/{id}/logs?limit=x"), &eve).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let garbage = Value::String("{not json".to_owned());
    let path = format!("/api/v1/beam/{id}");
    let (status, body) = h.call(Method::PUT, &path, Some(&eve.key), Some(garbage.clone())).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = h.call(Method::PUT, &path, None, Some(garbage.clone())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    // The owner is told what is wrong with the body.
    let (status, body) = h.call(Method::PUT, &path, Some(&ann.key), Some(garbage)).await;
    assert_eq!(only_violation(status, &body)["type"], "json_invalid");
}

#[tokio::test]
async fn invalid_utf8_in_a_path_or_query_is_a_json_422() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;

    let (status, body) = h.get("/api/v1/beam/%FF", &ann).await;
    let violation = only_violation(status, &body);
    assert_eq!(violation["loc"], json!(["path", "config_id"]));
    assert_eq!(violation["type"], "string_unicode");

    let (status, body) = h.get("/api/v1/beam/datasets/%FF%FE/entries", &ann).await;
    assert_eq!(only_violation(status, &body)["loc"], json!(["path", "dataset_id"]));

    let (status, created) =
        h.post("/api/v1/beam/datasets", &ann, json!({"name": "watchlist"})).await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let dataset = created["id"].as_str().unwrap();
    let check = format!("/api/v1/beam/datasets/{dataset}/entries/check");
    let (status, body) = h.get(&format!("{check}?value=%FF%FE"), &ann).await;
    let violation = only_violation(status, &body);
    assert_eq!(violation["loc"], json!(["query", "value"]));
    assert_eq!(violation["type"], "string_unicode");
    // Valid escapes still decode.
    let (status, body) = h.get(&format!("{check}?value=%C3%A9+x"), &ann).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Without a key it is a 401 whatever the path holds.
    let (status, body) = h.call(Method::GET, "/api/v1/beam/%FF", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
}

#[tokio::test]
async fn null_permission_lists_are_422_not_an_empty_list() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let id = h.create(&ann, pipeline_body("p")).await["id"].as_str().unwrap().to_owned();
    let path = format!("/api/v1/beam/{id}/permissions");
    let (status, body) =
        h.put(&path, &ann, json!({"editors": [], "readers": null, "viewer_teams": []})).await;
    let violation = only_violation(status, &body);
    assert_eq!(violation["loc"], json!(["body", "readers"]));
    assert_eq!(violation["type"], "list_type");
    // Left out, a list is empty.
    let (status, body) = h.put(&path, &ann, json!({"editors": []})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn an_ingest_body_without_a_record_is_a_422() {
    let h = Harness::new().await;
    let identity = h.store.ensure_identity("sluice", "ops", "root", true).await.unwrap();
    let key = sluice_api::auth::issue_key(h.store.as_ref(), &identity.user.id, None)
        .await
        .unwrap()
        .unwrap();
    for body in ["", "\n  \n"] {
        let raw = Value::String(body.to_owned());
        let (status, answer) = h.call(Method::POST, INGEST, Some(&key), Some(raw)).await;
        let violation = only_violation(status, &answer);
        assert_eq!(violation["loc"], json!(["body"]), "{answer}");
        assert_eq!(violation["type"], "missing", "{answer}");
    }
}

#[tokio::test]
async fn unknown_paths_and_methods_answer_json_too() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let (status, body) = h.get("/api/v1/nowhere", &ann).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body, json!({"detail": "Not Found"}));
    let (status, body) = h.call(Method::PATCH, "/api/v1/beam/datasets", Some(&ann.key), None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body, json!({"detail": "Method Not Allowed"}));
}
