//! The `sluice` binary: `serve` runs the service; `admin` manages keys and organizations
//! against the same store while a server runs; `bench` measures a running server.

mod admin;
mod backfill;
mod bench;
mod chains;
mod events;
mod feed;
mod logging;
mod patience;
mod preflight;
mod serve;
mod settings;
mod sources;
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
/// Built without transparent huge pages (the workspace's `no_thp` feature, BENCHMARKS.md
/// §20).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Threads for blocking calls (see `main`): enough for every worker of a few XL deployments
/// to run a script batch at once, while a node's thread count stays bounded.
const MAX_BLOCKING_THREADS: usize = 24;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // One line: what was tried and why it failed, each cause after a colon.
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::Cli;

    /// Every subcommand, depth first, with its path of names.
    fn commands() -> Vec<(String, clap::Command)> {
        fn walk(path: String, command: &clap::Command, out: &mut Vec<(String, clap::Command)>) {
            out.push((path.clone(), command.clone()));
            for sub in command.get_subcommands() {
                walk(format!("{path} {}", sub.get_name()), sub, out);
            }
        }
        let mut out = Vec::new();
        walk("sluice".to_owned(), &Cli::command(), &mut out);
        out
    }

    #[test]
    fn every_option_of_every_command_says_what_it_is_for() {
        let mut missing = Vec::new();
        for (path, command) in commands() {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
        }
        assert!(missing.is_empty(), "options without help text: {missing:?}");
    }

    #[test]
    fn every_doc_the_help_names_is_in_the_repository() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut named = Vec::new();
        for (path, mut command) in commands() {
            let help = command.render_long_help().to_string();
            for (at, _) in help.match_indices("docs/") {
                let doc: String = help[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || "/._-".contains(*c))
                    .collect();
                let doc = doc.trim_end_matches('.').to_owned();
                named.push((path.clone(), doc));
            }
        }
        assert!(!named.is_empty(), "the help names docs (docs/operations.md at least)");
        let missing: Vec<_> = named.iter().filter(|(_, doc)| !root.join(doc).is_file()).collect();
        assert!(missing.is_empty(), "help names docs that do not exist: {missing:?}");
    }
}
