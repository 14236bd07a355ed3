// ---- the canonical row order (canonical.cuh: the known-different LayerNorm variants) -----------
// Row statistics follow the canonical row reduction (CRR): 256 lanes; lane t owns the
// 8-element group g of the row when g % 256 == t; lanes accumulate in increasing element
// order; then a butterfly s = 128..1, state[t] = combine(state[t], state[t+s]).
//  * G = 256 threads per row: thread t IS lane t (one 8-element vector per 2048 chunk).
//  * G = 32 (one warp per row): thread l holds lanes l + 32*j, j = 0..7, in 8 states; the
//    butterfly levels 128, 64, 32 combine states inside the thread, 16..1 use shuffles.
// Rows are kept in registers (NV vectors of 8 per thread) up to 2048*NV (one warp) /
// 256*8*NV (one block) columns; longer rows are streamed twice from global memory (the
// second read is mostly an L2 hit). Only layer_norm_twopass / layer_norm_onepass use it:
// eager's own orders are eager.cuh's.

// 8 elements of T as raw 32-bit words (no type punning through memory, so arrays of V8 stay
// in registers): 2-byte T: q[0] holds elements 2c (low half) and 2c+1 (high half) in word c;
// f32: q[i/4] component i%4. Accessors must be called with compile-time i (unrolled loops).
KZ_DEV unsigned kz_w(const uint4& v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }
KZ_DEV void kz_setw(uint4& v, int c, unsigned x) {
  if (c == 0) v.x = x; else if (c == 1) v.y = x; else if (c == 2) v.z = x; else v.w = x;
}
template <typename T> KZ_DEV float kz_bits2f(unsigned b);  // b: the element's bits (low 16 for 2-byte)
template <> KZ_DEV float kz_bits2f<float>(unsigned b) { return __uint_as_float(b); }
template <> KZ_DEV float kz_bits2f<__nv_bfloat16>(unsigned b) { return __uint_as_float(b << 16); }
template <> KZ_DEV float kz_bits2f<__half>(unsigned b) { return __half2float(__ushort_as_half((unsigned short)(b & 0xffffu))); }
template <typename T> KZ_DEV unsigned kz_f2bits(float v);  // round to T, return its bits
template <> KZ_DEV unsigned kz_f2bits<float>(float v) { return __float_as_uint(v); }
template <> KZ_DEV unsigned kz_f2bits<__nv_bfloat16>(float v) { return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(v)); }
template <> KZ_DEV unsigned kz_f2bits<__half>(float v) { return (unsigned)__half_as_ushort(__float2half_rn(v)); }
template <typename T> KZ_DEV unsigned kz_ldbits(const T* p) {
  if constexpr (sizeof(T) == 2) return (unsigned)*reinterpret_cast<const unsigned short*>(p);
  else return *reinterpret_cast<const unsigned*>(p);
}
template <typename T> KZ_DEV void kz_stbits(T* p, unsigned b) {
  if constexpr (sizeof(T) == 2) *reinterpret_cast<unsigned short*>(p) = (unsigned short)b;
  else *reinterpret_cast<unsigned*>(p) = b;
}

template <typename T> struct V8 {
  static constexpr int NQ = (int)(8 * sizeof(T) / 16);
  uint4 q[NQ];
  // raw bits of element i
  KZ_DEV unsigned bits(int i) const {
    if constexpr (sizeof(T) == 2) { const unsigned w = kz_w(q[0], i >> 1); return (i & 1) ? (w >> 16) : (w & 0xffffu); }
    else return kz_w(q[i >> 2], i & 3);
  }
  KZ_DEV void setbits(int i, unsigned b) {
    if constexpr (sizeof(T) == 2) {
      const unsigned w = kz_w(q[0], i >> 1);
      kz_setw(q[0], i >> 1, (i & 1) ? ((w & 0xffffu) | (b << 16)) : ((w & 0xffff0000u) | b));
    } else kz_setw(q[i >> 2], i & 3, b);
  }
  KZ_DEV float f(int i) const { return kz_bits2f<T>(bits(i)); }
  KZ_DEV void set(int i, float v) { setbits(i, kz_f2bits<T>(v)); }  // round(v) into element i
};

