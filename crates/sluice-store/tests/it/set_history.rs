//! The set history (docs/set-filter.md, "Set history"): on SQLite, on PostgreSQL, and on
//! PostgreSQL with the values in Redis.

use std::sync::Arc;

use chrono::{DateTime, Duration, TimeZone, Utc};
use sluice_store::{
    ChangeStamp, HistoryPoint, MetadataStore, PastMembership, Reach, SetChangeKind,
};

use crate::conformance::{stored_pipeline, strings};

on_both_backends!(
    |store| Arc::new(store) as Arc<dyn MetadataStore>;
    membership_at_past_times_and_blocks_undoes_the_later_changes,
    changes_page_newest_first_with_exact_counts_and_values,
    pruning_moves_the_horizon_and_older_points_are_refused,
    a_removed_transform_forgets_its_history,
    a_change_of_many_values_is_kept_whole_in_parts,
);

on_redis_sets!(
    |store| Arc::new(store) as Arc<dyn MetadataStore>;
    membership_at_past_times_and_blocks_undoes_the_later_changes,
    changes_page_newest_first_with_exact_counts_and_values,
    a_change_of_many_values_is_kept_whole_in_parts,
);

fn t(minutes: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0).unwrap() + Duration::minutes(minutes)
}

fn stamp(minutes: i64, block: Option<i64>) -> ChangeStamp {
    ChangeStamp { at: t(minutes), position: block }
}

async fn change(
    store: &dyn MetadataStore,
    id: &str,
    kind: SetChangeKind,
    values: &[&str],
    at: ChangeStamp,
) -> u64 {
    store.change_filter_values(id, "f1", &strings(values), kind, at).await.unwrap()
}

async fn was(store: &dyn MetadataStore, id: &str, value: &str, at: HistoryPoint) -> bool {
    match store.was_filter_value(id, "f1", value, at).await.unwrap() {
        PastMembership::Known(member) => member,
        other => panic!("{value} at {at:?}: {other:?}"),
    }
}

/// Three changes: add {a, b, c} at block 100 (minute 10), remove {b} at block 200 (minute
/// 20), replace by {a, d} at block 300 (minute 30).
async fn three_changes(store: &dyn MetadataStore, id: &str) {
    use SetChangeKind::{Add, Remove, Replace};
    assert_eq!(
        change(store, id, Add, &["0xaa", "0xbb", "cc", "0xaa"], stamp(10, Some(100))).await,
        3
    );
    assert_eq!(change(store, id, Remove, &["0xbb", "zz"], stamp(20, Some(200))).await, 1);
    assert_eq!(change(store, id, Replace, &["0xaa", "dd"], stamp(30, Some(300))).await, 2);
}

async fn membership_at_past_times_and_blocks_undoes_the_later_changes(
    store: Arc<dyn MetadataStore>,
) {
    let (_, p) = stored_pipeline(store.as_ref()).await;
    three_changes(store.as_ref(), &p.id).await;
    let s = store.as_ref();
    let time = |minutes| HistoryPoint::Time(t(minutes));
    // (value, before any change, after the add, after the remove, after the replace)
    let expected = [
        ("0xaa", false, true, true, true),
        ("0xbb", false, true, false, false),
        ("cc", false, true, true, false),
        ("dd", false, false, false, true),
        ("zz", false, false, false, false),
    ];
    for (value, before, added, removed, replaced) in expected {
        assert_eq!(was(s, &p.id, value, time(5)).await, before, "{value} at minute 5");
        assert_eq!(was(s, &p.id, value, time(15)).await, added, "{value} at minute 15");
        assert_eq!(was(s, &p.id, value, time(20)).await, removed, "{value} at minute 20");
        assert_eq!(was(s, &p.id, value, time(45)).await, replaced, "{value} at minute 45");
        // A change made at head 100 applies to block 101 on.
        assert_eq!(was(s, &p.id, value, HistoryPoint::Block(100)).await, before, "{value} @100");
        assert_eq!(was(s, &p.id, value, HistoryPoint::Block(101)).await, added, "{value} @101");
        assert_eq!(was(s, &p.id, value, HistoryPoint::Block(250)).await, removed, "{value} @250");
        assert_eq!(was(s, &p.id, value, HistoryPoint::Block(301)).await, replaced, "{value} @301");
        assert_eq!(store.has_filter_value(&p.id, "f1", value).await.unwrap(), replaced);
    }
    // The other set of the pipeline has its own (empty) history.
    let other = store.was_filter_value(&p.id, "f2", "0xaa", time(15)).await.unwrap();
    assert_eq!(other, PastMembership::Known(false));
}

