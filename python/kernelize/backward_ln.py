"""Eager autograd's backward of nn.LayerNorm (weight and bias) on CUDA, emulated on the CPU one
rounding at a time (issue 30; docs/backward-layer-norm.md has the sources and what is unsure).

For ``y = F.layer_norm(x, [cols], w, b, eps)`` on a contiguous T [rows, cols] (T in bf16, f16,
f32), autograd records one node, NativeLayerNormBackward0, which calls
``native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True, True])``: CUDA's
``layer_norm_backward_cuda`` -> ``LayerNormBackwardKernelImplInternal`` in
aten/src/ATen/native/cuda/layer_norm_kernel.cu. ``mean`` and ``rstd`` are the forward's f32
per-row statistics (autograd saves them; pass eager's own, nothing here recomputes them). Two
launches, both in f32 (``T_ACC`` = float for every T), one rounding to T at each store:

**dx** (``layer_norm_grad_input_kernel_vectorized`` when cols % 4 == 0 and dY, X, gamma and dX
are 4 * sizeof(T)-aligned, else ``layer_norm_grad_input_kernel`` / ``compute_gI``; one block of
``num_threads()`` = 128 threads per row). Per element, with ``cl = dy``, ``g = w``, ``ch = x``
(widened to f32 exactly) and ``m``, ``r`` the row's mean and rstd:

    s1 = sum_row  cl * g                        stats_x1 += c_loss * gamma_val
    s2 = sum_row  ((cl * g) * (ch - m)) * r     stats_x2 += c_loss * gamma_val * (c_h - mean_val) * rstd_val
    A  = fl(float(cols) * g)                    f = fH * gamma_val * dy   (left to right)
    t  = A * dy
    Bv = fl(fl(ch - m) * r)                     f -= (x - mean_val) * rstd_val * stats_x2
    f1 = t - Bv * s2                            (the contraction below)
    f2 = fl(f1 - s1)                            f -= stats_x1
    dx = round_T(fl(f2 * fl(fl(1 / cols) * r)))  f *= term1, term1 = (1 / fH) * rstd_val; the store

The row sums: thread t (0..127) walks the elements e with (e // 4) % 128 == t in increasing
order into ONE accumulator per sum (both kernels: the vectorized one reads 4-vectors t, t + 128,
...; compute_gI unrolls by 4 with the same stride 512 and its scalar tail stays in the thread
whose 4-group holds it), then ``cuda_utils::BlockReduceSum`` (block_reduce.cuh): a shfl_down
halving tree over each warp's 32 lanes (offsets 16..1), the 4 warp sums w0..w3 into warp 0 with
zeros in lanes 4..31, the same tree again: ``(w0 + w2) + (w1 + w3)``. The two kernels therefore
give the same bits (the CPU tests transcribe both loops literally); the choice between them is
reported by ``dx_kernel``.

**dw, db** (``LaunchGammaBetaBackwardCUDAKernel`` -> ``GammaBetaBackwardCUDAKernelTemplate``;
block x = 32 columns, one column per thread x). Per element ``q = fl(dy * fl(x - m))`` and

    dg_sum += q * r      (dY_regs[i] * (X_regs[i] - mean_reg) * rstd_reg)      db_sum += dy

in the row order of the variant (``gamma_beta_config``; ``M`` = rows, ``N`` = cols):

* ``M > 65536 and N // 32 < sms // 2`` ("partial", the only place the SM count enters): block
  (32, 1), 32 rows per tile, ``gy = min(32768 // ceil(N / 32), ceil(M / 32))`` blocks in y;
  block y's thread sums rows ``32*y + 32*gy*k + i`` (k = 0, 1, ..., i = 0..31) in order, stores
  the partial AS T into a [gy, N] tensor, then ``dgamma_blocks.sum(0)``: Reduce.cuh's outer
  reduction of T values with f32 accumulation (``kernelize.backward.col_sum``, which takes the
  SM count too), rounded to T.
* else ``M < 64``: block (32, 1), tile 8, partial_reduction: one thread sums all rows in order.
* else block (32, bdy) with tile R = 8 * bdy: bdy = 8 (M < 128), 16 (M < 256), 32 otherwise.
  Thread y sums rows ``R*k + 8*y + i`` (k = 0, 1, ..., i = 0..7) in order (rows past M add
  +0: the kernel zeroes dY, X, mean and rstd there), then the transpose through shared memory
  and a shfl_xor butterfly over y (deltas bdy/2..1), whose lane 0 equals the halving tree
  ``v[y] += v[y + off]``, off = bdy/2..1.

**FMA contraction**: layer_norm_kernel.cu is compiled by nvcc with its default ``--fmad=true``,
so ``acc += a * b`` inside these kernels may become one fused multiply-add (unlike the separate
TensorIterator kernels of backward.py's chain). What nvcc emitted is read from the SASS of
``layer_norm_grad_input_kernel_vectorized<float, float, false>`` for sm_90 in the torch
2.15.0+cu132 wheel (``cuobjdump -sass -fun`` from PyPI's nvidia-cuda-cuobjdump 13.5, on the
build machine; session 25): in the sums' loop ``FMUL clg = dy * w; FMUL P = clg * (x - m); FFMA
s2 = P * r + s2; FADD s1 = clg + s1``: **s2 fused, s1 not** (``clg`` has two uses: s1's add and
P's product) -- the defaults ``sum_fma=True`` (s2, and dg, whose f32 bits matched eager on an
H200 in session 22), ``s1_fma=False``; in the dx loop ``FMUL A = fH * w; FMUL Bv = (x - m) * r;
FMUL t = s2 * Bv; FFMA f1 = dy * A - t; FADD f2 = f1 - s1; FMUL dx = term1 * f2``: the left
product fused (``dx_fma="xy_sub_z"``), ``term1 = fl(fl(1 / fH) * r)`` with an IEEE reciprocal.
torch 2.11 (the GPU machine's) was not read; its f32 dx is the check (the probe). The
alternatives the probe scores: ``"x_sub_yz"`` = ``fma(-Bv, s2, fl(A * dy))``, ``"none"`` =
``fl(fl(A * dy) - fl(Bv * s2))``, ``sum_fma=False``, ``s1_fma=True`` (sessions 22-25's model,
whose f32 dx missed eager's in up to 5.7% of elements), ``"nested_xy"`` = ``fma(A, dy, fma(-Bv,
s2, -s1))``, ``"nested_yz"`` = ``fma(-Bv, s2, fma(A, dy, -s1))`` and the s2 forms (S2_FORMS).
``cl * g`` is exact in f32 for bf16 and f16 inputs, so s1's contraction only matters in f32.

The functions take numpy float32 arrays (values of T held as f32) and return float32 arrays.
"""

