"""Training mode for the gated MLPs (issue 30): a SiLU gated MLP swapped for `silu_mul` gets the
backward op `silu_mul_backward`, a tanh-GELU one (Gemma's GeGLU) swapped for `gelu_tanh_mul`
gets `gelu_tanh_mul_backward` (the same ABI and code path), on the CPU. Every test that is not
about one activation's own model runs for both (the `gated` fixture: `Gated`).

The stand-ins are test_training's: the forward kernels compute the layers' formulas, the
backward kernels record their launches (stage, grid, block, tensors, scalars: exactly what the
CUDA entries would receive) and write eager's gradients (`eager_gated_grads`: eager autograd's
chain for `act(gate) * up` op by op, checked here against torch.autograd bit for bit, so a
gradient that lands in the wrong slot or tensor shows). The real kernels run only on a GPU
(test_gpu.py's training tests, scripts/training_check.py, scripts/gated_backward_probe.py).
"""

from __future__ import annotations

import copy
import logging
import pickle
import shutil
import types
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import kernelize
from conftest import REPO
from kernelize import core, ops, training
from kernelize.sources import DirSource, HubError, HubRateLimited, HubSource, Key, Resolution
from test_training import (assert_double_backward_is_eagers, train_bit_for_bit, ABI, DTYPES, NORMS,
                           RecordingGatedBackward, _backward_folder, _grads, _IS_AVAILABLE, _kz,
                           _llama, _training_lines, eager_gated_grads, gpu_faked,
                           recording_aot_backend)  # noqa: F401 (gpu_faked: a fixture)

transformers = pytest.importorskip("transformers")

MLPS = ["model.layers.0.mlp", "model.layers.1.mlp"]
PROJS = ("gate_proj", "up_proj", "down_proj")
# The ABI of docs/spec.md section 2c (kernel-registry's Op::stages; abi.json has it too), the same
# for both gated backward ops
GRAD_PARAMS = ("T* d_gate, T* d_up, const T* dy, const T* gate, const T* up, long long rows, "
               "long long cols")
GRAD_NAMES = ["d_gate", "d_up", "dy", "gate", "up", "rows", "cols"]


def _gemma_config(**kw):
    """A tiny Gemma (1) config: HF GemmaMLP with hidden_act gelu_pytorch_tanh, eager attention."""
    return transformers.GemmaConfig(hidden_act="gelu_pytorch_tanh", attn_implementation="eager",
                                    num_attention_heads=4, num_key_value_heads=2, **kw)


def _gemma(dtype=torch.bfloat16, seed=0, vocab=128, layers=2):
    """A tiny GemmaForCausalLM (hidden 64, intermediate 160: _llama's sizes), seeded weights."""
    torch.manual_seed(seed)
    cfg = _gemma_config(vocab_size=vocab, hidden_size=64, intermediate_size=160,
                        num_hidden_layers=layers, head_dim=16, max_position_embeddings=64)
    return transformers.GemmaForCausalLM(cfg).to(dtype)


@dataclass(frozen=True)
class Gated:
    """One gated activation's case: its forward op and backward op, the kernels_dir folders
    beside the backward kernel (`forwards`), the norms' backward kernel among them (Llama's;
    Gemma's norms have no kernel here, so they are kept), the op an MLP falls back to without
    its forward kernel (`alternative`, at `alternative_paths`), and its models."""
    act: str
    op: str
    bop: str
    forwards: tuple[str, ...]
    norm_backward: str | None
    alternative: str
    alternative_paths: tuple[str, ...]

    def formula(self, gate, up):
        """Eager's act(gate) * up (training's fallback formula for the op)."""
        return training.GATED_FORMULAS[self.op](gate, up)

    def model(self, dtype=torch.bfloat16, seed=0):
        """A tiny 2-layer CausalLM with this MLP (hidden 64, intermediate 160)."""
        return _llama(dtype, seed) if self.act == "silu" else _gemma(dtype, seed)

    def mlp(self, dtype=torch.float32, seed=3):
        """One HF MLP of this activation (hidden 16, intermediate 24), seeded weights."""
        torch.manual_seed(seed)
        if self.act == "silu":
            from transformers.models.llama.modeling_llama import LlamaMLP
            cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=24, hidden_act="silu",
                                           num_attention_heads=4, num_key_value_heads=2)
            return LlamaMLP(cfg).to(dtype)
        from transformers.models.gemma.modeling_gemma import GemmaMLP
        return GemmaMLP(_gemma_config(hidden_size=16, intermediate_size=24, head_dim=4)).to(dtype)

    def recorder(self, faked):
        """gpu_faked's recording stand-in of this backward op."""
        return faked.gated if self.bop == "silu_mul_backward" else faked.gelu_gated


SILU = Gated("silu", "silu_mul", "silu_mul_backward",
             ("rms_norm_llama", "rms_norm_llama_backward", "silu_mul"), "rms_norm_llama_backward",
             "silu_and_mul", tuple(MLPS))
