//! Python candidates of backward ops (docs/spec.md section 2b's backward signatures;
//! docs/backward.md, "What the verifier lacks", items 1-4) through the Python runner, on the CPU:
//! eager PyTorch candidates (autograd, or the formula in f32) get every input in its own dtype
//! (layer_norm_backward's f32 statistics), return their gradients as a tuple, and the child
//! checks each (count, shape, dtype, device, every element written, new memory every call,
//! inputs unchanged, addresses, batches where no gradient sums the rows, the timed calls). The
//! gradients are checked here against the f64 oracle; no reference layer is involved (a
//! backward op has none outside a CUDA candidate's process yet: the case says so and has no
//! verdict). Needs a Python with torch (`KERNELIZE_PYTHON`, else `python3`); without one every
//! test says so loudly and checks nothing else, or fails when `KERNELIZE_REQUIRE_PYTHON=1`.

use kernel_registry::report::{CaseStatus, DeviceInfo};
use kernel_registry::{Arch, DType, KernelBundle, Op};
use std::path::{Path, PathBuf};
use std::time::Duration;
use verifier::cases::{self, CaseInputs, CaseSpec};
use verifier::gpu::ReferenceOutputs;
use verifier::python::{PyDevice, PyRun, PythonExecutor, PythonOptions, ReferenceLayers};
use verifier::{oracle, ExecError, Executor, Limits};

fn python() -> Option<PathBuf> {
    let py = PathBuf::from(std::env::var_os("KERNELIZE_PYTHON").unwrap_or("python3".into()));
    let ok = std::process::Command::new(&py)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var_os("KERNELIZE_REQUIRE_PYTHON").is_some_and(|v| v == "1") {
        panic!(
            "{} cannot import torch and KERNELIZE_REQUIRE_PYTHON=1: set KERNELIZE_PYTHON to a Python with torch (scripts/test uses python/.venv)",
            py.display()
        );
    }
    if !ok {
        eprintln!(
            "SKIPPED: {} cannot import torch; set KERNELIZE_PYTHON to a Python with torch to run the Python runner's backward tests",
            py.display()
        );
    }
    ok.then_some(py)
}

/// No reference layers: a backward case must not ask for one (there is none outside a CUDA
/// candidate's process yet).
struct NoReference;

impl ReferenceLayers for NoReference {
    fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
        Ok(DeviceInfo {
            name: "CPU (test)".into(),
            arch: Arch::new(9, 0),
            sm_count: 1,
            driver_version: "0".into(),
            cuda_version: "0".into(),
            copy_gbps: 1e6,
            threads_per_sm: None,
        })
    }
    fn reference(
        &mut self,
        spec: &CaseSpec,
        _inputs: &CaseInputs,
        _reps: u32,
        _dir: &Path,
    ) -> Result<ReferenceOutputs, ExecError> {
        panic!("{}: a backward case asked for a forward reference", spec.id)
    }
}

fn toml(op: Op, function: &str) -> String {
    format!(
        r#"
name = "fake_py_{op}"
version = "1.0.0"
op = "{op}"
semantics = "{sem}"
description = "a fake Python candidate of a backward op"
authors = ["tests"]
license = "MIT"
runtime = "python"
source = "kernel.py"
requires = ["torch>=2.0"]

[entry]
bf16 = "{function}"
f32 = "{function}"
"#,
        sem = op.default_semantics()
    )
}

/// HF LlamaRMSNorm's gradients through eager autograd, `body` run first (it may return early or
/// change `dx` and `dw` before they are returned).
fn rms_candidate(body: &str, after: &str) -> KernelBundle {
    let src = format!(
        "import torch\n\nCACHE = {{}}\n\n\ndef grads(dy, x, w, eps):\n    with torch.enable_grad():\n        xx = x.detach().requires_grad_(True)\n        ww = w.detach().requires_grad_(True)\n        h = xx.float()\n        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)\n        y = ww * h.to(xx.dtype)\n        return torch.autograd.grad(y, (xx, ww), dy)\n\n\ndef rms_norm_backward(dy, x, w, eps):\n{body}\n    dx, dw = grads(dy, x, w, eps)\n{after}\n    return dx, dw\n"
    );
    KernelBundle::from_parts(&toml(Op::RmsNormBackward, "rms_norm_backward"), &src).unwrap()
}

