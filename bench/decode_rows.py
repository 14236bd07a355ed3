#!/usr/bin/env python3
"""The bundled exact kernels at decode row counts and at large shapes (issues 29 and 31): GPU
time per call under a CUDA graph, against eager, torch.compile and the previous version of the
same kernels.

    python3 bench/decode_rows.py OUT_DIR [--before KERNELS_DIR] [--variant NAME=KERNELS_DIR ...]
                                  [--rows 1,2,4,8,16,32,64] [--kernels rms_norm_llama,...]
                                  [--large] [--dtype bf16]

For each kernel and shape: eager's layer, torch.compile's (inductor, default mode), the bundled
kernel of this checkout (`after`) and, with --before, the same kernel from another kernels
folder (`before`: e.g. the previous release, exported with `git archive`; --variant adds more
such folders under their own names, e.g. builds of this checkout with other tuning macros). Each
is captured
`reps` times into one CUDA graph and replayed; the time is the replay's over `reps` (GPU time per
call, a graph's launch gaps included, as in a captured decode step). Every kernel's output is
compared bit for bit with eager's (and the residual too for the fused adds). A kernel not bundled
yet (kernels/generate.py's STAGED list) is this checkout's staged one (`kernels/generate.py
--staged`, written under OUT_DIR/staged). Both kernel versions
are launched with their own manifest's launch rule, through the client's launcher. Writes
OUT_DIR/decode_rows.json and prints a markdown table last.

--cold writes a 128 MB buffer before every call (in the same graph) and subtracts that write's
own time: each call then finds its inputs and weights out of L2, as a norm inside a model's step
does (the step's weights stream through L2 between two norms). --row-grid adds `after-rowgrid`,
the after kernel with its persistent grid capped at one block a row.

--widths and --large-shapes replace every section's widths and large shapes (odd widths time
the paths a kernel takes for rows that are not whole 16-byte chunks).

--large adds the large shapes (4096x8192 and 32768x4096 rows for the norms, 256x14336,
1024x14336 and 4096x14336 for the gated op, 512x4096, 2048x4096 and 32768x4096 for SiLU: the
elementwise kernels' two shapes of work, one 16-byte vector per thread below a 2048-block grid
and 4 per thread above), where the question is only whether a new version is slower. At those
shapes `copy` is a device-to-device copy moving as many bytes (read + written) as the kernel,
and the table gives each kernel version's fraction of its bandwidth (copy µs / kernel µs).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from run_env import run_env  # noqa: E402 (bench/ is on the path of a bench script)
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from kernelize import launch as L  # noqa: E402
from kernelize.manifest import launch_rule, parse_manifest_toml  # noqa: E402

DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def capture_graph(fn, calls: int, warm: int = 3) -> torch.cuda.CUDAGraph:
    """`fn` captured `calls` times in one CUDA graph (after `warm` calls on a side stream), and
    replayed once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def replay_us(g: torch.cuda.CUDAGraph, n: int = 5) -> list[float]:
    """The time of each of `n` replays of `g`, µs (CUDA events around each)."""
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000)
    return out


def graph_us(fn, reps: int) -> float:
    """GPU time per call of fn, captured `reps` times in one CUDA graph and replayed."""
    return min(replay_us(capture_graph(fn, reps))) / reps


def compiled_kernel(kdir: Path, name: str, dtype: str, cls=L.CompiledKernel) -> L.CompiledKernel:
    man = parse_manifest_toml((kdir / name / "kernel.toml").read_text(encoding="utf-8"))
    src = (kdir / name / "kernel.cu").read_text(encoding="utf-8")
    return cls(man, src, dtype, torch.device("cuda", torch.cuda.current_device()))


class RowGridKernel(L.CompiledKernel):
    """The kernel with its persistent launch rule capped at one block a row (`--row-grid`): what a
    decode step would gain if the launch arithmetic gave min(rows, blocks_per_sm * SMs) blocks
    instead of blocks_per_sm * SMs, most of which have no row (the bundled row kernels take the
    same paths either way: their decode path needs rows <= gridDim.x)."""

    def _prepare(self, rows, cols, n_tensors, scalars):
        orig = L.launch_dims

        def capped(man, r, c, sms):
            (g, gy, gz), block, smem = orig(man, r, c, sms)
            if launch_rule(man, c)["grid"]["kind"] == "persistent":
                g = max(1, min(g, r))
            return (g, gy, gz), block, smem

        L.launch_dims = capped
        try:
            return super()._prepare(rows, cols, n_tensors, scalars)
        finally:
            L.launch_dims = orig


