//! Datasets (docs/contract.md §Dataset endpoints) under `{base_url}/datasets`: create, list,
//! delete, add entries (by id or by name), delete entries, list entries, check an entry.
//!
//! A dataset belongs to the user whose key created it; for anyone else it does not exist
//! (404). Values are lowercased ([`sluice_core::filter_values::normalize`]) before they are
//! stored or looked up. Every committed change is told to [`AppState::dataset_listener`] (the
//! index behind `beam.contains`) before the response is sent; the store write and that call
//! run in their own task, so a client that hangs up mid-request cannot leave a committed
//! change unheard.
//!
//! An entry change carries up to [`MAX_VALUES_PER_REQUEST`] values, so the entry routes take
//! the larger body limit of bulk value changes ([`crate::state::Limits::max_filter_values_body_bytes`])
//! and deserialize the body straight into strings; only a body that fails that fast path is
//! walked as a JSON tree to say precisely what is wrong.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use sluice_core::datasets::Dataset;
use sluice_core::validation::{Fields, Loc, Violation, Violations};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::body::JsonBody;
use crate::bulk_values;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::filter_values::MAX_VALUE_BYTES;
use crate::params::{PathParams, Query};
use crate::services::{self, EntriesOp, dataset_not_found as not_found};
use crate::state::AppState;

/// Most values one request may add or delete (docs/contract.md §Limits).
pub const MAX_VALUES_PER_REQUEST: usize = 250_000;

/// Largest page of `GET …/entries` (docs/contract.md §Limits).
pub const MAX_PAGE_SIZE: i64 = 500_000;

/// Page size when `limit` is not given (docs/contract.md §Limits).
pub const DEFAULT_PAGE_SIZE: i64 = 10_000;

/// Longest dataset name, in characters.
pub const MAX_NAME_CHARS: usize = 255;

/// The one dataset type (docs/contract.md §Dataset).
pub const DATASET_TYPE: &str = "postgres";

/// A dataset as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct DatasetBody {
    pub id: String,
    /// Unique among the owner's datasets.
    pub name: String,
    /// Always `postgres`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[schema(format = DateTime)]
    pub created_at: String,
    /// Creation, or the last change that added or removed an entry.
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl From<&Dataset> for DatasetBody {
    fn from(dataset: &Dataset) -> Self {
        Self {
            id: dataset.id.clone(),
            name: dataset.name.clone(),
            kind: DATASET_TYPE,
            created_at: sluice_core::time::format(dataset.created_at),
            updated_at: sluice_core::time::format(dataset.updated_at),
        }
    }
}

/// Body of `POST {base_url}/datasets`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CreateDatasetRequest {
    /// 1 to 255 characters, unique among the caller's datasets (compared exactly).
    pub name: String,
    /// Optional; only `postgres` is accepted.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// Body of `POST …/datasets/{dataset_id}/entries` and `DELETE …/datasets/{dataset_id}/entries`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EntriesRequest {
    /// 1 to 250,000 values, lowercased before use; repeats count once.
    pub values: Vec<String>,
}

/// Body of `POST {base_url}/datasets/entries`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedEntriesRequest {
    /// Name of one of the caller's datasets.
    pub name: String,
    /// 1 to 250,000 values, lowercased before use; repeats count once.
    pub values: Vec<String>,
}

/// `{"count": n}`: entries added (values not in the dataset before) or removed.
#[derive(Debug, Serialize, ToSchema)]
pub struct CountBody {
    pub count: u64,
}

/// `{"exists": bool}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExistsBody {
    pub exists: bool,
}

/// One page of entries, ascending.
#[derive(Debug, Serialize, ToSchema)]
pub struct EntryPageBody {
    pub values: Vec<String>,
    /// The last value of this page: pass it as `cursor` for the next; `null` when no entry
    /// follows.
    pub cursor: Option<String>,
    /// Entries in the dataset.
    pub total_count: u64,
}

/// The caller's dataset `id`, or 404.
async fn owned(state: &AppState, caller: &Caller, id: &str) -> Result<Dataset, ApiError> {
    state.store.dataset(&caller.0.user_id, id).await?.ok_or_else(|| not_found(id))
}

