#!/usr/bin/env python3
"""Issue 30's model-level check: N optimizer steps of the shipped tiny models kernelized in
training mode against eager, losses, gradients and updated parameters compared bit for bit, and
the training step's time.

On the GPU machine:

    PYTHONUNBUFFERED=1 python3 scripts/training_check.py OUT_DIR [--steps 20] [--dtypes bf16,f32]
        [--models tiny-llama,tiny-gpt2,tiny-gemma]    # also: tiny-llama-rmsnorm

Without a GPU, `--dry-run` runs the same code paths on the CPU (kernelize reports what it would
replace and keeps every layer; both runs are eager, so they agree by construction: it checks the
script and the kernels folder, not the kernels).

What it runs: a kernels folder of the bundled exact forwards (`kernels/rms_norm_llama`,
`kernels/rms_norm_gemma`, `kernels/silu_mul`, `kernels/gelu_tanh_mul`, `kernels/layer_norm`,
`kernels/gelu`) and their backward kernels (`kernels/rms_norm_llama_backward/`,
`kernels/rms_norm_gemma_backward/`, `kernels/silu_mul_backward/`,
`kernels/gelu_tanh_mul_backward/`, `kernels/layer_norm_backward/`, `kernels/gelu_backward/`),
read with `kernels_dir=`
(local kernels: not verified by a hub; `--no-gated` leaves the gated MLPs' four out,
`--no-layer-norm` LayerNorm's two, `--no-activations` the standalone GELU's two; `--kernel DIR`
puts the kernel folder DIR, a kernel.toml and its source, in place of the bundled folder of the
same name, or beside them: a work-in-progress backward kernel, say); or, with `--hub URL`, the
kernels that hub hands out under the default policy (bit_exact), the forward and backward
verdicts both certified (the bundled certificates of a fresh `kernelize serve`). For each model
(models/tiny-llama: its RMSNorm layers and its gated MLPs get the forward and backward kernels,
except the RMSNorm layers in f32, which keep their original forward under autograd;
models/tiny-gpt2: its LayerNorm layers get layer_norm and layer_norm_backward in every dtype,
under autograd eager's own forward op (its saved mean and rstd) and the backward kernel, and its
4 GELUs (HF GELUActivation: F.gelu, erf) gelu and gelu_backward in every dtype; tiny-gemma: no shipped folder, a random-weight
HF GemmaForCausalLM built here from a config and a fixed seed (`tiny_gemma`: 4 decoder layers,
hidden_act gelu_pytorch_tanh), whose GeGLU MLPs get gelu_tanh_mul and gelu_tanh_mul_backward in
every dtype and whose 9 GemmaRMSNorm layers rms_norm_gemma and rms_norm_gemma_backward, except
in f32, where they keep their original forward under autograd as Llama's; tiny-llama-rmsnorm,
not run by default: models/tiny-llama with nn.RMSNorm norms, which get rms_norm_torch and
rms_norm_torch_backward in every dtype, f32 included: F.rms_norm is one autograd node) and dtype:
two copies from the same weights, one `kernelize(..., mode="training")`, both trained with AdamW
on the same batches of models/corpus.txt (bytes as tokens, as the models were trained); per
step the loss bits and every parameter's gradient bits, at the end every parameter's bits.
Eager must be reproducible for the comparison to mean anything: attention runs HF's eager
implementation, torch's deterministic algorithms are on (CUBLAS_WORKSPACE_CONFIG set), and a
second eager copy is trained too: its losses and parameters against the first are the control
(`eager_repeat_*`, which must be 0). AdamW's eps is its default 1e-8, but 1e-4 in f16, where 1e-8
rounds to 0 and a parameter with a zero gradient (an embedding row no batch used) turns NaN at
its first step, and every later loss with it (`adamw_eps` and `losses_finite` in each row).
Time: median CUDA-event time of a step (forward, backward, optimizer) after 3 warm-up steps,
both in the same process. Writes OUT_DIR/training_check.json and a table; exit 1 when any loss
or parameter differs (or anything raised).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
# deterministic cuBLAS (before CUDA starts): eager's own bits must repeat
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import kernelize  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
MODELS = ["tiny-llama", "tiny-gpt2", "tiny-gemma"]


KERNELS = ["rms_norm_llama", "rms_norm_llama_backward", "rms_norm_gemma", "rms_norm_gemma_backward",
           "rms_norm_torch", "rms_norm_torch_backward",
           "silu_mul", "silu_mul_backward", "gelu_tanh_mul", "gelu_tanh_mul_backward", "layer_norm",
           "layer_norm_backward", "gelu", "gelu_backward"]
GATED = ["silu_mul", "silu_mul_backward", "gelu_tanh_mul", "gelu_tanh_mul_backward"]
# AdamW's eps by dtype: its default, but in f16 (where 1e-8 is 0) one f16 represents
ADAMW_EPS = {"bf16": 1e-8, "f16": 1e-4, "f32": 1e-8}
LAYER_NORM = ["layer_norm", "layer_norm_backward"]
# the standalone activations' (tiny-gpt2's GELUs; the gated MLPs' act_fn is covered by their op)
ACTIVATIONS = ["gelu", "gelu_backward"]


def tiny_gemma():
    """models/ has no Gemma: a random-weight tiny HF GemmaForCausalLM (4 decoder layers, hidden
    256, GeGLU MLPs of 704 with hidden_act gelu_pytorch_tanh, byte vocabulary, eager attention),
    in f32 on the CPU; the same weights at every call (fixed seeds, the global RNG left as it
    was). Its norm weights are drawn too (Gemma's scale is 1 + w, zero at init)."""
    import transformers
    cfg = transformers.GemmaConfig(vocab_size=256, hidden_size=256, intermediate_size=704,
                                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=64, max_position_embeddings=256,
                                   hidden_act="gelu_pytorch_tanh", attn_implementation="eager")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.GemmaForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if "RMSNorm" in type(m).__name__:
                m.weight.copy_(0.3 * torch.randn(m.weight.shape, generator=g))
    return model


def tiny_llama_rmsnorm():
    """models/tiny-llama with its 9 LlamaRMSNorm layers replaced by torch.nn.RMSNorm of the same
    width, eps and weights (F.rms_norm: rms_norm semantics torch, eager's one _fused_rms_norm node
    on CUDA; docs/backward-rms-torch.md), f32 on the CPU."""
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(ROOT, "models", "tiny-llama"), attn_implementation="eager").float()
    for name, m in list(model.named_modules()):
        if type(m).__name__ == "LlamaRMSNorm":
            parent, _, attr = name.rpartition(".")
            new = torch.nn.RMSNorm(m.weight.shape[0], eps=m.variance_epsilon)
            with torch.no_grad():
                new.weight.copy_(m.weight)
            setattr(model.get_submodule(parent) if parent else model, attr, new)
    return model


