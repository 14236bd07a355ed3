"""Finding the layers a hub kernel can replace, and which eager function each computes.

Recognition is by class (nn.RMSNorm, nn.LayerNorm, nn.SiLU, nn.GELU, HF classes) and is then
confirmed by a probe: the layer's own forward runs on a small bf16 input on the CPU (on a
copy, with random weights) and must equal, bit for bit, the eager formula of exactly one
semantics of docs/spec.md section 2. A layer that matches none is left alone, with the reason.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

TORCH_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
#: The other way: "bf16" -> torch.bfloat16.
DTYPE_OF_NAME = {v: k for k, v in TORCH_DTYPES.items()}


@dataclass
class Site:
    """A layer that a kernel could replace."""
    path: str
    module: nn.Module
    op: str                # rms_norm | layer_norm | silu | silu_mul | gelu_tanh_mul | silu_and_mul | gelu | gelu_tanh
    semantics: str         # llama | gemma | torch | default
    cols: int              # row length; for elementwise ops the feature size (n is checked per call)
    dtype: str | None      # bf16 | f16 | f32, from the layer's (or its model's) parameters
    eps: float | None = None
    how: str = ""          # how it was recognised
    # Other ways to replace the same computation, tried in order when no kernel of `op`
    # qualifies: a gated SiLU MLP as one `silu_and_mul` (gate and up concatenated), a gated
    # tanh-GELU MLP's `act_fn` as a `gelu_tanh` site.
    alternatives: list["Site"] = field(default_factory=list)


@dataclass
class Skip:
    path: str
    cls: str
    reason: str


@dataclass
class Discovery:
    sites: list[Site] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)


def _cls(m: nn.Module) -> str:
    return type(m).__name__


def _probe_input(rows: int, cols: int, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 2.0
    x[0, : min(cols, 4)] = torch.tensor([0.0, -0.0, 1e-3, -30.0])[: min(cols, 4)]
    return x.to(dtype)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of elements whose bits differ (NaN == NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return a.numel() or 1
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return int((a.contiguous().view(view) != b.contiguous().view(view)).sum())


# ---- RMSNorm semantics -------------------------------------------------------------------

def _normed(x: torch.Tensor, eps: float) -> torch.Tensor:
    """`h * rsqrt(mean(h^2) + eps)` with h = f32(x), in f32: the llama and gemma formulas' first part."""
    h = x.float()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


#: Each RMSNorm semantics as its layer computes it (HF LlamaRMSNorm; GemmaRMSNorm, Gemma2's and
#: Gemma3's: all in f32, `(1 + w)`, one rounding at the end; F.rms_norm), differentiable: the one
#: home of the formulas discovery checks layers against and training mode's fallbacks recompute.
RMS_FORMULAS: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "llama": lambda x, w, eps: w * _normed(x, eps).to(x.dtype),
    "gemma": lambda x, w, eps: (_normed(x, eps) * (1.0 + w.float())).to(x.dtype),
    "torch": lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
}


def _rms_refs(x: torch.Tensor, w: torch.Tensor, eps: float) -> dict[str, torch.Tensor]:
    return {sem: f(x, w, eps) for sem, f in RMS_FORMULAS.items()}


