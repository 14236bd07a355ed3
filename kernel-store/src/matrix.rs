//! The dashboard's matrix: every kernel's newest verdict per architecture and dtype with its
//! headline speed (`Store::matrix_page`), the "at a glance" cells (`Store::glance`), the
//! architectures verified (`Store::archs_verified`) and the kernels without a matrix row
//! (`Store::unverified_page`), read from the summary tables (no report is read). The field
//! (`crate::field`) reads through the same query (`matrix_from`, `matrix_select`).

use crate::codec::{bound, parse_col};
use crate::kernel_rows::{k_cols, kernel_conditions, kernel_row, KernelQuery, KernelRow};
use crate::summary::speed_row;
use crate::{Result, Store, StoreError};
use kernel_registry::report::{SpeedAt, Verdict};
use kernel_registry::{Arch, DType, Op, Semantics};
use sqlx::Row;
use std::collections::HashMap;

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

impl MatrixFilter {
    /// The kernel conditions of the filter's op and dtype (its arch is each query's own).
    fn kernel_conditions(&self, binds: &mut Vec<String>) -> Vec<String> {
        kernel_conditions(
            &KernelQuery {
                op: self.op,
                dtype: self.dtype,
                ..Default::default()
            },
            binds,
        )
    }
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

impl Store {
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
                    Some(_) => Some(speed_row(r, "s_")?),
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
        let mut conds = f.kernel_conditions(&mut binds);
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
        let mut conds = f.kernel_conditions(&mut binds);
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
}

/// `FROM ... WHERE ...` of the matrix's rows (kernel `k`, newest verification `n` per arch,
/// verdict `d` per dtype, headline speed `s`), with its binds.
pub(crate) fn matrix_from(f: MatrixFilter) -> (String, Vec<String>) {
    let mut binds = Vec::new();
    let mut conds = f.kernel_conditions(&mut binds);
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
