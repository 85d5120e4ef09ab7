//! `serve`'s chain ingesters: `[[chains]]` in the config file and `--chain name=url`, turned
//! into `sluice_chains` ingesters that append through the runtime's ingest path (the checks
//! of `POST /api/v1/streams/…/records`), and their status for the API.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use async_trait::async_trait;
use serde::Deserialize;
use sluice_api::chains::{ChainStatusBody, ChainStatusSource};
use sluice_chains::sink::{ChainSink, Checkpoint, LogPositions, SinkError};
use sluice_chains::{ChainConfig, ChainStatus, Finality, Ingester, StartBlock};
use sluice_core::catalog::Catalog;
use sluice_core::streams::StreamRecord;
use sluice_runtime::{Runtime, RuntimeError};

/// One `[[chains]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainFileSettings {
    pub name: String,
    pub rpc_url: String,
    /// The node's WebSocket endpoint, for `newHeads` (lower tip latency); optional.
    pub ws_url: Option<String>,
    /// A block number, or `"latest"` (the default).
    #[serde(default)]
    pub start_block: Option<StartBlockSetting>,
    pub confirmations: Option<u64>,
    /// `"depth"` (the default: `confirmations` deep) or `"finalized_tag"`.
    pub finality: Option<String>,
    pub requests_per_second: Option<u32>,
    pub max_concurrency: Option<usize>,
    pub max_batch: Option<usize>,
    pub max_block_range: Option<u64>,
    pub parallel_ranges: Option<usize>,
    pub poll_interval_ms: Option<u64>,
    /// Token addresses worth one dollar (replaces the chain's default list).
    pub stablecoins: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum StartBlockSetting {
    Number(u64),
    Text(String),
}

impl ChainFileSettings {
    fn new(name: &str, rpc_url: &str) -> Self {
        Self {
            name: name.to_owned(),
            rpc_url: rpc_url.to_owned(),
            ws_url: None,
            start_block: None,
            confirmations: None,
            finality: None,
            requests_per_second: None,
            max_concurrency: None,
            max_batch: None,
            max_block_range: None,
            parallel_ranges: None,
            poll_interval_ms: None,
            stablecoins: None,
        }
    }
}

/// The file's chains with the `--chain name=url` flags applied: a flag naming a chain of the
/// file replaces its URL, any other adds a chain with the defaults.
///
/// # Errors
/// A flag without `=`.
pub fn merge(
    file: Vec<ChainFileSettings>,
    flags: &[String],
) -> anyhow::Result<Vec<ChainFileSettings>> {
    let mut chains = file;
    for flag in flags {
        let Some((name, url)) = flag.split_once('=') else {
            bail!("--chain {:?} must be NAME=URL", sluice_chains::rpc::redact_url(flag));
        };
        match chains.iter_mut().find(|c| c.name == name) {
            Some(chain) => chain.rpc_url = url.to_owned(),
            None => chains.push(ChainFileSettings::new(name, url)),
        }
    }
    Ok(chains)
}

