#!/usr/bin/env python3
"""Issue 30, first slice: does kernels/rms_norm_llama_backward/kernel.cu give eager autograd's
bits for HF LlamaRMSNorm's dx and dw, and how fast is it? Also checks the CPU emulation
(python/kernelize/backward.py) against eager on small shapes, so a mismatch says whether the
order model or the kernel is wrong. `--semantics gemma` does the same for HF GemmaRMSNorm
(Gemma, Gemma2, Gemma3): kernels/rms_norm_gemma_backward/kernel.cu, the emulation
gemma_rms_norm_backward, weights drawn around 0, the bundled forward kernels/rms_norm_gemma;
its output file is backward_probe_gemma.json.

On the GPU machine (torch with CUDA; NVRTC through kernelize/nvrtc.py, the driver through
kernelize/launch.py, as the client does):

    PYTHONUNBUFFERED=1 python3 scripts/backward_probe.py OUT_DIR [--quick] [--compile] [--semantics gemma]

On a machine without a GPU, `--dry-run` runs the same code paths on the CPU far enough to catch
Python errors: eager autograd on the CPU, the emulation in place of the kernel, wall-clock
timing, NVRTC compiles the source if a libnvrtc is found (no launch). Its numbers mean nothing.

For every dtype (bf16, f16, f32) and shape rows x cols (rows in 1..16384, cols in 1024..8192):
eager autograd of the HF module (its code, copied below), then the kernel's three launches;
reported: elements of dx and dw that differ bitwise from eager's (and from the emulation where
it runs). Timing (CUDA events, median): eager fwd+bwd vs the bundled exact forward
(kernels/rms_norm_llama) + this backward, at 4096x8192 and 16384x4096. Writes
OUT_DIR/backward_probe.json and prints a table. Budget: under 5 minutes on an H100.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import statistics
import sys
import time
import traceback

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from kernelize import backward as B  # noqa: E402
from kernelize import nvrtc as NV  # noqa: E402

KSRC = os.path.join(ROOT, "kernels", "rms_norm_llama_backward", "kernel.cu")
FWD_DIR = os.path.join(ROOT, "kernels", "rms_norm_llama")
GEMMA_KSRC = os.path.join(ROOT, "kernels", "rms_norm_gemma_backward", "kernel.cu")
GEMMA_FWD_DIR = os.path.join(ROOT, "kernels", "rms_norm_gemma")
DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
ROWS = [1, 2, 3, 4, 7, 8, 15, 16, 17, 32, 64, 128, 1000, 4096, 16384]
COLS = [1024, 2048, 2560, 4096, 5120, 8192]
TIMED = [(4096, 8192), (16384, 4096)]
EPS = 1e-6
EMU_MAX_ELEMS = 300_000   # the CPU emulation runs where rows * cols is at most this
HYP_ROW_MAX = 8_400_000   # the row-sum hypotheses (eager's s from a hook) up to this many elements
HYP_COL_MAX = 16_800_000  # the column-sum hypotheses (eager's dw) up to this many elements
BUDGET_S = 270.0


class LlamaRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm, verbatim in its arithmetic."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states, r_hook=None):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        r = torch.rsqrt(variance + self.variance_epsilon)
        if r_hook is not None and r.requires_grad:
            r.register_hook(r_hook)  # sees the gradient of r (the row sum s); changes nothing
        hidden_states = hidden_states * r
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(torch.nn.Module):
    """transformers' GemmaRMSNorm (Gemma2RMSNorm and Gemma3RMSNorm are the same code), verbatim in
    its arithmetic; `r_hook` as LlamaRMSNorm's."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(dim))

    def _norm(self, x, r_hook=None):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if r_hook is not None and r.requires_grad:
            r.register_hook(r_hook)
        return x * r

    def forward(self, x, r_hook=None):
        output = self._norm(x.float(), r_hook)
        # Llama does x.to(float16) * w whilst Gemma is (x * w).to(float16)
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


# What --semantics picks: the module, the kernel (source, symbol prefix), the emulation, the
# weights' centre (Gemma multiplies by 1 + w: its weights sit around 0), the bundled forward.
SEMANTICS = {
    "llama": dict(module=LlamaRMSNorm, ksrc=KSRC, name="rms_norm_llama_backward", prefix="rms_norm_llama_bwd_",
                  emulate=B.llama_rms_norm_backward, w_center=1.0, fwd_dir=FWD_DIR, fwd="rms_norm_llama",
                  out="backward_probe.json"),
    "gemma": dict(module=GemmaRMSNorm, ksrc=GEMMA_KSRC, name="rms_norm_gemma_backward", prefix="rms_norm_gemma_bwd_",
                  emulate=B.gemma_rms_norm_backward, w_center=0.0, fwd_dir=GEMMA_FWD_DIR, fwd="rms_norm_gemma",
                  out="backward_probe_gemma.json"),
}
SEM = SEMANTICS["llama"]  # main() sets it from --semantics


