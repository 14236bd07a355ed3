// ---- kernelize: nn.LayerNorm backward, eager autograd's bits (issue 30, work in progress) -------
// Self-contained: NVRTC with cuda_bf16.h / cuda_fp16.h (and the CPU harness of
// python/tests/cuda_on_cpu). NOT a bundled kernel (no kernel.toml, nothing loads it):
// docs/backward-layer-norm.md, "The kernel (work in progress)".
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
// bf16 and f16 dx, dw, db and f32 dw, db in every case; its f32 dx then fused s1's add, which
// eager's SASS does not (s1 unfused since, not yet run on a GPU).
// colsum (eager's GammaBeta template kernel; M = rows): bdy = 1 (M < 64), 8 (M < 128),
// 16 (M < 256), else 32; with bdy = 1 one chain sums every row in order; else chain y sums rows
// R*k + 8*y + i (R = 8*bdy; k = 0, 1, ..; i = 0..7) in order, then the halving tree over the
// chains, v[y] += v[y + off] for off = bdy/2 .. 1.
//
// ABI (contiguous row-major [rows, cols] tensors; mean, rstd f32 [rows]):
//   ln_bwd_dx_<dt>(T* dx, const T* dy, const T* x, const float* mean, const float* rstd,
//                  const T* w, long long rows, long long cols)
//       block 128 threads (traps otherwise); any grid >= 1: the blocks loop over the rows
//       (row = blockIdx.x, + gridDim.x, ...), so every grid gives the same bits (grid = rows:
//       one row per block, as eager launches it).
//   ln_bwd_dwdb_<dt>(T* dw, T* db, const T* dy, const T* x, const float* mean,
//                    const float* rstd, long long rows, long long cols)
//       block (32, Y) with bdy(rows) <= Y <= 32 (traps otherwise): (32, 32) always works,
//       threads y >= bdy(rows) idle; any grid >= 1: the blocks loop over 32-column tiles
//       (grid ceil(cols / 32): one tile per block, as eager launches it).
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

// ---- dw, db: 32 columns per block tile, bdy(rows) row chains per column --------------------------
__shared__ float lb_cw[32][33], lb_cb[32][33];  // [chain y][column x]

LB_DEV int lb_bdy(i64 rows) { return rows < 64 ? 1 : rows < 128 ? 8 : rows < 256 ? 16 : 32; }

template <typename T>
LB_DEV void lb_dwdb(T* __restrict__ dw, T* __restrict__ db, const T* __restrict__ dy,
                    const T* __restrict__ x, const float* __restrict__ mean,
                    const float* __restrict__ rstd, i64 rows, i64 cols) {
  // eager's two-pass variant (rows > 65536 with few columns; SM-dependent) is not implemented
  if (rows > 65536) __trap();
  const int bdy = lb_bdy(rows);
  if (blockDim.x != 32 || (int)blockDim.y < bdy || blockDim.y > 32 || blockDim.z != 1) __trap();
  const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
  const i64 R = 8 * (i64)bdy;  // rows per tile (bdy > 1)
  for (i64 c0 = 32 * (i64)blockIdx.x; c0 < cols; c0 += 32 * (i64)gridDim.x) {
    const i64 c = c0 + tx;
    float aw = 0.f, ab = 0.f;
    if (ty < bdy && c < cols) {
      if (bdy == 1) {  // M < 64: one chain, every row in order
        for (i64 row = 0; row < rows; ++row) {
          const float g = LT<T>::ld(dy + row * cols + c);
          const float q = __fmul_rn(g, __fsub_rn(LT<T>::ld(x + row * cols + c), mean[row]));
          aw = fmaf(q, rstd[row], aw);
          ab = __fadd_rn(ab, g);
        }
      } else {  // chain ty: rows R*k + 8*ty + i, i = 0..7 (rows past M add nothing)
        for (i64 k0 = 0; k0 < rows; k0 += R) {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const i64 row = k0 + 8 * ty + i;
            if (row < rows) {
              const float g = LT<T>::ld(dy + row * cols + c);
              const float q = __fmul_rn(g, __fsub_rn(LT<T>::ld(x + row * cols + c), mean[row]));
              aw = fmaf(q, rstd[row], aw);
              ab = __fadd_rn(ab, g);
            }
          }
        }
      }
    }
    lb_cw[ty][tx] = aw;
    lb_cb[ty][tx] = ab;
    // the halving tree over the chains: v[y] += v[y + off], off = bdy/2 .. 1
    for (int off = bdy / 2; off > 0; off >>= 1) {
      __syncthreads();
      if (ty < off) {
        lb_cw[ty][tx] = __fadd_rn(lb_cw[ty][tx], lb_cw[ty + off][tx]);
        lb_cb[ty][tx] = __fadd_rn(lb_cb[ty][tx], lb_cb[ty + off][tx]);
      }
    }
    __syncthreads();
    if (ty == 0 && c < cols) {
      LT<T>::st(dw + c, lb_cw[0][tx]);
      LT<T>::st(db + c, lb_cb[0][tx]);
    }
    __syncthreads();  // the next tile rewrites lb_cw, lb_cb
  }
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

LB_ENTRIES(bf16, __nv_bfloat16)
LB_ENTRIES(f16, __half)
LB_ENTRIES(f32, float)

// The entries LB_ENTRIES makes, spelled out:
//   ln_bwd_dx_bf16 ln_bwd_dwdb_bf16 ln_bwd_dx_f16 ln_bwd_dwdb_f16 ln_bwd_dx_f32 ln_bwd_dwdb_f32
