//! `/field`: the field compared — per op, dtype and architecture, every kernel side by side
//! whatever its runtime (bundled CUDA kernels, Python candidates: Liger-Kernel, `torch.compile`,
//! PyTorch's fused functions), with exactness, model-level agreement and speed against the
//! roofline, and a link to the policy explorer resolving across runtimes.

use super::overview::{filters, pager};
use super::{class_badge, frac, gbps, kernel_href, layout, opt_param, roofline, sci, ulp};
use super::{verified, Nav, PageError};
use crate::error::AppError;
use crate::state::{AppState, Caller};
use axum::extract::{Query, State};
use kernel_registry::{Arch, DType, Op, Runtime};
use kernel_store::{FieldGroup, FieldRow, MatrixFilter, HEADLINE_COLS, HEADLINE_ROWS};
use maud::{html, Markup};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::OnceLock;

/// Rows per page, by default and at most.
const PAGE_ROWS: i64 = 200;
const MAX_PAGE_ROWS: i64 = 1000;

pub async fn page(
    State(st): State<AppState>,
    _caller: Caller,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Markup, PageError> {
    super::known_params(&q, &["op", "dtype", "arch", "limit", "offset"])?;
    let op: Option<Op> = opt_param(&q, "op")?;
    let dtype: Option<DType> = opt_param(&q, "dtype")?;
    let arch: Option<Arch> = opt_param(&q, "arch")?;
    let limit: i64 = opt_param(&q, "limit")?.unwrap_or(PAGE_ROWS);
    let offset: i64 = opt_param(&q, "offset")?.unwrap_or(0);
    if !(1..=MAX_PAGE_ROWS).contains(&limit) || offset < 0 {
        return Err(AppError::bad_request(format!(
            "`limit` must be 1..={MAX_PAGE_ROWS}, `offset` >= 0"
        ))
        .into());
    }
    let f = MatrixFilter { op, dtype, arch };
    let (rows, total) = st.store.field_page(f, limit, offset).await?;
    let fastest_exact = if total > 0 {
        st.store.field_fastest_exact(f).await?
    } else {
        HashMap::new()
    };
    let mut archs = st.store.archs_verified(f).await?;
    if let Some(a) = arch.filter(|a| !archs.contains(a)) {
        archs.push(a);
        archs.sort();
    }
    let link = |off: i64| {
        let paging = [("limit", limit, PAGE_ROWS), ("offset", off, 0)];
        super::filter_href("/field", op, dtype, arch, &paging)
    };
    let body = html! {
        h1 { "The field" }
        p.lead {
            "Every kernel of an op side by side, whatever runs it: the bundled CUDA kernels and Python candidates "
            "(Liger-Kernel's Triton kernels, " code { "torch.compile" } "'d layers, PyTorch's fused functions), measured by the same suite. "
            "Per op, dtype and GPU architecture, each kernel's newest verdict against the eager reference layer; "
            "the model level (the kernel in every matching layer of a small real model: argmax agreement and the largest logit change), where measured; "
            "and speed at the measured shape nearest " (HEADLINE_ROWS) "x" (HEADLINE_COLS) " as a fraction of this device's copy bandwidth (the roofline)."
        }
        (filters("/field", op, dtype, arch, &archs))
        @if total == 0 {
            div.note #no-field {
                p { "No verification matches these filters. " a href="/field" { "Show all." } }
                p { "Kernels appear here once a GPU worker has verified them (see " a href="/" { "the verification matrix" } ")." }
            }
        } @else {
            h2 { "Candidates " span.muted { "(" (total) " rows)" } }
            (table(&rows, &fastest_exact))
            (pager("field-pages", offset, limit, rows.len(), total, link))
        }
        (rewrites_section())
    };
    Ok(layout("The field", Nav::Field, body))
}

/// What runs the kernel, in a person's words.
fn runtime_label(r: Runtime) -> (&'static str, &'static str) {
    match r {
        Runtime::Cuda => ("CUDA", "a CUDA kernel of the hub's ABI, compiled with NVRTC"),
        Runtime::Python => (
            "Python",
            "a Python candidate (docs/spec.md section 2b): a function of its .py source, e.g. a Triton kernel, torch.compile or a PyTorch function",
        ),
    }
}

