"""Exact compile and the divergence locator on the CPU (issue 31; docs/compile.md).

Inductor compiles for the CPU too (C++), with the same decompositions, pattern matcher and
reduction lowerings that change bits on the GPU, so the seed models show the same differences
here: plain torch.compile moves f32 outputs, the exact backend does not. The GPU run of the
same questions is `bench/exact_compile.py` (docs/gpu-runs/2026-11-26-s8)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from kernelize import exact, seeds
from kernelize import locate
from kernelize.core import kernelize, unkernelize

pytestmark = pytest.mark.skipif(exact.unavailable(torch.device("cpu")) is not None,
                                reason=f"SKIPPED: {exact.unavailable(torch.device('cpu'))}")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _inductor_config_snapshot() -> dict:
    import functools

    from torch._inductor import config as ic
    return {k: functools.reduce(getattr, k.split("."), ic) for k in exact.exact_config()}


# ---- the configuration --------------------------------------------------------------------

def test_config_is_applied_per_compilation_and_restored(monkeypatch):
    # the real backend: inside its inner compile (where lowering runs) mean's lowering is the
    # fallback, the exact config and no graph cache are in force; afterwards nothing is changed
    before = _inductor_config_snapshot()
    from torch._inductor import compile_fx as cfx
    from torch._inductor import config as ic
    from torch._inductor import lowering as low
    mean = torch.ops.aten.mean.dim
    lowered = low.lowerings.get(mean)
    seen = {}
    real_inner = cfx.compile_fx_inner

    def spy_inner(*a, **k):
        seen["fallback"] = getattr(low.lowerings.get(mean), "_is_fallback_handler", False)
        seen["emulate"] = ic.emulate_precision_casts
        seen["pattern_matcher"] = ic.pattern_matcher
        seen["fx_graph_cache"] = ic.fx_graph_cache
        return real_inner(*a, **k)

    monkeypatch.setattr(cfx, "compile_fx_inner", spy_inner)
    f = torch.compile(lambda x: x.pow(2).mean(-1, keepdim=True) * x, backend=exact.backend)
    f(torch.randn(8, 64))
    assert seen == {"fallback": True, "emulate": True, "pattern_matcher": False,
                    "fx_graph_cache": False}
    # everything is as it was afterwards: the lowering table and inductor's config
    assert low.lowerings.get(mean) is lowered
    assert _inductor_config_snapshot() == before


def test_autotuning_options_are_turned_off(monkeypatch):
    # a caller's options that would swap eager's GEMMs for templates (or rewrite matrix products
    # while tuning) lose to the exact configuration; the mode that asks for them is refused
    from torch._inductor import compile_fx as cfx
    from torch._inductor import config as ic
    seen = {}
    real_inner = cfx.compile_fx_inner

    def spy_inner(*a, **k):
        seen.update(max_autotune=ic.max_autotune, gemm=ic.max_autotune_gemm,
                    cdt=ic.coordinate_descent_tuning)
        return real_inner(*a, **k)

    monkeypatch.setattr(cfx, "compile_fx_inner", spy_inner)
    gm_backend = exact.backend
    opts = {"max_autotune": True, "max_autotune_gemm": True, "coordinate_descent_tuning": True}
    f = torch.compile(lambda a, b: a @ b, backend=lambda gm, ex: gm_backend(gm, ex, options=opts))
    f(torch.randn(8, 16), torch.randn(16, 4))
    assert seen == {"max_autotune": False, "gemm": False, "cdt": False}
    with pytest.raises(ValueError, match="max-autotune"):
        exact._config_patches("max-autotune", None, None)


def test_decompositions_leave_the_eager_ops_whole():
    table = exact.exact_decompositions()
    names = {getattr(op, "overloadpacket", op).__name__ for op in table}
    for op in ("native_layer_norm", "_softmax", "var_mean", "sigmoid", "gelu", "mv", "dot", "addmv",
               "mm", "bmm", "addmm"):
        assert op not in names, op
    # the rest of inductor's table is still there (the fusions stay)
    assert len(table) > 100


# ---- math-library functions proven on the device ------------------------------------------

_TANH = torch.ops.aten.tanh.default


@pytest.fixture
def proofs_here(monkeypatch, tmp_path):
    """Proofs made on the CPU (only CUDA makes them by default: the CPU's vectorised and scalar
    code paths make a value checked at one position say nothing of another), kept in tmp_path."""
    monkeypatch.setattr(exact, "PROVE_ON", frozenset({"cpu"}))
    monkeypatch.setenv("KERNELIZE_CACHE", str(tmp_path))
    monkeypatch.setattr(exact, "_PROOFS", {})
    return tmp_path


def test_a_proof_compares_every_input_and_names_the_first_that_differs(proofs_here, monkeypatch):
    domain = next(exact._domain(torch.bfloat16, torch.device("cpu")))
    assert domain.numel() == 65536 and len(set(domain.view(torch.int16).tolist())) == 65536

    def off_at_1234(ov, scalars, kwargs, example, lowering):   # inductor's code, wrong on one input
        def fn(x):
            y = ov(x).clone()
            y.view(torch.int16)[1234] ^= 1
            return y
        return fn
    monkeypatch.setattr(exact, "_compile_alone", off_at_1234)
    assert not exact.prove(_TANH, (), {}, torch.bfloat16, torch.device("cpu"))
    [rec] = exact.proofs()
    assert rec["inputs"] == 65536 and rec["equal"] is False and rec["lowering"] is None
    assert [t["lowering"] for t in rec["tried"]] == ["inductor"]   # tanh has no rewrite to try
    diff = rec["first_difference"]
    assert diff["input"] == domain.view(torch.int16)[1234].item() & 0xFFFF
    assert diff["eager"] ^ diff["inductor"] == 1 and diff["differing_in_chunk"] == 1

    monkeypatch.setattr(exact, "_compile_alone", lambda ov, s, k, e, l: ov)   # eager's own code
    assert exact.prove(_TANH, (), {}, torch.float16, torch.device("cpu"))
    # made once: the next process reads it from the cache (a stand-in that would fail says so)
    monkeypatch.setattr(exact, "_PROOFS", {})
    monkeypatch.setattr(exact, "_exhaustive", lambda *a: 1 / 0)
    assert exact.prove(_TANH, (), {}, torch.float16, torch.device("cpu"))
    assert not exact.prove(_TANH, (), {}, torch.bfloat16, torch.device("cpu"))
    assert len(list((proofs_here / "proofs").glob("*.json"))) == 2
    # an error while proving is a no, with the reason, and is not cached
    assert not exact.prove(_TANH, (), {}, torch.float32, torch.device("cpu"))
    assert "ZeroDivisionError" in exact._PROOFS[exact._proof_key(
        _TANH, (), {}, torch.float32, torch.device("cpu"))]["error"]
    assert len(list((proofs_here / "proofs").glob("*.json"))) == 2


def test_where_inductors_own_lowering_differs_a_rewrite_of_eagers_formula_is_tried(proofs_here,
                                                                                 monkeypatch):
    pow3 = torch.ops.aten.pow.Tensor_Scalar
    compiled = []

    def own_differs(ov, scalars, kwargs, example, lowering):
        compiled.append(lowering)
        if len(compiled) == 1:   # inductor's own lowering: one rounding where eager has two
            return lambda x: ov(x.float(), *scalars).to(x.dtype)
        return lambda x: ov(x, *scalars)
    monkeypatch.setattr(exact, "_compile_alone", own_differs)
    assert exact.prove(pow3, (3.0,), {}, torch.bfloat16, torch.device("cpu"))
    [rec] = exact.proofs()
    assert rec["lowering"] == "x * x * x" and rec["equal"]
    assert [t["lowering"] for t in rec["tried"]] == ["inductor", "x * x * x"]
    assert rec["tried"][0]["first_difference"] is not None and rec["tried"][1]["first_difference"] is None
    key = exact._proof_key(pow3, (3.0,), {}, torch.bfloat16, torch.device("cpu"))
    assert exact.proven(key) == "x * x * x"


def test_a_proven_rewrite_is_what_lowering_emits(proofs_here):
    # the real proof on the CPU (eager's bf16 pow(x, 3.0) is x * x * x, each product rounded)
    from torch._inductor.utils import run_and_get_code
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    f = lambda x: torch.pow(x, 3.0) + 1  # noqa: E731
    out, code = run_and_get_code(torch.compile(f, backend=exact.backend), x)
    [rec] = exact.proofs()
    assert rec["lowering"] == "x * x * x", rec
    assert not any("= torch.ops.aten.pow" in c for c in code)
    assert torch.equal(out, f(x))


def test_silu_which_inductor_only_decomposes_is_proven_as_eagers_formula(proofs_here):
    # no lowering of inductor's own: the only candidate is eager's CUDA formula in f32
    import torch.nn.functional as F
    from torch._inductor.utils import run_and_get_code
    g, u = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(8, 64, dtype=torch.bfloat16)
    f = lambda g, u: F.silu(g) * u  # noqa: E731
    out, code = run_and_get_code(torch.compile(f, backend=exact.backend), g, u)
    [rec] = exact.proofs()
    assert [t["lowering"] for t in rec["tried"]] == ["x / (1 + exp(-x)) in f32"]
    assert rec["equal"] and rec["lowering"] == "x / (1 + exp(-x)) in f32", rec
    assert not any("= torch.ops.aten.silu" in c for c in code)   # fused, not eager's kernel
    assert torch.equal(out, f(g, u))
    # each gelu has its own formula to try; an op with none to try is not provable
    gelu = torch.ops.aten.gelu.default
    assert [n for n, _ in exact._candidates(gelu, (), {"approximate": "tanh"}, None)] == [
        "0.5 * x * (1 + tanh(kBeta * (x + kKappa * x^3))) in f32"]
    assert [n for n, _ in exact._candidates(gelu, (), {}, None)] == [
        "x * 0.5 * (1 + erf(x * M_SQRT1_2)) in f32"]
    # sigmoid has a lowering of inductor's own, tried first, then eager's formula
    own = lambda *a: None  # noqa: E731
    assert [n for n, _ in exact._candidates(torch.ops.aten.sigmoid.default, (), {}, own)] == [
        "inductor", "1 / (1 + exp(-x)) in f32"]
    # a function outside PROVABLE is never proven (erfinv: a fallback by rule)
    assert not exact.prove(torch.ops.aten.erfinv.default, (), {}, torch.float16, torch.device("cpu"))


def test_a_proof_of_a_call_with_keyword_arguments_is_found_again_at_lowering(proofs_here):
    # gelu's `approximate` reaches the proof (from the graph) and the lowering (from its call) as
    # a keyword: both must make the same key, or the proof is made and never used
    import torch.nn.functional as F
    from torch._inductor.utils import run_and_get_code
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    f = lambda x: F.gelu(x, approximate="tanh") * 2  # noqa: E731
    out, code = run_and_get_code(torch.compile(f, backend=exact.backend), x)
    [rec] = exact.proofs()
    assert rec["kwargs"] == {"approximate": "tanh"} or rec["scalars"] == ["tanh"], rec
    assert rec["equal"], rec   # eager's CPU gelu-tanh is its CUDA formula too (measured here)
    assert not any("= torch.ops.aten.gelu" in c for c in code)
    assert torch.equal(out, f(x))


def test_nothing_is_proven_where_no_proof_is_made():
    cpu = torch.device("cpu")
    assert exact._proof_key(_TANH, (), {}, torch.bfloat16, cpu) is None        # not on the CPU
    assert not exact.prove(_TANH, (), {}, torch.bfloat16, cpu)
    cuda = torch.device("cuda", 0)
    assert exact._proof_key(torch.ops.aten.mean.default, (), {}, torch.bfloat16, cuda) is None
    assert exact._proof_key(_TANH, (), {}, torch.float64, cuda) is None
    assert exact._proof_key(torch.ops.aten.pow.Tensor_Scalar, (3.0,), {}, torch.bfloat16,
                            cuda) is not None


def _tanh_fallbacks(f, x) -> int:
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    out, code = run_and_get_code(torch.compile(f, backend=exact.backend), x)
    assert torch.equal(out, f(x))
    return sum(c.count("= torch.ops.aten.tanh.default(") for c in code)   # a call of eager's kernel


def test_a_proven_function_is_lowered_by_inductor_and_an_unproven_one_falls_back(proofs_here,
                                                                                  caplog):
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    f = lambda x: torch.tanh(x) * 2  # noqa: E731
    # a real proof, made while the graph compiles (in a thread of its own), then used
    with caplog.at_level("INFO", logger="kernelize"):
        assert _tanh_fallbacks(f, x) == 0
    [rec] = exact.proofs()
    assert (rec["op"], rec["dtype"], rec["inputs"], rec["equal"]) == (
        "aten.tanh.default", "bfloat16", 65536, True)
    # the user is told (a proof takes seconds on a GPU the first time), and what it found
    said = [r.getMessage() for r in caplog.records if r.name == "kernelize"]
    assert any("proving aten.tanh.default in bfloat16" in m and "every input" in m for m in said), said
    assert any("eager's bits with inductor" in m for m in said), said
    # a proof that found a difference keeps eager's kernel
    key = exact._proof_key(_TANH, (), {}, torch.bfloat16, torch.device("cpu"))
    exact._PROOFS[key] = dict(rec, equal=False)
    assert _tanh_fallbacks(f, x) == 1
    # the switch off: no proof is asked for
    exact._PROOFS.clear()
    exact.PROVE_MATH = False
    try:
        assert _tanh_fallbacks(f, x) == 1 and exact.proofs() == []
    finally:
        exact.PROVE_MATH = True


def test_the_proofs_can_be_turned_off_for_a_process():
    import os
    import subprocess
    import sys
    from pathlib import Path
    code = "import kernelize.exact as E; print(E.PROVE_MATH)"
    env = {**os.environ, "KERNELIZE_PROVE_MATH": "0",
           "PYTHONPATH": str(Path(exact.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
    env["KERNELIZE_PROVE_MATH"] = "1"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "True"


def test_without_proofs_the_math_functions_fall_back_on_the_cpu():
    assert _tanh_fallbacks(lambda x: torch.tanh(x) * 2, torch.randn(8, 64, dtype=torch.bfloat16)) == 1


def test_max_autotune_is_refused():
    m = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="max-autotune"):
        exact.exact_compile(m, mode="max-autotune")
    assert exact.compile_state(m) is None


def test_unavailable_leaves_the_model_eager(monkeypatch):
    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
    m = nn.Linear(4, 4)
    st = exact.exact_compile(m)
    assert not st.compiled and "not supported" in st.reason
    assert getattr(m, "_compiled_call_impl", None) is None
    assert "runs eagerly" in str(st)


def test_backend_is_registered_by_name():
    from torch._dynamo.backends.registry import lookup_backend
    assert lookup_backend("kernelize_exact") is exact.backend


# ---- the seed models: plain compile differs, exact compile does not (f32, CPU) ----------------

@pytest.mark.parametrize("name", [*seeds.SEEDS, *seeds.BLOCKS])
def test_seed_model_builds_and_exact_compile_keeps_eager_bits(name):
    model, x = seeds.build(name, torch.float32)
    with torch.no_grad():
        ref = model(x)
        assert ref.shape == x.shape
        compiled = copy.deepcopy(model)
        st = exact.exact_compile(compiled)
        assert st.compiled and exact.compile_state(compiled) is st
        got = compiled(x)
    assert locate.compare(ref, got).identical


def test_plain_compile_moves_the_layer_norm_seed():
    # the difference exact compile removes is real here: PR 177163's case under plain inductor
    model, x = seeds.build("linear_layer_norm", torch.float32)
    with torch.no_grad():
        d = locate.compare(model(x), torch.compile(model)(x))
    assert d.mismatched > 0


def test_kernelize_compile_true_on_a_tiny_llama(tmp_path):
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
    # no kernels on the CPU: every layer is kept, and the model is compiled exactly
    rep = kernelize(model, kernels_dir="kernels", arch="sm_90", verbose=False, compile=True)
    assert rep.compile is not None and rep.compile.compiled
    # the whole model is one compilation (block by block, a KV cache's layer index would make
    # dynamo compile every block on its own); its blocks are not compiled apart
    assert rep.compile.regions == 0 and "the whole model" in str(rep)
    assert model._compiled_call_impl is not None
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in model.model.layers)
    from torch._dynamo.utils import counters
    counters.clear()
    with torch.no_grad():
        got = model(ids, use_cache=False).logits
    assert counters["stats"]["unique_graphs"] >= 1          # it was compiled
    # the only graph break: transformers' packed-sequence check (it reads the position ids),
    # run eagerly (`_traced_branches`)
    assert all("find_packed_sequence_indices" in why
               for why in counters["graph_break"]), dict(counters["graph_break"])
    assert locate.compare(ref, got).identical
    unkernelize(model)
    assert exact.compile_state(model) is None
    assert getattr(model, "_compiled_call_impl", None) is None


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def _greedy(model, ids, steps, cache):
    """Prefill then `steps` greedy decode steps into `cache`: every step's last logits."""
    n = ids.shape[1]
    out = []
    with torch.no_grad():
        r = model(ids, past_key_values=cache, use_cache=True, cache_position=torch.arange(n))
        for i in range(steps):
            out.append(r.logits[:, -1].clone())
            tok = r.logits[:, -1].argmax(-1, keepdim=True)
            r = model(tok, past_key_values=cache, use_cache=True,
                      cache_position=torch.tensor([n + i]))
    return torch.stack(out)


