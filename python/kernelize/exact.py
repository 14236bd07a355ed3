"""Exact compile: torch.compile's fusions with eager's bits (docs/compile.md, issue 31).

Inductor changes a model's numbers in four ways (docs/spec.md section 7):

1. **Reductions in its own order** (sum, mean, softmax, the norms' statistics): a fused Triton
   reduction adds in another order than eager's reduce kernel, so the last bit moves.
2. **Decompositions** that compute a different formula (`native_layer_norm` as `var_mean`
   arithmetic, PyTorch PR 177163).
3. **Pattern replacements** (matmul -> div -> softmax -> matmul into scaled-dot-product
   attention, pytorch#179578; einsum projections, pytorch#179575).
4. **Pointwise code that is not eager's**: fused bf16/f16 ops computed in f32 without eager's
   intermediate roundings, approximate division, flushed subnormals, and its own `exp`,
   `sigmoid`, `tanh`, `erf`, `sin`, `cos`, ... (Triton's math library, not CUDA's).

The exact backend (`backend`, registered with dynamo as "kernelize_exact") closes each:

0. Scaled-dot-product attention is called as eager calls it (`eager_sdpa`, below): while
   tracing, PyTorch would pick and decompose its backend for the traced shapes. A boolean mask
   read by several calls is converted once, by the conversion eager's SDPA runs
   (`hoist_sdpa_masks`).

1. and 4. (math library): the ops of `EAGER_OPS` are not decomposed and are lowered as
   *fallbacks*, i.e. inductor calls eager's own ATen kernel for them; a math-library function
   keeps inductor's lowering where it is proven eager's on every input of its dtype on the GPU
   (`prove`). Where kernelize has
   swapped a layer for a verified exact kernel, that kernel is an opaque custom op
   (`kernelize::launch_*`) and inductor never sees the reduction at all.
2. `EAGER_OPS` includes the ops whose decompositions change bits (their decomposition is
   removed from the table handed to AOT autograd), matrix-vector and dot products among them;
   `MATRIX_PRODUCTS` (mm, bmm, addmm, baddbmm) keep inductor's lowering of a matrix product
   (eager's GEMM) on CUDA without the decompositions that write some shapes as products and a
   sum, and are eager's kernels on the CPU, whose lowering does that too; a batched product is
   folded into one mm or mv as eager folds it (`matmuls_folded_as_eager`); GEMM autotuning is
   off (`EXACT_CONFIG`).
3. `EXACT_CONFIG`: the pattern matcher off.
4. (roundings): `EXACT_CONFIG`: eager's casts emulated, division rounded as eager, no
   flush-to-zero, PyTorch's libdevice where this torch has those switches; an op with a Python
   number written as eager computes it (`scalar_rdiv_as_eager`, `cpu_scalar_opmath`).

5. Library code that takes another path when it knows it is compiled (transformers' SDPA
   attention and the mask builders' decisions) is kept on eager's path while exact-compiled
   code runs (`_with_eager_branches`), and transformers' `generate()` is kept from compiling
   the model again with plain inductor (`hold_generate_compile`).

Everything else (the adds, multiplies, casts, copies, views and the graph around them) is left
to inductor, and so is CUDA-graph capture (`mode="reduce-overhead"`; a forward is one
CUDA-graph step and the KV cache must be static, `_cuda_graph_steps`). `max-autotune` modes are
refused: they replace cuBLAS matmuls by Triton templates that reduce in another order.

The configuration is applied per compilation (inductor's `config_patches`, and the lowering
table patched only while this backend lowers a graph), so plain `torch.compile` in the same
process is untouched. Inductor's FX graph caches and AOT autograd's cache are off while the
lowering table is patched: the patch is not part of their keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import operator
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import torch

from .launch import cache_dir
from .ops import define as _define_op

# ---- what the exact backend changes -------------------------------------------------------

#: Inductor configuration applied to every exact compilation; a name this torch does not have
#: is left out (`exact_config()` says which were applied).
EXACT_CONFIG: dict[str, Any] = {
    # 3. no pattern replacements (SDPA patterns, mm/bias rewrites, einsum rewrites, ...)
    "pattern_matcher": False,
    # 4. eager's intermediate roundings: a bf16/f16 op's result is rounded before the next op
    "emulate_precision_casts": True,
    # 4. x / y rounded as eager's IEEE division (Triton's default is the approximate div.full)
    "eager_numerics.division_rounding": True,
    # 4. no flush-to-zero of subnormals (eager's kernels keep them)
    "eager_numerics.disable_ftz": True,
    # 4. the CUDA toolkit's libdevice (torch >= 2.13; the ops it would matter for are fallbacks)
    "eager_numerics.use_pytorch_libdevice": True,
    "use_fast_math": False,
    # 2. (matrix products) no Triton or C++ GEMM templates in place of eager's cuBLAS/BLAS
    # matmuls (they accumulate in another order) and no tuning that rewrites matrix products,
    # whatever the caller's options ask (mode="max-autotune" is refused: `_config_patches`)
    "max_autotune": False,
    "max_autotune_gemm": False,
    "coordinate_descent_tuning": False,
}

#: With the lowering table patched (`eager_lowerings`), inductor's FX graph caches are off: the
#: patch is not part of their key, so a cached graph would come back with the other lowering.
_NO_GRAPH_CACHE = {"fx_graph_cache": False, "fx_graph_remote_cache": False}

#: ATen ops the exact backend leaves to eager's own kernels (by overload packet name), and why.
EAGER_OPS: dict[str, str] = {
    **{name: "a reduction: inductor adds in another order than eager's kernel" for name in (
        "sum", "mean", "nansum", "prod", "var", "var_mean", "std", "std_mean", "logsumexp",
        "cumsum", "cumprod", "logcumsumexp", "norm", "linalg_vector_norm", "_softmax",
        "_log_softmax", "_safe_softmax")},
    **{name: "a normalisation: its decomposition computes other statistics than eager's kernel "
             "(PyTorch PR 177163)" for name in (
        "native_layer_norm", "native_group_norm", "_fused_rms_norm", "native_batch_norm",
        "_native_batch_norm_legit", "_native_batch_norm_legit_no_training")},
    **{name: "a math-library function: Triton's may differ from the CUDA one eager calls (a "
             "fallback unless `prove` finds inductor's code eager's on every input, for those "
             "of PROVABLE)" for name in (
        "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sigmoid", "silu", "gelu",
        "tanh", "erf", "erfc", "erfinv", "sin", "cos", "tan", "asin", "acos", "atan", "atan2",
        "sinh", "cosh", "asinh", "acosh", "atanh", "rsqrt", "reciprocal", "softplus", "mish",
        "elu", "selu", "celu", "hardswish", "hardsigmoid", "logit", "lgamma", "digamma")},
    "pow": "a math-library function unless the exponent is 2 (which both compute as x * x) or "
           "`prove` finds a lowering eager's on every input",
    **{name: "a matrix-vector or vector product: its decomposition, `(a * b).sum()`, adds the "
             "products in another order than eager's BLAS kernel" for name in (
        "mv", "dot", "vdot", "addmv")},
}

#: The matrix products (ATen ops) whose decompositions the exact backend leaves out while keeping
#: inductor's lowering on CUDA (an extern cuBLAS call, the kernel eager calls; measured
#: bit-identical on every model, session 34), and which it makes eager's own kernels on the CPU,
#: where inductor's lowering itself writes some shapes as products and a sum (a bmm of one row or
#: one column; small mm). Inductor's decomposition table rewrites a matrix product of some shapes
#: into pointwise products and a sum (mm and bmm of one row by one column on the CPU, any row or
#: column count under coordinate-descent tuning), or a product of inner size 1 plus a bias into a
#: rounded product and a rounded add (addmm on CUDA), where eager's GEMM accumulates in its own
#: order and rounds once.
MATRIX_PRODUCTS: dict[str, str] = {
    name: "a matrix product: at some shapes its decomposition (or its CPU lowering) is products and "
          "a sum, or a rounded product and an add, where eager's GEMM accumulates and rounds once"
    for name in ("mm", "bmm", "addmm", "baddbmm")}

# ---- attention: scaled-dot-product attention as eager runs it -------------------------------

# `F.scaled_dot_product_attention` is a composite: while tracing, PyTorch picks its backend
# (flash, memory-efficient, math) for the traced shapes and decomposes it, and inductor lowers
# what it picked; eager picks at each call. In f32 on an H100 the two picks differ and so do the
# logits of every model that attends through SDPA (docs/compile.md). The exact backend replaces
# each SDPA call of the graph it is given by this operator, which inductor cannot look into:
# the call runs eagerly, picking its backend as eager does. Its output has the query's layout
# (`_like_query`: a model's query is usually a transposed view of its projection, and the
# attention backends tend to write their output in that layout, which the model's transpose
# back then reads without a copy); where the backend wrote another, a copy keeps the values.

def _like_query(query: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """An empty attention output with the query's layout (its strides where it is dense, as
    `empty_like` keeps them), contiguous where the value's head size differs."""
    if value.shape[-1] == query.shape[-1]:
        return torch.empty_like(query)
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


def _sdpa_fake(query, key, value, *_, **__):
    return _like_query(query, value)


def _in_query_layout(out: torch.Tensor, query: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`out` (an attention output) in the layout `_sdpa_fake` declares: itself where the
    backend wrote it so, else a copy. A model's query (contiguous, or a transposed view of a
    contiguous projection) is dense, and `empty_like` keeps a dense tensor's strides: then the
    declared strides are the query's own, read without allocating."""
    want = None
    if value.shape[-1] == query.shape[-1] and (
            query.is_contiguous() or (query.dim() > 2 and query.transpose(1, 2).is_contiguous())):
        stride = query.stride()
    else:
        want = _like_query(query, value)
        stride = want.stride()
    if out.stride() == stride and out.storage_offset() == 0:
        return out
    return (want if want is not None else _like_query(query, value)).copy_(out)


# The SDPA operators run on every device (the CPU tests compile with them); no backward (under
# autograd the exact backend leaves SDPA as traced, `opaque_sdpa`).
@_define_op("eager_sdpa", "(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
            "float dropout_p, bool is_causal, float? scale, bool enable_gqa) -> Tensor",
            _sdpa_fake, "CompositeExplicitAutograd")
def eager_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attn_mask: torch.Tensor | None, dropout_p: float, is_causal: bool,
               scale: float | None, enable_gqa: bool) -> torch.Tensor:
    kw = {"enable_gqa": True} if enable_gqa else {}
    return _in_query_layout(torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
        scale=scale, **kw), query, value)


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
                  "enable_gqa": False}


def _value(node: Any) -> Any:
    """A dynamo graph node's example value (a fake tensor for a tensor), or None."""
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _is_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor)


