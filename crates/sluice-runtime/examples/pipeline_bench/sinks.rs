//! The external sinks a run can deliver to instead of the managed one: a webhook receiver in
//! this process, a NATS JetStream stream or a Kafka topic made for the run.

use std::sync::Arc;

use sluice_bus::{KafkaLog, KafkaSettings, StreamLog};
use sluice_core::clock::SystemClock;
use sluice_core::pipeline::{
    ExternalKafkaSinkConfig, ManagedSinkConfig, NatsSinkConfig, SinkConfig, WebhookCompression,
    WebhookSinkConfig,
};

use crate::latency::sent_at_us;
use crate::{BoxError, SINK_NAME, SinkChoice};

/// The webhook receiver of the run: counts records, and keeps the latency of each record
/// that carries `sent_at_us`.
#[derive(Default)]
pub(crate) struct Receiver {
    pub(crate) records: std::sync::atomic::AtomicU64,
    pub(crate) latencies_us: std::sync::Mutex<Vec<i64>>,
}

pub(crate) async fn start_receiver() -> Result<(Arc<Receiver>, String), BoxError> {
    let receiver = Arc::new(Receiver::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    let state = receiver.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let state = state.clone();
            async move {
                let now_us = chrono::Utc::now().timestamp_micros();
                let Ok(items) = serde_json::from_slice::<Vec<&serde_json::value::RawValue>>(&body)
                else {
                    return axum::http::StatusCode::BAD_REQUEST;
                };
                let mut latencies = Vec::new();
                for item in &items {
                    if let Some(sent) = sent_at_us(item.get().as_bytes()) {
                        latencies.push(now_us - sent);
                    }
                }
                state.records.fetch_add(items.len() as u64, std::sync::atomic::Ordering::Relaxed);
                state.latencies_us.lock().expect("not poisoned").extend(latencies);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((receiver, url))
}

/// The sink config of `choice`, with what it needs made for the run (a receiver, a stream,
/// a topic).
pub(crate) async fn external_sink(
    choice: &SinkChoice,
) -> Result<(SinkConfig, Option<Arc<Receiver>>), BoxError> {
    let run = format!(
        "{:x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos()
    );
    Ok(match choice {
        SinkChoice::Managed => (
            SinkConfig::Kafka(ManagedSinkConfig {
                name: SINK_NAME.to_owned(),
                uid: "sk-bench".to_owned(),
            }),
            None,
        ),
        SinkChoice::Webhook => {
            let (receiver, url) = start_receiver().await?;
            let config = WebhookSinkConfig {
                name: SINK_NAME.to_owned(),
                url,
                hash_key: None,
                compression: WebhookCompression::None,
                uid: "sk-bench".to_owned(),
            };
            (SinkConfig::Webhook(config), Some(receiver))
        }
        SinkChoice::Nats(url) => {
            use sluice_runtime::sinks::nats::{Connection, NatsAuth};
            let name = format!("BENCH_{run}");
            let mut connection = Connection::open(url, &NatsAuth::None, false).await?;
            let stream = serde_json::json!({"name": name, "subjects": [format!("{name}.>")], "storage": "file"});
            connection
                .request(&format!("$JS.API.STREAM.CREATE.{name}"), stream.to_string().as_bytes())
                .await?;
            let config = NatsSinkConfig {
                name: SINK_NAME.to_owned(),
                url: url.clone(),
                subject: format!("{name}.records"),
                username: None,
                password_secret: None,
                token_secret: None,
                tls: false,
                uid: "sk-bench".to_owned(),
            };
            (SinkConfig::Nats(config), None)
        }
        SinkChoice::ExternalKafka(servers) => {
            let topic = format!("bench-external-{run}");
            let cluster = KafkaLog::connect(
                KafkaSettings::parse(&format!("kafka://{servers}"))?,
                Arc::new(SystemClock),
            )
            .await?;
            let config = sluice_bus::TopicConfig {
                partitions: 1,
                retention: sluice_bus::Retention::default(),
            };
            cluster.create_topic(&topic, config).await?;
            let config = ExternalKafkaSinkConfig {
                name: SINK_NAME.to_owned(),
                bootstrap_servers: servers.clone(),
                topic,
                security_protocol: "plaintext".to_owned(),
                sasl_mechanism: None,
                sasl_username_secret: None,
                sasl_password_secret: None,
                compression: "none".to_owned(),
                uid: "sk-bench".to_owned(),
            };
            (SinkConfig::ExternalKafka(config), None)
        }
    })
}
