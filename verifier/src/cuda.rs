//! The CUDA driver layer (cudarc 0.19, loaded at run time): device queries, NVRTC compilation
//! with a module cache, guarded device buffers, launches with a time limit, event timing.
//! Only the in-process executor (`crate::gpu`) uses this module.

use cudarc::driver::{result, sys, CudaContext, DriverError};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use kernel_registry::capability::{audit_ptx, Audit};
use kernel_registry::report::DeviceInfo;
use kernel_registry::Arch;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::exec::ExecError;

/// How long `Gpu::wait` polls a launch's event without sleeping before it sleeps between polls.
const WAIT_SPIN: Duration = Duration::from_micros(200);

/// Bytes of guard region before and after every device buffer (keeps the ABI's alignment).
pub const GUARD_BYTES: usize = 4096;
const _: () = assert!((GUARD_BYTES as u64).is_multiple_of(kernel_registry::ABI_ALIGN_BYTES));
/// The byte every guard region is filled with: drawn once per process (never 0x00, 0xFF, or
/// 0xA5, the constant of earlier verifiers that a kernel may look for), so a kernel cannot
/// recognise the verifier by the bytes around its buffers.
pub fn guard_byte() -> u8 {
    static BYTE: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *BYTE.get_or_init(|| {
        use rand::Rng;
        let mut rng = rand::thread_rng();
        loop {
            let b = rng.gen_range(1..=0xFE);
            if b != 0xA5 {
                return b;
            }
        }
    })
}

/// Where a payload `residue` bytes past a multiple of `period` (a power of two) starts in an
/// allocation at `base`: the first such address at least `GUARD_BYTES` in, as an offset from
/// `base` (below `GUARD_BYTES + period`).
pub fn placed_lead(base: u64, residue: u64, period: u64) -> usize {
    assert!(period.is_power_of_two() && residue < period);
    let first = base + GUARD_BYTES as u64;
    (GUARD_BYTES as u64 + (residue.wrapping_sub(first) & (period - 1))) as usize
}

/// Which side of a payload a guard region lies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardSide {
    Before,
    After,
}

/// The integrity line for a guard region `g` (as read back, the payload's side nearest) that
/// should hold only `guard`: `None` when it does.
pub fn guard_changes(side: GuardSide, g: &[u8], guard: u8) -> Option<String> {
    let changed = g.iter().filter(|&&b| b != guard).count();
    if changed == 0 {
        return None;
    }
    let (name, nearest) = match side {
        GuardSide::Before => (
            "before",
            g.iter().rposition(|&b| b != guard).map(|p| g.len() - p),
        ),
        GuardSide::After => ("after", g.iter().position(|&b| b != guard).map(|p| p + 1)),
    };
    Some(format!(
        "{changed} byte(s) changed {name} the buffer (nearest {} byte(s) {name} it)",
        nearest.unwrap_or(0)
    ))
}

fn describe(e: &DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned());
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned());
    let pretty = match e.0 {
        sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS => "illegal address",
        sys::CUresult::CUDA_ERROR_MISALIGNED_ADDRESS => "misaligned address",
        sys::CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION => "illegal instruction",
        sys::CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => "launch out of resources",
        sys::CUresult::CUDA_ERROR_INVALID_VALUE => "invalid launch configuration",
        _ => "",
    };
    match (name, text) {
        (Ok(n), Ok(t)) if !pretty.is_empty() => format!("{pretty}: {n} ({t})"),
        (Ok(n), Ok(t)) => format!("{n} ({t})"),
        _ => format!("{:?}", e.0),
    }
}

pub(crate) fn drv(what: &str) -> impl Fn(DriverError) -> ExecError + '_ {
    move |e| ExecError::Driver {
        what: what.to_string(),
        message: describe(&e),
    }
}

/// Is a CUDA driver with at least one device present? Never panics.
pub fn gpu_available() -> bool {
    std::panic::catch_unwind(|| {
        // SAFETY: only probes whether the library loads.
        if !unsafe { sys::is_culib_present() } {
            return false;
        }
        result::init().is_ok() && result::device::get_count().map(|n| n > 0).unwrap_or(false)
    })
    .unwrap_or(false)
}

/// Set once a launch failed or timed out: the context is unusable and a kernel may still be
/// running, so buffers are no longer freed (cuMemFree would wait for that kernel forever).
static CONTEXT_BROKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn mark_broken(e: ExecError) -> ExecError {
    CONTEXT_BROKEN.store(true, std::sync::atomic::Ordering::SeqCst);
    e
}

/// A device buffer with guard regions of `GUARD_BYTES` before and after its payload. A
/// placed buffer (`Gpu::alloc_placed`) has room to move its payload to any address residue
/// (`DevBuf::place`); its guard regions are the `GUARD_BYTES` next to the payload wherever it
/// lies.
pub struct DevBuf {
    base: sys::CUdeviceptr,
    pub bytes: usize,
    /// Bytes of the allocation before the payload (`GUARD_BYTES` unless placed).
    lead: usize,
    /// Bytes of the whole allocation.
    total: usize,
}

impl DevBuf {
    /// The payload's device address (what a kernel gets).
    pub fn ptr(&self) -> u64 {
        self.base + self.lead as u64
    }

    /// Move the payload of a placed buffer to the first address at or after `GUARD_BYTES` into
    /// the allocation that is `residue` bytes past a multiple of `period` (a power of two); its
    /// contents and guards are the caller's to fill (the verifier's `kz_place`,
    /// `measure::address::Placing`).
    pub fn place(&mut self, residue: u64, period: u64) {
        let lead = placed_lead(self.base, residue, period);
        assert!(
            lead + self.bytes + GUARD_BYTES + 3 <= self.total,
            "placing {} bytes at {residue} mod {period}: the allocation has no room",
            self.bytes
        );
        self.lead = lead;
    }

    /// The allocation's base address, its size and the payload's offset in it (bytes).
    pub fn layout(&self) -> (u64, usize, usize) {
        (self.base, self.total, self.lead)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if CONTEXT_BROKEN.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if pool::keep(self.base, self.total) {
            return;
        }
        // SAFETY: allocated by `Gpu::alloc`; errors are ignored on drop.
        unsafe {
            let _ = result::free_sync(self.base);
        }
    }
}

