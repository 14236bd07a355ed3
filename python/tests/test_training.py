"""Training mode and the named modes (issues 27 and 30), on the CPU.

There is no GPU here: the forward kernel is a stand-in computing HF LlamaRMSNorm's formula (HF
GemmaRMSNorm's for an rms_norm gemma kernel: the norm tests run for both, `family`; or,
for a gated MLP swapped for silu_mul, `F.silu(gate) * up`), and the backward kernel
(`training.compiled_backward`) a recording stand-in whose `launch` receives exactly what the
CUDA entries would (stage, grid, block, tensors, scalars) and, at `dx` and `dw`, writes gradients
computed with PyTorch's own autograd (or the CPU emulator of eager's CUDA backward,
`kernelize.backward`). `torch.cuda.is_available` is faked so that `kernelize` swaps the (CPU)
model's layers. The real entries run only on a GPU (scripts/backward_probe.py). The gated MLP's
backward (silu_mul_backward) is tested in test_training_gated.py, nn.LayerNorm's
(layer_norm_backward) in test_training_layer_norm.py, with these stand-ins.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from typing import Callable, NamedTuple

import pytest
import torch
from torch import nn

import kernelize
from conftest import REPO, bundled_version
from kernelize import backward as B
from kernelize import core, launch, ops, training
from kernelize.discover import _rms_refs
from kernelize.pykernel import SharedOnCopy

transformers = pytest.importorskip("transformers")
pytest.importorskip("numpy")

ABI = json.loads((REPO / "python/tests/fixtures/abi.json").read_text(encoding="utf-8"))
NORMS = ["model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
         "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm", "model.norm"]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
_IS_AVAILABLE = torch.cuda.is_available


# ---- stand-ins -------------------------------------------------------------------------------

class ForwardStandIn:
    """What `launch.compiled` returns here: the forward kernel 'loaded' on the CPU."""
    device = torch.device("cpu")

    def __init__(self, manifest):
        self.manifest = manifest


#: The stand-in forward kernels' formulas: HF LlamaRMSNorm's (and GemmaRMSNorm's); a gated MLP's
#: act(gate) * up (silu_mul, and silu_and_mul, whose runner takes the same two tensors;
#: gelu_tanh_mul); a lone SiLU, GELU or tanh GELU.
FORWARD_FORMULAS = {
    "rms_norm": lambda x, w, eps: _rms_refs(x, w, eps)["llama"].contiguous(),
    "silu_mul": lambda g, u: (torch.nn.functional.silu(g) * u).contiguous(),
    "silu_and_mul": lambda g, u: (torch.nn.functional.silu(g) * u).contiguous(),
    "gelu_tanh_mul": lambda g, u: (torch.nn.functional.gelu(g, approximate="tanh") * u).contiguous(),
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh").contiguous(),
    "silu": lambda x: torch.nn.functional.silu(x).contiguous(),
    "gelu": lambda x: torch.nn.functional.gelu(x).contiguous(),
    "layer_norm": lambda x, w, b, eps: torch.nn.functional.layer_norm(x, [x.shape[-1]], w, b,
                                                                      eps).contiguous(),
}


def recording_aot_backend(graphs: list):
    """A torch.compile backend that records each dynamo graph in `graphs` and runs it through
    AOTAutograd with the traced forward and backward graphs as they are (no inductor)."""
    def backend(gm, example_inputs):
        graphs.append(gm)
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g),
                            bw_compiler=lambda g, _: make_boxed_func(g))(gm, example_inputs)
    return backend


def _forward_run(op, key):
    # core's runner for a stand-in forward kernel: the op's formula (an rms_norm kernel's: its
    # semantics')
    if op is ops.op("rms_norm"):
        semantics = ops.kernel(key).manifest["semantics"]
        return lambda _compiled, x, w, eps: _rms_refs(x, w, eps)[semantics].contiguous()
    (f,) = [f for name, f in FORWARD_FORMULAS.items() if op is ops.op(name)]
    return lambda _compiled, *args: f(*args)


def _torch_grads(dy, x, w, eps, semantics="llama"):
    """dx, dw of eager autograd on the `semantics` formula (discover's reference, not
    training's)."""
    with torch.enable_grad():
        xs, ws = x.detach().requires_grad_(), w.detach().requires_grad_()
        return torch.autograd.grad(_rms_refs(xs, ws, eps)[semantics], (xs, ws), dy)


#: The CPU emulators of eager's CUDA backward (kernelize.backward), by semantics.
EMULATORS = {"llama": B.llama_rms_norm_backward, "gemma": B.gemma_rms_norm_backward}


def _emulated_grads(dy, x, w, eps, semantics="llama"):
    """dx, dw of the CPU emulator of eager's CUDA backward (kernelize.backward)."""
    dt = {v: k for k, v in DTYPES.items()}[x.dtype]
    cols = x.shape[-1]
    dx, dw = EMULATORS[semantics](x.float().reshape(-1, cols).numpy(), w.float().numpy(),
                                  dy.float().reshape(-1, cols).numpy(), eps, dt)
    return (torch.from_numpy(dx).reshape(x.shape).to(x.dtype), torch.from_numpy(dw).to(w.dtype))


class RecordingBackward(SharedOnCopy):
    """A stand-in `rms_norm_backward` kernel of `semantics` (llama, gemma): records every
    launch; `dx` writes dx and the rows' r into the workspace, `dw` writes dw (both computed by
    `grads`, on the semantics' formula). Shared by copies, as the real
    `training.BackwardKernel`."""
    device = torch.device("cpu")
    op = "rms_norm_backward"

    def __init__(self, grads=_torch_grads, sms=132, threads_per_sm=2048, semantics="llama"):
        self.grads, self.sms, self.threads_per_sm = grads, sms, threads_per_sm
        self.semantics = semantics
        self.calls: list[tuple] = []
        self._dw = None

    def launch(self, stage, grid, block, tensors, scalars):
        self.calls.append((stage, grid, block, tensors, scalars))
        if stage == "dx":
            dx, ws, dy, x, w = tensors
            rows, cols, eps = scalars
            gx, self._dw = self.grads(dy, x, w, eps, self.semantics)
            dx.copy_(gx)
            ws[:rows] = torch.rsqrt(x.float().pow(2).mean(-1) + eps).reshape(-1)
        elif stage == "dw":
            tensors[0].copy_(self._dw)

    def stages(self):
        return [c[0] for c in self.calls]


#: Each gated backward op's two eager nodes' own ops: the activation (whose output MulBackward0
#: saves) and the activation's backward op (SiluBackward0's silu_backward, GeluBackward0's
#: gelu_backward with approximate="tanh").
GATED_CHAINS = {
    "silu_mul_backward": (torch.nn.functional.silu, torch.ops.aten.silu_backward),
    "gelu_tanh_mul_backward": (lambda g: torch.nn.functional.gelu(g, approximate="tanh"),
                               lambda d, g: torch.ops.aten.gelu_backward(d, g, approximate="tanh")),
}


def eager_gated_grads(dy, g, u, op="silu_mul_backward"):
    """(d_gate, d_up) of eager autograd of `act(g) * u` (`op`'s activation, GATED_CHAINS), op by
    op as its nodes run them (MulBackward0: grad * other, grad * self with self = act(g) rounded
    to T; the activation's backward node), no autograd needed (so a custom op's CPU kernel can
    call it). test_training_gated checks it against torch.autograd bit for bit."""
    act, act_backward = GATED_CHAINS[op]
    d_up = dy * act(g)
    d_gate = act_backward(dy * u, g)
    return d_gate, d_up


class RecordingGatedBackward(SharedOnCopy):
    """A stand-in gated backward kernel (`op`: silu_mul_backward or gelu_tanh_mul_backward):
    records every launch; `grad` writes d_gate and d_up (eager's, `eager_gated_grads`) into the
    tensors of their ABI slots."""
    device = torch.device("cpu")

    def __init__(self, sms=132, threads_per_sm=2048, op="silu_mul_backward"):
        self.sms, self.threads_per_sm, self.op = sms, threads_per_sm, op
        self.calls: list[tuple] = []

    def launch(self, stage, grid, block, tensors, scalars):
        self.calls.append((stage, grid, block, tensors, scalars))
        assert stage == "grad"
        d_gate, d_up, dy, g, u = tensors
        dg, du = eager_gated_grads(dy, g, u, self.op)
        d_gate.copy_(dg)
        d_up.copy_(du)

    def stages(self):
        return [c[0] for c in self.calls]


#: Each activation's backward op, the one op its eager autograd node runs (SiluBackward0's
#: silu_backward, GeluBackward0's gelu_backward with its approximate).
ACTIVATION_BACKWARD = {
    "silu": torch.ops.aten.silu_backward,
    "gelu": lambda dy, x: torch.ops.aten.gelu_backward(dy, x, approximate="none"),
    "gelu_tanh": lambda dy, x: torch.ops.aten.gelu_backward(dy, x, approximate="tanh"),
}


def eager_dx(act: str, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Eager autograd's dx of the activation `act` (silu, gelu, gelu_tanh) at x for dy: the op
    its one backward node runs (ACTIVATION_BACKWARD; no autograd needed, so a custom op's CPU
    kernel can call it; test_training_activation checks it against torch.autograd bit for bit)."""
    return ACTIVATION_BACKWARD[act](dy, x)


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

    def stages(self):
        return [c[0] for c in self.calls]


def eager_ln_grads(dy, x, mean, rstd, w, needs=(True, True, True)):
    """(dx, dw, db) of eager's own backward op of nn.LayerNorm (`native_layer_norm_backward`,
    the one op its autograd node runs) on x [rows, cols] and the forward's saved statistics
    given as the kernel receives them (f32 [rows]); None where not asked for. On the CPU eager
    saves them in x's dtype: they are given back in it (exactly: they were rounded to it)."""
    cols = x.shape[-1]
    if x.device.type == "cpu":
        mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)
    ones = torch.ones(cols, dtype=x.dtype)   # (dw and db do not read w; the op wants one for db)
    return torch.ops.aten.native_layer_norm_backward(
        dy, x, [cols], mean, rstd, ones if w is None else w, ones, list(needs))


