//! The managed sink (`kafka`): a topic of the stream log that Sluice keeps, read by the
//! pipeline's consumers over the API (records page and live tail). Its records, the batch's
//! dead letters and logs, and the source offsets are written in one step of the log
//! ([`StreamLog::append_and_commit`]): one durable transaction on the embedded log.

use std::sync::Arc;

use serde_json::json;
use sluice_bus::{ClientAccess, NewRecord, StreamLog, topics};
use sluice_core::pipeline::SinkConfig;

use super::{Settle, Sink, SinkConnection, SinkError};
use crate::delivery::{Delivery, SideTopics};

/// A managed topic.
#[derive(Debug, Clone)]
pub struct ManagedSink {
    config: SinkConfig,
    topic: String,
}

impl ManagedSink {
    pub fn new(pipeline_id: &str, config: SinkConfig) -> Self {
        let topic = topics::sink_topic(pipeline_id, config.name());
        Self { config, topic }
    }
}

#[async_trait::async_trait]
impl Sink for ManagedSink {
    fn config(&self) -> &SinkConfig {
        &self.config
    }

    fn managed_topic(&self) -> Option<&str> {
        Some(&self.topic)
    }

    async fn deliver(
        &self,
        log: &Arc<dyn StreamLog>,
        delivery: &Delivery,
        side: &SideTopics,
        settle: Settle<'_>,
    ) -> Result<(), SinkError> {
        let appends: [(&str, &[NewRecord]); 3] = [
            (&self.topic, &delivery.out),
            (&side.dead_letters, &delivery.dead),
            (&side.logs, &delivery.logs),
        ];
        log.append_and_commit(&appends, settle.group, settle.source, settle.offsets)
            .await
            .map(|_| ())
            .map_err(|error| SinkError::settling(self.config.uid(), error))
    }

    fn connection(&self, pipeline_id: &str) -> SinkConnection {
        let records_url = format!("/api/v1/beam/{pipeline_id}/sinks/{}/records", self.config.uid());
        SinkConnection {
            uid: self.config.uid().to_owned(),
            name: self.config.name().to_owned(),
            sink_type: self.config.type_name(),
            topic: self.topic.clone(),
            connection: json!({
                "transport": "http",
                "records_url": records_url,
                "stream_url": format!("{records_url}/stream"),
                "auth_header": "X-API-Key",
                "topic": self.topic,
                "partitions": crate::SINK_PARTITIONS,
            }),
            consumer_snippets: json!({
                "curl": format!(
                    "curl -s \"$SLUICE_URL{records_url}?offset=0&limit=500&wait_ms=5000\" -H \"X-API-Key: $SLUICE_API_KEY\""
                ),
                "curl_live": format!(
                    "curl -sN \"$SLUICE_URL{records_url}/stream\" -H \"X-API-Key: $SLUICE_API_KEY\""
                ),
                "python": format!(
                    "import os, requests\n\
                     url = os.environ['SLUICE_URL'] + '{records_url}'\n\
                     headers = {{'X-API-Key': os.environ['SLUICE_API_KEY']}}\n\
                     offset = 0\n\
                     while True:\n    \
                         page = requests.get(url, params={{'offset': offset, 'limit': 500, 'wait_ms': 5000}}, headers=headers).json()\n    \
                         for record in page['records']:\n        \
                             print(record['key'], record['value'])\n    \
                         offset = page['next_offset']\n"
                ),
            }),
            records_url,
        }
    }
}

