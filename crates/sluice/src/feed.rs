//! `sluice feed`: generated chain records sent to a running server's ingest endpoint,
//! `POST {url}/api/v1/streams/{chain}/{entity}/records` (NDJSON), for demos and load.
//!
//! Open loop: record `i` is due at `start + i / rate` whatever the server does. Requests go
//! out one at a time, so the records of a key arrive in the order they were generated; while
//! the server is slower than the rate, the backlog goes out in full `--batch` requests until
//! it catches up.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_feed::{Generator, ndjson_batch};
use tracing::{info, warn};

/// How long records may wait to be sent together while the feed keeps up.
const SEND_WINDOW: Duration = Duration::from_millis(100);
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Args)]
pub struct FeedArgs {
    /// Chain of the stream (`base`, `polygon`, `ethereum`, `abstract`, `solana`, `hyperliquid`).
    #[arg(long)]
    chain: String,
    /// Entity of the stream (`log`, `erc20_token_transfer`, `nonvoting_transaction`, `fill`...).
    #[arg(long)]
    entity: String,
    /// Send to the stream's zerolag (pre-finality) variant.
    #[arg(long)]
    zerolag: bool,
    /// Base address of the server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// API key to send (X-API-Key).
    #[arg(long, env = "SLUICE_API_KEY")]
    api_key: Option<String>,
    /// Records per second (open loop); 0 sends as fast as the server accepts.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Stop after this many records (default: run until Ctrl-C).
    #[arg(long)]
    count: Option<u64>,
    /// Generator seed: feeds with different seeds carry different hashes and accounts, so
    /// their records have different keys. Default: a new random seed per run (printed in the
    /// report); give one to repeat a run's records exactly.
    #[arg(long)]
    seed: Option<u64>,
    /// Most records per request.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    batch: u64,
}

fn endpoint(args: &FeedArgs) -> String {
    let base = args.url.trim_end_matches('/');
    let query = if args.zerolag { "?zerolag=true" } else { "" };
    format!("{base}/api/v1/streams/{}/{}/records{query}", args.chain, args.entity)
}

/// How many records to send now: all that are due after `elapsed` at `rate` and not `sent`
/// yet, at most `batch` and never past `limit`; at least one (the caller waited for it).
fn records_due(elapsed: Duration, rate: f64, sent: u64, limit: u64, batch: u64) -> u64 {
    // Record `i` is due at `i / rate`, so record 0 is due at once.
    let due = (elapsed.as_secs_f64() * rate) as u64 + 1;
    due.min(limit).saturating_sub(sent).clamp(1, batch)
}

/// A seed no earlier run is likely to have used.
pub(crate) fn random_seed() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    // `RandomState` is seeded from the OS's randomness once per process.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

