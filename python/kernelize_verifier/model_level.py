"""Model-level measurement of one kernel: the logits of small real models, eager and with the
kernel substituted for every matching layer (docs/spec.md section 3, "model level").

The Rust verifier (`kernelize verify KERNEL_DIR --model DIR ...`) runs this as a child process
and computes the metrics (max logit abs diff, argmax match, top-5 overlap, KL) from the files
it writes:

    python3 -m kernelize_verifier.model_level --kernel KERNEL_DIR
        --model MODEL_DIR [--model MODEL_DIR2 ...]
        --dtype bf16[,f16,f32] --text EVAL_TEXT_FILE --out-dir OUT_DIR
        [--device cuda] [--max-tokens 512] [--arch sm_90] [--dry-run]
        [--package-dir DIR ...] [--require-network-isolation]

It is the verifier's program, not part of the client package: it lives in `kernelize_verifier`
(beside `kernelize` in the repository's python/ folder, which the verifier puts on the path:
`--python-path` / `KERNELIZE_PYTHONPATH`) and imports the client (`kernelize`) on purpose, so
that a kernel is measured through the same discovery and launch path a user's model takes.

For each model x dtype: load the model (transformers `AutoModelForCausalLM`) in that dtype,
adapt it so that its layers compute the kernel's op and semantics where a clean equivalent
exists (`adapt_model`), run one forward with the eager layers, kernelize it with only this
kernel, run the same forward again, unkernelize, and run eager once more (which checks that
eager is deterministic and that unkernelize restored it). The baseline is the *adapted* model,
so the two runs differ only by the substituted kernel.

OUT_DIR/<model_name>.<dtype>.safetensors holds `input_ids` (int64 [T]), `eager_logits` and
`candidate_logits` (float32 [T, V], widened exactly from the model dtype); OUT_DIR/summary.json
says what ran, what was replaced, how the model was adapted, and which models were skipped
(no layer matching the kernel; never an error). Exit status: 0 when summary.json was written,
2 for bad arguments, 1 for any other failure (one paragraph on stderr: what failed, how to fix
it). Progress goes to stderr; stdout stays empty.

`--dry-run` does everything but the launch (no CUDA needed with `--device cpu --arch sm_90`):
it loads, adapts, runs the eager forward and reports what would be replaced, writing
summary.json without logits. The CPU tests use it; the product path always launches.

A Python candidate (docs/spec.md section 2b, `runtime = "python"` in kernel.toml) is measured the same way: its
`.py` source is loaded once per dtype (`pykernel.PythonKernel`) and its function is called in
place of every matching layer's forward (the same matching and adaptation as a CUDA kernel's).
`--package-dir DIR` (repeatable) puts folders of the packages it imports first on `sys.path`
(before torch is imported); summary.json then says which versions ran and what isolation the
process found itself in (`python`). `--require-network-isolation` refuses to load the candidate
unless this process has a network namespace of its own (the verifier starts it in one where the
kernel allows it: verifier/src/model.rs). Being PyTorch code, a Python candidate also runs on the
CPU (`--device cpu --arch sm_90` without `--dry-run`), which the CPU tests use.

A backward op's model level is training, not logits (docs/backward.md, item 9): for a Python
candidate of a backward op, each model x dtype trains three copies with AdamW on `--train-steps`
batches of windows of the text's tokens: eager; a control whose layers of the op's forward run
eager's forward and eager's own gradients of the op through an autograd.Function; the candidate's,
whose layers run the candidate as their backward (`training_level.compare_candidate`, as
scripts/training_check.py --backward-candidate). summary.json's `training` lists, per model and
dtype, the loss steps, gradient steps and parameter elements whose bits differ from eager's,
for the candidate and the control. A CUDA backward kernel's training is not run here yet.

Tokenizer convention: a config.json with `"kernelize_tokenizer": "bytes"` (the models in
models/) means token ids are the UTF-8 bytes of the text (vocab 256); otherwise the model
folder's own tokenizer (`AutoTokenizer`) is used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HARNESS_VERSION = 1
DTYPES = ("bf16", "f16", "f32")
MEASURABLE_OPS = ("rms_norm", "layer_norm", "silu", "silu_and_mul", "silu_mul", "gelu",
                  "gelu_tanh", "gelu_tanh_mul")
FUSED_ADD_REASON = (
    "{op} is not applicable to model-level measurement yet: the residual add that the kernel "
    "fuses happens inside the decoder layer's forward (HF Llama, GPT-2), not in a module that "
    "kernelize can swap, so no layer of any model matches this op (exact compile fuses it in the "
    "compiled graph)")


class HarnessError(Exception):
    """A failure with a message that says what failed and how to fix it (exit status 1)."""


def log(msg: str) -> None:
    print(f"harness: {msg}", file=sys.stderr, flush=True)


# ---- tokens ---------------------------------------------------------------------------------

def byte_ids(text: str) -> list[int]:
    """The byte-level convention of the shipped models: one token per UTF-8 byte."""
    return list(text.encode("utf-8"))


def read_config(model_dir: Path) -> dict[str, Any]:
    if not model_dir.is_dir():
        raise HarnessError(f"model folder {model_dir} not found. Give a folder written by "
                           "transformers' save_pretrained (config.json + weights); the shipped "
                           "models are trained into models/ with `python3 models/train.py --out "
                           "models` on a GPU machine.")
    cfg = model_dir / "config.json"
    if not cfg.is_file():
        raise HarnessError(f"model folder {model_dir} has no config.json, so it is not a "
                           "transformers checkpoint. Save the model with "
                           "model.save_pretrained(DIR) (or train the shipped ones with "
                           "`python3 models/train.py --out models`).")
    try:
        return json.loads(cfg.read_text(encoding="utf-8"))
    except ValueError as e:
        raise HarnessError(f"{cfg} is not valid JSON ({e}); re-save the model.") from None


def tokenize(model_dir: Path, config: dict[str, Any], text: str) -> tuple[list[int], str]:
    """(token ids, what tokenised them)."""
    conv = config.get("kernelize_tokenizer")
    if conv == "bytes":
        vocab = int(config.get("vocab_size", 0))
        if vocab < 256:
            raise HarnessError(f"{model_dir}/config.json says kernelize_tokenizer=bytes but "
                               f"vocab_size is {vocab}; byte tokens need at least 256.")
        return byte_ids(text), "bytes (UTF-8, kernelize_tokenizer)"
    if conv is not None:
        raise HarnessError(f"{model_dir}/config.json: kernelize_tokenizer={conv!r} is not "
                           "known; the only convention is \"bytes\" (or leave it out to use the "
                           "folder's own tokenizer).")
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as e:  # noqa: BLE001 - transformers raises several types here
        raise HarnessError(
            f"model folder {model_dir} has no usable tokenizer ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}). Save one next to the weights "
            "(tokenizer.save_pretrained(DIR)), or, for a byte-level model with vocab_size >= "
            "256, add \"kernelize_tokenizer\": \"bytes\" to its config.json.") from None
    return list(tok(text)["input_ids"]), f"AutoTokenizer ({type(tok).__name__})"


def max_positions(config: dict[str, Any]) -> int | None:
    for k in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = config.get(k)
        if isinstance(v, int) and v > 0:
            return v
    return None


# ---- loading --------------------------------------------------------------------------------

def torch_dtype(name: str):
    import torch
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def load_model(model_dir: Path, dtype: str, device, training: bool = False):
    """`AutoModelForCausalLM.from_pretrained` in `dtype` on `device`, in eval mode (`training`:
    in training mode with HF's eager attention, whose gradients repeat bit for bit).
    transformers >= 4.56 names the argument `dtype` (`torch_dtype` before)."""
    import transformers
    dt = torch_dtype(dtype)
    kw = ({"dtype": dt} if _version_tuple(transformers.__version__) >= (4, 56)
          else {"torch_dtype": dt})
    if training:
        kw["attn_implementation"] = "eager"
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), **kw)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HarnessError(
            f"cannot load {model_dir} with AutoModelForCausalLM: {first}. If its weights are "
            "missing (the shipped models' weights come from a GPU run), train them with "
            "`python3 models/train.py --out models` on a GPU machine.") from None
    model = model.to(device=device, dtype=dt)
    return model.train() if training else model.eval()


# ---- adapting a model to the kernel's semantics ---------------------------------------------

def _set_submodule(model, path: str, new) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, new)


def _llama_rmsnorm_cls():
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        return LlamaRMSNorm
    except ImportError:
        return _fallback_classes()[0]


def _gemma_rmsnorm_cls():
    try:
        from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
        return GemmaRMSNorm
    except ImportError:
        return _fallback_classes()[1]


_FALLBACKS: tuple | None = None


def _fallback_classes():
    """Stand-ins with HF's formulas, for a transformers without these classes."""
    global _FALLBACKS
    if _FALLBACKS is None:
        import torch
        from torch import nn

        class KernelizeLlamaRMSNorm(nn.Module):
            def __init__(self, hidden_size: int, eps: float = 1e-6):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(hidden_size))
                self.variance_epsilon = eps

            def forward(self, x):
                dt = x.dtype
                xf = x.float()
                xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
                return self.weight * xf.to(dt)

        class KernelizeGemmaRMSNorm(nn.Module):
            def __init__(self, dim: int, eps: float = 1e-6):
                super().__init__()
                self.eps = eps
                self.weight = nn.Parameter(torch.zeros(dim))

            def forward(self, x):
                xf = x.float()
                out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
                return (out * (1.0 + self.weight.float())).type_as(x)

        _FALLBACKS = (KernelizeLlamaRMSNorm, KernelizeGemmaRMSNorm)
    return _FALLBACKS


