// ---- kernelize bundled kernels: common device code --------------------------------------
// Generated into every kernels/*/kernel.cu by bench/gen_kernels.py (edit the pieces in
// bench/kernel_src/ and re-run it). Self-contained: NVRTC with cuda_bf16.h / cuda_fp16.h.
//
// Bit-level semantics: docs/reference-semantics.md. Every operation that decides bits is
// an explicit IEEE intrinsic (__fadd_rn, __fmul_rn, __fdiv_rn, fmaf) so no contraction
// can differ; expf/erff/tanhf/rsqrtf are CUDA's accurate functions (no fast math).
//
// Row statistics follow the canonical row reduction (CRR): 256 lanes; lane t owns the
// 8-element group g of the row when g % 256 == t; lanes accumulate in increasing element
// order; then a butterfly s = 128..1, state[t] = combine(state[t], state[t+s]).
//  * G = 256 threads per row: thread t IS lane t (one 8-element vector per 2048 chunk).
//  * G = 32 (one warp per row): thread l holds lanes l + 32*j, j = 0..7, in 8 states; the
//    butterfly levels 128, 64, 32 combine states inside the thread, 16..1 use shuffles.
// Rows are kept in registers (NV vectors of 8 per thread) up to 2048*NVMAX columns; longer
// rows are streamed twice from global memory (the second read is mostly an L2 hit).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define KZ_DEV __device__ __forceinline__

typedef long long i64;

