"""Eager autograd's backward of HF LlamaRMSNorm (and GemmaRMSNorm: gemma_rms_norm_backward) on CUDA, emulated on the CPU one rounding at a time.

What eager runs (torch 2.11, docs/backward.md has the sources): for
``y = w * (x.to(f32) * rsqrt(mean(x.to(f32)^2, -1) + eps)).to(T)`` and an incoming ``dy``:

    h  = f32(x); r = rsqrt(fl(mean) + eps)            (the forward's; autograd saves r)
    nc = round_T(h * r)                               (saved by MulBackward0 of y = w * nc)
    dw = round_T(colsum_f32(round_T(dy * nc)))        MulBackward0 + sum_to: Reduce.cuh, outer
    gn = round_T(dy * w)                              MulBackward0 (grad of nc)
    g  = f32(gn)                                      ToCopyBackward0 (exact)
    gh1 = g * r                                       MulBackward0 of h * r (grad of h)
    s  = rowsum_f32(g * h)                            MulBackward0 (grad of r) + sum_to: Reduce.cuh, inner
    ga = (s * -0.5) * ((r * r) * r)                   RsqrtBackward0: -0.5 * grad * result.pow(3)
    gp = ga * fl(1 / N)                               MeanBackward1: expand, / N (a CPU scalar: a * (1/b))
    gh2 = gp * (2 * h)                                PowBackward0: grad * (2.0 * h.pow(1))
    dx = round_T(gh1 + gh2)                           the engine's InputBuffer sum, ToCopyBackward0

Every step is one IEEE float32 rounding (round_T: round to nearest even to bf16/f16, the
identity for f32). The two reductions follow ATen's generic reduce kernel (Reduce.cuh):

* ``row_sum``: a reduction over the fastest-striding dim of a fresh f32 [rows, cols] tensor,
  ``sum_functor<float>`` = ``gpu_reduce_kernel<float, float>`` (vt0 = 4, input_vec_size = 4),
  i.e. exactly the forward mean's order (docs/eager-order.md (a)) without the factor.
* ``col_sum``: ``sum(dim=0)`` of a fresh T [rows, cols] tensor, accumulated in f32: an "outer"
  reduction (block.x over outputs, vectorized along the output, block.y and CTAs over rows).

The functions take numpy float32 arrays (values of T held as f32) and return float32 arrays.
``rsqrt`` defaults to 1/sqrt in float64 rounded to f32, which is NOT CUDA's rsqrtf: pass the GPU's
r (or a function) where bits must match a GPU.
"""

from __future__ import annotations

from typing import Callable

try:
    import numpy as np
except ModuleNotFoundError:  # the client's launch arithmetic (col_config, cdiv, last_pow2) needs none
    np = None

F32 = np.float32 if np is not None else None
WARP = 32


# ---- rounding ------------------------------------------------------------------------------------

def round_bf16(x) -> np.ndarray:
    """float32 -> bfloat16 (round to nearest even), as float32 values (NaN stays NaN)."""
    x = np.ascontiguousarray(x, dtype=F32)
    u = x.view(np.uint32).astype(np.uint64)
    r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)
    nan = np.isnan(x)
    if nan.any():
        r = np.where(nan, (x.view(np.uint32) | 0x00400000) & 0xFFFF0000, r).astype(np.uint32)
    return r.view(F32)


def round_to(x, dtype: str) -> np.ndarray:
    x = np.asarray(x, dtype=F32)
    if dtype == "f32":
        return x
    if dtype == "bf16":
        return round_bf16(x)
    if dtype == "f16":
        return x.astype(np.float16).astype(F32)
    raise ValueError(dtype)


def rsqrt_f64(v) -> np.ndarray:
    """1/sqrt(v) in float64, rounded to f32: a stand-in for CUDA's rsqrtf (not always equal)."""
    return (1.0 / np.sqrt(np.asarray(v, dtype=np.float64))).astype(F32)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def last_pow2(n: int) -> int:
    """Reduce.cuh's last_pow2: the largest power of two <= n, at least 1."""
    n = int(n)
    return 1 << (n.bit_length() - 1) if n > 0 else 1


