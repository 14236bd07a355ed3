// ---- kernelize: the residual add + HF LlamaRMSNorm backward, eager autograd's bits (issue 30) -----
// Self-contained: NVRTC with cuda_bf16.h / cuda_fp16.h (and the CPU harness of
// python/tests/cuda_on_cpu). op fused_add_rms_norm_backward (docs/spec.md section 2c;
// docs/backward-fused-add.md): the gradients of fused_add_rms_norm, whose forward is an HF
// decoder block's `h = residual + x; y = LlamaRMSNorm(h)` (outputs y and the updated residual h).
// kernels/rms_norm_llama_backward's kernel (the same row and column orders; docs/backward.md)
// with one more input, the gradient `dres` that reaches the residual output h from the layers
// after it, and its sum with the norm's input gradient as eager autograd's engine sums them:
//
//   x below is h (the forward's residual output, what the norm read); per element:
//   h = f32(x), r = rsqrtf(fl(sumsq * fac) + eps)       the forward's, in the forward's order
//   nc = round_T(h * r); dw = round_T(colsum(round_T(dy * nc)))
//   gn = round_T(dy * w); s = rowsum(gn * h)
//   ga = (s * -0.5) * ((r * r) * r); gp = ga * fl(1/N)
//   gh1 = gn * r; gh2 = gp * (2 * h)
//   bf16, f16:  dx = round_T(f32(round_T(gh1 + gh2)) + f32(dres))   h.to(f32)'s ToCopyBackward0
//               gives the norm's input gradient as one T tensor; the InputBuffer of h's node
//               adds the two T gradients (one add, so their order cannot matter)
//   f32:        dx = fl(fl(dres + gh1) + gh2)   no cast node: h's InputBuffer receives three f32
//               gradients in the engine's order, the residual path's first (the later layer's
//               AddBackward0 runs before the norm's nodes), then MulBackward0's (gh1), then
//               PowBackward0's (gh2) (docs/backward.md "What remains" 1; pinned on the CPU by
//               test_backward_order_on_cpu.py)
//   AddBackward0 of h = residual + x passes dx to both x and residual: one gradient, `dx`.
//
// ABI, three launches in this order on one stream (Op::stages of fused_add_rms_norm_backward):
//   fused_add_rms_norm_bwd_dx_<dt>(T* dx, float* ws, const T* dy, const T* dres, const T* x,
//                                  const T* w, long long rows, long long cols, float eps)
//       block 512 threads, any grid >= 1 (persistent); writes dx and ws[0, rows) = r
//   fused_add_rms_norm_bwd_dwp_<dt>(float* ws, const T* dy, const T* x, long long rows,
//                                   long long cols, long long sms, long long threads_per_sm)
//       block 128 threads, any grid >= 1 (persistent); writes ws[rows + k*cols + c]
//   fused_add_rms_norm_bwd_dw_<dt>(T* dw, const float* ws, long long rows, long long cols,
//                                  long long sms, long long threads_per_sm)
//       block 128 threads, grid ceil(cols / 128); writes dw
// ws holds rows + ctas * cols floats (ctas: kernelize.backward.col_config). Tensors contiguous,
// 16-byte aligned. dx may be dres itself (each element of dres is read once, by the thread that
// then writes that element of dx).
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

