"""Shared fixtures: the repo's real `kernelize serve` binary on a free port with a fresh
SQLite database (built with `cargo build -p kernelize` when missing); `load_script`, a script of
the repository (scripts/, kernels/generate.py) imported as a module."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

BIN = Path(os.environ.get("KERNELIZE_BIN", REPO / "target" / "debug" / "kernelize"))


def bundled_version(name: str) -> str:
    """The version of the bundled kernel `name` (kernels/NAME/kernel.toml): what a fresh hub
    serves and a kernels folder copied from kernels/ holds."""
    import tomllib
    return tomllib.loads((REPO / "kernels" / name / "kernel.toml").read_text(encoding="utf-8"))["version"]


def load_script(path: Path, name: str):
    """The Python file at `path` (a script, not a package module) imported as module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _binary() -> Path:
    if not BIN.exists():
        if not shutil.which("cargo"):
            pytest.fail(f"{BIN} is missing and cargo is not on PATH to build it")
        subprocess.run(["cargo", "build", "-q", "-p", "kernelize"], cwd=REPO, check=True)
    return BIN


# The bytes one launch must move per op (inputs read once, outputs written once) and the
# tensors it writes: the twin of `Op::bytes_moved` / `Op::outputs` in kernel-registry, which the
# hub checks every posted report against.
_ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


def _bytes_moved(op: str, dtype: str, rows: int, cols: int) -> int:
    n = rows * cols
    per = {"rms_norm": 2 * n + cols, "fused_add_rms_norm": 4 * n + cols,
           "layer_norm": 2 * n + 2 * cols, "fused_add_layer_norm": 4 * n + 2 * cols,
           "silu_and_mul": 3 * n, "silu_mul": 3 * n,
           "gelu_tanh_mul": 3 * n}.get(op, 2 * n)
    return _ELEMENT_BYTES[dtype] * per


def _outputs(op: str) -> int:
    from kernelize.manifest import FUSED_ADD
    return 2 if op in FUSED_ADD.values() else 1