// Load 8 elements at p (element offset e0 of a row of `cols`), zero-filling past the end.
// vec: 16-byte accesses allowed (the row is 16-byte aligned).
template <typename T>
KZ_DEV void ld8(V8<T>& v, const T* p, i64 e0, i64 cols, bool vec) {
  if (vec && e0 + 8 <= cols) {
#pragma unroll
    for (int k = 0; k < V8<T>::NQ; ++k) v.q[k] = __ldg(reinterpret_cast<const uint4*>(p + e0) + k);
  } else {
#pragma unroll
    for (int k = 0; k < V8<T>::NQ; ++k) v.q[k] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (e0 + i < cols) v.setbits(i, kz_ldbits<T>(p + e0 + i));
  }
}
template <typename T>
KZ_DEV void ld8_rw(V8<T>& v, const T* p, i64 e0, i64 cols, bool vec) {
  if (vec && e0 + 8 <= cols) {
#pragma unroll
    for (int k = 0; k < V8<T>::NQ; ++k) v.q[k] = reinterpret_cast<const uint4*>(p + e0)[k];
  } else {
#pragma unroll
    for (int k = 0; k < V8<T>::NQ; ++k) v.q[k] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (e0 + i < cols) v.setbits(i, kz_ldbits<T>(p + e0 + i));
  }
}
template <typename T>
KZ_DEV void st8(T* p, const V8<T>& v, i64 e0, i64 cols, bool vec) {
  if (vec && e0 + 8 <= cols) {
#pragma unroll
    for (int k = 0; k < V8<T>::NQ; ++k) reinterpret_cast<uint4*>(p + e0)[k] = v.q[k];
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (e0 + i < cols) kz_stbits<T>(p + e0 + i, v.bits(i));
  }
}

// ---- reduction states ---------------------------------------------------------------------
// Plain sums for the (non-canonical-statistics) variants: sum of x and sum of x^2 together.
struct Sum2S {
  float s, q;
  KZ_DEV void init() { s = 0.0f; q = 0.0f; }
  KZ_DEV void add(float x) { s = __fadd_rn(s, x); q = __fadd_rn(q, __fmul_rn(x, x)); }
  static KZ_DEV Sum2S comb(Sum2S A, Sum2S B) { Sum2S r; r.s = __fadd_rn(A.s, B.s); r.q = __fadd_rn(A.q, B.q); return r; }
  KZ_DEV void put(float* red, int t) const { red[t] = s; red[256 + t] = q; }
  KZ_DEV void get(const float* red, int t) { s = red[t]; q = red[256 + t]; }
  KZ_DEV void shfl_down(int o) { s = __shfl_down_sync(0xffffffffu, s, o); q = __shfl_down_sync(0xffffffffu, q, o); }
  KZ_DEV void bcast0() { s = __shfl_sync(0xffffffffu, s, 0); q = __shfl_sync(0xffffffffu, q, 0); }
};
// Single sum of (x - c)^2 style values fed by the caller (two-pass variant).
struct Sum1S {
  float a;
  KZ_DEV void init() { a = 0.0f; }
  KZ_DEV void add(float x) { a = __fadd_rn(a, x); }
  static KZ_DEV Sum1S comb(Sum1S A, Sum1S B) { Sum1S r; r.a = __fadd_rn(A.a, B.a); return r; }
  KZ_DEV void put(float* red, int t) const { red[t] = a; }
  KZ_DEV void get(const float* red, int t) { a = red[t]; }
  KZ_DEV void shfl_down(int s) { a = __shfl_down_sync(0xffffffffu, a, s); }
  KZ_DEV void bcast0() { a = __shfl_sync(0xffffffffu, a, 0); }
};

// Finish the CRR butterfly. st[j] holds lane (lane_id + 32*j) for j = 0..7 of the 256 lanes.
// Result broadcast to all 32 threads of the warp.
template <typename S>
KZ_DEV S crr_finish_warp(S st[8]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) st[j] = S::comb(st[j], st[j + 4]);  // s = 128
#pragma unroll
  for (int j = 0; j < 2; ++j) st[j] = S::comb(st[j], st[j + 2]);  // s = 64
  S a = S::comb(st[0], st[1]);                                      // s = 32
#pragma unroll
  for (int s = 16; s >= 1; s >>= 1) {                               // s = 16..1
    S b = a;
    b.shfl_down(s);
    a = S::comb(a, b);  // lanes l < s: combine(state[l], state[l+s]); others unused
  }
  a.bcast0();
  return a;
}

// Reduce per-thread lane states to the row result. G = 32: st[0..7] are this thread's lanes
// l + 32j. G = 256: st[0] is lane threadIdx.x; goes through shared memory `red` (one
// __syncthreads; the caller syncs again before reusing red).
template <typename S, int G>
KZ_DEV S crr_reduce(S st[(G == 32) ? 8 : 1], float* red, int g) {
  if (G == 32) {
    return crr_finish_warp<S>(st);
  } else {
    st[0].put(red, g);
    __syncthreads();
    S w[8];
    const int l = g & 31;
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j].get(red, l + 32 * j);
    return crr_finish_warp<S>(w);
  }
}

