//! The in-process CUDA executor: runs one case of a candidate kernel against the built-in
//! reference and measures exactness, accuracy, determinism, batch invariance, integrity and
//! speed. Untrusted kernels run it inside the sandbox process (`crate::sandbox`).

use crate::cases::{self, bytes_moved, CaseInputs, CaseSpec};
use crate::cuda::{Arg, CompileJob, DevBuf, Gpu, GUARD_BYTE};
use crate::exec::{ExecError, Executor, Limits};
use crate::numeric::{compare, count_bit_differences, keyed_sum, worst};
use crate::oracle;
use cudarc::driver::sys::CUfunction;
use kernel_registry::manifest::{entry_options, LaunchDims};
use kernel_registry::report::{CaseReport, CaseStatus, DeviceInfo, Speed};
use kernel_registry::{DType, KernelBundle, Op, Semantics};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

/// The reference layers' CUDA source (docs/reference-semantics.md).
pub const REFERENCE_SOURCE: &str = include_str!("reference.cu");

/// Poison bytes the output is filled with before launches 1, 2, 3. An element is "never
/// written" when it holds the poison of every launch (two different patterns).
const POISON: [u8; 3] = [0xFF, 0xFE, 0xFF];

/// The reference entry for (op, semantics, dtype).
pub fn reference_symbol(op: Op, sem: Semantics, dt: DType) -> String {
    format!("ref_{op}_{sem}_{dt}")
}

fn reference_digest() -> String {
    format!(
        "builtin-reference-{}",
        crate::cases::stable_hash(REFERENCE_SOURCE)
    )
}

/// Launch dimensions of the reference layers.
pub fn reference_dims(op: Op, rows: u64, cols: u64) -> LaunchDims {
    // Row-wise references: one 512-thread block per row (reference.cu's RB).
    let (grid, threads) = match op {
        Op::RmsNorm | Op::FusedAddRmsNorm | Op::LayerNorm => (rows.max(1), 512),
        _ => ((rows * cols).div_ceil(256).clamp(1, 1 << 20), 256),
    };
    LaunchDims {
        grid: [grid as u32, 1, 1],
        block: [threads, 1, 1],
        shared_mem_bytes: 0,
    }
}

/// Device copies of a case's tensors.
struct Bufs {
    x: DevBuf,
    residual: Option<DevBuf>,
    weight: Option<DevBuf>,
    bias: Option<DevBuf>,
}

impl Bufs {
    fn upload(gpu: &Gpu, inp: &CaseInputs) -> Result<Bufs, ExecError> {
        let up = |t: &cases::HostTensor| -> Result<DevBuf, ExecError> {
            let b = gpu.alloc(t.bytes.len())?;
            gpu.upload(&b, &t.bytes)?;
            Ok(b)
        };
        Ok(Bufs {
            x: up(&inp.x)?,
            residual: inp.residual.as_ref().map(up).transpose()?,
            weight: inp.weight.as_ref().map(up).transpose()?,
            bias: inp.bias.as_ref().map(up).transpose()?,
        })
    }
}

/// Kernel arguments in the ABI order of SPEC section 2.
fn abi_args(
    op: Op,
    out: &DevBuf,
    residual: Option<&DevBuf>,
    b: &Bufs,
    rows: u64,
    cols: u64,
) -> Vec<Arg> {
    let p = |d: &DevBuf| Arg::Ptr(d.ptr());
    let (r, c) = (Arg::I64(rows as i64), Arg::I64(cols as i64));
    let eps = Arg::F32(cases::eps(op));
    match op {
        Op::RmsNorm => vec![p(out), p(&b.x), p(b.weight.as_ref().unwrap()), r, c, eps],
        Op::FusedAddRmsNorm => vec![
            p(out),
            p(residual.expect("fused_add has a residual")),
            p(&b.x),
            p(b.weight.as_ref().unwrap()),
            r,
            c,
            eps,
        ],
        Op::LayerNorm => vec![
            p(out),
            p(&b.x),
            p(b.weight.as_ref().unwrap()),
            p(b.bias.as_ref().unwrap()),
            r,
            c,
            eps,
        ],
        Op::Silu | Op::Gelu | Op::GeluTanh => {
            vec![p(out), p(&b.x), Arg::I64((rows * cols) as i64)]
        }
        Op::SiluAndMul => vec![p(out), p(&b.x), r, c],
    }
}

