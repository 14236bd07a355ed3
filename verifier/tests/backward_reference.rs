//! A backward op's reference layers outside a CUDA candidate's process (docs/backward.md, "What
//! the verifier lacks", item 5): `CudaExecutor::reference_backward_case` (what the sandbox's
//! `Request::ReferenceBackward` runs) on a case's own inputs gives every gradient, the same bits
//! each time, within the f64 oracle's reach, its median time and the device's figures. Needs a
//! GPU: without one every test says so loudly and checks nothing, or fails when
//! `KERNELIZE_REQUIRE_GPU=1`.

use kernel_registry::{DType, Op};
use verifier::cases::{self, CaseSpec};
use verifier::gpu::CudaExecutor;
use verifier::{oracle, Executor};

fn gpu() -> bool {
    let ok = verifier::cuda::gpu_available();
    if !ok {
        let require = std::env::var("KERNELIZE_REQUIRE_GPU").as_deref() == Ok("1");
        eprintln!("\n{}", "#".repeat(78));
        eprintln!("#  BACKWARD REFERENCE GPU TEST SKIPPED: no CUDA GPU (libcuda did not load).");
        eprintln!("#  It ran NOTHING. KERNELIZE_REQUIRE_GPU=1 turns this into a failure.");
        eprintln!("{}\n", "#".repeat(78));
        assert!(!require, "KERNELIZE_REQUIRE_GPU=1 and no CUDA GPU");
    }
    ok
}

fn spec(op: Op, dt: DType, rows: u64, cols: u64) -> CaseSpec {
    let mut s = cases::suite(op, op.default_semantics(), &[dt], true, 11, &[])
        .into_iter()
        .find(|s| !s.large_index && s.dist == cases::Dist::Normal)
        .unwrap();
    (s.rows, s.cols) = (rows, cols);
    s
}

#[test]
fn the_backward_reference_runs_on_a_cases_inputs_outside_a_candidate() {
    if !gpu() {
        return;
    }
    let mut ex = CudaExecutor::new();
    let dev = Executor::device_info(&mut ex).unwrap();
    for &op in Op::ALL.iter().filter(|o| o.is_backward()) {
        // 2048 rows: rms_norm_backward's dw takes several CTAs per column (from 1021 rows).
        for (dt, rows, cols) in [(DType::Bf16, 2048, 256), (DType::F32, 7, 33)] {
            let s = spec(op, dt, rows, cols);
            let what = format!("{op} {dt} {rows}x{cols}");
            let a = ex.reference_backward_case(&s, 5).unwrap();
            let b = ex.reference_backward_case(&s, 0).unwrap();
            assert_eq!(a.grads, b.grads, "{what}: the same bits every run");
            assert!(a.median_us.is_some_and(|t| t > 0.0), "{what}: {a:?}");
            assert_eq!(b.median_us, None, "{what}");
            assert_eq!(
                (a.sms, Some(a.threads_per_sm as u32)),
                (dev.sm_count as u64, dev.threads_per_sm),
                "{what}: the device's figures"
            );
            let sizes: Vec<usize> = a.grads.iter().map(Vec::len).collect();
            let want: Vec<usize> = op
                .gradients()
                .iter()
                .map(|g| g.elements(rows, cols) as usize * dt.size_bytes())
                .collect();
            assert_eq!(sizes, want, "{what}");
            // Within the oracle's reach: the reference's own error, on finite normal inputs.
            let inp = cases::generate(&s);
            let pairs: Vec<(&[u8], &[u8])> = a
                .grads
                .iter()
                .map(|g| (g.as_slice(), g.as_slice()))
                .collect();
            let acc = oracle::backward_accuracy(&s, &inp, &pairs, None);
            for (g, acc) in op.gradients().iter().zip(&acc) {
                let (_, truth) = oracle::backward_truth(&s, &inp, g);
                let scale = truth.iter().fold(0f64, |m, v| m.max(v.abs()));
                let tol = if dt == DType::F32 { 1e-4 } else { 1.0 / 32.0 };
                assert!(
                    acc.candidate_max_abs <= tol * scale.max(1e-30),
                    "{what} {}: max abs error {} against a largest truth of {scale}",
                    g.name,
                    acc.candidate_max_abs
                );
            }
        }
    }
}
