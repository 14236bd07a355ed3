//! The `VerificationReport`: what the verifier measured, serialised as versioned JSON and
//! stored verbatim. Summaries are derived from the cases by one function, never hand-written.

use crate::domain::{Arch, DType, Digest, Op, Semantics};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

pub mod speed;
pub mod validate;
pub use speed::{nearest_speed, speed_at, timed_cases, SpeedAt};
pub use validate::{
    rederive, validate, Expected, PlannedCase, ReportError, ReportErrorKind, KNOWN_SUITES,
};

/// Bumped on any incompatible change of the report's JSON.
pub const REPORT_SCHEMA_VERSION: u32 = 1;

/// `max_ulp` value meaning "infinite": NaN against a number, or Inf against a finite value.
pub const ULP_INFINITE: u64 = u64::MAX;

/// Upper bounds (inclusive) of the ulp-distance histogram buckets; a last bucket holds the rest
/// (including infinite distances).
pub const ULP_BUCKETS: [u64; 9] = [0, 1, 2, 3, 4, 8, 16, 64, 256];

/// Index of the `ULP_BUCKETS` histogram slot for an ulp distance (the last slot holds the rest,
/// infinite distances included).
pub fn ulp_bucket(d: u64) -> usize {
    ULP_BUCKETS
        .iter()
        .position(|&ub| d <= ub)
        .unwrap_or(ULP_BUCKETS.len())
}

/// A measured speed above this multiple of the device's copy bandwidth (measured in the same
/// process) is impossible for a kernel that moves the bytes it must: it is an integrity failure,
/// never a record. The 5% margin covers the timing noise of one median against another
/// (copy kernels measured 0.93-0.97 of the copy bandwidth on the H200).
pub const ROOFLINE_MARGIN: f64 = 1.05;

