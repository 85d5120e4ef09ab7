//! Pipeline configuration endpoints: create, list, read, update, delete.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use sluice_core::permission::Permission;
use sluice_core::pipeline::validate::{BodyMode, validate_pipeline_body};
use sluice_core::pipeline::{Pipeline, PipelineSpec};
use sluice_core::validation::Loc;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{PathParams, Query};
use crate::scripts::check_transform_list;
use crate::services::{self, Redeploy};
use crate::state::AppState;

/// `{"message": "..."}`: the answer to an action.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessageBody {
    pub message: String,
}

/// Where a create or update body keeps its transforms.
fn transforms_loc() -> Loc {
    Loc::body().at("pipeline_config").at("transforms")
}

/// Create a pipeline configuration.
///
/// The caller becomes its owner and the caller's team its `viewer_team`. Transform and sink
/// uids are generated when omitted; `source.type` comes from the catalog. The older inline
/// `set_values` on a `redis_set_filter` becomes that transform's initial filter values. The
/// script of a `v8` transform is compiled: a syntax error or a missing `transform` function
/// is a 422 on that transform's `script`, with the engine's message and line.
#[utoipa::path(
    post, path = "/api/v1/beam", tag = "pipelines",
    request_body = PipelineSpec,
    responses(
        (status = 200, description = "The stored pipeline", body = Pipeline),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service or custom_transforms not enabled", body = ErrorBody),
        (status = 413, description = "Body over the size limit", body = ErrorBody),
        (status = 422, description = "Rule violations", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create_pipeline(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    body: JsonBody,
) -> Result<Json<Pipeline>, ApiError> {
    caller.require_pipelines()?;
    query.expect_none()?;
    let body = body.object()?;
    let valid = validate_pipeline_body(&body, &state.catalog, BodyMode::Create)?;
    caller.require_custom_transforms_for(&valid.spec.pipeline_config)?;
    check_transform_list(&valid.spec.pipeline_config.transforms, &transforms_loc()).await?;
    crate::secrets::check_sinks(&state, &caller.0.org_id, &valid.spec).await?;
    let Caller(principal) = caller;
    let pipeline = Pipeline::new(
        sluice_core::ids::new_id(),
        valid.spec,
        principal.user_id,
        principal.org_id,
        state.clock.now(),
    );
    let pipeline =
        services::create_pipeline(&state, pipeline, principal.team_id, valid.initial_filter_values)
            .await?;
    Ok(Json(pipeline))
}

/// List every pipeline the caller can read: owned, shared as editor or reader, or shared
/// with the caller's team. Oldest first.
#[utoipa::path(
    get, path = "/api/v1/beam", tag = "pipelines",
    responses(
        (status = 200, description = "Readable pipelines", body = Vec<Pipeline>),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_pipelines(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
) -> Result<Json<Vec<Pipeline>>, ApiError> {
    caller.require_pipelines()?;
    query.expect_none()?;
    Ok(Json(state.store.list_readable_pipelines(&caller.0).await?))
}

/// Read one pipeline (read permission). The `X-Sluice-Access` header says what the caller
/// may do to it: `read`, `edit` or `manage` (the console shows only the buttons that work).
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}", tag = "pipelines",
    params(("config_id" = String, Path, description = "Pipeline id")),
    responses(
        (status = 200, description = "The pipeline", body = Pipeline, headers(
            ("X-Sluice-Access" = String, description = "The caller's highest permission on it: `read`, `edit` or `manage`")
        )),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 404, description = "No such pipeline, or no read permission", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_pipeline(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<impl axum::response::IntoResponse, ApiError> {
    let config_id = path.get("config_id").to_owned();
    let (pipeline, access) = caller.pipeline(&state, &config_id, Permission::Read).await?;
    query.expect_none()?;
    let held = match access.highest() {
        Some(Permission::Manage) => "manage",
        Some(Permission::Edit) => "edit",
        _ => "read",
    };
    Ok(([(ACCESS_HEADER, axum::http::HeaderValue::from_static(held))], Json(pipeline)))
}

/// The response header of `GET /beam/{config_id}` naming the caller's permission.
pub const ACCESS_HEADER: axum::http::HeaderName =
    axum::http::HeaderName::from_static("x-sluice-access");

/// Replace a pipeline's editable fields (edit permission). Server-managed fields keep their
/// values and are ignored if sent. Filter values of transforms that are no longer set filters
/// are deleted. `v8` scripts are compiled as on create. Deploy again to apply the change to a
/// running pipeline.
#[utoipa::path(
    put, path = "/api/v1/beam/{config_id}", tag = "pipelines",
    params(("config_id" = String, Path, description = "Pipeline id")),
    request_body = PipelineSpec,
    responses(
        (status = 200, description = "The updated pipeline", body = Pipeline),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not edit permission, or feature not enabled", body = ErrorBody),
        (status = 404, description = "No such pipeline, or no read permission", body = ErrorBody),
        (status = 413, description = "Body over the size limit", body = ErrorBody),
        (status = 422, description = "Rule violations", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn update_pipeline(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: JsonBody,
) -> Result<Json<Pipeline>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    // A concurrent transform change must not be undone by this read-change-write.
    let (lifecycle, previous) =
        caller.pipeline_in_turn(&state, &config_id, Permission::Edit, query).await?;
    let body = body.object()?;
    let valid = validate_pipeline_body(&body, &state.catalog, BodyMode::Update)?;
    caller.require_custom_transforms_for(&valid.spec.pipeline_config)?;
    check_transform_list(&valid.spec.pipeline_config.transforms, &transforms_loc()).await?;
    crate::secrets::check_sinks(&state, &previous.organization_id, &valid.spec).await?;
    let mut updated = previous.clone();
    updated.apply(valid.spec, state.clock.now());
    let updated =
        services::update_pipeline(&state, lifecycle, &previous, updated, Redeploy::No).await?;
    Ok(Json(updated))
}

/// Delete a pipeline with its filter values and sharing (manage permission).
#[utoipa::path(
    delete, path = "/api/v1/beam/{config_id}", tag = "pipelines",
    params(("config_id" = String, Path, description = "Pipeline id")),
    responses(
        (status = 200, description = "Deleted", body = MessageBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not manage permission", body = ErrorBody),
        (status = 404, description = "No such pipeline, or no read permission", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_pipeline(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<MessageBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    let (lifecycle, pipeline) =
        caller.pipeline_in_turn(&state, &config_id, Permission::Manage, query).await?;
    // Deleting tears any deployment down first (workers, topics, offsets): docs/contract.md
    // §Pipeline deployment states.
    services::delete_pipeline(&state, lifecycle, pipeline).await?;
    Ok(Json(MessageBody { message: format!("Pipeline {config_id} successfully deleted") }))
}
