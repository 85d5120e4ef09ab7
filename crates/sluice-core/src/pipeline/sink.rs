//! The typed configurations of the sink types and their checks. Each external sink names
//! its credentials by organization secret (`*_secret` fields, and the webhook's `hash_key`):
//! the values never appear in a pipeline.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub mod sql;

use crate::validation::{Fields, Loc, Violation, Violations, one_of};

mod object_storage;
mod rabbitmq;
pub use object_storage::{OBJECT_FORMATS, ObjectStorageSinkConfig};
pub use rabbitmq::{AMQP_SHORT_STRING, RabbitMqSinkConfig};

/// Longest URL a sink accepts.
pub const MAX_URL_LEN: usize = 2048;
/// Longest secret name (`PUT /secrets/{name}`).
pub const MAX_SECRET_NAME_LEN: usize = 128;

/// The fields of a managed (`kafka`) sink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ManagedSinkConfig {
    /// Name of the sink; it names the managed topic.
    pub name: String,
    /// Generated when omitted.
    #[schema(required = false)]
    pub uid: String,
}

/// Request body compression of a webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WebhookCompression {
    #[default]
    None,
    Gzip,
}

/// `webhook`: records POSTed as JSON arrays to the user's endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebhookSinkConfig {
    pub name: String,
    /// `http://` or `https://`.
    pub url: String,
    /// The name of an organization secret whose value signs each request
    /// (`X-Signature-256`); no signature headers without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_key: Option<String>,
    /// `none` (default) or `gzip` (`Content-Encoding: gzip`).
    #[serde(default)]
    pub compression: WebhookCompression,
    #[schema(required = false)]
    pub uid: String,
}

/// `external_kafka`: the user's own Kafka cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExternalKafkaSinkConfig {
    pub name: String,
    /// `host:port[,host:port…]`.
    pub bootstrap_servers: String,
    pub topic: String,
    /// `plaintext` (default), `ssl`, `sasl_plaintext` or `sasl_ssl`.
    #[serde(default = "default_security_protocol")]
    pub security_protocol: String,
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`; required with a `sasl_*` protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl_mechanism: Option<String>,
    /// Organization secret holding the SASL username.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl_username_secret: Option<String>,
    /// Organization secret holding the SASL password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl_password_secret: Option<String>,
    /// `none` (default), `gzip`, `snappy`, `lz4` (zstd is not built into the bundled librdkafka).
    #[serde(default = "default_compression")]
    pub compression: String,
    #[schema(required = false)]
    pub uid: String,
}

/// `nats`: a NATS JetStream stream, published to by subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NatsSinkConfig {
    pub name: String,
    /// `nats://host:port[,nats://host:port…]`.
    pub url: String,
    /// The subject records are published to; a JetStream stream must capture it.
    pub subject: String,
    /// User name for user/password authentication (with `password_secret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Organization secret holding the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<String>,
    /// Organization secret holding an authentication token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret: Option<String>,
    /// Connect with TLS.
    #[serde(default)]
    pub tls: bool,
    #[schema(required = false)]
    pub uid: String,
}

/// `sns`: an SNS-compatible notification topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnsSinkConfig {
    pub name: String,
    /// `arn:aws:sns:<region>:<account>:<topic>`.
    pub topic_arn: String,
    /// Defaults to the ARN's region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// An endpoint override (an SNS-compatible server); default
    /// `https://sns.<region>.amazonaws.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Organization secret holding the access key id.
    pub access_key_id_secret: String,
    /// Organization secret holding the secret access key.
    pub secret_access_key_secret: String,
    /// Organization secret holding a session token (temporary credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token_secret: Option<String>,
    #[schema(required = false)]
    pub uid: String,
}

fn default_security_protocol() -> String {
    "plaintext".to_owned()
}

fn default_compression() -> String {
    "none".to_owned()
}

pub const KAFKA_SECURITY_PROTOCOLS: [&str; 4] = ["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"];
pub const KAFKA_SASL_MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];
pub const KAFKA_COMPRESSIONS: [&str; 4] = ["none", "gzip", "snappy", "lz4"];
pub const WEBHOOK_COMPRESSIONS: [&str; 2] = ["none", "gzip"];