/// layer_norm_backward from the given f32 statistics, in f32 (eager's formula; the CPU's
/// native_layer_norm_backward wants them in the input's dtype).
fn layer_norm_candidate() -> KernelBundle {
    let src = "import torch\n\n\ndef layer_norm_backward(dy, x, mean, rstd, w):\n    assert mean.dtype == torch.float32 and rstd.dtype == torch.float32, (mean.dtype, rstd.dtype)\n    assert mean.shape == (x.shape[0],) and rstd.shape == (x.shape[0],), (mean.shape, rstd.shape)\n    xhat = (x.float() - mean[:, None]) * rstd[:, None]\n    g = dy.float() * w.float()\n    dx = rstd[:, None] * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))\n    dw = (dy.float() * xhat).sum(0)\n    db = dy.float().sum(0)\n    return dx.to(x.dtype), dw.to(x.dtype), db.to(x.dtype)\n";
    KernelBundle::from_parts(&toml(Op::LayerNormBackward, "layer_norm_backward"), src).unwrap()
}

/// silu(gate) * up's gradients through eager autograd, `body` run first.
fn silu_mul_candidate(body: &str) -> KernelBundle {
    let src = format!(
        "import torch\n\nCACHE = {{}}\n\n\ndef grads(dy, gate, up):\n    with torch.enable_grad():\n        g = gate.detach().requires_grad_(True)\n        u = up.detach().requires_grad_(True)\n        y = torch.nn.functional.silu(g) * u\n        return torch.autograd.grad(y, (g, u), dy)\n\n\ndef silu_mul_backward(dy, gate, up):\n{body}\n    return grads(dy, gate, up)\n"
    );
    KernelBundle::from_parts(&toml(Op::SiluMulBackward, "silu_mul_backward"), &src).unwrap()
}

fn spec(op: Op, dt: DType, rows: u64, cols: u64) -> CaseSpec {
    let mut s = cases::suite(op, op.default_semantics(), &[dt], true, 7, &[])
        .into_iter()
        .find(|s| !s.large_index && s.dist == cases::Dist::Normal)
        .unwrap();
    (s.rows, s.cols) = (rows, cols);
    s.measure_speed = true;
    s.check_batch = !op.gradients().iter().any(|g| g.one_row);
    s
}

fn executor(py: PathBuf) -> PythonExecutor<NoReference> {
    PythonExecutor::new(
        NoReference,
        PythonOptions {
            python: py,
            device: PyDevice::Cpu,
            case_limit: Duration::from_secs(120),
            ..Default::default()
        },
    )
    .unwrap()
}

const LIMITS: Limits = Limits {
    launch_s: 5.0,
    speed_reps: 3,
};

/// Every call's gradients have their sizes, and call 1's are within `tol` (relative to the
/// largest truth) of the f64 oracle.
fn check_gradients(spec: &CaseSpec, run: &PyRun, tol: f64) {
    let es = spec.dtype.size_bytes() as u64;
    assert_eq!(run.outputs.len(), 3, "3 calls");
    for call in &run.outputs {
        let sizes: Vec<u64> = call.iter().map(|b| b.len() as u64).collect();
        let want: Vec<u64> = spec
            .op
            .gradients()
            .iter()
            .map(|g| g.elements(spec.rows, spec.cols) * es)
            .collect();
        assert_eq!(sizes, want, "{}", spec.id);
    }
    let pairs: Vec<(&[u8], &[u8])> = run.outputs[0]
        .iter()
        .map(|b| (b.as_slice(), b.as_slice()))
        .collect();
    let acc = oracle::backward_accuracy(spec, &run.inputs, &pairs);
    for (g, a) in spec.op.gradients().iter().zip(&acc) {
        let (_, truth) = oracle::backward_truth(spec, &run.inputs, g);
        let scale = truth.iter().fold(0f64, |m, v| m.max(v.abs()));
        assert!(
            a.candidate_max_abs <= tol * scale,
            "{} {}: max abs error {} against a largest truth of {scale}",
            spec.id,
            g.name,
            a.candidate_max_abs
        );
    }
}

