#!/usr/bin/env python3
"""The exact backend's masked attention operator on a GPU (issue 31, session 28): its bits
against eager's F.scaled_dot_product_attention with the boolean mask, which way it ran (the
backend operator directly, the composite with the converted mask, or the composite with the
boolean mask), and its host time a call now and as it ran before session 28 (two
`torch._fused_sdp_choice` questions every call, then the composite).

    python3 bench/sdpa_bias_probe.py OUT_DIR [--calls N]

Cases: decode (1 and 8 queries' rows against a 512-slot static cache, the mask a prefix of
valid slots) and prefill (1x512, causal) shapes of the 1B-class Llama (32 heads of 64) and
Mistral (16 of 128) configs of bench/exact_compile.py, KV repeated to the query heads as
transformers does when a mask is given; a random mask; a batch row with every key masked; bf16,
f16 and f32. Writes OUT_DIR/sdpa_bias_probe.json and prints a table.
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


def per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    op = torch.ops.kernelize.eager_sdpa_bias.default
    g = torch.Generator().manual_seed(0)
    shapes = [("llama decode b1", 1, 32, 64, 1, 512), ("llama decode b8", 8, 32, 64, 1, 512),
              ("mistral decode b1", 1, 16, 128, 1, 512), ("mistral decode b8", 8, 16, 128, 1, 512),
              ("mistral prefill 1x512", 1, 16, 128, 512, 512)]
    rows = []
    real_hoisted = exact._hoisted

    def before(query, key, value, attn_mask, bias, dropout_p, is_causal, scale, enable_gqa, backend):
        # session 27's operator: both questions every call, then the composite with the bias
        def choice(m):
            return int(torch._fused_sdp_choice(query, key, value, m, dropout_p, is_causal,
                                               scale=scale, enable_gqa=enable_gqa))
        return choice(attn_mask) == backend and choice(bias) == backend

    with torch.no_grad():
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            for name, b, h, d, q_len, kv_len in shapes:
                for kind in ("prefix", "random", "masked_row"):
                    if kind == "masked_row" and b == 1:
                        continue
                    q, k, v, mask = tensors(b, h, d, q_len, kv_len, kind, dt, g)
                    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                    exact._HOISTED.clear()
                    bias = exact.sdpa_mask_bias(mask, dt) if exact.mask_conversion(dt, q.device) else mask
                    got = op(q, k, v, mask, bias, 0.0, False, None, False)
                    again = op(q, k, v, mask, bias, 0.0, False, None, False)
                    entry = next(iter(exact._HOISTED.values()), None)
                    how = (entry[0].name() if isinstance(entry, tuple) else
                           "composite, converted mask" if entry else "composite, boolean mask")
                    row = {"dtype": str(dt).split(".")[-1], "case": name, "mask": kind, "how": how,
                           "identical": same_bits(ref, got) and same_bits(ref, again),
                           "backend_bool": int(torch._fused_sdp_choice(q, k, v, mask, 0.0, False))}
                    if kind == "prefix":
                        row["eager_us"] = per_call_us(
                            lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), a.calls)
                        row["now_us"] = per_call_us(
                            lambda: op(q, k, v, mask, bias, 0.0, False, None, False), a.calls)
                        exact._hoisted = before
                        try:
                            row["before_us"] = per_call_us(
                                lambda: op(q, k, v, mask, bias, 0.0, False, None, False), a.calls)
                            row["before_identical"] = same_bits(ref, op(q, k, v, mask, bias, 0.0, False, None, False))
                        finally:
                            exact._hoisted = real_hoisted
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "cudnn": torch.backends.cudnn.version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (out / "sdpa_bias_probe.json").write_text(json.dumps({"env": env, "calls": a.calls, "rows": rows}, indent=1))
    print(f"\n{env}\n\n| dtype | case | identical (all masks) | how (prefix mask) | eager µs | before µs | now µs |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    for r in rows:
        if r["mask"] != "prefix":
            continue
        same = all(x["identical"] for x in rows if x["dtype"] == r["dtype"] and x["case"] == r["case"])
        print(f"| {r['dtype']} | {r['case']} | {same} | {r['how']} | {r['eager_us']:.1f} | "
              f"{r['before_us']:.1f} | {r['now_us']:.1f} |")
    bad = [r for r in rows if not r["identical"] or not r.get("before_identical", True)]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} cases bit-identical with eager")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
