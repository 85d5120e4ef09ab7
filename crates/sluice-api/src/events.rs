//! Service events (docs/events.md): `GET /api/v1/events` (cursor pages),
//! `GET /api/v1/events/stream` (Server-Sent Events with `Last-Event-ID` resume) and
//! `GET /api/v1/events/pipelines` (the console's badges). Notification destinations and
//! thresholds are in `events/settings.rs`.
//!
//! Visibility: the store returns the events of the caller's organization, service-wide
//! events and, for operators, node events; a pipeline's events are then kept only when the
//! caller can read the pipeline (`Visibility`).

mod settings;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use serde::Serialize;
use serde_json::{Value, json};
use sluice_core::events::{Event, EventEmitter, EventFilter, NewEvent, Scope, Severity};
use sluice_core::identity::Principal;
use sluice_core::pipeline::Pipeline;
use sluice_core::validation::{Loc, Violation};
use sluice_runtime::events::Recorder;
use sluice_store::EventQuery;
use utoipa::{IntoParams, ToSchema};

pub use settings::*;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{Query, QueryParams};
use crate::state::AppState;

/// Largest page of `GET /api/v1/events`.
pub const MAX_PAGE: i64 = 1000;
/// Page size when `limit` is not given.
pub const DEFAULT_PAGE: i64 = 100;
/// Rows read per step while filling a page (a page may skip events of pipelines the caller
/// cannot read; at most this many steps fill one page).
const SCAN_STEPS: usize = 10;
/// How often a live stream reads the caller's pipelines again (new ones become visible).
const READERS_EVERY: Duration = Duration::from_secs(10);

/// The event of a pipeline change made through the API (`pipeline.created`, `.updated`,
/// `.deleted`).
pub fn pipeline_changed(state: &AppState, pipeline: &Pipeline, kind: &'static str) {
    let Some(events) = &state.events else { return };
    let word = kind.trim_start_matches("pipeline.");
    let message = format!("pipeline {} {word}", pipeline.name);
    events.emit(NewEvent::pipeline(
        events.now(),
        kind,
        Severity::Info,
        &pipeline.organization_id,
        &pipeline.id,
        message,
        json!({"name": pipeline.name}),
    ));
}

/// `filter_values.replaced`: a set filter's values replaced, with the counts.
pub fn values_replaced(
    state: &AppState,
    org_id: &str,
    pipeline_id: &str,
    uid: &str,
    before: u64,
    after: u64,
) {
    let Some(events) = &state.events else { return };
    let message = format!("filter values of {uid} replaced: {before} before, {after} after");
    events.emit(NewEvent::pipeline(
        events.now(),
        "filter_values.replaced",
        Severity::Info,
        org_id,
        pipeline_id,
        message,
        json!({"transform_uid": uid, "count_before": before, "count_after": after}),
    ));
}

/// One event.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventBody {
    /// Increasing in the order events were stored: the cursor and the SSE id.
    pub id: i64,
    /// ISO 8601 UTC.
    pub time: String,
    /// Null for service-wide events (chains, nodes).
    pub organization_id: Option<String>,
    /// One of the kinds docs/events.md lists.
    pub kind: String,
    #[schema(pattern = "^(info|warning|error)$")]
    pub severity: String,
    pub pipeline_id: Option<String>,
    pub job_id: Option<String>,
    pub chain: Option<String>,
    pub node: Option<String>,
    pub message: String,
    /// Fixed shape per kind (docs/events.md).
    #[schema(value_type = Object)]
    pub details: Value,
}

impl From<Event> for EventBody {
    fn from(event: Event) -> Self {
        Self {
            id: event.id,
            time: sluice_core::time::format(event.time),
            organization_id: event.organization_id,
            kind: event.kind,
            severity: event.severity.name().to_owned(),
            pipeline_id: event.pipeline_id,
            job_id: event.job_id,
            chain: event.chain,
            node: event.node,
            message: event.message,
            details: event.details,
        }
    }
}

/// A page of events, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    pub items: Vec<EventBody>,
    /// Pass as `cursor` for the next (older) page; null when there is none.
    pub cursor: Option<i64>,
}

/// Filters of the list and the stream.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventFilterQuery {
    /// Only these kinds: names or prefixes ending in `*` (`chain.*`), comma-separated or
    /// repeated.
    pub kind: Option<String>,
    /// Only events of at least this severity: `info`, `warning` or `error`.
    pub severity: Option<String>,
    /// Only the events of this pipeline.
    pub pipeline_id: Option<String>,
    /// Only events at or after this time (ISO 8601).
    pub since: Option<String>,
}

