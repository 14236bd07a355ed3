//! API tokens over HTTP (token scope `admin`): list, create (shown once), revoke. The same
//! operations as `kernelize token list|create|revoke` on the database.

use crate::error::{rejection, AppError};
use crate::state::{AppState, Caller, Scope};
use axum::extract::{rejection::JsonRejection, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kernel_store::{Expiry, TokenInfo, DEFAULT_TOKEN_LIFETIME};
use serde::{Deserialize, Serialize};

/// `POST /v1/tokens`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    /// A name for the token, shown in the audit log and in `kernelize token list`: one line of
    /// printable text, at most 200 characters (`kernel_store::MAX_TOKEN_NAME`; utoipa takes only
    /// a literal here, and a test holds the two equal).
    #[schema(max_length = 200, pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    pub name: String,
    /// Any of submit, submit-python, worker, admin.
    pub scopes: Vec<String>,
    /// `90d`, `12h`, `30m`, `45s` or `never` (default 90d), exactly: no spaces around it.
    #[serde(default)]
    #[schema(max_length = 32)]
    pub expires_in: Option<String>,
}

/// A token as listed: never its secret.
#[derive(Debug, Serialize)]
pub struct TokenListEntry {
    #[serde(flatten)]
    pub token: TokenInfo,
    pub expired: bool,
}

#[derive(Debug, Serialize)]
pub struct TokenList {
    pub tokens: Vec<TokenListEntry>,
}

/// 201 of `POST /v1/tokens`: the secret, shown this once.
#[derive(Debug, Serialize)]
pub struct CreatedToken {
    pub token: String,
    #[serde(flatten)]
    pub info: TokenInfo,
}

/// 200 of `POST /v1/tokens/{token}/revoke`.
#[derive(Debug, Serialize)]
pub struct RevokedToken {
    #[serde(flatten)]
    pub info: TokenInfo,
    /// It was revoked before (nothing changed).
    pub already_revoked: bool,
    /// Running jobs the token held, queued again.
    pub requeued_jobs: Vec<i64>,
}

/// Every token (name, scopes, created, expires, last used, revoked), never a secret.
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens",
    responses((status = 200, description = "The tokens"), (status = 401, description = "No valid token"),
        (status = 403, description = "Token lacks scope admin")),
    security(("token" = [])))]
pub async fn list(State(st): State<AppState>, caller: Caller) -> Result<Json<TokenList>, AppError> {
    caller.require(Scope::Admin)?;
    let now = kernel_store::now_ms();
    let tokens = st
        .store
        .list_tokens()
        .await?
        .into_iter()
        .map(|t| TokenListEntry {
            expired: t.is_expired(now),
            token: t,
        })
        .collect();
    Ok(Json(TokenList { tokens }))
}

/// Create a token; its secret is in this answer only (the hub stores its hash).
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = CreateTokenRequest,
    responses((status = 201, description = "Created; `token` is the secret, shown once"),
        (status = 401, description = "No valid token"), (status = 403, description = "Token lacks scope admin"),
        (status = 422, description = "Bad name, scope or lifetime; `field` names it")),
    security(("token" = [])))]
pub async fn create(
    State(st): State<AppState>,
    caller: Caller,
    b: Result<Json<CreateTokenRequest>, JsonRejection>,
) -> Result<Response, AppError> {
    let actor = caller.require(Scope::Admin)?.to_string();
    let Json(b) = b.map_err(rejection)?;
    if b.scopes.is_empty() {
        return Err(AppError::unprocessable(
            "a token needs at least one scope: submit, submit-python, worker or admin",
        )
        .with("field", "scopes"));
    }
    for s in &b.scopes {
        Scope::parse(s).map_err(|e| AppError::unprocessable(e).with("field", "scopes"))?;
    }
    let expiry = match b.expires_in.as_deref() {
        None => DEFAULT_TOKEN_LIFETIME,
        Some(s) => s
            .parse::<Expiry>()
            .map_err(|e| AppError::unprocessable(e).with("field", "expires_in"))?,
    };
    let (info, token) = st
        .store
        .create_token(&b.name, &b.scopes, expiry, &actor)
        .await
        .map_err(|e| match e {
            kernel_store::StoreError::Invalid(m) => {
                AppError::unprocessable(m).with("field", "name")
            }
            other => other.into(),
        })?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token, info })).into_response())
}

/// Revoke a token by id (or by name, when exactly one token not yet revoked has it): it stops
/// working at once, and the jobs it holds go back to the queue.
#[utoipa::path(post, path = "/v1/tokens/{token}/revoke", tag = "tokens", params(("token" = String, Path, description = "Token id, or its name")),
    responses((status = 200, description = "Revoked (or already revoked)"), (status = 401, description = "No valid token"),
        (status = 403, description = "Token lacks scope admin"), (status = 404, description = "No such token"),
        (status = 409, description = "Several tokens have this name: give the id")),
    security(("token" = [])))]
pub async fn revoke(
    State(st): State<AppState>,
    caller: Caller,
    Path(which): Path<String>,
) -> Result<Json<RevokedToken>, AppError> {
    let actor = caller.require(Scope::Admin)?.to_string();
    let r = st.store.revoke_token(&which, &actor).await?;
    Ok(Json(RevokedToken {
        info: r.token,
        already_revoked: r.already,
        requeued_jobs: r.requeued_jobs,
    }))
}
