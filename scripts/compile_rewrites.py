#!/usr/bin/env python3
"""Write docs/compile-rewrites.json, the table of torch.compile's rewrites that the dashboard's
field page and docs/compile.md show: per layer, model or math-library function, what plain
inductor does to eager's bits and what kernelize's exact compile does, with the evidence (the
records of H100 runs).

    python3 scripts/compile_rewrites.py [RUN_DIR] [--out FILE]   (default: docs/gpu-runs/2026-11-26-s8)

A Python test writes it again into a temporary file and compares, so the committed table is
always the one its records give.
"""
from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_ARGS = [a for a in sys.argv[1:]]
OUT = Path(_ARGS.pop(_ARGS.index("--out") + 1)) if "--out" in _ARGS else ROOT / "docs" / "compile-rewrites.json"
_ARGS = [a for a in _ARGS if a != "--out"]
RUN = Path(_ARGS[0]) if _ARGS else ROOT / "docs" / "gpu-runs" / "2026-11-26-s8"
ENV = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "transformers": "5.17.0",
       "date": "2026-11-26 (layers, models), 2026-11-28 (the two blocks; math functions, one row on an H200)"}
# The math-library functions, proven on every input (bench/math_proofs.py), run by run: a later
# record of a function and dtype replaces an earlier one. Session 20 (H100): every function, then
# the `x * x * x` rewrite of pow(x, 3.0); session 21: the sigmoid, silu and gelu rewrites (H100),
# then gelu's tanh form (an H200: no H100 was lent for that call).
PROOF_RUNS = (("2026-11-28-s20", "run1-math-proofs.json"), ("2026-11-28-s20", "run2-math-proofs-pow3.json"),
              ("2026-11-28-s21", "run1-proofs-proofs.json"), ("2026-11-28-s21", "run4-proofs-proofs.json"))
DTYPE_NAMES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}

# "what Inductor rewrites": what the divergence locator named on the GPU (run2-locate-*.json,
# run5/run6 probes), or "not located" where it was not run.
LAYERS = [  # (what, rewrite, plain candidate, exact candidate)
    ("transformers LlamaRMSNorm", "the mean() reduction (located in a Llama's model.norm)",
     "compile_llama_rms_norm", "exact_compile_llama_rms_norm"),
    ("transformers GemmaRMSNorm", "not located", "compile_gemma_rms_norm",
     "exact_compile_gemma_rms_norm"),
    ("nn.LayerNorm", "native_layer_norm's decomposition/lowering (located; PR 177163)",
     "compile_layer_norm", "exact_compile_layer_norm"),
    ("silu(gate) * up (the gated MLP)", "not located",
     "compile_silu_mul", "exact_compile_silu_mul"),
]
MODELS = [  # (model key in the rows, what, rewrite)
    ("seed:attention", "matmul -> div -> softmax -> dropout -> matmul (pytorch#179578)",
     "the softmax (located; bf16: its division, f32: its lowering)"),
    ("seed:einsum_mha", "einsum projections with a bias add (pytorch#179575)",
     "the softmax's lowering (located)"),
    ("seed:linear_layer_norm", "Linear -> LayerNorm(1024) -> Linear (PR 177163)",
     "native_layer_norm's decomposition/lowering (located)"),
    ("arch:llama", "Llama architecture (prefill and decode logits)",
     "the RMSNorm mean (located); in f32 also attention's backend picked while tracing (probe)"),
    ("arch:qwen2", "Qwen2 architecture", "not located"),
    ("arch:mistral", "Mistral architecture", "not located"),
    ("arch:gemma", "Gemma architecture", "not located"),
    ("arch:gpt2", "GPT-2 architecture", "not located"),
]


# The two blocks of the exact phase (bench/exact_compile.py, since session 20), from session 21's
# run (H100, plain compile and kernelize(compile=True) in one job per dtype), with the rewrite the
# divergence locator named under plain compile (session 34, H200, every dtype).
BLOCKS_RUN = ROOT / "docs" / "gpu-runs" / "2026-11-28-s21"
BLOCKS = [  # (model key in the rows, what, rewrite)
    ("block:rotary", "rotary embedding (the rotary tables and q * cos + rotate_half(q) * sin)",
     "a dropped intermediate rounding (located: the product, aten.mul, in bf16/f16; the sum, "
     "aten.add, in f32; docs/gpu-runs/2026-11-29-s34 run 5)"),
    ("block:sdpa_attention", "attention through F.scaled_dot_product_attention",
     "none at this shape (the locator: identical; exact compile still runs SDPA as eager picks "
     "its backend, kernelize::eager_sdpa)"),
]


def block_rows() -> list[dict]:
    """One row per block and dtype: plain compile and kernelize(compile=True) against eager."""
    recs = {}
    for dt in ("bf16", "f16", "f32"):
        doc = json.loads(lzma.open(BLOCKS_RUN / f"run2-exact-{dt}-exact.json.xz").read())
        for r in doc["rows"]:
            recs[(r["model"], r["dtype"], r["candidate"])] = r
    return compared_rows(BLOCKS, recs, recs, "outputs bit for bit against eager (bench/exact_compile.py)",
                         f"docs/gpu-runs/{BLOCKS_RUN.name}/")


