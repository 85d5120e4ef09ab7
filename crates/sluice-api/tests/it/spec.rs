//! Conformance to the contract (docs/contract.md, the hosted "Beam" API in our words): its
//! field tables, encoded below as they are written there, walked against live responses of
//! the real router, so a field that goes missing (as `time_created` of backfill jobs did)
//! fails here; and every route of the OpenAPI document refusing a query parameter it does
//! not declare.

use std::collections::BTreeMap;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::backfills;
use crate::harness::{Harness, User};
use crate::prices;

/// A field and its type as docs/contract.md gives it: `string`, `boolean`, `integer`, `number`,
/// `string[]`, `array`, `object`, `date-time`, `enum:a,b`, `any`, or several joined by `|`
/// (`integer|null`).
type Field = (&'static str, &'static str);

/// docs/contract.md §Pipeline record.
const PIPELINE: &[Field] = &[
    ("id", "string"),
    ("name", "string"),
    ("description", "string"),
    ("tags", "string[]|null"),
    ("static_egress_ip", "boolean"),
    ("pod_size", "enum:S,M,L,XL"),
    ("delivery_guarantee", "enum:at_least_once,best_effort"),
    ("owner_org_team_user_id", "string"),
    ("organization_id", "string"),
    ("created_at", "date-time"),
    ("updated_at", "date-time"),
    ("pipeline_config", "object"),
];

/// docs/contract.md §pipeline_config.
const PIPELINE_CONFIG: &[Field] =
    &[("source", "object"), ("transforms", "array"), ("sinks", "array")];

/// docs/contract.md §Source.
const SOURCE: &[Field] = &[
    ("type", "enum:pubsub,kafka"),
    ("chain", "string"),
    ("entity", "string"),
    ("is_zerolag", "boolean"),
];

/// docs/contract.md §Transforms: the set filter and the script.
const SET_FILTER: &[Field] =
    &[("type", "enum:redis_set_filter"), ("uid", "string"), ("filter_expr", "string")];
const SCRIPT: &[Field] = &[("type", "enum:v8"), ("uid", "string"), ("script", "string")];

/// docs/contract.md §Sink.
const SINK: &[Field] = &[("type", "string"), ("name", "string"), ("uid", "string")];

/// docs/contract.md §Source catalog entry (`consolidated` and `default_size` are not type-checked).
const CATALOG_ENTRY: &[Field] = &[
    ("chain", "string"),
    ("entity", "string"),
    ("zerolag", "boolean"),
    ("consolidated", "any"),
    ("default_size", "any"),
    ("source_type", "enum:kafka,pubsub"),
];

/// docs/contract.md §Dataset.
const DATASET: &[Field] = &[
    ("id", "string"),
    ("name", "string"),
    ("type", "enum:postgres"),
    ("created_at", "date-time"),
    ("updated_at", "date-time"),
];

/// docs/contract.md §Backfill job.
const BACKFILL_JOB: &[Field] = &[
    ("job_id", "string"),
    ("workflow_id", "string"),
    ("organization_id", "string"),
    ("status", "enum:staging,transporting,completed,failed,cancelled"),
    ("job_name", "string"),
    ("table", "string"),
    ("partition_key", "enum:block_timestamp"),
    ("backfill_start", "string"),
    ("backfill_end", "string"),
    ("filter_column", "string|null"),
    ("filter_values", "string[]|null"),
    ("destinations", "array"),
    ("static_egress_ip", "boolean"),
    ("num_chunks", "integer|null"),
    ("chunks_left", "integer"),
    ("error_message", "string|null"),
    ("time_created", "date-time"),
    ("time_completed", "date-time|null"),
];

/// docs/contract.md §Deployment worker health: the `workers_health` object and each worker.
const WORKERS_HEALTH: &[Field] = &[
    ("total_workers", "integer"),
    ("healthy_workers", "integer"),
    ("unhealthy_workers", "integer"),
    ("crashing_workers", "integer"),
    ("oom_killed_workers", "integer"),
    ("workers", "array"),
];
const WORKER: &[Field] = &[
    ("name", "string"),
    ("status", "string"),
    ("is_ready", "boolean"),
    ("is_crash_looping", "boolean"),
    ("is_oom_killed", "boolean"),
    ("restart_count", "integer"),
    ("start_time", "date-time"),
];

