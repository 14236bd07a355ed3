#!/usr/bin/env python3
"""Write PyTorch eager inputs and outputs for the conformance comparison.

Run on a GPU machine:  python3 scripts/conformance.py DIR
It writes DIR/manifest.json and one safetensors file per (layer, dtype, shape, inputs) with
tensors x (the gated ops: gate and up), [weight], [bias], [residual], out, [residual_out].
Then the verifier runs its built-in reference layers on the same inputs and tabulates the
bitwise agreement:
    kernelize __conformance DIR --out docs/conformance-table.md
(or, from a .gpu-stage, tests/gpu __conformance DIR OUT.md).
"""
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
SHAPES = [(7, 127), (33, 1000), (3, 1001), (1024, 4096), (64, 8192), (2, 65536)]
# Eager's mean (HF LlamaRMSNorm, GemmaRMSNorm, residual add + norm) changes its order with the
# row count below 16 rows (classes 1, 2-3, 4-7, 8-15): every row count 1..16 at a width of
# single elements (127), an odd width (1001: rows off a 16-byte boundary), a model width (4096:
# up to 512 lanes of one warp-row) and one above 8160 (8192: 16 warps share the row).
SHAPES += [(r, c) for c in (127, 1001, 4096, 8192) for r in range(1, 17) if (r, c) not in SHAPES]
RMS_EPS = 1e-6
LN_EPS = 1e-5


def llama_rms_norm(x, w, eps=RMS_EPS):
    # transformers' LlamaRMSNorm.forward, verbatim in substance.
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return w * h.to(input_dtype)


def gemma_rms_norm(x, w, eps=RMS_EPS):
    # transformers' GemmaRMSNorm.forward.
    out = x.float()
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps)
    out = out * (1.0 + w.float())
    return out.type_as(x)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(int(os.environ.get("CONFORMANCE_SEED", "1234")))
    entries = []

    def randn(*shape, dtype, scale=1.0, offset=0.0):
        return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * scale + offset).to(dtype)

    def save(layer, op, sem, dt, rows, cols, dist, tensors):
        name = f"{op}-{sem}-{dt}-{rows}x{cols}-{dist}-{len(entries)}.safetensors"
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, os.path.join(out_dir, name))
        entries.append(dict(layer=layer, op=op, semantics=sem, dtype=dt, rows=rows, cols=cols,
                            dist=dist, file=name))

    for dt, T in DTYPES.items():
        for rows, cols in SHAPES:
            x = randn(rows, cols, dtype=T)
            w = randn(cols, dtype=T, scale=0.2, offset=1.0)
            wg = randn(cols, dtype=T, scale=0.2)
            b = randn(cols, dtype=T, scale=0.2)
            res = randn(rows, cols, dtype=T)
            with torch.no_grad():
                save("HF LlamaRMSNorm", "rms_norm", "llama", dt, rows, cols, "normal",
                     dict(x=x, weight=w, out=llama_rms_norm(x, w)))
                save("F.rms_norm", "rms_norm", "torch", dt, rows, cols, "normal",
                     dict(x=x, weight=w, out=F.rms_norm(x, (cols,), w, RMS_EPS)))
                save("HF GemmaRMSNorm", "rms_norm", "gemma", dt, rows, cols, "normal",
                     dict(x=x, weight=wg, out=gemma_rms_norm(x, wg)))
                s = x + res
                save("residual add + LlamaRMSNorm", "fused_add_rms_norm", "default", dt, rows, cols,
                     "normal", dict(x=x, residual=res, weight=w, out=llama_rms_norm(s, w), residual_out=s))
                for dist, xl in [("normal", x), ("mean_offset", randn(rows, cols, dtype=T, offset=1000.0))]:
                    save("nn.LayerNorm", "layer_norm", "default", dt, rows, cols, dist,
                         dict(x=xl, weight=w, bias=b, out=F.layer_norm(xl, (cols,), w, b, LN_EPS)))
                xa = randn(rows, cols, dtype=T, scale=3.0)
                save("F.silu", "silu", "default", dt, rows, cols, "normal*3", dict(x=xa, out=F.silu(xa)))
                save("F.gelu", "gelu", "default", dt, rows, cols, "normal*3", dict(x=xa, out=F.gelu(xa)))
                save("F.gelu(tanh)", "gelu_tanh", "default", dt, rows, cols, "normal*3",
                     dict(x=xa, out=F.gelu(xa, approximate="tanh")))
                xm = randn(rows, 2 * cols, dtype=T, scale=3.0)
                save("F.silu(g) * u", "silu_and_mul", "default", dt, rows, cols, "normal*3",
                     dict(x=xm, out=F.silu(xm[:, :cols]) * xm[:, cols:]))
                # the gated ops: gate and up as two tensors (HF's gate_proj(x), up_proj(x))
                gate = randn(rows, cols, dtype=T, scale=3.0)
                up = randn(rows, cols, dtype=T, scale=3.0)
                save("F.silu(g) * u, two tensors", "silu_mul", "default", dt, rows, cols,
                     "normal*3", dict(gate=gate, up=up, out=F.silu(gate) * up))
                save("F.gelu(g, tanh) * u", "gelu_tanh_mul", "default", dt, rows, cols,
                     "normal*3", dict(gate=gate, up=up,
                                      out=F.gelu(gate, approximate="tanh") * up))
    man = dict(
        torch_version=torch.__version__,
        cuda=str(torch.version.cuda),
        device=torch.cuda.get_device_name(0),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        entries=entries,
    )
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
    print(f"wrote {len(entries)} comparisons to {out_dir} (torch {torch.__version__}, {man['device']})")


if __name__ == "__main__":
    main()