def _rmsnorm_like(semantics: str, cols: int, eps: float | None, scale, like):
    """A fresh RMSNorm of `semantics` whose effective scale (w, or 1 + w for gemma) is `scale`
    (f32), with `like`'s dtype and device. For bf16/f16 weights in [0.5, 2] (trained norms)
    w - 1 is exact, so only the rounding points of the formula change."""
    import torch
    from torch import nn
    e = eps if eps is not None else torch.finfo(torch.float32).eps
    if semantics == "llama":
        m, w, label = _llama_rmsnorm_cls()(cols, eps=e), scale, None
    elif semantics == "gemma":
        m, w, label = _gemma_rmsnorm_cls()(cols, eps=e), scale - 1.0, "weight w - 1"
    elif semantics == "torch":
        m, w, label = nn.RMSNorm(cols, eps=eps, elementwise_affine=True), scale, None
    else:  # pragma: no cover - semantics come from the checked manifest
        raise ValueError(semantics)
    m = m.to(device=like.device, dtype=like.dtype)
    with torch.no_grad():
        m.weight.copy_(w.to(like.dtype))
    return m, label


@dataclass
class Adaptation:
    """How the model was changed before measuring (the eager baseline is this model)."""
    notes: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    fuse_gated_mlp: bool = True

    def describe(self) -> str:
        return "; ".join(self.notes) if self.notes else "none (the model as saved)"


