#!/usr/bin/env python3
"""Generate the bundled kernels, kernels/<name>/{kernel.toml,kernel.cu}, from kernels/src/.

A kernel's digest covers one self-contained source file, so every kernel.cu is the sources of
its engine pasted together (see ENGINES) followed by its entry points; nothing else writes
them. Edit kernels/src/*.cuh or the table below, then run (from anywhere):

    python3 kernels/generate.py            # rewrite every kernels/<name>/ from the sources
    python3 kernels/generate.py --check    # exit 1, naming each file that differs

A kernel's `version` is kept from its existing kernel.toml (1.0.0 for a new kernel). When a
kernel's content changes, bump that version by hand and append the new (name, version, digest)
to kernels/released.toml; the CPU tests (python/tests/test_bundled_kernels.py,
server/tests/bundled.rs) fail until both are done.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import tomllib

KERNELS_DIR = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(KERNELS_DIR, "src")

CT = {"bf16": "__nv_bfloat16", "f16": "__half", "f32": "float"}
DTYPES = ["bf16", "f16", "f32"]

# The sources pasted into a kernel.cu, in order, per engine.
ENGINES = {
    # eager PyTorch's own reduction orders (docs/reference-semantics.md): every row kernel that
    # claims eager's statistics
    "eager": ["prelude.cuh", "eager.cuh"],
    # the same, with the residual add before nn.LayerNorm (fused_add_layer_norm) after it: a
    # file of its own, so that the other eager kernels' sources (and digests) stay as released
    "eager_resid": ["prelude.cuh", "eager.cuh", "ln_resid.cuh"],
    # the canonical 256-lane row order: the known-different LayerNorm variants
    "canonical": ["prelude.cuh", "common.cuh", "canonical.cuh"],
    # elementwise ops and silu_and_mul
    "elementwise": ["prelude.cuh", "common.cuh", "activations.cuh", "elementwise.cuh"],
    # the gated ops of HF MLPs: act(gate) * up on two tensors
    "gated": ["prelude.cuh", "common.cuh", "activations.cuh", "gated.cuh"],
}

# Launch rules (kernel.toml [[launch]]) per engine and order.
MEAN_LAUNCH = """
# cols <= 8160: blocks of one warp per row for the paths that keep eager's 32 lanes in one warp
# (cols <= 128; rows that are not whole 16-byte chunks); the staged engine (every other shape)
# uses the block's 256 threads together. Persistent: the kernel loops over its rows.
[[launch]]
cols_max = 8160
block = [32, 8]
grid = "persistent"
blocks_per_sm = 3

# larger rows: 512 lanes at every row count; one 256-thread block per row (2 lanes per thread)
# where a row is not whole 16-byte chunks, the staged engine otherwise.
[[launch]]
block = 256
grid = "persistent"
blocks_per_sm = 3
"""
LN_LAUNCH = """
# cols <= 2048: one warp per row (the 128 or 512 lanes of the layer-norm order, 4 or 16 per
# thread) where rows are not whole 16-byte chunks; the staged engine otherwise. Persistent: the
# kernel loops over its rows.
[[launch]]
cols_max = 2048
block = [32, 8]
grid = "persistent"
blocks_per_sm = 3

# larger rows: one 128-thread block per row (1 or 4 lanes per thread), or the staged engine.
[[launch]]
block = 128
grid = "persistent"
blocks_per_sm = 5
"""
CANONICAL_LAUNCH = """
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
EW_LAUNCH = """
# 16 bytes per thread (one 16-byte load: 8 elements of bf16/f16; f32 threads loop twice), 256
# threads per block, grid-stride loop: a decode row's elements spread over many SMs. A grid of
# 2048 blocks or more (8 MB of bf16 and up) is worked by one block in 4, 4 vectors per thread
# (kernels/src/activations.cuh).
[launch]
block = 256
grid = "per_element"
elements_per_thread = 8
"""

# What the compiled code of an engine can do beyond computing its output (docs/manifest.md,
# `[[capability]]`; the verifier's audit finds it in the PTX and every policy refuses a kernel that
# does not declare it). The row engines trap on a block shape their launch rules never produce.
CAPABILITIES = {
    "eager": [("trap", "traps (__trap) when launched with a block that cannot hold eager's lanes; the manifest's "
                       "launch rules never launch one")],
    "canonical": [("trap", "traps (__trap) when launched with a block shape other than the manifest's launch rules give")],
}
CAPABILITIES["eager_resid"] = CAPABILITIES["eager"]   # the eager engine and one more file

