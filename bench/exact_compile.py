#!/usr/bin/env python3
"""Exact compile on the GPU (issue 31): bits against eager, the divergence locator, and speed.

    python3 bench/exact_compile.py OUT_DIR --phase exact|locate|speed [--archs ...] [--dtypes ...]

Phases (each writes OUT_DIR/<phase>.json and prints a markdown table last):

- `exact`: the three seed models (kernelize.seeds) and the five architectures (Llama, Qwen2,
  Mistral, Gemma, GPT-2; small configs, random seeded weights) plus the shipped trained tiny
  models, in bf16, f16 and f32. Candidates: plain `torch.compile` (inductor, default mode),
  `exact_compile` (the exact backend alone), `kernelize(compile=True)` (the bundled exact kernels
  from ./kernels as opaque ops, then the exact backend) and its `"reduce-overhead"` mode.
  Prefill (2 x 64 tokens) and greedy decode (3 steps with the KV cache); every candidate's
  logits compared bit for bit with eager's (elements that differ, max abs diff).
- `locate`: `kernelize.diff` on the seed models and a tiny Llama under plain compile.
- `speed`: about 1B-parameter models, random weights, bf16: eager, kernelize, torch.compile and
  kernelize(compile=True), each in default and reduce-overhead mode; prefill 1x512 and 8x2048
  (CUDA events, median), and one decode step at batch 1 and 8 against a static KV cache of 512
  positions (the same step replayed: CUDA-graph-able, GPU time per token). The candidates share
  one process unless `--isolate` gives each its own: in one process the host-bound rows (decode,
  prefill 1x512) of a candidate compiled after another are slower (session 21).

A candidate's name ending in `-cppw` (`compile-cppw`, `kernelize+exact-cppw`, ...) compiles with
inductor's C++ wrapper (`torch._inductor.config.cpp_wrapper = True`) in place of its Python one
(the exact backend keeps a caller's global inductor settings it does not fix); give it a process
of its own (`--isolate`), as the setting stays for the rest of the process.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from run_env import run_env  # noqa: E402 (bench/ is on the path of a bench script)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import kernelize as K  # noqa: E402
from kernelize import exact as _exact, seeds  # noqa: E402
from kernelize.locate import compare, diff  # noqa: E402

from model_bench import EXACT  # noqa: E402,F401 (the bundle's exact kernels: one list for the benches)

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
DEV = "cuda"
VOCAB_IDS = 1000   # token ids the speed phase draws from
ARCH = None   # the CUDA device's; "sm_90" for a CPU dry run (nothing is swapped there)
torch._dynamo.config.cache_size_limit = 64
if hasattr(torch._dynamo.config, "recompile_limit"):
    torch._dynamo.config.recompile_limit = 64


def arch_config(arch: str, size: str):
    """A transformers config: "large" is model_bench.py's ~1B published configs (Mistral: the
    Llama one with Mistral's classes, 16 layers); "small" a 2-layer, hidden-256 one of each."""
    import transformers as T
    if size != "small" and arch != "mistral":
        from model_bench import config
        return config(arch)
    if size != "small":
        return T.MistralConfig(vocab_size=32000, hidden_size=2048, intermediate_size=7168,
                               num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=8,
                               max_position_embeddings=4096, rms_norm_eps=1e-5, sliding_window=None)
    common = dict(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                  max_position_embeddings=4096)
    if arch == "llama":
        return T.LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5)
    if arch == "qwen2":
        return T.Qwen2Config(**common, num_attention_heads=4, num_key_value_heads=2,
                             rms_norm_eps=1e-6, tie_word_embeddings=True)
    if arch == "mistral":
        return T.MistralConfig(**common, num_attention_heads=4, num_key_value_heads=2,
                               rms_norm_eps=1e-5, sliding_window=None)
    if arch == "gemma":
        return T.GemmaConfig(**common, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                             hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6)
    if arch == "gpt2":
        return T.GPT2Config(n_embd=256, n_layer=2, n_head=4, n_positions=4096, vocab_size=512)
    raise SystemExit(f"unknown arch {arch!r}")


def build_arch(arch: str, size: str, dtype, device="cuda"):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(arch_config(arch, size), dtype=dtype)
    return m.eval()


def shipped(name: str, dtype, device="cuda"):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(ROOT / "models" / name, dtype=dtype).to(device).eval()


