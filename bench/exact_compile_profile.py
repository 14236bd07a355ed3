#!/usr/bin/env python3
"""Where a decode step's (or a prefill's) time goes (issue 31): GPU kernel time against wall time.

    python3 bench/exact_compile_profile.py OUT_DIR [--candidates compile-ro,kernelize+exact-ro]
        [--batch 1,8] [--steps 20] [--prefill 512]

For each candidate of bench/exact_compile.py (1B Llama architecture or `--arch`, bf16, random weights): a
static KV cache of 576 positions initialised up front, one decode step at position 512 run until
compiled and recorded, then `--steps` steps under torch.profiler. Per step: wall time (CUDA
events around each step), the sum of GPU kernel times, the number of kernels, and the ten
kernels that take the most GPU time. A step whose wall time is well above its kernel time is
bound by the host issuing work, not by the GPU. `--prefill N`: instead of a decode step, a
forward of `batch` x N prompt tokens without a KV cache (the speed phase's prefill). `--greedy
N`: whole greedy runs of the speed phase's loop (batch 1). Writes
OUT_DIR/profile.json and prints a table.

`--isolate R`: each candidate in a process of its own, R rounds, the candidates' order reversed
every other round; the table gives each candidate's median over the rounds and its ratio to the
first candidate's. (Several candidates in one process do not give comparable wall times: in
session 14, on an H200, the same candidate's decode step took 2.79 ms when it was compiled first
and 3.23-3.49 ms when another model had been compiled before it; the GPU time did not move.)
Writes OUT_DIR/isolated.json, and each process's OUT_DIR/rR-CANDIDATE/profile.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from run_env import run_env  # noqa: E402 (bench/ is on the path of a bench script)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import exact_compile as B  # noqa: E402


def profile_step(m, batch: int, steps: int, prefill: int = 0, greedy: int = 0) -> dict:
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad():
        g = torch.Generator().manual_seed(5)
        if greedy:   # a "step" is a whole greedy run: the prompt, then `greedy` tokens
            step = B.greedy(m, g, greedy)
        elif prefill:
            ids = torch.randint(0, B.VOCAB_IDS, (batch, prefill), generator=g).cuda()
            step = lambda: m(ids, use_cache=False)  # noqa: E731
        else:
            step = B.decode_step(m, batch, g, prefill=None)
        t0 = time.perf_counter()
        for _ in range(4):
            step()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        # each step's wall and, of the same steps, the host's time to issue it (B.timed_steps;
        # session 33 timed the two in separate loops, and in default mode one process's host
        # moved 2x between them)
        walls, issue = zip(*B.timed_steps(step, steps))
        wall = statistics.median(walls)
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
    # The spread of one call's GPU time for the top kernels (min, median, max µs): whether every
    # call of a kernel costs the same, or some calls (one layer's, one input's) cost more.
    calls: dict[str, list[float]] = {}
    for e in sorted(kernels, key=lambda e: e.time_range.start):  # launch order
        calls.setdefault(e.name, []).append(e.device_time)
    spread = {n[:90]: [round(min(c), 2), round(statistics.median(c), 2), round(max(c), 2)]
              for n, c in ((n, sorted(calls[n])) for n, _ in top)}  # (a sorted copy)
    # The norms' calls of the last step in launch order (which call of a layer is the slow one:
    # GPT-2's fused add + LayerNorm spread from 2.9 to 8.5 µs a call in session 22).
    norm_calls = {n[:90]: [round(t, 2) for t in c[-max(1, round(len(c) / steps)):]]
                  for n, c in calls.items() if "norm" in n}
    # Every kernel of a step (name, launches per step, GPU us per step): what one candidate runs
    # that another does not is read from here.
    every = sorted(([n, round(count[n], 2), round(t, 2)] for n, t in by_name.items()), key=lambda r: -r[2])
    # Which operator launched which kernels (CPU op -> its kernels; per step). Under CUDA graphs
    # a replay launches them all (cudaGraphLaunch): profile a default-mode candidate for this.
    launched: dict[tuple[str, str], float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU and getattr(e, "kernels", None):
            for k in e.kernels:
                key = (e.name, k.name[:80])
                launched[key] = launched.get(key, 0.0) + 1.0 / steps
    by_op = sorted(([op, k, round(n, 2)] for (op, k), n in launched.items()), key=lambda r: -r[2])
    return dict(**host_timeline(prof, steps), **gpu_timeline(kernels, steps), batch=batch, prefill=prefill or None, greedy=greedy or None, first_s=first, wall_ms=wall, host_issue_ms=statistics.median(issue), gpu_kernel_ms=gpu_us / 1e3,
                kernels_per_step=len(kernels) / steps,
                top_kernels_us=[(n[:90], round(t, 1)) for n, t in top], call_us_spread=spread, norm_calls_us=norm_calls, kernels=every,
                launched_by=by_op)


def gpu_timeline(kernels, steps: int) -> dict:
    """Is a step bound by the GPU or by the host issuing its work (issue 31's unexplained decode
    gap)? From the kernels' GPU timestamps: the span from the first kernel's start to the last's
    end (`gpu_span_ms`, per step), and the GPU's idle time inside it between one kernel's end and
    the next one's start, split into short gaps (< 5 µs: a CUDA graph's node-to-node launch, or
    a stream's back-to-back launches; `gpu_short_gaps_ms`, with their count) and long ones (the
    GPU waiting for the host: `gpu_long_gaps_ms`), per step. A step whose wall time is its GPU
    span, short gaps included, is bound by the GPU even where the kernels' sum is lower."""
    ks = sorted(kernels, key=lambda e: e.time_range.start)
    if not ks:
        return {}
    short = long_ = 0.0
    n_short = 0
    end = ks[0].time_range.end
    for e in ks[1:]:
        gap = e.time_range.start - end
        if gap > 0:
            if gap < 5.0:
                short += gap
                n_short += 1
            else:
                long_ += gap
        end = max(end, e.time_range.end)
    span = end - ks[0].time_range.start
    return dict(gpu_span_ms=span / steps / 1e3, gpu_short_gaps_ms=short / steps / 1e3,
                gpu_short_gaps=n_short / steps, gpu_long_gaps_ms=long_ / steps / 1e3)


