//! The Python candidate runner (docs/spec.md section 2b) against fake candidates, on the CPU: torch runs them in
//! the child, a host reference (the f64 oracle, rounded) stands in for the GPU's reference
//! layers. Success, an exception, a wrong shape, a wrong dtype, a hang killed, a crash, an input
//! modified, a batch-dependent output; and every hostile candidate of
//! `fixtures/python-hostile` caught. Needs a Python with torch (`KERNELIZE_PYTHON`, else
//! `python3`; `scripts/test` passes python/.venv's); without one every test says so loudly and
//! checks nothing else, or fails when `KERNELIZE_REQUIRE_PYTHON=1` (CI).

mod common;

use kernel_registry::report::{CaseStatus, DeviceInfo};
use kernel_registry::{DType, KernelBundle, Op, Semantics};
use std::path::{Path, PathBuf};
use std::time::Duration;
use verifier::cases::{self, CaseInputs, CaseSpec};
use verifier::gpu::ReferenceOutputs;
use verifier::numeric::{from_f32, round_f64, set_bits};
use verifier::python::{PyDevice, PythonExecutor, PythonOptions, ReferenceLayers};
use verifier::{ExecError, Executor, Limits};

fn python() -> Option<PathBuf> {
    common::python("the Python runner's tests")
}

/// The reference computed on the host: the oracle, rounded to the dtype.
struct HostReference;

impl ReferenceLayers for HostReference {
    fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
        Ok(common::test_device(1, None))
    }
    fn reference(
        &mut self,
        spec: &CaseSpec,
        inputs: &CaseInputs,
        _reps: u32,
        dir: &Path,
    ) -> Result<ReferenceOutputs, ExecError> {
        let n = (spec.rows * spec.cols) as usize;
        // Row-wise ops take whole rows as ranges.
        let cols = spec.cols as usize;
        let rows: Vec<(usize, usize)> = (0..spec.rows as usize).map(|r| (r * cols, cols)).collect();
        let truth = verifier::oracle::oracle(spec, inputs, &rows);
        let mut out = vec![0u8; n * spec.dtype.size_bytes()];
        for (i, v) in truth.iter().enumerate() {
            set_bits(
                spec.dtype,
                &mut out,
                i,
                from_f32(spec.dtype, round_f64(spec.dtype, *v)),
            );
        }
        // As the GPU's reference layers do (the sandbox writes its outputs to `dir`): the
        // answer-key candidate looks for this file.
        std::fs::write(dir.join("ref_out.bin"), &out).unwrap();
        Ok(ReferenceOutputs {
            out,
            residual: None,
            median_us: Some(1000.0),
        })
    }
}

const TOML: &str = r#"
name = "fake_py_rms"
version = "1.0.0"
op = "rms_norm"
semantics = "llama"
description = "a fake Python candidate"
authors = ["tests"]
license = "MIT"
runtime = "python"
source = "kernel.py"
requires = ["torch>=2.0"]

[entry]
bf16 = "rms_norm"
f32 = "rms_norm"
"#;

/// Eager HF LlamaRMSNorm, with `body` run first (it may return early).
fn candidate(body: &str) -> KernelBundle {
    let src = format!(
        "import os\nimport time\n\nimport torch\n\n\ndef rms_norm(x, weight, eps):\n{body}\n    h = x.float()\n    v = h.pow(2).mean(-1, keepdim=True)\n    return weight * (h * torch.rsqrt(v + eps)).to(x.dtype)\n"
    );
    KernelBundle::from_parts(TOML, &src).unwrap()
}

fn spec(rows: u64, cols: u64) -> CaseSpec {
    let mut s =
        cases::suite(Op::RmsNorm, Semantics::Llama, &[DType::Bf16], true, 7, &[])[0].clone();
    (s.rows, s.cols) = (rows, cols);
    s.measure_speed = true;
    s.check_batch = true;
    s.large_index = false;
    s
}

