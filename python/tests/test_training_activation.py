"""Training's building block for standalone activations (issue 30): `training.activation_train`,
one autograd node whose forward is the swapped activation's launch and whose backward is the
backward kernel of op silu_backward / gelu_backward / gelu_tanh_backward (`grad(dx, dy, x, n)`,
docs/backward-activations.md), on the CPU.

The stand-ins are test_training's kind: the forward "kernel" computes eager's activation, the
backward kernel records its launches (stage, grid, block, tensors, scalars: exactly what the CUDA
entry would receive) and writes eager's dx (torch.autograd of the activation on the tensors of
its ABI slots), so a gradient that lands in the wrong slot, a wrong grid or a wrong count shows.
kernelize(..., mode="training") swaps a standalone activation whose eager autograd is that one
node for it (the tests at the end: the swap, the report's lines and fallbacks, eager's gradients
bit for bit through the node, double backward); the real kernels run only on a GPU
(scripts/activation_backward_probe.py; test_gpu.py's tiny GPT-2 training test, whose GELUs take
gelu_backward)."""

from __future__ import annotations

import pytest
import torch

from kernelize import training
from test_training import (ABI, RecordingActivationBackward, eager_dx,  # noqa: F401
                           gpu_faked)  # (gpu_faked: a fixture)

ACTS = ("silu", "gelu", "gelu_tanh")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_the_stand_ins_dx_is_eager_autograds_bit_for_bit(act, dtype):
    x, dy = _inputs(dtype, shape=(7, 33), seed=3)
    x[0, :6] = torch.tensor([0.0, -0.0, 30.0, -30.0, 100.0, -100.0]).to(dtype)
    xr = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(training.ACTIVATION_FORMULAS[act](xr), (xr,), dy)
    got = eager_dx(act, dy, x)
    assert got.dtype == dtype and torch.equal(got, want)
    other = {"silu": "gelu", "gelu": "gelu_tanh", "gelu_tanh": "silu"}[act]
    assert not torch.equal(eager_dx(other, dy, x), got)


# ---- kernelize(..., mode="training") -----------------------------------------------------

class UpcastSiLU(torch.nn.Module):
    """A SiLU computed in f32 and rounded back: in bf16 the forward's bits are F.silu's
    (discovery swaps it), but its eager autograd is ToCopyBackward0 <- SiluBackward0 <-
    ToCopyBackward0, not the one node a silu_backward kernel gives the bits of."""

    def forward(self, x):
        return torch.nn.functional.silu(x.float()).to(x.dtype)


#: A layer of each activation (torch's modules and HF's), with the op discovery finds.
LAYERS = {
    "nn.SiLU": ("silu", lambda: torch.nn.SiLU()),
    "nn.GELU": ("gelu", lambda: torch.nn.GELU()),
    "nn.GELU(tanh)": ("gelu_tanh", lambda: torch.nn.GELU(approximate="tanh")),
    "hf.GELUActivation": ("gelu", lambda: __import__("transformers").activations.GELUActivation()),
    "hf.GELUTanh": ("gelu_tanh", lambda: __import__("transformers").activations.GELUTanh()),
    "hf.SiLUActivation": ("silu", lambda: __import__("transformers").activations.SiLUActivation()),
}


def _act_folder(root, act, backward=True, backward_constraints=""):
    """A kernels_dir with the bundled forward kernel of `act` and (`backward`) its backward
    kernel, the latter's manifest given `backward_constraints`."""
    import shutil

    from conftest import REPO
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "kernels" / act, root / act)
    if backward:
        d = root / f"{act}_backward"
        shutil.copytree(REPO / "kernels" / f"{act}_backward", d)
        if backward_constraints:
            with open(d / "kernel.toml", "a", encoding="utf-8") as f:
                f.write(backward_constraints)
    return root


