//! The [`Sink`] role: where a deployment's records go, and how a consumer reaches them.
//!
//! A sink is built from its [`SinkConfig`] when a pipeline is compiled ([`build`]); the
//! worker hands it each processed batch ([`Sink::deliver`]) and settles the batch's source
//! offsets, dead letters and script logs only once the sink has the records, so
//! `at_least_once` holds whatever the sink. A failure says whether a retry can help
//! ([`SinkError::is_retryable`]). Each sink type is a module beside this one, with its
//! typed config in `sluice-core`: [`managed`] is the first.

pub mod external;
pub mod external_kafka;
pub mod managed;
pub mod mysql;
pub mod nats;
pub mod object_storage;
pub mod postgres;
pub mod rabbitmq;
pub mod sns;
pub mod sql;
pub mod webhook;

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::Value;
use sluice_bus::{NewRecord, StreamLog};
use sluice_core::pipeline::{DeliveryGuarantee, ObjectStorageSinkConfig, SinkConfig};
use sluice_core::secret::{ResolvedSecrets, SecretValue};

use crate::delivery::{Delivery, SideTopics};
pub use external::{ExternalSink, Transport};
pub use external_kafka::ExternalKafkaTransport;
pub use managed::ManagedSink;
pub use nats::NatsTransport;
pub use object_storage::{ObjectStorageSink, ObjectStorageTransport};
pub use rabbitmq::RabbitMqTransport;
pub use sns::SnsTransport;
pub use webhook::WebhookTransport;

/// A failed delivery, classified for the worker: retryable failures hold the source and are
/// tried again (`at_least_once`); the others cannot succeed by waiting.
#[derive(Debug, thiserror::Error)]
#[error("sink {uid} failed: {source}")]
pub struct SinkError {
    pub uid: String,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
    pub retryable: bool,
    /// How long the receiver asked to wait before the next try (`Retry-After`).
    pub retry_after: Option<std::time::Duration>,
}

impl SinkError {
    /// Settling a batch in the log failed (retryable when the log says so).
    pub fn settling(uid: &str, error: sluice_bus::BusError) -> Self {
        Self {
            uid: uid.to_owned(),
            retryable: error.is_transient(),
            retry_after: None,
            source: Box::new(error),
        }
    }

    /// Whether trying the same batch again later can succeed.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }
}

/// Where the batch's records came from: the consumer offsets it settles.
#[derive(Debug, Clone, Copy)]
pub struct Settle<'a> {
    /// The consumer group (a deployment's, or a replay's).
    pub group: &'a str,
    /// The topic the group read.
    pub source: &'a str,
    /// `(partition, next offset)` to commit.
    pub offsets: &'a [(u32, u64)],
}

/// How a consumer reaches a deployed sink: the deploy response's entry for it.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkConnection {
    pub uid: String,
    pub name: String,
    /// The sink's `type`.
    pub sink_type: &'static str,
    /// The managed topic, for sinks Sluice keeps.
    pub topic: String,
    /// Where its records are read over HTTP (API path, same key, read permission).
    pub records_url: String,
    /// Connection settings, by name.
    pub connection: Value,
    /// Ready-to-run consumers, by language.
    pub consumer_snippets: Value,
}

impl SinkConnection {
    /// How a consumer reaches a sink Sluice does not keep: no managed topic, records URL or
    /// snippets, only the sink's own `connection` settings.
    pub fn unmanaged(config: &SinkConfig, connection: Value) -> Self {
        Self {
            uid: config.uid().to_owned(),
            name: config.name().to_owned(),
            sink_type: config.type_name(),
            topic: String::new(),
            records_url: String::new(),
            connection,
            consumer_snippets: serde_json::json!({}),
        }
    }
}