def test_reduce_overhead_steps_and_the_static_cache():
    """CUDA graphs, block by block (regional=True): each forward is one CUDA-graph step (the trees' own rule
    restored after it), an uninitialised static cache gets its tensors before the first block
    runs, a dynamic cache is refused with what to do, and generate() is steered to a static
    cache and kept from compiling the model again with plain inductor. (The CPU runs no CUDA
    graphs; the GPU check runs the same calls captured.)"""
    from torch._inductor import cudagraph_trees as cgt
    from transformers import DynamicCache, StaticCache
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 8))
    ref = _greedy(model, ids, 3, StaticCache(config=model.config, max_cache_len=16))
    gc = model.generation_config
    assert gc.cache_implementation is None and not gc.disable_compile
    st = exact.exact_compile(model, "reduce-overhead", regional=True)
    assert st.regions == 2 and gc.cache_implementation == "static" and gc.disable_compile
    assert "static KV cache" in str(st) and "turned off" in str(st)

    seen = []   # what the first block sees of the step and the cache
    cache = StaticCache(config=model.config, max_cache_len=16)
    hook = model.model.layers[0].register_forward_pre_hook(lambda m, a: seen.append(
        (cgt.MarkStepBox.mark_step_counter, all(x.is_initialized for x in cache.layers))))
    got = _greedy(model, ids, 3, cache)
    hook.remove()
    # identical at the decode steps too, where transformers' SDPA takes another path when it
    # knows it is compiled (the blocks are told it is not, and only while they run)
    assert locate.compare(ref, got).identical
    from transformers.integrations import sdpa_attention
    from transformers.utils.import_utils import is_torchdynamo_compiling
    assert sdpa_attention.is_torchdynamo_compiling is is_torchdynamo_compiling
    assert len(seen) == 4 and all(step < 0 and ready for step, ready in seen)
    assert len({step for step, _ in seen}) == 4            # a new step every forward
    assert cgt.MarkStepBox.mark_step_counter == 0          # the trees' own rule afterwards

    with pytest.raises(ValueError, match="needs a static KV cache.*StaticCache"):
        with torch.no_grad():
            model(ids, past_key_values=DynamicCache(), use_cache=True)
    assert cgt.MarkStepBox.mark_step_counter == 0

    exact.uncompile(model)
    assert gc.cache_implementation is None and not gc.disable_compile
    assert not model._forward_pre_hooks and not model._forward_hooks


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_whole_model_keeps_eager_masks(mode):
    """The whole model compiled: where transformers' mask builder decides from tensor values
    whether to pass a mask (traced it always builds one where eager passes none, and the
    attention's bits move: 105 of 128 prefill logits in f32 once), that decision runs eagerly (a
    graph break around it); where it reads no tensor (no padding mask) it is traced with eager's
    answers to its trace checks, no break. The mask itself is built in the graph. A decode step
    into a static cache compiles without a graph break (one CUDA graph under reduce-overhead),
    and so does a prefill into an empty static cache; so does a forward without a
    cache (the packed-sequence check is decided before the compiled code runs: the model derives
    consecutive positions). All are identical with eager; the masking module's functions are
    the originals again after each call."""
    import sys
    from transformers import StaticCache
    from transformers import masking_utils as mu
    from torch._dynamo.utils import counters
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 8))
    ref = _greedy(model, ids, 3, StaticCache(config=model.config, max_cache_len=16))
    with torch.no_grad():
        ref_nocache = model(ids, use_cache=False).logits
    builder = sys.modules[type(model).__module__].create_causal_mask
    decision, trace_check = mu._ignore_causal_mask_sdpa, mu.is_tracing
    # under reduce-overhead the whole model is the default (one CUDA graph per forward)
    st = exact.exact_compile(model, mode, **({"regional": False} if mode is None else {}))
    assert st.regions == 0
    counters.clear()
    cache = StaticCache(config=model.config, max_cache_len=16)
    n = ids.shape[1]
    got = []
    with torch.no_grad():
        r = model(ids, past_key_values=cache, use_cache=True, cache_position=torch.arange(n))
        prefill_breaks = dict(counters["graph_break"])
        counters.clear()
        for i in range(3):
            got.append(r.logits[:, -1].clone())
            tok = r.logits[:, -1].argmax(-1, keepdim=True)
            r = model(tok, past_key_values=cache, use_cache=True,
                      cache_position=torch.tensor([n + i]))
        decode_breaks = dict(counters["graph_break"])
        counters.clear()
        got_nocache = model(ids, use_cache=False).logits
        nocache_breaks = dict(counters["graph_break"])
    assert locate.compare(ref, torch.stack(got)).identical
    assert locate.compare(ref_nocache, got_nocache).identical
    # no padding mask, an empty static cache: the skip decision is made up front (the cache's
    # offset, a tensor where the cache was made ready before the call, is read there)
    assert prefill_breaks == {}, prefill_breaks
    assert decode_breaks == {}, decode_breaks
    # without a cache the packed-sequence check is decided up front (positions the model derives)
    assert nocache_breaks == {}, nocache_breaks
    assert sys.modules[type(model).__module__].create_causal_mask is builder
    assert mu._ignore_causal_mask_sdpa is decision and mu.is_tracing is trace_check


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_prefill_into_an_empty_static_cache_decides_the_mask_up_front(mode):
    """A prefill into a static cache that holds no token: the mask-skip decision's offset is read
    before the compiled code (no graph break, eager's `is_causal` path); a second chunk into the
    cache that now holds tokens keeps the eager decision inside; the cache reset, a prefill
    decides up front again. Every output is eager's."""
    from transformers import StaticCache
    from torch._dynamo.utils import counters
    model = _tiny_llama()
    ids, more = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 4))

    def run(m, cache):
        with torch.no_grad():
            a = m(ids, past_key_values=cache, use_cache=True, cache_position=torch.arange(8)).logits
            b = m(more, past_key_values=cache, use_cache=True, cache_position=torch.arange(8, 12)).logits
        return a, b

    ref_a, ref_b = run(model, StaticCache(config=model.config, max_cache_len=16))
    exact.exact_compile(model, mode, **({"regional": False} if mode is None else {}))
    cache = StaticCache(config=model.config, max_cache_len=16)
    breaks = []
    with torch.no_grad():
        for step, (x, pos, want) in enumerate([(ids, torch.arange(8), ref_a), (more, torch.arange(8, 12), ref_b),
                                               (ids, torch.arange(8), ref_a)]):
            if step == 2:
                cache.reset()
            counters.clear()
            got = model(x, past_key_values=cache, use_cache=True, cache_position=pos).logits
            breaks.append(dict(counters["graph_break"]))
            assert locate.compare(want, got).identical, step
    assert breaks[0] == {} and breaks[2] == {}, breaks
    # the chunk after it: the cache's offset (a tensor) is not known to be 0, read inside
    assert breaks[1] and all("_ignore_causal_mask_sdpa" in why for why in breaks[1]), breaks
    assert exact._EMPTY_CACHE == [False]


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_prefill_with_the_prompts_all_ones_mask_decides_up_front_too(mode):
    """`generate()` passes the prompt's attention mask, all ones: into an empty static cache the
    mask-skip decision is made up front for it too (no graph break); a mask with a zero (left
    padding) keeps the eager decision inside. Every output is eager's."""
    from transformers import StaticCache
    from torch._dynamo.utils import counters
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 8))
    ones = torch.ones(2, 8, dtype=torch.long)
    padded = ones.clone()
    padded[0, :3] = 0

    def one(m, mask):
        cache = StaticCache(config=m.config, max_cache_len=16)
        with torch.no_grad():
            return m(ids, attention_mask=mask, past_key_values=cache, use_cache=True,
                     cache_position=torch.arange(8)).logits

    refs = [one(model, ones), one(model, padded)]
    assert not torch.equal(refs[0], refs[1])   # the zeros mask tokens out
    exact.exact_compile(model, mode, **({"regional": False} if mode is None else {}))
    breaks = []
    for mask, want in zip([ones, padded, ones], refs + refs[:1]):
        counters.clear()
        got = one(model, mask)
        breaks.append(dict(counters["graph_break"]))
        assert locate.compare(want, got).identical
    assert breaks[0] == {} and breaks[2] == {}, breaks
    assert breaks[1] and all("_ignore_causal_mask_sdpa" in why for why in breaks[1]), breaks
    assert exact._EMPTY_CACHE == [False]


