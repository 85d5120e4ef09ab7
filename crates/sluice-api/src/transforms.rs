//! Transform endpoints: change one transform (`PATCH …/transforms/{transform_uid}`) or
//! replace the whole list (`PUT …/transforms`), then redeploy a deployed pipeline by itself.
//!
//! Both go through the same path: validate as a pipeline update does (same rules, same
//! script compile check), store the new configuration in one store transaction (which also
//! deletes the filter values of set filters that are gone), tell the set indexes, and, when
//! the pipeline is deployed, deploy the stored configuration again: the runtime swaps it in
//! at a batch boundary, so no record is skipped or processed twice by the change. A paused
//! pipeline is only stored; it runs the new list when it is next deployed.
//!
//! Each edit runs in the pipeline's turn ([`crate::state::AppState::lifecycle`]), so two concurrent
//! changes cannot both read the same configuration and the later write silently undo the
//! earlier one, and the runtime ends up running the last stored list.

use axum::Json;
use axum::extract::State;
use serde_json::Value;
use sluice_core::permission::Permission;
use sluice_core::pipeline::validate::{
    BodyMode, check_filter_path, validate_transform, validate_transform_list,
};
use sluice_core::pipeline::{Pipeline, Transform};
use sluice_core::validation::{Loc, Violation, Violations};

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{PathParams, Query};
use crate::scripts::{check_transform, check_transform_list};
use crate::services::{self, Redeploy};
use crate::state::AppState;
use sluice_runtime::LifecycleGuard;

