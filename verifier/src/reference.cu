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

// One 512-thread block per row for the row-wise ops (RB threads; a thread t < lanes IS lane t of
// the order it follows), everything through shared memory and __syncthreads, so the code reads
// like the pseudo-code of docs/reference-semantics.md.
#define RB 512

__device__ __forceinline__ int last_pow2(long long n) {
    int p = 1;
    while ((long long)p * 2 <= n && p < 512) p *= 2;
    return p;
}

// ---- The mean order (HF LlamaRMSNorm / GemmaRMSNorm, residual add + norm) ----------------------
// Eager's `h.pow(2).mean(-1)` on a [rows, cols] f32 tensor: Reduce.cuh with the block
// setReduceConfig picks from (rows, cols) (docs/eager-order.md, section (a)), at every row count:
// (bw, bh) and split_across_warps decide how many lanes share a row and the trees' shapes, so
// the order changes below 16 rows (bh = 1, 2, 4, 8). Row `row` of the tensor starts
// (row * cols) % 4 floats past a 16-byte boundary: its head elements go to lanes s..3 alone,
// then 4-vectors, then the tail. Returns the row's sum of squares of v(i), i < cols.
template <typename V>
__device__ float mean_order_sum(V v, long long rows, long long row, long long cols, float* sh) {
    const int t = threadIdx.x;
    const bool vec = cols > 128;
    const long long d0 = vec ? cols / 4 : cols;
    const int p0 = d0 < 512 ? last_pow2(d0) : 512;
    const int p1 = rows < 512 ? last_pow2(rows) : 512;
    int bw = min(p0, 32);
    const int bh = min(p1, 512 / bw);
    bw = min(p0, 512 / bh);
    const bool split = (cols + bw - 1) / bw >= (long long)min(16 * bh, 256);
    const int lanes = split ? bw * bh : bw;  // lane t = x + bw * y
    float p = 0.0f;
    if (t < lanes) {
        float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (vec) {
            const int s = (int)((row * cols) % 4);
            const long long head = s > 0 ? 4 - s : 0;
            if (s > 0 && t >= s && t < 4) a[0] = v(t - s);  // lane x = s + e takes element e
            const long long m = cols - head;
            const long long nv = m / 4;
            for (long long u = t; u < nv; u += lanes)
                for (int i = 0; i < 4; ++i) a[i] = __fadd_rn(a[i], v(head + 4 * u + i));
            if (t < (int)(m % 4)) a[0] = __fadd_rn(a[0], v(head + 4 * nv + t));  // the tail, after
        } else {
            int k = 0;
            for (long long i = t; i < cols; i += lanes, ++k) a[k & 3] = __fadd_rn(a[k & 3], v(i));
        }
        p = __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), a[2]), a[3]);
    }
    sh[t] = p;
    __syncthreads();
    // block_x_reduce: within each group of bw lanes, offsets bw/2 .. 1, lane x += lane x + off
    for (int off = bw / 2; off >= 1; off >>= 1) {
        if (t < lanes && (t & (bw - 1)) < off) sh[t] = __fadd_rn(sh[t], sh[t + off]);
        __syncthreads();
    }
    // block_y_reduce (the bh groups share the row): offsets bh/2 .. 1 on each group's lane 0
    if (split) {
        for (int off = bh / 2; off >= 1; off >>= 1) {
            if (t < off) sh[bw * t] = __fadd_rn(sh[bw * t], sh[bw * (t + off)]);
            __syncthreads();
        }
    }
    const float r = sh[0];
    __syncthreads();
    return r;
}

// MeanOps' factor: float(rows) / float(rows * cols), a float division on the host (fl(1/cols)
// while rows * cols is exact in f32).
__device__ __forceinline__ float mean_factor(long long rows, long long cols) {
    return __fdiv_rn((float)rows, (float)(rows * cols));
}

// ---- The layer-norm order (nn.LayerNorm, F.rms_norm) -------------------------------------------
// One state per lane; 128 lanes of 4-vectors when cols % 4 == 0 (the vectorized kernel), else 512
// lanes of single elements (the row-wise kernel). Trees: each warp offsets 16 .. 1, then the warp
// results offsets W/2 .. 1, always combine(own = lower, other = higher).
struct St { float mean, m2, n; };

// nn.LayerNorm, vectorized kernel (WelfordDataLN, cuWelfordOnlineSum / cuWelfordCombine)
__device__ __forceinline__ void wv_push(St& s, float x) {
    const float d = __fsub_rn(x, s.mean);
    s.n = __fadd_rn(s.n, 1.0f);
    const float m = fmaf(d, __fdiv_rn(1.0f, s.n), s.mean);
    s.m2 = fmaf(d, __fsub_rn(x, m), s.m2);
    s.mean = m;
}
__device__ __forceinline__ St wv_combine(St own, St other) {
    St r;
    r.n = __fadd_rn(other.n, own.n);
    if (r.n > 0.0f) {
        const float c = __fdiv_rn(1.0f, r.n);
        const float na = __fmul_rn(other.n, c), nb = __fmul_rn(own.n, c);
        const float d = __fsub_rn(own.mean, other.mean);
        r.mean = fmaf(na, other.mean, __fmul_rn(nb, own.mean));
        r.m2 = fmaf(__fmul_rn(__fmul_rn(d, d), other.n), nb, __fadd_rn(other.m2, own.m2));
    } else {
        r.mean = 0.0f;
        r.m2 = 0.0f;
    }
    return r;
}
// row-wise kernel (WelfordOps reduce / combine)
__device__ __forceinline__ void wr_push(St& s, float x) {
    s.n = __fadd_rn(s.n, 1.0f);
    const float d = __fsub_rn(x, s.mean);
    s.mean = __fadd_rn(s.mean, __fdiv_rn(d, s.n));
    s.m2 = fmaf(d, __fsub_rn(x, s.mean), s.m2);
}
__device__ __forceinline__ St wr_combine(St a, St b) {
    if (a.n == 0.0f) return b;
    if (b.n == 0.0f) return a;
    const float d = __fsub_rn(b.mean, a.mean);
    St r;
    r.n = __fadd_rn(a.n, b.n);
    const float nb = __fdiv_rn(b.n, r.n);
    r.mean = fmaf(d, nb, a.mean);
    r.m2 = fmaf(__fmul_rn(__fmul_rn(d, d), a.n), nb, __fadd_rn(a.m2, b.m2));
    return r;
}
// F.rms_norm, vectorized kernel: m2 = sum of fma(x, x, m2); combine adds
__device__ __forceinline__ void sq_push(St& s, float x) { s.m2 = fmaf(x, x, s.m2); }
__device__ __forceinline__ St sq_combine(St own, St other) {
    St r = own;
    r.m2 = __fadd_rn(own.m2, other.m2);
    return r;
}

// KIND 0: nn.LayerNorm, KIND 1: F.rms_norm. Returns the row's final state.
template <int KIND, typename T>
__device__ St ln_order_stats(const T* xr, long long cols, St* sh) {
    const int t = threadIdx.x;
    const bool vec = cols % 4 == 0 && cols <= (1LL << 24);
    const int lanes = vec ? 128 : 512;
    St s = {0.0f, 0.0f, 0.0f};
    if (t < lanes) {
        if (vec) {
            for (long long u = t; u < cols / 4; u += lanes)
                for (int i = 0; i < 4; ++i) {
                    const float x = f32_of(xr[4 * u + i]);
                    if (KIND == 0) wv_push(s, x); else sq_push(s, x);
                }
        } else {
            for (long long i = t; i < cols; i += lanes) wr_push(s, f32_of(xr[i]));
        }
    }
    sh[t] = s;
    __syncthreads();
    auto comb = [&](St a, St b) {
        return !vec ? wr_combine(a, b) : (KIND == 0 ? wv_combine(a, b) : sq_combine(a, b));
    };
    for (int off = 16; off >= 1; off >>= 1) {
        if (t < lanes && (t & 31) < off) sh[t] = comb(sh[t], sh[t + off]);
        __syncthreads();
    }
    for (int off = lanes / 64; off >= 1; off >>= 1) {
        if (t < off) sh[32 * t] = comb(sh[32 * t], sh[32 * (t + off)]);
        __syncthreads();
    }
    const St r = sh[0];
    __syncthreads();
    return r;
}

