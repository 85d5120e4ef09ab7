//! `sluice serve`: open the store, bootstrap the first operator, serve HTTP until SIGTERM or
//! SIGINT, then finish in-flight requests and stop.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sluice_api::{AppState, Limits};
use sluice_bus::{EmbeddedLog, KafkaLog};
use sluice_core::catalog::Catalog;
use sluice_core::clock::{Clock, SystemClock};
use sluice_runtime::datasets::DatasetIndex;
use sluice_runtime::{ClusterSettings, Runtime};
use sluice_store::MetadataStore;

use crate::patience::Patience;
use crate::settings::{Bus, ServeArgs, Settings};

/// Names of the identity created on first start.
const BOOTSTRAP_ORG: &str = "sluice";
const BOOTSTRAP_TEAM: &str = "operators";
const BOOTSTRAP_USER: &str = "admin";

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args)?;
    // Nothing is created before every check passed, and the first operator's key is made
    // last, just before serving: a start that fails leaves the next one a first start.
    let crate::preflight::Checked {
        catalog,
        chains: chain_configs,
        sources,
        listener,
        metrics_listener,
    } = crate::preflight::check(&settings).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    settings.prepare_data_dir()?;
    // The stream log before the store: connecting to Kafka creates nothing, so a broker that
    // does not answer stops the start before a database is made.
    let log = open_log(&settings, &clock).await?;
    // From here on every server has answered the preflight: a step failing on one of them
    // is tried again for a while (a restart, a cut connection), as a running node rides it out.
    let patience = start_patience(&settings);
    let store = patience.run(|| open_store(&settings)).await?;
    // Large filter-value sets are snapshotted beside the store, so they are ready soon after
    // a restart (the deployments started below read them first).
    store.keep_set_snapshots(settings.data_dir.join("sets"));
    let secrets = patience.run(|| open_secrets(&settings, &store)).await?;
    let node_name = settings.node_name();
    let recorder =
        sluice_runtime::events::Recorder::start(store.clone(), clock.clone(), settings.events);
    let sink_env = sluice_runtime::SinkEnv {
        secrets: Some(secrets.clone()),
        egress: settings.egress_bind_addr,
    };
    let cluster = cluster_settings(&settings, &node_name);
    let runtime = patience
        .run(|| async {
            Runtime::builder(store.clone(), log.clone(), Arc::new(catalog.clone()), clock.clone())
                .set_source(Arc::new(sluice_runtime::sets::StoreSetSource(store.clone())))
                .sinks(sink_env.clone())
                .cluster(cluster.clone())
                .events(recorder.clone())
                .start()
                .await
                .context("starting the pipeline runtime")
        })
        .await?;
    let mut background = background_tasks(&runtime, &catalog, args.demo);
    let warehouse =
        start_warehouse(&settings, &store, &runtime, &catalog, &clock, &secrets, &recorder).await?;
    let history =
        chrono::Duration::days(i64::try_from(settings.set_history_days).unwrap_or(i64::MAX));
    background.push(tokio::spawn(set_upkeep(store.clone(), clock.clone(), history)));
    let chains = crate::chains::start(chain_configs, sources, &runtime)?;
    background.extend(chains.tasks);
    if let Some(status) = &chains.status {
        background.push(crate::events::watch_chains(status.clone(), recorder.clone()));
    }
    // The same store serves prices (one pool); loading the service (recent candles, latest
    // minutes) happens while the API serves.
    let prices = sluice_api::PriceSlot::default();
    background.push(tokio::spawn(run_prices(
        store.clone().into_prices(),
        runtime.log().clone(),
        sluice_prices::trade_topics(&catalog),
        clock.clone(),
        prices.clone(),
        price_share(&runtime),
    )));
    // Every dataset in memory before the first request, so `beam.contains` never waits on
    // the store; the API keeps it current from then on. The same index is the script
    // engine's `DatasetLookup`.
    let datasets = patience.run(|| load_datasets(store.as_ref())).await?;
    let dataset_listener = runtime.follow_datasets(datasets.clone());

    let snapshot_store = store.clone();
    let bootstrap_store = store.clone();
    let state = AppState::new(
        store,
        catalog,
        clock,
        Limits {
            max_body_bytes: settings.max_body_bytes,
            max_filter_values_body_bytes: settings.max_filter_values_body_bytes,
        },
    )
    .with_runtime(runtime.clone())
    .with_node_name(&node_name)
    .with_sinks(secrets, settings.egress_bind_addr)
    .with_backfills(warehouse.backfills.clone())
    .with_dataset_listener(dataset_listener)
    .with_price_slot(prices);
    let state = match chains.status {
        Some(chains) => state.with_chains(chains),
        None => state,
    };
    let state = match &settings.metrics_token {
        Some(token) => state.with_metrics_token(token.as_str()),
        None => state,
    };
    if let Some(listener) = metrics_listener {
        background.push(serve_metrics(listener, state.clone())?);
    }
    bootstrap(bootstrap_store.as_ref(), &settings, patience).await?;
    tracing::info!(address = %listener.local_addr()?, database = %redact(&settings.database_url), "sluice is serving");
    let service =
        axum::ServiceExt::<axum::extract::Request>::into_make_service(sluice_api::app(state));
    axum::serve(listener, service).with_graceful_shutdown(shutdown_signal()).await?;
    stop(background, warehouse, &runtime, snapshot_store.as_ref()).await;
    Ok(())
}

