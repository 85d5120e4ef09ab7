//! Filter values of a set-filter (`redis_set_filter`) transform, under
//! `{base_url}/{config_id}/transforms/{transform_uid}/filter-values`: list, add, replace,
//! remove, check membership, count.
//!
//! Values are normalised with [`sluice_core::filter_values::normalize`] (lowercase) before
//! they are stored or looked up. The transform must be a set filter of the *stored*
//! configuration (what `GET {base_url}/{config_id}` shows): an unknown uid is 404, a script
//! transform 422. Every committed change is then told to [`AppState::filter_listener`], so
//! running pipelines follow at once.
//!
//! A change may carry a million values (~45 MB of JSON), so these routes have their own body
//! limit ([`crate::state::Limits::max_filter_values_body_bytes`]) and the body is deserialized
//! straight into `Vec<String>`; only a body that fails that fast path is walked again as a
//! JSON tree to say precisely what is wrong.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use serde::{Deserialize, Serialize};
use sluice_core::filter_values::normalize;
use sluice_core::permission::Permission;
use sluice_core::pipeline::{Pipeline, Transform};
use sluice_core::validation::{Loc, Violation};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::bulk_values;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::{PathParams, Query};
use crate::services::{self, ValuesChange};
use crate::state::AppState;

/// Largest page of `GET …/filter-values` (docs/contract.md §Limits).
pub const MAX_PAGE_SIZE: i64 = 10_000;

/// Page size when `count` is not given.
pub const DEFAULT_PAGE_SIZE: i64 = 100;

/// Longest filter value, in bytes of UTF-8 after lowercasing. Addresses, topics and symbols
/// are far shorter; the cap keeps every value within what a PostgreSQL index entry can hold.
pub const MAX_VALUE_BYTES: usize = 1024;

/// Body of `POST`, `PUT` and `DELETE …/filter-values`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ValuesRequest {
    /// Values, matched in lowercase; repeats count once. At least one, except for `PUT`,
    /// where an empty list clears the set.
    pub values: Vec<String>,
}

/// One page of values, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct ValuePage {
    pub values: Vec<String>,
    /// Pass as `cursor` to get the next page; `null` when no value follows.
    pub cursor: Option<i64>,
    /// Values in the set.
    pub total_count: u64,
}

/// `{"added": n}`: values that were not in the set before.
#[derive(Debug, Serialize, ToSchema)]
pub struct AddedBody {
    pub added: u64,
}

/// `{"removed": n}`: values that were in the set.
#[derive(Debug, Serialize, ToSchema)]
pub struct RemovedBody {
    pub removed: u64,
}

/// `{"count": n}`: values in the set.
#[derive(Debug, Serialize, ToSchema)]
pub struct CountBody {
    pub count: u64,
}

/// Whether one value is in the set.
#[derive(Debug, Serialize, ToSchema)]
pub struct MembershipBody {
    /// The value looked up, lowercased as it is matched.
    pub value: String,
    pub is_member: bool,
}

/// Loads the pipeline (404 unless the caller reads it, 403 without `needed`) and checks that
/// `uid` is one of its set filters (404 when absent, 422 when a script).
async fn check_set_filter(
    state: &AppState,
    caller: &Caller,
    config_id: &str,
    uid: &str,
    needed: Permission,
) -> Result<Pipeline, ApiError> {
    let (pipeline, _) = caller.pipeline(state, config_id, needed).await?;
    match pipeline.pipeline_config.transforms.iter().find(|t| t.uid() == uid) {
        None => {
            Err(ApiError::NotFound(format!("Transform {uid} not found in pipeline {config_id}")))
        }
        Some(Transform::Script { .. }) => Err(ApiError::Validation(vec![Violation::value(
            &Loc::default().at("path").at("transform_uid"),
            format!(
                "transform {uid} is a v8 script; only redis_set_filter transforms have filter values"
            ),
        )])),
        Some(Transform::SetFilter { .. }) => Ok(pipeline),
    }
}

/// Lowercases in place; the same result as [`normalize`] without a new allocation for the
/// (usual) ASCII value.
pub(crate) fn normalize_in_place(value: &mut String) {
    if value.is_ascii() {
        value.make_ascii_lowercase();
    } else {
        *value = normalize(value);
    }
}

