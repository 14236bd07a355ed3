//! The axum application: shared state, authentication, and the one list of routes from which
//! both the router and the OpenAPI document come.

use crate::api;
use crate::edge::{
    self,
    rate::{AddressLimits, WriteLimits},
    Edge,
};
use crate::error::AppError;
use crate::request_id;
use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, Method, StatusCode};
use axum::{middleware, Router};
use kernel_store::{Store, TokenCheck};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

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
    /// The oldest verification suite whose reports this hub stores (one of
    /// `kernel_registry::report::KNOWN_SUITES`; default: the verifier's current suite, the
    /// only one whose case list the hub can redraw and check).
    pub min_suite_version: String,
    /// Refuse reports without a certificate from a registered worker key (the default;
    /// `serve --accept-unsigned-reports` turns it off).
    pub require_signed_reports: bool,
    /// How long a request's body may take to arrive once its headers have (then 408).
    pub body_timeout: Duration,
    /// Writes (POSTs) one token may make a minute; 0: no limit.
    pub write_rate_per_minute: u32,
    /// Writes one token may make at once before the per-minute rate applies.
    pub write_burst: u32,
    /// Requests without a valid token one client address may make a minute (`/healthz` is
    /// never limited); 0: no limit.
    pub anonymous_rate_per_minute: u32,
    /// Requests without a token one address may make at once before the per-minute rate
    /// applies.
    pub anonymous_burst: u32,
}

/// `serve --anonymous-rate-per-minute`'s default: a person on the dashboard or a client
/// resolving a model makes a few requests a minute; a flood is refused with 429.
pub const DEFAULT_ANONYMOUS_RATE_PER_MINUTE: u32 = 600;
/// `serve --anonymous-burst`'s default.
pub const DEFAULT_ANONYMOUS_BURST: u32 = 300;

impl Default for Config {
    fn default() -> Self {
        Config {
            private_reads: false,
            lease_ms: 120_000,
            max_pending_width_jobs: 1000,
            min_suite_version: verifier::cases::SUITE_VERSION.to_string(),
            require_signed_reports: true,
            body_timeout: Duration::from_secs(30),
            write_rate_per_minute: 1200,
            write_burst: 1000,
            anonymous_rate_per_minute: DEFAULT_ANONYMOUS_RATE_PER_MINUTE,
            anonymous_burst: DEFAULT_ANONYMOUS_BURST,
        }
    }
}

