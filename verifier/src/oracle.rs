//! The f64 oracle: every op of docs/spec.md section 2 computed in f64 with no intermediate rounding
//! (the "truth" both the candidate and the reference are measured against), on a sample of
//! output elements, and the accuracy metrics against it.

use crate::cases::{CaseInputs, CaseSpec};
use crate::numeric::{bits_at, to_f32};
use kernel_registry::report::Accuracy;
use kernel_registry::{DType, Gradient, Op, Semantics};
use rayon::prelude::*;

/// At most this many output elements are checked against the oracle per case (2^20 cost
/// 15-20 ms of host time per wide case on the H200 machine, for a sampled metric).
pub const MAX_ORACLE_ELEMENTS: u64 = 1 << 18;

/// Output element ranges `(start, len)` the oracle is computed on: whole rows for row-wise
/// ops (evenly spaced, always the first and last), evenly spaced runs for elementwise ops.
pub fn sample(spec: &CaseSpec) -> Vec<(usize, usize)> {
    let (rows, cols) = (spec.rows, spec.cols);
    if spec.op.is_rowwise() {
        let max_rows = (MAX_ORACLE_ELEMENTS / cols).clamp(1, 256);
        let picks: Vec<u64> = if rows <= max_rows {
            (0..rows).collect()
        } else {
            let mut v: Vec<u64> = (0..max_rows - 1)
                .map(|k| k * (rows - 1) / (max_rows - 1))
                .collect();
            v.push(rows - 1);
            v.dedup();
            v
        };
        picks
            .into_iter()
            .map(|r| ((r * cols) as usize, cols as usize))
            .collect()
    } else {
        let n = rows * cols;
        if n <= MAX_ORACLE_ELEMENTS {
            return vec![(0, n as usize)];
        }
        let run = 4096u64;
        let runs = MAX_ORACLE_ELEMENTS / run;
        let mut v: Vec<(usize, usize)> = (0..runs)
            .map(|k| ((k * ((n - run) / (runs - 1))) as usize, run as usize))
            .collect();
        v.dedup();
        v
    }
}

fn f(t: &crate::cases::HostTensor, i: usize) -> f64 {
    to_f32(t.dtype, bits_at(t.dtype, &t.bytes, i)) as f64
}

fn erf(x: f64) -> f64 {
    libm::erf(x)
}

/// Oracle values of one op for a single element value (elementwise ops).
pub fn elementwise(op: Op, h: f64) -> f64 {
    match op {
        Op::Silu => silu(h),
        Op::Gelu => 0.5 * h * (1.0 + erf(h / std::f64::consts::SQRT_2)),
        Op::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * h * (1.0 + (k * (h + 0.044715 * h * h * h)).tanh())
        }
        _ => unreachable!("{op} is not elementwise"),
    }
}

/// The activation a gated op applies to its gate.
pub fn gate_activation(op: Op) -> Op {
    match op {
        Op::SiluMul | Op::SiluAndMul => Op::Silu,
        Op::GeluTanhMul => Op::GeluTanh,
        _ => unreachable!("{op} is not gated"),
    }
}

fn silu(h: f64) -> f64 {
    if h == f64::NEG_INFINITY {
        return -0.0;
    }
    h / (1.0 + (-h).exp())
}

/// silu's derivative, `sig * (1 + h * (1 - sig))` with `sig = 1 / (1 + exp(-h))`, and its
/// limits at -inf and +inf (0 and 1; the formula gives NaN there, as silu's does at -inf).
fn silu_grad(h: f64) -> f64 {
    if h == f64::NEG_INFINITY {
        return 0.0;
    }
    if h == f64::INFINITY {
        return 1.0;
    }
    let sig = 1.0 / (1.0 + (-h).exp());
    sig * (1.0 + h * (1.0 - sig))
}

/// gelu_tanh's derivative, `0.5 (1 + t) + 0.5 h (1 - t^2) k (1 + 3 c h^2)` with
/// `t = tanh(k (h + c h^3))`, `k = sqrt(2 / pi)`, `c = 0.044715`, and its limits at -inf and
/// +inf (0 and 1). Where tanh is saturated (`1 - t^2` is 0 in f64) the second term is 0, not
/// the NaN of `0 * inf` at huge `h`.
fn gelu_tanh_grad(h: f64) -> f64 {
    if h == f64::NEG_INFINITY {
        return 0.0;
    }
    if h == f64::INFINITY {
        return 1.0;
    }
    let (k, c) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
    let t = (k * (h + c * h * h * h)).tanh();
    let sech2 = 1.0 - t * t;
    let right = if sech2 == 0.0 {
        0.0
    } else {
        0.5 * h * sech2 * k * (1.0 + 3.0 * c * h * h)
    };
    0.5 * (1.0 + t) + right
}

/// gelu's (erf form) derivative, `Phi(h) + h phi(h)` (`Phi(h) = 0.5 (1 + erf(h / sqrt(2)))`,
/// `phi(h) = exp(-h^2 / 2) / sqrt(2 pi)`), and its limits at -inf and +inf (0 and 1; where
/// `exp` underflows the second term is 0, not the NaN of `inf * 0`).
fn gelu_grad(h: f64) -> f64 {
    if h == f64::NEG_INFINITY {
        return 0.0;
    }
    if h == f64::INFINITY {
        return 1.0;
    }
    let pdf = (-0.5 * h * h).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let right = if pdf == 0.0 { 0.0 } else { h * pdf };
    0.5 * (1.0 + erf(h / std::f64::consts::SQRT_2)) + right
}

/// The derivative of elementwise activation `act` (silu, gelu, gelu_tanh) at `h`, in f64.
pub fn activation_grad(act: Op, h: f64) -> f64 {
    match act {
        Op::Silu => silu_grad(h),
        Op::Gelu => gelu_grad(h),
        Op::GeluTanh => gelu_tanh_grad(h),
        _ => unreachable!("{act} is not an elementwise activation"),
    }
}

/// A gated backward op's gradients of element `i` in f64, no rounding anywhere (not of the
/// forward's `act(gate)` either: the truth): `d_gate = dy * up * act'(gate)`,
/// `d_up = dy * act(gate)`, act the forward's activation (silu, gelu_tanh).
fn gated_backward_at(op: Op, inp: &CaseInputs, i: usize) -> (f64, f64) {
    let dy = f(inp.dy.as_ref().expect("a backward case has dy"), i);
    let g = f(&inp.x, i);
    let u = f(inp.up.as_ref().expect("a gated backward case has up"), i);
    let act = gate_activation(op.forward().expect("a backward op"));
    (dy * u * activation_grad(act, g), dy * elementwise(act, g))
}

/// An activation's backward op's `dx` at element `i` in f64 (silu_backward, gelu_backward,
/// gelu_tanh_backward): `dy * act'(x)`, no rounding anywhere.
fn activation_backward_at(op: Op, inp: &CaseInputs, i: usize) -> f64 {
    let dy = f(inp.dy.as_ref().expect("a backward case has dy"), i);
    let act = op.forward().expect("a backward op");
    dy * activation_grad(act, f(&inp.x, i))
}