# ---- candidates -----------------------------------------------------------------------------

ROWS_FILE: Path | None = None


def emit(row: dict) -> None:
    """Print a row and append it to OUT_DIR/<phase>.rows.jsonl (kept if the run is cut short)."""
    print(row, flush=True)
    if ROWS_FILE is not None:
        with ROWS_FILE.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")


PLAIN = ("compile", "compile-ro", "compile-regional", "compile-regional-ro")


def plain(how: str) -> bool:
    """Whether `how` is plain torch.compile (with either of inductor's wrappers)."""
    return how.removesuffix("-cppw") in PLAIN


def candidate(base, how: str):
    """A copy of `base` made into the candidate `how` (the copy is what runs). transformers'
    generate() is kept from compiling any candidate on its own (each is what it names)."""
    m = copy.deepcopy(base)
    _exact.FUSE_RESIDUAL_NORMS = True
    # -nohoist: each attention call converts its boolean mask itself, as eager (what
    # exact.hoist_sdpa_masks gains or costs; set until the next candidate is made, as -unfused)
    _exact.HOIST_SDPA_MASKS = not how.endswith("-nohoist")
    how = how.removesuffix("-nohoist")
    # -cppw: inductor's C++ wrapper (`torch._inductor.config.cpp_wrapper`) instead of its Python
    # one, for every graph this process compiles from here on (run such a candidate in a process
    # of its own, `--isolate`): the wrapper's host time per launch is what default mode's decode
    # step is bound by
    import torch._inductor.config as inductor_config
    inductor_config.cpp_wrapper = how.endswith("-cppw")
    how = how.removesuffix("-cppw")
    # -noproofs: the math-library functions all eager's kernels, none proven and fused (what the
    # proofs gain; set until the next candidate is made, as -unfused)
    _exact.PROVE_MATH = not how.endswith("-noproofs")
    how = how.removesuffix("-noproofs")
    bundled = dict(kernels_dir=ROOT / "kernels", names=EXACT, verbose=False, arch=ARCH)
    if how == "compile":
        m.compile()
    elif how == "exact":
        K.exact_compile(m)
    elif how in ("kernelize+exact", "kernelize+exact-ro", "kernelize+exact-ro-unfused"):
        # -unfused: without the residual add + norm fusion (what it gains; set until the next
        # candidate is made, which is when this one compiles in the benchmarks here)
        _exact.FUSE_RESIDUAL_NORMS = not how.endswith("-unfused")
        K.kernelize(m, **bundled, compile=True if how == "kernelize+exact" else "reduce-overhead")
    elif how == "kernelize":
        K.kernelize(m, **bundled)
    elif how in ("compile-regional", "compile-regional-ro"):
        # plain inductor, each block compiled on its own (PyTorch's recipe for large models)
        for blk in _exact.blocks(m):
            blk.compile(mode="reduce-overhead" if how.endswith("-ro") else None)
    elif how == "kernelize+exact-regional-ro":
        # kernels, then block by block under CUDA graphs (the reduce-overhead default before
        # session 10)
        K.kernelize(m, **bundled)
        K.exact_compile(m, "reduce-overhead", regional=True)
    elif how in ("kernelize+exact-whole", "kernelize+exact-whole-ro"):
        # kernels, then the whole model as one exact graph (-ro: under CUDA graphs)
        K.kernelize(m, **bundled)
        K.exact_compile(m, "reduce-overhead" if how.endswith("-ro") else None, regional=False)
    elif how == "exact-whole":
        # the whole model as one graph (exact_compile's regional=False)
        K.exact_compile(m, regional=False)
    elif how == "compile-ro":
        m.compile(mode="reduce-overhead")
    else:
        raise ValueError(how)
    if plain(how) and how.endswith("-ro"):
        # the recipe a user of plain compile follows for CUDA graphs: one step per forward
        # (needed block by block; harmless whole) -- exact_compile does this itself
        m.register_forward_pre_hook(lambda *_: torch.compiler.cudagraph_mark_step_begin())
    gc = getattr(m, "generation_config", None)
    if gc is not None and hasattr(gc, "disable_compile"):
        gc.disable_compile = True
    return m


def static_cache(model, batch: int, max_len: int, recipe: bool):
    """transformers' StaticCache; `recipe`: initialised before the first (compiled) call, as
    transformers' CUDA-graph recipe does for plain compile (exact_compile does it itself)."""
    from transformers import StaticCache
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    if recipe:
        _exact.init_static_cache(model, cache, batch)
    return cache


