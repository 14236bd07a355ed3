// ---- kernelize bundled row kernels: eager's reduction orders -----------------------------
// Generated into kernels/*/kernel.cu by bench/gen_kernels.py (edit bench/kernel_src/eager.cuh
// and re-run it). Self-contained: NVRTC with cuda_bf16.h / cuda_fp16.h.
//
// Bit-level semantics: docs/reference-semantics.md. Every operation that decides bits is an
// explicit IEEE intrinsic (__fadd_rn, __fmul_rn, __fdiv_rn, fmaf); rsqrtf is CUDA's.
//
// Two row orders (reference-semantics.md):
//  * the mean order (HF LlamaRMSNorm, GemmaRMSNorm, residual add + norm): LANES = 32 lanes of
//    4-vectors when 128 < cols <= 8160, 512 lanes when cols > 8160, bw = min(last_pow2(cols), 32)
//    lanes of single elements when cols <= 128; 4 accumulators per lane; a 4-vector tail of
//    cols % 4 elements goes to lanes 0.. accumulator 0; each warp offsets 16..1, then warps 8..1.
//  * the layer-norm order (nn.LayerNorm, F.rms_norm): 128 lanes of 4-vectors when cols % 4 == 0,
//    else 512 lanes of single elements; one state per lane; same trees.
// A row is handled by G threads (G = blockDim.x); thread g carries the L = LANES / G lanes
// g + G*j (j < L). A "unit" is one 4-vector (VEC) or one element; unit u belongs to lane
// u % LANES, so thread g handles units g + G*c (c = 0, 1, ...) and unit c goes to its state
// c % L: within a lane, units come in increasing order, as the order requires.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define KZ_DEV __device__ __forceinline__

typedef long long i64;

template <typename T> struct KT;
template <> struct KT<float> {
  static KZ_DEV float f(unsigned b) { return __uint_as_float(b); }
  static KZ_DEV unsigned bits(float v) { return __float_as_uint(v); }
  static KZ_DEV float rnd(float v) { return v; }
};
template <> struct KT<__nv_bfloat16> {
  static KZ_DEV float f(unsigned b) { return __uint_as_float(b << 16); }
  static KZ_DEV unsigned bits(float v) { return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(v)); }
  static KZ_DEV float rnd(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
};
template <> struct KT<__half> {
  static KZ_DEV float f(unsigned b) { return __half2float(__ushort_as_half((unsigned short)b)); }
  static KZ_DEV unsigned bits(float v) { return (unsigned)__half_as_ushort(__float2half_rn(v)); }
  static KZ_DEV float rnd(float v) { return __half2float(__float2half_rn(v)); }
};

template <typename T> KZ_DEV unsigned kz_ld1(const T* p) {
  if constexpr (sizeof(T) == 2) return (unsigned)*reinterpret_cast<const unsigned short*>(p);
  else return *reinterpret_cast<const unsigned*>(p);
}
template <typename T> KZ_DEV void kz_st1(T* p, unsigned b) {
  if constexpr (sizeof(T) == 2) *reinterpret_cast<unsigned short*>(p) = (unsigned short)b;
  else *reinterpret_cast<unsigned*>(p) = b;
}

// N = 4 (VEC) or 1 consecutive elements of T, kept as raw bits in 32-bit words (2-byte T: two
// elements per word), so arrays of units stay in registers.
template <typename T, bool VEC> struct Un {
  static constexpr int N = VEC ? 4 : 1;
  static constexpr int W = sizeof(T) == 2 ? (N + 1) / 2 : N;
  unsigned w[W];
  KZ_DEV float f(int i) const {
    if constexpr (sizeof(T) == 2) return KT<T>::f(VEC ? ((i & 1) ? (w[i >> 1] >> 16) : (w[i >> 1] & 0xffffu)) : w[0]);
    else return KT<T>::f(w[i]);
  }
  KZ_DEV void set(int i, float v) {  // round v to T
    const unsigned b = KT<T>::bits(v);
    if constexpr (sizeof(T) == 2 && VEC) w[i >> 1] = (i & 1) ? ((w[i >> 1] & 0xffffu) | (b << 16)) : ((w[i >> 1] & 0xffff0000u) | b);
    else w[i] = b;
  }
  // load the unit starting at element p; al: p is aligned for one vector access
  KZ_DEV void ld(const T* p, bool al) {
    if constexpr (!VEC) {
      w[0] = kz_ld1(p);
    } else if (al) {
      if constexpr (sizeof(T) == 2) { const uint2 v = *reinterpret_cast<const uint2*>(p); w[0] = v.x; w[1] = v.y; }
      else { const uint4 v = *reinterpret_cast<const uint4*>(p); w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w; }
    } else {
      if constexpr (sizeof(T) == 2) {
        w[0] = kz_ld1(p) | (kz_ld1(p + 1) << 16);
        w[1] = kz_ld1(p + 2) | (kz_ld1(p + 3) << 16);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = kz_ld1(p + i);
      }
    }
  }
  KZ_DEV void st(T* p, bool al) const {
    if constexpr (!VEC) {
      kz_st1(p, w[0]);
    } else if (al) {
      if constexpr (sizeof(T) == 2) *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
      else *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        if constexpr (sizeof(T) == 2) kz_st1(p + i, (i & 1) ? (w[i >> 1] >> 16) : (w[i >> 1] & 0xffffu));
        else kz_st1(p + i, w[i]);
      }
    }
  }
};

