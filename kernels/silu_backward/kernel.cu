// ---- kernelize: silu_backward, the gradient of silu(x) in eager autograd's bits ----
// Written by hand (kernels/generate.py's HAND_WRITTEN). docs/backward-activations.md,
// docs/spec.md section 2c. Self-contained for NVRTC. The structure of kernels/silu_mul_backward
// (16-byte vector loads, a scalar tail, grid-stride loops) over one input and one gradient.
//
// Eager autograd of `F.silu(x)` (SiluBackward0, saving x) runs one CUDA kernel,
// silu_backward_kernel (ActivationSiluKernel.cu): `dy * s * (1 + x * (1 - s))` with
// `s = 1 / (1 + exp(-x))` in f32. Per element (values of T as f32), as nvcc compiled it for
// sm_90 (read with nvdisasm; docs/backward-gated.md, "What nvcc made of silu_backward"):
//   s  = 1 / D, D = 1 + expf(-x) with expf's final scaling and the `1 +` in one FMA; IEEE rcp
//   dx = round_T(fl(fl(dy * s) * fma(fl(1 - s), x, 1)))
// silu_mul_backward's d_gate with d_act = dy, in its form: expf(-x) on x through an opaque move
// (there, so that it is not shared with the forward's expf; here kept so that this kernel's
// arithmetic is that one's instruction for instruction), `1.0f + expf(..)` left to the
// compiler's contraction, the rest IEEE intrinsics. Measured only through silu_mul_backward's
// d_gate on a GPU (bit-exact with eager autograd on an H200); NVRTC 13.2 compiles this
// kernel to those instructions (cuobjdump of its cubin); not yet run on a GPU.
//
// Entry (the ABI of docs/spec.md section 2c, one stage `grad`):
//   silu_bwd_<dt>(T* dx, const T* dy, const T* x, long long n)
// any grid and block (grid-stride loops over n contiguous elements: 16-byte vectors, then the
// last few one by one); the hub launches block 256 and kernel_registry::backward::stage_dims's
// grid.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define SB_DEV __device__ __forceinline__
typedef long long i64;

template <typename T> struct ST;
template <> struct ST<float> {
  static SB_DEV float ld(const float* p) { return *p; }
  static SB_DEV void st(float* p, float v) { *p = v; }
};
template <> struct ST<__nv_bfloat16> {
  static SB_DEV float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  static SB_DEV void st(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
};
template <> struct ST<__half> {
  static SB_DEV float ld(const __half* p) { return __half2float(*p); }
  static SB_DEV void st(__half* p, float v) { *p = __float2half_rn(v); }
};

// 1 + exp(-x) with expf's argument through an opaque move (silu_mul_backward's smb_denominator).
SB_DEV float sb_denominator(float x) {
  float h = x;
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
  asm volatile("mov.b32 %0, %1;" : "=f"(h) : "f"(x));  // (the CPU harness has no PTX: a copy)
#endif
  return 1.0f + expf(-h);
}

// One element (the header's formulas); every path below calls this, so the vector loads change
// which thread does an element, never its arithmetic.
template <typename T>
SB_DEV void sb_one(float y, float x, T* dx) {
  // eager's `1 / D`: rcp.rn (MUFU.RCP and its Newton step in its SASS), correctly rounded
  const float s = __frcp_rn(sb_denominator(x));
  ST<T>::st(dx, __fmul_rn(__fmul_rn(y, s), fmaf(__fsub_rn(1.0f, s), x, 1.0f)));
}

// 16 bytes of T: the ABI promises every tensor starts 16-byte aligned (docs/spec.md section 2),
// so element K * i starts a vector for every i.
template <typename T> struct alignas(16) Vec16 {
  T v[16 / sizeof(T)];
};

template <typename T>
SB_DEV void sb(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x, i64 n) {
  constexpr int K = 16 / sizeof(T);
  const i64 stride = (i64)gridDim.x * blockDim.x;
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 nv = n / K;
  for (i64 i = tid; i < nv; i += stride) {
    const Vec16<T> y = reinterpret_cast<const Vec16<T>*>(dy)[i];
    const Vec16<T> h = reinterpret_cast<const Vec16<T>*>(x)[i];
    Vec16<T> d;
#pragma unroll
    for (int k = 0; k < K; ++k) sb_one<T>(ST<T>::ld(&y.v[k]), ST<T>::ld(&h.v[k]), &d.v[k]);
    reinterpret_cast<Vec16<T>*>(dx)[i] = d;
  }
  for (i64 e = nv * K + tid; e < n; e += stride)  // the last n % K elements
    sb_one<T>(ST<T>::ld(dy + e), ST<T>::ld(x + e), dx + e);
}

#define SB_ENTRY(NAME, T)                                                                          \
  extern "C" __global__ void silu_bwd_##NAME(T* dx, const T* dy, const T* x, i64 n) {              \
    if (n <= 0) return;                                                                            \
    sb<T>(dx, dy, x, n);                                                                           \
  }

SB_ENTRY(bf16, __nv_bfloat16)
SB_ENTRY(f16, __half)
SB_ENTRY(f32, float)

// The entries SB_ENTRY makes, spelled out (kernel.toml names them; a bundle's check finds each
// symbol's text in the source):
//   silu_bwd_bf16 silu_bwd_f16 silu_bwd_f32
