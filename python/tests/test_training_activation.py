"""Training's building block for standalone activations (issue 30): `training.activation_train`,
one autograd node whose forward is the swapped activation's launch and whose backward is the
backward kernel of op silu_backward / gelu_backward / gelu_tanh_backward (`grad(dx, dy, x, n)`,
docs/backward-activations.md), on the CPU.

The stand-ins are test_training's kind: the forward "kernel" computes eager's activation, the
backward kernel records its launches (stage, grid, block, tensors, scalars: exactly what the CUDA
entry would receive) and writes eager's dx (torch.autograd of the activation on the tensors of
its ABI slots), so a gradient that lands in the wrong slot, a wrong grid or a wrong count shows.
kernelize(..., mode="training") does not call it yet (a standalone activation keeps its original
forward under autograd: test_training_gated's fallback test); the real kernels run only on a GPU
(scripts/activation_backward_probe.py)."""

from __future__ import annotations

import pytest
import torch

from kernelize import training
from kernelize.pykernel import SharedOnCopy
from test_training import ABI, gpu_faked  # noqa: F401 (gpu_faked: a fixture)

ACTS = ("silu", "gelu", "gelu_tanh")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def eager_dx(act: str, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Eager autograd's dx of the activation at x for dy (its one backward node; grad mode on,
    as a stand-in kernel runs inside a backward)."""
    with torch.enable_grad():
        xr = x.detach().clone().requires_grad_(True)
        (dx,) = torch.autograd.grad(training.ACTIVATION_FORMULAS[act](xr), (xr,), dy)
    return dx


class RecordingActivationBackward(SharedOnCopy):
    """A stand-in activation backward kernel (`op`: <act>_backward): records every launch;
    `grad` writes eager's dx of its `x` slot for its `dy` slot into its `dx` slot."""
    device = torch.device("cpu")

    def __init__(self, act: str, sms=132, threads_per_sm=2048):
        self.act, self.op = act, f"{act}_backward"
        self.sms, self.threads_per_sm = sms, threads_per_sm
        self.calls: list[tuple] = []

    def launch(self, stage, grid, block, tensors, scalars):
        self.calls.append((stage, grid, block, tensors, scalars))
        assert stage == "grad"
        dx, dy, x = tensors
        (n,) = scalars
        assert n == x.numel() == dy.numel() == dx.numel()
        dx.copy_(eager_dx(self.act, dy, x))


def _forward(compiled, x):
    """The stand-in forward launch: eager's activation (the bundled forward kernels' bits)."""
    return training.ACTIVATION_FORMULAS[compiled](x)


