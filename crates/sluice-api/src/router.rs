//! Every documented route, and the OpenAPI document built from them: registering a route
//! through `utoipa_axum::routes!` here puts it in the document, so the document cannot miss
//! a route. [`crate::app`] serves these routes.

use axum::extract::DefaultBodyLimit;
use sluice_core::catalog::Catalog;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::state::{AppState, Limits};
use crate::{
    account, backfills, chains, datasets, deployments, events, filter_values, nodes, openapi_rules,
    ops, pipelines, prices, secrets, set_history, sharing, sources, stats, streams, transforms,
};

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

#[allow(
    clippy::cognitive_complexity,
    reason = "one list of every route; each `routes!` expands into branches the lint counts"
)]
pub(crate) fn routes_with_doc(limits: &Limits) -> OpenApiRouter<AppState> {
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
        .routes(routes!(set_history::list_set_changes))
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
        .routes(routes!(deployments::records::sink_records))
        .routes(routes!(deployments::records::sink_records_stream))
        .routes(routes!(deployments::records::dead_letters))
        .routes(routes!(deployments::records::replay_dead_letters))
        .routes(routes!(deployments::records::pipeline_logs))
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

/// The OpenAPI document of every route, with the chains and entities of `catalog`.
pub(crate) fn openapi_for(catalog: &Catalog) -> serde_json::Value {
    let openapi = routes_with_doc(&Limits::default()).split_for_parts().1;
    let mut doc = serde_json::to_value(&openapi).expect("the OpenAPI document serializes");
    openapi_rules::tighten(&mut doc, catalog);
    doc
}