// The fused adds' first step for one row: residual := round(x + residual) (eager's add in T),
// visible to the whole block after it.
template <typename T>
__device__ void add_residual_row(T* rr, const T* xr, long long cols) {
    for (long long i = threadIdx.x; i < cols; i += RB) rr[i] = round_to<T>(__fadd_rn(f32_of(xr[i]), f32_of(rr[i])));
    __syncthreads();
}

// SEM: 0 llama, 1 gemma, 2 torch. RESID: fused_add_rms_norm (residual := round(x + residual)).
template <typename T, int SEM, bool RESID>
__device__ void rms_norm_ref(T* out, T* residual, const T* x, const T* w, long long rows, long long cols, float eps) {
    __shared__ float sh[RB];
    __shared__ St shs[RB];
    const long long row = blockIdx.x;
    const int t = threadIdx.x;
    const T* xr = x + row * cols;
    T* rr = RESID ? residual + row * cols : nullptr;
    T* yr = out + row * cols;
    if (RESID) add_residual_row(rr, xr, cols);
    const T* hr = RESID ? rr : xr;
    float r;
    if (SEM == 2) {
        const St s = ln_order_stats<1>(hr, cols, shs);
        if (cols % 4 == 0 && cols <= (1LL << 24)) {
            r = rsqrtf(__fadd_rn(__fdiv_rn(s.m2, (float)cols), eps));
        } else {  // the row-wise kernel: rsqrt(var + mean^2 + eps) from the Welford moments
            r = rsqrtf(__fadd_rn(fmaf(s.mean, s.mean, __fdiv_rn(s.m2, s.n)), eps));
        }
    } else {
        auto sq = [&](long long i) { const float h = f32_of(hr[i]); return __fmul_rn(h, h); };
        const float sum = mean_order_sum(sq, rows, row, cols, sh);
        const float var = __fmul_rn(sum, mean_factor(rows, cols));
        r = rsqrtf(__fadd_rn(var, eps));
    }
    for (long long i = t; i < cols; i += RB) {
        float h = f32_of(hr[i]);
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

// RESID: fused_add_layer_norm (residual := round(x + residual), then nn.LayerNorm of it: GPT-2's
// `h = attn(ln_1(x)) + residual; ln_2(h)`, eager's bf16/f16/f32 add then eager's layer norm).
template <typename T, bool RESID>
__device__ void layer_norm_ref(T* out, T* residual, const T* x, const T* w, const T* b, long long cols, float eps) {
    __shared__ St shs[RB];
    const long long row = blockIdx.x;
    const int t = threadIdx.x;
    const T* xr = x + row * cols;
    T* yr = out + row * cols;
    if (RESID) {
        add_residual_row(residual + row * cols, xr, cols);
        xr = residual + row * cols;
    }
    const St s = ln_order_stats<0>(xr, cols, shs);
    const float mean = s.mean;
    const float rstd = rsqrtf(__fadd_rn(__fdiv_rn(s.m2, s.n), eps));
    for (long long i = t; i < cols; i += RB) {
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

// ---- The backward of HF LlamaRMSNorm / GemmaRMSNorm under eager autograd (docs/backward.md) ----
// The candidate's ABI (Op::stages of rms_norm_backward: dx, dwp, dw, launched in that order on
// one stream with kernel_registry::backward's grids), written as plainly as the forward ones:
// each loops over its work so any grid gives the same bits. The workspace holds the rows' r
// (rows floats), then one partial column sum per CTA of eager's column reduction
// (ctas x cols floats, CTA-major). Not the bundled kernel's code: the row sum is the forward
// mean's order above, the column sum a transcription of Reduce.cuh's outer reduction
// (thread_reduce_impl's four accumulators, block_y_reduce, global_reduce) one thread per chain.
// SEM 0 is llama (y = w * round_T(h * r)), 1 gemma (y = round_T(h * r * (1 + w)), docs/backward.md
// "Gemma"): the same orders; only the elementwise steps below (rms_bwd_g, rms_bwd_dw_term) differ.

// The gradient reaching n = h * r, in f32: llama's MulBackward0 of w * nc rounds dy * w to T
// (then ToCopyBackward0 widens it); gemma's MulBackward0 of n * (1 + w) keeps dy * fl(1 + w) in f32.
template <typename T, int SEM>
__device__ __forceinline__ float rms_bwd_g(T dy, T w) {
    if (SEM == 1) return __fmul_rn(f32_of(dy), __fadd_rn(1.0f, f32_of(w)));
    return f32_of(round_to<T>(__fmul_rn(f32_of(dy), f32_of(w))));
}
// dw's summand (MulBackward0's grad of the weight side, before sum_to): llama's
// round_T(dy * nc), nc = round_T(h * r) (the forward's n.to(T), saved); gemma's fl(dy * n), n = fl(h * r)
// in f32 (saved), summed in f32 (sum_functor<float>) and rounded to T once at the end.
template <typename T, int SEM>
__device__ __forceinline__ float rms_bwd_dw_term(T dy, T x, float r) {
    const float n = __fmul_rn(f32_of(x), r);
    if (SEM == 1) return __fmul_rn(f32_of(dy), n);
    return f32_of(round_to<T>(__fmul_rn(f32_of(dy), f32_of(round_to<T>(n)))));
}

// dx, and the rows' r into ws: one 512-thread block per row (blocks loop over rows).
template <typename T, int SEM>
__device__ void rms_bwd_dx_ref(T* dx, float* ws, const T* dy, const T* x, const T* w, long long rows, long long cols, float eps) {
    __shared__ float sh[RB];
    const int t = threadIdx.x;
    // MeanBackward1's division: a * (1 / N) with the reciprocal formed in double (current sources)
    const float inv_n = (float)(1.0 / (double)cols);
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * cols;
        const T* gr = dy + row * cols;
        T* dr = dx + row * cols;
        // the forward's r (autograd saves it): the mean of squares in the mean order, + eps, rsqrt
        auto sq = [&](long long i) { const float h = f32_of(xr[i]); return __fmul_rn(h, h); };
        const float r = rsqrtf(__fadd_rn(__fmul_rn(mean_order_sum(sq, rows, row, cols, sh), mean_factor(rows, cols)), eps));
        // s: the row sum of g * h (MulBackward0 of n = h * r, grad of r; sum_to [rows, 1]), g = rms_bwd_g
        auto q = [&](long long i) { return __fmul_rn(rms_bwd_g<T, SEM>(gr[i], w[i]), f32_of(xr[i])); };
        const float s = mean_order_sum(q, rows, row, cols, sh);
        // RsqrtBackward0: -0.5 * grad * r.pow(3) (pow 3 = (r * r) * r); MeanBackward1: * (1 / N)
        const float ga = __fmul_rn(__fmul_rn(s, -0.5f), __fmul_rn(__fmul_rn(r, r), r));
        const float gp = __fmul_rn(ga, inv_n);
        for (long long i = t; i < cols; i += RB) {
            const float h = f32_of(xr[i]);
            const float g = rms_bwd_g<T, SEM>(gr[i], w[i]);
            const float gh1 = __fmul_rn(g, r);                    // MulBackward0 of h * r: grad * r
            const float gh2 = __fmul_rn(gp, __fmul_rn(2.0f, h));   // PowBackward0: grad * (2 * h)
            dr[i] = round_to<T>(__fadd_rn(gh1, gh2));             // the InputBuffer's sum, to T
        }
        if (t == 0) ws[row] = r;
        __syncthreads();
    }
}

// Reduce.cuh's setReduceConfig for sum(dim=0) of a fresh [rows, cols] tensor (docs/backward.md,
// "The column sum"; kernel_registry::backward::col_config is the host's copy).
struct ColCfg { long long bh, ctas, step; bool split; };
__device__ __forceinline__ long long lp2(long long n) {
    long long p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}
__device__ ColCfg col_cfg(long long rows, long long cols, long long sms, long long threads_per_sm) {
    const long long ov = cols % 4 == 0 ? 4 : cols % 2 == 0 ? 2 : 1;
    const long long max_t = 512 / ov, dim0 = cols / ov;
    const long long d0 = dim0 < max_t ? lp2(dim0) : max_t;
    const long long d1 = rows < max_t ? lp2(rows) : max_t;
    long long bw = d0 < 32 ? d0 : 32;
    const long long bh = d1 < max_t / bw ? d1 : max_t / bw;
    bw = d0 < max_t / bh ? d0 : max_t / bh;
    long long step_in = 1, step_out = bw;
    const bool split = rows >= (bh * 16 < 256 ? bh * 16 : 256);
    if (split) step_in *= bh; else step_out *= bh;
    const long long target = sms * (threads_per_sm / (bw * bh));
    const long long grid_x = (dim0 + step_out - 1) / step_out;
    const long long vpt = (rows + step_in - 1) / step_in;
    long long ctas = 1;
    if (split && vpt >= 256 && grid_x <= target) {
        const long long a = (target + grid_x - 1) / grid_x, b = (vpt + 15) / 16, c = (vpt + 255) / 256;
        ctas = a < b ? a : b;
        if (ctas < c) ctas = c;
        if (ctas > 1) step_in *= ctas;
    }
    return ColCfg{bh, ctas, step_in, split};
}

// dwp: CTA k's partial of column c, one thread per (k, c): each of the block's warp-rows y
// (y < bh when they split the rows, else y = 0) runs thread_reduce_impl over rows
// y + bh*k + step*m (the m-th into accumulator m % 4, folded ((a0 + a1) + a2) + a3), then
// block_y_reduce: offsets bh/2 .. 1, lower += upper. The summand is rms_bwd_dw_term.
#define KZ_REF_MAX_BH 512
template <typename T, int SEM>
__device__ void rms_bwd_dwp_ref(float* ws, const T* dy, const T* x, long long rows, long long cols, long long sms, long long threads_per_sm) {
    const ColCfg c = col_cfg(rows, cols, sms, threads_per_sm);
    const long long ys = c.split ? c.bh : 1;
    const long long items = c.ctas * cols;
    float p[KZ_REF_MAX_BH];
    for (long long it = (long long)blockIdx.x * blockDim.x + threadIdx.x; it < items; it += (long long)gridDim.x * blockDim.x) {
        const long long k = it / cols, col = it - k * cols;
        for (long long y = 0; y < ys; ++y) {
            float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            long long m = 0;
            for (long long row = y + (c.ctas > 1 ? c.bh * k : 0); row < rows; row += c.step, ++m) {
                const float v = rms_bwd_dw_term<T, SEM>(dy[row * cols + col], x[row * cols + col], ws[row]);
                a[m & 3] = __fadd_rn(a[m & 3], v);
            }
            p[y] = __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), a[2]), a[3]);
        }
        for (long long off = ys / 2; off >= 1; off /= 2)
            for (long long y = 0; y < off; ++y) p[y] = __fadd_rn(p[y], p[y + off]);
        ws[rows + k * cols + col] = p[0];
    }
}

