//! A JSON-RPC 2.0 client over HTTP for EVM nodes: batched requests, bounded concurrency, a
//! request-rate limit, and retries with exponential backoff and jitter on rate limits (429),
//! server errors (5xx), timeouts and connection failures, honouring `Retry-After`.
//!
//! Providers answer a batch in any order and may fail single calls of it; answers are matched
//! back by `id`, and a call that failed with a retryable JSON-RPC error is retried with the
//! whole batch (reads are idempotent).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

use crate::ChainError;

/// How the client talks to one node.
#[derive(Debug, Clone)]
pub struct RpcSettings {
    /// Requests (HTTP requests, a batch counting once) in flight at most.
    pub max_concurrency: usize,
    /// HTTP requests per second at most (0: unlimited).
    pub requests_per_second: f64,
    /// Calls per batch request at most.
    pub max_batch: usize,
    /// One HTTP request's time limit.
    pub timeout: Duration,
    /// Attempts per request before the error is returned (at least 1).
    pub max_attempts: u32,
    /// First backoff; doubled per attempt up to `max_backoff`, with full jitter.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RpcSettings {
    fn default() -> Self {
        Self {
            max_concurrency: 8,
            requests_per_second: 0.0,
            max_batch: 100,
            timeout: Duration::from_secs(30),
            max_attempts: 8,
            base_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
        }
    }
}

/// One JSON-RPC call: method and params.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: &'static str,
    pub params: Value,
}

impl Call {
    pub fn new(method: &'static str, params: Value) -> Self {
        Self { method, params }
    }
}

/// The JSON-RPC error object a node answered a call with.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeError {
    pub code: i64,
    pub message: String,
}

impl NodeError {
    /// This answer to `method` as the ingester's error.
    pub fn into_error(self, method: &'static str) -> ChainError {
        ChainError::Node { method, code: self.code, message: self.message }
    }

    /// Errors that say "ask for less" on `eth_getLogs`: providers word these differently
    /// (Alchemy, Infura, QuickNode, Geth, Erigon), so the message is what tells them apart.
    pub fn is_range_too_large(&self) -> bool {
        let message = self.message.to_ascii_lowercase();
        [
            "too many",
            "range",
            "limit exceeded",
            "response size",
            "query returned more than",
            "exceed",
            "block range",
        ]
        .iter()
        .any(|needle| message.contains(needle))
            || self.code == -32005
    }

    /// Rate-limit and transient node errors worth retrying as the same call.
    fn is_retryable(&self) -> bool {
        let message = self.message.to_ascii_lowercase();
        self.code == 429
            || self.code == -32603 && message.contains("timeout")
            || message.contains("rate limit")
            || message.contains("header not found")
            || message.contains("try again")
    }
}

/// Counters a status page shows.
#[derive(Debug, Default)]
pub struct RpcCounters {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub retries: AtomicU64,
    /// The last attempt's failure while requests fail, `None` once one succeeds: the status
    /// shows it at once, not only when a step gives up after its retries (~20 s).
    failing: std::sync::Mutex<Option<String>>,
}

impl RpcCounters {
    /// Why the last request failed, while no later one has succeeded.
    pub fn failing(&self) -> Option<String> {
        self.failing.lock().expect("the failure lock is never poisoned").clone()
    }

    fn set_failing(&self, failure: Option<String>) {
        *self.failing.lock().expect("the failure lock is never poisoned") = failure;
    }
}

/// A JSON-RPC client for one node URL.
#[derive(Clone)]
pub struct RpcClient {
    http: reqwest::Client,
    url: String,
    settings: RpcSettings,
    permits: Arc<Semaphore>,
    next_request: Arc<Mutex<Instant>>,
    next_id: Arc<AtomicU64>,
    counters: Arc<RpcCounters>,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient").field("url", &redact_url(&self.url)).finish_non_exhaustive()
    }
}