fn executor(py: PathBuf, case_limit: Duration) -> PythonExecutor<HostReference> {
    PythonExecutor::new(
        HostReference,
        PythonOptions {
            python: py,
            device: PyDevice::Cpu,
            case_limit,
            ..Default::default()
        },
    )
    .unwrap()
}

const LIMITS: Limits = Limits {
    launch_s: 5.0,
    speed_reps: 3,
};

#[test]
fn an_eager_candidate_is_measured_like_a_cuda_one() {
    let Some(py) = python() else { return };
    let mut ex = executor(py, Duration::from_secs(120));
    let s = spec(24, 64);
    let c = ex.run_case(&candidate(""), &s, &LIMITS, 1e6).unwrap();
    assert_eq!(c.status, CaseStatus::Ran, "{c:?}");
    assert!(
        c.integrity_failures.is_empty(),
        "{:?}",
        c.integrity_failures
    );
    assert_eq!(c.deterministic, Some(true));
    assert_eq!(c.batch_invariant, Some(true), "{:?}", c.note);
    let e = c.exactness.as_ref().unwrap();
    assert_eq!(e.elements, 24 * 64);
    // Eager rounds twice; the host reference once: a few 1-ulp differences at most.
    assert!(e.max_ulp <= 2, "{e:?}");
    assert!(c.accuracy.is_some());
    let sp = c.speed.as_ref().unwrap();
    assert!(
        sp.median_us > 0.0 && sp.reference_median_us == 1000.0,
        "{sp:?}"
    );
    assert_eq!(sp.bytes_moved, Op::RmsNorm.bytes_moved(DType::Bf16, 24, 64));
    // The report says what ran it.
    let rt = ex.python_runtime().unwrap();
    assert!(
        !rt.torch.is_empty() && rt.packages.contains_key("torch"),
        "{rt:?}"
    );
    // Where this kernel lets an unprivileged process make a user namespace, the child has a
    // network namespace of its own; elsewhere the report says it has not.
    let userns = std::process::Command::new("unshare")
        .args(["--user", "--net", "true"])
        .status()
        .is_ok_and(|s| s.success());
    let want = if userns { "isolated: " } else { "NOT isolated" };
    assert!(rt.isolation[0].starts_with(want), "{rt:?}");
    assert!(
        rt.isolation
            .iter()
            .any(|l| l.starts_with("memory: RLIMIT_DATA 32768 MiB")),
        "{rt:?}"
    );
    assert_eq!(ex.children_started, 1);
}

#[test]
fn failures_of_the_candidate_are_reported_and_the_child_goes_on() {
    let Some(py) = python() else { return };
    let mut ex = executor(py, Duration::from_secs(120));
    let s = spec(8, 32);
    let cases: [(&str, &[&str]); 4] = [
        (
            "    raise RuntimeError('boom')",
            &["raised", "RuntimeError: boom"],
        ),
        (
            "    return x[:, :-1].contiguous()",
            &["integrity", "shape [8, 31], expected [8, 32]"],
        ),
        (
            "    return x.float() * 1.0",
            &["integrity", "dtype torch.float32", "torch.bfloat16"],
        ),
        (
            "    return [x]",
            &["integrity", "returned list, not a tensor"],
        ),
    ];
    for (body, words) in cases {
        let e = ex.run_case(&candidate(body), &s, &LIMITS, 1e6).unwrap_err();
        assert!(matches!(e, ExecError::Candidate { .. }), "{body}: {e:?}");
        assert!(!e.context_broken());
        let m = e.to_string();
        for w in words {
            assert!(m.contains(w), "{body}: `{w}` not in {m}");
        }
    }
    // One child served all of them (each source loaded in turn).
    assert_eq!(ex.children_started, 1);
}

#[test]
fn a_modified_input_is_an_integrity_failure() {
    let Some(py) = python() else { return };
    let mut ex = executor(py, Duration::from_secs(120));
    let c = ex
        .run_case(&candidate("    x.mul_(2)"), &spec(8, 32), &LIMITS, 1e6)
        .unwrap();
    assert!(
        c.integrity_failures
            .iter()
            .any(|f| f.contains("input `x`") && f.contains("changed by call 1")),
        "{:?}",
        c.integrity_failures
    );
}