def decode_step(m, batch: int, g: torch.Generator, prefill: int | None = 512):
    """One decode step at position 512 against a static cache of 576 positions, initialised up
    front for every candidate, as a callable (the same step each call: CUDA-graph-able).
    `prefill`: fill the cache with that many prompt tokens first (None: leave it zeros, which
    costs the same per step and compiles no prefill shape)."""
    cache = static_cache(m, batch, 576, recipe=True)
    if prefill:
        ids = torch.randint(0, VOCAB_IDS, (batch, prefill), generator=g).cuda()
        m(ids, past_key_values=cache, use_cache=True,
          cache_position=torch.arange(prefill, device="cuda"))
    tok = torch.randint(0, VOCAB_IDS, (batch, 1), generator=g).cuda()
    pos = torch.tensor([512], device="cuda")
    return lambda: m(tok, past_key_values=cache, use_cache=True, cache_position=pos)


def greedy(m, g: torch.Generator, new: int, prompt: int = 512):
    """Greedy generation at batch 1 as a callable: a `prompt`-token prefill into a static cache
    of 576 positions (initialised up front, transformers' recipe for CUDA graphs; the shapes of
    `decode_step`'s, so nothing new compiles), then `new` decode steps, each fed the argmax of the
    last. Works for every candidate, plain reduce-overhead compile too (generate() keeps each
    step's logits, which its CUDA graphs overwrite)."""
    assert prompt + new <= 576
    cache = static_cache(m, 1, 576, recipe=True)
    ids = torch.randint(0, VOCAB_IDS, (1, prompt), generator=g).cuda()
    pos = torch.arange(prompt, device="cuda")

    def run():
        cache.reset()   # the cache counts what it holds: each run starts empty
        r = m(ids, past_key_values=cache, use_cache=True, cache_position=pos)
        tok = r.logits[:, -1].argmax(-1, keepdim=True)
        for i in range(new):
            r = m(tok, past_key_values=cache, use_cache=True, cache_position=pos[-1:] + 1 + i)
            tok = r.logits[:, -1].argmax(-1, keepdim=True)
        return tok
    return run


def lm_steps(model, ids, steps: int, static: bool = False, recipe: bool = False):
    """Prefill then `steps` greedy decode steps with a fresh KV cache: the prefill's logits and
    each step's. `static`: transformers' StaticCache with explicit cache positions (the recipe
    for CUDA graphs: every decode step has the same shapes)."""
    out = []
    kw: dict = {}
    n = ids.shape[1]
    with torch.no_grad():
        if static:
            kw = dict(past_key_values=static_cache(model, ids.shape[0], n + steps + 1, recipe))
            kw["cache_position"] = torch.arange(n, device=ids.device)
        r = model(ids, use_cache=True, **kw)
        full = r.logits.float().clone()
        cache = r.past_key_values
        tok = r.logits[:, -1].argmax(-1, keepdim=True)
        for i in range(steps):
            if static:
                kw["cache_position"] = torch.tensor([n + i], device=ids.device)
            r = model(tok, past_key_values=cache, use_cache=True,
                      **{k: v for k, v in kw.items() if k != "past_key_values"})
            out.append(r.logits[:, -1].float().clone())
            tok = r.logits[:, -1].argmax(-1, keepdim=True)
    return full, out


def generated(model, ids, new: int):
    """greedy generate() into a static cache (transformers makes it): tokens and every step's
    logits."""
    with torch.no_grad():
        g = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           cache_implementation="static", output_logits=True,
                           return_dict_in_generate=True, pad_token_id=0)
    return g.sequences, torch.stack([x.float() for x in g.logits])


#: The seed models of the reports, then the blocks the rewrite table covers besides them.
SEED_MODELS = [*seeds.SEEDS, *seeds.BLOCKS]


def seed_label(name: str) -> str:
    return f"{'seed' if name in seeds.SEEDS else 'block'}:{name}"


