"""Training steps against eager, bit for bit: the model level of a backward kernel (docs/backward.md,
"What the verifier lacks", item 9) and the comparison scripts/training_check.py makes of the
client's training mode. One home for both: scripts/training_check.py and the verifier's model
harness (`kernelize_verifier.model_level`, which runs `compare_candidate` for a backward
candidate) import it.

A run is AdamW over fixed batches of token windows; per step the loss bits and each parameter's
gradient bits (hashed), at the end every parameter's bits. Eager must repeat itself for the
comparison to mean anything: eager attention, deterministic algorithms, and a control copy.
"""
from __future__ import annotations

import hashlib
import math
import statistics
from typing import Any, Callable

import torch

#: AdamW's eps by dtype: its default, but in f16 (where 1e-8 rounds to 0, and a parameter with a
#: zero gradient turns NaN at its first step) one f16 represents.
ADAMW_EPS = {"bf16": 1e-8, "f16": 1e-4, "f32": 1e-8}

INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def windows(tokens: list[int] | torch.Tensor, n: int, batch: int, seq: int, device,
            seed: int = 0) -> list[torch.Tensor]:
    """`n` batches of `batch` windows of `seq` tokens from `tokens`, at fixed random starts (the
    same for every copy trained on them)."""
    t = torch.as_tensor(tokens, dtype=torch.long)
    if len(t) < seq + 2:
        raise ValueError(f"{len(t)} tokens: too few for windows of {seq}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(t) - seq - 1, (n, batch), generator=g)
    return [torch.stack([t[s:s + seq] for s in row.tolist()]).to(device) for row in starts]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The elements' bit patterns (an integer tensor of the same element size)."""
    return t.detach().contiguous().reshape(-1).view(INT_OF_SIZE[t.element_size()])


def grad_digests(model) -> dict[str, bytes]:
    """Each parameter's gradient bits, hashed (None-gradients left out)."""
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
        losses.append(float(loss.detach()))
        loss_bits.append(bits(loss).cpu().numpy().tobytes())
    return losses, loss_bits, times, grads


def parameters_differing(model, params: dict) -> dict[str, int]:
    """Parameter name -> elements whose bits differ from `params`' (eager's), where any do."""
    out = {}
    for n, p in model.named_parameters():
        d = int((bits(p) != bits(params[n])).sum())
        if d:
            out[n] = d
    return out


def gradients_differing(eager_grads: list, grads: list) -> dict[str, list[str]]:
    """step -> the parameters whose gradient bits differ from eager's (the untimed steps)."""
    out = {}
    for i, (a, b) in enumerate(zip(eager_grads, grads)):
        names = sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
        if names:
            out[str(i)] = names
    return out


def against_eager(prefix: str, eager_run: tuple, run: tuple, model, params: dict) -> dict:
    """A copy's training (`run`, what `train` returned for `model`) against eager's
    (`eager_run`, `params` its parameters): `<prefix>loss_steps_differing`,
    `<prefix>parameters_differing` and `<prefix>gradients_differing`."""
    return {f"{prefix}loss_steps_differing": [i for i, (a, b) in enumerate(zip(eager_run[1], run[1])) if a != b],
            f"{prefix}parameters_differing": parameters_differing(model, params),
            f"{prefix}gradients_differing": gradients_differing(eager_run[3], run[3])}


def compare_candidate(load: Callable[[], Any], model_name: str, op: str, semantics: str,
                      function: Callable, data: list[torch.Tensor], dtype: str, device,
                      timed_from: int = 3, lr: float = 1e-3) -> dict[str, Any]:
    """A backward candidate's model level: three copies of the model (`load()`, the same weights
    each time) train on `data`: eager; the control, whose layers of `op` run eager's forward and
    eager's own gradients of the op through the wrapping (`backward_field.eager_function`); the
    candidate's, whose layers run `function` as their backward (`backward_field.wrap_layers`).
    Losses, gradients and parameters of the last two against eager's, bit for bit. `ok` means the
    candidate's training is bit-identical with eager's; `control_identical` that the wrapping
    alone leaves eager's training as it was (where it does not, e.g. an RMSNorm's f32 input
    gradient, a candidate cannot match eager there either)."""
    from kernelize_verifier import backward_field as BF
    eager, control, cand = load(), load(), load()
    wrapped = BF.wrap_layers(cand, op, semantics, function)
    BF.wrap_layers(control, op, semantics, BF.eager_function(op, semantics))
    out: dict[str, Any] = {"dtype": dtype, "steps": len(data), "op": op, "layers_wrapped": wrapped}
    if not wrapped:
        out.update(skipped=f"no layer of {model_name} computes {BF.forward_of(op, semantics)} ({semantics})",
                   ok=None)
        return out
    cuda, eps = device.type == "cuda", ADAMW_EPS[dtype]
    ran_eager = train(eager, data, lr, timed_from, cuda, eps)
    ran_control = train(control, data, lr, timed_from, cuda, eps)
    ran_cand = train(cand, data, lr, timed_from, cuda, eps)
    (le, _, te, _), (lk, _, tk, gk) = ran_eager, ran_cand
    params = dict(eager.named_parameters())
    finite = [abs(a - b) for a, b in zip(le, lk) if math.isfinite(a) and math.isfinite(b)]
    out.update({
        "adamw_eps": eps, "losses_eager": le, "losses_control": ran_control[0], "losses_candidate": lk,
        **against_eager("control_", ran_eager, ran_control, control, params),
        **against_eager("candidate_", ran_eager, ran_cand, cand, params),
        "grad_steps_compared": len(gk),
        "max_loss_abs_diff": max(finite) if finite else None,
        "losses_finite": len(finite) == len(le),
        "step_ms_eager": statistics.median(te) if te else None,
        "step_ms_candidate": statistics.median(tk) if tk else None,
    })

    def differs(prefix: str) -> bool:
        return any(v for k, v in out.items() if k.startswith(prefix) and k.endswith("_differing"))
    out["control_identical"], out["ok"] = not differs("control_"), not differs("candidate_")
    return out