impl RpcClient {
    /// # Errors
    /// [`ChainError::Config`] when the HTTP client cannot be built.
    pub fn new(url: &str, settings: RpcSettings) -> Result<Self, ChainError> {
        let http = reqwest::Client::builder()
            .timeout(settings.timeout)
            .build()
            .map_err(|error| ChainError::Config(format!("building the HTTP client: {error}")))?;
        Ok(Self {
            http,
            url: url.to_owned(),
            permits: Arc::new(Semaphore::new(settings.max_concurrency.max(1))),
            settings,
            next_request: Arc::new(Mutex::new(Instant::now())),
            next_id: Arc::new(AtomicU64::new(1)),
            counters: Arc::new(RpcCounters::default()),
        })
    }

    pub fn counters(&self) -> &Arc<RpcCounters> {
        &self.counters
    }

    /// The URL with credentials hidden, for logs.
    pub fn display_url(&self) -> String {
        redact_url(&self.url)
    }

    /// One call; a node error is returned as `Ok(Err(..))` so callers can react to it
    /// (a range too large), transport failures after every retry as `Err`.
    ///
    /// # Errors
    /// [`ChainError::Rpc`] once retries are exhausted.
    pub async fn call(&self, call: Call) -> Result<Result<Value, NodeError>, ChainError> {
        let mut answers = self.batch(vec![call]).await?;
        Ok(answers.pop().expect("one answer per call"))
    }

    /// [`RpcClient::call`] with the result left as JSON text.
    ///
    /// # Errors
    /// [`ChainError::Rpc`] once retries are exhausted.
    pub async fn call_raw(&self, call: Call) -> Result<Result<RawResult, NodeError>, ChainError> {
        let mut answers = self.batch_raw(vec![call]).await?;
        Ok(answers.pop().expect("one answer per call"))
    }

    /// Like [`RpcClient::call`], a node error being an error too.
    ///
    /// # Errors
    /// [`ChainError::Rpc`] or [`ChainError::Node`].
    pub async fn request(&self, method: &'static str, params: Value) -> Result<Value, ChainError> {
        self.call(Call::new(method, params)).await?.map_err(|error| error.into_error(method))
    }

    /// Many calls, sent as batches of at most `max_batch` concurrently (bounded by the
    /// client's concurrency), answers in call order.
    ///
    /// # Errors
    /// [`ChainError::Rpc`] once retries of a batch are exhausted.
    pub async fn batch(
        &self,
        calls: Vec<Call>,
    ) -> Result<Vec<Result<Value, NodeError>>, ChainError> {
        let answers = self.batch_raw(calls).await?;
        answers
            .into_iter()
            .map(|answer| match answer {
                Ok(raw) => {
                    serde_json::from_str(raw.get()).map(Ok).map_err(|error| ChainError::Rpc {
                        url: self.display_url(),
                        reason: format!("unreadable answer: {error}"),
                    })
                }
                Err(error) => Ok(Err(error)),
            })
            .collect()
    }