from __future__ import annotations

import numpy as np

from kernelize.backward import F32, _halving, cdiv, col_config, col_sum, round_to

WARP = 32
DX_THREADS = 128          # num_threads() = C10_WARP_SIZE * 4 on CUDA (thread_constants.h)
VEC = 4                   # vec_size, and compute_gI's unroll
DX_FMA = ("xy_sub_z", "x_sub_yz", "none", "nested_xy", "nested_yz")
ITEMSIZE = {"bf16": 2, "f16": 2, "f32": 4}


# ---- one rounding: the fused multiply-add ----------------------------------------------------------

def fma32(a, b, c) -> np.ndarray:
    """fl(a * b + c) with ONE rounding to f32 (CUDA's fmaf / fma.rn.f32), elementwise.

    a * b of two f32 is exact in f64; the f64 sum is made round-to-odd from its TwoSum error, and
    round-to-odd at 53 bits followed by one rounding to 24 bits is the correctly rounded result
    (53 >= 24 + 2). Finite, non-overflowing inputs (subnormal f32 results are rounded by numpy's
    f64 -> f32 cast, which is correct as well)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    p = a * b                                # exact
    s = p + c
    bp = s - c                               # TwoSum (Knuth): s + e == p + c exactly
    bc = s - bp
    e = (p - bp) + (c - bc)
    odd = (np.ascontiguousarray(s).view(np.uint64) & np.uint64(1)).astype(bool)
    fix = (e != 0) & ~odd & np.isfinite(s)
    if np.any(fix):
        s = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(F32)


def _mul(a, b):
    return (np.asarray(a, F32) * np.asarray(b, F32)).astype(F32)


# ---- dx: which kernel, and its row sums ------------------------------------------------------------

def dx_kernel(cols: int, dtype: str, aligned: bool = True) -> str:
    """LayerNormBackwardKernelImplInternal's choice (CUDA, not ROCm): "vectorized" when cols % 4
    == 0 and dY, X, gamma, dX are all 4 * sizeof(T)-aligned (a fresh allocation is), else
    "plain" (layer_norm_grad_input_kernel). Both give the same bits (see the module doc)."""
    return "vectorized" if (cols % VEC == 0 and aligned and dtype in ITEMSIZE) else "plain"


def thread_of_col(cols: int) -> np.ndarray:
    """The dx block's thread that accumulates column e: (e // 4) % 128."""
    return (np.arange(cols) // VEC) % DX_THREADS


def _thread_partials(a, b, fused: bool) -> np.ndarray:
    """Each of the 128 threads' sequential sum of a[e] * b[e] over its columns in increasing order
    ([R, cols] -> [R, 128]); fused: acc = fma(a, b, acc), else acc = fl(acc + fl(a * b))."""
    a = np.asarray(a, F32)
    b = np.asarray(b, F32)
    R, cols = a.shape
    span = DX_THREADS * VEC
    K = cdiv(cols, span)
    pa = np.zeros((R, K * span), F32)
    pb = np.zeros((R, K * span), F32)
    pa[:, :cols] = a
    pb[:, :cols] = np.broadcast_to(b, a.shape)
    pa = pa.reshape(R, K, DX_THREADS, VEC)
    pb = pb.reshape(R, K, DX_THREADS, VEC)
    acc = np.zeros((R, DX_THREADS), F32)          # +0, never -0: the zero padding adds nothing
    for k in range(K):
        for v in range(VEC):
            if fused:
                acc = fma32(pa[:, k, :, v], pb[:, k, :, v], acc)
            else:
                acc = (acc + _mul(pa[:, k, :, v], pb[:, k, :, v])).astype(F32)
    return acc


def block_reduce_sum(p) -> np.ndarray:
    """cuda_utils::BlockReduceSum over a 128-thread block ([R, 128] -> [R]): the halving tree
    in each warp, then warp 0 reduces the 4 warp sums padded with zeros: (w0 + w2) + (w1 + w3)."""
    p = np.asarray(p, F32)
    R, n = p.shape
    w = _halving(p.reshape(R, n // WARP, WARP), -1)     # [R, warps]
    lanes = np.zeros((R, WARP), F32)
    lanes[:, :w.shape[1]] = w
    return _halving(lanes, -1)


#: How s2's term meets rstd (scored by the probe in f32, where they differ): "inside" (the source
#: read: ``acc += ((dy * w) * (x - m)) * r``), "xhat" (``acc += (dy * w) * fl((x - m) * r)``: a
#: source that computes x_hat once and reuses it), "after" (``acc += (dy * w) * (x - m)``, the
#: block's sum times r once).
S2_FORMS = ("inside", "xhat", "after")


def row_stats(dy, x, w, mean, rstd, sum_fma: bool = True, s2_form: str = "inside",
              s1_fma: bool = False):
    """(s1, s2) of every row as the dx kernel computes them ([rows] each). `sum_fma`: s2's
    contraction; `s1_fma`: s1's, apart (default unfused, as eager's SASS shows: the module's doc);
    `s2_form`: S2_FORMS. ``c_loss * gamma_val`` is one value read by both sums; in bf16/f16 it
    is exact and s1 the same either way."""
    g = np.asarray(dy, F32)
    h = np.asarray(x, F32)
    wv = np.asarray(w, F32)[None, :]
    m = np.asarray(mean, F32).reshape(-1, 1)
    r = np.asarray(rstd, F32).reshape(-1, 1)
    clg = _mul(g, wv)                                # c_loss * gamma_val (exact for bf16/f16)
    s1 = block_reduce_sum(_thread_partials(g, np.broadcast_to(wv, g.shape), True)) if s1_fma \
        else block_reduce_sum(_thread_partials(clg, np.ones_like(clg), False))
    hm = (h - m).astype(F32)
    if s2_form == "inside":
        P = _mul(clg, hm)                            # (c_loss * gamma_val) * (c_h - mean_val)
        s2 = block_reduce_sum(_thread_partials(P, np.broadcast_to(r, P.shape), sum_fma))
    elif s2_form == "xhat":
        s2 = block_reduce_sum(_thread_partials(clg, _mul(hm, r), sum_fma))
    elif s2_form == "after":
        s2 = _mul(block_reduce_sum(_thread_partials(clg, hm, sum_fma)), r.reshape(-1))
    else:
        raise ValueError(s2_form)
    return s1, s2


def dx_from_stats(dy, x, w, mean, rstd, s1, s2, dtype: str, dx_fma: str = "xy_sub_z") -> np.ndarray:
    """The dx kernel's second loop, given the row sums: f32 [rows, cols] holding T values."""
    g = np.asarray(dy, F32)
    h = np.asarray(x, F32)
    rows, cols = h.shape
    wv = np.asarray(w, F32)[None, :]
    m = np.asarray(mean, F32).reshape(-1, 1)
    r = np.asarray(rstd, F32).reshape(-1, 1)
    s1 = np.asarray(s1, F32).reshape(-1, 1)
    s2 = np.asarray(s2, F32).reshape(-1, 1)
    fH = F32(cols)
    A = _mul(fH, wv)                                 # fH * gamma_val
    Bv = _mul((h - m).astype(F32), r)                # (x - mean_val) * rstd_val
    s2b = np.broadcast_to(s2, h.shape)
    if dx_fma == "xy_sub_z":
        f1 = fma32(np.broadcast_to(A, h.shape), g, -_mul(Bv, s2b))
    elif dx_fma == "x_sub_yz":
        f1 = fma32(-Bv, s2b, _mul(A, g))
    elif dx_fma == "none":
        f1 = (_mul(A, g) - _mul(Bv, s2b)).astype(F32)
    elif dx_fma in ("nested_xy", "nested_yz"):
        f1 = None   # the subtraction of s1 folded into the inner fma (below)
    else:
        raise ValueError(dx_fma)
    s1b = np.broadcast_to(s1, h.shape)
    if dx_fma == "nested_xy":    # fma(A, dy, fma(-Bv, s2, -s1))
        f2 = fma32(np.broadcast_to(A, h.shape), g, fma32(-Bv, s2b, -s1b))
    elif dx_fma == "nested_yz":  # fma(-Bv, s2, fma(A, dy, -s1))
        f2 = fma32(-Bv, s2b, fma32(np.broadcast_to(A, h.shape), g, -s1b))
    else:
        f2 = (f1 - s1).astype(F32)                   # f -= stats_x1
    term1 = _mul(F32(1) / fH, r)                     # (1 / fH) * rstd_val (IEEE division)
    return round_to(_mul(f2, term1), dtype)          # f *= term1; the store rounds to T


# ---- dw, db: GammaBetaBackward -----------------------------------------------------------------

def gamma_beta_config(rows: int, cols: int, sms: int = 132) -> dict:
    """LaunchGammaBetaBackwardCUDAKernel's choice for M = rows, N = cols on a device with `sms`
    multiprocessors: variant "partial" (two passes, SM-dependent), "single" (M < 64: one thread
    per column sums every row), "tree" (block (32, bdy), tile 8 * bdy, halving over y)."""
    M, N = int(rows), int(cols)
    bx = 32
    if M > 64 * 1024 and N // bx < sms // 2:
        gx = cdiv(N, bx)
        gy = min((64 * 1024 // 2) // gx, cdiv(M, 32))
        return dict(variant="partial", bdy=1, tile=32, per_thread=32, grid=(gx, gy),
                    aligned=(M % 32 == 0 and N % bx == 0))
    if M < 64:
        bdy, tile = 1, 8
    elif M < 128:
        bdy, tile = 8, 64
    elif M < 256:
        bdy, tile = 16, 128
    else:
        bdy, tile = 32, 256
    return dict(variant="single" if bdy == 1 else "tree", bdy=bdy, tile=tile, per_thread=tile // bdy,
                grid=(cdiv(N, bx), 1), aligned=(M % tile == 0 and N % bx == 0))


def pre2025_gamma_beta_config(rows: int, cols: int) -> dict:
    """A hypothesis for the probe: the kernels before PyTorch's 2025 rewrite (GammaBetaBackward-
    SimpleCUDAKernel below 128 rows, else the 32x32 / 16x32 kernels: chains R*k + 8*y + i with
    R = 256 and 32 chains, a halving tree over them). In this module's terms: "single" below 128
    rows, "tree" with bdy = 32 from 128 on."""
    if rows < 128:
        return dict(variant="single", bdy=1, tile=8, per_thread=8, grid=(cdiv(cols, 32), 1))
    return dict(variant="tree", bdy=32, tile=256, per_thread=8, grid=(cdiv(cols, 32), 1))


def _chains(a, b, n_chains: int, tile: int, per: int, fused: bool):
    """Sequential sums over rows: chain y takes rows tile*k + per*y + i (k = 0.., i < per), in
    that order. a, b: [rows, cols] (b may broadcast). Returns [n_chains, cols]."""
    a = np.asarray(a, F32)
    rows, cols = a.shape
    b = np.broadcast_to(np.asarray(b, F32), a.shape)
    K = cdiv(rows, tile)
    pa = np.zeros((K * tile, cols), F32)
    pb = np.zeros((K * tile, cols), F32)
    pa[:rows] = a
    pb[:rows] = b
    pa = pa.reshape(K, n_chains, per, cols)
    pb = pb.reshape(K, n_chains, per, cols)
    acc = np.zeros((n_chains, cols), F32)
    for k in range(K):
        for i in range(per):
            if fused:
                acc = fma32(pa[k, :, i], pb[k, :, i], acc)
            else:
                acc = (acc + _mul(pa[k, :, i], pb[k, :, i])).astype(F32)
    return acc


def column_sums(a, b, dtype: str, cfg: dict, fused: bool, sms: int = 132,
                max_threads_per_sm: int = 2048) -> np.ndarray:
    """sum over rows of a*b (each term into the accumulator as configured) in the variant's
    order, rounded to T: [cols]."""
    if cfg["variant"] == "partial":
        gy = cfg["grid"][1]
        part = _chains(a, b, gy, 32 * gy, 32, fused)          # chain y: rows 32*gy*k + 32*y + i
        part = round_to(part, dtype)                         # stored as T (dgamma_blocks)
        return round_to(col_sum(part, sms, max_threads_per_sm), dtype)   # .sum(0), Reduce.cuh
    if cfg["variant"] == "single":
        return round_to(_chains(a, b, 1, 1, 1, fused)[0], dtype)
    bdy = cfg["bdy"]
    v = _chains(a, b, bdy, cfg["tile"], cfg["per_thread"], fused)
    return round_to(_halving(v, 0), dtype)


def gamma_beta(dy, x, mean, rstd, dtype: str, *, sms: int = 132, max_threads_per_sm: int = 2048,
               sum_fma: bool = True, cfg: dict | None = None):
    """(dw, db) as f32 arrays holding T values."""
    g = np.asarray(dy, F32)
    h = np.asarray(x, F32)
    rows, cols = h.shape
    m = np.asarray(mean, F32).reshape(-1, 1)
    r = np.asarray(rstd, F32).reshape(-1, 1)
    c = cfg or gamma_beta_config(rows, cols, sms)
    q = _mul(g, (h - m).astype(F32))                 # dY_regs[i] * (X_regs[i] - mean_reg)
    dw = column_sums(q, r, dtype, c, sum_fma, sms, max_threads_per_sm)
    db = column_sums(g, np.ones_like(g), dtype, c, False, sms, max_threads_per_sm)  # db_sum += dY (exact terms)
    return dw, db


# ---- the whole backward ------------------------------------------------------------------------------

def layer_norm_backward(dy, x, w, mean, rstd, dtype: str, *, sms: int = 132,
                        max_threads_per_sm: int = 2048, dx_fma: str = "xy_sub_z",
                        sum_fma: bool = True, s1_fma: bool = False, dw_fma: bool | None = None,
                        gb_cfg: dict | None = None, return_parts: bool = False):
    """(dx, dw, db) of eager autograd through F.layer_norm(x, [cols], w, b, eps), as float32
    arrays holding T values. dy, x: [rows, cols]; w: [cols]; mean, rstd: eager's saved f32 per-row
    statistics ([rows] or [rows, 1]). The bias value does not enter the backward. `sms` matters
    only for the "partial" dw/db variant (rows > 65536 and cols // 32 < sms // 2).
    dx_fma / sum_fma / s1_fma / dw_fma (default sum_fma) / gb_cfg: the alternatives the probe
    scores."""
    s1, s2 = row_stats(dy, x, w, mean, rstd, sum_fma, s1_fma=s1_fma)
    dx = dx_from_stats(dy, x, w, mean, rstd, s1, s2, dtype, dx_fma)
    rows, cols = np.shape(x)
    cfg = gb_cfg or gamma_beta_config(rows, cols, sms)
    dw, db = gamma_beta(dy, x, mean, rstd, dtype, sms=sms, max_threads_per_sm=max_threads_per_sm,
                        sum_fma=sum_fma if dw_fma is None else dw_fma, cfg=cfg)
    if return_parts:
        return dx, dw, db, dict(s1=s1, s2=s2, gb_cfg=cfg, dx_kernel=dx_kernel(cols, dtype))
    return dx, dw, db


def bytes_moved(rows: int, cols: int, dtype: str) -> int:
    """What the backward must move: read dy, x, w, mean, rstd; write dx, dw, db."""
    t = ITEMSIZE[dtype]
    return 3 * rows * cols * t + 3 * cols * t + 2 * rows * 4


__all__ = ["fma32", "dx_kernel", "thread_of_col", "block_reduce_sum", "row_stats", "dx_from_stats",
           "gamma_beta_config", "pre2025_gamma_beta_config", "column_sums", "gamma_beta",
           "layer_norm_backward", "bytes_moved", "DX_FMA", "col_config"]
