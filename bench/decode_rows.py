#!/usr/bin/env python3
"""The bundled exact kernels at decode row counts (issues 29 and 31): GPU time per call under a
CUDA graph, and what the launch dimensions cost there.

    python3 bench/decode_rows.py OUT_DIR [--rows 1,2,4,8,16,32,64] [--reps 200]

For each kernel and shape: eager's layer, torch.compile's (inductor, default mode), and the
bundled kernel launched with its manifest's dimensions and with alternative ones (the same
compiled code: only the grid or the block differs). Each is captured `reps` times into one CUDA
graph and replayed; the time is the replay's over `reps` (GPU time per call, launch gaps of a
graph included, as in a captured decode step). Every variant's output is compared bit for bit
with eager's. Writes OUT_DIR/decode_rows.json and prints a markdown table last.

Variants:
- `grid=manifest`: the launch rule as shipped (a persistent grid is blocks_per_sm x SMs, whatever
  the row count);
- `grid<=rows`: a persistent grid capped at one block per row (the kernels loop over their rows
  with a grid stride, so any grid gives the same bits: checked here);
- `block=N`: an elementwise / gated kernel with N threads per block (its tile is blockDim.x x
  4 x 16 bytes, so a smaller block spreads a decode row over more SMs).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import kernelize as K  # noqa: E402
from kernelize import launch as L  # noqa: E402

_manifest_dims = L.launch_dims


def graph_us(fn, reps: int) -> float:
    """GPU time per call of fn, captured `reps` times in one CUDA graph and replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) * 1000 / reps)
    return best


class Variant:
    """Launch dimensions for a compiled kernel: `dims(manifest, rows, cols, sms)` replaces the
    manifest's while the variant is active (the kernel's prepared launches are dropped)."""

    def __init__(self, name, dims):
        self.name, self.dims = name, dims

    def __enter__(self):
        L.launch_dims = self.dims
        return self

    def __exit__(self, *exc):
        L.launch_dims = _manifest_dims


def grid_le_rows(manifest, rows, cols, sms):
    grid, block, smem = _manifest_dims(manifest, rows, cols, sms)
    return (min(grid[0], max(rows, 1)), 1, 1), block, smem


