//! The field: every kernel of an op, whatever its runtime (bundled CUDA kernels, Python
//! candidates such as Liger's, `torch.compile`'d layers, PyTorch's fused functions), with its
//! newest verdict per architecture and dtype, its headline speed and its model-level
//! measurements, read from the summary tables in one page query and one count (no report is
//! read). Kept apart from `newest.rs` on purpose: it only reads what that module writes.

use crate::codec::parse_col;
use crate::kernels::{kernel_row, KernelRow, KERNEL_COLS};
use crate::newest::MatrixFilter;
use crate::{Result, Store, StoreError};
use kernel_registry::report::{ModelReport, SpeedAt, Verdict};
use kernel_registry::{Arch, DType, Op, Semantics};
use sqlx::Row;
use std::collections::HashMap;

/// One candidate of the field: a kernel's newest verdict on an architecture for a dtype, with
/// the model-level measurements of that dtype (empty: not measured).
#[derive(Debug, Clone)]
pub struct FieldRow {
    pub kernel: KernelRow,
    pub dtype: DType,
    pub arch: Arch,
    pub verdict: Verdict,
    /// At the measured shape nearest `HEADLINE_ROWS` x `HEADLINE_COLS` (as the matrix's).
    pub speed: Option<SpeedAt>,
    pub models: Vec<ModelReport>,
    pub device_name: String,
    pub verified_at: String,
}

impl FieldRow {
    /// The group it belongs to.
    pub fn group(&self) -> FieldGroup {
        (self.kernel.op, self.kernel.semantics, self.dtype, self.arch)
    }

    /// The lowest argmax match fraction over the models measured (`None`: none was).
    pub fn worst_argmax(&self) -> Option<f64> {
        self.models
            .iter()
            .map(|m| m.argmax_match_fraction)
            .reduce(f64::min)
    }

    /// The largest max logit difference over the models measured.
    pub fn worst_logit_diff(&self) -> Option<f64> {
        self.models
            .iter()
            .map(|m| m.max_logit_abs_diff)
            .reduce(f64::max)
    }
}

/// `CASE col WHEN 'a' THEN 0 ... END`: sorts a text column in the enum's order.
fn enum_order(col: &str, names: impl IntoIterator<Item = &'static str>) -> String {
    let arms: Vec<String> = names
        .into_iter()
        .enumerate()
        .map(|(i, n)| format!("WHEN '{n}' THEN {i}"))
        .collect();
    format!("CASE {col} {} ELSE 999 END", arms.join(" "))
}