GELU_TANH = Gated("gelu_tanh", "gelu_tanh_mul", "gelu_tanh_mul_backward", ("gelu_tanh_mul",), None,
                  "gelu_tanh", tuple(f"{p}.act_fn" for p in MLPS))


@pytest.fixture(params=[SILU, GELU_TANH], ids=lambda g: g.act)
def gated(request):
    return request.param


def _folder(root, name, dtypes=None):
    """kernels/<name> copied under root; a backward kernel's manifest narrowed to `dtypes`."""
    if name == "rms_norm_llama_backward":
        return _backward_folder(root)
    d = root / name
    shutil.copytree(REPO / "kernels" / name, d)
    if dtypes is not None:
        toml = (d / "kernel.toml").read_text(encoding="utf-8")
        head, _, _ = toml.partition("\n[entry.")
        tables = ["[entry." + t.strip() + "\n" for t in toml.split("\n[entry.")[1:]]
        keep = [t for t in tables if t[len("[entry."):t.index("]")] in dtypes]
        (d / "kernel.toml").write_text(head + "\n\n" + "\n".join(keep), encoding="utf-8")
    return d


def _kernels(root, *names):
    root.mkdir(parents=True, exist_ok=True)
    for n in names:
        _folder(root, n)
    return root


@pytest.fixture
def kernels(tmp_path, gated):
    """A kernels_dir with the activation's exact forwards and backward kernels (SiLU: the norms'
    too)."""
    return _kernels(tmp_path / "kernels", *gated.forwards, gated.bop)


@pytest.fixture
def no_gated_backward(tmp_path, gated):
    return _kernels(tmp_path / "k", *gated.forwards)


def _ids(rows=2, cols=7, seed=0, vocab=128):
    return torch.randint(0, vocab, (rows, cols), generator=torch.Generator().manual_seed(seed))