def graph_names(fn, depth=0, seen=None):
    """The autograd graph under `fn`, as nested names (what eager runs backward)."""
    seen = set() if seen is None else seen
    if fn is None or depth > 20:
        return None
    name = type(fn).__name__
    if id(fn) in seen:
        return name + " (seen)"
    seen.add(id(fn))
    kids = [graph_names(f, depth + 1, seen) for f, _ in fn.next_functions if f is not None]
    return {name: kids} if kids else name


# ---- the kernel's launches -----------------------------------------------------------------------

class CudaModule:
    """A CUDA source compiled by NVRTC for `device`'s sm (kernelize/nvrtc.py), loaded into
    PyTorch's context, its `entries` looked up (kernelize/launch.py); `launch` runs one with
    cuLaunchKernel on the current stream. Shared by the backward probes (this one and
    ln_backward_probe.py)."""

    def __init__(self, src: str, name: str, device: torch.device, entries, options: tuple = ()):
        from kernelize import launch as L
        self.L = L
        self.device = device
        major, minor = torch.cuda.get_device_capability(device)
        inc = NV.include_dir_for_client()[0]
        self.code = NV.compile_program(src, name, [f"--gpu-architecture=sm_{major}{minor}", f"--include-path={inc}",
                                                   *options])
        self.module = L._load_module(self.code.code, device)
        self.lib = L._libcuda()
        self.launch_fn = L._cu_launch(self.lib)
        self.funcs = {}
        for e in entries:
            f = ctypes.c_void_p()
            L._check(self.lib, self.lib.cuModuleGetFunction(ctypes.byref(f), self.module, e.encode()), e)
            self.funcs[e] = f

    def launch(self, entry: str, grid, block, args) -> None:
        """`entry` with grid and block (an int or up to 3 dims) and `args` packed as the ABI
        takes them: a tensor as its data pointer, a Python float as float, an int as long long."""
        vals = []
        for a in args:
            if isinstance(a, torch.Tensor):
                vals.append(ctypes.c_void_p(a.data_ptr()))
            elif isinstance(a, float):
                vals.append(ctypes.c_float(a))
            elif isinstance(a, (int, np.integer)) and not isinstance(a, bool):
                vals.append(ctypes.c_longlong(a))
            else:
                raise TypeError(f"launching {entry}: no ABI type for {type(a).__name__}")
        argv = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        g, b = ([int(v) for v in d] if isinstance(d, (tuple, list)) else [int(d)] for d in (grid, block))
        g, b = g + [1] * (3 - len(g)), b + [1] * (3 - len(b))
        stream = torch.cuda.current_stream(self.device).cuda_stream
        res = self.launch_fn(self.funcs[entry], *g, *b, 0, stream, argv, None)
        if res != 0:
            self.L._check(self.lib, res, f"launching {entry}")


