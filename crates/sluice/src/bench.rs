//! `sluice bench`: latency and throughput of a running server's pipeline endpoints.
//!
//! Open loop by default: requests are scheduled at a fixed `--rate` whatever the server does,
//! and each latency is measured from the request's *scheduled* time, so a stalled server shows
//! up in the percentiles instead of silently slowing the load (no coordinated omission).
//! `--rate 0` runs closed loop instead: `--concurrency` workers send back to back, which
//! measures the maximum throughput.
//!
//! `--op filter-values` measures a bulk load instead: `--values` values in batches of
//! `--batch`, each one `POST …/filter-values`, sent one after another to one set filter.
//! `--op dataset-add` does the same into a new dataset (`POST …/datasets/{id}/entries`, at
//! most 250,000 values per request), and `--op dataset-check` loads `--values` entries into a
//! new dataset, then drives `GET …/datasets/{id}/entries/check` (half hits, half misses) at
//! `--rate`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Operation {
    /// `GET {base_url}/{config_id}` on pipelines created during setup.
    Get,
    /// `GET {base_url}` listing the pipelines created during setup.
    List,
    /// `POST {base_url}` creating a pipeline per request.
    Create,
    /// `POST {base_url}/{config_id}/transforms/{uid}/filter-values`: a bulk load in batches.
    FilterValues,
    /// `POST {base_url}/datasets/{dataset_id}/entries`: a bulk load in batches.
    DatasetAdd,
    /// `GET {base_url}/datasets/{dataset_id}/entries/check` on a dataset of `--values` entries.
    DatasetCheck,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Base address of the server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// API key to send (X-API-Key).
    #[arg(long, env = "SLUICE_API_KEY")]
    api_key: String,
    /// What each request does.
    #[arg(long, value_enum, default_value = "get")]
    op: Operation,
    /// Requests per second (open loop); 0 sends as fast as `--concurrency` allows.
    #[arg(long, default_value_t = 500)]
    rate: u32,
    /// Seconds of measured load (after a warm-up of 2 seconds).
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// Most requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Pipelines created before measuring (`get` picks among them, `list` returns them).
    #[arg(long, default_value_t = 20)]
    pipelines: usize,
    /// `filter-values`, `dataset-add`, `dataset-check`: values in all.
    #[arg(long, default_value_t = 1_000_000)]
    values: usize,
    /// `filter-values`, `dataset-add`, `dataset-check`: values per request (datasets take at
    /// most 250,000).
    #[arg(long, default_value_t = 100_000)]
    batch: usize,
}

fn pipeline_body(index: usize) -> Value {
    json!({
        "name": format!("bench-{index}"),
        "description": "created by sluice bench",
        "tags": ["bench"],
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "filter_expr": "root = this.token_address"}],
            "sinks": [{"type": "kafka", "name": format!("bench-{index}")}]
        }
    })
}

struct Target {
    client: reqwest::Client,
    base: String,
    key: String,
    op: Operation,
    ids: Vec<String>,
    /// `dataset-check`: entries in the dataset (values `0..entries` are hits).
    entries: usize,
}

impl Target {
    async fn send(&self, n: usize) -> anyhow::Result<()> {
        let request = match self.op {
            Operation::Get => {
                self.client.get(format!("{}/{}", self.base, self.ids[n % self.ids.len()]))
            }
            Operation::List => self.client.get(&self.base),
            Operation::Create => self.client.post(&self.base).json(&pipeline_body(n)),
            Operation::DatasetCheck => self.client.get(format!(
                "{}/datasets/{}/entries/check?value={}",
                self.base,
                self.ids[0],
                // Every other lookup misses: values from `entries` on were never added.
                filter_value((n * 7919) % (2 * self.entries.max(1)))
            )),
            Operation::FilterValues | Operation::DatasetAdd => {
                bail!("bulk loads run their own loop")
            }
        };
        let response = request.header("X-API-Key", &self.key).send().await?;
        let status = response.status();
        response.bytes().await?;
        if !status.is_success() {
            bail!("status {status}");
        }
        Ok(())
    }
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().pool_max_idle_per_host(args.concurrency).build()?;
    let base = format!("{}/api/v1/beam", args.url.trim_end_matches('/'));
    match args.op {
        Operation::FilterValues => return load_filter_values(&client, &base, &args).await,
        Operation::DatasetAdd => return load_dataset(&client, &base, &args, true).await.map(drop),
        _ => {}
    }
    let mut ids = Vec::with_capacity(args.pipelines);
    let setup_pipelines = if let Operation::DatasetCheck = args.op {
        ids.push(setup_dataset(&client, &base, &args).await?);
        0
    } else {
        args.pipelines.max(1)
    };
    for index in 0..setup_pipelines {
        let response = client
            .post(&base)
            .header("X-API-Key", &args.api_key)
            .json(&pipeline_body(index))
            .send()
            .await
            .context("creating setup pipelines")?;
        if !response.status().is_success() {
            bail!("setup create failed: {} {}", response.status(), response.text().await?);
        }
        let created: Value = response.json().await?;
        ids.push(created["id"].as_str().context("created pipeline has an id")?.to_owned());
    }
    let target = Arc::new(Target {
        client,
        base,
        key: args.api_key.clone(),
        op: args.op,
        ids,
        entries: args.values,
    });

