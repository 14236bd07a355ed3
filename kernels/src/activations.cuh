
// ---- elementwise ops --------------------------------------------------------------------------
// 16-byte vectors per thread per step in the elementwise and gated kernels (the manifests' grid
// gives every thread one step's worth for 2-byte types: elements_per_thread = 8 * KZ_EW_NVEC).
// One vector: a decode row's few thousand elements spread over many SMs instead of 32 exact
// activations in sequence on each thread of one block; eager's vectorized kernels do the same.
#ifndef KZ_EW_NVEC
#define KZ_EW_NVEC 1
#endif
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

