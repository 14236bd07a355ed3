//! Model-level verification: the candidate substituted for every matching layer of a real small
//! model, and what that does to the logits.
//!
//! The PyTorch side runs in a subprocess, `python3 -m kernelize_verifier.model_level`
//! (python/kernelize_verifier/model_level.py, which imports the client package `kernelize` and
//! measures through its launch path on purpose): it loads each model with transformers, runs the evaluation text through it
//! with its eager layers and again with the candidate swapped in, and writes both logit tensors
//! as safetensors plus a `summary.json`. The metrics (max logit abs diff, argmax match, top-5
//! overlap, mean KL) are computed here, in f64, by one function (`logit_metrics`).
//!
//! A Python candidate (docs/spec.md section 2b) runs its own code inside the harness, so for one the harness is
//! started confined as the case runner's child is (`python::confined_python`: private directory,
//! scrubbed environment, network namespace where allowed, RLIMIT_DATA), with the candidate's
//! package folders (`--package-dir`) and, when asked, `--require-network-isolation`.

use crate::python::{confined_python, PyDevice, PythonOptions};
use kernel_registry::report::ModelReport;
use kernel_registry::{DType, KernelBundle, Runtime};
use safetensors::{Dtype as StDtype, SafeTensors};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How to run the model-level measurement.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// Model folders (HF format: config.json + *.safetensors).
    pub models: Vec<PathBuf>,
    /// The evaluation text run through every model.
    pub text: PathBuf,
    /// Python interpreter with torch (CUDA) and transformers.
    pub python: String,
    /// Folder holding the `kernelize_verifier` and `kernelize` Python packages (the repository's
    /// python/; put on PYTHONPATH).
    pub python_path: PathBuf,
    /// Tokens of the evaluation text to use (the rest is cut).
    pub max_tokens: u32,
    /// The whole harness run (all models and dtypes) must end within this.
    pub timeout: Duration,
    /// For a Python candidate: its package folders, the child's memory limit, whether network
    /// isolation is required, and the device (`PyDevice::Cpu`: CPU tests). The interpreter is
    /// `python` above; the case limit does not apply (`timeout` does).
    pub python_candidate: PythonOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model-level verification: {0}")]
    Setup(String),
    #[error("model-level harness failed ({status}): {stderr}")]
    Harness { status: String, stderr: String },
    #[error("model-level harness output: {0}")]
    Output(String),
}

/// A model that could not be measured for this kernel, and why (e.g. no matching layer).
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    pub model_name: String,
    pub dtype: Option<DType>,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct ModelOutcome {
    pub reports: Vec<ModelReport>,
    pub skipped: Vec<Skipped>,
    /// Things a reader of the measurements must know (e.g. a non-deterministic eager model).
    pub warnings: Vec<String>,
    /// For a Python candidate: what the harness ran it with (interpreter, torch, packages,
    /// isolation), as one line.
    pub python: Option<String>,
    /// A backward candidate's model level: its training runs against eager's.
    pub training: Vec<TrainingRun>,
    pub seconds: f64,
}

/// A backward candidate's model level on one model and dtype (the harness's `training` rows,
/// `kernelize_verifier.training_level.compare_candidate`): AdamW steps of three copies of the
/// model, eager, a control (eager's own gradients of the op through the same wrapping) and the
/// candidate's (the candidate as the backward of every layer of the op's forward), on the same
/// batches; what of the last two differs from eager's, bit for bit.
#[derive(Debug, Clone, Deserialize)]
pub struct TrainingRun {
    pub model_name: String,
    pub dtype: DType,
    pub steps: usize,
    pub layers_wrapped: Vec<String>,
    /// The candidate's losses, gradients and parameters are bit-identical with eager's.
    pub ok: bool,
    /// The control's are too (else the wrapping alone moves eager's training here).
    pub control_identical: bool,
    pub candidate_loss_steps_differing: Vec<usize>,
    /// step -> the parameters whose gradient bits differ from eager's
    pub candidate_gradients_differing: std::collections::BTreeMap<String, Vec<String>>,
    pub grad_steps_compared: usize,
    /// parameter -> elements whose bits differ from eager's after the last step
    pub candidate_parameters_differing: std::collections::BTreeMap<String, u64>,
    #[serde(default)]
    pub max_loss_abs_diff: Option<f64>,
}

impl TrainingRun {
    /// One line for the report's model notes.
    pub fn note(&self) -> String {
        let head = format!(
            "training {} ({}): {} AdamW steps with the candidate as the backward of {} layer(s)",
            self.model_name,
            self.dtype,
            self.steps,
            self.layers_wrapped.len()
        );
        let what = if self.ok {
            "losses, gradients and parameters bit-identical with eager's".to_string()
        } else {
            let params: u64 = self.candidate_parameters_differing.values().sum();
            format!(
                "differs from eager: the loss at {} of {} step(s), the gradients at {} of {}, {} parameter element(s) after the last; largest loss difference {}",
                self.candidate_loss_steps_differing.len(),
                self.steps,
                self.candidate_gradients_differing.len(),
                self.grad_steps_compared,
                params,
                self.max_loss_abs_diff
                    .map_or_else(|| "-".to_string(), |d| format!("{d:.3e}"))
            )
        };
        let control = if self.control_identical {
            ""
        } else {
            " (the control, eager's own gradients of the op through the same wrapping, differs \
             from eager too: here no single backward of the op can give eager's training)"
        };
        format!("{head}: {what}{control}")
    }
}

