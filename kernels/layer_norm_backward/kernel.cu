// ---- kernelize: nn.LayerNorm's backward in eager autograd's bits (op layer_norm_backward) --------
// Self-contained: NVRTC with cuda_bf16.h / cuda_fp16.h (and the CPU harness of
// python/tests/cuda_on_cpu). The bundled kernel of op layer_norm_backward (docs/spec.md section
// 2c; docs/backward-layer-norm.md, "The kernel"); kernel.toml names its entries.
//
// Written from the emulation in python/kernelize/backward_ln.py (its defaults: dx_fma
// "xy_sub_z", sum_fma True, s1_fma False: eager's SASS, read in session 25), one f32 rounding
// per step; every product, sum and fused
// multiply-add below is an explicit __fmul_rn / __fadd_rn / __fsub_rn / fmaf, so the bits do
// not depend on the compiler's contraction. python/tests/test_ln_backward_kernel_on_cpu.py runs
// this source on the CPU and checks dx, dw, db against the emulation bit for bit.
//
// Per element, with g = dy, h = x (as f32), m, r the row's saved mean and rstd (f32):
//   dx:  s1 = rowsum fl(. + fl(g * w))              s2 = rowsum fma(fl(fl(g * w) * fl(h - m)), r, .)
//        A = fl(cols * w)   Bv = fl(fl(h - m) * r)   f1 = fma(A, g, -fl(Bv * s2))
//        dx = round_T(fl(fl(f1 - s1) * fl(fl(1 / cols) * r)))
//   dw:  colsum fma(fl(g * fl(h - m)), r, .)        db: colsum fl(. + g)        round_T at the store
// rowsum: one 128-thread block per row; thread t accumulates, in increasing order, the elements
// e with (e / 4) % 128 == t into ONE accumulator per sum (eager's vectorized dx kernel's
// mapping); then a shfl_down halving tree in each warp (16..1), the 4 warp sums into warp 0
// (zeros in lanes 4..31), the same tree: (w0 + w2) + (w1 + w3).
// The emulator models this order for BOTH of eager's dx kernels. On an H200 (docs, "On a GPU")
// eager's plain kernel (unaligned tensors, or cols % 4 != 0) differed from its vectorized one in
// a few bits, so on such inputs this kernel follows the emulator (the vectorized kernel's order,
// with scalar loads), not eager's plain kernel. On an H200 (session 25) this kernel gave eager's
// bf16 and f16 dx, dw, db and f32 dw, db in every case; with s1's add unfused (eager's SASS)
// it gave f32 dx too (session 26, every probe case of every dtype).
// colsum (eager's GammaBeta template kernel; M = rows): bdy = 1 (M < 64), 8 (M < 128),
// 16 (M < 256), else 32; with bdy = 1 one chain sums every row in order; else chain y sums rows
// R*k + 8*y + i (R = 8*bdy; k = 0, 1, ..; i = 0..7) in order, then the halving tree over the
// chains, v[y] += v[y + off] for off = bdy/2 .. 1. Which thread runs which chain, how many columns
// it carries and when it loads are free (the "dw, db" section below): eager's loads in flight,
// 2-column loads at cols >= 4096, tiles of 8..64 columns (session 26, H200: eager's bits; 0.70-0.93x
// of the GPU time of eager's GammaBeta kernel from 1024 rows on, bf16; docs, "The kernel").
//
// ABI (contiguous row-major [rows, cols] tensors; mean, rstd f32 [rows]):
//   ln_bwd_dx_<dt>(T* dx, const T* dy, const T* x, const float* mean, const float* rstd,
//                  const T* w, long long rows, long long cols)
//       block 128 threads (traps otherwise); any grid >= 1: the blocks loop over the rows
//       (row = blockIdx.x, + gridDim.x, ...), so every grid gives the same bits (grid = rows:
//       one row per block, as eager launches it).
//   ln_bwd_dwdb_<dt>(T* dw, T* db, const T* dy, const T* x, const float* mean,
//                    const float* rstd, long long rows, long long cols)
//       block (X, Y): X = 8, 16 or 32, bdy(rows) <= Y <= 32, X * Y a multiple of 32 (traps
//       otherwise; (32, 32) always works, threads y >= bdy(rows) idle). The blocks loop over
//       column tiles of VC * X columns (tile = blockIdx.x, + gridDim.x, ...), VC = 2 where cols
//       is even and >= 4096 and dy, x are 2 * sizeof(T)-aligned (a thread carries two adjacent
//       columns), else 1; rows < 64 with Y > 1: tiles of X columns, the rows staged through
//       shared memory. Every block shape and grid >= 1 gives the same bits. For speed, a block
//       per tile: rows < 64: (32, 1) up to 32 rows, (32, 8) above, grid ceil(cols / 32); else
//       (X, bdy(rows)) with X the largest of 32, 16, 8 (16, 8 under 1024 rows) giving
//       ceil(cols / (VC * X)) >= 0.9 * the SM count (else 8), grid ceil(cols / (VC * X)) (kernel_registry::backward::dwdb_dims, scripts/ln_backward_probe.py
//       dwdb_launch; on an H200: 128 x (8, 32) at 8192 x 1024, 128 x (16, 32) at 4096 x 4096,
//       128 x (32, 32) at 8192 x 8192). Eager launches (32, bdy) x ceil(cols / 32).
//   <dt>: bf16 (T = __nv_bfloat16), f16 (__half), f32 (float).
// Out of scope: eager's two-pass dw/db variant (rows > 65536 and cols / 32 < sms / 2, which also
// depends on the device's SM count): ln_bwd_dwdb traps for every rows > 65536.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define LB_DEV __device__ __forceinline__
typedef long long i64;

