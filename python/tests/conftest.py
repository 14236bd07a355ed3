"""Shared fixtures: the repo's real `kernelize serve` binary on a free port with a fresh
SQLite database (built with `cargo build -p kernelize` when missing)."""

from __future__ import annotations

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


def _binary() -> Path:
    if not BIN.exists():
        if not shutil.which("cargo"):
            pytest.fail(f"{BIN} is missing and cargo is not on PATH to build it")
        subprocess.run(["cargo", "build", "-q", "-p", "kernelize"], cwd=REPO, check=True)
    return BIN


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

    def verify_as_worker(self, kernel_names: set[str], arch: str = "sm_90",
                         report: str = "exact") -> dict[str, str]:
        """Claim jobs as a worker and post the recorded `report` for the named kernels (the
        CI has no GPU: the report is re-targeted at each claimed kernel's digest and arch).
        Returns name -> digest of the kernels verified."""
        tok = self.token("worker")
        fixture = json.loads((REPO / "tests/fixtures/reports" / f"{report}.json").read_text())
        done: dict[str, str] = {}
        for _ in range(200):
            status, claim = self.call("POST", "/v1/jobs/claim", {"worker": "pytest"}, tok)
            if status == 204:
                break
            assert status == 200, claim
            name = re.search(r'^name\s*=\s*"([^"]+)"', claim["kernel"]["manifest_toml"], re.M).group(1)
            if name not in kernel_names:
                continue  # left leased, never verified
            r = json.loads(json.dumps(fixture))
            r["kernel"]["digest"] = claim["kernel"]["digest"]
            r["device"]["arch"] = arch
            status, body = self.call("POST", f"/v1/jobs/{claim['job']['id']}/report",
                                     {"lease_id": claim["lease_id"], "report": r}, tok)
            assert status == 201, body
            done[name] = claim["kernel"]["digest"]
            if set(done) == kernel_names:
                break
        assert set(done) == kernel_names, f"verified {sorted(done)}, wanted {sorted(kernel_names)}"
        return done


def _start(tmp: Path) -> Hub:
    binary = _binary()
    db = f"sqlite://{tmp / 'hub.db'}"
    proc = subprocess.Popen([str(binary), "serve", "--db", db, "--bind", "127.0.0.1:0",
                             "--kernels", str(REPO / "kernels")], cwd=REPO,
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


@pytest.fixture
def hub(tmp_path):
    """A fresh hub per test (verifications posted by one test do not leak into another)."""
    h = _start(tmp_path)
    yield h
    h.proc.terminate()
    try:
        h.proc.wait(10)
    except subprocess.TimeoutExpired:
        h.proc.kill()


@pytest.fixture(scope="session")
def tiny_llama():
    transformers = pytest.importorskip("transformers")
    import torch
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
