//! The constraints of the OpenAPI document that the handler annotations cannot carry:
//! query limits, enums and lengths, written from the same constants the validators use
//! (and the chains and entities of the running catalog), so the document says exactly what
//! the server accepts. [`tighten`] runs once, when the document is built.

use serde_json::{Map, Value, json};
use sluice_core::catalog::Catalog;
use sluice_core::pipeline::validate::{MAX_SINK_NAME_LEN, SINK_TYPES};
use sluice_core::prices::Granularity;

use crate::{datasets, deployments, filter_values, prices, stats};

/// A string with at least one character that is not white space (what "must not be empty"
/// means to the validators, which trim).
const NOT_BLANK: &str = r"\S";

fn int(min: i128, max: i128) -> Value {
    json!({"type": "integer", "format": "int64", "minimum": min, "maximum": max})
}

fn enum_of(values: &[&str]) -> Value {
    json!({"type": "string", "enum": values})
}

/// The comma-separated list of metric types the metrics endpoint takes (spaces around a
/// name are allowed).
fn metric_list_pattern() -> String {
    let one = format!("(?:{})", stats::METRIC_TYPES.join("|"));
    format!("^ *{one} *(?:, *{one} *)*$")
}

/// Sets the schema of parameter `name` in `location` of operation `method path`.
fn param(doc: &mut Value, method: &str, path: &str, location: &str, name: &str, schema: Value) {
    let Some(params) = doc
        .pointer_mut(&format!("/paths/{}/{method}/parameters", escape(path)))
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for param in params {
        if param["name"] == name && param["in"] == location {
            param["schema"] = schema.clone();
        }
    }
}

/// The event endpoints (crate::events): filters, paging, and the settings bodies.
fn events(doc: &mut Value, chains: &[&str]) {
    use sluice_core::events::{EventFilter, KINDS};
    let mut names: Vec<String> = KINDS.iter().map(|k| k.replace('.', r"\.")).collect();
    names.extend(EventFilter::families().iter().map(|f| format!(r"{f}\.\*")));
    let one = format!("(?:{})", names.join("|"));
    let kinds = json!({"type": "string", "pattern": format!("^ *{one} *(?:, *{one} *)*$")});
    let severity = enum_of(&["info", "warning", "error"]);
    let since = json!({"type": "string", "format": "date-time"});
    for path in ["/api/v1/events", "/api/v1/events/stream"] {
        param(doc, "get", path, "query", "kind", kinds.clone());
        param(doc, "get", path, "query", "severity", severity.clone());
        param(doc, "get", path, "query", "since", since.clone());
        param(doc, "get", path, "query", "pipeline_id", json!({"type": "string", "minLength": 1}));
    }
    param(doc, "get", "/api/v1/events", "query", "cursor", int(1, i64::MAX.into()));
    param(doc, "get", "/api/v1/events", "query", "limit", int(1, crate::events::MAX_PAGE.into()));
    let stream = "/api/v1/events/stream";
    param(doc, "get", stream, "header", "Last-Event-ID", int(0, i64::MAX.into()));
    let seconds = json!({"type": ["integer", "null"], "minimum": 1,
                         "maximum": crate::events::MAX_THRESHOLD_SECONDS});
    for (name, fields) in [
        ("PutPipelineThresholds", &["data_age_warning_seconds"][..]),
        ("PutChainThresholds", &["lag_seconds", "stall_seconds"][..]),
    ] {
        if let Some(props) = properties(doc, name) {
            for field in fields {
                props.insert((*field).to_owned(), seconds.clone());
            }
        }
        closed(doc, name);
    }
    let chain = "/api/v1/chains/{chain}/thresholds";
    for method in ["get", "put"] {
        param(doc, method, chain, "path", "chain", enum_of(chains));
    }
    let destination = json!({
        "type": "object", "required": ["sink"], "additionalProperties": false,
        "properties": {
            "sink": {"oneOf": sink_variants(doc, &sluice_core::events::DESTINATION_SINK_TYPES)},
            "kinds": {"type": "array", "items": {"type": "string", "pattern": format!("^{one}$")}},
            "min_severity": severity,
        }
    });
    let put = json!({"type": "object", "required": ["destinations"], "additionalProperties": false,
        "properties": {"destinations": {"type": "array", "items": destination,
            "maxItems": sluice_core::events::MAX_DESTINATIONS}}});
    body(doc, "put", "/api/v1/notifications", put);
}

