#!/usr/bin/env python3
"""The backward of an HF decoder block's residual add and LlamaRMSNorm against real eager autograd
(issue 30, op fused_add_rms_norm_backward; docs/backward-fused-add.md): whether the bundled
kernel (kernels/fused_add_rms_norm_backward/kernel.cu) gives eager's gradient of x and of the
residual (one tensor: AddBackward0 passes h's gradient to both) and eager's dw, bit for bit, and
whether the CPU emulation (python/kernelize/backward_fused_add.py, from eager's own r) does.

    PYTHONUNBUFFERED=1 python3 scripts/fused_add_backward_probe.py OUT_DIR [--quick] [--budget S]
    python/.venv/bin/python scripts/fused_add_backward_probe.py /tmp/fap --dry-run   # CPU only

Eager: ``h = residual + x`` (T), ``y = LlamaRMSNorm(h)`` (transformers' arithmetic, the copy in
scripts/backward_probe.py), ``z = h + m`` (the next residual add: its AddBackward0 hands h the
gradient ``dres``), ``torch.autograd.grad((y, z), (x, residual, w), (dy, dres))``. The kernel:
its three entries on (dy, dres, h, w) with the hub's grids (the client's twin of the launch
arithmetic). Per case the elements of dx (against eager's dx and dresidual) and dw whose bits
differ (0 = eager's), max ulps; the emulation's where rows * cols <= 300 000; and two
alternatives to the documented sum (f32: dres + (gh1 + gh2); bf16/f16: the norm's gradient not
rounded to T before the add), each expected nonzero. Shapes: rows 1..64 every one, then 100,
1000, 1020, 1021, 4096, 16384 (eager's column sum splits over CTAs from 1021 rows on 132 SMs),
widths 1024, 2048, 2560, 4096, 5120, 8192 and 1001; bf16, f16, f32. Timing at 4096 x 8192 and
16384 x 4096: eager's backward of the block against the kernel's three launches. --dry-run:
eager on the CPU, the emulation for the kernel (its numbers mean nothing), NVRTC compiles the
source where found. Writes OUT_DIR/fused_add_backward_probe.json, prints a table; exits 1 when
something raised.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_probe import (CudaModule, LlamaRMSNorm, bits_diff, dry_compile, env_info, kernel_times,  # noqa: E402
                            max_ulp, ndiff, np32, probe_setup, timed)
from kernelize import backward as B  # noqa: E402 (backward_probe put python/ on the path)
from kernelize import backward_fused_add as FA  # noqa: E402
from kernelize.training import stage_dims, workspace_floats  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KSRC = os.path.join(ROOT, "kernels", "fused_add_rms_norm_backward", "kernel.cu")
DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
DT_NAME = {v: k for k, v in DT.items()}
ROWS = list(range(1, 65)) + [100, 1000, 1020, 1021, 4096, 16384]
COLS = [1024, 2048, 2560, 4096, 5120, 8192, 1001]
QUICK_ROWS = [1, 2, 3, 7, 8, 16, 17, 33, 64, 1020, 1021, 4096]
QUICK_COLS = [1024, 4096, 8192, 1001]
TIMED = [(4096, 8192), (16384, 4096)]
EPS = 1e-6
EMU_MAX_ELEMS = 300_000
OP = "fused_add_rms_norm_backward"


def make_inputs(dt, rows, cols, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    T = DT[dt]
    x = torch.randn(rows, cols, generator=g).to(T)
    res = (2 * torch.randn(rows, cols, generator=g)).to(T)
    w = (1 + 0.2 * torch.randn(cols, generator=g)).to(T)
    m = torch.randn(rows, cols, generator=g).to(T)
    dy = torch.randn(rows, cols, generator=g).to(T)
    dres = torch.randn(rows, cols, generator=g).to(T)
    return [t.to(device) for t in (x, res, w, m, dy, dres)]


def eager(x, res, w, m, dy, dres):
    """(h, dx, dresidual, dw) of eager autograd through the block."""
    norm = LlamaRMSNorm(x.shape[1], EPS).to(device=x.device, dtype=x.dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
    xr, rr = x.clone().requires_grad_(True), res.clone().requires_grad_(True)
    h = rr + xr
    y = norm(h)
    z = h + m
    gx, gres, gw = torch.autograd.grad((y, z), (xr, rr, norm.weight), (dy, dres))
    return h.detach(), gx, gres, gw


class Kernel:
    def __init__(self, device):
        self.mod = CudaModule(open(KSRC, encoding="utf-8").read(), "fused_add_rms_norm_backward.cu", device,
                              [f"fused_add_rms_norm_bwd_{s}_{dt}" for s in ("dx", "dwp", "dw") for dt in DT])
        props = torch.cuda.get_device_properties(device)
        self.sms, self.tps = props.multi_processor_count, props.max_threads_per_multi_processor

    def bind(self, h, w, dy, dres):
        rows, cols = h.shape
        dt = DT_NAME[h.dtype]
        dx = torch.full_like(h, float("nan"))
        dw = torch.full_like(w, float("nan"))
        ws = torch.full((workspace_floats(rows, cols, self.sms, self.tps),), float("nan"),
                        dtype=torch.float32, device=h.device)
        dims = {s: stage_dims(s, rows, cols, self.sms, self.tps, OP) for s in ("dx", "dwp", "dw")}
        m = self.mod

        def go():
            m.launch(f"fused_add_rms_norm_bwd_dx_{dt}", *dims["dx"], (dx, ws, dy, dres, h, w, rows, cols, EPS))
            m.launch(f"fused_add_rms_norm_bwd_dwp_{dt}", *dims["dwp"], (ws, dy, h, rows, cols, self.sms, self.tps))
            m.launch(f"fused_add_rms_norm_bwd_dw_{dt}", *dims["dw"], (dw, ws, rows, cols, self.sms, self.tps))
            return dx, dw
        return go



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for the grid (timing still runs)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtypes", default="bf16,f16,f32", help="comma-separated, in this order (f32 first "
                    "to reach it within a short budget)")
    args = ap.parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not dtypes or not set(dtypes) <= set(DT):
        ap.error(f"--dtypes: some of {', '.join(DT)}")
    t0 = time.time()
    out_dir, dry, device = probe_setup(args, "fused_add_backward_probe_out")
    rep = dict(env=env_info(device), dry_run=dry, cases=[], timing=[], errors=[], alternatives={},
               dry_compile=None, kernel_compiled=None)
    kern = None
    if dry:
        rep["dry_compile"] = dry_compile(KSRC, "fused_add_rms_norm_backward.cu")
    else:
        try:
            kern = Kernel(device)
            rep["kernel_compiled"] = dict(kind=kern.mod.code.code_kind, sha256=hashlib.sha256(kern.mod.code.code).hexdigest())
        except Exception as e:  # noqa: BLE001
            rep["errors"].append(f"kernel: {type(e).__name__}: {e}"[:400])
            traceback.print_exc()
    sms = kern.sms if kern else 132
    tps = kern.tps if kern else 2048
    if dry:
        shapes = [(r, c) for r in (1, 3, 64) for c in (96, 1001)]
    elif args.quick:
        shapes = [(r, c) for r in QUICK_ROWS for c in QUICK_COLS]
    else:
        shapes = [(r, c) for r in ROWS for c in COLS]
    stop = False
    for dt in dtypes:
        for rows, cols in shapes:
            if time.time() - t0 > args.budget:
                rep["errors"].append(f"budget: the grid stopped at {dt} [{rows}, {cols}] after {args.budget} s")
                stop = True
                break
            try:
                x, res, w, m, dy, dres = make_inputs(dt, rows, cols, device, seed=rows * 17 + cols)
                h, gx, gres, gw = eager(x, res, w, m, dy, dres)
                case = dict(dtype=dt, rows=rows, cols=cols, eager_dx_is_dres=bool(torch.equal(gx, gres)))
                if kern is not None:
                    kdx, kdw = kern.bind(h, w, dy, dres)()
                    torch.cuda.synchronize(device)
                    case.update(dx_diff=ndiff(kdx, gx), dres_diff=ndiff(kdx, gres), dw_diff=ndiff(kdw, gw),
                                dx_max_ulp=max_ulp(kdx, gx), dw_max_ulp=max_ulp(kdw, gw))
                if rows * cols <= EMU_MAX_ELEMS:
                    hn = np32(h)
                    r = np32(torch.rsqrt(h.float().pow(2).mean(-1) + EPS)) if not dry else None
                    edx, edw, p = FA.fused_add_rms_norm_backward(hn, np32(w), np32(dy), np32(dres), EPS, dt, r=r,
                                                                 num_sms=sms, max_threads_per_sm=tps,
                                                                 return_parts=True)
                    case.update(emu_dx_diff=bits_diff(edx, np32(gx)), emu_dw_diff=bits_diff(edw, np32(gw)))
                    gh1, gh2, dn = p["gh1"], p["gh2"], np32(dres)
                    if dt == "f32":
                        alt = {"f32: dres + (gh1 + gh2)": (dn + (gh1 + gh2).astype(np.float32)).astype(np.float32)}
                    else:
                        alt = {f"{dt}: fl(gh1 + gh2) + dres, no rounding to T between":
                               B.round_to(((gh1 + gh2).astype(np.float32) + dn).astype(np.float32), dt)}
                    for k, v in alt.items():
                        rep["alternatives"][k] = rep["alternatives"].get(k, 0) + bits_diff(v, np32(gx))
                rep["cases"].append(case)
            except Exception as e:  # noqa: BLE001
                rep["errors"].append(f"{dt} [{rows}, {cols}]: {type(e).__name__}: {e}"[:400])
                traceback.print_exc()
                if "CUDA" in str(e) and not dry:
                    stop = True
            if stop:
                break
        if stop:
            break
    for dt in (dtypes[:1] if dry else dtypes):
        for rows, cols in ([(64, 256)] if dry else TIMED):
            if stop:
                break
            try:
                x, res, w, m, dy, dres = make_inputs(dt, rows, cols, device, seed=11)
                norm = LlamaRMSNorm(cols, EPS).to(device=device, dtype=x.dtype)
                with torch.no_grad():
                    norm.weight.copy_(w)
                xr, rr = x.clone().requires_grad_(True), res.clone().requires_grad_(True)
                h = rr + xr
                y, z = norm(h), h + m
                bwd = lambda: torch.autograd.grad((y, z), (xr, rr, norm.weight), (dy, dres), retain_graph=True)  # noqa: E731
                t = dict(dtype=dt, rows=rows, cols=cols, eager_bwd_us=timed(bwd, device, args.reps),
                         eager_bwd_kernels_us=kernel_times(bwd, device, args.reps))
                if kern is not None:
                    go = kern.bind(h.detach(), w, dy, dres)
                    t["kernel_bwd_us"] = timed(go, device, args.reps)
                    t["kernel_bwd_kernels_us"] = kernel_times(go, device, args.reps)
                    # bytes that must move: dy, dres, h read, dx written
                    t["kernel_bwd_GBps"] = round(4 * x.numel() * x.element_size() / (t["kernel_bwd_us"] * 1e-6) / 1e9, 1)
                    t["speedup"] = round(t["eager_bwd_us"] / t["kernel_bwd_us"], 2)
                rep["timing"].append(t)
            except Exception as e:  # noqa: BLE001
                rep["errors"].append(f"timing {dt} [{rows}, {cols}]: {type(e).__name__}: {e}"[:400])
                traceback.print_exc()
    rep["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(out_dir, "fused_add_backward_probe.json"), "w", encoding="utf-8") as fh:
        json.dump(rep, fh, indent=1)
    print_table(rep)
    return 1 if rep["errors"] else 0


def print_table(rep):
    env = rep["env"]
    print(f"\n## residual add + LlamaRMSNorm backward: the bundled kernel against eager autograd "
          f"({env.get('device', 'cpu')}, torch {env['torch']}{', DRY RUN' if rep['dry_run'] else ''})\n")
    print("| dtype | cases | kernel dx / dw differing (cases with any) | max ulp dx / dw | emulation dx / dw (cases) |")
    print("| --- | ---: | --- | --- | --- |")
    for dt in DT:
        cs = [c for c in rep["cases"] if c["dtype"] == dt]
        if not cs:
            continue
        k = [c for c in cs if "dx_diff" in c]
        e = [c for c in cs if "emu_dx_diff" in c]
        kp = (f"{sum(c['dx_diff'] for c in k)} / {sum(c['dw_diff'] for c in k)} "
              f"({sum(1 for c in k if c['dx_diff'] or c['dw_diff'])})" if k else "-")
        ul = f"{max(c['dx_max_ulp'] for c in k)} / {max(c['dw_max_ulp'] for c in k)}" if k else "-"
        ep = f"{sum(c['emu_dx_diff'] for c in e)} / {sum(c['emu_dw_diff'] for c in e)} ({len(e)})" if e else "-"
        print(f"| {dt} | {len(cs)} | {kp} | {ul} | {ep} |")
    if not all(c["eager_dx_is_dres"] for c in rep["cases"]):
        print("NOTE: eager's dx and dresidual differ somewhere")
    for c in [c for c in rep["cases"] if c.get("dx_diff") or c.get("dw_diff")][:20]:
        print(f"  differs: {c}")
    for k, v in rep["alternatives"].items():
        print(f"alternative {k}: {v} elements differ from eager (expected > 0)")
    if rep["timing"]:
        print("\n| dtype | rows x cols | eager bwd us | kernel bwd us | GB/s | speedup |\n| --- | --- | ---: | ---: | ---: | ---: |")
        for t in rep["timing"]:
            print(f"| {t['dtype']} | {t['rows']} x {t['cols']} | {t['eager_bwd_us']:.1f} | "
                  f"{t.get('kernel_bwd_us', float('nan')):.1f} | {t.get('kernel_bwd_GBps', '-')} | {t.get('speedup', '-')} |")
    if rep["dry_compile"]:
        print(f"dry_compile: {rep['dry_compile']}")
    if rep["errors"]:
        print("\nerrors: " + "; ".join(rep["errors"][:10]))
    print(f"\nseconds {rep['seconds']}")


if __name__ == "__main__":
    sys.exit(main())
