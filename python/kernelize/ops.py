"""The kernel launches as PyTorch operators (`torch.library.Library`), one per op kind.

A swapped layer's forward calls one of these ops, so the kernel is a single dispatcher call:
`torch.compile` traces through it (the fake implementations below give the output's shape,
dtype and device; the kernel stays one opaque node of the graph) and CUDA graph capture
records its `cuLaunchKernel` (issued on `torch.cuda.current_stream()`, see `launch.py`).

Custom ops take tensors and scalars, not Python objects, so the compiled kernel is passed as
an integer `key`: `register(compiled)` (called once per layer at kernelize time) files it in
this process's table and returns the key. The real implementations are registered for CUDA
only; on other devices the swapped forward never calls them (it runs the original forward).

| op | schema | computes |
| --- | --- | --- |
| `kernelize::launch_rms_norm` | `(x, weight, eps: float, key: int) -> out` | rms_norm (any semantics: the kernel decides) |
| `kernelize::launch_fused_add_rms_norm` | `(x, residual!, weight, eps, key) -> out` | `residual := x + residual`, out = norm(residual) |
| `kernelize::launch_layer_norm` | `(x, weight, bias, eps, key) -> out` | layer_norm |
| `kernelize::launch_fused_add_layer_norm` | `(x, residual!, weight, bias, eps, key) -> out` | `residual := x + residual`, out = layer_norm(residual) |
| `kernelize::launch_silu` / `launch_gelu` / `launch_gelu_tanh` | `(x, key) -> out` | elementwise |
| `kernelize::launch_silu_and_mul` | `(gate, up, key) -> out` | silu(gate) * up (concatenated into the ABI's `[rows, 2*cols]` inside) |
| `kernelize::launch_silu_mul` / `launch_gelu_tanh_mul` | `(gate, up, key) -> out` | act(gate) * up on the two tensors as they are |

Every output is a new contiguous tensor of the input's shape, dtype and device (the real
launch makes its inputs contiguous and allocates the output like them).

They are defined with a plain `torch.library.Library` (a schema, one CUDA kernel, a fake
kernel), not `torch.library.custom_op`: compiled code without CUDA graphs calls each through the
dispatcher at every step, and `custom_op`'s Python wrappers for the autograd and in-place keys
cost 13 µs a call more (H200, torch 2.11: 30 against 17 µs a call from inductor's code,
`bench/op_overhead.py`, docs/gpu-runs/2026-11-27-s16). The swapped layers call them only where no
input needs a gradient (training has its own op, `training.py`), and the one op that mutates an
input (`residual`: the fused adds) bumps its version counter itself, as `custom_op` would.

Their CUDA kernels are registered at the first `register` of a process (`ensure_kernels`): the
C++ kernels of `native.py` (`_native_ops.cpp`, built once per machine and torch) where a GPU,
a C++ compiler and CUDA's headers are there, else the Python kernels below. Each Python kernel
is also the operator `kernelize::py_launch_<name>` (the same schema), which the C++ kernels call
for every case but the common one.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import Tensor

from . import launch as L
from . import native

_KERNELS: dict[int, Any] = {}   # key -> CompiledKernel (held for the process, as launch._CACHE)
_KEYS: dict[int, int] = {}      # id(compiled) -> key (ids stay unique: _KERNELS keeps them alive)
_LOCK = threading.Lock()

OPS = ("rms_norm", "fused_add_rms_norm", "layer_norm", "fused_add_layer_norm", "silu", "gelu",
       "gelu_tanh", "silu_and_mul", "silu_mul", "gelu_tanh_mul")


def register(compiled: Any) -> int:
    """The integer key under which the custom ops find `compiled` (the same key every time)."""
    ensure_kernels()
    with _LOCK:
        key = _KEYS.get(id(compiled))
        if key is None:
            key = len(_KERNELS) + 1
            _KERNELS[key] = compiled
            _KEYS[id(compiled)] = key
            if _KERNELS_FROM == "native":
                native.enable(key, compiled)
        return key


_DEFERRED: dict[str, Any] = {}       # launch_<name> -> its Python kernel, until ensure_kernels
_KERNELS_FROM: str | None = None     # "native" or "python", once ensure_kernels ran
_KERNELS_LOCK = threading.Lock()


def ensure_kernels() -> str:
    """Register the launch operators' CUDA kernels once per process and say whose they are:
    "native" (native.py's C++ kernels, where a GPU is there and the library builds and loads) or
    "python" (the kernels of this module; with a warning saying why where a GPU is there)."""
    global _KERNELS_FROM
    with _KERNELS_LOCK:
        if _KERNELS_FROM is None:
            lib = native.load() if torch.cuda.is_available() else None
            if lib is None:
                if torch.cuda.is_available():
                    L._log.warning("kernelize: the native launch operators are not used (%s); "
                                   "each launch goes through Python", native.why())
                for name, fn in _DEFERRED.items():
                    _LIB.impl(name, fn, "CUDA")
            _KERNELS_FROM = "native" if lib is not None else "python"
        return _KERNELS_FROM


#: A norm kernel's key -> the key of a fused kernel computing eager's `norm(x + residual)` with
#: the same norm: fused_add_rms_norm for an rms_norm kernel (llama semantics), fused_add_layer_norm
#: for a layer_norm kernel; for the exact backend's fusion of a residual add into the norm after
#: it (`exact.fuse_residual_norms`). Filled by kernelize(..., compile=...) for the layers it swapped.
_RESIDUAL: dict[int, int] = {}


def pair_residual(norm_key: int, fused_key: int) -> None:
    """Say that the fused kernel under `fused_key` computes the norm kernel under `norm_key` of
    a residual sum."""
    with _LOCK:
        _RESIDUAL[norm_key] = fused_key


def unpair_residual(norm_key: int) -> None:
    """Forget the fused partner of the norm kernel `norm_key` (the latest kernelize call found
    none that qualifies for it)."""
    with _LOCK:
        _RESIDUAL.pop(norm_key, None)


def residual_partner(norm_key: Any) -> int | None:
    """The fused kernel's key paired with the norm kernel `norm_key`, or None."""
    return _RESIDUAL.get(norm_key) if isinstance(norm_key, int) else None


def kernel(key: int) -> Any:
    try:
        return _KERNELS[key]
    except KeyError:
        raise RuntimeError(f"kernelize: no compiled kernel under key {key} in this process "
                           "(keys are given by kernelize(model) and are not portable)") from None


def op(name: str) -> Any:
    """`torch.ops.kernelize.launch_<name>` (name: one of OPS)."""
    return getattr(torch.ops.kernelize, f"launch_{name}")


def _like(x: Tensor) -> Tensor:
    """A new contiguous tensor of x's shape, dtype and device (what the real launches return)."""
    return x.new_empty(x.shape)


_LIB = torch.library.Library("kernelize", "FRAGMENT")   # held for the process


def define(name: str, schema: str, fake: Any, dispatch_key: str = "CUDA", deferred: bool = False) -> Any:
    """Define `kernelize::<name><schema>` with the decorated function as its kernel for
    `dispatch_key` and `fake` as its fake kernel: kernelize's operators are plain
    `torch.library.Library` operators (the module's doc says why), none with a backward.

    `deferred` (the launch operators): the function is at once the kernel of its twin
    `kernelize::py_<name>` (the same schema and fake; the native kernels hand their odd cases to
    it), and becomes `<name>`'s kernel only if `ensure_kernels` finds no native kernels.

    An operator without an autograd kernel would, given an input that needs a gradient, return
    an output whose backward only warns (PyTorch's autograd fallback) and gives no gradient
    through it: a training step would go on with wrong numbers. The kernel refuses such a call
    instead, as `custom_op` would at the backward."""
    qualname = f"kernelize::{name}"

    def define_with(fn: Any) -> Any:
        def kernel(*args: Any) -> Any:
            if torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad
                                               for a in args):
                raise RuntimeError(
                    f"{qualname} has no backward: call it where no input needs a gradient "
                    "(torch.no_grad(), or tensors that do not require grad); for training, "
                    "kernelize(model, mode=\"training\") swaps in the ops that have one")
            return fn(*args)

        _LIB.define(f"{name}{schema}")
        torch.library.register_fake(qualname, fake, lib=_LIB)
        if deferred:
            _LIB.define(f"py_{name}{schema}")
            _LIB.impl(f"py_{name}", kernel, dispatch_key)
            torch.library.register_fake(f"kernelize::py_{name}", fake, lib=_LIB)
            _DEFERRED[name] = kernel
        else:
            _LIB.impl(name, kernel, dispatch_key)
        return fn
    return define_with


