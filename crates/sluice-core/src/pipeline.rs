//! The pipeline record (docs/contract.md §Pipeline record) and its parts: source, transforms, sink.
//!
//! [`PipelineSpec`] is the editable part a client sends; [`validate::validate_pipeline_body`]
//! turns a raw JSON body into one, reporting every broken rule. [`Pipeline`] is the stored
//! record: the spec plus the server-managed fields.

pub mod sink;
pub mod validate;

pub use sink::{
    ExternalKafkaSinkConfig, ManagedSinkConfig, NatsSinkConfig, ObjectStorageSinkConfig,
    RabbitMqSinkConfig, SnsSinkConfig, WebhookCompression, WebhookSinkConfig,
    sql::{SqlColumns, SqlSinkConfig, SqlWriteMode},
};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Worker size of a deployment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum PodSize {
    #[default]
    S,
    M,
    L,
    XL,
}

impl PodSize {
    pub const NAMES: [&'static str; 4] = ["S", "M", "L", "XL"];

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "S" => Some(Self::S),
            "M" => Some(Self::M),
            "L" => Some(Self::L),
            "XL" => Some(Self::XL),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// Number of workers a deployment of this size runs.
    pub fn workers(self) -> usize {
        match self {
            Self::S => 1,
            Self::M => 2,
            Self::L => 4,
            Self::XL => 8,
        }
    }
}

/// What happens to records when the pipeline errors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryGuarantee {
    /// No loss: offsets are committed after the sink acknowledges; the source is backpressured.
    #[default]
    AtLeastOnce,
    /// At most once: failed batches are dropped and counted; the source is never held back.
    BestEffort,
}

impl DeliveryGuarantee {
    pub const NAMES: [&'static str; 2] = ["at_least_once", "best_effort"];

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "at_least_once" => Some(Self::AtLeastOnce),
            "best_effort" => Some(Self::BestEffort),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// Transport of a source stream; chosen by the catalog, never by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SourceType {
    Pubsub,
    Kafka,
}

/// The one chain stream a pipeline reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Source {
    /// Set by the service from the catalog entry; a value sent by the client is ignored.
    #[serde(rename = "type")]
    #[schema(required = false)]
    pub source_type: SourceType,
    pub chain: String,
    pub entity: String,
    /// Stream from the chain tip before finality (lower latency, may carry reorged data).
    #[serde(default)]
    pub is_zerolag: bool,
}

/// One step of the transform chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type")]
pub enum Transform {
    /// Passes only records whose extracted value (lowercased) is in the transform's set.
    #[serde(rename = "redis_set_filter")]
    SetFilter {
        /// Generated when omitted on create; give it to keep an existing transform.
        #[schema(required = false)]
        uid: String,
        /// `root = this.<path>`: the value to test.
        filter_expr: String,
    },
    /// A JavaScript function `transform(record)`.
    #[serde(rename = "v8")]
    Script {
        /// Generated when omitted on create; give it to keep an existing transform.
        #[schema(required = false)]
        uid: String,
        /// JavaScript defining `function transform(record)`.
        script: String,
    },
}

impl Transform {
    pub fn uid(&self) -> &str {
        match self {
            Self::SetFilter { uid, .. } | Self::Script { uid, .. } => uid,
        }
    }

    pub fn is_set_filter(&self) -> bool {
        matches!(self, Self::SetFilter { .. })
    }
}

/// Where processed records go: one sink type, tagged by `type` as in the API. Checked by
/// [`SinkConfig::validate`]; the runtime builds the running sink from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type")]
#[schema(as = Sink)]
pub enum SinkConfig {
    /// `kafka`: a managed topic that Sluice keeps and serves to the pipeline's readers.
    #[serde(rename = "kafka")]
    Kafka(ManagedSinkConfig),
    /// `webhook`: JSON arrays POSTed to the user's endpoint, optionally signed.
    #[serde(rename = "webhook")]
    Webhook(WebhookSinkConfig),
    /// `external_kafka`: a topic of the user's own Kafka cluster.
    #[serde(rename = "external_kafka")]
    ExternalKafka(ExternalKafkaSinkConfig),
    /// `nats`: a NATS JetStream stream.
    #[serde(rename = "nats")]
    Nats(NatsSinkConfig),
    /// `sns`: an SNS-compatible notification topic.
    #[serde(rename = "sns")]
    Sns(SnsSinkConfig),
    /// `postgres`: a table of the user's PostgreSQL, written exactly once.
    #[serde(rename = "postgres")]
    Postgres(SqlSinkConfig),
    /// `mysql`: a table of the user's MySQL or MariaDB, written exactly once.
    #[serde(rename = "mysql")]
    Mysql(SqlSinkConfig),
    /// `object_storage`: files of records in an S3-compatible bucket.
    #[serde(rename = "object_storage")]
    ObjectStorage(ObjectStorageSinkConfig),
    /// `rabbitmq`: an exchange of the user's AMQP 0.9.1 broker.
    #[serde(rename = "rabbitmq")]
    RabbitMq(RabbitMqSinkConfig),
}

impl SinkConfig {
    /// The sink's uid.
    pub fn uid(&self) -> &str {
        match self {
            Self::Kafka(sink) => &sink.uid,
            Self::Webhook(sink) => &sink.uid,
            Self::ExternalKafka(sink) => &sink.uid,
            Self::Nats(sink) => &sink.uid,
            Self::Sns(sink) => &sink.uid,
            Self::Postgres(sink) | Self::Mysql(sink) => &sink.uid,
            Self::ObjectStorage(sink) => &sink.uid,
            Self::RabbitMq(sink) => &sink.uid,
        }
    }