async fn load_datasets(store: &dyn MetadataStore) -> anyhow::Result<Arc<DatasetIndex>> {
    let index = DatasetIndex::load(store).await.context("loading the dataset index")?;
    Ok(Arc::new(index))
}

/// How a start waits out a fault of a server it runs on (docs/operations.md, "Starting"): on
/// the embedded default (SQLite and the embedded log) there is no server to wait for.
fn start_patience(settings: &Settings) -> Patience {
    let on_servers = !settings.database_url.starts_with("sqlite:")
        || matches!(settings.bus, Bus::Kafka(_))
        || settings.sets_url.is_some();
    if on_servers { Patience::new(Patience::ON_SERVERS) } else { Patience::none() }
}

/// The organization secrets, resealed with the current key where an older one sealed them.
async fn open_secrets(
    settings: &Settings,
    store: &Arc<dyn MetadataStore>,
) -> anyhow::Result<sluice_store::Secrets> {
    let secrets = sluice_store::Secrets::new(store.clone(), settings.secrets_keyring()?);
    let resealed = secrets.reseal().await.context("resealing secrets with the current key")?;
    if resealed > 0 {
        tracing::info!(resealed, "organization secrets resealed with the current secrets key");
    }
    Ok(secrets)
}

/// Serves `GET /metrics` of every pipeline on the operator's metrics listener.
fn serve_metrics(
    listener: tokio::net::TcpListener,
    state: AppState,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    tracing::info!(address = %listener.local_addr()?, "serving /metrics without a key");
    let app = sluice_api::metrics_app(state);
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the metrics listener stopped");
        }
    }))
}

/// After the last request: the background tasks end, the archiver writes what it read, the
/// workers finish and commit their batch (deployments stay stored for the next start), and
/// the set snapshots are written.
async fn stop(
    background: Vec<tokio::task::JoinHandle<()>>,
    warehouse: WarehouseTasks,
    runtime: &Runtime,
    store: &dyn MetadataStore,
) {
    for task in background {
        task.abort();
    }
    warehouse.stop().await;
    runtime.shutdown().await;
    match store.save_set_snapshots().await {
        Ok(0) => {}
        Ok(written) => tracing::info!(written, "filter-value set snapshots written"),
        Err(error) => tracing::warn!(%error, "filter-value set snapshots not written"),
    }
    tracing::info!("sluice stopped");
}

/// How this node takes part in a cluster, when the settings make it one of a cluster.
fn cluster_settings(settings: &Settings, node_name: &str) -> Option<ClusterSettings> {
    settings.is_cluster().then(|| {
        let mut cluster =
            ClusterSettings::new(node_name.to_owned(), format!("http://{}", settings.listen));
        cluster.node_timeout = Duration::from_secs(settings.node_timeout_secs);
        tracing::info!(node = %node_name, "a cluster node: PostgreSQL holds the desired state, workers spread over the live nodes");
        cluster
    })
}

