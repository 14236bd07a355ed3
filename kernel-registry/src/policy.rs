//! Exactness policies (docs/spec.md section 4), parsed from strings such as `bit_exact`,
//! `ulp:2,deterministic` or `tolerance,max_abs_diff=0.01`, and evaluated on reports.
//! This is the one implementation: the CLI, the worker, the store's verdict index (and so the
//! resolver and the policy list) all decide through `Policy::passes` on a verdict's
//! `VerdictFacts`; `Policy::evaluate` is that decision on a full report, with its reasons.

use crate::capability::{self, Capability, CapabilityReport};
use crate::domain::DType;
use crate::report::{percent, ModelReport, Verdict, VerificationReport, ULP_INFINITE};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::ControlFlow;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Requirement {
    BitExact,
    Ulp(u64),
    Tolerance,
    Argmax,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Policy {
    pub requirement: Requirement,
    pub deterministic: bool,
    pub batch_invariant: bool,
    pub max_abs_diff: Option<f64>,
    pub max_mismatch_fraction: Option<f64>,
    /// `confirmed:N`: at least N verifications on the architecture, certified by N different
    /// worker keys, agree on the class (0: no such requirement). Checked by the resolver,
    /// which sees every verification; a single report cannot show it.
    pub confirmations: u32,
    /// `allow:NAME`: gated capabilities the caller accepts in the compiled code
    /// (docs/spec.md section 3b; `clock`, `environment`, `state`), sorted. A default policy
    /// refuses a kernel whose audit finds any of them.
    pub allow: Vec<Capability>,
    /// `audited`: refuse a verification whose compiled code was not audited (made before the
    /// audit, or a Python candidate).
    pub audited: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy `{input}`: {message}. Write one of bit_exact, ulp:N, tolerance, argmax, optionally followed by ,deterministic ,batch_invariant ,max_abs_diff=X ,max_mismatch_fraction=X ,confirmed:N ,audited ,allow:CAPABILITY (e.g. `ulp:2,deterministic` or `bit_exact,confirmed:2` or `bit_exact,allow:clock`)")]
pub struct PolicyError {
    pub input: String,
    pub message: String,
}

impl FromStr for Policy {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let err = |m: String| PolicyError {
            input: s.to_string(),
            message: m,
        };
        let mut parts = s.split(',').map(str::trim);
        let base = parts.next().unwrap_or("");
        let requirement = match base {
            "bit_exact" => Requirement::BitExact,
            "tolerance" => Requirement::Tolerance,
            "argmax" => Requirement::Argmax,
            "" => return Err(err("it is empty".into())),
            b => match b.strip_prefix("ulp:") {
                Some(n) => Requirement::Ulp(
                    n.parse()
                        .map_err(|_| err(format!("`{n}` after ulp: is not a whole number")))?,
                ),
                None => return Err(err(format!("`{b}` is not a requirement"))),
            },
        };
        let mut p = Policy {
            requirement,
            deterministic: false,
            batch_invariant: false,
            max_abs_diff: None,
            max_mismatch_fraction: None,
            confirmations: 0,
            allow: Vec::new(),
            audited: false,
        };
        for m in parts {
            let number = |v: &str| -> Result<f64, PolicyError> {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| err(format!("`{v}` is not a non-negative number")))
            };
            if let Some(n) = m.strip_prefix("confirmed:") {
                p.confirmations = n
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| {
                        err(format!(
                            "`{n}` after confirmed: is not a count of workers from 1 to 100"
                        ))
                    })?;
                continue;
            }
            if let Some(n) = m.strip_prefix("allow:") {
                let c: Capability = n.parse().map_err(|e: String| err(e))?;
                if !c.gated() {
                    return Err(err(format!(
                        "`{c}` is never refused by a policy, so there is nothing to allow; allow: takes one of {}",
                        Capability::GATED.map(Capability::as_str).join(", ")
                    )));
                }
                if !p.allow.contains(&c) {
                    p.allow.push(c);
                    p.allow.sort();
                }
                continue;
            }
            match m.split_once('=') {
                None if m == "deterministic" => p.deterministic = true,
                None if m == "audited" => p.audited = true,
                None if m == "batch_invariant" => p.batch_invariant = true,
                Some(("max_abs_diff", v)) => p.max_abs_diff = Some(number(v)?),
                Some(("max_mismatch_fraction", v)) => {
                    let x = number(v)?;
                    if x > 1.0 {
                        return Err(err(format!("max_mismatch_fraction {x} is above 1")));
                    }
                    p.max_mismatch_fraction = Some(x)
                }
                _ => return Err(err(format!("`{m}` is not a modifier"))),
            }
        }
        Ok(p)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.requirement {
            Requirement::BitExact => f.write_str("bit_exact")?,
            Requirement::Ulp(n) => write!(f, "ulp:{n}")?,
            Requirement::Tolerance => f.write_str("tolerance")?,
            Requirement::Argmax => f.write_str("argmax")?,
        }
        if self.deterministic {
            f.write_str(",deterministic")?;
        }
        if self.batch_invariant {
            f.write_str(",batch_invariant")?;
        }
        if let Some(x) = self.max_abs_diff {
            write!(f, ",max_abs_diff={x}")?;
        }
        if let Some(x) = self.max_mismatch_fraction {
            write!(f, ",max_mismatch_fraction={x}")?;
        }
        if self.confirmations > 0 {
            write!(f, ",confirmed:{}", self.confirmations)?;
        }
        if self.audited {
            f.write_str(",audited")?;
        }
        for c in &self.allow {
            write!(f, ",allow:{c}")?;
        }
        Ok(())
    }
}
impl TryFrom<String> for Policy {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, PolicyError> {
        s.parse()
    }
}
impl From<Policy> for String {
    fn from(p: Policy) -> String {
        p.to_string()
    }
}

