//! `{base_url}/datasets`: every endpoint and error status, ownership, the 250,000-value
//! boundary, cursor paging while entries are added, and the index behind `beam.contains`
//! seeing each change once the call returns.

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sluice_core::datasets::DatasetLookup;
use sluice_runtime::datasets::DatasetIndex;

use crate::harness::{Harness, User};

const OK: StatusCode = StatusCode::OK;
const NOT_FOUND: StatusCode = StatusCode::NOT_FOUND;
const UNPROCESSABLE: StatusCode = StatusCode::UNPROCESSABLE_ENTITY;
const BASE: &str = "/api/v1/beam/datasets";

async fn create(h: &Harness, user: &User, name: &str) -> String {
    let (status, created) = h.post(BASE, user, json!({ "name": name })).await;
    assert_eq!(status, OK, "{created}");
    created["id"].as_str().unwrap().to_owned()
}

fn entries(id: &str) -> String {
    format!("{BASE}/{id}/entries")
}

async fn add(h: &Harness, user: &User, id: &str, values: Value) -> (StatusCode, Value) {
    h.post(&entries(id), user, json!({ "values": values })).await
}

async fn remove(h: &Harness, user: &User, id: &str, values: Value) -> (StatusCode, Value) {
    h.call(Method::DELETE, &entries(id), Some(&user.key), Some(json!({ "values": values }))).await
}

async fn exists(h: &Harness, user: &User, id: &str, value: &str) -> Value {
    let (status, answer) = h.get(&format!("{}/check?value={value}", entries(id)), user).await;
    assert_eq!(status, OK, "{answer}");
    answer["exists"].clone()
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

fn names(list: &Value) -> Vec<&str> {
    list.as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn create_list_and_delete_have_the_spec_shapes_and_statuses() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let (status, created) = h.post(BASE, &ann, json!({"name": "wallets"})).await;
    assert_eq!(status, OK);
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(
        created,
        json!({
            "id": id,
            "name": "wallets",
            "type": "postgres",
            "created_at": "2026-11-21T12:00:00.000000Z",
            "updated_at": "2026-11-21T12:00:00.000000Z",
        })
    );
    let (status, answer) = h.post(BASE, &ann, json!({"name": "wallets", "type": "postgres"})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(answer, json!({"detail": "Dataset wallets already exists"}));
    create(&h, &ann, "tokens").await;
    create(&h, &ann, "labels").await;

    let (status, list) = h.get(BASE, &ann).await;
    assert_eq!(status, OK);
    assert_eq!(names(&list), ["wallets", "tokens", "labels"], "oldest first");
    assert_eq!(list[0], created);
    let (_, list) = h.get(&format!("{BASE}?names=labels&names=wallets&names=nope"), &ann).await;
    assert_eq!(names(&list), ["wallets", "labels"]);
    let (_, list) = h.get(&format!("{BASE}?names=nope"), &ann).await;
    assert_eq!(list, json!([]));

    add(&h, &ann, &id, json!(["0xa"])).await;
    let (status, body) = h.delete(&format!("{BASE}/{id}"), &ann).await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null), "204 without a body");
    let (status, body) = h.delete(&format!("{BASE}/{id}"), &ann).await;
    assert_eq!((status, body), (NOT_FOUND, json!({"detail": format!("Dataset {id} not found")})));
    assert_eq!(names(&h.get(BASE, &ann).await.1), ["tokens", "labels"]);
    assert_eq!(h.get(&entries(&id), &ann).await.0, NOT_FOUND);
    assert_eq!(h.get(&format!("{}/check?value=0xa", entries(&id)), &ann).await.0, NOT_FOUND);
    // The name is free again, for a new, empty dataset.
    let again = create(&h, &ann, "wallets").await;
    assert_ne!(again, id);
    assert_eq!(exists(&h, &ann, &again, "0xa").await, false);
}