def _mlp(layer, dtype=torch.float32, seed=0):
    """Linear(16, 32), the activation layer, Linear(32, 16): the activation at path "1", its
    input a Linear's output (so it needs a gradient), its dtype the model's."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), layer, torch.nn.Linear(32, 16)).to(dtype)


def _param_grads(model, x, dy):
    model.zero_grad(set_to_none=True)
    xs = x.clone().requires_grad_(True)
    model(xs).backward(dy)
    return [xs.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_training_mode_runs_an_activation_as_its_forward_and_backward_kernels(
        tmp_path, gpu_faked, name, dtype):
    """kernelize(..., mode="training") on a model with a standalone activation and both its
    kernels in the folder: the layer takes the backward kernel (the report's training line
    names it), under autograd it is one ActivationFunction node whose backward launches `grad`
    once with the ABI's arguments, and every gradient (the model's input, both Linears') is
    eager autograd's bit for bit; where no gradient is needed the forward kernel alone runs."""
    import copy

    import kernelize
    from kernelize import launch_counts
    from test_training import DTYPES as DT, _kz, _training_lines
    act, make = LAYERS[name]
    t = DT[dtype]
    model = _mlp(make(), t)
    ref = copy.deepcopy(model)
    rep = _kz(model, kernels_dir=_act_folder(tmp_path / "k", act), mode="training")
    (e,) = [e for e in rep.entries if e.path == "1"]
    assert (e.op, e.status, e.dtype) == (act, "replaced", dtype), str(rep)
    assert e.backward is not None and e.backward.name == f"{act}_backward", e.backward_reasons
    (line,) = [ln for ln in _training_lines(rep) if f"[{act}, {dtype}, cols={e.cols}]" in ln]
    assert (f"training: 1 [{act}, {dtype}, cols={e.cols}] runs under autograd as the forward kernel + "
            f"backward {act}_backward 1.0.0") in line, line
    assert [d for d, _ in gpu_faked.loaded] == [e.backward.digest]
    bk = gpu_faked.acts[act]
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 16, generator=g) * 3).to(t)
    dy = torch.randn(5, 16, generator=g).to(t)
    y = model[1](model[0](x.clone().requires_grad_(True)))
    assert type(y.grad_fn).__name__ == "ActivationFunctionBackward"
    got, want = _param_grads(model, x, dy), _param_grads(ref, x, dy)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
    # the second call's backward (the first built y above, whose backward never ran)
    ((stage, grid, block, (gdx, gdy, gx), scalars),) = bk.calls
    assert (stage, block, scalars) == ("grad", (256, 1, 1), (5 * 32,))
    assert gx.shape == gdy.shape == gdx.shape == (5, 32) and gx.dtype == t
    assert launch_counts(model)["1"] == 2
    with torch.no_grad():   # no gradient needed: the forward kernel, no node
        assert torch.equal(model(x), ref(x))
    assert launch_counts(model)["1"] == 3 and len(bk.calls) == 1
    kernelize.unkernelize(model)


def test_the_activation_node_check():
    """Eager's graph of the layer must be the activation's one node on its input: torch's and
    HF's layers that call F.silu / F.gelu pass, in every dtype; a layer whose forward has F.silu's
    bits but records other nodes (UpcastSiLU), HF's NewGELUActivation (GPT-2's gelu_new, its own
    formula) and a GELU of the other approximation do not, each with the node found."""
    import transformers
    for name, (act, make) in LAYERS.items():
        for t in DTYPES:
            assert training.activation_node_check(make(), act, t) is None, (name, t)
    why = training.activation_node_check(UpcastSiLU(), "silu", torch.bfloat16)
    assert "not one SiluBackward0 on its input" in why and "ToCopyBackward0" in why, why
    why = training.activation_node_check(transformers.activations.NewGELUActivation(), "gelu_tanh",
                                         torch.float32)
    assert "GeluBackward0(approximate='tanh')" in why and "MulBackward0" in why, why
    why = training.activation_node_check(torch.nn.GELU(), "gelu_tanh", torch.float32)
    assert "GeluBackward0(approximate='tanh')" in why and "(the probe's output node: GeluBackward0)" in why
    assert "silu_backward kernel gives that node's bits only" in training.activation_node_check(
        torch.nn.Identity(), "silu", torch.float32)


