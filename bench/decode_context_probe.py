#!/usr/bin/env python3
"""The exact kernels' GPU time inside a decode step against their time alone (issues 29, 31).

    python3 bench/decode_context_probe.py OUT_DIR [--batch 1,8] [--variant NAME=KERNELS_DIR ...]

Session 14's profiles of a compiled Llama 1.1B decode step (H200) gave `silu_mul` at 1 x 5632
3.4-4.1 µs a call at batch 1 and 2.1 µs at batch 8, while bench/decode_rows.py, which replays the
same kernel back to back, gives 1.84 µs at 1 x 5632. This probe finds out where the difference
comes from without compiling a model: a CUDA graph of 22 "layers" of a Llama MLP block at decode
rows (residual add + RMSNorm, gate and up projections, the gated activation, down projection;
each layer its own weights, hidden 2048, intermediate 5632, bf16), replayed under torch.profiler,
with each kernel's GPU time per call read from the profile:

- `kernelize`: the bundled fused_add_rms_norm and silu_mul (kernels/);
- `kernelize-twice`: the same with every exact kernel called a second time right after the first
  on the same inputs (the second call's output unused): if the first call of each pair is slow
  and the second is not, the cost is the kernel's cold start on its SMs (its code and its
  parameters not yet fetched), not its work;
- `inductor`: torch.compile's fused add + norm and silu * mul in their place (inexact; for scale);
- each `--variant NAME=DIR`: the kernels of another kernels folder, as `kernelize`.

And each kernel alone, 200 calls back to back in one graph (bench/decode_rows.py's measure), under
the profiler too. Prints a table last; writes OUT_DIR/decode_context.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

from decode_rows import compiled_kernel  # noqa: E402
from kernelize import launch as L  # noqa: E402

HIDDEN, INTER, LAYERS, EPS = 2048, 5632, 22, 1e-5
DT = torch.bfloat16


def capture(fn, warm: int = 3) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def profiled(g: torch.cuda.CUDAGraph, replays: int) -> tuple[dict, float]:
    """Kernel name -> GPU µs of each call, in the order of a replay (averaged over the replays);
    and the replay's wall time (µs, CUDA events, outside the profiler)."""
    from torch.profiler import ProfilerActivity, profile
    walls = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        walls.append(a.elapsed_time(b) * 1000)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    per: dict[str, list[float]] = {}
    for e in evs:
        per.setdefault(e.name, []).append(e.device_time)
    out = {}
    for name, ts in per.items():
        n = len(ts) // replays
        if n == 0:
            continue
        out[name] = [sum(ts[i + n * r] for r in range(replays)) / replays for i in range(n)]
    return out, sorted(walls)[len(walls) // 2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--variant", action="append", default=[], metavar="NAME=DIR")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), device=torch.cuda.get_device_name(),
               torch=torch.__version__, cuda=torch.version.cuda, command=" ".join(sys.argv))
    print(env, flush=True)
    torch.manual_seed(0)
    dev = "cuda"
    W = [dict(n=(torch.randn(HIDDEN, device=dev) * 0.1 + 1).to(DT),
              g=(torch.randn(INTER, HIDDEN, device=dev) * 0.02).to(DT),
              u=(torch.randn(INTER, HIDDEN, device=dev) * 0.02).to(DT),
              d=(torch.randn(HIDDEN, INTER, device=dev) * 0.02).to(DT)) for _ in range(LAYERS)]
    kdirs = {"kernelize": ROOT / "kernels"}
    for v in a.variant:
        name, _, d = v.partition("=")
        kdirs[name] = Path(d)
    ck = {k: (compiled_kernel(d, "fused_add_rms_norm", "bf16"), compiled_kernel(d, "silu_mul", "bf16"))
          for k, d in kdirs.items()}

    def c_norm(x, res, w):
        s = x + res
        h = s.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return w * h.to(DT), s

    c_norm = torch.compile(c_norm)
    c_gate = torch.compile(lambda g, u: F.silu(g) * u)

    rows = []
    for batch in [int(b) for b in a.batch.split(",")]:
        x0 = torch.randn(batch, HIDDEN, device=dev, dtype=DT)
        r0 = torch.randn(batch, HIDDEN, device=dev, dtype=DT)

        def block(norm, gate, twice=False):
            def step():
                x, res = x0.clone(), r0.clone()
                for w in W:
                    h = norm(x, res, w["n"])
                    if twice:
                        norm(x, res.clone(), w["n"])
                    g, u = h @ w["g"].t(), h @ w["u"].t()
                    y = gate(g, u)
                    if twice:
                        gate(g, u)
                    x = y @ w["d"].t()
                return x
            return step

        def ours(k):
            fk, gk = ck[k]

            def norm(x, res, w):  # res updated in place (the residual stream)
                return L.run_fused_add_rms_norm(fk, x, res, w, EPS)
            return norm, (lambda g, u: L.run_gated(gk, g, u))

        def ind_norm(x, res, w):
            h, s = c_norm(x, res, w)
            res.copy_(s)
            return h

        cands = {k: block(*ours(k)) for k in kdirs}
        cands["kernelize-twice"] = block(*ours("kernelize"), twice=True)
        cands["inductor"] = block(ind_norm, c_gate)
        with torch.no_grad():
            for cname, fn in cands.items():
                g = capture(fn)
                per, wall = profiled(g, a.replays)
                row = dict(batch=batch, candidate=cname, graph_wall_us=wall,
                           gpu_us=sum(sum(v) for v in per.values()),
                           kernels={n: dict(calls=len(v), mean_us=sum(v) / len(v),
                                            first_of_pair_us=sum(v[0::2]) / len(v[0::2]),
                                            second_of_pair_us=sum(v[1::2]) / max(1, len(v[1::2])))
                                    for n, v in per.items()})
                print(json.dumps(row), flush=True)
                rows.append(row)
                del g
            # each exact kernel alone: 200 calls in one graph, under the profiler
            for k in kdirs:
                fk, gk = ck[k]
                x, res, w = x0.clone(), r0.clone(), W[0]["n"]
                gg = torch.randn(batch, INTER, device=dev, dtype=DT)
                uu = torch.randn(batch, INTER, device=dev, dtype=DT)
                for what, fn in (("fused_add_rms_norm", lambda: L.run_fused_add_rms_norm(fk, x, res, w, EPS)),
                                 ("silu_mul", lambda: L.run_gated(gk, gg, uu))):
                    g = capture(lambda: [fn() for _ in range(200)])
                    per, wall = profiled(g, 3)
                    row = dict(batch=batch, candidate=f"{k} alone: {what}", graph_wall_us=wall / 200,
                               kernels={n: dict(calls=len(v), mean_us=sum(v) / len(v)) for n, v in per.items()})
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    (out / "decode_context.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    print("\n| batch | candidate | graph wall µs | kernel | calls | mean µs | 1st of pair | 2nd of pair |")
    print("| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        for n, k in r["kernels"].items():
            if any(s in n for s in ("rms_norm", "silu", "nvjet", "triton")) or "alone" in r["candidate"]:
                print(f"| {r['batch']} | {r['candidate']} | {r['graph_wall_us']:.1f} | {n[:48]} | {k['calls']} | "
                      f"{k['mean_us']:.2f} | {k.get('first_of_pair_us', 0):.2f} | {k.get('second_of_pair_us', 0):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