class GpuBackward:
    """The three entries of one dtype, compiled by NVRTC for this GPU, launched with cuLaunchKernel."""

    def __init__(self, dt: str, device: torch.device, defines: tuple = (), src_path: str | None = None):
        self.dt = dt
        props = torch.cuda.get_device_properties(device)
        self.sms = props.multi_processor_count
        self.tps = getattr(props, "max_threads_per_multi_processor", 2048)
        src = open(src_path or SEM["ksrc"], encoding="utf-8").read()
        self.prefix = SEM["prefix"]
        self.mod = CudaModule(src, f"{SEM['name']} ({dt}).cu", device,
                              [f"{self.prefix}{e}_{dt}" for e in ("dx", "dwp", "dw")], defines)
        self.code = self.mod.code
        self.device = device

    def resources(self) -> dict:
        """Registers a thread and local (spilled) bytes a thread of each entry, as the driver
        loaded them (cuFuncGetAttribute)."""
        out = {}
        for e, f in self.mod.funcs.items():
            vals = {}
            for key, attr in (("regs", 4), ("local_bytes", 3)):  # CU_FUNC_ATTRIBUTE_NUM_REGS, _LOCAL_SIZE_BYTES
                v = ctypes.c_int()
                self.mod.lib.cuFuncGetAttribute(ctypes.byref(v), attr, f)
                vals[key] = v.value
            out[e.removeprefix(self.prefix).removesuffix(f"_{self.dt}")] = vals
        return out

    def _go(self, name, grid, block, args):
        self.mod.launch(f"{self.prefix}{name}_{self.dt}", grid, block, args)

    def plan(self, rows, cols):
        rc = B.row_config(rows, cols)
        G = max(rc["lanes"], 32)
        rpb = 512 // G
        cc = B.col_config(rows, cols, self.sms, self.tps)
        Y = cc["bh"] if cc["split"] else 1
        VC = 4 if cols % 4 == 0 else 1
        CT = 1 if Y >= 128 else 128 // Y
        items = B.cdiv(cols, CT * VC) * cc["ctas"]
        return dict(dx_grid=min(B.cdiv(rows, rpb), self.sms * 8), dx_grid_max=B.cdiv(rows, rpb),
                    dwp_grid=min(items, self.sms * 16),
                    dw_grid=B.cdiv(cols, 128), ctas=cc["ctas"], row=rc, col=cc)

    def __call__(self, dy, x, w, eps, plan=None, which="all", ws=None):
        """The three launches (which="all"), or only dx's ("dx") or only dw's two ("dw", given the
        ws of an earlier call: for timing the parts)."""
        rows, cols = x.shape
        p = plan or self.plan(rows, cols)
        dx = torch.empty_like(x) if which != "dw" else None
        dw = torch.empty_like(w) if which != "dx" else None
        if ws is None:
            ws = torch.empty(rows + p["ctas"] * cols, dtype=torch.float32, device=x.device)
        if which in ("all", "dx"):
            self._go("dx", p["dx_grid"], 512, (dx, ws, dy, x, w, rows, cols, float(eps)))
        if which in ("all", "dw"):
            self._go("dwp", p["dwp_grid"], 128, (ws, dy, x, rows, cols, self.sms, self.tps))
            self._go("dw", p["dw_grid"], 128, (dw, ws, rows, cols, self.sms, self.tps))
        self.last_ws = ws
        return dx, dw


class CpuStandIn:
    """--dry-run: the emulation in place of the kernel (CPU tensors)."""

    sms, tps = 132, 2048

    def __init__(self, dt):
        self.dt = dt

    def plan(self, rows, cols):
        return dict(row=B.row_config(rows, cols), col=B.col_config(rows, cols, self.sms, self.tps))

    def __call__(self, dy, x, w, eps, plan=None):
        dx, dw = SEM["emulate"](x.float().numpy(), w.float().numpy(), dy.float().numpy(), eps, self.dt,
                                num_sms=self.sms, max_threads_per_sm=self.tps)
        T = DT[self.dt]
        return torch.from_numpy(dx).to(T), torch.from_numpy(dw).to(T)


def bundled_forward(dt, device):
    """The bundled exact forward (kernels/rms_norm_llama, for gemma kernels/rms_norm_gemma), or None
    with the reason."""
    try:
        from kernelize import launch as L
        from kernelize.manifest import parse_manifest_toml
        man = parse_manifest_toml(open(os.path.join(SEM["fwd_dir"], "kernel.toml"), encoding="utf-8").read())
        src = open(os.path.join(SEM["fwd_dir"], man["source"]), encoding="utf-8").read()
        k = L.CompiledKernel(man, src, dt, device)
        return (lambda x, w, eps: L.run_rms_norm(k, x, w, eps)), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


# ---- comparisons -----------------------------------------------------------------------------------

def same_device(a: torch.Tensor, b: torch.Tensor):
    """a, b detached and contiguous, on the CPU unless both are on one device (compared there)."""
    if a.device != b.device:
        a, b = a.cpu(), b.cpu()
    return a.detach().contiguous(), b.detach().contiguous()