/// What a policy decides on, of one dtype's verdict of a verification: the per-case facts, how
/// many model-level measurements there are and how many lost the argmax, and the capability
/// audit's flags. [`VerdictFacts::of`] takes them from a report's parts; the store's verdict
/// index builds them from the columns it keeps. [`Policy::passes`] on them is the one
/// statement of the policy: [`Policy::evaluate`] is the same decision on the facts of the full
/// report, with each reason written out.
#[derive(Debug, Clone, PartialEq)]
pub struct VerdictFacts {
    pub cases_run: u64,
    pub integrity_ok: bool,
    pub mismatches: u64,
    pub nonfinite_parity: bool,
    pub deterministic: bool,
    pub batch_invariant: bool,
    pub within_tolerance: bool,
    /// `ULP_INFINITE`: an infinite distance.
    pub max_ulp: u64,
    /// NaN: not measurable (fails any bound on it).
    pub max_abs_diff: f64,
    /// NaN: not measurable (passes any bound on it, as `NaN > x` is false).
    pub max_mismatch_fraction: f64,
    /// Model-level measurements of the dtype.
    pub models: u64,
    /// Those of them that did not keep the argmax on every token (`fraction < 1.0`; NaN does
    /// not fail).
    pub argmax_failures: u64,
    /// The audit's flags ([`CapabilityReport::flags`]; `None`: not audited).
    pub capabilities: Option<String>,
}

impl VerdictFacts {
    /// The facts of `verdict` with the dtype's model-level measurements and the verification's
    /// capability audit.
    pub fn of(
        verdict: &Verdict,
        models: &[&ModelReport],
        audit: Option<&CapabilityReport>,
    ) -> VerdictFacts {
        VerdictFacts {
            cases_run: verdict.cases_run as u64,
            integrity_ok: verdict.integrity_ok,
            mismatches: verdict.mismatches,
            nonfinite_parity: verdict.nonfinite_parity,
            deterministic: verdict.deterministic,
            batch_invariant: verdict.batch_invariant,
            within_tolerance: verdict.within_tolerance,
            max_ulp: verdict.max_ulp,
            max_abs_diff: verdict.max_abs_diff,
            max_mismatch_fraction: verdict.max_mismatch_fraction,
            models: models.len() as u64,
            argmax_failures: models
                .iter()
                .filter(|m| m.argmax_match_fraction < 1.0)
                .count() as u64,
            capabilities: audit.and_then(CapabilityReport::flags),
        }
    }

    /// `bit_exact`'s per-case requirement: no element differs, NaN/Inf where eager has them,
    /// the same bits on every launch. The one statement of it (`bit_exact` and `argmax`'s
    /// exemption from a model-level measurement both read it).
    pub fn bit_exact(&self) -> bool {
        self.mismatches == 0 && self.nonfinite_parity && self.deterministic
    }
}

