#!/usr/bin/env python3
"""Per-call cost of a kernelized layer against the eager layer it replaces (issue 15).

    python3 bench/layer_overhead.py OUT_DIR [--kernels kernels] [--dtype bf16] [--calls 2000]

On a CUDA machine, for each layer (HF LlamaRMSNorm, nn.RMSNorm = F.rms_norm, nn.LayerNorm,
nn.SiLU, HF LlamaMLP's activation-and-mul) at a decode shape (1 row) and prefill shapes, eager
and kernelized (the bundled exact kernel from `--kernels`, loaded as a local kernel folder) are
timed three ways, each in the same process and interleaved (each one first in every other repeat)
so that ratios compare like with like; a ratio is the median over the repeats of the ratio within
one repeat (the columns' times are the medians of each side):

- `cpu_us`: CPU time to issue one call (wall time of N back-to-back calls, no synchronisation
  inside, divided by N; the GPU queue is drained first and N is below the queue depth). This is
  the Python + dispatcher + launch cost the issue asks about.
- `b2b_us`: wall time per call of N back-to-back calls including the final synchronisation:
  max(CPU cost, GPU time) per call, what a decode loop of many small layers pays.
- `event_us`: one call between two CUDA events, synchronised, median of N (the issue's
  "single call as a user's model makes it"; includes CPU launch cost between the events).

Writes OUT_DIR/layer_overhead.json and prints a markdown table last. Outputs of kernelized and
eager calls are compared bit for bit at every shape (the table says so).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))


def layers(hidden: int, inter: int, dtype: torch.dtype):
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, hidden_act="silu")
    g = torch.Generator().manual_seed(0)

    def init(m):
        for p in m.parameters():
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02 + (1.0 if p.dim() == 1 else 0.0))
        return m.to("cuda", dtype).eval()

    return {
        # name: (module factory, input width, kernel folder names to use)
        "LlamaRMSNorm": (lambda: init(LlamaRMSNorm(hidden, eps=1e-6)), hidden, ["rms_norm_llama"]),
        "nn.RMSNorm (F.rms_norm)": (lambda: init(nn.RMSNorm(hidden, eps=1e-6)), hidden, ["rms_norm_torch"]),
        "nn.LayerNorm": (lambda: init(nn.LayerNorm(hidden)), hidden, ["layer_norm"]),
        "nn.SiLU": (lambda: nn.SiLU().to("cuda"), inter, ["silu"]),
        "LlamaMLP": (lambda: init(LlamaMLP(cfg)), hidden, ["silu_mul", "silu_and_mul"]),
    }


def kernelized(eager: nn.Module, names, kernels_dir: Path, dtype_name: str):
    """A copy of `eager` (same weights) with the bundled kernels swapped in."""
    import copy

    import kernelize

    m = copy.deepcopy(eager)
    avail = [n for n in names if (kernels_dir / n / "kernel.toml").exists()]
    rep = kernelize.kernelize(m, kernels_dir=str(kernels_dir), names=avail, dtype=dtype_name,
                              verbose=False)
    return m, avail, str(rep), bool(kernelize.launch_counts(m))


def time_cpu(fn, x, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(x)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def time_b2b(fn, x, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def time_event(fn, x, calls: int) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(calls):
        torch.cuda.synchronize()
        s.record()
        fn(x)
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) * 1e3)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--kernels", default=str(ROOT / "kernels"))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--calls", type=int, default=500, help="calls per measurement (below the launch queue depth)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats; the median is kept")
    ap.add_argument("--rows", default="1,8,512,2048")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=11008)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("layer_overhead.py: no CUDA device: nothing measured", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    import kernelize
    import transformers
    meta = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__, "dtype": a.dtype, "calls": a.calls,
        "repeats": a.repeats, "command": " ".join(sys.argv),
    }
    rows_list = [int(r) for r in a.rows.split(",")]
    results = []
    for name, (factory, width, names) in layers(a.hidden, a.inter, dtype).items():
        eager = factory()
        kz, used, report, swapped = kernelized(eager, names, Path(a.kernels), a.dtype)
        if not swapped:
            print(f"{name}: no kernel swapped in ({names}); report:\n{report}", file=sys.stderr)
            results.append({"layer": name, "error": "not swapped", "report": report})
            continue
        for rows in rows_list:
            x = torch.randn(rows, width, device="cuda", dtype=dtype)
            with torch.no_grad():
                ref, got = eager(x), kz(x)
                exact = bool(torch.equal(ref, got))
                mism = int((ref != got).sum())
                counts_before = sum(kernelize.launch_counts(kz).values())
                for f in (eager, kz):  # warm up (first launches, allocator)
                    for _ in range(20):
                        f(x)
                m = {k: {"eager": [], "kernelized": []} for k in ("cpu_us", "b2b_us", "event_us")}
                for rep in range(a.repeats):
                    pair = (("eager", eager), ("kernelized", kz))
                    for label, f in (pair if rep % 2 == 0 else pair[::-1]):  # each goes first half the time
                        m["cpu_us"][label].append(time_cpu(f, x, a.calls))
                        m["b2b_us"][label].append(time_b2b(f, x, a.calls))
                        m["event_us"][label].append(time_event(f, x, max(50, a.calls // 5)))
                launched = sum(kernelize.launch_counts(kz).values()) - counts_before
            r = {"layer": name, "kernel": used, "rows": rows, "cols": width, "bit_exact": exact,
                 "mismatched": mism, "kernel_launched_calls": launched}
            for k, v in m.items():
                r[k] = {lab: statistics.median(vals) for lab, vals in v.items()}
                # The ratio within each repeat (eager and kernelized measured next to each
                # other), median over the repeats: robust to the host's load drifting between
                # repeats, which moves both alike.
                r[k]["ratio"] = statistics.median(
                    kv / ev for ev, kv in zip(v["eager"], v["kernelized"]))
                r[k]["ratios"] = [round(kv / ev, 4) for ev, kv in zip(v["eager"], v["kernelized"])]
            results.append(r)
            print(f"{name:26s} {rows:5d}x{width:<5d} exact={exact} " + "  ".join(
                f"{k} {r[k]['eager']:.1f}/{r[k]['kernelized']:.1f} ({r[k]['ratio']:.2f}x)" for k in m), flush=True)
            del x
    (out / "layer_overhead.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print()
    print(f"{meta['device']}, torch {meta['torch']}, CUDA {meta['cuda']}, {a.dtype}, {meta['date']}")
    print("| layer | shape | exact | CPU per call eager / kernelized (us) | back-to-back per call (us) | single call, events (us) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        if "error" in r:
            print(f"| {r['layer']} | - | - | {r['error']} | | |")
            continue
        cell = lambda k: f"{r[k]['eager']:.1f} / {r[k]['kernelized']:.1f} ({r[k]['ratio']:.2f}x)"
        print(f"| {r['layer']} | {r['rows']}x{r['cols']} | {'yes' if r['bit_exact'] else 'NO (' + str(r['mismatched']) + ')'} "
              f"| {cell('cpu_us')} | {cell('b2b_us')} | {cell('event_us')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