/// The warehouse, its archiver and the backfill jobs over it, while the server runs.
struct WarehouseTasks {
    backfills: Arc<sluice_backfill::jobs::Backfills>,
    stop_archiver: tokio::sync::watch::Sender<bool>,
    archiver_task: tokio::task::JoinHandle<()>,
}

impl WarehouseTasks {
    /// Lets the archiver write what it read before the process goes.
    async fn stop(self) {
        self.stop_archiver.send_replace(true);
        if let Err(error) = self.archiver_task.await {
            tracing::warn!(%error, "the archiver ended abnormally");
        }
    }
}

/// Opens the warehouse, starts its archiver (on a cluster sharing one warehouse, only while
/// this node holds the archiver role) and resumes the backfill jobs where they were.
async fn start_warehouse(
    settings: &Settings,
    store: &Arc<dyn MetadataStore>,
    runtime: &Arc<Runtime>,
    catalog: &Catalog,
    clock: &Arc<dyn Clock>,
    secrets: &sluice_store::Secrets,
    recorder: &Arc<sluice_runtime::events::Recorder>,
) -> anyhow::Result<WarehouseTasks> {
    let (warehouse, staging) = {
        let (url, dir) = (settings.warehouse_url.clone(), settings.data_dir.clone());
        tokio::task::spawn_blocking(move || sluice_backfill::open_warehouse(url.as_deref(), &dir))
            .await?
            .context("opening the warehouse")?
    };
    let (stop_archiver, archiver_stop) = tokio::sync::watch::channel(false);
    let archiver = sluice_backfill::archiver::Archiver::new(
        warehouse.clone(),
        runtime.log().clone(),
        sluice_backfill::tables::tables(catalog),
        sluice_backfill::archiver::ArchiverSettings {
            flush_every: Duration::from_secs(settings.warehouse_flush_secs),
            ..Default::default()
        },
    );
    let archiver_task = if settings.is_cluster() && settings.warehouse_url.is_some() {
        // One warehouse shared by every node: one archiver at a time.
        tokio::spawn(archive_as_the_one(store.clone(), archiver, archiver_stop))
    } else {
        tokio::spawn(archiver.run(archiver_stop))
    };
    let backfills = sluice_backfill::jobs::Backfills::new(
        store.clone(),
        warehouse,
        runtime.log().clone(),
        Arc::new(catalog.clone()),
        clock.clone(),
        staging,
        sluice_runtime::SinkEnv {
            secrets: Some(secrets.clone()),
            egress: settings.egress_bind_addr,
        },
        sluice_backfill::jobs::BackfillSettings {
            chunk_rows: settings.backfill_chunk_rows,
            ..Default::default()
        },
    );
    backfills.use_datasets(runtime.datasets());
    backfills.use_events(recorder.clone());
    let resumed = start_patience(settings)
        .run(|| async { backfills.resume().await.context("resuming backfill jobs") })
        .await?;
    if resumed > 0 {
        tracing::info!(resumed, "backfill jobs resumed");
    }
    Ok(WarehouseTasks { backfills, stop_archiver, archiver_task })
}

/// How often a node that does not archive tries to take the role, and the archiving node
/// checks it still holds it.
const ARCHIVER_ROLE_CHECK: Duration = Duration::from_secs(5);

/// Runs the archiver while this node holds the cluster's archiver role (PostgreSQL session
/// lock), until `stop`: two archivers of one shared warehouse would race on its tables'
/// manifests. Another node takes the role within [`ARCHIVER_ROLE_CHECK`] of this one
/// stopping or losing its database session; the manifests say where to go on.
async fn archive_as_the_one(
    store: Arc<dyn MetadataStore>,
    archiver: sluice_backfill::archiver::Archiver,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        match store.try_role("archiver").await {
            Ok(Some(role)) => {
                if archive_while_held(role, &archiver, &mut stop).await {
                    return;
                }
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "cannot take the archiver role"),
        }
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(ARCHIVER_ROLE_CHECK) => {}
        }
    }
}