/// The `Sink` variants (`allOf` of the type's config and its `type` tag) whose `type` is in
/// `types`.
fn sink_variants(doc: &Value, types: &[&str]) -> Vec<Value> {
    let variants = doc.pointer("/components/schemas/Sink/oneOf").and_then(Value::as_array);
    let type_of = |variant: &Value| variant.pointer("/allOf/1/properties/type/enum/0").cloned();
    variants
        .into_iter()
        .flatten()
        .filter(|variant| type_of(variant).is_some_and(|t| types.iter().any(|ty| t == *ty)))
        .cloned()
        .collect()
}

/// The fields every sink type shares, in each type's config schema: the name and the uid
/// (`SinkConfig::validate`).
fn sinks(doc: &mut Value) {
    let configs: Vec<String> = sink_variants(doc, &SINK_TYPES)
        .iter()
        .filter_map(|variant| variant.pointer("/allOf/0/$ref")?.as_str()?.rsplit('/').next())
        .map(str::to_owned)
        .collect();
    for config in configs {
        property(doc, &config, "name", json!({"minLength": 1, "maxLength": MAX_SINK_NAME_LEN}));
        let uid = json!({"minLength": 1, "maxLength": sluice_core::ids::MAX_UID_LEN});
        property(doc, &config, "uid", uid);
    }
}

/// JSON Pointer escaping of one key.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The properties of component schema `name`.
fn properties<'a>(doc: &'a mut Value, name: &str) -> Option<&'a mut Map<String, Value>> {
    doc.pointer_mut(&format!("/components/schemas/{name}/properties"))?.as_object_mut()
}

/// Merges `extra` into property `field` of component schema `name`.
fn property(doc: &mut Value, name: &str, field: &str, extra: Value) {
    if let (Some(props), Value::Object(extra)) = (properties(doc, name), extra) {
        if let Some(Value::Object(schema)) = props.get_mut(field) {
            schema.extend(extra);
        }
    }
}

/// Forbids fields the body does not define (the validators answer `extra_forbidden`).
fn closed(doc: &mut Value, name: &str) {
    if let Some(schema) = doc.pointer_mut(&format!("/components/schemas/{name}")) {
        schema["additionalProperties"] = Value::Bool(false);
    }
}

/// Sets the request body schema of `method path` (JSON).
fn body(doc: &mut Value, method: &str, path: &str, schema: Value) {
    let pointer =
        format!("/paths/{}/{method}/requestBody/content/application~1json/schema", escape(path));
    if let Some(slot) = doc.pointer_mut(&pointer) {
        *slot = schema;
    }
}

/// Request-body schemas whose optional fields the validators take `null` for (as absent).
const NULL_AS_ABSENT: [&str; 6] =
    ["PipelineSpec", "PipelineConfig", "Source", "Sink", "Transform", "CreateDatasetRequest"];

/// Lets every optional property of the object `schema` (and of its `oneOf` variants) be
/// `null`: the body validators read an optional field sent as `null` as absent.
fn null_as_absent(schema: &mut Value) {
    if let Some(variants) = schema.get_mut("oneOf").and_then(Value::as_array_mut) {
        variants.iter_mut().for_each(null_as_absent);
    }
    let required: Vec<String> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for (name, prop) in props.iter_mut() {
        if required.contains(name) {
            continue;
        }
        let already = match &prop["type"] {
            Value::Array(types) => types.contains(&json!("null")),
            other => *other == json!("null"),
        };
        if already {
            continue;
        }
        if let Some(kind) = prop.get("type").and_then(Value::as_str).map(str::to_owned) {
            prop["type"] = json!([kind, "null"]);
            if let Some(values) = prop.get_mut("enum").and_then(Value::as_array_mut) {
                values.push(Value::Null);
            }
        } else {
            let inner = prop.take();
            let description = inner.get("description").cloned();
            let mut plain = inner;
            if let Some(object) = plain.as_object_mut() {
                object.remove("description");
            }
            *prop = json!({"oneOf": [plain, {"type": "null"}]});
            if let Some(description) = description {
                prop["description"] = description;
            }
        }
    }
}

/// Gives every operation a 422 answer: any of them refuses a query parameter it does not
/// declare (`crate::params`).
fn unknown_query_is_422(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else { return };
    for item in paths.values_mut() {
        let Some(operations) = item.as_object_mut() else { continue };
        for operation in operations.values_mut() {
            let Some(responses) = operation.get_mut("responses").and_then(Value::as_object_mut)
            else {
                continue;
            };
            responses.entry("422").or_insert_with(|| {
                json!({
                    "description": "A query parameter this operation does not declare",
                    "content": {"application/json": {"schema": {
                        "$ref": "#/components/schemas/ValidationErrorBody"
                    }}}
                })
            });
        }
    }
}

