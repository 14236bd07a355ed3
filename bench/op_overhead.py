#!/usr/bin/env python3
"""The host's cost of one kernelize launch, by the way it is called (issue 31, default mode).

    python3 bench/op_overhead.py OUT_DIR [--calls 2000] [--chain 22]

In `torch.compile`'s default mode (no CUDA graphs) every call of a compiled step runs inductor's
Python wrapper, which calls each opaque op through PyTorch's dispatcher: a decode step of a 1B
Llama calls kernelize's ops about 90 times. This measures, on one bf16 row of 2048 (a decode
step's shape), the host microseconds of one call made:

- `direct`: `launch.run_rms_norm` (what a swapped layer runs eagerly);
- `custom_op`: the same launch registered as a `torch.library.custom_op` (how kernelize's ops
  were defined until session 16);
- `library`: `torch.ops.kernelize.launch_rms_norm`, the op the compiled code calls: a plain
  `torch.library.Library` operator (no autograd wrapper; `python/kernelize/ops.py`) whose CUDA
  kernel is the C++ one of `kernelize/native.py` where it built (`kernels_from` in the json says
  whether), else the Python one;
- `py_library`: `torch.ops.kernelize.py_launch_rms_norm`, the same operator with the Python
  kernel (what `library` was until session 24, and what the C++ kernel hands its odd cases to);
- `aten`: `torch.rms_norm` (PyTorch's own op, for scale);
- `compiled-*`: a function of `--chain` such calls in a row compiled by inductor (default mode),
  its wall time divided by the calls: the custom op, the `Library` op, and `F.rms_norm` lowered
  by inductor itself (plain compile's way).
- the SDPA op of the exact backend (`kernelize::eager_sdpa`) against `F.scaled_dot_product_attention`
  at a decode step's shape (batch 1, 32 heads, 1 query, 576 keys, head 64); where the exact
  backend hoists the mask's conversion (cuDNN): its `eager_sdpa_bias`, F.scaled_dot_product_attention
  given the additive mask, ATen's backend choice alone (the hoisted op asks it twice a call), and
  the cuDNN operator that plain compile's graph calls.

Each figure is the median over 5 repetitions of `--calls` calls then one synchronisation.
Writes OUT_DIR/op_overhead.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import kernelize as K  # noqa: E402
from kernelize import exact as _exact, launch as L  # noqa: E402


def per_call_us(fn, calls: int, per: int = 1) -> float:
    """Median host µs of one call of `fn` (which makes `per` launches) over 5 repetitions."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / (calls * per) * 1e6)
    return statistics.median(runs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--chain", type=int, default=22)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    kern = K.get_kernel("rms_norm", dtype="bf16", cols=2048, kernels_dir=ROOT / "kernels",
                        names=["rms_norm_llama"])
    k, key = kern.compiled, kern.key
    x = torch.randn(1, 1, 2048, device=dev, dtype=torch.bfloat16)
    w = torch.randn(2048, device=dev, dtype=torch.bfloat16)
    eps = 1e-5

    @torch.library.custom_op("kzbench::rms", mutates_args=(), device_types="cuda")
    def rms(x: torch.Tensor, w: torch.Tensor, eps: float, key: int) -> torch.Tensor:
        return L.run_rms_norm(k, x, w, eps)

    @rms.register_fake
    def _(x, w, eps, key):
        return torch.empty_like(x)

    custom = torch.ops.kzbench.rms.default
    plain = torch.ops.kernelize.launch_rms_norm.default
    py_plain = torch.ops.kernelize.py_launch_rms_norm.default
    from kernelize import ops as _ops
    kernels_from = _ops.ensure_kernels()

    rows: dict[str, float] = {}
    with torch.no_grad():
        rows["direct"] = per_call_us(lambda: L.run_rms_norm(k, x, w, eps), a.calls)
        rows["custom_op"] = per_call_us(lambda: custom(x, w, eps, key), a.calls)
        rows["library"] = per_call_us(lambda: plain(x, w, eps, key), a.calls)
        rows["py_library"] = per_call_us(lambda: py_plain(x, w, eps, key), a.calls)
        rows["aten"] = per_call_us(lambda: torch.rms_norm(x, [2048], w, eps), a.calls)

        def chain(op):
            def f(y):
                for _ in range(a.chain):
                    y = op(y)
                return y
            return f

        variants = {
            "compiled-library (exact backend)": (chain(lambda y: plain(y, w, eps, key)), _exact.backend),
            "compiled-custom_op (inductor)": (chain(lambda y: custom(y, w, eps, key)), "inductor"),
            "compiled-library (inductor)": (chain(lambda y: plain(y, w, eps, key)), "inductor"),
            "compiled-py_library (inductor)": (chain(lambda y: py_plain(y, w, eps, key)), "inductor"),
            "compiled-F.rms_norm (inductor)": (chain(lambda y: F.rms_norm(y, [2048], w, eps)), "inductor"),
        }
        for name, (fn, backend) in variants.items():
            torch._dynamo.reset()
            c = torch.compile(fn, backend=backend, fullgraph=True)
            rows[name] = per_call_us(lambda: c(x), max(a.calls // a.chain, 50), a.chain)

        q = torch.randn(1, 32, 1, 64, device=dev, dtype=torch.bfloat16)
        kv = torch.randn(1, 32, 576, 64, device=dev, dtype=torch.bfloat16)
        mask = torch.ones(1, 1, 1, 576, device=dev, dtype=torch.bool)
        sdpa = torch.ops.kernelize.eager_sdpa.default
        rows["sdpa: F.scaled_dot_product_attention"] = per_call_us(
            lambda: F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask), a.calls)
        rows["sdpa: kernelize::eager_sdpa"] = per_call_us(
            lambda: sdpa(q, kv, kv, mask, 0.0, False, None, False), a.calls)
        # the hoisted form (exact.hoist_sdpa_masks): the mask converted once, each call given the
        # additive mask and asking ATen's backend choice for both; and its parts
        backend = int(torch._fused_sdp_choice(q, kv, kv, mask, 0.0, False))
        rows["sdpa: torch._fused_sdp_choice (backend %d)" % backend] = per_call_us(
            lambda: torch._fused_sdp_choice(q, kv, kv, mask, 0.0, False, scale=None, enable_gqa=False),
            a.calls)
        if _exact.mask_conversion(q.dtype, dev) is not None:
            bias = torch.ops.kernelize.sdpa_mask_bias.default(mask, q.dtype)
            sdpa_bias = torch.ops.kernelize.eager_sdpa_bias.default
            rows["sdpa: F.scaled_dot_product_attention, additive mask"] = per_call_us(
                lambda: F.scaled_dot_product_attention(q, kv, kv, attn_mask=bias), a.calls)
            rows["sdpa: kernelize::eager_sdpa_bias"] = per_call_us(
                lambda: sdpa_bias(q, kv, kv, mask, bias, 0.0, False, None, False), a.calls)
            if backend == 3:   # what plain compile's graph calls: the cuDNN operator itself
                cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention.default
                rows["sdpa: aten::_scaled_dot_product_cudnn_attention, additive mask"] = per_call_us(
                    lambda: cudnn(q, kv, kv, bias, False, 0.0, False, False), a.calls)

    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "calls": a.calls, "chain": a.chain, "kernels_from": kernels_from}
    (out / "op_overhead.json").write_text(json.dumps({"env": env, "us_per_call": rows}, indent=1))
    print(f"{env}\n\n| how the launch is called | host µs a call |\n| --- | ---: |")
    for name, us in rows.items():
        print(f"| {name} | {us:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
