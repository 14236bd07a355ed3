//! `GET /v1/resolve`: the fastest kernel that meets a policy, with its evidence.

use super::openapi::{ArchName, DTypeName, OpName, PolicyText, SemanticsName};
use super::{known_params, param, required};
use crate::answers::AnswerCache;
use crate::app::{AppState, Caller};
use crate::error::AppError;
use crate::resolve::{Query, Queueing};
use axum::extract::{Query as Q, State};
use axum::response::Response;
use bytes::Bytes;
use kernel_registry::Op;
use std::collections::HashMap;
use std::sync::Arc;

/// The query parameters of `/v1/resolve` (the dashboard's policy explorer links to the same).
pub const PARAMS: [&str; 8] = [
    "op",
    "semantics",
    "dtype",
    "arch",
    "cols",
    "rows",
    "policy",
    "runtime",
];

/// Parse the resolve query (shared with the dashboard's policy explorer).
pub fn parse_query(q: &HashMap<String, String>) -> Result<Query, AppError> {
    known_params(q, &PARAMS)?;
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
        include_python: match q.get("runtime").map(String::as_str) {
            None | Some("cuda") => false,
            Some("any") => true,
            Some(other) => {
                return Err(AppError::bad_request(format!(
                    "query parameter `runtime`: `{other}` is not valid: cuda (the default: CUDA kernels only) or any (Python candidates too)"
                ))
                .with("field", "runtime"))
            }
        },
    })
}

/// Resolve the fastest kernel whose verification on `arch` meets `policy` (default
/// `bit_exact`) for this op, semantics, dtype and shape. 404 lists why each candidate is out.
///
/// Shape-exact: a kernel is handed out only at a row length (elementwise ops: an element count
/// up to the largest) its newest verification on `arch` covered for `dtype`. For a kernel that
/// meets the policy but was not verified at this width, a verification of exactly this width
/// is queued (at most one pending per kernel and width, and a server-wide cap) and listed in
/// `queued_jobs` (poll `job_url`; ask again once it is `done`).
#[utoipa::path(get, path = "/v1/resolve", tag = "resolve",
    params(
        ("op" = OpName, Query, description = "rms_norm, fused_add_rms_norm, layer_norm, silu, silu_and_mul, gelu, gelu_tanh, silu_mul, gelu_tanh_mul"),
        ("semantics" = Option<SemanticsName>, Query, description = "llama, gemma or torch for rms_norm; default otherwise"),
        ("dtype" = DTypeName, Query, description = "bf16, f16 or f32"),
        ("arch" = ArchName, Query, description = "e.g. sm_90"),
        ("cols" = u64, Query, description = "columns (elements per row; element count for elementwise ops), at most 2^40", minimum = 1, maximum = 1099511627776_i64),
        ("rows" = Option<u64>, Query, description = "rows: picks the nearest measured speed; a queued width verification runs rows 1..max(64, rows); never gates", minimum = 1, maximum = 1099511627776_i64),
        ("policy" = Option<PolicyText>, Query, description = "bit_exact (default), ulp:N, tolerance, argmax, with ,deterministic ,batch_invariant ,max_abs_diff=X ,max_mismatch_fraction=X"),
        ("runtime" = Option<String>, Query, description = "cuda (default: CUDA kernels only) or any (Python candidates too, docs/spec.md section 2b)"),
    ),
    responses((status = 200, description = "The chosen kernel with its evidence; `also_qualifying` lists the first 100 other qualifying kernels, fastest first (`also_qualifying_total` counts all)"), (status = 404, description = "No kernel qualifies; `excluded` says why each is out (the first 100; `excluded_total` counts all)"), (status = 400, description = "A bad parameter")))]
