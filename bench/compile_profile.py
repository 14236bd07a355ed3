#!/usr/bin/env python3
"""Where kernelize + torch.compile loses to torch.compile alone (issue 15): a profile of both.

    PYTHONPATH=python python3 bench/compile_profile.py OUT_DIR [--arch llama] [--new-tokens 8]

On a CUDA machine, for one architecture of `bench/model_bench.py` (same config, random weights)
in two modes (`--modes`, default torch.compile and kernelize + torch.compile), compiled as
model_bench compiles them:

- prefill 1x512 under regional compilation (each decoder block compiled): three forwards under
  `torch.profiler`, after two warm-up forwards;
- greedy decode (compiled modes: with transformers' static cache, `generate` compiling the
  forward with CUDA graphs): one `generate` of `--new-tokens` tokens under the profiler, after a
  warm-up one.

For each it records the CUDA kernels launched (count and GPU time per forward or per generated
token, by name) and the CPU time of the top operators, writes OUT_DIR/compile_profile.json and
prints a short table last: how many kernels each mode runs, and the kernels that differ.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

import model_bench as mb  # noqa: E402  (the same models and compile recipes)


def kernels_of(prof) -> tuple[collections.Counter, dict[str, float]]:
    """The profile's events on the GPU (kernels, and the copies and memsets among them): count
    and total GPU microseconds per name."""
    count, us = collections.Counter(), collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            count[e.name] += 1
            us[e.name] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return count, us


def top_cpu(prof, n: int = 12) -> list[dict]:
    rows = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)[:n]
    return [{"name": a.key, "calls": a.count, "self_cpu_us": a.self_cpu_time_total} for a in rows]


def profile(fn, steps: int):
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps * 1e3
    count, us = kernels_of(prof)
    return {"wall_ms_per_step": wall, "kernels_per_step": sum(count.values()) / steps,
            "gpu_us_per_step": sum(us.values()) / steps,
            "kernels": {k: {"per_step": c / steps, "gpu_us_per_step": us[k] / steps}
                        for k, c in count.most_common()},
            "top_cpu": top_cpu(prof)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--kernels", default=str(ROOT / "kernels"))
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--modes", default="compile,kernelized+compile",
                    help="two of eager, kernelized, compile, kernelized+compile (the second is compared with the first)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("compile_profile.py: no CUDA device: nothing measured", file=sys.stderr)
        return 2
    import kernelize
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    kernels = Path(a.kernels)
    names = [n for n in mb.EXACT if (kernels / n / "kernel.toml").exists()]
    model = mb.build(a.arch)
    ids = torch.randint(0, model.config.vocab_size, (1, 512), device="cuda")
    prompt = torch.randint(0, model.config.vocab_size, (1, 32), device="cuda")
    res = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "cuda": torch.version.cuda, "arch": a.arch, "command": " ".join(sys.argv)}}
    modes = a.modes.split(",")
    for mode in modes:
        compiled = mode.endswith("compile")
        if mode.startswith("kernelized"):
            kernelize.kernelize(model, kernels_dir=str(kernels), names=names, verbose=False)
        if compiled:
            mb.compile_blocks(model)
        r = {}
        with torch.no_grad():
            pre = lambda: model(ids, use_cache=False).logits
            for _ in range(2):
                pre()
            r["prefill 1x512"] = profile(pre, 3)
            mb.uncompile_blocks(model)
            extra = {"cache_implementation": "static"} if compiled else {}
            gen = lambda: model.generate(prompt, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                                         do_sample=False, **extra)
            gen()
            p = profile(gen, 1)
            for k in ("kernels_per_step", "gpu_us_per_step"):
                p[k] /= a.new_tokens
            for v in p["kernels"].values():
                v["per_step"] /= a.new_tokens
                v["gpu_us_per_step"] /= a.new_tokens
            p["wall_ms_per_step"] /= a.new_tokens
            r[f"decode b1 ({a.new_tokens} tokens, per token)"] = p
        mb.uncompile_blocks(model)
        kernelize.unkernelize(model)
        res[mode] = r
    (out / "compile_profile.json").write_text(json.dumps(res, indent=1))
    print(f"\n{res['meta']['device']}, torch {res['meta']['torch']}, {a.arch}, {res['meta']['date']}")
    first, second = modes[0], modes[-1]
    print("| phase | mode | wall ms per step | CUDA kernels per step | GPU us per step |")
    print("| --- | --- | ---: | ---: | ---: |")
    for phase in res[first]:
        for mode in modes:
            p = res[mode][phase]
            print(f"| {phase} | {mode} | {p['wall_ms_per_step']:.2f} | {p['kernels_per_step']:.1f} "
                  f"| {p['gpu_us_per_step']:.1f} |")
    for phase in res[first]:
        a_, b_ = res[first][phase]["kernels"], res[second][phase]["kernels"]
        print(f"\n{phase}: kernels whose count per step differs ({first} -> {second})")
        diff = [(k, a_.get(k, {}).get("per_step", 0), b_.get(k, {}).get("per_step", 0),
                 a_.get(k, {}).get("gpu_us_per_step", 0), b_.get(k, {}).get("gpu_us_per_step", 0))
                for k in set(a_) | set(b_)]
        diff = [d for d in diff if abs(d[1] - d[2]) > 1e-9]
        for k, ca, cb, ua, ub in sorted(diff, key=lambda d: -abs(d[4] - d[3]))[:14]:
            print(f"  {ca:6.1f} -> {cb:6.1f}  ({ua:8.1f} -> {ub:8.1f} us)  {k[:90]}")
        for mode in modes:
            top = res[mode][phase]["top_cpu"][:6]
            print(f"  top CPU ({mode}): " + "; ".join(f"{t['name'][:40]} {t['self_cpu_us']/1e3:.1f} ms" for t in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