/// docs/contract.md §Deployment metrics.
const METRICS: &[Field] = &[("config_id", "string"), ("metrics", "array")];
const METRIC: &[Field] = &[("metric_type", "string"), ("points", "array")];
const METRIC_POINT: &[Field] = &[("timestamp", "date-time"), ("value", "number")];
const METRIC_TYPES: [&str; 7] = [
    "messages_received",
    "messages_sent",
    "total_latency",
    "processing_latency",
    "processor_error",
    "output_error",
    "data_age",
];

/// docs/contract.md §Token price records.
const LATEST_PRICE: &[Field] = &[
    ("timestamp", "date-time"),
    ("chain", "string"),
    ("address", "string"),
    ("price", "number"),
    ("open", "number"),
    ("high", "number"),
    ("close", "number"),
    ("low", "number"),
    ("decimals", "integer"),
];
const PRICE_HISTORY_ITEM: &[Field] =
    &[("mint", "string"), ("chain", "string"), ("decimals", "integer"), ("prices", "array")];
const PRICE_HISTORY_POINT: &[Field] = &[
    ("timestamp", "date-time"),
    ("price", "number"),
    ("open", "number"),
    ("high", "number"),
    ("close", "number"),
    ("low", "number"),
];

/// docs/contract.md §Validation error body.
const VALIDATION_ERROR: &[Field] = &[("detail", "array")];
const VIOLATION: &[Field] = &[("loc", "array"), ("msg", "string"), ("type", "string")];

/// Response bodies the endpoint tables of docs/contract.md give.
const FILTER_VALUES_PAGE: &[Field] =
    &[("values", "string[]"), ("cursor", "integer|null"), ("total_count", "integer")];
const PRICES_PAGE: &[Field] = &[("items", "array"), ("cursor", "string|null")];
const MESSAGE: &[Field] = &[("message", "string")];

