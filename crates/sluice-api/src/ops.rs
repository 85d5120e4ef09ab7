//! Operational endpoints: liveness, readiness, the OpenAPI document and the docs page.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use serde::Serialize;
use utoipa::ToSchema;

use crate::AppState;
use crate::error::{ApiError, ErrorBody};

/// `{"status": "ok"}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusBody {
    pub status: &'static str,
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Alive", body = StatusBody)))]
pub async fn healthz() -> Json<StatusBody> {
    Json(StatusBody { status: "ok" })
}

/// Readiness: the metadata store answers.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = StatusBody),
        (status = 503, description = "The store does not answer", body = ErrorBody),
    ))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<StatusBody>, ApiError> {
    match state.store.ping().await {
        Ok(()) => Ok(Json(StatusBody { status: "ok" })),
        Err(error) => {
            tracing::warn!(%error, "readiness check failed");
            Err(ApiError::Unavailable("the metadata store is not reachable".to_owned()))
        }
    }
}

/// This document: OpenAPI 3.1, generated from the code.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json")))]
pub async fn openapi_json(State(state): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], state.openapi_json.clone())
}

/// Browsable API documentation, rendered from the OpenAPI document in the browser.
#[utoipa::path(get, path = "/docs", tag = "operations",
    responses((status = 200, description = "An HTML page", content_type = "text/html")))]
pub async fn docs_page() -> Html<&'static str> {
    Html(include_str!("docs.html"))
}