impl Speed {
    /// Why this speed cannot be real, when it is above the roofline (`ROOFLINE_MARGIN`).
    pub fn above_roofline(&self) -> Option<String> {
        (self.copy_fraction.is_nan() || self.copy_fraction > ROOFLINE_MARGIN).then(|| {
            format!(
                "measured {:.0} GB/s is {:.2}x this device's copy bandwidth (roofline, margin {ROOFLINE_MARGIN}): the kernel cannot have moved the {} bytes it must",
                self.gbps, self.copy_fraction, self.bytes_moved
            )
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerificationReport {
    pub schema_version: u32,
    pub kernel: KernelRef,
    pub device: DeviceInfo,
    pub verifier_version: String,
    pub suite_version: String,
    /// Replays the run exactly with `kernelize verify --seed`.
    pub seed: u64,
    pub quick: bool,
    /// Which built-in reference the candidate was compared with.
    pub reference: String,
    pub started_at: String,
    pub duration_s: f64,
    pub cases: Vec<CaseReport>,
    pub summary: Summary,
    /// Model-level measurements (argmax agreement), when they were run.
    #[serde(default)]
    pub model: Vec<ModelReport>,
    /// What the model-level run said besides its measurements: models skipped (no matching
    /// layer), a harness failure, its duration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model_notes: Vec<String>,
    /// What was compiled and run, per dtype: NVRTC options and the hash of the code the GPU ran
    /// (a client that compiles the same source with the same options gets the same hash).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compiled: Vec<CompiledModule>,
    /// Shapes a caller asked for besides the suite (`kernelize verify --cols N --rows A..B`, or a
    /// hub job queued for an unverified width); their cases are in `cases` like the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requested_shapes: Vec<ShapeRequest>,
    /// A Python candidate's run (docs/spec.md section 2b): the interpreter, torch and the packages it required,
    /// at the versions the verification ran with. Absent for CUDA kernels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonRuntime>,
    /// The capability audit of the compiled code (docs/spec.md section 3b): what each dtype's
    /// module can do (found in the PTX the certified CUBIN was made from) and what the
    /// manifest declares. Absent in reports made before the audit and for Python candidates
    /// (their code is not audited); left out of the JSON when absent, so the canonical digest
    /// (and the certificate) of an older report is unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<crate::capability::CapabilityReport>,
}

impl VerificationReport {
    /// The capability audit a policy decides on: the report's own; for a CUDA kernel's report
    /// made before the audit existed, [`CapabilityReport::before_audit`] (every policy refuses
    /// it until the kernel is verified again); `None` for a Python candidate (its code is not
    /// audited; refused only by a policy with `audited`). The report itself is not changed, so
    /// its digest and certificate stay what they were.
    ///
    /// [`CapabilityReport::before_audit`]: crate::capability::CapabilityReport::before_audit
    pub fn audit(&self) -> Option<std::borrow::Cow<'_, crate::capability::CapabilityReport>> {
        match (&self.capabilities, &self.python) {
            (Some(c), _) => Some(std::borrow::Cow::Borrowed(c)),
            (None, None) => Some(std::borrow::Cow::Owned(
                crate::capability::CapabilityReport::before_audit(),
            )),
            (None, Some(_)) => None,
        }
    }
}

/// The Python environment a Python candidate was verified in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonRuntime {
    /// `sys.version` of the child interpreter (first word).
    pub python: String,
    /// `torch.__version__`.
    pub torch: String,
    /// Each package of the manifest's `requires`, normalised name -> installed version
    /// (`importlib.metadata`); "missing" when it was not installed.
    pub packages: std::collections::BTreeMap<String, String>,
    /// The isolation the child found itself in (network namespace, private directory, memory
    /// limit), said plainly (docs/python-candidates.md).
    #[serde(default)]
    pub isolation: Vec<String>,
}

/// One compiled module of a verification: the dtype's entry, compiled with `options` by NVRTC
/// `nvrtc_version` into code whose SHA-256 is `code_sha256` (a CUBIN for the device's arch, or
/// PTX where NVRTC made none: `code_kind`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompiledModule {
    pub dtype: DType,
    pub symbol: String,
    /// Every option NVRTC was given, in order (arch and include path included).
    pub options: Vec<String>,
    pub nvrtc_version: String,
    /// `cubin` or `ptx`.
    pub code_kind: String,
    pub code_sha256: String,
}

/// A shape to verify besides the suite: row length `cols` at row counts `rows_min..=rows_max`
/// (the verifier runs both ends, every count up to 64 inside the range, and a few drawn at
/// random inside it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShapeRequest {
    pub cols: u64,
    pub rows_min: u64,
    pub rows_max: u64,
}

impl ShapeRequest {
    /// The most rows a requested shape may ask for (keeps one request's cases bounded).
    pub const MAX_ROWS: u64 = 1 << 20;
    /// The most elements (rows x cols) a requested shape may have at its largest row count.
    pub const MAX_ELEMENTS: u64 = 1 << 31;

    /// A checked request: cols >= 1, 1 <= rows_min <= rows_max <= MAX_ROWS, bounded size.
    pub fn new(cols: u64, rows_min: u64, rows_max: u64) -> Result<ShapeRequest, String> {
        if cols == 0 {
            return Err("cols must be at least 1".into());
        }
        if rows_min == 0 || rows_min > rows_max {
            return Err(format!(
                "rows {rows_min}..{rows_max} is not a range of at least one row (write A..B with 1 <= A <= B)"
            ));
        }
        if rows_max > Self::MAX_ROWS {
            return Err(format!(
                "rows up to {rows_max} is more than {} rows; ask for a smaller range",
                Self::MAX_ROWS
            ));
        }
        if rows_max.saturating_mul(cols) > Self::MAX_ELEMENTS {
            return Err(format!(
                "{rows_max} x {cols} is more than 2^31 elements; ask for fewer rows"
            ));
        }
        Ok(ShapeRequest {
            cols,
            rows_min,
            rows_max,
        })
    }
}

