"""Layer discovery and semantics matching on transformers classes built on the CPU."""

import pytest
import torch
from torch import nn

from kernelize.discover import classify_activation, classify_rmsnorm, discover

transformers = pytest.importorskip("transformers")


def sites(model):
    d = discover(model)
    return {(s.path, s.op, s.semantics, s.cols, s.dtype) for s in d.sites}, d


def test_llama_norms_and_gated_mlp(tiny_llama):
    found, d = sites(tiny_llama)
    norms = {p for p, op, sem, cols, dt in found if op == "rms_norm"}
    assert len(norms) == 5 and all(sem == "llama" and cols == 64 and dt == "bf16"
                                   for p, op, sem, cols, dt in found if op == "rms_norm")
    mlps = {p for p, op, *_ in found if op == "silu_mul"}
    assert mlps == {"model.layers.0.mlp", "model.layers.1.mlp"}
    assert all(cols == 160 for p, op, sem, cols, dt in found if op == "silu_mul")
    # the act_fn inside a fused MLP is not a separate silu site
    assert not any(op in ("silu", "silu_and_mul") for _, op, *_ in found)
    # a kernel only offering silu_and_mul (gate and up concatenated) is the fallback
    mlp = next(s for s in d.sites if s.path == "model.layers.0.mlp")
    assert [(a.path, a.op, a.cols, a.dtype, a.module is mlp.module) for a in mlp.alternatives] == [
        ("model.layers.0.mlp", "silu_and_mul", 160, "bf16", True)]
    assert "silu(gate_proj(x)) * up_proj(x)" in mlp.how
    # unfused: the act_fn is a plain silu site
    unfused = {(s.path, s.op) for s in discover(tiny_llama, fuse_gated_mlp=False).sites}
    assert ("model.layers.0.mlp.act_fn", "silu") in unfused
    assert not any(op in ("silu_mul", "silu_and_mul") for _, op in unfused)


def _tiny(family: str):
    """A tiny causal LM of a transformers family whose MLP is gated, random weights, bf16."""
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=1)
    cls_cfg = {"qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {}),
               "mistral": ("MistralForCausalLM", "MistralConfig", {}),
               "gemma": ("GemmaForCausalLM", "GemmaConfig", {"head_dim": 16}),
               "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", {"head_dim": 16}),
               "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", {"head_dim": 16})}[family]
    model_cls, cfg_cls, extra = cls_cfg
    if not hasattr(transformers, model_cls) or not hasattr(transformers, cfg_cls):
        pytest.skip(f"this transformers has no {model_cls}")
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**common, **extra)).to(torch.bfloat16)


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_silu_gated_mlps_of_other_families(family):
    found, d = sites(_tiny(family))
    assert ("model.layers.0.mlp", "silu_mul", "default", 96, "bf16") in found
    mlp = next(s for s in d.sites if s.path == "model.layers.0.mlp")
    assert [a.op for a in mlp.alternatives] == ["silu_and_mul"]


@pytest.mark.parametrize("family", ["gemma", "gemma2", "gemma3"])
def test_gemma_semantics_and_gelu_tanh_mul(family):
    found, d = sites(_tiny(family))
    assert {sem for _, op, sem, *_ in found if op == "rms_norm"} == {"gemma"}
    assert ("model.layers.0.mlp", "gelu_tanh_mul", "default", 96, "bf16") in found
    # the act_fn is covered by the MLP; alone, it is the fallback
    assert not any(op == "gelu_tanh" for _, op, *_ in found)
    mlp = next(s for s in d.sites if s.path == "model.layers.0.mlp")
    assert "gelu_tanh(gate_proj(x)) * up_proj(x)" in mlp.how
    assert [(a.path, a.op, a.cols, a.dtype) for a in mlp.alternatives] == [
        ("model.layers.0.mlp.act_fn", "gelu_tanh", 96, "bf16")]
    unfused = {(s.path, s.op, s.cols) for s in discover(_tiny(family), fuse_gated_mlp=False).sites}
    assert ("model.layers.0.mlp.act_fn", "gelu_tanh", 96) in unfused


