#!/usr/bin/env python3
"""How this torch turns a boolean attention mask into the additive mask its SDPA backends take
(issue 31: eager converts the mask again in every layer; the exact backend could convert it once
per step if, and only if, the converted mask gives the same backend and the same bits).

    python3 bench/sdpa_mask_probe.py OUT_DIR

For decode and prefill shapes of a Llama-like layer (32 heads of 64; KV repeated to 32 heads, as
transformers does when a mask is given) in bf16, f16 and f32: the backend eager picks with the
boolean mask and with each candidate additive mask (`torch._fused_sdp_choice`), whether the
output of F.scaled_dot_product_attention with the additive mask is bit-identical with the one
with the boolean mask (ordinary rows, and a batch row whose keys are all masked), and the ATen
graph of the boolean-mask call traced on real tensors (make_fx), which shows the conversion this
torch records. Writes OUT_DIR/sdpa_mask_probe.json and prints a table.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.itemsize == 2:
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def case(name: str, dt, b: int, q_len: int, kv_len: int, visible, full_masked_row: bool, g):
    q = torch.randn(b, 32, q_len, 64, generator=g).to("cuda", dt)
    k = torch.randn(b, 32, kv_len, 64, generator=g).to("cuda", dt)
    v = torch.randn(b, 32, kv_len, 64, generator=g).to("cuda", dt)
    kv = torch.arange(kv_len, device="cuda")
    qpos = torch.arange(kv_len - q_len, kv_len, device="cuda")[:, None] if visible is None else \
        torch.full((q_len, 1), visible, device="cuda")
    mask = (kv[None, :] <= qpos)[None, None].expand(b, 1, q_len, kv_len).clone()
    if full_masked_row:
        mask[-1] = False
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    choice = BACKENDS.get(int(torch._fused_sdp_choice(q, k, v, mask, 0.0, False)), "?")
    row = {"case": name, "dtype": str(dt).split(".")[-1], "bool_backend": choice, "candidates": {}}
    zero = torch.scalar_tensor(0.0, dtype=dt, device="cuda")
    for label, c in (("-inf", float("-inf")), ("-65504", -65504.0), ("finfo.min", torch.finfo(dt).min),
                     ("-1024", -1024.0)):
        fm = torch.where(mask.logical_not(), c, zero)
        ch = BACKENDS.get(int(torch._fused_sdp_choice(q, k, v, fm, 0.0, False)), "?")
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=fm)
        rows_ok = same_bits(out[:-1], ref[:-1]) if full_masked_row else same_bits(out, ref)
        row["candidates"][label] = {"backend": ch, "identical": rows_ok,
                                    "last_batch_row_identical": same_bits(out[-1], ref[-1])}
    try:
        gm = make_fx(lambda q_, k_, v_, m_: F.scaled_dot_product_attention(q_, k_, v_, attn_mask=m_))(
            q, k, v, mask)
        row["traced"] = [f"{n.target}{tuple(a if not isinstance(a, torch.fx.Node) else a.name for a in n.args)}"
                         for n in gm.graph.nodes if n.op == "call_function"]
    except Exception as e:   # noqa: BLE001 - recorded, not fatal
        row["traced"] = [f"make_fx failed: {type(e).__name__}: {e}"[:300]]
    return row


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    rows = []
    with torch.no_grad():
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            rows.append(case("decode b1 kv576 pos512", dt, 1, 1, 576, 512, False, g))
            rows.append(case("decode b8 kv576 pos512", dt, 8, 1, 576, 512, False, g))
            rows.append(case("decode b2 kv576, batch row 2 all masked", dt, 2, 1, 576, 512, True, g))
            rows.append(case("prefill 1x512 causal", dt, 1, 512, 512, None, False, g))
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "cudnn": torch.backends.cudnn.version()}
    (out / "sdpa_mask_probe.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print(env)
    for r in rows:
        print(f"{r['case']:42s} {r['dtype']:9s} bool->{r['bool_backend']:9s} " + "  ".join(
            f"{k}:{v['backend']}/{'same' if v['identical'] else 'DIFF'}"
            f"{'' if v['last_batch_row_identical'] else '(lastrow diff)'}"
            for k, v in r["candidates"].items()))
        for t in r["traced"]:
            if "where" in t or "scalar_tensor" in t or "attention" in t or "failed" in t:
                print("     traced:", t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