#[test]
fn an_eager_rms_norm_backward_runs_through_the_suites_checks() {
    let Some(py) = python() else { return };
    let mut ex = executor(py);
    let b = rms_candidate("", "");
    for (dt, tol) in [(DType::Bf16, 1.0 / 64.0), (DType::F32, 1e-5)] {
        let s = spec(Op::RmsNormBackward, dt, 24, 64);
        let run = ex.run_candidate(&b, &s, &LIMITS).unwrap();
        check_gradients(&s, &run, tol);
        assert!(run.deterministic, "{:?}", run.notes);
        assert!(
            run.integrity_failures.is_empty(),
            "{:?}",
            run.integrity_failures
        );
        // dw sums the rows: no batch compositions, and the timed calls on the same rows.
        assert_eq!(run.batch_invariant, None);
        let t = run.timed.as_ref().expect("timed");
        assert!(t.median_us > 0.0 && t.bad.is_empty(), "{t:?}");
        // run_case: the child's checks, no verdict (no reference layer for a backward op).
        let c = ex.run_case(&b, &s, &LIMITS, 1e6).unwrap();
        assert_eq!(c.status, CaseStatus::Error, "{c:?}");
        let note = c.note.as_deref().unwrap();
        assert!(
            note.contains("not compared with a reference") && note.contains("median time"),
            "{note}"
        );
        assert_eq!(c.deterministic, Some(true));
        assert!(c.integrity_failures.is_empty() && c.exactness.is_none());
    }
    assert_eq!(ex.children_started, 1);
}

#[test]
fn layer_norm_backward_gets_its_f32_statistics() {
    let Some(py) = python() else { return };
    let mut ex = executor(py);
    let b = layer_norm_candidate();
    // The candidate asserts mean and rstd are f32 `[rows]`: it raises otherwise.
    for (dt, tol) in [(DType::Bf16, 1.0 / 64.0), (DType::F32, 1e-5)] {
        let s = spec(Op::LayerNormBackward, dt, 16, 48);
        let run = ex.run_candidate(&b, &s, &LIMITS).unwrap();
        check_gradients(&s, &run, tol);
        assert!(
            run.integrity_failures.is_empty(),
            "{:?}",
            run.integrity_failures
        );
        assert!(run.timed.as_ref().is_some_and(|t| t.bad.is_empty()));
    }
}

#[test]
fn gated_backward_is_checked_in_batches_and_rotated_timed_calls() {
    let Some(py) = python() else { return };
    let mut ex = executor(py);
    let s = spec(Op::SiluMulBackward, DType::Bf16, 16, 32);
    assert!(s.check_batch);
    let run = ex
        .run_candidate(&silu_mul_candidate(""), &s, &LIMITS)
        .unwrap();
    check_gradients(&s, &run, 1.0 / 64.0);
    assert_eq!(run.batch_invariant, Some(true), "{:?}", run.notes);
    assert!(
        run.integrity_failures.is_empty(),
        "{:?}",
        run.integrity_failures
    );
    // A gradient that depends on the batch's size.
    let body = "    if gate.shape[0] < 4:\n        dg, du = grads(dy, gate, up)\n        return dg, du * 2";
    let run = ex
        .run_candidate(&silu_mul_candidate(body), &s, &LIMITS)
        .unwrap();
    assert_eq!(run.batch_invariant, Some(false));
    assert!(
        run.notes.iter().any(|n| n.contains("not batch-invariant")),
        "{:?}",
        run.notes
    );
    // A copy of an earlier answer for the same input addresses: the rotated timed calls catch it.
    let body = "    key = (dy.data_ptr(), gate.data_ptr(), up.data_ptr(), tuple(gate.shape))\n    if key not in CACHE:\n        CACHE[key] = grads(dy, gate, up)\n    return tuple(t.clone() for t in CACHE[key])";
    let run = ex
        .run_candidate(&silu_mul_candidate(body), &s, &LIMITS)
        .unwrap();
    let t = run.timed.as_ref().unwrap();
    assert!(!t.bad.is_empty(), "{t:?}");
    let c = ex
        .run_case(&silu_mul_candidate(body), &s, &LIMITS, 1e6)
        .unwrap();
    assert!(
        c.integrity_failures
            .iter()
            .any(|f| f.contains("timed launches left a wrong output")),
        "{:?}",
        c.integrity_failures
    );
}

