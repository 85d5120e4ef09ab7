//! Bulk value bodies, shared by a set filter's values ([`crate::filter_values`]) and a
//! dataset's entries ([`crate::datasets`]): `{"values": [string, …]}`, with a `"name"` for
//! dataset entries sent by name.
//!
//! Both take up to a million values, so both read the body under the larger bulk limit
//! ([`crate::state::Limits::max_filter_values_body_bytes`]), deserialize it straight into
//! strings, and walk it as a JSON tree only when that fast path fails, to say precisely what
//! is wrong. Both lowercase every value and cap it at [`MAX_VALUE_BYTES`].

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use sluice_core::filter_values::normalize;
use sluice_core::validation::{Fields, Loc, Violation, Violations, parse_object, str_array};

use crate::datasets::NamedEntriesRequest;
use crate::error::ApiError;
use crate::filter_values::{MAX_VALUE_BYTES, ValuesRequest, normalize_in_place};
use crate::params::Query;
use crate::state::AppState;

/// The required `value` query parameter of a membership check, lowercased as stored values
/// are.
///
/// # Errors
/// 422 when the query is malformed, has other parameters or no `value`.
pub(crate) fn value_to_check(query: Query) -> Result<String, ApiError> {
    let mut params = query.parse()?;
    let value = params.required_string("value", 0);
    params.finish()?;
    Ok(normalize(&value.unwrap_or_default()))
}

/// The body's bytes, read under the bulk limit.
///
/// # Errors
/// 413 over the limit (or the read error of [`crate::body::read_error`]).
pub(crate) fn bytes(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        crate::body::read_error(&rejection, state.limits.max_filter_values_body_bytes)
    })
}

/// The 422 of an empty `values` list at `loc`.
pub(crate) fn too_short(loc: &Loc) -> ApiError {
    ApiError::Validation(vec![Violation::new(
        loc,
        "too_short",
        "List should have at least 1 item after validation, not 0",
    )])
}

/// Lowercases every value in place and records a violation at `loc[index]` for each one
/// longer than [`MAX_VALUE_BYTES`]; `what` names the value in the message (`filter`,
/// `dataset`).
pub(crate) fn normalize_all(values: &mut [String], loc: &Loc, what: &str) -> Violations {
    let mut errors = Violations::default();
    for (index, value) in values.iter_mut().enumerate() {
        normalize_in_place(value);
        if value.len() > MAX_VALUE_BYTES {
            errors.push(Violation::value(
                &loc.at(index),
                format!(
                    "a {what} value is at most {MAX_VALUE_BYTES} bytes of UTF-8 (lowercased); this one has {}",
                    value.len()
                ),
            ));
        }
    }
    errors
}

/// `{"values": [string, …]}` (with `"name": string` when `named`), not yet normalised.
///
/// # Errors
/// Every violation of the body, each where it is.
pub(crate) fn parse(
    bytes: &[u8],
    named: bool,
) -> Result<(Option<String>, Vec<String>), Vec<Violation>> {
    // serde would also take a struct written as a JSON array, which the API does not.
    let is_object = bytes.iter().find(|byte| !byte.is_ascii_whitespace()) == Some(&b'{');
    if is_object {
        if named {
            if let Ok(body) = serde_json::from_slice::<NamedEntriesRequest>(bytes) {
                return Ok((Some(body.name), body.values));
            }
        } else if let Ok(body) = serde_json::from_slice::<ValuesRequest>(bytes) {
            return Ok((None, body.values));
        }
    }
    // Slow path: walk the body as a tree to report every violation where it is.
    let map = parse_object(bytes)?;
    let mut errors = Violations::default();
    let mut fields = Fields::new(&map, Loc::body());
    let name = if named { fields.required_str("name", &mut errors) } else { None };
    let loc = fields.loc("values");
    let values = match fields.get("values") {
        None => {
            errors.push(Violation::missing(&loc));
            None
        }
        Some(value) => str_array(value, &loc, &mut errors),
    };
    fields.finish(&mut errors, |_| None);
    match values {
        Some(values) if errors.is_empty() => {
            Ok((name.map(str::to_owned), values.into_iter().map(str::to_owned).collect()))
        }
        _ => Err(errors.finish(()).err().unwrap_or_default()),
    }
}
