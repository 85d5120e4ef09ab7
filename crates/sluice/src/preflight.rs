//! What `serve` checks before it creates anything — a data directory, a store, a secrets key
//! file, the first operator's key: every setting parses (the catalog file, the chains, the
//! secrets keys), the listen addresses are free (bound here, and served later), and the
//! database, the set store, the stream log and the chain nodes accept a connection. A start
//! that fails here leaves nothing behind, so the corrected start is still a first start and
//! prints the key (docs/operations.md, "Starting").
//!
//! Each check gives up after [`REACH_WITHIN`] and they run at once, so a server that is
//! down is one line naming what was tried, within seconds.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use sluice_core::catalog::Catalog;
use tokio::net::TcpListener;

use crate::settings::{Bus, Settings};

/// How long each reachability check waits for an answer.
pub const REACH_WITHIN: Duration = Duration::from_secs(4);

/// What the checks produced, for the start to use.
pub struct Checked {
    pub catalog: Catalog,
    pub chains: Vec<crate::chains::ChainPlan>,
    pub sources: Vec<sluice_chains::kafka_source::KafkaSourceConfig>,
    pub listener: TcpListener,
    pub metrics_listener: Option<TcpListener>,
}

/// Runs every check, in the order above.
///
/// # Errors
/// The first check that fails, in one line saying what was tried.
pub async fn check(settings: &Settings) -> anyhow::Result<Checked> {
    let catalog = load_catalog(settings)?;
    let mut chains = crate::chains::configs(&settings.chains, &catalog)?;
    let sources = crate::sources::configs(&settings.sources, &catalog)?;
    if let Some(hex) = &settings.secrets_key {
        sluice_store::secrets::SecretsKey::from_hex(hex).context("secrets_key")?;
    }
    for hex in &settings.secrets_previous_keys {
        sluice_store::secrets::SecretsKey::from_hex(hex).context("secrets_previous_keys")?;
    }
    let listener = bind(settings.listen, "listen").await?;
    let metrics_listener = match settings.metrics_listen {
        Some(address) => Some(bind(address, "metrics_listen").await?),
        None => None,
    };
    let store = async {
        sluice_store::check_reachable(
            &settings.database_url,
            settings.sets_url.as_deref(),
            REACH_WITHIN,
        )
        .await
        .map_err(anyhow::Error::from)
    };
    let bus = async {
        match &settings.bus {
            Bus::Embedded => Ok(()),
            Bus::Kafka(kafka) => sluice_bus::KafkaLog::check_reachable(kafka, REACH_WITHIN)
                .await
                .map_err(anyhow::Error::from),
        }
    };
    let nodes = async {
        for chain in &chains {
            if let Some((name, url)) = chain.name_and_url() {
                check_node(name, url).await?;
            }
        }
        anyhow::Ok(())
    };
    tokio::try_join!(store, bus, nodes)?;
    // Each node answers; it must also be the chain it is configured as (docs/chains.md,
    // "Chain identity").
    crate::chains::check_identities(&mut chains).await?;
    Ok(Checked { catalog, chains, sources, listener, metrics_listener })
}

/// The built-in catalog, or the catalog file applied to it.
fn load_catalog(settings: &Settings) -> anyhow::Result<Catalog> {
    let Some(path) = &settings.catalog_file else { return Ok(Catalog::default()) };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading catalog file {}", path.display()))?;
    Catalog::from_file_text(&text).with_context(|| format!("catalog file {}", path.display()))
}

/// Binds `address` (the setting `what`), saying why not in a few words.
async fn bind(address: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(address).await.map_err(|error| {
        let reason = match error.kind() {
            std::io::ErrorKind::AddrInUse => "the address is in use".to_owned(),
            std::io::ErrorKind::AddrNotAvailable => {
                "the address is not one of this machine's".to_owned()
            }
            std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
            _ => error.to_string(),
        };
        anyhow::anyhow!("cannot listen on {address} ({what}): {reason}")
    })
}

/// Whether the chain's JSON-RPC node answers an HTTP request (any answer but a refusal of
/// the caller: a provider that answers 401 or 403 has refused the key in the URL).
async fn check_node(name: &str, rpc_url: &str) -> anyhow::Result<()> {
    let shown = sluice_chains::rpc::redact_url(rpc_url);
    let client = reqwest::Client::builder()
        .timeout(REACH_WITHIN)
        .build()
        .context("building the HTTP client of the chain check")?;
    let request = client
        .post(rpc_url)
        .json(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber"}));
    match request.send().await {
        Ok(response) if matches!(response.status().as_u16(), 401 | 403 | 407) => {
            bail!("chain {name}: the node at {shown} refused the request ({})", response.status())
        }
        Ok(_) => Ok(()),
        Err(error) => bail!("chain {name}: cannot connect to {shown}: {}", request_reason(&error)),
    }
}

/// Why a request got no answer, in a few words and without its URL (which may carry a key).
fn request_reason(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return format!("no answer within {} s", REACH_WITHIN.as_secs());
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                kind @ (std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::HostUnreachable
                | std::io::ErrorKind::NetworkUnreachable
                | std::io::ErrorKind::TimedOut) => kind.to_string(),
                _ => io.to_string(),
            };
        }
        source = cause.source();
    }
    if error.is_builder() {
        return "not a URL the HTTP client takes".to_owned();
    }
    // reqwest's own text names the URL; the innermost cause does not.
    let mut innermost = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        innermost = cause.to_string();
        source = cause.source();
    }
    innermost
}
