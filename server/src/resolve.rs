//! Policy-gated resolution: the fastest kernel whose measured verdict on an architecture meets
//! a policy for a shape — or, when none does, one line per candidate saying why.
//! The HTTP API, the dashboard's policy explorer and the Python client all get this answer.
//!
//! Shape-exact (SPEC section 4): a kernel is handed out only at a width its newest
//! verification on the architecture covered for the dtype — for row-wise ops the row length
//! `cols` itself (a case with that `cols` ran); for elementwise ops (`silu`, `gelu`,
//! `gelu_tanh`, whose ABI takes one element count `n`, the query's `cols`) any `n` up to the
//! largest element count (rows x cols) of a case that ran. The row count never gates: an asked
//! `rows` outside the rows verified at that width is said in the answer's `coverage`. For any
//! other width the answer says which widths were verified and `/v1/resolve` queues a
//! verification of exactly that width (the suite plus the shape), at most one pending per
//! (kernel, width) and at most `max_pending` in all.

use kernel_registry::report::{CaseReport, Coverage, ShapeRequest, VerificationReport};
use kernel_registry::{Arch, DType, Op, Policy, Runtime, Semantics};
use kernel_store::{KernelRow, Store, StoreError, WidthJob};
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct Query {
    pub op: Op,
    pub semantics: Semantics,
    pub dtype: DType,
    pub arch: Arch,
    pub cols: u64,
    pub rows: Option<u64>,
    pub policy: Policy,
    /// Python candidates (SPEC 2b) are considered too (`runtime=any`); by default only CUDA
    /// kernels are, since running Python from a hub needs the client's opt-in.
    pub include_python: bool,
}

/// The speed evidence at the measured shape nearest to the asked one.
#[derive(Debug, Clone, Serialize)]
pub struct SpeedAt {
    pub rows: u64,
    pub cols: u64,
    pub gbps: f64,
    pub median_us: f64,
    pub copy_fraction: f64,
    pub speedup: f64,
}

