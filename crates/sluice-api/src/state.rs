//! What every handler shares: [`AppState`] (the store, the runtime, the services a process
//! runs) and the request [`Limits`]. Handlers take it as `State<AppState>`.

use std::sync::Arc;

use sluice_core::catalog::Catalog;
use sluice_core::clock::Clock;
use sluice_core::datasets::{DatasetListener, NoDatasetIndex};
use sluice_core::filter_values::{FilterValuesListener, NoInMemoryCopies};
use sluice_runtime::Runtime;
use sluice_store::MetadataStore;

use crate::{chains, error, params, router};

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

/// Where a process's price service arrives once loaded: the service, or why it failed to
/// start (a large price history takes seconds to load, and the API serves meanwhile).
pub type PriceSlot = Arc<std::sync::OnceLock<Result<Arc<sluice_prices::PriceService>, String>>>;

/// What every handler shares.
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
    /// Keys that authenticated lately, accepted while the database cannot be reached.
    pub(crate) recent_keys: Arc<crate::auth::RecentKeys>,
    pub(crate) openapi_json: axum::body::Bytes,
    /// The query parameters each route declares in the document: any other is a 422.
    pub(crate) query_names: Arc<params::QueryNames>,
}

impl AppState {
    pub fn new(
        store: Arc<dyn MetadataStore>,
        catalog: Catalog,
        clock: Arc<dyn Clock>,
        limits: Limits,
    ) -> Self {
        let openapi = router::openapi_for(&catalog);
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
            recent_keys: Arc::default(),
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
    /// `ApiError::Unavailable`.
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
    /// `ApiError::Unavailable` in a process that runs no pipelines; a store failure.
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
    /// `ApiError::Unavailable` in a process that runs no pipelines.
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
