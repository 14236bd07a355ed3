#!/usr/bin/env python3
"""Issue 30's model-level check: N optimizer steps of the shipped tiny models kernelized in
training mode against eager, losses, gradients and updated parameters compared bit for bit, and
the training step's time.

On the GPU machine:

    PYTHONUNBUFFERED=1 python3 scripts/training_check.py OUT_DIR [--steps 20] [--dtypes bf16,f32]
        [--models tiny-llama,tiny-gpt2,tiny-gemma]    # also: tiny-llama-rmsnorm

A backward candidate's model level (docs/backward.md, "What the verifier lacks", item 9):

    PYTHONUNBUFFERED=1 python3 scripts/training_check.py OUT_DIR --backward-candidate DIR
        [--models tiny-llama,tiny-gpt2] [--dtypes bf16,f16,f32] [--steps 20]

takes the Python candidate folder DIR (rms_norm_backward llama, layer_norm_backward,
silu_mul_backward or gelu_tanh_mul_backward, e.g.
kernels/third-party/liger_rms_norm_llama_backward) as the autograd backward of the models' layers
of its op (their forward stays eager's: `kernelize_verifier.backward_field.wrap_layers`),
trains that copy beside eager and beside a control whose layers run eager's own gradients of the
op through the same wrapping, and compares losses, gradients and parameters bit for bit (with
--dry-run on the CPU, where the comparison is real: the candidate runs there).

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
from kernelize_verifier.training_level import (  # noqa: E402  (one home: the verifier's model harness uses them too)
    ADAMW_EPS, against_eager, compare_candidate, train, windows)

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
MODELS = ["tiny-llama", "tiny-gpt2", "tiny-gemma"]


KERNELS = ["rms_norm_llama", "rms_norm_llama_backward", "rms_norm_gemma", "rms_norm_gemma_backward",
           "rms_norm_torch", "rms_norm_torch_backward",
           "silu_mul", "silu_mul_backward", "gelu_tanh_mul", "gelu_tanh_mul_backward", "layer_norm",
           "layer_norm_backward", "gelu", "gelu_backward"]
GATED = ["silu_mul", "silu_mul_backward", "gelu_tanh_mul", "gelu_tanh_mul_backward"]
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
    return windows(list(data), n, batch, seq, device)


def backward_launches() -> dict[str, dict[str, int]]:
    """The loaded backward kernels' launches so far, by kernel and entry (summed over dtypes)."""
    from kernelize import training
    out: dict[str, dict[str, int]] = {}
    for bk in list(training._CACHE.values()):
        per = out.setdefault(bk.manifest["name"], {})
        for stage, n in bk.launches.items():
            per[stage] = per.get(stage, 0) + n
    return out


def load_model(model_name: str, dtype: str, device):
    """A copy of the model in training mode (the shipped folder's weights, or `BUILT`'s), eager
    attention."""
    import transformers
    t = DTYPES[dtype]
    if model_name in BUILT:
        return BUILT[model_name]().to(device=device, dtype=t).train()
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(ROOT, "models", model_name), attn_implementation="eager").to(device=device, dtype=t).train()


def check(model_name: str, dtype: str, steps: int, source: dict, device, dry: bool) -> dict:
    eager, again, kz = (load_model(model_name, dtype, device) for _ in range(3))
    rep = kernelize.kernelize(kz, **source, mode="training", verbose=False,
                              **({"device": "cpu", "swap": False, "arch": "sm_90"} if dry else {}))
    data = batches(steps, 4, 64, device)
    cuda = device.type == "cuda"
    eps = ADAMW_EPS[dtype]
    ran_eager = train(eager, data, 1e-3, 3, cuda, eps)
    ran_again = train(again, data, 1e-3, 3, cuda, eps)
    before = backward_launches()
    ran_kz = train(kz, data, 1e-3, 3, cuda, eps)
    after = backward_launches()
    (le, _, te, _), (lk, _, tk, gk) = ran_eager, ran_kz
    params = dict(eager.named_parameters())
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
        **against_eager("", ran_eager, ran_kz, kz, params),
        "grad_steps_compared": len(gk),
        **against_eager("eager_repeat_", ran_eager, ran_again, again, params),
        "step_ms_eager": statistics.median(te) if te else None,
        "step_ms_kernelized": statistics.median(tk) if tk else None,
    }
    out["ok"] = not any(v for k, v in out.items() if k.endswith("_differing"))
    return out