// ---- values of T as f32, and rounding to T at the store ------------------------------------------
template <typename T> struct LT;
template <> struct LT<float> {
  static LB_DEV float ld(const float* p) { return *p; }
  static LB_DEV void st(float* p, float v) { *p = v; }
};
template <> struct LT<__nv_bfloat16> {
  static LB_DEV float ld(const __nv_bfloat16* p) {
    return __uint_as_float((unsigned)*reinterpret_cast<const unsigned short*>(p) << 16);
  }
  static LB_DEV void st(__nv_bfloat16* p, float v) {
    *reinterpret_cast<unsigned short*>(p) = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};
template <> struct LT<__half> {
  static LB_DEV float ld(const __half* p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
  }
  static LB_DEV void st(__half* p, float v) {
    *reinterpret_cast<unsigned short*>(p) = __half_as_ushort(__float2half_rn(v));
  }
};

LB_DEV bool lb_al(const void* p, int bytes) { return (reinterpret_cast<size_t>(p) & (size_t)(bytes - 1)) == 0; }

// n (1..4) consecutive elements p[0..n) as f32; vec: one aligned 4-element access (n == 4)
template <typename T> LB_DEV void lb_ld4(const T* p, bool vec, int n, float (&v)[4]) {
  if (vec) {
    if constexpr (sizeof(T) == 4) {
      const uint4 q = *reinterpret_cast<const uint4*>(p);
      v[0] = __uint_as_float(q.x); v[1] = __uint_as_float(q.y); v[2] = __uint_as_float(q.z); v[3] = __uint_as_float(q.w);
    } else {
      T e[4];
      *reinterpret_cast<uint2*>(e) = *reinterpret_cast<const uint2*>(p);
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = LT<T>::ld(e + i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = i < n ? LT<T>::ld(p + i) : 0.f;
  }
}
template <typename T> LB_DEV void lb_st4(T* p, bool vec, int n, const float (&v)[4]) {
  if (vec) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<uint4*>(p) = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]),
                                                __float_as_uint(v[2]), __float_as_uint(v[3]));
    } else {
      T e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) LT<T>::st(e + i, v[i]);
      *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(e);
    }
  } else {
    for (int i = 0; i < n; ++i) LT<T>::st(p + i, v[i]);
  }
}

