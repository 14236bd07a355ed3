//! The GPU verifier: runs a candidate kernel on CUDA against the built-in reference layers and
//! an f64 oracle, in an isolated process, and records what it measured as a
//! `VerificationReport` (SPEC section 3).
//!
//! Layout: `cases` (the suite and its inputs), `numeric` (ulp, rounding, exactness),
//! `oracle` (f64 truth), `exec` (the `Executor` trait: the GPU boundary), `cuda` + `gpu` (the
//! CUDA executor and reference layers), `sandbox` (the child process), `verify` (a whole run),
//! `conformance` (built-in references against PyTorch eager outputs).

pub mod cases;
pub mod conformance;
pub mod cuda;
pub mod exec;
pub mod gpu;
pub mod numeric;
pub mod oracle;
pub mod sandbox;
pub mod verify;

pub use exec::{ExecError, Executor, Limits};
pub use kernel_registry::report::DeviceInfo;
pub use verify::{verify_bundle, verify_with, Progress, VerifyError, VerifyOptions};

/// Re-exported for the CLI's progress bar.
pub use indicatif;

/// Whether a CUDA driver with at least one device is present (never panics).
pub fn gpu_available() -> bool {
    cuda::gpu_available()
}

/// The GPU of this machine: name, arch, SM count, driver and CUDA versions, and the
/// device-to-device copy bandwidth measured now (in this process).
pub fn device_info() -> Result<DeviceInfo, ExecError> {
    Ok(cuda::Gpu::open()?.info)
}

/// NVRTC's version where it loads.
pub fn nvrtc_version() -> String {
    cuda::Gpu::nvrtc_version()
}
