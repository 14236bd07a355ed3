"""The client as a user handles it (issue 27): a kernelized model pickles (`torch.save`) and
loads in another process, its state_dict is the original's, parameterless layers take the
dtype of the call, and `kernelize.get_kernel` hands out one kernel as a plain callable.

No GPU here: the kernels that really run are Python candidates (docs/spec.md section 2b), which
`kernelize(..., device="cpu", swap=True)` swaps on CPU tensors; a CUDA kernel is swapped with a
CPU stand-in only where a test needs a layer holding one (its load in another process, which
has no CUDA, is what is checked)."""

from __future__ import annotations

import copy
import json
import logging
import pickle
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernelize
from conftest import REPO
from kernelize import core, launch
from kernelize.discover import discover
from kernelize.sources import DirSource, Key
from test_custom_op import CpuStandIn, cpu_stand_ins  # noqa: F401 (a fixture: CPU ops)

transformers = pytest.importorskip("transformers")

KERNELS = REPO / "kernels"
PY_RMS = KERNELS / "third-party" / "f_rms_norm_as_llama"   # a Python candidate (F.rms_norm)


@pytest.fixture(autouse=True)
def _own_kernel_cache(monkeypatch):
    """The kernels these tests load stay out of the process-wide cache (`launch._CACHE`) that
    other test files look at."""
    monkeypatch.setattr(launch, "_CACHE", dict(launch._CACHE))


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


NORMS = ["model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
         "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm",
         "model.norm"]


def _run_child(code: str, tmp_path) -> subprocess.CompletedProcess:
    """`code` in a fresh Python process (nothing loaded, no monkeypatch), with the package."""
    script = tmp_path / "child.py"
    script.write_text(code)
    env = {"PYTHONPATH": str(REPO / "python"), "PATH": "/usr/bin:/bin",
           "KERNELIZE_C_LAUNCHER": "0", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _load_in_child(model, ids, want, tmp_path, more: str = ""):
    """torch.save `model`, load it in a fresh process and run it on `ids`: (what the child
    printed as JSON -- logits equal to `want`, launch counts, and the entries `more` adds to
    the dict, Python source evaluated after the call -- and the finished process)."""
    torch.save(model, tmp_path / "model.pt")
    torch.save({"ids": ids, "want": want}, tmp_path / "io.pt")
    r = _run_child("""
import json, torch, kernelize
model = torch.load("model.pt", weights_only=False)
io = torch.load("io.pt")
with torch.no_grad():
    got = model(input_ids=io["ids"], use_cache=False).logits
print(json.dumps({"equal": torch.equal(got, io["want"]),
                  "launches": kernelize.launch_counts(model),%s}))
""" % more, tmp_path)
    return json.loads(r.stdout.strip().splitlines()[-1]), r


# ---- 1. pickle, torch.save, state_dict -------------------------------------------------------

def test_a_kernelized_model_saves_and_loads_in_another_process_with_its_kernels(tmp_path):
    model = _llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rep = kernelize.kernelize(model, kernels_dir=PY_RMS, device="cpu", swap=True,
                              arch="sm_90", verbose=False)
    assert sorted(e.path for e in rep.entries if e.status == "replaced") == sorted(NORMS)
    # the kernel wrappers add no keys and change no values of the state_dict
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)

    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
    out, r = _load_in_child(model, ids, want, tmp_path, """
                  "kernels": sorted({m._kernelize_kernel.label for m in model.modules()
                                     if "_kernelize_kernel" in m.__dict__}),
                  "keys": list(model.state_dict()),
                  "restored": kernelize.unkernelize(model)""")
    # the loaded model launched the kernel in every norm (once each), as the original did
    assert out == {"equal": True, "launches": {p: 1 for p in NORMS},
                   "kernels": ["f_rms_norm_as_llama 1.0.0"], "keys": list(before),
                   "restored": 5}
    assert "original forward" not in r.stderr


def test_pickle_round_trip_in_process_is_swapped_and_undone_on_its_own():
    model = _llama()
    kernelize.kernelize(model, kernels_dir=PY_RMS, device="cpu", swap=True, arch="sm_90",
                        verbose=False)
    twin = pickle.loads(pickle.dumps(model))
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
        assert torch.equal(twin(input_ids=ids, use_cache=False).logits, want)
    assert kernelize.launch_counts(twin) == {p: 1 for p in NORMS}
    for p in NORMS:  # bound to the loaded layer, not to the pickled one
        assert twin.get_submodule(p).forward.__self__ is twin.get_submodule(p)
    assert kernelize.unkernelize(twin) == 5
    assert kernelize.launch_counts(twin) == {} and kernelize.launch_counts(model) != {}
    assert all("forward" not in twin.get_submodule(p).__dict__ for p in NORMS)
    pickle.dumps(twin)  # an unkernelized layer pickles as a plain one
    with torch.no_grad():
        plain = twin(input_ids=ids, use_cache=False).logits
    kernelize.unkernelize(model)
    with torch.no_grad():
        assert torch.equal(plain, model(input_ids=ids, use_cache=False).logits)


