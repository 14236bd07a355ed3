
// ---- eager's reduction orders (eager.cuh: every row kernel that claims eager's statistics) -----
// Two row orders (reference-semantics.md):
//  * the mean order (HF LlamaRMSNorm, GemmaRMSNorm, residual add + norm): eager's Reduce.cuh at
//    the tensor's own (rows, cols) (kz_mean_cfg below): bw x bh lanes, 4 accumulators per lane,
//    4-vectors above 128 columns with a head (rows that start off a 16-byte boundary in eager's
//    f32 tensor) and a tail, halving trees within each warp-row then across them, times MeanOps'
//    factor. For 16 rows or more with aligned rows it is 32 lanes up to 8160 columns, 512 (16
//    warps of 32) above; bw = min(last_pow2(cols), 32) lanes of single elements up to 128.
//  * the layer-norm order (nn.LayerNorm, F.rms_norm): 128 lanes of 4-vectors when cols % 4 == 0,
//    else 512 lanes of single elements; one state per lane; each warp offsets 16..1, then the
//    warps. It never depends on rows.
// A row is handled by G threads (G = blockDim.x); thread g carries the L = LANES / G lanes
// g + G*j (j < L). A "unit" is one 4-vector (VEC) or one element; unit u belongs to lane
// u % LANES, so thread g handles units g + G*c (c = 0, 1, ...) and unit c goes to its state
// c % L: within a lane, units come in increasing order, as the order requires.
// kz_rows runs the configurations whose trees are "each lane-warp 16..1, then the lane-warps"
// (every layer-norm row; mean rows with 16 rows or more and aligned starts); kz_mean_rows runs
// every other mean-order configuration (fewer than 16 rows, misaligned row starts).

// Values of T as raw bits (units hold bits, not T): f widens the bits, bits rounds to T.
template <typename T> struct KB;
template <> struct KB<float> {
  static KZ_DEV float f(unsigned b) { return __uint_as_float(b); }
  static KZ_DEV unsigned bits(float v) { return __float_as_uint(v); }
  static KZ_DEV float rnd(float v) { return v; }
};
template <> struct KB<__nv_bfloat16> {
  static KZ_DEV float f(unsigned b) { return __uint_as_float(b << 16); }
  static KZ_DEV unsigned bits(float v) { return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(v)); }
  static KZ_DEV float rnd(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
};
template <> struct KB<__half> {
  static KZ_DEV float f(unsigned b) { return __half2float(__ushort_as_half((unsigned short)b)); }
  static KZ_DEV unsigned bits(float v) { return (unsigned)__half_as_ushort(__float2half_rn(v)); }
  static KZ_DEV float rnd(float v) { return __half2float(__float2half_rn(v)); }
};

// log2 of a power of two at compile time. The halving trees below loop over it (o = 1 << s),
// not over `o >>= 1`: the compiler does not unroll a loop that halves its counter, and then
// indexes the trees' register arrays at run time (a chain of selects per step: the tree of a
// decode row measured ~0.9 us on the H200, against ~0.1 us unrolled).
KZ_DEV constexpr int kz_clog2(int n) { return n <= 1 ? 0 : 1 + kz_clog2(n / 2); }

// 1/n for a compile-time n (the unrolled loops' constants): the compiler folds the quotient of two
// constants with IEEE round-to-nearest, the value __fdiv_rn(1.0f, n) computes at run time. Run-time
// divisions of constants sat between the Welford pushes of the decode paths (kz_direct's and
// ln_resid.cuh's), a dozen instructions and a branch each, 4 a unit (SASS of NVRTC 13 for sm_90:
// fused_add_layer_norm's bf16 decode row ran 37 divisions at NU = 8, 9 with this).
KZ_DEV constexpr float kz_recip(int n) { return 1.0f / (float)n; }

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
    if constexpr (sizeof(T) == 2) return KB<T>::f(VEC ? ((i & 1) ? (w[i >> 1] >> 16) : (w[i >> 1] & 0xffffu)) : w[0]);
    else return KB<T>::f(w[i]);
  }
  KZ_DEV void set(int i, float v) {  // round v to T
    const unsigned b = KB<T>::bits(v);
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
KZ_DEV bool kz_al16(const void* p) { return (reinterpret_cast<size_t>(p) & 15) == 0; }
KZ_DEV void kz_prefetch_l2(const void* p) {
#ifdef __CUDA_ARCH__
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// 16 bytes of T as EPC = 16 / sizeof(T) elements (raw bits; the staged engine's unit of traffic)
template <typename T> struct V16 {
  static constexpr int EPC = 16 / (int)sizeof(T);
  uint4 v;
  KZ_DEV unsigned bits(int i) const {
    const unsigned w = sizeof(T) == 2 ? ((i >> 1) == 0 ? v.x : (i >> 1) == 1 ? v.y : (i >> 1) == 2 ? v.z : v.w)
                                      : (i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w);
    if constexpr (sizeof(T) == 2) return (i & 1) ? (w >> 16) : (w & 0xffffu);
    else return w;
  }
  KZ_DEV float f(int i) const { return KB<T>::f(bits(i)); }
  KZ_DEV void set(int i, float x) {
    const unsigned b = KB<T>::bits(x);
    const int k = sizeof(T) == 2 ? i >> 1 : i;
    unsigned& w = k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
    if constexpr (sizeof(T) == 2) w = (i & 1) ? ((w & 0xffffu) | (b << 16)) : ((w & 0xffff0000u) | b);
    else w = b;
  }
};
template <typename T> KZ_DEV V16<T> kz_ld16(const T* p) { V16<T> r; r.v = *reinterpret_cast<const uint4*>(p); return r; }
template <typename T> KZ_DEV V16<T> kz_ldg16(const T* p) { V16<T> r; r.v = __ldg(reinterpret_cast<const uint4*>(p)); return r; }
template <typename T> KZ_DEV void kz_st16(T* p, const V16<T>& x) { *reinterpret_cast<uint4*>(p) = x.v; }

// The staged engine's shared memory (see "the staged engine" below): one static buffer for every
// staged path, 42 KB, so that with the other paths' arrays a block stays under 48 KB.
// (scripts/staged_tune.py measured the alternatives on the H200: a double-buffered tile, and
// 64-96 KB tiles in dynamic shared memory, were slower; see bench/RESULTS.md.)
#ifndef KZ_TILE_BYTES
#define KZ_TILE_BYTES 32768
#endif
#define KZ_LS_FLOATS 2048
#define KZ_INV_N 512
#define KZ_TILE_ROWS 8
__shared__ __align__(16) unsigned char kz_tile[KZ_TILE_BYTES];
__shared__ float kz_ls[KZ_LS_FLOATS];      // per lane: folded sums (mean order) or states (Welford)
__shared__ float kz_prm[2 * KZ_TILE_ROWS];  // per row of a tile: its two row parameters
__shared__ float kz_red[16 * KZ_TILE_ROWS];  // per lane-warp of a tile's rows: its tree result
__shared__ float kz_inv[KZ_INV_N];          // fl(1 / (i + 1)): WelfordDataLN's 1/n for n = i + 1

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
  float fac;     // MeanOps' factor: kz_mean_factor(rows, cols)
  typedef MeanS S;
  typedef float Prm;
  static constexpr bool kMean = true;  // the mean order (the staged engine's trees)
  static constexpr bool kTail = true;  // VEC rows with cols % 4 != 0 have a tail (kz_rows: see there)
  static constexpr bool kInv = false;  // the staged lanes need no 1/n
  KZ_DEV static S ident() { return S{0.0f, 0.0f, 0.0f, 0.0f}; }
  // element h of unit item k (VEC: slot = the element's index in the vector; else k & 3)
  template <bool VEC> KZ_DEV static void push(S& s, float h, int slot) {
    const float q = __fmul_rn(h, h);
    if (slot == 0) s.a0 = __fadd_rn(s.a0, q);
    else if (slot == 1) s.a1 = __fadd_rn(s.a1, q);
    else if (slot == 2) s.a2 = __fadd_rn(s.a2, q);
    else s.a3 = __fadd_rn(s.a3, q);
  }
  KZ_DEV static void push_staged(S& s, float h, int slot, float) { push<true>(s, h, slot); }
  KZ_DEV static float inv_at(i64) { return 0.0f; }
  KZ_DEV static float inv_tab(int) { return 0.0f; }
  KZ_DEV static S fold(S s) { s.a0 = __fadd_rn(__fadd_rn(__fadd_rn(s.a0, s.a1), s.a2), s.a3); return s; }
  template <bool VEC> KZ_DEV static S comb(S own, S other) { own.a0 = __fadd_rn(own.a0, other.a0); return own; }
  KZ_DEV static S shfl(S s, int off) { s.a0 = kz_shfl(s.a0, off); return s; }
  KZ_DEV static S bcast(S s) { s.a0 = __shfl_sync(0xffffffffu, s.a0, 0); return s; }
  template <bool VEC> KZ_DEV Prm prm(S s) const {
    return rsqrtf(__fadd_rn(__fmul_rn(s.a0, fac), eps));
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
      if constexpr (MODE == KZ_LLAMA) o = __fmul_rn(wf, KB<T>::rnd(__fmul_rn(h, r)));
      else if constexpr (MODE == KZ_GEMMA) o = __fmul_rn(__fmul_rn(h, r), __fadd_rn(1.0f, wf));
      else o = __fmul_rn(__fmul_rn(h, r), wf);
      y.set(i, o);
    }
    y.st(out + row * cols + e, al);
  }
  // the staged engine: EPC outputs from 16 bytes of h at column col (16-byte aligned weight)
  // the weight's 16 bytes at column col (kz_stage_out_rows: loaded once for a tile's rows)
  struct Wt { V16<T> w; };
  KZ_DEV Wt wld(i64 col) const { return Wt{kz_ldg16(w + col)}; }
  KZ_DEV V16<T> out16(const V16<T>& h, i64 col, Prm r) const { return out16w(h, wld(col), r); }
  KZ_DEV V16<T> out16w(const V16<T>& h, const Wt& wt, Prm r) const {
    const V16<T>& wv = wt.w;
    V16<T> y;
#pragma unroll
    for (int i = 0; i < V16<T>::EPC; ++i) {
      const float hf = h.f(i), wf = wv.f(i);
      float o;
      if constexpr (MODE == KZ_LLAMA) o = __fmul_rn(wf, KB<T>::rnd(__fmul_rn(hf, r)));
      else if constexpr (MODE == KZ_GEMMA) o = __fmul_rn(__fmul_rn(hf, r), __fadd_rn(1.0f, wf));
      else o = __fmul_rn(__fmul_rn(hf, r), wf);
      y.set(i, o);
    }
    return y;
  }
  // the weight's lines that thread t of nt reads in the outputs, to L2 (before the first tile)
  KZ_DEV void prefetch_cols(int t, int nt) const {
    for (i64 c = (i64)t * (128 / sizeof(T)); c < cols; c += (i64)nt * (128 / sizeof(T))) kz_prefetch_l2(w + c);
  }
  KZ_DEV static void put(float* d, Prm q) { d[0] = q; }
  KZ_DEV static Prm get(const float* d) { return d[0]; }
};