def ndiff(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ (NaN payloads compared as bits too). The backward probes' one
    comparison (ln_backward_probe and gated_backward_probe import it)."""
    a, b = same_device(a, b)
    if a.dtype == torch.float32:
        return int((a.view(torch.int32) != b.view(torch.int32)).sum().item())
    return int((a.view(torch.int16) != b.view(torch.int16)).sum().item())


def np32(t: torch.Tensor):
    """`t` as a float32 numpy array on the CPU (an emulation's input or a kernel's output)."""
    return t.detach().float().cpu().numpy()


def bits_diff(a, b) -> int:
    """Elements whose float32 bits differ between two arrays (numpy, or anything numpy takes):
    `ndiff` for the emulations, which compute in float32 on the host."""
    return int(np.count_nonzero(np.asarray(a, np.float32).view(np.uint32)
                                != np.asarray(b, np.float32).view(np.uint32)))


def max_ulp(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance in units in the last place of T between a and b, as ordered integers
    of T's bit patterns (-0 and +0 one apart from the smallest subnormals, not 2^31)."""
    a, b = same_device(a, b)
    if a.numel() == 0:
        return 0
    if a.dtype == torch.float32:
        ia, ib = a.view(torch.int32).to(torch.int64), b.view(torch.int32).to(torch.int64)
        mask = 0x7FFFFFFF
    else:
        ia, ib = a.view(torch.int16).to(torch.int64), b.view(torch.int16).to(torch.int64)
        ia, ib = ia & 0xFFFF, ib & 0xFFFF
        mask = 0x7FFF
        ia = torch.where(ia >= 0x8000, -(ia & mask), ia)
        ib = torch.where(ib >= 0x8000, -(ib & mask), ib)
        return int((ia - ib).abs().max().item())
    oa = torch.where(ia < 0, -(ia & mask), ia)
    ob = torch.where(ib < 0, -(ib & mask), ib)
    return int((oa - ob).abs().max().item())


def dry_compile(path: str, name: str, options=()) -> str:
    """A dry run's check of a kernel source: NVRTC compiles it for sm_90's virtual architecture
    where a libnvrtc is found; what came out, or why nothing did."""
    try:
        inc = NV.include_dir_for_client()[0]
        c = NV.compile_program(open(path, encoding="utf-8").read(), name,
                               ["--gpu-architecture=compute_90", f"--include-path={inc}", *options])
        return f"{c.code_kind} {len(c.code)} bytes, {c.compile_s:.1f} s"
    except Exception as e:  # noqa: BLE001 - no NVRTC here, or the source does not compile: say which
        return f"not compiled: {type(e).__name__}: {str(e)[:200]}"


def make_inputs(dt, rows, cols, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    T = DT[dt]
    scale = torch.empty(rows, 1, device=device).uniform_(0.5, 2.0, generator=g)
    x = (torch.randn(rows, cols, device=device, generator=g) * scale).to(T)
    w = (SEM["w_center"] + 0.2 * torch.randn(cols, device=device, generator=g)).to(T)
    dy = torch.randn(rows, cols, device=device, generator=g).to(T)
    return x, w, dy


def eager_backward(x, w, dy, want_s=False):
    m = SEM["module"](x.shape[1], EPS).to(device=x.device, dtype=x.dtype)
    with torch.no_grad():
        m.weight.copy_(w)
    xr = x.detach().clone().requires_grad_(True)
    box = {}
    y = m(xr, r_hook=(lambda g: box.__setitem__("s", g.detach().clone())) if want_s else None)
    y.backward(dy)
    return xr.grad, m.weight.grad, y, box.get("s")


def hypotheses(x, w, dy, r, s_e, ew, dt, sms, tps, do_rows, do_cols):
    """Which order explains eager's bits? Rows differing of the row sum s, and columns of dw
    differing, under the documented order and alternatives (computed from eager's own r, so
    only the reduction under test varies)."""
    T = DT[dt]
    h = x.float().cpu().numpy()
    wv = w.float().cpu().numpy()
    g = dy.float().cpu().numpy()
    rr = r.float().cpu().numpy().reshape(-1, 1)
    out = {}
    if do_rows and s_e is not None:
        gemma = SEM is SEMANTICS["gemma"]
        q = (g * (np.float32(1) + wv)[None, :] if gemma else B.round_to(g * wv[None, :], dt)) * h
        se = s_e.reshape(-1).float().cpu().numpy()
        out["row_sum"] = {f"vt0={a},ivs={b}": int((B.row_sum(q, vt0=a, ivs=b).view(np.uint32) != se.view(np.uint32)).sum())
                          for a, b in ((4, 4), (8, 8))}
    if do_cols:
        gw = g * (h * rr) if SEM is SEMANTICS["gemma"] else B.round_to(g * B.round_to(h * rr, dt), dt)
        rows, cols = gw.shape
        ewn = ew.float().cpu().numpy()
        other = 114 if sms != 114 else 132
        hyps = {"documented": B.col_config(rows, cols, sms, tps),
                "512 threads (older set_block_dimension)": B.col_config(rows, cols, sms, tps, threads_per_ovs=False),
                "vt0=8": B.col_config(rows, cols, sms, tps, vt0=8),
                "out_vec=1": B.col_config(rows, cols, sms, tps, out_vec=1),
                f"{other} SMs": B.col_config(rows, cols, other, tps)}
        res = {}
        for name, cfg in hyps.items():
            got = B.round_to(B.col_sum(gw, cfg=cfg), dt)
            res[name] = int((got.view(np.uint32) != ewn.view(np.uint32)).sum())
        out["col_sum"] = res
    del T
    return out


def eager_r(x):
    """The forward's r with eager's own kernels (what autograd saves)."""
    h = x.to(torch.float32)
    return torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS).reshape(-1)


# ---- timing ----------------------------------------------------------------------------------------

def probe_setup(args, default_out: str) -> tuple[str, bool, torch.device]:
    """A probe's output folder (its argument, else $OUT, else `default_out`; created), whether it
    runs as a dry run (asked for, or no CUDA device: said so), and its device."""
    out_dir = args.out or os.environ.get("OUT") or default_out
    os.makedirs(out_dir, exist_ok=True)
    dry = args.dry_run or not torch.cuda.is_available()
    if dry and not args.dry_run:
        print("no CUDA device: running as --dry-run")
    return out_dir, dry, torch.device("cpu") if dry else torch.device("cuda", torch.cuda.current_device())


def timed(fn, device, reps=20, warm=3):
    if device.type != "cuda":
        for _ in range(1):
            fn()
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(ts)
    for _ in range(warm):
        fn()
    torch.cuda.synchronize(device)
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(ts)


def kernel_times(fn, device, reps=20, warm=3) -> dict:
    """GPU time of each CUDA kernel `fn` launches, µs per call of `fn` by kernel name (averaged
    over `reps` calls under torch.profiler; no host time, so launch-bound shapes compare their
    kernels, not their launches). {} off a GPU."""
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warm):
        fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize(device)
    out: dict = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name[:80]] = out.get(e.name[:80], 0.0) + e.device_time / reps
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


