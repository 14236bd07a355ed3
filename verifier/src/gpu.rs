//! The in-process CUDA executor (`CudaExecutor`): the `Executor` whose cases `crate::measure`
//! runs, over the kernel ABI of `crate::abi`. Untrusted kernels run it inside the sandbox
//! process (`crate::sandbox`).

use crate::cases::{self, CaseInputs, CaseSpec};
use crate::cuda::Gpu;
use crate::exec::{ExecError, Executor, Limits};
use kernel_registry::capability::ModuleAudit;
use kernel_registry::manifest::entry_options;
use kernel_registry::report::{CaseReport, CompiledModule, DeviceInfo};
use kernel_registry::{DType, KernelBundle, Op, Semantics};
use std::time::Duration;

use crate::abi::{abi_args, entry_jobs, reference_digest, Bufs};
pub use crate::abi::{reference_dims, reference_symbol, REFERENCE_SOURCE};

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
        let args = abi_args(&spec, bufs.ptrs(&out, bufs.residual.as_ref()), rows);
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

impl CudaExecutor {
    /// The reference layer on `spec`'s own inputs (its seed, eps and shape), for a candidate
    /// measured in another process (a Python candidate, `crate::python`): its output and updated
    /// residual, and with `reps > 0` its median time with the L2 flushed (as the CUDA case runner
    /// times it).
    pub fn reference_case(
        &mut self,
        spec: &CaseSpec,
        reps: u32,
    ) -> Result<ReferenceOutputs, ExecError> {
        let (op, dt) = (spec.op, spec.dtype);
        let gpu = self.gpu()?;
        // The op's reference entries alone (`crate::ref_module`), as a CUDA case compiles them.
        let (rd, rsrc) = crate::ref_module::module(op, spec.semantics, dt);
        gpu.compile(rd, "reference layers", rsrc, &[])?;
        let f = gpu.function(rd, &[], &reference_symbol(op, spec.semantics, dt))?;
        let gpu = &*gpu;
        let inp = cases::generate(spec);
        let bufs = Bufs::upload(gpu, &inp)?;
        let out = gpu.alloc((spec.rows * spec.cols) as usize * dt.size_bytes())?;
        let d = reference_dims(op, spec.rows, spec.cols);
        let args = abi_args(spec, bufs.ptrs(&out, bufs.residual.as_ref()), spec.rows);
        let pristine_res = bufs
            .residual
            .as_ref()
            .map(|r| gpu.download_vec(r))
            .transpose()?;
        let limit = Duration::from_secs(120);
        gpu.launch("reference", f, d.grid, d.block, 0, &args, limit)?;
        let res = bufs
            .residual
            .as_ref()
            .map(|r| gpu.download_vec(r))
            .transpose()?;
        let out_host = gpu.download_vec(&out)?;
        let median_us = if reps > 0 {
            let mut prepare = || -> Result<(), ExecError> {
                if let (Some(r), Some(p)) = (&bufs.residual, &pristine_res) {
                    gpu.upload(r, p)?;
                }
                Ok(())
            };
            Some(gpu.time_launches(
                "reference",
                f,
                d.grid,
                d.block,
                0,
                &args,
                crate::cuda::Reps::reference(reps as usize),
                limit,
                &mut prepare,
                &mut |_| Ok(()),
            )?)
        } else {
            None
        };
        Ok(ReferenceOutputs {
            out: out_host,
            residual: res,
            median_us,
        })
    }

    /// The reference layers of a backward case on `spec`'s own inputs, for a candidate measured
    /// in another process (a Python candidate): every gradient, the median time of the whole
    /// sequence with `reps > 0`, and this device's SMs and threads per SM
    /// (`measure::backward::reference_case`).
    pub fn reference_backward_case(
        &mut self,
        spec: &CaseSpec,
        reps: u32,
    ) -> Result<BackwardReferenceOutputs, ExecError> {
        crate::measure::backward::reference_case(self.gpu()?, spec, reps)
    }
}

/// The reference layer's outputs for one case (and its time, when asked).
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceOutputs {
    pub out: Vec<u8>,
    pub residual: Option<Vec<u8>>,
    pub median_us: Option<f64>,
}