// nn.LayerNorm (TORCH = false) and F.rms_norm (TORCH = true): the layer-norm order.
template <typename T, bool TORCH>
struct LnP {
  T* out; const T* x; const T* w; const T* b; i64 cols; float eps;
  bool al, wal;
  typedef WelS S;
  struct Prm { float mean, rstd; };
  static constexpr bool kMean = false;
  static constexpr bool kTail = false;
  static constexpr bool kInv = !TORCH;  // WelfordDataLN's 1/n in the staged lanes
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
  // The staged engine's push of a 4-vector element: as push<true>, with WelfordDataLN's 1/n given
  // (inv_at: the same IEEE quotient fl(1/n), from kz_inv where n is small). n is the element's
  // count within its lane, known from its position, so the table is read off the data's path.
  KZ_DEV static void push_staged(S& s, float h, int slot, float inv) {
    if constexpr (TORCH) {
      push<true>(s, h, slot);
    } else {
      const float d = __fsub_rn(h, s.mean);
      s.n = __fadd_rn(s.n, 1.0f);
      const float m = fmaf(d, inv, s.mean);
      s.m2 = fmaf(d, __fsub_rn(h, m), s.m2);
      s.mean = m;
    }
  }
  // 1/n for the n-th element (n = k + 1) of a lane; inv_tab: k < KZ_INV_N
  KZ_DEV static float inv_tab(int k) {
    if constexpr (TORCH) return 0.0f;
    else return kz_inv[k];
  }
  KZ_DEV static float inv_at(i64 k) {
    if constexpr (TORCH) return 0.0f;
    else return k < KZ_INV_N ? kz_inv[k] : __fdiv_rn(1.0f, (float)(k + 1));
  }
  // the weight's (and bias's) 16 bytes at column col
  struct Wt { V16<T> w, b; };
  KZ_DEV Wt wld(i64 col) const {
    Wt t;
    t.w = kz_ldg16(w + col);
    if constexpr (!TORCH) t.b = kz_ldg16(b + col);
    return t;
  }
  KZ_DEV V16<T> out16(const V16<T>& h, i64 col, Prm q) const { return out16w(h, wld(col), q); }
  KZ_DEV V16<T> out16w(const V16<T>& h, const Wt& wt, Prm q) const {
    const V16<T>& wv = wt.w;
    V16<T> y;
    if constexpr (TORCH) {
#pragma unroll
      for (int i = 0; i < V16<T>::EPC; ++i) y.set(i, __fmul_rn(__fmul_rn(h.f(i), q.rstd), wv.f(i)));
    } else {
      const V16<T>& bv = wt.b;
#pragma unroll
      for (int i = 0; i < V16<T>::EPC; ++i)
        y.set(i, fmaf(__fmul_rn(__fsub_rn(h.f(i), q.mean), q.rstd), wv.f(i), bv.f(i)));
    }
    return y;
  }
  KZ_DEV void prefetch_cols(int t, int nt) const {
    for (i64 c = (i64)t * (128 / sizeof(T)); c < cols; c += (i64)nt * (128 / sizeof(T))) {
      kz_prefetch_l2(w + c);
      if constexpr (!TORCH) kz_prefetch_l2(b + c);
    }
  }
  KZ_DEV static void put(float* d, Prm q) { d[0] = q.mean; d[1] = q.rstd; }
  KZ_DEV static Prm get(const float* d) { Prm q; q.mean = d[0]; q.rstd = d[1]; return q; }
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
  // Loops, not unrolled: each comb of the layer-norm order is a Welford step with a division, and
  // every unrolled copy costs NVRTC time (issue 29); these are the rare rows' trees (kz_rows).
#pragma unroll 1
  for (int j = 0; j < L; ++j) {
    st[j] = P::fold(st[j]);
#pragma unroll
    for (int s = 4; s >= 0; --s) st[j] = P::template comb<VEC>(st[j], P::shfl(st[j], 1 << s));
  }
  if constexpr (G == 32) {
    // lane 0 holds every lane-warp's result: lane-warp j in st[j]
#pragma unroll 1
    for (int s = kz_clog2(L) - 1; s >= 0; --s)
#pragma unroll 1
      for (int j = 0; j < (1 << s); ++j) st[j] = P::template comb<VEC>(st[j], st[j + (1 << s)]);
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
#pragma unroll 1
    for (int s = kz_clog2(W) - 1; s >= 0; --s)
#pragma unroll 1
      for (int y = 0; y < (1 << s); ++y) v[y] = P::template comb<VEC>(v[y], v[y + (1 << s)]);
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

// The streamed rows' units (kz_rows with NU == 0, kz_mean_rows, kz_mean_out): a thread's unit k
// starts at element e0 + stride * k of its row. B = VEC ? 4 : 1 units are loaded before any is used
// (4-vectors: enough loads in flight; single elements: one, the shortest code), the loops around
// them not unrolled: these rows are rare, and every unrolled copy costs NVRTC time (issue 29).

// Lane j's units k = j, j + L, ... (k < nc) pushed into s in increasing order, the (k / L)-th
// of the lane as such.
template <typename T, class P, bool VEC>
KZ_DEV void kz_lane_push(const P& p, typename P::S& s, i64 row, i64 e0, i64 stride, int j, int L, i64 nc) {
  constexpr int B = VEC ? 4 : 1;
#pragma unroll 1
  for (i64 k0 = j; k0 < nc; k0 += (i64)L * B) {
    Un<T, VEC> u[B];
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (k0 + (i64)L * b < nc) p.template load<VEC>(u[b], row, e0 + stride * (k0 + (i64)L * b));
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (k0 + (i64)L * b < nc) kz_push<P, VEC, T>(s, u[b], (int)(k0 / L) + b);
  }
}

// The outputs of units 0 .. nc-1 (the row read again).
template <typename T, class P, bool VEC>
KZ_DEV void kz_units_out(const P& p, i64 row, i64 e0, i64 stride, i64 nc, const typename P::Prm& q) {
  constexpr int B = VEC ? 4 : 1;
#pragma unroll 1
  for (i64 k0 = 0; k0 < nc; k0 += B) {
    Un<T, VEC> u[B];
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (k0 + b < nc) p.template reload<VEC>(u[b], row, e0 + stride * (k0 + b));
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (k0 + b < nc) p.template store<VEC>(u[b], row, e0 + stride * (k0 + b), q);
  }
}

// NU > 0: up to NU units per thread, all loaded before any is used, kept for the outputs.
// NU == 0: streamed, one lane at a time (statistics first, then a second read for the outputs).
template <typename T, class P, bool VEC, int G, int L, int NU>
__device__ __noinline__ void kz_rows(const P p, i64 rows, int gs) {
  typedef typename P::S S;
  constexpr int N = VEC ? 4 : 1;
  __shared__ S sh[G * L / 32];
  const int g = threadIdx.x;
  const i64 nun = VEC ? p.cols / 4 : p.cols;
  const i64 nc = g < gs && g < nun ? (nun - 1 - g) / gs + 1 : 0;
  // The mean order's tail (cols % 4 elements to lanes 0..): empty in every row kz_mean_norm
  // sends here (cols % 4 == 0 with VEC); kept so that the code of these paths stays what it was.
  const int tail = (P::kTail && VEC) ? (int)(p.cols & 3) : 0;
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
      // Lane by lane: one pass over the thread's units per lane, the lane's state in registers
      // (kz_lane_push; a lane's units in increasing order, as above).
#pragma unroll 1
      for (int j = 0; j < L; ++j) {
        S s = P::ident();
        kz_lane_push<T, P, VEC>(p, s, row, (i64)g * N, (i64)gs * N, j, L, nc);
        st[j] = s;
      }
      if (g < tail) {
        p.template load<false>(tu, row, te);
        P::template push<false>(st[0], tu.f(0), 0);
      }
      const typename P::Prm q = p.template prm<VEC>(kz_reduce<P, VEC, G, L>(st, sh));
      kz_units_out<T, P, VEC>(p, row, (i64)g * N, (i64)gs * N, nc, q);
      if (g < tail) p.template store<false>(tu, row, te, q);
    }
  }
}

