//! A `[[chains]]` table (or `--chain name=file:///path`) of a Hyperliquid chain: the node's
//! output directory, checked at start (docs/chains.md, "Hyperliquid").

use std::time::Duration;

use anyhow::bail;
use sluice_chains::HyperliquidConfig;
use sluice_chains::hyperliquid::{FileStart, files};
use sluice_core::catalog::Catalog;

use super::ChainFileSettings;

/// The ingester configuration of `chain`.
///
/// # Errors
/// No data directory (or a URL that is not `file://`), a directory that does not exist or
/// cannot be read, a JSON-RPC chain's setting, no stream of the chain in the catalog.
pub fn config(chain: &ChainFileSettings, catalog: &Catalog) -> anyhow::Result<HyperliquidConfig> {
    let name = &chain.name;
    let rpc_only = [("ws_url", chain.ws_url.is_some())]
        .into_iter()
        .chain(chain.evm_only())
        .chain(chain.solana_only())
        .chain([
            ("requests_per_second", chain.requests_per_second.is_some()),
            ("max_concurrency", chain.max_concurrency.is_some()),
            ("max_batch", chain.max_batch.is_some()),
        ]);
    if let Some(setting) = super::first_set(rpc_only) {
        bail!(
            "chain {name} is read from a Hyperliquid node's files: {setting} is a JSON-RPC setting"
        );
    }
    let data_dir = match (&chain.data_dir, chain.rpc_url.as_str()) {
        (Some(dir), "") => dir.clone(),
        (Some(_), _) => bail!("chain {name}: give data_dir or a file:// URL, not both"),
        (None, url) => match url.strip_prefix("file://") {
            Some(path) if !path.is_empty() => path.into(),
            _ => bail!(
                "chain {name} is read from a Hyperliquid node's output directory: give \
                 data_dir, or --chain {name}=file:///path/to/hl/data"
            ),
        },
    };
    let entities: Vec<String> = files::STREAMS
        .iter()
        .map(|(entity, _)| (*entity).to_owned())
        .filter(|entity| catalog.find(name, entity).is_some())
        .collect();
    if entities.is_empty() {
        bail!(
            "chain {name}: the catalog has no Hyperliquid stream of it (add it to the catalog \
             file)"
        );
    }
    let mut config = HyperliquidConfig::new(name, data_dir);
    config.entities = entities;
    if let Some(text) = &chain.start {
        config.start = text
            .parse::<FileStart>()
            .map_err(|reason| anyhow::anyhow!("chain {name}: {reason}"))?;
    }
    if let Some(ms) = chain.poll_interval_ms {
        config.poll_interval = Duration::from_millis(ms.max(1));
    }
    config.check().map_err(|reason| anyhow::anyhow!("chain {name}: {reason}"))?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(chain: &ChainFileSettings) -> String {
        config(chain, &Catalog::default()).unwrap_err().to_string()
    }

    #[test]
    fn a_data_directory_is_given_as_a_file_url_or_a_setting_and_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let made =
            config(&ChainFileSettings::new("hyperliquid", &url), &Catalog::default()).unwrap();
        assert_eq!(made.data_dir, dir.path());
        assert_eq!(made.entities.len(), 5);
        assert_eq!(made.start, FileStart::Latest);
        let missing = format!("file://{}/nope", dir.path().display());
        let text = error(&ChainFileSettings::new("hyperliquid", &missing));
        assert!(text.contains("does not exist"), "{text}");
        let text = error(&ChainFileSettings::new("hyperliquid", "http://node:3001"));
        assert!(text.contains("file:///path/to/hl/data"), "{text}");
        let mut table = ChainFileSettings::new("hyperliquid", "");
        table.data_dir = Some(dir.path().to_owned());
        table.start = Some("earliest".to_owned());
        assert_eq!(config(&table, &Catalog::default()).unwrap().start, FileStart::Earliest);
        table.confirmations = Some(3);
        assert!(error(&table).contains("confirmations is a JSON-RPC setting"));
    }
}