impl FromStr for ShapeRequest {
    type Err = String;
    /// `COLS` (rows 1..64), `COLSxROWS`, or `COLS:A..B`.
    fn from_str(s: &str) -> Result<Self, String> {
        let num = |t: &str| -> Result<u64, String> {
            t.trim()
                .parse::<u64>()
                .map_err(|_| format!("`{t}` in shape `{s}` is not a whole number"))
        };
        if let Some((c, r)) = s.split_once(':') {
            let (a, b) = r
                .split_once("..")
                .ok_or_else(|| format!("shape `{s}`: write COLS:A..B, e.g. 11008:1..64"))?;
            ShapeRequest::new(num(c)?, num(a)?, num(b)?)
        } else if let Some((c, r)) = s.split_once('x') {
            let r = num(r)?;
            ShapeRequest::new(num(c)?, r, r)
        } else {
            ShapeRequest::new(num(s)?, 1, 64)
        }
    }
}

impl fmt::Display for ShapeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}..{}", self.cols, self.rows_min, self.rows_max)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelRef {
    pub name: String,
    pub version: String,
    pub digest: Digest,
    pub op: Op,
    pub semantics: Semantics,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub arch: Arch,
    pub sm_count: u32,
    pub driver_version: String,
    pub cuda_version: String,
    /// Device-to-device copy bandwidth measured in the same process (read + write, GB/s).
    pub copy_gbps: f64,
    /// `maxThreadsPerMultiProcessor`: with `sm_count`, what eager's column sums (a backward
    /// op's `dw`) depend on past 1020 rows; recorded by verifiers since backward ops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads_per_sm: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaseStatus {
    /// The case ran; see the metrics.
    Ran,
    /// Outside the kernel's declared constraints: neither a pass nor a failure.
    NotApplicable,
    /// The launch failed (CUDA error, timeout, compile error); `note` says how.
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseReport {
    /// Stable name, e.g. `bf16/4096x8192/normal`.
    pub id: String,
    pub dtype: DType,
    pub rows: u64,
    pub cols: u64,
    pub distribution: String,
    /// The scalar `eps` the case was launched with (norm ops), drawn per case and recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps: Option<f32>,
    pub status: CaseStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exactness: Option<Exactness>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<Accuracy>,
    /// Repeated launches gave identical bits (None: not measured for this case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deterministic: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_invariant: Option<bool>,
    /// Each integrity failure, said plainly; empty when integrity holds.
    #[serde(default)]
    pub integrity_failures: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<Speed>,
    /// A backward op's gradients one by one ([`Op::gradients`]: `dx`, `dw`), each against the
    /// reference and the oracle; `exactness` is then their combination (every gradient's
    /// elements, the worst of each figure). Empty for a forward op.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gradients: BTreeMap<String, GradientReport>,
}

/// One gradient of a backward case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GradientReport {
    pub exactness: Exactness,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<Accuracy>,
}

/// Candidate against the reference layer, bit for bit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exactness {
    pub elements: u64,
    pub mismatches: u64,
    pub mismatch_fraction: f64,
    pub max_abs_diff: f64,
    pub max_rel_diff: f64,
    /// Ordered-integer distance in T; `ULP_INFINITE` for NaN vs number.
    pub max_ulp: u64,
    /// NaN and Inf at the same positions (and Inf of the same sign) in both outputs.
    pub nonfinite_parity: bool,
    /// `torch.testing.assert_close` with the dtype's default rtol/atol would pass.
    pub within_tolerance: bool,
    /// Counts of elements per ulp distance bucket (see `ULP_BUCKETS`).
    pub ulp_histogram: Vec<u64>,
}

impl Exactness {
    /// `elements` compared and none differing (a GPU-side comparison that found nothing, a
    /// bit-exact gradient, a test's exact case).
    pub fn all_equal(elements: u64) -> Exactness {
        let mut ulp_histogram = vec![0; ULP_BUCKETS.len() + 1];
        ulp_histogram[0] = elements;
        Exactness {
            elements,
            mismatches: 0,
            mismatch_fraction: 0.0,
            max_abs_diff: 0.0,
            max_rel_diff: 0.0,
            max_ulp: 0,
            nonfinite_parity: true,
            within_tolerance: true,
            ulp_histogram,
        }
    }
}