/// Whether `value` is of the contract type `kind` (one alternative of a [`Field`] type).
fn is(value: &Value, kind: &str) -> bool {
    match kind {
        "any" => true,
        "null" => value.is_null(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        "string[]" => value.as_array().is_some_and(|items| items.iter().all(Value::is_string)),
        "date-time" => {
            value.as_str().is_some_and(|text| chrono::DateTime::parse_from_rfc3339(text).is_ok())
        }
        _ => match kind.strip_prefix("enum:") {
            Some(members) => value.as_str().is_some_and(|v| members.split(',').any(|m| m == v)),
            None => panic!("unknown contract type {kind}"),
        },
    }
}

/// Asserts that `value` (`what`, for the message) has every field of `table` with its type,
/// naming every field that is missing or of another type at once.
fn conforms(what: &str, value: &Value, table: &[Field]) {
    let Some(object) = value.as_object() else { panic!("{what} is not an object: {value}") };
    let mut wrong = Vec::new();
    for (name, kind) in table {
        match object.get(*name) {
            None => wrong.push(format!("{name} is missing")),
            Some(field) if !kind.split('|').any(|k| is(field, k)) => {
                wrong.push(format!("{name} is {field}, not {kind}"));
            }
            Some(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{what} breaks the contract's table: {}\n{value}", wrong.join("; "));
}

/// `conforms` for every item of the array `value`, which must not be empty.
fn each_conforms(what: &str, value: &Value, table: &[Field]) {
    let items = value.as_array().unwrap_or_else(|| panic!("{what} is not an array: {value}"));
    assert!(!items.is_empty(), "{what} is empty: nothing to check");
    for (index, item) in items.iter().enumerate() {
        conforms(&format!("{what}[{index}]"), item, table);
    }
}

async fn ok(
    harness: &Harness,
    method: Method,
    path: &str,
    user: &User,
    body: Option<Value>,
) -> Value {
    let (status, answer) = harness.call(method, path, Some(&user.key), body).await;
    assert_eq!(status, StatusCode::OK, "{path}: {answer}");
    answer
}

#[tokio::test]
async fn pipelines_sources_filter_values_datasets_and_deployments_carry_every_spec_field() {
    let harness = Harness::new().await;
    let ann = harness.user("acme", "data", "ann").await;
    let created = harness
        .create(
            &ann,
            json!({
                "name": "spec", "description": "every field",
                "pipeline_config": {
                    "source": {"chain": "base", "entity": "erc20_token_transfer"},
                    "transforms": [
                        {"type": "redis_set_filter", "uid": "tokens", "filter_expr": "root = this.token_address"},
                        {"type": "v8", "script": "function transform(r) { return r; }"}
                    ],
                    "sinks": [{"type": "kafka", "name": "out"}]
                }
            }),
        )
        .await;
    for (what, pipeline) in [("created pipeline", &created), ("listed pipeline", &Value::Null)] {
        let pipeline = if pipeline.is_null() {
            let list = ok(&harness, Method::GET, "/api/v1/beam", &ann, None).await;
            each_conforms("GET /beam", &list, PIPELINE);
            list[0].clone()
        } else {
            pipeline.clone()
        };
        conforms(what, &pipeline, PIPELINE);
        let config = &pipeline["pipeline_config"];
        conforms("pipeline_config", config, PIPELINE_CONFIG);
        conforms("source", &config["source"], SOURCE);
        conforms("set filter", &config["transforms"][0], SET_FILTER);
        conforms("script", &config["transforms"][1], SCRIPT);
        each_conforms("sinks", &config["sinks"], SINK);
    }
    let id = created["id"].as_str().unwrap();
    let got = ok(&harness, Method::GET, &format!("/api/v1/beam/{id}"), &ann, None).await;
    conforms("GET /beam/{config_id}", &got, PIPELINE);

    let sources = ok(&harness, Method::GET, "/api/v1/beam/sources", &ann, None).await;
    each_conforms("sources", &sources["sources"], CATALOG_ENTRY);

    // Filter values.
    let values = format!("/api/v1/beam/{id}/transforms/tokens/filter-values");
    let body = json!({"values": ["0xa", "0xb", "0xc"]});
    let added = ok(&harness, Method::POST, &values, &ann, Some(body)).await;
    conforms("POST filter-values", &added, &[("added", "integer")]);
    let page = ok(&harness, Method::GET, &format!("{values}?count=2"), &ann, None).await;
    conforms("a filter-values page", &page, FILTER_VALUES_PAGE);
    assert!(page["cursor"].is_i64(), "a next page: {page}");
    let cursor = page["cursor"].as_i64().unwrap();
    let last = ok(&harness, Method::GET, &format!("{values}?cursor={cursor}"), &ann, None).await;
    conforms("the last filter-values page", &last, FILTER_VALUES_PAGE);
    let check = ok(&harness, Method::GET, &format!("{values}/check?value=0xA"), &ann, None).await;
    conforms("filter-values/check", &check, &[("value", "string"), ("is_member", "boolean")]);
    let count = ok(&harness, Method::GET, &format!("{values}/count"), &ann, None).await;
    conforms("filter-values/count", &count, &[("count", "integer")]);
    let body = json!({"values": ["0xa"]});
    let removed = ok(&harness, Method::DELETE, &values, &ann, Some(body)).await;
    conforms("DELETE filter-values", &removed, &[("removed", "integer")]);
    let body = json!({"values": ["0xd"]});
    let replaced = ok(&harness, Method::PUT, &values, &ann, Some(body)).await;
    conforms("PUT filter-values", &replaced, &[("count", "integer")]);

    // Datasets.
    let body = json!({"name": "wallets"});
    let dataset = ok(&harness, Method::POST, "/api/v1/beam/datasets", &ann, Some(body)).await;
    conforms("POST datasets", &dataset, DATASET);
    let listed = ok(&harness, Method::GET, "/api/v1/beam/datasets", &ann, None).await;
    each_conforms("GET datasets", &listed, DATASET);
    let entries = format!("/api/v1/beam/datasets/{}/entries", dataset["id"].as_str().unwrap());
    let body = json!({"values": ["0xa"]});
    ok(&harness, Method::POST, &entries, &ann, Some(body.clone())).await;
    let exists = ok(&harness, Method::GET, &format!("{entries}/check?value=0xa"), &ann, None).await;
    conforms("entries/check", &exists, &[("exists", "boolean")]);
    let deleted = ok(&harness, Method::DELETE, &entries, &ann, Some(body)).await;
    conforms("DELETE entries", &deleted, &[("count", "integer")]);

    // A deployment's workers and metrics.
    ok(&harness, Method::POST, &format!("/api/v1/beam/{id}/deploy"), &ann, None).await;
    let stats =
        ok(&harness, Method::GET, &format!("/api/v1/beam/{id}/deploy/stats"), &ann, None).await;
    conforms("workers_health", &stats["workers_health"], WORKERS_HEALTH);
    each_conforms("workers", &stats["workers_health"]["workers"], WORKER);
    let metrics =
        ok(&harness, Method::GET, &format!("/api/v1/beam/{id}/deploy/metrics"), &ann, None).await;
    conforms("metrics", &metrics, METRICS);
    each_conforms("metrics[]", &metrics["metrics"], METRIC);
    let types: Vec<&str> = metrics["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["metric_type"].as_str().unwrap())
        .collect();
    assert_eq!(types, METRIC_TYPES);
    each_conforms("messages_received points", &metrics["metrics"][0]["points"], METRIC_POINT);
    let paused = ok(&harness, Method::POST, &format!("/api/v1/beam/{id}/pause"), &ann, None).await;
    conforms("pause", &paused, MESSAGE);

    // A validation error, then deletion.
    let bad =
        json!({"name": "x", "pipeline_config": {"source": {}, "transforms": [], "sinks": []}});
    let (status, refused) = harness.post("/api/v1/beam", &ann, bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    conforms("a 422", &refused, VALIDATION_ERROR);
    each_conforms("a 422's detail", &refused["detail"], VIOLATION);
    let gone = ok(&harness, Method::DELETE, &format!("/api/v1/beam/{id}"), &ann, None).await;
    conforms("DELETE pipeline", &gone, MESSAGE);
}

#[tokio::test(flavor = "multi_thread")]
async fn backfill_jobs_carry_every_spec_field_time_created_included() {
    let stack = backfills::Stack::new(100).await;
    stack.history(0..10).await;
    let (status, created) = stack
        .call(
            Method::POST,
            "/api/v1/beam/backfills",
            &stack.owner,
            Some(backfills::body(0, 10, json!([{"type": "kafka", "name": "out"}]))),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    conforms("POST backfills", &created, &[("job_id", "string"), ("workflow_id", "string")]);
    let job_id = created["job_id"].as_str().unwrap();
    let done = stack.until(job_id, "completed").await;
    conforms("a completed job", &done, BACKFILL_JOB);
    assert!(done["time_completed"].is_string(), "{done}");
    assert_eq!(done["time_created"], done["created_at"], "one instant, two names");
    let (status, listed) =
        stack.call(Method::GET, "/api/v1/beam/backfills", &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    each_conforms("GET backfills", &listed, BACKFILL_JOB);

    // Its managed destination pages as a pipeline's sink does: `limit` 1 to 10,000.
    let uid = done["destinations"][0]["uid"].as_str().unwrap();
    let records = format!("/api/v1/beam/backfills/{job_id}/sinks/{uid}/records");
    for (limit, status, kind) in [
        (0, StatusCode::UNPROCESSABLE_ENTITY, "greater_than_equal"),
        (10_001, StatusCode::UNPROCESSABLE_ENTITY, "less_than_equal"),
        (10_000, StatusCode::OK, ""),
    ] {
        let path = format!("{records}?limit={limit}");
        let (got, answer) = stack.call(Method::GET, &path, &stack.owner, None).await;
        assert_eq!(got, status, "limit={limit}: {answer}");
        if !kind.is_empty() {
            assert_eq!(answer["detail"][0]["loc"], json!(["query", "limit"]));
            assert_eq!(answer["detail"][0]["type"], kind);
        }
    }
}

/// The query parameters `method path` declares in the OpenAPI document, with their schemas.
fn declared(doc: &Value, path: &str) -> BTreeMap<String, Value> {
    doc["paths"][path]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|param| param["in"] == "query")
        .map(|param| (param["name"].as_str().unwrap().to_owned(), param["schema"].clone()))
        .collect()
}

#[test]
fn the_backfill_records_route_declares_the_limits_of_the_pipeline_records_route() {
    let doc = sluice_api::openapi();
    let backfill = declared(&doc, "/api/v1/beam/backfills/{job_id}/sinks/{sink_uid}/records");
    let pipeline = declared(&doc, "/api/v1/beam/{config_id}/sinks/{sink_uid}/records");
    assert_eq!(backfill, pipeline);
    assert_eq!(backfill["limit"]["minimum"], 1);
    assert_eq!(backfill["limit"]["maximum"], 10_000);
}

#[tokio::test]
async fn filter_values_page_with_count_and_a_limit_is_refused_naming_it() {
    let harness = Harness::new().await;
    let ann = harness.user("acme", "data", "ann").await;
    let created = harness.create(&ann, crate::harness::pipeline_body("values")).await;
    let (id, uid) = (
        created["id"].as_str().unwrap(),
        created["pipeline_config"]["transforms"][0]["uid"].as_str().unwrap(),
    );
    let values = format!("/api/v1/beam/{id}/transforms/{uid}/filter-values");
    let body = json!({"values": ["0x1", "0x2", "0x3", "0x4", "0x5"]});
    ok(&harness, Method::POST, &values, &ann, Some(body)).await;
    let page = ok(&harness, Method::GET, &format!("{values}?count=2"), &ann, None).await;
    assert_eq!(page["values"].as_array().unwrap().len(), 2);
    let (status, refused) = harness.get(&format!("{values}?limit=2"), &ann).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["detail"].as_array().unwrap().len(), 1, "{refused}");
    let entry = &refused["detail"][0];
    assert_eq!(entry["loc"], json!(["query", "limit"]));
    assert_eq!(entry["type"], "extra_forbidden");
    assert_eq!(
        entry["msg"],
        "Extra inputs are not permitted: this endpoint's query parameters are 'cursor' and 'count'"
    );
    // Every bad parameter in one answer, the unknown ones with the others.
    let (status, refused) = harness.get(&format!("{values}?count=0&limit=2&lmit=3"), &ann).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let locs: Vec<&Value> =
        refused["detail"].as_array().unwrap().iter().map(|e| &e["loc"]).collect();
    assert_eq!(
        locs,
        [&json!(["query", "count"]), &json!(["query", "limit"]), &json!(["query", "lmit"])]
    );
}

#[tokio::test]
async fn token_prices_carry_every_spec_field() {
    let stack = prices::Stack::new().await;
    let token = "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913";
    stack
        .ingest(&[
            prices::trade(token, -90, "10", "10", 1),
            prices::trade(token, -80, "10", "12", 2),
        ])
        .await;
    let (status, latest) = stack.latest(&[("base", token)], "").await;
    assert_eq!(status, StatusCode::OK, "{latest}");
    conforms("latest prices", &latest, PRICES_PAGE);
    each_conforms("latest items", &latest["items"], LATEST_PRICE);
    let (_, liquid) = stack.latest(&[("base", token)], "?with_liquidity_info=true").await;
    let fields: Vec<Field> = [LATEST_PRICE, &[("total_liquidity_usd", "any")]].concat();
    each_conforms("latest items with liquidity", &liquid["items"], &fields);
    let (status, history) =
        stack.history(prices::history_body(&[token], "1m", -120, 0), None).await;
    assert_eq!(status, StatusCode::OK, "{history}");
    conforms("price history", &history, PRICES_PAGE);
    each_conforms("history items", &history["items"], PRICE_HISTORY_ITEM);
    each_conforms("history prices", &history["items"][0]["prices"], PRICE_HISTORY_POINT);
}

/// Every operation of the OpenAPI document, as `(method, path template)`.
fn operations() -> Vec<(Method, String)> {
    let doc = sluice_api::openapi();
    let mut found = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            found.push((
                Method::from_bytes(method.to_uppercase().as_bytes()).unwrap(),
                path.clone(),
            ));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_refuses_a_query_parameter_it_does_not_declare_and_changes_nothing() {
    let stack = backfills::Stack::new(100).await;
    stack.history(0..4).await;
    let pipeline = json!({
        "name": "walk", "description": "",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "uid": "tokens", "filter_expr": "root = this.token_address"}],
            "sinks": [{"type": "kafka", "uid": "sk-out", "name": "out"}]
        }
    });
    let (status, created) =
        stack.call(Method::POST, "/api/v1/beam", &stack.owner, Some(pipeline)).await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let config_id = created["id"].as_str().unwrap().to_owned();
    let body = json!({"name": "walk"});
    let (status, dataset) =
        stack.call(Method::POST, "/api/v1/beam/datasets", &stack.owner, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{dataset}");
    let job_id = stack
        .create(backfills::body(0, 4, json!([{"type": "kafka", "uid": "sk-bf", "name": "bf"}])))
        .await;
    let fill: BTreeMap<&str, String> = [
        ("config_id", config_id.clone()),
        ("transform_uid", "tokens".to_owned()),
        ("sink_uid", "sk-out".to_owned()),
        ("dataset_id", dataset["id"].as_str().unwrap().to_owned()),
        ("job_id", job_id.clone()),
        ("name", "HOOK".to_owned()),
        ("chain", "base".to_owned()),
        ("entity", "erc20_token_transfer".to_owned()),
        ("table", "base.assets.erc20_token_transfers".to_owned()),
    ]
    .into_iter()
    .collect();

    let operations = operations();
    assert!(operations.len() >= 55, "{} operations", operations.len());
    let mut wrong = Vec::new();
    for (method, template) in operations {
        let mut path = template.clone();
        for (name, value) in &fill {
            path = path.replace(&format!("{{{name}}}"), value);
        }
        if template.contains("/backfills/{job_id}/sinks/") {
            path = path.replace("sk-out", "sk-bf");
        }
        // Operators' routes, and the organization's secrets (its admins'), as the operator.
        let operator = template.starts_with("/api/v1/streams/")
            || template.starts_with("/api/v1/warehouse/")
            || template.contains("/secrets")
            || template.ends_with("/notifications")
            || template.starts_with("/api/v1/chains/")
            || ["/api/v1/nodes", "/metrics"].contains(&template.as_str());
        let key = if operator { &stack.operator } else { &stack.owner };
        let (status, answer) =
            stack.call(method.clone(), &format!("{path}?sluice_unknown=1"), key, None).await;
        let named = answer["detail"].as_array().is_some_and(|detail| {
            detail.iter().any(|entry| {
                entry["loc"] == json!(["query", "sluice_unknown"])
                    && entry["type"] == "extra_forbidden"
            })
        });
        if status != StatusCode::UNPROCESSABLE_ENTITY || !named {
            wrong.push(format!("{method} {template}: {status} {answer}"));
        }
    }
    assert!(wrong.is_empty(), "routes that took an unknown parameter:\n{}", wrong.join("\n"));

    // Refused, the deletions, cancels and deploys above changed nothing.
    let (status, _) =
        stack.call(Method::GET, &format!("/api/v1/beam/{config_id}"), &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK, "the pipeline is still there");
    let (status, stats) = stack
        .call(Method::GET, &format!("/api/v1/beam/{config_id}/deploy/stats"), &stack.owner, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stats["status"], "not_deployed", "{stats}");
    let (status, datasets) =
        stack.call(Method::GET, "/api/v1/beam/datasets", &stack.owner, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(datasets.as_array().unwrap().len(), 1, "the dataset is still there");
    assert_ne!(stack.job(&job_id).await["status"], "cancelled");
}
