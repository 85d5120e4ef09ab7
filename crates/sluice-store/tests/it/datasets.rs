//! Datasets and their entries, run on a fresh SQLite file and in a fresh PostgreSQL schema of
//! the server `scripts/test` starts (`SLUICE_TEST_POSTGRES_URL`; the tests fail without it).

use std::sync::Arc;

use chrono::{DateTime, Duration, TimeZone, Utc};
use sluice_store::{EntriesChange, Identity, MetadataStore};

on_both_backends!(
    |store| Arc::new(store) as Arc<dyn MetadataStore>;
    names_are_unique_per_owner_and_lists_are_oldest_first,
    datasets_of_other_users_are_invisible_and_untouched,
    entry_changes_count_what_changed_and_take_the_next_version,
    listing_is_ascending_with_the_last_value_as_cursor_and_an_exact_last_page,
    paging_while_another_task_adds_lists_every_entry_once_in_order,
    bulk_changes_cross_statement_chunks_into_empty_small_and_large_datasets,
    deleting_removes_every_entry_and_a_new_dataset_of_that_name_starts_empty,
    every_dataset_of_every_user_is_listed_for_indexing,
    the_datasets_number_moves_with_every_write_of_a_dataset,
);

async fn the_datasets_number_moves_with_every_write_of_a_dataset(store: Arc<dyn MetadataStore>) {
    let ann = user(store.as_ref(), "ann").await;
    let mut last = store.datasets_seq().await.unwrap();
    let mut moved = async |what: &str| {
        let now = store.datasets_seq().await.unwrap();
        assert!(now > last, "{what} moves the number");
        last = now;
    };
    let d = store.create_dataset(&ann.user.id, "w", at(0)).await.unwrap().unwrap();
    moved("a new dataset").await;
    store.add_dataset_entries(&ann.user.id, &d.id, &strings(&["0xa"]), at(1)).await.unwrap();
    moved("an entry added").await;
    store.remove_dataset_entries(&ann.user.id, &d.id, &strings(&["0xa"]), at(2)).await.unwrap();
    moved("an entry removed").await;
    store.delete_dataset(&ann.user.id, &d.id).await.unwrap();
    moved("a dataset deleted").await;
    // Reads leave it.
    store.all_datasets().await.unwrap();
    assert!(store.create_dataset(&ann.user.id, "w", at(3)).await.unwrap().is_some());
    let after_create = store.datasets_seq().await.unwrap();
    assert!(store.create_dataset(&ann.user.id, "w", at(4)).await.unwrap().is_none());
    assert_eq!(
        store.datasets_seq().await.unwrap(),
        after_create,
        "a refused create writes nothing"
    );
}

