"""Training mode for nn.RMSNorm / F.rms_norm layers (rms_norm semantics torch; issue 30,
docs/backward-rms-torch.md), on the CPU with test_training.py's stand-ins: the forward kernel a
stand-in computing F.rms_norm, the backward kernel a recording stand-in of rms_norm_backward
semantics torch whose `dx` / `dw` write eager autograd's gradients of F.rms_norm.

A tiny Llama whose five norms are nn.RMSNorm (the same weights as its LlamaRMSNorm ones):
discovery swaps them for the bundled rms_norm_torch; training mode asks for rms_norm_backward of
semantics torch (the bundled rms_norm_torch_backward), launches its three entries with the ABI's
grids, gives eager's gradients and AdamW steps bit for bit; in f32 too, unlike llama's and gemma's
norms: F.rms_norm is one autograd node on CUDA (``_fused_rms_norm``), whose one dx the engine adds
to the residual stream's gradient as it adds the kernel's. The real entries run only on a GPU
(scripts/rms_torch_backward_probe.py).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from conftest import REPO, bundled_version
from kernelize import core, launch, training
from test_training import (_IS_AVAILABLE, NORMS, ForwardStandIn, RecordingBackward, _backward_folder, _forward_run, _grads,
                           _kz, _llama, _training_lines, train_bit_for_bit)

transformers = pytest.importorskip("transformers")


def _torch_norms(dtype=torch.bfloat16, seed=0):
    """test_training's tiny Llama with its five LlamaRMSNorm layers replaced by nn.RMSNorm of the
    same width, eps and (randomised) weights."""
    m = _llama(torch.float32, seed)
    g = torch.Generator().manual_seed(seed + 1)
    for path in NORMS:
        parent, _, name = path.rpartition(".")
        old = m.get_submodule(path)
        new = torch.nn.RMSNorm(old.weight.shape[0], eps=old.variance_epsilon)
        with torch.no_grad():
            new.weight.copy_(1 + 0.2 * torch.randn(old.weight.shape, generator=g))
        setattr(m.get_submodule(parent), name, new)
    return m.to(dtype)


class _OneNode(torch.autograd.Function):
    """F.rms_norm as CUDA's eager records it: one node (``_fused_rms_norm``'s) returning dx and
    dw as one tensor each (CPU eager decomposes F.rms_norm into pow/mean/rsqrt/mul nodes, whose f32
    input gradient the engine sums in three terms; CUDA's does not)."""

    @staticmethod
    def forward(ctx, x, w, eps):
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            xs, ws = x.detach().requires_grad_(), w.detach().requires_grad_()
            dx, dw = torch.autograd.grad(torch.nn.functional.rms_norm(xs, (x.shape[-1],), ws, ctx.eps), (xs, ws), dy)
        return dx, dw, None


def _cuda_like(m):
    """`m`'s nn.RMSNorm layers as one autograd node each, as on CUDA (the eager reference)."""
    for path in NORMS:
        n = m.get_submodule(path)
        n.forward = lambda x, n=n: _OneNode.apply(x, n.weight, n.eps)
    return m


@pytest.fixture
def faked(monkeypatch):
    """CUDA 'available', the forward kernels stand-ins, and the recording rms_norm_backward
    kernel of semantics torch (the one training mode must load)."""
    bk = RecordingBackward(semantics="torch")
    loaded = []

    def compiled_backward(digest, manifest, source, dtype, device):
        assert (manifest["op"], manifest["semantics"]) == ("rms_norm_backward", "torch")
        loaded.append((manifest["name"], dtype))
        return bk

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(launch, "compiled", lambda digest, manifest, *a, **k: ForwardStandIn(manifest))
    monkeypatch.setattr(core, "_stand_in_run", _forward_run)
    monkeypatch.setattr(training, "compiled_backward", compiled_backward)
    bk.loaded = loaded
    yield bk


@pytest.fixture
def tkernels(tmp_path):
    root = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels" / "rms_norm_torch", root / "rms_norm_torch")
    _backward_folder(root, name="rms_norm_torch_backward")
    return root


def test_the_semantics_maps_to_its_backward_op_and_formula():
    from kernelize.manifest import BACKWARD_OF
    assert BACKWARD_OF[("rms_norm", "torch")] == "rms_norm_backward"
    x, w = torch.randn(3, 8), torch.randn(8)
    assert torch.equal(training.RMS_NORM_FORMULAS["torch"](x, w, 1e-6),
                       torch.nn.functional.rms_norm(x, (8,), w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_training_mode_takes_the_torch_backward_and_gives_eagers_gradients(dtype, tkernels, faked):
    ref, m = _cuda_like(_torch_norms(dtype)), _torch_norms(dtype)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    want = _grads(ref, ids)
    rep = _kz(m, kernels_dir=tkernels, mode="training")
    norms = {e.path: e for e in rep.entries if e.op == "rms_norm"}
    assert sorted(norms) == sorted(NORMS)
    assert all(e.semantics == "torch" and e.status == "replaced" for e in norms.values())
    # in f32 too: no F32_ACCUMULATION for F.rms_norm's one node
    assert all(e.backward is not None and e.backward.name == "rms_norm_torch_backward"
               for e in norms.values()), [e.backward_reasons for e in norms.values()]
    ok = [ln for ln in _training_lines(rep) if f"rms_norm_torch_backward {bundled_version('rms_norm_torch_backward')}" in ln]
    assert len(ok) == 1 and "(5 layers)" in ok[0] and "[rms_norm (torch), " in ok[0], _training_lines(rep)
    got = _grads(m, ids)
    assert set(got) == set(want)
    for n in want:
        assert torch.equal(got[n], want[n]), n
    assert faked.stages() == ["dx", "dwp", "dw"] * 5
    dt = {torch.bfloat16: "bf16", torch.float32: "f32"}[dtype]
    assert {d for _, d in faked.loaded} == {dt}
    # the launches: the ABI's blocks and the hub's grids, 14 rows x 64 columns
    for stage, grid, block, tensors, scalars in faked.calls:
        assert (grid, block) == training.stage_dims(stage, 14, 64, faked.sms, faked.threads_per_sm)
        assert scalars[:2] == (14, 64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_adamw_steps_are_eagers_bit_for_bit(dtype, tkernels, faked, monkeypatch):
    ref, m = _cuda_like(_torch_norms(dtype, 3)).train(), _torch_norms(dtype, 3).train()
    _kz(m, kernels_dir=tkernels, mode="training")
    monkeypatch.setattr(torch.cuda, "is_available", _IS_AVAILABLE)  # swapped; AdamW asks CUDA
    g = torch.Generator().manual_seed(5)
    data = [torch.randint(0, 128, (2, 9), generator=g) for _ in range(3)]
    train_bit_for_bit(ref, m, data)
    assert faked.stages() == ["dx", "dwp", "dw"] * 5 * 3



def test_eagers_two_pass_shapes_take_eager_autograd_and_say_why(tkernels, faked):
    # rows > 65536 with cols / 32 < SMs / 2: eager's two-pass dw, which the kernel does not
    # implement (its dwp would trap): the node computes eager autograd's gradients instead
    assert training.torch_two_pass(65537, 64, 132) and not training.torch_two_pass(65536, 64, 132)
    assert not training.torch_two_pass(65537, 4224, 132)
    norm = torch.nn.RMSNorm(64, eps=1e-6)
    rep = _kz(norm, kernels_dir=tkernels, mode="training")
    assert rep.entries[0].backward is not None
    x = torch.randn(65537, 64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    dy = torch.randn(65537, 64, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad(norm(x), (x, norm.weight), dy)
    assert faked.calls == []
    xs, ws = x.detach().requires_grad_(), norm.weight.detach().requires_grad_()
    want = torch.autograd.grad(torch.nn.functional.rms_norm(xs, (64,), ws, 1e-6), (xs, ws), dy)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert any("65537 x 64" in w and "two-pass" in w for w in training._SAID)
    # one row fewer: the kernel
    x2 = x.detach()[:65536].requires_grad_()
    torch.autograd.grad(norm(x2), (x2,), dy[:65536])
    assert faked.stages() == ["dx", "dwp", "dw"]