class RecordingLnBackward(SharedOnCopy):
    """A stand-in `layer_norm_backward` kernel: records every launch; `dx` writes dx, `dwdb` dw
    and db (eager's, `eager_ln_grads`, each entry from its own ABI slots only: dwdb gets no w)
    into the tensors of their slots."""
    device = torch.device("cpu")
    op = "layer_norm_backward"

    def __init__(self, sms=132, threads_per_sm=2048):
        self.sms, self.threads_per_sm = sms, threads_per_sm
        self.calls: list[tuple] = []

    def launch(self, stage, grid, block, tensors, scalars):
        self.calls.append((stage, grid, block, tensors, scalars))
        rows, cols = scalars
        if stage == "dx":
            dx, dy, x, mean, rstd, w = tensors
            dx.copy_(eager_ln_grads(dy, x, mean, rstd, w, (True, False, False))[0])
        else:
            assert stage == "dwdb"
            dw, db, dy, x, mean, rstd = tensors
            _, gw, gb = eager_ln_grads(dy, x, mean, rstd, None, (False, True, True))
            dw.copy_(gw)
            db.copy_(gb)

    def stages(self):
        return [c[0] for c in self.calls]


@pytest.fixture
def gpu_faked(monkeypatch):
    """kernelize swaps CPU models: CUDA 'available', the kernels stand-ins. Yields the recording
    rms_norm_backward kernel (llama; its `gemma`: the recording rms_norm_backward gemma kernel;
    its `gated`: the recording silu_mul_backward kernel; its
    `gelu_gated`: the recording gelu_tanh_mul_backward kernel; its `ln`: the recording
    layer_norm_backward kernel; its `acts`: the recording silu_backward, gelu_backward and
    gelu_tanh_backward kernels by activation) and the list of (digest, dtype) they were
    'compiled' for."""
    bk = RecordingBackward()
    bk.gemma = RecordingBackward(semantics="gemma")
    bk.gated = RecordingGatedBackward()
    bk.gelu_gated = RecordingGatedBackward(op="gelu_tanh_mul_backward")
    bk.ln = RecordingLnBackward()
    bk.acts = {act: RecordingActivationBackward(act) for act in training.ACTIVATION_FORMULAS}
    loaded = []

    def compiled_backward(digest, manifest, source, dtype, device):
        assert dtype in manifest["stages"]
        loaded.append((digest, dtype))
        if manifest["op"] == "rms_norm_backward" and manifest["semantics"] == "gemma":
            return bk.gemma
        return {"rms_norm_backward": bk, "silu_mul_backward": bk.gated,
                "gelu_tanh_mul_backward": bk.gelu_gated, "layer_norm_backward": bk.ln,
                **{a.op: a for a in bk.acts.values()}}[manifest["op"]]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(launch, "compiled", lambda digest, manifest, *a, **k: ForwardStandIn(manifest))
    monkeypatch.setattr(core, "_stand_in_run", _forward_run)
    monkeypatch.setattr(training, "compiled_backward", compiled_backward)
    bk.loaded = loaded
    yield bk