class _FakeLoaded:
    """A CUDA kernel 'loaded' on cuda:0 (this process only; CPU inputs fall back)."""
    device = torch.device("cuda", 0)

    def __init__(self, manifest):
        self.manifest = manifest


def test_a_cuda_kernel_loaded_where_it_cannot_run_keeps_the_original_forward(tmp_path,
                                                                           monkeypatch):
    """A model saved with a CUDA kernel, loaded on a machine without CUDA: it loads, every
    layer runs its original forward, and one warning line says why."""
    model = _llama()
    src = DirSource(KERNELS / "rms_norm_llama")
    monkeypatch.setattr(launch, "compiled", lambda digest, manifest, *a, **k: _FakeLoaded(manifest))
    for s in discover(model).sites:
        if s.op == "rms_norm":
            res = src.resolve(Key("rms_norm", "llama", "bf16", "sm_90", 64, "bit_exact"))
            core._patch(s, res.kernel, torch.device("cuda", 0))
    assert sorted(kernelize.launch_counts(model)) == sorted(NORMS)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # CPU inputs: the swapped layers run their original forward
        want = model(input_ids=ids, use_cache=False).logits
    out, r = _load_in_child(model, ids, want, tmp_path)
    assert out == {"equal": True, "launches": {}}
    warned = [line for line in r.stderr.splitlines() if "keeps its original forward" in line]
    assert len(warned) == 1, r.stderr   # one line for the five layers
    assert res.kernel.label in warned[0] and "LlamaRMSNorm" in warned[0]


def test_a_tampered_kernel_in_a_pickle_is_not_loaded(caplog):
    model = _llama()
    kernelize.kernelize(model, kernels_dir=PY_RMS, device="cpu", swap=True, arch="sm_90",
                        verbose=False)
    k = model.model.norm._kernelize_kernel
    data = pickle.dumps(model)
    evil = k.source.replace("weight, eps)", "weight,2e-1)")   # same length: a valid pickle
    assert evil != k.source and data.count(k.source.encode()) == 1
    data = data.replace(k.source.encode(), evil.encode())
    with caplog.at_level(logging.WARNING, logger="kernelize"):
        twin = pickle.loads(data)
    assert kernelize.launch_counts(twin) == {}
    assert any("DigestMismatch" in r.getMessage() for r in caplog.records), caplog.text
    kernelize.unkernelize(model)
    ids = torch.randint(0, 128, (1, 5))
    with torch.no_grad():
        assert torch.equal(twin(input_ids=ids, use_cache=False).logits,
                           model(input_ids=ids, use_cache=False).logits)


# ---- 2. a parameterless layer takes the dtype of the call -----------------------------------

SILU_TOML = '''name = "py_silu"
version = "1.0.0"
op = "silu"
description = "F.silu as a Python candidate"
authors = ["tests"]
license = "MIT"
runtime = "python"
source = "kernel.py"
requires = ["torch>=2.4"]

[entry]
bf16 = "silu"
f32 = "silu"
'''
SILU_SOURCE = "import torch.nn.functional as F\n\n\ndef silu(x):\n    return F.silu(x)\n"


@pytest.fixture
def py_silu(tmp_path):
    """A Python candidate for silu with bf16 and f32 entries (none for f16)."""
    d = tmp_path / "kernels" / "py_silu"
    d.mkdir(parents=True)
    (d / "kernel.toml").write_text(SILU_TOML)
    (d / "kernel.py").write_text(SILU_SOURCE)
    return d


