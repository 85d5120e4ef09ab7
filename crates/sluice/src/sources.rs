//! `serve`'s Kafka sources: `[[sources]]` in the config file, each a topic of the user's own
//! Kafka cluster feeding one chain stream (docs/chains.md, "Kafka sources"), turned into
//! `sluice_chains::kafka_source` sources, and their status for `GET /api/v1/chains`.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::bail;
use serde::Deserialize;
use sluice_api::chains::ChainStatusBody;
use sluice_chains::kafka_source::{KafkaSourceConfig, SourceStatus};
use sluice_core::catalog::Catalog;

/// One `[[sources]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceFileSettings {
    /// Names the source (status, metrics, dead-letter list); default
    /// `<chain>.<entity>.<topic>`.
    pub name: Option<String>,
    pub chain: String,
    pub entity: String,
    /// `host:port[,host:port…]`.
    pub bootstrap_servers: String,
    pub topic: String,
    pub group_id: String,
    /// `PLAINTEXT` (the default), `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`.
    pub security_protocol: Option<String>,
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub sasl_mechanism: Option<String>,
    pub sasl_username: Option<String>,
    /// The environment variable holding the SASL user name.
    pub sasl_username_env: Option<String>,
    pub sasl_password: Option<String>,
    /// The environment variable holding the SASL password.
    pub sasl_password_env: Option<String>,
    pub ssl_ca_location: Option<String>,
    pub ssl_certificate_location: Option<String>,
    pub ssl_key_location: Option<String>,
    pub ssl_key_password: Option<String>,
    pub ssl_key_password_env: Option<String>,
    /// Where a group without committed offsets starts: `"earliest"` (the default) or
    /// `"latest"`.
    pub start: Option<String>,
    /// Messages per batch (one append, one commit); default 5,000.
    pub max_batch: Option<usize>,
}

/// A value from the file or from the environment variable the file names.
fn value_or_env(
    source: &str,
    what: &str,
    value: Option<&String>,
    env: Option<&String>,
) -> anyhow::Result<Option<String>> {
    match (value, env) {
        (Some(_), Some(_)) => bail!("source {source}: give {what} or {what}_env, not both"),
        (Some(value), None) => Ok(Some(value.clone())),
        (None, Some(var)) => match std::env::var(var) {
            Ok(value) => Ok(Some(value)),
            Err(_) => bail!("source {source}: {what}_env names {var}, which is not set"),
        },
        (None, None) => Ok(None),
    }
}

/// Checks the sources against the catalog and builds their configurations.
///
/// # Errors
/// A stream the catalog does not have, a name twice, a bad setting, an unset environment
/// variable.
pub fn configs(
    sources: &[SourceFileSettings],
    catalog: &Catalog,
) -> anyhow::Result<Vec<KafkaSourceConfig>> {
    let mut out: Vec<KafkaSourceConfig> = Vec::new();
    for source in sources {
        let name = source.name.clone().unwrap_or_else(|| {
            let raw = format!("{}.{}.{}", source.chain, source.entity, source.topic);
            raw.chars()
                .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
                .collect()
        });
        let valid = !name.is_empty()
            && name.len() <= 128
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !valid {
            bail!("source name {name:?} must be 1 to 128 of [A-Za-z0-9._-]");
        }
        if out.iter().any(|c| c.name == name) {
            bail!("source {name} is configured twice");
        }
        if catalog.find(&source.chain, &source.entity).is_none() {
            bail!("source {name}: the catalog has no stream {}.{}", source.chain, source.entity);
        }
        for (what, value) in [
            ("bootstrap_servers", &source.bootstrap_servers),
            ("topic", &source.topic),
            ("group_id", &source.group_id),
        ] {
            if value.trim().is_empty() {
                bail!("source {name}: {what} is empty");
            }
        }
        let mut client = BTreeMap::new();
        let mut set = |key: &str, value: Option<String>| {
            if let Some(value) = value {
                client.insert(key.to_owned(), value);
            }
        };
        set("security.protocol", source.security_protocol.clone());
        set("sasl.mechanism", source.sasl_mechanism.clone());
        let user = source.sasl_username.as_ref();
        set(
            "sasl.username",
            value_or_env(&name, "sasl_username", user, source.sasl_username_env.as_ref())?,
        );
        let password = source.sasl_password.as_ref();
        set(
            "sasl.password",
            value_or_env(&name, "sasl_password", password, source.sasl_password_env.as_ref())?,
        );
        set("ssl.ca.location", source.ssl_ca_location.clone());
        set("ssl.certificate.location", source.ssl_certificate_location.clone());
        set("ssl.key.location", source.ssl_key_location.clone());
        let key_password = source.ssl_key_password.as_ref();
        set(
            "ssl.key.password",
            value_or_env(
                &name,
                "ssl_key_password",
                key_password,
                source.ssl_key_password_env.as_ref(),
            )?,
        );
        match source.start.as_deref() {
            None | Some("earliest") => {}
            Some("latest") => set("auto.offset.reset", Some("latest".to_owned())),
            Some(other) => {
                bail!("source {name}: start {other:?} is not \"earliest\" or \"latest\"")
            }
        }
        out.push(KafkaSourceConfig {
            name,
            chain: source.chain.clone(),
            entity: source.entity.clone(),
            bootstrap_servers: source.bootstrap_servers.clone(),
            topic: source.topic.clone(),
            group_id: source.group_id.clone(),
            client,
            max_batch: source.max_batch.unwrap_or(5_000).clamp(1, 100_000),
        });
    }
    Ok(out)
}

