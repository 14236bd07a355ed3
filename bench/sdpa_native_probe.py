#!/usr/bin/env python3
"""The exact backend's attention operator, C++ kernel against its Python twin (issue 31).

    python3 bench/sdpa_native_probe.py OUT_DIR

At decode shapes (a GQA 1x576 query and a 300-key one, the query a transposed view of its
projection as a model makes it), in bf16, f16 and f32: eager's backend choice, how many output
elements differ between two calls of the same function (eager's own run-to-run determinism),
between `kernelize::eager_sdpa` (the C++ kernel of native.py) and `py_eager_sdpa` (the Python
twin), whether the backend's output has the query's strides (else the operator copies it), and
the host µs a call of F.scaled_dot_product_attention, the C++ operator and the twin. Writes
OUT_DIR/sdpa_native_probe.json and prints a table.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from kernelize import exact, ops  # noqa: E402,F401


def us(fn, calls=500) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def differ(a, b) -> int:
    v = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return int((a.contiguous().view(v) != b.contiguous().view(v)).sum())


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    kernels_from = ops.ensure_kernels()
    dev = torch.device("cuda")
    sdpa, twin = torch.ops.kernelize.eager_sdpa.default, torch.ops.kernelize.py_eager_sdpa.default
    rows = []
    with torch.no_grad():
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for b, h, kvh, sk, d, masked in [(1, 32, 8, 576, 64, False), (1, 32, 8, 576, 64, True),
                                             (8, 16, 16, 300, 128, False)]:
                torch.manual_seed(0)
                q = torch.randn(b, 1, h, d, device=dev, dtype=dtype).transpose(1, 2)
                k = torch.randn(b, kvh, sk, d, device=dev, dtype=dtype)
                v = torch.randn(b, kvh, sk, d, device=dev, dtype=dtype)
                m = torch.ones(b, 1, 1, sk, device=dev, dtype=torch.bool) if masked else None
                gqa = h != kvh
                kw = {"enable_gqa": True} if gqa else {}
                raw = F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
                row = {
                    "dtype": str(dtype).split(".")[-1], "shape": [b, h, kvh, sk, d], "mask": masked,
                    "backend": int(torch._fused_sdp_choice(q, k, v, m, 0.0, False, enable_gqa=gqa)),
                    "raw_has_query_strides": raw.stride() == q.stride(),
                    "F_vs_F": differ(raw, F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)),
                    "twin_vs_twin": differ(twin(q, k, v, m, 0.0, False, None, gqa),
                                           twin(q, k, v, m, 0.0, False, None, gqa)),
                    "native_vs_twin": differ(sdpa(q, k, v, m, 0.0, False, None, gqa),
                                             twin(q, k, v, m, 0.0, False, None, gqa)),
                    "native_vs_native": differ(sdpa(q, k, v, m, 0.0, False, None, gqa),
                                               sdpa(q, k, v, m, 0.0, False, None, gqa)),
                    "us_F": us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)),
                    "us_native": us(lambda: sdpa(q, k, v, m, 0.0, False, None, gqa)),
                    "us_twin": us(lambda: twin(q, k, v, m, 0.0, False, None, gqa)),
                }
                rows.append(row)
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "kernels_from": kernels_from}
    (out / "sdpa_native_probe.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    keys = list(rows[0])
    print(env)
    print("| " + " | ".join(keys) + " |\n|" + " --- |" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
