#!/usr/bin/env python3
"""The gated MLP's backward against real eager autograd (issue 30): whether the bundled kernels of
ops silu_mul_backward (kernels/silu_mul_backward/kernel.cu) and gelu_tanh_mul_backward
(kernels/gelu_tanh_mul_backward/kernel.cu) give eager's d_gate and d_up bit for bit, and how fast
they are (docs/backward-gated.md). `--acts silu,gelu_tanh` (default both) picks the activations.

    PYTHONUNBUFFERED=1 python3 scripts/gated_backward_probe.py OUT_DIR      # on the GPU machine
    python/.venv/bin/python scripts/gated_backward_probe.py /tmp/gbp --dry-run   # CPU: NVRTC only

For each dtype (bf16, f16, f32) and shape (rows 1..4096 x the MLP widths of the shipped and 1B
models, and 1001 for the kernel's scalar tail), gate/up/dy drawn like activations (a normal
sample, plus a slice of extreme gate values where exp overflows or underflows and tanh saturates),
eager's gradients of `F.silu(gate) * up` / `F.gelu(gate, approximate="tanh") * up` from
torch.autograd.grad, and the kernel's (one NVRTC module, the hub's
block and grid): the elements of d_gate and d_up whose bits differ (0 = eager's). Then, at the
large shapes, the median time of eager's backward (autograd.grad) against the kernel's one launch
and each CUDA kernel's GPU time (torch.profiler). Writes OUT_DIR/gated_backward_probe.json and
prints a table; exits 1 when something raised.
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
from backward_probe import CudaModule, dry_compile, kernel_times, max_ulp, ndiff, probe_setup, timed  # noqa: E402
from ln_backward_probe import DT, DT_NAME  # noqa: E402
from kernelize.training import stage_dims  # noqa: E402 (backward_probe put python/ on the path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the bundled kernel (op silu_mul_backward, entry silu_mul_bwd_<dt>(..., rows, cols)). Session 25's
# experiment with three forms of 1 + exp(-g) (kernels/wip/silu_mul_backward, SMB_D) ran here in
# session 26's run 1: all three gave eager's bits; the experiment was removed after that run.
BUNDLED = os.path.join(ROOT, "kernels", "silu_mul_backward", "kernel.cu")
GELU = os.path.join(ROOT, "kernels", "gelu_tanh_mul_backward", "kernel.cu")
VARIANTS = ("bundled",)
# activation -> (kernel source, its entries' prefix, eager's forward of the gate)
ACTS = {
    "silu": (BUNDLED, "silu_mul_bwd", torch.nn.functional.silu),
    "gelu_tanh": (GELU, "gelu_tanh_mul_bwd", lambda g: torch.nn.functional.gelu(g, approximate="tanh")),
}
ROWS = [1, 2, 7, 8, 64, 512, 4096]
# the tiny model's, Llama 1.1B's, Qwen2 1.5B's, Llama 7B's; 1001: the bundled kernel's scalar tail
COLS = [1408, 5632, 8960, 11008, 1001]
TIMED = [(4096, 5632), (4096, 11008), (16384, 8960)]


def inputs(dt, rows, cols, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    T = DT[dt]
    gate = (torch.randn(rows, cols, generator=g) * 3).to(T)
    flat = gate.view(-1)
    k = max(1, flat.numel() // 64)     # extremes: exp(-g) overflows / underflows / is subnormal
    extremes = torch.tensor([-100.0, -88.7, -87.0, -20.0, 20.0, 87.0, 88.8, 100.0, 1e-3, -1e-3, 0.0,
                             -5.0, -3.0, -0.5, 0.5, 3.0, 5.0])   # (tanh's branches at |inner| 0.6, 9.01)
    flat[:k] = extremes[torch.arange(k) % len(extremes)].to(T)
    up = torch.randn(rows, cols, generator=g).to(T)
    dy = (torch.randn(rows, cols, generator=g) * 0.1).to(T)
    return gate.to(device), up.to(device), dy.to(device)


def eager_grads(gate, up, dy, act="silu"):
    gr, ur = gate.clone().requires_grad_(True), up.clone().requires_grad_(True)
    y = ACTS[act][2](gr) * ur
    return torch.autograd.grad(y, (gr, ur), dy)


class Kernel:
    """The bundled kernel of `act` in one NVRTC module; `bind("bundled", dy, gate, up)()` ->
    (d_gate, d_up), outputs poisoned with NaN first."""

    def __init__(self, device, act="silu"):
        path, self.prefix, _ = ACTS[act]
        self.op = f"{act}_mul_backward"  # silu_mul_backward, gelu_tanh_mul_backward
        self.mods = {}
        self.mods["bundled"] = CudaModule(open(path, encoding="utf-8").read(), os.path.basename(os.path.dirname(path)) + ".cu",
                                          device, [f"{self.prefix}_{dt}" for dt in DT], ())
        props = torch.cuda.get_device_properties(device)
        self.sms, self.tps = props.multi_processor_count, props.max_threads_per_multi_processor

    def bind(self, variant, dy, gate, up):
        n = gate.numel()
        dg, du = torch.full_like(gate, float("nan")), torch.full_like(up, float("nan"))
        grid = stage_dims("grad", 1, n, self.sms, self.tps, self.op)[0][0]   # the hub's launch (the client's twin)
        entry, tail = f"{self.prefix}_{DT_NAME[gate.dtype]}", (gate.shape[0], gate.shape[-1])

        def go():
            self.mods[variant].launch(entry, grid, 256, (dg, du, dy, gate, up) + tail)
            return dg, du
        return go


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--dry-run", action="store_true", help="CPU only: NVRTC compiles the kernel")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--acts", default=",".join(ACTS), help="comma-separated: silu, gelu_tanh")
    args = ap.parse_args(argv)
    acts = [a for a in args.acts.split(",") if a]
    if not acts or not set(acts) <= set(ACTS):
        ap.error(f"--acts: some of {', '.join(ACTS)}")
    t0 = time.time()
    out_dir, dry, device = probe_setup(args, "gated_backward_probe_out")
    report = dict(torch=torch.__version__, device=(torch.cuda.get_device_name(device) if not dry else "cpu"),
                  dry_run=dry, cases=[], timing=[], errors=[])
    report["acts"] = acts
    kerns = {}
    for act in acts:
        if dry:
            path = ACTS[act][0]
            report[f"dry_compile_bundled{'' if act == 'silu' else '_' + act}"] = dry_compile(
                path, os.path.basename(os.path.dirname(path)) + ".cu", ())
        else:
            kerns[act] = Kernel(device, act)
    for act, dt in ((a, d) for a in acts for d in DT):
        kern = kerns.get(act)
        for rows in ([1, 8] if dry else ROWS):
            for cols in ([1408] if dry else COLS):
                try:
                    gate, up, dy = inputs(dt, rows, cols, device, seed=rows * 31 + cols)
                    eg, eu = eager_grads(gate, up, dy, act)
                    case = dict(act=act, dtype=dt, rows=rows, cols=cols)
                    for v in (VARIANTS if kern else []):
                        kg, ku = kern.bind(v, dy, gate, up)()
                        case[v] = dict(d_gate=ndiff(kg, eg), d_up=ndiff(ku, eu), d_gate_max_ulp=max_ulp(kg, eg))
                    report["cases"].append(case)
                except Exception as e:  # noqa: BLE001
                    report["errors"].append(f"{act} {dt} [{rows}, {cols}]: {type(e).__name__}: {e}"[:400])
                    traceback.print_exc()
    for act, (rows, cols) in ((a, rc) for a in acts for rc in ([] if dry else TIMED)):
        kern = kerns[act]
        for dt in ("bf16",):
            try:
                gate, up, dy = inputs(dt, rows, cols, device, seed=7)
                gr, ur = gate.clone().requires_grad_(True), up.clone().requires_grad_(True)
                y = ACTS[act][2](gr) * ur
                eager = lambda: torch.autograd.grad(y, (gr, ur), dy, retain_graph=True)  # noqa: E731
                t = dict(act=act, dtype=dt, rows=rows, cols=cols, eager_bwd_us=timed(eager, device, args.reps),
                         eager_kernels_us=kernel_times(eager, device, args.reps))
                # bytes that must move: dy, gate, up read; d_gate, d_up written
                nbytes = 5 * gate.numel() * gate.element_size()
                for v, key in (("bundled", "bundled"),):
                    go = kern.bind(v, dy, gate, up)
                    t[f"{key}_us"] = timed(go, device, args.reps)
                    t[f"{key}_kernels_us"] = kernel_times(go, device, args.reps)
                    t[f"{key}_GBps"] = round(nbytes / (t[f"{key}_us"] * 1e-6) / 1e9, 1)
                report["timing"].append(t)
            except Exception as e:  # noqa: BLE001
                report["errors"].append(f"timing {act} {dt} [{rows}, {cols}]: {type(e).__name__}: {e}"[:400])
                traceback.print_exc()
    report["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(out_dir, "gated_backward_probe.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    print_table(report)
    return 1 if report["errors"] else 0


def print_table(rep):
    print(f"\n## act(gate) * up backward: the bundled kernels against eager autograd ({rep['device']}, "
          f"torch {rep['torch']}{', DRY RUN' if rep['dry_run'] else ''})\n")
    print("| act | dtype | cases | " + " | ".join(f"{v}: d_gate / d_up differing (cases all 0)" for v in VARIANTS) + " |")
    print("| --- | --- | ---: | " + " | ".join("---" for _ in VARIANTS) + " |")
    for act, dt in ((a, d) for a in rep.get("acts", ["silu"]) for d in DT):
        cs = [c for c in rep["cases"] if c["dtype"] == dt and c.get("act", "silu") == act]
        cells = []
        for v in VARIANTS:
            got = [c[v] for c in cs if v in c]
            if not got:
                cells.append("-")
                continue
            zero = sum(g["d_gate"] == 0 and g["d_up"] == 0 for g in got)
            cells.append(f"{sum(g['d_gate'] for g in got)} / {sum(g['d_up'] for g in got)} ({zero} of {len(got)})")
        print(f"| {act} | {dt} | {len(cs)} | " + " | ".join(cells) + " |")
    if rep["timing"]:
        print("\n| act | dtype | rows x cols | eager backward us (GPU us per kernel) | bundled us | GB/s (GPU us) |")
        print("| --- | --- | --- | ---: | ---: | ---: |")
        for t in rep["timing"]:
            ek = "; ".join(f"{v}" for v in t["eager_kernels_us"].values())
            bk = "; ".join(f"{v}" for v in t.get("bundled_kernels_us", {}).values())
            print(f"| {t.get('act', 'silu')} | {t['dtype']} | {t['rows']} x {t['cols']} | {t['eager_bwd_us']:.1f} ({ek}) | "
                  f"{t['bundled_us']:.1f} | {t['bundled_GBps']} ({bk}) |")
    for k, v in rep.items():
        if k.startswith("dry_compile"):
            print(f"{k}: {v}")
    if rep["errors"]:
        print("\nerrors: " + "; ".join(rep["errors"][:10]))
    print(f"\nseconds {rep['seconds']}")


if __name__ == "__main__":
    sys.exit(main())