// ---- dx: a 128-thread block per row ------------------------------------------------------------
#define LB_DX_THREADS 128
#define LB_DX_SPAN (4 * LB_DX_THREADS)  // elements per pass of the block: 4 per thread
__shared__ float lb_w1[LB_DX_THREADS / 32], lb_w2[LB_DX_THREADS / 32];  // the warps' sums
__shared__ float lb_tot[2];                                              // the row's s1, s2

// lane 0 gets the warp's halving tree: v[l] += v[l + off], off = 16 .. 1
LB_DEV float lb_warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, off));
  return v;
}

template <typename T>
LB_DEV void lb_dx(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                  const float* __restrict__ mean, const float* __restrict__ rstd,
                  const T* __restrict__ w, i64 rows, i64 cols) {
  if (blockDim.x != LB_DX_THREADS || blockDim.y != 1 || blockDim.z != 1) __trap();
  const int tid = (int)threadIdx.x, lane = tid & 31, wp = tid >> 5;
  const int A4 = 4 * (int)sizeof(T);
  // eager's vectorized kernel's condition; the bits do not depend on it (scalar loads otherwise)
  const bool vec = cols % 4 == 0 && lb_al(dx, A4) && lb_al(dy, A4) && lb_al(x, A4) && lb_al(w, A4);
  const float fH = (float)cols;
  const float inv_h = __fdiv_rn(1.0f, fH);
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const float m = mean[row], r = rstd[row];
    const T* gr = dy + row * cols;
    const T* hr = x + row * cols;
    T* dr = dx + row * cols;
    // the thread's sums over elements 4*tid + 512*k + {0, 1, 2, 3}, in order
    float s1 = 0.f, s2 = 0.f;
    for (i64 e0 = 4 * (i64)tid; e0 < cols; e0 += LB_DX_SPAN) {
      const int n = cols - e0 < 4 ? (int)(cols - e0) : 4;
      float gv[4], hv[4], wv[4];
      lb_ld4(gr + e0, vec, n, gv);
      lb_ld4(hr + e0, vec, n, hv);
      lb_ld4(w + e0, vec, n, wv);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (i < n) {
          // eager's SASS (backward_ln's doc): s1's add unfused, s2's fused
          const float clg = __fmul_rn(gv[i], wv[i]);
          s1 = __fadd_rn(s1, clg);
          s2 = fmaf(__fmul_rn(clg, __fsub_rn(hv[i], m)), r, s2);
        }
      }
    }
    // BlockReduceSum for both: the warps' trees, then warp 0 over (w0, w1, w2, w3, 0, ..., 0)
    s1 = lb_warp_sum(s1);
    s2 = lb_warp_sum(s2);
    if (lane == 0) {
      lb_w1[wp] = s1;
      lb_w2[wp] = s2;
    }
    __syncthreads();
    if (wp == 0) {
      float a = lane < LB_DX_THREADS / 32 ? lb_w1[lane] : 0.f;
      float b = lane < LB_DX_THREADS / 32 ? lb_w2[lane] : 0.f;
      a = lb_warp_sum(a);
      b = lb_warp_sum(b);
      if (lane == 0) {
        lb_tot[0] = a;
        lb_tot[1] = b;
      }
    }
    __syncthreads();
    s1 = lb_tot[0];
    s2 = lb_tot[1];
    __syncthreads();  // lb_w1, lb_w2, lb_tot are rewritten for the next row
    const float term1 = __fmul_rn(inv_h, r);
    for (i64 e0 = 4 * (i64)tid; e0 < cols; e0 += LB_DX_SPAN) {
      const int n = cols - e0 < 4 ? (int)(cols - e0) : 4;
      float gv[4], hv[4], wv[4], o[4];
      lb_ld4(gr + e0, vec, n, gv);
      lb_ld4(hr + e0, vec, n, hv);
      lb_ld4(w + e0, vec, n, wv);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float A = __fmul_rn(fH, wv[i]);
        const float Bv = __fmul_rn(__fsub_rn(hv[i], m), r);
        const float f1 = fmaf(A, gv[i], -__fmul_rn(Bv, s2));
        o[i] = __fmul_rn(__fsub_rn(f1, s1), term1);
      }
      lb_st4(dr + e0, vec, n, o);
    }
  }
}

