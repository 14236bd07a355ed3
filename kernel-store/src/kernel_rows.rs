//! A stored kernel's row as the API lists it, the list query and its filters as SQL, and how a
//! row is read from the database: the one place the kernel store (`kernels`), the stale list
//! (`stale`), the dashboard's matrix (`matrix`) and the field (`field`) read kernel rows from,
//! so that none imports another for it.

use crate::codec::{parse_col, parse_csv};
use crate::{Result, StoreError};
use kernel_registry::domain::{Arch, DType, Digest, Op, Semantics};
use kernel_registry::manifest::{Constraints, Runtime};
use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::Row;

/// A stored kernel, as listed by the API.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelRow {
    pub id: i64,
    pub name: String,
    pub version: String,
    pub digest: Digest,
    pub op: Op,
    pub semantics: Semantics,
    pub dtypes: Vec<DType>,
    /// Empty: any architecture.
    pub archs: Vec<Arch>,
    pub cols_min: i64,
    pub cols_max: Option<i64>,
    pub cols_multiple_of: i64,
    pub description: String,
    pub license: String,
    pub authors: Vec<String>,
    pub origin: String,
    pub created_at: String,
    /// What executes the source (docs/spec.md section 2b); left out of the JSON for CUDA kernels.
    #[serde(default, skip_serializing_if = "Runtime::is_cuda")]
    pub runtime: Runtime,
}

impl KernelRow {
    /// The manifest's constraints, as stored in the row's indexed columns.
    pub fn constraints(&self) -> Constraints {
        Constraints {
            cols_min: self.cols_min as u64,
            cols_max: self.cols_max.map(|c| c as u64),
            cols_multiple_of: self.cols_multiple_of as u64,
            archs: self.archs.clone(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct KernelQuery {
    pub op: Option<Op>,
    pub semantics: Option<Semantics>,
    pub dtype: Option<DType>,
    pub arch: Option<Arch>,
    pub limit: i64,
    pub offset: i64,
}

/// The columns of a kernel row, but `runtime` (migration 0011): what an insert returns, so that
/// storing a CUDA kernel works on a database of any schema (upgrade tests store kernels in old
/// schemas), the runtime being known from the manifest.
pub(crate) const KERNEL_COLS_BASE: &str =
    "id, name, version, digest, op, semantics, dtypes, archs, cols_min, \
    cols_max, cols_multiple_of, description, license, authors, origin, created_at";

pub(crate) const KERNEL_COLS: &str =
    "id, name, version, digest, op, semantics, dtypes, archs, cols_min, \
    cols_max, cols_multiple_of, description, license, authors, origin, created_at, runtime";

pub(crate) fn kernel_row(r: &AnyRow) -> Result<KernelRow> {
    kernel_row_of(r, runtime_of(r)?)
}

/// A row's `runtime` column (migration 0011).
pub(crate) fn runtime_of(r: &AnyRow) -> Result<Runtime> {
    match r.try_get::<String, _>("runtime")?.as_str() {
        "cuda" => Ok(Runtime::Cuda),
        "python" => Ok(Runtime::Python),
        other => Err(StoreError::Corrupt(format!("runtime `{other}`"))),
    }
}

pub(crate) fn kernel_row_of(r: &AnyRow, runtime: Runtime) -> Result<KernelRow> {
    let authors: String = r.try_get("authors")?;
    Ok(KernelRow {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        version: r.try_get("version")?,
        digest: parse_col(r, "digest")?,
        op: parse_col(r, "op")?,
        semantics: parse_col(r, "semantics")?,
        dtypes: parse_csv(&r.try_get::<String, _>("dtypes")?)?,
        archs: parse_csv(&r.try_get::<String, _>("archs")?)?,
        cols_min: r.try_get("cols_min")?,
        cols_max: r.try_get("cols_max")?,
        cols_multiple_of: r.try_get("cols_multiple_of")?,
        description: r.try_get("description")?,
        license: r.try_get("license")?,
        authors: serde_json::from_str(&authors)
            .map_err(|e| StoreError::Corrupt(format!("authors: {e}")))?,
        origin: r.try_get("origin")?,
        created_at: r.try_get("created_at")?,
        runtime,
    })
}

/// `WHERE` conditions on kernel `k` from a `KernelQuery`'s filters, with their bind values.
pub(crate) fn kernel_conditions(q: &KernelQuery, binds: &mut Vec<String>) -> Vec<String> {
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

/// `KERNEL_COLS` of kernel `k` (`k.id, k.name, ...`), for queries that join other tables.
pub(crate) fn k_cols() -> String {
    KERNEL_COLS
        .split(',')
        .map(|c| format!("k.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}