def differ(a, b) -> int:
    if isinstance(a, tuple):
        return sum(differ(x, y) for x, y in zip(a, b))
    return int((a.view(torch.int16 if a.element_size() == 2 else torch.int32)
                != b.view(torch.int16 if b.element_size() == 2 else torch.int32)).sum())


# ---- sections: name -> (decode widths, large shapes, setup) ---------------------------------------
# setup(rows, cols, dt) returns (eager_fn, kernel_fn(ck) -> fn); each fn takes no argument and
# returns the output (a tuple for the fused add: out, residual after).

def _norm_weight(cols, dt, base=1.0):
    return (torch.randn(cols, device="cuda") * 0.1 + base).to(dt)


def setup_rms_norm_llama(rows, cols, dt):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    m = LlamaRMSNorm(cols, eps=1e-5).cuda().to(dt)
    with torch.no_grad():
        m.weight.copy_(_norm_weight(cols, dt))
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    return (lambda: m(x)), (lambda ck: (lambda: L.run_rms_norm(ck, x, m.weight, 1e-5)))


def setup_rms_norm_gemma(rows, cols, dt):
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    m = GemmaRMSNorm(cols, eps=1e-6).cuda().to(dt)
    with torch.no_grad():
        m.weight.copy_(_norm_weight(cols, dt, base=0.0))  # Gemma's w is the offset from 1
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    return (lambda: m(x)), (lambda ck: (lambda: L.run_rms_norm(ck, x, m.weight, 1e-6)))


def setup_rms_norm_torch(rows, cols, dt):
    m = nn.RMSNorm(cols, eps=1e-5).cuda().to(dt)
    with torch.no_grad():
        m.weight.copy_(_norm_weight(cols, dt))
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    return (lambda: m(x)), (lambda ck: (lambda: L.run_rms_norm(ck, x, m.weight, 1e-5)))


def _fused_add(rows, cols, dt, norm, run):
    """A fused add's section: eager adds in the model's dtype (HF's `residual + hidden_states`,
    GPT-2's `attn_output + residual`) then runs `norm`; the kernel is `run(ck, x, residual)`,
    which updates the residual in place (its first call, the bits, starts from the same one)."""
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    res0 = torch.randn(rows, cols, device="cuda", dtype=dt)

    def eager():
        s = x + res0
        return norm(s), s

    def kernel(ck):
        res = res0.clone()
        return lambda: (run(ck, x, res), res)
    return eager, kernel


def setup_fused_add_rms_norm(rows, cols, dt):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    m = LlamaRMSNorm(cols, eps=1e-5).cuda().to(dt)
    with torch.no_grad():
        m.weight.copy_(_norm_weight(cols, dt))
    return _fused_add(rows, cols, dt, m, lambda ck, x, res: L.run_fused_add_rms_norm(ck, x, res, m.weight, 1e-5))


def _layer_norm(cols, dt):
    m = nn.LayerNorm(cols, eps=1e-5).cuda().to(dt)
    with torch.no_grad():
        m.weight.copy_(_norm_weight(cols, dt))
        m.bias.copy_((torch.randn(cols, device="cuda") * 0.1).to(dt))
    return m


def setup_layer_norm(rows, cols, dt):
    m = _layer_norm(cols, dt)
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    return (lambda: m(x)), (lambda ck: (lambda: L.run_layer_norm(ck, x, m.weight, m.bias, 1e-5)))


def setup_fused_add_layer_norm(rows, cols, dt):
    m = _layer_norm(cols, dt)
    return _fused_add(rows, cols, dt, m,
                      lambda ck, x, res: L.run_fused_add_layer_norm(ck, x, res, m.weight, m.bias, 1e-5))


def setup_silu_mul(rows, cols, dt):
    g = torch.randn(rows, cols, device="cuda", dtype=dt)
    u = torch.randn(rows, cols, device="cuda", dtype=dt)
    act = nn.SiLU()
    return (lambda: act(g) * u), (lambda ck: (lambda: L.run_gated(ck, g, u)))