/// Adds what a Kafka client needs to `connection`, when the log is a Kafka cluster: the
/// managed topic is then an ordinary Kafka topic, readable by any client.
pub fn add_kafka_access(connection: &mut SinkConnection, access: &ClientAccess) {
    let ClientAccess {
        bootstrap_servers,
        topic,
        group_id,
        security_protocol,
        sasl_mechanism,
        username,
        password,
    } = access;
    if let Some(fields) = connection.connection.as_object_mut() {
        fields.insert("transport".to_owned(), json!("kafka"));
        fields.insert("bootstrap_servers".to_owned(), json!(bootstrap_servers));
        fields.insert("topic".to_owned(), json!(topic));
        fields.insert("group_id".to_owned(), json!(group_id));
        fields.insert("security_protocol".to_owned(), json!(security_protocol));
        fields.insert("sasl_mechanism".to_owned(), json!(sasl_mechanism));
        fields.insert("username".to_owned(), json!(username));
        fields.insert("password".to_owned(), json!(password));
        fields.insert("key_format".to_owned(), json!("the record's stream key, UTF-8"));
        fields.insert("value_format".to_owned(), json!("the record, JSON"));
    }
    let sasl = sasl_mechanism.as_deref().filter(|_| username.is_some());
    let python_sasl = sasl.map_or_else(String::new, |mechanism| {
        format!(
            "    'sasl.mechanism': '{mechanism}',\n    \
             'sasl.username': os.environ['SLUICE_KAFKA_USERNAME'],\n    \
             'sasl.password': os.environ['SLUICE_KAFKA_PASSWORD'],\n"
        )
    });
    let kcat_sasl = sasl.map_or_else(String::new, |mechanism| {
        format!(
            " -X sasl.mechanism={mechanism} -X sasl.username=\"$SLUICE_KAFKA_USERNAME\" \
             -X sasl.password=\"$SLUICE_KAFKA_PASSWORD\""
        )
    });
    let kafkajs_ssl = security_protocol.ends_with("SSL");
    let kafkajs_sasl = sasl.map_or_else(String::new, |mechanism| {
        format!(
            ", sasl: {{ mechanism: '{}', username: process.env.SLUICE_KAFKA_USERNAME, \
             password: process.env.SLUICE_KAFKA_PASSWORD }}",
            mechanism.to_ascii_lowercase()
        )
    });
    let brokers: Vec<String> =
        bootstrap_servers.split(',').map(|broker| format!("'{broker}'")).collect();
    if let Some(snippets) = connection.consumer_snippets.as_object_mut() {
        snippets.insert(
            "python".to_owned(),
            json!(format!(
                "import json, os\n\
                 from confluent_kafka import Consumer\n\
                 consumer = Consumer({{\n    \
                     'bootstrap.servers': '{bootstrap_servers}',\n    \
                     'group.id': '{group_id}',\n    \
                     'auto.offset.reset': 'earliest',\n    \
                     'session.timeout.ms': 10000,\n    \
                     'security.protocol': '{security_protocol}',\n\
                 {python_sasl}}})\n\
                 consumer.subscribe(['{topic}'])\n\
                 while True:\n    \
                     message = consumer.poll(1.0)\n    \
                     if message is None:\n        \
                         continue\n    \
                     if message.error():\n        \
                         raise SystemExit(message.error())\n    \
                     print(json.dumps({{'key': message.key().decode(), 'value': json.loads(message.value())}}), flush=True)\n"
            )),
        );
        snippets.insert(
            "kcat".to_owned(),
            json!(format!(
                "kcat -C -b {bootstrap_servers} -t {topic} -o beginning -X security.protocol={security_protocol}{kcat_sasl} -f '%k %s\\n'"
            )),
        );
        snippets.insert(
            "kafkajs".to_owned(),
            json!(format!(
                "const {{ Kafka }} = require('kafkajs');\n\
                 const kafka = new Kafka({{ brokers: [{}], ssl: {kafkajs_ssl}{kafkajs_sasl} }});\n\
                 const consumer = kafka.consumer({{ groupId: '{group_id}' }});\n\
                 (async () => {{\n  \
                     await consumer.connect();\n  \
                     await consumer.subscribe({{ topic: '{topic}', fromBeginning: true }});\n  \
                     await consumer.run({{ eachMessage: async ({{ message }}) => console.log(message.key.toString(), message.value.toString()) }});\n\
                 }})();\n",
                brokers.join(", ")
            )),
        );
    }
}

#[cfg(test)]
mod tests {
    use sluice_bus::{EmbeddedLog, Retention, TopicConfig};
    use sluice_core::clock::SystemClock;
    use sluice_core::pipeline::ManagedSinkConfig;

    use super::*;

    fn record(key: &str) -> NewRecord {
        NewRecord::new(key.as_bytes().to_vec(), &b"{}"[..])
    }

