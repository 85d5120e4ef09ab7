//! The set history through the API: `GET …/filter-values/check?at=` and
//! `GET …/filter-values/changes` (docs/set-filter.md, "Set history"), with the values in the
//! store's tables and in Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::{Method, StatusCode};
use chrono::Duration;
use serde_json::{Value, json};
use sluice_api::Limits;
use sluice_api::chains::{ChainStatusBody, ChainStatusSource};

use crate::harness::{Harness, User};

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

on_both_set_stores!(
    check_at_answers_membership_at_past_times_and_blocks,
    changes_page_newest_first_with_counts_positions_and_values,
    bad_points_and_points_before_the_history_are_422,
    another_tenant_gets_the_answer_of_a_missing_pipeline,
);

/// The base chain's ingester, at a block the test moves.
#[derive(Default)]
struct BaseHead(AtomicU64);

impl ChainStatusSource for BaseHead {
    fn statuses(&self) -> Vec<ChainStatusBody> {
        let block = self.0.load(Ordering::SeqCst);
        vec![ChainStatusBody {
            chain: "base".to_owned(),
            rpc_url: None,
            head: Some(block + 5),
            finalized: Some(block),
            ingested: Some(block),
            zerolag_ingested: Some(block + 5),
            lag_blocks: Some(5),
            lag_seconds: Some(10),
            reorgs: 0,
            rpc_requests: 0,
            rpc_errors: 0,
            last_error: None,
            rejected: None,
            lag_bytes: None,
            source: None,
            entity: None,
            records: None,
            lag_messages: None,
        }]
    }

    fn metrics_text(&self) -> String {
        String::new()
    }
}

struct Setup {
    h: Harness,
    ann: User,
    path: String,
    /// The times of the three changes (RFC 3339).
    times: [String; 3],
}

/// A pipeline on base, then at minutes 0, 10 and 20 (blocks 100, 200, 300): add
/// {0xaa, 0xbb, cc}, remove {0xbb}, replace by {0xaa, dd}.
async fn three_changes(redis: bool) -> Setup {
    let head = Arc::new(BaseHead::default());
    let h = Harness::with_sets(redis, Limits::default()).await.showing_chains(head.clone());
    let ann = h.user("acme", "data", "ann").await;
    let body = json!({
        "name": "history",
        "description": "d",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "log"},
            "transforms": [
                {"type": "redis_set_filter", "uid": "f1", "filter_expr": "root = this.address"}
            ],
            "sinks": [{"type": "kafka", "name": "out"}]
        }
    });
    let id = h.create(&ann, body).await["id"].as_str().unwrap().to_owned();
    let path = format!("/api/v1/beam/{id}/transforms/f1/filter-values");
    let mut times = Vec::new();
    let steps = [
        (Method::POST, json!(["0xAA", "0xbb", "CC", "0xaa"]), json!({"added": 3})),
        (Method::DELETE, json!(["0xbb", "zz"]), json!({"removed": 1})),
        (Method::PUT, json!(["0xaa", "dd"]), json!({"count": 2})),
    ];
    for (step, (method, values, answer)) in steps.into_iter().enumerate() {
        if step > 0 {
            h.clock.advance(Duration::minutes(10));
        }
        head.0.store(100 * (step as u64 + 1), Ordering::SeqCst);
        times.push(sluice_core::time::format(sluice_core::clock::Clock::now(h.clock.as_ref())));
        let sent = h.call(method, &path, Some(&ann.key), Some(json!({ "values": values }))).await;
        assert_eq!(sent, (StatusCode::OK, answer));
    }
    h.clock.advance(Duration::minutes(10));
    Setup { h, ann, path, times: times.try_into().unwrap() }
}

async fn check(s: &Setup, value: &str, at: &str) -> (StatusCode, Value) {
    let at = at.replace('+', "%2B");
    s.h.get(&format!("{}/check?value={value}&at={at}", s.path), &s.ann).await
}

async fn member(s: &Setup, value: &str, at: &str) -> bool {
    let (status, body) = check(s, value, at).await;
    assert_eq!(status, StatusCode::OK, "{value} at {at}: {body}");
    assert_eq!(body["value"], json!(value.to_lowercase()));
    body["is_member"].as_bool().unwrap()
}

async fn check_at_answers_membership_at_past_times_and_blocks(redis: bool) {
    let s = three_changes(redis).await;
    let [added_at, removed_at, replaced_at] = &s.times;
    let before = "2026-11-21T11:59:59Z";
    // (value, before the add, after the add, after the remove, after the replace)
    let expected = [
        ("0xaa", false, true, true, true),
        ("0xBB", false, true, false, false),
        ("cc", false, true, true, false),
        ("dd", false, false, false, true),
    ];
    for (value, none, added, removed, replaced) in expected {
        assert_eq!(member(&s, value, before).await, none, "{value} before");
        assert_eq!(member(&s, value, added_at).await, added, "{value} at {added_at}");
        assert_eq!(member(&s, value, removed_at).await, removed, "{value} at {removed_at}");
        assert_eq!(member(&s, value, replaced_at).await, replaced, "{value} at {replaced_at}");
        // A change made when the stream's head was at block N applies from block N + 1.
        assert_eq!(member(&s, value, "100").await, none, "{value} at block 100");
        assert_eq!(member(&s, value, "101").await, added, "{value} at block 101");
        assert_eq!(member(&s, value, "250").await, removed, "{value} at block 250");
        assert_eq!(member(&s, value, "301").await, replaced, "{value} at block 301");
        // Without `at`: now.
        let (_, now) = s.h.get(&format!("{}/check?value={value}", s.path), &s.ann).await;
        assert_eq!(now["is_member"], json!(replaced), "{value} now");
    }
    // Offsets are times too: 12:10:00+01:00 is 11:10 UTC, before every change.
    assert!(!member(&s, "0xaa", "2026-11-21T12:10:00+01:00").await);
}

