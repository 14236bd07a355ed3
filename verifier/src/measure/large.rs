//! The large-index case: two rows and more past 2^32 elements, so that 32-bit index arithmetic
//! (signed or unsigned, per element or per row start) wraps. Its
//! inputs are made on the GPU (`kz_gen_*`), the candidate runs once into a poisoned output, the
//! reference after it, and the two outputs are compared on the GPU (`kz_mismatch_*`): gigabytes
//! never cross to the host unless they differ.

use super::{poison::Poison, CaseRun, Kern, Tools};
use crate::abi::Bufs;
use crate::cases::{self, CaseSpec};
use crate::cuda::{Arg, DevBuf, Gpu, GUARD_BYTES};
use crate::exec::{ExecError, Limits};
use crate::numeric::compare;
use kernel_registry::report::{CaseReport, CaseStatus, Exactness};
use kernel_registry::Op;
use std::time::Duration;

/// Device memory kept free besides the case's buffers.
const MEMORY_MARGIN: u64 = 2 << 30;
/// Elements around the first mismatch whose details (ulp, abs diff) are downloaded.
const WINDOW: u64 = 1 << 24;

/// Elements of the `x` input: silu_and_mul's holds gate and up, a gated op's gate and up are
/// two tensors of n (`up` counted here too).
fn input_elements(spec: &CaseSpec) -> u64 {
    let n = spec.rows * spec.cols;
    if spec.op == Op::SiluAndMul || spec.op.is_gated() {
        2 * n
    } else {
        n
    }
}

/// Device bytes the case needs: the inputs, the candidate's and the reference's outputs, three
/// residual copies for the fused adds, the parameters.
pub fn bytes_needed(spec: &CaseSpec) -> u64 {
    let es = spec.dtype.size_bytes() as u64;
    let n = spec.rows * spec.cols;
    let x = input_elements(spec);
    let res = if spec.op.updates_residual() { 3 * n } else { 0 };
    es * (x + 2 * n + res + 2 * spec.cols) + 8 * GUARD_BYTES as u64
}

fn gen(gpu: &Gpu, tools: &Tools, buf: &DevBuf, n: u64, key: u64) -> Result<(), ExecError> {
    let blocks = n.div_ceil(256).clamp(1, 1 << 16) as u32;
    gpu.launch(
        "making large-index inputs",
        tools.gen,
        [blocks, 1, 1],
        [256, 1, 1],
        0,
        &[
            Arg::Ptr(buf.ptr()),
            Arg::I64(n as i64),
            Arg::U64(key),
            Arg::F32(0.0),
            Arg::F32(1.0),
        ],
        Duration::from_secs(120),
    )
}

/// (mismatching elements, first) of two device buffers of `n` elements, on the GPU.
fn mismatches(
    gpu: &Gpu,
    tools: &Tools,
    a: &DevBuf,
    b: &DevBuf,
    n: u64,
) -> Result<(u64, u64), ExecError> {
    let res = gpu.alloc(16)?;
    let mut init = [0u8; 16];
    init[8..].copy_from_slice(&u64::MAX.to_le_bytes());
    gpu.upload(&res, &init)?;
    let blocks = n.div_ceil(256).clamp(1, 1 << 16) as u32;
    gpu.launch(
        "comparing large outputs on the GPU",
        tools.mismatch,
        [blocks, 1, 1],
        [256, 1, 1],
        0,
        &[
            Arg::Ptr(a.ptr()),
            Arg::Ptr(b.ptr()),
            Arg::I64(n as i64),
            Arg::Ptr(res.ptr()),
        ],
        Duration::from_secs(120),
    )?;
    let mut r = [0u8; 16];
    gpu.download(&res, &mut r)?;
    Ok((
        u64::from_le_bytes(r[..8].try_into().expect("8")),
        u64::from_le_bytes(r[8..].try_into().expect("8")),
    ))
}

/// Download `len` elements from element `start` of a device buffer.
fn window(gpu: &Gpu, b: &DevBuf, es: usize, start: u64, len: u64) -> Result<Vec<u8>, ExecError> {
    let mut v = vec![0u8; len as usize * es];
    gpu.download_at(b, start as usize * es, &mut v)?;
    Ok(v)
}