template <typename T> KZ_DEV bool kz_al(const void* p) {
  return (reinterpret_cast<size_t>(p) & (4 * sizeof(T) - 1)) == 0;
}

// ---- row states ----------------------------------------------------------------------------------
// Mean order: 4 accumulators per lane, folded ((a0 + a1) + a2) + a3 before the trees.
struct MeanS { float a0, a1, a2, a3; };
// Layer-norm order: (mean, m2, n); F.rms_norm's vectorized kernel uses m2 as its sum of squares.
struct WelS { float mean, m2, n; };

KZ_DEV float kz_shfl(float v, int off) { return __shfl_down_sync(0xffffffffu, v, off); }

// ---- op policies ---------------------------------------------------------------------------------
#define KZ_LLAMA 0   // n = round(h*r); y = round(w*n)
#define KZ_GEMMA 1   // y = round((h*r)*(1+w))
#define KZ_TORCH 2   // y = round((h*r)*w)
#define KZ_WBR 3     // variant declared llama: y = round((h*r)*w), weight before rounding

// HF LlamaRMSNorm / GemmaRMSNorm (and residual add + LlamaRMSNorm when RESID): the mean order.
template <typename T, int MODE, bool RESID>
struct MeanP {
  T* out; T* res; const T* x; const T* w; i64 cols; float eps;
  bool al, wal;  // rows (x, out, residual) / weight aligned for vector accesses
  typedef MeanS S;
  typedef float Prm;
  static constexpr bool kTail = true;  // VEC rows with cols % 4 != 0 have a tail
  KZ_DEV static S ident() { return S{0.0f, 0.0f, 0.0f, 0.0f}; }
  // element h of unit item k (VEC: slot = the element's index in the vector; else k & 3)
  template <bool VEC> KZ_DEV static void push(S& s, float h, int slot) {
    const float q = __fmul_rn(h, h);
    if (slot == 0) s.a0 = __fadd_rn(s.a0, q);
    else if (slot == 1) s.a1 = __fadd_rn(s.a1, q);
    else if (slot == 2) s.a2 = __fadd_rn(s.a2, q);
    else s.a3 = __fadd_rn(s.a3, q);
  }
  KZ_DEV static S fold(S s) { s.a0 = __fadd_rn(__fadd_rn(__fadd_rn(s.a0, s.a1), s.a2), s.a3); return s; }
  template <bool VEC> KZ_DEV static S comb(S own, S other) { own.a0 = __fadd_rn(own.a0, other.a0); return own; }
  KZ_DEV static S shfl(S s, int off) { s.a0 = kz_shfl(s.a0, off); return s; }
  KZ_DEV static S bcast(S s) { s.a0 = __shfl_sync(0xffffffffu, s.a0, 0); return s; }
  template <bool VEC> KZ_DEV Prm prm(S s) const {
    return rsqrtf(__fadd_rn(__fmul_rn(s.a0, __fdiv_rn(1.0f, (float)cols)), eps));
  }
  // first read of a unit: fused add writes the residual here
  template <bool VEC> KZ_DEV void load(Un<T, VEC>& u, i64 row, i64 e) const {
    u.ld(x + row * cols + e, al);
    if constexpr (RESID) {
      Un<T, VEC> r;
      r.ld(res + row * cols + e, al);
#pragma unroll
      for (int i = 0; i < Un<T, VEC>::N; ++i) u.set(i, __fadd_rn(u.f(i), r.f(i)));
      u.st(res + row * cols + e, al);
    }
  }
  // second read (streamed rows): the values the statistics saw
  template <bool VEC> KZ_DEV void reload(Un<T, VEC>& u, i64 row, i64 e) const {
    if constexpr (RESID) u.ld(res + row * cols + e, al);
    else u.ld(x + row * cols + e, al);
  }
  template <bool VEC> KZ_DEV void store(const Un<T, VEC>& u, i64 row, i64 e, Prm r) const {
    Un<T, VEC> wv, y;
    wv.ld(w + e, wal);
#pragma unroll
    for (int i = 0; i < Un<T, VEC>::N; ++i) {
      const float h = u.f(i), wf = wv.f(i);
      float o;
      if constexpr (MODE == KZ_LLAMA) o = __fmul_rn(wf, KT<T>::rnd(__fmul_rn(h, r)));
      else if constexpr (MODE == KZ_GEMMA) o = __fmul_rn(__fmul_rn(h, r), __fadd_rn(1.0f, wf));
      else o = __fmul_rn(__fmul_rn(h, r), wf);
      y.set(i, o);
    }
    y.st(out + row * cols + e, al);
  }
};

