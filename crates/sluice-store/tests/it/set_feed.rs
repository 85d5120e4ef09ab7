//! The change feed of the Redis set store: what every node's indexes follow.

use std::sync::Arc;
use std::time::Duration;

use sluice_store::{
    DatasetFeedChange, FeedEntry, IdentityStore as _, MetadataStore, SetFeedChange, SetFeedEntry,
};

use crate::conformance::{stored_pipeline, strings};

/// Every entry the feed has after `feed`'s position, until it is quiet for a moment.
async fn drain_all(feed: &mut sluice_store::SetFeed) -> Vec<FeedEntry> {
    let mut all = Vec::new();
    loop {
        let entries = feed.next(Duration::from_millis(200)).await.unwrap();
        if entries.is_empty() {
            return all;
        }
        all.extend(entries);
    }
}

/// [`drain_all`], expecting set entries only.
async fn drain(feed: &mut sluice_store::SetFeed) -> Vec<SetFeedEntry> {
    drain_all(feed)
        .await
        .into_iter()
        .map(|entry| match entry {
            FeedEntry::Set(entry) => entry,
            FeedEntry::Dataset(entry) => panic!("a dataset entry: {entry:?}"),
        })
        .collect()
}

#[tokio::test]
async fn committed_dataset_changes_are_told_on_the_feed_with_their_versions() {
    let fixture = crate::postgres_with_redis(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
    let store = fixture.store;
    let owner = store.ensure_identity("o", "t", "u", false).await.unwrap();
    let mut feed = store.set_feed().await.unwrap().unwrap();
    let at = chrono::Utc::now();
    let dataset = store.create_dataset(&owner.user.id, "wallets", at).await.unwrap().unwrap();
    let id = dataset.id.clone();
    store
        .add_dataset_entries(&owner.user.id, &id, &strings(&["0xb", "0xa", "0xb"]), at)
        .await
        .unwrap();
    store.remove_dataset_entries(&owner.user.id, &id, &strings(&["0xa"]), at).await.unwrap();
    store.delete_dataset(&owner.user.id, &id).await.unwrap();
    let changes: Vec<(u64, DatasetFeedChange)> = drain_all(&mut feed)
        .await
        .into_iter()
        .map(|entry| match entry {
            FeedEntry::Dataset(entry) => {
                assert_eq!(
                    (entry.owner_user_id.as_str(), entry.name.as_str(), entry.seq),
                    (owner.user.id.as_str(), "wallets", dataset.seq)
                );
                (entry.version, entry.change)
            }
            FeedEntry::Set(entry) => panic!("a set entry: {entry:?}"),
        })
        .collect();
    assert_eq!(
        changes,
        [
            (0, DatasetFeedChange::Created),
            (1, DatasetFeedChange::Added(strings(&["0xa", "0xb"]))),
            (2, DatasetFeedChange::Removed(strings(&["0xa"]))),
            (0, DatasetFeedChange::Dropped),
        ]
    );
}

#[tokio::test]
async fn every_change_is_one_entry_with_the_next_version_and_its_values() {
    let fixture = crate::postgres_with_redis(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
    let store = fixture.store;
    let (_, p) = stored_pipeline(store.as_ref()).await;
    let mut feed = fixture.other.set_feed().await.unwrap().expect("a Redis store has a feed");
    assert!(store.set_feed().await.unwrap().is_some());

    store.add_filter_values(&p.id, "f1", &strings(&["0xa", "0xb"])).await.unwrap();
    // A write that changes nothing is an entry too (applying it changes nothing).
    assert_eq!(store.add_filter_values(&p.id, "f1", &strings(&["0xa"])).await.unwrap(), 0);
    store.remove_filter_values(&p.id, "f1", &strings(&["0xa", "0xz"])).await.unwrap();
    store.replace_filter_values(&p.id, "f1", &strings(&["0xc"])).await.unwrap();
    let (set, version) = store.filter_set_version(&p.id, "f1").await.unwrap().unwrap();
    assert_eq!(version, 4);

    let entries = drain(&mut feed).await;
    let changes: Vec<(i64, i64, &SetFeedChange)> =
        entries.iter().map(|e| (e.set_id, e.version, &e.change)).collect();
    assert_eq!(
        changes,
        [
            (set, 1, &SetFeedChange::Added(strings(&["0xa", "0xb"]))),
            (set, 2, &SetFeedChange::Added(strings(&["0xa"]))),
            (set, 3, &SetFeedChange::Removed(strings(&["0xa", "0xz"]))),
            (set, 4, &SetFeedChange::Replaced(strings(&["0xc"]))),
        ]
    );
    assert!(entries.iter().all(|e| e.pipeline_id == p.id && e.transform_uid == "f1"));

    // Emptied: the set is dropped (its version would restart), told as an empty replace.
    store.replace_filter_values(&p.id, "f1", &[]).await.unwrap();
    assert_eq!(store.filter_set_version(&p.id, "f1").await.unwrap(), None);
    let entries = drain(&mut feed).await;
    assert_eq!(entries.len(), 1);
    assert_eq!((entries[0].set_id, entries[0].version), (set, 5));
    assert_eq!(entries[0].change, SetFeedChange::Replaced(vec![]));

    // A replace too large to carry says only that the set changed.
    let many: Vec<String> = (0..100_001).map(|i| format!("0x{i:040x}")).collect();
    store.replace_filter_values(&p.id, "f1", &many).await.unwrap();
    let entries = drain(&mut feed).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].change, SetFeedChange::Reload);
    assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 100_001);

    // Trimming drops what is older than the age given: a reader then sees only newer ones.
    let mut late = fixture.other.set_feed().await.unwrap().unwrap();
    store.add_filter_values(&p.id, "f1", &strings(&["0xold"])).await.unwrap();
    drain(&mut feed).await;
    late.trim(Duration::ZERO).await.unwrap();
    store.add_filter_values(&p.id, "f1", &strings(&["0xnew"])).await.unwrap();
    let seen = drain(&mut late).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].change, SetFeedChange::Added(strings(&["0xnew"])));
    drain(&mut feed).await;

    // A pipeline deleted drops each of its sets.
    store.add_filter_values(&p.id, "f2", &strings(&["0xd"])).await.unwrap();
    assert!(store.delete_pipeline(&p.id).await.unwrap());
    let entries = drain(&mut feed).await;
    let dropped: Vec<&str> = entries
        .iter()
        .filter(|e| e.change == SetFeedChange::Dropped)
        .map(|e| e.transform_uid.as_str())
        .collect();
    assert_eq!(entries.len(), 3, "f2's add, then two drops: {entries:?}");
    assert!(dropped.contains(&"f1") && dropped.contains(&"f2"));
}

