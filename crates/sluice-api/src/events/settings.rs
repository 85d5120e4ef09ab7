//! Notification destinations (`GET`/`PUT /api/v1/notifications`) and event thresholds
//! (`GET`/`PUT /api/v1/beam/{config_id}/thresholds`, `…/api/v1/chains/{chain}/thresholds`).

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use serde_json::{Map, Value};
use sluice_core::events::NotificationDestination;
use sluice_core::permission::Permission;
use sluice_core::validation::{Loc, Violation};
use sluice_runtime::events::chains::{ChainThresholds, chain_subject};
use sluice_runtime::events::monitor::{PipelineThresholds, pipeline_subject};
use utoipa::ToSchema;

use super::recorder;
use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{PathParams, Query};
use crate::state::AppState;

/// Largest threshold accepted, in seconds (30 days, the events' retention).
pub const MAX_THRESHOLD_SECONDS: u64 = 30 * 24 * 3600;

/// How delivery to one destination goes.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryStatus {
    /// The last event the destination acknowledged.
    pub delivered_id: i64,
    /// Events delivered since the destination was set.
    pub delivered_count: i64,
    /// Failed attempts in a row (0 after a success).
    pub failures: i64,
    /// The latest error, null after a success.
    pub last_error: Option<String>,
    pub last_attempt_at: Option<String>,
    pub last_delivered_at: Option<String>,
}

/// One destination, as stored, with how its delivery goes.
#[derive(Debug, Serialize, ToSchema)]
pub struct DestinationBody {
    pub uid: String,
    /// The sink: `webhook`, `external_kafka`, `nats` or `sns`, with its fields.
    #[schema(value_type = Object)]
    pub sink: Value,
    /// Kinds it receives (every kind when empty).
    pub kinds: Vec<String>,
    #[schema(pattern = "^(info|warning|error)$")]
    pub min_severity: String,
    pub status: Option<DeliveryStatus>,
}

/// The organization's notification destinations.
#[derive(Debug, Serialize, ToSchema)]
pub struct NotificationsBody {
    pub destinations: Vec<DestinationBody>,
    /// When they were last set; null when never.
    pub updated_at: Option<String>,
}

/// The body of `PUT /api/v1/notifications`.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct PutNotificationsRequest {
    /// Up to 10 destinations; an empty list stops notifications.
    #[schema(value_type = Vec<Object>)]
    pub destinations: Vec<Value>,
}

fn require_admin(caller: &Caller) -> Result<(), ApiError> {
    if caller.0.is_org_admin || caller.0.is_operator {
        Ok(())
    } else {
        Err(ApiError::Forbidden(
            "only organization admins and operators manage notifications".to_owned(),
        ))
    }
}

async fn notifications_of(state: &AppState, org_id: &str) -> Result<NotificationsBody, ApiError> {
    let store = &state.store;
    let Some((text, updated_at)) = store.notification_destinations(org_id).await? else {
        return Ok(NotificationsBody { destinations: Vec::new(), updated_at: None });
    };
    let destinations: Vec<NotificationDestination> = serde_json::from_str(&text)
        .map_err(|error| ApiError::Internal(format!("stored destinations: {error}")))?;
    let progress = store.notification_progress(org_id).await?;
    let destinations = destinations
        .into_iter()
        .map(|d| {
            let status = progress.iter().find(|p| p.uid == d.uid).map(|p| DeliveryStatus {
                delivered_id: p.delivered_id,
                delivered_count: p.delivered_count,
                failures: p.failures,
                last_error: p.last_error.clone(),
                last_attempt_at: p.last_attempt_at.clone(),
                last_delivered_at: p.last_delivered_at.clone(),
            });
            DestinationBody {
                uid: d.uid,
                sink: serde_json::to_value(&d.sink).expect("a sink serializes"),
                kinds: d.kinds,
                min_severity: d.min_severity.name().to_owned(),
                status,
            }
        })
        .collect();
    Ok(NotificationsBody { destinations, updated_at: Some(updated_at) })
}

