//! The hub's checks of a posted report: every figure a verifier derives is derived again from
//! the figures it was derived from, and every value a GPU run cannot produce is refused, with
//! the JSON path of the field that is wrong. The hub then stores the summary it derives itself
//! (`rederive`), never the one posted.
//!
//! What this cannot catch: a report whose raw measurements (times, mismatch counts) are made up
//! but consistent. Those are bounded here (by the device's roofline, the case shapes, the
//! suite's case list) and bound to the worker token that claimed the job; signed certificates
//! (docs/spec.md section 6) are what would bind them to a GPU.

use super::{
    Accuracy, CaseReport, CaseStatus, Exactness, ShapeRequest, Speed, Summary, Verdict,
    VerificationReport, REPORT_SCHEMA_VERSION, ROOFLINE_MARGIN, ULP_BUCKETS, ULP_INFINITE,
};
use crate::device::{self, PEAK_MARGIN};
use crate::domain::{DType, Digest};
use crate::manifest::{Manifest, Runtime};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Suite versions a verifier has produced, oldest first; the last is the verifier's current
/// `SUITE_VERSION` (a verifier test checks it).
pub const KNOWN_SUITES: &[&str] = &["2026.1", "2026.2", "2026.3"];

/// The most problems one refusal lists.
pub const MAX_PROBLEMS: usize = 20;

/// A case the suite draws for a run, as the hub recomputes it (`verifier::cases::suite`).
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedCase {
    pub id: String,
    pub dtype: DType,
    pub rows: u64,
    pub cols: u64,
    pub distribution: String,
    /// The `eps` the case launches with (norm ops).
    pub eps: Option<f32>,
}

/// What a report for one job must fit.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The job's kernel.
    pub digest: &'a Digest,
    pub manifest: &'a Manifest,
    /// The shapes the job asked for besides the suite.
    pub shapes: &'a [ShapeRequest],
    /// Suite versions the hub accepts.
    pub suites: &'a [&'a str],
    /// The suite's cases for this report's seed, dtypes, quick flag and shapes, when the hub can
    /// compute them (it runs the same suite version).
    pub suite_cases: Option<&'a [PlannedCase]>,
}

/// One reason a report is refused: the JSON path of the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{field}`: {kind}")]
pub struct ReportError {
    /// JSON path into the report, e.g. `cases[3].exactness.mismatches`.
    pub field: String,
    pub kind: ReportErrorKind,
}

/// What is wrong with a field. Each variant's message says what a GPU run produces instead.
#[derive(Debug, Clone, PartialEq)]
pub enum ReportErrorKind {
    SchemaVersion {
        got: u32,
    },
    /// A backward case's gradients (docs/spec.md section 2c) missing, unknown, or not adding up
    /// to the case's combined exactness; or gradients on a forward op's case.
    Gradients {
        id: String,
        why: String,
    },
    /// A report whose execution record does not fit the kernel's runtime (docs/spec.md section 2b): a Python
    /// candidate's names its Python environment and compiles nothing; a CUDA kernel's has no
    /// Python environment.
    Runtime {
        runtime: Runtime,
        why: &'static str,
    },
    /// The report names another kernel than the job's.
    KernelMismatch {
        got: String,
        want: String,
    },
    UnknownSuite {
        got: String,
        accepted: Vec<String>,
    },
    VerifierVersion {
        got: String,
    },
    /// A known device name with another architecture.
    DeviceArch {
        model: &'static str,
        model_arch: String,
        got: String,
    },
    /// A copy bandwidth above what the device (or any known device of its arch) can move.
    CopyAbovePeak {
        got_gbps: f64,
        peak_gbps: f64,
        of: String,
    },
    /// NaN, infinite, negative or zero where a measurement cannot be.
    BadNumber {
        value: f64,
        must_be: &'static str,
    },
    /// A count that must be positive is 0.
    Zero,
    NoCases,
    DuplicateCase {
        id: String,
    },
    /// The case id does not describe the case's own dtype, shape or distribution.
    CaseId {
        id: String,
        why: String,
    },
    DTypeNotInKernel {
        dtype: DType,
        kernel_has: Vec<DType>,
    },
    /// A case marked ran (or not applicable) against the kernel's declared constraints.
    Applicability {
        id: String,
        why: String,
    },
    MissingExactness {
        id: String,
    },
    MeasuredButNotRun {
        id: String,
    },
    ElementCount {
        id: String,
        got: u64,
        want: u64,
        how: String,
    },
    MismatchesAboveElements {
        id: String,
        mismatches: u64,
        elements: u64,
    },
    /// A derived figure that is not what its inputs give.
    Derived {
        id: String,
        got: f64,
        want: f64,
        formula: &'static str,
    },
    BytesMoved {
        id: String,
        got: u64,
        want: u64,
    },
    /// The exactness figures contradict one another.
    Inconsistent {
        id: String,
        why: String,
    },
    AboveRoofline {
        id: String,
        gbps: f64,
        roofline_gbps: f64,
    },
    RequestedShapes {
        got: Vec<String>,
        want: Vec<String>,
    },
    NotInSuite {
        id: String,
        suite: String,
        seed: u64,
    },
    MissingSuiteCases {
        missing: Vec<String>,
        total: usize,
        suite: String,
        seed: u64,
    },
    SuiteEps {
        id: String,
        got: Option<f32>,
        want: Option<f32>,
    },
    CompiledArch {
        option: String,
        arch: String,
    },
    BadHash {
        got: String,
    },
    ModelFigure {
        why: String,
    },
    /// The capability audit does not fit the kernel (docs/spec.md section 3b).
    Capabilities {
        why: String,
    },
}

