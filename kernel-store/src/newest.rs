//! The newest verification per kernel and architecture, and what a policy is checked against,
//! read by index: what the verdict index (`crate::index`), the stale list and the dashboard's
//! matrix read. `newest_verifications` is kept by a trigger in the transaction that stores a
//! verification; the per-dtype verdicts (with the columns a policy decides on), speeds and
//! facts are written beside it (`crate::summary::insert_summary_in`), and computed from stored reports for
//! older databases (`Store::backfill_summaries`). A policy is decided in one place,
//! `Policy::passes` (kernel-registry), over the verdict index's facts of these columns; tests
//! compare it with `Policy::evaluate` on the full reports.

use crate::codec::{bound, parse_col, parse_csv};
use crate::kernel_rows::{kernel_row, runtime_of, KernelQuery, KernelRow, KERNEL_COLS};
use crate::{Result, Store, StoreError};
use kernel_registry::capability::CapabilityReport;
use kernel_registry::cert::Certificate;
use kernel_registry::report::{ModelReport, SpeedAt, Verdict, VerificationReport};
use kernel_registry::{Arch, DType, Op, Policy, Semantics};
use sqlx::any::AnyRow;
use sqlx::Row;
use std::collections::HashMap;
use std::sync::Arc;

pub use crate::summary::{HEADLINE_COLS, HEADLINE_ROWS};

/// The join that picks, for kernel `k`, its newest verification `n` on the architecture bound
/// as `$1`.
const NEWEST_ON_ARCH: &str = "newest_verifications n ON n.kernel_digest = k.digest AND n.arch = $1";

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

/// One row of the dashboard's matrix: a kernel's newest verdict on an architecture for a dtype.
#[derive(Debug, Clone)]
pub struct MatrixRow {
    pub kernel: KernelRow,
    pub dtype: DType,
    pub arch: Arch,
    pub verdict: Verdict,
    pub speed: Option<SpeedAt>,
    pub device_name: String,
    /// When the GPU measured it: its report's own `started_at`.
    pub verified_at: String,
    /// When this hub imported it (a certificate measured elsewhere); `None` when this hub's
    /// own worker measured it.
    pub imported_at: Option<String>,
}

/// Per op, semantics and dtype: how many kernels have a newest verdict, how many of them are
/// bit-exact on some architecture, and the fastest bit-exact headline speed.
#[derive(Debug, Clone, PartialEq)]
pub struct GlanceCell {
    pub op: Op,
    pub semantics: Semantics,
    pub dtype: DType,
    pub kernels: i64,
    pub bit_exact: i64,
    pub best_bit_exact_gbps: Option<f64>,
}

/// A kernel without a verdict on the dashboard's filter.
#[derive(Debug, Clone)]
pub struct UnverifiedKernel {
    pub kernel: KernelRow,
    /// Architectures it was verified on (none on the filtered one).
    pub only_on: Vec<Arch>,
    /// Verified (on the filter) but no case of any dtype ran.
    pub no_dtype_ran: bool,
}

/// The dashboard matrix's filters.
#[derive(Debug, Clone, Copy, Default)]
pub struct MatrixFilter {
    pub op: Option<Op>,
    pub dtype: Option<DType>,
    pub arch: Option<Arch>,
}

/// `CASE col WHEN 'a' THEN 0 ... END`: sorts a text column in the enum's order.
fn rank_case(col: &str, names: impl IntoIterator<Item = &'static str>) -> String {
    let arms: Vec<String> = names
        .into_iter()
        .enumerate()
        .map(|(i, n)| format!("WHEN '{n}' THEN {i}"))
        .collect();
    format!("CASE {col} {} ELSE 999 END", arms.join(" "))
}