// four consecutive elements p[0..3] as f32; al: p is aligned for one 4-element access
template <typename T> KB_DEV void ld4(const T* p, bool al, float (&v)[4]) {
  if (al) {
    if constexpr (sizeof(T) == 4) {
      const uint4 q = *reinterpret_cast<const uint4*>(p);
      v[0] = __uint_as_float(q.x); v[1] = __uint_as_float(q.y); v[2] = __uint_as_float(q.z); v[3] = __uint_as_float(q.w);
    } else {
      const uint2 q = *reinterpret_cast<const uint2*>(p);
      T e[4];
      *reinterpret_cast<uint2*>(e) = q;
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = BT<T>::ld(e + i);
    }
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
__shared__ float kb_ra[KB_DX_THREADS];  // sums of squares
__shared__ float kb_rb[KB_DX_THREADS];  // sums of gn * h

// The norm's input gradient gh1 + gh2 and the residual output's dres, summed as eager's engine
// sums them (the header): T's one rounding of the norm's, then the add in T; in f32 the
// residual's first.
template <typename T>
KB_DEV float kf_sum(float gh1, float gh2, float dres) {
  if constexpr (sizeof(T) == 4) return __fadd_rn(__fadd_rn(dres, gh1), gh2);
  else return __fadd_rn(BT<T>::rnd(__fadd_rn(gh1, gh2)), dres);
}

template <typename T>
KB_DEV void kb_dx(T* __restrict__ dx, float* __restrict__ ws, const T* __restrict__ dy,
                  const T* __restrict__ dres, const T* __restrict__ x, const T* __restrict__ w,
                  i64 rows, i64 cols, float eps) {
  const KbRowCfg c = kb_row_cfg(rows, cols);
  const int L = c.lanes;
  const int G = L < 32 ? 32 : L;
  const int rpb = KB_DX_THREADS / G;     // rows per block pass
  const int tid = (int)threadIdx.x;
  const int grp = tid / G, t = tid % G;
  const int base = grp * G;
  const float fac = __fdiv_rn((float)rows, (float)(rows * cols));  // MeanOps' factor
  const float inv_n = (float)(1.0 / (double)cols);                   // MeanBackward's 1 / N
  const bool wal = kb_al(w, 4 * (int)sizeof(T));
  for (i64 r0 = (i64)blockIdx.x * rpb; r0 < rows; r0 += (i64)gridDim.x * rpb) {
    const i64 row = r0 + grp;
    const bool live = row < rows && t < L;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;  // sum of squares (the forward's)
    float b0 = 0.f, b1 = 0.f, b2 = 0.f, b3 = 0.f;  // sum of gn * h (the backward's)
    if (live) {
      const T* xr = x + row * cols;
      const T* gr = dy + row * cols;
      if (c.vec) {
        const int sh = (int)((row * cols) % 4);  // the f32 row start's misalignment (floats)
        const int nh = (4 - sh) % 4;
        if (nh > 0 && t >= sh && t < 4) {        // head: lane sh + e takes element e
          const int e = t - sh;
          const float h = BT<T>::ld(xr + e);
          const float gn = BT<T>::rnd(__fmul_rn(BT<T>::ld(gr + e), BT<T>::ld(w + e)));
          a0 = __fmul_rn(h, h);
          b0 = __fmul_rn(gn, h);
        }
        const i64 M = cols - nh, nvec = M / 4;
        const bool al = kb_al(xr + nh, 4 * (int)sizeof(T)) && kb_al(gr + nh, 4 * (int)sizeof(T));
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
            p[i] = __fmul_rn(BT<T>::rnd(__fmul_rn(gv[i], wv[i])), hv[i]);
          }
          a0 = __fadd_rn(a0, q[0]); a1 = __fadd_rn(a1, q[1]); a2 = __fadd_rn(a2, q[2]); a3 = __fadd_rn(a3, q[3]);
          b0 = __fadd_rn(b0, p[0]); b1 = __fadd_rn(b1, p[1]); b2 = __fadd_rn(b2, p[2]); b3 = __fadd_rn(b3, p[3]);
        }
        const int nt = (int)(M % 4);
        if (t < nt) {                            // tail: lane j takes element 4*nvec + j
          const i64 e = nh + 4 * nvec + t;
          const float h = BT<T>::ld(xr + e);
          const float gn = BT<T>::rnd(__fmul_rn(BT<T>::ld(gr + e), BT<T>::ld(w + e)));
          a0 = __fadd_rn(a0, __fmul_rn(h, h));
          b0 = __fadd_rn(b0, __fmul_rn(gn, h));
        }
      } else {                                   // single elements t + m*L, accumulator m % 4
        int m = 0;
        for (i64 e = t; e < cols; e += L, ++m) {
          const float h = BT<T>::ld(xr + e);
          const float gn = BT<T>::rnd(__fmul_rn(BT<T>::ld(gr + e), BT<T>::ld(w + e)));
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
    kb_ra[tid] = __fadd_rn(__fadd_rn(__fadd_rn(a0, a1), a2), a3);
    kb_rb[tid] = __fadd_rn(__fadd_rn(__fadd_rn(b0, b1), b2), b3);
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
    const float tot_a = kb_ra[base], tot_b = kb_rb[base];
    __syncthreads();  // kb_ra / kb_rb are rewritten by the next pass
    if (row < rows) {
      const float r = rsqrtf(__fadd_rn(__fmul_rn(tot_a, fac), eps));
      if (t == 0) ws[row] = r;
      const float ga = __fmul_rn(__fmul_rn(tot_b, -0.5f), __fmul_rn(__fmul_rn(r, r), r));
      const float gp = __fmul_rn(ga, inv_n);
      const T* xr = x + row * cols;
      const T* gr = dy + row * cols;
      const T* rr = dres + row * cols;
      T* dr = dx + row * cols;
      if (cols % 4 == 0) {
        const bool al = kb_al(xr, 4 * (int)sizeof(T)) && kb_al(gr, 4 * (int)sizeof(T)) &&
                        kb_al(dr, 4 * (int)sizeof(T)) && kb_al(rr, 4 * (int)sizeof(T));
#pragma unroll 4
        for (i64 qd = t; qd < cols / 4; qd += G) {
          const i64 e = 4 * qd;
          float hv[4], gv[4], wv[4], rv[4], o[4];
          ld4(xr + e, al, hv);
          ld4(gr + e, al, gv);
          ld4(w + e, wal, wv);
          ld4(rr + e, al, rv);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float gn = BT<T>::rnd(__fmul_rn(gv[i], wv[i]));
            o[i] = kf_sum<T>(__fmul_rn(gn, r), __fmul_rn(gp, __fmul_rn(hv[i], 2.0f)), rv[i]);
          }
          st4(dr + e, al, o);
        }
      } else {
        for (i64 e = t; e < cols; e += G) {
          const float h = BT<T>::ld(xr + e);
          const float gn = BT<T>::rnd(__fmul_rn(BT<T>::ld(gr + e), BT<T>::ld(w + e)));
          BT<T>::st(dr + e, kf_sum<T>(__fmul_rn(gn, r), __fmul_rn(gp, __fmul_rn(h, 2.0f)), BT<T>::ld(rr + e)));
        }
      }
    }
  }
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
    acc[i] = __fadd_rn(acc[i], BT<T>::rnd(__fmul_rn(gv[i], BT<T>::rnd(__fmul_rn(hv[i], r)))));
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
template <typename T>
KB_DEV void kb_dw(T* __restrict__ dw, const float* __restrict__ ws, i64 rows, i64 cols, i64 sms, i64 tps) {
  const KbColCfg c = kb_col_cfg(rows, cols, sms, tps);
  const float* part = ws + rows;
  const i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float v;
  if (c.ctas == 1) {
    v = part[col];
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
// the bound ptxas takes ~96 (dx) and ~80-95 (dwp) registers: one dx block of 512 threads per SM.
// (rms_norm_llama_backward's figures; -DKB_DX_MINB=1 -DKB_DWP_MINB=1 builds the unbounded one).
#ifndef KB_DX_MINB
#define KB_DX_MINB 2
#endif
#ifndef KB_DWP_MINB
#define KB_DWP_MINB 8
#endif

#define KB_ENTRIES(NAME, T)                                                                            \
  extern "C" __global__ void __launch_bounds__(KB_DX_THREADS, KB_DX_MINB) fused_add_rms_norm_bwd_dx_##NAME(            \
      T* dx, float* ws, const T* dy, const T* dres, const T* x, const T* w, i64 rows, i64 cols,        \
      float eps) {                                                                                     \
    kb_dx<T>(dx, ws, dy, dres, x, w, rows, cols, eps);                                                 \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(KB_DW_THREADS, KB_DWP_MINB) fused_add_rms_norm_bwd_dwp_##NAME(           \
      float* ws, const T* dy, const T* x, i64 rows, i64 cols, i64 sms, i64 tps) {                      \
    if (cols % 4 == 0) kb_dwp<T, 4>(ws, dy, x, rows, cols, sms, tps);                                  \
    else kb_dwp<T, 1>(ws, dy, x, rows, cols, sms, tps);                                                \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(KB_DW_THREADS) fused_add_rms_norm_bwd_dw_##NAME(            \
      T* dw, const float* ws, i64 rows, i64 cols, i64 sms, i64 tps) {                                  \
    kb_dw<T>(dw, ws, rows, cols, sms, tps);                                                            \
  }

KB_ENTRIES(bf16, __nv_bfloat16)
KB_ENTRIES(f16, __half)
KB_ENTRIES(f32, float)

// The entries KB_ENTRIES makes, spelled out (kernel.toml names them; a bundle's check finds each
// symbol's text in the source):
//   fused_add_rms_norm_bwd_dx_bf16 fused_add_rms_norm_bwd_dwp_bf16 fused_add_rms_norm_bwd_dw_bf16
//   fused_add_rms_norm_bwd_dx_f16 fused_add_rms_norm_bwd_dwp_f16 fused_add_rms_norm_bwd_dw_f16
//   fused_add_rms_norm_bwd_dx_f32 fused_add_rms_norm_bwd_dwp_f32 fused_add_rms_norm_bwd_dw_f32
