//! The in-process CUDA executor (`CudaExecutor`): the reference layers, the kernel ABI, and
//! the `Executor` whose cases `crate::measure` runs. Untrusted kernels run it inside the sandbox
//! process (`crate::sandbox`).

use crate::cases::{self, CaseInputs, CaseSpec};
use crate::cuda::{Arg, CompileJob, DevBuf, Gpu};
use crate::exec::{ExecError, Executor, Limits};
use kernel_registry::manifest::{entry_options, LaunchDims};
use kernel_registry::report::{CaseReport, CompiledModule, DeviceInfo};
use kernel_registry::{DType, KernelBundle, Op, Semantics};
use std::time::Duration;

/// The reference layers' CUDA source (docs/reference-semantics.md).
pub const REFERENCE_SOURCE: &str = include_str!("reference.cu");

/// The reference entry for (op, semantics, dtype).
pub fn reference_symbol(op: Op, sem: Semantics, dt: DType) -> String {
    format!("ref_{op}_{sem}_{dt}")
}

pub(crate) fn reference_digest() -> String {
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

/// Device copies of a case's inputs (`residual` is the pristine copy; launches get their own).
pub(crate) struct Bufs {
    pub x: DevBuf,
    pub residual: Option<DevBuf>,
    pub weight: Option<DevBuf>,
    pub bias: Option<DevBuf>,
}

impl Bufs {
    pub fn upload(gpu: &Gpu, inp: &CaseInputs) -> Result<Bufs, ExecError> {
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

/// Device addresses of one launch's tensors (`x` and `residual` may be slices of larger buffers).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ptrs {
    pub out: u64,
    pub residual: Option<u64>,
    pub x: u64,
}

/// Kernel arguments in the ABI order of SPEC section 2: `rows` rows of `x`, the parameters from
/// `b`, the case's `eps`.
pub(crate) fn abi_args(spec: &CaseSpec, t: Ptrs, b: &Bufs, rows: u64) -> Vec<Arg> {
    let cols = spec.cols;
    let (r, c) = (Arg::I64(rows as i64), Arg::I64(cols as i64));
    let eps = Arg::F32(spec.eps);
    let (out, x) = (Arg::Ptr(t.out), Arg::Ptr(t.x));
    let w = || Arg::Ptr(b.weight.as_ref().expect("norms have a weight").ptr());
    match spec.op {
        Op::RmsNorm => vec![out, x, w(), r, c, eps],
        Op::FusedAddRmsNorm => vec![
            out,
            Arg::Ptr(t.residual.expect("fused_add has a residual")),
            x,
            w(),
            r,
            c,
            eps,
        ],
        Op::LayerNorm => vec![
            out,
            x,
            w(),
            Arg::Ptr(b.bias.as_ref().expect("layer_norm has a bias").ptr()),
            r,
            c,
            eps,
        ],
        Op::Silu | Op::Gelu | Op::GeluTanh => vec![out, x, Arg::I64((rows * cols) as i64)],
        Op::SiluAndMul => vec![out, x, r, c],
    }
}

/// One module per dtype entry of the bundle: the author's options plus the dtype macro, named as
/// the clients name it (`cuda::module_what`).
pub(crate) fn entry_jobs<'a>(bundle: &'a KernelBundle, digest: &'a str) -> Vec<CompileJob<'a>> {
    let m = &bundle.manifest;
    m.entries
        .keys()
        .map(|&d| CompileJob {
            digest,
            what: crate::cuda::module_what(&m.name, d),
            source: &bundle.source,
            options: entry_options(&m.nvrtc_options, d),
        })
        .collect()
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
        let spec = CaseSpec {
            id: "reference".into(),
            op,
            semantics: sem,
            dtype: dt,
            rows,
            cols,
            dist: cases::Dist::Normal,
            seed: 0,
            measure_speed: false,
            check_batch: false,
            eps: cases::default_eps(op),
            large_index: false,
        };
        let ptrs = Ptrs {
            out: out.ptr(),
            residual: bufs.residual.as_ref().map(DevBuf::ptr),
            x: bufs.x.ptr(),
        };
        let args = abi_args(&spec, ptrs, &bufs, rows);
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
        crate::measure::run_case(self.gpu()?, bundle, spec, limits, copy_gbps)
    }

    fn compiled(&mut self, bundle: &KernelBundle) -> Result<Vec<CompiledModule>, ExecError> {
        let m = &bundle.manifest;
        let digest = bundle.digest().to_string();
        let gpu = self.gpu()?;
        gpu.compile_all(&entry_jobs(bundle, &digest))?;
        Ok(m.entries
            .iter()
            .filter_map(|(&dtype, symbol)| {
                let r = gpu.module_record(&digest, &entry_options(&m.nvrtc_options, dtype))?;
                Some(CompiledModule {
                    dtype,
                    symbol: symbol.clone(),
                    options: r.options.clone(),
                    nvrtc_version: r.nvrtc_version.clone(),
                    code_kind: r.code_kind.to_string(),
                    code_sha256: r.code_sha256.clone(),
                })
            })
            .collect())
    }
}
