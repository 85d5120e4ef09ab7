//! Settings of `serve` and the admin commands, resolved with the precedence
//! flags > `SLUICE_*` environment variables > config file (`--config sluice.toml`) > defaults.
//!
//! clap resolves flags and environment variables together (every option is an `Option`
//! with an `env` name, so "not given" is visible); the file and the defaults fill what is
//! still missing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;
use sluice_core::redaction::redact_password;

/// Options shared by every command that opens the store.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StoreArgs {
    /// Config file (TOML) with any of the settings below.
    #[arg(long, env = "SLUICE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory for the embedded database and other local state [default: ./sluice-data].
    #[arg(long, env = "SLUICE_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// `sqlite://<path>` or `postgres://user@host/db` [default: SQLite file in the data dir].
    #[arg(long, env = "SLUICE_DATABASE_URL", value_name = "URL")]
    pub database_url: Option<String>,
}

/// Options only `serve` uses.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, env = "SLUICE_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// TOML file that extends or replaces the source catalog (format: docs/operations.md,
    /// "Source catalog").
    #[arg(long, env = "SLUICE_CATALOG_FILE", value_name = "FILE")]
    pub catalog_file: Option<PathBuf>,
    /// Run gentle generated feeds into every chain stream of the catalog (for trying Sluice
    /// without an indexer).
    #[arg(long)]
    pub demo: bool,
    /// Largest request body accepted, in bytes [default: 16777216].
    #[arg(long, env = "SLUICE_MAX_BODY_BYTES", value_name = "BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Largest filter-values change body (a million values are ~45 MB), in bytes
    /// [default: 134217728].
    #[arg(long, env = "SLUICE_MAX_FILTER_VALUES_BODY_BYTES", value_name = "BYTES")]
    pub max_filter_values_body_bytes: Option<usize>,
    /// Bearer token that reads every pipeline's `/metrics` without an API key (Prometheus's
    /// `authorization` setting); without it `/metrics` needs an API key.
    #[arg(long, env = "SLUICE_METRICS_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// A second, operator-only address that serves `/metrics` of every pipeline without a key
    /// or token (keep it off the public network).
    #[arg(long, env = "SLUICE_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// The stream log: `embedded` (in the data dir) or `kafka://host:port[,host:port…][?…]`
    /// (see docs/operations.md) [default: embedded].
    #[arg(long = "bus", env = "SLUICE_BUS_URL", value_name = "URL", hide_env_values = true)]
    pub bus_url: Option<String>,
    /// Put in front of every Kafka topic and consumer group name, so several installations
    /// can share a cluster.
    #[arg(long, env = "SLUICE_BUS_TOPIC_PREFIX", value_name = "PREFIX")]
    pub bus_topic_prefix: Option<String>,
    /// Ingest an EVM chain of the catalog from a JSON-RPC URL (repeatable); more settings per
    /// chain in the config file's `[[chains]]` (see docs/chains.md).
    #[arg(long = "chain", value_name = "NAME=URL")]
    pub chains: Vec<String>,
    /// The key that seals organization secrets at rest: 64 hex characters [default: the
    /// key in `<data dir>/secrets.key`, generated on first start]. Every node of a cluster
    /// needs the same key.
    #[arg(long, env = "SLUICE_SECRETS_KEY", value_name = "HEX", hide_env_values = true)]
    pub secrets_key: Option<String>,
    /// Earlier secrets keys, comma-separated: values sealed with them are opened and resealed
    /// with the current key at start (key rotation, see docs/operations.md).
    #[arg(
        long,
        env = "SLUICE_SECRETS_PREVIOUS_KEYS",
        value_name = "HEX,…",
        hide_env_values = true
    )]
    pub secrets_previous_keys: Option<String>,
    /// The local address webhook and sns sinks of `static_egress_ip` pipelines send from;
    /// without it such pipelines are refused (422).
    #[arg(long, env = "SLUICE_EGRESS_BIND_ADDR", value_name = "IP")]
    pub egress_bind_addr: Option<std::net::IpAddr>,
    /// How often the archiver writes the chain streams' new records into the warehouse, in
    /// seconds [default: 60].
    #[arg(long, env = "SLUICE_WAREHOUSE_FLUSH_SECS", value_name = "SECS")]
    pub warehouse_flush_secs: Option<u64>,
    /// Keep the warehouse and staged backfill chunks in S3-compatible object storage
    /// (`s3://bucket/prefix`; endpoint, region and credentials from the `AWS_*` environment
    /// variables) instead of `<data dir>/warehouse` and `<data dir>/staging`.
    #[arg(long, env = "SLUICE_WAREHOUSE_URL", value_name = "URL")]
    pub warehouse_url: Option<String>,
    /// Rows per staged chunk of a backfill job [default: 100000].
    #[arg(long, env = "SLUICE_BACKFILL_CHUNK_ROWS", value_name = "ROWS")]
    pub backfill_chunk_rows: Option<usize>,
    /// This node's name among several `sluice serve` nodes on one PostgreSQL and Kafka
    /// (see docs/scaling.md) [default: <hostname>:<port>].
    #[arg(long, env = "SLUICE_NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// Seconds without a heartbeat after which a node counts as dead and its workers move
    /// to the others [default: 10].
    #[arg(long, env = "SLUICE_NODE_TIMEOUT_SECS", value_name = "SECS")]
    pub node_timeout_secs: Option<u64>,
    /// Keep set-filter values in Redis (`redis://[user:password@]host:port[/db][?prefix=P]`,
    /// keys under `P`, default `sluice`) instead of the store's tables: every node of a
    /// cluster follows its change feed (see docs/scaling.md).
    #[arg(long = "sets", env = "SLUICE_SETS_URL", value_name = "URL")]
    pub sets_url: Option<String>,
    /// Days the history of set-filter values is kept (`GET …/filter-values/changes`,
    /// `check?at=`; see docs/set-filter.md) [default: 90].
    #[arg(long, env = "SLUICE_SET_HISTORY_DAYS", value_name = "DAYS")]
    pub set_history_days: Option<u64>,
}

