"""The field's backward as Python candidates (issue 30; the backward candidates of kernels/third-party/,
kernelize_verifier.backward_field, scripts/backward_field_check.py), on the CPU.

The verifier measures them as it measures any Python candidate (docs/backward.md, "The field's
backward as Python candidates", items 1-8); these tests pin, on the CPU: the Python
signature of each backward op against the CUDA ABI (abi.json), every candidate folder against
it, the interim check against eager autograd (it finds a wrong, modifying, non-deterministic or
misshapen candidate), and each candidate's wiring: the torch.compile ones with torch.compile
replaced (identity, and AOTAutograd without Inductor), Liger's with a stand-in `liger_kernel`
package written here (eager's formulas behind Liger's function names and call forms, its
in-place backward writing into the saved inputs as Liger's SwiGLU and GeGLU do). Liger's Triton
kernels and Inductor's code run only on the GPU machine (the script's command is in
docs/backward.md).
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
import tomllib

import pytest
import torch

from conftest import REPO
from kernelize.manifest import ManifestError, check_requirement, defines_function, parse_manifest_toml
from kernelize_verifier import backward_field as BF

FOLDER = REPO / "kernels" / "third-party"
ABI = json.loads((REPO / "python/tests/fixtures/abi.json").read_text(encoding="utf-8"))
CANDIDATES = BF.candidates(FOLDER)   # the backward ones among kernels/third-party/
SCALARS = ("rows", "cols", "n", "sms", "threads_per_sm", "eps")

# A stand-in for liger_kernel 0.8.5's entry points the candidates call (eager's formulas behind
# them), with Liger's in-place backward of SwiGLU / GeGLU (the gradients written into the saved
# gate and up) and a record of how each was called.
FAKE_LIGER = {
    "liger_kernel/__init__.py": "CALLS = []\n",
    "liger_kernel/transformers/__init__.py": "",
    "liger_kernel/transformers/functional.py": '''
import torch
import torch.nn.functional as F
from liger_kernel import CALLS


def liger_rms_norm(X, W, eps, offset=0.0, casting_mode="llama", in_place=True):
    CALLS.append(("rms_norm", offset, casting_mode, in_place))
    h = X.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (offset + W) * h.to(X.dtype)


class _InPlaceGated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, act):
        ctx.save_for_backward(a, b)
        ctx.act = act
        return act(a) * b

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        with torch.enable_grad():
            ar, br = a.detach().requires_grad_(), b.detach().requires_grad_()
            da, db = torch.autograd.grad(ctx.act(ar) * br, (ar, br), dc)
        a.copy_(da)   # Liger writes the gradients into the saved inputs
        b.copy_(db)
        return a, b, None


def liger_swiglu(a, b):
    CALLS.append(("swiglu",))
    return _InPlaceGated.apply(a, b, F.silu)


def liger_geglu(a, b):
    CALLS.append(("geglu",))
    return _InPlaceGated.apply(a, b, lambda g: F.gelu(g, approximate="tanh"))
''',
    "liger_kernel/ops/__init__.py": "",
    "liger_kernel/ops/layer_norm.py": '''
import torch
from liger_kernel import CALLS


def layer_norm_backward(dY, X, W, B, Mean, RSTD):
    CALLS.append(("layer_norm_backward", tuple(Mean.shape), Mean.dtype, tuple(B.shape)))
    rows, cols = X.shape
    mean, rstd = Mean.reshape(rows, 1), RSTD.reshape(rows, 1)
    if X.device.type == "cpu":
        mean, rstd = mean.to(X.dtype), rstd.to(X.dtype)
    return torch.ops.aten.native_layer_norm_backward(dY, X, [cols], mean, rstd, W, B,
                                                     [True, True, True])
''',
}


def _write_fake_liger(root):
    for rel, text in FAKE_LIGER.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def fake_liger(tmp_path, monkeypatch):
    root = _write_fake_liger(tmp_path / "pkgs")
    monkeypatch.syspath_prepend(str(root))
    for m in [m for m in sys.modules if m == "liger_kernel" or m.startswith("liger_kernel.")]:
        monkeypatch.delitem(sys.modules, m)
    import liger_kernel
    yield liger_kernel.CALLS
    for m in [m for m in sys.modules if m == "liger_kernel" or m.startswith("liger_kernel.")]:
        del sys.modules[m]


@pytest.fixture
def compile_as(monkeypatch):
    """torch.compile replaced while a candidate is loaded: `compile_as("identity")` (the
    function itself) or `compile_as("aot_eager")` (AOTAutograd's traced forward and backward,
    no Inductor)."""
    real = torch.compile

    def use(how):
        if how == "identity":
            monkeypatch.setattr(torch, "compile", lambda f=None, **kw: f if f is not None else (lambda g: g))
        else:
            monkeypatch.setattr(torch, "compile", lambda f=None, **kw: functools.partial(real, backend=how)(f))
    yield use
    torch._dynamo.reset()


def _manifest(name):
    return tomllib.loads((FOLDER / name / "kernel.toml").read_text(encoding="utf-8"))


# ---- the signature ----------------------------------------------------------------------------

def test_each_backward_ops_python_signature_is_its_abis():
    """SIGNATURES is derived from the CUDA ABI (docs/spec.md section 2c): the stages' tensors
    that are neither gradients nor the workspace, in order of first appearance, then eps where
    the op takes it; the gradients in Op::gradients order. (A backward op added to the ABI
    later has none until someone writes it: said, not failed, so that adding an op to the hub
    does not wait on the field's candidates.)"""
    import warnings
    ops = ABI["backward_ops"]
    assert set(BF.SIGNATURES) <= set(ops)
    missing = sorted(set(ops) - set(BF.SIGNATURES))
    if missing:
        warnings.warn(f"backward ops without a Python signature in backward_field.SIGNATURES: {missing}")
    for op, spec in ((op, ops[op]) for op in BF.SIGNATURES):
        grads = tuple(g["name"] for g in spec["gradients"])
        args: list[str] = []
        for st in spec["stages"]:
            for n in st["names"]:
                if n not in grads and n != "ws" and n not in SCALARS and n not in args:
                    args.append(n)
        if spec["takes_eps"]:
            args.append("eps")
        assert BF.SIGNATURES[op] == (tuple(args), grads), op
    # the incoming gradients (what a setup function does not get) are Op::incoming_gradients
    for op, spec in ops.items():
        assert set(spec["incoming"]) <= set(BF.INCOMING), op
        if op in BF.SIGNATURES:
            sig = BF.SIGNATURES[op][0]
            assert tuple(a for a in sig if a in BF.INCOMING) == tuple(spec["incoming"]), op


# ---- the candidate folders ---------------------------------------------------------------------

def test_the_field_has_its_candidates():
    assert CANDIDATES == ["compile_layer_norm_backward", "compile_llama_rms_norm_backward",
                          "compile_silu_mul_backward", "liger_geglu_backward",
                          "liger_layer_norm_backward", "liger_rms_norm_llama_backward",
                          "liger_swiglu_backward"]


@pytest.mark.parametrize("name", CANDIDATES)
def test_each_candidate_follows_its_ops_signature(name):
    m = _manifest(name)
    assert m["name"] == name and m["runtime"] == "python" and m["source"] == "kernel.py"
    assert m["op"] in BF.SIGNATURES and m["license"] == "Apache-2.0"
    if m["op"] == "rms_norm_backward":
        assert m["semantics"] == "llama"
    assert all(check_requirement(r) for r in m["requires"])
    assert set(m["entry"]) == {"bf16", "f16", "f32"}
    src = (FOLDER / name / "kernel.py").read_text(encoding="utf-8")
    fns = {n.name: n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)}
    sig = BF.SIGNATURES[m["op"]][0]
    for fn in set(m["entry"].values()):
        assert defines_function(src, fn)
        # with a setup (`[setup]`), its state comes last
        assert tuple(a.arg for a in fns[fn].args.args) == sig + (("state",) if m.get("setup") else ()), (name, fn)
    for fn in set(m.get("setup", {}).values()):
        # a setup gets what a forward had: the signature less the incoming gradients
        assert tuple(a.arg for a in fns[fn].args.args) == tuple(a for a in sig if a not in BF.INCOMING), (name, fn)
    assert set(m.get("setup", {})) in (set(), set(m["entry"])), name
    if name.startswith("liger_"):
        assert "liger-kernel==0.8.5" in m["requires"]