/// Candidate and reference errors against the f64 oracle, over elements where the oracle is
/// finite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Accuracy {
    pub candidate_max_abs: f64,
    pub candidate_rms: f64,
    pub reference_max_abs: f64,
    pub reference_rms: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Speed {
    pub median_us: f64,
    pub reference_median_us: f64,
    /// Inputs read once plus outputs written once.
    pub bytes_moved: u64,
    pub gbps: f64,
    /// `gbps / copy_gbps` of the same run.
    pub copy_fraction: f64,
    /// Reference time over candidate time.
    pub speedup: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelReport {
    pub model_name: String,
    pub model_digest: String,
    pub dtype: DType,
    pub tokens: u64,
    pub layers_replaced: u32,
    pub max_logit_abs_diff: f64,
    pub argmax_match_fraction: f64,
    pub top5_overlap: f64,
    pub mean_kl: f64,
    /// Mean probability of the eager model's top-1 prediction over the evaluation text: argmax
    /// agreement means little on a model that predicts nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eager_mean_top1_prob: Option<f64>,
    /// How the model was adapted so its layers have the kernel's semantics (e.g. LlamaRMSNorm
    /// turned into nn.RMSNorm with the same weights), when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptation: Option<String>,
}

/// How close a kernel is to its reference over a set of cases, strongest claim first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExactnessClass {
    BitExact,
    MaxUlp(u64),
    Tolerance,
    Fails,
}