def setup_silu(rows, cols, dt):
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    act = nn.SiLU()
    return (lambda: act(x)), (lambda ck: (lambda: L.run_elementwise(ck, x)))


SECTIONS = {
    "rms_norm_llama": ((2048, 4096, 8192), ((4096, 8192), (32768, 4096)), setup_rms_norm_llama),
    "rms_norm_gemma": ((2048, 3072), ((4096, 8192), (32768, 4096)), setup_rms_norm_gemma),
    "rms_norm_torch": ((2048, 4096), ((4096, 8192), (32768, 4096)), setup_rms_norm_torch),
    "fused_add_rms_norm": ((2048, 4096), ((4096, 8192), (32768, 4096)), setup_fused_add_rms_norm),
    "layer_norm": ((2048, 4096), ((4096, 8192), (32768, 4096)), setup_layer_norm),
    # GPT-2's widths (1280: the 1B config of bench/model_bench.py)
    "fused_add_layer_norm": ((1280, 2048), ((4096, 8192), (32768, 4096)), setup_fused_add_layer_norm),
    "silu_mul": ((5632, 8192, 14336), ((256, 14336), (1024, 14336), (4096, 14336)), setup_silu_mul),
    "silu": ((8192,), ((512, 4096), (2048, 4096), (32768, 4096)), setup_silu),
}
# Elements read + written per output element, over 2: a copy of COPY[name] * rows * cols elements
# moves as many bytes as the kernel (the norms' weight and bias left out).
COPY = {"rms_norm_llama": 1, "rms_norm_gemma": 1, "rms_norm_torch": 1, "fused_add_rms_norm": 2, "layer_norm": 1, "fused_add_layer_norm": 2,
        "silu_mul": 1.5, "silu": 1}


