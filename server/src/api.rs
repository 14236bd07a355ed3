//! HTTP handlers of the REST API (`/v1/...`).

pub mod jobs;
pub mod kernels;
pub mod openapi;
pub mod resolve;
pub mod tokens;

use crate::error::AppError;
use crate::state::{AppState, Caller};
use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::HashMap;
use std::str::FromStr;
use std::time::Instant;

/// Liveness and a count of what is stored.
#[utoipa::path(get, path = "/healthz", tag = "meta", responses((status = 200, description = "The server and its database answer")))]
pub async fn healthz(
    State(st): State<AppState>,
    _c: Caller,
) -> Result<Json<serde_json::Value>, AppError> {
    // The count moves only with the answer generation (storing a kernel moves it; none is
    // ever deleted): one indexed read per probe, the count only after a write.
    let generation = st.store.answer_generation().await?;
    let kernels = match st.counts.get("/healthz#kernels", generation) {
        Some(n) => n,
        None => {
            let n = st.store.kernel_count().await?;
            st.counts.insert("/healthz#kernels".into(), generation, n);
            n
        }
    };
    Ok(Json(serde_json::json!({
        "status": "ok",
        "database": format!("{:?}", st.store.backend()).to_lowercase(),
        "kernels": kernels,
        "version": env!("CARGO_PKG_VERSION"),
    })))
}

/// A typed query parameter, with a message naming the parameter when it does not parse.
pub fn param<T: FromStr>(q: &HashMap<String, String>, key: &str) -> Result<Option<T>, AppError>
where
    T::Err: std::fmt::Display,
{
    match q.get(key).map(|v| v.trim()).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|e| {
            AppError::bad_request(format!("query parameter `{key}`: {e}")).with("field", key)
        }),
    }
}

pub fn required<T: FromStr>(q: &HashMap<String, String>, key: &str) -> Result<T, AppError>
where
    T::Err: std::fmt::Display,
{
    param(q, key)?.ok_or_else(|| {
        AppError::bad_request(format!("query parameter `{key}` is required")).with("field", key)
    })
}

/// Refuse query parameters this route does not know (a typo would silently widen a query).
pub fn known_params(q: &HashMap<String, String>, allowed: &[&str]) -> Result<(), AppError> {
    for k in q.keys() {
        if !allowed.contains(&k.as_str()) {
            let takes = if allowed.is_empty() {
                "this route takes none".to_string()
            } else {
                format!("this route takes: {}", allowed.join(", "))
            };
            return Err(
                AppError::bad_request(format!("unknown query parameter `{k}`; {takes}"))
                    .with("field", k.as_str()),
            );
        }
    }
    Ok(())
}

/// Around every route: count the request and time it (by route template).
pub async fn track(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let res = next.run(req).await;
    st.metrics.observe(
        &method,
        &route,
        res.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    res
}

/// The hub's metrics in the OpenMetrics text format (Prometheus reads it). Public like every
/// read unless the hub runs with `--private-reads`.
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "Requests, jobs, verifications and workers in the OpenMetrics text format",
        content_type = "application/openmetrics-text", body = String)))]
pub async fn metrics(State(st): State<AppState>, _c: Caller) -> Result<Response, AppError> {
    let now = kernel_store::now_ms();
    let stats = st.store.stats(now).await?;
    let body = st.metrics.render(&stats, now);
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response())
}