// nn.LayerNorm (TORCH = false) and F.rms_norm (TORCH = true): the layer-norm order.
template <typename T, bool TORCH>
struct LnP {
  T* out; const T* x; const T* w; const T* b; i64 cols; float eps;
  bool al, wal;
  typedef WelS S;
  struct Prm { float mean, rstd; };
  static constexpr bool kTail = false;
  KZ_DEV static S ident() { return S{0.0f, 0.0f, 0.0f}; }
  template <bool VEC> KZ_DEV static void push(S& s, float h, int) {
    if constexpr (VEC && TORCH) {  // _fused_rms_norm, vectorized: sum of fma(x, x, .)
      s.m2 = fmaf(h, h, s.m2);
    } else if constexpr (VEC) {    // WelfordDataLN online update
      const float d = __fsub_rn(h, s.mean);
      s.n = __fadd_rn(s.n, 1.0f);
      const float m = fmaf(d, __fdiv_rn(1.0f, s.n), s.mean);
      s.m2 = fmaf(d, __fsub_rn(h, m), s.m2);
      s.mean = m;
    } else {                       // WelfordOps::reduce
      s.n = __fadd_rn(s.n, 1.0f);
      const float d = __fsub_rn(h, s.mean);
      s.mean = __fadd_rn(s.mean, __fdiv_rn(d, s.n));
      s.m2 = fmaf(d, __fsub_rn(h, s.mean), s.m2);
    }
  }
  KZ_DEV static S fold(S s) { return s; }
  template <bool VEC> KZ_DEV static S comb(S own, S other) {
    if constexpr (VEC && TORCH) {
      own.m2 = __fadd_rn(own.m2, other.m2);
      return own;
    } else if constexpr (VEC) {    // cuWelfordCombine(own, other): other is the A side
      S r;
      r.n = __fadd_rn(other.n, own.n);
      if (r.n > 0.0f) {
        const float c = __fdiv_rn(1.0f, r.n);
        const float na = __fmul_rn(other.n, c), nb = __fmul_rn(own.n, c);
        const float d = __fsub_rn(own.mean, other.mean);
        r.mean = fmaf(na, other.mean, __fmul_rn(nb, own.mean));
        r.m2 = fmaf(__fmul_rn(__fmul_rn(d, d), other.n), nb, __fadd_rn(other.m2, own.m2));
      } else {
        r.mean = 0.0f;
        r.m2 = 0.0f;
      }
      return r;
    } else {                       // WelfordOps::combine(own, other)
      if (own.n == 0.0f) return other;
      if (other.n == 0.0f) return own;
      const float d = __fsub_rn(other.mean, own.mean);
      S r;
      r.n = __fadd_rn(own.n, other.n);
      const float nb = __fdiv_rn(other.n, r.n);
      r.mean = fmaf(d, nb, own.mean);
      r.m2 = fmaf(__fmul_rn(__fmul_rn(d, d), own.n), nb, __fadd_rn(own.m2, other.m2));
      return r;
    }
  }
  KZ_DEV static S shfl(S s, int off) {
    s.mean = kz_shfl(s.mean, off); s.m2 = kz_shfl(s.m2, off); s.n = kz_shfl(s.n, off);
    return s;
  }
  KZ_DEV static S bcast(S s) {
    s.mean = __shfl_sync(0xffffffffu, s.mean, 0);
    s.m2 = __shfl_sync(0xffffffffu, s.m2, 0);
    s.n = __shfl_sync(0xffffffffu, s.n, 0);
    return s;
  }
  template <bool VEC> KZ_DEV Prm prm(S s) const {
    Prm q;
    if constexpr (TORCH) {
      q.mean = 0.0f;
      if constexpr (VEC) q.rstd = rsqrtf(__fadd_rn(__fdiv_rn(s.m2, (float)cols), eps));
      else q.rstd = rsqrtf(__fadd_rn(fmaf(s.mean, s.mean, __fdiv_rn(s.m2, s.n)), eps));
    } else {
      q.mean = s.mean;
      q.rstd = rsqrtf(__fadd_rn(__fdiv_rn(s.m2, s.n), eps));
    }
    return q;
  }
  template <bool VEC> KZ_DEV void load(Un<T, VEC>& u, i64 row, i64 e) const { u.ld(x + row * cols + e, al); }
  template <bool VEC> KZ_DEV void reload(Un<T, VEC>& u, i64 row, i64 e) const { u.ld(x + row * cols + e, al); }
  template <bool VEC> KZ_DEV void store(const Un<T, VEC>& u, i64 row, i64 e, Prm q) const {
    Un<T, VEC> wv, y;
    wv.ld(w + e, wal);
    if constexpr (TORCH) {
#pragma unroll
      for (int i = 0; i < Un<T, VEC>::N; ++i) y.set(i, __fmul_rn(__fmul_rn(u.f(i), q.rstd), wv.f(i)));
    } else {
      Un<T, VEC> bv;
      bv.ld(b + e, wal);
#pragma unroll
      for (int i = 0; i < Un<T, VEC>::N; ++i)
        y.set(i, fmaf(__fmul_rn(__fsub_rn(u.f(i), q.mean), q.rstd), wv.f(i), bv.f(i)));
    }
    y.st(out + row * cols + e, al);
  }
};

