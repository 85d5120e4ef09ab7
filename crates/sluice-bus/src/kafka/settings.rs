//! How Sluice reaches a Kafka cluster: parsed from a `kafka://` URL.
//!
//! `kafka://host1:9092,host2:9092?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-512&sasl.username=u&sasl.password=p`
//!
//! The query carries the client settings a cluster may need, by their librdkafka names;
//! only the names in [`CLIENT_SETTINGS`] are accepted, so a typo is an error at start rather
//! than a setting silently ignored. `topic_prefix` (also `--bus-topic-prefix`) is put in
//! front of every topic and consumer group name, so several installations can share a
//! cluster; `replication_factor` sets new topics' replication (default: the broker's).

use std::collections::BTreeMap;
use std::fmt;

use crate::BusError;

/// The librdkafka settings a `kafka://` URL may carry.
pub const CLIENT_SETTINGS: &[&str] = &[
    "security.protocol",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "client.id",
];

/// `fetch_wait_ms` unless the URL sets it.
pub const DEFAULT_FETCH_WAIT_MS: u32 = 100;

/// Settings whose values are never shown.
const SECRET_SETTINGS: &[&str] = &["sasl.password", "ssl.key.password", "consumer_password"];

/// A Kafka cluster and how to talk to it.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaSettings {
    /// `host:port,host:port`.
    pub bootstrap_servers: String,
    /// Put in front of every topic and group name ("" for none).
    pub topic_prefix: String,
    /// Replication factor of the topics Sluice creates; `-1` lets the broker decide.
    pub replication_factor: i32,
    /// Client settings by librdkafka name (security, SASL, TLS).
    pub client: BTreeMap<String, String>,
    /// SASL credentials handed to the readers of managed sinks (a read-only user the
    /// operator made), when the cluster needs them; never Sluice's own.
    pub consumer_username: Option<String>,
    pub consumer_password: Option<String>,
    /// How long a broker may hold a reader's fetch when nothing is new (librdkafka's
    /// `fetch.wait.max.ms`). Kafka answers as soon as records arrive, so this only bounds
    /// idle requests; a broker that waits out the time instead (tansu) adds up to it to
    /// every hop's latency.
    pub fetch_wait_ms: u32,
}