def retarget(report: dict, claim: dict, arch: str = "sm_90") -> dict:
    """A fixture report made one the hub accepts for a claimed job (it checks every figure of a
    report against the job's kernel, as it would a real worker's): the claimed kernel's name,
    version, op, semantics and digest, the job's shapes, and per case the element counts and
    bytes of the claimed op with the time that gives the case's GB/s. Only sm_90 (the fixtures'
    H200) is supported as `arch`."""
    import tomllib
    assert arch == report["device"]["arch"] == "sm_90", "the fixtures were recorded on an H200"
    r = json.loads(json.dumps(report))
    man = tomllib.loads(claim["kernel"]["manifest_toml"])
    op = man["op"]
    sem = man.get("semantics", "llama" if op == "rms_norm" else "default")
    old_outputs, new_outputs = _outputs(r["kernel"]["op"]), _outputs(op)
    r["kernel"] = {"name": man["name"], "version": man["version"], "op": op, "semantics": sem,
                   "digest": claim["kernel"]["digest"]}
    r["requested_shapes"] = claim["job"]["shapes"]
    if man.get("runtime") == "python":
        # A Python candidate's run records its Python environment and compiles nothing (docs/spec.md section 2b;
        # the hub checks both).
        r.pop("compiled", None)
        r["python"] = {"python": "3.12.3", "torch": "2.11.0+cu130",
                       "packages": {"torch": "2.11.0+cu130"}, "isolation": []}
    elif "capabilities" not in r:
        # A worker of today audits what it compiled (docs/spec.md section 3b); a CUDA report
        # with none is one from before the audit, which every policy refuses. The fixtures
        # predate it: a clean audit with the manifest's declarations.
        declared = sorted(({"name": c["name"], "reason": c["reason"]}
                           for c in man.get("capability", [])), key=lambda c: c["name"])
        r["capabilities"] = {"audited": True, "found": [], "declared": declared}
    copy = r["device"]["copy_gbps"]
    for c in r["cases"]:
        e = c.get("exactness")
        if e and old_outputs != new_outputs:
            for k in ("elements", "mismatches"):
                e[k] = e[k] // old_outputs * new_outputs
            e["ulp_histogram"] = [n // old_outputs * new_outputs for n in e["ulp_histogram"]]
        s = c.get("speed")
        if s:
            nbytes = _bytes_moved(op, c["dtype"], c["rows"], c["cols"])
            median = nbytes / s["gbps"] / 1e3
            s.update(bytes_moved=nbytes, median_us=median,
                     reference_median_us=median * s["speedup"],
                     gbps=nbytes / (median * 1e-6) / 1e9)
            s["copy_fraction"] = s["gbps"] / copy
            s["speedup"] = s["reference_median_us"] / median
    return r


class Hub:
    def __init__(self, url: str, db: str, proc: subprocess.Popen):
        self.url, self.db, self.proc = url, db, proc

    def token(self, scope: str) -> str:
        out = subprocess.run([str(BIN), "token", "create", "--scope", scope, "--db", self.db],
                             cwd=REPO, check=True, capture_output=True, text=True).stdout
        toks = re.findall(r"\S+", out.strip().splitlines()[-1])
        return toks[-1]

    def call(self, method: str, path: str, body=None, token: str | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
                return r.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as e:
            raw = e.read()
            return e.code, (json.loads(raw) if raw else None)

    def worker_key(self, path: Path, name: str = "pytest-gpu") -> str:
        """A worker key made with `kernelize worker-key init` and registered on this hub;
        returns its public key."""
        public = subprocess.run([str(BIN), "worker-key", "init", "--file", str(path)], cwd=REPO,
                                check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run([str(BIN), "worker-key", "register", "--name", name, "--key-file",
                        str(path), "--db", self.db], cwd=REPO, check=True, capture_output=True)
        return public

    def verify_as_worker(self, kernel_names: set[str], arch: str = "sm_90",
                         report: str = "exact", key_file: Path | None = None) -> dict[str, str]:
        """Claim jobs as a worker and post the recorded `report` for the named kernels (the
        CI has no GPU: the report is re-targeted at each claimed kernel, see `retarget`),
        signed with `key_file` for the claimed job (`kernelize cert sign --job --nonce`) when
        given.
        Returns name -> digest of the kernels verified."""
        tok = self.token("worker")
        fixture = json.loads((REPO / "tests/fixtures/reports" / f"{report}.json").read_text())
        done: dict[str, str] = {}
        for _ in range(200):
            status, claim = self.call("POST", "/v1/jobs/claim", {"worker": "pytest", "arch": arch},
                                      tok)
            if status == 204:
                break
            assert status == 200, claim
            name = re.search(r'^name\s*=\s*"([^"]+)"', claim["kernel"]["manifest_toml"], re.M).group(1)
            if name not in kernel_names:
                continue  # left leased, never verified
            r = retarget(fixture, claim, arch)
            post = {"lease_id": claim["lease_id"], "report": r}
            if key_file is not None:
                unsigned = key_file.with_suffix(".report.json")
                unsigned.write_text(json.dumps(r))
                signed = json.loads(subprocess.run(
                    [str(BIN), "cert", "sign", str(unsigned), "--key-file", str(key_file),
                     "--job", str(claim["job"]["id"]), "--nonce", claim["nonce"]],
                    cwd=REPO, check=True, capture_output=True, text=True).stdout)
                post.update(signed)
            status, body = self.call("POST", f"/v1/jobs/{claim['job']['id']}/report", post, tok)
            assert status == 201, body
            done[name] = claim["kernel"]["digest"]
            if set(done) == kernel_names:
                break
        assert set(done) == kernel_names, f"verified {sorted(done)}, wanted {sorted(kernel_names)}"
        return done


def _start(tmp: Path, bundled_certificates: bool = False) -> Hub:
    binary = _binary()
    db = f"sqlite://{tmp / 'hub.db'}"
    # Every known suite is accepted: the fixture reports are of suite 2026.1. The tests post
    # their own verdicts: the project's recorded ones (kernels/certificates) are left out
    # unless asked for.
    extra = [] if bundled_certificates else ["--no-bundled-certificates"]
    # Most tests post recorded reports without certificates.
    extra.append("--accept-unsigned-reports")
    proc = subprocess.Popen([str(binary), "serve", "--db", db, "--bind", "127.0.0.1:0",
                             "--kernels", str(REPO / "kernels"),
                             "--min-suite-version", "2026.1", *extra], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=open(tmp / "serve.log", "wb"), text=True)
    deadline = time.time() + 60
    url = None
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise RuntimeError(f"kernelize serve exited: {(tmp / 'serve.log').read_text()[-2000:]}")
            continue
        m = re.search(r"kernelize listening on (http://\S+)", line)
        if m:
            url = m.group(1)
            break
    if url is None:
        proc.kill()
        raise RuntimeError("kernelize serve did not print its address within 60 s")
    return Hub(url, db, proc)


def _stop(h: Hub) -> None:
    h.proc.terminate()
    try:
        h.proc.wait(10)
    except subprocess.TimeoutExpired:
        h.proc.kill()


@pytest.fixture
def hub(tmp_path):
    """A fresh hub per test (verifications posted by one test do not leak into another)."""
    h = _start(tmp_path)
    yield h
    _stop(h)


@pytest.fixture
def fresh_hub(tmp_path):
    """A hub as a new user starts it: bundled kernels with the project's recorded verdicts."""
    h = _start(tmp_path, bundled_certificates=True)
    yield h
    _stop(h)


@pytest.fixture(scope="session")
def tiny_llama():
    transformers = pytest.importorskip("transformers")
    import torch
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def tiny_gemma(layers: int = 1):
    """A Gemma of `layers` small decoder layers, seeded random weights, bf16 (skips where this
    transformers has no Gemma)."""
    transformers = pytest.importorskip("transformers")
    import torch
    if not hasattr(transformers, "GemmaForCausalLM"):
        pytest.skip("this transformers has no Gemma")
    torch.manual_seed(0)
    cfg = transformers.GemmaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=1, head_dim=16)
    return transformers.GemmaForCausalLM(cfg).to(torch.bfloat16)
