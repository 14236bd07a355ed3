//! The GPU verifier: runs a candidate kernel on CUDA against the built-in reference layers and
//! an f64 oracle, in an isolated process, and records what it measured as a
//! `VerificationReport` (docs/spec.md section 3).
//!
//! Layout: `cases` (the suite and its inputs), `numeric` (ulp, rounding, exactness),
//! `oracle` (f64 truth), `exec` (the `Executor` trait: the GPU boundary), `cuda` + `gpu` (the
//! CUDA executor and reference layers), `sandbox` (the child process), `python` (Python
//! candidates, docs/spec.md section 2b: their own child process and executor), `verify` (a whole run),
//! `conformance` (built-in references against PyTorch eager outputs).

pub mod abi;
pub mod ahead;
pub mod cases;
mod child;
pub mod compile_cache;
pub mod compile_queue;
pub mod conformance;
pub mod cuda;
pub mod exec;
pub mod gpu;
pub mod measure;
pub mod model;
pub mod numeric;
pub mod oracle;
pub mod python;
pub mod ref_module;
pub mod sandbox;
pub mod verify;

pub use exec::{ExecError, Executor, Limits};
pub use kernel_registry::report::DeviceInfo;
pub use verify::{verify_bundle, verify_with, Progress, VerifyError, VerifyOptions};

/// With `KERNELIZE_TRACE` set, print `msg` with the seconds since this process first traced
/// (phase timing of a verification, on stderr; the sandbox child's stderr reaches the parent's).
pub fn trace(msg: impl FnOnce() -> String) {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    if std::env::var_os("KERNELIZE_TRACE").is_some() {
        let t = START.get_or_init(std::time::Instant::now);
        eprintln!(
            "trace [pid {} +{:.3} s] {}",
            std::process::id(),
            t.elapsed().as_secs_f64(),
            msg()
        );
    }
}

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