def phase_exact(a) -> list[dict]:
    rows = []
    hows = a.candidates.split(",")
    seed_hows = a.seed_candidates.split(",") if a.seed_candidates else hows
    for dt in a.dtypes.split(","):
        dtype = DTYPES[dt]
        for name in SEED_MODELS if a.seeds else ():
            base, x = seeds.build(name, dtype, DEV)
            with torch.no_grad():
                ref = base(x)
            for how in seed_hows:
                t0 = time.perf_counter()
                try:
                    m = candidate(base, how)
                    with torch.no_grad():
                        m(x)
                        got = m(x)   # second call: CUDA graphs replay
                    d = compare(ref, got)
                    rows.append(dict(model=seed_label(name), dtype=dt, candidate=how, phase="forward",
                                     mismatched=d.mismatched, numel=d.numel,
                                     max_abs_diff=d.max_abs_diff, s=time.perf_counter() - t0))
                except Exception as e:
                    rows.append(dict(model=seed_label(name), dtype=dt, candidate=how, error=repr(e)[:300]))
                    traceback.print_exc()
                emit(rows[-1])
                torch._dynamo.reset()
        models = [(f"arch:{arch}", lambda arch=arch: build_arch(arch, "small", dtype, DEV))
                  for arch in a.archs.split(",") if arch]
        models += [(f"shipped:{n}", lambda n=n: shipped(n, dtype, DEV)) for n in ("tiny-llama", "tiny-gpt2")
                   if a.shipped and (ROOT / "models" / n / "model.safetensors").is_file()]
        for label, make in models:
            base = make()
            g = torch.Generator().manual_seed(7)
            idss = {b: torch.randint(0, min(256, base.config.vocab_size), (b, 64), generator=g).to(DEV)
                    for b in a.batches}
            refs: dict = {}
            gen_refs: dict = {}
            for how in hows:
                static = how.removesuffix("-cppw").endswith("-ro")
                m = None
                # one compiled candidate for every batch, in this order, as a user's process runs
                # them (a new batch recompiles, or runs a graph dynamic in the batch)
                for b, ids in idss.items():
                    name = label if a.batches == [2] else f"{label} b{b}"
                    if (b, static) not in refs:
                        refs[(b, static)] = lm_steps(base, ids, a.decode_steps, static=static)
                    ref_full, ref_steps = refs[(b, static)]
                    t0 = time.perf_counter()
                    try:
                        if m is None:
                            m = candidate(base, how)
                        full, steps = lm_steps(m, ids, a.decode_steps, static=static,
                                               recipe=plain(how))
                        dp = compare(ref_full, full)
                        dd = compare(torch.stack(ref_steps), torch.stack(steps))
                        rows.append(dict(model=name, dtype=dt, candidate=how, batch=b,
                                         prefill_mismatched=dp.mismatched, prefill_max_abs=dp.max_abs_diff,
                                         decode_mismatched=dd.mismatched, decode_max_abs=dd.max_abs_diff,
                                         numel=dp.numel + dd.numel, s=time.perf_counter() - t0))
                        if a.generate and not plain(how):
                            # as a user decodes: generate() into the static cache it makes itself
                            if b not in gen_refs:
                                base.generation_config.disable_compile = True
                                gen_refs[b] = generated(base, ids, a.generate)
                            seq, logits = generated(m, ids, a.generate)
                            dg = compare(gen_refs[b][1], logits)
                            rows[-1].update(generate_tokens_same=bool(torch.equal(seq, gen_refs[b][0])),
                                            generate_mismatched=dg.mismatched,
                                            generate_max_abs=dg.max_abs_diff, generate_numel=dg.numel)
                    except Exception as e:
                        rows.append(dict(model=name, dtype=dt, candidate=how, batch=b, error=repr(e)[:300]))
                        traceback.print_exc()
                    from torch._dynamo.utils import counters
                    rows[-1]["cudagraph_skips"] = counters["inductor"].get("cudagraph_skips", 0)
                    counters.clear()
                    emit(rows[-1])
                del m
                torch._dynamo.reset()
    return rows


def phase_locate(a) -> list[dict]:
    rows = []
    cand = a.candidates
    for dt in a.dtypes.split(","):
        for name in (SEED_MODELS if a.seeds else ()):
            m, x = seeds.build(name, DTYPES[dt], DEV)
            t0 = time.perf_counter()
            r = diff(m, x, cand)
            print(f"== seed {name} {dt}\n{r}", flush=True)
            rows.append(dict(model=seed_label(name), dtype=dt, s=time.perf_counter() - t0, **r.to_json()))
            torch._dynamo.reset()
        for arch in a.archs.split(","):
            m = build_arch(arch, "small", DTYPES[dt], DEV)
            ids = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(3)).to(DEV)
            t0 = time.perf_counter()
            r = diff(m, ids, cand, kwargs={"use_cache": False})
            print(f"== arch {arch} {dt} {cand}\n{r}", flush=True)
            rows.append(dict(model=f"arch:{arch}", dtype=dt, s=time.perf_counter() - t0, **r.to_json()))
            torch._dynamo.reset()
    return rows


