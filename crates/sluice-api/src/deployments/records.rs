//! Reading a deployment's own topics: its managed sinks' records (a page, or a live tail as
//! Server-Sent Events), its dead letters (and replaying them), and its script log.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sluice_bus::StreamLog;
use sluice_core::permission::Permission;
use sluice_core::validation::{Loc, Violation};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{PathParams, Query};
use crate::state::AppState;

/// Largest page of `GET …/records` and `GET …/dead-letters`.
pub const MAX_RECORDS_PAGE: i64 = 10_000;
/// Page size of `GET …/records` and `GET …/dead-letters` when `limit` is not given.
pub const DEFAULT_RECORDS_PAGE: i64 = 500;
/// Longest long-poll of `GET …/records` and `GET …/dead-letters`, in milliseconds.
pub const MAX_WAIT_MS: i64 = 30_000;
/// Largest offset a query may name (offsets are stored as signed 64-bit integers).
pub const MAX_OFFSET: u64 = i64::MAX as u64;
/// Most log lines of `GET …/logs`.
pub const MAX_LOG_LINES: i64 = 1_000;
/// Log lines of `GET …/logs` when `limit` is not given.
pub const DEFAULT_LOG_LINES: i64 = 100;

/// Where to read a managed sink's records from.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RecordsQuery {
    /// First offset to return (default 0: the oldest retained record).
    pub offset: Option<u64>,
    /// Most records to return, 1 to 10,000 (default 500).
    pub limit: Option<u32>,
    /// When nothing is there yet, wait up to this long for records (0 to 30,000; default 0).
    pub wait_ms: Option<u64>,
}

/// One delivered record.
#[derive(Debug, Serialize, ToSchema)]
pub struct SinkRecord {
    pub offset: u64,
    /// The stable key of the source record (use it to de-duplicate).
    pub key: String,
    /// When the record reached the sink (RFC 3339).
    pub timestamp: String,
    /// The record as delivered.
    #[schema(value_type = Object)]
    pub value: Value,
}

/// A page of a managed sink's records.
#[derive(Debug, Serialize, ToSchema)]
pub struct RecordsBody {
    pub records: Vec<SinkRecord>,
    /// The offset to ask for next.
    pub next_offset: u64,
}

