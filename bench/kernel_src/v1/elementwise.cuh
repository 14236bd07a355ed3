
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

// 16 elements per thread per step: a block covers blockDim.x*16 contiguous elements with
// 16-byte accesses (16/sizeof(T) elements each), coalesced; grid-stride over such tiles.
template <typename T, int F>
KZ_DEV void kz_unary(T* out, const T* x, i64 n) {
  constexpr int W = 16 / sizeof(T);
  constexpr int NVEC = 16 / W;
  const i64 tile = (i64)blockDim.x * 16;
  const bool al = kz_al16(out) && kz_al16(x);
  for (i64 base = (i64)blockIdx.x * tile; base < n; base += (i64)gridDim.x * tile) {
    if (al && base + tile <= n) {
      uint4 v[NVEC];
#pragma unroll
      for (int j = 0; j < NVEC; ++j)
        v[j] = __ldg(reinterpret_cast<const uint4*>(x + base) + (i64)j * blockDim.x + threadIdx.x);
#pragma unroll
      for (int j = 0; j < NVEC; ++j) {
        T* e = reinterpret_cast<T*>(&v[j]);
#pragma unroll
        for (int i = 0; i < W; ++i) e[i] = KT<T>::from(kz_act<F>(KT<T>::f(e[i])));
        reinterpret_cast<uint4*>(out + base)[(i64)j * blockDim.x + threadIdx.x] = v[j];
      }
    } else {
#pragma unroll 4
      for (int j = 0; j < 16; ++j) {
        const i64 i = base + (i64)j * blockDim.x + threadIdx.x;
        if (i < n) out[i] = KT<T>::from(kz_act<F>(KT<T>::f(x[i])));
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

template <typename T, bool ROUND2>
KZ_DEV void kz_silu_and_mul(T* out, const T* x, i64 rows, i64 cols) {
  constexpr int W = 16 / sizeof(T);
  constexpr int NVEC = 16 / W;
  const i64 n = rows * cols;
  const i64 tile = (i64)blockDim.x * 16;
  const bool al = kz_al16(out) && kz_al16(x) && (cols % W == 0);
  for (i64 base = (i64)blockIdx.x * tile; base < n; base += (i64)gridDim.x * tile) {
    if (al) {
      uint4 gv[NVEC], uv[NVEC];
      i64 oi[NVEC];
#pragma unroll
      for (int j = 0; j < NVEC; ++j) {
        const i64 e = base + ((i64)j * blockDim.x + threadIdx.x) * W;  // first output element
        oi[j] = e;
        if (e < n) {
          const i64 r = e / cols, c = e - r * cols;
          const T* gp = x + r * 2 * cols + c;
          gv[j] = __ldg(reinterpret_cast<const uint4*>(gp));
          uv[j] = __ldg(reinterpret_cast<const uint4*>(gp + cols));
        }
      }
#pragma unroll
      for (int j = 0; j < NVEC; ++j) {
        if (oi[j] < n) {
          const T* ge = reinterpret_cast<const T*>(&gv[j]);
          const T* ue = reinterpret_cast<const T*>(&uv[j]);
          uint4 o;
          T* oe = reinterpret_cast<T*>(&o);
#pragma unroll
          for (int i = 0; i < W; ++i) oe[i] = KT<T>::from(kz_sam<T, ROUND2>(KT<T>::f(ge[i]), KT<T>::f(ue[i])));
          *reinterpret_cast<uint4*>(out + oi[j]) = o;
        }
      }
    } else {
#pragma unroll 4
      for (int j = 0; j < 16; ++j) {
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
