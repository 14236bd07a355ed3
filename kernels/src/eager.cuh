
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
  static constexpr bool kTail = true;  // VEC rows with cols % 4 != 0 have a tail (kz_rows: see there)
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
  int p = 1;
  while (2 * (i64)p <= n) p *= 2;
  return p;
}
KZ_DEV KzCfg kz_mean_cfg(i64 rows, i64 cols) {
  KzCfg c;
  c.vec = cols > 128;
  const i64 d0 = c.vec ? cols / 4 : cols;
  const int p0 = d0 < 512 ? kz_pow2_le(d0) : 512;
  const int p1 = rows < 512 ? kz_pow2_le(rows) : 512;
  c.bw = p0 < 32 ? p0 : 32;
  c.bh = p1 < 512 / c.bw ? p1 : 512 / c.bw;
  c.bw = p0 < 512 / c.bh ? p0 : 512 / c.bh;
  const i64 threshold = 16 * c.bh < 256 ? 16 * c.bh : 256;  // values per thread needed to split
  c.split = (cols + c.bw - 1) / c.bw >= threshold;
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
  for (int o = K / 2; o >= 1; o >>= 1) {
    if (o < nwb) {
#pragma unroll
      for (int k = 0; k + o < K; ++k)
        if ((k & (nwb - 1)) < o) a[k] = __fadd_rn(a[k], a[k + o]);
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if ((k & (nwb - 1)) == 0) {  // warp-uniform
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) a[k] = __fadd_rn(a[k], kz_shfl(a[k], off));
    }
  }
  if (split) {
#pragma unroll
    for (int o = K / 2; o >= 1; o >>= 1) {
      if (o >= nwb) {
#pragma unroll
        for (int k = 0; k < o; ++k)
          if ((k & (nwb - 1)) == 0) a[k] = __fadd_rn(a[k], a[k + o]);
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
  constexpr int SB = 8;
  const int g = threadIdx.x;
  for (i64 c0 = 0; c0 < r.nc; c0 += SB) {
    Un<T, VEC> u[SB];
#pragma unroll
    for (int i = 0; i < SB; ++i)
      if (c0 + i < r.nc) p.template reload<VEC>(u[i], r.row, r.head + (g + (i64)G * (c0 + i)) * N);
#pragma unroll
    for (int i = 0; i < SB; ++i)
      if (c0 + i < r.nc) p.template store<VEC>(u[i], r.row, r.head + (g + (i64)G * (c0 + i)) * N, q);
  }
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
//   G = 128: one block per row, c.lanes = 512, L = 4: lane g + 128*j; the folded lane sums meet
//            in shared memory and warp 0 runs the trees (16 lanes per thread).
// Thread g's units are g + G*k (k < nc), unit k in lane k % L as its (k / L)-th unit. Its lanes
// are summed LG at a time (one pass over the row per LG lanes, so that at most 8 lanes of 4
// accumulators are live), SB units loaded before any is used; the outputs re-read the row
// (kz_mean_out).
template <typename T, class P, bool VEC, int G, int L>
__device__ __noinline__ void kz_mean_rows(const P p0, i64 rows, const KzCfg c, bool bal) {
  typedef typename P::S S;
  constexpr int N = VEC ? 4 : 1;
  constexpr int LG = L < 8 ? L : 8;  // lanes per pass
  constexpr int SB = 8;              // units loaded together: SB / LG units of each lane
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
    float a[L];  // the folded lane sums, filled from the end: each pass shifts them down by LG
#pragma unroll 1
    for (int pass = 0; pass < L / LG; ++pass) {
      S st[LG];
#pragma unroll
      for (int i = 0; i < LG; ++i) st[i] = P::ident();
      Un<T, false> e;
      if (pass == 0 && r.s > 0 && g >= r.s && g < 4) {  // the head: lanes s .. 3, first
        p.template load<false>(e, row, g - r.s);
        P::template push<false>(st[0], e.f(0), 0);
      }
      // units k = pass*LG + i + L*(m0 + b / LG), i = b % LG
      for (i64 m0 = 0; pass * LG + L * m0 < r.nc; m0 += SB / LG) {
        Un<T, VEC> u[SB];
#pragma unroll
        for (int b = 0; b < SB; ++b) {
          const i64 k = pass * LG + b % LG + (i64)L * (m0 + b / LG);
          if (k < r.nc) p.template load<VEC>(u[b], row, r.head + (g + (i64)G * k) * N);
        }
#pragma unroll
        for (int b = 0; b < SB; ++b) {
          const i64 k = pass * LG + b % LG + (i64)L * (m0 + b / LG);
          if (k < r.nc) kz_push<P, VEC, T>(st[b % LG], u[b], (int)(m0 + b / LG));
        }
      }
      if (pass == 0 && g < r.tail) {  // the tail: lanes 0 .., last
        p.template load<false>(e, row, p.cols - r.tail + g);
        P::template push<false>(st[0], e.f(0), 0);
      }
#pragma unroll
      for (int i = 0; i + LG < L; ++i) a[i] = a[i + LG];
#pragma unroll
      for (int i = 0; i < LG; ++i) a[L - LG + i] = P::fold(st[i]).a0;
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

// Launch shapes (the manifests' [[launch]] rules):
//   mean order: cols <= 8160: one warp per row (block [32, 8]); cols > 8160: one 128-thread
//               block per row (the config has 512 lanes there at every row count).
//   layer-norm order: cols <= 2048: one warp per row (block [32, 8]; 4 lanes per thread when
//               cols % 4 == 0, else 16); larger: one 128-thread block per row (1 or 4 lanes).
// Any other block shape traps: the order fixes which lanes exist, the block must hold them.
template <typename T, int MODE, bool RESID>
KZ_DEV void kz_mean_norm(T* out, T* res, const T* x, const T* w, i64 rows, i64 cols, float eps) {
  typedef MeanP<T, MODE, RESID> P;
  const bool bal = kz_al<T>(x) && kz_al<T>(out) && (!RESID || kz_al<T>(res));
  const P p{out, res, x, w, cols, eps, cols % 4 == 0 && bal, kz_al<T>(w), kz_mean_factor(rows, cols)};
  // units kept in registers: 16 x 8 bytes (2-byte T) or 8 x 16 bytes (f32) per thread
  constexpr int NB = sizeof(T) == 2 ? 16 : 8;
  const i64 nv = cols / 4;
  const KzCfg c = kz_mean_cfg(rows, cols);
  if (blockDim.z != 1) __trap();
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
      if (nv <= 4 * 32) kz_rows<T, P, true, 32, 1, 4>(p, rows, 32);
      else if (nv <= NB * 32) kz_rows<T, P, true, 32, 1, NB>(p, rows, 32);
      else kz_rows<T, P, true, 32, 1, 0>(p, rows, 32);
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
  } else {  // 512 lanes: one 128-thread block per row, 4 lanes per thread
    if (blockDim.x != 128 || blockDim.y != 1 || c.lanes != 512) __trap();
    if (c.bh == 16 && cols % 4 == 0) {
      if (nv <= NB * 128) kz_rows<T, P, true, 128, 4, NB>(p, rows, 128);
      else kz_rows<T, P, true, 128, 4, 0>(p, rows, 128);
    } else {
      kz_mean_rows<T, P, true, 128, 4>(p, rows, c, bal);
    }
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
