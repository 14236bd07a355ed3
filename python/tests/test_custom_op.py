"""The launches as PyTorch custom ops (`kernelize/ops.py`), on the CPU: registration, the
fake implementations (FakeTensorMode, opcheck), torch.compile of kernelized models tracing
without graph breaks, and the device a parameterless module resolves to.

There is no GPU here, so the real (CUDA) implementations cannot run: the tests register CPU
stand-ins for the ops (`torch.library.register_kernel(..., "cpu", ...)`) that compute the
eager reference formula, and patch layers with a stand-in compiled kernel whose device is the
CPU, so that the swapped forwards call the custom ops on CPU tensors.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import kernelize
from conftest import REPO
from kernelize import core, launch, ops
from kernelize.discover import _rms_refs, discover
from kernelize.manifest import FUSED_ADD
from kernelize.sources import Resolved

KERNELS = REPO / "kernels"
CONSTRAINTS = {"cols_min": 1, "cols_max": None, "cols_multiple_of": 1, "archs": []}


class CpuStandIn:
    """What `launch.compiled` returns in these tests: a kernel 'loaded' on the CPU."""
    device = torch.device("cpu")

    def __init__(self, manifest):
        self.manifest = manifest


def _rms(x, w, eps, key):
    sem = ops.kernel(key).manifest.get("semantics", "llama")
    return _rms_refs(x, w, eps)[sem].contiguous()


def _fused(x, residual, w, eps, key):
    residual.copy_(x + residual)
    return _rms_refs(residual, w, eps)["llama"].contiguous()


def _fused_ln(x, residual, w, b, eps, key):
    residual.copy_(x + residual)
    return F.layer_norm(residual, (residual.shape[-1],), w, b, eps).contiguous()


STAND_INS = {
    "rms_norm": _rms,
    "fused_add_rms_norm": _fused,
    "layer_norm": lambda x, w, b, eps, key: F.layer_norm(x, (x.shape[-1],), w, b, eps).contiguous(),
    "fused_add_layer_norm": _fused_ln,
    "silu": lambda x, key: F.silu(x).contiguous(),
    "gelu": lambda x, key: F.gelu(x).contiguous(),
    "gelu_tanh": lambda x, key: F.gelu(x, approximate="tanh").contiguous(),
    "silu_and_mul": lambda g, u, key: (F.silu(g) * u).contiguous(),
    "silu_mul": lambda g, u, key: (F.silu(g) * u).contiguous(),
    "gelu_tanh_mul": lambda g, u, key: (F.gelu(g, approximate="tanh") * u).contiguous(),
}
GATED = ("silu_and_mul", "silu_mul", "gelu_tanh_mul")
_REGISTERED = False
_SPIES: dict = {}   # op name -> a function the stand-in calls first with its arguments


def _spied(name):
    def kernel(*args):
        spy = _SPIES.get(name)
        if spy is not None:
            spy(*args)
        return STAND_INS[name](*args)
    return kernel


@pytest.fixture(scope="module")
def cpu_stand_ins():
    """CPU kernels for the custom ops (for this test process only; the shipped package
    registers CUDA implementations alone)."""
    global _REGISTERED
    if not _REGISTERED:
        for name in STAND_INS:
            torch.library.register_kernel(f"kernelize::launch_{name}", "cpu", _spied(name))
        _REGISTERED = True


@pytest.fixture
def cpu_kernels(monkeypatch, cpu_stand_ins):
    """`launch.compiled` gives a CPU stand-in: swapped forwards call the ops on CPU tensors."""
    monkeypatch.setattr(launch, "compiled", lambda digest, manifest, *a, **k: CpuStandIn(manifest))


def _patch_all(model, **kw):
    sites = discover(model, **kw).sites
    for s in sites:
        fake = Resolved(s.op, "1.0.0", "sha256:" + "0" * 64,
                        {"constraints": CONSTRAINTS, "semantics": s.semantics}, "", "test")
        core._patch(s, fake, torch.device("cpu"))
    return sites


# ---- registration and fake implementations --------------------------------------------------

def test_ops_registered():
    for name in ops.OPS:
        op = getattr(torch.ops.kernelize, f"launch_{name}")
        assert ops.op(name) is op
        schema = op.default._schema
        assert schema.arguments[-1].name == "key" and str(schema.arguments[-1].type) == "int"
        mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        assert mutated == (["residual"] if name in FUSED_ADD.values() else []), (name, schema)
        assert len(schema.returns) == 1
    # the real implementations are CUDA ones, registered at the first `register` of a process
    # (`ensure_kernels`: the Python ones where there is no GPU)
    assert ops.ensure_kernels() == "python" or torch.cuda.is_available()
    for name in ops.OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"kernelize::launch_{name}", "CUDA")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"kernelize::py_launch_{name}", "CUDA")


def test_register_gives_stable_keys():
    a, b = object(), object()
    ka, kb = ops.register(a), ops.register(b)
    assert ka != kb and ops.register(a) == ka
    assert ops.kernel(ka) is a and ops.kernel(kb) is b
    with pytest.raises(RuntimeError, match="no compiled kernel under key"):
        ops.kernel(10**9)


def _args(name, x, w, b, key=1):
    return {
        "rms_norm": (x, w, 1e-6, key),
        "fused_add_rms_norm": (x, x.clone(), w, 1e-6, key),
        "layer_norm": (x, w, b, 1e-5, key),
        "fused_add_layer_norm": (x, x.clone(), w, b, 1e-5, key),
        "silu": (x, key), "gelu": (x, key), "gelu_tanh": (x, key),
        "silu_and_mul": (x, x.clone(), key),
        "silu_mul": (x, x.clone(), key),
        "gelu_tanh_mul": (x, x.clone(), key),
    }[name]


@pytest.mark.parametrize("device", ["cuda", "meta"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fake_implementations_shapes(device, dtype):
    """Under FakeTensorMode (what torch.compile traces with) every op gives a new contiguous
    tensor of the input's shape, dtype and device, also for a non-contiguous input; no
    CUDA is needed to trace CUDA tensors."""
    with FakeTensorMode(allow_non_fake_inputs=False):
        x = torch.empty(3, 5, 64, dtype=dtype, device=device)
        xt = torch.empty(3, 64, 5, dtype=dtype, device=device).transpose(1, 2)  # not contiguous
        w = torch.empty(64, dtype=dtype, device=device)
        b = torch.empty(64, dtype=dtype, device=device)
        for name in ops.OPS:
            for inp in (x, xt):
                out = ops.op(name)(*_args(name, inp, w, b))
                assert out.shape == (3, 5, 64) and out.dtype == dtype, name
                assert out.device.type == device and out.is_contiguous(), name
                assert out is not inp and not out._is_view(), name


@pytest.mark.parametrize("name", ops.OPS)
def test_opcheck_cpu_stand_in(name, cpu_stand_ins):
    """torch.library.opcheck (schema, autograd registration, fake tensor vs real, AOT dispatch)
    with the CPU stand-in as the real implementation: the fake implementations agree with a
    real output's shape, dtype and strides, and the mutation declared for the residual."""
    key = ops.register(CpuStandIn({"semantics": "llama"}))
    g = torch.Generator().manual_seed(0)
    for shape in ((4, 64), (2, 3, 64)):
        x = torch.randn(*shape, generator=g).to(torch.bfloat16)
        w = torch.randn(64, generator=g).to(torch.bfloat16)
        b = torch.randn(64, generator=g).to(torch.bfloat16)
        torch.library.opcheck(ops.op(name), _args(name, x, w, b, key))


