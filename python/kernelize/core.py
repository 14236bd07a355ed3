"""kernelize(model, ...): replace layers with verified hub kernels; unkernelize(model)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import os
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from . import launch as L
from . import ops
from . import training as _training
from .digest import check_digest
from .manifest import BACKWARD_OF, FUSED_ADD, SEMANTICS, VERDICT_ON_DEVICE, not_applicable
from .discover import DTYPE_OF_NAME, TORCH_DTYPES, Discovery, Site, discover
from .sources import (DirSource, HubError, HubRateLimited, HubSource, Key, LockSource, Resolution,
                      Resolved, write_lock)

log = logging.getLogger("kernelize")

_ORIG = "_kernelize_original_forward"
_LAUNCHES = "_kernelize_launches"  # how many calls of a swapped layer ran the kernel
_ABI_ALIGNMENT = L.ABI_ALIGNMENT  # the ABI's alignment, bound once for the inline launch path


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
    # Every op asked for this layer, in order (a gated MLP: silu_mul, then silu_and_mul);
    # `op` is the one whose kernel was taken, or the first when none was.
    tried: list[str] = field(default_factory=list)
    # A parameterless layer resolved for each dtype, loaded for the dtype of its calls: this
    # entry is its `dtype` one (see `_fwd_by_call`).
    by_call: bool = False
    # mode "training", a layer whose op has a backward op (rms_norm (llama, gemma): rms_norm_backward;
    # a gated MLP swapped for silu_mul / gelu_tanh_mul: silu_mul_backward / gelu_tanh_mul_backward;
    # layer_norm: layer_norm_backward; a standalone activation swapped for silu / gelu / gelu_tanh:
    # silu_backward / gelu_backward / gelu_tanh_backward):
    # the backward kernel taken (its gradients under autograd), or None with the reasons none
    # was (the layer keeps its original forward under autograd).
    backward: Resolved | None = None
    backward_reasons: list[str] = field(default_factory=list)

    def line(self) -> str:
        """The layer, what it computes and the kernel taken, on one line (the report's)."""
        what = f"{self.op}" + (f" ({self.semantics})" if self.semantics != "default" else "")
        dt = f"{self.dtype} calls" if self.by_call else self.dtype
        head = (f"{self.path} [{self.cls}: {what}, {dt}, cols={self.cols}]"
                if self.op != "?" else f"{self.path} [{self.cls}]")
        if self.kernel:
            ev = self.kernel.evidence
            extra = ", ".join(f"{k} {ev[k]}" for k in ("class", "device") if ev.get(k))
            head += f" -> {self.kernel.label} {self.kernel.digest[:19]}…" + (f" ({extra})" if extra else "")
        return head

    def __repr__(self) -> str:
        # one line: `print(report.replaced)` reads as the report does (the kernel's manifest,
        # source, certificate and report are on `kernel`)
        return f"<{self.status}: {self.line()}>"


@dataclass
class Report:
    source: str
    policy: str
    arch: str | None
    swapped: bool
    entries: list[Entry] = field(default_factory=list)
    compile: Any = None   # exact.CompileState when kernelize(..., compile=...) was asked
    notes: list[str] = field(default_factory=list)   # what else kernelize set on the model
    mode: str = "inference"   # kernelize(..., mode=...): inference, training or compile

    @property
    def replaced(self) -> list[Entry]:
        return [e for e in self.entries if e.status in ("replaced", "would replace")]

    @property
    def kept(self) -> list[Entry]:
        return [e for e in self.entries if e.status == "kept"]

    def __str__(self) -> str:
        # layers, not entries: a parameterless layer has one entry per dtype
        n_replaced = len({e.path for e in self.replaced})
        lines = [f"kernelize: {n_replaced} of {len({e.path for e in self.entries})} layers "
                 f"{'replaced' if self.swapped else 'would be replaced (not swapped: no CUDA)'}"
                 f" | {self.source} | policy {self.policy} | arch {self.arch} | mode {self.mode}"]
        for e in self.entries:
            lines.append(f"  {e.status:13} {e.line()}")
            for why in (e.kernel.evidence.get("stale") or []) if e.kernel else []:
                lines.append(f"      ! stale verdict: {why}")
            if e.width_note:
                lines.append(f"      * {e.width_note}")
            for r in e.reasons if e.status == "kept" else []:
                lines.append(f"      - {r}")
        if self.compile is not None:
            lines.append(f"  {self.compile}")
        lines.extend(f"  {n}" for n in self.notes)
        return "\n".join(lines)


def _source(hub, lock, kernels_dir, names, wait_for_verification_s: float = 0.0,
            trusted_keys: list[str] | None = None, allow_python: bool = False):
    given = [x is not None for x in (hub, lock, kernels_dir)]
    if sum(given) != 1:
        raise ValueError("give exactly one of hub=URL, lock=PATH or kernels_dir=PATH")
    if trusted_keys and kernels_dir is not None:
        raise ValueError("trusted_keys checks hub certificates: local kernel folders have none")
    if hub is not None:
        return (HubSource(hub, wait_for_verification_s=wait_for_verification_s,
                          trusted_keys=trusted_keys, allow_python=allow_python)
                if isinstance(hub, str) else hub)
    if lock is not None:
        return LockSource(lock, trusted_keys=trusted_keys, allow_python=allow_python)
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
    """Resolve every site; a site with no qualifying kernel tries its alternatives in order
    (a gated SiLU MLP: silu_mul, then silu_and_mul). The plan holds, per site, the site taken
    (the alternative whose kernel qualified, else the site itself), its key and resolution
    (when none qualified: every candidate's reasons), the ops tried, and whether the site is
    one dtype of a parameterless layer that takes the dtype of its calls: such a layer (nn.SiLU
    alone, where no parameter says the dtype) is resolved for bf16, f16 and f32."""
    found = discover(model, dtype, fuse_gated_mlp=fuse_gated_mlp)
    cache: dict[Key, Resolution] = {}
    plan = []
    events: dict[tuple, list[str]] = {}   # one log line per unverified width, not per layer
    for site in found.sites:
        by_call = site.dtype is None and site.op in _BY_CALL_OPS and not any(
            True for _ in site.module.parameters())
        if site.dtype is None and not by_call:
            plan.append((site, None, Resolution(None, ["dtype is not bf16, f16 or f32"]),
                         [site.op], False))
            continue
        for s in [dataclasses.replace(site, dtype=dt) for dt in _CALL_DTYPES] if by_call else [site]:
            plan.append(_resolve_site(s, source, policy, arch, cache, events) + (by_call,))
    for (op, dt, cols, note, then), paths in events.items():
        where = paths[0] if len(paths) == 1 else f"{paths[0]} ... {paths[-1]} ({len(paths)} layers)"
        log.warning("kernelize: %s [%s %s, cols=%d]: %s; %s", where, op, dt, cols, note, then)
    return found, cache, plan


_BY_CALL_OPS = ("silu", "gelu", "gelu_tanh")   # elementwise: no weight to take a dtype from
_CALL_DTYPES = ("bf16", "f16", "f32")


def _resolve_site(s: Site, source, policy: str, arch: str, cache: dict[Key, Resolution],
                  events: dict[tuple, list[str]]) -> tuple:
    """(site taken, key, resolution, ops tried) of one site: see `_resolve_all`."""
    tried = []
    cands = [s, *s.alternatives]
    for i, cand in enumerate(cands):
        key = Key(cand.op, cand.semantics, cand.dtype or s.dtype, arch, cand.cols, policy)
        if key not in cache:
            cache[key] = source.resolve(key)
        r = cache[key]
        if r.width_note:
            then = ("replacing it" if r.kernel else
                    f"trying {cands[i + 1].op}" if i + 1 < len(cands) else "keeping the layer")
            events.setdefault((cand.op, key.dtype, cand.cols, r.width_note, then),
                              []).append(cand.path)
        tried.append((cand, key, r))
        if r.kernel is not None:
            break
    ops = [c.op for c, _, _ in tried]
    cand, key, r = tried[-1]
    if r.kernel is not None and len(tried) > 1:
        # an alternative was taken: the report still says why the earlier ops were not
        r = Resolution(r.kernel, [x for t in tried for x in t[2].excluded], r.queued_jobs,
                       r.width_note)
    if r.kernel is None and len(tried) > 1:
        # none qualified: the layer is reported as its first op, with every candidate's why
        cand, key = tried[0][0], tried[0][1]
        notes = [t[2].width_note for t in tried if t[2].width_note]
        r = Resolution(None, [x for t in tried for x in t[2].excluded],
                       [j for t in tried for j in t[2].queued_jobs],
                       "; ".join(notes) if notes else None)
    return cand, key, r, ops


def kernelize(model: nn.Module, hub: str | None = None, *, lock: str | os.PathLike | None = None,
              kernels_dir: str | os.PathLike | None = None, names: list[str] | None = None,
              policy: str = "bit_exact", device=None, arch: str | None = None,
              dtype: str | None = None, swap: bool | None = None, verbose: bool = True,
              fuse_gated_mlp: bool = True, wait_for_verification_s: float = 0.0,
              trusted_keys: list[str] | None = None, allow_python: bool = False,
              compile: bool | str = False, mode: str = "inference") -> Report:
    """Replace every layer of `model` that has an approved kernel; return (and print) a report.

    `mode` names what the model is kernelized for, as other kernel hubs name it:
    `"inference"` (the default): forward kernels; a call under autograd (grad enabled and an
    input or weight that requires grad) runs the layer's original forward. `"training"`: the
    same, and a swapped HF LlamaRMSNorm-style layer (rms_norm, llama) or HF GemmaRMSNorm one
    (rms_norm, gemma) whose source also hands out an `rms_norm_backward` kernel of its semantics
    for its dtype and width (same hub, lock or kernels_dir, same policy) runs under autograd as one autograd node: the forward kernel, then the
    backward kernel's three entries (`kernelize.training`); likewise a gated SiLU MLP swapped
    for `silu_mul` with a `silu_mul_backward` kernel, or a tanh-GELU one (Gemma's) swapped for
    `gelu_tanh_mul` with a `gelu_tanh_mul_backward` kernel (its one entry gives the gradients of
    gate_proj's and up_proj's outputs), and an nn.LayerNorm swapped for `layer_norm` with a
    `layer_norm_backward` kernel (under autograd its forward is eager's own native_layer_norm,
    whose saved mean and rstd the kernel's two entries read), and a standalone activation swapped
    for `silu` / `gelu` / `gelu_tanh` with a `silu_backward` / `gelu_backward` /
    `gelu_tanh_backward` kernel, where its eager autograd is that one node on its input
    (`training.activation_node_check`: not HF's NewGELUActivation, whose own formula records
    other nodes); where none qualifies the layer
    keeps its original forward under autograd and the report says why, one line per reason.
    `"compile"` (alias `"torch_compile"`): inference, then compiled as `compile=True` does
    (`compile=` still works, and combines with `mode="training"`).

    `compile=True` (or a torch.compile mode: `"default"`, `"reduce-overhead"` for CUDA graphs)
    then compiles the model in place with the exact backend (`kernelize.exact_compile`,
    docs/compile.md): the swapped layers stay opaque custom ops, every reduction and
    math-library function inductor would compute differently runs eager's own kernel, the
    pattern rewrites are off and eager's roundings are kept, so the compiled model computes
    eager's bits while inductor fuses the rest. The whole model is compiled as one graph (under
    "reduce-overhead" one CUDA graph per forward); `exact_compile(model, mode, regional=True)`
    compiles block by block instead.
    `report.compile` says what was done (or why the model was left eager: no torch.compile on
    this platform).

    One source: `hub=URL` (the resolve API), `lock=PATH` (a lock written by `kernelize.lock`,
    offline) or `kernels_dir=PATH` (local kernel folders, unverified; `names` picks among them).
    `swap=None` swaps when the model is on a CUDA device and reports "would replace" otherwise;
    `swap=True` without CUDA raises, except with `device="cpu"`, which swaps Python candidates
    only (their PyTorch code runs on CPU tensors; CUDA kernels are kept, with the reason). `dtype` overrides the dtype asked for (default: the
    layers' parameter dtype; a layer with none, such as nn.SiLU() alone, takes the dtype of each
    call: resolved for bf16, f16 and f32, loaded at the first call in each). Calls whose input does not fit the kernel (other dtype or
    device, autograd, sizes outside its constraints) run the original forward;
    `launch_counts(model)` tells how many calls of each swapped layer ran the kernel.
    A gated MLP (HF LlamaMLP, Qwen2MLP, MistralMLP; GemmaMLP, Gemma2/3) is replaced by the
    two-input kernel of its activation (`silu_mul` / `gelu_tanh_mul`, on `gate_proj(x)` and
    `up_proj(x)`); when none qualifies, a SiLU MLP falls back to a `silu_and_mul` kernel and a
    tanh-GELU MLP to a `gelu_tanh` kernel for its `act_fn`. `fuse_gated_mlp=False` leaves gated
    MLPs unfused: their `act_fn` is then a `silu` / `gelu_tanh` site.

    The hub hands a kernel out only at a row length it was verified at, and a resolve queues
    nothing. For a layer whose width was not verified, a client with a hub token (the
    KERNELIZE_TOKEN environment variable, or a `HubSource(url, token=...)` as `hub`; scope
    `submit`) asks the hub to verify that width; a dry run (`swap=False`, or no CUDA) never
    does. `wait_for_verification_s` (default 0: do not wait) waits up to that many seconds for
    it and asks again, else the layer is kept this time. Either way the report (and a
    `kernelize` logger warning) names the layer and the width, and the job's URL or, when
    nothing was queued, how to ask.

    `trusted_keys` (base64 ed25519 public keys of GPU workers, as `kernelize worker-key init`
    prints them): take a kernel only when its verification carries a certificate signed by one
    of them that certifies that report and that very source (checked offline for a lock; a
    lock's own `trusted_keys` are used when none are given). A kernel failing the check is kept
    out with the reason; a lock whose certificates fail is refused (`CertificateError`).

    `allow_python=True` opts in to Python candidates (docs/spec.md section 2b: a kernel whose manifest says
    `runtime = "python"`, e.g. Liger-Kernel's or a torch.compile'd layer): their source runs in
    this process, with the packages their `requires` names (installed by you). Without it the
    hub is not asked for them and a lock's are kept out, with the reason. A local
    `kernels_dir` is your own code: its Python candidates are loaded as they are.
    """
    mode, compile = _check_mode(mode, compile)
    src = _source(hub, lock, kernels_dir, names, wait_for_verification_s, trusted_keys,
                  allow_python)
    dev = _cuda_device(model, device)
    # A Python candidate is PyTorch code: with an explicit device="cpu" it runs on CPU tensors
    # (the model-level harness's CPU tests); CUDA kernels stay kept there.
    on_cpu = device is not None and torch.device(device).type == "cpu"
    if swap is None:
        swap = dev is not None and torch.cuda.is_available()
    elif swap and (dev is None or not torch.cuda.is_available()) and not on_cpu:
        raise RuntimeError("swap=True needs the model on a CUDA device (kernels launch on the GPU); "
                           "without CUDA kernelize can only report what it would replace "
                           "(device=\"cpu\" swaps Python candidates only)")
    if isinstance(src, HubSource) and not swap and src.request_widths:
        # A dry run asks the hub for no GPU work (a copy: the caller's source is left as it is).
        src = copy.copy(src)
        src.request_widths = False
    arch = _arch_of(dev, arch)
    src_label = _label(src)
    found, _, plan = _resolve_all(model, src, policy, arch, dtype, fuse_gated_mlp)
    rep = Report(src_label, policy, arch, swap,
                 mode=mode + ("+compile" if compile and mode == "training" else ""))
    where = dev if dev is not None else torch.device("cpu")
    opted_in = allow_python or isinstance(src, DirSource)
    by_call: dict[int, tuple[Site, dict]] = {}   # a parameterless layer: dtype -> kernel or why not
    train: list[tuple[Site, Entry]] = []         # mode "training": the layers to give a backward
    for s, key, res, tried, per_dtype in plan:
        e = Entry(s.path, type(s.module).__name__, s.op, s.semantics, s.dtype, s.cols,
                  "kept", res.kernel, list(res.excluded), s.how, res.width_note, tried, per_dtype)
        if res.kernel is not None:
            if getattr(s.module, _ORIG, None) is not None:
                e.status, e.reasons = "kept", ["already kernelized; unkernelize first"]
            elif swap and dev is None and not L.is_python(res.kernel.manifest):
                e.status, e.reasons = "kept", [
                    "a CUDA kernel launches on a CUDA device; this model runs on the CPU"]
            elif swap and per_dtype:
                e.status = "replaced"   # loaded at the first call in this dtype
            elif swap:
                _patch(s, res.kernel, where, allow_python=opted_in)
                e.status = "replaced"
            else:
                e.status = "would replace"
        if mode == "training":
            train.append((s, e))
        if per_dtype and swap:
            kernels = by_call.setdefault(id(s.module), (s, {}))[1]
            kernels[s.dtype] = e.kernel if e.status == "replaced" else e.reasons
        rep.entries.append(e)
    for s, kernels in by_call.values():
        if any(isinstance(k, Resolved) for k in kernels.values()):
            _install_by_call(s.module, kernels, (s.op, None, s.cols, 0.0, str(where), opted_in),
                             s.module.__dict__.get("forward", _NoInstanceForward))
    for sk in found.skipped:
        rep.entries.append(Entry(sk.path, sk.cls, "?", "default", None, 0, "kept", None, [sk.reason]))
    if mode == "training":
        rep.notes.extend(_plan_training(train, src, policy, arch))
    if compile:
        from .exact import exact_compile
        if swap and mode != "training":
            rep.notes.extend(_plan_residual_norms(plan, src, policy, arch))
        rep.compile = exact_compile(model, None if compile is True else str(compile))
    elif any(e.status == "replaced" for e in rep.entries):
        from .exact import hold_generate_compile
        note = hold_generate_compile(model)
        if note:
            rep.notes.append(note + "; kernelize(..., compile=True) compiles with eager's bits")
    if verbose:
        print(rep)
    return rep


MODES = ("inference", "training", "compile")
_MODE_ALIASES = {"torch_compile": "compile"}   # Hugging Face kernels' Mode.TORCH_COMPILE


def _check_mode(mode: Any, compile: bool | str) -> tuple[str, bool | str]:
    """(mode, compile) for `kernelize(..., mode=, compile=)`: mode "compile" is compile=True."""
    name = _MODE_ALIASES.get(mode, mode) if isinstance(mode, str) else mode
    if name not in MODES:
        raise ValueError(
            f"mode={mode!r} is not a kernelize mode: give one of 'inference' (the default: forward "
            "kernels; calls under autograd run the original forward), 'training' (also a backward "
            "kernel under autograd where the source hands one out) or 'compile' (inference, "
            "compiled with the exact backend: the same as compile=True)")
    if name == "compile" and not compile:
        compile = True
    if name == "inference" and compile:
        name = "compile"
    return name, compile


#: Why mode "training" keeps an f32 norm's original forward under autograd.
F32_ACCUMULATION = ("in f32 eager autograd adds this layer's input gradient to the residual "
                    "stream's in an order a backward kernel's one dx cannot give (docs/backward.md)")


def gpu_figures(device) -> tuple[int, int]:
    """`device`'s SMs and threads per SM: what eager's column sum for dw is configured from."""
    props = torch.cuda.get_device_properties(device)
    return int(props.multi_processor_count), int(props.max_threads_per_multi_processor)


def other_device_shape(k: Resolved, device) -> str | None:
    """Why backward kernel `k` is not handed to `device()` (the layer's device): its
    verification ran on a GPU of other SMs or threads per SM (eager's column sum for dw is
    configured from both, so the verdict holds for the figures it was measured with,
    docs/backward.md); None where they match or the source carries none (a local kernels
    folder: not verified)."""
    shape = k.evidence.get("device_shape")
    if not shape or shape.get("sm_count") is None:
        return None
    here = gpu_figures(device())
    there = (shape.get("sm_count"), shape.get("threads_per_sm"))
    if there == here:
        return None
    return (f"{k.label} was verified on a GPU of {there[0]} SMs x {there[1]} threads per SM "
            f"({shape.get('name')}); eager's dw order depends on both and this GPU has "
            f"{here[0]} x {here[1]}: not verified for it (verify it on this GPU: kernelize worker)")


def _resolve_backward(src, key: Key, figures: tuple[int, int] | None) -> Resolution:
    """The source's answer for backward `key`; a hub's error (other than its rate limit) is the
    layer's reason for none: a hub from before the op answers 400 for it, and the forward
    kernels already taken stay."""
    try:
        return src.resolve(key, figures)
    except HubRateLimited:
        raise
    except HubError as e:
        return Resolution(None, [f"{key.op}: {e}"])


def _plan_training(train: list[tuple[Site, Entry]], src, policy: str, arch: str) -> list[str]:
    """Mode "training": resolve each swapped layer's backward kernel from the same source (its
    op's backward op, `BACKWARD_OF`: rms_norm (llama, gemma) -> rms_norm_backward of the same
    semantics (with the GPU's SMs and threads per SM, `VERDICT_ON_DEVICE`), silu_mul ->
    silu_mul_backward, gelu_tanh_mul -> gelu_tanh_mul_backward, layer_norm ->
    layer_norm_backward, silu / gelu / gelu_tanh -> silu_backward / gelu_backward /
    gelu_tanh_backward (where the layer's eager autograd is that activation's one node,
    `training.activation_node_check`); its dtype and width, the policy) and
    install it where the layer is swapped; every other layer keeps its original forward under
    autograd. Returns the report's lines: one per outcome (kernel taken, or reasons), naming the
    layers it concerns."""
    cache: dict[tuple, Resolution] = {}
    groups: dict[tuple, list[str]] = {}
    for s, e in train:
        what = f"{e.op}" + (f" ({e.semantics})" if e.semantics != "default" else "")
        if e.status not in ("replaced", "would replace"):
            continue   # kept: its original forward everywhere (the report's line says why)
        bop = BACKWARD_OF.get((e.op, e.semantics))
        if bop is None:
            groups.setdefault((what, None, None, f"no backward op for {what} yet: its original "
                               "forward runs under autograd"), []).append(e.path)
            continue
        if e.op not in _TRAIN_FORWARDS:   # pragma: no cover (every op with a backward op has one)
            groups.setdefault((what, None, None, f"training mode does not run {bop} yet: its "
                               "original forward runs under autograd"), []).append(e.path)
            continue
        if e.op in _training.ACTIVATION_FORMULAS:
            why = _training.activation_node_check(_orig_callable(s.module), e.op,
                                                  DTYPE_OF_NAME[e.dtype])
            if why is not None:
                e.backward_reasons = [why]
                groups.setdefault((what, e.dtype, e.cols, "keeps its original forward under "
                                   "autograd: " + why), []).append(e.path)
                continue
        if e.op == "rms_norm" and e.dtype == "f32" and e.path != "<root>" and e.semantics != "torch":
            # (llama and gemma: GemmaRMSNorm's f32 graph has no cast node either; not torch:
            # F.rms_norm is one node, _fused_rms_norm's, whose one dx the engine adds to the
            # residual's gradient as it adds a backward kernel's, docs/backward-rms-torch.md)
            # Eager's f32 graph has no cast node in the norm, so the layer's input gradient is
            # three f32 terms summed in autograd's order, ((residual + x*r path) + pow path);
            # a backward kernel returns the norm's two as one dx, summed first: other bits
            # wherever the input has another consumer (the residual stream, always in a decoder
            # block). docs/backward.md; python/tests/test_backward_order_on_cpu.py pins it. A
            # layer kernelized on its own (the model is the layer, "<root>") takes the kernel:
            # its dx is the layer's eager dx; what else reads its input is the caller's.
            e.backward_reasons = [F32_ACCUMULATION]
            groups.setdefault((what, e.dtype, e.cols, "keeps its original forward under autograd: "
                               + F32_ACCUMULATION), []).append(e.path)
            continue
        key = Key(bop, e.semantics, e.dtype, arch, e.cols, policy)
        # a swapped layer's GPU figures go with the query where the op's verdict depends on them
        # (a hub keys those backward answers on them); the gated backward ops' and
        # layer_norm_backward's do not
        on_device = bop in VERDICT_ON_DEVICE
        figures = (gpu_figures(s.module.__dict__["_kz_compiled"].device)
                   if on_device and e.status == "replaced" and isinstance(src, HubSource) else None)
        if (key, figures) not in cache:
            cache[key, figures] = _resolve_backward(src, key, figures)
        r = cache[key, figures]
        other_gpu = None
        if r.kernel is not None and e.status == "replaced" and on_device:
            other_gpu = other_device_shape(r.kernel, lambda: s.module.__dict__["_kz_compiled"].device)
        if r.kernel is None:
            e.backward_reasons = (list(r.excluded) + ([r.width_note] if r.width_note else [])
                                  or ["none qualifies"])
        elif other_gpu:
            e.backward_reasons = [other_gpu]
        elif e.status == "replaced" and e.by_call:
            # a layer swapped by the dtype of its calls (a model without parameters, nn.SiLU()
            # alone): its backward kernel, as its forward, is loaded at its first call in the
            # dtype (`_load_by_call`)
            s.module.__dict__.setdefault("_kz_by_call_bwd", {})[e.dtype] = r.kernel
            e.backward = r.kernel
        elif e.status == "replaced":
            try:
                compiled = s.module.__dict__["_kz_compiled"]
                bk = _training.compiled_backward(r.kernel.digest, r.kernel.manifest,
                                                 r.kernel.source, e.dtype, compiled.device)
                _install_training(s.module, r.kernel, bk)
                e.backward = r.kernel
            except Exception as ex:  # noqa: BLE001 (any failure: the original forward under autograd)
                e.backward_reasons = [f"{r.kernel.label} could not be loaded "
                                      f"({type(ex).__name__}: {ex})"]
        else:
            e.backward = r.kernel
        if e.backward is not None:
            cls = e.backward.evidence.get("class")
            how = ("runs under autograd as the forward kernel + backward" if e.status == "replaced"
                   else "would run under autograd as the forward kernel + backward")
            outcome = (f"{how} {e.backward.label} {e.backward.digest[:19]}…"
                       + (f" ({cls})" if cls else "")
                       + (f" (both loaded at its first call in {e.dtype})"
                          if e.by_call and e.status == "replaced" else ""))
        else:
            outcome = (f"keeps its original forward under autograd: no {bop} kernel: "
                       + "; ".join(e.backward_reasons))
        groups.setdefault((what, e.dtype, e.cols, outcome), []).append(e.path)
    lines = []
    for (what, dt, cols, outcome), paths in groups.items():
        paths = list(dict.fromkeys(paths))
        where = paths[0] if len(paths) == 1 else f"{paths[0]} ... {paths[-1]} ({len(paths)} layers)"
        shape = f" [{what}, {dt}, cols={cols}]" if dt is not None else f" [{what}]"
        if len(paths) > 1:
            for one, many in (("keeps its original forward", "keep their original forward"),
                              ("its original forward runs", "their original forwards run"),
                              ("runs under autograd", "run under autograd")):
                outcome = outcome.replace(one, many)
        lines.append(f"training: {where}{shape} {outcome}")
    return lines


def _plan_residual_norms(plan: list, src, policy: str, arch: str) -> list[str]:
    """Exact compile: each swapped rms_norm (llama) or layer_norm layer is paired with the
    source's fused kernel of its dtype and width (`manifest.FUSED_ADD`: fused_add_rms_norm,
    fused_add_layer_norm, each the norm of its op's default semantics; the same policy), so that the exact backend can run a residual add and
    this norm as that one kernel (`exact.fuse_residual_norms`). Returns the report's lines: which
    kernel, for how many layers, or why none."""
    cache: dict[Key, Resolution] = {}
    paired, why = {}, {}
    for s, _, res, _, per_dtype in plan:
        kz = s.module.__dict__.get("_kz")
        fused_op = FUSED_ADD.get(s.op) if s.semantics == SEMANTICS.get(s.op, ("default",))[0] else None
        if (res.kernel is None or per_dtype or fused_op is None
                or kz is None or "_kz_compiled" not in s.module.__dict__
                or L.is_python(res.kernel.manifest)):
            continue   # only a CUDA norm kernel is paired (a Python candidate stays as chosen)
        why.setdefault(fused_op, set())
        key = Key(fused_op, "default", s.dtype, arch, s.cols, policy)
        if key not in cache:
            cache[key] = src.resolve(key)
        r = cache[key]
        # A norm kernel is one per (digest, dtype, device) in this process, so an earlier call's
        # pairing would outlive this one's policy: the latest call decides.
        ops.unpair_residual(kz[0])
        if r.kernel is None:
            why[fused_op].update(r.excluded or ["none qualifies"])
            continue
        if L.is_python(r.kernel.manifest):
            why[fused_op].add(f"{r.kernel.label} is a Python candidate (only CUDA kernels are fused)")
            continue
        try:
            fk = L.compiled(r.kernel.digest, r.kernel.manifest, r.kernel.source, s.dtype,
                            s.module.__dict__["_kz_compiled"].device)
        except Exception as ex:  # noqa: BLE001 (not fused: the add stays inductor's)
            why[fused_op].add(f"{r.kernel.label} could not be loaded ({type(ex).__name__}: {ex})")
            continue
        ops.pair_residual(kz[0], ops.register(fk))
        paired.setdefault((s.op, fused_op, r.kernel.label), 0)
        paired[(s.op, fused_op, r.kernel.label)] += 1
    lines = [f"compile: a residual add feeding one of {n} {op} layers runs with it as "
             f"{label} (verified like the norm)" for (op, _, label), n in paired.items()]
    for fused_op, reasons in why.items():
        if reasons and not any(f == fused_op for _, f, _ in paired):
            lines.append(f"compile: residual adds stay separate kernels: no {fused_op} kernel "
                         "(" + "; ".join(sorted(reasons))[:300] + ")")
    return lines


def _orig_callable(m: nn.Module) -> Any:
    """What computes `m`'s original forward: its `_kz_orig` once swapped, else `m` itself."""
    return m.__dict__.get("_kz_orig") or m


def _install_training(m: nn.Module, k: Resolved, bk: Any) -> None:
    """Give the swapped layer `m` (an rms_norm, gated, layer_norm or activation one,
    `_TRAIN_FORWARDS`)
    the backward kernel `bk` (loaded from `k`)."""
    d = m.__dict__
    forward = _TRAIN_FORWARDS[d["_kz_swap"][0]]
    d["_kz_bwd"] = (bk, ops.register(bk), k.label)
    d["_kernelize_backward"] = k
    d["forward"] = types.MethodType(forward, m)


class KernelNotFound(LookupError):
    """`get_kernel`: no kernel qualifies for the op, dtype and width asked (the message has the
    source's reasons; `reasons` lists them)."""

    def __init__(self, message: str, reasons: list[str]):
        super().__init__(message)
        self.reasons = reasons


# The Python signature of each op's call (what the runners in `launch` take after the kernel).
_ARGS = {"rms_norm": ("x", "weight", "eps"), "fused_add_rms_norm": ("x", "residual", "weight", "eps"),
         "layer_norm": ("x", "weight", "bias", "eps"), "silu": ("x",), "gelu": ("x",),
         "gelu_tanh": ("x",), "silu_and_mul": ("gate", "up"), "silu_mul": ("gate", "up"),
         "gelu_tanh_mul": ("gate", "up")}


class Kernel:
    """One kernel, loaded, as a plain function of its op's tensors (what `get_kernel` returns):
    `rms_norm(x, weight, eps)`, `fused_add_rms_norm(x, residual, weight, eps)` (updates
    `residual` in place), `layer_norm(x, weight, bias, eps)`, `silu(x)` / `gelu(x)` /
    `gelu_tanh(x)`, `silu_and_mul(gate, up)` / `silu_mul(gate, up)` / `gelu_tanh_mul(gate, up)`;
    returns the output. It launches as a swapped layer does (`launch.RUNNERS`; while
    torch.compile traces, the op's custom op) and refuses an input it was not resolved for:
    another dtype, another row length (elementwise ops: an element count outside the
    kernel's constraints). `evidence`: the kernel, its digest and the source's evidence (class,
    device, verification id, ...)."""

    def __init__(self, op: str, kernel: Resolved, compiled: Any, dtype: str, cols: int):
        self.op, self.kernel, self.compiled, self.dtype, self.cols = op, kernel, compiled, dtype, cols
        self.key = ops.register(compiled)
        self.evidence = {**kernel.evidence, "kernel": f"{kernel.name}@{kernel.version}",
                         "digest": kernel.digest, "origin": kernel.origin}
        self._want = DTYPE_OF_NAME[dtype]
        self.__name__ = op

    def __repr__(self) -> str:
        return (f"<kernelize {self.op} kernel {self.evidence['kernel']} {self.kernel.digest[:19]}… "
                f"({self.dtype}, cols={self.cols}, on {self.compiled.device})>")

    def __call__(self, *args, **kwargs):
        names = _ARGS[self.op]
        if len(args) > len(names) or set(kwargs) - set(names[len(args):]):
            raise TypeError(f"{self.op}{names}: got {len(args)} arguments and {sorted(kwargs)}")
        vals = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
        if len(vals) != len(names):
            raise TypeError(f"{self.op}{names}: missing {names[len(vals):]}")
        x = vals[0]
        for n, t in zip(names, vals):
            if isinstance(t, Tensor) and t.dtype is not self._want:
                raise ValueError(f"{self.op}: {n} is {t.dtype}; this kernel was resolved for {self.dtype}")
        if self.op in _BY_CALL_OPS:
            why = not_applicable(self.kernel.manifest, x.numel(), None)
            if why:
                raise ValueError(f"{self.op}: {x.numel()} elements: {why}")
        elif x.shape[-1] != self.cols:
            raise ValueError(f"{self.op}: rows of {x.shape[-1]}; this kernel was resolved (and "
                             f"verified) for cols={self.cols}: get_kernel(..., cols={x.shape[-1]})")
        if _is_compiling():
            return ops.op(self.op)(*vals, self.key)
        return L.RUNNERS[self.op](self.compiled, *vals)


def get_kernel(op: str, *, dtype: str, cols: int, semantics: str | None = None,
               hub: str | None = None, lock: str | os.PathLike | None = None,
               kernels_dir: str | os.PathLike | None = None, names: list[str] | None = None,
               policy: str = "bit_exact", arch: str | None = None, device=None,
               trusted_keys: list[str] | None = None, allow_python: bool = False,
               wait_for_verification_s: float = 0.0) -> Kernel:
    """The kernel for (`op`, `semantics`, `dtype`, `cols`) that meets `policy` on `arch`,
    resolved as `kernelize` resolves a layer (one source: `hub`, `lock` or `kernels_dir`; the
    same checks: digest recomputed, `trusted_keys` certificates, the Python opt-in), loaded on
    `device` (default: the current CUDA device; a Python candidate may be given "cpu"), as a
    plain callable (`Kernel`). `semantics` defaults to `llama` for rms_norm, else `default`.
    Raises `KernelNotFound` with the source's reasons when none qualifies."""
    if op not in _ARGS:
        raise ValueError(f"unknown op {op!r}: one of {sorted(_ARGS)}")
    if dtype not in _CALL_DTYPES:
        raise ValueError(f"dtype {dtype!r}: one of {list(_CALL_DTYPES)}")
    src = _source(hub, lock, kernels_dir, names, wait_for_verification_s, trusted_keys,
                  allow_python)
    dev = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None)
    arch = _arch_of(dev if dev is not None and dev.type == "cuda" else None, arch)
    sem = semantics or ("llama" if op == "rms_norm" else "default")
    site = Site(f"get_kernel({op})", None, op, sem, int(cols), dtype)
    _, key, res, _ = _resolve_site(site, src, policy, arch, {}, {})
    if res.kernel is None:
        reasons = list(res.excluded) + ([res.width_note] if res.width_note else [])
        raise KernelNotFound(
            f"no {op} ({sem}) kernel for {dtype}, cols={cols} on {arch} meets {policy} "
            f"({_label(src)}): " + ("; ".join(reasons) or "none qualifies"), reasons)
    k = res.kernel
    if not L.is_python(k.manifest) and (dev is None or dev.type != "cuda"
                                        or not torch.cuda.is_available()):
        raise RuntimeError(f"{k.label} is a CUDA kernel: loading it needs a CUDA device "
                           f"(device={device!r}, CUDA available: {torch.cuda.is_available()})")
    opt_in = {"allow_python": allow_python or isinstance(src, DirSource)} \
        if L.is_python(k.manifest) else {}
    compiled = L.compiled(k.digest, k.manifest, k.source, dtype,
                          dev if dev is not None else torch.device("cpu"), **opt_in)
    return Kernel(op, k, compiled, dtype, int(cols))