# ---- main ------------------------------------------------------------------------------------------

def env_info(device):
    info = dict(torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version(),
                numpy=np.__version__, when=datetime.datetime.now(datetime.timezone.utc).isoformat())
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(device=p.name, sms=p.multi_processor_count, capability=list(torch.cuda.get_device_capability(device)),
                    max_threads_per_sm=getattr(p, "max_threads_per_multi_processor", None))
    try:
        nv = NV.load_nvrtc()
        info.update(nvrtc=nv.version, nvrtc_library=nv.path)
    except Exception as e:  # noqa: BLE001
        info.update(nvrtc=f"unavailable: {e}")
    return info


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--dry-run", action="store_true", help="CPU only: exercise the code paths")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile fwd+bwd")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rows", default=None, help="comma-separated row counts for the grid (default: the full list)")
    ap.add_argument("--cols", default=None, help="comma-separated widths for the grid (default: the full list)")
    ap.add_argument("--against", metavar="SRC",
                    help="another source of the same kernel (e.g. the release: git show REV:kernels/...); "
                         "timed beside the working tree's as variant 'against', its bits compared")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=DEFINES",
                    help="the working tree's source with these space-separated NVRTC defines, timed as "
                         "variant NAME (repeatable; default: unbounded=-DKB_DX_MINB=1 -DKB_DWP_MINB=1)")
    ap.add_argument("--timed", default=None, metavar="RxC,...",
                    help="the timed shapes (default: " + ",".join(f"{r}x{c}" for r, c in TIMED) + ")")
    ap.add_argument("--semantics", choices=sorted(SEMANTICS), default="llama",
                    help="HF LlamaRMSNorm's backward (default) or GemmaRMSNorm's")
    args = ap.parse_args(argv)
    global SEM
    SEM = SEMANTICS[args.semantics]
    t_start = time.time()
    out_dir, dry, device = probe_setup(args, "backward_probe_out")
    rows_list, cols_list = (ROWS, COLS) if not (args.quick or dry) else ([1, 3, 16, 17, 64, 1000], [1024, 2560])
    if dry:
        rows_list, cols_list = [1, 3, 17, 70], [1024, 2560]
    if args.rows:
        rows_list = [int(r) for r in args.rows.split(",")]
    if args.cols:
        cols_list = [int(c) for c in args.cols.split(",")]
    report = dict(env=env_info(device), dry_run=dry, eps=EPS, semantics=args.semantics, kernel=SEM["name"],
                  cases=[], timing=[], errors=[], graph=None)
    print(json.dumps(report["env"]))

    # compile (the dry run compiles too when NVRTC is there, for the source's sake)
    kernels = {}
    for dt in DT:
        try:
            if dry:
                kernels[dt] = CpuStandIn(dt)
                report.setdefault("dry_compile", {})[dt] = dry_compile(SEM["ksrc"], f"{SEM['name']} ({dt}).cu")
            else:
                k = GpuBackward(dt, device)
                kernels[dt] = k
                report.setdefault("compiled", {})[dt] = dict(kind=k.code.code_kind, sha256=k.code.code_sha256,
                                                             options=k.code.options, seconds=round(k.code.compile_s, 3))
        except Exception as e:  # noqa: BLE001
            report["errors"].append(f"compile {dt}: {type(e).__name__}: {e}")
            traceback.print_exc()

    # correctness grid
    for dt in DT:
        if dt not in kernels:
            continue
        k = kernels[dt]
        for rows in rows_list:
            for cols in cols_list:
                if time.time() - t_start > BUDGET_S * 0.75:
                    report["errors"].append(f"time budget: stopped the grid before {dt} [{rows}, {cols}]")
                    break
                try:
                    x, w, dy = make_inputs(dt, rows, cols, device, seed=rows * 7919 + cols)
                    small = rows * cols <= EMU_MAX_ELEMS
                    early = time.time() - t_start < BUDGET_S * 0.45
                    hyp_rows = early and rows * cols <= HYP_ROW_MAX and (small or dt != "f16")
                    hyp_cols = early and rows * cols <= HYP_COL_MAX and (small or dt != "f16") and rows >= 64
                    ex, ew, y, s_e = eager_backward(x, w, dy, want_s=small or hyp_rows)
                    if report["graph"] is None:
                        report["graph"] = {dt: graph_names(y.grad_fn)}
                    elif dt not in report["graph"]:
                        report["graph"][dt] = graph_names(y.grad_fn)
                    plan = k.plan(rows, cols)
                    dx, dw = k(dy, x, w, EPS, plan)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    case = dict(dtype=dt, rows=rows, cols=cols, dx_diff=ndiff(dx, ex), dw_diff=ndiff(dw, ew),
                                dx_max_ulp=max_ulp(dx, ex), dw_max_ulp=max_ulp(dw, ew),
                                row_cfg=plan["row"], col_cfg={kk: v for kk, v in plan["col"].items() if kk != "grid"})
                    if small:  # the emulation with eager's own r: is the order model right?
                        r = eager_r(x).float().cpu().numpy()
                        edx, edw, parts = SEM["emulate"](
                            x.float().cpu().numpy(), w.float().cpu().numpy(), dy.float().cpu().numpy(), EPS, dt, r=r,
                            num_sms=k.sms, max_threads_per_sm=k.tps, return_parts=True)
                        T = DT[dt]
                        case.update(emu_dx_diff=ndiff(torch.from_numpy(edx).to(T), ex.cpu()),
                                    emu_dw_diff=ndiff(torch.from_numpy(edw).to(T), ew.cpu()))
                        if s_e is not None:
                            case["emu_s_diff"] = ndiff(torch.from_numpy(parts["s"]), s_e.reshape(-1).float().cpu())
                    if hyp_rows or hyp_cols:
                        case["hypotheses"] = hypotheses(x, w, dy, eager_r(x), s_e, ew, dt, k.sms, k.tps,
                                                        hyp_rows, hyp_cols)
                    report["cases"].append(case)
                    del x, w, dy, ex, ew, y, dx, dw
                except Exception as e:  # noqa: BLE001
                    report["errors"].append(f"{dt} [{rows}, {cols}]: {type(e).__name__}: {e}")
                    traceback.print_exc()

    # timing
    variant_kernels = {}
    timed_shapes = TIMED if not dry else [(17, 1024)]
    if args.timed:
        timed_shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.timed.split(",")]
    for dt in (["bf16", "f16", "f32"] if not dry else ["bf16"]):
        if dt not in kernels:
            continue
        fwd, why = (None, "dry run") if dry else bundled_forward(dt, device)
        for rows, cols in timed_shapes:
            if time.time() - t_start > BUDGET_S:
                report["errors"].append(f"time budget: no timing of {dt} [{rows}, {cols}]")
                continue
            try:
                x, w, dy = make_inputs(dt, rows, cols, device, seed=1)
                m = SEM["module"](cols, EPS).to(device=device, dtype=DT[dt])
                with torch.no_grad():
                    m.weight.copy_(w)
                xr = x.detach().clone().requires_grad_(True)

                def eager_step():
                    xr.grad = None
                    m.weight.grad = None
                    m(xr).backward(dy)

                def eager_fwd():
                    with torch.no_grad():
                        m(x)

                k = kernels[dt]
                plan = k.plan(rows, cols)
                t = dict(dtype=dt, rows=rows, cols=cols, forward=(f"bundled {SEM['fwd']}" if fwd else f"eager ({why})"))
                t["eager_fwd_bwd_us"] = timed(eager_step, device, args.reps)
                t["eager_fwd_us"] = timed(eager_fwd, device, args.reps)
                t["ours_bwd_us"] = timed(lambda: k(dy, x, w, EPS, plan), device, args.reps)
                if not dry:  # the parts, and the dx launch's grid (rows in flight vs L2 reuse)
                    k(dy, x, w, EPS, plan)
                    ws0 = k.last_ws
                    t["ours_bwd_dx_us"] = timed(lambda: k(dy, x, w, EPS, plan, which="dx"), device, args.reps)
                    t["ours_bwd_dw_us"] = timed(lambda: k(dy, x, w, EPS, plan, which="dw", ws=ws0), device, args.reps)
                    by_grid = {}
                    for mult in (1, 2, 4, 8, 16):
                        pv = dict(plan, dx_grid=min(plan["dx_grid_max"], k.sms * mult))
                        by_grid[str(pv["dx_grid"])] = timed(lambda: k(dy, x, w, EPS, pv, which="dx"), device, args.reps)
                    t["ours_bwd_dx_us_by_grid"] = by_grid
                f = fwd or (lambda a, b, e: m(a))
                if fwd:
                    t["ours_fwd_us"] = timed(lambda: fwd(x, w, EPS), device, args.reps)
                    y_ours = fwd(x, w, EPS)
                    with torch.no_grad():
                        t["fwd_out_diff_vs_eager"] = ndiff(y_ours, m(x))

                def ours_step():
                    with torch.no_grad():
                        f(x, w, EPS)
                    k(dy, x, w, EPS, plan)

                t["ours_fwd_bwd_us"] = timed(ours_step, device, args.reps)
                if not dry:  # the variants (other defines, another source): same bits? how fast?
                    t["resources"] = k.resources()
                    for name, vsrc, defs in variants_of(args):
                        v = t.setdefault("variants", {})[name] = {}
                        try:
                            if (name, dt) not in variant_kernels:
                                variant_kernels[(name, dt)] = GpuBackward(dt, device, defs, vsrc)
                            k1 = variant_kernels[(name, dt)]
                            v["resources"] = k1.resources()
                            dx1, dw1 = k1(dy, x, w, EPS, plan)
                            dx0, dw0 = k(dy, x, w, EPS, plan)
                            v["same_bits"] = bool(ndiff(dx1, dx0) == 0 and ndiff(dw1, dw0) == 0)
                            v["bwd_us"] = timed(lambda: k1(dy, x, w, EPS, plan), device, args.reps)
                            k1(dy, x, w, EPS, plan)
                            ws1 = k1.last_ws
                            v["dx_us"] = timed(lambda: k1(dy, x, w, EPS, plan, which="dx"), device, args.reps)
                            v["dw_us"] = timed(lambda: k1(dy, x, w, EPS, plan, which="dw", ws=ws1), device, args.reps)
                            by1 = {}
                            for mult in (1, 2, 4, 8):
                                pv = dict(plan, dx_grid=min(plan["dx_grid_max"], k1.sms * mult))
                                by1[str(pv["dx_grid"])] = timed(lambda: k1(dy, x, w, EPS, pv, which="dx"), device, args.reps)
                            v["dx_us_by_grid"] = by1
                        except Exception as e:  # noqa: BLE001
                            v["error"] = f"{type(e).__name__}: {e}"[:300]
                t["speedup_fwd_bwd"] = round(t["eager_fwd_bwd_us"] / t["ours_fwd_bwd_us"], 2)
                if args.compile and not dry:
                    try:
                        cm = torch.compile(m)
                        xc = x.detach().clone().requires_grad_(True)

                        def comp_step():
                            xc.grad = None
                            m.weight.grad = None
                            cm(xc).backward(dy)

                        comp_step()
                        t["compile_fwd_bwd_us"] = timed(comp_step, device, args.reps)
                        comp_step()
                        t["compile_dx_diff_vs_eager"] = ndiff(xc.grad, eager_backward(x, w, dy)[0])
                    except Exception as e:  # noqa: BLE001
                        t["compile_error"] = f"{type(e).__name__}: {e}"[:300]
                report["timing"].append(t)
                del x, w, dy, xr, m
            except Exception as e:  # noqa: BLE001
                report["errors"].append(f"timing {dt} [{rows}, {cols}]: {type(e).__name__}: {e}")
                traceback.print_exc()

    report["seconds"] = round(time.time() - t_start, 1)
    with open(os.path.join(out_dir, SEM["out"]), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    print_table(report)
    return 0 if not report["errors"] else 1


def variants_of(args) -> list:
    """(name, source path or None, defines) of each variant timed beside the kernel."""
    specs = args.variant or ["unbounded=-DKB_DX_MINB=1 -DKB_DWP_MINB=1"]
    out = []
    for spec in specs:
        name, _, defs = spec.partition("=")
        out.append((name, None, tuple(defs.split())))
    if args.against:
        out.append(("against", args.against, ()))
    return out


def print_table(rep):
    print(f"\n== {rep.get('kernel', 'rms_norm_llama_backward')} vs eager autograd (elements differing; "
          f"emulation in brackets where run), {rep['env'].get('device', 'cpu')} ==")
    for dt in DT:
        cs = [c for c in rep["cases"] if c["dtype"] == dt]
        if not cs:
            continue
        cols = sorted({c["cols"] for c in cs})
        print(f"\n{dt}: dx_diff/dw_diff" + " " * 4 + "  ".join(f"{c:>16}" for c in cols))
        for r in sorted({c["rows"] for c in cs}):
            cells = []
            for col in cols:
                c = next((c for c in cs if c["rows"] == r and c["cols"] == col), None)
                if c is None:
                    cells.append(f"{'-':>16}")
                    continue
                s = f"{c['dx_diff']}/{c['dw_diff']}"
                if "emu_dx_diff" in c:
                    s += f"[{c['emu_dx_diff']}/{c['emu_dw_diff']}/{c.get('emu_s_diff', '-')}]"
                cells.append(f"{s:>16}")
            print(f"rows {r:>6}: " + "  ".join(cells))
    hyp = {}
    for c in rep["cases"]:
        for kind, d in c.get("hypotheses", {}).items():
            for name, n in d.items():
                a = hyp.setdefault(kind, {}).setdefault(name, [0, 0])
                a[0] += n
                a[1] += 1
    for kind, d in hyp.items():
        print(f"\n{kind} hypotheses (elements differing from eager, summed over the cases checked):")
        for name, (n, cases) in d.items():
            print(f"  {name:45s} {n:>10} in {cases} cases")
    tot = sum(c["dx_diff"] + c["dw_diff"] for c in rep["cases"])
    print(f"\ncases {len(rep['cases'])}, total differing elements {tot}")
    if rep["timing"]:
        print("\n== timing (median us) ==")
        for t in rep["timing"]:
            print(f"{t['dtype']} [{t['rows']}, {t['cols']}]: eager fwd+bwd {t['eager_fwd_bwd_us']:.1f}, "
                  f"ours fwd+bwd {t['ours_fwd_bwd_us']:.1f} (bwd {t['ours_bwd_us']:.1f}, fwd "
                  f"{t.get('ours_fwd_us', float('nan')):.1f}, {t['forward']}), x{t['speedup_fwd_bwd']}"
                  + (f"; bwd parts dx {t['ours_bwd_dx_us']:.1f} dw {t['ours_bwd_dw_us']:.1f}; dx by grid "
                     + ", ".join(f"{g}: {v:.1f}" for g, v in t["ours_bwd_dx_us_by_grid"].items())
                     if "ours_bwd_dx_us" in t else "")
                  + "".join(f"; {n} " + (f"bwd {v['bwd_us']:.1f} (same bits: {v['same_bits']}) dx {v['dx_us']:.1f} "
                                          f"dw {v['dw_us']:.1f}, dx by grid "
                                          + ", ".join(f"{g}: {u:.1f}" for g, u in v["dx_us_by_grid"].items())
                                          if "bwd_us" in v else v.get("error", "?"))
                            for n, v in t.get("variants", {}).items())
                  + (f", compile {t['compile_fwd_bwd_us']:.1f}" if "compile_fwd_bwd_us" in t else ""))
    for t in rep["timing"]:
        if "resources" in t:
            print(f"registers/local bytes {t['dtype']} [{t['rows']}, {t['cols']}]: "
                  + "; ".join(f"{n}: " + ", ".join(f"{e} {r['regs']}/{r['local_bytes']}" for e, r in res.items())
                              for n, res in [("kernel", t["resources"])]
                              + [(n, v["resources"]) for n, v in t.get("variants", {}).items() if "resources" in v]))
    for e in rep["errors"]:
        print("ERROR", e)
    print(f"seconds {rep['seconds']}")


if __name__ == "__main__":
    sys.exit(main())
