
// Gated ops (silu_mul, gelu_tanh_mul): HF's act(gate_proj(x)) * up_proj(x) on two separate
// [rows, cols] tensors, as eager computes it: s = round(act(g)) (the activation's output is a
// tensor of T), y = round(s * u). The activation is kz_act, the same code as the silu and
// gelu_tanh kernels (bit-exact with F.silu / F.gelu(approximate="tanh")).
template <typename T, int F>
KZ_DEV float kz_gate(float g, float u) { return __fmul_rn(KT<T>::rnd(kz_act<F>(g)), u); }

// gate, up and out are contiguous with the same shape, so element i of each goes together: the
// op is elementwise over n = rows * cols. As kz_unary: NVEC 16-byte vectors of the output per
// thread per step (gate and up, all issued before use), coalesced, streaming hints, grid-stride
// (this block the vb-th of vg); the partial last tile with whole vectors where it can.
template <typename T, int F, int NVEC>
KZ_DEV void kz_gated_tiles(T* out, const T* gate, const T* up, i64 rows, i64 cols, unsigned vb, unsigned vg) {
  constexpr int W = 16 / sizeof(T);
  const i64 n = rows * cols;
  const i64 tile = (i64)blockDim.x * (W * NVEC);
  const bool al = kz_al16(out) && kz_al16(gate) && kz_al16(up);
  const i64 nfull = al ? (n / tile) * tile : 0;
  i64 base = (i64)vb * tile;
  for (; base < nfull; base += (i64)vg * tile) {
    uint4 g[NVEC], u[NVEC];
    const uint4* gs = reinterpret_cast<const uint4*>(gate + base) + threadIdx.x;
    const uint4* us = reinterpret_cast<const uint4*>(up + base) + threadIdx.x;
    uint4* os = reinterpret_cast<uint4*>(out + base) + threadIdx.x;
#pragma unroll
    for (int j = 0; j < NVEC; ++j) {
      g[j] = __ldcs(gs + j * blockDim.x);
      u[j] = __ldcs(us + j * blockDim.x);
    }
#pragma unroll
    for (int j = 0; j < NVEC; ++j) {
      T* ge = reinterpret_cast<T*>(&g[j]);
      const T* ue = reinterpret_cast<const T*>(&u[j]);
#pragma unroll
      for (int i = 0; i < W; ++i) ge[i] = KT<T>::from(kz_gate<T, F>(KT<T>::f(ge[i]), KT<T>::f(ue[i])));
      __stcs(os + j * blockDim.x, g[j]);
    }
  }
  for (; base < n; base += (i64)vg * tile) {
    uint4 g[NVEC], u[NVEC];
    i64 e0[NVEC];
#pragma unroll
    for (int j = 0; j < NVEC; ++j) {
      e0[j] = base + ((i64)j * blockDim.x + threadIdx.x) * W;
      if (al && e0[j] + W <= n) {
        g[j] = __ldcs(reinterpret_cast<const uint4*>(gate + e0[j]));
        u[j] = __ldcs(reinterpret_cast<const uint4*>(up + e0[j]));
      }
    }
#pragma unroll
    for (int j = 0; j < NVEC; ++j) {
      if (al && e0[j] + W <= n) {
        T* ge = reinterpret_cast<T*>(&g[j]);
        const T* ue = reinterpret_cast<const T*>(&u[j]);
#pragma unroll
        for (int i = 0; i < W; ++i) ge[i] = KT<T>::from(kz_gate<T, F>(KT<T>::f(ge[i]), KT<T>::f(ue[i])));
        __stcs(reinterpret_cast<uint4*>(out + e0[j]), g[j]);
      } else {
        for (int i = 0; i < W; ++i)
          if (e0[j] + i < n)
            out[e0[j] + i] = KT<T>::from(kz_gate<T, F>(KT<T>::f(gate[e0[j] + i]), KT<T>::f(up[e0[j] + i])));
      }
    }
  }
}

// The big grids' shape of work, out of line: a __noinline__ function, so that the code a decode
// row runs is the entry's own, short and contiguous. A decode row's kernel starts cold inside a
// model (its code not in the SM's instruction cache: other kernels ran there since); inlined, the
// 4-vector path's code sat with it, and silu_mul at 1 x 5632 took 2.3-3.1 us a call inside a CUDA
// graph of 22 MLP blocks against 1.7 us back to back; out of line, 1.8 us, with the big shapes'
// speed unchanged (bench/decode_context_probe.py, H200, 2026-11-27). (Measured on the unary
// kernels too, the same change made SiLU 0.91x at 512 x 4096 and 32768 x 4096: they keep it inline.)
template <typename T, int F>
__device__ __noinline__ void kz_gated_wide(T* out, const T* gate, const T* up, i64 rows, i64 cols) {
  unsigned vb, vg;
  if (kz_ew_big_block(vb, vg)) kz_gated_tiles<T, F, KZ_EW_NVEC>(out, gate, up, rows, cols, vb, vg);
}
// One vector per thread, or KZ_EW_NVEC on one block in KZ_EW_NVEC (activations.cuh).
template <typename T, int F>
KZ_DEV void kz_gated(T* out, const T* gate, const T* up, i64 rows, i64 cols) {
  if (gridDim.x < KZ_EW_BIG_GRID) kz_gated_tiles<T, F, 1>(out, gate, up, rows, cols, blockIdx.x, gridDim.x);
  else kz_gated_wide<T, F>(out, gate, up, rows, cols);
}