/// Whether `name` is a valid secret name: 1 to 128 of `A-Z a-z 0-9 _ - .`.
///
/// # Errors
/// What is wrong with it.
pub fn check_secret_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_SECRET_NAME_LEN {
        return Err(format!("secret names are 1 to {MAX_SECRET_NAME_LEN} characters"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) {
        return Err("secret names use only letters, digits, '_', '-' and '.'".to_owned());
    }
    Ok(())
}

/// Reads the sink-type-specific fields of a sink object (`type`, `name` and `uid` are read
/// by the caller).
pub(super) struct SinkFields<'f, 'a> {
    pub fields: &'f mut Fields<'a>,
    pub errors: &'f mut Violations,
    /// Set when a field was wrong: no config is built.
    pub failed: bool,
}

impl<'a> SinkFields<'_, 'a> {
    fn loc(&self, field: &str) -> Loc {
        self.fields.loc(field)
    }

    fn fail(&mut self, field: &str, msg: impl Into<String>) {
        let loc = self.loc(field);
        self.errors.push(Violation::value(&loc, msg));
        self.failed = true;
    }

    fn required(&mut self, field: &'a str) -> String {
        match self.fields.required_str(field, self.errors) {
            Some(text) if text.trim().is_empty() => {
                self.fail(field, "must not be empty");
                String::new()
            }
            Some(text) if text.len() > MAX_URL_LEN => {
                self.fail(field, format!("must be at most {MAX_URL_LEN} characters"));
                String::new()
            }
            Some(text) => text.to_owned(),
            None => {
                self.failed = true;
                String::new()
            }
        }
    }

    fn optional(&mut self, field: &'a str) -> Option<String> {
        let had = self.fields.get(field).is_some();
        match self.fields.optional_str(field, self.errors) {
            Some(text) if text.len() > MAX_URL_LEN => {
                self.fail(field, format!("must be at most {MAX_URL_LEN} characters"));
                None
            }
            Some(text) => Some(text.to_owned()),
            None => {
                self.failed |= had;
                None
            }
        }
    }

    fn secret(&mut self, field: &'a str, required: bool) -> Option<String> {
        let name = if required { Some(self.required(field)) } else { self.optional(field) };
        let name = name.filter(|name| !name.is_empty())?;
        if let Err(msg) = check_secret_name(&name) {
            self.fail(field, format!("must name an organization secret: {msg}"));
            return None;
        }
        Some(name)
    }

    fn choice(&mut self, field: &'a str, allowed: &[&str], default: &str) -> String {
        match self.fields.optional_enum(field, allowed, self.errors) {
            Ok(chosen) => chosen.unwrap_or(default).to_owned(),
            Err(_) => {
                self.failed = true;
                default.to_owned()
            }
        }
    }

    fn http_url(&mut self, field: &'a str, required: bool) -> Option<String> {
        let url = if required { Some(self.required(field)) } else { self.optional(field) };
        let url = url.filter(|url| !url.is_empty())?;
        match check_url(&url, &["http", "https"]) {
            Ok(()) => Some(url),
            Err(msg) => {
                self.fail(field, msg);
                None
            }
        }
    }

    pub fn webhook(&mut self, name: String, uid: String) -> WebhookSinkConfig {
        let url = self.http_url("url", true).unwrap_or_default();
        let hash_key = self.secret("hash_key", false);
        let compression = match self.choice("compression", &WEBHOOK_COMPRESSIONS, "none").as_str() {
            "gzip" => WebhookCompression::Gzip,
            _ => WebhookCompression::None,
        };
        WebhookSinkConfig { name, url, hash_key, compression, uid }
    }

    pub fn external_kafka(&mut self, name: String, uid: String) -> ExternalKafkaSinkConfig {
        let bootstrap_servers = self.required("bootstrap_servers");
        if !bootstrap_servers.is_empty() {
            let bad = bootstrap_servers.split(',').map(str::trim).find(|server| {
                server.rsplit_once(':').is_none_or(|(host, port)| {
                    host.is_empty() || port.parse::<u16>().is_err() || server.contains('/')
                })
            });
            if let Some(bad) = bad {
                self.fail(
                    "bootstrap_servers",
                    format!("'{bad}' is not host:port; give host:port[,host:port…]"),
                );
            }
        }
        let topic = self.required("topic");
        if !topic.is_empty() && !valid_kafka_topic(&topic) {
            self.fail(
                "topic",
                "Kafka topic names are 1 to 249 of letters, digits, '.', '_' and '-'",
            );
        }
        let security_protocol =
            self.choice("security_protocol", &KAFKA_SECURITY_PROTOCOLS, "plaintext");
        let mechanism = match self.fields.optional_enum(
            "sasl_mechanism",
            &KAFKA_SASL_MECHANISMS,
            self.errors,
        ) {
            Ok(mechanism) => mechanism.map(str::to_owned),
            Err(_) => {
                self.failed = true;
                None
            }
        };
        let username = self.secret("sasl_username_secret", false);
        let password = self.secret("sasl_password_secret", false);
        let compression = self.choice("compression", &KAFKA_COMPRESSIONS, "none");
        if security_protocol.starts_with("sasl_") {
            if mechanism.is_none() {
                self.fail(
                    "sasl_mechanism",
                    format!("required with security_protocol '{security_protocol}'"),
                );
            }
            for (field, given) in [
                ("sasl_username_secret", username.is_some()),
                ("sasl_password_secret", password.is_some()),
            ] {
                if !given {
                    self.fail(
                        field,
                        format!("required with security_protocol '{security_protocol}'"),
                    );
                }
            }
        } else {
            for (field, given) in [
                ("sasl_mechanism", mechanism.is_some()),
                ("sasl_username_secret", username.is_some()),
                ("sasl_password_secret", password.is_some()),
            ] {
                if given {
                    self.fail(field, "only with security_protocol 'sasl_plaintext' or 'sasl_ssl'");
                }
            }
        }
        ExternalKafkaSinkConfig {
            name,
            bootstrap_servers,
            topic,
            security_protocol,
            sasl_mechanism: mechanism,
            sasl_username_secret: username,
            sasl_password_secret: password,
            compression,
            uid,
        }
    }

    pub fn nats(&mut self, name: String, uid: String) -> NatsSinkConfig {
        let url = self.required("url");
        if !url.is_empty() {
            if let Some(msg) =
                url.split(',').find_map(|one| check_url(one.trim(), &["nats", "tls"]).err())
            {
                self.fail("url", msg);
            }
            if url.contains('@') {
                self.fail("url", "put credentials in password_secret or token_secret, not the URL");
            }
        }
        let subject = self.required("subject");
        let subject_ok = subject
            .split('.')
            .all(|token| !token.is_empty() && !token.contains(['*', '>', ' ', '\t', '\r', '\n']));
        if !subject.is_empty() && !subject_ok {
            self.fail(
                "subject",
                "must be a NATS subject without wildcards (tokens separated by '.')",
            );
        }
        let username = self.optional("username");
        let password_secret = self.secret("password_secret", false);
        let token_secret = self.secret("token_secret", false);
        let tls = match self.fields.optional_bool("tls", self.errors) {
            Ok(tls) => tls.unwrap_or(false),
            Err(_) => {
                self.failed = true;
                false
            }
        };
        if username.is_some() != password_secret.is_some() {
            let field = if username.is_some() { "password_secret" } else { "username" };
            self.fail(field, "username and password_secret go together");
        }
        if token_secret.is_some() && password_secret.is_some() {
            self.fail("token_secret", "give either token_secret or username and password_secret");
        }
        NatsSinkConfig { name, url, subject, username, password_secret, token_secret, tls, uid }
    }

    pub fn sns(&mut self, name: String, uid: String) -> SnsSinkConfig {
        let topic_arn = self.required("topic_arn");
        let arn_region = topic_arn_region(&topic_arn);
        if !topic_arn.is_empty() && arn_region.is_none() {
            self.fail("topic_arn", "must be arn:<partition>:sns:<region>:<account>:<topic>");
        }
        let region = self.optional("region");
        if let Some(region) = &region {
            let ok = !region.is_empty()
                && region
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok {
                self.fail("region", "must be an AWS region name such as us-east-1");
            }
        }
        let endpoint = self.http_url("endpoint", false);
        let access_key_id_secret = self.secret("access_key_id_secret", true).unwrap_or_default();
        let secret_access_key_secret =
            self.secret("secret_access_key_secret", true).unwrap_or_default();
        let session_token_secret = self.secret("session_token_secret", false);
        SnsSinkConfig {
            name,
            topic_arn,
            region,
            endpoint,
            access_key_id_secret,
            secret_access_key_secret,
            session_token_secret,
            uid,
        }
    }
}