/// One reason a verdict fails a policy, as decided from its facts ([`Policy::decide`]);
/// written out from the verdict itself ([`Policy::evaluate_parts`]).
#[derive(Debug, Clone, Copy)]
enum Refusal {
    NoCase,
    Integrity,
    DiffersBitExact,
    NotDeterministicBitExact,
    NonfiniteUlp(u64),
    UlpAbove(u64),
    OutsideTolerance,
    NotDeterministic,
    NotBatchInvariant,
    MaxAbsDiff(f64),
    MismatchFraction(f64),
    NoModelMeasurement,
    ArgmaxLost,
    Capabilities,
}

impl Policy {
    /// Does a verdict with these facts meet the policy (not counting `confirmed:N`, which
    /// needs other verifications)? The one predicate: the verdict index, the resolver, the
    /// policy list and `evaluate` all decide through it.
    pub fn passes(&self, facts: &VerdictFacts) -> bool {
        self.decide(facts, |_| ControlFlow::Break(())).is_continue()
    }

    /// The policy's rules over `f`, in the order their reasons are written: `refuse` is called
    /// with each rule `f` fails (and may stop the walk).
    fn decide(
        &self,
        f: &VerdictFacts,
        mut refuse: impl FnMut(Refusal) -> ControlFlow<()>,
    ) -> ControlFlow<()> {
        if f.cases_run == 0 {
            refuse(Refusal::NoCase)?;
        } else {
            if !f.integrity_ok {
                refuse(Refusal::Integrity)?;
            }
            match self.requirement {
                Requirement::BitExact => {
                    if f.mismatches > 0 || !f.nonfinite_parity {
                        refuse(Refusal::DiffersBitExact)?;
                    }
                    if !f.deterministic {
                        refuse(Refusal::NotDeterministicBitExact)?;
                    }
                }
                Requirement::Ulp(n) => {
                    if !f.nonfinite_parity {
                        refuse(Refusal::NonfiniteUlp(n))?;
                    } else if f.max_ulp > n {
                        refuse(Refusal::UlpAbove(n))?;
                    }
                }
                Requirement::Tolerance => {
                    if !f.within_tolerance {
                        refuse(Refusal::OutsideTolerance)?;
                    }
                }
                Requirement::Argmax => {}
            }
            if self.deterministic && !f.deterministic {
                refuse(Refusal::NotDeterministic)?;
            }
            if self.batch_invariant && !f.batch_invariant {
                refuse(Refusal::NotBatchInvariant)?;
            }
            if let Some(x) = self.max_abs_diff {
                // NaN (an unmeasurable difference) fails too.
                if f.max_abs_diff.is_nan() || f.max_abs_diff > x {
                    refuse(Refusal::MaxAbsDiff(x))?;
                }
            }
            if let Some(x) = self.max_mismatch_fraction {
                if f.max_mismatch_fraction > x {
                    refuse(Refusal::MismatchFraction(x))?;
                }
            }
        }
        if self.requirement == Requirement::Argmax {
            // A kernel bit-exact in every case changes no output of any model, so no argmax
            // either: it meets argmax without a model-level measurement (so that argmax, the
            // weaker policy, never hands out less than bit_exact). A measurement, where there
            // is one, decides.
            if f.models == 0 && !f.bit_exact() {
                refuse(Refusal::NoModelMeasurement)?;
            }
            if f.argmax_failures > 0 {
                refuse(Refusal::ArgmaxLost)?;
            }
        }
        // The capability audit (docs/spec.md section 3b): a capability found and not declared
        // by the manifest is refused by every policy; a declared gated one unless the policy
        // allows it; no audit only under `audited`.
        if !capability::flags_pass(f.capabilities.as_deref(), &self.allow, self.audited) {
            refuse(Refusal::Capabilities)?;
        }
        ControlFlow::Continue(())
    }

    /// Does the verdict for `dtype` in this report meet the policy? `Err` holds every reason
    /// it does not, each a sentence a person can act on.
    pub fn evaluate(&self, report: &VerificationReport, dtype: DType) -> Result<(), Vec<String>> {
        let models: Vec<&ModelReport> = report.model.iter().filter(|m| m.dtype == dtype).collect();
        self.evaluate_parts(
            report.summary.per_dtype.get(&dtype),
            &models,
            report.audit().as_deref(),
            dtype,
        )
    }