@pytest.mark.skip(reason="the real implementations launch CUDA kernels (cuLaunchKernel): opcheck of "
                         "the real ops runs in test_gpu.py::test_opcheck_real_launches on a GPU")
def test_opcheck_real_launches():  # pragma: no cover
    pass


# ---- swapped forwards call the ops; torch.compile traces through them -----------------------

class _Net(nn.Module):
    """One layer of every swappable kind, and a direct fused_add_rms_norm call."""

    def __init__(self, cols=64):
        super().__init__()
        self.fc1 = nn.Linear(cols, cols)
        self.silu = nn.SiLU()
        self.gelu = nn.GELU()
        self.gelu_tanh = nn.GELU(approximate="tanh")
        self.ln = nn.LayerNorm(cols)
        self.rms = nn.RMSNorm(cols, eps=1e-6)
        self.w = nn.Parameter(torch.ones(cols))
        self.fused_key = ops.register(CpuStandIn({"semantics": "llama"}))

    def forward(self, x):
        h = self.fc1(x)
        h = self.ln(self.gelu(h)) + self.gelu_tanh(h) + self.silu(h)
        r = h.clone()
        out = ops.op("fused_add_rms_norm")(self.rms(h), r, self.w, 1e-6, self.fused_key)
        return out + r


def _graph_counter():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return graphs, backend


