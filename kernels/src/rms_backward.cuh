// ---- kernelize: the RMSNorm backward engine (kernels/src/rms_backward.cuh) -----------------------
// Pasted by kernels/generate.py into rms_norm_llama_backward, rms_norm_gemma_backward and
// fused_add_rms_norm_backward (their own files in kernels/src/ say what differs: the elementwise
// steps kb_gn and kb_dwt, the residual's gradient, the entries). Self-contained with the kernel's
// part: NVRTC with cuda_bf16.h / cuda_fp16.h, and the CPU harness of python/tests/cuda_on_cpu.
//
// The orders (docs/backward.md): the row sums are Reduce.cuh's inner reduction of a fresh f32
// [rows, cols] tensor (the forward mean's order: bw x bh lanes, 4 accumulators a lane, 4-vectors
// above 128 columns with the head/tail of a row that starts off a 16-byte boundary, halving trees
// in each warp-row then across them); dw's column sum is its outer reduction of a fresh [rows,
// cols] tensor (row chains of 4 accumulators per (column, warp-row y, CTA k), a halving tree over
// y, then the CTAs' partials summed per y in order and a last halving tree), which depends on the
// device's SM count and threads per SM (passed in). No FMA contraction anywhere: every product
// and sum is an explicit __fmul_rn / __fadd_rn.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define KB_DEV __device__ __forceinline__
typedef long long i64;

// ---- values of T as f32, and rounding to T -------------------------------------------------------
template <typename T> struct BT;
template <> struct BT<float> {
  static KB_DEV float ld(const float* p) { return *p; }
  static KB_DEV void st(float* p, float v) { *p = v; }
  static KB_DEV float rnd(float v) { return v; }
};
template <> struct BT<__nv_bfloat16> {
  static KB_DEV float ld(const __nv_bfloat16* p) {
    return __uint_as_float((unsigned)*reinterpret_cast<const unsigned short*>(p) << 16);
  }
  static KB_DEV void st(__nv_bfloat16* p, float v) {
    *reinterpret_cast<unsigned short*>(p) = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
  static KB_DEV float rnd(float v) {
    return __uint_as_float((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(v)) << 16);
  }
};
template <> struct BT<__half> {
  static KB_DEV float ld(const __half* p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
  }
  static KB_DEV void st(__half* p, float v) {
    *reinterpret_cast<unsigned short*>(p) = __half_as_ushort(__float2half_rn(v));
  }
  static KB_DEV float rnd(float v) { return __half2float(__float2half_rn(v)); }
};

// one 4-vector of T as it sits in memory (8 bytes of bf16/f16, 16 of f32), and its values as f32
template <typename T> struct KbRaw { typedef uint2 type; };
template <> struct KbRaw<float> { typedef uint4 type; };
template <typename T> KB_DEV typename KbRaw<T>::type kb_ldraw(const T* p) {
  return *reinterpret_cast<const typename KbRaw<T>::type*>(p);
}
template <typename T> KB_DEV void kb_cvt4(const typename KbRaw<T>::type& q, float (&v)[4]) {
  if constexpr (sizeof(T) == 4) {
    v[0] = __uint_as_float(q.x); v[1] = __uint_as_float(q.y); v[2] = __uint_as_float(q.z); v[3] = __uint_as_float(q.w);
  } else {
    T e[4];
    *reinterpret_cast<uint2*>(e) = q;
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = BT<T>::ld(e + i);
  }
}

// four consecutive elements p[0..3] as f32; al: p is aligned for one 4-element access
template <typename T> KB_DEV void ld4(const T* p, bool al, float (&v)[4]) {
  if (al) {
    kb_cvt4<T>(kb_ldraw(p), v);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = BT<T>::ld(p + i);
  }
}
template <typename T> KB_DEV void st4(T* p, bool al, const float (&v)[4]) {
  if (al) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<uint4*>(p) = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]),
                                                __float_as_uint(v[2]), __float_as_uint(v[3]));
    } else {
      T e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) BT<T>::st(e + i, v[i]);
      *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(e);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) BT<T>::st(p + i, v[i]);
  }
}
KB_DEV bool kb_al(const void* p, int bytes) { return (reinterpret_cast<size_t>(p) & (size_t)(bytes - 1)) == 0; }