/// Checks the chains against the catalog and builds the ingester configurations.
///
/// # Errors
/// A chain twice, a chain the catalog has no EVM stream of, a bad URL or setting.
pub fn configs(
    chains: &[ChainFileSettings],
    catalog: &Catalog,
) -> anyhow::Result<Vec<ChainConfig>> {
    let mut out: Vec<ChainConfig> = Vec::new();
    for chain in chains {
        let name = &chain.name;
        if out.iter().any(|c| &c.name == name) {
            bail!("chain {name} is configured twice");
        }
        if !(chain.rpc_url.starts_with("http://") || chain.rpc_url.starts_with("https://")) {
            bail!(
                "chain {name}: rpc_url {} must be http:// or https://",
                sluice_chains::rpc::redact_url(&chain.rpc_url)
            );
        }
        if let Some(ws_url) = &chain.ws_url
            && !(ws_url.starts_with("ws://") || ws_url.starts_with("wss://"))
        {
            bail!(
                "chain {name}: ws_url {} must be ws:// or wss://",
                sluice_chains::rpc::redact_url(ws_url)
            );
        }
        let entities: Vec<(String, bool)> = catalog
            .entries()
            .iter()
            .filter(|e| {
                &e.chain == name && sluice_chains::records::ENTITIES.contains(&e.entity.as_str())
            })
            .map(|e| (e.entity.clone(), e.zerolag))
            .collect();
        if entities.is_empty() {
            bail!(
                "chain {name}: the catalog has no EVM stream of it (add its entities to the \
                 catalog file)"
            );
        }
        let mut config = ChainConfig::new(name, &chain.rpc_url);
        config.entities = entities;
        config.ws_url.clone_from(&chain.ws_url);
        config.start_block = match &chain.start_block {
            None => StartBlock::Latest,
            Some(StartBlockSetting::Number(n)) => StartBlock::Number(*n),
            Some(StartBlockSetting::Text(text)) => {
                text.parse().map_err(|reason: String| anyhow::anyhow!("chain {name}: {reason}"))?
            }
        };
        config.finality = match chain.finality.as_deref() {
            None | Some("depth") => Finality::Depth(
                chain
                    .confirmations
                    .unwrap_or_else(|| sluice_chains::config::default_confirmations(name)),
            ),
            Some("finalized_tag") => Finality::Tag,
            Some(other) => {
                bail!("chain {name}: finality {other:?} is not \"depth\" or \"finalized_tag\"")
            }
        };
        if let Some(rate) = chain.requests_per_second {
            config.rpc.requests_per_second = f64::from(rate);
        }
        if let Some(n) = chain.max_concurrency {
            config.rpc.max_concurrency = n.max(1);
        }
        if let Some(n) = chain.max_batch {
            config.rpc.max_batch = n.max(1);
        }
        if let Some(n) = chain.max_block_range {
            config.max_block_range = n.max(1);
        }
        if let Some(n) = chain.parallel_ranges {
            config.parallel_ranges = n.max(1);
        }
        if let Some(ms) = chain.poll_interval_ms {
            config.poll_interval = Duration::from_millis(ms.max(1));
        }
        if let Some(stablecoins) = &chain.stablecoins {
            config.stablecoins = stablecoins.iter().map(|s| s.to_ascii_lowercase()).collect();
        }
        out.push(config);
    }
    Ok(out)
}

/// Appends through [`Runtime::ingest`]; keeps positions in the runtime's stream log.
struct RuntimeSink {
    runtime: Arc<Runtime>,
    positions: LogPositions,
}

#[async_trait]
impl ChainSink for RuntimeSink {
    async fn append(
        &self,
        chain: &str,
        entity: &str,
        zerolag: bool,
        records: Vec<StreamRecord>,
    ) -> Result<(), SinkError> {
        self.runtime.ingest(chain, entity, zerolag, records).await.map(drop).map_err(|error| {
            let transient = matches!(&error, RuntimeError::Bus(e) if e.is_transient());
            SinkError::Append {
                stream: sluice_bus::topics::chain_stream(chain, entity, zerolag),
                reason: error.to_string(),
                transient,
            }
        })
    }

    async fn last_block(&self, chain: &str, entity: &str) -> Result<Option<u64>, SinkError> {
        self.positions.last_block(chain, entity).await
    }

    async fn load_checkpoint(&self, chain: &str) -> Result<Option<Checkpoint>, SinkError> {
        self.positions.load_checkpoint(chain).await
    }

    async fn save_checkpoint(&self, chain: &str, checkpoint: &Checkpoint) -> Result<(), SinkError> {
        self.positions.save_checkpoint(chain, checkpoint).await
    }
}

struct Statuses(Vec<Arc<ChainStatus>>);

impl ChainStatusSource for Statuses {
    fn statuses(&self) -> Vec<ChainStatusBody> {
        self.0
            .iter()
            .map(|status| {
                let s = status.snapshot();
                ChainStatusBody {
                    chain: s.chain,
                    rpc_url: Some(s.rpc_url),
                    head: s.head,
                    finalized: s.finalized,
                    ingested: s.ingested,
                    zerolag_ingested: s.zerolag_ingested,
                    lag_blocks: s.lag_blocks,
                    lag_seconds: s.lag_seconds,
                    reorgs: s.reorgs,
                    rpc_requests: s.rpc_requests,
                    rpc_errors: s.rpc_errors,
                    last_error: s.last_error,
                }
            })
            .collect()
    }