BACKWARD_DIR = REPO / "kernels" / "rms_norm_llama_backward"


def _backward_folder(root, dtypes=("bf16", "f16", "f32"), constraints="",
                     name="rms_norm_llama_backward"):
    """A local rms_norm_backward kernel: kernels/<name> (rms_norm_llama_backward or
    rms_norm_gemma_backward; its source spells its nine entry symbols out), its manifest
    narrowed to `dtypes` and given `constraints` where a test asks."""
    d = root / name
    shutil.copytree(BACKWARD_DIR.parent / name, d)
    toml = (d / "kernel.toml").read_text(encoding="utf-8")
    head, _, _ = toml.partition("\n[entry.")
    tables = ["[entry." + t.strip() + "\n" for t in toml.split("\n[entry.")[1:]]
    keep = [t for t in tables if t[len("[entry."):t.index("]")] in dtypes]
    (d / "kernel.toml").write_text(head + "\n\n" + "\n".join(keep) + constraints, encoding="utf-8")
    return d


@pytest.fixture
def kernels(tmp_path):
    """A kernels_dir with the bundled exact forward and the backward kernel."""
    root = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels/rms_norm_llama", root / "rms_norm_llama")
    _backward_folder(root)
    return root


@pytest.fixture
def forward_only(tmp_path):
    root = tmp_path / "fwd"
    shutil.copytree(REPO / "kernels/rms_norm_llama", root / "rms_norm_llama")
    return root


def _llama(dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def _gemma(dtype=torch.bfloat16, seed=0):
    """A tiny GemmaForCausalLM of _llama's sizes: its five GemmaRMSNorm layers (rms_norm gemma)
    at NORMS' paths (its GeGLU MLPs have no kernel in these folders and stay eager); seeded
    weights, the norms' drawn around 0 (HF initialises them to 0: `1 + w` would be all ones)."""
    torch.manual_seed(seed)
    cfg = transformers.GemmaConfig(vocab_size=128, hidden_size=64, intermediate_size=160,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                                   hidden_act="gelu_pytorch_tanh", attn_implementation="eager")
    m = transformers.GemmaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.normal_(0.0, 0.2)
    return m.to(dtype)


class Family(NamedTuple):
    """An RMSNorm family training mode runs: its semantics, a tiny model of it (five norms at
    NORMS), its HF norm class and the bundled forward and backward kernels' folders."""
    semantics: str
    model: Callable
    norm_class: str        # module:Class
    forward: str
    backward: str

    def recorder(self, gpu_faked):
        """gpu_faked's recording rms_norm_backward kernel of this semantics."""
        return gpu_faked.gemma if self.semantics == "gemma" else gpu_faked

    def norm(self, dtype=torch.float32, cols=16):
        """One norm layer of this family, random weights."""
        import importlib
        mod, cls = self.norm_class.split(":")
        torch.manual_seed(3)
        norm = getattr(importlib.import_module(mod), cls)(cols, eps=1e-6).to(dtype)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(cols))
        return norm

    def folder(self, root, backward=True, **kw):
        """A kernels_dir: the bundled forward kernel, and the backward one (narrowed by `kw`,
        `_backward_folder`) where `backward`."""
        shutil.copytree(REPO / "kernels" / self.forward, root / self.forward)
        if backward:
            _backward_folder(root, name=self.backward, **kw)
        return root

    @property
    def what(self):
        return f"rms_norm ({self.semantics})"


LLAMA = Family("llama", _llama, "transformers.models.llama.modeling_llama:LlamaRMSNorm",
               "rms_norm_llama", "rms_norm_llama_backward")
GEMMA = Family("gemma", _gemma, "transformers.models.gemma.modeling_gemma:GemmaRMSNorm",
               "rms_norm_gemma", "rms_norm_gemma_backward")


@pytest.fixture(params=[LLAMA, GEMMA], ids=lambda f: f.semantics)
def family(request):
    return request.param


@pytest.fixture
def fkernels(family, tmp_path):
    """The family's kernels_dir: its bundled exact forward and backward kernels."""
    return family.folder(tmp_path / "kernels")


def _grads(model, ids):
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, use_cache=False).logits.float().square().mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _kz(model, **kw):
    kw.setdefault("device", "cuda:0")
    return kernelize.kernelize(model, arch="sm_90", verbose=False, **kw)