/// Appends a batch's `dead` letters and script `logs` to the pipeline's side topics and
/// commits `settle`'s offsets with them, in one step of the log: how a sink that is not a
/// managed topic settles a batch.
///
/// # Errors
/// [`SinkError::settling`] of sink `uid`; then the offsets did not move.
pub(crate) async fn settle_side(
    log: &Arc<dyn StreamLog>,
    uid: &str,
    side: &SideTopics,
    dead: &[NewRecord],
    logs: &[NewRecord],
    settle: Settle<'_>,
) -> Result<(), SinkError> {
    let appends: [(&str, &[NewRecord]); 2] = [(&side.dead_letters, dead), (&side.logs, logs)];
    log.append_and_commit(&appends, settle.group, settle.source, settle.offsets)
        .await
        .map_err(|error| SinkError::settling(uid, error))
}

/// A running sink of one deployment.
#[async_trait::async_trait]
pub trait Sink: Send + Sync + std::fmt::Debug {
    /// The configuration the sink was built from.
    fn config(&self) -> &SinkConfig;

    /// The managed topic the sink writes, when Sluice keeps its records (created at deploy,
    /// read over HTTP, deleted at teardown).
    fn managed_topic(&self) -> Option<&str>;

    /// Delivers `delivery.out` and, once the sink has them, writes the batch's dead letters
    /// and script logs to `side` and commits `settle`'s offsets.
    ///
    /// # Errors
    /// [`SinkError`]; then the offsets did not move.
    async fn deliver(
        &self,
        log: &Arc<dyn StreamLog>,
        delivery: &Delivery,
        side: &SideTopics,
        settle: Settle<'_>,
    ) -> Result<(), SinkError>;

    /// How a consumer reaches this sink of pipeline `pipeline_id`.
    fn connection(&self, pipeline_id: &str) -> SinkConnection;

    /// Makes sure the sink can take records (connects, creates its table); a deploy calls it
    /// before anything changes, so a sink that cannot work is a 422 there.
    ///
    /// # Errors
    /// [`SinkBuildError`] saying what is wrong.
    async fn prepare(&self) -> Result<(), SinkBuildError> {
        Ok(())
    }

    /// The `(partition, next offset)` positions of `group` on `source` that the sink itself
    /// committed (beside its records, in the user's database), which may be ahead of the
    /// log's; a worker starts from the later of the two. Empty for sinks that keep none.
    ///
    /// # Errors
    /// [`SinkError`] when the positions cannot be read now.
    async fn resume(&self, _group: &str, _source: &str) -> Result<Vec<(u32, u64)>, SinkError> {
        Ok(Vec::new())
    }

    /// Whether the sink needs [`Delivery::origins`]: it cuts its output at source positions.
    fn wants_origins(&self) -> bool {
        false
    }

    /// Whether the system the sink writes to answers with its settings (checked when a
    /// pipeline is deployed: a failure is a 422).
    ///
    /// # Errors
    /// [`SinkBuildError::Client`] saying why not.
    async fn check_connection(&self) -> Result<(), SinkBuildError> {
        Ok(())
    }

    /// Releases the sink's connections and clients: its deployment stopped running it.
    async fn close(&self) {}
}

/// Why a pipeline asking for `static_egress_ip` cannot have it on this server.
pub const NO_EGRESS: &str = "static_egress_ip needs the server's outbound address (--egress-bind-addr / SLUICE_EGRESS_BIND_ADDR), which this server does not have";

/// What building a sink needs besides its configuration.
#[derive(Debug, Clone, Copy)]
pub struct SinkContext<'a> {
    pub pipeline_id: &'a str,
    /// The values of the organization secrets the sinks name.
    pub secrets: &'a ResolvedSecrets,
    /// The pipeline asks for `static_egress_ip`.
    pub static_egress: bool,
    /// The operator's outbound address (`--egress-bind-addr`), if configured.
    pub egress: Option<IpAddr>,
    /// `(chain, entity)` of the records: a pipeline's source, a backfill's table (a
    /// `postgres` or `mysql` sink's columns follow the entity's schema).
    pub stream: (&'a str, &'a str),
    /// The pipeline's guarantee (backfills: `at_least_once`).
    pub guarantee: DeliveryGuarantee,
}