/// Runs the archiver while this node holds `role`; true when it ended because of `stop`,
/// false when the role was lost or the archiver ended (the role is then given up).
async fn archive_while_held(
    mut role: sluice_store::RoleLock,
    archiver: &sluice_backfill::archiver::Archiver,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    tracing::info!("this node archives the shared warehouse");
    let (end_term, term) = tokio::sync::watch::channel(false);
    let mut run = tokio::spawn(archiver.clone().run(term));
    let stopping = loop {
        tokio::select! {
            _ = stop.changed() => break true,
            ended = &mut run => {
                tracing::warn!(?ended, "the archiver ended; the role is given up");
                break false;
            }
            () = tokio::time::sleep(ARCHIVER_ROLE_CHECK) => {
                if !role.still_held().await {
                    tracing::warn!("the archiver role was lost (database session); archiving stops here");
                    break false;
                }
            }
        }
    };
    end_term.send_replace(true);
    if !run.is_finished()
        && let Err(error) = run.await
    {
        tracing::warn!(%error, "the archiver ended abnormally");
    }
    drop(role);
    stopping
}

/// The stream log: embedded in the data directory (whichever database holds metadata), or
/// on a Kafka cluster.
async fn open_log(
    settings: &Settings,
    clock: &Arc<dyn Clock>,
) -> anyhow::Result<Arc<dyn sluice_bus::StreamLog>> {
    match &settings.bus {
        Bus::Embedded => {
            let path = settings.data_dir.join("log.redb");
            let log = EmbeddedLog::open(&path, clock.clone())
                .with_context(|| format!("opening the stream log {}", path.display()))?;
            Ok(Arc::new(log))
        }
        Bus::Kafka(kafka) => {
            let log = KafkaLog::connect(kafka.clone(), clock.clone()).await?;
            tracing::info!(bus = %kafka.redacted(), "stream log on Kafka");
            Ok(Arc::new(log))
        }
    }
}

/// How often snapshots of large filter-value sets that changed are written.
const SET_SNAPSHOT_INTERVAL: Duration = Duration::from_secs(60);

/// Every minute: writes the snapshots of changed large filter-value sets, and deletes the
/// set-history changes older than `history` (docs/set-filter.md, "Set history").
async fn set_upkeep(
    store: Arc<dyn MetadataStore>,
    clock: Arc<dyn Clock>,
    history: chrono::Duration,
) {
    let mut tick = tokio::time::interval(SET_SNAPSHOT_INTERVAL);
    tick.tick().await;
    loop {
        tick.tick().await;
        match store.prune_set_history(clock.now() - history).await {
            Ok(0) => {}
            Ok(pruned) => tracing::info!(pruned, "set-history changes past retention deleted"),
            Err(error) => tracing::warn!(%error, "set-history retention run failed"),
        }
        match store.save_set_snapshots().await {
            Ok(0) => {}
            Ok(written) => tracing::info!(written, "filter-value set snapshots written"),
            Err(error) => tracing::warn!(%error, "filter-value set snapshots not written"),
        }
    }
}

/// How often records past their topic's retention are removed.
const RETENTION_INTERVAL: Duration = Duration::from_secs(60);

/// Records generated per stream per second by `--demo`.
const DEMO_RATE: u64 = 6;

/// Share of the demo's EVM token picks that are the chain's well-known tokens (USDC, WETH…):
/// all of them, so that the walkthrough's USDC filter on Base (one of six well-known tokens)
/// passes about one record a second.
const DEMO_WELL_KNOWN_SHARE: f64 = 1.0;

/// The demo generator of one stream.
fn demo_generator(
    chain: &str,
    entity: &str,
    seed: u64,
) -> Result<sluice_feed::Generator, sluice_feed::FeedError> {
    Ok(sluice_feed::Generator::new(chain, entity, seed)?
        .with_well_known_share(DEMO_WELL_KNOWN_SHARE))
}