def host_timeline(prof, steps: int) -> dict:
    """Where a step's host time goes between operators (issue 31, session 28: under cProfile
    ours' default-mode decode step ran less Python than plain compile's, yet without it took
    longer): on the thread that ran the most CPU events, the outermost events in time order; the
    time a step spends inside them (`host_busy_ms`) and between them (`host_idle_ms`), the
    largest gaps named by the events on either side (`host_gaps_us`, per step), and the
    operators with the most own host time (`host_self_us`, per step)."""
    cpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    if not cpu:
        return {}
    threads: dict[int, int] = {}
    for e in cpu:
        threads[e.thread] = threads.get(e.thread, 0) + 1
    main = max(threads, key=threads.get)
    evs = sorted((e for e in cpu if e.thread == main), key=lambda e: (e.time_range.start, -e.time_range.end))
    outer, end = [], -1.0
    for e in evs:
        if e.time_range.start >= end:
            outer.append(e)
            end = e.time_range.end
    busy = sum(e.time_range.end - e.time_range.start for e in outer)
    gaps: dict[str, float] = {}
    idle = 0.0
    for a, b in zip(outer, outer[1:]):
        gap = b.time_range.start - a.time_range.end
        idle += gap
        key = f"{a.name[:60]} -> {b.name[:60]}"
        gaps[key] = gaps.get(key, 0.0) + gap / steps
    own: dict[str, float] = {}
    for e in evs:
        own[e.name[:90]] = own.get(e.name[:90], 0.0) + e.self_cpu_time_total / steps
    return dict(host_busy_ms=busy / steps / 1e3, host_idle_ms=idle / steps / 1e3,
                host_outer_events=len(outer) / steps,
                host_gaps_us=sorted(([k, round(v, 1)] for k, v in gaps.items()), key=lambda r: -r[1])[:25],
                host_self_us=sorted(([k, round(v, 1)] for k, v in own.items()), key=lambda r: -r[1])[:40])


