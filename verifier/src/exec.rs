//! The execution boundary: everything that needs a GPU sits behind `Executor`, so the suite,
//! the metrics, the report and the policy checks build and are tested without one.

use crate::cases::CaseSpec;
use kernel_registry::capability::ModuleAudit;
use kernel_registry::report::{CaseReport, CompiledModule, DeviceInfo, PythonRuntime};
use kernel_registry::{DType, KernelBundle};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What went wrong while running a kernel, said so a kernel author can act on it.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum ExecError {
    #[error("no usable CUDA GPU: {0}")]
    Unavailable(String),
    #[error("NVRTC could not compile {what}:\n{log}")]
    Compile { what: String, log: String },
    #[error("{what}: did not finish within {limit_s} s")]
    Timeout { what: String, limit_s: f64 },
    /// An error raised by a launch; the CUDA context is unusable afterwards (sticky errors).
    #[error("{what}: {message}")]
    Launch { what: String, message: String },
    #[error("CUDA error during {what}: {message}")]
    Driver { what: String, message: String },
    /// The isolated process running the kernel died or misbehaved.
    #[error("sandbox: {0}")]
    Sandbox(String),
    /// A Python candidate raised, or returned something that is not the op's output (wrong
    /// type, shape, dtype or device). Its process stays usable.
    #[error("{what}: {message}")]
    Candidate { what: String, message: String },
}

impl ExecError {
    /// Whether the process's CUDA context can still be used after this error.
    pub fn context_broken(&self) -> bool {
        matches!(
            self,
            ExecError::Timeout { .. }
                | ExecError::Launch { .. }
                | ExecError::Driver { .. }
                | ExecError::Sandbox(_)
        )
    }
}

/// Limits for one case.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// A single launch of the candidate must finish within this.
    pub launch_s: f64,
    /// Launches per speed measurement (the median is reported).
    pub speed_reps: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            launch_s: 5.0,
            speed_reps: 25,
        }
    }
}

impl Limits {
    pub fn launch(&self) -> Duration {
        Duration::from_secs_f64(self.launch_s)
    }
}

/// Runs applicable cases of a kernel on a device.
pub trait Executor {
    /// The device, with its copy bandwidth measured in the executing process.
    fn device_info(&mut self) -> Result<DeviceInfo, ExecError>;
    /// Run one case (inside the kernel's constraints) and measure it. `Err` means the case
    /// could not be measured (compile error, timeout, CUDA error); the verifier records it.
    fn run_case(
        &mut self,
        bundle: &KernelBundle,
        spec: &CaseSpec,
        limits: &Limits,
        copy_gbps: f64,
    ) -> Result<CaseReport, ExecError>;
    /// `spec` is the case that will run after the one about to run: its inputs may be drawn
    /// meanwhile (`ahead::prefetch`, in the process that runs it). A hint: without it every
    /// case runs the same.
    fn prefetch(&mut self, _spec: &CaseSpec) {}
    /// `specs`, a verification's largest cases, will run later: their inputs and truths may be
    /// drawn from now on (`ahead::prefetch_early`, in the process that runs them). A hint, as
    /// [`Executor::prefetch`].
    fn prefetch_early(&mut self, _specs: &[CaseSpec]) {}
    /// Of `dtypes` (those with cases left to run, in the suite's order), the first whose
    /// compiled code is ready, waiting until one is: a verification runs the cases of the dtype
    /// that compiled first while the others still compile (issue 29). `None`: this executor
    /// cannot tell, and the suite's order is kept.
    fn first_ready(
        &mut self,
        _bundle: &KernelBundle,
        _dtypes: &[DType],
    ) -> Result<Option<DType>, ExecError> {
        Ok(None)
    }
    /// What each dtype's entry was compiled into (options and the code's hash), compiling it
    /// if needed. Executors that compile nothing have nothing to say.
    fn compiled(&mut self, _bundle: &KernelBundle) -> Result<Vec<CompiledModule>, ExecError> {
        Ok(Vec::new())
    }
    /// Per dtype, the capability audit of the PTX its entry's module was compiled from
    /// (docs/spec.md section 3b), compiling it if needed. Executors that compile nothing have
    /// nothing to say (the report then says the code was not audited).
    fn audits(&mut self, _bundle: &KernelBundle) -> Result<Vec<ModuleAudit>, ExecError> {
        Ok(Vec::new())
    }
    /// The interpreter and packages a Python candidate ran with (docs/spec.md section 2b); `None` for CUDA.
    fn python_runtime(&mut self) -> Option<PythonRuntime> {
        None
    }
}