def test_an_activation_whose_autograd_is_another_graph_keeps_its_original_forward(tmp_path,
                                                                                  gpu_faked):
    """UpcastSiLU in bf16: swapped for silu (its forward's bits are F.silu's), but in training
    mode no backward kernel is loaded, the report says why, and under autograd its original
    forward runs (eager's gradients, no launch)."""
    import copy

    import kernelize
    from test_training import _kz, _training_lines
    model = _mlp(UpcastSiLU(), torch.bfloat16)
    ref = copy.deepcopy(model)
    rep = _kz(model, kernels_dir=_act_folder(tmp_path / "k", "silu"), mode="training")
    (e,) = [e for e in rep.entries if e.path == "1"]
    assert (e.op, e.status, e.backward) == ("silu", "replaced", None), str(rep)
    (line,) = [ln for ln in _training_lines(rep) if "[silu, bf16, cols=4096]" in ln]
    assert ("keeps its original forward under autograd: its eager autograd is not one "
            "SiluBackward0 on its input") in line, line
    assert e.backward_reasons and "ToCopyBackward0" in e.backward_reasons[0]
    assert gpu_faked.loaded == []
    x, dy = torch.randn(4, 16).bfloat16(), torch.randn(4, 16).bfloat16()
    got, want = _param_grads(model, x, dy), _param_grads(ref, x, dy)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert kernelize.launch_counts(model)["1"] == 0 and gpu_faked.acts["silu"].calls == []


def test_no_backward_kernel_keeps_the_original_forward_under_autograd_and_says_why(
        tmp_path, gpu_faked):
    """The forward kernel alone in the folder: the activation is swapped, the report's training
    line says there is no gelu_backward kernel, the gradients are eager's (its original forward
    under autograd) and the forward kernel still runs where no gradient is needed."""
    import copy

    import kernelize
    from test_training import _kz, _training_lines
    model = _mlp(torch.nn.GELU())
    ref = copy.deepcopy(model)
    rep = _kz(model, kernels_dir=_act_folder(tmp_path / "k", "gelu", backward=False), mode="training")
    (e,) = [e for e in rep.entries if e.path == "1"]
    assert e.status == "replaced" and e.backward is None and e.backward_reasons
    (line,) = [ln for ln in _training_lines(rep) if "[gelu, f32, cols=4096]" in ln]
    assert "keeps its original forward under autograd: no gelu_backward kernel" in line, line
    x, dy = torch.randn(4, 16), torch.randn(4, 16)
    got, want = _param_grads(model, x, dy), _param_grads(ref, x, dy)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert kernelize.launch_counts(model).get("1", 0) == 0
    with torch.no_grad():
        model(x)
    assert kernelize.launch_counts(model)["1"] == 1


def test_a_backward_kernel_that_fails_to_load_is_reported(tmp_path, gpu_faked, monkeypatch):
    import kernelize
    from test_training import _kz, _training_lines

    def fail(*a, **k):
        raise RuntimeError("no NVRTC here")
    monkeypatch.setattr(training, "compiled_backward", fail)
    model = _mlp(torch.nn.SiLU())
    rep = _kz(model, kernels_dir=_act_folder(tmp_path / "k", "silu"), mode="training")
    (line,) = [ln for ln in _training_lines(rep) if "[silu, f32, cols=4096]" in ln]
    assert "silu_backward 1.0.0 could not be loaded (RuntimeError: no NVRTC here)" in line, line
    x = torch.randn(2, 16, requires_grad=True)
    model(x).sum().backward()
    assert x.grad is not None and kernelize.launch_counts(model).get("1", 0) == 0