/// Read the records a deployed pipeline delivered to its managed (`kafka`) sink, in order
/// (read permission). Page with `next_offset`; `wait_ms` long-polls.
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/sinks/{sink_uid}/records", tag = "deployments",
    params(
        ("config_id" = String, Path, description = "Pipeline id"),
        ("sink_uid" = String, Path, description = "Sink uid"),
        RecordsQuery,
    ),
    responses(
        (status = 200, description = "Records from `offset` on", body = RecordsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such pipeline or sink, or not deployed", body = ErrorBody),
        (status = 422, description = "Bad query parameter", body = ValidationErrorBody),
        (status = 416, description = "`offset` past the end of the sink; `detail` names the valid range", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn sink_records(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    query: Query,
) -> Result<Json<RecordsBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    let sink_uid = path.get("sink_uid").to_owned();
    caller.pipeline(&state, &config_id, Permission::Read).await?;
    let page = PageQuery::from_query(&query)?;
    let runtime = state.runtime()?;
    let not_found =
        || ApiError::NotFound(format!("Sink {sink_uid} of pipeline {config_id} is not deployed"));
    let topic = runtime.sink_topic(&config_id, &sink_uid).await?.ok_or_else(not_found)?;
    topic_page(runtime.log().as_ref(), &topic, &page, not_found).await.map(Json)
}

/// A page of `topic` (one partition) as `page` asks; `not_found` when the topic is gone.
pub(crate) async fn topic_page(
    log: &dyn StreamLog,
    topic: &str,
    page: &PageQuery,
    not_found: impl Fn() -> ApiError,
) -> Result<RecordsBody, ApiError> {
    let Some(range) = retained(log, topic).await? else { return Err(not_found()) };
    if let Some(offset) = page.asked_offset {
        check_offset(offset, range)?;
    }
    let records = page.read(log, topic).await?.ok_or_else(not_found)?;
    let next_offset = records.last().map_or(page.from, |r| r.offset + 1);
    let records = records.into_iter().map(SinkRecord::from).collect();
    Ok(RecordsBody { records, next_offset })
}

/// `offset`, `limit` and `wait_ms` of a topic read, checked.
pub(crate) struct PageQuery {
    /// The `offset` asked for, or where the endpoint starts by default.
    from: u64,
    asked_offset: Option<u64>,
    limit: usize,
    wait: Duration,
}

impl PageQuery {
    pub(crate) fn from_query(query: &Query) -> Result<Self, ApiError> {
        let mut params = query.parse()?;
        let offset = params.uint("offset", MAX_OFFSET);
        let limit = params.int("limit", 1, MAX_RECORDS_PAGE).unwrap_or(DEFAULT_RECORDS_PAGE);
        let wait_ms = params.int("wait_ms", 0, MAX_WAIT_MS).unwrap_or(0);
        params.finish()?;
        Ok(Self {
            from: offset.unwrap_or(0),
            asked_offset: offset,
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            wait: Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0)),
        })
    }

    /// Up to `limit` records of partition 0 of `topic` from `from` on, waiting up to `wait`
    /// for the first; `None` when the topic does not exist.
    async fn read(
        &self,
        log: &dyn StreamLog,
        topic: &str,
    ) -> Result<Option<Vec<sluice_bus::Record>>, ApiError> {
        let mut watch = log.watch(topic);
        let deadline = std::time::Instant::now() + self.wait;
        loop {
            let records = match log.read(topic, 0, self.from, self.limit).await {
                Ok(records) => records,
                Err(sluice_bus::BusError::UnknownTopic(_)) => return Ok(None),
                Err(other) => return Err(other.into()),
            };
            let now = std::time::Instant::now();
            if !records.is_empty() || now >= deadline {
                return Ok(Some(records));
            }
            watch.wait(deadline - now).await;
        }
    }
}

/// One record a transform failed on.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetter {
    pub offset: u64,
    /// The key of the source record (with `#n` for the n-th output of a fan-out before it).
    pub key: String,
    /// When it was written to the dead-letter topic (RFC 3339).
    pub timestamp: String,
    /// The transform that failed; null when the sink refused the record.
    pub transform_uid: Option<String>,
    /// The sink that refused the record for good (a webhook's 4xx, a record over the
    /// receiver's size limit); null when a transform failed.
    pub sink_uid: Option<String>,
    /// The error of the last attempt, with the script's line where the engine gave one.
    pub error: String,
    /// Calls of the transform before the record was set aside.
    pub attempts: u32,
    /// The record as it entered the failing transform.
    #[schema(value_type = Object)]
    pub record: Value,
}

/// A page of a pipeline's dead letters.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLettersBody {
    pub dead_letters: Vec<DeadLetter>,
    /// The offset to ask for next.
    pub next_offset: u64,
}

