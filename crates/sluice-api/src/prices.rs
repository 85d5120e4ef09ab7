//! Token prices under `/api/v1/developer/prices`: the latest price of up to 200 tokens and
//! the price history of up to 50 (docs/contract.md §Token price endpoints, docs/prices.md).
//!
//! Bodies are walked as JSON so that every problem is reported at once with its `loc`. The
//! history endpoint also takes the legacy single-token body
//! `{chain, token_address, start_timestamp, end_timestamp, time_granularity}` and answers it
//! with the legacy flat rows.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use sluice_core::prices::{Granularity, TokenRef};
use sluice_core::validation::{Fields, Loc, Violation, Violations, as_array, one_of};
use sluice_prices::{HistoryPage, HistoryQuery, LatestPrice, PriceError, PriceService};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, ValidationErrorBody};
use crate::params::Query;
use crate::state::AppState;

/// Most tokens of one latest-prices request (docs/contract.md §Limits).
pub const MAX_LATEST_TOKENS: usize = 200;

/// Most tokens of one history request (docs/contract.md §Limits).
pub const MAX_HISTORY_TOKENS: usize = 50;

/// One token to price.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenAddress {
    /// Lowercase chain name, e.g. `base`, `solana`, `hyperliquid`.
    pub chain: String,
    /// Token contract address, Solana mint, or Hyperliquid coin.
    pub token_address: String,
}

/// Query of `POST /api/v1/developer/prices`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LatestQuery {
    /// Add `total_liquidity_usd` to each item.
    #[param(default = false)]
    pub with_liquidity_info: Option<bool>,
}

/// A token's latest price: from the most recent completed minute with trades.
#[derive(Debug, Serialize, ToSchema)]
pub struct LatestPriceItem {
    /// Time of the last trade of that minute.
    pub timestamp: String,
    pub chain: String,
    pub address: String,
    pub decimals: u32,
    /// Volume-weighted average price of the minute, USD.
    pub price: f64,
    pub open: f64,
    pub high: f64,
    pub close: f64,
    pub low: f64,
    /// Only with `with_liquidity_info=true`: Σ over the token's pools of its latest reserve
    /// × `price`; `null` when no pool is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_liquidity_usd: Option<Option<f64>>,
}

/// `{"items": [...], "cursor": null}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct LatestPricesBody {
    pub items: Vec<LatestPriceItem>,
    /// Always `null`: every item fits in one answer.
    pub cursor: Option<String>,
}

/// Body of `POST /api/v1/developer/prices/history`.
#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryRequest {
    /// Up to 50 tokens.
    pub addresses: Vec<TokenAddress>,
    /// `15s`, `1m`, `5m`, `1h` or `1d`.
    pub time_granularity: String,
    /// Windows whose start is at or after this time (RFC 3339) …
    pub start_timestamp: String,
    /// … and before this one.
    pub end_timestamp: String,
}

/// Query of `POST /api/v1/developer/prices/history`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryParams {
    /// The `cursor` of the previous page.
    pub cursor: Option<String>,
}

/// One window of a price history.
#[derive(Debug, Serialize, ToSchema)]
pub struct PricePointItem {
    /// Window start.
    pub timestamp: String,
    /// Volume-weighted average price of the window.
    pub price: f64,
    pub open: f64,
    pub high: f64,
    pub close: f64,
    pub low: f64,
}

/// A token's windows on this page.
#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryItem {
    pub mint: String,
    pub chain: String,
    pub decimals: u32,
    pub prices: Vec<PricePointItem>,
}

/// A legacy history row (answer to the single-token body).
#[derive(Debug, Serialize, ToSchema)]
pub struct LegacyHistoryRow {
    pub mint: String,
    pub chain: String,
    pub decimals: u32,
    pub timestamp: String,
    pub price: f64,
    pub open: f64,
    pub high: f64,
    pub close: f64,
    pub low: f64,
}

/// `{"items": [...], "cursor": "..." | null}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryBody {
    /// [`HistoryItem`]s, or [`LegacyHistoryRow`]s for the legacy body.
    #[schema(value_type = Vec<Object>)]
    pub items: Vec<Value>,
    /// Pass as `?cursor=` for the next page; `null` on the last page.
    pub cursor: Option<String>,
}

fn service(state: &AppState) -> Result<&PriceService, ApiError> {
    let unavailable = |detail: String| Err(ApiError::Unavailable(detail));
    match state.prices.as_ref().map(|slot| slot.get()) {
        None => unavailable("this process serves no token prices".to_owned()),
        Some(None) => {
            unavailable("token prices are still loading; retry in a few seconds".to_owned())
        }
        Some(Some(Err(reason))) => unavailable(format!("token prices are unavailable: {reason}")),
        Some(Some(Ok(service))) => Ok(service),
    }
}

fn body_json(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let bytes =
        body.map_err(|rejection| crate::body::read_error(&rejection, state.limits.max_body_bytes))?;
    Ok(sluice_core::validation::parse_value(&bytes)?)
}