#[derive(Debug, Deserialize)]
struct Summary {
    #[serde(default)]
    runs: Vec<Run>,
    #[serde(default)]
    skipped: Vec<SkipEntry>,
    /// Present for a Python candidate.
    #[serde(default)]
    python: Option<HarnessPython>,
    /// A backward candidate's training runs.
    #[serde(default)]
    training: Vec<TrainingRun>,
}

/// What the harness says it ran a Python candidate with (`harness.load_python_candidate`).
#[derive(Debug, Deserialize)]
struct HarnessPython {
    python: String,
    torch: String,
    #[serde(default)]
    packages: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    isolation: Vec<String>,
}

impl HarnessPython {
    fn line(&self) -> String {
        let pk: Vec<String> = self
            .packages
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        format!(
            "model level ran the Python candidate in a confined child: python {}, torch {}{}; {}",
            self.python,
            self.torch,
            if pk.is_empty() {
                String::new()
            } else {
                format!(", {}", pk.join(", "))
            },
            if self.isolation.is_empty() {
                "isolation unknown".to_string()
            } else {
                self.isolation.join("; ")
            }
        )
    }
}

/// The harness's module: the verifier's model-level program, in python/kernelize_verifier/
/// (beside the client package `kernelize`, which it imports).
const HARNESS_MODULE: &str = "kernelize_verifier.model_level";

/// Runs the harness (`HARNESS_MODULE`) as a module with `-I` (which ignores PYTHONPATH):
/// argv[1] is the folder holding the `kernelize_verifier` and `kernelize` packages, the rest the
/// harness's arguments.
const HARNESS_BOOTSTRAP: &str = "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); \
     runpy.run_module('kernelize_verifier.model_level', run_name='__main__', alter_sys=True)";

#[derive(Debug, Deserialize)]
struct Run {
    model_name: String,
    model_dir: PathBuf,
    dtype: DType,
    file: String,
    layers_replaced: u32,
    #[serde(default)]
    adaptation: Option<String>,
    #[serde(default)]
    eager_mean_top1_prob: Option<f64>,
    /// Whether two eager runs gave identical logits (if not, differences include that noise).
    #[serde(default)]
    eager_repeat_identical: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct SkipEntry {
    model_name: String,
    #[serde(default)]
    dtype: Option<DType>,
    reason: String,
}

/// What the logits of the candidate model did, against the eager model's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogitMetrics {
    pub tokens: u64,
    /// Over positions where both are finite; infinite when finiteness differs anywhere.
    pub max_abs_diff: f64,
    pub argmax_match_fraction: f64,
    /// Mean over positions of |top5(eager) ∩ top5(candidate)| / 5.
    pub top5_overlap: f64,
    /// Mean over positions of KL(softmax(eager) || softmax(candidate)), in nats.
    pub mean_kl: f64,
}

/// Index of the largest value; the first one on ties; NaN never wins.
fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] || v[best].is_nan() && !x.is_nan() {
            best = i;
        }
    }
    best
}

/// The k largest (ties: lower index first).
fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| {
        v[b].partial_cmp(&v[a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx
}

fn log_softmax(v: &[f32]) -> Vec<f64> {
    let m = v
        .iter()
        .map(|&x| x as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let lse = m + v.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    v.iter().map(|&x| x as f64 - lse).collect()
}

/// Compare two `[tokens, vocab]` logit tensors (row-major).
pub fn logit_metrics(eager: &[f32], cand: &[f32], vocab: usize) -> Result<LogitMetrics, String> {
    if vocab == 0
        || eager.len() != cand.len()
        || eager.is_empty()
        || !eager.len().is_multiple_of(vocab)
    {
        return Err(format!(
            "logits of different or empty shapes: {} and {} values, vocab {vocab}",
            eager.len(),
            cand.len()
        ));
    }
    let t = eager.len() / vocab;
    let (mut max_abs, mut argmax_hits, mut top5, mut kl) = (0.0f64, 0usize, 0.0f64, 0.0f64);
    for (e, c) in eager.chunks_exact(vocab).zip(cand.chunks_exact(vocab)) {
        for (&a, &b) in e.iter().zip(c) {
            let d = if a.is_finite() && b.is_finite() {
                (a as f64 - b as f64).abs()
            } else if a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) {
                0.0
            } else {
                f64::INFINITY
            };
            max_abs = max_abs.max(d);
        }
        argmax_hits += usize::from(argmax(e) == argmax(c));
        let k = 5.min(vocab);
        let te = top_k(e, k);
        let tc = top_k(c, k);
        top5 += te.iter().filter(|i| tc.contains(i)).count() as f64 / k as f64;
        let (le, lc) = (log_softmax(e), log_softmax(c));
        let row_kl: f64 = le
            .iter()
            .zip(&lc)
            .map(|(&p, &q)| {
                if p.exp() > 0.0 {
                    p.exp() * (p - q)
                } else {
                    0.0
                }
            })
            .sum();
        kl += row_kl.max(0.0);
    }
    Ok(LogitMetrics {
        tokens: t as u64,
        max_abs_diff: max_abs,
        argmax_match_fraction: argmax_hits as f64 / t as f64,
        top5_overlap: top5 / t as f64,
        mean_kl: kl / t as f64,
    })
}

/// `sha256:<hex>` over the model's config.json and weight files (names sorted), each preceded
/// by its name and length: any change of weights or config gives another digest.
pub fn model_digest(dir: &Path) -> Result<String, ModelError> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ModelError::Setup(format!("reading model folder {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            n == "config.json" || n.ends_with(".safetensors") || n.ends_with(".bin")
        })
        .collect();
    names.sort();
    if !names.iter().any(|p| p.ends_with("config.json")) {
        return Err(ModelError::Setup(format!(
            "{} has no config.json: give a Hugging Face model folder (config.json + model.safetensors)",
            dir.display()
        )));
    }
    let mut h = Sha256::new();
    for p in &names {
        let bytes = std::fs::read(p)
            .map_err(|e| ModelError::Setup(format!("reading {}: {e}", p.display())))?;
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        h.update(format!("{name}\n{}\n", bytes.len()).as_bytes());
        h.update(&bytes);
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

fn f32_tensor(st: &SafeTensors, name: &str) -> Result<(Vec<f32>, Vec<usize>), ModelError> {
    let t = st
        .tensor(name)
        .map_err(|e| ModelError::Output(format!("tensor `{name}`: {e}")))?;
    if t.dtype() != StDtype::F32 {
        return Err(ModelError::Output(format!(
            "tensor `{name}` is {:?}, expected F32",
            t.dtype()
        )));
    }
    let v = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok((v, t.shape().to_vec()))
}

/// Read one run's safetensors file and compute its metrics.
pub fn metrics_of_file(path: &Path) -> Result<LogitMetrics, ModelError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ModelError::Output(format!("reading {}: {e}", path.display())))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| ModelError::Output(format!("{}: {e}", path.display())))?;
    let (e, es) = f32_tensor(&st, "eager_logits")?;
    let (c, cs) = f32_tensor(&st, "candidate_logits")?;
    if es != cs || es.len() != 2 {
        return Err(ModelError::Output(format!(
            "{}: eager_logits {es:?} and candidate_logits {cs:?} must be the same [tokens, vocab]",
            path.display()
        )));
    }
    logit_metrics(&e, &c, es[1]).map_err(ModelError::Output)
}

