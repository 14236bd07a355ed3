//! `GET /v1/resolve`: the fastest kernel that meets a policy, with its evidence.

use super::{known_params, param, required};
use crate::app::{AppState, Caller};
use crate::error::AppError;
use crate::resolve::{resolve as run_resolve, Query};
use axum::extract::{Query as Q, State};
use axum::Json;
use kernel_registry::Op;
use std::collections::HashMap;

/// Parse the resolve query (shared with the dashboard's policy explorer).
pub fn parse_query(q: &HashMap<String, String>) -> Result<Query, AppError> {
    known_params(
        q,
        &["op", "semantics", "dtype", "arch", "cols", "rows", "policy"],
    )?;
    let op: Op = required(q, "op")?;
    let semantics = match param(q, "semantics")? {
        Some(s) => op
            .check_semantics(s)
            .map_err(|e| AppError::bad_request(format!("query parameter `semantics`: {e}")))?,
        None => op.default_semantics(),
    };
    let cols: u64 = required(q, "cols")?;
    if cols == 0 {
        return Err(AppError::bad_request(
            "query parameter `cols` must be at least 1",
        ));
    }
    Ok(Query {
        op,
        semantics,
        dtype: required(q, "dtype")?,
        arch: required(q, "arch")?,
        cols,
        rows: param(q, "rows")?,
        policy: param(q, "policy")?.unwrap_or_else(|| "bit_exact".parse().expect("valid")),
    })
}

/// Resolve the fastest kernel whose verification on `arch` meets `policy` (default
/// `bit_exact`) for this op, semantics, dtype and shape. 404 lists why each candidate is out.
#[utoipa::path(get, path = "/v1/resolve", tag = "resolve",
    params(
        ("op" = String, Query, description = "rms_norm, fused_add_rms_norm, layer_norm, silu, silu_and_mul, gelu, gelu_tanh"),
        ("semantics" = Option<String>, Query, description = "llama, gemma or torch for rms_norm; default otherwise"),
        ("dtype" = String, Query, description = "bf16, f16 or f32"),
        ("arch" = String, Query, description = "e.g. sm_90"),
        ("cols" = u64, Query, description = "columns (elements per row; element count for elementwise ops)"),
        ("rows" = Option<u64>, Query, description = "rows, used to pick the nearest measured speed"),
        ("policy" = Option<String>, Query, description = "bit_exact (default), ulp:N, tolerance, argmax, with ,deterministic ,batch_invariant ,max_abs_diff=X ,max_mismatch_fraction=X"),
    ),
    responses((status = 200, description = "The chosen kernel with its evidence"), (status = 404, description = "No kernel qualifies; `excluded` says why each is out"), (status = 400, description = "A bad parameter")))]
pub async fn resolve(
    State(st): State<AppState>,
    _c: Caller,
    Q(q): Q<HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, AppError> {
    let query = parse_query(&q)?;
    let r = run_resolve(&st.store, &query).await?;
    match r.chosen {
        Some(c) => Ok(Json(serde_json::json!({
            "policy": query.policy.to_string(),
            "kernel": c.kernel,
            "digest": c.kernel.digest,
            "source_url": c.source_url,
            "verification_id": c.verification_id,
            "verification_url": format!("/v1/verifications/{}", c.verification_id),
            "device": c.device,
            "verified_at": c.verified_at,
            "class": c.class,
            "summary": c.summary,
            "speed": c.speed,
            "also_qualifying": r.also_qualifying,
            "excluded": r.excluded,
        }))),
        None => {
            let n = r.excluded.len();
            let detail = if n == 0 {
                format!(
                    "no kernel is registered for {} ({}); keep your reference layer",
                    query.op, query.semantics
                )
            } else {
                format!(
                    "no kernel meets `{}` for {} ({}) {} on {} at cols={}; keep your reference layer. Why each is out: {}",
                    query.policy, query.op, query.semantics, query.dtype, query.arch, query.cols,
                    r.excluded.join(" | ")
                )
            };
            Err(AppError::not_found(detail).with("excluded", r.excluded))
        }
    }
}
