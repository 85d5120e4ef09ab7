//! Deployment endpoints: deploy, pause and teardown here; reading what a deployment wrote
//! (managed sinks' records, dead letters, the script log) in [`records`].

pub mod records;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use serde_json::Value;
use sluice_core::permission::Permission;
use sluice_runtime::{Paused, RuntimeError};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{PathParams, Query};
use crate::pipelines::MessageBody;
use crate::state::AppState;

/// Connection details of one sink, returned by deploy.
#[derive(Debug, Serialize, ToSchema)]
pub struct SinkConnection {
    pub uid: String,
    pub name: String,
    #[serde(rename = "type")]
    pub sink_type: String,
    /// The managed topic the sink writes to.
    pub topic: String,
    /// Where to read the topic's records over HTTP (same API key, read permission).
    pub records_url: String,
    /// How to connect: the embedded log is read over HTTP with the API key.
    #[schema(value_type = Object)]
    pub connection: Value,
    /// Ready-to-run consumers, by language.
    #[schema(value_type = Object)]
    pub consumer_snippets: Value,
}

impl From<sluice_runtime::sinks::SinkConnection> for SinkConnection {
    fn from(sink: sluice_runtime::sinks::SinkConnection) -> Self {
        Self {
            uid: sink.uid,
            name: sink.name,
            sink_type: sink.sink_type.to_owned(),
            topic: sink.topic,
            records_url: sink.records_url,
            connection: sink.connection,
            consumer_snippets: sink.consumer_snippets,
        }
    }
}

/// The answer to a deploy.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeployBody {
    pub message: String,
    /// Always `deployed`.
    pub status: String,
    pub sinks: Vec<SinkConnection>,
}

impl From<RuntimeError> for ApiError {
    fn from(error: RuntimeError) -> Self {
        match error {
            RuntimeError::Plan(plan) => {
                // A sink's problem with one of its fields is reported at that field.
                let loc = sluice_core::validation::Loc::body().at("pipeline_config");
                let loc = match &plan {
                    sluice_runtime::PlanError::Sink(sink) => match sink.field() {
                        Some(field) => loc.at("sinks").at(0).at(field),
                        None => loc,
                    },
                    _ => loc,
                };
                ApiError::Validation(vec![sluice_core::validation::Violation::new(
                    &loc,
                    "not_deployable",
                    plan.to_string(),
                )])
            }
            RuntimeError::Store(store) => ApiError::Store(store),
            RuntimeError::UnknownStream(topic) => {
                ApiError::NotFound(format!("no chain stream {topic}"))
            }
            RuntimeError::Bus(bus) => bus.into(),
            RuntimeError::Sink(sink) => ApiError::Internal(sink.to_string()),
            RuntimeError::Replay(reason) => ApiError::Internal(reason),
            RuntimeError::Secrets(secrets) => secrets.into(),
            wrong @ RuntimeError::WrongEntity { .. } => ApiError::Internal(wrong.to_string()),
        }
    }
}

/// Deploy a pipeline (edit permission). Not deployed → deployed, reading from the stream's
/// end; paused → deployed, resuming from the kept offsets (records older than 2 days are
/// skipped); deployed → deployed with the stored configuration, swapped in at a batch
/// boundary with no gap. Idempotent.
#[utoipa::path(
    post, path = "/api/v1/beam/{config_id}/deploy", tag = "deployments",
    params(("config_id" = String, Path, description = "Pipeline id")),
    responses(
        (status = 200, description = "Deployed; sink connection details", body = DeployBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not edit permission", body = ErrorBody),
        (status = 404, description = "No such pipeline, or no read permission", body = ErrorBody),
        (status = 422, description = "The configuration cannot run in this build", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn deploy(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<DeployBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    // In the pipeline's turn: a transform edit's automatic redeploy must not undo this call.
    let (mut lifecycle, pipeline) =
        caller.pipeline_in_turn(&state, &config_id, Permission::Edit, query).await?;
    let deployed = lifecycle.deploy(&pipeline).await?;
    let sinks = deployed.sinks.into_iter().map(SinkConnection::from).collect();
    Ok(Json(DeployBody {
        message: format!("Pipeline {config_id} successfully deployed"),
        status: "deployed".to_owned(),
        sinks,
    }))
}

/// Pause a deployed pipeline (edit permission): processing stops; configuration, sinks and
/// offsets stay, and incoming data is held for up to 2 days. Deploy resumes it. No effect on
/// a pipeline that is not deployed.
#[utoipa::path(
    post, path = "/api/v1/beam/{config_id}/pause", tag = "deployments",
    params(("config_id" = String, Path, description = "Pipeline id")),
    responses(
        (status = 200, description = "Paused (or nothing to do)", body = MessageBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not edit permission", body = ErrorBody),
        (status = 404, description = "No such pipeline, or no read permission", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<MessageBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    let (mut lifecycle, _) =
        caller.pipeline_in_turn(&state, &config_id, Permission::Edit, query).await?;
    let message = match lifecycle.pause().await? {
        Paused::Paused => format!("Pipeline {config_id} successfully paused"),
        Paused::AlreadyPaused => format!("Pipeline {config_id} is already paused"),
        Paused::NotDeployed => format!("Pipeline {config_id} is not deployed; nothing to pause"),
    };
    Ok(Json(MessageBody { message }))
}

/// Tear a deployment down (edit permission): workers, the managed sink topic and the source
/// offsets are removed; the configuration stays. Data arriving before the next deploy is
/// never delivered.
#[utoipa::path(
    post, path = "/api/v1/beam/{config_id}/teardown", tag = "deployments",
    params(("config_id" = String, Path, description = "Pipeline id")),
    responses(
        (status = 200, description = "Torn down (or nothing to do)", body = MessageBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not edit permission", body = ErrorBody),
        (status = 404, description = "No such pipeline, or no read permission", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn teardown(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<MessageBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    let (mut lifecycle, _) =
        caller.pipeline_in_turn(&state, &config_id, Permission::Edit, query).await?;
    let message = if lifecycle.teardown().await? {
        format!("Pipeline {config_id} successfully torn down")
    } else {
        format!("Pipeline {config_id} is not deployed; nothing to tear down")
    };
    Ok(Json(MessageBody { message }))
}
