//! The event role: events stored once per key, read back by visibility and filters in id
//! order, purged by age; notification destinations and their delivery progress;
//! thresholds. Two stores on one database stand for two nodes.

use std::sync::Arc;

use chrono::{Duration, Utc};
use serde_json::json;
use sluice_core::events::{NewEvent, Severity};
use sluice_store::{EventQuery, MetadataStore};

fn pipeline_event(org: &str, pipeline: &str, kind: &'static str, severity: Severity) -> NewEvent {
    NewEvent::pipeline(Utc::now(), kind, severity, org, pipeline, kind.to_owned(), json!({"n": 1}))
}

async fn events_are_numbered_in_order_filtered_by_visibility_and_kept_once_per_key(
    store: Arc<dyn MetadataStore>,
) {
    let a = store.ensure_identity("org-a", "t", "u", false).await.unwrap();
    let b = store.ensure_identity("org-b", "t", "u", false).await.unwrap();
    let (org_a, org_b) = (a.org.id.as_str(), b.org.id.as_str());
    let now = Utc::now();
    let batch = vec![
        pipeline_event(org_a, "p1", "pipeline.created", Severity::Info),
        pipeline_event(org_a, "p1", "sink.failing", Severity::Error),
        pipeline_event(org_b, "p2", "pipeline.created", Severity::Info),
        NewEvent::chain(
            now,
            "chain.stalled",
            Severity::Error,
            "base",
            "m".into(),
            json!({}),
            "k1".into(),
        ),
        NewEvent::node(now, "node.lost", Severity::Error, "n1", "m".into(), json!({}), "k2".into()),
    ];
    let stored = store.insert_events(&batch).await.unwrap();
    assert_eq!(stored.len(), 5);
    assert!(stored.windows(2).all(|w| w[0] < w[1]), "ids grow");
    // The same facts again (another node saw them): keyed ones are kept once.
    let again = store.insert_events(&batch[3..]).await.unwrap();
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(store.last_event_id().await.unwrap(), stored[4]);

    let query = |org: &str| EventQuery {
        org_id: Some(org.to_owned()),
        service: true,
        limit: 100,
        ..EventQuery::default()
    };
    let seen: Vec<String> =
        store.list_events(&query(org_a)).await.unwrap().iter().map(|e| e.kind.clone()).collect();
    assert_eq!(seen, ["chain.stalled", "sink.failing", "pipeline.created"], "newest first");
    let operator = EventQuery { operator: true, ..query(org_b) };
    let seen: Vec<String> =
        store.list_events(&operator).await.unwrap().iter().map(|e| e.kind.clone()).collect();
    assert_eq!(seen, ["node.lost", "chain.stalled", "pipeline.created"]);

    let errors = EventQuery { min_severity: Some(Severity::Error), ..query(org_a) };
    assert_eq!(store.list_events(&errors).await.unwrap().len(), 2);
    let family = EventQuery { kinds: vec!["pipeline.*".into()], ..query(org_a) };
    assert_eq!(store.list_events(&family).await.unwrap().len(), 1);
    let after = EventQuery { after_id: Some(stored[0]), limit: 1, ..query(org_a) };
    let first = store.list_events(&after).await.unwrap().remove(0);
    assert_eq!((first.id, &first.details), (stored[1], &json!({"n": 1})), "oldest first");
    let before = EventQuery { before_id: Some(stored[1]), ..query(org_a) };
    assert_eq!(store.list_events(&before).await.unwrap().len(), 1);
    let later = EventQuery { since: Some(now + Duration::hours(1)), ..query(org_a) };
    assert!(store.list_events(&later).await.unwrap().is_empty());

    assert_eq!(store.purge_events(Utc::now() + Duration::seconds(1)).await.unwrap(), 5);
    assert!(store.list_events(&operator).await.unwrap().is_empty());
}

