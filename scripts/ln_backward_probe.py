#!/usr/bin/env python3
"""Issue 30, LayerNorm: does the CPU emulation (python/kernelize/backward_ln.py) give eager
autograd's bits for nn.LayerNorm's dx, dw and db on CUDA, which of the unsure points
(FMA contraction, the column order) eager really uses, and how fast are eager, torch.compile and
Liger at the backward?

On the GPU machine (torch with CUDA):

    PYTHONUNBUFFERED=1 python3 scripts/ln_backward_probe.py OUT_DIR [--quick]

On a machine without a GPU, `--dry-run` runs the same code paths on the CPU (eager's CPU
kernels stand in for CUDA's, so its differing counts mean nothing; timing is wall clock).

Grid: dtypes f32, bf16, f16 x rows {1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 128, 1000, 4096} x cols
{768, 1024, 1280, 2048, 4096, 8192, 1000, 4099}; per case eager autograd of nn.LayerNorm (x, w, b
requiring grad, a random dy), eager's mean/rstd from torch.native_layer_norm on the same inputs,
then the emulation on the CPU where rows * cols <= 300 000 and, while time is left, larger (every
dtype in the first half of the budget, bf16 until 85 % of it; about 0.2 s per million elements):
elements of dx, dw, db whose bits differ. Up to 4.2M elements, early enough, `hypotheses`
scores the alternatives (docs/backward-layer-norm.md): the dx contraction (xy_sub_z, x_sub_yz,
none) x the row sums' FMA (fma / nofma); dw's FMA x the column order (current, pre-2025); db's
column order. Extra cases: misaligned x and dy (the non-vectorized dx kernel) against the
aligned ones, and rows 65600 (the two-pass "partial" dw/db, the SM-dependent one). The grid stops
at --budget seconds (default 200); the timing (CUDA events, median of --reps) runs after it within
its own budget: eager fwd+bwd, eager backward alone (native_layer_norm_backward), torch.compile
fwd+bwd and backward, Liger's LigerLayerNorm if `import liger_kernel` works, at M in {64, 256,
1024, 4096, 8192} x N in {256, 1024, 4096, 8192, 16384}, bf16 (f16, f32 if --all-dtypes), with
GB/s of the backward (read dy, x, w, mean, rstd; write dx, dw, db).

The bundled kernel kernels/layer_norm_backward/kernel.cu (skipped with --no-kernel
and on the dry run): NVRTC compiles it for this GPU's sm (every dtype in one module), and each
case launches it on the same inputs and eager's saved mean/rstd (dx: block 128, grid rows, as eager
launches its kernel; dw/db: `dwdb_launch`, a tile of 8..64 columns a block chosen for the SM
count, block (tile threads, bdy(rows)); dw/db not where rows > 65536, where ln_bwd_dwdb traps),
outputs NaN-poisoned first, inputs compared with clones after:
elements differing from eager (and from the emulation where it ran). The timing adds the
kernel's two launches (CUDA events, as eager's bare backward op) and its bits at those shapes. A
kernel error switches it off for the rest of the run; one that loses the CUDA context (a trap)
stops the run. Writes OUT_DIR/ln_backward_probe.json and prints markdown tables last; exit
status 1 if anything raised.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from kernelize import backward as B  # noqa: E402
from kernelize import backward_ln as LN  # noqa: E402
from kernelize import training as T  # noqa: E402

DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
ROWS = [1, 2, 3, 4, 7, 8, 16, 17, 32, 64, 128, 1000, 4096]
COLS = [768, 1024, 1280, 2048, 4096, 8192, 1000, 4099]
EXTRA_PARTIAL = [(65600, 256)]          # the two-pass dw/db (M > 65536, N // 32 < sms // 2)
UNALIGNED = [(64, 1024), (17, 4096), (128, 768)]
TIMED_M = [64, 256, 1024, 4096, 8192]
TIMED_N = [256, 1024, 4096, 8192, 16384]
EPS = 1e-5
EMU_MAX_ELEMS = 300_000     # always emulated (while the grid's budget lasts)
EMU_MAX_ANY = 34_000_000    # every dtype in the first half of the budget, bf16 until 85 % of it
HYP_MAX_ELEMS = 4_200_000   # the hypotheses (about 4 emulations each) in the first 60 % of it


# ---- eager ------------------------------------------------------------------------------------------

def make_inputs(dt, rows, cols, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    T = DT[dt]
    scale = torch.empty(rows, 1, device=device).uniform_(0.5, 2.0, generator=g)
    shift = torch.empty(rows, 1, device=device).uniform_(-1.0, 1.0, generator=g)
    x = (torch.randn(rows, cols, device=device, generator=g) * scale + shift).to(T)
    w = (1 + 0.2 * torch.randn(cols, device=device, generator=g)).to(T)
    b = (0.1 * torch.randn(cols, device=device, generator=g)).to(T)
    dy = torch.randn(rows, cols, device=device, generator=g).to(T)
    return x, w, b, dy


def misaligned(t):
    """The same values at a 1-element offset (not 4 * itemsize-aligned): eager takes the plain dx kernel."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    v = buf[1:].view(t.shape)
    v.copy_(t)
    return v