pub(crate) fn run<'a>(
    gpu: &'a Gpu,
    spec: &'a CaseSpec,
    limits: &'a Limits,
    cand: Kern<'a>,
    refk: Kern<'a>,
    tools: Tools,
    skeleton: CaseReport,
) -> Result<CaseReport, ExecError> {
    let need = bytes_needed(spec);
    let (free, _) = gpu.memory()?;
    if need + MEMORY_MARGIN > free as u64 {
        return Ok(CaseReport {
            status: CaseStatus::NotApplicable,
            note: Some(format!(
                "not run: needs {:.1} GB of device memory, {:.1} GB free",
                need as f64 / 1e9,
                free as f64 / 1e9
            )),
            ..skeleton
        });
    }
    let es = spec.dtype.size_bytes();
    let n = spec.rows * spec.cols;
    let x_n = if spec.op == Op::SiluAndMul { 2 * n } else { n };
    // Parameters as the suite makes them (they depend on the seed and cols only).
    let params = cases::generate_shape(spec, 1);
    let upload = |t: &cases::HostTensor| -> Result<DevBuf, ExecError> {
        let b = gpu.alloc(t.bytes.len())?;
        gpu.upload(&b, &t.bytes)?;
        Ok(b)
    };
    let x = gpu.alloc(x_n as usize * es)?;
    gen(gpu, &tools, &x, x_n, spec.seed)?;
    let up = if spec.op.is_gated() {
        let u = gpu.alloc(n as usize * es)?;
        gen(gpu, &tools, &u, n, spec.seed ^ 0x0B)?;
        Some(u)
    } else {
        None
    };
    let residual = if spec.op.updates_residual() {
        let r = gpu.alloc(n as usize * es)?;
        gen(gpu, &tools, &r, n, spec.seed ^ 0x5E51)?;
        Some(r)
    } else {
        None
    };
    let run = CaseRun {
        gpu,
        spec,
        limits,
        cand,
        refk,
        tools,
        bufs: Bufs {
            x,
            up,
            residual,
            weight: params.weight.as_ref().map(upload).transpose()?,
            bias: params.bias.as_ref().map(upload).transpose()?,
        },
        sum_buf: gpu.alloc(8)?,
    };
    // Input sums before the launch, with a key the kernel never sees.
    let key = Poison::fresh().key;
    let inputs: Vec<(&str, &DevBuf)> = [
        Some((if spec.op.is_gated() { "gate" } else { "x" }, &run.bufs.x)),
        run.bufs.up.as_ref().map(|u| ("up", u)),
        run.bufs.weight.as_ref().map(|w| ("weight", w)),
        run.bufs.bias.as_ref().map(|b| ("bias", b)),
        run.bufs.residual.as_ref().map(|r| ("residual", r)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let before: Vec<u64> = inputs
        .iter()
        .map(|(_, b)| run.device_sum(b, key))
        .collect::<Result<_, _>>()?;

    let out = gpu.alloc(n as usize * es)?;
    let res = match &run.bufs.residual {
        Some(pr) => {
            let r = gpu.alloc(pr.bytes)?;
            gpu.copy(&r, pr)?;
            Some(r)
        }
        None => None,
    };
    run.poison_and_launch_candidate(&out, res.as_ref(), None, spec.rows)?;

    let mut integrity = Vec::new();
    let mut guarded: Vec<(&str, &DevBuf)> = vec![("out", &out)];
    guarded.extend(res.as_ref().map(|r| ("residual", r)));
    guarded.extend(inputs.iter().copied());
    for (name, b) in &guarded {
        for g in gpu.check_guards(b)? {
            integrity.push(format!("{name}: {g}"));
        }
    }
    for ((name, b), was) in inputs.iter().zip(&before) {
        if run.device_sum(b, key)? != *was {
            integrity.push(format!("input {name} was modified by the kernel"));
        }
    }

    // The reference, after the candidate.
    let ref_out = gpu.alloc(n as usize * es)?;
    let ref_res = match &run.bufs.residual {
        Some(pr) => {
            let r = gpu.alloc(pr.bytes)?;
            gpu.copy(&r, pr)?;
            Some(r)
        }
        None => None,
    };
    run.launch(&run.refk, &ref_out, ref_res.as_ref(), None, spec.rows)?;
    let mut pairs = vec![(&out, &ref_out)];
    if let (Some(a), Some(b)) = (&res, &ref_res) {
        pairs.push((a, b));
    }
    let mut count = 0;
    let mut first = u64::MAX;
    for (a, b) in &pairs {
        let (c, f) = mismatches(gpu, &run.tools, a, b, n)?;
        count += c;
        first = first.min(f);
    }
    let (exactness, note) = if count == 0 {
        (Exactness::all_equal(n), None)
    } else {
        // Details on a window around the first mismatch; the count is the GPU's, over all.
        let start = first
            .saturating_sub(WINDOW / 2)
            .min(n.saturating_sub(WINDOW));
        let len = WINDOW.min(n);
        let mut e = compare(
            spec.dtype,
            &[(
                &window(gpu, &out, es, start, len)?,
                &window(gpu, &ref_out, es, start, len)?,
            )],
        );
        e.elements = n;
        e.mismatches = count;
        e.mismatch_fraction = count as f64 / n as f64;
        (
            e,
            Some(format!(
                "{count} of {n} elements differ (first: element {first}, row {}); ulp and abs diff measured on the {len} elements around it",
                first / spec.cols
            )),
        )
    };
    for b in std::iter::once(&ref_out).chain(ref_res.as_ref()) {
        gpu.fill_pattern(run.tools.fill, b, Poison::fresh().key, false)?;
    }
    Ok(CaseReport {
        note,
        exactness: Some(exactness),
        integrity_failures: integrity,
        ..skeleton
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_registry::{DType, Semantics};

    #[test]
    fn memory_need_counts_every_buffer() {
        let mut s = cases::suite(
            Op::FusedAddRmsNorm,
            Semantics::Default,
            &[DType::Bf16],
            true,
            1,
            &[],
        )
        .into_iter()
        .find(|c| c.large_index)
        .unwrap();
        let n = s.rows * s.cols;
        assert!(bytes_needed(&s) >= 2 * (n + 2 * n + 3 * n));
        s.op = Op::Silu;
        assert!(bytes_needed(&s) >= 2 * 3 * n && bytes_needed(&s) < 2 * 4 * n);
        // gate and up, the two outputs
        for op in [Op::SiluMul, Op::GeluTanhMul, Op::SiluAndMul] {
            s.op = op;
            assert!(
                bytes_needed(&s) >= 2 * 4 * n && bytes_needed(&s) < 2 * 5 * n,
                "{op}"
            );
        }
    }

    #[test]
    fn an_exact_comparison_is_all_in_bucket_zero() {
        let e = Exactness::all_equal(1 << 31);
        assert_eq!(e.ulp_histogram.iter().sum::<u64>(), 1 << 31);
        assert_eq!(e.mismatches, 0);
    }
}