/// The retention job, and with `demo` a gentle feed into every catalog stream.
fn background_tasks(
    runtime: &Arc<Runtime>,
    catalog: &Catalog,
    demo: bool,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let log = runtime.log().clone();
    tasks.push(tokio::spawn(async move {
        let mut tick = tokio::time::interval(RETENTION_INTERVAL);
        loop {
            tick.tick().await;
            match log.enforce_retention().await {
                Ok(0) => {}
                Ok(removed) => tracing::info!(removed, "removed records past retention"),
                Err(error) => tracing::warn!(%error, "retention run failed"),
            }
        }
    }));
    if demo {
        // A new seed per start, as `sluice feed` does: a restarted demo sends new keys rather
        // than the previous run's again (streams of one seed differ by chain and entity).
        let seed = crate::feed::random_seed();
        for entry in catalog.entries() {
            let Ok(generator) = demo_generator(&entry.chain, &entry.entity, seed) else {
                tracing::warn!(chain = %entry.chain, entity = %entry.entity, "no demo feed for this stream");
                continue;
            };
            tasks.push(tokio::spawn(demo_feed(runtime.clone(), generator)));
        }
        tracing::info!(streams = tasks.len() - 1, rate = DEMO_RATE, "demo feeds running");
    }
    tasks
}

/// Feeds generated records into one stream, `DEMO_RATE` a second, through the same checks
/// as the ingest endpoint.
async fn demo_feed(runtime: Arc<Runtime>, mut generator: sluice_feed::Generator) {
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / DEMO_RATE));
    let (chain, entity) = (generator.chain().to_owned(), generator.entity().to_owned());
    loop {
        tick.tick().await;
        let record = generator.next_record(chrono::Utc::now());
        let record = match sluice_core::streams::StreamRecord::from_object(&entity, &record) {
            Ok(record) => record,
            Err(error) => {
                tracing::error!(%error, %chain, %entity, "demo record is invalid; feed stops");
                return;
            }
        };
        let records = vec![record];
        if let Err(error) = runtime.ingest(&chain, &entity, false, records).await {
            tracing::warn!(%error, %chain, %entity, "demo feed append failed");
        }
    }
}

/// This node's share of the trade streams' partitions: its place among the live nodes by
/// name (all of them on a node of its own, or while it does not see itself live).
fn price_share(runtime: &Arc<Runtime>) -> sluice_prices::Share {
    let runtime = Arc::downgrade(runtime);
    Arc::new(move || {
        let Some(nodes) = runtime.upgrade().and_then(|runtime| runtime.nodes()) else {
            return (0, 1);
        };
        let mut names: Vec<(String, bool)> =
            nodes.into_iter().map(|node| (node.name, node.is_self)).collect();
        names.sort();
        names.iter().position(|(_, me)| *me).map_or((0, 1), |index| (index, names.len()))
    })
}

/// The price service over `store`, then its trade consumer and its retention job, for as
/// long as the server runs. The API serves while the service loads (its recent candles and
/// latest minutes: seconds for a large history) and the price endpoints answer 503 until
/// `slot` holds it; a service that fails to start leaves the reason there.
async fn run_prices(
    store: Arc<dyn sluice_store::PriceStore>,
    log: Arc<dyn sluice_bus::StreamLog>,
    topics: Vec<(String, sluice_prices::TradeSource)>,
    clock: Arc<dyn Clock>,
    slot: sluice_api::PriceSlot,
    share: sluice_prices::Share,
) {
    let started = std::time::Instant::now();
    let loaded = sluice_prices::PriceService::start(store, clock, Default::default())
        .await
        .context("starting the price service");
    let prices = match loaded {
        Ok(prices) => prices,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "token prices are unavailable");
            let _ = slot.set(Err(format!("{error:#}")));
            return;
        }
    };
    tracing::info!(seconds = started.elapsed().as_secs_f64(), "token prices loaded");
    let _ = slot.set(Ok(prices.clone()));
    let retention = async {
        let mut tick = tokio::time::interval(RETENTION_INTERVAL);
        loop {
            tick.tick().await;
            match prices.enforce_retention().await {
                Ok(0) => {}
                Ok(removed) => tracing::info!(removed, "removed price rows past retention"),
                Err(error) => tracing::warn!(%error, "price retention run failed"),
            }
        }
    };
    let consumer = sluice_prices::consume(
        prices.clone(),
        log,
        topics,
        sluice_prices::ConsumerSettings::default(),
        share,
    );
    tokio::join!(consumer, retention);
}