#: The models built here, not loaded from models/ (name -> a builder of the f32 CPU model).
BUILT = {"tiny-gemma": tiny_gemma, "tiny-llama-rmsnorm": tiny_llama_rmsnorm}


def kernel_names(gated: bool = True, layer_norm: bool = True, activations: bool = True) -> list[str]:
    """The bundled kernels' folders the kernels folder takes (`kernels_dir`)."""
    return [k for k in KERNELS if (gated or k not in GATED) and (layer_norm or k not in LAYER_NORM)
            and (activations or k not in ACTIVATIONS)]


def kernels_dir(root: str, gated: bool = True, layer_norm: bool = True,
                extra: list[str] | None = None, activations: bool = True) -> str:
    """A kernels folder: the bundled exact forwards and their backward kernels' folders (without
    the gated MLP's two unless `gated`, without LayerNorm's unless `layer_norm`, without the
    standalone activations' unless `activations`); each folder of
    `extra` (a kernel.toml and its source) in place of the bundled one of the same folder name,
    or beside them."""
    out = os.path.join(root, "kernels")
    for name in kernel_names(gated, layer_norm, activations):
        shutil.copytree(os.path.join(ROOT, "kernels", name), os.path.join(out, name))
    for d in extra or []:
        d = os.path.abspath(d)
        if not os.path.isfile(os.path.join(d, "kernel.toml")):
            raise SystemExit(f"--kernel {d}: no kernel.toml there (a kernel folder has its "
                             "manifest and its source)")
        dest = os.path.join(out, os.path.basename(d.rstrip(os.sep)))
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(d, dest)
    return out


def batches(n: int, batch: int, seq: int, device) -> list[torch.Tensor]:
    """`n` batches of byte tokens from models/corpus.txt (fixed: the same for both runs)."""
    data = open(os.path.join(ROOT, "models", "corpus.txt"), "rb").read()
    t = torch.tensor(list(data), dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(t) - seq - 1, (n, batch), generator=g)
    return [torch.stack([t[s:s + seq] for s in row.tolist()]).to(device) for row in starts]


INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The elements' bit patterns (an integer tensor of the same element size)."""
    return t.detach().contiguous().reshape(-1).view(INT_OF_SIZE[t.element_size()])