/// One line per model measured, for the model cells' tooltip.
fn models_title(r: &FieldRow) -> String {
    r.models
        .iter()
        .map(|m| {
            format!(
                "{}: argmax {}, max logit diff {}, top-5 {}, KL {}, {} layer(s), {} tokens",
                m.model_name,
                frac(m.argmax_match_fraction),
                sci(m.max_logit_abs_diff),
                frac(m.top5_overlap),
                sci(m.mean_kl),
                m.layers_replaced,
                m.tokens
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn table(rows: &[FieldRow], fastest_exact: &HashMap<FieldGroup, f64>) -> Markup {
    let starts: Vec<bool> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| i == 0 || rows[i - 1].group() != r.group())
        .collect();
    html! {
        div.scroll {
            table #field {
                thead { tr {
                    th { "kernel" } th { "runtime" } th { "exactness" }
                    th.num title="largest fraction of elements differing from the reference in any case" { "mismatch" }
                    th.num { "max ulp" } th.num { "max abs diff" }
                    th.num title="lowest fraction of positions whose argmax is the eager model's, over the models measured" { "argmax match" }
                    th.num title="largest logit change over the models measured" { "max logit diff" }
                    th { "models" }
                    th.num { "GB/s" } th { "of copy roofline" } th.num { "speedup vs ref" }
                    th.num title="GB/s over the fastest bit-exact kernel's of this op, dtype and architecture" { "vs fastest bit-exact" }
                    th { "shape" } th { "device" } th { "verified" }
                } }
                tbody {
                    @for (r, start) in rows.iter().zip(&starts) {
                        @if *start {
                            tr.group data-op=(r.kernel.op) data-dtype=(r.dtype) data-arch=(r.arch) {
                                td colspan="16" {
                                    (r.kernel.op) " · " (r.kernel.semantics) " · " (r.dtype) " · " (r.arch) " "
                                    a href={"/policy?op=" (r.kernel.op) "&dtype=" (r.dtype) "&arch=" (r.arch) "&runtime=any"} {
                                        "resolve across runtimes"
                                    }
                                }
                            }
                        }
                        @let (rt, rt_title) = runtime_label(r.kernel.runtime);
                        tr data-runtime=(rt) {
                            td { a href=(kernel_href(&r.kernel.name, &r.kernel.version)) title=(r.kernel.description) { (r.kernel.name) " " (r.kernel.version) } }
                            td title=(rt_title) { (rt) }
                            td { (class_badge(r.verdict.class)) }
                            td.num { (frac(r.verdict.max_mismatch_fraction)) }
                            td.num { (ulp(r.verdict.max_ulp)) }
                            td.num { (sci(r.verdict.max_abs_diff)) }
                            @match (r.worst_argmax(), r.worst_logit_diff()) {
                                (Some(a), Some(d)) => {
                                    td.num.model title=(models_title(r)) { (frac(a)) }
                                    td.num.model { (sci(d)) }
                                    td.muted { (r.models.iter().map(|m| m.model_name.as_str()).collect::<Vec<_>>().join(", ")) }
                                },
                                _ => { td.num.muted { "—" } td.num.muted { "—" } td.muted { "not measured" } },
                            }
                            @match &r.speed {
                                Some(s) => {
                                    td.num { (gbps(s.gbps)) }
                                    td { (roofline(s.copy_fraction)) }
                                    td.num { (format!("{:.2}x", s.speedup)) }
                                    @match fastest_exact.get(&r.group()) {
                                        Some(best) if *best > 0.0 => td.num.vs-exact { (format!("{:.2}x", s.gbps / best)) },
                                        _ => td.num.muted title="no bit-exact kernel of this group has a measured speed" { "—" },
                                    }
                                    td.muted { (s.rows) "x" (s.cols) }
                                },
                                None => { td.num.muted { "—" } td.muted { "not measured" } td.num.muted { "—" } td.num.muted { "—" } td {} },
                            }
                            td { (r.device_name) }
                            td.verified { (verified(&r.verified_at, r.imported_at.as_deref())) }
                        }
                    }
                }
            }
        }
    }
}

/// torch.compile's rewrites against eager's bits, plain inductor and kernelize's exact compile
/// (docs/compile.md): `docs/compile-rewrites.json`, written by `scripts/compile_rewrites.py`
/// from a GPU run's records and built into the binary.
const REWRITES_JSON: &str = include_str!("../../../docs/compile-rewrites.json");

#[derive(Deserialize)]
struct RewriteTable {
    device: String,
    torch: String,
    date: String,
    rewrites: Vec<Rewrite>,
}

#[derive(Deserialize)]
struct Rewrite {
    subject: String,
    rewrite: String,
    dtypes: String,
    measured: String,
    inductor: String,
    exact: String,
    evidence: String,
}

fn rewrite_table() -> &'static RewriteTable {
    static TABLE: OnceLock<RewriteTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        serde_json::from_str(REWRITES_JSON)
            .expect("docs/compile-rewrites.json parses (a unit test checks it)")
    })
}

fn rewrites_section() -> Markup {
    let t = rewrite_table();
    html! {
        h2 #compile-rewrites { "torch.compile's rewrites" }
        p {
            "What Inductor does to eager's bits, layer by layer, model by model and math-library function by function, and what kernelize's exact compile "
            "(" code { "kernelize(model, compile=True)" } ": reductions, normalisations and attention as eager's own kernels, math functions too "
            "unless Inductor's code for them is proven eager's on every input of the dtype, "
            "no pattern rewrites, eager's roundings) does instead. Measured on " (t.device) " with torch " (t.torch) " on " (t.date) "; "
            "see docs/compile.md."
        }
        div.scroll {
            table #rewrites {
                thead { tr {
                    th { "layer or model" } th { "what Inductor rewrites" } th { "dtype" } th { "measured by" }
                    th { "torch.compile" } th { "exact compile" } th { "evidence" }
                } }
                tbody {
                    @for r in &t.rewrites {
                        tr {
                            td { (r.subject) } td.muted { (r.rewrite) } td { (r.dtypes) } td.muted { (r.measured) }
                            td { (r.inductor) }
                            td { @if r.exact == "bit_exact" || r.exact.starts_with("bit-identical") { strong { (r.exact) } } @else { (r.exact) } }
                            td.muted { (r.evidence) }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rewrite_table_parses_and_has_every_layer() {
        let t = rewrite_table();
        assert!(t.rewrites.len() >= 4);
        for subject in [
            "LlamaRMSNorm",
            "nn.LayerNorm",
            "silu(gate) * up",
            "pytorch#179578",
            "pytorch#179575",
            "Linear -> LayerNorm(1024) -> Linear",
            "rotary embedding",
            "F.scaled_dot_product_attention",
            "tanh(x) (math library)",
            "pow(x, 3.0) (math library)",
        ] {
            assert!(
                t.rewrites.iter().any(|r| r.subject.contains(subject)),
                "no row for {subject}"
            );
        }
        assert!(!t.torch.is_empty() && !t.device.is_empty());
    }
}