def copy_us(name, rows, cols, dt, reps):
    src = torch.randn(int(COPY[name] * rows * cols), device="cuda").to(dt)
    dst = torch.empty_like(src)
    return graph_us(lambda: dst.copy_(src), reps)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--before", type=Path, help="a kernels folder with the versions to compare against")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                   help="another kernels folder to time, under NAME (repeatable)")
    p.add_argument("--rows", default="1,2,4,8,16,32,64")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--dtype", default="bf16", choices=sorted(DT))
    p.add_argument("--kernels", default=",".join(SECTIONS), help="sections: " + ", ".join(SECTIONS))
    p.add_argument("--large", action="store_true", help="also the large shapes (20 calls per graph)")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--cubins", action="store_true", help="write each kernel's CUBIN to OUT_DIR (for nvdisasm)")
    p.add_argument("--cold", action="store_true",
                   help="before every call, write a 128 MB buffer (L2 evicted, as a model's weights stream "
                        "through it between two norms); the write's own time is subtracted")
    p.add_argument("--widths", help="widths of the row counts, comma-separated, instead of each section's own "
                                    "(e.g. 1001,4099: rows that are not whole 16-byte chunks, the generic paths)")
    p.add_argument("--large-shapes", help="with --large: ROWSxCOLS,... instead of each section's own")
    p.add_argument("--row-grid", action="store_true",
                   help="also `after-rowgrid`: the after kernel with its persistent grid capped at one block a row")
    a = p.parse_args()
    unknown = [k for k in a.kernels.split(",") if k not in SECTIONS]
    if unknown:
        p.error(f"--kernels: no section for {', '.join(unknown)} (sections: {', '.join(SECTIONS)})")
    for v in [a.before] + [Path(v.partition("=")[2]) for v in a.variant]:
        if v is not None and not v.is_dir():
            p.error(f"{v}: no such kernels folder (a folder that is not in the tree must be carried to the GPU machine)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dt = DT[a.dtype]
    env = run_env(dtype=a.dtype)
    print(env, flush=True)
    torch.manual_seed(0)
    rows_list = [int(r) for r in a.rows.split(",")]
    versions = {"after": ROOT / "kernels"}
    if a.before:
        versions = {"before": a.before, "after": ROOT / "kernels"}
    for v in a.variant:
        vname, _, vdir = v.partition("=")
        assert vname and vdir and vname not in versions and vname not in ("eager", "compile", "copy"), v
        versions[vname] = Path(vdir)
    results = []
    staged = None
    timed = graph_us
    if a.cold:
        scratch = torch.empty(64 << 20, dtype=torch.bfloat16, device="cuda")
        flush_us = graph_us(scratch.zero_, a.reps)
        print(f"cold: the 128 MB write alone {flush_us:.2f} µs, subtracted from every time", flush=True)

        def timed(fn, reps):  # noqa: F811 (the cold variant of graph_us)
            return graph_us(lambda: (scratch.zero_(), fn())[1], reps) - flush_us
    for name in a.kernels.split(","):
        widths, large, setup = SECTIONS[name]
        if a.widths:
            widths = tuple(int(c) for c in a.widths.split(","))
        if a.large_shapes:
            large = tuple(tuple(int(v) for v in s.split("x")) for s in a.large_shapes.split(","))
        dirs = dict(versions)
        if not (dirs["after"] / name).is_dir():
            # not bundled yet: this checkout's staged kernel (kernels/generate.py --staged)
            if staged is None:
                staged = out / "staged"
                subprocess.run([sys.executable, str(ROOT / "kernels" / "generate.py"), "--staged", str(staged)],
                               check=True)
            dirs["after"] = staged
        # (a --before or --variant folder without this kernel is left out of its rows)
        cks = {v: compiled_kernel(d, name, a.dtype) for v, d in dirs.items() if (d / name).is_dir()}
        if a.row_grid:
            cks["after-rowgrid"] = compiled_kernel(dirs["after"], name, a.dtype, RowGridKernel)
        if a.cubins:
            for v, ck in cks.items():
                (out / f"{name}_{a.dtype}_{v}.cubin").write_bytes(ck.code.code)
        shapes = [(r, c, a.reps, False) for c in widths for r in rows_list]
        if a.large:
            shapes += [(r, c, 20, True) for r, c in large]
        for rows, cols, reps, big in shapes:
            eager, kernel = setup(rows, cols, dt)
            with torch.no_grad():
                want = eager()
                row = dict(kernel=name, rows=rows, cols=cols, eager_us=timed(eager, reps))
                if big:
                    row["copy_us"] = copy_us(name, rows, cols, dt, reps)
                if not a.no_compile:
                    comp = torch.compile(eager)
                    row["compile_us"] = timed(comp, reps)
                    row["compile_bits_differ"] = differ(comp(), want)
                for v, ck in cks.items():
                    f = kernel(ck)
                    row[f"{v}_bits_differ"] = differ(f(), want)
                    row[f"{v}_us"] = timed(f, reps)
            print(row, flush=True)
            results.append(row)
            torch._dynamo.reset()
    (out / "decode_rows.json").write_text(json.dumps(dict(env=env, rows=results), indent=1))
    if a.row_grid:
        versions["after-rowgrid"] = versions["after"]
    keys = [k for k in ("eager_us", "compile_us", *(f"{v}_us" for v in versions)) if all(k in r for r in results)]
    kvers = [k for k in keys if k[:-3] in versions]
    print("\n" + json.dumps(env))
    ratio = "before_us" in keys
    print("| kernel | rows x cols | " + " | ".join(k[:-3] + " µs" for k in keys)
          + (" | before / after |" if ratio else " |") + " copy µs | of copy bandwidth ("
          + " / ".join(k[:-3] for k in kvers) + ") | bits differing from eager ("
          + " / ".join(k[:-3] for k in keys if k != "eager_us") + ") |")
    print("| --- | --- | " + " | ".join("---:" for _ in keys) + (" | ---: |" if ratio else " |")
          + " ---: | ---: | --- |")
    for r in results:
        diffs = [str(r[k[:-3] + "_bits_differ"]) for k in keys if k != "eager_us"]
        cp = r.get("copy_us")
        frac = " / ".join(f"{cp / r[k]:.2f}" for k in kvers) if cp else ""
        print(f"| {r['kernel']} | {r['rows']}x{r['cols']} | " + " | ".join(f"{r[k]:.2f}" for k in keys)
              + (f" | {r['before_us'] / r['after_us']:.2f}x |" if ratio else " |")
              + (f" {cp:.2f} |" if cp else " |") + f" {frac} | " + " / ".join(diffs) + " |")
    bad = [r for r in results if any(r.get(f"{v}_bits_differ") for v in versions)]
    if bad:
        print(f"\nFAIL: {len(bad)} shapes where a kernel's bits differ from eager", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