// ---- what a kernel of the family defines (after this file; docs/backward.md) ---------------------
// kb_gn: the gradient of the normalized value from dy and w (the row sum's and dx's factor);
// kb_dwt: one summand of dw's column sum from dy, h = f32(x) and the row's r.
template <typename T> KB_DEV float kb_gn(float dy, float w);
template <typename T> KB_DEV float kb_dwt(float dy, float h, float r);

// dx's element from its two f32 paths gh1 = gn * r, gh2 = gp * 2h: eager's cast node sums them and
// rounds to T; with the residual's gradient (fused_add_rms_norm) autograd adds that in too, in f32
// as the input buffer's third term, in bf16/f16 to the cast's rounded sum (docs/backward-fused-add.md)
template <typename T, bool RESID> KB_DEV float kb_dxv(float gh1, float gh2, float dres) {
  if constexpr (!RESID) return __fadd_rn(gh1, gh2);
  else if constexpr (sizeof(T) == 4) return __fadd_rn(__fadd_rn(dres, gh1), gh2);
  else return __fadd_rn(BT<T>::rnd(__fadd_rn(gh1, gh2)), dres);
}

// BEGIN kb_configs (plain C++: python/tests/test_backward_order_on_cpu.py compiles it on the CPU)
KB_DEV i64 kb_last_pow2(i64 n) {  // Reduce.cuh's last_pow2: the largest power of two <= n, >= 1
  i64 p = 1;
  while (2 * p <= n) p *= 2;
  return p;
}
KB_DEV i64 kb_cdiv(i64 a, i64 b) { return (a + b - 1) / b; }
KB_DEV i64 kb_min(i64 a, i64 b) { return a < b ? a : b; }
KB_DEV i64 kb_max(i64 a, i64 b) { return a > b ? a : b; }

// The row sum: setReduceConfig<float, float, vt0 = 4, input_vec_size = 4> of a contiguous f32
// [rows, cols] reduced over its last dim (the forward mean's and the backward's sum_to [rows, 1]).
struct KbRowCfg { int bw, bh, lanes; bool vec, split; };
KB_DEV KbRowCfg kb_row_cfg(i64 rows, i64 cols) {
  KbRowCfg c;
  c.vec = cols > 128;
  const i64 d0 = c.vec ? cols / 4 : cols;
  const i64 p0 = d0 < 512 ? kb_last_pow2(d0) : 512;
  const i64 p1 = rows < 512 ? kb_last_pow2(rows) : 512;
  i64 bw = kb_min(p0, 32);
  const i64 bh = kb_min(p1, 512 / bw);
  bw = kb_min(p0, 512 / bh);
  c.bw = (int)bw;
  c.bh = (int)bh;
  c.split = kb_cdiv(cols, bw) >= kb_min(16 * bh, 256);
  c.lanes = c.split ? c.bw * c.bh : c.bw;
  return c;
}

// The column sum: setReduceConfig for sum(dim=0) of a fresh contiguous [rows, cols] (outer
// reduction): block.x over outputs (vectorized along the output, output_vec_size 4/2/1 by
// cols % 4, max threads 512 / output_vec_size), block.y over rows when split, ctas over rows
// when the values per thread reach 256 (global reduce). y_lanes: the warp-rows that share a
// column (bh when split, else 1); step: the row stride of one thread's chain (step_input).
struct KbColCfg { int bw, bh, y_lanes, ctas; i64 step; bool split; };
KB_DEV KbColCfg kb_col_cfg(i64 rows, i64 cols, i64 sms, i64 threads_per_sm) {
  KbColCfg c;
  const i64 ovs = cols % 4 == 0 ? 4 : cols % 2 == 0 ? 2 : 1;
  const i64 max_t = 512 / ovs;
  const i64 dim0 = cols / ovs;
  const i64 d0 = dim0 < max_t ? kb_last_pow2(dim0) : max_t;
  const i64 d1 = rows < max_t ? kb_last_pow2(rows) : max_t;
  i64 bw = kb_min(d0, 32);
  const i64 bh = kb_min(d1, max_t / bw);
  bw = kb_min(d0, max_t / bh);
  c.bw = (int)bw;
  c.bh = (int)bh;
  i64 step_in = 1, step_out = bw;
  c.split = rows >= kb_min(bh * 16, 256);
  if (c.split) step_in *= bh; else step_out *= bh;
  const i64 target = sms * (threads_per_sm / (bw * bh));
  const i64 grid_x = kb_cdiv(dim0, step_out);
  const i64 vpt = kb_cdiv(rows, step_in);
  i64 ctas = 1;
  if (c.split && vpt >= 256 && grid_x <= target) {
    ctas = kb_max(kb_min(kb_cdiv(target, grid_x), kb_cdiv(vpt, 16)), kb_cdiv(vpt, 256));
    if (ctas > 1) step_in *= ctas;
  }
  c.ctas = (int)ctas;
  c.step = step_in;
  c.y_lanes = c.split ? c.bh : 1;
  return c;
}
// END kb_configs

