//! `sluice-api` owns Sluice's HTTP interface: the axum router, authentication by API key,
//! the handlers, the error shapes and the OpenAPI document generated from the handlers.
//!
//! Start at [`app`], which assembles every route; each handler module documents its
//! endpoints with `#[utoipa::path]`, and registering a route through `utoipa_axum::routes!`
//! puts it in the OpenAPI document, so the document cannot miss a route. Handlers parse with
//! the one path, query and body extractor of each kind ([`params`], [`body`]), call one
//! function of [`services`] for a change (it commits, tells the in-memory copies and
//! redeploys), and render. Errors go through [`error::ApiError`]. This crate may depend on
//! every other Sluice crate.

pub mod account;
pub mod auth;
pub mod backfills;
pub mod body;
pub mod chains;
pub mod console;
pub mod datasets;
pub mod deployments;
pub mod error;
pub mod events;
pub mod filter_values;
pub mod nodes;
pub mod openapi_rules;
pub mod ops;
pub mod params;
pub mod pipelines;
pub mod prices;
pub mod scripts;
pub mod secrets;
pub mod services;
pub mod sharing;
pub mod sources;
pub mod stats;
pub mod streams;
pub mod transforms;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use sluice_core::catalog::Catalog;
use sluice_core::clock::Clock;
use sluice_core::datasets::{DatasetListener, NoDatasetIndex};
use sluice_core::filter_values::{FilterValuesListener, NoInMemoryCopies};
use sluice_runtime::Runtime;
use sluice_store::MetadataStore;
use tower_http::normalize_path::NormalizePath;
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Request limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request body accepted; larger bodies get 413.
    pub max_body_bytes: usize,
    /// Largest body of a filter-values change (`POST`/`PUT`/`DELETE …/filter-values`), which
    /// may carry a million values; it replaces `max_body_bytes` on those routes only.
    pub max_filter_values_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_body_bytes: 16 * 1024 * 1024, max_filter_values_body_bytes: 128 * 1024 * 1024 }
    }
}

/// What every handler shares.
/// Where a process's price service arrives once loaded: the service, or why it failed to
/// start (a large price history takes seconds to load, and the API serves meanwhile).
pub type PriceSlot = Arc<std::sync::OnceLock<Result<Arc<sluice_prices::PriceService>, String>>>;

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn MetadataStore>,
    pub catalog: Arc<Catalog>,
    pub clock: Arc<dyn Clock>,
    pub limits: Limits,
    /// Told of every committed filter-value change, so in-memory set indexes follow at once.
    pub filter_listener: Arc<dyn FilterValuesListener>,
    /// Told of every committed dataset change, so the dataset index behind `beam.contains`
    /// follows at once.
    pub dataset_listener: Arc<dyn DatasetListener>,
    /// The pipelines running in this process; `None` in a process that runs none (then the
    /// deployment and ingest endpoints answer 503).
    pub runtime: Option<Arc<Runtime>>,
    /// Token prices; `None` in a process that serves none. The price endpoints answer 503
    /// while the slot is empty (the service is still loading) or holds the reason it failed.
    pub prices: Option<PriceSlot>,
    /// The bearer token that reads every pipeline's `/metrics` without an API key (for
    /// Prometheus); `None`: `/metrics` needs a key like every other endpoint.
    pub metrics_token: Option<Arc<str>>,
    /// The chain ingesters' status; `None` in a process that runs none.
    pub chains: Option<Arc<dyn chains::ChainStatusSource>>,
    /// Organization secrets; `None` in a process that keeps none (the secret endpoints
    /// answer 503, and no sink can name a secret).
    pub secrets: Option<sluice_store::Secrets>,
    /// The outbound address `static_egress_ip` pipelines send from, if the operator set one.
    pub egress: Option<std::net::IpAddr>,
    /// Backfill jobs and the warehouse; `None` in a process that runs none (503).
    pub backfills: Option<Arc<sluice_backfill::jobs::Backfills>>,
    /// This node's name, for `GET /api/v1/nodes` on a node of its own (a cluster node's
    /// runtime knows its name).
    pub node_name: Arc<str>,
    /// Where service events go and are read from (the runtime's recorder); `None`: the
    /// event endpoints answer 503.
    pub events: Option<Arc<sluice_runtime::events::Recorder>>,
    openapi_json: axum::body::Bytes,
    /// The query parameters each route declares in the document: any other is a 422.
    query_names: Arc<params::QueryNames>,
}

