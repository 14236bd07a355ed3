
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