def timed_steps(fn, reps: int) -> list[tuple[float, float]]:
    """(wall, host issue) of each of `reps` calls, ms, in call order: the wall from CUDA events
    around the call, its end waited for; the issue time the host's until the call returns (the GPU
    idle at its start), so a call whose issue time is its wall is bound by the host."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        s.record()
        t0 = time.perf_counter()
        fn()
        issue = (time.perf_counter() - t0) * 1e3
        e.record()
        e.synchronize()
        ts.append((s.elapsed_time(e), issue))
    return ts


def timed_all_ms(fn, reps: int) -> list[float]:
    """Each of `reps` calls' time (CUDA events around the call, ms), sorted."""
    return sorted(w for w, _ in timed_steps(fn, reps))


def timed_ms(fn, reps: int) -> float:
    return statistics.median(timed_all_ms(fn, reps))


def spread(ts: list[float]) -> list[float]:
    """min, first quartile, third quartile, max of sorted times (a cell's spread, so that one
    process's outlier can be told from a slower candidate)."""
    q = len(ts) // 4
    return [round(ts[0], 4), round(ts[q], 4), round(ts[-1 - q], 4), round(ts[-1], 4)]


def dynamo_counts() -> dict:
    """What dynamo has done so far in this process (cumulative): graphs compiled, frames it gave
    up on, graph breaks by reason, and recompilations; a candidate whose step runs partly eagerly
    (a graph break, or a frame past `recompile_limit`) shows it here."""
    from torch._dynamo.utils import counters
    return dict(stats=dict(counters["stats"]), frames=dict(counters["frames"]),
                graph_breaks=dict(counters["graph_break"]),
                recompiles=dict(counters.get("recompiles", {})))


def phase_speed(a) -> list[dict]:
    rows = []
    hows = a.candidates.split(",")
    for arch in a.archs.split(","):
        base = build_arch(arch, "large", torch.bfloat16)
        g = torch.Generator().manual_seed(5)
        for how in hows:
            row = dict(arch=arch, candidate=how)
            m = None
            try:
                m = base if how == "eager" else candidate(base, how)
                if how == "eager":
                    m.generation_config.disable_compile = True
                with torch.no_grad():
                    for b, s in a.prefill_shapes:
                        ids = torch.randint(0, VOCAB_IDS, (b, s), generator=g).cuda()
                        t0 = time.perf_counter()
                        for _ in range(3):   # CUDA graphs: warm-up, record, replay
                            m(ids, use_cache=False)
                        torch.cuda.synchronize()
                        row[f"prefill_{b}x{s}_first_s"] = time.perf_counter() - t0
                        ts = timed_all_ms(lambda: m(ids, use_cache=False), a.reps)
                        row[f"prefill_{b}x{s}_ms"] = statistics.median(ts)
                        row[f"prefill_{b}x{s}_spread"] = spread(ts)
                        row[f"prefill_{b}x{s}_dynamo"] = dynamo_counts()
                    for b in a.decode_batches:
                        step = decode_step(m, b, g, prefill=None if a.decode_empty_cache else 512)
                        t0 = time.perf_counter()
                        for _ in range(3):
                            step()
                        torch.cuda.synchronize()
                        row[f"decode_b{b}_first_s"] = time.perf_counter() - t0
                        ts = timed_all_ms(step, a.reps * 4)
                        row[f"decode_b{b}_ms"] = statistics.median(ts)
                        row[f"decode_b{b}_spread"] = spread(ts)
                        row[f"decode_b{b}_dynamo"] = dynamo_counts()
                    if a.greedy:
                        # tokens/s of greedy generation, every candidate the same loop: a
                        # 512-token prompt, `greedy` new tokens (median of 3 after a warm-up)
                        run = greedy(m, g, a.greedy)
                        for _ in range(2):   # compiles, records
                            run()
                        row["greedy_b1_tok_s"] = a.greedy / (timed_ms(run, 3) / 1e3)
                    if a.generate:
                        # tokens/s of transformers' generate(): a 512-token prompt, `generate` new
                        # tokens (plain reduce-overhead compile cannot: it keeps each step's logits)
                        ids = torch.randint(0, VOCAB_IDS, (1, 512), generator=g).cuda()
                        generated(m, ids, a.generate)   # warm-up (compiles, records)
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        generated(m, ids, a.generate)
                        torch.cuda.synchronize()
                        row["generate_b1_tok_s"] = a.generate / (time.perf_counter() - t0)
            except Exception as e:
                row["error"] = repr(e)[:300]
                traceback.print_exc()
            from torch._dynamo.utils import counters
            # graphs inductor compiled but left out of CUDA graphs (and why, in the log)
            row["cudagraph_skips"] = counters["inductor"].get("cudagraph_skips", 0)
            counters.clear()
            emit(row)
            rows.append(row)
            del m
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    return rows