def eager_backward(x, w, b, dy):
    rows, cols = x.shape
    m = torch.nn.LayerNorm(cols, eps=EPS, elementwise_affine=True, bias=True).to(device=x.device, dtype=x.dtype)
    with torch.no_grad():
        m.weight.copy_(w)
        m.bias.copy_(b)
    xr = x.detach().requires_grad_(True)      # detach keeps x's storage offset (alignment)
    y = m(xr)
    y.backward(dy)
    return xr.grad, m.weight.grad, m.bias.grad, y


def eager_stats(x, w, b):
    """The forward's saved statistics (what autograd hands the backward): f32 [rows]."""
    y, mean, rstd = torch.native_layer_norm(x, [x.shape[1]], w, b, EPS)
    return y, mean.reshape(-1), rstd.reshape(-1)


# ---- comparisons ---------------------------------------------------------------------------------------

def np_of(t):
    return t.detach().float().cpu().numpy()


def to_T(a, dt):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(DT[dt])


def emulate(dt, x, w, dy, mean, rstd, sms, tps, **kw):
    return LN.layer_norm_backward(np_of(dy), np_of(x), np_of(w), np_of(mean), np_of(rstd), dt,
                                  sms=sms, max_threads_per_sm=tps, **kw)


def hypotheses(dt, x, w, dy, mean, rstd, ex, ew, eb, sms, tps, partial=False):
    """Elements of eager's dx / dw / db that each alternative misses (eager's own mean, rstd)."""
    g, h, wv, m, r = np_of(dy), np_of(x), np_of(w), np_of(mean), np_of(rstd)
    rows, cols = h.shape
    exn, ewn, ebn = np_of(ex), np_of(ew), np_of(eb)

    def nd(a, e):
        return int((np.ascontiguousarray(a, np.float32).view(np.uint32) != e.view(np.uint32)).sum())

    out = {"dx": {}, "dw": {}, "db": {}}
    # dx: "<contraction>/s2 <fma|add>, s1 <fma|add>[/s2 <form>]" (eager's SASS: s2 fma, s1 add)
    for s2f in (True, False):
        for s1f in (False, True):
            for form in LN.S2_FORMS:
                s1, s2 = LN.row_stats(g, h, wv, m, r, sum_fma=s2f, s2_form=form, s1_fma=s1f)
                # every dx contraction with eager's sums; the closest three with the others
                main = s2f and not s1f and form == "inside"
                if form != "inside" and not (s2f and not s1f):
                    continue   # the s2 forms with eager's contractions only
                for mode in (LN.DX_FMA if main else ("xy_sub_z", "x_sub_yz", "none")):
                    name = (f"{mode}/s2 {'fma' if s2f else 'add'}, s1 {'fma' if s1f else 'add'}"
                            + ("" if form == "inside" else f"/s2 {form}"))
                    out["dx"][name] = nd(LN.dx_from_stats(g, h, wv, m, r, s1, s2, dt, mode), exn)
    cfgs = {"current": LN.gamma_beta_config(rows, cols, sms)}
    if partial:
        other = 114 if sms != 114 else 132
        cfgs[f"current, sum(0) on {other} SMs"] = None
    else:
        cfgs["pre-2025"] = LN.pre2025_gamma_beta_config(rows, cols)
    for name, cfg in cfgs.items():
        for sf in (True, False):
            if cfg is None:
                dw, db = LN.gamma_beta(g, h, m, r, dt, sms=other, max_threads_per_sm=tps, sum_fma=sf,
                                       cfg=LN.gamma_beta_config(rows, cols, sms))
            else:
                dw, db = LN.gamma_beta(g, h, m, r, dt, sms=sms, max_threads_per_sm=tps, sum_fma=sf, cfg=cfg)
            out["dw"][f"{name}/{'fma' if sf else 'nofma'}"] = nd(dw, ewn)
            if sf:
                out["db"][name] = nd(db, ebn)
    if partial:  # the partials kept in f32 (not stored as T) before sum(0)
        cfg = LN.gamma_beta_config(rows, cols, sms)
        gy = cfg["grid"][1]
        q = (g * (h - m[:, None]).astype(np.float32)).astype(np.float32)
        part = LN._chains(q, r[:, None], gy, 32 * gy, 32, True)
        out["dw"]["partials in f32"] = nd(B.round_to(B.col_sum(part, sms, tps), dt), ewn)
    return out


# ---- timing -----------------------------------------------------------------------------------------------

# the RMSNorm probe's timer (CUDA events, median; wall clock on the CPU) and autograd-graph names
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_probe import (CudaModule, dry_compile, env_info as base_env_info, graph_names,  # noqa: E402
                            kernel_times, max_ulp, ndiff, probe_setup, timed)


# ---- the work-in-progress kernel (docs/backward-layer-norm.md, "The kernel") ---------------------------

KSRC = os.path.join(ROOT, "kernels", "layer_norm_backward", "kernel.cu")
DWDB_MAX_ROWS = 65536   # ln_bwd_dwdb traps above: eager's two-pass dw/db variant is not in the kernel
NO_DWDB = f"skipped: rows > {DWDB_MAX_ROWS} trap in ln_bwd_dwdb (eager's two-pass variant, not implemented)"
DT_NAME = {v: k for k, v in DT.items()}
INPUT_NAMES = ("dy", "x", "w", "mean", "rstd")


class KernelArgError(ValueError):
    """Inputs the kernel's ABI does not take (nothing was launched)."""


