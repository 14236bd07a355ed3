// ---- kernelize: F.rms_norm / nn.RMSNorm backward, eager autograd's bits (issue 30) ----------------
// Self-contained: NVRTC with cuda_bf16.h / cuda_fp16.h (and the CPU harness of
// python/tests/cuda_on_cpu). op rms_norm_backward, semantics torch (docs/spec.md section 2c;
// docs/backward-rms-torch.md): rms_norm_backward's ABI (dx, dwp, dw; Op::stages) with eager's
// kernels for `_fused_rms_norm_backward`, which are layer_norm's backward kernels instantiated with
// rms_norm = true (aten/src/ATen/native/cuda/layer_norm_kernel.cu: RMSNormBackwardKernelImpl ->
// LayerNormBackwardKernelImplInternal<T, true>; read from PyTorch's source, and the contractions
// from eager's sm_90 SASS of torch 2.15.0+cu132 with scripts/eager_sass.py).
//
// Per element, h = f32(x), g = f32(dy), w = f32(w); every step one f32 rounding, every product,
// sum and fused multiply-add an explicit __fmul_rn / __fadd_rn / fmaf (no contraction left to the
// compiler); round_T at the stores:
//   r:   the forward's rstd, recomputed in the forward's order (what autograd saved: F.rms_norm's
//        forward is the layer-norm kernels with rms_norm = true; kernels/rms_norm_torch follows
//        them): cols % 4 == 0: 128 lanes of 4-vectors, m2 = fmaf(h, h, m2) in order, trees of
//        sums (each warp shfl_down 16..1, then (w0 + w2) + (w1 + w3)), r = rsqrtf(fl(fl(m2 /
//        cols) + eps)); else 512 lanes of single elements with WelfordOps, r = rsqrtf(fl(fmaf(mean,
//        mean, fl(m2 / n)) + eps)).
//   dx:  s2 = rowsum fmaf(fl(fl(g * w) * h), r, .)     (layer_norm_grad_input_kernel_vectorized:
//        FMUL, FMUL, FFMA in eager's SASS); thread t of 128 takes the elements e with (e / 4) % 128
//        == t in increasing order into one accumulator, then cuda_utils::BlockReduceSum (the warp
//        trees, then warp 0 over (w0, w1, w2, w3, 0, ..., 0));
//        dx = round_T(fl(fmaf(fl(cols * w), g, -fl(fl(h * r) * s2)) * fl(fl(1 / cols) * r)))
//   dw:  colsum fmaf(fl(g * h), r, .)  (GammaBetaBackwardCUDAKernelTemplate<.., rms_norm = true>)
//        in eager's chains: bdy = 1 / 8 / 16 / 32 for rows < 64 / < 128 / < 256 / else; chain y
//        adds rows R*k + 8*y + i (R = 8*bdy, k = 0, 1, .., i = 0..7; with bdy = 1 every row in
//        order), and the rows of the last tile past `rows` add +0 (eager's zeroed registers: a -0
//        sum becomes +0); then the halving tree over the chains v[y] += v[y + off], off = bdy/2 ..
//        1; round_T at the store.
// Eager's plain dx kernel (cols % 4 != 0 or unaligned tensors) walks the same elements in the
// same order; on an H200 its layer_norm twin differed from the vectorized kernel's bits in a few
// elements (docs/backward-layer-norm.md), so on such inputs this kernel gives the vectorized
// order's bits, which may not be eager's plain kernel's there.
//
// ABI, three launches in this order on one stream (Op::stages of rms_norm_backward):
//   rms_norm_torch_bwd_dx_<dt>(T* dx, float* ws, const T* dy, const T* x, const T* w,
//                              long long rows, long long cols, float eps)
//       block 512 threads (4 groups of 128: a row a group, eager's block), any grid >= 1
//       (persistent over rows); writes dx and ws[0, rows) = r
//   rms_norm_torch_bwd_dwp_<dt>(float* ws, const T* dy, const T* x, long long rows,
//                               long long cols, long long sms, long long threads_per_sm)
//       block 128 threads, any grid >= 1 (persistent over its work items); writes the chains'
//       sums ws[rows + y*cols + c] (y < bdy) where Reduce.cuh's ctas (the workspace's figure) is
//       at least bdy, else the columns' f32 sums ws[rows + c]
//   rms_norm_torch_bwd_dw_<dt>(T* dw, const float* ws, long long rows, long long cols,
//                              long long sms, long long threads_per_sm)
//       block 128 threads, grid ceil(cols / 128); the tree over the chains (where dwp left them)
//       and the rounding to T; writes dw
// ws holds rows + ctas * cols floats (kernel_registry::backward::workspace_floats). Out of scope:
// eager's two-pass dw (rows > 65536 and cols / 32 < sms / 2, a [gy, cols] T partial then
// Reduce.cuh's sum(0)): dwp traps there.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define KB_DEV __device__ __forceinline__
typedef long long i64;