/// The config file: every setting, all optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    data_dir: Option<PathBuf>,
    database_url: Option<String>,
    listen: Option<SocketAddr>,
    catalog_file: Option<PathBuf>,
    max_body_bytes: Option<usize>,
    max_filter_values_body_bytes: Option<usize>,
    metrics_token: Option<String>,
    metrics_listen: Option<SocketAddr>,
    bus: Option<String>,
    bus_topic_prefix: Option<String>,
    #[serde(default)]
    chains: Vec<crate::chains::ChainFileSettings>,
    #[serde(default)]
    sources: Vec<crate::sources::SourceFileSettings>,
    secrets_key: Option<String>,
    secrets_previous_keys: Option<String>,
    egress_bind_addr: Option<std::net::IpAddr>,
    warehouse_flush_secs: Option<u64>,
    warehouse_url: Option<String>,
    backfill_chunk_rows: Option<usize>,
    node_name: Option<String>,
    node_timeout_secs: Option<u64>,
    sets: Option<String>,
    set_history_days: Option<u64>,
    #[serde(default)]
    events: crate::events::EventFileSettings,
}

/// Where the stream log lives.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Bus {
    /// `log.redb` in the data directory.
    #[default]
    Embedded,
    /// A Kafka cluster.
    Kafka(sluice_bus::KafkaSettings),
}

/// Resolved settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub data_dir: PathBuf,
    pub database_url: String,
    pub listen: SocketAddr,
    pub catalog_file: Option<PathBuf>,
    pub max_body_bytes: usize,
    pub max_filter_values_body_bytes: usize,
    pub metrics_token: Option<String>,
    pub metrics_listen: Option<SocketAddr>,
    pub bus: Bus,
    /// Chains to ingest (file `[[chains]]` with `--chain` flags applied).
    pub chains: Vec<crate::chains::ChainFileSettings>,
    /// Kafka sources (file `[[sources]]`).
    pub sources: Vec<crate::sources::SourceFileSettings>,
    /// The secrets key (hex); `None`: the data dir's key file.
    pub secrets_key: Option<String>,
    /// Earlier secrets keys (hex).
    pub secrets_previous_keys: Vec<String>,
    pub egress_bind_addr: Option<std::net::IpAddr>,
    pub warehouse_flush_secs: u64,
    /// Object storage of the warehouse; `None`: `<data dir>/warehouse`.
    pub warehouse_url: Option<String>,
    pub backfill_chunk_rows: usize,
    /// This node's name on a cluster (`None`: `<hostname>:<port>`).
    pub node_name: Option<String>,
    pub node_timeout_secs: u64,
    /// Where set-filter values live when not in the store's tables (`redis://…`).
    pub sets_url: Option<String>,
    /// Days set-filter value changes are kept (docs/set-filter.md, "Set history").
    pub set_history_days: u64,
    /// Service events: retention, thresholds and sampling (`[events]`, docs/events.md).
    pub events: sluice_runtime::events::EventSettings,
}