def train_bit_for_bit(eager, kz, data):
    """The same AdamW steps on `eager` and `kz` (kernelized) on each batch of `data` (token ids,
    labels = ids): every loss and every parameter after the last step bit for bit, the losses
    finite and all different (so the steps did move the model). (eps 1e-4: AdamW's default 1e-8
    is 0 in f16, and f16 parameters turn NaN.)"""
    def train(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-4)
        losses = []
        for ids in data:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        return losses

    le, lk = train(eager), train(kz)
    assert all(torch.equal(a, b) for a, b in zip(le, lk)), (le, lk)
    assert all(bool(torch.isfinite(v)) for v in le) and len(set(float(v) for v in le)) == len(data), le
    params = dict(eager.named_parameters())
    for n, p in kz.named_parameters():
        assert torch.equal(p, params[n]), n


def assert_double_backward_is_eagers(kz, ref, x, params, recorder, label: str, caplog):
    """A double backward through kernelized layer `kz` (training mode): the first-order
    gradients under create_graph are eager autograd's (the kernel, recorded by `recorder`, not
    launched), bit for bit with `ref` and from one call to the next; the second order eager's
    formula; said at most once (`label`: "<op> layer"). `params(layer)`: its parameters."""
    def second_order(layer):
        xs = x.clone().requires_grad_()
        wrt = (xs, *params(layer))
        first = torch.autograd.grad(layer(xs).square().sum(), wrt, create_graph=True)
        if layer is kz:   # create_graph: eager autograd's gradients, not the kernel's
            assert recorder.calls == []
        # (the second backward passes the node again, first order; the kernel may run)
        second = torch.autograd.grad(sum(g.square().sum() for g in first), wrt)
        recorder.calls.clear()
        return (*first, *second)

    with caplog.at_level(logging.WARNING, logger="kernelize"):
        got = second_order(kz)
        got2 = second_order(kz)
    want = second_order(ref)
    n = 1 + len(params(kz))
    for a, b, c in zip(got[:n], got2[:n], want[:n]):   # first order: eager's bits
        assert torch.equal(a, c) and torch.equal(b, c)
    for a, b, c in zip(got[n:], got2[n:], want[n:]):   # second order: eager's formula
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)
        assert torch.equal(a, b)
    said = [r.getMessage() for r in caplog.records if "double backward" in r.getMessage()
            and label in r.getMessage()]
    assert len(said) <= 1 and all("eager autograd computes them" in s for s in said)
    assert said or any(label in w for w in training._SAID)


def _training_lines(rep):
    return [n for n in rep.notes if n.startswith("training:")]


# ---- modes -----------------------------------------------------------------------------------

def test_an_unknown_mode_is_refused_naming_it_and_the_modes(forward_only):
    m = _llama()
    for bad in ("train", "Training", 1, None):
        with pytest.raises(ValueError) as e:
            kernelize.kernelize(m, kernels_dir=forward_only, arch="sm_90", verbose=False, mode=bad)
        msg = str(e.value)
        assert f"mode={bad!r}" in msg
        assert all(f"'{name}'" in msg for name in ("inference", "training", "compile")), msg
    assert kernelize.launch_counts(m) == {}  # refused before anything was swapped
    with pytest.raises(ValueError, match="mode='eval'"):
        kernelize.lock(m, hub="http://127.0.0.1:9", mode="eval")


def test_the_modes_are_named_in_the_report_and_compile_is_compile_true(forward_only, monkeypatch):
    from kernelize import exact
    compiled = []
    monkeypatch.setattr(exact, "exact_compile", lambda model, mode: compiled.append(mode) or "compiled")
    m = _llama()
    rep = kernelize.kernelize(m, kernels_dir=forward_only, arch="sm_90", verbose=False)
    assert rep.mode == "inference" and str(rep).splitlines()[0].endswith("| mode inference")
    assert compiled == [] and rep.compile is None
    for kw, want_mode, want_arg in [({"mode": "compile"}, "compile", None),
                                    ({"mode": "torch_compile"}, "compile", None),
                                    ({"compile": True}, "compile", None),
                                    ({"mode": "compile", "compile": "reduce-overhead"}, "compile",
                                     "reduce-overhead"),
                                    ({"mode": "training", "compile": True}, "training+compile", None)]:
        compiled.clear()
        rep = kernelize.kernelize(m, kernels_dir=forward_only, arch="sm_90", verbose=False, **kw)
        assert (rep.mode, compiled, rep.compile) == (want_mode, [want_arg], "compiled"), kw
        assert f"| mode {want_mode}" in str(rep).splitlines()[0]
    kernelize.unkernelize(m)


# ---- the launches ----------------------------------------------------------------------------