// dw: column c's CTA partials. One CTA: its partial. Several: global_reduce (thread y of the
// last CTA sums 0 + P[y] + P[y + bh] + ... in order), then block_y_reduce over bh; to T.
template <typename T>
__device__ void rms_bwd_dw_ref(T* dw, const float* ws, long long rows, long long cols, long long sms, long long threads_per_sm) {
    const ColCfg c = col_cfg(rows, cols, sms, threads_per_sm);
    float p[KZ_REF_MAX_BH];
    GRID_STRIDE(col, cols) {
        float v;
        if (c.ctas == 1) {
            v = ws[rows + col];
        } else {
            for (long long y = 0; y < c.bh; ++y) {
                float a = 0.0f;
                for (long long k = y; k < c.ctas; k += c.bh) a = __fadd_rn(a, ws[rows + k * cols + col]);
                p[y] = a;
            }
            for (long long off = c.bh / 2; off >= 1; off /= 2)
                for (long long y = 0; y < off; ++y) p[y] = __fadd_rn(p[y], p[y + off]);
            v = p[0];
        }
        dw[col] = round_to<T>(v);
    }
}

// ---- The backward of silu(gate) * up under eager autograd (docs/backward-gated.md) ----------------
// The candidate's ABI (Op::stages of silu_mul_backward: one entry `grad` writing both gradients),
// one thread an element (a grid-stride loop: any grid gives the same bits). Per element, g = gate,
// u = up, in f32, round_to<T> the storage rounding:
//   act    = round_T(silu(g)), the forward's saved output in its reference order (silu_f above)
//   d_up   = round_T(dy * act)                                       MulBackward0, grad * self
//   d_act  = round_T(dy * u)                                         MulBackward0, grad * other
//   D      = 1 + expf(-g) with expf's last scaling and the 1 + in one FMA (what nvcc made of
//            eager's silu_backward for sm_90): left to NVRTC's contraction, expf(-g) taken again
//            on g through an opaque move so that it is not act's (a shared result stays unfused)
//   s      = 1 / D, IEEE (__frcp_rn)
//   d_gate = round_T((d_act * s) * fma(1 - s, g, 1))                 SiluBackward0
__device__ __forceinline__ float silu_bwd_denominator(float g) {
    float h = g;
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
    asm volatile("mov.b32 %0, %1;" : "=f"(h) : "f"(g));  // (the CPU harness has no PTX: a copy)
#endif
    return 1.0f + expf(-h);
}

template <typename T>
__device__ void silu_mul_bwd_grad_ref(T* d_gate, T* d_up, const T* dy, const T* gate, const T* up, long long rows, long long cols) {
    if (rows <= 0 || cols <= 0) return;
    GRID_STRIDE(i, rows * cols) {
        const float y = f32_of(dy[i]), g = f32_of(gate[i]), u = f32_of(up[i]);
        const float act = f32_of(round_to<T>(silu_f(g)));
        d_up[i] = round_to<T>(__fmul_rn(y, act));
        const float d_act = f32_of(round_to<T>(__fmul_rn(y, u)));
        const float s = __frcp_rn(silu_bwd_denominator(g));
        d_gate[i] = round_to<T>(__fmul_rn(__fmul_rn(d_act, s), fmaf(__fsub_rn(1.0f, s), g, 1.0f)));
    }
}