    #[tokio::test]
    async fn a_delivery_writes_records_dead_letters_logs_and_offsets_together() {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn StreamLog> = Arc::new(
            EmbeddedLog::open(&dir.path().join("log.redb"), Arc::new(SystemClock)).unwrap(),
        );
        let config =
            SinkConfig::Kafka(ManagedSinkConfig { name: "out".to_owned(), uid: "sk-1".to_owned() });
        let sink = ManagedSink::new("p1", config);
        let side = SideTopics::new("p1");
        let one = TopicConfig { partitions: 1, retention: Retention::default() };
        for topic in [sink.managed_topic().unwrap(), &side.dead_letters, &side.logs, "source"] {
            log.create_topic(topic, one).await.unwrap();
        }
        let delivery = Delivery {
            out: vec![record("a"), record("b")],
            dead: vec![record("c")],
            logs: vec![record("d")],
            made_at: chrono::Utc::now(),
            origins: Vec::new(),
        };
        let settle = Settle { group: "g", source: "source", offsets: &[(0, 7)] };
        sink.deliver(&log, &delivery, &side, settle).await.unwrap();
        let ends = |topic: String| {
            let log = log.clone();
            async move { log.offsets(&topic).await.unwrap()[0].end }
        };
        assert_eq!(ends(topics::sink_topic("p1", "out")).await, 2);
        assert_eq!(ends(side.dead_letters.clone()).await, 1);
        assert_eq!(ends(side.logs.clone()).await, 1);
        assert_eq!(log.committed("g", "source").await.unwrap().get(&0), Some(&7));

        // A topic gone (torn down under the worker) is not worth retrying.
        log.delete_topic(sink.managed_topic().unwrap()).await.unwrap();
        let error = sink.deliver(&log, &delivery, &side, settle).await.unwrap_err();
        assert!(!error.is_retryable());
        assert_eq!(error.uid, "sk-1");
    }

    #[test]
    fn the_connection_names_the_topic_and_the_records_url_of_the_sink_uid() {
        let config =
            SinkConfig::Kafka(ManagedSinkConfig { name: "out".to_owned(), uid: "sk-1".to_owned() });
        let connection = ManagedSink::new("p1", config).connection("p1");
        assert_eq!(connection.sink_type, "kafka");
        assert_eq!(connection.topic, topics::sink_topic("p1", "out"));
        assert_eq!(connection.records_url, "/api/v1/beam/p1/sinks/sk-1/records");
        assert_eq!(
            connection.connection["stream_url"],
            "/api/v1/beam/p1/sinks/sk-1/records/stream"
        );
        assert!(connection.consumer_snippets["python"].as_str().unwrap().contains("sk-1/records"));
    }

    #[test]
    fn on_a_kafka_log_the_connection_carries_what_a_kafka_client_needs() {
        let config =
            SinkConfig::Kafka(ManagedSinkConfig { name: "out".to_owned(), uid: "sk-1".to_owned() });
        let mut connection = ManagedSink::new("p1", config).connection("p1");
        let access = ClientAccess {
            bootstrap_servers: "b1:9092,b2:9092".to_owned(),
            topic: "prod.sink.p1.out".to_owned(),
            group_id: "prod.consumer.sink.p1.out".to_owned(),
            security_protocol: "SASL_SSL".to_owned(),
            sasl_mechanism: Some("SCRAM-SHA-512".to_owned()),
            username: Some("reader".to_owned()),
            password: Some("s3cret".to_owned()),
        };
        add_kafka_access(&mut connection, &access);
        let fields = &connection.connection;
        assert_eq!(fields["transport"], "kafka");
        assert_eq!(fields["bootstrap_servers"], "b1:9092,b2:9092");
        assert_eq!(fields["topic"], "prod.sink.p1.out");
        assert_eq!(fields["group_id"], "prod.consumer.sink.p1.out");
        assert_eq!(fields["sasl_mechanism"], "SCRAM-SHA-512");
        assert_eq!(fields["username"], "reader");
        // The HTTP way stays.
        assert_eq!(fields["records_url"], "/api/v1/beam/p1/sinks/sk-1/records");
        let python = connection.consumer_snippets["python"].as_str().unwrap();
        assert!(python.contains("'sasl.mechanism': 'SCRAM-SHA-512'"), "{python}");
        assert!(python.contains("consumer.subscribe(['prod.sink.p1.out'])"), "{python}");
        // Snippets read the password from the environment, never carry it.
        for snippet in connection.consumer_snippets.as_object().unwrap().values() {
            assert!(!snippet.as_str().unwrap().contains("s3cret"), "{snippet}");
        }
        let kafkajs = connection.consumer_snippets["kafkajs"].as_str().unwrap();
        assert!(
            kafkajs.contains(
                "brokers: ['b1:9092', 'b2:9092'], ssl: true, sasl: { mechanism: 'scram-sha-512'"
            ),
            "{kafkajs}"
        );
    }
}
