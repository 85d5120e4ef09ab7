//! Sharing a pipeline: who besides the owner may read or edit it (manage permission).
//!
//! The hosted API leaves the mechanism open; ours (docs/contract.md §Authentication and
//! permissions) is `GET`/`PUT {base_url}/{config_id}/permissions`
//! with `{"editors": [user_id…], "readers": [user_id…], "viewer_teams": [team_id…]}`. PUT
//! replaces all three lists. Only users and teams of the pipeline's organization qualify.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use sluice_core::permission::{Grants, Permission, validate_grants_body};
use sluice_core::validation::{Loc, Violation};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{PathParams, Query};
use crate::state::AppState;

/// The owner and the grants of a pipeline.
#[derive(Debug, Serialize, ToSchema)]
pub struct PermissionsBody {
    /// The owner's user id (manage, edit and read).
    pub owner: String,
    #[serde(flatten)]
    pub grants: Grants,
}

/// Body of `PUT .../permissions`; each list defaults to empty.
#[derive(Debug, Serialize, ToSchema)]
pub struct PermissionsRequest {
    #[schema(required = false)]
    pub editors: Vec<String>,
    #[schema(required = false)]
    pub readers: Vec<String>,
    #[schema(required = false)]
    pub viewer_teams: Vec<String>,
}

/// Who a pipeline is shared with (manage permission).
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/permissions", tag = "sharing",
    params(("config_id" = String, Path, description = "Pipeline id")),
    responses(
        (status = 200, description = "Owner and grants", body = PermissionsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not manage permission", body = ErrorBody),
        (status = 404, description = "No such pipeline, or no read permission", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_permissions(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<PermissionsBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    let (pipeline, _) = caller.pipeline(&state, &config_id, Permission::Manage).await?;
    query.expect_none()?;
    let grants = state.store.pipeline_grants(&config_id).await?;
    Ok(Json(PermissionsBody { owner: pipeline.owner_org_team_user_id, grants }))
}

/// Replace who a pipeline is shared with (manage permission).
#[utoipa::path(
    put, path = "/api/v1/beam/{config_id}/permissions", tag = "sharing",
    params(("config_id" = String, Path, description = "Pipeline id")),
    request_body = PermissionsRequest,
    responses(
        (status = 200, description = "Owner and the new grants", body = PermissionsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not manage permission", body = ErrorBody),
        (status = 404, description = "No such pipeline, or no read permission", body = ErrorBody),
        (status = 422, description = "Unknown users or teams, or conflicting roles", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn put_permissions(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: JsonBody,
) -> Result<Json<PermissionsBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    let (pipeline, _) = caller.pipeline(&state, &config_id, Permission::Manage).await?;
    query.expect_none()?;
    let body = body.object()?;
    // A list may be left out (it is then empty), but not sent as null.
    let nulls: Vec<Violation> = ["editors", "readers", "viewer_teams"]
        .into_iter()
        .filter(|field| body.get(*field).is_some_and(serde_json::Value::is_null))
        .map(|field| {
            Violation::new(&Loc::body().at(field), "list_type", "Input should be a valid list")
        })
        .collect();
    if !nulls.is_empty() {
        return Err(ApiError::Validation(nulls));
    }
    let grants = validate_grants_body(&body, &pipeline.owner_org_team_user_id)?;
    let users: Vec<String> = grants.editors.iter().chain(&grants.readers).cloned().collect();
    let unknown = state
        .store
        .unknown_members(&pipeline.organization_id, &users, &grants.viewer_teams)
        .await?;
    let mut violations = Vec::new();
    for (field, ids, unknown_ids, what) in [
        ("editors", &grants.editors, &unknown.users, "user"),
        ("readers", &grants.readers, &unknown.users, "user"),
        ("viewer_teams", &grants.viewer_teams, &unknown.teams, "team"),
    ] {
        for (index, id) in ids.iter().enumerate().filter(|(_, id)| unknown_ids.contains(id)) {
            violations.push(Violation::value(
                &Loc::body().at(field).at(index),
                format!("{what} '{id}' is not a {what} of this organization"),
            ));
        }
    }
    if !violations.is_empty() {
        return Err(ApiError::Validation(violations));
    }
    state.store.replace_pipeline_grants(&config_id, &grants).await?;
    tracing::info!(%config_id, "pipeline sharing changed");
    Ok(Json(PermissionsBody { owner: pipeline.owner_org_team_user_id, grants }))
}
