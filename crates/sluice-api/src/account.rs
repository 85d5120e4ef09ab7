//! `GET /api/v1/me`: who the caller's key belongs to. Sharing a pipeline needs user and team
//! ids, and this is how a user learns theirs to hand to a colleague.

use axum::Json;
use serde::Serialize;
use sluice_core::identity::OrgFlags;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::params::Query;

/// The features of the caller's organization.
#[derive(Debug, Serialize, ToSchema)]
pub struct Features {
    pub pipelines: bool,
    pub custom_transforms: bool,
}

/// The caller's identity.
#[derive(Debug, Serialize, ToSchema)]
pub struct MeBody {
    /// The id pipelines show as `owner_org_team_user_id`, and sharing lists as editor/reader.
    pub user_id: String,
    /// The id sharing lists under `viewer_teams`.
    pub team_id: String,
    pub organization_id: String,
    pub is_operator: bool,
    /// Manages the organization's secrets (`{base_url}/secrets`).
    pub is_org_admin: bool,
    pub features: Features,
}

/// The identity behind the API key.
#[utoipa::path(
    get, path = "/api/v1/me", tag = "sharing",
    responses(
        (status = 200, description = "The caller", body = MeBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn me(Caller(principal): Caller, query: Query) -> Result<Json<MeBody>, ApiError> {
    query.expect_none()?;
    let OrgFlags { pipelines, custom_transforms } = principal.flags;
    Ok(Json(MeBody {
        user_id: principal.user_id,
        team_id: principal.team_id,
        organization_id: principal.org_id,
        is_operator: principal.is_operator,
        is_org_admin: principal.is_org_admin,
        features: Features { pipelines, custom_transforms },
    }))
}