/// Device allocations a case freed, kept for the next cases (issue 29's verification time: a
/// case allocates and frees a dozen or more buffers, and `cuMemFree` waits for the device).
/// Only allocations up to [`pool::MAX_ALLOC`] bytes, at most [`pool::MAX_BYTES`] in all. A kept
/// allocation is overwritten with zeros when it is kept (queued on the legacy stream, behind
/// everything that used it): what a case left in it (a reference output, an input) is not
/// there for a later kernel to find, as it would not be in memory given back to the driver.
/// `KERNELIZE_POOL=0` turns it off.
mod pool {
    use super::{result, sys};
    use std::sync::Mutex;

    pub const MAX_ALLOC: usize = 64 << 20;
    pub const MAX_BYTES: usize = 512 << 20;

    /// Free allocations: (base, bytes).
    static FREE: Mutex<Vec<(sys::CUdeviceptr, usize)>> = Mutex::new(Vec::new());

    fn enabled() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| std::env::var_os("KERNELIZE_POOL").is_none_or(|v| v != "0"))
    }

    /// Keep an allocation of `total` bytes at `base` (zeroed, queued) instead of freeing it;
    /// `false` when it is not kept (too large, the pool full, or off).
    pub fn keep(base: sys::CUdeviceptr, total: usize) -> bool {
        if !enabled() || total > MAX_ALLOC {
            return false;
        }
        let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
        if free.iter().map(|f| f.1).sum::<usize>() + total > MAX_BYTES {
            return false;
        }
        // SAFETY: the whole allocation; legacy default stream.
        if unsafe { result::memset_d8_async(base, 0, total, std::ptr::null_mut()) }.is_err() {
            return false;
        }
        free.push((base, total));
        true
    }

    /// A kept allocation of at least `total` bytes (the smallest that fits, at most twice the
    /// size and 4 MiB more), with its size; `None`: allocate afresh.
    pub fn take(total: usize) -> Option<(sys::CUdeviceptr, usize)> {
        if !enabled() {
            return None;
        }
        let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
        let i = free
            .iter()
            .enumerate()
            .filter(|(_, f)| f.1 >= total && f.1 <= 2 * total + (4 << 20))
            .min_by_key(|(_, f)| f.1)?
            .0;
        Some(free.swap_remove(i))
    }
}

/// A device allocation of at least `total` bytes: a kept one ([`pool::take`]) or a fresh one.
/// Returns its base and its size.
fn allocate(total: usize) -> Result<(sys::CUdeviceptr, usize), ExecError> {
    if let Some(kept) = pool::take(total) {
        return Ok(kept);
    }
    // SAFETY: plain allocation; freed (or kept) by DevBuf's Drop.
    let base = unsafe { result::malloc_sync(total) }.map_err(drv("allocating device memory"))?;
    Ok((base, total))
}

/// Transfers of at least this many bytes go through the pinned staging buffer.
const STAGED_FROM: usize = 1 << 20;
/// Size of the pinned staging buffer (one chunk of a staged transfer).
const STAGING_BYTES: usize = 64 << 20;

/// The page-locked staging buffer (owned by one `Gpu`, used under its mutex).
struct Staging(*mut u8);
// SAFETY: the pointer is only dereferenced while the owning Gpu's mutex is held.
unsafe impl Send for Staging {}

enum Staged<'a> {
    Up(&'a [u8]),
    Down(&'a mut [u8]),
}

/// `dst.copy_from_slice(src)` on all cores (a single core copies at a few GB/s).
fn par_copy(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    dst.par_chunks_mut(1 << 20)
        .zip(src.par_chunks(1 << 20))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// One kernel argument, as the ABI tables of docs/spec.md section 2 name them.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    Ptr(u64),
    I64(i64),
    U64(u64),
    F32(f32),
}

struct Module {
    module: sys::CUmodule,
    /// What was loaded: the full NVRTC options, NVRTC's version, `cubin` or `ptx`, SHA-256.
    record: ModuleRecord,
}

/// How a loaded module was made (for the report's `compiled` list), and what its code can do
/// (the capability audit of the PTX the CUBIN was made from, docs/spec.md section 3b).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleRecord {
    pub options: Vec<String>,
    pub nvrtc_version: String,
    pub code_kind: &'static str,
    pub code_sha256: String,
    /// `Err`: why the PTX could not be audited.
    pub audit: Result<Audit, String>,
}

fn record(
    opts: &[String],
    nvrtc_version: &str,
    bytes: &[u8],
    cubin: bool,
    audit: Result<Audit, String>,
) -> ModuleRecord {
    use sha2::{Digest, Sha256};
    ModuleRecord {
        options: opts.to_vec(),
        nvrtc_version: nvrtc_version.to_string(),
        code_kind: if cubin { "cubin" } else { "ptx" },
        code_sha256: hex::encode(Sha256::digest(bytes)),
        audit,
    }
}

/// NVRTC's text output (PTX, without its NUL terminator) as a string.
fn c_text(v: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = v
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Every option NVRTC gets for a module, in order: the real architecture (so NVRTC makes a
/// CUBIN and the driver JITs nothing), the CUDA include path, then the job's own options (the
/// author's, then the dtype macro). Clients must compile with exactly this list.
pub fn nvrtc_options(arch: Arch, include_dir: &str, job_options: &[String]) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture=sm_{}{}", arch.major, arch.minor),
        format!("--include-path={include_dir}"),
    ];
    opts.extend(job_options.iter().cloned());
    opts
}

/// NVRTC's CUBIN of a compiled program, when it made one (a real `sm_XY` target).
///
/// # Safety
/// `prog` must be a live, successfully compiled NVRTC program.
unsafe fn get_cubin(prog: nvrtc_sys::nvrtcProgram) -> Option<Vec<std::ffi::c_char>> {
    let mut size = 0usize;
    if nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS
        || size == 0
    {
        return None;
    }
    let mut v = vec![0 as std::ffi::c_char; size];
    (nvrtc_sys::nvrtcGetCUBIN(prog, v.as_mut_ptr()) == nvrtc_sys::nvrtcResult::NVRTC_SUCCESS)
        .then_some(v)
}

/// A CUBIN or NUL-terminated PTX text from NVRTC.
type Image = Vec<std::ffi::c_char>;

/// One module to compile: `options` are the author's NVRTC options plus any the verifier adds
/// for this module (the dtype macro); they key the module.
#[derive(Clone)]
pub struct CompileJob<'a> {
    pub digest: &'a str,
    pub what: String,
    pub source: &'a str,
    pub options: Vec<String>,
}

