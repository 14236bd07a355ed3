//! `/`: the verification matrix — every op x kernel x dtype x arch with its newest verdict.

use super::{class_badge, date, frac, gbps, kernel_href, layout, opt_param, roofline, ulp, Nav};
use super::{sci, PageError};
use crate::app::{AppState, Caller};
use crate::resolve::{speed_at, SpeedAt};
use axum::extract::{Query, State};
use kernel_registry::report::{ExactnessClass, Verdict};
use kernel_registry::{Arch, DType, Op, Semantics};
use kernel_store::{JobRow, KernelQuery, KernelRow};
use maud::{html, Markup};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The shape whose speed the matrix shows (the nearest measured one is used).
const HEADLINE_ROWS: u64 = 4096;
const HEADLINE_COLS: u64 = 8192;

struct Row {
    kernel: KernelRow,
    dtype: DType,
    arch: Arch,
    verdict: Verdict,
    speed: Option<SpeedAt>,
    device: String,
    verified_at: String,
}

struct Unverified {
    kernel: KernelRow,
    /// Newest job state (queued, running, failed) with its last error.
    job: Option<JobRow>,
    /// Verified elsewhere but not on the filtered arch.
    only_on: Vec<Arch>,
    /// Why a verified kernel still has no row (its reports hold no dtype verdict).
    note: Option<&'static str>,
}