template <typename T> struct BT;
template <> struct BT<float> {
  static KB_DEV float ld(const float* p) { return *p; }
  static KB_DEV void st(float* p, float v) { *p = v; }
};
template <> struct BT<__nv_bfloat16> {
  static KB_DEV float ld(const __nv_bfloat16* p) {
    return __uint_as_float((unsigned)*reinterpret_cast<const unsigned short*>(p) << 16);
  }
  static KB_DEV void st(__nv_bfloat16* p, float v) {
    *reinterpret_cast<unsigned short*>(p) = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};
template <> struct BT<__half> {
  static KB_DEV float ld(const __half* p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
  }
  static KB_DEV void st(__half* p, float v) {
    *reinterpret_cast<unsigned short*>(p) = __half_as_ushort(__float2half_rn(v));
  }
};

KB_DEV bool kt_al(const void* p, int bytes) { return (reinterpret_cast<size_t>(p) & (size_t)(bytes - 1)) == 0; }

// n (1..4) consecutive elements p[0..n) as f32; vec: one aligned 4-element access (n == 4)
template <typename T> KB_DEV void kt_ld4(const T* p, bool vec, int n, float (&v)[4]) {
  if (vec) {
    if constexpr (sizeof(T) == 4) {
      const uint4 q = *reinterpret_cast<const uint4*>(p);
      v[0] = __uint_as_float(q.x); v[1] = __uint_as_float(q.y); v[2] = __uint_as_float(q.z); v[3] = __uint_as_float(q.w);
    } else {
      T e[4];
      *reinterpret_cast<uint2*>(e) = *reinterpret_cast<const uint2*>(p);
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = BT<T>::ld(e + i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = i < n ? BT<T>::ld(p + i) : 0.f;
  }
}
template <typename T> KB_DEV void kt_st4(T* p, bool vec, int n, const float (&v)[4]) {
  if (vec) {
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
    for (int i = 0; i < n; ++i) BT<T>::st(p + i, v[i]);
  }
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

// ---- dx: 4 groups of 128 threads, a row a group -----------------------------------------------
#define KB_DX_THREADS 512
#define KT_G 128                          // eager's block (num_threads())
#define KT_GROUPS (KB_DX_THREADS / KT_G)
#define KT_SPAN (4 * KT_G)                // elements per pass of a group: 4 per thread

struct KtSt { float mean, m2, n; };
__shared__ float kt_wsq[KT_GROUPS][KT_G / 32];  // the warps' sums of squares (4-vector order)
__shared__ KtSt kt_wst[KT_GROUPS][16];          // the 16 lane-warps' Welford states (512 lanes)
__shared__ float kt_w2[KT_GROUPS][KT_G / 32];   // the warps' s2
__shared__ float kt_tot[KT_GROUPS][2];          // the row's r, s2

// lane 0 gets the warp's halving tree: v[l] = v[l] + v[l + off], off = 16 .. 1
KB_DEV float kt_warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, off));
  return v;
}

// WelfordOps (SharedReduceOps.h) as RowwiseMomentsCUDAKernel runs it, nvcc's contractions:
// reduce, and combine(own, other)
KB_DEV void kt_wr_push(KtSt& s, float h) {
  s.n = __fadd_rn(s.n, 1.0f);
  const float d = __fsub_rn(h, s.mean);
  s.mean = __fadd_rn(s.mean, __fdiv_rn(d, s.n));
  s.m2 = fmaf(d, __fsub_rn(h, s.mean), s.m2);
}
KB_DEV KtSt kt_wr_comb(KtSt a, KtSt b) {
  if (a.n == 0.0f) return b;
  if (b.n == 0.0f) return a;
  const float d = __fsub_rn(b.mean, a.mean);
  KtSt r;
  r.n = __fadd_rn(a.n, b.n);
  const float nb = __fdiv_rn(b.n, r.n);
  r.mean = fmaf(d, nb, a.mean);
  r.m2 = fmaf(__fmul_rn(__fmul_rn(d, d), a.n), nb, __fadd_rn(a.m2, b.m2));
  return r;
}

template <typename T>
KB_DEV void kt_dx(T* __restrict__ dx, float* __restrict__ ws, const T* __restrict__ dy,
                  const T* __restrict__ x, const T* __restrict__ w, i64 rows, i64 cols, float eps) {
  if (blockDim.x != KB_DX_THREADS || blockDim.y != 1 || blockDim.z != 1) __trap();
  const int g = (int)threadIdx.x / KT_G, t = (int)threadIdx.x % KT_G, lane = t & 31, wp = t >> 5;
  const int A4 = 4 * (int)sizeof(T);
  // the forward's order: its vectorized kernel by cols alone (F.rms_norm's tensors are aligned)
  const bool vorder = cols % 4 == 0 && cols <= (1LL << 24);
  // 4-element loads where aligned; the bits do not depend on it
  const bool vld = cols % 4 == 0 && kt_al(dx, A4) && kt_al(dy, A4) && kt_al(x, A4) && kt_al(w, A4);
  const float fH = (float)cols;
  const float inv_h = __fdiv_rn(1.0f, fH);
  for (i64 base = (i64)KT_GROUPS * blockIdx.x; base < rows; base += (i64)KT_GROUPS * gridDim.x) {
    const i64 row = base + g;
    const bool live = row < rows;  // every thread takes every barrier below
    const T* gr = dy + row * cols;
    const T* hr = x + row * cols;
    // 1. r, the forward's rstd
    if (vorder) {
      float s = 0.f;
      if (live) {
        for (i64 e0 = 4 * (i64)t; e0 < cols; e0 += KT_SPAN) {
          float hv[4];
          kt_ld4(hr + e0, vld, 4, hv);
#pragma unroll
          for (int i = 0; i < 4; ++i) s = fmaf(hv[i], hv[i], s);
        }
      }
      s = kt_warp_sum(s);
      if (lane == 0) kt_wsq[g][wp] = s;
      __syncthreads();
      if (t == 0) {
        const float m2 = __fadd_rn(__fadd_rn(kt_wsq[g][0], kt_wsq[g][2]), __fadd_rn(kt_wsq[g][1], kt_wsq[g][3]));
        kt_tot[g][0] = rsqrtf(__fadd_rn(__fdiv_rn(m2, fH), eps));
      }
    } else {
      // 512 lanes: thread t holds lanes t + 128 j (j < 4), lane l the elements l, l + 512, ...
      KtSt st[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) st[j] = KtSt{0.f, 0.f, 0.f};
      if (live) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          for (i64 e = t + KT_G * j; e < cols; e += KT_SPAN) kt_wr_push(st[j], BT<T>::ld(hr + e));
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          KtSt o;
          o.mean = __shfl_down_sync(0xffffffffu, st[j].mean, off);
          o.m2 = __shfl_down_sync(0xffffffffu, st[j].m2, off);
          o.n = __shfl_down_sync(0xffffffffu, st[j].n, off);
          st[j] = kt_wr_comb(st[j], o);
        }
        if (lane == 0) kt_wst[g][wp + 4 * j] = st[j];  // lane-warp (t + 128 j) / 32
      }
      __syncthreads();
      if (t == 0) {
        KtSt v[16];
#pragma unroll
        for (int y = 0; y < 16; ++y) v[y] = kt_wst[g][y];
#pragma unroll
        for (int off = 8; off > 0; off >>= 1)
#pragma unroll
          for (int y = 0; y < off; ++y) v[y] = kt_wr_comb(v[y], v[y + off]);
        kt_tot[g][0] = rsqrtf(__fadd_rn(fmaf(v[0].mean, v[0].mean, __fdiv_rn(v[0].m2, v[0].n)), eps));
      }
    }
    __syncthreads();
    const float r = kt_tot[g][0];
    // 2. s2 over eager's dx kernel's lanes
    float s2 = 0.f;
    if (live) {
      for (i64 e0 = 4 * (i64)t; e0 < cols; e0 += KT_SPAN) {
        const int n = cols - e0 < 4 ? (int)(cols - e0) : 4;
        float gv[4], hv[4], wv[4];
        kt_ld4(gr + e0, vld, n, gv);
        kt_ld4(hr + e0, vld, n, hv);
        kt_ld4(w + e0, vld, n, wv);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (i < n) s2 = fmaf(__fmul_rn(__fmul_rn(gv[i], wv[i]), hv[i]), r, s2);
      }
    }
    s2 = kt_warp_sum(s2);
    if (lane == 0) kt_w2[g][wp] = s2;
    __syncthreads();
    if (wp == 0) {  // BlockReduceSum's second tree: warp 0 over the 4 warp sums and zeros
      float a = lane < KT_G / 32 ? kt_w2[g][lane] : 0.f;
      a = kt_warp_sum(a);
      if (lane == 0) kt_tot[g][1] = a;
    }
    __syncthreads();
    s2 = kt_tot[g][1];
    __syncthreads();  // the shared arrays are rewritten for the next rows
    if (live) {
      if (t == 0) ws[row] = r;
      const float term1 = __fmul_rn(inv_h, r);
      T* dr = dx + row * cols;
      for (i64 e0 = 4 * (i64)t; e0 < cols; e0 += KT_SPAN) {
        const int n = cols - e0 < 4 ? (int)(cols - e0) : 4;
        float gv[4], hv[4], wv[4], o[4];
        kt_ld4(gr + e0, vld, n, gv);
        kt_ld4(hr + e0, vld, n, hv);
        kt_ld4(w + e0, vld, n, wv);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float f1 = fmaf(__fmul_rn(fH, wv[i]), gv[i], -__fmul_rn(__fmul_rn(hv[i], r), s2));
          o[i] = __fmul_rn(f1, term1);
        }
        kt_st4(dr + e0, vld, n, o);
      }
    }
  }
}