def _label(src) -> str:
    return f"hub {src.url}" if isinstance(src, HubSource) else (
        f"lock {src.path}" if isinstance(src, LockSource) else f"dir {src.path}")


def lock(model: nn.Module, hub: str, path: str | os.PathLike = "kernelize.lock.json", *,
         policy: str = "bit_exact", arch: str | None = None, device=None,
         dtype: str | None = None, fuse_gated_mlp: bool = True,
         wait_for_verification_s: float = 0.0, trusted_keys: list[str] | None = None,
         allow_python: bool = False, mode: str = "inference") -> dict:
    """Resolve every replaceable layer against the hub and pin the answers (digests, with the
    kernels' content and evidence) in a lock file for `kernelize(model, lock=path)`.
    `wait_for_verification_s`: as for `kernelize` (widths not yet verified). With
    `trusted_keys`, only certified kernels are pinned, and the lock carries their certificates,
    reports and the trusted keys, so that loading it checks them all offline. `mode="training"`
    also pins the backward kernels `kernelize(..., mode="training")` asks for (rms_norm_backward
    at each rms_norm (llama, gemma) layer's semantics, dtype and width, silu_mul_backward /
    gelu_tanh_mul_backward at each silu_mul / gelu_tanh_mul MLP's, layer_norm_backward at each
    layer_norm layer's, silu_backward / gelu_backward / gelu_tanh_backward at each activation's),
    or the hub's reasons there is none."""
    mode, _ = _check_mode(mode, False)
    src = (HubSource(hub, wait_for_verification_s=wait_for_verification_s,
                     trusted_keys=trusted_keys, allow_python=allow_python)
           if isinstance(hub, str) else hub)
    arch = _arch_of(_cuda_device(model, device), arch)
    _, cache, plan = _resolve_all(model, src, policy, arch, dtype, fuse_gated_mlp)
    if mode == "training":
        _pin_backward(plan, cache, src, policy, arch)
    return write_lock(path, src.url, cache, trusted_keys=trusted_keys)