    /// The sink's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Kafka(sink) => &sink.name,
            Self::Webhook(sink) => &sink.name,
            Self::ExternalKafka(sink) => &sink.name,
            Self::Nats(sink) => &sink.name,
            Self::Sns(sink) => &sink.name,
            Self::Postgres(sink) | Self::Mysql(sink) => &sink.name,
            Self::ObjectStorage(sink) => &sink.name,
            Self::RabbitMq(sink) => &sink.name,
        }
    }

    /// The `type` the API shows.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Kafka(_) => "kafka",
            Self::Webhook(_) => "webhook",
            Self::ExternalKafka(_) => "external_kafka",
            Self::Nats(_) => "nats",
            Self::Sns(_) => "sns",
            Self::Postgres(_) => "postgres",
            Self::Mysql(_) => "mysql",
            Self::ObjectStorage(_) => "object_storage",
            Self::RabbitMq(_) => "rabbitmq",
        }
    }

    /// The organization secrets the sink reads, as `(field, secret name)`.
    pub fn secrets(&self) -> Vec<(&'static str, &str)> {
        let fields: Vec<(&'static str, Option<&String>)> = match self {
            Self::Kafka(_) => Vec::new(),
            Self::Webhook(sink) => vec![("hash_key", sink.hash_key.as_ref())],
            Self::ExternalKafka(sink) => vec![
                ("sasl_username_secret", sink.sasl_username_secret.as_ref()),
                ("sasl_password_secret", sink.sasl_password_secret.as_ref()),
            ],
            Self::Nats(sink) => vec![
                ("password_secret", sink.password_secret.as_ref()),
                ("token_secret", sink.token_secret.as_ref()),
            ],
            Self::Sns(sink) => vec![
                ("access_key_id_secret", Some(&sink.access_key_id_secret)),
                ("secret_access_key_secret", Some(&sink.secret_access_key_secret)),
                ("session_token_secret", sink.session_token_secret.as_ref()),
            ],
            Self::Postgres(sink) | Self::Mysql(sink) => {
                vec![("connection", Some(&sink.connection))]
            }
            Self::ObjectStorage(sink) => vec![
                ("access_key_id_secret", Some(&sink.access_key_id_secret)),
                ("secret_access_key_secret", Some(&sink.secret_access_key_secret)),
                ("session_token_secret", sink.session_token_secret.as_ref()),
            ],
            Self::RabbitMq(sink) => vec![("password_secret", sink.password_secret.as_ref())],
        };
        fields.into_iter().filter_map(|(field, name)| Some((field, name?.as_str()))).collect()
    }

    /// Whether records leave Sluice through this sink (anything but the managed topic).
    pub fn is_external(&self) -> bool {
        !matches!(self, Self::Kafka(_))
    }

    /// Whether the sink's traffic can leave from the operator's egress address
    /// (`static_egress_ip`): the HTTP sinks.
    pub fn can_bind_egress(&self) -> bool {
        matches!(self, Self::Kafka(_) | Self::Webhook(_) | Self::Sns(_))
    }
}

/// `source -> transforms[] -> sinks[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PipelineConfig {
    pub source: Source,
    pub transforms: Vec<Transform>,
    /// Exactly one sink.
    pub sinks: Vec<SinkConfig>,
}

/// The editable fields of a pipeline: what a create or update body carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PipelineSpec {
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    #[serde(default)]
    pub static_egress_ip: bool,
    #[serde(default)]
    pub pod_size: PodSize,
    #[serde(default)]
    pub delivery_guarantee: DeliveryGuarantee,
    pub pipeline_config: PipelineConfig,
}

/// A stored pipeline record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Pipeline {
    pub id: String,
    pub name: String,
    pub description: String,
    pub tags: Option<Vec<String>>,
    pub static_egress_ip: bool,
    pub pod_size: PodSize,
    pub delivery_guarantee: DeliveryGuarantee,
    /// The owning user (an org/team/user membership), from the API key that created it.
    pub owner_org_team_user_id: String,
    pub organization_id: String,
    #[serde(with = "crate::time::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::time::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: DateTime<Utc>,
    pub pipeline_config: PipelineConfig,
}

impl Pipeline {
    /// A new record owned by `owner` in `organization_id`.
    pub fn new(
        id: String,
        spec: PipelineSpec,
        owner: String,
        organization_id: String,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            id,
            name: spec.name,
            description: spec.description,
            tags: spec.tags,
            static_egress_ip: spec.static_egress_ip,
            pod_size: spec.pod_size,
            delivery_guarantee: spec.delivery_guarantee,
            owner_org_team_user_id: owner,
            organization_id,
            created_at: now,
            updated_at: now,
            pipeline_config: spec.pipeline_config,
        }
    }

    /// Replaces every editable field; server-managed fields keep their values.
    pub fn apply(&mut self, spec: PipelineSpec, now: DateTime<Utc>) {
        self.name = spec.name;
        self.description = spec.description;
        self.tags = spec.tags;
        self.static_egress_ip = spec.static_egress_ip;
        self.pod_size = spec.pod_size;
        self.delivery_guarantee = spec.delivery_guarantee;
        self.pipeline_config = spec.pipeline_config;
        self.updated_at = now;
    }

    /// Uids of the set-filter transforms, whose filter values the store keeps.
    pub fn set_filter_uids(&self) -> impl Iterator<Item = &str> {
        self.pipeline_config.transforms.iter().filter(|t| t.is_set_filter()).map(Transform::uid)
    }
}
