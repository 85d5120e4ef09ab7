//! The source catalog listing.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use sluice_core::catalog::CatalogEntry;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::params::Query;
use crate::state::AppState;

/// `{"sources": [...]}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SourcesBody {
    pub sources: Vec<CatalogEntry>,
}

/// The catalog of chain streams a pipeline can read. Needs an organization with the pipeline
/// service enabled.
#[utoipa::path(
    get, path = "/api/v1/beam/sources", tag = "pipelines",
    responses(
        (status = 200, description = "The catalog", body = SourcesBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_sources(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
) -> Result<Json<SourcesBody>, ApiError> {
    caller.require_pipelines()?;
    query.expect_none()?;
    Ok(Json(SourcesBody { sources: state.catalog.entries().to_vec() }))
}