impl fmt::Display for ExactnessClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExactnessClass::BitExact => f.write_str("bit_exact"),
            ExactnessClass::MaxUlp(n) => write!(f, "ulp:{n}"),
            ExactnessClass::Tolerance => f.write_str("tolerance"),
            ExactnessClass::Fails => f.write_str("fails"),
        }
    }
}
impl FromStr for ExactnessClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bit_exact" => Ok(ExactnessClass::BitExact),
            "tolerance" => Ok(ExactnessClass::Tolerance),
            "fails" => Ok(ExactnessClass::Fails),
            _ => s
                .strip_prefix("ulp:")
                .and_then(|n| n.parse().ok())
                .map(ExactnessClass::MaxUlp)
                .ok_or_else(|| format!("`{s}` is not an exactness class")),
        }
    }
}
impl Serialize for ExactnessClass {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for ExactnessClass {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The aggregate over the cases of one dtype (or of all dtypes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub class: ExactnessClass,
    pub cases_run: u32,
    pub cases_not_applicable: u32,
    pub cases_error: u32,
    pub elements: u64,
    pub mismatches: u64,
    pub max_mismatch_fraction: f64,
    pub max_abs_diff: f64,
    pub max_ulp: u64,
    pub nonfinite_parity: bool,
    pub within_tolerance: bool,
    pub deterministic: bool,
    pub batch_invariant: bool,
    pub integrity_ok: bool,
    /// The first few integrity failures and errors, each prefixed by its case id.
    pub problems: Vec<String>,
    /// Median GB/s and copy fraction at the two headline shapes, where measured.
    pub gbps_4096x8192: Option<f64>,
    pub gbps_32768x4096: Option<f64>,
    pub copy_fraction_4096x8192: Option<f64>,
    pub copy_fraction_32768x4096: Option<f64>,
    pub speedup_4096x8192: Option<f64>,
    /// A backward op's class per gradient (`dx`, `dw`), each by the rule of `class` over that
    /// gradient's figures; `class` is the class of their combination. Empty for a forward op.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_gradient: BTreeMap<String, ExactnessClass>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub overall: Verdict,
    pub per_dtype: BTreeMap<DType, Verdict>,
}

impl Summary {
    pub fn from_cases(cases: &[CaseReport]) -> Summary {
        let mut per_dtype = BTreeMap::new();
        for dt in DType::ALL {
            let these: Vec<&CaseReport> = cases.iter().filter(|c| c.dtype == *dt).collect();
            if !these.is_empty() {
                per_dtype.insert(*dt, Verdict::from_cases(&these));
            }
        }
        Summary {
            overall: Verdict::from_cases(&cases.iter().collect::<Vec<_>>()),
            per_dtype,
        }
    }
}

impl Verdict {
    pub fn from_cases(cases: &[&CaseReport]) -> Verdict {
        let mut v = Verdict {
            class: ExactnessClass::BitExact,
            cases_run: 0,
            cases_not_applicable: 0,
            cases_error: 0,
            elements: 0,
            mismatches: 0,
            max_mismatch_fraction: 0.0,
            max_abs_diff: 0.0,
            max_ulp: 0,
            nonfinite_parity: true,
            within_tolerance: true,
            deterministic: true,
            batch_invariant: true,
            integrity_ok: true,
            problems: Vec::new(),
            gbps_4096x8192: None,
            gbps_32768x4096: None,
            copy_fraction_4096x8192: None,
            copy_fraction_32768x4096: None,
            speedup_4096x8192: None,
            per_gradient: BTreeMap::new(),
        };
        let problem = |v: &mut Verdict, s: String| {
            if v.problems.len() < 20 {
                v.problems.push(s);
            }
        };
        // (rows, cols) -> GB/s, copy fractions and speedups measured there.
        type Samples = (Vec<f64>, Vec<f64>, Vec<f64>);
        let mut headline: BTreeMap<(u64, u64), Samples> = BTreeMap::new();
        for c in cases {
            match c.status {
                CaseStatus::NotApplicable => {
                    v.cases_not_applicable = v.cases_not_applicable.saturating_add(1);
                    continue;
                }
                CaseStatus::Error => {
                    v.cases_error = v.cases_error.saturating_add(1);
                    v.integrity_ok = false;
                    problem(
                        &mut v,
                        format!("{}: {}", c.id, c.note.as_deref().unwrap_or("error")),
                    );
                    continue;
                }
                CaseStatus::Ran => v.cases_run = v.cases_run.saturating_add(1),
            }
            for f in &c.integrity_failures {
                v.integrity_ok = false;
                problem(&mut v, format!("{}: {f}", c.id));
            }
            if let Some(e) = &c.exactness {
                // A worker's counts are not trusted to be small: sums saturate, never wrap.
                v.elements = v.elements.saturating_add(e.elements);
                v.mismatches = v.mismatches.saturating_add(e.mismatches);
                v.max_mismatch_fraction = v.max_mismatch_fraction.max(e.mismatch_fraction);
                if e.max_abs_diff.is_nan() || e.max_abs_diff > v.max_abs_diff {
                    v.max_abs_diff = e.max_abs_diff;
                }
                v.max_ulp = v.max_ulp.max(e.max_ulp);
                v.nonfinite_parity &= e.nonfinite_parity;
                v.within_tolerance &= e.within_tolerance;
            }
            if c.deterministic == Some(false) {
                v.deterministic = false;
            }
            if c.batch_invariant == Some(false) {
                v.batch_invariant = false;
            }
            if let Some(s) = &c.speed {
                // Checked here too, so a report from any worker is held to the roofline.
                if let Some(why) = s.above_roofline() {
                    v.integrity_ok = false;
                    if !c.integrity_failures.iter().any(|f| f.contains("roofline")) {
                        problem(&mut v, format!("{}: {why}", c.id));
                    }
                    continue;
                }
                let e = headline.entry((c.rows, c.cols)).or_default();
                e.0.push(s.gbps);
                e.1.push(s.copy_fraction);
                e.2.push(s.speedup);
            }
        }
        let med = |xs: &[f64]| -> Option<f64> {
            let mut xs: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
            if xs.is_empty() {
                return None;
            }
            xs.sort_by(f64::total_cmp);
            Some(xs[xs.len() / 2])
        };
        if let Some((g, f, s)) = headline.get(&(4096, 8192)) {
            v.gbps_4096x8192 = med(g);
            v.copy_fraction_4096x8192 = med(f);
            v.speedup_4096x8192 = med(s);
        }
        if let Some((g, f, _)) = headline.get(&(32768, 4096)) {
            v.gbps_32768x4096 = med(g);
            v.copy_fraction_32768x4096 = med(f);
        }
        v.class = if !v.integrity_ok || v.cases_run == 0 {
            ExactnessClass::Fails
        } else if v.mismatches == 0 && v.nonfinite_parity {
            ExactnessClass::BitExact
        } else if v.max_ulp != ULP_INFINITE && v.nonfinite_parity {
            ExactnessClass::MaxUlp(v.max_ulp)
        } else if v.within_tolerance {
            ExactnessClass::Tolerance
        } else {
            ExactnessClass::Fails
        };
        // Each gradient's class: the same rule over the cases with that gradient's exactness
        // alone (integrity, errors and the rest are the case's, shared by its gradients).
        let names: std::collections::BTreeSet<&str> = cases
            .iter()
            .flat_map(|c| c.gradients.keys().map(String::as_str))
            .collect();
        for name in names {
            let alone: Vec<CaseReport> = cases
                .iter()
                .map(|c| CaseReport {
                    exactness: c.gradients.get(name).map(|g| g.exactness.clone()),
                    gradients: BTreeMap::new(),
                    ..(*c).clone()
                })
                .collect();
            let class = Verdict::from_cases(&alone.iter().collect::<Vec<_>>()).class;
            v.per_gradient.insert(name.to_string(), class);
        }
        v
    }

