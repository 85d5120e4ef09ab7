//! `{base_url}/{config_id}/transforms/{transform_uid}/filter-values`: every endpoint, its
//! errors and permissions, paging, a million values at once, and the listener that running
//! pipelines use to follow changes.

use std::sync::{Arc, Mutex};

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sluice_api::Limits;
use sluice_core::filter_values::{FilterValuesChange, FilterValuesListener};

use crate::harness::{Harness, User};

/// Runs each named `async fn(redis: bool)` twice: set-filter values in the store's own tables
/// (`false`), and in Redis (`true`).
macro_rules! on_both_set_stores {
    ($($name:ident),* $(,)?) => {
        mod on_tables {
            $(#[tokio::test]
            async fn $name() {
                super::$name(false).await;
            })*
        }
        mod on_redis {
            $(#[tokio::test]
            async fn $name() {
                super::$name(true).await;
            })*
        }
    };
}

const OK: StatusCode = StatusCode::OK;
const FORBIDDEN: StatusCode = StatusCode::FORBIDDEN;
const NOT_FOUND: StatusCode = StatusCode::NOT_FOUND;
const UNPROCESSABLE: StatusCode = StatusCode::UNPROCESSABLE_ENTITY;

/// A pipeline with set filters `f1` and `f2` and a script `s1`.
fn body_with_uids() -> Value {
    json!({
        "name": "filters",
        "description": "d",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "log"},
            "transforms": [
                {"type": "redis_set_filter", "uid": "f1", "filter_expr": "root = this.address"},
                {"type": "redis_set_filter", "uid": "f2", "filter_expr": "root = this.topic0"},
                {"type": "v8", "uid": "s1", "script": "function transform(r) { return r; }"}
            ],
            "sinks": [{"type": "kafka", "name": "out"}]
        }
    })
}

async fn pipeline(h: &Harness, owner: &User) -> String {
    h.create(owner, body_with_uids()).await["id"].as_str().unwrap().to_owned()
}

fn base(id: &str, uid: &str) -> String {
    format!("/api/v1/beam/{id}/transforms/{uid}/filter-values")
}

async fn send(
    h: &Harness,
    method: Method,
    path: &str,
    user: &User,
    values: Value,
) -> (StatusCode, Value) {
    h.call(method, path, Some(&user.key), Some(json!({ "values": values }))).await
}

/// The `loc`s and `type`s of a 422.
fn violations(answer: &Value) -> Vec<(Value, String)> {
    answer["detail"]
        .as_array()
        .unwrap_or_else(|| panic!("not a 422 body: {answer}"))
        .iter()
        .map(|v| (v["loc"].clone(), v["type"].as_str().unwrap().to_owned()))
        .collect()
}

// Each test below runs with the values in the store's tables and again in Redis.
on_both_set_stores!(
    values_are_lowercased_repeats_count_once_and_each_change_reports_its_count,
    paging_with_the_cursor_while_values_are_added_skips_and_repeats_nothing,
    query_parameters_are_checked_with_their_location,
    bodies_are_checked_with_precise_locations_and_change_nothing,
    unknown_pipelines_and_transforms_are_404_and_scripts_are_422,
    each_role_gets_exactly_its_permissions_on_each_filter_values_endpoint,
    a_million_values_go_in_one_post_above_the_general_body_limit,
    the_filter_values_limit_replaces_the_general_one_on_these_routes_only,
    inline_set_values_are_listed_and_values_of_removed_transforms_are_gone,
);

