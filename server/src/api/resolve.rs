//! `GET /v1/resolve`: the fastest kernel that meets a policy, with its evidence.

use super::openapi::{ArchName, DTypeName, OpName, PolicyText, SemanticsName};
use super::{known_params, param, required};
use crate::error::{rejection, AppError};
use crate::resolve::Query;
use crate::state::{AppState, Caller, Scope};
use axum::extract::{Query as Q, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kernel_registry::Op;
use serde::Deserialize;
use std::collections::HashMap;

/// The query parameters of `/v1/resolve` (the dashboard's policy explorer links to the same).
pub const PARAMS: [&str; 10] = [
    "op",
    "semantics",
    "dtype",
    "arch",
    "cols",
    "rows",
    "policy",
    "runtime",
    "sms",
    "threads_per_sm",
];

/// The most SMs or threads per SM a query may name.
pub const MAX_DEVICE_FIGURE: u32 = 1 << 20;

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
    let device = match (param::<u32>(q, "sms")?, param::<u32>(q, "threads_per_sm")?) {
        (None, None) => None,
        (Some(s), Some(t)) if (1..=MAX_DEVICE_FIGURE).contains(&s) && (1..=MAX_DEVICE_FIGURE).contains(&t) => {
            if !op.is_backward() {
                return Err(AppError::bad_request(format!(
                    "query parameters `sms` and `threads_per_sm` apply to backward ops ({}): {op}'s verdict does not depend on the GPU's SM count; leave them out",
                    Op::ALL.iter().filter(|o| o.is_backward()).map(|o| o.as_str()).collect::<Vec<_>>().join(", ")
                ))
                .with("field", "sms"));
            }
            Some((s, t))
        }
        (Some(_), Some(_)) => {
            return Err(AppError::bad_request(format!(
                "query parameters `sms` and `threads_per_sm` must be 1..{MAX_DEVICE_FIGURE}"
            ))
            .with("field", "sms"))
        }
        _ => {
            return Err(AppError::bad_request(
                "query parameters `sms` and `threads_per_sm` go together: the GPU's SM count and its threads per SM (torch.cuda.get_device_properties: multi_processor_count, max_threads_per_multi_processor)",
            )
            .with("field", "sms"))
        }
    };
    Ok(Query {
        device,
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
/// meets the policy but was not verified at this width, the 404 says so and how to ask for a
/// verification of exactly this width: `request_verification` holds the method, URL and body of
/// that explicit request (`POST /v1/resolve/verifications`, token scope `submit`). A GET never
/// queues anything (`queued_jobs` is always empty here).
#[utoipa::path(get, path = "/v1/resolve", tag = "resolve",
    params(
        ("op" = OpName, Query, description = "rms_norm, fused_add_rms_norm, layer_norm, fused_add_layer_norm, silu, silu_and_mul, gelu, gelu_tanh, silu_mul, gelu_tanh_mul, rms_norm_backward (HF LlamaRMSNorm's gradients; its verdict holds for the SM count and threads per SM it was measured on, docs/backward.md), silu_mul_backward (the gradients of silu(gate) * up, docs/backward-gated.md), layer_norm_backward (nn.LayerNorm's gradients from the forward's saved mean and rstd, at most 65536 rows, docs/backward-layer-norm.md)"),
        ("semantics" = Option<SemanticsName>, Query, description = "llama, gemma or torch for rms_norm; default otherwise. Left out: the op's default (rms_norm: llama), named in the answer's `semantics` with `semantics_defaulted: true` (a 404 says so in its `detail` too)"),
        ("dtype" = DTypeName, Query, description = "bf16, f16 or f32"),
        ("arch" = ArchName, Query, description = "e.g. sm_90"),
        ("cols" = u64, Query, description = "columns (elements per row; element count for elementwise ops), at most 2^40", minimum = 1, maximum = 1099511627776_i64),
        ("rows" = Option<u64>, Query, description = "rows: picks the nearest measured speed; a width verification asked for runs rows 1..max(64, rows); never gates", minimum = 1, maximum = 1099511627776_i64),
        ("policy" = Option<PolicyText>, Query, description = "bit_exact (default), ulp:N, tolerance, argmax, with ,deterministic ,batch_invariant ,max_abs_diff=X ,max_mismatch_fraction=X"),
        ("runtime" = Option<String>, Query, description = "cuda (default: CUDA kernels only) or any (Python candidates too, docs/spec.md section 2b)"),
        ("sms" = Option<u32>, Query, description = "backward ops only, with threads_per_sm: the asking GPU's SM count; a rms_norm_backward kernel is handed out only where its verification ran on a GPU with the same SMs and threads per SM (eager's dw order depends on both); silu_mul_backward's and layer_norm_backward's verdicts depend on neither (elementwise; a column sum whose order the rows decide), so they do not restrict them", minimum = 1, maximum = 1048576),
        ("threads_per_sm" = Option<u32>, Query, description = "backward ops only, with sms: the asking GPU's maximum threads per SM", minimum = 1, maximum = 1048576),
    ),
    responses((status = 200, description = "The chosen kernel with its evidence; `also_qualifying` lists the first 100 other qualifying kernels, fastest first (`also_qualifying_total` counts all). `verified_at` is when the GPU measured it (the report's `started_at`), `imported_at` when this hub imported it (null: measured by this hub's worker); `speed` is the timed case nearest the asked shape, labelled with `measured_at` and `asked_width_measured`; `semantics` is the semantics resolved (`semantics_defaulted`: the parameter was left out)", body = super::openapi::ResolveAnswer), (status = 404, description = "No kernel qualifies; `excluded` says why each is out (the first 100; `excluded_total` counts all); `request_verification` (when a kernel meets the policy but was not verified at this width) is the explicit request that queues a verification of it; `semantics` and `semantics_defaulted` as in the 200 answer"), (status = 400, description = "A bad parameter")))]
pub async fn resolve(
    State(st): State<AppState>,
    // Checks a token sent (and one required for reads, where the hub asks for it).
    _caller: Caller,
    Q(q): Q<HashMap<String, String>>,
) -> Result<Response, AppError> {
    let query = parse_query(&q)?;
    let text = st.resolver().answer(&q, &query).await?;
    Ok(crate::answers::json_response(text))
}

pub use crate::resolve::REQUEST_PATH;

/// The body of `POST /v1/resolve/verifications`: the query of `GET /v1/resolve`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VerificationsRequest {
    #[schema(value_type = OpName)]
    pub op: String,
    #[serde(default)]
    #[schema(value_type = Option<SemanticsName>)]
    pub semantics: Option<String>,
    #[schema(value_type = DTypeName)]
    pub dtype: String,
    #[schema(value_type = ArchName)]
    pub arch: String,
    #[schema(minimum = 1, maximum = 1099511627776_i64)]
    pub cols: u64,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1099511627776_i64)]
    pub rows: Option<u64>,
    #[serde(default)]
    #[schema(value_type = Option<PolicyText>)]
    pub policy: Option<String>,
    /// cuda (default: CUDA kernels only) or any (Python candidates too).
    #[serde(default)]
    pub runtime: Option<RuntimeChoice>,
    /// Backward ops only, with `threads_per_sm`: the asking GPU's SM count.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1048576)]
    pub sms: Option<u32>,
    /// Backward ops only, with `sms`: the asking GPU's maximum threads per SM.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1048576)]
    pub threads_per_sm: Option<u32>,
}