def dwdb_launch(rows: int, cols: int, sms: int, aligned: bool = True):
    """(grid, block) for ln_bwd_dwdb: the client's launch rule (`kernelize.training.dwdb_dims`,
    itself checked against the registry's `backward::dwdb_dims`), `aligned=False` for this
    probe's unaligned cases (the kernel then carries one column a thread). The bits depend on
    neither."""
    blocks, (bx, by, _) = T.dwdb_dims(rows, cols, sms, aligned=aligned)
    return blocks, (bx, by)


class GpuLnBackward:
    """kernel.cu's entries ln_bwd_dx_<dt>, ln_bwd_dwdb_<dt> (one NVRTC module for this GPU's sm):
    dx launched as eager launches its kernel, block 128 and grid = rows; dw/db as `dwdb_launch`
    says for this GPU's SM count. mean, rstd: the forward's saved f32 statistics [rows]."""

    def __init__(self, device):
        src = open(KSRC, encoding="utf-8").read()
        self.mod = CudaModule(src, "layer_norm_backward.cu", device,
                              [f"ln_bwd_{e}_{dt}" for dt in DT for e in ("dx", "dwdb")])
        self.code = self.mod.code
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count

    def bind(self, dy, x, w, mean, rstd, poison=False):
        """A zero-argument function running both launches on these tensors (checked here, once)
        into fresh outputs: (dx, dw, db), dw and db None where rows > DWDB_MAX_ROWS. poison: the
        outputs are NaN-filled first, so an element the kernel leaves unwritten differs from eager."""
        rows, cols = x.shape
        T = x.dtype
        dt = DT_NAME[T]
        want = {"dy": (T, (rows, cols)), "x": (T, (rows, cols)), "w": (T, (cols,)),
                "mean": (torch.float32, (rows,)), "rstd": (torch.float32, (rows,))}
        for name, t in zip(INPUT_NAMES, (dy, x, w, mean, rstd)):
            if (t.dtype, tuple(t.shape)) != want[name] or not t.is_contiguous() or t.device != x.device:
                raise KernelArgError(f"{name}: {t.dtype} {tuple(t.shape)} contiguous={t.is_contiguous()} on "
                                     f"{t.device}; the ABI wants {want[name]} contiguous on {x.device}")
        dwdb = rows <= DWDB_MAX_ROWS
        launch = self.mod.launch
        dx_entry, dwdb_entry = f"ln_bwd_dx_{dt}", f"ln_bwd_dwdb_{dt}"
        al = 2 * x.element_size()
        gb_grid, gb_block = dwdb_launch(rows, cols, self.sms,
                                        aligned=dy.data_ptr() % al == 0 and x.data_ptr() % al == 0)

        def go():
            dx = torch.empty((rows, cols), dtype=T, device=x.device)
            dw = torch.empty(cols, dtype=T, device=x.device) if dwdb else None
            db = torch.empty(cols, dtype=T, device=x.device) if dwdb else None
            if poison:
                for o in (dx, dw, db):
                    if o is not None:
                        o.fill_(float("nan"))
            # T* dx, const T* dy, const T* x, const float* mean, const float* rstd, const T* w, rows, cols
            launch(dx_entry, rows, 128, (dx, dy, x, mean, rstd, w, rows, cols))
            if dwdb:  # T* dw, T* db, const T* dy, const T* x, const float* mean, const float* rstd, rows, cols
                launch(dwdb_entry, gb_grid, gb_block, (dw, db, dy, x, mean, rstd, rows, cols))
            return dx, dw, db
        return go

    def __call__(self, dy, x, w, mean, rstd, poison=False):
        return self.bind(dy, x, w, mean, rstd, poison)()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


class KernelState:
    """The kernel for this run (None: not run, `report["kernel"]` says why); switched off after its
    first error; `context_lost` once that error left the CUDA context unusable (a trap)."""

    def __init__(self):
        self.k = None
        self.context_lost = None

    def failed(self, report, where, e, record=None):
        msg = f"kernel {where}: {type(e).__name__}: {e}"[:600]
        traceback.print_exc()
        report["errors"].append(msg)
        report["kernel"] = f"switched off for the rest of the run after: {msg}"
        if record is not None:
            record["kernel_error"] = msg
        self.k = None
        try:
            torch.cuda.synchronize()
        except Exception as e2:  # noqa: BLE001  (sticky: every later CUDA call fails too)
            self.context_lost = f"{type(e2).__name__}: {e2}"[:300]
            report["kernel_context_lost"] = self.context_lost