def test_the_packed_sequence_decision_is_made_before_the_compiled_code_where_it_can_be():
    """A forward without a cache asks whether its position ids hold packed sequences. Ids the
    caller passes are read before the compiled code (consecutive: no graph break; packed: the
    decision runs eagerly inside, a break, and the packed mask is eager's); a call after a packed
    one is decided again (dynamo guards on the up-front answer). Every answer is eager's bits."""
    from torch._dynamo.utils import counters
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 8))
    consecutive = torch.arange(8).unsqueeze(0).expand(2, -1)
    packed = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6, 7]])
    calls = [{}, {"position_ids": consecutive}, {"position_ids": packed}, {},
             {"position_ids": packed}, {"position_ids": consecutive + 3}]
    with torch.no_grad():
        ref = [model(ids, use_cache=False, **kw).logits for kw in calls]
    assert not torch.equal(ref[1], ref[2])   # the packed ids give another mask
    exact.exact_compile(model)
    for i, (kw, want) in enumerate(zip(calls, ref)):
        counters.clear()
        with torch.no_grad():
            got = model(ids, use_cache=False, **kw).logits
        breaks = dict(counters["graph_break"])   # counted where a call compiles
        assert locate.compare(want, got).identical, kw
        if i == 2:   # the first packed call compiles the eager decision in, behind a break
            assert breaks and all("find_packed_sequence_indices" in why for why in breaks), breaks
        else:
            assert breaks == {}, (kw, breaks)
    assert exact._CONSECUTIVE == [False]


