
// ---- residual add + nn.LayerNorm (fused_add_layer_norm) -------------------------------------------
// s = round(x + residual) (eager's add in T); residual := s; out = nn.LayerNorm of s in the
// layer-norm order (eager.cuh's LnP, the layer_norm kernel's arithmetic). GPT-2's
// `h = attn(ln_1(x)) + residual; ln_2(h)` as one launch for exact compile (docs/compile.md).
// Rows that have a block each take the decode path below (kz_ln_resid_direct); the staged
// engine adds the residual itself (kz_staged with RESID; kz_direct, after it, is reached by no
// width the decode path leaves); the row engine (rows that are not whole 16-byte chunks, misaligned tensors) reads each
// unit through `load`, which adds and writes the residual as the mean order's MeanP does, and
// re-reads the stored sum for the outputs of streamed rows.
template <typename T>
struct LnResP : LnP<T, false> {
  T* res;
  template <bool VEC> KZ_DEV void load(Un<T, VEC>& u, i64 row, i64 e) const {
    const i64 at = row * this->cols + e;
    u.ld(this->x + at, this->al);
    Un<T, VEC> r;
    r.ld(res + at, this->al);
#pragma unroll
    for (int i = 0; i < Un<T, VEC>::N; ++i) u.set(i, __fadd_rn(u.f(i), r.f(i)));
    u.st(res + at, this->al);
  }
  template <bool VEC> KZ_DEV void reload(Un<T, VEC>& u, i64 row, i64 e) const {
    u.ld(res + row * this->cols + e, this->al);
  }
};

// ---- the decode path: one block per row, a lane per thread, the tree's divisions off the data's path
// Rows of whole 16-byte chunks that have a block each (decode steps, small batches) and at most
// NU units per lane: thread t < 128 is lane t of the layer-norm order (128 lanes of 4-vectors)
// and loads its own units u = t + 128 c of x, residual, weight and bias at once, straight into
// registers (no shared-memory pass, one barrier in all); the lane's Welford chain runs over them
// in order; the trees are kz_reduce's (each warp's shuffles 16..1, then the four warps' states
// 2, 1). WelfordDataLN's combine divides 1 by the combined count: those counts depend only on
// the row's width and the lane (a lane holds 4 (q + [lane < rem]) elements, q, rem = nun / 128,
// nun % 128), so each level's 1/n is computed from them, off the data's path, as the same IEEE
// quotient. (Lanes whose value no later level reads get a meaningless 1/n: their results are
// never read, as in kz_reduce.)

// How many of the K lanes base, base + step, ... are below rem (lanes below rem hold one more unit)
KZ_DEV int kz_below(int rem, int base, int step, int k) {
  if (rem <= base) return 0;
  const int n = (rem - base + step - 1) / step;
  return n < k ? n : k;
}

// LnP<T, false>::comb<true> (cuWelfordCombine) with its 1/n given (inv = fl(1 / (own.n + other.n)))
KZ_DEV WelS kz_comb_inv(WelS own, WelS other, float inv) {
  WelS r;
  r.n = __fadd_rn(other.n, own.n);
  if (r.n > 0.0f) {
    const float na = __fmul_rn(other.n, inv), nb = __fmul_rn(own.n, inv);
    const float d = __fsub_rn(own.mean, other.mean);
    r.mean = fmaf(na, other.mean, __fmul_rn(nb, own.mean));
    r.m2 = fmaf(__fmul_rn(__fmul_rn(d, d), other.n), nb, __fadd_rn(other.m2, own.m2));
  } else {
    r.mean = 0.0f;
    r.m2 = 0.0f;
  }
  return r;
}

