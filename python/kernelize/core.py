"""kernelize(model, ...): replace layers with verified hub kernels; unkernelize(model)."""

from __future__ import annotations

import itertools
import logging
import os
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import launch as L
from . import ops
from .digest import not_applicable
from .discover import TORCH_DTYPES, Discovery, Site, discover
from .sources import DirSource, HubSource, Key, LockSource, Resolution, Resolved, write_lock

log = logging.getLogger("kernelize")

_ORIG = "_kernelize_original_forward"
_LAUNCHES = "_kernelize_launches"  # how many calls of a swapped layer ran the kernel
_NO_INSTANCE_FORWARD = object()


@dataclass
class Entry:
    path: str
    cls: str
    op: str
    semantics: str
    dtype: str | None
    cols: int
    status: str                      # replaced | would replace | kept
    kernel: Resolved | None = None
    reasons: list[str] = field(default_factory=list)
    how: str = ""
    # The width was not verified: the verification queued for it, and whether we waited.
    width_note: str | None = None


@dataclass
class Report:
    source: str
    policy: str
    arch: str | None
    swapped: bool
    entries: list[Entry] = field(default_factory=list)

    @property
    def replaced(self) -> list[Entry]:
        return [e for e in self.entries if e.status in ("replaced", "would replace")]

    @property
    def kept(self) -> list[Entry]:
        return [e for e in self.entries if e.status == "kept"]

    def __str__(self) -> str:
        lines = [f"kernelize: {len(self.replaced)} of {len(self.entries)} layers "
                 f"{'replaced' if self.swapped else 'would be replaced (not swapped: no CUDA)'}"
                 f" | {self.source} | policy {self.policy} | arch {self.arch}"]
        for e in self.entries:
            what = f"{e.op}" + (f" ({e.semantics})" if e.semantics != "default" else "")
            head = (f"  {e.status:13} {e.path} [{e.cls}: {what}, {e.dtype}, cols={e.cols}]"
                    if e.op != "?" else f"  {e.status:13} {e.path} [{e.cls}]")
            if e.kernel:
                ev = e.kernel.evidence
                extra = ", ".join(f"{k} {ev[k]}" for k in ("class", "device") if ev.get(k))
                head += f" -> {e.kernel.label} {e.kernel.digest[:19]}…" + (f" ({extra})" if extra else "")
            lines.append(head)
            if e.width_note:
                lines.append(f"      * {e.width_note}")
            for r in e.reasons if e.status == "kept" else []:
                lines.append(f"      - {r}")
        return "\n".join(lines)


def _source(hub, lock, kernels_dir, names, wait_for_verification_s: float = 0.0):
    given = [x is not None for x in (hub, lock, kernels_dir)]
    if sum(given) != 1:
        raise ValueError("give exactly one of hub=URL, lock=PATH or kernels_dir=PATH")
    if hub is not None:
        return (HubSource(hub, wait_for_verification_s=wait_for_verification_s)
                if isinstance(hub, str) else hub)
    if lock is not None:
        return LockSource(lock)
    return DirSource(kernels_dir, names)


def _cuda_device(model: nn.Module, device) -> torch.device | None:
    if device is not None:
        d = torch.device(device)
        return d if d.type == "cuda" else None
    for t in itertools.chain(model.parameters(), model.buffers()):
        return t.device if t.device.type == "cuda" else None
    # no parameters or buffers (nn.SiLU, nn.GELU): nothing says where the model lives, so on
    # a CUDA machine the current CUDA device (the swapped forward falls back for CPU inputs)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def _arch_of(device: torch.device | None, arch: str | None) -> str:
    if arch:
        return arch
    if device is not None and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}"
    raise ValueError("arch is needed to resolve kernels without a CUDA device: pass e.g. arch=\"sm_90\"")


def _resolve_all(model, source, policy, arch, dtype,
                 fuse_gated_mlp: bool = True) -> tuple[Discovery, dict[Key, Resolution], list]:
    found = discover(model, dtype, fuse_gated_mlp=fuse_gated_mlp)
    cache: dict[Key, Resolution] = {}
    plan = []
    for s in found.sites:
        if s.dtype is None:
            plan.append((s, None, Resolution(None, ["dtype is not bf16, f16 or f32"])))
            continue
        key = Key(s.op, s.semantics, s.dtype, arch, s.cols, policy)
        if key not in cache:
            cache[key] = source.resolve(key)
        r = cache[key]
        if r.width_note:
            log.warning("kernelize: %s [%s %s, cols=%d]: %s; %s", s.path, s.op, s.dtype, s.cols,
                        r.width_note, "replacing it" if r.kernel else "keeping the layer")
        plan.append((s, key, r))
    return found, cache, plan


