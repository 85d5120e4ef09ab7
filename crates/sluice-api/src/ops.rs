//! Operational endpoints: liveness, readiness, the OpenAPI document and the docs page.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::params::Query;
use crate::state::AppState;

/// `{"status": "ok"}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusBody {
    pub status: &'static str,
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Alive", body = StatusBody)))]
pub async fn healthz(query: Query) -> Result<Json<StatusBody>, ApiError> {
    query.expect_none()?;
    Ok(Json(StatusBody { status: "ok" }))
}

/// Readiness: the metadata store (and the set store, when apart) and the stream log answer.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = StatusBody),
        (status = 503, description = "The store or the stream log does not answer, or this cluster node is cut off", body = ErrorBody),
    ))]
pub async fn readyz(
    State(state): State<AppState>,
    query: Query,
) -> Result<Json<StatusBody>, ApiError> {
    query.expect_none()?;
    if let Err(error) = state.store.ping().await {
        tracing::warn!(%error, "readiness check failed");
        let what = match error {
            sluice_store::StoreError::Redis(_) => "the set store (Redis)",
            _ => "the metadata store",
        };
        return Err(ApiError::Unavailable(format!("{what} is not reachable")));
    }
    if let Some(runtime) = &state.runtime
        && let Err(error) = runtime.log().ready().await
    {
        tracing::warn!(%error, "readiness check failed");
        return Err(ApiError::Unavailable(
            "the stream log is not reachable; deployments hold until it is back".to_owned(),
        ));
    }
    if let Some(runtime) = &state.runtime
        && !runtime.in_cluster()
    {
        return Err(ApiError::Unavailable(
            "this node has not written its cluster heartbeat within the node timeout; the \
             other nodes run its workers"
                .to_owned(),
        ));
    }
    Ok(Json(StatusBody { status: "ok" }))
}

/// This document: OpenAPI 3.1, generated from the code.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json")))]
pub async fn openapi_json(
    State(state): State<AppState>,
    query: Query,
) -> Result<impl IntoResponse, ApiError> {
    query.expect_none()?;
    Ok(([(header::CONTENT_TYPE, "application/json")], state.openapi_json.clone()))
}

/// Browsable API documentation, rendered from the OpenAPI document in the browser.
#[utoipa::path(get, path = "/docs", tag = "operations",
    responses((status = 200, description = "An HTML page", content_type = "text/html")))]
pub async fn docs_page(query: Query) -> Result<Html<&'static str>, ApiError> {
    query.expect_none()?;
    Ok(Html(include_str!("docs.html")))
}