def _gate_values(rows, cols, dtype, seed):
    """Gate values spread over the activations' regimes, with exp's overflow and underflow and
    signed zeros in the first row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 4
    special = torch.tensor([0.0, -0.0, 1e-3, -1e-3, 30.0, -30.0, 89.0, -89.0, 100.0, -100.0])
    n = min(cols, special.numel())
    x[0, :n] = special[:n]
    return x.to(dtype)


def _equal_bits(a, b):
    it = torch.int16 if a.dtype != torch.float32 else torch.int32
    return a.dtype == b.dtype and torch.equal(a.view(it), b.view(it))


# ---- the stand-in computes eager's gradients -----------------------------------------------

@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_the_stand_ins_gradients_are_eager_autograds_bit_for_bit(gated, dtype):
    t = DTYPES[dtype]
    g = _gate_values(9, 40, t, 1)
    gen = torch.Generator().manual_seed(2)
    u = torch.randn(9, 40, generator=gen).to(t)
    dy = torch.randn(9, 40, generator=gen).to(t)
    gs, us = g.clone().requires_grad_(), u.clone().requires_grad_()
    act = F.silu if gated.act == "silu" else (lambda x: F.gelu(x, approximate="tanh"))
    want = torch.autograd.grad(act(gs) * us, (gs, us), dy)
    got = eager_gated_grads(dy, g, u, gated.bop)
    for a, b in zip(got, want):
        assert a.dtype == t and _equal_bits(a, b)
    # the formula training falls back to is the same (its eager autograd)
    fb = training.eager_autograd(training.GATED_FORMULAS[gated.op], dy, (g, u), (True, True), False)
    assert all(torch.equal(a, b) for a, b in zip(fb, want))
    # and the two activations' chains differ (the parametrisation has teeth)
    other = "gelu_tanh_mul_backward" if gated.bop == "silu_mul_backward" else "silu_mul_backward"
    assert not torch.equal(eager_gated_grads(dy, g, u, other)[0], got[0])


# ---- the launch ----------------------------------------------------------------------------

def test_the_gated_backward_grid_is_the_registrys(gated):
    # kernel_registry::backward's silu_mul_backward_has_no_workspace_and_a_grid_stride_grid (the
    # gated backward ops share it: Op::is_gated_backward)
    op = gated.bop
    dims = lambda r, c, sms=132, tps=2048: training.stage_dims("grad", r, c, sms, tps, op)  # noqa: E731
    assert dims(1, 1) == ((1, 1, 1), (256, 1, 1))
    assert dims(3, 5)[0] == (1, 1, 1)
    assert dims(1, 256)[0] == (1, 1, 1)
    assert dims(1, 257)[0] == (2, 1, 1)
    assert dims(1000, 256)[0] == (1000, 1, 1)
    assert dims(2112, 256)[0] == (2112, 1, 1)
    assert dims(2113, 256)[0] == (16 * 132, 1, 1)
    assert dims(4096, 8192) == ((16 * 132, 1, 1), (256, 1, 1))
    assert dims(4096, 8192, 1, 256)[0] == (16, 1, 1)   # no reduction: any threads per SM
    assert training.BLOCKS_OF[op] == {"grad": 256} and kernelize.manifest.BACKWARD_OPS[op] == ("grad",)
    assert op in training.GATED_BACKWARD_OPS
    with pytest.raises(ValueError, match="no entry `dx`"):
        training.stage_dims("dx", 4, 4, 132, 2048, op)
    with pytest.raises(ValueError, match="empty problem"):
        dims(0, 4)
    with pytest.raises(ValueError, match="0 SMs"):
        dims(4, 4, 0)
    with pytest.raises(ValueError, match="not a backward op"):
        training.stage_dims("grad", 4, 4, 132, 2048, gated.op)


def test_the_gated_abi_is_the_registrys(gated):
    """abi.json (written by kernel-registry) has the op as this file and the client launch it,
    and the client maps the forward op to it (manifest.BACKWARD_OF, Op::forward)."""
    spec = ABI["backward_ops"][gated.bop]
    assert (spec["forward"], spec["semantics"], spec["takes_eps"]) == (gated.op, ["default"], False)
    assert kernelize.manifest.BACKWARD_OF[(gated.op, "default")] == gated.bop
    assert spec["verdict_depends_on_device"] is False
    assert gated.bop not in kernelize.manifest.VERDICT_ON_DEVICE
    (stage,) = spec["stages"]
    assert (stage["name"], stage["block"], stage["params"], stage["names"]) == \
        ("grad", 256, GRAD_PARAMS, GRAD_NAMES)
    assert [(g["name"], g["stage"]) for g in spec["gradients"]] == [("d_gate", "grad"), ("d_up", "grad")]
    assert set(training.GATED_FORMULAS) == {"silu_mul", "gelu_tanh_mul"}


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("shape,sms", [((6, 40), 132), ((2, 3, 40), 132), ((300, 24), 1)])
def test_the_gated_backward_launches_its_entry_with_the_abi(gated, dtype, shape, sms):
    t = DTYPES[dtype]
    cols = shape[-1]
    rows = int(torch.Size(shape).numel()) // cols
    g = _gate_values(rows, cols, t, 5).reshape(shape)
    gen = torch.Generator().manual_seed(6)
    u = torch.randn(shape, generator=gen).to(t)
    # dy not contiguous (as a transposed matmul's gradient can be)
    dy = torch.randn(*shape[:-2], cols, shape[-2], generator=gen).to(t).transpose(-1, -2)
    assert not dy.is_contiguous()
    bk = RecordingGatedBackward(sms=sms, op=gated.bop)
    d_gate, d_up = training.run_gated_backward(bk, dy, g, u)
    (call,) = bk.calls
    stage, grid, block, tensors, scalars = call
    assert stage == "grad"
    assert (grid, block) == training.stage_dims("grad", rows, cols, sms, 2048, gated.bop)
    assert grid == (max(1, min(-(-rows * cols // 256), 16 * sms)), 1, 1) and block == (256, 1, 1)
    if sms == 1:
        assert grid == (16, 1, 1)   # capped: the kernel strides over the rest
    args = [*tensors, *scalars]
    params = [p.strip() for p in GRAD_PARAMS.split(",")]
    assert len(args) == len(params) == len(GRAD_NAMES)
    for p, a in zip(params, args):
        if "*" in p:
            assert isinstance(a, torch.Tensor) and a.is_contiguous() and a.dtype == t, p
        else:
            assert isinstance(a, int) and not isinstance(a, bool), p
    named = dict(zip(GRAD_NAMES, args))
    assert named["d_gate"] is d_gate and named["d_up"] is d_up
    assert named["gate"] is g and named["up"] is u       # contiguous already: passed as they are
    assert torch.equal(named["dy"], dy) and named["dy"].data_ptr() != dy.data_ptr()
    assert (named["rows"], named["cols"]) == (rows, cols)
    assert d_gate.shape == d_up.shape == g.shape and d_gate.dtype == d_up.dtype == t
    # each gradient in its slot: eager autograd's bits on the contiguous dy the kernel gets (a
    # strided dy takes the CPU's scalar loop, whose f32 activation backward rounds otherwise than
    # its vectorized one; in an MLP dy is down_proj's input gradient, a fresh contiguous matmul)
    gs, us = g.clone().requires_grad_(), u.clone().requires_grad_()
    want = torch.autograd.grad(gated.formula(gs, us), (gs, us), dy.contiguous())
    assert torch.equal(d_gate, want[0]) and torch.equal(d_up, want[1])


def test_a_gate_that_is_not_contiguous_is_passed_as_a_contiguous_copy(gated):
    bk = RecordingGatedBackward(op=gated.bop)
    g = torch.randn(8, 6).to(torch.bfloat16).t()
    u, dy = torch.randn(6, 8).to(torch.bfloat16), torch.randn(6, 8).to(torch.bfloat16)
    d_gate, _ = training.run_gated_backward(bk, dy, g, u)
    passed = bk.calls[0][3][3]
    assert passed.is_contiguous() and torch.equal(passed, g) and d_gate.is_contiguous()


def test_an_empty_gated_batch_launches_nothing_and_shapes_must_agree(gated):
    bk = RecordingGatedBackward(op=gated.bop)
    z = torch.empty(0, 8, dtype=torch.bfloat16)
    d_gate, d_up = training.run_gated_backward(bk, z, z, z)
    assert bk.calls == [] and d_gate.shape == d_up.shape == (0, 8)
    with pytest.raises(ValueError, match=f"{gated.bop}: .* differ in shape"):
        training.run_gated_backward(bk, torch.zeros(2, 8), torch.zeros(2, 8), torch.zeros(2, 4))
    # a kernel of another backward op is not launched as a gated one
    with pytest.raises(ValueError, match="rms_norm_backward is not a gated backward op"):
        training.run_gated_backward(types.SimpleNamespace(op="rms_norm_backward"), z, z, z)


# ---- training mode on a model ----------------------------------------------------------------

def test_a_tiny_models_mlps_get_their_backward_kernel_and_eagers_gradients(gated, kernels, gpu_faked):
    """A tiny Llama (its norms and MLPs all take backward kernels) or Gemma (its MLPs; its
    norms, rms_norm (gemma), have no kernel in the folder and stay eager)."""
    ref, m = gated.model(), gated.model()
    ids = _ids()
    want = _grads(ref, ids)
    rep = _kz(m, kernels_dir=kernels, mode="training")
    mlps = {e.path: e for e in rep.entries if e.op == gated.op}
    norms = {e.path: e for e in rep.entries if e.op == "rms_norm" and e.status == "replaced"}
    assert sorted(mlps) == MLPS and sorted(norms) == (sorted(NORMS) if gated.norm_backward else [])
    assert all(e.status == "replaced" and e.backward is not None and e.backward.name == gated.bop
               for e in mlps.values()), str(rep)
    assert all(e.backward is not None and e.backward.name == gated.norm_backward
               for e in norms.values())
    lines = _training_lines(rep)
    mine = [ln for ln in lines if f"[{gated.op}, bf16, cols=160]" in ln]
    assert len(mine) == 1 and "(2 layers)" in mine[0] and f"{gated.bop} 1.0.0" in mine[0], lines
    assert "run under autograd as the forward kernel + backward" in mine[0]
    # the MLPs' line, and the norms' where they are swapped: every swapped layer has its backward
    assert len(lines) == 1 + bool(norms), lines
    got = _grads(m, ids)
    assert set(got) == set(want)
    for n in want:
        assert torch.equal(got[n], want[n]), n
    # each MLP: one forward launch, one `grad` launch of [2*7, 160] (gate_proj's and up_proj's
    # outputs); the norms as in test_training
    assert kernelize.launch_counts(m) == {p: 1 for p in [*norms, *MLPS]}
    gb = gated.recorder(gpu_faked)
    assert gb.stages() == ["grad", "grad"]
    assert gpu_faked.stages() == (["dx", "dwp", "dw"] * 5 if norms else [])
    other = gpu_faked.gelu_gated if gb is gpu_faked.gated else gpu_faked.gated
    assert other.calls == []   # the other activation's kernel: not this model's
    for _, _, _, tensors, scalars in gb.calls:
        assert scalars == (14, 160) and all(t.shape == (2, 7, 160) for t in tensors)
    # no autograd: the forward kernels alone
    with torch.no_grad():
        m(input_ids=ids, use_cache=False)
    assert kernelize.launch_counts(m) == {p: 2 for p in [*norms, *MLPS]} and len(gb.calls) == 2
    # copies keep the training forward; unkernelize restores every swapped layer
    c = copy.deepcopy(m)
    assert c.model.layers[0].mlp.__dict__["_kernelize_backward"].name == gated.bop
    assert kernelize.unkernelize(m) == 2 + len(norms) and "_kz_bwd" not in m.model.layers[0].mlp.__dict__


def test_the_gradients_reach_gate_proj_and_up_proj_through_the_kernel(gated, kernels, gpu_faked):
    """Which output the kernel's d_gate and d_up are given to: a stand-in that swaps them (or
    writes them as the other's) changes gate_proj's and up_proj's weight gradients."""
    ref, m = gated.mlp(torch.bfloat16), gated.mlp(torch.bfloat16)
    _kz(m, kernels_dir=kernels, mode="training")
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)

    def grads(layer):
        layer.zero_grad(set_to_none=True)
        xs = x.clone().requires_grad_()
        layer(xs).float().square().sum().backward()
        return (xs.grad, *(getattr(layer, p).weight.grad for p in PROJS))

    want = grads(ref)
    got = grads(m)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    gb = gated.recorder(gpu_faked)
    assert gb.stages() == ["grad"]
    # a kernel that wrote d_up where d_gate goes: the gradients differ (the check has teeth)
    real = gb.launch

    def swapped(stage, grid, block, tensors, scalars):
        d_gate, d_up, *rest = tensors
        real(stage, grid, block, (d_up, d_gate, *rest), scalars)
    gb.launch = swapped
    bad = grads(m)
    assert not torch.equal(bad[1], want[1]) and not torch.equal(bad[2], want[2])


