// ---- kernelize: silu_mul_backward, the gradients of silu(gate) * up in eager autograd's bits ----
// Written by hand (kernels/generate.py's HAND_WRITTEN). docs/backward-gated.md, docs/spec.md
// section 2c. Self-contained for NVRTC.
//
// Eager autograd of `F.silu(gate) * up` (MulBackward0 saving round_T(silu(gate)) and up;
// SiluBackward0 saving gate), per element, g = gate, u = up, dy (values of T as f32):
//   act    = round_T(silu(g))                       the forward's saved output, eager's exact
//                                                   silu: fl(g / fl(1 + expf(-g)))
//   d_up   = round_T(fl(dy * act))                  MulBackward0, grad * self
//   d_act  = round_T(fl(dy * u))                    MulBackward0, grad * other
//   s      = 1 / D, D = 1 + expf(-g) with expf's final scaling and the `1 +` in one FMA (what
//            nvcc made of eager's silu_backward_kernel for sm_90, read with nvdisasm); IEEE rcp
//   d_gate = round_T(fl(fl(d_act * s) * fma(fl(1 - s), g, 1)))
// expf(-g) is taken again for D with its argument through an opaque move, so that the compiler
// cannot share it with act's (a shared product stays unfused) and contracts `1.0f + expf(..)`
// as eager's build did. Measured bit-exact against eager autograd on an H200 (torch 2.11) in
// every case of scripts/gated_backward_probe.py (docs/backward-gated.md).
//
// Entry (the ABI of docs/spec.md section 2c, one stage `grad`):
//   silu_mul_bwd_<dt>(T* d_gate, T* d_up, const T* dy, const T* gate, const T* up,
//                     long long rows, long long cols)
// any grid and block (grid-stride loops over rows * cols contiguous elements: 16-byte vectors,
// then the last few one by one); the hub launches block 256 and kernel_registry::backward::
// stage_dims's grid.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define SMB_DEV __device__ __forceinline__
typedef long long i64;

template <typename T> struct ST;
template <> struct ST<float> {
  static SMB_DEV float ld(const float* p) { return *p; }
  static SMB_DEV float rt(float v) { return v; }
  static SMB_DEV void st(float* p, float v) { *p = v; }
};
template <> struct ST<__nv_bfloat16> {
  static SMB_DEV float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  static SMB_DEV float rt(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
  static SMB_DEV void st(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
};
template <> struct ST<__half> {
  static SMB_DEV float ld(const __half* p) { return __half2float(*p); }
  static SMB_DEV float rt(float v) { return __half2float(__float2half_rn(v)); }
  static SMB_DEV void st(__half* p, float v) { *p = __float2half_rn(v); }
};

// 1 + exp(-g) with its own expf (the opaque move keeps it from being shared with act's).
SMB_DEV float smb_denominator(float g) {
  float h = g;
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
  asm volatile("mov.b32 %0, %1;" : "=f"(h) : "f"(g));  // (the CPU harness has no PTX: a copy)
#endif
  return 1.0f + expf(-h);
}

// One element of the chain (the header's formulas); every path below calls this, so the
// vector loads change which thread does an element, never its arithmetic.
template <typename T>
SMB_DEV void smb_one(float y, float g, float u, T* d_gate, T* d_up) {
  const float act = ST<T>::rt(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))));
  ST<T>::st(d_up, __fmul_rn(y, act));
  const float d_act = ST<T>::rt(__fmul_rn(y, u));
  // eager's `1 / D`: rcp.rn (MUFU.RCP and its Newton step in its SASS), correctly rounded
  const float s = __frcp_rn(smb_denominator(g));
  ST<T>::st(d_gate, __fmul_rn(__fmul_rn(d_act, s), fmaf(__fsub_rn(1.0f, s), g, 1.0f)));
}

// 16 bytes of T: the ABI promises every tensor starts 16-byte aligned (docs/spec.md section 2),
// so element K * i starts a vector for every i.
template <typename T> struct alignas(16) Vec16 {
  T v[16 / sizeof(T)];
};

template <typename T>
SMB_DEV void smb(T* __restrict__ d_gate, T* __restrict__ d_up, const T* __restrict__ dy,
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
      smb_one<T>(ST<T>::ld(&y.v[k]), ST<T>::ld(&g.v[k]), ST<T>::ld(&u.v[k]), &dg.v[k], &du.v[k]);
    reinterpret_cast<Vec16<T>*>(d_gate)[i] = dg;
    reinterpret_cast<Vec16<T>*>(d_up)[i] = du;
  }
  for (i64 e = nv * K + tid; e < n; e += stride)  // the last n % K elements
    smb_one<T>(ST<T>::ld(dy + e), ST<T>::ld(gate + e), ST<T>::ld(up + e), d_gate + e, d_up + e);
}

#define SMB_ENTRY(NAME, T)                                                                      \
  extern "C" __global__ void silu_mul_bwd_##NAME(T* d_gate, T* d_up, const T* dy,              \
                                                 const T* gate, const T* up, i64 rows,          \
                                                 i64 cols) {                                    \
    if (rows <= 0 || cols <= 0) return;                                                         \
    smb<T>(d_gate, d_up, dy, gate, up, rows * cols);                                            \
  }

SMB_ENTRY(bf16, __nv_bfloat16)
SMB_ENTRY(f16, __half)
SMB_ENTRY(f32, float)

// The entries SMB_ENTRY makes, spelled out (kernel.toml names them; a bundle's check finds each
// symbol's text in the source):
//   silu_mul_bwd_bf16 silu_mul_bwd_f16 silu_mul_bwd_f32
