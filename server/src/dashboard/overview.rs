//! `/`: the verification matrix — every op x kernel x dtype x arch with its newest verdict.

use super::overview_data::OverviewData;
use super::{class_badge, date, frac, gbps, kernel_href, layout, opt_param, roofline, ulp, Nav};
use super::{sci, verified, PageError};
use crate::error::AppError;
use crate::state::{AppState, Caller};
use axum::extract::{Query, State};
use kernel_registry::{Arch, DType, Op, Semantics};
use kernel_store::{
    GlanceCell, JobRow, KernelRow, MatrixFilter, MatrixRow, HEADLINE_COLS, HEADLINE_ROWS,
};
use maud::{html, Markup};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

struct Unverified {
    kernel: KernelRow,
    /// Newest job state (queued, running, failed) with its last error.
    job: Option<JobRow>,
    /// Verified elsewhere but not on the filtered arch.
    only_on: Vec<Arch>,
    /// Why a verified kernel still has no row (its reports hold no dtype verdict).
    note: Option<&'static str>,
}

/// Matrix rows per page, by default and at most; the awaiting list pages by the same size.
const PAGE_ROWS: i64 = 200;
const MAX_PAGE_ROWS: i64 = 1000;

pub async fn page(
    State(st): State<AppState>,
    _caller: Caller,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Markup, PageError> {
    super::known_params(&q, &["op", "dtype", "arch", "limit", "offset", "uoffset"])?;
    let op: Option<Op> = opt_param(&q, "op")?;
    let dtype: Option<DType> = opt_param(&q, "dtype")?;
    let arch: Option<Arch> = opt_param(&q, "arch")?;
    let limit: i64 = opt_param(&q, "limit")?.unwrap_or(PAGE_ROWS);
    let offset: i64 = opt_param(&q, "offset")?.unwrap_or(0);
    let uoffset: i64 = opt_param(&q, "uoffset")?.unwrap_or(0);
    if !(1..=MAX_PAGE_ROWS).contains(&limit) || offset < 0 || uoffset < 0 {
        return Err(AppError::bad_request(format!(
            "`limit` must be 1..={MAX_PAGE_ROWS}, `offset` and `uoffset` >= 0"
        ))
        .into());
    }
    let f = MatrixFilter { op, dtype, arch };
    // What the store says is kept until it changes (`crate::answers`); job states are read
    // fresh for the awaiting kernels shown.
    let generation = st.store.answer_generation().await?;
    let key = format!("{op:?}|{dtype:?}|{arch:?}|{limit}|{offset}|{uoffset}");
    let data = match st.overview.get(&key, generation) {
        Some(d) => d,
        None => {
            let d = Arc::new(OverviewData::read(&st.store, f, limit, offset, uoffset).await?);
            st.overview.insert(key, generation, d.clone());
            d
        }
    };
    let OverviewData {
        rows,
        total_rows,
        glance,
        archs,
        unverified: unverified_kernels,
        total_unverified,
        total_kernels,
    } = data.as_ref();
    let (total_rows, total_unverified) = (*total_rows, *total_unverified);
    let mut archs_seen: BTreeSet<Arch> = archs.iter().copied().collect();
    let waiting: Vec<&kernel_registry::Digest> = unverified_kernels
        .iter()
        .filter(|u| !u.no_dtype_ran)
        .map(|u| &u.kernel.digest)
        .collect();
    let mut jobs = st.store.newest_jobs(&waiting).await?;
    let mut unverified = Vec::with_capacity(unverified_kernels.len());
    for u in unverified_kernels {
        let job = if u.no_dtype_ran {
            None
        } else {
            jobs.remove(&u.kernel.digest)
        };
        unverified.push(Unverified {
            note: u
                .no_dtype_ran
                .then_some("verified, but no case of any dtype ran: see the kernel page"),
            only_on: u.only_on.clone(),
            kernel: u.kernel.clone(),
            job,
        });
    }
    if let Some(a) = arch {
        archs_seen.insert(a);
    }
    let link = |off: i64, uoff: i64| {
        let paging = [
            ("limit", limit, PAGE_ROWS),
            ("offset", off, 0),
            ("uoffset", uoff, 0),
        ];
        super::filter_href("/", op, dtype, arch, &paging)
    };

    let body = html! {
        h1 { "Verification matrix" }
        p.lead {
            "Every kernel's newest verdict per GPU architecture and dtype, measured against the eager reference layer and an f64 oracle. "
            "Speed is at the measured shape nearest " (HEADLINE_ROWS) "x" (HEADLINE_COLS) "; the roofline is this device's measured copy bandwidth."
        }
        p #field-link {
            a href=(field_href(op, dtype, arch)) { "Compare the field" }
            ": every candidate of an op side by side, CUDA kernels and Python candidates (Liger-Kernel, torch.compile, PyTorch's fused functions), with model-level agreement."
        }
        (filters("/", op, dtype, arch, &archs_seen))
        @if total_rows == 0 {
            (empty_state(*total_kernels as usize, op.is_some() || dtype.is_some() || arch.is_some()))
        } @else {
            (summary(glance))
            h2 { "All verdicts " span.muted { "(" (total_rows) " rows)" } }
            (matrix(rows))
            (pager("matrix-pages", offset, limit, rows.len(), total_rows, |o| link(o, uoffset)))
        }
        @if total_unverified > 0 {
            h2 { "Awaiting verification " span.muted { "(" (total_unverified) " kernels, never handed out)" } }
            (unverified_table(&unverified, arch))
            (pager("awaiting-pages", uoffset, limit, unverified.len(), total_unverified, |o| link(offset, o)))
        }
    };
    Ok(layout("Verification matrix", Nav::Overview, body))
}

