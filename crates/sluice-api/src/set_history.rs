//! The history of a set filter's values (docs/set-filter.md, "Set history"):
//! `GET …/filter-values/changes` pages through the recorded changes, and
//! `GET …/filter-values/check?value=X&at=T` answers membership at a past time or block.
//!
//! The store records every change in the change's own transaction
//! ([`sluice_store::SetHistoryStore`]); this module parses and renders.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sluice_core::filter_values::normalize;
use sluice_core::permission::Permission;
use sluice_core::validation::{Loc, Violation};
use sluice_store::{HistoryPoint, PastMembership, Reach, SetChange};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::filter_values::set_filter_of;
use crate::params::{PathParams, Query};
use crate::state::AppState;

/// Largest page of `GET …/filter-values/changes`.
pub const MAX_CHANGES_PAGE: i64 = 1_000;

/// Page size of `GET …/filter-values/changes` when `count` is not given.
pub const DEFAULT_CHANGES_PAGE: i64 = 100;

/// Kind of a `history_out_of_range` violation: `at` is before what the history reaches.
pub const OUT_OF_RANGE: &str = "history_out_of_range";

/// One recorded change of a set.
#[derive(Debug, Serialize, ToSchema)]
pub struct SetChangeBody {
    /// Grows with every change; pass the last one seen as `cursor` for older changes.
    pub id: i64,
    /// When the change was made (and took effect).
    pub changed_at: DateTime<Utc>,
    /// `add` (`POST`, or a pipeline's inline `set_values`), `remove` (`DELETE`) or `replace`
    /// (`PUT`).
    #[schema(example = "add")]
    pub kind: String,
    /// Values in the request, repeats included.
    pub values_given: u64,
    /// Values that were not in the set before.
    pub added: u64,
    /// Values that were in the set and are not after.
    pub removed: u64,
    /// Values in the set after the change.
    pub count_after: u64,
    /// The source stream's head when the change was made: the highest block (slot) ingested
    /// into it by this server; the change applies to later blocks. `null` when the server
    /// that made the change ingests no such chain (push endpoint, demo feed, Kafka source).
    pub block: Option<i64>,
    /// With `values=true`: the values the change added.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub added_values: Option<Vec<String>>,
    /// With `values=true`: the values the change removed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removed_values: Option<Vec<String>>,
}

impl From<SetChange> for SetChangeBody {
    fn from(change: SetChange) -> Self {
        let (added_values, removed_values) = match change.values {
            Some(values) => (Some(values.added), Some(values.removed)),
            None => (None, None),
        };
        Self {
            id: change.id,
            changed_at: change.changed_at,
            kind: change.kind.as_str().to_owned(),
            values_given: change.given,
            added: change.added,
            removed: change.removed,
            count_after: change.count_after,
            block: change.position,
            added_values,
            removed_values,
        }
    }
}

/// One page of changes, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct SetChangePageBody {
    pub changes: Vec<SetChangeBody>,
    /// Pass as `cursor` to get the next (older) page; `null` when no change is older.
    pub cursor: Option<i64>,
}

