"""NVRTC through ctypes, compiling exactly as the verifier does.

The verifier (`verifier/src/cuda.rs`: `nvrtc_options`, `nvrtc_image`) compiles each dtype's entry
of a kernel as its own NVRTC program named `"<kernel name> (<dtype>).cu"` with the options

    --gpu-architecture=sm_<major><minor>
    --include-path=<$CUDA_HOME/include, else $CUDA_PATH/include, else /usr/local/cuda/include>
    <the manifest's nvrtc_options...>
    -DKERNELIZE_DTYPE_<DTYPE>

and loads NVRTC's CUBIN (PTX only where NVRTC made none). Its report records, per dtype, those
options and the SHA-256 of the code bytes. This module does the same on the client, so the
client runs the very code that was verified (`torch.cuda._compile_kernel` adds PyTorch's own
flags, `-I` paths and `-D__CUDA_NO_*` macros, and loads PTX that the driver compiles).

Nothing here needs a GPU or PyTorch: `nvrtc_options`, `program_name`, `cuda_include_dir` and
`nvrtc_candidates` are pure; `compile_program` needs only libnvrtc (no CUDA context).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

DEFAULT_CUDA_ROOT = "/usr/local/cuda"

INSTALL_HINT = (
    "kernelize compiles hub kernels with NVRTC (libnvrtc.so.13 or .12), as the verifier does. "
    "Install the CUDA toolkit (and set CUDA_HOME to it; /usr/local/cuda is looked at by default) "
    "or the pip package of NVRTC matching your PyTorch (`pip install nvidia-cuda-nvrtc` for CUDA "
    "13 wheels, `nvidia-cuda-nvrtc-cu12` for CUDA 12), or name the library file in "
    "KERNELIZE_NVRTC=/path/to/libnvrtc.so.13.")


class NvrtcNotFound(RuntimeError):
    """No libnvrtc could be loaded; the message lists where it looked and what to install."""


class NvrtcCompileError(RuntimeError):
    """NVRTC refused the source; the message carries NVRTC's log."""


# ---- the option list (mirrors verifier/src/cuda.rs) ----------------------------------------

def cuda_include_dir(env: Mapping[str, str] | None = None) -> str:
    """NVRTC's include path as the verifier picks it (`verifier::cuda::cuda_include_dir`):
    `$CUDA_HOME/include`, else `$CUDA_PATH/include` (the first that is set and non-empty,
    trailing slashes trimmed), else /usr/local/cuda/include. Whether it exists is not checked."""
    env = os.environ if env is None else env
    for var in ("CUDA_HOME", "CUDA_PATH"):
        v = env.get(var)
        if v:
            return v.rstrip("/") + "/include"
    return DEFAULT_CUDA_ROOT + "/include"


def _arch_pair(arch: str | Sequence[int]) -> tuple[int, int]:
    """(major, minor) of "sm_90", "90", "9.0", (9, 0)."""
    if isinstance(arch, str):
        a = arch.strip()
        if a.startswith("sm_"):
            a = a[3:]
        if "." in a:
            ma, mi = a.split(".", 1)
            return int(ma), int(mi)
        if not a.isdigit() or len(a) < 2:
            raise ValueError(f"architecture `{arch}`: expected sm_XY")
        return int(a[:-1]), int(a[-1])
    ma, mi = arch
    return int(ma), int(mi)


def entry_options(author_options: Sequence[str], dtype: str) -> list[str]:
    """The options of the module holding `dtype`'s entry, as the verifier keys it
    (`kernel_registry::manifest::entry_options`): the author's, then -DKERNELIZE_DTYPE_<DTYPE>."""
    return list(author_options) + [f"-DKERNELIZE_DTYPE_{dtype.upper()}"]


def nvrtc_options(arch: str | Sequence[int], include_dir: str, job_options: Sequence[str]) -> list[str]:
    """Every option NVRTC is given, in order (`verifier::cuda::nvrtc_options`): the real
    architecture, the include path, then the job's options (`entry_options`)."""
    major, minor = _arch_pair(arch)
    return [f"--gpu-architecture=sm_{major}{minor}", f"--include-path={include_dir}",
            *job_options]


def module_options(manifest: Mapping, dtype: str, arch: str | Sequence[int],
                   include_dir: str | None = None) -> list[str]:
    """The full option list of `dtype`'s module of a kernel (what the report's
    `compiled[].options` records)."""
    inc = cuda_include_dir() if include_dir is None else include_dir
    return nvrtc_options(arch, inc, entry_options(manifest.get("nvrtc_options", []), dtype))


def program_name(kernel_name: str, dtype: str) -> str:
    """The NVRTC program name the verifier gives `dtype`'s module (`"{name} ({dtype})"` plus
    `.cu`, verifier/src/gpu.rs and cuda.rs `nvrtc_image`)."""
    return f"{kernel_name} ({dtype}).cu"