/// A backward case's reference gradients (reference.cu's entries of its op in stage order, on
/// the case's own inputs), its time when asked, and the figures of the device they ran on.
#[derive(Debug, Clone, PartialEq)]
pub struct BackwardReferenceOutputs {
    /// One per gradient, in [`Op::gradients`] order (`dx` `rows x cols`, `dw` `cols`).
    pub grads: Vec<Vec<u8>>,
    /// The whole sequence's median time (L2 flushed) when `reps > 0`.
    pub median_us: Option<f64>,
    /// The device's SMs and threads per SM: rms_norm_backward's reference `dw` (eager's column
    /// sums) depends on both (`Op::verdict_depends_on_device`).
    pub sms: u64,
    pub threads_per_sm: u64,
}

/// The reference layers in this process, for a Python candidate measured without the sandbox
/// (tests; the verifier's own runs take them from the sandbox, `crate::sandbox`). `dir` is not
/// used: nothing crosses a process.
impl crate::python::ReferenceLayers for CudaExecutor {
    fn device_info(&mut self) -> Result<DeviceInfo, ExecError> {
        Ok(self.gpu()?.info.clone())
    }

    fn reference(
        &mut self,
        spec: &CaseSpec,
        _inputs: &CaseInputs,
        reps: u32,
        _dir: &std::path::Path,
    ) -> Result<ReferenceOutputs, ExecError> {
        self.reference_case(spec, reps)
    }

    fn reference_backward(
        &mut self,
        spec: &CaseSpec,
        _inputs: &CaseInputs,
        reps: u32,
        _dir: &std::path::Path,
    ) -> Result<BackwardReferenceOutputs, ExecError> {
        self.reference_backward_case(spec, reps)
    }
}

/// How long `first_ready` waits for any module before keeping the suite's order (well under
/// the sandbox's per-call limit, `SandboxExecutor::case_limit`).
const FIRST_READY_WAIT: Duration = Duration::from_secs(60);

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

    fn prefetch(&mut self, spec: &CaseSpec) {
        crate::ahead::prefetch(spec);
    }

    fn prefetch_early(&mut self, specs: &[CaseSpec]) {
        crate::ahead::prefetch_early(specs);
    }

    /// Starts every module compiling (as the first case would) and polls them: the first of
    /// `dtypes` whose module has finished, in the suite's order among those ready at once.
    /// Gives up after `FIRST_READY_WAIT` (`None`: the suite's order), so that a module that
    /// never finishes is met by the case's own limit, as before.
    fn first_ready(
        &mut self,
        bundle: &KernelBundle,
        dtypes: &[DType],
    ) -> Result<Option<DType>, ExecError> {
        let m = &bundle.manifest;
        if dtypes.len() < 2 {
            return Ok(None);
        }
        let digest = bundle.digest().to_string();
        let gpu = self.gpu()?;
        let (all, _) = crate::measure::compile_jobs(
            bundle,
            &digest,
            |d| crate::measure::reference_module(bundle, d),
            dtypes[0],
        );
        gpu.start_compiles(&all);
        let t0 = std::time::Instant::now();
        loop {
            let ready = dtypes
                .iter()
                .find(|&&dt| gpu.module_ready(&digest, &entry_options(&m.nvrtc_options, dt)));
            if let Some(&dt) = ready {
                return Ok(Some(dt));
            }
            if t0.elapsed() > FIRST_READY_WAIT {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
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

    fn audits(&mut self, bundle: &KernelBundle) -> Result<Vec<ModuleAudit>, ExecError> {
        let m = &bundle.manifest;
        let digest = bundle.digest().to_string();
        let gpu = self.gpu()?;
        gpu.compile_all(&entry_jobs(bundle, &digest))?;
        Ok(m.entries
            .keys()
            .map(|&dtype| {
                let audit = gpu
                    .module_record(&digest, &entry_options(&m.nvrtc_options, dtype))
                    .map_or_else(
                        || Err("the module was not compiled".to_string()),
                        |r| r.audit.clone(),
                    );
                (dtype, audit)
            })
            .collect())
    }
}
