//! The RabbitMQ sink (`rabbitmq`): each record published to the sink's exchange over AMQP
//! 0.9.1, with the routing key fixed (`routing_key`) or taken from a top-level record field
//! (`routing_key_field`), on a channel in publisher-confirm mode. A batch's publishes are
//! pipelined on one connection; the batch is acknowledged once the broker confirmed
//! (`basic.ack`) every message. Properties: `content_type` `application/json`,
//! `message_id` the stream key (consumers deduplicate on it), header `sluice_batch_id`, and
//! `delivery_mode` 2 (persistent) unless `persistent` is false.
//!
//! Errors: a broken or refused connection, a missing exchange (the broker closes the
//! channel with 404), a `basic.nack`, a timeout: retried (the source is held, at least once
//! as Kafka is). A record over [`MAX_MESSAGE_BYTES`], or without the routing field (or with
//! one over 255 bytes), is rejected alone (dead-lettered). A message no queue is bound for is
//! dropped by the broker, as AMQP does without `mandatory`.
//!
//! The client is ours ([`amqp`]): a publisher needs a handful of methods, and the AMQP
//! crates add an executor or a second TLS stack to the build. TLS (`amqps://`) goes through
//! OpenSSL (`native-tls`), which the build has already.

pub mod amqp;

use std::time::Duration;

use serde_json::{Value, json};
use sluice_core::pipeline::RabbitMqSinkConfig;
use sluice_core::pipeline::sink::AMQP_SHORT_STRING;
use sluice_core::secret::SecretValue;
use tokio::sync::Mutex;

use super::external::{Batch, Sent, Transport, TransportError};
use amqp::{AmqpError, Connection, Io, Login, Message};

/// Largest message sent (RabbitMQ's default `max_message_size` since 4.0).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// How long a connection, or a batch's confirms, may take.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// Publishes to one exchange.
#[derive(Debug)]
pub struct RabbitMqTransport {
    host: String,
    port: u16,
    tls: bool,
    vhost: String,
    user: String,
    password: Option<SecretValue>,
    exchange: String,
    routing_key: String,
    routing_key_field: Option<String>,
    persistent: bool,
    connection: Mutex<Option<Connection>>,
}

fn retryable(error: &AmqpError) -> TransportError {
    TransportError::retryable(format!("RabbitMQ: {error}"))
}

impl RabbitMqTransport {
    /// A transport for `config` logging in with `password`; it connects at the first send.
    ///
    /// # Errors
    /// A URL without a host.
    pub fn new(config: &RabbitMqSinkConfig, password: Option<SecretValue>) -> Result<Self, String> {
        let url = url::Url::parse(&config.url).map_err(|_| "the URL does not parse".to_owned())?;
        let host = url.host_str().ok_or("the URL has no host")?.to_owned();
        let tls = url.scheme() == "amqps";
        let path = url.path().trim_start_matches('/');
        let vhost = if path.is_empty() {
            "/".to_owned()
        } else {
            url::form_urlencoded::parse(format!("v={path}").as_bytes())
                .next()
                .map_or_else(|| path.to_owned(), |(_, v)| v.into_owned())
        };
        Ok(Self {
            host,
            port: url.port().unwrap_or(if tls { 5671 } else { 5672 }),
            tls,
            vhost,
            user: config.username.clone().unwrap_or_else(|| "guest".to_owned()),
            password,
            exchange: config.exchange.clone(),
            routing_key: config.routing_key.clone().unwrap_or_default(),
            routing_key_field: config.routing_key_field.clone(),
            persistent: config.persistent,
            connection: Mutex::new(None),
        })
    }

    async fn connect(&self) -> Result<Connection, AmqpError> {
        let broken = |what: String| AmqpError { code: 0, text: what };
        let address = format!("{}:{}", self.host, self.port);
        let tcp = tokio::time::timeout(CONFIRM_TIMEOUT, tokio::net::TcpStream::connect(&address))
            .await
            .map_err(|_| broken(format!("connecting to {address} timed out")))?
            .map_err(|error| broken(format!("cannot connect to {address}: {}", error.kind())))?;
        tcp.set_nodelay(true).map_err(|error| broken(error.to_string()))?;
        let io: Box<dyn Io> = if self.tls {
            let connector = native_tls::TlsConnector::new().map_err(|e| broken(e.to_string()))?;
            let connector = tokio_native_tls::TlsConnector::from(connector);
            let stream = connector
                .connect(&self.host, tcp)
                .await
                .map_err(|error| broken(format!("TLS: {error}")))?;
            Box::new(stream)
        } else {
            Box::new(tcp)
        };
        let password = self.password.as_ref().map_or("guest", SecretValue::expose);
        let login = Login { user: &self.user, password, vhost: &self.vhost };
        tokio::time::timeout(CONFIRM_TIMEOUT, Connection::open(io, &login))
            .await
            .map_err(|_| broken("the broker did not answer the login".to_owned()))?
    }

