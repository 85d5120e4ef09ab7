//! `serve`'s chain ingesters: `[[chains]]` in the config file and `--chain name=url`, turned
//! into `sluice_chains` ingesters that append through the runtime's ingest path (the checks
//! of `POST /api/v1/streams/…/records`), and their status for the API. Hyperliquid chains
//! (a node's output directory) are in [`hyperliquid`].

mod hyperliquid;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use async_trait::async_trait;
use serde::Deserialize;
use sluice_api::chains::{ChainStatusBody, ChainStatusSource};
use sluice_chains::identity::{self, Expected};
use sluice_chains::kafka_source::{KafkaSource, KafkaSourceConfig};
use sluice_chains::sink::{ChainSink, Checkpoint, LogPositions, SinkError};
use sluice_chains::solana::Commitment;
use sluice_chains::{
    ChainConfig, ChainStatus, Finality, HyperliquidConfig, HyperliquidIngester, Ingester,
    SolanaConfig, SolanaIngester, StartBlock,
};
use sluice_core::catalog::{Catalog, ChainFamily};
use sluice_core::streams::StreamRecord;
use sluice_runtime::{Runtime, RuntimeError};

/// One `[[chains]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainFileSettings {
    pub name: String,
    /// EVM and Solana: the JSON-RPC URL; Hyperliquid: `file:///path` (or `data_dir`).
    #[serde(default)]
    pub rpc_url: String,
    /// Hyperliquid: the node's data directory (`~/hl/data`).
    pub data_dir: Option<std::path::PathBuf>,
    /// Hyperliquid: `"latest"` (the default) or `"earliest"`.
    pub start: Option<String>,
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
    /// EVM: the chain id the node must report, instead of the catalog's (a test or private
    /// chain).
    pub chain_id: Option<u64>,
    /// Solana: a slot, or `"latest"` (the default).
    pub start_slot: Option<StartBlockSetting>,
    /// Solana: `"finalized"` (the default) or `"confirmed"`.
    pub commitment: Option<String>,
    /// Solana: the genesis hash the node must report, instead of the catalog's.
    pub genesis_hash: Option<String>,
    /// Solana: slots per `getBlocks` call.
    pub max_slot_range: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum StartBlockSetting {
    Number(u64),
    Text(String),
}

