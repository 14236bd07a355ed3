"""Compiling hub kernels with PyTorch's NVRTC path and launching them with the SPEC ABI.

`torch.cuda._compile_kernel` compiles and loads the module; the launch itself goes through
`cuLaunchKernel` here, because `_CudaKernel.__call__` passes Python ints as 32-bit `int` and
floats as `double`, while the ABI (SPEC section 2) takes `long long` sizes and a `float` eps.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import torch

from .digest import launch_dims

_CACHE: dict[tuple[str, str, int], "CompiledKernel"] = {}


def cuda_include_dirs() -> list[str]:
    """CUDA headers for cuda_bf16.h / cuda_fp16.h (GPU.md: NVRTC does not find them alone)."""
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


def _libcuda() -> ctypes.CDLL:
    from torch.cuda import _utils as u
    for f in ("_get_gpu_runtime_library", "_get_cuda_library"):
        if hasattr(u, f):
            return getattr(u, f)()
    return ctypes.CDLL("libcuda.so.1")


def _check(lib: ctypes.CDLL, res: int, what: str) -> None:
    if res != 0:
        s = ctypes.c_char_p()
        lib.cuGetErrorString(res, ctypes.byref(s))
        raise RuntimeError(f"{what}: CUDA error {res}: {s.value.decode() if s.value else '?'}")


def entry_options(author_options: list[str], dtype: str) -> list[str]:
    """NVRTC options of the module holding `dtype`'s entry, as the verifier compiles it
    (kernel_registry::manifest::entry_options): the author's, then -DKERNELIZE_DTYPE_<DTYPE>."""
    return list(author_options) + [f"-DKERNELIZE_DTYPE_{dtype.upper()}"]


class CompiledKernel:
    """One entry symbol of one kernel, compiled for one device."""

    def __init__(self, manifest: dict[str, Any], source: str, dtype: str, device: torch.device):
        if not hasattr(torch.cuda, "_compile_kernel"):
            raise RuntimeError(f"torch {torch.__version__} has no torch.cuda._compile_kernel "
                               "(PyTorch >= 2.8 needed to compile hub kernels)")
        self.manifest = manifest
        self.entry = manifest["entries"][dtype]
        self.device = device
        major, minor = torch.cuda.get_device_capability(device)
        self.sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        with torch.cuda.device(device):
            k = torch.cuda._compile_kernel(
                source, self.entry, compute_capability=f"{major}{minor}",
                cuda_include_dirs=cuda_include_dirs(),
                nvcc_options=entry_options(manifest["nvrtc_options"], dtype))
        self._k = k            # keeps the module loaded
        self.func = k.func
        self.lib = _libcuda()
        self._smem_configured = 0

    def launch(self, rows: int, cols: int, args: list[Any]) -> None:
        """args: tensors (pointers) and ctypes scalars, in ABI order."""
        grid, block, smem = launch_dims(self.manifest, rows, cols, self.sm_count)
        if smem > self._smem_configured and smem >= 48 * 1024:
            self._k.set_shared_memory_config(smem)
            self._smem_configured = smem
        keep, ptrs = [], []
        for a in args:
            if isinstance(a, torch.Tensor):
                if a.device != self.device:
                    raise ValueError(f"tensor on {a.device}, kernel compiled for {self.device}")
                a = ctypes.c_void_p(a.data_ptr())
            keep.append(a)
            ptrs.append(ctypes.cast(ctypes.byref(a), ctypes.c_void_p))
        arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        _check(self.lib, self.lib.cuLaunchKernel(
            self.func, ctypes.c_uint(grid[0]), ctypes.c_uint(grid[1]), ctypes.c_uint(grid[2]),
            ctypes.c_uint(block[0]), ctypes.c_uint(block[1]), ctypes.c_uint(block[2]),
            ctypes.c_uint(smem), ctypes.c_void_p(stream), arr, None),
            f"launching {self.entry}")


def compiled(digest: str, manifest: dict[str, Any], source: str, dtype: str,
             device: torch.device) -> CompiledKernel:
    key = (digest, dtype, device.index if device.index is not None else torch.cuda.current_device())
    if key not in _CACHE:
        _CACHE[key] = CompiledKernel(manifest, source, dtype, torch.device("cuda", key[2]))
    return _CACHE[key]


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
