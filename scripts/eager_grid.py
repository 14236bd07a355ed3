#!/usr/bin/env python3
"""Every bundled exact kernel against the real eager layer it replaces, on a grid of shapes.

Run on a CUDA machine with torch and transformers, from the repository root or a .gpu-stage:

    PYTHONUNBUFFERED=1 python3 scripts/eager_grid.py OUT_DIR [--quick] [--only k1,k2]
        [--variants] [--kernels-dir DIR] [--max-seconds S]

Each kernel runs through the Python client's own launch path: its folder is read with
kernelize.manifest.parse_manifest_toml, compiled and loaded with kernelize.launch.compiled (NVRTC
with the verifier's options) and launched with the run_* function of its op, so the grid checks
the code and the launch rule users get. The eager side is the real layer:

    rms_norm/llama          transformers' LlamaRMSNorm
    rms_norm/gemma          transformers' GemmaRMSNorm
    rms_norm/torch          nn.RMSNorm (F.rms_norm)
    fused_add_rms_norm      residual + x (as HF decoder layers add), then LlamaRMSNorm; both the
                            output and the updated residual are compared
    layer_norm              nn.LayerNorm
    fused_add_layer_norm    residual + x (as GPT-2's blocks add), then nn.LayerNorm; both the
                            output and the updated residual are compared
    silu / gelu / gelu_tanh F.silu / F.gelu / F.gelu(approximate="tanh")
    silu_and_mul            F.silu(g) * u

Grid (the full one has 2 + 35 x 18 = 632 shapes per kernel, dtype and distribution):
  rows 1..32, 64, 333, 2048 (where eager's mean order changes: 1, 2-3, 4-7, 8-15, >= 16), and
  4096 rows at widths 4096 and 8192;
  widths: model widths 576 768 896 960 1024 1536 2048 2304 2560 3072 3584 4096 5120 8192 and
  odd widths 127 1000 1001 4099 (cols % 4 != 0: rows that start off a 16-byte boundary);
  distributions: normal N(0,1); scaled 100 N(0,1) (nn.LayerNorm: 1000 + N(0,1)); tiny 1e-3 N(0,1);
  dtypes bf16, f16, f32. Weights 1 + 0.2 N(0,1) (Gemma: 0.2 N(0,1)), bias 0.2 N(0,1), eps 1e-6
  (RMS) and 1e-5 (LayerNorm). Fresh contiguous tensors, seed 1234.
The grid is capped to run in about two minutes on an H200 (32 M elements at most per tensor);
--max-seconds (default 280) stops a slower run early, reports what ran and exits 3.
--quick: rows 1..17, 64 and widths 127, 1001, 2048, 4096, 8192 (a smoke test).

A mismatch is an element whose bits differ from eager's (NaN == NaN). Writes OUT_DIR/
eager_grid.json and OUT_DIR/eager_grid.md (one cell per kernel, dtype and distribution: shapes
with mismatches / shapes, mismatched elements; then every failing shape) and prints the table.
Known-different variants (descriptions starting "KNOWN-DIFFERENT") run only with --variants and
never fail the run. Exit status: 0 when every exact kernel matches eager everywhere, 1 when one
does not, 2 on a setup error (no CUDA, no transformers, a kernel whose op has no eager layer
here), 3 when --max-seconds cut the grid short.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

MODEL_WIDTHS = [576, 768, 896, 960, 1024, 1536, 2048, 2304, 2560, 3072, 3584, 4096, 5120, 8192]
ODD_WIDTHS = [127, 1000, 1001, 4099]
ROWS = list(range(1, 33)) + [64, 333, 2048]
EXTRA_SHAPES = [(4096, 4096), (4096, 8192)]
QUICK_ROWS = list(range(1, 18)) + [64]
QUICK_WIDTHS = [127, 1001, 2048, 4096, 8192]
DISTS = ["normal", "scaled", "tiny"]
DTYPE_NAMES = ["bf16", "f16", "f32"]
RMS_EPS = 1e-6
LN_EPS = 1e-5
SEED = 1234

# (op, semantics) -> the eager layer's name; semantics None: any
EAGER_LAYERS = {
    ("rms_norm", "llama"): "HF LlamaRMSNorm",
    ("rms_norm", "gemma"): "HF GemmaRMSNorm",
    ("rms_norm", "torch"): "nn.RMSNorm",
    ("fused_add_rms_norm", None): "residual add + HF LlamaRMSNorm",
    ("layer_norm", None): "nn.LayerNorm",
    ("fused_add_layer_norm", None): "residual add + nn.LayerNorm",
    ("silu", None): "F.silu",
    ("gelu", None): "F.gelu",
    ("gelu_tanh", None): "F.gelu(tanh)",
    ("silu_and_mul", None): "F.silu(g) * u",
    ("silu_mul", None): "F.silu(g) * u (two tensors)",
    ("gelu_tanh_mul", None): "F.gelu(g, approximate=\"tanh\") * u (two tensors)",
}


def eager_layer_name(op: str, semantics: str | None) -> str | None:
    return EAGER_LAYERS.get((op, semantics)) or EAGER_LAYERS.get((op, None))


def grid_shapes(quick: bool = False) -> list[tuple[int, int]]:
    """(rows, cols) of the grid, widths outermost."""
    if quick:
        return [(r, c) for c in QUICK_WIDTHS for r in QUICK_ROWS]
    shapes = [(r, c) for c in MODEL_WIDTHS + ODD_WIDTHS for r in ROWS]
    return shapes + [s for s in EXTRA_SHAPES if s not in shapes]


def known_different(manifest: dict) -> bool:
    return manifest.get("description", "").lstrip().upper().startswith("KNOWN-DIFFERENT")


# ---- the report ---------------------------------------------------------------------------

def cell_key(c: dict) -> tuple:
    return (c["kernel"], c["dtype"], c["dist"])


def render_markdown(res: dict) -> str:
    """The markdown report of a result dict (what eager_grid.json holds)."""
    m = res["meta"]
    out = [f"# Bundled kernels vs PyTorch eager: the shape grid ({m.get('date', '?')})", ""]
    out.append(f"Device: {m.get('device', '?')}; torch {m.get('torch', '?')} (CUDA {m.get('cuda', '?')}); "
               f"transformers {m.get('transformers', '?')}; commit {m.get('commit', '?')}.")
    out.append(f"Grid: {m.get('grid', '?')}. Run time {m.get('seconds', 0):.0f} s"
               + ("; **INCOMPLETE: --max-seconds cut it short**" if m.get("incomplete") else "") + ".")
    out.append("")
    t = res["totals"]
    verdict = "every exact kernel matches eager in every cell" if t["mismatched_elements"] == 0 and \
        not m.get("incomplete") else f"{t['mismatched_elements']} mismatched elements in " \
        f"{t['mismatched_shapes']} shapes of exact kernels"
    out.append(f"**{t['exact_kernels']} exact kernels, {t['comparisons']} shape comparisons, "
               f"{t['elements']} elements: {verdict}.**")
    out.append("")
    cols = [(dt, d) for dt in DTYPE_NAMES for d in DISTS]
    for title, exact in (("Exact kernels", True), ("Known-different variants (informative)", False)):
        kern = [k for k in res["kernels"] if k["exact"] == exact]
        if not kern:
            continue
        out += [f"## {title}", "",
                "Each cell: shapes with a mismatch / shapes compared; mismatched elements in "
                "parentheses when there are any.", ""]
        out.append("| kernel | eager layer | " + " | ".join(f"{dt} {d}" for dt, d in cols) + " |")
        out.append("| --- | --- | " + " | ".join("---:" for _ in cols) + " |")
        cells = {cell_key(c): c for c in res["cells"]}
        for k in kern:
            row = [f"{k['name']} {k['version']}", k["eager"]]
            for dt, d in cols:
                c = cells.get((k["name"], dt, d))
                if c is None:
                    row.append("—")
                else:
                    s = f"{c['mismatched_shapes']}/{c['shapes']}"
                    if c["mismatched_elements"]:
                        s += f" ({c['mismatched_elements']})"
                    row.append(s)
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    fails = [(c, f) for c in res["cells"] for f in c["failing"]]
    out += ["## Failing shapes", ""]
    if not fails:
        out += ["None.", ""]
    else:
        out.append("| kernel | exact | dtype | dist | shape | mismatched / elements | max ulp |")
        out.append("| --- | --- | --- | --- | --- | ---: | ---: |")
        for c, f in fails:
            out.append(f"| {c['kernel']} | {'yes' if c['exact'] else 'no'} | {c['dtype']} | {c['dist']} | "
                       f"{f['rows']}x{f['cols']} | {f['mismatched']} / {f['elements']} | {f['max_ulp']} |")
        out.append("")
    if res.get("uncovered"):
        out += ["## Not covered", ""] + [f"- {u}" for u in res["uncovered"]] + [""]
    return "\n".join(out)


def summary_line(res: dict) -> str:
    t, m = res["totals"], res["meta"]
    state = "INCOMPLETE" if m.get("incomplete") else ("OK" if t["mismatched_elements"] == 0 else "FAIL")
    return (f"eager grid {state}: {t['exact_kernels']} exact kernels, {t['comparisons']} shape comparisons, "
            f"{t['mismatched_elements']} mismatched elements in {t['mismatched_shapes']} shapes "
            f"({m.get('seconds', 0):.0f} s)")


# ---- the run ------------------------------------------------------------------------------

def new_cells(kernels: list[dict], launchers: dict) -> dict[tuple, dict]:
    cells = {}
    for k in kernels:
        for dt in DTYPE_NAMES:
            if (k["name"], dt) in launchers:
                for dist in DISTS:
                    cells[(k["name"], dt, dist)] = dict(
                        kernel=k["name"], version=k["version"], exact=k["exact"], eager=k["eager"],
                        dtype=dt, dist=dist, shapes=0, elements=0, mismatched_shapes=0,
                        mismatched_elements=0, failing=[])
    return cells


def run_grid(kernels: list[dict], launchers: dict, dev, shapes: list[tuple[int, int]],
             deadline: float = float("inf"), log=print) -> tuple[dict, bool]:
    """Every kernel of `kernels` (dicts with name, version, op, semantics, exact, eager) against
    its eager layer on `shapes` x DISTS x DTYPE_NAMES. launchers[(name, dtype)] runs the kernel
    with its op's run_* signature: rms_norm f(x, w, eps); fused_add_rms_norm f(x, residual, w,
    eps) (residual updated in place); layer_norm f(x, w, b, eps); fused_add_layer_norm f(x,
    residual, w, b, eps); silu/gelu/gelu_tanh f(x);
    silu_and_mul f(g, u). Returns (cells by (kernel, dtype, dist), cut short by the deadline)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    T = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    by_cols: dict[int, list[int]] = {}
    for r, c in shapes:
        by_cols.setdefault(c, []).append(r)
    g = torch.Generator(device=dev).manual_seed(SEED)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32)

    def compare(got, want):
        """(mismatched elements, max ulp) as 0-dim tensors on the device; NaN == NaN."""
        if got.dtype == torch.float32:
            ia, ib, mag = got.view(torch.int32).long(), want.view(torch.int32).long(), 0x7FFFFFFF
        else:
            ia, ib, mag = got.view(torch.int16).int(), want.view(torch.int16).int(), 0x7FFF
        # the bits as sign-magnitude integers -> ordered integers (ulp distance = difference)
        ia = torch.where(ia < 0, -(ia & mag), ia)
        ib = torch.where(ib < 0, -(ib & mag), ib)
        diff = (ia != ib) & ~(torch.isnan(got) & torch.isnan(want))
        ulp = torch.where(diff, (ia - ib).abs(), torch.zeros_like(ia))
        return diff.sum(), ulp.max().long()

    def fused_add(run, x, residual, norm, *params):
        """A fused add against eager: residual := residual + x (as HF decoder layers and GPT-2's
        blocks add), out = norm(residual); both the output and the updated residual compared.
        Returns (mismatched elements, max ulp, elements compared)."""
        s = residual + x
        res = residual.clone()
        c1, u1 = compare(run(x, res, *params), norm(s))
        c2, u2 = compare(res, s)
        return c1 + c2, torch.maximum(u1, u2), 2 * x.numel()

    cells = new_cells(kernels, launchers)
    pending: dict[tuple, list] = {key: [] for key in cells}

    def flush():  # one device sync per call
        for key, lst in pending.items():
            if not lst:
                continue
            cnts = torch.stack([x[2] for x in lst]).cpu().tolist()
            ulps = torch.stack([x[3] for x in lst]).cpu().tolist()
            c = cells[key]
            for (rows, cols, _, _, n), cnt, u in zip(lst, cnts, ulps):
                c["shapes"] += 1
                c["elements"] += n
                if cnt:
                    c["mismatched_shapes"] += 1
                    c["mismatched_elements"] += int(cnt)
                    c["failing"].append(dict(rows=rows, cols=cols, mismatched=int(cnt), elements=n,
                                             max_ulp=int(u)))
            lst.clear()

    scale = {"normal": 1.0, "scaled": 100.0, "tiny": 1e-3}
    with torch.inference_mode():
        for dt in DTYPE_NAMES:
            TT = T[dt]
            for dist in DISTS:
                t0 = time.time()
                for cols, rows_list in by_cols.items():
                    if time.time() > deadline:
                        flush()
                        return cells, True
                    w = (1.0 + 0.2 * randn(cols)).to(TT)
                    wg = (0.2 * randn(cols)).to(TT)
                    bias = (0.2 * randn(cols)).to(TT)
                    llama = LlamaRMSNorm(cols, eps=RMS_EPS).to(dev, TT)
                    llama.weight.copy_(w)
                    gemma = GemmaRMSNorm(cols, eps=RMS_EPS).to(dev, TT)
                    gemma.weight.copy_(wg)
                    rmsn = nn.RMSNorm(cols, eps=RMS_EPS, device=dev, dtype=TT)
                    rmsn.weight.copy_(w)
                    ln = nn.LayerNorm(cols, eps=LN_EPS, device=dev, dtype=TT)
                    ln.weight.copy_(w)
                    ln.bias.copy_(bias)
                    for rows in rows_list:
                        z, z2 = randn(rows, cols), randn(rows, cols)
                        x = (z * scale[dist]).to(TT)  # fresh, contiguous, aligned
                        x2 = (z2 * scale[dist]).to(TT)
                        x_ln = (z + 1000.0).to(TT) if dist == "scaled" else x
                        n = rows * cols
                        for k in kernels:
                            run = launchers.get((k["name"], dt))
                            if run is None:
                                continue
                            op, sem = k["op"], k["semantics"]
                            ne = n
                            if op == "rms_norm":
                                mod, wk = {"llama": (llama, w), "gemma": (gemma, wg), "torch": (rmsn, w)}[sem]
                                cnt, ulp = compare(run(x, wk, RMS_EPS), mod(x))
                            elif op == "fused_add_rms_norm":
                                cnt, ulp, ne = fused_add(run, x, x2, llama, w, RMS_EPS)
                            elif op == "layer_norm":
                                cnt, ulp = compare(run(x_ln, w, bias, LN_EPS), ln(x_ln))
                            elif op == "fused_add_layer_norm":
                                cnt, ulp, ne = fused_add(run, x, x2 + 1000.0 if dist == "scaled" else x2,
                                                         ln, w, bias, LN_EPS)
                            elif op in ("silu", "gelu", "gelu_tanh"):
                                want = (F.silu(x) if op == "silu" else
                                        F.gelu(x) if op == "gelu" else F.gelu(x, approximate="tanh"))
                                cnt, ulp = compare(run(x), want)
                            elif op in ("silu_and_mul", "silu_mul"):
                                cnt, ulp = compare(run(x, x2), F.silu(x) * x2)
                            elif op == "gelu_tanh_mul":
                                cnt, ulp = compare(run(x, x2), F.gelu(x, approximate="tanh") * x2)
                            else:
                                raise ValueError(f"{k['name']}: op {op} has no eager layer here")
                            pending[(k["name"], dt, dist)].append((rows, cols, cnt, ulp, ne))
                flush()
                log(f"  {dt} {dist}: {time.time() - t0:.1f} s")
    return cells, False


