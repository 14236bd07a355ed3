#!/usr/bin/env python3
"""Profile target for Nsight Compute at decode rows (issues 29 and 31): the bundled exact kernels
against inductor's compiled eager layers of the same shapes, and the minimal exact LlamaRMSNorm
of bench/decode_probe.py, a few launches each, inside a profiler range (warm-ups and inductor's
compilation happen before it).

    ncu --profile-from-start off --cache-control none --set full --import-source no \
        -o OUT/decode python3 bench/ncu_decode.py OUT [--cases rms_norm_llama:1x2048,...] [--launches 2]

Each case `kernel:ROWSxCOLS` (bf16) launches the bundled kernel (its bf16 entry, compiled as the
verifier compiles it) `--launches` times, then `torch.compile` of the eager layer
(bench_kernels' baseline, static shapes) as often; `probe` is decode_probe's `min` kernel at
1x2048. The launch order, with each launch's case and side, is written to OUT/launches.json
(ncu's report lists the kernels in the same order), the bundled kernels' CUBINs to
OUT/<kernel>_bf16.cubin (for `cuobjdump -sass`, `-res-usage`), and every output is checked
bit for bit against eager's (a profile of a kernel that computes something else is no use).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

import bench_kernels as bk  # noqa: E402
from decode_probe import PER_ROW, SRC, manifest  # noqa: E402
from kernelize import launch as L  # noqa: E402

DEFAULT = "rms_norm_llama:1x2048,rms_norm_llama:1x4096,fused_add_rms_norm:1x1536,silu_mul:1x8960,layer_norm:1x2048,probe:1x2048"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--cases", default=DEFAULT)
    p.add_argument("--launches", type=int, default=2)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.empty(1, device="cuda")
    major, minor = torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(5)
    T = torch.bfloat16
    kernels: dict[str, bk.Kernel] = {}
    plan = []   # (case, side, fn)
    bits = {}
    for case in a.cases.split(","):
        name, shape = case.split(":")
        rows, cols = map(int, shape.split("x"))
        if name == "probe":
            x = torch.randn(rows, cols, device="cuda", dtype=T, generator=gen)
            w = (torch.randn(cols, device="cuda", dtype=T, generator=gen) * 0.1 + 1).to(T)
            pk = L.CompiledKernel(manifest(PER_ROW), SRC, "bf16", torch.device("cuda", 0))
            fn = lambda pk=pk, x=x, w=w: L.run_rms_norm(pk, x, w, bk.EPS)  # noqa: E731
            out = fn()
            torch.cuda.synchronize()
            bits[case + " probe"] = bk.bits_mismatch(out, bk.eager_out("rms_norm", "llama", (x, w), cols)[0])
            plan.append((case, "probe", fn))
            continue
        if name not in kernels:
            k = bk.Kernel(str(ROOT / "kernels" / name))
            k.cubin, k.compile_s, _ = bk.nvrtc_compile(k.src, k.m["source"], f"sm_{major}{minor}",
                                                       k.m.get("nvrtc_options", []) + ["-DKERNELIZE_DTYPE_BF16"])
            k.entries = {"bf16": k.entries["bf16"]}
            k.load()
            (a.out / f"{name}_bf16.cubin").write_bytes(k.cubin)
            k.eager, _ = bk.baselines_for((k.op, k.sem))
            k.compiled = torch.compile(k.eager, dynamic=False)
            kernels[name] = k
        k = kernels[name]
        inputs = bk.make_inputs(k.op, T, rows, cols, gen)
        go, outs = bk.kernel_call(k, "bf16", inputs, rows, cols, sms)
        go()
        torch.cuda.synchronize()
        bits[case + " bundled"] = sum(bk.bits_mismatch(o, r) for o, r in zip(outs, bk.eager_out(k.op, k.sem, inputs, cols)))
        if k.op == "fused_add_rms_norm":   # the residual is updated in place: later calls start from another
            go, _ = bk.kernel_call(k, "bf16", inputs, rows, cols, sms)
        ind = bk.baseline_fn(k.op, k.compiled, inputs)
        for _ in range(3):
            ind()   # compiles (once per shape) and warms
        plan.append((case, "bundled", go))
        plan.append((case, "inductor", ind))
    torch.cuda.synchronize()
    launches = []
    torch.cuda.cudart().cudaProfilerStart()
    for case, side, fn in plan:
        for i in range(a.launches):
            fn()
            launches.append(dict(case=case, side=side, launch=i))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    (a.out / "launches.json").write_text(json.dumps(dict(env=bk.env_info(), bits_differing=bits, launches=launches), indent=1))
    print(json.dumps(bits))
    return 0 if not any(bits.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
