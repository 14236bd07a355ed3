//! API tokens: random, shown once, stored as a hash, with scopes, an expiry and a revocation.

use crate::audit::audit_in;
use crate::codec::{csv, parse_csv, random_hex};
use crate::jobs::requeue_claims_of_in;
use crate::{now_ms, now_rfc3339, Result, Store, StoreError};
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use sqlx::any::AnyRow;
use sqlx::Row;
use std::fmt;
use std::str::FromStr;

/// sha256 of a token, as stored; the token itself is never stored.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// How long a new token lives unless told otherwise (`kernelize token create --expires-in`).
pub const DEFAULT_TOKEN_LIFETIME: Expiry = Expiry::After {
    ms: 90 * 24 * 3600 * 1000,
};

/// A token's lifetime: `90d`, `12h`, `30m`, `45s`, or `never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    Never,
    After { ms: i64 },
}

/// The longest token name (characters), on every backend (PostgreSQL's index on the name
/// cannot hold much more than 2,700 bytes; SQLite would store any length).
pub const MAX_TOKEN_NAME: usize = 200;

impl FromStr for Expiry {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        // Messages quote the value, and never much of it (a value sent over HTTP may be long).
        let quoted = match s.char_indices().nth(40) {
            Some((cut, _)) => format!("{}… ({} characters)", &s[..cut], s.chars().count()),
            None => s.to_string(),
        };
        let q = &quoted;
        if s.trim() != s {
            return Err(format!(
                "`{q}` has spaces around it: write the lifetime alone (e.g. `90d` or `never`)"
            ));
        }
        if s == "never" {
            return Ok(Expiry::Never);
        }
        let bad = || {
            format!(
                "`{q}` is not a lifetime: write a whole number with a unit, d (days), h, m or s (e.g. 90d, 12h), or `never`"
            )
        };
        let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
        let n: i64 = n.parse().map_err(|_| bad())?;
        let unit_ms: i64 = match unit {
            "d" => 86_400_000,
            "h" => 3_600_000,
            "m" => 60_000,
            "s" => 1_000,
            _ => return Err(bad()),
        };
        if n == 0 {
            return Err(format!("`{q}`: a token must live longer than 0"));
        }
        // At most 10 years: a longer lifetime is `never` in disguise.
        let ms = n
            .checked_mul(unit_ms)
            .filter(|ms| *ms <= 3650 * 86_400_000)
            .ok_or_else(|| {
                format!("`{q}` is longer than 10 years; write `never` if you mean it")
            })?;
        Ok(Expiry::After { ms })
    }
}

impl fmt::Display for Expiry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expiry::Never => f.write_str("never"),
            Expiry::After { ms } if ms % 86_400_000 == 0 => write!(f, "{}d", ms / 86_400_000),
            Expiry::After { ms } if ms % 3_600_000 == 0 => write!(f, "{}h", ms / 3_600_000),
            Expiry::After { ms } if ms % 60_000 == 0 => write!(f, "{}m", ms / 60_000),
            Expiry::After { ms } => write!(f, "{}s", ms / 1000),
        }
    }
}

/// A stored token, as `kernelize token list` shows it (never its secret or hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenInfo {
    pub id: i64,
    pub name: String,
    pub scopes: Vec<String>,
    pub created_at: String,
    /// RFC 3339; `None`: never expires.
    pub expires_at: Option<String>,
    pub last_used_at: Option<String>,
    pub revoked_at: Option<String>,
    #[serde(skip)]
    pub expires_ms: Option<i64>,
}

impl TokenInfo {
    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_ms.is_some_and(|e| e <= now_ms)
    }
}

/// What a presented token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenCheck {
    Valid(TokenInfo),
    Expired(TokenInfo),
    Revoked(TokenInfo),
    Unknown,
}

/// What `Store::revoke_token` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    pub token: TokenInfo,
    /// It was revoked before this call (nothing changed).
    pub already: bool,
    /// Running jobs this token held, put back in the queue.
    pub requeued_jobs: Vec<i64>,
}

const TOKEN_COLS: &str = "id, name, scopes, created_at, expires_ms, last_used_ms, revoked_at";

pub(crate) fn ms_to_rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{ms} ms after 1970"))
}

fn token_row(r: &AnyRow) -> Result<TokenInfo> {
    let expires_ms: Option<i64> = r.try_get("expires_ms")?;
    let last_used_ms: Option<i64> = r.try_get("last_used_ms")?;
    Ok(TokenInfo {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        scopes: parse_csv(&r.try_get::<String, _>("scopes")?)?,
        created_at: r.try_get("created_at")?,
        expires_at: expires_ms.map(ms_to_rfc3339),
        last_used_at: last_used_ms.map(ms_to_rfc3339),
        revoked_at: r.try_get("revoked_at")?,
        expires_ms,
    })
}

/// Last use is written at most this often per token (every request would be a write).
const LAST_USED_RESOLUTION_MS: i64 = 60_000;