def _replace_with(gm: torch.fx.GraphModule, node: torch.fx.Node,
                  build: Callable[[], torch.fx.Node]) -> torch.fx.Node:
    """Put what `build` inserts (its last node stands for the result) where `node` is, with
    `node`'s metadata (the example value the passes after it read), and remove `node`: the one
    form of every rewrite below."""
    with gm.graph.inserting_before(node):
        new = build()
    new.meta = dict(node.meta)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    return new


def _replace(gm: torch.fx.GraphModule, node: torch.fx.Node, target: Any, args: tuple) -> torch.fx.Node:
    """`_replace_with` one call of `target` on `args`."""
    return _replace_with(gm, node, lambda: gm.graph.call_function(target, args))


def _recompiled(gm: torch.fx.GraphModule, n: int) -> int:
    """`n` (how many rewrites a pass made), after checking and recompiling `gm` where it made any."""
    if n:
        gm.graph.lint()
        gm.recompile()
    return n


def opaque_sdpa(gm: torch.fx.GraphModule) -> int:
    """Replace every scaled-dot-product-attention call of a dynamo graph by `eager_sdpa`;
    returns how many were replaced. Calls traced under autograd (an output that requires grad)
    are left as they are: the operator has no backward (training is issue 30)."""
    targets = {torch.nn.functional.scaled_dot_product_attention,
               getattr(torch._C._nn, "scaled_dot_product_attention", None)}
    n_replaced = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in targets:
            continue
        if getattr(_value(node), "requires_grad", False):
            continue   # under autograd: `eager_sdpa` has no backward, SDPA stays as traced
        vals = dict(zip(_SDPA_ARGS, node.args))
        vals.update(node.kwargs)
        args = tuple(vals.get(k, _SDPA_DEFAULTS.get(k)) for k in _SDPA_ARGS)
        _replace(gm, node, torch.ops.kernelize.eager_sdpa.default, args)
        n_replaced += 1
    return _recompiled(gm, n_replaced)


# ---- attention masks: converted once, as eager converts them --------------------------------

# Given a boolean mask, F.scaled_dot_product_attention converts it to an additive mask of the
# query's dtype in every call, so a decoder converts the same mask once per layer (a 1B Llama's
# decode step on an H200: 22 `where` and 44 fills, 86 us of its 1.8 ms of GPU time;
# bench/COMPILE.md). The exact backend converts each mask once (`sdpa_mask_bias`) and hands the
# additive mask to the attention calls that read it (`eager_sdpa_bias`), where that is eager's
# own computation:
# - the conversion is the one this torch runs: the ATen ops that F.scaled_dot_product_attention
#   records between the mask and the attention kernel when traced (make_fx) on real tensors of
#   the device (`mask_conversion`, once per dtype and device), taken only when they are
#   shape-free (`_CONVERSION_OPS`) and the backend is one whose mask goes to its kernel as
#   converted (`HOIST_BACKENDS`: cuDNN; the memory-efficient backend pads masks to its alignment);
# - at each call, eager's backend choice (`torch._fused_sdp_choice`) for the boolean mask and
#   for the additive one must both be the backend the conversion was recorded for; otherwise the
#   call gets the boolean mask and converts it itself, as eager. An additive mask of the query's
#   dtype is passed through unconverted, so the kernel gets the same bits either way.

#: Backends (torch._fused_sdp_choice's numbers) whose boolean-mask conversion is hoisted:
#: 3 = cuDNN attention (PyTorch 2.11's attention.cpp converts and calls the kernel, nothing in
#: between; bench/sdpa_mask_probe.py, docs/gpu-runs/2026-11-27-s15).
HOIST_BACKENDS = frozenset({3})
_CONVERSION_OPS = frozenset({"where", "logical_not", "scalar_tensor"})
_CONVERSIONS: dict[tuple, tuple[int, torch.fx.GraphModule] | None] = {}


