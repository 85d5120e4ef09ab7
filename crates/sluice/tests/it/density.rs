//! Hundreds of pipelines on one `sluice serve` node (issue 33), through the public API only:
//! lifecycle calls on a few of them leave every other pipeline's deliveries exact, a paused
//! pipeline with a large backlog catches up exactly once, and `kill -9` under a steady feed
//! loses no acknowledged record. Each runs on the embedded log and on the Kafka-API broker
//! `scripts/test` starts.
//!
//! Every pipeline is a set filter on `base.erc20_token_transfer`'s `token_address` with a
//! value of its own and a managed sink. A feeder sends rounds: one record per pipeline, plus
//! records of values no pipeline has, and remembers when each request was sent and when it
//! was acknowledged, so a check can tell records appended before a call from those appended
//! after it answered.
//!
//! One file (over 900 lines) on purpose: the three scenarios share the fleet, the feeder and
//! the ledger of acknowledged records, which are half of it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::process::{Server, data_dir_args, free_port, sluice};

const KEY: &str = "slk_densitytest0000000000000000000000000000000";
/// Pipelines on the node: several hundred, as issue 33 asks.
const PIPELINES: usize = 300;

/// [`PIPELINES`], or `SLUICE_TEST_DENSITY_PIPELINES` when set (to try the tests' own logic on a
/// build that cannot carry that many; a run that proves issue 33 leaves it unset).
fn pipelines() -> usize {
    std::env::var("SLUICE_TEST_DENSITY_PIPELINES").map_or(PIPELINES, |count| {
        count.parse().expect("SLUICE_TEST_DENSITY_PIPELINES is a number of pipelines")
    })
}

/// Concurrent API calls while the fleet is created, deployed and read.
const CONCURRENCY: usize = 8;
/// Records of no pipeline's value in each round.
const NOISE_PER_ROUND: usize = 10;
/// Pause between two rounds of the feed.
const ROUND_INTERVAL: Duration = Duration::from_millis(150);
/// Records of the lagging pipeline sent while it is paused.
const BACKLOG: u64 = 8_000;
/// Records per request of that backlog.
const BACKLOG_BATCH: u64 = 2_000;

/// Which stream log a server runs on: `None` for the embedded one, or `(bus URL, topic
/// prefix)`.
type Bus = Option<(String, String)>;

/// The Kafka-API broker `scripts/test` starts, under a topic prefix of this test's own.
fn kafka_bus(label: &str) -> Bus {
    let url = std::env::var("SLUICE_TEST_KAFKA_URL")
        .expect("SLUICE_TEST_KAFKA_URL must name a Kafka-API broker; run scripts/test");
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    Some((url, format!("{label}{nanos:x}.")))
}

fn start(dir: &std::path::Path, port: u16, bus: &Bus) -> Server {
    let mut command = sluice();
    command
        .arg("serve")
        .args(data_dir_args(dir))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SLUICE_BOOTSTRAP_API_KEY", KEY)
        // Hundreds of deploys would log a line each.
        .env("SLUICE_LOG", "warn,sqlx=warn");
    if let Some((url, prefix)) = bus {
        command.args(["--bus", url, "--bus-topic-prefix", prefix]);
    }
    // A restart resumes every deployed pipeline before it is ready: on a broker that other
    // density tests load at the same time that can take longer than a plain start.
    Server::start_within(command, port, Duration::from_secs(180))
}

/// The value pipeline `index` filters on.
fn pipeline_value(index: usize) -> String {
    format!("0xde{index:038x}")
}

/// A value added to pipeline `index`'s set during a test.
fn extra_value(index: usize) -> String {
    format!("0xad{index:038x}")
}

/// Values no pipeline has.
fn noise_value(n: u64) -> String {
    format!("0xbe{:038x}", n % 1_000)
}

/// Whose value a record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Pipeline(usize),
    Extra(usize),
    Noise,
}

impl Token {
    fn value(self, n: u64) -> String {
        match self {
            Token::Pipeline(index) => pipeline_value(index),
            Token::Extra(index) => extra_value(index),
            Token::Noise => noise_value(n),
        }
    }
}