/// What NVRTC made of one program: the image to load (a CUBIN, or PTX where NVRTC made no
/// CUBIN), whether it is a CUBIN, and the PTX text of the same program (what the capability
/// audit reads; `Err` when NVRTC gave none).
type Compiled = (Image, bool, Result<String, String>);

/// NVRTC: `source` to a CUBIN for the architecture in `opts` (or PTX where NVRTC made no
/// CUBIN), with the program's PTX; the error carries NVRTC's log. Needs no CUDA context, so it
/// runs on any thread.
fn nvrtc_image(source: &str, what: &str, opts: &[String]) -> Result<Compiled, String> {
    let src = CString::new(source).map_err(|_| "the source contains a NUL byte".to_string())?;
    let name = CString::new(format!("{what}.cu")).unwrap_or_default();
    std::panic::catch_unwind(|| -> Result<Compiled, String> {
        let prog = nvrtc::create_program(&src, Some(&name)).map_err(|e| format!("{e:?}"))?;
        // SAFETY: prog is live until destroyed below.
        unsafe {
            let res = nvrtc::compile_program(prog, opts);
            let log = nvrtc::get_program_log(prog)
                .map(|l| {
                    let bytes: Vec<u8> = l
                        .iter()
                        .take_while(|&&c| c != 0)
                        .map(|&c| c as u8)
                        .collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                })
                .unwrap_or_default();
            // The CUBIN NVRTC made for this real architecture (no driver JIT at load); the PTX
            // where NVRTC made none.
            // The PTX of the same program, for the audit (the CUBIN is compiled from it).
            let out = match res {
                Ok(()) => {
                    let ptx = nvrtc::get_ptx(prog).map_err(|e| format!("{e:?}"));
                    match (get_cubin(prog), ptx) {
                        (Some(c), ptx) => Ok((
                            c,
                            true,
                            ptx.map(|p| c_text(&p))
                                .map_err(|e| format!("nvrtcGetPTX failed: {e}")),
                        )),
                        (None, Ok(p)) => {
                            let text = c_text(&p);
                            Ok((p, false, Ok(text)))
                        }
                        (None, Err(e)) => Err(e),
                    }
                }
                Err(e) => Err(format!("{e:?}\n{log}")),
            };
            let _ = nvrtc::destroy_program(prog);
            out
        }
    })
    .map_err(|_| {
        format!(
            "NVRTC (libnvrtc.so) did not load; include path {}",
            cuda_include_dir()
        )
    })?
}

/// How many timed runs a measurement takes: `most`, or where `budget_ms` is set fewer (never
/// under 3) once the runs so far took that much GPU time. The reference layers are timed so
/// (`REFERENCE_TIMING_MS`): at the largest shapes a run of some takes 10 ms or more, and their
/// time is only the ratio's denominator, while every run of a candidate is checked and counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reps {
    pub most: usize,
    pub budget_ms: Option<f64>,
}

/// The GPU time the reference layers' timed runs of one case may take before they stop (at
/// least 3 runs).
pub const REFERENCE_TIMING_MS: f64 = 50.0;

impl Reps {
    /// `n` runs.
    pub fn all(n: usize) -> Reps {
        Reps {
            most: n,
            budget_ms: None,
        }
    }

    /// Up to `n` runs, fewer (at least 3) past [`REFERENCE_TIMING_MS`] of GPU time.
    pub fn reference(n: usize) -> Reps {
        Reps {
            most: n,
            budget_ms: Some(REFERENCE_TIMING_MS),
        }
    }

    /// Whether the runs stop after `done` of them, which took `spent_ms` in all.
    pub fn enough(&self, done: usize, spent_ms: f64) -> bool {
        done >= self.most || (done >= 3 && self.budget_ms.is_some_and(|b| spent_ms >= b))
    }
}

/// One launch of a timed sequence (`Gpu::time_sequence`).
pub struct Launch<'a> {
    pub what: &'a str,
    pub f: sys::CUfunction,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub smem: u32,
    pub args: &'a [Arg],
}

/// A module's key: (digest, architecture, the job's options).
type ModKey = (String, Arch, Vec<String>);

/// What NVRTC made of one module on its compile thread: the image, whether it is a CUBIN, its
/// PTX and the capability audit of that PTX.
type Made = (Image, bool, Result<String, String>, Result<Audit, String>);

/// A module being compiled: what it is, NVRTC's full options and version, its CUBIN cache entry.
struct Pending {
    what: String,
    opts: Vec<String>,
    nvrtc_version: String,
    cached: Option<std::path::PathBuf>,
}

/// The process's CUDA device: context, caches, scratch for L2 flushes.
pub struct Gpu {
    _ctx: Arc<CudaContext>,
    pub info: DeviceInfo,
    pub l2_bytes: usize,
    modules: HashMap<ModKey, Module>,
    /// Modules whose NVRTC is running on a thread of its own (`Gpu::start_compiles`), loaded
    /// when a case asks for them (`Gpu::compile_all`).
    compiling: crate::compile_queue::Queue<ModKey, Made>,
    pending: HashMap<ModKey, Pending>,
    functions: HashMap<(String, String), sys::CUfunction>,
    flush: Option<DevBuf>,
    /// Page-locked staging for large transfers (pageable copies ran at 0.7-2 GB/s on the H200
    /// machine); allocated on first use, never freed (the process ends with the run).
    staging: std::sync::Mutex<Option<Staging>>,
    start: sys::CUevent,
    stop: sys::CUevent,
}

/// NVRTC's include path: `$CUDA_HOME/include`, `$CUDA_PATH/include`, else /usr/local/cuda.
pub fn cuda_include_dir() -> String {
    let home = std::env::var("CUDA_HOME").ok();
    let path = std::env::var("CUDA_PATH").ok();
    cuda_include_dir_from(home.as_deref(), path.as_deref())
}

/// `cuda_include_dir` from given variables (the Python client's twin is tested on the same
/// fixture).
pub fn cuda_include_dir_from(cuda_home: Option<&str>, cuda_path: Option<&str>) -> String {
    for v in [cuda_home, cuda_path].into_iter().flatten() {
        if !v.is_empty() {
            return format!("{}/include", v.trim_end_matches('/'));
        }
    }
    "/usr/local/cuda/include".to_string()
}

