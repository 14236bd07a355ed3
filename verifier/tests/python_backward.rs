//! Python candidates of backward ops (docs/spec.md section 2b's backward signatures;
//! docs/backward.md, "What the verifier lacks", items 1-6) through the Python runner, on the CPU:
//! eager PyTorch candidates (autograd, or the formula in f32) get every input in its own dtype
//! (layer_norm_backward's f32 statistics), return their gradients as a tuple, and the child
//! checks each (count, shape, dtype, device, every element written, new memory every call,
//! inputs unchanged, addresses, batches where no gradient sums the rows, the timed calls). The
//! gradients are checked here against the f64 oracle, and `run_case` judges them against the
//! reference layers' gradients (`ReferenceLayers::reference_backward`; on the CPU a host stand-in
//! that gives the rounded oracle or bytes a test recorded) with the verdict a CUDA candidate's
//! case gets (`measure::gradients::verdict`). Needs a Python with torch (`KERNELIZE_PYTHON`,
//! else `python3`); without one every test says so loudly and checks nothing else, or fails
//! when `KERNELIZE_REQUIRE_PYTHON=1`. The GPU tests also need torch to see a CUDA GPU.

mod common;

use kernel_registry::report::{CaseStatus, DeviceInfo};
use kernel_registry::{DType, KernelBundle, Op};
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;
use verifier::cases::{self, CaseInputs, CaseSpec};
use verifier::gpu::{BackwardReferenceOutputs, ReferenceOutputs};
use verifier::numeric::set_bits;
use verifier::python::{PyDevice, PyRun, PythonExecutor, PythonOptions, ReferenceLayers};
use verifier::{oracle, ExecError, Executor, Limits};

fn python() -> Option<PathBuf> {
    common::python("the Python runner's backward tests")
}

/// The reference layers on the host, a stand-in for the GPU's (the sandbox's
/// `Request::ReferenceBackward`): a backward case's gradients are the `recorded` ones where a
/// test set them, else the f64 oracle rounded to the dtype on its sampled elements (all of a
/// small case's; zeros elsewhere), and a time of 1000 us when asked for one. Written to the
/// folder as the sandbox writes them. A forward case must not ask.
#[derive(Clone, Default)]
struct HostGradients {
    recorded: Rc<RefCell<Option<Vec<Vec<u8>>>>>,
    /// (case, reps) of every question.
    asked: Rc<RefCell<Vec<(String, u32)>>>,
    /// The device figures the backward reference answers with, where a test sets them (else
    /// `device_info`'s: 132 SMs of 2048 threads).
    figures: Rc<RefCell<Option<(u64, u64)>>>,
}

