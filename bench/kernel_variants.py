#!/usr/bin/env python3
"""Kernel folders that differ from a release in one respect each, for timing side by side
(issue 29): the variants measured in session 18 (docs/gpu-runs/2026-11-27-s18/README.md).

    python3 bench/kernel_variants.py OUT_DIR [--base REV] [--only v1,v2]

Each variant is OUT_DIR/<variant>/kernels: the bundled kernels of git revision REV (default
74de427, silu_mul 1.0.2, the release those runs compared against) with the variant's edit made to
the generated kernel.cu of the kernels it names (a kernel.cu holds its engine's sources pasted
together, so an edit to it is an edit to those sources for that kernel alone). Pass them to
`bench/decode_rows.py --variant NAME=DIR` and `bench/decode_context_probe.py --variant NAME=DIR`.
These folders are for timing only: their digests are not released and nothing certifies them.

Variants (silu_mul unless said):
  nvec1       the large grids' 4-vector path compiled as the 1-vector one (#define KZ_EW_NVEC 1)
  roll        a vector's 8 elements in a rolled loop over its four 32-bit words
  roll_nvec1  both
  split       the 1-vector path (decode rows) in a __noinline__ function
  bigsplit    the 4-vector path in a __noinline__ function (what silu_mul 1.0.3 does), and
              fused_add_rms_norm with every path but the decode engine in a __noinline__ function
  unary_wide  silu and gelu_tanh: the 4-vector path in a __noinline__ function (as bigsplit
              for silu_mul)
  unary_nvec1 silu and gelu_tanh: as nvec1 (does the unary kernels' decode row start cold too?)
  ln_split    layer_norm: every path but the decode engine in a __noinline__ function (GPT-2's
              norm at decode rows; bench/decode_context_probe.py --block gpt2)
  division    silu and silu_mul: eager's silu division without a branch per element: a Newton
              sequence for every element and one branch per vector to __fdiv_rn where an operand
              is out of the sequence's range (scripts/silu_exhaustive.py: exact on every input)

Variants kept as patches of kernels/src (bench/variants/*.patch, each against the revision named
in PATCHES; applied there, then kernels/generate.py rewrites every kernel from the sources):
  decode_prologue  the norms' decode paths: loads before the factor and the config, the Welford
              pushes' 1/n folded, every warp running the mean tree (session 23; the patch's
              header says what and why)
  rows_nu0    the generic row engines (kz_rows) streamed instead of held in registers, the same
              bits: NVRTC time of the norms' modules (issue 29; the patch's header). A record:
              the norms 1.0.8 (session 38) stream those rows further (docs/verifier.md, "The
              forward norms' generic rows, streamed")
"""
from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def replace_once(s: str, old: str, new: str, what: str) -> str:
    if s.count(old) != 1:
        raise SystemExit(f"{what}: the text to replace occurs {s.count(old)} times (the base revision's "
                         "kernel.cu is not the one this variant was written for)")
    return s.replace(old, new, 1)


def insert_before(s: str, anchor: str, text: str, what: str) -> str:
    return replace_once(s, anchor, text + anchor, what)


# ---- silu_mul (gated engine) ------------------------------------------------------------------

GATED_LOOP = """      T* ge = reinterpret_cast<T*>(&g[j]);
      const T* ue = reinterpret_cast<const T*>(&u[j]);
#pragma unroll
      for (int i = 0; i < W; ++i) ge[i] = KT<T>::from(kz_gate<T, F>(KT<T>::f(ge[i]), KT<T>::f(ue[i])));
      __stcs(os + j * blockDim.x, g[j]);"""
GATED_TAIL_LOOP = """        T* ge = reinterpret_cast<T*>(&g[j]);
        const T* ue = reinterpret_cast<const T*>(&u[j]);
#pragma unroll
        for (int i = 0; i < W; ++i) ge[i] = KT<T>::from(kz_gate<T, F>(KT<T>::f(ge[i]), KT<T>::f(ue[i])));
        __stcs(reinterpret_cast<uint4*>(out + e0[j]), g[j]);"""
GATED_ANCHOR = "// gate, up and out are contiguous"
GATED_DISPATCH_ANCHOR = "// One vector per thread, or KZ_EW_NVEC on one block"
GATED_SMALL = "  if (gridDim.x < KZ_EW_BIG_GRID) kz_gated_tiles<T, F, 1>(out, gate, up, rows, cols, blockIdx.x, gridDim.x);"
GATED_BIG = "  else if (kz_ew_big_block(vb, vg)) kz_gated_tiles<T, F, KZ_EW_NVEC>(out, gate, up, rows, cols, vb, vg);"