// ---- The backward of gelu_tanh(gate) * up under eager autograd (docs/backward-gated.md) ----------
// The ABI of silu_mul_backward (one entry `grad`), one thread an element. Per element, in f32:
//   act    = round_T(gelu_tanh(g)), the forward's saved output in its reference order (gelu_tanh_f)
//   d_up   = round_T(dy * act)                                       MulBackward0, grad * self
//   d_act  = round_T(dy * u)                                         MulBackward0, grad * other
//   d_gate = round_T(gelu_backward(d_act, g))                        GeluBackward0, tanh branch
// gelu_backward as ActivationGeluKernel.cu writes it, with the contractions nvcc made for sm_90
// (torch 2.15+cu132's SASS): x_cube = (x * x) * x; inner = kBeta * fma(x_cube, kKappa, x);
// t = tanhf(inner); left = 0.5 * x; right = 1 + t; tanh_derivative = fma(-t, t, 1);
// inner_derivative = kBeta * fma(x * x, 3 * kKappa, 1) (3 * kKappa folded in f32);
// right_derivative = (left * tanh_derivative) * inner_derivative;
// result = dy * fma(right, 0.5, right_derivative) (0.5 * right + right_derivative, fused).
__device__ __forceinline__ float gelu_tanh_bwd_f(float dy, float x) {
    const float kBeta = 0.79788456080286536f, kKappa = 0.044715f;
    const float three_kappa = __fmul_rn(3.0f, kKappa);
    const float x_sq = __fmul_rn(x, x);
    const float x_cube = __fmul_rn(x_sq, x);
    const float inner = __fmul_rn(kBeta, fmaf(x_cube, kKappa, x));
    const float tanh_inner = tanhf(inner);
    const float left = __fmul_rn(0.5f, x);
    const float right = __fadd_rn(1.0f, tanh_inner);
    const float tanh_derivative = fmaf(-tanh_inner, tanh_inner, 1.0f);
    const float inner_derivative = __fmul_rn(kBeta, fmaf(x_sq, three_kappa, 1.0f));
    const float right_derivative = __fmul_rn(__fmul_rn(left, tanh_derivative), inner_derivative);
    return __fmul_rn(dy, fmaf(right, 0.5f, right_derivative));
}

template <typename T>
__device__ void gelu_tanh_mul_bwd_grad_ref(T* d_gate, T* d_up, const T* dy, const T* gate, const T* up, long long rows, long long cols) {
    if (rows <= 0 || cols <= 0) return;
    GRID_STRIDE(i, rows * cols) {
        const float y = f32_of(dy[i]), g = f32_of(gate[i]), u = f32_of(up[i]);
        d_up[i] = round_to<T>(__fmul_rn(y, f32_of(round_to<T>(gelu_tanh_f(g)))));
        d_gate[i] = round_to<T>(gelu_tanh_bwd_f(f32_of(round_to<T>(__fmul_rn(y, u))), g));
    }
}

// ---- The backward of the elementwise activations under eager autograd (docs/backward-activations.md)
// The candidate's ABI (Op::stages of silu_backward, gelu_backward, gelu_tanh_backward: one entry
// `grad`, dx from dy and x over n elements), one thread an element. dx = round_T(f(dy, x)) in f32,
// f the one CUDA kernel eager autograd runs for the node, with the contractions nvcc made of it:
//   SiluBackward0 (silu_backward_kernel): s = 1 / D as silu_mul_backward's d_gate above (D with
//       expf's last scaling and the 1 + in one FMA; IEEE reciprocal), dx = (dy * s) * fma(1 - s, x, 1)
//   GeluBackward0, approximate 'tanh': gelu_tanh_bwd_f above (read from eager's sm_90 SASS)
//   GeluBackward0, approximate 'none' (GeluBackwardCUDAKernelImpl's erf branch; its sm_90 SASS read
//       from torch 2.15.0+cu132, docs/backward-activations.md): kAlpha = f32(M_SQRT1_2),
//       kBeta = f32(M_2_SQRTPI * M_SQRT1_2 * 0.5), cdf = 0.5 * (1 + erff(x * kAlpha)),
//       pdf = expf((-0.5 * x) * x) * kBeta, dx = dy * (cdf + x * pdf), the sum with cdf's product
//       fused (fma(1 + erf, 0.5, x * pdf); 0.5 * (1 + erf) is exact, so these are the bits of no
//       contraction); `1 + erf` and every product unfused.
__device__ __forceinline__ float gelu_erf_bwd_f(float dy, float x) {
    const float kBeta = 0.3989422804014327f, kAlpha = 0.70710678118654752f;
    const float one_plus_erf = __fadd_rn(1.0f, erff(__fmul_rn(x, kAlpha)));
    const float pdf = __fmul_rn(expf(__fmul_rn(__fmul_rn(-0.5f, x), x)), kBeta);
    return __fmul_rn(dy, fmaf(one_plus_erf, 0.5f, __fmul_rn(x, pdf)));
}

template <typename T>
__device__ void silu_bwd_grad_ref(T* dx, const T* dy, const T* x, long long n) {
    GRID_STRIDE(i, n) {
        const float y = f32_of(dy[i]), h = f32_of(x[i]);
        const float s = __frcp_rn(silu_bwd_denominator(h));
        dx[i] = round_to<T>(__fmul_rn(__fmul_rn(y, s), fmaf(__fsub_rn(1.0f, s), h, 1.0f)));
    }
}

template <typename T>
__device__ void gelu_bwd_grad_ref(T* dx, const T* dy, const T* x, long long n) {
    GRID_STRIDE(i, n) dx[i] = round_to<T>(gelu_erf_bwd_f(f32_of(dy[i]), f32_of(x[i])));
}

template <typename T>
__device__ void gelu_tanh_bwd_grad_ref(T* dx, const T* dy, const T* x, long long n) {
    GRID_STRIDE(i, n) dx[i] = round_to<T>(gelu_tanh_bwd_f(f32_of(dy[i]), f32_of(x[i])));
}