def _pin_backward(plan: list, cache: dict, src, policy: str, arch: str) -> None:
    """Training mode's lock: add to `cache` the hub's answer for the backward kernel of every
    layer of `plan` that has a forward kernel and a backward op (rms_norm_backward at each
    rms_norm (llama, gemma) layer's semantics, dtype and width, silu_mul_backward /
    gelu_tanh_mul_backward at each gated MLP's swapped for silu_mul / gelu_tanh_mul,
    layer_norm_backward at each layer_norm layer's, an activation's backward op at each
    activation's), kernel or reasons."""
    for s, key, res, _, _ in plan:
        bop = BACKWARD_OF.get((s.op, s.semantics)) if s.op in _TRAIN_FORWARDS else None
        if bop and res.kernel is not None:
            bkey = Key(bop, s.semantics, key.dtype, arch, key.cols, policy)
            if bkey not in cache:
                cache[bkey] = _resolve_backward(src, bkey, None)


def unkernelize(model: nn.Module) -> int:
    """Restore the original forwards (and undo `compile=`); returns how many layers were
    restored."""
    from .exact import release_generate_compile, uncompile
    uncompile(model)
    release_generate_compile(model)
    n = 0
    for m in model.modules():
        orig = m.__dict__.get(_ORIG)
        if orig is None:
            continue
        if orig is _NoInstanceForward:
            m.__dict__.pop("forward", None)
        else:
            m.__dict__["forward"] = orig
        for attr in _KZ_STATE:
            m.__dict__.pop(attr, None)
        n += 1
    return n