# The ABI of each op (docs/spec.md section 2): the entry's parameters and the engine call's
# arguments (the parameters' names), read from the registry's export of `Op::stages`
# (python/tests/fixtures/abi.json, written and kept current by a kernel-registry test); the
# forward ops only (a backward op's entries are written by hand: HAND_WRITTEN below).
_ABI = json.loads(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests",
                                    "fixtures", "abi.json"), encoding="utf-8").read())["ops"]
SIGS = {op: (a["abi"], ", ".join(a["params"])) for op, a in _ABI.items()}
# Row kernels (the norms: the ops that take eps) leave the other dtypes' entries out of a module
# compiled with -DKERNELIZE_DTYPE_<DT> (docs/manifest.md): a third of NVRTC's time per module.
ROW_OPS = {op for op, a in _ABI.items() if a["takes_eps"]}
# Bundled kernel folders written by hand, not generated: the backward kernels (docs/backward.md,
# docs/backward-gated.md; their entries follow the backward ABI of docs/spec.md section 2c, which
# no engine here emits).
HAND_WRITTEN = {"rms_norm_llama_backward", "rms_norm_gemma_backward", "silu_mul_backward", "layer_norm_backward", "gelu_tanh_mul_backward",
                "silu_backward", "gelu_backward", "gelu_tanh_backward", "rms_norm_torch_backward",
                "fused_add_rms_norm_backward"}

# Backward kernels whose kernel.cu is generated though their kernel.toml is written by hand: the
# RMSNorm family, one engine (kernels/src/rms_backward.cuh) and a file of each kernel's own
# (kernels/src/<name>.cu: its elementwise steps and entries), the engine pasted where that file
# includes it.
PASTED_BACKWARD = {"rms_norm_llama_backward": "rms_backward.cuh", "rms_norm_gemma_backward": "rms_backward.cuh",
                   "fused_add_rms_norm_backward": "rms_backward.cuh"}


def pasted_cu(name: str) -> str:
    own, engine = _read(f"{name}.cu"), PASTED_BACKWARD[name]
    line = f'#include "{engine}"\n'
    if own.count(line) != 1:
        raise ValueError(f"kernels/src/{name}.cu must include {engine} exactly once")
    return own.replace(line, _read(engine))


# ptxas on every core of the host (docs/manifest.md: the one ptxas option a manifest may carry):
# the same SASS. Given to the exact row kernels in session 31 for issue 29's verification time, on
# session 30's measure of half the module's compile time; measured after on a fresh machine, it
# gained nothing (session 30's figure came from NVRTC's cache across processes; docs/verifier.md).
# Kept, as certified; the known-different rms_norm_llama_wbr keeps its released version.
PTXAS_THREADS = "-Xptxas=--split-compile=0"
PTXAS_THREADED = {"rms_norm_llama", "rms_norm_gemma", "rms_norm_torch", "fused_add_rms_norm", "layer_norm",
                  "fused_add_layer_norm"}


class K:
    """One bundled kernel: name, op, semantics (None = default), engine, launch rules, the
    engine call (T = the C type), description (what it computes, how it differs from eager)."""

    def __init__(self, name, op, semantics, engine, launch, call, description, args=None):
        self.name, self.op, self.semantics, self.engine = name, op, semantics, engine
        self.launch, self.call, self.description = launch, call, description
        self.args = args or SIGS[op][1]

    @property
    def nvrtc_options(self) -> list[str]:
        """The manifest's nvrtc_options: PTXAS_THREADS for the kernels in PTXAS_THREADED."""
        return [PTXAS_THREADS] if self.name in PTXAS_THREADED else []


# The mean-order and layer-norm-order engine calls take one argument list per order: the mean
# order's has the residual (nullptr for plain rms_norm), the layer-norm order's the bias
# (nullptr for F.rms_norm).
MEAN_RMS = "out, nullptr, x, w, rows, cols, eps"
LN_RMS = "out, x, w, nullptr, rows, cols, eps"