/// `FROM ... WHERE ...` of the field's rows, with its binds.
fn field_from(f: MatrixFilter) -> (String, Vec<String>) {
    let mut binds: Vec<String> = Vec::new();
    let mut conds = vec!["TRUE".to_string()];
    if let Some(op) = f.op {
        binds.push(op.to_string());
        conds.push(format!("k.op = ${}", binds.len()));
    }
    if let Some(a) = f.arch {
        binds.push(a.to_string());
        conds.push(format!("n.arch = ${}", binds.len()));
    }
    if let Some(d) = f.dtype {
        binds.push(d.to_string());
        conds.push(format!("d.dtype = ${}", binds.len()));
    }
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

/// A group of the field: op, semantics, dtype and architecture.
pub type FieldGroup = (Op, Semantics, DType, Arch);

impl Store {
    /// Per group of the field (filtered as `field_page`), the headline GB/s of its fastest
    /// bit-exact kernel (one aggregate query): what the other candidates' speed is compared with.
    pub async fn field_fastest_exact(&self, f: MatrixFilter) -> Result<HashMap<FieldGroup, f64>> {
        let (from, binds) = field_from(f);
        let sql = format!(
            "SELECT k.op, k.semantics, d.dtype, n.arch, \
             MAX(CASE WHEN d.class_rank = 0 THEN s.gbps END) AS best \
             {from} GROUP BY k.op, k.semantics, d.dtype, n.arch"
        );
        let mut query = sqlx::query(&sql);
        for b in &binds {
            query = query.bind(b.clone());
        }
        let mut out = HashMap::new();
        for r in query.fetch_all(&self.pool).await? {
            if let Some(best) = r.try_get::<Option<f64>, _>("best")? {
                out.insert(
                    (
                        parse_col(&r, "op")?,
                        parse_col(&r, "semantics")?,
                        parse_col(&r, "dtype")?,
                        parse_col(&r, "arch")?,
                    ),
                    best,
                );
            }
        }
        Ok(out)
    }

    /// A page of the field (filtered by op, dtype and arch), grouped by op, semantics, dtype and
    /// architecture, best class first, then fastest; with the number of rows in all.
    pub async fn field_page(
        &self,
        f: MatrixFilter,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<FieldRow>, i64)> {
        let (from, binds) = field_from(f);
        let count_sql = format!("SELECT COUNT(*) {from}");
        let mut count = sqlx::query(&count_sql);
        for b in &binds {
            count = count.bind(b.clone());
        }
        let total: i64 = count.fetch_one(&self.pool).await?.try_get(0)?;
        let kc: Vec<String> = KERNEL_COLS
            .split(',')
            .map(|c| format!("k.{}", c.trim()))
            .collect();
        let sql = format!(
            "SELECT {kc}, d.dtype AS m_dtype, n.arch AS m_arch, d.verdict_json, d.models_json, \
             f.device_name AS m_device, f.created_at AS m_created_at, \
             s.rows AS s_rows, s.cols AS s_cols, s.gbps, s.median_us, s.copy_fraction, s.speedup \
             {from} ORDER BY {op}, {sem}, {dt}, LENGTH(n.arch), n.arch, d.class_rank, d.class_ulp, \
             COALESCE(s.gbps, 0) DESC, k.name, k.id LIMIT ${l} OFFSET ${o}",
            kc = kc.join(", "),
            op = enum_order("k.op", Op::ALL.iter().map(|o| o.as_str())),
            sem = enum_order("k.semantics", Semantics::ALL.iter().map(|s| s.as_str())),
            dt = enum_order("d.dtype", DType::ALL.iter().map(|d| d.as_str())),
            l = binds.len() + 1,
            o = binds.len() + 2,
        );
        let mut query = sqlx::query(&sql);
        for b in &binds {
            query = query.bind(b.clone());
        }
        let rows = query.bind(limit).bind(offset).fetch_all(&self.pool).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let kernel = kernel_row(r)?;
            let corrupt = |what: &str, e: serde_json::Error| {
                StoreError::Corrupt(format!("{} {}: {what}: {e}", kernel.name, kernel.version))
            };
            let verdict: Verdict = serde_json::from_str(&r.try_get::<String, _>("verdict_json")?)
                .map_err(|e| corrupt("verdict", e))?;
            let models: Vec<ModelReport> =
                serde_json::from_str(&r.try_get::<String, _>("models_json")?)
                    .map_err(|e| corrupt("models", e))?;
            let speed = match r.try_get::<Option<i64>, _>("s_rows")? {
                None => None,
                Some(rows) => Some(SpeedAt {
                    rows: rows as u64,
                    cols: r.try_get::<i64, _>("s_cols")? as u64,
                    gbps: r.try_get("gbps")?,
                    median_us: r.try_get("median_us")?,
                    copy_fraction: r.try_get("copy_fraction")?,
                    speedup: r.try_get("speedup")?,
                }),
            };
            out.push(FieldRow {
                dtype: parse_col(r, "m_dtype")?,
                arch: parse_col(r, "m_arch")?,
                verdict,
                speed,
                models,
                device_name: r.try_get("m_device")?,
                verified_at: r.try_get("m_created_at")?,
                kernel,
            });
        }
        Ok((out, total))
    }
}