def launch_counts(model: nn.Module) -> dict[str, int]:
    """For every swapped layer of `model` (by path): how many of its calls so far launched the
    kernel. A layer at 0 has always fallen back to its original forward (the input's dtype,
    device, shape or element count did not fit), so the kernel has not been exercised.
    Only eager calls are counted: calls through torch.compile (and CUDA graph replays) are not."""
    return {path or "<root>": m.__dict__.get(_LAUNCHES, 0) + sum(
                per.__dict__[_LAUNCHES] for per in m.__dict__.get("_kz_dtypes", {}).values() if per)
            for path, m in model.named_modules() if m.__dict__.get(_ORIG) is not None}


# ---- swapping ------------------------------------------------------------------------------

# The swapped forwards are four module-level functions shared by every swapped layer; each
# layer's constants (kernel key, row length, eps, dtype, device) live in its own `__dict__`
# (`_kz`, a tuple). torch.compile then sees the same code in every decoder block, and its
# guards on those constants hold across blocks that share a kernel, so a block compiled once
# serves them all (per-layer closures made dynamo recompile for every block until it gave up).

def _ok(t, want, index) -> bool:
    """t is a tensor the kernel takes: its dtype, its device, no autograd."""
    return (isinstance(t, torch.Tensor) and t.dtype is want and t.get_device() == index
            and not (t.requires_grad and torch.is_grad_enabled()))