#[test]
fn a_kept_dw_is_caught_by_negated_timed_calls() {
    // rms_norm_backward's dw sums the rows, so the timed calls cannot rotate them: every other
    // one gets dy negated and must give dx and dw negated. A copy of an earlier answer for the
    // same input addresses is then wrong every other call.
    let Some(py) = python() else { return };
    let mut ex = executor(py);
    let body = "    key = (dy.data_ptr(), x.data_ptr(), w.data_ptr(), tuple(x.shape))\n    if key not in CACHE:\n        CACHE[key] = grads(dy, x, w, eps)\n    return tuple(t.clone() for t in CACHE[key])";
    for rows in [16, 1] {
        let s = spec(Op::RmsNormBackward, DType::Bf16, rows, 32);
        let run = ex
            .run_candidate(&rms_candidate(body, ""), &s, &LIMITS)
            .unwrap();
        let t = run.timed.as_ref().unwrap();
        assert!(!t.bad.is_empty(), "{rows} rows: {t:?}");
    }
    // The same for a one-row gated case (no rows to rotate).
    let body = "    key = (dy.data_ptr(), gate.data_ptr(), up.data_ptr(), tuple(gate.shape))\n    if key not in CACHE:\n        CACHE[key] = grads(dy, gate, up)\n    return tuple(t.clone() for t in CACHE[key])";
    let s = spec(Op::SiluMulBackward, DType::F32, 1, 32);
    let run = ex
        .run_candidate(&silu_mul_candidate(body), &s, &LIMITS)
        .unwrap();
    assert!(!run.timed.as_ref().unwrap().bad.is_empty());
}

/// The quick suite (its narrow cases: every distribution, the non-finite and extreme ones
/// included) of honest eager candidates: the child's checks find nothing, the timed calls'
/// negated incoming gradients included (eager's gradients are exactly odd in dy).
#[test]
fn honest_backward_candidates_pass_the_childs_checks_over_the_quick_suite() {
    let Some(py) = python() else { return };
    let mut ex = executor(py);
    let narrow = |b: KernelBundle| {
        let toml = b.manifest_toml.clone() + "\n[constraints]\ncols_max = 128\n";
        KernelBundle::from_parts(&toml, &b.source).unwrap()
    };
    for b in [
        narrow(rms_candidate("", "")),
        narrow(layer_norm_candidate()),
        narrow(silu_mul_candidate("")),
    ] {
        let opts = verifier::VerifyOptions {
            dtypes: Some(vec![DType::Bf16, DType::F32]),
            quick: true,
            seed: Some(3),
            limits: LIMITS,
            ..Default::default()
        };
        let r = verifier::verify_with(&mut ex, &b, &opts, &mut |_| {}).unwrap();
        let measured: Vec<_> = r
            .cases
            .iter()
            .filter(|c| c.status != CaseStatus::NotApplicable)
            .collect();
        assert!(!measured.is_empty(), "{}", b.manifest.name);
        for c in measured {
            let note = c.note.as_deref().unwrap_or("");
            assert!(
                c.status == CaseStatus::Error && note.contains("not compared with a reference"),
                "{} {}: {c:?}",
                b.manifest.name,
                c.id
            );
            assert!(
                c.integrity_failures.is_empty(),
                "{} {}: {:?}",
                b.manifest.name,
                c.id,
                c.integrity_failures
            );
            assert_eq!(c.deterministic, Some(true), "{} {}", b.manifest.name, c.id);
            // rms_norm_backward and layer_norm_backward have no batches (dw sums the rows);
            // silu_mul_backward has, and eager's CPU silu is not batch-invariant where the
            // columns leave a tail to its vectorised loop (f32, 127 columns: a batch of one row
            // puts other elements in the tail), so its batches are not asserted here.
            if b.manifest.op.gradients().iter().any(|g| g.one_row) {
                assert_eq!(c.batch_invariant, None, "{} {}", b.manifest.name, c.id);
            }
        }
    }
}