/// Shortest metrics token accepted: a guessable token would expose every tenant's metrics.
pub const MIN_METRICS_TOKEN_LEN: usize = 16;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_DATA_DIR: &str = "./sluice-data";
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
pub const DEFAULT_MAX_FILTER_VALUES_BODY_BYTES: usize = 128 * 1024 * 1024;
/// Longest set-history retention: about 100 years, far inside what a time can hold.
pub const MAX_SET_HISTORY_DAYS: u64 = 36_500;

impl Settings {
    /// Resolves `serve` settings.
    ///
    /// # Errors
    /// An unreadable or invalid config file, or a zero body limit.
    pub fn resolve(args: &ServeArgs) -> anyhow::Result<Self> {
        let file = read_file(args.store.config.as_deref())?;
        let data_dir = args
            .store
            .data_dir
            .clone()
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let database_url = args
            .store
            .database_url
            .clone()
            .or(file.database_url)
            .unwrap_or_else(|| default_database_url(&data_dir));
        let max_body_bytes =
            args.max_body_bytes.or(file.max_body_bytes).unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes == 0 {
            bail!("max_body_bytes must be greater than 0");
        }
        let max_filter_values_body_bytes = args
            .max_filter_values_body_bytes
            .or(file.max_filter_values_body_bytes)
            .unwrap_or(DEFAULT_MAX_FILTER_VALUES_BODY_BYTES);
        if max_filter_values_body_bytes == 0 {
            bail!("max_filter_values_body_bytes must be greater than 0");
        }
        let metrics_token = args.metrics_token.clone().or(file.metrics_token);
        if let Some(token) = &metrics_token {
            check_metrics_token(token)?;
        }
        let warehouse_flush_secs =
            args.warehouse_flush_secs.or(file.warehouse_flush_secs).unwrap_or(60);
        if warehouse_flush_secs == 0 {
            bail!("warehouse_flush_secs must be at least 1");
        }
        let backfill_chunk_rows =
            args.backfill_chunk_rows.or(file.backfill_chunk_rows).unwrap_or(100_000);
        if backfill_chunk_rows == 0 {
            bail!("backfill_chunk_rows must be at least 1");
        }
        let node_timeout_secs = args.node_timeout_secs.or(file.node_timeout_secs).unwrap_or(10);
        if node_timeout_secs < 2 {
            bail!("node_timeout_secs must be at least 2 (nodes write a heartbeat every second)");
        }
        let node_name = args.node_name.clone().or(file.node_name);
        if let Some(name) = &node_name {
            check_node_name(name)?;
        }
        let set_history_days = args.set_history_days.or(file.set_history_days).unwrap_or(90);
        if !(1..=MAX_SET_HISTORY_DAYS).contains(&set_history_days) {
            bail!("set_history_days must be 1 to {MAX_SET_HISTORY_DAYS}");
        }
        let sets_url = args.sets_url.clone().or(file.sets);
        if let Some(url) = &sets_url {
            check_sets_url(url)?;
        }
        let warehouse_url = args.warehouse_url.clone().or(file.warehouse_url);
        if let Some(url) = &warehouse_url {
            check_warehouse_url(url)?;
        }
        let bus = resolve_bus(
            args.bus_url.clone().or(file.bus),
            args.bus_topic_prefix.clone().or(file.bus_topic_prefix),
        )?;
        Ok(Self {
            bus,
            data_dir,
            database_url,
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("the default address parses")),
            catalog_file: args.catalog_file.clone().or(file.catalog_file),
            max_body_bytes,
            max_filter_values_body_bytes,
            metrics_token,
            metrics_listen: args.metrics_listen.or(file.metrics_listen),
            chains: crate::chains::merge(file.chains, &args.chains)?,
            sources: file.sources,
            secrets_key: args.secrets_key.clone().or(file.secrets_key),
            secrets_previous_keys: key_list(
                args.secrets_previous_keys.clone().or(file.secrets_previous_keys),
            ),
            egress_bind_addr: args.egress_bind_addr.or(file.egress_bind_addr),
            warehouse_flush_secs,
            warehouse_url,
            backfill_chunk_rows,
            node_name,
            node_timeout_secs,
            sets_url,
            set_history_days,
            events: crate::events::resolve(&file.events)?,
        })
    }

    /// Whether this process is a node of a cluster: its store is PostgreSQL and its log
    /// Kafka, which other nodes may share (one node alone behaves as before).
    pub fn is_cluster(&self) -> bool {
        matches!(self.bus, Bus::Kafka(_))
            && (self.database_url.starts_with("postgres://")
                || self.database_url.starts_with("postgresql://"))
    }

    /// The flags that name this store to the admin commands: `--data-dir` for the default
    /// SQLite file, `--database-url` (password hidden) otherwise.
    pub fn store_args(&self) -> String {
        if self.database_url == default_database_url(&self.data_dir) {
            format!("--data-dir {}", self.data_dir.display())
        } else {
            format!("--database-url {}", redact_password(&self.database_url))
        }
    }

    /// This node's name: the configured one, or `<hostname>:<port>`.
    pub fn node_name(&self) -> String {
        self.node_name.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty())
                .or_else(|| std::env::var("HOSTNAME").ok())
                .unwrap_or_else(|| "localhost".to_owned());
            format!("{host}:{}", self.listen.port())
        })
    }

    /// Resolves the settings of a command that only opens the store.
    ///
    /// # Errors
    /// As [`Settings::resolve`].
    pub fn resolve_store(args: &StoreArgs) -> anyhow::Result<Self> {
        Self::resolve(&ServeArgs { store: args.clone(), ..ServeArgs::default() })
    }

    /// Creates the data directory (mode 0700) when missing; an existing one that others may
    /// enter, and the store files in it, are tightened to owner-only with a warning.
    ///
    /// # Errors
    /// When the directory cannot be created or its mode changed.
    pub fn prepare_data_dir(&self) -> anyhow::Result<()> {
        self.prepare_dir()
    }

    /// The keyring that seals organization secrets: the given key, or the data dir's key
    /// file (created on first start), with the previous keys.
    ///
    /// # Errors
    /// A malformed key, or a key file that cannot be read or created.
    pub fn secrets_keyring(&self) -> anyhow::Result<sluice_store::secrets::Keyring> {
        use sluice_store::secrets::{Keyring, SecretsKey};
        let current = match &self.secrets_key {
            Some(hex) => SecretsKey::from_hex(hex).context("secrets_key")?,
            None => SecretsKey::load_or_create(&self.data_dir.join("secrets.key"))?,
        };
        let previous = self
            .secrets_previous_keys
            .iter()
            .map(|hex| SecretsKey::from_hex(hex).context("secrets_previous_keys"))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Keyring::new(current, previous))
    }

    fn prepare_dir(&self) -> anyhow::Result<()> {
        let dir = &self.data_dir;
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(dir)
            .with_context(|| format!("creating data directory {}", dir.display()))?;
        #[cfg(unix)]
        tighten(dir)?;
        Ok(())
    }
}

