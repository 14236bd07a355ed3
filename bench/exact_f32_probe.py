#!/usr/bin/env python3
"""Which part of a Llama-family model keeps exact compile from eager's bits in f32 on the GPU
(docs/compile.md, "f32: a miss"): the same small Llama compiled several ways, prefill logits
(2 x 64 tokens) and 3 decode steps compared bit for bit with eager.

    python3 bench/exact_f32_probe.py [--dtype f32]
"""
from __future__ import annotations

import argparse
import copy
import sys
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

import kernelize as K  # noqa: E402
from exact_compile import DTYPES, build_arch, lm_steps  # noqa: E402
from kernelize.locate import compare  # noqa: E402


def variants():
    # run 5 and 6 (docs/gpu-runs/2026-11-26-s8) were made when exact_compile compiled the whole
    # module by default; regional=False keeps these variants what they were
    def whole(m):
        K.exact_compile(m, regional=False)

    def whole_static(m):
        K.exact_compile(m, dynamic=False, regional=False)

    def inner_only(m):
        K.exact_compile(m.model, regional=False)

    def blocks(m):
        for b in m.model.layers:
            K.exact_compile(b)

    def blocks_static(m):
        for b in m.model.layers:
            K.exact_compile(b, dynamic=False)

    def attn_only(m):
        for b in m.model.layers:
            K.exact_compile(b.self_attn, dynamic=False)

    def mlp_only(m):
        for b in m.model.layers:
            K.exact_compile(b.mlp, dynamic=False)

    def norms_only(m):
        for b in m.model.layers:
            K.exact_compile(b.input_layernorm, dynamic=False)
            K.exact_compile(b.post_attention_layernorm, dynamic=False)
        K.exact_compile(m.model.norm, dynamic=False)

    def rotary_only(m):
        K.exact_compile(m.model.rotary_emb, dynamic=False)

    return dict(whole=whole, whole_static=whole_static, inner_only=inner_only, blocks=blocks,
                blocks_static=blocks_static, attn_only=attn_only, mlp_only=mlp_only,
                norms_only=norms_only, rotary_only=rotary_only)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="f32")
    p.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa or eager")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, a, flush=True)
    base = build_arch("llama", "small", DTYPES[a.dtype])
    base.config._attn_implementation = a.attn
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 256, (2, 64), generator=g).cuda()
    ref_full, ref_steps = lm_steps(base, ids, 3)
    for name, fn in variants().items():
        try:
            m = copy.deepcopy(base)
            fn(m)
            full, steps = lm_steps(m, ids, 3)
            dp, dd = compare(ref_full, full), compare(torch.stack(ref_steps), torch.stack(steps))
            print(f"| {a.dtype} | {a.attn} | {name} | {dp.mismatched} | {dd.mismatched} |", flush=True)
        except Exception as e:
            traceback.print_exc()
            print(f"| {a.dtype} | {a.attn} | {name} | error {e!r:.80} | |", flush=True)
        torch._dynamo.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