impl Config {
    /// The suite versions whose reports are stored: the known ones from `min_suite_version`.
    pub fn accepted_suites(&self) -> Vec<&'static str> {
        let known = kernel_registry::report::KNOWN_SUITES;
        let from = known
            .iter()
            .position(|s| *s == self.min_suite_version)
            .unwrap_or(known.len() - 1);
        known[from..].to_vec()
    }

    /// Check a `--min-suite-version` value.
    pub fn parse_min_suite(s: &str) -> Result<String, String> {
        let known = kernel_registry::report::KNOWN_SUITES;
        if known.contains(&s) {
            Ok(s.to_string())
        } else {
            Err(format!(
                "suite `{s}` is not one this hub knows: one of {}",
                known.join(", ")
            ))
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub config: Arc<Config>,
    pub writes: Arc<WriteLimits>,
    /// The limit on requests without a token, per client address.
    pub anonymous: Arc<AddressLimits>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub answers: Arc<crate::answers::AnswerCache>,
    /// Counts (`/healthz`'s kernels), per what is counted.
    pub counts: Arc<crate::answers::GenerationCache<i64>>,
    /// Rankings of resolves (every field of the query but `rows`), per query.
    pub rankings: Arc<crate::answers::GenerationCache<Arc<crate::resolve::Ranking>>>,
    /// What rankings are made from (every field of the query but policy, rows and runtime),
    /// so that a policy never asked before is ranked in memory.
    pub pools: Arc<crate::resolve::PoolCache>,
    /// The ids of policy-filtered lists in list order, per filter (whatever the page).
    pub approved: Arc<crate::answers::GenerationCache<Arc<Vec<i64>>>>,
    /// The dashboard overview's store reads, per filter and page.
    pub overview: Arc<crate::answers::GenerationCache<Arc<crate::dashboard::OverviewData>>>,
}

impl AppState {
    pub fn new(store: Store, config: Config) -> AppState {
        AppState {
            store,
            writes: Arc::new(WriteLimits::new(
                config.write_rate_per_minute,
                config.write_burst,
            )),
            anonymous: Arc::new(AddressLimits::new(
                config.anonymous_rate_per_minute,
                config.anonymous_burst,
            )),
            config: Arc::new(config),
            metrics: Arc::new(crate::metrics::Metrics::new()),
            answers: Arc::default(),
            overview: Arc::default(),
            counts: Arc::default(),
            rankings: Arc::new(crate::answers::GenerationCache::bounded(
                crate::answers::MAX_KEPT_LISTS,
            )),
            pools: Arc::new(crate::answers::GenerationCache::bounded(
                crate::answers::MAX_KEPT_LISTS,
            )),
            approved: Arc::new(crate::answers::GenerationCache::bounded(
                crate::answers::MAX_KEPT_LISTS,
            )),
        }
    }
}

/// Every API route, each registered together with its OpenAPI operation (`routes!` reads the
/// handler's `#[utoipa::path]`): the router, the document and the tests' route table all
/// come from this list.
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(api::openapi::ApiDoc::openapi())
        .routes(routes!(api::healthz))
        .routes(routes!(crate::metrics::metrics))
        .routes(routes!(api::openapi::openapi_json))
        .routes(routes!(api::kernels::list, api::kernels::submit))
        .routes(routes!(api::kernels::get_one))
        .routes(routes!(api::kernels::verifications))
        .routes(routes!(api::kernels::verify_request))
        .routes(routes!(api::kernels::source))
        .routes(routes!(api::jobs::verification))
        .routes(routes!(api::jobs::claim))
        .routes(routes!(api::jobs::get_job))
        .routes(routes!(api::jobs::heartbeat))
        .routes(routes!(api::jobs::report))
        .routes(routes!(api::jobs::fail))
        .routes(routes!(api::tokens::list, api::tokens::create))
        .routes(routes!(api::tokens::revoke))
        .routes(routes!(api::resolve::resolve))
        .routes(routes!(api::resolve::request_verifications))
}

/// The OpenAPI document of `api_routes`, with what the edge answers on every route declared.
pub fn openapi() -> &'static utoipa::openapi::OpenApi {
    static DOC: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = api_routes().split_for_parts().1;
        api::openapi::declare_the_edge(&mut doc);
        declare_scopes_and_limits(&mut doc);
        doc
    })
}

/// The scopes that may call each operation that needs a token (any one of them; admin holds
/// every scope). The OpenAPI document's `security` requirements are written from this table,
/// and the edge reads them there: a token without one of them is refused (403) before the
/// request's body is read. A handler may ask more once it has read the body (a Python
/// candidate needs `submit-python`).
pub const OPERATION_SCOPES: &[(&str, &str, &[Scope])] = &[
    ("POST", "/v1/kernels", &[Scope::Submit, Scope::SubmitPython]),
    (
        "POST",
        "/v1/kernels/{name}/{version}/verify",
        &[Scope::Admin],
    ),
    ("POST", "/v1/jobs/claim", &[Scope::Worker]),
    ("POST", "/v1/jobs/{id}/heartbeat", &[Scope::Worker]),
    ("POST", "/v1/jobs/{id}/report", &[Scope::Worker]),
    ("POST", "/v1/jobs/{id}/fail", &[Scope::Worker]),
    ("GET", "/v1/tokens", &[Scope::Admin]),
    ("POST", "/v1/tokens", &[Scope::Admin]),
    ("POST", "/v1/tokens/{token}/revoke", &[Scope::Admin]),
    ("POST", "/v1/resolve/verifications", &[Scope::Submit]),
];