/// Why a sink cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkBuildError {
    /// A secret the sink names was not resolved (it does not exist).
    #[error("sink {uid}: organization secret '{name}' ({field}) does not exist")]
    MissingSecret { uid: String, field: &'static str, name: String },
    /// `static_egress_ip` is asked for, and the server has no egress address, or the sink
    /// type cannot send from one.
    #[error("sink {uid}: {reason}")]
    Egress { uid: String, reason: String },
    /// A client could not be made from the configuration.
    #[error("sink {uid}: {reason}")]
    Client { uid: String, reason: String },
    /// The system the sink writes cannot be used as configured (checked at deploy).
    #[error("sink {uid}: {reason}")]
    Unreachable { uid: String, field: &'static str, reason: String },
}

impl SinkBuildError {
    /// The sink's field the error is about, when it is about one.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Self::MissingSecret { field, .. } | Self::Unreachable { field, .. } => Some(field),
            Self::Egress { .. } | Self::Client { .. } => None,
        }
    }
}

/// The running sink of `config`. Connecting happens at the first delivery.
///
/// # Errors
/// [`SinkBuildError`].
pub fn build(
    config: &SinkConfig,
    context: SinkContext<'_>,
) -> Result<Arc<dyn Sink>, SinkBuildError> {
    if let Some(sink) = sql::build(config, context)? {
        return Ok(sink);
    }
    if let SinkConfig::ObjectStorage(objects) = config {
        let state = object_storage::shared_state(context.pipeline_id, config.uid());
        let target = object_target(objects, context)?;
        return Ok(Arc::new(ObjectStorageSink::new(config.clone(), target, state)));
    }
    match transport(config, context)? {
        None => Ok(Arc::new(ManagedSink::new(context.pipeline_id, config.clone()))),
        Some(transport) => Ok(Arc::new(ExternalSink::new(config.clone(), transport))),
    }
}