/// A kernel ready to launch: function, and how its dims are found.
struct Kern<'a> {
    name: String,
    f: CUfunction,
    dims: Box<dyn Fn(u64, u64) -> Result<LaunchDims, String> + 'a>,
}

/// The executor that runs cases in this process.
pub struct CudaExecutor {
    gpu: Option<Gpu>,
}

impl Default for CudaExecutor {
    fn default() -> Self {
        Self::new()
    }
}

impl CudaExecutor {
    pub fn new() -> Self {
        CudaExecutor { gpu: None }
    }

    pub fn gpu(&mut self) -> Result<&mut Gpu, ExecError> {
        if self.gpu.is_none() {
            self.gpu = Some(Gpu::open()?);
        }
        Ok(self.gpu.as_mut().expect("just opened"))
    }

    /// Run the built-in reference on given inputs and return (out, residual-after) bytes.
    pub fn run_reference(
        &mut self,
        op: Op,
        sem: Semantics,
        dt: DType,
        rows: u64,
        cols: u64,
        inp: &CaseInputs,
    ) -> Result<(Vec<u8>, Option<Vec<u8>>), ExecError> {
        let gpu = self.gpu()?;
        let rd = reference_digest();
        gpu.compile(&rd, "reference layers", REFERENCE_SOURCE, &[])?;
        let f = gpu.function(&rd, &[], &reference_symbol(op, sem, dt))?;
        let gpu = &*gpu;
        let bufs = Bufs::upload(gpu, inp)?;
        let out = gpu.alloc((rows * cols) as usize * dt.size_bytes())?;
        let d = reference_dims(op, rows, cols);
        let args = abi_args(op, &out, bufs.residual.as_ref(), &bufs, rows, cols);
        gpu.launch(
            "reference",
            f,
            d.grid,
            d.block,
            0,
            &args,
            Duration::from_secs(120),
        )?;
        let res = match &bufs.residual {
            Some(r) => Some(gpu.download_vec(r)?),
            None => None,
        };
        Ok((gpu.download_vec(&out)?, res))
    }
}

fn first_index_where(n: usize, f: impl Fn(usize) -> bool + Sync) -> (u64, Option<usize>) {
    use rayon::prelude::*;
    let count = (0..n).into_par_iter().filter(|&i| f(i)).count() as u64;
    let first = if count > 0 {
        (0..n).into_par_iter().find_first(|&i| f(i))
    } else {
        None
    };
    (count, first)
}