impl AppState {
    pub fn new(
        store: Arc<dyn MetadataStore>,
        catalog: Catalog,
        clock: Arc<dyn Clock>,
        limits: Limits,
    ) -> Self {
        let openapi = openapi_for(&catalog);
        let openapi_json =
            serde_json::to_vec_pretty(&openapi).expect("the OpenAPI document serializes");
        let query_names = Arc::new(params::QueryNames::from_openapi(&openapi));
        Self {
            store,
            catalog: Arc::new(catalog),
            clock,
            limits,
            filter_listener: Arc::new(NoInMemoryCopies),
            dataset_listener: Arc::new(NoDatasetIndex),
            runtime: None,
            prices: None,
            metrics_token: None,
            chains: None,
            node_name: Arc::from("local"),
            events: None,
            secrets: None,
            egress: None,
            backfills: None,
            openapi_json: openapi_json.into(),
            query_names,
        }
    }

    /// Names this node in `GET /api/v1/nodes`.
    #[must_use]
    pub fn with_node_name(mut self, name: &str) -> Self {
        self.node_name = Arc::from(name);
        self
    }

    /// Runs pipelines on `runtime`, whose set indexes then hear every filter-value change.
    #[must_use]
    pub fn with_runtime(mut self, runtime: Arc<Runtime>) -> Self {
        self.filter_listener = runtime.set_indexes();
        self.events = runtime.events();
        self.runtime = Some(runtime);
        self
    }

    /// Keeps organization secrets in `secrets`; `egress` is the outbound address of
    /// `static_egress_ip` pipelines (give the runtime the same).
    #[must_use]
    pub fn with_sinks(
        mut self,
        secrets: sluice_store::Secrets,
        egress: Option<std::net::IpAddr>,
    ) -> Self {
        self.secrets = Some(secrets);
        self.egress = egress;
        self
    }

    /// Runs backfill jobs with `backfills`.
    #[must_use]
    pub fn with_backfills(mut self, backfills: Arc<sluice_backfill::jobs::Backfills>) -> Self {
        self.backfills = Some(backfills);
        self
    }

    /// Shows the chain ingesters' status at `GET /api/v1/chains` and in `/metrics`.
    #[must_use]
    pub fn with_chains(mut self, chains: Arc<dyn chains::ChainStatusSource>) -> Self {
        self.chains = Some(chains);
        self
    }

    /// The runtime, or 503 in a process that runs no pipelines.
    ///
    /// # Errors
    /// [`ApiError::Unavailable`].
    pub fn runtime(&self) -> Result<&Arc<Runtime>, error::ApiError> {
        self.runtime.as_ref().ok_or_else(|| {
            error::ApiError::Unavailable("this process runs no pipelines".to_owned())
        })
    }

    /// Waits for the turn of a change of pipeline `pipeline_id` (its lifecycle owner in the
    /// runtime, which on a cluster also keeps the other nodes' changes out): take it before
    /// reading what the change depends on, and hold it until the change is done.
    ///
    /// # Errors
    /// [`ApiError::Unavailable`] in a process that runs no pipelines; a store failure.
    pub async fn lifecycle(
        &self,
        pipeline_id: &str,
    ) -> Result<sluice_runtime::LifecycleGuard, error::ApiError> {
        Ok(self.runtime()?.lifecycle(pipeline_id).await?)
    }

    /// The turn of a filter-value change of pipeline `pipeline_id` in this process (the
    /// store orders the changes of every node itself).
    ///
    /// # Errors
    /// [`ApiError::Unavailable`] in a process that runs no pipelines.
    pub async fn lifecycle_here(
        &self,
        pipeline_id: &str,
    ) -> Result<sluice_runtime::LifecycleGuard, error::ApiError> {
        Ok(self.runtime()?.lifecycle_here(pipeline_id).await)
    }

