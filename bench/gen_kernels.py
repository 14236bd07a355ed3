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

# Row kernels: a group of G threads per row (blockDim.x = G), 256 threads per block. The
# group emulates the 256 canonical lanes, 256/G per thread; each thread holds up to 8
# vectors of 8 elements (128 bytes bf16/f16, 256 f32) in registers, loaded before use.
ROW_LAUNCH = """
# cols <= 256: one warp per row, 8 rows per warp at once (1 vector each per thread),
# 8 warps per block: 64 rows per block.
[[launch]]
cols_max = 256
block = [32, 8]
grid = "per_row"
rows_per_block = 64

# cols <= 512: one warp per row, 4 rows per warp at once.
[[launch]]
cols_max = 512
block = [32, 8]
grid = "per_row"
rows_per_block = 32

# cols <= 1024: one warp per row, 2 rows per warp at once.
[[launch]]
cols_max = 1024
block = [32, 8]
grid = "per_row"
rows_per_block = 16

# cols <= 2048: one warp per row (8 canonical lanes per thread), 8 rows per block.
[[launch]]
cols_max = 2048
block = [32, 8]
grid = "per_row"
rows_per_block = 8

# cols <= 4096: 64 threads per row (4 canonical lanes per thread), 4 rows per block.
[[launch]]
cols_max = 4096
block = [64, 4]
grid = "per_row"
rows_per_block = 4

# cols <= 8192: 128 threads per row (2 canonical lanes per thread), 2 rows per block.
[[launch]]
cols_max = 8192
block = [128, 2]
grid = "per_row"
rows_per_block = 2

# larger rows: one 256-thread block per row (thread t = canonical lane t), the row in
# registers up to 16384 columns, streamed twice (statistics, then outputs) beyond that.
[[launch]]
block = 256
grid = "per_row"
rows_per_block = 1
"""

# Engine v1 (bench/kernel_src/v1/, the sources of commit f77ce87, kept byte for byte): one warp
# per row up to 2048 columns, one 256-thread block per row above. Still used by the kernels in
# V1 below, which the v2 row engine made slower on the H200 (bench/RESULTS.md).
ROW_LAUNCH_V1 = """
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

V1 = {"layer_norm_twopass", "layer_norm_onepass"}

# Engine v3 (bench/kernel_src/eager.cuh): eager PyTorch's own reduction orders
# (docs/reference-semantics.md), for every kernel that claims eager's statistics.
MEAN_LAUNCH = """
# cols <= 8160: eager's mean order has 32 lanes: one warp per row, 8 rows per block.
[[launch]]
cols_max = 8160
block = [32, 8]
grid = "per_row"
rows_per_block = 8

# larger rows: 512 lanes (16 warps share the row): one 128-thread block per row, 4 lanes
# per thread.
[[launch]]
block = 128
grid = "per_row"
rows_per_block = 1
"""
LN_LAUNCH = """
# cols <= 2048: one warp per row (the 128 or 512 lanes of the layer-norm order, 4 or 16 per
# thread), 8 rows per block.
[[launch]]
cols_max = 2048
block = [32, 8]
grid = "per_row"
rows_per_block = 8

# larger rows: one 128-thread block per row (1 or 4 lanes per thread).
[[launch]]
block = 128
grid = "per_row"
rows_per_block = 1
"""
MEAN_ORDER = {"rms_norm_llama", "rms_norm_gemma", "rms_norm_llama_wbr", "fused_add_rms_norm"}
LN_ORDER = {"rms_norm_torch", "layer_norm"}
EAGER = MEAN_ORDER | LN_ORDER

EW_LAUNCH = """
# 64 bytes per thread (4 x 16-byte loads: 32 elements of bf16/f16; f32 blocks loop twice),
# 256 threads per block, grid-stride loop.
[launch]
block = 256
grid = "per_element"
elements_per_thread = 32
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
# row kernels with more live state per element (x and residual; two passes): up to 128 registers
TWO_STATE = {"kz_layer_norm<T, 1>"}

