//! A backward case's verdict from host bytes (docs/backward.md, "What the verifier lacks",
//! item 6): each gradient's exactness against the reference's, its accuracy against the f64
//! oracle (`oracle::backward_accuracy`), and their combination, from the candidate's and the
//! reference's gradients as downloaded. `measure::backward` (a CUDA candidate) and
//! `PythonExecutor::run_case` (a Python candidate, its reference from
//! `ReferenceLayers::reference_backward`) both call [`verdict`], so `CaseReport::gradients` and
//! a backward case's `exactness` mean the same for both runtimes.

use crate::cases::{CaseInputs, CaseSpec};
use crate::numeric::{combine, compare, worst};
use crate::oracle;
use kernel_registry::report::{Exactness, GradientReport};
use std::collections::BTreeMap;

/// A backward case's gradients against the reference and the oracle.
#[derive(Debug, Clone, PartialEq)]
pub struct GradientVerdict {
    /// Every gradient's elements as one comparison (`numeric::combine`): the case's
    /// `exactness`.
    pub exactness: Exactness,
    /// Per gradient ([`kernel_registry::Op::gradients`]' names): its exactness and accuracy.
    pub gradients: BTreeMap<String, GradientReport>,
}

/// Whether `calls` (at least one) and `reference` each hold one gradient per
/// [`kernel_registry::Op::gradients`] of `spec`, of that gradient's size; else what does not.
pub fn check_sizes(
    spec: &CaseSpec,
    calls: &[Vec<&[u8]>],
    reference: &[&[u8]],
) -> Result<(), String> {
    let grads = spec.op.gradients();
    if calls.is_empty() {
        return Err(format!("{}: no call of the candidate", spec.id));
    }
    let sets = std::iter::once(("the reference".to_string(), reference)).chain(
        (1..)
            .zip(calls)
            .map(|(c, g)| (format!("call {c}"), g.as_slice())),
    );
    for (who, got) in sets {
        if got.len() != grads.len() {
            return Err(format!(
                "{}: {who} has {} gradients, not {}",
                spec.id,
                got.len(),
                grads.len()
            ));
        }
        for (g, b) in grads.iter().zip(got) {
            let n = spec.gradient_bytes(g);
            if b.len() != n {
                return Err(format!(
                    "{}: {who}'s {} holds {} bytes, not {n}",
                    spec.id,
                    g.name,
                    b.len()
                ));
            }
        }
    }
    Ok(())
}