    /// One line a person reads: "24.9% of elements differ (max 1 ulp, max abs 3.1e-2)".
    pub fn describe(&self) -> String {
        if self.cases_run == 0 {
            return "no case ran".into();
        }
        if !self.integrity_ok {
            return format!(
                "integrity fails: {}",
                self.problems.first().cloned().unwrap_or_default()
            );
        }
        if self.mismatches == 0 && self.nonfinite_parity {
            return "bit-exact in every case".into();
        }
        let ulp = if self.max_ulp == ULP_INFINITE {
            "NaN/Inf differ".to_string()
        } else {
            format!("max {} ulp", self.max_ulp)
        };
        format!(
            "{} of elements differ in the worst case ({ulp}, max abs {:.2e})",
            percent(self.max_mismatch_fraction),
            self.max_abs_diff
        )
    }
}

/// A fraction as a short percentage that never rounds a non-zero value to "0%".
pub fn percent(frac: f64) -> String {
    let p = frac * 100.0;
    if p == 0.0 {
        "0%".into()
    } else if p >= 1.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.2e}%")
    }
}

/// What one verification covered for one dtype at one row length: the row counts its cases
/// ran (status `Ran`; a case that errored or was not applicable covers nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    pub dtype: DType,
    pub cols: u64,
    pub rows_min: u64,
    pub rows_max: u64,
    /// Every row count that ran at this (dtype, cols), ascending.
    pub row_counts: Vec<u64>,
}

impl Coverage {
    /// The most elements (rows x cols) one case of this coverage had.
    pub fn max_elements(&self) -> u64 {
        self.rows_max.saturating_mul(self.cols)
    }
}

/// Per dtype and row length, what a report's cases covered; sorted by (dtype, cols).
pub fn coverage(report: &VerificationReport) -> Vec<Coverage> {
    let mut by: BTreeMap<(DType, u64), std::collections::BTreeSet<u64>> = BTreeMap::new();
    for c in report.cases.iter().filter(|c| c.status == CaseStatus::Ran) {
        by.entry((c.dtype, c.cols)).or_default().insert(c.rows);
    }
    by.into_iter()
        .map(|((dtype, cols), rows)| Coverage {
            dtype,
            cols,
            rows_min: *rows.first().expect("non-empty"),
            rows_max: *rows.last().expect("non-empty"),
            row_counts: rows.into_iter().collect(),
        })
        .collect()
}