def adapt_model(model, op: str, semantics: str) -> Adaptation:
    """Change `model` in place so that its layers compute `op` (`semantics`) where a clean
    equivalent exists:

    - rms_norm: every RMSNorm of another semantics becomes an equivalent RMSNorm of this one
      with the same effective scale (llama: HF LlamaRMSNorm; gemma: HF GemmaRMSNorm with
      weight w - 1, i.e. x * rsqrt(..) * (1 + (w - 1)); torch: nn.RMSNorm with weight w) and
      the same eps: the same function up to the formula's rounding points.
    - gelu / gelu_tanh: every GELU-family activation (GELUActivation, GELUTanh, GPT-2's
      NewGELUActivation, ...) that does not already compute eager F.gelu with this
      approximation becomes nn.GELU(approximate="none" / "tanh").
    - silu, gelu_tanh: gated MLPs are left unfused, so that the activation kernel replaces the
      act_fn of each MLP with that activation (kernelize would otherwise see a silu_mul /
      gelu_tanh_mul site there).
    - layer_norm, silu_and_mul, silu_mul, gelu_tanh_mul: nothing to change (a silu_and_mul
      kernel replaces a gated SiLU MLP as the fallback of its silu_mul site).
    """
    from torch import nn

    from kernelize.discover import GATED_OPS, discover
    ad = Adaptation(fuse_gated_mlp=op not in GATED_OPS)
    if not ad.fuse_gated_mlp:
        gated = [s.path for s in discover(model).sites if s.op == GATED_OPS[op]]
        if gated:
            ad.notes.append(f"{len(gated)} gated MLP(s) not fused: the {op} kernel replaces "
                            "each MLP's act_fn")
    found = discover(model, fuse_gated_mlp=ad.fuse_gated_mlp)
    converted: dict[str, list[str]] = {}
    if op == "rms_norm":
        for s in found.sites:
            if s.op != "rms_norm" or s.semantics == semantics:
                continue
            w = s.module.weight.detach().float()
            scale = w + 1.0 if s.semantics == "gemma" else w
            new, how = _rmsnorm_like(semantics, s.cols, s.eps, scale, s.module.weight)
            _set_submodule(model, s.path, new)
            key = (f"{_cls_label(s.module)} -> {_cls_label(new)} ({how or 'same weights'}, "
                   f"eps {s.eps}; the same function up to rounding)")
            converted.setdefault(key, []).append(s.path)
    elif op in ("gelu", "gelu_tanh"):
        approx = "tanh" if op == "gelu_tanh" else "none"
        targets = [(s.path, type(s.module).__name__) for s in found.sites
                   if s.op in ("gelu", "gelu_tanh") and s.op != op]
        targets += [(sk.path, sk.cls) for sk in found.skipped if "gelu" in sk.cls.lower()]
        for path, cls in targets:
            _set_submodule(model, path, nn.GELU(approximate=approx))
            key = f"{cls} -> nn.GELU(approximate='{approx}')"
            converted.setdefault(key, []).append(path)
    for key, paths in converted.items():
        ad.notes.append(f"{len(paths)} x {key}")
        ad.paths.extend(paths)
    return ad


