//! The `object_storage` sink through the API against the S3-compatible server `scripts/test`
//! starts (moto, `SLUICE_TEST_S3_URL`): the exact objects of a known input, their names by
//! source offset, a retry that writes the same objects again, an outage (through a proxy
//! the test takes down) that holds the source, and the 422s of a bad sink.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sluice_backfill::storage::{ObjectStorage, Storage};

use crate::external_sinks::Stack;
use crate::pipeline_stack::{SOURCE, settle};
use crate::tcp_proxy::TcpProxy;

const ID_VALUE: &str = "AKIDSLUICETEST";
const KEY_VALUE: &str = "s3cret-never-shown";

/// A new empty bucket: its storage (for the test to read), its name and the endpoint.
async fn bucket() -> (Arc<ObjectStorage>, String, String) {
    let storage = tokio::task::spawn_blocking(|| sluice_backfill::storage::testing::new_bucket(""))
        .await
        .unwrap();
    let location = storage.location("");
    let name = location.trim_start_matches("s3://").split('/').next().unwrap().to_owned();
    let endpoint = std::env::var("SLUICE_TEST_S3_URL").unwrap();
    (Arc::new(storage), name, endpoint)
}

/// Every object under `prefix`, gunzipped when it is JSON lines: key -> text.
async fn objects(storage: &Arc<ObjectStorage>, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let (storage, prefix) = (storage.clone(), prefix.to_owned());
    tokio::task::spawn_blocking(move || {
        storage
            .list(&prefix)
            .unwrap()
            .into_iter()
            .map(|key| {
                let bytes = storage.get(&key).unwrap().unwrap().to_vec();
                let bytes = if key.ends_with(".gz") {
                    let mut text = Vec::new();
                    flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut text).unwrap();
                    text
                } else {
                    bytes
                };
                (key, bytes)
            })
            .collect()
    })
    .await
    .unwrap()
}

/// The objects a pipeline `id` passing odd-numbered records, with files of `max_rows`, must
/// have written from the source as it is now: per partition, the passing records in files
/// of `max_rows`, the first named by offset 0 (where the deployment started), the others by
/// their first record's offset; dated by their first record's append time.
async fn expected(
    stack: &Stack,
    id: &str,
    prefix: &str,
    max_rows: usize,
) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for partition in 0..8 {
        let records = stack.log.read(SOURCE, partition, 0, 100_000).await.unwrap();
        let passing: Vec<_> = records
            .iter()
            .filter(|r| {
                serde_json::from_slice::<Value>(&r.value).unwrap()["n"].as_u64().unwrap() % 2 == 1
            })
            .collect();
        for (index, chunk) in passing.chunks(max_rows).enumerate() {
            let start = if index == 0 { 0 } else { chunk[0].offset };
            let date = chrono::DateTime::from_timestamp_millis(chunk[0].timestamp_ms)
                .unwrap()
                .format("%Y-%m-%d");
            let key = format!(
                "{prefix}/base/erc20_token_transfer/{date}/{id}-{partition}-{start:020}.jsonl.gz"
            );
            let mut text = Vec::new();
            for record in chunk {
                text.extend_from_slice(&record.value);
                text.push(b'\n');
            }
            files.insert(key, text);
        }
    }
    files
}

fn sink(bucket: &str, endpoint: &str, format: &str, max_rows: u64) -> Value {
    json!({"type": "object_storage", "uid": "sk-s3", "name": "lake", "bucket": bucket,
           "prefix": "lake/v1", "endpoint": endpoint, "access_key_id_secret": "S3_ID",
           "secret_access_key_secret": "S3_KEY", "format": format, "max_rows": max_rows,
           "max_seconds": 1})
}

async fn stack_with_secrets() -> Stack {
    let stack = Stack::new().await;
    stack.put_secret("S3_ID", ID_VALUE).await;
    stack.put_secret("S3_KEY", KEY_VALUE).await;
    stack
}

#[tokio::test(flavor = "multi_thread")]
async fn each_partitions_records_land_once_in_files_named_by_the_offset_they_start_at() {
    let (storage, bucket, endpoint) = bucket().await;
    let stack = stack_with_secrets().await;
    let (id, deployed) =
        stack.deployed("at_least_once", sink(&bucket, &endpoint, "jsonl_gzip", 3)).await;
    let connection = &deployed["sinks"][0]["connection"];
    assert_eq!(connection["bucket"], bucket.as_str(), "{deployed}");
    assert_eq!(connection["format"], "jsonl_gzip");
    let text = deployed.to_string();
    assert!(!text.contains(ID_VALUE) && !text.contains(KEY_VALUE), "a credential in {text}");
    stack.ingest(1..=40).await;
    settle(stack.log.as_ref(), &id).await;
    let want = expected(&stack, &id, "lake/v1", 3).await;
    assert!(want.len() > 8, "several files per partition: {:?}", want.keys());
    assert_eq!(objects(&storage, "lake/v1").await, want);
}