def test_the_backward_grids_are_the_registrys():
    # kernel_registry::backward's every_entry_has_its_launch (132 SMs, 2048 threads per SM)
    dims = lambda s, r, c: training.stage_dims(s, r, c, 132, 2048)  # noqa: E731
    assert dims("dx", 3, 4096) == ((3, 1, 1), (512, 1, 1))
    assert dims("dx", 16384, 4096)[0] == (8 * 132, 1, 1)
    assert dims("dwp", 16384, 4096)[0] == (16 * 132, 1, 1)
    assert dims("dwp", 1, 5) == ((2, 1, 1), (128, 1, 1))
    assert dims("dw", 4096, 8192) == ((64, 1, 1), (128, 1, 1))
    assert dims("dw", 1, 1)[0] == (1, 1, 1)
    assert {s["name"]: s["block"] for s in ABI["backward_ops"]["rms_norm_backward"]["stages"]} \
        == training.BLOCKS
    assert training.STAGES == ("dx", "dwp", "dw")
    # the workspace: r, then one partial row per CTA of eager's column sum
    for rows, cols, sms, tps in [(4096, 8192, 132, 2048), (4096, 8192, 114, 2048), (7, 64, 132, 2048)]:
        assert training.workspace_floats(rows, cols, sms, tps) == \
            rows + B.col_config(rows, cols, sms, tps)["ctas"] * cols
    assert training.workspace_floats(4096, 8192, 114, 2048) == 4096 + 29 * 8192
    with pytest.raises(ValueError, match="no entry `db`"):
        training.stage_dims("db", 4, 4, 132, 2048)
    with pytest.raises(ValueError, match="threads per SM"):
        training.workspace_floats(4, 4, 132, 256)


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("rows,sms,tps", [(6, 132, 2048), (2048, 4, 2048)])
def test_the_backward_launches_the_three_entries_in_order_with_the_abi(dtype, rows, sms, tps):
    cols, eps = 64, 1e-5
    t = DTYPES[dtype]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, cols, generator=g).to(t)
    w = torch.randn(cols, generator=g).to(t)
    dy = torch.randn(rows, cols, generator=g).to(t).t().contiguous().t()  # not contiguous
    bk = RecordingBackward(sms=sms, threads_per_sm=tps)
    dx, dw = training.run_rms_norm_backward(bk, dy, x, w, eps)
    assert bk.stages() == ["dx", "dwp", "dw"]
    ctas = B.col_config(rows, cols, sms, tps)["ctas"]
    if rows == 2048:
        assert ctas > 1  # the workspace holds partial column sums of several CTAs
    stages = ABI["backward_ops"]["rms_norm_backward"]["stages"]
    ws = bk.calls[0][3][1]
    assert ws.dtype == torch.float32 and ws.shape == (rows + ctas * cols,)
    for (stage, grid, block, tensors, scalars), spec in zip(bk.calls, stages):
        assert stage == spec["name"]
        assert (grid, block) == training.stage_dims(stage, rows, cols, sms, tps)
        assert block == (spec["block"], 1, 1)
        args = [*tensors, *scalars]
        params = [p.strip() for p in spec["params"].split(",")]
        assert len(args) == len(params) == len(spec["names"])
        for p, a in zip(params, args):
            kind = torch.Tensor if "*" in p else int if p.startswith("long long") else float
            assert isinstance(a, kind) and not isinstance(a, bool), (stage, p, a)
            if "*" in p:
                assert a.is_contiguous() and a.dtype == (torch.float32 if p.startswith(("float", "const float")) else t)
        named = dict(zip(spec["names"], args))
        assert (named["rows"], named["cols"]) == (rows, cols)
        assert named["ws"] is ws
        if stage == "dx":
            assert named["dx"] is dx and named["eps"] == eps
            assert named["x"] is x and named["w"] is w and torch.equal(named["dy"], dy)
        else:
            assert (named["sms"], named["threads_per_sm"]) == (sms, tps)
        if stage == "dw":
            assert named["dw"] is dw and dw.shape == (cols,) and dw.dtype == t
    assert (dx.shape, dx.dtype) == (x.shape, t)
    # the dx stage's grid: one block a row up to 8 per SM
    assert bk.calls[0][1] == (min(rows, 8 * sms), 1, 1)
    # dw not needed: only dx is launched (it writes dx and the rows' r)
    bk2 = RecordingBackward(sms=sms, threads_per_sm=tps)
    dx2, dw2 = training.run_rms_norm_backward(bk2, dy, x, w, eps, need_dw=False)
    assert bk2.stages() == ["dx"] and dw2 is None and torch.equal(dx2, dx)


def test_an_empty_batch_launches_nothing():
    bk = RecordingBackward()
    x = torch.empty(0, 8, dtype=torch.bfloat16)
    dx, dw = training.run_rms_norm_backward(bk, x, x, torch.ones(8, dtype=torch.bfloat16), 1e-6)
    assert bk.calls == [] and dx.shape == (0, 8) and torch.equal(dw, torch.zeros(8, dtype=torch.bfloat16))


# ---- training mode on a model ----------------------------------------------------------------

def test_training_mode_runs_the_kernels_under_autograd_and_the_gradients_are_eagers(
        family, fkernels, gpu_faked):
    ref, m = family.model(), family.model()
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    want = _grads(ref, ids)
    rep = _kz(m, kernels_dir=fkernels, mode="training")
    assert rep.mode == "training"
    norms = {e.path: e for e in rep.entries if e.op == "rms_norm"}
    assert sorted(norms) == sorted(NORMS)
    assert all(e.semantics == family.semantics for e in norms.values())
    assert all(e.status == "replaced" and e.backward is not None
               and e.backward.name == family.backward for e in norms.values())
    assert gpu_faked.loaded and {dt for _, dt in gpu_faked.loaded} == {"bf16"}
    lines = _training_lines(rep)
    # one line for the five norms (the backward taken), one for the layers with no backward op
    ok = [ln for ln in lines if f"{family.backward} {bundled_version(family.backward)}" in ln]
    assert len(ok) == 1 and "(5 layers)" in ok[0] and "run under autograd as the forward" in ok[0], lines
    assert f"[{family.what}, bf16, cols=64]" in ok[0], ok
    assert "unverified local kernel" in ok[0]
    assert ok[0] in str(rep)
    got = _grads(m, ids)
    assert set(got) == set(want)
    for n in want:
        assert torch.equal(got[n], want[n]), n
    # every norm ran its forward kernel once and its backward's three entries once
    assert kernelize.launch_counts(m) == {p: 1 for p in NORMS}
    bk = family.recorder(gpu_faked)
    assert bk.stages() == ["dx", "dwp", "dw"] * 5
    assert (gpu_faked if bk is gpu_faked.gemma else gpu_faked.gemma).calls == []
    rows = {c[4][0] for c in bk.calls}
    assert rows == {14}
    # no autograd (eval under no_grad): the forward kernel alone, as in inference
    with torch.no_grad():
        m(input_ids=ids, use_cache=False)
    assert kernelize.launch_counts(m) == {p: 2 for p in NORMS} and len(bk.calls) == 15
    # copies keep the training forward
    c = copy.deepcopy(m)
    assert c.model.norm.__dict__["_kernelize_backward"].name == family.backward
    assert kernelize.unkernelize(m) == 5 + 0 and "_kz_bwd" not in m.model.norm.__dict__