async fn changes_page_newest_first_with_counts_positions_and_values(redis: bool) {
    let s = three_changes(redis).await;
    let (status, first) = s.h.get(&format!("{}/changes?count=2", s.path), &s.ann).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let changes = first["changes"].as_array().unwrap();
    let kinds: Vec<_> = changes
        .iter()
        .map(|c| {
            (
                c["kind"].clone(),
                c["values_given"].clone(),
                c["added"].clone(),
                c["removed"].clone(),
                c["count_after"].clone(),
                c["block"].clone(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (json!("replace"), json!(2), json!(1), json!(1), json!(2), json!(300)),
            (json!("remove"), json!(2), json!(0), json!(1), json!(2), json!(200)),
        ]
    );
    assert!(changes[0].get("added_values").is_none(), "values only when asked");
    let changed_at = changes[0]["changed_at"].as_str().unwrap();
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(changed_at).unwrap().to_utc(),
        chrono::DateTime::parse_from_rfc3339(&s.times[2]).unwrap().to_utc()
    );
    let cursor = first["cursor"].as_i64().expect("a cursor while older changes exist");
    let next = format!("{}/changes?count=2&cursor={cursor}&values=true", s.path);
    let (status, second) = s.h.get(&next, &s.ann).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["cursor"], Value::Null);
    let last = second["changes"].as_array().unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!((last[0]["kind"].clone(), last[0]["added"].clone()), (json!("add"), json!(3)));
    let mut added: Vec<&str> =
        last[0]["added_values"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    added.sort_unstable();
    assert_eq!(added, ["0xaa", "0xbb", "cc"]);
    assert_eq!(last[0]["removed_values"], json!([]));
    assert!(last[0]["id"].as_i64().unwrap() < cursor);
    let (_, replace) = s.h.get(&format!("{}/changes?count=1&values=true", s.path), &s.ann).await;
    assert_eq!(replace["changes"][0]["added_values"], json!(["dd"]));
    assert_eq!(replace["changes"][0]["removed_values"], json!(["cc"]));
    // Bad paging parameters are 422 at their location.
    for (query, field) in [
        ("count=0", "count"),
        ("count=1001", "count"),
        ("cursor=x", "cursor"),
        ("values=yes", "values"),
        ("at=1", "at"),
    ] {
        let (status, body) = s.h.get(&format!("{}/changes?{query}", s.path), &s.ann).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{query}: {body}");
        assert_eq!(body["detail"][0]["loc"], json!(["query", field]), "{query}");
    }
}

async fn bad_points_and_points_before_the_history_are_422(redis: bool) {
    let s = three_changes(redis).await;
    for bad in ["yesterday", "-5", "1.5", "2026-11-21", "99999999999999999999999", ""] {
        let (status, body) = check(&s, "0xaa", bad).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "at={bad}: {body}");
        assert_eq!(body["detail"][0]["loc"], json!(["query", "at"]), "at={bad}");
        assert_eq!(body["detail"][0]["type"], json!("value_error"), "at={bad}");
    }
    // Removing the transform forgets its history: a point before that is out of range.
    let id = s.path.split('/').nth(4).unwrap().to_owned();
    let (_, mut pipeline) = s.h.get(&format!("/api/v1/beam/{id}"), &s.ann).await;
    let script =
        json!({"type": "v8", "uid": "s1", "script": "function transform(r) { return r; }"});
    let with_f1 = pipeline["pipeline_config"]["transforms"].clone();
    pipeline["pipeline_config"]["transforms"] = json!([script]);
    let (status, _) = s.h.put(&format!("/api/v1/beam/{id}"), &s.ann, edit_body(&pipeline)).await;
    assert_eq!(status, StatusCode::OK);
    pipeline["pipeline_config"]["transforms"] = with_f1;
    let (status, _) = s.h.put(&format!("/api/v1/beam/{id}"), &s.ann, edit_body(&pipeline)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = check(&s, "0xaa", &s.times[1]).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["detail"][0]["type"], json!("history_out_of_range"));
    assert_eq!(body["detail"][0]["loc"], json!(["query", "at"]));
    let (status, body) = check(&s, "0xaa", "250").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["detail"][0]["type"], json!("history_out_of_range"));
}

/// The editable fields of a pipeline record.
fn edit_body(pipeline: &Value) -> Value {
    let mut body = json!({});
    for field in ["name", "description", "pipeline_config"] {
        body[field] = pipeline[field].clone();
    }
    body
}

async fn another_tenant_gets_the_answer_of_a_missing_pipeline(redis: bool) {
    let s = three_changes(redis).await;
    let eve = s.h.user("evil", "corp", "eve").await;
    let missing =
        s.path.replace(s.path.split('/').nth(4).unwrap(), "00000000-0000-0000-0000-000000000000");
    for suffix in ["/changes", "/check?value=0xaa&at=150"] {
        let theirs = s.h.get(&format!("{}{suffix}", s.path), &eve).await;
        let none = s.h.get(&format!("{missing}{suffix}"), &eve).await;
        assert_eq!(theirs.0, StatusCode::NOT_FOUND, "{suffix}: {}", theirs.1);
        assert_eq!(theirs.0, none.0, "{suffix}");
        let id = s.path.split('/').nth(4).unwrap();
        let scrub = |body: &Value, id: &str| body.to_string().replace(id, "<id>");
        assert_eq!(scrub(&theirs.1, id), scrub(&none.1, "00000000-0000-0000-0000-000000000000"));
    }
}