#[tokio::test]
async fn datasets_of_another_user_are_404_on_every_route_and_names_are_per_user() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let bob = h.user("acme", "data", "bob").await;
    let id = create(&h, &ann, "wallets").await;
    add(&h, &ann, &id, json!(["0xa"])).await;

    let path = entries(&id);
    let body = json!({"values": ["0xb"]});
    let answers = [
        h.call(Method::DELETE, &format!("{BASE}/{id}"), Some(&bob.key), None).await,
        h.post(&path, &bob, body.clone()).await,
        h.call(Method::DELETE, &path, Some(&bob.key), Some(body.clone())).await,
        h.get(&path, &bob).await,
        h.get(&format!("{path}/check?value=0xa"), &bob).await,
    ];
    for (status, answer) in answers {
        assert_eq!(
            (status, answer),
            (NOT_FOUND, json!({"detail": format!("Dataset {id} not found")}))
        );
    }
    let (status, answer) = h
        .post(&format!("{BASE}/entries"), &bob, json!({"name": "wallets", "values": ["0xb"]}))
        .await;
    assert_eq!((status, answer), (NOT_FOUND, json!({"detail": "Dataset named wallets not found"})));
    assert_eq!(h.get(BASE, &bob).await.1, json!([]));

    // Bob may have his own "wallets"; nothing of Ann's changed.
    let bobs = create(&h, &bob, "wallets").await;
    assert_eq!(exists(&h, &bob, &bobs, "0xa").await, false);
    let (_, page) = h.get(&entries(&id), &ann).await;
    assert_eq!(page, json!({"values": ["0xa"], "cursor": null, "total_count": 1}));

    // A key from another organization is no different.
    let eve = h.user("other", "t", "eve").await;
    assert_eq!(h.get(&entries(&id), &eve).await.0, NOT_FOUND);
    // No key at all is 401 before anything else.
    let (status, _) = h.call(Method::GET, &entries(&id), None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn entries_are_lowercased_counted_checked_listed_and_deleted() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let id = create(&h, &ann, "wallets").await;

    let (status, answer) = add(&h, &ann, &id, json!(["0xAB", "0xab", "0xCD"])).await;
    assert_eq!((status, answer), (OK, json!({"count": 2})));
    let (status, answer) = add(&h, &ann, &id, json!(["0xcd", "0xEF"])).await;
    assert_eq!((status, answer), (OK, json!({"count": 1})), "duplicates are ignored");
    let by_name = json!({"name": "wallets", "values": ["0x01", "0XEF"]});
    let (status, answer) = h.post(&format!("{BASE}/entries"), &ann, by_name).await;
    assert_eq!((status, answer), (OK, json!({"count": 1})));
    let unknown = json!({"name": "Wallets", "values": ["0x01"]});
    let (status, answer) = h.post(&format!("{BASE}/entries"), &ann, unknown).await;
    assert_eq!((status, answer), (NOT_FOUND, json!({"detail": "Dataset named Wallets not found"})));

    assert_eq!(exists(&h, &ann, &id, "0XaB").await, true, "lookups are lowercased too");
    assert_eq!(exists(&h, &ann, &id, "0x99").await, false);
    assert_eq!(exists(&h, &ann, &id, &"a".repeat(2000)).await, false);
    let (status, answer) = h.get(&format!("{}/check", entries(&id)), &ann).await;
    assert_eq!(status, UNPROCESSABLE);
    assert_eq!(violations(&answer), [(json!(["query", "value"]), "missing".to_owned())]);

    let (status, page) = h.get(&entries(&id), &ann).await;
    assert_eq!(status, OK);
    assert_eq!(
        page,
        json!({"values": ["0x01", "0xab", "0xcd", "0xef"], "cursor": null, "total_count": 4})
    );
    let (_, page) = h.get(&format!("{}?limit=3", entries(&id)), &ann).await;
    assert_eq!(
        page,
        json!({"values": ["0x01", "0xab", "0xcd"], "cursor": "0xcd", "total_count": 4})
    );
    let (_, page) = h.get(&format!("{}?limit=3&cursor=0xcd", entries(&id)), &ann).await;
    assert_eq!(page, json!({"values": ["0xef"], "cursor": null, "total_count": 4}));

    let (status, answer) = remove(&h, &ann, &id, json!(["0xAB", "0xab", "0x99"])).await;
    assert_eq!((status, answer), (OK, json!({"count": 1})), "missing values are ignored");
    assert_eq!(exists(&h, &ann, &id, "0xab").await, false);
    let (_, page) = h.get(&entries(&id), &ann).await;
    assert_eq!(page["total_count"], 3);

    // updated_at follows entry changes.
    h.clock.advance(chrono::Duration::minutes(5));
    add(&h, &ann, &id, json!(["0x02"])).await;
    let (_, list) = h.get(BASE, &ann).await;
    assert_eq!(list[0]["updated_at"], "2026-11-21T12:05:00.000000Z");
    assert_eq!(list[0]["created_at"], "2026-11-21T12:00:00.000000Z");
}

