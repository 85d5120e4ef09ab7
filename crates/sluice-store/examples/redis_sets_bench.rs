//! Loading a large filter-value set into the Redis set store (`--sets redis://…`), and what
//! another node does with it: follow the change feed the load writes, and read the whole set
//! when it loads an index. With `--tables`, the same load into the metadata store's own tables
//! (SQLite) in the same run, for the ratio.
//!
//! ```sh
//! redis-server --port 16379 --save "" --appendonly no --daemonize yes
//! cargo run --release -p sluice-store --example redis_sets_bench -- \
//!     --redis redis://127.0.0.1:16379 --values 10000000 --batch 100000 --tables
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_core::catalog::Catalog;
use sluice_core::pipeline::Pipeline;
use sluice_core::pipeline::validate::{BodyMode, validate_pipeline_body};
use sluice_store::{FeedEntry, MetadataStore, RedisSets, SetFeedChange, SqliteStore};

struct Args {
    redis: String,
    values: usize,
    batch: usize,
    tables: bool,
}

fn args() -> Args {
    let mut args = Args { redis: String::new(), values: 10_000_000, batch: 100_000, tables: false };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--redis" => args.redis = it.next().expect("--redis URL"),
            "--values" => args.values = it.next().and_then(|v| v.parse().ok()).expect("--values N"),
            "--batch" => args.batch = it.next().and_then(|v| v.parse().ok()).expect("--batch N"),
            "--tables" => args.tables = true,
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(!args.redis.is_empty(), "--redis redis://host:port is required");
    args
}

/// Distinct address-like values, spread like real ones.
fn values(n: usize) -> Vec<String> {
    (0..n as u64)
        .map(|i| {
            let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i >> 7);
            format!("0x{h:016x}{i:024x}")
        })
        .collect()
}

async fn stored_pipeline(store: &dyn MetadataStore) -> Pipeline {
    let owner = store.ensure_identity("bench", "t", "u", false).await.expect("identity");
    let body = json!({
        "name": "bench", "description": "d",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "log"},
            "transforms": [{"type": "redis_set_filter", "uid": "f1", "filter_expr": "root = this.address"}],
            "sinks": [{"type": "kafka", "name": "out"}]
        }
    });
    let spec = validate_pipeline_body(
        body.as_object().expect("object"),
        &Catalog::default(),
        BodyMode::Create,
    )
    .expect("a valid body")
    .spec;
    let pipeline = Pipeline::new(
        sluice_core::ids::new_id(),
        spec,
        owner.user.id.clone(),
        owner.org.id.clone(),
        chrono::Utc::now(),
    );
    store.insert_pipeline(&pipeline, &owner.team.id, &[]).await.expect("pipeline");
    pipeline
}

/// Loads `values` in batches; answers the seconds taken.
async fn load(store: &dyn MetadataStore, id: &str, values: &[String], batch: usize) -> f64 {
    let started = Instant::now();
    for chunk in values.chunks(batch) {
        store.add_filter_values(id, "f1", chunk).await.expect("values added");
    }
    started.elapsed().as_secs_f64()
}

async fn used_memory(url: &str) -> String {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connection");
    let info: String = redis::cmd("INFO").arg("memory").query_async(&mut conn).await.expect("info");
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory_human:"))
        .unwrap_or("?")
        .trim()
        .to_owned()
}

#[tokio::main]
async fn main() {
    let args = args();
    let values = values(args.values);
    let dir = tempfile::tempdir().expect("temp dir");
    let n = args.values as f64;

    let prefix = format!("bench{}", sluice_core::ids::new_id().replace('-', ""));
    let url = format!("{}?prefix={prefix}", args.redis);
    let sqlite = SqliteStore::open(&format!("sqlite://{}", dir.path().join("r.db").display()))
        .await
        .expect("store");
    let redis = Arc::new(RedisSets::connect(&url).await.expect("redis"));
    let store: Arc<dyn MetadataStore> = Arc::new(sqlite.with_redis_sets(redis.clone()));
    let pipeline = stored_pipeline(store.as_ref()).await;
    let before = used_memory(&args.redis).await;

    // Another node follows the feed while the load runs.
    let mut feed = store.set_feed().await.expect("feed").expect("a Redis store has a feed");
    let follower = tokio::spawn(async move {
        let mut set = sluice_filter::ValueSet::new();
        let mut entries = 0_u64;
        let mut busy = Duration::ZERO;
        loop {
            let read = feed.next(Duration::from_millis(500)).await.expect("feed read");
            if read.is_empty() && entries > 0 {
                return (set.len(), entries, busy);
            }
            let started = Instant::now();
            for entry in read {
                if let FeedEntry::Set(entry) = entry
                    && let SetFeedChange::Added(values) = entry.change
                {
                    values.iter().for_each(|v| {
                        set.insert(v);
                    });
                    entries += 1;
                }
            }
            busy += started.elapsed();
        }
    });

    let secs = load(store.as_ref(), &pipeline.id, &values, args.batch).await;
    println!(
        "redis: {} values in batches of {} in {secs:.2} s: {:.0} values/s (Redis memory {before} -> {})",
        args.values,
        args.batch,
        n / secs,
        used_memory(&args.redis).await
    );
    let (followed, entries, busy) = follower.await.expect("follower");
    println!(
        "feed: another node applied {entries} entries, {followed} values, busy {:.2} s ({:.0} values/s of its time)",
        busy.as_secs_f64(),
        followed as f64 / busy.as_secs_f64().max(1e-9)
    );
    // A second node writes into the loaded set: its first write reads the set whole; after
    // that, each node brings its copy up to date with what the other wrote.
    let other_db = format!("sqlite://{}", dir.path().join("r.db").display());
    let other_redis = Arc::new(RedisSets::connect(&url).await.expect("redis"));
    let other: Arc<dyn MetadataStore> =
        Arc::new(SqliteStore::open(&other_db).await.expect("store").with_redis_sets(other_redis));
    for (i, (node, what)) in [
        (&other, "another node's first write (reads the set whole)"),
        (&store, "the first node's next write (reads what the other wrote)"),
        (&other, "the other node's next write (reads what the first wrote)"),
    ]
    .into_iter()
    .enumerate()
    {
        let started = Instant::now();
        let value = format!("0xwritten{i}");
        assert_eq!(node.add_filter_values(&pipeline.id, "f1", &[value]).await.expect("add"), 1);
        println!("{what}: {:.3} s", started.elapsed().as_secs_f64());
    }

    let started = Instant::now();
    let set = store.filter_value_set(&pipeline.id, "f1").await.expect("set read");
    let read = started.elapsed().as_secs_f64();
    println!(
        "read: a node loads the whole set ({} values) in {read:.2} s: {:.0} values/s",
        set.len(),
        set.len() as f64 / read
    );
    assert_eq!(set.len(), args.values + 3);
    drop(set);
    assert!(store.delete_pipeline(&pipeline.id).await.expect("delete"), "the bench pipeline goes");

    if args.tables {
        let tables: Arc<dyn MetadataStore> = Arc::new(
            SqliteStore::open(&format!("sqlite://{}", dir.path().join("t.db").display()))
                .await
                .expect("store"),
        );
        let pipeline = stored_pipeline(tables.as_ref()).await;
        let table_secs = load(tables.as_ref(), &pipeline.id, &values, args.batch).await;
        println!(
            "tables (SQLite): {} values in batches of {} in {table_secs:.2} s: {:.0} values/s; Redis / tables = {:.2}x",
            args.values,
            args.batch,
            n / table_secs,
            table_secs / secs
        );
    }
}