def test_a_dry_run_says_which_backward_it_would_take(tmp_path):
    import kernelize
    from test_training import _training_lines
    model = _mlp(torch.nn.GELU(approximate="tanh"), torch.bfloat16)
    rep = kernelize.kernelize(model, kernels_dir=_act_folder(tmp_path / "k", "gelu_tanh"),
                              arch="sm_90", verbose=False, mode="training")
    (line,) = [ln for ln in _training_lines(rep) if "[gelu_tanh, bf16, cols=4096]" in ln]
    assert "would run under autograd as the forward kernel + backward gelu_tanh_backward 1.0.0" in line


def test_an_element_count_outside_the_backward_kernels_constraints_runs_the_original_forward(
        tmp_path, gpu_faked):
    """The backward kernel's manifest takes at most 4096 elements (the width it is resolved at,
    discovery's 4096 here): a call of 2 x 32 elements runs both kernels, one of 200 x 32 the
    original forward under autograd (eager's gradients, no launch, not counted)."""
    import copy

    import kernelize
    from test_training import _kz
    model = _mlp(torch.nn.SiLU())
    ref = copy.deepcopy(model)
    _kz(model, kernels_dir=_act_folder(tmp_path / "k", "silu",
                                      backward_constraints="\n[constraints]\ncols_max = 4096\n"),
        mode="training")
    assert "_kz_bwd" in model[1].__dict__
    bk = gpu_faked.acts["silu"]
    for rows, launched in ((2, 1), (200, 0)):
        bk.calls.clear()
        x, dy = torch.randn(rows, 16), torch.randn(rows, 16)
        got, want = _param_grads(model, x, dy), _param_grads(ref, x, dy)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert len(bk.calls) == launched, rows
    assert kernelize.launch_counts(model)["1"] == 1


@pytest.mark.parametrize("act", ACTS)
def test_a_double_backward_through_a_kernelized_activation_is_eager_autograds(
        act, tmp_path, gpu_faked, caplog):
    import copy

    from test_training import _kz, assert_double_backward_is_eagers
    layer = {"silu": torch.nn.SiLU(), "gelu": torch.nn.GELU(),
             "gelu_tanh": torch.nn.GELU(approximate="tanh")}[act]
    model = _mlp(layer)
    ref = copy.deepcopy(model)
    _kz(model, kernels_dir=_act_folder(tmp_path / "k", act), mode="training")
    assert "_kz_bwd" in model[1].__dict__
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(4))
    assert_double_backward_is_eagers(model, ref, x, lambda m: tuple(m.parameters()),
                                     gpu_faked.acts[act], f"{act} layer", caplog)


def test_only_a_call_needing_a_gradient_builds_the_node(tmp_path, gpu_faked):
    """An input that needs no gradient (the activation first in the model, the model's input
    plain) runs the forward kernel, no node; a frozen model under autograd the same."""
    import kernelize
    from test_training import _kz
    model = torch.nn.Sequential(torch.nn.SiLU(), torch.nn.Linear(16, 4))
    _kz(model, kernels_dir=_act_folder(tmp_path / "k", "silu"), mode="training")
    assert "_kz_bwd" in model[0].__dict__
    y = model[0](torch.randn(2, 16))
    assert y.grad_fn is None and kernelize.launch_counts(model)["0"] == 1
    model(torch.randn(2, 16)).sum().backward()
    assert model[1].weight.grad is not None and gpu_faked.acts["silu"].calls == []


