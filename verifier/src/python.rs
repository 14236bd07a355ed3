//! Python candidates (docs/spec.md section 2b): an `Executor` that runs a candidate's function in a child Python
//! process (`python_runner.py`, one typed JSON-lines protocol: `PyRequest` / `PyResponse`) on the
//! inputs the CUDA case runner gives CUDA candidates (`cases::generate`: same seeds, eps and
//! shapes), and measures it here with the same code: exactness and determinism (`numeric`),
//! accuracy (`oracle`), batch invariance (`measure::batch::plan`'s compositions), speed
//! (`measure::speed`, same roofline). The reference layer's outputs and time come from a
//! `ReferenceLayers` (on a GPU: the CUDA sandbox), so the suite, reports, policies and storage do
//! not care which runtime a kernel uses.
//!
//! A backward op's candidate (docs/spec.md section 2b's backward signatures) goes through the
//! same child: every input in its own dtype, its gradients returned as a tuple and checked one by
//! one (`PyCase::outputs`), batches only where no gradient sums the rows, and timed calls that
//! negate the incoming gradients where rows cannot be rotated ([`PythonExecutor::run_candidate`]).
//! Its gradients are judged against the reference layers' (`ReferenceLayers::reference_backward`:
//! on a GPU the sandbox's `Request::ReferenceBackward`) by the function a CUDA candidate's
//! backward case uses (`measure::gradients::verdict`), so `CaseReport::gradients` means the same
//! for both runtimes (docs/backward.md, "What the verifier lacks", items 5 and 6).
//!
//! Isolation (docs/python-candidates.md): the child runs in a private temporary directory with a
//! scrubbed environment, in a network namespace of its own where the kernel allows one (Linux
//! user namespaces), under an RLIMIT_DATA memory limit and a time limit per case; a crash or a
//! hang kills that child only, the case is an error and the run goes on with a fresh child.

use crate::cases::{self, CaseInputs, CaseSpec, HostTensor};
use crate::child::ChildProc;
use crate::exec::{ExecError, Executor, Limits};
use crate::gpu::{BackwardReferenceOutputs, ReferenceOutputs};
use crate::measure::{address, batch, determinism, integrity, speed};
use crate::numeric::{compare, worst};
use crate::oracle;
use kernel_registry::report::{CaseReport, CaseStatus, DeviceInfo, PythonRuntime};
use kernel_registry::{DType, Digest, KernelBundle, Op, Runtime};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

/// The child's program, written into the private directory at start.
pub const RUNNER_SOURCE: &str = include_str!("python_runner.py");

/// The confinement check both programs that run a Python candidate's code make of themselves
/// before they load it (the runner above and the model-level harness, `crate::model`), written
/// beside each as [`CONFINEMENT_FILE`].
pub const CONFINEMENT_SOURCE: &str = include_str!("confinement.py");
/// The name the confinement check is written under, beside the program that loads it.
pub const CONFINEMENT_FILE: &str = "kernelize_confinement.py";

/// Where the candidate's tensors run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PyDevice {
    Cuda,
    /// Protocol tests without a GPU (torch on the CPU).
    Cpu,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PyRequest {
    /// Import torch and the candidate's source; answer `Loaded`.
    Load {
        source_path: PathBuf,
        entries: BTreeMap<DType, String>,
        /// A backward candidate's setup functions ([`Manifest::setup`](kernel_registry::Manifest)),
        /// checked callable at import as the entries are.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        setup: BTreeMap<DType, String>,
        package_dirs: Vec<PathBuf>,
        requires: Vec<String>,
        device: PyDevice,
        /// Refuse (`PyFailureKind::Isolation`) before anything of the candidate is loaded when
        /// the child is not network-isolated.
        #[serde(default)]
        require_network_isolation: bool,
    },
    Case(PyCase),
}

/// One tensor file of a case: `dir/NAME.bin`, raw little-endian elements of `dtype` (the case's,
/// but f32 for layer_norm_backward's `mean` and `rstd` in every dtype).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyTensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    /// Its first dimension is the case's rows (`x`, `dy`, `mean`; not `weight` or a one-row
    /// gradient): a batch takes its rows, and the timed calls rotate them.
    #[serde(default)]
    pub rowwise: bool,
}

/// A batch composition of `measure::batch::plan`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyComposition {
    pub name: String,
    pub batches: Vec<Vec<u64>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyCase {
    pub function: String,
    pub dtype: DType,
    pub rows: u64,
    pub cols: u64,
    pub eps: f32,
    pub dir: PathBuf,
    pub inputs: Vec<PyTensor>,
    /// The function's arguments in order: input names, and `eps`.
    pub args: Vec<String>,
    /// A backward candidate's setup function (`[setup]`), run on `setup_args` before each call
    /// (outside the timed region); its result is the function's last argument.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
    /// The setup's arguments ([`setup_args`]), by name, in `args` order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup_args: Vec<String>,
    /// What the function returns, in order ([`python_outputs`]): a forward op's `out`, a
    /// backward op's gradients. A `rowwise` one has the rows of the call (a batch's in a batch).
    pub outputs: Vec<PyTensor>,
    /// The function returns a tuple of `outputs` (a backward op; one gradient may also come
    /// bare), not one tensor.
    pub returns_tuple: bool,
    /// The inputs every output is odd in ([`incoming_gradients`]: a backward op's `dy`, `dres`):
    /// where the timed calls cannot rotate the rows (an output sums them, or one row), every
    /// other timed call gets them negated and must give every output negated.
    #[serde(default)]
    pub negate: Vec<String>,
    /// Inputs the op updates in place (fused_add_rms_norm's residual); restored before each
    /// call and written after it as `NAME{k}.bin`.
    pub mutable: Vec<String>,
    /// Calls whose outputs are written as `NAME{k}.bin` (3: determinism and the poison pair).
    pub launches: u32,
    pub poison_seed: u64,
    pub compositions: Vec<PyComposition>,
    /// Timed calls (0: speed not measured).
    pub speed_reps: u32,
    /// The address cases (`measure::address::plan` over the inputs, in `inputs` order): each
    /// placement's address residue of every input, modulo `address_period` bytes.
    #[serde(default)]
    pub placements: Vec<Vec<u64>>,
    #[serde(default)]
    pub address_period: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PyResponse {
    Loaded(PyLoaded),
    Case(PyCaseResult),
    Error(PyFailure),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyLoaded {
    pub python: String,
    pub torch: String,
    pub packages: BTreeMap<String, String>,
    /// What isolation the child found itself in (network, directory, memory).
    pub isolation: Vec<String>,
    /// The GPU the candidate's tensors are on, read before anything of the candidate was
    /// loaded (`None` on the CPU, or from a runner without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<PyDeviceFigures>,
}

/// The figures of the child's GPU (`torch.cuda.get_device_properties`) that a backward verdict
/// depends on (`Op::verdict_depends_on_device`: rms_norm_backward's dw order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyDeviceFigures {
    pub name: String,
    /// `multi_processor_count`.
    pub sms: u64,
    /// `max_threads_per_multi_processor` (`None` where this torch does not say).
    pub threads_per_sm: Option<u64>,
}

/// Why a backward case's verdict cannot stand on these devices: the reference's gradients came
/// from a device (`reference`: its SMs and threads per SM, `BackwardReferenceOutputs`) other
/// than the one the report names (`report`: `device_info`, keyed by the hub) or other than the
/// candidate's GPU (`child`, where the child runs on one). Only for ops whose verdict depends
/// on the device (`Op::verdict_depends_on_device`); `None` where they agree or are not known.
pub fn device_mismatch(
    op: Op,
    report: Option<&DeviceInfo>,
    child: Option<&PyDeviceFigures>,
    reference: (u64, u64),
) -> Option<String> {
    if !op.verdict_depends_on_device() {
        return None;
    }
    let (sms, tps) = reference;
    let said = |s: u64, t: Option<u64>| match t {
        Some(t) => format!("{s} SMs of {t} threads"),
        None => format!("{s} SMs"),
    };
    let differs = |s: u64, t: Option<u64>| s != sms || t.is_some_and(|t| t != tps);
    if let Some(d) = report {
        let t = d.threads_per_sm.map(u64::from);
        if differs(d.sm_count as u64, t) {
            return Some(format!(
                "{op}: the reference ran on a device of {}, the report's device ({}) has {}",
                said(sms, Some(tps)),
                d.name,
                said(d.sm_count as u64, t)
            ));
        }
    }
    if let Some(c) = child {
        if differs(c.sms, c.threads_per_sm) {
            return Some(format!(
                "{op}: the candidate ran on {} with {}, the reference on a device of {}: its verdict depends on the device's SMs and threads per SM",
                c.name,
                said(c.sms, c.threads_per_sm),
                said(sms, Some(tps))
            ));
        }
    }
    None
}

/// An output some elements of which the candidate never wrote (launch 2's bits the exact
/// complement of launch 1's poison).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyUnwritten {
    /// The output's name (`out`, `dx`, `dw`).
    pub tensor: String,
    pub count: u64,
    pub first: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyTimed {
    pub median_us: f64,
    /// Timed calls an output of which differed from what the first call gives.
    pub bad: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyCaseResult {
    /// Output file names (without `.bin`): per launch, one per output of the case, in its
    /// `outputs` order (`out0`; `dx0`, `dw0`).
    pub outputs: Vec<Vec<String>>,
    /// Integrity failures the child saw (inputs modified, memory handed back).
    pub integrity: Vec<String>,
    /// Every output with elements never written.
    pub unwritten: Vec<PyUnwritten>,
    /// The first row that differed in another batch composition, said plainly.
    pub batch: Option<String>,
    pub timed: Option<PyTimed>,
    /// The first placement of the address cases whose outputs differed from the first call's.
    #[serde(default)]
    pub address: Option<PyAddress>,
}

/// What the address cases of a Python candidate found (`measure::address`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyAddress {
    /// Index into the case's `placements`.
    pub placement: usize,
    /// How many placements differed.
    pub differing: usize,
    pub diffs: Vec<PyDifference>,
}

/// `measure::address::Difference` as the runner writes it (`max_abs_diff` null where no finite
/// pair differs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyDifference {
    pub tensor: String,
    pub differ: u64,
    pub elements: u64,
    pub first: u64,
    pub max_abs_diff: Option<f64>,
}