/// How records reach the system of an external sink `config` (`None` for the managed sink,
/// whose records stay in the log). Backfills deliver through it too.
///
/// # Errors
/// [`SinkBuildError`].
pub fn transport(
    config: &SinkConfig,
    context: SinkContext<'_>,
) -> Result<Option<Arc<dyn Transport>>, SinkBuildError> {
    let uid = config.uid();
    let secret = |field: &'static str, name: Option<&String>| resolve(context, uid, field, name);
    let client = |reason: String| SinkBuildError::Client { uid: uid.to_owned(), reason };
    let egress = match (context.static_egress && config.is_external(), context.egress) {
        (false, _) => None,
        (true, None) => {
            return Err(SinkBuildError::Egress {
                uid: uid.to_owned(),
                reason: NO_EGRESS.to_owned(),
            });
        }
        (true, Some(_)) if !config.can_bind_egress() => {
            return Err(SinkBuildError::Egress {
                uid: uid.to_owned(),
                reason: format!(
                    "static_egress_ip applies to webhook and sns sinks; a '{}' sink cannot send from a fixed address",
                    config.type_name()
                ),
            });
        }
        (true, Some(address)) => Some(address),
    };
    let transport: Arc<dyn Transport> = match config {
        SinkConfig::Kafka(_) => return Ok(None),
        SinkConfig::Postgres(_) | SinkConfig::Mysql(_) => {
            return Ok(sql::build(config, context)?.map(|sink| sink as Arc<dyn Transport>));
        }
        SinkConfig::Webhook(webhook) => {
            let hash_key = secret("hash_key", webhook.hash_key.as_ref())?;
            Arc::new(
                WebhookTransport::new(webhook, hash_key, egress)
                    .map_err(|error| client(error.to_string()))?,
            )
        }
        SinkConfig::ExternalKafka(kafka) => {
            let username = secret("sasl_username_secret", kafka.sasl_username_secret.as_ref())?;
            let password = secret("sasl_password_secret", kafka.sasl_password_secret.as_ref())?;
            let sasl = username
                .zip(password)
                .map(|(username, password)| external_kafka::SaslCredentials { username, password });
            Arc::new(
                ExternalKafkaTransport::new(kafka, sasl)
                    .map_err(|error| client(error.to_string()))?,
            )
        }
        SinkConfig::Nats(nats) => {
            let token = secret("token_secret", nats.token_secret.as_ref())?;
            let password = secret("password_secret", nats.password_secret.as_ref())?;
            let auth = match (token, nats.username.clone(), password) {
                (Some(token), _, _) => nats::NatsAuth::Token(token),
                (None, Some(user), Some(password)) => {
                    nats::NatsAuth::UserPassword { user, password }
                }
                _ => nats::NatsAuth::None,
            };
            Arc::new(NatsTransport::new(nats, auth))
        }
        SinkConfig::Sns(sns) => {
            let required = |field: &'static str, name: &String| {
                secret(field, Some(name))?.ok_or_else(|| SinkBuildError::MissingSecret {
                    uid: uid.to_owned(),
                    field,
                    name: name.clone(),
                })
            };
            let credentials = sns::sigv4::Credentials {
                access_key_id: required("access_key_id_secret", &sns.access_key_id_secret)?
                    .expose()
                    .to_owned(),
                secret_access_key: required(
                    "secret_access_key_secret",
                    &sns.secret_access_key_secret,
                )?
                .expose()
                .to_owned(),
                session_token: secret("session_token_secret", sns.session_token_secret.as_ref())?
                    .map(|token| token.expose().to_owned()),
            };
            Arc::new(
                SnsTransport::new(sns, credentials, egress)
                    .map_err(|error| client(error.to_string()))?,
            )
        }
        SinkConfig::ObjectStorage(objects) => {
            Arc::new(ObjectStorageTransport::new(object_target(objects, context)?))
        }
        SinkConfig::RabbitMq(rabbit) => {
            let password = secret("password_secret", rabbit.password_secret.as_ref())?;
            Arc::new(RabbitMqTransport::new(rabbit, password).map_err(client)?)
        }
    };
    Ok(Some(transport))
}

/// The value of the secret `name` a sink's `field` names (`None` when it names none).
fn resolve(
    context: SinkContext<'_>,
    uid: &str,
    field: &'static str,
    name: Option<&String>,
) -> Result<Option<SecretValue>, SinkBuildError> {
    let Some(name) = name else { return Ok(None) };
    context.secrets.get(name).map(|found| Some(found.value.clone())).ok_or_else(|| {
        SinkBuildError::MissingSecret { uid: uid.to_owned(), field, name: name.clone() }
    })
}

/// The bucket and layout of an `object_storage` sink.
fn object_target(
    config: &ObjectStorageSinkConfig,
    context: SinkContext<'_>,
) -> Result<object_storage::Target, SinkBuildError> {
    let uid = config.uid.as_str();
    let secret = |field: &'static str, name: Option<&String>| {
        resolve(context, uid, field, name).map(|value| value.map(|v| v.expose().to_owned()))
    };
    let credentials = object_storage::Credentials {
        access_key_id: secret("access_key_id_secret", Some(&config.access_key_id_secret))?
            .unwrap_or_default(),
        secret_access_key: secret(
            "secret_access_key_secret",
            Some(&config.secret_access_key_secret),
        )?
        .unwrap_or_default(),
        session_token: secret("session_token_secret", config.session_token_secret.as_ref())?,
    };
    object_storage::Target::new(
        config,
        credentials,
        context.stream,
        context.pipeline_id,
        context.guarantee,
    )
    .map_err(|reason| SinkBuildError::Client { uid: uid.to_owned(), reason })
}