#[tokio::test]
async fn bad_bodies_and_queries_are_422_and_change_nothing() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let cases = [
        (json!({}), vec![(json!(["body", "name"]), "missing")]),
        (json!({"name": 5}), vec![(json!(["body", "name"]), "string_type")]),
        (json!({"name": ""}), vec![(json!(["body", "name"]), "value_error")]),
        (json!({"name": "x".repeat(256)}), vec![(json!(["body", "name"]), "value_error")]),
        (json!({"name": "w", "type": "redis"}), vec![(json!(["body", "type"]), "enum")]),
        (json!({"name": "w", "size": 1}), vec![(json!(["body", "size"]), "extra_forbidden")]),
        (json!(["w"]), vec![(json!(["body"]), "dict_type")]),
    ];
    for (body, expected) in cases {
        let (status, answer) = h.post(BASE, &ann, body.clone()).await;
        assert_eq!(status, UNPROCESSABLE, "{body}");
        let expected: Vec<(Value, String)> =
            expected.into_iter().map(|(l, t)| (l, t.to_owned())).collect();
        assert_eq!(violations(&answer), expected, "{body}");
    }
    assert_eq!(h.get(BASE, &ann).await.1, json!([]));
    // 255 characters (not bytes) is the longest name.
    create(&h, &ann, &"ä".repeat(255)).await;

    let id = create(&h, &ann, "w").await;
    let cases = [
        (json!({}), vec![(json!(["body", "values"]), "missing")]),
        (json!({"values": "0xa"}), vec![(json!(["body", "values"]), "list_type")]),
        (json!({"values": ["0xa", 7]}), vec![(json!(["body", "values", 1]), "string_type")]),
        (json!({"values": []}), vec![(json!(["body", "values"]), "too_short")]),
        (
            json!({"values": ["0xa", "b".repeat(1025)]}),
            vec![(json!(["body", "values", 1]), "value_error")],
        ),
        (
            json!({"values": ["0xa"], "name": "w"}),
            vec![(json!(["body", "name"]), "extra_forbidden")],
        ),
        (Value::String("{\"values\": [".to_owned()), vec![(json!(["body"]), "json_invalid")]),
    ];
    for (body, expected) in cases {
        let expected: Vec<(Value, String)> =
            expected.into_iter().map(|(l, t)| (l, t.to_owned())).collect();
        for method in [Method::POST, Method::DELETE] {
            let (status, answer) =
                h.call(method.clone(), &entries(&id), Some(&ann.key), Some(body.clone())).await;
            assert_eq!(status, UNPROCESSABLE, "{method} {body}");
            assert_eq!(violations(&answer), expected, "{method} {body}");
        }
    }
    let (status, answer) =
        h.post(&format!("{BASE}/entries"), &ann, json!({"values": ["0xa"]})).await;
    assert_eq!(status, UNPROCESSABLE);
    assert_eq!(violations(&answer), [(json!(["body", "name"]), "missing".to_owned())]);
    assert_eq!(h.get(&entries(&id), &ann).await.1["total_count"], 0);

    for (query, kind) in [
        ("limit=0", "greater_than_equal"),
        ("limit=500001", "less_than_equal"),
        ("limit=ten", "int_parsing"),
    ] {
        let (status, answer) = h.get(&format!("{}?{query}", entries(&id)), &ann).await;
        assert_eq!(status, UNPROCESSABLE, "{query}");
        assert_eq!(violations(&answer), [(json!(["query", "limit"]), kind.to_owned())]);
    }
    let (status, _) = h.get(&format!("{}?limit=500000", entries(&id)), &ann).await;
    assert_eq!(status, OK);
}

#[tokio::test]
async fn a_request_takes_250000_values_and_one_more_is_422_naming_the_limit() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let id = create(&h, &ann, "big").await;
    let values: Vec<String> = (0..250_001).map(|i| format!("0x{i:040x}")).collect();

    let (status, answer) = add(&h, &ann, &id, json!(values)).await;
    assert_eq!(status, UNPROCESSABLE);
    assert_eq!(violations(&answer), [(json!(["body", "values"]), "too_long".to_owned())]);
    let msg = answer["detail"][0]["msg"].as_str().unwrap();
    assert!(msg.contains("250000") && msg.contains("250001"), "{msg}");
    assert_eq!(h.get(&entries(&id), &ann).await.1["total_count"], 0, "nothing was stored");
    let (status, _) = remove(&h, &ann, &id, json!(values)).await;
    assert_eq!(status, UNPROCESSABLE);
    let by_name = json!({"name": "big", "values": values});
    assert_eq!(h.post(&format!("{BASE}/entries"), &ann, by_name).await.0, UNPROCESSABLE);

    let (status, answer) = add(&h, &ann, &id, json!(values[..250_000])).await;
    assert_eq!((status, answer), (OK, json!({"count": 250_000})));
    let (status, answer) = remove(&h, &ann, &id, json!(values[1..250_001])).await;
    assert_eq!((status, answer), (OK, json!({"count": 249_999})));
    let (_, page) = h.get(&entries(&id), &ann).await;
    assert_eq!(page, json!({"values": [values[0]], "cursor": null, "total_count": 1}));
}

