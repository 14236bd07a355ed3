// ---- kernelize: gelu_backward, the gradient of F.gelu(x) (erf) in eager autograd's bits ----
// Written by hand (kernels/generate.py's HAND_WRITTEN). docs/backward-activations.md,
// docs/spec.md section 2c. Self-contained for NVRTC. The structure of kernels/silu_mul_backward
// (16-byte vector loads, a scalar tail, grid-stride loops) over one input and one gradient.
//
// Eager autograd of `F.gelu(x)` (GeluBackward0, approximate 'none', saving x) runs one CUDA
// kernel, GeluBackwardCUDAKernelImpl's erf branch (ActivationGeluKernel.cu), in f32:
//   kBeta = M_2_SQRTPI * M_SQRT1_2 * 0.5 (1 / sqrt(2 pi), as f32: 0x3ecc422a); kAlpha = M_SQRT1_2
//   cdf = 0.5 * (1 + erf(x * kAlpha));  pdf = exp(-0.5 * x * x) * kBeta;  dx = dy * (cdf + x * pdf)
// erf and exp are CUDA's erff and expf (libdevice), the functions eager calls. Per element (values
// of T as f32), as nvcc compiled it for sm_90 (torch 2.15.0+cu132's libtorch_cuda.so, read with
// scripts/eager_sass.py: `FMUL x * 0.7071068`, erff, `FMUL x * -0.5`, `FMUL * x`, expf, `FMUL
// * 0.3989423`, `FMUL * x`, `FADD erf + 1`, `FFMA o * 0.5 + xpdf`, `FMUL * dy`; the same in the
// bf16 and f16 instantiations; docs/backward-activations.md):
//   o   = fl(1 + erff(fl(x * kAlpha)))          (`1 + erf` unfused, as in eager's forward)
//   pdf = fl(expf(fl(fl(-0.5 * x) * x)) * kBeta) (products only: nothing to contract)
//   sum = fma(o, 0.5, fl(x * pdf))   cdf's product fused into the sum (nvcc fused the first
//                                    product, as in the tanh branch's `left_derivative +
//                                    right_derivative`); 0.5 * o is exact, so these are the
//                                    bits of no contraction at all
//   dx  = round_T(fl(dy * sum))
// Every operation is an IEEE intrinsic (no contraction left to the compiler); NVRTC 13.2 compiles
// this to the same instructions. The other candidate, `x * pdf` fused (fma(x, pdf, fl(0.5 * o))),
// builds with -DGB_FMA_XPDF=1: scripts/activation_backward_probe.py runs both against eager
// autograd on a GPU, whose torch build may not be the one read here. Not yet run on a GPU.
//
// Entry (the ABI of docs/spec.md section 2c, one stage `grad`):
//   gelu_bwd_<dt>(T* dx, const T* dy, const T* x, long long n)
// any grid and block (grid-stride loops over n contiguous elements: 16-byte vectors, then the
// last few one by one); the hub launches block 256 and kernel_registry::backward::stage_dims's
// grid.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define GB_DEV __device__ __forceinline__
typedef long long i64;

template <typename T> struct ST;
template <> struct ST<float> {
  static GB_DEV float ld(const float* p) { return *p; }
  static GB_DEV void st(float* p, float v) { *p = v; }
};
template <> struct ST<__nv_bfloat16> {
  static GB_DEV float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  static GB_DEV void st(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
};
template <> struct ST<__half> {
  static GB_DEV float ld(const __half* p) { return __half2float(*p); }
  static GB_DEV void st(__half* p, float v) { *p = __float2half_rn(v); }
};

// eager's constants as f32: kAlpha = M_SQRT1_2, kBeta = M_2_SQRTPI * M_SQRT1_2 * 0.5 (0x3ecc422a)
#define GB_KALPHA 0.70710678118654752f
#define GB_KBETA 0.3989422804014327f
#ifndef GB_FMA_XPDF
#define GB_FMA_XPDF 0  // the sum's contraction (the header): 0 = eager's SASS's, 1 = x * pdf fused
#endif

// One element (the header's formulas); every path below calls this, so the vector loads change
// which thread does an element, never its arithmetic.
template <typename T>
GB_DEV void gb_one(float y, float x, T* dx) {
  const float o = __fadd_rn(1.0f, erff(__fmul_rn(x, GB_KALPHA)));
  const float pdf = __fmul_rn(expf(__fmul_rn(__fmul_rn(-0.5f, x), x)), GB_KBETA);
#if GB_FMA_XPDF
  const float sum = fmaf(x, pdf, __fmul_rn(0.5f, o));
#else
  const float sum = fmaf(o, 0.5f, __fmul_rn(x, pdf));
#endif
  ST<T>::st(dx, __fmul_rn(y, sum));
}

// 16 bytes of T: the ABI promises every tensor starts 16-byte aligned (docs/spec.md section 2),
// so element K * i starts a vector for every i.
template <typename T> struct alignas(16) Vec16 {
  T v[16 / sizeof(T)];
};

template <typename T>
GB_DEV void gb(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x, i64 n) {
  constexpr int K = 16 / sizeof(T);
  const i64 stride = (i64)gridDim.x * blockDim.x;
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 nv = n / K;
  for (i64 i = tid; i < nv; i += stride) {
    const Vec16<T> y = reinterpret_cast<const Vec16<T>*>(dy)[i];
    const Vec16<T> h = reinterpret_cast<const Vec16<T>*>(x)[i];
    Vec16<T> d;
#pragma unroll
    for (int k = 0; k < K; ++k) gb_one<T>(ST<T>::ld(&y.v[k]), ST<T>::ld(&h.v[k]), &d.v[k]);
    reinterpret_cast<Vec16<T>*>(dx)[i] = d;
  }
  for (i64 e = nv * K + tid; e < n; e += stride)  // the last n % K elements
    gb_one<T>(ST<T>::ld(dy + e), ST<T>::ld(x + e), dx + e);
}

#define GB_ENTRY(NAME, T)                                                                          \
  extern "C" __global__ void gelu_bwd_##NAME(T* dx, const T* dy, const T* x, i64 n) {              \
    if (n <= 0) return;                                                                            \
    gb<T>(dx, dy, x, n);                                                                           \
  }

GB_ENTRY(bf16, __nv_bfloat16)
GB_ENTRY(f16, __half)
GB_ENTRY(f32, float)

// The entries GB_ENTRY makes, spelled out (kernel.toml names them; a bundle's check finds each
// symbol's text in the source):
//   gelu_bwd_bf16 gelu_bwd_f16 gelu_bwd_f32