template <typename T, int NU>
KZ_DEV void kz_ln_resid_direct(const LnResP<T>& p, i64 rows) {
  typedef LnP<T, false> B;
  __shared__ WelS kz_lnr_sh[4];
  const i64 row = blockIdx.x;
  if (row >= rows) return;  // rows <= gridDim.x: a block has one row or none
  const int t = kz_tid(), g = t & 31, wp = t >> 5;
  const int nun = (int)(p.cols / 4), q = nun >> 7, rem = nun & 127;
  const i64 base = row * p.cols;
  WelS st = B::ident();
  Un<T, true> h[NU], wv[NU], bv[NU];
  if (t < 128) {
    Un<T, true> r[NU];
#pragma unroll
    for (int c = 0; c < NU; ++c) {
      const int u = t + 128 * c;
      if (u < nun) {
        h[c].ld(p.x + base + 4 * (i64)u, true);
        r[c].ld(p.res + base + 4 * (i64)u, true);
        wv[c].ld(p.w + 4 * (i64)u, true);
        bv[c].ld(p.b + 4 * (i64)u, true);
      }
    }
#pragma unroll
    for (int c = 0; c < NU; ++c) {
      const int u = t + 128 * c;
      if (u < nun) {  // s = round(x + residual); residual := s; the statistics see s
#pragma unroll
        for (int e = 0; e < 4; ++e) h[c].set(e, __fadd_rn(h[c].f(e), r[c].f(e)));
        h[c].st(p.res + base + 4 * (i64)u, true);
#pragma unroll
        for (int e = 0; e < 4; ++e) B::push_staged(st, h[c].f(e), e, kz_recip(4 * c + e + 1));
      }
    }
#pragma unroll
    for (int s = 4; s >= 0; --s) {  // offsets 16 .. 1: lane g (< o) holds the lanes = g mod 2o
      const int o = 1 << s, k = 16 >> s;
      const int own = q * k + kz_below(rem, 32 * wp + g, 2 * o, k);
      const int oth = q * k + kz_below(rem, 32 * wp + g + o, 2 * o, k);
      st = kz_comb_inv(st, B::shfl(st, o), __fdiv_rn(1.0f, (float)(4 * (own + oth))));
    }
    if (g == 0) kz_lnr_sh[wp] = st;
  }
  __syncthreads();  // the four warps' states are in kz_lnr_sh
  if (t >= 128) return;
  float nw[4];  // the elements each warp's lanes hold
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const int over = rem - 32 * w;
    nw[w] = (float)(4 * (32 * q + (over < 0 ? 0 : over > 32 ? 32 : over)));
  }
  WelS v0 = kz_comb_inv(kz_lnr_sh[0], kz_lnr_sh[2], __fdiv_rn(1.0f, __fadd_rn(nw[0], nw[2])));
  const WelS v1 = kz_comb_inv(kz_lnr_sh[1], kz_lnr_sh[3], __fdiv_rn(1.0f, __fadd_rn(nw[1], nw[3])));
  v0 = kz_comb_inv(v0, v1, __fdiv_rn(1.0f, __fadd_rn(__fadd_rn(nw[0], nw[2]), __fadd_rn(nw[1], nw[3]))));
  const typename B::Prm pm = p.template prm<true>(v0);
#pragma unroll
  for (int c = 0; c < NU; ++c) {
    const int u = t + 128 * c;
    if (u < nun) {  // LnP::store's formula, the weight and bias already in registers
      Un<T, true> y;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        y.set(e, fmaf(__fmul_rn(__fsub_rn(h[c].f(e), pm.mean), pm.rstd), wv[c].f(e), bv[c].f(e)));
      y.st(p.out + base + 4 * (i64)u, true);
    }
  }
}

// Every shape but a decode row's, out of line: a __noinline__ function, so that the code a decode
// row runs (kz_ln_resid_direct) is the entry's own, short and contiguous, as the gated kernels do
// (gated.cuh): inside a model a decode row's kernel starts on SMs whose instruction caches other
// kernels filled since its last call. `fast`: rows of whole 16-byte chunks and 16-byte aligned
// tensors (the staged engine, or kz_direct for rows the decode path leaves).
template <typename T>
__device__ __noinline__ void kz_ln_resid_wide(const LnResP<T> p, i64 rows, bool fast) {
  typedef LnResP<T> P;
  const i64 cols = p.cols;
  const bool vec = cols % 4 == 0 && cols <= (1LL << 24);
  if (fast) {
    if (rows <= gridDim.x && kz_direct_fits<T>(cols)) kz_direct<T, P, true>(p, p.x, p.res, rows, KzCfg{});
    else kz_staged<T, P, true>(p, p.x, p.res, rows, KzCfg{});
    return;
  }
  kz_ln_rows<T, P>(p, rows, vec);
}

// The entry is kz_ln_order's (eager.cuh) with this P and its own decode path first
// (kz_ln_resid_direct); the rows neither engine takes go to the same kz_ln_rows.
template <typename T>
KZ_DEV void kz_ln_resid(T* out, T* res, const T* x, const T* w, const T* b, i64 rows, i64 cols, float eps) {
  const bool vec = cols % 4 == 0 && cols <= (1LL << 24);
  const bool al = vec && kz_al<T>(x) && kz_al<T>(out) && kz_al<T>(res);
  const LnResP<T> p{{out, x, w, b, cols, eps, al, kz_al<T>(w) && kz_al<T>(b)}, res};
  if (blockDim.z != 1) __trap();
  const bool fast = vec && cols > 128 && (cols * (i64)sizeof(T)) % 16 == 0 && kz_al16(x) && kz_al16(out) &&
                    kz_al16(res) && kz_al16(w) && kz_al16(b);
  if (fast && rows <= gridDim.x) {  // the decode path: units in registers (at most 8 a lane, 4 in f32)
    const int need = (int)((cols / 4 + 127) / 128);  // units of the busiest lane
    if (need <= 2) { kz_ln_resid_direct<T, 2>(p, rows); return; }
    if (need <= 4) { kz_ln_resid_direct<T, 4>(p, rows); return; }
    if constexpr (sizeof(T) == 2) {
      if (need <= 8) { kz_ln_resid_direct<T, 8>(p, rows); return; }
    }
  }
  kz_ln_resid_wide<T>(p, rows, fast);
}
