//! Poison records among many good ones: each is dead-lettered with its error after its
//! attempts, every other record of its batch is delivered, for both delivery guarantees.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sluice_runtime::Counters;

use crate::pipeline_stack::settle;
use crate::sink_outage::Stack;

/// Throws on every 50th record, returns a non-object for 333 and never returns for 777.
const SCRIPT: &str = "function transform(r) {\n  if (r.n % 50 === 0) throw new Error('poison ' + r.n);\n  if (r.n === 333) return 42;\n  if (r.n === 777) { while (true) {} }\n  return r;\n}";
const RECORDS: u64 = 1000;

fn poisoned(n: u64) -> bool {
    n % 50 == 0 || n == 333 || n == 777
}

async fn poison_is_set_aside(guarantee: &str) {
    let stack = Stack::new().await;
    let id = stack
        .deployed_with(guarantee, json!([{"type": "v8", "uid": "tf-script", "script": SCRIPT}]))
        .await;
    // One ingest request: the poison sits in the same worker batches as good records.
    stack.ingest(1..=RECORDS).await;
    settle(stack.log.as_ref(), &id).await;

    let mut delivered = stack.sink(&id).await;
    delivered.sort_unstable();
    let good: Vec<u64> = (1..=RECORDS).filter(|n| !poisoned(*n)).collect();
    assert_eq!(delivered, good, "every good record exactly once");

    let path = format!("/api/v1/beam/{id}/dead-letters?offset=0&limit=500");
    let (status, page) = stack.call(Method::GET, &path, "", String::new()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "dead letters need a key: {page}");
    let (status, page) = stack.owner_get(&path).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let letters = page["dead_letters"].as_array().unwrap();
    let mut dead: Vec<u64> = letters.iter().map(|d| d["record"]["n"].as_u64().unwrap()).collect();
    dead.sort_unstable();
    let poison: Vec<u64> = (1..=RECORDS).filter(|n| poisoned(*n)).collect();
    assert_eq!(dead, poison);
    for letter in letters {
        let n = letter["record"]["n"].as_u64().unwrap();
        assert_eq!(letter["attempts"], 3, "{letter}");
        assert_eq!(letter["transform_uid"], "tf-script");
        let error = letter["error"].as_str().unwrap();
        let why = match n {
            333 => "object",
            777 => "time budget",
            _ => "poison",
        };
        assert!(error.contains(why), "record {n}: {error}");
    }
    let counters = stack.counters(&id).await;
    assert_eq!(Counters::get(&counters.dead_lettered), poison.len() as u64);
    assert_eq!(Counters::get(&counters.sent), good.len() as u64);
    assert_eq!(Counters::get(&counters.dropped), 0);
    eprintln!(
        "poison records ({guarantee}): {RECORDS} ingested, {} poisoned (throw, non-object, endless \
         loop), {} dead-lettered after 3 attempts each, {} delivered, 0 lost",
        poison.len(),
        dead.len(),
        delivered.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_records_are_dead_lettered_and_the_rest_delivered_at_least_once() {
    poison_is_set_aside("at_least_once").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_records_are_dead_lettered_and_the_rest_delivered_best_effort() {
    poison_is_set_aside("best_effort").await;
}

impl Stack {
    async fn owner_get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, &self.owner, String::new()).await
    }
}