def block_of(n):
    def dims(manifest, rows, cols, sms):
        _, _, smem = _manifest_dims(manifest, rows, cols, sms)
        ept = next(r for r in manifest["launch"])["grid"].get("elements_per_thread", 32)
        blocks = max(-(-(rows * cols) // (n * ept)), 1)
        return (blocks, 1, 1), (n, 1, 1), smem
    return dims


def llama_norm(cols):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    m = LlamaRMSNorm(cols, eps=1e-5)
    with torch.no_grad():
        m.weight.copy_(torch.randn(cols) * 0.1 + 1)
    return m


def gated_mlp(cols, inter):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP
    return LlamaMLP(LlamaConfig(hidden_size=cols, intermediate_size=inter, hidden_act="silu"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--rows", default="1,2,4,8,16,32,64")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--kernels", default="rms_norm_llama,silu_mul,silu",
                   help="which sections: rms_norm_llama, silu_mul, silu (silu and silu_fastmath)")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    import transformers
    env = dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
               transformers=transformers.__version__, command=" ".join(sys.argv))
    print(env, flush=True)
    rows_list = [int(r) for r in a.rows.split(",")]
    kw = dict(kernels_dir=ROOT / "kernels", verbose=False)
    results = []

    def record(row):
        print(row, flush=True)
        results.append(row)

    only = set(a.kernels.split(","))
    # -- rms_norm_llama (HF LlamaRMSNorm) ----------------------------------------------------
    for cols in (2048, 4096) if "rms_norm_llama" in only else ():
        ref = llama_norm(cols).cuda().to(dt)
        kz = llama_norm(cols).cuda().to(dt)
        kz.load_state_dict(ref.state_dict())
        K.kernelize(kz, names=["rms_norm_llama"], **kw)
        ck = kz._kz_compiled
        comp = torch.compile(ref)
        for rows in rows_list:
            x = torch.randn(rows, cols, device="cuda", dtype=dt)
            with torch.no_grad():
                want = ref(x)
                row = dict(kernel="rms_norm_llama", rows=rows, cols=cols,
                           eager_us=graph_us(lambda: ref(x), a.reps),
                           compile_us=graph_us(lambda: comp(x), a.reps))
                row["compile_bits_differ"] = int((comp(x) != want).sum())
                for v in (Variant("grid=manifest", _manifest_dims), Variant("grid<=rows", grid_le_rows)):
                    with v:
                        ck._prepared.clear()
                        f = lambda: L.run_rms_norm(ck, x, kz.weight, 1e-5)  # noqa: E731
                        row[f"{v.name}_us"] = graph_us(f, a.reps)
                        row[f"{v.name}_bits_differ"] = int((f() != want).sum())
                    ck._prepared.clear()
            record(row)
        torch._dynamo.reset()

    # -- silu_mul (HF LlamaMLP's act_fn(gate) * up) ------------------------------------------
    for cols, inter in ((2048, 5632), (2048, 8192), (4096, 14336)) if "silu_mul" in only else ():
        mlp = gated_mlp(cols, inter).cuda().to(dt)
        K.kernelize(mlp, names=["silu_mul"], **kw)
        ck = mlp._kz_compiled
        act = nn.SiLU()
        eager_fn = lambda g, u: act(g) * u  # noqa: E731
        comp = torch.compile(eager_fn)
        for rows in rows_list:
            g = torch.randn(rows, inter, device="cuda", dtype=dt)
            u = torch.randn(rows, inter, device="cuda", dtype=dt)
            with torch.no_grad():
                want = eager_fn(g, u)
                row = dict(kernel="silu_mul", rows=rows, cols=inter,
                           eager_us=graph_us(lambda: eager_fn(g, u), a.reps),
                           compile_us=graph_us(lambda: comp(g, u), a.reps))
                row["compile_bits_differ"] = int((comp(g, u) != want).sum())
                for v in (Variant("grid=manifest", _manifest_dims), Variant("block=128", block_of(128)),
                          Variant("block=64", block_of(64)), Variant("block=32", block_of(32))):
                    with v:
                        ck._prepared.clear()
                        f = lambda: L.run_gated(ck, g, u)  # noqa: E731
                        row[f"{v.name}_us"] = graph_us(f, a.reps)
                        row[f"{v.name}_bits_differ"] = int((f() != want).sum())
                    ck._prepared.clear()
            record(row)
        torch._dynamo.reset()

    # -- silu (nn.SiLU) and silu_fastmath (__expf, __fdividef): what the exact math costs --------
    for cols in (8192,) if "silu" in only else ():
        ref = nn.SiLU()
        comp = torch.compile(ref)
        kz = {}
        for name in ("silu", "silu_fastmath"):
            m = nn.SiLU()
            K.kernelize(m, names=[name], dtype=a.dtype, device="cuda", **kw)
            kz[name] = m
        for rows in rows_list:
            x = torch.randn(rows, cols, device="cuda", dtype=dt)
            with torch.no_grad():
                want = ref(x)
                row = dict(kernel="silu", rows=rows, cols=cols, eager_us=graph_us(lambda: ref(x), a.reps),
                           compile_us=graph_us(lambda: comp(x), a.reps))
                row["compile_bits_differ"] = int((comp(x) != want).sum())
                for name, m in kz.items():
                    ck = getattr(m, "_kz_compiled", None)
                    if ck is None:
                        row[f"{name}_error"] = "not swapped"
                        continue
                    f = lambda: L.run_elementwise(ck, x)  # noqa: E731
                    row[f"{name}_us"] = graph_us(f, a.reps)
                    row[f"{name}_bits_differ"] = int((f() != want).sum())
            record(row)
        torch._dynamo.reset()

    (out / "decode_rows.json").write_text(json.dumps(dict(env=env, rows=results), indent=1))
    keys = [k for k in results[0] if k.endswith("_us")]
    for r in results:
        for k in r:
            if k.endswith("_us") and k not in keys:
                keys.append(k)
    print("\n" + json.dumps(env))
    print("| kernel | rows x cols | " + " | ".join(k[:-3] + " µs" for k in keys) + " | bits differing (compile / kernel variants) |")
    print("| --- | --- | " + " | ".join("---:" for _ in keys) + " | --- |")
    for r in results:
        diffs = [str(r["compile_bits_differ"])] + [str(v) for k, v in r.items()
                                                   if k.endswith("_bits_differ") and not k.startswith("compile")]
        print(f"| {r['kernel']} | {r['rows']}x{r['cols']} | " + " | ".join(
            f"{r[k]:.2f}" if k in r else "-" for k in keys) + " | " + " / ".join(diffs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
