//! The JSON body extractor: reads the body under the configured size limit and parses it as
//! one JSON object, turning every failure into the API's own error shapes (413, 422) instead
//! of axum's plain-text rejections. Handlers then validate the object with `sluice-core`.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde_json::{Map, Value};
use sluice_core::validation::parse_object;

use crate::AppState;
use crate::error::ApiError;

/// A request body that is one JSON object.
#[derive(Debug)]
pub struct JsonObject(pub Map<String, Value>);

impl FromRequest<AppState> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|rejection| read_error(&rejection, state.limits.max_body_bytes))?;
        Ok(Self(parse_object(&bytes)?))
    }
}

/// The API's error for a body that could not be read: 413 naming `limit` when it was too
/// large, otherwise a 422 at `["body"]`.
pub fn read_error(rejection: &axum::extract::rejection::BytesRejection, limit: usize) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge { limit }
    } else {
        ApiError::Validation(vec![sluice_core::validation::Violation::new(
            &sluice_core::validation::Loc::body(),
            "body_read",
            rejection.body_text(),
        )])
    }
}