// ---- the mean order at every (rows, cols) --------------------------------------------------------
// Eager's h.pow(2).mean(-1) (Reduce.cuh, docs/eager-order.md section (a)) picks its block from the
// tensor's rows and cols. kz_mean_cfg is setReduceConfig<float, float, vt0 = 4, input_vec_size = 4>
// for a contiguous [rows, cols] f32 tensor: the block (bw, bh), whether the bh warp-rows split a
// row (split), and the lanes that share a row (split ? bw * bh : bw). Rows >= 16 (whenever cols
// >= 32) always give bw = 32, bh = 16: 32 lanes, or 512 (split) when cols > 8160. Rows 1, 2-3,
// 4-7 and 8-15 give bh = 1, 2, 4, 8 and bw up to 512 / bh.
// The block between the BEGIN and END lines is plain C++ (python/tests/test_mean_order_on_cpu.py
// compiles it on the CPU and checks it against scripts/eager_order.py's reduce_config).
// BEGIN kz_mean_cfg
struct KzCfg {
  int bw, bh;   // Reduce.cuh's block (block_width, block_height)
  int lanes;    // lanes that share one row: split ? bw * bh : bw
  bool vec;     // cols > 128: 4-vectors (input_vectorized_thread_reduce_impl)
  bool split;   // split_across_warps: the bh warp-rows share the row
};
KZ_DEV int kz_pow2_le(i64 n) {  // Reduce.cuh's last_pow2 for 1 <= n < 512 (1 for n < 1)
#ifdef __CUDA_ARCH__
  return n < 1 ? 1 : (int)(1ULL << (63 - __clzll(n)));  // one instruction, not a loop
#else
  int p = 1;
  while (2 * (i64)p <= n) p *= 2;
  return p;
#endif
}
KZ_DEV int kz_log2(int p) {  // p a power of two
#ifdef __CUDA_ARCH__
  return __ffs(p) - 1;
#else
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
#endif
}
KZ_DEV KzCfg kz_mean_cfg(i64 rows, i64 cols) {
  KzCfg c;
  c.vec = cols > 128;
  const i64 d0 = c.vec ? cols / 4 : cols;
  const int p0 = d0 < 512 ? kz_pow2_le(d0) : 512;
  const int p1 = rows < 512 ? kz_pow2_le(rows) : 512;
  // bw and bh are powers of two: shifts, not divisions (a 64-bit division is a long call on the
  // GPU, and at a decode row this prologue is on the critical path)
  c.bw = p0 < 32 ? p0 : 32;
  c.bh = p1 < (512 >> kz_log2(c.bw)) ? p1 : (512 >> kz_log2(c.bw));
  c.bw = p0 < (512 >> kz_log2(c.bh)) ? p0 : (512 >> kz_log2(c.bh));
  const i64 threshold = 16 * c.bh < 256 ? 16 * c.bh : 256;  // values per thread needed to split
  c.split = ((cols + c.bw - 1) >> kz_log2(c.bw)) >= threshold;
  c.lanes = c.split ? c.bw * c.bh : c.bw;
  return c;
}
// END kz_mean_cfg

// MeanOps' factor, float(rows) / float(rows * cols) (a float division on eager's host: fl(1/cols)
// while rows * cols is exact in f32).
KZ_DEV float kz_mean_factor(i64 rows, i64 cols) { return __fdiv_rn((float)rows, (float)(rows * cols)); }