    // Warm up connections and caches; these results are discarded.
    drive(&target, &args, Duration::from_secs(2)).await;
    let started = Instant::now();
    let (mut latencies, errors) = drive(&target, &args, Duration::from_secs(args.duration)).await;
    let elapsed = started.elapsed().as_secs_f64();

    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * latencies.len() as f64).ceil() as usize;
        latencies[rank.clamp(1, latencies.len()) - 1].as_secs_f64() * 1000.0
    };
    let report = json!({
        "op": clap::ValueEnum::to_possible_value(&args.op).map(|v| v.get_name().to_owned()),
        "rate_target": args.rate,
        "concurrency": args.concurrency,
        "requests_ok": latencies.len(),
        "errors": errors,
        "throughput_rps": (latencies.len() as f64 / elapsed * 10.0).round() / 10.0,
        "p50_ms": (pct(50.0) * 1000.0).round() / 1000.0,
        "p90_ms": (pct(90.0) * 1000.0).round() / 1000.0,
        "p99_ms": (pct(99.0) * 1000.0).round() / 1000.0,
        "max_ms": (pct(100.0) * 1000.0).round() / 1000.0,
    });
    println!("{report}");
    Ok(())
}

/// Filter value number `n`: a 42-character address, in no particular order.
fn filter_value(n: usize) -> String {
    format!("0x{:040x}", (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// `--op filter-values`: creates one pipeline with a set filter, then posts `--values` values
/// in batches of `--batch`, one request after another, and reports values per second. The
/// request bodies are serialized before the clock starts, so the figure is the server's.
async fn load_filter_values(
    client: &reqwest::Client,
    base: &str,
    args: &BenchArgs,
) -> anyhow::Result<()> {
    if args.batch == 0 || args.values == 0 {
        bail!("--batch and --values must be greater than 0");
    }
    let response = client
        .post(base)
        .header("X-API-Key", &args.api_key)
        .json(&pipeline_body(0))
        .send()
        .await
        .context("creating the setup pipeline")?;
    if !response.status().is_success() {
        bail!("setup create failed: {} {}", response.status(), response.text().await?);
    }
    let created: Value = response.json().await?;
    let id = created["id"].as_str().context("created pipeline has an id")?;
    let uid = created["pipeline_config"]["transforms"][0]["uid"]
        .as_str()
        .context("created pipeline has a set filter uid")?;
    let url = format!("{base}/{id}/transforms/{uid}/filter-values");
    // Warm-up: connections, caches and prepared statements; values outside the measured set.
    let warm_up =
        post_json(client, &url, args, values_body(args.values..args.values + 1_000)?).await?;
    if !warm_up.status().is_success() {
        bail!("warm-up failed: {} {}", warm_up.status(), warm_up.text().await?);
    }
    let loaded = post_batches(client, &url, args, args.batch, "added").await?;
    let count: Value = client
        .get(format!("{url}/count"))
        .header("X-API-Key", &args.api_key)
        .send()
        .await?
        .json()
        .await?;
    let mut report = loaded.report("filter-values", args.values, args.batch);
    report["count_after"] = count["count"].clone();
    println!("{report}");
    Ok(())
}

/// `--op dataset-check` setup: a new dataset holding `--values` entries; returns its id.
async fn setup_dataset(
    client: &reqwest::Client,
    base: &str,
    args: &BenchArgs,
) -> anyhow::Result<String> {
    load_dataset(client, base, args, false).await
}

/// Creates a dataset with a fresh name and posts `--values` values in batches of `--batch`
/// (at most 250,000), one request after another; with `report`, prints values per second.
/// The request bodies are serialized before the clock starts. Returns the dataset id.
async fn load_dataset(
    client: &reqwest::Client,
    base: &str,
    args: &BenchArgs,
    report: bool,
) -> anyhow::Result<String> {
    if args.batch == 0 || args.values == 0 {
        bail!("--batch and --values must be greater than 0");
    }
    let batch = args.batch.min(250_000);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let response = client
        .post(format!("{base}/datasets"))
        .header("X-API-Key", &args.api_key)
        .json(&json!({ "name": format!("bench-{stamp}") }))
        .send()
        .await
        .context("creating the dataset")?;
    if !response.status().is_success() {
        bail!("dataset create failed: {} {}", response.status(), response.text().await?);
    }
    let created: Value = response.json().await?;
    let id = created["id"].as_str().context("created dataset has an id")?.to_owned();
    let url = format!("{base}/datasets/{id}/entries");
    let loaded = post_batches(client, &url, args, batch, "count").await?;
    if !report {
        return Ok(id);
    }
    let page: Value = client
        .get(format!("{url}?limit=1"))
        .header("X-API-Key", &args.api_key)
        .send()
        .await?
        .json()
        .await?;
    let mut report = loaded.report("dataset-add", args.values, batch);
    report["total_count_after"] = page["total_count"].clone();
    println!("{report}");
    Ok(id)
}

/// `{"values": [...]}` holding value numbers `range` (see [`filter_value`]).
fn values_body(range: std::ops::Range<usize>) -> anyhow::Result<Vec<u8>> {
    let values: Vec<String> = range.map(filter_value).collect();
    Ok(serde_json::to_vec(&json!({ "values": values }))?)
}

/// `POST url` with the bench key and a JSON `body`.
fn post_json(
    client: &reqwest::Client,
    url: &str,
    args: &BenchArgs,
    body: Vec<u8>,
) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> {
    client
        .post(url)
        .header("X-API-Key", &args.api_key)
        .header("content-type", "application/json")
        .body(body)
        .send()
}

/// What a bulk load measured.
struct Loaded {
    /// Per request, sorted.
    latencies: Vec<Duration>,
    /// The sum of each answer's count field.
    counted: u64,
    seconds: f64,
}

impl Loaded {
    /// The report fields every bulk load prints.
    fn report(&self, op: &str, values: usize, batch: usize) -> Value {
        let ms =
            |d: Option<&Duration>| d.map_or(f64::NAN, |d| (d.as_secs_f64() * 1e6).round() / 1e3);
        json!({
            "op": op,
            "values": values,
            "batch": batch,
            "requests": self.latencies.len(),
            "added": self.counted,
            "seconds": (self.seconds * 1000.0).round() / 1000.0,
            "values_per_s": (values as f64 / self.seconds).round(),
            "batch_p50_ms": ms(self.latencies.get(self.latencies.len() / 2)),
            "batch_max_ms": ms(self.latencies.last()),
        })
    }
}

/// Posts value numbers `0..--values` to `url` in bodies of `batch`, one request after
/// another, summing each answer's `field`. The bodies are serialized before the clock
/// starts, so the time is the server's.
async fn post_batches(
    client: &reqwest::Client,
    url: &str,
    args: &BenchArgs,
    batch: usize,
    field: &str,
) -> anyhow::Result<Loaded> {
    let bodies = (0..args.values)
        .step_by(batch)
        .map(|start| values_body(start..(start + batch).min(args.values)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut latencies = Vec::with_capacity(bodies.len());
    let mut counted = 0u64;
    let started = Instant::now();
    for body in bodies {
        let sent = Instant::now();
        let response = post_json(client, url, args, body).await?;
        let status = response.status();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("batch failed: {status} {answer}");
        }
        latencies.push(sent.elapsed());
        counted += answer[field].as_u64().unwrap_or(0);
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    Ok(Loaded { latencies, counted, seconds })
}

/// Runs load for `length`; returns the latencies of successful requests and the error count.
async fn drive(target: &Arc<Target>, args: &BenchArgs, length: Duration) -> (Vec<Duration>, usize) {
    let permits = Arc::new(Semaphore::new(args.concurrency));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<Option<Duration>>();
    let start = Instant::now();
    let mut sent = 0usize;
    loop {
        if start.elapsed() >= length {
            break;
        }
        let (permit, due) = if args.rate == 0 {
            // Closed loop: send as soon as a worker is free, timed from that moment (a
            // `sleep_until(now)` would still wait for the next 1 ms timer tick).
            let permit = permits.clone().acquire_owned().await.expect("never closed");
            (permit, Instant::now())
        } else {
            let due = start + Duration::from_secs_f64(sent as f64 / f64::from(args.rate));
            if due.duration_since(start) >= length {
                break;
            }
            if due > Instant::now() {
                tokio::time::sleep_until(due.into()).await;
            }
            (permits.clone().acquire_owned().await.expect("never closed"), due)
        };
        let (target, done) = (target.clone(), done_tx.clone());
        tokio::spawn(async move {
            let outcome = target.send(sent).await;
            drop(permit);
            // Measured from the scheduled time: queueing behind a slow server counts.
            let _ = done.send(outcome.ok().map(|()| due.elapsed()));
        });
        sent += 1;
    }
    drop(done_tx);
    let (mut latencies, mut errors) = (Vec::with_capacity(sent), 0);
    while let Some(outcome) = done_rx.recv().await {
        match outcome {
            Some(latency) => latencies.push(latency),
            None => errors += 1,
        }
    }
    (latencies, errors)
}
