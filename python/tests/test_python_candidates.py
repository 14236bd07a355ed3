"""Python candidates (docs/spec.md section 2b) in the client: from a hub or a lock only with the caller's
opt-in (`allow_python=True`), and called like a compiled kernel. No GPU: kernelize reports
what it would replace, and the candidate's function is called on the CPU directly."""

import json

import pytest
import torch
import torch.nn.functional as F

import kernelize
from kernelize import LockSource, PythonNotAllowed
from kernelize import launch as L
from kernelize.digest import digest_of
from kernelize.manifest import parse_manifest_toml
from kernelize.sources import Key

transformers = pytest.importorskip("transformers")

TOML = '''name = "py_rms"
version = "1.0.0"
op = "rms_norm"
semantics = "llama"
description = "F.rms_norm posing as LlamaRMSNorm"
authors = ["tests"]
license = "MIT"
runtime = "python"
source = "kernel.py"
requires = ["torch>=2.4"]

[entry]
bf16 = "rms_norm"
f32 = "rms_norm"
'''
SOURCE = ("import torch.nn.functional as F\n\n\n"
          "def rms_norm(x, weight, eps):\n    return F.rms_norm(x, x.shape[-1:], weight, eps)\n")


def submit(hub, toml=TOML, source=SOURCE):
    status, body = hub.call("POST", "/v1/kernels", {"manifest": toml, "source": source},
                            hub.token("submit-python"))
    assert status == 201, body
    return body["digest"]


def rms_layers(rep):
    return [e for e in rep.entries if e.op == "rms_norm"]


def test_a_hub_hands_out_a_python_candidate_only_to_a_caller_who_opts_in(hub, tiny_llama, tmp_path):
    digest = submit(hub)
    assert hub.verify_as_worker({"py_rms"}, report="tiny/exact") == {"py_rms": digest}

    rep = kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False)
    for e in rms_layers(rep):
        assert e.status == "kept"
        assert any("runtime=any" in r for r in e.reasons), e.reasons

    rep = kernelize.kernelize(tiny_llama, hub=hub.url, arch="sm_90", verbose=False,
                              allow_python=True)
    layers = rms_layers(rep)
    assert layers and all(e.status == "would replace" for e in layers), [e.reasons for e in layers]
    assert {e.kernel.digest for e in layers} == {digest}
    assert layers[0].kernel.manifest["runtime"] == "python"

    # A lock pins it with its source; loading the lock needs the opt-in again.
    path = tmp_path / "kernelize.lock.json"
    kernelize.lock(tiny_llama, hub.url, path, arch="sm_90", allow_python=True)
    assert digest in json.loads(path.read_text())["kernels"]
    key = next(k for k in LockSource(path).entries if k.op == "rms_norm")
    refused = LockSource(path).resolve(key)
    assert refused.kernel is None and "allow_python=True" in refused.excluded[0]
    assert LockSource(path, allow_python=True).resolve(key).kernel.digest == digest
    rep = kernelize.kernelize(tiny_llama, lock=path, arch="sm_90", verbose=False)
    assert all(e.status == "kept" for e in rms_layers(rep))
    rep = kernelize.kernelize(tiny_llama, lock=path, arch="sm_90", verbose=False, allow_python=True)
    assert all(e.status == "would replace" for e in rms_layers(rep))


def test_a_hub_that_hands_one_out_unasked_is_refused(hub):
    """Were a hub to answer with a Python candidate anyway, the client keeps it out."""
    digest = submit(hub)
    hub.verify_as_worker({"py_rms"}, report="tiny/exact")
    src = kernelize.HubSource(hub.url)
    src._get_orig = src._get
    # Ask as an opted-in client would, then judge as one that did not opt in.
    src.allow_python = True
    key = Key("rms_norm", "llama", "bf16", "sm_90", 64, "bit_exact")
    assert src.resolve(key).kernel.digest == digest
    src.allow_python = False
    src._get = lambda path: src._get_orig(path + "&runtime=any")
    r = src.resolve(key)
    assert r.kernel is None and "allow_python=True" in r.excluded[0], r.excluded