/// The stream log of `url` (`embedded`, `kafka://…`), with the topic prefix of the flag (which
/// wins over one in the URL).
fn resolve_bus(url: Option<String>, topic_prefix: Option<String>) -> anyhow::Result<Bus> {
    let url = url.unwrap_or_default();
    if url.is_empty() || url == "embedded" {
        if topic_prefix.is_some() {
            bail!("bus_topic_prefix names Kafka topics; it needs a kafka:// bus");
        }
        return Ok(Bus::Embedded);
    }
    let mut settings = sluice_bus::KafkaSettings::parse(&url)?;
    if let Some(prefix) = topic_prefix {
        let url = format!("kafka://{}?topic_prefix={prefix}", settings.bootstrap_servers);
        settings.topic_prefix = sluice_bus::KafkaSettings::parse(&url)?.topic_prefix;
    }
    Ok(Bus::Kafka(settings))
}

/// The files Sluice keeps in a data directory.
pub const DATA_FILES: [&str; 4] = ["sluice.db", "sluice.db-wal", "sluice.db-shm", "log.redb"];

/// Makes `dir` 0700 and its store files 0600 where they are looser, saying so in the log.
#[cfg(unix)]
fn tighten(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let paths = std::iter::once((dir.to_path_buf(), 0o700))
        .chain(DATA_FILES.iter().map(|name| (dir.join(name), 0o600)));
    for (path, wanted) in paths {
        let Ok(metadata) = std::fs::metadata(&path) else { continue };
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(wanted))
                .with_context(|| format!("making {} owner-only", path.display()))?;
            tracing::warn!(
                path = ?path,
                was = format!("{mode:o}"),
                now = format!("{wanted:o}"),
                "tightened the mode of a data-directory entry to owner-only"
            );
        }
    }
    Ok(())
}