/// The changes of a set filter's values, newest first (read permission).
///
/// Changes older than the server's set-history retention (90 days unless configured) are
/// gone.
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values/changes",
    tag = "filter-values",
    params(
        ("config_id" = String, Path, description = "Pipeline id"),
        ("transform_uid" = String, Path, description = "Uid of a redis_set_filter transform"),
        ("cursor" = Option<i64>, Query, minimum = 1, description = "`cursor` of the previous page; omit for the newest changes"),
        ("count" = Option<i64>, Query, minimum = 1, maximum = 1000, description = "Page size, 1 to 1,000; default 100"),
        ("values" = Option<bool>, Query, description = "Include each change's added and removed values; default false"),
    ),
    responses(
        (status = 200, description = "One page of changes, newest first", body = SetChangePageBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 404, description = "No such pipeline (or no read permission) or transform", body = ErrorBody),
        (status = 422, description = "Not a set filter, or a bad cursor, count or values", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_set_changes(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    query: Query,
) -> Result<Json<SetChangePageBody>, ApiError> {
    let (config_id, transform_uid) =
        set_filter_of(&state, &caller, &path, Permission::Read).await?;
    let mut params = query.parse()?;
    let cursor = params.int("cursor", 1, i64::MAX);
    let count = params.int("count", 1, MAX_CHANGES_PAGE);
    let values = params.bool("values").unwrap_or(false);
    params.finish()?;
    let limit = u32::try_from(count.unwrap_or(DEFAULT_CHANGES_PAGE)).unwrap_or(u32::MAX);
    let page = state.store.set_changes(&config_id, &transform_uid, cursor, limit, values).await?;
    Ok(Json(SetChangePageBody {
        changes: page.changes.into_iter().map(SetChangeBody::from).collect(),
        cursor: page.next,
    }))
}

/// The `value` (lowercased) and optional `at` of a membership check.
///
/// # Errors
/// 422 when the query is malformed, has other parameters, no `value`, or an `at` that is
/// neither an RFC 3339 time nor a block number.
pub(crate) fn value_and_point(query: Query) -> Result<(String, Option<HistoryPoint>), ApiError> {
    let mut params = query.parse()?;
    let value = params.required_string("value", 0);
    let at = match params.raw("at").map(str::to_owned) {
        None => None,
        Some(text) => match parse_point(&text) {
            Some(point) => Some(point),
            None => {
                params.reject(
                    "at",
                    "value_error",
                    "Value error, `at` must be an RFC 3339 time (2026-11-21T12:00:00Z) or a block number (0 or more)",
                );
                None
            }
        },
    };
    params.finish()?;
    Ok((normalize(&value.unwrap_or_default()), at))
}

/// A block number (digits only) or an RFC 3339 time.
fn parse_point(text: &str) -> Option<HistoryPoint> {
    if !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()) {
        return text.parse::<i64>().ok().map(HistoryPoint::Block);
    }
    DateTime::parse_from_rfc3339(text).ok().map(|time| HistoryPoint::Time(time.to_utc()))
}

/// Whether `value` was in the set at `at`.
///
/// # Errors
/// 422 `history_out_of_range` at `["query", "at"]` when the history does not reach `at`; a
/// store failure.
pub(crate) async fn was_member(
    state: &AppState,
    config_id: &str,
    transform_uid: &str,
    value: &str,
    at: HistoryPoint,
) -> Result<bool, ApiError> {
    match state.store.was_filter_value(config_id, transform_uid, value, at).await? {
        PastMembership::Known(member) => Ok(member),
        PastMembership::BeyondHistory(reach) => {
            let msg = match reach {
                Reach::Time(time) => format!(
                    "the set history reaches back to {}; `at` is before it",
                    sluice_core::time::format(time)
                ),
                Reach::Block(block) => {
                    format!("the set history reaches back to block {block}; `at` is before it")
                }
                Reach::NoBlock => "the set history has no block positions that reach `at`: the \
                    changes before its horizon have none; ask with a time instead"
                    .to_owned(),
            };
            let loc = Loc::query("at");
            Err(ApiError::Validation(vec![Violation::new(&loc, OUT_OF_RANGE, msg)]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_blocks_or_rfc3339_times() {
        assert_eq!(parse_point("0"), Some(HistoryPoint::Block(0)));
        assert_eq!(parse_point("19000000"), Some(HistoryPoint::Block(19_000_000)));
        let time = DateTime::parse_from_rfc3339("2026-11-21T12:00:00Z").unwrap().to_utc();
        assert_eq!(parse_point("2026-11-21T13:00:00+01:00"), Some(HistoryPoint::Time(time)));
        for bad in ["", "-1", "1.5", "99999999999999999999", "yesterday", "2026-11-21"] {
            assert_eq!(parse_point(bad), None, "{bad}");
        }
    }
}
