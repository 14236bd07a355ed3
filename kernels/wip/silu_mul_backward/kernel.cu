// ---- kernelize: the gated MLP's backward, silu(gate) * up, eager autograd's bits (issue 30) ------
// EXPERIMENT, not a bundled kernel (no kernel.toml, nothing loads it but
// scripts/gated_backward_probe.py): docs/backward-gated.md. Self-contained for NVRTC.
//
// Eager's chain (docs/backward-gated.md), per element, g = gate, u = up, dy (values of T as f32):
//   act   = round_T(silu(g))                        the forward's saved output (kernels/src's exact
//                                                  silu: fl(g / fl(1 + expf(-g))))
//   d_up  = round_T(fl(dy * act))                  MulBackward0
//   d_act = round_T(fl(dy * u))                    MulBackward0
//   s     = __frcp_rn(D) (IEEE 1 / D)             silu_backward, D as SMB_D says
//   d_g   = round_T(fl(fl(d_act * s) * fma(fl(1 - s), g, 1)))
// SMB_D (a define, one module per value): what eager's build made of `1 + exp(-g)` in its
// silu_backward kernel, the open question (torch 2.15's SASS for sm_90 fuses expf's last scaling
// with the 1 +: D = fma(2^n, 2^f, 1)):
//   0: D = __fadd_rn(1, expf(-g))  (two roundings, as the forward's exact silu)
//   1: D = 1.0f + expf(-g)          (left to the contraction, default --fmad=true; but expf(-g)
//                                    is shared with the forward's act, and ptxas leaves a shared
//                                    product unfused: FMUL then FADD, read with nvdisasm)
//   2: as 1 with expf of its own (its argument through an opaque move, so that the compiler
//      cannot share it with act's): ptxas then fuses expf's final scaling with the 1 + into one
//      FFMA, the form eager's SASS has (read with nvdisasm on NVRTC 13's sm_90 code)
//
// Entry: smb_<dt>(T* d_gate, T* d_up, const T* dy, const T* gate, const T* up, long long n),
// any grid and block (a grid-stride loop over n elements).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef SMB_D
#define SMB_D 1
#endif
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

SMB_DEV float smb_denominator(float g) {
#if SMB_D == 0
  return __fadd_rn(1.0f, expf(-g));
#elif SMB_D == 1
  return 1.0f + expf(-g);
#else
  float h = g;
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
  asm volatile("mov.b32 %0, %1;" : "=f"(h) : "f"(g));  // (the CPU harness has no PTX: a copy)
#endif
  return 1.0f + expf(-h);
#endif
}

template <typename T>
SMB_DEV void smb(T* __restrict__ d_gate, T* __restrict__ d_up, const T* __restrict__ dy,
                 const T* __restrict__ gate, const T* __restrict__ up, i64 n) {
  const i64 stride = (i64)gridDim.x * blockDim.x;
  for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
    const float y = ST<T>::ld(dy + e), g = ST<T>::ld(gate + e), u = ST<T>::ld(up + e);
    const float act = ST<T>::rt(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))));
    ST<T>::st(d_up + e, __fmul_rn(y, act));
    const float d_act = ST<T>::rt(__fmul_rn(y, u));
    // eager's `1 / D`: rcp.rn (MUFU.RCP and its Newton step in its SASS), correctly rounded
    const float s = __frcp_rn(smb_denominator(g));
    ST<T>::st(d_gate + e, __fmul_rn(__fmul_rn(d_act, s), fmaf(__fsub_rn(1.0f, s), g, 1.0f)));
  }
}

#define SMB_ENTRY(NAME, T)                                                                      \
  extern "C" __global__ void smb_##NAME(T* d_gate, T* d_up, const T* dy, const T* gate,         \
                                        const T* up, i64 n) {                                   \
    smb<T>(d_gate, d_up, dy, gate, up, n);                                                      \
  }

SMB_ENTRY(bf16, __nv_bfloat16)
SMB_ENTRY(f16, __half)
SMB_ENTRY(f32, float)