def _on(t, want, index) -> bool:
    """t is a tensor of the kernel's dtype on its device (training mode: autograd allowed)."""
    return isinstance(t, torch.Tensor) and t.dtype is want and t.get_device() == index


def _fwd_rms_norm(self, x, *a, **kw):
    key, cols, eps, want, index = self._kz
    w = self._parameters.get("weight")
    if a or kw or not (_ok(x, want, index) and _ok(w, want, index)) or x.shape[-1] != cols:
        return self._kz_orig(x, *a, **kw)
    if torch.compiler.is_compiling():
        return self._kz_op(x, w, eps, key)
    self.__dict__[_LAUNCHES] += 1
    return self._kz_run(self._kz_compiled, x, w, eps)


def _fwd_rms_norm_train(self, x, *a, **kw):
    """Mode "training" with a backward kernel: as `_fwd_rms_norm`, and under autograd one
    autograd node (`training.RmsNormFunction`; while torch.compile traces, the custom op
    `kernelize::rms_norm_train` with its registered backward)."""
    key, cols, eps, want, index = self._kz
    w = self._parameters.get("weight")
    if a or kw or not (_on(x, want, index) and _on(w, want, index)) or x.shape[-1] != cols:
        return self._kz_orig(x, *a, **kw)
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        bk, bkey, label = self._kz_bwd
        if _is_compiling():
            return _training.rms_norm_train_op(x, w, eps, key, bkey)
        self.__dict__[_LAUNCHES] += 1
        return _training.rms_norm_train(x, w, eps, self._kz_run, self._kz_compiled, bk, label)
    if _is_compiling():
        return self._kz_op(x, w, eps, key)
    self.__dict__[_LAUNCHES] += 1
    return self._kz_run(self._kz_compiled, x, w, eps)