/// Round an f64 sum `a + b` as T would store it (fused_add's stored residual).
fn stored(dt: DType, v: f64) -> f64 {
    crate::numeric::round_f64(dt, v) as f64
}

/// Oracle outputs for the elements of `ranges` (concatenated, in order).
pub fn oracle(spec: &CaseSpec, inp: &CaseInputs, ranges: &[(usize, usize)]) -> Vec<f64> {
    let cols = spec.cols as usize;
    let dt = spec.dtype;
    // A norm's input row: x, or for the fused adds the residual as stored in T.
    let normalised = |start: usize, len: usize| -> Vec<f64> {
        (start..start + len)
            .map(|i| match &inp.residual {
                Some(r) => stored(dt, f(&inp.x, i) + f(r, i)),
                None => f(&inp.x, i),
            })
            .collect()
    };
    let per_range = |&(start, len): &(usize, usize)| -> Vec<f64> {
        match spec.op {
            Op::RmsNorm | Op::FusedAddRmsNorm => {
                let xs = normalised(start, len);
                let w = inp.weight.as_ref().expect("norm has weight");
                let var = xs.iter().map(|v| v * v).sum::<f64>() / cols as f64;
                let r = 1.0 / (var + spec.eps as f64).sqrt();
                xs.iter()
                    .enumerate()
                    .map(|(j, &h)| {
                        let wv = f(w, j);
                        match (spec.op, spec.semantics) {
                            (Op::RmsNorm, Semantics::Gemma) => h * r * (1.0 + wv),
                            _ => h * r * wv,
                        }
                    })
                    .collect()
            }
            Op::LayerNorm | Op::FusedAddLayerNorm => {
                let xs = normalised(start, len);
                let (w, b) = (inp.weight.as_ref().unwrap(), inp.bias.as_ref().unwrap());
                let mean = xs.iter().sum::<f64>() / cols as f64;
                let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
                let rstd = 1.0 / (var + spec.eps as f64).sqrt();
                xs.iter()
                    .enumerate()
                    .map(|(j, &h)| (h - mean) * rstd * f(w, j) + f(b, j))
                    .collect()
            }
            Op::SiluAndMul => {
                let row = start / cols;
                (0..len)
                    .map(|c| {
                        let g = f(&inp.x, row * 2 * cols + c);
                        let u = f(&inp.x, row * 2 * cols + cols + c);
                        silu(g) * u
                    })
                    .collect()
            }
            // act(g) * u with no rounding of act(g) (the rounding to T is eager's, not the
            // truth's)
            Op::SiluMul | Op::GeluTanhMul => {
                let up = inp.up.as_ref().expect("a gated op has up");
                let act = gate_activation(spec.op);
                (start..start + len)
                    .map(|i| elementwise(act, f(&inp.x, i)) * f(up, i))
                    .collect()
            }
            Op::Silu | Op::Gelu | Op::GeluTanh => (start..start + len)
                .map(|i| elementwise(spec.op, f(&inp.x, i)))
                .collect(),
            // Its dx; its dw (a sum over every row) is `backward_dw`. fused_add_rms_norm's: the
            // norm's dx plus the residual output's gradient (x is the residual output h).
            Op::RmsNormBackward | Op::FusedAddRmsNormBackward => {
                let dy = inp.dy.as_ref().expect("a backward case has dy");
                let w = inp.weight.as_ref().expect("norm has weight");
                let dres = (spec.op == Op::FusedAddRmsNormBackward).then(|| {
                    inp.residual
                        .as_ref()
                        .expect("a fused add's backward has dres")
                });
                let row = start / cols;
                let (r, sum_gh) = rms_backward_row(spec, inp, row, cols);
                let n = cols as f64;
                (start..start + len)
                    .map(|i| {
                        let g = f(dy, i) * rms_weight(spec.semantics, f(w, i - row * cols));
                        r * g - r * r * r / n * f(&inp.x, i) * sum_gh
                            + dres.map_or(0.0, |d| f(d, i))
                    })
                    .collect()
            }
            // Its first gradient, d_gate; each gradient's: `backward_truth`.
            Op::SiluMulBackward | Op::GeluTanhMulBackward => (start..start + len)
                .map(|i| gated_backward_at(spec.op, inp, i).0)
                .collect(),
            // dy * act'(x), its one gradient
            Op::SiluBackward | Op::GeluBackward | Op::GeluTanhBackward => (start..start + len)
                .map(|i| activation_backward_at(spec.op, inp, i))
                .collect(),
            // Its dx; dw and db (sums over every row) are `ln_backward_dwdb`.
            Op::LayerNormBackward => {
                let dy = inp.dy.as_ref().expect("a backward case has dy");
                let w = inp.weight.as_ref().expect("norm has weight");
                let row = start / cols;
                let (m, r, sum_g, sum_gh) = ln_backward_row(inp, row, cols);
                let n = cols as f64;
                (start..start + len)
                    .map(|i| {
                        let g = f(dy, i) * f(w, i - row * cols);
                        let h = (f(&inp.x, i) - m) * r;
                        r / n * (n * g - sum_g - h * sum_gh)
                    })
                    .collect()
            }
        }
    };
    ranges.par_iter().flat_map_iter(per_range).collect()
}

/// The factor an RMSNorm's normalised row is multiplied by: `w` (llama, torch), `1 + w` (gemma).
fn rms_weight(sem: Semantics, w: f64) -> f64 {
    match sem {
        Semantics::Gemma => 1.0 + w,
        _ => w,
    }
}

/// HF LlamaRMSNorm's (GemmaRMSNorm's) backward in f64 for row `row`: `r = 1 / sqrt(mean(h^2) +
/// eps)` and `sum_k g_k h_k` with `g = dy * w` (gemma: `dy * (1 + w)`; no rounding anywhere: the
/// truth). Then `dx_j = r g_j - (r^3 / N) h_j sum_k g_k h_k` and `dw_j = sum_i dy_ij h_ij r_i`
/// (the same for both: the derivative of `w` and of `1 + w` by `w` is 1).
fn rms_backward_row(spec: &CaseSpec, inp: &CaseInputs, row: usize, cols: usize) -> (f64, f64) {
    let dy = inp.dy.as_ref().expect("a backward case has dy");
    let w = inp.weight.as_ref().expect("norm has weight");
    let (mut sq, mut gh) = (0.0f64, 0.0f64);
    for j in 0..cols {
        let h = f(&inp.x, row * cols + j);
        sq += h * h;
        gh += f(dy, row * cols + j) * rms_weight(spec.semantics, f(w, j)) * h;
    }
    (1.0 / (sq / cols as f64 + spec.eps as f64).sqrt(), gh)
}