// ---- dw, db: VC * blockDim.x columns per block tile, bdy(rows) row chains per column ------------
// The order per column is eager's (above). Free, and chosen for speed (the bits depend on none of
// it): which thread runs which chain, how many columns a thread carries, when loads are issued.
// Like eager's GammaBetaBackwardCUDAKernelTemplate (blockReduceGammaBetaBackwardsHelper), a
// thread loads whole groups of its chain's rows before adding them, and one lane per row loads
// that row's mean and rstd for the lanes of its chain, which take them by shuffle; unlike it, a
// thread loads U groups of 8 rows at once (LGU below: 2, i.e. 16 rows of dy and x in flight, where
// a load is one 16-bit element) and may carry two
// adjacent columns with one 2 * sizeof(T)-byte load a row (VC = 2: cols even, dy and x so
// aligned); the tile's width is VC * blockDim.x (blockDim.x = 8, 16 or 32), so a narrow tile puts
// few columns on many multiprocessors. The block's rows are walked in rounds of U tiles, the same
// for every thread (shuffles need the whole warp): full rounds without checks, then the rest one
// tile at a time whose rows past `rows` are skipped.
__shared__ float lb_cw[32][65], lb_cb[32][65];  // [chain y][column of the tile]

LB_DEV int lb_bdy(i64 rows) { return rows < 64 ? 1 : rows < 128 ? 8 : rows < 256 ? 16 : 32; }

// VC adjacent elements of T: one load (raw), then f32 values
template <typename T, int VC> struct LG;
template <> struct LG<float, 1> {
  typedef float raw;
  static LB_DEV raw ld(const float* p) { return *p; }
  static LB_DEV raw zero() { return 0.f; }
  static LB_DEV float get(raw v, int) { return v; }
};
template <> struct LG<float, 2> {
  typedef uint2 raw;
  static LB_DEV raw ld(const float* p) { return *reinterpret_cast<const uint2*>(p); }
  static LB_DEV raw zero() { return make_uint2(0u, 0u); }
  static LB_DEV float get(raw v, int j) { return __uint_as_float(j ? v.y : v.x); }
};
template <> struct LG<__nv_bfloat16, 1> {
  typedef unsigned short raw;
  static LB_DEV raw ld(const __nv_bfloat16* p) { return *reinterpret_cast<const unsigned short*>(p); }
  static LB_DEV raw zero() { return 0; }
  static LB_DEV float get(raw v, int) { return __uint_as_float((unsigned)v << 16); }
};
template <> struct LG<__nv_bfloat16, 2> {  // element c in the low half, c + 1 in the high half
  typedef unsigned raw;
  static LB_DEV raw ld(const __nv_bfloat16* p) { return *reinterpret_cast<const unsigned*>(p); }
  static LB_DEV raw zero() { return 0u; }
  static LB_DEV float get(raw v, int j) { return __uint_as_float(j ? v & 0xffff0000u : v << 16); }
};
template <> struct LG<__half, 1> {
  typedef unsigned short raw;
  static LB_DEV raw ld(const __half* p) { return *reinterpret_cast<const unsigned short*>(p); }
  static LB_DEV raw zero() { return 0; }
  static LB_DEV float get(raw v, int) { return __half2float(__ushort_as_half(v)); }
};
template <> struct LG<__half, 2> {
  typedef unsigned raw;
  static LB_DEV raw ld(const __half* p) { return *reinterpret_cast<const unsigned*>(p); }
  static LB_DEV raw zero() { return 0u; }
  static LB_DEV float get(raw v, int j) {
    return __half2float(__ushort_as_half((unsigned short)(j ? v >> 16 : v & 0xffffu)));
  }
};

// groups of 8 rows a thread loads before adding them: 2 with one 16-bit element a load (16 rows of
// dy and x in flight), else 1 (8 rows of 4- or 8-byte loads); more was not faster on an H200
template <typename T, int VC> struct LGU { static constexpr int U = VC * sizeof(T) >= 4 ? 1 : 2; };
#define LB_GB_UNROLL (LGU<T, VC>::U)