// ---- The backward of nn.LayerNorm under eager autograd (docs/backward-layer-norm.md) ----------
// The candidate's ABI (Op::stages of layer_norm_backward: dx, then dwdb, with
// kernel_registry::backward's grids; mean, rstd the forward's saved f32 statistics). Not the
// bundled kernel's code: one thread a row (dx) or a column (dw, db), every thread of the grid
// counted whatever the block's shape, and eager's orders written out sequentially.
// The index of this thread among all of the launch's, and how many there are (any block shape).
#define LN_REF_THREADS(i, n)                                                                       \
    const long long n = (long long)gridDim.x * blockDim.x * blockDim.y * blockDim.z;              \
    const long long i = ((long long)blockIdx.x * blockDim.z * blockDim.y +                        \
                         (long long)threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x

// cuda_utils::BlockReduceSum over eager's 128 threads, from their partials p[0..128): a
// shfl_down halving tree in each warp of 32 (lane l adds lane l + o, o = 16 .. 1), then warp
// 0's lanes hold the 4 warp sums and zeros, and the same tree.
__device__ float ln_ref_block_sum(float* p) {
    float w[32];
    for (int wp = 0; wp < 4; ++wp) {
        float* v = p + 32 * wp;
        for (int o = 16; o >= 1; o /= 2)
            for (int l = 0; l < o; ++l) v[l] = __fadd_rn(v[l], v[l + o]);
        w[wp] = v[0];
    }
    for (int l = 4; l < 32; ++l) w[l] = 0.0f;
    for (int o = 16; o >= 1; o /= 2)
        for (int l = 0; l < o; ++l) w[l] = __fadd_rn(w[l], w[l + o]);
    return w[0];
}

// dx, a row a thread. Eager's dx kernel (layer_norm_grad_input_kernel_vectorized): thread t of
// 128 sums, in increasing order, the elements e with (e / 4) % 128 == t, one accumulator per sum:
// s1 += fl(dy * w) (unfused), s2 = fma(fl(fl(dy * w) * fl(x - m)), r, s2); both through
// BlockReduceSum; then per element f1 = fma(fl(N * w), dy, -fl(fl(fl(x - m) * r) * s2)),
// dx = round_T(fl(fl(f1 - s1) * fl(fl(1 / N) * r))), N = cols as f32.
template <typename T>
__device__ void ln_bwd_dx_ref(T* dx, const T* dy, const T* x, const float* mean, const float* rstd, const T* w, long long rows, long long cols) {
    LN_REF_THREADS(me, all);
    for (long long row = me; row < rows; row += all) {
        const T* gr = dy + row * cols;
        const T* xr = x + row * cols;
        const float m = mean[row], r = rstd[row];
        float p1[128], p2[128];
        for (int t = 0; t < 128; ++t) p1[t] = p2[t] = 0.0f;
        for (long long e = 0; e < cols; ++e) {
            const int t = (int)((e / 4) % 128);
            const float gw = __fmul_rn(f32_of(gr[e]), f32_of(w[e]));
            p1[t] = __fadd_rn(p1[t], gw);
            p2[t] = fmaf(__fmul_rn(gw, __fsub_rn(f32_of(xr[e]), m)), r, p2[t]);
        }
        const float s1 = ln_ref_block_sum(p1), s2 = ln_ref_block_sum(p2);
        const float fN = (float)cols;
        const float term1 = __fmul_rn(__fdiv_rn(1.0f, fN), r);
        for (long long e = 0; e < cols; ++e) {
            const float bv = __fmul_rn(__fsub_rn(f32_of(xr[e]), m), r);
            const float f1 = fmaf(__fmul_rn(fN, f32_of(w[e])), f32_of(gr[e]), -__fmul_rn(bv, s2));
            dx[row * cols + e] = round_to<T>(__fmul_rn(__fsub_rn(f1, s1), term1));
        }
    }
}

// dw and db, a column a thread. Eager's GammaBetaBackward template kernel (M = rows <= 65536):
// bdy = 1 / 8 / 16 / 32 chains for M < 64 / < 128 / < 256 / else; chain y adds rows
// R * k + 8 * y + i (R = 8 * bdy, k = 0, 1, .., i = 0..7; with one chain every row in order):
// dw's fma(fl(dy * fl(x - m)), r, .), db's fl(. + dy); then the halving tree over the chains,
// v[y] = v[y] + v[y + o] for o = bdy / 2 .. 1; rounded to T.
template <typename T>
__device__ void ln_bwd_dwdb_ref(T* dw, T* db, const T* dy, const T* x, const float* mean, const float* rstd, long long rows, long long cols) {
    LN_REF_THREADS(me, all);
    const int bdy = rows < 64 ? 1 : rows < 128 ? 8 : rows < 256 ? 16 : 32;
    const long long R = 8LL * bdy;
    for (long long c = me; c < cols; c += all) {
        float vw[32], vb[32];
        for (int y = 0; y < bdy; ++y) {
            vw[y] = vb[y] = 0.0f;
            for (long long k = 0; k * R < rows; ++k) {
                for (long long i = 0; i < (bdy == 1 ? R : 8); ++i) {
                    const long long row = bdy == 1 ? k * R + i : k * R + 8LL * y + i;
                    if (row >= rows) continue;
                    const float g = f32_of(dy[row * cols + c]);
                    vw[y] = fmaf(__fmul_rn(g, __fsub_rn(f32_of(x[row * cols + c]), mean[row])), rstd[row], vw[y]);
                    vb[y] = __fadd_rn(vb[y], g);
                }
            }
        }
        for (int o = bdy / 2; o >= 1; o /= 2)
            for (int y = 0; y < o; ++y) {
                vw[y] = __fadd_rn(vw[y], vw[y + o]);
                vb[y] = __fadd_rn(vb[y], vb[y + o]);
            }
        dw[c] = round_to<T>(vw[0]);
        db[c] = round_to<T>(vb[0]);
    }
}

// ---- The backward of F.rms_norm / nn.RMSNorm under eager autograd (docs/backward-rms-torch.md) ---
// rms_norm_backward's ABI (dx, dwp, dw; ws: the rows' r, then the column sums), semantics torch:
// eager's _fused_rms_norm_backward, i.e. the layer-norm backward kernels with rms_norm = true, from
// the rstd the forward saved (recomputed here in the forward's order). Not the bundled kernel's
// code: one thread a row (dx) or a column (dwp, dw), the orders written out sequentially.
// The forward's rstd of one row (F.rms_norm's layer-norm order): cols % 4 == 0: thread t of 128
// folds its 4-vectors t, t + 128, .. with fmaf(x, x, .), each warp's halving tree, then (w0 + w2) +
// (w1 + w3); r = rsqrt(m2 / cols + eps). Else 512 lanes of WelfordOps (lane l: elements l, l + 512,
// ..), each warp's tree, then the 16 warp results' tree; r = rsqrt(fma(mean, mean, m2 / n) + eps).
template <typename T>
__device__ float rms_torch_ref_row_rstd(const T* xr, long long cols, float eps) {
    if (cols % 4 == 0 && cols <= (1LL << 24)) {
        float p[128];
        for (int t = 0; t < 128; ++t) p[t] = 0.0f;
        for (long long e = 0; e < cols; ++e) {
            const float h = f32_of(xr[e]);
            float& a = p[(e / 4) % 128];
            a = fmaf(h, h, a);
        }
        float wsum[4];
        for (int wp = 0; wp < 4; ++wp) {
            float* v = p + 32 * wp;
            for (int o = 16; o >= 1; o /= 2)
                for (int l = 0; l < o; ++l) v[l] = __fadd_rn(v[l], v[l + o]);
            wsum[wp] = v[0];
        }
        const float m2 = __fadd_rn(__fadd_rn(wsum[0], wsum[2]), __fadd_rn(wsum[1], wsum[3]));
        return rsqrtf(__fadd_rn(__fdiv_rn(m2, (float)cols), eps));
    }
    St wres[16];
    for (int j = 0; j < 16; ++j) {
        St v[32];
        for (int l = 0; l < 32; ++l) {
            v[l] = St{0.0f, 0.0f, 0.0f};
            for (long long e = 32 * j + l; e < cols; e += 512) wr_push(v[l], f32_of(xr[e]));
        }
        for (int o = 16; o >= 1; o /= 2)
            for (int l = 0; l < o; ++l) v[l] = wr_combine(v[l], v[l + o]);
        wres[j] = v[0];
    }
    for (int o = 8; o >= 1; o /= 2)
        for (int j = 0; j < o; ++j) wres[j] = wr_combine(wres[j], wres[j + o]);
    return rsqrtf(__fadd_rn(fmaf(wres[0].mean, wres[0].mean, __fdiv_rn(wres[0].m2, wres[0].n)), eps));
}

// dx, a row a thread: s2 over eager's dx kernel's 128 threads (thread t: the elements e with
// (e / 4) % 128 == t, in order), s2 = fma(fl(fl(dy * w) * x), r, s2), BlockReduceSum; then
// dx = round_T(fl(fma(fl(N * w), dy, -fl(fl(x * r) * s2)) * fl(fl(1 / N) * r))). ws[row] = r.
template <typename T>
__device__ void rms_torch_bwd_dx_ref(T* dx, float* ws, const T* dy, const T* x, const T* w, long long rows, long long cols, float eps) {
    LN_REF_THREADS(me, all);
    for (long long row = me; row < rows; row += all) {
        const T* gr = dy + row * cols;
        const T* xr = x + row * cols;
        const float r = rms_torch_ref_row_rstd<T>(xr, cols, eps);
        float p2[128];
        for (int t = 0; t < 128; ++t) p2[t] = 0.0f;
        for (long long e = 0; e < cols; ++e) {
            const int t = (int)((e / 4) % 128);
            const float gw = __fmul_rn(f32_of(gr[e]), f32_of(w[e]));
            p2[t] = fmaf(__fmul_rn(gw, f32_of(xr[e])), r, p2[t]);
        }
        const float s2 = ln_ref_block_sum(p2);
        const float fN = (float)cols;
        const float term1 = __fmul_rn(__fdiv_rn(1.0f, fN), r);
        for (long long e = 0; e < cols; ++e) {
            const float bv = __fmul_rn(f32_of(xr[e]), r);
            const float f1 = fmaf(__fmul_rn(fN, f32_of(w[e])), f32_of(gr[e]), -__fmul_rn(bv, s2));
            dx[row * cols + e] = round_to<T>(__fmul_rn(f1, term1));
        }
        ws[row] = r;
    }
}

// dw's f32 sums, a column a thread (GammaBetaBackward, rows <= 65536 or cols / 32 >= sms / 2):
// bdy = 1 / 8 / 16 / 32 chains for rows < 64 / < 128 / < 256 / else; chain y adds rows R * k +
// 8 * y + i (R = 8 * bdy; one chain: every row in order): fma(fl(dy * x), r, .); the halving tree
// over the chains. ws[rows + c] = the sum; eager's two-pass variant (more rows, few columns) is not
// written: it traps.
template <typename T>
__device__ void rms_torch_bwd_dwp_ref(float* ws, const T* dy, const T* x, long long rows, long long cols, long long sms, long long) {
    if (rows > 65536 && cols / 32 < sms / 2) __trap();
    LN_REF_THREADS(me, all);
    const int bdy = rows < 64 ? 1 : rows < 128 ? 8 : rows < 256 ? 16 : 32;
    const long long R = 8LL * bdy;
    for (long long c = me; c < cols; c += all) {
        float v[32];
        for (int y = 0; y < bdy; ++y) {
            v[y] = 0.0f;
            for (long long k = 0; k * R < rows; ++k)
                for (long long i = 0; i < (bdy == 1 ? R : 8); ++i) {
                    const long long row = bdy == 1 ? k * R + i : k * R + 8LL * y + i;
                    if (row < rows)
                        v[y] = fmaf(__fmul_rn(f32_of(dy[row * cols + c]), f32_of(x[row * cols + c])), ws[row], v[y]);
                }
        }
        for (int o = bdy >> 1; o > 0; o >>= 1)  // the halving tree over the chains
            for (int y = 0; y < o; ++y) v[y] = __fadd_rn(v[y], v[y + o]);
        ws[rows + c] = v[0];
    }
}

template <typename T>
__device__ void rms_torch_bwd_dw_ref(T* dw, const float* ws, long long rows, long long cols) {
    LN_REF_THREADS(me, all);
    for (long long c = me; c < cols; c += all) dw[c] = round_to<T>(ws[rows + c]);
}

// ---- The backward of fused_add_rms_norm under eager autograd (docs/backward-fused-add.md) ------
// An HF decoder block's h = residual + x; y = LlamaRMSNorm(h): rms_norm_backward's llama entries
// (x here is h, the forward's residual output), dx adding dres, the gradient reaching h from the
// layers after it, as eager's engine adds it: in bf16 / f16 the norm's input gradient is one T
// tensor (h.to(f32)'s ToCopyBackward0) and one add in T joins dres; in f32 h's buffer receives
// dres, then MulBackward0's gh1, then PowBackward0's gh2: fl(fl(dres + gh1) + gh2). dx is the
// gradient of both x and residual (AddBackward0). dwp and dw are llama's.
template <typename T>
__device__ void fa_bwd_dx_ref(T* dx, float* ws, const T* dy, const T* dres, const T* x, const T* w, long long rows, long long cols, float eps) {
    __shared__ float sh[RB];
    const int t = threadIdx.x;
    const float inv_n = (float)(1.0 / (double)cols);
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * cols;
        const T* gr = dy + row * cols;
        const T* rr = dres + row * cols;
        T* dr = dx + row * cols;
        auto sq = [&](long long i) { const float h = f32_of(xr[i]); return __fmul_rn(h, h); };
        const float r = rsqrtf(__fadd_rn(__fmul_rn(mean_order_sum(sq, rows, row, cols, sh), mean_factor(rows, cols)), eps));
        auto q = [&](long long i) { return __fmul_rn(rms_bwd_g<T, 0>(gr[i], w[i]), f32_of(xr[i])); };
        const float s = mean_order_sum(q, rows, row, cols, sh);
        const float ga = __fmul_rn(__fmul_rn(s, -0.5f), __fmul_rn(__fmul_rn(r, r), r));
        const float gp = __fmul_rn(ga, inv_n);
        for (long long i = t; i < cols; i += RB) {
            const float h = f32_of(xr[i]);
            const float gh1 = __fmul_rn(rms_bwd_g<T, 0>(gr[i], w[i]), r);
            const float gh2 = __fmul_rn(gp, __fmul_rn(2.0f, h));
            const float d = f32_of(rr[i]);
            dr[i] = sizeof(T) == 4 ? round_to<T>(__fadd_rn(__fadd_rn(d, gh1), gh2))
                                   : round_to<T>(__fadd_rn(f32_of(round_to<T>(__fadd_rn(gh1, gh2))), d));
        }
        if (t == 0) ws[row] = r;
        __syncthreads();
    }
}