pub async fn run(args: FeedArgs) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(random_seed);
    let mut generator = Generator::new(&args.chain, &args.entity, seed)?;
    let endpoint = endpoint(&args);
    let client = reqwest::Client::new();
    let limit = args.count.unwrap_or(u64::MAX);
    let rate = f64::from(args.rate);
    // Records per request while on schedule: what falls due within one send window.
    let window = if args.rate == 0 {
        args.batch
    } else {
        ((rate * SEND_WINDOW.as_secs_f64()).ceil() as u64).clamp(1, args.batch)
    };

    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        match tokio::signal::ctrl_c().await {
            Ok(()) => {
                let _ = stop_tx.send(true);
            }
            Err(error) => {
                warn!(%error, "cannot listen for Ctrl-C; stop the feed with --count");
                // Keep the sender alive: a dropped sender would read as a stop.
                std::future::pending::<()>().await;
            }
        }
    });

    info!(endpoint, rate = args.rate, seed, "feeding");
    let started = Instant::now();
    let (mut sent, mut accepted) = (0u64, 0u64);
    let mut last_progress = started;
    while sent < limit && !*stop.borrow() {
        let count = if args.rate == 0 {
            args.batch.min(limit - sent)
        } else {
            // Wait until a window of records is due, then send all that are due.
            let last_of_window = (sent + window).min(limit) - 1;
            let due_at = started + Duration::from_secs_f64(last_of_window as f64 / rate);
            tokio::select! {
                () = tokio::time::sleep_until(due_at.into()) => {}
                _ = stop.changed() => break,
            }
            records_due(started.elapsed(), rate, sent, limit, args.batch)
        };
        let body = ndjson_batch(&mut generator, count as usize, chrono::Utc::now());
        let mut request = client
            .post(&endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
            .body(body);
        if let Some(key) = &args.api_key {
            request = request.header("X-API-Key", key);
        }
        let stopped = |cause: String| {
            anyhow::anyhow!(
                "feed stopped on an error after {sent} records sent, {accepted} accepted \
                 (seed {seed}): {cause}"
            )
        };
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => return Err(stopped(format!("sending to {endpoint}: {error}"))),
        };
        let status = response.status();
        let text = match response.text().await {
            Ok(text) => text,
            Err(error) => return Err(stopped(format!("reading the ingest response: {error}"))),
        };
        if !status.is_success() {
            return Err(stopped(format!("ingest answered {status}: {text}")));
        }
        sent += count;
        match serde_json::from_str::<Value>(&text).ok().and_then(|v| v["accepted"].as_u64()) {
            Some(n) => accepted += n,
            None => warn!(body = %text, "ingest response has no accepted count"),
        }
        if last_progress.elapsed() >= PROGRESS_EVERY {
            last_progress = Instant::now();
            info!(sent, accepted, seconds = started.elapsed().as_secs(), "feed progress");
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let report = json!({
        "chain": args.chain,
        "entity": args.entity,
        "zerolag": args.zerolag,
        "seed": seed,
        "sent": sent,
        "accepted": accepted,
        "seconds": (seconds * 1000.0).round() / 1000.0,
        "records_per_second": if seconds > 0.0 { (sent as f64 / seconds * 10.0).round() / 10.0 } else { 0.0 },
    });
    println!("{report}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::extract::{RawQuery, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;

    use super::*;

    #[derive(Default)]
    struct Seen {
        lines: Vec<Value>,
        requests: usize,
        queries: Vec<Option<String>>,
        content_types: Vec<String>,
        keys: Vec<String>,
    }

    type Shared = Arc<Mutex<Seen>>;

    async fn ingest(
        State(seen): State<Shared>,
        RawQuery(query): RawQuery,
        headers: HeaderMap,
        body: String,
    ) -> (StatusCode, String) {
        let mut seen = seen.lock().unwrap();
        seen.requests += 1;
        seen.queries.push(query);
        let header = |name: &str| {
            headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
        };
        seen.content_types.push(header("content-type"));
        seen.keys.push(header("x-api-key"));
        let lines: Vec<Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let accepted = lines.len();
        seen.lines.extend(lines);
        (StatusCode::OK, json!({ "accepted": accepted }).to_string())
    }

    async fn server(router: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        format!("http://{address}/")
    }

    fn args(url: String) -> FeedArgs {
        FeedArgs {
            chain: "base".into(),
            entity: "erc20_token_transfer".into(),
            zerolag: false,
            url,
            api_key: None,
            rate: 0,
            count: Some(250),
            seed: Some(1),
            batch: 100,
        }
    }

    #[test]
    fn endpoint_joins_the_url_stream_and_zerolag_query() {
        let mut a = args("http://127.0.0.1:8080/".into());
        assert_eq!(
            endpoint(&a),
            "http://127.0.0.1:8080/api/v1/streams/base/erc20_token_transfer/records"
        );
        a.zerolag = true;
        assert!(endpoint(&a).ends_with("/records?zerolag=true"));
    }

    #[test]
    fn records_due_follow_the_schedule_within_batch_and_count() {
        let at = Duration::from_millis;
        assert_eq!(records_due(at(0), 100.0, 0, u64::MAX, 500), 1);
        assert_eq!(records_due(at(995), 100.0, 0, u64::MAX, 500), 100);
        // A backlog goes out in full batches.
        assert_eq!(records_due(at(60_000), 100.0, 10, u64::MAX, 500), 500);
        assert_eq!(records_due(at(60_000), 100.0, 240, 250, 500), 10);
        // Never zero: the caller waited for the next record to fall due.
        assert_eq!(records_due(at(0), 100.0, 5, u64::MAX, 500), 1);
    }

    #[tokio::test]
    async fn sends_count_records_as_ndjson_batches_with_key_and_zerolag() {
        let seen = Shared::default();
        let router = axum::Router::new()
            .route("/api/v1/streams/base/erc20_token_transfer/records", post(ingest))
            .with_state(seen.clone());
        let mut feed = args(server(router).await);
        feed.zerolag = true;
        feed.api_key = Some("sk-test".into());
        run(feed).await.unwrap();

        let seen = seen.lock().unwrap();
        assert_eq!(seen.lines.len(), 250);
        assert_eq!(seen.requests, 3, "batches of at most 100");
        assert!(seen.queries.iter().all(|q| q.as_deref() == Some("zerolag=true")));
        assert!(seen.content_types.iter().all(|c| c == "application/x-ndjson"));
        assert!(seen.keys.iter().all(|k| k == "sk-test"));
        for line in &seen.lines {
            let record = line.as_object().unwrap();
            assert!(sluice_core::streams::record_key("erc20_token_transfer", record).is_ok());
        }
    }

    #[tokio::test]
    async fn paced_feed_sends_small_batches_in_generation_order() {
        let seen = Shared::default();
        let router = axum::Router::new()
            .route("/api/v1/streams/base/erc20_token_transfer/records", post(ingest))
            .with_state(seen.clone());
        let mut feed = args(server(router).await);
        feed.rate = 2_000;
        feed.count = Some(300);
        run(feed).await.unwrap();

        let seen = seen.lock().unwrap();
        assert_eq!(seen.lines.len(), 300);
        // A 100 ms window at 2,000/s is 200 records: pacing splits the 300 over requests.
        assert!(seen.requests >= 2, "{} requests", seen.requests);
        let blocks: Vec<u64> =
            seen.lines.iter().map(|l| l["block_number"].as_u64().unwrap()).collect();
        assert!(blocks.windows(2).all(|w| w[0] <= w[1]), "records arrive in order");
    }

    #[tokio::test]
    async fn an_error_status_fails_the_feed_with_the_response_body() {
        let router = axum::Router::new().route(
            "/api/v1/streams/base/erc20_token_transfer/records",
            post(|| async { (StatusCode::NOT_FOUND, r#"{"detail":"no such stream"}"#) }),
        );
        let error = run(args(server(router).await)).await.unwrap_err().to_string();
        assert!(error.contains("404"), "{error}");
        assert!(error.contains("no such stream"), "{error}");
        assert!(error.contains("0 accepted"), "{error}");
    }

    #[tokio::test]
    async fn a_feed_stopped_by_an_error_says_how_many_records_were_accepted() {
        // Accepts two requests (100 records each, 60 of each counted as accepted), then 503.
        let calls = Arc::new(Mutex::new(0));
        let router = axum::Router::new().route(
            "/api/v1/streams/base/erc20_token_transfer/records",
            post(move || {
                let calls = calls.clone();
                async move {
                    let mut calls = calls.lock().unwrap();
                    *calls += 1;
                    if *calls <= 2 {
                        (StatusCode::OK, r#"{"accepted":60}"#.to_owned())
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, r#"{"detail":"busy"}"#.to_owned())
                    }
                }
            }),
        );
        let error = run(args(server(router).await)).await.unwrap_err().to_string();
        assert!(error.contains("200 records sent, 120 accepted"), "{error}");
        assert!(error.contains("503") && error.contains("busy"), "{error}");
        // A server that is gone: the same report.
        let mut gone = args("http://127.0.0.1:9".into());
        gone.count = Some(10);
        let error = run(gone).await.unwrap_err().to_string();
        assert!(error.contains("0 records sent, 0 accepted"), "{error}");
    }

    #[tokio::test]
    async fn runs_without_a_seed_send_new_keys_and_a_given_seed_repeats_them() {
        let keys = |seed: Option<u64>| async move {
            let seen = Shared::default();
            let router = axum::Router::new()
                .route("/api/v1/streams/base/erc20_token_transfer/records", post(ingest))
                .with_state(seen.clone());
            let mut feed = args(server(router).await);
            feed.seed = seed;
            feed.count = Some(20);
            run(feed).await.unwrap();
            let seen = seen.lock().unwrap();
            seen.lines
                .iter()
                .map(|line| {
                    sluice_core::streams::record_key(
                        "erc20_token_transfer",
                        line.as_object().unwrap(),
                    )
                    .unwrap()
                })
                .collect::<std::collections::BTreeSet<String>>()
        };
        let (first, second) = (keys(None).await, keys(None).await);
        assert_eq!(first.len(), 20);
        assert!(first.is_disjoint(&second), "a second default run repeats keys");
        assert_eq!(keys(Some(7)).await, keys(Some(7)).await);
    }

    #[tokio::test]
    async fn an_unknown_entity_fails_before_sending() {
        let mut feed = args("http://127.0.0.1:9".into());
        feed.entity = "transaction".into();
        let error = run(feed).await.unwrap_err().to_string();
        assert!(error.contains("unknown entity"), "{error}");
    }
}
