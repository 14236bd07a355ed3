"""scripts/silu_exhaustive.py (the SiLU kernels against eager on every input value, run on the GPU
by scripts/gpu-check): the parts that decide what "every input" and "a mismatch" mean, on the CPU.
The kernels themselves run only on a CUDA machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import load_script

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]


def _script():
    return load_script(REPO / "scripts" / "silu_exhaustive.py", "silu_exhaustive")


S = _script()


def test_the_f32_chunks_are_consecutive_bit_patterns_across_the_sign_and_the_wrap():
    assert [b % (1 << 32) for b in S.f32_patterns((1 << 31) - 2, 4, "cpu").view(torch.int32).tolist()] == [
        0x7FFFFFFE, 0x7FFFFFFF, 0x80000000, 0x80000001]
    assert [b % (1 << 32) for b in S.f32_patterns((1 << 32) - 2, 4, "cpu").view(torch.int32).tolist()] == [
        0xFFFFFFFE, 0xFFFFFFFF, 0, 1]
    # chunks as the script walks them cover 0 .. 2^32 - 1 once each: chunk k starts at k * n
    n = 1 << 28
    starts = [int(S.f32_patterns(s, 1, "cpu").view(torch.int32)[0]) % (1 << 32) for s in range(0, 1 << 32, n)]
    assert starts == list(range(0, 1 << 32, n))


def test_a_mismatch_is_any_differing_bit_and_two_nans_are_counted_apart():
    want = torch.tensor([1.0, -0.0, float("nan"), 2.0, float("inf")])
    same = want.clone()
    assert S.compare(same, want) == (0, 0)
    ours = want.clone()
    ours[1] = 0.0                                   # the sign of zero: a mismatch
    ours[3] = torch.nextafter(torch.tensor(2.0), torch.tensor(3.0))  # one ulp: a mismatch
    assert S.compare(ours, want) == (2, 0)
    other_nan = want.clone().view(torch.int32)
    other_nan[2] = 0x7FC00001                       # NaN with another payload: counted apart
    assert S.compare(other_nan.view(torch.float32), want) == (0, 1)
    nan_for_number = want.clone()
    nan_for_number[0] = float("nan")                # NaN where eager has a number: a mismatch
    assert S.compare(nan_for_number, want) == (1, 0)


def test_every_two_byte_pattern_appears_once_per_row():
    for dt in (torch.bfloat16, torch.float16):
        g, u = S.all_half_patterns(dt, "cpu")
        assert g.shape == (16, 65536) and u.shape == g.shape
        assert sorted(g[0].view(torch.int16).tolist()) == list(range(-32768, 32768))
        assert bool((u[0] == 1).all())
