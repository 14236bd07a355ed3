
// ---- elementwise ops --------------------------------------------------------------------------
// Which thread does which element (issue 29). The manifests' grid gives every thread one
// 16-byte vector (elements_per_thread = 8: 8 elements of bf16/f16, 4 of f32 twice), and the
// kernels pick one of two shapes of work from the grid they were given:
//  - a grid of fewer than KZ_EW_BIG_GRID blocks (decode rows, small batches): one vector per
//    thread, every block working. A decode row's few thousand exact activations spread over as
//    many SMs as it has 2048-element tiles instead of 32 in sequence on each thread of one block;
//    eager's vectorized kernels do the same.
//  - a grid of KZ_EW_BIG_GRID blocks or more (prefill activations: 8 MB and up in bf16): one
//    block in KZ_EW_NVEC works, on tiles of KZ_EW_NVEC vectors per thread, all loaded before any
//    is used: KZ_EW_NVEC times the bytes in flight per thread, which one vector per thread (30
//    registers, full occupancy) did not reach at 32768x4096 on the H200 (0.79x of 4 vectors).
//    The idle blocks are every block whose index is not a multiple of KZ_EW_NVEC, so that they
//    retire among the working ones instead of queueing behind the last of them.
//    (__launch_bounds__(256, 4), kernels/generate.py: at most 64 registers, 4 blocks per SM.)
// Each element's arithmetic is the same in both (the bits do not depend on the shape of work).
#ifndef KZ_EW_NVEC
#define KZ_EW_NVEC 4
#endif
#ifndef KZ_EW_BIG_GRID
#define KZ_EW_BIG_GRID 2048
#endif

// The big shape of work for this grid: true when this block is one of the working ones, with its
// index among them (vb) and their number (vg); false for an idle block. Call only when
// gridDim.x >= KZ_EW_BIG_GRID.
KZ_DEV bool kz_ew_big_block(unsigned& vb, unsigned& vg) {
  vb = blockIdx.x / KZ_EW_NVEC;
  vg = (gridDim.x + KZ_EW_NVEC - 1) / KZ_EW_NVEC;
  return blockIdx.x % KZ_EW_NVEC == 0;
}

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