/// The values of an entry change body, lowercased, with the `name` when `named`.
///
/// # Errors
/// 413 over the limit; 422 for a malformed body, an empty list, more than
/// [`MAX_VALUES_PER_REQUEST`] values or an over-long value.
fn read_entries(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
    named: bool,
) -> Result<(Option<String>, Vec<String>), ApiError> {
    let bytes = bulk_values::bytes(state, body)?;
    let (name, mut values) = parse_entries(&bytes, named)?;
    let loc = Loc::body().at("values");
    if values.is_empty() {
        return Err(bulk_values::too_short(&loc));
    }
    if values.len() > MAX_VALUES_PER_REQUEST {
        return Err(ApiError::Validation(vec![Violation::new(
            &loc,
            "too_long",
            format!(
                "List should have at most {MAX_VALUES_PER_REQUEST} items after validation, not {}: \
                 send at most 250,000 values per request",
                values.len()
            ),
        )]));
    }
    let errors = bulk_values::normalize_all(&mut values, &loc, "dataset");
    Ok(errors.finish((name, values))?)
}

/// `{"values": [string, …]}` (with `"name": string` when `named`), not yet normalised.
fn parse_entries(
    bytes: &[u8],
    named: bool,
) -> Result<(Option<String>, Vec<String>), Vec<Violation>> {
    bulk_values::parse(bytes, named)
}

