"""The field's backward (issue 30) as Python candidates: their signature, and an interim check
against eager autograd until the verifier measures them (docs/backward.md, "The field's backward
as Python candidates").

The hub's backward ops (docs/spec.md section 2c) are verified for CUDA kernels only: the
registry refuses a Python candidate of a backward op, and the verifier's Python path measures one
output of a forward op (what is missing is listed in docs/backward.md). This module holds the
piece that does not wait for that:

* `SIGNATURES`: each backward op's Python signature, `f(*args) -> gradients`, derived from the
  CUDA ABI (docs/spec.md section 2c: the stages' tensors that are not gradients or the
  workspace, in order of first appearance, then `eps` where the op takes it; the gradients in
  `Op::gradients` order). `python/tests/test_backward_field.py` checks it against abi.json.
* `eager_gradients`: the gradients the hub's reference stands for, eager autograd's, on the same
  inputs (rms_norm_backward llama: autograd of HF LlamaRMSNorm's formula; layer_norm_backward:
  eager's own `native_layer_norm_backward` on the given mean and rstd; the gated ops: autograd
  of `act(gate) * up`; the activations: eager's `silu_backward` / `gelu_backward`).
* `check`: one candidate function against them on one problem: per gradient the elements whose
  bits differ and the largest ulp distance, the same bits over three calls, the inputs unchanged,
  the gradients' count, shapes, dtypes and devices. Not a verdict: no reference layer, oracle,
  batch or address cases, integrity of the allocator, speed or model level (those are the
  verifier's); eager autograd on the same GPU is the comparison.

`timings` gives the candidate's median time beside eager's backward and eager's forward +
backward (a caller's time, not the verifier's speed figure). `scripts/backward_field_check.py`
runs `check` (and `timings`) over the backward candidates of kernels/third-party/ on a GPU.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

#: Each backward op's Python signature: (argument names, gradient names).
SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "rms_norm_backward": (("dy", "x", "w", "eps"), ("dx", "dw")),
    "layer_norm_backward": (("dy", "x", "mean", "rstd", "w"), ("dx", "dw", "db")),
    "silu_mul_backward": (("dy", "gate", "up"), ("d_gate", "d_up")),
    "gelu_tanh_mul_backward": (("dy", "gate", "up"), ("d_gate", "d_up")),
    "silu_backward": (("dy", "x"), ("dx",)),
    "gelu_backward": (("dy", "x"), ("dx",)),
    "gelu_tanh_backward": (("dy", "x"), ("dx",)),
}

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def llama_rms_norm(x, w, eps):
    """HF LlamaRMSNorm's forward, op by op (its f32 upcast, mean of squares, rsqrt, the cast
    back before the weight)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


_GATED = {"silu_mul_backward": F.silu,
          "gelu_tanh_mul_backward": lambda g: F.gelu(g, approximate="tanh")}
_ACT_BACKWARD = {
    "silu_backward": lambda dy, x: torch.ops.aten.silu_backward(dy, x),
    "gelu_backward": lambda dy, x: torch.ops.aten.gelu_backward(dy, x, approximate="none"),
    "gelu_tanh_backward": lambda dy, x: torch.ops.aten.gelu_backward(dy, x, approximate="tanh"),
}


def inputs(op: str, dtype: str, rows: int, cols: int, device, seed: int = 0) -> dict[str, Any]:
    """A problem of `op` as keyword arguments of its signature: x (the gate) normal times 3 with
    exp's and tanh's saturations in its first row, dy and up normal, w normal around 1, eps 1e-6;
    layer_norm_backward's mean and rstd as eager's own forward saves them (f32, one a row)."""
    t = DTYPES[dtype]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 3
    special = torch.tensor([0.0, -0.0, 30.0, -30.0, 100.0, -100.0, 1e-3, -1e-3])
    x[0, :min(cols, 8)] = special[:min(cols, 8)]
    out = {"dy": torch.randn(rows, cols, generator=g).to(t).to(device), "x": x.to(t).to(device)}
    if op in _GATED:
        out["gate"] = out.pop("x")
        out["up"] = torch.randn(rows, cols, generator=g).to(t).to(device)
    if op in ("rms_norm_backward", "layer_norm_backward"):
        out["w"] = (1 + 0.2 * torch.randn(cols, generator=g)).to(t).to(device)
    if op == "rms_norm_backward":
        out["eps"] = 1e-6
    if op == "layer_norm_backward":
        b = torch.zeros(cols, dtype=t, device=device)
        _, mean, rstd = torch.native_layer_norm(out["x"], [cols], out["w"], b, 1e-5)
        out["mean"], out["rstd"] = mean.reshape(rows).float(), rstd.reshape(rows).float()
    return {k: out[k] for k in SIGNATURES[op][0]}


