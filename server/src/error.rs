//! One error type for the HTTP API, rendered as RFC 9457 problem+json. 4xx details say what
//! was wrong and how to fix it; 5xx details are logged, not shown.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use kernel_registry::storage::StoreError;
use serde_json::json;

#[derive(Debug)]
pub struct AppError {
    pub status: StatusCode,
    pub detail: String,
    /// Extra members of the problem object (e.g. `excluded` for resolve, `field`).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl AppError {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        AppError {
            status,
            detail: detail.into(),
            extra: Default::default(),
        }
    }
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail)
    }
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, detail)
    }
    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, detail)
    }
    pub fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.extra.insert(key.to_string(), value.into());
        self
    }
    fn internal(what: impl std::fmt::Display) -> Self {
        tracing::error!(error = %what, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the server failed to handle this request; it has been logged",
        )
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let mut body = json!({
            "type": "about:blank",
            "title": self.status.canonical_reason().unwrap_or("Error"),
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let Some(obj) = body.as_object_mut() {
            obj.extend(self.extra);
        }
        (
            self.status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body.to_string(),
        )
            .into_response()
    }
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(m) => AppError::not_found(m),
            StoreError::Conflict(m) => AppError::new(StatusCode::CONFLICT, m),
            StoreError::Invalid(m) => AppError::unprocessable(m),
            other => AppError::internal(other),
        }
    }
}

impl From<kernel_registry::ManifestError> for AppError {
    fn from(e: kernel_registry::ManifestError) -> Self {
        let field = e.field_name().map(str::to_string);
        let err = AppError::unprocessable(e.to_string());
        match field {
            Some(f) => err.with("field", f),
            None => err,
        }
    }
}

/// Turn any axum extractor rejection (bad JSON, body too large, ...) into a problem.
pub fn rejection(r: impl IntoResponse + std::fmt::Display) -> AppError {
    let text = r.to_string();
    let status = r.into_response().status();
    let detail = if status == StatusCode::PAYLOAD_TOO_LARGE {
        format!(
            "the request body is larger than the server accepts ({}); kernel sources are limited to {} KiB",
            text,
            kernel_registry::manifest::MAX_SOURCE_BYTES >> 10
        )
    } else {
        text
    };
    AppError::new(status, detail)
}