/// Which runtimes a resolve considers.
#[derive(Debug, Clone, Copy, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeChoice {
    Cuda,
    Any,
}

impl VerificationsRequest {
    fn params(&self) -> HashMap<String, String> {
        let mut q = HashMap::new();
        q.insert("op".into(), self.op.clone());
        q.insert("dtype".into(), self.dtype.clone());
        q.insert("arch".into(), self.arch.clone());
        q.insert("cols".into(), self.cols.to_string());
        if let Some(r) = self.runtime {
            let r = match r {
                RuntimeChoice::Cuda => "cuda",
                RuntimeChoice::Any => "any",
            };
            q.insert("runtime".into(), r.into());
        }
        for (k, v) in [("semantics", &self.semantics), ("policy", &self.policy)] {
            if let Some(v) = v {
                q.insert(k.into(), v.clone());
            }
        }
        for (k, v) in [
            ("rows", self.rows),
            ("sms", self.sms.map(u64::from)),
            ("threads_per_sm", self.threads_per_sm.map(u64::from)),
        ] {
            if let Some(v) = v {
                q.insert(k.into(), v.to_string());
            }
        }
        q
    }
}

/// Ask for verifications of the width of a resolve query (token scope `submit`: whoever may
/// submit a kernel, which queues a GPU job too, may ask the workers to run one at a width).
/// For every kernel that meets the policy but was not verified at `cols`, a verification of
/// exactly this width is queued: at most one pending per kernel and width (a pending one is
/// reused, `new: false`), and none beyond the server-wide cap `--max-pending-width-jobs`
/// (`queue_full` says so). 201 when a job was queued, else 200; `queued_jobs` lists them
/// (poll `job_url`, then GET /v1/resolve again once `done`).
#[utoipa::path(post, path = "/v1/resolve/verifications", tag = "resolve",
    request_body = VerificationsRequest,
    responses((status = 201, description = "At least one verification queued; `queued_jobs` lists them"),
        (status = 200, description = "Nothing new queued: the width is verified, already pending (`queued_jobs`, `new: false`), or the cap is reached (`queue_full`)"),
        (status = 400, description = "A bad field"),
        (status = 401, description = "No token, or an unknown, expired or revoked one"), (status = 403, description = "Token lacks scope submit"),
        (status = 422, description = "The body is not a valid request")),
    security(("token" = [])))]
pub async fn request_verifications(
    State(st): State<AppState>,
    caller: Caller,
    b: Result<Json<VerificationsRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AppError> {
    let actor = caller.require(Scope::Submit)?.to_string();
    let Json(b) = b.map_err(rejection)?;
    let query = parse_query(&b.params())?;
    let (status, body) = st.resolver().request_verifications(&query, actor).await?;
    Ok((status, Json(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::MAX_DEVICE_FIGURE;

    /// The documented bounds of `sms` and `threads_per_sm` (utoipa takes only a literal) are the
    /// constant `parse_query` enforces, on the GET's parameters and the POST's body alike.
    #[test]
    fn gpu_figure_limits_are_the_constant() {
        let doc = serde_json::to_value(crate::routes::openapi()).unwrap();
        let params = doc["paths"]["/v1/resolve"]["get"]["parameters"]
            .as_array()
            .unwrap();
        let body = &doc["components"]["schemas"]["VerificationsRequest"]["properties"];
        for name in ["sms", "threads_per_sm"] {
            let p = params.iter().find(|p| p["name"] == name).unwrap();
            for schema in [&p["schema"], &body[name]] {
                assert_eq!(
                    schema["maximum"].as_f64(),
                    Some(MAX_DEVICE_FIGURE as f64),
                    "{name}: {schema}"
                );
                assert_eq!(schema["minimum"].as_f64(), Some(1.0), "{name}: {schema}");
            }
        }
    }
}