/// Each secured operation's requirement names its scopes (`OPERATION_SCOPES`), and every
/// operation but `/healthz` declares the 429 of the rate limits.
fn declare_scopes_and_limits(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::header::HeaderBuilder;
    use utoipa::openapi::security::SecurityRequirement;
    use utoipa::openapi::{Content, ObjectBuilder, Ref, RefOr, ResponseBuilder, Type};
    for (path, item) in doc.paths.paths.iter_mut() {
        let ops = [
            ("GET", &mut item.get),
            ("POST", &mut item.post),
            ("PUT", &mut item.put),
            ("DELETE", &mut item.delete),
            ("PATCH", &mut item.patch),
        ];
        for (method, op) in ops {
            let Some(op) = op else { continue };
            let secured = op.security.as_ref().is_some_and(|s| !s.is_empty());
            if secured {
                let scopes = OPERATION_SCOPES
                    .iter()
                    .find(|(m, p, _)| *m == method && p == path)
                    .map(|(_, _, scopes)| *scopes)
                    .unwrap_or_default();
                op.security = Some(vec![SecurityRequirement::new(
                    "token",
                    scopes.iter().map(|s| s.as_str()),
                )]);
            }
            if path == "/healthz" {
                continue;
            }
            let mut why = "Too many requests without a token from this client address (`serve --anonymous-rate-per-minute`; a request with a valid token is not limited by address)".to_string();
            if secured {
                why.push_str(
                    ", or too many writes by this token (`serve --write-rate-per-minute`)",
                );
            }
            why.push_str("; retry after `Retry-After` seconds");
            let retry_after = HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1)),
                )
                .description(Some("Seconds to wait before the next request"))
                .build();
            let response = ResponseBuilder::new()
                .description(why)
                .content(
                    crate::error::PROBLEM_JSON,
                    Content::new(Some(Ref::from_schema_name("Problem"))),
                )
                .header("Retry-After", retry_after)
                .build();
            op.responses
                .responses
                .insert("429".to_string(), RefOr::T(response));
        }
    }
}

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
            crate::metrics::track,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Submit,
    /// Submit Python candidates (docs/spec.md section 2b): they run arbitrary code on the workers, so a
    /// `submit` token is not enough (docs/python-candidates.md).
    SubmitPython,
    Worker,
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Submit => "submit",
            Scope::SubmitPython => "submit-python",
            Scope::Worker => "worker",
            Scope::Admin => "admin",
        }
    }
    pub fn parse(s: &str) -> Result<Scope, String> {
        match s {
            "submit" => Ok(Scope::Submit),
            "submit-python" => Ok(Scope::SubmitPython),
            "worker" => Ok(Scope::Worker),
            "admin" => Ok(Scope::Admin),
            _ => Err(format!(
                "scope `{s}` is not valid: one of submit, submit-python, worker, admin"
            )),
        }
    }
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

/// The caller, identified by a bearer token (or anonymous).
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: Option<String>,
    pub scopes: Vec<String>,
    /// The id of the token presented (never its secret): a claim records it.
    pub token_id: Option<i64>,
}

impl Caller {
    /// 401 without a token, 403 with one that lacks `scope` (admin holds every scope).
    pub fn require(&self, scope: Scope) -> Result<&str, AppError> {
        self.require_any(Some(&[scope]))
    }