@pytest.mark.parametrize("arch", sorted(exact._DERIVES_CONSECUTIVE_POSITIONS))
def test_the_architectures_trusted_to_derive_consecutive_positions_do(arch):
    """`_DERIVES_CONSECUTIVE_POSITIONS`: for each architecture, a forward without position ids
    (the ids it derives) gives the bits of one with explicit consecutive ids, and one with
    non-consecutive ids gives other bits (the check can fail), with this transformers."""
    import transformers
    cfgs = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
            "mistral": transformers.MistralConfig, "gemma": transformers.GemmaConfig,
            "gemma2": transformers.Gemma2Config, "gpt2": transformers.GPT2Config}
    small = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
    if arch == "gpt2":
        small = dict(vocab_size=64, n_embd=64, n_layer=2, n_head=4, n_positions=128)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfgs[arch](**small)).eval()
    assert model.config.model_type == arch
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        derived = model(ids, use_cache=False).logits
        explicit = model(ids, use_cache=False, position_ids=torch.arange(8).unsqueeze(0)).logits
        shifted = model(ids, use_cache=False, position_ids=torch.arange(8).unsqueeze(0) * 2).logits
    assert torch.equal(derived, explicit)
    assert not torch.equal(derived, shifted)


def test_traced_branches_are_the_masking_functions_that_ask_whether_they_are_traced():
    """`_traced_branches` finds, by their code, the masking functions that branch on being
    traced (the skip decisions), and not the builders that only call them."""
    from transformers import masking_utils as mu
    model = _tiny_llama()
    names = {name for mod, name, _ in exact._traced_branches(model) if mod is mu}
    assert {"_ignore_causal_mask_sdpa", "find_packed_sequence_indices"} <= names, names
    assert "create_causal_mask" not in names and "sdpa_mask" not in names, names
    for mod, name, wrapper in exact._traced_branches(model):
        assert wrapper is not getattr(mod, name)          # an eager wrapper, not patched in yet


def test_hold_generate_compile_is_undone_and_leaves_a_users_choice():
    model = _tiny_llama()
    gc = model.generation_config
    assert "turned off" in exact.hold_generate_compile(model) and gc.disable_compile
    assert exact.hold_generate_compile(model) is None          # held already: nothing more
    exact.release_generate_compile(model)
    assert not gc.disable_compile
    gc.disable_compile = True                                  # the user's own setting
    assert exact.hold_generate_compile(model) is None
    exact.release_generate_compile(model)
    assert gc.disable_compile                                  # kept as the user set it


def test_kernelize_keeps_generate_from_compiling_the_model_again():
    model = _tiny_llama()
    rep = kernelize(model, kernels_dir="kernels", arch="sm_90", verbose=False, compile=True)
    assert model.generation_config.disable_compile and "turned off" in str(rep)
    unkernelize(model)
    assert not model.generation_config.disable_compile


def test_whole_model_compile_and_blocks():
    model, x = seeds.build("linear_layer_norm", torch.float32)
    assert exact.blocks(model) == []
    with pytest.raises(ValueError, match="no repeated stack"):
        exact.exact_compile(model, regional=True)
    st = exact.exact_compile(model)          # no blocks: the whole model
    assert st.regions == 0 and model._compiled_call_impl is not None
    assert exact.uncompile(model) and model._compiled_call_impl is None
    stack = nn.Sequential(nn.ModuleList([nn.Linear(4, 4) for _ in range(3)]),
                          nn.ModuleList([nn.Linear(4, 4), nn.ReLU()]))
    assert exact.blocks(stack) == list(stack[0])


# ---- the divergence locator ---------------------------------------------------------------

class _Perturbed(nn.Module):
    """A LayerNorm that computes its statistics in two passes (a var_mean LayerNorm)."""

    def __init__(self, ln: nn.LayerNorm):
        super().__init__()
        self.weight, self.bias, self.eps = ln.weight, ln.bias, ln.eps

    def forward(self, x):
        var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias


def test_locator_names_a_perturbed_module_and_its_op():
    model, x = seeds.build("linear_layer_norm", torch.float32)
    cand = copy.deepcopy(model)
    cand.norm = _Perturbed(cand.norm)
    r = locate.diff(model, x, cand)
    assert not r.identical
    assert r.module == "norm"
    # eager runs native_layer_norm where the candidate runs var_mean: named, with the ops
    assert r.op == "var_mean" and r.eager_ops[0] == "native_layer_norm"
    assert "norm" in str(r) and "var_mean" in str(r)


def test_locator_names_an_op_that_computes_other_bits():
    class Scale(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, x):
            return torch.relu(x) * self.k

    class Net(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.s = Scale(k)

        def forward(self, x):
            return self.s(self.a(x))

    torch.manual_seed(0)
    model = Net(2.0)
    cand = copy.deepcopy(model)
    cand.s.k = 2.0000002   # one ulp-ish perturbation of the second op's operand
    r = locate.diff(model, torch.randn(4, 8), cand)
    assert r.module == "s" and r.op == "mul"   # relu before it matches
    assert r.op_delta.mismatched > 0


def test_locator_says_identical_for_identical_models():
    model, x = seeds.build("attention", torch.float32)
    r = locate.diff(model, x, copy.deepcopy(model))
    assert r.identical and "identical" in str(r)
    with pytest.raises(ValueError, match="copy"):
        locate.diff(model, x, model)


def test_locator_under_inductor_names_layer_norm_and_the_rewrite():
    model, x = seeds.build("linear_layer_norm", torch.float32)
    r = locate.diff(model, x, "inductor")
    assert not r.identical
    assert r.module == "norm" and r.op == "aten.native_layer_norm"
    assert "native_layer_norm" in r.rewrite
    # and under the exact backend the same model is identical
    assert locate.diff(model, x, "exact", ops=False).identical


def test_compare_counts_like_the_verifier():
    a = torch.tensor([1.0, -0.0, float("nan"), 2.0])
    b = torch.tensor([1.0, 0.0, float("nan"), 2.0000002])
    d = locate.compare(a, b)
    assert d.mismatched == 1 and d.max_ulp == 1   # +0 == -0, NaN == NaN, one ulp at 2.0
    assert locate.compare((a,), [a]).note      # another structure


def test_diff_cli_on_a_seed_model(capsys):
    rc = locate.main(["--seed-model", "linear_layer_norm", "--dtype", "f32", "--device", "cpu",
                      "--candidate", "exact", "--no-ops"])
    assert rc == 0 and "identical" in capsys.readouterr().out


class _Attn(nn.Module):
    """Self-attention through `F.scaled_dot_product_attention`: x (2, seq, heads * 8)."""

    def __init__(self, seq: int, heads: int, causal: bool):
        super().__init__()
        self.seq, self.heads, self.causal = seq, heads, causal
        self.qkv = nn.Linear(heads * 8, 3 * heads * 8)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, self.seq, 3, self.heads, 8).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


def test_attention_through_sdpa_is_called_as_eager_calls_it():
    torch.manual_seed(0)
    m, x = _Attn(seq=8, heads=4, causal=True).eval(), torch.randn(2, 8, 32)
    replaced = []

    def spy(gm, example_inputs, **kw):
        replaced.append(exact.opaque_sdpa(gm))
        assert "kernelize.eager_sdpa" in gm.code
        return exact.backend(gm, example_inputs, **kw)

    with torch.no_grad():
        ref = m(x)
        got = torch.compile(m, backend=spy, fullgraph=True)(x)
    assert replaced == [1]
    assert locate.compare(ref, got).identical