def grad_digests(model) -> dict[str, bytes]:
    """Each parameter's gradient bits, hashed (None-gradients left out)."""
    import hashlib
    return {n: hashlib.sha256(bits(p.grad).cpu().numpy().tobytes()).digest()
            for n, p in model.named_parameters() if p.grad is not None}


def train(model, data, lr: float, timed_from: int, cuda: bool, eps: float = 1e-8
          ) -> tuple[list[float], list[bytes], list[float], list[dict[str, bytes]]]:
    """AdamW steps (eps `eps`) over `data`: each loss (value and bits), each step's time (ms)
    from `timed_from` on, and each step's gradient digests (`grad_digests`, taken outside the
    timed steps)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=eps)
    losses, loss_bits, times, grads = [], [], [], []
    for i, ids in enumerate(data):
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        if i < timed_from:
            grads.append(grad_digests(model))
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            stop.record()
            torch.cuda.synchronize()
            if i >= timed_from:
                times.append(start.elapsed_time(stop))
        losses.append(float(loss))
        loss_bits.append(bits(loss).cpu().numpy().tobytes())
    return losses, loss_bits, times, grads


def backward_launches() -> dict[str, dict[str, int]]:
    """The loaded backward kernels' launches so far, by kernel and entry (summed over dtypes)."""
    from kernelize import training
    out: dict[str, dict[str, int]] = {}
    for bk in list(training._CACHE.values()):
        per = out.setdefault(bk.manifest["name"], {})
        for stage, n in bk.launches.items():
            per[stage] = per.get(stage, 0) + n
    return out