def test_a_pickled_training_model_loads_both_kernels_again_and_trains_with_them(family, fkernels,
                                                                              gpu_faked):
    # torch.save / pickle: the loading process loads the forward and the backward kernel again
    # from the manifests and sources the layers carry (digests checked) and trains with them
    import pickle
    ref, m = family.model(), family.model()
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(3))
    want = _grads(ref, ids)
    _kz(m, kernels_dir=fkernels, mode="training")
    loads = len(gpu_faked.loaded)
    twin = pickle.loads(pickle.dumps(m))
    assert len(gpu_faked.loaded) == loads + 5, "each norm's backward kernel is loaded again"
    assert twin.model.norm.__dict__["_kernelize_backward"].name == family.backward
    bk = family.recorder(gpu_faked)
    before = len(bk.calls)
    got = _grads(twin, ids)
    assert bk.stages()[before:] == ["dx", "dwp", "dw"] * 5
    for n in want:
        assert torch.equal(got[n], want[n]), n
    assert kernelize.launch_counts(twin) == {p: 1 for p in NORMS}


def test_gradients_from_the_cuda_order_emulator_match_eager_autograd(family, fkernels, gpu_faked):
    # bf16 (in f32 a model's norms take no backward kernel: the test below): the emulator's
    # CUDA reduction orders differ from the CPU's by an ulp here and there
    bk = family.recorder(gpu_faked)
    bk.grads = _emulated_grads
    ref, m = family.model(), family.model()
    ids = torch.randint(0, 128, (3, 5), generator=torch.Generator().manual_seed(2))
    want = _grads(ref, ids)
    rep = _kz(m, kernels_dir=fkernels, mode="training")
    assert all(e.backward is not None for e in rep.entries if e.op == "rms_norm")
    got = _grads(m, ids)
    assert len(bk.calls) == 15
    for n in want:
        torch.testing.assert_close(got[n].float(), want[n].float(), rtol=5e-2, atol=1e-3, msg=n)


def test_inference_mode_is_unchanged_under_autograd(family, fkernels, gpu_faked):
    ref, m = family.model(), family.model()
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    rep = _kz(m, kernels_dir=fkernels)
    assert rep.mode == "inference" and _training_lines(rep) == []
    assert all(e.backward is None and e.backward_reasons == [] for e in rep.entries)
    assert gpu_faked.loaded == []
    got, want = _grads(m, ids), _grads(ref, ids)
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert kernelize.launch_counts(m) == {p: 0 for p in NORMS}  # the original forwards ran
    assert gpu_faked.calls == [] and gpu_faked.gemma.calls == []


def test_no_backward_kernel_keeps_the_original_forward_under_autograd_and_says_why_once(
        family, tmp_path, gpu_faked):
    ref, m = family.model(), family.model()
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    rep = _kz(m, kernels_dir=family.folder(tmp_path / "fwd", backward=False), mode="training")
    norms = [e for e in rep.entries if e.op == "rms_norm"]
    assert len(norms) == 5 and all(e.status == "replaced" and e.backward is None for e in norms)
    assert all(any(f"no kernel for rms_norm_backward ({family.semantics})" in r
                   for r in e.backward_reasons) for e in norms)
    lines = _training_lines(rep)
    why = [ln for ln in lines if "keep their original forward under autograd" in ln]
    assert len(why) == 1 and "(5 layers)" in why[0] and "no rms_norm_backward kernel" in why[0], lines
    assert f"[{family.what}, bf16, cols=64]" in why[0], why
    assert str(rep).count("no rms_norm_backward kernel") == 1
    got, want = _grads(m, ids), _grads(ref, ids)
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert kernelize.launch_counts(m) == {p: 0 for p in NORMS} and gpu_faked.calls == []
    assert gpu_faked.gemma.calls == []
    with torch.no_grad():  # the forward kernel still runs where no gradient is needed
        m(input_ids=ids, use_cache=False)
    assert kernelize.launch_counts(m) == {p: 1 for p in NORMS}


def test_a_backward_kernel_outside_its_dtypes_or_constraints_is_not_taken(family, tmp_path,
                                                                          gpu_faked):
    root = family.folder(tmp_path / "k", dtypes=("f32",))
    rep = _kz(family.model(), kernels_dir=root, mode="training")
    lines = [ln for ln in _training_lines(rep) if family.what in ln]
    assert len(lines) == 1 and "has no bf16 entry" in lines[0], lines
    root2 = family.folder(tmp_path / "k2", constraints="\n[constraints]\ncols_min = 128\n")
    rep = _kz(family.model(), kernels_dir=root2, mode="training")
    lines = [ln for ln in _training_lines(rep) if family.what in ln]
    assert len(lines) == 1 and "cols 64 < cols_min 128" in lines[0], lines
    assert gpu_faked.loaded == []


def test_a_backward_kernel_that_fails_to_load_is_reported(family, fkernels, gpu_faked, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no NVRTC here")
    monkeypatch.setattr(training, "compiled_backward", broken)
    m = family.model()
    rep = _kz(m, kernels_dir=fkernels, mode="training")
    lines = [ln for ln in _training_lines(rep) if family.what in ln]
    assert len(lines) == 1 and "could not be loaded (RuntimeError: no NVRTC here)" in lines[0]
    assert all(e.backward is None for e in rep.entries)
    assert "_kz_bwd" not in m.model.norm.__dict__


def test_a_dry_run_says_which_backward_it_would_take(family, fkernels):
    rep = kernelize.kernelize(family.model(), kernels_dir=fkernels, arch="sm_90", verbose=False,
                              mode="training")
    assert not rep.swapped
    lines = [ln for ln in _training_lines(rep) if family.what in ln]
    assert len(lines) == 1 and "would run under autograd" in lines[0]
    assert f"{family.backward} {bundled_version(family.backward)}" in lines[0]


def test_double_backward_is_computed_by_eager_autograd_and_said_once(family, fkernels, gpu_faked,
                                                                     caplog):
    ref, norm = family.norm(), family.norm()
    _kz(norm, kernels_dir=fkernels, mode="training")
    assert "_kz_bwd" in norm.__dict__
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(4))
    bk = family.recorder(gpu_faked)
    assert_double_backward_is_eagers(norm, ref, x, lambda m: (m.weight,), bk, "rms_norm layer",
                                     caplog)
    # a first-order backward launches the kernel
    bk.calls.clear()
    xs = x.clone().requires_grad_()
    norm(xs).sum().backward()
    assert bk.stages() == ["dx", "dwp", "dw"]