/// Opens the store the settings name, creating the data directory for the SQLite default.
///
/// # Errors
/// When the directory or the database cannot be opened.
pub async fn open_store(settings: &Settings) -> anyhow::Result<Arc<dyn MetadataStore>> {
    if settings.database_url.starts_with("sqlite:") {
        settings.prepare_data_dir()?;
    }
    let store =
        sluice_store::open_with_sets(&settings.database_url, settings.sets_url.as_deref()).await;
    match &settings.sets_url {
        None => store
            .with_context(|| format!("opening the store at {}", redact(&settings.database_url))),
        Some(sets) => store.with_context(|| {
            format!(
                "opening the store at {} with set-filter values in {}",
                redact(&settings.database_url),
                redact(sets)
            )
        }),
    }
}

/// On first start with an empty store: create the operator and print its key, once. Any
/// later start says how to make another key, for whoever lost that one (or whose first
/// start printed it and then failed).
async fn bootstrap(
    store: &dyn MetadataStore,
    settings: &Settings,
    patience: Patience,
) -> anyhow::Result<()> {
    // Only the read is tried again: once the operator exists, a start that makes its key
    // again would find it made and never print the key.
    let has_users = patience
        .run(|| async { store.has_users().await.context("reading the store's users") })
        .await?;
    if has_users {
        tracing::info!(
            "the operator's API key was printed at this store's first start; to make another: \
             sluice admin create-key --org {BOOTSTRAP_ORG} --team {BOOTSTRAP_TEAM} \
             --user {BOOTSTRAP_USER} --operator {}",
            settings.store_args()
        );
        return Ok(());
    }
    let identity =
        store.ensure_identity(BOOTSTRAP_ORG, BOOTSTRAP_TEAM, BOOTSTRAP_USER, true).await?;
    let given = std::env::var("SLUICE_BOOTSTRAP_API_KEY").ok().filter(|key| !key.is_empty());
    let from_env = given.is_some();
    let key = sluice_api::auth::issue_key(store, &identity.user.id, given)
        .await?
        .map_err(|reason| anyhow::anyhow!("SLUICE_BOOTSTRAP_API_KEY: {reason}"))?;
    if from_env {
        tracing::info!(
            org = BOOTSTRAP_ORG,
            user = BOOTSTRAP_USER,
            "created the operator with the key from SLUICE_BOOTSTRAP_API_KEY"
        );
    } else {
        println!(
            "\nCreated operator {BOOTSTRAP_USER} (org {BOOTSTRAP_ORG}, team {BOOTSTRAP_TEAM}). \
             Its API key is shown only this once:\n\n    {key}\n\n\
             Use it as the X-API-Key header. More keys: sluice admin create-key --help\n"
        );
    }
    Ok(())
}

/// Hides a password in a database URL before it is logged.
pub fn redact(url: &str) -> String {
    sluice_core::redaction::redact_password(url)
}

async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}

#[cfg(test)]
mod tests {
    use super::{DEMO_RATE, demo_generator, redact};

    #[test]
    fn the_demo_passes_the_walkthroughs_usdc_filter_about_once_a_second() {
        // The walkthrough filters Base transfers on USDC: a minute of the demo's records of
        // that stream must hold about one USDC transfer per second (six well-known tokens).
        let usdc = "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913";
        let mut generator = demo_generator("base", "erc20_token_transfer", 2).unwrap();
        let start = chrono::Utc::now();
        let mut usdc_records = 0;
        for i in 0..DEMO_RATE * 60 {
            let now = start + chrono::Duration::milliseconds((i * 1000 / DEMO_RATE) as i64);
            let record = generator.next_record(now);
            if record["token_address"] == usdc {
                usdc_records += 1;
            }
        }
        assert!(usdc_records >= 45, "{usdc_records} USDC transfers in a minute of the demo");
    }

    #[test]
    fn passwords_are_redacted_from_database_urls() {
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://./sluice-data/sluice.db"), "sqlite://./sluice-data/sluice.db");
    }
}
