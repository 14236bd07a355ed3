//! `/kernels/{name}/{version}`: one kernel's manifest, source and every verification with
//! its per-case table and plots.

use super::plot::{self, Point};
use super::{class_badge, date, frac, gbps, layout, roofline, sci, ulp, verified, Nav, PageError};
use crate::error::AppError;
use crate::state::{AppState, Caller};
use axum::extract::{Path, Query, State};
use kernel_registry::report::{coverage, percent, CaseStatus, ULP_BUCKETS};
use kernel_registry::{DType, Op, Runtime};
use kernel_store::VerificationRow;
use maud::{html, Markup};

pub async fn page(
    State(st): State<AppState>,
    _caller: Caller,
    Path((name, version)): Path<(String, String)>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<Markup, PageError> {
    super::known_params(&q, &[])?;
    let k = st.store.kernel(&name, &version).await?.ok_or_else(|| {
        AppError::not_found(format!(
            "no kernel `{name}` version `{version}`; the overview lists every kernel"
        ))
    })?;
    let src = st.store.source(&k.digest).await?;
    let verifications = st.store.verifications_for_kernel(&k.digest).await?;
    let mut staleness = crate::stale::Staleness::new(&st.store);
    let mut stale = Vec::with_capacity(verifications.len());
    for v in &verifications {
        stale.push(staleness.of(v).await?);
    }
    let jobs = st.store.jobs_for_kernel(&k.digest).await?;
    let title = format!("{} {}", k.name, k.version);
    let body = html! {
        h1 { (k.name) " " span.muted { (k.version) } }
        p.lead { (k.description) }
        dl.meta #manifest {
            dt { "op" } dd { (k.op) " (" (k.semantics) ")" }
            // Python candidates (docs/spec.md section 2b) say so; CUDA is the default and goes unsaid.
            @if k.runtime == Runtime::Python {
                dt { "runtime" } dd #runtime { "python: a function of the source, run with its `requires` (docs/python-candidates.md)" }
            }
            dt { "dtypes" } dd { (k.dtypes.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", ")) }
            dt { "archs" } dd { @if k.archs.is_empty() { "any" } @else { (k.archs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ")) } }
            dt { "cols" } dd {
                ">= " (k.cols_min)
                @if let Some(m) = k.cols_max { ", <= " (m) }
                @if k.cols_multiple_of > 1 { ", multiple of " (k.cols_multiple_of) }
            }
            // A Python backward candidate's setup functions (`[setup]`, docs/python-candidates.md):
            // what runs before each call, outside the timed region.
            @if let Some(setup) = src.as_ref().map(|s| &s.manifest.setup).filter(|t| !t.is_empty()) {
                dt { "setup" } dd #setup {
                    @for (d, f) in setup {
                        code { (f) } " (" (d.as_str()) "); "
                    }
                    span.muted { "run before each call, untimed: the forward its backward reads" }
                }
            }
            @if let Some(declared) = src.as_ref().map(|s| &s.manifest.capabilities).filter(|d| !d.is_empty()) {
                dt { "declares" } dd #declared-capabilities {
                    @for d in declared {
                        code { (d.name) } " (" (d.reason) "); "
                    }
                }
            }
            dt { "authors" } dd { (k.authors.join(", ")) }
            dt { "license" } dd { (k.license) }
            dt { "origin" } dd { (k.origin) }
            dt { "registered" } dd { (date(&k.created_at)) }
            dt { "digest" } dd { code #digest { (k.digest) } " " a href={"/v1/sources/" (k.digest)} { "(JSON, digest re-checked)" } }
            dt { "jobs" } dd {
                @if jobs.is_empty() { "none" }
                @for j in &jobs {
                    "#" (j.id) " " (j.state)
                    @if !j.shapes.is_empty() {
                        " (widths " (j.shapes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")) ")"
                    }
                    @if let Some(e) = &j.last_error { span.muted { " (" (e) ")" } }
                    "; "
                }
            }
        }
        h2 { "Verifications " span.muted { "(" (verifications.len()) ")" } }
        @if verifications.is_empty() {
            div.note #no-verifications {
                p { "This kernel has not been verified yet, so it is never handed out. A GPU worker verifies queued kernels: "
                    code { "kernelize worker --server http://HUB:8080 --token TOKEN" } " on a GPU host, or " code { "kernelize serve --worker" } "." }
            }
        }
        @for (v, why) in verifications.iter().zip(&stale) { (verification(v, k.op, why)) }
        h2 { "Source" }
        @match &src {
            Some(s) => {
                p { "Digest " code { (s.digest) } " covers the manifest and this source." }
                h3 { "kernel.toml" }
                pre #manifest-toml { code { (s.manifest_toml) } }
                h3 { (s.manifest.source) }
                pre #source { code { (s.source) } }
            },
            None => p.error { "The source of this kernel is missing from the store." },
        }
    };
    Ok(layout(&title, Nav::Kernel, body))
}