/// nn.LayerNorm's backward in f64 for row `row`, from the saved statistics the case gives
/// (`m`, `r`: the f32 mean and rstd, taken as exact): `(m, r, sum_k g_k, sum_k g_k h_k)` with
/// `g = dy * w`, `h = (x - m) r` (no rounding anywhere). Then
/// `dx_j = (r / N) (N g_j - sum_k g_k - h_j sum_k g_k h_k)`.
fn ln_backward_row(inp: &CaseInputs, row: usize, cols: usize) -> (f64, f64, f64, f64) {
    let dy = inp.dy.as_ref().expect("a backward case has dy");
    let w = inp.weight.as_ref().expect("norm has weight");
    let m = f(
        inp.mean.as_ref().expect("layer_norm_backward has mean"),
        row,
    );
    let r = f(
        inp.rstd.as_ref().expect("layer_norm_backward has rstd"),
        row,
    );
    let (mut sg, mut sgh) = (0.0f64, 0.0f64);
    for j in 0..cols {
        let g = f(dy, row * cols + j) * f(w, j);
        sg += g;
        sgh += g * (f(&inp.x, row * cols + j) - m) * r;
    }
    (m, r, sg, sgh)
}

/// The f64 truth of layer_norm_backward's `dw` and `db` (`[cols]` each): `dw_j = sum_i dy_ij
/// (x_ij - m_i) r_i`, `db_j = sum_i dy_ij`.
fn ln_backward_dwdb(spec: &CaseSpec, inp: &CaseInputs, want_db: bool) -> Vec<f64> {
    let dy = inp.dy.as_ref().expect("a backward case has dy");
    let mean = inp.mean.as_ref().expect("layer_norm_backward has mean");
    let rstd = inp.rstd.as_ref().expect("layer_norm_backward has rstd");
    column_sums(spec, |i, at| {
        let g = f(dy, at);
        if want_db {
            g
        } else {
            g * (f(&inp.x, at) - f(mean, i)) * f(rstd, i)
        }
    })
}

/// The f64 truth of a backward case's `dw` (`[cols]`): a sum over every row.
pub fn backward_dw(spec: &CaseSpec, inp: &CaseInputs) -> Vec<f64> {
    let (rows, cols) = (spec.rows as usize, spec.cols as usize);
    let dy = inp.dy.as_ref().expect("a backward case has dy");
    // r of every row, as rms_backward_row's (its sum of squares alone)
    let r: Vec<f64> = (0..rows)
        .into_par_iter()
        .map(|i| {
            let sq: f64 = (0..cols)
                .map(|j| f(&inp.x, i * cols + j))
                .fold(0.0, |sq, h| sq + h * h);
            1.0 / (sq / cols as f64 + spec.eps as f64).sqrt()
        })
        .collect();
    column_sums(spec, |i, at| f(dy, at) * f(&inp.x, at) * r[i])
}

/// Per column j of a `rows x cols` case, the sum over the rows i in order of `term(i, i * cols +
/// j)` (f64, from `Sum`'s start: every column's the same value as `(0..rows).map(..).sum()`).
/// Blocks of columns in parallel, each walking the rows in order over its columns, so that
/// memory is read along the rows rather than one column at a time down a large tensor.
fn column_sums(spec: &CaseSpec, term: impl Fn(usize, usize) -> f64 + Sync) -> Vec<f64> {
    const BLOCK: usize = 64;
    let (rows, cols) = (spec.rows as usize, spec.cols as usize);
    let start: f64 = std::iter::empty::<f64>().sum();
    (0..cols.div_ceil(BLOCK))
        .into_par_iter()
        .flat_map_iter(|b| {
            let (j0, j1) = (b * BLOCK, ((b + 1) * BLOCK).min(cols));
            let mut acc = vec![start; j1 - j0];
            for i in 0..rows {
                for (k, a) in acc.iter_mut().enumerate() {
                    *a += term(i, i * cols + j0 + k);
                }
            }
            acc
        })
        .collect()
}

/// Every gradient of a backward case as the f64 oracle gives it, rounded to the case's dtype,
/// in [`Op::gradients`] order: the sampled elements ([`backward_truth`]), zeros elsewhere (all
/// of a small case's). The stand-in for the reference layers' gradients in the tests that run
/// without a GPU.
pub fn rounded_backward_truth(spec: &CaseSpec, inp: &CaseInputs) -> Vec<Vec<u8>> {
    use crate::numeric::{from_f32, round_f64, set_bits};
    spec.op
        .gradients()
        .iter()
        .map(|g| {
            let (ranges, truth) = backward_truth(spec, inp, g);
            let mut b = vec![0u8; spec.gradient_bytes(g)];
            let mut t = truth.iter();
            for (start, len) in ranges {
                for i in start..start + len {
                    let v = round_f64(spec.dtype, *t.next().unwrap());
                    set_bits(spec.dtype, &mut b, i, from_f32(spec.dtype, v));
                }
            }
            b
        })
        .collect()
}

/// A gradient's oracle: the element ranges it is compared at and the f64 truth there.
pub type Truth = (Vec<(usize, usize)>, Vec<f64>);

/// The f64 truth of a forward case's output on the elements it is compared at ([`sample`]):
/// those element ranges and the truth there.
pub fn forward_truth(spec: &CaseSpec, inp: &CaseInputs) -> Truth {
    let ranges = sample(spec);
    let truth = oracle(spec, inp, &ranges);
    (ranges, truth)
}

/// What a case's verdict compares with the f64 oracle, from its inputs alone: a forward op's
/// output ([`forward_truth`]), a backward op's gradients ([`backward_truths`]).
pub fn truths(spec: &CaseSpec, inp: &CaseInputs) -> Vec<Truth> {
    if spec.op.is_backward() {
        backward_truths(spec, inp)
    } else {
        vec![forward_truth(spec, inp)]
    }
}

/// Every gradient's [`backward_truth`], in [`Op::gradients`] order.
pub fn backward_truths(spec: &CaseSpec, inp: &CaseInputs) -> Vec<Truth> {
    spec.op
        .gradients()
        .iter()
        .map(|g| backward_truth(spec, inp, g))
        .collect()
}