def test_a_parameterless_layer_takes_the_dtype_of_each_call(py_silu, caplog):
    act = nn.SiLU()
    rep = kernelize.kernelize(act, kernels_dir=py_silu, device="cpu", swap=True, arch="sm_90",
                              verbose=False)
    # resolved for each dtype: one entry per dtype, all of the one layer
    assert [(e.dtype, e.status, e.by_call) for e in rep.entries] == [
        ("bf16", "replaced", True), ("f16", "kept", True), ("f32", "replaced", True)]
    assert rep.entries[1].reasons == ["py_silu 1.0.0: has no f16 entry"]
    assert str(rep).splitlines()[0].startswith("kernelize: 1 of 1 layers replaced")
    assert "[SiLU: silu, bf16 calls, cols=" in str(rep)
    assert kernelize.launch_counts(act) == {"<root>": 0}   # nothing loaded before a call

    g = torch.Generator().manual_seed(4)
    with caplog.at_level(logging.WARNING, logger="kernelize"):
        for dt, launched in [(torch.bfloat16, 1), (torch.float32, 2), (torch.float16, 2),
                             (torch.float16, 2), (torch.float64, 2), (torch.bfloat16, 3),
                             (torch.float64, 3)]:
            x = (torch.randn(3, 5, generator=g) * 4).to(dt)
            assert torch.equal(act(x), F.silu(x)), dt
            assert kernelize.launch_counts(act) == {"<root>": launched}, dt
    said = [r.getMessage() for r in caplog.records]
    # a dtype with no kernel runs the original forward and says so once
    assert len(said) == 2, said
    assert "called in f16: no kernel (py_silu 1.0.0: has no f16 entry)" in said[0]
    assert "called in torch.float64" in said[1] and "not bf16, f16 or f32" in said[1]
    # loaded for bf16 and f32 only, each once
    loaded = act.__dict__["_kz_dtypes"]
    assert {dt: bool(v) for dt, v in loaded.items()} == {
        torch.bfloat16: True, torch.float32: True, torch.float16: False, torch.float64: False}
    assert kernelize.unkernelize(act) == 1
    assert "forward" not in act.__dict__ and kernelize.launch_counts(act) == {}


def test_a_layer_swapped_by_call_dtype_copies_and_pickles(py_silu):
    act = nn.SiLU()
    kernelize.kernelize(act, kernels_dir=py_silu, device="cpu", swap=True, arch="sm_90",
                        verbose=False)
    x = torch.randn(2, 6).to(torch.bfloat16)
    act(x)
    twin, clone = pickle.loads(pickle.dumps(act)), copy.deepcopy(act)
    for m in (twin, clone):
        assert torch.equal(m(x), F.silu(x))
        assert torch.equal(m(x.float()), F.silu(x.float()))
    assert kernelize.launch_counts(twin) == {"<root>": 2}        # loaded afresh, counts afresh
    assert kernelize.launch_counts(clone) == {"<root>": 3}       # the copy keeps the count
    assert kernelize.launch_counts(act) == {"<root>": 1}
    assert kernelize.unkernelize(twin) == kernelize.unkernelize(clone) == 1
    assert kernelize.launch_counts(act) == {"<root>": 1}


def test_a_parameterless_layer_with_a_dtype_given_is_resolved_for_that_dtype_only(py_silu):
    rep = kernelize.kernelize(nn.SiLU(), kernels_dir=py_silu, dtype="bf16", arch="sm_90",
                              verbose=False)
    assert [(e.dtype, e.status, e.by_call) for e in rep.entries] == [
        ("bf16", "would replace", False)]
    # a layer with parameters of another dtype is not a parameterless one: kept, as before
    rep = kernelize.kernelize(nn.LayerNorm(8).double(), kernels_dir=KERNELS / "layer_norm",
                              arch="sm_90", verbose=False)
    assert [(e.dtype, e.status, e.reasons) for e in rep.entries] == [
        (None, "kept", ["dtype is not bf16, f16 or f32"])]


# ---- 3. get_kernel: one verified kernel as a plain callable ----------------------------------

def test_get_kernel_from_a_local_folder_is_a_plain_function(py_silu):
    f = kernelize.get_kernel("silu", dtype="bf16", cols=64, kernels_dir=py_silu, device="cpu",
                             arch="sm_90")
    x = (torch.randn(3, 64, generator=torch.Generator().manual_seed(5)) * 4).to(torch.bfloat16)
    assert torch.equal(f(x), F.silu(x))
    assert f.evidence["kernel"] == "py_silu@1.0.0"
    assert f.evidence["digest"] == f.kernel.digest and f.evidence["digest"].startswith("sha256:")
    assert f.evidence["class"] == "unverified local kernel (policy not checked)"
    assert "py_silu@1.0.0" in repr(f) and "bf16" in repr(f)
    with pytest.raises(ValueError, match="resolved for bf16"):
        f(x.float())
    # no kernel: the op, dtype, width and the source's reasons
    with pytest.raises(kernelize.KernelNotFound,
                       match=r"no silu \(default\) kernel for f16, cols=64 on sm_90 .*"
                             r"py_silu 1.0.0: has no f16 entry") as e:
        kernelize.get_kernel("silu", dtype="f16", cols=64, kernels_dir=py_silu, device="cpu",
                             arch="sm_90")
    assert e.value.reasons == ["py_silu 1.0.0: has no f16 entry"]
    # a CUDA kernel needs CUDA to be loaded: said, not a crash inside NVRTC
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="is a CUDA kernel: loading it needs a CUDA device"):
            kernelize.get_kernel("rms_norm", dtype="bf16", cols=64, kernels_dir=KERNELS,
                                 names=["rms_norm_llama"], arch="sm_90")