/// The stable key of record `n` (`transaction_hash:log_index`).
fn key(n: u64) -> String {
    format!("0x{n:064x}:{}", n % 7)
}

fn record(n: u64, token: Token, timestamp: &str) -> String {
    json!({
        "n": n,
        "block_number": 1_000 + n / 1_000,
        "block_timestamp": timestamp,
        "transaction_hash": format!("0x{n:064x}"),
        "log_index": n % 7,
        "token_address": token.value(n),
        "from_address": "0x2222222222222222222222222222222222222222",
        "to_address": "0x3333333333333333333333333333333333333333",
        "amount_str": "1",
    })
    .to_string()
        + "\n"
}

/// One record sent: whose value it carries, when its request was sent and, when the server
/// acknowledged it (`{"accepted": n}`), when that answer arrived.
#[derive(Debug, Clone, Copy)]
struct Sent {
    token: Token,
    sent: Instant,
    acked: Option<Instant>,
}

impl Sent {
    fn acked_before(&self, at: Instant) -> bool {
        self.acked.is_some_and(|acked| acked < at)
    }

    fn sent_after(&self, at: Instant) -> bool {
        self.sent > at
    }
}

/// Every record sent, by number.
#[derive(Debug, Default)]
struct Ledger {
    records: BTreeMap<u64, Sent>,
    next: u64,
    rounds_acked: usize,
    requests: usize,
    /// Requests the server did not acknowledge (status and body, or the client error).
    unacked: Vec<String>,
}

/// Sends `tokens` as one request; remembers every record in `ledger`; answers whether the
/// server acknowledged them.
async fn send_records(
    client: &reqwest::Client,
    ingest: &str,
    ledger: &Mutex<Ledger>,
    tokens: &[Token],
) -> bool {
    let timestamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let first = {
        let mut ledger = ledger.lock().unwrap();
        let first = ledger.next;
        ledger.next += tokens.len() as u64;
        first
    };
    let body: String =
        tokens.iter().enumerate().map(|(i, t)| record(first + i as u64, *t, &timestamp)).collect();
    let sent = Instant::now();
    let answer = client.post(ingest).header("x-api-key", KEY).body(body).send().await;
    let outcome = match answer {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.text().await {
                Ok(text) => {
                    let accepted = serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|v| v["accepted"].as_u64());
                    if matches!(status, 200 | 202) && accepted == Some(tokens.len() as u64) {
                        Ok(())
                    } else {
                        Err(format!("{status} {text}"))
                    }
                }
                Err(error) => Err(format!("{status}, answer cut: {error}")),
            }
        }
        Err(error) => Err(format!("{error}")),
    };
    let acked = outcome.is_ok().then(Instant::now);
    let mut ledger = ledger.lock().unwrap();
    ledger.requests += 1;
    for (i, token) in tokens.iter().enumerate() {
        ledger.records.insert(first + i as u64, Sent { token: *token, sent, acked });
    }
    if let Err(error) = outcome {
        ledger.unacked.push(error);
    }
    acked.is_some()
}

/// Sends a round every [`ROUND_INTERVAL`] until stopped: one record for each of the
/// `pipelines`, one for each extra value of `extras`, and [`NOISE_PER_ROUND`] others.
struct Feeder {
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Feeder {
    fn start(
        client: &reqwest::Client,
        base: &str,
        ledger: &Arc<Mutex<Ledger>>,
        pipelines: usize,
        extras: &[usize],
    ) -> Self {
        let mut tokens: Vec<Token> = (0..pipelines).map(Token::Pipeline).collect();
        tokens.extend(extras.iter().map(|&i| Token::Extra(i)));
        tokens.extend(std::iter::repeat_n(Token::Noise, NOISE_PER_ROUND));
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (client, ingest, ledger, stop) =
                (client.clone(), ingest_url(base), ledger.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    if send_records(&client, &ingest, &ledger, &tokens).await {
                        ledger.lock().unwrap().rounds_acked += 1;
                    }
                    tokio::time::sleep(ROUND_INTERVAL).await;
                }
            })
        };
        Self { ledger: ledger.clone(), stop, task }
    }

    /// Waits until `rounds` more rounds were acknowledged.
    async fn wait_rounds(&self, rounds: usize) {
        let target = self.ledger.lock().unwrap().rounds_acked + rounds;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (acked, requests) = {
                let ledger = self.ledger.lock().unwrap();
                (ledger.rounds_acked, ledger.requests)
            };
            if acked >= target {
                return;
            }
            assert!(!self.task.is_finished(), "the feeder stopped");
            assert!(
                Instant::now() < deadline,
                "the feed stalled: {acked} rounds acknowledged of {requests} requests, \
                 waiting for {target}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
    }
}