KERNELS = [
    K("rms_norm_llama", "rms_norm", "llama", "eager", MEAN_LAUNCH, "kz_mean_norm<T, KZ_LLAMA, false>",
      """Fast exact HF LlamaRMSNorm: var = mean(x^2) in eager's own reduction order at the
      tensor's own shape (Reduce.cuh's block for (rows, cols), 1-15 rows included, and the head
      of a row that starts off a 16-byte boundary when cols % 4 != 0; see
      docs/reference-semantics.md), var = sum * (float(rows) / float(rows*cols)) (MeanOps'
      factor), r = rsqrtf(var + eps), n = round(x * r), y = round(w * n) (two roundings, as
      eager). Like eager, a row's bits can depend on the batch's row count below 16 rows and on
      the row's position when cols % 4 != 0: not batch-invariant. Rows that are whole 16-byte chunks (every model width) go through shared memory: the block copies a tile of rows (or chunks of one long row) with cp.async, eager's lanes sum from there, one warp per row runs eager's trees, all threads write 16-byte outputs; persistent grid. When every row has a block of its own (decode steps, small batches) and fits 4 16-byte chunks per thread, the decode path instead: each thread issues the loads of its chunks of x and of the weight into registers at once, before MeanOps' factor and the config are computed, the lanes sum from those registers (at most one unit a lane) or from shared memory, every warp runs the tree itself (the same additions in the same order, its shape known at compile time), outputs from the registers. Other rows (cols <= 128, odd widths, misaligned tensors): one warp per row up to 8160 columns, one 256-thread block per row above; those rows are streamed lane by lane, the row read twice (a short code path: a smaller module, less NVRTC time).""", MEAN_RMS),
    K("rms_norm_gemma", "rms_norm", "gemma", "eager", MEAN_LAUNCH, "kz_mean_norm<T, KZ_GEMMA, false>",
      """Fast exact Gemma RMSNorm: y = round(x * r * (1 + w)), r = rsqrtf(mean(x^2) + eps) in
      eager's mean order at the tensor's own shape, as rms_norm_llama (every row count; not
      batch-invariant, as eager; docs/reference-semantics.md). Same structure as
      rms_norm_llama.""", MEAN_RMS),
    K("rms_norm_torch", "rms_norm", "torch", "eager", LN_LAUNCH, "kz_ln_order<T, true>",
      """Fast exact F.rms_norm (eager's _fused_rms_norm): cols % 4 == 0: r = rsqrtf(sum/cols + eps)
      with the sum of fma(x, x, .) over 128 lanes of 4-vectors; otherwise r = rsqrtf(mean^2 + var
      + eps) from a Welford over 512 lanes, as eager's two layer-norm kernels do
      (docs/reference-semantics.md). y = round(x * r * w), one rounding. Rows that are whole 16-byte chunks (every model width) go through shared memory: the block copies a tile of rows (or chunks of one long row) with cp.async, eager's lanes sum from there, one warp per row runs eager's trees, all threads write 16-byte outputs; persistent grid. When every row has a block of its own (decode steps, small batches) and fits 4 16-byte chunks per thread, the decode path instead: each thread loads its chunks of x and of the weight into registers at once, the lanes sum from those registers (at most one unit a lane) or from shared memory, one warp runs the tree with its shape known at compile time, outputs from the registers. Other rows (cols <= 128, odd widths, misaligned tensors): one warp per row up to 2048 columns, one 128-thread block per row above; those rows are streamed lane by lane, the row read twice (a short code path: a smaller module, less NVRTC time).""", LN_RMS),
    K("fused_add_rms_norm", "fused_add_rms_norm", None, "eager", MEAN_LAUNCH, "kz_mean_norm<T, KZ_LLAMA, true>",
      """Fast exact fused residual add + LlamaRMSNorm: s = round(x + residual), residual := s
      (in place), out = round(w * round(s * r)), r from eager's mean order over s^2 at the
      tensor's own shape, as rms_norm_llama (every row count; not batch-invariant, as eager;
      docs/reference-semantics.md). Reads x and residual once and writes the residual once; rows longer than the buffer re-read s from the residual for the outputs. Same structure as rms_norm_llama."""),
    K("layer_norm", "layer_norm", None, "eager", LN_LAUNCH, "kz_ln_order<T, false>",
      """Fast exact nn.LayerNorm: per-row Welford statistics in eager's own order
      (docs/reference-semantics.md): cols % 4 == 0: 128 lanes of 4-vectors with eager's
      WelfordDataLN update and combine; otherwise 512 lanes with WelfordOps; rstd =
      rsqrtf(m2/n + eps), y = round(fma((x - mean) * rstd, w, b)). Rows that are whole 16-byte chunks (every model width) go through shared memory: the block copies a tile of rows (or chunks of one long row) with cp.async, eager's lanes sum from there, one warp per row runs eager's trees, all threads write 16-byte outputs; persistent grid. When every row has a block of its own (decode steps, small batches) and fits 4 16-byte chunks per thread, the decode path instead: each thread loads its chunks of x and of the weight into registers at once, the lanes sum from those registers (at most one unit a lane) or from shared memory, one warp runs the tree with its shape known at compile time, outputs from the registers. Other rows (cols <= 128, odd widths, misaligned tensors): one warp per row up to 2048 columns, one 128-thread block per row above; those rows are streamed lane by lane, the row read twice (a short code path: a smaller module, less NVRTC time)."""),
    K("fused_add_layer_norm", "fused_add_layer_norm", None, "eager_resid", LN_LAUNCH, "kz_ln_resid<T>",
      """Fast exact fused residual add + nn.LayerNorm (GPT-2's residual add and the LayerNorm
      after it): s = round(x + residual), residual := s (in place), out = round(fma((s - mean) *
      rstd, w, b)) with mean and rstd from eager's layer-norm order over s, as the layer_norm
      kernel (docs/reference-semantics.md). Reads x and residual once and writes the residual
      once. Same structure as layer_norm."""),
    K("silu", "silu", None, "elementwise", EW_LAUNCH, "kz_unary<T, KZ_SILU>",
      """Fast exact SiLU: y = round(h / (1 + expf(-h))) with accurate expf and IEEE division;
      below a 2048-block grid one 16-byte vector (8 elements of bf16/f16) per thread, every block working; from 2048 blocks (prefill shapes) one block in 4 works, on 4 vectors per thread, all loaded before use; the same bits either way, grid-stride."""),
    K("gelu", "gelu", None, "elementwise", EW_LAUNCH, "kz_unary<T, KZ_GELU>",
      """Fast exact erf GELU (F.gelu): y = round(h*0.5 * (1 + erff(h*0.70710678)));
      below a 2048-block grid one 16-byte vector (8 elements of bf16/f16) per thread, every block working; from 2048 blocks (prefill shapes) one block in 4 works, on 4 vectors per thread, all loaded before use; the same bits either way, grid-stride."""),
    K("gelu_tanh", "gelu_tanh", None, "elementwise", EW_LAUNCH, "kz_unary<T, KZ_GELU_TANH>",
      """Fast exact tanh GELU (F.gelu(approximate='tanh')):
      y = round(0.5h * (1 + tanhf(0.79788456 * fma(0.044715, h^3, h))));
      below a 2048-block grid one 16-byte vector (8 elements of bf16/f16) per thread, every block working; from 2048 blocks (prefill shapes) one block in 4 works, on 4 vectors per thread, all loaded before use; the same bits either way, grid-stride."""),
    K("silu_and_mul", "silu_and_mul", None, "elementwise", EW_LAUNCH, "kz_silu_and_mul<T, true>",
      """Fast exact silu(g) * u as eager computes it: s = round(silu(g)) (intermediate rounding
      to T), y = round(s * u). x = [rows, 2*cols], gate first. 16-byte loads when cols is a
      multiple of 16/sizeof(T), scalar otherwise; below a 2048-block grid one 16-byte output vector
      per thread, from 2048 blocks one block in 4 works, on 4 per thread."""),
    K("silu_mul", "silu_mul", None, "gated", EW_LAUNCH, "kz_gated<T, KZ_SILU>",
      """Fast exact gated SiLU of HF LlamaMLP / Qwen2MLP / MistralMLP, silu(gate) * up on two
      [rows, cols] tensors as eager computes F.silu(g) * u: s = round(h / (1 + expf(-h))) (the
      silu kernel's arithmetic, the activation rounded to T), y = round(s * u). Elementwise over
      rows * cols: below a 2048-block grid one 16-byte vector of the gate and one of up per thread,
      from 2048 blocks (prefill shapes) one block in 4 works, on 4 of each per thread; all issued
      before use, grid-stride."""),
    K("gelu_tanh_mul", "gelu_tanh_mul", None, "gated", EW_LAUNCH, "kz_gated<T, KZ_GELU_TANH>",
      """Fast exact gated tanh GELU of Gemma's MLPs, F.gelu(gate, approximate='tanh') * up on
      two [rows, cols] tensors as eager computes it: s = round(0.5h * (1 + tanhf(0.79788456 *
      fma(0.044715, h^3, h)))) (the gelu_tanh kernel's arithmetic, rounded to T), y =
      round(s * u). Elementwise over rows * cols: below a 2048-block grid one 16-byte vector of
      the gate and one of up per thread, from 2048 blocks (prefill shapes) one block in 4 works, on
      4 of each per thread; all issued before use, grid-stride."""),
    # ---- known-different variants ----
    K("rms_norm_llama_wbr", "rms_norm", "llama", "eager", MEAN_LAUNCH, "kz_mean_norm<T, KZ_WBR, false>",
      """KNOWN-DIFFERENT variant (liger-style 'weight before rounding'), declared as llama
      semantics: y = round(x * r * w) with a single rounding, where HF LlamaRMSNorm rounds
      x * r to T first and then multiplies by w. Differs from eager on ~25% of bf16 elements by
      1 ulp; identical in f32 (no intermediate rounding there). Same statistics (eager's mean
      order at every row count) and speed as rms_norm_llama.""", MEAN_RMS),
    K("layer_norm_twopass", "layer_norm", None, "canonical", CANONICAL_LAUNCH, "kz_layer_norm<T, 1>",
      """KNOWN-DIFFERENT variant: LayerNorm statistics from a two-pass var_mean instead of
      eager's Welford: mean = sum(x)/cols, var = sum((x - mean)^2)/cols (plain f32 sums in the
      canonical lane order), then the same per-element formula. Differs from eager on a few
      elements per million in bf16 (more in f32), accuracy comparable."""),
    K("layer_norm_onepass", "layer_norm", None, "canonical", CANONICAL_LAUNCH, "kz_layer_norm<T, 2>",
      """KNOWN-DIFFERENT variant: LayerNorm statistics in one pass as E[x^2] - E[x]^2 (clamped at
      0), f32 sums. Differs from eager, and loses accuracy badly when the row mean is large
      compared with its spread (catastrophic cancellation)."""),
    K("silu_fastmath", "silu", None, "elementwise", EW_LAUNCH, "kz_unary<T, KZ_SILU_FAST>",
      """KNOWN-DIFFERENT variant: SiLU with fast-math intrinsics, y = round(__fdividef(h,
      1 + __expf(-h))). Differs from eager in a fraction of elements (more in f32 than in bf16);
      __fdividef returns 0 for h < about -88 where eager gives -0 or a tiny value."""),
    K("silu_and_mul_fused", "silu_and_mul", None, "elementwise", EW_LAUNCH, "kz_silu_and_mul<T, false>",
      """KNOWN-DIFFERENT variant (vLLM-style fusion): y = round(silu(g) * u) with a single
      rounding; eager rounds silu(g) to T before the multiply. Differs from eager on ~27% of bf16
      elements; identical in f32 (no intermediate rounding there)."""),
]