    /// `evaluate` from the parts of a report it reads: the dtype's verdict (`None`: no case of
    /// the dtype), the model-level measurements of the dtype and the verification's capability
    /// audit (`None`: none in the report). The store keeps these parts apart from the report,
    /// so the resolver explains a verdict without reading the report. The decision is
    /// [`Policy::passes`] on their [`VerdictFacts`]; each reason is written from the parts.
    pub fn evaluate_parts(
        &self,
        verdict: Option<&Verdict>,
        models: &[&ModelReport],
        audit: Option<&CapabilityReport>,
        dtype: DType,
    ) -> Result<(), Vec<String>> {
        // Not verified for the dtype says it all.
        let Some(v) = verdict else {
            return Err(vec![format!("not verified for {dtype}")]);
        };
        let facts = VerdictFacts::of(v, models, audit);
        let mut why = Vec::new();
        let differ = || v.describe();
        let _ = self.decide(&facts, |r| {
            match r {
                Refusal::NoCase => why.push("no applicable case ran".to_string()),
                Refusal::Integrity => {
                    why.push(format!("integrity fails ({})", v.problems.join("; ")))
                }
                Refusal::DiffersBitExact => why.push(format!("{}; fails bit_exact", differ())),
                Refusal::NotDeterministicBitExact => {
                    why.push("not deterministic; fails bit_exact".into())
                }
                Refusal::NonfiniteUlp(n) => {
                    why.push(format!("NaN/Inf positions differ; fails ulp:{n}"))
                }
                Refusal::UlpAbove(n) => {
                    let u = if v.max_ulp == ULP_INFINITE {
                        "infinite".to_string()
                    } else {
                        v.max_ulp.to_string()
                    };
                    why.push(format!("max ulp distance {u} > {n}; fails ulp:{n}"));
                }
                Refusal::OutsideTolerance => why.push(format!(
                    "{}; outside assert_close tolerance; fails tolerance",
                    differ()
                )),
                Refusal::NotDeterministic => {
                    why.push("repeated launches gave different bits; fails deterministic".into())
                }
                Refusal::NotBatchInvariant => {
                    why.push("a row's output depends on the batch; fails batch_invariant".into())
                }
                Refusal::MaxAbsDiff(x) => why.push(format!(
                    "max abs diff {:.3e} > {x}; fails max_abs_diff",
                    v.max_abs_diff
                )),
                Refusal::MismatchFraction(x) => why.push(format!(
                    "{} of elements differ > {}; fails max_mismatch_fraction",
                    percent(v.max_mismatch_fraction),
                    percent(x)
                )),
                Refusal::NoModelMeasurement => why.push(format!(
                    "no model-level (argmax) measurement for {dtype}, and not bit-exact (a \
                     bit-exact kernel meets argmax without one: it changes no output)"
                )),
                Refusal::ArgmaxLost => {
                    for m in models.iter().filter(|m| m.argmax_match_fraction < 1.0) {
                        why.push(format!(
                            "argmax agrees on {} of {} tokens of {} (max logit diff {:.3}); fails argmax",
                            percent(m.argmax_match_fraction),
                            m.tokens,
                            m.model_name,
                            m.max_logit_abs_diff
                        ));
                    }
                }
                Refusal::Capabilities => {
                    why.extend(capability::refusals(audit, &self.allow, self.audited))
                }
            }
            ControlFlow::Continue(())
        });
        if why.is_empty() {
            Ok(())
        } else {
            Err(why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{tests_support::report_with, ExactnessClass};

    #[test]
    fn parses_and_prints() {
        for s in [
            "bit_exact",
            "ulp:2",
            "tolerance,deterministic",
            "argmax,batch_invariant",
            "ulp:0,max_abs_diff=0.01,max_mismatch_fraction=0.001",
            "bit_exact,confirmed:2",
            "ulp:1,deterministic,confirmed:3",
            "bit_exact,audited",
            "bit_exact,allow:clock,allow:state",
            "ulp:1,confirmed:2,audited,allow:environment",
        ] {
            assert_eq!(s.parse::<Policy>().unwrap().to_string(), s);
        }
        for (bad, says) in [
            ("", "empty"),
            ("exact", "`exact` is not a requirement"),
            ("ulp:x", "whole number"),
            ("bit_exact,fast", "`fast` is not a modifier"),
            ("tolerance,max_abs_diff=-1", "non-negative"),
            ("tolerance,max_mismatch_fraction=2", "above 1"),
            ("bit_exact,confirmed:0", "count of workers"),
            ("bit_exact,confirmed:x", "count of workers"),
            ("bit_exact,allow:clocks", "`clocks` is not a capability"),
            ("bit_exact,allow:trap", "never refused"),
        ] {
            let e = bad.parse::<Policy>().unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("ulp:N"), "{e}");
        }
    }

    #[test]
    fn evaluation_gates_on_the_measured_verdict() {
        let exact = report_with(0, 0);
        let off_by_one = report_with(249, 1);
        let bit: Policy = "bit_exact".parse().unwrap();
        assert_eq!(exact.summary.overall.class, ExactnessClass::BitExact);
        assert!(bit.evaluate(&exact, DType::Bf16).is_ok());
        let why = bit.evaluate(&off_by_one, DType::Bf16).unwrap_err();
        assert!(
            why[0].contains("24.9% of elements differ") && why[0].contains("fails bit_exact"),
            "{why:?}"
        );
        assert!("ulp:1"
            .parse::<Policy>()
            .unwrap()
            .evaluate(&off_by_one, DType::Bf16)
            .is_ok());
        assert!("ulp:0"
            .parse::<Policy>()
            .unwrap()
            .evaluate(&off_by_one, DType::Bf16)
            .is_err());
        assert!("tolerance"
            .parse::<Policy>()
            .unwrap()
            .evaluate(&off_by_one, DType::Bf16)
            .is_ok());
        let frac: Policy = "tolerance,max_mismatch_fraction=0.1".parse().unwrap();
        assert!(frac.evaluate(&off_by_one, DType::Bf16).is_err());
        // Not verified for f16: never satisfies anything.
        assert!(bit.evaluate(&exact, DType::F16).unwrap_err()[0].contains("not verified for f16"));
        // argmax needs a model-level measurement, unless the kernel is bit-exact (it changes
        // no output, so no argmax).
        let am: Policy = "argmax".parse().unwrap();
        assert!(am.evaluate(&exact, DType::Bf16).is_ok());
        let why = am.evaluate(&off_by_one, DType::Bf16).unwrap_err();
        assert!(
            why[0].contains("no model-level (argmax) measurement for bf16"),
            "{why:?}"
        );
    }

    /// The capability audit gates every policy: undeclared capabilities always, declared gated
    /// ones unless allowed; a CUDA report with no audit (made before it) always; a Python
    /// candidate's (not audited) only under `audited`; the measured verdict is untouched.
    #[test]
    fn capabilities_gate_the_policy() {
        use crate::capability::{audit_ptx, DeclaredCapability};
        let mut r = report_with(0, 0);
        let bit: Policy = "bit_exact".parse().unwrap();
        let audited: Policy = "bit_exact,audited".parse().unwrap();
        assert!(
            bit.evaluate(&r, DType::Bf16).is_ok(),
            "a clean audit passes"
        );
        // No audit in a CUDA report (one made before the audit): every policy refuses it.
        r.capabilities = None;
        for p in [
            &bit,
            &audited,
            &"ulp:1,allow:clock,allow:state".parse().unwrap(),
        ] {
            let why = p.evaluate(&r, DType::Bf16).unwrap_err();
            assert!(
                why[0].contains("could not be audited")
                    && why[0].contains("before the capability audit"),
                "{why:?}"
            );
        }
        // A Python candidate's report (no audit of its code): passes, except under `audited`.
        r.python = Some(crate::report::PythonRuntime {
            python: "3.12".into(),
            torch: "2.11".into(),
            packages: Default::default(),
            isolation: vec![],
        });
        assert!(bit.evaluate(&r, DType::Bf16).is_ok());
        let why = audited.evaluate(&r, DType::Bf16).unwrap_err();
        assert!(why[0].contains("not audited"), "{why:?}");
        r.python = None;
        let ptx = ".version 8.5\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n.reg .b64 %rd<3>;\nmov.u64 %rd1, %globaltimer;\ntrap;\nret;\n}\n";
        let audit = audit_ptx(ptx);
        let trap = DeclaredCapability {
            name: Capability::Trap,
            reason: "bad launch shapes".into(),
        };
        r.capabilities = Some(CapabilityReport::of_modules(
            &[(DType::Bf16, Ok(audit.clone()))],
            std::slice::from_ref(&trap),
        ));
        let why = bit.evaluate(&r, DType::Bf16).unwrap_err();
        assert_eq!(
            why,
            vec![
                "reads a clock (%globaltimer) but the manifest does not declare capability `clock`"
            ]
        );
        let allow: Policy = "bit_exact,allow:clock".parse().unwrap();
        assert!(
            allow.evaluate(&r, DType::Bf16).is_err(),
            "undeclared stays refused"
        );
        let clock = DeclaredCapability {
            name: Capability::Clock,
            reason: "times its own phases".into(),
        };
        r.capabilities = Some(CapabilityReport::of_modules(
            &[(DType::Bf16, Ok(audit))],
            &[trap.clone(), clock],
        ));
        let why = bit.evaluate(&r, DType::Bf16).unwrap_err();
        assert!(why[0].contains("allow:clock"), "{why:?}");
        assert!(allow.evaluate(&r, DType::Bf16).is_ok());
        // Declared trap alone: passes a default policy.
        r.capabilities = Some(CapabilityReport::of_modules(
            &[(
                DType::Bf16,
                Ok(audit_ptx(&ptx.replace("mov.u64 %rd1, %globaltimer;", ""))),
            )],
            &[trap],
        ));
        assert!(bit.evaluate(&r, DType::Bf16).is_ok());
        assert!("bit_exact,audited"
            .parse::<Policy>()
            .unwrap()
            .evaluate(&r, DType::Bf16)
            .is_ok());
    }

    /// A verdict whose fields agree with each other, as the verifier's summaries do: no
    /// mismatch means no ulp distance and within tolerance, NaN parity as drawn.
    fn verdict(mismatches: u64, ulp: u64, flags: [bool; 5]) -> Verdict {
        let [nonfinite_parity, deterministic, batch_invariant, tolerance, integrity_ok] = flags;
        let mut v = report_with(0, 0).summary.overall;
        v.mismatches = mismatches;
        v.max_ulp = if mismatches == 0 { 0 } else { ulp.max(1) };
        v.nonfinite_parity = nonfinite_parity;
        v.deterministic = deterministic;
        v.batch_invariant = batch_invariant;
        v.within_tolerance = mismatches == 0 || tolerance;
        v.integrity_ok = integrity_ok;
        v
    }

    proptest::proptest! {
        /// Policies are monotone: a weaker requirement never refuses what a stronger one
        /// accepts, with the same modifiers (bit_exact >= ulp:N >= ulp:M for M >= N;
        /// bit_exact >= tolerance; bit_exact >= argmax), with and without a model-level
        /// measurement (a bit-exact kernel's keeps the argmax).
        #[test]
        fn a_weaker_policy_never_hands_out_less(
            mismatches in proptest::prop_oneof![proptest::strategy::Just(0u64), 1u64..1000],
            ulp in 0u64..8,
            flags in proptest::array::uniform5(proptest::bool::ANY),
            n in 0u64..6,
            m in 0u64..6,
            argmax in proptest::option::of(0.9f64..=1.0),
            modifiers in proptest::sample::select(vec!["", ",deterministic", ",batch_invariant", ",max_abs_diff=0.5"]),
        ) {
            let v = verdict(mismatches, ulp, flags);
            let mut model = report_with(0, 0);
            model.model = argmax
                .map(|a| model_report(if VerdictFacts::of(&v, &[], None).bit_exact() { 1.0 } else { a }))
                .into_iter()
                .collect();
            let models: Vec<&ModelReport> = model.model.iter().collect();
            let ok = |p: String| p.parse::<Policy>().unwrap()
                .evaluate_parts(Some(&v), &models, None, DType::Bf16).is_ok();
            let (lo, hi) = (n.min(m), n.max(m));
            let chains = [
                (format!("bit_exact{modifiers}"), format!("ulp:{lo}{modifiers}")),
                (format!("ulp:{lo}{modifiers}"), format!("ulp:{hi}{modifiers}")),
                (format!("bit_exact{modifiers}"), format!("tolerance{modifiers}")),
                (format!("bit_exact{modifiers}"), format!("argmax{modifiers}")),
            ];
            for (strong, weak) in chains {
                proptest::prop_assert!(!ok(strong.clone()) || ok(weak.clone()),
                    "{strong} accepts {v:?} but {weak} refuses it");
            }
        }
    }

    /// A model-level measurement in bf16 keeping the argmax at `fraction` of the tokens.
    fn model_report(fraction: f64) -> ModelReport {
        ModelReport {
            model_name: "tiny".into(),
            model_digest: "0".into(),
            dtype: DType::Bf16,
            tokens: 512,
            layers_replaced: 9,
            max_logit_abs_diff: if fraction < 1.0 { 0.1 } else { 0.0 },
            argmax_match_fraction: fraction,
            top5_overlap: 1.0,
            mean_kl: 0.0,
            eager_mean_top1_prob: None,
            adaptation: None,
        }
    }
}