impl KafkaSettings {
    /// Settings for `bootstrap_servers` with nothing else set.
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            topic_prefix: String::new(),
            replication_factor: -1,
            client: BTreeMap::new(),
            consumer_username: None,
            consumer_password: None,
            fetch_wait_ms: DEFAULT_FETCH_WAIT_MS,
        }
    }

    /// Parses `kafka://host:port[,host:port…][?name=value&…]`.
    ///
    /// # Errors
    /// [`BusError::InvalidUrl`] saying what is wrong (never echoing a password).
    pub fn parse(url: &str) -> Result<Self, BusError> {
        let invalid = |reason: String| BusError::InvalidUrl { url: redact_url(url), reason };
        let rest = url
            .strip_prefix("kafka://")
            .ok_or_else(|| invalid("a Kafka bus URL starts with kafka://".to_owned()))?;
        let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
        let hosts = hosts.trim_end_matches('/');
        if hosts.is_empty() {
            return Err(invalid("no broker address (kafka://host:port)".to_owned()));
        }
        for host in hosts.split(',') {
            let valid = host.rsplit_once(':').is_some_and(|(name, port)| {
                !name.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !valid {
                return Err(invalid(format!("{host:?} is not host:port")));
            }
        }
        let mut settings = Self::new(hosts);
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value).ok_or_else(|| {
                invalid(format!("the value of {name} is not valid percent-encoding"))
            })?;
            match name {
                "topic_prefix" => {
                    let valid =
                        value.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
                    if !valid || value.len() > 64 {
                        return Err(invalid(
                            "topic_prefix is up to 64 of [A-Za-z0-9._-]".to_owned(),
                        ));
                    }
                    settings.topic_prefix = value;
                }
                "replication_factor" => {
                    settings.replication_factor = value
                        .parse()
                        .ok()
                        .filter(|n: &i32| *n == -1 || (1..=32).contains(n))
                        .ok_or_else(|| invalid("replication_factor is -1 or 1 to 32".to_owned()))?;
                }
                "fetch_wait_ms" => {
                    settings.fetch_wait_ms = value
                        .parse()
                        .ok()
                        .filter(|ms| (1..=10_000).contains(ms))
                        .ok_or_else(|| invalid("fetch_wait_ms is 1 to 10000".to_owned()))?;
                }
                "consumer_username" => settings.consumer_username = Some(value),
                "consumer_password" => settings.consumer_password = Some(value),
                _ if CLIENT_SETTINGS.contains(&name) => {
                    settings.client.insert(name.to_owned(), value);
                }
                _ => {
                    return Err(invalid(format!(
                        "unknown setting {name:?}; accepted: topic_prefix, replication_factor, \
                         fetch_wait_ms, consumer_username, consumer_password, {}",
                        CLIENT_SETTINGS.join(", ")
                    )));
                }
            }
        }
        Ok(settings)
    }

    /// The client setting `name`, when set.
    pub fn client_setting(&self, name: &str) -> Option<&str> {
        self.client.get(name).map(String::as_str)
    }

    /// `security.protocol` as a client must set it (`PLAINTEXT` when not set).
    pub fn security_protocol(&self) -> &str {
        self.client_setting("security.protocol").unwrap_or("PLAINTEXT")
    }

    /// The name of a Sluice topic or group on the cluster.
    pub fn name(&self, topic: &str) -> String {
        format!("{}{topic}", self.topic_prefix)
    }

    /// The URL, with secret values replaced by `***`: safe to log.
    pub fn redacted(&self) -> String {
        let mut url = format!("kafka://{}", self.bootstrap_servers);
        let mut query: Vec<String> = Vec::new();
        if !self.topic_prefix.is_empty() {
            query.push(format!("topic_prefix={}", self.topic_prefix));
        }
        if self.fetch_wait_ms != DEFAULT_FETCH_WAIT_MS {
            query.push(format!("fetch_wait_ms={}", self.fetch_wait_ms));
        }
        if let Some(user) = &self.consumer_username {
            query.push(format!("consumer_username={user}"));
        }
        if self.consumer_password.is_some() {
            query.push("consumer_password=***".to_owned());
        }
        for (name, value) in &self.client {
            let shown = if SECRET_SETTINGS.contains(&name.as_str()) { "***" } else { value };
            query.push(format!("{name}={shown}"));
        }
        if !query.is_empty() {
            url.push('?');
            url.push_str(&query.join("&"));
        }
        url
    }
}

impl fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// `url` with the values of secret settings replaced, for error messages.
fn redact_url(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else { return url.to_owned() };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if SECRET_SETTINGS.contains(&name) => format!("{name}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{head}?{}", pairs.join("&"))
}

fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_brokers_prefix_and_client_settings() {
        let settings = KafkaSettings::parse(
            "kafka://b1:9092,b2:9093?topic_prefix=prod.&security.protocol=SASL_SSL\
             &sasl.mechanism=SCRAM-SHA-512&sasl.username=sluice&sasl.password=p%40ss%2Bword",
        )
        .unwrap();
        assert_eq!(settings.bootstrap_servers, "b1:9092,b2:9093");
        assert_eq!(settings.name("base.log"), "prod.base.log");
        assert_eq!(settings.security_protocol(), "SASL_SSL");
        assert_eq!(settings.client_setting("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(settings.client_setting("sasl.password"), Some("p@ss+word"));
        assert_eq!(settings.replication_factor, -1);
        let shown = format!("{settings:?}");
        assert!(shown.contains("sasl.password=***") && !shown.contains("p@ss"), "{shown}");
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        for (url, expected) in [
            ("http://b1:9092", "starts with kafka://"),
            ("kafka://", "no broker address"),
            ("kafka://b1", "is not host:port"),
            ("kafka://b1:0", "is not host:port"),
            ("kafka://b1:9092?acks=0", "unknown setting"),
            ("kafka://b1:9092?topic_prefix=a%20b", "topic_prefix"),
            ("kafka://b1:9092?replication_factor=0", "replication_factor"),
            ("kafka://b1:9092?fetch_wait_ms=0", "fetch_wait_ms"),
            ("kafka://b1?sasl.password=hunter2", "is not host:port"),
        ] {
            let error = KafkaSettings::parse(url).unwrap_err().to_string();
            assert!(error.contains(expected), "{url}: {error}");
            assert!(!error.contains("hunter2"), "{error}");
        }
    }
}
