#!/usr/bin/env python3
"""Which layout eager's attention writes its output in, against the query's (issue 31): the exact
backend's SDPA operators return the query's layout and copy only where the backend wrote
another (`exact._in_query_layout`). For decode and prefill shapes of a Llama-like layer (32 heads
of 64, the query a transposed view of its projection as in transformers) in bf16, f16 and f32:
eager's backend (`torch._fused_sdp_choice`), the output's strides, the query's, whether the
operator copies, and whether its output is bit-identical with F.scaled_dot_product_attention's.

    python3 bench/sdpa_layout_probe.py OUT_DIR

Writes OUT_DIR/sdpa_layout_probe.json and prints a table.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernelize import exact  # noqa: E402,F401  (defines the operators)
from sdpa_mask_probe import BACKENDS  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    rows = []
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for name, s_q, s_k, masked in (("decode", 1, 576, True), ("prefill", 512, 512, False)):
            def heads(s):
                return torch.randn(1, s, 32, 64, generator=g).to("cuda", dt).transpose(1, 2)
            q, k, v = heads(s_q), heads(s_k), heads(s_k)
            mask = torch.ones(1, 1, s_q, s_k, dtype=torch.bool, device="cuda") if masked else None
            causal = not masked
            with torch.no_grad():
                ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
                got = torch.ops.kernelize.eager_sdpa.default(q, k, v, mask, 0.0, causal, None, False)
                choice = int(torch._fused_sdp_choice(q, k, v, mask, 0.0, causal))
            like_q = torch.empty_like(q).stride()
            rows.append(dict(dtype=str(dt).split(".")[-1], shape=name, backend=BACKENDS.get(choice, choice),
                             out_stride=ref.stride(), query_stride=like_q,
                             copies=ref.stride() != like_q, op_stride=got.stride(),
                             identical=bool(torch.equal(ref, got))))
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda)
    (out / "sdpa_layout_probe.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    print(env)
    print("| dtype | shape | backend | eager's output strides | query's | operator copies | bits |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['dtype']} | {r['shape']} | {r['backend']} | {r['out_stride']} | {r['query_stride']} "
              f"| {'yes' if r['copies'] else 'no'} | {'identical' if r['identical'] else 'DIFFER'} |")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