pub async fn page(
    State(st): State<AppState>,
    _caller: Caller,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Markup, PageError> {
    let op: Option<Op> = opt_param(&q, "op")?;
    let dtype: Option<DType> = opt_param(&q, "dtype")?;
    let arch: Option<Arch> = opt_param(&q, "arch")?;

    let (kernels, _) = st
        .store
        .list_kernels(&KernelQuery {
            op,
            dtype,
            limit: i64::MAX,
            ..Default::default()
        })
        .await?;
    let total_kernels = kernels.len();
    let mut rows = Vec::new();
    let mut unverified = Vec::new();
    let mut archs_seen = BTreeSet::new();
    for k in kernels {
        let vs = st.store.verifications_for_kernel(&k.digest).await?;
        // Newest verification per architecture (ids grow with time).
        let mut newest: BTreeMap<Arch, &kernel_store::VerificationRow> = BTreeMap::new();
        for v in &vs {
            archs_seen.insert(v.arch);
            let e = newest.entry(v.arch).or_insert(v);
            if v.id > e.id {
                *e = v;
            }
        }
        newest.retain(|a, _| arch.is_none_or(|want| *a == want));
        if newest.is_empty() {
            let job = st.store.jobs_for_kernel(&k.digest).await?.pop();
            unverified.push(Unverified {
                only_on: vs
                    .iter()
                    .map(|v| v.arch)
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
                kernel: k,
                job,
                note: None,
            });
            continue;
        }
        let before = rows.len();
        for (a, v) in newest {
            for (dt, verdict) in &v.report.summary.per_dtype {
                if dtype.is_some_and(|want| want != *dt) {
                    continue;
                }
                rows.push(Row {
                    kernel: k.clone(),
                    dtype: *dt,
                    arch: a,
                    verdict: verdict.clone(),
                    speed: speed_at(&v.report, *dt, Some(HEADLINE_ROWS), HEADLINE_COLS),
                    device: v.device_name.clone(),
                    verified_at: v.created_at.clone(),
                });
            }
        }
        if rows.len() == before && dtype.is_none() {
            unverified.push(Unverified {
                kernel: k,
                job: None,
                only_on: vec![],
                note: Some("verified, but no case of any dtype ran: see the kernel page"),
            });
        }
    }
    rows.sort_by(|a, b| {
        (
            a.kernel.op,
            a.kernel.semantics,
            a.dtype,
            a.arch,
            a.verdict.class,
        )
            .cmp(&(
                b.kernel.op,
                b.kernel.semantics,
                b.dtype,
                b.arch,
                b.verdict.class,
            ))
            .then_with(|| {
                let g = |r: &Row| r.speed.as_ref().map(|s| s.gbps).unwrap_or(0.0);
                g(b).total_cmp(&g(a))
            })
            .then_with(|| a.kernel.name.cmp(&b.kernel.name))
    });
    if let Some(a) = arch {
        archs_seen.insert(a);
    }

    let body = html! {
        h1 { "Verification matrix" }
        p.lead {
            "Every kernel's newest verdict per GPU architecture and dtype, measured against the eager reference layer and an f64 oracle. "
            "Speed is at the measured shape nearest " (HEADLINE_ROWS) "x" (HEADLINE_COLS) "; the roofline is this device's measured copy bandwidth."
        }
        (filters(op, dtype, arch, &archs_seen))
        @if rows.is_empty() {
            (empty_state(total_kernels, op.is_some() || dtype.is_some() || arch.is_some()))
        } @else {
            (summary(&rows))
            h2 { "All verdicts " span.muted { "(" (rows.len()) " rows)" } }
            (matrix(&rows))
        }
        @if !unverified.is_empty() {
            h2 { "Awaiting verification " span.muted { "(" (unverified.len()) " kernels, never handed out)" } }
            (unverified_table(&unverified, arch))
        }
    };
    Ok(layout("Verification matrix", Nav::Overview, body))
}

fn filters(
    op: Option<Op>,
    dtype: Option<DType>,
    arch: Option<Arch>,
    archs: &BTreeSet<Arch>,
) -> Markup {
    html! {
        form.filters method="get" action="/" {
            label { "op"
                select name="op" {
                    option value="" { "all" }
                    @for o in Op::ALL { option value=(o) selected[op == Some(*o)] { (o) } }
                }
            }
            label { "dtype"
                select name="dtype" {
                    option value="" { "all" }
                    @for d in DType::ALL { option value=(d) selected[dtype == Some(*d)] { (d) } }
                }
            }
            label { "arch"
                select name="arch" {
                    option value="" { "all" }
                    @for a in archs { option value=(a) selected[arch == Some(*a)] { (a) } }
                }
            }
            button type="submit" { "Filter" }
            @if op.is_some() || dtype.is_some() || arch.is_some() { a href="/" { "clear" } }
        }
    }
}

fn empty_state(total_kernels: usize, filtered: bool) -> Markup {
    html! {
        div.note id="no-verifications" {
            @if filtered {
                p { "No verification matches these filters. " a href="/" { "Show all." } }
            } @else {
                p { strong { "No verifications yet." } " " (total_kernels) " kernels are registered; none is handed out until a GPU worker has measured it." }
            }
            p { "To verify the queued kernels, run a worker on a host with an NVIDIA GPU:" }
            pre { code { "kernelize token create --scope worker --name gpu-1      # on the hub, prints a token\nkernelize worker --server http://HUB:8080 --token TOKEN     # on the GPU host" } }
            p { "or, on a GPU machine, serve and verify in one process: " code { "kernelize serve --worker" } }
        }
    }
}

/// Ops x dtypes at a glance: how many kernels are verified, how many bit-exact, the best GB/s.
fn summary(rows: &[Row]) -> Markup {
    #[derive(Default)]
    struct Cell {
        kernels: BTreeSet<String>,
        exact: BTreeSet<String>,
        best_exact_gbps: Option<f64>,
    }
    let mut cells: BTreeMap<(Op, Semantics), BTreeMap<DType, Cell>> = BTreeMap::new();
    for r in rows {
        let c = cells
            .entry((r.kernel.op, r.kernel.semantics))
            .or_default()
            .entry(r.dtype)
            .or_default();
        let label = format!("{} {}", r.kernel.name, r.kernel.version);
        c.kernels.insert(label.clone());
        if r.verdict.class == ExactnessClass::BitExact {
            c.exact.insert(label);
            if let Some(s) = &r.speed {
                c.best_exact_gbps = Some(c.best_exact_gbps.unwrap_or(0.0).max(s.gbps));
            }
        }
    }
    let dtypes: BTreeSet<DType> = rows.iter().map(|r| r.dtype).collect();
    html! {
        h2 { "At a glance" }
        table #glance {
            thead { tr {
                th { "op (semantics)" }
                @for d in &dtypes { th { (d) ": bit-exact / verified, fastest bit-exact" } }
            } }
            tbody {
                @for ((op, sem), by_dtype) in &cells {
                    tr {
                        td { a href={"/?op=" (op)} { (op) } " " span.muted { "(" (sem) ")" } }
                        @for d in &dtypes {
                            @match by_dtype.get(d) {
                                None => td.muted { "—" },
                                Some(c) => td {
                                    (c.exact.len()) " / " (c.kernels.len())
                                    @if let Some(g) = c.best_exact_gbps { ", " (gbps(g)) " GB/s" }
                                },
                            }
                        }
                    }
                }
            }
        }
    }
}

