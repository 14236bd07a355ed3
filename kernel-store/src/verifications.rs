//! Verification records (immutable, one per completed job) and what each one covered.

use crate::audit::audit_in;
use crate::codec::{csv, finite_or, parse_col, parse_csv};
use crate::summary::MeasuredTimes;
use crate::{Result, Store, StoreError};
use kernel_registry::domain::{Arch, DType, Digest};
use kernel_registry::report::{coverage, Coverage, VerificationReport};
use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::Row;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerificationRow {
    pub id: i64,
    pub kernel_digest: Digest,
    pub job_id: Option<i64>,
    pub arch: Arch,
    pub device_name: String,
    pub exactness_class: String,
    /// When this hub stored it.
    pub created_at: String,
    /// When the GPU measured it: the report's own `started_at` (as a resolve answer's).
    pub verified_at: String,
    /// When this hub imported it (a certificate measured elsewhere, e.g. a bundled one): its
    /// `created_at` when no job of this hub produced it; `None` for this hub's worker's report.
    pub imported_at: Option<String>,
    pub report: VerificationReport,
    /// The worker's signed certificate of this report, when it sent one.
    pub certificate: Option<kernel_registry::cert::Certificate>,
}

fn verification_row(r: &AnyRow) -> Result<VerificationRow> {
    let json: String = r.try_get("report_json")?;
    let report: VerificationReport = serde_json::from_str(&json)
        .map_err(|e| StoreError::Corrupt(format!("verification report: {e}")))?;
    let job_id: Option<i64> = r.try_get("job_id")?;
    let created_at: String = r.try_get("created_at")?;
    let times = MeasuredTimes::of(&report, job_id, &created_at);
    let (verified_at, imported_at) = (
        times.verified_at.to_string(),
        times.imported_at.map(str::to_string),
    );
    Ok(VerificationRow {
        id: r.try_get("id")?,
        kernel_digest: parse_col(r, "kernel_digest")?,
        job_id,
        arch: parse_col(r, "arch")?,
        device_name: r.try_get("device_name")?,
        exactness_class: r.try_get("exactness_class")?,
        created_at,
        verified_at,
        imported_at,
        report,
        certificate: r
            .try_get::<Option<String>, _>("certificate")?
            .map(|c| serde_json::from_str(&c))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("verification certificate: {e}")))?,
    })
}

impl Store {
    pub async fn verification(&self, id: i64) -> Result<Option<VerificationRow>> {
        sqlx::query("SELECT * FROM verifications WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(verification_row)
            .transpose()
    }

    pub async fn verifications_for_kernel(&self, digest: &Digest) -> Result<Vec<VerificationRow>> {
        sqlx::query("SELECT * FROM verifications WHERE kernel_digest = $1 ORDER BY id DESC")
            .bind(digest.as_str())
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(verification_row)
            .collect()
    }

    /// (id, arch) of every verification of a kernel, newest first, without reading reports.
    pub async fn verification_archs(&self, digest: &Digest) -> Result<Vec<(i64, Arch)>> {
        sqlx::query("SELECT id, arch FROM verifications WHERE kernel_digest = $1 ORDER BY id DESC")
            .bind(digest.as_str())
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| Ok((r.try_get("id")?, parse_col(r, "arch")?)))
            .collect()
    }