def _ops_in(graphs):
    code = "\n".join(g.code for g in graphs)
    return {name: code.count(f"torch.ops.kernelize.launch_{name}(") for name in ops.OPS}


def test_compile_layers_fullgraph_aot_eager(cpu_kernels):
    torch.manual_seed(0)
    net = _Net().to(torch.bfloat16).eval()
    with torch.no_grad():
        net.rms.weight.normal_(1, 0.3)
        net.ln.weight.normal_(1, 0.3)
        net.ln.bias.normal_(0, 0.1)
    x = torch.randn(2, 7, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        eager = net(x)
        sites = _patch_all(net)
        assert sorted(s.op for s in sites) == ["gelu", "gelu_tanh", "layer_norm", "rms_norm", "silu"]
        swapped = net(x)
        assert kernelize.launch_counts(net) == {s.path: 1 for s in sites}
        graphs, backend = _graph_counter()
        torch._dynamo.reset()
        counted = torch.compile(net, backend=backend, fullgraph=True)
        assert torch.equal(counted(x), eager)
        assert len(graphs) == 1
        # (the fused add + LayerNorm is exact compile's, made from an add and a LayerNorm)
        assert _ops_in(graphs) == {n: 0 if n in GATED or n == "fused_add_layer_norm" else 1
                                   for n in ops.OPS}
        for _ in range(10):  # no recompilation per call (the launch counter is not guarded on)
            assert torch.equal(counted(x), eager)
        assert len(graphs) == 1
        torch._dynamo.reset()
        compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
        assert torch.equal(compiled(x), eager)  # stand-ins compute eager's formulas
        with torch._dynamo.config.patch(error_on_recompile=True):
            for _ in range(3):
                assert torch.equal(compiled(x), eager)
    assert torch.equal(swapped, eager)
    # launch_counts counts eager calls only (not updated while dynamo traces)
    assert kernelize.launch_counts(net) == {s.path: 1 for s in sites}
    with torch.no_grad():
        assert torch.equal(net(x), eager)
    assert kernelize.launch_counts(net) == {s.path: 2 for s in sites}
    assert kernelize.unkernelize(net) == 5
    torch._dynamo.reset()


def test_regional_compile_shares_one_graph_across_kernelized_blocks(cpu_kernels, monkeypatch):
    """Identical blocks compiled one by one (PyTorch's regional compilation) share one graph
    when their layers are kernelized, as they do when they are not: the swapped forward is one
    shared function, and the layers' constants (key, width, eps) are equal across blocks."""
    cache = {}  # as launch.compiled: one compiled kernel per (kernel, dtype), so one key

    def compiled(digest, manifest, source, dtype, device):
        k = repr(sorted(manifest.items())), dtype
        return cache.setdefault(k, CpuStandIn(manifest))

    monkeypatch.setattr(launch, "compiled", compiled)
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.rms = nn.RMSNorm(64, eps=1e-6)
            self.act = nn.SiLU()

        def forward(self, x):
            return x + self.act(self.rms(x))

    torch.manual_seed(0)
    blocks = nn.ModuleList(Block() for _ in range(12)).to(torch.bfloat16).eval()
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        for b in blocks:
            b.rms.weight.normal_(1, 0.3)
        want = x
        for b in blocks:
            want = b(want)
        _patch_all(blocks)
        graphs, backend = _graph_counter()
        torch._dynamo.reset()
        for b in blocks:
            b.compile(backend=backend)
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = x
            for b in blocks:
                got = b(got)
    assert torch.equal(got, want)
    assert len(graphs) == 1, f"{len(graphs)} graphs for 12 identical blocks"
    assert _ops_in(graphs)["rms_norm"] == 1 and _ops_in(graphs)["silu"] == 1
    torch._dynamo.reset()


@pytest.fixture
def small_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        for m in model.modules():
            if "RMSNorm" in type(m).__name__:
                m.weight.normal_(1, 0.3)
    return model


def test_compile_kernelized_llama_no_graph_breaks(cpu_kernels, small_llama):
    """A kernelized Llama (5 RMSNorms, 2 gated MLPs) traces as one graph with the kernels as
    opaque custom-op calls, and the compiled logits equal the uncompiled ones bit for bit."""
    model = small_llama
    ids = torch.randint(0, 128, (1, 12))
    with torch.no_grad():
        eager = model(input_ids=ids, use_cache=False).logits
        torch._dynamo.reset()
        base = torch._dynamo.explain(model)(input_ids=ids, use_cache=False)
        sites = _patch_all(model)
        assert sorted(s.op for s in sites) == ["rms_norm"] * 5 + ["silu_mul"] * 2
        swapped = model(input_ids=ids, use_cache=False).logits
        torch._dynamo.reset()
        ex = torch._dynamo.explain(model)(input_ids=ids, use_cache=False)
        assert ex.graph_break_count == 0, ex.break_reasons
        assert ex.graph_count == 1
        assert _ops_in(ex.graphs)["rms_norm"] == 5 and _ops_in(ex.graphs)["silu_mul"] == 2
        assert _ops_in(ex.graphs)["silu_and_mul"] == 0
        # gate and up go to the kernel as two tensors: no concatenation besides the model's own
        # (its rotary embedding's)
        cats = lambda graphs: "\n".join(g.code for g in graphs).count("torch.cat(")  # noqa: E731
        assert cats(ex.graphs) == cats(base.graphs)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager")
        got = compiled(input_ids=ids, use_cache=False).logits
        with torch._dynamo.config.patch(error_on_recompile=True):
            assert torch.equal(compiled(input_ids=ids, use_cache=False).logits, got)
    assert torch.equal(swapped, eager)
    assert torch.equal(got, swapped)
    assert set(kernelize.launch_counts(model).values()) == {1}  # the eager call
    assert kernelize.unkernelize(model) == 7
    torch._dynamo.reset()


@pytest.mark.parametrize("family", ["gemma", "gemma3"])
def test_kernelized_gemma_gelu_tanh_mul_no_graph_breaks(cpu_kernels, family):
    """Gemma's MLPs (gelu_pytorch_tanh) become gelu_tanh_mul sites: the two projections go to the
    custom op as they are, the logits equal eager's, compiled or not, with no graph break."""
    transformers = pytest.importorskip("transformers")
    model_cls, cfg_cls = {"gemma": ("GemmaForCausalLM", "GemmaConfig"),
                          "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig")}[family]
    if not hasattr(transformers, model_cls):
        pytest.skip(f"this transformers has no {model_cls}")
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_cls)(vocab_size=128, hidden_size=64, intermediate_size=96,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=1, head_dim=16)
    model = getattr(transformers, model_cls)(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, 128, (1, 12))
    calls = []
    with torch.no_grad():
        eager = model(input_ids=ids, use_cache=False).logits
        sites = _patch_all(model)
        assert sorted(s.op for s in sites).count("gelu_tanh_mul") == 2
        # the stand-in's spy (registering the kernel again is refused by torch 2.11)
        _SPIES["gelu_tanh_mul"] = lambda g, u, key: calls.append((g.shape, u.shape))
        try:
            swapped = model(input_ids=ids, use_cache=False).logits
        finally:
            _SPIES.pop("gelu_tanh_mul")
        assert calls == [((1, 12, 96), (1, 12, 96))] * 2  # gate and up, each [.., intermediate]
        torch._dynamo.reset()
        ex = torch._dynamo.explain(model)(input_ids=ids, use_cache=False)
        assert ex.graph_break_count == 0, ex.break_reasons
        assert _ops_in(ex.graphs)["gelu_tanh_mul"] == 2 and _ops_in(ex.graphs)["gelu_tanh"] == 0
        compiled = torch.compile(model, backend="aot_eager")
        got = compiled(input_ids=ids, use_cache=False).logits
    assert torch.equal(swapped, eager)
    assert torch.equal(got, eager)
    assert kernelize.unkernelize(model) == len(sites)
    torch._dynamo.reset()


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
def test_compile_falls_back_for_inputs_the_kernel_does_not_take(cpu_kernels):
    """Another dtype, or autograd needed: the compiled forward runs the original layer."""
    torch.manual_seed(0)
    norm = nn.RMSNorm(64, eps=1e-6).to(torch.bfloat16)
    sites = _patch_all(norm)
    assert [s.op for s in sites] == ["rms_norm"]
    torch._dynamo.reset()
    compiled = torch.compile(norm, backend="aot_eager")
    x32 = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(compiled(x32), F.rms_norm(x32, (64,), norm.weight.float(), 1e-6))
    xb = torch.randn(3, 64, dtype=torch.bfloat16, requires_grad=True)
    y = compiled(xb)  # grad enabled and the weight requires grad: the original forward
    y.float().sum().backward()
    assert xb.grad is not None
    assert kernelize.launch_counts(norm) == {"<root>": 0}
    kernelize.unkernelize(norm)
    torch._dynamo.reset()


