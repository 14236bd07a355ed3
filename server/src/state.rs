//! The service's shared state and who is calling: what every handler, page and the edge take
//! (`AppState`, `Caller`, `Scope`), and the operator's `Config`. No routes here: the route list
//! (`crate::routes`) and the application (`crate::app`) are built on these, so nothing they
//! route to imports them back.

use crate::edge::rate::{AddressLimits, WriteLimits};
use crate::error::AppError;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, Method, StatusCode};
use kernel_store::{Store, TokenCheck};
use std::sync::Arc;
use std::time::Duration;

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
    pub overview:
        Arc<crate::answers::GenerationCache<Arc<crate::dashboard::overview_data::OverviewData>>>,
}

impl AppState {
    /// Resolution over this state's store and caches (`crate::resolve::Resolver`).
    pub fn resolver(&self) -> crate::resolve::Resolver<'_> {
        crate::resolve::Resolver {
            store: &self.store,
            answers: &self.answers,
            rankings: &self.rankings,
            pools: &self.pools,
            max_pending: self.config.max_pending_width_jobs,
        }
    }

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