#[test]
fn a_batch_dependent_output_is_not_batch_invariant() {
    let Some(py) = python() else { return };
    let mut ex = executor(py, Duration::from_secs(120));
    let body = "    if x.shape[0] < 4:\n        return (weight * x * 0.5).to(x.dtype)";
    let c = ex
        .run_case(&candidate(body), &spec(16, 32), &LIMITS, 1e6)
        .unwrap();
    assert_eq!(c.batch_invariant, Some(false));
    assert!(
        c.note.as_deref().unwrap().contains("not batch-invariant"),
        "{:?}",
        c.note
    );
    assert!(c.integrity_failures.is_empty());
}

#[test]
fn a_hung_or_crashed_child_is_killed_and_the_next_case_runs() {
    let Some(py) = python() else { return };
    let mut ex = executor(py, Duration::from_secs(20));
    let s = spec(8, 32);
    // Warm the child up (torch imported) so that the limit below times the hang only.
    ex.run_case(&candidate(""), &s, &LIMITS, 1e6).unwrap();
    ex.opts.case_limit = Duration::from_secs(3);
    let t0 = std::time::Instant::now();
    let e = ex
        .run_case(&candidate("    time.sleep(600)"), &s, &LIMITS, 1e6)
        .unwrap_err();
    assert!(
        matches!(e, ExecError::Timeout { limit_s, .. } if limit_s == 3.0),
        "{e:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    ex.opts.case_limit = Duration::from_secs(120);
    let e = ex
        .run_case(&candidate("    os._exit(7)"), &s, &LIMITS, 1e6)
        .unwrap_err();
    assert!(
        matches!(&e, ExecError::Sandbox(m) if m.contains("exit status: 7")),
        "{e:?}"
    );
    // A fresh child for the next case.
    let c = ex.run_case(&candidate(""), &s, &LIMITS, 1e6).unwrap();
    assert_eq!(c.status, CaseStatus::Ran);
    assert_eq!(ex.children_started, 3);
}

#[test]
fn the_verifier_loop_runs_a_python_candidate_through_the_same_suite() {
    let Some(py) = python() else { return };
    let mut ex = executor(py, Duration::from_secs(120));
    // A quick suite restricted to small requested shapes is still too big for CI's CPU: the
    // constraints leave only the narrow cases applicable.
    let toml = TOML.replace(
        "f32 = \"rms_norm\"\n",
        "f32 = \"rms_norm\"\n\n[constraints]\ncols_max = 128\n",
    );
    let src = candidate("").source;
    let b = KernelBundle::from_parts(&toml, &src).unwrap();
    let opts = verifier::VerifyOptions {
        dtypes: Some(vec![DType::Bf16]),
        quick: true,
        seed: Some(3),
        limits: LIMITS,
        ..Default::default()
    };
    let r = verifier::verify_with(&mut ex, &b, &opts, &mut |_| {}).unwrap();
    let ran: Vec<_> = r
        .cases
        .iter()
        .filter(|c| c.status == CaseStatus::Ran)
        .collect();
    assert!(!ran.is_empty(), "{:?}", r.cases);
    assert!(ran
        .iter()
        .all(|c| c.integrity_failures.is_empty() && c.cols <= 128));
    assert!(
        r.cases.iter().all(|c| c.status != CaseStatus::Error),
        "{:?}",
        r.cases
    );
    let p = r
        .python
        .as_ref()
        .expect("the report records the Python runtime");
    assert!(p.packages.contains_key("torch"));
    assert_eq!(r.kernel.digest, b.digest());
}

// ---- model level: the harness swaps the candidate's function into a real (tiny) model ------

/// A tiny random Llama (2 layers, 5 RMSNorms, byte tokens) saved as a checkpoint folder by
/// `py`, or `None` (said loudly) when that Python has no transformers.
fn tiny_llama(py: &Path, dir: &Path) -> Option<PathBuf> {
    let out = dir.join("tiny-llama");
    let script = format!(
        "import torch, transformers\n\
         torch.manual_seed(0)\n\
         cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, \
         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, \
         max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None)\n\
         m = transformers.LlamaForCausalLM(cfg)\n\
         with torch.no_grad():\n\
         \x20   for mod in m.modules():\n\
         \x20       if 'RMSNorm' in type(mod).__name__:\n\
         \x20           mod.weight.copy_((1 + 0.2 * torch.randn_like(mod.weight)).clamp(0.5, 2))\n\
         m.config.kernelize_tokenizer = 'bytes'\n\
         m.save_pretrained({:?})\n",
        out.display().to_string()
    );
    let o = std::process::Command::new(py)
        .args(["-c", &script])
        .output()
        .unwrap();
    if !o.status.success() {
        eprintln!(
            "SKIPPED: {} cannot save a tiny Llama (transformers missing?): {}",
            py.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        return None;
    }
    Some(out)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A Python with torch, and a temporary folder holding a tiny Llama and `text` as eval.txt (None,
/// said, where there is no such Python).
fn tiny_model_level(text: &str) -> Option<(PathBuf, tempfile::TempDir, PathBuf)> {
    let py = python()?;
    let d = tempfile::tempdir().unwrap();
    let model = tiny_llama(&py, d.path())?;
    std::fs::write(d.path().join("eval.txt"), text).unwrap();
    Some((py, d, model))
}

/// The model level of a Python candidate on the CPU: `model`, the eval text `text`, 64 tokens,
/// the confined child with `package_dirs` first on its path.
fn cpu_model_options(
    py: &Path,
    model: &Path,
    text: &Path,
    package_dirs: Vec<PathBuf>,
) -> verifier::model::ModelOptions {
    verifier::model::ModelOptions {
        models: vec![model.to_path_buf()],
        text: text.to_path_buf(),
        python: py.display().to_string(),
        python_path: repo().join("python"),
        max_tokens: 64,
        timeout: Duration::from_secs(300),
        python_candidate: PythonOptions {
            python: py.to_path_buf(),
            device: PyDevice::Cpu,
            package_dirs,
            ..Default::default()
        },
    }
}

#[test]
fn model_level_runs_the_python_function_in_a_confined_harness() {
    let Some((py, d, model)) =
        tiny_model_level("The quick brown fox jumps over the lazy dog, and then it runs away.")
    else {
        return;
    };
    // A package folder as `pip install --target` leaves it, holding the candidate's function:
    // F.rms_norm (one rounding where LlamaRMSNorm rounds twice), and a record of what the
    // process it runs in looks like.
    let pkgs = d.path().join("pkgs");
    std::fs::create_dir_all(pkgs.join("kz_probe")).unwrap();
    std::fs::create_dir_all(pkgs.join("kz_probe-0.3.0.dist-info")).unwrap();
    std::fs::write(
        pkgs.join("kz_probe-0.3.0.dist-info/METADATA"),
        "Metadata-Version: 2.1\nName: kz_probe\nVersion: 0.3.0\n",
    )
    .unwrap();
    let probe = d.path().join("probe.json");
    std::fs::write(
        pkgs.join("kz_probe/__init__.py"),
        format!(
            "import json, os, sys\nimport torch.nn.functional as F\n\n\
             with open({:?}, 'w') as f:\n\
             \x20   json.dump({{'env': sorted(os.environ), 'cwd': os.getcwd(), \
             'home': os.environ.get('HOME'), 'isolated_flag': sys.flags.isolated}}, f)\n\n\
             CALLS = 0\n\n\n\
             def rms_norm(x, weight, eps):\n\
             \x20   global CALLS\n\
             \x20   CALLS += 1\n\
             \x20   return F.rms_norm(x, x.shape[-1:], weight, eps)\n",
            probe.display().to_string()
        ),
    )
    .unwrap();
    let toml = TOML.replace("fake_py_rms", "probe_rms").replace(
        "requires = [\"torch>=2.0\"]",
        "requires = [\"kz-probe==0.3.0\", \"torch>=2.0\"]",
    );
    let bundle = KernelBundle::from_parts(
        &toml,
        "import kz_probe\n\n\ndef rms_norm(x, weight, eps):\n    return kz_probe.rms_norm(x, weight, eps)\n",
    )
    .unwrap();
    let opts = cpu_model_options(&py, &model, &d.path().join("eval.txt"), vec![pkgs.clone()]);
    let mut lines = vec![];
    let o = verifier::model::run_models(&bundle, &[DType::Bf16, DType::F32], &opts, &mut |l| {
        lines.push(l.to_string())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", lines.join("\n")));
    assert_eq!(o.reports.len(), 2, "{:?} {lines:?}", o.skipped);
    for r in &o.reports {
        assert_eq!(
            (r.model_name.as_str(), r.layers_replaced),
            ("tiny-llama", 5)
        );
        assert_eq!(r.tokens, 64);
        assert!((0.0..=1.0).contains(&r.argmax_match_fraction), "{r:?}");
        assert!(
            r.max_logit_abs_diff.is_finite() && r.mean_kl >= 0.0,
            "{r:?}"
        );
    }
    // bf16: F.rms_norm is not LlamaRMSNorm, so the logits move (by a little).
    let bf16 = o.reports.iter().find(|r| r.dtype == DType::Bf16).unwrap();
    assert!(
        bf16.max_logit_abs_diff > 0.0 && bf16.max_logit_abs_diff < 1.0,
        "{bf16:?}"
    );
    // What it ran with, for the report's model notes.
    let ran = o.python.as_deref().unwrap();
    assert!(
        ran.contains("kz-probe 0.3.0")
            && ran.contains("torch ")
            && ran.contains("memory: RLIMIT_DATA 32768 MiB"),
        "{ran}"
    );
    // The confinement the case runner's child gets: -I, a private working directory and HOME
    // (removed after the run), an environment scrubbed to PATH, LD_LIBRARY_PATH and CUDA's.
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(&probe).unwrap()).unwrap();
    assert_eq!(p["isolated_flag"], 1, "{p}");
    let cwd = p["cwd"].as_str().unwrap();
    assert_eq!(p["home"].as_str(), Some(cwd), "{p}");
    assert!(
        !Path::new(cwd).exists(),
        "the private directory is removed: {p}"
    );
    let env: Vec<&str> = p["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        !env.contains(&"CARGO_MANIFEST_DIR") && !env.contains(&"PYTHONPATH"),
        "{env:?}"
    );
    for k in &env {
        let allowed = verifier::python::PASSED_ENV.contains(k)
            || [
                "HOME",
                "TMPDIR",
                "TRITON_CACHE_DIR",
                "TORCHINDUCTOR_CACHE_DIR",
                "PYTHONDONTWRITEBYTECODE",
                "HF_HUB_OFFLINE",
                "LC_CTYPE",
            ]
            .contains(k);
        // torch and transformers may set a few of their own variables at import time.
        let libs = k.starts_with("KMP_") || k.starts_with("OMP_") || k.starts_with("TOKENIZERS_");
        assert!(allowed || libs, "`{k}` reached the child: {env:?}");
    }

    // A failing import says so, with the harness's message.
    let mut bad = opts.clone();
    bad.python_candidate.package_dirs.clear();
    let e = verifier::model::run_models(&bundle, &[DType::Bf16], &bad, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("importing the Python candidate probe_rms") && e.contains("--package-dir"),
        "{e}"
    );
}

/// A backward candidate's model level is training (docs/backward.md, item 9): the harness trains
/// the model three times (eager; a control with eager's own gradients of the op through the
/// wrapping; the candidate as the backward of every RMSNorm layer), in the confined child, on the
/// CPU here. Eager autograd's own formula trains bit for bit as eager in bf16; a dx 1 % off moves
/// the losses and parameters, and the note says by how much.
#[test]
fn a_backward_candidates_model_level_trains_the_model_with_it() {
    let Some((py, d, model)) = tiny_model_level(
        "The quick brown fox jumps over the lazy dog, and then it runs away into the woods \
         where nobody can find it again for a long, long time.",
    ) else {
        return;
    };
    let toml = TOML
        .replace("fake_py_rms", "eager_rms_backward")
        .replace("op = \"rms_norm\"", "op = \"rms_norm_backward\"")
        .replace("= \"rms_norm\"", "= \"rms_norm_backward\"");
    let source = |scale: &str| {
        format!(
            "import torch\n\n\ndef rms_norm_backward(dy, x, w, eps):\n\
             \x20   with torch.enable_grad():\n\
             \x20       xr = x.detach().requires_grad_(True)\n\
             \x20       wr = w.detach().requires_grad_(True)\n\
             \x20       h = xr.to(torch.float32)\n\
             \x20       h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)\n\
             \x20       dx, dw = torch.autograd.grad(wr * h.to(x.dtype), (xr, wr), dy)\n\
             \x20   return dx * {scale}, dw\n"
        )
    };
    let opts = cpu_model_options(&py, &model, &d.path().join("eval.txt"), vec![]);
    let run = |scale: &str| {
        let bundle = KernelBundle::from_parts(&toml, &source(scale)).unwrap();
        let mut lines = vec![];
        let o = verifier::model::run_models(&bundle, &[DType::Bf16], &opts, &mut |l| {
            lines.push(l.to_string())
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", lines.join("\n")));
        assert!(o.reports.is_empty() && o.skipped.is_empty(), "{o:?}");
        assert_eq!(o.training.len(), 1, "{o:?} {lines:?}");
        o.training[0].clone()
    };
    let exact = run("1");
    assert_eq!(exact.model_name, "tiny-llama");
    assert_eq!(exact.layers_wrapped.len(), 5, "{exact:?}"); // 2 layers x 2 norms + the final norm
    assert!(exact.ok && exact.control_identical, "{exact:?}");
    assert!(
        exact.note().ends_with("bit-identical with eager's"),
        "{}",
        exact.note()
    );
    let off = run("1.01");
    assert!(!off.ok && off.control_identical, "{off:?}");
    assert!(
        off.candidate_parameters_differing.values().sum::<u64>() > 0
            && !off.candidate_gradients_differing.is_empty(),
        "{off:?}"
    );
    assert!(off.note().contains("differs from eager"), "{}", off.note());
}

// ---- hostile candidates: verifier/tests/fixtures/python-hostile, each with its expect.toml -----

/// The Python executor with every case timed (the suite times only GPU-sized shapes, which the
/// CPU cannot run here): the timed calls' checks run too.
struct TimeEveryCase(PythonExecutor<HostReference>);

impl Executor for TimeEveryCase {
    fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
        self.0.device_info()
    }
    fn run_case(
        &mut self,
        bundle: &KernelBundle,
        spec: &CaseSpec,
        limits: &Limits,
        copy_gbps: f64,
    ) -> Result<kernel_registry::report::CaseReport, ExecError> {
        let mut spec = spec.clone();
        spec.measure_speed = true;
        self.0.run_case(bundle, &spec, limits, copy_gbps)
    }
    fn python_runtime(&mut self) -> Option<kernel_registry::report::PythonRuntime> {
        self.0.python_runtime()
    }
}

/// What `expect` misses in `r` (the rules of scripts/python_hostile_check.py, which checks the
/// same files on the GPU, where `gpu_class` and `gpu_text` replace `class` and `text`).
fn missed(expect: &toml::Table, r: &kernel_registry::VerificationReport) -> Vec<String> {
    let v = &r.summary.overall;
    let mut out = Vec::new();
    if let Some(c) = expect.get("class").and_then(|c| c.as_str()) {
        if v.class.to_string() != c {
            out.push(format!("class {}, expected {c}", v.class));
        }
    }
    for (key, got) in [
        ("deterministic", v.deterministic),
        ("integrity_ok", v.integrity_ok),
    ] {
        if let Some(want) = expect.get(key).and_then(|x| x.as_bool()) {
            if got != want {
                out.push(format!("{key} {got}, expected {want}: {:?}", v.problems));
            }
        }
    }
    let texts: Vec<String> = match expect.get("text") {
        Some(toml::Value::String(t)) => vec![t.clone()],
        Some(toml::Value::Array(a)) => a
            .iter()
            .filter_map(|t| t.as_str().map(String::from))
            .collect(),
        _ => vec![],
    };
    if !texts.is_empty() {
        let lines: Vec<&str> = v
            .problems
            .iter()
            .map(String::as_str)
            .chain(r.cases.iter().flat_map(|c| {
                c.integrity_failures
                    .iter()
                    .map(String::as_str)
                    .chain(c.note.as_deref())
            }))
            .collect();
        if !texts
            .iter()
            .any(|t| lines.iter().any(|l| l.contains(t.as_str())))
        {
            out.push(format!("no line says any of {texts:?}: {lines:?}"));
        }
    }
    if let Some(above) = expect.get("mismatch_above").and_then(|x| x.as_float()) {
        if v.max_mismatch_fraction.partial_cmp(&above) != Some(std::cmp::Ordering::Greater) {
            out.push(format!(
                "largest mismatch fraction {}, expected above {above}",
                v.max_mismatch_fraction
            ));
        }
    }
    if let Some(below) = expect.get("wrong_below_rows").and_then(|x| x.as_integer()) {
        let small: Vec<_> = r
            .cases
            .iter()
            .filter(|c| c.status == CaseStatus::Ran && (c.rows as i64) < below)
            .filter_map(|c| c.exactness.as_ref())
            .collect();
        if small.is_empty() || small.iter().any(|e| e.mismatch_fraction <= 0.25) {
            out.push(format!(
                "the cases below {below} rows were not all found wrong"
            ));
        }
    }
    out
}

#[test]
fn every_hostile_python_candidate_is_caught_and_the_control_passes() {
    let Some(py) = python() else { return };
    let root = repo().join("verifier/tests/fixtures/python-hostile");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("expect.toml").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(
        names.len() >= 15 && names.contains(&"control".to_string()),
        "{names:?}"
    );
    let mut failures = Vec::new();
    for name in &names {
        let dir = root.join(name);
        let expect: toml::Table =
            toml::from_str(&std::fs::read_to_string(dir.join("expect.toml")).unwrap()).unwrap();
        if expect.get("gpu_only").and_then(|x| x.as_bool()) == Some(true) {
            eprintln!("{name}: needs a GPU (checked by scripts/python_hostile_check.py there)");
            continue;
        }
        // The suite narrowed to what CI's CPU runs in seconds: widths up to 128.
        let b = KernelBundle::load_dir(&dir).unwrap();
        let toml = format!("{}\n[constraints]\ncols_max = 128\n", b.manifest_toml);
        let b = KernelBundle::from_parts(&toml, &b.source).unwrap();
        let limit = if name == "hangs" { 6 } else { 120 };
        let mut ex = TimeEveryCase(executor(py.clone(), Duration::from_secs(limit)));
        let opts = verifier::VerifyOptions {
            dtypes: Some(vec![DType::Bf16]),
            quick: true,
            seed: Some(5),
            limits: LIMITS,
            ..Default::default()
        };
        match verifier::verify_with(&mut ex, &b, &opts, &mut |_| {}) {
            Ok(r) => {
                let m = missed(&expect, &r);
                eprintln!(
                    "{name}: {} ({}){}",
                    r.summary.overall.class,
                    r.summary
                        .overall
                        .problems
                        .first()
                        .map(String::as_str)
                        .unwrap_or(""),
                    if m.is_empty() {
                        "".into()
                    } else {
                        format!(" MISSED: {m:?}")
                    }
                );
                if !m.is_empty() {
                    failures.push(format!("{name}: {m:?}"));
                }
            }
            Err(e) => failures.push(format!("{name}: verify failed: {e}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