def _probe(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """A decode-shaped masked attention call's tensors (query, key, value, boolean mask)."""
    q = torch.zeros(1, 8, 1, 64, dtype=dtype, device=device)
    k = torch.zeros(1, 8, 128, 64, dtype=dtype, device=device)
    v = torch.ones(1, 8, 128, 64, dtype=dtype, device=device)
    return q, k, v, torch.ones(1, 1, 1, 128, dtype=torch.bool, device=device)


def probe_backend(dtype: torch.dtype, device: torch.device) -> int:
    """The backend (`torch._fused_sdp_choice`'s number) eager picks on `device` for a masked
    decode-shaped attention call with queries of `dtype`: what `mask_conversion` traces."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily(), torch.no_grad():
        return int(torch._fused_sdp_choice(*_probe(dtype, device), 0.0, False))


def _trace_conversion(dtype: torch.dtype, device: torch.device) -> tuple[int, torch.fx.GraphModule] | None:
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import make_fx
    choice = probe_backend(dtype, device)
    if choice not in HOIST_BACKENDS:
        return None
    with unset_fake_temporarily(), torch.no_grad():
        q, k, v, mask = _probe(dtype, device)
        traced = make_fx(lambda q_, k_, v_, m_: torch.nn.functional.scaled_dot_product_attention(
            q_, k_, v_, attn_mask=m_))(q, k, v, mask)
    nodes = list(traced.graph.nodes)
    mask_in = [n for n in nodes if n.op == "placeholder"][3]
    # the nodes computed from the mask and constants alone, and which of them the rest reads
    from_mask = {mask_in}
    for n in nodes:
        if n.op == "call_function" and all(i in from_mask for i in n.all_input_nodes):
            from_mask.add(n)
    read = [n for n in from_mask if n is not mask_in and any(u not in from_mask for u in n.users)]
    if len(read) != 1:
        return None
    bias = read[0]
    need: list[torch.fx.Node] = []
    stack = [bias]
    while stack:
        n = stack.pop()
        if n is mask_in or n in need:
            continue
        need.append(n)
        stack.extend(n.all_input_nodes)
    if mask_in not in {i for n in need for i in n.all_input_nodes} or any(
            getattr(n.target, "_opname", None) not in _CONVERSION_OPS for n in need):
        return None   # not a conversion of the mask, or one with shape-dependent steps
    g = torch.fx.Graph()
    env = {mask_in: g.placeholder("mask")}
    for n in nodes:
        if n in need:
            env[n] = g.node_copy(n, lambda a: env[a])
    g.output(env[bias])
    return choice, torch.fx.GraphModule(torch.nn.Module(), g)


def mask_conversion(dtype: torch.dtype, device: torch.device) -> tuple[int, torch.fx.GraphModule] | None:
    """(backend, conversion) of a boolean attention mask for queries of `dtype` on `device`, as
    F.scaled_dot_product_attention converts it there; None where it is not hoisted (above)."""
    key = (dtype, device.type, device.index)
    if key not in _CONVERSIONS:
        try:
            _CONVERSIONS[key] = _trace_conversion(dtype, device)
        except Exception:   # noqa: BLE001 - a torch that traces otherwise: convert per call
            _CONVERSIONS[key] = None
    return _CONVERSIONS[key]


def _conversion_of(mask: torch.Tensor, dtype: torch.dtype) -> torch.fx.GraphModule:
    conv = mask_conversion(dtype, mask.device)
    if conv is None:
        raise RuntimeError(f"kernelize::sdpa_mask_bias: no hoisted mask conversion for {dtype} on "
                           f"{mask.device} (the exact backend inserts this op only where there is one)")
    return conv[1]


def _converted(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _conversion_of(mask, dtype)(mask)   # on fake tensors too: the shape and strides


@_define_op("sdpa_mask_bias", "(Tensor mask, ScalarType dtype) -> Tensor", _converted,
            "CompositeExplicitAutograd")
def sdpa_mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _converted(mask, dtype)


@_define_op("eager_sdpa_bias", "(Tensor query, Tensor key, Tensor value, Tensor attn_mask, "
            "Tensor bias, float dropout_p, bool is_causal, float? scale, bool enable_gqa) -> Tensor",
            _sdpa_fake, "CompositeExplicitAutograd")
def eager_sdpa_bias(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor, bias: torch.Tensor, dropout_p: float, is_causal: bool,
                    scale: float | None, enable_gqa: bool) -> torch.Tensor:
    mask = attn_mask
    conv = mask_conversion(query.dtype, query.device)
    if conv is not None and bias.dtype == query.dtype:
        def choice(m: torch.Tensor) -> int:
            return int(torch._fused_sdp_choice(query, key, value, m, dropout_p, is_causal,
                                               scale=scale, enable_gqa=enable_gqa))
        if choice(attn_mask) == conv[0] and choice(bias) == conv[0]:
            mask = bias
    kw = {"enable_gqa": True} if enable_gqa else {}
    return _in_query_layout(torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
        scale=scale, **kw), query, value)


#: Whether the exact backend converts a mask read by several attention calls once
#: (`hoist_sdpa_masks`; a switch for the benchmarks that measure what it gains or costs: in
#: default mode each hoisted call asks ATen's backend choice twice more; both ways are exact).
HOIST_SDPA_MASKS = True


def hoist_sdpa_masks(gm: torch.fx.GraphModule) -> int:
    """Give the `eager_sdpa` calls of a graph that read one boolean mask (two or more of them:
    one call converts it once anyway) that mask converted once (`sdpa_mask_bias` +
    `eager_sdpa_bias`, above) where `mask_conversion` has a conversion for their queries;
    returns how many masks are converted once instead of per call."""
    groups: dict[tuple[torch.fx.Node, torch.dtype], list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.kernelize.eager_sdpa.default:
            continue
        q, mask = node.args[0], node.args[3]
        vq, vm = _value(q), _value(mask)
        if not (_is_tensor(vq) and _is_tensor(vm)) or vm.dtype != torch.bool:
            continue
        if mask_conversion(vq.dtype, vq.device) is None:
            continue
        groups.setdefault((mask, vq.dtype), []).append(node)
    groups = {k: calls for k, calls in groups.items() if len(calls) > 1}
    for (mask, dtype), calls in groups.items():
        with gm.graph.inserting_before(calls[0]):   # the mask's first reader, in graph order
            bias = gm.graph.call_function(torch.ops.kernelize.sdpa_mask_bias.default, (mask, dtype))
        for node in calls:
            q, k, v, m, dropout_p, is_causal, scale, gqa = node.args
            _replace(gm, node, torch.ops.kernelize.eager_sdpa_bias.default,
                     (q, k, v, m, bias, dropout_p, is_causal, scale, gqa))
    return _recompiled(gm, len(groups))


# ---- residual add + norm: one kernel --------------------------------------------------------

# A decoder block adds its attention's (or MLP's) output to the residual stream and normalises
# the sum: `h = residual + o_proj(a); y = norm(h)`. With the norm an opaque kernel, inductor runs
# the add as a kernel of its own. Where kernelize swapped the norm (an RMSNorm of llama semantics,
# or a LayerNorm) and loaded the source's verified fused kernel beside it (fused_add_rms_norm,
# fused_add_layer_norm; `ops.pair_residual`), the two run as that one kernel:
# `s = round(x + residual)` is eager's bf16/f16/f32 add (addition commutes, so either operand
# may be the kernel's `residual`), its output the norm of s. The kernel writes s
# over its `residual` operand, so that operand must be a fresh tensor nothing else reads: the
# output of a linear layer or matmul whose only user is the add (never a graph input or a view
# of one), or a reshaping view or eval-mode dropout of such an output (`_fresh`).

#: Whether the exact backend fuses residual adds into the norms after them (a switch for the
#: benchmarks that measure what the fusion gains; both ways are exact).
FUSE_RESIDUAL_NORMS = True

_FRESH = frozenset(f for f in (getattr(torch._C._nn, "linear", None), torch.nn.functional.linear,
                               torch.matmul, operator.matmul, torch.mm, torch.bmm, torch.addmm)
                   if f is not None)
# What may stand between a fresh tensor and the add, each read by the next alone: a reshaping
# view (GPT-2's Conv1D: `addmm(b, x.view(-1, d), w).view(*shape, d)`) and dropout outside
# training (the tensor itself).
_VIEW_METHODS = frozenset({"view", "reshape"})
_VIEW_FUNCTIONS = frozenset({torch.reshape})


def _fresh(a: Any) -> bool:
    """Whether the add's operand `a` is a fresh tensor the add alone reads: the output of a
    linear layer or matmul (`_FRESH`, not a view of anything), or a view or an eval-mode dropout
    of one, each step read by the next alone."""
    while isinstance(a, torch.fx.Node) and len(a.users) == 1:
        if a.op == "call_function" and a.target in _FRESH:
            return _is_tensor(_value(a)) and _value(a)._base is None
        if (a.op == "call_method" and a.target in _VIEW_METHODS) or \
                (a.op == "call_function" and a.target in _VIEW_FUNCTIONS):
            a = a.args[0]
        elif a.op == "call_function" and a.target is torch.nn.functional.dropout and \
                not {**dict(zip(("input", "p", "training", "inplace"), a.args)), **a.kwargs}.get(
                    "training", True):
            a = a.args[0] if a.args else a.kwargs.get("input")
        else:
            return False
    return False


def fuse_residual_norms(gm: torch.fx.GraphModule) -> int:
    """Replace each `kernelize::launch_rms_norm(a + b, w, eps, key)` (and
    `kernelize::launch_layer_norm(a + b, w, bias, eps, key)`) of a dynamo graph whose kernel has a
    fused partner (`ops.residual_partner`) by `kernelize::launch_fused_add_rms_norm` (and
    `kernelize::launch_fused_add_layer_norm`), when one of a and b is a fresh tensor only the add
    reads and the sum is read nowhere before the norm; returns how many were replaced. Under
    autograd nothing is replaced (the ops have no backward)."""
    from . import ops
    from .manifest import FUSED_ADD
    # norm's launch op -> (its fused op, how many arguments the norm's takes: the first is the
    # normalised tensor, the last the kernel's key; the fused op takes (other, res, *the ones
    # between, fused key))
    fused_of = {}
    for norm, fused in FUSED_ADD.items():
        norm_op = ops.op(norm)
        fused_of[norm_op] = fused_of[norm_op.default] = (
            ops.op(fused).default, len(norm_op.default._schema.arguments))
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    n_fused = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in fused_of or node.kwargs \
                or len(node.args) != fused_of[node.target][1]:
            continue
        fused_op = fused_of[node.target][0]
        h, *params, key = node.args
        fkey = ops.residual_partner(key)
        if fkey is None or not isinstance(h, torch.fx.Node) or h.op != "call_function" \
                or h.target not in (operator.add, torch.add) or h.kwargs or len(h.args) != 2:
            continue
        vh, vals = _value(h), [_value(a) for a in h.args]
        if not (_is_tensor(vh) and all(_is_tensor(v) for v in vals)) or vh.requires_grad:
            continue
        if any(v.shape != vh.shape or v.dtype != vh.dtype or v.device != vh.device for v in vals):
            continue   # a broadcast or a promotion: not the kernel's add
        if any(order.get(u, -1) < order[node] for u in h.users if u is not node):
            continue   # the sum is read before the norm (or by a node this pass inserted)
        fresh = [a for a in h.args if _fresh(a)]
        if not fresh:
            continue
        res = fresh[-1]
        other = h.args[0] if h.args[1] is res else h.args[1]
        if other is res:
            continue   # x + x
        _replace(gm, node, fused_op, (other, res, *params, fkey))
        h.replace_all_uses_with(res)   # the sum: what the kernel wrote over `res`
        gm.graph.erase_node(h)
        n_fused += 1
    return _recompiled(gm, n_fused)


# ---- products of one term: pointwise -------------------------------------------------------

# A matmul whose inner dimension is 1 (`a @ b` with a `[..., M, 1]` and b `[..., 1, N]`: the
# rotary embedding's `inv_freq @ position_ids` in every HF decoder) adds nothing: each output
# element is one product a[i] * b[j], rounded once to the output's dtype, by cuBLAS (alpha 1,
# beta 0) as by a pointwise multiply (bf16/f16 products are exact in f32 and rounded once; an f32
# product is rounded once). So `a * b` (broadcast) has eager's bits, and inductor fuses it with the
# cos / sin / cat after it instead of calling cuBLAS once a step (plain compile's pattern passes
# do the same; session 30's profile, bench/COMPILE.md). Not where the product could use TF32 (f32
# with a matmul precision other than "highest", or TF32 on for CUDA matmuls), under autograd
# (the backward of a multiply reduces in another order than the matmul's), for 1-D operands, or
# where the shapes are symbolic.

_MATMULS = frozenset({operator.matmul, torch.matmul, torch.bmm, torch.mm})


def _tf32_possible() -> bool:
    """Whether an f32 matmul may run below f32 precision (TF32 on CUDA; TF32 or bf16 in oneDNN on
    the CPU), by either of torch's APIs (`set_float32_matmul_precision` / `allow_tf32`, and the
    `fp32_precision` settings). Where a setting cannot be read (torch refuses to answer
    `allow_tf32` once both APIs were used), it may."""
    try:
        if torch.get_float32_matmul_precision() != "highest":
            return True
        for owner in (torch.backends, getattr(torch.backends.cuda, "matmul", None),
                      getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)):
            if getattr(owner, "fp32_precision", "none") not in ("none", "ieee"):
                return True
        return bool(getattr(torch.backends.cuda.matmul, "allow_tf32", False))
    except RuntimeError:
        return True


def _tensor_products(gm: torch.fx.GraphModule, targets: frozenset) -> Iterator[tuple]:
    """(node, a, b, va, vb, vo) for every call of one of `targets` in a dynamo graph on two
    positional tensor operands: the nodes and their example values (the matmul rewrites' scan)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in targets or node.kwargs or len(node.args) != 2:
            continue
        a, b = node.args
        va, vb, vo = _value(a), _value(b), _value(node)
        if _is_tensor(va) and _is_tensor(vb) and _is_tensor(vo):
            yield node, a, b, va, vb, vo


def pointwise_outer_products(gm: torch.fx.GraphModule) -> int:
    """Replace every matmul of a dynamo graph whose inner dimension is statically 1 by the
    broadcast product (above); returns how many were replaced."""
    n_replaced = 0
    for node, a, b, va, vb, vo in _tensor_products(gm, _MATMULS):
        if va.dim() < 2 or vb.dim() < 2 or vo.requires_grad or not (va.dtype == vb.dtype == vo.dtype):
            continue
        if va.dtype not in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
            continue
        if va.dtype == torch.float32 and _tf32_possible():
            continue
        if type(va.shape[-1]) is not int or type(vb.shape[-2]) is not int or va.shape[-1] != 1 \
                or vb.shape[-2] != 1 or not all(type(d) is int for d in vo.shape):
            continue
        _replace(gm, node, operator.mul, (a, b))
        n_replaced += 1
    return _recompiled(gm, n_replaced)


# ---- a batched matmul folded into one as eager folds it --------------------------------------

# `a @ w` with `a` of 3 or more dimensions and `w` a matrix: eager's `matmul` folds `a` into a
# matrix and calls one mm when its leading dimensions can be merged without a copy,
# `a.stride(i) == a.stride(i + 1) * a.size(i + 1)` for every i before the last two (ATen's
# `should_fold`), which a slice of a row holds (`x[..., :2]` of a contiguous x). PyTorch's traced
# decomposition of `matmul` folds only a fully contiguous `a` and otherwise expands `w` and calls
# bmm, a different GEMM: on a CPU with AVX-512, `x[..., :2] @ w` (x 3x37x16, w 2x5) differed from
# eager in 144 of 555 elements (session 33). Where eager would fold and the decomposition would
# not, the exact backend writes eager's fold into the dynamo graph (`matmuls_folded_as_eager`):
# `a.reshape(-1, k)` (the same view), one mm, the result viewed back. A vector `w` is folded the
# same way into eager's mv (`a.reshape(-1, k).mv(w)`), which `EAGER_OPS` keeps eager's kernel:
# inductor's decomposition of mv, `(a * w).sum(1)`, differed from eager's in 75 of 111 f32
# elements of a contiguous 3x37x16 `a` on that CPU, and a sliced `a` went to bmm (session 34).

_FOLDABLE = frozenset({operator.matmul, torch.matmul})


def _eager_folds(va: torch.Tensor, vb: torch.Tensor) -> bool:
    """Whether eager's matmul folds `va` (3+ dims) @ `vb` (a matrix or a vector) into one mm or
    mv while PyTorch's decomposition, which needs `va` contiguous, would not (static shapes
    only)."""
    if va.dim() < 3 or vb.dim() not in (1, 2):
        return False
    shape, stride = va.shape, va.stride()
    if not all(type(d) is int for d in (*shape, *stride, *vb.shape)):
        return False
    if va.numel() == 0 or va.is_contiguous() or vb.requires_grad:
        return False   # both fold (or there is nothing to compute)
    return all(stride[i] == stride[i + 1] * shape[i + 1] for i in range(va.dim() - 2))


def matmuls_folded_as_eager(gm: torch.fx.GraphModule) -> int:
    """Rewrite every `a @ w` of a dynamo graph that eager folds into one mm (or mv, `w` a
    vector) and PyTorch's decomposition would not (above) as eager's fold; returns how many
    were rewritten."""
    n_replaced = 0
    for node, a, b, va, vb, vo in _tensor_products(gm, _FOLDABLE):
        if not _eager_folds(va, vb):
            continue
        k, out_shape = int(va.shape[-1]), tuple(int(d) for d in vo.shape)
        product = torch.mm if vb.dim() == 2 else torch.mv

        def build(a=a, b=b, k=k, out_shape=out_shape, product=product) -> torch.fx.Node:
            flat = gm.graph.call_function(torch.reshape, (a, (-1, k)))
            prod = gm.graph.call_function(product, (flat, b))
            return gm.graph.call_function(torch.reshape, (prod, out_shape))
        _replace_with(gm, node, build)
        n_replaced += 1
    return _recompiled(gm, n_replaced)


# ---- ops with a Python scalar, as eager computes them ----------------------------------------

# `s / t` (a Python scalar over a tensor) is `Tensor.__rtruediv__`, which eager computes as
# `t.reciprocal() * s` (torch/_tensor.py): the reciprocal rounded to t's dtype, then the product
# rounded. Dynamo records `operator.truediv(s, t)` and inductor lowers one division: `0.7 / x`
# in bf16 differed from eager in 21,592 of 131,072 elements on the CPU (session 31). The exact
# backend writes it back as eager's two ops (`scalar_rdiv_as_eager`), on every device.
#
# A 16-bit tensor times a Python scalar: eager's CPU `mul` takes the scalar's own value in f32
# (its opmath), then rounds once; inductor's C++ code for the CPU, under
# `emulate_precision_casts` (which the exact backend needs for the roundings between fused ops),
# first rounds the scalar to bf16/f16 (`0.044715 * x` in bf16: 24,698 of 131,072 elements 1 ulp
# off; GPT-2's `gelu_new`; found by `kernelize.diff`, session 31). The same holds for `t / s`.
# Eager's add and sub round the scalar to the tensor's dtype as inductor does, and Triton's code
# on CUDA keeps a product's scalar in f32 (GPT-2 exact on the GPU since session 21), so only a
# CPU product or quotient is written as eager computes it, `(t.float() * s).to(t.dtype)`
# (`cpu_scalar_opmath`): the upcast is exact, the op is f32's, the cast rounds once.

_MULS = frozenset({operator.mul, torch.mul})
_DIVS = frozenset({operator.truediv, torch.div, torch.true_divide})


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def scalar_rdiv_as_eager(gm: torch.fx.GraphModule) -> int:
    """Rewrite every `s / t` of a dynamo graph (s a Python number, t a floating tensor) as
    `t.reciprocal() * s`, eager's `Tensor.__rtruediv__`; returns how many."""
    n = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _DIVS or node.kwargs \
                or len(node.args) != 2 or not _number(node.args[0]):
            continue
        s, t = node.args
        vt = _value(t)
        if not _is_tensor(vt) or not vt.dtype.is_floating_point:
            continue
        def build() -> torch.fx.Node:   # called at once, in this iteration
            rec = gm.graph.call_method("reciprocal", (t,))
            rec.meta = {"example_value": vt}   # same shape and dtype: what later passes read
            return gm.graph.call_function(operator.mul, (rec, s))
        _replace_with(gm, node, build)
        n += 1
    return _recompiled(gm, n)


def cpu_scalar_opmath(gm: torch.fx.GraphModule) -> int:
    """Rewrite every product of a bf16/f16 CPU tensor and a Python number (and every quotient of
    one by a number) in a dynamo graph as `(t.float() * s).to(t.dtype)` (above); returns how
    many. Not under autograd (the casts would
    change the backward graph)."""
    n = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _MULS | _DIVS or node.kwargs \
                or len(node.args) != 2:
            continue
        a, b = node.args
        t, scalar = (a, b) if isinstance(a, torch.fx.Node) else (b, a)
        if not isinstance(t, torch.fx.Node) or not _number(scalar) \
                or (node.target in _DIVS and t is not a):
            continue
        vt, vo = _value(t), _value(node)
        if not (_is_tensor(vt) and _is_tensor(vo)) or vt.device.type != "cpu" \
                or vt.dtype not in (torch.bfloat16, torch.float16) or vo.dtype != vt.dtype \
                or vt.requires_grad or vo.requires_grad:
            continue
        def build() -> torch.fx.Node:   # called at once, in this iteration
            up = gm.graph.call_method("float", (t,))
            wide = gm.graph.call_function(node.target, (up, scalar) if t is a else (scalar, up))
            return gm.graph.call_method("to", (wide, vt.dtype))
        _replace_with(gm, node, build)
        n += 1
    return _recompiled(gm, n)


_STATE = "_kernelize_compile"
_MAX_AUTOTUNE = ("max-autotune", "max-autotune-no-cudagraphs")
_LOCK = threading.RLock()


def _has_config(name: str) -> bool:
    from torch._inductor import config as ic
    obj: Any = ic
    parts = name.split(".")
    for p in parts[:-1]:
        obj = getattr(obj, p, None)
        if obj is None:
            return False
    return hasattr(obj, parts[-1])


def exact_config() -> dict[str, Any]:
    """The part of `EXACT_CONFIG` this torch has (inductor's `config_patches`)."""
    return {k: v for k, v in EXACT_CONFIG.items() if _has_config(k)}


def _overloads(names: Iterable[str]) -> list[Any]:
    """Every overload of every ATen op named in `names` that this torch has."""
    out = []
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for ov in packet.overloads():
            out.append(getattr(packet, ov))
    return out


def eager_overloads() -> list[Any]:
    """Every overload of every op of `EAGER_OPS` that this torch has."""
    return _overloads(EAGER_OPS)


def exact_decompositions() -> dict[Any, Callable]:
    """Inductor's decomposition table without the ops of `EAGER_OPS` (those reach lowering
    whole and are lowered as fallbacks to eager's kernels) and of `MATRIX_PRODUCTS` (inductor's
    lowering of those calls eager's kernel)."""
    from torch._inductor.decomposition import select_decomp_table
    keep = set(EAGER_OPS) | set(MATRIX_PRODUCTS)
    return {op: fn for op, fn in select_decomp_table().items()
            if getattr(getattr(op, "overloadpacket", None), "__name__", None) not in keep}


def _pow_exponent_two(args: tuple, kwargs: dict) -> bool:
    exp = args[1] if len(args) > 1 else kwargs.get("exponent")
    return isinstance(exp, (int, float)) and not isinstance(exp, bool) and exp == 2


@contextlib.contextmanager
def eager_lowerings() -> Iterator[None]:
    """While lowering: every overload of `EAGER_OPS` becomes a fallback to its ATen kernel,
    except a math-library function where it is proven eager's (`PROVABLE`, `proven`), and `pow`
    with exponent 2 (eager computes it as x * x too): those keep inductor's lowering."""
    from torch._inductor import lowering as low
    with _LOCK, _TABLE:
        saved: dict[Any, Any] = {}
        try:
            for ov in eager_overloads():
                saved[ov] = low.lowerings.get(ov)
                handler = low.fallback_handler(ov, add_to_fallback_set=False)
                if ov.overloadpacket.__name__ in PROVABLE:
                    handler = _math_handler(ov, saved[ov], handler)
                low.lowerings[ov] = handler
            for ov in _overloads(MATRIX_PRODUCTS):
                if ov in saved or low.lowerings.get(ov) is None:
                    continue
                saved[ov] = low.lowerings[ov]
                low.lowerings[ov] = _cpu_eager_handler(
                    saved[ov], low.fallback_handler(ov, add_to_fallback_set=False))
            yield
        finally:
            for ov, old in saved.items():
                if old is None:
                    low.lowerings.pop(ov, None)
                else:
                    low.lowerings[ov] = old


def _cpu_eager_handler(lowered: Callable, fallback: Callable) -> Callable:
    """A lowering that is eager's kernel (`fallback`) where the op's tensors are on the CPU and
    inductor's own (`lowered`) elsewhere (`MATRIX_PRODUCTS`)."""
    def handler(*args: Any, **kwargs: Any) -> Any:
        devices = {d.type for d in (getattr(a, "get_device", lambda: None)() for a in args) if d is not None}
        return (fallback if devices == {"cpu"} else lowered)(*args, **kwargs)
    return handler


def _math_handler(ov: Any, lowered: Callable | None, fallback: Callable) -> Callable:
    is_pow = ov.overloadpacket.__name__ == "pow"

    def handler(*args, **kwargs):
        if is_pow and lowered is not None and _pow_exponent_two(args, kwargs):
            return lowered(*args, **kwargs)
        name = proven(_lowering_key(ov, args, kwargs))
        use = dict(_candidates(ov, tuple(args[1:]), kwargs, lowered)).get(name) if name else None
        return (use or fallback)(*args, **kwargs)
    handler._is_fallback_handler = True  # type: ignore[attr-defined]
    return handler


# ---- math-library functions: inductor's code where it is proven to be eager's --------------

# A math-library function (tanh, sigmoid, exp, pow(x, 3.0), ...) is a fallback by rule (Triton's
# code for it need not be the CUDA code eager runs), and a fallback is a kernel of its own, with
# its input and output in memory, where inductor would fuse the function with the pointwise code
# around it: GPT-2's tanh-GELU (`0.5 * x * (1 + tanh(c * (x + 0.044715 * pow(x, 3.0))))`) is four
# kernels instead of one. A function of one tensor can be checked on every input: 65,536 of a
# 16-bit dtype, 2^32 of f32 (in chunks, on a GPU). `prove` compiles the function alone under the
# exact configuration, runs it and eager on every input of the dtype, and compares the bits of
# each output; where none differs, the exact backend keeps inductor's lowering of it for that
# dtype on that device. Where inductor's own lowering differs, a rewrite that computes eager's
# formula with inductor's pointwise code is tried the same way (`_candidates`: eager's CUDA
# kernel computes a 16-bit `pow(x, 3.0)` as `x * x * x`, each product rounded, where inductor's
# own lowering rounds once; sigmoid as eager's formula in f32; silu and gelu, which inductor
# only decomposes, as eager's CUDA formula in f32, rounded once). Inside a fused kernel the
# function runs the same code on the same values (eager's casts are emulated, so a 16-bit input
# is the rounded value eager's kernel reads).
# Measured on an H100 (torch 2.11, bench/math_proofs.py, docs/gpu-runs/2026-11-28-s20 and -s21):
# tanh, exp, exp2, expm1, log, log1p, sin, cos and rsqrt are eager's in bf16, f16 and f32;
# sigmoid, erf and reciprocal in some dtypes only; inductor's pow(x, 3.0) only in f32, `x * x *
# x` in bf16 and f16; sigmoid's formula in f16 and f32, silu's in all three; gelu's tanh form in
# bf16 and f16 (an H200); gelu's erf form in none (Triton's erf is not CUDA's erff), so eager's
# kernel stays there.
# Only on CUDA (`PROVE_ON`): an elementwise CUDA kernel runs one function for every element,
# where a CPU kernel runs vectorised code for most elements and scalar code for the rest, so a
# value checked at one position says nothing of another. A proof is kept per process and, keyed
# by everything that makes the two codes (op, its scalar arguments, dtype, GPU, torch, CUDA,
# Triton, the exact configuration), in `$KERNELIZE_CACHE/proofs/` (trusted as the C launcher
# built there is: whoever can write there can already run code in this process).

#: The math-library functions of `EAGER_OPS` that `prove` may clear: functions of one tensor
#: (`pow` with a scalar exponent).
PROVABLE = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sigmoid", "tanh", "erf", "erfc",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "rsqrt", "reciprocal", "pow", "silu", "gelu"})
#: Device types where proofs are made (the comment above says why not the CPU).
PROVE_ON = frozenset({"cuda"})
#: Whether the exact backend proves and takes inductor's math functions (both ways are exact;
#: off, every math-library function is eager's kernel): `KERNELIZE_PROVE_MATH=0` turns it off
#: for a process, the benchmarks switch it to measure what it gains.
PROVE_MATH = os.environ.get("KERNELIZE_PROVE_MATH", "1") != "0"
_PROVE_DTYPES = {torch.bfloat16: torch.int16, torch.float16: torch.int16,
                 torch.float32: torch.int32}   # dtype -> the integer type of its bits
_CHUNK = 1 << 24   # f32 inputs per run of the compiled function (2^32 in 256 runs)
#: Held while the lowering table is patched (`eager_lowerings`) and while a proof compiles (in a
#: thread of its own): a proof never sees the exact backend's patched table.
_TABLE = threading.RLock()
_PROOFS: dict[tuple, dict[str, Any]] = {}
_log = logging.getLogger("kernelize")


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def _proof_key(ov: Any, scalars: tuple, kwargs: dict, dtype: torch.dtype,
               device: torch.device) -> tuple | None:
    """What a proof is about, or None where none can be made (not a function of one tensor of
    a proven dtype on a device of `PROVE_ON`)."""
    if (ov.overloadpacket.__name__ not in PROVABLE or dtype not in _PROVE_DTYPES
            or device.type not in PROVE_ON or not all(map(_scalar, (*scalars, *kwargs.values())))):
        return None
    index = device.index if device.index is not None else (
        torch.cuda.current_device() if device.type == "cuda" else 0)
    return (str(ov), tuple(scalars), tuple(sorted(kwargs.items())), str(dtype).split(".")[-1],
            device.type, index)


def _lowering_key(ov: Any, args: tuple, kwargs: dict) -> tuple | None:
    """`_proof_key` of a call as lowering sees it (its tensor an inductor IR node)."""
    if not args or isinstance(args[0], (int, float)) or not hasattr(args[0], "get_dtype"):
        return None
    return _proof_key(ov, tuple(args[1:]), kwargs, args[0].get_dtype(), args[0].get_device())


def proven(key: tuple | None) -> str | None:
    """The lowering (`_candidates`' name) the proof of `key` (made earlier, `prove_graph`) found
    eager's bits with on every input, or None."""
    rec = _PROOFS.get(key) if key is not None else None
    return rec["lowering"] if rec and rec["equal"] else None


def proofs() -> list[dict[str, Any]]:
    """Every proof this process made or read, as records (op, dtype, inputs, equal, the first
    input that differs)."""
    return [dict(r) for r in _PROOFS.values()]


def _identity(device: torch.device) -> dict[str, Any]:
    """What the two codes of a proof depend on besides the op: GPU, torch, CUDA, Triton, config."""
    ident: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                             "config": sorted((k, repr(v)) for k, v in exact_config().items())}
    try:
        import triton
        ident["triton"] = triton.__version__
    except ImportError:
        ident["triton"] = None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        ident["gpu"] = [p.name, p.major, p.minor]
    return ident