def test_a_layer_swapped_by_the_dtype_of_its_calls_takes_its_backward_at_its_first_call(
        tmp_path, gpu_faked):
    """nn.GELU kernelized alone (a model with no parameters: swapped by the dtype of its calls,
    resolved for bf16, f16 and f32): each dtype's backward kernel is resolved too (the report
    says so, one line per dtype) and loaded with its forward kernel at the first call in that
    dtype; under autograd a call in a dtype with both runs the node (eager's gradient, one
    `grad`), a dtype with none (f64) its original forward."""
    import kernelize
    from test_training import _kz, _training_lines
    model = torch.nn.GELU()
    rep = _kz(model, kernels_dir=_act_folder(tmp_path / "k", "gelu"), mode="training")
    assert {e.status for e in rep.entries} == {"replaced"} and all(e.by_call for e in rep.entries)
    assert all(e.backward is not None and e.backward.name == "gelu_backward" for e in rep.entries)
    lines = [ln for ln in _training_lines(rep) if "[gelu, " in ln]
    assert len(lines) == 3 and all(
        "runs under autograd as the forward kernel + backward gelu_backward 1.0.0" in ln
        and "(both loaded at its first call in " in ln for ln in lines), lines
    assert gpu_faked.loaded == []   # nothing loaded before a call
    bk = gpu_faked.acts["gelu"]
    for t in (torch.float32, torch.bfloat16):
        x = (torch.randn(4, 16) * 3).to(t).requires_grad_(True)
        dy = torch.randn(4, 16).to(t)
        y = model(x)
        assert type(y.grad_fn).__name__ == "ActivationFunctionBackward"
        (got,) = torch.autograd.grad(y, (x,), dy)
        assert torch.equal(got, eager_dx("gelu", dy, x.detach()))
    assert [c[0] for c in bk.calls] == ["grad", "grad"]
    assert [dt for _, dt in gpu_faked.loaded] == ["f32", "bf16"]
    assert kernelize.launch_counts(model)["<root>"] == 2
    x64 = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    model(x64).sum().backward()
    assert x64.grad is not None and len(bk.calls) == 2


def test_a_pickled_by_call_layer_keeps_its_backward_kernels(tmp_path, gpu_faked):
    import copy
    import pickle

    from test_training import _kz
    model = torch.nn.SiLU()
    _kz(model, kernels_dir=_act_folder(tmp_path / "k", "silu"), mode="training")
    for again in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert set(again.__dict__["_kz_by_call_bwd"]) == {"bf16", "f16", "f32"}
        x = torch.randn(2, 8, requires_grad=True)
        again(x).sum().backward()
        assert torch.equal(x.grad, eager_dx("silu", torch.ones(2, 8), x.detach()))
    assert [c[0] for c in gpu_faked.acts["silu"].calls] == ["grad", "grad"]


def test_a_by_call_backward_kernel_that_fails_to_load_leaves_the_forward_kernel(
        tmp_path, gpu_faked, monkeypatch, caplog):
    import logging

    import kernelize
    from test_training import _kz

    def fail(*a, **k):
        raise RuntimeError("no NVRTC here")
    monkeypatch.setattr(training, "compiled_backward", fail)
    model = torch.nn.SiLU()
    _kz(model, kernels_dir=_act_folder(tmp_path / "k", "silu"), mode="training")
    x = torch.randn(2, 8, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="kernelize"):
        model(x).sum().backward()
    assert x.grad is not None and kernelize.launch_counts(model)["<root>"] == 0
    assert any("its backward kernel silu_backward 1.0.0 could not be loaded" in r.getMessage()
               for r in caplog.records)
    with torch.no_grad():
        model(x)
    assert kernelize.launch_counts(model)["<root>"] == 1


_OPS_REGISTERED = False


@pytest.fixture
def cpu_activation_ops():
    """CPU implementations of the activations' training custom ops (this process only; the
    package registers CUDA ones): the forward formula, and the backward through the recording
    kernel."""
    global _OPS_REGISTERED
    if not _OPS_REGISTERED:
        from kernelize import ops
        for act in ACTS:
            torch.library.register_kernel(
                f"kernelize::{act}_train", "cpu",
                lambda x, fkey, bkey, act=act: training.ACTIVATION_FORMULAS[act](x).contiguous())
            torch.library.register_kernel(
                f"kernelize::launch_{act}_backward", "cpu",
                lambda dy, x, key: training.run_activation_backward(ops.kernel(key), dy, x))
        _OPS_REGISTERED = True