// ---- dx: one row per group of G = max(lanes, 32) threads of a 512-thread block ------------------
#define KB_DX_THREADS 512
// 4-vectors of x and dy a thread keeps in registers from the first pass to the second (rows whose
// 4-vectors number at most KB_DX_NV x lanes: up to 8192 columns at 512 lanes); longer rows are
// read again, mostly from L2
#ifndef KB_DX_NV
#define KB_DX_NV 4
#endif
__shared__ float kb_ra[KB_DX_THREADS];  // sums of squares (warp-rows of more than 32 lanes)
__shared__ float kb_rb[KB_DX_THREADS];  // sums of gn * h
__shared__ float kb_ya[2][KB_DX_THREADS / 32];  // the warp-rows' sums of a split row, by pass parity
__shared__ float kb_yb[2][KB_DX_THREADS / 32];

// The halving tree over groups of n lanes of a warp (n <= 32, a power of two): lane l with
// l % n < off adds lane l + off's value, off = n/2 .. 1; the group's sum ends in its first lane.
// The same pairs in the same order as the tree in shared memory, so the same bits.
KB_DEV float kb_warp_tree(float v, int n) {
  for (int off = n / 2; off > 0; off /= 2) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, off));
  return v;
}

// RESID: dres (the residual's incoming gradient, as dy) is added into dx (fused_add_rms_norm).
// CACHED: the row stays in registers between the passes (kb_dx says when); a path of its own, so
// that the other rows' code keeps those registers
template <typename T, bool RESID, bool CACHED>
KB_DEV void kb_dx_rows(T* __restrict__ dx, float* __restrict__ ws, const T* __restrict__ dy,
                       const T* __restrict__ dres, const T* __restrict__ x, const T* __restrict__ w, i64 rows,
                       i64 cols, float eps) {
  const KbRowCfg c = kb_row_cfg(rows, cols);
  const int L = c.lanes;
  const int G = L < 32 ? 32 : L;
  const int rpb = KB_DX_THREADS / G;     // rows per block pass
  const int tid = (int)threadIdx.x;
  const int grp = tid / G, t = tid % G;
  const int base = grp * G;
  const float fac = __fdiv_rn((float)rows, (float)(rows * cols));  // MeanOps' factor
  const float inv_n = (float)(1.0 / (double)cols);                   // MeanBackward's 1 / N
  const int A = 4 * (int)sizeof(T);
  const bool wal = kb_al(w, A);
  int par = 0;
  for (i64 r0 = (i64)blockIdx.x * rpb; r0 < rows; r0 += (i64)gridDim.x * rpb, par ^= 1) {
    const i64 row = r0 + grp;
    const bool live = row < rows && t < L;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;  // sum of squares (the forward's)
    float b0 = 0.f, b1 = 0.f, b2 = 0.f, b3 = 0.f;  // sum of gn * h (the backward's)
    typename KbRaw<T>::type xq[KB_DX_NV], gq[KB_DX_NV];
    if (live) {
      const T* xr = x + row * cols;
      const T* gr = dy + row * cols;
      if constexpr (CACHED) {  // every load first, then eager's chains
        const int nvec = (int)(cols / 4);
#pragma unroll
        for (int j = 0; j < KB_DX_NV; ++j) {
          const int k = t + j * L;
          if (k < nvec) {
            xq[j] = kb_ldraw(xr + 4 * k);
            gq[j] = kb_ldraw(gr + 4 * k);
          }
        }
#pragma unroll
        for (int j = 0; j < KB_DX_NV; ++j) {
          const int k = t + j * L;
          if (k < nvec) {
            float hv[4], gv[4], wv[4];
            kb_cvt4<T>(xq[j], hv);
            kb_cvt4<T>(gq[j], gv);
            ld4(w + 4 * k, true, wv);
            a0 = __fadd_rn(a0, __fmul_rn(hv[0], hv[0])); a1 = __fadd_rn(a1, __fmul_rn(hv[1], hv[1]));
            a2 = __fadd_rn(a2, __fmul_rn(hv[2], hv[2])); a3 = __fadd_rn(a3, __fmul_rn(hv[3], hv[3]));
            b0 = __fadd_rn(b0, __fmul_rn(kb_gn<T>(gv[0], wv[0]), hv[0]));
            b1 = __fadd_rn(b1, __fmul_rn(kb_gn<T>(gv[1], wv[1]), hv[1]));
            b2 = __fadd_rn(b2, __fmul_rn(kb_gn<T>(gv[2], wv[2]), hv[2]));
            b3 = __fadd_rn(b3, __fmul_rn(kb_gn<T>(gv[3], wv[3]), hv[3]));
          }
        }
      } else if (c.vec) {
        const int sh = (int)((row * cols) % 4);  // the f32 row start's misalignment (floats)
        const int nh = (4 - sh) % 4;
        if (nh > 0 && t >= sh && t < 4) {        // head: lane sh + e takes element e
          const int e = t - sh;
          const float h = BT<T>::ld(xr + e);
          const float gn = kb_gn<T>(BT<T>::ld(gr + e), BT<T>::ld(w + e));
          a0 = __fmul_rn(h, h);
          b0 = __fmul_rn(gn, h);
        }
        const i64 M = cols - nh, nvec = M / 4;
        const bool al = kb_al(xr + nh, A) && kb_al(gr + nh, A);
        const bool wa = wal && nh == 0;
#pragma unroll 4
        for (i64 k = t; k < nvec; k += L) {
          const i64 e = nh + 4 * k;
          float hv[4], gv[4], wv[4];
          ld4(xr + e, al, hv);
          ld4(gr + e, al, gv);
          ld4(w + e, wa, wv);
          float q[4], p[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            q[i] = __fmul_rn(hv[i], hv[i]);
            p[i] = __fmul_rn(kb_gn<T>(gv[i], wv[i]), hv[i]);
          }
          a0 = __fadd_rn(a0, q[0]); a1 = __fadd_rn(a1, q[1]); a2 = __fadd_rn(a2, q[2]); a3 = __fadd_rn(a3, q[3]);
          b0 = __fadd_rn(b0, p[0]); b1 = __fadd_rn(b1, p[1]); b2 = __fadd_rn(b2, p[2]); b3 = __fadd_rn(b3, p[3]);
        }
        const int nt = (int)(M % 4);
        if (t < nt) {                            // tail: lane j takes element 4*nvec + j
          const i64 e = nh + 4 * nvec + t;
          const float h = BT<T>::ld(xr + e);
          const float gn = kb_gn<T>(BT<T>::ld(gr + e), BT<T>::ld(w + e));
          a0 = __fadd_rn(a0, __fmul_rn(h, h));
          b0 = __fadd_rn(b0, __fmul_rn(gn, h));
        }
      } else {                                   // single elements t + m*L, accumulator m % 4
        int m = 0;
        for (i64 e = t; e < cols; e += L, ++m) {
          const float h = BT<T>::ld(xr + e);
          const float gn = kb_gn<T>(BT<T>::ld(gr + e), BT<T>::ld(w + e));
          const float q = __fmul_rn(h, h), p = __fmul_rn(gn, h);
          switch (m & 3) {
            case 0: a0 = __fadd_rn(a0, q); b0 = __fadd_rn(b0, p); break;
            case 1: a1 = __fadd_rn(a1, q); b1 = __fadd_rn(b1, p); break;
            case 2: a2 = __fadd_rn(a2, q); b2 = __fadd_rn(b2, p); break;
            default: a3 = __fadd_rn(a3, q); b3 = __fadd_rn(b3, p); break;
          }
        }
      }
    }
    const float sa = __fadd_rn(__fadd_rn(__fadd_rn(a0, a1), a2), a3);
    const float sb = __fadd_rn(__fadd_rn(__fadd_rn(b0, b1), b2), b3);
    float tot_a, tot_b;
    if (c.bw > 32) {
      // warp-rows wider than a warp (rows < 16): the trees in shared memory
      kb_ra[tid] = sa;
      kb_rb[tid] = sb;
      // block_x_reduce in each warp-row (lanes x + bw*y): offsets bw/2 .. 1
      for (int off = c.bw / 2; off > 0; off /= 2) {
        __syncthreads();
        if (live && (t % c.bw) < off) {
          kb_ra[base + t] = __fadd_rn(kb_ra[base + t], kb_ra[base + t + off]);
          kb_rb[base + t] = __fadd_rn(kb_rb[base + t], kb_rb[base + t + off]);
        }
      }
      // block_y_reduce over the warp-rows' results when they share the row: offsets bh/2 .. 1
      if (c.split) {
        for (int off = c.bh / 2; off > 0; off /= 2) {
          __syncthreads();
          if (live && t % c.bw == 0 && t / c.bw < off) {
            kb_ra[base + t] = __fadd_rn(kb_ra[base + t], kb_ra[base + t + off * c.bw]);
            kb_rb[base + t] = __fadd_rn(kb_rb[base + t], kb_rb[base + t + off * c.bw]);
          }
        }
      }
      __syncthreads();
      tot_a = kb_ra[base];
      tot_b = kb_rb[base];
      __syncthreads();  // kb_ra / kb_rb are rewritten by the next pass
    } else {
      // block_x_reduce by shuffles: a warp-row is at most one warp
      const float va = kb_warp_tree(sa, c.bw), vb = kb_warp_tree(sb, c.bw);
      if (c.split) {
        // bw = 32 (a split row has warp-rows of at least 32 lanes): warp-row y is the group's
        // warp y, its sum in its lane 0; block_y_reduce by the group's first warp
        const int w0 = base / 32, nw = G / 32;
        if ((tid & 31) == 0) {
          kb_ya[par][tid / 32] = va;
          kb_yb[par][tid / 32] = vb;
        }
        __syncthreads();
        if (t < 32) {
          float ya = t < nw ? kb_ya[par][w0 + t] : 0.f;
          float yb = t < nw ? kb_yb[par][w0 + t] : 0.f;
          ya = kb_warp_tree(ya, nw);
          yb = kb_warp_tree(yb, nw);
          if (t == 0) {
            kb_ya[par][w0] = ya;
            kb_yb[par][w0] = yb;
          }
        }
        __syncthreads();  // the next pass writes the other parity's arrays
        tot_a = kb_ya[par][w0];
        tot_b = kb_yb[par][w0];
      } else {
        // the row's lanes are one warp (G = 32): no barrier, its warps run on their own
        tot_a = __shfl_sync(0xffffffffu, va, 0);
        tot_b = __shfl_sync(0xffffffffu, vb, 0);
      }
    }
    if (row < rows) {
      const float r = rsqrtf(__fadd_rn(__fmul_rn(tot_a, fac), eps));
      if (t == 0) ws[row] = r;
      const float ga = __fmul_rn(__fmul_rn(tot_b, -0.5f), __fmul_rn(__fmul_rn(r, r), r));
      const float gp = __fmul_rn(ga, inv_n);
      const T* xr = x + row * cols;
      const T* gr = dy + row * cols;
      T* dr = dx + row * cols;
      const T* rr = RESID ? dres + row * cols : nullptr;
      float rv[4] = {0.f, 0.f, 0.f, 0.f};
      if constexpr (CACHED) {
        const int nvec = (int)(cols / 4);
#pragma unroll
        for (int j = 0; j < KB_DX_NV; ++j) {
          const int k = t + j * L;
          if (t < L && k < nvec) {
            float hv[4], gv[4], wv[4], o[4];
            kb_cvt4<T>(xq[j], hv);
            kb_cvt4<T>(gq[j], gv);
            ld4(w + 4 * k, true, wv);
            if constexpr (RESID) ld4(rr + 4 * k, true, rv);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float gn = kb_gn<T>(gv[i], wv[i]);
              o[i] = kb_dxv<T, RESID>(__fmul_rn(gn, r), __fmul_rn(gp, __fmul_rn(hv[i], 2.0f)), rv[i]);
            }
            st4(dr + 4 * k, true, o);
          }
        }
      } else if (cols % 4 == 0) {
        const bool al = kb_al(xr, A) && kb_al(gr, A) && kb_al(dr, A) && (!RESID || kb_al(rr, A));
        // the row's last 4-vectors first: the ones the first pass read last, likeliest in L2
        const i64 nq = cols / 4;
        if (t < nq) {
#pragma unroll 4
          for (i64 qd = t + ((nq - 1 - t) / G) * G; qd >= 0; qd -= G) {
            const i64 e = 4 * qd;
            float hv[4], gv[4], wv[4], o[4];
            ld4(xr + e, al, hv);
            ld4(gr + e, al, gv);
            ld4(w + e, wal, wv);
            if constexpr (RESID) ld4(rr + e, al, rv);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float gn = kb_gn<T>(gv[i], wv[i]);
              o[i] = kb_dxv<T, RESID>(__fmul_rn(gn, r), __fmul_rn(gp, __fmul_rn(hv[i], 2.0f)), rv[i]);
            }
            st4(dr + e, al, o);
          }
        }
      } else {
        for (i64 e = t; e < cols; e += G) {
          const float h = BT<T>::ld(xr + e);
          const float gn = kb_gn<T>(BT<T>::ld(gr + e), BT<T>::ld(w + e));
          const float dv = RESID ? BT<T>::ld(rr + e) : 0.f;
          BT<T>::st(dr + e, kb_dxv<T, RESID>(__fmul_rn(gn, r), __fmul_rn(gp, __fmul_rn(h, 2.0f)), dv));
        }
      }
    }
  }
}

