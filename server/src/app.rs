//! The axum application: the route list (`crate::routes`) and the dashboard's pages behind the
//! layers every request passes (request ids, metrics, the anonymous limit, authentication before
//! the body, the edge). The state and the caller are `crate::state`'s (re-exported here).

use crate::edge::{self, Edge};
use crate::error::AppError;
use crate::request_id;
use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::{middleware, Router};
use std::sync::Arc;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};

pub use crate::routes::{api_routes, openapi, OPERATION_SCOPES};
pub use crate::state::{
    AppState, Caller, Config, Scope, DEFAULT_ANONYMOUS_BURST, DEFAULT_ANONYMOUS_RATE_PER_MINUTE,
};

/// Request bodies above this are refused with 413 (a kernel source is at most 1 MiB).
pub const MAX_BODY_BYTES: usize = 2 << 20;

pub fn app(state: AppState) -> Router {
    let edge = Arc::new(Edge::new(
        openapi(),
        MAX_BODY_BYTES,
        state.config.body_timeout,
    ));
    let (api, _) = api_routes().split_for_parts();
    api.merge(crate::dashboard::routes())
        .route_layer(middleware::from_fn_with_state(edge.clone(), edge::guard))
        // Runs before the edge (route layers run outermost last-added first): an operation
        // that needs a token checks it before its body is read.
        .route_layer(middleware::from_fn_with_state(
            (state.clone(), edge),
            authenticate_first,
        ))
        .method_not_allowed_fallback(edge::method_not_allowed)
        .fallback(edge::no_route)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        // Around every route and the fallbacks (a router's layer runs once the route is
        // matched), before the route layers: a request without a valid token over its
        // address's rate is refused at once, before the edge reads its body.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            limit_unauthenticated,
        ))
        .layer(CatchPanicLayer::custom(edge::panic_to_500))
        .layer(middleware::from_fn(edge::problems))
        // Counted with the status the client gets (after the edge's rewriting).
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::api::track,
        ))
        // Layers run bottom-up: a sane incoming x-request-id is kept (else a UUID is made), the
        // request's span carries it, one line per response is logged in that span, and the
        // id goes back in the response (every refusal of the edge too).
        .layer(PropagateRequestIdLayer::new(request_id::HEADER))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &axum::extract::Request| request_id::span(req))
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(SetRequestIdLayer::new(request_id::HEADER, MakeRequestUuid))
        .layer(axum::middleware::map_request(request_id::drop_unacceptable))
        .with_state(state)
}

/// An operation that needs a token has it checked before anything else of the request is
/// read: an unauthenticated request is refused (401) before its body is received, parsed or
/// held to the schema. The caller found is handed to the handler (`Caller`'s extractor takes it
/// from the request's extensions), so the token is looked up once.
async fn authenticate_first(
    State((state, edge)): State<(AppState, Arc<Edge>)>,
    matched: Option<axum::extract::MatchedPath>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let route = matched.map(|m| m.as_str().to_string()).unwrap_or_default();
    if !edge.needs_token(req.method(), &route) {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    let refusal = match Caller::from_request_parts(&mut parts, &state).await {
        Ok(caller) if caller.name.is_none() => AppError::new(
            StatusCode::UNAUTHORIZED,
            "this needs a token: send `Authorization: Bearer <token>` (create one with \
             `kernelize token create --scope SCOPE`; each operation's scope is in /openapi.json)",
        ),
        Ok(caller) => match caller.require_any(edge.scopes(&parts.method, &route)) {
            Ok(_) => {
                parts.extensions.insert(caller);
                return next
                    .run(axum::extract::Request::from_parts(parts, body))
                    .await;
            }
            // A token of another scope is refused (403) before the body too.
            Err(e) => e,
        },
        Err(e) => e,
    };
    // The body is read and dropped, never parsed (the client then gets this answer, not a reset);
    // meanwhile the connection may be closed to make room for a new one (`listener`).
    let _waiting = parts
        .extensions
        .get::<crate::listener::Connection>()
        .map(|c| c.waiting());
    match edge::drain(body, &edge).await {
        Ok(()) => refusal.into_response(),
        Err(e) => e.into_response(),
    }
}

/// Requests without a valid token are limited per client address (`Config::
/// anonymous_rate_per_minute`, `edge::rate::AddressLimits`), before anything else is done for
/// them: a flood of them is answered 429 at once, without reading its bodies or the database,
/// so that `/healthz` (never limited: probes must reach it) and the callers with a token stay
/// served. A request with a token has it checked here (the caller found is handed on, so the
/// token is looked up once); a valid token is not limited by address, an invalid one counts
/// as no token. The address is the TCP peer's (`listener::serve`): behind a reverse proxy,
/// every client shares the proxy's budget.
async fn limit_unauthenticated(
    State(state): State<AppState>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    if !state.anonymous.enabled() || req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let (mut parts, body) = req.into_parts();
    if parts.headers.contains_key(header::AUTHORIZATION) {
        match Caller::from_request_parts(&mut parts, &state).await {
            Ok(caller) if caller.name.is_some() => {
                parts.extensions.insert(caller);
                return next
                    .run(axum::extract::Request::from_parts(parts, body))
                    .await;
            }
            Ok(_) => {}
            // Counted as a request without a token; the route refuses it (401) within budget.
            Err(e) if e.status == StatusCode::UNAUTHORIZED => {}
            // A token over its write rate (429), a database that failed.
            Err(e) => return refuse_early(&parts, e),
        }
    }
    if let Some(ip) = peer {
        if let Err(e) = state.anonymous.check(ip) {
            return refuse_early(&parts, e);
        }
    }
    next.run(axum::extract::Request::from_parts(parts, body))
        .await
}

/// A refusal made before the edge and the handlers: problem+json on the API, an HTML page elsewhere (the
/// dashboard's pages), keeping its headers; a request that has a body gets `Connection: close`
/// (its body is not read).
fn refuse_early(parts: &Parts, e: AppError) -> axum::response::Response {
    use axum::http::HeaderValue;
    use axum::response::IntoResponse;
    let has_body = parts.headers.contains_key(header::TRANSFER_ENCODING)
        || parts
            .headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    let e = if has_body {
        e.header(header::CONNECTION, HeaderValue::from_static("close"))
    } else {
        e
    };
    let path = parts.uri.path();
    let api = path.starts_with("/v1/") || matches!(path, "/healthz" | "/metrics" | "/openapi.json");
    if api {
        return e.into_response();
    }
    let headers = e.headers.clone();
    let mut res = crate::dashboard::PageError::from(e).into_response();
    res.headers_mut().extend(headers);
    res
}