# ---- the device of a parameterless module ---------------------------------------------------

def _fake_cuda(monkeypatch, available: bool):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


def test_parameterless_module_uses_current_cuda_device(monkeypatch):
    _fake_cuda(monkeypatch, True)
    dev = core._cuda_device(nn.SiLU(), None)
    assert dev == torch.device("cuda", 1)
    assert core._arch_of(dev, None) == "sm_90"
    # through kernelize (not swapped: there is no real GPU to compile on here)
    rep = kernelize.kernelize(nn.SiLU(), kernels_dir=KERNELS / "silu", dtype="bf16",
                              swap=False, verbose=False)
    assert rep.arch == "sm_90"
    assert [(e.op, e.status) for e in rep.entries] == [("silu", "would replace")]
    # a module with parameters keeps the parameters' device: on the CPU it is no CUDA model
    assert core._cuda_device(nn.Linear(2, 2), None) is None
    with pytest.raises(ValueError, match="arch is needed"):
        kernelize.kernelize(nn.Linear(2, 2), kernels_dir=KERNELS / "silu", verbose=False)


def test_parameterless_module_without_cuda_still_needs_arch(monkeypatch):
    _fake_cuda(monkeypatch, False)
    assert core._cuda_device(nn.SiLU(), None) is None
    with pytest.raises(ValueError, match="arch is needed"):
        kernelize.kernelize(nn.SiLU(), kernels_dir=KERNELS / "silu", dtype="bf16", verbose=False)
    rep = kernelize.kernelize(nn.SiLU(), kernels_dir=KERNELS / "silu", dtype="bf16",
                              arch="sm_90", verbose=False)
    assert not rep.swapped and [e.status for e in rep.entries] == ["would replace"]