def test_get_kernel_from_the_hub_and_a_lock(hub, tmp_path):
    from test_python_candidates import submit   # the Python candidate py_rms (F.rms_norm)
    digest = submit(hub)
    ask = dict(dtype="bf16", cols=64, hub=hub.url, arch="sm_90", device="cpu", allow_python=True)
    with pytest.raises(kernelize.KernelNotFound,
                       match=r"no rms_norm \(llama\) kernel for bf16, cols=64 on sm_90") as e:
        kernelize.get_kernel("rms_norm", **ask)
    assert any(r.startswith("py_rms 1.0.0: never verified") for r in e.value.reasons), e.value.reasons
    assert any(r.startswith("rms_norm_llama ") for r in e.value.reasons), e.value.reasons

    assert hub.verify_as_worker({"py_rms"}, report="tiny/exact") == {"py_rms": digest}
    rms = kernelize.get_kernel("rms_norm", **ask)
    assert rms.evidence["kernel"] == "py_rms@1.0.0" and rms.evidence["digest"] == digest
    assert rms.evidence["class"] and rms.evidence["verification_id"]
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(2, 7, 64, generator=g).bfloat16(), torch.randn(64, generator=g).bfloat16()
    assert torch.equal(rms(x, w, eps=1e-6), F.rms_norm(x, (64,), w, 1e-6))
    with pytest.raises(ValueError, match="cols=64"):
        rms(torch.randn(2, 32).bfloat16(), w[:32], 1e-6)
    # without the opt-in the hub is not asked for Python candidates
    with pytest.raises(kernelize.KernelNotFound):
        kernelize.get_kernel("rms_norm", **{**ask, "allow_python": False})

    # the same kernel from a lock, offline
    path = tmp_path / "kernelize.lock.json"
    kernelize.lock(_llama(), hub=hub.url, path=path, arch="sm_90", allow_python=True)
    _stop_hub(hub)   # offline from here
    locked = kernelize.get_kernel("rms_norm", dtype="bf16", cols=64, lock=path, arch="sm_90",
                                  device="cpu", allow_python=True)
    assert locked.evidence["digest"] == digest
    assert locked.evidence["verification_id"] == rms.evidence["verification_id"]
    assert torch.equal(locked(x, w, 1e-6), rms(x, w, 1e-6))
    with pytest.raises(kernelize.KernelNotFound, match="not in lock"):
        kernelize.get_kernel("rms_norm", dtype="bf16", cols=128, lock=path, arch="sm_90",
                             device="cpu", allow_python=True)


def _stop_hub(hub):
    from conftest import _stop
    _stop(hub)


# ---- the report's entries print as lines ------------------------------------------------------

def test_print_report_replaced_is_one_readable_line_per_layer():
    model = _llama()
    rep = kernelize.kernelize(model, kernels_dir=KERNELS, names=["rms_norm_llama", "silu_mul"],
                              arch="sm_90", verbose=False)
    text = repr(rep.replaced)
    k = next(e.kernel for e in rep.replaced if e.path == "model.norm")
    assert len(rep.replaced) == 7 and k.source and k.source[:200] not in text
    assert len(text) < 250 * 7, text
    assert repr(rep.entries[0]) == f"<would replace: {rep.entries[0].line()}>"
    assert f"<would replace: model.norm [LlamaRMSNorm: rms_norm (llama), bf16, cols=64] -> {k.label} " in text
    # the report's lines are the same lines
    assert all(f"  would replace {e.line()}" in str(rep).splitlines() for e in rep.replaced)


def test_a_layer_swapped_by_call_dtype_compiles_without_graph_breaks(monkeypatch, cpu_stand_ins):
    """Under torch.compile (fullgraph): a dtype loaded by an eager call is one custom-op node;
    a dtype first seen while tracing runs the original forward (loading is eager only)."""
    monkeypatch.setattr(launch, "compiled", lambda digest, manifest, *a, **k: CpuStandIn(manifest))
    k = DirSource(KERNELS / "silu").resolve(Key("silu", "default", "bf16", "sm_90", 64,
                                                "bit_exact")).kernel
    act = nn.SiLU()
    core._install_by_call(act, {"bf16": k, "f16": ["none qualified"], "f32": k},
                          ("silu", None, 64, 0.0, "cpu", False), core._NoInstanceForward)
    x = torch.randn(4, 64).bfloat16()
    assert torch.equal(act(x), F.silu(x)) and kernelize.launch_counts(act) == {"<root>": 1}
    graphs = []

    def backend(gm, example):
        graphs.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(act, backend=backend, fullgraph=True)
    assert torch.equal(compiled(x), F.silu(x))
    assert "torch.ops.kernelize.launch_silu(" in graphs[-1]
    for dt in (torch.float32, torch.float16):
        assert torch.equal(compiled(x.to(dt)), F.silu(x.to(dt)))
        assert "launch_silu" not in graphs[-1], dt
    torch._dynamo.reset()