template <typename T> struct KT;
template <> struct KT<float> {
  static KZ_DEV float f(float v) { return v; }
  static KZ_DEV float rnd(float v) { return v; }
  static KZ_DEV float from(float v) { return v; }
};
template <> struct KT<__nv_bfloat16> {
  static KZ_DEV float f(__nv_bfloat16 v) { return __bfloat162float(v); }
  // round to bf16 and widen back: f32(round(v))
  static KZ_DEV float rnd(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
  static KZ_DEV __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};
template <> struct KT<__half> {
  static KZ_DEV float f(__half v) { return __half2float(v); }
  static KZ_DEV float rnd(float v) { return __half2float(__float2half_rn(v)); }
  static KZ_DEV __half from(float v) { return __float2half_rn(v); }
};

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

KZ_DEV bool kz_al16(const void* p) { return (((unsigned long long)p) & 15ull) == 0ull; }

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
// Same with the streaming (evict-first) hint, for row inputs read once.
template <typename T>
KZ_DEV void ld8s(V8<T>& v, const T* p, i64 e0, i64 cols, bool vec) {
  if (vec && e0 + 8 <= cols) {
#pragma unroll
    for (int k = 0; k < V8<T>::NQ; ++k) v.q[k] = __ldcs(reinterpret_cast<const uint4*>(p + e0) + k);
  } else {
    ld8(v, p, e0, cols, false);
  }
}
// Same without the non-coherent path (for buffers this kernel also writes: residual).
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
struct SumS {
  float a;
  KZ_DEV void init() { a = 0.0f; }
  KZ_DEV void add(float x) { a = __fadd_rn(a, __fmul_rn(x, x)); }
  static KZ_DEV SumS comb(SumS A, SumS B) { SumS r; r.a = __fadd_rn(A.a, B.a); return r; }
  KZ_DEV void put(float* red, int t) const { red[t] = a; }
  KZ_DEV void get(const float* red, int t) { a = red[t]; }
  KZ_DEV void shfl_down(int s) { a = __shfl_down_sync(0xffffffffu, a, s); }
  KZ_DEV void bcast0() { a = __shfl_sync(0xffffffffu, a, 0); }
};

struct WelS {
  float n, mean, m2;
  KZ_DEV void init() { n = 0.0f; mean = 0.0f; m2 = 0.0f; }
  KZ_DEV void add(float x) {
    n = __fadd_rn(n, 1.0f);
    float d = __fsub_rn(x, mean);
    mean = __fadd_rn(mean, __fdiv_rn(d, n));
    m2 = fmaf(d, __fsub_rn(x, mean), m2);
  }
  static KZ_DEV WelS comb(WelS A, WelS B) {
    WelS r;
    float n = __fadd_rn(A.n, B.n);
    if (n == 0.0f) { r.n = 0.0f; r.mean = 0.0f; r.m2 = 0.0f; return r; }
    float coef = __fdiv_rn(1.0f, n);
    float nA = __fmul_rn(A.n, coef), nB = __fmul_rn(B.n, coef);
    float delta = __fsub_rn(B.mean, A.mean);
    r.n = n;
    r.mean = fmaf(nA, A.mean, __fmul_rn(nB, B.mean));
    r.m2 = fmaf(__fmul_rn(__fmul_rn(delta, delta), A.n), nB, __fadd_rn(A.m2, B.m2));
    return r;
  }
  KZ_DEV void put(float* red, int t) const { red[t] = n; red[256 + t] = mean; red[512 + t] = m2; }
  KZ_DEV void get(const float* red, int t) { n = red[t]; mean = red[256 + t]; m2 = red[512 + t]; }
  KZ_DEV void shfl_down(int s) {
    n = __shfl_down_sync(0xffffffffu, n, s);
    mean = __shfl_down_sync(0xffffffffu, mean, s);
    m2 = __shfl_down_sync(0xffffffffu, m2, s);
  }
  KZ_DEV void bcast0() {
    n = __shfl_sync(0xffffffffu, n, 0);
    mean = __shfl_sync(0xffffffffu, mean, 0);
    m2 = __shfl_sync(0xffffffffu, m2, 0);
  }
};

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

// ---- CRR butterfly pieces --------------------------------------------------------------------
// st[j] (j < N) holds lane base + stride*j. Levels s = stride*N/2 .. stride, each
// state[t] = combine(state[t], state[t + s]) with the lower lane as the A side; st[0] ends
// holding lane `base` after all these levels.
template <typename S, int N>
KZ_DEV void crr_tree(S* st) {
#pragma unroll
  for (int h = N / 2; h >= 1; h /= 2) {
#pragma unroll
    for (int j = 0; j < h; ++j) st[j] = S::comb(st[j], st[j + h]);
  }
}
// a = lane l (l = lane id < 32) after levels 128..32; levels 16..1 by shuffles, then the row
// result (lane 0) broadcast to the warp.
template <typename S>
KZ_DEV S crr_warp_tail(S a) {
#pragma unroll
  for (int s = 16; s >= 1; s >>= 1) {
    S b = a;
    b.shfl_down(s);
    a = S::comb(a, b);  // lanes l < s: combine(state[l], state[l+s]); others unused
  }
  a.bcast0();
  return a;
}

KZ_DEV void kz_bar(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }

// A row is handled by a group of G threads (G = blockDim.x in {32, 64, 128, 256}); thread g
// carries the L = 256/G canonical lanes g + G*j (j < L) in st[0..L). Levels 128..G are
// combined inside the thread; for G > 32 the G lane states go through shared memory (one
// named barrier over the group's G threads) and every warp of the group finishes levels
// G/2..32 in registers (lanes l + 32j) and 16..1 by shuffles: all threads get the result.
// red: 2 x 768 floats per block, used alternately (`par`): a group's next reduction writes
// the other half, so one barrier per reduction suffices (a warp can only write half p again
// after passing the next barrier, which every reader of half p reaches after reading).
template <typename S, int G>
KZ_DEV S crr_group(S* st, float* red, int& par, int y, int g) {
  constexpr int L = 256 / G;
  crr_tree<S, L>(st);
  if constexpr (G == 32) {
    return crr_warp_tail<S>(st[0]);
  } else {
    constexpr int M = G / 32;
    float* rb = red + 768 * par;
    par ^= 1;
    st[0].put(rb, y * G + g);
    kz_bar(1 + y, G);
    S w[M];
    const int l = g & 31;
#pragma unroll
    for (int j = 0; j < M; ++j) w[j].get(rb, y * G + l + 32 * j);
    crr_tree<S, M>(w);
    return crr_warp_tail<S>(w[0]);
  }
}

// Reduction scratch shared by all row paths of a kernel (one static allocation per block).
__shared__ float kz_red[2 * 768];

// ---- row engine ---------------------------------------------------------------------------
// Reduce the row held in registers: thread g holds vector v = G*k + g (elements 8v..8v+7) in
// xv[k]; v % 256 = g + G*(k % L) is its canonical lane, so it feeds state k % L; within a
// state the vectors come in increasing k, i.e. increasing element order.
template <typename S, int G, int NV, typename T, typename F>
KZ_DEV S reduce_regs(const V8<T>* xv, i64 cols, int g, int y, float* red, int& par, F fn) {
  constexpr int L = 256 / G;
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
  return crr_group<S, G>(st, red, par, y, g);
}

// Reduce a row streamed from memory; ld(V8&, e0) loads the 8 elements at e0. Loads go in
// batches of B vectors before use.
template <typename S, int G, typename T, typename LD, typename F>
KZ_DEV S reduce_stream(i64 cols, int g, int y, float* red, int& par, LD ld, F fn) {
  constexpr int L = 256 / G;
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
  return crr_group<S, G>(st, red, par, y, g);
}

struct KzIdent { KZ_DEV float operator()(float h) const { return h; } };

// Row kept in registers. Each group handles RB consecutive rows at once (all RB*NV vectors
// are loaded before any is used: RB*NV*16 (32 for f32) bytes in flight per thread), then the
// statistics of each row, then its outputs. Group (blockIdx.x, y) takes row blocks
// (blockIdx.x*R + y)*RB, stepping by gridDim.x*R*RB: any grid size works.
template <typename T, int G, int NV, int RB, class P>
__device__ __noinline__ void rows_reg(const P p, i64 rows) {
  float* red = kz_red;
  const int g = threadIdx.x, y = threadIdx.y;
  const i64 cols = p.cols;
  const i64 R = blockDim.y;
  int par = 0;
  for (i64 row0 = ((i64)blockIdx.x * R + y) * RB; row0 < rows; row0 += (i64)gridDim.x * R * RB) {
    V8<T> xv[RB][NV];
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const i64 e0 = 8LL * ((i64)G * k + g);
        if (row0 + rb < rows && e0 < cols) p.load(xv[rb][k], row0 + rb, e0);
      }
    }
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
      if (row0 + rb < rows) {  // uniform over the group
        const typename P::Params prm = p.template stats<G, NV>(xv[rb], g, y, red, par);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          const i64 e0 = 8LL * ((i64)G * k + g);
          if (e0 < cols) p.store(xv[rb][k], row0 + rb, e0, prm);
        }
      }
    }
  }
}