// ---- dw: eager's chains, then the tree over them ------------------------------------------------
#define KB_DW_THREADS 128
#define KT_TW 32  // columns of a tile: a warp's lanes

KB_DEV int kt_bdy(i64 rows) { return rows < 64 ? 1 : rows < 128 ? 8 : rows < 256 ? 16 : 32; }

// Whether dwp leaves each chain's sum in ws (rows + y * cols + c, y < bdy) for dw's tree: the
// workspace holds rows + ctas * cols floats, so where ctas >= bdy (and bdy > 1). Else dwp runs
// the tree itself and leaves the column's sum in ws[rows + c].
KB_DEV bool kt_chains_in_ws(i64 rows, i64 cols, i64 sms, i64 tps) {
  const int bdy = kt_bdy(rows);
  return bdy > 1 && kb_col_cfg(rows, cols, sms, tps).ctas >= bdy;
}

// chain y of column c (live: c < cols): rows R*k + y8 + i, i < 8, k = 0 .. while R*k < rows; the
// rows past `rows` add +0. A group's 8 rows are loaded before they are added.
template <typename T>
KB_DEV float kt_chain(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ r,
                      i64 rows, i64 cols, i64 c, bool live, i64 R, i64 y8) {
  float acc = 0.f;
  for (i64 k0 = 0; k0 < rows; k0 += R) {
    const i64 r0 = k0 + y8;
    float gv[8], hv[8], rv[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool ok = live && r0 + i < rows;
      gv[i] = ok ? BT<T>::ld(dy + (r0 + i) * cols + c) : 0.f;
      hv[i] = ok ? BT<T>::ld(x + (r0 + i) * cols + c) : 0.f;
      rv[i] = ok ? r[r0 + i] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = fmaf(__fmul_rn(gv[i], hv[i]), rv[i], acc);
  }
  return acc;
}

__shared__ float kt_cw[32][KT_TW + 1];  // [chain y][column of the tile]

template <typename T>
KB_DEV void kt_dwp(float* __restrict__ ws, const T* __restrict__ dy, const T* __restrict__ x, i64 rows,
                   i64 cols, i64 sms, i64 tps) {
  if (blockDim.x != KB_DW_THREADS || blockDim.y != 1 || blockDim.z != 1) __trap();
  // eager's two-pass variant (LaunchGammaBetaBackwardCUDAKernel: M > 64 * 1024 and N / 32 <
  // sm_count / 2) is not implemented
  if (rows > 65536 && cols / 32 < sms / 2) __trap();
  const int lane = (int)threadIdx.x & 31, wp = (int)threadIdx.x >> 5;
  const int bdy = kt_bdy(rows);
  const i64 R = 8 * (i64)bdy;
  const i64 tiles = kb_cdiv(cols, KT_TW);
  const float* r = ws;
  if (kt_chains_in_ws(rows, cols, sms, tps)) {
    // a warp an item (column tile, chain)
    for (i64 it = (i64)blockIdx.x * 4 + wp; it < tiles * bdy; it += (i64)gridDim.x * 4) {
      const i64 y = it % bdy, c = (it / bdy) * KT_TW + lane;
      const float v = kt_chain<T>(dy, x, r, rows, cols, c, c < cols, R, 8 * y);
      if (c < cols) ws[rows + y * cols + c] = v;
    }
    return;
  }
  // a block a column tile: warp wp runs chains wp, wp + 4, ..; the tree through shared memory
  for (i64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const i64 c = tile * KT_TW + lane;
    for (int y = wp; y < bdy; y += 4)
      kt_cw[y][lane] = kt_chain<T>(dy, x, r, rows, cols, c, c < cols, bdy == 1 ? 8 : R, 8 * (i64)y);
    for (int off = bdy / 2; off > 0; off >>= 1) {
      __syncthreads();
      for (int y = wp; y < off; y += 4) kt_cw[y][lane] = __fadd_rn(kt_cw[y][lane], kt_cw[y + off][lane]);
    }
    __syncthreads();
    if (wp == 0 && c < cols) ws[rows + c] = kt_cw[0][lane];
    __syncthreads();  // the next tile rewrites kt_cw
  }
}

template <typename T>
KB_DEV void kt_dw(T* __restrict__ dw, const float* __restrict__ ws, i64 rows, i64 cols, i64 sms, i64 tps) {
  const i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  if (!kt_chains_in_ws(rows, cols, sms, tps)) {
    BT<T>::st(dw + c, ws[rows + c]);
    return;
  }
  const int bdy = kt_bdy(rows);
  float v[32];
  for (int y = 0; y < bdy; ++y) v[y] = ws[rows + y * cols + c];
  for (int off = bdy / 2; off > 0; off >>= 1)
    for (int y = 0; y < off; ++y) v[y] = __fadd_rn(v[y], v[y + off]);
  BT<T>::st(dw + c, v[0]);
}

#define KB_ENTRIES(NAME, T)                                                                            \
  extern "C" __global__ void __launch_bounds__(KB_DX_THREADS) rms_norm_torch_bwd_dx_##NAME(            \
      T* dx, float* ws, const T* dy, const T* x, const T* w, i64 rows, i64 cols, float eps) {          \
    kt_dx<T>(dx, ws, dy, x, w, rows, cols, eps);                                                       \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(KB_DW_THREADS) rms_norm_torch_bwd_dwp_##NAME(           \
      float* ws, const T* dy, const T* x, i64 rows, i64 cols, i64 sms, i64 tps) {                      \
    kt_dwp<T>(ws, dy, x, rows, cols, sms, tps);                                                        \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(KB_DW_THREADS) rms_norm_torch_bwd_dw_##NAME(            \
      T* dw, const float* ws, i64 rows, i64 cols, i64 sms, i64 tps) {                                  \
    kt_dw<T>(dw, ws, rows, cols, sms, tps);                                                            \
  }