# Kernels written but not bundled yet: a bundled kernel carries a certificate (kernels/certificates,
# re-recorded on a GPU machine: scripts/gpu-certs), so a new one waits in this list until it has
# one. `python3 kernels/generate.py --staged DIR` writes them into DIR (the CPU harness tests build
# them from there); to bundle one, move it into KERNELS, generate, certify.
STAGED: list[K] = []


def _read(name: str) -> str:
    with open(os.path.join(SRC, name), encoding="utf-8") as f:
        return f.read()


def min_blocks(k: K, dt: str) -> int:
    """__launch_bounds__(256, N): row kernels at most 85 registers (the canonical engine's f32:
    128), so that several rows per SM are in flight, and every block of the eager engine's
    persistent grid (3 blocks of 256 threads per SM) is resident at once; elementwise kernels 4
    blocks (at most 64 registers: with 3, silu_mul took 65 registers and the gelus and
    silu_and_mul up to 80, 3 blocks of 4-vector threads per SM, where 4 keep the same loads in
    flight per thread without spilling (gelu: 16 bytes))."""
    if k.engine in ("elementwise", "gated"):
        return 4
    if k.engine in ("eager", "eager_resid"):  # the persistent grid's blocks_per_sm (3): all resident
        return 3
    return 2 if dt == "f32" else 3


