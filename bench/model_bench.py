#!/usr/bin/env python3
"""Whole-model speed and exactness: eager vs kernelized vs torch.compile vs both (issue 15).

    python3 bench/model_bench.py OUT_DIR [--archs llama,qwen2,gemma,gpt2] [--quick]

Builds Llama-, Qwen2-, Gemma- and GPT-2-architecture models from transformers configs at about
1B parameters (published configs: TinyLlama-1.1B, Qwen2.5-1.5B, Gemma-2B, GPT-2 large) with
random weights (seeded; speed does not depend on them), in bf16 on the GPU, and measures:

- prefill: one forward at 1x512 and 8x2048 (CUDA events around the call, median of 5 after
  warm-up), and the logits' max abs difference and argmax agreement with eager;
- greedy decode: `generate(max_new_tokens=N, min_new_tokens=N, do_sample=False)` from a
  32-token prompt at batch 1 and 8 with the KV cache: new tokens per second, and whether the
  generated tokens equal eager's.

Four modes on the same weights: eager; kernelized (`kernelize.kernelize` with the bundled
exact kernels of `--kernels` as local folders); torch.compile; kernelized + torch.compile.
Prefill under torch.compile is regional (each decoder block compiled, default mode, the blocks
sharing one compiled graph: the PyTorch recipe for large models, which bounds compile time);
decode under torch.compile is transformers' recipe (static KV cache, `generate` compiling the
forward with CUDA graphs). Compile time is reported separately (first call) and not in any
speed.

Writes OUT_DIR/model_bench.json and prints a markdown table last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

# Exact kernels of the bundle (folder names); `names=` picks among them where several match.
EXACT = ["rms_norm_llama", "rms_norm_gemma", "rms_norm_torch", "fused_add_rms_norm", "layer_norm",
         "fused_add_layer_norm", "silu", "gelu", "gelu_tanh", "silu_mul", "gelu_tanh_mul", "silu_and_mul"]


def config(arch: str):
    import transformers as T
    if arch == "llama":  # TinyLlama-1.1B
        return T.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                             num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                             max_position_embeddings=4096, rms_norm_eps=1e-5)
    if arch == "qwen2":  # Qwen2.5-1.5B
        return T.Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                             num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                             max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True)
    if arch == "gemma":  # Gemma-2B
        return T.GemmaConfig(vocab_size=256000, hidden_size=2048, intermediate_size=16384,
                             num_hidden_layers=18, num_attention_heads=8, num_key_value_heads=1,
                             head_dim=256, hidden_activation="gelu_pytorch_tanh",
                             max_position_embeddings=4096, rms_norm_eps=1e-6)
    if arch == "gpt2":  # GPT-2 large
        return T.GPT2Config(n_embd=1280, n_layer=36, n_head=20, n_positions=4096, vocab_size=50257)
    raise SystemExit(f"unknown arch {arch!r} (llama, qwen2, gemma, gpt2)")


def build(arch: str):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    cfg = config(arch)
    with torch.device("cuda"):
        m = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    m.eval()
    m.generation_config.pad_token_id = 0
    return m


def blocks(model):
    inner = getattr(model, "model", None) or getattr(model, "transformer")
    return list(getattr(inner, "layers", None) or getattr(inner, "h"))


def compile_blocks(model):
    for b in blocks(model):
        b.compile()


def uncompile_blocks(model):
    for b in blocks(model):
        b._compiled_call_impl = None
    model.__dict__.pop("_compiled_call", None)  # generate's own compiled forward (static cache)
    torch._dynamo.reset()


def timed(fn, reps: int) -> tuple[float, object]:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts, out = [], None
    for _ in range(reps):
        torch.cuda.synchronize()
        s.record()
        out = fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts), out


def run_prefill(model, ids_prefill, reps: int) -> dict:
    r = {}
    with torch.no_grad():
        for name, ids in ids_prefill.items():
            t0 = time.perf_counter()
            model(ids, use_cache=False)  # warm-up (compiles on the first call)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            model(ids, use_cache=False)
            ms, out = timed(lambda: model(ids, use_cache=False).logits, reps)
            r[name] = {"ms": ms, "first_call_s": first, "logits": out.float().cpu()}
    return r


def run_decode(model, prompts, new_tokens: int, reps: int, compiled: bool) -> dict:
    # Decode under torch.compile follows transformers' recipe: a static KV cache, with which
    # `generate` compiles the forward itself (CUDA graphs, "reduce-overhead"); eager and
    # kernelized decode use the default dynamic cache, as users run them.
    extra = {"cache_implementation": "static"} if compiled else {}
    r = {}
    with torch.no_grad():
        for bsz, ids in prompts.items():
            gen = lambda: model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                         do_sample=False, **extra)
            t0 = time.perf_counter()
            gen()
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ms, toks = timed(gen, max(1, reps // 2))
            r[bsz] = {"ms": ms, "tokens_per_s": bsz * new_tokens / (ms / 1e3),
                      "first_call_s": first, "tokens": toks[:, ids.shape[1]:].cpu()}
    return r


def interleaved(model, prompts, prefill, new_tokens: int, pairs: int, kernelize_fn) -> dict:
    """Eager and kernelized timed alternately on the same model (unkernelize / kernelize
    between them), `pairs` times per shape: the ratio kernelized / eager of each pair, so that a
    machine that drifts during the run (other tenants, clocks) moves both sides of a ratio
    alike. Returns per shape the eager and kernelized medians and the median of the ratios
    (speed: > 1 means kernelized is faster)."""
    import kernelize
    out = {}
    with torch.no_grad():
        shapes = [(f"prefill {k}", lambda ids=ids: model(ids, use_cache=False).logits) for k, ids in prefill.items()]
        shapes += [(f"decode b{b}", lambda ids=ids: model.generate(ids, max_new_tokens=new_tokens,
                                                                     min_new_tokens=new_tokens, do_sample=False))
                   for b, ids in prompts.items()]
        for name, fn in shapes:
            t_e, t_k = [], []
            for _ in range(pairs):
                kernelize.unkernelize(model)
                fn()
                t_e.append(timed(fn, 1)[0])
                kernelize_fn()
                fn()
                t_k.append(timed(fn, 1)[0])
            ratios = sorted(e / k for e, k in zip(t_e, t_k))
            out[name] = {"eager_ms": statistics.median(t_e), "kernelized_ms": statistics.median(t_k),
                         "speedup_median": statistics.median(ratios), "speedup_min": ratios[0],
                         "speedup_max": ratios[-1], "pairs": pairs}
    kernelize.unkernelize(model)
    return out


def compare(ref: dict, got: dict) -> dict:
    c = {"prefill": {}, "decode": {}}
    for k, v in got["prefill"].items():
        a, b = ref["prefill"][k]["logits"], v["logits"]
        c["prefill"][k] = {"max_logit_diff": float((a - b).abs().max()),
                           "argmax_match": float((a.argmax(-1) == b.argmax(-1)).float().mean())}
    for k, v in got["decode"].items():
        c["decode"][k] = {"tokens_identical": bool(torch.equal(ref["decode"][k]["tokens"], v["tokens"]))}
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--archs", default="llama,qwen2,gemma,gpt2")
    ap.add_argument("--modes", default="eager,kernelized,compile,kernelized+compile")
    ap.add_argument("--kernels", default=str(ROOT / "kernels"))
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="1x512 and 1x... only, 16 new tokens, 2 reps")
    ap.add_argument("--pairs", type=int, default=5,
                    help="after the modes: eager and kernelized timed alternately this many times per "
                         "shape, the ratio taken per pair (0: skip)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("model_bench.py: no CUDA device: nothing measured", file=sys.stderr)
        return 2
    import kernelize
    import transformers
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.quick:
        a.new_tokens, a.reps = 16, 2
    kernels = Path(a.kernels)
    names = [n for n in EXACT if (kernels / n / "kernel.toml").exists()]
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "kernels": names, "new_tokens": a.new_tokens, "reps": a.reps, "command": " ".join(sys.argv)}
    modes = a.modes.split(",")
    table = []
    for arch in a.archs.split(","):
        t_arch = time.perf_counter()
        try:
            model = build(arch)
        except Exception as e:  # noqa: BLE001
            table.append({"arch": arch, "error": f"build: {e}"})
            continue
        params = sum(p.numel() for p in model.parameters())
        g = torch.Generator(device="cuda").manual_seed(1)
        vocab = model.config.vocab_size
        prefill = {"1x512": torch.randint(0, vocab, (1, 512), device="cuda", generator=g)}
        if not a.quick:
            prefill["8x2048"] = torch.randint(0, vocab, (8, 2048), device="cuda", generator=g)
        prompts = {b: torch.randint(0, vocab, (b, 32), device="cuda", generator=g) for b in (1, 8)}
        res: dict = {}
        swapped = None
        for mode in modes:
            try:
                if "kernelized" in mode and swapped is None:
                    rep = kernelize.kernelize(model, kernels_dir=str(kernels), names=names, verbose=False)
                    swapped = {k: 0 for k in kernelize.launch_counts(model)}
                    res["kernelize_report"] = str(rep)
                if "kernelized" not in mode and swapped is not None:
                    kernelize.unkernelize(model)
                    swapped = None
                compiled = "compile" in mode
                if compiled:
                    compile_blocks(model)
                res[mode] = {"prefill": run_prefill(model, prefill, a.reps)}
                if compiled:
                    uncompile_blocks(model)  # decode: generate compiles the whole forward
                res[mode]["decode"] = run_decode(model, prompts, a.new_tokens, a.reps, compiled)
                if "kernelized" in mode and "compile" not in mode:
                    res[mode]["launch_counts"] = kernelize.launch_counts(model)
            except Exception as e:  # noqa: BLE001
                res[mode] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
            finally:
                if "compile" in mode:
                    uncompile_blocks(model)
            print(f"{arch} {mode}: " + ("ERROR " + res[mode]["error"] if "error" in res[mode] else
                  " ".join(f"{k} {v['ms']:.2f} ms" for k, v in res[mode]["prefill"].items()) + " | " +
                  " ".join(f"b{k} {v['tokens_per_s']:.0f} tok/s" for k, v in res[mode]["decode"].items())),
                  flush=True)
        if a.pairs and "eager" in modes and "kernelized" in modes:
            try:
                def swap():
                    kernelize.kernelize(model, kernels_dir=str(kernels), names=names, verbose=False)
                if swapped is not None:
                    kernelize.unkernelize(model)
                    swapped = None
                res["interleaved"] = interleaved(model, prompts, prefill, a.new_tokens, a.pairs, swap)
                print(f"{arch} interleaved kernelized/eager speedup: " + ", ".join(
                    f"{k} {v['speedup_median']:.2f}x ({v['speedup_min']:.2f}-{v['speedup_max']:.2f})"
                    for k, v in res["interleaved"].items()), flush=True)
            except Exception as e:  # noqa: BLE001
                res["interleaved"] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        row = {"arch": arch, "params": params, "modes": {}}
        for mode in modes:
            m = res.get(mode, {})
            if "error" in m:
                row["modes"][mode] = {"error": m["error"], "trace": m.get("trace")}
                continue
            entry = {"prefill_ms": {k: v["ms"] for k, v in m["prefill"].items()},
                     "first_call_s": {k: v["first_call_s"] for k, v in {**m["prefill"], **{f"decode_b{b}": d for b, d in m["decode"].items()}}.items()},
                     "decode_tokens_per_s": {f"b{k}": v["tokens_per_s"] for k, v in m["decode"].items()}}
            if "eager" in res and "error" not in res["eager"] and mode != "eager":
                entry["vs_eager"] = compare(res["eager"], m)
            if "launch_counts" in m:
                entry["launch_counts"] = m["launch_counts"]
            row["modes"][mode] = entry
        row["interleaved"] = res.get("interleaved")
        row["kernelize_report"] = res.get("kernelize_report")
        row["seconds"] = time.perf_counter() - t_arch
        table.append(row)
        del model, res
        torch.cuda.empty_cache()
        (out / "model_bench.json").write_text(json.dumps({"meta": meta, "results": table}, indent=1, default=str))
    (out / "model_bench.json").write_text(json.dumps({"meta": meta, "results": table}, indent=1, default=str))
    print()
    print(f"{meta['device']}, torch {meta['torch']}, CUDA {meta['cuda']}, transformers {meta['transformers']}, bf16, {meta['date']}")
    print("| arch | mode | prefill 1x512 ms | prefill 8x2048 ms | decode b1 tok/s | decode b8 tok/s | "
          "max logit diff vs eager (1x512 / 8x2048) | argmax match | decode tokens = eager |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in table:
        if "error" in row:
            print(f"| {row['arch']} | - | {row['error']} | | | | | | |")
            continue
        for mode, e in row["modes"].items():
            if "error" in e:
                print(f"| {row['arch']} | {mode} | ERROR: {e['error'][:80]} | | | | | | |")
                continue
            p, d = e["prefill_ms"], e["decode_tokens_per_s"]
            v = e.get("vs_eager")
            diff = " / ".join(f"{v['prefill'][k]['max_logit_diff']:.3g}" for k in p) if v else "-"
            am = " / ".join(f"{100 * v['prefill'][k]['argmax_match']:.2f}%" for k in p) if v else "-"
            same = " / ".join("yes" if v["decode"][k]["tokens_identical"] else "NO" for k in v["decode"]) if v else "-"
            print(f"| {row['arch']} | {mode} | {p.get('1x512', 0):.2f} | {p.get('8x2048', float('nan')):.2f} | "
                  f"{d.get('b1', 0):.0f} | {d.get('b8', 0):.0f} | {diff} | {am} | {same} |")
    rows = [(r["arch"], r["interleaved"]) for r in table if r.get("interleaved") and "error" not in r["interleaved"]]
    if rows:
        print()
        print("Interleaved (eager and kernelized alternately on one model; median of the per-pair ratios, min-max):")
        print("| arch | shape | eager | kernelized | kernelized speedup |")
        print("| --- | --- | --- | --- | --- |")
        for arch, iv in rows:
            for k, v in iv.items():
                print(f"| {arch} | {k} | {v['eager_ms']:.2f} ms | {v['kernelized_ms']:.2f} ms | "
                      f"{v['speedup_median']:.2f}x ({v['speedup_min']:.2f}-{v['speedup_max']:.2f}, {v['pairs']} pairs) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