impl fmt::Display for ReportErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ReportErrorKind::*;
        match self {
            Gradients { id, why } => write!(
                f,
                "case `{id}`: {why}; a verifier reports a backward op's case with each gradient's exactness (`gradients`) and their combination (`exactness`), a forward op's without `gradients`"
            ),
            Runtime { runtime, why } => write!(
                f,
                "the kernel's runtime is {runtime}: {why}; post the report `kernelize verify` or `kernelize worker` wrote"
            ),
            SchemaVersion { got } => write!(
                f,
                "report schema_version {got} is not {REPORT_SCHEMA_VERSION}; upgrade the worker's kernelize to this hub's version"
            ),
            KernelMismatch { got, want } => write!(
                f,
                "the report is for `{got}` but the job verifies `{want}`; post the report of the job's kernel (the claim's `kernel`)"
            ),
            UnknownSuite { got, accepted } => write!(
                f,
                "suite `{got}` is not accepted by this hub (it accepts {}; operators lower the bound with `kernelize serve --min-suite-version`, down to {}); upgrade the worker's kernelize",
                accepted.join(", "),
                KNOWN_SUITES[0]
            ),
            VerifierVersion { got } => write!(
                f,
                "verifier_version `{got}` is not a version (MAJOR.MINOR.PATCH) of kernelize's verifier"
            ),
            DeviceArch { model, model_arch, got } => write!(
                f,
                "an {model} is {model_arch}, not {got}: the device name and its architecture come from the same driver query, so they cannot disagree"
            ),
            CopyAbovePeak { got_gbps, peak_gbps, of } => write!(
                f,
                "a copy bandwidth of {got_gbps:.0} GB/s is above the {peak_gbps:.0} GB/s peak DRAM bandwidth of {of} (data sheet, margin {PEAK_MARGIN}); no copy moves more than the memory can"
            ),
            BadNumber { value, must_be } => write!(f, "{value} is not a measurement: it must be {must_be}"),
            Zero => f.write_str("must be at least 1"),
            NoCases => f.write_str("a report without cases is no verification; a verifier reports every case of its suite"),
            DuplicateCase { id } => write!(f, "case `{id}` appears twice; a verifier runs each case once"),
            CaseId { id, why } => write!(f, "case id `{id}` {why}; a verifier names each case DTYPE/ROWSxCOLS/DISTRIBUTION from the case itself"),
            DTypeNotInKernel { dtype, kernel_has } => write!(
                f,
                "the kernel has no {dtype} entry (it has {}), so no {dtype} case can have run",
                kernel_has.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", ")
            ),
            Applicability { id, why } => write!(f, "case `{id}`: {why}"),
            MissingExactness { id } => write!(
                f,
                "case `{id}` ran but carries no exactness; a case that ran is compared with the reference"
            ),
            MeasuredButNotRun { id } => write!(
                f,
                "case `{id}` did not run but carries measurements"
            ),
            ElementCount { id, got, want, how } => write!(
                f,
                "case `{id}` compared {got} elements, but its shape has {want} ({how})"
            ),
            MismatchesAboveElements { id, mismatches, elements } => write!(
                f,
                "case `{id}` has {mismatches} mismatched elements of {elements}; no more elements can differ than were compared"
            ),
            Derived { id, got, want, formula } => write!(
                f,
                "case `{id}`: {got} is not {formula} = {want}"
            ),
            BytesMoved { id, got, want } => write!(
                f,
                "case `{id}`: {got} bytes moved is not what the op must move at this shape and dtype ({want}: inputs read once, outputs written once)"
            ),
            Inconsistent { id, why } => write!(f, "case `{id}`: {why}"),
            AboveRoofline { id, gbps, roofline_gbps } => write!(
                f,
                "case `{id}`: {gbps:.0} GB/s is above the roofline of the device the report names ({roofline_gbps:.0} GB/s: its measured copy bandwidth x {ROOFLINE_MARGIN}) and the case does not record it as an integrity failure"
            ),
            RequestedShapes { got, want } => write!(
                f,
                "the report ran the shapes [{}] besides the suite, but the job asked for [{}]; verify the job's `shapes` (kernelize worker does)",
                got.join(", "),
                want.join(", ")
            ),
            NotInSuite { id, suite, seed } => write!(
                f,
                "case `{id}` is not a case of suite {suite} for seed {seed} (nor of the job's shapes)"
            ),
            MissingSuiteCases { missing, total, suite, seed } => write!(
                f,
                "{} of the {total} cases suite {suite} draws for seed {seed} are missing (first: {}); a verifier reports every case, run or not",
                missing.len(),
                missing.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
            ),
            SuiteEps { id, got, want } => write!(
                f,
                "case `{id}` ran with eps {got:?}, but the suite draws {want:?} for it"
            ),
            CompiledArch { option, arch } => write!(
                f,
                "compiled with `{option}` on a {arch} device; the verifier compiles for the device it runs on"
            ),
            BadHash { got } => write!(f, "`{got}` is not a SHA-256 (64 lowercase hex digits)"),
            ModelFigure { why } => f.write_str(why),
            Capabilities { why } => write!(
                f,
                "{why}; post the capability audit `kernelize verify` or `kernelize worker` wrote"
            ),
        }
    }
}

fn err(field: impl Into<String>, kind: ReportErrorKind) -> ReportError {
    ReportError {
        field: field.into(),
        kind,
    }
}