pub async fn resolve(
    State(st): State<AppState>,
    c: Caller,
    Q(q): Q<HashMap<String, String>>,
) -> Result<Response, AppError> {
    let query = parse_query(&q)?;
    let generation = st.store.answer_generation().await?;
    // An answer without `rows` that queued nothing is kept as text until the store changes
    // (`crate::answers`); one with `rows` is derived from the kept ranking of its query (a
    // distinct `rows` per ask would otherwise fill the cache with near-copies).
    let key = AnswerCache::key("/v1/resolve", &q);
    let keep_text = query.rows.is_none();
    if keep_text {
        if let Some(a) = st.answers.get(&key, generation) {
            return Ok(crate::answers::json_response(a));
        }
    }
    let mut unshaped = q.clone();
    unshaped.remove("rows");
    let ranking_key = AnswerCache::key("/v1/resolve#ranking", &unshaped);
    let rank = match st.rankings.get(&ranking_key, generation) {
        Some(r) => r,
        None => {
            let queueing = Queueing {
                max_pending: st.config.max_pending_width_jobs,
                actor: c.actor().to_string(),
            };
            let r = Arc::new(
                crate::resolve::ranking_at(
                    &st.store,
                    generation,
                    &query,
                    Some(&queueing),
                    Some(&st.pools),
                )
                .await?,
            );
            if r.keepable() {
                st.rankings.insert(ranking_key, generation, r.clone());
            }
            r
        }
    };
    let keep = keep_text && rank.keepable();
    // The answer is its ranking's text for this shape (which case of each kernel is nearest
    // `rows`), kept with the ranking, plus the chosen kernel's coverage of `rows`.
    let shape = rank.shape(&query);
    if let Some(coverage) = rank.chosen_coverage(&shape, &query)? {
        let text = match rank.kept_text(&shape) {
            Some(t) => t,
            None => {
                let t = rank
                    .answer_text(&st.store, &query, &shape)
                    .await?
                    .ok_or_else(|| {
                        AppError::from(kernel_store::StoreError::Corrupt(
                            "a ranking chose a kernel and then did not".into(),
                        ))
                    })?;
                rank.keep_text(shape, t.clone());
                t
            }
        };
        let answer = with_field(&text, "coverage", &coverage);
        if keep {
            st.answers.insert(key, generation, answer.clone());
        }
        return Ok(crate::answers::json_response(answer));
    }
    let r = rank.resolution_at(&st.store, &query, &shape).await?;
    match r.chosen {
        Some(_) => Err(AppError::from(kernel_store::StoreError::Corrupt(
            "a ranking chose no kernel and then did".into(),
        ))),
        None => {
            let n = r.excluded_total;
            let detail = if n == 0 {
                format!(
                    "no kernel is registered for {} ({}); keep your reference layer",
                    query.op, query.semantics
                )
            } else {
                let more = if n > r.excluded.len() {
                    format!(" (the first {} of {n})", r.excluded.len())
                } else {
                    String::new()
                };
                let queued = if r.queued_jobs.is_empty() {
                    String::new()
                } else {
                    format!(
                        " Verifications of this width are queued ({}): poll them and ask again once done.",
                        r.queued_jobs
                            .iter()
                            .map(|j| format!("{} job {}", j.kernel, j.job_url))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                format!(
                    "no kernel meets `{}` for {} ({}) {} on {} at cols={}; keep your reference layer. Why each is out{more}: {}{queued}",
                    query.policy, query.op, query.semantics, query.dtype, query.arch, query.cols,
                    r.excluded.join(" | ")
                )
            };
            Err(AppError::not_found(detail)
                .with("excluded", r.excluded)
                .with("excluded_total", r.excluded_total)
                .with(
                    "queued_jobs",
                    serde_json::to_value(&r.queued_jobs).expect("serialises"),
                )
                .with("queue_full", r.queue_full))
        }
    }
}

/// `object` (the JSON text of a non-empty object) with `field` set to `value` appended.
fn with_field(object: &[u8], field: &str, value: &impl serde::Serialize) -> Bytes {
    let mut out = Vec::with_capacity(object.len() + 512);
    out.extend_from_slice(object.strip_suffix(b"}").expect("a JSON object"));
    out.push(b',');
    serde_json::to_writer(&mut out, field).expect("a key serialises");
    out.push(b':');
    serde_json::to_writer(&mut out, value).expect("a value serialises");
    out.push(b'}');
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_field_appended_to_an_object_reads_back() {
        let text = serde_json::to_vec(&serde_json::json!({"a": 1, "b": [2]})).unwrap();
        let out = super::with_field(&text, "c", &serde_json::json!({"d": "e\"}"}));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v, serde_json::json!({"a": 1, "b": [2], "c": {"d": "e\"}"}}));
    }
}