/// Write `bundle` as a kernel folder (kernel.toml + its source) for the harness.
fn write_bundle(bundle: &KernelBundle, dir: &Path) -> Result<(), ModelError> {
    let io = |e: std::io::Error| ModelError::Setup(format!("writing the kernel folder: {e}"));
    std::fs::write(dir.join("kernel.toml"), &bundle.manifest_toml).map_err(io)?;
    std::fs::write(dir.join(&bundle.manifest.source), &bundle.source).map_err(io)?;
    Ok(())
}

/// Where the Python packages are (the folder to put on the path): `KERNELIZE_PYTHONPATH`, else
/// a `python/` folder holding both `kernelize_verifier/model_level.py` (the harness) and
/// `kernelize/` (the client it imports) in the current directory, beside the executable, or in
/// one of their parents.
pub fn find_python_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KERNELIZE_PYTHONPATH") {
        return Some(PathBuf::from(p));
    }
    let mut starts = vec![];
    if let Ok(d) = std::env::current_dir() {
        starts.push(d);
    }
    if let Some(d) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        starts.push(d);
    }
    starts.iter().find_map(|s| python_path_from(s))
}

/// The first `python/` folder holding the harness and the client package, in `start` or one of
/// its parents.
fn python_path_from(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .map(|a| a.join("python"))
        .find(|p| is_python_path(p))
}

/// Whether `dir` holds the harness (`kernelize_verifier/model_level.py`) and the client package
/// (`kernelize/`) it imports.
fn is_python_path(dir: &Path) -> bool {
    dir.join("kernelize_verifier")
        .join("model_level.py")
        .is_file()
        && dir.join("kernelize").join("__init__.py").is_file()
}