/// The name of a kernel's module for `dt` (NVRTC's program is `"{this}.cu"`; clients use it too).
pub fn module_what(kernel: &str, dt: kernel_registry::DType) -> String {
    format!("{kernel} ({dt})")
}

fn driver_version_string() -> String {
    if let Ok(s) = std::fs::read_to_string("/proc/driver/nvidia/version") {
        // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  ..."
        if let Some(v) = s.split_whitespace().find(|w| {
            w.chars().filter(|&c| c == '.').count() >= 1
                && w.chars().next().is_some_and(|c| c.is_ascii_digit())
        }) {
            return v.to_string();
        }
    }
    if let Ok(o) = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=driver_version", "--format=csv,noheader"])
        .output()
    {
        let s = String::from_utf8_lossy(&o.stdout)
            .trim()
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        if !s.is_empty() {
            return s;
        }
    }
    "unknown".to_string()
}

impl Gpu {
    /// Open device 0. Measures the copy bandwidth (a few hundred ms).
    pub fn open() -> Result<Gpu, ExecError> {
        if !gpu_available() {
            return Err(ExecError::Unavailable(
                "the CUDA driver (libcuda.so.1) did not load or reports no device; run on a machine with an NVIDIA GPU and driver".into(),
            ));
        }
        let t_open = Instant::now();
        let ctx = std::panic::catch_unwind(|| CudaContext::new(0))
            .map_err(|_| ExecError::Unavailable("the CUDA driver library failed to load".into()))?
            .map_err(|e| ExecError::Unavailable(describe(&e)))?;
        let (maj, min) = ctx.compute_capability().map_err(drv("device query"))?;
        let attr = |a| ctx.attribute(a).map_err(drv("device query"));
        let sm_count =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let threads_per_sm =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?
                as u32;
        let l2_bytes = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
        let mut cuda_v = 0i32;
        // SAFETY: plain out-parameter query.
        unsafe { sys::cuDriverGetVersion(&mut cuda_v) }
            .result()
            .map_err(drv("driver version"))?;
        let start =
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(drv("event"))?;
        let stop =
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(drv("event"))?;
        let mut gpu = Gpu {
            info: DeviceInfo {
                name: ctx.name().map_err(drv("device name"))?,
                arch: Arch::new(maj as u32, min as u32),
                sm_count,
                driver_version: driver_version_string(),
                cuda_version: format!("{}.{}", cuda_v / 1000, (cuda_v % 1000) / 10),
                copy_gbps: 0.0,
                threads_per_sm: Some(threads_per_sm),
            },
            _ctx: ctx,
            l2_bytes,
            modules: HashMap::new(),
            compiling: crate::compile_queue::Queue::new(),
            pending: HashMap::new(),
            functions: HashMap::new(),
            flush: None,
            staging: std::sync::Mutex::new(None),
            start,
            stop,
        };
        crate::trace(|| format!("Gpu::open: context {:.3} s", t_open.elapsed().as_secs_f64()));
        let t_copy = Instant::now();
        gpu.flush = Some(gpu.alloc((2 * l2_bytes).max(64 << 20))?);
        gpu.info.copy_gbps = gpu.measure_copy_gbps()?;
        crate::trace(|| {
            format!(
                "Gpu::open: copy bandwidth {:.3} s",
                t_copy.elapsed().as_secs_f64()
            )
        });
        Ok(gpu)
    }

    /// NVRTC's version, e.g. "13.0".
    pub fn nvrtc_version() -> String {
        let (mut a, mut b) = (0, 0);
        std::panic::catch_unwind(move || {
            // SAFETY: out-parameter query.
            unsafe { nvrtc_sys::nvrtcVersion(&mut a, &mut b) };
            format!("{a}.{b}")
        })
        .unwrap_or_else(|_| "unavailable".into())
    }

    /// Compile `source` (cached by digest, arch and options) into a loaded module.
    pub fn compile(
        &mut self,
        digest: &str,
        what: &str,
        source: &str,
        extra_options: &[String],
    ) -> Result<(), ExecError> {
        self.compile_all(&[CompileJob {
            digest,
            what: what.to_string(),
            source,
            options: extra_options.to_vec(),
        }])
    }

