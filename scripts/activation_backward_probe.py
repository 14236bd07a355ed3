#!/usr/bin/env python3
"""The elementwise activations' backward against real eager autograd (issue 30): whether the
bundled kernels of ops silu_backward, gelu_backward and gelu_tanh_backward
(kernels/<op>/kernel.cu) give eager's dx bit for bit (docs/backward-activations.md), and, for
gelu_backward, which candidate form of `cdf + x * pdf` eager's binary has: the bundled default
(B: cdf's product fused, the bits of no contraction) or `-DGB_FMA_XPDF=1` (A: x * pdf fused).

    PYTHONUNBUFFERED=1 python3 scripts/activation_backward_probe.py OUT_DIR     # on the GPU machine
    python/.venv/bin/python scripts/activation_backward_probe.py /tmp/abp --dry-run  # CPU: NVRTC only

For each activation, dtype (bf16, f16, f32) and shape (rows 1..4096 x widths 1001 (the kernels'
scalar tail), 3072 (GPT-2's MLP), 8192), x drawn like activations (normal x 3, plus a slice of
extreme values where exp overflows, erf and tanh saturate, and +-inf), dy normal: eager's dx of
`F.silu(x)` / `F.gelu(x)` / `F.gelu(x, approximate="tanh")` from torch.autograd.grad, and each
variant's (one NVRTC module per variant, the hub's block and grid): the elements whose bits differ
(NaN equal to NaN; 0 = eager's). Then, at the large shapes, the median time of eager's backward
against the kernel's one launch. Writes OUT_DIR/activation_backward_probe.json and prints a
table; exits 1 when something raised.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backward_probe import CudaModule, dry_compile, kernel_times, max_ulp, probe_setup, same_device, timed  # noqa: E402
from ln_backward_probe import DT, DT_NAME  # noqa: E402
from kernelize.training import stage_dims  # noqa: E402 (backward_probe put python/ on the path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F = torch.nn.functional
# activation -> (eager's forward, the variants: name -> NVRTC options)
ACTS = {
    "silu": (F.silu, {"bundled": ()}),
    "gelu": (F.gelu, {"bundled": (), "fma_xpdf": ("-DGB_FMA_XPDF=1",)}),
    "gelu_tanh": (lambda v: F.gelu(v, approximate="tanh"), {"bundled": ()}),
}
ROWS = [1, 7, 64, 4096]
COLS = [1001, 3072, 8192]
TIMED = [(4096, 3072), (16384, 8192)]


def source(act: str) -> str:
    return os.path.join(ROOT, "kernels", f"{act}_backward", "kernel.cu")


def inputs(dt, rows, cols, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    T = DT[dt]
    x = (torch.randn(rows, cols, generator=g) * 3).to(T)
    flat = x.view(-1)
    k = max(1, flat.numel() // 64)
    extremes = torch.tensor([-100.0, -88.7, -87.0, -20.0, -10.0, -5.0, -3.0, -1.0, -0.7, -0.5, 0.5, 0.7,
                             1.0, 3.0, 5.0, 10.0, 20.0, 87.0, 88.8, 100.0, 1e-3, -1e-3, 0.0, -0.0,
                             float("inf"), float("-inf")])
    flat[:k] = extremes[torch.arange(k) % len(extremes)].to(T)
    dy = torch.randn(rows, cols, generator=g).to(T)
    return x.to(device), dy.to(device)


def ndiff_nan_equal(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ, any NaN equal to any NaN (a bf16 NaN's payload is the
    conversion's, not the arithmetic's)."""
    a, b = same_device(a, b)
    both_nan = torch.isnan(a) & torch.isnan(b)
    ia = a.view(torch.int32 if a.dtype == torch.float32 else torch.int16)
    ib = b.view(torch.int32 if b.dtype == torch.float32 else torch.int16)
    return int(((ia != ib) & ~both_nan).sum().item())