# name, op, semantics (None = default), call template (T = C type), description, dtypes
KERNELS = [
    ("rms_norm_llama", "rms_norm", "llama", "kz_mean_norm<T, KZ_LLAMA, false>",
     """Fast exact HF LlamaRMSNorm: var = mean(x^2) in eager's own reduction order (Reduce.cuh
     as eager runs it for 16 rows or more: 32 lanes of 4-vectors, 512 above 8160 columns; see
     docs/reference-semantics.md), var = sum * (1/cols), r = rsqrtf(var + eps),
     n = round(x * r), y = round(w * n) (two roundings, as eager). One warp per row up to 8160
     columns, one 128-thread block per row above; the row kept in registers up to 2048 (f32:
     1024) / 8192 (f32: 4096) columns, streamed twice beyond.""", DTYPES),
    ("rms_norm_gemma", "rms_norm", "gemma", "kz_mean_norm<T, KZ_GEMMA, false>",
     """Fast exact Gemma RMSNorm: y = round(x * r * (1 + w)), r = rsqrtf(mean(x^2) + eps) in
     eager's mean order (docs/reference-semantics.md). Same structure as rms_norm_llama.""", DTYPES),
    ("rms_norm_torch", "rms_norm", "torch", "kz_ln_order<T, true>",
     """Fast exact F.rms_norm (eager's _fused_rms_norm): cols % 4 == 0: r = rsqrtf(sum/cols + eps)
     with the sum of fma(x, x, .) over 128 lanes of 4-vectors; otherwise r = rsqrtf(mean^2 + var
     + eps) from a Welford over 512 lanes, as eager's two layer-norm kernels do
     (docs/reference-semantics.md). y = round(x * r * w), one rounding. One warp per row up to
     2048 columns, one 128-thread block per row above.""", DTYPES),
    ("fused_add_rms_norm", "fused_add_rms_norm", None, "kz_mean_norm<T, KZ_LLAMA, true>",
     """Fast exact fused residual add + LlamaRMSNorm: s = round(x + residual), residual := s
     (in place), out = round(w * round(s * r)), r from eager's mean order over s^2
     (docs/reference-semantics.md). Reads x and residual once, writes residual and out once.
     Same structure as rms_norm_llama.""", DTYPES),
    ("layer_norm", "layer_norm", None, "kz_ln_order<T, false>",
     """Fast exact nn.LayerNorm: per-row Welford statistics in eager's own order
     (docs/reference-semantics.md): cols % 4 == 0: 128 lanes of 4-vectors with eager's
     WelfordDataLN update and combine; otherwise 512 lanes with WelfordOps; rstd =
     rsqrtf(m2/n + eps), y = round(fma((x - mean) * rstd, w, b)). One warp per row up to 2048
     columns, one 128-thread block per row above; the row kept in registers up to 8192 columns.""", DTYPES),
    ("silu", "silu", None, "kz_unary<T, KZ_SILU>",
     """Fast exact SiLU: y = round(h / (1 + expf(-h))) with accurate expf and IEEE division,
     32 elements (bf16/f16) per thread in 4 16-byte loads issued before use.""", DTYPES),
    ("gelu", "gelu", None, "kz_unary<T, KZ_GELU>",
     """Fast exact erf GELU (F.gelu): y = round(h*0.5 * (1 + erff(h*0.70710678))),
     32 elements (bf16/f16) per thread in 4 16-byte loads issued before use.""", DTYPES),
    ("gelu_tanh", "gelu_tanh", None, "kz_unary<T, KZ_GELU_TANH>",
     """Fast exact tanh GELU (F.gelu(approximate='tanh')):
     y = round(0.5h * (1 + tanhf(0.79788456 * fma(0.044715, h^3, h)))),
     32 elements (bf16/f16) per thread in 4 16-byte loads issued before use.""", DTYPES),
    ("silu_and_mul", "silu_and_mul", None, "kz_silu_and_mul<T, true>",
     """Fast exact silu(g) * u as eager computes it: s = round(silu(g)) (intermediate rounding
     to T), y = round(s * u). x = [rows, 2*cols], gate first. 16-byte loads when cols is a
     multiple of 16/sizeof(T), scalar otherwise.""", DTYPES),
    # ---- known-different variants ----
    ("rms_norm_llama_wbr", "rms_norm", "llama", "kz_mean_norm<T, KZ_WBR, false>",
     """KNOWN-DIFFERENT variant (liger-style 'weight before rounding'), declared as llama
     semantics: y = round(x * r * w) with a single rounding, where HF LlamaRMSNorm rounds
     x * r to T first and then multiplies by w. Differs from eager on ~25% of bf16 elements by
     1 ulp; identical in f32 (no intermediate rounding there). Same statistics (eager's mean
     order) and speed as rms_norm_llama.""", DTYPES),
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


def eager_args(name, op, args):
    """The engine-v3 calls take one argument list per order: the mean order's has the residual
    (nullptr for plain rms_norm), the layer-norm order's has the bias (nullptr for F.rms_norm)."""
    if name in MEAN_ORDER and op == "rms_norm":
        return "out, nullptr, x, w, rows, cols, eps"
    if name in LN_ORDER and op == "rms_norm":
        return "out, x, w, nullptr, rows, cols, eps"
    return args


def read(name, sub=""):
    with open(os.path.join(SRC, sub, name)) as f:
        return f.read()


def main():
    common = read("common.cuh") + read("rows.cuh") + read("elementwise.cuh")
    common_v1 = read("common.cuh", "v1") + read("rows.cuh", "v1") + read("elementwise.cuh", "v1")
    eager = read("eager.cuh")
    names = set()
    for name, op, sem, call, desc, dts in KERNELS:
        assert name not in names
        names.add(name)
        sig, args = SIGS[op]
        entries = []
        for dt in dts:
            T = CT[dt]
            if name in V1:  # as in commit f77ce87
                mb = 2 if dt == "f32" else (3 if op == "layer_norm" else 4)
            elif name in EAGER:  # at most 85 (f32: 128) registers: several rows per SM in flight
                mb = 2 if dt == "f32" else 3
            else:
                mb = 3 if op not in ROWWISE else (2 if dt == "f32" or call in TWO_STATE else 3)
            entry = (
                f'extern "C" __global__ void __launch_bounds__(256, {mb}) {name}_{dt}({sig.replace("T*", T + "*")}) {{\n'
                f'  {call.replace("<T", "<" + T)}({eager_args(name, op, args)});\n}}\n')
            if op in ROWWISE:
                # The verifier and the clients compile each dtype's entry as its own module with
                # -DKERNELIZE_DTYPE_<DT> (docs/kernel-format.md): the other dtypes' row paths
                # are then not compiled, a third of NVRTC's time per module, the three in
                # parallel. Without any of the macros every entry is compiled, as before.
                others = " && ".join(f"!defined(KERNELIZE_DTYPE_{o.upper()})" for o in DTYPES if o != dt)
                entry = f"#if {others}\n{entry}#endif\n"
            entries.append(entry)
        src = (eager if name in EAGER else common_v1 if name in V1 else common) + "\n// ---- entry points -----------------------------------------------------------------\n" + "\n".join(entries)
        desc = " ".join(textwrap.dedent(desc).split())
        toml = [f'name = "{name}"', 'version = "1.0.0"', f'op = "{op}"']
        if sem:
            toml.append(f'semantics = "{sem}"')
        toml += [f'description = """{desc}"""', 'authors = ["kernelize"]', 'license = "Apache-2.0"',
                 'source = "kernel.cu"', "", "[entry]"]
        toml += [f'{dt} = "{name}_{dt}"' for dt in dts]
        toml.append(MEAN_LAUNCH if name in MEAN_ORDER else LN_LAUNCH if name in LN_ORDER
                    else ROW_LAUNCH_V1 if name in V1 else ROW_LAUNCH if op in ROWWISE else EW_LAUNCH)
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "kernel.toml"), "w") as f:
            f.write("\n".join(toml).rstrip() + "\n")
        with open(os.path.join(d, "kernel.cu"), "w") as f:
            f.write(src)
    print(f"wrote {len(KERNELS)} kernels to {OUT}")


if __name__ == "__main__":
    main()