/// What the verification covered: per dtype, each row length with the row counts that ran.
/// The hub hands the kernel out only at these row lengths (elementwise ops: up to the largest
/// element count).
fn coverage_table(v: &VerificationRow, op: Op) -> Markup {
    let cov = coverage(&v.report);
    let dtypes: Vec<DType> = {
        let mut d: Vec<DType> = cov.iter().map(|c| c.dtype).collect();
        d.dedup();
        d
    };
    let elementwise = !op.is_rowwise();
    html! {
        div.coverage {
            h4 { "Coverage " span.muted { "(handed out only at these widths on " (v.arch) ")" } }
            @if cov.is_empty() {
                p.error { "No case ran: this verification covers no width, so the kernel is not handed out on its strength." }
            } @else {
                table.coverage {
                    thead { tr { th { "dtype" } th.num { "widths" } th { "cols (rows verified)" } } }
                    tbody {
                        @for d in &dtypes {
                            @let of: Vec<_> = cov.iter().filter(|c| c.dtype == *d).collect();
                            tr data-dtype=(d) {
                                td { (d) }
                                td.num { (of.len()) }
                                td.wrap {
                                    @for (i, c) in of.iter().enumerate() {
                                        @if i > 0 { ", " }
                                        strong { (c.cols) }
                                        @if c.rows_min == c.rows_max { " (" (c.rows_min) ")" }
                                        @else { " (" (c.rows_min) ".." (c.rows_max) ", " (c.row_counts.len()) " counts)" }
                                    }
                                    @if elementwise {
                                        br; span.muted { "elementwise: covered up to "
                                            (of.iter().map(|c| c.max_elements()).max().unwrap_or(0)) " elements" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if !v.report.requested_shapes.is_empty() {
                p.muted { "Asked for besides the suite: "
                    (v.report.requested_shapes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")) }
            }
        }
    }
}

fn verification(v: &VerificationRow, op: Op, stale: &[String]) -> Markup {
    let r = &v.report;
    let dtypes: Vec<DType> = r.summary.per_dtype.keys().copied().collect();
    let series: Vec<String> = dtypes.iter().map(|d| d.to_string()).collect();
    let series_of = |d: DType| dtypes.iter().position(|x| *x == d).unwrap_or(0);

    // Histogram of ulp distances over every case that ran.
    let mut hist = vec![0u64; ULP_BUCKETS.len() + 1];
    for c in &r.cases {
        if let Some(e) = &c.exactness {
            for (i, n) in e.ulp_histogram.iter().enumerate() {
                // A worker's counts may be anything: saturate rather than overflow.
                let b = &mut hist[i.min(ULP_BUCKETS.len())];
                *b = b.saturating_add(*n);
            }
        }
    }
    let mut labels = Vec::new();
    let mut prev: Option<u64> = None;
    for b in ULP_BUCKETS {
        labels.push(match prev {
            Some(p) if b > p + 1 => format!("{}-{b}", p + 1),
            _ => b.to_string(),
        });
        prev = Some(b);
    }
    labels.push(format!(">{}", ULP_BUCKETS[ULP_BUCKETS.len() - 1]));

    let accuracy: Vec<Point> = r
        .cases
        .iter()
        .filter_map(|c| {
            c.accuracy.as_ref().map(|a| Point {
                x: a.reference_max_abs,
                y: a.candidate_max_abs,
                series: series_of(c.dtype),
                label: format!(
                    "{}: candidate {} vs reference {}",
                    c.id,
                    sci(a.candidate_max_abs),
                    sci(a.reference_max_abs)
                ),
            })
        })
        .collect();
    let speed: Vec<Point> = r
        .cases
        .iter()
        .filter_map(|c| {
            c.speed.as_ref().map(|s| Point {
                x: c.cols as f64,
                y: s.gbps,
                series: series_of(c.dtype),
                label: format!("{}: {} GB/s", c.id, gbps(s.gbps)),
            })
        })
        .collect();

    html! {
        section.verification id={"v" (v.id)} {
            h3 { "On " (r.device.name) " (" (v.arch) ") · " (verified(&v.verified_at, None)) }
            dl.meta {
                dt { "device" } dd { (r.device.name) ", " (r.device.sm_count) " SMs, copy bandwidth " (gbps(r.device.copy_gbps)) " GB/s" }
                dt { "driver / CUDA" } dd { (r.device.driver_version) " / " (r.device.cuda_version) }
                dt { "seed" } dd { code { (r.seed) } " (replay: " code { "kernelize verify DIR --seed " (r.seed) } ")" }
                dt { "verifier / suite" } dd { (r.verifier_version) " / " (r.suite_version) @if r.quick { " (quick)" } }
                dt { "reference" } dd { (r.reference) }
                dt { "started" } dd { (date(&r.started_at)) ", took " (format!("{:.1}", r.duration_s)) " s" }
                dt { "record" } dd { a href={"/v1/verifications/" (v.id)} { "JSON" } }
                @if !stale.is_empty() {
                    dt { "stale" } dd.stale {
                        (stale.join("; "))
                        " (re-verify: " code { "kernelize verify-request --stale --arch " (v.arch) } ")"
                    }
                }
                dt { "origin" } dd.origin {
                    @if v.job_id.is_some() { "verified by a worker of this hub (job " (v.job_id.unwrap_or_default()) ")" }
                    @else {
                        "imported: recorded on the project's GPU runs and shipped with the bundle"
                        @if let Some(at) = &v.imported_at { "; stored by this hub " (date(at)) }
                    }
                }
                dt { "certificate" } dd.certificate {
                    @match &v.certificate {
                        Some(c) => {
                            "signed by worker key " code { (c.key_id()) }
                            " (check it offline: " code { "kernelize cert verify FILE --trust KEY" } ")"
                        }
                        None => { "none (the worker did not sign this report)" }
                    }
                }
            }
            table.verdicts {
                thead { tr {
                    th { "dtype" } th { "exactness" } th { "verdict" } th.num { "cases" }
                    th { "deterministic" } th { "batch-invariant" } th { "integrity" }
                    th.num { "GB/s 4096x8192" } th { "of roofline" } th.num { "speedup" }
                } }
                tbody {
                    @for (d, vd) in &r.summary.per_dtype {
                        tr {
                            td { (d) }
                            td { (class_badge(vd.class)) }
                            td.wrap { (vd.describe()) }
                            td.num { (vd.cases_run) @if vd.cases_not_applicable > 0 { " (+" (vd.cases_not_applicable) " n/a)" } }
                            td { (yes_no(vd.deterministic)) }
                            td { (yes_no(vd.batch_invariant)) }
                            td { @if vd.integrity_ok { "ok" } @else { span.badge.c-fails { "fails" } } }
                            td.num { (vd.gbps_4096x8192.map(gbps).unwrap_or_else(|| "—".into())) }
                            td { @if let Some(f) = vd.copy_fraction_4096x8192 { (roofline(f)) } }
                            td.num { (vd.speedup_4096x8192.map(|s| format!("{s:.2}x")).unwrap_or_else(|| "—".into())) }
                        }
                    }
                }
            }
            @if !r.summary.overall.problems.is_empty() {
                ul.why.error { @for p in &r.summary.overall.problems { li { (p) } } }
            }
            (capabilities(r))
            (coverage_table(v, op))
            (model_level(r))
            div.plots {
                figure.ulp-histogram {
                    (plot::histogram("ulp distance histogram", &labels, &hist))
                    figcaption { "Elements per ulp distance from the reference layer, all cases." }
                }
                figure.accuracy {
                    @if accuracy.is_empty() {
                        p.muted { "No accuracy (f64 oracle) measurement in this report." }
                    } @else {
                        (plot::error_scatter("error against the f64 oracle", &accuracy, &series))
                    }
                    figcaption { "Per case: candidate vs reference max abs error against the f64 oracle. Below the dashed line the candidate is closer to the truth than the reference." }
                }
                figure.speed {
                    @if speed.is_empty() {
                        p.muted { "No speed measurement in this report." }
                    } @else {
                        (plot::speed_vs_cols("GB/s against cols", &speed, &series, r.device.copy_gbps))
                    }
                    figcaption { "Per case: GB/s (bytes that must move over median time, L2 flushed) against cols; dashed: this device's copy bandwidth." }
                }
            }
            details open[r.cases.len() <= 40] {
                summary { "Per-case results (" (r.cases.len()) " cases)" }
                div.scroll {
                    table.cases {
                        thead { tr {
                            th { "case" } th { "status" } th.num { "mismatches" } th.num { "fraction" } th.num { "max ulp" }
                            th.num { "max abs" } th.num { "max rel" } th { "NaN/Inf parity" }
                            th.num { "cand. err max" } th.num { "ref. err max" } th.num { "cand. RMS" } th.num { "ref. RMS" }
                            th { "det." } th { "batch-inv." } th { "integrity" }
                            th.num { "median µs" } th.num { "GB/s" } th { "of roofline" } th.num { "speedup" }
                        } }
                        tbody {
                            @for c in &r.cases {
                                tr {
                                    td { code { (c.id) } }
                                    td {
                                        @match c.status {
                                            CaseStatus::Ran => "ran",
                                            CaseStatus::NotApplicable => span.muted { "n/a" },
                                            CaseStatus::Error => span.badge.c-fails { "error" },
                                        }
                                        @if let Some(n) = &c.note { " " span.muted { (n) } }
                                    }
                                    @match &c.exactness {
                                        Some(e) => {
                                            td.num { (e.mismatches) " / " (e.elements) }
                                            td.num { (frac(e.mismatch_fraction)) }
                                            td.num { (ulp(e.max_ulp)) }
                                            td.num { (sci(e.max_abs_diff)) }
                                            td.num { (sci(e.max_rel_diff)) }
                                            td { (yes_no(e.nonfinite_parity)) }
                                        },
                                        None => { td {} td {} td {} td {} td {} td {} },
                                    }
                                    @match &c.accuracy {
                                        Some(a) => {
                                            td.num { (sci(a.candidate_max_abs)) }
                                            td.num { (sci(a.reference_max_abs)) }
                                            td.num { (sci(a.candidate_rms)) }
                                            td.num { (sci(a.reference_rms)) }
                                        },
                                        None => { td {} td {} td {} td {} },
                                    }
                                    td { (opt_yes_no(c.deterministic)) }
                                    td { (opt_yes_no(c.batch_invariant)) }
                                    td { @if c.integrity_failures.is_empty() { "ok" } @else { span.error { (c.integrity_failures.join("; ")) } } }
                                    @match &c.speed {
                                        Some(s) => {
                                            td.num { (format!("{:.1}", s.median_us)) }
                                            td.num { (gbps(s.gbps)) }
                                            td { (roofline(s.copy_fraction)) }
                                            td.num { (format!("{:.2}x", s.speedup)) }
                                        },
                                        None => { td {} td {} td {} td {} },
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What the compiled code can do (docs/spec.md section 3b): each capability the audit found,
/// whether the manifest declares it, its evidence and dtypes, and why a default policy refuses
/// the kernel (if it does).
fn capabilities(r: &kernel_registry::report::VerificationReport) -> Markup {
    use kernel_registry::capability::refusals;
    let audit = r.audit();
    let refused = refusals(audit.as_deref(), &[], false);
    html! {
        div.capabilities {
            h4 { "What the compiled code can do" }
            @match audit.as_deref() {
                None => p.muted.not-audited {
                    "Not audited: the kernel is a Python candidate, whose code is not audited. A policy with "
                    code { "audited" } " refuses it."
                },
                Some(c) => {
                    @if !c.audited {
                        p.error.audit-incomplete {
                            "The audit is incomplete, so every policy refuses the kernel: "
                            (c.notes.join("; "))
                        }
                    }
                    @if c.found.is_empty() {
                        @if c.audited { p.audit-clean { "Nothing beyond ordinary computation: no clock, environment register, state across launches, global atomics, printf, trap, device launch, indirect call or inline assembly." } }
                    } @else {
                        table.capabilities {
                            thead { tr { th { "capability" } th { "declared" } th { "evidence" } th { "dtypes" } } }
                            tbody {
                                @for f in &c.found {
                                    tr {
                                        td { code { (f.name) } " " span.muted { (f.name.describe()) } }
                                        td {
                                            @if let Some(d) = c.declared.iter().find(|d| d.name == f.name) { "yes: " (d.reason) }
                                            @else if f.name.needs_declaration() { span.badge.c-fails { "not declared" } }
                                            @else { span.muted { "needs no declaration" } }
                                        }
                                        td { (f.evidence.join(", ")) }
                                        td { (f.dtypes.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", ")) }
                                    }
                                }
                            }
                        }
                    }
                },
            }
            @if !refused.is_empty() {
                ul.why.error.capabilities-refused {
                    @for w in &refused { li { "A default policy refuses it: " (w) } }
                }
            }
        }
    }
}

/// The model-level (argmax) measurements: the candidate in every matching layer of a real
/// model, against the same model with its eager layers.
fn model_level(r: &kernel_registry::report::VerificationReport) -> Markup {
    html! {
        section.model-level {
            h4 { "Inside a model (argmax agreement)" }
            @if r.model.is_empty() {
                p.muted { "No model-level measurement in this report (the worker ran without --model); policy argmax cannot be met." }
            } @else {
                table.models {
                    thead { tr {
                        th { "model" } th { "dtype" } th.num { "tokens" } th.num { "layers replaced" }
                        th.num { "max logit diff" } th.num { "argmax match" } th.num { "top-5 overlap" }
                        th.num { "mean KL" } th.num { "eager top-1 prob." } th { "adaptation" }
                    } }
                    tbody {
                        @for m in &r.model {
                            tr {
                                td { (m.model_name) br; code.muted title=(m.model_digest) { (m.model_digest.get(..19).unwrap_or(&m.model_digest)) "…" } }
                                td { (m.dtype) }
                                td.num { (m.tokens) }
                                td.num { (m.layers_replaced) }
                                td.num { (sci(m.max_logit_abs_diff)) }
                                td.num {
                                    @if m.argmax_match_fraction >= 1.0 { (percent(m.argmax_match_fraction)) }
                                    @else { span.badge.c-fails { (percent(m.argmax_match_fraction)) } }
                                }
                                td.num { (percent(m.top5_overlap)) }
                                td.num { (sci(m.mean_kl)) }
                                td.num { (m.eager_mean_top1_prob.map(|p| format!("{p:.3}")).unwrap_or_else(|| "—".into())) }
                                td.wrap { (m.adaptation.as_deref().unwrap_or("none")) }
                            }
                        }
                    }
                }
            }
            @if !r.model_notes.is_empty() {
                ul.muted { @for n in &r.model_notes { li { (n) } } }
            }
        }
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

fn opt_yes_no(b: Option<bool>) -> &'static str {
    b.map(yes_no).unwrap_or("—")
}