    /// [`RpcClient::batch`] with each result left as JSON text, for the caller to parse into
    /// its own types (no `Value` tree for big answers).
    ///
    /// # Errors
    /// [`ChainError::Rpc`] once retries of a batch are exhausted.
    pub async fn batch_raw(
        &self,
        calls: Vec<Call>,
    ) -> Result<Vec<Result<RawResult, NodeError>>, ChainError> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let chunks: Vec<Vec<Call>> =
            calls.chunks(self.settings.max_batch.max(1)).map(<[Call]>::to_vec).collect();
        let answers = futures_util::future::try_join_all(
            chunks.into_iter().map(|chunk| self.send_with_retries(chunk)),
        )
        .await?;
        Ok(answers.into_iter().flatten().collect())
    }

    async fn send_with_retries(
        &self,
        calls: Vec<Call>,
    ) -> Result<Vec<Result<RawResult, NodeError>>, ChainError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = self.send_once(&calls).await;
            let (retry_after, reason) = match outcome {
                Ok(answers) => {
                    match answers.iter().find_map(|a| a.as_ref().err().filter(|e| e.is_retryable()))
                    {
                        None => {
                            self.counters.set_failing(None);
                            return Ok(answers);
                        }
                        Some(error) => {
                            (None, format!("node error {}: {}", error.code, error.message))
                        }
                    }
                }
                Err(Failure::Fatal(reason)) => {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    let error = ChainError::Rpc { url: self.display_url(), reason };
                    self.counters.set_failing(Some(error.to_string()));
                    return Err(error);
                }
                Err(Failure::Retryable { reason, retry_after }) => (retry_after, reason),
            };
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            self.counters.set_failing(Some(
                ChainError::Rpc { url: self.display_url(), reason: reason.clone() }.to_string(),
            ));
            if attempt >= self.settings.max_attempts.max(1) {
                return Err(ChainError::Rpc {
                    url: self.display_url(),
                    reason: format!("{reason} (after {attempt} attempts)"),
                });
            }
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            let delay = retry_after.unwrap_or_else(|| self.backoff(attempt));
            tracing::debug!(url = %self.display_url(), attempt, %reason, ?delay, "retrying an RPC request");
            tokio::time::sleep(delay).await;
        }
    }

    /// Full jitter: a random delay up to the capped exponential backoff.
    fn backoff(&self, attempt: u32) -> Duration {
        let cap = self
            .settings
            .base_backoff
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.settings.max_backoff);
        let millis = cap.as_millis().max(1) as u64;
        Duration::from_millis(rand::thread_rng().gen_range(millis / 2..=millis))
    }

    async fn pace(&self) {
        if self.settings.requests_per_second <= 0.0 {
            return;
        }
        let interval = Duration::from_secs_f64(1.0 / self.settings.requests_per_second);
        let wait_until = {
            let mut next = self.next_request.lock().await;
            let now = Instant::now();
            let slot = (*next).max(now);
            *next = slot + interval;
            slot
        };
        tokio::time::sleep_until(wait_until).await;
    }

    async fn send_once(
        &self,
        calls: &[Call],
    ) -> Result<Vec<Result<RawResult, NodeError>>, Failure> {
        let _permit = self.permits.acquire().await.expect("the semaphore is never closed");
        self.pace().await;
        let first_id = self.next_id.fetch_add(calls.len() as u64, Ordering::Relaxed);
        let body: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                json!({"jsonrpc": "2.0", "id": first_id + i as u64, "method": call.method, "params": call.params})
            })
            .collect();
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let response = self.http.post(&self.url).json(&body).send().await.map_err(|error| {
            Failure::Retryable { reason: transport_reason(&error), retry_after: None }
        })?;
        let status = response.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<u64>().ok())
                .map(|seconds| Duration::from_secs(seconds.min(60)));
            return Err(Failure::Retryable { reason: format!("HTTP {status}"), retry_after });
        }
        if !status.is_success() {
            return Err(Failure::Fatal(format!("HTTP {status}")));
        }
        let bytes = response.bytes().await.map_err(|error| Failure::Retryable {
            reason: transport_reason(&error),
            retry_after: None,
        })?;
        let unreadable = |error: serde_json::Error| Failure::Retryable {
            reason: format!("unreadable answer: {error}"),
            retry_after: None,
        };
        // The results stay raw JSON text, slices of the one body: callers parse them into
        // their own types, and the big ones (`eth_getLogs`) are neither copied nor turned
        // into a `Value` tree.
        let body = Arc::new(String::from_utf8(bytes.into()).map_err(|_| Failure::Retryable {
            reason: "unreadable answer: not UTF-8".to_owned(),
            retry_after: None,
        })?);
        let items: Vec<Answer<'_>> = match serde_json::from_str(&body) {
            Ok(items) => items,
            // A node that refuses the whole batch answers one error object.
            Err(_) => {
                let answer: Value = serde_json::from_str(&body).map_err(unreadable)?;
                let error = answer.as_object().and_then(|o| node_error(o.get("error")));
                return match error {
                    Some(error) if error.is_retryable() => Err(Failure::Retryable {
                        reason: format!("node error {}: {}", error.code, error.message),
                        retry_after: None,
                    }),
                    Some(error) => Ok(calls.iter().map(|_| Err(error.clone())).collect()),
                    None => Err(Failure::Fatal("answer is not a JSON-RPC batch".to_owned())),
                };
            }
        };
        let mut answers: Vec<Option<Result<RawResult, NodeError>>> =
            (0..calls.len()).map(|_| None).collect();
        for item in items {
            let Some(index) = item
                .id
                .as_ref()
                .and_then(Value::as_u64)
                .and_then(|id| id.checked_sub(first_id))
                .filter(|index| *index < calls.len() as u64)
            else {
                continue;
            };
            let answer = match node_error(item.error.as_ref()) {
                Some(error) => Err(error),
                None => Ok(item.result.map_or_else(RawResult::null, |raw| {
                    let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
                    RawResult { body: body.clone(), span: start..start + raw.get().len() }
                })),
            };
            answers[index as usize] = Some(answer);
        }
        if answers.iter().any(Option::is_none) {
            return Err(Failure::Retryable {
                reason: "the batch answer lacks some calls".to_owned(),
                retry_after: None,
            });
        }
        Ok(answers.into_iter().map(|a| a.expect("checked above")).collect())
    }
}