// One dtype's entries alone where the module is compiled for it (-DKERNELIZE_DTYPE_<DT>, as the
// verifier and the client compile a module per dtype; docs/manifest.md), every dtype's otherwise.
#if !defined(KERNELIZE_DTYPE_F16) && !defined(KERNELIZE_DTYPE_F32)
KB_ENTRIES(bf16, __nv_bfloat16)
#endif
#if !defined(KERNELIZE_DTYPE_BF16) && !defined(KERNELIZE_DTYPE_F32)
KB_ENTRIES(f16, __half)
#endif
#if !defined(KERNELIZE_DTYPE_BF16) && !defined(KERNELIZE_DTYPE_F16)
KB_ENTRIES(f32, float)
#endif

// The entries KB_ENTRIES makes, spelled out (kernel.toml names them; a bundle's check finds each
// symbol's text in the source):
//   rms_norm_torch_bwd_dx_bf16 rms_norm_torch_bwd_dwp_bf16 rms_norm_torch_bwd_dw_bf16
//   rms_norm_torch_bwd_dx_f16 rms_norm_torch_bwd_dwp_f16 rms_norm_torch_bwd_dw_f16
//   rms_norm_torch_bwd_dx_f32 rms_norm_torch_bwd_dwp_f32 rms_norm_torch_bwd_dw_f32