/// The f64 truth of gradient `g` of a backward case, on the elements it is compared at: a
/// gradient of rows x cols on the sampled rows ([`sample`]), one of one row whole. Returns those
/// element ranges and the truth there.
pub fn backward_truth(
    spec: &CaseSpec,
    inp: &CaseInputs,
    g: &Gradient,
) -> (Vec<(usize, usize)>, Vec<f64>) {
    match (spec.op, g.name) {
        (Op::RmsNormBackward | Op::FusedAddRmsNormBackward, "dx") => {
            let ranges = sample(spec);
            let truth = oracle(spec, inp, &ranges);
            (ranges, truth)
        }
        (Op::RmsNormBackward | Op::FusedAddRmsNormBackward, "dw") => {
            (vec![(0, spec.cols as usize)], backward_dw(spec, inp))
        }
        (Op::LayerNormBackward, "dx") => {
            let ranges = sample(spec);
            let truth = oracle(spec, inp, &ranges);
            (ranges, truth)
        }
        // elementwise: evenly spaced runs ([`sample`] of an elementwise op)
        (op, "dx") if op.is_activation_backward() => {
            let ranges = sample(spec);
            let truth = oracle(spec, inp, &ranges);
            (ranges, truth)
        }
        (Op::LayerNormBackward, "dw" | "db") => (
            vec![(0, spec.cols as usize)],
            ln_backward_dwdb(spec, inp, g.name == "db"),
        ),
        (op, "d_gate" | "d_up") if op.is_gated_backward() => {
            let ranges = sample(spec);
            let up = g.name == "d_up";
            let truth = ranges
                .par_iter()
                .flat_map_iter(|&(start, len)| {
                    (start..start + len).map(move |i| {
                        let (d_gate, d_up) = gated_backward_at(op, inp, i);
                        if up {
                            d_up
                        } else {
                            d_gate
                        }
                    })
                })
                .collect();
            (ranges, truth)
        }
        (op, other) => unreachable!("{op} has no gradient `{other}` with an oracle"),
    }
}

/// A backward case's accuracy per gradient, in [`Op::gradients`] order (rms_norm_backward: `dx`
/// on the sampled rows, `dw` whole; silu_mul_backward: `d_gate` and `d_up` on the sampled
/// rows). Each pair is (candidate, reference) bytes of that gradient.
pub fn backward_accuracy(
    spec: &CaseSpec,
    inp: &CaseInputs,
    grads: &[(&[u8], &[u8])],
    truths: Option<&[Truth]>,
) -> Vec<Accuracy> {
    let gs = spec.op.gradients();
    assert_eq!(gs.len(), grads.len(), "{}: one pair per gradient", spec.op);
    let owned;
    let truths = match truths {
        Some(t) => t,
        None => {
            owned = backward_truths(spec, inp);
            &owned
        }
    };
    assert_eq!(
        truths.len(),
        gs.len(),
        "{}: one truth per gradient",
        spec.op
    );
    grads
        .par_iter()
        .zip(truths)
        .map(|(&(c, r), t)| accuracy_against(spec.dtype, c, r, t))
        .collect()
}

/// The candidate's and the reference's [`errors`] against `truth`, the two at once (each the
/// same serial sum as alone).
fn accuracy_against(dt: DType, candidate: &[u8], reference: &[u8], truth: &Truth) -> Accuracy {
    let (ranges, truth) = truth;
    let ((cm, cr), (rm, rr)) = rayon::join(
        || errors(dt, candidate, ranges, truth),
        || errors(dt, reference, ranges, truth),
    );
    Accuracy {
        candidate_max_abs: cm,
        candidate_rms: cr,
        reference_max_abs: rm,
        reference_rms: rr,
    }
}

/// Max abs and RMS error of `out` (dtype values) against the oracle, over the sampled
/// elements where the oracle is finite. A non-finite output where the oracle is finite counts
/// as an error of `f64::MAX` (kept finite so reports stay valid JSON).
pub fn errors(dt: DType, out: &[u8], ranges: &[(usize, usize)], truth: &[f64]) -> (f64, f64) {
    let mut k = 0;
    let (mut max, mut sq, mut n) = (0.0f64, 0.0f64, 0u64);
    for &(start, len) in ranges {
        for i in start..start + len {
            let t = truth[k];
            k += 1;
            if !t.is_finite() {
                continue;
            }
            let v = to_f32(dt, bits_at(dt, out, i)) as f64;
            let e = if v.is_finite() {
                (v - t).abs()
            } else {
                f64::MAX
            };
            max = max.max(e);
            sq += if e == f64::MAX { 0.0 } else { e * e };
            n += 1;
        }
    }
    let rms = if n == 0 { 0.0 } else { (sq / n as f64).sqrt() };
    (max, rms)
}