// ---- the row engine ------------------------------------------------------------------------------
// G threads per row (blockDim.x; G > 32 only with blockDim.y == 1), L lanes per thread. The
// units of a row: VEC ? cols / 4 : cols. Thread g takes units g + gs*c, c = 0, 1, ... (gs = G,
// or bw < 32 for the mean order's shortest rows: threads g >= gs then hold no unit and their
// lane states stay empty, which adds +0 to sums of squares and changes no tree).

// The trees: every lane-warp offsets 16 .. 1 (shfl_down: lanes past the warp keep their own
// value and never feed lane 0), then the W = G*L/32 lane-warp results, offsets W/2 .. 1.
// Returns the row's state in every thread of the group.
template <class P, bool VEC, int G, int L>
KZ_DEV typename P::S kz_reduce(typename P::S (&st)[L], typename P::S* sh) {
  typedef typename P::S S;
#pragma unroll
  for (int j = 0; j < L; ++j) {
    st[j] = P::fold(st[j]);
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) st[j] = P::template comb<VEC>(st[j], P::shfl(st[j], off));
  }
  if constexpr (G == 32) {
    // lane 0 holds every lane-warp's result: lane-warp j in st[j]
#pragma unroll
    for (int off = L / 2; off >= 1; off >>= 1)
#pragma unroll
      for (int j = 0; j < off; ++j) st[j] = P::template comb<VEC>(st[j], st[j + off]);
    return P::bcast(st[0]);
  } else {
    // lane 0 of warp y of the group holds lane-warp y + (G/32)*j in st[j]
    constexpr int W = G * L / 32;
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
      for (int j = 0; j < L; ++j) sh[threadIdx.x / 32 + (G / 32) * j] = st[j];
    }
    __syncthreads();
    S v[W];
#pragma unroll
    for (int y = 0; y < W; ++y) v[y] = sh[y];
#pragma unroll
    for (int off = W / 2; off >= 1; off >>= 1)
#pragma unroll
      for (int y = 0; y < off; ++y) v[y] = P::template comb<VEC>(v[y], v[y + off]);
    __syncthreads();  // sh is free for the next row
    return v[0];
  }
}