// Row too long for registers: statistics from one (or two) streamed passes, then outputs
// (the second read mostly hits L2).
template <typename T, int G, class P>
__device__ __noinline__ void rows_stream(const P p, i64 rows) {
  float* red = kz_red;
  const int g = threadIdx.x, y = threadIdx.y;
  const i64 cols = p.cols;
  const i64 R = blockDim.y;
  int par = 0;
  const i64 nvec = (cols + 7) / 8;
  for (i64 row = (i64)blockIdx.x * R + y; row < rows; row += (i64)gridDim.x * R) {
    const typename P::Params prm = p.template stats_stream<G>(row, g, y, red, par);
    for (i64 v = g; v < nvec; v += G) {
      V8<T> x;
      p.reload(x, row, 8 * v);
      p.store(x, row, 8 * v, prm);
    }
  }
}

// Launch shapes (blockDim.x = G threads per row, blockDim.y = R row groups, G*R <= 256):
//   G = 32:  rows in registers up to 2048 columns; RB = 8/NV rows per warp at once
//            (NV = 1, 2, 4, 8 vectors per row per thread); streamed beyond 2048.
//   G = 64/128/256: the row in registers up to 8*8*G columns (NV = 8), streamed beyond
//            (instantiated for G = 256 only: the manifests give 64/128 only to short rows).
// Each path is its own non-inlined function with its own row loop (register allocation per
// path; the call is paid once per thread).
template <typename T, class P>
KZ_DEV void row_dispatch(const P& p, i64 rows) {
  const i64 nvec = (p.cols + 7) / 8;
  const int G = blockDim.x;
  if (blockDim.z != 1 || G * blockDim.y > 256) __trap();
  if (G == 32) {
    if (nvec <= 32) rows_reg<T, 32, 1, 8>(p, rows);
    else if (nvec <= 64) rows_reg<T, 32, 2, 4>(p, rows);
    else if (nvec <= 128) rows_reg<T, 32, 4, 2>(p, rows);
    else if (nvec <= 256) rows_reg<T, 32, 8, 1>(p, rows);
    else rows_stream<T, 32>(p, rows);
  } else if (G == 64 && nvec <= 8 * 64) {
    rows_reg<T, 64, 8, 1>(p, rows);
  } else if (G == 128 && nvec <= 8 * 128) {
    rows_reg<T, 128, 8, 1>(p, rows);
  } else if (G == 256) {
    if (nvec <= 8 * 256) rows_reg<T, 256, 8, 1>(p, rows);
    else rows_stream<T, 256>(p, rows);
  } else {
    __trap();  // unsupported block shape: the manifest's launch rules never produce it
  }
}

