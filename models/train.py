#!/usr/bin/env python3
"""Train the two small models in which the verifier measures kernels at model level.

    python3 models/train.py --out models            # on a CUDA GPU: both models, ~1-3 min on an H200
    python3 models/train.py --device cpu --steps 20 --batch 4 --seq 128 --out /tmp/m   # smoke test
    python3 models/train.py --make-corpus           # rebuild corpus.txt and eval.txt from the docs

- tiny-llama: LlamaForCausalLM (LlamaRMSNorm, SiLU-gated MLP): the rms_norm, silu and
  silu_and_mul kernels are measured in it.
- tiny-gpt2: GPT2LMHeadModel (nn.LayerNorm, GELU): layer_norm, gelu and gelu_tanh.

Both are byte-level (vocab 256, token = UTF-8 byte; config.json carries
"kernelize_tokenizer": "bytes"), trained on corpus.txt (the project's own documentation)
until they predict eval.txt (a passage of that corpus, memorised on purpose) confidently:
a model that is sure of its next token shows a kernel's effect on the argmax only when the
kernel really moves the logits. Saved in float32 with safetensors (< 20 MB each), with
training.json beside the weights. Exit status: 0 when every model met --target, 3 when one
missed it (weights are saved anyway; train longer with --steps), 1 on an error.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import hashlib
import inspect
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MAX_BYTES = 20 * 1000 * 1000
EVAL_START = "`kernelize` finds every layer a hub kernel can replace"
EVAL_BYTES = 1700


def log(msg: str) -> None:
    print(f"train: {msg}", file=sys.stderr, flush=True)


# ---- corpus ---------------------------------------------------------------------------------

def make_corpus(out: Path) -> None:
    """corpus.txt = README.md + docs/*.md (sorted), separated by blank lines; eval.txt = the
    whole paragraphs of docs/python.md from EVAL_START that fit in EVAL_BYTES (~1500 bytes)."""
    parts = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
    corpus = "\n\n".join(p.read_text(encoding="utf-8").strip() + "\n" for p in parts)
    paras, size = [], 0
    for para in corpus[corpus.index(EVAL_START):].split("\n\n"):
        size += len(para.encode("utf-8")) + 2
        if size > EVAL_BYTES:
            break
        paras.append(para)
    while paras and paras[-1].startswith("#"):  # no heading without its paragraph
        paras.pop()
    text = "\n\n".join(paras) + "\n"
    (out / "corpus.txt").write_text(corpus, encoding="utf-8")
    (out / "eval.txt").write_text(text, encoding="utf-8")
    log(f"wrote {out / 'corpus.txt'} ({len(corpus.encode())} bytes from {len(parts)} files) "
        f"and {out / 'eval.txt'} ({len(text.encode())} bytes)")


def sha256(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


# ---- models ---------------------------------------------------------------------------------

def build(name: str, max_positions: int):
    import transformers
    common = dict(vocab_size=256, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if name == "tiny-llama":
        cfg = transformers.LlamaConfig(
            hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=max_positions, rms_norm_eps=1e-6,
            hidden_act="silu", tie_word_embeddings=False, attention_dropout=0.0, **common)
        return transformers.LlamaForCausalLM(cfg)
    if name == "tiny-gpt2":
        cfg = transformers.GPT2Config(
            n_embd=256, n_layer=4, n_head=4, n_positions=max_positions,
            activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            **common)
        return transformers.GPT2LMHeadModel(cfg)
    raise ValueError(name)


MODELS = ("tiny-llama", "tiny-gpt2")


def evaluate(model, ids, device, dtype=None) -> dict:
    """Next-token predictions on the eval text: mean top-1 probability (the model's confidence,
    what the harness reports as eager_mean_top1_prob), top-1 accuracy, loss (nats per byte)."""
    import torch
    import torch.nn.functional as F
    m = model if dtype is None else copy.deepcopy(model).to(dtype)
    m.eval()
    with torch.no_grad():
        logits = m(input_ids=ids[None].to(device), use_cache=False).logits[0].float()
    probs = torch.softmax(logits[:-1], dim=-1)
    target = ids[1:].to(device)
    out = {
        "tokens": int(ids.numel()),
        "mean_top1_prob": round(float(probs.max(dim=-1).values.mean()), 6),
        "top1_accuracy": round(float((logits[:-1].argmax(-1) == target).float().mean()), 6),
        "loss": round(float(F.cross_entropy(logits[:-1], target)), 6),
    }
    if dtype is None:
        model.train()
    return out


def save(model, folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    model.config.kernelize_tokenizer = "bytes"
    kw = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kw["safe_serialization"] = True  # transformers 4.x; 5.x writes safetensors only
    model.save_pretrained(str(folder), **kw)
    weights = list(folder.glob("*.safetensors"))
    if not weights:
        raise RuntimeError(f"save_pretrained wrote no .safetensors file in {folder}")
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    if size > MAX_BYTES:
        raise RuntimeError(f"{folder} is {size / 1e6:.1f} MB, over the 20 MB budget: make the "
                           "model smaller")
    return size


def train_one(name: str, args, corpus: bytes, eval_ids_list: list[int], device) -> dict:
    import torch
    import torch.nn.functional as F
    import transformers
    torch.manual_seed(args.seed)
    model = build(name, args.max_positions).to(device).train()
    params = sum(p.numel() for p in model.parameters())
    data = torch.tensor(list(corpus), dtype=torch.uint8, device=device)
    eval_ids = torch.tensor(eval_ids_list[: args.max_positions], dtype=torch.long)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    warmup = min(100, max(1, args.steps // 10))

    def lr_at(step: int) -> float:  # linear warm-up, then cosine down to 10 %
        if step < warmup:
            return args.lr * (step + 1) / warmup
        t = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    gen = torch.Generator().manual_seed(args.seed)
    offsets = torch.arange(args.seq + 1, device=device)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                else torch.autocast("cpu", enabled=False))
    log(f"{name}: {params / 1e6:.2f} M parameters, {args.steps} steps of {args.batch} x "
        f"{args.seq} bytes on {device}")
    t0 = time.perf_counter()
    losses: list = []  # detached, on the device: no sync per step
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, len(corpus) - args.seq - 1, (args.batch,), generator=gen)
        xy = data[starts.to(device)[:, None] + offsets].long()
        with autocast:
            logits = model(input_ids=xy[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                               xy[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses = (losses + [loss.detach()])[-100:]
        if (step + 1) % 100 == 0 or step + 1 == args.steps:
            mean = float(torch.stack(losses).mean())
            msg = f"{name}: step {step + 1}/{args.steps} loss {mean:.4f} (last 100) lr {lr_at(step):.2e}"
            if (step + 1) % 500 == 0 or step + 1 == args.steps:
                ev = evaluate(model, eval_ids, device)
                msg += (f" | eval: mean top-1 prob {ev['mean_top1_prob']:.3f}, "
                        f"accuracy {ev['top1_accuracy']:.3f}")
            log(msg + f" ({time.perf_counter() - t0:.0f} s)")
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    model.eval()
    ev32 = evaluate(model, eval_ids, device)
    ev16 = evaluate(model, eval_ids, device, torch.bfloat16)
    ev512 = evaluate(model, eval_ids[:512], device, torch.bfloat16)
    folder = args.out / name
    size = save(model.float().cpu(), folder)
    record = {
        "model": name, "class": type(model).__name__, "parameters": params,
        "size_bytes": size, "steps": args.steps, "batch": args.batch, "seq_len": args.seq,
        "lr": args.lr, "schedule": f"linear warm-up {warmup} steps, cosine to 10 %",
        "optimizer": "AdamW (0.9, 0.95), weight decay 0, grad clip 1.0",
        "precision": "bf16 autocast, f32 weights" if device.type == "cuda" else "f32",
        "seed": args.seed,
        "final_loss": round(float(torch.stack(losses).mean()), 6),  # mean of the last 100 steps
        "corpus": {"file": "models/corpus.txt", "bytes": len(corpus), "digest": sha256(corpus)},
        "eval": {"file": "models/eval.txt", "f32": ev32, "bf16": ev16, "bf16_first_512": ev512},
        "mean_top1_prob": ev32["mean_top1_prob"], "top1_accuracy": ev32["top1_accuracy"],
        "target_mean_top1_prob": args.target,
        "target_met": ev32["mean_top1_prob"] >= args.target,
        "seconds": round(seconds, 1),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python3 models/train.py " + " ".join(sys.argv[1:]),
    }
    (folder / "training.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    log(f"{name}: saved {folder} ({size / 1e6:.1f} MB) in {seconds:.0f} s: eval mean top-1 prob "
        f"{ev32['mean_top1_prob']:.3f} (bf16 {ev16['mean_top1_prob']:.3f}), top-1 accuracy "
        f"{ev32['top1_accuracy']:.3f}, final loss {record['final_loss']:.4f}")
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=HERE,
                   help="folder for tiny-llama/ and tiny-gpt2/ (default: models/)")
    p.add_argument("--device", default="cuda", help="default cuda; cpu only for a smoke test")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024,
                   help="bytes per training window (default 1024: every position is trained)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.8, help="mean top-1 prob on eval.txt to reach")
    p.add_argument("--max-positions", type=int, default=1024)
    p.add_argument("--only", choices=MODELS, action="append", help="train only this model")
    p.add_argument("--corpus", type=Path, default=HERE / "corpus.txt")
    p.add_argument("--eval-text", type=Path, default=HERE / "eval.txt")
    p.add_argument("--make-corpus", action="store_true",
                   help="rebuild corpus.txt and eval.txt next to this script from README.md "
                   "and docs/*.md, then exit")
    args = p.parse_args(argv)
    if args.make_corpus:
        make_corpus(HERE)
        return 0
    if args.seq > args.max_positions:
        p.error(f"--seq {args.seq} exceeds --max-positions {args.max_positions}")
    try:
        import torch
        import transformers
    except ModuleNotFoundError as e:
        log(f"ERROR: {e.name} is not installed for {sys.executable}; training needs torch and "
            "transformers (the GPU machine's python3 has both; here: python/ci-setup.sh, then "
            "python/.venv/bin/python)")
        return 1
    transformers.utils.logging.disable_progress_bar()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        log(f"ERROR: no CUDA device (torch {torch.__version__}, torch.version.cuda "
            f"{torch.version.cuda}). The models are trained on a GPU machine; for a smoke test "
            "only, run with --device cpu --steps 20 --batch 4 --seq 128 --out /tmp/m.")
        return 1
    corpus = args.corpus.read_bytes()
    eval_text = args.eval_text.read_bytes()
    if eval_text not in corpus:
        log(f"ERROR: {args.eval_text} is not a passage of {args.corpus}; rebuild both with --make-corpus")
        return 1
    if len(corpus) <= args.seq + 1:
        p.error(f"the corpus ({len(corpus)} bytes) is shorter than one window (--seq {args.seq})")
    log(f"corpus {args.corpus} ({len(corpus)} bytes), eval text {args.eval_text} "
        f"({len(eval_text)} bytes), torch {torch.__version__}")
    records = [train_one(n, args, corpus, list(eval_text), device) for n in (args.only or MODELS)]
    missed = [r["model"] for r in records if not r["target_met"]]
    if missed:
        log(f"TARGET MISSED: {', '.join(missed)} below mean top-1 prob {args.target} on the eval "
            "text; weights saved anyway; train longer (--steps) before committing them")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
