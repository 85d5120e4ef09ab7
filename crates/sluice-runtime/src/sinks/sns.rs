//! The notification-topic sink (`sns`): records published to an SNS-compatible topic with
//! the Query API's `PublishBatch` (up to [`MAX_BATCH_ENTRIES`] messages and 256 KiB per
//! request), signed with AWS Signature Version 4 ([`sigv4`]). One message per record: its
//! body is the record's JSON; message attributes `sluice_key` (the stream key) and
//! `sluice_batch_id`. On a FIFO topic (ARN ending `.fifo`) the key is the `MessageGroupId`
//! (a key's records stay in order) and a digest of the key and the record is the
//! `MessageDeduplicationId`. Requests of one batch go one after another, in order.
//!
//! Errors: a record over [`MAX_MESSAGE_BYTES`] is rejected without being sent; an entry the
//! answer lists as failed with `SenderFault` true is rejected (dead-lettered) with its code
//! and message; one failed without sender fault, HTTP 5xx, throttling (`Throttling`,
//! `ThrottledException`, 429) and connection errors hold the source (retried); any other
//! 4xx (bad credentials, a topic that does not exist, no permission) refuses the batch.
//! Neither credentials nor signatures appear in errors.

pub mod sigv4;

use std::net::IpAddr;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sluice_core::pipeline::SnsSinkConfig;
use sluice_core::pipeline::sink::topic_arn_region;

use super::external::{Batch, Sent, Transport, TransportError};
use sigv4::{Credentials, encode};

/// Most messages per `PublishBatch` request.
pub const MAX_BATCH_ENTRIES: usize = 10;
/// Largest message SNS takes (body and attributes), and largest request body.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// Publishes to one topic.
pub struct SnsTransport {
    topic_arn: String,
    region: String,
    endpoint: url::Url,
    credentials: Credentials,
    fifo: bool,
    client: reqwest::Client,
}

impl std::fmt::Debug for SnsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnsTransport")
            .field("topic_arn", &self.topic_arn)
            .field("endpoint", &self.endpoint.as_str())
            .finish_non_exhaustive()
    }
}

/// An SNS client that could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot make the SNS client: {0}")]
pub struct ClientError(String);