class Kernel:
    """The bundled kernel of `act` in one NVRTC module per variant; `bind(v, dy, x)()` -> dx,
    poisoned with NaN first."""

    def __init__(self, device, act):
        self.act, self.prefix = act, f"{act}_bwd"
        self.mods = {v: CudaModule(open(source(act), encoding="utf-8").read(), f"{act}_backward.cu", device,
                                   [f"{self.prefix}_{dt}" for dt in DT], opts)
                     for v, opts in ACTS[act][1].items()}
        props = torch.cuda.get_device_properties(device)
        self.sms, self.tps = props.multi_processor_count, props.max_threads_per_multi_processor

    def bind(self, variant, dy, x):
        n = x.numel()
        dx = torch.full_like(x, float("nan"))
        grid = stage_dims("grad", 1, n, self.sms, self.tps, f"{self.act}_backward")[0][0]   # the hub's launch (the client's twin)
        entry = f"{self.prefix}_{DT_NAME[x.dtype]}"

        def go():
            self.mods[variant].launch(entry, grid, 256, (dx, dy, x, n))
            return dx
        return go


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--dry-run", action="store_true", help="CPU only: NVRTC compiles each variant")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--acts", default=",".join(ACTS), help="comma-separated: silu, gelu, gelu_tanh")
    args = ap.parse_args(argv)
    acts = [a for a in args.acts.split(",") if a]
    if not acts or not set(acts) <= set(ACTS):
        ap.error(f"--acts: some of {', '.join(ACTS)}")
    t0 = time.time()
    out_dir, dry, device = probe_setup(args, "activation_backward_probe_out")
    report = dict(torch=torch.__version__, device=(torch.cuda.get_device_name(device) if not dry else "cpu"),
                  dry_run=dry, acts=acts, cases=[], timing=[], errors=[], dry_compile={})
    kerns = {}
    for act in acts:
        if dry:
            for v, opts in ACTS[act][1].items():
                report["dry_compile"][f"{act}/{v}"] = dry_compile(source(act), f"{act}_backward.cu", opts)
        else:
            kerns[act] = Kernel(device, act)
    for act, dt in ((a, d) for a in acts for d in DT):
        kern = kerns.get(act)
        for rows in ([1, 8] if dry else ROWS):
            for cols in ([1001] if dry else COLS):
                try:
                    x, dy = inputs(dt, rows, cols, device, seed=rows * 31 + cols)
                    xr = x.clone().requires_grad_(True)
                    (ex,) = torch.autograd.grad(ACTS[act][0](xr), (xr,), dy)
                    case = dict(act=act, dtype=dt, rows=rows, cols=cols)
                    for v in (ACTS[act][1] if kern else []):
                        kx = kern.bind(v, dy, x)()
                        finite = torch.isfinite(kx) & torch.isfinite(ex)
                        case[v] = dict(dx=ndiff_nan_equal(kx, ex),
                                       dx_max_ulp_finite=max_ulp(kx[finite], ex[finite]))
                    report["cases"].append(case)
                except Exception as e:  # noqa: BLE001
                    report["errors"].append(f"{act} {dt} [{rows}, {cols}]: {type(e).__name__}: {e}"[:400])
                    traceback.print_exc()
    for act, (rows, cols) in ((a, rc) for a in acts for rc in ([] if dry else TIMED)):
        kern = kerns[act]
        try:
            x, dy = inputs("bf16", rows, cols, device, seed=7)
            xr = x.clone().requires_grad_(True)
            y = ACTS[act][0](xr)
            eager = lambda: torch.autograd.grad(y, (xr,), dy, retain_graph=True)  # noqa: E731
            t = dict(act=act, dtype="bf16", rows=rows, cols=cols, eager_bwd_us=timed(eager, device, args.reps),
                     eager_kernels_us=kernel_times(eager, device, args.reps))
            go = kern.bind("bundled", dy, x)
            t["bundled_us"] = timed(go, device, args.reps)
            t["bundled_kernels_us"] = kernel_times(go, device, args.reps)
            # bytes that must move: dy, x read; dx written
            t["bundled_GBps"] = round(3 * x.numel() * x.element_size() / (t["bundled_us"] * 1e-6) / 1e9, 1)
            report["timing"].append(t)
        except Exception as e:  # noqa: BLE001
            report["errors"].append(f"timing {act} [{rows}, {cols}]: {type(e).__name__}: {e}"[:400])
            traceback.print_exc()
    report["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(out_dir, "activation_backward_probe.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    print_table(report)
    return 1 if report["errors"] else 0


def print_table(rep):
    print(f"\n## activation backward: the bundled kernels against eager autograd ({rep['device']}, "
          f"torch {rep['torch']}{', DRY RUN' if rep['dry_run'] else ''})\n")
    print("| act | variant | dtype | cases | dx differing (cases all 0) | max ulp (finite) |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for act in rep["acts"]:
        for v in ACTS[act][1]:
            for dt in DT:
                got = [c[v] for c in rep["cases"] if c["act"] == act and c["dtype"] == dt and v in c]
                if not got:
                    continue
                zero = sum(g["dx"] == 0 for g in got)
                print(f"| {act} | {v} | {dt} | {len(got)} | {sum(g['dx'] for g in got)} ({zero} of {len(got)}) | "
                      f"{max(g['dx_max_ulp_finite'] for g in got)} |")
    if rep["timing"]:
        print("\n| act | rows x cols | eager backward us (GPU us per kernel) | bundled us (GPU us) | GB/s |")
        print("| --- | --- | ---: | ---: | ---: |")
        for t in rep["timing"]:
            ek = "; ".join(f"{v}" for v in t["eager_kernels_us"].values())
            bk = "; ".join(f"{v}" for v in t["bundled_kernels_us"].values())
            print(f"| {t['act']} | {t['rows']} x {t['cols']} | {t['eager_bwd_us']:.1f} ({ek}) | "
                  f"{t['bundled_us']:.1f} ({bk}) | {t['bundled_GBps']} |")
    for k, v in rep["dry_compile"].items():
        print(f"dry_compile {k}: {v}")
    if rep["errors"]:
        print("\nerrors: " + "; ".join(rep["errors"][:10]))
    print(f"\nseconds {rep['seconds']}")


if __name__ == "__main__":
    sys.exit(main())