impl ReferenceLayers for HostGradients {
    fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
        Ok(common::test_device(132, Some(2048)))
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
    fn reference_backward(
        &mut self,
        spec: &CaseSpec,
        inputs: &CaseInputs,
        reps: u32,
        dir: &Path,
    ) -> Result<BackwardReferenceOutputs, ExecError> {
        self.asked.borrow_mut().push((spec.id.clone(), reps));
        let grads = match &*self.recorded.borrow() {
            Some(g) => g.clone(),
            None => oracle::rounded_backward_truth(spec, inputs),
        };
        for (g, b) in spec.op.gradients().iter().zip(&grads) {
            std::fs::write(dir.join(verifier::sandbox::reference_file(g.name)), b).unwrap();
        }
        let (sms, threads_per_sm) = self.figures.borrow().unwrap_or((132, 2048));
        Ok(BackwardReferenceOutputs {
            grads,
            median_us: (reps > 0).then_some(1000.0),
            sms,
            threads_per_sm,
        })
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

fn executor(py: PathBuf) -> PythonExecutor<HostGradients> {
    executor_with(py, HostGradients::default())
}

fn executor_with(py: PathBuf, reference: HostGradients) -> PythonExecutor<HostGradients> {
    PythonExecutor::new(
        reference,
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
    let acc = oracle::backward_accuracy(spec, &run.inputs, &pairs, None);
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
        // run_case: the child's checks, and the verdict against the reference's gradients
        // (here the host's oracle, rounded): per gradient, combined, timed against the
        // reference's time.
        let c = ex.run_case(&b, &s, &LIMITS, 1e6).unwrap();
        assert_eq!(c.status, CaseStatus::Ran, "{c:?}");
        assert_eq!(c.deterministic, Some(true));
        assert!(
            c.integrity_failures.is_empty(),
            "{:?}",
            c.integrity_failures
        );
        assert_eq!(c.gradients.keys().collect::<Vec<_>>(), ["dw", "dx"]);
        let (dx, dw) = (&c.gradients["dx"], &c.gradients["dw"]);
        assert!(dx.accuracy.is_some() && dw.accuracy.is_some());
        let e = c.exactness.as_ref().unwrap();
        assert_eq!(e.elements, dx.exactness.elements + dw.exactness.elements);
        assert_eq!(
            e.mismatches,
            dx.exactness.mismatches + dw.exactness.mismatches
        );
        assert!(
            c.accuracy.is_none(),
            "a backward case's accuracy is per gradient"
        );
        let sp = c.speed.as_ref().expect("speed");
        assert_eq!(sp.reference_median_us, 1000.0);
    }
    assert_eq!(ex.children_started, 1);
}

/// A backward case reaches the verdict from the reference's bytes: the candidate's own
/// gradients as the reference give every gradient bit for bit; the reference's dw one ulp off
/// gives dw one mismatch and dx none; the reference is asked once per case, with the timed
/// calls' count, and its files are gone when the case ends.
#[test]
fn a_backward_case_gets_its_verdict_from_the_reference_bytes() {
    let Some(py) = python() else { return };
    let reference = HostGradients::default();
    let mut ex = executor_with(py, reference.clone());
    let b = rms_candidate("", "");
    for dt in [DType::Bf16, DType::F32] {
        let s = spec(Op::RmsNormBackward, dt, 16, 48);
        let run = ex.run_candidate(&b, &s, &LIMITS).unwrap();
        *reference.recorded.borrow_mut() = Some(run.outputs[0].clone());
        let c = ex.run_case(&b, &s, &LIMITS, 1e6).unwrap();
        assert_eq!(c.status, CaseStatus::Ran, "{c:?}");
        for (name, g) in &c.gradients {
            assert_eq!(g.exactness.mismatches, 0, "{dt} {name}: {g:?}");
            let a = g.accuracy.as_ref().unwrap();
            assert_eq!(a.candidate_max_abs, a.reference_max_abs, "{dt} {name}");
        }
        let e = c.exactness.as_ref().unwrap();
        assert_eq!((e.elements, e.mismatches), (16 * 48 + 48, 0), "{dt}");
        // dw's element 5 one ulp further from zero in the reference.
        let mut g = run.outputs[0].clone();
        let bits = verifier::numeric::bits_at(dt, &g[1], 5);
        set_bits(dt, &mut g[1], 5, bits + 1);
        *reference.recorded.borrow_mut() = Some(g);
        let c = ex.run_case(&b, &s, &LIMITS, 1e6).unwrap();
        assert_eq!(c.gradients["dx"].exactness.mismatches, 0, "{dt}");
        let dw = &c.gradients["dw"].exactness;
        assert_eq!((dw.mismatches, dw.max_ulp), (1, 1), "{dt}: {dw:?}");
        assert_eq!(c.exactness.as_ref().unwrap().mismatches, 1);
        // A reference of another size is the reference's fault, said as such.
        let mut g = run.outputs[0].clone();
        let half = g[1].len() / 2;
        g[1].truncate(half);
        *reference.recorded.borrow_mut() = Some(g);
        let e = ex.run_case(&b, &s, &LIMITS, 1e6).unwrap_err();
        assert!(e.to_string().contains("the reference's dw holds"), "{e}");
        *reference.recorded.borrow_mut() = None;
    }
    let asked = reference.asked.borrow();
    assert_eq!(asked.len(), 6, "{asked:?}");
    assert!(asked.iter().all(|(_, reps)| *reps == LIMITS.speed_reps));
    assert_eq!(ex.children_started, 1);
}

/// rms_norm_backward's verdict depends on the device's SMs and threads per SM: a reference that
/// ran on another device than the report names gives no verdict (the case is an error naming
/// both); silu_mul_backward's verdict does not depend on them.
#[test]
fn a_reference_from_another_device_gives_no_verdict_where_it_matters() {
    let Some(py) = python() else { return };
    let reference = HostGradients::default();
    let mut ex = executor_with(py, reference.clone());
    Executor::device_info(&mut ex).unwrap();
    *reference.figures.borrow_mut() = Some((114, 2048));
    let s = spec(Op::RmsNormBackward, DType::Bf16, 8, 32);
    let e = ex
        .run_case(&rms_candidate("", ""), &s, &LIMITS, 1e6)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "sandbox: rms_norm_backward: the reference ran on a device of 114 SMs of 2048 threads, the report's device (CPU (test)) has 132 SMs of 2048 threads"
    );
    let s = spec(Op::SiluMulBackward, DType::Bf16, 8, 32);
    let c = ex
        .run_case(&silu_mul_candidate(""), &s, &LIMITS, 1e6)
        .unwrap();
    assert_eq!(c.status, CaseStatus::Ran, "{c:?}");
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
/// negated incoming gradients included (eager's gradients are exactly odd in dy), and every
/// case gets a verdict per gradient (against the host's rounded oracle here).
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
        // The report names the device's SMs and threads per SM, as a CUDA kernel's does (the
        // hub keys rms_norm_backward's verdicts by them).
        assert_eq!(
            (r.device.sm_count, r.device.threads_per_sm),
            (132, Some(2048))
        );
        let measured: Vec<_> = r
            .cases
            .iter()
            .filter(|c| c.status != CaseStatus::NotApplicable)
            .collect();
        assert!(!measured.is_empty(), "{}", b.manifest.name);
        for c in measured {
            assert!(
                c.status == CaseStatus::Ran && c.exactness.is_some(),
                "{} {}: {c:?}",
                b.manifest.name,
                c.id
            );
            let names: Vec<&str> = b.manifest.op.gradients().iter().map(|g| g.name).collect();
            assert_eq!(
                c.gradients.len(),
                names.len(),
                "{} {}",
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

/// Run `rms_candidate("", after)` on `s` and require an integrity failure that `caught` names.
fn assert_caught(
    ex: &mut PythonExecutor<HostGradients>,
    s: &CaseSpec,
    after: &str,
    caught: impl Fn(&String) -> bool,
) {
    let run = ex
        .run_candidate(&rms_candidate("", after), s, &LIMITS)
        .unwrap();
    assert!(
        run.integrity_failures.iter().any(caught),
        "{after}: {:?}",
        run.integrity_failures
    );
}

#[test]
fn integrity_is_checked_per_gradient() {
    let Some(py) = python() else { return };
    let mut ex = executor(py);
    let s = spec(Op::RmsNormBackward, DType::Bf16, 8, 32);
    // dy overwritten in place (Liger's in_place backward does so).
    assert_caught(&mut ex, &s, "    dy.copy_(dx)", |f| {
        f.contains("input `dy`") && f.contains("changed by call 1")
    });
    // The same dw tensor handed back by every call.
    let after = "    dw = CACHE.setdefault('dw', dw)";
    assert_caught(&mut ex, &s, after, |f| {
        f.starts_with("dw: call 2 returned the memory of call 1's `dw`")
    });
    // dw's last element never written. On the CPU torch.empty is not the poisoned block handed
    // back (the GPU's caching allocator does that), so the candidate emulates what such an
    // element holds there: call 2's bits the exact complement of call 1's.
    let after = "    n = CACHE.setdefault('n', [0])\n    n[0] += 1\n    if n[0] == 1:\n        CACHE['last'] = dw[-1:].clone()\n    elif n[0] == 2:\n        dw = dw.clone()\n        dw[-1:] = CACHE['last'].view(torch.int16).bitwise_not().view(dw.dtype)";
    assert_caught(&mut ex, &s, after, |f| {
        f == "dw: output: 1 of 32 elements never written (first: row 0, col 31)"
    });
    // Every output at the address placements: a dw that depends on x's address.
    let after = "    if x.data_ptr() % 64 != 0:\n        dw = dw * 2";
    assert_caught(&mut ex, &s, after, |f| {
        f.contains("output depends on the buffer address") && f.contains("dw")
    });
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

/// A candidate with a setup function (`[setup]`, docs/spec.md section 2b): `forward(x, w, eps)`
/// builds the autograd graph of HF LlamaRMSNorm (what Liger's and compile's backward read from
/// their forward), the entry takes it as its last argument and runs only the backward, `body`
/// first in the setup. The setup runs before every call and outside the timed region.
fn setup_candidate(body: &str) -> KernelBundle {
    let toml = format!(
        "{}\n[setup]\nbf16 = \"forward\"\nf32 = \"forward\"\n",
        toml(Op::RmsNormBackward, "rms_norm_backward")
    );
    let src = format!(
        "import time\nimport torch\n\n\ndef forward(x, w, eps):\n{body}\n    with torch.enable_grad():\n        xx = x.detach().requires_grad_(True)\n        ww = w.detach().requires_grad_(True)\n        h = xx.float()\n        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)\n        return xx, ww, ww * h.to(xx.dtype)\n\n\ndef rms_norm_backward(dy, x, w, eps, state):\n    xx, ww, y = state\n    assert xx.shape == x.shape and torch.equal(xx, x), 'the state of another call'\n    return torch.autograd.grad(y, (xx, ww), dy)\n"
    );
    KernelBundle::from_parts(&toml, &src).unwrap()
}

#[test]
fn a_setup_function_runs_before_each_call_and_is_not_timed() {
    let Some(py) = python() else { return };
    let mut ex = executor(py);
    for (dt, rows) in [(DType::F32, 8), (DType::Bf16, 1)] {
        let mut s = spec(Op::RmsNormBackward, dt, rows, 32);
        s.measure_speed = true;
        // 50 ms of setup before each call: far above the backward's time on 8 x 32
        let run = ex
            .run_candidate(&setup_candidate("    time.sleep(0.05)"), &s, &LIMITS)
            .unwrap();
        check_gradients(&s, &run, 1.0 / 64.0);
        assert!(
            run.integrity_failures.is_empty() && run.deterministic,
            "{:?} {:?}",
            run.integrity_failures,
            run.notes
        );
        // the timed calls got their own state (rotated rows, or negated dy on one row) and
        // were right; the setup's sleep is not in their time
        let t = run.timed.as_ref().expect("timed calls");
        assert!(t.bad.is_empty(), "{t:?}");
        assert!(t.median_us < 25_000.0, "the setup was timed: {t:?}");
    }
    // the setup's exception is the candidate's, named
    let s = spec(Op::RmsNormBackward, DType::F32, 8, 32);
    let e = ex
        .run_candidate(
            &setup_candidate("    raise ValueError('no forward')"),
            &s,
            &LIMITS,
        )
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("the setup `forward` raised") && msg.contains("no forward"),
        "{msg}"
    );
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
        HostGradients::default(),
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

/// A Python candidate's backward case against the real reference layers (in this process,
/// `CudaExecutor` as `ReferenceLayers`: what the sandbox's `Request::ReferenceBackward` runs),
/// on the GPU torch uses: eager autograd of HF LlamaRMSNorm, which rms_norm_backward's
/// reference reproduces bit for bit on the same device (dw's column sums in eager's order for
/// its SMs and threads per SM), gets a bit-exact verdict in dx and dw; the other ops' eager
/// candidates get a verdict per gradient (printed). Skips loudly without a GPU.
#[test]
fn on_a_gpu_a_python_backward_case_is_judged_against_the_reference_layers() {
    let Some(py) = cuda_python() else { return };
    let mut ex = PythonExecutor::new(
        verifier::gpu::CudaExecutor::new(),
        PythonOptions {
            python: py,
            device: PyDevice::Cuda,
            case_limit: Duration::from_secs(300),
            ..Default::default()
        },
    )
    .unwrap();
    // The report's device (the reference layers') with its SMs and threads per SM.
    let dev = Executor::device_info(&mut ex).unwrap();
    assert!(
        dev.threads_per_sm.is_some(),
        "the report's device has no threads per SM: {dev:?}"
    );
    for (op, b) in [
        (Op::RmsNormBackward, rms_candidate("", "")),
        (Op::LayerNormBackward, layer_norm_candidate()),
        (Op::SiluMulBackward, silu_mul_candidate("")),
    ] {
        // 2048 rows: rms_norm_backward's dw takes several CTAs per column there.
        for (dt, rows, cols) in [(DType::Bf16, 2048, 512), (DType::F32, 64, 256)] {
            let s = spec(op, dt, rows, cols);
            let c = ex.run_case(&b, &s, &LIMITS, 1e6).unwrap();
            eprintln!(
                "GPU {op} {dt} {rows}x{cols}: {:?} {:?}",
                c.gradients
                    .iter()
                    .map(|(n, g)| (n, g.exactness.mismatches, g.exactness.max_ulp))
                    .collect::<Vec<_>>(),
                c.note
            );
            assert_eq!(c.status, CaseStatus::Ran, "{op} {dt}: {c:?}");
            assert!(c.integrity_failures.is_empty(), "{op} {dt}: {c:?}");
            // The child read its GPU's figures: the report's device's.
            let child = ex.child_device().expect("the child's GPU figures");
            assert_eq!(
                (child.sms, child.threads_per_sm),
                (dev.sm_count as u64, dev.threads_per_sm.map(u64::from)),
                "{child:?} {dev:?}"
            );
            assert_eq!(c.gradients.len(), op.gradients().len(), "{op}");
            assert!(c.speed.is_some(), "{op} {dt}: timed against the reference");
            if op == Op::RmsNormBackward {
                for (n, g) in &c.gradients {
                    assert_eq!(
                        g.exactness.mismatches, 0,
                        "{op} {dt} {n}: eager's gradients and the reference's differ: {g:?}"
                    );
                }
            }
        }
    }
}