/// The name of the first of `settings` that is set (each a name and whether it is set).
fn first_set(settings: impl IntoIterator<Item = (&'static str, bool)>) -> Option<&'static str> {
    settings.into_iter().find(|(_, set)| *set).map(|(setting, _)| setting)
}

impl ChainFileSettings {
    /// Applies the table's JSON-RPC client settings (rate, concurrency, batch size; each at
    /// least 1 where 0 would stall) over `rpc`'s defaults: EVM and Solana chains read them
    /// alike.
    fn apply_rpc(&self, rpc: &mut sluice_chains::rpc::RpcSettings) {
        if let Some(rate) = self.requests_per_second {
            rpc.requests_per_second = f64::from(rate);
        }
        if let Some(n) = self.max_concurrency {
            rpc.max_concurrency = n.max(1);
        }
        if let Some(n) = self.max_batch {
            rpc.max_batch = n.max(1);
        }
    }

    /// The settings only an EVM chain reads, each with whether this table sets it.
    fn evm_only(&self) -> [(&'static str, bool); 7] {
        [
            ("start_block", self.start_block.is_some()),
            ("confirmations", self.confirmations.is_some()),
            ("finality", self.finality.is_some()),
            ("chain_id", self.chain_id.is_some()),
            ("max_block_range", self.max_block_range.is_some()),
            ("parallel_ranges", self.parallel_ranges.is_some()),
            ("stablecoins", self.stablecoins.is_some()),
        ]
    }

    /// The settings only a Solana chain reads, each with whether this table sets it.
    fn solana_only(&self) -> [(&'static str, bool); 4] {
        [
            ("start_slot", self.start_slot.is_some()),
            ("commitment", self.commitment.is_some()),
            ("genesis_hash", self.genesis_hash.is_some()),
            ("max_slot_range", self.max_slot_range.is_some()),
        ]
    }

    fn new(name: &str, rpc_url: &str) -> Self {
        Self {
            name: name.to_owned(),
            rpc_url: rpc_url.to_owned(),
            data_dir: None,
            start: None,
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
            chain_id: None,
            start_slot: None,
            commitment: None,
            genesis_hash: None,
            max_slot_range: None,
        }
    }
}

/// A chain to ingest, by family, with what its node must report.
#[derive(Debug)]
pub enum ChainPlan {
    Evm {
        config: ChainConfig,
        expected: Expected,
        verified: bool,
    },
    Solana {
        config: SolanaConfig,
        expected: Expected,
        verified: bool,
    },
    /// A node's output directory: no node to ask who it is.
    Hyperliquid {
        config: HyperliquidConfig,
    },
}

impl ChainPlan {
    fn name(&self) -> &str {
        match self {
            Self::Evm { config, .. } => &config.name,
            Self::Solana { config, .. } => &config.name,
            Self::Hyperliquid { config } => &config.name,
        }
    }

    /// The name, JSON-RPC URL and identity of a chain read from a node over JSON-RPC.
    fn parts(&self) -> Option<(&str, &str, &Expected)> {
        match self {
            Self::Evm { config, expected, .. } => Some((&config.name, &config.rpc_url, expected)),
            Self::Solana { config, expected, .. } => {
                Some((&config.name, &config.rpc_url, expected))
            }
            Self::Hyperliquid { .. } => None,
        }
    }

    /// The chain's name and JSON-RPC URL (none for a chain read from files).
    pub fn name_and_url(&self) -> Option<(&str, &str)> {
        self.parts().map(|(name, url, _)| (name, url))
    }

    fn set_verified(&mut self) {
        match self {
            Self::Evm { verified, .. } | Self::Solana { verified, .. } => *verified = true,
            Self::Hyperliquid { .. } => {}
        }
    }
}

/// How long the start-time identity check waits for a node.
const IDENTITY_TIMEOUT: Duration = crate::preflight::REACH_WITHIN;

/// Asks every chain's node who it is (docs/chains.md, "Chain identity"). A node of another
/// chain or family stops the start with one line naming the chain, the URL (redacted) and
/// both values; a node that does not answer is checked again by its ingester before it reads
/// anything.
///
/// # Errors
/// A mismatch or a wrong family.
pub async fn check_identities(plans: &mut [ChainPlan]) -> anyhow::Result<()> {
    let mut plans: Vec<&mut ChainPlan> = plans.iter_mut().filter(|p| p.parts().is_some()).collect();
    let checks = plans.iter().filter_map(|plan| {
        let (name, url, expected) = plan.parts()?;
        Some(identity::check(name, url, expected, IDENTITY_TIMEOUT))
    });
    let outcomes = futures_util::future::join_all(checks).await;
    for (plan, outcome) in plans.iter_mut().zip(outcomes) {
        match outcome {
            Ok(found) => {
                tracing::info!(chain = plan.name(), identity = %found, "chain node identified");
                plan.set_verified();
            }
            Err(error) if error.is_transient() => {
                tracing::warn!(%error, "chain node not reached; its ingester checks it before reading");
            }
            Err(error) => bail!("{error}"),
        }
    }
    Ok(())
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

/// Checks the chains against the catalog and builds the ingester configurations: the
/// chain's family in the catalog picks the ingester.
///
/// # Errors
/// A chain twice, a chain the catalog has no stream of for its family, a bad URL or setting.
pub fn configs(chains: &[ChainFileSettings], catalog: &Catalog) -> anyhow::Result<Vec<ChainPlan>> {
    let mut out: Vec<ChainPlan> = Vec::new();
    for chain in chains {
        let name = &chain.name;
        if out.iter().any(|c| c.name() == name) {
            bail!("chain {name} is configured twice");
        }
        let identity = catalog.identity(name);
        if identity.family == ChainFamily::Hyperliquid {
            out.push(ChainPlan::Hyperliquid { config: hyperliquid::config(chain, catalog)? });
            continue;
        }
        if chain.data_dir.is_some() || chain.start.is_some() {
            bail!(
                "chain {name} is read from a node over JSON-RPC: data_dir and start are Hyperliquid settings"
            );
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
        match identity.family {
            ChainFamily::Evm => {
                if let Some(setting) = first_set(chain.solana_only()) {
                    bail!("chain {name} is an EVM chain: {setting} is a Solana setting");
                }
                let config = evm_config(chain, catalog)?;
                let expected = Expected::Evm { chain_id: chain.chain_id.or(identity.chain_id) };
                out.push(ChainPlan::Evm { config, expected, verified: false });
            }
            ChainFamily::Solana => {
                if let Some(setting) = first_set(chain.evm_only()) {
                    bail!("chain {name} is a Solana chain: {setting} is an EVM setting");
                }
                let config = solana_config(chain, catalog)?;
                let expected = Expected::Solana {
                    genesis_hash: chain.genesis_hash.clone().or(identity.genesis_hash),
                };
                out.push(ChainPlan::Solana { config, expected, verified: false });
            }
            ChainFamily::Hyperliquid => unreachable!("handled above"),
        }
    }
    Ok(out)
}

fn start_setting(
    name: &str,
    setting: Option<&StartBlockSetting>,
    what: &str,
) -> anyhow::Result<StartBlock> {
    Ok(match setting {
        None => StartBlock::Latest,
        Some(StartBlockSetting::Number(n)) => StartBlock::Number(*n),
        Some(StartBlockSetting::Text(text)) if text == "latest" => StartBlock::Latest,
        Some(StartBlockSetting::Text(text)) => {
            bail!("chain {name}: {what} {text:?} is neither a number nor \"latest\"")
        }
    })
}

fn solana_config(chain: &ChainFileSettings, catalog: &Catalog) -> anyhow::Result<SolanaConfig> {
    let name = &chain.name;
    let entity = sluice_chains::solana::records::ENTITY;
    if catalog.find(name, entity).is_none() {
        bail!(
            "chain {name}: the catalog has no {entity} stream of it (add it to the catalog file)"
        );
    }
    let mut config = SolanaConfig::new(name, &chain.rpc_url);
    config.ws_url.clone_from(&chain.ws_url);
    config.start = start_setting(name, chain.start_slot.as_ref(), "start_slot")?;
    if let Some(text) = &chain.commitment {
        config.commitment = text
            .parse::<Commitment>()
            .map_err(|reason| anyhow::anyhow!("chain {name}: {reason}"))?;
    }
    chain.apply_rpc(&mut config.rpc);
    if let Some(n) = chain.max_slot_range {
        config.max_slot_range = n.clamp(1, 500_000);
    }
    if let Some(ms) = chain.poll_interval_ms {
        config.poll_interval = Duration::from_millis(ms.max(1));
    }
    config.blocks_per_step = config.rpc.max_batch * config.rpc.max_concurrency;
    Ok(config)
}

fn evm_config(chain: &ChainFileSettings, catalog: &Catalog) -> anyhow::Result<ChainConfig> {
    let name = &chain.name;
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
    config.start_block = start_setting(name, chain.start_block.as_ref(), "start_block")?;
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
    chain.apply_rpc(&mut config.rpc);
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
    Ok(config)
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

    async fn tails(&self, chain: &str, entity: &str) -> Result<Vec<Vec<u8>>, SinkError> {
        self.positions.tails(chain, entity).await
    }

    async fn load_position(&self, chain: &str) -> Result<Option<serde_json::Value>, SinkError> {
        self.positions.load_position(chain).await
    }

    async fn save_position(
        &self,
        chain: &str,
        position: &serde_json::Value,
    ) -> Result<(), SinkError> {
        self.positions.save_position(chain, position).await
    }
}

struct Statuses(Vec<Arc<ChainStatus>>, Vec<crate::sources::SourceEntry>);

impl ChainStatusSource for Statuses {
    fn statuses(&self) -> Vec<ChainStatusBody> {
        let sources = self.1.iter().map(crate::sources::SourceEntry::body);
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
                    rejected: (s.lag_bytes.is_some() || s.rejected > 0).then_some(s.rejected),
                    lag_bytes: s.lag_bytes,
                    source: None,
                    entity: None,
                    records: None,
                    lag_messages: None,
                }
            })
            .chain(sources)
            .collect()
    }

    fn metrics_text(&self) -> String {
        let mut text = ChainStatus::metrics_text(&self.0);
        if !self.1.is_empty() {
            text.push_str(&crate::sources::SourceEntry::metrics_text(&self.1));
        }
        text
    }
}

/// The running ingesters.
pub struct Started {
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    /// `None` without chains.
    pub status: Option<Arc<dyn ChainStatusSource>>,
}

/// Starts one ingester task per chain, and one task per Kafka source. A chain whose node was not reached by
/// [`check_identities`] is checked by its task first: until the node answers, the status
/// shows why; a node of another chain stops that chain's task for good (and says so in the
/// status), never writing a record.
///
/// # Errors
/// An RPC client that cannot be built.
pub fn start(
    plans: Vec<ChainPlan>,
    sources: Vec<KafkaSourceConfig>,
    runtime: &Arc<Runtime>,
) -> anyhow::Result<Started> {
    if plans.is_empty() && sources.is_empty() {
        return Ok(Started { tasks: Vec::new(), status: None });
    }
    let sink: Arc<dyn ChainSink> = Arc::new(RuntimeSink {
        runtime: runtime.clone(),
        positions: LogPositions::new(runtime.log().clone()),
    });
    let mut tasks = Vec::new();
    let mut statuses = Vec::new();
    for plan in plans {
        let name = plan.name().to_owned();
        let node = plan.parts().map(|(_, url, expected)| (url.to_owned(), expected.clone()));
        let (status, run, verified): (_, futures_util::future::BoxFuture<'static, ()>, bool) =
            match plan {
                ChainPlan::Hyperliquid { config } => {
                    let status = HyperliquidIngester::status_for(&config);
                    let ingester = HyperliquidIngester::new(config, sink.clone(), status.clone());
                    (status, Box::pin(ingester.run()), true)
                }
                ChainPlan::Evm { config, verified, .. } => {
                    let status = Ingester::status_for(&config);
                    let ingester = Ingester::new(config, sink.clone(), status.clone())
                        .with_context(|| format!("chain {name}"))?;
                    (status, Box::pin(ingester.run()), verified)
                }
                ChainPlan::Solana { config, verified, .. } => {
                    let status = SolanaIngester::status_for(&config);
                    let ingester = SolanaIngester::new(config, sink.clone(), status.clone())
                        .with_context(|| format!("chain {name}"))?;
                    (status, Box::pin(ingester.run()), verified)
                }
            };
        statuses.push(status.clone());
        tasks.push(tokio::spawn(async move {
            if let Some((url, expected)) = node
                && !verified
                && !identified(&name, &url, &expected, &status).await
            {
                return;
            }
            run.await;
        }));
    }
    let mut entries = Vec::new();
    for config in sources {
        let name = config.name.clone();
        let source = KafkaSource::new(config.clone(), sink.clone(), runtime.log().clone())
            .with_context(|| format!("source {name}"))?;
        entries.push(crate::sources::SourceEntry { config, status: source.status() });
        tasks.push(tokio::spawn(source.run()));
    }
    Ok(Started { tasks, status: Some(Arc::new(Statuses(statuses, entries))) })
}

/// Checks the node's identity until it answers; false (and the reason in the status) when
/// it is another chain's or family's node.
async fn identified(name: &str, url: &str, expected: &Expected, status: &ChainStatus) -> bool {
    let mut backoff = Duration::from_millis(500);
    loop {
        match identity::check(name, url, expected, IDENTITY_TIMEOUT).await {
            Ok(_) => {
                status.error(None);
                return true;
            }
            Err(error) if error.is_transient() => {
                status.error(Some(error.to_string()));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
            Err(error) => {
                tracing::error!(%error, "chain not ingested");
                status.error(Some(error.to_string()));
                return false;
            }
        }
    }
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
        let plans = configs(&[ChainFileSettings::new("ethereum", "http://x")], &catalog).unwrap();
        let ChainPlan::Evm { config, expected, .. } = &plans[0] else { panic!("an EVM chain") };
        // The default catalog has only ethereum's log and dex_trade streams.
        let mut entities: Vec<&str> = config.entities.iter().map(|(e, _)| e.as_str()).collect();
        entities.sort_unstable();
        assert_eq!(entities, vec!["dex_trade", "log"]);
        assert_eq!(config.finality, Finality::Depth(64));
        assert_eq!(expected, &Expected::Evm { chain_id: Some(1) });
        assert!(configs_err("hyperliquid", "http://x"));
        assert!(configs_err("base", "file:///tmp"));
        assert!(configs_err("mars", "http://x"));
        assert!(configs_err("base", "ws://x"));
    }

    #[test]
    fn a_websocket_url_is_taken_only_as_ws() {
        let mut chain = ChainFileSettings::new("base", "http://x");
        chain.ws_url = Some("wss://node.example/v2/0123456789abcdef0123".to_owned());
        let made = configs(std::slice::from_ref(&chain), &Catalog::default()).unwrap();
        let ChainPlan::Evm { config, .. } = &made[0] else { panic!("an EVM chain") };
        assert_eq!(config.ws_url.as_deref(), chain.ws_url.as_deref());
        chain.ws_url = Some("https://node.example/v2/0123456789abcdef0123".to_owned());
        let error = configs(&[chain], &Catalog::default()).unwrap_err().to_string();
        assert!(error.contains("must be ws:// or wss://"), "{error}");
        assert!(!error.contains("0123456789abcdef0123"), "the key is redacted: {error}");
    }

    #[test]
    fn the_family_picks_the_ingester_and_overrides_replace_the_catalog_identity() {
        let mut solana = ChainFileSettings::new("solana", "http://x");
        solana.commitment = Some("confirmed".to_owned());
        solana.start_slot = Some(StartBlockSetting::Number(5));
        solana.genesis_hash = Some("local".to_owned());
        let mut base = ChainFileSettings::new("base", "http://y");
        base.chain_id = Some(31337);
        let plans = configs(&[solana.clone(), base], &Catalog::default()).unwrap();
        let ChainPlan::Solana { config, expected, .. } = &plans[0] else { panic!("Solana") };
        assert_eq!(config.commitment, Commitment::Confirmed);
        assert_eq!(config.start, StartBlock::Number(5));
        assert_eq!(expected, &Expected::Solana { genesis_hash: Some("local".to_owned()) });
        let ChainPlan::Evm { expected, .. } = &plans[1] else { panic!("EVM") };
        assert_eq!(expected, &Expected::Evm { chain_id: Some(31337) });
        // Another family's settings are refused, naming them.
        solana.confirmations = Some(3);
        let error = configs(&[solana], &Catalog::default()).unwrap_err().to_string();
        assert!(error.contains("confirmations is an EVM setting"), "{error}");
    }

    fn configs_err(name: &str, url: &str) -> bool {
        configs(&[ChainFileSettings::new(name, url)], &Catalog::default()).is_err()
    }

    #[test]
    fn start_blocks_read_numbers_and_latest() {
        let parsed: ChainFileSettings =
            toml::from_str("name = \"base\"\nrpc_url = \"http://x\"\nstart_block = 12\n").unwrap();
        assert_eq!(parsed.start_block, Some(StartBlockSetting::Number(12)));
        let plans = configs(&[parsed], &Catalog::default()).unwrap();
        let ChainPlan::Evm { config, .. } = &plans[0] else { panic!("an EVM chain") };
        assert_eq!(config.start_block, StartBlock::Number(12));
        let parsed: ChainFileSettings =
            toml::from_str("name = \"base\"\nrpc_url = \"http://x\"\nstart_block = \"soon\"\n")
                .unwrap();
        assert!(configs(&[parsed], &Catalog::default()).is_err());
    }
}