/// Run the harness for `bundle` on every model and dtype, and turn its output into
/// `ModelReport`s. `progress` gets one line per event.
pub fn run_models(
    bundle: &KernelBundle,
    dtypes: &[DType],
    opts: &ModelOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ModelOutcome, ModelError> {
    let t0 = Instant::now();
    if !opts.text.is_file() {
        return Err(ModelError::Setup(format!(
            "evaluation text {} not found (give one with --eval-text)",
            opts.text.display()
        )));
    }
    let mut digests = Vec::new();
    for m in &opts.models {
        digests.push((m.clone(), model_digest(m)?));
    }
    let work = tempfile::tempdir()
        .map_err(|e| ModelError::Setup(format!("creating a temporary folder: {e}")))?;
    let kdir = work.path().join("kernel");
    let odir = work.path().join("out");
    for d in [&kdir, &odir] {
        std::fs::create_dir_all(d)
            .map_err(|e| ModelError::Setup(format!("creating {}: {e}", d.display())))?;
    }
    write_bundle(bundle, &kdir)?;
    let dts: Vec<&str> = dtypes.iter().map(|d| d.as_str()).collect();
    let python_candidate = bundle.manifest.runtime == Runtime::Python;
    // The confined child works in its private directory: every path is absolute.
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut cmd = if python_candidate {
        let home = work.path().join("home");
        std::fs::create_dir_all(&home)
            .map_err(|e| ModelError::Setup(format!("creating {}: {e}", home.display())))?;
        let pc = &opts.python_candidate;
        // The confinement check the harness makes of itself before it loads the candidate (the
        // case runner's, `crate::python::CONFINEMENT_SOURCE`), outside the child's home.
        let confinement = work.path().join(crate::python::CONFINEMENT_FILE);
        std::fs::write(&confinement, crate::python::CONFINEMENT_SOURCE)
            .map_err(|e| ModelError::Setup(format!("writing {}: {e}", confinement.display())))?;
        let mut cmd = confined_python(Path::new(&opts.python), &home, pc.memory_limit_bytes);
        // transformers reads only the local model folders; never reach for the Hub.
        cmd.env("HF_HUB_OFFLINE", "1")
            .arg("-c")
            .arg(HARNESS_BOOTSTRAP)
            .arg(abs(&opts.python_path))
            .arg("--confinement")
            .arg(abs(&confinement));
        for d in &pc.package_dirs {
            cmd.arg("--package-dir").arg(abs(d));
        }
        if pc.require_network_isolation {
            cmd.arg("--require-network-isolation");
        }
        if pc.device == PyDevice::Cpu {
            // CPU tests: the candidate's function on CPU tensors; constraints as on sm_90.
            cmd.args(["--device", "cpu", "--arch", "sm_90"]);
        }
        cmd
    } else {
        let mut cmd = Command::new(&opts.python);
        cmd.arg("-m").arg(HARNESS_MODULE);
        let pp = match std::env::var_os("PYTHONPATH") {
            Some(old) if !old.is_empty() => {
                let mut v = opts.python_path.clone().into_os_string();
                v.push(":");
                v.push(old);
                v
            }
            _ => opts.python_path.clone().into_os_string(),
        };
        cmd.env("PYTHONPATH", pp);
        cmd
    };
    cmd.arg("--kernel")
        .arg(&kdir)
        .arg("--dtype")
        .arg(dts.join(","))
        .arg("--text")
        .arg(abs(&opts.text))
        .arg("--out-dir")
        .arg(&odir)
        .arg("--max-tokens")
        .arg(opts.max_tokens.to_string());
    for m in &opts.models {
        cmd.arg("--model").arg(abs(m));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    progress(&format!(
        "model level: {} model(s) x {} with {} -m {HARNESS_MODULE}{}",
        opts.models.len(),
        dts.join(","),
        opts.python,
        if python_candidate {
            " (Python candidate: confined child)"
        } else {
            ""
        }
    ));
    let mut child = cmd.spawn().map_err(|e| {
        ModelError::Setup(format!(
            "could not start `{}` ({e}); give a Python with torch and transformers with --python",
            opts.python
        ))
    })?;
    // Stream the harness's progress lines while keeping its tail for errors.
    let mut stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut chunk) {
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            while let Some(i) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=i).collect();
                let _ = tx.send(String::from_utf8_lossy(&line).trim_end().to_string());
            }
        }
        if !buf.is_empty() {
            let _ = tx.send(String::from_utf8_lossy(&buf).trim_end().to_string());
        }
    });
    let mut tail: Vec<String> = Vec::new();
    let status = loop {
        while let Ok(l) = rx.try_recv() {
            progress(&harness_line(&l));
            tail.push(l);
            if tail.len() > 40 {
                tail.remove(0);
            }
        }
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t0.elapsed() > opts.timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ModelError::Harness {
                    status: format!("killed after {:.0} s", opts.timeout.as_secs_f64()),
                    stderr: tail.join("\n"),
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(ModelError::Setup(format!("waiting for the harness: {e}"))),
        }
    };
    let _ = reader.join();
    while let Ok(l) = rx.try_recv() {
        progress(&harness_line(&l));
        tail.push(l);
    }
    if !status.success() {
        let keep = tail.len().saturating_sub(15);
        return Err(ModelError::Harness {
            status: status.to_string(),
            stderr: tail[keep..].join("\n"),
        });
    }
    let summary_path = odir.join("summary.json");
    let summary: Summary = serde_json::from_slice(
        &std::fs::read(&summary_path)
            .map_err(|e| ModelError::Output(format!("{}: {e}", summary_path.display())))?,
    )
    .map_err(|e| ModelError::Output(format!("summary.json: {e}")))?;
    let mut out = ModelOutcome {
        python: summary.python.as_ref().map(HarnessPython::line),
        training: summary.training,
        ..ModelOutcome::default()
    };
    if python_candidate && out.python.is_none() {
        return Err(ModelError::Output(
            "summary.json of a Python candidate's run does not say what it ran with (`python`)"
                .into(),
        ));
    }
    for r in summary.runs {
        let digest = digests
            .iter()
            .find(|(p, _)| same_dir(p, &r.model_dir))
            .map(|(_, d)| d.clone())
            .ok_or_else(|| {
                ModelError::Output(format!(
                    "summary.json names model folder {} that was not asked for",
                    r.model_dir.display()
                ))
            })?;
        let m = metrics_of_file(&odir.join(&r.file))?;
        if r.eager_repeat_identical == Some(false) {
            out.warnings.push(format!(
                "{} {}: two eager runs of the model gave different logits on this device, so \
                 the differences measured include that run-to-run noise",
                r.model_name, r.dtype
            ));
        }
        out.reports.push(ModelReport {
            model_name: r.model_name,
            model_digest: digest,
            dtype: r.dtype,
            tokens: m.tokens,
            layers_replaced: r.layers_replaced,
            max_logit_abs_diff: m.max_abs_diff,
            argmax_match_fraction: m.argmax_match_fraction,
            top5_overlap: m.top5_overlap,
            mean_kl: m.mean_kl,
            eager_mean_top1_prob: r.eager_mean_top1_prob,
            adaptation: r.adaptation.filter(|a| !a.is_empty()),
        });
    }
    out.skipped = summary
        .skipped
        .into_iter()
        .map(|s| Skipped {
            model_name: s.model_name,
            dtype: s.dtype,
            reason: s.reason,
        })
        .collect();
    out.seconds = t0.elapsed().as_secs_f64();
    Ok(out)
}