/// Change one transform of a pipeline (edit permission) and redeploy it when it is deployed.
///
/// The body is one transform object (`type` plus its fields) that replaces the transform
/// with this uid in place: same position, same uid. `type` may change (a set filter that
/// becomes a script loses its filter values); when `type` is omitted the transform keeps its
/// current type. A `uid` in the body must equal the path's. A `v8` script is compiled first:
/// a syntax error or a missing `transform` function is a 422 on `["body", "script"]`. A set
/// filter that stays a set filter keeps its filter values.
#[utoipa::path(
    patch, path = "/api/v1/beam/{config_id}/transforms/{transform_uid}", tag = "pipelines",
    params(
        ("config_id" = String, Path, description = "Pipeline id"),
        ("transform_uid" = String, Path, description = "Uid of the transform to change"),
    ),
    request_body = Transform,
    responses(
        (status = 200, description = "The updated transform", body = Transform),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not edit permission, or custom_transforms not enabled", body = ErrorBody),
        (status = 404, description = "No such pipeline (or no read permission), or no such transform", body = ErrorBody),
        (status = 413, description = "Body over the size limit", body = ErrorBody),
        (status = 422, description = "Invalid transform", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn patch_transform(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: JsonBody,
) -> Result<Json<Transform>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    let transform_uid = path.get("transform_uid").to_owned();
    let (lifecycle, pipeline) =
        caller.pipeline_in_turn(&state, &config_id, Permission::Edit, query).await?;
    let mut body = body.object()?;
    let Some(index) =
        pipeline.pipeline_config.transforms.iter().position(|t| t.uid() == transform_uid)
    else {
        return Err(ApiError::NotFound(format!(
            "Transform {transform_uid} not found in pipeline {config_id}"
        )));
    };
    let mut errors = Violations::default();
    match body.get("uid") {
        Some(Value::String(uid)) if *uid != transform_uid => errors.push(Violation::value(
            &Loc::body().at("uid"),
            format!(
                "the uid of a transform cannot change: the body says '{uid}', the path '{transform_uid}'"
            ),
        )),
        _ => {}
    }
    if !body.contains_key("type") {
        let current = match &pipeline.pipeline_config.transforms[index] {
            Transform::SetFilter { .. } => "redis_set_filter",
            Transform::Script { .. } => "v8",
        };
        body.insert("type".to_owned(), Value::String(current.to_owned()));
    }
    let validated =
        validate_transform(&Value::Object(body), Loc::body(), BodyMode::Update, &mut errors);
    let transform =
        errors.finish(validated)?.map(|valid| with_uid(valid.transform, &transform_uid));
    // `validate_transform` records a violation whenever it answers `None`.
    let Some(transform) = transform else {
        return Err(ApiError::Internal("transform validation failed without a violation".into()));
    };
    let mut errors = Violations::default();
    check_filter_path(
        &transform,
        &pipeline.pipeline_config.source.entity,
        &Loc::body(),
        &mut errors,
    );
    errors.finish(())?;
    check_transform(&transform, &Loc::body()).await?;
    let mut transforms = pipeline.pipeline_config.transforms.clone();
    transforms[index] = transform.clone();
    store_and_redeploy(&state, lifecycle, &caller, pipeline, transforms).await?;
    tracing::info!(%config_id, transform_uid = ?transform_uid, "transform updated");
    Ok(Json(transform))
}

/// Replace a pipeline's transform list (edit permission) and redeploy it when it is deployed.
///
/// The body is the whole new list, in order: one call adds, removes, updates and reorders.
/// A transform whose `uid` is already in the pipeline keeps its identity (a set filter keeps
/// its filter values); one without `uid` is new and gets a generated uid; a `uid` the
/// pipeline does not have yet names a new transform, as on create. Transforms left out are
/// removed, with their filter values. The list must not be empty and its uids must be
/// unique. `v8` scripts are compiled first, as on create.
#[utoipa::path(
    put, path = "/api/v1/beam/{config_id}/transforms", tag = "pipelines",
    params(("config_id" = String, Path, description = "Pipeline id")),
    request_body = Vec<Transform>,
    responses(
        (status = 200, description = "The new transform list", body = Vec<Transform>),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not edit permission, or custom_transforms not enabled", body = ErrorBody),
        (status = 404, description = "No such pipeline, or no read permission", body = ErrorBody),
        (status = 413, description = "Body over the size limit", body = ErrorBody),
        (status = 422, description = "Empty list, duplicate uids or invalid transforms", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn replace_transforms(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: JsonBody,
) -> Result<Json<Vec<Transform>>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    let (lifecycle, pipeline) =
        caller.pipeline_in_turn(&state, &config_id, Permission::Edit, query).await?;
    let items = body.array()?;
    if items.is_empty() {
        return Err(ApiError::Validation(vec![Violation::new(
            &Loc::body(),
            "too_short",
            "List should have at least 1 item after validation, not 0",
        )]));
    }
    let mut errors = Violations::default();
    let validated = validate_transform_list(&items, &Loc::body(), BodyMode::Update, &mut errors);
    let transforms: Vec<Transform> = errors
        .finish(validated)?
        .ok_or_else(|| {
            ApiError::Internal("transform list validation failed without a violation".into())
        })?
        .into_iter()
        .map(|valid| valid.transform)
        .collect();
    let mut errors = Violations::default();
    for (index, transform) in transforms.iter().enumerate() {
        let entity = &pipeline.pipeline_config.source.entity;
        check_filter_path(transform, entity, &Loc::body().at(index), &mut errors);
    }
    errors.finish(())?;
    check_transform_list(&transforms, &Loc::body()).await?;
    store_and_redeploy(&state, lifecycle, &caller, pipeline, transforms.clone()).await?;
    tracing::info!(%config_id, transforms = transforms.len(), "transforms replaced");
    Ok(Json(transforms))
}

fn with_uid(transform: Transform, new_uid: &str) -> Transform {
    match transform {
        Transform::SetFilter { filter_expr, .. } => {
            Transform::SetFilter { uid: new_uid.to_owned(), filter_expr }
        }
        Transform::Script { script, .. } => Transform::Script { uid: new_uid.to_owned(), script },
    }
}

/// Stores `previous` with `transforms` in place of its own and redeploys it when it is
/// deployed ([`services::update_pipeline`]), once the caller may use them.
async fn store_and_redeploy(
    state: &AppState,
    lifecycle: LifecycleGuard,
    caller: &Caller,
    previous: Pipeline,
    transforms: Vec<Transform>,
) -> Result<Pipeline, ApiError> {
    let mut updated = previous.clone();
    updated.pipeline_config.transforms = transforms;
    updated.updated_at = state.clock.now();
    caller.require_custom_transforms_for(&updated.pipeline_config)?;
    services::update_pipeline(state, lifecycle, &previous, updated, Redeploy::IfDeployed).await
}