/// Why the child could not give a case's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PyFailureKind {
    /// torch, a package or the source did not import, or an entry is missing.
    Import,
    /// The candidate raised.
    Exception,
    /// Not a tensor, or the wrong shape, dtype or device.
    WrongOutput,
    Protocol,
    /// A bug of the runner.
    Runner,
    /// Network isolation was required and the child is not isolated: nothing of the candidate
    /// was loaded.
    Isolation,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyFailure {
    pub kind: PyFailureKind,
    pub message: String,
}

/// The reference layers for cases measured in another process.
pub trait ReferenceLayers {
    fn device_info(&mut self) -> Result<DeviceInfo, ExecError>;
    /// The reference's outputs on `spec`'s inputs (`inputs` is `cases::generate(spec)`), and its
    /// median time over `reps` runs when `reps > 0`; `dir` is a private folder for files.
    fn reference(
        &mut self,
        spec: &CaseSpec,
        inputs: &CaseInputs,
        reps: u32,
        dir: &Path,
    ) -> Result<ReferenceOutputs, ExecError>;
    /// A backward op's reference layers on `spec`'s inputs (its entries in stage order): every
    /// gradient in [`Op::gradients`] order, the median time over `reps` runs when `reps > 0`,
    /// and the SMs and threads per SM of the device they ran on. Reference layers without
    /// backward ones (test fakes of forward ops) answer that they have none.
    fn reference_backward(
        &mut self,
        spec: &CaseSpec,
        _inputs: &CaseInputs,
        _reps: u32,
        _dir: &Path,
    ) -> Result<BackwardReferenceOutputs, ExecError> {
        Err(ExecError::Sandbox(format!(
            "{}: these reference layers have no backward ones ({})",
            spec.id, spec.op
        )))
    }
}

/// The Python signature's arguments of `op` (docs/spec.md section 2b table), as names of `CaseInputs`' tensors
/// (`HostTensor::name`: a gated op's `x` is named `gate`) and `eps`.
///
/// A backward op's are its CUDA ABI's inputs ([`Op::stages`]: every stage's tensors that are
/// neither a gradient nor the workspace, in order of first appearance, the weight `w` named
/// `weight` as `CaseInputs` names it), then `eps` where the op takes it; the function returns
/// the gradients ([`python_outputs`]).
pub fn python_args(op: Op) -> &'static [&'static str] {
    match op {
        Op::RmsNorm => &["x", "weight", "eps"],
        Op::FusedAddRmsNorm => &["x", "residual", "weight", "eps"],
        Op::LayerNorm => &["x", "weight", "bias", "eps"],
        Op::FusedAddLayerNorm => &["x", "residual", "weight", "bias", "eps"],
        Op::Silu | Op::Gelu | Op::GeluTanh | Op::SiluAndMul => &["x"],
        Op::SiluMul | Op::GeluTanhMul => &["gate", "up"],
        Op::RmsNormBackward => &["dy", "x", "weight", "eps"],
        Op::FusedAddRmsNormBackward => &["dy", "dres", "x", "weight", "eps"],
        Op::LayerNormBackward => &["dy", "x", "mean", "rstd", "weight"],
        Op::SiluMulBackward | Op::GeluTanhMulBackward => &["dy", "gate", "up"],
        Op::SiluBackward | Op::GeluBackward | Op::GeluTanhBackward => &["dy", "x"],
    }
}

/// The inputs of a backward op that are incoming gradients: [`Op::incoming_gradients`] (the one
/// home of the rule; the Python client's backward_field reads it through abi.json).
pub fn incoming_gradients(op: Op) -> &'static [&'static str] {
    op.incoming_gradients()
}

/// The arguments of a backward candidate's setup function (`[setup]`, docs/spec.md section 2b):
/// its signature's ([`python_args`]) less the incoming gradients ([`incoming_gradients`]), in
/// order: what a forward had (rms_norm_backward: `x`, `weight`, `eps`).
pub fn setup_args(op: Op) -> Vec<&'static str> {
    python_args(op)
        .iter()
        .copied()
        .filter(|a| !incoming_gradients(op).contains(a))
        .collect()
}

/// What the Python function of `op` returns, in order: a forward op's one tensor `out`; a
/// backward op's gradients ([`Op::gradients`]: a tuple, `dx` then `dw` for rms_norm_backward).
pub fn python_outputs(op: Op) -> Vec<&'static str> {
    if op.is_backward() {
        op.gradients().iter().map(|g| g.name).collect()
    } else {
        vec!["out"]
    }
}