#[tokio::test(flavor = "multi_thread")]
async fn commits_that_fail_after_the_write_rewrite_the_same_objects_and_make_no_second() {
    let (storage, bucket, endpoint) = bucket().await;
    let stack = stack_with_secrets().await;
    let (id, _) = stack.deployed("at_least_once", sink(&bucket, &endpoint, "jsonl_gzip", 2)).await;
    // The next commits fail: after a file was written, before its offsets moved (as a
    // crash there would leave it); the batch is tried again.
    stack.faulty.hooks().failures.store(6, Ordering::SeqCst);
    stack.ingest(1..=30).await;
    settle(stack.log.as_ref(), &id).await;
    assert_eq!(stack.faulty.hooks().failures.load(Ordering::SeqCst), 0, "every failure was hit");
    assert_eq!(objects(&storage, "lake/v1").await, expected(&stack, &id, "lake/v1", 2).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn parquet_files_have_the_warehouse_columns() {
    use arrow_array::{Array, Int64Array, StringArray, TimestampMicrosecondArray};
    let (storage, bucket, endpoint) = bucket().await;
    let stack = stack_with_secrets().await;
    let (id, _) = stack.deployed("at_least_once", sink(&bucket, &endpoint, "parquet", 1000)).await;
    stack.ingest(1..=30).await;
    settle(stack.log.as_ref(), &id).await;
    let mut seen = Vec::new();
    for (key, bytes) in objects(&storage, "lake/v1").await {
        assert!(key.ends_with(".parquet"), "{key}");
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            bytes::Bytes::from(bytes),
        )
        .unwrap()
        .build()
        .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let column = |name: &str| batch.column_by_name(name).unwrap().clone();
            let numbers = column("block_number");
            let numbers = numbers.as_any().downcast_ref::<Int64Array>().unwrap();
            let keys = column("_key");
            let keys = keys.as_any().downcast_ref::<StringArray>().unwrap();
            let records = column("_record");
            let records = records.as_any().downcast_ref::<StringArray>().unwrap();
            let times = column("block_timestamp");
            let times = times.as_any().downcast_ref::<TimestampMicrosecondArray>().unwrap();
            for row in 0..batch.num_rows() {
                let record: Value = serde_json::from_str(records.value(row)).unwrap();
                let n = record["n"].as_u64().unwrap();
                assert_eq!(keys.value(row), format!("0x{n:064x}:{}", n % 10));
                assert_eq!(numbers.value(row), 1000 + (n / 10) as i64);
                assert_eq!(times.value(row), 1_795_262_400_000_000, "2026-11-21T12:00:00Z");
                assert!(!numbers.is_null(row));
                seen.push(n);
            }
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, crate::external_sinks::odd(1..=30));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_outage_of_the_storage_holds_the_source_and_then_every_file_is_written() {
    let (storage, bucket, endpoint) = bucket().await;
    let proxy = TcpProxy::start(endpoint.trim_start_matches("http://")).await;
    let stack = stack_with_secrets().await;
    let through = format!("http://{}", proxy.address());
    let (id, _) = stack.deployed("at_least_once", sink(&bucket, &through, "jsonl_gzip", 2)).await;
    proxy.down();
    stack.ingest(1..=20).await;
    let worker = stack.blocked_worker(&id).await;
    assert!(worker["last_error"].as_str().unwrap().contains("lake/v1"), "{worker}");
    let ends: u64 = stack.log.offsets(SOURCE).await.unwrap().iter().map(|r| r.end).sum();
    assert!(stack.committed(&id).await < ends, "the source is held");
    proxy.up().await;
    settle(stack.log.as_ref(), &id).await;
    assert_eq!(objects(&storage, "lake/v1").await, expected(&stack, &id, "lake/v1", 2).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn best_effort_drops_the_files_it_cannot_write_and_goes_on() {
    let (storage, bucket, endpoint) = bucket().await;
    let proxy = TcpProxy::start(endpoint.trim_start_matches("http://")).await;
    let stack = stack_with_secrets().await;
    let through = format!("http://{}", proxy.address());
    let (id, _) = stack.deployed("best_effort", sink(&bucket, &through, "jsonl_gzip", 1)).await;
    proxy.down();
    stack.ingest(1..=20).await;
    settle(stack.log.as_ref(), &id).await;
    let counters = stack.runtime.counters(&id).await.unwrap();
    assert!(sluice_runtime::Counters::get(&counters.dropped) > 0);
    assert!(objects(&storage, "lake/v1").await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_sink_is_a_422_at_its_field_and_a_bucket_that_does_not_answer_one_at_deploy() {
    let (_, bucket, endpoint) = bucket().await;
    let stack = stack_with_secrets().await;
    let create = |sink: Value| Stack::pipeline("at_least_once", sink);
    // A secret the organization does not have.
    let mut missing = sink(&bucket, &endpoint, "parquet", 10);
    missing["secret_access_key_secret"] = json!("NOPE");
    let (status, body) =
        stack.call(Method::POST, "/api/v1/beam", &stack.owner, Some(create(missing))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["detail"][0]["loc"],
        json!(["body", "pipeline_config", "sinks", 0, "secret_access_key_secret"])
    );
    // Fields out of their rules.
    let mut bad = sink("Not_A_Bucket", &endpoint, "csv", 0);
    bad["max_seconds"] = json!(-1);
    let (status, body) =
        stack.call(Method::POST, "/api/v1/beam", &stack.owner, Some(create(bad))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let fields: Vec<&str> =
        body["detail"].as_array().unwrap().iter().map(|d| d["loc"][4].as_str().unwrap()).collect();
    assert_eq!(fields, ["bucket", "format", "max_rows", "max_seconds"], "{body}");
    // A bucket that does not exist, and a server that does not listen: refused at deploy.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    for sink in [
        sink("no-such-bucket-sluice", &endpoint, "parquet", 10),
        sink(&bucket, &format!("http://{closed}"), "parquet", 10),
    ] {
        let (status, created) =
            stack.call(Method::POST, "/api/v1/beam", &stack.owner, Some(create(sink))).await;
        assert_eq!(status, StatusCode::OK, "{created}");
        let id = created["id"].as_str().unwrap();
        let (status, body) = stack
            .call(Method::POST, &format!("/api/v1/beam/{id}/deploy"), &stack.owner, Some(json!({})))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let msg = body["detail"][0]["msg"].as_str().unwrap();
        assert!(msg.contains("cannot be listed"), "{msg}");
        assert!(!msg.contains(KEY_VALUE), "{msg}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redeploy_to_another_sink_writes_the_files_still_open() {
    let (storage, bucket, endpoint) = bucket().await;
    let stack = stack_with_secrets().await;
    let mut open = sink(&bucket, &endpoint, "jsonl_gzip", 1000);
    open["max_seconds"] = json!(3600);
    let (id, _) = stack.deployed("at_least_once", open).await;
    stack.ingest(1..=10).await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let counters = stack.runtime.counters(&id).await.unwrap();
    while sluice_runtime::Counters::get(&counters.sent) < 5 {
        assert!(tokio::time::Instant::now() < deadline, "the sink never took the records");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(objects(&storage, "lake/v1").await.is_empty(), "the files are still open");
    let receiver = crate::external_sinks::Receiver::start().await;
    let hook = json!({"type": "webhook", "uid": "sk-hook", "name": "hook", "url": receiver.url()});
    let mut body = Stack::pipeline("at_least_once", hook);
    let filter = &mut body["pipeline_config"]["transforms"][0];
    filter.as_object_mut().unwrap().remove("set_values");
    let (status, updated) =
        stack.call(Method::PUT, &format!("/api/v1/beam/{id}"), &stack.owner, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    let (status, deployed) = stack
        .call(Method::POST, &format!("/api/v1/beam/{id}/deploy"), &stack.owner, Some(json!({})))
        .await;
    assert_eq!(status, StatusCode::OK, "{deployed}");
    stack.ingest(11..=14).await;
    assert_eq!(crate::external_sinks::distinct(&receiver.wait_for(2).await), vec![11, 13]);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut numbers: Vec<u64> = objects(&storage, "lake/v1")
            .await
            .values()
            .flat_map(|text| {
                String::from_utf8_lossy(text)
                    .lines()
                    .map(|line| serde_json::from_str::<Value>(line).unwrap()["n"].as_u64().unwrap())
                    .collect::<Vec<_>>()
            })
            .collect();
        numbers.sort_unstable();
        if numbers == crate::external_sinks::odd(1..=10) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "open files not written: {numbers:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