impl SnsTransport {
    /// A transport for `config` with `credentials`, sending from `egress` when given.
    ///
    /// # Errors
    /// [`ClientError`] when the endpoint or the region cannot be known, or the HTTP client
    /// cannot be made.
    pub fn new(
        config: &SnsSinkConfig,
        credentials: Credentials,
        egress: Option<IpAddr>,
    ) -> Result<Self, ClientError> {
        let region = config
            .region
            .clone()
            .or_else(|| topic_arn_region(&config.topic_arn).map(str::to_owned))
            .ok_or_else(|| ClientError("no region".to_owned()))?;
        let endpoint = config
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("https://sns.{region}.amazonaws.com/"));
        let endpoint = url::Url::parse(&endpoint)
            .map_err(|_| ClientError("the endpoint does not parse".to_owned()))?;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .local_address(egress)
            .build()
            .map_err(|error| ClientError(error.to_string()))?;
        Ok(Self {
            fifo: config.topic_arn.ends_with(".fifo"),
            topic_arn: config.topic_arn.clone(),
            region,
            endpoint,
            credentials,
            client,
        })
    }

    /// The form body of one `PublishBatch` of `entries` (index in the batch, record).
    fn body(&self, batch_id: &str, entries: &[(usize, &sluice_bus::NewRecord)]) -> String {
        let mut body =
            format!("Action=PublishBatch&Version=2010-03-31&TopicArn={}", encode(&self.topic_arn));
        for (n, (index, record)) in entries.iter().enumerate() {
            let member = format!("PublishBatchRequestEntries.member.{}", n + 1);
            let key = String::from_utf8_lossy(&record.key);
            let message = String::from_utf8_lossy(&record.value);
            body.push_str(&format!("&{member}.Id={index}&{member}.Message={}", encode(&message)));
            for (a, (name, value)) in
                [("sluice_key", key.as_ref()), ("sluice_batch_id", batch_id)].iter().enumerate()
            {
                let entry = format!("{member}.MessageAttributes.entry.{}", a + 1);
                body.push_str(&format!(
                    "&{entry}.Name={name}&{entry}.Value.DataType=String&{entry}.Value.StringValue={}",
                    encode(value)
                ));
            }
            if self.fifo {
                let mut digest = Sha256::new();
                digest.update(&record.key);
                digest.update([0]);
                digest.update(&record.value);
                let dedup: String =
                    digest.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect();
                body.push_str(&format!(
                    "&{member}.MessageGroupId={}&{member}.MessageDeduplicationId={dedup}",
                    encode(&key)
                ));
            }
        }
        body
    }

    async fn publish(&self, body: String, sent: &mut Sent) -> Result<(), TransportError> {
        let content_type = "application/x-www-form-urlencoded; charset=utf-8";
        let host = match self.endpoint.port() {
            Some(port) => format!("{}:{port}", self.endpoint.host_str().unwrap_or_default()),
            None => self.endpoint.host_str().unwrap_or_default().to_owned(),
        };
        let amz_date = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
        let request = sigv4::Request {
            method: "POST",
            host: &host,
            path: self.endpoint.path(),
            query: "",
            content_type,
            body: body.as_bytes(),
        };
        let signed = sigv4::sign(request, &self.credentials, &self.region, "sns", &amz_date);
        let mut http = self
            .client
            .post(self.endpoint.clone())
            .header(reqwest::header::CONTENT_TYPE, content_type);
        for (name, value) in signed {
            http = http.header(name, value);
        }
        let response = http.body(body).send().await.map_err(|error| {
            let what = if error.is_timeout() {
                "timed out"
            } else if error.is_connect() {
                "cannot connect"
            } else {
                "no valid response"
            };
            TransportError::retryable(format!("SNS request failed: {what}"))
        })?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            let code = tag(&text, "Code").unwrap_or_default();
            let message = tag(&text, "Message").unwrap_or_default();
            let what = format!("SNS answered HTTP {}: {code} {message}", status.as_u16());
            let throttled = status.as_u16() == 429 || code.contains("Throttl");
            return if status.is_server_error() || throttled {
                Err(TransportError::retryable(what))
            } else {
                Err(TransportError::rejected(what))
            };
        }
        let failed = section(&text, "Failed").unwrap_or_default();
        let mut retry = None;
        for member in failed.split("<member>").skip(1) {
            let index: Option<usize> = tag(member, "Id").and_then(|id| id.parse().ok());
            let code = tag(member, "Code").unwrap_or_default();
            let message = tag(member, "Message").unwrap_or_default();
            let sender_fault = tag(member, "SenderFault").is_some_and(|f| f == "true");
            match (index, sender_fault) {
                (Some(index), true) => sent
                    .rejected
                    .push((index, format!("SNS refused the message: {code} {message}"))),
                _ => {
                    retry.get_or_insert_with(|| format!("SNS failed a message: {code} {message}"));
                }
            }
        }
        match retry {
            Some(message) => Err(TransportError::retryable(message)),
            None => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl Transport for SnsTransport {
    async fn send(&self, batch: Batch<'_>) -> Result<Sent, TransportError> {
        let mut sent = Sent::default();
        let mut entries: Vec<(usize, &sluice_bus::NewRecord)> =
            Vec::with_capacity(MAX_BATCH_ENTRIES);
        let mut bytes = 0;
        for (index, record) in batch.records.iter().enumerate() {
            let size = record.value.len() + record.key.len() + batch.id.len() + 64;
            if size > MAX_MESSAGE_BYTES {
                sent.rejected.push((index, format!("the record ({size} bytes with attributes) is over SNS's {MAX_MESSAGE_BYTES}-byte message limit")));
                continue;
            }
            if entries.len() == MAX_BATCH_ENTRIES || bytes + size > MAX_MESSAGE_BYTES {
                self.publish(self.body(batch.id, &entries), &mut sent).await?;
                entries.clear();
                bytes = 0;
            }
            entries.push((index, record));
            bytes += size;
        }
        if !entries.is_empty() {
            self.publish(self.body(batch.id, &entries), &mut sent).await?;
        }
        Ok(sent)
    }

    fn connection(&self) -> Value {
        json!({
            "transport": "sns",
            "topic_arn": self.topic_arn,
            "region": self.region,
            "endpoint": self.endpoint.as_str(),
            "fifo": self.fifo,
        })
    }
}

/// The text of the first `<name>…</name>` in `xml`, unescaped.
fn tag(xml: &str, name: &str) -> Option<String> {
    let inner = section(xml, name)?;
    Some(
        inner
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&")
            .trim()
            .to_owned(),
    )
}

/// What is between the first `<name>` and the next `</name>`.
fn section<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&close)? + start;
    Some(&xml[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_entries_are_read_from_the_answer() {
        let xml = "<PublishBatchResponse><PublishBatchResult><Successful><member><Id>0</Id></member></Successful>\
                   <Failed><member><Id>2</Id><Code>InvalidParameter</Code><Message>too &amp; big</Message><SenderFault>true</SenderFault></member></Failed>\
                   </PublishBatchResult></PublishBatchResponse>";
        let failed = section(xml, "Failed").unwrap();
        let member = failed.split("<member>").nth(1).unwrap();
        assert_eq!(tag(member, "Id").as_deref(), Some("2"));
        assert_eq!(tag(member, "Message").as_deref(), Some("too & big"));
    }
}