/// Every distribution (zeros, subnormals, non-finite values, huge and tiny scales): eager's
/// gradients negate exactly when dy does (the sign of a zero and NaN bits aside), so honest
/// candidates pass the negated timed calls, and the other checks find nothing.
#[test]
fn negated_timed_calls_hold_for_eager_on_every_distribution() {
    let Some(py) = python() else { return };
    let mut ex = executor(py);
    let candidates = [
        (Op::RmsNormBackward, rms_candidate("", "")),
        (Op::LayerNormBackward, layer_norm_candidate()),
    ];
    for (op, b) in &candidates {
        for dt in [DType::Bf16, DType::F32] {
            for dist in std::iter::once(cases::Dist::Normal).chain(cases::Dist::ALL_SPECIAL) {
                for (rows, cols) in [(24, 64), (1, 33)] {
                    let mut s = spec(*op, dt, rows, cols);
                    s.dist = dist;
                    let run = ex.run_candidate(b, &s, &LIMITS).unwrap();
                    let what = format!("{op} {dt} {dist} {rows}x{cols}");
                    assert!(
                        run.timed.as_ref().unwrap().bad.is_empty(),
                        "{what}: {:?}",
                        run.timed
                    );
                    assert!(
                        run.integrity_failures.is_empty(),
                        "{what}: {:?}",
                        run.integrity_failures
                    );
                    assert!(run.deterministic, "{what}: {:?}", run.notes);
                }
            }
        }
    }
}

#[test]
fn wrong_gradients_are_refused_naming_the_gradient() {
    let Some(py) = python() else { return };
    let mut ex = executor(py);
    let s = spec(Op::RmsNormBackward, DType::Bf16, 8, 32);
    let refused: [(&str, &str, &[&str]); 6] = [
        (
            "    return grads(dy, x, w, eps)[0]",
            "",
            &[
                "integrity",
                "returned Tensor, not a tuple of 2 tensors (dx, dw)",
            ],
        ),
        (
            "    return grads(dy, x, w, eps) + (w,)",
            "",
            &["returned 3 values, expected 2 (dx, dw)"],
        ),
        (
            "",
            "    dw = dw[None, :]",
            &["returned `dw` with shape [1, 32], expected [32]"],
        ),
        (
            "",
            "    dw = dw.float()",
            &["returned `dw` with dtype torch.float32, expected torch.bfloat16"],
        ),
        (
            "",
            "    dx = [dx]",
            &["returned `dx` as list, not a tensor"],
        ),
        (
            "    raise ValueError('no')",
            "",
            &["raised", "ValueError: no"],
        ),
    ];
    for (body, after, words) in refused {
        let e = ex
            .run_candidate(&rms_candidate(body, after), &s, &LIMITS)
            .unwrap_err();
        assert!(
            matches!(e, ExecError::Candidate { .. }),
            "{body}{after}: {e:?}"
        );
        let m = e.to_string();
        for w in words {
            assert!(m.contains(w), "{body}{after}: `{w}` not in {m}");
        }
    }
    // A one-gradient op may return its gradient bare or in a tuple.
    let src = |ret: &str| {
        format!("import torch\n\n\ndef silu_backward(dy, x):\n    dx = torch.ops.aten.silu_backward(dy, x)\n    return {ret}\n")
    };
    let s1 = spec(Op::SiluBackward, DType::Bf16, 4, 32);
    for ret in ["dx", "(dx,)"] {
        let b =
            KernelBundle::from_parts(&toml(Op::SiluBackward, "silu_backward"), &src(ret)).unwrap();
        let run = ex.run_candidate(&b, &s1, &LIMITS).unwrap();
        check_gradients(&s1, &run, 1.0 / 64.0);
    }
    assert_eq!(ex.children_started, 1);
}

