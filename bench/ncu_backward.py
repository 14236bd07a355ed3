#!/usr/bin/env python3
"""Profile target for Nsight Compute: the RMSNorm backward kernels' launches (issue 30's speed),
the working tree's source and another (e.g. the release), at training shapes, a few launches
each inside a profiler range.

    ncu --profile-from-start off --set full -k regex:_bwd_ -o OUT/bwd \
        python3 bench/ncu_backward.py [--against SRC] [--shapes 4096x8192,16384x4096] [--dtypes bf16]

The launch order (source, dtype, shape, entry) is printed and written to launches.json beside
the report's folder, so ncu's rows can be named; each source's dx and dw are compared bit for
bit with the working tree's (a profile of a kernel that computes something else is no use).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import backward_probe as P  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", metavar="SRC", help="another source of the kernel, profiled after the working tree's")
    ap.add_argument("--shapes", default="4096x8192,16384x4096")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--semantics", choices=sorted(P.SEMANTICS), default="llama")
    ap.add_argument("--out", default="ncu_backward_launches.json")
    args = ap.parse_args(argv)
    P.SEM = P.SEMANTICS[args.semantics]
    dev = torch.device("cuda", torch.cuda.current_device())
    sources = [("tree", None)] + ([("against", args.against)] if args.against else [])
    order, bad = [], []
    for dt in args.dtypes.split(","):
        ks = {name: P.GpuBackward(dt, dev, (), src) for name, src in sources}
        for sh in args.shapes.split(","):
            rows, cols = (int(v) for v in sh.split("x"))
            x, w, dy = P.make_inputs(dt, rows, cols, dev, seed=1)
            ref = None
            for name, k in ks.items():
                plan = k.plan(rows, cols)
                for _ in range(2):  # warm
                    out = k(dy, x, w, P.EPS, plan)
                torch.cuda.synchronize()
                if ref is None:
                    ref = out
                elif P.ndiff(out[0], ref[0]) or P.ndiff(out[1], ref[1]):
                    bad.append(f"{name} {dt} {sh}")
                torch.cuda.cudart().cudaProfilerStart()
                for _ in range(args.launches):
                    k(dy, x, w, P.EPS, plan)
                    order += [dict(source=name, dtype=dt, shape=sh, entry=e, plan={kk: v for kk, v in plan.items()
                                                                                    if kk.endswith("grid")})
                              for e in ("dx", "dwp", "dw")]
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaProfilerStop()
    Path(args.out).write_text(json.dumps(order, indent=1), encoding="utf-8")
    for i, o in enumerate(order):
        print(i, o)
    if bad:
        print("DIFFERENT BITS:", bad)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
