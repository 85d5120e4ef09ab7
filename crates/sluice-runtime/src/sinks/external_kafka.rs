//! The external Kafka sink (`external_kafka`): records produced to a topic of the user's own
//! cluster by an idempotent producer (`enable.idempotence`, `acks=all`), each with its stream
//! key as the message key (so the cluster's partitioner keeps a key's records in one
//! partition, in order). A batch is acknowledged when the brokers acknowledged every record.
//!
//! Errors: a record the cluster refuses as such (over `message.max.bytes`, invalid) is
//! rejected alone and dead-lettered; anything else — brokers down, a missing topic, refused
//! credentials, a timeout ([`DELIVERY_TIMEOUT_MS`]) — holds the source and is retried, since
//! the user can fix it without losing records. SASL credentials come from organization
//! secrets and are given to librdkafka only; errors never carry them.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use serde_json::{Value, json};
use sluice_core::pipeline::ExternalKafkaSinkConfig;
use sluice_core::secret::SecretValue;

use super::external::{Batch, Sent, Transport, TransportError};

/// How long the producer tries to deliver one record before it counts as failed.
pub const DELIVERY_TIMEOUT_MS: &str = "30000";

/// SASL credentials, resolved from organization secrets.
#[derive(Debug, Clone)]
pub struct SaslCredentials {
    pub username: SecretValue,
    pub password: SecretValue,
}

/// Produces to the user's cluster.
pub struct ExternalKafkaTransport {
    config: ExternalKafkaSinkConfig,
    producer: FutureProducer,
}

impl std::fmt::Debug for ExternalKafkaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalKafkaTransport")
            .field("bootstrap_servers", &self.config.bootstrap_servers)
            .field("topic", &self.config.topic)
            .finish_non_exhaustive()
    }
}

/// A producer that could not be made (a setting librdkafka refuses).
#[derive(Debug, thiserror::Error)]
#[error("cannot make the Kafka producer: {0}")]
pub struct ProducerError(String);

impl ExternalKafkaTransport {
    /// A producer for `config`; it connects in the background.
    ///
    /// # Errors
    /// [`ProducerError`] when librdkafka refuses a setting.
    pub fn new(
        config: &ExternalKafkaSinkConfig,
        sasl: Option<SaslCredentials>,
    ) -> Result<Self, ProducerError> {
        let client = client_config(config, sasl.as_ref());
        // librdkafka's messages about settings name the setting, never a value.
        let producer = client.create().map_err(|error| ProducerError(error.to_string()))?;
        Ok(Self { config: config.clone(), producer })
    }
}

/// The librdkafka settings of the producer of `config`.
fn client_config(config: &ExternalKafkaSinkConfig, sasl: Option<&SaslCredentials>) -> ClientConfig {
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("security.protocol", &config.security_protocol)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("compression.type", &config.compression)
        .set("linger.ms", "5")
        .set("message.timeout.ms", DELIVERY_TIMEOUT_MS)
        .set("queue.buffering.max.messages", "200000")
        .set("client.id", "sluice-sink");
    if let Some(mechanism) = &config.sasl_mechanism {
        client.set("sasl.mechanism", mechanism);
    }
    if let Some(sasl) = sasl {
        client
            .set("sasl.username", sasl.username.expose())
            .set("sasl.password", sasl.password.expose());
    }
    client
}

#[async_trait::async_trait]
impl Transport for ExternalKafkaTransport {
    async fn send(&self, batch: Batch<'_>) -> Result<Sent, TransportError> {
        let topic = self.config.topic.as_str();
        let mut pending = Vec::with_capacity(batch.records.len());
        for record in batch.records {
            let mut message =
                FutureRecord::to(topic).key(&record.key[..]).payload(&record.value[..]);
            loop {
                match self.producer.send_result(message) {
                    Ok(delivery) => {
                        pending.push(delivery);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        message = back;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err((error, _)) => {
                        return Err(TransportError::retryable(format!("cannot produce: {error}")));
                    }
                }
            }
        }
        let mut sent = Sent::default();
        let mut failed = None;
        for (index, delivery) in pending.into_iter().enumerate() {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((error, _))) => match refused_record(&error) {
                    Some(reason) => sent.rejected.push((index, reason)),
                    None => {
                        failed.get_or_insert(error);
                    }
                },
                Err(_) => {
                    return Err(TransportError::retryable("the producer was closed"));
                }
            }
        }
        match failed {
            Some(error) => Err(TransportError::retryable(format!(
                "the cluster did not acknowledge every record: {error}"
            ))),
            None => Ok(sent),
        }
    }

    fn connection(&self) -> Value {
        json!({
            "transport": "kafka",
            "bootstrap_servers": self.config.bootstrap_servers,
            "topic": self.config.topic,
            "security_protocol": self.config.security_protocol,
            "sasl_mechanism": self.config.sasl_mechanism,
            "compression": self.config.compression,
        })
    }

    async fn close(&self) {
        let producer = self.producer.clone();
        // Waits for what is still in flight; nothing is, after an acknowledged batch.
        let _ = tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(5))).await;
    }
}

/// Why the cluster refuses this record for good; `None` when waiting may help.
fn refused_record(error: &KafkaError) -> Option<String> {
    let code = error.rdkafka_error_code()?;
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidMessage
            | RDKafkaErrorCode::InvalidRecord
    )
    .then(|| format!("the Kafka cluster refused the record: {code}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(protocol: &str) -> ExternalKafkaSinkConfig {
        ExternalKafkaSinkConfig {
            name: "k".to_owned(),
            bootstrap_servers: "b1:9092,b2:9092".to_owned(),
            topic: "t".to_owned(),
            security_protocol: protocol.to_owned(),
            sasl_mechanism: Some("SCRAM-SHA-512".to_owned()),
            sasl_username_secret: Some("USER".to_owned()),
            sasl_password_secret: Some("PASS".to_owned()),
            compression: "lz4".to_owned(),
            uid: "sk-k".to_owned(),
        }
    }

    /// The test broker has no SASL users: the SASL settings are checked as configuration.
    #[test]
    fn sasl_credentials_and_the_delivery_settings_reach_librdkafka() {
        let sasl = SaslCredentials {
            username: SecretValue::new("app-user".to_owned()),
            password: SecretValue::new("app-password".to_owned()),
        };
        let client = client_config(&config("sasl_ssl"), Some(&sasl));
        for (key, value) in [
            ("bootstrap.servers", "b1:9092,b2:9092"),
            ("security.protocol", "sasl_ssl"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "app-user"),
            ("sasl.password", "app-password"),
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("compression.type", "lz4"),
        ] {
            assert_eq!(client.get(key), Some(value), "{key}");
        }
        // librdkafka takes every setting (a typo in a name would fail here).
        let transport = ExternalKafkaTransport::new(&config("sasl_ssl"), Some(sasl)).unwrap();
        let shown = transport.connection().to_string();
        assert!(!shown.contains("app-password") && !shown.contains("app-user"), "{shown}");
        assert!(!format!("{transport:?}").contains("app-password"));
    }
}
