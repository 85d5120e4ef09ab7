//! Backfills (docs/contract.md §Backfill endpoints) under `{base_url}/backfills`: create a job,
//! list the organization's jobs, read one, cancel one, list the warehouse tables, and read a
//! job's managed (`kafka`) destination. Jobs are organization-scoped: another
//! organization's job is 404. Handlers parse, call the backfill service, render.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use sluice_backfill::jobs::{Backfills, Cancelled};
use sluice_core::backfill::{BackfillJob, BackfillTransform, validate_backfill_body};
use sluice_core::validation::Loc;
use std::sync::Arc;
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::deployments::records::{PageQuery, RecordsBody, topic_page};
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{PathParams, Query};
use crate::state::AppState;

/// The create body (docs/contract.md §Backfill endpoints); documentation of what
/// `validate_backfill_body` reads.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct CreateBackfillRequest {
    /// 1 to 255 characters, not blank.
    job_name: String,
    /// A base-chain table (`GET /backfills/tables`).
    table: String,
    backfill_window: BackfillWindow,
    #[schema(required = false, nullable = false)]
    filter: Option<BackfillFilter>,
    /// 1 to 10 sinks, with unique uids.
    destinations: Vec<sluice_core::pipeline::SinkConfig>,
    #[schema(required = false, nullable = false)]
    static_egress_ip: Option<bool>,
    /// (ours) At most 10, run on every row before delivery, in order.
    #[schema(required = false, nullable = false)]
    transforms: Option<Vec<BackfillTransformBody>>,
}

/// A transform of a create body: a pipeline transform, a set filter with its values inline.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[allow(dead_code)]
#[serde(tag = "type")]
pub enum BackfillTransformBody {
    /// Passes only rows whose extracted value (lowercased) is in `set_values`.
    #[serde(rename = "redis_set_filter")]
    SetFilter {
        /// Generated when omitted.
        #[schema(required = false)]
        uid: String,
        /// `root = this.<path>`: the value to test.
        filter_expr: String,
        /// 1 to 100,000 values.
        set_values: Vec<String>,
    },
    /// A JavaScript `function transform(record)`; needs `custom_transforms`.
    #[serde(rename = "v8")]
    Script {
        /// Generated when omitted.
        #[schema(required = false)]
        uid: String,
        script: String,
    },
}

/// The window: `start` inclusive, `end` exclusive, `start` before `end`.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct BackfillWindow {
    /// Always `block_timestamp`.
    partition_key: String,
    #[schema(format = DateTime)]
    start: String,
    #[schema(format = DateTime)]
    end: String,
}

/// `column IN values` on the export query.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct BackfillFilter {
    /// A column of the table.
    column: String,
    /// 1 to 100,000 values.
    values: Vec<String>,
}

/// `{job_id, workflow_id}` of a new job.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedBackfill {
    pub job_id: String,
    pub workflow_id: String,
}

/// A backfill job as the API shows it: the stored job and its `time_created`
/// (docs/contract.md §Backfill job).
#[derive(Debug, Serialize, ToSchema)]
pub struct BackfillJobBody {
    #[serde(flatten)]
    pub job: BackfillJob,
    /// When the job was created (the contract's name; the same instant as `created_at`, which is
    /// kept for the clients that read it).
    #[schema(format = DateTime)]
    pub time_created: String,
}

impl From<BackfillJob> for BackfillJobBody {
    fn from(job: BackfillJob) -> Self {
        let time_created = sluice_core::time::format(job.created_at);
        Self { job, time_created }
    }
}

/// `{"message": …}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct BackfillMessage {
    pub message: String,
}

/// One column of a warehouse table.
#[derive(Debug, Serialize, ToSchema)]
pub struct TableColumn {
    pub name: String,
    /// `integer`, `double`, `timestamp` or `string`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// A warehouse table.
#[derive(Debug, Serialize, ToSchema)]
pub struct TableBody {
    pub name: String,
    /// Only base-chain tables can be backfilled.
    pub backfillable: bool,
    pub columns: Vec<TableColumn>,
    pub row_count: u64,
    /// The earliest and latest `block_timestamp`; null while the table is empty.
    #[schema(format = DateTime)]
    pub min_block_timestamp: Option<String>,
    #[schema(format = DateTime)]
    pub max_block_timestamp: Option<String>,
}

fn service(state: &AppState) -> Result<&Arc<Backfills>, ApiError> {
    state
        .backfills
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("this process runs no backfills".to_owned()))
}