// ---- row engine ---------------------------------------------------------------------------
// Reduce the row held in registers: thread g of the group holds vector v = G*k + g in xv[k].
template <typename S, int G, int NV, typename T, typename F>
KZ_DEV S reduce_regs(const V8<T>* xv, i64 cols, int g, float* red, F fn) {
  constexpr int L = (G == 32) ? 8 : 1;
  S st[L];
#pragma unroll
  for (int j = 0; j < L; ++j) st[j].init();
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const i64 e0 = 8LL * ((i64)G * k + g);
    if (e0 + 8 <= cols) {
#pragma unroll
      for (int i = 0; i < 8; ++i) st[k % L].add(fn(xv[k].f(i)));
    } else if (e0 < cols) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (e0 + i < cols) st[k % L].add(fn(xv[k].f(i)));
    }
  }
  return crr_reduce<S, G>(st, red, g);
}

// Reduce a row streamed from memory; ld(V8&, e0) loads the 8 elements at e0. Loads go in
// batches of 4 vectors before use (for G = 32 two batches per group of 8 lane states).
template <typename S, int G, typename T, typename LD, typename F>
KZ_DEV S reduce_stream(i64 cols, int g, float* red, LD ld, F fn) {
  constexpr int L = (G == 32) ? 8 : 1;
  constexpr int B = 4;
  constexpr int STEP = (L > B) ? L : B;
  S st[L];
#pragma unroll
  for (int j = 0; j < L; ++j) st[j].init();
  const i64 nvec = (cols + 7) / 8;
  for (i64 kb = 0; (i64)G * kb < nvec; kb += STEP) {
#pragma unroll
    for (int h = 0; h < STEP; h += B) {
      V8<T> x[B];
#pragma unroll
      for (int j = 0; j < B; ++j) {
        const i64 v = (i64)G * (kb + h + j) + g;
        if (v < nvec) ld(x[j], 8 * v);
      }
#pragma unroll
      for (int j = 0; j < B; ++j) {
        const i64 e0 = 8 * ((i64)G * (kb + h + j) + g);
        if (e0 + 8 <= cols) {
#pragma unroll
          for (int i = 0; i < 8; ++i) st[(h + j) % L].add(fn(x[j].f(i)));
        } else if (e0 < cols) {
#pragma unroll
          for (int i = 0; i < 8; ++i)
            if (e0 + i < cols) st[(h + j) % L].add(fn(x[j].f(i)));
        }
      }
    }
  }
  return crr_reduce<S, G>(st, red, g);
}

struct KzIdent { KZ_DEV float operator()(float h) const { return h; } };

// Row kept in registers: load once, statistics, outputs.
template <typename T, int G, int NV, class P>
KZ_DEV void row_reg(const P& p, i64 row, int g, float* red) {
  const i64 cols = p.cols;
  V8<T> xv[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const i64 e0 = 8LL * ((i64)G * k + g);
    if (e0 < cols) p.load(xv[k], row, e0);
  }
  const typename P::Params prm = p.template stats<G, NV>(xv, row, g, red);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const i64 e0 = 8LL * ((i64)G * k + g);
    if (e0 < cols) p.store(xv[k], row, e0, prm);
  }
}

// Row too long for registers: statistics from one (or two) streamed passes, then outputs.
template <typename T, int G, class P>
KZ_DEV void row_stream(const P& p, i64 row, int g, float* red) {
  const i64 cols = p.cols;
  const typename P::Params prm = p.template stats_stream<G>(row, g, red);
  const i64 nvec = (cols + 7) / 8;
  for (i64 v = g; v < nvec; v += G) {
    V8<T> x;
    p.reload(x, row, 8 * v);
    p.store(x, row, 8 * v, prm);
  }
}

// Launch shapes: blockDim = (32, R): one warp per row, R rows per block;
//                blockDim = (256, 1): one block per row. Any grid size works (rows loop).
// Each (group size, registers-or-streamed) path is its own non-inlined function with its own
// row loop: register allocation is then per path (inlined together, ptxas spilled heavily),
// and the call overhead is paid once per thread, not per row.
template <typename T, int G, int NV, bool STREAM, class P>
__device__ __noinline__ void row_loop(const P p, i64 rows) {
  __shared__ float red[768];
  const int g = threadIdx.x;
  if constexpr (G == 32) {
    for (i64 row = (i64)blockIdx.x * blockDim.y + threadIdx.y; row < rows;
         row += (i64)gridDim.x * blockDim.y) {
      if constexpr (STREAM) row_stream<T, 32>(p, row, g, red);
      else row_reg<T, 32, NV>(p, row, g, red);
    }
  } else {
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
      if constexpr (STREAM) row_stream<T, 256>(p, row, g, red);
      else row_reg<T, 256, NV>(p, row, g, red);
      __syncthreads();  // red is reused by the next row
    }
  }
}