    /// Start compiling the modules of `jobs` that are neither loaded nor compiling: a module in
    /// the CUBIN cache is loaded at once; every other one gets NVRTC on a thread of its own
    /// (NVRTC is thread-safe for distinct programs; each compile is single threaded) and is
    /// loaded when `compile_all` asks for it. Nothing waits here.
    pub fn start_compiles(&mut self, jobs: &[CompileJob<'_>]) {
        let arch = self.info.arch;
        // Asked of NVRTC only when a module is not loaded yet (not on every case).
        let mut nvrtc_version = None;
        for job in jobs {
            let key = (job.digest.to_string(), arch, job.options.clone());
            if self.modules.contains_key(&key) || self.compiling.contains(&key) {
                continue;
            }
            let opts = nvrtc_options(arch, &cuda_include_dir(), &job.options);
            let nv = nvrtc_version.get_or_insert_with(Self::nvrtc_version);
            let cached = crate::compile_cache::path(job.source, &opts, nv);
            // A cached CUBIN counts only with the PTX it was made from (the audit reads it).
            let hit = cached.as_deref().and_then(|p| {
                let image = crate::compile_cache::load(p)?;
                let ptx = crate::compile_cache::load(&crate::compile_cache::ptx_path(p))?;
                Some((image, String::from_utf8_lossy(&ptx).into_owned()))
            });
            if let Some((image, ptx)) = hit {
                // SAFETY: a CUBIN that NVRTC made for this source, options, arch and NVRTC.
                if let Ok(module) =
                    unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
                {
                    crate::trace(|| format!("compile {}: CUBIN from the compile cache", job.what));
                    let record = record(&opts, nv, &image, true, Ok(audit_ptx(&ptx)));
                    self.modules.insert(key, Module { module, record });
                    continue;
                }
            }
            let (source, what, thread_opts) =
                (job.source.to_string(), job.what.clone(), opts.clone());
            self.compiling.start(key.clone(), move || {
                nvrtc_image(&source, &what, &thread_opts).map(|(img, cubin, ptx)| {
                    // Audited on the compile thread, beside NVRTC.
                    let audit = ptx.as_deref().map(audit_ptx).map_err(Clone::clone);
                    (img, cubin, ptx, audit)
                })
            });
            self.pending.insert(
                key,
                Pending {
                    what: job.what.clone(),
                    opts,
                    nvrtc_version: nv.clone(),
                    cached,
                },
            );
        }
    }

    /// Compile and load the modules of `jobs`: those not started yet start now
    /// (`start_compiles`), then this waits for each of `jobs` alone, not for other modules still
    /// compiling, and loads it on this thread. The first compile error is returned, after every
    /// module of `jobs` has finished.
    pub fn compile_all(&mut self, jobs: &[CompileJob<'_>]) -> Result<(), ExecError> {
        self.start_compiles(jobs);
        let mut first_err = None;
        for job in jobs {
            let key = (job.digest.to_string(), self.info.arch, job.options.clone());
            if let Err(e) = self.finish_compile(&key) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Wait for the module of `key` (when it is compiling) and load it.
    fn finish_compile(&mut self, key: &ModKey) -> Result<(), ExecError> {
        if self.modules.contains_key(key) {
            return Ok(());
        }
        let (Some(p), Some(done)) = (self.pending.remove(key), self.compiling.take(key)) else {
            return Err(ExecError::Driver {
                what: format!("loading the module of {}", key.0),
                message: "the module was never compiled".into(),
            });
        };
        let cerr = |log: String| ExecError::Compile {
            what: p.what.clone(),
            log,
        };
        let (image, is_cubin, ptx, audit) = done.result.map_err(cerr)?;
        let t_load = Instant::now();
        // SAFETY: `image` is a CUBIN or NUL-terminated PTX text produced by NVRTC.
        let module = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            .map_err(|e| {
                cerr(format!(
                    "the driver could not load the compiled module: {}",
                    describe(&e)
                ))
            })?;
        crate::trace(|| {
            format!(
                "compile {}: NVRTC {:.3} s, ready {:.3} s after it started, waited {:.3} s ({} other module(s) still compiling), {} {} KiB, driver load {:.3} s",
                p.what,
                done.work_s,
                done.since_start_s,
                done.waited_s,
                self.compiling.len(),
                if is_cubin { "CUBIN" } else { "PTX (JIT)" },
                image.len() / 1024,
                t_load.elapsed().as_secs_f64()
            )
        });
        // SAFETY: c_char and u8 have the same size and layout.
        let bytes = unsafe { std::slice::from_raw_parts(image.as_ptr() as *const u8, image.len()) };
        if let (true, Some(c), Ok(ptx)) = (is_cubin, &p.cached, &ptx) {
            // The PTX first: a CUBIN is used from the cache only beside its PTX.
            crate::compile_cache::store(&crate::compile_cache::ptx_path(c), ptx.as_bytes());
            crate::compile_cache::store(c, bytes);
        }
        let record = record(&p.opts, &p.nvrtc_version, bytes, is_cubin, audit);
        self.modules.insert(key.clone(), Module { module, record });
        Ok(())
    }

    /// Whether the module of `digest` with `options` (the job's options) is loaded or its
    /// compile has finished (well or not), so that asking for it does not wait.
    pub fn module_ready(&self, digest: &str, options: &[String]) -> bool {
        let key = (digest.to_string(), self.info.arch, options.to_vec());
        self.modules.contains_key(&key) || self.compiling.is_finished(&key)
    }

    /// How the module of `digest` with `options` (the job's options) was made, once loaded.
    pub fn module_record(&self, digest: &str, options: &[String]) -> Option<&ModuleRecord> {
        self.modules
            .get(&(digest.to_string(), self.info.arch, options.to_vec()))
            .map(|m| &m.record)
    }

    /// Look up `symbol` in the module compiled for `digest` with `options`.
    pub fn function(
        &mut self,
        digest: &str,
        options: &[String],
        symbol: &str,
    ) -> Result<sys::CUfunction, ExecError> {
        let fkey = (
            format!("{digest}|{}", options.join(" ")),
            symbol.to_string(),
        );
        if let Some(f) = self.functions.get(&fkey) {
            return Ok(*f);
        }
        let key = (digest.to_string(), self.info.arch, options.to_vec());
        let m = self.modules.get(&key).ok_or_else(|| ExecError::Driver {
            what: format!("looking up {symbol}"),
            message: "module not compiled".into(),
        })?;
        let cname = CString::new(symbol).unwrap_or_default();
        // SAFETY: module is loaded and alive for the process.
        let f = unsafe { result::module::get_function(m.module, cname) }.map_err(|e| {
            ExecError::Compile {
                what: symbol.to_string(),
                log: format!(
                    "entry `{symbol}` is not in the compiled module ({}); declare it `extern \"C\" __global__`",
                    describe(&e)
                ),
            }
        })?;
        self.functions.insert(fkey, f);
        Ok(f)
    }

    pub fn alloc(&self, bytes: usize) -> Result<DevBuf, ExecError> {
        let (base, total) = allocate(bytes + 2 * GUARD_BYTES)?;
        let b = DevBuf {
            base,
            bytes,
            lead: GUARD_BYTES,
            total,
        };
        // Only the guards: every payload is uploaded or poisoned before anything reads it.
        // Queued on the legacy stream, so it is ordered before any later copy or launch.
        for at in [base, b.ptr() + bytes as u64] {
            // SAFETY: the range is inside the allocation.
            unsafe { result::memset_d8_async(at, guard_byte(), GUARD_BYTES, std::ptr::null_mut()) }
                .map_err(drv("filling guards"))?;
        }
        Ok(b)
    }

    /// A buffer of `bytes` whose payload can be placed at any address residue modulo `period`
    /// (`DevBuf::place`; it starts at the first such address, residue 0), with `GUARD_BYTES`
    /// of guard on either side wherever it lies. Nothing is filled: see `DevBuf::place`.
    pub fn alloc_placed(&self, bytes: usize, period: u64) -> Result<DevBuf, ExecError> {
        assert!(period.is_power_of_two());
        let (base, total) = allocate(bytes + period as usize + 2 * GUARD_BYTES + 16)?;
        let mut b = DevBuf {
            base,
            bytes,
            lead: GUARD_BYTES,
            total,
        };
        b.place(0, period);
        Ok(b)
    }

    /// Copy `len` bytes between the host and the device through the pinned staging buffer, one
    /// chunk at a time, the host side of each chunk copied by all cores.
    fn staged(&self, dev: u64, host: Staged<'_>) -> Result<(), ExecError> {
        let mut guard = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            // SAFETY: plain page-locked allocation of STAGING_BYTES.
            let p = unsafe { result::malloc_host(STAGING_BYTES, 0) }
                .map_err(drv("allocating page-locked host memory"))?;
            *guard = Some(Staging(p as *mut u8));
        }
        let pin = guard.as_ref().expect("just set").0;
        let len = match &host {
            Staged::Up(d) => d.len(),
            Staged::Down(o) => o.len(),
        };
        let mut at = 0usize;
        let mut host = host;
        while at < len {
            let n = STAGING_BYTES.min(len - at);
            // SAFETY: `pin` holds STAGING_BYTES; n <= that.
            let pinned = unsafe { std::slice::from_raw_parts_mut(pin, n) };
            match &mut host {
                Staged::Up(d) => {
                    par_copy(pinned, &d[at..at + n]);
                    // SAFETY: the destination range is inside the allocation (checked by callers).
                    unsafe { result::memcpy_htod_sync(dev + at as u64, &pinned[..]) }
                        .map_err(drv("copying to the device"))?;
                }
                Staged::Down(o) => {
                    // SAFETY: the source range is inside the allocation (checked by callers).
                    unsafe { result::memcpy_dtoh_sync(&mut pinned[..], dev + at as u64) }
                        .map_err(drv("copying from the device"))?;
                    par_copy(&mut o[at..at + n], pinned);
                }
            }
            at += n;
        }
        Ok(())
    }

    pub fn upload(&self, buf: &DevBuf, data: &[u8]) -> Result<(), ExecError> {
        if data.len() >= STAGED_FROM {
            assert!(data.len() <= buf.bytes);
            return self.staged(buf.ptr(), Staged::Up(data));
        }
        assert!(data.len() <= buf.bytes);
        // SAFETY: destination range is inside the allocation.
        unsafe { result::memcpy_htod_sync(buf.ptr(), data) }.map_err(drv("copying to the device"))
    }

    pub fn download(&self, buf: &DevBuf, out: &mut [u8]) -> Result<(), ExecError> {
        if out.len() >= STAGED_FROM {
            assert!(out.len() <= buf.bytes);
            return self.staged(buf.ptr(), Staged::Down(out));
        }
        assert!(out.len() <= buf.bytes);
        // SAFETY: source range is inside the allocation.
        unsafe { result::memcpy_dtoh_sync(out, buf.ptr()) }.map_err(drv("copying from the device"))
    }

    /// Download `out.len()` bytes from byte `offset` of the payload.
    pub fn download_at(
        &self,
        buf: &DevBuf,
        offset: usize,
        out: &mut [u8],
    ) -> Result<(), ExecError> {
        assert!(offset + out.len() <= buf.bytes);
        // SAFETY: source range is inside the allocation.
        unsafe { result::memcpy_dtoh_sync(out, buf.ptr() + offset as u64) }
            .map_err(drv("copying from the device"))
    }

    /// The whole allocation of `buf` (guards and any room around its payload), as it is now.
    pub fn download_allocation(&self, buf: &DevBuf) -> Result<Vec<u8>, ExecError> {
        let mut v = vec![0u8; buf.total];
        // SAFETY: the whole allocation, nothing past it.
        unsafe { result::memcpy_dtoh_sync(&mut v, buf.base) }
            .map_err(drv("copying from the device"))?;
        Ok(v)
    }

    pub fn download_vec(&self, buf: &DevBuf) -> Result<Vec<u8>, ExecError> {
        let mut v = vec![0u8; buf.bytes];
        self.download(buf, &mut v)?;
        Ok(v)
    }

    pub fn copy(&self, dst: &DevBuf, src: &DevBuf) -> Result<(), ExecError> {
        assert_eq!(dst.bytes, src.bytes);
        // SAFETY: both ranges inside their allocations.
        unsafe { result::memcpy_dtod_sync(dst.ptr(), src.ptr(), src.bytes) }
            .map_err(drv("device copy"))
    }

    /// `fill` queued on the legacy default stream without waiting: it completes before any
    /// later launch or copy on that stream starts; its errors surface at the next
    /// synchronisation.
    pub fn fill_queued(&self, buf: &DevBuf, byte: u8) -> Result<(), ExecError> {
        // SAFETY: payload range; legacy default stream.
        unsafe { result::memset_d8_async(buf.ptr(), byte, buf.bytes, std::ptr::null_mut()) }
            .map_err(drv("poisoning"))
    }

    /// Fill the payload with a repeated byte (the output poison).
    pub fn fill(&self, buf: &DevBuf, byte: u8) -> Result<(), ExecError> {
        // SAFETY: payload range.
        unsafe { result::memset_d8_sync(buf.ptr(), byte, buf.bytes) }.map_err(drv("poisoning"))
    }

    /// Which guard regions (the `GUARD_BYTES` next to the payload on either side) were written:
    /// "before" / "after" with the count of changed bytes.
    pub fn check_guards(&self, buf: &DevBuf) -> Result<Vec<String>, ExecError> {
        let mut bad = Vec::new();
        for (side, addr) in [
            (GuardSide::Before, buf.ptr() - GUARD_BYTES as u64),
            (GuardSide::After, buf.ptr() + buf.bytes as u64),
        ] {
            let mut g = vec![0u8; GUARD_BYTES];
            // SAFETY: guard ranges are inside the allocation.
            unsafe { result::memcpy_dtoh_sync(&mut g, addr) }.map_err(drv("reading guards"))?;
            bad.extend(guard_changes(side, &g, guard_byte()));
        }
        Ok(bad)
    }

    /// Launch and wait at most `limit`; `what` names the kernel in errors. A launch error or
    /// timeout leaves the context unusable (the caller must replace the process).
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        what: &str,
        f: sys::CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        args: &[Arg],
        limit: Duration,
    ) -> Result<(), ExecError> {
        self.launch_queued(what, f, grid, block, smem, args)?;
        self.wait(what, limit)
    }

    /// Wait for everything queued (the candidate's launches queued with [`Gpu::launch_queued`]
    /// among it) within `limit`, as [`Gpu::launch`] waits for one launch: past it, a timeout
    /// that marks the context broken.
    pub fn wait_queued(&self, what: &str, limit: Duration) -> Result<(), ExecError> {
        self.wait(what, limit)?;
        self.wait_idle(what)
    }

    /// Queue one of the verifier's own kernels without waiting (its errors surface at the next
    /// synchronisation; never used for a candidate, whose launches are waited for: by
    /// [`Gpu::launch`] at once, or by [`Gpu::wait_queued`]).
    pub fn enqueue(
        &self,
        what: &str,
        f: sys::CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        args: &[Arg],
    ) -> Result<(), ExecError> {
        self.launch_queued(what, f, grid, block, 0, args)
    }

    /// Queue a launch without waiting. A candidate's wait is then [`Gpu::wait_queued`], which
    /// the caller must reach before it reads anything the launch wrote; that wait bounds every
    /// launch queued before it together, so that a launch that never ends is still found.
    pub(crate) fn launch_queued(
        &self,
        what: &str,
        f: sys::CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        args: &[Arg],
    ) -> Result<(), ExecError> {
        let mut store: Vec<[u8; 8]> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p.to_ne_bytes(),
                Arg::I64(v) => v.to_ne_bytes(),
                Arg::U64(v) => v.to_ne_bytes(),
                Arg::F32(v) => {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&v.to_ne_bytes());
                    b
                }
            })
            .collect();
        let mut params: Vec<*mut c_void> = store
            .iter_mut()
            .map(|b| b.as_mut_ptr() as *mut c_void)
            .collect();
        if smem > 48 << 10 {
            // SAFETY: f is a live function handle.
            unsafe {
                let _ = result::function::set_function_attribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                );
            }
        }
        // SAFETY: argument storage outlives the call (the driver copies parameters at launch).
        unsafe {
            result::launch_kernel(
                f,
                (grid[0], grid[1], grid[2]),
                (block[0], block[1], block[2]),
                smem,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(|e| {
            mark_broken(ExecError::Launch {
                what: format!("launching {what} (grid {grid:?}, block {block:?}, {smem} B shared)"),
                message: describe(&e),
            })
        })
    }

    /// Wait for the work queued so far on the default stream, polling an event, at most `limit`.
    fn wait(&self, what: &str, limit: Duration) -> Result<(), ExecError> {
        // SAFETY: events are live; legacy default stream.
        unsafe { result::event::record(self.stop, std::ptr::null_mut()) }.map_err(|e| {
            mark_broken(ExecError::Launch {
                what: what.into(),
                message: describe(&e),
            })
        })?;
        let t0 = Instant::now();
        loop {
            // SAFETY: live event.
            match unsafe { result::event::query(self.stop) } {
                Ok(()) => return Ok(()),
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => {}
                Err(e) => {
                    return Err(mark_broken(ExecError::Launch {
                        what: what.into(),
                        message: describe(&e),
                    }))
                }
            }
            if t0.elapsed() > limit {
                return Err(mark_broken(ExecError::Timeout {
                    what: what.into(),
                    limit_s: limit.as_secs_f64(),
                }));
            }
            // Most launches of a case end within microseconds: poll without sleeping for the
            // first WAIT_SPIN (a 20 us sleep lasts 50 us or more on Linux, and a case waits for
            // dozens of launches), then sleep between polls.
            let waited = t0.elapsed();
            if waited < WAIT_SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(
                    if waited < Duration::from_millis(5) {
                        20
                    } else {
                        500
                    },
                ));
            }
        }
    }

    /// Write the L2-flush buffer (more than twice the L2 size) so the next launch starts cold.
    pub fn flush_l2(&self) -> Result<(), ExecError> {
        if let Some(f) = &self.flush {
            // SAFETY: payload range, default stream.
            unsafe { result::memset_d8_async(f.ptr(), 0, f.bytes, std::ptr::null_mut()) }
                .map_err(drv("flushing L2"))?;
        }
        Ok(())
    }

    /// Median time in microseconds of `reps` launches, each timed with events around the launch
    /// alone. Before each launch (outside the timed region) `prepare` runs (poison the output,
    /// restore an in-place input) and the L2 is flushed; after each, `check` gets the rep's index
    /// (the caller checks that launch's output: a timed launch is checked like any other).
    #[allow(clippy::too_many_arguments)]
    pub fn time_launches(
        &self,
        what: &str,
        f: sys::CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        args: &[Arg],
        reps: Reps,
        limit: Duration,
        prepare: &mut dyn FnMut() -> Result<(), ExecError>,
        check: &mut dyn FnMut(usize) -> Result<(), ExecError>,
    ) -> Result<f64, ExecError> {
        let one = [Launch {
            what,
            f,
            grid,
            block,
            smem,
            args,
        }];
        self.time_sequence(&one, reps, limit, prepare, check)
    }

    /// `time_launches` for a sequence of launches on one stream timed together (a backward
    /// op's entries): the events enclose all of them, `limit` holds for the whole sequence.
    pub fn time_sequence(
        &self,
        launches: &[Launch<'_>],
        reps: Reps,
        limit: Duration,
        prepare: &mut dyn FnMut() -> Result<(), ExecError>,
        check: &mut dyn FnMut(usize) -> Result<(), ExecError>,
    ) -> Result<f64, ExecError> {
        let what = launches.last().map(|l| l.what).unwrap_or("nothing");
        let mut times = Vec::with_capacity(reps.most);
        for rep in 0.. {
            if reps.enough(rep, times.iter().sum::<f64>() / 1e3) {
                break;
            }
            prepare()?;
            self.flush_l2()?;
            // SAFETY: live events, default stream.
            unsafe { result::event::record(self.start, std::ptr::null_mut()) }
                .map_err(drv("timing"))?;
            for l in launches {
                self.launch_queued(l.what, l.f, l.grid, l.block, l.smem, l.args)?;
            }
            self.wait(what, limit)?;
            // SAFETY: both events recorded and complete.
            let ms =
                unsafe { result::event::elapsed(self.start, self.stop) }.map_err(drv("timing"))?;
            times.push(ms as f64 * 1e3);
            check(rep)?;
        }
        Ok(median(&mut times))
    }

    /// Fill the payload with the poison pattern of `key` (`kz_fill_pattern` of the verifier's
    /// utility module, whose function the caller passes), queued on the legacy default stream
    /// without waiting: the launch or download that follows on that stream sees it done (the
    /// verifier's own kernel: its errors surface at the next synchronisation, as `enqueue`'s).
    pub fn fill_pattern(
        &self,
        f: sys::CUfunction,
        buf: &DevBuf,
        key: u64,
        invert: bool,
    ) -> Result<(), ExecError> {
        let words = (buf.bytes as u64).div_ceil(8);
        let blocks = words.div_ceil(256).clamp(1, 1 << 16) as u32;
        self.enqueue(
            "poisoning the output",
            f,
            [blocks, 1, 1],
            [256, 1, 1],
            &[
                Arg::Ptr(buf.ptr()),
                Arg::I64(buf.bytes as i64),
                Arg::U64(key),
                Arg::I64(invert as i64),
            ],
        )
    }

    /// Wait for everything queued in the context, on any stream: a kernel must leave no work
    /// running after its launch returns, and outputs are read only after this. Called after
    /// `wait` saw the launch finish, so it returns at once unless other work was queued; a
    /// context that never idles is ended by the sandbox parent's per-case backstop.
    pub fn wait_idle(&self, what: &str) -> Result<(), ExecError> {
        result::ctx::synchronize().map_err(|e| {
            mark_broken(ExecError::Launch {
                what: format!("{what}: after the launch"),
                message: describe(&e),
            })
        })
    }

    /// Free and total device memory, bytes.
    pub fn memory(&self) -> Result<(usize, usize), ExecError> {
        result::mem_get_info().map_err(drv("device memory query"))
    }

    /// Device-to-device copy bandwidth, read + write, GB/s (median of 10 copies of 512 MiB).
    pub fn measure_copy_gbps(&self) -> Result<f64, ExecError> {
        let bytes = 512usize << 20;
        let a = self.alloc(bytes)?;
        let b = self.alloc(bytes)?;
        let mut times = Vec::new();
        for i in 0..12 {
            // SAFETY: live events and buffers of `bytes`.
            unsafe {
                result::event::record(self.start, std::ptr::null_mut()).map_err(drv("timing"))?;
                result::memcpy_dtod_async(b.ptr(), a.ptr(), bytes, std::ptr::null_mut())
                    .map_err(drv("copy"))?;
                result::event::record(self.stop, std::ptr::null_mut()).map_err(drv("timing"))?;
                result::event::synchronize(self.stop).map_err(drv("copy"))?;
                let ms = result::event::elapsed(self.start, self.stop).map_err(drv("timing"))?;
                if i >= 2 {
                    times.push(ms as f64);
                }
            }
        }
        let ms = median(&mut times);
        Ok(2.0 * bytes as f64 / (ms * 1e-3) / 1e9)
    }
}