template <typename T, bool RESID>
KB_DEV void kb_dx(T* __restrict__ dx, float* __restrict__ ws, const T* __restrict__ dy, const T* __restrict__ dres,
                  const T* __restrict__ x, const T* __restrict__ w, i64 rows, i64 cols, float eps) {
  const KbRowCfg c = kb_row_cfg(rows, cols);
  const int A = 4 * (int)sizeof(T);
  // the row in registers (bf16 and f16: f32's 16-byte vectors would not fit beside the rest in
  // the 64 registers of two blocks per SM, and spilled them, measured slower): every row starts on
  // a 4-vector (no head), every access aligned, and a lane's 4-vectors fit (the vectors
  // k = t + L j of both passes are then the same: G = L)
  if constexpr (sizeof(T) == 2) {
    if (c.vec && cols % 4 == 0 && kb_al(w, A) && kb_al(x, A) && kb_al(dy, A) && kb_al(dx, A) &&
        (!RESID || kb_al(dres, A)) && cols / 4 <= (i64)KB_DX_NV * c.lanes) {
      kb_dx_rows<T, RESID, true>(dx, ws, dy, dres, x, w, rows, cols, eps);
      return;
    }
  }
  kb_dx_rows<T, RESID, false>(dx, ws, dy, dres, x, w, rows, cols, eps);
}