/// Paging of the list.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventPageQuery {
    /// The `cursor` of the previous page: events older than it.
    pub cursor: Option<i64>,
    /// Events per page, 1 to 1000 (default 100).
    pub limit: Option<i64>,
}

/// Who sees what: the caller, and the pipelines it reads.
pub(crate) struct Visibility {
    principal: Principal,
    readable: HashSet<String>,
    /// Pipelines of the organization found unreadable since the last read.
    unreadable: HashSet<String>,
    read_at: Instant,
}

impl Visibility {
    pub(crate) async fn of(state: &AppState, principal: &Principal) -> Result<Self, ApiError> {
        let readable = if principal.flags.pipelines {
            state
                .store
                .list_readable_pipelines(principal)
                .await?
                .into_iter()
                .map(|p| p.id)
                .collect()
        } else {
            HashSet::new()
        };
        Ok(Self {
            principal: principal.clone(),
            readable,
            unreadable: HashSet::new(),
            read_at: Instant::now(),
        })
    }

    async fn refresh(&mut self, state: &AppState) -> Result<(), ApiError> {
        if self.read_at.elapsed() >= READERS_EVERY {
            *self = Self::of(state, &self.principal.clone()).await?;
        }
        Ok(())
    }

    /// Reads the caller's pipelines again when `rows` hold an event of a pipeline of the
    /// caller's organization that it did not know (one created since), so a stream never
    /// skips the events of a pipeline the caller can read.
    async fn learn(&mut self, state: &AppState, rows: &[Event]) -> Result<(), ApiError> {
        let unknown: Vec<String> = rows
            .iter()
            .filter(|e| {
                e.scope == Some(Scope::Pipeline)
                    && e.organization_id.as_deref() == Some(self.principal.org_id.as_str())
            })
            .filter_map(|e| e.pipeline_id.clone())
            .filter(|id| !self.readable.contains(id) && !self.unreadable.contains(id))
            .collect();
        if !unknown.is_empty() {
            *self = Self::of(state, &self.principal.clone()).await?;
            let still: Vec<String> =
                unknown.into_iter().filter(|id| !self.readable.contains(id)).collect();
            self.unreadable.extend(still);
        }
        Ok(())
    }

    fn sees(&self, event: &Event) -> bool {
        match event.scope {
            Some(Scope::Pipeline) => {
                event.pipeline_id.as_ref().is_some_and(|id| self.readable.contains(id))
            }
            Some(Scope::Organization) => {
                event.organization_id.as_deref() == Some(self.principal.org_id.as_str())
            }
            Some(Scope::Service) => true,
            Some(Scope::Operators) => self.principal.is_operator,
            None => false,
        }
    }

    fn query(&self, filter: &EventFilter, limit: i64) -> EventQuery {
        EventQuery {
            org_id: Some(self.principal.org_id.clone()),
            operator: self.principal.is_operator,
            service: true,
            kinds: filter.kinds.clone(),
            min_severity: filter.min_severity,
            pipeline_id: filter.pipeline_id.clone(),
            since: filter.since,
            limit,
            ..EventQuery::default()
        }
    }
}

fn recorder(state: &AppState) -> Result<&Arc<Recorder>, ApiError> {
    state
        .events
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("this process records no events".to_owned()))
}

/// Reads the filter parameters. A `pipeline_id` the caller cannot read gives no events (as
/// one that does not exist), so the answer reveals nothing.
fn read_filter(params: &mut QueryParams) -> EventFilter {
    let mut kinds = Vec::new();
    let given: Vec<String> =
        params.all("kind").iter().flat_map(|v| v.split(',')).map(|v| v.trim().to_owned()).collect();
    for value in &given {
        if EventFilter::valid_kind(value) {
            kinds.push(value.clone());
        } else {
            let msg = format!("unknown event kind '{value}' (docs/events.md lists them)");
            params.reject("kind", "value_error", msg);
        }
    }
    let min_severity =
        params.one_of("severity", &["info", "warning", "error"]).and_then(Severity::parse);
    let pipeline_id = params.string("pipeline_id", 1);
    let since = params.string("since", 1).and_then(|text| match sluice_core::time::parse(&text) {
        Ok(at) => Some(at),
        Err(_) => {
            params.reject(
                "since",
                "datetime_parsing",
                "Input should be a valid datetime (ISO 8601)",
            );
            None
        }
    });
    EventFilter { kinds, min_severity, pipeline_id, since }
}

