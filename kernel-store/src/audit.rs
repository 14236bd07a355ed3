//! The append-only audit log: who did what to which kernel or job.

use crate::{now_rfc3339, Result, Store, StoreError};
use serde::Serialize;
use sqlx::Row;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    pub id: i64,
    pub at: String,
    pub actor: String,
    pub action: String,
    pub subject: String,
    pub detail: serde_json::Value,
}

impl Store {
    pub async fn audit(
        &self,
        actor: &str,
        action: &str,
        subject: &str,
        detail: serde_json::Value,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        audit_in(&mut tx, actor, action, subject, detail).await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn audit_entries(&self, limit: i64) -> Result<Vec<AuditEntry>> {
        sqlx::query("SELECT id, at, actor, action, subject, detail FROM audit_log ORDER BY id DESC LIMIT $1")
            .bind(limit)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| {
                let detail: String = r.try_get("detail")?;
                Ok(AuditEntry {
                    id: r.try_get("id")?,
                    at: r.try_get("at")?,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    subject: r.try_get("subject")?,
                    detail: serde_json::from_str(&detail)
                        .map_err(|e| StoreError::Corrupt(format!("audit detail: {e}")))?,
                })
            })
            .collect()
    }
}

pub(crate) async fn audit_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    actor: &str,
    action: &str,
    subject: &str,
    detail: serde_json::Value,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO audit_log (at, actor, action, subject, detail) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(now_rfc3339())
    .bind(actor)
    .bind(action)
    .bind(subject)
    .bind(detail.to_string())
    .execute(&mut **tx)
    .await?;
    Ok(())
}
