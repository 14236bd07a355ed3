#!/usr/bin/env python3
"""Does the exact norms' persistent grid cost time at decode rows (issue 29's decode goal, issue
31's Qwen2 decode miss)? At one row the manifests' `grid = "persistent"` launches blocks_per_sm x
SMs blocks (396 on an H200) of which all but one find no row; inductor launches one block a row.

    python3 bench/decode_grid_probe.py OUT_DIR [--kernels rms_norm_llama,fused_add_rms_norm,layer_norm]
        [--rows 1,2,8,32,64] [--cols 1536,2048,4096] [--launches 50] [--no-compile]

Per kernel and shape (bf16), on this GPU: the manifest's grid against a grid of one block per
row (`min(rows, the manifest's)`: the decode path runs where rows <= gridDim.x, so it is still
taken), and inductor's compiled layer (`torch.compile` of the eager layer, static shapes; at one
row only, a compile per shape) for scale. Each is timed as a decode step runs it: --launches
back-to-back calls captured in one CUDA graph, the graph replayed 20 times, µs per call (the
median replay over the calls in it). Bits: both grids' outputs against eager's, every shape.
Writes OUT_DIR/decode_grid_probe.json; prints a markdown table last.
"""
from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ThreadPoolExecutor
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402

import bench_kernels as bk  # noqa: E402
from decode_rows import capture_graph, replay_us  # noqa: E402 (bench/, this script's folder)


ROW_OPS = ("rms_norm", "fused_add_rms_norm", "layer_norm")


def graph_us(fn, launches: int, replays: int = 20) -> float:
    """µs per call of `fn` captured `launches` times in one CUDA graph (bench/decode_rows.py's
    capture), the median of `replays` replays."""
    return statistics.median(replay_us(capture_graph(fn, launches), replays)) / launches


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--kernels", default="rms_norm_llama,fused_add_rms_norm,layer_norm",
                   help="bundled kernels of the row ops, or silu_mul (its grid is per element: timed "
                        "against inductor only, at --rows x --gated-cols)")
    p.add_argument("--gated-cols", default="5632,8960", help="widths for silu_mul (Llama 1.1B, Qwen2 1.5B)")
    p.add_argument("--rows", default="1,2,8,32,64")
    p.add_argument("--cols", default="1536,2048,4096")
    p.add_argument("--launches", type=int, default=50)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.empty(1, device="cuda")
    env = bk.env_info()
    print(env, flush=True)
    major, minor = torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(5)
    T = torch.bfloat16
    rows_out = []
    kernels = [bk.Kernel(str(ROOT / "kernels" / name)) for name in a.kernels.split(",")]

    def compile_bf16(k):  # the bf16 entry alone (its module as the verifier compiles it), all at once
        k.cubin, k.compile_s, _ = bk.nvrtc_compile(k.src, k.m["source"], f"sm_{major}{minor}",
                                                   k.m.get("nvrtc_options", []) + ["-DKERNELIZE_DTYPE_BF16"])

    with ThreadPoolExecutor(len(kernels)) as ex:
        list(ex.map(compile_bf16, kernels))
    for k in kernels:
        name = k.name
        k.entries = {"bf16": k.entries["bf16"]}
        k.load()
        eager, _ = bk.baselines_for((k.op, k.sem))
        compiled = torch.compile(eager, dynamic=False) if a.compile else None
        manifest_dims = k.dims
        for cols in map(int, (a.cols if k.op in ROW_OPS else a.gated_cols).split(",")):
            for rows in map(int, a.rows.split(",")):
                inputs = bk.make_inputs(k.op, T, rows, cols, gen)
                grid, block, smem = manifest_dims(rows, cols, sms)
                # a per-element kernel (silu_mul) already launches what its elements need
                small = [min(rows, grid[0]), 1, 1] if k.op in ROW_OPS else list(grid)
                r = dict(kernel=name, rows=rows, cols=cols, manifest_grid=grid[0], small_grid=small[0], block=block)
                ref = bk.eager_out(k.op, k.sem, inputs, cols)
                for label, g in (("manifest", grid), ("small", small)):
                    k.dims = lambda rr, cc, ss, g=g: (list(g), list(block), smem)
                    go, outs = bk.kernel_call(k, "bf16", inputs, rows, cols, sms)
                    go()
                    torch.cuda.synchronize()
                    r[f"{label}_mismatch"] = sum(bk.bits_mismatch(x, y) for x, y in zip(outs, ref))
                    if k.op == "fused_add_rms_norm":  # the residual is updated in place: fresh one per timing
                        go, _ = bk.kernel_call(k, "bf16", inputs, rows, cols, sms)
                    r[f"{label}_us"] = round(graph_us(go, a.launches), 3)
                k.dims = manifest_dims
                if compiled is not None and rows == 1:
                    fn = bk.baseline_fn(k.op, compiled, inputs)
                    r["inductor_us"] = round(graph_us(fn, a.launches), 3)
                print(json.dumps(r), flush=True)
                rows_out.append(r)
        (a.out / "decode_grid_probe.json").write_text(json.dumps(dict(env=env, rows=rows_out), indent=1))
    print("\n| kernel | rows x cols | grid: manifest / small | µs: manifest | small | inductor | bits differing (manifest, small) |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for r in rows_out:
        print(f"| {r['kernel']} | {r['rows']}x{r['cols']} | {r['manifest_grid']} / {r['small_grid']} | {r['manifest_us']:.2f} | "
              f"{r['small_us']:.2f} | {r.get('inductor_us', float('nan')):.2f} | {r['manifest_mismatch']}, {r['small_mismatch']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