def phase_speed_isolated(a, argv: list[str]) -> list[dict]:
    """`--isolate`: each candidate of the speed phase in a process of its own, one after the
    other, with the same arguments (in one process the candidate compiled second measured slower
    host-bound rows: session 21 run 4, Llama decode at batch 1, 2.27 ms first against 2.71 ms
    second for kernelize, 2.24 against 2.44 ms for plain compile). Each process writes its rows
    under OUT_DIR/<i>-<candidate>/ (OUT_DIR/r<round>/<i>-<candidate>/ with `--rounds`); the rows
    come back here, in the candidates' order (with `--rounds`, combined: `combine_rounds`)."""
    hows = a.candidates.split(",")
    cpus = getattr(a, "pin_cpus", None)
    runs: list[list[dict]] = []
    for rnd in range(a.rounds):
        order = list(enumerate(hows)) if rnd % 2 == 0 else list(enumerate(hows))[::-1]
        for i, how in order:
            # "+" does not travel back from the device
            sub = Path(a.out) / (f"r{rnd}" if a.rounds > 1 else "") / f"{i}-{how.replace('+', '_')}"
            cmd = [sys.executable, str(Path(__file__).resolve()), str(sub), *argv, "--candidates", how]
            print(f"== {how}, a process of its own (round {rnd + 1} of {a.rounds}): {' '.join(cmd)}",
                  flush=True)
            pin = {"preexec_fn": lambda: os.sched_setaffinity(0, cpus)} if cpus else {}
            done = subprocess.run(cmd, check=False, **pin)
            got = sub / "speed.rows.jsonl"
            found = [json.loads(line) for line in got.read_text().splitlines()] if got.is_file() else []
            if not found:
                found = [dict(arch=a.archs, candidate=how, error=f"its process left no row (exit {done.returncode})")]
            for r in found:
                if cpus:
                    r["pinned_cpus"] = sorted(cpus)
            if a.rounds == 1:
                for r in found:
                    emit(r)
            runs.append(found)
    if a.rounds == 1:
        return [r for found in runs for r in found]   # one round runs them in the candidates' order
    rows = combine_rounds(runs, hows)
    for r in rows:
        emit(r)
    return rows


def combine_rounds(runs: list[list[dict]], hows: list[str]) -> list[dict]:
    """`--rounds R`: one row per (arch, candidate) from the rows of its R processes: every timed
    cell (`*_ms`, `*_tok_s`) the median over the rounds that have it, with each round's value in
    `<cell>_rounds` (in the order run); the other fields from the first round; `rounds` how many
    processes left a row, `errors` what the others said."""
    by: dict[tuple, list[dict]] = {}
    for found in runs:
        for r in found:
            by.setdefault((r.get("arch"), r.get("candidate")), []).append(r)
    rows = []
    for (arch, how), got in sorted(by.items(), key=lambda kv: (str(kv[0][0]), hows.index(kv[0][1])
                                                              if kv[0][1] in hows else len(hows))):
        ok = [r for r in got if "error" not in r]
        row = dict(ok[0]) if ok else dict(arch=arch, candidate=how)
        row["rounds"] = len(ok)
        errs = [r["error"] for r in got if "error" in r]
        if errs:
            row["errors"] = errs
            if not ok:
                row["error"] = errs[0]
        cells = sorted({k for r in ok for k, v in r.items()
                        if (k.endswith("_ms") or k.endswith("_tok_s")) and isinstance(v, (int, float))})
        for k in cells:
            vals = [r[k] for r in ok if isinstance(r.get(k), (int, float))]
            row[k] = statistics.median(vals)
            row[f"{k}_rounds"] = [round(v, 4) for v in vals]
        rows.append(row)
    return rows