/// Two figures equal up to the rounding of the formula and of JSON.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()) + 1e-12
}

/// The GB/s of `bytes` moved in `median_us` (the verifier's formula).
pub fn gbps_of(bytes: u64, median_us: f64) -> f64 {
    bytes as f64 / (median_us * 1e-6) / 1e9
}

fn is_large_index(c: &CaseReport) -> bool {
    c.id.ends_with("/large_index")
}

/// Check a posted report against the job it answers. Every problem found, up to
/// `MAX_PROBLEMS`; an empty list means the report fits.
pub fn validate(report: &VerificationReport, want: &Expected<'_>) -> Result<(), Vec<ReportError>> {
    let mut out = Vec::new();
    check_header(report, want, &mut out);
    check_device(report, &mut out);
    if report.cases.is_empty() {
        out.push(err("cases", ReportErrorKind::NoCases));
    }
    let mut seen = BTreeSet::new();
    for (i, c) in report.cases.iter().enumerate() {
        if !seen.insert(c.id.as_str()) {
            out.push(err(
                format!("cases[{i}].id"),
                ReportErrorKind::DuplicateCase { id: c.id.clone() },
            ));
        }
        check_case(report, want.manifest, i, c, &mut out);
        if out.len() >= MAX_PROBLEMS {
            break;
        }
    }
    if let Some(planned) = want.suite_cases {
        check_suite(report, planned, &mut out);
    }
    check_compiled(report, want.manifest, &mut out);
    check_runtime(report, want.manifest, &mut out);
    check_capabilities(report, want.manifest, &mut out);
    check_models(report, want.manifest, &mut out);
    out.truncate(MAX_PROBLEMS);
    if out.is_empty() {
        Ok(())
    } else {
        Err(out)
    }
}

fn check_header(r: &VerificationReport, want: &Expected<'_>, out: &mut Vec<ReportError>) {
    use ReportErrorKind::*;
    if r.schema_version != REPORT_SCHEMA_VERSION {
        out.push(err(
            "schema_version",
            SchemaVersion {
                got: r.schema_version,
            },
        ));
    }
    let m = want.manifest;
    let mut kernel = |field: &str, got: String, want: String| {
        if got != want {
            out.push(err(format!("kernel.{field}"), KernelMismatch { got, want }));
        }
    };
    kernel(
        "digest",
        r.kernel.digest.to_string(),
        want.digest.to_string(),
    );
    kernel("name", r.kernel.name.clone(), m.name.clone());
    kernel("version", r.kernel.version.clone(), m.version.to_string());
    kernel("op", r.kernel.op.to_string(), m.op.to_string());
    kernel(
        "semantics",
        r.kernel.semantics.to_string(),
        m.semantics.to_string(),
    );
    if !want.suites.contains(&r.suite_version.as_str()) {
        out.push(err(
            "suite_version",
            UnknownSuite {
                got: r.suite_version.clone(),
                accepted: want.suites.iter().map(|s| s.to_string()).collect(),
            },
        ));
    }
    if semver::Version::parse(&r.verifier_version).is_err() {
        out.push(err(
            "verifier_version",
            VerifierVersion {
                got: r.verifier_version.clone(),
            },
        ));
    }
    if !(r.duration_s.is_finite() && r.duration_s >= 0.0) {
        out.push(err(
            "duration_s",
            BadNumber {
                value: r.duration_s,
                must_be: "a finite number of seconds, at least 0",
            },
        ));
    }
    let shapes = |s: &[ShapeRequest]| -> Vec<String> {
        let set: BTreeSet<ShapeRequest> = s.iter().copied().collect();
        set.iter().map(|s| s.to_string()).collect()
    };
    let (got, wanted) = (shapes(&r.requested_shapes), shapes(want.shapes));
    if got != wanted {
        out.push(err(
            "requested_shapes",
            RequestedShapes { got, want: wanted },
        ));
    }
}

fn check_device(r: &VerificationReport, out: &mut Vec<ReportError>) {
    use ReportErrorKind::*;
    let d = &r.device;
    if d.sm_count == 0 {
        out.push(err("device.sm_count", Zero));
    }
    if !(d.copy_gbps.is_finite() && d.copy_gbps > 0.0) {
        out.push(err(
            "device.copy_gbps",
            BadNumber {
                value: d.copy_gbps,
                must_be: "a finite bandwidth above 0 GB/s",
            },
        ));
        return;
    }
    let (peak, of) = match device::lookup(&d.name) {
        Some(k) => {
            if k.arch != d.arch {
                out.push(err(
                    "device.arch",
                    DeviceArch {
                        model: k.model,
                        model_arch: k.arch.to_string(),
                        got: d.arch.to_string(),
                    },
                ));
            }
            (Some(k.peak_dram_gbps), format!("an {}", k.model))
        }
        None => (
            device::arch_ceiling_gbps(d.arch),
            format!(
                "any known {} device (`{}` is not in the hub's device table)",
                d.arch, d.name
            ),
        ),
    };
    if let Some(peak) = peak {
        if d.copy_gbps > peak * PEAK_MARGIN {
            out.push(err(
                "device.copy_gbps",
                CopyAbovePeak {
                    got_gbps: d.copy_gbps,
                    peak_gbps: peak,
                    of,
                },
            ));
        }
    }
}

