#!/usr/bin/env python3
"""Tune the staged engine of kernels/src/eager.cuh on the GPU machine: each bundled eager-order
kernel compiled with build variants (-D macros of eager.cuh, e.g. KZ_TILE_BYTES) and launched
with launch-rule variants (block, blocks per SM, dynamic shared memory), timed at the
benchmark's shapes with the L2 flushed, every output compared bit for bit with the real eager layer.

    PYTHONPATH=python python3 scripts/staged_tune.py OUT [--only K1,K2] [--shapes 1x4096,...]
        [--variants NAME,...] [--reps 20] [--dtype bf16]

Writes OUT/tune.json (every measurement) and prints a table per kernel: us per variant and shape,
the fraction of the copy bandwidth measured in the same run, and the elements that differ from
eager (any non-zero count disqualifies the variant). A variant is a build (macros) plus a launch
override per launch rule; the manifest's own rules are the `base` variant.
"""

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kernels as B  # noqa: E402

KERNELS = ["rms_norm_llama", "rms_norm_gemma", "rms_norm_torch", "fused_add_rms_norm", "layer_norm"]
SHAPES = ["1x4096", "4x4096", "16x4096", "64x4096", "1024x4096", "4096x4096", "32768x4096",
          "1x8192", "64x8192", "4096x8192", "1024x2048", "4096x16384"]

# name -> (NVRTC -D options, launch override: cols -> dict of rule fields, or None = manifest's)
KB = 1024


def rule_small(block, bps, smem=0):
    return {"block": block, "grid": "persistent", "blocks_per_sm": bps, "smem_bytes": smem}


VARIANTS = {
    "base": ([], None),
    # 128-thread blocks above the [32, 8] rule's widths (1.0.3's launch for the mean order)
    "128x5": ([], lambda cols: rule_small([32, 8], 3) if cols <= 8160 else rule_small(128, 5)),
    # a smaller tile buffer, more blocks per SM
    "tile24_128x6": (["-DKZ_TILE_BYTES=24576"],
                     lambda cols: rule_small([32, 8], 3) if cols <= 8160 else rule_small(128, 6)),
    "tile24_256x4": (["-DKZ_TILE_BYTES=24576"], lambda cols: rule_small([32, 8], 4)),
    # 256 threads at every width (for the layer-norm order: only valid where the staged engine
    # takes the rows, which the tuning inputs guarantee: aligned, whole 16-byte chunks)
    "256x3": ([], lambda cols: rule_small([32, 8], 3)),
    # the fused add's tile loops with int instead of 64-bit indices
    "resid_i32": (["-DKZ_RESID_IDX64=0"], None),
}
# (Measured and dropped on 2026-11-24, H200: a double-buffered tile, 64-96 KB tiles in dynamic
# shared memory, were 5-40% slower at 4096x8192 and 32768x4096; bench/RESULTS.md.)