def isolated(a, out: Path) -> int:
    """`--isolate R`: see the module's doc."""
    cands = a.candidates.split(",")
    runs: dict[tuple[str, int], list[dict]] = {}
    for r in range(a.isolate):
        for how in (cands if r % 2 == 0 else cands[::-1]):
            sub = out / f"r{r}-{how.replace('+', '_')}"   # "+" does not travel back from the device
            cmd = [sys.executable, str(Path(__file__).resolve()), str(sub), "--candidates", how,
                   "--batch", a.batch, "--steps", str(a.steps), "--prefill", str(a.prefill),
                   "--arch", a.arch, "--greedy", str(a.greedy)]
            print(f"== round {r}: {how}", flush=True)
            done = subprocess.run(cmd, check=False)
            try:
                rows = json.loads((sub / "profile.json").read_text())["rows"]
            except (OSError, ValueError, KeyError):
                print(f"   no profile from {how} (exit {done.returncode})", flush=True)
                continue
            for row in rows:
                if "error" not in row:
                    runs.setdefault((how, row["batch"]), []).append(row)
    table = []
    for b in map(int, a.batch.split(",")):
        base = runs.get((cands[0], b))
        for how in cands:
            got = runs.get((how, b))
            if not got:
                table.append(dict(candidate=how, batch=b, error="no run"))
                continue
            med = {k: statistics.median(x[k] for x in got)
                   for k in ("wall_ms", "gpu_kernel_ms", "kernels_per_step", "host_issue_ms", "gpu_span_ms", "gpu_short_gaps_ms",
                             "gpu_long_gaps_ms") if all(k in x for x in got)}
            row = dict(candidate=how, batch=b, runs=len(got), **med,
                       wall_each=[round(x["wall_ms"], 3) for x in got])
            if base:
                # speed ratio: the first candidate's time over this one's (> 1: faster)
                row["speed_vs_first_wall"] = statistics.median(x["wall_ms"] for x in base) / med["wall_ms"]
                row["speed_vs_first_gpu"] = statistics.median(x["gpu_kernel_ms"] for x in base) / med["gpu_kernel_ms"]
            table.append(row)
    (out / "isolated.json").write_text(json.dumps(dict(command=" ".join(sys.argv), rows=table), indent=1))
    print(f"\n| candidate | batch | runs | step wall, ms (median; each) | GPU kernels, ms | kernels | "
          f"speed vs {cands[0]} (wall / GPU) | host issue, ms | GPU span, ms (short gaps / long gaps) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in table:
        if "error" in t:
            print(f"| {t['candidate']} | {t['batch']} | 0 | {t['error']} | | | | | |")
            continue
        ratio = (f"{t['speed_vs_first_wall']:.2f}x / {t['speed_vs_first_gpu']:.2f}x"
                 if "speed_vs_first_wall" in t else "")
        print(f"| {t['candidate']} | {t['batch']} | {t['runs']} | {t['wall_ms']:.3f} ({', '.join(map(str, t['wall_each']))}) "
              f"| {t['gpu_kernel_ms']:.3f} | {t['kernels_per_step']:.0f} | {ratio} | {t.get('host_issue_ms', float('nan')):.3f} | "
              + (f"{t['gpu_span_ms']:.3f} ({t['gpu_short_gaps_ms']:.3f} / {t['gpu_long_gaps_ms']:.3f}) |"
                 if "gpu_span_ms" in t else " |"))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--candidates", default="compile-ro,kernelize+exact-ro")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--arch", default="llama", help="the 1B-class config of bench/exact_compile.py")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prefill", type=int, default=0, metavar="N",
                   help="profile a forward of N prompt tokens (no KV cache) instead of a decode step")
    p.add_argument("--greedy", type=int, default=0, metavar="N",
                   help="profile whole greedy runs (bench/exact_compile.py's loop: a 512-token prompt "
                        "into a static cache, then N tokens; batch 1) instead of a decode step")
    p.add_argument("--isolate", type=int, default=0, metavar="R",
                   help="each candidate in its own process, R rounds in alternating order (medians)")
    a = p.parse_args()
    if a.greedy:
        a.batch = "1"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.isolate:
        return isolated(a, out)
    env = run_env()
    print(env, flush=True)
    base = B.build_arch(a.arch, "large", torch.bfloat16)
    rows = []
    for how in a.candidates.split(","):
        m = base if how == "eager" else B.candidate(base, how)
        for b in map(int, a.batch.split(",")):
            try:
                row = dict(candidate=how, **profile_step(m, b, a.steps, a.prefill, a.greedy))
            except Exception as e:  # a candidate that fails is a row, not the end of the run
                row = dict(candidate=how, batch=b, error=repr(e)[:300])
            print({k: v for k, v in row.items() if k not in ("kernels", "launched_by", "host_gaps_us", "host_self_us")}, flush=True)
            rows.append(row)
        del m
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    (out / "profile.json").write_text(json.dumps(dict(env=env, rows=rows, proofs=B._exact.proofs()),
                                                 indent=1))
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