def kernelize(model: nn.Module, hub: str | None = None, *, lock: str | os.PathLike | None = None,
              kernels_dir: str | os.PathLike | None = None, names: list[str] | None = None,
              policy: str = "bit_exact", device=None, arch: str | None = None,
              dtype: str | None = None, swap: bool | None = None, verbose: bool = True,
              fuse_gated_mlp: bool = True, wait_for_verification_s: float = 0.0) -> Report:
    """Replace every layer of `model` that has an approved kernel; return (and print) a report.

    One source: `hub=URL` (the resolve API), `lock=PATH` (a lock written by `kernelize.lock`,
    offline) or `kernels_dir=PATH` (local kernel folders, unverified; `names` picks among them).
    `swap=None` swaps when the model is on a CUDA device and reports "would replace" otherwise;
    `swap=True` without CUDA raises. `dtype` overrides the dtype asked for (default: the
    layers' parameter dtype). Calls whose input does not fit the kernel (other dtype or
    device, autograd, sizes outside its constraints) run the original forward;
    `launch_counts(model)` tells how many calls of each swapped layer ran the kernel.
    `fuse_gated_mlp=False` leaves gated SiLU MLPs unfused: their `act_fn` is then a `silu`
    site instead of the MLP being a `silu_and_mul` site.

    The hub hands a kernel out only at a row length it was verified at. For a layer whose width
    was not verified, the hub queues a verification of that width; `wait_for_verification_s`
    (default 0: do not wait) waits up to that many seconds for it and asks again, else the
    layer is kept this time. Either way the report (and a `kernelize` logger warning) names
    the layer, the width and the job's URL.
    """
    src = _source(hub, lock, kernels_dir, names, wait_for_verification_s)
    dev = _cuda_device(model, device)
    if swap is None:
        swap = dev is not None and torch.cuda.is_available()
    elif swap and (dev is None or not torch.cuda.is_available()):
        raise RuntimeError("swap=True needs the model on a CUDA device (kernels launch on the GPU); "
                           "without CUDA kernelize can only report what it would replace")
    arch = _arch_of(dev, arch)
    src_label = f"hub {src.url}" if isinstance(src, HubSource) else (
        f"lock {src.path}" if isinstance(src, LockSource) else f"dir {src.path}")
    found, _, plan = _resolve_all(model, src, policy, arch, dtype, fuse_gated_mlp)
    rep = Report(src_label, policy, arch, swap)
    for s, key, res in plan:
        e = Entry(s.path, type(s.module).__name__, s.op, s.semantics, s.dtype, s.cols,
                  "kept", res.kernel, list(res.excluded), s.how, res.width_note)
        if res.kernel is not None:
            if getattr(s.module, _ORIG, None) is not None:
                e.status, e.reasons = "kept", ["already kernelized; unkernelize first"]
            elif swap:
                _patch(s, res.kernel, dev)
                e.status = "replaced"
            else:
                e.status = "would replace"
        rep.entries.append(e)
    for sk in found.skipped:
        rep.entries.append(Entry(sk.path, sk.cls, "?", "default", None, 0, "kept", None, [sk.reason]))
    if verbose:
        print(rep)
    return rep


def lock(model: nn.Module, hub: str, path: str | os.PathLike = "kernelize.lock.json", *,
         policy: str = "bit_exact", arch: str | None = None, device=None,
         dtype: str | None = None, fuse_gated_mlp: bool = True,
         wait_for_verification_s: float = 0.0) -> dict:
    """Resolve every replaceable layer against the hub and pin the answers (digests, with the
    kernels' content and evidence) in a lock file for `kernelize(model, lock=path)`.
    `wait_for_verification_s`: as for `kernelize` (widths not yet verified)."""
    src = (HubSource(hub, wait_for_verification_s=wait_for_verification_s)
           if isinstance(hub, str) else hub)
    arch = _arch_of(_cuda_device(model, device), arch)
    _, cache, _ = _resolve_all(model, src, policy, arch, dtype, fuse_gated_mlp)
    return write_lock(path, src.url, cache)


