"""Compiling hub kernels exactly as the verifier does, and launching them with the SPEC ABI.

Each dtype's entry is compiled by NVRTC (`nvrtc.py`, ctypes on libnvrtc) as its own program,
with the verifier's program name and option list, and NVRTC's CUBIN is loaded with
`cuModuleLoadData`: the client runs the very code the verification report hashed
(`compiled[].code_sha256`; `CompiledKernel.record` has the client's). The launch goes through
`cuLaunchKernel`, because the ABI (docs/spec.md section 2) takes `long long` sizes and a `float` eps.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sysconfig
import threading
from pathlib import Path
from typing import Any

import torch

from . import nvrtc as _nv
from .manifest import launch_dims
from .nvrtc import NvrtcCompileError, NvrtcNotFound, entry_options  # noqa: F401 (re-exported)
from .pykernel import PythonKernel, SharedOnCopy, is_python

_CACHE: dict[tuple[str, str, int], "CompiledKernel"] = {}
_CACHE_LOCK = threading.Lock()


def cuda_include_dirs() -> list[str]:
    """CUDA header folders that exist: the verifier's include path first (`nvrtc.cuda_include_dir`),
    then the pip CUDA runtime's headers. (Kept for callers; compiling uses one include path,
    `nvrtc.include_dir_for_client`.)"""
    dirs = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            dirs.append(os.path.join(os.environ[env], "include"))
    dirs.append("/usr/local/cuda/include")
    try:  # the pip CUDA runtime's headers, when torch came from PyPI
        import nvidia.cuda_runtime as cr  # type: ignore
        for p in getattr(cr, "__path__", []):
            dirs.append(os.path.join(p, "include"))
    except Exception:  # noqa: BLE001
        pass
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


_LIBCUDA: ctypes.CDLL | None = None


def _libcuda() -> ctypes.CDLL:
    """libcuda with the prototypes used here (one handle per process)."""
    global _LIBCUDA
    if _LIBCUDA is None:
        lib = ctypes.CDLL("libcuda.so.1")
        P, I = ctypes.c_void_p, ctypes.c_int
        for name, args in {
            "cuModuleLoadData": [ctypes.POINTER(P), ctypes.c_char_p],
            "cuModuleGetFunction": [ctypes.POINTER(P), P, ctypes.c_char_p],
            "cuFuncSetAttribute": [P, I, I],
            "cuCtxGetCurrent": [ctypes.POINTER(P)],
            "cuCtxGetDevice": [ctypes.POINTER(I)],
            "cuDeviceGet": [ctypes.POINTER(I), I],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(P), I],
            "cuCtxPushCurrent_v2": [P],
            "cuCtxPopCurrent_v2": [ctypes.POINTER(P)],
            "cuGetErrorString": [I, ctypes.POINTER(ctypes.c_char_p)],
        }.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = args, I
        _LIBCUDA = lib
    return _LIBCUDA


def _check(lib: ctypes.CDLL, res: int, what: str) -> None:
    if res != 0:
        s = ctypes.c_char_p()
        lib.cuGetErrorString(res, ctypes.byref(s))
        raise RuntimeError(f"{what}: CUDA error {res}: {s.value.decode() if s.value else '?'}")


def _load_module(image: bytes, device: torch.device) -> ctypes.c_void_p:
    """cuModuleLoadData into `device`'s primary context (the one PyTorch uses), pushed for the
    call when this thread's current context is none or another device's."""
    lib = _libcuda()
    torch.cuda.init()
    with torch.cuda.device(device):
        cur, cur_dev = ctypes.c_void_p(), ctypes.c_int(-1)
        _check(lib, lib.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
        if cur.value:
            _check(lib, lib.cuCtxGetDevice(ctypes.byref(cur_dev)), "cuCtxGetDevice")
        dev = ctypes.c_int()
        _check(lib, lib.cuDeviceGet(ctypes.byref(dev), device.index), "cuDeviceGet")
        pushed = False
        if not cur.value or cur_dev.value != dev.value:
            ctx = ctypes.c_void_p()
            _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            _check(lib, lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
            pushed = True
        try:
            module = ctypes.c_void_p()
            _check(lib, lib.cuModuleLoadData(ctypes.byref(module), image), "loading the compiled module")
        finally:
            if pushed:
                lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    return module


class CompiledKernel(SharedOnCopy):
    """One entry symbol of one kernel, compiled for one device by NVRTC with the verifier's
    program name and options (`record` says which, and the SHA-256 of the code)."""

    runtime = "cuda"

    def __init__(self, manifest: dict[str, Any], source: str, dtype: str, device: torch.device):
        self.manifest = manifest
        self.dtype = dtype
        self.entry = manifest["entries"][dtype]
        self.device = device
        major, minor = torch.cuda.get_device_capability(device)
        props = torch.cuda.get_device_properties(device)
        self.sm_count = props.multi_processor_count
        self._smem_optin = getattr(props, "shared_memory_per_block_optin", 49152)
        self.code = _nv.compile_entry(manifest, source, dtype, (major, minor))
        self.lib = _libcuda()
        self.module = _load_module(self.code.code, device)  # never unloaded: cached per process
        func = ctypes.c_void_p()
        res = self.lib.cuModuleGetFunction(ctypes.byref(func), self.module, self.entry.encode())
        if res != 0:
            raise RuntimeError(f"entry `{self.entry}` is not in the compiled module of "
                               f"{manifest['name']} ({dtype}); declare it `extern \"C\" __global__`")
        self.func = func
        self._index = device.index
        self._smem_configured = 0
        self._prepared: dict[tuple, tuple] = {}  # (rows, cols, scalars) -> (slots, argv, dims)
        self._lock = threading.Lock()
        self._cu_launch: Any = None  # cuLaunchKernel, looked up at the first launch
        self._stub = c_launcher(self.lib)  # None: launches go through ctypes
        self.record: dict[str, Any] = {
            "kernel": manifest["name"], "dtype": dtype, "symbol": self.entry,
            "arch": f"sm_{major}{minor}", "program_name": self.code.program_name,
            "options": list(self.code.options), "nvrtc_version": self.code.nvrtc_version,
            "nvrtc_library": self.code.nvrtc_library, "code_kind": self.code.code_kind,
            "code_sha256": self.code.code_sha256, "code_bytes": len(self.code.code),
            "compile_s": round(self.code.compile_s, 4),
        }

    def _set_smem(self, smem: int) -> None:
        if smem > self._smem_optin:
            raise RuntimeError(f"{self.entry} needs {smem} bytes of shared memory; this device "
                               f"allows {self._smem_optin} per block")
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _check(self.lib, self.lib.cuFuncSetAttribute(self.func, 8, smem),
               f"allowing {smem} bytes of shared memory to {self.entry}")
        self._smem_configured = smem

    def launch(self, rows: int, cols: int, tensors: tuple, scalars: tuple) -> None:
        """Launch on `rows` x `cols` with the ABI's arguments: `tensors` (its pointers, which
        come first in every SPEC ABI) then `scalars` (Python ints are `long long`, floats
        `float`). Everything that depends only on (rows, cols, scalars) — the grid, the
        argument array and its scalar slots — is built on the first call of that shape and
        reused; a call refills the pointer slots in place and calls `cuLaunchKernel` on the
        current stream (never the null stream: it is ordered with PyTorch's work, and recorded
        while a CUDA graph captures)."""
        prep = self._prepared.get((rows, cols, scalars))  # `_lookup`, inline: the hot path
        if prep is None:
            prep = self._prepare(rows, cols, len(tensors), scalars)
        index = self._index
        for t in tensors:
            if t.get_device() != index:
                raise ValueError(f"tensor on {t.device}, kernel compiled for {self.device}")
        if self._stub is not None:  # the C launcher: no shared state, no lock
            res = self._stub.launch(prep, _current_stream(index), *map(_data_ptr, tensors))
            if res != 0:
                _check(self.lib, res, f"launching {self.entry}")
            return
        slots, argv, dims, _ = prep
        with self._lock:  # the pointer slots are shared by this kernel's callers
            for slot, t in zip(slots, tensors):
                slot.value = t.data_ptr()
            res = self._cu_launch(self.func, *dims, _current_stream(index), argv, None)
        if res != 0:
            _check(self.lib, res, f"launching {self.entry}")

    def prepared(self, rows: int, cols: int, n_tensors: int, scalars: tuple) -> bytes | None:
        """The C launcher's prepared launch of (rows, cols, scalars), for a caller that launches
        it itself: `self.stub_launch(prep, stream, *pointers)` (check a nonzero result with
        `failed`). None without the C launcher."""
        return None if self._stub is None else self._lookup(rows, cols, n_tensors, scalars)

    @property
    def stub_launch(self) -> Any:
        return self._stub.launch

    def failed(self, res: int) -> None:
        """Raise for `res`, a nonzero CUresult of a launch of this kernel."""
        _check(self.lib, res, f"launching {self.entry}")

    def _lookup(self, rows: int, cols: int, n_tensors: int, scalars: tuple) -> Any:
        """The launch of (rows, cols, scalars) prepared on its first call, kept after."""
        prep = self._prepared.get((rows, cols, scalars))
        return prep if prep is not None else self._prepare(rows, cols, n_tensors, scalars)

    def dims(self, rows: int, cols: int) -> tuple[tuple, tuple, int]:
        """(grid, block, dynamic shared memory) of a launch on rows x cols (the manifest's launch
        rule), with the kernel allowed that much shared memory: what every launch path of this
        kernel uses (its own, and the native operators' through native.py)."""
        grid, block, smem = launch_dims(self.manifest, rows, cols, self.sm_count)
        if smem > self._smem_configured and smem >= 48 * 1024:
            self._set_smem(smem)
        return grid, block, smem

    def _prepare(self, rows: int, cols: int, n_tensors: int, scalars: tuple) -> Any:
        if self._cu_launch is None:
            self._cu_launch = _cu_launch(self.lib)
        grid, block, smem = self.dims(rows, cols)
        if self._stub is not None:
            prep = self._stub.prepare(self.func.value, *grid, *block, smem, n_tensors, scalars)
            self._prepared[(rows, cols, scalars)] = prep
            return prep
        slots = [ctypes.c_void_p() for _ in range(n_tensors)]
        values = slots + [ctypes.c_float(v) if isinstance(v, float) else ctypes.c_longlong(v)
                          for v in scalars]
        argv = (ctypes.c_void_p * len(values))(
            *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        prep = (slots, argv, (*grid, *block, smem), values)  # values: keeps the slots alive
        self._prepared[(rows, cols, scalars)] = prep
        return prep


def _cu_launch(lib: ctypes.CDLL) -> Any:
    """`cuLaunchKernel` with its prototype, so that a call converts plain Python ints."""
    f = lib.cuLaunchKernel
    U, P = ctypes.c_uint, ctypes.c_void_p
    f.argtypes, f.restype = [P, U, U, U, U, U, U, U, P, P, P], ctypes.c_int
    return f


_data_ptr = torch.Tensor.data_ptr
_log = logging.getLogger("kernelize")
_STUB: Any = None  # the C launcher module; False once building it failed
_STUB_LOCK = threading.Lock()


def c_launcher(lib: Any) -> Any:
    """The C launch stub (`_launcher.c`) initialised with `lib`'s cuLaunchKernel, or None.

    Built on first use with the system C compiler against this Python's headers and cached in
    `$KERNELIZE_CACHE` (default `~/.cache/kernelize`), as Triton builds its launchers. A call
    through it costs one C function call instead of ctypes' argument conversions. Where no
    compiler or no Python headers are found (or `KERNELIZE_C_LAUNCHER=0`), None: the ctypes
    path is used, with a warning saying why."""
    global _STUB
    with _STUB_LOCK:
        if _STUB is None:
            try:
                _STUB = _build_c_launcher() or False
            except Exception as e:  # noqa: BLE001 (any failure means: use ctypes)
                _log.warning("kernelize: the C launcher could not be built (%s); launching through ctypes", e)
                _STUB = False
        if not _STUB:
            return None
        try:
            fn = ctypes.cast(lib.cuLaunchKernel, ctypes.c_void_p).value
        except (AttributeError, ctypes.ArgumentError):
            return None  # a stand-in libcuda (tests): no real entry point to call
        _STUB.init(fn)
        return _STUB


def cache_dir() -> Path:
    """Where kernelize keeps what it builds or proves on this machine: `$KERNELIZE_CACHE`, default
    `~/.cache/kernelize` (the C launcher, exact compile's proofs)."""
    return Path(os.environ.get("KERNELIZE_CACHE") or Path.home() / ".cache" / "kernelize")


def compile_cached(folder: str, stem: str, suffix: str, source: Path, key: str, command: Any,
                   announce: str | None = None) -> Path:
    """A library built from `source` once per machine: `cache_dir()/folder/stem-TAG+suffix`, TAG
    hashing the source and `key` (what else the build depends on). Where it is not there yet,
    `command()` gives the compiler command without its output (it raises RuntimeError where there
    is no compiler), `announce` (a log format with the path) is logged, and the compiler writes
    a temporary file that is renamed into place, so concurrent builders leave one complete file.
    Raises RuntimeError with the compiler's error. (The C launcher and native.py's operators.)"""
    tag = hashlib.sha256(source.read_bytes() + key.encode()).hexdigest()[:16]
    so = cache_dir() / folder / f"{stem}-{tag}{suffix}"
    if so.exists():
        return so
    cmd = command()
    so.parent.mkdir(parents=True, exist_ok=True)
    tmp = so.with_name(f"{so.name}.{os.getpid()}.tmp")
    if announce:
        _log.warning(announce, so)
    r = subprocess.run([*cmd, "-o", str(tmp)], capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"{cmd[0]} failed: {r.stderr.strip()[-1500:]}")
    os.replace(tmp, so)
    return so


def _build_c_launcher() -> Any:
    if os.environ.get("KERNELIZE_C_LAUNCHER", "1") == "0":
        return None
    src = Path(__file__).with_name("_launcher.c")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    include = sysconfig.get_paths()["include"]

    def command() -> list[str]:
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise RuntimeError("no C compiler (cc, gcc or $CC)")
        if not os.path.exists(os.path.join(include, "Python.h")):
            raise RuntimeError(f"no Python.h in {include} (install the Python headers, e.g. "
                               "python3-dev)")
        return [cc, "-O2", "-shared", "-fPIC", "-I", include, str(src)]
    try:
        so = compile_cached("launcher", "_kernelize_launcher", suffix, src, include + suffix, command)
    except RuntimeError as e:
        _log.warning("kernelize: the C launcher is not built (%s): launching through ctypes", e)
        return None
    spec = importlib.util.spec_from_file_location("_kernelize_launcher", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what inductor's launchers use


def _current_stream(index: int) -> int:
    """The raw handle of PyTorch's current stream on device `index`."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(index)
    return torch.cuda.current_stream(index).cuda_stream


def current_stream_fn() -> Any:
    """`_current_stream` without its own Python frame where PyTorch has the raw getter."""
    return _RAW_STREAM if _RAW_STREAM is not None else _current_stream


def compiled(digest: str, manifest: dict[str, Any], source: str, dtype: str,
             device: torch.device, allow_python: bool = False) -> CompiledKernel:
    """`dtype`'s entry of the kernel `digest`, compiled and loaded on `device` (once per process).
    A Python candidate (docs/spec.md section 2b) is loaded as a `pykernel.PythonKernel` instead, and only with
    `allow_python` (its code runs in this process)."""
    if is_python(manifest):
        key = (digest, dtype, str(device))
        with _CACHE_LOCK:
            if key not in _CACHE:
                _CACHE[key] = PythonKernel(digest, manifest, source, dtype, device, allow_python)
            return _CACHE[key]
    key = (digest, dtype, device.index if device.index is not None else torch.cuda.current_device())
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = CompiledKernel(manifest, source, dtype, torch.device("cuda", key[2]))
        return _CACHE[key]


def compile_record(digest: str, dtype: str, device: torch.device | int | None = None) -> dict[str, Any] | None:
    """What the client compiled for (kernel `digest`, `dtype`) on `device` in this process: the
    program name, every NVRTC option in order, NVRTC's version and library, the code kind and
    `code_sha256` (compare with the verification report's `compiled[]`); None if not compiled."""
    if device is None:
        idx = torch.cuda.current_device()
    elif isinstance(device, int):
        idx = device
    else:
        idx = device.index if device.index is not None else torch.cuda.current_device()
    k = _CACHE.get((digest, dtype, idx))
    return dict(k.record) if k is not None else None


def compile_records() -> list[dict[str, Any]]:
    """Every compile record of this process (see `compile_record`), with its digest and device."""
    return [dict(k.record, digest=d, device=i) for (d, _, i), k in sorted(_CACHE.items())]


#: The kernel ABI's alignment (docs/spec.md section 2): every tensor a kernel is given is
#: contiguous and starts at a multiple of this many bytes, and nothing more is promised. The
#: verifier runs every case with its buffers at every residue this allows (docs/verifier.md,
#: address cases), so a verified kernel gives the same bits at any such address; its constant is
#: `kernel_registry::ABI_ALIGN_BYTES` (checked through python/tests/fixtures/abi.json). The one
#: copy of the rule in the client: `abi_passable`.
ABI_ALIGNMENT = 16


def abi_passable(t: torch.Tensor) -> bool:
    """Whether the ABI lets `t` be given to a kernel as it is: contiguous and ABI_ALIGNMENT-byte
    aligned (a view 16 bytes into a larger tensor is; one 2 bytes in is not)."""
    return t.is_contiguous() and t.data_ptr() % ABI_ALIGNMENT == 0


def aligned(t: torch.Tensor) -> torch.Tensor:
    """t if the ABI lets it be passed as it is (`abi_passable`), else a copy that is."""
    if abi_passable(t):
        return t
    t = t.contiguous()
    return t if t.data_ptr() % ABI_ALIGNMENT == 0 else t.clone()


def run_rms_norm(k: CompiledKernel, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    if isinstance(k, PythonKernel):
        return k.rms_norm(x, w, eps)
    x = aligned(x)
    w = aligned(w)
    cols = x.shape[-1]
    rows = x.numel() // cols
    out = torch.empty_like(x)
    if rows:
        k.launch(rows, cols, (out, x, w), (rows, cols, float(eps)))
    return out


def _run_fused_add(k: CompiledKernel, op: str, x: torch.Tensor, residual: torch.Tensor,
                   params: tuple, eps: float) -> torch.Tensor:
    """The fused adds' ABI (out, residual, x, *params, rows, cols, eps): residual := x +
    residual in place, out = the norm of residual. A residual that is not contiguous and aligned
    is computed in a copy and copied back."""
    if isinstance(k, PythonKernel):
        return k.fused_add(x, residual, params, eps)
    if residual.shape != x.shape:
        raise ValueError(f"{op}: residual {tuple(residual.shape)} != x {tuple(x.shape)}")
    x, res = aligned(x), aligned(residual)
    params = tuple(aligned(p) for p in params)
    cols = x.shape[-1]
    rows = x.numel() // cols
    out = torch.empty_like(x)
    if rows:
        k.launch(rows, cols, (out, res, x, *params), (rows, cols, float(eps)))
    if res is not residual:
        residual.copy_(res)
    return out


def run_fused_add_rms_norm(k: CompiledKernel, x: torch.Tensor, residual: torch.Tensor,
                           w: torch.Tensor, eps: float) -> torch.Tensor:
    """ABI (out, residual, x, w, rows, cols, eps): residual := x + residual, out = norm(residual)."""
    return _run_fused_add(k, "fused_add_rms_norm", x, residual, (w,), eps)


def run_fused_add_layer_norm(k: CompiledKernel, x: torch.Tensor, residual: torch.Tensor,
                             w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """ABI (out, residual, x, w, b, rows, cols, eps): residual := x + residual,
    out = layer_norm(residual)."""
    return _run_fused_add(k, "fused_add_layer_norm", x, residual, (w, b), eps)


def run_layer_norm(k: CompiledKernel, x, w, b, eps: float) -> torch.Tensor:
    if isinstance(k, PythonKernel):
        return k.layer_norm(x, w, b, eps)
    x, w, b = aligned(x), aligned(w), aligned(b)
    cols = x.shape[-1]
    rows = x.numel() // cols
    out = torch.empty_like(x)
    if rows:
        k.launch(rows, cols, (out, x, w, b), (rows, cols, float(eps)))
    return out


def run_elementwise(k: CompiledKernel, x: torch.Tensor) -> torch.Tensor:
    if isinstance(k, PythonKernel):
        return k.elementwise(x)
    x = aligned(x)
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        # as the verifier: rows x cols with n = rows * cols (the launch rule picked by cols)
        cols = x.shape[-1] if x.dim() else 1
        k.launch(n // cols, cols, (out, x), (n,))
    return out


def run_silu_and_mul(k: CompiledKernel, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    if isinstance(k, PythonKernel):
        return k.silu_and_mul(g, u)
    cols = g.shape[-1]
    x = torch.cat([g, u], dim=-1)  # [rows, 2*cols], gate first (fresh, contiguous, aligned)
    rows = x.numel() // (2 * cols)
    out = torch.empty_like(g, memory_format=torch.contiguous_format)
    if rows:
        k.launch(rows, cols, (out, x), (rows, cols))
    return out


def run_gated(k: CompiledKernel, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """silu_mul / gelu_tanh_mul, ABI (out, gate, up, rows, cols): gate and up of the same shape
    [..., cols], each made contiguous and 16-byte aligned on its own (no concatenation)."""
    if isinstance(k, PythonKernel):
        return k.gated(g, u)
    if g.shape != u.shape:
        raise ValueError(f"gated op: gate {tuple(g.shape)} and up {tuple(u.shape)} differ in shape")
    g, u = aligned(g), aligned(u)
    cols = g.shape[-1] if g.dim() else 1
    rows = g.numel() // cols if cols else 0
    out = torch.empty_like(g)
    if rows:
        k.launch(rows, cols, (out, g, u), (rows, cols))
    return out


RUNNERS = {  # every forward op of kernelize.manifest.OPS (a test holds it)
    "rms_norm": run_rms_norm,
    "fused_add_rms_norm": run_fused_add_rms_norm,
    "layer_norm": run_layer_norm,
    "fused_add_layer_norm": run_fused_add_layer_norm,
    "silu": run_elementwise,
    "gelu": run_elementwise,
    "gelu_tanh": run_elementwise,
    "silu_and_mul": run_silu_and_mul,
    "silu_mul": run_gated,
    "gelu_tanh_mul": run_gated,
}
"""op kind -> the function that runs a `CompiledKernel` of it (what the custom ops call)."""