/// The parts of a case id: dtype, rows, cols, distribution (or `large_index`).
fn parse_id(id: &str) -> Option<(&str, u64, u64, &str)> {
    let mut parts = id.splitn(3, '/');
    let (dt, shape, dist) = (parts.next()?, parts.next()?, parts.next()?);
    let (rows, cols) = shape.split_once('x')?;
    Some((dt, rows.parse().ok()?, cols.parse().ok()?, dist))
}

fn check_case(
    r: &VerificationReport,
    m: &Manifest,
    i: usize,
    c: &CaseReport,
    out: &mut Vec<ReportError>,
) {
    use ReportErrorKind::*;
    let at = |f: &str| format!("cases[{i}].{f}");
    let id = c.id.clone();
    match parse_id(&c.id) {
        None => out.push(err(
            at("id"),
            CaseId {
                id: id.clone(),
                why: "is not DTYPE/ROWSxCOLS/DISTRIBUTION".into(),
            },
        )),
        Some((dt, rows, cols, dist)) => {
            let dist_ok =
                dist == c.distribution || (dist == "large_index" && c.distribution == "normal");
            if dt != c.dtype.as_str() || rows != c.rows || cols != c.cols || !dist_ok {
                out.push(err(
                    at("id"),
                    CaseId {
                        id: id.clone(),
                        why: format!(
                            "does not name the case's own fields (dtype {}, rows {}, cols {}, distribution {})",
                            c.dtype, c.rows, c.cols, c.distribution
                        ),
                    },
                ));
            }
        }
    }
    let kernel_has = m.dtypes();
    if !kernel_has.contains(&c.dtype) {
        out.push(err(
            at("dtype"),
            DTypeNotInKernel {
                dtype: c.dtype,
                kernel_has,
            },
        ));
        return;
    }
    if c.rows == 0 {
        out.push(err(at("rows"), Zero));
    }
    if c.cols == 0 {
        out.push(err(at("cols"), Zero));
    }
    if c.rows == 0 || c.cols == 0 {
        return;
    }
    if let Some(eps) = c.eps {
        if !(eps.is_finite() && eps > 0.0) {
            out.push(err(
                at("eps"),
                BadNumber {
                    value: eps as f64,
                    must_be: "a finite eps above 0",
                },
            ));
        }
    }
    let size = if m.op.is_rowwise() {
        c.cols
    } else {
        c.rows.saturating_mul(c.cols)
    };
    let excluded = m.not_applicable(size, Some(r.device.arch));
    match c.status {
        CaseStatus::Ran => {
            if let Some(why) = excluded {
                out.push(err(
                    at("status"),
                    Applicability {
                        id: id.clone(),
                        why: format!(
                            "marked ran, but the kernel's constraints exclude it ({why}); a verifier never launches it and marks it not_applicable"
                        ),
                    },
                ));
            }
        }
        CaseStatus::NotApplicable => {
            // The large-index case runs where device memory allows (docs/spec.md section 3); a verifier
            // marks it not applicable on a smaller device.
            if excluded.is_none() && !is_large_index(c) {
                out.push(err(
                    at("status"),
                    Applicability {
                        id: id.clone(),
                        why: "marked not_applicable, but the kernel's declared constraints (cols, archs) include it; only a case they exclude is not applicable".into(),
                    },
                ));
            }
        }
        CaseStatus::Error => {}
    }
    if c.status != CaseStatus::Ran {
        if c.exactness.is_some() || c.speed.is_some() {
            out.push(err(at("status"), MeasuredButNotRun { id }));
        }
        return;
    }
    match &c.exactness {
        None => out.push(err(at("exactness"), MissingExactness { id: id.clone() })),
        Some(e) => check_exactness(m, c, None, e, &at, out),
    }
    check_gradients(m, c, &at, out);
    if let Some(a) = &c.accuracy {
        check_accuracy(a, &at, out);
    }
    if let Some(s) = &c.speed {
        check_speed(r, m, c, s, &at, out);
    }
}

/// A backward op's case: every gradient of the op ([`Op::gradients`]) reported, each checked
/// like a case's exactness on its own elements, and the case's `exactness` their combination.
fn check_gradients(
    m: &Manifest,
    c: &CaseReport,
    at: &dyn Fn(&str) -> String,
    out: &mut Vec<ReportError>,
) {
    let wrong = |why: String| {
        err(
            at("gradients"),
            ReportErrorKind::Gradients {
                id: c.id.clone(),
                why,
            },
        )
    };
    let grads = m.op.gradients();
    if grads.is_empty() {
        if !c.gradients.is_empty() {
            out.push(wrong(format!(
                "{} has no gradients, yet the case reports some",
                m.op
            )));
        }
        return;
    }
    let names: Vec<&str> = grads.iter().map(|g| g.name).collect();
    let got: Vec<&str> = c.gradients.keys().map(String::as_str).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    if got != sorted {
        out.push(wrong(format!(
            "the gradients reported are [{}], {} has [{}]",
            got.join(", "),
            m.op,
            names.join(", ")
        )));
        return;
    }
    for g in grads {
        let r = &c.gradients[g.name];
        let gat = |f: &str| at(&format!("gradients.{}.{f}", g.name));
        check_exactness(m, c, Some(g), &r.exactness, &gat, out);
        if let Some(a) = &r.accuracy {
            check_accuracy(a, &gat, out);
        }
    }
    // The combination: every gradient's elements, the worst of each figure.
    if let Some(e) = &c.exactness {
        let parts: Vec<&Exactness> = grads
            .iter()
            .map(|g| &c.gradients[g.name].exactness)
            .collect();
        let sum = |f: fn(&Exactness) -> u64| parts.iter().fold(0u64, |a, p| a.saturating_add(f(p)));
        let mismatches = sum(|p| p.mismatches);
        let max_ulp = parts.iter().map(|p| p.max_ulp).max().unwrap_or(0);
        let parity = parts.iter().all(|p| p.nonfinite_parity);
        let tolerance = parts.iter().all(|p| p.within_tolerance);
        if e.mismatches != mismatches
            || e.max_ulp != max_ulp
            || e.nonfinite_parity != parity
            || e.within_tolerance != tolerance
        {
            out.push(wrong(format!(
                "the combined exactness ({} mismatches, max {} ulp, parity {}, within tolerance {}) is not its gradients' ({mismatches}, {max_ulp}, {parity}, {tolerance})",
                e.mismatches, e.max_ulp, e.nonfinite_parity, e.within_tolerance
            )));
        }
    }
}

