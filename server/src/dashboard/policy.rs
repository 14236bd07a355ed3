//! `/policy`: the policy explorer. For a policy, dtype, arch and shape, what every op resolves
//! to and why each other kernel is out — computed by `resolve::Resolver::explain` from a query parsed by
//! `api::resolve::parse_query`, so it is the answer `/v1/resolve` gives. It resolves across
//! runtimes by default (`runtime=any`: CUDA kernels and Python candidates compete); `runtime=cuda`
//! shows what a client that did not opt in to Python candidates gets.

use super::{class_badge, date, gbps, kernel_href, layout, roofline, Nav, PageError};
use crate::api::resolve::parse_query;
use crate::resolve::Resolution;
use crate::state::{AppState, Caller};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kernel_registry::{DType, Op, Semantics};
use maud::html;
use std::collections::HashMap;

const DEFAULTS: [(&str, &str); 5] = [
    ("policy", "bit_exact"),
    ("dtype", "bf16"),
    ("arch", "sm_90"),
    ("cols", "4096"),
    ("runtime", "any"),
];
const PARAMS: [&str; 7] = ["policy", "dtype", "arch", "cols", "rows", "op", "runtime"];
/// The `runtime` choices: (value, label).
const RUNTIMES: [(&str, &str); 2] = [
    ("any", "any: CUDA kernels and Python candidates"),
    ("cuda", "cuda: what a client without the Python opt-in gets"),
];
const POLICIES: [&str; 7] = [
    "bit_exact",
    "bit_exact,deterministic,batch_invariant",
    "ulp:1",
    "ulp:2",
    "tolerance",
    "argmax",
    "tolerance,max_mismatch_fraction=0.001",
];
const ARCHS: [&str; 6] = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"];

pub async fn page(
    State(st): State<AppState>,
    _caller: Caller,
    Query(raw): Query<HashMap<String, String>>,
) -> Result<Response, PageError> {
    // The form's values, defaults filled in; empty fields count as absent.
    let mut form: HashMap<String, String> = DEFAULTS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for k in PARAMS {
        if let Some(v) = raw.get(k) {
            if v.trim().is_empty() {
                form.remove(k);
            } else {
                form.insert(k.to_string(), v.trim().to_string());
            }
        }
    }
    // A parameter the page does not take is refused as the API refuses it (a 400 page).
    if let Err(e) = crate::api::known_params(&raw, &PARAMS) {
        return Ok(render(&form, Err(e.detail)));
    }
    let only_op: Option<Op> = match form.get("op").map(|s| s.parse::<Op>()) {
        None => None,
        Some(Ok(op)) => Some(op),
        Some(Err(e)) => return Ok(render(&form, Err(format!("query parameter `op`: {e}")))),
    };

    let mut answers: Vec<(Op, Semantics, String, Resolution)> = Vec::new();
    for op in Op::ALL
        .iter()
        .copied()
        .filter(|o| only_op.is_none_or(|w| w == *o))
    {
        for sem in op.semantics() {
            let mut q: HashMap<String, String> = form
                .iter()
                .filter(|(k, _)| k.as_str() != "op")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            q.insert("op".into(), op.to_string());
            q.insert("semantics".into(), sem.to_string());
            let query = match parse_query(&q) {
                Ok(query) => query,
                // The same 400 text the API gives; it does not depend on the op.
                Err(e) => return Ok(render(&form, Err(e.detail))),
            };
            let r = st.resolver().explain(&query).await?;
            answers.push((op, *sem, api_url(&q), r));
        }
    }
    Ok(render(&form, Ok(answers)))
}