def check_candidate(model_name: str, dtype: str, steps: int, folder: str, device) -> dict:
    """A backward candidate's model level (docs/backward.md, "What the verifier lacks", item 9):
    three copies of the model train on the same batches: eager; the control, whose layers of the
    candidate's op run eager's forward and eager's own gradients of the op through the wrapping
    (`backward_field.eager_function`); the candidate's, whose layers run the candidate as their
    backward (`backward_field.wrap_layers`). Losses, gradients and parameters of the last two
    against eager's, bit for bit."""
    from kernelize_verifier import backward_field as BF
    manifest, module = BF.load(folder)
    op, sem = manifest["op"], manifest.get("semantics", "default")
    out = {"model": model_name, "dtype": dtype, "steps": steps, "op": op,
           "candidate": f"{manifest['name']} {manifest['version']}"}
    out.update(compare_candidate(lambda: load_model(model_name, dtype, device), model_name, op, sem,
                                 BF.entry(manifest, module, dtype), batches(steps, 4, 64, device),
                                 dtype, device))
    return out


def print_candidate_rows(rows: list[dict]) -> None:
    print("| model | dtype | candidate | layers wrapped | loss steps differing | gradient steps differing "
          "| parameter elements differing | max loss diff | control (eager's gradients wrapped) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        if r.get("skipped"):
            print(f"| {r['model']} | {r['dtype']} | {r['candidate']} | 0 | {r['skipped']} | | | | |")
            continue
        ctl = ("identical to eager" if r["control_identical"] else
               f"differs: loss steps {len(r['control_loss_steps_differing'])}, parameter elements "
               f"{sum(r['control_parameters_differing'].values())}")
        mx = r["max_loss_abs_diff"]
        print(f"| {r['model']} | {r['dtype']} | {r['candidate']} | {len(r['layers_wrapped'])} | "
              f"{len(r['candidate_loss_steps_differing'])} of {r['steps']} | "
              f"{len(r['candidate_gradients_differing'])} of {r['grad_steps_compared']} | "
              f"{sum(r['candidate_parameters_differing'].values())} | "
              f"{'-' if mx is None else f'{mx:.3g}'} | {ctl} |")


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
    p.add_argument("--backward-candidate", metavar="DIR", help="a backward candidate's model level "
                   "instead of kernelize's training mode: the Python candidate folder DIR (a backward op "
                   "of rms_norm llama, layer_norm or a gated MLP, kernels/third-party/*_backward) as the autograd "
                   "backward of the models' matching layers, beside eager and a control (eager's own "
                   "gradients of the op through the same wrapping); with --dry-run on the CPU, where "
                   "the comparison is real (the candidate runs on the CPU)")
    a = p.parse_args()
    if a.backward_candidate and (a.hub or a.kernel):
        p.error("--backward-candidate measures that candidate alone: not with --hub or --kernel")
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

    def each(run) -> None:
        """`run(model, dtype)` for every model and dtype asked; a failure is recorded, the rest
        still runs; then the records are written."""
        for m in a.models.split(","):
            for dt in a.dtypes.split(","):
                try:
                    rows.append(run(m, dt))
                except Exception:  # noqa: BLE001
                    errors.append({"model": m, "dtype": dt, "error": traceback.format_exc()})
                    print(errors[-1]["error"], file=sys.stderr)
        with open(os.path.join(a.out, "training_check.json"), "w") as f:
            json.dump({"env": env, "rows": rows, "errors": errors}, f, indent=1)
        print(json.dumps(env))

    if a.backward_candidate:
        env["source"] = f"backward candidate {os.path.abspath(a.backward_candidate)}"
        each(lambda m, dt: check_candidate(m, dt, a.steps, a.backward_candidate, device))
        print_candidate_rows(rows)
        measured = [r for r in rows if not r.get("skipped")]
        if not measured and not errors:
            print("NOTHING MEASURED: no model given has a layer of the candidate's op")
            return 1
        ok = not errors and all(r["ok"] for r in measured)
        print("ALL BIT-IDENTICAL" if ok else "DIFFERENCES OR ERRORS (see training_check.json)")
        return 0 if ok else 1
    with tempfile.TemporaryDirectory() as tmp:
        source = {"hub": a.hub} if a.hub else {"kernels_dir": kernels_dir(
            tmp, gated=not a.no_gated, layer_norm=not a.no_layer_norm, extra=a.kernel,
            activations=not a.no_activations)}
        env["source"] = f"hub {a.hub}" if a.hub else (
            "kernels_dir (bundled forward + backward, local: "
            + ", ".join(kernel_names(not a.no_gated, not a.no_layer_norm, not a.no_activations))
            + "".join(f"; {os.path.abspath(d)}" for d in a.kernel) + ")")
        each(lambda m, dt: check(m, dt, a.steps, source, device, dry))
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