def _fwd_layer_norm(self, x, *a, **kw):
    key, cols, _, want, index = self._kz
    w, b = self._parameters.get("weight"), self._parameters.get("bias")
    if (a or kw or not (_ok(x, want, index) and _ok(w, want, index) and _ok(b, want, index))
            or x.shape[-1] != cols):
        return self._kz_orig(x, *a, **kw)
    eps = float(self.eps)
    if torch.compiler.is_compiling():
        return self._kz_op(x, w, b, eps, key)
    self.__dict__[_LAUNCHES] += 1
    return self._kz_run(self._kz_compiled, x, w, b, eps)


def _fwd_layer_norm_train(self, x, *a, **kw):
    """Mode "training" with a backward kernel (layer_norm): as `_fwd_layer_norm`, and under
    autograd one autograd node whose forward is eager's own `native_layer_norm` (it gives the
    mean and rstd the backward kernel reads; the forward kernel is not launched, so not
    counted) and whose backward is the kernel's (`training.LayerNormFunction`; while
    torch.compile traces, the custom op `kernelize::layer_norm_train` with its registered
    backward)."""
    key, cols, _, want, index = self._kz
    w, b = self._parameters.get("weight"), self._parameters.get("bias")
    if (a or kw or not (_on(x, want, index) and _on(w, want, index) and _on(b, want, index))
            or x.shape[-1] != cols):
        return self._kz_orig(x, *a, **kw)
    eps = float(self.eps)
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or b.requires_grad):
        bk, bkey, label = self._kz_bwd
        if _is_compiling():
            return _training.layer_norm_train_op(x, w, b, eps, bkey)[0]
        return _training.layer_norm_train(x, w, b, eps, bk, label)
    if _is_compiling():
        return self._kz_op(x, w, b, eps, key)
    self.__dict__[_LAUNCHES] += 1
    return self._kz_run(self._kz_compiled, x, w, b, eps)


def _fwd_elementwise(self, x, *a, **kw):
    key, _, _, want, index = self._kz
    # `_ok(x, want, index)`, inline
    if (a or kw or not isinstance(x, Tensor) or x.dtype is not want or x.get_device() != index
            or (x.requires_grad and torch.is_grad_enabled())):
        return self._kz_orig(x, *a, **kw)
    if _is_compiling():
        if not _fits(self, x.numel()):
            return self._kz_orig(x)
        return self._kz_op(x, key)
    # Eagerly: one lookup by shape gives the prepared launch (built on the first call of the
    # shape, `_elementwise_launch`), or False where the kernel does not apply.
    preps = self._kz_preps
    prep = preps.get(x.shape)
    if prep is None:
        prep = preps[x.shape] = _elementwise_launch(self, x)
    if prep is False:
        return self._kz_orig(x)
    self.__dict__[_LAUNCHES] += 1
    if prep is True:  # no prepared launch (a Python candidate, no C launcher, no elements)
        return self._kz_run(self._kz_compiled, x)
    # The C launcher's path of `launch.run_elementwise`, inline: it is the whole per-call cost
    # of a layer whose eager counterpart is one aten op.
    p = x.data_ptr()
    if p % _ABI_ALIGNMENT or not x.is_contiguous():  # `L.abi_passable`, inline
        x = L.aligned(x)
        p = x.data_ptr()
    out = _empty_like(x)
    launch, prepared = prep
    res = launch(prepared, _raw_stream(index), out.data_ptr(), p)
    if res:
        self._kz_compiled.failed(res)
    return out


def _fwd_elementwise_train(self, x, *a, **kw):
    """Mode "training" with a backward kernel (silu, gelu, gelu_tanh): as `_fwd_elementwise`,
    and under autograd one autograd node (`training.ActivationFunction`: the forward launch,
    then the backward kernel on (dy, x); while torch.compile traces, the custom op
    `kernelize::<op>_train` with its registered backward), on an element count both kernels
    take (else the original forward)."""
    key, _, _, want, index = self._kz
    if a or kw or not _on(x, want, index):
        return self._kz_orig(x, *a, **kw)
    if not (torch.is_grad_enabled() and x.requires_grad):
        return _fwd_elementwise(self, x)
    if not _fits_train(self, x.numel()):
        return self._kz_orig(x)
    bk, bkey, label = self._kz_bwd
    op = self._kz_swap[0]
    if _is_compiling():
        return _training.ACTIVATION_TRAIN_OPS[op](x, key, bkey)
    self.__dict__[_LAUNCHES] += 1
    return _training.activation_train(op, x, self._kz_run, self._kz_compiled, bk, label)


def _fits_train(self, n: int) -> bool:
    """Whether `n` elements are within both the forward and the backward kernel's constraints
    (kept per count)."""
    fits = self._kz_fits
    fit = fits.get(("train", n))
    if fit is None:
        fit = fits[("train", n)] = n > 0 and _fits(self, n) and not not_applicable(
            self._kernelize_backward.manifest, n, None)
    return fit


def _fits(self, n: int) -> bool:
    """Whether `n` elements are within the kernel's constraints (kept per count)."""
    fits = self._kz_fits
    fit = fits.get(n)
    if fit is None:
        fit = fits[n] = not not_applicable(self._kernelize_kernel.manifest, n, None)
    return fit


