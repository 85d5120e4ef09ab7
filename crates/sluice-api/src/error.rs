//! The one error type of the API and how each variant renders.
//!
//! Validation failures are the contract's 422 `{"detail": [{loc, msg, type}]}`
//! (docs/contract.md §Validation error body); every other error is
//! `{"detail": "<message>"}`. Internal errors are logged once here, with their cause, and reach
//! the client only as a generic 500.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sluice_core::validation::Violation;
use sluice_store::StoreError;
use utoipa::ToSchema;

/// `{"detail": "<message>"}`: the body of every error but 422.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub detail: String,
}

/// `{"detail": [...]}`: the body of a 422.
#[derive(Debug, Serialize, ToSchema)]
pub struct ValidationErrorBody {
    pub detail: Vec<Violation>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with what is stored (a duplicate dataset name).
    #[error("{0}")]
    Conflict(String),
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("request body is not valid")]
    Validation(Vec<Violation>),
    #[error("store error: {0}")]
    Store(#[from] StoreError),
    /// An offset outside what a topic holds (Kafka's "offset out of range").
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    Unavailable(String),
    /// A failure of ours the client cannot fix; logged with this detail, answered as 500.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Store(error) if error.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            Self::Store(_) | Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::OutOfRange(_) => StatusCode::RANGE_NOT_SATISFIABLE,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<sluice_bus::BusError> for ApiError {
    /// A stream log that cannot be reached now (a broker cut off, a client timing out) is a
    /// 503 saying so, as for the database and Redis; anything else is ours to fix.
    fn from(error: sluice_bus::BusError) -> Self {
        if error.is_transient() {
            tracing::warn!(%error, "stream log unavailable");
            Self::Unavailable("the stream log is not reachable now; try again".to_owned())
        } else {
            Self::Internal(format!("stream log: {error}"))
        }
    }
}

impl From<sluice_store::SecretsError> for ApiError {
    fn from(error: sluice_store::SecretsError) -> Self {
        match error {
            sluice_store::SecretsError::Store(store) => Self::Store(store),
            // These messages name secrets and keys, never values.
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<Vec<Violation>> for ApiError {
    fn from(violations: Vec<Violation>) -> Self {
        Self::Validation(violations)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        match self {
            Self::Validation(detail) => {
                (status, Json(ValidationErrorBody { detail })).into_response()
            }
            Self::Store(error) => {
                tracing::error!(%error, "request failed on the store");
                let detail = match error {
                    StoreError::Redis(_) => {
                        "the set store (Redis) is not reachable; retry when it is back".to_owned()
                    }
                    // It says which set and how to bring its values back.
                    error @ StoreError::SetLost { .. } => error.to_string(),
                    error if error.is_unavailable() => {
                        "the metadata store (database) is not reachable; retry when it is back"
                            .to_owned()
                    }
                    _ => "internal server error".to_owned(),
                };
                (status, Json(ErrorBody { detail })).into_response()
            }
            Self::Internal(error) => {
                tracing::error!(%error, "request failed");
                let detail = "internal server error".to_owned();
                (status, Json(ErrorBody { detail })).into_response()
            }
            other => (status, Json(ErrorBody { detail: other.to_string() })).into_response(),
        }
    }
}

/// Gives an error the router answers by itself (404 for an unknown path, 405 for a method a
/// path does not serve), which has no body, the `{"detail": "..."}` shape of every other
/// error. Headers (such as a 405's `Allow`) are kept.
pub async fn json_for_bare_errors(response: Response) -> Response {
    let status = response.status();
    let bare = !response.headers().contains_key(axum::http::header::CONTENT_TYPE);
    if !(bare && (status.is_client_error() || status.is_server_error())) {
        return response;
    }
    let detail = status.canonical_reason().unwrap_or("Error").to_owned();
    let (mut parts, _) = response.into_parts();
    let body = Json(ErrorBody { detail }).into_response();
    let (body_parts, body) = body.into_parts();
    parts.headers.extend(body_parts.headers);
    Response::from_parts(parts, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_store_that_cannot_be_reached_is_a_503_saying_so() {
        let error = ApiError::Store(StoreError::Unreachable {
            url: "postgres://db/sluice".into(),
            reason: "connection refused".into(),
        });
        assert_eq!(error.status(), StatusCode::SERVICE_UNAVAILABLE);
        let response = error.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body["detail"],
            "the metadata store (database) is not reachable; retry when it is back"
        );
        let corrupt = ApiError::Store(StoreError::Corrupt { what: "a row", detail: "x".into() });
        assert_eq!(corrupt.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[tokio::test]
    async fn a_stream_log_that_cannot_be_reached_is_a_503_and_a_corrupt_one_a_500() {
        let cut = sluice_bus::BusError::Backend {
            source: "Admin operation error: BrokerTransportFailure".into(),
            transient: true,
        };
        let response = ApiError::from(cut).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["detail"], "the stream log is not reachable now; try again");
        let corrupt = ApiError::from(sluice_bus::BusError::Corrupt("a batch".into()));
        assert_eq!(corrupt.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