/// The field page with the overview's filters.
fn field_href(op: Option<Op>, dtype: Option<DType>, arch: Option<Arch>) -> String {
    super::filter_href("/field", op, dtype, arch, &[])
}

/// "rows a-b of n" with links to the previous and next pages (nothing when one page holds all).
pub(super) fn pager(
    id: &str,
    offset: i64,
    limit: i64,
    shown: usize,
    total: i64,
    href: impl Fn(i64) -> String,
) -> Markup {
    html! {
        @if offset > 0 || offset + limit < total {
            p.pager id=(id) {
                (offset + 1) "–" (offset + shown as i64) " of " (total) " "
                @if offset > 0 { a rel="prev" href=(href((offset - limit).max(0))) { "previous" } " " }
                @if offset + limit < total { a rel="next" href=(href(offset + limit)) { "next" } }
            }
        }
    }
}

/// The op / dtype / arch filter form of a page at `path` (the overview, the field), with the
/// architectures to offer.
pub(super) fn filters<'a>(
    path: &str,
    op: Option<Op>,
    dtype: Option<DType>,
    arch: Option<Arch>,
    archs: impl IntoIterator<Item = &'a Arch>,
) -> Markup {
    html! {
        form.filters method="get" action=(path) {
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
            @if op.is_some() || dtype.is_some() || arch.is_some() { a href=(path) { "clear" } }
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
fn summary(cells: &[GlanceCell]) -> Markup {
    let mut by_group: BTreeMap<(Op, Semantics), BTreeMap<DType, &GlanceCell>> = BTreeMap::new();
    for c in cells {
        by_group
            .entry((c.op, c.semantics))
            .or_default()
            .insert(c.dtype, c);
    }
    let dtypes: BTreeSet<DType> = cells.iter().map(|c| c.dtype).collect();
    html! {
        h2 { "At a glance" }
        table #glance {
            thead { tr {
                th { "op (semantics)" }
                @for d in &dtypes { th { (d) ": bit-exact / verified, fastest bit-exact" } }
            } }
            tbody {
                @for ((op, sem), by_dtype) in &by_group {
                    tr {
                        td { a href={"/?op=" (op)} { (op) } " " span.muted { "(" (sem) ")" } }
                        @for d in &dtypes {
                            @match by_dtype.get(d) {
                                None => td.muted { "—" },
                                Some(c) => td {
                                    (c.bit_exact) " / " (c.kernels)
                                    @if let Some(g) = c.best_bit_exact_gbps { ", " (gbps(g)) " GB/s" }
                                },
                            }
                        }
                    }
                }
            }
        }
    }
}

fn matrix(rows: &[MatrixRow]) -> Markup {
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
                                @if r.kernel.runtime == kernel_registry::Runtime::Python { " " span.muted title="a Python candidate (docs/spec.md section 2b)" { "python" } }
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
                            td { (r.device_name) }
                            td.verified { (verified(&r.verified_at, r.imported_at.as_deref())) }
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