    fn metrics_text(&self) -> String {
        ChainStatus::metrics_text(&self.0)
    }
}

/// The running ingesters.
pub struct Started {
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    /// `None` without chains.
    pub status: Option<Arc<dyn ChainStatusSource>>,
}

/// Starts one ingester task per chain.
///
/// # Errors
/// An RPC client that cannot be built.
pub fn start(configs: Vec<ChainConfig>, runtime: &Arc<Runtime>) -> anyhow::Result<Started> {
    if configs.is_empty() {
        return Ok(Started { tasks: Vec::new(), status: None });
    }
    let sink: Arc<dyn ChainSink> = Arc::new(RuntimeSink {
        runtime: runtime.clone(),
        positions: LogPositions::new(runtime.log().clone()),
    });
    let mut tasks = Vec::new();
    let mut statuses = Vec::new();
    for config in configs {
        let status = Ingester::status_for(&config);
        let name = config.name.clone();
        let ingester = Ingester::new(config, sink.clone(), status.clone())
            .with_context(|| format!("chain {name}"))?;
        statuses.push(status);
        tasks.push(tokio::spawn(ingester.run()));
    }
    Ok(Started { tasks, status: Some(Arc::new(Statuses(statuses))) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_replace_file_urls_and_add_chains() {
        let mut file = ChainFileSettings::new("base", "http://file");
        file.confirmations = Some(3);
        let merged =
            merge(vec![file], &["base=http://flag".to_owned(), "polygon=http://p".to_owned()])
                .unwrap();
        assert_eq!(merged[0].rpc_url, "http://flag");
        assert_eq!(merged[0].confirmations, Some(3));
        assert_eq!(merged[1].name, "polygon");
        assert!(merge(Vec::new(), &["base".to_owned()]).is_err());
    }

    #[test]
    fn chains_must_be_evm_streams_of_the_catalog() {
        let catalog = Catalog::default();
        let configs = configs(&[ChainFileSettings::new("ethereum", "http://x")], &catalog).unwrap();
        // The default catalog has only ethereum's log and dex_trade streams.
        let mut entities: Vec<&str> = configs[0].entities.iter().map(|(e, _)| e.as_str()).collect();
        entities.sort_unstable();
        assert_eq!(entities, vec!["dex_trade", "log"]);
        assert_eq!(configs[0].finality, Finality::Depth(64));
        assert!(configs_err("hyperliquid", "http://x"));
        assert!(configs_err("mars", "http://x"));
        assert!(configs_err("base", "ws://x"));
    }

    #[test]
    fn a_websocket_url_is_taken_only_as_ws() {
        let mut chain = ChainFileSettings::new("base", "http://x");
        chain.ws_url = Some("wss://node.example/v2/0123456789abcdef0123".to_owned());
        let made = configs(std::slice::from_ref(&chain), &Catalog::default()).unwrap();
        assert_eq!(made[0].ws_url.as_deref(), chain.ws_url.as_deref());
        chain.ws_url = Some("https://node.example/v2/0123456789abcdef0123".to_owned());
        let error = configs(&[chain], &Catalog::default()).unwrap_err().to_string();
        assert!(error.contains("must be ws:// or wss://"), "{error}");
        assert!(!error.contains("0123456789abcdef0123"), "the key is redacted: {error}");
    }

    fn configs_err(name: &str, url: &str) -> bool {
        configs(&[ChainFileSettings::new(name, url)], &Catalog::default()).is_err()
    }

    #[test]
    fn start_blocks_read_numbers_and_latest() {
        let parsed: ChainFileSettings =
            toml::from_str("name = \"base\"\nrpc_url = \"http://x\"\nstart_block = 12\n").unwrap();
        assert_eq!(parsed.start_block, Some(StartBlockSetting::Number(12)));
        let config = &configs(&[parsed], &Catalog::default()).unwrap()[0];
        assert_eq!(config.start_block, StartBlock::Number(12));
        let parsed: ChainFileSettings =
            toml::from_str("name = \"base\"\nrpc_url = \"http://x\"\nstart_block = \"soon\"\n")
                .unwrap();
        assert!(configs(&[parsed], &Catalog::default()).is_err());
    }
}