#define REFS(T, S)                                                                                          \
extern "C" __global__ void __launch_bounds__(RB) ref_rms_norm_llama_##S(T* out, const T* x, const T* w, long long rows, long long cols, float eps) { rms_norm_ref<T, 0, false>(out, nullptr, x, w, rows, cols, eps); } \
extern "C" __global__ void __launch_bounds__(RB) ref_rms_norm_gemma_##S(T* out, const T* x, const T* w, long long rows, long long cols, float eps) { rms_norm_ref<T, 1, false>(out, nullptr, x, w, rows, cols, eps); } \
extern "C" __global__ void __launch_bounds__(RB) ref_rms_norm_torch_##S(T* out, const T* x, const T* w, long long rows, long long cols, float eps) { rms_norm_ref<T, 2, false>(out, nullptr, x, w, rows, cols, eps); } \
extern "C" __global__ void __launch_bounds__(RB) ref_fused_add_rms_norm_default_##S(T* out, T* residual, const T* x, const T* w, long long rows, long long cols, float eps) { rms_norm_ref<T, 0, true>(out, residual, x, w, rows, cols, eps); } \
extern "C" __global__ void __launch_bounds__(RB) ref_layer_norm_default_##S(T* out, const T* x, const T* w, const T* b, long long rows, long long cols, float eps) { layer_norm_ref<T, false>(out, nullptr, x, w, b, cols, eps); } \
extern "C" __global__ void __launch_bounds__(RB) ref_fused_add_layer_norm_default_##S(T* out, T* residual, const T* x, const T* w, const T* b, long long rows, long long cols, float eps) { layer_norm_ref<T, true>(out, residual, x, w, b, cols, eps); } \
extern "C" __global__ void ref_silu_default_##S(T* out, const T* x, long long n) { GRID_STRIDE(i, n) out[i] = round_to<T>(silu_f(f32_of(x[i]))); } \
extern "C" __global__ void ref_gelu_default_##S(T* out, const T* x, long long n) { GRID_STRIDE(i, n) out[i] = round_to<T>(gelu_f(f32_of(x[i]))); } \
extern "C" __global__ void ref_gelu_tanh_default_##S(T* out, const T* x, long long n) { GRID_STRIDE(i, n) out[i] = round_to<T>(gelu_tanh_f(f32_of(x[i]))); } \
extern "C" __global__ void ref_silu_and_mul_default_##S(T* out, const T* x, long long rows, long long cols) { \
    GRID_STRIDE(i, rows * cols) { long long r = i / cols, c = i - r * cols; \
        T s = round_to<T>(silu_f(f32_of(x[r * 2 * cols + c]))); \
        out[i] = round_to<T>(__fmul_rn(f32_of(s), f32_of(x[r * 2 * cols + cols + c]))); } } \