// ---- dw, partials: work item (column tile, CTA k); virtual threads (y, column group) ------------
#define KB_DW_THREADS 128
#define KB_DW_SMEM 2048
__shared__ float kb_part[KB_DW_SMEM];

// one row of a column chain: acc[i] += round_T(dy * round_T(h * r)) for VC columns from c0
template <typename T, int VC>
KB_DEV void kb_dw_row(float (&acc)[VC], const T* dy, const T* x, const float* rr, i64 row, i64 cols,
                      i64 c0, bool al) {
  const float r = rr[row];
  float hv[4], gv[4];
  if constexpr (VC == 4) {
    ld4(x + row * cols + c0, al, hv);
    ld4(dy + row * cols + c0, al, gv);
  } else {
    hv[0] = BT<T>::ld(x + row * cols + c0);
    gv[0] = BT<T>::ld(dy + row * cols + c0);
  }
#pragma unroll
  for (int i = 0; i < VC; ++i)
    acc[i] = __fadd_rn(acc[i], kb_dwt<T>(gv[i], hv[i], r));
}

template <typename T, int VC>
KB_DEV void kb_dwp(float* __restrict__ ws, const T* __restrict__ dy, const T* __restrict__ x,
                   i64 rows, i64 cols, i64 sms, i64 tps) {
  const KbColCfg c = kb_col_cfg(rows, cols, sms, tps);
  const int Y = c.y_lanes;
  const int CT = Y >= KB_DW_THREADS ? 1 : KB_DW_THREADS / Y;  // column groups of VC columns per tile
  const i64 CW = (i64)CT * VC;
  const i64 tiles = kb_cdiv(cols, CW);
  const float* rr = ws;
  float* part = ws + rows;
  const bool al = VC == 4 && kb_al(dy, 4 * (int)sizeof(T)) && kb_al(x, 4 * (int)sizeof(T));
  for (i64 item = blockIdx.x; item < tiles * c.ctas; item += gridDim.x) {
    const i64 tile = item % tiles;
    const int k = (int)(item / tiles);
    for (int v = (int)threadIdx.x; v < Y * CT; v += KB_DW_THREADS) {
      const int y = v / CT, ct = v % CT;
      const i64 c0 = tile * CW + (i64)ct * VC;
      float acc[4][VC];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < VC; ++i) acc[j][i] = 0.f;
      if (c0 < cols) {
        // the chain y + Y*k + step*m, the m-th row into accumulator m % 4 (thread_reduce_impl)
        i64 row = y + (i64)Y * k;
        for (; row + 3 * c.step < rows; row += 4 * c.step) {
#pragma unroll
          for (int j = 0; j < 4; ++j) kb_dw_row<T, VC>(acc[j], dy, x, rr, row + j * c.step, cols, c0, al);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (row < rows) kb_dw_row<T, VC>(acc[j], dy, x, rr, row, cols, c0, al);
          row += c.step;
        }
      }
#pragma unroll
      for (int i = 0; i < VC; ++i)
        kb_part[(y * CT + ct) * VC + i] =
            __fadd_rn(__fadd_rn(__fadd_rn(acc[0][i], acc[1][i]), acc[2][i]), acc[3][i]);
    }
    // block_y_reduce: offsets Y/2 .. 1 over the warp-rows, per column
    for (int off = Y / 2; off > 0; off /= 2) {
      __syncthreads();
      for (int v = (int)threadIdx.x; v < off * CT * VC; v += KB_DW_THREADS)
        kb_part[v] = __fadd_rn(kb_part[v], kb_part[v + off * CT * VC]);
    }
    __syncthreads();
    for (int v = (int)threadIdx.x; v < CT * VC; v += KB_DW_THREADS) {
      const i64 col = tile * CW + v;
      if (col < cols) part[(i64)k * cols + col] = kb_part[v];
    }
    __syncthreads();
  }
}

