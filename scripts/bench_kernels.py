#!/usr/bin/env python3
"""Compile, check and time every bundled kernel in kernels/ against PyTorch, in one run.

Runs on the GPU machine (python3 with torch; NVRTC and the CUDA driver through ctypes).

  PYTHONUNBUFFERED=1 python3 scripts/bench_kernels.py --out OUTDIR [--quick] [--no-compile-baselines]
      [--only k1,k2] [--kernels-dir DIR]

For every kernel folder: parse kernel.toml (tomllib), compile kernel.cu with NVRTC for this
GPU (--gpu-architecture=sm_XY --include-path=$CUDA_HOME/include + the manifest's
nvrtc_options), launch it per the manifest's launch rule (grid per_row = ceil(rows /
rows_per_block), per_element = ceil(n / (threads * elements_per_thread)), persistent =
k * SM count; dynamic smem = smem_bytes + smem_bytes_per_col * cols).

Checks: every kernel's output is compared bitwise (NaN == NaN) with a torch
reimplementation of docs/reference-semantics.md (row statistics from scripts/eager_order.py's
emulators of eager's orders, explicit roundings; FMA emulated through float64) and with real
PyTorch eager;
mismatch counts are reported. Timing: median of CUDA-event-timed launches with L2 flushed
(a 256 MiB buffer is rewritten) before every launch; GB/s counts inputs read once and
outputs written once; the fraction is of the device-to-device copy bandwidth measured in the
same run. Baselines: eager HF LlamaRMSNorm / Gemma RMSNorm (written out in torch),
F.rms_norm, nn.LayerNorm (F.layer_norm), F.silu, F.gelu (both), silu(g)*u (one tensor and
two: silu_mul), F.gelu(g, tanh)*u, fused add+norm,
and torch.compile of each; each baseline's mismatch count vs eager is reported too.
Outputs: OUT/results.json, OUT/results.csv, OUT/RESULTS.md (markdown tables).
"""
import argparse
import ctypes
import datetime
import glob
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

try:
    import tomllib
except ImportError:  # pragma: no cover
    tomllib = None

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "python"))
import eager_order as EO  # noqa: E402  (the verified CPU emulators of eager's row orders)
# the manifest's launch rule as the client computes it (checked against the hub's)
from kernelize.manifest import launch_dims, parse_manifest_toml  # noqa: E402
DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
ROWWISE = {"rms_norm", "fused_add_rms_norm", "layer_norm"}
# the gated ops: act(gate) * up on two tensors (the activation per op)
GATED = {"silu_mul": "silu", "gelu_tanh_mul": "gelu_tanh"}
EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# NVRTC + driver through ctypes
def _load_lib(names, globs):
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            pass
    for g in globs:
        for p in sorted(glob.glob(g), reverse=True):
            try:
                return ctypes.CDLL(p)
            except OSError:
                pass
    raise OSError(f"cannot load any of {names}")


CUDA_HOME = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
_sp = os.path.dirname(os.path.dirname(torch.__file__))
NVRTC = _load_lib(["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
                  [CUDA_HOME + "/lib64/libnvrtc.so*", _sp + "/nvidia/*/lib/libnvrtc.so*",
                   _sp + "/nvidia/cuda_nvrtc/lib/libnvrtc.so*"])
CUDA = _load_lib(["libcuda.so.1", "libcuda.so"], [])
NVRTC.nvrtcGetErrorString.restype = ctypes.c_char_p


def _cu(r, what):
    if r != 0:
        s = ctypes.c_char_p()
        CUDA.cuGetErrorString(r, ctypes.byref(s))
        raise RuntimeError(f"{what}: CUDA error {r} {s.value.decode() if s.value else ''}")


def nvrtc_compile(src, name, arch, extra):
    prog = ctypes.c_void_p()
    r = NVRTC.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None)
    if r:
        raise RuntimeError(f"nvrtcCreateProgram: {r}")
    opts = [f"--gpu-architecture={arch}".encode(), f"--include-path={CUDA_HOME}/include".encode()]
    opts += [o.encode() for o in extra]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    t0 = time.time()
    r = NVRTC.nvrtcCompileProgram(prog, len(opts), arr)
    dt = time.time() - t0
    n = ctypes.c_size_t()
    NVRTC.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    NVRTC.nvrtcGetProgramLog(prog, log)
    log = log.value.decode(errors="replace")
    if r:
        raise RuntimeError(f"NVRTC failed ({NVRTC.nvrtcGetErrorString(r).decode()}):\n{log[:4000]}")
    NVRTC.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    NVRTC.nvrtcGetCUBIN(prog, cubin)
    NVRTC.nvrtcDestroyProgram(ctypes.byref(prog))
    return cubin.raw, dt, log