// Reduce.cuh's trees over one row's folded lane sums, held by one warp: lane x + bw*y (x < bw;
// y < bh when split, else y = 0) is a[k] of thread x % 32, k = x / 32 + nwb*y (nwb = bw / 32
// lane-warps per warp-row; K = lanes / 32 in all). block_x_reduce: offsets bw/2 .. 32 (a[k] +=
// a[k + o] for k % nwb < o, o = nwb/2 .. 1, in each thread's registers), then shfl_down 16 .. 1
// on the first lane-warp of each warp-row; block_y_reduce (split only): the warp-rows' results,
// offsets bh/2 .. 1 (a[k] += a[k + o], o = K/2 .. nwb, k < o a multiple of nwb). Returns the
// row's sum in every thread of the warp.
template <int K>
KZ_DEV float kz_mean_tree(float (&a)[K], int nwb, bool split) {
#pragma unroll
  for (int s = kz_clog2(K) - 1; s >= 0; --s) {
    const int o = 1 << s;
    if (o < nwb) {
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (k + o < K && (k & (nwb - 1)) < o) a[k] = __fadd_rn(a[k], a[k + o]);
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if ((k & (nwb - 1)) == 0) {  // warp-uniform
#pragma unroll
      for (int s = 4; s >= 0; --s) a[k] = __fadd_rn(a[k], kz_shfl(a[k], 1 << s));
    }
  }
  if (split) {
#pragma unroll
    for (int s = kz_clog2(K) - 1; s >= 0; --s) {
      const int o = 1 << s;
      if (o >= nwb) {
#pragma unroll
        for (int k = 0; k < K / 2; ++k)
          if (k < o && (k & (nwb - 1)) == 0) a[k] = __fadd_rn(a[k], a[k + o]);
      }
    }
  }
  return __shfl_sync(0xffffffffu, a[0], 0);
}

// One row of the mean order under kz_mean_rows: row r of eager's f32 tensor starts
// s = (r*cols) % 4 floats past a 16-byte boundary. With VEC (cols > 128) its first head =
// (4 - s) % 4 elements go to lanes s .. 3 (accumulator 0, before anything else), then the
// 4-vectors from element head on (16-byte aligned in memory when the tensors' bases are, whatever
// cols is), vector u to lane u % lanes, element i into accumulator i, then the tail, the last
// (cols - head) % 4 elements, to lanes 0 .. (accumulator 0). Without VEC (cols <= 128) the units
// are single elements, the m-th of a lane into accumulator m % 4, and s = head = tail = 0.
struct KzRow {
  i64 row;
  int s, head, tail;  // thread g holds head element g - s when s <= g < 4 (s > 0)
  i64 nc;             // for the outputs: units g + G*k, k < nc
};

// The outputs of a row (a second read: the values the statistics saw).
template <typename T, class P, bool VEC, int G>
__device__ __noinline__ void kz_mean_out(const P p, const KzRow r, const typename P::Prm q) {
  constexpr int N = VEC ? 4 : 1;
  const int g = threadIdx.x;
  kz_units_out<T, P, VEC>(p, r.row, r.head + (i64)g * N, (i64)G * N, r.nc, q);
  if constexpr (VEC) {
    Un<T, false> e;
    if (r.s > 0 && g >= r.s && g < 4) {
      p.template reload<false>(e, r.row, g - r.s);
      p.template store<false>(e, r.row, g - r.s, q);
    }
    if (g < r.tail) {
      const i64 te = p.cols - r.tail + g;
      p.template reload<false>(e, r.row, te);
      p.template store<false>(e, r.row, te, q);
    }
  }
}

// The mean order for any config c (used where kz_rows's fixed trees are not eager's: fewer than
// 16 rows, and rows whose start is not 16-byte aligned in eager's f32 tensor):
//   G = 32: one warp per row, L = c.lanes / 32 lanes per thread (1 .. 16): lane g + 32*j.
//   G = 256: one block per row, c.lanes = 512, L = 2: lane g + 256*j; the folded lane sums meet
//            in shared memory and warp 0 runs the trees (16 lanes per thread).
// Thread g's units are g + G*k (k < nc), unit k in lane k % L as its (k / L)-th unit. Its lanes
// are summed one at a time (one pass over the thread's units per lane, so that the code holds
// one load and one push: these rows are rare, and every unrolled copy costs NVRTC time, issue
// 29); the outputs re-read the row (kz_mean_out).
template <typename T, class P, bool VEC, int G, int L>
__device__ __noinline__ void kz_mean_rows(const P p0, i64 rows, const KzCfg c, bool bal) {
  typedef typename P::S S;
  constexpr int N = VEC ? 4 : 1;
  const int g = threadIdx.x;
  const int nwb = c.bw / 32;
  for (i64 row = (i64)blockIdx.x * blockDim.y + threadIdx.y; row < rows; row += (i64)gridDim.x * blockDim.y) {
    P p = p0;
    KzRow r;
    r.row = row;
    r.s = VEC ? (int)((row * p.cols) & 3) : 0;
    r.head = r.s > 0 ? 4 - r.s : 0;
    if constexpr (VEC) {
      p.al = bal;                     // row start + head is a multiple of 4 elements
      p.wal = p0.wal && r.head == 0;  // the weight's column head + 4u is not, unless head == 0
    }
    const i64 m = p.cols - r.head;
    const i64 nun = VEC ? m / 4 : m;
    r.tail = VEC ? (int)(m & 3) : 0;
    r.nc = g < nun ? (nun - 1 - g) / G + 1 : 0;
    float a[L];  // the folded lane sums
#pragma unroll 1
    for (int j = 0; j < L; ++j) {
      S st = P::ident();
      Un<T, false> e;
      if (j == 0 && r.s > 0 && g >= r.s && g < 4) {  // the head: lanes s .. 3, first
        p.template load<false>(e, row, g - r.s);
        P::template push<false>(st, e.f(0), 0);
      }
      kz_lane_push<T, P, VEC>(p, st, row, r.head + (i64)g * N, (i64)G * N, j, L, r.nc);
      if (j == 0 && g < r.tail) {  // the tail: lanes 0 .., last
        p.template load<false>(e, row, p.cols - r.tail + g);
        P::template push<false>(st, e.f(0), 0);
      }
      a[j] = P::fold(st).a0;
    }
    float sum;
    if constexpr (G == 32) {
      sum = kz_mean_tree<L>(a, nwb, c.split);
    } else {
      __shared__ float sh[G * L];
      __shared__ float shr;
#pragma unroll
      for (int j = 0; j < L; ++j) sh[g + G * j] = a[j];
      __syncthreads();
      if (g < 32) {  // warp 0: lane g + 32*k in b[k]
        float b[G * L / 32];
#pragma unroll
        for (int k = 0; k < G * L / 32; ++k) b[k] = sh[g + 32 * k];
        const float t = kz_mean_tree<G * L / 32>(b, nwb, c.split);
        if (g == 0) shr = t;
      }
      __syncthreads();
      sum = shr;  // sh is rewritten only after this __syncthreads, shr after the next row's first
    }
    S st = P::ident();
    st.a0 = sum;
    kz_mean_out<T, P, VEC, G>(p, r, p.template prm<VEC>(st));
  }
}


// ---- the staged engine: rows through shared memory -----------------------------------------------
// Used where every row is a whole number of 16-byte chunks (cols * sizeof(T) % 16 == 0; cols >
// 128, 4-vector units) and every tensor is 16-byte aligned: every model width, and every row
// count. The whole block copies a tile of whole rows (or, when one row is larger than the buffer,
// a chunk of one row) into shared memory with cp.async, 16 bytes a thread at a time, so the loads
// in flight live in no register and the memory side runs at full rate whatever the arithmetic's
// order. Then the lanes of eager's order read their units from shared memory: exactly the lanes,
// units and accumulators of kz_rows / kz_mean_rows (unit u of a row to lane u % lanes, in
// increasing order within a lane; the mean order's config from kz_mean_cfg at the tensor's own
// rows and cols). The lane results meet in shared memory, one warp per row runs eager's trees
// (kz_mean_tree; kz_reduce for the layer-norm order), and every thread writes 16-byte chunks of
// outputs. The grid is persistent: tiles of up to KZ_TILE_ROWS rows go round the blocks.

// (Without __CUDA_ARCH__, i.e. the CPU harness of python/tests/test_mean_order_on_cpu.py: a plain
// 16-byte copy, the same bytes.)
KZ_DEV void kz_cp16(void* sdst, const void* gsrc) {
#ifdef __CUDA_ARCH__
  const unsigned sa = (unsigned)__cvta_generic_to_shared(sdst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gsrc) : "memory");
#else
  *reinterpret_cast<uint4*>(sdst) = *reinterpret_cast<const uint4*>(gsrc);
#endif
}
KZ_DEV void kz_cp_wait_all() {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
#endif
}
KZ_DEV int kz_tid() { return threadIdx.x + blockDim.x * threadIdx.y; }
KZ_DEV int kz_nthreads() { return blockDim.x * blockDim.y; }