// one row's terms into a chain: dw's fma(fl(g * fl(h - m)), r, aw), db's fl(ab + g)
LB_DEV void lb_gb_add(float g, float h, float m, float r, float& aw, float& ab) {
  aw = fmaf(__fmul_rn(g, __fsub_rn(h, m)), r, aw);
  ab = __fadd_rn(ab, g);
}

// One round: tiles k0 / R .. + U - 1 of the thread's chain (rows k0 + u*R + y8 + i, u < U, i < 8),
// loads first, then the adds in the chain's order. gp, hp: dy, x at row k0 + y8, the thread's
// columns. live: the thread has a chain (y < bdy) and columns (< cols); chain: y < bdy. GUARD:
// rows past `rows` are neither loaded nor added.
template <typename T, int VC, int U, bool GUARD>
LB_DEV void lb_gb_round(const T* __restrict__ gp, const T* __restrict__ hp, const float* __restrict__ mean,
                        const float* __restrict__ rstd, i64 k0, i64 y8, i64 R, i64 RC, i64 rows, i64 cols,
                        bool live, bool chain, int lane, float (&aw)[VC], float (&ab)[VC]) {
  typedef LG<T, VC> G;
  typename G::raw g[U][8], h[U][8];
  float ms[U], rs[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const i64 r0 = k0 + u * R + y8;  // the group's first row
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool ok = live && (!GUARD || r0 + i < rows);
      g[u][i] = ok ? G::ld(gp + u * RC + i * cols) : G::zero();
      h[u][i] = ok ? G::ld(hp + u * RC + i * cols) : G::zero();
    }
    // lane l holds the statistics of its group's row l % 8 (eager's warp_mean, warp_rstd)
    const i64 sr = r0 + (lane & 7);
    const bool sok = chain && (!GUARD || sr < rows);
    ms[u] = sok ? mean[sr] : 0.f;
    rs[u] = sok ? rstd[sr] : 0.f;
  }
  const int src = lane & ~7;  // lanes src .. src + 7 run the same chain (blockDim.x >= 8)
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float m = __shfl_sync(0xffffffffu, ms[u], src | i);
      const float r = __shfl_sync(0xffffffffu, rs[u], src | i);
      if (!GUARD || k0 + u * R + y8 + i < rows) {
#pragma unroll
        for (int j = 0; j < VC; ++j) lb_gb_add(G::get(g[u][i], j), G::get(h[u][i], j), m, r, aw[j], ab[j]);
      }
    }
  }
}