def _launch_op(name: str, schema: str) -> Any:
    """`define` for `kernelize::launch_<name>`: a CUDA kernel whose output is like its first
    argument, native or Python (`ensure_kernels`)."""
    return define(f"launch_{name}", schema, lambda x, *_, **__: _like(x), deferred=True)


_bump = torch._C._increment_version   # autograd's version counter (none on inference tensors)


# ---- norms ----------------------------------------------------------------------------------

@_launch_op("rms_norm", "(Tensor x, Tensor weight, float eps, int key) -> Tensor")
def launch_rms_norm(x: Tensor, weight: Tensor, eps: float, key: int) -> Tensor:
    return L.run_rms_norm(kernel(key), x, weight, eps)


@_launch_op("fused_add_rms_norm",
            "(Tensor x, Tensor(a!) residual, Tensor weight, float eps, int key) -> Tensor")
def launch_fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float,
                              key: int) -> Tensor:
    _bump((residual,))
    return L.run_fused_add_rms_norm(kernel(key), x, residual, weight, eps)


@_launch_op("layer_norm", "(Tensor x, Tensor weight, Tensor bias, float eps, int key) -> Tensor")
def launch_layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float, key: int) -> Tensor:
    return L.run_layer_norm(kernel(key), x, weight, bias, eps)


@_launch_op("fused_add_layer_norm",
            "(Tensor x, Tensor(a!) residual, Tensor weight, Tensor bias, float eps, int key) -> Tensor")
def launch_fused_add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, eps: float,
                                key: int) -> Tensor:
    _bump((residual,))
    return L.run_fused_add_layer_norm(kernel(key), x, residual, weight, bias, eps)


# ---- activations ----------------------------------------------------------------------------

def _elementwise(x: Tensor, key: int) -> Tensor:
    return L.run_elementwise(kernel(key), x)


for _name in ("silu", "gelu", "gelu_tanh"):
    _launch_op(_name, "(Tensor x, int key) -> Tensor")(_elementwise)


@_launch_op("silu_and_mul", "(Tensor gate, Tensor up, int key) -> Tensor")
def launch_silu_and_mul(gate: Tensor, up: Tensor, key: int) -> Tensor:
    return L.run_silu_and_mul(kernel(key), gate, up)


# ---- gated MLPs: two inputs --------------------------------------------------------------

def _gated(gate: Tensor, up: Tensor, key: int) -> Tensor:
    return L.run_gated(kernel(key), gate, up)


for _name in ("silu_mul", "gelu_tanh_mul"):
    _launch_op(_name, "(Tensor gate, Tensor up, int key) -> Tensor")(_gated)