def test_only_the_gradients_asked_for_are_returned(gated, kernels, gpu_faked):
    m, ref = gated.mlp(), gated.mlp()
    _kz(m, kernels_dir=kernels, mode="training")
    for layer in (m, ref):
        layer.gate_proj.weight.requires_grad_(False)
    x = torch.randn(3, 16)   # needs no gradient: gate needs none, up does
    m(x).sum().backward()
    ref(x).sum().backward()
    assert m.gate_proj.weight.grad is None
    assert torch.equal(m.up_proj.weight.grad, ref.up_proj.weight.grad)
    gb = gated.recorder(gpu_faked)
    assert gb.stages() == ["grad"]
    # nothing needs a gradient: the forward kernel alone, no autograd node
    m.up_proj.weight.requires_grad_(False)
    m.down_proj.weight.requires_grad_(False)
    y = m(x)
    assert not y.requires_grad and gb.stages() == ["grad"]
    assert kernelize.launch_counts(m) == {"<root>": 2}


def _trained(gated, dtype):
    """The model AdamW trains: SiLU: models/tiny-llama (4 decoder layers: 9 RMSNorm layers, 4
    gated MLPs); tanh GELU: a random tiny Gemma (2 decoder layers, byte vocabulary). Its number
    of MLPs."""
    t = DTYPES[dtype]
    if gated.act == "silu":
        return transformers.AutoModelForCausalLM.from_pretrained(
            REPO / "models" / "tiny-llama", attn_implementation="eager").to(t).train(), 4
    return _gemma(t, seed=1, vocab=256).train(), 2