class _Rotary(nn.Module):
    """HF's rotary tables: `inv_freq[None, :, None] @ position_ids[:, None, :]` (inner
    dimension 1), then cos and sin of the angles; `k2` multiplies by a two-column table too."""

    def __init__(self, k2: bool = False):
        super().__init__()
        self.k2 = k2
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16)))
        self.w2 = nn.Parameter(torch.randn(2, 5), requires_grad=False)

    def forward(self, pos):
        f = self.inv_freq[None, :, None].expand(pos.shape[0], -1, 1) @ pos[:, None, :].float()
        emb = torch.cat((f.transpose(1, 2), f.transpose(1, 2)), dim=-1)
        out = emb.cos() + emb.sin()
        if self.k2:
            out = out + (out[..., :2] @ self.w2).sum()
        return out


def _eager_and_exact(m: nn.Module, x: torch.Tensor, rewrite, precision: str = "highest"):
    """`m(x)` eagerly and compiled by the exact backend under the f32 matmul `precision`, and how
    many rewrites the pass `rewrite` made on the dynamo graph (run first, by a spy backend)."""
    made = []

    def spy(gm, example_inputs, **kw):
        made.append(rewrite(gm))
        return exact.backend(gm, example_inputs, **kw)

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        with torch.no_grad():
            return m(x), torch.compile(m, backend=spy, fullgraph=True)(x), made
    finally:
        torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize("tf32", [False, True])
def test_products_of_one_term_become_pointwise_with_eager_bits(tf32):
    torch.manual_seed(0)
    m, pos = _Rotary(k2=True).eval(), torch.arange(37).view(1, 37).expand(3, 37) * 1.37
    ref, got, replaced = _eager_and_exact(m, pos, exact.pointwise_outer_products, "high" if tf32 else "highest")
    # the inner-dimension-1 product only (not the two-column one), and none where f32 may use TF32
    assert replaced == [0 if tf32 else 1]
    assert locate.compare(ref, got).identical


class _SliceMatmul(nn.Module):
    """`h[..., :k] @ w` on a slice of an intermediate: eager folds it into one mm as a view,
    PyTorch's decomposition would expand `w` and call bmm. `how`: "slice" (foldable, not
    contiguous), "whole" (contiguous: both fold), "transposed" (leading dims not mergeable:
    neither folds)."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.w = nn.Parameter(torch.randn(2, 5), requires_grad=False)

    def forward(self, x):
        h = (x * 1.37).sin()                       # an intermediate, contiguous [3, 37, 16]
        if self.how == "whole":
            a = h[..., :2].contiguous()
        elif self.how == "transposed":
            a = h.transpose(0, 1)[..., :2]         # [37, 3, 2]: dim 0's stride is not dim 1's x size
        else:
            a = h[..., :2]
        return a @ self.w


@pytest.mark.parametrize("how,folds", [("slice", 1), ("whole", 0), ("transposed", 0)])
def test_a_batched_matmul_is_folded_as_eager_folds_it(how, folds):
    torch.manual_seed(0)
    m, x = _SliceMatmul(how).eval(), torch.randn(3, 37, 16)
    ref, got, rewritten = _eager_and_exact(m, x, exact.matmuls_folded_as_eager)
    assert rewritten == [folds]
    assert ref.shape == got.shape
    assert locate.compare(ref, got).identical


def test_tf32_is_seen_through_either_api_and_never_raises():
    # In a process of its own: torch refuses to answer `allow_tf32` once both of its TF32 APIs
    # were used, and the settings are global.
    import subprocess
    code = """
import torch
from kernelize import exact
assert not exact._tf32_possible()
torch.backends.cuda.matmul.fp32_precision = "tf32"
assert exact._tf32_possible()
torch.backends.cuda.matmul.fp32_precision = "ieee"
assert not exact._tf32_possible()
torch.backends.cuda.matmul.allow_tf32 = False      # the legacy API agreeing
assert not exact._tf32_possible()
torch.backends.fp32_precision = "tf32"             # the generic setting: torch then refuses
try:                                               # to answer allow_tf32
    torch.backends.cuda.matmul.allow_tf32
except RuntimeError:
    pass
assert exact._tf32_possible()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=str(Path(__file__).resolve().parents[1]))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


_SCALAR_FNS = {
    "mul": lambda a: a * 0.1, "rmul": lambda a: 1.1 * a, "add": lambda a: a + 0.3,
    "rsub": lambda a: 0.3 - a, "div": lambda a: a / 0.7, "rdiv": lambda a: 0.7 / a,
    # GPT-2's gelu_new, where kernelize.diff found the CPU's product with a rounded scalar
    "gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0)))),
}


def _scalar_ops_differing(dt, monkeypatch=None) -> dict:
    torch.manual_seed(0)
    x = torch.randn(2, 16, 512).to(dt)
    out = {}
    for name, fn in _SCALAR_FNS.items():
        torch._dynamo.reset()
        with torch.no_grad():
            got = torch.compile(fn, backend=exact.backend)(x)
        out[name] = locate.compare(fn(x), got).mismatched
    return out


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16, torch.float32])
def test_ops_with_a_python_scalar_keep_eagers_bits_on_the_cpu(dt, monkeypatch):
    # eager: `t * s` and `t / s` take s in f32 on the CPU, `s / t` is `t.reciprocal() * s`
    assert _scalar_ops_differing(dt) == dict.fromkeys(_SCALAR_FNS, 0)
    if dt != torch.float32:   # and without the two rewrites, inductor's CPU code differs there
        monkeypatch.setattr(exact, "scalar_rdiv_as_eager", lambda gm: 0)
        monkeypatch.setattr(exact, "cpu_scalar_opmath", lambda gm: 0)
        off = _scalar_ops_differing(dt)
        assert all(off[k] > 0 for k in ("mul", "div", "rdiv", "gelu_new")), off


def test_products_of_one_term_under_autograd_stay_matmuls():
    m = _Rotary()
    seen = []

    def spy(gm, example_inputs, **kw):
        seen.append(exact.pointwise_outer_products(gm))
        return exact.backend(gm, example_inputs, **kw)

    pos = torch.arange(5).view(1, 5).float().requires_grad_(True)
    torch.compile(m, backend=spy, fullgraph=True)(pos).sum().backward()
    assert seen == [0] and pos.grad is not None