def _elementwise_launch(self, x) -> Any:
    """What `_fwd_elementwise` keeps for x's shape: False where the kernel does not apply to
    its element count; (C launcher's launch, prepared arguments) for the inline launch; True
    for the runner's path."""
    n = x.numel()
    if not _fits(self, n):
        return False
    k = self._kz_compiled
    cols = x.shape[-1] if x.dim() else 1
    prepared = getattr(k, "prepared", None)
    prep = prepared(n // cols, cols, 2, (n,)) if n and prepared is not None else None
    return (k.stub_launch, prep) if prep is not None else True


_is_compiling = torch.compiler.is_compiling
_empty_like = torch.empty_like
_raw_stream = L.current_stream_fn()


def _fwd_gated(self, x, *a, **kw):
    """A gated MLP: the kernel replaces act(gate_proj(x)) * up_proj(x). silu_mul and
    gelu_tanh_mul take the two tensors as they are; silu_and_mul's runner concatenates them."""
    key, cols, _, want, index = self._kz
    if a or kw or not (_ok(x, want, index) and _ok(self.gate_proj.weight, want, index)
                       and _ok(self.up_proj.weight, want, index)):
        return self._kz_orig(x, *a, **kw)
    return _gated(self, x, key, cols, want, None)


def _fwd_gated_train(self, x, *a, **kw):
    """Mode "training" with a backward kernel (silu_mul, gelu_tanh_mul): as `_fwd_gated`, and
    under autograd act_fn(gate) * up is one autograd node between gate_proj / up_proj and
    down_proj (`training.GatedMulFunction`; while torch.compile traces, the custom op
    `kernelize::<op>_train` with its registered backward)."""
    key, cols, _, want, index = self._kz
    if a or kw or not (_on(x, want, index) and _on(self.gate_proj.weight, want, index)
                       and _on(self.up_proj.weight, want, index)):
        return self._kz_orig(x, *a, **kw)
    return _gated(self, x, key, cols, want, self._kz_bwd)


def _gated(self, x, key, cols, want, bwd) -> Tensor:
    """down_proj(kernel(gate_proj(x), up_proj(x))); with `bwd` (training mode's backward kernel)
    under autograd through the training node, else the forward launch (no gradient needed)."""
    g = self.gate_proj(x)
    u = self.up_proj(x)
    if g.dtype != want or u.dtype != want or g.shape != u.shape or g.shape[-1] != cols:
        return self.down_proj(self.act_fn(g) * u)
    if bwd is not None and torch.is_grad_enabled() and (g.requires_grad or u.requires_grad):
        bk, bkey, label = bwd
        op = self._kz_swap[0]
        if _is_compiling():
            return self.down_proj(_training.GATED_TRAIN_OPS[op](g, u, key, bkey))
        self.__dict__[_LAUNCHES] += 1
        return self.down_proj(_training.gated_train(op, g, u, self._kz_run, self._kz_compiled,
                                                    bk, label))
    if _is_compiling():
        return self.down_proj(self._kz_op(g, u, key))
    self.__dict__[_LAUNCHES] += 1
    return self.down_proj(self._kz_run(self._kz_compiled, g, u))


_FORWARDS = {
    "rms_norm": _fwd_rms_norm,
    "layer_norm": _fwd_layer_norm,
    "silu": _fwd_elementwise,
    "gelu": _fwd_elementwise,
    "gelu_tanh": _fwd_elementwise,
    "silu_and_mul": _fwd_gated,
    "silu_mul": _fwd_gated,
    "gelu_tanh_mul": _fwd_gated,
}
#: Mode "training": a swapped layer's forward once it has a backward kernel (`_install_training`).
_TRAIN_FORWARDS = {"rms_norm": _fwd_rms_norm_train, "layer_norm": _fwd_layer_norm_train,
                   **{op: _fwd_gated_train for op in _training.GATED_FORMULAS},
                   **{op: _fwd_elementwise_train for op in _training.ACTIVATION_FORMULAS}}
_KZ_ATTRS = ("_kz", "_kz_orig", "_kz_op", "_kz_run", "_kz_compiled", "_kz_fits", "_kz_preps")


class _Prepared(dict):
    """A swapped elementwise layer's prepared launches by input shape (ctypes argument arrays
    refilled on every call): a copied model starts with none and prepares its own."""

    def __copy__(self) -> "_Prepared":
        return _Prepared()

    def __deepcopy__(self, memo: dict) -> "_Prepared":
        return _Prepared()


def _stand_in_run(op, key):
    def run(_compiled, *args):
        return op(*args, key)
    return run


def _patch(site: Site, k: Resolved, device: torch.device, allow_python: bool = False) -> None:
    """Swap `site.module`'s forward for the op's shared forward (above): on inputs the kernel
    takes it launches the kernel (eagerly: directly, `launch.RUNNERS`, no dispatcher round
    trip; while torch.compile traces: through the op's custom op, `ops.py`, one opaque node of
    the graph, capturable in a CUDA graph), on any other input it runs the original forward."""
    if site.op not in _FORWARDS:  # pragma: no cover
        raise ValueError(site.op)
    # nn.RMSNorm(eps=None): F.rms_norm takes the opmath type's epsilon (f32)
    eps = float(site.eps if site.eps is not None else torch.finfo(torch.float32).eps) \
        if site.op == "rms_norm" else 0.0
    m = site.module
    _install(m, k, (site.op, site.dtype, site.cols, eps, str(device), allow_python),
             m.__dict__.get("forward", _NoInstanceForward))


def _install(m: nn.Module, k: Resolved, swap: tuple, prior: Any) -> None:
    """Load `k` for `swap` = (op, dtype, cols, eps, device, allow_python) and put the swapped
    forward on `m`; `prior`: m's own instance `forward` before, or `_NoInstanceForward`."""
    d = m.__dict__
    d.update(_loaded(k, swap, _orig_forward(m, prior)))
    d[_ORIG] = prior
    d["__getstate__"] = types.MethodType(_getstate, m)
    d["forward"] = types.MethodType(_FORWARDS[swap[0]], m)


def _orig_forward(m: nn.Module, prior: Any) -> Any:
    return types.MethodType(type(m).forward, m) if prior is _NoInstanceForward else prior


def _loaded(k: Resolved, swap: tuple, orig_forward: Any) -> dict[str, Any]:
    """What a swapped forward reads from its layer: `k` loaded for `swap`, its custom op, key,
    runner and constants."""
    op_name, dtype, cols, eps, device, allow_python = swap
    want = DTYPE_OF_NAME[dtype]
    # Only a Python candidate needs the opt-in passed on (the CUDA call stays as it was).
    opt_in = {"allow_python": allow_python} if L.is_python(k.manifest) else {}
    compiled = L.compiled(k.digest, k.manifest, k.source, dtype, torch.device(device), **opt_in)
    dev = compiled.device   # a CUDA device (the kernel was loaded there)
    key = ops.register(compiled)
    op = ops.op(op_name)
    # A stand-in `compiled` (CPU tests) always takes the op's registered implementation.
    run = (L.RUNNERS[op_name] if isinstance(compiled, (L.CompiledKernel, L.PythonKernel))
           else _stand_in_run(op, key))
    index = dev.index if dev.type == "cuda" else -1  # Tensor.get_device(): -1 on the CPU
    return {"_kernelize_kernel": k, _LAUNCHES: 0, "_kz": (key, cols, eps, want, index),
            "_kz_orig": orig_forward, "_kz_op": op, "_kz_run": run, "_kz_compiled": compiled,
            "_kz_fits": {}, "_kz_preps": _Prepared(),
            "_kz_swap": (op_name, dtype, cols, eps, str(dev), allow_python)}


# ---- a parameterless layer takes the dtype of its calls --------------------------------------
#
# nn.SiLU() alone has no parameter to say its dtype: it is resolved for bf16, f16 and f32
# (`_resolve_all`) and swapped for all three at once. Its forward keeps, per dtype of its calls,
# the kernel loaded for that dtype (an object with what the shared elementwise forward reads
# from a swapped layer, `_ByDtype`), loaded at the first eager call in the dtype; a dtype with
# no kernel (none qualified, another dtype such as float64, or it failed to load) runs the
# original forward, and the `kernelize` logger says so once per layer and dtype.

class _ByDtype:
    """One dtype's loaded kernel of a layer swapped by the dtype of its calls."""


def _install_by_call(m: nn.Module, kernels: dict[str, Any], swap: tuple, prior: Any,
                     backward: dict[str, Resolved] | None = None) -> None:
    """`kernels`: dtype -> the Resolved kernel, or the reasons none is taken; `backward` (mode
    "training"): dtype -> the Resolved backward kernel its calls under autograd take."""
    d = m.__dict__
    if backward:
        d["_kz_by_call_bwd"] = dict(backward)
    d.update(_kernelize_kernel={dt: k for dt, k in kernels.items() if isinstance(k, Resolved)},
             _kz_orig=_orig_forward(m, prior), _kz_swap=swap, _kz_by_call=dict(kernels),
             _kz_dtypes={})
    d[_LAUNCHES] = 0
    d[_ORIG] = prior
    d["__getstate__"] = types.MethodType(_getstate, m)
    d["forward"] = types.MethodType(_fwd_by_call, m)


def _fwd_by_call(self, x, *a, **kw):
    per = self._kz_dtypes.get(x.dtype) if isinstance(x, Tensor) else False
    if per is None:
        if _is_compiling():   # loaded eagerly only (call once in the dtype before compiling)
            return self._kz_orig(x, *a, **kw)
        per = self._kz_dtypes[x.dtype] = _load_by_call(self, x.dtype)
    if per is False:
        return self._kz_orig(x, *a, **kw)
    if "_kz_bwd" in per.__dict__:   # mode "training" with a backward kernel in this dtype
        return _fwd_elementwise_train(per, x, *a, **kw)
    return _fwd_elementwise(per, x, *a, **kw)


def _load_by_call(m: nn.Module, dtype: torch.dtype) -> Any:
    """`m`'s kernel for calls in `dtype` (a `_ByDtype`), or False (said once) where none runs."""
    op, _, cols, eps, device, allow_python = m._kz_swap
    dt = TORCH_DTYPES.get(dtype)
    k = m._kz_by_call.get(dt) if dt else [f"{dtype} is not bf16, f16 or f32"]
    if isinstance(k, Resolved):
        try:
            per = _ByDtype()
            per.__dict__.update(_loaded(k, (op, dt, cols, eps, device, allow_python), m._kz_orig))
        except Exception as e:  # noqa: BLE001 (any failure: the original forward, said once)
            k = [f"{k.label} could not be loaded ({type(e).__name__}: {e})"]
        else:
            bwd = m.__dict__.get("_kz_by_call_bwd", {}).get(dt)
            if bwd is not None:
                try:
                    bk = _training.compiled_backward(bwd.digest, bwd.manifest, bwd.source, dt,
                                                     per._kz_compiled.device)
                    per.__dict__.update(_kz_bwd=(bk, ops.register(bk), bwd.label),
                                        _kernelize_backward=bwd)
                except Exception as e:  # noqa: BLE001 (the forward kernel stays; said once)
                    log.warning("kernelize: %s [%s] called in %s: its backward kernel %s could "
                                "not be loaded (%s); its calls in %s under autograd run its "
                                "original forward", type(m).__name__, op, dt, bwd.label,
                                f"{type(e).__name__}: {e}", dt)
            return per
    log.warning("kernelize: %s [%s] called in %s: no kernel (%s); its calls in %s run its "
                "original forward", type(m).__name__, op, dt or dtype, "; ".join(k) or "none qualified",
                dt or dtype)
    return False


# ---- copying and pickling a swapped layer ------------------------------------------------
#
# A swapped layer holds a loaded kernel (a process-wide resource: CUDA driver handles, a key in
# `ops`' table of this process), so it is pickled without it: its instance `__getstate__`
# (`_getstate`, found by pickle and copy before the class's) leaves kernelize's attributes out
# and puts a `_Reswap` where its `forward` is. Unpickling a `_Reswap` loads the kernel again in
# the loading process from the manifest and source the layer carries (digest checked again)
# and gives the swapped forward back; where that fails (no CUDA there, another device count),
# the layer runs its original forward and a warning says why, once per kernel and reason.
# copy.deepcopy (`_Reswap.__deepcopy__`): the copy shares the loaded kernel (`SharedOnCopy`)
# and prepares its own launches (`_Prepared`).

_KZ_STATE = (_ORIG, "_kernelize_kernel", _LAUNCHES, "_kz_swap", "__getstate__", "_kz_by_call",
             "_kz_dtypes", "_kz_bwd", "_kernelize_backward", "_kz_by_call_bwd", *_KZ_ATTRS)


class _NoInstanceForward:
    """`_ORIG` of a layer whose forward was its class's (a class: copies and pickles as itself)."""


def _getstate(self: nn.Module) -> dict:
    state = {k: v for k, v in self.__dict__.items() if k not in _KZ_STATE}
    state["forward"] = _Reswap(self)
    return state


class _Reswap:
    """A swapped layer's `forward` in its pickled (or copied) state; see above."""

    def __init__(self, m: nn.Module):
        self.m = m

    def __reduce__(self):
        d = self.m.__dict__
        if "_kz_by_call" in d:   # loaded at the first call in each dtype, as before
            return (_install_by_call_again, (self.m, d["_kz_by_call"], d["_kz_swap"], d[_ORIG],
                                             d.get("_kz_by_call_bwd")))
        return (_reswap, (self.m, d["_kernelize_kernel"], d["_kz_swap"], d[_ORIG],
                          d.get("_kernelize_backward")))

    def __deepcopy__(self, memo: dict):
        y, d = memo[id(self.m)], self.m.__dict__
        for name in _KZ_STATE:
            if name in d:
                y.__dict__[name] = copy.deepcopy(d[name], memo)
        return copy.deepcopy(d["forward"], memo)

    def __call__(self, *a, **kw):  # a shallow copy (copy.copy) calls through the original
        return self.m.forward(*a, **kw)


_LOAD_WARNED: set[tuple] = set()


def _reswap(m: nn.Module, k: Resolved, swap: tuple, prior: Any,
            backward: Resolved | None = None) -> Any:
    """Unpickling a swapped layer (before its state is set): load its kernel here and return
    its swapped forward; where it cannot be loaded, its original forward, with a warning. A
    training-mode layer's backward kernel is loaded again too; where it cannot be, the layer
    runs its original forward under autograd (with a warning)."""
    try:
        check_digest(k.manifest, k.source, k.digest, f"{k.label} carried by a pickled layer")
        _install(m, k, swap, prior)
    except Exception as e:  # noqa: BLE001 (any failure: the layer runs its original forward)
        why = f"{type(e).__name__}: {e}"
        if (k.digest, swap, why) not in _LOAD_WARNED:
            _LOAD_WARNED.add((k.digest, swap, why))
            log.warning("kernelize: a loaded %s keeps its original forward: %s (%s, %s) could "
                        "not be loaded here (%s); later layers with this kernel: the same",
                        type(m).__name__, k.label, swap[0], swap[1], why)
        return _orig_forward(m, prior)
    if backward is not None:
        try:
            check_digest(backward.manifest, backward.source, backward.digest,
                         f"{backward.label} carried by a pickled layer")
            bk = _training.compiled_backward(backward.digest, backward.manifest, backward.source,
                                             swap[1], m.__dict__["_kz_compiled"].device)
            _install_training(m, backward, bk)
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {e}"
            if (backward.digest, swap, why) not in _LOAD_WARNED:
                _LOAD_WARNED.add((backward.digest, swap, why))
                log.warning("kernelize: a loaded %s runs its original forward under autograd: "
                            "its backward kernel %s could not be loaded here (%s)",
                            type(m).__name__, backward.label, why)
    return m.__dict__["forward"]


def _install_by_call_again(m: nn.Module, kernels: dict[str, Any], swap: tuple, prior: Any,
                           backward: dict[str, Resolved] | None = None) -> Any:
    """Unpickling a layer swapped by the dtype of its calls: the digests checked again now (a
    training-mode layer's backward kernels' too: one that fails is dropped, with a warning, and
    its calls under autograd run the original forward), the kernels loaded at the first call in
    each dtype."""
    kernels = dict(kernels)
    for dt, k in kernels.items():
        if isinstance(k, Resolved):
            try:
                check_digest(k.manifest, k.source, k.digest, f"{k.label} carried by a pickled layer")
            except Exception as e:  # noqa: BLE001
                kernels[dt] = [f"{type(e).__name__}: {e}"]
    backward = dict(backward or {})
    for dt, k in list(backward.items()):
        try:
            check_digest(k.manifest, k.source, k.digest, f"{k.label} carried by a pickled layer")
        except Exception as e:  # noqa: BLE001
            del backward[dt]
            log.warning("kernelize: a loaded %s runs its original forward under autograd in %s: "
                        "its backward kernel %s (%s)", type(m).__name__, dt, k.label,
                        f"{type(e).__name__}: {e}")
    _install_by_call(m, kernels, swap, prior, backward)
    return m.__dict__["forward"]