ROLLED = r'''
template <typename T, int F>
KZ_DEV unsigned kz_gate_word(unsigned gw, unsigned uw) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(kz_gate<T, F>(__uint_as_float(gw), __uint_as_float(uw)));
  } else {
    T ge[2], ue[2], o[2];
    memcpy(ge, &gw, 4);
    memcpy(ue, &uw, 4);
    o[0] = KT<T>::from(kz_gate<T, F>(KT<T>::f(ge[0]), KT<T>::f(ue[0])));
    o[1] = KT<T>::from(kz_gate<T, F>(KT<T>::f(ge[1]), KT<T>::f(ue[1])));
    unsigned r;
    memcpy(&r, o, 4);
    return r;
  }
}
// the four words rotate through a0..a3 (registers, no indexing): after 4 steps a0..a3 are the outputs
template <typename T, int F>
KZ_DEV void kz_gate_vec_rolled(uint4& g, const uint4& u) {
  unsigned a0 = g.x, a1 = g.y, a2 = g.z, a3 = g.w, b0 = u.x, b1 = u.y, b2 = u.z, b3 = u.w;
#pragma unroll 1
  for (int k = 0; k < 4; ++k) {
    const unsigned o = kz_gate_word<T, F>(a0, b0);
    a0 = a1; a1 = a2; a2 = a3; a3 = o;
    b0 = b1; b1 = b2; b2 = b3;
  }
  g = make_uint4(a0, a1, a2, a3);
}
'''
SMALL_FN = r'''
template <typename T, int F>
__device__ __noinline__ void kz_gated_small(T* out, const T* gate, const T* up, i64 rows, i64 cols) {
  kz_gated_tiles<T, F, 1>(out, gate, up, rows, cols, blockIdx.x, gridDim.x);
}
'''
BIG_FN = r'''
template <typename T, int F>
__device__ __noinline__ void kz_gated_big(T* out, const T* gate, const T* up, i64 rows, i64 cols) {
  unsigned vb, vg;
  if (kz_ew_big_block(vb, vg)) kz_gated_tiles<T, F, KZ_EW_NVEC>(out, gate, up, rows, cols, vb, vg);
}
'''


def nvec1(s: str) -> str:
    return insert_before(s, "#ifndef KZ_EW_NVEC", "#define KZ_EW_NVEC 1\n", "nvec1")


def roll(s: str) -> str:
    s = insert_before(s, GATED_ANCHOR, ROLLED, "roll")
    return replace_once(s, GATED_LOOP, "      kz_gate_vec_rolled<T, F>(g[j], u[j]);\n"
                        "      __stcs(os + j * blockDim.x, g[j]);", "roll")


def split(s: str) -> str:
    s = insert_before(s, GATED_DISPATCH_ANCHOR, SMALL_FN, "split")
    return replace_once(s, GATED_SMALL, "  if (gridDim.x < KZ_EW_BIG_GRID) kz_gated_small<T, F>(out, gate, up, rows, cols);",
                        "split")


def gated_big(s: str) -> str:
    s = insert_before(s, GATED_DISPATCH_ANCHOR, BIG_FN, "bigsplit")
    return replace_once(s, GATED_BIG, "  else kz_gated_big<T, F>(out, gate, up, rows, cols);", "bigsplit")


# ---- fused_add_rms_norm (eager engine): the decode engine inline, the rest out of line ----------

NORM_HEAD = ("template <typename T, int MODE, bool RESID>\n"
             "KZ_DEV void kz_mean_norm(T* out, T* res, const T* x, const T* w, i64 rows, i64 cols, float eps) {")
NORM_FRONT = r'''
template <typename T, int MODE, bool RESID>
KZ_DEV void kz_mean_norm(T* out, T* res, const T* x, const T* w, i64 rows, i64 cols, float eps) {
  typedef MeanP<T, MODE, RESID> P;
  if (blockDim.z == 1 && cols > 128 && (cols * (i64)sizeof(T)) % 16 == 0 && kz_al16(x) && kz_al16(out) &&
      kz_al16(w) && (!RESID || kz_al16(res)) && rows <= gridDim.x && kz_direct_fits<T>(cols)) {
    const bool bal = kz_al<T>(x) && kz_al<T>(out) && (!RESID || kz_al<T>(res));
    const P p{out, res, x, w, cols, eps, cols % 4 == 0 && bal, kz_al<T>(w), kz_mean_factor(rows, cols)};
    kz_direct<T, P, RESID>(p, x, res, rows, kz_mean_cfg(rows, cols));
    return;
  }
  kz_mean_norm_all<T, MODE, RESID>(out, res, x, w, rows, cols, eps);
}
'''