// The index type of the staged loops over one tile (at most the tile buffer's elements): int for
// the plain norms, 64-bit for the fused add, which measured faster so on the H200
// (scripts/staged_tune.py; the layer norm the other way round).
#ifndef KZ_RESID_IDX64
#define KZ_RESID_IDX64 1
#endif
template <bool RESID> struct KzIdx { typedef int I; };
#if KZ_RESID_IDX64
template <> struct KzIdx<true> { typedef i64 I; };
#endif

// n elements of T from global src to shared dst (both 16-byte aligned, n * sizeof(T) % 16 == 0)
template <typename I, typename T> KZ_DEV void kz_stage(T* dst, const T* src, i64 n) {
  const int nt = kz_nthreads();
  const uint4* sp = reinterpret_cast<const uint4*>(src);
  uint4* dp = reinterpret_cast<uint4*>(dst);
  const I n16 = (I)(n * (i64)sizeof(T) / 16);
  for (I i = kz_tid(); i < n16; i += nt) kz_cp16(dp + i, sp + i);
}

// The fused add over n staged elements: s = round(x + residual) into x's tile, residual := s.
template <typename T> KZ_DEV void kz_stage_add(T* xs, const T* rs, T* res, i64 n) {
  constexpr int EPC = V16<T>::EPC;
  const int nt = kz_nthreads();
  for (i64 c = kz_tid(); c * EPC < n; c += nt) {
    V16<T> a = kz_ld16(xs + c * EPC);
    const V16<T> r = kz_ld16(rs + c * EPC);
#pragma unroll
    for (int i = 0; i < EPC; ++i) a.set(i, __fadd_rn(a.f(i), r.f(i)));
    kz_st16(xs + c * EPC, a);
    kz_st16(res + c * EPC, a);
  }
}

// The outputs of the n elements from flat element e0 of row row0 on (a whole number of 16-byte
// chunks, none across a row end): h from src (shared memory, or global for chunked rows), the
// row's parameters from kz_prm.
template <typename T, class P>
KZ_DEV void kz_stage_out(const P& p, const T* src, i64 e0, i64 n, i64 row0) {
  constexpr int EPC = V16<T>::EPC;
  const int nt = kz_nthreads();
  const unsigned ucols = (unsigned)p.cols;
  const unsigned c0 = (unsigned)(e0 - row0 * p.cols);
  for (i64 c = kz_tid(); c * EPC < n; c += nt) {
    const unsigned q = c0 + (unsigned)(c * EPC);  // < 2^31: a tile or a chunk of one row
    const unsigned rl = q / ucols;
    const V16<T> h = kz_ld16(src + c * EPC);
    kz_st16(p.out + e0 + c * EPC, p.out16(h, (i64)(q - rl * ucols), P::get(kz_prm + 2 * rl)));
  }
}

// The outputs of a tile of nr whole rows at src (shared memory) starting at row row0:
// thread t takes 16-byte column chunk c and the rows r0, r0 + rstep, .. of it, so that its weight
// (and bias) chunk is read once per tile and no element index is divided by cols. With fewer
// chunks per row than threads, the threads split the rows too (cpr chunks x nt / cpr row groups).
template <typename T, class P>
KZ_DEV void kz_stage_out_rows(const P& p, const T* src, i64 row0, int nr) {
  constexpr int EPC = V16<T>::EPC;
  const int nt = kz_nthreads(), t = kz_tid();
  const int cols = (int)p.cols;  // a whole row fits the tile buffer
  const int cpr = cols / EPC;
  const int groups = cpr >= nt ? 1 : nt / cpr;
  if (t >= groups * (cpr >= nt ? nt : cpr)) return;
  const int c0 = cpr >= nt ? t : t % cpr, r0 = cpr >= nt ? 0 : t / cpr;
  T* out = p.out + row0 * p.cols;
  for (int c = c0; c < cpr; c += (cpr >= nt ? nt : cpr)) {
    const int col = c * EPC;
    const typename P::Wt wt = p.wld(col);
    for (int rl = r0; rl < nr; rl += groups) {
      const V16<T> h = kz_ld16(src + rl * cols + col);
      kz_st16(out + (i64)rl * cols + col, p.out16w(h, wt, P::get(kz_prm + 2 * rl)));
    }
  }
}

// One lane's units u = lane + lanes*k (k = 0, 1, ...) of the nun units at xs; m0 = the lane's
// units before xs (chunked rows), so its m-th unit's element i is the lane's (4m + i + 1)-th.
// (The lane's first KZ_INV_N / 4 units read 1/n from the table without a test; in the layer-norm
// order a whole row in the tile has at most 32 units a lane, so only chunked rows go past them.)
template <typename I, typename T, class P>
KZ_DEV void kz_stage_lane(typename P::S& st, const T* xs, i64 nun, int lane, int lanes, i64 m0) {
  I m = (I)m0;
  const I nu = (I)nun;
  I u = lane;
  if constexpr (P::kInv) {
#pragma unroll 4
    for (; u < nu && m < KZ_INV_N / 4; u += lanes, ++m) {
      Un<T, true> un;
      un.ld(xs + 4 * u, true);
#pragma unroll
      for (int i = 0; i < 4; ++i) P::push_staged(st, un.f(i), i, P::inv_tab((int)(4 * m + i)));
    }
  }
#pragma unroll 4
  for (; u < nu; u += lanes, ++m) {
    Un<T, true> un;
    un.ld(xs + 4 * u, true);
#pragma unroll
    for (int i = 0; i < 4; ++i) P::push_staged(st, un.f(i), i, P::inv_at(4 * m + i));
  }
}

