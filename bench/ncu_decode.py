#!/usr/bin/env python3
"""Profile target for Nsight Compute at decode rows (issues 29 and 31): the bundled exact kernels
against inductor's compiled eager layers of the same shapes, and the minimal exact LlamaRMSNorm
of bench/decode_probe.py, a few launches each, inside a profiler range (warm-ups and inductor's
compilation happen before it).

    ncu --profile-from-start off --cache-control none --set full --import-source no \
        -o OUT/decode python3 bench/ncu_decode.py OUT [--cases rms_norm_llama:1x2048,...] [--launches 2]

Each case `kernel:ROWSxCOLS` (bf16) is a section of bench/decode_rows.py: its eager layer and the
bundled kernel launched through the client (`compiled_kernel`, as a swapped layer launches it),
then `torch.compile` of the eager layer, `--launches` times each; `probe` is decode_probe's `min`
kernel at 1x2048. The launch order, with each launch's case and side, is written to
OUT/launches.json (ncu's report lists the kernels in the same order), the bundled kernels' CUBINs
to OUT/<kernel>_bf16.cubin (for `cuobjdump -sass`, `-res-usage`), and every output is checked bit
for bit against eager's (a profile of a kernel that computes something else is no use).
Session 33 (docs/gpu-runs/2026-11-29-s33, run 1) ran an earlier form of this script, which
compiled and launched through scripts/bench_kernels.py instead: the same kernels and shapes
(this form has not run on a GPU yet).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

from decode_probe import PER_ROW, SRC, manifest  # noqa: E402
from decode_rows import SECTIONS, compiled_kernel, differ  # noqa: E402
from kernelize import launch as L  # noqa: E402
from run_env import run_env  # noqa: E402

DEFAULT = "rms_norm_llama:1x2048,rms_norm_llama:1x4096,fused_add_rms_norm:1x1536,silu_mul:1x8960,layer_norm:1x2048,probe:1x2048"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--cases", default=DEFAULT)
    p.add_argument("--launches", type=int, default=2)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(5)
    T = torch.bfloat16
    cks: dict[str, L.CompiledKernel] = {}
    plan = []   # (case, side, fn)
    bits = {}
    with torch.no_grad():
        for case in a.cases.split(","):
            name, shape = case.split(":")
            rows, cols = map(int, shape.split("x"))
            if name == "probe":   # decode_probe's minimal kernel, checked as an rms_norm_llama
                name, side = "rms_norm_llama", "probe"
                ck = L.CompiledKernel(manifest(PER_ROW), SRC, "bf16", torch.device("cuda", 0))
            else:
                side = "bundled"
                if name not in cks:
                    cks[name] = compiled_kernel(ROOT / "kernels", name, "bf16")
                    (a.out / f"{name}_bf16.cubin").write_bytes(cks[name].code.code)
                ck = cks[name]
            eager, kernel = SECTIONS[name][2](rows, cols, T)
            want = eager()
            go = kernel(ck)
            bits[f"{case} {side}"] = differ(go(), want)
            plan.append((case, side, go))
            if side == "bundled":
                comp = torch.compile(eager)
                for _ in range(3):
                    comp()   # compiles (once per shape) and warms
                plan.append((case, "inductor", comp))
        torch.cuda.synchronize()
        launches = []
        torch.cuda.cudart().cudaProfilerStart()
        for case, side, fn in plan:
            for i in range(a.launches):
                fn()
                launches.append(dict(case=case, side=side, launch=i))
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    (a.out / "launches.json").write_text(json.dumps(dict(env=run_env(dtype="bf16"), bits_differing=bits,
                                                         launches=launches), indent=1))
    print(json.dumps(bits))
    return 0 if not any(bits.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