impl From<sluice_backfill::jobs::BackfillError> for ApiError {
    fn from(error: sluice_backfill::jobs::BackfillError) -> Self {
        match error {
            sluice_backfill::jobs::BackfillError::Store(store) => Self::Store(store),
            sluice_backfill::jobs::BackfillError::Bus(bus) => bus.into(),
            other => Self::Internal(other.to_string()),
        }
    }
}

/// The caller's organization's job `job_id`, or 404.
async fn job_of(state: &AppState, caller: &Caller, job_id: &str) -> Result<BackfillJob, ApiError> {
    state
        .store
        .backfill(job_id)
        .await?
        .filter(|job| job.organization_id == caller.0.org_id)
        .ok_or_else(|| ApiError::NotFound(format!("Backfill job {job_id} not found")))
}

/// Create a backfill job: export `table` rows with `block_timestamp` in
/// [`start`, `end`) (and `filter.column IN filter.values`) to every destination. The job
/// starts staging at once.
#[utoipa::path(
    post, path = "/api/v1/beam/backfills", tag = "backfills",
    request_body = CreateBackfillRequest,
    responses(
        (status = 200, description = "The new job's ids", body = CreatedBackfill),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 422, description = "Rule violations", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create_backfill(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    body: JsonBody,
) -> Result<Json<CreatedBackfill>, ApiError> {
    caller.require_pipelines()?;
    query.expect_none()?;
    let backfills = service(&state)?.clone();
    let body = body.object()?;
    let request = validate_backfill_body(&body, &|name| backfills.table_check(name))?;
    caller.require_custom_transforms(
        request.transforms.iter().any(|t| matches!(t, BackfillTransform::Script { .. })),
    )?;
    let transforms: Vec<_> = request.transforms.iter().map(BackfillTransform::transform).collect();
    crate::scripts::check_transform_list(&transforms, &Loc::body().at("transforms")).await?;
    let destinations_loc = Loc::body().at("destinations");
    crate::secrets::check_sink_list(
        &state,
        &caller.0.org_id,
        &request.destinations,
        request.static_egress_ip,
        &destinations_loc,
    )
    .await?;
    let job = backfills.create(&caller.0.org_id, &caller.0.user_id, request).await?;
    Ok(Json(CreatedBackfill { job_id: job.job_id, workflow_id: job.workflow_id }))
}

/// The caller's organization's backfill jobs, oldest first.
#[utoipa::path(
    get, path = "/api/v1/beam/backfills", tag = "backfills",
    responses(
        (status = 200, description = "The organization's jobs", body = [BackfillJobBody]),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_backfills(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
) -> Result<Json<Vec<BackfillJobBody>>, ApiError> {
    caller.require_pipelines()?;
    query.expect_none()?;
    service(&state)?;
    let jobs = state.store.list_backfills(&caller.0.org_id).await?;
    Ok(Json(jobs.into_iter().map(BackfillJobBody::from).collect()))
}

/// One backfill job of the caller's organization: its status and progress.
#[utoipa::path(
    get, path = "/api/v1/beam/backfills/{job_id}", tag = "backfills",
    params(("job_id" = String, Path, description = "Job id")),
    responses(
        (status = 200, description = "The job", body = BackfillJobBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such job in the caller's organization", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_backfill(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<BackfillJobBody>, ApiError> {
    caller.require_pipelines()?;
    service(&state)?;
    let job = job_of(&state, &caller, path.get("job_id")).await?;
    query.expect_none()?;
    Ok(Json(job.into()))
}

/// Cancel a job that is staging or transporting: it is `cancelled` at once and stops at the
/// next chunk. 409 when it has already ended.
#[utoipa::path(
    post, path = "/api/v1/beam/backfills/{job_id}/cancel", tag = "backfills",
    params(("job_id" = String, Path, description = "Job id")),
    responses(
        (status = 200, description = "Cancelled", body = BackfillMessage),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such job in the caller's organization", body = ErrorBody),
        (status = 409, description = "The job has already ended", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn cancel_backfill(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<BackfillMessage>, ApiError> {
    caller.require_pipelines()?;
    let job_id = path.get("job_id").to_owned();
    job_of(&state, &caller, &job_id).await?;
    query.expect_none()?;
    match service(&state)?.cancel(&caller.0.org_id, &job_id).await? {
        Cancelled::Cancelled(_) => {
            Ok(Json(BackfillMessage { message: format!("Backfill job {job_id} cancelled") }))
        }
        Cancelled::AlreadyFinished(status) => Err(ApiError::Conflict(format!(
            "Backfill job {job_id} has already ended ({})",
            status.name()
        ))),
        Cancelled::NotFound => Err(ApiError::NotFound(format!("Backfill job {job_id} not found"))),
    }
}

/// The warehouse tables: columns, row counts and time ranges.
#[utoipa::path(
    get, path = "/api/v1/beam/backfills/tables", tag = "backfills",
    responses(
        (status = 200, description = "Every table", body = [TableBody]),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_tables(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
) -> Result<Json<Vec<TableBody>>, ApiError> {
    caller.require_pipelines()?;
    query.expect_none()?;
    let time = |us: i64| chrono::DateTime::from_timestamp_micros(us).map(sluice_core::time::format);
    let tables = service(&state)?
        .tables()?
        .into_iter()
        .map(|table| TableBody {
            min_block_timestamp: table.time_range_us.and_then(|(min, _)| time(min)),
            max_block_timestamp: table.time_range_us.and_then(|(_, max)| time(max)),
            name: table.name,
            backfillable: table.backfillable,
            columns: table
                .columns
                .into_iter()
                .map(|(name, kind)| TableColumn { name, kind: kind.to_owned() })
                .collect(),
            row_count: table.rows,
        })
        .collect();
    Ok(Json(tables))
}

/// Read what a job delivered to its managed (`kafka`) destination, in order. Page with
/// `next_offset`; `wait_ms` long-polls.
#[utoipa::path(
    get, path = "/api/v1/beam/backfills/{job_id}/sinks/{sink_uid}/records", tag = "backfills",
    params(
        ("job_id" = String, Path, description = "Job id"),
        ("sink_uid" = String, Path, description = "Destination uid"),
        crate::deployments::records::RecordsQuery,
    ),
    responses(
        (status = 200, description = "Records from `offset` on", body = RecordsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such job or managed destination", body = ErrorBody),
        (status = 416, description = "`offset` past the end; `detail` names the valid range", body = ErrorBody),
        (status = 422, description = "Bad query parameter", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn destination_records(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    query: Query,
) -> Result<Json<RecordsBody>, ApiError> {
    caller.require_pipelines()?;
    let (job_id, sink_uid) = (path.get("job_id").to_owned(), path.get("sink_uid").to_owned());
    let job = job_of(&state, &caller, &job_id).await?;
    let page = PageQuery::from_query(&query)?;
    let not_found =
        || ApiError::NotFound(format!("Job {job_id} has no managed destination {sink_uid}"));
    let topic = Backfills::managed_topic(&job, &sink_uid).ok_or_else(not_found)?;
    let runtime = state.runtime()?;
    topic_page(runtime.log().as_ref(), &topic, &page, not_found).await.map(Json)
}

/// What an import did.
#[derive(Debug, Serialize, ToSchema)]
pub struct ImportBody {
    /// Lines read (blank lines are not counted).
    pub read: u64,
    /// Rows added to the table.
    pub imported: u64,
    /// Rows whose key the table (or an earlier line) already had: skipped.
    pub already_there: u64,
    /// Lines that are not valid records of the table's entity.
    pub rejected: u64,
    /// The first rejected lines: `[line number, reason]`.
    #[schema(value_type = Vec<Vec<Object>>)]
    pub rejections: Vec<(u64, String)>,
}

/// Import history into a warehouse table (operators): NDJSON, one record of the table's
/// stream per line, checked as ingest checks it; keys the table already has are skipped.
#[utoipa::path(
    post, path = "/api/v1/warehouse/tables/{table}/rows", tag = "backfills",
    params(("table" = String, Path, description = "Table name, e.g. base.assets.erc20_token_transfers")),
    request_body(content = String, content_type = "application/x-ndjson", description = "One record per line"),
    responses(
        (status = 200, description = "What was imported", body = ImportBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not an operator", body = ErrorBody),
        (status = 404, description = "No such table", body = ErrorBody),
        (status = 413, description = "Body over the size limit", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn import_rows(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<ImportBody>, ApiError> {
    if !caller.0.is_operator {
        return Err(ApiError::Forbidden("only operators import into the warehouse".to_owned()));
    }
    query.expect_none()?;
    let body =
        body.map_err(|rejection| crate::body::read_error(&rejection, state.limits.max_body_bytes))?;
    let table = path.get("table").to_owned();
    let report = service(&state)?
        .import(&table, body.to_vec())
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("No table {table}")))?;
    tracing::info!(
        table,
        imported = report.imported,
        rejected = report.rejected,
        "warehouse import"
    );
    Ok(Json(ImportBody {
        read: report.read,
        imported: report.imported,
        already_there: report.already_there,
        rejected: report.rejected,
        rejections: report.rejections,
    }))
}