#[test]
fn integrity_is_checked_per_gradient() {
    let Some(py) = python() else { return };
    let mut ex = executor(py);
    let s = spec(Op::RmsNormBackward, DType::Bf16, 8, 32);
    // dy overwritten in place (Liger's in_place backward does so).
    let run = ex
        .run_candidate(&rms_candidate("", "    dy.copy_(dx)"), &s, &LIMITS)
        .unwrap();
    assert!(
        run.integrity_failures
            .iter()
            .any(|f| f.contains("input `dy`") && f.contains("changed by call 1")),
        "{:?}",
        run.integrity_failures
    );
    // The same dw tensor handed back by every call.
    let after = "    dw = CACHE.setdefault('dw', dw)";
    let run = ex
        .run_candidate(&rms_candidate("", after), &s, &LIMITS)
        .unwrap();
    assert!(
        run.integrity_failures
            .iter()
            .any(|f| f.starts_with("dw: call 2 returned the memory of call 1's `dw`")),
        "{:?}",
        run.integrity_failures
    );
    // dw's last element never written. On the CPU torch.empty is not the poisoned block handed
    // back (the GPU's caching allocator does that), so the candidate emulates what such an
    // element holds there: call 2's bits the exact complement of call 1's.
    let after = "    n = CACHE.setdefault('n', [0])\n    n[0] += 1\n    if n[0] == 1:\n        CACHE['last'] = dw[-1:].clone()\n    elif n[0] == 2:\n        dw = dw.clone()\n        dw[-1:] = CACHE['last'].view(torch.int16).bitwise_not().view(dw.dtype)";
    let run = ex
        .run_candidate(&rms_candidate("", after), &s, &LIMITS)
        .unwrap();
    assert!(
        run.integrity_failures
            .iter()
            .any(|f| f == "dw: output: 1 of 32 elements never written (first: row 0, col 31)"),
        "{:?}",
        run.integrity_failures
    );
    // Every output at the address placements: a dw that depends on x's address.
    let after = "    if x.data_ptr() % 64 != 0:\n        dw = dw * 2";
    let run = ex
        .run_candidate(&rms_candidate("", after), &s, &LIMITS)
        .unwrap();
    assert!(
        run.integrity_failures
            .iter()
            .any(|f| f.contains("output depends on the buffer address") && f.contains("dw")),
        "{:?}",
        run.integrity_failures
    );
    // fused_add_rms_norm_backward: dres is an input (not written back as a residual).
    let src = "import torch\n\n\ndef fused_add_rms_norm_backward(dy, dres, x, w, eps):\n    with torch.enable_grad():\n        xx = x.detach().requires_grad_(True)\n        ww = w.detach().requires_grad_(True)\n        h = xx.float()\n        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)\n        y = ww * h.to(xx.dtype)\n        dx, dw = torch.autograd.grad(y, (xx, ww), dy)\n    return dx + dres, dw\n";
    let b = KernelBundle::from_parts(
        &toml(Op::FusedAddRmsNormBackward, "fused_add_rms_norm_backward"),
        src,
    )
    .unwrap();
    let s2 = spec(Op::FusedAddRmsNormBackward, DType::F32, 8, 32);
    let run = ex.run_candidate(&b, &s2, &LIMITS).unwrap();
    assert!(run.residuals.is_empty());
    assert!(
        run.integrity_failures.is_empty(),
        "{:?}",
        run.integrity_failures
    );
    check_gradients(&s2, &run, 1e-5);
}