def entry(k: K, dt: str) -> str:
    sig, _ = SIGS[k.op]
    T = CT[dt]
    e = (f'extern "C" __global__ void __launch_bounds__(256, {min_blocks(k, dt)}) '
         f'{k.name}_{dt}({sig.replace("T*", T + "*")}) {{\n'
         f'  {k.call.replace("<T", "<" + T)}({k.args});\n}}\n')
    if k.op in ROW_OPS:
        others = " && ".join(f"!defined(KERNELIZE_DTYPE_{o.upper()})" for o in DTYPES if o != dt)
        e = f"#if {others}\n{e}#endif\n"
    return e


def kernel_cu(k: K) -> str:
    pieces = "".join(_read(p) for p in ENGINES[k.engine])
    return (pieces + "\n// ---- entry points -----------------------------------------------------------------\n"
            + "\n".join(entry(k, dt) for dt in DTYPES))


def current_version(kernels_dir: str, name: str) -> str:
    """The version in kernels/<name>/kernel.toml (bumped by hand), 1.0.0 for a new kernel."""
    p = os.path.join(kernels_dir, name, "kernel.toml")
    if not os.path.exists(p):
        return "1.0.0"
    with open(p, "rb") as f:
        return tomllib.load(f)["version"]


def kernel_toml(k: K, version: str) -> str:
    desc = " ".join(textwrap.dedent(k.description).split())
    lines = [f'name = "{k.name}"', f'version = "{version}"', f'op = "{k.op}"']
    if k.semantics:
        lines.append(f'semantics = "{k.semantics}"')
    lines += [f'description = """{desc}"""', 'authors = ["kernelize"]', 'license = "Apache-2.0"',
              'source = "kernel.cu"']
    if k.nvrtc_options:
        lines.append("nvrtc_options = [" + ", ".join(f'"{o}"' for o in k.nvrtc_options) + "]")
    lines += ["", "[entry]"]
    lines += [f'{dt} = "{k.name}_{dt}"' for dt in DTYPES]
    lines.append(k.launch)
    for name, reason in CAPABILITIES.get(k.engine, []):
        lines += ["[[capability]]", f'name = "{name}"', f'reason = "{reason}"', ""]
    return "\n".join(lines).rstrip() + "\n"