// NV vectors of 8 per thread are kept in registers: the row stays in registers up to
// 32*8*NV (one warp) / 256*8*NV (one block) columns and is streamed (read twice) beyond.
template <typename T, int NV, class P>
KZ_DEV void row_dispatch(const P& p, i64 rows) {
  const i64 nvec = (p.cols + 7) / 8;
  if (blockDim.x == 32) {
    if (nvec <= 32 * NV) row_loop<T, 32, NV, false>(p, rows);
    else row_loop<T, 32, NV, true>(p, rows);
  } else if (blockDim.x == 256 && blockDim.y == 1 && blockDim.z == 1) {
    if (nvec <= 256 * NV) row_loop<T, 256, NV, false>(p, rows);
    else row_loop<T, 256, NV, true>(p, rows);
  } else {
    __trap();  // unsupported block shape: the manifest's launch rules never produce it
  }
}

template <typename T> KZ_DEV bool kz_rowvec(i64 cols, const void* a, const void* b) {
  return ((cols * (i64)sizeof(T)) % 16 == 0) && kz_al16(a) && kz_al16(b);
}

// layer_norm variants. STAT: 1 = two-pass mean then mean((x-mean)^2), 2 = one-pass
// E[x^2] - E[x]^2 (clamped at 0). Both differ from eager's Welford (kernels' descriptions).
struct LnPrm { float mean, rstd; };

template <typename T, int STAT>
struct LnP {
  T* out; const T* x; const T* w; const T* b; i64 cols; float eps; bool vec, wvec;
  typedef LnPrm Params;
  KZ_DEV void load(V8<T>& v, i64 row, i64 e0) const { ld8(v, x + row * cols, e0, cols, vec); }
  KZ_DEV void reload(V8<T>& v, i64 row, i64 e0) const { load(v, row, e0); }
  KZ_DEV LnPrm from_onepass(Sum2S s) const {
    LnPrm q;
    const float fc = (float)cols;
    q.mean = __fdiv_rn(s.s, fc);
    const float var = fmaxf(__fsub_rn(__fdiv_rn(s.q, fc), __fmul_rn(q.mean, q.mean)), 0.0f);
    q.rstd = rsqrtf(__fadd_rn(var, eps));
    return q;
  }
  template <int G, int NV>
  KZ_DEV LnPrm stats(const V8<T>* xv, i64, int g, float* red) const {
    if constexpr (STAT == 2) {
      return from_onepass(reduce_regs<Sum2S, G, NV, T>(xv, cols, g, red, KzIdent()));
    } else {
      LnPrm q;
      const float fc = (float)cols;
      q.mean = __fdiv_rn(reduce_regs<Sum1S, G, NV, T>(xv, cols, g, red, KzIdent()).a, fc);
      if constexpr (G == 256) __syncthreads();
      const float m = q.mean;
      auto sq = [m](float h) { const float d = __fsub_rn(h, m); return __fmul_rn(d, d); };
      const float var = __fdiv_rn(reduce_regs<Sum1S, G, NV, T>(xv, cols, g, red, sq).a, fc);
      q.rstd = rsqrtf(__fadd_rn(var, eps));
      return q;
    }
  }
  template <int G>
  KZ_DEV LnPrm stats_stream(i64 row, int g, float* red) const {
    auto ld = [&](V8<T>& v, i64 e0) { load(v, row, e0); };
    if constexpr (STAT == 2) {
      return from_onepass(reduce_stream<Sum2S, G, T>(cols, g, red, ld, KzIdent()));
    } else {
      LnPrm q;
      const float fc = (float)cols;
      q.mean = __fdiv_rn(reduce_stream<Sum1S, G, T>(cols, g, red, ld, KzIdent()).a, fc);
      if constexpr (G == 256) __syncthreads();
      const float m = q.mean;
      auto sq = [m](float h) { const float d = __fsub_rn(h, m); return __fmul_rn(d, d); };
      const float var = __fdiv_rn(reduce_stream<Sum1S, G, T>(cols, g, red, ld, sq).a, fc);
      q.rstd = rsqrtf(__fadd_rn(var, eps));
      return q;
    }
  }
  KZ_DEV void store(const V8<T>& xv, i64 row, i64 e0, LnPrm q) const {
    V8<T> wv, bv, y;
    ld8(wv, w, e0, cols, wvec);
    ld8(bv, b, e0, cols, wvec);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float h = xv.f(i);
      y.set(i, fmaf(__fmul_rn(__fsub_rn(h, q.mean), q.rstd), wv.f(i), bv.f(i)));
    }
    st8(out + row * cols, y, e0, cols, vec);
  }
};

template <typename T, int STAT, int NV = 8>
KZ_DEV void kz_layer_norm(T* out, const T* x, const T* w, const T* b, i64 rows, i64 cols, float eps) {
  LnP<T, STAT> p{out, x, w, b, cols, eps, kz_rowvec<T>(cols, out, x), kz_al16(w) && kz_al16(b)};
  row_dispatch<T, NV>(p, rows);
}
