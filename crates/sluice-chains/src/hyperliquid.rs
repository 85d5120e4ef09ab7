//! The Hyperliquid ingester: a non-validating node's output directory (`hl-node`'s
//! `~/hl/data`) turned into the `block`, `trade`, `fill`, `order` and `misc_event` streams,
//! following the files as the node appends to them and across its hourly rotation, with an
//! exact resume after a crash. `docs/chains.md` ("Hyperliquid") is the prose.
//!
//! Start at [`ingester::HyperliquidIngester`]: per stream it picks the node's directory
//! ([`files`]), reads the complete lines past its position, turns them into records
//! ([`records`]) and appends each step's records in one append. There are no reorgs to undo:
//! HyperBFT finalizes a block at once, and the node writes only committed blocks.

pub mod files;
pub mod ingester;
pub mod raw;
pub mod records;

use std::path::PathBuf;
use std::time::Duration;

pub use ingester::HyperliquidIngester;

/// Where a stream without a stored position starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileStart {
    /// What the node writes from the first start on: the end of each stream's newest file
    /// (a stream whose directory appears later is read from its first file).
    Latest,
    /// Every file the directory holds, oldest first.
    Earliest,
}

impl std::str::FromStr for FileStart {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "latest" => Ok(Self::Latest),
            "earliest" => Ok(Self::Earliest),
            other => Err(format!("start {other:?} is not \"latest\" or \"earliest\"")),
        }
    }
}

/// One Hyperliquid chain's ingester.
#[derive(Debug, Clone)]
pub struct HyperliquidConfig {
    /// The chain's catalog name (`hyperliquid`).
    pub name: String,
    /// The node's data directory (`~/hl/data`).
    pub data_dir: PathBuf,
    /// The entities to write (those of the chain in the catalog).
    pub entities: Vec<String>,
    pub start: FileStart,
    /// How often the files are looked at while caught up.
    pub poll_interval: Duration,
    /// Bytes read from one file per step (a step's records go in one append).
    pub max_read_bytes: usize,
}

impl HyperliquidConfig {
    /// The defaults: every entity, from the latest lines, a 10 ms poll, 4 MiB per step.
    pub fn new(name: &str, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            name: name.to_owned(),
            data_dir: data_dir.into(),
            entities: files::STREAMS.iter().map(|(entity, _)| (*entity).to_owned()).collect(),
            start: FileStart::Latest,
            poll_interval: Duration::from_millis(10),
            max_read_bytes: 4 << 20,
        }
    }

    /// Checks the data directory can be read.
    ///
    /// # Errors
    /// Says why not: missing, not a directory, not readable.
    pub fn check(&self) -> Result<(), String> {
        let dir = self.data_dir.display();
        match std::fs::metadata(&self.data_dir) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("the node data directory {dir} does not exist"));
            }
            Err(error) => return Err(format!("the node data directory {dir}: {error}")),
            Ok(meta) if !meta.is_dir() => {
                return Err(format!("the node data directory {dir} is not a directory"));
            }
            Ok(_) => {}
        }
        std::fs::read_dir(&self.data_dir)
            .map(drop)
            .map_err(|error| format!("the node data directory {dir} cannot be read: {error}"))
    }
}