fn matrix(rows: &[Row]) -> Markup {
    // A group header row before the first row of each op and semantics.
    let starts: Vec<bool> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            i == 0
                || (rows[i - 1].kernel.op, rows[i - 1].kernel.semantics)
                    != (r.kernel.op, r.kernel.semantics)
        })
        .collect();
    html! {
        div.scroll {
            table #matrix {
                thead { tr {
                    th { "kernel" } th { "dtype" } th { "arch" } th { "exactness" }
                    th.num title="largest fraction of elements differing from the reference in any case" { "mismatch" }
                    th.num { "max ulp" } th.num { "max abs diff" }
                    th.num { "GB/s" } th { "of copy roofline" } th.num { "speedup vs ref" }
                    th { "shape" } th { "device" } th { "verified" }
                } }
                tbody {
                    @for (r, start) in rows.iter().zip(&starts) {
                        @if *start {
                            tr.group { td colspan="13" { (r.kernel.op) " · " (r.kernel.semantics) } }
                        }
                        tr {
                            td {
                                a href=(kernel_href(&r.kernel.name, &r.kernel.version)) title=(r.kernel.description) { (r.kernel.name) " " (r.kernel.version) }
                                @if r.kernel.runtime == kernel_registry::Runtime::Python { " " span.muted title="a Python candidate (SPEC 2b)" { "python" } }
                            }
                            td { (r.dtype) }
                            td { (r.arch) }
                            td { (class_badge(r.verdict.class)) }
                            td.num { (frac(r.verdict.max_mismatch_fraction)) }
                            td.num { (ulp(r.verdict.max_ulp)) }
                            td.num { (sci(r.verdict.max_abs_diff)) }
                            @match &r.speed {
                                Some(s) => {
                                    td.num { (gbps(s.gbps)) }
                                    td { (roofline(s.copy_fraction)) }
                                    td.num { (format!("{:.2}x", s.speedup)) }
                                    td.muted { (s.rows) "x" (s.cols) }
                                },
                                None => { td.num.muted { "—" } td.muted { "not measured" } td.num.muted { "—" } td {} },
                            }
                            td { (r.device) }
                            td { (date(&r.verified_at)) }
                        }
                    }
                }
            }
        }
    }
}

fn unverified_table(items: &[Unverified], arch: Option<Arch>) -> Markup {
    html! {
        div.scroll {
            table #unverified {
                thead { tr { th { "kernel" } th { "op" } th { "dtypes" } th { "status" } th { "registered" } } }
                tbody {
                    @for u in items {
                        tr {
                            td { a href=(kernel_href(&u.kernel.name, &u.kernel.version)) { (u.kernel.name) " " (u.kernel.version) } }
                            td { (u.kernel.op) " (" (u.kernel.semantics) ")" }
                            td { (u.kernel.dtypes.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", ")) }
                            td {
                                @if let Some(n) = u.note {
                                    (n)
                                } @else if let (Some(a), false) = (arch, u.only_on.is_empty()) {
                                    "not verified on " (a) " (only on " (u.only_on.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ")) ")"
                                } @else {
                                    @match &u.job {
                                        Some(j) => {
                                            "job " (j.state)
                                            @if let Some(e) = &j.last_error { span.muted { ": " (e) } }
                                        },
                                        None => "no job",
                                    }
                                }
                            }
                            td { (date(&u.kernel.created_at)) }
                        }
                    }
                }
            }
        }
    }
}
