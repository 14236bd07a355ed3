"""Eager autograd's backward of an HF decoder block's residual add and the LlamaRMSNorm after it
(op fused_add_rms_norm_backward; issue 30, docs/backward-fused-add.md), emulated on the CPU.

The forward (op fused_add_rms_norm): ``h = residual + x`` (eager's add in T), ``y =
LlamaRMSNorm(h)``; outputs y and the updated residual h. Its backward in eager autograd: the
norm's gradients as ``kernelize.backward.llama_rms_norm_backward`` computes them from h (dw
exactly that), and h's gradient, which sums the norm's input gradient with ``dres``, the
gradient reaching h from the layers after it (the next residual add), as the engine sums them:

* bf16, f16: ``h.to(float32)`` is a node (ToCopyBackward0) that turns the norm's two paths
  (MulBackward0 of ``h * r``: gh1; PowBackward0: gh2) into one T tensor ``round_T(gh1 + gh2)``;
  h's InputBuffer adds it and dres in T: ``round_T(f32(round_T(gh1 + gh2)) + f32(dres))``.
* f32: no cast node; h's InputBuffer receives dres first (the later layer's AddBackward0 runs
  before the norm's nodes), then gh1, then gh2: ``fl(fl(dres + gh1) + gh2)``
  (python/tests/test_backward_order_on_cpu.py pins that order on the CPU's engine).

AddBackward0 of ``residual + x`` passes that gradient on to both: ``dx = dresidual = dh``.
Arrays: numpy float32 holding T values.
"""

from __future__ import annotations

import numpy as np

from kernelize import backward as B
from kernelize.backward import F32, round_to


def combine(gh1, gh2, dres, dtype: str) -> np.ndarray:
    """h's gradient from the norm's two paths and the residual output's gradient (the module's
    doc): the engine's sum."""
    gh1, gh2, dres = (np.asarray(a, F32) for a in (gh1, gh2, dres))
    if dtype == "f32":
        return ((dres + gh1).astype(F32) + gh2).astype(F32)
    return round_to(round_to((gh1 + gh2).astype(F32), dtype) + dres, dtype)


def fused_add_rms_norm_backward(h, w, dy, dres, eps: float, dtype: str, *, return_parts: bool = False,
                                **kw):
    """(dx, dw): dx the gradient of both x and residual, dw the weight's; h the forward's residual
    output (x + residual in T). `kw`: ``llama_rms_norm_backward``'s (the orders, the device)."""
    _, dw, p = B.llama_rms_norm_backward(h, w, dy, eps, dtype, return_parts=True, **kw)
    hh = np.asarray(h, F32)
    r = np.asarray(p["r"], F32)
    gh1 = (p["gn"] * r[:, None]).astype(F32)
    gh2 = (np.asarray(p["gp"], F32)[:, None] * (hh * F32(2))).astype(F32)
    dx = combine(gh1, gh2, dres, dtype)
    if return_parts:
        return dx, dw, dict(p, gh1=gh1, gh2=gh2)
    return dx, dw