template <typename T> KZ_DEV bool kz_rowvec(i64 cols, const void* a, const void* b) {
  return ((cols * (i64)sizeof(T)) % 16 == 0) && kz_al16(a) && kz_al16(b);
}

// ---- row ops --------------------------------------------------------------------------------
#define KZ_LLAMA 0   // n = round(h*r); y = round(w*n)
#define KZ_GEMMA 1   // y = round((h*r)*(1+w))
#define KZ_TORCH 2   // y = round((h*r)*w)
#define KZ_WBR 3     // variant declared llama: y = round((h*r)*w), weight before rounding

KZ_DEV float kz_rms_r(float tot, i64 cols, float eps) {
  const float var = __fmul_rn(tot, __fdiv_rn(1.0f, (float)cols));
  return rsqrtf(__fadd_rn(var, eps));
}

template <typename T, int MODE>
KZ_DEV void kz_rms_out(T* out, const T* w, const V8<T>& xv, i64 row, i64 e0, i64 cols, float r,
                       bool vec, bool wvec) {
  V8<T> wv, y;
  ld8(wv, w, e0, cols, wvec);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float h = xv.f(i);
    const float wf = wv.f(i);
    float o;
    if constexpr (MODE == KZ_LLAMA) o = __fmul_rn(wf, KT<T>::rnd(__fmul_rn(h, r)));
    else if constexpr (MODE == KZ_GEMMA) o = __fmul_rn(__fmul_rn(h, r), __fadd_rn(1.0f, wf));
    else o = __fmul_rn(__fmul_rn(h, r), wf);
    y.set(i, o);
  }
  st8(out + row * cols, y, e0, cols, vec);
}