/// The pipeline id and transform uid of the request's path, once [`check_set_filter`] has
/// passed with `needed`: every filter-values route starts with this.
pub(crate) async fn set_filter_of(
    state: &AppState,
    caller: &Caller,
    path: &PathParams,
    needed: Permission,
) -> Result<(String, String), ApiError> {
    let (config_id, transform_uid, _) = set_filter_in(state, caller, path, needed).await?;
    Ok((config_id, transform_uid))
}

/// [`set_filter_of`], with the stored pipeline.
async fn set_filter_in(
    state: &AppState,
    caller: &Caller,
    path: &PathParams,
    needed: Permission,
) -> Result<(String, String, Pipeline), ApiError> {
    let config_id = path.get("config_id").to_owned();
    let transform_uid = path.get("transform_uid").to_owned();
    let pipeline = check_set_filter(state, caller, &config_id, &transform_uid, needed).await?;
    Ok((config_id, transform_uid, pipeline))
}

/// Applies one change request (`POST`, `PUT` or `DELETE`) to the set filter of the path:
/// checks edit permission, refuses a query, reads the body (at least one value except for
/// `PUT`), applies it and logs it. Answers what [`services::change_filter_values`] counts.
async fn change_values(
    state: &AppState,
    caller: &Caller,
    query: Query,
    path: &PathParams,
    body: Result<Bytes, BytesRejection>,
    change: ValuesChange,
) -> Result<u64, ApiError> {
    let (config_id, transform_uid, pipeline) =
        set_filter_in(state, caller, path, Permission::Edit).await?;
    query.expect_none()?;
    let values = read_values(state, body, change != ValuesChange::Replace)?;
    let given = values.len();
    let org_id = caller.0.org_id.clone();
    let (id, uid) = (config_id.clone(), transform_uid.clone());
    let source = pipeline.pipeline_config.source;
    let count =
        services::change_filter_values(state, org_id, id, uid, values, change, source).await?;
    match change {
        ValuesChange::Add => {
            tracing::info!(config_id = %config_id, transform_uid = ?transform_uid, given, added = count, "filter values added");
        }
        ValuesChange::Replace => {
            tracing::info!(config_id = %config_id, transform_uid = ?transform_uid, count, "filter values replaced");
        }
        ValuesChange::Remove => {
            tracing::info!(config_id = %config_id, transform_uid = ?transform_uid, given, removed = count, "filter values removed");
        }
    }
    Ok(count)
}

/// The normalised values of a change body.
///
/// # Errors
/// 413 over the limit; 422 for a body that is not `{"values": [string, …]}`, an empty list
/// when `at_least_one`, or an over-long value.
fn read_values(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
    at_least_one: bool,
) -> Result<Vec<String>, ApiError> {
    let bytes = bulk_values::bytes(state, body)?;
    let mut values = parse_values(&bytes)?;
    let loc = Loc::body().at("values");
    if at_least_one && values.is_empty() {
        return Err(bulk_values::too_short(&loc));
    }
    let errors = bulk_values::normalize_all(&mut values, &loc, "filter");
    Ok(errors.finish(values)?)
}

/// `{"values": [string, …]}` as strings, not yet normalised.
fn parse_values(bytes: &[u8]) -> Result<Vec<String>, Vec<Violation>> {
    bulk_values::parse(bytes, false).map(|(_, values)| values)
}