def test_only_the_gradients_asked_for_are_computed(family, fkernels, gpu_faked):
    norm = family.norm()
    _kz(norm, kernels_dir=fkernels, mode="training")
    norm.weight.requires_grad_(False)
    x = torch.randn(4, 16).requires_grad_()
    norm(x).sum().backward()
    bk = family.recorder(gpu_faked)
    assert bk.stages() == ["dx"] and x.grad is not None and norm.weight.grad is None


# ---- torch.compile ---------------------------------------------------------------------------

_OPS_REGISTERED = False


@pytest.fixture
def cpu_training_ops():
    """CPU implementations of the training custom ops (this process only; the package
    registers CUDA ones): the forward formula, and the backward through the recording kernel."""
    global _OPS_REGISTERED
    if not _OPS_REGISTERED:
        torch.library.register_kernel(
            "kernelize::rms_norm_train", "cpu",
            lambda x, w, eps, fkey, bkey:
                _rms_refs(x, w, eps)[ops.kernel(fkey).manifest["semantics"]].contiguous())
        torch.library.register_kernel(
            "kernelize::launch_rms_norm_backward", "cpu",
            lambda dy, x, w, eps, key: training.run_rms_norm_backward(ops.kernel(key), dy, x, w, eps))
        _OPS_REGISTERED = True


def test_training_ops_are_registered_with_fakes_and_autograd():
    from torch._subclasses.fake_tensor import FakeTensorMode
    for name in ("rms_norm_train", "launch_rms_norm_backward"):
        assert hasattr(torch.ops.kernelize, name)
    with FakeTensorMode():
        x, w = torch.empty(3, 8, dtype=torch.bfloat16), torch.empty(8, dtype=torch.bfloat16)
        y = torch.ops.kernelize.rms_norm_train(x, w, 1e-6, 1, 2)
        dx, dw = torch.ops.kernelize.launch_rms_norm_backward(x, x, w, 1e-6, 2)
    assert (y.shape, dx.shape, dw.shape, dw.dtype) == ((3, 8), (3, 8), (8,), torch.bfloat16)


def test_training_mode_compiles_without_graph_breaks(family, fkernels, gpu_faked,
                                                     cpu_training_ops, monkeypatch):
    ref, norm = family.norm(), family.norm()
    _kz(norm, kernels_dir=fkernels, mode="training")
    monkeypatch.setattr(torch.cuda, "is_available", _IS_AVAILABLE)  # swapped; dynamo asks CUDA
    # inside a custom op's implementation there is no autograd: the emulator computes the fake's
    # gradients (eager's CUDA orders: close to the CPU's, not equal)
    bk = family.recorder(gpu_faked)
    bk.grads = _emulated_grads
    graphs = []
    torch._dynamo.reset()
    f = torch.compile(norm, backend=recording_aot_backend(graphs), fullgraph=True)
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(5))
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    f(xs).square().sum().backward()
    ref(xr).square().sum().backward()
    assert len(graphs) == 1
    assert "kernelize.rms_norm_train" in str(graphs[0].graph)
    torch.testing.assert_close(xs.grad, xr.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(norm.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-6)
    assert bk.stages() == ["dx", "dwp", "dw"]   # the backward op launched the entries
    torch._dynamo.reset()


# ---- the hub hands out no backward kernel today --------------------------------------------

def test_a_hub_without_a_verified_backward_keeps_the_layers_under_autograd(hub, tiny_llama, tmp_path):
    hub.verify_as_worker({"rms_norm_llama"}, report="tiny/exact")
    rep = kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False, mode="training")
    norms = [e for e in rep.entries if e.op == "rms_norm"]
    assert norms and all(e.status == "would replace" and e.backward is None and e.backward_reasons
                         for e in norms)
    lines = [ln for ln in _training_lines(rep) if "rms_norm (llama)" in ln]
    assert len(lines) == 1 and "no rms_norm_backward kernel" in lines[0], lines
    # a training lock pins the hub's answer for the backward too, read offline
    lock = tmp_path / "k.lock.json"
    data = kernelize.lock(tiny_llama, hub=hub.url, path=lock, arch="sm_90", mode="training")
    bwd = [r for r in data["resolutions"] if r["op"] == "rms_norm_backward"]
    assert bwd and all(r["digest"] is None and r["excluded"] for r in bwd)
    rep2 = kernelize.kernelize(tiny_llama, lock=lock, arch="sm_90", verbose=False, mode="training")
    lines2 = [ln for ln in _training_lines(rep2) if "rms_norm (llama)" in ln]
    assert len(lines2) == 1 and "no rms_norm_backward kernel" in lines2[0]
    assert all(e.backward_reasons == [*bwd[0]["excluded"]] for e in rep2.entries if e.op == "rms_norm")


class _Props:
    def __init__(self, sms, threads_per_sm):
        self.multi_processor_count, self.max_threads_per_multi_processor = sms, threads_per_sm