template <typename T, int MODE>
struct RmsP {
  T* out; const T* x; const T* w; i64 cols; float eps; bool vec, wvec;
  typedef float Params;
  KZ_DEV void load(V8<T>& v, i64 row, i64 e0) const { ld8s(v, x + row * cols, e0, cols, vec); }
  KZ_DEV void reload(V8<T>& v, i64 row, i64 e0) const { ld8(v, x + row * cols, e0, cols, vec); }
  template <int G, int NV>
  KZ_DEV float stats(const V8<T>* xv, int g, int y, float* red, int& par) const {
    return kz_rms_r(reduce_regs<SumS, G, NV, T>(xv, cols, g, y, red, par, KzIdent()).a, cols, eps);
  }
  template <int G>
  KZ_DEV float stats_stream(i64 row, int g, int y, float* red, int& par) const {
    auto ld = [&](V8<T>& v, i64 e0) { reload(v, row, e0); };
    return kz_rms_r(reduce_stream<SumS, G, T>(cols, g, y, red, par, ld, KzIdent()).a, cols, eps);
  }
  KZ_DEV void store(const V8<T>& xv, i64 row, i64 e0, float r) const {
    kz_rms_out<T, MODE>(out, w, xv, row, e0, cols, r, vec, wvec);
  }
};

template <typename T, int MODE>
KZ_DEV void kz_rms_norm(T* out, const T* x, const T* w, i64 rows, i64 cols, float eps) {
  RmsP<T, MODE> p{out, x, w, cols, eps, kz_rowvec<T>(cols, out, x), kz_al16(w)};
  row_dispatch<T>(p, rows);
}

// fused_add_rms_norm: s = round(x + residual); residual := s; out = rms_norm_llama(s)
template <typename T>
struct FaddP {
  T* out; T* res; const T* x; const T* w; i64 cols; float eps; bool vec, wvec;
  typedef float Params;
  KZ_DEV void load(V8<T>& v, i64 row, i64 e0) const {
    V8<T> xa, ra;
    ld8s(xa, x + row * cols, e0, cols, vec);
    ld8_rw(ra, res + row * cols, e0, cols, vec);
#pragma unroll
    for (int i = 0; i < 8; ++i) v.set(i, __fadd_rn(xa.f(i), ra.f(i)));
    st8(res + row * cols, v, e0, cols, vec);
  }
  KZ_DEV void reload(V8<T>& v, i64 row, i64 e0) const { ld8_rw(v, res + row * cols, e0, cols, vec); }
  template <int G, int NV>
  KZ_DEV float stats(const V8<T>* xv, int g, int y, float* red, int& par) const {
    return kz_rms_r(reduce_regs<SumS, G, NV, T>(xv, cols, g, y, red, par, KzIdent()).a, cols, eps);
  }
  template <int G>
  KZ_DEV float stats_stream(i64 row, int g, int y, float* red, int& par) const {
    auto ld = [&](V8<T>& v, i64 e0) { load(v, row, e0); };
    return kz_rms_r(reduce_stream<SumS, G, T>(cols, g, y, red, par, ld, KzIdent()).a, cols, eps);
  }
  KZ_DEV void store(const V8<T>& xv, i64 row, i64 e0, float r) const {
    kz_rms_out<T, KZ_LLAMA>(out, w, xv, row, e0, cols, r, vec, wvec);
  }
};

template <typename T>
KZ_DEV void kz_fused_add_rms_norm(T* out, T* res, const T* x, const T* w, i64 rows, i64 cols, float eps) {
  FaddP<T> p{out, res, x, w, cols, eps,
             kz_rowvec<T>(cols, out, x) && kz_al16(res), kz_al16(w)};
  row_dispatch<T>(p, rows);
}

// layer_norm. STAT: 0 = canonical Welford (exact), 1 = two-pass mean then mean((x-mean)^2),
// 2 = one-pass E[x^2] - E[x]^2 (clamped at 0).
struct LnPrm { float mean, rstd; };