extern "C" __global__ void ref_silu_mul_default_##S(T* out, const T* gate, const T* up, long long rows, long long cols) { \
    GRID_STRIDE(i, rows * cols) { T s = round_to<T>(silu_f(f32_of(gate[i]))); \
        out[i] = round_to<T>(__fmul_rn(f32_of(s), f32_of(up[i]))); } } \
extern "C" __global__ void ref_gelu_tanh_mul_default_##S(T* out, const T* gate, const T* up, long long rows, long long cols) { \
    GRID_STRIDE(i, rows * cols) { T s = round_to<T>(gelu_tanh_f(f32_of(gate[i]))); \
        out[i] = round_to<T>(__fmul_rn(f32_of(s), f32_of(up[i]))); } } \
extern "C" __global__ void __launch_bounds__(RB) ref_rms_norm_backward_llama_dx_##S(T* dx, float* ws, const T* dy, const T* x, const T* w, long long rows, long long cols, float eps) { rms_bwd_dx_ref<T, 0>(dx, ws, dy, x, w, rows, cols, eps); } \
extern "C" __global__ void ref_rms_norm_backward_llama_dwp_##S(float* ws, const T* dy, const T* x, long long rows, long long cols, long long sms, long long threads_per_sm) { rms_bwd_dwp_ref<T, 0>(ws, dy, x, rows, cols, sms, threads_per_sm); } \
extern "C" __global__ void ref_rms_norm_backward_llama_dw_##S(T* dw, const float* ws, long long rows, long long cols, long long sms, long long threads_per_sm) { rms_bwd_dw_ref<T>(dw, ws, rows, cols, sms, threads_per_sm); } \
extern "C" __global__ void __launch_bounds__(RB) ref_rms_norm_backward_gemma_dx_##S(T* dx, float* ws, const T* dy, const T* x, const T* w, long long rows, long long cols, float eps) { rms_bwd_dx_ref<T, 1>(dx, ws, dy, x, w, rows, cols, eps); } \
extern "C" __global__ void ref_rms_norm_backward_gemma_dwp_##S(float* ws, const T* dy, const T* x, long long rows, long long cols, long long sms, long long threads_per_sm) { rms_bwd_dwp_ref<T, 1>(ws, dy, x, rows, cols, sms, threads_per_sm); } \
extern "C" __global__ void ref_rms_norm_backward_gemma_dw_##S(T* dw, const float* ws, long long rows, long long cols, long long sms, long long threads_per_sm) { rms_bwd_dw_ref<T>(dw, ws, rows, cols, sms, threads_per_sm); } \
extern "C" __global__ void __launch_bounds__(RB) ref_rms_norm_backward_torch_dx_##S(T* dx, float* ws, const T* dy, const T* x, const T* w, long long rows, long long cols, float eps) { rms_torch_bwd_dx_ref<T>(dx, ws, dy, x, w, rows, cols, eps); } \
extern "C" __global__ void ref_rms_norm_backward_torch_dwp_##S(float* ws, const T* dy, const T* x, long long rows, long long cols, long long sms, long long threads_per_sm) { rms_torch_bwd_dwp_ref<T>(ws, dy, x, rows, cols, sms, threads_per_sm); } \
extern "C" __global__ void ref_rms_norm_backward_torch_dw_##S(T* dw, const float* ws, long long rows, long long cols, long long sms, long long threads_per_sm) { rms_torch_bwd_dw_ref<T>(dw, ws, rows, cols); } \
extern "C" __global__ void __launch_bounds__(RB) ref_fused_add_rms_norm_backward_default_dx_##S(T* dx, float* ws, const T* dy, const T* dres, const T* x, const T* w, long long rows, long long cols, float eps) { fa_bwd_dx_ref<T>(dx, ws, dy, dres, x, w, rows, cols, eps); } \
extern "C" __global__ void ref_fused_add_rms_norm_backward_default_dwp_##S(float* ws, const T* dy, const T* x, long long rows, long long cols, long long sms, long long threads_per_sm) { rms_bwd_dwp_ref<T, 0>(ws, dy, x, rows, cols, sms, threads_per_sm); } \
extern "C" __global__ void ref_fused_add_rms_norm_backward_default_dw_##S(T* dw, const float* ws, long long rows, long long cols, long long sms, long long threads_per_sm) { rms_bwd_dw_ref<T>(dw, ws, rows, cols, sms, threads_per_sm); } \
extern "C" __global__ void ref_silu_mul_backward_default_grad_##S(T* d_gate, T* d_up, const T* dy, const T* gate, const T* up, long long rows, long long cols) { silu_mul_bwd_grad_ref<T>(d_gate, d_up, dy, gate, up, rows, cols); } \
extern "C" __global__ void ref_gelu_tanh_mul_backward_default_grad_##S(T* d_gate, T* d_up, const T* dy, const T* gate, const T* up, long long rows, long long cols) { gelu_tanh_mul_bwd_grad_ref<T>(d_gate, d_up, dy, gate, up, rows, cols); } \
extern "C" __global__ void ref_layer_norm_backward_default_dx_##S(T* dx, const T* dy, const T* x, const float* mean, const float* rstd, const T* w, long long rows, long long cols) { ln_bwd_dx_ref<T>(dx, dy, x, mean, rstd, w, rows, cols); } \
extern "C" __global__ void ref_layer_norm_backward_default_dwdb_##S(T* dw, T* db, const T* dy, const T* x, const float* mean, const float* rstd, long long rows, long long cols) { ln_bwd_dwdb_ref<T>(dw, db, dy, x, mean, rstd, rows, cols); } \
extern "C" __global__ void ref_silu_backward_default_grad_##S(T* dx, const T* dy, const T* x, long long n) { silu_bwd_grad_ref<T>(dx, dy, x, n); } \
extern "C" __global__ void ref_gelu_backward_default_grad_##S(T* dx, const T* dy, const T* x, long long n) { gelu_bwd_grad_ref<T>(dx, dy, x, n); } \
extern "C" __global__ void ref_gelu_tanh_backward_default_grad_##S(T* dx, const T* dy, const T* x, long long n) { gelu_tanh_bwd_grad_ref<T>(dx, dy, x, n); }

REFS(__nv_bfloat16, bf16)
REFS(__half, f16)
REFS(float, f32)