fn check_accuracy(a: &Accuracy, at: &dyn Fn(&str) -> String, out: &mut Vec<ReportError>) {
    for (f, v) in [
        ("candidate_max_abs", a.candidate_max_abs),
        ("candidate_rms", a.candidate_rms),
        ("reference_max_abs", a.reference_max_abs),
        ("reference_rms", a.reference_rms),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            out.push(err(
                at(&format!("accuracy.{f}")),
                ReportErrorKind::BadNumber {
                    value: v,
                    must_be: "a finite error, at least 0",
                },
            ));
        }
    }
}

/// A case's exactness (`gradient`: one gradient's of a backward case) against the elements it
/// compared and the figures derived from them.
fn check_exactness(
    m: &Manifest,
    c: &CaseReport,
    gradient: Option<&crate::Gradient>,
    e: &Exactness,
    at: &dyn Fn(&str) -> String,
    out: &mut Vec<ReportError>,
) {
    use ReportErrorKind::*;
    let id = c.id.clone();
    let per_output = c.rows.saturating_mul(c.cols);
    let outputs = m.op.outputs();
    // The large-index case is compared on the GPU and counts `out`'s elements; its mismatch
    // count covers every output.
    let large = is_large_index(c);
    let grads = m.op.gradients();
    let (want, how) = if let Some(g) = gradient {
        (
            g.elements(c.rows, c.cols),
            if g.one_row {
                "cols (one row)"
            } else {
                "rows x cols"
            }
            .to_string(),
        )
    } else if !grads.is_empty() {
        (
            grads
                .iter()
                .fold(0u64, |a, g| a.saturating_add(g.elements(c.rows, c.cols))),
            format!("the elements of every gradient of {}", m.op),
        )
    } else if large {
        (per_output, "rows x cols, compared on the GPU".to_string())
    } else if outputs > 1 {
        (
            per_output.saturating_mul(outputs),
            format!("rows x cols x {outputs} outputs of {}", m.op),
        )
    } else {
        (per_output, "rows x cols".to_string())
    };
    if e.elements != want {
        out.push(err(
            at("exactness.elements"),
            ElementCount {
                id: id.clone(),
                got: e.elements,
                want,
                how,
            },
        ));
        return;
    }
    let compared = if large {
        per_output.saturating_mul(outputs)
    } else {
        e.elements
    };
    if e.mismatches > compared {
        out.push(err(
            at("exactness.mismatches"),
            MismatchesAboveElements {
                id: id.clone(),
                mismatches: e.mismatches,
                elements: compared,
            },
        ));
        return;
    }
    let fraction = if e.elements == 0 {
        0.0
    } else {
        e.mismatches as f64 / e.elements as f64
    };
    if !close(e.mismatch_fraction, fraction) {
        out.push(err(
            at("exactness.mismatch_fraction"),
            Derived {
                id: id.clone(),
                got: e.mismatch_fraction,
                want: fraction,
                formula: "mismatches / elements",
            },
        ));
    }
    for (f, v) in [
        ("max_abs_diff", e.max_abs_diff),
        ("max_rel_diff", e.max_rel_diff),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            out.push(err(
                at(&format!("exactness.{f}")),
                BadNumber {
                    value: v,
                    must_be: "a finite difference, at least 0 (non-finite values are compared by nonfinite_parity)",
                },
            ));
        }
    }
    let inconsistent = |f: &str, why: String| {
        err(
            at(&format!("exactness.{f}")),
            Inconsistent {
                id: id.clone(),
                why,
            },
        )
    };
    if e.mismatches == 0 {
        let differs = e.max_ulp != 0
            || e.max_abs_diff != 0.0
            || e.max_rel_diff != 0.0
            || !e.nonfinite_parity
            || !e.within_tolerance;
        if differs {
            out.push(inconsistent(
                "mismatches",
                "no element differs, yet a difference is reported (max_ulp, max_abs_diff, max_rel_diff, nonfinite_parity or within_tolerance)".into(),
            ));
        }
    }
    if e.max_ulp == ULP_INFINITE && e.nonfinite_parity {
        out.push(inconsistent(
            "nonfinite_parity",
            "an infinite ulp distance (NaN against a number) breaks NaN/Inf parity".into(),
        ));
    }
    let buckets = ULP_BUCKETS.len() + 1;
    if e.ulp_histogram.len() != buckets {
        out.push(inconsistent(
            "ulp_histogram",
            format!(
                "{} buckets, not {buckets} (bounds {ULP_BUCKETS:?} and the rest)",
                e.ulp_histogram.len()
            ),
        ));
        return;
    }
    let total = e
        .ulp_histogram
        .iter()
        .fold(0u64, |a, &b| a.saturating_add(b));
    // The large case's histogram covers a window around its first mismatch when any differs.
    let total_ok = if large && e.mismatches > 0 {
        total <= e.elements
    } else {
        total == e.elements
    };
    if !total_ok {
        out.push(inconsistent(
            "ulp_histogram",
            format!(
                "the buckets hold {total} elements, not the {} compared",
                e.elements
            ),
        ));
    }
    let differing = e.ulp_histogram[1..]
        .iter()
        .fold(0u64, |a, &b| a.saturating_add(b));
    if differing > e.mismatches {
        out.push(inconsistent(
            "ulp_histogram",
            format!(
                "{differing} elements are 1 ulp or more apart, but only {} differ",
                e.mismatches
            ),
        ));
    }
    let top = super::ulp_bucket(e.max_ulp);
    if let Some(far) = e.ulp_histogram.iter().rposition(|&n| n > 0) {
        if far > top {
            out.push(inconsistent(
                "max_ulp",
                format!(
                    "an element lies in ulp bucket {far}, farther than max_ulp {} (bucket {top})",
                    e.max_ulp
                ),
            ));
        } else if e.max_ulp > 0 && far < top {
            out.push(inconsistent(
                "max_ulp",
                format!(
                    "max_ulp {} falls in bucket {top}, but no element is counted there",
                    e.max_ulp
                ),
            ));
        }
    }
}