/// An object-storage warehouse is `s3://bucket[/prefix]` (the `AWS_*` variables say where and
/// as whom); anything else is an error showing what was given.
fn check_warehouse_url(url: &str) -> anyhow::Result<()> {
    let bucket = url
        .strip_prefix("s3://")
        .or_else(|| url.strip_prefix("s3a://"))
        .map(|rest| rest.split('/').next().unwrap_or(""));
    let valid = bucket.is_some_and(|bucket| {
        !bucket.is_empty()
            && bucket.bytes().all(|b| b.is_ascii_alphanumeric() || b".-_".contains(&b))
    }) && reqwest::Url::parse(url).is_ok();
    if !valid {
        bail!(
            "warehouse_url '{}' must be s3://bucket[/prefix] (endpoint, region and credentials \
             come from the AWS_* environment variables)",
            redact_password(url)
        );
    }
    Ok(())
}

fn default_database_url(data_dir: &Path) -> String {
    format!("sqlite://{}", data_dir.join("sluice.db").display())
}

fn read_file(path: Option<&Path>) -> anyhow::Result<FileSettings> {
    let Some(path) = path else {
        return Ok(FileSettings::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {} is not valid", path.display()))
}

/// A metrics token long enough to guess at, without surrounding spaces.
fn check_metrics_token(token: &str) -> anyhow::Result<()> {
    if token.trim().len() < MIN_METRICS_TOKEN_LEN || token.trim() != token {
        bail!(
            "metrics_token must be at least {MIN_METRICS_TOKEN_LEN} characters, without \
             surrounding spaces"
        );
    }
    Ok(())
}

fn check_node_name(name: &str) -> anyhow::Result<()> {
    if name.trim().is_empty() || name.len() > 200 || name.trim() != name {
        bail!("node_name must be 1 to 200 characters, without surrounding spaces");
    }
    Ok(())
}

fn check_sets_url(url: &str) -> anyhow::Result<()> {
    if !url.starts_with("redis://") {
        bail!(
            "sets '{}' must be a redis:// URL (redis://[user:password@]host:port[/db][?prefix=P])",
            redact_password(url)
        );
    }
    Ok(())
}

/// A comma-separated list of keys (none when not given).
fn key_list(keys: Option<String>) -> Vec<String> {
    keys.map(|keys| {
        keys.split(',').map(str::trim).filter(|k| !k.is_empty()).map(str::to_owned).collect()
    })
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let path = dir.path().join("sluice.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn defaults_apply_when_nothing_is_given() {
        let settings = Settings::resolve(&ServeArgs::default()).unwrap();
        assert_eq!(settings.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(settings.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(settings.database_url, "sqlite://./sluice-data/sluice.db");
        assert_eq!(settings.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
        assert_eq!(settings.max_filter_values_body_bytes, DEFAULT_MAX_FILTER_VALUES_BODY_BYTES);
        assert_eq!(settings.metrics_token, None);
        assert_eq!(settings.metrics_listen, None);
    }

    #[test]
    fn set_history_is_kept_90_days_unless_a_flag_or_the_file_says_1_to_36500() {
        assert_eq!(Settings::resolve(&ServeArgs::default()).unwrap().set_history_days, 90);
        let dir = tempfile::tempdir().unwrap();
        let mut args = ServeArgs::default();
        args.store.config = Some(file(&dir, "set_history_days = 30\n"));
        assert_eq!(Settings::resolve(&args).unwrap().set_history_days, 30);
        args.set_history_days = Some(7);
        assert_eq!(Settings::resolve(&args).unwrap().set_history_days, 7, "the flag wins");
        for days in [0, MAX_SET_HISTORY_DAYS + 1] {
            args.set_history_days = Some(days);
            let error = Settings::resolve(&args).unwrap_err().to_string();
            assert!(error.contains("set_history_days must be 1 to 36500"), "{days}: {error}");
        }
    }

    #[test]
    fn metrics_settings_come_from_the_file_and_short_tokens_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut args = ServeArgs::default();
        args.store.config = Some(file(
            &dir,
            "metrics_token = \"a-long-enough-token\"\nmetrics_listen = \"127.0.0.1:9464\"\n",
        ));
        let settings = Settings::resolve(&args).unwrap();
        assert_eq!(settings.metrics_token.as_deref(), Some("a-long-enough-token"));
        assert_eq!(settings.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        args.metrics_token = Some("short".to_owned());
        assert!(Settings::resolve(&args).is_err());
    }

    #[test]
    fn file_fills_what_flags_and_env_leave_open() {
        let dir = tempfile::tempdir().unwrap();
        let config = file(
            &dir,
            "data_dir = \"/from/file\"\nlisten = \"127.0.0.1:9000\"\nmax_body_bytes = 10\n\
             max_filter_values_body_bytes = 20\n",
        );
        let mut args = ServeArgs::default();
        args.store.config = Some(config);
        // A flag (or an env var, which clap folds into the same field) wins over the file.
        args.listen = Some("127.0.0.1:9999".parse().unwrap());
        let settings = Settings::resolve(&args).unwrap();
        assert_eq!(settings.listen, "127.0.0.1:9999".parse().unwrap());
        assert_eq!(settings.data_dir, PathBuf::from("/from/file"));
        assert_eq!(settings.database_url, "sqlite:///from/file/sluice.db");
        assert_eq!(settings.max_body_bytes, 10);
        assert_eq!(settings.max_filter_values_body_bytes, 20);
    }

    #[test]
    fn bad_set_store_and_warehouse_urls_show_what_was_given_without_the_password() {
        let mut args = ServeArgs {
            sets_url: Some("rediss-typo://u:pw@h:1".to_owned()),
            ..ServeArgs::default()
        };
        let error = format!("{:#}", Settings::resolve(&args).unwrap_err());
        assert!(error.contains("'rediss-typo://u:***@h:1'"), "{error}");
        assert!(!error.contains("pw@"), "{error}");
        args.sets_url = None;
        for bad in ["not-a-url", "s3:/bucket", "s3://", "http://bucket/x"] {
            args.warehouse_url = Some(bad.to_owned());
            let error = format!("{:#}", Settings::resolve(&args).unwrap_err());
            assert!(error.contains(&format!("warehouse_url '{bad}' must be s3://")), "{error}");
        }
        args.warehouse_url = Some("s3://k:secret@bucket/p".to_owned());
        let error = format!("{:#}", Settings::resolve(&args).unwrap_err());
        assert!(error.contains("'s3://k:***@bucket/p'"), "{error}");
        args.warehouse_url = Some("s3://bucket/prefix".to_owned());
        assert!(Settings::resolve(&args).is_ok());
    }

    #[test]
    fn bad_config_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut args = ServeArgs::default();
        args.store.config = Some(file(&dir, "lisen = \"x\"\n"));
        assert!(Settings::resolve(&args).is_err());
        args.store.config = Some(dir.path().join("missing.toml"));
        assert!(Settings::resolve(&args).is_err());
    }
}