def make_result(kernels: list[dict], cells: dict, meta: dict, uncovered: list[str]) -> dict:
    cl = list(cells.values())
    ex = [c for c in cl if c["exact"]]
    return dict(
        meta=meta,
        kernels=[{k2: v for k2, v in k.items() if k2 not in ("manifest", "source")} for k in kernels],
        cells=cl,
        totals=dict(
            exact_kernels=sum(1 for k in kernels if k["exact"]),
            comparisons=sum(c["shapes"] for c in ex),
            elements=sum(c["elements"] for c in ex),
            mismatched_shapes=sum(c["mismatched_shapes"] for c in ex),
            mismatched_elements=sum(c["mismatched_elements"] for c in ex),
        ),
        uncovered=uncovered,
    )


def load_kernels(kernels_dir: str, only: set[str], variants: bool) -> tuple[list[dict], list[str]]:
    """The kernel folders to run (exact ones, and the known-different ones with `variants`),
    and a line per kernel whose op has no eager layer here."""
    from kernelize.digest import digest_of
    from kernelize.manifest import BACKWARD_OPS, parse_manifest_toml
    kernels, uncovered = [], []
    for name in sorted(os.listdir(kernels_dir)):
        d = os.path.join(kernels_dir, name)
        if not os.path.isfile(os.path.join(d, "kernel.toml")) or (only and name not in only):
            continue
        with open(os.path.join(d, "kernel.toml"), encoding="utf-8") as f:
            man = parse_manifest_toml(f.read())
        with open(os.path.join(d, man["source"]), encoding="utf-8") as f:
            src = f.read()
        if man["op"] in BACKWARD_OPS:
            continue   # against eager autograd by scripts/backward_probe.py, not this forward grid
        exact = not known_different(man)
        if not exact and not variants:
            continue
        layer = eager_layer_name(man["op"], man.get("semantics"))
        if layer is None:
            uncovered.append(f"{man['name']} {man['version']}: op {man['op']} has no eager layer in "
                             "scripts/eager_grid.py (add it to EAGER_LAYERS and run_grid)")
            continue
        kernels.append(dict(name=man["name"], version=man["version"], op=man["op"],
                            semantics=man.get("semantics"), exact=exact, eager=layer,
                            digest=digest_of(man, src), manifest=man, source=src))
    return kernels, uncovered


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--quick", action="store_true", help="a small grid (smoke test)")
    ap.add_argument("--only", default="", help="comma list of kernel names")
    ap.add_argument("--variants", action="store_true", help="also the known-different variants")
    ap.add_argument("--kernels-dir", default=os.path.join(ROOT, "kernels"))
    ap.add_argument("--max-seconds", type=float, default=280.0)
    a = ap.parse_args(argv)
    t_start = time.time()
    os.makedirs(a.out_dir, exist_ok=True)

    import torch
    if not torch.cuda.is_available():
        print("eager_grid: no CUDA device", file=sys.stderr)
        return 2
    try:
        import transformers
        from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except ImportError as e:
        print(f"eager_grid: transformers is needed for the real HF norms ({e})", file=sys.stderr)
        return 2
    from functools import partial

    from kernelize.launch import RUNNERS, compiled

    dev = torch.device("cuda", torch.cuda.current_device())
    kernels, uncovered = load_kernels(a.kernels_dir, {s for s in a.only.split(",") if s}, a.variants)
    if uncovered:
        for u in uncovered:
            print(f"eager_grid: {u}", file=sys.stderr)
        print("eager_grid: every bundled exact kernel must be covered", file=sys.stderr)
        return 2

    # every (kernel, dtype) compiled and loaded first (NVRTC in threads), as the client does
    def build(job):
        k, dt = job
        return k, dt, compiled(k["digest"], k["manifest"], k["source"], dt, dev)

    jobs = [(k, dt) for k in kernels for dt in DTYPE_NAMES if dt in k["manifest"]["entries"]]
    launchers = {}
    with ThreadPoolExecutor(max(1, min(16, os.cpu_count() or 2))) as ex:
        for k, dt, c in ex.map(build, jobs):
            launchers[(k["name"], dt)] = partial(RUNNERS[k["op"]], c)
    t_compiled = time.time()
    print(f"compiled {len(launchers)} modules in {t_compiled - t_start:.1f} s", flush=True)

    shapes = grid_shapes(a.quick)
    cells, incomplete = run_grid(kernels, launchers, dev, shapes, deadline=t_start + a.max_seconds,
                                 log=lambda s: print(s, flush=True))
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        device=torch.cuda.get_device_name(dev), torch=torch.__version__, cuda=str(torch.version.cuda),
        transformers=transformers.__version__, commit=_commit(),
        grid=("quick: rows 1..17, 64 x widths " + " ".join(map(str, QUICK_WIDTHS)) if a.quick else
              f"rows 1..32, {', '.join(map(str, ROWS[32:]))} x widths "
              f"{' '.join(map(str, MODEL_WIDTHS + ODD_WIDTHS))}, plus "
              f"{', '.join(f'{r}x{c}' for r, c in EXTRA_SHAPES)}; dists {', '.join(DISTS)}; "
              f"dtypes {', '.join(DTYPE_NAMES)}"),
        shapes_per_cell=len(shapes), seed=SEED, compile_seconds=round(t_compiled - t_start, 1),
        seconds=round(time.time() - t_start, 1), incomplete=incomplete,
        eager_forward={"HF LlamaRMSNorm": f"{LlamaRMSNorm.__module__}.{LlamaRMSNorm.forward.__qualname__}",
                       "HF GemmaRMSNorm": f"{GemmaRMSNorm.__module__}.{GemmaRMSNorm.forward.__qualname__}"},
    )
    res = make_result(kernels, cells, meta, uncovered)
    with open(os.path.join(a.out_dir, "eager_grid.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = render_markdown(res)
    with open(os.path.join(a.out_dir, "eager_grid.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    print(summary_line(res))
    if incomplete:
        return 3
    return 1 if res["totals"]["mismatched_elements"] else 0


def _commit() -> str:
    for p in (os.path.join(ROOT, "COMMIT"),):
        if os.path.isfile(p):
            return open(p).read().strip()[:12]
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