@pytest.mark.parametrize("name", CANDIDATES)
def test_the_client_parses_them_as_backward_candidates(name):
    """Since session 31 the registry (Manifest::check_python) and the client take a Python
    candidate of a backward op, one function per dtype (a setup function too, since session 32);
    they sit in kernels/third-party/ with the forward ones since the verifier gives a backward
    case a verdict (docs/backward.md, "What the verifier lacks", items 1-8)."""
    m = parse_manifest_toml((FOLDER / name / "kernel.toml").read_text(encoding="utf-8"))
    assert m["op"].endswith("_backward") and m["runtime"] == "python"
    assert set(m["entries"]) and all(isinstance(f, str) for f in m["entries"].values())


# ---- the interim check -------------------------------------------------------------------------

def test_ulp_distance():
    one = torch.tensor([1.0])
    nxt = torch.nextafter(one, torch.tensor([2.0]))
    assert BF.ulp_distance(one, nxt) == 1
    assert BF.ulp_distance(torch.tensor([0.0]), torch.tensor([-0.0])) == 0
    tiny = torch.tensor([1e-45])
    assert BF.ulp_distance(tiny, -tiny) == 2
    b = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)
    assert BF.ulp_distance(b, torch.nextafter(b, torch.zeros_like(b))) == 1
    nan = torch.tensor([float("nan")])
    assert BF.ulp_distance(nan, nan) == 0