template <class P, bool VEC, typename T>
KZ_DEV void kz_push(typename P::S& s, const Un<T, VEC>& u, int k) {
  if constexpr (VEC) {
#pragma unroll
    for (int i = 0; i < 4; ++i) P::template push<VEC>(s, u.f(i), i);
  } else {
    P::template push<VEC>(s, u.f(0), k & 3);
  }
}

// NU > 0: up to NU units per thread, all loaded before any is used, kept for the outputs.
// NU == 0: streamed in chunks of CH units (a multiple of L, so c % L is known at compile
// time), statistics first, then a second read for the outputs.
template <typename T, class P, bool VEC, int G, int L, int NU>
__device__ __noinline__ void kz_rows(const P p, i64 rows, int gs) {
  typedef typename P::S S;
  constexpr int N = VEC ? 4 : 1;
  constexpr int CH = L > 8 ? L : 8;
  __shared__ S sh[G * L / 32];
  const int g = threadIdx.x;
  const i64 nun = VEC ? p.cols / 4 : p.cols;
  const i64 nc = g < gs && g < nun ? (nun - 1 - g) / gs + 1 : 0;
  const int tail = (P::kTail && VEC) ? (int)(p.cols & 3) : 0;  // mean order: lanes 0.. (= threads)
  const i64 te = 4 * nun + g;
  for (i64 row = (i64)blockIdx.x * blockDim.y + threadIdx.y; row < rows; row += (i64)gridDim.x * blockDim.y) {
    S st[L];
#pragma unroll
    for (int j = 0; j < L; ++j) st[j] = P::ident();
    Un<T, false> tu;
    if constexpr (NU > 0) {
      Un<T, VEC> u[NU];
#pragma unroll
      for (int c = 0; c < NU; ++c)
        if (c < nc) p.template load<VEC>(u[c], row, (g + (i64)gs * c) * N);
#pragma unroll
      for (int c = 0; c < NU; ++c)
        if (c < nc) kz_push<P, VEC, T>(st[c % L], u[c], c / L);
      if (g < tail) {
        p.template load<false>(tu, row, te);
        P::template push<false>(st[0], tu.f(0), 0);
      }
      const typename P::Prm q = p.template prm<VEC>(kz_reduce<P, VEC, G, L>(st, sh));
#pragma unroll
      for (int c = 0; c < NU; ++c)
        if (c < nc) p.template store<VEC>(u[c], row, (g + (i64)gs * c) * N, q);
      if (g < tail) p.template store<false>(tu, row, te, q);
    } else {
      for (i64 c0 = 0; c0 < nc; c0 += CH) {
        Un<T, VEC> u[CH];
#pragma unroll
        for (int c = 0; c < CH; ++c)
          if (c0 + c < nc) p.template load<VEC>(u[c], row, (g + (i64)gs * (c0 + c)) * N);
#pragma unroll
        for (int c = 0; c < CH; ++c)
          if (c0 + c < nc) kz_push<P, VEC, T>(st[c % L], u[c], (int)((c0 + c) / L));
      }
      if (g < tail) {
        p.template load<false>(tu, row, te);
        P::template push<false>(st[0], tu.f(0), 0);
      }
      const typename P::Prm q = p.template prm<VEC>(kz_reduce<P, VEC, G, L>(st, sh));
      for (i64 c0 = 0; c0 < nc; c0 += CH) {
        Un<T, VEC> u[CH];
#pragma unroll
        for (int c = 0; c < CH; ++c)
          if (c0 + c < nc) p.template reload<VEC>(u[c], row, (g + (i64)gs * (c0 + c)) * N);
#pragma unroll
        for (int c = 0; c < CH; ++c)
          if (c0 + c < nc) p.template store<VEC>(u[c], row, (g + (i64)gs * (c0 + c)) * N, q);
      }
      if (g < tail) p.template store<false>(tu, row, te, q);
    }
  }
}

// Launch shapes (the manifests' [[launch]] rules):
//   mean order: cols <= 8160: one warp per row (block [32, 8]); cols > 8160: one 128-thread
//               block per row, 4 of the 512 lanes per thread.
//   layer-norm order: cols <= 2048: one warp per row (block [32, 8]; 4 lanes per thread when
//               cols % 4 == 0, else 16); larger: one 128-thread block per row (1 or 4 lanes).
// Any other block shape traps: the order fixes which lanes exist, the block must hold them.
KZ_DEV int kz_last_pow2(i64 n) { int p = 1; while (2 * (i64)p <= n && p < 32) p *= 2; return p; }

