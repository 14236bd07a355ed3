//! What the verifier's Python-runner test files share (each `tests/*.rs` is a crate of its own:
//! `mod common;`).

use std::path::PathBuf;

/// The Python the tests run candidates with (`KERNELIZE_PYTHON`, else `python3`), or None,
/// saying so loudly, where it cannot import torch; `KERNELIZE_REQUIRE_PYTHON=1` (CI) makes that a
/// failure. `what` names the tests in the message.
pub fn python(what: &str) -> Option<PathBuf> {
    let py = PathBuf::from(std::env::var_os("KERNELIZE_PYTHON").unwrap_or("python3".into()));
    let ok = std::process::Command::new(&py)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var_os("KERNELIZE_REQUIRE_PYTHON").is_some_and(|v| v == "1") {
        panic!(
            "{} cannot import torch and KERNELIZE_REQUIRE_PYTHON=1: set KERNELIZE_PYTHON to a Python with torch (scripts/test uses python/.venv)",
            py.display()
        );
    }
    if !ok {
        eprintln!(
            "SKIPPED: {} cannot import torch; set KERNELIZE_PYTHON to a Python with torch to run {what}",
            py.display()
        );
    }
    ok.then_some(py)
}

/// The device the host stand-ins for the reference layers report: "CPU (test)", sm_90, with
/// `sm_count` SMs of `threads_per_sm` threads (what a backward verdict is keyed on).
pub fn test_device(
    sm_count: u32,
    threads_per_sm: Option<u32>,
) -> kernel_registry::report::DeviceInfo {
    kernel_registry::report::DeviceInfo {
        name: "CPU (test)".into(),
        arch: kernel_registry::Arch::new(9, 0),
        sm_count,
        driver_version: "0".into(),
        cuda_version: "0".into(),
        copy_gbps: 1e6,
        threads_per_sm,
    }
}
