//! One verification: the suite of cases for a kernel, run through an `Executor`, turned into a
//! `VerificationReport` (summary by `Summary::from_cases`).

use crate::cases::{self, case_skeleton, CaseSpec, SUITE_VERSION};
use crate::exec::{ExecError, Executor, Limits};
use crate::python::{PythonExecutor, PythonOptions};
use crate::sandbox::SandboxExecutor;
use kernel_registry::capability::CapabilityReport;
use kernel_registry::report::{
    CaseReport, CaseStatus, DeviceInfo, KernelRef, ShapeRequest, Summary, VerificationReport,
    REPORT_SCHEMA_VERSION,
};
use kernel_registry::{DType, KernelBundle, Runtime};
use std::path::PathBuf;
use std::time::Instant;

/// After this many consecutive cases fail to run (timeouts, crashes), the rest of the suite
/// is recorded as not run rather than spending a time limit on each.
pub const MAX_CONSECUTIVE_ERRORS: usize = 3;

#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// Only these dtypes (default: every dtype the manifest has an entry for).
    pub dtypes: Option<Vec<DType>>,
    /// The smaller suite.
    pub quick: bool,
    /// Replay a run (default: a fresh seed).
    pub seed: Option<u64>,
    pub limits: Limits,
    /// Executable that serves `__sandbox` (default: this one).
    pub sandbox_exe: Option<PathBuf>,
    /// Shapes to verify besides the suite (each dtype); recorded in the report.
    pub shapes: Vec<ShapeRequest>,
    /// How a Python candidate's child is started (default: `PythonOptions::default()`).
    pub python: Option<PythonOptions>,
}

/// Where a verification stands, for progress bars.
#[derive(Debug, Clone)]
pub struct Progress {
    pub done: usize,
    pub total: usize,
    pub case_id: String,
    /// `None` when the case starts; a short outcome when it ends.
    pub outcome: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("no usable CUDA GPU: {0}")]
    NoGpu(String),
    #[error("the kernel does not compile: {0}")]
    Compile(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Exec(ExecError),
}