/// Builders of small reports for tests of this crate and others.
#[doc(hidden)]
pub mod tests_support {
    use super::*;

    pub fn case(id: &str, dtype: DType, mism: u64, ulp: u64) -> CaseReport {
        CaseReport {
            id: id.into(),
            dtype,
            rows: 4096,
            cols: 8192,
            distribution: "normal".into(),
            eps: Some(1e-6),
            status: CaseStatus::Ran,
            note: None,
            exactness: Some(Exactness {
                elements: 1000,
                mismatches: mism,
                mismatch_fraction: mism as f64 / 1000.0,
                max_abs_diff: if mism > 0 { 0.03 } else { 0.0 },
                max_rel_diff: 0.0,
                max_ulp: ulp,
                nonfinite_parity: ulp != ULP_INFINITE,
                within_tolerance: ulp < 4,
                ulp_histogram: vec![1000 - mism, mism, 0, 0, 0, 0, 0, 0, 0, 0],
            }),
            accuracy: None,
            deterministic: Some(true),
            batch_invariant: Some(true),
            integrity_failures: vec![],
            speed: Some(Speed {
                median_us: 50.0,
                reference_median_us: 100.0,
                bytes_moved: 1 << 26,
                gbps: 3000.0,
                copy_fraction: 0.75,
                speedup: 2.0,
            }),
            gradients: BTreeMap::new(),
        }
    }

    /// A report of kernel `k` on `arch` made of `cases` (the summary derived from them), the
    /// rest as `report_with`.
    pub fn report_of_cases(
        k: &crate::KernelBundle,
        arch: Arch,
        cases: Vec<CaseReport>,
    ) -> VerificationReport {
        let mut r = report_with(0, 0);
        r.summary = Summary::from_cases(&cases);
        r.cases = cases;
        r.kernel = KernelRef {
            name: k.manifest.name.clone(),
            version: k.manifest.version.to_string(),
            digest: k.digest(),
            op: k.manifest.op,
            semantics: k.manifest.semantics,
        };
        r.device.arch = arch;
        r
    }

