//! The webhook sink: records POSTed to the user's endpoint as JSON arrays.
//!
//! - A worker's batch is cut into requests of at most [`MAX_RECORDS_PER_REQUEST`] records and
//!   [`MAX_BODY_BYTES`] of JSON (a single bigger record goes alone), sent one after another so
//!   records of one key arrive in order. The body is `[{"key": …, "value": …}, …]`: the
//!   stream key and the record (JSON, or a string when a record is not JSON).
//! - Headers: `Content-Type: application/json`, `Content-Encoding: gzip` with
//!   `compression: "gzip"`, `X-Sluice-Batch-Id` and `Idempotency-Key` (the same value: the
//!   batch id and the request's index, identical when the batch is sent again), and with
//!   `hash_key` the signature headers of docs/contract.md §Sink: `X-Webhook-Timestamp` (Unix
//!   seconds), `X-Webhook-Nonce` (UUIDv4), `X-Signature-256: sha256=<hex HMAC-SHA256>` of
//!   `<nonce>.<timestamp>.<body>`, keyed with the secret's value; the body is the bytes on
//!   the wire (compressed when gzip is on).
//! - Any 2xx acknowledges the request. 408, 429, 5xx, timeouts ([`REQUEST_TIMEOUT`]) and
//!   connection errors are retried by the worker with backoff and jitter, waiting at least
//!   the response's `Retry-After`; the whole batch is sent again (requests already
//!   acknowledged too: at least once). Any other status (other 4xx, and 3xx: redirects are
//!   not followed) refuses the batch for good: its records are dead-lettered with the status
//!   and up to [`EXCERPT_BYTES`] of the response body, and the pipeline goes on.

use std::io::Write as _;
use std::net::IpAddr;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use sluice_bus::NewRecord;
use sluice_core::pipeline::{WebhookCompression, WebhookSinkConfig};
use sluice_core::secret::SecretValue;

use super::external::{Batch, Sent, Transport, TransportError};

/// Most records in one request.
pub const MAX_RECORDS_PER_REQUEST: usize = 500;
/// Most JSON bytes in one request (before compression).
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// How long one request may take, connecting included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of a refusing response is kept in the dead letters.
pub const EXCERPT_BYTES: usize = 512;

/// Sends records to a webhook.
pub struct WebhookTransport {
    url: String,
    compression: WebhookCompression,
    hash_key: Option<SecretValue>,
    client: reqwest::Client,
}

impl std::fmt::Debug for WebhookTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookTransport")
            .field("url", &self.url)
            .field("signed", &self.hash_key.is_some())
            .finish_non_exhaustive()
    }
}