def _cls_label(m) -> str:
    return ("nn." if type(m).__module__.startswith("torch.nn") else "") + type(m).__name__


def _site_summary(found) -> str:
    counts: dict[str, int] = {}
    for s in found.sites:
        k = s.op + (f" ({s.semantics})" if s.semantics != "default" else "")
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())) or "nothing kernelize recognises"


# ---- one model x dtype ----------------------------------------------------------------------

@dataclass
class Kernel:
    dir: Path
    manifest: dict[str, Any]
    digest: str
    source: str = ""

    @property
    def is_python(self) -> bool:
        return self.manifest.get("runtime", "cuda") == "python"

    @property
    def op(self) -> str:
        return self.manifest["op"]

    @property
    def semantics(self) -> str:
        return self.manifest["semantics"]

    @property
    def label(self) -> str:
        sem = f" ({self.semantics})" if self.semantics != "default" else ""
        return f"{self.manifest['name']} {self.manifest['version']}: {self.op}{sem}"


def load_kernel(path: Path) -> Kernel:
    from kernelize.sources import DirSource
    if not (path / "kernel.toml").is_file():
        raise HarnessError(f"--kernel {path}: no kernel.toml there. Give one kernel folder "
                           "(kernel.toml + its .cu source), e.g. kernels/rms_norm_llama.")
    try:
        src = DirSource(path)
    except (ValueError, OSError) as e:
        raise HarnessError(f"--kernel {path}: {e}. Fix the manifest or source (`kernelize "
                           "verify` reports the same problems).") from None
    manifest, source, digest = src.kernels[0]
    return Kernel(path, manifest, digest, source)


def _declared_runtime(path: Path) -> str:
    """The runtime kernel.toml declares ("cuda" when it cannot be read: loading it later says
    why)."""
    try:
        import tomllib
        with open(path / "kernel.toml", "rb") as f:
            return str(tomllib.load(f).get("runtime", "cuda"))
    except Exception:  # noqa: BLE001 - only a hint for argument checks
        return "cuda"


def isolation_lines(confinement: Path | None) -> list[str]:
    """What isolation this process has, by the verifier's confinement check
    (verifier/src/confinement.py, the case runner's too), which the verifier writes and names
    with `--confinement FILE`; without it, unknown."""
    directory = f"working directory {os.getcwd()}"
    if confinement is None:
        return ["unknown: no confinement check was given (--confinement FILE)", directory]
    import importlib.util
    spec = importlib.util.spec_from_file_location("kernelize_confinement", confinement)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.isolation(directory)


