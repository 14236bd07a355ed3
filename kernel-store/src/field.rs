//! The field: every kernel of an op, whatever its runtime (bundled CUDA kernels, Python
//! candidates such as Liger's, `torch.compile`'d layers, PyTorch's fused functions), with its
//! newest verdict per architecture and dtype, its headline speed and its model-level
//! measurements, read from the summary tables in one page query and one count (no report is
//! read). It reads them through the dashboard matrix's own query (`crate::matrix`:
//! `matrix_from`, `matrix_select`) with the model-level column added.

use crate::codec::{bound, parse_col};
use crate::kernel_rows::{kernel_row, KernelRow};
use crate::matrix::{matrix_from, matrix_select, MatrixFilter};
use crate::summary::speed_row;
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
    /// When the GPU measured it: its report's own `started_at`.
    pub verified_at: String,
    /// When this hub imported it (a certificate measured elsewhere); `None` when this hub's
    /// own worker measured it.
    pub imported_at: Option<String>,
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

/// A group of the field: op, semantics, dtype and architecture.
pub type FieldGroup = (Op, Semantics, DType, Arch);

impl Store {
    /// Per group of the field (filtered as `field_page`), the headline GB/s of its fastest
    /// bit-exact kernel (one aggregate query): what the other candidates' speed is compared with.
    pub async fn field_fastest_exact(&self, f: MatrixFilter) -> Result<HashMap<FieldGroup, f64>> {
        let (from, binds) = matrix_from(f);
        let sql = format!(
            "SELECT k.op, k.semantics, d.dtype, n.arch, \
             MAX(CASE WHEN d.class_rank = 0 THEN s.gbps END) AS best \
             {from} GROUP BY k.op, k.semantics, d.dtype, n.arch"
        );
        let query = bound(&sql, &binds);
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
        let (from, binds) = matrix_from(f);
        let total = self
            .count_with(&format!("SELECT COUNT(*) {from}"), &binds)
            .await?;
        let sql = matrix_select(", d.models_json", &from, binds.len());
        let query = bound(&sql, &binds);
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
                Some(_) => Some(speed_row(r, "s_")?),
            };
            out.push(FieldRow {
                dtype: parse_col(r, "m_dtype")?,
                arch: parse_col(r, "m_arch")?,
                verdict,
                speed,
                models,
                device_name: r.try_get("m_device")?,
                verified_at: r.try_get("m_verified_at")?,
                imported_at: r.try_get("m_imported_at")?,
                kernel,
            });
        }
        Ok((out, total))
    }
}