// ---- dw, final: global_reduce over the CTAs' partials, then round to T ---------------------------
// the halving tree over q[0, N): q[y] += q[y + N/2] for y < N/2, then over the first half
template <int N> KB_DEV void kb_halve(float* q) {
  if constexpr (N > 1) {
#pragma unroll
    for (int y = 0; y < N / 2; ++y) q[y] = __fadd_rn(q[y], q[y + N / 2]);
    kb_halve<N / 2>(q);
  }
}
// one column's global reduce with BH warp-rows: the partials of each y in order (y, y + BH, ...),
// the BH chains side by side (four rounds of loads in flight), then the tree over y; in registers
template <int BH> KB_DEV float kb_dw_sum(const float* part, i64 cols, i64 col, int ctas) {
  float q[BH];
#pragma unroll
  for (int y = 0; y < BH; ++y) q[y] = 0.f;  // ident
  int k0 = 0;
  for (; k0 + 4 * BH <= ctas; k0 += 4 * BH) {
    float v[4][BH];
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int y = 0; y < BH; ++y) v[m][y] = part[(i64)(k0 + m * BH + y) * cols + col];
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int y = 0; y < BH; ++y) q[y] = __fadd_rn(q[y], v[m][y]);
  }
  for (; k0 < ctas; k0 += BH) {
#pragma unroll
    for (int y = 0; y < BH; ++y)
      if (k0 + y < ctas) q[y] = __fadd_rn(q[y], part[(i64)(k0 + y) * cols + col]);
  }
  kb_halve<BH>(q);
  return q[0];
}