    /// A one-case bf16 report with `mism` of 1000 elements differing by up to `ulp`.
    pub fn report_with(mism: u64, ulp: u64) -> VerificationReport {
        let cases = vec![case("bf16/4096x8192/normal", DType::Bf16, mism, ulp)];
        VerificationReport {
            schema_version: REPORT_SCHEMA_VERSION,
            kernel: KernelRef {
                name: "k".into(),
                version: "1.0.0".into(),
                digest: Digest::of_bytes(b"k"),
                op: Op::RmsNorm,
                semantics: Semantics::Llama,
            },
            device: DeviceInfo {
                name: "test".into(),
                arch: Arch::new(9, 0),
                sm_count: 132,
                driver_version: "0".into(),
                cuda_version: "0".into(),
                copy_gbps: 4000.0,
                threads_per_sm: None,
            },
            verifier_version: "0".into(),
            suite_version: "0".into(),
            seed: 1,
            quick: true,
            reference: "builtin".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            duration_s: 0.0,
            summary: Summary::from_cases(&cases),
            cases,
            model: vec![],
            model_notes: vec![],
            compiled: vec![],
            requested_shapes: vec![],
            python: None,
            // A clean audit, as a worker of today reports (`None` would stand for a report from
            // before the audit, which every policy refuses: `VerificationReport::audit`).
            capabilities: Some(crate::capability::CapabilityReport {
                audited: true,
                found: vec![],
                declared: vec![],
                notes: vec![],
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::case;
    use super::*;

    #[test]
    fn a_speed_above_the_roofline_fails_integrity() {
        let ok = case("bf16/4096x8192/normal", DType::Bf16, 0, 0);
        assert!(Verdict::from_cases(&[&ok]).integrity_ok);
        let mut fast = ok.clone();
        let s = fast.speed.as_mut().unwrap();
        s.gbps = 22_000.0;
        s.copy_fraction = 5.4;
        let v = Verdict::from_cases(&[&fast]);
        assert!(!v.integrity_ok);
        assert_eq!(v.class, ExactnessClass::Fails);
        assert!(v.problems[0].contains("roofline"), "{:?}", v.problems);
        assert_eq!(
            v.gbps_4096x8192, None,
            "an impossible speed is never a record"
        );
        // At the margin it still counts; NaN never does.
        fast.speed.as_mut().unwrap().copy_fraction = ROOFLINE_MARGIN;
        assert!(Verdict::from_cases(&[&fast]).integrity_ok);
        fast.speed.as_mut().unwrap().copy_fraction = f64::NAN;
        assert!(!Verdict::from_cases(&[&fast]).integrity_ok);
    }

    #[test]
    fn shape_requests_parse_and_check() {
        let s: ShapeRequest = "11008".parse().unwrap();
        assert_eq!((s.cols, s.rows_min, s.rows_max), (11008, 1, 64));
        let s: ShapeRequest = "11008:1..15".parse().unwrap();
        assert_eq!((s.cols, s.rows_min, s.rows_max), (11008, 1, 15));
        assert_eq!(s.to_string().parse::<ShapeRequest>().unwrap(), s);
        let s: ShapeRequest = "4096x7".parse().unwrap();
        assert_eq!((s.rows_min, s.rows_max), (7, 7));
        for bad in [
            "0",
            "11008:0..4",
            "11008:9..4",
            "abc",
            "11008:1-4",
            "65536:1..65536",
        ] {
            assert!(bad.parse::<ShapeRequest>().is_err(), "{bad}");
        }
    }

    #[test]
    fn classes_follow_the_worst_case() {
        let a = case("a", DType::Bf16, 0, 0);
        let b = case("b", DType::Bf16, 250, 1);
        assert_eq!(Verdict::from_cases(&[&a]).class, ExactnessClass::BitExact);
        let v = Verdict::from_cases(&[&a, &b]);
        assert_eq!(v.class, ExactnessClass::MaxUlp(1));
        assert!(
            v.describe().contains("25.0% of elements differ"),
            "{}",
            v.describe()
        );
        let mut broken = a.clone();
        broken
            .integrity_failures
            .push("wrote past the output".into());
        let v = Verdict::from_cases(&[&a, &broken]);
        assert_eq!(v.class, ExactnessClass::Fails);
        assert!(v.describe().contains("wrote past"));
        assert_eq!(v.gbps_4096x8192, Some(3000.0));
    }

    #[test]
    fn element_counts_saturate_instead_of_wrapping() {
        // A report whose counts sum past u64::MAX (a buggy or hostile worker) keeps the
        // largest count rather than wrapping to a small one that would look exact.
        let mut a = case("a", DType::Bf16, 0, 0);
        let e = a.exactness.as_mut().unwrap();
        e.elements = u64::MAX - 1;
        e.mismatches = u64::MAX - 1;
        let b = a.clone();
        let v = Verdict::from_cases(&[&a, &b]);
        assert_eq!((v.elements, v.mismatches), (u64::MAX, u64::MAX));
        assert_eq!(v.cases_run, 2);
        assert_ne!(v.class, ExactnessClass::BitExact);
    }

    #[test]
    fn class_string_round_trip() {
        for c in [
            ExactnessClass::BitExact,
            ExactnessClass::MaxUlp(3),
            ExactnessClass::Tolerance,
            ExactnessClass::Fails,
        ] {
            assert_eq!(c.to_string().parse::<ExactnessClass>().unwrap(), c);
        }
        assert!(ExactnessClass::BitExact < ExactnessClass::MaxUlp(1));
    }

    #[test]
    fn percent_never_hides_a_difference() {
        assert_eq!(percent(0.0), "0%");
        assert_eq!(percent(0.249), "24.9%");
        assert_eq!(percent(2.0 / 524288.0), "3.81e-4%");
    }
}
