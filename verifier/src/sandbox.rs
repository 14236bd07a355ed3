//! Isolation for untrusted kernels. The verifier runs each case in a child process
//! (`<this executable> __sandbox`) that talks JSON lines over stdin/stdout. A kernel that hangs,
//! writes to an illegal address or corrupts its CUDA context takes only that child down: the
//! parent records the case as an error, starts a fresh child and goes on.

use crate::cases::CaseSpec;
use crate::child::ChildProc;
use crate::exec::{ExecError, Executor, Limits};
use crate::gpu::CudaExecutor;
use kernel_registry::capability::ModuleAudit;
use kernel_registry::report::{CaseReport, CompiledModule, DeviceInfo};
use kernel_registry::{DType, KernelBundle, Runtime};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    Device,
    Case {
        manifest_toml: String,
        source: String,
        spec: CaseSpec,
        limits: Limits,
        copy_gbps: f64,
        /// The case expected after this one: the child starts drawing its inputs first
        /// (`ahead::prefetch`).
        #[serde(default)]
        next: Option<CaseSpec>,
    },
    Compiled {
        manifest_toml: String,
        source: String,
    },
    /// Of `dtypes`, the first whose module has compiled (`Executor::first_ready`). `early`: the
    /// cases named by `Executor::prefetch_early`, whose host work the child starts first.
    FirstReady {
        manifest_toml: String,
        source: String,
        dtypes: Vec<DType>,
        #[serde(default)]
        early: Vec<CaseSpec>,
    },
    /// The capability audit of each dtype's module (docs/spec.md section 3b).
    Audits {
        manifest_toml: String,
        source: String,
    },
    /// The reference layer on a case's inputs, for a candidate measured elsewhere (a Python
    /// candidate): outputs written to `dir/ref_out.bin` (and `dir/ref_residual.bin`).
    Reference {
        spec: CaseSpec,
        reps: u32,
        dir: PathBuf,
    },
    /// A backward op's reference layers on a case's inputs (its entries in stage order), for a
    /// candidate measured elsewhere (a Python candidate): every gradient written to
    /// `dir/ref_<gradient>.bin` ([`reference_file`]).
    ReferenceBackward {
        spec: CaseSpec,
        reps: u32,
        dir: PathBuf,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Device(DeviceInfo),
    Case(Box<CaseReport>),
    Compiled(Vec<CompiledModule>),
    Audits(Vec<ModuleAudit>),
    FirstReady(Option<DType>),
    /// The reference ran; its median time when `reps > 0`.
    Reference {
        median_us: Option<f64>,
    },
    /// The backward reference ran: the gradients it wrote (in `Op::gradients` order), its
    /// median time when `reps > 0`, and the device's SMs and threads per SM it ran with.
    ReferenceBackward {
        gradients: Vec<String>,
        median_us: Option<f64>,
        sms: u64,
        threads_per_sm: u64,
    },
    Error(ExecError),
}

/// The file a backward reference's gradient `name` is written to in the request's folder.
pub fn reference_file(name: &str) -> String {
    format!("ref_{name}.bin")
}

/// The child's side of `Request::ReferenceBackward`: `r`'s gradients written into `dir` (one
/// [`reference_file`] each, in `op`'s gradient order), and the answer naming them.
fn write_reference_backward(
    dir: &std::path::Path,
    op: kernel_registry::Op,
    r: &crate::gpu::BackwardReferenceOutputs,
) -> Result<Response, ExecError> {
    let names: Vec<String> = op.gradients().iter().map(|g| g.name.to_string()).collect();
    if names.len() != r.grads.len() {
        return Err(ExecError::Sandbox(format!(
            "{op}: the reference gave {} gradients, not {}",
            r.grads.len(),
            names.len()
        )));
    }
    for (n, bytes) in names.iter().zip(&r.grads) {
        std::fs::write(dir.join(reference_file(n)), bytes).map_err(|e| {
            ExecError::Sandbox(format!(
                "cannot write the reference's {n} in {}: {e}",
                dir.display()
            ))
        })?;
    }
    Ok(Response::ReferenceBackward {
        gradients: names,
        median_us: r.median_us,
        sms: r.sms,
        threads_per_sm: r.threads_per_sm,
    })
}