template <typename T, int VC>
LB_DEV void lb_dwdb_vc(T* __restrict__ dw, T* __restrict__ db, const T* __restrict__ dy,
                       const T* __restrict__ x, const float* __restrict__ mean,
                       const float* __restrict__ rstd, i64 rows, i64 cols) {
  constexpr int U = LB_GB_UNROLL;
  const int bdy = lb_bdy(rows);
  const int bx = (int)blockDim.x, tx = (int)threadIdx.x, ty = (int)threadIdx.y;
  const int lane = (tx + bx * ty) & 31;
  const bool chain = ty < bdy;
  const i64 R = 8 * (i64)bdy;  // rows per tile: chain y takes rows R*k + 8*y + i, i = 0..7
  const i64 RC = R * cols;     // elements from one of a chain's groups to its next
  const i64 y8 = 8 * (i64)ty;
  const i64 TW = (i64)VC * bx;  // the tile's columns
  for (i64 c0 = TW * blockIdx.x; c0 < cols; c0 += TW * gridDim.x) {
    const i64 c = c0 + VC * tx;  // the thread's first column (VC = 2: cols even, so c + 1 < cols too)
    const bool live = chain && c < cols;
    float aw[VC], ab[VC];
#pragma unroll
    for (int j = 0; j < VC; ++j) aw[j] = ab[j] = 0.f;
    const T* gp = dy + y8 * cols + c;  // pointers only: dereferenced where live and the row < rows
    const T* hp = x + y8 * cols + c;
    i64 k0 = 0;
    for (; k0 + U * R <= rows; k0 += U * R, gp += U * RC, hp += U * RC)
      lb_gb_round<T, VC, U, false>(gp, hp, mean, rstd, k0, y8, R, RC, rows, cols, live, chain, lane, aw, ab);
    for (; k0 < rows; k0 += R, gp += RC, hp += RC)  // the last tiles one at a time (fewer registers)
      lb_gb_round<T, VC, 1, true>(gp, hp, mean, rstd, k0, y8, R, RC, rows, cols, live, chain, lane, aw, ab);
#pragma unroll
    for (int j = 0; j < VC; ++j) {
      lb_cw[ty][VC * tx + j] = aw[j];
      lb_cb[ty][VC * tx + j] = ab[j];
    }
    // the halving tree over the chains: v[y] += v[y + off], off = bdy/2 .. 1 (eager's way, a warp
    // a column and a butterfly over its lanes, was slower here on an H200)
    for (int off = bdy / 2; off > 0; off >>= 1) {
      __syncthreads();
      if (ty < off) {
#pragma unroll
        for (int j = 0; j < VC; ++j) {
          const int cx = VC * tx + j;
          lb_cw[ty][cx] = __fadd_rn(lb_cw[ty][cx], lb_cw[ty + off][cx]);
          lb_cb[ty][cx] = __fadd_rn(lb_cb[ty][cx], lb_cb[ty + off][cx]);
        }
      }
    }
    __syncthreads();
    if (ty == 0 && c < cols) {
#pragma unroll
      for (int j = 0; j < VC; ++j) {
        LT<T>::st(dw + c + j, lb_cw[0][VC * tx + j]);
        LT<T>::st(db + c + j, lb_cb[0][VC * tx + j]);
      }
    }
    __syncthreads();  // the next tile rewrites lb_cw, lb_cb
  }
}

// rows < 64 (bdy = 1: one chain a column, every row in order) with blockDim.y > 1: the block's
// threads load the tile's rows (at most 63) into shared memory together, all in flight at once,
// then thread y = 0 of each column adds them from there in order: one trip to memory, where one
// thread a column walking the rows itself (blockDim.y = 1, eager's (32, 1) block) makes several.
// The tile is blockDim.x columns (VC = 1).
__shared__ float lb_st[2][64];  // the rows' mean, rstd
template <typename T>
LB_DEV void lb_dwdb_staged(T* __restrict__ dw, T* __restrict__ db, const T* __restrict__ dy,
                           const T* __restrict__ x, const float* __restrict__ mean,
                           const float* __restrict__ rstd, int rows, i64 cols) {
  float* const sg = &lb_cw[0][0];  // [row][column of the tile] as row * 32 + column: 64 * 32 <= 32 * 65
  float* const sh = &lb_cb[0][0];
  const int bx = (int)blockDim.x, by = (int)blockDim.y, tx = (int)threadIdx.x, ty = (int)threadIdx.y;
  for (i64 c0 = (i64)bx * blockIdx.x; c0 < cols; c0 += (i64)bx * gridDim.x) {
    const i64 c = c0 + tx;
    // rows ty + by*i: 8 loads of each in flight a thread (every row when by >= 8)
    for (int r0 = ty; r0 < rows; r0 += 8 * by) {
      float g[8], h[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int row = r0 + by * i;
        const bool ok = row < rows && c < cols;
        g[i] = ok ? LT<T>::ld(dy + row * cols + c) : 0.f;
        h[i] = ok ? LT<T>::ld(x + row * cols + c) : 0.f;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int row = r0 + by * i;
        if (row < rows) {
          sg[row * 32 + tx] = g[i];
          sh[row * 32 + tx] = h[i];
        }
      }
    }
    for (int e = tx + bx * ty; e < rows; e += bx * by) {
      lb_st[0][e] = mean[e];
      lb_st[1][e] = rstd[e];
    }
    __syncthreads();
    if (ty == 0 && c < cols) {
      float aw = 0.f, ab = 0.f;
#pragma unroll 8
      for (int row = 0; row < rows; ++row)
        lb_gb_add(sg[row * 32 + tx], sh[row * 32 + tx], lb_st[0][row], lb_st[1][row], aw, ab);
      LT<T>::st(dw + c, aw);
      LT<T>::st(db + c, ab);
    }
    __syncthreads();  // the next tile rewrites the staged rows
  }
}

