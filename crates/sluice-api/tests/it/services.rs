//! Application services: once started, a change is committed AND told to the in-memory
//! copies, even when its request is dropped (a client hanging up) half way.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::json;
use sluice_api::services::{self, EntriesOp, ValuesChange};
use sluice_api::{AppState, Limits};
use sluice_core::catalog::Catalog;
use sluice_core::clock::Clock;
use sluice_core::datasets::{DatasetChange, DatasetListener, DatasetRef};
use sluice_core::filter_values::{FilterValuesChange, FilterValuesListener};

use crate::harness::{Harness, pipeline_body};

#[derive(Default)]
struct Heard(Mutex<Vec<String>>);

impl FilterValuesListener for Heard {
    fn changed(&self, pipeline_id: &str, uid: &str, change: FilterValuesChange<'_>) {
        self.0.lock().unwrap().push(format!("{pipeline_id}/{uid}: {change:?}"));
    }
}

impl DatasetListener for Heard {
    fn changed(&self, dataset: DatasetRef<'_>, change: DatasetChange<'_>) {
        self.0.lock().unwrap().push(format!("{}: {change:?}", dataset.name));
    }
}

/// Polls `future` once, then drops it: the request of a client that hung up at once.
async fn drop_after_first_poll<T>(future: impl Future<Output = T>) {
    assert!(future.now_or_never().is_none(), "it finished at once");
}

/// Waits until `heard` has `n` entries (the deadline only stops a hung test).
async fn until_heard(heard: &Heard, n: usize) -> Vec<String> {
    for _ in 0..2000 {
        let now = heard.0.lock().unwrap().clone();
        if now.len() >= n {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("heard only {:?}", heard.0.lock().unwrap());
}

#[tokio::test]
async fn a_dropped_change_is_still_committed_and_told_to_the_in_memory_copies() {
    let h = Harness::new().await;
    let ann = h.user("acme", "data", "ann").await;
    let mut body = pipeline_body("p");
    body["pipeline_config"]["transforms"] =
        json!([{"type": "redis_set_filter", "uid": "f1", "filter_expr": "root = this.address"}]);
    body["pipeline_config"]["source"] = json!({"chain": "base", "entity": "log"});
    let id = h.create(&ann, body).await["id"].as_str().unwrap().to_owned();

    let heard = Arc::new(Heard::default());
    let state =
        AppState::new(h.store.clone(), Catalog::default(), h.clock.clone(), Limits::default())
            .with_runtime(h.runtime())
            .with_filter_listener(heard.clone())
            .with_dataset_listener(heard.clone());

    let values = vec!["0xaa".to_owned(), "0xbb".to_owned()];
    let change = services::change_filter_values(
        &state,
        ann.identity.org.id.clone(),
        id.clone(),
        "f1".to_owned(),
        values,
        ValuesChange::Add,
        sluice_core::pipeline::Source {
            source_type: sluice_core::pipeline::SourceType::Pubsub,
            chain: "base".to_owned(),
            entity: "log".to_owned(),
            is_zerolag: false,
        },
    );
    drop_after_first_poll(change).await;
    assert_eq!(until_heard(&heard, 1).await, [format!("{id}/f1: Added([\"0xaa\", \"0xbb\"])")]);
    assert_eq!(h.store.filter_value_count(&id, "f1").await.unwrap(), 2);

    let owner = ann.id().to_owned();
    let created =
        services::create_dataset(&state, owner.clone(), "wallets".to_owned(), h.clock.now());
    drop_after_first_poll(created).await;
    until_heard(&heard, 2).await;
    let dataset = h.store.list_datasets(&owner, &[]).await.unwrap().pop().expect("created");
    let added = services::change_dataset_entries(
        &state,
        dataset,
        vec!["0xcc".to_owned()],
        EntriesOp::Add,
        h.clock.now(),
    );
    drop_after_first_poll(added).await;
    let heard = until_heard(&heard, 3).await;
    assert!(heard[1].starts_with("wallets: Created"), "{heard:?}");
    assert!(heard[2].starts_with("wallets: Added"), "{heard:?}");
}