/// Reads `[{chain, token_address}, …]` at `loc`, at most `max` entries.
fn token_list(value: &Value, loc: &Loc, max: usize, errors: &mut Violations) -> Vec<TokenRef> {
    let Some(items) = as_array(value, loc, errors) else { return Vec::new() };
    if items.len() > max {
        errors.push(Violation::new(
            loc,
            "too_long",
            format!("at most {max} tokens per request, got {}", items.len()),
        ));
        return Vec::new();
    }
    let mut tokens = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Some(mut fields) = Fields::of(item, loc.at(index), errors) else { continue };
        let chain = fields.required_str("chain", errors);
        let address = fields.required_str("token_address", errors);
        fields.finish(errors, |_| None);
        if let (Some(chain), Some(address)) = (chain, address) {
            tokens.push(token(chain, address, &loc.at(index), errors));
        }
    }
    tokens
}

fn token(chain: &str, address: &str, loc: &Loc, errors: &mut Violations) -> TokenRef {
    for (field, value) in [("chain", chain), ("token_address", address)] {
        if value.trim().is_empty() {
            errors.push(Violation::value(&loc.at(field), format!("{field} must not be empty")));
        }
    }
    TokenRef::new(chain.trim(), address.trim())
}

/// Latest prices and OHLC of up to 200 tokens (docs/contract.md §Token price endpoints): each
/// token's most recent completed minute with trades (or, when it traded only in the current
/// minute, that minute so far). Tokens without a trade in the past 7 days, or never seen, have no item.
#[utoipa::path(
    post, path = "/api/v1/developer/prices", tag = "prices",
    params(LatestQuery),
    request_body(content = Vec<TokenAddress>, description = "Up to 200 tokens"),
    responses(
        (status = 200, description = "Latest prices, in request order", body = LatestPricesBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "Malformed body or more than 200 tokens", body = ValidationErrorBody),
        (status = 503, description = "This process serves no prices", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn latest_prices(
    State(state): State<AppState>,
    _caller: Caller,
    query: Query,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<LatestPricesBody>, ApiError> {
    let mut params = query.parse()?;
    let with_liquidity = params.bool("with_liquidity_info").unwrap_or(false);
    params.finish()?;
    let mut errors = Violations::default();
    let body = body_json(&state, body)?;
    let tokens = token_list(&body, &Loc::body(), MAX_LATEST_TOKENS, &mut errors);
    errors.finish(())?;
    let items = service(&state)?
        .latest_checked(&tokens, with_liquidity)
        .await
        .map_err(|error| ApiError::Internal(error.to_string()))?
        .into_iter()
        .map(|latest| latest_item(latest, with_liquidity))
        .collect();
    Ok(Json(LatestPricesBody { items, cursor: None }))
}

fn latest_item(latest: LatestPrice, with_liquidity: bool) -> LatestPriceItem {
    LatestPriceItem {
        timestamp: sluice_core::time::format(latest.timestamp),
        chain: latest.token.chain,
        address: latest.token.address,
        decimals: latest.decimals,
        price: latest.price,
        open: latest.open,
        high: latest.high,
        close: latest.close,
        low: latest.low,
        total_liquidity_usd: with_liquidity.then_some(latest.total_liquidity_usd),
    }
}

fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    sluice_core::time::parse(text).ok().or_else(|| {
        ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"]
            .iter()
            .find_map(|format| {
                NaiveDateTime::parse_from_str(text, format).ok().or_else(|| {
                    chrono::NaiveDate::parse_from_str(text, format)
                        .ok()
                        .and_then(|date| date.and_hms_opt(0, 0, 0))
                })
            })
            .map(|naive| naive.and_utc())
    })
}

/// Reads and checks a history body (the current or the legacy shape); `true` with the
/// query when it was the legacy shape.
fn history_query(
    body: &Map<String, Value>,
    earliest: impl Fn(Granularity) -> Option<i64>,
) -> Result<(HistoryQuery, bool), Vec<Violation>> {
    let mut errors = Violations::default();
    let mut fields = Fields::new(body, Loc::body());
    let legacy = !body.contains_key("addresses")
        && (body.contains_key("chain") || body.contains_key("token_address"));
    let tokens = if legacy {
        let chain = fields.required_str("chain", &mut errors);
        let address = fields.required_str("token_address", &mut errors);
        match (chain, address) {
            (Some(chain), Some(address)) => vec![token(chain, address, &Loc::body(), &mut errors)],
            _ => Vec::new(),
        }
    } else {
        match fields.get("addresses") {
            None => {
                errors.push(Violation::missing(&fields.loc("addresses")));
                Vec::new()
            }
            Some(value) => {
                token_list(value, &fields.loc("addresses"), MAX_HISTORY_TOKENS, &mut errors)
            }
        }
    };
    let granularity = match fields.required_str("time_granularity", &mut errors) {
        None => None,
        Some(name) => {
            let found = Granularity::parse(name);
            if found.is_none() {
                errors.push(Violation::new(
                    &fields.loc("time_granularity"),
                    "enum",
                    format!(
                        "unknown time_granularity {name:?}: use one of {}",
                        one_of(&Granularity::NAMES)
                    ),
                ));
            }
            found
        }
    };
    let mut time = |field: &'static str, errors: &mut Violations| {
        let text = fields.required_str(field, errors)?;
        let parsed = parse_time(text);
        if parsed.is_none() {
            errors.push(Violation::new(
                &Loc::body().at(field),
                "datetime_parsing",
                format!("{field} {text:?} is not an ISO 8601 date-time"),
            ));
        }
        parsed
    };
    let start = time("start_timestamp", &mut errors);
    let end = time("end_timestamp", &mut errors);
    fields.finish(&mut errors, |_| None);
    if let (Some(start), Some(end)) = (start, end) {
        if start >= end {
            errors.push(Violation::value(
                &Loc::body().at("start_timestamp"),
                "start_timestamp must be before end_timestamp",
            ));
        }
    }
    if let (Some(start), Some(granularity)) = (start, granularity) {
        if let Some(earliest) = earliest(granularity) {
            if start.timestamp_micros() < earliest {
                errors.push(Violation::value(
                    &Loc::body().at("start_timestamp"),
                    format!(
                        "start_timestamp is older than the {} that {granularity} prices are kept; \
                         the earliest start now is {}",
                        granularity.retention_words(),
                        sluice_core::time::format(
                            DateTime::from_timestamp_micros(earliest).unwrap_or_default()
                        )
                    ),
                ));
            }
        }
    }
    match (granularity, start, end) {
        (Some(granularity), Some(start), Some(end)) => errors.finish((
            HistoryQuery {
                tokens,
                granularity,
                start: start.timestamp_micros(),
                end: end.timestamp_micros(),
            },
            legacy,
        )),
        _ => Err(errors.finish(()).err().unwrap_or_default()),
    }
}

/// Price history of up to 50 tokens (docs/contract.md §Token price endpoints): per window of
/// the granularity whose start lies in `[start_timestamp, end_timestamp)`, the volume-weighted
/// price and the OHLC of the token's DEX trades. Windows without trades have no entry; the current window
/// is included with the trades so far. Long answers are paged: call again with `?cursor=`
/// until `cursor` is `null`. The legacy single-token body
/// `{chain, token_address, start_timestamp, end_timestamp, time_granularity}` is answered
/// with flat rows `{mint, chain, decimals, timestamp, price, open, high, close, low}`.
#[utoipa::path(
    post, path = "/api/v1/developer/prices/history", tag = "prices",
    params(HistoryParams),
    request_body(content = HistoryRequest, description = "Tokens, granularity and time range (or the legacy single-token body)"),
    responses(
        (status = 200, description = "One page of price history", body = HistoryBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "Malformed body, more than 50 tokens, unknown granularity, start not before end, start past retention, or a cursor of another request", body = ValidationErrorBody),
        (status = 503, description = "This process serves no prices", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn price_history(
    State(state): State<AppState>,
    _caller: Caller,
    query: Query,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<HistoryBody>, ApiError> {
    let mut params = query.parse()?;
    params.finish()?;
    // An empty cursor asks for the first page, as no cursor does.
    let cursor = params.raw("cursor").filter(|c| !c.is_empty());
    let bytes =
        body.map_err(|rejection| crate::body::read_error(&rejection, state.limits.max_body_bytes))?;
    let body = sluice_core::validation::parse_object(&bytes)?;
    let service = service(&state)?;
    let (query, legacy) = history_query(&body, |g| service.earliest_start(g))?;
    let page = match service.history(&query, cursor).await {
        Ok(page) => page,
        Err(PriceError::BadCursor) => {
            return Err(ApiError::Validation(vec![Violation::value(
                &Loc::query("cursor"),
                "cursor is not a cursor of this request; repeat the request body the cursor came with",
            )]));
        }
        Err(error) => return Err(ApiError::Internal(error.to_string())),
    };
    Ok(Json(history_body(page, legacy)))
}

fn history_body(page: HistoryPage, legacy: bool) -> HistoryBody {
    let time = |start: i64| {
        sluice_core::time::format(DateTime::from_timestamp(start, 0).unwrap_or_default())
    };
    let mut items = Vec::new();
    for series in page.series {
        if legacy {
            for point in series.points {
                let row = LegacyHistoryRow {
                    mint: series.token.address.clone(),
                    chain: series.token.chain.clone(),
                    decimals: series.decimals,
                    timestamp: time(point.start),
                    price: point.price,
                    open: point.open,
                    high: point.high,
                    close: point.close,
                    low: point.low,
                };
                items.push(serde_json::to_value(row).expect("a row serializes"));
            }
        } else {
            let item = HistoryItem {
                mint: series.token.address,
                chain: series.token.chain,
                decimals: series.decimals,
                prices: series
                    .points
                    .into_iter()
                    .map(|point| PricePointItem {
                        timestamp: time(point.start),
                        price: point.price,
                        open: point.open,
                        high: point.high,
                        close: point.close,
                        low: point.low,
                    })
                    .collect(),
            };
            items.push(serde_json::to_value(item).expect("an item serializes"));
        }
    }
    HistoryBody { items, cursor: page.cursor }
}