template <typename T, int STAT>
struct LnP {
  T* out; const T* x; const T* w; const T* b; i64 cols; float eps; bool vec, wvec;
  typedef LnPrm Params;
  KZ_DEV void load(V8<T>& v, i64 row, i64 e0) const { ld8s(v, x + row * cols, e0, cols, vec); }
  KZ_DEV void reload(V8<T>& v, i64 row, i64 e0) const { ld8(v, x + row * cols, e0, cols, vec); }
  KZ_DEV LnPrm from_welford(WelS s) const {
    LnPrm q;
    q.mean = s.mean;
    q.rstd = rsqrtf(__fadd_rn(__fdiv_rn(s.m2, s.n), eps));
    return q;
  }
  KZ_DEV LnPrm from_onepass(Sum2S s) const {
    LnPrm q;
    const float fc = (float)cols;
    q.mean = __fdiv_rn(s.s, fc);
    const float var = fmaxf(__fsub_rn(__fdiv_rn(s.q, fc), __fmul_rn(q.mean, q.mean)), 0.0f);
    q.rstd = rsqrtf(__fadd_rn(var, eps));
    return q;
  }
  template <int G, int NV>
  KZ_DEV LnPrm stats(const V8<T>* xv, int g, int y, float* red, int& par) const {
    if constexpr (STAT == 0) {
      return from_welford(reduce_regs<WelS, G, NV, T>(xv, cols, g, y, red, par, KzIdent()));
    } else if constexpr (STAT == 2) {
      return from_onepass(reduce_regs<Sum2S, G, NV, T>(xv, cols, g, y, red, par, KzIdent()));
    } else {
      LnPrm q;
      const float fc = (float)cols;
      q.mean = __fdiv_rn(reduce_regs<Sum1S, G, NV, T>(xv, cols, g, y, red, par, KzIdent()).a, fc);
      const float m = q.mean;
      auto sq = [m](float h) { const float d = __fsub_rn(h, m); return __fmul_rn(d, d); };
      const float var = __fdiv_rn(reduce_regs<Sum1S, G, NV, T>(xv, cols, g, y, red, par, sq).a, fc);
      q.rstd = rsqrtf(__fadd_rn(var, eps));
      return q;
    }
  }
  template <int G>
  KZ_DEV LnPrm stats_stream(i64 row, int g, int y, float* red, int& par) const {
    auto ld = [&](V8<T>& v, i64 e0) { reload(v, row, e0); };
    if constexpr (STAT == 0) {
      return from_welford(reduce_stream<WelS, G, T>(cols, g, y, red, par, ld, KzIdent()));
    } else if constexpr (STAT == 2) {
      return from_onepass(reduce_stream<Sum2S, G, T>(cols, g, y, red, par, ld, KzIdent()));
    } else {
      LnPrm q;
      const float fc = (float)cols;
      q.mean = __fdiv_rn(reduce_stream<Sum1S, G, T>(cols, g, y, red, par, ld, KzIdent()).a, fc);
      const float m = q.mean;
      auto sq = [m](float h) { const float d = __fsub_rn(h, m); return __fmul_rn(d, d); };
      const float var = __fdiv_rn(reduce_stream<Sum1S, G, T>(cols, g, y, red, par, ld, sq).a, fc);
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

template <typename T, int STAT>
KZ_DEV void kz_layer_norm(T* out, const T* x, const T* w, const T* b, i64 rows, i64 cols, float eps) {
  LnP<T, STAT> p{out, x, w, b, cols, eps, kz_rowvec<T>(cols, out, x), kz_al16(w) && kz_al16(b)};
  row_dispatch<T>(p, rows);
}

// ---- elementwise ops --------------------------------------------------------------------------
#define KZ_SILU 0
#define KZ_GELU 1
#define KZ_GELU_TANH 2
#define KZ_SILU_FAST 3  // variant: __expf and __fdividef

template <int F>
KZ_DEV float kz_act(float h) {
  if constexpr (F == KZ_SILU) {
    return __fdiv_rn(h, __fadd_rn(1.0f, expf(-h)));
  } else if constexpr (F == KZ_SILU_FAST) {
    return __fdividef(h, 1.0f + __expf(-h));
  } else if constexpr (F == KZ_GELU) {
    return __fmul_rn(__fmul_rn(h, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(h, 0.70710678118654752f))));
  } else {
    const float inner = __fmul_rn(0.79788456080286536f, fmaf(0.044715f, __fmul_rn(__fmul_rn(h, h), h), h));
    return __fmul_rn(__fmul_rn(0.5f, h), __fadd_rn(1.0f, tanhf(inner)));
  }
}

// 64 bytes per thread per step (4 x 16-byte vectors: 32 elements of bf16/f16, 16 of f32), all
// four loaded before any is used; a block covers blockDim.x*64 contiguous bytes, coalesced;
// grid-stride over such tiles (the manifest's grid covers n in one step for 2-byte types).
// Only the last, partial tile takes the scalar path.
template <typename T, int F>
KZ_DEV void kz_unary(T* out, const T* x, i64 n) {
  constexpr int W = 16 / sizeof(T);
  constexpr int NVEC = 4;
  const i64 tile = (i64)blockDim.x * (W * NVEC);
  const bool al = kz_al16(out) && kz_al16(x);
  const i64 nfull = al ? (n / tile) * tile : 0;
  i64 base = (i64)blockIdx.x * tile;
  for (; base < nfull; base += (i64)gridDim.x * tile) {
    uint4 v[NVEC];
    const uint4* xs = reinterpret_cast<const uint4*>(x + base) + threadIdx.x;
    uint4* os = reinterpret_cast<uint4*>(out + base) + threadIdx.x;
#pragma unroll
    for (int j = 0; j < NVEC; ++j) v[j] = __ldcs(xs + j * blockDim.x);
#pragma unroll
    for (int j = 0; j < NVEC; ++j) {
      T* e = reinterpret_cast<T*>(&v[j]);
#pragma unroll
      for (int i = 0; i < W; ++i) e[i] = KT<T>::from(kz_act<F>(KT<T>::f(e[i])));
      __stcs(os + j * blockDim.x, v[j]);
    }
  }
  // partial tile (or unaligned): whole 16-byte vectors where possible (all loads issued
  // before use), single elements only for the last few past the final whole vector
  for (; base < n; base += (i64)gridDim.x * tile) {
    uint4 v[NVEC];
    i64 e0[NVEC];
#pragma unroll
    for (int j = 0; j < NVEC; ++j) {
      e0[j] = base + ((i64)j * blockDim.x + threadIdx.x) * W;
      if (al && e0[j] + W <= n) v[j] = __ldcs(reinterpret_cast<const uint4*>(x + e0[j]));
    }
#pragma unroll
    for (int j = 0; j < NVEC; ++j) {
      if (al && e0[j] + W <= n) {
        T* e = reinterpret_cast<T*>(&v[j]);
#pragma unroll
        for (int i = 0; i < W; ++i) e[i] = KT<T>::from(kz_act<F>(KT<T>::f(e[i])));
        __stcs(reinterpret_cast<uint4*>(out + e0[j]), v[j]);
      } else {
        for (int i = 0; i < W; ++i)
          if (e0[j] + i < n) out[e0[j] + i] = KT<T>::from(kz_act<F>(KT<T>::f(x[e0[j] + i])));
      }
    }
  }
}

// silu_and_mul: x is [rows, 2*cols] (gate, up); out [rows, cols].
// ROUND2 = true: eager s = round(silu(g)); y = round(s*u). false (variant): y = round(silu(g)*u).
template <typename T, bool ROUND2>
KZ_DEV float kz_sam(float g, float u) {
  const float s = kz_act<KZ_SILU>(g);
  if constexpr (ROUND2) return __fmul_rn(KT<T>::rnd(s), u);
  else return __fmul_rn(s, u);
}

// Row/column of vector index j (W elements each, cvec vectors per row): 32-bit division when
// the indices fit (a 64-bit division is ~10x the instructions), once per 16-byte vector.
KZ_DEV void kz_rc(i64 j, i64 cvec, bool small, i64& r, i64& c) {
  if (small) {
    const unsigned uj = (unsigned)j, uc = (unsigned)cvec, q = uj / uc;
    r = q; c = uj - q * uc;
  } else {
    r = j / cvec; c = j - r * cvec;
  }
}

// 4 output vectors of 16 bytes per thread per step (8 16-byte loads in flight: gate and up).
template <typename T, bool ROUND2>
KZ_DEV void kz_silu_and_mul(T* out, const T* x, i64 rows, i64 cols) {
  constexpr int W = 16 / sizeof(T);
  constexpr int NVEC = 4;
  const i64 n = rows * cols;
  const i64 tile = (i64)blockDim.x * (W * NVEC);
  const bool al = kz_al16(out) && kz_al16(x) && (cols % W == 0);
  i64 base = (i64)blockIdx.x * tile;
  if (al) {
    const i64 cvec = cols / W, nv = n / W;
    const bool small = nv < (1LL << 32);
    for (; base < n; base += (i64)gridDim.x * tile) {
      uint4 gv[NVEC], uv[NVEC];
      const i64 j0 = base / W + threadIdx.x;
#pragma unroll
      for (int j = 0; j < NVEC; ++j) {
        const i64 vj = j0 + (i64)j * blockDim.x;  // output vector index
        if (vj < nv) {
          i64 r, c;
          kz_rc(vj, cvec, small, r, c);
          const uint4* gp = reinterpret_cast<const uint4*>(x) + r * 2 * cvec + c;
          gv[j] = __ldcs(gp);
          uv[j] = __ldcs(gp + cvec);
        }
      }
#pragma unroll
      for (int j = 0; j < NVEC; ++j) {
        const i64 vj = j0 + (i64)j * blockDim.x;
        if (vj < nv) {
          const T* ge = reinterpret_cast<const T*>(&gv[j]);
          const T* ue = reinterpret_cast<const T*>(&uv[j]);
          uint4 o;
          T* oe = reinterpret_cast<T*>(&o);
#pragma unroll
          for (int i = 0; i < W; ++i) oe[i] = KT<T>::from(kz_sam<T, ROUND2>(KT<T>::f(ge[i]), KT<T>::f(ue[i])));
          __stcs(reinterpret_cast<uint4*>(out) + vj, o);
        }
      }
    }
  } else {
    for (; base < n; base += (i64)gridDim.x * tile) {
#pragma unroll 4
      for (int j = 0; j < W * NVEC; ++j) {
        const i64 e = base + (i64)j * blockDim.x + threadIdx.x;
        if (e < n) {
          const i64 r = e / cols, c = e - r * cols;
          const T* gp = x + r * 2 * cols + c;
          out[e] = KT<T>::from(kz_sam<T, ROUND2>(KT<T>::f(gp[0]), KT<T>::f(gp[cols])));
        }
      }
    }
  }
}

// ---- entry points -----------------------------------------------------------------
#if !defined(KERNELIZE_DTYPE_F16) && !defined(KERNELIZE_DTYPE_F32)
extern "C" __global__ void __launch_bounds__(256, 3) rms_norm_llama_wbr_bf16(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, long long rows, long long cols, float eps) {
  kz_rms_norm<__nv_bfloat16, KZ_WBR>(out, x, w, rows, cols, eps);
}
#endif

#if !defined(KERNELIZE_DTYPE_BF16) && !defined(KERNELIZE_DTYPE_F32)
extern "C" __global__ void __launch_bounds__(256, 3) rms_norm_llama_wbr_f16(__half* out, const __half* x, const __half* w, long long rows, long long cols, float eps) {
  kz_rms_norm<__half, KZ_WBR>(out, x, w, rows, cols, eps);
}
#endif

#if !defined(KERNELIZE_DTYPE_BF16) && !defined(KERNELIZE_DTYPE_F16)
extern "C" __global__ void __launch_bounds__(256, 2) rms_norm_llama_wbr_f32(float* out, const float* x, const float* w, long long rows, long long cols, float eps) {
  kz_rms_norm<float, KZ_WBR>(out, x, w, rows, cols, eps);
}
#endif
