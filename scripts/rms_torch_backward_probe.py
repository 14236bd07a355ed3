#!/usr/bin/env python3
"""F.rms_norm / nn.RMSNorm's backward against real eager autograd (issue 30): whether the bundled
kernel of rms_norm_backward, semantics torch (kernels/rms_norm_torch_backward/kernel.cu), gives
eager's dx and dw bit for bit, whether its recomputed r is the rstd eager's forward saved, and
whether the CPU emulation (python/kernelize/backward_rms_torch.py) is eager's, so that a mismatch
says whether the order model or the kernel is wrong (docs/backward-rms-torch.md).

    PYTHONUNBUFFERED=1 python3 scripts/rms_torch_backward_probe.py OUT_DIR [--quick] [--budget S]
    python/.venv/bin/python scripts/rms_torch_backward_probe.py /tmp/rtp --dry-run   # CPU only

For each dtype (bf16, f16, f32) and shape: rows 1..64 every one, then 100, 127, 128, 255, 256,
520, 1000, 1021, 4096, 16384 (eager's dw chains change at 64, 128 and 256 rows; the kernel's dwp
keeps the chains in its workspace from about 1021 rows on 132 SMs), widths 1024, 2048, 2560, 4096,
5120, 8192 (model widths: the forward's vectorized order and eager's vectorized dx kernel) and
1000, 1001, 4099 (cols % 4 != 0: the forward's Welford over 512 lanes and eager's plain dx kernel),
plus large shapes 32768 x 4096 and 65536 x 1024: eager autograd of ``F.rms_norm(x, [cols], w,
1e-6)`` (x and w requiring grad; dy normal), eager's saved rstd (``torch._fused_rms_norm``), the
kernel's three launches with the hub's grids (the client's twin of the launch arithmetic); per
case the elements of dx and dw and rows of r whose bits differ from eager's (0 = eager's), and
max ulps. Where rows * cols <= 300 000 the emulation also runs from eager's own rstd: its dx and
dw against eager's (emu_*), and alternative orders scored the same way (``hypotheses``: dx's
other contractions, s2 unfused, dw's chains unfused; each nonzero where eager is the documented
order). The graph of eager's autograd (node names) per dtype. Timing (CUDA events, median; GPU
time per kernel from torch.profiler) at 4096 x 8192 and 16384 x 4096: eager backward against the
kernel's three launches, and eager fwd+bwd against the bundled forward (kernels/rms_norm_torch) +
this backward. rows > 65536 with cols / 32 < SMs / 2 is eager's two-pass dw, which the kernel
does not implement: such shapes are skipped (said so).

--dry-run (no GPU): eager autograd on the CPU, the emulation in place of the kernel (from the
emulation's own r), NVRTC compiles the kernel's source where a libnvrtc is found; the code paths
only, its numbers mean nothing. Writes OUT_DIR/rms_torch_backward_probe.json and prints a table;
exits 1 when something raised (the rest still runs).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_probe import (CudaModule, bits_diff, dry_compile, env_info, graph_names, kernel_times,  # noqa: E402
                            max_ulp, ndiff, np32, probe_setup, timed)
from kernelize import backward_ln as BL  # noqa: E402 (backward_probe put python/ on the path)
from kernelize import backward_rms_torch as RT  # noqa: E402
from kernelize.training import stage_dims, workspace_floats  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KSRC = os.path.join(ROOT, "kernels", "rms_norm_torch_backward", "kernel.cu")
FWD_DIR = os.path.join(ROOT, "kernels", "rms_norm_torch")
DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
DT_NAME = {v: k for k, v in DT.items()}
ROWS = list(range(1, 65)) + [100, 127, 128, 255, 256, 520, 1000, 1021, 4096, 16384]
COLS = [1024, 2048, 2560, 4096, 5120, 8192, 1000, 1001, 4099]
LARGE = [(32768, 4096), (65536, 1024)]
QUICK_ROWS = [1, 2, 3, 7, 8, 16, 17, 33, 63, 64, 127, 128, 255, 256, 1021, 4096]
QUICK_COLS = [1024, 4096, 8192, 1001]
TIMED = [(4096, 8192), (16384, 4096)]
EPS = 1e-6
EMU_MAX_ELEMS = 300_000
F = torch.nn.functional
OP = "rms_norm_backward"


def make_inputs(dt, rows, cols, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    T = DT[dt]
    x = (torch.randn(rows, cols, generator=g) * 2).to(T)
    w = (1 + 0.2 * torch.randn(cols, generator=g)).to(T)
    dy = torch.randn(rows, cols, generator=g).to(T)
    return x.to(device), w.to(device), dy.to(device)


def eager(x, w, dy):
    """(dx, dw, the node names of eager's graph) of F.rms_norm under autograd."""
    xr = x.clone().requires_grad_(True)
    wr = w.clone().requires_grad_(True)
    y = F.rms_norm(xr, [x.shape[-1]], wr, EPS)
    names = graph_names(y.grad_fn)
    dx, dw = torch.autograd.grad(y, (xr, wr), dy)
    return dx, dw, names


def eager_rstd(x, w):
    """The rstd eager's forward saves ([rows] f32), or None where torch has no _fused_rms_norm."""
    fn = getattr(torch, "_fused_rms_norm", None) or getattr(torch.ops.aten, "_fused_rms_norm", None)
    if fn is None:
        return None
    with torch.no_grad():
        return fn(x, [x.shape[-1]], w, EPS)[1].reshape(-1).float()


class Kernel:
    """The bundled kernel in one NVRTC module; `run(x, w, dy)` -> (dx, dw, r) with the hub's
    grids and workspace (outputs poisoned with NaN first)."""

    def __init__(self, device, options=()):
        self.mod = CudaModule(open(KSRC, encoding="utf-8").read(), "rms_norm_torch_backward.cu", device,
                              [f"rms_norm_torch_bwd_{s}_{dt}" for s in ("dx", "dwp", "dw") for dt in DT], options)
        props = torch.cuda.get_device_properties(device)
        self.sms, self.tps = props.multi_processor_count, props.max_threads_per_multi_processor

    def bind(self, x, w, dy):
        rows, cols = x.shape
        dt = DT_NAME[x.dtype]
        dx = torch.full_like(x, float("nan"))
        dw = torch.full_like(w, float("nan"))
        ws = torch.full((workspace_floats(rows, cols, self.sms, self.tps),), float("nan"),
                        dtype=torch.float32, device=x.device)
        dims = {s: stage_dims(s, rows, cols, self.sms, self.tps, OP) for s in ("dx", "dwp", "dw")}
        m = self.mod

        def go():
            m.launch(f"rms_norm_torch_bwd_dx_{dt}", *dims["dx"], (dx, ws, dy, x, w, rows, cols, EPS))
            m.launch(f"rms_norm_torch_bwd_dwp_{dt}", *dims["dwp"], (ws, dy, x, rows, cols, self.sms, self.tps))
            m.launch(f"rms_norm_torch_bwd_dw_{dt}", *dims["dw"], (dw, ws, rows, cols, self.sms, self.tps))
            return dx, dw, ws[:rows]
        return go


def bundled_forward(dt, device):
    """The bundled exact forward (kernels/rms_norm_torch) as f(x, w, eps), or None and why."""
    try:
        from kernelize import launch as L
        from kernelize.manifest import parse_manifest_toml
        man = parse_manifest_toml(open(os.path.join(FWD_DIR, "kernel.toml"), encoding="utf-8").read())
        src = open(os.path.join(FWD_DIR, man["source"]), encoding="utf-8").read()
        k = L.CompiledKernel(man, src, dt, device)
        return (lambda x, w, eps: L.run_rms_norm(k, x, w, eps)), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"



# alternatives to the documented order, scored by the emulation from eager's rstd
def hypotheses(x, w, dy, r, dt, ex, ew, sms, tps):
    zero = np.zeros(x.shape[0], np.float32)
    out = {}
    for s2_fma in (True, False):
        _, s2 = BL.row_stats(dy, x, w, zero, r, sum_fma=s2_fma)
        for f in ("xy_sub_z", "x_sub_yz", "none"):
            dx = BL.dx_from_stats(dy, x, w, zero, r, zero, s2, dt, f)
            out[f"dx {f}, s2 {'fma' if s2_fma else 'nofma'}"] = bits_diff(dx, ex)
    cfg = BL.gamma_beta_config(*x.shape, sms)
    q = BL._mul(dy, x)
    for fused in (True, False):
        dw = BL.column_sums(q, r.reshape(-1, 1), dt, cfg, fused, sms, tps)
        out[f"dw chains {'fma' if fused else 'nofma'}"] = bits_diff(dw, ew)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--dry-run", action="store_true", help="CPU only: the emulation for the kernel")
    ap.add_argument("--quick", action="store_true", help="fewer shapes (16 rows x 4 widths, no large)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for the grid (timing still runs)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtypes", default="bf16,f16,f32", help="comma-separated, in this order (f32 first "
                    "to reach it within a short budget)")
    args = ap.parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not dtypes or not set(dtypes) <= set(DT):
        ap.error(f"--dtypes: some of {', '.join(DT)}")
    t0 = time.time()
    out_dir, dry, device = probe_setup(args, "rms_torch_backward_probe_out")
    rep = dict(env=env_info(device), dry_run=dry, cases=[], skipped=[], graph={}, timing=[], errors=[],
               hypotheses={}, dry_compile=None, kernel_compiled=None)
    kern = None
    if dry:
        rep["dry_compile"] = dry_compile(KSRC, "rms_norm_torch_backward.cu")
    else:
        try:
            kern = Kernel(device)
            import hashlib
            rep["kernel_compiled"] = dict(kind=kern.mod.code.code_kind,
                                          sha256=hashlib.sha256(kern.mod.code.code).hexdigest())
        except Exception as e:  # noqa: BLE001
            rep["errors"].append(f"kernel: {type(e).__name__}: {e}"[:400])
            traceback.print_exc()
    sms = kern.sms if kern else 132
    tps = kern.tps if kern else 2048
    if dry:
        shapes = [(r, c) for r in (1, 3, 64, 130) for c in (96, 1001)]
    elif args.quick:
        shapes = [(r, c) for r in QUICK_ROWS for c in QUICK_COLS]
    else:
        shapes = [(r, c) for r in ROWS for c in COLS] + LARGE
    stop = False
    for dt in dtypes:
        for rows, cols in shapes:
            if time.time() - t0 > args.budget:
                if not stop:
                    rep["errors"].append(f"budget: the grid stopped at {dt} [{rows}, {cols}] after {args.budget} s")
                stop = True
                break
            if RT.two_pass(rows, cols, sms):
                rep["skipped"].append(f"{dt} [{rows}, {cols}]: eager's two-pass dw (not implemented)")
                continue
            try:
                x, w, dy = make_inputs(dt, rows, cols, device, seed=rows * 131 + cols)
                ex, ew, names = eager(x, w, dy)
                rep["graph"].setdefault(dt, names)
                case = dict(dtype=dt, rows=rows, cols=cols, gb=BL.gamma_beta_config(rows, cols, sms)["variant"])
                er = eager_rstd(x, w) if not dry else None
                small = rows * cols <= EMU_MAX_ELEMS
                if kern is not None:
                    kdx, kdw, kr = kern.bind(x, w, dy)()
                    torch.cuda.synchronize(device)
                    case.update(dx_diff=ndiff(kdx, ex), dw_diff=ndiff(kdw, ew), dx_max_ulp=max_ulp(kdx, ex),
                                dw_max_ulp=max_ulp(kdw, ew))
                    if er is not None:
                        case["r_diff"] = ndiff(kr, er)
                if small or dry:
                    xn, wn, dyn = np32(x), np32(w), np32(dy)
                    r = np32(er) if er is not None else RT.forward_rstd(xn, EPS)
                    edx, edw = RT.rms_norm_backward(dyn, xn, wn, r, dt, sms=sms, max_threads_per_sm=tps)
                    case.update(emu_dx_diff=bits_diff(edx, np32(ex)), emu_dw_diff=bits_diff(edw, np32(ew)))
                    if er is not None:   # the emulation's order, the GPU's rsqrtf (torch.rsqrt: rsqrtf)
                        gpu_rsqrt = lambda v: np32(torch.rsqrt(torch.from_numpy(np.ascontiguousarray(v)).to(device)))  # noqa: E731
                        case["emu_r_diff"] = bits_diff(RT.forward_rstd(xn, EPS, rsqrt=gpu_rsqrt), np32(er))
                    if dt == "f32" or rows * cols <= 65536:
                        for k, v in hypotheses(xn, wn, dyn, r, dt, np32(ex), np32(ew), sms, tps).items():
                            rep["hypotheses"][k] = rep["hypotheses"].get(k, 0) + v
                rep["cases"].append(case)
            except Exception as e:  # noqa: BLE001
                rep["errors"].append(f"{dt} [{rows}, {cols}]: {type(e).__name__}: {e}"[:400])
                traceback.print_exc()
                if "CUDA" in str(e) and not dry:
                    stop = True   # a trap is sticky: the context is lost
            if stop:
                break
        if stop:
            break
    for dt in (dtypes[:1] if dry else dtypes):
        for rows, cols in ([(64, 256)] if dry else TIMED):
            if stop:
                break
            try:
                x, w, dy = make_inputs(dt, rows, cols, device, seed=11)
                xr = x.clone().requires_grad_(True)
                wr = w.clone().requires_grad_(True)
                y = F.rms_norm(xr, [cols], wr, EPS)
                bwd = lambda: torch.autograd.grad(y, (xr, wr), dy, retain_graph=True)  # noqa: E731

                def fwd_bwd():
                    xx = x.clone().requires_grad_(True)
                    ww = w.clone().requires_grad_(True)
                    return torch.autograd.grad(F.rms_norm(xx, [cols], ww, EPS), (xx, ww), dy)
                t = dict(dtype=dt, rows=rows, cols=cols, eager_bwd_us=timed(bwd, device, args.reps),
                         eager_fwd_bwd_us=timed(fwd_bwd, device, args.reps),
                         eager_bwd_kernels_us=kernel_times(bwd, device, args.reps))
                if kern is not None:
                    go = kern.bind(x, w, dy)
                    t["kernel_bwd_us"] = timed(go, device, args.reps)
                    t["kernel_bwd_kernels_us"] = kernel_times(go, device, args.reps)
                    # bytes that must move: dy, x read, dx written (w and dw one row each)
                    t["kernel_bwd_GBps"] = round(3 * x.numel() * x.element_size() / (t["kernel_bwd_us"] * 1e-6) / 1e9, 1)
                    fwd, why = bundled_forward(dt, device)
                    if fwd is not None:
                        t["ours_fwd_bwd_us"] = timed(lambda: (fwd(x, w, EPS), go()), device, args.reps)
                        t["speedup_fwd_bwd"] = round(t["eager_fwd_bwd_us"] / t["ours_fwd_bwd_us"], 2)
                    else:
                        t["bundled_forward"] = why
                rep["timing"].append(t)
            except Exception as e:  # noqa: BLE001
                rep["errors"].append(f"timing {dt} [{rows}, {cols}]: {type(e).__name__}: {e}"[:400])
                traceback.print_exc()
    rep["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(out_dir, "rms_torch_backward_probe.json"), "w", encoding="utf-8") as fh:
        json.dump(rep, fh, indent=1)
    print_table(rep)
    return 1 if rep["errors"] else 0


def print_table(rep):
    env = rep["env"]
    print(f"\n## F.rms_norm backward: the bundled kernel against eager autograd ({env.get('device', 'cpu')}, "
          f"torch {env['torch']}{', DRY RUN' if rep['dry_run'] else ''})\n")
    print("| dtype | cases | kernel dx / dw / r differing (cases with any) | max ulp dx / dw | "
          "emulation dx / dw / r differing (cases) |")
    print("| --- | ---: | --- | --- | --- |")
    for dt in DT:
        cs = [c for c in rep["cases"] if c["dtype"] == dt]
        if not cs:
            continue
        k = [c for c in cs if "dx_diff" in c]
        e = [c for c in cs if "emu_dx_diff" in c]
        kpart = (f"{sum(c['dx_diff'] for c in k)} / {sum(c['dw_diff'] for c in k)} / "
                 f"{sum(c.get('r_diff', 0) for c in k)} ({sum(1 for c in k if c['dx_diff'] or c['dw_diff'] or c.get('r_diff'))})"
                 if k else "-")
        ulp = f"{max(c['dx_max_ulp'] for c in k)} / {max(c['dw_max_ulp'] for c in k)}" if k else "-"
        epart = (f"{sum(c['emu_dx_diff'] for c in e)} / {sum(c['emu_dw_diff'] for c in e)} / "
                 f"{sum(c.get('emu_r_diff', 0) for c in e)} ({len(e)})" if e else "-")
        print(f"| {dt} | {len(cs)} | {kpart} | {ulp} | {epart} |")
    bad = [c for c in rep["cases"] if c.get("dx_diff") or c.get("dw_diff") or c.get("r_diff")]
    for c in bad[:20]:
        print(f"  differs: {c}")
    if rep["hypotheses"]:
        print("\n| hypothesis (emulation from eager's rstd) | elements differing from eager |\n| --- | ---: |")
        for k, v in rep["hypotheses"].items():
            print(f"| {k} | {v} |")
    for dt, names in rep["graph"].items():
        print(f"graph {dt}: {json.dumps(names)[:300]}")
    if rep["timing"]:
        print("\n| dtype | rows x cols | eager bwd us | kernel bwd us | GB/s | eager fwd+bwd us | ours fwd+bwd us | speedup |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for t in rep["timing"]:
            print(f"| {t['dtype']} | {t['rows']} x {t['cols']} | {t['eager_bwd_us']:.1f} | {t.get('kernel_bwd_us', float('nan')):.1f} | "
                  f"{t.get('kernel_bwd_GBps', '-')} | {t['eager_fwd_bwd_us']:.1f} | {t.get('ours_fwd_bwd_us', float('nan')):.1f} | "
                  f"{t.get('speedup_fwd_bwd', '-')} |")
    if rep["skipped"]:
        print(f"\nskipped {len(rep['skipped'])}: {rep['skipped'][:3]}")
    if rep["dry_compile"]:
        print(f"dry_compile: {rep['dry_compile']}")
    if rep["errors"]:
        print("\nerrors: " + "; ".join(rep["errors"][:10]))
    print(f"\nseconds {rep['seconds']}")


if __name__ == "__main__":
    sys.exit(main())
