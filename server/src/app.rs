//! The axum application: shared state, authentication, and the router of every route.

use crate::api;
use crate::error::AppError;
use axum::extract::{DefaultBodyLimit, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use kernel_registry::storage::Store;
use std::sync::Arc;
use tower_http::trace::TraceLayer;

/// Request bodies above this are refused with 413 (a kernel source is at most 1 MiB).
pub const MAX_BODY_BYTES: usize = 2 << 20;

#[derive(Clone, Debug)]
pub struct Config {
    /// Require a token (any scope) for reads too.
    pub private_reads: bool,
    /// How long a worker's claim lasts without a heartbeat.
    pub lease_ms: i64,
    /// The most verification jobs for unverified widths that `/v1/resolve` keeps pending at
    /// once (anonymous resolves queue them: this bounds the work they can cause).
    pub max_pending_width_jobs: i64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            private_reads: false,
            lease_ms: 120_000,
            max_pending_width_jobs: 1000,
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub config: Arc<Config>,
}

pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/openapi.json", get(api::openapi::openapi_json))
        .route(
            "/v1/kernels",
            get(api::kernels::list).post(api::kernels::submit),
        )
        .route("/v1/kernels/{name}/{version}", get(api::kernels::get_one))
        .route(
            "/v1/kernels/{name}/{version}/verifications",
            get(api::kernels::verifications),
        )
        .route("/v1/sources/{digest}", get(api::kernels::source))
        .route("/v1/verifications/{id}", get(api::jobs::verification))
        .route("/v1/jobs/claim", post(api::jobs::claim))
        .route("/v1/jobs/{id}", get(api::jobs::get_job))
        .route("/v1/jobs/{id}/heartbeat", post(api::jobs::heartbeat))
        .route("/v1/jobs/{id}/report", post(api::jobs::report))
        .route("/v1/jobs/{id}/fail", post(api::jobs::fail))
        .route("/v1/resolve", get(api::resolve::resolve))
        .merge(crate::dashboard::routes())
        .fallback(|| async { AppError::not_found("no such route; see /openapi.json for the API") })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Submit,
    Worker,
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Submit => "submit",
            Scope::Worker => "worker",
            Scope::Admin => "admin",
        }
    }
    pub fn parse(s: &str) -> Result<Scope, String> {
        match s {
            "submit" => Ok(Scope::Submit),
            "worker" => Ok(Scope::Worker),
            "admin" => Ok(Scope::Admin),
            _ => Err(format!(
                "scope `{s}` is not valid: one of submit, worker, admin"
            )),
        }
    }
}

/// The caller, identified by a bearer token (or anonymous).
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: Option<String>,
    pub scopes: Vec<String>,
}

impl Caller {
    /// 401 without a token, 403 with one that lacks `scope` (admin holds every scope).
    pub fn require(&self, scope: Scope) -> Result<&str, AppError> {
        let Some(name) = &self.name else {
            return Err(AppError::new(
                StatusCode::UNAUTHORIZED,
                format!(
                    "this needs a token with scope `{}`: send `Authorization: Bearer <token>` (create one with `kernelize token create --scope {}`)",
                    scope.as_str(),
                    scope.as_str()
                ),
            ));
        };
        if self
            .scopes
            .iter()
            .any(|s| s == scope.as_str() || s == "admin")
        {
            Ok(name)
        } else {
            Err(AppError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "token `{name}` has scopes [{}], but this needs `{}`",
                    self.scopes.join(", "),
                    scope.as_str()
                ),
            ))
        }
    }

    pub fn actor(&self) -> &str {
        self.name.as_deref().unwrap_or("anonymous")
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let caller = match parts.headers.get(header::AUTHORIZATION) {
            None => Caller {
                name: None,
                scopes: vec![],
            },
            Some(v) => {
                let token = v
                    .to_str()
                    .ok()
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(str::trim)
                    .ok_or_else(|| {
                        AppError::new(
                            StatusCode::UNAUTHORIZED,
                            "the Authorization header must be `Bearer <token>`",
                        )
                    })?;
                let Some((name, scopes)) = state.store.token(token).await? else {
                    return Err(AppError::new(
                        StatusCode::UNAUTHORIZED,
                        "the token is not valid (unknown or revoked); create one with `kernelize token create`",
                    ));
                };
                Caller {
                    name: Some(name),
                    scopes,
                }
            }
        };
        // Reads may be made private: then any valid token may read.
        if state.config.private_reads && caller.name.is_none() && parts.method == "GET" {
            let public = parts.uri.path() == "/healthz";
            if !public {
                return Err(AppError::new(
                    StatusCode::UNAUTHORIZED,
                    "this server's reads need a token: send `Authorization: Bearer <token>`",
                ));
            }
        }
        Ok(caller)
    }
}
