"""The C launch stub (`kernelize/_launcher.c`), built with this machine's C compiler and driven
with a stand-in for cuLaunchKernel (a ctypes callback that records what it was given): the
grid, block, shared memory, stream and every kernel argument arrive as prepared."""
from __future__ import annotations

import ctypes
import shutil
import threading

import pytest
import torch

from kernelize import launch

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


class FakeCuda:
    """A stand-in libcuda whose cuLaunchKernel records its arguments (n_ptr pointers first)."""

    def __init__(self, n_ptr: int, kinds: str, result: int = 0):
        self.calls = []

        def record(func, g0, g1, g2, b0, b1, b2, smem, stream, argv, extra):
            ptrs = [ctypes.cast(argv[i], ctypes.POINTER(ctypes.c_uint64))[0] for i in range(n_ptr)]
            scal = [ctypes.cast(argv[n_ptr + i], ctypes.POINTER(
                ctypes.c_float if k == "f" else ctypes.c_longlong))[0] for i, k in enumerate(kinds)]
            self.calls.append(dict(func=func, dims=(g0, g1, g2, b0, b1, b2, smem), stream=stream,
                                   ptrs=ptrs, scalars=scal, extra=extra))
            return result

        self.cuLaunchKernel = LAUNCH(record)


@pytest.fixture
def stub(tmp_path, monkeypatch):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the client falls back to ctypes (tested elsewhere)")
    monkeypatch.setenv("KERNELIZE_CACHE", str(tmp_path))
    monkeypatch.setattr(launch, "_STUB", None)
    mod = launch._build_c_launcher()
    assert mod is not None, "the C launcher did not build although a compiler is present"
    assert list(tmp_path.glob("launcher/_kernelize_launcher-*"))  # cached for the next process
    return mod


def test_arguments_arrive_as_prepared(stub):
    cuda = FakeCuda(3, "llf")
    stub.init(ctypes.cast(cuda.cuLaunchKernel, ctypes.c_void_p).value)
    prep = stub.prepare(0xABCD, 7, 1, 1, 256, 1, 1, 4096, 3, (5, 2 ** 40 + 3, 1e-6))
    assert isinstance(prep, bytes)
    ptrs = (0x7F00_0000_1000, 0x7F00_0000_2000, 2 ** 64 - 16)
    assert stub.launch(prep, 0x5555, *ptrs) == 0
    (c,) = cuda.calls
    assert c["func"] == 0xABCD and c["stream"] == 0x5555 and c["extra"] is None
    assert c["dims"] == (7, 1, 1, 256, 1, 1, 4096)
    assert tuple(c["ptrs"]) == ptrs
    assert c["scalars"][:2] == [5, 2 ** 40 + 3]
    assert c["scalars"][2] == ctypes.c_float(1e-6).value  # a float ABI argument, not a double


def test_errors_and_results(stub):
    cuda = FakeCuda(2, "l", result=700)
    stub.init(ctypes.cast(cuda.cuLaunchKernel, ctypes.c_void_p).value)
    prep = stub.prepare(1, 1, 1, 1, 32, 1, 1, 0, 2, (9,))
    assert stub.launch(prep, 0, 16, 32) == 700  # the CUresult comes back for _check to name
    with pytest.raises(TypeError, match="2 pointers expected, 1 given"):
        stub.launch(prep, 0, 16)
    with pytest.raises(TypeError, match="launch"):
        stub.launch(b"too short", 0, 16, 32)
    with pytest.raises(TypeError, match="neither int nor float"):
        stub.prepare(1, 1, 1, 1, 32, 1, 1, 0, 2, ("x",))
    with pytest.raises(ValueError, match="more than 16"):
        stub.prepare(1, 1, 1, 1, 32, 1, 1, 0, 10, tuple(range(7)))
    with pytest.raises(OverflowError):
        stub.launch(prep, 0, -1, 32)  # a negative address is refused, not wrapped
    assert len(cuda.calls) == 1


def test_concurrent_launches_share_nothing(stub):
    """Each call builds its argument array on its own stack: threads never see another's."""
    cuda = FakeCuda(1, "l")
    stub.init(ctypes.cast(cuda.cuLaunchKernel, ctypes.c_void_p).value)
    prep = stub.prepare(1, 1, 1, 1, 32, 1, 1, 0, 1, (1,))

    def worker(base):
        for i in range(200):
            stub.launch(prep, base, base + i)

    threads = [threading.Thread(target=worker, args=(b * 10_000,)) for b in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cuda.calls) == 800
    assert all(c["ptrs"][0] - c["stream"] in range(200) for c in cuda.calls)