fn check_speed(
    r: &VerificationReport,
    m: &Manifest,
    c: &CaseReport,
    s: &Speed,
    at: &dyn Fn(&str) -> String,
    out: &mut Vec<ReportError>,
) {
    use ReportErrorKind::*;
    let id = c.id.clone();
    let mut ok = true;
    for (f, v) in [
        ("median_us", s.median_us),
        ("reference_median_us", s.reference_median_us),
    ] {
        if !(v.is_finite() && v > 0.0) {
            ok = false;
            out.push(err(
                at(&format!("speed.{f}")),
                BadNumber {
                    value: v,
                    must_be: "a finite time above 0 us",
                },
            ));
        }
    }
    let bytes = m.op.bytes_moved(c.dtype, c.rows, c.cols);
    if s.bytes_moved != bytes {
        ok = false;
        out.push(err(
            at("speed.bytes_moved"),
            BytesMoved {
                id: id.clone(),
                got: s.bytes_moved,
                want: bytes,
            },
        ));
    }
    if !(ok && r.device.copy_gbps.is_finite() && r.device.copy_gbps > 0.0) {
        return;
    }
    let gbps = gbps_of(bytes, s.median_us);
    for (f, got, want, formula) in [
        ("gbps", s.gbps, gbps, "bytes_moved / median_us / 1000"),
        (
            "copy_fraction",
            s.copy_fraction,
            gbps / r.device.copy_gbps,
            "gbps / device.copy_gbps",
        ),
        (
            "speedup",
            s.speedup,
            s.reference_median_us / s.median_us,
            "reference_median_us / median_us",
        ),
    ] {
        if !close(got, want) {
            out.push(err(
                at(&format!("speed.{f}")),
                Derived {
                    id: id.clone(),
                    got,
                    want,
                    formula,
                },
            ));
        }
    }
    let roofline = r.device.copy_gbps * ROOFLINE_MARGIN;
    let acknowledged = c.integrity_failures.iter().any(|f| f.contains("roofline"));
    if gbps > roofline && !acknowledged {
        out.push(err(
            at("speed.gbps"),
            AboveRoofline {
                id,
                gbps,
                roofline_gbps: roofline,
            },
        ));
    }
}

fn check_suite(r: &VerificationReport, planned: &[PlannedCase], out: &mut Vec<ReportError>) {
    use ReportErrorKind::*;
    let by_id: BTreeMap<&str, &PlannedCase> = planned.iter().map(|p| (p.id.as_str(), p)).collect();
    let mut reported = BTreeSet::new();
    for (i, c) in r.cases.iter().enumerate() {
        reported.insert(c.id.as_str());
        match by_id.get(c.id.as_str()) {
            None => out.push(err(
                format!("cases[{i}].id"),
                NotInSuite {
                    id: c.id.clone(),
                    suite: r.suite_version.clone(),
                    seed: r.seed,
                },
            )),
            Some(p) => {
                let same = match (c.eps, p.eps) {
                    (None, None) => true,
                    (Some(a), Some(b)) => close(a as f64, b as f64),
                    _ => false,
                };
                if !same {
                    out.push(err(
                        format!("cases[{i}].eps"),
                        SuiteEps {
                            id: c.id.clone(),
                            got: c.eps,
                            want: p.eps,
                        },
                    ));
                }
            }
        }
        if out.len() >= MAX_PROBLEMS {
            return;
        }
    }
    // Only the dtypes the report ran: a run may be asked for some of the kernel's dtypes.
    let dtypes: BTreeSet<DType> = r.cases.iter().map(|c| c.dtype).collect();
    let missing: Vec<String> = planned
        .iter()
        .filter(|p| dtypes.contains(&p.dtype) && !reported.contains(p.id.as_str()))
        .map(|p| p.id.clone())
        .collect();
    if !missing.is_empty() {
        out.push(err(
            "cases",
            MissingSuiteCases {
                missing,
                total: planned.len(),
                suite: r.suite_version.clone(),
                seed: r.seed,
            },
        ));
    }
}