LN_HEAD = ("template <typename T, bool TORCH>\n"
           "KZ_DEV void kz_ln_order(T* out, const T* x, const T* w, const T* b, i64 rows, i64 cols, float eps) {")
LN_FRONT = r'''
template <typename T, bool TORCH>
KZ_DEV void kz_ln_order(T* out, const T* x, const T* w, const T* b, i64 rows, i64 cols, float eps) {
  typedef LnP<T, TORCH> P;
  const bool vec = cols % 4 == 0 && cols <= (1LL << 24);
  if (blockDim.z == 1 && vec && cols > 128 && (cols * (i64)sizeof(T)) % 16 == 0 && kz_al16(x) && kz_al16(out) &&
      kz_al16(w) && (TORCH || kz_al16(b)) && rows <= gridDim.x && kz_direct_fits<T>(cols)) {
    const P p{out, x, w, b, cols, eps, kz_al<T>(x) && kz_al<T>(out), kz_al<T>(w) && (TORCH || kz_al<T>(b))};
    kz_direct<T, P, false>(p, x, nullptr, rows, KzCfg{});
    return;
  }
  kz_ln_order_all<T, TORCH>(out, x, w, b, rows, cols, eps);
}
'''


def ln_split(s: str) -> str:
    s = replace_once(s, LN_HEAD, LN_HEAD.replace("KZ_DEV void kz_ln_order(", "__device__ __noinline__ void kz_ln_order_all("),
                     "ln_split")
    return insert_before(s, "// ---- entry points", LN_FRONT, "ln_split")


def norm_split(s: str) -> str:
    s = replace_once(s, NORM_HEAD, NORM_HEAD.replace("KZ_DEV void kz_mean_norm(", "__device__ __noinline__ void kz_mean_norm_all("),
                     "bigsplit (norm)")
    return insert_before(s, "// ---- entry points", NORM_FRONT, "bigsplit (norm)")


# ---- silu (elementwise engine) ----------------------------------------------------------------

UNARY_DISPATCH = """template <typename T, int F>
KZ_DEV void kz_unary(T* out, const T* x, i64 n) {
  unsigned vb, vg;
  if (gridDim.x < KZ_EW_BIG_GRID) kz_unary_tiles<T, F, 1>(out, x, n, blockIdx.x, gridDim.x);
  else if (kz_ew_big_block(vb, vg)) kz_unary_tiles<T, F, KZ_EW_NVEC>(out, x, n, vb, vg);
}"""
UNARY_WIDE = """template <typename T, int F>
__device__ __noinline__ void kz_unary_wide(T* out, const T* x, i64 n) {
  unsigned vb, vg;
  if (kz_ew_big_block(vb, vg)) kz_unary_tiles<T, F, KZ_EW_NVEC>(out, x, n, vb, vg);
}
template <typename T, int F>
KZ_DEV void kz_unary(T* out, const T* x, i64 n) {
  if (gridDim.x < KZ_EW_BIG_GRID) kz_unary_tiles<T, F, 1>(out, x, n, blockIdx.x, gridDim.x);
  else kz_unary_wide<T, F>(out, x, n);
}"""


def unary_wide(s: str) -> str:
    return replace_once(s, UNARY_DISPATCH, UNARY_WIDE, "unary_wide")


# ---- division: silu's h / (1 + expf(-h)) with one branch per vector ----------------------------

ACT_N = r'''
KZ_DEV float kz_div_short(float a, float d, bool& ok) {
  float r = __fdividef(1.0f, d);
  r = fmaf(fmaf(-d, r, 1.0f), r, r);
  float q = __fmul_rn(a, r);
  q = fmaf(fmaf(-d, q, a), r, q);
  q = fmaf(fmaf(-d, q, a), r, q);
  const float m = fabsf(a);
  ok = m >= 0x1p-60f && m <= 0x1p100f && d >= 1.0f && d <= 0x1p60f;
  return q;
}
template <int F, int N>
KZ_DEV void kz_act_n(float (&h)[N]) {
  if constexpr (F == KZ_SILU) {
    float d[N], q[N];
    bool ok[N], all = true;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      d[i] = __fadd_rn(1.0f, expf(-h[i]));
      q[i] = kz_div_short(h[i], d[i], ok[i]);
      all = all && ok[i];
    }
    if (!all) {
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (!ok[i]) q[i] = __fdiv_rn(h[i], d[i]);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = q[i];
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = kz_act<F>(h[i]);
  }
}
'''
ACT_VEC = """  {
    constexpr int WW = 16 / sizeof(T);
    float a_[WW];
#pragma unroll
    for (int i = 0; i < WW; ++i) a_[i] = KT<T>::f(%(g)s[i]);
    kz_act_n<F>(a_);
#pragma unroll
    for (int i = 0; i < WW; ++i) %(g)s[i] = KT<T>::from(%(expr)s);
  }
"""
UNARY_LOOP = """      T* e = reinterpret_cast<T*>(&v[j]);
#pragma unroll
      for (int i = 0; i < W; ++i) e[i] = KT<T>::from(kz_act<F>(KT<T>::f(e[i])));
"""