fn render(
    form: &HashMap<String, String>,
    answers: Result<Vec<(Op, Semantics, String, Resolution)>, String>,
) -> Response {
    let v = |k: &str| form.get(k).cloned().unwrap_or_default();
    let status = if answers.is_err() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    let dtype = v("dtype");
    let runtime = v("runtime");
    let body = html! {
        h1 { "Policy explorer" }
        p.lead { "Which kernel each op resolves to under a policy, on an architecture, for a shape — and why every other kernel is out. "
            "This is the answer " code { "GET /v1/resolve" } " gives (the same function computes it); a kernel never verified on the architecture is never handed out. "
            "With runtime any, CUDA kernels and Python candidates (Liger-Kernel, torch.compile, PyTorch's fused functions) compete: the fastest that meets the policy wins, whatever runs it; "
            "a client is handed a Python candidate only when its caller opts in. " a href="/field" { "Compare the field." } }
        form.filters method="get" action="/policy" {
            label { "policy"
                input name="policy" value=(v("policy")) list="policies" size="34";
                datalist #policies { @for p in POLICIES { option value=(p) {} } }
            }
            label { "dtype"
                select name="dtype" { @for d in DType::ALL { option value=(d) selected[d.as_str() == dtype] { (d) } } }
            }
            label { "arch"
                input name="arch" value=(v("arch")) list="archs" size="8";
                datalist #archs { @for a in ARCHS { option value=(a) {} } }
            }
            label { "cols" input name="cols" value=(v("cols")) size="7" inputmode="numeric"; }
            label { "rows (optional)" input name="rows" value=(v("rows")) size="7" inputmode="numeric"; }
            label { "op"
                select name="op" {
                    option value="" { "all ops" }
                    @for o in Op::ALL { option value=(o) selected[o.as_str() == v("op")] { (o) } }
                }
            }
            label { "runtime"
                select name="runtime" { @for (r, label) in RUNTIMES { option value=(r) selected[r == runtime] { (label) } } }
            }
            button type="submit" { "Resolve" }
        }
        @match &answers {
            Err(detail) => p.error #policy-error { (detail) },
            Ok(answers) => {
                table #resolutions {
                    thead { tr {
                        th { "op (semantics)" } th { "resolves to" } th { "exactness" } th.num { "GB/s" } th { "of roofline" }
                        th.num { "speedup" } th { "verified on" } th { "why the others are out" }
                    } }
                    tbody {
                        @for (op, sem, url, r) in answers {
                            tr data-op=(op) data-semantics=(sem) {
                                td { (op) " " span.muted { "(" (sem) ")" } br; a.muted href=(url) { "JSON" } }
                                @match &r.chosen {
                                    Some(c) => {
                                        td.chosen {
                                            a href=(kernel_href(&c.kernel.name, &c.kernel.version)) { strong { (c.kernel.name) " " (c.kernel.version) } }
                                            @if c.kernel.runtime == kernel_registry::Runtime::Python { " " span.muted.runtime title="a Python candidate (docs/spec.md section 2b)" { "python" } }
                                        }
                                        td { (class_badge(c.summary.class)) }
                                        @match &c.speed {
                                            Some(s) => {
                                                td.num title={"at " (s.rows) "x" (s.cols)} { (gbps(s.gbps)) }
                                                td { (roofline(s.copy_fraction)) }
                                                td.num { (format!("{:.2}x", s.speedup)) }
                                            },
                                            None => { td.num.muted { "—" } td {} td {} },
                                        }
                                        td { (c.device) br; (date(&c.verified_at))
                                            @if let Some(n) = &c.coverage.note { br; span.muted.coverage { (n) } } }
                                    },
                                    None => {
                                        td.chosen colspan="6" {
                                            strong { "none" } " — keep the reference layer"
                                            @if r.excluded.is_empty() { span.muted { " (no kernel is registered for this op)" } }
                                            @if !r.unverified_width.is_empty() {
                                                br; span.badge.c-fails.unverified-width { "not verified at this width" }
                                                " " span.muted { (r.unverified_width.join(", ")) " meet" @if r.unverified_width.len() == 1 { "s" } " the policy at other widths; "
                                                    a href=(url) { "GET /v1/resolve" } " queues a verification of this one" }
                                            }
                                        }
                                    },
                                }
                                td.why {
                                    @if r.also_qualifying.is_empty() && r.excluded.is_empty() { span.muted { "—" } }
                                    ul.why {
                                        @for line in &r.also_qualifying { li { (line) } }
                                        @if r.also_qualifying_total > r.also_qualifying.len() {
                                            li.muted { "… and " (r.also_qualifying_total - r.also_qualifying.len()) " more qualify, slower" }
                                        }
                                        @for line in &r.excluded { li { (line) } }
                                    }
                                }
                            }
                        }
                    }
                }
            },
        }
    };
    (status, layout("Policy explorer", Nav::Policy, body)).into_response()
}

/// The `/v1/resolve` URL of the same question.
fn api_url(q: &HashMap<String, String>) -> String {
    let mut parts: Vec<String> = crate::api::resolve::PARAMS
        .iter()
        .filter_map(|k| q.get(*k).map(|v| format!("{k}={}", encode(v))))
        .collect();
    parts.dedup();
    format!("/v1/resolve?{}", parts.join("&"))
}

/// Percent-encode a query value (everything but unreserved characters).
fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
