//! The Redis set store's log (`redis_sets.rs`): removed values, values added again, and the
//! compaction that drops what removals left behind, as two processes see them.

use std::sync::Arc;

use sluice_store::MetadataStore;

use crate::conformance::{list_all, stored_pipeline, strings};

/// Whether key `{prefix}:set:{set}:{part}` exists in the fixture's Redis.
async fn exists(url: &str, set: i64, part: &str) -> bool {
    let (url, prefix) = url.split_once("?prefix=").expect("the fixture's URL names a prefix");
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let n: u64 = redis::cmd("EXISTS")
        .arg(format!("{prefix}:set:{set}:{part}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    n == 1
}

#[tokio::test]
async fn removed_values_list_no_more_and_a_value_added_again_lists_at_its_new_place() {
    let fixture = crate::postgres_with_redis(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
    let (a, b) = (fixture.store, fixture.other);
    let (_, p) = stored_pipeline(a.as_ref()).await;
    a.add_filter_values(&p.id, "f1", &strings(&["0xa", "0xb", "0xc", "0xd"])).await.unwrap();
    let first = b.list_filter_values(&p.id, "f1", None, 1).await.unwrap();
    assert_eq!(first.values, ["0xa"]);
    assert!(b.has_filter_value(&p.id, "f1", "0xc").await.unwrap(), "b holds a copy now");

    assert_eq!(a.remove_filter_values(&p.id, "f1", &strings(&["0xb", "0xa"])).await.unwrap(), 2);
    assert_eq!(a.add_filter_values(&p.id, "f1", &strings(&["0xb"])).await.unwrap(), 1);
    assert_eq!(b.remove_filter_values(&p.id, "f1", &strings(&["0xc", "0xc"])).await.unwrap(), 1);
    assert_eq!(b.add_filter_values(&p.id, "f1", &strings(&["0xc", "0xb"])).await.unwrap(), 1);
    assert_eq!(a.remove_filter_values(&p.id, "f1", &strings(&["0xc"])).await.unwrap(), 1);

    for store in [&a, &b] {
        // One value a page: the dead entries of 0xa, 0xb and 0xc lie between the pages.
        assert_eq!(list_all(store.as_ref(), &p.id, "f1", 1).await, ["0xd", "0xb"]);
        assert_eq!(list_all(store.as_ref(), &p.id, "f1", 100).await, ["0xd", "0xb"]);
        assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 2);
        for (value, member) in [("0xa", false), ("0xb", true), ("0xc", false), ("0xd", true)] {
            assert_eq!(
                store.has_filter_value(&p.id, "f1", value).await.unwrap(),
                member,
                "{value}"
            );
        }
        let set = store.filter_value_set(&p.id, "f1").await.unwrap();
        assert_eq!(set.len(), 2);
        assert!(set.contains("0xb") && set.contains("0xd"));
    }
    // The cursor of a value removed since still pages on from its place.
    let rest = a.list_filter_values(&p.id, "f1", first.next, 10).await.unwrap();
    assert_eq!((rest.values, rest.next), (strings(&["0xd", "0xb"]), None));
}

#[tokio::test]
async fn a_log_mostly_removed_is_compacted_and_every_copy_reads_it_again() {
    let fixture = crate::postgres_with_redis(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
    let url = fixture.redis_url.clone().expect("a Redis fixture");
    let (a, b) = (fixture.store, fixture.other);
    let (_, p) = stored_pipeline(a.as_ref()).await;
    let values: Vec<String> = (0..140_000).map(|i| format!("0x{i:040x}")).collect();
    assert_eq!(a.add_filter_values(&p.id, "f1", &values).await.unwrap(), 140_000);
    let (set, _) = a.filter_set_version(&p.id, "f1").await.unwrap().unwrap();
    assert!(b.has_filter_value(&p.id, "f1", &values[1]).await.unwrap(), "b holds a copy now");
    let first = b.list_filter_values(&p.id, "f1", None, 7).await.unwrap();

    // Fewer removals than half the set plus the slack leave the log as it is.
    let few: Vec<String> = values.iter().skip(1).step_by(7).cloned().collect();
    assert_eq!(a.remove_filter_values(&p.id, "f1", &few).await.unwrap(), 20_000);
    assert!(exists(&url, set, "removed").await, "not compacted yet");
    // Then most of the set goes, and the log is written anew.
    let rest: Vec<String> =
        values.iter().enumerate().filter(|(i, _)| i % 7 > 1).map(|(_, v)| v.clone()).collect();
    assert_eq!(a.remove_filter_values(&p.id, "f1", &rest).await.unwrap(), 100_000);
    assert!(!exists(&url, set, "removed").await, "compacted: no removals are left to check");

    let kept: Vec<String> = values.iter().step_by(7).cloned().collect();
    for store in [&b, &a] {
        assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 20_000);
        assert_eq!(list_all(store.as_ref(), &p.id, "f1", 1_000).await, kept);
        assert!(!store.has_filter_value(&p.id, "f1", &values[1]).await.unwrap());
        assert!(store.has_filter_value(&p.id, "f1", &values[7]).await.unwrap());
    }
    // A cursor taken before the compaction pages on from the same place.
    let after = b.list_filter_values(&p.id, "f1", first.next, 2).await.unwrap();
    assert_eq!(after.values, [values[7].clone(), values[14].clone()]);
    // Writes go on from both copies; a value removed before lists after the others.
    assert_eq!(b.add_filter_values(&p.id, "f1", &strings(&[&values[1]])).await.unwrap(), 1);
    assert_eq!(a.add_filter_values(&p.id, "f1", &strings(&[&values[1]])).await.unwrap(), 0);
    let listed = list_all(a.as_ref(), &p.id, "f1", 10_000).await;
    assert_eq!(listed.len(), 20_001);
    assert_eq!(listed.last(), Some(&values[1]));
}

/// Sets an earlier build kept in Redis (a sorted set of values scored by seq, beside a seq
/// counter) are moved into logs when a store opens: values, order, cursors and versions kept.
#[tokio::test]
async fn sets_kept_as_sorted_sets_by_an_earlier_build_are_moved_into_logs() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("sluice.db").display());
    let redis = std::env::var("SLUICE_TEST_REDIS_URL")
        .expect("SLUICE_TEST_REDIS_URL must name a Redis server; run scripts/test");
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let sets = format!("{redis}?prefix={prefix}");
    let store = sluice_store::open_with_sets(&db, Some(&sets)).await.unwrap();
    let (_, p) = stored_pipeline(store.as_ref()).await;
    store.add_filter_values(&p.id, "f1", &strings(&["0xz"])).await.unwrap();
    let (set, _) = store.filter_set_version(&p.id, "f1").await.unwrap().unwrap();
    drop(store);

    // What the earlier build left: values 0xb, 0xa, 0xc at seqs 2, 5, 9 (0xd was removed,
    // its seq 7 gone with it), the counter at 10 and the set at version 6.
    let client = redis::Client::open(redis.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("{prefix}:set:{set}");
    let () = redis::pipe()
        .cmd("DEL")
        .arg(format!("{key}:log"))
        .arg(format!("{key}:mark"))
        .arg(format!("{key}:count"))
        .arg(format!("{key}:generation"))
        .ignore()
        .cmd("ZADD")
        .arg(&key)
        .arg(2)
        .arg("0xb")
        .arg(5)
        .arg("0xa")
        .arg(9)
        .arg("0xc")
        .ignore()
        .cmd("SET")
        .arg(format!("{key}:seq"))
        .arg(10)
        .ignore()
        .cmd("SET")
        .arg(format!("{key}:version"))
        .arg(6)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();

    let store = sluice_store::open_with_sets(&db, Some(&sets)).await.unwrap();
    assert_eq!(list_all(store.as_ref(), &p.id, "f1", 1).await, ["0xb", "0xa", "0xc"]);
    let page = store.list_filter_values(&p.id, "f1", Some(2), 1).await.unwrap();
    assert_eq!((page.values, page.next), (strings(&["0xa"]), Some(5)), "cursors are the seqs");
    assert_eq!(store.filter_set_version(&p.id, "f1").await.unwrap(), Some((set, 6)));
    assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 3);
    assert!(store.has_filter_value(&p.id, "f1", "0xa").await.unwrap());
    assert_eq!(store.add_filter_values(&p.id, "f1", &strings(&["0xd", "0xa"])).await.unwrap(), 1);
    assert_eq!(list_all(store.as_ref(), &p.id, "f1", 10).await, ["0xb", "0xa", "0xc", "0xd"]);
    let exists: u64 = redis::cmd("EXISTS").arg(&key).query_async(&mut conn).await.unwrap();
    assert_eq!(exists, 0, "the sorted set is gone");
    drop(store);
    // Opened again: nothing left to move, nothing changed.
    let again = sluice_store::open_with_sets(&db, Some(&sets)).await.unwrap();
    assert_eq!(list_all(again.as_ref(), &p.id, "f1", 10).await, ["0xb", "0xa", "0xc", "0xd"]);
}