def eager_gradients(op: str, semantics: str, args: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """The gradients eager autograd gives for the problem `args` (the hub's reference stands for
    them), in SIGNATURES order."""
    if op == "rms_norm_backward":
        if semantics != "llama":
            raise ValueError(f"rms_norm_backward semantics {semantics}: only llama is checked here")
        with torch.enable_grad():
            x = args["x"].detach().requires_grad_(True)
            w = args["w"].detach().requires_grad_(True)
            return torch.autograd.grad(llama_rms_norm(x, w, args["eps"]), (x, w), args["dy"])
    if op == "layer_norm_backward":
        x, w = args["x"], args["w"]
        rows, cols = x.shape
        mean, rstd = args["mean"].reshape(rows, 1), args["rstd"].reshape(rows, 1)
        if x.device.type == "cpu":   # (on the CPU eager keeps them in x's dtype)
            mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)
        return tuple(torch.ops.aten.native_layer_norm_backward(
            args["dy"], x, [cols], mean, rstd, w, torch.zeros_like(w), [True, True, True]))
    if op in _GATED:
        with torch.enable_grad():
            g = args["gate"].detach().requires_grad_(True)
            u = args["up"].detach().requires_grad_(True)
            return torch.autograd.grad(_GATED[op](g) * u, (g, u), args["dy"])
    return (_ACT_BACKWARD[op](args["dy"], args["x"]),)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance in units in the last place between a's and b's elements (their
    bits as ordered integers; NaN against NaN is 0, NaN against a number the integer range)."""
    it = torch.int32 if a.dtype == torch.float32 else torch.int16
    def ordered(t):
        i = t.contiguous().view(it).to(torch.int64)
        # sign-magnitude to two's complement order: negative floats count down from -0
        sign = i < 0
        return torch.where(sign, -(i & (torch.iinfo(it).max)), i)
    both_nan = torch.isnan(a) & torch.isnan(b)
    d = (ordered(a) - ordered(b)).abs()
    d = torch.where(both_nan, torch.zeros_like(d), d)
    return int(d.max()) if d.numel() else 0


def candidates(folder: str | Path) -> list[str]:
    """The folders of `folder` (kernels/third-party) holding a Python candidate of a backward op
    (one SIGNATURES names), sorted."""
    folder = Path(folder)
    out = []
    for d in sorted(folder.iterdir()):
        if (d / "kernel.toml").is_file():
            m = tomllib.loads((d / "kernel.toml").read_text(encoding="utf-8"))
            if m.get("runtime") == "python" and m.get("op") in SIGNATURES:
                out.append(d.name)
    return out


def load(folder: str | Path) -> tuple[dict[str, Any], Any]:
    """A candidate folder's manifest (kernel.toml as TOML) and its module, loaded from its
    source under a name of its own."""
    folder = Path(folder)
    manifest = tomllib.loads((folder / "kernel.toml").read_text(encoding="utf-8"))
    if manifest.get("runtime") != "python" or manifest.get("op") not in SIGNATURES:
        raise ValueError(f"{folder}: not a Python candidate of a backward op ({manifest.get('op')})")
    name = f"kernelize_backward_candidate_{manifest['name']}"
    spec = importlib.util.spec_from_file_location(name, folder / manifest["source"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # (dynamo finds a compiled function's module by name)
    spec.loader.exec_module(module)
    return manifest, module


#: The incoming gradients of a backward signature (kernel-registry's `Op::incoming_gradients`,
#: the `incoming` of each op in python/tests/fixtures/abi.json, which test_backward_field holds
#: this to): what a candidate's setup function does not get.
INCOMING = ("dy", "dres")


def entry(manifest: dict[str, Any], module: Any, dtype: str) -> Callable:
    """A candidate's function for `dtype` with its op's signature (SIGNATURES): its entry, or,
    where it names a setup (`[setup]`, docs/spec.md section 2b), the setup on the signature's
    arguments less the incoming gradients and then the entry with the setup's state last (what
    the verifier runs, there with the setup outside the timed region; here both are timed)."""
    fn = getattr(module, manifest["entry"][dtype])
    name = manifest.get("setup", {}).get(dtype)
    if name is None:
        return fn
    setup = getattr(module, name)
    keep = [i for i, a in enumerate(SIGNATURES[manifest["op"]][0]) if a not in INCOMING]

    def call(*args):
        return fn(*args, setup(*[args[i] for i in keep]))

    return call


def check(function: Callable, op: str, semantics: str, dtype: str, rows: int, cols: int,
          device, seed: int = 0, calls: int = 3) -> dict[str, Any]:
    """`function` (a candidate's entry, SIGNATURES[op]) against eager autograd on one problem:
    {"ok", "error", "gradients": {name: {"differing", "elements", "max_ulp"}},
    "deterministic", "inputs_changed"}; `ok` means every gradient bit-exact, deterministic,
    inputs unchanged."""
    args = inputs(op, dtype, rows, cols, device, seed)
    pristine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    want = eager_gradients(op, semantics, pristine)
    names = SIGNATURES[op][1]
    out: dict[str, Any] = {"op": op, "dtype": dtype, "rows": rows, "cols": cols, "error": None,
                           "gradients": {}, "deterministic": None, "inputs_changed": []}
    got_calls = []
    for _ in range(calls):
        try:
            got = function(*[args[k] for k in SIGNATURES[op][0]])
        except Exception as e:  # noqa: BLE001 - the candidate's error is the finding
            out["error"] = f"{type(e).__name__}: {e}"
            out["ok"] = False
            return out
        got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        if len(got) != len(names) or not all(
                isinstance(g, torch.Tensor) and g.shape == w.shape and g.dtype == w.dtype
                and g.device == w.device for g, w in zip(got, want)):
            said = [(tuple(g.shape), str(g.dtype), str(g.device)) if isinstance(g, torch.Tensor)
                    else type(g).__name__ for g in got]
            wanted = [(tuple(w.shape), str(w.dtype), str(w.device)) for w in want]
            out["error"] = f"returned {said}, not {wanted} ({', '.join(names)})"
            out["ok"] = False
            return out
        got_calls.append(tuple(g.clone() for g in got))
    if device != "cpu" and torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    out["inputs_changed"] = [k for k, v in args.items() if isinstance(v, torch.Tensor)
                             and not _same_bits(v, pristine[k])]
    first = got_calls[0]
    out["deterministic"] = all(_same_bits(a, b) for c in got_calls[1:] for a, b in zip(c, first))
    for name, g, w in zip(names, first, want):
        differ = int((_bits(g) != _bits(w)).sum())
        out["gradients"][name] = {"differing": differ, "elements": g.numel(),
                                  "max_ulp": ulp_distance(g, w) if differ else 0}
    out["ok"] = (out["deterministic"] and not out["inputs_changed"]
                 and all(v["differing"] == 0 for v in out["gradients"].values()))
    return out


def _forward_of(op: str, semantics: str, args: dict[str, Any]) -> tuple[Callable, tuple]:
    """(the layer's eager forward, the inputs it differentiates) of a problem of a backward op
    whose eager node runs after a forward of its own (not layer_norm_backward: its statistics are
    given)."""
    if op == "rms_norm_backward":
        return (lambda x, w: llama_rms_norm(x, w, args["eps"])), (args["x"], args["w"])
    if op in _GATED:
        return (lambda g, u: _GATED[op](g) * u), (args["gate"], args["up"])
    act = {"silu_backward": F.silu, "gelu_backward": F.gelu,
           "gelu_tanh_backward": lambda x: F.gelu(x, approximate="tanh")}[op]
    return act, (args["x"],)


def eager_timings(op: str, semantics: str, args: dict[str, Any], reps: int, device) -> dict[str, float]:
    """Eager's median times (µs) on the problem: `eager_backward_us`, the backward alone (the
    autograd graph built once, `torch.autograd.grad` with retain_graph; layer_norm_backward:
    `native_layer_norm_backward` on the statistics), and `eager_forward_backward_us`, the forward
    and the backward (what a candidate that runs its own forward, as Liger's RMSNorm, SwiGLU and
    GeGLU and the compiled ones do, replaces)."""
    if op == "layer_norm_backward":
        return {"eager_backward_us": median_us(lambda: eager_gradients(op, semantics, args), reps,
                                               device)}
    out = {}
    fwd, xs = _forward_of(op, semantics, args)
    with torch.enable_grad():
        leaves = tuple(t.detach().requires_grad_(True) for t in xs)
        y = fwd(*leaves)
        out["eager_backward_us"] = median_us(
            lambda: torch.autograd.grad(y, leaves, args["dy"], retain_graph=True), reps, device)

        def both():
            ls = tuple(t.detach().requires_grad_(True) for t in xs)
            return torch.autograd.grad(fwd(*ls), ls, args["dy"])
        out["eager_forward_backward_us"] = median_us(both, reps, device)
    return out


def median_us(fn: Callable, reps: int, device) -> float:
    """The median time of `fn()` in µs over `reps` calls after 2 warm-up calls: CUDA events on a
    GPU, each call after the L2 is flushed (a 2 x L2 buffer zeroed); perf_counter on the CPU."""
    import statistics
    import time
    for _ in range(2):
        fn()
    times = []
    if torch.device(device).type == "cuda":
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        flush = torch.empty(max(2 * l2, 1), dtype=torch.uint8, device=device)
        for _ in range(reps):
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000.0)
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def timings(function: Callable, op: str, semantics: str, dtype: str, rows: int, cols: int,
            device, reps: int = 20, seed: int = 0) -> dict[str, Any]:
    """The candidate's median time on one problem beside eager's (`eager_timings`), in µs: what
    a caller pays (Python and dispatch included), not the verifier's speed figure."""
    args = inputs(op, dtype, rows, cols, device, seed)
    ordered = [args[k] for k in SIGNATURES[op][0]]
    out = {"op": op, "dtype": dtype, "rows": rows, "cols": cols,
           "candidate_us": median_us(lambda: function(*ordered), reps, device)}
    out.update(eager_timings(op, semantics, args, reps, device))
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(_bits(a), _bits(b))


# ---- the model level: a candidate as its layers' autograd backward (docs/backward.md, item 9) ---
#
# A backward candidate's model level is a training step: the layers of a model that compute its
# op's forward keep eager's forward and run the candidate as their backward under autograd, and
# the model trains beside an eager copy (scripts/training_check.py --backward-candidate compares
# the losses, gradients and parameters bit for bit). A third copy whose layers run eager's own
# gradients of the op through the same wrapping (`eager_function`) is the control: what the
# wrapping does to eager's training by itself (in f32 eager sums an RMSNorm's input gradient in
# three terms, which one dx cannot reproduce: docs/backward.md, "What remains", item 1).

#: The forward ops whose layers the model level can wrap (the norms; the gated MLPs,
#: `down_proj(act(gate_proj(x)) * up_proj(x))`, whose product is wrapped; the standalone
#: activation modules, e.g. GPT-2's GELU). Which forward a backward op belongs to is kernelize's
#: `BACKWARD_OF` (`forward_of`).
WRAPPED_FORWARDS = frozenset({"rms_norm", "layer_norm", "silu_mul", "gelu_tanh_mul", "silu", "gelu", "gelu_tanh"})


def forward_of(op: str, semantics: str) -> str:
    """The forward op whose layers a backward `op` of `semantics` differentiates (kernelize's
    `manifest.BACKWARD_OF`, read the other way); ValueError where the model level does not wrap
    it."""
    from kernelize.manifest import BACKWARD_OF
    fwd = next((f for (f, sem), b in BACKWARD_OF.items() if b == op and sem == semantics), None)
    if fwd not in WRAPPED_FORWARDS:
        raise ValueError(f"the model level wraps the layers of {', '.join(sorted(WRAPPED_FORWARDS))}; "
                         f"not those of {op} ({semantics}) yet")
    return fwd


class _RmsNormWithBackward(torch.autograd.Function):
    """The layer's own forward; `function(dy, x, w, eps) -> (dx, dw)` on rows as its backward."""

    @staticmethod
    def forward(ctx, x, w, layer_forward, function, eps):
        ctx.save_for_backward(x, w)
        ctx.function, ctx.eps = function, eps
        return layer_forward(x)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        cols = x.shape[-1]
        dx, dw = ctx.function(dy.reshape(-1, cols).contiguous(), x.reshape(-1, cols).contiguous(),
                              w, ctx.eps)
        return dx.reshape(x.shape), dw, None, None, None


class _LayerNormWithBackward(torch.autograd.Function):
    """nn.LayerNorm's forward as eager runs it (`native_layer_norm`, which gives the mean and
    rstd eager saves); `function(dy, x, mean, rstd, w) -> (dx, dw, db)` on rows as its backward."""

    @staticmethod
    def forward(ctx, x, w, b, function, eps):
        cols = x.shape[-1]
        x2 = x.reshape(-1, cols).contiguous()
        y, mean, rstd = torch.native_layer_norm(x2, [cols], w, b, eps)
        ctx.save_for_backward(x2, w, mean, rstd)
        ctx.function, ctx.shape, ctx.has_bias = function, x.shape, b is not None
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, w, mean, rstd = ctx.saved_tensors
        rows, cols = x2.shape
        dx, dw, db = ctx.function(dy.reshape(rows, cols).contiguous(), x2,
                                  mean.reshape(rows).float(), rstd.reshape(rows).float(), w)
        return dx.reshape(ctx.shape), dw, db if ctx.has_bias else None, None, None


class _GatedWithBackward(torch.autograd.Function):
    """`act(gate) * up` as eager computes it; `function(dy, gate, up) -> (d_gate, d_up)` on rows
    as its backward."""

    @staticmethod
    def forward(ctx, gate, up, act, function):
        ctx.save_for_backward(gate, up)
        ctx.function = function
        return act(gate) * up

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        cols = gate.shape[-1]
        dg, du = ctx.function(dy.reshape(-1, cols).contiguous(), gate.reshape(-1, cols).contiguous(),
                              up.reshape(-1, cols).contiguous())
        return dg.reshape(gate.shape), du.reshape(up.shape), None, None


class _ActWithBackward(torch.autograd.Function):
    """An activation module's own forward; `function(dy, x) -> dx` (or `(dx,)`) on rows as its
    backward."""

    @staticmethod
    def forward(ctx, x, layer_forward, function):
        ctx.save_for_backward(x)
        ctx.function = function
        return layer_forward(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        cols = x.shape[-1]
        dx = ctx.function(dy.reshape(-1, cols).contiguous(), x.reshape(-1, cols).contiguous())
        if isinstance(dx, (tuple, list)):
            (dx,) = dx
        return dx.reshape(x.shape), None, None


def eager_function(op: str, semantics: str) -> Callable:
    """Eager autograd's gradients of `op` (`eager_gradients`) as a function of its signature: the
    control of the model level."""
    names = SIGNATURES[op][0]
    return lambda *args: eager_gradients(op, semantics, dict(zip(names, args)))


def wrap_layers(model: torch.nn.Module, op: str, semantics: str, function: Callable) -> list[str]:
    """Make every layer of `model` that computes the forward of `op` of `semantics` (`forward_of`;
    kernelize's discovery) run eager's forward and `function` (SIGNATURES[op]) as its backward;
    returns the layers' paths (none: nothing of `model` computes it)."""
    from kernelize.discover import discover
    fwd_op = forward_of(op, semantics)
    paths = []
    for s in discover(model).sites:
        if s.op != fwd_op or s.semantics != semantics:
            continue
        m = s.module
        if fwd_op == "rms_norm":
            m.forward = (lambda x, m=m, own=m.forward, eps=s.eps:
                         _RmsNormWithBackward.apply(x, m.weight, own, function, eps))
        elif fwd_op in ("silu_mul", "gelu_tanh_mul"):
            act = _GATED[op]   # the activation eager's act_fn computes (discover probed it)
            m.forward = (lambda x, m=m, act=act: m.down_proj(_GatedWithBackward.apply(
                m.gate_proj(x), m.up_proj(x), act, function)))
        elif fwd_op in ("silu", "gelu", "gelu_tanh"):
            m.forward = lambda x, own=m.forward: _ActWithBackward.apply(x, own, function)
        else:
            m.forward = (lambda x, m=m: _LayerNormWithBackward.apply(x, m.weight, m.bias, function,
                                                                     m.eps))
        paths.append(s.path)
    return paths