async fn values_are_lowercased_repeats_count_once_and_each_change_reports_its_count(redis: bool) {
    let h = Harness::with_sets(redis, Limits::default()).await;
    let ann = h.user("acme", "data", "ann").await;
    let id = pipeline(&h, &ann).await;
    let path = base(&id, "f1");

    let (status, answer) =
        send(&h, Method::POST, &path, &ann, json!(["0xAB", "0xab", "0xCD"])).await;
    assert_eq!((status, answer), (OK, json!({"added": 2})));
    let (status, answer) = send(&h, Method::POST, &path, &ann, json!(["0xcd", "0xEF"])).await;
    assert_eq!((status, answer), (OK, json!({"added": 1})));
    assert_eq!(h.get(&format!("{path}/count"), &ann).await, (OK, json!({"count": 3})));
    assert_eq!(
        h.get(&format!("{path}/check?value=0XaB"), &ann).await,
        (OK, json!({"value": "0xab", "is_member": true}))
    );
    assert_eq!(
        h.get(&format!("{path}/check?value=0x12"), &ann).await,
        (OK, json!({"value": "0x12", "is_member": false}))
    );

    let (status, answer) =
        send(&h, Method::DELETE, &path, &ann, json!(["0xAB", "0xab", "0x99"])).await;
    assert_eq!((status, answer), (OK, json!({"removed": 1})));
    let (status, listed) = h.get(&path, &ann).await;
    assert_eq!(status, OK);
    let mut values: Vec<&str> =
        listed["values"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    values.sort();
    assert_eq!(values, ["0xcd", "0xef"]);
    assert_eq!(listed["cursor"], Value::Null);
    assert_eq!(listed["total_count"], 2);

    let (status, answer) = send(&h, Method::PUT, &path, &ann, json!(["A", "b", "B", "Ä"])).await;
    assert_eq!((status, answer), (OK, json!({"count": 3})));
    assert_eq!(h.get(&format!("{path}/check?value=%C3%84"), &ann).await.1["value"], "ä");
    assert_eq!(h.get(&format!("{path}/check?value=0xcd"), &ann).await.1["is_member"], false);
    let (status, answer) = send(&h, Method::PUT, &path, &ann, json!([])).await;
    assert_eq!((status, answer), (OK, json!({"count": 0})), "an empty list clears the set");
    assert_eq!(h.get(&format!("{path}/count"), &ann).await.1, json!({"count": 0}));
    // Sets are per transform.
    assert_eq!(h.get(&format!("{}/count", base(&id, "f2")), &ann).await.1, json!({"count": 0}));
}

async fn paging_with_the_cursor_while_values_are_added_skips_and_repeats_nothing(redis: bool) {
    let h = Harness::with_sets(redis, Limits::default()).await;
    let ann = h.user("acme", "data", "ann").await;
    let id = pipeline(&h, &ann).await;
    let path = base(&id, "f1");
    let initial: Vec<String> = (0..250).map(|i| format!("0x{i:040x}")).collect();
    send(&h, Method::POST, &path, &ann, json!(initial)).await;

    let (status, first) = h.get(&path, &ann).await;
    assert_eq!(status, OK);
    assert_eq!(first["values"].as_array().unwrap().len(), 100, "the default page is 100");
    assert_eq!(first["total_count"], 250);
    assert!(first["cursor"].is_i64(), "{}", first["cursor"]);

    let mut seen: Vec<String> = first["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let mut cursor = first["cursor"].clone();
    let writer = async {
        for batch in 0..10 {
            let values: Vec<String> = (0..10).map(|i| format!("late-{batch}-{i}")).collect();
            let (status, _) = send(&h, Method::POST, &path, &ann, json!(values)).await;
            assert_eq!(status, OK);
            tokio::task::yield_now().await;
        }
    };
    let reader = async {
        while let Some(at) = cursor.as_i64() {
            let (status, page) = h.get(&format!("{path}?cursor={at}&count=30"), &ann).await;
            assert_eq!(status, OK, "{page}");
            seen.extend(
                page["values"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()),
            );
            cursor = page["cursor"].clone();
            tokio::task::yield_now().await;
        }
    };
    tokio::join!(writer, reader);

    // Whatever the reader saw is exactly the start of the full listing, in order.
    let (_, all) = h.get(&format!("{path}?count=10000"), &ann).await;
    let all: Vec<String> =
        all["values"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect();
    assert_eq!(all.len(), 350);
    assert!(seen.len() >= 250);
    assert_eq!(seen[..], all[..seen.len()]);
    let mut first_250 = all[..250].to_vec();
    first_250.sort();
    assert_eq!(first_250, initial, "values added later list after the earlier ones");
}

async fn query_parameters_are_checked_with_their_location(redis: bool) {
    let h = Harness::with_sets(redis, Limits::default()).await;
    let ann = h.user("acme", "data", "ann").await;
    let id = pipeline(&h, &ann).await;
    let path = base(&id, "f1");
    send(&h, Method::POST, &path, &ann, json!(["a", "b", "c"])).await;
    let cases = [
        ("count=0", json!(["query", "count"]), "greater_than_equal"),
        ("count=10001", json!(["query", "count"]), "less_than_equal"),
        ("count=ten", json!(["query", "count"]), "int_parsing"),
        ("count=1.5", json!(["query", "count"]), "int_parsing"),
        ("cursor=abc", json!(["query", "cursor"]), "int_parsing"),
        ("cursor=", json!(["query", "cursor"]), "int_parsing"),
        ("cursor=-1", json!(["query", "cursor"]), "greater_than_equal"),
    ];
    for (query, loc, kind) in cases {
        let (status, answer) = h.get(&format!("{path}?{query}"), &ann).await;
        assert_eq!(status, UNPROCESSABLE, "{query}");
        assert_eq!(violations(&answer), [(loc, kind.to_owned())], "{query}");
    }
    let (status, answer) = h.get(&format!("{path}?count=0&cursor=x"), &ann).await;
    assert_eq!(status, UNPROCESSABLE);
    assert_eq!(violations(&answer).len(), 2, "both parameters are reported");

    let (status, page) = h.get(&format!("{path}?count=10000&cursor=0"), &ann).await;
    assert_eq!((status, page["values"].as_array().unwrap().len()), (OK, 3));
    let (status, answer) = h.get(&format!("{path}?count=1&unknown=1"), &ann).await;
    assert_eq!(status, UNPROCESSABLE, "an unknown query parameter is refused");
    assert_eq!(violations(&answer), [(json!(["query", "unknown"]), "extra_forbidden".to_owned())]);
    let (status, page) = h.get(&format!("{path}?count=1"), &ann).await;
    assert_eq!(status, OK);
    assert_eq!(page["values"].as_array().unwrap().len(), 1);
    assert_eq!(page["total_count"], 3);
    let (status, page) = h.get(&format!("{path}?cursor=999999"), &ann).await;
    assert_eq!((status, page), (OK, json!({"values": [], "cursor": null, "total_count": 3})));

    let (status, answer) = h.get(&format!("{path}/check"), &ann).await;
    assert_eq!(status, UNPROCESSABLE);
    assert_eq!(violations(&answer), [(json!(["query", "value"]), "missing".to_owned())]);
    assert_eq!(answer["detail"][0]["msg"], "Field required");
    let (status, answer) = h.get(&format!("{path}/check?value="), &ann).await;
    assert_eq!((status, answer), (OK, json!({"value": "", "is_member": false})));
    let (status, answer) = h.get(&format!("{path}/check?value={}", "a".repeat(2000)), &ann).await;
    assert_eq!((status, answer["is_member"].clone()), (OK, json!(false)));
}

async fn bodies_are_checked_with_precise_locations_and_change_nothing(redis: bool) {
    let h = Harness::with_sets(redis, Limits::default()).await;
    let ann = h.user("acme", "data", "ann").await;
    let id = pipeline(&h, &ann).await;
    let path = base(&id, "f1");
    send(&h, Method::POST, &path, &ann, json!(["keep"])).await;
    let long = "x".repeat(1025);
    let bad: [(Value, Vec<(Value, &str)>); 9] = [
        (
            json!({"values": ["a", "b", "c", 4, null, "f"]}),
            vec![
                (json!(["body", "values", 3]), "string_type"),
                (json!(["body", "values", 4]), "string_type"),
            ],
        ),
        (json!({}), vec![(json!(["body", "values"]), "missing")]),
        (json!({"values": null}), vec![(json!(["body", "values"]), "missing")]),
        (json!({"values": "a"}), vec![(json!(["body", "values"]), "list_type")]),
        (
            json!({"values": ["a"], "mode": "add"}),
            vec![(json!(["body", "mode"]), "extra_forbidden")],
        ),
        (json!(["a"]), vec![(json!(["body"]), "dict_type")]),
        (json!("{\"values\": [\"a\""), vec![(json!(["body"]), "json_invalid")]),
        (json!({"values": ["ok", long]}), vec![(json!(["body", "values", 1]), "value_error")]),
        (json!({"values": []}), vec![(json!(["body", "values"]), "too_short")]),
    ];
    for method in [Method::POST, Method::PUT, Method::DELETE] {
        for (body, expected) in &bad {
            if method == Method::PUT && body == &json!({"values": []}) {
                continue;
            }
            let (status, answer) =
                h.call(method.clone(), &path, Some(&ann.key), Some(body.clone())).await;
            assert_eq!(status, UNPROCESSABLE, "{method} {body}");
            let expected: Vec<(Value, String)> =
                expected.iter().map(|(loc, kind)| (loc.clone(), (*kind).to_owned())).collect();
            assert_eq!(violations(&answer), expected, "{method} {body}");
        }
    }
    // An empty body is not JSON.
    let (status, answer) = h.call(Method::POST, &path, Some(&ann.key), None).await;
    assert_eq!(status, UNPROCESSABLE);
    assert_eq!(violations(&answer), [(json!(["body"]), "json_invalid".to_owned())]);
    let (status, answer) = h.get(&format!("{path}?count=10"), &ann).await;
    assert_eq!((status, answer["values"].clone()), (OK, json!(["keep"])), "nothing changed");
    // 1024 bytes is still accepted.
    let (status, _) = send(&h, Method::POST, &path, &ann, json!(["y".repeat(1024)])).await;
    assert_eq!(status, OK);
}

async fn unknown_pipelines_and_transforms_are_404_and_scripts_are_422(redis: bool) {
    let h = Harness::with_sets(redis, Limits::default()).await;
    let ann = h.user("acme", "data", "ann").await;
    let id = pipeline(&h, &ann).await;
    let suffixes = ["", "/check?value=a", "/count"];
    for suffix in suffixes {
        let (status, answer) = h.get(&format!("{}{suffix}", base("missing", "f1")), &ann).await;
        assert_eq!((status, answer), (NOT_FOUND, json!({"detail": "Pipeline missing not found"})));
        let (status, answer) = h.get(&format!("{}{suffix}", base(&id, "nope")), &ann).await;
        assert_eq!(
            (status, answer),
            (NOT_FOUND, json!({"detail": format!("Transform nope not found in pipeline {id}")}))
        );
        let (status, answer) = h.get(&format!("{}{suffix}", base(&id, "s1")), &ann).await;
        assert_eq!(status, UNPROCESSABLE, "{suffix}");
        assert_eq!(
            violations(&answer),
            [(json!(["path", "transform_uid"]), "value_error".to_owned())]
        );
    }
    for method in [Method::POST, Method::PUT, Method::DELETE] {
        let (status, _) =
            send(&h, method.clone(), &base("missing", "f1"), &ann, json!(["a"])).await;
        assert_eq!(status, NOT_FOUND, "{method}");
        let (status, _) = send(&h, method.clone(), &base(&id, "nope"), &ann, json!(["a"])).await;
        assert_eq!(status, NOT_FOUND, "{method}");
        let (status, answer) = send(&h, method.clone(), &base(&id, "s1"), &ann, json!(["a"])).await;
        assert_eq!(status, UNPROCESSABLE, "{method}");
        assert!(answer["detail"][0]["msg"].as_str().unwrap().contains("redis_set_filter"));
        // The pipeline is checked before the body.
        let (status, _) =
            h.call(method.clone(), &base("missing", "f1"), Some(&ann.key), Some(json!("{"))).await;
        assert_eq!(status, NOT_FOUND, "{method}");
    }
}

async fn each_role_gets_exactly_its_permissions_on_each_filter_values_endpoint(redis: bool) {
    let h = Harness::with_sets(redis, Limits::default()).await;
    let owner = h.user("acme", "core", "owner").await;
    let viewer = h.user("acme", "core", "teammate").await;
    let editor = h.user("acme", "edit-team", "editor").await;
    let reader = h.user("acme", "read-team", "reader").await;
    let stranger = h.user("acme", "elsewhere", "stranger").await;
    let outsider = h.user("other-org", "core", "owner").await;
    let id = pipeline(&h, &owner).await;
    let grants =
        json!({"editors": [editor.id()], "readers": [reader.id()], "viewer_teams": [owner.team()]});
    assert_eq!(h.put(&format!("/api/v1/beam/{id}/permissions"), &owner, grants).await.0, OK);
    let path = base(&id, "f1");
    send(&h, Method::POST, &path, &owner, json!(["seed"])).await;

    let read = [OK, OK, OK, OK, NOT_FOUND, NOT_FOUND];
    let edit = [OK, OK, FORBIDDEN, FORBIDDEN, NOT_FOUND, NOT_FOUND];
    let change = Some(json!({"values": ["seed", "more"]}));
    let matrix: [(Method, String, Option<Value>, [StatusCode; 6]); 6] = [
        (Method::GET, path.clone(), None, read),
        (Method::GET, format!("{path}/check?value=seed"), None, read),
        (Method::GET, format!("{path}/count"), None, read),
        (Method::POST, path.clone(), change.clone(), edit),
        (Method::PUT, path.clone(), change.clone(), edit),
        (Method::DELETE, path.clone(), Some(json!({"values": ["more"]})), edit),
    ];
    let roles = [
        ("owner", &owner),
        ("editor", &editor),
        ("reader", &reader),
        ("viewer_team member", &viewer),
        ("same-org stranger", &stranger),
        ("other org", &outsider),
    ];
    for (method, path, body, expected) in &matrix {
        for ((role, user), want) in roles.iter().zip(expected) {
            let (status, answer) =
                h.call(method.clone(), path, Some(&user.key), body.clone()).await;
            assert_eq!(status, *want, "{role}: {method} {path}: {answer}");
            if status != OK {
                assert!(answer["detail"].is_string(), "{role}: {answer}");
            }
        }
        let (status, answer) = h.call(method.clone(), path, None, body.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "no key: {method} {path}");
        assert_eq!(answer, json!({"detail": "Missing API key: send it in the X-API-Key header"}));
        let (status, answer) =
            h.call(method.clone(), path, Some("slk_nonsense_key_0000000000"), body.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "bad key: {method} {path}");
        assert_eq!(answer, json!({"detail": "Invalid API key"}));
    }
    // Only the owner's and editor's changes went through: the set is what the last PUT and
    // DELETE left.
    assert_eq!(h.get(&format!("{path}?count=10"), &reader).await.1["values"], json!(["seed"]));

    // An organization without the pipeline service gets 403 before anything else.
    h.store.set_org_flags("other-org", Some(false), None).await.unwrap();
    assert_eq!(h.get(&format!("{path}/count"), &outsider).await.0, FORBIDDEN);
}

async fn a_million_values_go_in_one_post_above_the_general_body_limit(redis: bool) {
    let h = Harness::with_sets(redis, Limits::default()).await;
    let ann = h.user("acme", "data", "ann").await;
    let id = pipeline(&h, &ann).await;
    let path = base(&id, "f1");
    let values: Vec<String> = (0..1_000_000u64).map(|i| format!("0x{i:040X}")).collect();
    let body = serde_json::to_string(&json!({ "values": values })).unwrap();
    assert!(body.len() > Limits::default().max_body_bytes, "the body exceeds the general limit");
    let (status, answer) =
        h.call(Method::POST, &path, Some(&ann.key), Some(Value::String(body))).await;
    assert_eq!((status, answer), (OK, json!({"added": 1_000_000})));
    assert_eq!(h.get(&format!("{path}/count"), &ann).await.1, json!({"count": 1_000_000}));
    let probe = format!("{path}/check?value=0x{:040X}", 765_432);
    assert_eq!(h.get(&probe, &ann).await.1["value"], format!("0x{:040x}", 765_432));
    assert_eq!(h.get(&probe, &ann).await.1["is_member"], true);
}

async fn the_filter_values_limit_replaces_the_general_one_on_these_routes_only(redis: bool) {
    let limits = Limits { max_body_bytes: 1_000, max_filter_values_body_bytes: 4_000 };
    let h = Harness::with_sets(redis, limits).await;
    let ann = h.user("acme", "data", "ann").await;
    let mut body = body_with_uids();
    let id = h.create(&ann, body.clone()).await["id"].as_str().unwrap().to_owned();
    let path = base(&id, "f1");
    // About 1,800 bytes: over the general limit, under the filter-values one.
    let medium: Vec<String> = (0..100).map(|i| format!("value-{i:010}")).collect();
    assert_eq!(
        send(&h, Method::POST, &path, &ann, json!(medium)).await,
        (OK, json!({"added": 100}))
    );
    let large: Vec<String> = (0..300).map(|i| format!("value-{i:010}")).collect();
    for method in [Method::POST, Method::PUT, Method::DELETE] {
        let (status, answer) = send(&h, method.clone(), &path, &ann, json!(large)).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{method}");
        assert_eq!(
            answer,
            json!({"detail": "request body is larger than the limit of 4000 bytes"})
        );
    }
    assert_eq!(h.get(&format!("{path}/count"), &ann).await.1, json!({"count": 100}));
    body["description"] = json!("x".repeat(1_500));
    let (status, _) = h.put(&format!("/api/v1/beam/{id}"), &ann, body).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "other routes keep the general limit");
}

async fn inline_set_values_are_listed_and_values_of_removed_transforms_are_gone(redis: bool) {
    let h = Harness::with_sets(redis, Limits::default()).await;
    let ann = h.user("acme", "data", "ann").await;
    let mut body = body_with_uids();
    body["pipeline_config"]["transforms"][0]["set_values"] = json!(["0xAA", "0xbb", "0xaa"]);
    let id = h.create(&ann, body.clone()).await["id"].as_str().unwrap().to_owned();
    let (status, page) = h.get(&base(&id, "f1"), &ann).await;
    assert_eq!(status, OK);
    let mut values: Vec<&str> =
        page["values"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    values.sort();
    assert_eq!(values, ["0xaa", "0xbb"]);
    send(&h, Method::POST, &base(&id, "f2"), &ann, json!(["topic"])).await;

    // Update: f1 is kept, f2 is removed.
    let mut update = body_with_uids();
    update["pipeline_config"]["transforms"].as_array_mut().unwrap().remove(1);
    assert_eq!(h.put(&format!("/api/v1/beam/{id}"), &ann, update).await.0, OK);
    assert_eq!(h.get(&format!("{}/count", base(&id, "f1")), &ann).await.1, json!({"count": 2}));
    assert_eq!(h.get(&format!("{}/count", base(&id, "f2")), &ann).await.0, NOT_FOUND);
    assert_eq!(h.store.filter_value_count(&id, "f2").await.unwrap(), 0);
    // Bringing the uid back starts from an empty set.
    assert_eq!(h.put(&format!("/api/v1/beam/{id}"), &ann, body_with_uids()).await.0, OK);
    assert_eq!(h.get(&format!("{}/count", base(&id, "f2")), &ann).await.1, json!({"count": 0}));
}

/// What a [`Recorder`] heard, with the values sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heard {
    Added(Vec<String>),
    Removed(Vec<String>),
    Replaced(Vec<String>),
    Dropped,
}

#[derive(Default)]
struct Recorder(Mutex<Vec<(String, String, Heard)>>);

impl Recorder {
    fn take(&self) -> Vec<(String, String, Heard)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl FilterValuesListener for Recorder {
    fn changed(&self, pipeline_id: &str, transform_uid: &str, change: FilterValuesChange<'_>) {
        let sorted = |values: &[String]| {
            let mut values = values.to_vec();
            values.sort();
            values
        };
        let heard = match change {
            FilterValuesChange::Added(values) => Heard::Added(sorted(values)),
            FilterValuesChange::Removed(values) => Heard::Removed(sorted(values)),
            FilterValuesChange::Replaced(values) => Heard::Replaced(sorted(values)),
            FilterValuesChange::Dropped => Heard::Dropped,
        };
        self.0.lock().unwrap().push((pipeline_id.to_owned(), transform_uid.to_owned(), heard));
    }
}

fn owned(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

#[tokio::test]
async fn the_listener_hears_every_committed_change_and_nothing_else() {
    let recorder = Arc::new(Recorder::default());
    let h = Harness::with_listener(recorder.clone()).await;
    let ann = h.user("acme", "data", "ann").await;
    let reader = h.user("acme", "other", "reader").await;

    let mut body = body_with_uids();
    body["pipeline_config"]["transforms"][1]["set_values"] = json!(["T1"]);
    let id = h.create(&ann, body).await["id"].as_str().unwrap().to_owned();
    let s = |uid: &str, heard: Heard| (id.clone(), uid.to_owned(), heard);
    assert_eq!(recorder.take(), [s("f2", Heard::Added(owned(&["t1"])))]);

    let path = base(&id, "f1");
    send(&h, Method::POST, &path, &ann, json!(["B", "a"])).await;
    send(&h, Method::DELETE, &path, &ann, json!(["A", "z"])).await;
    send(&h, Method::PUT, &path, &ann, json!(["C"])).await;
    send(&h, Method::PUT, &path, &ann, json!([])).await;
    assert_eq!(
        recorder.take(),
        [
            s("f1", Heard::Added(owned(&["a", "b"]))),
            s("f1", Heard::Removed(owned(&["a", "z"]))),
            s("f1", Heard::Replaced(owned(&["c"]))),
            s("f1", Heard::Replaced(vec![])),
        ]
    );

    // Rejected requests tell nothing.
    send(&h, Method::POST, &path, &ann, json!([1])).await;
    send(&h, Method::POST, &path, &reader, json!(["x"])).await;
    send(&h, Method::POST, &base(&id, "s1"), &ann, json!(["x"])).await;
    assert_eq!(recorder.take(), []);

    // An update that turns f2 into a script drops f2's set; f1 stays.
    let mut update = body_with_uids();
    update["pipeline_config"]["transforms"][1] =
        json!({"type": "v8", "uid": "f2", "script": "function transform(r) { return r; }"});
    assert_eq!(h.put(&format!("/api/v1/beam/{id}"), &ann, update.clone()).await.0, OK);
    assert_eq!(recorder.take(), [s("f2", Heard::Dropped)]);
    assert_eq!(h.put(&format!("/api/v1/beam/{id}"), &ann, update).await.0, OK);
    assert_eq!(recorder.take(), [], "nothing more to drop");

    assert_eq!(h.delete(&format!("/api/v1/beam/{id}"), &ann).await.0, OK);
    assert_eq!(recorder.take(), [s("f1", Heard::Dropped)]);
}