/// The parent's side: the gradients the answer names, read from `dir`, each checked to be the
/// gradient of `spec` the op has in that place and of its size.
fn read_reference_backward(
    dir: &std::path::Path,
    spec: &CaseSpec,
    gradients: &[String],
    median_us: Option<f64>,
    sms: u64,
    threads_per_sm: u64,
) -> Result<crate::gpu::BackwardReferenceOutputs, ExecError> {
    let want = spec.op.gradients();
    let named: Vec<&str> = gradients.iter().map(String::as_str).collect();
    let expected: Vec<&str> = want.iter().map(|g| g.name).collect();
    if named != expected {
        return Err(ExecError::Sandbox(format!(
            "{}: the backward reference wrote {named:?}, not {expected:?}",
            spec.id
        )));
    }
    let grads = want
        .iter()
        .map(|g| {
            let f = reference_file(g.name);
            let b = std::fs::read(dir.join(&f)).map_err(|e| {
                ExecError::Sandbox(format!("the reference's {f} is unreadable: {e}"))
            })?;
            let n = spec.gradient_bytes(g);
            if b.len() != n {
                return Err(ExecError::Sandbox(format!(
                    "the reference's {f} holds {} bytes, not {n}",
                    b.len()
                )));
            }
            Ok(b)
        })
        .collect::<Result<_, _>>()?;
    Ok(crate::gpu::BackwardReferenceOutputs {
        grads,
        median_us,
        sms,
        threads_per_sm,
    })
}

/// The child side: serve requests from stdin until it closes. After an error that broke the
/// CUDA context, answer and exit (the parent starts a fresh child).
pub fn serve() -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut exec = CudaExecutor::new();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let req: Request = serde_json::from_str(&line)?;
        let resp = match req {
            Request::Device => exec
                .device_info()
                .map_or_else(Response::Error, Response::Device),
            Request::Compiled {
                manifest_toml,
                source,
            } => answer(&manifest_toml, &source, |b| {
                exec.compiled(b).map(Response::Compiled)
            }),
            Request::FirstReady {
                manifest_toml,
                source,
                dtypes,
                early,
            } => answer(&manifest_toml, &source, |b| {
                if !early.is_empty() {
                    exec.prefetch_early(&early);
                }
                exec.first_ready(b, &dtypes).map(Response::FirstReady)
            }),
            Request::Audits {
                manifest_toml,
                source,
            } => answer(&manifest_toml, &source, |b| {
                exec.audits(b).map(Response::Audits)
            }),
            Request::Reference { spec, reps, dir } => {
                let written = exec.reference_case(&spec, reps).and_then(|r| {
                    let write = |name: &str, bytes: &[u8]| {
                        std::fs::write(dir.join(name), bytes).map_err(|e| {
                            ExecError::Sandbox(format!(
                                "cannot write {name} in {}: {e}",
                                dir.display()
                            ))
                        })
                    };
                    write("ref_out.bin", &r.out)?;
                    if let Some(res) = &r.residual {
                        write("ref_residual.bin", res)?;
                    }
                    Ok(r.median_us)
                });
                written.map_or_else(Response::Error, |median_us| Response::Reference {
                    median_us,
                })
            }
            Request::ReferenceBackward { spec, reps, dir } => exec
                .reference_backward_case(&spec, reps)
                .and_then(|r| write_reference_backward(&dir, spec.op, &r))
                .unwrap_or_else(Response::Error),
            Request::Case {
                manifest_toml,
                source,
                spec,
                limits,
                copy_gbps,
                next,
            } => answer(&manifest_toml, &source, |b| {
                if let Some(n) = &next {
                    crate::ahead::prefetch(n);
                }
                // A panic inside the run (a bug of ours) must not look like a kernel fault.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    exec.run_case(b, &spec, &limits, copy_gbps)
                }));
                match r {
                    Ok(c) => c.map(|c| Response::Case(Box::new(c))),
                    Err(p) => Err(ExecError::Sandbox(format!(
                        "verifier panic: {}",
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default()
                    ))),
                }
            }),
        };
        let fatal = matches!(&resp, Response::Error(e) if e.context_broken());
        serde_json::to_writer(&mut out, &resp)?;
        out.write_all(b"\n")?;
        out.flush()?;
        if fatal {
            // The context is gone; a hung kernel may still occupy the GPU. Leave now.
            std::process::exit(3);
        }
    }
    Ok(())
}

