#!/usr/bin/env python3
"""Issue 30's model-level check: N optimizer steps of the shipped tiny models kernelized in
training mode against eager, losses and updated parameters compared bit for bit, and the
training step's time.

On the GPU machine:

    PYTHONUNBUFFERED=1 python3 scripts/training_check.py OUT_DIR [--steps 20] [--dtypes bf16,f32]

Without a GPU, `--dry-run` runs the same code paths on the CPU (kernelize reports what it would
replace and keeps every layer; both runs are eager, so they agree by construction: it checks the
script and the kernels folder, not the kernels).

What it runs: a kernels folder of the bundled exact forward (`kernels/rms_norm_llama`) and the
backward kernel (`kernels/rms_norm_llama_backward/`), read with `kernels_dir=` (local
kernels: not verified by a hub); or, with `--hub URL`, the kernels that hub hands out under the
default policy (bit_exact), the forward and backward verdicts both certified (the bundled
certificates of a fresh `kernelize serve`). For each model (models/tiny-llama: its RMSNorm layers get the forward and
backward kernels; models/tiny-gpt2: LayerNorm, no backward op, so its layers keep their original
forward under autograd) and dtype: two copies from the same weights, one `kernelize(...,
mode="training")`, both trained with AdamW on the same batches of models/corpus.txt (bytes as
tokens, as the models were trained); per step the loss bits, at the end every parameter's bits.
Eager must be reproducible for the comparison to mean anything: attention runs HF's eager
implementation, torch's deterministic algorithms are on (CUBLAS_WORKSPACE_CONFIG set), and a
second eager copy is trained too: its losses and parameters against the first are the control
(`eager_repeat_*`, which must be 0).
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
MODELS = ["tiny-llama", "tiny-gpt2"]


def kernels_dir(root: str) -> str:
    """A kernels folder: the bundled exact forward and the backward kernel's folder."""
    out = os.path.join(root, "kernels")
    shutil.copytree(os.path.join(ROOT, "kernels", "rms_norm_llama"), os.path.join(out, "rms_norm_llama"))
    shutil.copytree(os.path.join(ROOT, "kernels", "rms_norm_llama_backward"),
                    os.path.join(out, "rms_norm_llama_backward"))
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


def train(model, data, lr: float, timed_from: int, cuda: bool) -> tuple[list[float], list[bytes], list[float]]:
    """AdamW steps over `data`: each loss (value and bits), and each step's time (ms) from
    `timed_from` on."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses, loss_bits, times = [], [], []
    for i, ids in enumerate(data):
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            stop.record()
            torch.cuda.synchronize()
            if i >= timed_from:
                times.append(start.elapsed_time(stop))
        losses.append(float(loss))
        loss_bits.append(bits(loss).cpu().numpy().tobytes())
    return losses, loss_bits, times


def check(model_name: str, dtype: str, steps: int, source: dict, device, dry: bool) -> dict:
    import transformers
    path = os.path.join(ROOT, "models", model_name)
    t = DTYPES[dtype]
    def load():
        return transformers.AutoModelForCausalLM.from_pretrained(
            path, attn_implementation="eager").to(device=device, dtype=t).train()
    eager, again, kz = load(), load(), load()
    rep = kernelize.kernelize(kz, **source, mode="training", verbose=False,
                              **({"device": "cpu", "swap": False, "arch": "sm_90"} if dry else {}))
    data = batches(steps, 4, 64, device)
    cuda = device.type == "cuda"
    le, be, te = train(eager, data, 1e-3, 3, cuda)
    _, ba, _ = train(again, data, 1e-3, 3, cuda)
    lk, bk, tk = train(kz, data, 1e-3, 3, cuda)
    params = dict(eager.named_parameters())

    def differing(model) -> dict:
        out = {}
        for n, p in model.named_parameters():
            d = int((bits(p) != bits(params[n])).sum())
            if d:
                out[n] = d
        return out
    loss_diff = [i for i, (a, b) in enumerate(zip(be, bk)) if a != b]
    differ = differing(kz)
    control = ([i for i, (a, b) in enumerate(zip(be, ba)) if a != b], differing(again))
    out = {
        "model": model_name, "dtype": dtype, "steps": steps,
        "replaced": [e.path for e in rep.replaced],
        "with_backward": [e.path for e in rep.entries if getattr(e, "backward", None) is not None],
        "report": str(rep),
        "losses_eager": le, "losses_kernelized": lk,
        "loss_steps_differing": loss_diff,
        "parameters_differing": differ,
        "eager_repeat_loss_steps_differing": control[0],
        "eager_repeat_parameters_differing": control[1],
        "step_ms_eager": statistics.median(te) if te else None,
        "step_ms_kernelized": statistics.median(tk) if tk else None,
    }
    out["ok"] = not loss_diff and not differ and not control[0] and not control[1]
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
    a = p.parse_args()
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
        source = {"hub": a.hub} if a.hub else {"kernels_dir": kernels_dir(tmp)}
        env["source"] = f"hub {a.hub}" if a.hub else "kernels_dir (bundled forward + backward, local)"
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
    print("| model | dtype | layers replaced (with a backward kernel) | loss steps differing | parameters differing | eager vs eager (control) | step ms eager | step ms kernelized |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else "-"  # noqa: E731
        print(f"| {r['model']} | {r['dtype']} | {len(r['replaced'])} ({len(r['with_backward'])}) | "
              f"{len(r['loss_steps_differing'])} of {r['steps']} | {sum(r['parameters_differing'].values())} | "
              f"{len(r['eager_repeat_loss_steps_differing'])}, {sum(r['eager_repeat_parameters_differing'].values())} | "
              f"{fmt(r['step_ms_eager'])} | {fmt(r['step_ms_kernelized'])} |")
    ok = not errors and all(r["ok"] for r in rows)
    print("ALL BIT-IDENTICAL" if ok else "DIFFERENCES OR ERRORS (see training_check.json)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
