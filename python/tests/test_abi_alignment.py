"""The client's alignment rule is the ABI's (docs/spec.md section 2; issue 26): a tensor is
given to a kernel as it is exactly when it is contiguous and 16-byte aligned (a view 16, 32, 48,
... bytes into a larger tensor, such as a slice of an activation, included: the verifier runs
every case at such addresses), and copied otherwise. CPU tensors stand in for CUDA ones: the rule
looks only at the layout and the address."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelize import launch

ROOT = Path(__file__).resolve().parents[2]


def _base(n: int, dtype=torch.bfloat16) -> torch.Tensor:
    t = torch.randn(n, dtype=torch.float32).to(dtype)
    assert t.data_ptr() % 64 == 0, "the CPU allocator aligns to 64 bytes"
    return t


def _view(byte_offset: int, shape=(3, 64), dtype=torch.bfloat16) -> torch.Tensor:
    """A contiguous view `byte_offset` bytes into a larger tensor."""
    es = torch.empty((), dtype=dtype).element_size()
    assert byte_offset % es == 0
    n = shape[0] * shape[1]
    base = _base(n + byte_offset // es + 64, dtype)
    return base[byte_offset // es:byte_offset // es + n].view(*shape)


def test_the_client_and_the_verifier_share_the_abi_alignment():
    # kernel_registry::ABI_ALIGN_BYTES (the rule's one home; the verifier uses it) through the
    # fixture its test writes
    abi = json.loads((ROOT / "python/tests/fixtures/abi.json").read_text(encoding="utf-8"))
    assert launch.ABI_ALIGNMENT == abi["abi_align_bytes"] == 16


@pytest.mark.parametrize("offset", [0, 16, 32, 48, 64, 128 + 16, 240, 256, 4096 + 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_an_aligned_contiguous_view_is_passed_as_it_is(offset, dtype):
    v = _view(offset, dtype=dtype)
    assert v.data_ptr() % 16 == 0
    assert launch.abi_passable(v)
    assert launch.aligned(v) is v


@pytest.mark.parametrize("offset", [2, 4, 8, 12, 16 + 2, 16 + 8])
def test_a_misaligned_view_is_copied_to_an_aligned_one(offset):
    v = _view(offset)
    assert not launch.abi_passable(v)
    a = launch.aligned(v)
    assert a is not v and a.data_ptr() % 16 == 0 and a.is_contiguous()
    assert torch.equal(a, v)


@pytest.mark.parametrize("make", [
    lambda: _base(64 * 6).view(64, 6).t(),           # transposed
    lambda: _base(2 * 3 * 64).view(3, 128)[:, ::2],   # strided
    lambda: _base(4 * 64).view(4, 64)[:, :32],        # rows not back to back
])
def test_a_non_contiguous_tensor_is_copied(make):
    v = make()
    assert v.data_ptr() % 16 == 0 and not v.is_contiguous()
    assert not launch.abi_passable(v)
    a = launch.aligned(v)
    assert a.is_contiguous() and a.data_ptr() % 16 == 0 and torch.equal(a, v)


class _Recorder:
    """Stands in for a CompiledKernel: records the addresses each launch is given."""

    def __init__(self):
        self.calls = []

    def launch(self, rows, cols, tensors, scalars):
        self.calls.append([t.data_ptr() for t in tensors])


def test_the_runners_pass_a_view_16_bytes_in_and_copy_one_2_bytes_in():
    k = _Recorder()
    w = _base(64)
    at16 = _view(16)
    launch.run_rms_norm(k, at16, w, 1e-6)
    assert k.calls[-1][1:] == [at16.data_ptr(), w.data_ptr()]  # (out, x, w): x as it is
    at2 = _view(2)
    launch.run_rms_norm(k, at2, w, 1e-6)
    assert k.calls[-1][1] != at2.data_ptr() and k.calls[-1][1] % 16 == 0
    gate, up = _view(32), _view(48)
    launch.run_gated(k, gate, up)
    assert k.calls[-1][1:] == [gate.data_ptr(), up.data_ptr()]
    res16 = _view(16)
    launch.run_fused_add_rms_norm(k, at16, res16, w, 1e-6)
    assert k.calls[-1][1:] == [res16.data_ptr(), at16.data_ptr(), w.data_ptr()]  # updated in place
    launch.run_elementwise(k, at16)
    assert k.calls[-1][1] == at16.data_ptr()
    # Every output is a fresh allocation, aligned as the ABI requires.
    assert all(c[0] % 16 == 0 for c in k.calls)