/// One call's answer in a batch, its result left as JSON text.
#[derive(serde::Deserialize)]
struct Answer<'a> {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<Value>,
}

/// One call's result as JSON text: a slice of its batch's answer, which the batch's results
/// share rather than each copying theirs out.
#[derive(Debug, Clone)]
pub struct RawResult {
    body: Arc<String>,
    span: std::ops::Range<usize>,
}

impl RawResult {
    pub fn get(&self) -> &str {
        &self.body[self.span.clone()]
    }

    fn null() -> Self {
        Self { body: Arc::new("null".to_owned()), span: 0..4 }
    }
}

enum Failure {
    Retryable { reason: String, retry_after: Option<Duration> },
    Fatal(String),
}

fn node_error(value: Option<&Value>) -> Option<NodeError> {
    let error = value?.as_object()?;
    Some(NodeError {
        code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
        message: error.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
    })
}

/// reqwest's message, without the URL it embeds (which may carry an API key).
fn transport_reason(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "connection failed"
    } else if error.is_body() || error.is_decode() {
        "reading the answer failed"
    } else {
        "request failed"
    };
    let error = error.without_url_ref();
    format!("{kind}: {error}")
}

trait WithoutUrl {
    fn without_url_ref(&self) -> String;
}

impl WithoutUrl for reqwest::Error {
    fn without_url_ref(&self) -> String {
        let mut text = self.to_string();
        if let Some(url) = self.url() {
            text = text.replace(url.as_str(), "<rpc url>");
        }
        text
    }
}

/// A URL with what may be a secret hidden: the password, the query string, and path
/// segments of 16 characters or more (providers put API keys there:
/// `https://base-mainnet.g.alchemy.com/v2/<key>`). Text that does not parse is shown the
/// same way, so an error can say what was typed.
pub fn redact_url(url: &str) -> String {
    sluice_core::redaction::redact_url(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_keys_in_logs() {
        assert_eq!(
            redact_url("https://base-mainnet.g.alchemy.com/v2/abcdefghijklmnopqrstuvwxyz"),
            "https://base-mainnet.g.alchemy.com/v2/***"
        );
        assert_eq!(
            redact_url("https://user:pw@node.example/rpc"),
            "https://user:***@node.example/rpc"
        );
        assert_eq!(redact_url("https://node.example/?apikey=secret"), "https://node.example?***");
        assert_eq!(redact_url("http://127.0.0.1:8545"), "http://127.0.0.1:8545");
        assert_eq!(redact_url("not-a-url"), "not-a-url");
    }

    #[test]
    fn range_errors_of_common_providers_are_recognised() {
        let too_many = |message: &str| NodeError { code: -32602, message: message.to_owned() };
        assert!(too_many("query returned more than 10000 results").is_range_too_large());
        assert!(too_many("Log response size exceeded.").is_range_too_large());
        assert!(too_many("eth_getLogs is limited to a 10,000 range").is_range_too_large());
        assert!(!too_many("invalid argument 0: hex string without 0x prefix").is_range_too_large());
    }
}