def load_python_candidate(kernel: Kernel, dtypes: list[str], device, require_isolation: bool,
                          confinement: Path | None = None) -> dict[str, Any]:
    """Import a Python candidate's source once per dtype (the objects kernelize swaps in later,
    from launch's cache) and say what ran: interpreter, torch, each required package's installed
    version ("missing" when absent) and the isolation found."""
    import torch

    from kernelize import launch
    from kernelize.pykernel import package_versions
    isolation = isolation_lines(confinement)
    if require_isolation and not isolation[0].startswith("isolated"):
        raise HarnessError(f"--require-network-isolation: this process is {isolation[0]}; "
                           "refusing to run the Python candidate's code. Run it where "
                           "unprivileged user namespaces are allowed, or drop the flag.")
    from kernelize.manifest import BACKWARD_OPS
    packages = package_versions(kernel.manifest)
    for dtype in dtypes:
        if dtype not in kernel.manifest["entries"] or kernel.op in BACKWARD_OPS:
            continue   # (a backward candidate's module is loaded by backward_field.load)
        try:
            launch.compiled(kernel.digest, kernel.manifest, kernel.source, dtype, device,
                            allow_python=True)
        except Exception as e:  # noqa: BLE001 - anything the source raises is the candidate's
            missing = [k for k, v in packages.items() if v == "missing"]
            raise HarnessError(
                f"importing the Python candidate {kernel.manifest['name']} ({dtype}) failed: "
                f"{type(e).__name__}: {e}"
                + (f". Not installed here: {', '.join(missing)}; install them into a folder "
                   "(pip install --no-deps --target DIR WHEEL) and pass --package-dir DIR "
                   "(kernelize verify: --candidate-packages DIR)" if missing else "")) from None
    return {"python": sys.version.split()[0], "torch": torch.__version__,
            "packages": packages, "isolation": isolation}


def _forward_logits(model, ids):
    import torch
    with torch.no_grad():
        out = model(input_ids=ids[None], use_cache=False)
    return out.logits[0].float().cpu()


def measure(kernel: Kernel, model_dir: Path, dtype: str, text: str, args, device,
            arch: str) -> tuple[dict | None, dict | None]:
    """(run entry, None) or (None, skipped entry) for one model x dtype."""
    import torch

    from kernelize import core
    from kernelize.discover import discover
    from kernelize.manifest import FUSED_ADD
    t0 = time.perf_counter()
    name = model_dir.name
    skip = lambda reason: (None, {"model_name": name, "model_dir": str(model_dir),  # noqa: E731
                                  "dtype": dtype, "reason": reason})
    config = read_config(model_dir)
    if kernel.op in FUSED_ADD.values():
        return skip(FUSED_ADD_REASON.format(op=kernel.op))
    ids_list, tok_label = tokenize(model_dir, config, text)
    limit = args.max_tokens
    if (mp := max_positions(config)) is not None:
        limit = min(limit, mp)
    ids_list = ids_list[:limit]
    if len(ids_list) < 2:
        raise HarnessError(f"the text gives {len(ids_list)} token(s) for {name}; at least 2 "
                           "are needed (give a longer --text).")
    model = load_model(model_dir, dtype, device)
    ad = adapt_model(model, kernel.op, kernel.semantics)
    found = discover(model, fuse_gated_mlp=ad.fuse_gated_mlp)
    matching = [s for s in found.sites
                if any(c.op == kernel.op and c.semantics == kernel.semantics
                       for c in (s, *s.alternatives))]
    if not matching:
        return skip(f"no layer of {name} computes {kernel.op}"
                    + (f" ({kernel.semantics})" if kernel.semantics != "default" else "")
                    + f" (it has: {_site_summary(found)}; adaptation: {ad.describe()})")
    ids = torch.tensor(ids_list, dtype=torch.long, device=device)
    eager = _forward_logits(model, ids)
    # A Python candidate runs where the model is, the CPU included (CPU tests).
    rep = core.kernelize(model, kernels_dir=kernel.dir, swap=not args.dry_run,
                         device=device if device.type == "cuda" or kernel.is_python else None,
                         arch=arch,
                         verbose=False, fuse_gated_mlp=ad.fuse_gated_mlp)
    ours = [e for e in rep.entries
            if (e.op == kernel.op or kernel.op in e.tried) and e.semantics == kernel.semantics]
    replaced = [e.path for e in ours if e.status in ("replaced", "would replace")]
    not_replaced = [{"path": e.path, "reason": "; ".join(e.reasons)} for e in ours
                    if e.status == "kept"]
    if not replaced:
        core.unkernelize(model)
        reasons = sorted({r for e in ours for r in e.reasons}) or ["kernelize replaced nothing"]
        return skip(f"{len(matching)} layer(s) of {name} compute {kernel.op}, but kernelize "
                    f"replaced none: {'; '.join(reasons)}")
    run: dict[str, Any] = {
        "model_name": name, "model_dir": str(model_dir), "dtype": dtype, "file": None,
        "tokens": len(ids_list), "tokenizer": tok_label,
        "layers_replaced": len(replaced), "replaced": replaced, "not_replaced": not_replaced,
        "adaptation": ad.describe(), "adapted": ad.paths,
    }
    if args.dry_run:
        core.unkernelize(model)
        run["dry_run"] = True
    else:
        try:
            cand = _forward_logits(model, ids)
        except Exception as e:
            if not kernel.is_python:
                raise
            # The candidate's own code raised (or returned a wrong output): say whose it is.
            traceback.print_exc(file=sys.stderr)
            core.unkernelize(model)
            raise HarnessError(f"the Python candidate {kernel.manifest['name']} failed inside "
                               f"{name} ({dtype}): {type(e).__name__}: {e} (its traceback is "
                               "above)") from None
        counts = core.launch_counts(model)
        core.unkernelize(model)
        launches = sum(counts.get(p, 0) for p in replaced)
        idle = [p for p in replaced if counts.get(p, 0) == 0]
        if launches == 0:
            return skip(f"the kernel was swapped into {len(replaced)} layer(s) of {name} but "
                        "never launched: every call fell back to the original forward (input "
                        "dtype, shape or element count outside what the kernel takes)")
        again = _forward_logits(model, ids)
        file = f"{name}.{dtype}.safetensors"
        _save(Path(args.out_dir) / file, ids.cpu(), eager, cand, {
            "harness_version": str(HARNESS_VERSION), "model_name": name, "dtype": dtype,
            "kernel": kernel.manifest["name"], "kernel_digest": kernel.digest})
        run.update({
            "file": file, "kernel_launches": launches, "replaced_never_launched": idle,
            "bit_identical": bool(torch.equal(eager, cand)),
            "eager_repeat_identical": bool(torch.equal(eager, again)),
        })
    probs = torch.softmax(eager, dim=-1)
    run["eager_mean_top1_prob"] = round(float(probs.max(dim=-1).values.mean()), 6)
    run["eager_top1_accuracy"] = round(
        float((eager[:-1].argmax(dim=-1) == ids[1:].cpu()).float().mean()), 6)
    run["seconds"] = round(time.perf_counter() - t0, 3)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return run, None


