#!/usr/bin/env python3
"""CPU emulators of PyTorch eager's row-reduction order, checked bit for bit against CUDA eager.

    python3 scripts/eager_order.py OUT_DIR [--quick] [--dump] [--max-seconds S]

Three eager computations over a contiguous [rows, cols] tensor, each emulated with numpy float32
arithmetic in the order the CUDA kernels use (see docs/eager-order.md for the source reading):

  (a) h.pow(2).mean(-1, keepdim=True), float32   -> ATen's generic reduce kernel (Reduce.cuh,
      MeanOps).  Its order depends on a ReduceConfig derived from (rows, cols): see
      reduce_config(), which is printed per shape.
  (b) F.layer_norm / aten.native_layer_norm       -> layer_norm_kernel.cu: vectorized_layer_norm_
      kernel (per-thread Welford + WelfordDataLN combine) when cols % 4 == 0, else
      RowwiseMomentsCUDAKernel (WelfordOps + BlockReduce) + LayerNormForwardCUDAKernel.
  (c) F.rms_norm -> aten._fused_rms_norm          -> the same two kernels with rms_norm=true.

Each emulator takes a float32 numpy array [R, cols] (R rows of the tensor; rows_total/row_ids say
which rows of how big a tensor they are, since (a)'s order depends on the tensor's row count and,
for cols % 4 != 0, on each row's memory alignment) and returns per-row results.  rsqrtf is not
emulated: the statistics are computed on the CPU up to the argument of rsqrt, and the rsqrt is
applied with torch.rsqrt on the GPU (CUDA rsqrtf, what the kernels call); without a GPU a float64
1/sqrt stands in (not bit-exact).

For contrast the same quantities are computed in the "canonical 256-lane row reduction" (CRR) of
docs/reference-semantics.md.

Verified on an H200 with torch 2.11.0+cu130 (docs/eager-order.md has the table): (a), (b), (c)
bit-exact on every row checked.

On a machine with CUDA torch the script compares everything bitwise with eager and writes
OUT_DIR/eager_order.json and a printed table.  Without CUDA torch it only runs the emulators on
random data (a smoke test of the emulator code).
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

F32 = np.float32
WARP = 32
SEED = 1234
ROWS = [1, 2, 3, 7, 33, 64, 512, 1024, 4096]
COLS = [64, 127, 256, 768, 1000, 1001, 2048, 4096, 5120, 8192, 16384, 65536]
MAX_ELEMS = 64 * 1024 * 1024
# (a) with --dump: split-across-warps shapes whose inputs and eager results are saved (first N
# rows) to OUT_DIR/raw_split.npz, so that the combine order can be studied offline
DUMP_SPLIT = {(2, 8192): 2, (3, 8192): 3, (7, 8192): 7, (33, 8192): 33, (64, 8192): 64,
              (512, 8192): 32, (4096, 8192): 16, (2, 16384): 2, (7, 16384): 7, (33, 16384): 33,
              (3, 65536): 3, (7, 65536): 7, (33, 65536): 8}
RMS_EPS = 1e-6
LN_EPS = 1e-5
# rows actually emulated per shape are capped so that rows_checked * cols <= budget
BUDGET_A = 64 * 1024 * 1024      # (a): every row of every shape
BUDGET_BC = 2 * 1024 * 1024
# diagnostics (alternative orders) run only where the main emulator mismatches, on small checks
DIAG_MAX_ELEMS = 512 * 1024
DIAG_MAX_PER_OP = 12


# ----------------------------------------------------------------------------- float helpers
def fma32(a, b, c):
    """Correctly rounded float32 fused multiply-add, elementwise (numpy has no fma).

    a*b is exact in float64; the sum is rounded to float64 with round-to-odd (TwoSum + parity
    fix), then to float32 with round-to-nearest-even, which is exact since 53 >= 24 + 2."""
    a64 = np.asarray(a, dtype=F32).astype(np.float64)
    b64 = np.asarray(b, dtype=F32).astype(np.float64)
    c64 = np.asarray(c, dtype=F32).astype(np.float64)
    p = a64 * b64
    s = np.ascontiguousarray(p + c64)
    bv = s - p
    e = (p - (s - bv)) + (c64 - bv)
    # (e is NaN where an operand or the sum is Inf/NaN: s is then already the answer)
    fix = (e != 0) & np.isfinite(e) & ((s.view(np.int64) & 1) == 0)
    if np.any(fix):
        s = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(F32)


def round_bf16(x):
    """float32 -> bfloat16 (round to nearest even), returned as float32 values."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(F32)


