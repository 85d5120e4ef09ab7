//! The source catalog: which chain/entity streams exist, their transport and whether a
//! zerolag (pre-finality) variant exists.
//!
//! The default is the table of docs/contract.md §Source plus `ethereum` and `abstract`. An
//! operator can replace or extend it with a TOML catalog file:
//!
//! ```toml
//! mode = "extend"            # or "replace"
//! [[sources]]
//! chain = "arbitrum"
//! entity = "log"
//! source_type = "pubsub"
//! zerolag = true
//! consolidated = false
//! default_size = "M"
//! [[chains]]                 # optional: the chain's family and identity
//! name = "arbitrum"
//! family = "evm"             # evm, solana or hyperliquid
//! chain_id = 42161           # what eth_chainId must answer (evm)
//! ```
//!
//! The catalog also knows each chain's family (which ingester reads it) and identity (the
//! EVM chain id or the Solana genesis hash a node of it must report), see [`ChainIdentity`].

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::pipeline::{PodSize, SourceType};

/// One stream a pipeline can read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CatalogEntry {
    /// Value to use as `chain` in a source.
    pub chain: String,
    /// Value to use as `entity` in a source.
    pub entity: String,
    /// Whether a zerolag (pre-finality) variant of the stream exists.
    #[serde(default)]
    pub zerolag: bool,
    /// Whether the stream shares one topic with other entities of its chain (records tagged
    /// by entity) rather than having a topic of its own.
    #[serde(default)]
    pub consolidated: bool,
    /// Suggested pod size for a pipeline on this stream.
    #[serde(default)]
    pub default_size: PodSize,
    /// Transport of the source.
    pub source_type: SourceType,
}

/// The set of streams a pipeline may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    entries: Vec<CatalogEntry>,
    identities: Vec<ChainIdentity>,
}

/// What kind of node serves a chain, and so which ingester reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChainFamily {
    /// An EVM JSON-RPC node (`eth_*` methods).
    Evm,
    /// A Solana JSON-RPC node (`getBlock`, `getGenesisHash`, …).
    Solana,
    /// A Hyperliquid node's output files (no JSON-RPC ingester).
    Hyperliquid,
}

impl std::fmt::Display for ChainFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Evm => "EVM",
            Self::Solana => "Solana",
            Self::Hyperliquid => "Hyperliquid",
        })
    }
}

/// A chain's family and the identity its nodes must report: an ingester checks it at start
/// so that a URL of another chain (a local Anvil, a testnet, another family's node) is not
/// ingested under this chain's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainIdentity {
    /// The chain's catalog name.
    pub name: String,
    pub family: ChainFamily,
    /// EVM: what `eth_chainId` answers (8453 for Base).
    #[serde(default)]
    pub chain_id: Option<u64>,
    /// Solana: what `getGenesisHash` answers (base58).
    #[serde(default)]
    pub genesis_hash: Option<String>,
}

/// Solana mainnet-beta's genesis hash.
pub const SOLANA_MAINNET_GENESIS_HASH: &str = "5eykt4UsFv8P8NJdTREpY1vzqKqZKvdpKuc147dw2N9d";

fn default_identities() -> Vec<ChainIdentity> {
    let evm = |name: &str, chain_id: u64| ChainIdentity {
        name: name.to_owned(),
        family: ChainFamily::Evm,
        chain_id: Some(chain_id),
        genesis_hash: None,
    };
    vec![
        evm("polygon", 137),
        evm("base", 8453),
        evm("ethereum", 1),
        evm("abstract", 2741),
        ChainIdentity {
            name: "solana".to_owned(),
            family: ChainFamily::Solana,
            chain_id: None,
            genesis_hash: Some(SOLANA_MAINNET_GENESIS_HASH.to_owned()),
        },
        ChainIdentity {
            name: "hyperliquid".to_owned(),
            family: ChainFamily::Hyperliquid,
            chain_id: None,
            genesis_hash: None,
        },
    ]
}