#[tokio::test]
async fn paging_with_the_cursor_while_entries_are_added_lists_each_entry_once_in_order() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let id = create(&h, &ann, "wallets").await;
    let initial: Vec<String> = (0..250).map(|i| format!("0x{:04x}", i * 2)).collect();
    add(&h, &ann, &id, json!(initial)).await;

    let (status, first) = h.get(&format!("{}?limit=100", entries(&id)), &ann).await;
    assert_eq!(status, OK);
    assert_eq!(first["values"].as_array().unwrap().len(), 100);
    assert_eq!(first["total_count"], 250);
    assert_eq!(first["cursor"], initial[99]);
    let mut seen: Vec<String> = serde_json::from_value(first["values"].clone()).unwrap();
    let mut cursor = first["cursor"].clone();
    let writer = async {
        for batch in 0..10 {
            // Odd values land before and after the cursor.
            let values: Vec<String> =
                (0..10).map(|i| format!("0x{:04x}", (batch * 50 + i * 5) * 2 + 1)).collect();
            let (status, _) = add(&h, &ann, &id, json!(values)).await;
            assert_eq!(status, OK);
            tokio::task::yield_now().await;
        }
    };
    let reader = async {
        while let Some(at) = cursor.as_str().map(str::to_owned) {
            let (status, page) =
                h.get(&format!("{}?cursor={at}&limit=30", entries(&id)), &ann).await;
            assert_eq!(status, OK, "{page}");
            seen.extend(serde_json::from_value::<Vec<String>>(page["values"].clone()).unwrap());
            cursor = page["cursor"].clone();
            tokio::task::yield_now().await;
        }
    };
    tokio::join!(writer, reader);

    assert!(seen.windows(2).all(|w| w[0] < w[1]), "ascending, nothing repeated");
    for value in &initial {
        assert!(seen.contains(value), "{value} was there throughout but skipped");
    }
    let (_, all) = h.get(&entries(&id), &ann).await;
    assert_eq!(all["total_count"], 350);
    let all: Vec<String> = serde_json::from_value(all["values"].clone()).unwrap();
    assert!(seen.iter().all(|v| all.contains(v)));
}

#[tokio::test]
async fn the_lookup_behind_beam_contains_sees_each_change_when_the_call_returns() {
    let index = Arc::new(DatasetIndex::new());
    let h = Harness::with_dataset_listener(index.clone()).await;
    let ann = h.user("acme", "data", "ann").await;
    let bob = h.user("acme", "data", "bob").await;
    let (owner, other) = (ann.id().to_owned(), bob.id().to_owned());
    let id = create(&h, &ann, "wallets").await;
    assert!(!index.contains_any(&owner, "wallets", &["0xab"]));

    add(&h, &ann, &id, json!(["0xAB"])).await;
    assert!(index.contains_any(&owner, "wallets", &["0x01", "0xAb"]));
    assert!(!index.contains_any(&other, "wallets", &["0xab"]), "only the owner's dataset");
    let by_name = json!({"name": "wallets", "values": ["0xCD"]});
    h.post(&format!("{BASE}/entries"), &ann, by_name).await;
    assert!(index.contains_any(&owner, "wallets", &["0xcd"]));

    remove(&h, &ann, &id, json!(["0xab"])).await;
    assert!(!index.contains_any(&owner, "wallets", &["0xab"]));
    assert!(index.contains_any(&owner, "wallets", &["0xcd"]));
    // A rejected change changes nothing.
    let (status, _) = add(&h, &ann, &id, json!(["0xee", 1])).await;
    assert_eq!(status, UNPROCESSABLE);
    assert!(!index.contains_any(&owner, "wallets", &["0xee"]));

    h.delete(&format!("{BASE}/{id}"), &ann).await;
    assert!(!index.contains_any(&owner, "wallets", &["0xcd"]));
    let again = create(&h, &ann, "wallets").await;
    assert!(!index.contains_any(&owner, "wallets", &["0xcd"]), "a new dataset starts empty");
    add(&h, &ann, &again, json!(["0xcd"])).await;
    assert!(index.contains_any(&owner, "wallets", &["0xcd"]));
    assert_eq!(index.stats().datasets, 1);
}

#[tokio::test]
async fn an_organization_without_the_pipeline_service_gets_403() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let id = create(&h, &ann, "wallets").await;
    h.store.set_org_flags("acme", Some(false), None).await.unwrap();
    let (status, answer) = h.get(BASE, &ann).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(answer["detail"].as_str().unwrap().contains("not enabled"));
    assert_eq!(h.post(BASE, &ann, json!({"name": "x"})).await.0, StatusCode::FORBIDDEN);
    assert_eq!(add(&h, &ann, &id, json!(["0xa"])).await.0, StatusCode::FORBIDDEN);
}