def _domain(dtype: torch.dtype, device: torch.device) -> Iterator[torch.Tensor]:
    """Every value of `dtype` (NaNs and infinities included), in chunks of at most `_CHUNK`."""
    bits = _PROVE_DTYPES[dtype]
    if bits is torch.int16:
        yield torch.arange(-32768, 32768, dtype=torch.int32, device=device).to(bits).view(dtype)
        return
    base = torch.arange(_CHUNK, dtype=torch.int32, device=device)
    for k in range((1 << 32) // _CHUNK):
        yield (base + (k * _CHUNK - (1 << 31))).view(dtype)


def _multiplied(n: int) -> Callable:
    """A lowering of `x ** n` as n - 1 multiplications from the left, each rounded to x's dtype
    as eager's (its CUDA kernel computes a 16-bit `x ** 3.0` as `x * x * x` in that dtype)."""
    def lower(x: Any, *_: Any, **__: Any) -> Any:
        from torch._inductor import lowering as low
        mul = low.lowerings[torch.ops.aten.mul.Tensor]
        y = x
        for _ in range(n - 1):
            y = mul(y, x)
        return y
    return lower


def _in_f32(formula: Callable) -> Callable:
    """A lowering of an activation computed as eager's CUDA kernel computes it: the input
    widened to f32, `formula(v)` (inductor's `ops`) in f32, rounded once to the input's dtype."""
    def lower(x: Any, *_: Any, **__: Any) -> Any:
        from torch._inductor import ir
        from torch._inductor.virtualized import ops
        loader, dtype = x.make_loader(), x.get_dtype()

        def fn(index: Any) -> Any:
            return ops.to_dtype(formula(ops.to_dtype(loader(index), torch.float32)), dtype)
        return ir.Pointwise.create(device=x.get_device(), dtype=dtype, inner_fn=fn,
                                   ranges=x.get_size())
    return lower


def _f32(v: float) -> Any:
    from torch._inductor.virtualized import ops
    import struct
    return ops.constant(struct.unpack("f", struct.pack("f", v))[0], torch.float32)


# eager's CUDA activations (ATen's ActivationSiluKernel.cu, ActivationGeluKernel.cu and
# UnarySpecialOpsKernel.cu), in f32:
#   sigmoid(x)     = 1 / (1 + exp(-x))
#   silu(x)        = x / (1 + exp(-x))
#   gelu(x)        = x * 0.5 * (1 + erf(x * M_SQRT1_2))
#   gelu(x, tanh)  = 0.5 * x * (1 + tanh(kBeta * (x + kKappa * (x * x * x)))),
#                    kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, kKappa = 0.044715
def _sigmoid_f32(v: Any) -> Any:
    from torch._inductor.virtualized import ops
    return ops.truediv(_f32(1.0), ops.add(_f32(1.0), ops.exp(ops.neg(v))))


def _silu_f32(v: Any) -> Any:
    from torch._inductor.virtualized import ops
    return ops.truediv(v, ops.add(_f32(1.0), ops.exp(ops.neg(v))))


def _gelu_f32(v: Any) -> Any:
    from torch._inductor.virtualized import ops
    return ops.mul(ops.mul(v, _f32(0.5)),
                   ops.add(_f32(1.0), ops.erf(ops.mul(v, _f32(0.7071067811865476)))))


def _gelu_tanh_f32(v: Any) -> Any:
    from torch._inductor.virtualized import ops
    cube = ops.mul(ops.mul(v, v), v)
    inner = ops.mul(_f32(0.7978845608028654), ops.add(v, ops.mul(_f32(0.044715), cube)))
    return ops.mul(ops.mul(_f32(0.5), v), ops.add(_f32(1.0), ops.tanh(inner)))


def _candidates(ov: Any, scalars: tuple, kwargs: dict,
                own: Callable | None) -> list[tuple[str, Callable]]:
    """The lowerings a proof may clear for `ov(x, *scalars, **kwargs)`, in order: inductor's own
    (`own`; silu and gelu have none, inductor decomposes them), then rewrites that compute
    eager's formula with inductor's pointwise code."""
    name = ov.overloadpacket.__name__
    out = [("inductor", own)] if own is not None and not getattr(
        own, "_is_fallback_handler", False) else []
    if name == "pow" and scalars in ((3,), (3.0,)):
        out.append(("x * x * x", _multiplied(3)))
    elif name == "sigmoid" and not scalars and not kwargs:
        out.append(("1 / (1 + exp(-x)) in f32", _in_f32(_sigmoid_f32)))
    elif name == "silu" and not scalars and not kwargs:
        out.append(("x / (1 + exp(-x)) in f32", _in_f32(_silu_f32)))
    elif name == "gelu":
        approximate = scalars[0] if scalars else kwargs.get("approximate", "none")
        if approximate == "tanh":
            out.append(("0.5 * x * (1 + tanh(kBeta * (x + kKappa * x^3))) in f32",
                        _in_f32(_gelu_tanh_f32)))
        elif approximate == "none":
            out.append(("x * 0.5 * (1 + erf(x * M_SQRT1_2)) in f32", _in_f32(_gelu_f32)))
    return out


def _compile_alone(ov: Any, scalars: tuple, kwargs: dict, example: torch.Tensor,
                   lowering: Callable) -> Callable:
    """`ov` compiled alone by inductor under the exact configuration, lowered by `lowering`
    (the caller holds `_TABLE`: nothing else patches the table meanwhile)."""
    from torch._inductor import lowering as low
    from torch._inductor.compile_fx import compile_fx
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(lambda x: ov(x, *scalars, **kwargs))(example)
    patches = {**exact_config(), **{k: v for k, v in _NO_GRAPH_CACHE.items() if _has_config(k)},
               "triton.cudagraphs": False}
    own = low.lowerings.get(ov)
    low.lowerings[ov] = lowering
    try:
        fn = compile_fx(gm, [example], config_patches=patches,
                        decompositions=exact_decompositions())
    finally:
        if own is None:
            low.lowerings.pop(ov, None)
        else:
            low.lowerings[ov] = own
    return lambda x: (lambda r: r[0] if isinstance(r, (tuple, list)) else r)(fn(x))


def _exhaustive(ov: Any, scalars: tuple, kwargs: dict, dtype: torch.dtype,
                device: torch.device) -> dict[str, Any]:
    """Each candidate lowering of `ov` (`_candidates`) against eager on every input of `dtype`,
    until one gives eager's bits on all; the record names it (`lowering`, None if none did)."""
    from torch._inductor import lowering as low
    bits = _PROVE_DTYPES[dtype]
    rec: dict[str, Any] = {"op": str(ov), "scalars": list(scalars), "kwargs": dict(kwargs),
                           "dtype": str(dtype).split(".")[-1], "device": str(device),
                           "inputs": 0, "equal": False, "lowering": None, "tried": []}
    with _TABLE, torch.no_grad():
        for name, lowering in _candidates(ov, scalars, kwargs, low.lowerings.get(ov)):
            tried: dict[str, Any] = {"lowering": name, "inputs": 0, "first_difference": None}
            rec["tried"].append(tried)
            fn = None
            for x in _domain(dtype, device):
                if fn is None:
                    fn = _compile_alone(ov, scalars, kwargs, x, lowering)
                want, got = ov(x, *scalars, **kwargs), fn(x)
                wb, gb = want.view(bits), got.view(bits)
                diff = (wb != gb).nonzero()
                tried["inputs"] += x.numel()
                if diff.numel():
                    i = int(diff[0, 0])
                    tried["first_difference"] = {
                        "input": x[i].view(bits).item() & ((1 << (8 * x.element_size())) - 1),
                        "eager": wb[i].item(), "inductor": gb[i].item(),
                        "differing_in_chunk": int(diff.shape[0])}
                    break
            if tried["first_difference"] is None:
                rec.update(equal=True, lowering=name, inputs=tried["inputs"])
                break
        if not rec["tried"]:
            raise RuntimeError(f"inductor has no lowering of its own for {ov} here")
    # the first candidate's (inductor's own lowering where it has one), if it differs
    rec["first_difference"] = rec["tried"][0]["first_difference"]
    rec["inputs"] = rec["inputs"] or rec["tried"][0]["inputs"]
    return rec


def prove(ov: Any, scalars: tuple, kwargs: dict, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a lowering of inductor's (its own, or a rewrite of `_candidates`) of
    `ov(x, *scalars, **kwargs)` gives eager's bits for every `x` of `dtype` on `device` (the
    section's comment says how); made once, then read back. A proof that cannot be made (no
    lowering of inductor's own, a compile error) is a no."""
    key = _proof_key(ov, scalars, kwargs, dtype, device)
    if key is None:
        return False
    if key not in _PROOFS:
        dev = torch.device(device.type, key[-1])
        ident = _identity(dev)
        rewrites = [n for n, _ in _candidates(ov, scalars, kwargs, None)]   # this version's
        blob = json.dumps([key[:4], ident, rewrites], default=repr).encode()
        name = hashlib.sha256(blob).hexdigest()[:24]
        path = cache_dir() / "proofs" / f"{name}.json"
        rec = None
        if path.exists():
            try:
                rec = json.loads(path.read_text())["proof"]
            except (OSError, ValueError, KeyError):
                rec = None
        if rec is None:
            what = f"{ov}{tuple(scalars) if scalars else ''} in {key[3]} on {dev}"
            _log.info("kernelize: proving %s: inductor's code against eager's kernel on every input "
                      "(once per machine; kept in %s)", what, path.parent)
            t0 = time.perf_counter()
            out: list[Any] = []

            def run() -> None:   # a thread of its own: no dynamo or inductor context of the caller
                try:
                    out.append(_exhaustive(ov, scalars, kwargs, dtype, dev))
                except Exception as e:  # noqa: BLE001 - not provable here: the fallback stays
                    out.append(e)
            t = threading.Thread(target=run, name="kernelize-proof", daemon=True)
            try:
                t.start()
                t.join()
            except RuntimeError as e:   # no thread to be had (a confined process): no proof
                out.append(e)
            if isinstance(out[0], Exception):
                rec = {"op": str(ov), "scalars": list(scalars), "kwargs": dict(kwargs),
                       "dtype": key[3], "device": str(dev), "inputs": 0, "equal": False,
                       "lowering": None, "tried": [], "first_difference": None,
                       "error": f"{type(out[0]).__name__}: {out[0]}"[:500]}
                _log.warning("kernelize: %s could not be proven (%s): eager's kernel stays",
                             what, rec["error"])
            else:
                rec = dict(out[0], seconds=round(time.perf_counter() - t0, 3))
                _log.info("kernelize: %s: %s (%.1f s)", what, f"eager's bits with {rec['lowering']}"
                          if rec["equal"] else "differs: eager's kernel stays", rec["seconds"])
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                    tmp.write_text(json.dumps({"identity": ident, "proof": rec}, indent=1))
                    os.replace(tmp, path)
                except OSError:
                    pass   # kept for the process only
        _PROOFS[key] = rec
    return _PROOFS[key]["equal"]


def prove_graph(gm: torch.fx.GraphModule) -> int:
    """Make the proofs a graph's math-library calls need (before it is lowered: a proof compiles
    code of its own); returns how many of its calls are proven."""
    n = 0
    for node in gm.graph.nodes:
        ov = node.target
        if node.op != "call_function" or not isinstance(ov, torch._ops.OpOverload) \
                or ov.overloadpacket.__name__ not in PROVABLE or not node.args:
            continue
        val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if _is_tensor(val):   # `prove` says no at once where no proof can be made
            n += prove(ov, tuple(node.args[1:]), dict(node.kwargs), val.dtype, val.device)
    return n


# ---- the backend --------------------------------------------------------------------------

def _config_patches(mode: str | None, options: dict | None, dynamic: bool | None) -> dict:
    if mode in _MAX_AUTOTUNE:
        raise ValueError(
            f"exact compile does not take mode={mode!r}: max-autotune replaces cuBLAS matmuls by "
            "Triton templates that reduce in another order than eager; use mode=None (default) or "
            "\"reduce-overhead\" (CUDA graphs)")
    from torch._inductor import list_mode_options
    patches: dict[str, Any] = {}
    if mode not in (None, "default"):
        patches.update(list_mode_options(mode, dynamic))
    patches.update(options or {})
    return patches


def make_backend(config: dict[str, Any] | None = None, eager_ops: bool = True) -> Callable:
    """An inductor backend with `config` (default: `exact_config()`) patched in and, with
    `eager_ops`, the ops of `EAGER_OPS` left to eager's kernels. `backend` is the whole exact
    backend; the divergence locator (`kernelize.diff`) builds the parts one at a time to say
    which one a difference needs."""
    fixed = exact_config() if config is None else dict(config)

    def compile_exact(gm: torch.fx.GraphModule, example_inputs: list, *, mode: str | None = None,
                      options: dict | None = None, **_: Any) -> Callable:
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        patches = _config_patches(mode, options, None)
        patches.update(fixed)   # exactness wins over the caller's options
        if not eager_ops:
            return compile_fx(gm, example_inputs, config_patches=patches)
        patches.update({k: v for k, v in _NO_GRAPH_CACHE.items() if _has_config(k)})
        opaque_sdpa(gm)
        if HOIST_SDPA_MASKS:
            hoist_sdpa_masks(gm)
        pointwise_outer_products(gm)
        matmuls_folded_as_eager(gm)   # after it: an outer product is no GEMM
        if FUSE_RESIDUAL_NORMS:
            fuse_residual_norms(gm)
        scalar_rdiv_as_eager(gm)
        cpu_scalar_opmath(gm)   # after it: a reciprocal's product is one of its products

        def inner(*args: Any, **kwargs: Any) -> Any:
            # Lowering runs here: for the forward now, for a backward when first needed.
            if PROVE_MATH:
                prove_graph(args[0])
            with eager_lowerings():
                return compile_fx_inner(*args, **kwargs)

        with _no_aot_cache():
            return compile_fx(gm, example_inputs, inner_compile=inner, config_patches=patches,
                              decompositions=exact_decompositions())

    return compile_exact


#: A `torch.compile` backend: inductor with eager's bits (the module doc says how).
#: `torch.compile(model, backend=kernelize.exact.backend, mode=...)`, or
#: `backend="kernelize_exact"` once `kernelize.exact` is imported.
backend = make_backend()
backend.__name__ = "kernelize_exact"


@contextlib.contextmanager
def _no_aot_cache() -> Iterator[None]:
    from torch._functorch import config as fc
    if hasattr(fc, "enable_autograd_cache"):
        with fc.patch(enable_autograd_cache=False):
            yield
    else:  # pragma: no cover - older torch
        yield


def _register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "kernelize_exact" not in _BACKENDS:
        register_backend(compiler_fn=backend, name="kernelize_exact")


_register()


# ---- entry points -------------------------------------------------------------------------

@dataclass
class CompileState:
    """What `exact_compile` did to a model: `mode`, or why it left the model eager."""
    compiled: bool
    mode: str | None
    reason: str | None = None
    regions: int = 0     # blocks compiled one by one (0: the whole model)
    #: what exact_compile set on the model besides compiling it (undone by `uncompile`)
    notes: list[str] = field(default_factory=list)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False, compare=False)

    def __str__(self) -> str:
        if self.compiled:
            where = f"{self.regions} blocks compiled one by one" if self.regions else "the whole model"
            text = f"exact compile: inductor with eager's bits, mode {self.mode or 'default'}, {where}"
            return "; ".join([text, *self.notes])
        return f"exact compile: not compiled ({self.reason}); the model runs eagerly"


def unavailable(device: torch.device | None) -> str | None:
    """Why torch.compile cannot run here, or None."""
    try:
        import torch._dynamo
        if hasattr(torch._dynamo, "is_dynamo_supported") and not torch._dynamo.is_dynamo_supported():
            return "torch.compile is not supported on this Python or platform"
    except Exception as e:  # pragma: no cover - a broken install
        return f"torch._dynamo does not import: {e}"
    if device is not None and device.type == "cpu":
        from torch._inductor import config as ic
        cxx = getattr(getattr(ic, "cpp", None), "cxx", ())
        names = [c for c in (cxx if isinstance(cxx, tuple) else (cxx,)) if c]
        if not any(shutil.which(c) for c in (*names, "g++", "c++")):
            return "inductor needs a C++ compiler on the CPU and none was found"
    return None


def _module_device(model: torch.nn.Module) -> torch.device | None:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return None


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of the model's repeated stacks: the members of every `nn.ModuleList` of at
    least two modules of one class (a transformer's decoder layers), outermost lists only."""
    found: list[torch.nn.Module] = []
    skip: set[int] = set()
    for _, m in model.named_modules():
        if id(m) in skip:
            continue
        if isinstance(m, torch.nn.ModuleList) and len(m) >= 2 and len({type(b) for b in m}) == 1:
            found.extend(m)
            skip.update(id(x) for b in m for x in b.modules())
    return found


def exact_compile(model: torch.nn.Module, mode: str | None = None, *, dynamic: bool | None = None,
                  fullgraph: bool = False, regional: bool | None = None) -> CompileState:
    """Compile `model` in place with the exact backend (`nn.Module.compile`: the module keeps its
    type, parameters and state_dict keys).

    `regional=True`: each block of the model's repeated stack (`blocks(model)`) is compiled on
    its own, as PyTorch recommends for large models, and the model's own code around them
    (embeddings, attention masks, rotary tables, final norm, head) runs eagerly.
    `regional=False` (the default) compiles the whole model; where transformers' mask builders
    decide from tensor values whether a mask is needed, that decision runs eagerly inside it
    (`_traced_branches`: traced, transformers builds a mask where eager passes none,
    docs/compile.md). The whole model in both modes: with a KV cache, one compilation does not
    serve every block anyway (each block's cache index is a constant to dynamo, so a model of 22
    blocks is compiled 22 times and each call looks its block's compilation up among 22), and
    the whole model is one graph per step: a 1B Llama's decode step took 14.2 ms whole against
    23.9 ms regional in default mode (H200, docs/gpu-runs/2026-11-27-s16) and, under
    "reduce-overhead", 3.2-3.8 against 6.8 ms (H100, bench/COMPILE.md). Both are exact wherever
    measured (docs/compile.md).

    `mode`: None/"default" or "reduce-overhead" (CUDA graphs). Where torch.compile cannot run
    (`unavailable`), the model is left eager and the state says why."""
    _config_patches(mode, None, dynamic)   # refuses max-autotune before anything is changed
    why = unavailable(_module_device(model))
    if why is not None:
        state = CompileState(False, mode, why)
        model.__dict__[_STATE] = state
        return state
    regions = blocks(model) if regional else []
    if regional and not regions:
        raise ValueError("regional=True: the model has no repeated stack of blocks "
                         "(an nn.ModuleList of two or more modules of one class)")
    state = CompileState(True, mode, regions=len(regions))
    for m in regions or [model]:
        m.compile(backend=backend, mode=mode, dynamic=dynamic, fullgraph=fullgraph)
        m._compiled_call_impl = _with_eager_branches(
            m._compiled_call_impl, None if regions else model,
            ready_cache=mode == "reduce-overhead")
        m.__dict__[_STATE] = state
    note = hold_generate_compile(model)
    if note:
        state.notes.append(note)
        state._undo.append(lambda: release_generate_compile(model))
    if mode == "reduce-overhead":
        _cuda_graph_steps(model, state, hooks=bool(regions))
    model.__dict__[_STATE] = state
    return state


# Library code that takes another path while it is being compiled computes other bits even
# where every op is exact. Two places in transformers do, and exact-compiled code is kept on
# eager's path in both, only while it runs (dynamo guards on the functions it reads, so a plain
# torch.compile of the same code, which reads the originals, gets a compilation of its own):
#
# - its SDPA attention, at a decode step with a grouped KV cache and a mask (its static cache
#   always has one): eagerly it folds the query heads that share a KV head into one attention
#   call (`pack_gqa`), compiled it repeats the keys and values per head (`repeat_kv`), and the
#   attention kernel then reduces the scores in another order. That module is told it is not
#   being compiled (`_EAGER_BRANCHES`).
# - its attention masks (the whole model compiled): eagerly the mask builder decides from the
#   values of the padding mask and of the static cache's position whether it can pass no mask
#   (SDPA's `is_causal`); traced it cannot read them, never skips, and builds an explicit mask,
#   and the attention kernel for a mask reduces in another order. Only those decisions are kept
#   eager (`_traced_branches`: the functions of transformers' masking module that ask whether
#   they are traced); the masks themselves are built in the compiled graph. A decision called
#   with a tensor (a padding mask, position ids, a static cache's offset) runs eagerly, with a
#   graph break around it where it is called; one called with none (no padding mask, no cache)
#   cannot read tensor values, so it is traced, with the masking module's trace checks
#   answering as eager's (`_eager_decision`), and dynamo guards on the Python values it read: no
#   graph break for it. A decode step into a static cache calls none of them (transformers never
#   skips the mask there), so the whole step is one graph, one CUDA graph under
#   reduce-overhead. Compiled block by block the masks are built outside the blocks.
_EAGER_BRANCHES = ("transformers.integrations.sdpa_attention",)
_branch_depth = [0]
_branch_saved: list[tuple[Any, str, Any]] = []
_DECISIONS: dict[int, Callable] = {}   # one wrapper per function (a stable guard)


def _not_compiling() -> bool:
    return False


#: Names whose call tells a function that it is being traced (transformers' utils).
_TRACE_CHECKS = frozenset({"is_tracing", "is_torchdynamo_compiling", "is_torchdynamo_exporting"})


def _traced_branches(model: torch.nn.Module) -> list[tuple[Any, str, Callable]]:
    """(module, name, eager wrapper) for each function of transformers' masking module that takes
    another branch when it is traced (its code calls one of `_TRACE_CHECKS`), in that module and
    in the modules defining `model`'s classes that import it by name. Inside an exact-compiled
    model each runs eagerly, so it decides as eager decides."""
    import inspect
    mu = sys.modules.get("transformers.masking_utils")
    if mu is None:
        return []
    # a function's own code, not a decorator's (transformers' deprecation wrapper asks too)
    branching = {id(f) for f in vars(mu).values() if inspect.isfunction(f)
                 and f.__module__ == mu.__name__
                 and _TRACE_CHECKS & set(inspect.unwrap(f).__code__.co_names)}
    found = []
    mods = {mu} | {sys.modules.get(type(m).__module__) for m in model.modules()}
    for mod in mods:
        for name, fn in list(vars(mod).items()) if mod is not None else ():
            if id(fn) in branching:
                if id(fn) not in _DECISIONS:
                    _DECISIONS[id(fn)] = _eager_decision(fn)
                found.append((mod, name, _DECISIONS[id(fn)]))
    # its trace checks answer as eager's while the model runs (for the decisions it traces)
    found += [(mu, name, _not_tracing) for name in sorted(_TRACE_CHECKS) if hasattr(mu, name)]
    return found


def _not_tracing(*_: Any, **__: Any) -> bool:
    return False


def _eager_decision(fn: Callable) -> Callable:
    """`fn` (a masking function that branches on being traced) deciding as eager decides: run
    eagerly behind a graph break when an argument is a tensor (its values may decide), traced
    when none is (it reads Python values only; the masking module's trace checks answer as
    eager's meanwhile, `_traced_branches`). The packed-sequence decision answers "not packed"
    without reading its tensor where the call was found to have consecutive positions before the
    compiled code ran (`_CONSECUTIVE`)."""
    import functools
    import inspect
    eager = torch.compiler.disable(fn)
    packed = fn.__name__ == _PACKED
    names = list(inspect.signature(fn).parameters)
    # the skip decision's padding mask and query offset, by position (found here: `inspect` is
    # not traced inside the compiled code)
    at = ((names.index("padding_mask"), names.index("q_offset"))
          if fn.__name__ == _SKIP and {"padding_mask", "q_offset"} <= set(names) else None)

    @functools.wraps(fn)
    def decide(*args: Any, **kwargs: Any) -> Any:
        if packed and _CONSECUTIVE[0]:
            return None   # eager's answer for consecutive positions (dynamo guards on the flag)
        if at is not None and _EMPTY_CACHE[0]:
            # the static cache's offset, a tensor, is known to be 0 (read before the compiled
            # code), and the padding mask, where there is one, is the prompt's all-ones mask
            # padded with False to the cache's length: decide on the values eager reads, traced
            a, kw = list(args), dict(kwargs)
            pad = a[at[0]] if len(a) > at[0] else kw.get("padding_mask")
            if isinstance(pad, torch.Tensor) and _EMPTY_CACHE[0] == _ONES:
                # eager's answer for that mask is its answer for none (q_offset == 0): no padding
                if len(a) > at[0]:
                    a[at[0]] = None
                else:
                    kw["padding_mask"] = None
                pad = None
            if pad is None:
                if len(a) > at[1]:
                    a[at[1]] = 0 if isinstance(a[at[1]], torch.Tensor) else a[at[1]]
                elif isinstance(kw.get("q_offset"), torch.Tensor):
                    kw["q_offset"] = 0
                if not any(isinstance(v, torch.Tensor) for v in (*a, *kw.values())):
                    return fn(*a, **kw)
        if any(isinstance(v, torch.Tensor) for v in (*args, *kwargs.values())):
            return eager(*args, **kwargs)
        return fn(*args, **kwargs)

    return decide


# The mask-skip decision of a prefill into a static cache: transformers' `_ignore_causal_mask_sdpa`
# gets the cache's offset as a tensor (so that compiled decoding does not break on it) and,
# eagerly, passes no mask when it is 0 and there is no padding mask (SDPA's `is_causal`). Inside
# an exact-compiled model that read was a graph break in every prefill into a cache made ready
# before the call (reduce-overhead), or reused. Where the call is a prefill (more than one new
# token), without a padding mask, into a static cache that holds no token yet, `_with_eager_branches`
# reads the cache's length once before the compiled code runs (`_EMPTY_CACHE`), and the decision
# is traced with the offset's value 0. With the prompt's all-ones attention mask (what
# `generate()` passes), read there too, the padding mask transformers builds is that mask padded
# with False to the cache's length, for which eager answers as for none (`q_offset == 0`, every
# prompt position kept, every later one empty); the decision is traced without it. A cache that
# holds tokens (a chunked prefill), or a mask with a zero, keeps the eager decision inside.
_SKIP = "_ignore_causal_mask_sdpa"
_EMPTY_CACHE: list[Any] = [False]   # False, True (no attention mask) or _ONES
_ONES = "ones"   # the attention mask is the prompt's, all ones (generate() passes one)


def _empty_static_cache(cache: Any, args: tuple, kwargs: dict) -> Any:
    """Is this call a prefill into a static KV cache holding no token, without an attention
    mask (True) or with the prompt's all-ones one (`_ONES`)? False otherwise. (One read of the
    cache's length, and of the mask where there is one: device reads, before any of the call's
    GPU work.)"""
    if cache is None:
        return False
    inner = _attention_cache(cache)
    if not getattr(inner, "is_compileable", False):
        return False   # a dynamic cache: its offset is a Python int, traced already
    ids = _new_tokens(args, kwargs)
    if not isinstance(ids, torch.Tensor) or ids.dim() < 2 or ids.shape[1] <= 1:
        return False   # a decode step: transformers asks nothing of the offset there
    mask = kwargs.get("attention_mask")
    if mask is not None and not (isinstance(mask, torch.Tensor) and mask.dim() == 2
                                 and mask.shape == ids.shape[:2]):
        return False   # a mask of another shape (4D, or longer than the prompt): eager decides
    try:
        if int(inner.get_seq_length()) != 0:
            return False
    except Exception:  # noqa: BLE001 - a cache of another kind: keep the eager decision
        return False
    if mask is None:
        return True
    with torch.no_grad():
        return _ONES if bool(mask.bool().all()) else False


# The packed-sequence decision: transformers' masking module calls `find_packed_sequence_indices`
# for a forward with position ids and neither a padding mask nor a KV cache (`use_cache=False`:
# scoring, evaluation, a prefill without a cache). Eagerly it reads the ids (a device sync) and
# passes no mask when every row's positions are consecutive. Inside an exact-compiled model that
# read is a graph break, with eager code and a sync between two graphs (a 1x512 prefill of a 1B
# Llama was host-bound at 0.70x of plain compile, bench/COMPILE.md session 17). Where the call's
# positions are known to be consecutive before the compiled code runs, the decision is made then
# and traced as a constant (`_CONSECUTIVE`, set for the call by `_with_eager_branches`):
# - ids the caller passes are read there by the same eager function, once, before any of the
#   call's GPU work is queued;
# - ids the model derives itself (none passed) are `arange(past, past + length)` for the
#   architectures below (python/tests/test_exact_compile.py checks each against explicit ids);
#   another architecture keeps the eager decision inside.
_PACKED = "find_packed_sequence_indices"
_CONSECUTIVE = [False]
_DERIVES_CONSECUTIVE_POSITIONS = frozenset({"llama", "qwen2", "mistral", "gemma", "gemma2", "gpt2"})
_FORWARD_SIGNATURES: dict[type, Any] = {}
_NOT_ASKED = ("attention_mask", "past_key_values", "cache")   # with one, transformers asks nothing


def _positions_consecutive(whole: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
    """Does this call of `whole`, if it asks the packed-sequence decision at all, ask it of
    consecutive positions? False when unsure (the decision then runs eagerly inside)."""
    import inspect
    if any(kwargs.get(k) is not None for k in _NOT_ASKED):
        return False   # the decision is not asked (a mask or a cache): the decode steps' path
    mu = sys.modules.get("transformers.masking_utils")
    if mu is None or not hasattr(mu, _PACKED):
        return False
    cls = type(whole)
    if cls not in _FORWARD_SIGNATURES:
        try:
            _FORWARD_SIGNATURES[cls] = inspect.signature(whole.forward)
        except (TypeError, ValueError):
            _FORWARD_SIGNATURES[cls] = None
    sig = _FORWARD_SIGNATURES[cls]
    if sig is None:
        return False
    try:
        given = sig.bind_partial(*args, **kwargs).arguments
    except TypeError:
        return False
    if any(given.get(k) is not None for k in _NOT_ASKED):
        return False   # passed by position
    pos = given.get("position_ids")
    if pos is None:
        return getattr(getattr(whole, "config", None), "model_type", None) in _DERIVES_CONSECUTIVE_POSITIONS
    if not isinstance(pos, torch.Tensor) or pos.dim() != 2:
        return False
    with torch.no_grad():
        return getattr(mu, _PACKED)(pos) is None   # eager's own decision (reads the ids)


def _with_eager_branches(compiled: Callable, whole: torch.nn.Module | None = None,
                         ready_cache: bool = False) -> Callable:
    """`compiled` (a module's compiled call) run on eager's paths (above); `whole`: the whole
    model compiled, whose masks' decisions run eagerly, and with `ready_cache` (CUDA graphs) whose KV
    cache is made ready here, before the compiled code runs (`_static_cache_ready`)."""
    import functools
    found: list[list[tuple[Any, str, Callable]]] = []   # the patches, found on the first call

    def patches() -> list[tuple[Any, str, Callable]]:
        if not found:
            todo = _traced_branches(whole) if whole is not None else []
            for name in _EAGER_BRANCHES:
                mod = sys.modules.get(name)
                if mod is not None and hasattr(mod, "is_torchdynamo_compiling"):
                    todo.append((mod, "is_torchdynamo_compiling", _not_compiling))
            found.append(todo)
        return found[0]

    @functools.wraps(compiled)
    def call(*args: Any, **kwargs: Any) -> Any:
        if ready_cache and whole is not None:
            cache = _kv_cache(kwargs)
            if cache is not None:
                _static_cache_ready(whole, cache, args, kwargs)
        with _LOCK:
            if _branch_depth[0] == 0:
                _CONSECUTIVE[0] = whole is not None and _positions_consecutive(whole, args, kwargs)
                _EMPTY_CACHE[0] = whole is not None and _empty_static_cache(_kv_cache(kwargs), args, kwargs)
                for mod, name, val in patches():
                    _branch_saved.append((mod, name, getattr(mod, name)))
                    setattr(mod, name, val)
            _branch_depth[0] += 1
        try:
            return compiled(*args, **kwargs)
        finally:
            with _LOCK:
                _branch_depth[0] -= 1
                if _branch_depth[0] == 0:
                    _CONSECUTIVE[0] = _EMPTY_CACHE[0] = False
                    while _branch_saved:
                        mod, name, val = _branch_saved.pop()
                        setattr(mod, name, val)

    return call


_GENERATE_COMPILE = "_kernelize_generate_compile"


def hold_generate_compile(model: torch.nn.Module) -> str | None:
    """transformers' `generate` compiles the model's whole forward with plain inductor when it
    decodes into a static cache (its "auto-compile"); that compilation would wrap kernelize's
    layers and exact compile's blocks and give the model inductor's numbers again. Turn it off
    (undone by `release_generate_compile`); a note saying so, or None where there was none."""
    gc = getattr(model, "generation_config", None)
    if gc is None or not hasattr(gc, "disable_compile") or gc.disable_compile:
        return None
    gc.disable_compile = True
    model.__dict__[_GENERATE_COMPILE] = gc
    return "transformers' own torch.compile in generate() turned off (it changes eager's bits)"


def release_generate_compile(model: torch.nn.Module) -> None:
    gc = model.__dict__.pop(_GENERATE_COMPILE, None)
    if gc is not None:
        gc.disable_compile = False


def _cuda_graph_steps(model: torch.nn.Module, state: CompileState, hooks: bool) -> None:
    """Make CUDA graphs work as a user calls the model; `hooks` (compiled block by block): one
    forward is one step. (The whole model compiled is one step by itself, and its KV cache is
    made ready by its compiled call's wrapper, `_with_eager_branches`.)

    - CUDA-graph trees start a new "generation" at every entry into compiled code, and a new
      generation may reuse the memory of the previous one's outputs; compiled block by block,
      block k+1 would overwrite block k's output while it is still in use. A forward therefore
      begins one step (`torch.compiler.cudagraph_mark_step_begin()`), and afterwards the trees'
      own rule is restored where the user had not been marking steps.
    - transformers' static KV cache allocates its tensors on first use, which would then happen
      inside a captured block (its outputs, overwritten by the next step): the forward gives an
      uninitialised static cache its tensors first, eagerly (transformers' `early_initialization`).
    - A dynamic KV cache grows by concatenation inside the blocks, so it cannot live in CUDA-graph
      memory: passing one is refused with what to do instead, and `generate()` is set to use a
      static cache (transformers' recipe for CUDA graphs) unless the model names another."""
    owned: list[bool] = []   # per forward in progress: whether it began the trees' step count

    def before(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        cache = _kv_cache(kwargs)
        if cache is not None:
            _static_cache_ready(module, cache, args, kwargs)
        owned.append(_begin_step())

    def after(module: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        if owned and owned.pop():
            _end_step()

    if hooks:
        handles = [model.register_forward_pre_hook(before, with_kwargs=True),
                   model.register_forward_hook(after, with_kwargs=True, always_call=True)]
        state._undo.append(lambda: [h.remove() for h in handles])
    gc = getattr(model, "generation_config", None)
    if gc is not None and hasattr(gc, "cache_implementation") and gc.cache_implementation is None:
        gc.cache_implementation = "static"
        state._undo.append(lambda: setattr(gc, "cache_implementation", None))
        state.notes.append("generate() decodes into a static KV cache (CUDA graphs need one)")


_STEP = [0]   # the last step number handed out (negative, as CUDA-graph trees count marks)


def _begin_step() -> bool:
    """Begin a CUDA-graph step; whether this began the step count (`_end_step` then restores
    the trees' own rule: a compiled call, a step)."""
    from torch._inductor import cudagraph_trees as cgt
    box = getattr(cgt, "MarkStepBox", None)
    if box is None or box.mark_step_counter != 0:   # the user marks steps (or a torch without
        torch.compiler.cudagraph_mark_step_begin()  # the counter): mark one more
        return False
    _STEP[0] -= 1   # a number no step has had, so the trees see a new generation
    box.mark_step_counter = _STEP[0]
    return True


def _end_step() -> None:
    from torch._inductor import cudagraph_trees as cgt
    cgt.MarkStepBox.mark_step_counter = 0


def _kv_cache(kwargs: dict) -> Any:
    """The KV cache a forward was given (`cache=` from transformers 5.24, `past_key_values=`)."""
    return kwargs.get("past_key_values", kwargs.get("cache"))


def _attention_cache(cache: Any) -> Any:
    """The self-attention part of a KV cache (an encoder-decoder's holds two)."""
    return getattr(cache, "self_attention_cache", cache)


def _new_tokens(args: tuple, kwargs: dict) -> Any:
    """A forward's new tokens: `input_ids` (keyword or first argument), else `inputs_embeds`."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    return kwargs.get("inputs_embeds") if ids is None else ids


def _static_cache_ready(model: torch.nn.Module, cache: Any, args: tuple, kwargs: dict) -> None:
    """Refuse a KV cache that cannot live in CUDA-graph memory; initialise a static one."""
    inner = _attention_cache(cache)
    kind = type(inner).__name__
    if kind == "DynamicCache" or not getattr(inner, "is_compileable", True):
        raise ValueError(
            f"exact compile with mode='reduce-overhead' (CUDA graphs) needs a static KV cache, and "
            f"this call passed a {kind}: its tensors grow every step, so they cannot be kept in "
            "CUDA-graph memory. Pass past_key_values=transformers.StaticCache(config=model.config, "
            "max_cache_len=N), call generate(..., cache_implementation='static'), or compile with "
            "mode=None")
    ids = _new_tokens(args, kwargs)
    if ids is not None:
        init_static_cache(model, inner, ids.shape[0])
    # else transformers initialises it on first use (inside the first captured block)


def init_static_cache(model: torch.nn.Module, cache: Any, batch: int) -> None:
    """Give transformers' static KV cache `cache` its tensors now, for `batch` sequences of
    `model` (transformers' `early_initialization`), where it has not got them yet: otherwise it
    allocates them on first use, inside whatever compiled code runs first."""
    layers = getattr(cache, "layers", None) or ()
    if not hasattr(cache, "early_initialization") or all(
            getattr(layer, "is_initialized", True) for layer in layers):
        return
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    if param is None:
        return
    shape = model._get_static_cache_init_shape() if hasattr(
        model, "_get_static_cache_init_shape") else None
    if shape is None:
        cfg = model.config.get_text_config(decoder=True) if hasattr(
            model.config, "get_text_config") else model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        shape = heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache.early_initialization(batch_size=batch, num_heads=shape[0], head_dim=shape[1],
                               dtype=param.dtype, device=param.device)


def uncompile(model: torch.nn.Module) -> bool:
    """Undo `exact_compile` on `model` (and its blocks); whether there was anything to undo."""
    state = model.__dict__.pop(_STATE, None)
    if state is None:
        return False
    for undo in reversed(state._undo):
        undo()
    state._undo.clear()
    for m in model.modules():
        if m.__dict__.pop(_STATE, None) is not None or m is model:
            m._compiled_call_impl = None
    return True


def compile_state(model: torch.nn.Module) -> CompileState | None:
    """What `exact_compile` (or `kernelize(..., compile=...)`) did to `model`, if anything."""
    return model.__dict__.get(_STATE)
