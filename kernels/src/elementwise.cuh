// NVEC x 16 bytes per thread per step (8 elements of bf16/f16, 4 of f32 per vector), all
// loaded before any is used; a block covers blockDim.x*16*NVEC contiguous bytes, coalesced;
// grid-stride over such tiles, this block the vb-th of vg (activations.cuh: the shape of work).
// Only the last, partial tile takes the scalar path.
template <typename T, int F, int NVEC>
KZ_DEV void kz_unary_tiles(T* out, const T* x, i64 n, unsigned vb, unsigned vg) {
  constexpr int W = 16 / sizeof(T);
  const i64 tile = (i64)blockDim.x * (W * NVEC);
  const bool al = kz_al16(out) && kz_al16(x);
  const i64 nfull = al ? (n / tile) * tile : 0;
  i64 base = (i64)vb * tile;
  for (; base < nfull; base += (i64)vg * tile) {
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
  for (; base < n; base += (i64)vg * tile) {
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

// One vector per thread, or KZ_EW_NVEC on one block in KZ_EW_NVEC (activations.cuh).
template <typename T, int F>
KZ_DEV void kz_unary(T* out, const T* x, i64 n) {
  unsigned vb, vg;
  if (gridDim.x < KZ_EW_BIG_GRID) kz_unary_tiles<T, F, 1>(out, x, n, blockIdx.x, gridDim.x);
  else if (kz_ew_big_block(vb, vg)) kz_unary_tiles<T, F, KZ_EW_NVEC>(out, x, n, vb, vg);
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

// NVEC output vectors of 16 bytes per thread per step (gate and up loaded before use), this
// block the vb-th of vg.
template <typename T, bool ROUND2, int NVEC>
KZ_DEV void kz_silu_and_mul_tiles(T* out, const T* x, i64 rows, i64 cols, unsigned vb, unsigned vg) {
  constexpr int W = 16 / sizeof(T);
  const i64 n = rows * cols;
  const i64 tile = (i64)blockDim.x * (W * NVEC);
  const bool al = kz_al16(out) && kz_al16(x) && (cols % W == 0);
  i64 base = (i64)vb * tile;
  if (al) {
    const i64 cvec = cols / W, nv = n / W;
    const bool small = nv < (1LL << 32);
    for (; base < n; base += (i64)vg * tile) {
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
    for (; base < n; base += (i64)vg * tile) {
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

// One output vector per thread, or KZ_EW_NVEC on one block in KZ_EW_NVEC (activations.cuh).
template <typename T, bool ROUND2>
KZ_DEV void kz_silu_and_mul(T* out, const T* x, i64 rows, i64 cols) {
  unsigned vb, vg;
  if (gridDim.x < KZ_EW_BIG_GRID) kz_silu_and_mul_tiles<T, ROUND2, 1>(out, x, rows, cols, blockIdx.x, gridDim.x);
  else if (kz_ew_big_block(vb, vg)) kz_silu_and_mul_tiles<T, ROUND2, KZ_EW_NVEC>(out, x, rows, cols, vb, vg);
}
