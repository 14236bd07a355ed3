// kernelize built-in reference layers: docs/reference-semantics.md, to the bit.
// Straightforward on purpose: one 256-thread block per row for the row-wise ops, a grid-stride
// loop for the elementwise ones. Every bit-deciding operation is an explicit IEEE intrinsic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float f32_of(float v) { return v; }
__device__ __forceinline__ float f32_of(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float f32_of(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T round_to(float v);
template <> __device__ __forceinline__ float round_to<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 round_to<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half round_to<__half>(float v) { return __float2half_rn(v); }

#define LANES 256

// Canonical row reduction, sum: lane t's partial is already in `acc`; butterfly over lanes.
__device__ float crr_sum(float acc, float* sh) {
    const int t = threadIdx.x;
    sh[t] = acc;
    __syncthreads();
    for (int s = LANES / 2; s >= 1; s >>= 1) {
        if (t < s) sh[t] = __fadd_rn(sh[t], sh[t + s]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

struct Welford { float n, mean, m2; };

__device__ __forceinline__ void welford_push(Welford& w, float x) {
    w.n = __fadd_rn(w.n, 1.0f);
    float d = __fsub_rn(x, w.mean);
    w.mean = __fadd_rn(w.mean, __fdiv_rn(d, w.n));
    w.m2 = fmaf(d, __fsub_rn(x, w.mean), w.m2);
}

__device__ __forceinline__ Welford welford_combine(Welford a, Welford b) {
    Welford r;
    r.n = __fadd_rn(a.n, b.n);
    if (r.n == 0.0f) { r.n = 0.0f; r.mean = 0.0f; r.m2 = 0.0f; return r; }
    float coef = __fdiv_rn(1.0f, r.n);
    float na = __fmul_rn(a.n, coef);
    float nb = __fmul_rn(b.n, coef);
    float delta = __fsub_rn(b.mean, a.mean);
    r.mean = fmaf(na, a.mean, __fmul_rn(nb, b.mean));
    r.m2 = fmaf(__fmul_rn(__fmul_rn(delta, delta), a.n), nb, __fadd_rn(a.m2, b.m2));
    return r;
}

// SEM: 0 llama, 1 gemma, 2 torch. RESID: fused_add_rms_norm (residual := round(x + residual)).
template <typename T, int SEM, bool RESID>
__device__ void rms_norm_ref(T* out, T* residual, const T* x, const T* w, long long cols, float eps) {
    __shared__ float sh[LANES];
    const long long row = blockIdx.x;
    const int t = threadIdx.x;
    const T* xr = x + row * cols;
    T* rr = RESID ? residual + row * cols : nullptr;
    T* yr = out + row * cols;
    float acc = 0.0f;
    for (long long base = 0; base < cols; base += 8 * LANES) {
        for (int j = 0; j < 8; ++j) {
            long long i = base + (long long)t * 8 + j;
            if (i >= cols) break;
            float v;
            if (RESID) {
                T s = round_to<T>(__fadd_rn(f32_of(xr[i]), f32_of(rr[i])));
                rr[i] = s;
                v = f32_of(s);
            } else {
                v = f32_of(xr[i]);
            }
            acc = __fadd_rn(acc, __fmul_rn(v, v));
        }
    }
    // crr_sum's barriers also make this block's residual writes visible to the whole block.
    float sum = crr_sum(acc, sh);
    float var = __fmul_rn(sum, __fdiv_rn(1.0f, (float)cols));
    float r = rsqrtf(__fadd_rn(var, eps));
    for (long long i = t; i < cols; i += LANES) {
        float h = RESID ? f32_of(rr[i]) : f32_of(xr[i]);
        float wv = f32_of(w[i]);
        float y;
        if (SEM == 0) {
            T n = round_to<T>(__fmul_rn(h, r));
            y = __fmul_rn(wv, f32_of(n));
        } else if (SEM == 1) {
            y = __fmul_rn(__fmul_rn(h, r), __fadd_rn(1.0f, wv));
        } else {
            y = __fmul_rn(__fmul_rn(h, r), wv);
        }
        yr[i] = round_to<T>(y);
    }
}

template <typename T>
__device__ void layer_norm_ref(T* out, const T* x, const T* w, const T* b, long long cols, float eps) {
    __shared__ float sn[LANES], sm[LANES], s2[LANES];
    const long long row = blockIdx.x;
    const int t = threadIdx.x;
    const T* xr = x + row * cols;
    T* yr = out + row * cols;
    Welford st = {0.0f, 0.0f, 0.0f};
    for (long long base = 0; base < cols; base += 8 * LANES) {
        for (int j = 0; j < 8; ++j) {
            long long i = base + (long long)t * 8 + j;
            if (i >= cols) break;
            welford_push(st, f32_of(xr[i]));
        }
    }
    sn[t] = st.n; sm[t] = st.mean; s2[t] = st.m2;
    __syncthreads();
    for (int s = LANES / 2; s >= 1; s >>= 1) {
        if (t < s) {
            Welford a = {sn[t], sm[t], s2[t]};
            Welford c = {sn[t + s], sm[t + s], s2[t + s]};
            Welford r = welford_combine(a, c);
            sn[t] = r.n; sm[t] = r.mean; s2[t] = r.m2;
        }
        __syncthreads();
    }
    float mean = sm[0];
    float var = __fdiv_rn(s2[0], sn[0]);
    float rstd = rsqrtf(__fadd_rn(var, eps));
    for (long long i = t; i < cols; i += LANES) {
        float h = f32_of(xr[i]);
        yr[i] = round_to<T>(fmaf(__fmul_rn(__fsub_rn(h, mean), rstd), f32_of(w[i]), f32_of(b[i])));
    }
}

__device__ __forceinline__ float silu_f(float h) { return __fdiv_rn(h, __fadd_rn(1.0f, expf(-h))); }
__device__ __forceinline__ float gelu_f(float h) {
    return __fmul_rn(__fmul_rn(h, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(h, 0.70710678118654752f))));
}
__device__ __forceinline__ float gelu_tanh_f(float h) {
    float inner = __fmul_rn(0.79788456080286536f, fmaf(0.044715f, __fmul_rn(__fmul_rn(h, h), h), h));
    return __fmul_rn(__fmul_rn(0.5f, h), __fadd_rn(1.0f, tanhf(inner)));
}

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

#define REFS(T, S)                                                                                          \
extern "C" __global__ void __launch_bounds__(LANES) ref_rms_norm_llama_##S(T* out, const T* x, const T* w, long long rows, long long cols, float eps) { rms_norm_ref<T, 0, false>(out, nullptr, x, w, cols, eps); } \
extern "C" __global__ void __launch_bounds__(LANES) ref_rms_norm_gemma_##S(T* out, const T* x, const T* w, long long rows, long long cols, float eps) { rms_norm_ref<T, 1, false>(out, nullptr, x, w, cols, eps); } \
extern "C" __global__ void __launch_bounds__(LANES) ref_rms_norm_torch_##S(T* out, const T* x, const T* w, long long rows, long long cols, float eps) { rms_norm_ref<T, 2, false>(out, nullptr, x, w, cols, eps); } \
extern "C" __global__ void __launch_bounds__(LANES) ref_fused_add_rms_norm_default_##S(T* out, T* residual, const T* x, const T* w, long long rows, long long cols, float eps) { rms_norm_ref<T, 0, true>(out, residual, x, w, cols, eps); } \
extern "C" __global__ void __launch_bounds__(LANES) ref_layer_norm_default_##S(T* out, const T* x, const T* w, const T* b, long long rows, long long cols, float eps) { layer_norm_ref<T>(out, x, w, b, cols, eps); } \
extern "C" __global__ void ref_silu_default_##S(T* out, const T* x, long long n) { GRID_STRIDE(i, n) out[i] = round_to<T>(silu_f(f32_of(x[i]))); } \
extern "C" __global__ void ref_gelu_default_##S(T* out, const T* x, long long n) { GRID_STRIDE(i, n) out[i] = round_to<T>(gelu_f(f32_of(x[i]))); } \
extern "C" __global__ void ref_gelu_tanh_default_##S(T* out, const T* x, long long n) { GRID_STRIDE(i, n) out[i] = round_to<T>(gelu_tanh_f(f32_of(x[i]))); } \
extern "C" __global__ void ref_silu_and_mul_default_##S(T* out, const T* x, long long rows, long long cols) { \
    GRID_STRIDE(i, rows * cols) { long long r = i / cols, c = i - r * cols; \
        T s = round_to<T>(silu_f(f32_of(x[r * 2 * cols + c]))); \
        out[i] = round_to<T>(__fmul_rn(f32_of(s), f32_of(x[r * 2 * cols + cols + c]))); } }

REFS(__nv_bfloat16, bf16)
REFS(__half, f16)
REFS(float, f32)

// Verifier utility (not a reference layer): *sum += sum over i of mix(key, i, a[i]) mod 2^64,
// mix = splitmix64's finaliser of (key + i * golden) ^ word, a bijection in the word, so one
// changed word always changes the sum. The key is drawn after the candidate's launches, so a
// kernel cannot make changes that cancel. The host computes the same sum over its own copy
// (crate::numeric::keyed_sum) and downloads the buffer only when the two differ.
extern "C" __global__ void kz_keyed_sum_u32(const unsigned int* a, long long n, unsigned long long key,
                                            unsigned long long* sum) {
    unsigned long long local = 0;
    GRID_STRIDE(i, n) {
        unsigned long long z = (key + (unsigned long long)i * 0x9E3779B97F4A7C15ull) ^ (unsigned long long)a[i];
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        local += z ^ (z >> 31);
    }
    for (int o = 16; o > 0; o >>= 1) local += __shfl_down_sync(0xffffffffu, local, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(sum, local);
}