/// Why a catalog file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("catalog file is not valid: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("catalog lists {chain}/{entity} more than once")]
    Duplicate { chain: String, entity: String },
    #[error("catalog entry {index} has an empty chain or entity")]
    Empty { index: usize },
    #[error("catalog lists chain {chain} more than once under [[chains]]")]
    DuplicateChain { chain: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    #[serde(default)]
    mode: CatalogMode,
    #[serde(default)]
    sources: Vec<CatalogEntry>,
    #[serde(default)]
    chains: Vec<ChainIdentity>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum CatalogMode {
    #[default]
    Extend,
    Replace,
}

const EVM_ENTITIES: [&str; 5] = [
    "log",
    "decoded_log",
    "erc20_token_transfer",
    "erc721_token_transfer",
    "erc1155_token_transfer",
];

impl Default for Catalog {
    fn default() -> Self {
        use PodSize::{L, M, S};
        use SourceType::{Kafka, Pubsub};
        let mut entries = Vec::new();
        let mut add = |chain: &str, entity: &str, source_type, zerolag, size| {
            entries.push(CatalogEntry {
                chain: chain.to_owned(),
                entity: entity.to_owned(),
                zerolag,
                consolidated: false,
                default_size: size,
                source_type,
            });
        };
        for chain in ["polygon", "base"] {
            for entity in EVM_ENTITIES {
                let size = if matches!(entity, "log" | "decoded_log") { M } else { S };
                add(chain, entity, Pubsub, true, size);
            }
            add(chain, "dex_trade", Pubsub, true, S);
        }
        add("solana", "nonvoting_transaction", Pubsub, false, L);
        add("solana", "dex_trade", Pubsub, false, M);
        for entity in ["block", "trade", "fill", "order", "misc_event"] {
            let size = if entity == "block" { S } else { M };
            add("hyperliquid", entity, Kafka, false, size);
        }
        add("ethereum", "log", Pubsub, true, S);
        add("ethereum", "dex_trade", Pubsub, true, S);
        add("abstract", "log", Pubsub, false, S);
        add("abstract", "erc20_token_transfer", Pubsub, false, S);
        add("abstract", "dex_trade", Pubsub, false, S);
        Self { entries, identities: default_identities() }
    }
}

impl Catalog {
    /// Applies a TOML catalog file to the default catalog (`mode = "extend"`, the default,
    /// adds entries and overrides those with the same chain/entity; `"replace"` starts empty).
    ///
    /// # Errors
    /// Malformed TOML, unknown fields, duplicates within the file, or empty names.
    pub fn from_file_text(text: &str) -> Result<Self, CatalogError> {
        let file: CatalogFile = toml::from_str(text)?;
        let mut catalog = match file.mode {
            CatalogMode::Extend => Self::default(),
            // The built-in chains keep their identities: `replace` is about the streams.
            CatalogMode::Replace => Self { entries: Vec::new(), identities: default_identities() },
        };
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for (index, entry) in file.sources.iter().enumerate() {
            if entry.chain.trim().is_empty() || entry.entity.trim().is_empty() {
                return Err(CatalogError::Empty { index });
            }
            let key = (entry.chain.as_str(), entry.entity.as_str());
            if seen.contains(&key) {
                return Err(CatalogError::Duplicate {
                    chain: entry.chain.clone(),
                    entity: entry.entity.clone(),
                });
            }
            seen.push(key);
        }
        for entry in file.sources {
            catalog.entries.retain(|e| !(e.chain == entry.chain && e.entity == entry.entity));
            catalog.entries.push(entry);
        }
        for (index, identity) in file.chains.iter().enumerate() {
            if file.chains[..index].iter().any(|c| c.name == identity.name) {
                return Err(CatalogError::DuplicateChain { chain: identity.name.clone() });
            }
        }
        for identity in file.chains {
            catalog.identities.retain(|c| c.name != identity.name);
            catalog.identities.push(identity);
        }
        Ok(catalog)
    }

    /// The family and identity the catalog gives `chain`: its `[[chains]]` entry, or for a
    /// chain without one an EVM chain of unknown chain id (operator-added chains before
    /// families existed were all EVM).
    pub fn identity(&self, chain: &str) -> ChainIdentity {
        self.identities.iter().find(|c| c.name == chain).cloned().unwrap_or_else(|| ChainIdentity {
            name: chain.to_owned(),
            family: ChainFamily::Evm,
            chain_id: None,
            genesis_hash: None,
        })
    }

    pub fn entries(&self) -> &[CatalogEntry] {
        &self.entries
    }

    /// The entry for `chain`/`entity`, if the catalog has it.
    pub fn find(&self, chain: &str, entity: &str) -> Option<&CatalogEntry> {
        self.entries.iter().find(|e| e.chain == chain && e.entity == entity)
    }

    /// Distinct chains, in catalog order.
    pub fn chains(&self) -> Vec<&str> {
        let mut chains: Vec<&str> = Vec::new();
        for entry in &self.entries {
            if !chains.contains(&entry.chain.as_str()) {
                chains.push(&entry.chain);
            }
        }
        chains
    }

    /// Entities of `chain`, in catalog order.
    pub fn entities(&self, chain: &str) -> Vec<&str> {
        self.entries.iter().filter(|e| e.chain == chain).map(|e| e.entity.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_catalog_holds_spec_table_plus_ethereum_and_abstract() {
        let catalog = Catalog::default();
        for chain in ["polygon", "base"] {
            for entity in EVM_ENTITIES {
                let entry = catalog.find(chain, entity).unwrap();
                assert!(entry.zerolag);
                assert_eq!(entry.source_type, SourceType::Pubsub);
            }
        }
        let solana = catalog.find("solana", "nonvoting_transaction").unwrap();
        assert!(!solana.zerolag);
        let order = catalog.find("hyperliquid", "order").unwrap();
        assert_eq!(order.source_type, SourceType::Kafka);
        assert_eq!(order.default_size, PodSize::M);
        assert_eq!(catalog.find("ethereum", "log").unwrap().default_size, PodSize::S);
        assert!(catalog.find("abstract", "log").is_some());
        for chain in ["polygon", "base", "ethereum", "abstract", "solana"] {
            assert!(catalog.find(chain, "dex_trade").is_some(), "{chain}");
        }
        assert_eq!(catalog.entries().len(), 10 + 1 + 5 + 1 + 2 + 5);
    }

    #[test]
    fn chains_have_a_family_and_an_identity_a_file_can_set() {
        let catalog = Catalog::default();
        assert_eq!(catalog.identity("base").chain_id, Some(8453));
        assert_eq!(catalog.identity("solana").family, ChainFamily::Solana);
        assert_eq!(
            catalog.identity("solana").genesis_hash.as_deref(),
            Some(SOLANA_MAINNET_GENESIS_HASH)
        );
        assert_eq!(catalog.identity("hyperliquid").family, ChainFamily::Hyperliquid);
        // A chain the catalog does not describe is an EVM chain of unknown id.
        assert_eq!(catalog.identity("arbitrum").family, ChainFamily::Evm);
        assert_eq!(catalog.identity("arbitrum").chain_id, None);
        let file = "[[chains]]\nname = \"arbitrum\"\nfamily = \"evm\"\nchain_id = 42161\n\
                    [[chains]]\nname = \"solana\"\nfamily = \"solana\"\ngenesis_hash = \"abc\"\n";
        let extended = Catalog::from_file_text(file).unwrap();
        assert_eq!(extended.identity("arbitrum").chain_id, Some(42161));
        assert_eq!(extended.identity("solana").genesis_hash.as_deref(), Some("abc"));
        assert_eq!(extended.identity("base").chain_id, Some(8453));
        let twice = "[[chains]]\nname = \"x\"\nfamily = \"evm\"\n".repeat(2);
        assert!(matches!(
            Catalog::from_file_text(&twice),
            Err(CatalogError::DuplicateChain { .. })
        ));
    }

    #[test]
    fn catalog_file_extends_or_replaces() {
        let extended = Catalog::from_file_text(
            "[[sources]]\nchain = \"arbitrum\"\nentity = \"log\"\nsource_type = \"pubsub\"\nzerolag = true\n\
             [[sources]]\nchain = \"solana\"\nentity = \"nonvoting_transaction\"\nsource_type = \"kafka\"\n",
        )
        .unwrap();
        assert!(extended.find("arbitrum", "log").unwrap().zerolag);
        assert_eq!(
            extended.find("solana", "nonvoting_transaction").unwrap().source_type,
            SourceType::Kafka
        );
        assert!(extended.find("base", "log").is_some());

        let replaced = Catalog::from_file_text(
            "mode = \"replace\"\n[[sources]]\nchain = \"x\"\nentity = \"y\"\nsource_type = \"kafka\"\ndefault_size = \"XL\"\n",
        )
        .unwrap();
        assert_eq!(replaced.entries().len(), 1);
        assert_eq!(replaced.chains(), vec!["x"]);
    }

    #[test]
    fn catalog_file_errors_are_reported() {
        assert!(Catalog::from_file_text("[[sources]]\nchain = \"x\"\n").is_err());
        assert!(Catalog::from_file_text("bogus = 1").is_err());
        let dup = "[[sources]]\nchain=\"a\"\nentity=\"b\"\nsource_type=\"kafka\"\n".repeat(2);
        assert!(matches!(Catalog::from_file_text(&dup), Err(CatalogError::Duplicate { .. })));
    }
}