/// The verdict of a backward case of `spec` (`inputs` = `cases::generate(spec)`) from host bytes:
/// `calls` are the candidate's calls (call 1 first), each its gradients in
/// [`kernel_registry::Op::gradients`] order, and `reference` the reference's gradients in that
/// order. Where the calls gave the same bits (`deterministic`) call 1 is compared; otherwise each
/// gradient's exactness is the worst over the calls. Accuracy is call 1's (beside the
/// reference's own, both against the oracle).
///
/// Panics when a call or the reference does not have one gradient per [`Op::gradients`] of the
/// size that gradient has ([`check_sizes`]: the callers read and check them).
///
/// [`Op::gradients`]: kernel_registry::Op::gradients
pub fn verdict(
    spec: &CaseSpec,
    inputs: &CaseInputs,
    calls: &[Vec<&[u8]>],
    reference: &[&[u8]],
    deterministic: bool,
    truths: Option<&[oracle::Truth]>,
) -> GradientVerdict {
    if let Err(e) = check_sizes(spec, calls, reference) {
        panic!("{e}");
    }
    let grads = spec.op.gradients();
    let n = if deterministic { 1 } else { calls.len() };
    let exact: Vec<Exactness> = (0..grads.len())
        .map(|k| {
            calls[..n]
                .iter()
                .map(|c| compare(spec.dtype, &[(c[k], reference[k])]))
                .reduce(worst)
                .expect("at least one call")
        })
        .collect();
    let exactness = combine(&exact.iter().collect::<Vec<_>>());
    let pairs: Vec<(&[u8], &[u8])> = calls[0]
        .iter()
        .zip(reference)
        .map(|(c, r)| (*c, *r))
        .collect();
    let accuracy = oracle::backward_accuracy(spec, inputs, &pairs, truths);
    let gradients = grads
        .iter()
        .zip(exact)
        .zip(accuracy)
        .map(|((g, exactness), accuracy)| {
            (
                g.name.to_string(),
                GradientReport {
                    exactness,
                    accuracy: Some(accuracy),
                },
            )
        })
        .collect();
    GradientVerdict {
        exactness,
        gradients,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::{bits_at, from_f32, set_bits};
    use kernel_registry::report::ULP_INFINITE;
    use kernel_registry::{DType, Op};

    /// A case of `op` in `dt`, `rows x cols`, normal inputs.
    fn case(op: Op, dt: DType, rows: u64, cols: u64) -> (CaseSpec, CaseInputs) {
        let s = crate::cases::suite(op, op.default_semantics(), &[dt], true, 5, &[])
            .into_iter()
            .find(|s| !s.large_index && s.dist == crate::cases::Dist::Normal)
            .unwrap();
        let s = CaseSpec { rows, cols, ..s };
        let inp = crate::cases::generate(&s);
        (s, inp)
    }

    /// The oracle's gradients rounded to the dtype (every element: a small case's sample is all
    /// of it, which this checks).
    fn rounded_truth(spec: &CaseSpec, inp: &CaseInputs) -> Vec<Vec<u8>> {
        for g in spec.op.gradients() {
            let n = g.elements(spec.rows, spec.cols) as usize;
            let (ranges, _) = oracle::backward_truth(spec, inp, g);
            assert_eq!(ranges.iter().map(|r| r.1).sum::<usize>(), n, "{}", g.name);
        }
        oracle::rounded_backward_truth(spec, inp)
    }

    fn as_call(g: &[Vec<u8>]) -> Vec<&[u8]> {
        g.iter().map(Vec::as_slice).collect()
    }

    /// `g` with element `i` of gradient `k` moved by `ulps` (its bits as an integer).
    fn off(g: &[Vec<u8>], dt: DType, k: usize, i: usize, ulps: u32) -> Vec<Vec<u8>> {
        let mut g = g.to_vec();
        let b = bits_at(dt, &g[k], i);
        set_bits(dt, &mut g[k], i, b + ulps);
        g
    }

    #[test]
    fn each_gradient_is_judged_on_its_own_and_combined() {
        for dt in [DType::Bf16, DType::F32] {
            let (s, inp) = case(Op::RmsNormBackward, dt, 6, 16);
            let refg = rounded_truth(&s, &inp);
            let refs = as_call(&refg);
            let (nx, nw) = (6 * 16, 16);
            // Exact: every gradient bit for bit, the combination over every element.
            let three = vec![refs.clone(); 3];
            let v = verdict(&s, &inp, &three, &refs, true, None);
            assert_eq!(v.exactness.elements, nx + nw, "{dt}");
            assert_eq!(v.exactness.mismatches, 0, "{dt}");
            assert_eq!(v.gradients.len(), 2);
            for (name, g) in &v.gradients {
                assert_eq!(g.exactness.mismatches, 0, "{dt} {name}");
                let a = g.accuracy.as_ref().expect("accuracy");
                assert_eq!(a.candidate_max_abs, a.reference_max_abs, "{dt} {name}");
            }
            assert_eq!(v.gradients["dx"].exactness.elements, nx);
            assert_eq!(v.gradients["dw"].exactness.elements, nw);
            // dx one ulp off in one element: dx has the mismatch, dw none, the case one.
            let g = off(&refg, dt, 0, 7, 1);
            let v = verdict(&s, &inp, &[as_call(&g)], &refs, true, None);
            let dx = &v.gradients["dx"].exactness;
            assert_eq!((dx.mismatches, dx.max_ulp), (1, 1), "{dt}");
            assert!(dx.within_tolerance && dx.nonfinite_parity);
            assert_eq!(v.gradients["dw"].exactness.mismatches, 0);
            assert_eq!((v.exactness.mismatches, v.exactness.max_ulp), (1, 1));
            // A NaN where the reference has a number: parity broken, infinitely far.
            let mut g = refg.clone();
            let nan = from_f32(dt, f32::NAN);
            set_bits(dt, &mut g[0], 3, nan);
            let v = verdict(&s, &inp, &[as_call(&g)], &refs, true, None);
            let dx = &v.gradients["dx"].exactness;
            assert!(!dx.nonfinite_parity && dx.max_ulp == ULP_INFINITE, "{dt}");
            assert!(!v.exactness.nonfinite_parity);
            assert!(
                v.gradients["dw"].exactness.nonfinite_parity,
                "dw is not the NaN's"
            );
            // dw off by 3 ulps in its last element: dw's alone.
            let g = off(&refg, dt, 1, 15, 3);
            let v = verdict(&s, &inp, &[as_call(&g)], &refs, true, None);
            assert_eq!(v.gradients["dx"].exactness.mismatches, 0, "{dt}");
            let dw = &v.gradients["dw"].exactness;
            assert_eq!((dw.mismatches, dw.max_ulp), (1, 3), "{dt}");
            assert_eq!(v.exactness.mismatches, 1);
            let a = v.gradients["dw"].accuracy.as_ref().unwrap();
            assert!(a.candidate_rms > a.reference_rms, "{dt}: {a:?}");
        }
    }

    #[test]
    fn calls_that_differ_are_judged_by_the_worst() {
        let (s, inp) = case(Op::LayerNormBackward, DType::Bf16, 5, 8);
        let refg = rounded_truth(&s, &inp);
        let refs = as_call(&refg);
        // call 2's db two ulps off: counted only when the calls are said to differ.
        let bad = off(&refg, DType::Bf16, 2, 0, 2);
        let calls = [refs.clone(), as_call(&bad), refs.clone()];
        let same = verdict(&s, &inp, &calls, &refs, true, None);
        assert_eq!(same.exactness.mismatches, 0);
        let differ = verdict(&s, &inp, &calls, &refs, false, None);
        assert_eq!(differ.gradients["db"].exactness.max_ulp, 2);
        assert_eq!(differ.gradients["dw"].exactness.mismatches, 0);
        assert_eq!(differ.gradients["dx"].exactness.mismatches, 0);
        // Accuracy is call 1's.
        assert_eq!(
            differ.gradients["db"].accuracy,
            same.gradients["db"].accuracy
        );
        assert_eq!(
            differ.gradients.keys().collect::<Vec<_>>(),
            ["db", "dw", "dx"]
        );
    }

    #[test]
    #[should_panic(expected = "the reference's dw holds 4 bytes, not 16")]
    fn a_reference_of_another_size_is_a_bug_of_the_caller() {
        let (s, inp) = case(Op::RmsNormBackward, DType::F32, 2, 4);
        let refg = rounded_truth(&s, &inp);
        let short = [refg[0].as_slice(), &refg[1][..4]];
        verdict(&s, &inp, &[as_call(&refg)], &short, true, None);
    }
}
