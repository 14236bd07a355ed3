"""Compiling hub kernels exactly as the verifier does, and launching them with the SPEC ABI.

Each dtype's entry is compiled by NVRTC (`nvrtc.py`, ctypes on libnvrtc) as its own program,
with the verifier's program name and option list, and NVRTC's CUBIN is loaded with
`cuModuleLoadData`: the client runs the very code the verification report hashed
(`compiled[].code_sha256`; `CompiledKernel.record` has the client's). The launch goes through
`cuLaunchKernel`, because the ABI (SPEC section 2) takes `long long` sizes and a `float` eps.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import torch

from . import nvrtc as _nv
from .digest import launch_dims
from .nvrtc import NvrtcCompileError, NvrtcNotFound, entry_options  # noqa: F401 (re-exported)

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


class CompiledKernel:
    """One entry symbol of one kernel, compiled for one device by NVRTC with the verifier's
    program name and options (`record` says which, and the SHA-256 of the code)."""

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
        self._smem_configured = 0
        self._dims: dict[tuple[int, int], tuple[tuple, int]] = {}  # (rows, cols) -> launch dims
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

    def launch(self, rows: int, cols: int, args: list[Any]) -> None:
        """args: tensors (pointers) and ctypes scalars, in ABI order."""
        dims = self._dims.get((rows, cols))
        if dims is None:  # computed once per shape (the launch rule is a pure function of it)
            grid, block, smem = launch_dims(self.manifest, rows, cols, self.sm_count)
            if smem > self._smem_configured and smem >= 48 * 1024:
                self._set_smem(smem)
            dims = ((*grid, *block), smem)
            self._dims[(rows, cols)] = dims
        (g0, g1, g2, b0, b1, b2), smem = dims
        keep, ptrs = [], []
        for a in args:
            if isinstance(a, torch.Tensor):
                if a.device != self.device:
                    raise ValueError(f"tensor on {a.device}, kernel compiled for {self.device}")
                a = ctypes.c_void_p(a.data_ptr())
            keep.append(a)
            ptrs.append(ctypes.cast(ctypes.byref(a), ctypes.c_void_p))
        arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
        # the current stream, never the null stream: the launch is ordered with PyTorch's work
        # and is recorded when that stream is capturing a CUDA graph
        stream = torch.cuda.current_stream(self.device).cuda_stream
        lib = self.lib
        _check(lib, lib.cuLaunchKernel(
            self.func, ctypes.c_uint(g0), ctypes.c_uint(g1), ctypes.c_uint(g2),
            ctypes.c_uint(b0), ctypes.c_uint(b1), ctypes.c_uint(b2),
            ctypes.c_uint(smem), ctypes.c_void_p(stream), arr, None),
            f"launching {self.entry}")


def compiled(digest: str, manifest: dict[str, Any], source: str, dtype: str,
             device: torch.device) -> CompiledKernel:
    """`dtype`'s entry of the kernel `digest`, compiled and loaded on `device` (once per process)."""
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


def _ll(v: int) -> ctypes.c_longlong:
    return ctypes.c_longlong(int(v))


def _aligned(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def run_rms_norm(k: CompiledKernel, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = _aligned(x)
    w = _aligned(w)
    cols = x.shape[-1]
    rows = x.numel() // cols
    out = torch.empty_like(x)
    if rows:
        k.launch(rows, cols, [out, x, w, _ll(rows), _ll(cols), ctypes.c_float(eps)])
    return out


def run_fused_add_rms_norm(k: CompiledKernel, x: torch.Tensor, residual: torch.Tensor,
                           w: torch.Tensor, eps: float) -> torch.Tensor:
    """ABI (out, residual, x, w, rows, cols, eps): residual := x + residual in place,
    out = norm(residual). A residual that is not contiguous and aligned is computed in a copy
    and copied back."""
    if residual.shape != x.shape:
        raise ValueError(f"fused_add_rms_norm: residual {tuple(residual.shape)} != x {tuple(x.shape)}")
    x, w = _aligned(x), _aligned(w)
    res = _aligned(residual)
    cols = x.shape[-1]
    rows = x.numel() // cols
    out = torch.empty_like(x)
    if rows:
        k.launch(rows, cols, [out, res, x, w, _ll(rows), _ll(cols), ctypes.c_float(eps)])
    if res is not residual:
        residual.copy_(res)
    return out


def run_layer_norm(k: CompiledKernel, x, w, b, eps: float) -> torch.Tensor:
    x, w, b = _aligned(x), _aligned(w), _aligned(b)
    cols = x.shape[-1]
    rows = x.numel() // cols
    out = torch.empty_like(x)
    if rows:
        k.launch(rows, cols, [out, x, w, b, _ll(rows), _ll(cols), ctypes.c_float(eps)])
    return out


def run_elementwise(k: CompiledKernel, x: torch.Tensor) -> torch.Tensor:
    x = _aligned(x)
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        # as the verifier: rows x cols with n = rows * cols (the launch rule picked by cols)
        cols = x.shape[-1] if x.dim() else 1
        k.launch(n // cols, cols, [out, x, _ll(n)])
    return out


def run_silu_and_mul(k: CompiledKernel, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    cols = g.shape[-1]
    x = torch.cat([g, u], dim=-1)  # [rows, 2*cols], gate first (fresh, contiguous, aligned)
    rows = x.numel() // (2 * cols)
    out = torch.empty_like(g, memory_format=torch.contiguous_format)
    if rows:
        k.launch(rows, cols, [out, x, _ll(rows), _ll(cols)])
    return out