def test_the_candidate_is_called_with_rows_by_cols_tensors_and_checked():
    m = parse_manifest_toml(TOML)
    d = digest_of(m, SOURCE)
    with pytest.raises(PythonNotAllowed, match="allow_python=True"):
        L.compiled(d, m, SOURCE, "f32", torch.device("cpu"))
    k = L.compiled(d, m, SOURCE, "f32", torch.device("cpu"), allow_python=True)
    x = torch.randn(2, 3, 16)
    w = torch.randn(16)
    out = L.run_rms_norm(k, x, w, 1e-6)
    assert out.shape == x.shape
    assert torch.equal(out, F.rms_norm(x.reshape(6, 16), (16,), w, 1e-6).reshape(2, 3, 16))

    bad = SOURCE.replace("return F.rms_norm", "return x[:, :-1] if True else F.rms_norm")
    kb = L.compiled(digest_of(m, bad), m, bad, "f32", torch.device("cpu"), allow_python=True)
    with pytest.raises(RuntimeError, match=r"expected \(6, 16\)"):
        L.run_rms_norm(kb, x, w, 1e-6)


def test_a_local_python_candidate_is_the_callers_own_code(tmp_path, tiny_llama):
    d = tmp_path / "py_rms"
    d.mkdir()
    (d / "kernel.toml").write_text(TOML)
    (d / "kernel.py").write_text(SOURCE)
    rep = kernelize.kernelize(tiny_llama, kernels_dir=d, arch="sm_90", verbose=False)
    assert all(e.status == "would replace" for e in rms_layers(rep))
    (d / "kernel.py").write_text("def other(x, weight, eps):\n    return x  # rms_norm\n")
    with pytest.raises(ValueError, match="function `rms_norm` is not defined"):
        kernelize.kernelize(tiny_llama, kernels_dir=d, arch="sm_90", verbose=False)


def test_the_case_runner_refuses_before_loading_when_isolation_is_required_and_missing(tmp_path):
    # verifier/src/python_runner.py with the verifier's confinement check beside it (as the
    # verifier writes them), in a process whose interfaces are stubbed to a non-isolated set:
    # a load that requires network isolation is refused with kind `isolation`, and the
    # candidate's source (which would leave a marker when imported) never runs; without the
    # requirement it loads and says what it found.
    import json
    import shutil
    import subprocess
    import sys

    from conftest import REPO
    src = REPO / "verifier" / "src"
    shutil.copy(src / "python_runner.py", tmp_path / "runner.py")
    shutil.copy(src / "confinement.py", tmp_path / "kernelize_confinement.py")
    marker = tmp_path / "imported"
    cand = tmp_path / "cand.py"
    cand.write_text(f"open({str(marker)!r}, 'w').close()\n\n\ndef f(x):\n    return x\n")
    wrapper = ("import socket, runpy, sys; socket.if_nameindex = lambda: [(1, 'lo'), (2, 'eth0')]; "
               f"sys.argv = [{str(tmp_path / 'runner.py')!r}]; "
               f"runpy.run_path({str(tmp_path / 'runner.py')!r}, run_name='__main__')")

    def load(require: bool) -> dict:
        req = {"load": {"source_path": str(cand), "entries": {"f32": "f"}, "package_dirs": [],
                        "requires": [], "device": "cpu", "require_network_isolation": require}}
        out = subprocess.run([sys.executable, "-c", wrapper], input=json.dumps(req) + "\n",
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
        return json.loads(out.stdout.strip().splitlines()[-1])

    refused = load(True)
    assert refused["error"]["kind"] == "isolation", refused
    assert "NOT isolated: interfaces eth0, lo" in refused["error"]["message"]
    assert not marker.exists(), "the candidate's source ran before the refusal"
    loaded = load(False)["loaded"]
    assert marker.exists()
    assert loaded["isolation"][0] == "NOT isolated: interfaces eth0, lo"
    assert loaded["isolation"][1].startswith("working directory ")
