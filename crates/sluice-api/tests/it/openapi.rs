//! The OpenAPI document covers every route, and the operational endpoints answer.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::Harness;

/// Every route the service serves, as `(method, path)`.
const ROUTES: [(&str, &str); 65] = [
    ("post", "/api/v1/warehouse/tables/{table}/rows"),
    ("post", "/api/v1/beam/backfills"),
    ("get", "/api/v1/beam/backfills"),
    ("get", "/api/v1/beam/backfills/tables"),
    ("get", "/api/v1/beam/backfills/{job_id}"),
    ("post", "/api/v1/beam/backfills/{job_id}/cancel"),
    ("get", "/api/v1/beam/backfills/{job_id}/sinks/{sink_uid}/records"),
    ("get", "/api/v1/beam/secrets"),
    ("put", "/api/v1/beam/secrets/{name}"),
    ("delete", "/api/v1/beam/secrets/{name}"),
    ("post", "/api/v1/beam"),
    ("get", "/api/v1/beam"),
    ("get", "/api/v1/beam/sources"),
    ("get", "/api/v1/beam/{config_id}"),
    ("put", "/api/v1/beam/{config_id}"),
    ("delete", "/api/v1/beam/{config_id}"),
    ("get", "/api/v1/beam/{config_id}/permissions"),
    ("put", "/api/v1/beam/{config_id}/permissions"),
    ("put", "/api/v1/beam/{config_id}/transforms"),
    ("patch", "/api/v1/beam/{config_id}/transforms/{transform_uid}"),
    ("get", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values"),
    ("post", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values"),
    ("put", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values"),
    ("delete", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values"),
    ("get", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values/check"),
    ("get", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values/changes"),
    ("get", "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values/count"),
    ("post", "/api/v1/beam/{config_id}/deploy"),
    ("post", "/api/v1/beam/{config_id}/pause"),
    ("post", "/api/v1/beam/{config_id}/teardown"),
    ("get", "/api/v1/beam/{config_id}/sinks/{sink_uid}/records"),
    ("get", "/api/v1/beam/{config_id}/sinks/{sink_uid}/records/stream"),
    ("get", "/api/v1/beam/{config_id}/dead-letters"),
    ("post", "/api/v1/beam/{config_id}/dead-letters/replay"),
    ("get", "/api/v1/beam/{config_id}/logs"),
    ("post", "/api/v1/streams/{chain}/{entity}/records"),
    ("post", "/api/v1/beam/datasets"),
    ("get", "/api/v1/beam/datasets"),
    ("delete", "/api/v1/beam/datasets/{dataset_id}"),
    ("get", "/api/v1/beam/datasets/{dataset_id}/entries"),
    ("post", "/api/v1/beam/datasets/{dataset_id}/entries"),
    ("delete", "/api/v1/beam/datasets/{dataset_id}/entries"),
    ("post", "/api/v1/beam/datasets/entries"),
    ("get", "/api/v1/beam/datasets/{dataset_id}/entries/check"),
    ("get", "/api/v1/me"),
    ("post", "/api/v1/developer/prices"),
    ("post", "/api/v1/developer/prices/history"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/api/v1/openapi.json"),
    ("get", "/docs"),
    ("get", "/api/v1/beam/{config_id}/deploy/stats"),
    ("get", "/api/v1/beam/{config_id}/deploy/metrics"),
    ("get", "/metrics"),
    ("get", "/api/v1/chains"),
    ("get", "/api/v1/nodes"),
    ("get", "/api/v1/events"),
    ("get", "/api/v1/events/stream"),
    ("get", "/api/v1/events/pipelines"),
    ("get", "/api/v1/notifications"),
    ("put", "/api/v1/notifications"),
    ("get", "/api/v1/beam/{config_id}/thresholds"),
    ("put", "/api/v1/beam/{config_id}/thresholds"),
    ("get", "/api/v1/chains/{chain}/thresholds"),
    ("put", "/api/v1/chains/{chain}/thresholds"),
];

#[tokio::test]
async fn the_document_is_openapi_3_1_and_lists_exactly_the_served_routes() {
    let h = Harness::new().await;
    let (status, doc) = h.call(Method::GET, "/api/v1/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], "1.0.0");
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.push((method.clone(), path.clone()));
        }
    }
    documented.sort();
    let mut expected: Vec<(String, String)> =
        ROUTES.iter().map(|(m, p)| ((*m).to_owned(), (*p).to_owned())).collect();
    expected.sort();
    assert_eq!(documented, expected);

    // Each documented route is served (a 404 from the router would mean a phantom route).
    for (method, path) in ROUTES {
        let path = path
            .replace("{config_id}", "missing")
            .replace("{transform_uid}", "f1")
            .replace("{dataset_id}", "missing");
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let (status, body) = h.call(method.clone(), &path, None, None).await;
        let unrouted = status == StatusCode::NOT_FOUND && body.is_null();
        assert!(!unrouted && status != StatusCode::METHOD_NOT_ALLOWED, "{method} {path}: {status}");
    }
}

#[tokio::test]
async fn every_schema_reference_resolves_and_authenticated_routes_declare_the_key() {
    let h = Harness::new().await;
    let (_, doc) = h.call(Method::GET, "/api/v1/openapi.json", None, None).await;
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for name in [
        "Pipeline",
        "PipelineSpec",
        "PipelineConfig",
        "Source",
        "Transform",
        "Sink",
        "CatalogEntry",
        "Violation",
        "ValidationErrorBody",
        "ErrorBody",
        "PermissionsBody",
    ] {
        assert!(schemas.contains_key(name), "schema {name} missing");
    }
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(!refs.is_empty());
    for reference in refs {
        let name = reference.strip_prefix("#/components/schemas/").unwrap();
        assert!(schemas.contains_key(name), "dangling $ref {reference}");
    }
    assert_eq!(doc["components"]["securitySchemes"]["api_key"]["name"], "X-API-Key");
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let secured = op.get("security").is_some();
            let needs_key = path.starts_with("/api/v1/beam")
                || path.starts_with("/api/v1/streams")
                || path.starts_with("/api/v1/warehouse")
                || path.starts_with("/api/v1/developer/prices")
                || path == "/api/v1/me"
                || path.starts_with("/api/v1/chains")
                || path == "/api/v1/nodes"
                || path.starts_with("/api/v1/events")
                || path == "/api/v1/notifications"
                || path == "/metrics";
            assert_eq!(secured, needs_key, "{method} {path}");
        }
    }
}

fn collect_refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(reference)) = map.get("$ref") {
                out.push(reference.clone());
            }
            map.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

#[tokio::test]
async fn health_readiness_and_docs_page_answer_without_a_key() {
    let h = Harness::new().await;
    assert_eq!(
        h.call(Method::GET, "/healthz", None, None).await,
        (StatusCode::OK, serde_json::json!({"status": "ok"}))
    );
    assert_eq!(
        h.call(Method::GET, "/readyz", None, None).await,
        (StatusCode::OK, serde_json::json!({"status": "ok"}))
    );
    let (status, page) = h.call(Method::GET, "/docs", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let page = page.as_str().unwrap();
    assert!(
        page.contains("/api/v1/openapi.json") && page.contains("<title>Sluice API docs</title>")
    );
}

/// With the values in Redis, readiness follows Redis too, and says so when it is gone.
#[tokio::test]
async fn readiness_fails_naming_redis_when_the_set_store_stops() {
    let mut redis = sluice_store::testing::PrivateRedis::start().await;
    let h = Harness::with_set_store(Some(&redis.url), sluice_api::Limits::default()).await;
    assert_eq!(h.call(Method::GET, "/readyz", None, None).await.0, StatusCode::OK);
    let ann = h.user("acme", "data", "ann").await;
    let mut body = crate::harness::pipeline_body("sets");
    body["pipeline_config"]["transforms"] = serde_json::json!([
        {"type": "redis_set_filter", "uid": "f1", "filter_expr": "root = this.token_address"}
    ]);
    let id = h.create(&ann, body).await["id"].as_str().unwrap().to_owned();
    let values = format!("/api/v1/beam/{id}/transforms/f1/filter-values");
    let added = h.post(&values, &ann, serde_json::json!({"values": ["0xa"]})).await;
    assert_eq!(added.0, StatusCode::OK, "{}", added.1);
    assert_eq!(h.get(&values, &ann).await.1["values"], serde_json::json!(["0xa"]));
    redis.stop();
    let (status, body) = h.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("Redis"), "{body}");
    // Filter-value calls answer 503 saying why; the pipeline itself still reads.
    let (status, body) = h.get(&values, &ann).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("Redis"), "{body}");
    assert_eq!(h.get(&format!("/api/v1/beam/{id}"), &ann).await.0, StatusCode::OK);
}

/// The schema of parameter `name` of `method path`.
fn param_schema<'a>(doc: &'a Value, method: &str, path: &str, name: &str) -> &'a Value {
    let params = doc["paths"][path][method]["parameters"].as_array().unwrap();
    &params.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{name} of {path}"))["schema"]
}