/// The organization's notification destinations and how delivery to each goes (org admins
/// and operators).
#[utoipa::path(
    get, path = "/api/v1/notifications", tag = "events",
    responses(
        (status = 200, description = "Destinations and their delivery", body = NotificationsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not an org admin or operator", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_notifications(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
) -> Result<Json<NotificationsBody>, ApiError> {
    require_admin(&caller)?;
    query.expect_none()?;
    Ok(Json(notifications_of(&state, &caller.0.org_id).await?))
}

/// Replace the organization's notification destinations (org admins and operators). Each
/// is `{"sink": {...}, "kinds": [...], "min_severity": "warning"}`: a sink of the types
/// pipelines use except the managed `kafka` (a webhook is signed with `hash_key` as a
/// pipeline's is), the kinds it wants (names or `prefix.*`; every kind when omitted) and
/// the least severity (default `info`). A new destination receives the events stored from
/// now on, at least once; one kept (same sink uid) continues where it was. Destinations an
/// operator sets also receive node events.
#[utoipa::path(
    put, path = "/api/v1/notifications", tag = "events",
    request_body = PutNotificationsRequest,
    responses(
        (status = 200, description = "Stored", body = NotificationsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not an org admin or operator", body = ErrorBody),
        (status = 422, description = "A bad body", body = ValidationErrorBody),
        (status = 503, description = "This process records no events", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn put_notifications(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    body: JsonBody,
) -> Result<Json<NotificationsBody>, ApiError> {
    require_admin(&caller)?;
    query.expect_none()?;
    let body = Value::Object(body.object()?);
    let mut destinations = NotificationDestination::validate_body(&body)?;
    for destination in &mut destinations {
        destination.operator_events = caller.0.is_operator;
    }
    let store = recorder(&state)?.store().clone();
    let text = serde_json::to_string(&destinations).expect("destinations serialize");
    let uids: Vec<String> = destinations.iter().map(|d| d.uid.clone()).collect();
    let start_after = store.last_event_id().await?;
    let org_id = &caller.0.org_id;
    store.put_notification_destinations(org_id, &text, &uids, start_after).await?;
    tracing::info!(org_id, destinations = uids.len(), "notification destinations set");
    Ok(Json(notifications_of(&state, org_id).await?))
}

/// A pipeline's event thresholds.
#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineThresholdsBody {
    /// Data age over which `lag.data_age_over` is emitted, in seconds.
    pub data_age_warning_seconds: u64,
    /// True when no threshold was set (the server's default applies).
    pub is_default: bool,
}

/// The body of `PUT …/thresholds` of a pipeline.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct PutPipelineThresholds {
    /// 1 to 2592000; null returns to the server's default.
    pub data_age_warning_seconds: Option<u64>,
}

/// Reads an optional threshold field of `body` (1 to [`MAX_THRESHOLD_SECONDS`], or null).
fn seconds(body: &Map<String, Value>, field: &str, errors: &mut Vec<Violation>) -> Option<u64> {
    let value = body.get(field).filter(|v| !v.is_null())?;
    match sluice_core::validation::whole_u64(value)
        .filter(|n| (1..=MAX_THRESHOLD_SECONDS).contains(n))
    {
        Some(n) => Some(n),
        None => {
            errors.push(Violation::new(
                &Loc::body().at(field),
                "value_error",
                format!("{field} must be an integer from 1 to {MAX_THRESHOLD_SECONDS}"),
            ));
            None
        }
    }
}

/// Extra fields of a thresholds body.
fn extras(body: &Map<String, Value>, known: &[&str], errors: &mut Vec<Violation>) {
    for field in body.keys().filter(|k| !known.contains(&k.as_str())) {
        errors.push(Violation::new(
            &Loc::body().at(field.as_str()),
            "extra_forbidden",
            "Extra inputs are not permitted",
        ));
    }
}

async fn pipeline_thresholds(
    state: &AppState,
    config_id: &str,
) -> Result<PipelineThresholdsBody, ApiError> {
    let default = state.events.as_ref().map_or(300, |e| e.settings().data_age_warning.as_secs());
    let stored = state.store.thresholds(&pipeline_subject(config_id)).await?;
    let set = stored.and_then(|text| serde_json::from_str::<PipelineThresholds>(&text).ok());
    Ok(PipelineThresholdsBody {
        data_age_warning_seconds: set.map_or(default, |t| t.data_age_warning_seconds),
        is_default: set.is_none(),
    })
}

/// A pipeline's event thresholds (read permission).
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/thresholds", tag = "events",
    params(("config_id" = String, Path, description = "Pipeline id")),
    responses(
        (status = 200, description = "The thresholds", body = PipelineThresholdsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such pipeline, or no read permission", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_pipeline_thresholds(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<PipelineThresholdsBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    caller.pipeline(&state, &config_id, Permission::Read).await?;
    query.expect_none()?;
    Ok(Json(pipeline_thresholds(&state, &config_id).await?))
}

/// Set a pipeline's event thresholds (edit permission); they apply within seconds, without
/// a redeploy.
#[utoipa::path(
    put, path = "/api/v1/beam/{config_id}/thresholds", tag = "events",
    params(("config_id" = String, Path, description = "Pipeline id")),
    request_body = PutPipelineThresholds,
    responses(
        (status = 200, description = "Stored", body = PipelineThresholdsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not edit permission", body = ErrorBody),
        (status = 404, description = "No such pipeline, or no read permission", body = ErrorBody),
        (status = 422, description = "A bad body", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn put_pipeline_thresholds(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: JsonBody,
) -> Result<Json<PipelineThresholdsBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    caller.pipeline(&state, &config_id, Permission::Edit).await?;
    query.expect_none()?;
    let body = body.object()?;
    let mut errors = Vec::new();
    let age = seconds(&body, "data_age_warning_seconds", &mut errors);
    extras(&body, &["data_age_warning_seconds"], &mut errors);
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    let text = age.map(|seconds| {
        serde_json::to_string(&PipelineThresholds { data_age_warning_seconds: seconds })
            .expect("thresholds serialize")
    });
    state.store.put_thresholds(&pipeline_subject(&config_id), text.as_deref()).await?;
    Ok(Json(pipeline_thresholds(&state, &config_id).await?))
}

/// A chain's event thresholds.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChainThresholdsBody {
    pub chain: String,
    /// Lag over which `chain.lagging` is emitted, in seconds.
    pub lag_seconds: u64,
    /// Time without a new block after which `chain.stalled` is emitted, in seconds.
    pub stall_seconds: u64,
}

/// The body of `PUT /api/v1/chains/{chain}/thresholds`.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct PutChainThresholds {
    /// 1 to 2592000; null: the server's default.
    pub lag_seconds: Option<u64>,
    /// 1 to 2592000; null: the server's default.
    pub stall_seconds: Option<u64>,
}

async fn chain_thresholds(state: &AppState, chain: &str) -> Result<ChainThresholdsBody, ApiError> {
    let settings = recorder(state)?.settings();
    let stored = state.store.thresholds(&chain_subject(chain)).await?;
    let set: ChainThresholds =
        stored.and_then(|text| serde_json::from_str(&text).ok()).unwrap_or_default();
    Ok(ChainThresholdsBody {
        chain: chain.to_owned(),
        lag_seconds: set.lag_seconds.unwrap_or(settings.chain_lag.as_secs()),
        stall_seconds: set.stall_seconds.unwrap_or(settings.chain_stall.as_secs()),
    })
}

fn known_chain(state: &AppState, chain: &str) -> Result<(), ApiError> {
    if state.catalog.entries().iter().any(|e| e.chain == chain) {
        Ok(())
    } else {
        Err(ApiError::NotFound(format!("Chain {chain} not found")))
    }
}

/// A chain's event thresholds (any API key).
#[utoipa::path(
    get, path = "/api/v1/chains/{chain}/thresholds", tag = "events",
    params(("chain" = String, Path, description = "A chain of the catalog")),
    responses(
        (status = 200, description = "The thresholds", body = ChainThresholdsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such chain", body = ErrorBody),
        (status = 503, description = "This process records no events", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_chain_thresholds(
    State(state): State<AppState>,
    _caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<ChainThresholdsBody>, ApiError> {
    let chain = path.get("chain").to_owned();
    query.expect_none()?;
    known_chain(&state, &chain)?;
    Ok(Json(chain_thresholds(&state, &chain).await?))
}

/// Set a chain's event thresholds (operators); they apply within seconds.
#[utoipa::path(
    put, path = "/api/v1/chains/{chain}/thresholds", tag = "events",
    params(("chain" = String, Path, description = "A chain of the catalog")),
    request_body = PutChainThresholds,
    responses(
        (status = 200, description = "Stored", body = ChainThresholdsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not an operator", body = ErrorBody),
        (status = 404, description = "No such chain", body = ErrorBody),
        (status = 422, description = "A bad body", body = ValidationErrorBody),
        (status = 503, description = "This process records no events", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn put_chain_thresholds(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: JsonBody,
) -> Result<Json<ChainThresholdsBody>, ApiError> {
    if !caller.0.is_operator {
        return Err(ApiError::Forbidden("only operators set chain thresholds".to_owned()));
    }
    let chain = path.get("chain").to_owned();
    query.expect_none()?;
    known_chain(&state, &chain)?;
    let body = body.object()?;
    let mut errors = Vec::new();
    let lag_seconds = seconds(&body, "lag_seconds", &mut errors);
    let stall_seconds = seconds(&body, "stall_seconds", &mut errors);
    extras(&body, &["lag_seconds", "stall_seconds"], &mut errors);
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    let set = ChainThresholds { lag_seconds, stall_seconds };
    let text = (set != ChainThresholds::default())
        .then(|| serde_json::to_string(&set).expect("thresholds serialize"));
    recorder(&state)?;
    state.store.put_thresholds(&chain_subject(&chain), text.as_deref()).await?;
    Ok(Json(chain_thresholds(&state, &chain).await?))
}