/// Deletes every key under the fixture's prefix: what a Redis restarted without persistence
/// (or evicting keys) leaves of the sets.
async fn forget_everything(url: &str) {
    let (url, prefix) = url.split_once("?prefix=").expect("the fixture's URL names a prefix");
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> =
        redis::cmd("KEYS").arg(format!("{prefix}:*")).query_async(&mut conn).await.unwrap();
    assert!(!keys.is_empty(), "the sets had keys");
    let () = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await.unwrap();
}

fn sorted(mut values: Vec<String>) -> Vec<String> {
    values.sort();
    values
}

fn sorted_set(set: &sluice_filter::ValueSet) -> Vec<String> {
    sorted(set.values().collect())
}

#[tokio::test]
async fn a_set_redis_lost_is_rebuilt_from_its_history_under_a_new_id() {
    let fixture = crate::postgres_with_redis(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
    let url = fixture.redis_url.clone().expect("a Redis fixture");
    let (a, b) = (fixture.store, fixture.other);
    let (_, p) = stored_pipeline(a.as_ref()).await;
    let v = |i: usize| format!("0x{i:040x}");
    let range = |from: usize, to: usize| (from..to).map(v).collect::<Vec<String>>();
    // Adds, removals and a replace, through both stores; the history records each.
    a.add_filter_values(&p.id, "f1", &range(0, 1_000)).await.unwrap();
    a.remove_filter_values(&p.id, "f1", &range(0, 100)).await.unwrap();
    b.add_filter_values(&p.id, "f1", &range(1_000, 1_100)).await.unwrap();
    b.replace_filter_values(&p.id, "f1", &range(50, 1_200)).await.unwrap();
    a.remove_filter_values(&p.id, "f1", &range(60, 70)).await.unwrap();
    let mut expected: Vec<String> = range(50, 60);
    expected.extend(range(70, 1_200));
    let (lost, _) = a.filter_set_version(&p.id, "f1").await.unwrap().unwrap();
    assert!(b.has_filter_value(&p.id, "f1", &v(75)).await.unwrap(), "b holds a copy");

    forget_everything(&url).await;

    // The first reader restores it: its values, under a new id (every index reads it anew).
    let (restored, version) = b.filter_set_version(&p.id, "f1").await.unwrap().unwrap();
    assert_ne!(restored, lost, "a new id");
    assert!(version >= 1);
    assert_eq!(a.filter_set_version(&p.id, "f1").await.unwrap(), Some((restored, version)));
    assert_eq!(sorted_set(&a.filter_value_set(&p.id, "f1").await.unwrap()), expected);
    assert_eq!(b.filter_value_count(&p.id, "f1").await.unwrap(), expected.len() as u64);
    assert_eq!(sorted(list_all(a.as_ref(), &p.id, "f1", 500).await), expected);
    assert!(b.has_filter_value(&p.id, "f1", &v(75)).await.unwrap());
    assert!(!b.has_filter_value(&p.id, "f1", &v(65)).await.unwrap());
    // Writes go on from both stores, the copy b held of the lost set not used.
    assert_eq!(b.add_filter_values(&p.id, "f1", &range(65, 66)).await.unwrap(), 1);
    assert_eq!(a.remove_filter_values(&p.id, "f1", &range(1_100, 1_200)).await.unwrap(), 100);
    let mut now: Vec<String> = range(50, 60);
    now.extend(range(65, 66));
    now.extend(range(70, 1_100));
    let now = sorted(now);
    for store in [&a, &b] {
        assert_eq!(sorted_set(&store.filter_value_set(&p.id, "f1").await.unwrap()), now);
    }

    // Lost again: the history from the set's first write still rebuilds it.
    forget_everything(&url).await;
    assert_eq!(sorted(list_all(b.as_ref(), &p.id, "f1", 500).await), now);
}

#[tokio::test]
async fn a_lost_set_its_history_cannot_rebuild_is_unavailable_until_a_replace() {
    let fixture = crate::postgres_with_redis(|s| Arc::new(s) as Arc<dyn MetadataStore>).await;
    let url = fixture.redis_url.clone().expect("a Redis fixture");
    let (a, b) = (fixture.store, fixture.other);
    let (_, p) = stored_pipeline(a.as_ref()).await;
    a.add_filter_values(&p.id, "f1", &strings(&["0xa", "0xb"])).await.unwrap();
    let (lost, _) = a.filter_set_version(&p.id, "f1").await.unwrap().unwrap();
    // The change that made the set is pruned; one after it stays.
    let pruned = a.prune_set_history(chrono::Utc::now() + chrono::Duration::seconds(1)).await;
    assert_eq!(pruned.unwrap(), 1);
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    a.add_filter_values(&p.id, "f1", &strings(&["0xc"])).await.unwrap();

    forget_everything(&url).await;

    let is_lost = |result: Result<_, sluice_store::StoreError>| match result {
        Err(error @ sluice_store::StoreError::SetLost { .. }) => {
            assert!(error.is_unavailable(), "a 503");
            assert!(error.to_string().contains("held 3 values"), "{error}");
        }
        other => panic!("not a lost set: {other:?}"),
    };
    is_lost(b.filter_value_set(&p.id, "f1").await.map(|_| ()));
    is_lost(a.filter_set_version(&p.id, "f1").await.map(|_| ()));
    is_lost(b.add_filter_values(&p.id, "f1", &strings(&["0xd"])).await.map(|_| ()));
    is_lost(a.remove_filter_values(&p.id, "f1", &strings(&["0xa"])).await.map(|_| ()));
    is_lost(a.has_filter_value(&p.id, "f1", "0xa").await.map(|_| ()));

    // A replace gives the set its values again, under a new id.
    assert_eq!(b.replace_filter_values(&p.id, "f1", &strings(&["0xa", "0xe"])).await.unwrap(), 2);
    let (restored, _) = a.filter_set_version(&p.id, "f1").await.unwrap().unwrap();
    assert_ne!(restored, lost);
    assert_eq!(sorted_set(&a.filter_value_set(&p.id, "f1").await.unwrap()), ["0xa", "0xe"]);
    assert!(b.has_filter_value(&p.id, "f1", "0xe").await.unwrap());
    assert_eq!(a.add_filter_values(&p.id, "f1", &strings(&["0xf"])).await.unwrap(), 1);
}

#[tokio::test]
async fn a_store_reads_and_writes_again_at_once_after_redis_dropped_its_connection() {
    // Redis restarting or a cut connection, as the store's connection sees it: the server
    // closes it. The connection belongs to a Redis user of its own, so closing its
    // connections touches no other test's.
    let base = std::env::var("SLUICE_TEST_REDIS_URL")
        .expect("SLUICE_TEST_REDIS_URL must name a Redis server; run scripts/test");
    let user = format!("t{}", uuid::Uuid::new_v4().simple());
    let mut admin = redis::Client::open(base.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", &user, "on", "nopass", "~*", "&*", "+@all"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let address = base.strip_prefix("redis://").expect("a redis:// URL");
    let url = format!("redis://{user}:unused@{address}?prefix={user}");
    let sets = Arc::new(sluice_store::RedisSets::connect(&url).await.unwrap());
    let options = sluice_store::testing::fresh_postgres_schema().await;
    let store: Arc<dyn MetadataStore> =
        Arc::new(sluice_store::PgStore::open_with(options).await.unwrap().with_redis_sets(sets));
    let (_, p) = stored_pipeline(store.as_ref()).await;
    store.add_filter_values(&p.id, "f1", &strings(&["0xa", "0xb"])).await.unwrap();

    let cut = |mut admin: redis::aio::MultiplexedConnection| {
        let user = user.clone();
        async move {
            let killed: u64 = redis::cmd("CLIENT")
                .arg(&["KILL", "USER", &user])
                .query_async(&mut admin)
                .await
                .unwrap();
            assert!(killed >= 1, "the store holds a connection");
        }
    };
    cut(admin.clone()).await;
    let page = store.list_filter_values(&p.id, "f1", None, 10).await;
    assert_eq!(page.expect("a read right after the cut").values, ["0xa", "0xb"]);
    cut(admin.clone()).await;
    let added = store.add_filter_values(&p.id, "f1", &strings(&["0xc"])).await;
    assert_eq!(added.expect("a write right after the cut"), 1);
    assert_eq!(store.filter_value_count(&p.id, "f1").await.unwrap(), 3);
    let () = redis::cmd("ACL").arg(&["DELUSER", &user]).query_async(&mut admin).await.unwrap();
}