fn at(minutes: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap() + Duration::minutes(minutes)
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

async fn user(store: &dyn MetadataStore, name: &str) -> Identity {
    store.ensure_identity("acme", "data", name, false).await.unwrap()
}

async fn all_entries(store: &dyn MetadataStore, owner: &str, id: &str, limit: u32) -> Vec<String> {
    let (mut out, mut after) = (Vec::new(), None::<String>);
    loop {
        let page = store.list_dataset_entries(owner, id, after.as_deref(), limit).await.unwrap();
        let page = page.unwrap();
        out.extend(page.values);
        match page.next {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
}

async fn names_are_unique_per_owner_and_lists_are_oldest_first(store: Arc<dyn MetadataStore>) {
    let ann = user(store.as_ref(), "ann").await.user.id;
    let bob = user(store.as_ref(), "bob").await.user.id;
    let wallets = store.create_dataset(&ann, "wallets", at(0)).await.unwrap().unwrap();
    assert_eq!(
        (wallets.name.as_str(), wallets.owner_user_id.as_str(), wallets.entry_count),
        ("wallets", ann.as_str(), 0)
    );
    assert_eq!((wallets.version, wallets.created_at, wallets.updated_at), (0, at(0), at(0)));
    let tokens = store.create_dataset(&ann, "tokens", at(1)).await.unwrap().unwrap();
    assert!(tokens.seq > wallets.seq, "a later dataset has a greater seq");
    assert_ne!(tokens.id, wallets.id);

    assert_eq!(store.create_dataset(&ann, "wallets", at(2)).await.unwrap(), None);
    // Names are exact: another case is another name.
    assert!(store.create_dataset(&ann, "Wallets", at(3)).await.unwrap().is_some());
    // Another user may use the same name.
    let bobs = store.create_dataset(&bob, "wallets", at(4)).await.unwrap().unwrap();
    assert_ne!(bobs.id, wallets.id);

    let names = |list: Vec<sluice_core::datasets::Dataset>| -> Vec<String> {
        list.into_iter().map(|d| d.name).collect()
    };
    assert_eq!(
        names(store.list_datasets(&ann, &[]).await.unwrap()),
        ["wallets", "tokens", "Wallets"]
    );
    assert_eq!(
        names(store.list_datasets(&ann, &strings(&["tokens", "wallets", "nope"])).await.unwrap()),
        ["wallets", "tokens"]
    );
    assert_eq!(names(store.list_datasets(&bob, &[]).await.unwrap()), ["wallets"]);
    assert_eq!(store.dataset(&ann, &wallets.id).await.unwrap(), Some(wallets.clone()));
    assert_eq!(store.dataset_by_name(&ann, "wallets").await.unwrap(), Some(wallets));
    assert_eq!(store.dataset_by_name(&ann, "nope").await.unwrap(), None);
}

async fn datasets_of_other_users_are_invisible_and_untouched(store: Arc<dyn MetadataStore>) {
    let ann = user(store.as_ref(), "ann").await.user.id;
    let bob = user(store.as_ref(), "bob").await.user.id;
    let d = store.create_dataset(&ann, "wallets", at(0)).await.unwrap().unwrap();
    store.add_dataset_entries(&ann, &d.id, &strings(&["0xa"]), at(1)).await.unwrap().unwrap();

    assert_eq!(store.dataset(&bob, &d.id).await.unwrap(), None);
    assert_eq!(store.dataset_by_name(&bob, "wallets").await.unwrap(), None);
    assert_eq!(store.list_datasets(&bob, &[]).await.unwrap(), []);
    let more = strings(&["0xb"]);
    assert_eq!(store.add_dataset_entries(&bob, &d.id, &more, at(2)).await.unwrap(), None);
    let gone = strings(&["0xa"]);
    assert_eq!(store.remove_dataset_entries(&bob, &d.id, &gone, at(2)).await.unwrap(), None);
    assert_eq!(store.list_dataset_entries(&bob, &d.id, None, 10).await.unwrap(), None);
    assert_eq!(store.has_dataset_entry(&bob, &d.id, "0xa").await.unwrap(), None);
    assert_eq!(store.delete_dataset(&bob, &d.id).await.unwrap(), None);

    let after = store.dataset(&ann, &d.id).await.unwrap().unwrap();
    assert_eq!((after.entry_count, after.version, after.updated_at), (1, 1, at(1)));
    assert_eq!(all_entries(store.as_ref(), &ann, &d.id, 10).await, ["0xa"]);
    assert_eq!(store.has_dataset_entry(&ann, "no-such-id", "0xa").await.unwrap(), None);
}

async fn entry_changes_count_what_changed_and_take_the_next_version(store: Arc<dyn MetadataStore>) {
    let ann = user(store.as_ref(), "ann").await.user.id;
    let d = store.create_dataset(&ann, "wallets", at(0)).await.unwrap().unwrap();
    let id = d.id.as_str();

    let added = store.add_dataset_entries(&ann, id, &strings(&["x", "y", "y"]), at(1)).await;
    assert_eq!(added.unwrap(), Some(EntriesChange { count: 2, version: 1 }));
    let added = store.add_dataset_entries(&ann, id, &strings(&["y", "z"]), at(2)).await;
    assert_eq!(added.unwrap(), Some(EntriesChange { count: 1, version: 2 }));
    // Nothing new: the version still moves on, `updated_at` does not.
    let added = store.add_dataset_entries(&ann, id, &strings(&["x"]), at(3)).await;
    assert_eq!(added.unwrap(), Some(EntriesChange { count: 0, version: 3 }));
    let stored = store.dataset(&ann, id).await.unwrap().unwrap();
    assert_eq!((stored.entry_count, stored.version, stored.updated_at), (3, 3, at(2)));
    assert_eq!(stored.created_at, at(0));

    assert_eq!(store.has_dataset_entry(&ann, id, "y").await.unwrap(), Some(true));
    assert_eq!(store.has_dataset_entry(&ann, id, "w").await.unwrap(), Some(false));
    // Values are stored exactly as given (the API lowercases them first).
    assert_eq!(store.has_dataset_entry(&ann, id, "Y").await.unwrap(), Some(false));

    let removed = store.remove_dataset_entries(&ann, id, &strings(&["x", "w", "x"]), at(4)).await;
    assert_eq!(removed.unwrap(), Some(EntriesChange { count: 1, version: 4 }));
    let removed = store.remove_dataset_entries(&ann, id, &strings(&["w"]), at(5)).await;
    assert_eq!(removed.unwrap(), Some(EntriesChange { count: 0, version: 5 }));
    let stored = store.dataset(&ann, id).await.unwrap().unwrap();
    assert_eq!((stored.entry_count, stored.version, stored.updated_at), (2, 5, at(4)));
    assert_eq!(all_entries(store.as_ref(), &ann, id, 10).await, ["y", "z"]);
    let empty = store.add_dataset_entries(&ann, id, &[], at(6)).await.unwrap();
    assert_eq!(empty, Some(EntriesChange { count: 0, version: 6 }));
}

async fn listing_is_ascending_with_the_last_value_as_cursor_and_an_exact_last_page(
    store: Arc<dyn MetadataStore>,
) {
    let ann = user(store.as_ref(), "ann").await.user.id;
    let d = store.create_dataset(&ann, "tokens", at(0)).await.unwrap().unwrap();
    // Bytewise order: digits, upper case (stored only if given), lower case, then non-ASCII.
    let values = strings(&["b", "a", "ä", "0x10", "0x0f", "B", "", "ab"]);
    store.add_dataset_entries(&ann, &d.id, &values, at(1)).await.unwrap().unwrap();

    let first = store.list_dataset_entries(&ann, &d.id, None, 3).await.unwrap().unwrap();
    assert_eq!(first.values, ["", "0x0f", "0x10"]);
    assert_eq!(first.next.as_deref(), Some("0x10"));
    assert_eq!(first.total_count, 8);
    let second = store.list_dataset_entries(&ann, &d.id, Some("0x10"), 5).await.unwrap().unwrap();
    assert_eq!(second.values, ["B", "a", "ab", "b", "ä"]);
    assert_eq!(second.next, None, "a page that ends exactly at the last entry has no cursor");
    // A cursor need not be an entry: it is a position in the order.
    let from = store.list_dataset_entries(&ann, &d.id, Some("aa"), 2).await.unwrap().unwrap();
    assert_eq!((from.values, from.next.as_deref()), (strings(&["ab", "b"]), Some("b")));
    let past = store.list_dataset_entries(&ann, &d.id, Some("zzz"), 2).await.unwrap().unwrap();
    assert_eq!((past.values.len(), past.next), (1, None));
    assert_eq!(past.values, ["ä"]);
    let empty = store.create_dataset(&ann, "empty", at(2)).await.unwrap().unwrap();
    let page = store.list_dataset_entries(&ann, &empty.id, None, 10).await.unwrap().unwrap();
    assert_eq!(page, sluice_store::EntryPage::default());
}

async fn paging_while_another_task_adds_lists_every_entry_once_in_order(
    store: Arc<dyn MetadataStore>,
) {
    let ann = user(store.as_ref(), "ann").await.user.id;
    let d = store.create_dataset(&ann, "wallets", at(0)).await.unwrap().unwrap();
    let initial: Vec<String> = (0..600).map(|i| format!("0x{:04x}", i * 2)).collect();
    store.add_dataset_entries(&ann, &d.id, &initial, at(1)).await.unwrap().unwrap();

    let writer = {
        let (store, ann, id) = (store.clone(), ann.clone(), d.id.clone());
        tokio::spawn(async move {
            for batch in 0..20 {
                // Odd values interleave with the initial ones, before and after any cursor.
                let values: Vec<String> =
                    (0..30).map(|i| format!("0x{:04x}", (batch * 30 + i) * 2 + 1)).collect();
                store.add_dataset_entries(&ann, &id, &values, at(2)).await.unwrap().unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list_dataset_entries(&ann, &d.id, after.as_deref(), 25).await.unwrap();
        let page = page.unwrap();
        seen.extend(page.values);
        tokio::task::yield_now().await;
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    writer.await.unwrap();

    assert!(seen.windows(2).all(|w| w[0] < w[1]), "ascending, and nothing repeats");
    for value in &initial {
        assert!(seen.binary_search(value).is_ok(), "{value} present throughout was skipped");
    }
    let everything = all_entries(store.as_ref(), &ann, &d.id, 1000).await;
    assert_eq!(everything.len(), 1200);
    assert!(seen.iter().all(|v| everything.binary_search(v).is_ok()));
}

async fn bulk_changes_cross_statement_chunks_into_empty_small_and_large_datasets(
    store: Arc<dyn MetadataStore>,
) {
    let ann = user(store.as_ref(), "ann").await.user.id;
    let d = store.create_dataset(&ann, "big", at(0)).await.unwrap().unwrap();
    let value = |n: u64| format!("0x{:040x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    // Into an empty dataset, then one no larger than the request (read, then insert what is
    // missing), then one larger than the request (a probe per value); each overlaps the last.
    let first: Vec<String> = (0..120_000).map(value).collect();
    let second: Vec<String> = (100_000..230_000).map(value).collect();
    let third: Vec<String> = (220_000..240_000).map(value).collect();
    let change = |values: &[String]| {
        let (store, ann, id) = (store.clone(), ann.clone(), d.id.clone());
        let values = values.to_vec();
        async move { store.add_dataset_entries(&ann, &id, &values, at(1)).await.unwrap().unwrap() }
    };
    assert_eq!(change(&first).await.count, 120_000);
    assert_eq!(change(&second).await.count, 110_000);
    assert_eq!(change(&third).await.count, 10_000);
    let stored = store.dataset(&ann, &d.id).await.unwrap().unwrap();
    assert_eq!(stored.entry_count, 240_000);
    let listed = all_entries(store.as_ref(), &ann, &d.id, 100_000).await;
    let mut expected: Vec<String> = (0..240_000).map(value).collect();
    expected.sort();
    assert_eq!(listed, expected);

    let gone: Vec<String> = (0..130_000).map(|n| value(n * 2)).collect();
    let removed = store.remove_dataset_entries(&ann, &d.id, &gone, at(2)).await.unwrap().unwrap();
    assert_eq!(removed.count, 120_000, "even values below 240,000 were there");
    let stored = store.dataset(&ann, &d.id).await.unwrap().unwrap();
    assert_eq!(stored.entry_count, 120_000);
    assert_eq!(store.has_dataset_entry(&ann, &d.id, &value(2)).await.unwrap(), Some(false));
    assert_eq!(store.has_dataset_entry(&ann, &d.id, &value(3)).await.unwrap(), Some(true));
}

async fn deleting_removes_every_entry_and_a_new_dataset_of_that_name_starts_empty(
    store: Arc<dyn MetadataStore>,
) {
    let ann = user(store.as_ref(), "ann").await.user.id;
    let d = store.create_dataset(&ann, "wallets", at(0)).await.unwrap().unwrap();
    let other = store.create_dataset(&ann, "tokens", at(0)).await.unwrap().unwrap();
    store.add_dataset_entries(&ann, &d.id, &strings(&["a", "b"]), at(1)).await.unwrap();
    store.add_dataset_entries(&ann, &other.id, &strings(&["a"]), at(1)).await.unwrap();

    let deleted = store.delete_dataset(&ann, &d.id).await.unwrap().unwrap();
    assert_eq!((deleted.id.as_str(), deleted.entry_count), (d.id.as_str(), 2));
    assert_eq!(store.delete_dataset(&ann, &d.id).await.unwrap(), None);
    assert_eq!(store.dataset(&ann, &d.id).await.unwrap(), None);
    assert_eq!(store.list_dataset_entries(&ann, &d.id, None, 10).await.unwrap(), None);

    let again = store.create_dataset(&ann, "wallets", at(2)).await.unwrap().unwrap();
    assert!(again.seq > d.seq && again.id != d.id);
    assert_eq!((again.entry_count, again.version), (0, 0));
    assert_eq!(all_entries(store.as_ref(), &ann, &again.id, 10).await, Vec::<String>::new());
    assert_eq!(store.has_dataset_entry(&ann, &again.id, "a").await.unwrap(), Some(false));
    assert_eq!(all_entries(store.as_ref(), &ann, &other.id, 10).await, ["a"], "others keep theirs");
}

async fn every_dataset_of_every_user_is_listed_for_indexing(store: Arc<dyn MetadataStore>) {
    let ann = user(store.as_ref(), "ann").await.user.id;
    let bob = user(store.as_ref(), "bob").await.user.id;
    let a = store.create_dataset(&ann, "w", at(0)).await.unwrap().unwrap();
    let b = store.create_dataset(&bob, "w", at(1)).await.unwrap().unwrap();
    store.add_dataset_entries(&bob, &b.id, &strings(&["v"]), at(2)).await.unwrap();
    let all = store.all_datasets().await.unwrap();
    let seen: Vec<(&str, &str, u64, u64)> = all
        .iter()
        .map(|d| (d.id.as_str(), d.owner_user_id.as_str(), d.entry_count, d.version))
        .collect();
    assert_eq!(seen, [(a.id.as_str(), ann.as_str(), 0, 0), (b.id.as_str(), bob.as_str(), 1, 1)]);
}
