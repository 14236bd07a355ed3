"""Eager autograd's backward of ``F.rms_norm`` / ``nn.RMSNorm`` on CUDA, emulated on the CPU one
rounding at a time (issue 30; docs/backward-rms-torch.md has the sources).

On CUDA, ``F.rms_norm(x, [cols], w, eps)`` (input and weight of one dtype) is
``aten::_fused_rms_norm``: the forward runs layer_norm_kernel.cu's kernels with ``rms_norm = true``
and saves the per-row f32 ``rstd``; autograd records one node whose backward (GradMode off, as in
a plain ``loss.backward()``) is ``_fused_rms_norm_backward(dy, x, [cols], rstd, w, mask)`` ->
``RMSNormBackwardKernelImpl`` -> ``LayerNormBackwardKernelImplInternal<T, rms_norm = true>``: the
very kernels of nn.LayerNorm's backward (``kernelize.backward_ln``) with the mean and s1 taken out:

    s2 = sum_row fma(fl(fl(dy * w) * x), r, .)       (eager's SASS: FMUL, FMUL, FFMA)
    dx = round_T(fl(fma(fl(cols * w), dy, -fl(fl(x * r) * s2)) * fl(fl(1 / cols) * r)))
    dw = round_T(colsum fma(fl(dy * x), r, .))        (GammaBetaBackward's chains and tree)

which is ``backward_ln``'s chain with ``mean = 0`` (``x - 0`` is exact, -0 included) and ``s1 = 0``
(``f1 - 0`` is exact), the same row sum (thread t of 128 takes the elements e with (e / 4) % 128
== t; BlockReduceSum) and the same column sum (``gamma_beta_config``, the two-pass variant above
65536 rows included). ``rstd`` is what the forward saved: ``forward_rstd`` recomputes it in the
forward's order (docs/eager-order.md (c), which matched eager on an H200 in every row checked).

The functions take numpy float32 arrays (values of T held as f32) and return float32 arrays.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from kernelize import backward_ln as L
from kernelize.backward import F32, _halving, cdiv

#: lanes of the forward's vectorized kernel (128 threads of 4-vectors) and row-wise kernel (512)
VEC_LANES = 128
ROW_LANES = 512


def rsqrt_f32(v) -> np.ndarray:
    """1 / sqrtf(v) in f32 (the CPU harness's rsqrtf; CUDA's rsqrtf is what the GPU runs)."""
    v = np.asarray(v, F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (F32(1) / np.sqrt(v).astype(F32)).astype(F32)


def vectorized_order(cols: int) -> bool:
    """The forward's kernel (LayerNormKernelImplInternal): the vectorized one when cols % 4 == 0
    (and cols <= 2^24; fresh aligned tensors), else RowwiseMomentsCUDAKernel's Welford."""
    return cols % 4 == 0 and cols <= (1 << 24)