    /// Sends dataset changes to `listener` (the dataset index behind `beam.contains`).
    #[must_use]
    pub fn with_dataset_listener(mut self, listener: Arc<dyn DatasetListener>) -> Self {
        self.dataset_listener = listener;
        self
    }

    /// Serves token prices from `prices`.
    #[must_use]
    pub fn with_prices(self, prices: Arc<sluice_prices::PriceService>) -> Self {
        let slot = PriceSlot::default();
        let _ = slot.set(Ok(prices));
        self.with_price_slot(slot)
    }

    /// Serves token prices from the service put into `slot` once it has loaded; until then
    /// the price endpoints answer 503.
    #[must_use]
    pub fn with_price_slot(mut self, slot: PriceSlot) -> Self {
        self.prices = Some(slot);
        self
    }

    /// Lets `Authorization: Bearer <token>` read every pipeline's `/metrics`.
    #[must_use]
    pub fn with_metrics_token(mut self, token: impl Into<Arc<str>>) -> Self {
        self.metrics_token = Some(token.into());
        self
    }

    /// Sends filter-value changes to `listener` (the runtime's set indexes).
    #[must_use]
    pub fn with_filter_listener(mut self, listener: Arc<dyn FilterValuesListener>) -> Self {
        self.filter_listener = listener;
        self
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sluice API",
        version = "1.0.0",
        description = "Self-hostable streaming pipelines for blockchain data. Every endpoint but \
            `/healthz`, `/readyz`, `/api/v1/openapi.json` and `/docs` needs an API key in the \
            `X-API-Key` header (`/metrics` also takes the server's metrics token as a bearer \
            token). Validation failures \
            are 422 with a `detail` array of `{loc, msg, type}`; every other error is \
            `{\"detail\": \"...\"}`. A trailing slash on any path is accepted."
    ),
    modifiers(&ApiKeyScheme),
    tags(
        (name = "pipelines", description = "Pipeline configurations and the source catalog"),
        (name = "sharing", description = "Who may read, edit or manage a pipeline"),
        (name = "deployments", description = "Deploy, pause, tear down, and read managed sinks"),
        (name = "streams", description = "Chain-stream ingest for operators' indexers"),
        (name = "filter-values", description = "Values of set-filter transforms"),
        (name = "datasets", description = "Named value lists of a user, for `beam.contains` in scripts"),
        (name = "backfills", description = "Backfill jobs: a window of a warehouse table delivered to sinks"),
        (name = "secrets", description = "Organization secrets that sinks name"),
        (name = "prices", description = "Token prices: latest price and OHLC, price history"),
        (name = "events", description = "Service events: list, live stream, notifications, thresholds"),
        (name = "operations", description = "Health, readiness and this documentation"),
    )
)]
struct ApiDoc;

struct ApiKeyScheme;

impl Modify for ApiKeyScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
        // `GET /metrics` also accepts the server's metrics token (`--metrics-token`).
        components.add_security_scheme(
            "metrics_token",
            SecurityScheme::Http(utoipa::openapi::security::Http::new(
                utoipa::openapi::security::HttpAuthScheme::Bearer,
            )),
        );
    }
}