/// Reads one series' value from a source's status.
type Pick = fn(&SourceStatus) -> Option<u64>;

/// A running source's status, for the API.
pub struct SourceEntry {
    pub config: KafkaSourceConfig,
    pub status: Arc<SourceStatus>,
}

impl SourceEntry {
    pub fn body(&self) -> ChainStatusBody {
        let s = &self.status;
        let count = |v: &std::sync::atomic::AtomicU64| v.load(std::sync::atomic::Ordering::Relaxed);
        ChainStatusBody {
            chain: self.config.chain.clone(),
            rpc_url: Some(format!(
                "kafka://{}/{}",
                self.config.bootstrap_servers, self.config.topic
            )),
            head: None,
            finalized: None,
            ingested: s.block(),
            zerolag_ingested: None,
            lag_blocks: None,
            lag_seconds: None,
            reorgs: 0,
            rpc_requests: 0,
            rpc_errors: 0,
            last_error: s.last_error(),
            rejected: Some(count(&s.dead_letters)),
            lag_bytes: None,
            source: Some(self.config.name.clone()),
            entity: Some(self.config.entity.clone()),
            records: Some(count(&s.records)),
            lag_messages: s.lag(),
        }
    }

    /// Prometheus text of the sources' series.
    pub fn metrics_text(entries: &[SourceEntry]) -> String {
        let mut out = String::new();
        let series: [(&str, &str, Pick); 3] = [
            ("sluice_source_records_total", "counter", |s| {
                Some(s.records.load(std::sync::atomic::Ordering::Relaxed))
            }),
            ("sluice_source_dead_letters_total", "counter", |s| {
                Some(s.dead_letters.load(std::sync::atomic::Ordering::Relaxed))
            }),
            ("sluice_source_lag_messages", "gauge", SourceStatus::lag),
        ];
        for (name, kind, pick) in series {
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            for entry in entries {
                if let Some(value) = pick(&entry.status) {
                    let c = &entry.config;
                    out.push_str(&format!(
                        "{name}{{source=\"{}\",chain=\"{}\",entity=\"{}\"}} {value}\n",
                        c.name, c.chain, c.entity
                    ));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(extra: &str) -> SourceFileSettings {
        toml::from_str(&format!(
            "chain = \"hyperliquid\"\nentity = \"fill\"\nbootstrap_servers = \"b:9092\"\n\
             topic = \"fills.v1\"\ngroup_id = \"g\"\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn sources_take_credentials_from_the_file_or_the_environment() {
        let made = configs(&[table("")], &Catalog::default()).unwrap();
        assert_eq!(made[0].name, "hyperliquid.fill.fills.v1");
        assert!(made[0].client.is_empty());
        let made = configs(
            &[table("security_protocol = \"SASL_SSL\"\nsasl_mechanism = \"PLAIN\"\nsasl_username = \"u\"\nsasl_password_env = \"PATH\"\nstart = \"latest\"")],
            &Catalog::default(),
        )
        .unwrap();
        let client = &made[0].client;
        assert_eq!(client["sasl.username"], "u");
        assert_eq!(client["sasl.password"], std::env::var("PATH").unwrap());
        assert_eq!(client["auto.offset.reset"], "latest");
        let unset = table("sasl_password_env = \"SLUICE_SURELY_UNSET_VARIABLE\"");
        let error = configs(&[unset], &Catalog::default()).unwrap_err().to_string();
        assert!(error.contains("SLUICE_SURELY_UNSET_VARIABLE, which is not set"), "{error}");
        let mut unknown = table("");
        unknown.entity = "nope".to_owned();
        assert!(configs(&[unknown], &Catalog::default()).is_err());
        assert!(configs(&[table(""), table("")], &Catalog::default()).is_err(), "a name twice");
    }
}