/// How the child is started and confined.
#[derive(Debug, Clone)]
pub struct PythonOptions {
    /// The interpreter (`python3` on PATH by default).
    pub python: PathBuf,
    pub device: PyDevice,
    /// Folders put first on the child's `sys.path` (packages installed with `pip --target`).
    pub package_dirs: Vec<PathBuf>,
    /// RLIMIT_DATA of the child (host memory it may map writable); `None`: unlimited.
    pub memory_limit_bytes: Option<u64>,
    /// A case's whole exchange (import and compilation on the first, every call, batches and
    /// timed calls) must finish within this, or the child is killed.
    pub case_limit: Duration,
    /// Refuse to run when the child cannot get a network namespace of its own.
    pub require_network_isolation: bool,
}

impl Default for PythonOptions {
    fn default() -> Self {
        PythonOptions {
            python: PathBuf::from("python3"),
            device: PyDevice::Cuda,
            package_dirs: Vec::new(),
            memory_limit_bytes: Some(32 << 30),
            case_limit: Duration::from_secs(300),
            require_network_isolation: false,
        }
    }
}

/// Runs Python candidates; the reference layers come from `R`.
pub struct PythonExecutor<R: ReferenceLayers> {
    pub opts: PythonOptions,
    reference: R,
    work: tempfile::TempDir,
    child: Option<ChildProc>,
    /// The candidate the child has loaded.
    loaded: Option<Digest>,
    runtime: Option<PyLoaded>,
    /// The device `device_info` reported (the report's, which the hub keys a verdict by).
    device: Option<DeviceInfo>,
    /// Children started so far (the first, and one after each crash or hang).
    pub children_started: u32,
}

impl<R: ReferenceLayers> PythonExecutor<R> {
    pub fn new(reference: R, opts: PythonOptions) -> Result<Self, ExecError> {
        let work = tempfile::Builder::new()
            .prefix("kernelize-python-")
            .tempdir()
            .map_err(|e| ExecError::Sandbox(format!("cannot make a private directory: {e}")))?;
        Ok(PythonExecutor {
            opts,
            reference,
            work,
            child: None,
            loaded: None,
            runtime: None,
            device: None,
            children_started: 0,
        })
    }

    /// The GPU figures the loaded child read of its device (`None` before a candidate is
    /// loaded, and on the CPU).
    pub fn child_device(&self) -> Option<&PyDeviceFigures> {
        self.runtime.as_ref().and_then(|l| l.device.as_ref())
    }

    fn spawn(&mut self) -> Result<(), ExecError> {
        let home = self.work.path().join("home");
        std::fs::create_dir_all(&home)
            .map_err(|e| ExecError::Sandbox(format!("cannot make {}: {e}", home.display())))?;
        // Written anew for every child: an earlier child ran the candidate's code as the same
        // user and may have replaced the file (then crashed to have its runner started).
        std::fs::write(self.work.path().join("runner.py"), RUNNER_SOURCE)
            .and_then(|_| {
                std::fs::write(self.work.path().join(CONFINEMENT_FILE), CONFINEMENT_SOURCE)
            })
            .map_err(|e| ExecError::Sandbox(format!("cannot write the runner: {e}")))?;
        let mut cmd = confined_python(&self.opts.python, &home, self.opts.memory_limit_bytes);
        cmd.arg(self.work.path().join("runner.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().map_err(|e| {
            ExecError::Sandbox(format!(
                "cannot start {} for the Python candidate: {e}",
                self.opts.python.display()
            ))
        })?;
        self.children_started += 1;
        self.child = Some(ChildProc::attach(child, "the Python child", 3000, false).in_own_group());
        self.loaded = None;
        Ok(())
    }

    /// One request, one answer; a child that hangs past `limit` or dies is killed and gone.
    fn call(
        &mut self,
        req: &PyRequest,
        what: &str,
        limit: Duration,
    ) -> Result<PyResponse, ExecError> {
        if self.child.is_none() {
            self.spawn()?;
        }
        let child = self.child.as_mut().expect("spawned");
        let line = serde_json::to_string(req).expect("request serialises");
        let sent = writeln!(child.stdin, "{line}").and_then(|_| child.stdin.flush());
        let got = match sent {
            Ok(()) => child.lines.recv_timeout(limit),
            Err(_) => Err(RecvTimeoutError::Disconnected),
        };
        match got {
            Ok(l) => serde_json::from_str(&l).map_err(|e| {
                let c = self.child.take().expect("child");
                ExecError::Sandbox(format!(
                    "unreadable answer from the Python child ({e}): {l}; {}",
                    c.kill()
                ))
            }),
            Err(RecvTimeoutError::Timeout) => {
                self.child.take().expect("child").kill();
                Err(ExecError::Timeout {
                    what: what.to_string(),
                    limit_s: limit.as_secs_f64(),
                })
            }
            Err(RecvTimeoutError::Disconnected) => {
                let c = self.child.take().expect("child");
                Err(ExecError::Sandbox(format!("{what}: {}", c.kill())))
            }
        }
    }

    fn ensure_loaded(&mut self, bundle: &KernelBundle) -> Result<(), ExecError> {
        let digest = bundle.digest();
        if self.child.is_some() && self.loaded.as_ref() == Some(&digest) {
            return Ok(());
        }
        let m = &bundle.manifest;
        let src = self.work.path().join("candidate.py");
        std::fs::write(&src, &bundle.source)
            .map_err(|e| ExecError::Sandbox(format!("cannot write the source: {e}")))?;
        let req = PyRequest::Load {
            source_path: src,
            entries: m.entries.clone(),
            setup: m.setup.clone(),
            package_dirs: self.opts.package_dirs.clone(),
            requires: m.requires.clone(),
            device: self.opts.device,
            require_network_isolation: self.opts.require_network_isolation,
        };
        match self.call(&req, &format!("importing {}", m.name), self.opts.case_limit)? {
            PyResponse::Loaded(l) => {
                let network = l.isolation.first().map(String::as_str).unwrap_or("unknown");
                if self.opts.require_network_isolation && !network.starts_with("isolated") {
                    return Err(ExecError::Unavailable(format!(
                        "the Python child is not network-isolated ({network}); refusing to run a Python candidate"
                    )));
                }
                self.runtime = Some(l);
                self.loaded = Some(digest);
                Ok(())
            }
            // An import failure is the candidate's: it fails every case the same way.
            PyResponse::Error(f) if f.kind == PyFailureKind::Isolation => {
                Err(ExecError::Unavailable(format!(
                    "{}; refusing to run a Python candidate",
                    f.message
                )))
            }
            PyResponse::Error(f) => Err(ExecError::Compile {
                what: format!("{} ({:?})", m.name, f.kind),
                log: f.message,
            }),
            PyResponse::Case(_) => Err(ExecError::Sandbox("unexpected answer to load".into())),
        }
    }

