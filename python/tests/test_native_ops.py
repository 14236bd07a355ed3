"""kernelize's operators in C++ (`kernelize/native.py`, `_native_ops.cpp`).

On the CPU (CI): the library builds with this torch and the system C++ compiler, and loading it
registers the C++ CUDA kernel of every launch operator, the Python twins (`py_<name>`) and the
exact backend's attention operators staying Python; a process without the library (no compiler,
`KERNELIZE_NATIVE=0`) registers the Python kernels and says why.

On a GPU: the C++ kernels are the ones used, and each gives what its Python twin gives, bit for
bit and in the same layout, for every bundled forward kernel at decode and prefill shapes; the
fused adds update the residual and bump its version once; an unaligned or strided input (the
cases the C++ kernels hand to Python) still computes; an input that needs a gradient is refused
with the Python message.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from conftest import REPO

PY = REPO / "python"
LAUNCH_OPS = ("rms_norm", "fused_add_rms_norm", "layer_norm", "fused_add_layer_norm", "silu", "gelu",
              "gelu_tanh", "silu_and_mul", "silu_mul", "gelu_tanh_mul")


def _run(code: str, **env: str) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(PY), **env}, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def _buildable() -> str | None:
    from kernelize import native
    if native.compiler() is None:
        return "no C++ compiler"
    if native._cuda_include() is None:
        return "no CUDA runtime headers"
    return None


def test_the_library_builds_and_registers_a_cpp_cuda_kernel_for_every_operator():
    why = _buildable()
    if why is not None:
        warnings.warn(f"test_native_ops: {why}: the native operators' build is NOT tested")
        pytest.skip(why)
    out = _run("""
        import ctypes, torch
        from kernelize import exact, native, ops
        so = native.build()
        ctypes.CDLL(str(so))
        for name in %r:
            dump = torch._C._dispatch_dump(f"kernelize::launch_{name}")
            cuda = [l for l in dump.splitlines() if l.startswith("CUDA:")]
            assert len(cuda) == 1 and "_native_ops.cpp" in cuda[0], dump
            twin = torch._C._dispatch_dump(f"kernelize::py_launch_{name}")
            assert [l for l in twin.splitlines() if l.startswith("CUDA:")][0].find("ops.py") > 0, twin
        for name in ("eager_sdpa", "eager_sdpa_bias"):   # attention stays Python (the source says why)
            dump = torch._C._dispatch_dump(f"kernelize::{name}")
            assert "_native_ops.cpp" not in dump and "CompositeExplicitAutograd[alias]:" in dump, dump
        print("registered", so.name)
    """ % (LAUNCH_OPS,))
    assert "registered kernelize_native-" in out


def test_the_op_codes_follow_the_python_runners_and_the_cpp_enum():
    """native.OP_CODES (a compiled kernel's op -> the ABI the C++ side launches it with) is the
    Python runners' grouping, and its numbers are `enum Op`'s in _native_ops.cpp: an op added to
    launch.RUNNERS or a renumbered enum fails here, not on a GPU."""
    import re
    from kernelize import launch, native
    by_runner: dict = {}
    for op, runner in launch.RUNNERS.items():
        if op != "silu_and_mul":   # the C++ kernel hands it to Python
            by_runner.setdefault(runner, set()).add(native.OP_CODES[op])
    assert all(len(codes) == 1 for codes in by_runner.values()), by_runner
    assert len({c for codes in by_runner.values() for c in codes}) == len(by_runner)
    assert set(native.OP_CODES) == set(launch.RUNNERS) - {"silu_and_mul"}
    enum = dict((name, int(v)) for name, v in re.findall(
        r"^\s*([A-Z_]+) = (\d+),", native.SOURCE.read_text().split("enum Op", 1)[1].split("};")[0], re.M))
    assert enum["RMS_NORM"] == native.OP_CODES["rms_norm"]
    assert enum["FUSED_ADD_RMS_NORM"] == native.OP_CODES["fused_add_rms_norm"]
    assert enum["LAYER_NORM"] == native.OP_CODES["layer_norm"]
    assert enum["FUSED_ADD_LAYER_NORM"] == native.OP_CODES["fused_add_layer_norm"]
    assert enum["ELEMENTWISE"] == native.OP_CODES["silu"]
    assert enum["GATED"] == native.OP_CODES["silu_mul"]
    assert set(enum.values()) == set(native.OP_CODES.values())


def test_a_compiler_error_or_a_missing_compiler_is_reported(tmp_path):
    out = _run("""
        from kernelize import native
        try:
            native.build()
        except RuntimeError as e:
            print("refused:", e)
    """, CXX=str(tmp_path / "no-such-compiler"), KERNELIZE_CACHE=str(tmp_path / "cache"))
    assert "refused: no C++ compiler" in out and "no-such-compiler" in out


def test_without_the_library_the_python_kernels_are_registered_and_the_reason_logged():
    out = _run("""
        import logging, torch
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        torch.cuda.is_available = lambda: True   # as on a GPU machine
        from kernelize import ops
        assert ops.ensure_kernels() == "python"
        for name in ops.OPS:
            dump = torch._C._dispatch_dump(f"kernelize::launch_{name}")
            assert "ops.py" in [l for l in dump.splitlines() if l.startswith("CUDA:")][0], dump
        print("python kernels")
    """, KERNELIZE_NATIVE="0")
    assert "python kernels" in out
    assert "native launch operators are not used (KERNELIZE_NATIVE=0)" in out


# ---- on a GPU -------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the native "
                         "kernels' launches are NOT tested here (run on the GPU machine)")
if not torch.cuda.is_available():
    warnings.warn("test_native_ops.py: no CUDA device: the native kernels' launches are NOT tested")

DEV = torch.device("cuda")
BUNDLED = {"rms_norm": "rms_norm_llama", "fused_add_rms_norm": "fused_add_rms_norm",
           "layer_norm": "layer_norm", "fused_add_layer_norm": "fused_add_layer_norm",
           "silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "silu_and_mul": "silu_and_mul",
           "silu_mul": "silu_mul", "gelu_tanh_mul": "gelu_tanh_mul"}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _key(name: str, dtype: str = "bf16") -> int:
    from kernelize import launch, ops
    from kernelize.sources import DirSource
    ((man, src, dg),) = DirSource(REPO / "kernels" / BUNDLED[name]).kernels
    return ops.register(launch.compiled(dg, man, src, dtype, DEV))


def _args(name: str, x: torch.Tensor, key: int) -> tuple:
    cols = x.shape[-1]
    g = torch.Generator(device=DEV).manual_seed(cols)
    w = torch.randn(cols, device=DEV, dtype=x.dtype, generator=g)
    b = torch.randn(cols, device=DEV, dtype=x.dtype, generator=g)
    other = torch.randn(x.shape, device=DEV, dtype=x.dtype, generator=g)
    return {"rms_norm": (x, w, 1e-6, key), "fused_add_rms_norm": (x, other, w, 1e-6, key),
            "layer_norm": (x, w, b, 1e-5, key), "fused_add_layer_norm": (x, other, w, b, 1e-5, key),
            "silu": (x, key), "gelu": (x, key), "gelu_tanh": (x, key),
            "silu_and_mul": (x, other, key), "silu_mul": (x, other, key),
            "gelu_tanh_mul": (x, other, key)}[name]


def _clone(args: tuple) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


@gpu
def test_the_native_kernels_are_the_ones_used():
    from kernelize import native, ops
    if os.environ.get("KERNELIZE_NATIVE") == "0":
        pytest.skip("KERNELIZE_NATIVE=0")
    assert ops.ensure_kernels() == "native", native.why()


@gpu
@pytest.mark.parametrize("name", LAUNCH_OPS)
def test_native_launches_equal_the_python_kernels_bit_for_bit(name):
    from kernelize import native, ops
    key = _key(name)
    op = getattr(torch.ops.kernelize, f"launch_{name}").default
    twin = getattr(torch.ops.kernelize, f"py_launch_{name}").default
    torch.manual_seed(0)
    shapes = [(1, 2048), (8, 2048), (33, 1000), (2, 3, 64), (512, 1024), (0, 64)]
    with torch.no_grad():
        for shape in shapes:
            x = torch.randn(shape, device=DEV, dtype=torch.bfloat16) * 3
            args = _args(name, x, key)
            mine, theirs = _clone(args), _clone(args)
            fused = name.startswith("fused_add")
            before = mine[1]._version if fused else None
            got, want = op(*mine), twin(*theirs)
            assert got.shape == want.shape == x.shape and got.is_contiguous(), (name, shape)
            assert torch.equal(_bits(got), _bits(want)), (name, shape)
            if fused:   # the residual updated in place, its version bumped once
                assert torch.equal(_bits(mine[1]), _bits(theirs[1])), (name, shape)
                assert mine[1]._version == before + 1
    if name != "silu_and_mul":   # the C++ kernel prepared a launch for each shape with rows
        assert native.prepared_shapes(key) >= len(shapes) - 1


@gpu
@pytest.mark.parametrize("name", ["rms_norm", "fused_add_rms_norm", "silu", "silu_mul"])
def test_an_unaligned_or_strided_input_goes_to_the_python_kernel_and_computes(name):
    key = _key(name)
    op = getattr(torch.ops.kernelize, f"launch_{name}").default
    twin = getattr(torch.ops.kernelize, f"py_launch_{name}").default
    buf = torch.randn(8 * 1024 + 1, device=DEV, dtype=torch.bfloat16)
    unaligned = buf[1:].view(8, 1024)                    # 2 bytes past an aligned start
    strided = torch.randn(1024, 8, device=DEV, dtype=torch.bfloat16).t()
    with torch.no_grad():
        for x in (unaligned, strided):
            args = _args(name, x, key)
            got, want = op(*_clone(args)), twin(*_clone(args))
            assert torch.equal(_bits(got), _bits(want)), name


@gpu
def test_an_input_that_needs_a_gradient_is_refused_with_the_python_message():
    key = _key("rms_norm")
    x = torch.randn(4, 2048, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(2048, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="launch_rms_norm has no backward"):
        torch.ops.kernelize.launch_rms_norm(x, w, 1e-6, key)
