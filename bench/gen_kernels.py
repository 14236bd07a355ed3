#!/usr/bin/env python3
"""Generate kernels/<name>/{kernel.toml,kernel.cu} from the pieces in bench/kernel_src/.

Each kernel.cu is self-contained (the common device code is pasted in), so a bundle is just its
folder. Run: python3 bench/gen_kernels.py   (from the repo root)
"""
import os
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "bench", "kernel_src")
OUT = os.path.join(ROOT, "kernels")

CT = {"bf16": "__nv_bfloat16", "f16": "__half", "f32": "float"}
DTYPES = ["bf16", "f16", "f32"]

ROW_LAUNCH = """
# cols <= 2048: one warp per row (the warp emulates the 256 canonical lanes, 8 per thread),
# 4 rows per 128-thread block, the row in registers.
[[launch]]
cols_max = 2048
block = [32, 4]
grid = "per_row"
rows_per_block = 4

# larger rows: one 256-thread block per row (thread t = canonical lane t), the row in
# registers up to 32768 (bf16/f16) / 16384 (f32) columns, streamed twice beyond that.
[[launch]]
block = 256
grid = "per_row"
rows_per_block = 1
"""

WARP_LAUNCH = """
# one warp per row at every size, 4 rows per 128-thread block.
[launch]
block = [32, 4]
grid = "per_row"
rows_per_block = 4
"""

EW_LAUNCH = """
# 16 elements per thread (16-byte loads), 256 threads per block, grid-stride loop.
[launch]
block = 256
grid = "per_element"
elements_per_thread = 16
"""

SIGS = {
    "rms_norm": ("T* out, const T* x, const T* w, long long rows, long long cols, float eps", "out, x, w, rows, cols, eps"),
    "fused_add_rms_norm": ("T* out, T* residual, const T* x, const T* w, long long rows, long long cols, float eps",
                           "out, residual, x, w, rows, cols, eps"),
    "layer_norm": ("T* out, const T* x, const T* w, const T* b, long long rows, long long cols, float eps",
                   "out, x, w, b, rows, cols, eps"),
    "silu": ("T* out, const T* x, long long n", "out, x, n"),
    "gelu": ("T* out, const T* x, long long n", "out, x, n"),
    "gelu_tanh": ("T* out, const T* x, long long n", "out, x, n"),
    "silu_and_mul": ("T* out, const T* x, long long rows, long long cols", "out, x, rows, cols"),
}
ROWWISE = {"rms_norm", "fused_add_rms_norm", "layer_norm"}