/// Read the records a deployed pipeline's transforms failed on, oldest first (read
/// permission). Without `offset`, from the first one not replayed yet; page with
/// `next_offset`; `wait_ms` long-polls. Kept 2 days, removed by teardown.
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/dead-letters", tag = "deployments",
    params(("config_id" = String, Path, description = "Pipeline id"), RecordsQuery),
    responses(
        (status = 200, description = "Dead letters from `offset` on", body = DeadLettersBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such pipeline, or not deployed", body = ErrorBody),
        (status = 422, description = "Bad query parameter", body = ValidationErrorBody),
        (status = 416, description = "`offset` past the end of the dead letters; `detail` names the valid range", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn dead_letters(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    query: Query,
) -> Result<Json<DeadLettersBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    caller.pipeline(&state, &config_id, Permission::Read).await?;
    let mut page = PageQuery::from_query(&query)?;
    let runtime = state.runtime()?;
    let not_found = || ApiError::NotFound(format!("Pipeline {config_id} is not deployed"));
    let topic = runtime.dead_letter_topic(&config_id).await?.ok_or_else(not_found)?;
    if page.asked_offset.is_none() {
        // By default the dead letters still waiting: those after the last replay.
        page.from = runtime.dead_letter_cursor(&config_id).await?;
    }
    let log = runtime.log().as_ref();
    // An offset past the end is a 416, as on a sink: a consumer would otherwise poll an
    // empty page forever.
    if let (Some(offset), Some(range)) = (page.asked_offset, retained(log, &topic).await?) {
        check_offset(offset, range)?;
    }
    // A deployment from before dead letters existed has no topic yet: nothing failed there.
    let records = page.read(log, &topic).await?.unwrap_or_default();
    let next_offset = records.last().map_or(page.from, |r| r.offset + 1);
    let dead_letters = records
        .into_iter()
        .map(|record| {
            let mut body: Value = serde_json::from_slice(&record.value).unwrap_or(Value::Null);
            let mut take =
                |field: &str| body.get_mut(field).map(Value::take).unwrap_or(Value::Null);
            DeadLetter {
                offset: record.offset,
                key: String::from_utf8_lossy(&record.key).into_owned(),
                timestamp: append_time(record.timestamp_ms),
                transform_uid: take("transform_uid").as_str().map(str::to_owned),
                sink_uid: take("sink_uid").as_str().map(str::to_owned),
                error: take("error").as_str().unwrap_or_default().to_owned(),
                attempts: take("attempts")
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
                record: take("record"),
            }
        })
        .collect();
    Ok(Json(DeadLettersBody { dead_letters, next_offset }))
}

impl From<sluice_bus::Record> for SinkRecord {
    fn from(record: sluice_bus::Record) -> Self {
        Self {
            offset: record.offset,
            key: String::from_utf8_lossy(&record.key).into_owned(),
            timestamp: append_time(record.timestamp_ms),
            value: serde_json::from_slice(&record.value).unwrap_or_else(|_| {
                Value::String(String::from_utf8_lossy(&record.value).into_owned())
            }),
        }
    }
}

/// Where a live tail starts.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TailQuery {
    /// First offset to send (default: the sink's end, so only new records). A `Last-Event-ID`
    /// header, sent by reconnecting `EventSource` clients, wins: the tail resumes after it.
    pub offset: Option<u64>,
}

/// One Server-Sent Event of a live tail.
#[derive(Debug, Serialize, ToSchema)]
pub struct TailEvent {
    /// `record`, or `end` once the sink is torn down.
    #[schema(pattern = "^(record|end)$")]
    pub event: String,
    /// The record's offset (`record` events).
    #[schema(required = false)]
    pub id: String,
    /// `record`: the record as `GET …/records` returns it; `end`: `{"detail": reason}`.
    pub data: String,
}

/// How long a tail waits for records before it checks that the sink still exists.
const TAIL_IDLE_CHECK: Duration = Duration::from_secs(5);
/// Records read from the log per step of a tail.
const TAIL_READ_BATCH: usize = 500;

/// A live tail of a managed sink as Server-Sent Events (read permission): one `record` event
/// per delivered record, whose `id` is its offset and whose `data` is the record as
/// `GET …/records` returns it, a keep-alive comment every 15 s while idle, and an `end` event
/// when the sink is torn down.
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/sinks/{sink_uid}/records/stream", tag = "deployments",
    params(
        ("config_id" = String, Path, description = "Pipeline id"),
        ("sink_uid" = String, Path, description = "Sink uid"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this offset"),
        TailQuery,
    ),
    responses(
        (status = 200, description = "`text/event-stream` of `record` events", content_type = "text/event-stream", body = TailEvent),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such pipeline or sink, or not deployed", body = ErrorBody),
        (status = 422, description = "Bad query parameter or Last-Event-ID", body = ValidationErrorBody),
        (status = 416, description = "`offset` or `Last-Event-ID` past the end of the sink; `detail` names the valid range", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn sink_records_stream(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    headers: axum::http::HeaderMap,
    query: Query,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    let sink_uid = path.get("sink_uid").to_owned();
    caller.pipeline(&state, &config_id, Permission::Read).await?;
    let mut params = query.parse()?;
    let offset = params.uint("offset", MAX_OFFSET);
    params.finish()?;
    let id_loc = Loc::header("Last-Event-ID");
    let last_event_id = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()).ok_or_else(|| {
                ApiError::Validation(vec![Violation::new(
                    &id_loc,
                    "int_parsing",
                    "Last-Event-ID must be a record offset (a non-negative integer)",
                )])
            })?,
        ),
    };
    let runtime = state.runtime()?;
    let not_found =
        || ApiError::NotFound(format!("Sink {sink_uid} of pipeline {config_id} is not deployed"));
    let topic = runtime.sink_topic(&config_id, &sink_uid).await?.ok_or_else(not_found)?;
    let log = runtime.log().clone();
    let watch = log.watch(&topic);
    let Some(range) = retained(log.as_ref(), &topic).await? else { return Err(not_found()) };
    let from = match (last_event_id, offset) {
        // The id is the offset of the last record the client has: it resumes after it.
        (Some(id), _) => match id.checked_add(1).filter(|next| *next <= range.1) {
            Some(next) => next,
            None => {
                let written = match range.1.checked_sub(1) {
                    Some(last) => format!("the sink's last record is {last}"),
                    None => "the sink has no record yet".to_owned(),
                };
                return Err(ApiError::OutOfRange(format!(
                    "Last-Event-ID {id} is out of range: {written}; resume after an offset \
                     below {}, or without Last-Event-ID",
                    range.1
                )));
            }
        },
        (None, Some(offset)) => check_offset(offset, range)?,
        (None, None) => range.1,
    };
    let tail = Tail { log, topic, next: from, watch, pending: VecDeque::new(), ended: false };
    let events = futures_util::stream::unfold(tail, |mut tail| async move {
        let event = tail.next_event().await?;
        Some((Ok(event), tail))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The state of one live tail.
struct Tail {
    log: Arc<dyn StreamLog>,
    topic: String,
    next: u64,
    watch: sluice_bus::AppendWatch,
    pending: VecDeque<sluice_bus::Record>,
    ended: bool,
}

impl Tail {
    /// The next event, waiting for records as long as the sink exists; `None` after `end`.
    async fn next_event(&mut self) -> Option<Event> {
        if self.ended {
            return None;
        }
        loop {
            if let Some(record) = self.pending.pop_front() {
                let id = record.offset.to_string();
                let data = serde_json::to_string(&SinkRecord::from(record))
                    .expect("a sink record serializes");
                return Some(Event::default().event("record").id(id).data(data));
            }
            match self.log.read(&self.topic, 0, self.next, TAIL_READ_BATCH).await {
                Ok(records) if !records.is_empty() => {
                    self.next = records.last().map_or(self.next, |r| r.offset + 1);
                    self.pending.extend(records);
                }
                Ok(_) => {
                    if !self.watch.wait(TAIL_IDLE_CHECK).await
                        && !matches!(self.log.topic(&self.topic).await, Ok(Some(_)))
                    {
                        return Some(self.end("the sink was torn down"));
                    }
                }
                Err(sluice_bus::BusError::UnknownTopic(_)) => {
                    return Some(self.end("the sink was torn down"));
                }
                Err(other) => {
                    tracing::warn!(topic = %self.topic, error = %other, "sink tail read failed");
                    return Some(self.end(&format!("stream log: {other}")));
                }
            }
        }
    }

    fn end(&mut self, reason: &str) -> Event {
        self.ended = true;
        Event::default().event("end").data(json!({ "detail": reason }).to_string())
    }
}

/// What a replay did.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReplayBody {
    pub message: String,
    /// Dead letters fed through the current transforms again.
    pub replayed: u64,
    /// Records that reached the sink.
    pub delivered: u64,
    /// Records that failed again: new dead letters, listed by `GET …/dead-letters`.
    pub dead_lettered: u64,
    /// The first dead letter not replayed (the new default start of `GET …/dead-letters`).
    pub next_offset: u64,
}

/// Feed the dead letters not replayed yet through the pipeline's current transforms, each
/// from the transform that failed on it (from the first when that transform is gone), and
/// deliver what passes to the sink (edit permission). What fails again becomes a new dead
/// letter. Works on a paused pipeline too.
#[utoipa::path(
    post, path = "/api/v1/beam/{config_id}/dead-letters/replay", tag = "deployments",
    params(("config_id" = String, Path, description = "Pipeline id")),
    responses(
        (status = 200, description = "What the replay did", body = ReplayBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read access only", body = ErrorBody),
        (status = 404, description = "No such pipeline, or not deployed", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn replay_dead_letters(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<ReplayBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    let mut lifecycle = state.lifecycle(&config_id).await?;
    caller.pipeline(&state, &config_id, Permission::Edit).await?;
    query.expect_none()?;
    let report = lifecycle
        .replay_dead_letters()
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("Pipeline {config_id} is not deployed")))?;
    Ok(Json(ReplayBody {
        message: format!("Replayed {} dead letters of pipeline {config_id}", report.replayed),
        replayed: report.replayed,
        delivered: report.delivered,
        dead_lettered: report.dead_lettered,
        next_offset: report.next_offset,
    }))
}

/// How many log lines to return.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogsQuery {
    /// The most recent lines to return, 1 to 1,000 (default 100).
    pub limit: Option<u32>,
}

/// The pipeline's script log lines.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogsBody {
    #[schema(value_type = Vec<Object>)]
    pub logs: Vec<sluice_runtime::plan::LogLine>,
}

/// The most recent `console.*` lines of the pipeline's scripts, oldest first:
/// `{timestamp, level, transform_uid, message}` (read permission). Empty when the pipeline
/// is not deployed; kept 2 days, removed by teardown.
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/logs", tag = "deployments",
    params(("config_id" = String, Path, description = "Pipeline id"), LogsQuery),
    responses(
        (status = 200, description = "The latest lines", body = LogsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such pipeline", body = ErrorBody),
        (status = 422, description = "Bad limit", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn pipeline_logs(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    query: Query,
) -> Result<Json<LogsBody>, ApiError> {
    let config_id = path.get("config_id").to_owned();
    caller.pipeline(&state, &config_id, Permission::Read).await?;
    let mut params = query.parse()?;
    let limit = params.int("limit", 1, MAX_LOG_LINES).unwrap_or(DEFAULT_LOG_LINES);
    params.finish()?;
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let logs = state.runtime()?.script_logs(&config_id, limit).await?;
    Ok(Json(LogsBody { logs }))
}

/// The retained offsets of partition 0 of `topic` as `(first, end)`, `end` being the offset
/// the next record will get; `None` when the topic does not exist.
async fn retained(log: &dyn StreamLog, topic: &str) -> Result<Option<(u64, u64)>, ApiError> {
    match log.offsets(topic).await {
        Ok(ranges) => Ok(Some(ranges.first().map_or((0, 0), |range| (range.start, range.end)))),
        Err(sluice_bus::BusError::UnknownTopic(_)) => Ok(None),
        Err(other) => Err(other.into()),
    }
}

/// `offset` when it is at most `high` (an offset below the first retained one reads from
/// the first retained record); otherwise a 416 naming the valid range, as Kafka answers an
/// offset out of range.
fn check_offset(offset: u64, (low, high): (u64, u64)) -> Result<u64, ApiError> {
    if offset <= high {
        return Ok(offset);
    }
    Err(ApiError::OutOfRange(format!(
        "offset {offset} is out of range: the valid range is [{low}, {high}] ({high} is the \
         offset the next record will get)"
    )))
}

/// A record's append time (Unix ms) as RFC 3339.
fn append_time(timestamp_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(timestamp_ms)
        .map(sluice_core::time::format)
        .unwrap_or_default()
}