// VC = 2 where cols is even and at least LB_GB_VC2_COLS, and dy, x are 2 * sizeof(T)-aligned
// (narrower rows did better with one column a thread on an H200: more threads a column tile)
// (kernel_registry::backward::DWDB_TWO_COLUMNS_FROM: the launch rule's figure)
#define LB_GB_VC2_COLS 4096
template <typename T>
LB_DEV void lb_dwdb(T* __restrict__ dw, T* __restrict__ db, const T* __restrict__ dy,
                    const T* __restrict__ x, const float* __restrict__ mean,
                    const float* __restrict__ rstd, i64 rows, i64 cols) {
  // eager's two-pass variant (rows > 65536 with few columns; SM-dependent) is not implemented
  if (rows > 65536) __trap();
  const int bx = (int)blockDim.x, by = (int)blockDim.y;
  if ((bx != 8 && bx != 16 && bx != 32) || by < lb_bdy(rows) || by > 32 || (bx * by) % 32 != 0 ||
      blockDim.z != 1)
    __trap();
  if (lb_bdy(rows) == 1 && by > 1) {
    lb_dwdb_staged<T>(dw, db, dy, x, mean, rstd, (int)rows, cols);
    return;
  }
  const int A2 = 2 * (int)sizeof(T);
  if (cols % 2 == 0 && cols >= LB_GB_VC2_COLS && lb_al(dy, A2) && lb_al(x, A2))
    lb_dwdb_vc<T, 2>(dw, db, dy, x, mean, rstd, rows, cols);
  else
    lb_dwdb_vc<T, 1>(dw, db, dy, x, mean, rstd, rows, cols);
}

#define LB_ENTRIES(NAME, T)                                                                              \
  extern "C" __global__ void __launch_bounds__(LB_DX_THREADS) ln_bwd_dx_##NAME(                          \
      T* dx, const T* dy, const T* x, const float* mean, const float* rstd, const T* w, i64 rows,        \
      i64 cols) {                                                                                        \
    lb_dx<T>(dx, dy, x, mean, rstd, w, rows, cols);                                                      \
  }                                                                                                      \
  extern "C" __global__ void __launch_bounds__(1024) ln_bwd_dwdb_##NAME(                                 \
      T* dw, T* db, const T* dy, const T* x, const float* mean, const float* rstd, i64 rows, i64 cols) { \
    lb_dwdb<T>(dw, db, dy, x, mean, rstd, rows, cols);                                                   \
  }

// One dtype's entries alone where the module is compiled for it (-DKERNELIZE_DTYPE_<DT>, as the
// verifier and the client compile a module per dtype; docs/manifest.md), every dtype's otherwise.
#if !defined(KERNELIZE_DTYPE_F16) && !defined(KERNELIZE_DTYPE_F32)
LB_ENTRIES(bf16, __nv_bfloat16)
#endif
#if !defined(KERNELIZE_DTYPE_BF16) && !defined(KERNELIZE_DTYPE_F32)
LB_ENTRIES(f16, __half)
#endif
#if !defined(KERNELIZE_DTYPE_BF16) && !defined(KERNELIZE_DTYPE_F16)
LB_ENTRIES(f32, float)
#endif

// The entries LB_ENTRIES makes, spelled out (kernel.toml names them; a bundle's check finds each
// symbol's text in the source):
//   ln_bwd_dx_bf16 ln_bwd_dwdb_bf16 ln_bwd_dx_f16 ln_bwd_dwdb_f16 ln_bwd_dx_f32 ln_bwd_dwdb_f32