# name, op, semantics (None = default), call template (T = C type), description, dtypes
KERNELS = [
    ("rms_norm_llama", "rms_norm", "llama", "kz_rms_norm<T, KZ_LLAMA>",
     """Fast exact HF LlamaRMSNorm: var = mean(x^2) by the canonical 256-lane row reduction,
     r = rsqrtf(var + eps), n = round(x * r), y = round(w * n) (two roundings, as eager).
     16-byte loads, one warp per row up to 2048 columns, one 256-thread block per row above,
     the row kept in registers (streamed twice from memory beyond 32768/16384 columns).
     Bit-exact with docs/reference-semantics.md by construction.""", DTYPES),
    ("rms_norm_gemma", "rms_norm", "gemma", "kz_rms_norm<T, KZ_GEMMA>",
     """Fast exact Gemma RMSNorm: y = round(x * r * (1 + w)), r = rsqrtf(mean(x^2) + eps) by the
     canonical 256-lane row reduction. Same structure as rms_norm_llama.""", DTYPES),
    ("rms_norm_torch", "rms_norm", "torch", "kz_rms_norm<T, KZ_TORCH>",
     """Fast exact F.rms_norm semantics: y = round(x * r * w) (single rounding),
     r = rsqrtf(mean(x^2) + eps) by the canonical 256-lane row reduction. Same structure as
     rms_norm_llama.""", DTYPES),
    ("fused_add_rms_norm", "fused_add_rms_norm", None, "kz_fused_add_rms_norm<T>",
     """Fast exact fused residual add + LlamaRMSNorm: s = round(x + residual), residual := s
     (in place), out = round(w * round(s * r)) with r from the canonical 256-lane reduction of s^2.
     Reads x and residual once, writes residual and out once.""", DTYPES),
    ("layer_norm", "layer_norm", None, "kz_layer_norm<T, 0>",
     """Fast exact nn.LayerNorm: per-row Welford statistics in the canonical 256-lane order with
     Chan combine (eager's WelfordDataLN), rstd = rsqrtf(m2/n + eps),
     y = round(fma((x - mean) * rstd, w, b)). Row kept in registers, read once.""", DTYPES),
    ("silu", "silu", None, "kz_unary<T, KZ_SILU>",
     """Fast exact SiLU: y = round(h / (1 + expf(-h))) with accurate expf and IEEE division,
     16 elements per thread with 16-byte loads.""", DTYPES),
    ("gelu", "gelu", None, "kz_unary<T, KZ_GELU>",
     """Fast exact erf GELU (F.gelu): y = round(h*0.5 * (1 + erff(h*0.70710678))),
     16 elements per thread with 16-byte loads.""", DTYPES),
    ("gelu_tanh", "gelu_tanh", None, "kz_unary<T, KZ_GELU_TANH>",
     """Fast exact tanh GELU (F.gelu(approximate='tanh')):
     y = round(0.5h * (1 + tanhf(0.79788456 * fma(0.044715, h^3, h)))),
     16 elements per thread with 16-byte loads.""", DTYPES),
    ("silu_and_mul", "silu_and_mul", None, "kz_silu_and_mul<T, true>",
     """Fast exact silu(g) * u as eager computes it: s = round(silu(g)) (intermediate rounding
     to T), y = round(s * u). x = [rows, 2*cols], gate first. 16-byte loads when cols is a
     multiple of 16/sizeof(T), scalar otherwise.""", DTYPES),
    # ---- the same exact code, launched one warp per row at every size (8 canonical lanes per
    # thread = 8 independent accumulation chains; rows over 2048 columns are read twice) ----
    ("layer_norm_warp", "layer_norm", None, "kz_layer_norm<T, 0>",
     """Fast exact nn.LayerNorm, same code and bits as layer_norm but launched one warp per row
     at every size: each thread carries 8 of the 256 canonical Welford lanes (8 independent
     division chains instead of 1); rows longer than 2048 columns are read twice (statistics,
     then outputs; the second read mostly hits L2).""", DTYPES, "warp"),
    ("rms_norm_llama_warp", "rms_norm", "llama", "kz_rms_norm<T, KZ_LLAMA>",
     """Fast exact HF LlamaRMSNorm, same code and bits as rms_norm_llama but launched one warp per
     row at every size; rows longer than 2048 columns are read twice (sum of squares, then
     outputs; the second read mostly hits L2).""", DTYPES, "warp"),
    # ---- known-different variants ----
    ("rms_norm_llama_wbr", "rms_norm", "llama", "kz_rms_norm<T, KZ_WBR>",
     """KNOWN-DIFFERENT variant (liger-style 'weight before rounding'), declared as llama
     semantics: y = round(x * r * w) with a single rounding, where HF LlamaRMSNorm rounds
     x * r to T first and then multiplies by w. Differs from eager on ~25% of bf16 elements by
     1 ulp; identical in f32 (no intermediate rounding there). Same statistics (canonical
     reduction) and speed as rms_norm_llama.""", DTYPES),
    ("layer_norm_twopass", "layer_norm", None, "kz_layer_norm<T, 1>",
     """KNOWN-DIFFERENT variant: LayerNorm statistics from a two-pass var_mean instead of
     eager's Welford: mean = sum(x)/cols, var = sum((x - mean)^2)/cols (plain f32 sums in the
     canonical lane order), then the same per-element formula. Differs from eager on a few
     elements per million in bf16 (more in f32), accuracy comparable.""", DTYPES),
    ("layer_norm_onepass", "layer_norm", None, "kz_layer_norm<T, 2>",
     """KNOWN-DIFFERENT variant: LayerNorm statistics in one pass as E[x^2] - E[x]^2 (clamped at
     0), f32 sums. Differs from eager, and loses accuracy badly when the row mean is large
     compared with its spread (catastrophic cancellation).""", DTYPES),
    ("silu_fastmath", "silu", None, "kz_unary<T, KZ_SILU_FAST>",
     """KNOWN-DIFFERENT variant: SiLU with fast-math intrinsics, y = round(__fdividef(h,
     1 + __expf(-h))). Differs from eager in a fraction of elements (more in f32 than in bf16);
     __fdividef returns 0 for h < about -88 where eager gives -0 or a tiny value.""", DTYPES),
    ("silu_and_mul_fused", "silu_and_mul", None, "kz_silu_and_mul<T, false>",
     """KNOWN-DIFFERENT variant (vLLM-style fusion): y = round(silu(g) * u) with a single
     rounding; eager rounds silu(g) to T before the multiply. Differs from eager on ~27% of bf16
     elements; identical in f32 (no intermediate rounding there).""", DTYPES),
]


def read(name):
    with open(os.path.join(SRC, name)) as f:
        return f.read()


def main():
    common = read("common.cuh") + read("rows.cuh") + read("elementwise.cuh")
    names = set()
    for name, op, sem, call, desc, dts, *launch in KERNELS:
        assert name not in names
        names.add(name)
        sig, args = SIGS[op]
        entries = []
        for dt in dts:
            T = CT[dt]
            mb = 4 if op not in ROWWISE else (2 if dt == "f32" else (3 if op == "layer_norm" else 4))
            entries.append(
                f'extern "C" __global__ void __launch_bounds__(256, {mb}) {name}_{dt}({sig.replace("T*", T + "*")}) {{\n'
                f'  {call.replace("<T", "<" + T)}({args});\n}}\n')
        src = common + "\n// ---- entry points -----------------------------------------------------------------\n" + "\n".join(entries)
        desc = " ".join(textwrap.dedent(desc).split())
        toml = [f'name = "{name}"', 'version = "1.0.0"', f'op = "{op}"']
        if sem:
            toml.append(f'semantics = "{sem}"')
        toml += [f'description = """{desc}"""', 'authors = ["kernelize"]', 'license = "Apache-2.0"',
                 'source = "kernel.cu"', "", "[entry]"]
        toml += [f'{dt} = "{name}_{dt}"' for dt in dts]
        toml.append(WARP_LAUNCH if launch == ["warp"] else ROW_LAUNCH if op in ROWWISE else EW_LAUNCH)
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "kernel.toml"), "w") as f:
            f.write("\n".join(toml).rstrip() + "\n")
        with open(os.path.join(d, "kernel.cu"), "w") as f:
            f.write(src)
    print(f"wrote {len(KERNELS)} kernels to {OUT}")


if __name__ == "__main__":
    main()