# ---- the launches' arguments follow the ABI (python/tests/fixtures/abi.json) ---------------

class _Recorder:
    """A stand-in compiled kernel that records what it is launched with."""

    def __init__(self):
        self.calls = []

    def launch(self, rows, cols, tensors, scalars):
        self.calls.append((rows, cols, (*tensors, *scalars)))


def test_every_launch_passes_the_abi_of_its_op():
    import ctypes
    import json
    abi = json.loads((REPO / "python/tests/fixtures/abi.json").read_text(encoding="utf-8"))["ops"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, generator=g).to(torch.bfloat16)
    u = torch.randn(2, 3, 8, generator=g).to(torch.bfloat16)
    w, b = torch.randn(8).to(torch.bfloat16), torch.randn(8).to(torch.bfloat16)
    runs = {
        "rms_norm": lambda k: launch.run_rms_norm(k, x, w, 1e-6),
        "fused_add_rms_norm": lambda k: launch.run_fused_add_rms_norm(k, x, u.clone(), w, 1e-6),
        "layer_norm": lambda k: launch.run_layer_norm(k, x, w, b, 1e-5),
        "fused_add_layer_norm": lambda k: launch.run_fused_add_layer_norm(k, x, u.clone(), w, b, 1e-5),
        "silu": lambda k: launch.run_elementwise(k, x),
        "gelu": lambda k: launch.run_elementwise(k, x),
        "gelu_tanh": lambda k: launch.run_elementwise(k, x),
        "silu_and_mul": lambda k: launch.run_silu_and_mul(k, x, u),
        "silu_mul": lambda k: launch.run_gated(k, x, u),
        "gelu_tanh_mul": lambda k: launch.run_gated(k, x, u),
    }
    assert set(runs) == set(abi) == set(ops.OPS)
    for op, run in runs.items():
        k = _Recorder()
        out = run(k)
        (rows, cols, args), = k.calls
        params = [p.strip() for p in abi[op]["abi"].split(",")]
        assert len(args) == len(params), op
        for p, a in zip(params, args):
            # pointers are tensors, `long long` Python ints, `float` Python floats
            kind = torch.Tensor if "*" in p else int if p.startswith("long long") else float
            assert isinstance(a, kind) and not isinstance(a, bool), (op, p, a)
        named = dict(zip(abi[op]["params"], args))
        assert named["out"] is out, op
        if "n" in named:
            assert (named["n"], rows * cols) == (48, 48), op
        else:
            assert (named["rows"], named["cols"], rows, cols) == (6, 8, 6, 8), op
        if abi[op]["gated"]:
            # gate and up are passed as they are: two tensors, no copy, no concatenation
            assert named["gate"] is x and named["up"] is u, op
    # silu_and_mul's x is gate and up concatenated: [rows, 2*cols]
    k = _Recorder()
    launch.run_silu_and_mul(k, x, u)
    assert torch.equal(k.calls[0][2][1], torch.cat([x, u], dim=-1))


