//! Workers' public keys: a signed report is stored only when its certificate verifies against
//! one of these (registered by an admin, not revoked).

use crate::audit::audit_in;
use crate::{now_rfc3339, Result, Store, StoreError};
use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::Row;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerKey {
    pub id: i64,
    pub name: String,
    /// ed25519, 32 bytes, standard base64.
    pub public_key: String,
    pub created_at: String,
    pub revoked_at: Option<String>,
}

fn key_row(r: &AnyRow) -> Result<WorkerKey> {
    Ok(WorkerKey {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        public_key: r.try_get("public_key")?,
        created_at: r.try_get("created_at")?,
        revoked_at: r.try_get("revoked_at")?,
    })
}

impl Store {
    /// Register a worker's public key under `name` (audited). The same name and key again is
    /// no change (the registration is returned); `Conflict` when the name or the key is
    /// registered otherwise. The key's encoding is the caller's to check.
    pub async fn register_worker_key(
        &self,
        name: &str,
        public_key: &str,
        actor: &str,
    ) -> Result<WorkerKey> {
        let mut tx = self.pool.begin().await?;
        let taken = sqlx::query(
            "SELECT name, public_key FROM worker_keys WHERE name = $1 OR public_key = $2",
        )
        .bind(name)
        .bind(public_key)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(r) = taken {
            let (n, k): (String, String) = (r.try_get("name")?, r.try_get("public_key")?);
            tx.rollback().await?;
            if n == name && k == public_key {
                // The same registration again (a set-up script run twice): nothing to do.
                return self
                    .worker_key(public_key)
                    .await?
                    .ok_or_else(|| StoreError::NotFound(format!("worker key `{name}`")));
            }
            return Err(StoreError::Conflict(if n == name {
                format!("a worker key named `{name}` is registered already with another key; choose another name")
            } else {
                format!("this public key is registered already as `{n}`")
            }));
        }
        let row = sqlx::query(
            "INSERT INTO worker_keys (name, public_key, created_at) VALUES ($1, $2, $3) \
             RETURNING id, name, public_key, created_at, revoked_at",
        )
        .bind(name)
        .bind(public_key)
        .bind(now_rfc3339())
        .fetch_one(&mut *tx)
        .await?;
        let key = key_row(&row)?;
        audit_in(
            &mut tx,
            actor,
            "worker_key.registered",
            name,
            serde_json::json!({"key_id": key.id, "public_key": public_key}),
        )
        .await?;
        tx.commit().await?;
        Ok(key)
    }

    /// The registered key with this public key (revoked or not).
    pub async fn worker_key(&self, public_key: &str) -> Result<Option<WorkerKey>> {
        sqlx::query("SELECT * FROM worker_keys WHERE public_key = $1")
            .bind(public_key)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(key_row)
            .transpose()
    }

    /// Revoke the key named `name_or_id` (its name, or its id): reports signed by it are
    /// refused from then on; verifications already stored keep their certificates. Audited.
    pub async fn revoke_worker_key(&self, name_or_id: &str, actor: &str) -> Result<WorkerKey> {
        let mut tx = self.pool.begin().await?;
        let id = name_or_id.parse::<i64>().unwrap_or(-1);
        let Some(row) = sqlx::query("SELECT * FROM worker_keys WHERE name = $1 OR id = $2")
            .bind(name_or_id)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
        else {
            tx.rollback().await?;
            return Err(StoreError::NotFound(format!(
                "no worker key named `{name_or_id}` (`kernelize worker-key list` shows them)"
            )));
        };
        let key = key_row(&row)?;
        if key.revoked_at.is_some() {
            tx.rollback().await?;
            return Ok(key);
        }
        let row = sqlx::query(
            "UPDATE worker_keys SET revoked_at = $1 WHERE id = $2 \
             RETURNING id, name, public_key, created_at, revoked_at",
        )
        .bind(now_rfc3339())
        .bind(key.id)
        .fetch_one(&mut *tx)
        .await?;
        let key = key_row(&row)?;
        audit_in(
            &mut tx,
            actor,
            "worker_key.revoked",
            &key.name,
            serde_json::json!({"key_id": key.id}),
        )
        .await?;
        tx.commit().await?;
        Ok(key)
    }

    pub async fn worker_keys(&self) -> Result<Vec<WorkerKey>> {
        sqlx::query("SELECT * FROM worker_keys ORDER BY id")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(key_row)
            .collect()
    }
}