/// The answer to a request about a kernel: `f` on its bundle, or the error that its manifest or
/// source is refused (`kernel.toml`), as a compile error.
fn answer(
    manifest_toml: &str,
    source: &str,
    f: impl FnOnce(&KernelBundle) -> Result<Response, ExecError>,
) -> Response {
    match KernelBundle::from_parts(manifest_toml, source) {
        Err(e) => Response::Error(ExecError::Compile {
            what: "kernel.toml".into(),
            log: e.to_string(),
        }),
        Ok(b) => f(&b).unwrap_or_else(Response::Error),
    }
}

/// The parent side: an `Executor` whose cases run in a child process.
pub struct SandboxExecutor {
    exe: PathBuf,
    child: Option<ChildProc>,
    /// Backstop for a whole case (generation, all launches, comparisons).
    pub case_limit: Duration,
    /// Children started so far (the first, and one after each broken context).
    pub children_started: u32,
    /// The case named by `Executor::prefetch` (expected after the next case run), sent with
    /// that case's request.
    next: Option<CaseSpec>,
    /// The cases named by `Executor::prefetch_early`, sent with the next `FirstReady` (asked
    /// only of a CUDA kernel of two dtypes or more: a kernel of one dtype has none drawn early
    /// in the sandbox, each case's inputs then drawn during the case before, as before).
    early: Vec<CaseSpec>,
}

impl SandboxExecutor {
    /// `exe` must answer `exe __sandbox` with `serve()`; `None`: this executable.
    pub fn new(exe: Option<PathBuf>) -> Result<Self, ExecError> {
        let exe = match exe {
            Some(e) => e,
            None => std::env::current_exe()
                .map_err(|e| ExecError::Sandbox(format!("cannot find this executable: {e}")))?,
        };
        Ok(SandboxExecutor {
            exe,
            child: None,
            case_limit: Duration::from_secs(180),
            children_started: 0,
            next: None,
            early: Vec::new(),
        })
    }