def kernel_case(kern, report, case, dy, x, w, mean, rstd, ex, ew, eb, emu_out):
    """The kernel on a case's inputs (NaN-poisoned outputs): bits against eager's gradients and the
    emulation's (`emu_out`, None where it did not run); inputs compared with clones taken before."""
    if kern is None or kern.k is None:
        return
    dt = case["dtype"]
    try:
        before = [t.clone() for t in (dy, x, w, mean, rstd)]
        kdx, kdw, kdb = kern.k(dy, x, w, mean, rstd, poison=True)
        torch.cuda.synchronize(x.device)
        case["kernel_inputs_changed"] = [n for n, t, c in zip(INPUT_NAMES, (dy, x, w, mean, rstd), before)
                                         if not torch.equal(bits(t), bits(c))]
        case.update(kernel_dx_diff=ndiff(kdx, ex), kernel_dx_max_ulp=max_ulp(kdx, ex))
        outs = {"dx": kdx}
        if kdw is None:
            case["kernel_dwdb"] = NO_DWDB
        else:
            case.update(kernel_dw_diff=ndiff(kdw, ew), kernel_db_diff=ndiff(kdb, eb),
                        kernel_dw_max_ulp=max_ulp(kdw, ew))
            outs.update(dw=kdw, db=kdb)
        case["kernel_nan"] = {g: int(torch.isnan(o).sum().item()) for g, o in outs.items()}
        if emu_out is not None:
            for g, e in zip(("dx", "dw", "db"), emu_out):
                if g in outs:
                    case[f"kernel_vs_emu_{g}_diff"] = ndiff(outs[g], to_T(e, dt))
    except KernelArgError as e:  # nothing launched: this case only
        case["kernel_error"] = f"not launched: {e}"
        report["errors"].append(f"kernel {dt} [{case['rows']}, {case['cols']}] {case['kind']}: not launched: {e}")
    except Exception as e:  # noqa: BLE001
        kern.failed(report, f"{dt} [{case['rows']}, {case['cols']}] {case['kind']}", e, case)


def compile_kernel(report, device, dry, no_kernel):
    """The run's KernelState, and `report["kernel"]`: whether and why (not) the kernel runs. The dry
    run compiles the source to PTX if NVRTC is here (`kernel_dry_compile`, for the source's sake)."""
    kern = KernelState()
    if dry:
        report["kernel"] = "skipped: needs a CUDA GPU"
        report["kernel_dry_compile"] = dry_compile(KSRC, "layer_norm_backward.cu")
    elif no_kernel:
        report["kernel"] = "skipped: --no-kernel"
    else:
        try:
            kern.k = GpuLnBackward(device)
            c = kern.k.code
            report["kernel"] = "ran"
            report["kernel_compiled"] = dict(kind=c.code_kind, sha256=c.code_sha256, options=c.options,
                                             seconds=round(c.compile_s, 3), nvrtc=c.nvrtc_version)
        except Exception as e:  # noqa: BLE001
            report["kernel"] = f"not compiled: {type(e).__name__}: {str(e)[:300]}"
            report["errors"].append(f"compile the kernel: {type(e).__name__}: {e}")
            traceback.print_exc()
    return kern


def liger_module(cols, dt, device, w, b):
    """LigerLayerNorm with w and b, or (None, why)."""
    try:
        import liger_kernel  # noqa: F401
        from liger_kernel.transformers import LigerLayerNorm
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"[:200]
    try:
        try:
            mod = LigerLayerNorm(cols, eps=EPS, bias=True)
        except TypeError:
            mod = LigerLayerNorm(cols, eps=EPS)
        mod = mod.to(device=device, dtype=DT[dt])
        with torch.no_grad():
            mod.weight.copy_(w)
            if getattr(mod, "bias", None) is not None:
                mod.bias.copy_(b)
        return mod, None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"[:200]


