// ---- kernelize: gelu_tanh_backward, the gradient of F.gelu(x, approximate="tanh") in eager autograd's bits ----
// Written by hand (kernels/generate.py's HAND_WRITTEN). docs/backward-activations.md,
// docs/spec.md section 2c. Self-contained for NVRTC. The structure of kernels/silu_mul_backward
// (16-byte vector loads, a scalar tail, grid-stride loops) over one input and one gradient.
//
// Eager autograd of `F.gelu(x, approximate="tanh")` (GeluBackward0, saving x) runs one CUDA
// kernel, GeluBackwardCUDAKernelImpl's tanh branch (ActivationGeluKernel.cu). Per element (values
// of T as f32; kB = f32(sqrt(2/pi)), kK = f32(0.044715), k3 = fl(3 * kK)), as nvcc compiled it
// for sm_90 (docs/backward-gated.md, "gelu_tanh_mul_backward": the same kernel, read from eager's
// SASS):
//   x2 = fl(x * x);  x3 = fl(x2 * x);  t = tanhf(fl(fma(x3, kK, x) * kB))
//   dx = round_T(fl(dy * fma(fl(1 + t), 0.5, fl(fl(fl(0.5 * x) * fma(-t, t, 1))
//                                               * fl(fma(x2, k3, 1) * kB)))))
// gelu_tanh_mul_backward's d_gate with d_act = dy, every operation an IEEE intrinsic (no
// contraction left to the compiler); tanhf is CUDA's (libdevice), the function eager calls.
// Measured only through gelu_tanh_mul_backward's d_gate on a GPU (bit-exact with eager autograd
// on an H200); NVRTC 13.2 compiles this
// kernel to those instructions (cuobjdump of its cubin); not yet run on a GPU.
//
// Entry (the ABI of docs/spec.md section 2c, one stage `grad`):
//   gelu_tanh_bwd_<dt>(T* dx, const T* dy, const T* x, long long n)
// any grid and block (grid-stride loops over n contiguous elements: 16-byte vectors, then the
// last few one by one); the hub launches block 256 and kernel_registry::backward::stage_dims's
// grid.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define GTB_DEV __device__ __forceinline__
typedef long long i64;

template <typename T> struct ST;
template <> struct ST<float> {
  static GTB_DEV float ld(const float* p) { return *p; }
  static GTB_DEV void st(float* p, float v) { *p = v; }
};
template <> struct ST<__nv_bfloat16> {
  static GTB_DEV float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  static GTB_DEV void st(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
};
template <> struct ST<__half> {
  static GTB_DEV float ld(const __half* p) { return __half2float(*p); }
  static GTB_DEV void st(__half* p, float v) { *p = __float2half_rn(v); }
};

// eager's constants as f32: kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, kKappa = 0.044715, and the
// product `opmath_t(3) * kKappa` folded in f32 (0x3e095d4e; its SASS's immediate)
#define GTB_KBETA 0.79788456080286536f
#define GTB_KKAPPA 0.044715f
#define GTB_K3 0.13414499163627624512f

// One element (the header's formulas); every path below calls this, so the vector loads change
// which thread does an element, never its arithmetic.
template <typename T>
GTB_DEV void gtb_one(float y, float x, T* dx) {
  const float x2 = __fmul_rn(x, x);
  const float x3 = __fmul_rn(x2, x);
  const float t = tanhf(__fmul_rn(fmaf(x3, GTB_KKAPPA, x), GTB_KBETA));
  const float left = __fmul_rn(0.5f, x);
  const float right = __fadd_rn(1.0f, t);
  const float inner_d = __fmul_rn(fmaf(x2, GTB_K3, 1.0f), GTB_KBETA);
  const float right_d = __fmul_rn(__fmul_rn(left, fmaf(-t, t, 1.0f)), inner_d);
  ST<T>::st(dx, __fmul_rn(y, fmaf(right, 0.5f, right_d)));
}

// 16 bytes of T: the ABI promises every tensor starts 16-byte aligned (docs/spec.md section 2),
// so element K * i starts a vector for every i.
template <typename T> struct alignas(16) Vec16 {
  T v[16 / sizeof(T)];
};

template <typename T>
GTB_DEV void gtb(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x, i64 n) {
  constexpr int K = 16 / sizeof(T);
  const i64 stride = (i64)gridDim.x * blockDim.x;
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 nv = n / K;
  for (i64 i = tid; i < nv; i += stride) {
    const Vec16<T> y = reinterpret_cast<const Vec16<T>*>(dy)[i];
    const Vec16<T> h = reinterpret_cast<const Vec16<T>*>(x)[i];
    Vec16<T> d;
#pragma unroll
    for (int k = 0; k < K; ++k) gtb_one<T>(ST<T>::ld(&y.v[k]), ST<T>::ld(&h.v[k]), &d.v[k]);
    reinterpret_cast<Vec16<T>*>(dx)[i] = d;
  }
  for (i64 e = nv * K + tid; e < n; e += stride)  // the last n % K elements
    gtb_one<T>(ST<T>::ld(dy + e), ST<T>::ld(x + e), dx + e);
}

#define GTB_ENTRY(NAME, T)                                                                         \
  extern "C" __global__ void gelu_tanh_bwd_##NAME(T* dx, const T* dy, const T* x, i64 n) {         \
    if (n <= 0) return;                                                                            \
    gtb<T>(dx, dy, x, n);                                                                          \
  }

GTB_ENTRY(bf16, __nv_bfloat16)
GTB_ENTRY(f16, __half)
GTB_ENTRY(f32, float)

// The entries GTB_ENTRY makes, spelled out (kernel.toml names them; a bundle's check finds each
// symbol's text in the source):
//   gelu_tanh_bwd_bf16 gelu_tanh_bwd_f16 gelu_tanh_bwd_f32