def table(phase: str, rows: list[dict]) -> str:
    out = []
    if phase == "exact":
        out.append("| model | dtype | candidate | prefill: elements differing | max abs | decode: differing | max abs |")
        out.append("| --- | --- | --- | ---: | ---: | ---: | ---: |")
        for r in rows:
            if "error" in r:
                out.append(f"| {r['model']} | {r['dtype']} | {r['candidate']} | error: {r['error'][:80]} | | | |")
            elif "mismatched" in r:
                out.append(f"| {r['model']} | {r['dtype']} | {r['candidate']} | {r['mismatched']} of {r['numel']} | {r['max_abs_diff']:.3g} | | |")
            else:
                gen = (f" generate: {'same' if r['generate_tokens_same'] else 'OTHER'} tokens, "
                       f"{r['generate_mismatched']} of {r['generate_numel']} logits differ"
                       if "generate_numel" in r else "")
                out.append(f"| {r['model']} | {r['dtype']} | {r['candidate']} | {r['prefill_mismatched']} | {r['prefill_max_abs']:.3g} | {r['decode_mismatched']} | {r['decode_max_abs']:.3g}{gen} |")
    elif phase == "locate":
        out.append("| model | dtype | module | op | responsible | s |")
        out.append("| --- | --- | --- | --- | --- | ---: |")
        for r in rows:
            out.append(f"| {r['model']} | {r['dtype']} | {'identical' if r['identical'] else r['module'] or '<model>'} | {r.get('op')} | {r.get('rewrite')} | {r['s']:.0f} |")
    else:
        keys = sorted({k for r in rows for k in r if k.endswith(("_ms", "_tok_s"))})
        out.append("| arch | candidate | " + " | ".join(keys) + " |")
        out.append("| --- | --- | " + " | ".join("---:" for _ in keys) + " |")
        for r in rows:
            out.append(f"| {r['arch']} | {r['candidate']} | " + " | ".join(
                f"{r[k]:.3f}" if k in r else "-" for k in keys) + (f" error {r['error'][:60]}" if "error" in r else "") + " |")
    return "\n".join(out)