/// List the values of a set filter, oldest first (read permission).
///
/// The cursor is an opaque integer: pass the `cursor` of one page to get the next. Paging
/// while others add values neither skips nor repeats a value; values added meanwhile appear
/// on later pages.
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values",
    tag = "filter-values",
    params(
        ("config_id" = String, Path, description = "Pipeline id"),
        ("transform_uid" = String, Path, description = "Uid of a redis_set_filter transform"),
        ("cursor" = Option<i64>, Query, description = "`cursor` of the previous page; omit for the first page"),
        ("count" = Option<i64>, Query, minimum = 1, maximum = 10000, description = "Page size, 1 to 10,000; default 100"),
    ),
    responses(
        (status = 200, description = "One page of values", body = ValuePage),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 404, description = "No such pipeline (or no read permission) or transform", body = ErrorBody),
        (status = 422, description = "Not a set filter, or a bad cursor or count", body = ValidationErrorBody),
        (status = 503, description = "The set store (Redis, with --sets) is not reachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_filter_values(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    query: Query,
) -> Result<Json<ValuePage>, ApiError> {
    let (config_id, transform_uid) =
        set_filter_of(&state, &caller, &path, Permission::Read).await?;
    let mut params = query.parse()?;
    let cursor = params.int("cursor", 0, i64::MAX);
    let count = params.int("count", 1, MAX_PAGE_SIZE);
    params.finish()?;
    let limit = u32::try_from(count.unwrap_or(DEFAULT_PAGE_SIZE)).unwrap_or(u32::MAX);
    let (id, uid) = (&config_id, &transform_uid);
    let page = state.store.list_filter_values(id, uid, cursor, limit).await?;
    let total_count = state.store.filter_value_count(id, uid).await?;
    Ok(Json(ValuePage { values: page.values, cursor: page.next, total_count }))
}