    /// The routing key of `record`, or why it has none.
    fn routing_key(&self, record: &[u8]) -> Result<String, String> {
        let Some(field) = &self.routing_key_field else { return Ok(self.routing_key.clone()) };
        let text = String::from_utf8_lossy(record);
        let found = sluice_columnar::fields::fields(&text, &[field.as_str()]).pop().flatten();
        let key = found.as_ref().and_then(|value| value.as_text()).map(|key| key.into_owned());
        match key {
            None => Err(format!("the record has no '{field}' to route by")),
            Some(key) if key.len() > AMQP_SHORT_STRING => {
                Err(format!("the routing key in '{field}' is over 255 bytes"))
            }
            Some(key) => Ok(key),
        }
    }
}

#[async_trait::async_trait]
impl Transport for RabbitMqTransport {
    async fn send(&self, batch: Batch<'_>) -> Result<Sent, TransportError> {
        let mut sent = Sent::default();
        let mut keys = Vec::with_capacity(batch.records.len());
        let mut ids = Vec::with_capacity(batch.records.len());
        for (index, record) in batch.records.iter().enumerate() {
            if record.value.len() > MAX_MESSAGE_BYTES {
                sent.rejected.push((
                    index,
                    format!(
                        "the record ({} bytes) is over the {MAX_MESSAGE_BYTES}-byte message limit",
                        record.value.len()
                    ),
                ));
                continue;
            }
            match self.routing_key(&record.value) {
                Ok(key) => {
                    keys.push((index, key));
                    ids.push(String::from_utf8_lossy(&record.key).into_owned());
                }
                Err(reason) => sent.rejected.push((index, reason)),
            }
        }
        let messages: Vec<Message<'_>> = keys
            .iter()
            .zip(&ids)
            .map(|((index, key), id)| Message {
                routing_key: key,
                message_id: id,
                batch_id: batch.id,
                body: &batch.records[*index].value,
            })
            .collect();
        if messages.is_empty() {
            return Ok(sent);
        }
        let mut slot = self.connection.lock().await;
        let connection = match slot.as_mut() {
            Some(connection) => connection,
            None => slot.insert(self.connect().await.map_err(|e| retryable(&e))?),
        };
        let published = tokio::time::timeout(
            CONFIRM_TIMEOUT,
            connection.publish_all(&self.exchange, self.persistent, &messages),
        )
        .await;
        match published {
            Ok(Ok(())) => Ok(sent),
            Ok(Err(error)) => {
                // A channel or connection in doubt is not used again.
                *slot = None;
                Err(retryable(&error))
            }
            Err(_) => {
                *slot = None;
                Err(TransportError::retryable("RabbitMQ: no confirms within 30 s"))
            }
        }
    }

    fn connection(&self) -> Value {
        json!({
            "transport": "rabbitmq",
            "host": self.host,
            "port": self.port,
            "tls": self.tls,
            "vhost": self.vhost,
            "username": self.user,
            "exchange": self.exchange,
            "routing_key": self.routing_key_field.as_ref().map_or(self.routing_key.clone(), |field| format!("<record.{field}>")),
            "persistent": self.persistent,
        })
    }

    async fn check(&self) -> Result<(), String> {
        let mut connection = self.connect().await.map_err(|error| format!("RabbitMQ: {error}"))?;
        let found = connection.check_exchange(&self.exchange).await;
        connection.close().await;
        found.map_err(|error| format!("RabbitMQ exchange '{}': {error}", self.exchange))
    }

    async fn close(&self) {
        if let Some(mut connection) = self.connection.lock().await.take() {
            connection.close().await;
        }
    }
}
