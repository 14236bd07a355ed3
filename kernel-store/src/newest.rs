//! The newest verification per kernel and architecture, and what a policy is checked against:
//! a resolve's candidates (`NewestVerdict`, `CandidateKernel`, `VerdictOn`, built by the
//! verdict index, `crate::index`), a verification's verdict parts for one dtype
//! (`Store::verdict_parts`, for the lines that say why a verdict fails a policy), the
//! generation of stored answers, and the summaries of older databases
//! (`Store::backfill_summaries`). `newest_verifications` is kept by a trigger in the
//! transaction that stores a verification; the per-dtype verdicts (with the columns a policy
//! decides on), speeds and facts are written beside it (`crate::summary::insert_summary_in`).
//! A policy is decided in one place, `Policy::passes` (kernel-registry), over the verdict
//! index's facts of these columns; tests compare it with `Policy::evaluate` on the full
//! reports. The stale list is in `crate::stale`, the dashboard's matrix in `crate::matrix`.

use crate::codec::{parse_col, parse_csv};
use crate::kernel_rows::runtime_of;
use crate::{Result, Store, StoreError};
use kernel_registry::capability::CapabilityReport;
use kernel_registry::cert::Certificate;
use kernel_registry::report::{ModelReport, Verdict, VerificationReport};
use kernel_registry::{Arch, DType, Policy};
use sqlx::any::AnyRow;
use sqlx::Row;
use std::collections::HashMap;
use std::sync::Arc;

/// A kernel of a resolve's candidate set with its newest verification on the asked
/// architecture, read from the summary tables (no report, no verdict text).
#[derive(Debug, Clone, PartialEq)]
pub struct NewestVerdict {
    /// Shared with the verdict index (a group's candidates are read for every ranking).
    pub kernel: Arc<CandidateKernel>,
    /// `None`: not verified on the architecture.
    pub on: Option<VerdictOn>,
    /// The architectures it was verified on (when `on` is `None`), sorted as text.
    pub elsewhere: Vec<Arch>,
}

/// What a resolve needs of a candidate kernel before it is chosen (`Store::kernel_by_digest`
/// reads the rest for the one that is).
#[derive(Debug, Clone, PartialEq)]
pub struct CandidateKernel {
    pub id: i64,
    pub name: String,
    pub version: String,
    pub digest: kernel_registry::Digest,
    pub dtypes: Vec<DType>,
    pub constraints: kernel_registry::manifest::Constraints,
    /// CUDA or Python (docs/spec.md section 2b): resolve considers Python candidates only when asked to.
    pub runtime: kernel_registry::Runtime,
}

impl CandidateKernel {
    /// From a row of `kernels` (its id, name, version, digest, dtypes, constraint columns and
    /// runtime), as the SQL reads and the verdict index read it.
    pub(crate) fn of_row(r: &AnyRow) -> Result<Self> {
        Ok(CandidateKernel {
            id: r.try_get("id")?,
            name: r.try_get("name")?,
            version: r.try_get("version")?,
            digest: parse_col(r, "digest")?,
            dtypes: parse_csv(&r.try_get::<String, _>("dtypes")?)?,
            constraints: kernel_registry::manifest::Constraints {
                cols_min: r.try_get::<i64, _>("cols_min")? as u64,
                cols_max: r.try_get::<Option<i64>, _>("cols_max")?.map(|c| c as u64),
                cols_multiple_of: r.try_get::<i64, _>("cols_multiple_of")? as u64,
                archs: parse_csv(&r.try_get::<String, _>("archs")?)?,
            },
            runtime: runtime_of(r)?,
        })
    }
}

/// The newest verification of a kernel on an architecture, as the summary tables hold it.
#[derive(Debug, Clone, PartialEq)]
pub struct VerdictOn {
    pub verification_id: i64,
    pub arch: Arch,
    // Shared text (the verdict index hands out a group's verdicts for every ranking).
    pub device_name: Arc<str>,
    /// The GPU's SMs and threads per SM (`None`: its report has none): what a backward op's
    /// verdict depends on (eager's column sum for dw is configured from both).
    pub sm_count: Option<u32>,
    pub threads_per_sm: Option<u32>,
    pub created_at: Arc<str>,
    /// The overall class.
    pub class: Arc<str>,
    pub suite_version: Arc<str>,
    pub driver_version: Arc<str>,
    /// Whether the dtype's verdict meets the policy (not counting `confirmed:N`).
    pub passes: bool,
    /// Distinct worker keys certifying `class` on the architecture (counted only when the
    /// policy asks for confirmations; else 0).
    pub certifying_keys: i64,
    /// Widths a caller asked this verification for.
    pub requested_cols: Arc<[u64]>,
}

