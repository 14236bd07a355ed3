//! Policy-gated resolution: the fastest kernel whose measured verdict on an architecture meets
//! a policy for a shape — or, when none does, one line per candidate saying why.
//! The HTTP API, the dashboard's policy explorer and the Python client all get this answer.

use kernel_registry::report::{CaseReport, VerificationReport};
use kernel_registry::storage::{KernelRow, Store, StoreError, VerificationRow};
use kernel_registry::{Arch, DType, Op, Policy, Semantics};
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

#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub kernel: KernelRow,
    pub verification_id: i64,
    pub device: String,
    pub verified_at: String,
    pub class: String,
    pub summary: kernel_registry::report::Verdict,
    pub speed: Option<SpeedAt>,
    pub source_url: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Resolution {
    pub chosen: Option<Candidate>,
    /// Other qualifying kernels, fastest first.
    pub also_qualifying: Vec<String>,
    /// One line per kernel that was not chosen because it does not qualify.
    pub excluded: Vec<String>,
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

pub async fn resolve(store: &Store, q: &Query) -> Result<Resolution, StoreError> {
    let (kernels, _) = store
        .list_kernels(&kernel_registry::storage::KernelQuery {
            op: Some(q.op),
            semantics: Some(q.semantics),
            limit: i64::MAX,
            ..Default::default()
        })
        .await?;
    let mut qualifying: Vec<Candidate> = Vec::new();
    let mut excluded = Vec::new();
    for k in kernels {
        let label = format!("{} {}", k.name, k.version);
        if let Some(why) = shape_exclusion(&k, q) {
            excluded.push(format!("{label}: {why}"));
            continue;
        }
        let verifications = store.verifications_for_kernel(&k.digest).await?;
        let Some(v) = newest_on(&verifications, q.arch) else {
            let elsewhere: Vec<String> = verifications.iter().map(|v| v.arch.to_string()).collect();
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
        match q.policy.evaluate(&v.report, q.dtype) {
            Err(why) => excluded.push(format!("{label}: {}", why.join("; "))),
            Ok(()) => qualifying.push(candidate(k, v, q)),
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
    })
}

fn newest_on(vs: &[VerificationRow], arch: Arch) -> Option<&VerificationRow> {
    vs.iter().filter(|v| v.arch == arch).max_by_key(|v| v.id)
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

fn candidate(k: KernelRow, v: &VerificationRow, q: &Query) -> Candidate {
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
        class: summary.class.to_string(),
        summary,
        verification_id: v.id,
        device: v.device_name.clone(),
        verified_at: v.created_at.clone(),
        kernel: k,
    }
}
