//! `rabbitmq`: AMQP 0.9.1 publishes to an exchange, with publisher confirms (docs/sinks.md).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{SinkFields, check_url};

/// Longest AMQP short string (exchange names, routing keys).
pub const AMQP_SHORT_STRING: usize = 255;

/// `rabbitmq`: records published to an exchange of the user's broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RabbitMqSinkConfig {
    pub name: String,
    /// `amqp://host[:port][/vhost]` or `amqps://…`; no credentials in it.
    pub url: String,
    /// The exchange records are published to (it must exist).
    pub exchange: String,
    /// A fixed routing key (default empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_key: Option<String>,
    /// A top-level record field whose value is each record's routing key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_key_field: Option<String>,
    /// User name (with `password_secret`); default `guest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Organization secret holding the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<String>,
    /// Messages survive a broker restart (delivery mode 2); default true.
    #[serde(default = "persistent_default")]
    pub persistent: bool,
    #[schema(required = false)]
    pub uid: String,
}

fn persistent_default() -> bool {
    true
}

impl<'a> SinkFields<'_, 'a> {
    pub fn rabbitmq(&mut self, name: String, uid: String) -> RabbitMqSinkConfig {
        let url = self.required("url");
        if !url.is_empty() {
            if let Err(msg) = check_url(&url, &["amqp", "amqps"]) {
                self.fail("url", msg);
            } else if url.contains('@') || url.contains('?') {
                self.fail(
                    "url",
                    "put the user in username and the password in password_secret, not the URL; no query",
                );
            }
        }
        let exchange = self.required("exchange");
        let short = |text: &str| text.len() <= AMQP_SHORT_STRING;
        if !short(&exchange)
            || !exchange.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        {
            self.fail(
                "exchange",
                "exchange names are 1 to 255 of letters, digits, '-', '_', '.' and ':'",
            );
        }
        let routing_key = self.optional("routing_key");
        if routing_key.as_deref().is_some_and(|key| !short(key)) {
            self.fail("routing_key", "routing keys are at most 255 bytes");
        }
        let routing_key_field = self.optional("routing_key_field");
        if routing_key_field.as_deref().is_some_and(str::is_empty) {
            self.fail("routing_key_field", "must name a top-level field of the records");
        }
        if routing_key.is_some() && routing_key_field.is_some() {
            self.fail("routing_key_field", "give either routing_key or routing_key_field");
        }
        let username = self.optional("username");
        let password_secret = self.secret("password_secret", false);
        if username.is_some() != password_secret.is_some() {
            let field = if username.is_some() { "password_secret" } else { "username" };
            self.fail(field, "username and password_secret go together");
        }
        let persistent = match self.fields.optional_bool("persistent", self.errors) {
            Ok(flag) => flag.unwrap_or(true),
            Err(_) => {
                self.failed = true;
                true
            }
        };
        RabbitMqSinkConfig {
            name,
            url,
            exchange,
            routing_key,
            routing_key_field,
            username,
            password_secret,
            persistent,
            uid,
        }
    }
}
