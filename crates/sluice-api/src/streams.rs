//! Chain-stream ingest: operators' indexers push records into a stream as NDJSON.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use sluice_core::streams::{InvalidRecord, StreamRecord};
use sluice_core::validation::{Loc, Violation};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{PathParams, Query};
use crate::state::AppState;

/// Which variant of the stream to append to.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct IngestQuery {
    /// Append to the zerolag (pre-finality) stream; only where the catalog offers one.
    #[serde(default)]
    pub zerolag: bool,
}

/// `{"accepted": n}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct IngestBody {
    pub accepted: usize,
}

/// Append records to a chain stream (operator keys only). The body is NDJSON: one JSON
/// object per line (blank lines are ignored), each with the key and time fields its entity
/// defines (docs/streams.md), and no key twice in any object. Either every line is appended, durably, or — when any line is
/// malformed — none is, and the 422 lists each bad line as `["body", <line number>]`.
#[utoipa::path(
    post, path = "/api/v1/streams/{chain}/{entity}/records", tag = "streams",
    params(
        ("chain" = String, Path, description = "Chain, as in the catalog"),
        ("entity" = String, Path, description = "Entity, as in the catalog"),
        IngestQuery,
    ),
    request_body(content = String, content_type = "application/x-ndjson", description = "One JSON record per line"),
    responses(
        (status = 200, description = "Every record appended", body = IngestBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not an operator key", body = ErrorBody),
        (status = 404, description = "No such chain stream in the catalog", body = ErrorBody),
        (status = 413, description = "Body over the size limit", body = ErrorBody),
        (status = 422, description = "Malformed lines; nothing was appended", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn ingest(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    query: Query,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<IngestBody>, ApiError> {
    let chain = path.get("chain").to_owned();
    let entity = path.get("entity").to_owned();
    if !caller.0.is_operator {
        return Err(ApiError::Forbidden("stream ingest needs an operator key".to_owned()));
    }
    let mut params = query.parse()?;
    let zerolag = params.bool("zerolag").unwrap_or(false);
    params.finish()?;
    let body =
        body.map_err(|rejection| crate::body::read_error(&rejection, state.limits.max_body_bytes))?;
    let Some(entry) = state.catalog.find(&chain, &entity) else {
        return Err(ApiError::NotFound(format!("no chain stream {chain}.{entity} in the catalog")));
    };
    if zerolag && !entry.zerolag {
        return Err(ApiError::Validation(vec![Violation::value(
            &Loc::query("zerolag"),
            format!("{chain}.{entity} has no zerolag stream"),
        )]));
    }
    let records = parse_ndjson(&entity, &body)?;
    let accepted = state.runtime()?.ingest(&chain, &entity, zerolag, records).await?;
    Ok(Json(IngestBody { accepted }))
}

/// Checks every line as a record of `entity` ([`StreamRecord::parse`]); all problems are
/// reported together.
fn parse_ndjson(entity: &str, body: &[u8]) -> Result<Vec<StreamRecord>, ApiError> {
    let mut records = Vec::new();
    let mut violations = Vec::new();
    for (index, line) in body.split(|b| *b == b'\n').enumerate() {
        let line_number = index + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match StreamRecord::parse(entity, line) {
            Ok(record) => records.push(record),
            Err(error) => {
                let kind = match &error {
                    InvalidRecord::Json(_) => "value_error.json",
                    InvalidRecord::NotObject => "type_error.object",
                    InvalidRecord::DuplicateKey { .. } => "json_duplicate_key",
                    InvalidRecord::Key(_) | InvalidRecord::Time { .. } => "value_error.record",
                };
                violations.push(Violation::new(
                    &Loc::body().at(line_number),
                    kind,
                    format!("line {line_number}: {error}"),
                ));
            }
        }
    }
    if records.is_empty() && violations.is_empty() {
        violations.push(Violation::new(
            &Loc::body(),
            "missing",
            "the body holds no record: send one JSON object per line",
        ));
    }
    if violations.is_empty() { Ok(records) } else { Err(ApiError::Validation(violations)) }
}