def test_the_activation_training_ops_are_registered_with_fakes_and_autograd():
    from torch._subclasses.fake_tensor import FakeTensorMode
    for act in ACTS:
        assert hasattr(torch.ops.kernelize, f"{act}_train")
        assert hasattr(torch.ops.kernelize, f"launch_{act}_backward")
        assert training.ACTIVATION_TRAIN_OPS[act] is not None
    with FakeTensorMode():
        x = torch.empty(3, 8, dtype=torch.bfloat16)
        y = torch.ops.kernelize.gelu_train(x, 1, 2)
        dx = torch.ops.kernelize.launch_gelu_backward(x, x, 2)
    assert (y.shape, dx.shape, dx.dtype) == ((3, 8), (3, 8), torch.bfloat16)


@pytest.mark.parametrize("act", ACTS)
def test_training_mode_compiles_an_activation_without_graph_breaks(act, tmp_path, gpu_faked,
                                                                   cpu_activation_ops, monkeypatch):
    """torch.compile (fullgraph, AOTAutograd) of a training-mode model: the activation is the
    custom op kernelize::<act>_train, its backward kernelize::launch_<act>_backward launches the
    kernel's `grad` once, and the gradients are eager's bit for bit (the stand-in computes
    eager's dx; the Linears are traced as eager runs them)."""
    import copy

    from test_training import _IS_AVAILABLE, _kz, recording_aot_backend
    layer = {"silu": torch.nn.SiLU(), "gelu": torch.nn.GELU(),
             "gelu_tanh": torch.nn.GELU(approximate="tanh")}[act]
    model = _mlp(layer)
    ref = copy.deepcopy(model)
    _kz(model, kernels_dir=_act_folder(tmp_path / "k", act), mode="training")
    monkeypatch.setattr(torch.cuda, "is_available", _IS_AVAILABLE)  # swapped; dynamo asks CUDA
    graphs = []
    torch._dynamo.reset()
    f = torch.compile(model, backend=recording_aot_backend(graphs), fullgraph=True)
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(5))
    dy = torch.randn(5, 16, generator=torch.Generator().manual_seed(6))
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    f(xs).backward(dy)
    ref(xr).backward(dy)
    assert len(graphs) == 1
    assert f"kernelize.{act}_train" in str(graphs[0].graph)
    assert torch.equal(xs.grad, xr.grad)
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert [c[0] for c in gpu_faked.acts[act].calls] == ["grad"]
    torch._dynamo.reset()


def test_a_geglu_mlps_act_fn_swapped_alone_takes_the_gelu_tanh_backward(tmp_path, gpu_faked):
    """A tanh-GELU gated MLP (HF GemmaMLP) without a gelu_tanh_mul kernel: its act_fn (HF
    GELUTanh) alone is swapped for gelu_tanh, and with gelu_tanh_backward in the folder it runs
    both kernels under autograd; the MLP's gradients are eager's bit for bit."""
    import copy

    import transformers
    from transformers.models.gemma.modeling_gemma import GemmaMLP

    from test_training import _kz, _training_lines
    torch.manual_seed(3)
    cfg = transformers.GemmaConfig(hidden_size=16, intermediate_size=24, head_dim=4,
                                   hidden_act="gelu_pytorch_tanh", num_attention_heads=4,
                                   num_key_value_heads=2)
    mlp = GemmaMLP(cfg).to(torch.bfloat16)
    ref = copy.deepcopy(mlp)
    rep = _kz(mlp, kernels_dir=_act_folder(tmp_path / "k", "gelu_tanh"), mode="training")
    (e,) = [e for e in rep.entries if e.path == "act_fn"]
    assert (e.op, e.status, e.backward.name) == ("gelu_tanh", "replaced", "gelu_tanh_backward"), str(rep)
    (line,) = [ln for ln in _training_lines(rep) if ln.startswith("training: act_fn ")]
    assert "runs under autograd as the forward kernel + backward gelu_tanh_backward" in line, line
    x = torch.randn(5, 16).bfloat16()
    dy = torch.randn(5, 16).bfloat16()
    got, want = _param_grads(mlp, x, dy), _param_grads(ref, x, dy)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert [c[0] for c in gpu_faked.acts["gelu_tanh"].calls] == ["grad"]