def test_kernelize_diff_command_runs_the_locator():
    # `kernelize diff -- ARGS` runs `python3 -m kernelize.locate ARGS` with this Python and the
    # repository's package; its exit code is the locator's (1: a divergence was found)
    import subprocess
    import sys

    from conftest import REPO, _binary
    out = subprocess.run([str(_binary()), "diff", "--python", sys.executable, "--python-path",
                          str(REPO / "python"), "--", "--seed-model", "linear_layer_norm",
                          "--dtype", "f32", "--device", "cpu", "--candidate", "inductor",
                          "--no-ops"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "first module: norm (LayerNorm)" in out.stdout


def test_the_committed_rewrite_table_is_the_one_its_records_give(tmp_path):
    # docs/compile-rewrites.json (the dashboard's field page builds it in) from the GPU run's
    # records, by scripts/compile_rewrites.py
    import subprocess
    import sys

    from conftest import REPO
    out = tmp_path / "rewrites.json"
    subprocess.run([sys.executable, str(REPO / "scripts" / "compile_rewrites.py"), "--out", str(out)],
                   check=True, capture_output=True)
    assert out.read_text() == (REPO / "docs" / "compile-rewrites.json").read_text(), \
        "docs/compile-rewrites.json is stale: run python3 scripts/compile_rewrites.py"


def test_locator_names_the_op_of_a_module_make_fx_cannot_trace():
    # data-dependent Python in the module's own code (as in transformers' mask building): the
    # op is found in dynamo's graphs instead
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(64, 64)
            self.w = nn.Parameter(torch.randn(64))
            self.b = nn.Parameter(torch.randn(64))

        def forward(self, x):
            h = self.a(x)
            if (h > -1e30).all():       # data-dependent (an exact reduction)
                h = h * 1.0
            return torch.nn.functional.layer_norm(h, (64,), self.w, self.b, 1e-5)

    torch.manual_seed(0)
    m = Gate().eval()
    x = torch.randn(512, 64) * 3 + 1
    r = locate.diff(m, x, "inductor")
    assert not r.identical and r.module == ""
    assert r.op is not None and "layer_norm" in r.op, r
    assert "layer_norm" in r.rewrite


def test_sdpa_under_autograd_stays_traced_and_trains():
    # eager_sdpa has no backward: under autograd the call is left to inductor, and training works
    torch.manual_seed(0)
    m = _Attn(seq=4, heads=2, causal=False)
    replaced = []

    def spy(gm, example_inputs, **kw):
        replaced.append(exact.opaque_sdpa(gm))
        return exact.backend(gm, example_inputs, **kw)

    out = torch.compile(m, backend=spy)(torch.randn(2, 4, 16))
    out.sum().backward()
    assert replaced == [0] and m.qkv.weight.grad is not None


# ---- residual add + norm as one kernel (exact.fuse_residual_norms) ---------------------------

_NORM_KEY, _FUSED_KEY = 900_001, 900_002   # keys no kernel has: the CPU stand-ins ignore them
_LN_KEY, _FUSED_LN_KEY = 900_003, 900_004


def _llama_norm(x, w, eps):
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.fixture(scope="module")
def cpu_norm_ops():
    """The two custom ops on the CPU (the real ones launch CUDA kernels): eager's arithmetic, so
    that a fused graph and the eager model must agree bit for bit."""
    from kernelize import ops

    def fused(x, residual, w, eps, key):
        residual.copy_(x + residual)
        return _llama_norm(residual, w, eps)

    def fused_ln(x, residual, w, b, eps, key):
        residual.copy_(x + residual)
        return torch.nn.functional.layer_norm(residual, residual.shape[-1:], w, b, eps)

    handles = [torch.library.register_kernel("kernelize::launch_rms_norm", "cpu",
                                             lambda x, w, eps, key: _llama_norm(x, w, eps)),
               torch.library.register_kernel("kernelize::launch_fused_add_rms_norm", "cpu", fused),
               torch.library.register_kernel("kernelize::launch_layer_norm", "cpu",
                                             lambda x, w, b, eps, key: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, eps)),
               torch.library.register_kernel("kernelize::launch_fused_add_layer_norm", "cpu", fused_ln)]
    ops.pair_residual(_NORM_KEY, _FUSED_KEY)
    ops.pair_residual(_LN_KEY, _FUSED_LN_KEY)
    yield
    ops._RESIDUAL.pop(_NORM_KEY, None)
    ops._RESIDUAL.pop(_LN_KEY, None)
    for h in handles:
        if hasattr(h, "destroy"):
            h.destroy()


class _Residual(nn.Module):
    """Two decoder-like steps: h = x + o(x), y = norm(h); then h2 = h + o2(y), norm(h2).
    `read_early`: the first sum is also read before its norm; `key`: the norms' kernel key."""

    def __init__(self, d: int, key: int = _NORM_KEY, read_early: bool = False):
        super().__init__()
        self.o, self.o2 = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.w = nn.Parameter(torch.rand(d) + 0.5)
        self.key, self.read_early = key, read_early

    def forward(self, x):
        h = x + self.o(x)
        early = h * 2 if self.read_early else None
        y = torch.ops.kernelize.launch_rms_norm(h, self.w, 1e-6, self.key)
        h2 = h + self.o2(y)
        out = torch.ops.kernelize.launch_rms_norm(h2, self.w, 1e-6, self.key)
        return (out, h2, early) if early is not None else (out, h2)


def _fused_count(m, *inputs):
    counts = []

    def spy(gm, example_inputs, **kw):
        counts.append(exact.fuse_residual_norms(gm))
        assert ("launch_fused_add_" in gm.code) == bool(counts[-1])
        return exact.backend(gm, example_inputs, **kw)

    with torch.no_grad():
        ref = m(*[t.clone() for t in inputs])
        kept = [t.clone() for t in inputs]
        got = torch.compile(m, backend=spy, fullgraph=True)(*inputs)
    for a, b in zip(kept, inputs):
        assert torch.equal(a, b), "an input of the graph was written"
    return counts, ref, got


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_residual_add_and_the_norm_after_it_run_as_the_fused_kernel(cpu_norm_ops, dtype):
    torch.manual_seed(0)
    m = _Residual(64).to(dtype).eval()
    counts, ref, got = _fused_count(m, torch.randn(4, 64, dtype=dtype))
    assert counts == [2]
    assert locate.compare(ref, got).identical


def test_no_fusion_without_a_partner_a_fresh_operand_or_when_the_sum_is_read_first(cpu_norm_ops):
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    # a norm kernel with no fused partner
    counts, ref, got = _fused_count(_Residual(64, key=_NORM_KEY + 7).eval(), x)
    assert counts == [0] and locate.compare(ref, got).identical
    # the first sum read before its norm: only the second pair fuses
    counts, ref, got = _fused_count(_Residual(64, read_early=True).eval(), x)
    assert counts == [1] and locate.compare(ref, got).identical

    class TwoInputs(nn.Module):   # neither operand is a fresh tensor only the add reads
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.rand(64) + 0.5)

        def forward(self, a, b):
            return torch.ops.kernelize.launch_rms_norm(a + b, self.w, 1e-6, _NORM_KEY), a

    counts, ref, got = _fused_count(TwoInputs().eval(), x, torch.randn(4, 64))
    assert counts == [0] and locate.compare(ref, got).identical


class _GPT2Residual(nn.Module):
    """GPT-2's block around its LayerNorms: Conv1D projections (`addmm(b, x.view(-1, d), w)`
    viewed back), eval-mode dropout, the residual add, then the norm (the kernelize op)."""

    def __init__(self, d: int, key: int = _LN_KEY):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(d, d) / d ** 0.5), nn.Parameter(torch.randn(d, d) / d ** 0.5)
        self.b1, self.b2 = nn.Parameter(torch.randn(d)), nn.Parameter(torch.randn(d))
        self.g, self.beta = nn.Parameter(torch.rand(d) + 0.5), nn.Parameter(torch.randn(d))
        self.drop = nn.Dropout(0.1)
        self.key = key

    def conv1d(self, x, w, b):
        return torch.addmm(b, x.view(-1, x.size(-1)), w).view(*x.shape[:-1], w.shape[-1])

    def forward(self, x):
        y = torch.ops.kernelize.launch_layer_norm(x, self.g, self.beta, 1e-5, self.key)
        h = self.drop(self.conv1d(y, self.w1, self.b1)) + x
        y2 = torch.ops.kernelize.launch_layer_norm(h, self.g, self.beta, 1e-5, self.key)
        h2 = h + self.drop(self.conv1d(y2, self.w2, self.b2))
        return torch.ops.kernelize.launch_layer_norm(h2, self.g, self.beta, 1e-5, self.key), h2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpt2s_residual_adds_run_with_the_layer_norms_after_them(cpu_norm_ops, dtype):
    # fused_add_layer_norm: the add's fresh operand is a view of an addmm through an eval-mode
    # dropout (GPT-2's Conv1D and resid_dropout); both adds fuse, the sums and outputs are eager's
    torch.manual_seed(0)
    m = _GPT2Residual(64).to(dtype).eval()
    counts, ref, got = _fused_count(m, torch.randn(2, 3, 64, dtype=dtype))
    assert counts == [2]
    assert locate.compare(ref, got).identical
    # a LayerNorm kernel without a fused partner: nothing fuses
    counts, ref, got = _fused_count(_GPT2Residual(64, key=_LN_KEY + 7).eval(), torch.randn(2, 3, 64))
    assert counts == [0] and locate.compare(ref, got).identical


def test_kernelize_compile_pairs_each_swapped_norm_with_the_sources_fused_kernel(tmp_path, monkeypatch):
    """kernelize(..., compile=...) loads the source's fused_add_rms_norm kernel beside each
    swapped LlamaRMSNorm (what fuse_residual_norms needs) and says so; without one it says why."""
    import re
    import shutil
    import transformers
    from conftest import REPO
    from kernelize import core, launch, ops
    from test_training import ForwardStandIn, _forward_run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    loaded: dict = {}   # one kernel per digest, as launch.compiled caches them per process
    monkeypatch.setattr(launch, "compiled", lambda digest, manifest, *a, **k:
                        loaded.setdefault(digest, ForwardStandIn(manifest)))
    monkeypatch.setattr(core, "_stand_in_run", _forward_run)
    root = tmp_path / "k"
    for name in ("rms_norm_llama", "fused_add_rms_norm"):
        shutil.copytree(REPO / "kernels" / name, root / name)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    m = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    rep = kernelize(m, kernels_dir=root, compile=True, device="cuda:0", arch="sm_90", verbose=False)
    lines = [n for n in rep.notes if n.startswith("compile:")]
    version = re.search(r'^version = "([^"]+)"', (root / "fused_add_rms_norm" / "kernel.toml")
                        .read_text(encoding="utf-8"), re.M).group(1)
    assert lines == ["compile: a residual add feeding one of 5 rms_norm layers runs with it as "
                     f"fused_add_rms_norm {version} (verified like the norm)"], rep.notes
    norm_key = m.model.norm.__dict__["_kz"][0]
    partner = ops.residual_partner(norm_key)
    assert partner is not None and ops.kernel(partner).manifest["op"] == "fused_add_rms_norm"
    unkernelize(m)

    shutil.rmtree(root / "fused_add_rms_norm")
    m2 = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    rep2 = kernelize(m2, kernels_dir=root, compile=True, device="cuda:0", arch="sm_90", verbose=False)
    lines = [n for n in rep2.notes if n.startswith("compile:")]
    assert len(lines) == 1 and "residual adds stay separate kernels" in lines[0] \
        and "no kernel for fused_add_rms_norm" in lines[0], rep2.notes
    # the same norm kernel (same key) as the first model's: the earlier pairing is gone
    assert m2.model.norm.__dict__["_kz"][0] == norm_key
    assert ops.residual_partner(norm_key) is None


