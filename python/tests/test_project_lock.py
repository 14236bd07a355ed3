"""`kernelize lock` (python -m kernelize.project): one lock for a project's models, read from
its [tool.kernelize] table, resolved against a real hub, used offline."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kernelize
from kernelize import project

REPO = Path(__file__).resolve().parents[2]
MODELS = [str(REPO / "models" / "tiny-llama"), str(REPO / "models" / "tiny-gpt2")]


def _write(path: Path, body: str) -> Path:
    path.write_text(body, encoding="utf-8")
    return path


def test_project_file_errors_say_what_to_fix(tmp_path):
    with pytest.raises(project.ProjectError, match="not found"):
        project.read_project(tmp_path / "missing.toml")
    with pytest.raises(project.ProjectError, match=r"no \[tool.kernelize\] table"):
        project.read_project(_write(tmp_path / "a.toml", "[tool.other]\nx = 1\n"))
    with pytest.raises(project.ProjectError, match="modles is not a known key"):
        project.read_project(_write(tmp_path / "b.toml", "[tool.kernelize]\nmodles = []\n"))
    with pytest.raises(project.ProjectError, match="models must be a list"):
        project.read_project(_write(tmp_path / "c.toml", "[tool.kernelize]\nmodels = \"m\"\n"))
    with pytest.raises(project.ProjectError, match="'f64' is not one of bf16, f16, f32"):
        project.read_project(_write(tmp_path / "d.toml", "[tool.kernelize]\ndtypes = [\"f64\"]\n"))
    with pytest.raises(project.ProjectError, match="not valid TOML"):
        project.read_project(_write(tmp_path / "e.toml", "[tool.kernelize\n"))
    # the command line, through the hub's binary (`kernelize lock`): exit 2 and the message,
    # no traceback
    from conftest import _binary
    r = subprocess.run([str(_binary()), "lock", "--python", sys.executable, "--python-path",
                        str(REPO / "python"), "--", "--project", str(tmp_path / "b.toml")],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "modles is not a known key" in r.stderr and "Traceback" not in r.stderr


def _by_path(rep):
    return {e.path: (e.status, e.kernel and e.kernel.digest) for e in rep.entries}


def test_lock_a_projects_models_and_use_it_offline(fresh_hub, tmp_path):
    import torch
    import transformers
    toml = _write(tmp_path / "pyproject.toml", f"""
[project]
name = "my-app"

[tool.kernelize]
hub = "{fresh_hub.url}"
models = {MODELS!r}
dtypes = ["bf16"]
arch = "sm_90"
lock = "locks/kernelize.lock.json"
""".replace("'", '"'))
    (tmp_path / "locks").mkdir()
    r = subprocess.run([sys.executable, "-m", "kernelize.project", "lock", "--project", str(toml)],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHONPATH": str(REPO / "python"), "PATH": "/usr/bin:/bin",
                            "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "locks" / "kernelize.lock.json"
    assert out.exists() and f"wrote {out}" in r.stdout
    assert "tiny-llama (bf16)" in r.stdout and "tiny-gpt2 (bf16)" in r.stdout
    pinned = []
    for ref in MODELS:
        model = transformers.AutoModelForCausalLM.from_pretrained(ref).to(torch.bfloat16).eval()
        online = kernelize.kernelize(model, hub=fresh_hub.url, arch="sm_90", verbose=False)
        offline = kernelize.kernelize(model, lock=out, arch="sm_90", verbose=False)
        # every layer of both models is in the one lock, with the hub's answer
        assert _by_path(offline) == _by_path(online) and offline.entries
        assert not [r for e in offline.entries for r in e.reasons if "not in lock" in r]
        pinned += [d for _, d in _by_path(offline).values() if d]
    # the bundled kernels meet bit_exact on sm_90 at some of these layers out of the box
    assert pinned


def test_a_training_projects_lock_pins_the_backward_answers(fresh_hub, tmp_path):
    # mode = "training": each rms_norm (llama) layer's backward resolution is pinned too (the
    # bundled backward kernel, with its verification's GPU figures), so training mode reads it
    # offline
    import torch
    import transformers
    ref = MODELS[0]
    toml = _write(tmp_path / "pyproject.toml", f"""
[tool.kernelize]
hub = "{fresh_hub.url}"
models = ["{ref}"]
dtypes = ["bf16"]
arch = "sm_90"
mode = "training"
""")
    r = subprocess.run([sys.executable, "-m", "kernelize.project", "lock", "--project", str(toml)],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHONPATH": str(REPO / "python"), "PATH": "/usr/bin:/bin",
                            "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    # both bundled backward kernels are certified (rms_norm_llama_backward in session 19,
    # silu_mul_backward in session 26): the norms' and the MLPs' backward answers pinned
    assert "training: " in r.stdout and "backward resolution(s), 2 with a kernel" in r.stdout, r.stdout
    data = json.loads((tmp_path / "kernelize.lock.json").read_text())
    bwd = [e for e in data["resolutions"] if e["op"] == "rms_norm_backward"]
    assert bwd and all(e["kernel"].startswith("rms_norm_llama_backward ") and e["digest"] for e in bwd), bwd
    assert all(e["evidence"]["device_shape"]["sm_count"] == 132 for e in bwd), bwd
    gated = [e for e in data["resolutions"] if e["op"] == "silu_mul_backward"]
    assert gated and all(e["kernel"].startswith("silu_mul_backward ") and e["digest"] for e in gated), gated
    model = transformers.AutoModelForCausalLM.from_pretrained(ref).to(torch.bfloat16).eval()
    rep = kernelize.kernelize(model, lock=tmp_path / "kernelize.lock.json", arch="sm_90",
                              verbose=False, mode="training")
    norms = [e for e in rep.entries if e.op == "rms_norm"]
    assert norms and all(e.backward is not None and e.backward.name == "rms_norm_llama_backward"
                         and e.backward.evidence["device_shape"]["threads_per_sm"] == 2048
                         for e in norms)
    mlps = [e for e in rep.entries if e.op == "silu_mul"]
    assert mlps and all(e.backward is not None and e.backward.name == "silu_mul_backward" for e in mlps)
    # an unknown mode in the project file is refused naming the key
    bad = _write(tmp_path / "bad.toml", toml.read_text().replace('"training"', '"train"'))
    r = subprocess.run([sys.executable, "-m", "kernelize.project", "lock", "--project", str(bad)],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHONPATH": str(REPO / "python"), "PATH": "/usr/bin:/bin",
                            "HOME": str(tmp_path)})
    assert r.returncode == 2 and "mode='train' is not a kernelize mode" in r.stderr, r.stderr