    /// 401 without a token, 403 with one that holds none of `scopes` (admin holds every
    /// scope; `None` or no scopes: any valid token).
    pub fn require_any(&self, scopes: Option<&[Scope]>) -> Result<&str, AppError> {
        let scopes = scopes.unwrap_or_default();
        let needs = scopes
            .iter()
            .map(|s| format!("`{}`", s.as_str()))
            .collect::<Vec<_>>()
            .join(" or ");
        let Some(name) = &self.name else {
            let first = scopes.first().map(|s| s.as_str()).unwrap_or("SCOPE");
            return Err(AppError::new(
                StatusCode::UNAUTHORIZED,
                format!(
                    "this needs a token with scope {needs}: send `Authorization: Bearer <token>` (create one with `kernelize token create --scope {first}`)",
                ),
            ));
        };
        if scopes.is_empty()
            || self
                .scopes
                .iter()
                .any(|s| s == "admin" || scopes.iter().any(|want| s == want.as_str()))
        {
            Ok(name)
        } else {
            Err(AppError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "token `{name}` has scopes [{}], but this needs {needs}",
                    self.scopes.join(", "),
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
        if let Some(caller) = parts.extensions.get::<Caller>() {
            return Ok(caller.clone()); // checked already (`authenticate_first`)
        }
        let caller = match parts.headers.get(header::AUTHORIZATION) {
            None => Caller {
                name: None,
                scopes: vec![],
                token_id: None,
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
                let unauthorized = |detail: String| AppError::new(StatusCode::UNAUTHORIZED, detail);
                match state.store.check_token(token).await? {
                    TokenCheck::Valid(t) => {
                        if !matches!(parts.method, Method::GET | Method::HEAD) {
                            state.writes.check(token, &t.name)?;
                        }
                        Caller {
                            name: Some(t.name),
                            scopes: t.scopes,
                            token_id: Some(t.id),
                        }
                    }
                    TokenCheck::Expired(t) => {
                        return Err(unauthorized(format!(
                            "the token `{}` expired at {}; an operator creates a new one with `kernelize token create --scope {} --expires-in 90d`",
                            t.name,
                            t.expires_at.unwrap_or_default(),
                            t.scopes.first().map(String::as_str).unwrap_or("SCOPE")
                        ))
                        .with("reason", "expired"))
                    }
                    TokenCheck::Revoked(t) => {
                        return Err(unauthorized(format!(
                            "the token `{}` was revoked at {}; an operator creates a new one with `kernelize token create`",
                            t.name,
                            t.revoked_at.unwrap_or_default()
                        ))
                        .with("reason", "revoked"))
                    }
                    TokenCheck::Unknown => {
                        return Err(unauthorized(
                            "the token is not valid (unknown to this hub); create one with `kernelize token create`".into(),
                        )
                        .with("reason", "unknown"))
                    }
                }
            }
        };
        // Reads may be made private: then any valid token may read.
        if state.config.private_reads && caller.name.is_none() && parts.method == "GET" {
            let public = matches!(parts.uri.path(), "/healthz" | "/openapi.json");
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A new operation that needs a token cannot be left without its scopes (then any valid
    /// token would pass the edge), and the table names only such operations.
    #[test]
    fn every_operation_that_needs_a_token_names_its_scopes() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let mut secured = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let Some(reqs) = op["security"].as_array() else {
                    continue;
                };
                let scopes = reqs[0]["token"].as_array().unwrap();
                assert!(
                    !scopes.is_empty(),
                    "{method} {path} needs a token: add its scopes to OPERATION_SCOPES"
                );
                secured.push((method.to_uppercase(), path.clone()));
            }
        }
        for (method, path, _) in OPERATION_SCOPES {
            assert!(
                secured.contains(&(method.to_string(), path.to_string())),
                "{method} {path} is in OPERATION_SCOPES but needs no token"
            );
        }
        assert_eq!(secured.len(), OPERATION_SCOPES.len());
    }

    #[test]
    fn a_caller_needs_one_of_the_scopes() {
        let caller = |scopes: &[&str]| Caller {
            name: Some("t".into()),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            token_id: Some(1),
        };
        let either = [Scope::Submit, Scope::SubmitPython];
        assert!(caller(&["submit-python"])
            .require_any(Some(&either))
            .is_ok());
        assert!(caller(&["admin"]).require_any(Some(&either)).is_ok());
        let e = caller(&["worker"]).require_any(Some(&either)).unwrap_err();
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        assert!(
            e.detail.ends_with("needs `submit` or `submit-python`"),
            "{}",
            e.detail
        );
        let anonymous = Caller {
            name: None,
            scopes: vec![],
            token_id: None,
        };
        let e = anonymous.require(Scope::Worker).unwrap_err();
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        assert!(e.detail.contains("--scope worker"), "{}", e.detail);
    }
}
