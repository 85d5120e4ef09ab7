//! The JSON body extractor: reads the body under the configured size limit and, when the
//! handler asks (after authentication and permission are decided), parses it as one JSON
//! object or array, turning every failure into the API's own error shapes (413, 422) instead
//! of axum's plain-text rejections. Handlers then validate the value with `sluice-core`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde_json::{Map, Value};
use sluice_core::validation::{Loc, Violation, parse_object, parse_value};

use crate::error::ApiError;
use crate::state::AppState;

/// A request body, read but not yet parsed.
#[derive(Debug)]
pub struct JsonBody {
    bytes: Result<Bytes, BytesRejection>,
    limit: usize,
}

impl FromRequest<AppState> for JsonBody {
    type Rejection = std::convert::Infallible;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await;
        Ok(Self { bytes, limit: state.limits.max_body_bytes })
    }
}

impl JsonBody {
    fn bytes(self) -> Result<Bytes, ApiError> {
        let limit = self.limit;
        self.bytes.map_err(|rejection| read_error(&rejection, limit))
    }

    /// The body as one JSON object.
    ///
    /// # Errors
    /// 413 over the limit; 422 `json_invalid` or `dict_type`.
    pub fn object(self) -> Result<Map<String, Value>, ApiError> {
        Ok(parse_object(&self.bytes()?)?)
    }

    /// The body as one JSON array.
    ///
    /// # Errors
    /// 413 over the limit; 422 `json_invalid` or `list_type`.
    pub fn array(self) -> Result<Vec<Value>, ApiError> {
        // The same strict parser as objects: a repeated key inside an item is a 422 too.
        match parse_value(&self.bytes()?)? {
            Value::Array(items) => Ok(items),
            _ => Err(ApiError::Validation(vec![Violation::new(
                &Loc::body(),
                "list_type",
                "Input should be a valid list",
            )])),
        }
    }
}

/// The API's error for a body that could not be read: 413 naming `limit` when it was too
/// large, otherwise a 422 at `["body"]`.
pub fn read_error(rejection: &BytesRejection, limit: usize) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge { limit }
    } else {
        ApiError::Validation(vec![Violation::new(&Loc::body(), "body_read", rejection.body_text())])
    }
}