template <typename T>
KB_DEV void kb_dw(T* __restrict__ dw, const float* __restrict__ ws, i64 rows, i64 cols, i64 sms, i64 tps) {
  const KbColCfg c = kb_col_cfg(rows, cols, sms, tps);
  const float* part = ws + rows;
  const i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float v;
  if (c.ctas == 1) {
    v = part[col];
  } else if (c.bh <= 32) {
    switch (c.bh) {
      case 1: v = kb_dw_sum<1>(part, cols, col, c.ctas); break;
      case 2: v = kb_dw_sum<2>(part, cols, col, c.ctas); break;
      case 4: v = kb_dw_sum<4>(part, cols, col, c.ctas); break;
      case 8: v = kb_dw_sum<8>(part, cols, col, c.ctas); break;
      case 16: v = kb_dw_sum<16>(part, cols, col, c.ctas); break;
      default: v = kb_dw_sum<32>(part, cols, col, c.ctas); break;
    }
  } else {
    float q[512];
    const int bh = c.bh;
    for (int y = 0; y < bh; ++y) {
      float s = 0.f;  // ident, then the partials y, y + bh, ... in order
      for (int k = y; k < c.ctas; k += bh) s = __fadd_rn(s, part[(i64)k * cols + col]);
      q[y] = s;
    }
    for (int off = bh / 2; off > 0; off /= 2)
      for (int y = 0; y < off; ++y) q[y] = __fadd_rn(q[y], q[y + off]);
    v = q[0];
  }
  BT<T>::st(dw + col, v);
}