@pytest.mark.parametrize("dtype", ["bf16", "f32"])   # (f16: bf16's path; slow on a CPU)
def test_adamw_steps_of_a_training_mode_model_are_eagers_bit_for_bit(gated, dtype, kernels,
                                                                      gpu_faked, monkeypatch):
    """Three AdamW steps kernelized in training mode against eager: every loss and every
    parameter bit for bit. In f32 the Llama norms keep their original forward under autograd
    (F32_ACCUMULATION) and the MLPs still take their backward kernel (gate and up each have one
    consumer: nothing to sum)."""
    (eager, n_mlps), (kz, _) = _trained(gated, dtype), _trained(gated, dtype)
    rep = _kz(kz, kernels_dir=kernels, mode="training")
    mlps = [e for e in rep.entries if e.op == gated.op]
    norms = [e for e in rep.entries if e.op == "rms_norm" and e.status == "replaced"]
    assert len(mlps) == n_mlps and len(norms) == (9 if gated.norm_backward else 0)
    assert all(e.backward is not None and e.backward.name == gated.bop for e in mlps), str(rep)
    assert all((e.backward is not None) == (dtype != "f32") for e in norms), str(rep)
    monkeypatch.setattr(torch.cuda, "is_available", _IS_AVAILABLE)  # swapped; AdamW asks CUDA
    data = [_ids(2, 16, seed=s, vocab=256) for s in range(3)]

    train_bit_for_bit(eager, kz, data)
    assert gated.recorder(gpu_faked).stages() == ["grad"] * n_mlps * 3
    assert len(gpu_faked.calls) == (0 if dtype == "f32" else 3 * len(norms) * 3)


def test_a_pickled_training_model_loads_the_gated_backward_again(gated, kernels, gpu_faked):
    ref, m = gated.model(), gated.model()
    ids = _ids(2, 6, seed=3)
    want = _grads(ref, ids)
    _kz(m, kernels_dir=kernels, mode="training")
    loads = len(gpu_faked.loaded)
    twin = pickle.loads(pickle.dumps(m))
    norms = 5 if gated.norm_backward else 0
    assert len(gpu_faked.loaded) == loads + norms + 2, "each layer's backward kernel is loaded again"
    assert twin.model.layers[1].mlp.__dict__["_kernelize_backward"].name == gated.bop
    got = _grads(twin, ids)
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert gated.recorder(gpu_faked).stages() == ["grad", "grad"]


# ---- where no backward kernel qualifies ----------------------------------------------------