/// Applies every constraint to the serialized document `doc`.
pub fn tighten(doc: &mut Value, catalog: &Catalog) {
    unknown_query_is_422(doc);
    let mut chains: Vec<&str> = catalog.entries().iter().map(|e| e.chain.as_str()).collect();
    chains.sort_unstable();
    chains.dedup();
    let mut entities: Vec<&str> = catalog.entries().iter().map(|e| e.entity.as_str()).collect();
    entities.sort_unstable();
    entities.dedup();
    reads(doc);
    deployment_metrics(doc);
    values_and_datasets(doc);
    events(doc, &chains);

    // Stream ingest.
    let ingest = "/api/v1/streams/{chain}/{entity}/records";
    param(doc, "post", ingest, "path", "chain", enum_of(&chains));
    param(doc, "post", ingest, "path", "entity", enum_of(&entities));
    param(doc, "post", ingest, "query", "zerolag", json!({"type": "boolean"}));

    // Sharing: each list, when given, is a list (never null).
    closed(doc, "PermissionsRequest");

    // Pipelines.
    property(doc, "PipelineSpec", "name", json!({"pattern": NOT_BLANK}));
    property(doc, "Source", "chain", json!({"enum": chains}));
    property(doc, "Source", "entity", json!({"enum": entities}));
    property(doc, "PipelineConfig", "sinks", json!({"minItems": 1, "maxItems": 1}));

    for name in NULL_AS_ABSENT {
        if let Some(schema) = doc.pointer_mut(&format!("/components/schemas/{name}")) {
            null_as_absent(schema);
        }
    }
    sinks(doc);

    backfills(doc);
    secrets(doc);
    token_prices(doc);
}

/// Reading a sink, the dead letters, a backfill's managed destination and the script log.
fn reads(doc: &mut Value) {
    let max_offset = i128::from(deployments::records::MAX_OFFSET);
    // Reading a sink, the dead letters and a backfill's managed destination: one reader
    // (`PageQuery`), so one set of limits.
    for path in [
        "/api/v1/beam/{config_id}/sinks/{sink_uid}/records",
        "/api/v1/beam/{config_id}/dead-letters",
        "/api/v1/beam/backfills/{job_id}/sinks/{sink_uid}/records",
    ] {
        param(doc, "get", path, "query", "offset", int(0, max_offset));
        let limit = int(1, deployments::records::MAX_RECORDS_PAGE.into());
        param(doc, "get", path, "query", "limit", limit);
        param(
            doc,
            "get",
            path,
            "query",
            "wait_ms",
            int(0, deployments::records::MAX_WAIT_MS.into()),
        );
    }
    let stream = "/api/v1/beam/{config_id}/sinks/{sink_uid}/records/stream";
    param(doc, "get", stream, "query", "offset", int(0, max_offset));
    param(doc, "get", stream, "header", "Last-Event-ID", int(0, u64::MAX.into()));
    let logs = "/api/v1/beam/{config_id}/logs";
    param(doc, "get", logs, "query", "limit", int(1, deployments::records::MAX_LOG_LINES.into()));
}

/// Deployment metrics.
fn deployment_metrics(doc: &mut Value) {
    let metrics = "/api/v1/beam/{config_id}/deploy/metrics";
    param(doc, "get", metrics, "query", "time_range", enum_of(&stats::TIME_RANGES));
    param(doc, "get", metrics, "query", "aggregated", json!({"type": "boolean"}));
    let list = json!({"type": "string", "pattern": metric_list_pattern()});
    param(doc, "get", metrics, "query", "metrics", list);
}