impl Store {
    /// Create a token on behalf of `actor`; the plaintext is returned once and only its hash
    /// is stored. Audited as `token.created`.
    pub async fn create_token(
        &self,
        name: &str,
        scopes: &[String],
        expiry: Expiry,
        actor: &str,
    ) -> Result<(TokenInfo, String)> {
        let name = name.trim();
        if name.is_empty() || name.parse::<i64>().is_ok() {
            return Err(StoreError::Invalid(format!(
                "token name `{name}` must be non-empty and not a number (numbers name token ids in `kernelize token revoke`)"
            )));
        }
        if name.chars().count() > MAX_TOKEN_NAME {
            return Err(StoreError::Invalid(format!(
                "a token name is at most {MAX_TOKEN_NAME} characters; this one has {}",
                name.chars().count()
            )));
        }
        let token = format!("kz_{}", random_hex(24));
        let expires_ms = match expiry {
            Expiry::Never => None,
            Expiry::After { ms } => Some(now_ms() + ms),
        };
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(&format!(
            "INSERT INTO api_tokens (name, token_hash, scopes, created_at, expires_ms) \
             VALUES ($1, $2, $3, $4, $5) RETURNING {TOKEN_COLS}"
        ))
        .bind(name)
        .bind(hash_token(&token))
        .bind(csv(scopes))
        .bind(now_rfc3339())
        .bind(expires_ms)
        .fetch_one(&mut *tx)
        .await?;
        let info = token_row(&row)?;
        audit_in(
            &mut tx,
            actor,
            "token.created",
            name,
            serde_json::json!({
                "token_id": info.id, "scopes": scopes, "expires_at": info.expires_at,
            }),
        )
        .await?;
        tx.commit().await?;
        Ok((info, token))
    }

    /// What a presented token is; a valid one has its last use recorded (to the minute).
    pub async fn check_token(&self, token: &str) -> Result<TokenCheck> {
        let r = sqlx::query(&format!(
            "SELECT {TOKEN_COLS} FROM api_tokens WHERE token_hash = $1"
        ))
        .bind(hash_token(token))
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = r else {
            return Ok(TokenCheck::Unknown);
        };
        let info = token_row(&r)?;
        let now = now_ms();
        if info.revoked_at.is_some() {
            return Ok(TokenCheck::Revoked(info));
        }
        if info.is_expired(now) {
            return Ok(TokenCheck::Expired(info));
        }
        sqlx::query(
            "UPDATE api_tokens SET last_used_ms = $1 WHERE id = $2 \
             AND (last_used_ms IS NULL OR last_used_ms < $3)",
        )
        .bind(now)
        .bind(info.id)
        .bind(now - LAST_USED_RESOLUTION_MS)
        .execute(&self.pool)
        .await?;
        Ok(TokenCheck::Valid(info))
    }

    /// Every token, oldest first (revoked and expired ones included).
    pub async fn list_tokens(&self) -> Result<Vec<TokenInfo>> {
        sqlx::query(&format!("SELECT {TOKEN_COLS} FROM api_tokens ORDER BY id"))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(token_row)
            .collect()
    }

    /// The token a `kernelize token revoke` argument names: an id, or the name of exactly one
    /// token not yet revoked.
    pub async fn find_token(&self, which: &str) -> Result<TokenInfo> {
        let which = which.trim();
        let all = self.list_tokens().await?;
        if let Ok(id) = which.parse::<i64>() {
            return all.into_iter().find(|t| t.id == id).ok_or_else(|| {
                StoreError::NotFound(format!(
                    "no token with id {id}; `kernelize token list` shows them"
                ))
            });
        }
        let named: Vec<TokenInfo> = all.into_iter().filter(|t| t.name == which).collect();
        let live: Vec<&TokenInfo> = named.iter().filter(|t| t.revoked_at.is_none()).collect();
        match (live.as_slice(), named.first()) {
            ([one], _) => Ok((*one).clone()),
            ([], Some(revoked)) => Ok(revoked.clone()),
            ([], None) => Err(StoreError::NotFound(format!(
                "no token named `{which}`; `kernelize token list` shows them"
            ))),
            (many, _) => Err(StoreError::Conflict(format!(
                "{} tokens are named `{which}` (ids {}); name one by its id",
                many.len(),
                many.iter()
                    .map(|t| t.id.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Revoke a token (by id or unambiguous name) on behalf of `actor`: it stops working at
    /// once, and the jobs it holds go back to the queue (their attempt does not count). Audited
    /// as `token.revoked`. Revoking a revoked token changes nothing.
    pub async fn revoke_token(&self, which: &str, actor: &str) -> Result<Revoked> {
        let token = self.find_token(which).await?;
        if token.revoked_at.is_some() {
            return Ok(Revoked {
                token,
                already: true,
                requeued_jobs: vec![],
            });
        }
        let stamp = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE api_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL \
             RETURNING {TOKEN_COLS}"
        ))
        .bind(&stamp)
        .bind(token.id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            // Revoked concurrently.
            tx.rollback().await?;
            return Ok(Revoked {
                token: self.find_token(&token.id.to_string()).await?,
                already: true,
                requeued_jobs: vec![],
            });
        };
        let info = token_row(&row)?;
        let requeued = requeue_claims_of_in(
            &mut tx,
            info.id,
            &format!(
                "re-queued: the token `{}` that claimed it was revoked",
                info.name
            ),
        )
        .await?;
        audit_in(
            &mut tx,
            actor,
            "token.revoked",
            &info.name,
            serde_json::json!({"token_id": info.id, "requeued_jobs": requeued}),
        )
        .await?;
        tx.commit().await?;
        Ok(Revoked {
            token: info,
            already: false,
            requeued_jobs: requeued,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_parse_and_print() {
        assert_eq!("90d".parse::<Expiry>(), Ok(DEFAULT_TOKEN_LIFETIME));
        assert_eq!("never".parse::<Expiry>(), Ok(Expiry::Never));
        assert_eq!(
            "12h".parse::<Expiry>(),
            Ok(Expiry::After { ms: 12 * 3_600_000 })
        );
        for s in ["90d", "12h", "30m", "45s", "never"] {
            assert_eq!(s.parse::<Expiry>().unwrap().to_string(), s);
        }
        for bad in ["", "90", "d", "1.5d", "-1d", "0d", "90 days", "99999d"] {
            let e = bad.parse::<Expiry>().unwrap_err();
            assert!(
                e.contains("lifetime") || e.contains("longer than"),
                "{bad}: {e}"
            );
        }
    }
}