class Kernel:
    def __init__(self, d):
        self.dir = d
        with open(os.path.join(d, "kernel.toml"), "rb") as f:
            self.m = tomllib.load(f)
        with open(os.path.join(d, "kernel.toml"), encoding="utf-8") as f:
            self.manifest = parse_manifest_toml(f.read())
        self.name = self.m["name"]
        self.op = self.m["op"]
        self.sem = self.m.get("semantics", "default")
        self.entries = self.m["entry"]
        with open(os.path.join(d, self.m["source"])) as f:
            self.src = f.read()
        self.exact = "KNOWN-DIFFERENT" not in self.m["description"]
        self.funcs = {}
        self.error = None
        self.compile_s = None

    def compile(self, arch):
        cubin, dt, _ = nvrtc_compile(self.src, self.m["source"], arch, self.m.get("nvrtc_options", []))
        self.cubin, self.compile_s = cubin, dt

    def load(self):
        mod = ctypes.c_void_p()
        _cu(CUDA.cuModuleLoadData(ctypes.byref(mod), self.cubin), f"{self.name}: cuModuleLoadData")
        for dt, sym in self.entries.items():
            fn = ctypes.c_void_p()
            _cu(CUDA.cuModuleGetFunction(ctypes.byref(fn), mod, sym.encode()), f"{self.name}: get {sym}")
            self.funcs[dt] = fn

    def dims(self, rows, cols, sms):
        """The manifest's launch rule (kernelize.manifest.launch_dims, the client's: one rule)."""
        grid, block, smem = launch_dims(self.manifest, rows, cols, sms)
        return list(grid), list(block), smem

    def launcher(self, dt, args, rows, cols, sms):
        """Return a zero-argument function launching the kernel on the current stream."""
        grid, block, smem = self.dims(rows, cols, sms)
        fn = self.funcs[dt]
        if smem > 48 * 1024:
            _cu(CUDA.cuFuncSetAttribute(fn, 8, smem), "set max dynamic smem")
        cargs = []
        for a in args:
            if isinstance(a, torch.Tensor):
                cargs.append(ctypes.c_void_p(a.data_ptr()))
            elif isinstance(a, float):
                cargs.append(ctypes.c_float(a))
            else:
                cargs.append(ctypes.c_longlong(a))
        params = (ctypes.c_void_p * len(cargs))(*[ctypes.addressof(c) for c in cargs])
        keep = (cargs, params)

        def go():
            st = torch.cuda.current_stream().cuda_stream
            _cu(CUDA.cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                    smem, ctypes.c_void_p(st), params, None), f"launch {self.name}_{dt}")
            return keep

        return go


# ---------------------------------------------------------------------------------------------
# Reference semantics (docs/reference-semantics.md) in torch
def _fma(a, b, c):
    """fmaf emulated in float64 (exact product; one f64 rounding, then f32: double rounding
    can differ from a true fmaf in rare ties, ~2^-29 per operation)."""
    return (a.double() * b.double() + c.double()).float()


def _f32(v):
    return torch.tensor(v, dtype=torch.float32)


def _np(t):
    return t.float().cpu().numpy()


def _gpu_rsqrt(v):
    """CUDA's rsqrtf (torch.rsqrt on the GPU) of float32 values computed on the CPU."""
    return torch.rsqrt(torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).cuda()).cpu().numpy()


def ref_rows(op, sem, T, inputs, eps):
    """docs/reference-semantics.md through the CPU emulators of eager's orders that
    scripts/eager_order.py checked bit for bit against eager (fmaf exact, rsqrtf on the GPU)."""
    if op == "layer_norm":
        x, w, b = inputs
        y = EO.eager_layer_norm(_np(x), _np(w), _np(b), eps=eps, rsqrt=_gpu_rsqrt)[0]
        return torch.from_numpy(y).cuda().to(T)
    if op == "fused_add_rms_norm":
        x, res, w = inputs
        s = (x.float() + res.float()).to(T)
        return ref_rows("rms_norm", "llama", T, (s, w), eps), s
    x, w = inputs
    rows, cols = x.shape
    h = x.float()
    if sem == "torch":
        y = EO.eager_rms_norm(_np(x), _np(w), eps=eps, rsqrt=_gpu_rsqrt)[0]
        return torch.from_numpy(y).cuda().to(T)
    # the mean order: Reduce.cuh's configuration for this tensor's (rows, cols), each row's
    # start alignment, times MeanOps' factor float(rows) / float(rows * cols)
    cfg = EO.reduce_config(rows, cols)
    assert cfg["ctas_per_output"] == 1, f"cols {cols}: the reference has no multi-block rows"
    var = EO.eager_mean_sq(_np(h), cfg=cfg)
    r = torch.rsqrt(torch.from_numpy(var).cuda() + eps)[:, None]
    if sem == "llama":
        return (w.float() * (h * r).to(T).float()).to(T)
    if sem == "gemma":
        return ((h * r) * (1.0 + w.float())).to(T)
    return ((h * r) * w.float()).to(T)


