//! One error type for the HTTP API, rendered as RFC 9457 problem+json. 4xx details say what
//! was wrong and how to fix it; 5xx details are logged, not shown.

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kernel_store::StoreError;
use serde_json::json;

/// The media type of every refusal.
pub const PROBLEM_JSON: &str = "application/problem+json";

#[derive(Debug)]
pub struct AppError {
    pub status: StatusCode,
    pub detail: String,
    /// Extra members of the problem object (e.g. `excluded` for resolve, `field`).
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// Headers sent with the problem (e.g. `Retry-After` with a 429, `Connection: close`).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// An RFC 9457 problem: the body of every refusal (`application/problem+json`).
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// Always `about:blank`: `status` and `title` say what kind of problem it is.
    #[schema(example = "about:blank")]
    pub r#type: String,
    /// The status's reason phrase, e.g. `Bad Request`.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What was wrong with the request and how to fix it (5xx: only that it was logged).
    pub detail: String,
    /// The parameter, field or multipart part at fault, when one is (e.g. `offset`,
    /// `report.device.name`).
    pub field: Option<String>,
}

impl AppError {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        AppError {
            status,
            detail: detail.into(),
            extra: Default::default(),
            headers: Vec::new(),
        }
    }
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
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

/// The most of a value a refusal quotes (characters): a longer one is cut, with an ellipsis
/// and its length, so that a refusal never sends a large value back to its sender.
pub const MAX_QUOTE: usize = 200;

/// The longest `detail` a refusal carries (bytes). Values are quoted with `quote`; this is the
/// backstop for a message that quotes one some other way.
pub const MAX_DETAIL: usize = 8 << 10;

/// `value` as a refusal quotes it: whole up to `MAX_QUOTE` characters, else its first
/// `MAX_QUOTE` characters, an ellipsis and its length (`xxxx… (5000 characters)`).
pub fn quote(value: &str) -> String {
    quote_at(value, MAX_QUOTE)
}

/// `value` cut after `max` characters, as `quote` cuts it.
pub fn quote_at(value: &str, max: usize) -> String {
    match value.char_indices().nth(max) {
        None => value.to_string(),
        Some((cut, _)) => format!("{}… ({} characters)", &value[..cut], value.chars().count()),
    }
}

/// Cut `text` to at most `max` bytes (on a character boundary), saying how long it was.
fn cap(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let cut = (0..=max)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}… (cut: {} bytes in all)", &text[..cut], text.len())
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let mut body = json!({
            "type": "about:blank",
            "title": self.status.canonical_reason().unwrap_or("Error"),
            "status": self.status.as_u16(),
            "detail": cap(self.detail, MAX_DETAIL),
        });
        if let Some(obj) = body.as_object_mut() {
            obj.extend(self.extra.into_iter().map(|(k, v)| match v {
                // `field` names a parameter or a JSON field: a name an attacker may make long.
                serde_json::Value::String(s) => (k, serde_json::Value::String(quote(&s))),
                v => (k, v),
            }));
        }
        let headers: HeaderMap = self.headers.into_iter().collect();
        (
            self.status,
            headers,
            [(header::CONTENT_TYPE, PROBLEM_JSON)],
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
            StoreError::Forbidden(m) => AppError::new(StatusCode::FORBIDDEN, m),
            StoreError::Invalid(m) => AppError::unprocessable(m),
            StoreError::Unstorable(m) => AppError::bad_request(m),
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
        format!(
            "{}; the body must fit this route's schema in /openapi.json",
            quote(&text)
        )
    };
    AppError::new(status, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_cut_with_their_length() {
        assert_eq!(quote("short"), "short");
        let at = "é".repeat(MAX_QUOTE);
        assert_eq!(quote(&at), at, "exactly the limit is quoted whole");
        let q = quote(&"é".repeat(5000));
        assert!(q.ends_with("… (5000 characters)"), "{q}");
        assert_eq!(q.chars().filter(|c| *c == 'é').count(), MAX_QUOTE);
        let long = cap("x".repeat(100_000), MAX_DETAIL);
        assert!(long.len() < MAX_DETAIL + 64 && long.ends_with("(cut: 100000 bytes in all)"));
    }

    #[tokio::test]
    async fn a_refusal_never_carries_a_large_value() {
        let e = AppError::bad_request(format!("bad `{}`", "v".repeat(1 << 20)))
            .with("field", "k".repeat(10_000));
        let body = axum::body::to_bytes(e.into_response().into_body(), usize::MAX)
            .await
            .unwrap();
        assert!(body.len() < MAX_DETAIL + 1024, "{} bytes", body.len());
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(v["field"].as_str().unwrap().ends_with("(10000 characters)"));
    }
}