# ---- finding libnvrtc -------------------------------------------------------------------------

def include_dir_for_client(env: Mapping[str, str] | None = None,
                           search_paths: Iterable[str] | None = None) -> tuple[str, bool]:
    """(include dir, same as the verifier's): the verifier's `cuda_include_dir()` when it
    exists; else the CUDA headers of the `nvidia` pip packages (a PyTorch from PyPI without a
    toolkit), whose option then differs from the verifier's (the code may still be the same:
    `code_sha256` says)."""
    inc = cuda_include_dir(env)
    if os.path.isdir(inc):
        return inc, True
    paths = list(sys.path if search_paths is None else search_paths)
    for p in dict.fromkeys(x for x in paths if x):
        for sub in ("cu13", "cu12", "cuda_runtime"):
            d = os.path.join(p, "nvidia", sub, "include")
            if os.path.isfile(os.path.join(d, "cuda_bf16.h")):
                return d, False
    return inc, True


def _majors(cuda_major: int | None) -> list[int]:
    out = [cuda_major] if cuda_major else []
    return list(dict.fromkeys(out + [13, 12]))


def nvrtc_candidates(env: Mapping[str, str] | None = None, search_paths: Iterable[str] | None = None,
                     cuda_major: int | None = None) -> list[str]:
    """Where libnvrtc is looked for, in order (files that exist, then bare names for the
    dynamic loader):

    1. `KERNELIZE_NVRTC` (a file): only that;
    2. the CUDA toolkit: `$CUDA_HOME`, `$CUDA_PATH`, /usr/local/cuda, each `lib64/` then `lib/`
       (the toolkit whose `include/` the verifier passes), libnvrtc.so.<major> (PyTorch's CUDA
       major first, then 13, 12), then libnvrtc.so;
    3. the `nvidia` pip packages on `search_paths` (sys.path): `nvidia/cu<major>/lib` (CUDA 13
       wheels) and `nvidia/cuda_nvrtc/lib`;
    4. the loader's path: libnvrtc.so.<major>..., libnvrtc.so (LD_LIBRARY_PATH, ldconfig).
    """
    env = os.environ if env is None else env
    if env.get("KERNELIZE_NVRTC"):
        return [env["KERNELIZE_NVRTC"]]
    majors = _majors(cuda_major)
    names = [f"libnvrtc.so.{m}" for m in majors] + ["libnvrtc.so"]
    files: list[str] = []
    roots = [env.get("CUDA_HOME"), env.get("CUDA_PATH"), DEFAULT_CUDA_ROOT]
    for root in dict.fromkeys(r.rstrip("/") or "/" for r in roots if r):
        for sub in ("lib64", "lib"):
            files += [os.path.join(root, sub, n) for n in names]
    paths = list(sys.path if search_paths is None else search_paths)
    for p in dict.fromkeys(x for x in paths if x):
        for m in majors:
            files.append(os.path.join(p, "nvidia", f"cu{m}", "lib", f"libnvrtc.so.{m}"))
            files.append(os.path.join(p, "nvidia", "cuda_nvrtc", "lib", f"libnvrtc.so.{m}"))
    files = [f for f in dict.fromkeys(files) if os.path.isfile(f)]
    return files + names


@dataclass
class Nvrtc:
    lib: ctypes.CDLL
    path: str
    version: str


_LIB: Nvrtc | None = None
_LIB_LOCK = threading.Lock()


def _torch_cuda_major() -> int | None:
    t = sys.modules.get("torch")
    v = getattr(getattr(t, "version", None), "cuda", None) if t is not None else None
    try:
        return int(str(v).split(".")[0]) if v else None
    except ValueError:
        return None


def _declare(lib: ctypes.CDLL) -> None:
    P, S, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    sigs = {
        "nvrtcVersion": [ctypes.POINTER(I), ctypes.POINTER(I)],
        "nvrtcCreateProgram": [ctypes.POINTER(P), ctypes.c_char_p, ctypes.c_char_p, I,
                               ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)],
        "nvrtcCompileProgram": [P, I, ctypes.POINTER(ctypes.c_char_p)],
        "nvrtcGetProgramLogSize": [P, ctypes.POINTER(S)],
        "nvrtcGetProgramLog": [P, ctypes.c_char_p],
        "nvrtcGetCUBINSize": [P, ctypes.POINTER(S)],
        "nvrtcGetCUBIN": [P, ctypes.c_char_p],
        "nvrtcGetPTXSize": [P, ctypes.POINTER(S)],
        "nvrtcGetPTX": [P, ctypes.c_char_p],
        "nvrtcDestroyProgram": [ctypes.POINTER(P)],
    }
    for name, args in sigs.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, I
    lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [I], ctypes.c_char_p