def unkernelize(model: nn.Module) -> int:
    """Restore the original forwards; returns how many layers were restored."""
    n = 0
    for m in model.modules():
        orig = m.__dict__.get(_ORIG)
        if orig is None:
            continue
        if orig is _NO_INSTANCE_FORWARD:
            m.__dict__.pop("forward", None)
        else:
            m.__dict__["forward"] = orig
        del m.__dict__[_ORIG]
        m.__dict__.pop("_kernelize_kernel", None)
        m.__dict__.pop(_LAUNCHES, None)
        n += 1
    return n


def launch_counts(model: nn.Module) -> dict[str, int]:
    """For every swapped layer of `model` (by path): how many of its calls so far launched the
    kernel. A layer at 0 has always fallen back to its original forward (the input's dtype,
    device, shape or element count did not fit), so the kernel has not been exercised.
    Only eager calls are counted: calls through torch.compile (and CUDA graph replays) are not."""
    return {path or "<root>": m.__dict__.get(_LAUNCHES, 0)
            for path, m in model.named_modules() if m.__dict__.get(_ORIG) is not None}


# ---- swapping ------------------------------------------------------------------------------

def _counted(m: nn.Module) -> None:
    # Not while torch.compile traces: dynamo would guard on the counter's value and recompile
    # the graph at every call. launch_counts counts the eager (uncompiled) calls.
    if torch.compiler.is_compiling():
        return
    m.__dict__[_LAUNCHES] = m.__dict__.get(_LAUNCHES, 0) + 1


def _patch(site: Site, k: Resolved, device: torch.device) -> None:
    """Swap `site.module`'s forward for one that calls the op's custom op (`ops.py`: one
    dispatcher call, traceable by torch.compile, capturable in a CUDA graph) on inputs the
    kernel takes, and the original forward on any other input."""
    m = site.module
    orig_forward = m.forward  # bound: instance attribute or the class's method
    want = {v: k_ for k_, v in TORCH_DTYPES.items()}[site.dtype]
    compiled = L.compiled(k.digest, k.manifest, k.source, site.dtype, device)
    man = k.manifest
    dev = compiled.device   # a CUDA device (the kernel was loaded there)
    key = ops.register(compiled)
    launch = ops.op(site.op)
    cols = site.cols

    def usable(x: torch.Tensor, *params: torch.Tensor | None) -> bool:
        if not (isinstance(x, torch.Tensor) and x.device == dev and x.dtype == want):
            return False
        if torch.is_grad_enabled() and (x.requires_grad or any(p is not None and p.requires_grad for p in params)):
            return False  # the kernels have no backward
        return all(p is None or (p.dtype == want and p.device == x.device) for p in params)

    if site.op == "rms_norm":
        # nn.RMSNorm(eps=None): F.rms_norm takes the opmath type's epsilon (f32)
        eps = site.eps if site.eps is not None else torch.finfo(torch.float32).eps

        def fwd(self, x, *a, **kw):
            if a or kw or not usable(x, self.weight) or x.shape[-1] != cols:
                return orig_forward(x, *a, **kw)
            _counted(self)
            return launch(x, self.weight, eps, key)
    elif site.op == "layer_norm":
        def fwd(self, x, *a, **kw):
            if a or kw or not usable(x, self.weight, self.bias) or x.shape[-1] != cols:
                return orig_forward(x, *a, **kw)
            _counted(self)
            return launch(x, self.weight, self.bias, float(self.eps), key)
    elif site.op in ("silu", "gelu", "gelu_tanh"):
        def fwd(self, x, *a, **kw):
            if a or kw or not usable(x) or not_applicable(man, x.numel(), None):
                return orig_forward(x, *a, **kw)
            _counted(self)
            return launch(x, key)
    elif site.op == "silu_and_mul":
        def fwd(self, x, *a, **kw):
            if a or kw or not usable(x, self.gate_proj.weight, self.up_proj.weight):
                return orig_forward(x, *a, **kw)
            g = self.gate_proj(x)
            u = self.up_proj(x)
            if g.dtype != want or g.shape != u.shape:
                return self.down_proj(self.act_fn(g) * u)
            _counted(self)
            return self.down_proj(launch(g, u, key))
    else:  # pragma: no cover
        raise ValueError(site.op)
    m.__dict__[_ORIG] = m.__dict__.get("forward", _NO_INSTANCE_FORWARD)
    m.__dict__["_kernelize_kernel"] = k
    m.__dict__[_LAUNCHES] = 0
    m.__dict__["forward"] = types.MethodType(fwd, m)