#[tokio::test]
async fn a_replace_keeps_the_cursor_of_values_it_keeps_and_lists_new_ones_after() {
    let fixture = crate::postgres_with_redis(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
    let store = fixture.store;
    let (_, p) = stored_pipeline(store.as_ref()).await;
    store.add_filter_values(&p.id, "f1", &strings(&["0xa", "0xb", "0xc"])).await.unwrap();
    let first = store.list_filter_values(&p.id, "f1", None, 1).await.unwrap();
    assert_eq!(first.values, ["0xa"]);
    assert_eq!(
        store
            .replace_filter_values(&p.id, "f1", &strings(&["0xd", "0xc", "0xa", "0xd"]))
            .await
            .unwrap(),
        3
    );
    let rest = store.list_filter_values(&p.id, "f1", first.next, 10).await.unwrap();
    assert_eq!(rest.values, ["0xc", "0xd"], "0xc keeps its place, 0xd lists after it");
}

/// `ping` covers Redis: a store whose Redis stopped is not ready.
#[tokio::test]
async fn ping_fails_when_redis_stops() {
    let mut server = sluice_store::testing::PrivateRedis::start().await;
    let redis = sluice_store::RedisSets::connect(&server.url).await.unwrap();
    let options = sluice_store::testing::fresh_postgres_schema().await;
    let store =
        sluice_store::PgStore::open_with(options).await.unwrap().with_redis_sets(Arc::new(redis));
    store.ping().await.unwrap();
    server.stop();
    let error = store.ping().await.expect_err("Redis is gone");
    assert!(matches!(error, sluice_store::StoreError::Redis(_)), "{error}");
}

/// A store that kept its values in its tables, opened with `--sets` for the first time:
/// every set is copied into Redis in cursor order, once.
#[tokio::test]
async fn sets_in_the_tables_are_copied_to_redis_on_the_first_open_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
    let tables: Arc<dyn MetadataStore> =
        Arc::new(sluice_store::SqliteStore::open(&url).await.unwrap());
    let (_, p) = stored_pipeline(tables.as_ref()).await;
    tables.add_filter_values(&p.id, "f1", &strings(&["0xb", "0xa", "0xc"])).await.unwrap();
    tables.remove_filter_values(&p.id, "f1", &strings(&["0xa"])).await.unwrap();
    tables.add_filter_values(&p.id, "f1", &strings(&["0xd"])).await.unwrap();
    drop(tables);

    let redis = std::env::var("SLUICE_TEST_REDIS_URL")
        .expect("SLUICE_TEST_REDIS_URL must name a Redis server; run scripts/test");
    let sets = format!("{redis}?prefix=t{}", uuid::Uuid::new_v4().simple());
    let store = sluice_store::open_with_sets(&url, Some(&sets)).await.unwrap();
    let listed = crate::conformance::list_all(store.as_ref(), &p.id, "f1", 2).await;
    assert_eq!(listed, ["0xb", "0xc", "0xd"], "copied in cursor order");
    assert!(store.set_feed().await.unwrap().is_some(), "the values are in Redis");
    store.add_filter_values(&p.id, "f1", &strings(&["0xe"])).await.unwrap();
    store.remove_filter_values(&p.id, "f1", &strings(&["0xb"])).await.unwrap();
    drop(store);

    // Opened again: Redis has the set, nothing is copied over it.
    let store = sluice_store::open_with_sets(&url, Some(&sets)).await.unwrap();
    let listed = crate::conformance::list_all(store.as_ref(), &p.id, "f1", 10).await;
    assert_eq!(listed, ["0xc", "0xd", "0xe"]);
    assert!(sluice_store::open_with_sets(&url, Some("http://nope")).await.is_err());
}