def test_no_gated_backward_kernel_keeps_the_mlps_original_forward_and_says_why(
        gated, no_gated_backward, gpu_faked):
    ref, m = gated.model(), gated.model()
    ids = _ids()
    rep = _kz(m, kernels_dir=no_gated_backward, mode="training")
    mlps = [e for e in rep.entries if e.op == gated.op]
    assert len(mlps) == 2 and all(e.status == "replaced" and e.backward is None for e in mlps)
    assert all(any(f"no kernel for {gated.bop}" in r for r in e.backward_reasons) for e in mlps), \
        [e.backward_reasons for e in mlps]
    lines = _training_lines(rep)
    why = [ln for ln in lines if f"[{gated.op}, bf16, cols=160]" in ln]
    assert len(why) == 1 and "(2 layers)" in why[0], lines
    assert f"keep their original forward under autograd: no {gated.bop} kernel" in why[0]
    # the norms still take theirs
    assert all(e.backward is not None for e in rep.entries if e.op == "rms_norm" and e.status == "replaced")
    got, want = _grads(m, ids), _grads(ref, ids)
    assert all(torch.equal(got[n], want[n]) for n in want)
    counts = kernelize.launch_counts(m)
    assert {p: counts[p] for p in MLPS} == {p: 0 for p in MLPS}   # the original forwards ran
    assert gated.recorder(gpu_faked).calls == [] and "_kz_bwd" not in m.model.layers[0].mlp.__dict__
    with torch.no_grad():   # the forward kernel still runs where no gradient is needed
        m(input_ids=ids, use_cache=False)
    assert {p: kernelize.launch_counts(m)[p] for p in MLPS} == {p: 1 for p in MLPS}


def test_an_mlps_fallback_op_has_no_backward_op(gated, tmp_path, gpu_faked):
    """Without the gated forward kernel an MLP falls back to silu_and_mul (SiLU) or a gelu_tanh
    kernel for its act_fn (tanh GELU): silu_and_mul has no backward op; gelu_tanh's
    (gelu_tanh_backward) is not in this folder (the gated op's backward kernel is not it);
    either way no backward kernel is loaded. (With gelu_tanh_backward in the folder the act_fn
    takes it: test_training_activation.)"""
    root = _kernels(tmp_path / "k", gated.alternative, gated.bop)
    rep = _kz(gated.model(), kernels_dir=root, mode="training")
    alts = [e for e in rep.entries if e.path in gated.alternative_paths]
    assert len(alts) == 2 and all(e.op == gated.alternative and e.status == "replaced"
                                  for e in alts), str(rep)
    (line,) = [ln for ln in _training_lines(rep) if gated.alternative in ln]
    from kernelize.manifest import BACKWARD_OF
    bop = BACKWARD_OF.get((gated.alternative, "default"))
    assert (f"keep their original forward under autograd: no {bop} kernel" if bop else
            f"no backward op for {gated.alternative} yet") in line, line
    assert gpu_faked.loaded == []


def test_a_gated_backward_kernel_outside_its_dtypes_is_not_taken(gated, tmp_path, gpu_faked):
    root = _kernels(tmp_path / "k", gated.op)
    _folder(root, gated.bop, dtypes=("f32",))
    rep = _kz(gated.model(), kernels_dir=root, mode="training")
    (line,) = [ln for ln in _training_lines(rep) if f"[{gated.op}, bf16" in ln]
    assert f"no {gated.bop} kernel" in line and "has no bf16 entry" in line, line
    assert gpu_faked.loaded == []


def test_a_gated_backward_kernel_that_fails_to_load_is_reported(gated, kernels, gpu_faked, monkeypatch):
    real = training.compiled_backward

    def broken(digest, manifest, *a, **k):
        if manifest["op"] == gated.bop:
            raise RuntimeError("no NVRTC here")
        return real(digest, manifest, *a, **k)
    monkeypatch.setattr(training, "compiled_backward", broken)
    m = gated.model()
    rep = _kz(m, kernels_dir=kernels, mode="training")
    (line,) = [ln for ln in _training_lines(rep) if f"[{gated.op}" in ln]
    assert "could not be loaded (RuntimeError: no NVRTC here)" in line
    assert all(e.backward is None for e in rep.entries if e.op == gated.op)
    assert all(e.backward is not None for e in rep.entries if e.op == "rms_norm" and e.status == "replaced")
    assert "_kz_bwd" not in m.model.layers[0].mlp.__dict__


def test_a_dry_run_says_which_gated_backward_it_would_take(gated, kernels):
    rep = kernelize.kernelize(gated.model(), kernels_dir=kernels, arch="sm_90", verbose=False,
                              mode="training")
    assert not rep.swapped
    (line,) = [ln for ln in _training_lines(rep) if f"[{gated.op}" in ln]
    assert "would run under autograd" in line and f"{gated.bop} 1.0.0" in line


# ---- eager autograd where the kernel cannot give the gradients -------------------------------

def test_double_backward_through_an_mlp_is_computed_by_eager_autograd_and_said_once(
        gated, kernels, gpu_faked, caplog):
    ref, mlp = gated.mlp(), gated.mlp()
    _kz(mlp, kernels_dir=kernels, mode="training")
    assert "_kz_bwd" in mlp.__dict__
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(4))
    gb = gated.recorder(gpu_faked)
    assert_double_backward_is_eagers(mlp, ref, x, lambda m: (m.gate_proj.weight, m.up_proj.weight),
                                     gb, f"{gated.op} layer", caplog)
    # a first-order backward launches the kernel
    xs = x.clone().requires_grad_()
    mlp(xs).sum().backward()
    assert gb.stages() == ["grad"]