def load_nvrtc(candidates: Sequence[str] | None = None) -> Nvrtc:
    """The first loadable libnvrtc of `nvrtc_candidates()` (loaded once per process). Raises
    NvrtcNotFound, saying where it looked and what to install."""
    global _LIB
    if candidates is None and _LIB is not None:
        return _LIB
    with _LIB_LOCK:
        if candidates is None and _LIB is not None:
            return _LIB
        cands = list(candidates) if candidates is not None else nvrtc_candidates(cuda_major=_torch_cuda_major())
        errors = []
        for c in cands:
            try:
                lib = ctypes.CDLL(c)
                _declare(lib)
            except (OSError, AttributeError) as e:
                errors.append(f"{c}: {e}")
                continue
            a, b = ctypes.c_int(), ctypes.c_int()
            lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
            try:  # the file the loader picked (for a bare name, or behind symlinks)
                path = _dl_path(lib) or c
            except Exception:  # noqa: BLE001
                path = c
            found = Nvrtc(lib, path, f"{a.value}.{b.value}")
            if candidates is None:
                _LIB = found
            return found
        tried = "\n  ".join(errors) or "(no candidates)"
        raise NvrtcNotFound(f"NVRTC not found. {INSTALL_HINT}\nTried:\n  {tried}")


def _dl_path(lib: ctypes.CDLL) -> str | None:
    """The file a loaded library came from (dladdr on one of its symbols), Linux only."""
    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]
    libdl = ctypes.CDLL(None)
    dladdr = libdl.dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    info = DlInfo()
    addr = ctypes.cast(lib.nvrtcVersion, ctypes.c_void_p)
    if dladdr(addr, ctypes.byref(info)) and info.dli_fname:
        return os.path.realpath(info.dli_fname.decode())
    return None


# ---- compiling --------------------------------------------------------------------------------

@dataclass
class CompiledCode:
    """What NVRTC made of one program: `code` is the CUBIN (or PTX text with its NUL, where
    NVRTC made no CUBIN), exactly as NVRTC returned it; `code_sha256` its SHA-256 (hex)."""
    program_name: str
    options: list[str]
    code_kind: str          # "cubin" | "ptx"
    code: bytes
    code_sha256: str
    nvrtc_version: str
    nvrtc_library: str
    compile_s: float
    log: str = ""
    extra: dict = field(default_factory=dict)


def _err(nv: Nvrtc, res: int) -> str:
    s = nv.lib.nvrtcGetErrorString(res)
    return s.decode() if s else f"NVRTC error {res}"


def compile_program(source: str | bytes, name: str, options: Sequence[str],
                    nv: Nvrtc | None = None) -> CompiledCode:
    """Compile `source` as the NVRTC program `name` with exactly `options`; return the CUBIN
    (PTX where NVRTC made none, as the verifier). Needs no CUDA context."""
    nv = nv or load_nvrtc()
    lib = nv.lib
    src = source.encode("utf-8") if isinstance(source, str) else bytes(source)
    if b"\0" in src:
        raise NvrtcCompileError(f"{name}: the source contains a NUL byte")
    t0 = time.perf_counter()
    prog = ctypes.c_void_p()
    res = lib.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode("utf-8"), 0, None, None)
    if res != 0:
        raise NvrtcCompileError(f"{name}: nvrtcCreateProgram: {_err(nv, res)}")
    try:
        enc = [o.encode("utf-8") for o in options]
        arr = (ctypes.c_char_p * len(enc))(*enc)
        res = lib.nvrtcCompileProgram(prog, len(enc), arr)
        size = ctypes.c_size_t()
        log = ""
        if lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) == 0 and size.value > 1:
            buf = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode("utf-8", "replace")
        if res != 0:
            raise NvrtcCompileError(f"{name}: {_err(nv, res)} (options {list(options)})\n{log}")
        kind = "cubin"
        if lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) != 0 or size.value == 0:
            kind = "ptx"
            res = lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
            if res != 0:
                raise NvrtcCompileError(f"{name}: nvrtcGetPTXSize: {_err(nv, res)}")
        buf = ctypes.create_string_buffer(size.value)
        res = (lib.nvrtcGetCUBIN if kind == "cubin" else lib.nvrtcGetPTX)(prog, buf)
        if res != 0:
            raise NvrtcCompileError(f"{name}: getting the {kind}: {_err(nv, res)}")
        code = buf.raw[:size.value]
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return CompiledCode(name, list(options), kind, code, hashlib.sha256(code).hexdigest(),
                        nv.version, nv.path, time.perf_counter() - t0, log)


def compile_entry(manifest: Mapping, source: str | bytes, dtype: str, arch: str | Sequence[int],
                  include_dir: str | None = None, nv: Nvrtc | None = None) -> CompiledCode:
    """`dtype`'s module of a kernel, compiled as the verifier compiles it for `arch` (include
    path: `include_dir_for_client()` unless given)."""
    if include_dir is None:
        include_dir = include_dir_for_client()[0]
    opts = module_options(manifest, dtype, arch, include_dir)
    return compile_program(source, program_name(manifest["name"], dtype), opts, nv)