def _inputs(dtype, shape=(3, 37), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    return x, dy


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_one_node_gives_eagers_gradient_through_the_kernels_abi(act, dtype):
    bk = RecordingActivationBackward(act)
    x, dy = _inputs(dtype)
    xr = x.clone().requires_grad_(True)
    y = training.activation_train(act, xr, _forward, act, bk)
    assert torch.equal(y, training.ACTIVATION_FORMULAS[act](x)), "the forward launch's output"
    assert y.grad_fn is not None and type(y.grad_fn).__name__ == "ActivationFunctionBackward"
    (got,) = torch.autograd.grad(y, (xr,), dy)
    assert torch.equal(got, eager_dx(act, dy, x))
    # one launch of `grad` with the ABI's arguments: dx, dy, x, then n; the hub's grid and block
    ((stage, grid, block, tensors, scalars),) = bk.calls
    spec = ABI["backward_ops"][f"{act}_backward"]["stages"][0]
    assert stage == spec["name"] == "grad"
    assert len(tensors) + len(scalars) == len(spec["names"]) == 4
    dx, dyt, xt = tensors
    assert dx is got and torch.equal(dyt, dy) and torch.equal(xt, x)
    assert scalars == (x.numel(),)
    key = f"{act}_backward,grad,1,{x.numel()},132,2048"
    want = ABI["backward_dims"]["cases"].get(key)
    assert (grid, block) == training.stage_dims("grad", 1, x.numel(), 132, 2048, f"{act}_backward")
    if want is not None:
        assert (grid[0], list(block)) == (want[0], want[1])
    assert block == (256, 1, 1)


@pytest.mark.parametrize("act", ACTS)
def test_the_launch_grid_is_the_registrys_over_n(act):
    """The grid is the element count's, whatever the tensor's shape: the registry's table (at its
    shapes) through the client's twin."""
    op = f"{act}_backward"
    cases = {k: v for k, v in ABI["backward_dims"]["cases"].items() if k.startswith(op + ",")}
    assert len(cases) >= 100
    for key, (grid, block) in cases.items():
        _, stage, rows, cols, sms, tps = key.split(",")
        rows, cols, sms, tps = int(rows), int(cols), int(sms), int(tps)
        assert training.stage_dims(stage, 1, rows * cols, sms, tps, op) == ((grid, 1, 1), tuple(block)), key


@pytest.mark.parametrize("act", ACTS)
def test_a_double_backward_is_eager_autograds(act):
    """create_graph=True: eager autograd on the saved x, no launch (the kernel's dx is not
    differentiable); first and second derivatives are eager's (eager differentiates its own
    differentiable formula there, not the backward kernel's: other bits than a plain backward)."""
    bk = RecordingActivationBackward(act)
    x, dy = _inputs(torch.float32, seed=1)
    xr = x.clone().requires_grad_(True)
    y = training.activation_train(act, xr, _forward, act, bk)
    (g,) = torch.autograd.grad(y, (xr,), dy, create_graph=True)
    xe = x.clone().requires_grad_(True)
    (ge,) = torch.autograd.grad(training.ACTIVATION_FORMULAS[act](xe), (xe,), dy, create_graph=True)
    assert g.requires_grad and torch.equal(g.detach(), ge.detach())
    (gg,) = torch.autograd.grad(g.sum(), (xr,))
    (gge,) = torch.autograd.grad(ge.sum(), (xe,))
    assert torch.equal(gg, gge), "the second derivative is eager's"
    assert bk.calls == []


def test_the_backward_refuses_what_its_abi_does_not_take():
    bk = RecordingActivationBackward("silu")
    x, dy = _inputs(torch.float32)
    with pytest.raises(ValueError, match="differ in shape"):
        training.run_activation_backward(bk, dy[:2], x)
    other = RecordingActivationBackward("silu")
    other.op = "silu_mul_backward"
    with pytest.raises(ValueError, match="not an activation backward op"):
        training.run_activation_backward(other, dy, x)
    empty = torch.empty(0, 5)
    assert training.run_activation_backward(bk, empty, empty).shape == (0, 5)
    assert bk.calls == []
    # a non-contiguous input: made contiguous before the launch, the gradient eager's on it
    xt, dyt = x.t(), dy.t()
    got = training.run_activation_backward(bk, dyt, xt)
    assert got.shape == xt.shape and torch.equal(got, eager_dx("silu", dyt.contiguous(), xt.contiguous()))
    assert all(t.is_contiguous() for t in bk.calls[0][3])


def test_every_activation_with_a_backward_op_has_a_formula():
    from kernelize.manifest import BACKWARD_OF
    acts = {fwd for (fwd, _), bop in BACKWARD_OF.items() if bop in training.ACTIVATION_BACKWARD_OPS}
    assert acts == set(training.ACTIVATION_FORMULAS) == set(ACTS)


def test_kernelize_in_training_mode_says_a_standalone_activation_keeps_eager_autograd(
        tmp_path, gpu_faked, monkeypatch):
    """kernelize(..., mode="training") on a model with an nn.GELU (a layer swapped by the dtype of
    its calls) and both its kernels in the folder: the forward kernel is taken, no backward kernel
    is loaded, and the report says training mode does not run gelu_backward yet; the gradients
    are eager's (its original forward runs under autograd)."""
    import shutil

    import kernelize
    from conftest import REPO
    import test_training
    from test_training import _kz, _training_lines
    # the stand-in forward kernel computes eager's GELU (where no gradient is needed)
    monkeypatch.setitem(test_training.FORWARD_FORMULAS, "gelu", torch.nn.functional.gelu)
    for name in ("gelu", "gelu_backward"):
        shutil.copytree(REPO / "kernels" / name, tmp_path / name)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    ref = torch.nn.Sequential(*(m for m in __import__("copy").deepcopy(model)))
    rep = _kz(model, kernels_dir=tmp_path, mode="training")
    (gelu,) = {e.status for e in rep.entries if e.path == "1"}
    assert gelu == "replaced", str(rep)
    (line,) = [ln for ln in _training_lines(rep) if "[gelu]" in ln]
    assert "training mode does not run gelu_backward yet" in line, line
    assert gpu_faked.loaded == []
    x = torch.randn(4, 16)
    got = torch.autograd.grad(model(x).sum(), list(model.parameters()))
    want = torch.autograd.grad(ref(x).sum(), list(ref.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert kernelize.launch_counts(model).get("1", 0) == 0   # the original forward ran
    with torch.no_grad():   # the forward kernel still runs where no gradient is needed
        model(x)
    assert kernelize.launch_counts(model)["1"] == 1