# ---- the row sum (inner reduction, the forward mean's order) --------------------------------------

def row_config(rows: int, cols: int, vt0: int = 4, ivs: int = 4) -> dict:
    """setReduceConfig<float, float, vt0=4, input_vec_size=4> for a contiguous f32 [rows, cols]
    reduced over its last dim (docs/eager-order.md (a)). The multi-CTA regime (cols > 131072
    with 512 lanes) is not emulated: ValueError. Other (vt0, ivs) are hypotheses for the GPU
    probe (e.g. a build that reduces f32 with vt0 = input_vec_size = 8)."""
    vec = cols > 128
    d0 = cols // ivs if vec else cols
    p0 = last_pow2(d0) if d0 < 512 else 512
    p1 = last_pow2(rows) if rows < 512 else 512
    bw = min(p0, 32)
    bh = min(p1, 512 // bw)
    bw = min(p0, 512 // bh)
    split = cdiv(cols, bw) >= min(16 * bh, 256)
    lanes = bw * bh if split else bw
    if split and cdiv(cols, lanes) >= 256:
        raise ValueError(f"[{rows}, {cols}]: the multi-CTA row reduce (cols > 131072) is not emulated")
    return dict(vec=vec, bw=bw, bh=bh, split=split, lanes=lanes, vt0=vt0, ivs=ivs)


def _halving(p: np.ndarray, axis: int) -> np.ndarray:
    """v[i] += v[i + off] for off = n/2 .. 1 along `axis` (n a power of two); returns index 0."""
    p = np.moveaxis(np.array(p, dtype=F32, copy=True), axis, -1)
    off = p.shape[-1] // 2
    while off > 0:
        p[..., :off] = p[..., :off] + p[..., off:2 * off]
        off //= 2
    return p[..., 0]


def _lane_partials(v: np.ndarray, cfg: dict, shift: int) -> np.ndarray:
    """Each lane's folded sum ((a0 + a1) + a2) + a3: [R, lanes]. `shift` = (row index * cols) % 4,
    the row start's misalignment in floats in a 16-byte aligned f32 tensor (vectorized rows)."""
    R, cols = v.shape
    L = cfg["lanes"]
    V = cfg.get("ivs", 4) if cfg["vec"] else cfg.get("vt0", 4)  # accumulators per lane
    acc = np.zeros((R, L, V), F32)
    if cfg["vec"]:
        nh = (V - shift) % V
        if nh:  # head: lane shift + e (thread y = 0) starts its accumulator 0 with element e
            acc[:, shift:shift + nh, 0] = v[:, :nh]
        data = v[:, nh:]
        M = cols - nh
        nvec = M // V
        K = cdiv(nvec, L)
        if K:
            buf = np.zeros((R, K * L * V), F32)  # +0 past the end: exact (accumulators are never -0)
            buf[:, :nvec * V] = data[:, :nvec * V]
            buf = buf.reshape(R, K, L, V)
            for k in range(K):  # lane t: V-vectors t, t + L, ...; component i -> accumulator i
                acc += buf[:, k]
        nt = M % V
        if nt:  # tail: element V*nvec + j goes to lane j (thread y = 0), accumulator 0
            acc[:, :nt, 0] += data[:, nvec * V:]
    else:
        K = cdiv(cdiv(cols, L), V) * V
        buf = np.zeros((R, K * L), F32)
        buf[:, :cols] = v
        buf = buf.reshape(R, K, L)
        for m in range(K):  # lane t: elements t + m*L, the m-th into accumulator m % vt0
            acc[:, :, m % V] += buf[:, m]
    a = acc[..., 0]
    for i in range(1, V):  # combine accumulators left to right
        a = a + acc[..., i]
    return a


def row_sum(v, rows_total: int | None = None, row_ids=None, vt0: int = 4, ivs: int = 4) -> np.ndarray:
    """Eager's f32 sum over the last dim of a fresh contiguous [rows_total, cols] f32 tensor, for
    the rows `row_ids` given in `v` ([R, cols]; all rows by default). Returns [R] float32.
    (vt0, ivs) other than (4, 4): hypotheses, see row_config."""
    v = np.ascontiguousarray(v, dtype=F32)
    R, cols = v.shape
    rows_total = R if rows_total is None else rows_total
    row_ids = np.arange(R) if row_ids is None else np.asarray(row_ids, dtype=np.int64)
    cfg = row_config(rows_total, cols, vt0, ivs)
    out = np.empty(R, F32)
    shifts = (row_ids * cols) % cfg["ivs"] if cfg["vec"] else np.zeros(R, np.int64)
    for sh in np.unique(shifts):
        sel = np.nonzero(shifts == sh)[0]
        p = _lane_partials(v[sel], cfg, int(sh))  # [r, lanes], lane = x + bw*y
        if cfg["split"]:  # block_x_reduce in each warp-row, then block_y_reduce
            p = _halving(_halving(p.reshape(len(sel), cfg["bh"], cfg["bw"]), -1), -1)
        else:
            p = _halving(p, -1)
        out[sel] = p
    return out


def mean_factor(rows: int, cols: int) -> np.float32:
    """MeanOps' factor: float(rows) / float(rows * cols), a float division on the host."""
    return F32(F32(rows) / F32(rows * cols))


# ---- the column sum (outer reduction) ------------------------------------------------------------

def col_config(rows: int, cols: int, num_sms: int = 132, max_threads_per_sm: int = 2048,
               out_vec: int | None = None, threads_per_ovs: bool = True, vt0: int = 4) -> dict:
    """setReduceConfig for sum(dim=0) of a fresh contiguous T [rows, cols] (any T: the order does
    not depend on it): the reduction is not on the fastest-striding dim, so block.x maps outputs,
    "vectorize along output" with output_vec_size = get_output_vec_size (4 when cols % 4 == 0 and
    the data 4-element aligned; a fresh tensor is), and max threads 512 / output_vec_size.
    Hypotheses for the GPU probe: `threads_per_ovs=False` (older sources: 512 threads whatever
    the output vector), another `out_vec`, `vt0` accumulators other than 4."""
    if out_vec is None:
        out_vec = 4 if cols % 4 == 0 else 2 if cols % 2 == 0 else 1
    max_t = 512 // out_vec if threads_per_ovs else 512
    dim0, dim1 = cols // out_vec, rows
    d0 = last_pow2(dim0) if dim0 < max_t else max_t
    d1 = last_pow2(dim1) if dim1 < max_t else max_t
    bw = min(d0, WARP)
    bh = min(d1, max_t // bw)
    bw = min(d0, max_t // bh)
    step_in, step_out = 1, bw          # output_mult[0] = split_output(block_width)
    split = rows >= min(bh * 16, 256)  # values_per_thread() = rows here
    if split:
        step_in *= bh                  # input_mult[1] = split_input(block_height)
    else:
        step_out *= bh                 # output_mult[1] = split_output(block_height)
    threads = bw * bh
    target = num_sms * (max_threads_per_sm // threads)
    grid_x = cdiv(dim0, step_out)
    ctas = 1
    vpt = cdiv(rows, step_in)
    if split and vpt >= 256 and grid_x <= target:
        ctas = max(min(cdiv(target, grid_x), cdiv(vpt, 16)), cdiv(vpt, 256))
        if ctas > 1:
            step_in *= ctas            # input_mult[2] = split_input(ctas_per_output)
    return dict(out_vec=out_vec, bw=bw, bh=bh, split=split, ctas=ctas, step_input=step_in,
                grid=(grid_x, ctas), threads=threads, target_grid=target, vt0=vt0)


def col_sum(v, num_sms: int = 132, max_threads_per_sm: int = 2048, cfg: dict | None = None) -> np.ndarray:
    """Eager's f32-accumulated sum over dim 0 of [rows, cols] (values of T as f32): [cols] float32
    before the final rounding to T.

    Thread (x, y) of CTA k (y < bh when the warp-rows split the rows, else y = 0; k < ctas) sums
    rows y + bh*k + S*m (S = step_input, m = 0, 1, ...), the m-th into accumulator m % 4, folds
    ((a0 + a1) + a2) + a3; block_y_reduce (halving over y) gives CTA k's partial P[k]; with
    ctas > 1, global_reduce: thread y of the last CTA sums 0 + P[y] + P[y + bh] + ... in order,
    then block_y_reduce again."""
    v = np.ascontiguousarray(v, dtype=F32)
    rows, cols = v.shape
    c = cfg or col_config(rows, cols, num_sms, max_threads_per_sm)
    Y = c["bh"] if c["split"] else 1
    C = c["ctas"]
    S = c["step_input"]
    V = c.get("vt0", 4)
    M = cdiv(rows, S)
    buf = np.zeros((M * S, cols), F32)
    buf[:rows] = v
    buf = buf.reshape(M, C, Y, cols)         # row = y + Y*k + S*m
    acc = np.zeros((V, C, Y, cols), F32)
    for m in range(M):
        acc[m % V] += buf[m]
    p = acc[0]
    for i in range(1, V):                     # ((a0 + a1) + a2) + a3
        p = p + acc[i]                        # [C, Y, cols]
    p = _halving(p, 1) if Y > 1 else p[:, 0]    # [C, cols]
    if C == 1:
        return p[0]
    bh = c["bh"]
    q = np.zeros((bh, cols), F32)
    for k in range(C):
        q[k % bh] = q[k % bh] + p[k]
    return _halving(q, 0)


# ---- the whole backward --------------------------------------------------------------------------

def inv_n(cols: int) -> np.float32:
    """div_true_kernel_cuda with a CPU scalar: a * inv_b, inv_b = opmath_t(1.0 / double(N)) in
    current sources (older: float(1) / float(N)); equal for every N checked in the tests."""
    return F32(1.0 / float(cols))


def _saved(x, w, dy, eps: float, rsqrt: Callable | None, r, mean_sq_fn: Callable | None):
    """The RMSNorm backward's inputs as f32 arrays (h = f32(x), w, dy) and the forward's saved
    rsqrt r [rows] (given, or computed in the forward's order), for both semantics."""
    h = np.ascontiguousarray(x, dtype=F32)
    rows, cols = h.shape
    if r is None:
        if mean_sq_fn is None:
            var = row_sum(h * h) * mean_factor(rows, cols)
        else:
            var = np.asarray(mean_sq_fn(h), dtype=F32)
        r = (rsqrt or rsqrt_f64)(var + F32(eps))
    return h, np.asarray(w, dtype=F32), np.asarray(dy, dtype=F32), np.asarray(r, dtype=F32).reshape(rows)


def _dx_from_gn(gn, h, r, dtype: str, row_sum_fn: Callable | None, div_n_fn: Callable | None):
    """dx from gn, the f32 gradient reaching n = h * r (both semantics' chains from there on
    are the same: MulBackward0 of h * r, RsqrtBackward0, MeanBackward1, PowBackward0, the
    InputBuffer sum, ToCopyBackward0), and the intermediate parts (r, s, ga, gp)."""
    rows, cols = h.shape
    gh1 = gn * r[:, None]                              # MulBackward0 of h * r: grad * r
    q = gn * h                                         # ... grad * h, then sum_to [rows, 1]
    s = np.asarray((row_sum_fn or row_sum)(q), dtype=F32).reshape(rows)
    ga = (s * F32(-0.5)) * ((r * r) * r)               # RsqrtBackward0
    if div_n_fn is None:
        gp = ga * inv_n(cols)                          # MeanBackward1: expand, / N
    else:
        gp = np.asarray(div_n_fn(ga, cols), dtype=F32)
    gh2 = gp[:, None] * (h * F32(2.0))                 # PowBackward0: grad * (2 * h.pow(1))
    dx = round_to(gh1 + gh2, dtype)                    # InputBuffer sum, ToCopyBackward0
    return dx, dict(r=r, s=s, ga=ga, gp=gp)


def llama_rms_norm_backward(x, w, dy, eps: float, dtype: str, *,
                            rsqrt: Callable | None = None,
                            r=None,
                            row_sum_fn: Callable | None = None,
                            col_sum_fn: Callable | None = None,
                            mean_sq_fn: Callable | None = None,
                            div_n_fn: Callable | None = None,
                            num_sms: int = 132, max_threads_per_sm: int = 2048,
                            return_parts: bool = False):
    """(dx, dw) of eager autograd through HF LlamaRMSNorm, as float32 arrays holding T values.

    x, dy: [rows, cols]; w: [cols]; values of `dtype` (bf16/f16/f32) as float32. The CUDA
    orders are the defaults; each piece can be replaced (the CPU tests plug in the CPU's own
    reductions to check the chain against CPU autograd): `mean_sq_fn(h) -> [rows]` the forward's
    mean of squares, `rsqrt`, or `r` ([rows], the forward's saved rsqrt directly),
    `row_sum_fn(v) -> [rows]`, `col_sum_fn(v) -> [cols]` (f32, before rounding to T),
    `div_n_fn(a, n) -> a / n` (the MeanBackward division)."""
    h, wv, g_out, r = _saved(x, w, dy, eps, rsqrt, r, mean_sq_fn)
    rc = r[:, None]
    nc = round_to(h * rc, dtype)                       # the forward's n.to(T), saved
    gw = round_to(g_out * nc, dtype)                   # MulBackward0: grad * other
    cs = (col_sum_fn or (lambda v: col_sum(v, num_sms, max_threads_per_sm)))(gw)
    dw = round_to(cs, dtype)                           # sum_to(.., [cols]) in T
    gn = round_to(g_out * wv[None, :], dtype)          # MulBackward0: grad * self (w); widened exactly
    dx, parts = _dx_from_gn(gn, h, r, dtype, row_sum_fn, div_n_fn)
    if return_parts:
        return dx, dw, dict(parts, nc=nc, gw=gw, gn=gn)
    return dx, dw


def gemma_rms_norm_backward(x, w, dy, eps: float, dtype: str, *,
                            rsqrt: Callable | None = None,
                            r=None,
                            row_sum_fn: Callable | None = None,
                            col_sum_fn: Callable | None = None,
                            mean_sq_fn: Callable | None = None,
                            div_n_fn: Callable | None = None,
                            num_sms: int = 132, max_threads_per_sm: int = 2048,
                            return_parts: bool = False):
    """(dx, dw) of eager autograd through HF GemmaRMSNorm (Gemma, Gemma2, Gemma3), as float32
    arrays holding T values; the pieces as in llama_rms_norm_backward (docs/backward.md, "Gemma").

    ``y = (h * rsqrt(mean(h^2) + eps) * (1 + f32(w))).type_as(x)``, ``h = f32(x)``: the product
    with the weight is taken in f32 and rounded once at the end, so nothing in the chain rounds
    to T but dx and dw themselves:

        a  = fl(1 + f32(w))                      AddBackward1's output (the forward's)
        n  = fl(h * r)                           saved by MulBackward0 of o = n * a (f32)
        go = f32(dy)                             ToCopyBackward0 of type_as (exact)
        dw = round_T(colsum_f32(fl(go * n)))     MulBackward0 (grad of a) + sum_to, f32 in and
                                                 out (sum_functor<float>); ToCopyBackward0 of
                                                 w.float() rounds to T
        gn = fl(go * a)                          MulBackward0 (grad of n), f32
        then llama's steps from gh1 = gn * r on (RsqrtBackward0, MeanBackward1, PowBackward0,
        the InputBuffer sum, ToCopyBackward0 of x.float())."""
    h, wv, g_out, r = _saved(x, w, dy, eps, rsqrt, r, mean_sq_fn)
    rc = r[:, None]
    a = F32(1.0) + wv                                  # 1.0 + w.float()
    n = h * rc                                         # the f32 n, saved
    gw = g_out * n                                     # MulBackward0: grad * self (n)
    cs = (col_sum_fn or (lambda v: col_sum(v, num_sms, max_threads_per_sm)))(gw)
    dw = round_to(cs, dtype)                           # sum_to(.., [cols]) in f32, then to T
    gn = g_out * a[None, :]                            # MulBackward0: grad * other (a), f32
    dx, parts = _dx_from_gn(gn, h, r, dtype, row_sum_fn, div_n_fn)
    if return_parts:
        return dx, dw, dict(parts, n=n, gw=gw, gn=gn, a=a)
    return dx, dw