/// List events the caller may see, newest first, a page at a time (any API key). Pipeline
/// events need read access to the pipeline; node events an operator key.
#[utoipa::path(
    get, path = "/api/v1/events", tag = "events",
    params(EventFilterQuery, EventPageQuery),
    responses(
        (status = 200, description = "A page of events, newest first", body = EventPage),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "A bad query parameter", body = ValidationErrorBody),
        (status = 503, description = "This process records no events", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_events(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
) -> Result<Json<EventPage>, ApiError> {
    let mut params = query.parse()?;
    let filter = read_filter(&mut params);
    let cursor = params.int("cursor", 1, i64::MAX);
    let limit = params.int("limit", 1, MAX_PAGE).unwrap_or(DEFAULT_PAGE);
    params.finish()?;
    let store = recorder(&state)?.store().clone();
    let visibility = Visibility::of(&state, &caller.0).await?;
    let mut query = visibility.query(&filter, limit + 1);
    query.before_id = cursor;
    let mut items: Vec<Event> = Vec::new();
    // The last event looked at, and whether older ones may exist beyond it.
    let mut more = true;
    for _ in 0..SCAN_STEPS {
        let rows = store.list_events(&query).await?;
        more = rows.len() as i64 > limit;
        let mut rows = rows.into_iter().take(limit as usize).peekable();
        while let Some(row) = rows.next() {
            query.before_id = Some(row.id);
            if visibility.sees(&row) {
                items.push(row);
                if items.len() as i64 == limit {
                    more = more || rows.peek().is_some();
                    break;
                }
            }
        }
        if items.len() as i64 == limit || !more {
            break;
        }
    }
    let next = if more { query.before_id } else { None };
    Ok(Json(EventPage { items: items.into_iter().map(EventBody::from).collect(), cursor: next }))
}

/// One Server-Sent Event of the stream.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamEvent {
    /// The event's id (send it back as `Last-Event-ID` to resume).
    pub id: String,
    /// The event as `GET /api/v1/events` returns it.
    pub data: String,
}

/// Follow events live as Server-Sent Events (any API key; what the caller may see, as in
/// the list). Each SSE message is one event, its `id` the event's id, oldest first. Without
/// `Last-Event-ID` the stream starts with events stored from now on; with it, after that
/// event (events kept for 30 days).
#[utoipa::path(
    get, path = "/api/v1/events/stream", tag = "events",
    params(
        EventFilterQuery,
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this event id"),
    ),
    responses(
        (status = 200, description = "`text/event-stream` of events", content_type = "text/event-stream", body = StreamEvent),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "A bad query parameter or Last-Event-ID", body = ValidationErrorBody),
        (status = 503, description = "This process records no events", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn stream_events(
    State(state): State<AppState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    query: Query,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let mut params = query.parse()?;
    let filter = read_filter(&mut params);
    params.finish()?;
    let last_event_id = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    ApiError::Validation(vec![Violation::new(
                        &Loc::header("Last-Event-ID"),
                        "int_parsing",
                        "Last-Event-ID must be an event id (a non-negative integer)",
                    )])
                })?,
        ),
    };
    let recorder = recorder(&state)?.clone();
    let wake = recorder.subscribe();
    let after = match last_event_id {
        Some(id) => id,
        None => recorder.store().last_event_id().await?,
    };
    let visibility = Visibility::of(&state, &caller.0).await?;
    let follow = Follow { state, recorder, visibility, filter, after, wake, pending: Vec::new() };
    let stream = futures_util::stream::unfold(follow, |mut follow| async move {
        let event = follow.next().await?;
        Some((Ok(event), follow))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// How often a stream reads the store without being woken (events of other nodes).
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// The state of one live stream.
struct Follow {
    state: AppState,
    recorder: Arc<Recorder>,
    visibility: Visibility,
    filter: EventFilter,
    after: i64,
    wake: tokio::sync::watch::Receiver<i64>,
    /// Read and not sent yet, newest first.
    pending: Vec<Event>,
}

impl Follow {
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(event) = self.pending.pop() {
                let id = event.id.to_string();
                let data =
                    serde_json::to_string(&EventBody::from(event)).expect("an event serializes");
                return Some(SseEvent::default().id(id).data(data));
            }
            if let Err(error) = self.visibility.refresh(&self.state).await {
                tracing::warn!(?error, "event stream: cannot read the caller's pipelines");
            }
            let mut query = self.visibility.query(&self.filter, 500);
            query.after_id = Some(self.after);
            match self.recorder.store().list_events(&query).await {
                Ok(rows) if !rows.is_empty() => {
                    if let Err(error) = self.visibility.learn(&self.state, &rows).await {
                        tracing::warn!(?error, "event stream: cannot read the caller's pipelines");
                    }
                    self.after = rows.last().map_or(self.after, |e| e.id);
                    self.pending =
                        rows.into_iter().filter(|e| self.visibility.sees(e)).rev().collect();
                }
                Ok(_) => {
                    let _ = tokio::time::timeout(FOLLOW_EVERY, self.wake.changed()).await;
                }
                Err(error) => {
                    tracing::warn!(%error, "event stream: cannot read events");
                    tokio::time::sleep(FOLLOW_EVERY).await;
                }
            }
        }
    }
}