// Blocks per SM the compiler must fit (registers: 64 a thread at 2 x 512 and 8 x 128). Without
// the bound ptxas takes ~96-107 (dx) and ~80-105 (dwp) registers: one dx block of 512 threads per
// SM. scripts/backward_probe.py times both (-DKB_DX_MINB=1 -DKB_DWP_MINB=1 for the unbounded one).
#ifndef KB_DX_MINB
#define KB_DX_MINB 2
#endif
#ifndef KB_DWP_MINB
#define KB_DWP_MINB 8
#endif

// A kernel's three entries for one dtype (NAME: bf16, f16, f32; T its C type): <K>_bwd_dx_<NAME>,
// <K>_bwd_dwp_<NAME> and <K>_bwd_dw_<NAME> (docs/backward.md's ABI); RESID 1 where dx also takes
// the residual's gradient dres (fused_add_rms_norm_backward), 0 otherwise.
#define KB_DRES_PARAM_0(T)
#define KB_DRES_PARAM_1(T) const T* dres,
#define KB_DRES_ARG_0 nullptr
#define KB_DRES_ARG_1 dres
#define KB_ENTRIES(K, NAME, T, RESID)                                                                  \
  extern "C" __global__ void __launch_bounds__(KB_DX_THREADS, KB_DX_MINB) K##_bwd_dx_##NAME(           \
      T* dx, float* ws, const T* dy, KB_DRES_PARAM_##RESID(T) const T* x, const T* w, i64 rows,       \
      i64 cols, float eps) {                                                                           \
    kb_dx<T, RESID == 1>(dx, ws, dy, KB_DRES_ARG_##RESID, x, w, rows, cols, eps);                      \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(KB_DW_THREADS, KB_DWP_MINB) K##_bwd_dwp_##NAME(         \
      float* ws, const T* dy, const T* x, i64 rows, i64 cols, i64 sms, i64 tps) {                      \
    if (cols % 4 == 0) kb_dwp<T, 4>(ws, dy, x, rows, cols, sms, tps);                                  \
    else kb_dwp<T, 1>(ws, dy, x, rows, cols, sms, tps);                                                \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(KB_DW_THREADS) K##_bwd_dw_##NAME(                       \
      T* dw, const float* ws, i64 rows, i64 cols, i64 sms, i64 tps) {                                  \
    kb_dw<T>(dw, ws, rows, cols, sms, tps);                                                            \
  }
// Every dtype's entries, or only one dtype's where the module is compiled for it (the verifier and
// the client compile one module per dtype with -DKERNELIZE_DTYPE_<DT>; docs/manifest.md): NVRTC
// then compiles a third of the code.
#if !defined(KERNELIZE_DTYPE_F16) && !defined(KERNELIZE_DTYPE_F32)
#define KB_IF_BF16(x) x
#else
#define KB_IF_BF16(x)
#endif
#if !defined(KERNELIZE_DTYPE_BF16) && !defined(KERNELIZE_DTYPE_F32)
#define KB_IF_F16(x) x
#else
#define KB_IF_F16(x)
#endif
#if !defined(KERNELIZE_DTYPE_BF16) && !defined(KERNELIZE_DTYPE_F16)
#define KB_IF_F32(x) x
#else
#define KB_IF_F32(x)
#endif
#define KB_KERNEL(K, RESID)                                                                            \
  KB_IF_BF16(KB_ENTRIES(K, bf16, __nv_bfloat16, RESID))                                                \
  KB_IF_F16(KB_ENTRIES(K, f16, __half, RESID))                                                         \
  KB_IF_F32(KB_ENTRIES(K, f32, float, RESID))