def test_an_incoming_gradient_of_another_dtype_is_computed_by_eager_autograd(gated, caplog):
    """The engine casts a node's incoming gradient to its output's dtype, so this is the
    Function's own guard, called as the engine would call it."""
    bk = RecordingGatedBackward(op=gated.bop)
    g = _gate_values(3, 8, torch.bfloat16, 9)
    u = torch.randn(3, 8).to(torch.bfloat16)
    dy = torch.randn(3, 8)   # f32
    label = f"{gated.bop} 1.0.0 (test)"
    ctx = types.SimpleNamespace(saved_tensors=(g, u), op=gated.op, bk=bk, label=label,
                                needs_input_grad=(True, True) + (False,) * 5)
    # (the engine runs a first-order backward with grad mode off)
    with caplog.at_level(logging.WARNING, logger="kernelize"), torch.no_grad():
        d_gate, d_up, *rest = training.GatedMulFunction.backward(ctx, dy)
    assert bk.calls == [] and rest == [None] * 5
    gs, us = g.clone().requires_grad_(), u.clone().requires_grad_()
    want = torch.autograd.grad(gated.formula(gs, us), (gs, us), dy.to(torch.bfloat16))
    assert torch.equal(d_gate, want[0]) and torch.equal(d_up, want[1])
    msg = ("the incoming gradient is torch.float32 on cpu, the layer's input torch.bfloat16 on cpu: "
           f"eager autograd computes the gradients, not {label}")
    assert msg in training._SAID
    # the same dtype: the kernel, each gradient asked for
    ctx.needs_input_grad = (False, True) + (False,) * 5
    with torch.no_grad():
        d_gate, d_up, *_ = training.GatedMulFunction.backward(ctx, dy.to(torch.bfloat16))
    assert bk.stages() == ["grad"] and d_gate is None and torch.equal(d_up, want[1])


# ---- torch.compile ---------------------------------------------------------------------------

_GATED_OPS_REGISTERED = False


@pytest.fixture
def cpu_gated_ops():
    """CPU implementations of the gated training custom ops (this process only; the package
    registers CUDA ones): the forward formula, and the backward through the recording kernel."""
    global _GATED_OPS_REGISTERED
    if not _GATED_OPS_REGISTERED:
        for op, formula in training.GATED_FORMULAS.items():
            torch.library.register_kernel(
                f"kernelize::{op}_train", "cpu",
                lambda g, u, fkey, bkey, formula=formula: formula(g, u).contiguous())
            torch.library.register_kernel(
                f"kernelize::launch_{op}_backward", "cpu",
                lambda dy, g, u, key: training.run_gated_backward(ops.kernel(key), dy, g, u))
        _GATED_OPS_REGISTERED = True


def test_the_gated_training_ops_are_registered_with_fakes_and_autograd(gated):
    from torch._subclasses.fake_tensor import FakeTensorMode
    train, launch = f"{gated.op}_train", f"launch_{gated.op}_backward"
    for name in (train, launch):
        assert hasattr(torch.ops.kernelize, name)
    assert training.GATED_TRAIN_OPS[gated.op] is not None
    with FakeTensorMode():
        g = torch.empty(2, 3, 8, dtype=torch.bfloat16)
        y = getattr(torch.ops.kernelize, train)(g, g, 1, 2)
        d_gate, d_up = getattr(torch.ops.kernelize, launch)(g, g, g, 2)
    assert (y.shape, d_gate.shape, d_up.shape, d_up.dtype) == ((2, 3, 8), (2, 3, 8), (2, 3, 8),
                                                                torch.bfloat16)


def test_a_training_mode_mlp_compiles_without_graph_breaks(gated, kernels, gpu_faked, cpu_gated_ops,
                                                           monkeypatch):
    ref, mlp = gated.mlp(), gated.mlp()
    _kz(mlp, kernels_dir=kernels, mode="training")
    monkeypatch.setattr(torch.cuda, "is_available", _IS_AVAILABLE)  # swapped; dynamo asks CUDA
    graphs = []
    torch._dynamo.reset()
    f = torch.compile(mlp, backend=recording_aot_backend(graphs), fullgraph=True)
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(5))
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    f(xs).square().sum().backward()
    ref(xr).square().sum().backward()
    assert len(graphs) == 1
    assert f"kernelize.{gated.op}_train" in str(graphs[0].graph)
    # the stand-in computes eager's chain exactly: eager's gradients bit for bit
    assert torch.equal(xs.grad, xr.grad)
    for p in PROJS:
        assert torch.equal(getattr(mlp, p).weight.grad, getattr(ref, p).weight.grad), p
    assert gated.recorder(gpu_faked).stages() == ["grad"]   # the backward op launched the entry
    torch._dynamo.reset()


# ---- the source's answer -------------------------------------------------------------------