def time_shape(dt, rows, cols, device, reps, do_compile, report, kern=None):
    x, w, b, dy = make_inputs(dt, rows, cols, device, seed=1)
    t = dict(dtype=dt, rows=rows, cols=cols, bytes_bwd=LN.bytes_moved(rows, cols, dt))
    m = torch.nn.LayerNorm(cols, eps=EPS).to(device=device, dtype=DT[dt])
    with torch.no_grad():
        m.weight.copy_(w)
        m.bias.copy_(b)
    xr = x.detach().clone().requires_grad_(True)
    params = [xr, m.weight, m.bias]

    def fwd_bwd(mod):
        def step():
            for p in params[:1] + list(mod.parameters()):
                p.grad = None
            mod(xr).backward(dy)
        return step

    def bwd_only(mod):
        y = mod(xr)
        ps = [xr] + list(mod.parameters())
        return lambda: torch.autograd.grad(y, ps, dy, retain_graph=True)

    t["eager_fwd_bwd_us"] = timed(fwd_bwd(m), device, reps)
    t["eager_bwd_us"] = timed(bwd_only(m), device, reps)
    _, mean, rstd = eager_stats(x, w, b)
    def eager_op():
        return torch.ops.aten.native_layer_norm_backward(
            dy, x, [cols], mean.view(rows, 1), rstd.view(rows, 1), w, b, [True, True, True])

    t["eager_bwd_op_us"] = timed(eager_op, device, reps)
    # which of eager's kernels takes what (dx's and dw/db's), against the kernel's two below
    t["eager_bwd_op_kernels_us"] = kernel_times(eager_op, device, reps)
    ex, ew, eb, _ = eager_backward(x, w, b, dy)

    def against_eager(name, mod):
        """A candidate module's fwd+bwd and bwd times, and its gradients' bits against eager's."""
        t[f"{name}_fwd_bwd_us"] = timed(fwd_bwd(mod), device, reps)
        t[f"{name}_bwd_us"] = timed(bwd_only(mod), device, reps)
        xr.grad = None
        for p in mod.parameters():
            p.grad = None
        mod(xr).backward(dy)
        bias = getattr(mod, "bias", None)
        t[f"{name}_diff_vs_eager"] = dict(dx=ndiff(xr.grad, ex), dw=ndiff(mod.weight.grad, ew),
                                          db=ndiff(bias.grad, eb) if bias is not None and bias.grad is not None
                                          else None)
    if do_compile:
        try:
            torch._dynamo.reset()
            # bwd_only replays one graph's backward (retain_graph): compiled backwards donate
            # their saved buffers unless told not to
            torch._functorch.config.donated_buffer = False
            cm = torch.compile(m, dynamic=False)
            t0 = time.time()
            fwd_bwd(cm)()
            t["compile_s"] = round(time.time() - t0, 1)
            against_eager("compile", cm)
        except Exception as e:  # noqa: BLE001
            t["compile_error"] = f"{type(e).__name__}: {e}"[:300]
    lg, why = liger_module(cols, dt, device, w, b)
    if lg is None:
        t["liger"] = f"unavailable: {why}"
    else:
        try:
            against_eager("liger", lg)
        except Exception as e:  # noqa: BLE001
            t["liger_error"] = f"{type(e).__name__}: {e}"[:300]
    if kern is not None and kern.k is not None:  # the kernel's bits here, then its two launches timed
        try:
            kdx, kdw, kdb = kern.k(dy, x, w, mean, rstd, poison=True)
            torch.cuda.synchronize(device)
            t["kernel_diff_vs_eager"] = dict(dx=ndiff(kdx, ex), dw=None if kdw is None else ndiff(kdw, ew),
                                             db=None if kdb is None else ndiff(kdb, eb))
            t["kernel_dx_max_ulp"] = max_ulp(kdx, ex)
            if kdw is None:
                t["kernel_dwdb"] = NO_DWDB + ": the time is dx's alone"
            else:
                t["kernel_dw_max_ulp"] = max_ulp(kdw, ew)
            g, bl = dwdb_launch(rows, cols, kern.k.sms)
            t["kernel_dwdb_launch"] = dict(grid=g, block=list(bl))
            t["kernel_bwd_us"] = timed(kern.k.bind(dy, x, w, mean, rstd), device, reps)
            t["kernel_kernels_us"] = kernel_times(kern.k.bind(dy, x, w, mean, rstd), device, reps)
        except Exception as e:  # noqa: BLE001
            kern.failed(report, f"timing {dt} [{rows}, {cols}]", e, t)
    for k in ("eager_bwd_us", "eager_bwd_op_us", "compile_bwd_us", "liger_bwd_us", "kernel_bwd_us"):
        if k in t and t[k] > 0:
            t[k.replace("_us", "_GBps")] = round(t["bytes_bwd"] / (t[k] * 1e-6) / 1e9, 1)
    if t.get("kernel_bwd_us", 0) > 0:  # > 1: the kernel is faster
        t["eager_op_over_kernel"] = round(t["eager_bwd_op_us"] / t["kernel_bwd_us"], 2)
        t["eager_autograd_over_kernel"] = round(t["eager_bwd_us"] / t["kernel_bwd_us"], 2)
    report["timing"].append(t)


# ---- main ----------------------------------------------------------------------------------------------------

def env_info(device):
    """The RMSNorm probe's environment (versions, device figures, NVRTC) and Liger's version."""
    info = base_env_info(device)
    try:
        import liger_kernel  # noqa: F401
        from importlib.metadata import version
        info["liger_kernel"] = version("liger-kernel")
    except Exception as e:  # noqa: BLE001
        info["liger_kernel"] = f"unavailable: {type(e).__name__}"
    return info