fn check_runtime(r: &VerificationReport, m: &Manifest, out: &mut Vec<ReportError>) {
    let runtime = m.runtime;
    match runtime {
        Runtime::Python => {
            if r.python.is_none() {
                out.push(err(
                    "python",
                    ReportErrorKind::Runtime {
                        runtime,
                        why: "its report records the Python environment it ran in",
                    },
                ));
            }
            if !r.compiled.is_empty() {
                out.push(err(
                    "compiled",
                    ReportErrorKind::Runtime {
                        runtime,
                        why: "NVRTC compiles nothing of a Python candidate",
                    },
                ));
            }
        }
        Runtime::Cuda => {
            if r.python.is_some() {
                out.push(err(
                    "python",
                    ReportErrorKind::Runtime {
                        runtime,
                        why: "a CUDA kernel runs in no Python environment",
                    },
                ));
            }
        }
    }
}

/// Longest evidence or note string of a capability audit (characters).
pub const MAX_AUDIT_TEXT: usize = 300;

/// The capability audit, when there is one, fits the kernel: a CUDA kernel's, declaring what
/// the manifest declares, naming only the kernel's dtypes, bounded text.
fn check_capabilities(r: &VerificationReport, m: &Manifest, out: &mut Vec<ReportError>) {
    use crate::capability::{MAX_CAPABILITY_REASON, MAX_EVIDENCE};
    let Some(c) = &r.capabilities else { return };
    let mut bad = |field: String, why: String| {
        out.push(err(field, ReportErrorKind::Capabilities { why }));
    };
    if m.runtime == Runtime::Python {
        bad(
            "capabilities".into(),
            "a Python candidate's code is not audited".into(),
        );
        return;
    }
    if c.declared != m.capabilities {
        bad(
            "capabilities.declared".into(),
            format!(
                "declares [{}], the manifest [{}]",
                c.declared
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                m.capabilities
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    if c.audited != c.notes.is_empty() {
        bad(
            "capabilities.audited".into(),
            "an audit is complete exactly when it has no note of a module it could not audit"
                .into(),
        );
    }
    let mut names = c.found.iter().map(|f| f.name).collect::<Vec<_>>();
    names.dedup();
    if names.len() != c.found.len() || !c.found.windows(2).all(|w| w[0].name < w[1].name) {
        bad(
            "capabilities.found".into(),
            "lists a capability twice or out of order (sorted by name, each once)".into(),
        );
    }
    for (i, f) in c.found.iter().enumerate() {
        if f.evidence.is_empty() || f.evidence.len() > MAX_EVIDENCE {
            bad(
                format!("capabilities.found[{i}].evidence"),
                format!("gives 1 to {MAX_EVIDENCE} pieces of evidence"),
            );
        }
        if f.evidence
            .iter()
            .any(|e| e.chars().count() > MAX_AUDIT_TEXT)
        {
            bad(
                format!("capabilities.found[{i}].evidence"),
                format!("each piece of evidence is at most {MAX_AUDIT_TEXT} characters"),
            );
        }
        if f.dtypes.is_empty() || f.dtypes.iter().any(|d| !m.dtypes().contains(d)) {
            bad(
                format!("capabilities.found[{i}].dtypes"),
                "names the dtypes of the kernel's modules that have it (at least one)".into(),
            );
        }
    }
    if c.notes.len() > m.dtypes().len()
        || c.notes
            .iter()
            .any(|n| n.chars().count() > MAX_AUDIT_TEXT + MAX_CAPABILITY_REASON)
    {
        bad(
            "capabilities.notes".into(),
            "at most one short note per dtype".into(),
        );
    }
}

fn check_compiled(r: &VerificationReport, m: &Manifest, out: &mut Vec<ReportError>) {
    use ReportErrorKind::*;
    let arch_digits = format!("{}{}", r.device.arch.major, r.device.arch.minor);
    for (i, c) in r.compiled.iter().enumerate() {
        if !m.dtypes().contains(&c.dtype) {
            out.push(err(
                format!("compiled[{i}].dtype"),
                DTypeNotInKernel {
                    dtype: c.dtype,
                    kernel_has: m.dtypes(),
                },
            ));
        }
        let hex = c.code_sha256.len() == 64
            && c.code_sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex {
            out.push(err(
                format!("compiled[{i}].code_sha256"),
                BadHash {
                    got: c.code_sha256.clone(),
                },
            ));
        }
        for o in &c.options {
            let Some(target) = o
                .strip_prefix("--gpu-architecture=")
                .or_else(|| o.strip_prefix("-arch="))
            else {
                continue;
            };
            let digits = target
                .strip_prefix("sm_")
                .or_else(|| target.strip_prefix("compute_"))
                .unwrap_or(target);
            if digits.trim_end_matches(['a', 'f']) != arch_digits {
                out.push(err(
                    format!("compiled[{i}].options"),
                    CompiledArch {
                        option: o.clone(),
                        arch: r.device.arch.to_string(),
                    },
                ));
            }
        }
    }
}

fn check_models(r: &VerificationReport, m: &Manifest, out: &mut Vec<ReportError>) {
    use ReportErrorKind::*;
    for (i, mr) in r.model.iter().enumerate() {
        let at = |f: &str| format!("model[{i}].{f}");
        if !m.dtypes().contains(&mr.dtype) {
            out.push(err(
                at("dtype"),
                DTypeNotInKernel {
                    dtype: mr.dtype,
                    kernel_has: m.dtypes(),
                },
            ));
        }
        if mr.tokens == 0 {
            out.push(err(at("tokens"), Zero));
        }
        if mr.layers_replaced == 0 {
            out.push(err(
                at("layers_replaced"),
                ModelFigure {
                    why: format!(
                        "no layer of {} was replaced, so nothing of the kernel was measured there; a verifier notes such a model in model_notes instead",
                        mr.model_name
                    ),
                },
            ));
        }
        let fractions = [
            ("argmax_match_fraction", Some(mr.argmax_match_fraction)),
            ("top5_overlap", Some(mr.top5_overlap)),
            ("eager_mean_top1_prob", mr.eager_mean_top1_prob),
        ];
        for (f, v) in fractions {
            if let Some(v) = v {
                if !(0.0..=1.0).contains(&v) {
                    out.push(err(
                        at(f),
                        BadNumber {
                            value: v,
                            must_be: "a fraction in [0, 1]",
                        },
                    ));
                }
            }
        }
        for (f, v) in [
            ("max_logit_abs_diff", mr.max_logit_abs_diff),
            ("mean_kl", mr.mean_kl),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                out.push(err(
                    at(f),
                    BadNumber {
                        value: v,
                        must_be: "a finite figure, at least 0",
                    },
                ));
            }
        }
        if mr.tokens > 0 {
            let matched = mr.argmax_match_fraction * mr.tokens as f64;
            if (matched - matched.round()).abs() > 1e-6 * mr.tokens as f64 {
                out.push(err(
                    at("argmax_match_fraction"),
                    ModelFigure {
                        why: format!(
                            "{} is not a whole number of {} tokens",
                            mr.argmax_match_fraction, mr.tokens
                        ),
                    },
                ));
            }
        }
    }
}

/// Replace every derived figure of a (validated) report with the hub's own derivation: per
/// case the mismatch fraction, GB/s, copy fraction and speedup; then the summary, from the
/// cases. Returns the summary fields whose posted value differed (for the audit log).
pub fn rederive(report: &mut VerificationReport) -> Vec<String> {
    let copy = report.device.copy_gbps;
    for c in &mut report.cases {
        if let Some(e) = &mut c.exactness {
            e.mismatch_fraction = if e.elements == 0 {
                0.0
            } else {
                e.mismatches as f64 / e.elements as f64
            };
        }
        if let Some(s) = &mut c.speed {
            s.gbps = gbps_of(s.bytes_moved, s.median_us);
            s.copy_fraction = if copy > 0.0 {
                s.gbps / copy
            } else {
                f64::INFINITY
            };
            s.speedup = s.reference_median_us / s.median_us;
        }
    }
    let derived = Summary::from_cases(&report.cases);
    let mut differ = verdict_differences("overall", &report.summary.overall, &derived.overall);
    let dtypes: BTreeSet<DType> = report
        .summary
        .per_dtype
        .keys()
        .chain(derived.per_dtype.keys())
        .copied()
        .collect();
    for d in dtypes {
        match (report.summary.per_dtype.get(&d), derived.per_dtype.get(&d)) {
            (Some(a), Some(b)) => {
                differ.extend(verdict_differences(&format!("per_dtype.{d}"), a, b))
            }
            _ => differ.push(format!("summary.per_dtype.{d}")),
        }
    }
    report.summary = derived;
    differ
}

fn verdict_differences(at: &str, posted: &Verdict, derived: &Verdict) -> Vec<String> {
    let opt = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => close(a, b),
        (None, None) => true,
        _ => false,
    };
    let checks: [(&str, bool); 19] = [
        ("class", posted.class == derived.class),
        ("cases_run", posted.cases_run == derived.cases_run),
        (
            "cases_not_applicable",
            posted.cases_not_applicable == derived.cases_not_applicable,
        ),
        ("cases_error", posted.cases_error == derived.cases_error),
        ("elements", posted.elements == derived.elements),
        ("mismatches", posted.mismatches == derived.mismatches),
        (
            "max_mismatch_fraction",
            close(posted.max_mismatch_fraction, derived.max_mismatch_fraction),
        ),
        (
            "max_abs_diff",
            close(posted.max_abs_diff, derived.max_abs_diff),
        ),
        ("max_ulp", posted.max_ulp == derived.max_ulp),
        (
            "nonfinite_parity",
            posted.nonfinite_parity == derived.nonfinite_parity,
        ),
        (
            "within_tolerance",
            posted.within_tolerance == derived.within_tolerance,
        ),
        (
            "deterministic",
            posted.deterministic == derived.deterministic,
        ),
        (
            "batch_invariant",
            posted.batch_invariant == derived.batch_invariant,
        ),
        ("integrity_ok", posted.integrity_ok == derived.integrity_ok),
        (
            "gbps_4096x8192",
            opt(posted.gbps_4096x8192, derived.gbps_4096x8192),
        ),
        (
            "gbps_32768x4096",
            opt(posted.gbps_32768x4096, derived.gbps_32768x4096),
        ),
        (
            "copy_fraction_4096x8192",
            opt(
                posted.copy_fraction_4096x8192,
                derived.copy_fraction_4096x8192,
            ),
        ),
        (
            "copy_fraction_32768x4096",
            opt(
                posted.copy_fraction_32768x4096,
                derived.copy_fraction_32768x4096,
            ),
        ),
        (
            "speedup_4096x8192",
            opt(posted.speedup_4096x8192, derived.speedup_4096x8192),
        ),
    ];
    checks
        .iter()
        .filter(|(_, same)| !same)
        .map(|(f, _)| format!("summary.{at}.{f}"))
        .collect()
}

#[cfg(test)]
mod tests;