#[tokio::test]
async fn the_document_states_the_limits_and_enums_the_server_enforces() {
    let h = Harness::new().await;
    let (_, doc) = h.call(Method::GET, "/api/v1/openapi.json", None, None).await;
    let values = "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values";
    let count = param_schema(&doc, "get", values, "count");
    assert_eq!((count["minimum"].as_i64(), count["maximum"].as_i64()), (Some(1), Some(10_000)));
    assert_eq!(param_schema(&doc, "get", values, "cursor")["minimum"], 0);
    let records = "/api/v1/beam/{config_id}/sinks/{sink_uid}/records";
    let limit = param_schema(&doc, "get", records, "limit");
    assert_eq!((limit["minimum"].as_i64(), limit["maximum"].as_i64()), (Some(1), Some(10_000)));
    assert_eq!(param_schema(&doc, "get", records, "wait_ms")["maximum"], 30_000);
    let logs = param_schema(&doc, "get", "/api/v1/beam/{config_id}/logs", "limit");
    assert_eq!((logs["minimum"].as_i64(), logs["maximum"].as_i64()), (Some(1), Some(1000)));
    let metrics = "/api/v1/beam/{config_id}/deploy/metrics";
    assert_eq!(param_schema(&doc, "get", metrics, "time_range")["enum"], json!(["1h", "1d", "1w"]));
    assert_eq!(param_schema(&doc, "get", metrics, "aggregated")["type"], "boolean");
    assert!(param_schema(&doc, "get", metrics, "metrics")["pattern"].is_string());
    let ingest = "/api/v1/streams/{chain}/{entity}/records";
    let chains = param_schema(&doc, "post", ingest, "chain")["enum"].as_array().unwrap();
    assert!(chains.contains(&json!("base")) && chains.contains(&json!("solana")));

    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["HistoryRequest"]["properties"]["time_granularity"]["enum"],
        json!(["15s", "1m", "5m", "1h", "1d"])
    );
    assert_eq!(schemas["PermissionsRequest"]["properties"]["editors"]["type"], "array");
    assert_eq!(schemas["PermissionsRequest"]["additionalProperties"], false);
    assert_eq!(schemas["Source"]["properties"]["chain"]["enum"], json!(chains));
    // The validators read an optional field sent as null as absent, and the document says so.
    let kind = &schemas["CreateDatasetRequest"]["properties"]["type"];
    assert_eq!(kind["type"], json!(["string", "null"]));
    assert_eq!(kind["enum"], json!(["postgres", null]));
    let stream = "/api/v1/beam/{config_id}/sinks/{sink_uid}/records/stream";
    assert_eq!(param_schema(&doc, "get", stream, "Last-Event-ID")["type"], "integer");
    // Every sink type's name and uid carry the validators' lengths; a notification
    // destination's sink is one of the four external types only.
    for config in ["ManagedSinkConfig", "WebhookSinkConfig", "RabbitMqSinkConfig", "SqlSinkConfig"]
    {
        let props = &schemas[config]["properties"];
        assert_eq!(
            (props["name"]["minLength"].as_i64(), props["name"]["maxLength"].as_i64()),
            (Some(1), Some(180)),
            "{config}"
        );
        assert_eq!(props["uid"]["maxLength"], 128, "{config}");
    }
    let destination = &doc["paths"]["/api/v1/notifications"]["put"]["requestBody"]["content"]["application/json"]
        ["schema"]["properties"]["destinations"]["items"]["properties"]["sink"];
    let types: Vec<&Value> = destination["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|variant| &variant["allOf"][1]["properties"]["type"]["enum"][0])
        .collect();
    assert_eq!(types, [&json!("webhook"), &json!("external_kafka"), &json!("nats"), &json!("sns")]);
    let entries = &doc["paths"]["/api/v1/beam/datasets/{dataset_id}/entries"]["post"]["requestBody"]
        ["content"]["application/json"]["schema"]["properties"]["values"];
    assert_eq!(
        (entries["minItems"].as_i64(), entries["maxItems"].as_i64()),
        (Some(1), Some(250_000))
    );
}