pub fn median(xs: &mut [f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        0.5 * (xs[n / 2 - 1] + xs[n / 2])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_reference_is_timed_until_its_budget_the_candidate_every_run() {
        // a candidate: all 25 runs, however long
        let c = Reps::all(25);
        assert!(!c.enough(24, 1e6) && c.enough(25, 0.0));
        // the reference: 25 runs of 0.2 ms all, 12 ms runs stop after 5 (60 ms), never under 3
        let r = Reps::reference(25);
        assert!(!r.enough(24, 24.0 * 0.2) && r.enough(25, 5.0));
        assert!(!r.enough(4, 48.0) && r.enough(5, 60.0));
        assert!(!r.enough(2, 1e3) && r.enough(3, 1e3));
    }

    use super::*;
    use kernel_registry::manifest::entry_options;
    use kernel_registry::DType;
    use serde_json::Value;

    #[test]
    fn a_placed_payload_lies_at_its_residue_with_a_whole_guard_before_it() {
        let period = 1u64 << 21;
        for base in [0x7f00_0000_0000u64, 0x7f00_0020_0200, 0x7f00_0000_1100] {
            for residue in [0u64, 16, 240, 256, 4096, 1 << 20, period - 16] {
                let lead = placed_lead(base, residue, period);
                assert_eq!(
                    (base + lead as u64) % period,
                    residue,
                    "{base:#x} {residue}"
                );
                assert!(lead >= GUARD_BYTES && lead < GUARD_BYTES + period as usize);
            }
        }
    }

    #[test]
    fn a_guard_line_names_the_side_the_count_and_the_nearest_byte() {
        let g = 0x3Cu8;
        let mut w = vec![g; GUARD_BYTES];
        assert_eq!(guard_changes(GuardSide::Before, &w, g), None);
        w[GUARD_BYTES - 3] = 0;
        w[7] = 1;
        assert_eq!(
            guard_changes(GuardSide::Before, &w, g).as_deref(),
            Some("2 byte(s) changed before the buffer (nearest 3 byte(s) before it)")
        );
        assert_eq!(
            guard_changes(GuardSide::After, &w, g).as_deref(),
            Some("2 byte(s) changed after the buffer (nearest 8 byte(s) after it)")
        );
    }

    fn strings(v: &Value) -> Vec<String> {
        serde_json::from_value(v.clone()).expect("a list of strings")
    }

    /// The Python client compiles with the same option list, include path and program name
    /// (python/tests/test_compile.py checks the same fixture), so it gets the same CUBIN.
    #[test]
    fn nvrtc_options_match_the_python_client_fixture() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../python/tests/fixtures/nvrtc_options.json"
        );
        let fx: Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON");
        let cases = fx["options"].as_array().expect("options cases");
        assert!(!cases.is_empty());
        for c in cases {
            let arch: Arch = c["arch"].as_str().unwrap().parse().unwrap();
            let dt: DType = c["dtype"].as_str().unwrap().parse().unwrap();
            let job = entry_options(&strings(&c["nvrtc_options"]), dt);
            assert_eq!(
                nvrtc_options(arch, c["include_dir"].as_str().unwrap(), &job),
                strings(&c["expected"]),
                "case {c}"
            );
        }
        for c in fx["include_dir"].as_array().expect("include_dir cases") {
            let env = |k: &str| c["env"].get(k).and_then(Value::as_str);
            assert_eq!(
                cuda_include_dir_from(env("CUDA_HOME"), env("CUDA_PATH")),
                c["expected"].as_str().unwrap(),
                "case {c}"
            );
        }
        for c in fx["program_name"].as_array().expect("program_name cases") {
            let dt: DType = c["dtype"].as_str().unwrap().parse().unwrap();
            assert_eq!(
                format!("{}.cu", module_what(c["kernel"].as_str().unwrap(), dt)),
                c["expected"].as_str().unwrap(),
                "case {c}"
            );
        }
    }
}