/// Add values to a set filter; values already present are ignored (edit permission).
#[utoipa::path(
    post, path = "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values",
    tag = "filter-values",
    params(
        ("config_id" = String, Path, description = "Pipeline id"),
        ("transform_uid" = String, Path, description = "Uid of a redis_set_filter transform"),
    ),
    request_body = ValuesRequest,
    responses(
        (status = 200, description = "How many values were new", body = AddedBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not edit permission", body = ErrorBody),
        (status = 404, description = "No such pipeline (or no read permission) or transform", body = ErrorBody),
        (status = 413, description = "Body over the filter-values size limit", body = ErrorBody),
        (status = 422, description = "Not a set filter, or a bad body", body = ValidationErrorBody),
        (status = 503, description = "The set store (Redis, with --sets) is not reachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn add_filter_values(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AddedBody>, ApiError> {
    let added = change_values(&state, &caller, query, &path, body, ValuesChange::Add).await?;
    Ok(Json(AddedBody { added }))
}

/// Replace every value of a set filter at once; an empty list clears it (edit permission).
#[utoipa::path(
    put, path = "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values",
    tag = "filter-values",
    params(
        ("config_id" = String, Path, description = "Pipeline id"),
        ("transform_uid" = String, Path, description = "Uid of a redis_set_filter transform"),
    ),
    request_body = ValuesRequest,
    responses(
        (status = 200, description = "Values in the set now", body = CountBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not edit permission", body = ErrorBody),
        (status = 404, description = "No such pipeline (or no read permission) or transform", body = ErrorBody),
        (status = 413, description = "Body over the filter-values size limit", body = ErrorBody),
        (status = 422, description = "Not a set filter, or a bad body", body = ValidationErrorBody),
        (status = 503, description = "The set store (Redis, with --sets) is not reachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn replace_filter_values(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CountBody>, ApiError> {
    let count = change_values(&state, &caller, query, &path, body, ValuesChange::Replace).await?;
    Ok(Json(CountBody { count }))
}

/// Remove values from a set filter; values not in it are ignored (edit permission).
#[utoipa::path(
    delete, path = "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values",
    tag = "filter-values",
    params(
        ("config_id" = String, Path, description = "Pipeline id"),
        ("transform_uid" = String, Path, description = "Uid of a redis_set_filter transform"),
    ),
    request_body = ValuesRequest,
    responses(
        (status = 200, description = "How many values were removed", body = RemovedBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Read but not edit permission", body = ErrorBody),
        (status = 404, description = "No such pipeline (or no read permission) or transform", body = ErrorBody),
        (status = 413, description = "Body over the filter-values size limit", body = ErrorBody),
        (status = 422, description = "Not a set filter, or a bad body", body = ValidationErrorBody),
        (status = 503, description = "The set store (Redis, with --sets) is not reachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn remove_filter_values(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<RemovedBody>, ApiError> {
    let removed = change_values(&state, &caller, query, &path, body, ValuesChange::Remove).await?;
    Ok(Json(RemovedBody { removed }))
}

/// Whether a value is in a set filter, now or, with `at`, at a past time or block (from the
/// set history); the value is lowercased first, as records' values are (read permission).
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values/check",
    tag = "filter-values",
    params(
        ("config_id" = String, Path, description = "Pipeline id"),
        ("transform_uid" = String, Path, description = "Uid of a redis_set_filter transform"),
        ("value" = String, Query, description = "The value to look up"),
        ("at" = Option<String>, Query, description = "A past point: an RFC 3339 time, or a block (slot) number of the source stream; omit for now"),
    ),
    responses(
        (status = 200, description = "The lowercased value and whether it is in the set (at `at`)", body = MembershipBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 404, description = "No such pipeline (or no read permission) or transform", body = ErrorBody),
        (status = 422, description = "Not a set filter, `value` missing, `at` malformed, or `at` before the set history's reach", body = ValidationErrorBody),
        (status = 503, description = "The set store (Redis, with --sets) is not reachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn check_filter_value(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    query: Query,
) -> Result<Json<MembershipBody>, ApiError> {
    let (config_id, transform_uid) =
        set_filter_of(&state, &caller, &path, Permission::Read).await?;
    let (value, at) = crate::set_history::value_and_point(query)?;
    let (id, uid) = (config_id.as_str(), transform_uid.as_str());
    // A value too long to be stored cannot be a member (nor have been one).
    let is_member = match at {
        _ if value.len() > MAX_VALUE_BYTES => false,
        None => state.store.has_filter_value(id, uid, &value).await?,
        Some(at) => crate::set_history::was_member(&state, id, uid, &value, at).await?,
    };
    Ok(Json(MembershipBody { value, is_member }))
}

/// Number of values in a set filter (read permission).
#[utoipa::path(
    get, path = "/api/v1/beam/{config_id}/transforms/{transform_uid}/filter-values/count",
    tag = "filter-values",
    params(
        ("config_id" = String, Path, description = "Pipeline id"),
        ("transform_uid" = String, Path, description = "Uid of a redis_set_filter transform"),
    ),
    responses(
        (status = 200, description = "Values in the set", body = CountBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 404, description = "No such pipeline (or no read permission) or transform", body = ErrorBody),
        (status = 422, description = "Not a set filter", body = ValidationErrorBody),
        (status = 503, description = "The set store (Redis, with --sets) is not reachable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn count_filter_values(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<Json<CountBody>, ApiError> {
    let (config_id, transform_uid) =
        set_filter_of(&state, &caller, &path, Permission::Read).await?;
    query.expect_none()?;
    let count = state.store.filter_value_count(&config_id, &transform_uid).await?;
    Ok(Json(CountBody { count }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_normalisation_matches_normalize() {
        for text in ["0xABcd", "already", "ÄÖÜ-Straße", "İstanbul", "ΣΑΣ", ""] {
            let mut value = text.to_owned();
            normalize_in_place(&mut value);
            assert_eq!(value, normalize(text), "{text}");
        }
    }

    #[test]
    fn fast_and_slow_paths_agree_on_valid_bodies() {
        assert_eq!(parse_values(br#" {"values": ["a", "B"]} "#).unwrap(), ["a", "B"]);
        // Repeated keys fail serde's derive, and the slow path refuses them too.
        let refused = parse_values(br#"{"values": ["a"], "values": ["b"]}"#).unwrap_err();
        assert_eq!(refused[0].kind, "json_duplicate_key");
    }

    #[test]
    fn malformed_bodies_are_located_precisely() {
        let kinds = |body: &[u8]| {
            parse_values(body)
                .unwrap_err()
                .into_iter()
                .map(|v| (serde_json::to_value(&v.loc).unwrap(), v.kind))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            kinds(br#"{"values": ["a", 1, "c", null]}"#),
            [
                (serde_json::json!(["body", "values", 1]), "string_type".to_owned()),
                (serde_json::json!(["body", "values", 3]), "string_type".to_owned()),
            ]
        );
        assert_eq!(kinds(br#"[["a"]]"#)[0].1, "dict_type");
        assert_eq!(kinds(br#"{"values": null}"#)[0].1, "missing");
        assert_eq!(kinds(br#"{"values": "a"}"#)[0].1, "list_type");
        assert_eq!(kinds(b"{\"values\": [\"a\"]").first().unwrap().1, "json_invalid");
        assert_eq!(
            kinds(br#"{"values": [], "value": []}"#),
            [(serde_json::json!(["body", "value"]), "extra_forbidden".to_owned())]
        );
    }
}