/// A verification's verdict for one dtype (`None`: no case of it ran) and its model-level
/// measurements of that dtype, with the verification's audit: what `Policy::evaluate_parts`
/// reads.
#[derive(Debug, Clone, PartialEq)]
pub struct VerdictParts {
    pub verdict: Option<Verdict>,
    pub models: Vec<ModelReport>,
    /// The verification's capability audit (docs/spec.md section 3b; `None`: not audited).
    pub capabilities: Option<CapabilityReport>,
}

impl VerdictParts {
    /// Why the verdict fails `policy` (empty: it passes).
    pub fn why_not(&self, policy: &Policy, dtype: DType) -> Vec<String> {
        let refs: Vec<&ModelReport> = self.models.iter().collect();
        policy
            .evaluate_parts(
                self.verdict.as_ref(),
                &refs,
                self.capabilities.as_ref(),
                dtype,
            )
            .err()
            .unwrap_or_default()
    }
}

/// A stored audit (`capabilities_json`), `None` when not audited.
pub(crate) fn parse_capabilities(
    id: i64,
    text: Option<String>,
) -> Result<Option<CapabilityReport>> {
    text.map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(|e| StoreError::Corrupt(format!("verification {id}: capabilities: {e}")))
}

fn ids_list(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

impl Store {
    /// Verdicts, speeds and facts for verifications stored before migration 0008, computed
    /// from their reports. Returns how many verifications it filled.
    pub async fn backfill_summaries(&self) -> Result<usize> {
        let rows = sqlx::query(
            "SELECT v.id, v.kernel_digest, v.job_id, v.report_json, v.certificate, v.created_at \
             FROM verifications v \
             WHERE NOT EXISTS (SELECT 1 FROM verification_facts f WHERE f.verification_id = v.id) \
             ORDER BY v.id",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut tx = self.pool.begin().await?;
        for r in &rows {
            let id: i64 = r.try_get("id")?;
            let digest: String = r.try_get("kernel_digest")?;
            let json: String = r.try_get("report_json")?;
            let report: VerificationReport = serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("verification {id}: report: {e}")))?;
            let cert: Option<Certificate> = r
                .try_get::<Option<String>, _>("certificate")?
                .map(|c| serde_json::from_str(&c))
                .transpose()
                .map_err(|e| StoreError::Corrupt(format!("verification {id}: certificate: {e}")))?;
            let created_at: String = r.try_get("created_at")?;
            let job_id: Option<i64> = r.try_get("job_id")?;
            crate::summary::insert_summary_in(
                &mut tx,
                id,
                &digest,
                job_id,
                &report,
                cert.as_ref(),
                &created_at,
            )
            .await?;
        }
        tx.commit().await?;
        Ok(rows.len())
    }

    /// The generation of stored answers: it changes in every transaction that stores a kernel
    /// or a verification, so an answer computed from the store stays right while it reads the
    /// same.
    pub async fn answer_generation(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT n FROM answer_generation WHERE id = 1")
            .fetch_one(&self.pool)
            .await?
            .try_get("n")?)
    }

    /// The `dtype` verdict and model measurements of each of `ids` (one query): for the lines
    /// that say why a verdict fails a policy, and the chosen kernel's summary.
    pub async fn verdict_parts(
        &self,
        ids: &[i64],
        dtype: DType,
    ) -> Result<HashMap<i64, VerdictParts>> {
        let mut out: HashMap<i64, VerdictParts> = ids
            .iter()
            .map(|id| {
                (
                    *id,
                    VerdictParts {
                        verdict: None,
                        models: vec![],
                        capabilities: None,
                    },
                )
            })
            .collect();
        if ids.is_empty() {
            return Ok(out);
        }
        let sql = format!(
            "SELECT verification_id, verdict_json, models_json, capabilities_json \
             FROM verification_verdicts WHERE dtype = $1 AND verification_id IN ({})",
            ids_list(ids)
        );
        for r in sqlx::query(&sql)
            .bind(dtype.as_str())
            .fetch_all(&self.pool)
            .await?
        {
            let id: i64 = r.try_get("verification_id")?;
            let corrupt = |what: &str, e: serde_json::Error| {
                StoreError::Corrupt(format!("verification {id}: {what}: {e}"))
            };
            let verdict: Verdict = serde_json::from_str(&r.try_get::<String, _>("verdict_json")?)
                .map_err(|e| corrupt("verdict", e))?;
            let models: Vec<ModelReport> =
                serde_json::from_str(&r.try_get::<String, _>("models_json")?)
                    .map_err(|e| corrupt("models", e))?;
            let capabilities =
                parse_capabilities(id, r.try_get::<Option<String>, _>("capabilities_json")?)?;
            out.insert(
                id,
                VerdictParts {
                    verdict: Some(verdict),
                    models,
                    capabilities,
                },
            );
        }
        Ok(out)
    }
}