class Variant(B.Kernel):
    """A bundled kernel built with extra macros and launched with other rules."""

    def __init__(self, d, name, defines, override, dtype):
        super().__init__(d)
        self.variant = name
        self.defines = defines
        self.override = override
        self.dtype = dtype

    def compile(self, arch):
        opts = self.m.get("nvrtc_options", []) + [f"-DKERNELIZE_DTYPE_{self.dtype.upper()}"] + self.defines
        self.cubin, self.compile_s, _ = B.nvrtc_compile(self.src, self.m["source"], arch, opts)
        self.entries = {self.dtype: self.m["entry"][self.dtype]}

    def rule(self, cols):
        if self.override is None:
            return super().rule(cols)
        return self.override(cols)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--only", default=",".join(KERNELS))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--kernels-dir", default=os.path.join(B.ROOT, "kernels"),
                    help="the kernel folders (e.g. an earlier release's, to compare)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    dev = torch.cuda.get_device_properties(0)
    arch = f"sm_{dev.major}{dev.minor}"
    sms = dev.multi_processor_count
    T = B.DT[args.dtype]
    timer = B.Timer(args.reps)
    copy_gbps, _ = B.copy_bandwidth(timer)
    env = B.env_info()
    print(f"{env['device']} {arch} sms={sms} copy={copy_gbps:.0f} GB/s torch {torch.__version__}", flush=True)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    names = args.variants.split(",")
    kernels = args.only.split(",")
    todo = [(k, v) for k in kernels for v in names]
    built = {}

    def build(kv):
        k, v = kv
        defines, override = VARIANTS[v]
        var = Variant(os.path.join(args.kernels_dir, k), v, defines, override, args.dtype)
        try:
            var.compile(arch)
        except Exception as e:  # a variant that does not build is reported, not fatal
            var.error = str(e)[:400]
        return kv, var

    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as ex:
        for kv, var in ex.map(build, todo):
            built[kv] = var
    results = []
    for k in kernels:
        key = (built[(k, names[0])].op, built[(k, names[0])].sem)
        eager_fn, bases = B.baselines_for(key)
        for rows, cols in shapes:
            gen = torch.Generator(device="cuda").manual_seed(rows * 100003 + cols)
            op = built[(k, names[0])].op
            inputs = B.make_inputs(op, T, rows, cols, gen)
            want = B.eager_out(op, key[1], inputs, cols)
            nb = B.nbytes(op, T, rows, cols)
            for bname, fn in bases:
                if bname.startswith("eager") and rows * cols > 4096 * 8192:
                    continue
                us = timer(B.baseline_fn(op, fn, inputs))
                results.append({"kernel": k, "variant": "~" + bname, "rows": rows, "cols": cols, "us": us,
                                "frac": nb / (us * 1e-6) / 1e9 / copy_gbps, "mism": None})
            for v in names:
                var = built[(k, v)]
                r = {"kernel": k, "variant": v, "rows": rows, "cols": cols}
                if var.error:
                    r["error"] = var.error
                    results.append(r)
                    continue
                try:
                    if not var.funcs:
                        var.load()
                    go, outs = B.kernel_call(var, args.dtype, inputs if op != "fused_add_rms_norm"
                                             else (inputs[0], inputs[1], inputs[2]), rows, cols, sms)
                    if op == "fused_add_rms_norm":  # the residual is updated in place: time on a copy
                        res0 = outs[1].clone()
                    us = timer(go)
                    if op == "fused_add_rms_norm":
                        outs[1].copy_(res0)
                    go()
                    torch.cuda.synchronize()
                    mism = sum(B.bits_mismatch(a, b) for a, b in zip(outs, want))
                    r.update(us=us, frac=nb / (us * 1e-6) / 1e9 / copy_gbps, mism=int(mism))
                except Exception as e:
                    r["error"] = str(e)[:300]
                    torch.cuda.synchronize()
                results.append(r)
            print(f"{k} {rows}x{cols} done", flush=True)
    with open(os.path.join(args.out, "tune.json"), "w") as f:
        json.dump({"env": env, "copy_gbps": copy_gbps, "reps": args.reps, "dtype": args.dtype,
                   "variants": {v: VARIANTS[v][0] for v in names}, "results": results}, f, indent=1)
    # the table: one line per kernel and variant, one column per shape
    cols_hdr = [f"{r}x{c}" for r, c in shapes]
    for k in kernels:
        print(f"\n## {k} ({args.dtype}, us; * = differs from eager, E = error)")
        print(f"{'variant':22} " + " ".join(f"{h:>10}" for h in cols_hdr))
        vs = []
        for r in results:
            if r["kernel"] == k and r["variant"] not in vs:
                vs.append(r["variant"])
        for v in vs:
            cells = []
            for rows, cols in shapes:
                m = [r for r in results if r["kernel"] == k and r["variant"] == v and r["rows"] == rows and r["cols"] == cols]
                if not m:
                    cells.append("-")
                elif "error" in m[0]:
                    cells.append("E")
                else:
                    mark = "*" if m[0]["mism"] else ""
                    cells.append(f"{m[0]['us']:.1f}{mark}")
            print(f"{v[:22]:22} " + " ".join(f"{c:>10}" for c in cells))
        errs = {r["variant"]: r["error"] for r in results if r["kernel"] == k and "error" in r}
        for v, e in errs.items():
            print(f"  {v}: {e[:200]}")


if __name__ == "__main__":
    main()