@pytest.mark.parametrize("op", sorted(BF.SIGNATURES))
def test_eager_itself_passes_the_check(op):
    """The check's own control: eager's gradients as a candidate are bit-exact, deterministic and
    leave the inputs alone, in every dtype."""
    sem = "llama" if op == "rms_norm_backward" else "default"
    for dt in ("bf16", "f32") if op != "layer_norm_backward" else ("f32",):
        def eager(*args, op=op):
            return BF.eager_gradients(op, sem, dict(zip(BF.SIGNATURES[op][0], args)))
        r = BF.check(eager, op, sem, dt, 5, 40, "cpu")
        assert r["ok"], r
        assert set(r["gradients"]) == set(BF.SIGNATURES[op][1])


def test_the_check_finds_what_is_wrong():
    op = "silu_mul_backward"

    def eager(dy, gate, up):
        return BF.eager_gradients(op, "default", {"dy": dy, "gate": gate, "up": up})

    def one_ulp_off(dy, gate, up):
        dg, du = eager(dy, gate, up)
        return torch.nextafter(dg, torch.full_like(dg, float("inf"))), du

    def modifies_dy(dy, gate, up):
        out = eager(dy, gate, up)
        dy.mul_(2)
        return out

    def flips(dy, gate, up, state={"n": 0}):
        state["n"] += 1
        dg, du = eager(dy, gate, up)
        return (dg * (1 + state["n"] * 2 ** -10), du)

    r = BF.check(one_ulp_off, op, "default", "f32", 4, 33, "cpu")
    assert not r["ok"] and r["gradients"]["d_gate"] == {"differing": 132, "elements": 132, "max_ulp": 1}
    assert r["gradients"]["d_up"]["differing"] == 0
    r = BF.check(modifies_dy, op, "default", "f32", 4, 33, "cpu")
    assert not r["ok"] and r["inputs_changed"] == ["dy"]
    r = BF.check(flips, op, "default", "f32", 4, 33, "cpu")
    assert not r["ok"] and r["deterministic"] is False
    r = BF.check(lambda dy, gate, up: eager(dy, gate, up)[0], op, "default", "f32", 4, 33, "cpu")
    assert not r["ok"] and "returned" in r["error"] and "d_gate, d_up" in r["error"]
    r = BF.check(lambda dy, gate, up: 1 / 0, op, "default", "f32", 4, 33, "cpu")
    assert not r["ok"] and r["error"].startswith("ZeroDivisionError")


# ---- the candidates' wiring --------------------------------------------------------------------

COMPILE = [n for n in CANDIDATES if n.startswith("compile_")]
LIGER = [n for n in CANDIDATES if n.startswith("liger_")]


def _check_candidate(name, dtypes=("f32", "bf16"), rows=6, cols=48):
    manifest, module = BF.load(FOLDER / name)
    sem = manifest.get("semantics", "default")
    out = []
    for dt in dtypes if manifest["op"] != "layer_norm_backward" else ("f32",):
        r = BF.check(BF.entry(manifest, module, dt), manifest["op"], sem, dt, rows, cols, "cpu")
        out.append(r)
    return out