    /// `f` on the reference layers, after the candidate's calls (its outputs already read) with
    /// the candidate's process group stopped: nothing of the candidate runs while the reference
    /// is timed (it cannot load the GPU to make the reference look slow) or while the
    /// reference's files exist in the folder `f` is given (it cannot read them as an answer key
    /// for a later call). The files are removed before the child continues.
    fn with_child_frozen<T>(
        &mut self,
        spec: &CaseSpec,
        f: impl FnOnce(&mut R, &Path) -> Result<T, ExecError>,
    ) -> Result<T, ExecError> {
        struct Thaw<'a>(Option<&'a ChildProc>);
        impl Drop for Thaw<'_> {
            fn drop(&mut self) {
                if let Some(c) = self.0 {
                    c.freeze(false);
                }
            }
        }
        let dir = self.work.path().join("reference");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| {
            ExecError::Sandbox(format!("{}: cannot make {}: {e}", spec.id, dir.display()))
        })?;
        let child = self.child.as_ref();
        if let Some(c) = child {
            c.freeze(true);
        }
        let _thaw = Thaw(child);
        let r = f(&mut self.reference, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    /// The reference layers' outputs and time on `spec`, the candidate frozen
    /// ([`Self::with_child_frozen`]).
    fn reference_frozen(
        &mut self,
        spec: &CaseSpec,
        inp: &cases::CaseInputs,
        reps: u32,
    ) -> Result<ReferenceOutputs, ExecError> {
        self.with_child_frozen(spec, |r, dir| r.reference(spec, inp, reps, dir))
    }

    /// A backward op's reference gradients and time on `spec`, the candidate frozen.
    fn reference_backward_frozen(
        &mut self,
        spec: &CaseSpec,
        inp: &cases::CaseInputs,
        reps: u32,
    ) -> Result<BackwardReferenceOutputs, ExecError> {
        self.with_child_frozen(spec, |r, dir| r.reference_backward(spec, inp, reps, dir))
    }

    fn case_dir(&self, spec: &CaseSpec) -> Result<PathBuf, ExecError> {
        let dir = self.work.path().join("case");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| {
            ExecError::Sandbox(format!("{}: cannot make {}: {e}", spec.id, dir.display()))
        })?;
        Ok(dir)
    }
}

/// The variables of this process a confined child gets (everything else is scrubbed: tokens
/// such as `KERNELIZE_TOKEN`, `PYTHON*`, proxies).
pub const PASSED_ENV: [&str; 5] = [
    "PATH",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
];