/// What the chosen kernel's verification covered at the asked width.
#[derive(Debug, Clone, Serialize)]
pub struct CoverageAt {
    pub dtype: DType,
    /// The asked width: row length (row-wise ops) or element count (elementwise ops).
    pub cols: u64,
    /// `row_length` (a case ran at exactly this `cols`) or `elements` (elementwise: a case
    /// ran with at least this many elements).
    pub rule: &'static str,
    /// Row counts verified at this row length (row-wise ops).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows_min: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows_max: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub row_counts: Vec<u64>,
    /// Elementwise ops: the largest element count verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_elements: Option<u64>,
    /// Whether the asked `rows` is inside the verified row range (when rows was asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows_in_range: Option<bool>,
    /// Every row length verified for this dtype.
    pub verified_cols: Vec<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A verification job for an unverified width, queued (or found pending) by this resolve.
#[derive(Debug, Clone, Serialize)]
pub struct QueuedJob {
    pub kernel: String,
    pub digest: kernel_registry::Digest,
    pub job_id: i64,
    pub job_url: String,
    /// `COLS:A..B` as `kernelize verify --shape` takes it.
    pub shape: String,
    /// false: an identical job was already pending and is reused.
    pub new: bool,
}

/// Whether and how a resolve may queue verifications of unverified widths.
#[derive(Debug, Clone)]
pub struct Queueing {
    /// The most width jobs pending at once (all kernels); beyond it nothing is queued.
    pub max_pending: i64,
    /// Who asked (audit log).
    pub actor: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub kernel: KernelRow,
    pub verification_id: i64,
    pub device: String,
    pub verified_at: String,
    pub class: String,
    pub summary: kernel_registry::report::Verdict,
    pub speed: Option<SpeedAt>,
    pub coverage: CoverageAt,
    pub source_url: String,
    /// Why the verdict used is stale (empty: it is not); see `crate::stale`.
    pub stale: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Resolution {
    pub chosen: Option<Candidate>,
    /// Other qualifying kernels, fastest first.
    pub also_qualifying: Vec<String>,
    /// One line per kernel that was not chosen because it does not qualify.
    pub excluded: Vec<String>,
    /// Verifications of the asked width queued (or pending already) for kernels that would
    /// qualify but were not verified at it.
    pub queued_jobs: Vec<QueuedJob>,
    /// Set when a width was not queued because too many width jobs are pending.
    pub queue_full: Option<String>,
    /// Kernels that meet the policy but were not verified at this width (name version).
    pub unverified_width: Vec<String>,
}

/// The case of `dtype` with speed nearest (in log scale) to rows x cols.
pub fn speed_at(
    report: &VerificationReport,
    dtype: DType,
    rows: Option<u64>,
    cols: u64,
) -> Option<SpeedAt> {
    let dist = |c: &CaseReport| {
        let dc = ((c.cols.max(1) as f64) / (cols.max(1) as f64)).log2().abs();
        let dr = rows
            .map(|r| ((c.rows.max(1) as f64) / (r.max(1) as f64)).log2().abs() * 0.5)
            .unwrap_or(0.0);
        dc + dr
    };
    report
        .cases
        .iter()
        .filter(|c| c.dtype == dtype && c.speed.is_some())
        .min_by(|a, b| dist(a).total_cmp(&dist(b)))
        .map(|c| {
            let s = c.speed.as_ref().expect("filtered");
            SpeedAt {
                rows: c.rows,
                cols: c.cols,
                gbps: s.gbps,
                median_us: s.median_us,
                copy_fraction: s.copy_fraction,
                speedup: s.speedup,
            }
        })
}

/// Why `k` cannot serve the query at all (wrong dtype, shape or arch), before any verdict.
/// Decided from the stored row: no source is read for it.
fn shape_exclusion(k: &KernelRow, q: &Query) -> Option<String> {
    if !k.dtypes.contains(&q.dtype) {
        return Some(format!("has no {} entry", q.dtype));
    }
    k.constraints().not_applicable(q.cols, Some(q.arch))
}

/// Whether `cov` (one verification's coverage for the dtype) covers the asked width; `Err`
/// says which widths it does cover.
pub fn covered_at(op: Op, cov: &[Coverage], q: &Query) -> Result<CoverageAt, String> {
    let mut verified_cols: Vec<u64> = cov.iter().map(|c| c.cols).collect();
    verified_cols.dedup();
    let list = |v: &[u64]| {
        if v.len() <= 12 {
            v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
        } else {
            let mut s: Vec<String> = v[..6].iter().map(u64::to_string).collect();
            s.push(format!("... ({} widths)", v.len()));
            s.extend(v[v.len() - 3..].iter().map(u64::to_string));
            s.join(", ")
        }
    };
    if cov.is_empty() {
        return Err(format!(
            "its verification on {} ran no {} case; not verified at any width",
            q.arch, q.dtype
        ));
    }
    if op.is_rowwise() {
        let Some(c) = cov.iter().find(|c| c.cols == q.cols) else {
            return Err(format!(
                "verified at cols {} for {} on {}, not at {}",
                list(&verified_cols),
                q.dtype,
                q.arch,
                q.cols
            ));
        };
        let rows_in_range = q.rows.map(|r| (c.rows_min..=c.rows_max).contains(&r));
        let note = (rows_in_range == Some(false)).then(|| {
            format!(
                "rows {} is outside the rows verified at cols {} ({}..{}); the row length was verified, so it is handed out",
                q.rows.unwrap_or_default(),
                c.cols,
                c.rows_min,
                c.rows_max
            )
        });
        Ok(CoverageAt {
            dtype: q.dtype,
            cols: q.cols,
            rule: "row_length",
            rows_min: Some(c.rows_min),
            rows_max: Some(c.rows_max),
            row_counts: c.row_counts.clone(),
            max_elements: None,
            rows_in_range,
            verified_cols,
            note,
        })
    } else {
        let max = cov.iter().map(Coverage::max_elements).max().unwrap_or(0);
        if q.cols > max {
            return Err(format!(
                "verified up to {max} elements for {} on {} (elementwise), not at {}",
                q.dtype, q.arch, q.cols
            ));
        }
        Ok(CoverageAt {
            dtype: q.dtype,
            cols: q.cols,
            rule: "elements",
            rows_min: None,
            rows_max: None,
            row_counts: vec![],
            max_elements: Some(max),
            rows_in_range: None,
            verified_cols,
            note: Some(format!(
                "elementwise (the kernel takes n): verified at element counts up to {max}"
            )),
        })
    }
}

/// The shape to verify for an unverified width: row-wise ops at rows 1..64 (or up to the
/// asked rows), elementwise ops as one row of `cols` elements.
pub fn width_shape(op: Op, q: &Query) -> Result<ShapeRequest, String> {
    if op.is_rowwise() {
        let most = (ShapeRequest::MAX_ELEMENTS / q.cols.max(1)).min(ShapeRequest::MAX_ROWS);
        let rows_max = q.rows.unwrap_or(64).max(64).min(most);
        ShapeRequest::new(q.cols, 1, rows_max.max(1))
    } else {
        ShapeRequest::new(q.cols, 1, 1)
    }
}

/// Resolve without queueing anything (the dashboard's explorer).
pub async fn resolve(store: &Store, q: &Query) -> Result<Resolution, StoreError> {
    resolve_queueing(store, q, None).await
}

pub async fn resolve_queueing(
    store: &Store,
    q: &Query,
    queueing: Option<&Queueing>,
) -> Result<Resolution, StoreError> {
    let (kernels, _) = store
        .list_kernels(&kernel_store::KernelQuery {
            op: Some(q.op),
            semantics: Some(q.semantics),
            limit: i64::MAX,
            ..Default::default()
        })
        .await?;
    let mut qualifying: Vec<Candidate> = Vec::new();
    let mut excluded = Vec::new();
    let mut queued_jobs = Vec::new();
    let mut queue_full = None;
    let mut unverified_width = Vec::new();
    let mut staleness = crate::stale::Staleness::new(store);
    for k in kernels {
        let label = format!("{} {}", k.name, k.version);
        if k.runtime == Runtime::Python && !q.include_python {
            excluded.push(format!(
                "{label}: a Python candidate (runtime = \"python\"); ask with runtime=any to consider Python candidates (a client runs them only when its caller opts in)"
            ));
            continue;
        }
        if let Some(why) = shape_exclusion(&k, q) {
            excluded.push(format!("{label}: {why}"));
            continue;
        }
        // Only the newest verification on the arch is read in full.
        let archs = store.verification_archs(&k.digest).await?;
        let newest = archs.iter().find(|(_, a)| *a == q.arch).map(|(id, _)| *id);
        let v = match newest {
            Some(id) => store.verification(id).await?,
            None => None,
        };
        let Some(v) = v else {
            let elsewhere: Vec<String> = archs.iter().map(|(_, a)| a.to_string()).collect();
            excluded.push(if elsewhere.is_empty() {
                format!(
                    "{label}: never verified; a kernel that was never verified is never handed out"
                )
            } else {
                format!(
                    "{label}: not verified on {} (only on {})",
                    q.arch,
                    dedup(elsewhere).join(", ")
                )
            });
            continue;
        };
        if let Err(why) = q.policy.evaluate(&v.report, q.dtype) {
            excluded.push(format!("{label}: {}", why.join("; ")));
            continue;
        }
        let wanted = q.policy.confirmations as usize;
        if wanted > 0 {
            let keys = store
                .certifying_keys(&k.digest, q.arch, &v.exactness_class)
                .await?;
            if keys.len() < wanted {
                excluded.push(format!(
                    "{label}: {} worker key(s) certify class {} on {}, the policy asks for {wanted} (confirmed:{wanted}): independent workers with their own registered keys must verify it",
                    keys.len(),
                    v.exactness_class,
                    q.arch
                ));
                continue;
            }
        }
        let cov = store.coverage(v.id, Some(q.dtype)).await?;
        match covered_at(q.op, &cov, q) {
            Ok(at) => {
                let stale = staleness.of(&v).await?;
                qualifying.push(candidate(k, &v, q, at, stale))
            }
            Err(why) => {
                unverified_width.push(label.clone());
                let mut line = format!("{label}: {why}");
                let shape = width_shape(q.op, q);
                let asked_before = v.report.requested_shapes.iter().any(|s| s.cols == q.cols);
                match (queueing, shape) {
                    (_, Err(e)) => line.push_str(&format!("; cannot queue a verification of this width: {e}")),
                    (_, Ok(_)) if asked_before => line.push_str(&format!(
                        "; verification {} was asked for cols {} and did not cover it (its cases there did not run), so it is not queued again: see /v1/verifications/{}",
                        v.id, q.cols, v.id
                    )),
                    (None, Ok(_)) => line.push_str(
                        "; GET /v1/resolve with this width queues a verification of it",
                    ),
                    (Some(qu), Ok(shape)) => {
                        let outcome = store
                            .queue_width_job(&k.digest, shape, q.arch, qu.max_pending, &qu.actor)
                            .await?;
                        let (j, new) = match outcome {
                            WidthJob::Queued(j) => (j, true),
                            WidthJob::Existing(j) => (j, false),
                            WidthJob::CapReached(n) => {
                                let why = format!(
                                    "{n} verifications of unverified widths are pending (the cap); nothing more is queued until workers finish some: ask again later"
                                );
                                line.push_str(&format!("; not queued: {why}"));
                                queue_full = Some(why);
                                excluded.push(line);
                                continue;
                            }
                        };
                        let shown = j.shapes.first().copied().unwrap_or(shape);
                        line.push_str(&format!(
                            "; a verification of {shown} is {} (job {}, /v1/jobs/{})",
                            j.state,
                            j.id,
                            j.id
                        ));
                        queued_jobs.push(QueuedJob {
                            kernel: label.clone(),
                            digest: k.digest.clone(),
                            job_id: j.id,
                            job_url: format!("/v1/jobs/{}", j.id),
                            shape: shown.to_string(),
                            new,
                        });
                    }
                }
                excluded.push(line);
            }
        }
    }
    qualifying.sort_by(|a, b| {
        let g = |c: &Candidate| c.speed.as_ref().map(|s| s.gbps).unwrap_or(0.0);
        g(b).total_cmp(&g(a))
    });
    let mut it = qualifying.into_iter();
    let chosen = it.next();
    let also_qualifying = it
        .map(|c| {
            let speed = c
                .speed
                .map(|s| format!("{:.0} GB/s at {}x{}", s.gbps, s.rows, s.cols))
                .unwrap_or_else(|| "no speed measured".into());
            format!(
                "{} {}: qualifies, slower ({speed})",
                c.kernel.name, c.kernel.version
            )
        })
        .collect();
    Ok(Resolution {
        chosen,
        also_qualifying,
        excluded,
        queued_jobs,
        queue_full,
        unverified_width,
    })
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

fn candidate(
    k: KernelRow,
    v: &kernel_store::VerificationRow,
    q: &Query,
    coverage: CoverageAt,
    stale: Vec<String>,
) -> Candidate {
    let summary = v
        .report
        .summary
        .per_dtype
        .get(&q.dtype)
        .cloned()
        .unwrap_or_else(|| v.report.summary.overall.clone());
    Candidate {
        source_url: format!("/v1/sources/{}", k.digest),
        speed: speed_at(&v.report, q.dtype, q.rows, q.cols),
        coverage,
        class: summary.class.to_string(),
        summary,
        verification_id: v.id,
        device: v.device_name.clone(),
        verified_at: v.created_at.clone(),
        stale,
        kernel: k,
    }
}