/// Run the model-level measurement for `report`'s kernel and attach it: the measurements to
/// `report.model`, skipped models and the duration to `report.model_notes`. On a harness
/// failure the note says so and the error is returned (the case results stay valid).
pub fn attach(
    report: &mut kernel_registry::report::VerificationReport,
    bundle: &KernelBundle,
    opts: &ModelOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<(), ModelError> {
    if bundle.manifest.op.is_backward() && bundle.manifest.runtime != Runtime::Python {
        // The model level of a backward op is training steps of the shipped models compared
        // with eager's (docs/backward.md, item 9): the harness runs them for Python candidates;
        // a CUDA backward kernel's are not run by it yet, and said so.
        report.model_notes.push(format!(
            "no model-level measurement: {} is a backward op, and training steps of the shipped models with a CUDA backward kernel are not measured yet",
            bundle.manifest.op
        ));
        return Ok(());
    }
    let dtypes: Vec<DType> = report.summary.per_dtype.keys().copied().collect();
    match run_models(bundle, &dtypes, opts, progress) {
        Ok(o) => {
            // One note per model and reason, with the dtypes it holds for.
            let mut grouped: Vec<(&str, &str, Vec<String>)> = Vec::new();
            for s in &o.skipped {
                let dt = s.dtype.map(|d| d.to_string()).unwrap_or_default();
                match grouped
                    .iter_mut()
                    .find(|(m, r, _)| *m == s.model_name && *r == s.reason)
                {
                    Some((_, _, dts)) => dts.push(dt),
                    None => grouped.push((&s.model_name, &s.reason, vec![dt])),
                }
            }
            for (m, r, dts) in grouped {
                let dts: Vec<String> = dts.into_iter().filter(|d| !d.is_empty()).collect();
                let dts = if dts.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", dts.join(", "))
                };
                report
                    .model_notes
                    .push(format!("{m}{dts}: not measured: {r}"));
            }
            report.model_notes.extend(o.python.iter().cloned());
            report.model_notes.extend(o.warnings.iter().cloned());
            report
                .model_notes
                .extend(o.training.iter().map(TrainingRun::note));
            report.model_notes.push(format!(
                "model level: {} measurement(s) in {:.1} s",
                o.reports.len() + o.training.len(),
                o.seconds
            ));
            report.model.extend(o.reports);
            Ok(())
        }
        Err(e) => {
            report.model_notes.push(e.to_string());
            Err(e)
        }
    }
}