/// A webhook client that could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot make the webhook client: {0}")]
pub struct ClientError(#[from] reqwest::Error);

impl WebhookTransport {
    /// A transport for `config`, signing with `hash_key` (the value of the secret it names)
    /// and sending from `egress` when given.
    ///
    /// # Errors
    /// When the HTTP client cannot be made (its TLS setup).
    pub fn new(
        config: &WebhookSinkConfig,
        hash_key: Option<SecretValue>,
        egress: Option<IpAddr>,
    ) -> Result<Self, ClientError> {
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
            .local_address(egress)
            .build()?;
        Ok(Self { url: config.url.clone(), compression: config.compression, hash_key, client })
    }

    /// The request bodies of `records`: JSON arrays cut by count and size.
    fn bodies(records: &[NewRecord]) -> Vec<Vec<u8>> {
        let mut bodies = Vec::new();
        let mut body = Vec::with_capacity(64 * 1024);
        let mut count = 0;
        for record in records {
            let entry = entry(record);
            if count > 0
                && (count == MAX_RECORDS_PER_REQUEST
                    || body.len() + entry.len() + 2 > MAX_BODY_BYTES)
            {
                body.push(b']');
                bodies.push(std::mem::take(&mut body));
                count = 0;
            }
            body.push(if count == 0 { b'[' } else { b',' });
            body.extend_from_slice(&entry);
            count += 1;
        }
        if count > 0 {
            body.push(b']');
            bodies.push(body);
        }
        bodies
    }

    async fn post(&self, id: &str, body: Vec<u8>) -> Result<(), TransportError> {
        let body = match self.compression {
            WebhookCompression::None => body,
            WebhookCompression::Gzip => gzip(&body),
        };
        let mut request = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("X-Sluice-Batch-Id", id)
            .header("Idempotency-Key", id);
        if self.compression == WebhookCompression::Gzip {
            request = request.header(reqwest::header::CONTENT_ENCODING, "gzip");
        }
        if let Some(key) = &self.hash_key {
            let timestamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_secs())
                .to_string();
            let nonce = uuid::Uuid::new_v4().to_string();
            request = request
                .header("X-Webhook-Timestamp", &timestamp)
                .header("X-Webhook-Nonce", &nonce)
                .header("X-Signature-256", signature(key, &nonce, &timestamp, &body));
        }
        let response = request.body(body).send().await.map_err(|error| {
            // reqwest's messages carry the URL, which may hold a user's token: keep the kind.
            TransportError::retryable(format!("webhook request failed: {}", error_kind(&error)))
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(parse_retry_after);
        let excerpt = excerpt(response).await;
        let message = format!("webhook answered HTTP {}: {excerpt}", status.as_u16());
        if status.as_u16() == 408 || status.as_u16() == 429 || status.is_server_error() {
            Err(TransportError::Retryable { message, retry_after })
        } else {
            Err(TransportError::rejected(message))
        }
    }
}

#[async_trait::async_trait]
impl Transport for WebhookTransport {
    async fn send(&self, batch: Batch<'_>) -> Result<Sent, TransportError> {
        for (index, body) in Self::bodies(batch.records).into_iter().enumerate() {
            self.post(&format!("{}-{index}", batch.id), body).await?;
        }
        Ok(Sent::default())
    }

    fn connection(&self) -> Value {
        json!({
            "transport": "webhook",
            "url": redact_url(&self.url),
            "signed": self.hash_key.is_some(),
            "compression": match self.compression {
                WebhookCompression::None => "none",
                WebhookCompression::Gzip => "gzip",
            },
            "max_records_per_request": MAX_RECORDS_PER_REQUEST,
            "max_body_bytes": MAX_BODY_BYTES,
        })
    }
}

/// `{"key": …, "value": …}` of one record.
fn entry(record: &NewRecord) -> Vec<u8> {
    let key = String::from_utf8_lossy(&record.key);
    let mut out = Vec::with_capacity(record.value.len() + key.len() + 24);
    out.extend_from_slice(b"{\"key\":");
    serde_json::to_writer(&mut out, &key).expect("writing to a Vec cannot fail");
    out.extend_from_slice(b",\"value\":");
    if serde_json::from_slice::<serde::de::IgnoredAny>(&record.value).is_ok() {
        out.extend_from_slice(&record.value);
    } else {
        let text = String::from_utf8_lossy(&record.value);
        serde_json::to_writer(&mut out, &text).expect("writing to a Vec cannot fail");
    }
    out.push(b'}');
    out
}

/// `sha256=<hex HMAC-SHA256 of "<nonce>.<timestamp>.<body>">`.
pub fn signature(key: &SecretValue, nonce: &str, timestamp: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(nonce.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

fn gzip(body: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    encoder.write_all(body).expect("writing to a Vec cannot fail");
    encoder.finish().expect("writing to a Vec cannot fail")
}

/// `Retry-After` as delta-seconds or an HTTP date.
fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = at.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}

async fn excerpt(response: reqwest::Response) -> String {
    let bytes = response.bytes().await.unwrap_or_default();
    let cut = &bytes[..bytes.len().min(EXCERPT_BYTES)];
    let text = String::from_utf8_lossy(cut);
    let text = text.trim();
    if text.is_empty() { "(empty body)".to_owned() } else { text.to_owned() }
}

/// What went wrong with a request, without its URL.
fn error_kind(error: &reqwest::Error) -> &'static str {
    if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "cannot connect"
    } else if error.is_request() || error.is_body() {
        "the connection broke while sending"
    } else {
        "no valid response"
    }
}

/// The URL without its user info and query (which may carry tokens).
fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            if parsed.query().is_some() {
                parsed.set_query(Some("…"));
            }
            parsed.to_string()
        }
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, value: &str) -> NewRecord {
        NewRecord::new(key.as_bytes().to_vec(), value.as_bytes().to_vec())
    }

    #[test]
    fn bodies_are_json_arrays_cut_by_count_and_size_in_order() {
        let records: Vec<NewRecord> =
            (0..1203).map(|i| record(&format!("k{i}"), &format!("{{\"i\":{i}}}"))).collect();
        let bodies = WebhookTransport::bodies(&records);
        assert_eq!(bodies.len(), 3);
        let mut seen = Vec::new();
        for body in &bodies {
            let items: Vec<Value> = serde_json::from_slice(body).unwrap();
            assert!(items.len() <= MAX_RECORDS_PER_REQUEST);
            seen.extend(items);
        }
        assert_eq!(seen.len(), 1203);
        assert_eq!(seen[1202], json!({"key": "k1202", "value": {"i": 1202}}));
        let big = "x".repeat(MAX_BODY_BYTES / 3);
        let records: Vec<NewRecord> =
            (0..4).map(|i| record(&format!("k{i}"), &format!("\"{big}\""))).collect();
        let bodies = WebhookTransport::bodies(&records);
        assert_eq!(bodies.len(), 2);
        assert!(bodies.iter().all(|b| b.len() <= MAX_BODY_BYTES));
    }

    #[test]
    fn a_record_that_is_not_json_is_sent_as_a_string() {
        let body = WebhookTransport::bodies(&[record("k", "not json")]).remove(0);
        let items: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(items, json!([{"key": "k", "value": "not json"}]));
    }

    #[test]
    fn the_signature_is_the_hmac_of_nonce_timestamp_and_body() {
        // Independently computed: printf '%s' 'n.1700000000.[1]' | openssl dgst -sha256 -hmac key
        let signed = signature(&SecretValue::new("key".to_owned()), "n", "1700000000", b"[1]");
        assert_eq!(
            signed,
            "sha256=7783f047dc62c09a6df58715f1561368b2578ae55af908563474fbf080de9b09"
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        assert_eq!(parse_retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon"), None);
    }

    #[test]
    fn connection_details_hide_user_info_and_query() {
        assert_eq!(
            redact_url("https://user:pw@example.com/hook?token=abc"),
            "https://example.com/hook?%E2%80%A6"
        );
    }
}