@pytest.mark.parametrize("dtype", ["bf16", "f32"])   # (f16: bf16's path; slow on a CPU)
def test_the_shipped_tiny_gpt2_trains_as_eager_with_the_gelu_and_layer_norm_backward(
        tmp_path, gpu_faked, dtype, monkeypatch):
    """The CPU twin of test_gpu.py's tiny GPT-2 training test: models/tiny-gpt2 (HF
    GELUActivation, F.gelu) kernelized in training mode with layer_norm, gelu and both backward
    kernels (stand-ins), three AdamW steps against eager: every loss and every parameter bit for
    bit; each step runs gelu_backward's `grad` once per block (4) beside LayerNorm's entries (9)."""
    import shutil

    import transformers

    from conftest import REPO
    from test_training import DTYPES as DT, _IS_AVAILABLE, _kz, train_bit_for_bit
    from test_training_layer_norm import _ids
    t = DT[dtype]
    root = _act_folder(tmp_path / "k", "gelu")
    for name in ("layer_norm", "layer_norm_backward"):
        shutil.copytree(REPO / "kernels" / name, root / name)

    def load():
        return transformers.AutoModelForCausalLM.from_pretrained(
            REPO / "models" / "tiny-gpt2", attn_implementation="eager").to(t).train()
    eager, kz = load(), load()
    rep = _kz(kz, kernels_dir=root, mode="training")
    gelus = [e for e in rep.entries if e.op == "gelu"]
    assert [e.path for e in gelus] == [f"transformer.h.{i}.mlp.act" for i in range(4)], str(rep)
    assert all(e.backward is not None and e.backward.name == "gelu_backward" for e in gelus)
    assert all(e.backward is not None for e in rep.entries if e.op == "layer_norm")
    monkeypatch.setattr(torch.cuda, "is_available", _IS_AVAILABLE)  # swapped; AdamW asks CUDA
    data = [_ids(2, 16, seed=s, vocab=256) for s in range(3)]
    train_bit_for_bit(eager, kz, data)
    assert [c[0] for c in gpu_faked.acts["gelu"].calls] == ["grad"] * 4 * 3
    assert gpu_faked.ln.stages() == ["dx", "dwdb"] * 9 * 3


def test_a_by_call_layer_compiles_with_its_training_op(tmp_path, gpu_faked, cpu_activation_ops,
                                                       monkeypatch):
    """A layer swapped by the dtype of its calls, called once eagerly in f32 (its kernels are
    loaded then), compiles (fullgraph, AOTAutograd) to the custom op kernelize::silu_train, whose
    backward launches `grad`; the gradient is eager's."""
    from test_training import _IS_AVAILABLE, _kz, recording_aot_backend
    model = torch.nn.SiLU()
    _kz(model, kernels_dir=_act_folder(tmp_path / "k", "silu"), mode="training")
    x = torch.randn(3, 8, requires_grad=True)
    model(x)                                   # loads the f32 kernels
    monkeypatch.setattr(torch.cuda, "is_available", _IS_AVAILABLE)
    graphs = []
    torch._dynamo.reset()
    f = torch.compile(model, backend=recording_aot_backend(graphs), fullgraph=True)
    bk = gpu_faked.acts["silu"]
    bk.calls.clear()
    xs = x.detach().clone().requires_grad_(True)
    f(xs).sum().backward()
    assert len(graphs) == 1 and "kernelize.silu_train" in str(graphs[0].graph)
    assert torch.equal(xs.grad, eager_dx("silu", torch.ones(3, 8), x.detach()))
    assert [c[0] for c in bk.calls] == ["grad"]
    torch._dynamo.reset()
