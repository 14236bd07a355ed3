#!/usr/bin/env python3
"""Where a decode step's (or a prefill's) time goes (issue 31): GPU kernel time against wall time.

    python3 bench/exact_compile_profile.py OUT_DIR [--candidates compile-ro,kernelize+exact-ro]
        [--batch 1,8] [--steps 20] [--prefill 512]

For each candidate of bench/exact_compile.py (1B Llama architecture, bf16, random weights): a
static KV cache of 576 positions initialised up front, one decode step at position 512 run until
compiled and recorded, then `--steps` steps under torch.profiler. Per step: wall time (CUDA
events around each step), the sum of GPU kernel times, the number of kernels, and the ten
kernels that take the most GPU time. A step whose wall time is well above its kernel time is
bound by the host issuing work, not by the GPU. `--prefill N`: instead of a decode step, a
forward of `batch` x N prompt tokens without a KV cache (the speed phase's prefill). Writes
OUT_DIR/profile.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import exact_compile as B  # noqa: E402


def profile_step(m, batch: int, steps: int, prefill: int = 0) -> dict:
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad():
        g = torch.Generator().manual_seed(5)
        if prefill:
            ids = torch.randint(0, B.VOCAB_IDS, (batch, prefill), generator=g).cuda()
            step = lambda: m(ids, use_cache=False)  # noqa: E731
        else:
            step = B.decode_step(m, batch, g, prefill=None)
        t0 = time.perf_counter()
        for _ in range(4):
            step()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        wall = B.timed_ms(step, steps)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.device_time for e in kernels) / steps
    by_name: dict[str, float] = {}
    count: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time / steps
        count[e.name] = count.get(e.name, 0.0) + 1.0 / steps
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:10]
    # Every kernel of a step (name, launches per step, GPU us per step): what one candidate runs
    # that another does not is read from here.
    every = sorted(([n, round(count[n], 2), round(t, 2)] for n, t in by_name.items()), key=lambda r: -r[2])
    return dict(batch=batch, prefill=prefill or None, first_s=first, wall_ms=wall, gpu_kernel_ms=gpu_us / 1e3,
                kernels_per_step=len(kernels) / steps,
                top_kernels_us=[(n[:90], round(t, 1)) for n, t in top], kernels=every)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--candidates", default="compile-ro,kernelize+exact-ro")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prefill", type=int, default=0, metavar="N",
                   help="profile a forward of N prompt tokens (no KV cache) instead of a decode step")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import transformers
    env = dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
               transformers=transformers.__version__, command=" ".join(sys.argv))
    print(env, flush=True)
    base = B.build_arch("llama", "large", torch.bfloat16)
    rows = []
    for how in a.candidates.split(","):
        m = base if how == "eager" else B.candidate(base, how)
        for b in map(int, a.batch.split(",")):
            try:
                row = dict(candidate=how, **profile_step(m, b, a.steps, a.prefill))
            except Exception as e:  # a candidate that fails is a row, not the end of the run
                row = dict(candidate=how, batch=b, error=repr(e)[:300])
            print({k: v for k, v in row.items() if k != "kernels"}, flush=True)
            rows.append(row)
        del m
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    (out / "profile.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    print("\n| candidate | batch | step wall, ms | GPU kernels, ms | kernels per step |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {r['candidate']} | {r['batch']} | error {r['error'][:60]} | | |")
        else:
            print(f"| {r['candidate']} | {r['batch']} | {r['wall_ms']:.3f} | {r['gpu_kernel_ms']:.3f} | {r['kernels_per_step']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