def ref_act(op, h):
    if op == "silu":
        return h / (1.0 + torch.exp(-h))
    if op == "gelu":
        return (h * 0.5) * (1.0 + torch.erf(h * 0.70710678118654752))
    inner = 0.79788456080286536 * _fma(_f32(0.044715).to(h.device).expand_as(h), (h * h) * h, h)
    return (0.5 * h) * (1.0 + torch.tanh(inner))


def ref_silu_and_mul(T, x, cols):
    g, u = x[:, :cols].float(), x[:, cols:].float()
    s = ref_act("silu", g).to(T)
    return (s.float() * u).to(T)


def ref_gated(op, T, g, u):
    s = ref_act(GATED[op], g.float()).to(T)
    return (s.float() * u.float()).to(T)


# ---------------------------------------------------------------------------------------------
# Eager PyTorch and baselines
def hf_llama_rms(x, w, eps):
    dt = x.dtype
    hs = x.to(torch.float32)
    variance = hs.pow(2).mean(-1, keepdim=True)
    hs = hs * torch.rsqrt(variance + eps)
    return w * hs.to(dt)


def gemma_rms(x, w, eps):
    o = x.float()
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
    o = o * (1.0 + w.float())
    return o.type_as(x)


def torch_rms(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def fused_add_eager(x, res, w, eps):
    s = x + res
    return hf_llama_rms(s, w, eps), s


def layer_norm_eager(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def silu_and_mul_eager(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def silu_mul_eager(g, u):
    return F.silu(g) * u


def gelu_tanh_mul_eager(g, u):
    return F.gelu(g, approximate="tanh") * u


# Liger-Kernel (Triton) when it is importable (a wheel carried to the GPU machine, PYTHONPATH):
# its functional RMSNorm in llama / gemma casting mode and its LayerNorm, as third-party baselines.
try:
    from liger_kernel.transformers import functional as LIGER  # noqa: N812
except Exception:  # pragma: no cover - only on the GPU machine
    LIGER = None


def liger_baselines(key):
    if LIGER is None:
        return []
    if key == ("rms_norm", "llama"):
        return [("Liger RMSNorm (llama)", lambda x, w, eps: LIGER.liger_rms_norm(x, w, eps, 0.0, "llama", False))]
    if key == ("rms_norm", "gemma"):
        return [("Liger RMSNorm (gemma)",
                 lambda x, w, eps: LIGER.liger_rms_norm(x, w, eps, 1.0, "gemma", False))]
    if key[0] == "layer_norm":
        return [("Liger LayerNorm", lambda x, w, b, eps: LIGER.liger_layer_norm(x, w, b, eps))]
    return []


# op/semantics -> (eager fn, [baselines (name, fn)])
def baselines_for(key):
    if key == ("rms_norm", "llama"):
        return hf_llama_rms, [("eager LlamaRMSNorm", hf_llama_rms), ("F.rms_norm", torch_rms)] + liger_baselines(key)
    if key == ("rms_norm", "gemma"):
        return gemma_rms, [("eager GemmaRMSNorm", gemma_rms), ("F.rms_norm", torch_rms)] + liger_baselines(key)
    if key == ("rms_norm", "torch"):
        return torch_rms, [("F.rms_norm", torch_rms)]
    if key[0] == "fused_add_rms_norm":
        return fused_add_eager, [("eager add+LlamaRMSNorm", fused_add_eager)]
    if key[0] == "layer_norm":
        return layer_norm_eager, [("nn.LayerNorm", layer_norm_eager)] + liger_baselines(key)
    if key[0] == "silu":
        return F.silu, [("F.silu", F.silu)]
    if key[0] == "gelu":
        return F.gelu, [("F.gelu", F.gelu)]
    if key[0] == "gelu_tanh":
        return gelu_tanh, [("F.gelu(tanh)", gelu_tanh)]
    if key[0] == "silu_and_mul":
        return silu_and_mul_eager, [("silu(g)*u", silu_and_mul_eager)]
    if key[0] == "silu_mul":
        return silu_mul_eager, [("F.silu(g)*u", silu_mul_eager)]
    if key[0] == "gelu_tanh_mul":
        return gelu_tanh_mul_eager, [("F.gelu(g,tanh)*u", gelu_tanh_mul_eager)]
    raise KeyError(key)


# ---------------------------------------------------------------------------------------------
def bits_mismatch(a, b):
    """Bitwise mismatches, NaN == NaN (any NaN payload)."""
    a, b = a.contiguous(), b.contiguous()
    if a.dtype != b.dtype or a.shape != b.shape:
        return -1
    it = {2: torch.int16, 4: torch.int32}[a.element_size()]
    ne = a.view(it) != b.view(it)
    both_nan = torch.isnan(a) & torch.isnan(b)
    return int((ne & ~both_nan).sum().item())


def make_inputs(op, T, rows, cols, gen, inject=False):
    dev = "cuda"

    def rn(*s, scale=1.0, off=0.0):
        return (torch.randn(*s, generator=gen, device=dev, dtype=torch.float32) * scale + off).to(T)

    if op in ("rms_norm", "fused_add_rms_norm", "layer_norm"):
        x = rn(rows, cols, off=(3.0 if op == "layer_norm" else 0.0))
        if inject and rows >= 4:
            x[1, cols // 2] = float("nan")
            x[2, 0] = float("inf")
            x[3].fill_(0.0)
        w = rn(cols, scale=0.5, off=1.0)
        if op == "rms_norm":
            return (x, w)
        if op == "fused_add_rms_norm":
            return (x, rn(rows, cols), w)
        return (x, w, rn(cols, scale=0.1))
    if op == "silu_and_mul":
        x = rn(rows, 2 * cols, scale=2.0)
        if inject:
            x.view(-1)[:: max(1, x.numel() // 7)] = float("inf")
        return (x,)
    if op in GATED:
        g, u = rn(rows, cols, scale=2.0), rn(rows, cols, scale=2.0)
        if inject:
            g.view(-1)[:: max(1, g.numel() // 7)] = float("inf")
            u.view(-1)[1:: max(1, u.numel() // 5)] = float("nan")
        return (g, u)
    x = rn(rows * cols, scale=3.0)
    if inject:
        x[:: max(1, x.numel() // 5)] = float("nan")
        x[1:: max(1, x.numel() // 5)] = float("-inf")
        x[2:: max(1, x.numel() // 5)] = -100.0
    return (x,)


def kernel_call(k, dt, inputs, rows, cols, sms, out=None, res=None):
    """Set up a launch. Returns (launch fn, outputs tuple)."""
    op = k.op
    T = inputs[0].dtype
    if op in ("rms_norm", "layer_norm"):
        out = torch.empty(rows, cols, device="cuda", dtype=T) if out is None else out
        args = [out, *inputs, rows, cols, EPS]
        return k.launcher(dt, args, rows, cols, sms), (out,)
    if op == "fused_add_rms_norm":
        x, r0, w = inputs
        res = r0.clone() if res is None else res
        out = torch.empty(rows, cols, device="cuda", dtype=T) if out is None else out
        return k.launcher(dt, [out, res, x, w, rows, cols, EPS], rows, cols, sms), (out, res)
    if op == "silu_and_mul":
        out = torch.empty(rows, cols, device="cuda", dtype=T) if out is None else out
        return k.launcher(dt, [out, inputs[0], rows, cols], rows, cols, sms), (out,)
    if op in GATED:
        out = torch.empty(rows, cols, device="cuda", dtype=T) if out is None else out
        return k.launcher(dt, [out, inputs[0], inputs[1], rows, cols], rows, cols, sms), (out,)
    n = rows * cols
    out = torch.empty(n, device="cuda", dtype=T) if out is None else out
    return k.launcher(dt, [out, inputs[0], n], 1, n, sms), (out,)


def reference(op, sem, T, inputs, rows, cols):
    if op in ("rms_norm", "layer_norm"):
        return (ref_rows(op, sem, T, inputs, EPS),)
    if op == "fused_add_rms_norm":
        y, s = ref_rows(op, sem, T, inputs, EPS)
        return (y, s)
    if op == "silu_and_mul":
        return (ref_silu_and_mul(T, inputs[0], cols),)
    if op in GATED:
        return (ref_gated(op, T, *inputs),)
    return (ref_act(op, inputs[0].float()).to(T),)


def eager_out(op, sem, inputs, cols):
    fn, _ = baselines_for((op, sem))
    if op in ("rms_norm", "layer_norm"):
        return (fn(*inputs, EPS),)
    if op == "fused_add_rms_norm":
        y, s = fn(*inputs, EPS)
        return (y, s)
    if op in GATED:
        return (fn(*inputs),)
    return (fn(inputs[0]),)


def baseline_fn(op, fn, inputs):
    if op in ("rms_norm", "layer_norm"):
        return lambda: fn(*inputs, EPS)
    if op == "fused_add_rms_norm":
        return lambda: fn(*inputs, EPS)
    if op in GATED:
        return lambda: fn(*inputs)
    return lambda: fn(inputs[0])


def nbytes(op, T, rows, cols):
    e = torch.tensor([], dtype=T).element_size()
    if op == "rms_norm":
        return e * (2 * rows * cols + cols)
    if op == "fused_add_rms_norm":
        return e * (4 * rows * cols + cols)
    if op == "layer_norm":
        return e * (2 * rows * cols + 2 * cols)
    if op == "silu_and_mul" or op in GATED:
        return e * 3 * rows * cols
    return e * 2 * rows * cols


class Timer:
    def __init__(self, reps):
        self.reps = reps
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def __call__(self, fn, reps=None):
        reps = reps or self.reps
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for s, e in ev:
            self.flush.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        ts = sorted(s.elapsed_time(e) * 1000.0 for s, e in ev)
        return ts[len(ts) // 2]


def copy_bandwidth(timer):
    n = 1 << 29  # 1 GiB of bytes moved each way
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    us = timer(lambda: b.copy_(a), reps=20)
    return 2 * n / (us * 1e-6) / 1e9, us


def env_info():
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "cuda_torch": torch.version.cuda,
            "device": torch.cuda.get_device_name(), "python": platform.python_version()}
    p = torch.cuda.get_device_properties(0)
    info["sm_count"] = p.multi_processor_count
    info["capability"] = f"sm_{p.major}{p.minor}"
    try:
        info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:  # noqa
        info["driver"] = f"? ({e})"
    try:
        v = ctypes.c_int()
        NVRTC.nvrtcVersion(ctypes.byref(v), ctypes.byref(ctypes.c_int()))
        a, b = ctypes.c_int(), ctypes.c_int()
        NVRTC.nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
        info["nvrtc"] = f"{a.value}.{b.value}"
        d = ctypes.c_int()
        CUDA.cuDriverGetVersion(ctypes.byref(d))
        info["cuda_driver_api"] = f"{d.value // 1000}.{(d.value % 1000) // 10}"
    except Exception as e:  # noqa
        info["nvrtc"] = f"? ({e})"
    return info


# ---------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--quick", action="store_true", help="few shapes, bf16 only")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--no-compile-baselines", action="store_true")
    ap.add_argument("--compile-dtypes", default="bf16", help="dtypes for torch.compile baselines")
    ap.add_argument("--only", default="", help="comma list of kernel names")
    ap.add_argument("--full-checks", action="store_true", help="with --quick: the full set of bitwise check shapes")
    ap.add_argument("--shapes", default="", help="with --quick: bf16 timing shapes, e.g. 4096x8192,32768x4096")
    ap.add_argument("--kernels-dir", default=os.path.join(ROOT, "kernels"),
                    help="the kernel folders to run (e.g. an older release's, to compare timings)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    info = env_info()
    info["command"] = " ".join(sys.argv)
    print("env:", json.dumps(info))
    sms = info["sm_count"]
    arch = info["capability"]

    kernels = []
    for d in sorted(glob.glob(os.path.join(args.kernels_dir, "*", "kernel.toml"))):
        try:
            k = Kernel(os.path.dirname(d))
            if args.only and k.name not in args.only.split(","):
                continue
            kernels.append(k)
        except Exception as e:  # noqa
            print(f"MANIFEST ERROR {d}: {e}")

    def comp(k):
        try:
            k.compile(arch)
        except Exception as e:  # noqa
            k.error = f"compile: {e}"
        return k

    with ThreadPoolExecutor(max_workers=min(16, len(kernels) or 1)) as ex:
        list(ex.map(comp, kernels))
    for k in kernels:
        if k.error is None:
            try:
                k.load()
            except Exception as e:  # noqa
                k.error = f"load: {e}"
        print(f"compiled {k.name:22s} {'OK' if k.error is None else 'FAILED'} "
              f"{(k.compile_s or 0):.1f}s {k.error or ''}")
    print(f"[{time.time() - t_start:.0f}s] compiled")

    timer = Timer(args.reps)
    bw, bw_us = copy_bandwidth(timer)
    info["copy_gbps"] = bw
    print(f"copy bandwidth {bw:.0f} GB/s (1 GiB d2d copy, {bw_us:.0f} us)")

    gen = torch.Generator(device="cuda")
    seed = int(time.time()) & 0xFFFFFFFF
    gen.manual_seed(seed)
    info["seed"] = seed
    records = {"env": info, "checks": [], "timings": [], "errors": []}

    # ---- 1. bitwise checks on odd shapes (incl. NaN/Inf injected) --------------------------
    row_shapes = [(7, 1), (33, 127), (11, 300), (64, 1000), (17, 2048), (9, 2049), (13, 4000), (6, 5120), (4, 8200),
                  (3, 16384), (3, 20000), (2, 40000), (1, 65536)]
    ew_shapes = [(1, 1), (1, 1000), (1, 12291), (3, 4097), (1, (1 << 20) + 5)]
    sam_shapes = [(1, 1), (7, 127), (64, 1000), (33, 4096), (5, 11008)]
    if args.quick and not args.full_checks:
        row_shapes = [(33, 127), (64, 1000), (9, 2049), (3, 20000)]
        ew_shapes = [(1, 1000), (3, 4097)]
        sam_shapes = [(7, 127), (33, 4096)]
    for k in kernels:
        if k.error:
            continue
        shapes = (row_shapes if k.op in ROWWISE else
                  sam_shapes if k.op == "silu_and_mul" or k.op in GATED else ew_shapes)
        for dt in k.entries:
            T = DT[dt]
            tot = {"kernel": k.name, "op": k.op, "semantics": k.sem, "dtype": dt, "exact_claim": k.exact,
                   "cases": 0, "elements": 0, "mismatch_ref": 0, "mismatch_eager": 0, "ref_vs_eager": 0,
                   "failed_shapes": []}
            for (rows, cols) in shapes:
                for inject in (False, True):
                    try:
                        inp = make_inputs(k.op, T, rows, cols, gen, inject=inject)
                        outs = None
                        go, outs = kernel_call(k, dt, inp, rows, cols, sms)
                        for o in outs[:1]:
                            o.fill_(-7777.0)
                        go()
                        torch.cuda.synchronize()
                        ref = reference(k.op, k.sem, T, inp, rows, cols)
                        eag = eager_out(k.op, k.sem, inp, cols)
                        mm = sum(bits_mismatch(o.reshape(r.shape), r) for o, r in zip(outs, ref))
                        me = sum(bits_mismatch(o.reshape(r.shape), r) for o, r in zip(outs, eag))
                        re_ = sum(bits_mismatch(a, b.reshape(a.shape)) for a, b in zip(ref, eag))
                        tot["cases"] += 1
                        tot["elements"] += outs[0].numel()
                        tot["mismatch_ref"] += mm
                        tot["mismatch_eager"] += me
                        tot["ref_vs_eager"] += re_
                        if mm:
                            tot["failed_shapes"].append(f"{rows}x{cols}{'+naninf' if inject else ''}:{mm}")
                    except Exception as e:  # noqa
                        msg = f"check {k.name} {dt} {rows}x{cols}: {e}"
                        print("ERROR", msg)
                        records["errors"].append(msg + "\n" + traceback.format_exc()[-1500:])
                        tot["failed_shapes"].append(f"{rows}x{cols}:ERROR")
            records["checks"].append(tot)
            print(f"check {k.name:22s} {dt:4s} cases {tot['cases']:3d} elems {tot['elements']:9d} "
                  f"mismatch vs ref {tot['mismatch_ref']:8d} vs eager {tot['mismatch_eager']:8d} "
                  f"(ref vs eager {tot['ref_vs_eager']}) {' '.join(tot['failed_shapes'][:4])}")
    print(f"[{time.time() - t_start:.0f}s] checks done")

    # ---- 2. timings ------------------------------------------------------------------------
    if args.quick:
        sweep = {"bf16": [(1024, 4096), (4096, 8192), (32768, 4096)]}
        if args.shapes:
            sweep = {"bf16": [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")]}
    else:
        sweep = {"bf16": [(1, 4096), (128, 4096), (1024, 4096), (4096, 8192), (32768, 4096),
                          (32768, 128), (16384, 768), (8192, 2048), (8192, 5120), (2048, 16384),
                          (256, 65536)],
                 "f16": [(1024, 4096), (4096, 8192), (32768, 4096)],
                 "f32": [(1024, 4096), (4096, 8192), (32768, 4096)]}
    groups = {}
    for k in kernels:
        groups.setdefault((k.op, k.sem), []).append(k)
    compiled_cache = {}
    cdts = set(args.compile_dtypes.split(","))
    try:
        import importlib
        importlib.import_module("torch._dynamo").config.cache_size_limit = 256
    except Exception:  # noqa
        pass
    for dt, shapes in sweep.items():
        T = DT[dt]
        for (rows, cols) in shapes:
            for key, ks in groups.items():
                op, sem = key
                try:
                    inp = make_inputs(op, T, rows, cols, gen)
                except Exception as e:  # noqa
                    records["errors"].append(f"inputs {key} {rows}x{cols}: {e}")
                    continue
                nb = nbytes(op, T, rows, cols)
                eag = eager_out(op, sem, inp, cols)
                _, bls = baselines_for(key)
                cands = []
                for name, fn in bls:
                    cands.append((name, "baseline", baseline_fn(op, fn, inp), lambda fn=fn, inp=inp: eager_out_with(op, fn, inp)))
                    if dt in cdts and not args.no_compile_baselines and not name.startswith("Liger"):
                        ck = (name, key)
                        if ck not in compiled_cache:
                            compiled_cache[ck] = torch.compile(fn)
                        cf = compiled_cache[ck]
                        cands.append((f"torch.compile({name})", "baseline", baseline_fn(op, cf, inp),
                                      lambda cf=cf, inp=inp: eager_out_with(op, cf, inp)))
                for k in ks:
                    if k.error or dt not in k.entries:
                        continue
                    go, outs = kernel_call(k, dt, inp, rows, cols, sms)
                    cands.append((k.name, "exact" if k.exact else "variant", go, outs))
                for name, kind, fn, outs in cands:
                    rec = {"dtype": dt, "rows": rows, "cols": cols, "op": op, "semantics": sem,
                           "impl": name, "kind": kind, "bytes": nb}
                    try:
                        if callable(outs):  # baseline: run once for its output
                            o = outs()
                            torch.cuda.synchronize()
                        else:
                            if op == "fused_add_rms_norm":
                                outs[1].copy_(inp[1])
                            fn()
                            torch.cuda.synchronize()
                            o = outs
                        rec["mismatch_vs_eager"] = sum(bits_mismatch(a.reshape(b.shape), b) for a, b in zip(o, eag))
                        us = timer(fn)
                        rec["us"] = us
                        rec["gbps"] = nb / (us * 1e-6) / 1e9
                        rec["frac_copy"] = rec["gbps"] / bw
                    except Exception as e:  # noqa
                        rec["error"] = str(e)[:500]
                        records["errors"].append(f"time {name} {dt} {rows}x{cols}: {e}\n{traceback.format_exc()[-1500:]}")
                    records["timings"].append(rec)
                done = [r for r in records["timings"] if r["dtype"] == dt and r["rows"] == rows
                        and r["cols"] == cols and r["op"] == op and r["semantics"] == sem and "us" in r]
                bb = _best_baseline(done)
                brief = " ".join(f"{r['impl']}={r['us']:.1f}" for r in done if r["kind"] != "baseline")
                print(f"[{time.time() - t_start:.0f}s] timed {dt} {rows}x{cols} {op}/{sem}: {brief} | best baseline "
                      f"{(bb['impl'] + '=' + format(bb['us'], '.1f')) if bb else '-'} | copy {bw:.0f} GB/s")
                del inp, eag
            torch.cuda.empty_cache()

    # ---- 3. outputs ------------------------------------------------------------------------
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(records, f, indent=1)
    keys = ["dtype", "rows", "cols", "op", "semantics", "impl", "kind", "us", "gbps", "frac_copy",
            "mismatch_vs_eager", "bytes", "error"]
    with open(os.path.join(args.out, "results.csv"), "w") as f:
        f.write(",".join(keys) + "\n")
        for r in records["timings"]:
            f.write(",".join(str(r.get(k, "")) for k in keys) + "\n")
    md = render_md(records)
    with open(os.path.join(args.out, "RESULTS.md"), "w") as f:
        f.write(md)
    print()
    print(short_table(records))
    print(f"[{time.time() - t_start:.0f}s] done; errors: {len(records['errors'])}")


def eager_out_with(op, fn, inp):
    if op in ("rms_norm", "layer_norm"):
        return (fn(*inp, EPS),)
    if op == "fused_add_rms_norm":
        y, s = fn(*inp, EPS)
        return (y, s)
    if op in GATED:
        return (fn(*inp),)
    return (fn(inp[0]),)


def _best_baseline(rs):
    b = [r for r in rs if r["kind"] == "baseline" and "us" in r]
    return min(b, key=lambda r: r["us"]) if b else None


def render_md(rec):
    e = rec["env"]
    out = [f"Device: {e['device']} ({e['capability']}, {e['sm_count']} SMs), driver {e.get('driver')}, "
           f"CUDA driver API {e.get('cuda_driver_api')}, NVRTC {e.get('nvrtc')}, torch {e['torch']} "
           f"(CUDA {e['cuda_torch']}), python {e['python']}; date {e['date']}; seed {e['seed']}.",
           f"Command: `{e['command']}`", "",
           f"Copy bandwidth (1 GiB device-to-device, read + write): **{e['copy_gbps']:.0f} GB/s**.", "",
           "## Bitwise checks (odd shapes, with and without NaN/Inf injected)", "",
           "| kernel | dtype | claims exact | cases | elements | mismatches vs reference semantics | vs real eager | reference vs eager | failing shapes |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in rec["checks"]:
        out.append(f"| {c['kernel']} | {c['dtype']} | {'yes' if c['exact_claim'] else 'no (variant)'} | {c['cases']} | "
                   f"{c['elements']} | {c['mismatch_ref']} | {c['mismatch_eager']} | {c['ref_vs_eager']} | "
                   f"{' '.join(c['failed_shapes'][:6])} |")
    out += ["", "## Timings (median us, L2 flushed; GB/s = inputs read once + outputs written once; "
            "frac = of copy bandwidth; mism = elements differing bitwise from eager)", ""]
    by = {}
    for r in rec["timings"]:
        by.setdefault((r["dtype"], r["op"], r["semantics"], r["rows"], r["cols"]), []).append(r)
    out.append("| dtype | op/semantics | shape | impl | kind | us | GB/s | frac copy | mism vs eager | vs fastest baseline |")
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key in sorted(by, key=lambda k: (["bf16", "f16", "f32"].index(k[0]), k[1], k[2], k[3] * k[4], k[3])):
        rs = by[key]
        best = _best_baseline(rs)
        for r in rs:
            if "us" not in r:
                out.append(f"| {key[0]} | {key[1]}/{key[2]} | {key[3]}x{key[4]} | {r['impl']} | {r['kind']} | ERROR | | | | {r.get('error', '')[:80]} |")
                continue
            rel = f"{best['us'] / r['us']:.2f}x" if best and r["kind"] != "baseline" else ""
            out.append(f"| {key[0]} | {key[1]}/{key[2]} | {key[3]}x{key[4]} | {r['impl']} | {r['kind']} | {r['us']:.1f} | "
                       f"{r['gbps']:.0f} | {r['frac_copy']:.2f} | {r.get('mismatch_vs_eager', '')} | {rel} |")
    if rec["errors"]:
        out += ["", "## Errors", ""] + ["```\n" + x[:1500] + "\n```" for x in rec["errors"][:30]]
    return "\n".join(out) + "\n"


def short_table(rec):
    lines = ["SUMMARY exact kernels (bf16 first): shape, us, frac of copy, fastest baseline us (name), speedup"]
    by = {}
    for r in rec["timings"]:
        by.setdefault((r["dtype"], r["op"], r["semantics"], r["rows"], r["cols"]), []).append(r)
    for key in sorted(by, key=lambda k: (["bf16", "f16", "f32"].index(k[0]), k[1], k[2], k[3] * k[4])):
        rs = by[key]
        best = _best_baseline(rs)
        for r in rs:
            if r["kind"] != "exact" or "us" not in r:
                continue
            b = f"{best['us']:.1f} ({best['impl'][:28]})" if best else "-"
            sp = f"{best['us'] / r['us']:.2f}x" if best else ""
            lines.append(f"{key[0]} {r['impl'][:20]:20s} {key[3]:>5}x{key[4]:<5} {r['us']:8.1f} {r['frac_copy']:.2f} "
                         f"mism {r.get('mismatch_vs_eager')} | best {b} {sp}")
    lines.append("CHECKS: kernel dtype mismatches_vs_ref mismatches_vs_eager")
    for c in rec["checks"]:
        lines.append(f"{c['kernel']} {c['dtype']} {c['mismatch_ref']} {c['mismatch_eager']} ({c['elements']} elems)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
