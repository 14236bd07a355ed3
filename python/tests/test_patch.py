"""Swapping and restoring forwards, with the launch replaced by a stand-in (no GPU here):
the swapped forward falls back to the original for inputs the kernel cannot take."""

import pytest
import torch

import kernelize
from kernelize import core, launch
from kernelize.discover import discover
from kernelize.sources import Resolved

transformers = pytest.importorskip("transformers")


class FakeCompiled:
    device = torch.device("cuda", 0)


def test_patch_then_unkernelize_restores(tiny_llama, monkeypatch):
    monkeypatch.setattr(launch, "compiled", lambda *a, **k: FakeCompiled())
    x = torch.randint(0, 128, (1, 12))
    with torch.no_grad():
        before = tiny_llama(x).logits
    sites = discover(tiny_llama).sites
    fake = Resolved("k", "1.0.0", "sha256:" + "0" * 64, {"constraints": {"cols_min": 1,
                    "cols_max": None, "cols_multiple_of": 1, "archs": []}}, "", "test")
    for s in sites:
        core._patch(s, fake, torch.device("cuda", 0))
    assert all("forward" in s.module.__dict__ for s in sites)
    with torch.no_grad():  # CPU inputs: every swapped forward falls back to the original
        after = tiny_llama(x).logits
    assert torch.equal(before, after)
    # no call launched a kernel, and launch_counts says so for every swapped layer
    assert kernelize.launch_counts(tiny_llama) == {s.path: 0 for s in sites}
    assert kernelize.unkernelize(tiny_llama) == len(sites) == 7
    assert kernelize.launch_counts(tiny_llama) == {}
    assert not any("forward" in s.module.__dict__ for s in sites)
    assert kernelize.unkernelize(tiny_llama) == 0
