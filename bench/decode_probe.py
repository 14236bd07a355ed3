#!/usr/bin/env python3
"""Where a decode row's microseconds go (issue 29): the bundled exact LlamaRMSNorm at 1 x 2048
(bf16) against minimal kernels that compute the same bits, each differing in one respect.

    python3 bench/decode_probe.py OUT_DIR [--reps 200]

The probes are written for this one shape (eager's mean order at 1 x 2048 is 512 lanes of one
4-vector each, Reduce.cuh's block_x_reduce over them: offsets 256 .. 32 then a warp's 16 .. 1),
compiled by NVRTC with the client's options and launched through the client's launcher:

- `min`: 256 threads; each loads its 16 bytes of x and of the weight at once, folds its two
  lanes from registers, one warp runs the tree, the outputs come from registers;
- `min+grid396`: the same with the bundled kernel's persistent grid (3 blocks per SM);
- `min+smem40k`: the same with the bundled kernel's 40 KB of static shared memory;
- `min+late_w`: the weight loaded after the tree (as the staged engine does);
- `min+noinline`: the body in a __noinline__ function taking the arguments as a struct;
- `bundled only-direct`: the bundled kernel.cu with its entry calling the decode engine
  (kz_direct) directly: the same code on the row's path, none of the other paths in the module;
- stamps: %globaltimer along the decode engine's path (a copy of the source with stamps).

Each is checked bit for bit against HF LlamaRMSNorm and timed as in bench/decode_rows.py (a CUDA
graph of `reps` calls). Prints a table last; writes OUT_DIR/decode_probe.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from run_env import run_env  # noqa: E402 (bench/ is on the path of a bench script)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

from decode_rows import compiled_kernel, differ, graph_us  # noqa: E402
from kernelize import launch as L  # noqa: E402

SRC = r"""
#include <cuda_bf16.h>
typedef long long i64;
#ifndef PAD_FLOATS
#define PAD_FLOATS 1
#endif
__shared__ float pad[PAD_FLOATS];
struct Args { __nv_bfloat16* out; const __nv_bfloat16* x; const __nv_bfloat16* w; i64 rows, cols; float eps; };
__device__ __forceinline__ float lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ unsigned bf(float v) { return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float rnd(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float sq(float h) { return __fmul_rn(h, h); }
#ifdef NOINLINE
__device__ __noinline__
#else
__device__ __forceinline__
#endif
void body(const Args a) {
  __shared__ float ls[512];
  __shared__ float prm;
  if (blockIdx.x >= a.rows) return;
  const int t = threadIdx.x + blockDim.x * threadIdx.y;
  const uint4 xv = *reinterpret_cast<const uint4*>(a.x + t * 8);
#ifndef LATE_W
  const uint4 wv = __ldg(reinterpret_cast<const uint4*>(a.w + t * 8));
#endif
  const unsigned xw[4] = {xv.x, xv.y, xv.z, xv.w};
  float h[8];
  for (int i = 0; i < 4; ++i) { h[2 * i] = lo(xw[i]); h[2 * i + 1] = hi(xw[i]); }
  // lanes 2t and 2t + 1: one 4-vector each; accumulators a_i = 0 + h_i^2, folded ((a0+a1)+a2)+a3
  ls[2 * t] = __fadd_rn(__fadd_rn(__fadd_rn(sq(h[0]), sq(h[1])), sq(h[2])), sq(h[3]));
  ls[2 * t + 1] = __fadd_rn(__fadd_rn(__fadd_rn(sq(h[4]), sq(h[5])), sq(h[6])), sq(h[7]));
  if (a.rows < 0) pad[t % PAD_FLOATS] = h[0];  // keeps the pad
  __syncthreads();
  if (t < 32) {
    float v[16];
    for (int k = 0; k < 16; ++k) v[k] = ls[t + 32 * k];
    for (int o = 8; o >= 1; o >>= 1)
      for (int k = 0; k < o; ++k) v[k] = __fadd_rn(v[k], v[k + o]);
    for (int off = 16; off >= 1; off >>= 1) v[0] = __fadd_rn(v[0], __shfl_down_sync(0xffffffffu, v[0], off));
    if (t == 0) {
      const float fac = __fdiv_rn(1.0f, (float)a.cols);
      prm = rsqrtf(__fadd_rn(__fmul_rn(v[0], fac), a.eps));
    }
  }
  __syncthreads();
  const float r = prm;
#ifdef LATE_W
  const uint4 wv = __ldg(reinterpret_cast<const uint4*>(a.w + t * 8));
#endif
  const unsigned ww[4] = {wv.x, wv.y, wv.z, wv.w};
  unsigned o[4];
  for (int i = 0; i < 4; ++i) {
    const float y0 = __fmul_rn(lo(ww[i]), rnd(__fmul_rn(h[2 * i], r)));
    const float y1 = __fmul_rn(hi(ww[i]), rnd(__fmul_rn(h[2 * i + 1], r)));
    o[i] = bf(y0) | (bf(y1) << 16);
  }
  *reinterpret_cast<uint4*>(a.out + t * 8) = make_uint4(o[0], o[1], o[2], o[3]);
}
extern "C" __global__ void probe_bf16(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w,
                                      i64 rows, i64 cols, float eps) {
  body(Args{out, x, w, rows, cols, eps});
}
"""


PROBE_DIRECT = r"""
template <typename T, int MODE, bool RESID>
KZ_DEV void kz_probe_direct(T* out, T* res, const T* x, const T* w, i64 rows, i64 cols, float eps) {
  typedef MeanP<T, MODE, RESID> P;
  const P p{out, res, x, w, cols, eps, true, true, kz_mean_factor(rows, cols)};
  kz_direct<T, P, RESID>(p, x, res, rows, kz_mean_cfg(rows, cols));
}
"""


def bundled_variant(src: str, only_direct: bool, inline: bool = False) -> str:
    if only_direct:
        a = "// ---- entry points"
        assert a in src
        src = src.replace(a, PROBE_DIRECT + a, 1)
        src = src.replace("kz_mean_norm<__nv_bfloat16, KZ_LLAMA, false>(", "kz_probe_direct<__nv_bfloat16, KZ_LLAMA, false>(")
    return src


# Time stamps (globaltimer, ns) taken by thread 0 of block 0 along the decode engine's path,
# written over the first 64 bytes of the output after its last store: (anchor, stamp index)
# pairs, each stamp inserted after the first occurrence of its anchor.
STAMPS = [
    ("  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {\n    const i64 base = row * p.cols;\n", 1),
    ("    __syncthreads();  // every lane's result is in kz_ls\n", 2),
    ("        else kz_direct_tree_k<16>(p, nwb);\n      }\n", 3),
    ("    __syncthreads();  // the row's parameters are in kz_prm\n", 4),
    ("      if (t + nt * j < cpr) kz_st16(p.out + base + (i64)(t + nt * j) * EPC, p.out16w(h[j], wt[j], q));\n", 5),
    ("  for (int k = 0; k < K; ++k) a[k] = kz_ls[g + 32 * k];\n", 6),
    ("  st.a0 = kz_mean_tree<K>(a, NWB, NWB < K);\n", 7),
]
STAMP_NAMES = ("entry, row start, lanes summed + barrier, tree, barrier, stores issued, tree loads issued, "
               "tree sum; the same for a second pass over the row")


def stamped(src: str) -> str:
    decl = "__device__ unsigned long long kz_st[16];\n__shared__ int kz_pass;\n"
    anchor = "template <typename T> KZ_DEV bool kz_direct_fits(i64 cols) {"
    assert anchor in src
    src = src.replace(anchor, decl + anchor, 1)
    stamp = ("    if (blockIdx.x == 0 && kz_tid() == 0) {{ unsigned long long g; "
             "asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(g)); kz_st[{i} + 8 * kz_pass] = g; }}\n")
    for anchor, i in STAMPS:
        assert anchor in src, anchor
        extra = stamp.format(i=i)
        if i == 5:
            extra += ("    __syncthreads();\n    if (blockIdx.x == 0 && kz_tid() < 16) "
                      "reinterpret_cast<unsigned long long*>(p.out)[kz_tid()] = kz_st[kz_tid()];\n")
        src = src.replace(anchor, anchor + extra, 1)
    # the decode engine twice in a row on the same row: the second pass runs with the code's
    # instructions already fetched (stamps 8..13)
    head = "KZ_DEV void kz_probe_direct(T* out, T* res, const T* x, const T* w, i64 rows, i64 cols, float eps) {\n"
    call = "  kz_direct<T, P, RESID>(p, x, res, rows, kz_mean_cfg(rows, cols));\n"
    assert head in src and call in src
    src = src.replace(call, "#pragma unroll 1\n  for (int pass = 0; pass < 2; ++pass) {\n"
                      "  if (kz_tid() == 0) kz_pass = pass;\n  __syncthreads();\n" + stamp.format(i=0) + call + "  }\n", 1)
    return src


def manifest(grid):
    return {"name": "probe", "entries": {"bf16": "probe_bf16"}, "nvrtc_options": [],
            "launch": [{"cols_max": None, "block": [32, 8, 1], "grid": grid, "smem_bytes": 0,
                        "smem_bytes_per_col": 0}]}


PER_ROW = {"kind": "per_row", "rows_per_block": 1}
PERSISTENT = {"kind": "persistent", "blocks_per_sm": 3}
PROBES = {
    "min": ("", PER_ROW),
    "min+grid396": ("", PERSISTENT),
    "min+smem40k": ("#define PAD_FLOATS 10240\n", PER_ROW),
    "min+late_w": ("#define LATE_W 1\n", PER_ROW),
    "min+noinline": ("#define NOINLINE 1\n", PER_ROW),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--reps", type=int, default=200)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = run_env()
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    torch.manual_seed(0)
    rows, cols, dt = 1, 2048, torch.bfloat16
    m = LlamaRMSNorm(cols, eps=1e-5).cuda().to(dt)
    with torch.no_grad():
        m.weight.copy_((torch.randn(cols, device="cuda") * 0.1 + 1).to(dt))
    x = torch.randn(rows, cols, device="cuda", dtype=dt)
    dev = torch.device("cuda", torch.cuda.current_device())
    res = []
    with torch.no_grad():
        want = m(x)
        res.append(dict(probe="eager", us=graph_us(lambda: m(x), a.reps), bits_differ=0))
        comp = torch.compile(m)
        res.append(dict(probe="torch.compile", us=graph_us(lambda: comp(x), a.reps), bits_differ=differ(comp(x), want)))
        ck = compiled_kernel(ROOT / "kernels", "rms_norm_llama", "bf16")
        f = lambda: L.run_rms_norm(ck, x, m.weight, 1e-5)  # noqa: E731
        res.append(dict(probe="bundled rms_norm_llama", us=graph_us(f, a.reps), bits_differ=differ(f(), want)))
        for name, (defs, grid) in PROBES.items():
            k = L.CompiledKernel(manifest(grid), defs + SRC, "bf16", dev)
            f = lambda: L.run_rms_norm(k, x, m.weight, 1e-5)  # noqa: E731
            res.append(dict(probe=name, us=graph_us(f, a.reps), bits_differ=differ(f(), want)))
            print(res[-1], flush=True)
        src = (ROOT / "kernels" / "rms_norm_llama" / "kernel.cu").read_text(encoding="utf-8")
        for name, od, inl in (("bundled only-direct", True, False),):
            k = L.CompiledKernel(ck.manifest, bundled_variant(src, od, inl), "bf16", dev)
            f = lambda: L.run_rms_norm(k, x, m.weight, 1e-5)  # noqa: E731
            res.append(dict(probe=name, us=graph_us(f, a.reps), bits_differ=differ(f(), want)))
            print(res[-1], flush=True)
        # where the decode engine's time goes: stamps along its path (ns from the kernel's entry)
        k = L.CompiledKernel(ck.manifest, stamped(bundled_variant(src, True, False)), "bf16", dev)
        (out / "stamped.cubin").write_bytes(k.code.code)  # for cuobjdump -sass
        for _ in range(50):
            y = L.run_rms_norm(k, x, m.weight, 1e-5)
        torch.cuda.synchronize()
        st = y.view(torch.int64)[0, :16].tolist()
        stamps = [s_ - st[0] for s_ in st[:8]] + [s_ - st[8] for s_ in st[8:16]]
        print(f"stamps (ns after entry: {STAMP_NAMES}):", stamps, flush=True)
        res.append(dict(probe="stamps (ns): " + STAMP_NAMES, us=0.0, bits_differ=-1, stamps=stamps))
    (out / "decode_probe.json").write_text(json.dumps(dict(env=env, rows=res), indent=1))
    print("\n" + json.dumps(env))
    print("| probe (LlamaRMSNorm 1x2048 bf16) | GPU µs per call | bits differing from eager |")
    print("| --- | ---: | ---: |")
    for r in res:
        print(f"| {r['probe']} | {r['us']:.2f} | {r['bits_differ']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