async fn changes_page_newest_first_with_exact_counts_and_values(store: Arc<dyn MetadataStore>) {
    let (_, p) = stored_pipeline(store.as_ref()).await;
    three_changes(store.as_ref(), &p.id).await;
    let first = store.set_changes(&p.id, "f1", None, 2, false).await.unwrap();
    let kinds: Vec<_> =
        first.changes.iter().map(|c| (c.kind, c.given, c.added, c.removed)).collect();
    assert_eq!(kinds, [(SetChangeKind::Replace, 2, 1, 1), (SetChangeKind::Remove, 2, 0, 1)]);
    assert_eq!(first.changes[0].count_after, 2);
    assert_eq!(first.changes[0].changed_at, t(30));
    assert_eq!(first.changes[0].position, Some(300));
    assert!(first.changes[0].values.is_none());
    let second = store.set_changes(&p.id, "f1", first.next, 2, true).await.unwrap();
    assert_eq!(second.next, None);
    assert_eq!(second.changes.len(), 1);
    let add = &second.changes[0];
    assert_eq!((add.kind, add.given, add.added, add.count_after), (SetChangeKind::Add, 4, 3, 3));
    let mut added = add.values.clone().unwrap().added;
    added.sort();
    assert_eq!(added, ["0xaa", "0xbb", "cc"]);
    let with_values = store.set_changes(&p.id, "f1", None, 1, true).await.unwrap();
    let replace = with_values.changes[0].values.clone().unwrap();
    assert_eq!((replace.added, replace.removed), (strings(&["dd"]), strings(&["cc"])));
    // Emptying the set records every value it held as removed.
    let empty = stamp(40, Some(400));
    assert_eq!(change(store.as_ref(), &p.id, SetChangeKind::Replace, &[], empty).await, 0);
    let cleared = store.set_changes(&p.id, "f1", None, 1, true).await.unwrap().changes;
    let mut removed = cleared[0].values.clone().unwrap().removed;
    removed.sort();
    assert_eq!((cleared[0].removed, removed), (2, strings(&["0xaa", "dd"])));
    assert!(was(store.as_ref(), &p.id, "dd", HistoryPoint::Block(399)).await);
    assert!(!was(store.as_ref(), &p.id, "dd", HistoryPoint::Block(401)).await);
}

async fn a_change_of_many_values_is_kept_whole_in_parts(store: Arc<dyn MetadataStore>) {
    let (_, p) = stored_pipeline(store.as_ref()).await;
    let values: Vec<String> = (0..150_000).map(|n| format!("0x{n:040x}")).collect();
    let (kind, last) = (SetChangeKind::Add, values.last().unwrap().clone());
    store.change_filter_values(&p.id, "f1", &values, kind, stamp(10, Some(100))).await.unwrap();
    change(store.as_ref(), &p.id, SetChangeKind::Replace, &["0x00"], stamp(20, Some(200))).await;
    let page = store.set_changes(&p.id, "f1", None, 2, true).await.unwrap();
    let replace = page.changes[0].values.clone().unwrap();
    assert_eq!((replace.added.len(), replace.removed.len()), (1, 150_000));
    assert_eq!(page.changes[1].values.clone().unwrap().added, values);
    assert!(was(store.as_ref(), &p.id, &last, HistoryPoint::Block(150)).await);
    assert!(!was(store.as_ref(), &p.id, &last, HistoryPoint::Block(201)).await);
    assert!(!was(store.as_ref(), &p.id, &last, HistoryPoint::Block(100)).await);
}

async fn pruning_moves_the_horizon_and_older_points_are_refused(store: Arc<dyn MetadataStore>) {
    let (_, p) = stored_pipeline(store.as_ref()).await;
    three_changes(store.as_ref(), &p.id).await;
    // The first two changes are older than the cutoff.
    assert_eq!(store.prune_set_history(t(25)).await.unwrap(), 2);
    let left = store.set_changes(&p.id, "f1", None, 10, false).await.unwrap().changes;
    assert_eq!(left.len(), 1);
    let refused = store.was_filter_value(&p.id, "f1", "0xbb", HistoryPoint::Time(t(15))).await;
    assert_eq!(refused.unwrap(), PastMembership::BeyondHistory(Reach::Time(t(20))));
    let refused = store.was_filter_value(&p.id, "f1", "0xbb", HistoryPoint::Block(200)).await;
    assert_eq!(refused.unwrap(), PastMembership::BeyondHistory(Reach::Block(201)));
    // From the horizon on the answers stay right.
    assert!(was(store.as_ref(), &p.id, "cc", HistoryPoint::Time(t(20))).await);
    assert!(was(store.as_ref(), &p.id, "cc", HistoryPoint::Block(201)).await);
    assert!(!was(store.as_ref(), &p.id, "cc", HistoryPoint::Block(301)).await);
    assert_eq!(store.prune_set_history(t(25)).await.unwrap(), 0);
}

async fn a_removed_transform_forgets_its_history(store: Arc<dyn MetadataStore>) {
    let (_, mut p) = stored_pipeline(store.as_ref()).await;
    three_changes(store.as_ref(), &p.id).await;
    let with_f1 = p.clone();
    p.pipeline_config.transforms.retain(|t| t.uid() != "f1");
    p.updated_at = t(40);
    assert!(store.update_pipeline(&p).await.unwrap());
    let mut back = with_f1;
    back.updated_at = t(41);
    assert!(store.update_pipeline(&back).await.unwrap());
    assert!(store.set_changes(&p.id, "f1", None, 10, false).await.unwrap().changes.is_empty());
    let refused = store.was_filter_value(&p.id, "f1", "0xaa", HistoryPoint::Time(t(35))).await;
    assert_eq!(refused.unwrap(), PastMembership::BeyondHistory(Reach::Time(t(40))));
    assert_eq!(
        store.was_filter_value(&p.id, "f1", "0xaa", HistoryPoint::Time(t(45))).await.unwrap(),
        PastMembership::Known(false)
    );
    // Deleting the pipeline deletes its history with it.
    assert!(store.delete_pipeline(&p.id).await.unwrap());
    assert!(store.set_changes(&p.id, "f1", None, 10, false).await.unwrap().changes.is_empty());
}
