//! `sluice-api` owns Sluice's HTTP interface: the axum router, authentication by API key,
//! the handlers, the error shapes and the OpenAPI document generated from the handlers.
//!
//! Start at [`app`], which serves every route of `router.rs`; each handler module documents
//! its endpoints with `#[utoipa::path]`, and registering a route through `utoipa_axum::routes!`
//! puts it in the OpenAPI document, so the document cannot miss a route. Handlers share
//! [`state::AppState`], parse with the one path, query and body extractor of each kind
//! ([`params`], [`body`]), call one function of [`services`] for a change (it commits, tells
//! the in-memory copies and redeploys), and render. Errors go through [`error::ApiError`]. This crate may depend on
//! every other Sluice crate.

pub mod account;
pub mod auth;
pub mod backfills;
pub mod body;
mod bulk_values;
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
mod router;
pub mod scripts;
pub mod secrets;
pub mod services;
pub mod set_history;
pub mod sharing;
pub mod sources;
pub mod state;
pub mod stats;
pub mod streams;
pub mod transforms;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use sluice_core::catalog::Catalog;
use tower_http::normalize_path::NormalizePath;
use tower_http::trace::TraceLayer;

pub use crate::state::{AppState, Limits, PriceSlot};

/// The OpenAPI document of every route, for the default catalog.
pub fn openapi() -> serde_json::Value {
    router::openapi_for(&Catalog::default())
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
    let (router, _) = router::routes_with_doc(&state.limits).split_for_parts();
    let router = router
        .merge(console::router())
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::map_response(error::json_for_bare_errors))
        .layer(TraceLayer::new_for_http())
        .with_state(state);
    NormalizePath::trim_trailing_slash(router)
}
