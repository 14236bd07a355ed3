#!/usr/bin/env python3
"""The exact kernels' GPU time inside a decode step against their time alone (issues 29, 31).

    python3 bench/decode_context_probe.py OUT_DIR [--block llama|gpt2|gpt2-fused] [--batch 1,8]
                                          [--variant NAME=KERNELS_DIR ...] [--row-grid]

Session 14's profiles of a compiled Llama 1.1B decode step (H200) gave `silu_mul` at 1 x 5632
3.4-4.1 µs a call at batch 1 and 2.1 µs at batch 8, while bench/decode_rows.py, which replays the
same kernel back to back, gives 1.84 µs at 1 x 5632. This probe finds out where the difference
comes from without compiling a model: a CUDA graph of the MLP half of a model's blocks at decode
rows, each block its own weights, bf16, replayed under torch.profiler, with each kernel's GPU time
per call read from the profile. `--block`:

- `llama` (default): 22 blocks of Llama 1.1B's (hidden 2048, intermediate 5632): residual add +
  RMSNorm, gate and up projections, the gated activation, down projection; the exact kernels
  fused_add_rms_norm and silu_mul;
- `gpt2`: 36 blocks of GPT-2 large's (hidden 1280, intermediate 5120): residual add, LayerNorm,
  the fc projection with its bias, tanh GELU, the output projection with its bias; the exact
  kernels layer_norm and gelu_tanh (the add is eager's, as inductor leaves it around the opaque
  norm);
- `gpt2-fused`: the same blocks with the residual add and the LayerNorm in one exact kernel,
  fused_add_layer_norm (as exact compile pairs them since session 22).

Candidates:

- `kernelize`: the bundled exact kernels (kernels/);
- `kernelize-twice`: the same with every exact kernel called a second time right after the first
  on the same inputs (the second call's output unused): if the first call of each pair is slow
  and the second is not, the cost is the kernel's cold start on its SMs (its code and its
  parameters not yet fetched), not its work;
- `inductor`: torch.compile's fused add + norm and activation in their place (inexact; for scale);
- each `--variant NAME=DIR`: the kernels of another kernels folder, as `kernelize`;
- `kernelize-row-grid` (with `--row-grid`): the bundled kernels with their persistent grids
  capped at one block a row (bench/decode_rows.py's RowGridKernel): whether the blocks that have
  no row cost more inside a model than back to back.

And each kernel alone, 200 calls back to back in one graph (bench/decode_rows.py's measure), under
the profiler too. Prints a table last; writes OUT_DIR/decode_context.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from run_env import run_env  # noqa: E402 (bench/ is on the path of a bench script)
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

from decode_rows import RowGridKernel, capture_graph, compiled_kernel, replay_us  # noqa: E402
from kernelize import launch as L  # noqa: E402

EPS = 1e-5
DT = torch.bfloat16


def profiled(g: torch.cuda.CUDAGraph, replays: int) -> tuple[dict, float]:
    """Kernel name -> GPU µs of each call, in the order of a replay (averaged over the replays);
    and the replay's wall time (µs, CUDA events, outside the profiler)."""
    from torch.profiler import ProfilerActivity, profile
    walls = sorted(replay_us(g))
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
    return out, walls[len(walls) // 2]


class Block:
    """The MLP half of a model's decode blocks: weights per block, the exact kernels it runs, and
    one block's work given its norm and activation (ours, or inductor's)."""

    def __init__(self, name: str, dev: str):
        self.name = name
        if name == "llama":
            self.hidden, inter, layers = 2048, 5632, 22
            self.kernels = ("fused_add_rms_norm", "silu_mul")
            self.W = [dict(n=(torch.randn(self.hidden, device=dev) * 0.1 + 1).to(DT),
                           g=(torch.randn(inter, self.hidden, device=dev) * 0.02).to(DT),
                           u=(torch.randn(inter, self.hidden, device=dev) * 0.02).to(DT),
                           d=(torch.randn(self.hidden, inter, device=dev) * 0.02).to(DT)) for _ in range(layers)]
        elif name in ("gpt2", "gpt2-fused"):
            self.hidden, inter, layers = 1280, 5120, 36
            self.kernels = ("fused_add_layer_norm" if name == "gpt2-fused" else "layer_norm", "gelu_tanh")
            self.W = [dict(n=(torch.randn(self.hidden, device=dev) * 0.1 + 1).to(DT),
                           b=(torch.randn(self.hidden, device=dev) * 0.1).to(DT),
                           fc=(torch.randn(inter, self.hidden, device=dev) * 0.02).to(DT),
                           fcb=(torch.randn(inter, device=dev) * 0.02).to(DT),
                           pr=(torch.randn(self.hidden, inter, device=dev) * 0.02).to(DT),
                           prb=(torch.randn(self.hidden, device=dev) * 0.02).to(DT)) for _ in range(layers)]
        else:
            raise SystemExit(f"unknown block {name!r}: llama, gpt2 or gpt2-fused")

    def ours(self, cks):
        """(norm(x, res, w) -> h with res updated in place, act(*inputs)) on the exact kernels."""
        fk, ak = cks
        if self.name == "llama":
            return ((lambda x, res, w: L.run_fused_add_rms_norm(fk, x, res, w["n"], EPS)),
                    (lambda g, u: L.run_gated(ak, g, u)))
        if self.name == "gpt2-fused":
            return ((lambda x, res, w: L.run_fused_add_layer_norm(fk, x, res, w["n"], w["b"], EPS)),
                    (lambda g: L.run_elementwise(ak, g)))

        def norm(x, res, w):
            res.add_(x)
            return L.run_layer_norm(fk, res, w["n"], w["b"], EPS)
        return norm, (lambda g: L.run_elementwise(ak, g))

    def inductor(self):
        if self.name == "llama":
            def f(x, res, w):
                s = x + res
                h = s.float()
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
                return w * h.to(DT), s
            cn, ca = torch.compile(f), torch.compile(lambda g, u: F.silu(g) * u)

            def norm(x, res, w):
                h, s = cn(x, res, w["n"])
                res.copy_(s)
                return h
            return norm, ca
        cn = torch.compile(lambda x, res, w, b: (F.layer_norm(x + res, (x.shape[-1],), w, b, EPS), x + res))
        ca = torch.compile(lambda g: F.gelu(g, approximate="tanh"))

        def norm(x, res, w):
            h, s = cn(x, res, w["n"], w["b"])
            res.copy_(s)
            return h
        return norm, ca

    def mlp(self, h, w, act, twice: bool):
        """The block's work after its norm: projections and the activation (called twice with
        `twice`, the second output unused)."""
        if self.name == "llama":
            g, u = h @ w["g"].t(), h @ w["u"].t()
            y = act(g, u)
            if twice:
                act(g, u)
            return y @ w["d"].t()
        g = torch.addmm(w["fcb"], h, w["fc"].t())
        y = act(g)
        if twice:
            act(g)
        return torch.addmm(w["prb"], y, w["pr"].t())

    def alone(self, cks, batch: int, dev: str):
        """(kernel name, a call of it alone) for each exact kernel of the block."""
        fk, ak = cks
        w = self.W[0]
        x = torch.randn(batch, self.hidden, device=dev, dtype=DT)
        res = torch.randn(batch, self.hidden, device=dev, dtype=DT)
        inter = (w["g"] if self.name == "llama" else w["fc"]).shape[0]
        g = torch.randn(batch, inter, device=dev, dtype=DT)
        u = torch.randn(batch, inter, device=dev, dtype=DT)
        if self.name == "llama":
            return [("fused_add_rms_norm", lambda: L.run_fused_add_rms_norm(fk, x, res, w["n"], EPS)),
                    ("silu_mul", lambda: L.run_gated(ak, g, u))]
        if self.name == "gpt2-fused":
            return [("fused_add_layer_norm",
                     lambda: L.run_fused_add_layer_norm(fk, x, res, w["n"], w["b"], EPS)),
                    ("gelu_tanh", lambda: L.run_elementwise(ak, g))]
        return [("layer_norm", lambda: L.run_layer_norm(fk, x, w["n"], w["b"], EPS)),
                ("gelu_tanh", lambda: L.run_elementwise(ak, g))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--block", default="llama", choices=["llama", "gpt2", "gpt2-fused"])
    p.add_argument("--batch", default="1,8")
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--variant", action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--row-grid", action="store_true",
                   help="also the bundled kernels with their grids capped at one block a row")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = run_env()
    print(env, flush=True)
    torch.manual_seed(0)
    dev = "cuda"
    blk = Block(a.block, dev)
    kdirs = {"kernelize": ROOT / "kernels"}
    for v in a.variant:
        name, _, d = v.partition("=")
        kdirs[name] = Path(d)
    ck = {k: tuple(compiled_kernel(d, n, "bf16") for n in blk.kernels) for k, d in kdirs.items()}
    if a.row_grid:
        kdirs["kernelize-row-grid"] = ROOT / "kernels"
        ck["kernelize-row-grid"] = tuple(compiled_kernel(ROOT / "kernels", n, "bf16", cls=RowGridKernel)
                                         for n in blk.kernels)
    ind = blk.inductor()

    rows = []
    for batch in [int(b) for b in a.batch.split(",")]:
        x0 = torch.randn(batch, blk.hidden, device=dev, dtype=DT)
        r0 = torch.randn(batch, blk.hidden, device=dev, dtype=DT)

        def block(norm, act, twice=False):
            def step():
                x, res = x0.clone(), r0.clone()
                for w in blk.W:
                    h = norm(x, res, w)
                    if twice:
                        norm(x, res.clone(), w)
                    x = blk.mlp(h, w, act, twice)
                return x
            return step

        cands = {k: block(*blk.ours(ck[k])) for k in kdirs}
        cands["kernelize-twice"] = block(*blk.ours(ck["kernelize"]), twice=True)
        cands["inductor"] = block(*ind)
        with torch.no_grad():
            for cname, fn in cands.items():
                g = capture_graph(fn, 1)
                per, wall = profiled(g, a.replays)
                row = dict(block=a.block, batch=batch, candidate=cname, graph_wall_us=wall,
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
                for what, fn in blk.alone(ck[k], batch, dev):
                    g = capture_graph(fn, 200)
                    per, wall = profiled(g, 3)
                    row = dict(block=a.block, batch=batch, candidate=f"{k} alone: {what}", graph_wall_us=wall / 200,
                               kernels={n: dict(calls=len(v), mean_us=sum(v) / len(v)) for n, v in per.items()})
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    (out / "decode_context.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    print("\n| batch | candidate | graph wall µs | kernel | calls | mean µs | 1st of pair | 2nd of pair |")
    print("| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        for n, k in r["kernels"].items():
            if any(s in n for s in ("norm", "silu", "gelu", "nvjet", "triton")) or "alone" in r["candidate"]:
                print(f"| {r['batch']} | {r['candidate']} | {r['graph_wall_us']:.1f} | {n[:48]} | {k['calls']} | "
                      f"{k['mean_us']:.2f} | {k.get('first_of_pair_us', 0):.2f} | {k.get('second_of_pair_us', 0):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