impl Executor for CudaExecutor {
    fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
        Ok(self.gpu()?.info.clone())
    }

    fn run_case(
        &mut self,
        bundle: &KernelBundle,
        spec: &CaseSpec,
        limits: &Limits,
        copy_gbps: f64,
    ) -> Result<CaseReport, ExecError> {
        let m = &bundle.manifest;
        let (op, dt, rows, cols) = (spec.op, spec.dtype, spec.rows, spec.cols);
        let sym = m.entries.get(&dt).ok_or_else(|| ExecError::Compile {
            what: m.name.clone(),
            log: format!("no entry for {dt} in kernel.toml [entry]"),
        })?;
        let gpu = self.gpu()?;
        let digest = bundle.digest().to_string();
        // Every dtype's entry is its own module (the author's options plus the dtype macro, as
        // the clients compile it); on the first case all of them and the reference layers
        // compile at once, in parallel. Compile time is traced by `Gpu::compile_all`.
        let rd = reference_digest();
        let mut jobs: Vec<CompileJob> = m
            .entries
            .keys()
            .map(|&d| CompileJob {
                digest: &digest,
                what: format!("{} ({d})", m.name),
                source: &bundle.source,
                options: entry_options(&m.nvrtc_options, d),
            })
            .collect();
        jobs.push(CompileJob {
            digest: &rd,
            what: "reference layers".into(),
            source: REFERENCE_SOURCE,
            options: Vec::new(),
        });
        gpu.compile_all(&jobs)?;
        let cand_f = gpu.function(&digest, &entry_options(&m.nvrtc_options, dt), sym)?;
        let ref_f = gpu.function(&rd, &[], &reference_symbol(op, spec.semantics, dt))?;
        let sum_f = gpu.function(&rd, &[], "kz_keyed_sum_u32")?;
        let sm_count = gpu.info.sm_count;
        let gpu: &Gpu = gpu;
        let limit = limits.launch();

        let cand = Kern {
            name: format!("{} ({sym})", m.name),
            f: cand_f,
            dims: Box::new(move |r, c| m.launch_dims(r, c, sm_count)),
        };
        let refk = Kern {
            name: "reference".into(),
            f: ref_f,
            dims: Box::new(move |r, c| Ok(reference_dims(op, r, c))),
        };
        let launch = |k: &Kern, out: &DevBuf, res: Option<&DevBuf>, b: &Bufs, r: u64| {
            let d = (k.dims)(r, cols).map_err(|e| ExecError::Launch {
                what: format!("launch rule of {}", k.name),
                message: e,
            })?;
            let args = abi_args(op, out, res, b, r, cols);
            gpu.launch(
                &k.name,
                k.f,
                d.grid,
                d.block,
                d.shared_mem_bytes,
                &args,
                limit,
            )
        };

        let mut t_last = std::time::Instant::now();
        let mut phase = |name: &str| {
            let now = std::time::Instant::now();
            let dt = (now - t_last).as_secs_f64();
            crate::trace(|| format!("{} {name}: {dt:.3} s", spec.id));
            t_last = now;
        };
        let inp = cases::generate(spec);
        phase("generate");
        let bufs = Bufs::upload(gpu, &inp)?;
        // Whether a device buffer still holds `host`'s bytes, decided on the GPU: a keyed sum of
        // its words (kz_keyed_sum_u32) against the same sum of the host copy, the key drawn
        // afresh for every check, after the candidate's launches, so a kernel cannot forge it.
        // The last word may reach up to 3 bytes into the guard after the payload (padded with
        // the guard byte on the host; a kernel that wrote there is reported by the guard check).
        // Only a buffer that differs is downloaded, for the detailed host-side comparison.
        let sum_buf = gpu.alloc(8)?;
        let holds = |dev: &DevBuf, host: &[u8]| -> Result<bool, ExecError> {
            assert_eq!(dev.bytes, host.len());
            let key = RandomState::new().hash_one(dev.ptr());
            gpu.fill(&sum_buf, 0)?;
            let words = dev.bytes.div_ceil(4) as u64;
            let blocks = words.div_ceil(256).clamp(1, 8 * sm_count as u64) as u32;
            gpu.launch(
                "keyed sum on the GPU",
                sum_f,
                [blocks, 1, 1],
                [256, 1, 1],
                0,
                &[
                    Arg::Ptr(dev.ptr()),
                    Arg::I64(words as i64),
                    Arg::U64(key),
                    Arg::Ptr(sum_buf.ptr()),
                ],
                Duration::from_secs(60),
            )?;
            let mut c = [0u8; 8];
            gpu.download(&sum_buf, &mut c)?;
            Ok(u64::from_le_bytes(c) == keyed_sum(host, key, GUARD_BYTE))
        };
        let out_bytes = (rows * cols) as usize * dt.size_bytes();
        let is_fused = op == Op::FusedAddRmsNorm;
        let res_bytes = if is_fused { out_bytes } else { 0 };

        // Reference.
        let ref_out = gpu.alloc(out_bytes)?;
        let ref_res = if is_fused {
            Some(gpu.alloc(res_bytes)?)
        } else {
            None
        };
        if let (Some(rr), Some(pr)) = (&ref_res, &bufs.residual) {
            gpu.copy(rr, pr)?;
        }
        launch(&refk, &ref_out, ref_res.as_ref(), &bufs, rows)?;
        let ref_host = gpu.download_vec(&ref_out)?;
        let ref_res_host = ref_res.as_ref().map(|r| gpu.download_vec(r)).transpose()?;
        drop(ref_out);
        drop(ref_res);
        phase("upload+reference");

        // Candidate: three launches, output poisoned with a different pattern each time.
        let out = gpu.alloc(out_bytes)?;
        let res = if is_fused {
            Some(gpu.alloc(res_bytes)?)
        } else {
            None
        };
        // Launch 1's outputs are downloaded. A later launch whose outputs still hold launch 1's
        // bits (`holds`, on the GPU) shares that host copy; only one that differs is
        // downloaded. Same bits after the 0xFF and 0xFE poisons also mean every element was
        // written.
        let mut outs: Vec<Arc<Vec<u8>>> = Vec::new();
        let mut ress: Vec<Arc<Vec<u8>>> = Vec::new();
        for (k, &p) in POISON.iter().enumerate() {
            gpu.fill(&out, p)?;
            if let (Some(r), Some(pr)) = (&res, &bufs.residual) {
                gpu.copy(r, pr)?;
            }
            launch(&cand, &out, res.as_ref(), &bufs, rows)?;
            let pairs =
                std::iter::once((&out, &mut outs)).chain(res.as_ref().map(|r| (r, &mut ress)));
            for (now, host) in pairs {
                let copy = if k > 0 && holds(now, &host[0])? {
                    Arc::clone(&host[0])
                } else {
                    Arc::new(gpu.download_vec(now)?)
                };
                host.push(copy);
            }
        }

        phase("3 candidate launches+downloads");
        let mut integrity = Vec::new();
        let mut notes = Vec::new();
        let es = dt.size_bytes();
        // Every output element written.
        let (unwritten, first) = first_index_where(rows as usize * cols as usize, |i| {
            let s = i * es..(i + 1) * es;
            outs[0][s.clone()].iter().all(|&b| b == POISON[0])
                && outs[1][s].iter().all(|&b| b == POISON[1])
        });
        if unwritten > 0 {
            let i = first.unwrap_or(0) as u64;
            integrity.push(format!(
                "output: {unwritten} of {} elements never written (first: row {}, col {})",
                rows * cols,
                i / cols,
                i % cols
            ));
        }
        // Guards and inputs.
        let mut guarded: Vec<(&str, &DevBuf)> = vec![("out", &out), ("x", &bufs.x)];
        if let Some(r) = &res {
            guarded.push(("residual", r));
        }
        if let Some(w) = &bufs.weight {
            guarded.push(("weight", w));
        }
        if let Some(b) = &bufs.bias {
            guarded.push(("bias", b));
        }
        for (name, b) in &guarded {
            for g in gpu.check_guards(b)? {
                integrity.push(format!("{name}: {g}"));
            }
        }
        let mut inputs: Vec<(&cases::HostTensor, &DevBuf)> = vec![(&inp.x, &bufs.x)];
        if let (Some(t), Some(b)) = (&inp.weight, &bufs.weight) {
            inputs.push((t, b));
        }
        if let (Some(t), Some(b)) = (&inp.bias, &bufs.bias) {
            inputs.push((t, b));
        }
        if let (Some(t), Some(b)) = (&inp.residual, &bufs.residual) {
            // The pristine residual copy is never passed to the candidate; checked anyway.
            inputs.push((t, b));
        }
        for (t, b) in inputs {
            if holds(b, &t.bytes)? {
                continue;
            }
            let now = gpu.download_vec(b)?;
            if now != t.bytes {
                let changed = count_bit_differences(dt, &now, &t.bytes);
                integrity.push(format!(
                    "input {} was modified by the kernel ({changed} element(s) changed)",
                    t.name
                ));
            }
        }

        phase("integrity");
        // Determinism.
        let mut differ = 0;
        for k in 1..outs.len() {
            differ = differ.max(count_bit_differences(dt, &outs[0], &outs[k]));
            if is_fused {
                differ = differ.max(count_bit_differences(dt, &ress[0], &ress[k]));
            }
        }
        let deterministic = differ == 0;
        if !deterministic {
            notes.push(format!(
                "repeated launches on the same input differ in up to {differ} element(s)"
            ));
        }

        // Exactness: worst launch against the reference.
        let exact_of = |k: usize| {
            let mut pairs: Vec<(&[u8], &[u8])> = vec![(&outs[k], &ref_host)];
            if let (Some(r), Some(rr)) = (ress.get(k), &ref_res_host) {
                pairs.push((r, rr));
            }
            compare(dt, &pairs)
        };
        let mut exactness = exact_of(0);
        if !deterministic {
            for k in 1..outs.len() {
                exactness = worst(exactness, exact_of(k));
            }
        }
        phase("exactness");
        let accuracy = oracle::accuracy(spec, &inp, &outs[0], &ref_host);
        phase("oracle");

        // Batch invariance: sampled rows alone and at several positions in other batches.
        let batch_invariant = if spec.check_batch {
            let row_len = if op == Op::SiluAndMul { 2 * cols } else { cols } as usize;
            let mut samples = vec![0, rows / 2, rows - 1];
            samples.dedup();
            let mut ok = true;
            'outer: for &r in &samples {
                for (bsize, positions) in [(1u64, vec![0u64]), (5, vec![0, 4]), (67, vec![33, 66])]
                {
                    for &pos in &positions {
                        let pick = |j: u64| if j == pos { r } else { (r + 1 + j) % rows };
                        let take = |t: &cases::HostTensor, len: usize| {
                            let mut v = Vec::with_capacity(bsize as usize * len * es);
                            for j in 0..bsize {
                                let s = pick(j) as usize * len * es;
                                v.extend_from_slice(&t.bytes[s..s + len * es]);
                            }
                            cases::HostTensor {
                                name: t.name,
                                dtype: dt,
                                bytes: v,
                            }
                        };
                        let sub = CaseInputs {
                            x: take(&inp.x, row_len),
                            residual: inp.residual.as_ref().map(|t| take(t, cols as usize)),
                            weight: inp.weight.clone(),
                            bias: inp.bias.clone(),
                        };
                        let sb = Bufs::upload(gpu, &sub)?;
                        let so = gpu.alloc(bsize as usize * cols as usize * es)?;
                        gpu.fill(&so, POISON[0])?;
                        launch(&cand, &so, sb.residual.as_ref(), &sb, bsize)?;
                        let got = gpu.download_vec(&so)?;
                        let rb = cols as usize * es;
                        let want = &outs[0][r as usize * rb..(r as usize + 1) * rb];
                        let here = &got[pos as usize * rb..(pos as usize + 1) * rb];
                        if count_bit_differences(dt, here, want) > 0 {
                            notes.push(format!(
                                "row {r} differs when computed at position {pos} of a batch of {bsize} rows"
                            ));
                            ok = false;
                            break 'outer;
                        }
                    }
                }
            }
            Some(ok)
        } else {
            None
        };

        phase("batch invariance");
        // Speed.
        let speed = if spec.measure_speed {
            let reps = limits.speed_reps.max(3) as usize;
            let time = |k: &Kern, o: &DevBuf| -> Result<f64, ExecError> {
                let d = (k.dims)(rows, cols).map_err(|e| ExecError::Launch {
                    what: k.name.clone(),
                    message: e,
                })?;
                let args = abi_args(op, o, res.as_ref(), &bufs, rows, cols);
                gpu.time_launches(
                    &k.name,
                    k.f,
                    d.grid,
                    d.block,
                    d.shared_mem_bytes,
                    &args,
                    reps,
                    limit,
                )
            };
            let median_us = time(&cand, &out)?;
            let reference_median_us = time(&refk, &out)?;
            let bytes = bytes_moved(op, dt, rows, cols);
            let gbps = bytes as f64 / (median_us * 1e-6) / 1e9;
            Some(Speed {
                median_us,
                reference_median_us,
                bytes_moved: bytes,
                gbps,
                copy_fraction: if copy_gbps > 0.0 {
                    gbps / copy_gbps
                } else {
                    0.0
                },
                speedup: reference_median_us / median_us,
            })
        } else {
            None
        };

        phase("speed");
        Ok(CaseReport {
            id: spec.id.clone(),
            dtype: dt,
            rows,
            cols,
            distribution: spec.dist.to_string(),
            status: CaseStatus::Ran,
            note: (!notes.is_empty()).then(|| notes.join("; ")),
            exactness: Some(exactness),
            accuracy: Some(accuracy),
            deterministic: Some(deterministic),
            batch_invariant,
            integrity_failures: integrity,
            speed,
        })
    }
}