def test_a_gated_mlp_computing_something_else_is_not_fused():
    class OddMLP(nn.Module):  # gated shape, SiLU act_fn, but the up projection is squared
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(16, 32, bias=False), nn.Linear(16, 32, bias=False)
            self.down_proj, self.act_fn = nn.Linear(32, 16, bias=False), nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x) ** 2)

    class ErfMLP(OddMLP):  # gated, exact (erf) GELU: no gated op computes it
        def __init__(self):
            super().__init__()
            self.act_fn = nn.GELU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    m = nn.Sequential(OddMLP(), ErfMLP()).to(torch.bfloat16)
    d = discover(m)
    assert not any(s.op in ("silu_mul", "gelu_tanh_mul", "silu_and_mul") for s in d.sites)
    reasons = {s.path: s.reason for s in d.skipped}
    assert "forward is not down_proj(silu(gate_proj(x)) * up_proj(x))" in reasons["0"]
    assert "neither SiLU nor tanh GELU (gelu)" in reasons["1"]
    # their activations are still found on their own
    assert {(s.path, s.op) for s in d.sites} == {("0.act_fn", "silu"), ("1.act_fn", "gelu")}


@pytest.mark.parametrize("act,expect", [("gelu", "gelu"), ("gelu_pytorch_tanh", "gelu_tanh"),
                                        ("gelu_new", None)])
def test_gpt2_layernorm_and_gelu(act, expect):
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                  activation_function=act)
    found, d = sites(transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16))
    lns = [x for x in found if x[1] == "layer_norm"]
    assert len(lns) == 5 and all(x[3] == 64 for x in lns)
    acts = [x for x in found if x[0].endswith("mlp.act")]
    if expect is None:
        # NewGELUActivation computes tanh-GELU with its own formula: not eager F.gelu
        assert not acts
        assert any(s.path.endswith("mlp.act") and "own formula" in s.reason for s in d.skipped)
    else:
        assert {x[1] for x in acts} == {expect} and all(x[3] == 256 for x in acts)


class RenamedLlamaRMSNorm(nn.Module):  # an unknown class with llama casting
    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dt)


class WeightFirstRMSNorm(RenamedLlamaRMSNorm):  # liger-style: weight before the rounding
    def forward(self, x):
        dt = x.dtype
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (xf * r * self.weight.float() + 1e-3).to(dt)


def test_rmsnorm_semantics_by_probe():
    assert classify_rmsnorm(RenamedLlamaRMSNorm(128))[0] == "llama"
    assert classify_rmsnorm(nn.RMSNorm(128, eps=1e-6))[0] == "torch"
    sem, eps, _ = classify_rmsnorm(nn.RMSNorm(128))
    assert sem == "torch" and eps is None  # eps=None: F.rms_norm's own default
    sem, _, why = classify_rmsnorm(WeightFirstRMSNorm(128))
    assert sem is None and "none of the known RMSNorm semantics" in why


def test_activations_and_layernorm_without_affine():
    model = nn.Sequential(nn.Linear(32, 32), nn.SiLU(), nn.GELU(), nn.GELU(approximate="tanh"),
                          nn.LayerNorm(32), nn.LayerNorm(32, elementwise_affine=False),
                          nn.ReLU())
    found, d = sites(model)
    ops = {p: op for p, op, *_ in found}
    assert ops == {"1": "silu", "2": "gelu", "3": "gelu_tanh", "4": "layer_norm"}
    assert any(s.path == "5" and "affine" in s.reason for s in d.skipped)
    assert classify_activation(nn.ReLU())[0] is None


def test_a_resolved_kernel_prints_without_its_source():
    from kernelize.sources import Resolved
    r = Resolved("k", "1.0.0", "sha256:" + "0" * 64, {"name": "k"}, "x" * 100_000, "dir /k",
                 {"class": "bit_exact"})
    text = repr(r)
    assert "k" in text and "bit_exact" in text and len(text) < 500