def train_candidate(function, kernel: Kernel, model_dir: Path, dtype: str, text: str, args,
                    device) -> tuple[dict | None, dict | None]:
    """A backward candidate's model level on one model and dtype (`training_level`): (row, None)
    or (None, skip) where no layer of the model computes the op's forward."""
    from kernelize_verifier import training_level as TL
    config = read_config(model_dir)
    ids, _ = tokenize(model_dir, config, text)
    seq = min(64, max(2, len(ids) // 4))
    if len(ids) < seq + 2:
        raise HarnessError(f"the text gives {len(ids)} token(s) for {model_dir.name}: too few to "
                           "train on; give a longer --text.")
    data = TL.windows(ids, args.train_steps, 2, seq, device)
    t0 = time.time()
    row = TL.compare_candidate(lambda: load_model(model_dir, dtype, device, training=True),
                               model_dir.name, kernel.op, kernel.semantics, function, data, dtype,
                               device, timed_from=args.train_steps)
    row.update(model_name=model_dir.name, model_dir=str(model_dir), seq=seq, batch=2,
               seconds=round(time.time() - t0, 3))
    if row.get("skipped"):
        return None, {"model_name": model_dir.name, "model_dir": str(model_dir), "dtype": dtype,
                      "reason": row["skipped"]}
    return row, None


def _save(path: Path, ids, eager, cand, metadata: dict[str, str]) -> None:
    import torch
    from safetensors.torch import save_file
    save_file({"input_ids": ids.to(torch.int64).contiguous(),
               "eager_logits": eager.contiguous(),
               "candidate_logits": cand.contiguous()}, str(path), metadata=metadata)


# ---- command line ---------------------------------------------------------------------------

def _dtype_list(s: str) -> list[str]:
    out = [d.strip() for d in s.split(",") if d.strip()]
    bad = [d for d in out if d not in DTYPES]
    if not out or bad:
        raise argparse.ArgumentTypeError(f"{s!r}: give one or more of {', '.join(DTYPES)}, "
                                         "comma-separated")
    return out


def _positive(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        v = 0
    if v < 2:
        raise argparse.ArgumentTypeError(f"{s!r}: give a whole number >= 2")
    return v


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m kernelize_verifier.model_level",
        description="Measure one kernel inside small real models: eager vs candidate logits.")
    p.add_argument("--kernel", required=True, type=Path, help="one kernel folder (kernel.toml + .cu)")
    p.add_argument("--model", required=True, action="append", type=Path,
                   help="a transformers checkpoint folder; repeat for several")
    p.add_argument("--dtype", required=True, type=_dtype_list, action="append",
                   help="bf16, f16, f32, comma-separated")
    p.add_argument("--text", required=True, type=Path, help="UTF-8 text to run the models on")
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--device", default="cuda", help="default: cuda")
    p.add_argument("--max-tokens", type=_positive, default=512,
                   help="truncate the text's tokens (also to the model's max positions)")
    p.add_argument("--arch", help="sm_XY for the kernel's constraints (default: the device's)")
    p.add_argument("--train-steps", type=_positive, default=4,
                   help="a backward candidate's model level: AdamW steps per copy (default 4)")
    p.add_argument("--dry-run", action="store_true",
                   help="no launch: report what would be replaced (works on the CPU)")
    p.add_argument("--package-dir", action="append", type=Path, default=[],
                   help="a folder of packages a Python candidate imports, put first on sys.path; "
                        "repeat for several")
    p.add_argument("--require-network-isolation", action="store_true",
                   help="refuse to run a Python candidate without a network namespace of its own")
    p.add_argument("--confinement", type=Path, default=None, metavar="FILE",
                   help="the verifier's confinement check (verifier/src/confinement.py, which the "
                        "verifier writes for this run): what isolation this process has; without "
                        "it the isolation is unknown and --require-network-isolation refuses")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    args.dtypes = list(dict.fromkeys(d for ds in args.dtype for d in ds))
    names = [m.resolve().name for m in args.model]
    if len(set(names)) != len(names):
        p.error(f"--model folders must have distinct names (outputs are named after them): {names}")
    python_candidate = _declared_runtime(args.kernel) == "python"
    if not args.device.startswith("cuda") and not args.dry_run and not python_candidate:
        p.error(f"--device {args.device}: the kernel launches on a CUDA device; use --device "
                "cuda, or --dry-run to check models and matching without a GPU")
    if not args.device.startswith("cuda") and not args.arch:
        p.error(f"--device {args.device} needs --arch (e.g. sm_90) for the kernel's constraints")
    # Before anything imports torch: a candidate's packages (a torch among them) come first.
    for d in reversed(args.package_dir):
        sys.path.insert(0, str(d.resolve()))
    with contextlib.redirect_stdout(sys.stderr):  # libraries that print must not use stdout
        return _run(args)


def _run(args) -> int:
    stage = "starting"
    try:
        stage = "importing torch and transformers"
        try:
            import torch
        except ModuleNotFoundError:
            raise HarnessError(f"PyTorch is not installed for {sys.executable}. Install it "
                               "(pip install torch; a CUDA build on the GPU machine) or run the "
                               "harness with the python3 that has it.") from None
        try:
            import safetensors  # noqa: F401
            import transformers
        except ModuleNotFoundError as e:
            raise HarnessError(f"{e.name} is not installed for {sys.executable}; the harness "
                               "loads models with transformers and writes logits with "
                               "safetensors: pip install transformers safetensors.") from None
        with contextlib.suppress(Exception):  # progress bars are noise in a child's stderr
            transformers.utils.logging.disable_progress_bar()
        stage = "choosing the device"
        device = torch.device(args.device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise HarnessError(
                    f"torch {torch.__version__} sees no CUDA device (torch.version.cuda = "
                    f"{torch.version.cuda}; a CPU-only build or no GPU/driver here). Run the "
                    "harness on the GPU machine with a CUDA build of PyTorch, or use --dry-run "
                    "--device cpu --arch sm_90 to check models and matching only.")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            major, minor = torch.cuda.get_device_capability(device)
            arch = args.arch or f"sm_{major}{minor}"
            device_name = torch.cuda.get_device_name(device)
        else:
            arch, device_name = args.arch, str(device)
        stage = "reading the kernel"
        kernel = load_kernel(args.kernel)
        python_info = None
        if kernel.is_python:
            stage = "loading the Python candidate"
            python_info = load_python_candidate(kernel, args.dtypes, device,
                                                args.require_network_isolation, args.confinement)
            log(f"Python candidate: python {python_info['python']}, torch "
                f"{python_info['torch']}, packages {python_info['packages']}; "
                f"{python_info['isolation'][0]}")
        elif args.package_dir or args.require_network_isolation or args.confinement:
            log("--package-dir and --require-network-isolation apply to Python candidates "
                "only; this kernel is CUDA")
        stage = "reading the text"
        try:
            text = args.text.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise HarnessError(f"--text {args.text}: cannot read it as UTF-8 ({e}).") from None
        if not text:
            raise HarnessError(f"--text {args.text} is empty; give the evaluation text.")
        out_dir: Path = args.out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        summary_path = out_dir / "summary.json"
        summary_path.unlink(missing_ok=True)  # never leave a stale summary behind a failure
        log(f"kernel {kernel.label} ({kernel.digest[:19]}...) on {device_name} ({arch})"
            + (" [dry run]" if args.dry_run else ""))
        from kernelize.manifest import BACKWARD_OPS
        runs, skipped, training = [], [], []
        backward = kernel.op in BACKWARD_OPS   # its model level is training
        if backward:
            stage = "loading the backward candidate"
            if not kernel.is_python:
                raise HarnessError(f"{kernel.label}: the training steps of a CUDA backward kernel are "
                                   "not run by this harness yet (Python candidates only)")
            from kernelize_verifier import backward_field as BF
            bmanifest, bmodule = BF.load(args.kernel)
            # training runs compared bit for bit: eager's own bits must repeat (cuBLAS reads its
            # workspace setting when its first handle is made, at the first model's first matmul)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)
        for model_dir in args.model:
            for dtype in args.dtypes if backward else []:
                stage = f"training {model_dir.name} in {dtype}"
                if dtype not in kernel.manifest["entries"]:
                    skipped.append({"model_name": model_dir.name, "model_dir": str(model_dir),
                                    "dtype": dtype, "reason": f"the candidate has no {dtype} entry"})
                    continue
                row, skip = train_candidate(BF.entry(bmanifest, bmodule, dtype), kernel,
                                            model_dir.resolve(), dtype, text, args, device)
                if row is not None:
                    training.append(row)
                    log(f"{model_dir.name} {dtype}: {row['steps']} AdamW steps with the candidate as "
                        f"the backward of {len(row['layers_wrapped'])} layer(s): "
                        + ("bit-identical with eager" if row["ok"] else "differs from eager")
                        + ("" if row["control_identical"] else " (the control differs too)")
                        + f" ({row['seconds']:.1f} s)")
                else:
                    skipped.append(skip)
                    log(f"{model_dir.name} {dtype}: skipped: {skip['reason']}")
            for dtype in [] if backward else args.dtypes:
                stage = f"measuring {model_dir.name} in {dtype}"
                run, skip = measure(kernel, model_dir.resolve(), dtype, text, args, device, arch)
                if run is not None:
                    runs.append(run)
                    what = ("would replace" if args.dry_run else "replaced")
                    log(f"{model_dir.name} {dtype}: {run['tokens']} tokens, {what} "
                        f"{run['layers_replaced']} layer(s)"
                        + ("" if args.dry_run else f", {run['kernel_launches']} launches, "
                           f"{'bit-identical' if run['bit_identical'] else 'logits differ'}")
                        + f", eager mean top-1 prob {run['eager_mean_top1_prob']:.3f}"
                        + f" ({run['seconds']:.1f} s)")
                else:
                    skipped.append(skip)
                    log(f"{model_dir.name} {dtype}: skipped: {skip['reason']}")
        stage = "writing summary.json"
        summary = {
            "harness_version": HARNESS_VERSION, "torch": torch.__version__,
            "transformers": transformers.__version__, "device": device_name, "arch": arch,
            "dry_run": bool(args.dry_run),
            "kernel": {"name": kernel.manifest["name"], "version": kernel.manifest["version"],
                       "op": kernel.op, "semantics": kernel.semantics, "digest": kernel.digest,
                       "runtime": "python" if kernel.is_python else "cuda",
                       "dir": str(args.kernel.resolve())},
            "text": str(args.text.resolve()), "max_tokens": args.max_tokens,
            "runs": runs, "skipped": skipped,
        }
        if backward:
            summary["training"] = training
        if python_info is not None:
            summary["python"] = python_info
        tmp = summary_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, summary_path)
        log(f"wrote {summary_path}: {len(runs) + len(training)} run(s), {len(skipped)} skipped")
        return 0
    except HarnessError as e:
        log(f"failed while {stage}: {e}")
        return 1
    except Exception as e:  # noqa: BLE001 - the exit status and message are the contract
        traceback.print_exc(file=sys.stderr)
        log(f"failed while {stage}: {type(e).__name__}: {e}. This is unexpected (the traceback "
            "above says where); check the model and kernel folders, and that PyTorch sees the "
            "GPU, then report it with the command line.")
        return 1


if __name__ == "__main__":
    sys.exit(main())