def division(s: str, kernel: str) -> str:
    s = insert_before(s, "// NVEC x 16 bytes per thread per step" if kernel == "silu" else "// Gated ops", ACT_N, "division")
    if kernel == "silu":
        vec = ACT_VEC % dict(g="e", expr="a_[i]")
        s = replace_once(s, UNARY_LOOP, "      T* e = reinterpret_cast<T*>(&v[j]);\n" + vec, "division (silu)")
        return replace_once(s, UNARY_LOOP.replace("\n      ", "\n        ").replace("      T* e", "        T* e", 1),
                            "        T* e = reinterpret_cast<T*>(&v[j]);\n" + vec, "division (silu tail)")
    vec = ACT_VEC % dict(g="ge", expr="__fmul_rn(KT<T>::rnd(a_[i]), KT<T>::f(ue[i]))")
    s = replace_once(s, GATED_LOOP, GATED_LOOP.split("#pragma unroll")[0] + vec
                     + "      __stcs(os + j * blockDim.x, g[j]);", "division (silu_mul)")
    return replace_once(s, GATED_TAIL_LOOP, GATED_TAIL_LOOP.split("#pragma unroll")[0] + vec
                        + "        __stcs(reinterpret_cast<uint4*>(out + e0[j]), g[j]);", "division (silu_mul tail)")


VARIANTS = {
    "nvec1": {"silu_mul": nvec1},
    "roll": {"silu_mul": roll},
    "roll_nvec1": {"silu_mul": lambda s: roll(nvec1(s))},
    "split": {"silu_mul": split},
    "bigsplit": {"silu_mul": gated_big, "fused_add_rms_norm": norm_split},
    "unary_wide": {"silu": unary_wide, "gelu_tanh": unary_wide},
    "unary_nvec1": {"silu": nvec1, "gelu_tanh": nvec1},
    "ln_split": {"layer_norm": ln_split},
    "division": {"silu": lambda s: division(s, "silu"), "silu_mul": lambda s: division(s, "silu_mul")},
}


# name -> (the revision the patch is against, the patch)
PATCHES = {
    "decode_prologue": ("4295c07", ROOT / "bench" / "variants" / "decode-prologue.patch"),
    "rows_nu0": ("c851cef", ROOT / "bench" / "variants" / "rows-nu0.patch"),
}


def export(rev: str, dst: Path, *paths: str) -> None:
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kernels", *paths], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dst, filter="data")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--base", default="74de427", help="git revision whose kernels/ the variants start from")
    p.add_argument("--only", default=",".join(VARIANTS),
                   help="variants: " + ", ".join([*VARIANTS, *PATCHES]))
    a = p.parse_args()
    out = Path(a.out)
    for name in a.only.split(","):
        if name in PATCHES:
            rev, patch = PATCHES[name]
            d = out / name
            shutil.rmtree(d, ignore_errors=True)
            export(rev, d, "python/tests/fixtures/abi.json")  # the generator reads the ABI table
            try:  # inside the checkout (an ignored folder): paths relative to its top
                cmd, cwd = ["git", "apply", "--directory", str(d.resolve().relative_to(ROOT))], ROOT
            except ValueError:  # outside any repository git apply patches the folder it runs in
                cmd, cwd = ["git", "apply"], d
            r = subprocess.run([*cmd, str(patch)], cwd=cwd, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"{name}: {patch.name} does not apply to {rev}'s kernels/src: {r.stderr.strip()}")
            subprocess.run([sys.executable, str(d / "kernels" / "generate.py")], check=True, capture_output=True)
            print(f"{name}={d / 'kernels'}  (kernels/src patched with {patch.name}, regenerated)")
            continue
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}: one of {', '.join([*VARIANTS, *PATCHES])}")
        d = out / name
        shutil.rmtree(d, ignore_errors=True)
        export(a.base, d)
        for kernel, edit in VARIANTS[name].items():
            f = d / "kernels" / kernel / "kernel.cu"
            f.write_text(edit(f.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"{name}={d / 'kernels'}  ({', '.join(VARIANTS[name])} edited)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