class _Hub(HubSource):
    """A HubSource answering from a local kernels folder (no server), recording each query; a
    backward answer carries the verification's GPU figures, as a hub's does."""

    def __init__(self, root, shape=None, fail=None):
        self.url, self.dir, self.shape, self.fail = "http://hub.test", DirSource(root, None), shape, fail
        self.request_widths, self.queries = False, []

    def resolve(self, key, device=None):
        self.queries.append((key.op, device))
        if self.fail is not None and key.op == self.fail[0]:
            raise self.fail[1]
        r = self.dir.resolve(key)
        if r.kernel is not None and key.op in training.BLOCKS_OF and self.shape:
            r.kernel.evidence["device_shape"] = self.shape
        return r


class _Props:
    def __init__(self, sms=114, threads_per_sm=2048):
        self.multi_processor_count, self.max_threads_per_multi_processor = sms, threads_per_sm


def test_the_gated_backward_does_not_depend_on_the_gpus_figures(gated, kernels, gpu_faked, monkeypatch):
    """A gated backward op's verdict holds on any GPU (elementwise, any grid gives its bits): its
    query carries no GPU figures and a verification on a GPU of other figures is taken; the
    norms' backward (verified on 132 SMs) is refused on this 114-SM GPU."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: _Props())
    hub = _Hub(kernels, {"name": "NVIDIA H200", "sm_count": 132, "threads_per_sm": 2048})
    rep = _kz(gated.model(), hub=hub, mode="training")
    assert all(e.backward is not None for e in rep.entries if e.op == gated.op), str(rep)
    assert all(e.backward is None and "verified on a GPU of 132 SMs" in e.backward_reasons[0]
               for e in rep.entries if e.op == "rms_norm" and e.status == "replaced")
    sent = dict(q for q in hub.queries if q[0] in training.BLOCKS_OF)
    assert sent == {gated.bop: None, **({"rms_norm_backward": (114, 2048)} if gated.norm_backward else {})}


def test_a_hub_that_refuses_the_backward_query_leaves_the_layer_under_autograd(gated, kernels,
                                                                             gpu_faked, monkeypatch):
    """A hub from before the op answers 400 for it: the MLPs keep their original forward under
    autograd, with the hub's answer as the reason; a rate limit is still the caller's."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: _Props(132))
    op = gated.bop
    hub = _Hub(kernels, fail=(op, HubError(f"GET /v1/resolve {{...}}: 400 unknown op {op}")))
    rep = _kz(gated.model(), hub=hub, mode="training")
    mlps = [e for e in rep.entries if e.op == gated.op]
    assert len(mlps) == 2 and all(e.status == "replaced" and e.backward is None for e in mlps)
    (line,) = [ln for ln in _training_lines(rep) if f"[{gated.op}" in ln]
    assert f"no {op} kernel: {op}: GET /v1/resolve {{...}}: 400 unknown op" in line
    assert all(e.backward is not None for e in rep.entries if e.op == "rms_norm" and e.status == "replaced")
    limited = _Hub(kernels, fail=(op, HubRateLimited("429", 30.0)))
    with pytest.raises(HubRateLimited):
        _kz(gated.model(), hub=limited, mode="training")
    r = core._resolve_backward(hub, Key(op, "default", "bf16", "sm_90", 160, "bit_exact"), None)
    assert isinstance(r, Resolution) and r.kernel is None and "400 unknown op" in r.excluded[0]


def test_a_training_lock_pins_the_gated_backward_or_the_hubs_reason(gated, kernels, tmp_path):
    """kernelize.lock(..., mode="training") pins the gated backward op beside the forwards (and
    the Llama norms' backward), read offline; a hub that refuses the query: its reason is
    pinned. (Gemma's norms: no kernel in the folder, pinned as such, and no backward asked.)"""
    path = tmp_path / "k.lock.json"
    data = kernelize.lock(gated.model(), hub=_Hub(kernels), path=path, arch="sm_90", mode="training")
    pinned = {r["op"]: r["digest"] is not None for r in data["resolutions"]}
    norms = ({"rms_norm": True, "rms_norm_backward": True} if gated.norm_backward
             else {"rms_norm": False})
    assert pinned == {**norms, gated.op: True, gated.bop: True}
    rep = kernelize.kernelize(gated.model(), lock=path, arch="sm_90", verbose=False, mode="training")
    assert all(e.backward is not None and e.backward.name == gated.bop
               for e in rep.entries if e.op == gated.op), str(rep)
    refused = _Hub(kernels, fail=(gated.bop, HubError("GET /v1/resolve {...}: 400 unknown op")))
    data = kernelize.lock(gated.model(), hub=refused, path=path, arch="sm_90", mode="training")
    (r,) = [r for r in data["resolutions"] if r["op"] == gated.bop]
    assert r["digest"] is None and "400 unknown op" in r["excluded"][0]
    rep = kernelize.kernelize(gated.model(), lock=path, arch="sm_90", verbose=False, mode="training")
    (line,) = [ln for ln in _training_lines(rep) if f"[{gated.op}" in ln]
    assert f"no {gated.bop} kernel" in line and "400 unknown op" in line