/// The latest unresolved problem of one pipeline.
#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineStatusBody {
    pub pipeline_id: String,
    #[schema(pattern = "^(warning|error)$")]
    pub severity: String,
    /// The kind of the latest unresolved problem.
    pub kind: String,
    pub message: String,
    pub time: String,
    pub event_id: i64,
}

/// The answer of `GET /api/v1/events/pipelines`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineStatusList {
    pub items: Vec<PipelineStatusBody>,
}

/// Events read to find unresolved problems.
const STATUS_SCAN: i64 = 5000;

/// The problem family of a kind and whether it opens (true) or resolves (false) it.
fn family(kind: &str) -> Option<(&'static str, bool)> {
    Some(match kind {
        "pipeline.deploy_failed" => ("deploy", true),
        "pipeline.deployed" | "pipeline.redeployed" | "pipeline.torn_down" => ("deploy", false),
        "worker.crash_looping" | "worker.oom_killed" => ("worker", true),
        "worker.recovered" => ("worker", false),
        "sink.failing" | "sink.secret_missing" => ("sink", true),
        "sink.recovered" => ("sink", false),
        "lag.data_age_over" => ("lag", true),
        "lag.data_age_recovered" => ("lag", false),
        "dead_letters.recorded" => ("dead_letters", true),
        "dead_letters.replayed" => ("dead_letters", false),
        _ => return None,
    })
}

/// Pipelines with an unresolved warning or error, for the console's badges (any API key;
/// the caller's readable pipelines). A problem is unresolved until the event that ends it:
/// a deploy failure until a deploy, a crash-looping worker until `worker.recovered`, a
/// failing sink until `sink.recovered`, data age until `lag.data_age_recovered`, dead letters
/// until they are replayed; a torn-down pipeline has none.
#[utoipa::path(
    get, path = "/api/v1/events/pipelines", tag = "events",
    responses(
        (status = 200, description = "Pipelines with an unresolved problem", body = PipelineStatusList),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 503, description = "This process records no events", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn pipeline_status(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
) -> Result<Json<PipelineStatusList>, ApiError> {
    query.expect_none()?;
    let store = recorder(&state)?.store().clone();
    let visibility = Visibility::of(&state, &caller.0).await?;
    let filter = EventFilter { min_severity: None, ..EventFilter::default() };
    let mut query = visibility.query(&filter, STATUS_SCAN);
    query.service = false;
    query.operator = false;
    let rows = store.list_events(&query).await?;
    // Newest first: the first event of each (pipeline, family) decides it.
    let mut decided: HashSet<(String, &'static str)> = HashSet::new();
    let mut worst: HashMap<String, Event> = HashMap::new();
    for event in rows.into_iter().filter(|e| visibility.sees(e)) {
        let Some(id) = event.pipeline_id.clone() else { continue };
        if event.kind == "pipeline.torn_down" || event.kind == "pipeline.deleted" {
            for family in ["deploy", "worker", "sink", "lag", "dead_letters"] {
                decided.insert((id.clone(), family));
            }
            continue;
        }
        let Some((family, opens)) = family(&event.kind) else { continue };
        if !decided.insert((id.clone(), family)) || !opens {
            continue;
        }
        let keep = worst.get(&id).is_none_or(|w| event.severity > w.severity);
        if keep {
            worst.insert(id, event);
        }
    }
    let mut items: Vec<PipelineStatusBody> = worst
        .into_values()
        .map(|event| PipelineStatusBody {
            pipeline_id: event.pipeline_id.clone().unwrap_or_default(),
            severity: event.severity.name().to_owned(),
            kind: event.kind,
            message: event.message,
            time: sluice_core::time::format(event.time),
            event_id: event.id,
        })
        .collect();
    items.sort_by(|a, b| a.pipeline_id.cmp(&b.pipeline_id));
    Ok(Json(PipelineStatusList { items }))
}