@pytest.mark.parametrize("with_fused", [False, True])
def test_kernelize_compile_looks_for_a_fused_add_layer_norm_beside_each_swapped_layer_norm(tmp_path, monkeypatch,
                                                                                           with_fused):
    """GPT-2's LayerNorms: kernelize(..., compile=...) asks the source for a fused_add_layer_norm
    kernel of the same dtype and width; a source without one (a folder with the layer_norm kernel
    alone) leaves the adds to inductor, and the report says so; with the bundled one each
    LayerNorm is paired with it."""
    import shutil
    import transformers
    from conftest import REPO
    from kernelize import core, launch, ops
    from test_training import ForwardStandIn

    def ln_run(op, key):   # core's runner for a stand-in layer_norm kernel: eager's function
        assert op is ops.op("layer_norm")
        return lambda _compiled, x, w, b, eps: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, eps)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    loaded: dict = {}
    monkeypatch.setattr(launch, "compiled", lambda digest, manifest, *a, **k:
                        loaded.setdefault(digest, ForwardStandIn(manifest)))
    monkeypatch.setattr(core, "_stand_in_run", ln_run)
    root = tmp_path / "k"
    for name in ("layer_norm", "fused_add_layer_norm") if with_fused else ("layer_norm",):
        shutil.copytree(REPO / "kernels" / name, root / name)
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=64, n_layer=2, n_head=4, n_positions=32)
    m = transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16)
    rep = kernelize(m, kernels_dir=root, compile=True, device="cuda:0", arch="sm_90", verbose=False)
    lines = [n for n in rep.notes if n.startswith("compile:")]
    ln_key = m.transformer.ln_f.__dict__["_kz"][0]
    if with_fused:
        assert len(lines) == 1 and "runs with it as fused_add_layer_norm" in lines[0], rep.notes
        assert ops.residual_partner(ln_key) is not None
    else:
        assert len(lines) == 1 and "residual adds stay separate kernels" in lines[0] \
            and "no kernel for fused_add_layer_norm" in lines[0], rep.notes
        assert ops.residual_partner(ln_key) is None
    unkernelize(m)
    ops.unpair_residual(ln_key)   # the pairing is the kernel's, process-wide: not left to other tests


# ---- attention masks converted once (exact.hoist_sdpa_masks) --------------------------------

class _MaskedStack(nn.Module):
    """Three attention layers reading one boolean mask, built in the graph (as transformers'
    mask builders do): x (2, seq, 16), `keep` (2, seq) says which keys each batch row keeps."""

    def __init__(self, layers: int = 3):
        super().__init__()
        self.qkv = nn.ModuleList(nn.Linear(16, 48) for _ in range(layers))

    def forward(self, x, keep):
        s = x.shape[1]
        causal = torch.arange(s)[None, :] <= torch.arange(s)[:, None]
        mask = (causal[None] & keep[:, None, :])[:, None]          # (2, 1, s, s), bool
        for lin in self.qkv:
            q, k, v = lin(x).view(2, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
            x = x + torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask).transpose(1, 2).reshape(2, s, 16)
        return x


def _admit_the_cpu_backend(monkeypatch) -> int:
    """Let the mask conversion be hoisted for the backend this torch picks on the CPU (on a GPU
    only cuDNN is admitted), with no conversion cached yet; returns that backend."""
    cpu_choice = exact.probe_backend(torch.float32, torch.device("cpu"))
    monkeypatch.setattr(exact, "HOIST_BACKENDS", frozenset({cpu_choice}))
    monkeypatch.setattr(exact, "_CONVERSIONS", {})
    return cpu_choice


def test_a_mask_read_by_several_attention_calls_is_converted_once(monkeypatch):
    # On the CPU this torch picks its flash backend for a masked call; the test admits it (on a
    # GPU only cuDNN is) so that the hoisting runs here: the conversion traced from torch itself,
    # one conversion for the three calls, and the same bits as eager, with a batch row whose
    # keys after the first are all masked and one with a fully masked row.
    cpu_choice = _admit_the_cpu_backend(monkeypatch)
    conv = exact.mask_conversion(torch.float32, torch.device("cpu"))
    assert conv is not None and conv[0] == cpu_choice
    assert {n.target._opname for n in conv[1].graph.nodes if n.op == "call_function"} <= {
        "where", "logical_not", "scalar_tensor"}
    torch.manual_seed(0)
    m, x = _MaskedStack().eval(), torch.randn(2, 6, 16)
    keep = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    codes = []

    def spy(gm, example_inputs, **kw):
        exact.opaque_sdpa(gm)
        hoisted = exact.hoist_sdpa_masks(gm)
        codes.append((hoisted, gm.code))
        return exact.backend(gm, example_inputs, **kw)

    with torch.no_grad():
        ref = m(x, keep)
        keep_none = keep.clone()
        keep_none[1] = False          # batch row 2: every key masked
        ref2 = m(x, keep_none)
        compiled = torch.compile(m, backend=spy, fullgraph=True)
        got, got2 = compiled(x, keep), compiled(x, keep_none)
        # the attention kernels read the hoisted conversion: one that weighs the keys differently
        # (looked up at run time, no recompilation) changes the compiled model's output
        key = (torch.float32, "cpu", None)
        choice, real = exact._CONVERSIONS[key]
        ramp = torch.linspace(0, 1, x.shape[1])
        exact._CONVERSIONS[key] = (choice, lambda mask: real(mask) + ramp)
        skewed = compiled(x, keep)
    hoisted, code = codes[0]
    assert hoisted == 1
    assert code.count("kernelize.sdpa_mask_bias") == 1 and code.count("kernelize.eager_sdpa_bias") == 3
    assert "kernelize.eager_sdpa.default" not in code
    assert not locate.compare(ref, skewed).identical
    # a mask read by one call is left to it (it converts once anyway)
    codes.clear()
    one = _MaskedStack(layers=1).eval()
    with torch.no_grad():
        assert locate.compare(one(x, keep), torch.compile(one, backend=spy, fullgraph=True)(x, keep)).identical
    assert codes[0][0] == 0 and "kernelize.sdpa_mask_bias" not in codes[0][1]
    assert locate.compare(ref, got).identical
    assert locate.compare(ref2, got2).identical


def test_no_mask_is_hoisted_where_the_backend_is_not_admitted(monkeypatch):
    # the default admits only cuDNN, which a CPU never picks: the calls keep their boolean mask
    monkeypatch.setattr(exact, "_CONVERSIONS", {})
    assert exact.mask_conversion(torch.float32, torch.device("cpu")) is None
    torch.manual_seed(0)
    m, x = _MaskedStack().eval(), torch.randn(2, 6, 16)
    keep = torch.ones(2, 6, dtype=torch.bool)
    counts = []

    def spy(gm, example_inputs, **kw):
        exact.opaque_sdpa(gm)
        counts.append(exact.hoist_sdpa_masks(gm))
        return exact.backend(gm, example_inputs, **kw)

    with torch.no_grad():
        assert locate.compare(m(x, keep), torch.compile(m, backend=spy, fullgraph=True)(x, keep)).identical
    assert counts == [0]


def test_a_llama_decode_step_converts_its_mask_once(monkeypatch):
    # The whole tiny Llama exact-compiled, greedy decode into a static cache: the decode step's
    # graph reads one boolean mask in both layers and converts it once; logits identical with
    # eager. (On the CPU the backend admitted is this torch's CPU choice; on a GPU it is cuDNN:
    # the GPU check, bench/exact_compile.py --phase exact, runs the same on an H200.)
    from transformers import StaticCache
    _admit_the_cpu_backend(monkeypatch)
    hoisted = []
    real = exact.hoist_sdpa_masks

    def counting(gm):
        n = real(gm)
        hoisted.append((n, gm.code.count("kernelize.eager_sdpa_bias.default(")))
        return n

    monkeypatch.setattr(exact, "hoist_sdpa_masks", counting)
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 8))
    ref = _greedy(model, ids, 3, StaticCache(config=model.config, max_cache_len=16))
    exact.exact_compile(model, regional=False)
    got = _greedy(model, ids, 3, StaticCache(config=model.config, max_cache_len=16))
    assert (1, 2) in hoisted, hoisted      # one mask, read by the two layers' attention
    assert locate.compare(ref, got).identical


@pytest.mark.parametrize("layout", ["transposed", "contiguous", "other_value_head",
                                    "backend_writes_contiguous"])