def test_a_gated_launch_makes_each_input_contiguous_and_refuses_other_shapes():
    k = _Recorder()
    gt = torch.randn(8, 6).to(torch.float16).t()  # [6, 8], not contiguous
    u = torch.randn(6, 8).to(torch.float16)
    out = launch.run_gated(k, gt, u)
    (_, _, args), = k.calls
    assert args[1].is_contiguous() and torch.equal(args[1], gt) and args[2] is u
    assert out.shape == (6, 8) and out.is_contiguous()
    with pytest.raises(ValueError, match="differ in shape"):
        launch.run_gated(k, u, u[:, :4])
    assert len(k.calls) == 1
    # nothing to launch for an empty batch
    e = torch.empty(0, 8, dtype=torch.float16)
    assert launch.run_gated(k, e, e).shape == (0, 8) and len(k.calls) == 1


def test_a_kernelized_model_deep_copies(cpu_kernels, small_llama):
    """copy.deepcopy of a kernelized model (issue 27 item 7: it failed with "ctypes objects
    containing pointers cannot be pickled"): the copy shares each loaded kernel (a process-wide
    resource holding CUDA driver handles), starts with no prepared launches of its own, computes
    the same logits, and is undone on its own."""
    import ctypes
    model = small_llama
    ids = torch.randint(0, 128, (1, 12))
    sites = _patch_all(model)
    # what a real load leaves on a swapped layer: a CompiledKernel holding ctypes handles, and
    # prepared launches holding ctypes argument arrays
    real = object.__new__(launch.CompiledKernel)
    real.func = ctypes.c_void_p(1234)
    for s in sites:
        s.module.__dict__["_kz_compiled"] = real
        s.module.__dict__["_kz_preps"][(1, 64)] = (None, (ctypes.c_void_p * 3)())
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
    twin = copy.deepcopy(model)
    for s in sites:
        name = next(n for n, m in model.named_modules() if m is s.module)
        t = twin.get_submodule(name)
        assert t.__dict__["_kz_compiled"] is real                      # shared, not copied
        assert t.__dict__["_kz_preps"] == {} and type(t.__dict__["_kz_preps"]) is type(
            s.module.__dict__["_kz_preps"])                             # prepared afresh
        assert t.forward.__self__ is t                                  # bound to the copy
    with torch.no_grad():
        assert torch.equal(twin(input_ids=ids, use_cache=False).logits, want)
    assert kernelize.unkernelize(twin) == 7
    assert all("_kz" in s.module.__dict__ for s in sites)              # the original still swapped
    assert kernelize.unkernelize(model) == 7


def test_an_operator_without_a_backward_refuses_an_input_that_needs_a_gradient():
    """kernelize's operators have no autograd kernel (`ops.define`): PyTorch's fallback would
    return an output whose backward only warns and gives no gradient through the kernel. The
    kernel refuses the call instead; without a gradient to compute it runs."""
    seen = []

    @ops.define("test_define_guard", "(Tensor x, float s) -> Tensor", lambda x, s: torch.empty_like(x),
                "CPU")
    def _(x, s):
        seen.append(s)
        return (x * s).detach()   # as a kernel launch: nothing recorded for autograd

    op = torch.ops.kernelize.test_define_guard
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="test_define_guard has no backward"):
        op(x, 2.0)
    assert seen == []
    with torch.no_grad():
        assert torch.equal(op(x, 2.0), x.detach() * 2)
    assert torch.equal(op(x.detach(), 3.0), x.detach() * 3)   # grad mode on, no input needs one
    assert seen == [2.0, 3.0]
    # the fake kernel gives the shape under FakeTensorMode
    with FakeTensorMode():
        assert op(torch.empty(2, 5), 1.0).shape == (2, 5)