/// Verify `bundle` on this machine's GPU, each case in an isolated child process.
pub fn verify_bundle(
    bundle: &KernelBundle,
    opts: &VerifyOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<VerificationReport, VerifyError> {
    if !crate::cuda::gpu_available() {
        return Err(VerifyError::NoGpu(
            "the CUDA driver (libcuda.so.1) did not load or reports no device".into(),
        ));
    }
    let sandbox = SandboxExecutor::new(opts.sandbox_exe.clone()).map_err(VerifyError::Exec)?;
    match bundle.manifest.runtime {
        Runtime::Cuda => {
            let mut exec = sandbox;
            verify_with(&mut exec, bundle, opts, progress)
        }
        // The candidate in a Python child; the reference layers in the CUDA sandbox.
        Runtime::Python => {
            let mut exec = PythonExecutor::new(sandbox, opts.python.clone().unwrap_or_default())
                .map_err(VerifyError::Exec)?;
            verify_with(&mut exec, bundle, opts, progress)
        }
    }
}

/// The dtypes a run covers: the filter (each must have an entry) or all entries.
pub fn dtypes_for(bundle: &KernelBundle, opts: &VerifyOptions) -> Result<Vec<DType>, VerifyError> {
    let have = bundle.manifest.dtypes();
    match &opts.dtypes {
        None => Ok(have),
        Some(want) => {
            for d in want {
                if !have.contains(d) {
                    return Err(VerifyError::BadRequest(format!(
                        "{} has no entry for {d} (it has {})",
                        bundle.manifest.name,
                        have.iter()
                            .map(|d| d.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
            Ok(want.clone())
        }
    }
}

/// A short outcome line of a case for progress displays.
pub fn outcome(c: &CaseReport) -> String {
    match c.status {
        CaseStatus::NotApplicable => "n/a".into(),
        CaseStatus::Error => format!("ERROR {}", c.note.as_deref().unwrap_or("")),
        CaseStatus::Ran if !c.integrity_failures.is_empty() => {
            format!("INTEGRITY {}", c.integrity_failures[0])
        }
        CaseStatus::Ran => match &c.exactness {
            Some(e) if e.mismatches == 0 && e.nonfinite_parity => "exact".into(),
            Some(e) => format!("{} mismatches", e.mismatches),
            None => "ran".into(),
        },
    }
}

/// Cases that could not run in a row, and the last one's error: after
/// `MAX_CONSECUTIVE_ERRORS` the rest are not run.
#[derive(Default)]
struct Consecutive {
    errors: usize,
    last: String,
}

/// One case of a verification: not applicable, refused by the launch rule, not run after too
/// many errors in a row, or run by `exec`. A compile error or a missing GPU ends the
/// verification (`Err`).
fn run_one(
    exec: &mut dyn Executor,
    bundle: &KernelBundle,
    spec: &CaseSpec,
    opts: &VerifyOptions,
    device: &DeviceInfo,
    state: &mut Consecutive,
) -> Result<CaseReport, VerifyError> {
    let m = &bundle.manifest;
    if let Some(why) = m.not_applicable(spec.constraint_size(), Some(device.arch)) {
        return Ok(case_skeleton(spec, CaseStatus::NotApplicable, Some(why)));
    }
    if let (Runtime::Cuda, false, Err(why)) = (
        m.runtime,
        // a backward op's entries have the ABI's launch arithmetic, checked as they launch
        m.op.is_backward(),
        m.launch_dims(spec.rows, spec.cols, device.sm_count),
    ) {
        return Ok(case_skeleton(
            spec,
            CaseStatus::Error,
            Some(format!("launch rule: {why}")),
        ));
    }
    if state.errors >= MAX_CONSECUTIVE_ERRORS {
        return Ok(case_skeleton(
            spec,
            CaseStatus::Error,
            Some(format!(
                "not run: the previous {MAX_CONSECUTIVE_ERRORS} cases failed to run (last: {})",
                state.last
            )),
        ));
    }
    let t_case = Instant::now();
    let r = exec.run_case(bundle, spec, &opts.limits, device.copy_gbps);
    crate::trace(|| {
        format!(
            "case {} round trip {:.3} s",
            spec.id,
            t_case.elapsed().as_secs_f64()
        )
    });
    match r {
        Ok(c) => {
            state.errors = 0;
            Ok(c)
        }
        Err(ExecError::Compile { what, log }) => {
            Err(VerifyError::Compile(format!("{what}:\n{log}")))
        }
        Err(ExecError::Unavailable(s)) => Err(VerifyError::NoGpu(s)),
        Err(e) => {
            state.errors += 1;
            state.last = e.to_string();
            Ok(case_skeleton(spec, CaseStatus::Error, Some(e.to_string())))
        }
    }
}

/// Cases of at least this many elements have their host work started early.
const EARLY_MIN_ELEMENTS: u64 = 16 << 20;
/// At most this many bytes of them are held at once: their inputs and truths, estimated at
/// [`EARLY_BYTES_PER_ELEMENT`] (a backward f32 case's x and dy, its f64 dx and more).
const EARLY_MAX_BYTES: u64 = 8 << 30;
const EARLY_BYTES_PER_ELEMENT: u64 = 24;

/// The cases whose host work starts with the verification (`Executor::prefetch_early`): the
/// large ones, dtype by dtype in the order the cases will run when no module is ready sooner,
/// until [`EARLY_MAX_BYTES`].
fn early_cases(specs: &[CaseSpec], by_dtype: &[(DType, Vec<usize>)]) -> Vec<CaseSpec> {
    let mut bytes = 0u64;
    let mut out = Vec::new();
    for (_, idx) in by_dtype {
        for &i in idx {
            let s = &specs[i];
            let n = s.rows.saturating_mul(s.cols);
            if s.large_index || n < EARLY_MIN_ELEMENTS {
                continue;
            }
            bytes = bytes.saturating_add(n.saturating_mul(EARLY_BYTES_PER_ELEMENT));
            if bytes > EARLY_MAX_BYTES {
                return out;
            }
            out.push(s.clone());
        }
    }
    out
}

/// Verify through any executor (tests use a fake one).
pub fn verify_with(
    exec: &mut dyn Executor,
    bundle: &KernelBundle,
    opts: &VerifyOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<VerificationReport, VerifyError> {
    let t0 = Instant::now();
    let started_at = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let m = &bundle.manifest;
    let dtypes = dtypes_for(bundle, opts)?;
    let seed = opts.seed.unwrap_or_else(cases::fresh_seed);
    crate::trace(|| format!("verify {}: start", m.name));
    let device = exec.device_info().map_err(|e| match e {
        ExecError::Unavailable(s) => VerifyError::NoGpu(s),
        e => VerifyError::Exec(e),
    })?;
    crate::trace(|| "device info (child start, context, copy bandwidth) done".to_string());
    let specs = cases::suite(m.op, m.semantics, &dtypes, opts.quick, seed, &opts.shapes);
    let total = specs.len();
    // The cases of one dtype after another, the dtype whose module compiled first first (the
    // others compile meanwhile); the report keeps the suite's order.
    let mut by_dtype: Vec<(DType, Vec<usize>)> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        match by_dtype.iter_mut().find(|(d, _)| *d == spec.dtype) {
            Some((_, idx)) => idx.push(i),
            None => by_dtype.push((spec.dtype, vec![i])),
        }
    }
    // The largest cases' host work (inputs, f64 truths: tenths of a second each) starts now,
    // on half the host's cores, while the modules compile (`ahead::prefetch_early`).
    let applicable = |s: &CaseSpec| {
        m.not_applicable(s.constraint_size(), Some(device.arch))
            .is_none()
    };
    let early: Vec<CaseSpec> = early_cases(&specs, &by_dtype)
        .into_iter()
        .filter(|s| applicable(s))
        .collect();
    if !early.is_empty() {
        exec.prefetch_early(&early);
    }
    let mut slots: Vec<Option<CaseReport>> = (0..total).map(|_| None).collect();
    let mut state = Consecutive::default();
    let mut done = 0usize;
    while !by_dtype.is_empty() {
        let left: Vec<DType> = by_dtype.iter().map(|(d, _)| *d).collect();
        let pick = match exec.first_ready(bundle, &left) {
            Ok(d) => d,
            Err(e) => {
                crate::trace(|| format!("waiting for a compiled module: {e} (the suite's order)"));
                None
            }
        };
        let at = pick
            .and_then(|d| by_dtype.iter().position(|(x, _)| *x == d))
            .unwrap_or(0);
        let (dt, idx) = by_dtype.remove(at);
        crate::trace(|| format!("verify {}: the {dt} cases now", m.name));
        for (k, &i) in idx.iter().enumerate() {
            let spec = &specs[i];
            // the inputs of this dtype's next case drawn while this one runs (where it will run)
            if let Some(n) = idx.get(k + 1).map(|&n| &specs[n]) {
                if applicable(n) {
                    exec.prefetch(n);
                }
            }
            progress(&Progress {
                done,
                total,
                case_id: spec.id.clone(),
                outcome: None,
            });
            let report = run_one(exec, bundle, spec, opts, &device, &mut state)?;
            done += 1;
            progress(&Progress {
                done,
                total,
                case_id: spec.id.clone(),
                outcome: Some(outcome(&report)),
            });
            slots[i] = Some(report);
        }
    }
    let reports: Vec<CaseReport> = slots
        .into_iter()
        .map(|r| r.expect("every case of the suite ran"))
        .collect();
    crate::trace(|| format!("verify {}: {} cases done", m.name, reports.len()));
    // What the GPU ran, for clients that must run the same code. Every entry's module is loaded
    // here, also those of dtypes the run left out (a case waits only for its own dtype's): one
    // that does not compile rejects the kernel, as it would on its dtype's first case. Any other
    // failure here is not the kernel's.
    let compiled = match exec.compiled(bundle) {
        Err(ExecError::Compile { what, log }) => {
            return Err(VerifyError::Compile(format!("{what}:\n{log}")))
        }
        r => r.unwrap_or_default(),
    };
    let capabilities = audit(exec, bundle);
    let summary = Summary::from_cases(&reports);
    Ok(VerificationReport {
        schema_version: REPORT_SCHEMA_VERSION,
        kernel: KernelRef {
            name: m.name.clone(),
            version: m.version.to_string(),
            digest: bundle.digest(),
            op: m.op,
            semantics: m.semantics,
        },
        device,
        verifier_version: env!("CARGO_PKG_VERSION").to_string(),
        suite_version: SUITE_VERSION.to_string(),
        seed,
        quick: opts.quick,
        reference: format!(
            "kernelize built-in {}/{} (docs/reference-semantics.md)",
            m.op, m.semantics
        ),
        started_at,
        duration_s: t0.elapsed().as_secs_f64(),
        cases: reports,
        summary,
        model: vec![],
        model_notes: vec![],
        compiled,
        requested_shapes: opts.shapes.clone(),
        python: exec.python_runtime(),
        capabilities,
    })
}

/// The capability audit of a CUDA kernel's compiled modules (docs/spec.md section 3b), with
/// the manifest's declarations; `None` for a Python candidate (its code is not audited). A
/// module that could not be audited is said in the report's `notes` (and makes it
/// `audited: false`), never silently skipped.
fn audit(exec: &mut dyn Executor, bundle: &KernelBundle) -> Option<CapabilityReport> {
    let m = &bundle.manifest;
    if m.runtime != Runtime::Cuda {
        return None;
    }
    let mut modules = match exec.audits(bundle) {
        Ok(a) => a,
        Err(e) => m
            .dtypes()
            .into_iter()
            .map(|d| (d, Err(e.to_string())))
            .collect(),
    };
    for d in m.dtypes() {
        if !modules.iter().any(|(dt, _)| *dt == d) {
            modules.push((d, Err("the executor audited no module".to_string())));
        }
    }
    modules.sort_by_key(|(d, _)| *d);
    Some(CapabilityReport::of_modules(&modules, &m.capabilities))
}

#[cfg(test)]
mod tests {

    /// The early cases are the large ones (not the large-index case), dtype by dtype in the
    /// order the cases run, until the byte budget.
    #[test]
    fn early_cases_are_the_large_ones_in_run_order_within_the_budget() {
        let specs = cases::suite(
            kernel_registry::Op::RmsNormBackward,
            kernel_registry::Semantics::Llama,
            &[DType::Bf16, DType::F32],
            false,
            3,
            &[],
        );
        let mut by_dtype: Vec<(DType, Vec<usize>)> = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            match by_dtype.iter_mut().find(|(d, _)| *d == s.dtype) {
                Some((_, idx)) => idx.push(i),
                None => by_dtype.push((s.dtype, vec![i])),
            }
        }
        by_dtype.reverse(); // f32 first, as when its module compiles first
        let early = early_cases(&specs, &by_dtype);
        assert!(!early.is_empty());
        assert!(early
            .iter()
            .all(|s| !s.large_index && s.rows * s.cols >= EARLY_MIN_ELEMENTS));
        assert_eq!(
            early[0].dtype,
            DType::F32,
            "the dtype that runs first comes first"
        );
        let bytes: u64 = early
            .iter()
            .map(|s| s.rows * s.cols * EARLY_BYTES_PER_ELEMENT)
            .sum();
        assert!(bytes <= EARLY_MAX_BYTES);
        // the budget stops the list: the next large case would pass it
        let large = specs
            .iter()
            .filter(|s| !s.large_index && s.rows * s.cols >= EARLY_MIN_ELEMENTS)
            .count();
        assert!(early.len() < large, "{} of {large}", early.len());
    }

    use super::*;
    use crate::cases::CaseSpec;
    use kernel_registry::report::{tests_support, DeviceInfo, ExactnessClass};
    use kernel_registry::{Arch, Policy};

    const TOML: &str = r#"
name = "fake_rms"
version = "0.1.0"
op = "rms_norm"
semantics = "llama"
description = "test"
authors = ["t"]
license = "MIT"
source = "k.cu"

[entry]
bf16 = "k_bf16"
f32 = "k_f32"

[launch]
block = 256
grid = "per_row"

[constraints]
cols_max = 16384
"#;

    fn bundle() -> KernelBundle {
        KernelBundle::from_parts(
            TOML,
            "extern \"C\" __global__ void k_bf16() {}\nextern \"C\" __global__ void k_f32() {}",
        )
        .unwrap()
    }

    /// Answers every case like an exact kernel, except ids containing `fail_on` (a timeout)
    /// and f32 cases (one ulp off).
    struct Fake {
        fail_on: Option<&'static str>,
        calls: usize,
    }

    impl Executor for Fake {
        fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
            Ok(DeviceInfo {
                name: "Fake GPU".into(),
                arch: Arch::new(9, 0),
                sm_count: 132,
                driver_version: "0".into(),
                cuda_version: "13.0".into(),
                copy_gbps: 3000.0,
                threads_per_sm: None,
            })
        }
        fn run_case(
            &mut self,
            _b: &KernelBundle,
            spec: &CaseSpec,
            _l: &Limits,
            _c: f64,
        ) -> Result<CaseReport, ExecError> {
            self.calls += 1;
            if self.fail_on.is_some_and(|f| spec.id.contains(f)) {
                return Err(ExecError::Timeout {
                    what: spec.id.clone(),
                    limit_s: 5.0,
                });
            }
            let (m, u) = if spec.dtype == DType::F32 {
                (10, 1)
            } else {
                (0, 0)
            };
            let mut c = tests_support::case(&spec.id, spec.dtype, m, u);
            c.rows = spec.rows;
            c.cols = spec.cols;
            Ok(c)
        }
    }

    /// The cases of the dtype whose module compiled first run first (the executor is asked at
    /// each dtype's turn, with the dtypes still to run), and the report keeps the suite's order.
    #[test]
    fn the_dtype_compiled_first_runs_first_and_the_report_keeps_the_suite_order() {
        struct F32First {
            inner: Fake,
            ran: Vec<DType>,
            asked: Vec<Vec<DType>>,
        }
        impl Executor for F32First {
            fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
                self.inner.device_info()
            }
            fn run_case(
                &mut self,
                b: &KernelBundle,
                spec: &CaseSpec,
                l: &Limits,
                c: f64,
            ) -> Result<CaseReport, ExecError> {
                self.ran.push(spec.dtype);
                self.inner.run_case(b, spec, l, c)
            }
            fn first_ready(
                &mut self,
                _b: &KernelBundle,
                dtypes: &[DType],
            ) -> Result<Option<DType>, ExecError> {
                self.asked.push(dtypes.to_vec());
                Ok(dtypes.iter().copied().find(|d| *d == DType::F32))
            }
        }
        let opts = VerifyOptions {
            seed: Some(3),
            quick: true,
            ..Default::default()
        };
        let mut exec = F32First {
            inner: Fake {
                fail_on: None,
                calls: 0,
            },
            ran: Vec::new(),
            asked: Vec::new(),
        };
        let r = verify_with(&mut exec, &bundle(), &opts, &mut |_| {}).unwrap();
        let suite_order: Vec<DType> = r.cases.iter().map(|c| c.dtype).collect();
        assert_eq!(
            suite_order.first(),
            Some(&DType::Bf16),
            "the suite starts with bf16"
        );
        assert_eq!(
            exec.ran.first(),
            Some(&DType::F32),
            "f32 compiled first, ran first"
        );
        let f32s = exec.ran.iter().filter(|d| **d == DType::F32).count();
        assert!(
            exec.ran[..f32s].iter().all(|d| *d == DType::F32),
            "f32's cases together"
        );
        let applicable = r.cases.iter();
        let applicable = applicable.filter(|c| c.status != CaseStatus::NotApplicable);
        assert_eq!(exec.ran.len(), applicable.count());
        assert_eq!(
            exec.asked,
            vec![vec![DType::Bf16, DType::F32], vec![DType::Bf16]]
        );
        let ids: Vec<String> = cases::suite(
            r.kernel.op,
            r.kernel.semantics,
            &[DType::Bf16, DType::F32],
            true,
            3,
            &[],
        )
        .into_iter()
        .map(|c| c.id)
        .collect();
        let got: Vec<String> = r.cases.iter().map(|c| c.id.clone()).collect();
        assert_eq!(got, ids, "the report in the suite's order");
    }

    /// `Fake` whose modules audit as `audits` says.
    struct Audited(Fake, Vec<kernel_registry::capability::ModuleAudit>);

    impl Executor for Audited {
        fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
            self.0.device_info()
        }
        fn run_case(
            &mut self,
            b: &KernelBundle,
            spec: &CaseSpec,
            l: &Limits,
            c: f64,
        ) -> Result<CaseReport, ExecError> {
            self.0.run_case(b, spec, l, c)
        }
        fn audits(
            &mut self,
            _b: &KernelBundle,
        ) -> Result<Vec<kernel_registry::capability::ModuleAudit>, ExecError> {
            Ok(self.1.clone())
        }
    }

    /// The report carries the audit of every module with the manifest's declarations; an
    /// executor that audits nothing (or a module it could not audit) gives `audited: false`
    /// with a note per dtype, never a clean audit.
    #[test]
    fn the_report_carries_the_capability_audit() {
        use kernel_registry::capability::{audit_ptx, Capability};
        let opts = VerifyOptions {
            seed: Some(5),
            quick: true,
            ..Default::default()
        };
        let fake = || Fake {
            fail_on: None,
            calls: 0,
        };
        let r = verify_with(&mut fake(), &bundle(), &opts, &mut |_| {}).unwrap();
        let c = r.capabilities.as_ref().unwrap();
        assert!(!c.audited);
        assert_eq!(c.notes.len(), 2, "{:?}", c.notes);
        let ptx = |body: &str| {
            audit_ptx(&format!(
                ".version 8.5\n.target sm_90\n.address_size 64\n.visible .entry k()\n{{\n.reg .b64 %rd<3>;\n{body}\nret;\n}}\n"
            ))
        };
        let toml =
            format!("{TOML}\n[[capability]]\nname = \"trap\"\nreason = \"bad launch shapes\"\n");
        let b = KernelBundle::from_parts(
            &toml,
            "extern \"C\" __global__ void k_bf16() {}\nextern \"C\" __global__ void k_f32() {}",
        )
        .unwrap();
        let mut exec = Audited(
            fake(),
            vec![
                (DType::Bf16, Ok(ptx("trap;"))),
                (DType::F32, Ok(ptx("mov.u64 %rd1, %clock64;\ntrap;"))),
            ],
        );
        let r = verify_with(&mut exec, &b, &opts, &mut |_| {}).unwrap();
        let c = r.capabilities.as_ref().unwrap();
        assert!(c.audited && c.notes.is_empty());
        assert_eq!(c.found_names(), vec![Capability::Clock, Capability::Trap]);
        assert_eq!(c.found[0].dtypes, vec![DType::F32]);
        assert_eq!(c.declared, b.manifest.capabilities);
        // The policy refuses the undeclared clock, in every dtype (the audit is the kernel's).
        let why = "ulp:1"
            .parse::<Policy>()
            .unwrap()
            .evaluate(&r, DType::Bf16)
            .unwrap_err();
        assert_eq!(
            why,
            vec!["reads a clock (%clock64) but the manifest does not declare capability `clock`"]
        );
    }

    /// A backward kernel is verified with the backward suite (docs/spec.md section 2c): its
    /// cases reach the executor with their backward shapes and the report is of its op.
    #[test]
    fn a_backward_kernel_runs_the_backward_suite() {
        let toml = r#"
name = "fake_rms_bwd"
version = "0.1.0"
op = "rms_norm_backward"
description = "test"
authors = ["t"]
license = "MIT"
source = "k.cu"
[entry.bf16]
dx = "k_dx"
dwp = "k_dwp"
dw = "k_dw"
"#;
        let b = KernelBundle::from_parts(toml, "k_dx k_dwp k_dw").unwrap();
        let mut fake = Fake {
            fail_on: None,
            calls: 0,
        };
        let r = verify_with(&mut fake, &b, &VerifyOptions::default(), &mut |_| {}).unwrap();
        assert_eq!(r.kernel.op, kernel_registry::Op::RmsNormBackward);
        assert_eq!(fake.calls, r.cases.len());
        assert!(
            r.cases.iter().any(|c| c.id == "bf16/1021x4096/normal"),
            "the global reduce's shape"
        );
        assert!(r.cases.iter().all(|c| !c.id.ends_with("large_index")));
    }

    /// The bundled backward kernel `name` verified (with a fake executor) by the full suite: its
    /// op, one call per case, no large-index case, and every dtype's cases of ids `ids`.
    fn bundled_backward_suite(
        name: &str,
        op: kernel_registry::Op,
        ids: &[&str],
    ) -> VerificationReport {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../kernels")
            .join(name);
        let b = KernelBundle::load_dir(&dir).unwrap();
        let mut fake = Fake {
            fail_on: None,
            calls: 0,
        };
        let r = verify_with(&mut fake, &b, &VerifyOptions::default(), &mut |_| {}).unwrap();
        assert_eq!(r.kernel.op, op);
        assert_eq!(fake.calls, r.cases.len());
        for dt in DType::ALL {
            for id in ids {
                assert!(
                    r.cases.iter().any(|c| c.id == format!("{dt}/{id}")),
                    "{dt}/{id}"
                );
            }
        }
        assert!(r.cases.iter().all(|c| !c.id.ends_with("large_index")));
        r
    }

    /// The gated backward kernels (kernels/silu_mul_backward, kernels/gelu_tanh_mul_backward)
    /// are verified with their backward suite: every dtype, the scalar tails' shapes.
    #[test]
    fn the_bundled_gated_backward_kernels_run_their_backward_suite() {
        for (name, op) in [
            ("silu_mul_backward", kernel_registry::Op::SiluMulBackward),
            (
                "gelu_tanh_mul_backward",
                kernel_registry::Op::GeluTanhMulBackward,
            ),
        ] {
            let ids = ["1x1/normal", "1x7/normal", "3x5/normal", "1500x1001/normal"];
            bundled_backward_suite(name, op, &ids);
        }
    }

    /// The bundled rms_norm_backward kernels (kernels/rms_norm_llama_backward,
    /// kernels/rms_norm_gemma_backward and kernels/rms_norm_torch_backward) are verified with the backward suite of their own
    /// semantics (the reference entries `ref_rms_norm_backward_<sem>_*`, gemma's weights around 0):
    /// every dtype, the column sum's order changes.
    #[test]
    fn the_bundled_rms_norm_backward_kernels_run_their_backward_suite() {
        for (name, sem) in [
            ("rms_norm_llama_backward", kernel_registry::Semantics::Llama),
            ("rms_norm_gemma_backward", kernel_registry::Semantics::Gemma),
            ("rms_norm_torch_backward", kernel_registry::Semantics::Torch),
        ] {
            let ids = ["1020x4096/normal", "1021x4096/normal", "1500x1001/normal"];
            let r = bundled_backward_suite(name, kernel_registry::Op::RmsNormBackward, &ids);
            assert_eq!(r.kernel.semantics, sem, "{name}");
            assert!(
                r.reference.contains(&format!("rms_norm_backward/{sem}")),
                "{name}: {}",
                r.reference
            );
        }
    }

    /// The bundled fused_add_rms_norm_backward kernel (kernels/fused_add_rms_norm_backward) is
    /// verified with rms_norm_backward's shapes (the column sum's order changes), every dtype,
    /// against its own reference entries.
    #[test]
    fn the_bundled_fused_add_rms_norm_backward_kernel_runs_its_backward_suite() {
        let ids = ["1020x4096/normal", "1021x4096/normal", "1500x1001/normal"];
        let r = bundled_backward_suite(
            "fused_add_rms_norm_backward",
            kernel_registry::Op::FusedAddRmsNormBackward,
            &ids,
        );
        assert!(
            r.reference.contains("fused_add_rms_norm_backward"),
            "{}",
            r.reference
        );
    }

    /// The bundled layer_norm_backward kernel (kernels/layer_norm_backward) is verified with
    /// its backward suite: every dtype, eager's chain-count boundaries, at most 65536 rows.
    #[test]
    fn the_bundled_layer_norm_backward_kernel_runs_its_backward_suite() {
        let ids = ["63x1000/normal", "64x4096/normal", "65536x64/normal"];
        let r = bundled_backward_suite(
            "layer_norm_backward",
            kernel_registry::Op::LayerNormBackward,
            &ids,
        );
        assert!(r.cases.iter().all(|c| c.rows <= 65536));
    }

    #[test]
    fn not_applicable_cases_are_not_run_and_summary_is_derived() {
        use kernel_registry::capability::Audit;
        // modules that audit clean (an executor that audits nothing: below)
        let clean = vec![
            (DType::Bf16, Ok(Audit::default())),
            (DType::F32, Ok(Audit::default())),
        ];
        let mut audited = Audited(
            Fake {
                fail_on: None,
                calls: 0,
            },
            clean,
        );
        let opts = VerifyOptions {
            seed: Some(5),
            ..Default::default()
        };
        let r = verify_with(&mut audited, &bundle(), &opts, &mut |_| {}).unwrap();
        let fake = &audited.0;
        let na: Vec<_> = r
            .cases
            .iter()
            .filter(|c| c.status == CaseStatus::NotApplicable)
            .collect();
        assert!(!na.is_empty() && na.iter().all(|c| c.cols > 16384));
        assert_eq!(fake.calls, r.cases.len() - na.len());
        assert_eq!(r.seed, 5);
        assert_eq!(r.summary, Summary::from_cases(&r.cases));
        assert_eq!(
            r.summary.per_dtype[&DType::Bf16].class,
            ExactnessClass::BitExact
        );
        assert_eq!(
            r.summary.per_dtype[&DType::F32].class,
            ExactnessClass::MaxUlp(1)
        );
        // The report round-trips through JSON.
        let j = serde_json::to_string(&r).unwrap();
        let back: VerificationReport = serde_json::from_str(&j).unwrap();
        assert_eq!(back, r);
        // Policies evaluate on it.
        let bit: Policy = "bit_exact".parse().unwrap();
        assert!(bit.evaluate(&r, DType::Bf16).is_ok());
        assert!(bit.evaluate(&r, DType::F32).is_err());
        assert!("ulp:1"
            .parse::<Policy>()
            .unwrap()
            .evaluate(&r, DType::F32)
            .is_ok());
        // The same cases with no module audited: every policy refuses it, saying why.
        let mut fake = Fake {
            fail_on: None,
            calls: 0,
        };
        let u = verify_with(&mut fake, &bundle(), &opts, &mut |_| {}).unwrap();
        let why = bit.evaluate(&u, DType::Bf16).unwrap_err();
        assert!(
            why.iter().any(|w| w.contains("could not be audited")),
            "{why:?}"
        );
    }

    #[test]
    fn a_failing_case_is_an_error_and_the_run_goes_on() {
        let mut fake = Fake {
            fail_on: Some("/1024x4096/"),
            calls: 0,
        };
        let opts = VerifyOptions {
            dtypes: Some(vec![DType::Bf16]),
            quick: true,
            seed: Some(1),
            ..Default::default()
        };
        let r = verify_with(&mut fake, &bundle(), &opts, &mut |_| {}).unwrap();
        let bad = r.cases.iter().find(|c| c.id.contains("1024x4096")).unwrap();
        assert_eq!(bad.status, CaseStatus::Error);
        assert!(bad
            .note
            .as_deref()
            .unwrap()
            .contains("did not finish within 5 s"));
        let after = r
            .cases
            .iter()
            .skip_while(|c| c.id != bad.id)
            .nth(1)
            .unwrap();
        assert_eq!(after.status, CaseStatus::Ran);
        assert!(!r.summary.overall.integrity_ok);
        assert_eq!(r.summary.overall.class, ExactnessClass::Fails);
    }

    #[test]
    fn repeated_failures_stop_the_run_and_same_seed_replays() {
        let mut fake = Fake {
            fail_on: Some("bf16"),
            calls: 0,
        };
        let opts = VerifyOptions {
            dtypes: Some(vec![DType::Bf16]),
            quick: true,
            seed: Some(9),
            ..Default::default()
        };
        let r = verify_with(&mut fake, &bundle(), &opts, &mut |_| {}).unwrap();
        assert_eq!(fake.calls, MAX_CONSECUTIVE_ERRORS);
        assert!(r
            .cases
            .iter()
            .filter(|c| c.status == CaseStatus::Error)
            .skip(MAX_CONSECUTIVE_ERRORS)
            .all(|c| c.note.as_deref().unwrap().starts_with("not run")));
        assert_eq!(r.summary.overall.cases_run, 0);
        let r2 = verify_with(&mut fake, &bundle(), &opts, &mut |_| {}).unwrap();
        let ids = |r: &VerificationReport| r.cases.iter().map(|c| c.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&r), ids(&r2));
    }

    /// A module that does not compile rejects the kernel even when the run leaves its dtype out
    /// (the cases compile only their own dtypes' modules; `compiled` loads every entry's).
    #[test]
    fn an_entry_that_does_not_compile_rejects_the_kernel_in_any_dtype_filter() {
        struct BrokenF32(Fake);
        impl Executor for BrokenF32 {
            fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
                self.0.device_info()
            }
            fn run_case(
                &mut self,
                b: &KernelBundle,
                spec: &CaseSpec,
                l: &Limits,
                c: f64,
            ) -> Result<CaseReport, ExecError> {
                self.0.run_case(b, spec, l, c)
            }
            fn compiled(
                &mut self,
                _b: &KernelBundle,
            ) -> Result<Vec<kernel_registry::report::CompiledModule>, ExecError> {
                Err(ExecError::Compile {
                    what: "k (f32)".into(),
                    log: "error: expected a ';'".into(),
                })
            }
        }
        let opts = VerifyOptions {
            dtypes: Some(vec![DType::Bf16]),
            quick: true,
            ..Default::default()
        };
        let mut exec = BrokenF32(Fake {
            fail_on: None,
            calls: 0,
        });
        match verify_with(&mut exec, &bundle(), &opts, &mut |_| {}) {
            Err(VerifyError::Compile(log)) => assert!(log.contains("k (f32)"), "{log}"),
            other => panic!("{:?}", other.map(|r| r.summary)),
        }
        assert!(exec.0.calls > 0, "the bf16 cases ran first");
    }

    #[test]
    fn unknown_dtype_filter_is_refused() {
        let opts = VerifyOptions {
            dtypes: Some(vec![DType::F16]),
            ..Default::default()
        };
        let e = dtypes_for(&bundle(), &opts).unwrap_err().to_string();
        assert!(e.contains("no entry for f16"), "{e}");
    }
}