// The trees of the nr rows of a tile, from their lanes' states in kz_ls (row rl's lane l at
// rl * lanes + l), each row's parameters into kz_prm.
// Where eager's block is 32 lanes wide (bw == 32: the mean order from 16 rows on, and the
// layer-norm order), a tree is: each lane-warp (lanes 32k .. 32k + 31) shuffles 16 .. 1, then the
// lane-warp results are combined by halving (k with k + o, o = K/2 .. 1). The lane-warps of all
// the tile's rows are shared out over all the block's warps (kz_red holds their results), then
// one thread per row runs the halving: the same operations in the same order as one warp running
// kz_mean_tree / kz_reduce, which is what the other mean-order blocks (bw > 32, 1-15 rows) do.
template <int K, class P>
KZ_DEV void kz_stage_mean_trees(const P& p, int nr, const KzCfg c) {
  const int g = threadIdx.x & 31, warp = kz_tid() >> 5, nw = kz_nthreads() >> 5;
  if (K > 1 && c.bw == 32) {  // (K == 1: one lane-warp a row, nothing to share out)
    for (int pr = warp; pr < nr * K; pr += nw) {  // pr = rl * K + k: row rl's lane-warp k
      float v = kz_ls[pr * 32 + g];
#pragma unroll
      for (int s = 4; s >= 0; --s) v = __fadd_rn(v, kz_shfl(v, 1 << s));
      if (g == 0) kz_red[pr] = v;
    }
    __syncthreads();
    for (int rl = kz_tid(); rl < nr; rl += kz_nthreads()) {
      float a[K];
#pragma unroll
      for (int k = 0; k < K; ++k) a[k] = kz_red[rl * K + k];
#pragma unroll
      for (int s = kz_clog2(K) - 1; s >= 0; --s)  // K > 1 only with split (lanes = bw * bh)
#pragma unroll
        for (int k = 0; k < (1 << s); ++k) a[k] = __fadd_rn(a[k], a[k + (1 << s)]);
      typename P::S st = P::ident();
      st.a0 = a[0];
      P::put(kz_prm + 2 * rl, p.template prm<true>(st));
    }
    return;
  }
  for (int rl = warp; rl < nr; rl += nw) {  // one warp per row
    float a[K];
#pragma unroll
    for (int k = 0; k < K; ++k) a[k] = kz_ls[rl * 32 * K + g + 32 * k];
    typename P::S st = P::ident();
    st.a0 = kz_mean_tree<K>(a, c.bw / 32, c.split);
    if (g == 0) P::put(kz_prm + 2 * rl, p.template prm<true>(st));
  }
}
template <class P>
KZ_DEV void kz_stage_trees(const P& p, int nr, int lanes, const KzCfg c) {
  if constexpr (P::kMean) {
    if (lanes == 32) kz_stage_mean_trees<1>(p, nr, c);
    else if (lanes == 64) kz_stage_mean_trees<2>(p, nr, c);
    else if (lanes == 128) kz_stage_mean_trees<4>(p, nr, c);
    else if (lanes == 256) kz_stage_mean_trees<8>(p, nr, c);
    else kz_stage_mean_trees<16>(p, nr, c);
  } else {  // the layer-norm order: 128 lanes = 4 lane-warps a row (kz_reduce<P, true, 32, 4>)
    const int g = threadIdx.x & 31, warp = kz_tid() >> 5, nw = kz_nthreads() >> 5;
    for (int pr = warp; pr < nr * 4; pr += nw) {  // pr = rl * 4 + j: lanes 32j .. of row rl
      const float* d = kz_ls + 3 * (pr * 32 + g);
      typename P::S st;
      st.mean = d[0]; st.m2 = d[1]; st.n = d[2];
      st = P::fold(st);
#pragma unroll
      for (int s = 4; s >= 0; --s) st = P::template comb<true>(st, P::shfl(st, 1 << s));
      if (g == 0) {
        kz_red[3 * pr] = st.mean; kz_red[3 * pr + 1] = st.m2; kz_red[3 * pr + 2] = st.n;
      }
    }
    __syncthreads();
    for (int rl = kz_tid(); rl < nr; rl += kz_nthreads()) {
      typename P::S st[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float* d = kz_red + 3 * (rl * 4 + j);
        st[j].mean = d[0]; st[j].m2 = d[1]; st[j].n = d[2];
      }
#pragma unroll
      for (int s = 1; s >= 0; --s)
#pragma unroll
        for (int j = 0; j < (1 << s); ++j) st[j] = P::template comb<true>(st[j], st[j + (1 << s)]);
      P::put(kz_prm + 2 * rl, p.template prm<true>(st[0]));
    }
  }
}

// a lane's state into kz_ls at slot
template <class P> KZ_DEV void kz_ls_put(int slot, typename P::S st) {
  if constexpr (P::kMean) {
    kz_ls[slot] = P::fold(st).a0;
  } else {
    float* d = kz_ls + 3 * slot;
    d[0] = st.mean; d[1] = st.m2; d[2] = st.n;
  }
}