def ordered(x):
    i = np.ascontiguousarray(x, dtype=F32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def ulp_diff(a, b):
    return np.abs(ordered(a) - ordered(b))


def rsqrt_cpu(v):
    """Stand-in for CUDA rsqrtf when no GPU is present (NOT bit-exact with rsqrtf)."""
    return (1.0 / np.sqrt(np.asarray(v, dtype=np.float64))).astype(F32)


def cdiv(a, b):
    return -(-a // b)


# ----------------------------------------------------------------- (a) Reduce.cuh configuration
def last_pow2(n):
    """Reduce.cuh last_pow2: floor(log2(n)) as a power of two, at least 1."""
    n = int(n)
    return max(1, 1 << (n.bit_length() - 1)) if n > 0 else 1


def reduce_config(rows, cols, num_mp=132, max_threads_per_mp=2048, vt0=4, input_vec_size=4,
                  max_num_threads=512, elem_size=4):
    """Reduce.cuh setReduceConfig<arg_t=float, scalar_t=float, vt0=4, input_vec_size=4> for a
    contiguous [rows, cols] float32 tensor reduced over its last dim (one reduce dim, reduction on
    the fastest-striding dimension, fastest_moving_stride == sizeof(float))."""
    num_outputs, num_inputs = rows, cols
    dim0, dim1 = cols, rows
    vectorize = dim0 > 128 and vt0 >= input_vec_size
    if vectorize:
        dim0 //= input_vec_size
    # set_block_dimension<float>(dim0, dim1), output_vec_size == 1
    d0 = last_pow2(dim0) if dim0 < max_num_threads else max_num_threads
    d1 = last_pow2(dim1) if dim1 < max_num_threads else max_num_threads
    bw = min(d0, WARP)
    bh = min(d1, max_num_threads // bw)
    bw = min(d0, max_num_threads // bh)
    step_input, step_output = 1, 1
    input_mult, output_mult = [0, 0, 0], [0, 0]
    input_mult[0] = step_input          # split_input(block_width)
    step_input *= bw
    vpt = cdiv(num_inputs, step_input)
    warp_split_threshold = min(bh * 16, 256)
    split_across_warps = vpt >= warp_split_threshold
    if split_across_warps:
        input_mult[1] = step_input      # split_input(block_height)
        step_input *= bh
    else:
        output_mult[1] = step_output    # split_output(block_height)
        step_output *= bh
    num_threads = bw * bh
    blocks_per_sm = max_threads_per_mp // num_threads
    target_grid_size = num_mp * blocks_per_sm
    grid_x = cdiv(num_outputs, step_output)
    ctas = 1
    if input_mult[1] != 0 and cdiv(num_inputs, step_input) >= 256 and grid_x <= target_grid_size:
        v = cdiv(num_inputs, step_input)
        c1 = cdiv(target_grid_size, grid_x)
        c2 = cdiv(v, 16)
        c3 = cdiv(v, 256)
        ctas = max(min(c1, c2), c3)
        if ctas > 1:
            input_mult[2] = step_input
            step_input *= ctas
    # block_order "xy": ReduceOp::run calls block_x_reduce before block_y_reduce (what torch 2.11
    # does; measured, see docs/eager-order.md); "yx" is the older order (y first, then x).
    return dict(warp_order="down", block_order="xy",
                vectorize=bool(vectorize), input_vec_size=input_vec_size if vectorize else 1,
                vt0=vt0, block_width=bw, block_height=bh, num_threads=num_threads,
                split_across_warps=bool(split_across_warps), input_mult=input_mult,
                output_mult=output_mult, step_input=step_input, step_output=step_output,
                ctas_per_output=ctas, values_per_thread=cdiv(num_inputs, step_input),
                grid=[grid_x, ctas])


def config_str(c):
    return (f"vec={'y' if c['vectorize'] else 'n'}x{c['input_vec_size']} bw={c['block_width']} "
            f"bh={c['block_height']} ywarps_split={'y' if c['split_across_warps'] else 'n'} "
            f"input_mult={c['input_mult']} step_in={c['step_input']} ctas={c['ctas_per_output']} "
            f"vpt={c['values_per_thread']}"
            + (f" order={c['block_order']}" if c['split_across_warps'] else ""))


# ------------------------------------------------------------------------- (a) reduce kernel
def _threads_shape(cfg):
    C = cfg["ctas_per_output"]
    Y = cfg["block_height"] if cfg["input_mult"][1] else 1
    return C, Y, cfg["block_width"]


def _vec_partials(v, cfg, shift):
    """input_vectorized_thread_reduce_impl for rows sharing one alignment shift.
    v: [R, cols] per-element values (already squared).  Returns per-thread values [R, C, Y, bw]."""
    R, cols = v.shape
    vs = cfg["input_vec_size"]
    C, Y, bw = _threads_shape(cfg)
    S = C * Y * bw
    assert S == cfg["step_input"], (S, cfg)
    acc = np.zeros((R, S, vs), F32)
    data, end = v, cols
    if shift > 0:
        # head: data -= shift; threads threadIdx.x in [shift, vs) (threadIdx.y == 0, blockIdx.y
        # == 0) start value_list[0] from element threadIdx.x - shift; then data is aligned.
        nhead = vs - shift
        acc[:, shift:shift + nhead, 0] = v[:, :nhead]
        data, end = v[:, nhead:], cols - nhead
    nvec = end // vs
    K = cdiv(nvec, S)
    if K > 0:
        buf = np.zeros((R, K * S * vs), F32)
        buf[:, :nvec * vs] = data[:, :nvec * vs]
        buf = buf.reshape(R, K, S, vs)
        for k in range(K):          # thread g loads vectors g, g+S, ...; value_list[i] += v[i]
            acc += buf[:, k]        # (+0 for vectors past the end: exact, values are >= +0)
    ntail = end % vs
    if ntail:                       # tail elements go to threadIdx.x == j, value_list[0]
        acc[:, :ntail, 0] += data[:, nvec * vs:nvec * vs + ntail]
    a = acc[:, :, 0]
    for i in range(1, vs):          # combine accumulators left to right
        a = a + acc[:, :, i]
    return a.reshape(R, C, Y, bw)


def _strided_partials(v, cfg):
    """thread_reduce_impl (non-vectorized, contiguous, output_vec_size 1): thread g reads
    elements g, g+S, g+2S, ...; the m-th of them goes to value_list[m % vt0]."""
    R, cols = v.shape
    vt0 = cfg["vt0"]
    C, Y, bw = _threads_shape(cfg)
    S = C * Y * bw
    M = cdiv(cdiv(cols, S), vt0) * vt0
    buf = np.zeros((R, M * S), F32)
    buf[:, :cols] = v
    buf = buf.reshape(R, M, S)
    acc = np.zeros((R, vt0, S), F32)
    for m in range(M):
        acc[:, m % vt0] += buf[:, m]
    a = acc[:, 0]
    for i in range(1, vt0):
        a = a + acc[:, i]
    return a.reshape(R, C, Y, bw)


def _block_y_tree(p):
    """block_y_reduce over axis -2 (blockDim.y, a power of two): v[y] += v[y + off]."""
    p = p.copy()
    off = p.shape[-2] // 2
    while off > 0:
        p[..., :off, :] = p[..., :off, :] + p[..., off:2 * off, :]
        off //= 2
    return p[..., 0, :]


def _block_x_tree(p, warp_order="down"):
    """block_x_reduce over the last axis: shared-memory halving (offsets dim_x/2 .. 32) down to
    32 lanes, then warp_shfl_down.  warp_order "down": offsets 16, 8, 4, 2, 1 (current upstream
    on CUDA: "Intra-warp reduction, fix CUDA to have offset decreasing for better numerics
    matching Triton"); "up": offsets 1, 2, 4, 8, 16 (older releases, and ROCm)."""
    p = p.copy()
    dim_x = p.shape[-1]
    if dim_x > WARP:
        off = dim_x // 2
        while off >= WARP:
            p[..., :off] = p[..., :off] + p[..., off:2 * off]
            off //= 2
        dim_x = WARP
    if warp_order == "down":
        off = dim_x // 2
        while off > 0:      # lane x += lane x + off (lanes past the warp keep their own value)
            p[..., :off] = p[..., :off] + p[..., off:2 * off]
            off //= 2
    else:
        off = 1
        while off < dim_x:
            p[..., :dim_x - off] = p[..., :dim_x - off] + p[..., off:dim_x]
            off *= 2
    return p[..., 0]


def _reduce_partials(P, cfg):
    """P: [R, C, Y, bw] per-thread values -> [R] row sums (block y, block x, global)."""
    R, C, Y, bw = P.shape
    wo = cfg.get("warp_order", "down")
    if cfg["input_mult"][1] and cfg.get("block_order", "xy") == "xy":
        # block_x_reduce first (each warp-row y reduces its lanes), then block_y_reduce over
        # the lane-0 values of the warp-rows
        part = _block_y_tree(_block_x_tree(P, wo)[..., None])[..., 0]     # [R, C]
    else:
        if cfg["input_mult"][1]:
            P = _block_y_tree(P)                # [R, C, bw]
        else:
            P = P[:, :, 0, :]
        part = _block_x_tree(P, wo)             # [R, C]
    if C == 1:
        return part[:, 0]
    # global_reduce: last block, thread t = x + y*bw accumulates partials t, t+T, ... from 0
    bh = cfg["block_height"]
    T = bw * bh
    val = np.zeros((R, T), F32)
    for j in range(0, C, T):
        chunk = part[:, j:j + T]
        val[:, :chunk.shape[1]] += chunk
    val = val.reshape(R, bh, bw)
    return _block_x_tree(_block_y_tree(val), wo)


def eager_mean_sq(x, rows_total=None, row_ids=None, cfg=None, num_mp=132,
                  max_threads_per_mp=2048, return_sum=False):
    """(a) h.pow(2).mean(-1, keepdim=True) for float32 h, as ATen's CUDA reduce kernel does it.

    x: float32 [R, cols] (rows row_ids of a contiguous [rows_total, cols] tensor whose storage
    starts 16-byte aligned).  Returns float32 [R]."""
    x = np.ascontiguousarray(x, dtype=F32)
    R, cols = x.shape
    rows_total = R if rows_total is None else rows_total
    row_ids = np.arange(R) if row_ids is None else np.asarray(row_ids)
    if cfg is None:
        cfg = reduce_config(rows_total, cols, num_mp, max_threads_per_mp)
    sq = x * x                                   # pow(x, 2) == x * x, its own rounding
    sums = np.empty(R, F32)
    if cfg["vectorize"]:
        vs = cfg["input_vec_size"]
        shifts = (row_ids.astype(np.int64) * cols) % vs
        for sh in np.unique(shifts):
            sel = np.nonzero(shifts == sh)[0]
            sums[sel] = _reduce_partials(_vec_partials(sq[sel], cfg, int(sh)), cfg)
    else:
        sums[:] = _reduce_partials(_strided_partials(sq, cfg), cfg)
    # MeanOps::project: a * factor, factor = float(num_outputs) / numel (float division)
    factor = F32(rows_total) / F32(rows_total * cols)
    out = sums * factor
    return (out, sums) if return_sum else out


# ------------------------------------------------------------ canonical 256-lane order (CRR)
def crr_sum(v):
    """docs/reference-semantics.md CRR of a sum: lane t owns i with (i % 2048) // 8 == t, each lane
    sums in increasing i, then state[t] += state[t + s] for s = 128 .. 1."""
    R, cols = v.shape
    C = cdiv(cols, 2048)
    buf = np.zeros((R, C * 2048), F32)
    buf[:, :cols] = v
    buf = buf.reshape(R, C, 256, 8)
    acc = np.zeros((R, 256), F32)
    for c in range(C):
        for j in range(8):
            acc += buf[:, c, :, j]
    s = 128
    while s >= 1:
        acc[:, :s] = acc[:, :s] + acc[:, s:2 * s]
        s //= 2
    return acc[:, 0]


def crr_mean_sq(x):
    x = np.ascontiguousarray(x, dtype=F32)
    return crr_sum(x * x) * (F32(1) / F32(x.shape[1]))


def crr_welford(x):
    """CRR Welford of docs/reference-semantics.md -> (mean, var) per row."""
    R, cols = x.shape
    C = cdiv(cols, 2048)
    buf = np.zeros((R, C * 2048), F32)
    buf[:, :cols] = x
    buf = buf.reshape(R, C, 256, 8)
    valid = (np.arange(C * 2048) < cols).reshape(C, 256, 8)
    n = np.zeros((R, 256), F32)
    mean = np.zeros((R, 256), F32)
    m2 = np.zeros((R, 256), F32)
    for c in range(C):
        for j in range(8):
            val = buf[:, c, :, j]
            ok = valid[c, :, j]
            nn = n + F32(1)
            d = val - mean
            nm = mean + d / nn
            nm2 = fma32(d, val - nm, m2)
            if ok.all():
                n, mean, m2 = nn, nm, nm2
            else:
                n, mean, m2 = np.where(ok, nn, n), np.where(ok, nm, mean), np.where(ok, nm2, m2)
    s = 128
    while s >= 1:
        An, Am, A2 = n[:, :s], mean[:, :s], m2[:, :s]
        Bn, Bm, B2 = n[:, s:2 * s], mean[:, s:2 * s], m2[:, s:2 * s]
        cnt = An + Bn
        pos = cnt != 0
        coef = F32(1) / np.where(pos, cnt, F32(1))
        nA, nB = An * coef, Bn * coef
        delta = Bm - Am
        nmean = fma32(nA, Am, nB * Bm)
        nm2 = fma32((delta * delta) * An, nB, A2 + B2)
        n = n.copy(); mean = mean.copy(); m2 = m2.copy()
        n[:, :s] = cnt
        mean[:, :s] = np.where(pos, nmean, F32(0))
        m2[:, :s] = np.where(pos, nm2, F32(0))
        s //= 2
    return mean[:, 0], m2[:, 0] / n[:, 0]


# -------------------------------------------------------- (b)/(c) layer_norm_kernel.cu paths
LN_MAIN = dict(online_mean="fma", online_m2="fma", comb_mean="fmaA", comb_m2="fma",
               rw_mean="fma", rw_m2="fma", rms_acc="fma", rms_arg="fma")
# single-knob alternatives tried (and reported) only where LN_MAIN does not match eager
LN_VARIANTS = {
    "online_mean=div": dict(online_mean="div"),
    "online_mean=mul_add": dict(online_mean="mul_add"),
    "comb_mean=fmaB": dict(comb_mean="fmaB"),
    "comb_mean=mul_add": dict(comb_mean="mul_add"),
    "comb_m2=mul_add": dict(comb_m2="mul_add"),
    "rw_mean=mul_add": dict(rw_mean="mul_add"),
    "rw_m2=mul_add": dict(rw_m2="mul_add"),
    "rms_acc=mul_add": dict(rms_acc="mul_add"),
    "rms_arg=mul_add": dict(rms_arg="mul_add"),
}


def ln_path(cols):
    """layer_norm_kernel.cu LayerNormKernelImplInternal: the vectorized kernel needs N % 4 == 0,
    N <= 2^24 and 16-byte (f32) / 8-byte (bf16, f16) aligned X, Y, gamma, beta (fresh tensors)."""
    return "vectorized" if (cols % 4 == 0 and cols <= (1 << 24)) else "rowwise"


def _ln_combine(B, A, f, rms):
    """cuWelfordCombine(dataB, dataA), called as cuWelfordCombine(own, other): B = the lower
    lane/warp (own), A = the higher one (shuffled down / read from shared memory)."""
    Bm, Bs, Bc = B
    Am, As, Ac = A
    if rms:
        return Bm, Bs + As, Bc
    delta = Bm - Am
    count = Ac + Bc
    pos = count > 0
    coef = F32(1) / np.where(pos, count, F32(1))
    nA, nB = Ac * coef, Bc * coef
    if f["comb_mean"] == "fmaA":
        mean = fma32(nA, Am, nB * Bm)
    elif f["comb_mean"] == "fmaB":
        mean = fma32(nB, Bm, nA * Am)
    else:
        mean = nA * Am + nB * Bm
    s2sum = As + Bs
    t = (delta * delta) * Ac
    s2 = fma32(t, nB, s2sum) if f["comb_m2"] == "fma" else s2sum + t * nB
    return np.where(pos, mean, F32(0)), np.where(pos, s2, F32(0)), count


def ln_vectorized_stats(x, rms=False, flags=None):
    """vectorized_layer_norm_kernel compute_stats: 128 threads (32 x 4), thread t reads the
    4-vectors t, t+128, ... and folds their elements in order into its WelfordDataLN; warp
    reduce with shfl_down offsets 16..1, then warps 2,3 -> 0,1 and 1 -> 0 through shared memory.
    Returns (mean, var) with var = sigma2 / float(N) (a division, not a multiply by 1/N); the
    kernel then takes rsqrt(var + eps).  With rms=True, mean is 0 and sigma2 = sum of x*x."""
    f = dict(LN_MAIN, **(flags or {}))
    x = np.ascontiguousarray(x, dtype=F32)
    R, N = x.shape
    nv = N // 4
    T = 128
    K = cdiv(nv, T)
    buf = np.zeros((R, K * T * 4), F32)
    buf[:, :nv * 4] = x[:, :nv * 4]
    buf = buf.reshape(R, K, T, 4)
    valid = (np.arange(K * T) < nv).reshape(K, T)
    mean = np.zeros((R, T), F32)
    s2 = np.zeros((R, T), F32)
    cnt = np.zeros((R, T), F32)
    for k in range(K):
        ok = valid[k]
        for ii in range(4):
            val = buf[:, k, :, ii]
            if rms:
                ns2 = fma32(val, val, s2) if f["rms_acc"] == "fma" else s2 + val * val
                s2 = ns2 if ok.all() else np.where(ok, ns2, s2)
                continue
            delta = val - mean
            nc = cnt + F32(1)
            if f["online_mean"] == "fma":
                nm = fma32(delta, F32(1) / nc, mean)
            elif f["online_mean"] == "mul_add":
                nm = mean + delta * (F32(1) / nc)
            else:
                nm = mean + delta / nc
            ns2 = fma32(delta, val - nm, s2) if f["online_m2"] == "fma" else s2 + delta * (val - nm)
            if ok.all():
                mean, s2, cnt = nm, ns2, nc
            else:
                mean, s2, cnt = np.where(ok, nm, mean), np.where(ok, ns2, s2), np.where(ok, nc, cnt)
    # [R, y=4, x=32]
    st = [a.reshape(R, 4, WARP).copy() for a in (mean, s2, cnt)]
    off = WARP // 2
    while off > 0:
        B = tuple(a[..., :off] for a in st)
        A = tuple(a[..., off:2 * off] for a in st)
        res = _ln_combine(B, A, f, rms)
        for a, r in zip(st, res):
            a[..., :off] = r
        off //= 2
    w = [a[..., 0].copy() for a in st]           # [R, 4] per-warp results (lane 0)
    off = 2
    while off > 0:
        B = tuple(a[:, :off] for a in w)
        A = tuple(a[:, off:2 * off] for a in w)
        res = _ln_combine(B, A, f, rms)
        for a, r in zip(w, res):
            a[:, :off] = r
        off //= 2
    return w[0][:, 0], w[1][:, 0] / F32(N)


def _w_combine(a, b, f):
    """WelfordOps::combine(a, b) (SharedReduceOps.h), nvcc contracting mul+add into fma."""
    am, a2, an = a
    bm, b2, bn = b
    delta = bm - am
    nc = an + bn
    nb = bn / np.where(nc == 0, F32(1), nc)
    mean = fma32(delta, nb, am) if f["rw_mean"] == "fma" else am + delta * nb
    t = (delta * delta) * an
    m2 = fma32(t, nb, a2 + b2) if f["rw_m2"] == "fma" else (a2 + b2) + t * nb
    az, bz = an == 0, bn == 0
    return (np.where(az, bm, np.where(bz, am, mean)), np.where(az, b2, np.where(bz, a2, m2)),
            np.where(az, bn, np.where(bz, an, nc)))


def ln_rowwise_stats(x, flags=None):
    """RowwiseMomentsCUDAKernel: 512 threads, thread j folds elements j, j+512, ... with
    WelfordOps::reduce; BlockReduce = WarpReduce (shfl_down 16..1, combine(own, other)) per warp,
    then warp 0 reduces the 16 warp results (lanes >= 16 hold the identity).
    Returns (mean, var) = WelfordOps::project with correction 0."""
    f = dict(LN_MAIN, **(flags or {}))
    x = np.ascontiguousarray(x, dtype=F32)
    R, N = x.shape
    T = 512
    K = cdiv(N, T)
    buf = np.zeros((R, K * T), F32)
    buf[:, :N] = x
    buf = buf.reshape(R, K, T)
    valid = (np.arange(K * T) < N).reshape(K, T)
    mean = np.zeros((R, T), F32)
    m2 = np.zeros((R, T), F32)
    nf = np.zeros((R, T), F32)
    for k in range(K):
        ok = valid[k]
        val = buf[:, k]
        new_nf = nf + F32(1)            # float(n + 1), n an int64 count: exact here
        delta = val - mean
        nm = mean + delta / new_nf
        nm2 = fma32(delta, val - nm, m2) if f["rw_m2"] == "fma" else m2 + delta * (val - nm)
        if ok.all():
            mean, m2, nf = nm, nm2, new_nf
        else:
            mean, m2, nf = np.where(ok, nm, mean), np.where(ok, nm2, m2), np.where(ok, new_nf, nf)
    st = [a.reshape(R, 16, WARP).copy() for a in (mean, m2, nf)]
    off = WARP // 2
    while off > 0:
        res = _w_combine(tuple(a[..., :off] for a in st), tuple(a[..., off:2 * off] for a in st), f)
        for a, r in zip(st, res):
            a[..., :off] = r
        off //= 2
    w = [a[..., 0].copy() for a in st]           # [R, 16]; lanes 16..31 of warp 0 = identity
    off = 8
    while off > 0:
        res = _w_combine(tuple(a[:, :off] for a in w), tuple(a[:, off:2 * off] for a in w), f)
        for a, r in zip(w, res):
            a[:, :off] = r
        off //= 2
    m, v2, n = (a[:, 0] for a in w)
    return m, v2 / n


def eager_layer_norm(x, w, b, eps=LN_EPS, rsqrt=rsqrt_cpu, flags=None, out_round=None):
    """(b) aten.native_layer_norm on CUDA.  x float32 [R, N] (bf16 inputs: their float values);
    w, b float32 [N].  Returns (y float32 (rounded with out_round for bf16), mean, rstd, path)."""
    x = np.ascontiguousarray(x, dtype=F32)
    path = ln_path(x.shape[1])
    if path == "vectorized":
        mean, var = ln_vectorized_stats(x, rms=False, flags=flags)
    else:
        mean, var = ln_rowwise_stats(x, flags=flags)
    rstd = rsqrt(var + F32(eps))
    rstd = np.asarray(rstd, F32)
    if path == "vectorized":   # gamma * (rstd * (x - mean)) + beta
        y = fma32(w[None, :], rstd[:, None] * (x - mean[:, None]), b[None, :])
    else:                      # (x - mean) * rstd * gamma + beta
        y = fma32((x - mean[:, None]) * rstd[:, None], w[None, :], b[None, :])
    if out_round is not None:
        y = out_round(y)
    return y, mean, rstd, path


def eager_rms_norm(x, w, eps=RMS_EPS, rsqrt=rsqrt_cpu, flags=None, out_round=None):
    """(c) F.rms_norm -> aten._fused_rms_norm on CUDA (same input/weight dtype)."""
    f = dict(LN_MAIN, **(flags or {}))
    x = np.ascontiguousarray(x, dtype=F32)
    path = ln_path(x.shape[1])
    if path == "vectorized":
        _, var = ln_vectorized_stats(x, rms=True, flags=flags)
        arg = var + F32(eps)                       # rsqrt(sigma2 / N + eps)
    else:
        mean, var = ln_rowwise_stats(x, flags=flags)
        # rsqrt(m2 + m1 * m1 + eps): var + mean^2 (contracted) + eps
        arg = (fma32(mean, mean, var) if f["rms_arg"] == "fma" else var + mean * mean) + F32(eps)
    rstd = np.asarray(rsqrt(arg), F32)
    if path == "vectorized":   # gamma * (rstd * x)
        y = w[None, :] * (rstd[:, None] * x)
    else:                      # x * rstd * gamma
        y = (x * rstd[:, None]) * w[None, :]
    if out_round is not None:
        y = out_round(y)
    return y, rstd, path


def crr_layer_norm(x, w, b, eps=LN_EPS, rsqrt=rsqrt_cpu, out_round=None):
    mean, var = crr_welford(np.ascontiguousarray(x, dtype=F32))
    rstd = np.asarray(rsqrt(var + F32(eps)), F32)
    y = fma32((x - mean[:, None]) * rstd[:, None], w[None, :], b[None, :])
    return (out_round(y) if out_round else y), mean, rstd


def crr_rms_norm(x, w, eps=RMS_EPS, rsqrt=rsqrt_cpu, out_round=None):
    """reference-semantics rms_norm (torch): r = rsqrt(sum * (1/N) + eps); y = (h * r) * w."""
    var = crr_mean_sq(x)
    rstd = np.asarray(rsqrt(var + F32(eps)), F32)
    y = (x * rstd[:, None]) * w[None, :]
    return (out_round(y) if out_round else y), rstd


# ------------------------------------------------------------------------------- comparisons
def bits(a):
    return np.ascontiguousarray(a, dtype=F32).view(np.uint32)


def rows_differ(a, b):
    a = np.asarray(a, F32)
    b = np.asarray(b, F32)
    if a.ndim == 1:
        return int(np.count_nonzero(bits(a) != bits(b)))
    return int(np.count_nonzero((bits(a) != bits(b)).any(axis=1)))


def max_ulp(a, b, bf16=False):
    """Largest distance in ulps (of float32, or of bfloat16 for bf16-rounded values)."""
    d = ulp_diff(a, b)
    if bf16:
        d = d // 65536      # both are bf16 values: f32 bit patterns differ by multiples of 2^16
    return int(d.max()) if d.size else 0


def pick_rows(rows, cols, budget):
    n = max(8, budget // cols)
    if n >= rows:
        return np.arange(rows)
    return np.unique(np.linspace(0, rows - 1, n).round().astype(np.int64))


def shapes():
    out = []
    for c in COLS:
        for r in ROWS:
            if r * c <= MAX_ELEMS:
                out.append((r, c))
    return out


class Runner:
    def __init__(self, out_dir, quick=False, max_seconds=170.0, dump=False):
        self.out_dir = out_dir
        self.dump = dump
        self.quick = quick
        self.deadline = time.time() + max_seconds
        self.results = []
        self.errors = []
        self.diag_count = {}
        self.split_dump = {}
        self.meta = {}
        try:
            import torch
            self.torch = torch
            self.cuda = torch.cuda.is_available()
        except Exception:               # noqa: BLE001 - no torch: emulator smoke test only
            self.torch = None
            self.cuda = False
        if self.cuda:
            t = self.torch
            props = t.cuda.get_device_properties(0)
            self.num_mp = props.multi_processor_count
            self.max_thr = getattr(props, "max_threads_per_multi_processor", 2048)
            self.meta = dict(torch=t.__version__, cuda=t.version.cuda, device=props.name,
                             num_mp=self.num_mp, max_threads_per_mp=self.max_thr,
                             has_fused_rms_norm=hasattr(t, "_fused_rms_norm"))
        else:
            self.num_mp, self.max_thr = 132, 2048
            self.meta = dict(torch=None if self.torch is None else self.torch.__version__,
                             device="cpu-only (no comparison)", num_mp=132,
                             max_threads_per_mp=2048)

    # -- device helpers
    def rsqrt(self, v):
        if not self.cuda:
            return rsqrt_cpu(v)
        t = self.torch
        return t.rsqrt(t.from_numpy(np.ascontiguousarray(v, dtype=F32)).cuda()).cpu().numpy()

    def gen(self, rows, cols, salt):
        seed = (SEED * 1000003 + rows * 7919 + cols * 131 + salt) % (2 ** 63)
        if self.cuda:
            t = self.torch
            g = t.Generator(device="cuda").manual_seed(seed)
            return g
        return np.random.default_rng(seed)

    def randn(self, g, *shape):
        if self.cuda:
            return self.torch.randn(*shape, generator=g, device="cuda", dtype=self.torch.float32)
        return g.standard_normal(shape, dtype=F32)

    def to_np(self, a):
        if self.cuda:
            return a.float().cpu().numpy()
        return np.asarray(a, F32)

    def want_diag(self, op, n_elems):
        if n_elems > DIAG_MAX_ELEMS or self.diag_count.get(op, 0) >= DIAG_MAX_PER_OP:
            return False
        self.diag_count[op] = self.diag_count.get(op, 0) + 1
        return True

    def time_left(self):
        return self.deadline - time.time()

    def save(self):
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, "eager_order.json"), "w") as fh:
            json.dump(dict(meta=self.meta, results=self.results, errors=self.errors), fh, indent=1)

    # -- (a)
    def run_mean(self, rows, cols, label="grid", bf16_origin=False, budget=BUDGET_A):
        t = self.torch
        g = self.gen(rows, cols, 1 if not bf16_origin else 2)
        x = self.randn(g, rows, cols)
        if bf16_origin:
            if self.cuda:
                x = x.to(t.bfloat16).to(t.float32)     # h = x.to(torch.float32) of bf16 x
            else:
                x = round_bf16(x)
        ids = pick_rows(rows, cols, budget)
        cfg = reduce_config(rows, cols, self.num_mp, self.max_thr)
        if self.cuda:
            eager = x.pow(2).mean(-1, keepdim=True).view(-1)[t.from_numpy(ids).cuda()]
            eager = eager.cpu().numpy()
            xs = x[t.from_numpy(ids).cuda()].cpu().numpy()
        else:
            xs = x[ids]
            eager = None
        emu = eager_mean_sq(xs, rows, ids, cfg)
        crr = crr_mean_sq(xs)
        hyp = None
        if eager is not None and cfg["input_mult"][1]:
            # split-across-warps: evaluate candidate combine orders on (up to) 256 rows
            k = min(len(ids), 256)
            hyp = {}
            for order in ("yx", "xy"):
                for bw_try in (512, 256, 128, 64, 32):
                    c2 = dict(cfg, block_order=order, block_width=bw_try, block_height=512 // bw_try,
                              input_mult=[1, bw_try, 0], step_input=512, ctas_per_output=1)
                    hyp[f"{order}_{bw_try}x{512 // bw_try}"] = rows_differ(
                        eager_mean_sq(xs[:k], rows, ids[:k], c2), eager[:k])
            hyp["rows"] = k
            key = f"{rows}x{cols}"
            if self.dump and (rows, cols) in DUMP_SPLIT and not bf16_origin:
                n = DUMP_SPLIT[(rows, cols)]
                self.split_dump[f"x_{key}"] = xs[:n]
                self.split_dump[f"eager_{key}"] = eager[:n]
                self.split_dump[f"ids_{key}"] = ids[:n]
                os.makedirs(self.out_dir, exist_ok=True)
                np.savez(os.path.join(self.out_dir, "raw_split.npz"), **self.split_dump)
        r = dict(op="mean_sq", dtype="f32" + ("(bf16 origin)" if bf16_origin else ""), label=label,
                 input="normal", rows=rows, cols=cols, rows_checked=int(len(ids)),
                 config=cfg)
        if hyp is not None:
            r["split_hypotheses_rows_differ"] = hyp
        if eager is not None:
            r.update(emu_rows_differ=rows_differ(emu, eager), emu_max_ulp=max_ulp(emu, eager),
                     crr_rows_differ=rows_differ(crr, eager), crr_max_ulp=max_ulp(crr, eager))
            if r["emu_rows_differ"] and self.want_diag("mean_sq", len(ids) * cols):
                # diagnostics: the same order with another config (what would fit instead?)
                alt = {}
                for name, kw in (("no_vectorize", dict(vt0=4, input_vec_size=8)),
                                 ("vec8_vt0_8", dict(vt0=8, input_vec_size=8))):
                    c2 = reduce_config(rows, cols, self.num_mp, self.max_thr, **kw)
                    alt[name] = rows_differ(eager_mean_sq(xs, rows, ids, c2), eager)
                c2 = dict(cfg, warp_order="up")
                alt["warp_order_up"] = rows_differ(eager_mean_sq(xs, rows, ids, c2), eager)
                for bw_try in (32, 64, 128, 256, 512):
                    for split in (False, True):
                        c2 = dict(cfg)
                        c2["block_width"] = bw_try
                        if split:
                            c2["block_height"] = 512 // bw_try
                            c2["input_mult"] = [1, bw_try, 0]
                        else:
                            c2["input_mult"] = [1, 0, 0]
                        C, Y, bw = _threads_shape(c2)
                        c2["step_input"] = C * Y * bw
                        try:
                            alt[f"bw{bw_try}{'_ysplit' if split else ''}"] = rows_differ(
                                eager_mean_sq(xs, rows, ids, c2), eager)
                        except Exception as e:  # noqa: BLE001
                            alt[f"bw{bw_try}"] = repr(e)
                r["alt_configs_rows_differ"] = alt
        self.results.append(r)
        return r

    # -- (b)
    def run_ln(self, rows, cols, dist, dtype="f32", budget=BUDGET_BC):
        t = self.torch
        g = self.gen(rows, cols, 3 if dist == "normal" else 4)
        x = self.randn(g, rows, cols)
        w = 1 + 0.2 * self.randn(g, cols)
        b = 0.2 * self.randn(g, cols)
        if dist == "mean_offset":
            x = x + 1000.0
        ids = pick_rows(rows, cols, budget)
        rnd = None
        if dtype == "bf16":
            rnd = round_bf16
            if self.cuda:
                x, w, b = (a.to(t.bfloat16) for a in (x, w, b))
            else:
                x, w, b = (round_bf16(a) for a in (x, w, b))
        if self.cuda:
            y, mean, rstd = t.native_layer_norm(x, [cols], w, b, LN_EPS)
            idt = t.from_numpy(ids).cuda()
            ey, em, er = (self.to_np(a.reshape(rows, -1)[idt]) for a in (y, mean, rstd))
            em, er = em[:, 0], er[:, 0]
            xs = self.to_np(x[idt])
            wn, bn = self.to_np(w), self.to_np(b)
        else:
            xs, wn, bn = x[ids], w, b
        py, pm, pr, path = eager_layer_norm(xs, wn, bn, LN_EPS, self.rsqrt, out_round=rnd)
        cy, cm, cr = crr_layer_norm(xs, wn, bn, LN_EPS, self.rsqrt, out_round=rnd)
        r = dict(op="layer_norm", dtype=dtype, input=dist, rows=rows, cols=cols, path=path,
                 rows_checked=int(len(ids)))
        if self.cuda:
            r.update(emu_mean_rows_differ=rows_differ(pm, em), emu_rstd_rows_differ=rows_differ(pr, er),
                     emu_out_rows_differ=rows_differ(py, ey),
                     emu_out_max_ulp=max_ulp(py, ey, rnd is not None),
                     crr_mean_rows_differ=rows_differ(cm, em), crr_rstd_rows_differ=rows_differ(cr, er),
                     crr_out_rows_differ=rows_differ(cy, ey),
                     crr_out_max_ulp=max_ulp(cy, ey, rnd is not None))
            if ((r["emu_mean_rows_differ"] or r["emu_rstd_rows_differ"] or r["emu_out_rows_differ"])
                    and self.want_diag("layer_norm", len(ids) * cols)):
                var = {}
                for name, fl in LN_VARIANTS.items():
                    vy, vm, vr, _ = eager_layer_norm(xs, wn, bn, LN_EPS, self.rsqrt, flags=fl,
                                                     out_round=rnd)
                    var[name] = [rows_differ(vm, em), rows_differ(vr, er), rows_differ(vy, ey)]
                r["variants_mean_rstd_out_rows_differ"] = var
        self.results.append(r)
        return r

    # -- (c)
    def run_rms(self, rows, cols, dtype="f32", budget=BUDGET_BC):
        t = self.torch
        g = self.gen(rows, cols, 5)
        x = self.randn(g, rows, cols)
        w = 1 + 0.2 * self.randn(g, cols)
        ids = pick_rows(rows, cols, budget)
        rnd = None
        if dtype == "bf16":
            rnd = round_bf16
            if self.cuda:
                x, w = x.to(t.bfloat16), w.to(t.bfloat16)
            else:
                x, w = round_bf16(x), round_bf16(w)
        r = dict(op="rms_norm", dtype=dtype, input="normal", rows=rows, cols=cols,
                 rows_checked=int(len(ids)))
        if self.cuda:
            import torch.nn.functional as Fn
            idt = t.from_numpy(ids).cuda()
            yf = Fn.rms_norm(x, (cols,), w, RMS_EPS)
            if hasattr(t, "_fused_rms_norm"):
                y, rstd = t._fused_rms_norm(x, [cols], w, RMS_EPS)
                er = self.to_np(rstd.reshape(rows)[idt])
                r["F.rms_norm_equals_fused"] = bool(t.equal(y, yf))
            else:
                y, er = yf, None
            ey = self.to_np(y[idt])
            xs = self.to_np(x[idt])
            wn = self.to_np(w)
        else:
            xs, wn, er, ey = x[ids], w, None, None
        py, pr, path = eager_rms_norm(xs, wn, RMS_EPS, self.rsqrt, out_round=rnd)
        cy, cr = crr_rms_norm(xs, wn, RMS_EPS, self.rsqrt, out_round=rnd)
        r["path"] = path
        if self.cuda:
            r.update(emu_out_rows_differ=rows_differ(py, ey),
                     emu_out_max_ulp=max_ulp(py, ey, rnd is not None),
                     crr_out_rows_differ=rows_differ(cy, ey),
                     crr_out_max_ulp=max_ulp(cy, ey, rnd is not None))
            if er is not None:
                r.update(emu_rstd_rows_differ=rows_differ(pr, er), crr_rstd_rows_differ=rows_differ(cr, er))
            if ((r["emu_out_rows_differ"] or r.get("emu_rstd_rows_differ"))
                    and self.want_diag("rms_norm", len(ids) * cols)):
                var = {}
                for name, fl in LN_VARIANTS.items():
                    if not name.startswith(("rms_", "rw_")):
                        continue
                    vy, vr, _ = eager_rms_norm(xs, wn, RMS_EPS, self.rsqrt, flags=fl, out_round=rnd)
                    var[name] = [rows_differ(vr, er) if er is not None else None, rows_differ(vy, ey)]
                r["variants_rstd_out_rows_differ"] = var
        self.results.append(r)
        return r

    def guarded(self, fn, *args, **kw):
        if self.time_left() < 0:
            self.errors.append(dict(skipped=fn.__name__, args=list(args), why="time budget"))
            return None
        t0 = time.time()
        try:
            r = fn(*args, **kw)
            r["seconds"] = round(time.time() - t0, 3)
            return r
        except Exception as e:  # noqa: BLE001 - keep going, record it
            import traceback
            self.errors.append(dict(fn=fn.__name__, args=list(args), error=repr(e),
                                    trace=traceback.format_exc()[-2000:]))
            print(f"ERROR {fn.__name__}{args}: {e!r}", flush=True)
            return None
        finally:
            self.save()


def fmt_cnt(r, key, n_key="rows_checked"):
    if key not in r or r[key] is None:
        return "-"
    return f"{r[key]}/{r[n_key]}"


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default="/tmp/eager_order")
    ap.add_argument("--quick", action="store_true", help="a handful of shapes only")
    ap.add_argument("--dump", action="store_true",
                    help="also save inputs/eager results of split-across-warps shapes (raw_split.npz)")
    ap.add_argument("--max-seconds", type=float, default=170.0,
                    help="stop starting new checks after this long (results so far are kept)")
    a = ap.parse_args(argv[1:])
    out_dir, quick, max_s = a.out_dir, a.quick, a.max_seconds
    run = Runner(out_dir, quick=quick, max_seconds=max_s, dump=a.dump)
    print("meta:", json.dumps(run.meta), flush=True)
    grid = shapes()
    if quick:
        grid = [(r, c) for (r, c) in grid if (r, c) in {(7, 127), (33, 1000), (3, 1001), (64, 4096),
                                                       (2, 65536), (1024, 4096), (1, 8192)}]
    # (a) model-relevant first, then the grid
    print("\n(a) h.pow(2).mean(-1, keepdim=True), float32.  rows differing / rows checked "
          "(emulator | canonical 256-lane order)", flush=True)
    hdr = f"{'rows':>5} {'cols':>6} {'emu':>10} {'emu_ulp':>7} {'crr':>10} {'crr_ulp':>7}  config"
    print(hdr, flush=True)
    for rows, cols, bfo, label in [(512, 256, False, "model"), (512, 384, False, "model"),
                                   (512, 256, True, "model"), (512, 384, True, "model")]:
        r = run.guarded(run.run_mean, rows, cols, label=label, bf16_origin=bfo)
        if r:
            print(f"{rows:>5} {cols:>6} {fmt_cnt(r, 'emu_rows_differ'):>10} {r.get('emu_max_ulp', '-'):>7} "
                  f"{fmt_cnt(r, 'crr_rows_differ'):>10} {r.get('crr_max_ulp', '-'):>7}  "
                  f"{config_str(r['config'])}  [{label}{' bf16->f32' if bfo else ''}]", flush=True)
    for rows, cols in grid:
        r = run.guarded(run.run_mean, rows, cols)
        if r:
            extra = f" alt={r['alt_configs_rows_differ']}" if "alt_configs_rows_differ" in r else ""
            if "split_hypotheses_rows_differ" in r:
                extra += " hyp=" + json.dumps(r["split_hypotheses_rows_differ"], separators=(",", ":"))
            print(f"{rows:>5} {cols:>6} {fmt_cnt(r, 'emu_rows_differ'):>10} {r.get('emu_max_ulp', '-'):>7} "
                  f"{fmt_cnt(r, 'crr_rows_differ'):>10} {r.get('crr_max_ulp', '-'):>7}  "
                  f"{config_str(r['config'])}{extra}", flush=True)
    # (b)
    print("\n(b) aten.native_layer_norm (F.layer_norm).  rows differing / rows checked: "
          "emulator mean, rstd, out | CRR mean, rstd, out (max ulp)", flush=True)
    for dtype, dist in (("f32", "normal"), ("f32", "mean_offset"), ("bf16", "mean_offset")):
        for rows, cols in grid:
            if dtype == "bf16" and rows not in (1, 7, 64, 1024):
                continue
            r = run.guarded(run.run_ln, rows, cols, dist, dtype)
            if r:
                extra = ""
                if "variants_mean_rstd_out_rows_differ" in r:
                    extra = " variants=" + json.dumps(r["variants_mean_rstd_out_rows_differ"])
                print(f"{dtype:>4} {dist:>11} {rows:>5} {cols:>6} {r['path']:>10}  emu "
                      f"{fmt_cnt(r, 'emu_mean_rows_differ')} {fmt_cnt(r, 'emu_rstd_rows_differ')} "
                      f"{fmt_cnt(r, 'emu_out_rows_differ')} ({r.get('emu_out_max_ulp', '-')})  crr "
                      f"{fmt_cnt(r, 'crr_mean_rows_differ')} {fmt_cnt(r, 'crr_rstd_rows_differ')} "
                      f"{fmt_cnt(r, 'crr_out_rows_differ')} ({r.get('crr_out_max_ulp', '-')}){extra}",
                      flush=True)
    # (c)
    print("\n(c) F.rms_norm (aten._fused_rms_norm).  rows differing / rows checked: emulator rstd, "
          "out | CRR rstd, out (max ulp)", flush=True)
    for dtype in ("f32", "bf16"):
        for rows, cols in grid:
            if dtype == "bf16" and rows not in (1, 7, 64, 1024):
                continue
            r = run.guarded(run.run_rms, rows, cols, dtype)
            if r:
                extra = ""
                if "variants_rstd_out_rows_differ" in r:
                    extra = " variants=" + json.dumps(r["variants_rstd_out_rows_differ"])
                print(f"{dtype:>4} {rows:>5} {cols:>6} {r['path']:>10}  emu "
                      f"{fmt_cnt(r, 'emu_rstd_rows_differ')} {fmt_cnt(r, 'emu_out_rows_differ')} "
                      f"({r.get('emu_out_max_ulp', '-')})  crr {fmt_cnt(r, 'crr_rstd_rows_differ')} "
                      f"{fmt_cnt(r, 'crr_out_rows_differ')} ({r.get('crr_out_max_ulp', '-')})"
                      f"{' F.rms_norm!=fused' if r.get('F.rms_norm_equals_fused') is False else ''}"
                      f"{extra}", flush=True)
    run.save()
    print(f"\nwrote {os.path.join(out_dir, 'eager_order.json')}; errors: {len(run.errors)}; "
          f"time left {run.time_left():.0f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv)