/// Filter values and dataset entries.
fn values_and_datasets(doc: &mut Value) {
    let values = "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values";
    param(doc, "get", values, "query", "cursor", int(0, i64::MAX.into()));
    param(doc, "get", values, "query", "count", int(1, filter_values::MAX_PAGE_SIZE.into()));
    let at_least_one = |max: Option<usize>| {
        let mut values = json!({"type": "array", "items": {"type": "string"}, "minItems": 1});
        if let Some(max) = max {
            values["maxItems"] = json!(max);
        }
        json!({"type": "object", "required": ["values"], "additionalProperties": false,
               "properties": {"values": values}})
    };
    body(doc, "post", values, at_least_one(None));
    body(doc, "delete", values, at_least_one(None));
    let entries = "/api/v1/beam/datasets/{dataset_id}/entries";
    param(doc, "get", entries, "query", "limit", int(1, datasets::MAX_PAGE_SIZE.into()));
    let most = Some(datasets::MAX_VALUES_PER_REQUEST);
    body(doc, "post", entries, at_least_one(most));
    body(doc, "delete", entries, at_least_one(most));
    let named = at_least_one(most);
    let mut named_props = named["properties"].clone();
    named_props["name"] = json!({"type": "string"});
    let named = json!({"type": "object", "required": ["name", "values"],
                       "additionalProperties": false, "properties": named_props});
    body(doc, "post", "/api/v1/beam/datasets/entries", named);
    let name = json!({"minLength": 1, "maxLength": datasets::MAX_NAME_CHARS});
    property(doc, "CreateDatasetRequest", "name", name);
    let kind = json!({"type": "string", "enum": [datasets::DATASET_TYPE]});
    if let Some(props) = properties(doc, "CreateDatasetRequest") {
        props.insert("type".to_owned(), kind);
    }
    closed(doc, "CreateDatasetRequest");
}

/// Backfills.
fn backfills(doc: &mut Value) {
    let tables: Vec<String> =
        sluice_backfill::tables::tables(&sluice_core::catalog::Catalog::default())
            .into_iter()
            .filter(|t| t.is_backfillable())
            .map(|t| t.name)
            .collect();
    property(doc, "CreateBackfillRequest", "table", json!({"enum": tables}));
    let job_name = json!({"pattern": NOT_BLANK, "minLength": 1,
                          "maxLength": sluice_core::backfill::MAX_JOB_NAME_CHARS});
    property(doc, "CreateBackfillRequest", "job_name", job_name);
    let destinations = json!({"minItems": 1, "maxItems": sluice_core::backfill::MAX_DESTINATIONS});
    property(doc, "CreateBackfillRequest", "destinations", destinations);
    let transforms = json!({"maxItems": sluice_core::backfill::MAX_TRANSFORMS});
    property(doc, "CreateBackfillRequest", "transforms", transforms);
    closed(doc, "CreateBackfillRequest");
    if let Some(variants) = doc
        .pointer_mut("/components/schemas/BackfillTransformBody/oneOf")
        .and_then(Value::as_array_mut)
    {
        for variant in variants {
            variant["additionalProperties"] = Value::Bool(false);
            if let Some(values) = variant.pointer_mut("/properties/set_values") {
                values["minItems"] = json!(1);
            }
        }
    }
    property(
        doc,
        "BackfillWindow",
        "partition_key",
        json!({"enum": [sluice_core::backfill::PARTITION_KEY]}),
    );
    closed(doc, "BackfillWindow");
    property(doc, "BackfillFilter", "values", json!({"minItems": 1}));
    closed(doc, "BackfillFilter");
}

/// Organization secrets.
fn secrets(doc: &mut Value) {
    let secret_name = json!({"type": "string", "pattern": format!(
        "^[A-Za-z0-9_.-]{{1,{}}}$",
        sluice_core::pipeline::sink::MAX_SECRET_NAME_LEN
    )});
    for method in ["put", "delete"] {
        param(doc, method, "/api/v1/beam/secrets/{name}", "path", "name", secret_name.clone());
    }
    let value = json!({"minLength": 1, "maxLength": crate::secrets::MAX_SECRET_CHARS});
    property(doc, "PutSecretRequest", "value", value);
    closed(doc, "PutSecretRequest");
}

/// Token prices.
fn token_prices(doc: &mut Value) {
    property(doc, "TokenAddress", "chain", json!({"pattern": NOT_BLANK}));
    property(doc, "TokenAddress", "token_address", json!({"pattern": NOT_BLANK}));
    closed(doc, "TokenAddress");
    body(
        doc,
        "post",
        "/api/v1/developer/prices",
        json!({"type": "array", "maxItems": prices::MAX_LATEST_TOKENS,
               "items": {"$ref": "#/components/schemas/TokenAddress"}}),
    );
    property(doc, "HistoryRequest", "addresses", json!({"maxItems": prices::MAX_HISTORY_TOKENS}));
    property(doc, "HistoryRequest", "time_granularity", json!({"enum": Granularity::NAMES}));
    closed(doc, "HistoryRequest");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metric_list_pattern_takes_what_the_endpoint_takes() {
        let pattern = metric_list_pattern();
        assert!(pattern.starts_with("^ *(?:messages_received|"));
        assert!(pattern.ends_with(" *)*$"));
    }
}