/// Candidate and reference accuracy against the oracle.
///
/// `truth`: the output's [`forward_truth`] where it was computed already (`crate::ahead`), else
/// it is computed here.
pub fn accuracy(
    spec: &CaseSpec,
    inp: &CaseInputs,
    candidate: &[u8],
    reference: &[u8],
    truth: Option<&Truth>,
) -> Accuracy {
    match truth {
        Some(t) => accuracy_against(spec.dtype, candidate, reference, t),
        None => accuracy_against(spec.dtype, candidate, reference, &forward_truth(spec, inp)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// d loss / d v[i] by central differences, `f` the loss as a function of v alone.
    fn slope(f: &dyn Fn(&[f64]) -> f64, v: &[f64], i: usize) -> f64 {
        let step = 1e-6;
        let (mut a, mut b) = (v.to_vec(), v.to_vec());
        a[i] += step;
        b[i] -= step;
        (f(&a) - f(&b)) / (2.0 * step)
    }
    use crate::cases::{suite, HostTensor};
    use crate::numeric::{from_f32, set_bits};

    fn tensor(dt: DType, vals: &[f32]) -> HostTensor {
        let mut b = vec![0u8; vals.len() * dt.size_bytes()];
        for (i, &v) in vals.iter().enumerate() {
            set_bits(dt, &mut b, i, from_f32(dt, v));
        }
        HostTensor {
            name: "t",
            dtype: dt,
            bytes: b,
        }
    }

    /// The column sums of the backward oracles (rms_norm_backward's dw, layer_norm_backward's dw
    /// and db) walk blocks of columns along the rows; each column's value is, bit for bit, its
    /// terms summed down the column in row order (`(0..rows).map(..).sum()`).
    #[test]
    fn the_column_sums_are_each_columns_sum_in_row_order() {
        for (op, rows, cols) in [
            (Op::RmsNormBackward, 37, 150),
            (Op::RmsNormBackward, 5, 64),
            (Op::LayerNormBackward, 29, 131),
        ] {
            for dt in [DType::Bf16, DType::F32] {
                let s = CaseSpec {
                    dtype: dt,
                    ..spec(op, op.default_semantics(), rows, cols)
                };
                let inp = crate::cases::generate(&s);
                let (rows, cols) = (rows as usize, cols as usize);
                let dy = inp.dy.as_ref().unwrap();
                let naive = |term: &dyn Fn(usize, usize) -> f64| -> Vec<f64> {
                    (0..cols)
                        .map(|j| (0..rows).map(|i| term(i, i * cols + j)).sum())
                        .collect()
                };
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                if op == Op::RmsNormBackward {
                    let r: Vec<f64> = (0..rows)
                        .map(|i| rms_backward_row(&s, &inp, i, cols).0)
                        .collect();
                    let want = naive(&|i, at| f(dy, at) * f(&inp.x, at) * r[i]);
                    assert_eq!(bits(&backward_dw(&s, &inp)), bits(&want), "{op} {dt}");
                } else {
                    let (m, r) = (inp.mean.as_ref().unwrap(), inp.rstd.as_ref().unwrap());
                    let dw = naive(&|i, at| f(dy, at) * (f(&inp.x, at) - f(m, i)) * f(r, i));
                    let db = naive(&|_, at| f(dy, at));
                    assert_eq!(bits(&ln_backward_dwdb(&s, &inp, false)), bits(&dw), "{dt}");
                    assert_eq!(bits(&ln_backward_dwdb(&s, &inp, true)), bits(&db), "{dt}");
                }
            }
        }
    }

    fn spec(op: Op, sem: Semantics, rows: u64, cols: u64) -> CaseSpec {
        let mut s = suite(op, sem, &[DType::F32], true, 0, &[])[0].clone();
        s.rows = rows;
        s.cols = cols;
        s.eps = crate::cases::default_eps(op);
        s
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} vs {b}");
    }

    /// The backward oracle is the derivative of the forward's truth: against central finite
    /// differences of `L = sum dy * y(x, w)` in f64 (llama: y = w * h * r; gemma: y = (1 + w) * h
    /// * r), for dx and dw.
    fn rms_norm_backward_is_the_forward_truths_derivative(sem: Semantics) {
        let (rows, cols) = (3usize, 5usize);
        let xs: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0)
            .collect();
        let ws: Vec<f32> = (0..cols).map(|j| 0.75 + j as f32 / 8.0).collect();
        let dys: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 5 % 7) as f32 - 3.0) / 2.0)
            .collect();
        let mut sp = spec(Op::RmsNormBackward, sem, rows as u64, cols as u64);
        sp.eps = 0.0625;
        let inp = CaseInputs {
            mean: None,
            rstd: None,
            x: tensor(DType::F32, &xs),
            up: None,
            residual: None,
            weight: Some(tensor(DType::F32, &ws)),
            bias: None,
            dy: Some(tensor(DType::F32, &dys)),
        };
        let loss = |x: &[f64], w: &[f64]| -> f64 {
            let mut l = 0.0;
            for i in 0..rows {
                let h = &x[i * cols..(i + 1) * cols];
                let var = h.iter().map(|v| v * v).sum::<f64>() / cols as f64;
                let r = 1.0 / (var + sp.eps as f64).sqrt();
                for j in 0..cols {
                    l += dys[i * cols + j] as f64 * rms_weight(sem, w[j]) * h[j] * r;
                }
            }
            l
        };
        let x0: Vec<f64> = xs.iter().map(|&v| v as f64).collect();
        let w0: Vec<f64> = ws.iter().map(|&v| v as f64).collect();
        let ranges = sample(&sp);
        assert_eq!(ranges.len(), rows, "every row of a small case");
        let dx = oracle(&sp, &inp, &ranges);
        for (i, &got) in dx.iter().enumerate() {
            let want = slope(&|x| loss(x, &w0), &x0, i);
            assert!((got - want).abs() < 1e-6, "{sem} dx[{i}] {got} vs {want}");
        }
        let dw = backward_dw(&sp, &inp);
        assert_eq!(dw.len(), cols);
        for (j, &got) in dw.iter().enumerate() {
            let want = slope(&|w| loss(&x0, w), &w0, j);
            assert!((got - want).abs() < 1e-6, "{sem} dw[{j}] {got} vs {want}");
        }
    }

    #[test]
    fn rms_norm_backward_llama_is_the_forward_truths_derivative() {
        rms_norm_backward_is_the_forward_truths_derivative(Semantics::Llama);
    }

    #[test]
    fn rms_norm_backward_gemma_is_the_forward_truths_derivative() {
        rms_norm_backward_is_the_forward_truths_derivative(Semantics::Gemma);
    }

    /// fused_add_rms_norm_backward's truth: the llama norm's (checked against finite
    /// differences above) plus the residual output's gradient in dx (d/dh of `sum dy * y(h) +
    /// sum dres * h`), its dw the norm's.
    #[test]
    fn fused_add_rms_norm_backward_is_the_norms_plus_the_residuals_gradient() {
        let (rows, cols) = (3usize, 5usize);
        let v = |k: usize, d: f32| -> Vec<f32> {
            (0..rows * cols)
                .map(|i| ((i * k % 11) as f32 - 5.0) / d)
                .collect()
        };
        let ws: Vec<f32> = (0..cols).map(|j| 0.75 + j as f32 / 8.0).collect();
        let inp = |dres: Option<Vec<f32>>| CaseInputs {
            mean: None,
            rstd: None,
            x: tensor(DType::F32, &v(7, 4.0)),
            up: None,
            residual: dres.map(|d| tensor(DType::F32, &d)),
            weight: Some(tensor(DType::F32, &ws)),
            bias: None,
            dy: Some(tensor(DType::F32, &v(5, 2.0))),
        };
        let dres = v(3, 8.0);
        let mut fa = spec(Op::FusedAddRmsNormBackward, Semantics::Default, 3, 5);
        let mut ll = spec(Op::RmsNormBackward, Semantics::Llama, 3, 5);
        fa.eps = 0.0625;
        ll.eps = 0.0625;
        let (fi, li) = (inp(Some(dres.clone())), inp(None));
        let ranges = sample(&fa);
        let (got, want) = (oracle(&fa, &fi, &ranges), oracle(&ll, &li, &ranges));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            close(*g, w + dres[i] as f64);
        }
        assert_eq!(backward_dw(&fa, &fi), backward_dw(&ll, &li));
    }

    /// F.rms_norm's gradients (semantics torch): llama's function (x * r * w), other orders.
    #[test]
    fn rms_norm_backward_torch_is_the_forward_truths_derivative() {
        rms_norm_backward_is_the_forward_truths_derivative(Semantics::Torch);
    }

    /// gemma's dx is not llama's on the same inputs (the weight enters as 1 + w), its dw is.
    #[test]
    fn rms_norm_backward_gemma_differs_from_llama_in_dx_only() {
        let (rows, cols) = (2usize, 4usize);
        let xs: Vec<f32> = (0..rows * cols).map(|i| i as f32 / 3.0 - 1.0).collect();
        let ws: Vec<f32> = (0..cols).map(|j| j as f32 / 8.0 - 0.1).collect();
        let dys: Vec<f32> = (0..rows * cols).map(|i| 1.0 - i as f32 / 5.0).collect();
        let inp = CaseInputs {
            mean: None,
            rstd: None,
            x: tensor(DType::F32, &xs),
            up: None,
            residual: None,
            weight: Some(tensor(DType::F32, &ws)),
            bias: None,
            dy: Some(tensor(DType::F32, &dys)),
        };
        let l = spec(
            Op::RmsNormBackward,
            Semantics::Llama,
            rows as u64,
            cols as u64,
        );
        let g = CaseSpec {
            semantics: Semantics::Gemma,
            ..l.clone()
        };
        let ranges = sample(&l);
        assert_eq!(sample(&g), ranges);
        let (dl, dg) = (oracle(&l, &inp, &ranges), oracle(&g, &inp, &ranges));
        assert!(dl.iter().zip(&dg).any(|(a, b)| (a - b).abs() > 1e-3));
        assert_eq!(backward_dw(&l, &inp), backward_dw(&g, &inp));
    }

    /// layer_norm_backward's oracle is the derivative of nn.LayerNorm's forward: against
    /// central finite differences of `L = sum dy * (w * (x - m) r + b)` in f64, m and r the
    /// row's statistics of x (the case's saved ones are those rounded to f32, hence the
    /// tolerance), for dx, dw and db.
    #[test]
    fn layer_norm_backward_is_the_forward_truths_derivative() {
        let (rows, cols) = (3usize, 5usize);
        let xs: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0)
            .collect();
        let ws: Vec<f32> = (0..cols).map(|j| 0.75 + j as f32 / 8.0).collect();
        let bs: Vec<f32> = (0..cols).map(|j| j as f32 / 4.0 - 0.5).collect();
        let dys: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 5 % 7) as f32 - 3.0) / 2.0)
            .collect();
        let mut sp = spec(
            Op::LayerNormBackward,
            Semantics::Default,
            rows as u64,
            cols as u64,
        );
        sp.eps = 0.0625;
        let x = tensor(DType::F32, &xs);
        let (mean, rstd) = crate::cases::row_stats(&x, rows as u64, cols as u64, sp.eps);
        let inp = CaseInputs {
            x,
            up: None,
            residual: None,
            weight: Some(tensor(DType::F32, &ws)),
            bias: None,
            dy: Some(tensor(DType::F32, &dys)),
            mean: Some(mean),
            rstd: Some(rstd),
        };
        let loss = |x: &[f64], w: &[f64], b: &[f64]| -> f64 {
            let mut l = 0.0;
            for i in 0..rows {
                let h = &x[i * cols..(i + 1) * cols];
                let m = h.iter().sum::<f64>() / cols as f64;
                let var = h.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / cols as f64;
                let r = 1.0 / (var + sp.eps as f64).sqrt();
                for j in 0..cols {
                    l += dys[i * cols + j] as f64 * (w[j] * (h[j] - m) * r + b[j]);
                }
            }
            l
        };
        let x0: Vec<f64> = xs.iter().map(|&v| v as f64).collect();
        let w0: Vec<f64> = ws.iter().map(|&v| v as f64).collect();
        let b0: Vec<f64> = bs.iter().map(|&v| v as f64).collect();
        let [dx, dw, db] = Op::LayerNormBackward.gradients() else {
            panic!("three gradients")
        };
        let (ranges, got) = backward_truth(&sp, &inp, dx);
        assert_eq!(ranges.len(), rows, "every row of a small case");
        for (i, &got) in got.iter().enumerate() {
            let want = slope(&|x| loss(x, &w0, &b0), &x0, i);
            assert!((got - want).abs() < 1e-5, "dx[{i}] {got} vs {want}");
        }
        for (g, wrt_b) in [(dw, false), (db, true)] {
            let (ranges, got) = backward_truth(&sp, &inp, g);
            assert_eq!((ranges, got.len()), (vec![(0, cols)], cols));
            for (j, &got) in got.iter().enumerate() {
                let want = if wrt_b {
                    slope(&|b| loss(&x0, &w0, b), &b0, j)
                } else {
                    slope(&|w| loss(&x0, w, &b0), &w0, j)
                };
                assert!((got - want).abs() < 1e-5, "{}[{j}] {got} vs {want}", g.name);
            }
        }
    }

    /// A gated backward op's oracle (`op`, activation `act`) is the derivative of its forward's
    /// truth: against central finite differences of `L = sum dy * act(gate) * up` in f64, d_gate
    /// (also `oracle()`'s) and d_up at every element of a `rows x cols` case of these inputs.
    /// Returns the case and both gradients' truth for the caller's own checks.
    fn gated_slopes_checked(
        op: Op,
        act: &dyn Fn(f64) -> f64,
        (rows, cols): (usize, usize),
        gs: &[f32],
        us: &[f32],
        dys: &[f32],
    ) -> (CaseSpec, CaseInputs, Vec<f64>, Vec<f64>) {
        let sp = spec(op, Semantics::Default, rows as u64, cols as u64);
        let inp = CaseInputs {
            mean: None,
            rstd: None,
            x: tensor(DType::F32, gs),
            up: Some(tensor(DType::F32, us)),
            residual: None,
            weight: None,
            bias: None,
            dy: Some(tensor(DType::F32, dys)),
        };
        let loss = |g: &[f64], u: &[f64]| -> f64 {
            (0..rows * cols)
                .map(|i| dys[i] as f64 * act(g[i]) * u[i])
                .sum()
        };
        let g0: Vec<f64> = gs.iter().map(|&v| v as f64).collect();
        let u0: Vec<f64> = us.iter().map(|&v| v as f64).collect();
        let [d_gate, d_up] = op.gradients() else {
            panic!("two gradients")
        };
        let (ranges, dg) = backward_truth(&sp, &inp, d_gate);
        assert_eq!(ranges.len(), rows, "every row of a small case");
        assert_eq!(dg, oracle(&sp, &inp, &ranges), "oracle() gives d_gate");
        let (_, du) = backward_truth(&sp, &inp, d_up);
        assert_eq!((dg.len(), du.len()), (rows * cols, rows * cols));
        for i in 0..rows * cols {
            let want = slope(&|g| loss(g, &u0), &g0, i);
            assert!(
                (dg[i] - want).abs() < 1e-6,
                "d_gate[{i}] {} vs {want}",
                dg[i]
            );
            let want = slope(&|u| loss(&g0, u), &u0, i);
            assert!((du[i] - want).abs() < 1e-6, "d_up[{i}] {} vs {want}", du[i]);
        }
        (sp, inp, dg, du)
    }

    /// silu_mul_backward's oracle is the derivative of its forward's truth: against central
    /// finite differences of `L = sum dy * silu(gate) * up` in f64, for d_gate and d_up; and its
    /// limits at infinite gates.
    #[test]
    fn silu_mul_backward_is_the_forward_truths_derivative() {
        let (rows, cols) = (3usize, 5usize);
        let gs: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 1.5)
            .collect();
        let us: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 3 % 13) as f32 - 6.0) / 4.0)
            .collect();
        let dys: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 5 % 7) as f32 - 3.0) / 2.0)
            .collect();
        let (sp, inp, dg, du) =
            gated_slopes_checked(Op::SiluMulBackward, &silu, (rows, cols), &gs, &us, &dys);
        // by hand at gate 1: sig = 1/(1+e^-1); silu' = sig (1 + (1 - sig))
        let sig = 1.0 / (1.0 + (-1.0f64).exp());
        close(silu_grad(1.0), sig * (2.0 - sig));
        close(silu_grad(0.0), 0.5);
        // the limits: 0 at -inf, 1 at +inf; large finite gates approach them
        assert_eq!(silu_grad(f64::NEG_INFINITY), 0.0);
        assert_eq!(silu_grad(f64::INFINITY), 1.0);
        assert!(silu_grad(-800.0).abs() < 1e-300 && (silu_grad(800.0) - 1.0).abs() < 1e-15);
        assert!(silu_grad(f64::NAN).is_nan());
        // accuracy per gradient, in Op::gradients order: a one-ulp-off d_up counts there only
        let exact: Vec<u8> = dg.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
        let up: Vec<u8> = du.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
        let mut off = up.clone();
        off[0..4].copy_from_slice(&(du[0] as f32 + 1.0).to_le_bytes());
        let a = backward_accuracy(&sp, &inp, &[(&exact, &exact), (&off, &up)], None);
        assert_eq!(a.len(), 2);
        assert!(a[0].candidate_max_abs < 1e-6 && a[0].reference_max_abs < 1e-6);
        assert!(a[1].candidate_max_abs > 0.5 && a[1].reference_max_abs < 1e-6);
    }

    /// gelu_tanh_mul_backward's oracle is the derivative of its forward's truth (gelu_tanh of the
    /// gate times up): against central differences of the loss `sum dy * gelu_tanh(g) * u`, with
    /// gates on both sides of tanh's saturation; the limits at +-inf and huge gates.
    #[test]
    fn gelu_tanh_mul_backward_is_the_forward_truths_derivative() {
        let (rows, cols) = (3usize, 6usize);
        let gs: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7 % 17) as f32 - 8.0) / 1.7)
            .collect();
        let us: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 3 % 13) as f32 - 6.0) / 4.0)
            .collect();
        let dys: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 5 % 7) as f32 - 3.0) / 2.0)
            .collect();
        let gelu = |h: f64| elementwise(Op::GeluTanh, h);
        gated_slopes_checked(Op::GeluTanhMulBackward, &gelu, (rows, cols), &gs, &us, &dys);
        // by hand at 0: gelu_tanh'(0) = 0.5; the limits; saturated gates give 0 and 1, not NaN
        close(gelu_tanh_grad(0.0), 0.5);
        assert_eq!(gelu_tanh_grad(f64::NEG_INFINITY), 0.0);
        assert_eq!(gelu_tanh_grad(f64::INFINITY), 1.0);
        assert_eq!(gelu_tanh_grad(-1e200), 0.0);
        assert_eq!(gelu_tanh_grad(1e200), 1.0);
        assert!(gelu_tanh_grad(-30.0).abs() < 1e-300 && (gelu_tanh_grad(30.0) - 1.0).abs() < 1e-15);
        assert!(gelu_tanh_grad(f64::NAN).is_nan());
        // not silu's: the two activations' derivatives differ at 1
        assert!((gelu_tanh_grad(1.0) - silu_grad(1.0)).abs() > 1e-2);
    }

    /// The activations' backward ops' oracle is the derivative of their forward's truth
    /// (`elementwise`): against central finite differences of `L = sum dy * act(x)` in f64 at
    /// every element of a small case, x on both sides of 0, where tanh and erf saturate and where
    /// silu's exp is large; `oracle()` gives the same as `backward_truth`; the limits.
    #[test]
    fn activation_backward_ops_are_the_forward_truths_derivative() {
        let n = 24usize;
        let xs: Vec<f32> = (0..n).map(|i| (i as f32 - 11.5) / 1.9).collect();
        let dys: Vec<f32> = (0..n).map(|i| ((i * 5 % 7) as f32 - 3.0) / 2.0).collect();
        for op in [Op::SiluBackward, Op::GeluBackward, Op::GeluTanhBackward] {
            let act = op.forward().unwrap();
            let sp = spec(op, Semantics::Default, 1, n as u64);
            let inp = CaseInputs {
                mean: None,
                rstd: None,
                x: tensor(DType::F32, &xs),
                up: None,
                residual: None,
                weight: None,
                bias: None,
                dy: Some(tensor(DType::F32, &dys)),
            };
            let loss =
                |x: &[f64]| -> f64 { (0..n).map(|i| dys[i] as f64 * elementwise(act, x[i])).sum() };
            let x0: Vec<f64> = xs.iter().map(|&v| v as f64).collect();
            let [dx] = op.gradients() else {
                panic!("one gradient")
            };
            let (ranges, got) = backward_truth(&sp, &inp, dx);
            assert_eq!(ranges, [(0, n)], "{op}: every element of a small case");
            assert_eq!(got, oracle(&sp, &inp, &ranges), "{op}");
            for (i, &g) in got.iter().enumerate() {
                let want = slope(&loss, &x0, i);
                assert!((g - want).abs() < 1e-6, "{op} dx[{i}] {g} vs {want}");
            }
            // the limits at -inf and +inf, and huge finite inputs approaching them
            assert_eq!(activation_grad(act, f64::NEG_INFINITY), 0.0, "{op}");
            assert_eq!(activation_grad(act, f64::INFINITY), 1.0, "{op}");
            assert!(activation_grad(act, -1e200).abs() < 1e-300, "{op}");
            assert!((activation_grad(act, 1e200) - 1.0).abs() < 1e-15, "{op}");
            assert!(activation_grad(act, f64::NAN).is_nan(), "{op}");
        }
        // by hand: gelu'(0) = 0.5 and gelu'(1) = Phi(1) + phi(1); the erf and tanh forms differ
        close(gelu_grad(0.0), 0.5);
        let phi1 = (-0.5f64).exp() / (2.0 * std::f64::consts::PI).sqrt();
        close(
            gelu_grad(1.0),
            0.5 * (1.0 + erf(1.0 / std::f64::consts::SQRT_2)) + phi1,
        );
        assert!((gelu_grad(1.0) - gelu_tanh_grad(1.0)).abs() > 1e-5);
        assert!((gelu_grad(1.0) - gelu_tanh_grad(1.0)).abs() < 1e-2);
    }

    #[test]
    fn rms_norm_by_hand() {
        // x = [3, 4]: mean square 12.5; eps 1e-6.
        let dt = DType::F32;
        let inp = CaseInputs {
            mean: None,
            rstd: None,
            x: tensor(dt, &[3.0, 4.0]),
            up: None,
            residual: None,
            weight: Some(tensor(dt, &[1.0, 0.5])),
            bias: None,
            dy: None,
        };
        let r = 1.0 / (12.5f64 + 1e-6f32 as f64).sqrt();
        let s = spec(Op::RmsNorm, Semantics::Llama, 1, 2);
        let o = oracle(&s, &inp, &sample(&s));
        close(o[0], 3.0 * r);
        close(o[1], 4.0 * r * 0.5);
        let s = spec(Op::RmsNorm, Semantics::Gemma, 1, 2);
        let o = oracle(&s, &inp, &sample(&s));
        close(o[1], 4.0 * r * 1.5);
    }

    #[test]
    fn layer_norm_by_hand() {
        // x = [1, 2, 3, 6]: mean 3, biased var (4+1+0+9)/4 = 3.5.
        let dt = DType::F32;
        let inp = CaseInputs {
            mean: None,
            rstd: None,
            x: tensor(dt, &[1.0, 2.0, 3.0, 6.0]),
            up: None,
            residual: None,
            weight: Some(tensor(dt, &[1.0, 1.0, 2.0, 1.0])),
            bias: Some(tensor(dt, &[0.0, 0.5, 0.0, 0.0])),
            dy: None,
        };
        let s = spec(Op::LayerNorm, Semantics::Default, 1, 4);
        let o = oracle(&s, &inp, &sample(&s));
        let rstd = 1.0 / (3.5f64 + 1e-5f32 as f64).sqrt();
        close(o[0], -2.0 * rstd);
        close(o[1], -rstd + 0.5);
        close(o[2], 0.0);
        close(o[3], 3.0 * rstd);
    }

    #[test]
    fn activations_by_hand() {
        close(elementwise(Op::Silu, 0.0), 0.0);
        close(elementwise(Op::Silu, 1.0), 1.0 / (1.0 + (-1.0f64).exp()));
        close(elementwise(Op::Gelu, 1.0), 0.841_344_746_068_542_9);
        close(elementwise(Op::Gelu, -1.0), -0.158_655_253_931_457_05);
        close(elementwise(Op::GeluTanh, 1.0), 0.841_191_990_607_893_2);
        assert_eq!(elementwise(Op::Silu, f64::NEG_INFINITY), 0.0);
        assert!(elementwise(Op::Silu, f64::NAN).is_nan());
        // silu_and_mul: rows of [g | u].
        let dt = DType::F32;
        let inp = CaseInputs {
            mean: None,
            rstd: None,
            x: tensor(dt, &[1.0, 0.0, 2.0, 5.0]),
            up: None,
            residual: None,
            weight: None,
            bias: None,
            dy: None,
        };
        let s = spec(Op::SiluAndMul, Semantics::Default, 1, 2);
        let o = oracle(&s, &inp, &sample(&s));
        close(o[0], elementwise(Op::Silu, 1.0) * 2.0);
        close(o[1], 0.0);
    }

    #[test]
    fn gated_ops_by_hand() {
        // Values from Python's math module: silu(h) = h / (1 + exp(-h)),
        // gelu_tanh(h) = h/2 (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3))).
        let dt = DType::F32;
        let inp = |g: &[f32], u: &[f32]| CaseInputs {
            mean: None,
            rstd: None,
            x: tensor(dt, g),
            up: Some(tensor(dt, u)),
            residual: None,
            weight: None,
            bias: None,
            dy: None,
        };
        // one row of 3: the gate and up are separate tensors, element i with element i
        let s = spec(Op::SiluMul, Semantics::Default, 1, 3);
        let o = oracle(&s, &inp(&[1.0, -2.0, 0.5], &[2.0, 3.0, 0.25]), &sample(&s));
        close(o[0], 1.462_117_157_260_009_8);
        close(o[1], -0.715_217_532_132_705_2);
        close(o[2], 0.077_807_416_400_231_82);
        let s = spec(Op::GeluTanhMul, Semantics::Default, 2, 1);
        let o = oracle(&s, &inp(&[1.0, -0.5], &[-1.5, 4.0]), &sample(&s));
        close(o[0], -1.261_787_985_912_415_3);
        close(o[1], -0.617_143_960_699_424_2);
        // no intermediate rounding: silu(1) * 3 is not round_bf16(silu(1)) * 3
        let s = CaseSpec {
            dtype: DType::Bf16,
            ..spec(Op::SiluMul, Semantics::Default, 1, 1)
        };
        let b = |v: f32| tensor(DType::Bf16, &[v]);
        let i = CaseInputs {
            mean: None,
            rstd: None,
            x: b(1.0),
            up: Some(b(3.0)),
            residual: None,
            weight: None,
            bias: None,
            dy: None,
        };
        close(
            oracle(&s, &i, &sample(&s))[0],
            3.0 / (1.0 + (-1.0f64).exp()),
        );
        // propagation: -inf gate gives silu = -0, times a finite up; NaN stays NaN
        let s = spec(Op::SiluMul, Semantics::Default, 1, 2);
        let o = oracle(
            &s,
            &inp(&[f32::NEG_INFINITY, f32::NAN], &[2.0, 1.0]),
            &sample(&s),
        );
        assert_eq!(o[0], 0.0);
        assert!(o[1].is_nan());
        assert_eq!(gate_activation(Op::GeluTanhMul), Op::GeluTanh);
        assert_eq!(gate_activation(Op::SiluMul), Op::Silu);
    }

    #[test]
    fn fused_add_normalises_the_stored_residual() {
        let dt = DType::Bf16;
        // 1 + 2^-9 is not representable in bf16: the stored residual is 1.0.
        let inp = CaseInputs {
            mean: None,
            rstd: None,
            x: tensor(dt, &[1.0, 1.0]),
            up: None,
            residual: Some(tensor(DType::F32, &[0.001953125, 0.0]).clone()),
            weight: Some(tensor(dt, &[1.0, 1.0])),
            bias: None,
            dy: None,
        };
        let mut inp = inp;
        inp.residual = Some(tensor(dt, &[0.001953125, 0.0]));
        let mut s = spec(Op::FusedAddRmsNorm, Semantics::Llama, 1, 2);
        s.dtype = dt;
        let o = oracle(&s, &inp, &sample(&s));
        close(o[0], o[1]);
    }

    #[test]
    fn errors_skip_nonfinite_truth() {
        let dt = DType::F32;
        let out = tensor(dt, &[1.0, f32::NAN, 3.0]);
        let (m, r) = errors(dt, &out.bytes, &[(0, 3)], &[1.5, f64::NAN, 3.0]);
        close(m, 0.5);
        close(r, (0.25f64 / 2.0).sqrt());
        let (m, _) = errors(dt, &out.bytes, &[(0, 3)], &[1.0, 2.0, 3.0]);
        assert_eq!(m, f64::MAX);
    }

    #[test]
    fn sample_is_bounded_and_keeps_ends() {
        let s = spec(Op::RmsNorm, Semantics::Llama, 32768, 4096);
        let r = sample(&s);
        assert!(r.iter().map(|x| x.1 as u64).sum::<u64>() <= MAX_ORACLE_ELEMENTS);
        assert_eq!(r[0].0, 0);
        assert_eq!(r.last().unwrap().0, 32767 * 4096);
        let s = spec(Op::Silu, Semantics::Default, 32768, 4096);
        assert!(sample(&s).iter().map(|x| x.1 as u64).sum::<u64>() <= MAX_ORACLE_ELEMENTS);
    }
}
