//! Kernels and their sources: stored once by content digest, immutable, listed by the API.

use crate::audit::audit_in;
use crate::codec::{bound, csv};
use crate::jobs::queue_job_in;
use crate::kernel_rows::{
    k_cols, kernel_conditions, kernel_row, kernel_row_of, KernelQuery, KernelRow, KERNEL_COLS,
    KERNEL_COLS_BASE,
};
use crate::{now_rfc3339, Result, Store, StoreError};
use kernel_registry::domain::Digest;
use kernel_registry::manifest::{digest_of, KernelBundle, Manifest, Runtime};
use sqlx::Row;

/// The result of storing a kernel.
#[derive(Debug, Clone)]
pub enum Inserted {
    /// A new kernel, with the verification job created for it.
    New { kernel: KernelRow, job_id: i64 },
    /// Exactly this content was already stored: nothing changed.
    Existing(KernelRow),
}

impl Inserted {
    pub fn kernel(&self) -> &KernelRow {
        match self {
            Inserted::New { kernel, .. } | Inserted::Existing(kernel) => kernel,
        }
    }
}

#[derive(Debug, Clone)]
pub struct StoredSource {
    pub digest: Digest,
    pub manifest_toml: String,
    pub manifest: Manifest,
    pub source: String,
}

impl Store {
    /// Store a kernel (source by digest, kernel row, verification job) in one transaction.
    /// The same content again is a no-op; the same name and version with other content is a
    /// `Conflict`.
    pub async fn insert_kernel(
        &self,
        bundle: &KernelBundle,
        origin: &str,
        actor: &str,
    ) -> Result<Inserted> {
        let m = &bundle.manifest;
        let digest = bundle.digest();
        let now = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO sources (digest, manifest_toml, manifest_json, source, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (digest) DO NOTHING",
        )
        .bind(digest.as_str())
        .bind(&bundle.manifest_toml)
        .bind(serde_json::to_string(m).expect("manifest serialises"))
        .bind(&bundle.source)
        .bind(&now)
        .execute(&mut *tx)
        .await?;
        // A CUDA kernel leaves `runtime` to its default ('cuda').
        let (runtime_col, runtime_val) = match m.runtime {
            Runtime::Cuda => ("", ""),
            Runtime::Python => (", runtime", ", 'python'"),
        };
        let inserted = sqlx::query(&format!(
            "INSERT INTO kernels (name, version, digest, op, semantics, dtypes, archs, cols_min, \
             cols_max, cols_multiple_of, description, license, authors, origin, created_at{runtime_col}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15{runtime_val}) \
             ON CONFLICT DO NOTHING RETURNING {KERNEL_COLS_BASE}"
        ))
        .bind(&m.name)
        .bind(m.version.to_string())
        .bind(digest.as_str())
        .bind(m.op.as_str())
        .bind(m.semantics.as_str())
        .bind(csv(m.entries.keys()))
        .bind(csv(&m.constraints.archs))
        .bind(m.constraints.cols_min as i64)
        .bind(m.constraints.cols_max.map(|c| c as i64))
        .bind(m.constraints.cols_multiple_of as i64)
        .bind(&m.description)
        .bind(&m.license)
        .bind(serde_json::to_string(&m.authors).expect("authors serialise"))
        .bind(origin)
        .bind(&now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = inserted else {
            tx.rollback().await?;
            if let Some(k) = self.kernel_by_digest(&digest).await? {
                return Ok(Inserted::Existing(k));
            }
            let version = m.version.to_string();
            return match self.kernel(&m.name, &version).await? {
                Some(k) => Err(StoreError::Conflict(format!(
                    "{} {} is already stored with other content (digest {}); kernels are immutable: publish a new version",
                    m.name, version, k.digest
                ))),
                None => Err(StoreError::Conflict(format!(
                    "{} {} could not be stored: a concurrent write conflicted; try again",
                    m.name, version
                ))),
            };
        };
        let kernel = kernel_row_of(&row, m.runtime)?;
        let job_id = queue_job_in(&mut tx, &digest, &now).await?;
        audit_in(
            &mut tx,
            actor,
            "kernel.created",
            &format!("{} {}", m.name, m.version),
            serde_json::json!({"digest": digest, "origin": origin, "job_id": job_id}),
        )
        .await?;
        tx.commit().await?;
        Ok(Inserted::New { kernel, job_id })
    }

    pub async fn kernel(&self, name: &str, version: &str) -> Result<Option<KernelRow>> {
        sqlx::query(&format!(
            "SELECT {KERNEL_COLS} FROM kernels WHERE name = $1 AND version = $2"
        ))
        .bind(name)
        .bind(version)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(kernel_row)
        .transpose()
    }

    pub async fn kernel_by_digest(&self, digest: &Digest) -> Result<Option<KernelRow>> {
        sqlx::query(&format!(
            "SELECT {KERNEL_COLS} FROM kernels WHERE digest = $1"
        ))
        .bind(digest.as_str())
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(kernel_row)
        .transpose()
    }

    /// How many kernels are stored.
    pub async fn kernel_count(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT COUNT(*) AS n FROM kernels")
            .fetch_one(&self.pool)
            .await?
            .try_get("n")?)
    }