def check(model_name: str, dtype: str, steps: int, source: dict, device, dry: bool) -> dict:
    import transformers
    path = os.path.join(ROOT, "models", model_name)
    t = DTYPES[dtype]
    def load():
        if model_name in BUILT:
            return BUILT[model_name]().to(device=device, dtype=t).train()
        return transformers.AutoModelForCausalLM.from_pretrained(
            path, attn_implementation="eager").to(device=device, dtype=t).train()
    eager, again, kz = load(), load(), load()
    rep = kernelize.kernelize(kz, **source, mode="training", verbose=False,
                              **({"device": "cpu", "swap": False, "arch": "sm_90"} if dry else {}))
    data = batches(steps, 4, 64, device)
    cuda = device.type == "cuda"
    eps = ADAMW_EPS[dtype]
    le, be, te, ge = train(eager, data, 1e-3, 3, cuda, eps)
    _, ba, _, ga = train(again, data, 1e-3, 3, cuda, eps)
    before = backward_launches()
    lk, bk, tk, gk = train(kz, data, 1e-3, 3, cuda, eps)
    after = backward_launches()
    params = dict(eager.named_parameters())

    def differing(model) -> dict:
        out = {}
        for n, p in model.named_parameters():
            d = int((bits(p) != bits(params[n])).sum())
            if d:
                out[n] = d
        return out
    def grads_differing(g) -> dict[str, list[str]]:
        """step -> the parameters whose gradient bits differ from eager's (the untimed steps)."""
        out = {}
        for i, (a, b) in enumerate(zip(ge, g)):
            names = sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
            if names:
                out[str(i)] = names
        return out
    loss_diff = [i for i, (a, b) in enumerate(zip(be, bk)) if a != b]
    differ = differing(kz)
    grad_diff = grads_differing(gk)
    control = ([i for i, (a, b) in enumerate(zip(be, ba)) if a != b], differing(again),
               grads_differing(ga))
    out = {
        "model": model_name, "dtype": dtype, "steps": steps, "adamw_eps": eps,
        "replaced": [e.path for e in rep.replaced],
        "with_backward": [e.path for e in rep.entries if getattr(e, "backward", None) is not None],
        "backward_kernels": sorted({e.backward.name for e in rep.entries
                                    if getattr(e, "backward", None) is not None}),
        # each backward kernel's launches by entry while the kernelized copy trained
        "backward_launches": {k: {s: n - before.get(k, {}).get(s, 0) for s, n in v.items()}
                              for k, v in after.items()},
        "report": str(rep),
        "losses_eager": le, "losses_kernelized": lk,
        "losses_finite": all(v == v and abs(v) != float("inf") for v in le + lk),
        "loss_steps_differing": loss_diff,
        "parameters_differing": differ,
        "gradients_differing": grad_diff,
        "grad_steps_compared": len(gk),
        "eager_repeat_loss_steps_differing": control[0],
        "eager_repeat_parameters_differing": control[1],
        "eager_repeat_gradients_differing": control[2],
        "step_ms_eager": statistics.median(te) if te else None,
        "step_ms_kernelized": statistics.median(tk) if tk else None,
    }
    out["ok"] = not loss_diff and not differ and not grad_diff and not any(control)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dtypes", default="bf16,f16,f32")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--dry-run", action="store_true", help="the code paths on the CPU (numbers mean nothing)")
    p.add_argument("--hub", metavar="URL", help="take the kernels from this hub (its verified forward and "
                   "backward kernels) instead of the local kernels folder")
    p.add_argument("--no-gated", action="store_true", help="the local kernels folder without the gated "
                   "MLPs' forward and backward kernels (silu_mul, silu_mul_backward, gelu_tanh_mul, "
                   "gelu_tanh_mul_backward)")
    p.add_argument("--no-layer-norm", action="store_true", help="the local kernels folder without "
                   "LayerNorm's forward and backward kernels (layer_norm, layer_norm_backward)")
    p.add_argument("--no-activations", action="store_true", help="the local kernels folder without "
                   "the standalone activations' forward and backward kernels (gelu, gelu_backward)")
    p.add_argument("--kernel", action="append", default=[], metavar="DIR", help="a kernel folder "
                   "(kernel.toml and source) in the local kernels folder, in place of the bundled "
                   "folder of the same name (repeatable)")
    a = p.parse_args()
    if a.hub and a.kernel:
        p.error("--kernel goes into the local kernels folder: not with --hub")
    os.makedirs(a.out, exist_ok=True)
    dry = a.dry_run
    if not dry and not torch.cuda.is_available():
        print("no CUDA device: run on the GPU machine, or pass --dry-run", file=sys.stderr)
        return 2
    device = torch.device("cpu") if dry else torch.device("cuda", torch.cuda.current_device())
    torch.use_deterministic_algorithms(True, warn_only=True)
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "python": platform.python_version(), "dry_run": dry,
           "device": torch.cuda.get_device_name(device) if not dry else "cpu"}
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    rows, errors = [], []
    with tempfile.TemporaryDirectory() as tmp:
        source = {"hub": a.hub} if a.hub else {"kernels_dir": kernels_dir(
            tmp, gated=not a.no_gated, layer_norm=not a.no_layer_norm, extra=a.kernel,
            activations=not a.no_activations)}
        env["source"] = f"hub {a.hub}" if a.hub else (
            "kernels_dir (bundled forward + backward, local: "
            + ", ".join(kernel_names(not a.no_gated, not a.no_layer_norm, not a.no_activations))
            + "".join(f"; {os.path.abspath(d)}" for d in a.kernel) + ")")
        for m in a.models.split(","):
            for dt in a.dtypes.split(","):
                try:
                    r = check(m, dt, a.steps, source, device, dry)
                    rows.append(r)
                except Exception:  # noqa: BLE001 - every failure is recorded, the rest still runs
                    errors.append({"model": m, "dtype": dt, "error": traceback.format_exc()})
                    print(errors[-1]["error"], file=sys.stderr)
    with open(os.path.join(a.out, "training_check.json"), "w") as f:
        json.dump({"env": env, "rows": rows, "errors": errors}, f, indent=1)
    print(json.dumps(env))
    print("| model | dtype | layers replaced (with a backward kernel) | loss steps differing | gradient steps differing | parameters differing | eager vs eager (control) | step ms eager | step ms kernelized |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else "-"  # noqa: E731
        print(f"| {r['model']} | {r['dtype']} | {len(r['replaced'])} ({len(r['with_backward'])}) | "
              f"{len(r['loss_steps_differing'])} of {r['steps']} | "
              f"{len(r['gradients_differing'])} of {r['grad_steps_compared']} | "
              f"{sum(r['parameters_differing'].values())} | "
              f"{len(r['eager_repeat_loss_steps_differing'])}, {sum(r['eager_repeat_parameters_differing'].values())}, "
              f"{len(r['eager_repeat_gradients_differing'])} | "
              f"{fmt(r['step_ms_eager'])} | {fmt(r['step_ms_kernelized'])} |")
    for r in rows:   # which backward kernels ran, by entry
        launched = "; ".join(f"{k} " + ", ".join(f"{st} {n}" for st, n in v.items())
                             for k, v in sorted(r["backward_launches"].items()) if any(v.values()))
        print(f"{r['model']} {r['dtype']} backward launches: {launched or 'none'}")
    ok = not errors and all(r["ok"] for r in rows)
    print("ALL BIT-IDENTICAL" if ok else "DIFFERENCES OR ERRORS (see training_check.json)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