/// Create a dataset, empty, owned by the caller.
#[utoipa::path(
    post, path = "/api/v1/beam/datasets",
    tag = "datasets",
    request_body = CreateDatasetRequest,
    responses(
        (status = 200, description = "The new dataset", body = DatasetBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 409, description = "The caller already has a dataset of this name", body = ErrorBody),
        (status = 422, description = "A bad body", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create_dataset(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    body: JsonBody,
) -> Result<Json<DatasetBody>, ApiError> {
    caller.require_pipelines()?;
    query.expect_none()?;
    let body = body.object()?;
    let mut errors = Violations::default();
    let mut fields = Fields::new(&body, Loc::body());
    let name = fields.required_str("name", &mut errors);
    if let Some(name) = name {
        let chars = name.chars().count();
        if chars == 0 || chars > MAX_NAME_CHARS {
            errors.push(Violation::value(
                &fields.loc("name"),
                format!(
                    "a dataset name has 1 to {MAX_NAME_CHARS} characters; this one has {chars}"
                ),
            ));
        }
    }
    // `type` may be sent, but only as the one type there is; it carries nothing to store.
    let _ = fields.optional_enum("type", &[DATASET_TYPE], &mut errors);
    fields.finish(&mut errors, |_| None);
    let name = errors.finish(name)?.unwrap_or_default().to_owned();

    let owner = caller.0.user_id.clone();
    let dataset = services::create_dataset(&state, owner, name, state.clock.now()).await?;
    tracing::info!(dataset_id = %dataset.id, name = ?dataset.name, owner = %dataset.owner_user_id, "dataset created");
    Ok(Json(DatasetBody::from(&dataset)))
}

/// List the caller's datasets, oldest first; `names` (repeatable) keeps only those names.
#[utoipa::path(
    get, path = "/api/v1/beam/datasets",
    tag = "datasets",
    params(
        ("names" = Option<Vec<String>>, Query, description = "Dataset names to keep; repeat for several (`?names=a&names=b`). Unknown names are ignored"),
    ),
    responses(
        (status = 200, description = "The caller's datasets", body = [DatasetBody]),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 422, description = "A malformed query", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_datasets(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
) -> Result<Json<Vec<DatasetBody>>, ApiError> {
    caller.require_pipelines()?;
    let mut params = query.parse()?;
    let names: Vec<String> = params.all("names").into_iter().map(str::to_owned).collect();
    params.finish()?;
    let datasets = state.store.list_datasets(&caller.0.user_id, &names).await?;
    Ok(Json(datasets.iter().map(DatasetBody::from).collect()))
}

/// Delete a dataset and every entry of it, irreversibly.
#[utoipa::path(
    delete, path = "/api/v1/beam/datasets/{dataset_id}",
    tag = "datasets",
    params(("dataset_id" = String, Path, description = "Dataset id")),
    responses(
        (status = 204, description = "Deleted; no body"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 404, description = "No such dataset of the caller's", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_dataset(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
) -> Result<StatusCode, ApiError> {
    let dataset_id = path.get("dataset_id").to_owned();
    caller.require_pipelines()?;
    // The dataset's 404 comes before the query's 422, as on every dataset route.
    owned(&state, &caller, &dataset_id).await?;
    query.expect_none()?;
    let owner = caller.0.user_id.clone();
    let dataset = services::delete_dataset(&state, owner, dataset_id).await?;
    tracing::info!(dataset_id = %dataset.id, entries = dataset.entry_count, "dataset deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// Adds `values` to (or removes them from) the caller's `dataset`, tells the listener, and
/// answers how many entries changed.
async fn change_entries(
    state: &AppState,
    dataset: Dataset,
    values: Vec<String>,
    op: EntriesOp,
) -> Result<Json<CountBody>, ApiError> {
    let given = values.len();
    let dataset_id = dataset.id.clone();
    let count =
        services::change_dataset_entries(state, dataset, values, op, state.clock.now()).await?;
    match op {
        EntriesOp::Add => {
            tracing::info!(%dataset_id, given, added = count, "dataset entries added")
        }
        EntriesOp::Remove => {
            tracing::info!(%dataset_id, given, removed = count, "dataset entries deleted");
        }
    }
    Ok(Json(CountBody { count }))
}

/// Adds (or deletes) the body's values as entries of the caller's dataset of the path. The
/// dataset's 404 comes before the query's and the body's 422, as on every dataset route.
async fn change_entries_by_id(
    state: &AppState,
    caller: &Caller,
    query: Query,
    path: &PathParams,
    body: Result<Bytes, BytesRejection>,
    op: EntriesOp,
) -> Result<Json<CountBody>, ApiError> {
    let dataset_id = path.get("dataset_id").to_owned();
    caller.require_pipelines()?;
    let dataset = owned(state, caller, &dataset_id).await?;
    query.expect_none()?;
    let (_, values) = read_entries(state, body, false)?;
    change_entries(state, dataset, values, op).await
}

/// Add entries to a dataset; values already in it are ignored.
#[utoipa::path(
    post, path = "/api/v1/beam/datasets/{dataset_id}/entries",
    tag = "datasets",
    params(("dataset_id" = String, Path, description = "Dataset id")),
    request_body = EntriesRequest,
    responses(
        (status = 200, description = "How many values were new", body = CountBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 404, description = "No such dataset of the caller's", body = ErrorBody),
        (status = 413, description = "Body over the bulk-values size limit", body = ErrorBody),
        (status = 422, description = "A bad body, or more than 250,000 values", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn add_entries_by_id(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CountBody>, ApiError> {
    change_entries_by_id(&state, &caller, query, &path, body, EntriesOp::Add).await
}

/// Add entries to the caller's dataset of a given name; values already in it are ignored.
#[utoipa::path(
    post, path = "/api/v1/beam/datasets/entries",
    tag = "datasets",
    request_body = NamedEntriesRequest,
    responses(
        (status = 200, description = "How many values were new", body = CountBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 404, description = "The caller has no dataset of this name", body = ErrorBody),
        (status = 413, description = "Body over the bulk-values size limit", body = ErrorBody),
        (status = 422, description = "A bad body, or more than 250,000 values", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn add_entries_by_name(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CountBody>, ApiError> {
    caller.require_pipelines()?;
    query.expect_none()?;
    let (name, values) = read_entries(&state, body, true)?;
    let name = name.unwrap_or_default();
    let dataset = state.store.dataset_by_name(&caller.0.user_id, &name).await?;
    let dataset =
        dataset.ok_or_else(|| ApiError::NotFound(format!("Dataset named {name} not found")))?;
    change_entries(&state, dataset, values, EntriesOp::Add).await
}

/// Delete entries from a dataset; values not in it are ignored. Applies immediately.
#[utoipa::path(
    delete, path = "/api/v1/beam/datasets/{dataset_id}/entries",
    tag = "datasets",
    params(("dataset_id" = String, Path, description = "Dataset id")),
    request_body = EntriesRequest,
    responses(
        (status = 200, description = "How many entries were removed", body = CountBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 404, description = "No such dataset of the caller's", body = ErrorBody),
        (status = 413, description = "Body over the bulk-values size limit", body = ErrorBody),
        (status = 422, description = "A bad body, or more than 250,000 values", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_entries(
    State(state): State<AppState>,
    caller: Caller,
    query: Query,
    path: PathParams,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CountBody>, ApiError> {
    change_entries_by_id(&state, &caller, query, &path, body, EntriesOp::Remove).await
}

/// List a dataset's entries in ascending (bytewise) order.
///
/// The cursor is the last value of the previous page; the next page starts after it.
#[utoipa::path(
    get, path = "/api/v1/beam/datasets/{dataset_id}/entries",
    tag = "datasets",
    params(
        ("dataset_id" = String, Path, description = "Dataset id"),
        ("cursor" = Option<String>, Query, description = "`cursor` of the previous page (its last value); omit for the first page"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 500000, description = "Page size, 1 to 500,000; default 10,000"),
    ),
    responses(
        (status = 200, description = "One page of entries", body = EntryPageBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 404, description = "No such dataset of the caller's", body = ErrorBody),
        (status = 422, description = "A bad limit", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_entries(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    query: Query,
) -> Result<Json<EntryPageBody>, ApiError> {
    let dataset_id = path.get("dataset_id").to_owned();
    caller.require_pipelines()?;
    let mut params = query.parse()?;
    let limit = params.int("limit", 1, MAX_PAGE_SIZE);
    params.finish()?;
    let limit = u32::try_from(limit.unwrap_or(DEFAULT_PAGE_SIZE)).unwrap_or(u32::MAX);
    // An empty cursor asks for the first page, as no cursor does.
    let cursor = params.raw("cursor").filter(|c| !c.is_empty());
    let page = state
        .store
        .list_dataset_entries(&caller.0.user_id, &dataset_id, cursor, limit)
        .await?
        .ok_or_else(|| not_found(&dataset_id))?;
    Ok(Json(EntryPageBody {
        values: page.values,
        cursor: page.next,
        total_count: page.total_count,
    }))
}

/// Whether a value is an entry of a dataset; the value is lowercased first, as entries are.
#[utoipa::path(
    get, path = "/api/v1/beam/datasets/{dataset_id}/entries/check",
    tag = "datasets",
    params(
        ("dataset_id" = String, Path, description = "Dataset id"),
        ("value" = String, Query, description = "The value to look up"),
    ),
    responses(
        (status = 200, description = "Whether the value is an entry", body = ExistsBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Pipeline service not enabled", body = ErrorBody),
        (status = 404, description = "No such dataset of the caller's", body = ErrorBody),
        (status = 422, description = "`value` missing", body = ValidationErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn check_entry(
    State(state): State<AppState>,
    caller: Caller,
    path: PathParams,
    query: Query,
) -> Result<Json<ExistsBody>, ApiError> {
    let dataset_id = path.get("dataset_id").to_owned();
    caller.require_pipelines()?;
    let value = bulk_values::value_to_check(query)?;
    let owner = &caller.0.user_id;
    let exists = if value.len() > MAX_VALUE_BYTES {
        // Too long to be stored, so not an entry; the dataset must still be the caller's.
        owned(&state, &caller, &dataset_id).await.map(|_| false)?
    } else {
        state
            .store
            .has_dataset_entry(owner, &dataset_id, &value)
            .await?
            .ok_or_else(|| not_found(&dataset_id))?
    };
    Ok(Json(ExistsBody { exists }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_and_slow_paths_agree_on_valid_bodies() {
        assert_eq!(parse_entries(br#" {"values": ["a", "B"]} "#, false).unwrap().1, ["a", "B"]);
        let (name, values) = parse_entries(br#"{"values": ["b"], "name": "w"}"#, true).unwrap();
        assert_eq!((name.as_deref(), values), (Some("w"), vec!["b".to_owned()]));
        // Repeated keys fail serde's derive, and the slow path refuses them too.
        let refused = parse_entries(br#"{"values": ["a"], "values": ["c"]}"#, false).unwrap_err();
        assert_eq!(refused[0].kind, "json_duplicate_key");
    }

    #[test]
    fn malformed_bodies_are_located_precisely() {
        let kinds = |body: &[u8], named: bool| {
            parse_entries(body, named)
                .unwrap_err()
                .into_iter()
                .map(|v| (serde_json::to_value(&v.loc).unwrap(), v.kind))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            kinds(br#"{"values": ["a", 1]}"#, false),
            [(serde_json::json!(["body", "values", 1]), "string_type".to_owned())]
        );
        assert_eq!(
            kinds(br#"{"values": ["a"]}"#, true),
            [(serde_json::json!(["body", "name"]), "missing".to_owned())]
        );
        assert_eq!(
            kinds(br#"{"name": "w", "values": ["a"]}"#, false),
            [(serde_json::json!(["body", "name"]), "extra_forbidden".to_owned())]
        );
        assert_eq!(kinds(br#"["a"]"#, false)[0].1, "dict_type");
        assert_eq!(kinds(br#"{"name": 3, "values": "a"}"#, true).len(), 2);
    }
}
