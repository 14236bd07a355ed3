//! Request ids: every request gets one — the caller's `x-request-id` when it is a sane one, else
//! a new UUID — which is a field of the request's tracing span (so every log line the request
//! causes carries it) and comes back in the response's `x-request-id`.

use axum::extract::Request;
use axum::http::HeaderName;

/// The header carrying the id, both ways.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The longest incoming id kept; a longer one is replaced.
pub const MAX_LEN: usize = 128;

/// An incoming id is kept when it is 1..=MAX_LEN visible ASCII characters (no spaces or control
/// characters: it goes into every log line of the request as is).
pub fn acceptable(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_LEN && id.iter().all(|b| b.is_ascii_graphic())
}

/// Middleware run before `SetRequestId`: drops an unacceptable incoming id, so a new one is made.
pub async fn drop_unacceptable(mut req: Request) -> Request {
    let bad = req
        .headers()
        .get_all(&HEADER)
        .iter()
        .enumerate()
        .any(|(i, v)| i > 0 || !acceptable(v.as_bytes()));
    if bad {
        req.headers_mut().remove(&HEADER);
    }
    req
}

/// The span of one request (tower-http's `TraceLayer` enters it around the handler).
pub fn span(req: &Request) -> tracing::Span {
    let id = req
        .headers()
        .get(&HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!(
        "request",
        request_id = %id,
        method = %req.method(),
        uri = %req.uri(),
    )
}

#[cfg(test)]
mod tests {
    use super::acceptable;

    #[test]
    fn ids_kept_and_replaced() {
        for ok in [
            "a",
            "req-123",
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            &"x".repeat(128),
        ] {
            assert!(acceptable(ok.as_bytes()), "`{ok}` should be kept");
        }
        for bad in ["", "two words", "tab\there", "é", &"x".repeat(129)] {
            assert!(!acceptable(bad.as_bytes()), "`{bad}` should be replaced");
        }
    }
}