async fn destinations_keep_the_progress_of_kept_uids_and_start_new_ones_at_the_given_event(
    store: Arc<dyn MetadataStore>,
) {
    let org = store.ensure_identity("org-n", "t", "u", false).await.unwrap().org.id;
    assert!(store.notification_destinations(&org).await.unwrap().is_none());
    store.put_notification_destinations(&org, "[1]", &["a".into(), "b".into()], 7).await.unwrap();
    let mut progress = store.notification_progress(&org).await.unwrap();
    assert_eq!(
        progress.iter().map(|p| (p.uid.as_str(), p.delivered_id)).collect::<Vec<_>>(),
        [("a", 7), ("b", 7)]
    );
    progress[0].delivered_id = 20;
    progress[0].failures = 2;
    progress[0].last_error = Some("refused".into());
    store.put_notification_progress(&progress[0]).await.unwrap();
    store.put_notification_destinations(&org, "[2]", &["a".into(), "c".into()], 30).await.unwrap();
    let progress = store.notification_progress(&org).await.unwrap();
    let got: Vec<(&str, i64, i64)> =
        progress.iter().map(|p| (p.uid.as_str(), p.delivered_id, p.failures)).collect();
    assert_eq!(got, [("a", 20, 2), ("c", 30, 0)]);
    assert_eq!(store.notification_destinations(&org).await.unwrap().unwrap().0, "[2]");
    assert_eq!(
        store.all_notification_destinations().await.unwrap(),
        [(org.clone(), "[2]".to_owned())]
    );

    assert!(store.thresholds("pipeline:x").await.unwrap().is_none());
    store.put_thresholds("pipeline:x", Some(r#"{"a":1}"#)).await.unwrap();
    store.put_thresholds("pipeline:x", Some(r#"{"a":2}"#)).await.unwrap();
    assert_eq!(store.thresholds("pipeline:x").await.unwrap().as_deref(), Some(r#"{"a":2}"#));
    assert_eq!(store.all_thresholds().await.unwrap().len(), 1);
    store.put_thresholds("pipeline:x", None).await.unwrap();
    assert!(store.all_thresholds().await.unwrap().is_empty());
}

/// A writer's whole batch (the recorder stores up to 1,000 at a time) goes in one call that
/// spans many statements on SQLite (16 events each) and several on PostgreSQL (400), the last
/// one partial: every event is stored, in order, and a keyed fact repeated across statements is
/// still kept once.
async fn a_burst_spanning_many_statements_is_stored_whole_and_in_order(
    store: Arc<dyn MetadataStore>,
) {
    let org = store.ensure_identity("org-burst", "t", "u", false).await.unwrap().org.id;
    let now = Utc::now();
    let keyed = |n: usize| {
        NewEvent::node(
            now,
            "node.lost",
            Severity::Error,
            "n1",
            format!("{n}"),
            json!({}),
            "k".into(),
        )
    };
    let mut burst: Vec<NewEvent> = (0..1007)
        .map(|n| {
            NewEvent::pipeline(
                now,
                "dead_letters.recorded",
                Severity::Warning,
                &org,
                "p",
                format!("{n}"),
                json!({"count": n}),
            )
        })
        .collect();
    burst.insert(5, keyed(5));
    burst.insert(900, keyed(900));
    let stored = store.insert_events(&burst).await.unwrap();
    assert_eq!(stored.len(), 1008, "all but the repeated keyed fact");
    assert!(stored.windows(2).all(|w| w[0] < w[1]), "ids grow");

    let mut read = Vec::new();
    let mut after = 0;
    loop {
        let query = EventQuery {
            org_id: Some(org.clone()),
            after_id: Some(after),
            limit: 300,
            ..EventQuery::default()
        };
        let page = store.list_events(&query).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.id;
        read.extend(page);
    }
    let messages: Vec<String> = read.iter().map(|e| e.message.clone()).collect();
    let expected: Vec<String> = (0..1007).map(|n| n.to_string()).collect();
    assert_eq!(messages, expected, "every pipeline event, in the order given");
    assert_eq!(read[1006].details, json!({"count": 1006}));
}

on_both_backends!(|s| Arc::new(s) as Arc<dyn MetadataStore>;
    events_are_numbered_in_order_filtered_by_visibility_and_kept_once_per_key,
    a_burst_spanning_many_statements_is_stored_whole_and_in_order,
    destinations_keep_the_progress_of_kept_uids_and_start_new_ones_at_the_given_event,
);