def parse_cpus(text: str) -> set[int]:
    """"2,3" or "2-5" or "0,4-6" as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            cpus.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise SystemExit(f"--pin: {text!r} is not a CPU list (e.g. 2,3 or 2-5)") from None
    return cpus


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--phase", choices=["exact", "locate", "speed"], required=True)
    p.add_argument("--archs", default="llama,qwen2,mistral,gemma,gpt2")
    p.add_argument("--dtypes", default="bf16,f16,f32")
    p.add_argument("--candidates", default=None)
    p.add_argument("--seed-candidates", default=None, metavar="C,...",
                   help="exact: the candidates for the seed models and blocks (default: --candidates); "
                        "e.g. plain compile there only, where the contrast is the table's point")
    p.add_argument("--decode-steps", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--prefill-only", action="store_true",
                   help="speed: the prefill rows only (no decode steps)")
    p.add_argument("--packed-decision-inside", action="store_true",
                   help="session 18's exact compile for the A/B of session 19: the packed-sequence "
                        "decision of a forward without a cache runs eagerly inside the compiled model "
                        "(a graph break) even where the model derives its position ids")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="exact: also greedy generate() N tokens into a static cache and compare "
                        "tokens and logits; speed: tokens/s of generating N tokens at batch 1")
    p.add_argument("--greedy", type=int, default=0, metavar="N",
                   help="speed: tokens/s of a greedy loop of N new tokens at batch 1 (N <= 64), "
                        "every candidate, plain reduce-overhead compile included")
    p.add_argument("--batches", default="2", metavar="B,...",
                   help="exact: the batch sizes (each 64 tokens of prefill, then the decode steps), "
                        "one compiled candidate running them all in this order (default 2)")
    p.add_argument("--no-shipped", dest="shipped", action="store_false",
                   help="exact: leave out the shipped trained models")
    p.add_argument("--no-seeds", dest="seeds", action="store_false",
                   help="exact, locate: the architectures (and shipped models) only")
    p.add_argument("--prefills", default=None, metavar="BxS,...",
                   help="speed: the prefill shapes (default 1x512,8x2048; --quick: 1x512; none or an "
                        "empty string: no prefill row)")
    p.add_argument("--decode-empty-cache", action="store_true",
                   help="speed: decode against a cache left zeros instead of filled by a 512-token "
                        "prefill (the same work a step; no prefill shape to compile)")
    p.add_argument("--decode", default=None, metavar="B,...",
                   help="speed: the decode batches (default 1,8; --prefill-only: none; none or an "
                        "empty string: no decode row)")
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the exact and locate phases")
    p.add_argument("--isolate", action="store_true",
                   help="speed: each candidate in a process of its own, one after the other (wall "
                        "times of candidates compiled in one process are not comparable)")
    p.add_argument("--rounds", type=int, default=1, metavar="R",
                   help="speed, with --isolate: R rounds of the candidates' processes, the order "
                        "reversed every other round; each cell the median over the rounds, with "
                        "each round's value beside it (<cell>_rounds)")
    p.add_argument("--pin", default=None, metavar="CPUS",
                   help="speed, with --isolate: run each candidate's process on these CPUs only "
                        "(e.g. 2,3 or 2-3; os.sched_setaffinity): a host-bound step's wall time "
                        "moved 2x between unpinned processes (COMPILE.md, session 28)")
    a = p.parse_args()
    a.pin_cpus = parse_cpus(a.pin) if a.pin else None
    a.batches = [int(b) for b in a.batches.split(",") if b]
    if a.pin_cpus and not a.isolate:
        p.error("--pin needs --isolate (it pins the candidates' processes)")
    if a.rounds < 1 or (a.rounds > 1 and not a.isolate):
        p.error("--rounds takes R >= 1, and more than one round needs --isolate")
    a.prefill_shapes = [tuple(map(int, x.split("x"))) for x in
                        (a.prefills if a.prefills is not None else
                         ("1x512" if a.quick else "1x512,8x2048")).split(",")
                        if x not in ("", "none")]
    a.decode_batches = [int(b) for b in (a.decode if a.decode is not None else
                                         ("" if a.prefill_only else "1,8")).split(",")
                        if b not in ("", "none")]
    if a.packed_decision_inside:
        _exact._DERIVES_CONSECUTIVE_POSITIONS = frozenset()
    global DEV, ARCH
    DEV = a.device
    ARCH = "sm_90" if DEV == "cpu" else None
    if a.candidates is None:
        a.candidates = {"exact": "compile,exact,kernelize+exact,kernelize+exact-ro",
                        "locate": "inductor",
                        "speed": "eager,kernelize,compile-regional,kernelize+exact,compile-regional-ro,"
                         "compile-ro,kernelize+exact-ro"}[a.phase]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = run_env(device=None if DEV == "cuda" else "cpu")
    print(env, flush=True)
    global ROWS_FILE
    ROWS_FILE = out / f"{a.phase}.rows.jsonl"
    if a.isolate and a.phase == "speed" and ("," in a.candidates or a.rounds > 1):
        # the arguments again for each process, without the output folder, --isolate and the
        # candidate list (each gets one)
        argv, skip = [], False
        rest = sys.argv[1:]
        rest.remove(a.out)
        for x in rest:
            if skip:
                skip = False
            elif x in ("--candidates", "--rounds", "--pin"):
                skip = True
            elif x != "--isolate" and not x.startswith(("--candidates=", "--rounds=", "--pin=")):
                argv.append(x)
        rows = phase_speed_isolated(a, argv)
    else:
        rows = {"exact": phase_exact, "locate": phase_locate, "speed": phase_speed}[a.phase](a)
    proofs = _exact.proofs()   # the math-library functions proven (or not) on this device
    (out / f"{a.phase}.json").write_text(json.dumps(dict(env=env, rows=rows, proofs=proofs), indent=1,
                                                    default=str))
    print("\n" + json.dumps(env))
    print(table(a.phase, rows))
    for r in proofs:
        verdict = (f"eager's bits with {r.get('lowering', 'inductor')}" if r["equal"]
                   else f"differs: {r.get('first_difference') or r.get('error')}")
        print(f"proof: {r['op']}{r['scalars'] or ''} {r['dtype']}: {r['inputs']} inputs, {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