@pytest.mark.parametrize("name", COMPILE)
def test_a_compile_candidate_is_eagers_backward_with_compile_as_identity(name, compile_as):
    """torch.compile as the identity: each candidate's gradients through autograd (or eager's
    LayerNorm backward op) are eager's bit for bit, deterministic, the inputs unchanged."""
    compile_as("identity")
    for r in _check_candidate(name):
        assert r["ok"], r


def test_a_compile_candidates_backward_goes_through_aot_autograd(compile_as, monkeypatch):
    """With AOTAutograd (no Inductor) the candidate's backward is the traced backward graph (the
    compiled function is called under autograd): its gradients are still eager's on the CPU."""
    compile_as("aot_eager")
    (r,) = _check_candidate("compile_silu_mul_backward", dtypes=("f32",))
    assert r["ok"], r


@pytest.mark.parametrize("name", LIGER)
def test_a_liger_candidate_calls_liger_as_a_training_step_does(name, fake_liger):
    """Each Liger candidate through the stand-in package: eager's gradients come back (so the
    wrapper takes Liger's results, in the signature's order), the verifier's inputs are
    untouched although Liger's SwiGLU / GeGLU backward writes into the tensors its forward
    saved, and Liger is called as documented: RMSNorm in llama casting mode, offset 0, not in
    place; LayerNorm's backward on one f32 statistic a row, with a bias-shaped tensor for db."""
    for r in _check_candidate(name):
        assert r["ok"], r
    kinds = {c[0] for c in fake_liger}
    if name == "liger_rms_norm_llama_backward":
        assert set(fake_liger) == {("rms_norm", 0.0, "llama", False)}
    elif name == "liger_layer_norm_backward":
        assert set(fake_liger) == {("layer_norm_backward", (6,), torch.float32, (48,))}
    else:
        assert kinds == {"swiglu" if "swiglu" in name else "geglu"}


def test_the_script_runs_the_liger_candidates_on_the_cpu_with_a_package_dir(tmp_path):
    """scripts/backward_field_check.py with --package-dir (the stand-in package here, the real
    wheel's folder on the GPU machine) and --device cpu: every check passes, the table and the
    JSON say so; without a GPU and without --device cpu it refuses (exit 2)."""
    pkgs = _write_fake_liger(tmp_path / "pkgs")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "backward_field_check.py"), str(out),
                        *LIGER, "--device", "cpu", "--dtypes", "f32", "--shapes", "3x40,1x8",
                        "--time-shapes", "8x64", "--reps", "3", "--package-dir", str(pkgs)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads((out / "backward_field.json").read_text())
    assert not data["errors"] and len(data["rows"]) == len(LIGER) * 2
    assert all(row["ok"] for row in data["rows"]), data["rows"]
    assert "| liger_swiglu_backward | f32 | 3x40 | d_gate 0 of 120 (0); d_up 0 of 120 (0) | True | - |" in r.stdout
    # the timed problem: the candidate beside eager's backward (and forward + backward where
    # eager's node follows a forward of its own: not LayerNorm's, whose statistics are given)
    assert len(data["times"]) == len(LIGER) and not any("error" in t for t in data["times"])
    for t in data["times"]:
        assert t["candidate_us"] > 0 and t["eager_backward_us"] > 0
        assert ("eager_forward_backward_us" in t) == (t["op"] != "layer_norm_backward"), t
    assert "| liger_swiglu_backward | f32 | 8x64 | " in r.stdout
    if not torch.cuda.is_available():
        r = subprocess.run([sys.executable, str(REPO / "scripts" / "backward_field_check.py"),
                            str(out)], capture_output=True, text=True, timeout=600)
        assert r.returncode == 2 and "no CUDA device" in r.stderr


@pytest.mark.parametrize("op", sorted(BF.SIGNATURES))
def test_timings_time_the_candidate_and_eager(op):
    sem = "llama" if op == "rms_norm_backward" else "default"

    def eager(*args):
        return BF.eager_gradients(op, sem, dict(zip(BF.SIGNATURES[op][0], args)))
    t = BF.timings(eager, op, sem, "f32", 4, 32, "cpu", reps=3)
    assert t["candidate_us"] > 0 and t["eager_backward_us"] > 0
    assert ("eager_forward_backward_us" in t) == (op != "layer_norm_backward")