@pytest.mark.parametrize("sms, tps, taken", [(132, 2048, True), (114, 2048, False), (132, 1536, False)])
def test_the_hubs_backward_kernel_is_taken_only_on_a_gpu_of_the_sms_it_was_verified_on(
        family, fresh_hub, gpu_faked, monkeypatch, sms, tps, taken):
    """A fresh hub hands out the bundled backward kernel, certified on an H200 (132 SMs x 2048
    threads per SM). Eager's dw order depends on both figures: the client sends the GPU's with
    the backward query, the hub hands the kernel out for the same figures only, and the layer
    keeps its original forward under autograd elsewhere, the report saying which figures were
    verified and which this GPU has."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: _Props(sms, tps))
    rep = _kz(family.model(), hub=fresh_hub.url, mode="training")
    norms = [e for e in rep.entries if e.op == "rms_norm"]
    assert len(norms) == 5 and all(e.status == "replaced" for e in norms), str(rep)
    shapes = {tuple(sorted(e.backward.evidence["device_shape"].items())) for e in norms if e.backward}
    if taken:
        assert all(e.backward is not None and e.backward.name == family.backward
                   for e in norms), str(rep)
        assert shapes == {(("name", "NVIDIA H200"), ("sm_count", 132), ("threads_per_sm", 2048))}
        assert gpu_faked.loaded
    else:
        assert all(e.backward is None for e in norms)
        # (what else was loaded is another layer's: Gemma's act_fn, swapped alone for gelu_tanh
        # where the hub has no gelu_tanh_mul at its width, takes gelu_tanh_backward)
        others = {e.backward.digest for e in rep.entries if e.backward is not None}
        assert all(e.op != "rms_norm" for e in rep.entries if e.backward is not None)
        assert {d for d, _ in gpu_faked.loaded} == others
        (line,) = [ln for ln in _training_lines(rep) if family.what in ln]
        assert "verified on a GPU of 132 SMs x 2048 threads per SM (NVIDIA H200)" in line, line
        assert f"asks for {sms} x {tps}" in line, line   # the hub's exclusion


@pytest.mark.parametrize("sms, tps, taken", [(132, 2048, True), (114, 2048, False)])
def test_a_backward_kernel_verified_on_another_gpu_shape_is_refused_by_the_client_too(
        sms, tps, taken, monkeypatch):
    """A lock (or a hub that does not key on the figures) hands the answer over unchecked: the
    training plan compares the verification's figures with the layer's GPU itself."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: _Props(sms, tps))
    k = kernelize.sources.Resolved("rms_norm_llama_backward", "1.0.0", "sha256:" + "0" * 64, {}, "", "lock x",
                                   {"device_shape": {"name": "NVIDIA H200", "sm_count": 132,
                                                     "threads_per_sm": 2048}})
    why = core.other_device_shape(k, lambda: torch.device("cpu"))
    if taken:
        assert why is None
    else:
        assert why.startswith("rms_norm_llama_backward 1.0.0 was verified on a GPU of 132 SMs x 2048 "
                              "threads per SM (NVIDIA H200)") and f"this GPU has {sms} x {tps}" in why, why
    k.evidence.pop("device_shape")
    assert core.other_device_shape(k, lambda: torch.device("cpu")) is None   # local: no figures


def test_f32_keeps_the_original_forward_under_autograd_and_says_why(family, fkernels, gpu_faked):
    # eager's f32 input gradient is three terms summed in autograd's order (docs/backward.md;
    # test_backward_order_on_cpu pins it; GemmaRMSNorm's f32 graph has no cast node either): no
    # backward kernel is taken in f32
    from kernelize import core
    ref, m = family.model(torch.float32), family.model(torch.float32)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    rep = _kz(m, kernels_dir=fkernels, mode="training")
    norms = [e for e in rep.entries if e.op == "rms_norm"]
    assert len(norms) == 5 and all(e.status == "replaced" and e.backward is None
                                   and e.backward_reasons == [core.F32_ACCUMULATION] for e in norms)
    lines = _training_lines(rep)
    why = [ln for ln in lines if "keep their original forward under autograd" in ln]
    assert len(why) == 1 and "(5 layers)" in why[0] and "in f32 eager autograd" in why[0], lines
    got, want = _grads(m, ids), _grads(ref, ids)
    assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want)
    assert gpu_faked.stages() == [] and gpu_faked.gemma.stages() == []


@pytest.mark.parametrize("dtype", ["bf16", "f32"])   # (f16: bf16's path; slow on a CPU)
def test_adamw_steps_of_a_training_mode_model_are_eagers_bit_for_bit(family, fkernels, gpu_faked,
                                                                      monkeypatch, dtype):
    """Three AdamW steps of the family's tiny model kernelized in training mode against eager:
    every loss and every parameter bit for bit (the stand-ins compute the layer's formula and
    eager autograd's gradients of it: this checks the plumbing, the GPU the kernels' bits). In
    f32 the norms keep their original forward under autograd (F32_ACCUMULATION)."""
    t = DTYPES[dtype]
    eager, kz = family.model(t, seed=1).train(), family.model(t, seed=1).train()
    rep = _kz(kz, kernels_dir=fkernels, mode="training")
    norms = [e for e in rep.entries if e.op == "rms_norm"]
    assert len(norms) == 5 and all(e.status == "replaced" for e in norms)
    assert all((e.backward is not None) == (dtype != "f32") for e in norms), str(rep)
    monkeypatch.setattr(torch.cuda, "is_available", _IS_AVAILABLE)  # swapped; AdamW asks CUDA
    g = torch.Generator().manual_seed(7)
    data = [torch.randint(0, 128, (2, 9), generator=g) for _ in range(3)]
    train_bit_for_bit(eager, kz, data)
    bk = family.recorder(gpu_faked)
    assert bk.stages() == ([] if dtype == "f32" else ["dx", "dwp", "dw"] * 5 * 3)


def test_the_gpu_figures_of_a_report_for_a_hub_whose_answer_lacks_them():
    """A hub before session 19 answers without `device_sm_count`: the client reads the figures
    from the verification's report (`device_shape_of`); a report without them gives None, which
    the training plan does not check (as a local folder)."""
    from kernelize.sources import device_shape_of
    r = {"device": {"name": "NVIDIA H200", "sm_count": 132, "threads_per_sm": 2048, "arch": "sm_90"}}
    assert device_shape_of(r) == {"name": "NVIDIA H200", "sm_count": 132, "threads_per_sm": 2048}
    assert device_shape_of({})["sm_count"] is None