def _rms_eps(m: nn.Module) -> float | None:
    for a in ("variance_epsilon", "eps", "epsilon"):
        v = getattr(m, a, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def _is_rmsnorm_like(m: nn.Module) -> bool:
    return isinstance(m, getattr(nn, "RMSNorm", ())) or "rmsnorm" in _cls(m).lower()


def classify_rmsnorm(m: nn.Module) -> tuple[str | None, float | None, str]:
    """(semantics, eps, note): the semantics whose formula the layer's forward reproduces
    bit for bit on a bf16 probe with random weights; None with the reason otherwise."""
    w = getattr(m, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1:
        return None, None, "no 1-D weight (an RMSNorm without a learned weight is not replaced)"
    if isinstance(m, getattr(nn, "RMSNorm", ())) and m.eps is None:
        eps = None  # F.rms_norm: eps of the compute (opmath) type, f32 for bf16/f16/f32
    else:
        eps = _rms_eps(m)
        if eps is None:
            return None, None, "no eps attribute (variance_epsilon / eps) found"
    cols = w.shape[0]
    if w.device.type == "meta":
        return None, eps, "weights on the meta device; cannot probe"
    probe = copy.deepcopy(m).to(device="cpu", dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        probe.weight.copy_((1.0 + 0.2 * torch.randn(cols, generator=g)).to(torch.bfloat16))
        x = _probe_input(8, cols)
        try:
            y = probe(x)
        except Exception as e:  # noqa: BLE001 - any failure means: do not touch it
            return None, eps, f"probe forward failed: {e}"
        e = torch.finfo(torch.float32).eps if eps is None else eps
        refs = _rms_refs(x, probe.weight, e)
    diffs = {s: _bits_equal(y, r) for s, r in refs.items()}
    exact = [s for s, d in diffs.items() if d == 0]
    if len(exact) == 1:
        return exact[0], eps, f"probe: bit-exact with the {exact[0]} formula"
    if len(exact) > 1:
        return None, eps, f"probe cannot tell {exact} apart"
    best = min(diffs, key=diffs.get)
    return None, eps, (f"computes none of the known RMSNorm semantics (closest: {best}, "
                       f"{diffs[best]} of {y.numel()} probe elements differ)")


# ---- activations -------------------------------------------------------------------------

_ACT_REFS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def classify_activation(m: nn.Module) -> tuple[str | None, str]:
    """Which of silu / gelu / gelu_tanh the parameterless layer computes, bit for bit."""
    name = _cls(m).lower()
    if isinstance(m, nn.SiLU) or "silu" in name or "swish" in name:
        cands = ["silu"]
    elif isinstance(m, nn.GELU):
        cands = ["gelu_tanh" if m.approximate == "tanh" else "gelu"]
    elif "gelu" in name:
        cands = ["gelu", "gelu_tanh"]
    else:
        return None, "not an activation"
    if any(True for _ in m.parameters()):
        return None, "has parameters"
    probe = copy.deepcopy(m).cpu()
    diffs = {}
    with torch.no_grad():
        for op in cands:
            d = 0
            for dt in (torch.bfloat16, torch.float32):
                x = _probe_input(4, 256, dt, seed=2)
                x[1, :8] = torch.tensor([-100.0, -20, -8, -1e-20, 1e-20, 8, 20, 100]).to(dt)
                try:
                    d += _bits_equal(probe(x), _ACT_REFS[op](x))
                except Exception as e:  # noqa: BLE001
                    return None, f"probe forward failed: {e}"
            diffs[op] = d
    exact = [op for op, d in diffs.items() if d == 0]
    if exact:
        return exact[0], f"probe: bit-exact with {'F.silu' if exact[0] == 'silu' else 'F.gelu' + ('(approximate=tanh)' if exact[0] == 'gelu_tanh' else '')}"
    best = min(diffs, key=diffs.get)
    return None, (f"computes its own formula, not eager {best} "
                  f"({diffs[best]} of 2048 probe elements differ)")


# The gated MLP ops, by the activation of the gate (docs/spec.md section 2): HF LlamaMLP, Qwen2MLP,
# MistralMLP (SiLU) and GemmaMLP, Gemma2MLP, Gemma3MLP (gelu_pytorch_tanh).
GATED_OPS = {"silu": "silu_mul", "gelu_tanh": "gelu_tanh_mul"}


def gated_mlp_activation(m: nn.Module) -> tuple[str | None, str]:
    """(activation, note) of a gated MLP module: down_proj(act_fn(gate_proj(x)) * up_proj(x))
    with act_fn computing eager F.silu or F.gelu(approximate="tanh") (the activation: "silu" or
    "gelu_tanh"), confirmed by running its forward against that decomposition on a probe;
    (None, why) otherwise ("" when the module has no gated-MLP shape at all)."""
    parts = [getattr(m, a, None) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")]
    if not all(isinstance(p, nn.Module) for p in parts):
        return None, ""
    gate, up, down, act = parts
    if not (isinstance(gate, nn.Linear) and isinstance(up, nn.Linear) and isinstance(down, nn.Linear)):
        return None, ""
    if gate.out_features != up.out_features:
        return None, "gate_proj and up_proj differ in size"
    op, why = classify_activation(act)
    if op not in GATED_OPS:
        return None, f"act_fn is neither SiLU nor tanh GELU ({op or why})"
    w = gate.weight
    if w.device.type == "meta":
        return None, "weights on the meta device; cannot probe"
    ref_act = _ACT_REFS[op]
    with torch.no_grad():
        x = _probe_input(2, gate.in_features, w.dtype, seed=3).to(w.device)
        try:
            y = m(x)
        except Exception as e:  # noqa: BLE001
            return None, f"probe forward failed: {e}"
        ref = down(ref_act(gate(x)) * up(x))
    formula = "silu" if op == "silu" else "gelu_tanh"
    if _bits_equal(y, ref):
        return None, f"forward is not down_proj({formula}(gate_proj(x)) * up_proj(x))"
    return op, f"gated MLP: probe: forward == down_proj({formula}(gate_proj(x)) * up_proj(x))"


def _dtype_of(*tensors) -> str | None:
    for t in tensors:
        if isinstance(t, torch.Tensor):
            return TORCH_DTYPES.get(t.dtype)
    return None


def discover(model: nn.Module, dtype: str | None = None, *,
             fuse_gated_mlp: bool = True) -> Discovery:
    """Every replaceable layer of `model`, and every candidate layer left alone (with why).

    A gated MLP is one site that covers its `act_fn`, with the two-input op of its activation:
    `silu_mul` (LlamaMLP-like: SiLU), `gelu_tanh_mul` (GemmaMLP-like: tanh GELU); the kernel
    takes `gate_proj(x)` and `up_proj(x)` as they are. When no such kernel qualifies, its
    `alternatives` are tried: for SiLU one `silu_and_mul` (the two concatenated), for tanh GELU
    the `act_fn` alone as a `gelu_tanh` site. With `fuse_gated_mlp=False` the MLP is not a site
    and its `act_fn` is found as a plain `silu` / `gelu_tanh` site instead (the model harness
    measures a lone activation kernel that way)."""
    out = Discovery()
    model_dtype = dtype or _dtype_of(*(p for p in model.parameters() if p.is_floating_point()))
    covered: set[int] = set()  # act_fn modules covered by their gated MLP
    for path, m in model.named_modules():
        if id(m) in covered:
            continue
        path = path or "<root>"
        act, why = gated_mlp_activation(m) if fuse_gated_mlp else (None, "")
        if act is not None:
            covered.add(id(m.act_fn))
            cols = m.gate_proj.out_features
            dt = dtype or _dtype_of(m.gate_proj.weight)
            site = Site(path, m, GATED_OPS[act], "default", cols, dt, None, why)
            if act == "silu":
                site.alternatives.append(Site(path, m, "silu_and_mul", "default", cols, dt, None,
                                              why.replace("gated MLP:", "gated MLP (gate and up concatenated):")))
            else:
                act_path = f"{path}.act_fn" if path != "<root>" else "act_fn"
                _, note = classify_activation(m.act_fn)
                site.alternatives.append(Site(act_path, m.act_fn, act, "default",
                                              _feature_size(model, act_path), model_dtype, None, note))
            out.sites.append(site)
            continue
        if why and hasattr(m, "act_fn"):
            out.skipped.append(Skip(path, _cls(m), f"gated MLP not fused: {why}"))
        if _is_rmsnorm_like(m):
            sem, eps, note = classify_rmsnorm(m)
            if sem is None:
                out.skipped.append(Skip(path, _cls(m), note))
            else:
                out.sites.append(Site(path, m, "rms_norm", sem, m.weight.shape[0],
                                      dtype or _dtype_of(m.weight), eps, note))
        elif isinstance(m, nn.LayerNorm):
            if len(m.normalized_shape) != 1:
                out.skipped.append(Skip(path, _cls(m), "normalizes over more than the last dim"))
            elif m.weight is None or m.bias is None:
                out.skipped.append(Skip(path, _cls(m), "no affine weight and bias (the kernel ABI takes both)"))
            else:
                out.sites.append(Site(path, m, "layer_norm", "default", m.normalized_shape[0],
                                      dtype or _dtype_of(m.weight), float(m.eps), "nn.LayerNorm"))
        else:
            op, note = classify_activation(m)
            if op is not None:
                cols = _feature_size(model, path)
                out.sites.append(Site(path, m, op, "default", cols, model_dtype, None, note))
            elif note not in ("not an activation",):
                out.skipped.append(Skip(path, _cls(m), note))
    return out


def _feature_size(model: nn.Module, path: str) -> int:
    """A representative element count for resolving an elementwise kernel: the output size
    of the Linear feeding this activation when it can be found, else the model's hidden size.
    The actual element count of every call is checked against the kernel's constraints."""
    parent_path = path.rsplit(".", 1)[0] if "." in path else ""
    parent = model.get_submodule(parent_path) if parent_path else model
    for name in ("gate_proj", "c_fc", "fc1", "dense_h_to_4h", "up_proj", "w1", "fc_in"):
        lin = getattr(parent, name, None)
        if isinstance(lin, nn.Linear):
            return lin.out_features
        if lin is not None and hasattr(lin, "nf"):  # HF Conv1D (GPT-2)
            return int(lin.nf)
    cfg = getattr(model, "config", None)
    for a in ("intermediate_size", "n_inner", "hidden_size", "n_embd"):
        v = getattr(cfg, a, None)
        if isinstance(v, int) and v > 0:
            return v
    return 4096