def test_the_sdpa_operators_return_the_layout_their_fake_declares(layout, monkeypatch):
    """`eager_sdpa` and `eager_sdpa_bias` return the query's layout (a model's query is a
    transposed view of its projection: the output then needs no copy before the model's own
    transpose back), contiguous where the value's head size differs; the fake implementation
    declares the same (opcheck compares them), and the values are eager's. A backend that writes
    another layout (`backend_writes_contiguous`, for a transposed query) is copied into it."""
    if layout == "backend_writes_contiguous":
        sdpa = torch.nn.functional.scaled_dot_product_attention
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                            lambda *a, **kw: sdpa(*a, **kw).contiguous())
    torch.manual_seed(0)
    b, s_q, s_k, h, d = 2, 5, 7, 4, 8
    dv = 16 if layout == "other_value_head" else d

    def heads(s, dd):
        x = torch.randn(b, s, h, dd)
        return x.transpose(1, 2) if layout != "contiguous" else x.transpose(1, 2).contiguous()

    q, k, v = heads(s_q, d), heads(s_k, d), heads(s_k, dv)
    mask = torch.rand(b, 1, s_q, s_k) > 0.3
    mask[..., 0] = True
    with torch.no_grad():
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        got = torch.ops.kernelize.eager_sdpa.default(q, k, v, mask, 0.0, False, None, False)
        bias = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
        got_bias = torch.ops.kernelize.eager_sdpa_bias.default(q, k, v, mask, bias, 0.0, False,
                                                               None, False)
    want = torch.empty_like(q).stride() if dv == d else ref.new_empty(ref.shape).stride()
    assert got.stride() == want and got_bias.stride() == want
    assert locate.compare(ref, got).identical and locate.compare(ref, got_bias).identical
    torch.library.opcheck(torch.ops.kernelize.eager_sdpa.default,
                          (q, k, v, mask, 0.0, False, None, False),
                          test_utils=("test_schema", "test_faketensor"))


def test_speed_pin_takes_cpu_lists_and_refuses_others():
    """bench/exact_compile.py --pin CPUS (the candidates' processes on those CPUs only)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import exact_compile as EC
    assert EC.parse_cpus("2,3") == {2, 3} and EC.parse_cpus("0,4-6") == {0, 4, 5, 6}
    with pytest.raises(SystemExit, match="not a CPU list"):
        EC.parse_cpus("two")


def test_bench_cpp_wrapper_suffix_keeps_the_candidate_kind():
    """bench/exact_compile.py's `-cppw` candidates (inductor's C++ wrapper): plain compile with it
    is still plain compile (the CUDA-graph recipe, no generate() comparison), ours is not."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import exact_compile as EC
    assert EC.plain("compile-cppw") and EC.plain("compile-ro-cppw") and EC.plain("compile")
    assert not EC.plain("kernelize+exact-cppw") and not EC.plain("kernelize+exact")


def test_speed_rounds_combine_to_medians():
    """bench/exact_compile.py --isolate --rounds R: each timed cell the median over the rounds
    (each round's value kept beside it), a round that failed counted apart, the candidates in
    the order given whatever order the rounds ran them in."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import exact_compile as EC
    runs = [
        [dict(arch="llama", candidate="compile", prefill_1x512_ms=5.0, decode_b1_ms=6.0,
              prefill_1x512_spread=[4.9, 5.0, 5.1, 5.2], cudagraph_skips=0)],
        [dict(arch="llama", candidate="kernelize+exact", prefill_1x512_ms=4.0, decode_b1_ms=7.0)],
        # round 2 runs them reversed
        [dict(arch="llama", candidate="kernelize+exact", prefill_1x512_ms=9.0, decode_b1_ms=6.5)],
        [dict(arch="llama", candidate="compile", prefill_1x512_ms=5.4, decode_b1_ms=6.2,
              greedy_b1_tok_s=100.0)],
        [dict(arch="llama", candidate="kernelize+exact", prefill_1x512_ms=5.0, decode_b1_ms=6.0)],
        [dict(arch="llama", candidate="compile", error="its process left no row (exit 1)")],
    ]
    rows = EC.combine_rounds(runs, ["compile", "kernelize+exact"])
    assert [r["candidate"] for r in rows] == ["compile", "kernelize+exact"]
    plain, ours = rows
    assert plain["rounds"] == 2 and plain["errors"] == ["its process left no row (exit 1)"]
    assert "error" not in plain
    assert plain["prefill_1x512_ms"] == pytest.approx(5.2) and plain["prefill_1x512_ms_rounds"] == [5.0, 5.4]
    assert plain["greedy_b1_tok_s"] == 100.0 and plain["greedy_b1_tok_s_rounds"] == [100.0]
    assert plain["prefill_1x512_spread"] == [4.9, 5.0, 5.1, 5.2]   # from the first round
    assert ours["rounds"] == 3 and ours["prefill_1x512_ms"] == 5.0 and ours["decode_b1_ms"] == 6.5
    assert ours["decode_b1_ms_rounds"] == [7.0, 6.5, 6.0]
    # every round failed: the row says so
    failed = EC.combine_rounds([[dict(arch="gpt2", candidate="compile", error="boom")]], ["compile"])
    assert failed == [dict(arch="gpt2", candidate="compile", rounds=0, errors=["boom"], error="boom")]


def test_speed_rounds_run_each_candidate_in_alternating_order(tmp_path, monkeypatch):
    """--isolate --rounds 3: three rounds of one process per candidate, the order reversed in
    the second, each in OUT/r<round>/<i>-<candidate>/; the rows combined (the processes stood
    in for by a fake that writes what a speed process writes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import argparse
    import json
    import exact_compile as EC
    ran = []

    def fake_run(cmd, check=False):
        sub, how = Path(cmd[2]), cmd[cmd.index("--candidates") + 1]
        ran.append((sub.relative_to(tmp_path).as_posix(), how))
        sub.mkdir(parents=True)
        row = dict(arch="llama", candidate=how, prefill_1x512_ms=float(len(ran)))
        (sub / "speed.rows.jsonl").write_text(json.dumps(row) + "\n")
        return argparse.Namespace(returncode=0)

    monkeypatch.setattr(EC.subprocess, "run", fake_run)
    monkeypatch.setattr(EC, "ROWS_FILE", None)
    a = argparse.Namespace(out=str(tmp_path), candidates="compile,kernelize+exact", rounds=3, archs="llama")
    rows = EC.phase_speed_isolated(a, ["--phase", "speed"])
    assert ran == [("r0/0-compile", "compile"), ("r0/1-kernelize_exact", "kernelize+exact"),
                   ("r1/1-kernelize_exact", "kernelize+exact"), ("r1/0-compile", "compile"),
                   ("r2/0-compile", "compile"), ("r2/1-kernelize_exact", "kernelize+exact")]
    assert [(r["candidate"], r["prefill_1x512_ms_rounds"], r["prefill_1x512_ms"]) for r in rows] == [
        ("compile", [1.0, 4.0, 5.0], 4.0), ("kernelize+exact", [2.0, 3.0, 6.0], 3.0)]


# Matrix-vector, dot and small matrix products: inductor's decomposition table rewrites them into
# pointwise products and a sum (mv, dot, vdot, addmv always; mm, bmm and addmm of one row by one
# column or a small right operand on the CPU), which adds in another order than eager's BLAS
# (`exact.EAGER_OPS`, `exact.MATRIX_PRODUCTS`); and eager folds a vector product of a sliced batch into
# one mv (`exact.matmuls_folded_as_eager`).
_PRODUCTS = {
    "mv": (lambda a, b, c: a @ b, ((37, 16), (16,))),
    "batched_mv": (lambda a, b, c: a @ b, ((3, 37, 16), (16,))),
    "sliced_batched_mv": (lambda a, b, c: a[..., :16] @ b, ((3, 37, 18), (16,))),
    "dot": (lambda a, b, c: torch.dot(a, b), ((64,), (64,))),
    "addmv": (lambda a, b, c: torch.addmv(c, a, b), ((37, 16), (16,), (37,))),
    "row_by_column": (lambda a, b, c: a @ b, ((1, 64), (64, 1))),
    "bmm_row_by_column": (lambda a, b, c: torch.bmm(a, b), ((3, 1, 64), (3, 64, 1))),
    "addmm_small": (lambda a, b, c: torch.addmm(c, a, b), ((1, 16), (16, 8), (1, 8))),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", sorted(_PRODUCTS))
def test_vector_and_small_matrix_products_keep_eager_bits(case, dtype):
    fn, shapes = _PRODUCTS[case]
    torch.manual_seed(0)
    a, b, *rest = (torch.randn(*s, dtype=dtype) for s in shapes)
    c = rest[0] if rest else None
    torch._dynamo.reset()
    with torch.no_grad():
        ref = fn(a, b, c)
        got = torch.compile(fn, backend=exact.backend, fullgraph=True)(a, b, c)
    assert ref.shape == got.shape
    assert locate.compare(ref, got).identical, f"{case} {dtype}: {locate.compare(ref, got)}"
