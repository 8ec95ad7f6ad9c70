//! The answers the routes give when a request fails: a status and a JSON `{"error": ...}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gstore_store::StoreError;

/// A JSON error answer.
pub(crate) fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

/// The answer to a failure of the store's protocol helpers.
pub(crate) fn store_failure(e: StoreError) -> Response {
    match e {
        StoreError::NotFound { .. } => error(StatusCode::NOT_FOUND, "no such object"),
        StoreError::Conflict(_) | StoreError::AlreadyExists { .. } => {
            error(StatusCode::PRECONDITION_FAILED, "the object changed (or exists): re-read and retry")
        }
        other => error(StatusCode::BAD_GATEWAY, format!("store: {other}")),
    }
}

/// The answer to a failed object-store request.
pub(crate) fn store_error(e: object_store::Error) -> Response {
    match e {
        object_store::Error::NotFound { .. } => error(StatusCode::NOT_FOUND, "no such object"),
        object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. } => {
            error(StatusCode::PRECONDITION_FAILED, "the object changed (or exists): re-read and retry")
        }
        object_store::Error::NotModified { .. } => StatusCode::NOT_MODIFIED.into_response(),
        other => error(StatusCode::BAD_GATEWAY, format!("store: {other}")),
    }
}