template <typename T, int MODE, bool RESID>
KZ_DEV void kz_mean_norm(T* out, T* res, const T* x, const T* w, i64 rows, i64 cols, float eps) {
  typedef MeanP<T, MODE, RESID> P;
  const bool al = cols % 4 == 0 && kz_al<T>(x) && kz_al<T>(out) && (!RESID || kz_al<T>(res));
  const P p{out, res, x, w, cols, eps, al, kz_al<T>(w)};
  // units kept in registers: 16 x 8 bytes (2-byte T) or 8 x 16 bytes (f32) per thread
  constexpr int NB = sizeof(T) == 2 ? 16 : 8;
  const i64 nv = cols / 4;
  if (blockDim.z != 1) __trap();
  if (cols <= 128) {
    if (blockDim.x != 32) __trap();
    kz_rows<T, P, false, 32, 1, 4>(p, rows, kz_last_pow2(cols));
  } else if (cols <= 8160) {  // 32 lanes: one warp per row
    if (blockDim.x != 32) __trap();
    if (nv <= 4 * 32) kz_rows<T, P, true, 32, 1, 4>(p, rows, 32);
    else if (nv <= NB * 32) kz_rows<T, P, true, 32, 1, NB>(p, rows, 32);
    else kz_rows<T, P, true, 32, 1, 0>(p, rows, 32);
  } else {  // 512 lanes: 128 threads per row, 4 lanes each
    if (blockDim.x != 128 || blockDim.y != 1) __trap();
    if (nv <= NB * 128) kz_rows<T, P, true, 128, 4, NB>(p, rows, 128);
    else kz_rows<T, P, true, 128, 4, 0>(p, rows, 128);
  }
}

template <typename T, bool TORCH>
KZ_DEV void kz_ln_order(T* out, const T* x, const T* w, const T* b, i64 rows, i64 cols, float eps) {
  typedef LnP<T, TORCH> P;
  const bool vec = cols % 4 == 0 && cols <= (1LL << 24);
  const bool al = vec && kz_al<T>(x) && kz_al<T>(out);
  const P p{out, x, w, b, cols, eps, al, kz_al<T>(w) && (TORCH || kz_al<T>(b))};
  if (blockDim.z != 1) __trap();
  if (blockDim.x == 32) {
    // the launch rules send only cols <= 2048 here: the row always fits in registers
    if (cols > 2048) __trap();
    if (vec) kz_rows<T, P, true, 32, 4, 16>(p, rows, 32);
    else kz_rows<T, P, false, 32, 16, 64>(p, rows, 32);
  } else if (blockDim.x == 128 && blockDim.y == 1) {
    if (vec) {
      if (cols <= 16 * 512) kz_rows<T, P, true, 128, 1, 16>(p, rows, 128);
      else kz_rows<T, P, true, 128, 1, 0>(p, rows, 128);
    } else {
      if (cols <= 64 * 128) kz_rows<T, P, false, 128, 4, 64>(p, rows, 128);
      else kz_rows<T, P, false, 128, 4, 0>(p, rows, 128);
    }
  } else {
    __trap();
  }
}

// ---- entry points -----------------------------------------------------------------
#if !defined(KERNELIZE_DTYPE_F16) && !defined(KERNELIZE_DTYPE_F32)
extern "C" __global__ void __launch_bounds__(256, 3) rms_norm_torch_bf16(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, long long rows, long long cols, float eps) {
  kz_ln_order<__nv_bfloat16, true>(out, x, w, nullptr, rows, cols, eps);
}
#endif

#if !defined(KERNELIZE_DTYPE_BF16) && !defined(KERNELIZE_DTYPE_F32)
extern "C" __global__ void __launch_bounds__(256, 3) rms_norm_torch_f16(__half* out, const __half* x, const __half* w, long long rows, long long cols, float eps) {
  kz_ln_order<__half, true>(out, x, w, nullptr, rows, cols, eps);
}
#endif

#if !defined(KERNELIZE_DTYPE_BF16) && !defined(KERNELIZE_DTYPE_F16)
extern "C" __global__ void __launch_bounds__(256, 2) rms_norm_torch_f32(float* out, const float* x, const float* w, long long rows, long long cols, float eps) {
  kz_ln_order<float, true>(out, x, w, nullptr, rows, cols, eps);
}
#endif
