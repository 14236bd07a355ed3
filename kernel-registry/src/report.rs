//! The `VerificationReport`: what the verifier measured, serialised as versioned JSON and
//! stored verbatim. Summaries are derived from the cases by one function, never hand-written.

use crate::domain::{Arch, DType, Digest, Op, Semantics};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Bumped on any incompatible change of the report's JSON.
pub const REPORT_SCHEMA_VERSION: u32 = 1;

/// `max_ulp` value meaning "infinite": NaN against a number, or Inf against a finite value.
pub const ULP_INFINITE: u64 = u64::MAX;

/// Upper bounds (inclusive) of the ulp-distance histogram buckets; a last bucket holds the rest
/// (including infinite distances).
pub const ULP_BUCKETS: [u64; 9] = [0, 1, 2, 3, 4, 8, 16, 64, 256];

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
                    v.cases_not_applicable += 1;
                    continue;
                }
                CaseStatus::Error => {
                    v.cases_error += 1;
                    v.integrity_ok = false;
                    problem(
                        &mut v,
                        format!("{}: {}", c.id, c.note.as_deref().unwrap_or("error")),
                    );
                    continue;
                }
                CaseStatus::Ran => v.cases_run += 1,
            }
            for f in &c.integrity_failures {
                v.integrity_ok = false;
                problem(&mut v, format!("{}: {f}", c.id));
            }
            if let Some(e) = &c.exactness {
                v.elements += e.elements;
                v.mismatches += e.mismatches;
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
        }
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::case;
    use super::*;

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