// Verifier utility (not a reference layer): everything from here on. The CPU harnesses of
// python/tests take reference.cu up to this line as the reference layers.
// ---- Verifier utilities (not reference layers) ---------------------------------------------------
__device__ __forceinline__ unsigned long long kz_mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The keyed sum: *sum += sum over i of mix(key, i, a[i]) mod 2^64 for the n words at a (this
// block's share; blocks along x), mix = splitmix64's finaliser of (key + i * golden) ^ word, a
// bijection in the word, so one changed word always changes the sum. The key is drawn after the
// candidate's launches, so a kernel cannot make changes that cancel. The host computes the same
// sum over its own copy (crate::numeric::keyed_sum) and downloads the buffer only when the two
// differ. kz_keyed_sum_u32 sums one range, kz_keyed_sums many.
__device__ __forceinline__ void kz_keyed_words(const unsigned int* a, long long n, unsigned long long key,
                                               unsigned long long* sum) {
    unsigned long long local = 0;
    GRID_STRIDE(i, n)
        local += kz_mix((key + (unsigned long long)i * 0x9E3779B97F4A7C15ull) ^ (unsigned long long)a[i]);
    for (int o = 16; o > 0; o >>= 1) local += __shfl_down_sync(0xffffffffu, local, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(sum, local);
}

extern "C" __global__ void kz_keyed_sum_u32(const unsigned int* a, long long n, unsigned long long key,
                                            unsigned long long* sum) {
    kz_keyed_words(a, n, key, sum);
}

// The output poison: byte i of the payload = byte (i % 8) of mix(key + (i / 8) * golden), all
// bits inverted when `invert` (crate::measure::poison::Poison computes the same on the host).
// Pseudo-random bytes, so a kernel cannot tell a poisoned buffer by a pattern; a fresh key for
// every launch, so it cannot tell it by a remembered value either.
__device__ __forceinline__ unsigned long long kz_poison_word(unsigned long long key, int invert, unsigned long long i) {
    const unsigned long long z = kz_mix(key + i * 0x9E3779B97F4A7C15ull);
    return invert ? ~z : z;
}
extern "C" __global__ void kz_fill_pattern(unsigned char* p, long long n, unsigned long long key, int invert) {
    GRID_STRIDE(i, (n + 7) / 8) {
        const unsigned long long z = kz_poison_word(key, invert, (unsigned long long)i);
        for (int b = 0; b < 8; ++b) {
            long long j = i * 8 + b;
            if (j < n) p[j] = (unsigned char)(z >> (8 * b));
        }
    }
}

// The address cases' placements (crate::measure::address), one launch for all of a placement's
// buffers: op y (blockIdx.y) makes its allocation [base, base + total) hold the guard byte, but
// for the payload [base + lead, base + lead + bytes): a copy of src's bytes (an input), or when
// src is 0 the output poison of kz_fill_pattern with key and invert (byte j of the payload).
// The same bytes as a memset of the allocation, then a copy or kz_fill_pattern, in one launch.
struct KzPlaceOp {
    unsigned long long base, total, lead, bytes, src, key;
    unsigned int guard, invert;
};
extern "C" __global__ void kz_place(const KzPlaceOp* ops) {
    const KzPlaceOp o = ops[blockIdx.y];
    unsigned char* a = reinterpret_cast<unsigned char*>(o.base);
    const unsigned char* src = reinterpret_cast<const unsigned char*>(o.src);
    const unsigned int g = o.guard * 0x01010101u;
    const long long words = (long long)(o.total / 4);
    for (long long w = blockIdx.x * (long long)blockDim.x + threadIdx.x; w <= words; w += (long long)blockDim.x * gridDim.x) {
        const unsigned long long b0 = (unsigned long long)w * 4;
        if (b0 >= o.total) break;
        if (b0 + 4 <= o.lead || b0 >= o.lead + o.bytes) {
            if (b0 + 4 <= o.total) *reinterpret_cast<unsigned int*>(a + b0) = g;
            else for (unsigned long long b = b0; b < o.total; ++b) a[b] = (unsigned char)o.guard;
            continue;
        }
        for (unsigned long long b = b0; b < b0 + 4 && b < o.total; ++b) {
            unsigned char v = (unsigned char)o.guard;
            if (b >= o.lead && b < o.lead + o.bytes) {
                const unsigned long long j = b - o.lead;
                if (src) {
                    v = src[j];
                } else {
                    v = (unsigned char)(kz_poison_word(o.key, o.invert, j / 8) >> (8 * (j % 8)));
                }
            }
            a[b] = v;
        }
    }
}

// The keyed sums of many ranges in one launch: range y (blockIdx.y) is {address, words}; its sum
// goes to sums[y] (zeroed before).
struct KzRange {
    unsigned long long at, words;
};
extern "C" __global__ void kz_keyed_sums(const KzRange* ranges, unsigned long long key, unsigned long long* sums) {
    const KzRange r = ranges[blockIdx.y];
    kz_keyed_words(reinterpret_cast<const unsigned int*>(r.at), (long long)r.words, key, sums + blockIdx.y);
}

// Batch compositions: dst row j := src row idx[j] (row_bytes bytes each).
extern "C" __global__ void kz_gather_rows(unsigned char* dst, const unsigned char* src, const long long* idx,
                                          long long nrows, long long row_bytes) {
    GRID_STRIDE(i, nrows * row_bytes) {
        long long j = i / row_bytes, o = i - j * row_bytes;
        dst[i] = src[idx[j] * row_bytes + o];
    }
}

// res[0] += the number of rows j whose bytes differ from base row idx[j]; res[1] = min such j.
extern "C" __global__ void kz_rows_differ(const unsigned char* got, const unsigned char* base, const long long* idx,
                                          long long nrows, long long row_bytes, unsigned long long* res) {
    for (long long j = blockIdx.x; j < nrows; j += gridDim.x) {
        const unsigned char* a = got + j * row_bytes;
        const unsigned char* b = base + idx[j] * row_bytes;
        int differ = 0;
        for (long long o = threadIdx.x; o < row_bytes; o += blockDim.x) differ |= a[o] != b[o];
        if (__syncthreads_or(differ) && threadIdx.x == 0) {
            atomicAdd(res, 1ull);
            atomicMin(res + 1, (unsigned long long)j);
        }
    }
}

// Large-index inputs, made on the GPU: v(i) = center + spread * N(0,1) (Box-Muller of two
// hashed uniforms), rounded to T. Deterministic in key.
template <typename T>
__device__ void kz_gen(T* p, long long n, unsigned long long key, float center, float spread) {
    GRID_STRIDE(i, n) {
        unsigned long long z = kz_mix(key + (unsigned long long)i * 0x9E3779B97F4A7C15ull);
        float u1 = ((float)(z >> 40) + 1.0f) * (1.0f / 16777217.0f);
        float u2 = (float)((z >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
        float g = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
        p[i] = round_to<T>(center + spread * g);
    }
}

// res[0] += elements whose bits differ (NaN == NaN, +0 == -0 differ as bits: exactness is
// bitwise), res[1] = min such index.
template <typename T, typename U>
__device__ void kz_mismatch(const U* a, const U* b, long long n, unsigned long long* res) {
    unsigned long long local = 0, first = ~0ull;
    GRID_STRIDE(i, n) {
        U x = a[i], y = b[i];
        bool nan_x = f32_of(*reinterpret_cast<const T*>(&x)) != f32_of(*reinterpret_cast<const T*>(&x));
        bool nan_y = f32_of(*reinterpret_cast<const T*>(&y)) != f32_of(*reinterpret_cast<const T*>(&y));
        if (x != y && !(nan_x && nan_y)) {
            ++local;
            if ((unsigned long long)i < first) first = (unsigned long long)i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        local += __shfl_down_sync(0xffffffffu, local, o);
        unsigned long long f = __shfl_down_sync(0xffffffffu, first, o);
        first = f < first ? f : first;
    }
    if ((threadIdx.x & 31) == 0 && local) {
        atomicAdd(res, local);
        atomicMin(res + 1, first);
    }
}

#define KZ_TOOLS(T, U, S)                                                                                 \
extern "C" __global__ void kz_gen_##S(T* p, long long n, unsigned long long key, float center, float spread) { kz_gen<T>(p, n, key, center, spread); } \
extern "C" __global__ void kz_mismatch_##S(const U* a, const U* b, long long n, unsigned long long* res) { kz_mismatch<T, U>(a, b, n, res); }

KZ_TOOLS(__nv_bfloat16, unsigned short, bf16)
KZ_TOOLS(__half, unsigned short, f16)
KZ_TOOLS(float, unsigned int, f32)