// The staged engine for one policy P: lanes per row (mean order: c.lanes; layer-norm order:
// 128), x = the statistics' input (for the fused add: x, then s in the residual).
template <typename T, class P, bool RESID>
__device__ __noinline__ void kz_staged(const P p, const T* x, T* res, i64 rows, const KzCfg c) {
  typedef typename KzIdx<RESID>::I I;
  const int lanes = P::kMean ? c.lanes : 128;
  const int lsh = __ffs(lanes) - 1;
  const int lsf = P::kMean ? 1 : 3;  // floats of kz_ls per lane
  const int t = kz_tid(), nt = kz_nthreads();
  const i64 cols = p.cols, nun = cols / 4;
  // one tensor's share of the tile buffer, in elements
  const i64 budget = (i64)KZ_TILE_BYTES / (i64)sizeof(T) / (RESID ? 2 : 1);
  T* xs = reinterpret_cast<T*>(kz_tile);
  T* rs = xs + budget;
  if constexpr (!P::kMean) {
    for (int i = t; i < KZ_INV_N; i += nt) kz_inv[i] = __fdiv_rn(1.0f, (float)(i + 1));
  }
  if (cols <= budget) {
    // tiles of whole rows
    i64 R = budget / cols;
    if (R > KZ_TILE_ROWS) R = KZ_TILE_ROWS;
    if (R > KZ_LS_FLOATS / (lanes * lsf)) R = KZ_LS_FLOATS / (lanes * lsf);
    const i64 share = (rows + gridDim.x - 1) / gridDim.x;  // few rows: spread them over blocks
    if (R > share) R = share;
    if (R < 1) R = 1;
    const i64 ntiles = (rows + R - 1) / R;
    bool first = true;
    for (i64 tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
      const i64 row0 = tile * R;
      const int nr = (int)(rows - row0 < R ? rows - row0 : R);
      const i64 n = (i64)nr * cols;
      __syncthreads();  // the previous tile's readers are done with the buffers
      kz_stage<I>(xs, x + row0 * cols, n);
      if constexpr (RESID) kz_stage<I>(rs, res + row0 * cols, n);
      if (first) p.prefetch_cols(t, nt);  // while the first tile loads
      first = false;
      kz_cp_wait_all();
      __syncthreads();
      if constexpr (RESID) {
        kz_stage_add(xs, rs, res + row0 * cols, n);
        __syncthreads();
      }
      for (int slot = t; slot < nr * lanes; slot += nt) {
        const int rl = slot >> lsh, lane = slot & (lanes - 1);  // lanes: a power of two
        typename P::S st = P::ident();
        kz_stage_lane<I, T, P>(st, xs + rl * cols, nun, lane, lanes, 0);
        kz_ls_put<P>(slot, st);
      }
      __syncthreads();
      kz_stage_trees<P>(p, nr, lanes, c);
      __syncthreads();
      kz_stage_out_rows<T, P>(p, xs, row0, nr);
    }
  } else {
    // one row at a time in chunks of cw elements (a whole number of lane rounds, so a unit's lane
    // is the same counted from the chunk or from the row); the outputs re-read the row (L2)
    const i64 cw = budget / (4 * lanes) * (4 * lanes);
    if (blockIdx.x < rows) p.prefetch_cols(t, nt);
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
      typename P::S st[4];  // lanes t + nt*j; lanes <= 512 and nt >= 128
#pragma unroll
      for (int j = 0; j < 4; ++j) st[j] = P::ident();
      for (i64 cs = 0; cs < cols; cs += cw) {
        const i64 n = cols - cs < cw ? cols - cs : cw;
        __syncthreads();
        kz_stage<I>(xs, x + row * cols + cs, n);
        if constexpr (RESID) kz_stage<I>(rs, res + row * cols + cs, n);
        kz_cp_wait_all();
        __syncthreads();
        if constexpr (RESID) {
          kz_stage_add(xs, rs, res + row * cols + cs, n);
          __syncthreads();
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (t + nt * j < lanes) kz_stage_lane<i64, T, P>(st[j], xs, n / 4, t + nt * j, lanes, cs / (4 * lanes));
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (t + nt * j < lanes) kz_ls_put<P>(t + nt * j, st[j]);
      __syncthreads();
      kz_stage_trees<P>(p, 1, lanes, c);
      __syncthreads();
      // global reads of what this block wrote (the residual) are ordered by the barrier
      kz_stage_out<T, P>(p, RESID ? (const T*)res + row * cols : x + row * cols, row * cols, cols, row);
    }
  }
}

// ---- the decode engine: one block per row, the row in registers ---------------------------------
// Used instead of the staged engine (same conditions: whole 16-byte chunks, aligned tensors) when
// every row has a block of its own (rows <= gridDim.x: decode steps and small batches) and a row
// is at most KZ_DC 16-byte chunks per thread. The same lanes, units, accumulators and trees as the
// staged engine, so the same bits; what differs is the latency of a row that has a whole block to
// itself: every thread loads its JC chunks of x (and residual) and of the weight (and bias) at
// once, into registers, before anything waits; where every lane has at most one unit (short
// rows, and 1 row up to 2048 columns) the lanes are summed from those registers, else the row
// goes through shared memory for eager's lanes to sum it in their order; one warp runs the tree;
// the outputs are computed from the registers. Everything here is inlined into the entry with
// JC and the tree's size known at compile time: a call that passes the arguments through the
// stack, or arrays the compiler cannot keep in registers, cost a round trip to L2 each, which
// at a decode row is most of the time (bench/decode_probe.py measured 3.6 us against 1.6 us).
#ifndef KZ_DC
#define KZ_DC 4
#endif
template <typename T> KZ_DEV bool kz_direct_fits(i64 cols) {
  return cols <= (i64)KZ_DC * kz_nthreads() * V16<T>::EPC;
}
// The mean order's tree over the row's lanes in kz_ls (K = lanes / 32 per thread of warp 0), as
// kz_stage_mean_trees's one-warp branch, with K and the lane-warps per warp-row (NWB = bw / 32)
// known at compile time: straight-line code (with them at run time the tree measured 3x longer);
// the row's parameter into kz_prm. Split is NWB < K (with NWB == K the y-trees are empty).
template <int K, int NWB, class P> KZ_DEV typename P::Prm kz_direct_tree(const P& p) {
  const int g = threadIdx.x & 31;
  float a[K];
#pragma unroll
  for (int k = 0; k < K; ++k) a[k] = kz_ls[g + 32 * k];
  typename P::S st = P::ident();
  st.a0 = kz_mean_tree<K>(a, NWB, NWB < K);
  return p.template prm<true>(st);
}
// (The dispatches compare ranges, not values, so that they stay compare-and-branch chains rather
// than a jump table read from the constant bank.)
template <int K, class P> KZ_DEV typename P::Prm kz_direct_tree_k(const P& p, int nwb) {
  if constexpr (K >= 2) {
    if (nwb <= 1) return kz_direct_tree<K, 1>(p);
  }
  if constexpr (K >= 4) {
    if (nwb <= 2) return kz_direct_tree<K, 2>(p);
  }
  if constexpr (K >= 8) {
    if (nwb <= 4) return kz_direct_tree<K, 4>(p);
  }
  if constexpr (K >= 16) {
    if (nwb <= 8) return kz_direct_tree<K, 8>(p);
  }
  return kz_direct_tree<K, K>(p);  // nwb >= K
}
// LATE (the mean order's entry): p0 comes without its factor and c0 is not the config; both are
// computed after the row's loads are issued, so that the loads' latency hides them (the factor's
// division and Reduce.cuh's config stood ahead of the first load, about 0.2 us at a decode row).
template <typename T, class P, bool RESID, bool LATE = false>
KZ_DEV void kz_direct(const P& p0, const T* x, T* res, i64 rows, const KzCfg& c0) {
  constexpr int EPC = V16<T>::EPC;
  constexpr int U = EPC / 4;  // 4-vector units per 16-byte chunk
  const int t = kz_tid(), nt = kz_nthreads();
  constexpr int JC = KZ_DC;             // chunks per thread (fewer rows: the rest predicated off)
  const int cpr = (int)(p0.cols / EPC);  // chunks of a row (<= JC * nt)
  const int nun = (int)(p0.cols / 4);    // units of a row
  T* xs = reinterpret_cast<T*>(kz_tile);
  if constexpr (P::kInv) {  // the layer-norm order (never LATE): 128 lanes
    if (nun > 128)
      for (int i = t; i < KZ_INV_N; i += nt) kz_inv[i] = __fdiv_rn(1.0f, (float)(i + 1));
  }
  P p = p0;
  KzCfg c = c0;
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const i64 base = row * p.cols;
    V16<T> h[JC], r[JC];
    typename P::Wt wt[JC];
#pragma unroll
    for (int j = 0; j < JC; ++j) {
      const int ch = t + nt * j;
      if (ch < cpr) {
        h[j] = kz_ld16(x + base + (i64)ch * EPC);
        wt[j] = p.wld((i64)ch * EPC);
        if constexpr (RESID) r[j] = kz_ld16(res + base + (i64)ch * EPC);
      }
    }
    if constexpr (LATE) {
      // here, between the loads and their first use (a warp issues in order): rows made opaque
      // with a memory clobber, so that the compiler neither hoists the factor and the config
      // above the loads nor sinks the loads below them
      i64 r_ = rows;
#ifdef __CUDA_ARCH__
      asm volatile("" : "+l"(r_) : : "memory");
#endif
      p.fac = kz_mean_factor(r_, p0.cols);
      c = kz_mean_cfg(r_, p0.cols);
    }
    if constexpr (RESID) {  // s = round(x + residual); residual := s; the statistics see s
#pragma unroll
      for (int j = 0; j < JC; ++j) {
        if (t + nt * j < cpr) {
#pragma unroll
          for (int i = 0; i < EPC; ++i) h[j].set(i, __fadd_rn(h[j].f(i), r[j].f(i)));
          kz_st16(res + base + (i64)(t + nt * j) * EPC, h[j]);
        }
      }
    }
    const int lanes = P::kMean ? c.lanes : 128;
    const bool own = nun <= lanes;  // unit u is lane u's only unit
    if (own) {  // the lane's one unit is in this thread's registers; lanes without a unit are empty
#pragma unroll
      for (int j = 0; j < JC; ++j) {
        if (t + nt * j < cpr) {
#pragma unroll
          for (int i = 0; i < U; ++i) {
            typename P::S st = P::ident();
#pragma unroll
            for (int e = 0; e < 4; ++e)
              P::push_staged(st, h[j].f(4 * i + e), e, P::kInv ? kz_recip(e + 1) : 0.0f);
            kz_ls_put<P>((t + nt * j) * U + i, st);
          }
        }
      }
      for (int l = nun + t; l < lanes; l += nt) kz_ls_put<P>(l, P::ident());
    } else {
#pragma unroll
      for (int j = 0; j < JC; ++j)
        if (t + nt * j < cpr) kz_st16(xs + (t + nt * j) * EPC, h[j]);
      __syncthreads();  // the row is in xs (and kz_inv is filled)
      for (int lane = t; lane < lanes; lane += nt) {
        typename P::S st = P::ident();
        kz_stage_lane<int, T, P>(st, xs, nun, lane, lanes, 0);
        kz_ls_put<P>(lane, st);
      }
    }
    __syncthreads();  // every lane's result is in kz_ls
    typename P::Prm q;
    if constexpr (P::kMean) {
      // every warp runs the row's tree itself (the same additions in the same order): the
      // parameter is in each thread's registers without a second barrier
      const int nwb = c.bw >> 5;
      if (lanes <= 32) q = kz_direct_tree_k<1>(p, nwb);
      else if (lanes <= 64) q = kz_direct_tree_k<2>(p, nwb);
      else if (lanes <= 128) q = kz_direct_tree_k<4>(p, nwb);
      else if (lanes <= 256) q = kz_direct_tree_k<8>(p, nwb);
      else q = kz_direct_tree_k<16>(p, nwb);
    } else {
      kz_stage_trees<P>(p, 1, lanes, c);  // the layer-norm order's 4 lane-warps (one barrier)
      __syncthreads();  // the row's parameters are in kz_prm
      q = P::get(kz_prm);
    }
#pragma unroll
    for (int j = 0; j < JC; ++j)
      if (t + nt * j < cpr) kz_st16(p.out + base + (i64)(t + nt * j) * EPC, p.out16w(h[j], wt[j], q));
    // kz_prm and kz_ls are rewritten only after every thread has read them (a block's last row
    // needs no barrier: nothing is rewritten after it)
    if (row + gridDim.x < rows) __syncthreads();
  }
}
// Launch shapes (the manifests' [[launch]] rules):
//   mean order: cols <= 8160: one warp per row (block [32, 8]); cols > 8160: one 256-thread
//               block per row (the config has 512 lanes there at every row count).
//   layer-norm order: cols <= 2048: one warp per row (block [32, 8]; 4 lanes per thread when
//               cols % 4 == 0, else 16); larger: one 128-thread block per row (1 or 4 lanes).
// Any other block shape traps: the order fixes which lanes exist, the block must hold them.
template <typename T, int MODE, bool RESID>
KZ_DEV void kz_mean_norm(T* out, T* res, const T* x, const T* w, i64 rows, i64 cols, float eps) {
  typedef MeanP<T, MODE, RESID> P;
  if (blockDim.z != 1) __trap();
  if (cols > 128 && (cols * (i64)sizeof(T)) % 16 == 0 && kz_al16(x) && kz_al16(out) && kz_al16(w) &&
      (!RESID || kz_al16(res)) && rows <= gridDim.x && kz_direct_fits<T>(cols)) {
    // the decode path first, its loads before the factor and the config (kz_direct's LATE);
    // 16-byte aligned tensors and whole 16-byte rows make `al` and `wal` true
    const P p0{out, res, x, w, cols, eps, true, true, 0.0f};
    kz_direct<T, P, RESID, true>(p0, x, res, rows, KzCfg{});
    return;
  }
  const bool bal = kz_al<T>(x) && kz_al<T>(out) && (!RESID || kz_al<T>(res));
  const P p{out, res, x, w, cols, eps, cols % 4 == 0 && bal, kz_al<T>(w), kz_mean_factor(rows, cols)};
  const KzCfg c = kz_mean_cfg(rows, cols);
  if (cols > 128 && (cols * (i64)sizeof(T)) % 16 == 0 && kz_al16(x) && kz_al16(out) && kz_al16(w) &&
      (!RESID || kz_al16(res))) {
    kz_staged<T, P, RESID>(p, x, res, rows, c);  // decode rows took the path above
    return;
  }
  // kz_rows: the configs of 16 rows and more with aligned row starts (cols <= 128 or cols % 4
  // == 0): 32 lanes (bw = min(last_pow2(cols), 32) when cols <= 128), or 512 lanes as 16 warps
  // of 32 (bw = 32, bh = 16). kz_mean_rows: every other config.
  if (cols <= 128) {
    if (blockDim.x != 32) __trap();
    if (c.lanes <= 32) kz_rows<T, P, false, 32, 1, 4>(p, rows, c.lanes);
    else if (c.lanes == 64) kz_mean_rows<T, P, false, 32, 2>(p, rows, c, bal);  // 1-15 rows
    else kz_mean_rows<T, P, false, 32, 4>(p, rows, c, bal);
  } else if (cols <= 8160) {  // one warp per row
    if (blockDim.x != 32) __trap();
    if (c.lanes == 32 && cols % 4 == 0) {
      kz_rows<T, P, true, 32, 1, 0>(p, rows, 32);
    } else if (c.lanes == 32) {  // rows that start off a 16-byte boundary (cols % 4 != 0)
      kz_mean_rows<T, P, true, 32, 1>(p, rows, c, bal);
    } else if (c.lanes == 64) {  // 1-15 rows
      kz_mean_rows<T, P, true, 32, 2>(p, rows, c, bal);
    } else if (c.lanes == 128) {
      kz_mean_rows<T, P, true, 32, 4>(p, rows, c, bal);
    } else if (c.lanes == 256) {
      kz_mean_rows<T, P, true, 32, 8>(p, rows, c, bal);
    } else {
      kz_mean_rows<T, P, true, 32, 16>(p, rows, c, bal);
    }
  } else {  // 512 lanes: one 256-thread block per row, 2 lanes per thread (g and g + 256)
    if (blockDim.x != 256 || blockDim.y != 1 || c.lanes != 512) __trap();
    if (c.bh == 16 && cols % 4 == 0) {
      kz_rows<T, P, true, 256, 2, 0>(p, rows, 256);
    } else {
      kz_mean_rows<T, P, true, 256, 2>(p, rows, c, bal);
    }
  }
}