/// A progress line from the harness's stderr, marked as its own once.
fn harness_line(l: &str) -> String {
    if l.starts_with("harness") {
        format!("  {l}")
    } else {
        format!("  harness: {l}")
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// The model folders under `dir`: itself when it holds config.json, else its sub-folders that
/// do (sorted).
pub fn model_dirs(dir: &Path) -> Result<Vec<PathBuf>, String> {
    if dir.join("config.json").is_file() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(format!(
            "{} holds no model folder (a folder with config.json and weights)",
            dir.display()
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_logits_agree_fully() {
        let e = vec![1.0, 2.0, 3.0, 0.5, 0.0, -1.0, 4.0, 4.5, 1.0, 1.0, 0.0, 0.0];
        let m = logit_metrics(&e, &e, 6).unwrap();
        assert_eq!(m.tokens, 2);
        assert_eq!(m.max_abs_diff, 0.0);
        assert_eq!(m.argmax_match_fraction, 1.0);
        assert_eq!(m.top5_overlap, 1.0);
        assert_eq!(m.mean_kl, 0.0);
    }

    #[test]
    fn metrics_match_hand_computed_values() {
        // Token 0: argmax moves from index 1 to 0; token 1 unchanged.
        let e = vec![1.0f32, 2.0, 0.0, 0.0, 1.0, 0.0];
        let c = vec![2.5f32, 2.0, 0.0, 0.0, 1.0, 0.0];
        let m = logit_metrics(&e, &c, 3).unwrap();
        assert_eq!(m.max_abs_diff, 1.5);
        assert_eq!(m.argmax_match_fraction, 0.5);
        // vocab 3 < 5: top-k is the whole vocabulary, overlap 1.
        assert_eq!(m.top5_overlap, 1.0);
        // KL of token 0 by hand: p = softmax(1,2,0), q = softmax(2.5,2,0).
        let sm = |v: [f64; 3]| {
            let z: f64 = v.iter().map(|x| x.exp()).sum();
            v.map(|x| x.exp() / z)
        };
        let (p, q) = (sm([1.0, 2.0, 0.0]), sm([2.5, 2.0, 0.0]));
        let kl0: f64 = (0..3).map(|i| p[i] * (p[i] / q[i]).ln()).sum();
        assert!(
            (m.mean_kl - kl0 / 2.0).abs() < 1e-12,
            "{} vs {}",
            m.mean_kl,
            kl0 / 2.0
        );
    }

    #[test]
    fn top5_overlap_counts_shared_indices() {
        let e: Vec<f32> = (0..10).map(|i| i as f32).collect(); // top5: 9 8 7 6 5
        let mut c = e.clone();
        c[0] = 100.0; // top5: 0 9 8 7 6
        let m = logit_metrics(&e, &c, 10).unwrap();
        assert!((m.top5_overlap - 0.8).abs() < 1e-12);
        assert_eq!(m.argmax_match_fraction, 0.0);
    }

    #[test]
    fn nonfinite_differences_are_infinite_and_shapes_checked() {
        let e = vec![1.0f32, f32::NAN];
        let c = vec![1.0f32, 0.0];
        assert_eq!(
            logit_metrics(&e, &c, 2).unwrap().max_abs_diff,
            f64::INFINITY
        );
        assert_eq!(logit_metrics(&e, &e, 2).unwrap().max_abs_diff, 0.0);
        assert!(logit_metrics(&e, &c[..1], 2).is_err());
        assert!(logit_metrics(&[], &[], 2).is_err());
    }

    #[test]
    fn model_digest_covers_weights_and_config() {
        let d = tempfile::tempdir().unwrap();
        assert!(model_digest(d.path()).is_err(), "no config.json");
        std::fs::write(d.path().join("config.json"), "{}").unwrap();
        std::fs::write(d.path().join("model.safetensors"), b"abc").unwrap();
        std::fs::write(d.path().join("README.md"), "not hashed").unwrap();
        let a = model_digest(d.path()).unwrap();
        std::fs::write(d.path().join("README.md"), "changed").unwrap();
        assert_eq!(model_digest(d.path()).unwrap(), a);
        std::fs::write(d.path().join("model.safetensors"), b"abd").unwrap();
        assert_ne!(model_digest(d.path()).unwrap(), a);
        assert!(a.starts_with("sha256:") && a.len() == 7 + 64);
    }

    /// A stand-in for `python3 -m kernelize_verifier.model_level`: records its arguments in
    /// `argv.txt` beside it and copies prepared outputs into --out-dir (or fails, or hangs), so
    /// the subprocess plumbing is tested without torch.
    #[cfg(unix)]
    fn fake_python(dir: &Path, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("fake-python");
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$(dirname \"$0\")/argv.txt\"\n\
                 while [ $# -gt 0 ]; do case \"$1\" in --out-dir) out=\"$2\"; shift;; esac; shift; done\n{body}\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.display().to_string()
    }

    #[cfg(unix)]
    fn setup() -> (tempfile::TempDir, ModelOptions, KernelBundle) {
        let d = tempfile::tempdir().unwrap();
        let model = d.path().join("tiny");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("config.json"), "{}").unwrap();
        std::fs::write(model.join("model.safetensors"), b"w").unwrap();
        std::fs::write(d.path().join("eval.txt"), "hello").unwrap();
        // Prepared harness output: 2 tokens x vocab 3, the candidate flips one argmax.
        let prep = d.path().join("prep");
        std::fs::create_dir_all(&prep).unwrap();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let e = bytes(&[1.0, 2.0, 0.0, 0.0, 1.0, 0.0]);
        let c = bytes(&[2.5, 2.0, 0.0, 0.0, 1.0, 0.0]);
        let ids = [104i64, 101]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>();
        let views = vec![
            (
                "input_ids",
                safetensors::tensor::TensorView::new(StDtype::I64, vec![2], &ids).unwrap(),
            ),
            (
                "eager_logits",
                safetensors::tensor::TensorView::new(StDtype::F32, vec![2, 3], &e).unwrap(),
            ),
            (
                "candidate_logits",
                safetensors::tensor::TensorView::new(StDtype::F32, vec![2, 3], &c).unwrap(),
            ),
        ];
        safetensors::serialize_to_file(views, &None, &prep.join("tiny.bf16.safetensors")).unwrap();
        let summary = serde_json::json!({
            "harness_version": 1,
            "runs": [{"model_name": "tiny", "model_dir": model, "dtype": "bf16",
                      "file": "tiny.bf16.safetensors", "tokens": 2, "layers_replaced": 3,
                      "replaced": ["a", "b", "c"], "adaptation": "",
                      "eager_mean_top1_prob": 0.75, "seconds": 0.1}],
            "skipped": [{"model_name": "other", "dtype": "f32", "reason": "no layer matches"}]
        });
        std::fs::write(prep.join("summary.json"), summary.to_string()).unwrap();
        let opts = ModelOptions {
            models: vec![model],
            text: d.path().join("eval.txt"),
            python: String::new(),
            python_path: d.path().to_path_buf(),
            max_tokens: 16,
            timeout: Duration::from_secs(20),
            python_candidate: PythonOptions::default(),
        };
        let bundle = KernelBundle::from_parts(
            r#"
name = "k"
version = "0.1.0"
op = "silu"
description = "t"
authors = ["t"]
license = "MIT"
source = "k.cu"
[entry]
bf16 = "k_bf16"
[launch]
block = 256
grid = "per_element"
"#,
            "extern \"C\" __global__ void k_bf16() {}",
        )
        .unwrap();
        (d, opts, bundle)
    }

    #[cfg(unix)]
    #[test]
    fn harness_output_becomes_model_reports() {
        let (d, mut opts, bundle) = setup();
        let prep = d.path().join("prep");
        opts.python = fake_python(
            d.path(),
            &format!(
                "echo 'tiny bf16: 3 layers' >&2\ncp {}/* \"$out\"/",
                prep.display()
            ),
        );
        let mut lines = vec![];
        let o = run_models(&bundle, &[DType::Bf16], &opts, &mut |l| {
            lines.push(l.to_string())
        })
        .unwrap();
        assert_eq!(o.reports.len(), 1);
        let r = &o.reports[0];
        assert_eq!(
            (r.model_name.as_str(), r.dtype, r.tokens, r.layers_replaced),
            ("tiny", DType::Bf16, 2, 3)
        );
        assert_eq!(r.argmax_match_fraction, 0.5);
        assert_eq!(r.max_logit_abs_diff, 1.5);
        assert_eq!(r.model_digest, model_digest(&opts.models[0]).unwrap());
        assert_eq!(r.eager_mean_top1_prob, Some(0.75));
        assert_eq!(r.adaptation, None, "an empty adaptation is none");
        assert_eq!(
            o.skipped,
            vec![Skipped {
                model_name: "other".into(),
                dtype: Some(DType::F32),
                reason: "no layer matches".into()
            }]
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("harness: tiny bf16: 3 layers")),
            "{lines:?}"
        );
        // A CUDA kernel's harness: `-m kernelize_verifier.model_level`, the python/ folder on
        // PYTHONPATH.
        let argv = std::fs::read_to_string(d.path().join("argv.txt")).unwrap();
        let argv: Vec<&str> = argv.lines().collect();
        assert_eq!(
            &argv[..2],
            ["-m", "kernelize_verifier.model_level"],
            "{argv:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("-m kernelize_verifier.model_level")),
            "{lines:?}"
        );
    }

    /// The confined child (a Python candidate's harness) runs the same module as the plain one.
    #[test]
    fn the_bootstrap_runs_the_harness_module() {
        assert_eq!(HARNESS_MODULE, "kernelize_verifier.model_level");
        assert!(
            HARNESS_BOOTSTRAP.contains(&format!("runpy.run_module('{HARNESS_MODULE}', ")),
            "{HARNESS_BOOTSTRAP}"
        );
    }

    /// The python/ folder is found by the harness (`kernelize_verifier/model_level.py`) and the
    /// client package it imports (`kernelize/`), from the folder itself or a folder below; the
    /// old layout (`kernelize/harness.py`) or either package alone is not enough.
    #[test]
    fn the_python_folder_needs_the_harness_and_the_client() {
        let d = tempfile::tempdir().unwrap();
        let py = d.path().join("python");
        let deep = d.path().join("a").join("b");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::create_dir_all(py.join("kernelize")).unwrap();
        std::fs::write(py.join("kernelize").join("harness.py"), "").unwrap();
        assert_eq!(python_path_from(&deep), None, "the old layout");
        std::fs::create_dir_all(py.join("kernelize_verifier")).unwrap();
        std::fs::write(py.join("kernelize_verifier").join("model_level.py"), "").unwrap();
        assert_eq!(
            python_path_from(&deep),
            None,
            "no client package (kernelize/__init__.py)"
        );
        std::fs::write(py.join("kernelize").join("__init__.py"), "").unwrap();
        assert_eq!(python_path_from(&deep), Some(py.clone()));
        assert_eq!(python_path_from(d.path()), Some(py.clone()));
        std::fs::remove_file(py.join("kernelize_verifier").join("model_level.py")).unwrap();
        assert_eq!(python_path_from(&deep), None, "no harness");
        // The repository's own python/ folder qualifies, found from this crate's folder.
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        assert_eq!(
            python_path_from(Path::new(env!("CARGO_MANIFEST_DIR"))),
            Some(repo.join("python"))
        );
    }

    #[cfg(unix)]
    #[test]
    fn harness_failure_and_hang_are_reported_with_their_stderr() {
        let (d, mut opts, bundle) = setup();
        opts.python = fake_python(
            d.path(),
            "echo 'torch.cuda is not available: run on a GPU machine' >&2\nexit 1",
        );
        let e = run_models(&bundle, &[DType::Bf16], &opts, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("harness failed") && e.contains("torch.cuda is not available"),
            "{e}"
        );

        opts.python = fake_python(d.path(), "sleep 30");
        opts.timeout = Duration::from_millis(300);
        let t = Instant::now();
        let e = run_models(&bundle, &[DType::Bf16], &opts, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("killed after"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));

        opts.python = "/nonexistent/python".into();
        let e = run_models(&bundle, &[DType::Bf16], &opts, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("could not start") && e.contains("--python"),
            "{e}"
        );
    }

    /// A Python candidate's harness is started confined, as the case runner's child is: `-I`,
    /// the kernelize package as a path argument, its package folders, a private directory and
    /// a scrubbed environment; what it ran with becomes a model note.
    #[cfg(unix)]
    #[test]
    fn a_python_candidates_harness_is_confined_and_gets_its_packages() {
        use std::os::unix::fs::PermissionsExt;
        let (d, mut opts, _) = setup();
        let prep = d.path().join("prep");
        let mut summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(prep.join("summary.json")).unwrap()).unwrap();
        summary["python"] = serde_json::json!({"python": "3.12.3", "torch": "2.9.0",
            "packages": {"liger-kernel": "0.8.5"},
            "isolation": ["isolated: a network namespace of its own, no interface but lo"]});
        std::fs::write(prep.join("summary.json"), summary.to_string()).unwrap();
        let (args, env) = (d.path().join("args.txt"), d.path().join("env.txt"));
        let py = d.path().join("fake-python");
        std::fs::write(
            &py,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$@\" > {a}\nenv > {e}\npwd >> {e}\n\
                 while [ $# -gt 0 ]; do case \"$1\" in --out-dir) out=\"$2\"; shift;; esac; shift; done\n\
                 cp {p}/* \"$out\"/\n",
                a = args.display(),
                e = env.display(),
                p = prep.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
        opts.python = py.display().to_string();
        let pkgs = d.path().join("pkgs");
        opts.python_candidate = PythonOptions {
            package_dirs: vec![pkgs.clone()],
            require_network_isolation: true,
            ..Default::default()
        };
        let bundle = KernelBundle::from_parts(
            r#"
name = "py"
version = "0.1.0"
op = "silu"
description = "t"
authors = ["t"]
license = "MIT"
runtime = "python"
source = "k.py"
requires = ["liger-kernel==0.8.5"]
[entry]
bf16 = "silu"
"#,
            "def silu(x):\n    return x\n",
        )
        .unwrap();
        let mut report = kernel_registry::report::tests_support::report_with(0, 0);
        attach(&mut report, &bundle, &opts, &mut |_| {}).unwrap();
        assert_eq!(report.model.len(), 1);
        assert!(
            report.model_notes.iter().any(|n| n
                == "model level ran the Python candidate in a confined child: python 3.12.3, torch 2.9.0, liger-kernel 0.8.5; isolated: a network namespace of its own, no interface but lo"),
            "{:?}",
            report.model_notes
        );
        let args = std::fs::read_to_string(&args).unwrap();
        let args: Vec<&str> = args.lines().collect();
        assert_eq!(&args[..2], ["-I", "-c"], "{args:?}");
        assert_eq!(args[2], HARNESS_BOOTSTRAP);
        assert_eq!(args[3], opts.python_path.display().to_string());
        let at = args.iter().position(|a| *a == "--package-dir").unwrap();
        assert_eq!(args[at + 1], pkgs.display().to_string());
        assert!(args.contains(&"--require-network-isolation"), "{args:?}");
        assert!(
            !args.contains(&"--device"),
            "on the GPU by default: {args:?}"
        );
        let env = std::fs::read_to_string(&env).unwrap();
        let cwd = env.lines().last().unwrap();
        assert!(cwd.ends_with("/home"), "{env}");
        assert!(env.contains(&format!("HOME={cwd}\n")), "{env}");
        assert!(env.contains("HF_HUB_OFFLINE=1"), "{env}");
        assert!(!env.contains("PYTHONPATH="), "{env}");
        if std::env::var_os("CARGO_MANIFEST_DIR").is_some() {
            assert!(!env.contains("CARGO_MANIFEST_DIR="), "{env}");
        }

        // A Python candidate's summary must say what it ran with.
        summary.as_object_mut().unwrap().remove("python");
        std::fs::write(prep.join("summary.json"), summary.to_string()).unwrap();
        let e = run_models(&bundle, &[DType::Bf16], &opts, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not say what it ran with"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn attach_adds_measurements_and_one_note_per_skipped_model() {
        let (d, mut opts, bundle) = setup();
        let prep = d.path().join("prep");
        // The same model skipped for two dtypes gives one note.
        let mut summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(prep.join("summary.json")).unwrap()).unwrap();
        summary["runs"][0]["eager_repeat_identical"] = serde_json::json!(false);
        summary["skipped"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"model_name": "other", "dtype": "bf16", "reason": "no layer matches"}));
        std::fs::write(prep.join("summary.json"), summary.to_string()).unwrap();
        opts.python = fake_python(d.path(), &format!("cp {}/* \"$out\"/", prep.display()));
        let mut report = kernel_registry::report::tests_support::report_with(0, 0);
        attach(&mut report, &bundle, &opts, &mut |_| {}).unwrap();
        assert_eq!(report.model.len(), 1);
        let skipped: Vec<_> = report
            .model_notes
            .iter()
            .filter(|n| n.contains("not measured"))
            .collect();
        assert_eq!(
            skipped,
            vec!["other (f32, bf16): not measured: no layer matches"]
        );
        assert!(report
            .model_notes
            .iter()
            .any(|n| n.starts_with("model level: 1 measurement(s)")));
        assert!(
            report
                .model_notes
                .iter()
                .any(|n| n.contains("run-to-run noise")),
            "{:?}",
            report.model_notes
        );

        // A failing harness leaves the cases alone and says why in the notes.
        opts.python = fake_python(d.path(), "echo boom >&2; exit 1");
        let mut report = kernel_registry::report::tests_support::report_with(0, 0);
        let cases = report.cases.clone();
        assert!(attach(&mut report, &bundle, &opts, &mut |_| {}).is_err());
        assert_eq!(report.cases, cases);
        assert!(report.model.is_empty());
        assert!(
            report.model_notes[0].contains("boom"),
            "{:?}",
            report.model_notes
        );
    }
}
