"""kernelize's launch operators in C++ (`_native_ops.cpp`): the CUDA kernels of
`kernelize::launch_<op>` without a trip through Python at each call (the exact backend's
attention operators stay Python: the source's header says why).

Compiled code without CUDA graphs (`torch.compile`'s default mode) calls each operator through
the dispatcher at every step; a Python kernel there costs 12-18 us of host time a call where
inductor's own launches cost 2-3 (bench/op_overhead.py, bench/COMPILE.md session 16), which made
`kernelize(model, compile=True)` 0.73-0.86x of plain compile in default mode. The C++ kernels do
what ops.py's Python kernels do, in C++, in the common case, and hand every other case to them
(the source's header says which).

Built on first use with the system C++ compiler against the installed torch's headers and
libraries, and cached in `launch.cache_dir()` under a name that hashes the source, the torch
build and the compiler, as launch.py builds its C launcher and Triton its launchers. The build
takes 10-60 s once per machine and torch; it is done where a kernelize call first registers a
kernel on a machine with a GPU. Without a C++ compiler, without CUDA's headers, or with
`KERNELIZE_NATIVE=0`, the Python kernels are registered instead, with a warning saying why.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import torch

_log = logging.getLogger("kernelize")

SOURCE = Path(__file__).with_name("_native_ops.cpp")

#: The op of a compiled kernel -> the C++ side's number for the ABI it takes (`enum Op`).
OP_CODES = {"rms_norm": 1, "fused_add_rms_norm": 2, "layer_norm": 3, "fused_add_layer_norm": 4,
            "silu": 5, "gelu": 5, "gelu_tanh": 5, "silu_mul": 6, "gelu_tanh_mul": 6}

_PREPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_longlong,
                            ctypes.POINTER(ctypes.c_uint))
_LIB: Any = None       # the loaded library; False once loading failed
_WHY = ""              # why it is not loaded
_LOCK = threading.Lock()
_CALLBACKS: list = []  # the ctypes callbacks the library holds (kept alive here)


def _torch_dirs() -> tuple[Path, Path]:
    root = Path(torch.__file__).parent
    return root / "include", root / "lib"


def _cuda_include() -> str | None:
    """A folder with CUDA's runtime headers (c10/cuda's headers include cuda_runtime_api.h, which
    includes crt/host_defines.h): the toolkit's (CUDA_HOME, /usr/local/cuda), else Triton's copy
    (inductor needs Triton), else the pip runtime's where it is complete."""
    from .launch import cuda_include_dirs
    dirs = cuda_include_dirs()
    for pkg in ("triton", "nvidia"):
        try:
            mod = __import__(pkg)
        except Exception:  # noqa: BLE001
            continue
        for p in getattr(mod, "__path__", []):
            dirs += [str(d) for d in sorted(Path(p).glob("backends/nvidia/include"))]
            dirs += [str(d) for d in sorted(Path(p).glob("cu*/include"))]
    for d in dirs:
        if all(os.path.exists(os.path.join(d, h)) for h in ("cuda_runtime_api.h", "crt/host_defines.h")):
            return d
    return None


def compiler() -> str | None:
    """The C++ compiler the build uses: $CXX, else c++, else g++; None where there is none."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    return cxx if cxx is not None and shutil.which(cxx) is not None else None


def build() -> Path:
    """The library built for this torch (built now when it is not in the cache); raises
    RuntimeError saying what is missing or what the compiler said."""
    from .launch import compile_cached
    include, libdir = _torch_dirs()

    def command() -> list[str]:
        cxx = compiler()
        if cxx is None:
            raise RuntimeError(f"no C++ compiler (c++, g++ or $CXX; $CXX={os.environ.get('CXX')!r})")
        cuda_inc = _cuda_include()
        if cuda_inc is None:
            raise RuntimeError("no CUDA runtime headers (cuda_runtime_api.h) under CUDA_HOME, "
                               "/usr/local/cuda/include, Triton or the nvidia pip packages")
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        return [cxx, "-O2", "-std=c++20", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                "-I", str(include), "-I", str(include / "torch" / "csrc" / "api" / "include"),
                "-I", cuda_inc, str(SOURCE), "-L", str(libdir), "-lc10", "-lc10_cuda", "-ltorch_cpu",
                f"-Wl,-rpath,{libdir}"]
    # the torch build the library links against (a torch upgraded in place keeps its folder)
    key = "\0".join([torch.__version__, str(torch.version.cuda), str(include.parent),
                     os.environ.get("CXX", "")])
    return compile_cached("native", "kernelize_native", ".so", SOURCE, key, command,
                          "kernelize: building the native launch operators (once per machine and "
                          "torch, 10-60 s) into %s")


def _prepare(key: int, rows: int, cols: int, dims: Any) -> int:
    """The C side's callback: the launch dimensions of (rows, cols) for the kernel `key`
    (CompiledKernel.dims: the manifest's launch rule), 0; nonzero where that raises (the Python
    kernel the C side then calls reports it)."""
    try:
        from .ops import kernel
        grid, block, smem = kernel(key).dims(rows, cols)
        for i, v in enumerate((*grid, *block, smem)):
            dims[i] = v
        return 0
    except Exception:  # noqa: BLE001 - reported by the Python kernel
        return 1


def load() -> Any:
    """The native library, loaded (its CUDA kernels registered) on the first call; None where it
    cannot be (`why()` says why). Call only where no Python CUDA kernel is registered for the
    launch operators (ops.ensure_kernels decides which)."""
    global _LIB, _WHY
    with _LOCK:
        if _LIB is None:
            try:
                if os.environ.get("KERNELIZE_NATIVE", "1") == "0":
                    raise RuntimeError("KERNELIZE_NATIVE=0")
                from .launch import _cu_launch, _libcuda
                launch_fn = ctypes.cast(_cu_launch(_libcuda()), ctypes.c_void_p).value
                so = build()
                # loading registers the C++ kernels: nothing may fail after it (ensure_kernels
                # would then register the Python ones over them)
                lib = ctypes.CDLL(str(so))
                prepare = _PREPARE(_prepare)
                _CALLBACKS[:] = [prepare]
                lib.kz_native_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                lib.kz_native_set.argtypes = [ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int,
                                              ctypes.c_int]
                lib.kz_native_prepared.argtypes = [ctypes.c_longlong]
                lib.kz_native_prepared.restype = ctypes.c_longlong
                lib.kz_native_init(launch_fn, ctypes.cast(prepare, ctypes.c_void_p))
                _LIB = lib
            except Exception as e:  # noqa: BLE001 - any failure: the Python kernels
                _WHY = str(e)
                _LIB = False
        return _LIB or None


def why() -> str:
    """Why the native library is not loaded ('' when it is, or was not tried)."""
    return _WHY


def enable(key: int, compiled: Any) -> bool:
    """Let the C++ kernels launch `compiled` (a launch.CompiledKernel of a forward op) under
    `key`; False where they cannot (the library is not loaded, or a Python candidate, a
    backward kernel or an op the C side hands to Python): its calls go through Python."""
    from .launch import CompiledKernel
    code = OP_CODES.get(getattr(compiled, "manifest", {}).get("op", ""))
    if not _LIB or code is None or not isinstance(compiled, CompiledKernel):
        return False
    return _LIB.kz_native_set(key, compiled.func.value, compiled.device.index, code) == 0


def prepared_shapes(key: int) -> int:
    """How many launch shapes the C side has prepared for `key` (-1: none registered)."""
    return int(_LIB.kz_native_prepared(key)) if _LIB else -1