    /// The kernels with these ids, in the order given (ids not stored are skipped): one query
    /// by primary key, for a page of a list whose ids were read before.
    pub async fn kernels_by_ids(&self, ids: &[i64]) -> Result<Vec<KernelRow>> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        let rows = sqlx::query(&format!(
            "SELECT {KERNEL_COLS} FROM kernels WHERE id IN ({})",
            list.join(",")
        ))
        .fetch_all(&self.pool)
        .await?;
        let mut by_id: std::collections::HashMap<i64, KernelRow> = rows
            .iter()
            .map(|r| kernel_row(r).map(|k| (k.id, k)))
            .collect::<Result<_>>()?;
        Ok(ids.iter().filter_map(|id| by_id.remove(id)).collect())
    }

    /// Kernels matching the filters, newest name/version order, with the total count.
    pub async fn list_kernels(&self, q: &KernelQuery) -> Result<(Vec<KernelRow>, i64)> {
        // Filters are bound in a fixed order so the `$n` numbering is ascending in the text.
        let mut binds: Vec<String> = Vec::new();
        let conds = kernel_conditions(q, &mut binds);
        let filter = if conds.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conds.join(" AND "))
        };
        let total = self
            .count_with(&format!("SELECT COUNT(*) FROM kernels k {filter}"), &binds)
            .await?;
        let n = binds.len();
        let sql = format!(
            "SELECT {} FROM kernels k {filter} ORDER BY k.op, k.semantics, k.name, k.id LIMIT ${} OFFSET ${}",
            k_cols(),
            n + 1,
            n + 2
        );
        let list = bound(&sql, &binds);
        let rows = list
            .bind(q.limit)
            .bind(q.offset)
            .fetch_all(&self.pool)
            .await?;
        let kernels = rows.iter().map(kernel_row).collect::<Result<Vec<_>>>()?;
        Ok((kernels, total))
    }

    /// A kernel's manifest and source by digest, re-checked against the digest on read.
    pub async fn source(&self, digest: &Digest) -> Result<Option<StoredSource>> {
        let Some(r) = sqlx::query(
            "SELECT digest, manifest_toml, manifest_json, source FROM sources WHERE digest = $1",
        )
        .bind(digest.as_str())
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let manifest_json: String = r.try_get("manifest_json")?;
        let manifest: Manifest = serde_json::from_str(&manifest_json)
            .map_err(|e| StoreError::Corrupt(format!("{digest}: manifest: {e}")))?;
        let source: String = r.try_get("source")?;
        let actual = digest_of(&manifest, &source);
        if &actual != digest {
            return Err(StoreError::Corrupt(format!(
                "{digest}: the stored manifest and source hash to {actual}"
            )));
        }
        Ok(Some(StoredSource {
            digest: digest.clone(),
            manifest_toml: r.try_get("manifest_toml")?,
            manifest,
            source,
        }))
    }
}
