#!/usr/bin/env python3
"""The exact backend's masked attention operator on a GPU (issue 31, session 28): could it run
the cuDNN attention operator directly, skipping the composite? For each case, the bits of
(1) eager's F.scaled_dot_product_attention with the boolean mask, (2) `kernelize::eager_sdpa_bias`
(the composite with the hoisted additive mask, as the exact backend runs it), (3) the backend
operator the composite records for the additive mask (make_fx), called directly with the same
tensors, each run --repeats times; and the host time a call of each.

    python3 bench/sdpa_bias_probe.py OUT_DIR [--calls N] [--repeats R]

Session 28, run 1 (an earlier version of this script, docs/gpu-runs/2026-11-29-s28/): the
direct call gave other bits than eager in 2 of 12 f16 cases at batch 8, where the composite
gave eager's, and was not faster; this version asks whether each path is deterministic.

Cases: decode (1 and 8 queries' rows against a 512-slot static cache, the mask a prefix of
valid slots) and prefill (1x512, causal) shapes of the 1B-class Llama (32 heads of 64) and
Mistral (16 of 128) configs of bench/exact_compile.py; a random mask; a batch row with every key
masked; bf16, f16 and f32. Writes OUT_DIR/sdpa_bias_probe.json and prints a table, and (session
31) where the operator's host time goes: F.sdpa with the additive mask alone, the two backend
choices alone, the operator's function without the dispatcher.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from kernelize import exact  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from op_overhead import per_call_us  # noqa: E402  (the median of 5 repetitions; runs 1-3 timed one)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))


def tensors(b: int, heads: int, d: int, q_len: int, kv_len: int, kind: str, dt, g):
    def heads_of(s):   # (b, s, h, d) projected, viewed (b, h, s, d) as the models do
        return torch.randn(b, s, heads, d, generator=g).to("cuda", dt).transpose(1, 2)
    q, k, v = heads_of(q_len), heads_of(kv_len), heads_of(kv_len)
    kv = torch.arange(kv_len, device="cuda")
    if kind == "random":
        mask = torch.rand(b, 1, q_len, kv_len, generator=g).to("cuda") > 0.3
        mask[..., 0] = True
    else:
        filled = 300 if q_len < kv_len else kv_len   # decode: 300 of the cache's slots in use
        pos = torch.arange(filled - q_len, filled, device="cuda")[:, None]
        mask = (kv[None, :] <= pos)[None, None].expand(b, 1, q_len, kv_len).clone()
        if kind == "masked_row" and b > 1:
            mask[-1] = False
    return q, k, v, mask


def traced_direct(q, k, v, bias):
    """The one operator F.scaled_dot_product_attention records for these tensors with `bias` as
    its mask, as a callable, or None where it records more than that operator and its outputs."""
    from torch.fx.experimental.proxy_tensor import make_fx
    import operator
    gm = make_fx(lambda q_, k_, v_, b_: F.scaled_dot_product_attention(q_, k_, v_, attn_mask=b_))(
        q, k, v, bias)
    ops = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    if len(ops) != 1:
        return None, [str(n.target) for n in ops]
    node = ops[0]
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    env = dict(zip(names, (q, k, v, bias)))

    def call():
        args = [env[x.name] if isinstance(x, torch.fx.Node) else x for x in node.args]
        kw = {key: env[x.name] if isinstance(x, torch.fx.Node) else x for key, x in node.kwargs.items()}
        return node.target(*args, **kw)[0]
    return call, [str(node.target)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    op = torch.ops.kernelize.eager_sdpa_bias.default
    g = torch.Generator().manual_seed(0)
    shapes = [("llama decode b1", 1, 32, 64, 1, 512), ("llama decode b8", 8, 32, 64, 1, 512),
              ("mistral decode b1", 1, 16, 128, 1, 512), ("mistral decode b8", 8, 16, 128, 1, 512),
              ("mistral prefill 1x512", 1, 16, 128, 512, 512)]
    rows = []
    with torch.no_grad():
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            if exact.mask_conversion(dt, torch.device("cuda")) is None:
                print(f"{dt}: no hoisted conversion on this GPU (the exact backend passes the boolean mask)")
                continue
            for name, b, h, d, q_len, kv_len in shapes:
                for kind in ("prefix", "random", "masked_row"):
                    if kind == "masked_row" and b == 1:
                        continue
                    q, k, v, mask = tensors(b, h, d, q_len, kv_len, kind, dt, g)
                    bias = exact.sdpa_mask_bias(mask, dt)
                    direct, traced = traced_direct(q, k, v, bias)
                    paths = {"eager": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                             "operator": lambda: op(q, k, v, mask, bias, 0.0, False, None, False)}
                    if direct is not None:
                        paths["direct"] = direct
                    ref = paths["eager"]()
                    if kind == "prefix":   # where the operator's host time goes (session 31)
                        def choice():
                            for m_ in (mask, bias):
                                torch._fused_sdp_choice(q, k, v, m_, 0.0, False, scale=None, enable_gqa=False)
                        parts = {"bias": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                                 "python": lambda: exact.eager_sdpa_bias(q, k, v, mask, bias, 0.0, False, None, False),
                                 "choice": choice}
                        parts_us = {label: per_call_us(fn, a.calls) for label, fn in parts.items()}
                    row = {"dtype": str(dt).split(".")[-1], "case": name, "mask": kind, "traced": traced}
                    for label, fn in paths.items():
                        outs = [fn() for _ in range(a.repeats)]
                        row[f"{label}_deterministic"] = all(same_bits(outs[0], o) for o in outs)
                        row[f"{label}_identical"] = all(same_bits(ref, o) for o in outs)
                        if kind == "prefix":
                            row[f"{label}_us"] = per_call_us(fn, a.calls)
                    if kind == "prefix":
                        row.update({f"{label}_us": us for label, us in parts_us.items()})
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "cudnn": torch.backends.cudnn.version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (out / "sdpa_bias_probe.json").write_text(json.dumps({"env": env, "calls": a.calls, "rows": rows}, indent=1))
    print(f"\n{env}\n\n| dtype | case | mask | eager det. | operator = eager | direct = eager | direct det. | eager µs | operator µs | direct µs |")
    print("| --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['dtype']} | {r['case']} | {r['mask']} | {r['eager_deterministic']} | "
              f"{r['operator_identical']} | {r.get('direct_identical', '-')} | {r.get('direct_deterministic', '-')} | "
              + " | ".join(f"{r[k]:.1f}" if k in r else "-" for k in ("eager_us", "operator_us", "direct_us")) + " |")
    print("\nWhere the operator's host time goes (µs a call; bias: F.scaled_dot_product_attention with "
          "the additive mask, what the operator calls; python: the operator's function called without "
          "the dispatcher; choice: its two torch._fused_sdp_choice calls):\n")
    print("| dtype | case | eager | bias | choice | python | operator |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "python_us" in r:
            print(f"| {r['dtype']} | {r['case']} | " + " | ".join(
                f"{r[k + '_us']:.1f}" for k in ("eager", "bias", "choice", "python", "operator")) + " |")
    bad = [r for r in rows if not r["operator_identical"]]
    print(f"\nthe operator: {len(rows) - len(bad)} of {len(rows)} cases bit-identical with eager; "
          f"the direct call: {sum(r.get('direct_identical', False) for r in rows)} of {len(rows)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