fn ids_list(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// `WHERE` conditions on kernel `k` from a `KernelQuery`'s filters, with their bind values.
fn kernel_conditions(q: &KernelQuery, binds: &mut Vec<String>) -> Vec<String> {
    let mut conds = Vec::new();
    if let Some(op) = q.op {
        binds.push(op.to_string());
        conds.push(format!("k.op = ${}", binds.len()));
    }
    if let Some(s) = q.semantics {
        binds.push(s.to_string());
        conds.push(format!("k.semantics = ${}", binds.len()));
    }
    if let Some(d) = q.dtype {
        binds.push(format!("%,{d},%"));
        conds.push(format!("k.dtypes LIKE ${}", binds.len()));
    }
    if let Some(a) = q.arch {
        binds.push(format!("%,{a},%"));
        conds.push(format!("(k.archs = '' OR k.archs LIKE ${})", binds.len()));
    }
    conds
}

fn k_cols() -> String {
    KERNEL_COLS
        .split(',')
        .map(|c| format!("k.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
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

    /// Kernels matching `q`'s filters (its `arch` is the architecture asked about) whose newest
    /// verdict on that architecture is stale — measured by another suite than `suite`, or with
    /// another driver than `newest_driver` — or that were verified elsewhere but never there:
    /// a page of them in list order with the suite and driver of that verdict (`None`: never
    /// verified there), and their total.
    pub async fn stale_on(
        &self,
        arch: Arch,
        q: &KernelQuery,
        suite: &str,
        newest_driver: Option<&str>,
    ) -> Result<(Vec<(KernelRow, Option<(String, String)>)>, i64)> {
        let mut binds = vec![arch.to_string()];
        let mut conds = kernel_conditions(
            &KernelQuery {
                arch: Some(arch),
                ..q.clone()
            },
            &mut binds,
        );
        binds.push(suite.to_string());
        let mut stale = format!("f.suite_version <> ${}", binds.len());
        if let Some(d) = newest_driver {
            binds.push(d.to_string());
            stale.push_str(&format!(" OR f.driver_version <> ${}", binds.len()));
        }
        conds.push(format!(
            "((n.verification_id IS NOT NULL AND ({stale})) OR (n.verification_id IS NULL AND \
             EXISTS (SELECT 1 FROM newest_verifications o WHERE o.kernel_digest = k.digest)))"
        ));
        let from = format!(
            "FROM kernels k LEFT JOIN {NEWEST_ON_ARCH} \
             LEFT JOIN verification_facts f ON f.verification_id = n.verification_id WHERE {}",
            conds.join(" AND ")
        );
        let total = self
            .count_with(&format!("SELECT COUNT(*) {from}"), &binds)
            .await?;
        let sql = format!(
            "SELECT {}, f.suite_version AS v_suite, f.driver_version AS v_driver {from} \
             ORDER BY k.op, k.semantics, k.name, k.id LIMIT ${} OFFSET ${}",
            k_cols(),
            binds.len() + 1,
            binds.len() + 2
        );
        let query = bound(&sql, &binds);
        let rows = query
            .bind(q.limit)
            .bind(q.offset)
            .fetch_all(&self.pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let suite: Option<String> = r.try_get("v_suite")?;
            let driver: Option<String> = r.try_get("v_driver")?;
            out.push((kernel_row(r)?, suite.zip(driver)));
        }
        Ok((out, total))
    }

    /// A page of the dashboard's matrix: every kernel's newest verdict per architecture and
    /// dtype (filtered), sorted by op, semantics, dtype, arch, class, then fastest first; with
    /// the number of rows in all.
    pub async fn matrix_page(
        &self,
        f: MatrixFilter,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<MatrixRow>, i64)> {
        let (from, binds) = matrix_from(f);
        let total = self
            .count_with(&format!("SELECT COUNT(*) {from}"), &binds)
            .await?;
        let sql = matrix_select("", &from, binds.len());
        let query = bound(&sql, &binds);
        let rows = query.bind(limit).bind(offset).fetch_all(&self.pool).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let json: String = r.try_get("verdict_json")?;
            out.push(MatrixRow {
                kernel: kernel_row(r)?,
                dtype: parse_col(r, "m_dtype")?,
                arch: parse_col(r, "m_arch")?,
                verdict: serde_json::from_str(&json)
                    .map_err(|e| StoreError::Corrupt(format!("verdict: {e}")))?,
                speed: match r.try_get::<Option<i64>, _>("s_rows")? {
                    None => None,
                    Some(_) => Some(speed_row_prefixed(r)?),
                },
                device_name: r.try_get("m_device")?,
                verified_at: r.try_get("m_verified_at")?,
                imported_at: r.try_get("m_imported_at")?,
            });
        }
        Ok((out, total))
    }

    /// The matrix's "at a glance" cells (one aggregate query), in op, semantics, dtype order.
    pub async fn glance(&self, f: MatrixFilter) -> Result<Vec<GlanceCell>> {
        let (from, binds) = matrix_from(f);
        let sql = format!(
            "SELECT k.op, k.semantics, d.dtype, COUNT(DISTINCT k.id) AS kernels, \
             COUNT(DISTINCT CASE WHEN d.class_rank = 0 THEN k.id END) AS bit_exact, \
             MAX(CASE WHEN d.class_rank = 0 THEN s.gbps END) AS best \
             {from} GROUP BY k.op, k.semantics, d.dtype"
        );
        let query = bound(&sql, &binds);
        let mut cells = query
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| {
                Ok(GlanceCell {
                    op: parse_col(r, "op")?,
                    semantics: parse_col(r, "semantics")?,
                    dtype: parse_col(r, "dtype")?,
                    kernels: r.try_get("kernels")?,
                    bit_exact: r.try_get("bit_exact")?,
                    best_bit_exact_gbps: r.try_get("best")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        cells.sort_by_key(|c| (c.op, c.semantics, c.dtype));
        Ok(cells)
    }

    /// Every architecture some kernel matching the filter's op and dtype was verified on.
    pub async fn archs_verified(&self, f: MatrixFilter) -> Result<Vec<Arch>> {
        let mut binds = Vec::new();
        let mut conds = kernel_conditions(
            &KernelQuery {
                op: f.op,
                dtype: f.dtype,
                ..Default::default()
            },
            &mut binds,
        );
        conds.push("TRUE".into());
        let sql = format!(
            "SELECT DISTINCT n.arch FROM newest_verifications n JOIN kernels k ON k.digest = n.kernel_digest \
             WHERE {}",
            conds.join(" AND ")
        );
        let query = bound(&sql, &binds);
        let mut archs = query
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| parse_col(r, "arch"))
            .collect::<Result<Vec<Arch>>>()?;
        archs.sort();
        Ok(archs)
    }

    /// A page of the kernels (matching the filter's op and dtype) that have no matrix row: not
    /// verified (on the filter's arch), or verified there without any dtype's case running
    /// (listed only without a dtype filter); with how many there are in all.
    pub async fn unverified_page(
        &self,
        f: MatrixFilter,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<UnverifiedKernel>, i64)> {
        let mut binds = Vec::new();
        let mut conds = kernel_conditions(
            &KernelQuery {
                op: f.op,
                dtype: f.dtype,
                ..Default::default()
            },
            &mut binds,
        );
        let on_arch = match f.arch {
            Some(a) => {
                binds.push(a.to_string());
                format!(" AND n.arch = ${}", binds.len())
            }
            None => String::new(),
        };
        let verified = format!(
            "EXISTS (SELECT 1 FROM newest_verifications n WHERE n.kernel_digest = k.digest{on_arch})"
        );
        let has_rows = format!(
            "EXISTS (SELECT 1 FROM newest_verifications n JOIN verification_verdicts d \
             ON d.verification_id = n.verification_id WHERE n.kernel_digest = k.digest{on_arch})"
        );
        let which = if f.dtype.is_none() {
            format!("NOT {has_rows}")
        } else {
            format!("NOT {verified}")
        };
        conds.push(which);
        let from = format!("FROM kernels k WHERE {}", conds.join(" AND "));
        let total = self
            .count_with(&format!("SELECT COUNT(*) {from}"), &binds)
            .await?;
        let sql = format!(
            "SELECT {} {from} ORDER BY k.op, k.semantics, k.name, k.id LIMIT ${} OFFSET ${}",
            k_cols(),
            binds.len() + 1,
            binds.len() + 2
        );
        let query = bound(&sql, &binds);
        let rows = query.bind(limit).bind(offset).fetch_all(&self.pool).await?;
        let kernels = rows.iter().map(kernel_row).collect::<Result<Vec<_>>>()?;
        // The architectures each listed kernel was verified on, in one query.
        let mut verified_on: HashMap<String, Vec<Arch>> = HashMap::new();
        if !kernels.is_empty() {
            let marks: Vec<String> = (1..=kernels.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "SELECT kernel_digest, arch FROM newest_verifications WHERE kernel_digest IN ({})",
                marks.join(", ")
            );
            let mut query = sqlx::query(&sql);
            for k in &kernels {
                query = query.bind(k.digest.as_str());
            }
            for r in query.fetch_all(&self.pool).await? {
                verified_on
                    .entry(r.try_get("kernel_digest")?)
                    .or_default()
                    .push(parse_col(&r, "arch")?);
            }
        }
        let mut out = Vec::with_capacity(kernels.len());
        for kernel in kernels {
            let mut archs = verified_on
                .remove(kernel.digest.as_str())
                .unwrap_or_default();
            archs.sort();
            let no_dtype_ran = match f.arch {
                Some(a) => archs.contains(&a),
                None => !archs.is_empty(),
            };
            let only_on = if no_dtype_ran { vec![] } else { archs };
            out.push(UnverifiedKernel {
                kernel,
                only_on,
                no_dtype_ran,
            });
        }
        Ok((out, total))
    }

    pub(crate) async fn count_with(&self, sql: &str, binds: &[String]) -> Result<i64> {
        Ok(bound(sql, binds).fetch_one(&self.pool).await?.try_get(0)?)
    }
}

/// `FROM ... WHERE ...` of the matrix's rows (kernel `k`, newest verification `n` per arch,
/// verdict `d` per dtype, headline speed `s`), with its binds.
pub(crate) fn matrix_from(f: MatrixFilter) -> (String, Vec<String>) {
    let mut binds = Vec::new();
    let mut conds = kernel_conditions(
        &KernelQuery {
            op: f.op,
            dtype: f.dtype,
            ..Default::default()
        },
        &mut binds,
    );
    if let Some(a) = f.arch {
        binds.push(a.to_string());
        conds.push(format!("n.arch = ${}", binds.len()));
    }
    if let Some(d) = f.dtype {
        binds.push(d.to_string());
        conds.push(format!("d.dtype = ${}", binds.len()));
    }
    conds.push("TRUE".into());
    (
        format!(
            "FROM kernels k JOIN newest_verifications n ON n.kernel_digest = k.digest \
             JOIN verification_facts f ON f.verification_id = n.verification_id \
             JOIN verification_verdicts d ON d.verification_id = n.verification_id \
             LEFT JOIN verification_speeds s ON s.verification_id = d.verification_id \
             AND s.dtype = d.dtype AND s.headline = 1 WHERE {}",
            conds.join(" AND ")
        ),
        binds,
    )
}

/// The matrix's page query over `from` (`matrix_from`, with `nbinds` binds before the limit and
/// offset): each row's kernel, dtype, arch, verdict, device, time and headline speed, plus
/// `extra` columns (e.g. `", d.models_json"`), in the matrix's order (op, semantics, dtype, arch,
/// class, fastest first).
pub(crate) fn matrix_select(extra: &str, from: &str, nbinds: usize) -> String {
    format!(
        "SELECT {kc}, d.dtype AS m_dtype, n.arch AS m_arch, d.verdict_json{extra}, \
         f.device_name AS m_device, f.verified_at AS m_verified_at, \
         f.imported_at AS m_imported_at, \
         s.rows AS s_rows, s.cols AS s_cols, s.gbps, s.median_us, s.copy_fraction, s.speedup \
         {from} ORDER BY {op}, {sem}, {dt}, LENGTH(n.arch), n.arch, d.class_rank, d.class_ulp, \
         COALESCE(s.gbps, 0) DESC, k.name, k.id LIMIT ${l} OFFSET ${o}",
        kc = k_cols(),
        op = rank_case("k.op", Op::ALL.iter().map(|o| o.as_str())),
        sem = rank_case("k.semantics", Semantics::ALL.iter().map(|s| s.as_str())),
        dt = rank_case("d.dtype", DType::ALL.iter().map(|d| d.as_str())),
        l = nbinds + 1,
        o = nbinds + 2,
    )
}

pub(crate) fn speed_row(r: &AnyRow) -> Result<SpeedAt> {
    Ok(SpeedAt {
        rows: r.try_get::<i64, _>("rows")? as u64,
        cols: r.try_get::<i64, _>("cols")? as u64,
        gbps: r.try_get("gbps")?,
        median_us: r.try_get("median_us")?,
        copy_fraction: r.try_get("copy_fraction")?,
        speedup: r.try_get("speedup")?,
    })
}

pub(crate) fn speed_row_prefixed(r: &AnyRow) -> Result<SpeedAt> {
    Ok(SpeedAt {
        rows: r.try_get::<i64, _>("s_rows")? as u64,
        cols: r.try_get::<i64, _>("s_cols")? as u64,
        gbps: r.try_get("gbps")?,
        median_us: r.try_get("median_us")?,
        copy_fraction: r.try_get("copy_fraction")?,
        speedup: r.try_get("speedup")?,
    })
}