fn routes_with_doc(limits: &Limits) -> OpenApiRouter<AppState> {
    // Set by the route, this limit replaces the router-wide one (the inner layer writes last).
    let filter_values = OpenApiRouter::new()
        .routes(routes!(
            filter_values::list_filter_values,
            filter_values::add_filter_values,
            filter_values::replace_filter_values,
            filter_values::remove_filter_values
        ))
        .routes(routes!(filter_values::check_filter_value))
        .routes(routes!(filter_values::count_filter_values))
        .layer(DefaultBodyLimit::max(limits.max_filter_values_body_bytes));
    // Entry changes carry up to 250,000 values: the bulk-values limit, as for filter values.
    let dataset_entries = OpenApiRouter::new()
        .routes(routes!(
            datasets::list_entries,
            datasets::add_entries_by_id,
            datasets::delete_entries
        ))
        .routes(routes!(datasets::add_entries_by_name))
        .layer(DefaultBodyLimit::max(limits.max_filter_values_body_bytes));
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(pipelines::create_pipeline, pipelines::list_pipelines))
        .routes(routes!(sources::list_sources))
        .routes(routes!(
            pipelines::get_pipeline,
            pipelines::update_pipeline,
            pipelines::delete_pipeline
        ))
        .routes(routes!(transforms::replace_transforms))
        .routes(routes!(transforms::patch_transform))
        .routes(routes!(sharing::get_permissions, sharing::put_permissions))
        .merge(filter_values)
        .routes(routes!(datasets::create_dataset, datasets::list_datasets))
        .routes(routes!(datasets::delete_dataset))
        .routes(routes!(datasets::check_entry))
        .merge(dataset_entries)
        .routes(routes!(deployments::deploy))
        .routes(routes!(deployments::pause))
        .routes(routes!(deployments::teardown))
        .routes(routes!(deployments::sink_records))
        .routes(routes!(deployments::sink_records_stream))
        .routes(routes!(deployments::dead_letters))
        .routes(routes!(deployments::replay_dead_letters))
        .routes(routes!(deployments::pipeline_logs))
        .routes(routes!(streams::ingest))
        .routes(routes!(prices::latest_prices))
        .routes(routes!(prices::price_history))
        .routes(routes!(account::me))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::openapi_json))
        .routes(routes!(ops::docs_page))
        .routes(routes!(stats::deploy_stats))
        .routes(routes!(stats::deploy_metrics))
        .routes(routes!(stats::prometheus))
        .routes(routes!(chains::list_chains))
        .routes(routes!(nodes::list_nodes))
        .routes(routes!(secrets::list_secrets))
        .routes(routes!(backfills::create_backfill, backfills::list_backfills))
        .routes(routes!(backfills::list_tables))
        .routes(routes!(backfills::get_backfill))
        .routes(routes!(backfills::cancel_backfill))
        .routes(routes!(backfills::destination_records))
        .routes(routes!(backfills::import_rows))
        .routes(routes!(secrets::put_secret, secrets::delete_secret))
        .routes(routes!(events::list_events))
        .routes(routes!(events::stream_events))
        .routes(routes!(events::pipeline_status))
        .routes(routes!(events::get_notifications, events::put_notifications))
        .routes(routes!(events::get_pipeline_thresholds, events::put_pipeline_thresholds))
        .routes(routes!(events::get_chain_thresholds, events::put_chain_thresholds))
}

/// The OpenAPI document of every route, for the default catalog.
pub fn openapi() -> serde_json::Value {
    openapi_for(&Catalog::default())
}

/// The OpenAPI document of every route, with the chains and entities of `catalog`.
fn openapi_for(catalog: &Catalog) -> serde_json::Value {
    let openapi = routes_with_doc(&Limits::default()).split_for_parts().1;
    let mut doc = serde_json::to_value(&openapi).expect("the OpenAPI document serializes");
    openapi_rules::tighten(&mut doc, catalog);
    doc
}

/// The operator-only metrics listener (`--metrics-listen`): `GET /metrics` of every
/// pipeline without a key or token, and nothing else (404).
pub fn metrics_app(state: AppState) -> Router {
    async fn all(
        axum::extract::State(state): axum::extract::State<AppState>,
    ) -> impl axum::response::IntoResponse {
        let text = stats::exposition(&state, None).await;
        ([(axum::http::header::CONTENT_TYPE, stats::PROMETHEUS_CONTENT_TYPE)], text)
    }
    Router::new()
        .route("/metrics", axum::routing::get(all))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// The complete HTTP service: every route, the body limit, request tracing, and trailing
/// slashes trimmed before routing (clients of the hosted service call `/api/v1/beam/`).
pub fn app(state: AppState) -> NormalizePath<Router> {
    let limit = state.limits.max_body_bytes;
    let (router, _) = routes_with_doc(&state.limits).split_for_parts();
    let router = router
        .merge(console::router())
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::map_response(error::json_for_bare_errors))
        .layer(TraceLayer::new_for_http())
        .with_state(state);
    NormalizePath::trim_trailing_slash(router)
}