def run_case(report, dt, rows, cols, device, sms, tps, t_start, budget, kind="grid", align=True, kern=None):
    x, w, b, dy = make_inputs(dt, rows, cols, device, seed=rows * 7919 + cols)
    if not align:
        x, dy = misaligned(x), misaligned(dy)
    ex, ew, eb, y = eager_backward(x, w, b, dy)
    ys, mean, rstd = eager_stats(x, w, b)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if report["graph"] is None:
        report["graph"] = graph_names(y.grad_fn)
    n = rows * cols
    case = dict(kind=kind, dtype=dt, rows=rows, cols=cols, aligned=align,
                dx_kernel=LN.dx_kernel(cols, dt, aligned=align), gb_cfg=LN.gamma_beta_config(rows, cols, sms),
                fwd_stats_same_y=ndiff(ys, y) == 0)
    if not align:  # the plain dx kernel against the vectorized one on the same values
        xa, dya = x.contiguous().clone(), dy.contiguous().clone()
        ax, aw, ab, _ = eager_backward(xa, w, b, dya)
        case.update(unaligned_vs_aligned=dict(dx=ndiff(ex, ax), dw=ndiff(ew, aw), db=ndiff(eb, ab)))
    elapsed = time.time() - t_start
    emu = elapsed < budget * 0.85 and (n <= EMU_MAX_ELEMS or kind == "partial" or (
        n <= EMU_MAX_ANY and (dt == "bf16" or elapsed < budget * 0.5)))
    emu_out = None
    if emu:
        t0 = time.time()
        dx, dw, db = emu_out = emulate(dt, x, w, dy, mean, rstd, sms, tps)
        case.update(emu_dx_diff=ndiff(to_T(dx, dt), ex), emu_dw_diff=ndiff(to_T(dw, dt), ew),
                    emu_db_diff=ndiff(to_T(db, dt), eb), emu_dx_max_ulp=max_ulp(to_T(dx, dt), ex.cpu()),
                    emu_dw_max_ulp=max_ulp(to_T(dw, dt), ew.cpu()), emu_s=round(time.time() - t0, 2))
        if (n <= HYP_MAX_ELEMS or kind == "partial") and time.time() - t_start < budget * 0.6:
            case["hypotheses"] = hypotheses(dt, x, w, dy, mean, rstd, ex, ew, eb, sms, tps, partial=(kind == "partial"))
    kernel_case(kern, report, case, dy, x, w, mean, rstd, ex, ew, eb, emu_out)
    report["cases"].append(case)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--dry-run", action="store_true", help="CPU only: exercise the code paths")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for the grid (the timing has as much again)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--all-dtypes", action="store_true", help="time f16 and f32 too")
    ap.add_argument("--timed-dtypes", default=None, metavar="DT,...",
                    help="the timing's dtypes, comma-separated from bf16, f16, f32 (default bf16; "
                         "--all-dtypes: all three), e.g. one per GPU of a machine")
    ap.add_argument("--no-copy-bw", action="store_true", help="do not measure the copy bandwidth")
    ap.add_argument("--no-grid", action="store_true",
                    help="skip the bits grid: the timing alone (which still compares the bits of "
                         "every candidate at each timed shape)")
    ap.add_argument("--no-kernel", action="store_true", help="do not run kernels/layer_norm_backward")
    ap.add_argument("--timed-m", help="the timing's M values, comma-separated (default: QuACK PR 136's)")
    ap.add_argument("--timed-n", help="the timing's N values, comma-separated (default: QuACK PR 136's)")
    ap.add_argument("--timing-budget", type=float, default=None,
                    help="seconds for the timing (default: --budget)")
    args = ap.parse_args(argv)
    t_start = time.time()
    out_dir, dry, device = probe_setup(args, "ln_backward_probe_out")
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        sms, tps = p.multi_processor_count, getattr(p, "max_threads_per_multi_processor", 2048)
    else:
        sms, tps = 132, 2048
    rows_list, cols_list = ROWS, COLS
    if args.quick:
        rows_list, cols_list = [1, 3, 17, 64, 128, 1000], [768, 1000, 4096, 4099]
    partial, unaligned = EXTRA_PARTIAL, UNALIGNED
    tm, tn = TIMED_M, TIMED_N
    try:
        if args.timed_m:
            tm = [int(v) for v in args.timed_m.split(",")]
        if args.timed_n:
            tn = [int(v) for v in args.timed_n.split(",")]
    except ValueError:
        ap.error(f"--timed-m/--timed-n take comma-separated integers, got {args.timed_m!r} / {args.timed_n!r}")
    timed_dts = (args.timed_dtypes.split(",") if args.timed_dtypes else
                 ["bf16", "f16", "f32"] if args.all_dtypes else ["bf16"])
    if any(d not in DT for d in timed_dts) or not timed_dts:
        ap.error(f"--timed-dtypes takes a comma-separated list of {', '.join(DT)}; got {args.timed_dtypes!r}")
    timing_budget = args.budget if args.timing_budget is None else args.timing_budget
    if dry:
        rows_list, cols_list = [1, 3, 70, 130], [768, 1000, 4099]
        partial, unaligned, tm, tn = [(65600, 64)], [(17, 1024)], [64], [256]
    report = dict(env=env_info(device), dry_run=dry, eps=EPS, sms=sms, threads_per_sm=tps, cases=[], timing=[],
                  errors=[], graph=None)
    print(json.dumps(report["env"]))
    kern = compile_kernel(report, device, dry, args.no_kernel)
    print(f"kernel: {report['kernel']}")

    # correctness: f32 first (it tells the contractions apart), then bf16, f16
    plan = [(dt, r, c, "grid", True) for dt in DT for r in rows_list for c in cols_list]
    plan += [(dt, r, c, "unaligned", False) for dt in DT for r, c in unaligned]
    plan += [(dt, r, c, "partial", True) for dt in ("f32", "bf16") for r, c in partial]
    # the extra cases early enough to keep their emulation: after each dtype's grid
    plan.sort(key=lambda p: (list(DT).index(p[0]), p[3] != "grid"))
    for dt, rows, cols, kind, align in ([] if args.no_grid else plan):
        if time.time() - t_start > args.budget:
            report["errors"].append(f"time budget: stopped the grid before {dt} [{rows}, {cols}] {kind}")
            break
        if kern.context_lost:
            report["errors"].append(f"stopped the grid before {dt} [{rows}, {cols}] {kind}: the kernel's error "
                                    f"left the CUDA context unusable ({kern.context_lost})")
            break
        try:
            run_case(report, dt, rows, cols, device, sms, tps, t_start, args.budget, kind, align, kern)
        except Exception as e:  # noqa: BLE001
            report["errors"].append(f"{dt} [{rows}, {cols}] {kind}: {type(e).__name__}: {e}")
            traceback.print_exc()
    report["grid_seconds"] = round(time.time() - t_start, 1)

    # timing
    t_timing = time.time()
    if device.type == "cuda" and not args.no_copy_bw:
        # the copy bandwidth in the same run (read + write of 1 GiB each way): the GB/s below as
        # fractions of it
        src = torch.empty(1 << 29, dtype=torch.uint8, device=device).random_(0, 255)
        dst = torch.empty_like(src)
        report["copy_gbps"] = round(2 * src.numel() / (timed(lambda: dst.copy_(src), device, 10) * 1e-6) / 1e9, 1)
        del src, dst
    for dt in timed_dts:
        for rows in tm:
            for cols in tn:
                if time.time() - t_timing > timing_budget:
                    report["errors"].append(f"time budget: no timing of {dt} [{rows}, {cols}]")
                    continue
                if kern.context_lost:
                    report["errors"].append(f"no timing of {dt} [{rows}, {cols}]: the CUDA context is lost")
                    continue
                try:
                    time_shape(dt, rows, cols, device, args.reps, not (args.no_compile or dry), report, kern)
                except Exception as e:  # noqa: BLE001
                    report["errors"].append(f"timing {dt} [{rows}, {cols}]: {type(e).__name__}: {e}")
                    traceback.print_exc()

    report["seconds"] = round(time.time() - t_start, 1)
    with open(os.path.join(out_dir, "ln_backward_probe.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    print_table(report)
    return 0 if not [e for e in report["errors"] if not e.startswith("time budget")] else 1


def print_table(rep):
    env = rep["env"]
    print(f"\n## LayerNorm backward: emulation vs eager autograd ({env.get('device', 'cpu')}, torch {env['torch']}"
          f"{', DRY RUN: CPU eager, counts mean nothing' if rep['dry_run'] else ''})\n")
    print("Cells: emulation's differing elements dx/dw/db (- where the emulation did not run).\n")
    for dt in DT:
        cs = [c for c in rep["cases"] if c["dtype"] == dt and c["kind"] == "grid"]
        if not cs:
            continue
        cols = sorted({c["cols"] for c in cs})
        print(f"**{dt}**\n")
        print("| rows | " + " | ".join(str(c) for c in cols) + " |")
        print("| ---: | " + " | ".join("---" for _ in cols) + " |")
        for r in sorted({c["rows"] for c in cs}):
            cells = []
            for col in cols:
                c = next((c for c in cs if c["rows"] == r and c["cols"] == col), None)
                cells.append("-" if c is None or "emu_dx_diff" not in c else
                             f"{c['emu_dx_diff']}/{c['emu_dw_diff']}/{c['emu_db_diff']}")
            print(f"| {r} | " + " | ".join(cells) + " |")
        print()
    extra = [c for c in rep["cases"] if c["kind"] != "grid"]
    if extra:
        print("| extra case | dtype | shape | dx kernel | dw/db variant | emu dx/dw/db | plain vs vectorized dx/dw/db |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for c in extra:
            emu = f"{c['emu_dx_diff']}/{c['emu_dw_diff']}/{c['emu_db_diff']}" if "emu_dx_diff" in c else "-"
            ua = c.get("unaligned_vs_aligned")
            ua = f"{ua['dx']}/{ua['dw']}/{ua['db']}" if ua else "-"
            print(f"| {c['kind']} | {c['dtype']} | {c['rows']}x{c['cols']} | {c['dx_kernel']} | "
                  f"{c['gb_cfg']['variant']} | {emu} | {ua} |")
        print()
    hyp = {}
    for c in rep["cases"]:
        for grad, d in c.get("hypotheses", {}).items():
            for name, n in d.items():
                a = hyp.setdefault((grad, c["dtype"], name), [0, 0])
                a[0] += n
                a[1] += 1
    if hyp:
        print("Hypotheses (elements of eager's gradient each one misses, summed; 0 = consistent):\n")
        print("| gradient | dtype | hypothesis | differing | cases |")
        print("| --- | --- | --- | ---: | ---: |")
        for (grad, dt, name), (n, k) in sorted(hyp.items()):
            print(f"| {grad} | {dt} | {name} | {n} | {k} |")
        print()
    emu_cases = [c for c in rep["cases"] if "emu_dx_diff" in c]
    tot = sum(c["emu_dx_diff"] + c["emu_dw_diff"] + c["emu_db_diff"] for c in emu_cases)
    print(f"cases {len(rep['cases'])}, emulated {len(emu_cases)}, total differing elements {tot}; "
          f"graph {json.dumps(rep['graph'])}\n")
    if rep["timing"]:
        if rep.get("copy_gbps"):
            print(f"Copy bandwidth in this run (1 GiB device-to-device, read + write): {rep['copy_gbps']} GB/s\n")
        print("| dtype | M | N | eager fwd+bwd us | eager bwd us (GB/s) | bwd op us (GB/s) | compile fwd+bwd us | "
              "compile bwd us (GB/s) | Liger fwd+bwd us | Liger bwd us (GB/s) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

        def f(t, k):
            v = t.get(k + "_us")
            if v is None:
                return "-"
            g = t.get(k + "_GBps")
            return f"{v:.1f}" + (f" ({g})" if g is not None else "")
        for t in rep["timing"]:
            print(f"| {t['dtype']} | {t['rows']} | {t['cols']} | {f(t, 'eager_fwd_bwd')} | {f(t, 'eager_bwd')} | "
                  f"{f(t, 'eager_bwd_op')} | {f(t, 'compile_fwd_bwd')} | {f(t, 'compile_bwd')} | "
                  f"{f(t, 'liger_fwd_bwd')} | {f(t, 'liger_bwd')} |")
        print()
    print_kernel_table(rep)
    for e in rep["errors"]:
        print("ERROR", e)
    print(f"seconds {rep['seconds']} (grid {rep['grid_seconds']})")


def print_kernel_table(rep):
    """The work-in-progress kernel against eager autograd: per dtype and kind of case, then its timing rows."""
    print(f"## The kernel (kernels/layer_norm_backward) vs eager autograd: {rep.get('kernel', '-')}\n")
    if "kernel_dry_compile" in rep:
        print(f"dry run: NVRTC {rep['kernel_dry_compile']}\n")
    kc = rep.get("kernel_compiled")
    if kc:
        print(f"compiled: {kc['kind']} {kc['sha256'][:16]}, NVRTC {kc['nvrtc']}, {kc['seconds']} s, "
              f"{' '.join(kc['options'])}\n")
    ks = [c for c in rep["cases"] if "kernel_dx_diff" in c]
    if ks:
        print("Elements whose bits differ from eager's, summed (dw/db skipped where rows > 65536); "
              "= emulation: cases where the kernel equals the emulation in every gradient / cases emulated.\n")
        print("| dtype | kind | cases | dx/dw/db all 0 | dx differing | dw differing | db differing | "
              "= emulation | worst case (dx/dw/db, max ulp dx/dw) | inputs changed | NaN left |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
        for dt in DT:
            for kind in ("grid", "unaligned", "partial"):
                cs = [c for c in ks if c["dtype"] == dt and c["kind"] == kind]
                if not cs:
                    continue

                def tot(c):
                    return sum(c.get(f"kernel_{g}_diff") or 0 for g in ("dx", "dw", "db"))
                zero = sum(1 for c in cs if tot(c) == 0)
                sums = [sum(c.get(f"kernel_{g}_diff") or 0 for c in cs) for g in ("dx", "dw", "db")]
                skipped = sum(1 for c in cs if "kernel_dw_diff" not in c)
                emu = [c for c in cs if "kernel_vs_emu_dx_diff" in c]
                same = sum(1 for c in emu if all(c.get(f"kernel_vs_emu_{g}_diff", 0) == 0 for g in ("dx", "dw", "db")))
                w = max(cs, key=tot)
                worst = (f"{w['rows']}x{w['cols']}: {w['kernel_dx_diff']}/{w.get('kernel_dw_diff', '-')}/"
                         f"{w.get('kernel_db_diff', '-')}, {w['kernel_dx_max_ulp']}/{w.get('kernel_dw_max_ulp', '-')}"
                         if tot(w) else "-")
                changed = sum(1 for c in cs if c.get("kernel_inputs_changed"))
                nan = sum(sum(c.get("kernel_nan", {}).values()) for c in cs)
                print(f"| {dt} | {kind} | {len(cs)} | {zero} | {sums[0]} | {sums[1]}"
                      f"{f' ({skipped} skipped)' if skipped else ''} | {sums[2]} | {same}/{len(emu)} | {worst} | "
                      f"{changed} | {nan} |")
        print()
    failed = [c for c in rep["cases"] if "kernel_error" in c]
    if failed:
        print("Kernel errors: " + "; ".join(c["kernel_error"][:160] for c in failed) + "\n")
    kt = [t for t in rep["timing"] if "kernel_bwd_us" in t or "kernel_error" in t]
    if kt:
        print("Timing (median us, CUDA events; GB/s with the probe's bytes: read dy, x, w, mean, rstd, write dx, "
              "dw, db); eager/kernel = eager's bare backward op us / the kernel's (> 1: the kernel is faster).\n")
        print("| dtype | M | N | eager bwd op us (GB/s) | eager autograd bwd us | kernel us | kernel GB/s | "
              "eager/kernel | kernel vs eager dx/dw/db (max ulp dx/dw) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for t in kt:
            if "kernel_bwd_us" not in t:
                print(f"| {t['dtype']} | {t['rows']} | {t['cols']} | - | - | error | - | - | "
                      f"{t['kernel_error'][:80]} |")
                continue
            d = t["kernel_diff_vs_eager"]
            print(f"| {t['dtype']} | {t['rows']} | {t['cols']} | {t['eager_bwd_op_us']:.1f} "
                  f"({t.get('eager_bwd_op_GBps')}) | {t['eager_bwd_us']:.1f} | {t['kernel_bwd_us']:.1f} | "
                  f"{t.get('kernel_bwd_GBps')} | "
                  f"{t.get('eager_op_over_kernel')} | {d['dx']}/{d['dw']}/{d['db']} "
                  f"({t['kernel_dx_max_ulp']}/{t.get('kernel_dw_max_ulp', '-')}) |")
        print()
        print("GPU time per kernel (µs a call, torch.profiler): eager's backward op's kernels; the kernel's "
              "(and ln_bwd_dwdb's grid x block).\n")
        print("| dtype | M | N | eager's kernels | the kernel's | dw/db launch |")
        print("| --- | ---: | ---: | --- | --- | --- |")
        for t in kt:
            if "kernel_kernels_us" in t:
                def fmt(d):
                    return "; ".join(f"{k[:48]} {v}" for k, v in d.items()) or "-"
                ln = t.get("kernel_dwdb_launch")
                ln = f"{ln['grid']} x ({ln['block'][0]}, {ln['block'][1]})" if ln else "-"
                print(f"| {t['dtype']} | {t['rows']} | {t['cols']} | {fmt(t.get('eager_bwd_op_kernels_us', {}))} "
                      f"| {fmt(t['kernel_kernels_us'])} | {ln} |")
        print()


if __name__ == "__main__":
    sys.exit(main())