    fn spawn(&mut self) -> Result<&mut ChildProc, ExecError> {
        if self.child.is_none() {
            let child = Command::new(&self.exe)
                .arg("__sandbox")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| {
                    ExecError::Sandbox(format!(
                        "cannot start {} __sandbox: {e}",
                        self.exe.display()
                    ))
                })?;
            self.children_started += 1;
            // With KERNELIZE_TRACE the child's phase timings pass through to our stderr.
            let pass = std::env::var_os("KERNELIZE_TRACE").is_some();
            self.child = Some(ChildProc::attach(child, "sandbox process", 2000, pass));
        }
        Ok(self.child.as_mut().expect("spawned"))
    }

    fn call(&mut self, req: &Request, what: &str) -> Result<Response, ExecError> {
        let limit = self.case_limit;
        let child = self.spawn()?;
        let line = serde_json::to_string(req).expect("request serialises");
        let sent = writeln!(child.stdin, "{line}").and_then(|_| child.stdin.flush());
        let got = match sent {
            Ok(()) => child.lines.recv_timeout(limit),
            Err(_) => Err(RecvTimeoutError::Disconnected),
        };
        match got {
            Ok(l) => {
                let resp: Response = serde_json::from_str(&l).map_err(|e| {
                    ExecError::Sandbox(format!("unreadable answer from the sandbox ({e}): {l}"))
                })?;
                if let Response::Error(e) = &resp {
                    if e.context_broken() {
                        // The child exits by itself; do not wait for a hung GPU to let go.
                        if let Some(c) = self.child.take() {
                            c.kill();
                        }
                    }
                }
                Ok(resp)
            }
            Err(RecvTimeoutError::Timeout) => {
                let c = self.child.take().expect("child");
                c.kill();
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
}

impl crate::python::ReferenceLayers for SandboxExecutor {
    fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
        Executor::device_info(self)
    }

    fn reference(
        &mut self,
        spec: &CaseSpec,
        _inputs: &crate::cases::CaseInputs,
        reps: u32,
        dir: &std::path::Path,
    ) -> Result<crate::gpu::ReferenceOutputs, ExecError> {
        let req = Request::Reference {
            spec: spec.clone(),
            reps,
            dir: dir.to_path_buf(),
        };
        match self.call(&req, &format!("reference of {}", spec.id))? {
            Response::Reference { median_us } => {
                let read = |name: &str| {
                    std::fs::read(dir.join(name)).map_err(|e| {
                        ExecError::Sandbox(format!("the reference's {name} is unreadable: {e}"))
                    })
                };
                Ok(crate::gpu::ReferenceOutputs {
                    out: read("ref_out.bin")?,
                    residual: if spec.op.updates_residual() {
                        Some(read("ref_residual.bin")?)
                    } else {
                        None
                    },
                    median_us,
                })
            }
            Response::Error(e) => Err(e),
            _ => Err(ExecError::Sandbox("unexpected answer".into())),
        }
    }

    fn reference_backward(
        &mut self,
        spec: &CaseSpec,
        _inputs: &crate::cases::CaseInputs,
        reps: u32,
        dir: &std::path::Path,
    ) -> Result<crate::gpu::BackwardReferenceOutputs, ExecError> {
        let req = Request::ReferenceBackward {
            spec: spec.clone(),
            reps,
            dir: dir.to_path_buf(),
        };
        match self.call(&req, &format!("backward reference of {}", spec.id))? {
            Response::ReferenceBackward {
                gradients,
                median_us,
                sms,
                threads_per_sm,
            } => read_reference_backward(dir, spec, &gradients, median_us, sms, threads_per_sm),
            Response::Error(e) => Err(e),
            _ => Err(ExecError::Sandbox("unexpected answer".into())),
        }
    }
}

impl Drop for SandboxExecutor {
    fn drop(&mut self) {
        if let Some(c) = self.child.take() {
            c.kill();
        }
    }
}

impl Executor for SandboxExecutor {
    fn prefetch(&mut self, spec: &CaseSpec) {
        self.next = Some(spec.clone());
    }

    fn prefetch_early(&mut self, specs: &[CaseSpec]) {
        self.early = specs.to_vec();
    }

    fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
        match self.call(&Request::Device, "device query")? {
            Response::Device(d) => Ok(d),
            Response::Error(e) => Err(e),
            _ => Err(ExecError::Sandbox("unexpected answer".into())),
        }
    }

    fn run_case(
        &mut self,
        bundle: &KernelBundle,
        spec: &CaseSpec,
        limits: &Limits,
        copy_gbps: f64,
    ) -> Result<CaseReport, ExecError> {
        let req = Request::Case {
            manifest_toml: bundle.manifest_toml.clone(),
            source: bundle.source.clone(),
            spec: spec.clone(),
            limits: *limits,
            copy_gbps,
            next: self.next.take(),
        };
        match self.call(&req, &spec.id)? {
            Response::Case(c) => Ok(*c),
            Response::Error(e) => Err(e),
            _ => Err(ExecError::Sandbox("unexpected answer".into())),
        }
    }

    fn compiled(&mut self, bundle: &KernelBundle) -> Result<Vec<CompiledModule>, ExecError> {
        let req = Request::Compiled {
            manifest_toml: bundle.manifest_toml.clone(),
            source: bundle.source.clone(),
        };
        match self.call(&req, "compile record")? {
            Response::Compiled(c) => Ok(c),
            Response::Error(e) => Err(e),
            _ => Err(ExecError::Sandbox("unexpected answer".into())),
        }
    }

    fn first_ready(
        &mut self,
        bundle: &KernelBundle,
        dtypes: &[DType],
    ) -> Result<Option<DType>, ExecError> {
        if bundle.manifest.runtime != Runtime::Cuda || dtypes.len() < 2 {
            return Ok(None);
        }
        let req = Request::FirstReady {
            manifest_toml: bundle.manifest_toml.clone(),
            source: bundle.source.clone(),
            dtypes: dtypes.to_vec(),
            early: std::mem::take(&mut self.early),
        };
        match self.call(&req, "waiting for a compiled module")? {
            Response::FirstReady(d) => Ok(d),
            Response::Error(e) => Err(e),
            _ => Err(ExecError::Sandbox("unexpected answer".into())),
        }
    }

    fn audits(&mut self, bundle: &KernelBundle) -> Result<Vec<ModuleAudit>, ExecError> {
        let req = Request::Audits {
            manifest_toml: bundle.manifest_toml.clone(),
            source: bundle.source.clone(),
        };
        match self.call(&req, "capability audit")? {
            Response::Audits(a) => Ok(a),
            Response::Error(e) => Err(e),
            _ => Err(ExecError::Sandbox("unexpected answer".into())),
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    fn state(pid: u32) -> char {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let (_, rest) = s.rsplit_once(')').unwrap();
        rest.trim_start().chars().next().unwrap()
    }

    /// The parent's question for the first compiled dtype and the child's answer cross the
    /// pipe as JSON lines, as every request does; a Python candidate is never asked (it has no
    /// modules), nor a kernel of one dtype.
    /// The case named by `Executor::prefetch` crosses the pipe with the case before it, equal
    /// to the spec its own request brings (what `ahead::take` matches on), and a request from an
    /// older parent without it still parses.
    #[test]
    fn the_next_case_crosses_the_pipe_with_the_case_before_it() {
        let specs = crate::cases::suite(
            kernel_registry::Op::RmsNormBackward,
            kernel_registry::Semantics::Llama,
            &[DType::Bf16, DType::F32],
            false,
            11,
            &[],
        );
        for pair in specs.windows(2) {
            let req = Request::Case {
                manifest_toml: String::new(),
                source: String::new(),
                spec: pair[0].clone(),
                limits: Limits::default(),
                copy_gbps: 1.0,
                next: Some(pair[1].clone()),
            };
            let line = serde_json::to_string(&req).unwrap();
            match serde_json::from_str::<Request>(&line).unwrap() {
                Request::Case { spec, next, .. } => {
                    assert_eq!(spec, pair[0]);
                    assert_eq!(next.as_ref(), Some(&pair[1]));
                }
                _ => panic!("not a case"),
            }
        }
        let mut v: serde_json::Value = serde_json::to_value(Request::Case {
            manifest_toml: String::new(),
            source: String::new(),
            spec: specs[0].clone(),
            limits: Limits::default(),
            copy_gbps: 1.0,
            next: None,
        })
        .unwrap();
        assert!(v["case"].as_object_mut().unwrap().remove("next").is_some());
        match serde_json::from_value::<Request>(v).unwrap() {
            Request::Case { next, .. } => assert!(next.is_none()),
            _ => panic!("not a case"),
        }
    }

    #[test]
    fn first_ready_crosses_the_pipe_and_is_asked_only_where_it_can_help() {
        let specs = crate::cases::suite(
            kernel_registry::Op::RmsNorm,
            kernel_registry::Semantics::Llama,
            &[DType::Bf16],
            true,
            5,
            &[],
        );
        let req = Request::FirstReady {
            manifest_toml: "m".into(),
            source: "s".into(),
            dtypes: vec![DType::Bf16, DType::F32],
            early: specs[..2].to_vec(),
        };
        let line = serde_json::to_string(&req).unwrap();
        match serde_json::from_str::<Request>(&line).unwrap() {
            Request::FirstReady { dtypes, early, .. } => {
                assert_eq!(dtypes, [DType::Bf16, DType::F32]);
                assert_eq!(early, specs[..2]);
            }
            other => panic!("{other:?}"),
        }
        // a request from an older parent, without `early`, still parses
        let old = r#"{"first_ready":{"manifest_toml":"m","source":"s","dtypes":["bf16"]}}"#;
        match serde_json::from_str::<Request>(old).unwrap() {
            Request::FirstReady { early, .. } => assert!(early.is_empty()),
            other => panic!("{other:?}"),
        }
        for answer in [Some(DType::F32), None] {
            let line = serde_json::to_string(&Response::FirstReady(answer)).unwrap();
            match serde_json::from_str::<Response>(&line).unwrap() {
                Response::FirstReady(d) => assert_eq!(d, answer),
                other => panic!("{other:?}"),
            }
        }
        // No child is started for a question that cannot help (this executable is no sandbox).
        let mut exec = SandboxExecutor::new(Some(PathBuf::from("/nonexistent"))).unwrap();
        let kernels = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
        let cuda = KernelBundle::load_dir(&kernels.join("silu")).unwrap();
        assert_eq!(exec.first_ready(&cuda, &[DType::Bf16]).unwrap(), None);
        let python = std::fs::read_dir(kernels.join("third-party"))
            .unwrap()
            .filter_map(|e| KernelBundle::load_dir(&e.ok()?.path()).ok())
            .find(|b| b.manifest.runtime == Runtime::Python)
            .expect("a bundled Python candidate");
        let all = [DType::Bf16, DType::F16, DType::F32];
        assert_eq!(exec.first_ready(&python, &all).unwrap(), None);
        assert_eq!(exec.children_started, 0);
    }

    /// A backward reference's request and answer cross the pipe as JSON lines; its gradients
    /// cross as files in the request's folder, read back in the op's gradient order with their
    /// sizes checked, and the device's figures come back with them.
    #[test]
    fn the_backward_reference_crosses_the_pipe_and_its_gradients_the_folder() {
        use kernel_registry::Op;
        let spec = crate::cases::suite(
            Op::RmsNormBackward,
            Op::RmsNormBackward.default_semantics(),
            &[DType::Bf16],
            true,
            5,
            &[],
        )
        .into_iter()
        .find(|s| !s.large_index)
        .map(|s| CaseSpec {
            rows: 3,
            cols: 8,
            ..s
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let req = Request::ReferenceBackward {
            spec: spec.clone(),
            reps: 7,
            dir: dir.path().to_path_buf(),
        };
        let line = serde_json::to_string(&req).unwrap();
        assert!(line.starts_with("{\"reference_backward\":"), "{line}");
        let Request::ReferenceBackward {
            spec: s,
            reps,
            dir: d,
        } = serde_json::from_str::<Request>(&line).unwrap()
        else {
            panic!("{line}")
        };
        assert_eq!(
            (s.id.as_str(), s.rows, s.cols, reps),
            (spec.id.as_str(), 3, 8, 7)
        );
        assert_eq!(d, dir.path());
        // The child: dx 3x8 and dw 8 bf16 elements, written to the folder.
        let dx: Vec<u8> = (0..48).collect();
        let dw: Vec<u8> = (100..116).collect();
        let r = crate::gpu::BackwardReferenceOutputs {
            grads: vec![dx.clone(), dw.clone()],
            median_us: Some(12.5),
            sms: 132,
            threads_per_sm: 2048,
        };
        let answer = write_reference_backward(dir.path(), s.op, &r).unwrap();
        let line = serde_json::to_string(&answer).unwrap();
        assert_eq!(
            line,
            r#"{"reference_backward":{"gradients":["dx","dw"],"median_us":12.5,"sms":132,"threads_per_sm":2048}}"#
        );
        // The parent: the same bytes and figures back.
        let Response::ReferenceBackward {
            gradients,
            median_us,
            sms,
            threads_per_sm,
        } = serde_json::from_str::<Response>(&line).unwrap()
        else {
            panic!("{line}")
        };
        let got = read_reference_backward(
            dir.path(),
            &spec,
            &gradients,
            median_us,
            sms,
            threads_per_sm,
        )
        .unwrap();
        assert_eq!(got, r);
        // Gradients named out of order, or a file of the wrong size, are refused.
        let swapped = ["dw".to_string(), "dx".to_string()];
        let e = read_reference_backward(dir.path(), &spec, &swapped, None, 1, 1).unwrap_err();
        assert!(e.to_string().contains("not [\"dx\", \"dw\"]"), "{e}");
        std::fs::write(dir.path().join(reference_file("dw")), &dw[..14]).unwrap();
        let e = read_reference_backward(dir.path(), &spec, &gradients, None, 1, 1).unwrap_err();
        assert!(
            e.to_string().contains("ref_dw.bin holds 14 bytes, not 16"),
            "{e}"
        );
        // A forward op's count of gradients is refused on the child's side.
        let one = crate::gpu::BackwardReferenceOutputs {
            grads: vec![dx],
            ..r
        };
        assert!(write_reference_backward(dir.path(), s.op, &one).is_err());
    }

    #[test]
    fn a_frozen_child_group_is_stopped_until_thawed_and_killed_whole() {
        // A shell (the group's leader) with a child of its own in the group.
        let child = Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let leader = child.id();
        let c = ChildProc::attach(child, "test child", 100, false).in_own_group();
        let grandchild: u32 = c
            .lines
            .recv_timeout(Duration::from_secs(5))
            .unwrap()
            .parse()
            .unwrap();
        c.freeze(true);
        assert_eq!(
            state(leader),
            'T',
            "the leader is stopped when freeze returns"
        );
        let t0 = std::time::Instant::now();
        while state(grandchild) != 'T' {
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "the group's other member is stopped"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        c.freeze(false);
        let t0 = std::time::Instant::now();
        while state(leader) == 'T' || state(grandchild) == 'T' {
            assert!(t0.elapsed() < Duration::from_secs(2), "thawed");
            std::thread::sleep(Duration::from_millis(1));
        }
        c.kill();
        let t0 = std::time::Instant::now();
        while std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
            .is_ok_and(|s| !s.contains(") Z"))
        {
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "killing the child kills its group"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
