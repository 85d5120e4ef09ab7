//! `sluice warehouse import --table T FILE…`: loads NDJSON history into a warehouse table,
//! through a running server (`--url` with an operator key: requests of at most
//! [`REQUEST_BYTES`], cut at line ends) or offline on the data directory of a stopped server.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::settings::{Settings, StoreArgs};

/// Largest request body the import sends (under the server's default 16 MiB limit).
pub const REQUEST_BYTES: usize = 8 * 1024 * 1024;

#[derive(Debug, Subcommand)]
pub enum WarehouseCommand {
    /// Import NDJSON records (one stream record per line) or parquet files (a column per
    /// field) into a table; keys the table has are skipped, so an import can be run again.
    Import(ImportArgs),
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The table, e.g. base.assets.erc20_token_transfers.
    #[arg(long)]
    table: String,
    /// NDJSON or parquet files (told apart by their first bytes).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Import through this running server (an operator key in --api-key) rather than
    /// offline on the data directory.
    #[arg(long)]
    url: Option<String>,
    /// The operator key to send to that server (X-API-Key).
    #[arg(long, env = "SLUICE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Offline: the warehouse in object storage (as `serve --warehouse-url`).
    #[arg(long, env = "SLUICE_WAREHOUSE_URL")]
    warehouse_url: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
}

pub async fn run(command: WarehouseCommand) -> anyhow::Result<()> {
    let WarehouseCommand::Import(args) = command;
    let mut total = Totals::default();
    match &args.url {
        Some(url) => {
            let key = args
                .api_key
                .as_deref()
                .context("--api-key (or SLUICE_API_KEY) is needed with --url")?;
            let client = reqwest::Client::builder().timeout(Duration::from_secs(300)).build()?;
            let endpoint = format!(
                "{}/api/v1/warehouse/tables/{}/rows",
                url.trim_end_matches('/'),
                args.table
            );
            for file in &args.files {
                let reader = open_input(file)?;
                let mut body = Vec::with_capacity(REQUEST_BYTES);
                for line in reader.split(b'\n') {
                    let line = line?;
                    if body.len() + line.len() + 1 > REQUEST_BYTES && !body.is_empty() {
                        total.add(&send(&client, &endpoint, key, std::mem::take(&mut body)).await?);
                    }
                    body.extend_from_slice(&line);
                    body.push(b'\n');
                }
                if !body.is_empty() {
                    total.add(&send(&client, &endpoint, key, body).await?);
                }
            }
        }
        None => {
            let settings = Settings::resolve_store(&args.store)?;
            let catalog = sluice_core::catalog::Catalog::default();
            let table = sluice_backfill::tables::table(&catalog, &args.table)
                .with_context(|| format!("no table {}", args.table))?;
            let url = args.warehouse_url.clone().or(settings.warehouse_url.clone());
            let (warehouse, _) =
                sluice_backfill::open_warehouse(url.as_deref(), &settings.data_dir)?;
            for file in &args.files {
                let reader = open_input(file)?;
                let report = sluice_backfill::import::import_ndjson(&warehouse, &table, reader)?;
                total.add(&serde_json::to_value(&report)?);
            }
        }
    }
    println!(
        "{} lines read: {} imported, {} already there, {} rejected",
        total.read, total.imported, total.already_there, total.rejected
    );
    for (line, reason) in total.rejections.iter().take(20) {
        eprintln!("rejected: {line}: {reason}");
    }
    if total.rejected > 0 {
        bail!("{} lines were not valid records of the table", total.rejected);
    }
    Ok(())
}

/// The NDJSON lines of `file`: as they are, or made from a parquet file's rows.
fn open_input(file: &std::path::Path) -> anyhow::Result<Box<dyn BufRead>> {
    let mut handle =
        std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let mut head = [0u8; 4];
    let read = std::io::Read::read(&mut handle, &mut head)?;
    if sluice_backfill::import::is_parquet(&head[..read]) {
        let bytes = std::fs::read(file)?;
        let ndjson = sluice_backfill::import::parquet_to_ndjson(bytes.into())
            .with_context(|| format!("reading {}", file.display()))?;
        return Ok(Box::new(std::io::Cursor::new(ndjson)));
    }
    std::io::Seek::rewind(&mut handle)?;
    Ok(Box::new(BufReader::new(handle)))
}

async fn send(
    client: &reqwest::Client,
    endpoint: &str,
    key: &str,
    body: Vec<u8>,
) -> anyhow::Result<Value> {
    let response = client
        .post(endpoint)
        .header("X-API-Key", key)
        .header("content-type", "application/x-ndjson")
        .body(body)
        .send()
        .await
        .with_context(|| format!("reaching {endpoint}"))?;
    let status = response.status();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        bail!("{}: {}", status.as_u16(), answer["detail"]);
    }
    Ok(answer)
}

#[derive(Debug, Default)]
struct Totals {
    read: u64,
    imported: u64,
    already_there: u64,
    rejected: u64,
    rejections: Vec<(u64, String)>,
}

impl Totals {
    fn add(&mut self, report: &Value) {
        let n = |field: &str| report[field].as_u64().unwrap_or(0);
        self.read += n("read");
        self.imported += n("imported");
        self.already_there += n("already_there");
        self.rejected += n("rejected");
        if let Some(items) = report["rejections"].as_array() {
            for item in items {
                let line = item[0].as_u64().unwrap_or(0);
                self.rejections.push((line, item[1].as_str().unwrap_or_default().to_owned()));
            }
        }
    }
}
