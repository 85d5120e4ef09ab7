//! Organization secrets (docs/sinks.md §Organization secrets) under `{base_url}/secrets`: the
//! credentials external sinks name (`hash_key`, `*_secret` fields). Any member of the organization lists the
//! names; only org admins and operators write. A value is never answered, logged or put in
//! an error message; it is sealed at rest ([`sluice_store::secrets`]).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use sluice_core::pipeline::sink::check_secret_name;
use sluice_core::secret::SecretValue;
use sluice_core::validation::{Fields, Loc, Violation, Violations};
use sluice_store::Secrets;
use sluice_store::secrets::SecretInfo;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{PathParams, Query};
use crate::state::AppState;

/// Longest secret value, in characters.
pub const MAX_SECRET_CHARS: usize = 64 * 1024;

/// A secret as listed: never its value.
#[derive(Debug, Serialize, ToSchema)]
pub struct SecretBody {
    pub name: String,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl From<SecretInfo> for SecretBody {
    fn from(info: SecretInfo) -> Self {
        Self { name: info.name, created_at: info.created_at, updated_at: info.updated_at }
    }
}

/// Body of `PUT {base_url}/secrets/{name}`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct PutSecretRequest {
    /// The value: 1 to 65,536 characters. Never shown again.
    pub value: String,
}

fn secrets(state: &AppState) -> Result<&Secrets, ApiError> {
    state
        .secrets
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("this process keeps no secrets".to_owned()))
}

impl Caller {
    /// 403 unless the caller manages the organization's secrets (an org admin or an
    /// operator).
    ///
    /// # Errors
    /// [`ApiError::Forbidden`].
    pub fn require_secrets_admin(&self) -> Result<(), ApiError> {
        if self.0.is_org_admin || self.0.is_operator {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "only organization admins and operators manage secrets".to_owned(),
            ))
        }
    }
}

fn checked_name(path: &PathParams) -> Result<String, ApiError> {
    let name = path.get("name");
    check_secret_name(name)
        .map_err(|msg| ApiError::Validation(vec![Violation::value(&Loc::path("name"), msg)]))?;
    Ok(name.to_owned())
}

/// Create or replace an organization secret (org admins and operators). Pipelines whose
/// sinks use it keep the old value until redeployed, and show the sink in `stale_sinks`.
#[utoipa::path(
    put, path = "/api/v1/beam/secrets/{name}",
    tag = "secrets",
    params(("name" = String, Path, description = "Secret name: 1 to 128 of letters, digits, '_', '-', '.'")),
    request_body = PutSecretRequest,
    responses(
        (status = 200, description = "Stored; the value is not echoed", body = SecretBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not an org admin or operator", body = ErrorBody),
        (status = 422, description = "A bad name or body", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn put_secret(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: JsonBody,
) -> Result<Json<SecretBody>, ApiError> {
    caller.require_pipelines()?;
    caller.require_secrets_admin()?;
    query.expect_none()?;
    let name = checked_name(&path)?;
    let body = body.object()?;
    let mut errors = Violations::default();
    let mut fields = Fields::new(&body, Loc::body());
    let value = fields.required_str("value", &mut errors);
    if let Some(value) = value {
        if value.is_empty() || value.chars().count() > MAX_SECRET_CHARS {
            errors.push(Violation::value(
                &Loc::body().at("value"),
                format!("a secret value is 1 to {MAX_SECRET_CHARS} characters"),
            ));
        }
    }
    fields.finish(&mut errors, |_| None);
    let value = errors.finish(value.map(str::to_owned)).map_err(ApiError::Validation)?;
    let value = SecretValue::new(value.unwrap_or_default());
    let info = secrets(&state)?.put(&caller.0.org_id, &name, &value).await?;
    tracing::info!(secret = %name, org_id = %caller.0.org_id, "secret stored");
    Ok(Json(info.into()))
}

/// The organization's secrets: names and times, never values (any member).
#[utoipa::path(
    get, path = "/api/v1/beam/secrets",
    tag = "secrets",
    responses(
        (status = 200, description = "The organization's secrets by name", body = [SecretBody]),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_secrets(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
) -> Result<Json<Vec<SecretBody>>, ApiError> {
    caller.require_pipelines()?;
    query.expect_none()?;
    let listed = secrets(&state)?.list(&caller.0.org_id).await?;
    Ok(Json(listed.into_iter().map(SecretBody::from).collect()))
}

/// Delete an organization secret (org admins and operators). Running pipelines keep the
/// value they started with; a deploy of a pipeline naming it fails until it exists again.
#[utoipa::path(
    delete, path = "/api/v1/beam/secrets/{name}",
    tag = "secrets",
    params(("name" = String, Path, description = "Secret name")),
    responses(
        (status = 204, description = "Deleted; no body"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not an org admin or operator", body = ErrorBody),
        (status = 404, description = "No such secret in the organization", body = ErrorBody),
        (status = 422, description = "A bad name", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_secret(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<StatusCode, ApiError> {
    caller.require_pipelines()?;
    caller.require_secrets_admin()?;
    query.expect_none()?;
    let name = checked_name(&path)?;
    if secrets(&state)?.delete(&caller.0.org_id, &name).await? {
        tracing::info!(secret = %name, org_id = %caller.0.org_id, "secret deleted");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound(format!("Secret {name} not found")))
    }
}

/// 422 entries for sinks that name a secret the organization does not have, or ask for
/// `static_egress_ip` where it cannot be had.
///
/// # Errors
/// A store failure.
pub async fn check_sinks(
    state: &AppState,
    org_id: &str,
    spec: &sluice_core::pipeline::PipelineSpec,
) -> Result<(), ApiError> {
    let sinks_loc = Loc::body().at("pipeline_config").at("sinks");
    check_sink_list(state, org_id, &spec.pipeline_config.sinks, spec.static_egress_ip, &sinks_loc)
        .await
}

/// [`check_sinks`] for any list of sinks at `sinks_loc` (a backfill's destinations too).
///
/// # Errors
/// A store failure.
pub async fn check_sink_list(
    state: &AppState,
    org_id: &str,
    sinks: &[sluice_core::pipeline::SinkConfig],
    static_egress_ip: bool,
    sinks_loc: &Loc,
) -> Result<(), ApiError> {
    let mut errors = Violations::default();
    for (index, sink) in sinks.iter().enumerate() {
        let loc = sinks_loc.at(index);
        for (field, name) in sink.secrets() {
            let exists = match &state.secrets {
                Some(secrets) => secrets.exists(org_id, name).await?,
                None => false,
            };
            if !exists {
                errors.push(Violation::value(
                    &loc.at(field),
                    format!("organization secret '{name}' does not exist; create it with PUT /api/v1/beam/secrets/{name}"),
                ));
            }
        }
        if static_egress_ip && sink.is_external() {
            if state.egress.is_none() {
                errors.push(Violation::value(
                    &Loc::body().at("static_egress_ip"),
                    sluice_runtime::sinks::NO_EGRESS,
                ));
            } else if !sink.can_bind_egress() {
                errors.push(Violation::value(
                    &Loc::body().at("static_egress_ip"),
                    format!(
                        "static_egress_ip applies to webhook and sns sinks; a '{}' sink cannot send from a fixed address",
                        sink.type_name()
                    ),
                ));
            }
        }
    }
    errors.finish(()).map_err(ApiError::Validation)
}