// The layer-norm order's rows that neither the decode nor the staged engine takes (cols <= 128,
// rows that are not whole 16-byte chunks, tensors off a 16-byte boundary): streamed by kz_rows,
// one warp per row up to 2048 columns (128 or 512 lanes: 4 or 16 a thread), one 128-thread block
// above (1 or 4 lanes a thread). Shared by kz_ln_order and ln_resid.cuh's kz_ln_resid_wide.
template <typename T, class P>
KZ_DEV void kz_ln_rows(const P& p, i64 rows, bool vec) {
  if (blockDim.x == 32) {
    if (p.cols > 2048) __trap();  // the launch rules send only cols <= 2048 here
    if (vec) kz_rows<T, P, true, 32, 4, 0>(p, rows, 32);
    else kz_rows<T, P, false, 32, 16, 0>(p, rows, 32);
  } else if (blockDim.x == 128 && blockDim.y == 1) {
    if (vec) kz_rows<T, P, true, 128, 1, 0>(p, rows, 128);
    else kz_rows<T, P, false, 128, 4, 0>(p, rows, 128);
  } else {
    __trap();
  }
}

template <typename T, bool TORCH>
KZ_DEV void kz_ln_order(T* out, const T* x, const T* w, const T* b, i64 rows, i64 cols, float eps) {
  typedef LnP<T, TORCH> P;
  const bool vec = cols % 4 == 0 && cols <= (1LL << 24);
  const bool al = vec && kz_al<T>(x) && kz_al<T>(out);
  const P p{out, x, w, b, cols, eps, al, kz_al<T>(w) && (TORCH || kz_al<T>(b))};
  if (blockDim.z != 1) __trap();
  if (vec && cols > 128 && (cols * (i64)sizeof(T)) % 16 == 0 && kz_al16(x) && kz_al16(out) && kz_al16(w) &&
      (TORCH || kz_al16(b))) {
    if (rows <= gridDim.x && kz_direct_fits<T>(cols)) kz_direct<T, P, false>(p, x, nullptr, rows, KzCfg{});
    else kz_staged<T, P, false>(p, x, nullptr, rows, KzCfg{});
    return;
  }
  kz_ln_rows<T, P>(p, rows, vec);
}