fn ingest_url(base: &str) -> String {
    format!("{base}/api/v1/streams/base/erc20_token_transfer/records")
}

async fn call(client: &reqwest::Client, method: Method, url: &str, body: Option<Value>) -> Value {
    let mut request = client.request(method.clone(), url).header("x-api-key", KEY);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response =
        request.send().await.unwrap_or_else(|error| panic!("{method} {url}: no answer: {error:?}"));
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    assert!(status.is_success(), "{method} {url}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// Runs `work` on every item, at most `limit` at a time; answers the outputs in item order.
async fn concurrently<T, F, Fut, O>(items: Vec<T>, limit: usize, work: F) -> Vec<O>
where
    T: Send + 'static,
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = O> + Send + 'static,
    O: Send + 'static,
{
    let total = items.len();
    let mut running = JoinSet::new();
    let mut out: Vec<Option<O>> = (0..total).map(|_| None).collect();
    for (index, item) in items.into_iter().enumerate() {
        if running.len() >= limit {
            let (i, o) = running.join_next().await.unwrap().unwrap();
            out[i] = Some(o);
        }
        let future = work(item);
        running.spawn(async move { (index, future.await) });
    }
    while let Some(done) = running.join_next().await {
        let (i, o) = done.unwrap();
        out[i] = Some(o);
    }
    out.into_iter().map(Option::unwrap).collect()
}

/// Creates `count` pipelines, pipeline `i` filtering on [`pipeline_value`]`(i)` into a
/// managed sink `sk-1`, and deploys each as soon as it is created; answers their ids.
async fn deploy_fleet(client: &reqwest::Client, base: &str, count: usize) -> Vec<String> {
    let started = Instant::now();
    let deployed_so_far = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ids = concurrently((0..count).collect(), CONCURRENCY, |index| {
        let (client, base) = (client.clone(), base.to_owned());
        let deployed_so_far = deployed_so_far.clone();
        async move {
            let body = json!({
                "name": format!("density-{index}"), "description": "issue 33",
                "pipeline_config": {
                    "source": {"chain": "base", "entity": "erc20_token_transfer"},
                    "transforms": [{"type": "redis_set_filter", "uid": "tf-1",
                                    "filter_expr": "root = this.token_address",
                                    "set_values": [pipeline_value(index)]}],
                    "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}]
                }
            });
            let answer =
                client.post(format!("{base}/api/v1/beam")).header("x-api-key", KEY).json(&body);
            let created = match answer.send().await {
                Ok(response) => (response.status().as_u16(), response.text().await),
                Err(error) => (0, Err(error)),
            };
            let id = match &created {
                (200, Ok(text)) => serde_json::from_str::<Value>(text)
                    .ok()
                    .and_then(|created| created["id"].as_str().map(str::to_owned)),
                _ => None,
            };
            let Some(id) = id else {
                let done = deployed_so_far.load(Ordering::SeqCst);
                panic!(
                    "creating pipeline {index} failed, with {done} of {count} pipelines \
                     deployed: {created:?}"
                );
            };
            let url = format!("{base}/api/v1/beam/{id}/deploy");
            let call_started = Instant::now();
            let answer = client.post(&url).header("x-api-key", KEY).send().await;
            let deployed = match answer {
                Ok(response) if response.status() == 200 => response.json::<Value>().await.ok(),
                _ => None,
            };
            let done = deployed_so_far.load(Ordering::SeqCst);
            assert!(
                deployed.as_ref().is_some_and(|d| d["status"] == "deployed"),
                "the deploy of pipeline {index} failed after {:?}, with {done} of {count} \
                 pipelines deployed: {deployed:?}",
                call_started.elapsed()
            );
            deployed_so_far.fetch_add(1, Ordering::SeqCst);
            id
        }
    })
    .await;
    eprintln!("density: {count} pipelines created and deployed in {:?}", started.elapsed());
    ids
}

/// Pipelines whose deploy stats show no worker, or one that is not running.
async fn not_running(client: &reqwest::Client, base: &str, ids: &[String]) -> Vec<usize> {
    let states = concurrently(ids.to_vec(), CONCURRENCY, |id| {
        let (client, base) = (client.clone(), base.to_owned());
        async move {
            let url = format!("{base}/api/v1/beam/{id}/deploy/stats");
            let Ok(response) = client.get(&url).header("x-api-key", KEY).send().await else {
                return false;
            };
            if response.status() != 200 {
                return false;
            }
            let Ok(stats) = response.json::<Value>().await else { return false };
            let workers =
                stats["workers_health"]["workers"].as_array().cloned().unwrap_or_default();
            !workers.is_empty()
                && workers.iter().all(|w| w["status"] == "Running" && w["is_ready"] == true)
        }
    })
    .await;
    states.iter().enumerate().filter(|(_, running)| !**running).map(|(i, _)| i).collect()
}

/// What a pipeline's sink holds of one record.
#[derive(Debug, Clone, Default)]
struct Delivered {
    count: usize,
    /// The record went through the script the redeploy added.
    redeployed: bool,
}

/// One pipeline's managed sink, read incrementally.
#[derive(Debug)]
struct Sink {
    id: String,
    offset: u64,
    seen: BTreeMap<u64, Delivered>,
    /// Delivered records that no sent record explains (wrong key, missing `n`).
    foreign: Vec<String>,
}

impl Sink {
    fn new(id: &str) -> Self {
        Self { id: id.to_owned(), offset: 0, seen: BTreeMap::new(), foreign: Vec::new() }
    }

    /// Reads from where the last read ended to the sink's end.
    async fn read(&mut self, client: &reqwest::Client, base: &str) {
        loop {
            let url = format!(
                "{base}/api/v1/beam/{}/sinks/sk-1/records?offset={}&limit=10000",
                self.id, self.offset
            );
            let page = call(client, Method::GET, &url, None).await;
            let records = page["records"].as_array().unwrap();
            for record in records {
                let n = record["value"]["n"].as_u64();
                match n {
                    Some(n) if record["key"] == key(n) => {
                        let delivered = self.seen.entry(n).or_default();
                        delivered.count += 1;
                        delivered.redeployed |= record["value"]["redeployed"] == true;
                    }
                    _ => self.foreign.push(record.to_string()),
                }
            }
            self.offset = page["next_offset"].as_u64().unwrap();
            if records.is_empty() {
                return;
            }
        }
    }
}

/// What a pipeline's sink must do with one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Delivered (at least once).
    Required,
    /// Either way: its fate depends on timing the documentation leaves open.
    Allowed,
    /// Never delivered.
    Forbidden,
}

/// The default: a pipeline gets the records of its own value, those acknowledged for sure
/// and unacknowledged ones possibly (a request cut by a kill may have been stored).
fn own_records(pipeline: usize, sent: &Sent) -> Expect {
    match sent.token {
        Token::Pipeline(index) if index == pipeline => {
            if sent.acked.is_some() {
                Expect::Required
            } else {
                Expect::Allowed
            }
        }
        _ => Expect::Forbidden,
    }
}

/// Reads every sink in `sinks` until it holds every record `expect` requires of it (or the
/// deadline passes), then checks each: nothing required missing, nothing forbidden, and no
/// duplicates in the pipelines `exactly_once` names. `extra` adds a check per delivered
/// record. Fails with every problem found.
async fn check_sinks(
    client: &reqwest::Client,
    base: &str,
    sinks: &mut [Sink],
    ledger: &Ledger,
    expect: impl Fn(usize, &Sent) -> Expect,
    exactly_once: impl Fn(usize) -> bool,
    extra: impl Fn(usize, u64, &Sent, &Delivered) -> Option<String>,
) {
    let required: Vec<BTreeSet<u64>> = (0..sinks.len())
        .map(|pipeline| {
            ledger
                .records
                .iter()
                .filter(|(_, sent)| expect(pipeline, sent) == Expect::Required)
                .map(|(n, _)| *n)
                .collect()
        })
        .collect();
    let complete =
        |sink: &Sink, required: &BTreeSet<u64>| required.iter().all(|n| sink.seen.contains_key(n));
    let deadline = Instant::now() + Duration::from_secs(180);
    let started = Instant::now();
    loop {
        let pending: Vec<usize> =
            (0..sinks.len()).filter(|&i| !complete(&sinks[i], &required[i])).collect();
        if pending.is_empty() || Instant::now() > deadline {
            break;
        }
        read_sinks(client, base, sinks, &pending).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("density: sinks complete (or deadline) after {:?} of reading", started.elapsed());
    // Once more, to the end of every sink, so that late extra records show too.
    let all: Vec<usize> = (0..sinks.len()).collect();
    read_sinks(client, base, sinks, &all).await;

    // docs/runtime.md: under `at_least_once` a failed sink write is retried, and a write the
    // sink took before it failed is then delivered twice. A pipeline whose sink reported a
    // failed write may hold duplicates; any other pipeline must hold each record once.
    let failed_writes = output_errors(client, base).await;
    let mut problems = Vec::new();
    let mut delivered_total = 0;
    let mut duplicates_total = 0;
    let mut excused = Vec::new();
    for (pipeline, sink) in sinks.iter().enumerate() {
        let sink_failed = failed_writes.get(&sink.id).is_some_and(|&n| n > 0);
        let missing: Vec<u64> =
            required[pipeline].iter().copied().filter(|n| !sink.seen.contains_key(n)).collect();
        note(&mut problems, pipeline, "required records missing", &missing);
        if !sink.foreign.is_empty() {
            problems.push(format!(
                "pipeline {pipeline}: {} records with a wrong key or no number, e.g. {}",
                sink.foreign.len(),
                sink.foreign[0]
            ));
        }
        let mut forbidden = Vec::new();
        let mut duplicates = Vec::new();
        for (n, delivered) in &sink.seen {
            delivered_total += delivered.count;
            duplicates_total += delivered.count - 1;
            let Some(sent) = ledger.records.get(n) else {
                forbidden.push(*n);
                continue;
            };
            if expect(pipeline, sent) == Expect::Forbidden {
                forbidden.push(*n);
            }
            if delivered.count > 1 && exactly_once(pipeline) {
                if sink_failed {
                    excused.push((pipeline, *n));
                } else {
                    duplicates.push((*n, delivered.count));
                }
            }
            if let Some(problem) = extra(pipeline, *n, sent, delivered) {
                problems.push(format!("pipeline {pipeline}: {problem}"));
            }
        }
        note(&mut problems, pipeline, "records it must not have", &forbidden);
        note(&mut problems, pipeline, "records delivered more than once", &duplicates);
    }
    eprintln!(
        "density: {} pipelines, {} records sent ({} requests, {} unacknowledged), {} \
         delivered in all, {} duplicates ({} after a failed sink write: {:?}), {} problems",
        sinks.len(),
        ledger.records.len(),
        ledger.requests,
        ledger.unacked.len(),
        delivered_total,
        duplicates_total,
        excused.len(),
        &excused[..excused.len().min(10)],
        problems.len()
    );
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// Adds to `problems` that `pipeline` has `found` (when it has any): how many, and the first few.
fn note<T: std::fmt::Debug>(problems: &mut Vec<String>, pipeline: usize, what: &str, found: &[T]) {
    if !found.is_empty() {
        let first = &found[..found.len().min(5)];
        problems.push(format!("pipeline {pipeline}: {} {what}, e.g. {first:?}", found.len()));
    }
}

/// Each pipeline's failed sink writes so far, from `/metrics`
/// (`sluice_pipeline_output_errors_total`), by pipeline id.
async fn output_errors(client: &reqwest::Client, base: &str) -> HashMap<String, u64> {
    let text = client
        .get(format!("{base}/metrics"))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix("sluice_pipeline_output_errors_total{config_id=\""))
        .filter_map(|rest| {
            let (id, rest) = rest.split_once("\"}")?;
            Some((id.to_owned(), rest.trim().parse().ok()?))
        })
        .collect()
}

/// Reads the sinks `which` to their ends, [`CONCURRENCY`] at a time.
async fn read_sinks(client: &reqwest::Client, base: &str, sinks: &mut [Sink], which: &[usize]) {
    let taken: Vec<(usize, Sink)> =
        which.iter().map(|&i| (i, std::mem::replace(&mut sinks[i], Sink::new("")))).collect();
    let read = concurrently(taken, CONCURRENCY, |(i, mut sink)| {
        let (client, base) = (client.clone(), base.to_owned());
        async move {
            sink.read(&client, &base).await;
            (i, sink)
        }
    })
    .await;
    for (i, sink) in read {
        sinks[i] = sink;
    }
}

/// Waits until `sink` holds every record of pipeline `pipeline`'s own value acknowledged so
/// far; answers when the wait started (every record acknowledged before it is delivered).
async fn wait_caught_up(
    client: &reqwest::Client,
    base: &str,
    sink: &mut Sink,
    ledger: &Mutex<Ledger>,
    pipeline: usize,
) -> Instant {
    let from = Instant::now();
    let required: BTreeSet<u64> = ledger
        .lock()
        .unwrap()
        .records
        .iter()
        .filter(|(_, sent)| sent.token == Token::Pipeline(pipeline) && sent.acked_before(from))
        .map(|(n, _)| *n)
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        sink.read(client, base).await;
        let missing = required.iter().filter(|n| !sink.seen.contains_key(n)).count();
        if missing == 0 {
            return from;
        }
        assert!(
            Instant::now() < deadline,
            "pipeline {pipeline} never delivered {missing} of {} acknowledged records",
            required.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A call's start and the moment its answer arrived.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: Instant,
    end: Instant,
}

async fn timed_call(
    client: &reqwest::Client,
    method: Method,
    url: &str,
    body: Option<Value>,
) -> Span {
    let start = Instant::now();
    let answer = call(client, method.clone(), url, body).await;
    let end = Instant::now();
    let shown: String = answer.to_string().chars().take(160).collect();
    eprintln!("density: {method} {url} answered in {:?}: {shown}", end - start);
    Span { start, end }
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn density_lifecycle_calls_on_four_of_300_pipelines_leave_every_other_delivery_exact() {
    lifecycle_calls(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn density_on_kafka_lifecycle_calls_on_four_of_300_pipelines_leave_every_other_delivery_exact()
 {
    lifecycle_calls(kafka_bus("density-life")).await;
}

/// Under a steady feed: pipeline `PAUSED` is paused then resumed, `REDEPLOYED` gets a script
/// (a zero-downtime redeploy), `TORN_DOWN` is torn down then deployed again, `VALUES` gets a
/// value added and its first value removed. Every other pipeline's sink must hold exactly
/// the records of its value, once each; the four follow docs/runtime.md's lifecycle.
#[allow(
    clippy::too_many_lines,
    reason = "one scenario under a steady feed: each lifecycle call in turn, then every sink checked"
)]
async fn lifecycle_calls(bus: Bus) {
    const PAUSED: usize = 0;
    const REDEPLOYED: usize = 1;
    const TORN_DOWN: usize = 2;
    const VALUES: usize = 3;
    let count = pipelines();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port, &bus);
    let base = server.base.clone();
    let client = http_client();
    let beam = format!("{base}/api/v1/beam");

    let ids = deploy_fleet(&client, &base, count).await;
    let mut sinks: Vec<Sink> = ids.iter().map(|id| Sink::new(id)).collect();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let feeder = Feeder::start(&client, &base, &ledger, count, &[VALUES]);
    feeder.wait_rounds(3).await;

    timed_call(&client, Method::POST, &format!("{beam}/{}/pause", ids[PAUSED]), None).await;
    feeder.wait_rounds(3).await;

    let script = "function transform(record) { record.redeployed = true; return record; }";
    let transforms = json!([
        {"type": "redis_set_filter", "uid": "tf-1", "filter_expr": "root = this.token_address"},
        {"type": "v8", "uid": "tf-js", "script": script},
    ]);
    let redeploy = timed_call(
        &client,
        Method::PUT,
        &format!("{beam}/{}/transforms", ids[REDEPLOYED]),
        Some(transforms),
    )
    .await;
    feeder.wait_rounds(3).await;

    // Before the teardown, the sink held everything acknowledged for it.
    wait_caught_up(&client, &base, &mut sinks[TORN_DOWN], &ledger, TORN_DOWN).await;
    timed_call(&client, Method::POST, &format!("{beam}/{}/teardown", ids[TORN_DOWN]), None).await;
    let gone = client
        .get(format!("{beam}/{}/sinks/sk-1/records", ids[TORN_DOWN]))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404, "a torn-down pipeline's sink is gone");
    feeder.wait_rounds(3).await;

    let values_url = format!("{beam}/{}/transforms/tf-1/filter-values", ids[VALUES]);
    let added = timed_call(
        &client,
        Method::POST,
        &values_url,
        Some(json!({"values": [extra_value(VALUES).to_uppercase().replacen("0X", "0x", 1)]})),
    )
    .await;
    feeder.wait_rounds(3).await;
    // Everything acknowledged before `caught_up` was delivered before the value went away.
    let caught_up = wait_caught_up(&client, &base, &mut sinks[VALUES], &ledger, VALUES).await;
    let removed = timed_call(
        &client,
        Method::DELETE,
        &values_url,
        Some(json!({"values": [pipeline_value(VALUES)]})),
    )
    .await;
    feeder.wait_rounds(3).await;

    timed_call(&client, Method::POST, &format!("{beam}/{}/deploy", ids[PAUSED]), None).await;
    let redeployed_torn_down =
        timed_call(&client, Method::POST, &format!("{beam}/{}/deploy", ids[TORN_DOWN]), None).await;
    // The new sink topic starts empty.
    sinks[TORN_DOWN] = Sink::new(&ids[TORN_DOWN]);
    feeder.wait_rounds(5).await;
    feeder.stop().await;

    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    assert!(ledger.unacked.is_empty(), "ingest refused records: {:?}", ledger.unacked);
    let expect = |pipeline: usize, sent: &Sent| -> Expect {
        match pipeline {
            // Paused, then resumed from its kept offsets: everything, the gap included.
            PAUSED => own_records(pipeline, sent),
            // The next deploy starts at the stream's end: nothing that arrived before it.
            TORN_DOWN => match own_records(pipeline, sent) {
                Expect::Required if sent.sent_after(redeployed_torn_down.end) => Expect::Required,
                Expect::Forbidden => Expect::Forbidden,
                _ if sent.acked_before(redeployed_torn_down.start) => Expect::Forbidden,
                _ => Expect::Allowed,
            },
            VALUES => match sent.token {
                Token::Pipeline(VALUES) if sent.acked_before(caught_up) => Expect::Required,
                Token::Pipeline(VALUES) if sent.sent_after(removed.end) => Expect::Forbidden,
                Token::Pipeline(VALUES) => Expect::Allowed,
                Token::Extra(VALUES) if sent.sent_after(added.end) => Expect::Required,
                Token::Extra(VALUES) => Expect::Allowed,
                _ => Expect::Forbidden,
            },
            _ => own_records(pipeline, sent),
        }
    };
    let touched = [PAUSED, REDEPLOYED, TORN_DOWN, VALUES];
    check_sinks(
        &client,
        &base,
        &mut sinks,
        &ledger,
        expect,
        |pipeline| !touched.contains(&pipeline),
        |pipeline, n, sent, delivered| {
            // Every record appended after the redeploy answered runs the new plan (one
            // appended before may too, when the worker reads it after the swap); no other
            // pipeline runs it.
            if pipeline == REDEPLOYED && sent.sent_after(redeploy.end) && !delivered.redeployed {
                Some(format!("record {n}, appended after the redeploy, skipped its script"))
            } else if pipeline != REDEPLOYED && delivered.redeployed {
                Some(format!("record {n} went through another pipeline's script"))
            } else {
                None
            }
        },
    )
    .await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread")]
async fn density_a_lagging_pipeline_among_300_catches_up_exactly_once_while_others_deliver() {
    lagging_pipeline(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn density_on_kafka_a_lagging_pipeline_among_300_catches_up_exactly_once_while_others_deliver()
 {
    lagging_pipeline(kafka_bus("density-lag")).await;
}

/// Pipeline `LAGGING` is paused while [`BACKLOG`] records of its value arrive (besides the
/// steady feed), then deployed again: it delivers every record exactly once, catches up and
/// keeps delivering the feed with the others, whose sinks stay exact throughout.
async fn lagging_pipeline(bus: Bus) {
    const LAGGING: usize = 7;
    let count = pipelines();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port, &bus);
    let base = server.base.clone();
    let client = http_client();
    let beam = format!("{base}/api/v1/beam");

    let ids = deploy_fleet(&client, &base, count).await;
    let mut sinks: Vec<Sink> = ids.iter().map(|id| Sink::new(id)).collect();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let feeder = Feeder::start(&client, &base, &ledger, count, &[]);
    feeder.wait_rounds(3).await;

    timed_call(&client, Method::POST, &format!("{beam}/{}/pause", ids[LAGGING]), None).await;
    let ingest = ingest_url(&base);
    let backlog = vec![Token::Pipeline(LAGGING); BACKLOG_BATCH as usize];
    for _ in 0..BACKLOG / BACKLOG_BATCH {
        assert!(send_records(&client, &ingest, &ledger, &backlog).await, "backlog refused");
    }
    feeder.wait_rounds(3).await;

    let resume =
        timed_call(&client, Method::POST, &format!("{beam}/{}/deploy", ids[LAGGING]), None).await;
    wait_caught_up(&client, &base, &mut sinks[LAGGING], &ledger, LAGGING).await;
    eprintln!(
        "density: the lagging pipeline delivered its backlog {:?} after its deploy answered",
        resume.end.elapsed()
    );
    // Caught up, it goes on with the feed like the others.
    feeder.wait_rounds(5).await;
    feeder.stop().await;

    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    assert!(ledger.unacked.is_empty(), "ingest refused records: {:?}", ledger.unacked);
    let backlog_total =
        ledger.records.values().filter(|sent| sent.token == Token::Pipeline(LAGGING)).count();
    assert!(backlog_total as u64 > BACKLOG, "the backlog was sent");
    check_sinks(&client, &base, &mut sinks, &ledger, own_records, |_| true, |_, _, _, _| None)
        .await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread")]
async fn density_sigkill_with_300_deployed_pipelines_loses_no_acknowledged_record() {
    sigkill(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn density_on_kafka_sigkill_with_300_deployed_pipelines_loses_no_acknowledged_record() {
    sigkill(kafka_bus("density-kill")).await;
}

/// `kill -9` of the node under a steady feed, restart on the same data dir: every record the
/// records endpoint acknowledged reaches every pipeline it matches (duplicates allowed).
/// Logs how long until every pipeline reports running workers again.
async fn sigkill(bus: Bus) {
    let count = pipelines();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = start(dir.path(), port, &bus);
    let base = server.base.clone();
    let client = http_client();

    let ids = deploy_fleet(&client, &base, count).await;
    let mut sinks: Vec<Sink> = ids.iter().map(|id| Sink::new(id)).collect();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let feeder = Feeder::start(&client, &base, &ledger, count, &[]);
    feeder.wait_rounds(8).await;

    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    drop(server);
    let restarted = Instant::now();
    let server = tokio::task::spawn_blocking(move || {
        let server = start(dir.path(), port, &bus);
        (dir, server)
    })
    .await
    .unwrap();
    let ready = restarted.elapsed();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let waiting = not_running(&client, &base, &ids).await;
        if waiting.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} pipelines never ran again after the restart, e.g. {:?}",
            waiting.len(),
            &waiting[..waiting.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "density: after kill -9, the restarted node answered /readyz after {ready:?} and all \
         {count} pipelines reported running workers after {:?}",
        restarted.elapsed()
    );
    feeder.wait_rounds(5).await;
    feeder.stop().await;

    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    let acknowledged = ledger.records.values().filter(|sent| sent.acked.is_some()).count();
    assert!(acknowledged > 8 * count, "too little was acknowledged to prove anything");
    check_sinks(&client, &base, &mut sinks, &ledger, own_records, |_| false, |_, _, _, _| None)
        .await;
    drop(server);
}