/// The region of an SNS topic ARN (`arn:<partition>:sns:<region>:<account>:<topic>`).
pub fn topic_arn_region(arn: &str) -> Option<&str> {
    let parts: Vec<&str> = arn.split(':').collect();
    match parts.as_slice() {
        ["arn", partition, "sns", region, account, topic]
            if !partition.is_empty()
                && !region.is_empty()
                && !account.is_empty()
                && !topic.is_empty() =>
        {
            Some(region)
        }
        _ => None,
    }
}

fn valid_kafka_topic(topic: &str) -> bool {
    (1..=249).contains(&topic.len())
        && topic != "."
        && topic != ".."
        && topic.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Checks that `text` is an absolute URL with one of `schemes` and a host. The message
/// shows what was given, with what may be a key hidden (webhook URLs carry tokens in the
/// path or the query).
fn check_url(text: &str, schemes: &[&str]) -> Result<(), String> {
    let scheme_list = one_of(schemes);
    let shown = crate::redaction::redact_url(text);
    let Ok(url) = url::Url::parse(text) else {
        return Err(format!("'{shown}' is not a valid URL"));
    };
    if !schemes.contains(&url.scheme()) {
        return Err(format!("the URL scheme must be {scheme_list}, not '{shown}'"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("the URL needs a host: '{shown}'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_url;

    #[test]
    fn url_errors_show_what_was_given_without_its_keys() {
        let error = check_url("hooks.example/v1/0123456789abcdef0123", &["http", "https"]);
        assert_eq!(error.unwrap_err(), "'hooks.example/v1/***' is not a valid URL");
        let error = check_url("ftp://u:pw@hooks.example/x?token=abc", &["http", "https"]);
        let error = error.unwrap_err();
        assert!(error.contains("'ftp://u:***@hooks.example/x?***'"), "{error}");
        assert!(!error.contains("pw") && !error.contains("abc"), "{error}");
        assert!(check_url("https://hooks.example/x", &["http", "https"]).is_ok());
    }
}