def compared_rows(table: list, plain: dict, final: dict, measured: str, evidence: str) -> list[dict]:
    """One row per (model key, what, rewrite) of `table` and dtype: plain compile's record in
    `plain` and kernelize(compile=True)'s in `final`, each against eager."""
    return [dict(subject=what, rewrite=rewrite, dtypes=dt, measured=measured,
                 inductor=bits(plain.get((key, dt, "compile"))),
                 exact=bits(final.get((key, dt, "kernelize+exact"))), evidence=evidence)
            for key, what, rewrite in table for dt in ("bf16", "f16", "f32")]


def verdict(path: Path) -> str:
    v = json.loads(path.read_text())["summary"]["per_dtype"]["bf16"]
    frac = v.get("max_mismatch_fraction") or 0
    return v["class"] + (f", up to {100 * frac:.2g}% of a case's elements" if frac else "")


def rows_of(pattern: str) -> dict:
    out = {}
    for f in sorted(RUN.glob(pattern)):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            out[(r["model"], r["dtype"], r["candidate"])] = r
    return out


def bits(r: dict | None) -> str:
    if r is None:
        return "not measured"
    if "error" in r:
        return "did not run"
    n = r.get("mismatched", r.get("prefill_mismatched", 0) + r.get("decode_mismatched", 0))
    total = r["numel"]
    mx = r.get("max_abs_diff", max(r.get("prefill_max_abs", 0), r.get("decode_max_abs", 0)))
    return "bit-identical" if n == 0 else f"{n} of {total} output elements differ (max {mx:.2g})"


def proof_rows() -> list[dict]:
    """One row per math-library function and dtype: inductor's own code against eager's kernel on
    every input, each rewrite exact compile tried, and what exact compile runs (inductor's code
    or a rewrite where proven, else eager's kernel)."""
    recs: dict = {}
    for run, name in PROOF_RUNS:
        doc = json.loads((ROOT / "docs" / "gpu-runs" / run / name).read_text())
        for r in doc["rows"]:
            recs[(r["name"], r["dtype"])] = (run, doc["env"]["device"], r)
    out = []
    for (name, dtype), (run, device, r) in recs.items():
        lowering = r.get("lowering", "inductor" if r["equal"] else None)
        # records before the rewrites have no `tried`: inductor's own code was the one tried
        tried = r.get("tried") or [dict(lowering="inductor", inputs=r["inputs"],
                                        first_difference=r["first_difference"])]
        own = next((t for t in tried if t["lowering"] == "inductor"), None)
        if r.get("error"):
            inductor = f"no proof made ({r['error'][:80]})"
        elif own is None:
            inductor = "not compared: inductor has no code of its own for it (it decomposes it)"
        elif own["first_difference"] is None:
            inductor = f"bit-identical on all {own['inputs']:,} inputs"
        elif dtype != "float32":
            inductor = f"{own['first_difference']['differing_in_chunk']:,} of {own['inputs']:,} inputs differ"
        else:
            inductor = (f"differs ({own['first_difference']['differing_in_chunk']:,} of the first "
                        "16,777,216-input chunk that does)")
        rewrite = ("Triton's code for it" if own is not None or r.get("error") else
                   "inductor's decomposition of it") + "".join(
            f"; exact compile tries {t['lowering']}: "
            + ("eager's bits" if t["first_difference"] is None else "differs")
            for t in tried if t["lowering"] != "inductor")
        exact = {"inductor": "bit-identical (inductor's code, proven)", None: "bit-identical (eager's kernel)"}
        call = r["op"].split(".")[1] + "(" + ", ".join(
            ["x", *map(repr, r["scalars"]), *(f"{k}={v!r}" for k, v in r.get("kwargs", {}).items())]) + ")"
        out.append(dict(subject=f"{call} (math library)", rewrite=rewrite, dtypes=DTYPE_NAMES[dtype],
                        measured=f"every input of the dtype against eager's kernel on an {device} "
                                 "(bench/math_proofs.py)",
                        inductor=inductor,
                        exact=exact.get(lowering, f"bit-identical ({lowering}, proven)"),
                        evidence=f"docs/gpu-runs/{run}/"))
    return out


def main() -> int:
    entries = []
    for what, rewrite, plain, exact in LAYERS:
        entries.append(dict(subject=what, rewrite=rewrite, dtypes="bf16",
                            measured="kernelize verify --quick (31 cases against the eager reference)",
                            inductor=verdict(RUN / "rewrites" / f"{plain}.json"),
                            exact=verdict(RUN / "rewrites" / f"{exact}.json"),
                            evidence=f"docs/gpu-runs/{RUN.name}/rewrites/"))
    plain = {**rows_of("run1-*.rows.jsonl"), **rows_of("run2-exact-f*-part.rows.jsonl"),
             **rows_of("run3-exact-*.rows.jsonl")}
    final = rows_of("run7-*.rows.jsonl")
    entries += compared_rows(MODELS, plain, final, "logits bit for bit against eager (bench/exact_compile.py)",
                             f"docs/gpu-runs/{RUN.name}/")
    entries += block_rows()
    entries += proof_rows()
    out = OUT
    out.write_text(json.dumps({**ENV, "rewrites": entries}, indent=1) + "\n")
    print(f"wrote {out} ({len(entries)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