def _vec_sumsq(x: np.ndarray) -> np.ndarray:
    """compute_stats<T, rms_norm = true>: thread t folds the elements of its 4-vectors t, t + 128,
    ... in order, m2 = fma(h, h, m2); a shfl_down tree in each warp, then (w0 + w2) + (w1 + w3)."""
    R, N = x.shape
    nv = N // 4
    K = cdiv(nv, VEC_LANES)
    buf = np.zeros((R, K * VEC_LANES * 4), F32)
    buf[:, :N] = x
    buf = buf.reshape(R, K, VEC_LANES, 4)
    valid = (np.arange(K * VEC_LANES) < nv).reshape(K, VEC_LANES)
    s = np.zeros((R, VEC_LANES), F32)
    for k in range(K):
        for i in range(4):
            v = buf[:, k, :, i]
            s = np.where(valid[k], L.fma32(v, v, s), s).astype(F32)
    w = _halving(s.reshape(R, VEC_LANES // 32, 32), -1)      # [R, 4] warp sums
    return _halving(w, -1)                                   # (w0 + w2) + (w1 + w3)


def _w_push(st, v, ok):
    m, m2, n = st
    nn = (n + F32(1)).astype(F32)
    d = (v - m).astype(F32)
    nm = (m + (d / nn).astype(F32)).astype(F32)
    nm2 = L.fma32(d, (v - nm).astype(F32), m2)
    return np.where(ok, nm, m), np.where(ok, nm2, m2), np.where(ok, nn, n)


def _w_comb(a, b):
    """WelfordOps::combine(a = own, b = other) with nvcc's contractions (as the forward kernel)."""
    am, a2, an = a
    bm, b2, bn = b
    d = (bm - am).astype(F32)
    nc = (an + bn).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        nb = (bn / np.where(nc == 0, F32(1), nc)).astype(F32)
    mean = L.fma32(d, nb, am)
    m2 = L.fma32(((d * d).astype(F32) * an).astype(F32), nb, (a2 + b2).astype(F32))
    az, bz = an == 0, bn == 0
    return (np.where(az, bm, np.where(bz, am, mean)).astype(F32),
            np.where(az, b2, np.where(bz, a2, m2)).astype(F32),
            np.where(az, bn, np.where(bz, an, nc)).astype(F32))


def _rowwise_moments(x: np.ndarray):
    """RowwiseMomentsCUDAKernel: 512 lanes, lane l folds elements l, l + 512, ... with WelfordOps;
    each warp's shfl_down tree, then the 16 warp results' halving tree (identities above)."""
    R, N = x.shape
    K = cdiv(N, ROW_LANES)
    buf = np.zeros((R, K * ROW_LANES), F32)
    buf[:, :N] = x
    buf = buf.reshape(R, K, ROW_LANES)
    valid = (np.arange(K * ROW_LANES) < N).reshape(K, ROW_LANES)
    st = (np.zeros((R, ROW_LANES), F32),) * 3
    for k in range(K):
        st = _w_push(st, buf[:, k], valid[k])
    st = [a.reshape(R, 16, 32).copy() for a in st]
    off = 16
    while off > 0:
        res = _w_comb(tuple(a[..., :off] for a in st), tuple(a[..., off:2 * off] for a in st))
        for a, r in zip(st, res):
            a[..., :off] = r
        off //= 2
    w = [a[..., 0].copy() for a in st]                      # [R, 16]
    off = 8
    while off > 0:
        res = _w_comb(tuple(a[:, :off] for a in w), tuple(a[:, off:2 * off] for a in w))
        for a, r in zip(w, res):
            a[:, :off] = r
        off //= 2
    return w[0][:, 0], w[1][:, 0], w[2][:, 0]


def forward_rstd(x, eps: float, rsqrt: Callable | None = None) -> np.ndarray:
    """The rstd eager's F.rms_norm forward saves, per row ([rows] f32). `rsqrt`: CUDA's rsqrtf on
    the GPU; the default is the CPU harness's ``1 / sqrtf``."""
    rs = rsqrt or rsqrt_f32
    x = np.ascontiguousarray(x, dtype=F32)
    R, N = x.shape
    if vectorized_order(N):
        arg = ((_vec_sumsq(x) / F32(N)).astype(F32) + F32(eps)).astype(F32)
    else:
        m, m2, n = _rowwise_moments(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            var = (m2 / n).astype(F32)
        arg = (L.fma32(m, m, var) + F32(eps)).astype(F32)
    return np.asarray(rs(arg), F32).reshape(R)


def rms_norm_backward(dy, x, w, rstd, dtype: str, *, sms: int = 132, max_threads_per_sm: int = 2048,
                      return_parts: bool = False):
    """(dx, dw) of eager autograd through F.rms_norm(x, [cols], w, eps), as float32 arrays holding
    T values, from the forward's saved ``rstd`` ([rows] or [rows, 1]). dy, x: [rows, cols]; w:
    [cols]. ``sms`` / ``max_threads_per_sm`` matter only for dw's two-pass variant (rows > 65536
    and cols // 32 < sms // 2)."""
    h = np.asarray(x, F32)
    rows, cols = h.shape
    g = np.asarray(dy, F32)
    r = np.asarray(rstd, F32).reshape(rows)
    zero = np.zeros(rows, F32)
    _, s2 = L.row_stats(g, h, w, zero, r)                # s2 as layer_norm's with mean 0
    dx = L.dx_from_stats(g, h, w, zero, r, zero, s2, dtype)   # f1 - s1 with s1 = 0: f1
    cfg = L.gamma_beta_config(rows, cols, sms)
    q = L._mul(g, h)                                     # dY_regs[i] * X_regs[i]
    dw = L.column_sums(q, r.reshape(-1, 1), dtype, cfg, True, sms, max_threads_per_sm)
    if return_parts:
        return dx, dw, dict(s2=s2, gb_cfg=cfg)
    return dx, dw


def rms_norm_backward_from_x(dy, x, w, eps: float, dtype: str, *, rsqrt: Callable | None = None,
                             sms: int = 132, max_threads_per_sm: int = 2048):
    """(r, dx, dw) with r = ``forward_rstd(x, eps)``: what the bundled kernel computes from (dy,
    x, w, eps) alone (it recomputes the forward's r in the forward's order)."""
    r = forward_rstd(x, eps, rsqrt)
    dx, dw = rms_norm_backward(dy, x, w, r, dtype, sms=sms, max_threads_per_sm=max_threads_per_sm)
    return r, dx, dw


def two_pass(rows: int, cols: int, sms: int) -> bool:
    """Whether eager's dw is the two-pass variant (SM-dependent), which the bundled kernel does
    not implement (its dwp traps there)."""
    return L.gamma_beta_config(rows, cols, sms)["variant"] == "partial"