def render(kernels_dir: str = KERNELS_DIR, kernels: list[K] | None = None) -> dict[str, str]:
    """Every generated file, by path relative to kernels_dir (`kernels`: KERNELS by default)."""
    out: dict[str, str] = {}
    for k in KERNELS if kernels is None else kernels:
        if f"{k.name}/kernel.cu" in out:
            raise ValueError(f"kernel {k.name} is listed twice")
        out[f"{k.name}/kernel.toml"] = kernel_toml(k, current_version(kernels_dir, k.name))
        out[f"{k.name}/kernel.cu"] = kernel_cu(k)
    if kernels is None:
        for name in PASTED_BACKWARD:
            out[f"{name}/kernel.cu"] = pasted_cu(name)
    return out


def differences(kernels_dir: str = KERNELS_DIR) -> list[str]:
    """One line per generated file that is missing or differs, and per kernel folder the
    generator does not know."""
    want = render(kernels_dir)
    bad = []
    for rel, text in want.items():
        p = os.path.join(kernels_dir, rel)
        try:
            with open(p, encoding="utf-8", newline="") as f:
                have = f.read()
        except FileNotFoundError:
            bad.append(f"kernels/{rel}: missing")
            continue
        if have != text:
            bad.append(f"kernels/{rel}: differs from what kernels/generate.py writes")
    known = {rel.split("/")[0] for rel in want} | HAND_WRITTEN
    for d in sorted(os.listdir(kernels_dir)):
        if os.path.isfile(os.path.join(kernels_dir, d, "kernel.toml")) and d not in known:
            bad.append(f"kernels/{d}: a kernel folder kernels/generate.py does not generate "
                       "(add it to KERNELS there, or remove the folder)")
    return bad


def write(kernels_dir: str, files: dict[str, str]) -> None:
    """Write `render`'s files under kernels_dir."""
    for rel, text in files.items():
        p = os.path.join(kernels_dir, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w", encoding="utf-8", newline="") as f:
            f.write(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when a generated file differs")
    ap.add_argument("--staged", metavar="DIR",
                    help="write the kernels not bundled yet (STAGED) into DIR instead")
    a = ap.parse_args(argv)
    if a.staged:
        files = render(a.staged, STAGED)
        write(a.staged, files)
        print(f"wrote {len(files) // 2} staged kernels to {a.staged}")
        return 0
    if a.check:
        bad = differences()
        for b in bad:
            print(b)
        if bad:
            print("run `python3 kernels/generate.py` and commit the result")
        return 1 if bad else 0
    files = render()
    write(KERNELS_DIR, files)
    print(f"wrote {sum(rel.endswith('/kernel.cu') for rel in files)} kernels to {KERNELS_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
