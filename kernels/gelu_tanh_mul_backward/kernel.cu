// ---- kernelize: gelu_tanh_mul_backward, the gradients of gelu_tanh(gate) * up in eager autograd's bits ----
// Written by hand (kernels/generate.py's HAND_WRITTEN). docs/backward-gated.md, docs/spec.md
// section 2c. Self-contained for NVRTC. The structure of kernels/silu_mul_backward (16-byte
// vector loads, a scalar tail, grid-stride loops); only the per-element arithmetic differs.
//
// Eager autograd of `F.gelu(gate, approximate="tanh") * up` (MulBackward0 saving
// round_T(gelu_tanh(gate)) and up; GeluBackward0 saving gate), per element, g = gate, u = up, dy
// (values of T as f32; kB = f32(sqrt(2/pi)), kK = f32(0.044715), k3 = fl(3 * kK)):
//   x2     = fl(g * g);  x3 = fl(x2 * g);  inner = fl(fma(x3, kK, g) * kB);  t = tanhf(inner)
//   act    = round_T(fl(fl(0.5 * g) * fl(1 + t)))   the forward's saved output (eager's gelu_tanh,
//                                                   the bundled gelu_tanh_mul's form)
//   d_up   = round_T(fl(dy * act))                  MulBackward0, grad * self
//   d_act  = round_T(fl(dy * u))                    MulBackward0, grad * other
//   d_gate = round_T(fl(d_act * fma(fl(1 + t), 0.5, fl(fl(fl(0.5 * g) * fma(-t, t, 1))
//                                                        * fl(fma(x2, k3, 1) * kB)))))
//                                                   GeluBackward0 (GeluBackwardCUDAKernelImpl's
//                                                   tanh branch as nvcc compiled it for sm_90)
// The contractions (fma(x3, kK, g), fma(-t, t, 1), fma(x2, k3, 1), the `left_derivative +`
// as fma(right, 0.5, ..)) and the plain products are those of eager's SASS (torch 2.15+cu132,
// read with scripts/eager_sass.py; docs/backward-gated.md, "gelu_tanh_mul_backward"); every one
// is spelled with an IEEE intrinsic here so that no contraction is left to the compiler. tanhf is
// CUDA's (libdevice: ex2.approx and rcp.approx from |x| >= 0.6, an odd polynomial below), the
// function eager's forward and backward both call; `inner` is the same value in both, so one
// tanhf serves act and d_gate. Not yet run on a GPU.
//
// Entry (the ABI of docs/spec.md section 2c, one stage `grad`):
//   gelu_tanh_mul_bwd_<dt>(T* d_gate, T* d_up, const T* dy, const T* gate, const T* up,
//                          long long rows, long long cols)
// any grid and block (grid-stride loops over rows * cols contiguous elements: 16-byte vectors,
// then the last few one by one); the hub launches block 256 and kernel_registry::backward::
// stage_dims's grid.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define GMB_DEV __device__ __forceinline__
typedef long long i64;

template <typename T> struct ST;
template <> struct ST<float> {
  static GMB_DEV float ld(const float* p) { return *p; }
  static GMB_DEV float rt(float v) { return v; }
  static GMB_DEV void st(float* p, float v) { *p = v; }
};
template <> struct ST<__nv_bfloat16> {
  static GMB_DEV float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  static GMB_DEV float rt(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
  static GMB_DEV void st(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
};
template <> struct ST<__half> {
  static GMB_DEV float ld(const __half* p) { return __half2float(*p); }
  static GMB_DEV float rt(float v) { return __half2float(__float2half_rn(v)); }
  static GMB_DEV void st(__half* p, float v) { *p = __float2half_rn(v); }
};

// eager's constants as f32: kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, kKappa = 0.044715, and the
// product `opmath_t(3) * kKappa` folded in f32 (0x3e095d4e; its SASS's immediate)
#define GMB_KBETA 0.79788456080286536f
#define GMB_KKAPPA 0.044715f
#define GMB_K3 0.13414499163627624512f

// One element of the chain (the header's formulas); every path below calls this, so the
// vector loads change which thread does an element, never its arithmetic.
template <typename T>
GMB_DEV void gmb_one(float y, float g, float u, T* d_gate, T* d_up) {
  const float x2 = __fmul_rn(g, g);
  const float x3 = __fmul_rn(x2, g);
  const float t = tanhf(__fmul_rn(fmaf(x3, GMB_KKAPPA, g), GMB_KBETA));
  const float left = __fmul_rn(0.5f, g);
  const float right = __fadd_rn(1.0f, t);
  const float act = ST<T>::rt(__fmul_rn(left, right));
  ST<T>::st(d_up, __fmul_rn(y, act));
  const float d_act = ST<T>::rt(__fmul_rn(y, u));
  const float inner_d = __fmul_rn(fmaf(x2, GMB_K3, 1.0f), GMB_KBETA);
  const float right_d = __fmul_rn(__fmul_rn(left, fmaf(-t, t, 1.0f)), inner_d);
  ST<T>::st(d_gate, __fmul_rn(d_act, fmaf(right, 0.5f, right_d)));
}

// 16 bytes of T: the ABI promises every tensor starts 16-byte aligned (docs/spec.md section 2),
// so element K * i starts a vector for every i.
template <typename T> struct alignas(16) Vec16 {
  T v[16 / sizeof(T)];
};

template <typename T>
GMB_DEV void gmb(T* __restrict__ d_gate, T* __restrict__ d_up, const T* __restrict__ dy,
                 const T* __restrict__ gate, const T* __restrict__ up, i64 n) {
  constexpr int K = 16 / sizeof(T);
  const i64 stride = (i64)gridDim.x * blockDim.x;
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 nv = n / K;
  for (i64 i = tid; i < nv; i += stride) {
    const Vec16<T> y = reinterpret_cast<const Vec16<T>*>(dy)[i];
    const Vec16<T> g = reinterpret_cast<const Vec16<T>*>(gate)[i];
    const Vec16<T> u = reinterpret_cast<const Vec16<T>*>(up)[i];
    Vec16<T> dg, du;
#pragma unroll
    for (int k = 0; k < K; ++k)
      gmb_one<T>(ST<T>::ld(&y.v[k]), ST<T>::ld(&g.v[k]), ST<T>::ld(&u.v[k]), &dg.v[k], &du.v[k]);
    reinterpret_cast<Vec16<T>*>(d_gate)[i] = dg;
    reinterpret_cast<Vec16<T>*>(d_up)[i] = du;
  }
  for (i64 e = nv * K + tid; e < n; e += stride)  // the last n % K elements
    gmb_one<T>(ST<T>::ld(dy + e), ST<T>::ld(gate + e), ST<T>::ld(up + e), d_gate + e, d_up + e);
}

#define GMB_ENTRY(NAME, T)                                                                      \
  extern "C" __global__ void gelu_tanh_mul_bwd_##NAME(T* d_gate, T* d_up, const T* dy,         \
                                                      const T* gate, const T* up, i64 rows,     \
                                                      i64 cols) {                               \
    if (rows <= 0 || cols <= 0) return;                                                         \
    gmb<T>(d_gate, d_up, dy, gate, up, rows * cols);                                            \
  }

GMB_ENTRY(bf16, __nv_bfloat16)
GMB_ENTRY(f16, __half)
GMB_ENTRY(f32, float)

// The entries GMB_ENTRY makes, spelled out (kernel.toml names them; a bundle's check finds each
// symbol's text in the source):
//   gelu_tanh_mul_bwd_bf16 gelu_tanh_mul_bwd_f16 gelu_tanh_mul_bwd_f32