def test_without_a_compiler_the_client_uses_ctypes(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("KERNELIZE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(launch, "_STUB", None)
    with caplog.at_level("WARNING", logger="kernelize"):
        assert launch.c_launcher(FakeCuda(1, "")) is None
    assert "no C compiler" in caplog.text
    monkeypatch.setattr(launch, "_STUB", None)


def _cpu_compiled(stub, cuda, manifest):
    """A CompiledKernel of `manifest` on the CPU (device index -1, as `Tensor.get_device` says
    there) whose cuLaunchKernel is `cuda`'s recorder: what the swapped forward launches."""
    k = object.__new__(launch.CompiledKernel)
    k.__dict__.update(manifest=manifest, dtype="bf16", entry="e", device=torch.device("cpu"),
                      sm_count=132, _smem_optin=0, lib=cuda, func=ctypes.c_void_p(0xF00),
                      _index=-1, _smem_configured=0, _prepared={}, _lock=threading.Lock(),
                      _cu_launch=None, _stub=stub)
    return k


def test_swapped_elementwise_layer_launches_inline(stub, monkeypatch):
    """nn.SiLU's swapped forward launches through the C launcher itself (no runner, one
    prepared launch per shape): the output is a new tensor of x's shape, the kernel gets
    (out, x, n) on the current stream, a misaligned x is copied first (one 16 bytes into a larger
    tensor is not: the ABI allows it), a count the kernel
    does not take runs the original forward, and a failed launch raises."""
    from kernelize import core
    from kernelize.discover import Site
    from kernelize.sources import Resolved

    cuda = FakeCuda(2, "l")
    stub.init(ctypes.cast(cuda.cuLaunchKernel, ctypes.c_void_p).value)
    manifest = {"name": "silu_fake", "op": "silu", "entries": {"bf16": "e"},
                "constraints": {"cols_min": 1, "cols_max": None, "cols_multiple_of": 8,
                                "archs": []}}
    k = _cpu_compiled(stub, cuda, manifest)
    monkeypatch.setattr(launch, "compiled", lambda *a, **kw: k)
    monkeypatch.setattr(launch, "launch_dims", lambda m, r, c, s: ((r, 1, 1), (128, 1, 1), 0))
    monkeypatch.setattr(core, "_raw_stream", lambda index: 0x5EA)
    m = torch.nn.SiLU()
    site = Site(path="act", module=m, op="silu", semantics="default", cols=64, dtype="bf16")
    core._patch(site, Resolved("silu_fake", "1", "d" * 64, manifest, "", "dir"), torch.device("cpu"))
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        out = m(x)
        assert out.shape == x.shape and out.dtype == x.dtype and out.data_ptr() != x.data_ptr()
        (c,) = cuda.calls
        assert c["ptrs"] == [out.data_ptr(), x.data_ptr()] and c["scalars"] == [192]
        assert c["stream"] == 0x5EA and c["dims"][:3] == (3, 1, 1) and c["func"] == 0xF00
        m(x)
        assert len(m._kz_preps) == 1 and len(cuda.calls) == 2  # prepared once per shape
        odd = torch.randn(3 * 64 + 1, dtype=torch.bfloat16)[1:].view(3, 64)  # 2-byte offset
        m(odd)
        assert cuda.calls[-1]["ptrs"][1] % 16 == 0 and cuda.calls[-1]["ptrs"][1] != odd.data_ptr()
        at16 = torch.randn(3 * 64 + 8, dtype=torch.bfloat16)[8:].view(3, 64)  # 16 bytes in
        m(at16)
        assert cuda.calls[-1]["ptrs"][1] == at16.data_ptr()  # the ABI allows it: as it is
        y = torch.randn(3, 63, dtype=torch.bfloat16)  # 189 elements: not a multiple of 8
        assert torch.equal(m(y), torch.nn.functional.silu(y)) and len(cuda.calls) == 4
        assert core.launch_counts(m) == {"<root>": 4}
    failing = FakeCuda(2, "l", result=700)
    stub.init(ctypes.cast(failing.cuLaunchKernel, ctypes.c_void_p).value)
    cuda.cuGetErrorString = lambda res, out: 0  # no name for it: "?"
    with torch.no_grad(), pytest.raises(RuntimeError, match="launching e: CUDA error 700"):
        m(x)


def test_every_forward_op_has_a_runner():
    # launch.RUNNERS is what a swapped layer, the custom ops and the eager grid launch through:
    # an op the manifest accepts without a runner would only fail on a GPU
    from kernelize.manifest import OPS

    assert set(launch.RUNNERS) == set(OPS)