/// A Python whose torch sees a CUDA GPU, or `None` after saying loudly that the GPU test ran
/// nothing (a failure with `KERNELIZE_REQUIRE_GPU=1`).
fn cuda_python() -> Option<PathBuf> {
    let py = python()?;
    let ok = std::process::Command::new(&py)
        .args([
            "-c",
            "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let require = std::env::var("KERNELIZE_REQUIRE_GPU").as_deref() == Ok("1");
        eprintln!("\n{}", "#".repeat(78));
        eprintln!(
            "#  PYTHON BACKWARD GPU TEST SKIPPED: torch sees no CUDA GPU ({}).",
            py.display()
        );
        eprintln!("#  It ran NOTHING. KERNELIZE_REQUIRE_GPU=1 turns this into a failure.");
        eprintln!("{}\n", "#".repeat(78));
        assert!(
            !require,
            "KERNELIZE_REQUIRE_GPU=1 and torch sees no CUDA GPU"
        );
    }
    ok.then_some(py)
}

/// The same checks with CUDA tensors and PyTorch's caching allocator (the poisoned blocks are
/// handed back there, so an unwritten gradient element holds the poison's complement), and the
/// candidate's output copy checked in the caller's stream order. Skips loudly without a GPU.
#[test]
fn on_a_gpu_the_child_checks_each_gradient() {
    let Some(py) = cuda_python() else { return };
    let mut ex = PythonExecutor::new(
        NoReference,
        PythonOptions {
            python: py,
            device: PyDevice::Cuda,
            case_limit: Duration::from_secs(300),
            ..Default::default()
        },
    )
    .unwrap();
    for (op, b, tol) in [
        (Op::RmsNormBackward, rms_candidate("", ""), 1.0 / 64.0),
        (Op::LayerNormBackward, layer_norm_candidate(), 1.0 / 64.0),
        (Op::SiluMulBackward, silu_mul_candidate(""), 1.0 / 64.0),
    ] {
        let s = spec(op, DType::Bf16, 64, 256);
        let run = ex.run_candidate(&b, &s, &LIMITS).unwrap();
        check_gradients(&s, &run, tol);
        assert!(
            run.integrity_failures.is_empty() && run.deterministic,
            "{op}: {:?} {:?}",
            run.integrity_failures,
            run.notes
        );
        assert!(run.timed.as_ref().is_some_and(|t| t.bad.is_empty()), "{op}");
    }
    let s = spec(Op::RmsNormBackward, DType::Bf16, 64, 256);
    // dw allocated first with torch.empty, its last element never written.
    let run = ex
        .run_candidate(
            &rms_candidate(
                "    out = torch.empty_like(w)",
                "    out[:-1] = dw[:-1]\n    dw = out",
            ),
            &s,
            &LIMITS,
        )
        .unwrap();
    let never = run
        .integrity_failures
        .iter()
        .any(|f| f.starts_with("dw: output: ") && f.contains("never written"));
    eprintln!(
        "GPU: an unwritten dw element: {:?} {:?}",
        run.integrity_failures, run.notes
    );
    // Likely, not certain (the allocator may serve dw from another block): either the poison's
    // complement or calls that differ.
    assert!(never || !run.deterministic, "{:?}", run.integrity_failures);
    // A kept answer handed back: caught by the negated timed calls.
    let body = "    key = (dy.data_ptr(), x.data_ptr(), w.data_ptr(), tuple(x.shape))\n    if key not in CACHE:\n        CACHE[key] = grads(dy, x, w, eps)\n    return tuple(t.clone() for t in CACHE[key])";
    let run = ex
        .run_candidate(&rms_candidate(body, ""), &s, &LIMITS)
        .unwrap();
    assert!(!run.timed.as_ref().unwrap().bad.is_empty());
}
