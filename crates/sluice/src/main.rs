//! The `sluice` binary: `serve` runs the service; `admin` manages keys and organizations
//! against the same store while a server runs; `bench` measures a running server.

mod admin;
mod backfill;
mod bench;
mod chains;
mod feed;
mod logging;
mod serve;
mod settings;
mod warehouse;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "Self-hostable streaming pipelines for blockchain data"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the service (API and everything behind it).
    Serve(Box<settings::ServeArgs>),
    /// Manage API keys and organizations (works while the server runs).
    #[command(subcommand)]
    Admin(admin::AdminCommand),
    /// Measure a running server's API latency and throughput.
    Bench(bench::BenchArgs),
    /// Send generated chain records to a running server's ingest endpoint.
    Feed(feed::FeedArgs),
    /// Follow backfill jobs.
    #[command(subcommand)]
    Backfill(backfill::BackfillCommand),
    /// Load history into the warehouse.
    #[command(subcommand)]
    Warehouse(warehouse::WarehouseCommand),
}

/// mimalloc rather than the system allocator: the pipeline hot path allocates a buffer per
/// record read, and glibc's malloc cost about 20 % of a worker's time (BENCHMARKS.md §2).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Threads for blocking calls (see `main`): enough for every worker of a few XL deployments
/// to run a script batch at once, while a node's thread count stays bounded.
const MAX_BLOCKING_THREADS: usize = 24;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    owner_only_files();
    logging::init();
    // Blocking work (log reads, script batches, librdkafka calls) runs on at most
    // `MAX_BLOCKING_THREADS` threads: tokio's default of 512 let a node with many pipelines
    // grow hundreds of threads under a burst of reads; past the bound, calls queue.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_keep_alive(std::time::Duration::from_secs(2))
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(*args).await,
            Command::Admin(command) => admin::run(command).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Feed(args) => feed::run(args).await,
            Command::Backfill(command) => backfill::run(command).await,
            Command::Warehouse(command) => warehouse::run(command).await,
        }
    })
}

/// Everything this process creates (the data dir, the SQLite database and its WAL and SHM
/// files, the stream log) is readable by its owner only: the store holds key hashes and
/// every tenant's records.
fn owner_only_files() {
    #[cfg(unix)]
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
}