/// `python -I ...` confined as every process that runs a Python candidate's code is (the case
/// runner's child, and the model-level harness for a Python candidate): the working directory,
/// `HOME`, `TMPDIR` and the Triton and Inductor caches in `home` (a private directory the caller
/// makes and removes), an environment scrubbed to `PASSED_ENV`, and on Linux a network
/// namespace of its own where the kernel allows one and RLIMIT_DATA (`confine`). `-I` ignores
/// `PYTHON*` variables and the user's site-packages. The caller adds the program and its stdio.
pub fn confined_python(python: &Path, home: &Path, memory_limit_bytes: Option<u64>) -> Command {
    // A relative path such as `python/.venv/bin/python` means from here, not from `home`.
    let python = if python.components().count() > 1 {
        std::path::absolute(python).unwrap_or_else(|_| python.to_path_buf())
    } else {
        python.to_path_buf()
    };
    let mut cmd = Command::new(python);
    cmd.arg("-I")
        .current_dir(home)
        .env_clear()
        .env("HOME", home)
        .env("TMPDIR", home)
        .env("TRITON_CACHE_DIR", home.join("triton"))
        .env("TORCHINDUCTOR_CACHE_DIR", home.join("inductor"))
        .env("PYTHONDONTWRITEBYTECODE", "1");
    for k in PASSED_ENV {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
    confine(&mut cmd, memory_limit_bytes);
    cmd
}

/// Start the child in its own network namespace (where the kernel lets an unprivileged process
/// make a user namespace) and under RLIMIT_DATA. Whether the namespace was had is checked by
/// the child itself (`Loaded.isolation`).
#[cfg(target_os = "linux")]
fn confine(cmd: &mut Command, memory_limit_bytes: Option<u64>) {
    use std::os::unix::process::CommandExt;
    // A process group of its own: the verifier stops and kills the child with its descendants.
    cmd.process_group(0);
    // SAFETY: between fork and exec only async-signal-safe calls (unshare, setrlimit) run.
    unsafe {
        cmd.pre_exec(move || {
            // Best effort: refused inside many containers (the child reports it).
            let _ = libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET);
            if let Some(b) = memory_limit_bytes {
                let lim = libc::rlimit {
                    rlim_cur: b as libc::rlim_t,
                    rlim_max: b as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_DATA, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn confine(_cmd: &mut Command, _memory_limit_bytes: Option<u64>) {}

impl<R: ReferenceLayers> Drop for PythonExecutor<R> {
    fn drop(&mut self) {
        if let Some(c) = self.child.take() {
            c.kill();
        }
    }
}

/// Write the case's inputs (`cases::generate`, every tensor it has: a backward op's `dy`, `mean`
/// and `rstd` too) into `dir`, each in its own dtype, in `CaseInputs`' order.
fn write_inputs(dir: &Path, spec: &CaseSpec, inp: &CaseInputs) -> Result<Vec<PyTensor>, ExecError> {
    let mut out = Vec::new();
    for t in input_tensors(inp) {
        std::fs::write(dir.join(format!("{}.bin", t.name)), &t.bytes).map_err(|e| {
            ExecError::Sandbox(format!("{}: cannot write {}: {e}", spec.id, t.name))
        })?;
        out.push(py_input(spec, t));
    }
    Ok(out)
}

/// Every tensor of `inp`, in the order the child is told of them.
fn input_tensors(inp: &CaseInputs) -> impl Iterator<Item = &HostTensor> {
    [
        Some(&inp.x),
        inp.up.as_ref(),
        inp.residual.as_ref(),
        inp.weight.as_ref(),
        inp.bias.as_ref(),
        inp.dy.as_ref(),
        inp.mean.as_ref(),
        inp.rstd.as_ref(),
    ]
    .into_iter()
    .flatten()
}

/// How the child is told of input `t` of `spec`: `x` `[rows, cols]` (silu_and_mul's `[rows,
/// 2*cols]`), the weight and bias `[cols]`, layer_norm_backward's statistics `[rows]`, every
/// other (`up`, `residual`, `dy`, `dres`, a gate) `[rows, cols]`.
fn py_input(spec: &CaseSpec, t: &HostTensor) -> PyTensor {
    let (rows, cols) = (spec.rows, spec.cols);
    let (shape, rowwise) = match t.name {
        "x" if spec.op == Op::SiluAndMul => (vec![rows, 2 * cols], true),
        "weight" | "bias" => (vec![cols], false),
        "mean" | "rstd" => (vec![rows], true),
        _ => (vec![rows, cols], true),
    };
    PyTensor {
        name: t.name.to_string(),
        shape,
        dtype: t.dtype,
        rowwise,
    }
}

/// The address cases' line (`measure::address::address_line`) for what the runner found.
fn address_line_of(
    a: &PyAddress,
    names: &[String],
    placements: &[Vec<u64>],
    cols: u64,
) -> Result<String, ExecError> {
    let p = placements
        .get(a.placement)
        .ok_or_else(|| ExecError::Sandbox(format!("the child named placement {}", a.placement)))?;
    let diffs: Vec<address::Difference> = a
        .diffs
        .iter()
        .map(|d| address::Difference {
            tensor: d.tensor.clone(),
            differ: d.differ,
            elements: d.elements,
            first: d.first,
            max_abs_diff: d.max_abs_diff.unwrap_or(f64::NAN),
        })
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Ok(address::address_line(
        &names,
        (&address::Placement { at: p.clone() }, &diffs),
        a.differing,
        placements.len(),
        cols,
    ))
}

fn read_output(dir: &Path, name: &str, want_bytes: usize) -> Result<Vec<u8>, ExecError> {
    let b = std::fs::read(dir.join(format!("{name}.bin")))
        .map_err(|e| ExecError::Sandbox(format!("the child's {name}.bin is unreadable: {e}")))?;
    if b.len() != want_bytes {
        return Err(ExecError::Sandbox(format!(
            "the child's {name}.bin holds {} bytes, not {want_bytes}",
            b.len()
        )));
    }
    Ok(b)
}

/// What the child gave for one case of a Python candidate, before anything is compared with a
/// reference (`PythonExecutor::run_candidate`): the case's inputs, every call's outputs and the
/// child's findings as the verifier's lines.
#[derive(Debug, Clone)]
pub struct PyRun {
    pub inputs: CaseInputs,
    /// A backward case's gradients' oracle truth where it was computed ahead (`crate::ahead`).
    pub truths: Option<Vec<crate::oracle::Truth>>,
    /// Per call (3: determinism and the poison pair), one per [`python_outputs`] in that order:
    /// a forward op's `out`, a backward op's gradients (`[cols]` for a one-row one).
    pub outputs: Vec<Vec<Vec<u8>>>,
    /// Per call, the updated residual of the fused adds; empty for every other op.
    pub residuals: Vec<Vec<u8>>,
    /// Repeated calls gave the same bits in every output.
    pub deterministic: bool,
    /// Inputs modified, an output not every element of which was written, an output in memory
    /// the caller still holds, an output that depends on the inputs' addresses.
    pub integrity_failures: Vec<String>,
    /// Repeated calls that differ, the batch compositions' line, an address line where the
    /// candidate is not deterministic.
    pub notes: Vec<String>,
    /// `None` where the case does not check batches.
    pub batch_invariant: Option<bool>,
    /// The timed calls (speed cases).
    pub timed: Option<PyTimed>,
    /// Timed calls made (0: speed not measured).
    pub reps: u32,
}

/// How the child is told of output `name` of `spec` (a forward op's `out` `[rows, cols]`, a
/// backward op's gradients: `[cols]` for a one-row one, else `[rows, cols]`).
fn py_output(spec: &CaseSpec, name: &str) -> PyTensor {
    let one_row = spec
        .op
        .gradients()
        .iter()
        .any(|g| g.name == name && g.one_row);
    PyTensor {
        name: name.to_string(),
        shape: if one_row {
            vec![spec.cols]
        } else {
            vec![spec.rows, spec.cols]
        },
        dtype: spec.dtype,
        rowwise: !one_row,
    }
}

/// The lines an unwritten output of the child gives: a forward op's as the CUDA runner's, a
/// backward op's prefixed with the gradient's name as `measure::backward`'s.
fn unwritten_lines(spec: &CaseSpec, u: &[PyUnwritten], outputs: &[PyTensor]) -> Vec<String> {
    u.iter()
        .map(|u| {
            let t = outputs.iter().find(|t| t.name == u.tensor);
            let rows = match t {
                Some(t) if !t.rowwise => 1,
                _ => spec.rows,
            };
            let line = integrity::unwritten_line(u.count, u.first, rows, spec.cols);
            if spec.op.is_backward() {
                format!("{}: {line}", u.tensor)
            } else {
                line
            }
        })
        .collect()
}

impl<R: ReferenceLayers> PythonExecutor<R> {
    /// Run one case of a Python candidate in the child: its inputs written, its function called
    /// (3 times, in the batch compositions, at the address placements, timed), its outputs
    /// read back, and what the child found said as the verifier says it. Nothing is compared
    /// with a reference: `run_case` does that.
    pub fn run_candidate(
        &mut self,
        bundle: &KernelBundle,
        spec: &CaseSpec,
        limits: &Limits,
    ) -> Result<PyRun, ExecError> {
        let m = &bundle.manifest;
        if m.runtime != Runtime::Python {
            return Err(ExecError::Sandbox(format!(
                "{} is a {} kernel, not a Python candidate",
                m.name, m.runtime
            )));
        }
        let function = m
            .entries
            .get(&spec.dtype)
            .cloned()
            .ok_or_else(|| ExecError::Compile {
                what: m.name.clone(),
                log: format!("no entry for {} in kernel.toml [entry]", spec.dtype),
            })?;
        self.ensure_loaded(bundle)?;
        let (dt, op) = (spec.dtype, spec.op);
        let dir = self.case_dir(spec)?;
        let crate::ahead::Drawn {
            inputs: inp,
            truths,
            ..
        } = crate::ahead::take(spec);
        let reps = if spec.measure_speed {
            limits.speed_reps.max(3)
        } else {
            0
        };
        let inputs = write_inputs(&dir, spec, &inp)?;
        // The fused adds' residual (fused_add_rms_norm_backward's `residual` is `dres`, an input).
        let mutable: Vec<String> = inp
            .residual
            .iter()
            .filter(|_| op.updates_residual())
            .map(|t| t.name.to_string())
            .collect();
        let outputs: Vec<PyTensor> = python_outputs(op)
            .into_iter()
            .map(|n| py_output(spec, n))
            .collect();
        // Batches compare rows: only where every output is row-wise (cases.rs decides so for
        // CUDA too: no batch where a gradient sums the rows).
        let compositions = if spec.check_batch && outputs.iter().all(|t| t.rowwise) {
            batch::plan(spec.rows, spec.seed)
                .into_iter()
                .map(|c| PyComposition {
                    name: c.name.to_string(),
                    batches: c.batches,
                })
                .collect()
        } else {
            Vec::new()
        };
        // The address cases: every input placed (the candidate allocates its outputs).
        let placements: Vec<Vec<u64>> = address::plan(inputs.len())
            .into_iter()
            .map(|p| p.at)
            .collect();
        let input_names: Vec<String> = inputs.iter().map(|t| t.name.clone()).collect();
        let req = PyRequest::Case(PyCase {
            function: function.clone(),
            dtype: dt,
            rows: spec.rows,
            cols: spec.cols,
            eps: spec.eps,
            dir: dir.clone(),
            inputs,
            args: python_args(op).iter().map(|s| s.to_string()).collect(),
            setup: m.setup.get(&dt).cloned(),
            setup_args: if m.setup.contains_key(&dt) {
                setup_args(op).into_iter().map(String::from).collect()
            } else {
                Vec::new()
            },
            outputs: outputs.clone(),
            returns_tuple: op.is_backward(),
            negate: incoming_gradients(op)
                .iter()
                .map(|s| s.to_string())
                .collect(),
            mutable: mutable.clone(),
            launches: 3,
            poison_seed: spec.seed ^ 0x9e37_79b9_7f4a_7c15,
            compositions: compositions.clone(),
            speed_reps: reps,
            placements: placements.clone(),
            address_period: address::PERIOD,
        });
        let what = format!("{} ({function}) on {}", m.name, spec.id);
        let r = match self.call(&req, &what, self.opts.case_limit)? {
            PyResponse::Case(r) => r,
            PyResponse::Error(f) => {
                return Err(ExecError::Candidate {
                    what,
                    message: match f.kind {
                        PyFailureKind::WrongOutput => format!("integrity: {}", f.message),
                        _ => f.message,
                    },
                })
            }
            PyResponse::Loaded(_) => {
                return Err(ExecError::Sandbox("unexpected answer to a case".into()))
            }
        };
        let elements = |t: &PyTensor| t.shape.iter().product::<u64>() as usize;
        let mut outs = Vec::new();
        for files in &r.outputs {
            if files.len() != outputs.len() {
                return Err(ExecError::Sandbox(format!(
                    "the child wrote {} output files for a call, not {}",
                    files.len(),
                    outputs.len()
                )));
            }
            let call = files
                .iter()
                .zip(&outputs)
                .map(|(f, t)| read_output(&dir, f, elements(t) * dt.size_bytes()))
                .collect::<Result<Vec<_>, _>>()?;
            outs.push(call);
        }
        let res_bytes = (spec.rows * spec.cols) as usize * dt.size_bytes();
        let ress = match mutable.first() {
            Some(name) => (0..outs.len())
                .map(|k| read_output(&dir, &format!("{name}{k}"), res_bytes))
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        let _ = std::fs::remove_dir_all(&dir);
        if outs.is_empty() {
            return Err(ExecError::Sandbox("the child wrote no output".into()));
        }

        let mut integrity_failures = r.integrity;
        integrity_failures.extend(unwritten_lines(spec, &r.unwritten, &outputs));
        let all: Vec<Vec<&[u8]>> = (0..outs.len())
            .map(|k| {
                outs[k]
                    .iter()
                    .map(Vec::as_slice)
                    .chain(ress.get(k).map(|v| v.as_slice()))
                    .collect()
            })
            .collect();
        let differing = determinism::max_differing(dt, &all);
        let deterministic = differing == 0;
        let mut notes: Vec<String> = determinism::note(differing).into_iter().collect();
        let batch_invariant = (!compositions.is_empty()).then(|| r.batch.is_none());
        notes.extend(r.batch);
        if let Some(a) = &r.address {
            let line = address_line_of(a, &input_names, &placements, spec.cols)?;
            if deterministic {
                integrity_failures.push(line);
            } else {
                notes.push(format!("{line} (the candidate is not deterministic)"));
            }
        }
        Ok(PyRun {
            inputs: inp,
            truths,
            outputs: outs,
            residuals: ress,
            deterministic,
            integrity_failures,
            notes,
            batch_invariant,
            timed: r.timed,
            reps,
        })
    }
}

impl<R: ReferenceLayers> Executor for PythonExecutor<R> {
    fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
        let d = self.reference.device_info()?;
        self.device = Some(d.clone());
        Ok(d)
    }

    fn prefetch(&mut self, spec: &CaseSpec) {
        // the candidate's inputs are drawn here, in this process (written to its case's files)
        crate::ahead::prefetch(spec);
    }

    fn run_case(
        &mut self,
        bundle: &KernelBundle,
        spec: &CaseSpec,
        limits: &Limits,
        copy_gbps: f64,
    ) -> Result<CaseReport, ExecError> {
        let skeleton = crate::cases::case_skeleton(spec, CaseStatus::Ran, None);
        if spec.large_index {
            // Above 2^32 elements the CUDA runner makes and compares the data on the GPU; through
            // files that is tens of GB per case.
            return Ok(CaseReport {
                status: CaseStatus::NotApplicable,
                note: Some("above 2^32 elements: not run for Python candidates".into()),
                ..skeleton
            });
        }
        let (dt, op) = (spec.dtype, spec.op);
        let run = self.run_candidate(bundle, spec, limits)?;
        let PyRun {
            inputs: inp,
            truths,
            outputs: outs,
            residuals: ress,
            deterministic,
            mut integrity_failures,
            notes,
            batch_invariant,
            timed,
            reps,
        } = run;
        // Speed against the reference's time, every timed call's outputs checked by the child.
        let speed_of = |ref_us: Option<f64>, integrity: &mut Vec<String>| match (&timed, ref_us) {
            (Some(t), Some(ref_us)) => {
                let s = speed::speed_of(
                    op.bytes_moved(dt, spec.rows, spec.cols),
                    t.median_us,
                    ref_us,
                    copy_gbps,
                );
                integrity.extend(speed::wrong_timed_launches(&t.bad, reps as usize));
                integrity.extend(s.above_roofline());
                Some(s)
            }
            _ => None,
        };
        if op.is_backward() {
            // The reference's gradients from the reference layers (on a GPU: the sandbox's
            // `Request::ReferenceBackward`), and the verdict a CUDA candidate's case gets from
            // the same host bytes (`measure::gradients::verdict`): per gradient its exactness
            // (the worst call where the 3 calls differ) and accuracy, and their combination.
            let reference = self.reference_backward_frozen(spec, &inp, reps)?;
            // The verdict holds for the device the report names, and the candidate ran there.
            let child = self.child_device();
            let figures = (reference.sms, reference.threads_per_sm);
            if let Some(why) = device_mismatch(op, self.device.as_ref(), child, figures) {
                return Err(ExecError::Sandbox(why));
            }
            let calls: Vec<Vec<&[u8]>> = outs
                .iter()
                .map(|c| c.iter().map(Vec::as_slice).collect())
                .collect();
            let refs: Vec<&[u8]> = reference.grads.iter().map(Vec::as_slice).collect();
            crate::measure::gradients::check_sizes(spec, &calls, &refs)
                .map_err(ExecError::Sandbox)?;
            let v = crate::measure::gradients::verdict(
                spec,
                &inp,
                &calls,
                &refs,
                deterministic,
                truths.as_deref(),
            );
            let speed = speed_of(reference.median_us, &mut integrity_failures);
            return Ok(CaseReport {
                note: (!notes.is_empty()).then(|| notes.join("; ")),
                exactness: Some(v.exactness),
                accuracy: None,
                deterministic: Some(deterministic),
                batch_invariant,
                integrity_failures,
                speed,
                gradients: v.gradients,
                ..skeleton
            });
        }
        let outs: Vec<Vec<u8>> = outs.into_iter().map(|mut o| o.remove(0)).collect();
        let reference = self.reference_frozen(spec, &inp, reps)?;
        let exact_of = |k: usize| {
            let mut pairs: Vec<(&[u8], &[u8])> = vec![(&outs[k], &reference.out)];
            if let (Some(res), Some(rr)) = (ress.get(k), &reference.residual) {
                pairs.push((res, rr));
            }
            compare(dt, &pairs)
        };
        let mut exactness = exact_of(0);
        if !deterministic {
            for k in 1..outs.len() {
                exactness = worst(exactness, exact_of(k));
            }
        }
        let truth = truths.as_ref().and_then(|t| t.first());
        let accuracy = oracle::accuracy(spec, &inp, &outs[0], &reference.out, truth);
        let speed = speed_of(reference.median_us, &mut integrity_failures);
        Ok(CaseReport {
            note: (!notes.is_empty()).then(|| notes.join("; ")),
            exactness: Some(exactness),
            accuracy: Some(accuracy),
            deterministic: Some(deterministic),
            batch_invariant,
            integrity_failures,
            speed,
            ..skeleton
        })
    }

    fn python_runtime(&mut self) -> Option<PythonRuntime> {
        self.runtime.as_ref().map(|l| PythonRuntime {
            python: l.python.clone(),
            torch: l.torch.clone(),
            packages: l.packages.clone(),
            isolation: l.isolation.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_signatures_follow_spec_2b() {
        // docs/spec.md section 2b's table: f(x, weight, eps), f(x, residual, weight, eps), f(x, weight, bias,
        // eps), f(x), f(gate, up).
        for &op in Op::ALL.iter().filter(|o| !o.is_backward()) {
            let want: &[&str] = match op {
                Op::RmsNorm => &["x", "weight", "eps"],
                Op::FusedAddRmsNorm => &["x", "residual", "weight", "eps"],
                Op::LayerNorm => &["x", "weight", "bias", "eps"],
                Op::FusedAddLayerNorm => &["x", "residual", "weight", "bias", "eps"],
                Op::SiluMul | Op::GeluTanhMul => &["gate", "up"],
                _ => &["x"],
            };
            assert_eq!(python_args(op), want, "{op}");
            assert_eq!(python_args(op).contains(&"eps"), op.takes_eps(), "{op}");
            // Every tensor argument is one the case generates for the op.
            let names = input_names(op);
            for a in python_args(op).iter().filter(|a| **a != "eps") {
                assert!(names.contains(a), "{op}: no input `{a}` in {names:?}");
            }
        }
    }

    /// The tensors `cases::generate` gives `op` (their `HostTensor::name`s).
    fn input_names(op: Op) -> Vec<&'static str> {
        let spec =
            crate::cases::suite(op, op.default_semantics(), &[DType::F32], true, 1, &[])[0].clone();
        let spec = CaseSpec {
            rows: 2,
            cols: 4,
            ..spec
        };
        let inp = crate::cases::generate(&spec);
        input_tensors(&inp).map(|t| t.name).collect()
    }

    /// A case of `op` in `dt`, `rows x cols`.
    fn small_spec(op: Op, dt: DType, rows: u64, cols: u64) -> CaseSpec {
        let spec = crate::cases::suite(op, op.default_semantics(), &[dt], true, 3, &[])[0].clone();
        CaseSpec {
            rows,
            cols,
            large_index: false,
            ..spec
        }
    }

    #[test]
    fn every_input_is_written_in_its_own_dtype() {
        // layer_norm_backward in bf16: dy, x, weight in bf16; mean and rstd f32 `[rows]`.
        let dir = tempfile::tempdir().unwrap();
        let spec = small_spec(Op::LayerNormBackward, DType::Bf16, 3, 8);
        let inp = crate::cases::generate(&spec);
        let t = write_inputs(dir.path(), &spec, &inp).unwrap();
        let got: Vec<(&str, &[u64], DType, bool)> = t
            .iter()
            .map(|t| (t.name.as_str(), t.shape.as_slice(), t.dtype, t.rowwise))
            .collect();
        assert_eq!(
            got,
            [
                ("x", &[3, 8][..], DType::Bf16, true),
                ("weight", &[8], DType::Bf16, false),
                ("dy", &[3, 8], DType::Bf16, true),
                ("mean", &[3], DType::F32, true),
                ("rstd", &[3], DType::F32, true),
            ]
        );
        for t in &t {
            let bytes = std::fs::read(dir.path().join(format!("{}.bin", t.name))).unwrap();
            let want = t.shape.iter().product::<u64>() as usize * t.dtype.size_bytes();
            assert_eq!(bytes.len(), want, "{}", t.name);
        }
        let mean = std::fs::read(dir.path().join("mean.bin")).unwrap();
        assert_eq!(mean, inp.mean.as_ref().unwrap().bytes);
        // Every op's inputs are written with the shape their bytes hold, and the child is told
        // of each argument of the Python signature.
        for &op in Op::ALL {
            let spec = small_spec(op, DType::F16, 2, 4);
            let inp = crate::cases::generate(&spec);
            let dir = tempfile::tempdir().unwrap();
            let t = write_inputs(dir.path(), &spec, &inp).unwrap();
            for (t, h) in t.iter().zip(input_tensors(&inp)) {
                assert_eq!(t.dtype, h.dtype, "{op} {}", t.name);
                let n = t.shape.iter().product::<u64>() as usize;
                assert_eq!(n, h.len(), "{op} {}: {:?}", t.name, t.shape);
            }
            let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
            for a in python_args(op).iter().filter(|a| **a != "eps") {
                assert!(names.contains(a), "{op}: `{a}` not written ({names:?})");
            }
        }
    }

    #[test]
    fn backward_signatures_are_the_cuda_abis_inputs() {
        // docs/spec.md section 2b: f(dy, x, w, eps) -> (dx, dw), f(dy, dres, x, w, eps) -> (dx,
        // dw), f(dy, x, mean, rstd, w) -> (dx, dw, db), f(dy, gate, up) -> (d_gate, d_up),
        // f(dy, x) -> dx.
        for &op in Op::ALL.iter().filter(|o| o.is_backward()) {
            let grads: Vec<&str> = op.gradients().iter().map(|g| g.name).collect();
            let mut want: Vec<&str> = Vec::new();
            for st in op.stages() {
                for t in st.tensors() {
                    let t = if t == "w" { "weight" } else { t };
                    if t != "ws" && !grads.contains(&t) && !want.contains(&t) {
                        want.push(t);
                    }
                }
            }
            if op.takes_eps() {
                want.push("eps");
            }
            assert_eq!(python_args(op), want.as_slice(), "{op}");
            assert_eq!(python_outputs(op), grads, "{op}");
            // The incoming gradients are arguments: `dy` first, and the fused add's `dres`.
            let incoming = incoming_gradients(op);
            assert_eq!(incoming[0], "dy", "{op}");
            assert!(incoming.iter().all(|a| python_args(op).contains(a)), "{op}");
            // Every tensor argument is one the case generates, and every input is an argument.
            let mut names = input_names(op);
            let mut args: Vec<&str> = python_args(op)
                .iter()
                .copied()
                .filter(|a| *a != "eps")
                .collect();
            names.sort();
            args.sort();
            assert_eq!(args, names, "{op}");
        }
        assert_eq!(python_outputs(Op::RmsNorm), ["out"]);
        assert!(incoming_gradients(Op::FusedAddRmsNorm).is_empty());
        // A setup function gets what a forward had: the arguments less the incoming gradients.
        assert_eq!(setup_args(Op::RmsNormBackward), ["x", "weight", "eps"]);
        assert_eq!(
            setup_args(Op::FusedAddRmsNormBackward),
            ["x", "weight", "eps"]
        );
        assert_eq!(
            setup_args(Op::LayerNormBackward),
            ["x", "mean", "rstd", "weight"]
        );
        assert_eq!(setup_args(Op::SiluMulBackward), ["gate", "up"]);
    }

    #[test]
    fn the_address_cases_answer_becomes_the_verifiers_line() {
        let r: PyResponse = serde_json::from_str(
            r#"{"case":{"outputs":[["out0"]],"integrity":[],"unwritten":[],"batch":null,"timed":null,
               "address":{"placement":1,"differing":17,"diffs":[{"tensor":"out","differ":64,
               "elements":64,"first":0,"max_abs_diff":null}]}}}"#,
        )
        .unwrap();
        let PyResponse::Case(r) = r else {
            panic!("a case")
        };
        let a = r.address.expect("address");
        let names = ["x".to_string(), "weight".to_string()];
        let plan: Vec<Vec<u64>> = address::plan(2).into_iter().map(|p| p.at).collect();
        let line = address_line_of(&a, &names, &plan, 64).unwrap();
        assert!(
            line.starts_with(
                "output depends on the buffer address: with every buffer at offset 16 (bytes past a 2 MiB boundary), out differs"
            ) && line.ends_with("17 of 33 placements differ"),
            "{line}"
        );
        let far = PyAddress { placement: 99, ..a };
        assert!(address_line_of(&far, &names, &plan, 64).is_err());
        // An answer from a runner without the address cases still parses.
        let old: PyResponse = serde_json::from_str(
            r#"{"case":{"outputs":[["out0"]],"integrity":[],"unwritten":[],"batch":null,"timed":null}}"#,
        )
        .unwrap();
        assert!(matches!(old, PyResponse::Case(r) if r.address.is_none()));
    }

    /// A backward verdict that depends on the device (rms_norm_backward's dw order) stands only
    /// where the reference's device is the report's and the candidate's GPU has its figures.
    #[test]
    fn a_backward_verdict_needs_the_reference_on_the_reports_and_the_candidates_device() {
        let h200 = DeviceInfo {
            name: "NVIDIA H200".into(),
            arch: kernel_registry::Arch::new(9, 0),
            sm_count: 132,
            driver_version: "580".into(),
            cuda_version: "13.0".into(),
            copy_gbps: 4000.0,
            threads_per_sm: Some(2048),
        };
        let child = |sms: u64, tps: Option<u64>| PyDeviceFigures {
            name: "NVIDIA H200".into(),
            sms,
            threads_per_sm: tps,
        };
        let op = Op::RmsNormBackward;
        let same = child(132, Some(2048));
        assert_eq!(
            device_mismatch(op, Some(&h200), Some(&same), (132, 2048)),
            None
        );
        // Unknown figures are not a mismatch (the CPU child; a torch without the threads).
        assert_eq!(device_mismatch(op, None, None, (132, 2048)), None);
        assert_eq!(
            device_mismatch(op, Some(&h200), Some(&child(132, None)), (132, 2048)),
            None
        );
        // The reference on another device than the report names.
        let why = device_mismatch(op, Some(&h200), Some(&same), (114, 2048)).unwrap();
        assert_eq!(
            why,
            "rms_norm_backward: the reference ran on a device of 114 SMs of 2048 threads, the report's device (NVIDIA H200) has 132 SMs of 2048 threads"
        );
        let fewer_threads = DeviceInfo {
            threads_per_sm: Some(1024),
            ..h200.clone()
        };
        assert!(device_mismatch(op, Some(&fewer_threads), None, (132, 2048)).is_some());
        // The candidate on another GPU than the reference.
        let why =
            device_mismatch(op, Some(&h200), Some(&child(78, Some(2048))), (132, 2048)).unwrap();
        assert!(
            why.starts_with("rms_norm_backward: the candidate ran on NVIDIA H200 with 78 SMs of 2048 threads, the reference on a device of 132 SMs of 2048 threads"),
            "{why}"
        );
        // Ops whose verdict does not depend on the device are not asked.
        for op in [Op::SiluMulBackward, Op::LayerNormBackward, Op::RmsNorm] {
            assert!(!op.verdict_depends_on_device());
            assert_eq!(
                device_mismatch(op, Some(&h200), Some(&child(1, Some(1))), (2, 2)),
                None
            );
        }
    }

    /// The child's answer to `load` carries its GPU's figures (read before the candidate is
    /// loaded), and an answer without them (the CPU, an older runner) still parses.
    #[test]
    fn the_childs_gpu_figures_come_with_its_load_answer() {
        let r: PyResponse = serde_json::from_str(
            r#"{"loaded":{"python":"3.12.3","torch":"2.11.0","packages":{},"isolation":["isolated"],
               "device":{"name":"NVIDIA H200","sms":132,"threads_per_sm":2048}}}"#,
        )
        .unwrap();
        let PyResponse::Loaded(l) = r else { panic!() };
        assert_eq!(
            l.device,
            Some(PyDeviceFigures {
                name: "NVIDIA H200".into(),
                sms: 132,
                threads_per_sm: Some(2048)
            })
        );
        let cpu: PyResponse = serde_json::from_str(
            r#"{"loaded":{"python":"3.12.3","torch":"2.11.0","packages":{},"isolation":[]}}"#,
        )
        .unwrap();
        assert!(matches!(
            cpu,
            PyResponse::Loaded(PyLoaded { device: None, .. })
        ));
        for key in [
            "multi_processor_count",
            "max_threads_per_multi_processor",
            "\"threads_per_sm\"",
        ] {
            assert!(RUNNER_SOURCE.contains(key), "python_runner.py lacks {key}");
        }
        // Read before the candidate's source is executed.
        let props = RUNNER_SOURCE.find("get_device_properties").unwrap();
        let exec = RUNNER_SOURCE.find("exec_module(MODULE)").unwrap();
        assert!(props < exec);
    }

    #[test]
    fn the_protocol_is_externally_tagged_json_lines() {
        let req = PyRequest::Load {
            source_path: "/t/c.py".into(),
            entries: BTreeMap::from([(DType::Bf16, "f".to_string())]),
            setup: BTreeMap::new(),
            package_dirs: vec![],
            requires: vec!["torch>=2".into()],
            device: PyDevice::Cpu,
            require_network_isolation: true,
        };
        assert_eq!(
            serde_json::to_string(&req).unwrap(),
            r#"{"load":{"source_path":"/t/c.py","entries":{"bf16":"f"},"package_dirs":[],"requires":["torch>=2"],"device":"cpu","require_network_isolation":true}}"#
        );
        let refused: PyResponse = serde_json::from_str(
            r#"{"error":{"kind":"isolation","message":"the Python child is not network-isolated (NOT isolated: interfaces eth0, lo)"}}"#,
        )
        .unwrap();
        assert!(matches!(
            refused,
            PyResponse::Error(PyFailure {
                kind: PyFailureKind::Isolation,
                ..
            })
        ));
        let err: PyResponse = serde_json::from_str(
            r#"{"error":{"kind":"wrong_output","message":"shape [1], expected [2]"}}"#,
        )
        .unwrap();
        assert_eq!(
            err,
            PyResponse::Error(PyFailure {
                kind: PyFailureKind::WrongOutput,
                message: "shape [1], expected [2]".into()
            })
        );
        // The runner writes exactly the keys of PyCaseResult.
        let ok: PyResponse = serde_json::from_str(
            r#"{"case":{"outputs":[["dx0","dw0"]],"integrity":[],"unwritten":[{"tensor":"dw","count":2,"first":5}],"batch":null,"timed":{"median_us":3.5,"bad":[]}}}"#,
        )
        .unwrap();
        assert!(
            matches!(ok, PyResponse::Case(r) if r.unwritten == [PyUnwritten { tensor: "dw".into(), count: 2, first: 5 }])
        );
        for key in [
            "\"outputs\"",
            "\"integrity\"",
            "\"unwritten\"",
            "\"batch\"",
            "\"timed\"",
            "\"address\"",
        ] {
            assert!(RUNNER_SOURCE.contains(key), "python_runner.py lacks {key}");
        }
    }
}
