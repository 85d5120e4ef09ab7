//! Bad input on every route that takes a body, sent by the owner of what the route changes:
//! each is refused with a 4xx in the error shape, and nothing stored changes.

use axum::http::{Method, StatusCode};
use serde_json::Value;
use sluice_bus::StreamLog;

use crate::pipeline_stack::SOURCE;
use crate::tenancy::{World, documented_routes, probe};

/// Bodies no route accepts, by name.
fn bad_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let nesting = 100_000;
    vec![
        ("empty", Vec::new()),
        ("truncated JSON", b"{\"name\": \"x\", \"values\": [".to_vec()),
        ("a bare number", b"42".to_vec()),
        ("null", b"null".to_vec()),
        ("invalid UTF-8", b"{\"name\": \"\xff\xfe\", \"values\": [\"\xc3\x28\"]}".to_vec()),
        ("deep nesting", ["[".repeat(nesting), "]".repeat(nesting)].concat().into_bytes()),
        (
            "wrong types everywhere",
            br#"{"name": 7, "values": [1, {"a": 2}], "editors": "x", "addresses": 3, "type": [], "pipeline_config": "x", "block_number": "x"}"#.to_vec(),
        ),
        ("NUL bytes", b"\0\0\0\0".to_vec()),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_bodies_on_every_route_are_4xx_errors_and_change_nothing_stored() {
    let world = World::new().await;
    let owned = world.alice_owns_one_of_everything().await;
    let before = world.alice_view(&owned).await;
    let source_before = world.log.offsets(SOURCE).await.unwrap();

    let doc = serde_json::to_value(sluice_api::openapi()).unwrap();
    let mut failures = Vec::new();
    let mut requests = 0usize;
    let mut routes = 0usize;
    for (method, template) in documented_routes() {
        if doc["paths"][&template][&method].get("requestBody").is_none() {
            continue;
        }
        routes += 1;
        let probe = probe(&method, &template, &owned, "alice")
            .unwrap_or_else(|| panic!("{method} {template} has no matrix entry"));
        // Ingest is for operators; everything else is the owner's own resource.
        let key = if template.starts_with("/api/v1/streams/") {
            world.operator.clone()
        } else {
            world.alice.key.clone()
        };
        let http_method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        for (what, body) in bad_bodies() {
            let (status, answer) =
                world.call(http_method.clone(), &probe.path, &key, Some(body)).await;
            requests += 1;
            let route = format!("{method} {template} with {what}");
            if template.starts_with("/api/v1/streams/")
                && what == "empty"
                && (status, answer.as_str()) == (StatusCode::OK, r#"{"accepted":0}"#)
            {
                // NDJSON of no lines may be taken as zero records; nothing is stored either way
                // (checked below).
                continue;
            }
            let shaped = serde_json::from_str::<Value>(&answer)
                .is_ok_and(|v| v["detail"].is_string() || v["detail"].is_array());
            if !status.is_client_error() {
                failures.push(format!("{route}: {status} {answer}"));
            } else if !shaped {
                failures.push(format!("{route}: {status} without a JSON error: {answer:?}"));
            } else if status == StatusCode::NOT_FOUND {
                failures.push(format!("{route}: 404 for the owner: {answer}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} bad answers:\n{}", failures.len(), failures.join("\n"));

    let after = world.alice_view(&owned).await;
    for (path, value) in &before {
        assert_eq!(&after[path], value, "{path} changed after bad input");
    }
    assert_eq!(
        world.log.offsets(SOURCE).await.unwrap(),
        source_before,
        "bad ingest stored records"
    );
    eprintln!(
        "bad input: {routes} routes with a body, {} bad bodies each, {requests} requests, all \
         refused with a 4xx JSON error, nothing stored changed",
        bad_bodies().len()
    );
}

/// Query values no integer, boolean or enum parameter accepts.
const BAD_QUERY_VALUES: [&str; 4] = ["abc", "99999999999999999999999", "%FF%FE", "1.5e3"];

#[tokio::test(flavor = "multi_thread")]
async fn bad_query_values_on_every_typed_parameter_are_4xx_and_change_nothing_stored() {
    let world = World::new().await;
    let owned = world.alice_owns_one_of_everything().await;
    let before = world.alice_view(&owned).await;
    let source_before = world.log.offsets(SOURCE).await.unwrap();

    let doc = serde_json::to_value(sluice_api::openapi()).unwrap();
    let mut failures = Vec::new();
    let mut requests = 0usize;
    let mut parameters = 0usize;
    for (method, template) in documented_routes() {
        let operation = &doc["paths"][&template][&method];
        let Some(params) = operation["parameters"].as_array() else { continue };
        let Some(probe) = probe(&method, &template, &owned, "alice") else { continue };
        let path = probe.path.split('?').next().unwrap().to_owned();
        let key = if template.starts_with("/api/v1/streams/") {
            world.operator.clone()
        } else {
            world.alice.key.clone()
        };
        let http_method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        for param in params.iter().filter(|p| p["in"] == "query") {
            let schema = &param["schema"];
            let typed = ["integer", "boolean"].iter().any(|t| {
                schema["type"] == *t
                    || schema["type"].as_array().is_some_and(|a| a.contains(&(*t).into()))
            }) || schema.get("enum").is_some();
            if !typed {
                continue;
            }
            parameters += 1;
            let name = param["name"].as_str().unwrap();
            for bad in BAD_QUERY_VALUES {
                let url = format!("{path}?{name}={bad}");
                let call = world.call(
                    http_method.clone(),
                    &url,
                    &key,
                    probe.body.clone().map(String::into_bytes),
                );
                requests += 1;
                match tokio::time::timeout(std::time::Duration::from_secs(10), call).await {
                    Ok((status, answer)) if !status.is_client_error() => {
                        failures.push(format!("{method} {url}: {status} {answer}"));
                    }
                    Ok(_) => {}
                    Err(_) => failures.push(format!("{method} {url}: no complete answer in 10 s")),
                }
            }
        }
    }
    assert!(parameters > 10, "only {parameters} typed query parameters found");
    assert!(failures.is_empty(), "{} bad answers:\n{}", failures.len(), failures.join("\n"));

    let after = world.alice_view(&owned).await;
    for (path, value) in &before {
        assert_eq!(&after[path], value, "{path} changed after bad query values");
    }
    assert_eq!(world.log.offsets(SOURCE).await.unwrap(), source_before);
    eprintln!(
        "bad query values: {parameters} typed query parameters, {} bad values each, {requests} \
         requests, all refused with a 4xx, nothing stored changed",
        BAD_QUERY_VALUES.len()
    );
}