    /// What a verification covered (per dtype and row length), from the coverage table;
    /// `dtype` narrows it to one dtype. Sorted by (dtype, cols).
    pub async fn coverage(
        &self,
        verification_id: i64,
        dtype: Option<DType>,
    ) -> Result<Vec<Coverage>> {
        let mut q = String::from(
            "SELECT dtype, cols, rows_min, rows_max, row_counts FROM verification_coverage \
             WHERE verification_id = $1",
        );
        if dtype.is_some() {
            q.push_str(" AND dtype = $2");
        }
        q.push_str(" ORDER BY dtype, cols");
        let mut query = sqlx::query(&q).bind(verification_id);
        if let Some(d) = dtype {
            query = query.bind(d.to_string());
        }
        query
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| {
                let i = |c: &str| -> Result<u64> { Ok(r.try_get::<i64, _>(c)? as u64) };
                Ok(Coverage {
                    dtype: parse_col(r, "dtype")?,
                    cols: i("cols")?,
                    rows_min: i("rows_min")?,
                    rows_max: i("rows_max")?,
                    row_counts: parse_csv(&r.try_get::<String, _>("row_counts")?)?,
                })
            })
            .collect()
    }

    /// The driver of the newest verification on `arch` that records one: what this hub's
    /// workers of that architecture run now.
    pub async fn newest_driver(&self, arch: Arch) -> Result<Option<String>> {
        Ok(sqlx::query(
            "SELECT driver_version FROM verifications WHERE arch = $1 \
             AND driver_version IS NOT NULL ORDER BY id DESC LIMIT 1",
        )
        .bind(arch.to_string())
        .fetch_optional(&self.pool)
        .await?
        .map(|r| r.try_get("driver_version"))
        .transpose()?)
    }

    /// The distinct worker keys (base64) whose certificates back a verification of `digest` on
    /// `arch` with the overall class `class`: how many independent workers agree on it.
    pub async fn certifying_keys(
        &self,
        digest: &Digest,
        arch: Arch,
        class: &str,
    ) -> Result<Vec<String>> {
        let mut keys: Vec<String> = sqlx::query(
            "SELECT certificate FROM verifications WHERE kernel_digest = $1 AND arch = $2 \
             AND exactness_class = $3 AND certificate IS NOT NULL",
        )
        .bind(digest.as_str())
        .bind(arch.to_string())
        .bind(class)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| {
            let text: String = r.try_get("certificate")?;
            let c: kernel_registry::cert::Certificate = serde_json::from_str(&text)
                .map_err(|e| StoreError::Corrupt(format!("verification certificate: {e}")))?;
            Ok(c.key)
        })
        .collect::<Result<_>>()?;
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// Store a verification measured elsewhere and certified (a bundled certificate of the
    /// project's GPU runs), for the stored kernel `digest`, unless this very certificate is
    /// stored already. The certificate is the caller's to check. `Some(id)` when stored now.
    pub async fn import_verification(
        &self,
        digest: &Digest,
        report: &VerificationReport,
        certificate: &kernel_registry::cert::Certificate,
        actor: &str,
    ) -> Result<Option<i64>> {
        let text = serde_json::to_string(certificate).expect("certificate serialises");
        let mut tx = self.pool.begin().await?;
        // By kernel first (indexed): only its verifications' certificates are compared.
        let known = sqlx::query(
            "SELECT id FROM verifications WHERE kernel_digest = $1 AND certificate = $2",
        )
        .bind(digest.as_str())
        .bind(&text)
        .fetch_optional(&mut *tx)
        .await?;
        if known.is_some() {
            tx.rollback().await?;
            return Ok(None);
        }
        let stamp = crate::now_rfc3339();
        let vid = insert_verification_in(
            &mut tx,
            digest.as_str(),
            None,
            report,
            Some(certificate),
            &stamp,
        )
        .await?;
        audit_in(
            &mut tx,
            actor,
            "verification.imported",
            digest.as_str(),
            serde_json::json!({
                "verification_id": vid, "arch": report.device.arch, "device": report.device.name,
                "class": report.summary.overall.class.to_string(), "key_id": certificate.key_id(),
            }),
        )
        .await?;
        tx.commit().await?;
        Ok(Some(vid))
    }

    /// Store a verification of the stored kernel `digest` without a job (load seeding and
    /// tests build large stores this way; the hub itself stores verifications only from jobs
    /// and checked certificates). Its id.
    #[doc(hidden)]
    pub async fn seed_verification(
        &self,
        digest: &Digest,
        report: &VerificationReport,
        certificate: Option<&kernel_registry::cert::Certificate>,
    ) -> Result<i64> {
        let mut tx = self.pool.begin().await?;
        let id = insert_verification_in(
            &mut tx,
            digest.as_str(),
            None,
            report,
            certificate,
            &crate::now_rfc3339(),
        )
        .await?;
        tx.commit().await?;
        Ok(id)
    }
}

/// Store a verification's coverage rows, inside the caller's transaction (idempotent).
pub(crate) async fn insert_coverage_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    verification_id: i64,
    cov: &[Coverage],
) -> Result<()> {
    for c in cov {
        sqlx::query(
            "INSERT INTO verification_coverage (verification_id, dtype, cols, rows_min, rows_max, \
             row_counts) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(verification_id)
        .bind(c.dtype.to_string())
        .bind(c.cols as i64)
        .bind(c.rows_min as i64)
        .bind(c.rows_max as i64)
        .bind(csv(&c.row_counts))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Insert a verification record and what it covered, in `tx`; its id. `job_id` is `None` for
/// an imported verification (a bundled certificate), which no job of this hub produced.
pub(crate) async fn insert_verification_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    digest: &str,
    job_id: Option<i64>,
    report: &VerificationReport,
    certificate: Option<&kernel_registry::cert::Certificate>,
    stamp: &str,
) -> Result<i64> {
    let s = &report.summary.overall;
    // The optional speeds go last, as SQL NULL when absent: sqlx 0.8's Any driver binds a
    // NULL f64 as float4 on PostgreSQL, which breaks the float8 statement it caches.
    let speeds = [s.gbps_4096x8192, s.gbps_32768x4096];
    let mut next = 15;
    let speed_sql: Vec<String> = speeds
        .iter()
        .map(|g| match g {
            Some(_) => {
                next += 1;
                format!("${next}")
            }
            None => "NULL".to_string(),
        })
        .collect();
    let sql = format!(
            "INSERT INTO verifications (kernel_digest, job_id, arch, device_name, exactness_class, \
             max_ulp, max_mismatch_fraction, max_abs_diff, deterministic, batch_invariant, \
             integrity_ok, report_json, created_at, certificate, driver_version, gbps_4096x8192, \
             gbps_32768x4096) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, {}, {}) RETURNING id",
            speed_sql[0], speed_sql[1]
        );
    let mut insert = sqlx::query(&sql)
        .bind(digest)
        .bind(job_id)
        .bind(report.device.arch.to_string())
        .bind(&report.device.name)
        .bind(s.class.to_string())
        .bind(s.max_ulp.min(i64::MAX as u64) as i64)
        .bind(finite_or(s.max_mismatch_fraction, 1.0))
        .bind(finite_or(s.max_abs_diff, f64::MAX))
        .bind(s.deterministic as i64)
        .bind(s.batch_invariant as i64)
        .bind(s.integrity_ok as i64)
        .bind(serde_json::to_string(report).expect("report serialises"))
        .bind(stamp)
        .bind(certificate.map(|c| serde_json::to_string(c).expect("certificate serialises")))
        .bind(&report.device.driver_version);
    for g in speeds.into_iter().flatten() {
        insert = insert.bind(g);
    }
    let vid: i64 = insert.fetch_one(&mut **tx).await?.try_get("id")?;
    insert_coverage_in(tx, vid, &coverage(report)).await?;
    crate::summary::insert_summary_in(tx, vid, digest, job_id, report, certificate, stamp).await?;
    Ok(vid)
}
