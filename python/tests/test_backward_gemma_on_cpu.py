"""HF GemmaRMSNorm's backward under eager autograd (issue 30, rms_norm_backward semantics `gemma`):
the emulation `kernelize.backward.gemma_rms_norm_backward`, the bundled kernel
kernels/rms_norm_gemma_backward/ and the verifier's reference (reference.cu,
ref_rms_norm_backward_gemma_*), checked on the CPU (docs/backward.md, "Gemma").

1. The chain (which ops, in which dtype, where it rounds) against real torch autograd on the CPU
   with the CPU's own reductions plugged in: dx and dw bit for bit in bf16, f16, f32. Mutations
   that port llama's roundings (dy * (1 + w) rounded to T, dw's summands rounded to T), drop
   the f32 rounding of 1 + w or contract dy * (1 + w) to dy * w + dy are caught.
2. The autograd graph of the module is the documented one (bf16 and f32).
3. The kernel's configs are llama's (its kb_configs block is the same text, which
   test_backward_order_on_cpu checks against backward.py's).
4. The kernel and the reference run on the CPU under cuda_on_cpu/harness.h: r, dx and dw equal
   the emulation bit for bit (every row class, misaligned widths, the warp-row split and the
   global reduce), so the kernel equals the reference there.
5. In f32 gemma's dw is llama's (fl(dy * fl(h * r)) summed in f32 either way): the two
   emulations agree there, and differ in bf16.

What only the GPU can tell (scripts/backward_probe.py --semantics gemma): that eager on CUDA runs
this chain in these orders (the f32 column sum of sum_functor<float>), and CUDA's rsqrtf.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernelize import backward as B  # noqa: E402
from cpu_harness import build_own_main, from_raw, to_raw  # noqa: E402
import test_backward_order_on_cpu as L  # noqa: E402  (llama's harness main, cases and helpers)

F32 = np.float32
DTYPES = ["bf16", "f16", "f32"]
KSRC = REPO / "kernels" / "rms_norm_gemma_backward" / "kernel.cu"
_ndiff = L._ndiff


def _hf_gemma_rms_norm(torch, x, w, eps):
    # transformers' GemmaRMSNorm.forward (Gemma2RMSNorm, Gemma3RMSNorm: the same code)
    def _norm(v):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    output = _norm(x.float())
    output = output * (1.0 + w.float())
    return output.type_as(x)


def _weights(rng_or_gen, cols, torch=None):
    """Gemma's weights sit around 0 (the module multiplies by 1 + w): a spread of 0.2, a few at
    -1 (1 + w = 0) and tiny ones (1 + w rounds in f32)."""
    if torch is not None:
        w = 0.2 * torch.randn(cols, generator=rng_or_gen)
        w[::7] = -1.0
        w[3::11] = 3e-8
        return w
    w = 0.2 * rng_or_gen.standard_normal(cols)
    w[::7] = -1.0
    w[3::11] = 3e-8
    return w


def _cpu_autograd(torch, dt, rows, cols, seed):
    T = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dt]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g).to(T)
    w = _weights(g, cols, torch).to(T)
    dy = torch.randn(rows, cols, generator=g).to(T)
    xr = x.clone().requires_grad_(True)
    wr = w.clone().requires_grad_(True)
    _hf_gemma_rms_norm(torch, xr, wr, 1e-6).backward(dy)
    return T, x, w, dy, xr.grad, wr.grad


def _cpu_pieces(torch):
    """The CPU's own kernels for the pieces whose order (or division) differs from CUDA's; dw's
    column sum is of f32 values, in f32 (llama's sums T values)."""
    p = L._cpu_pieces(torch, torch.float32)
    p["col_sum_fn"] = lambda v: torch.from_numpy(np.ascontiguousarray(v, dtype=F32)).sum(0).numpy()
    return p


@pytest.mark.parametrize("dt", DTYPES)
def test_the_gemma_chain_is_cpu_autograds(dt):
    torch = L._torch()
    for i, (rows, cols) in enumerate(L.CHAIN_SHAPES):
        T, x, w, dy, ex, ew = _cpu_autograd(torch, dt, rows, cols, 200 + i)
        dx, dw = B.gemma_rms_norm_backward(x.float().numpy(), w.float().numpy(), dy.float().numpy(),
                                           1e-6, dt, **_cpu_pieces(torch))
        assert _ndiff(dx, ex.float().numpy()) == 0, (dt, rows, cols, "dx")
        assert _ndiff(dw, ew.float().numpy()) == 0, (dt, rows, cols, "dw")


def _mutant(kind):
    """gemma_rms_norm_backward with one step changed (for the power of the chain test)."""
    def run(x, w, dy, eps, dt, *, mean_sq_fn, rsqrt, row_sum_fn, col_sum_fn, div_n_fn):
        h = np.asarray(x, F32); wv = np.asarray(w, F32); g_out = np.asarray(dy, F32)
        rows, cols = h.shape
        r = rsqrt(np.asarray(mean_sq_fn(h), F32) + F32(eps)).astype(F32)
        rc = r[:, None]
        n = h * rc
        gw = g_out * n
        if kind == "dw summands rounded to T":      # llama's round_T(dy * round_T(n))
            gw = B.round_to(g_out * B.round_to(n, dt), dt)
        dw = B.round_to(col_sum_fn(gw), dt)
        a = F32(1) + wv
        gn = g_out * a[None, :]
        if kind == "gn rounded to T":                # llama's round_T(dy * w)
            gn = B.round_to(gn, dt)
        if kind == "1 + w in f64":                   # the offset weight never rounded to f32
            gn = (g_out.astype(np.float64) * (1.0 + wv.astype(np.float64))[None, :]).astype(F32)
        if kind == "dy * w + dy":                    # the product contracted / distributed
            gn = g_out * wv[None, :] + g_out
        s = np.asarray(row_sum_fn(gn * h), F32)
        ga = (s * F32(-0.5)) * ((r * r) * r)
        gp = np.asarray(div_n_fn(ga, cols), F32)
        return B.round_to(gn * rc + gp[:, None] * (h * F32(2)), dt), dw
    return run


@pytest.mark.parametrize("kind,dt,grad", [("gn rounded to T", "bf16", "dx"),
                                          ("dw summands rounded to T", "bf16", "dw"),
                                          ("1 + w in f64", "f32", "dx"),
                                          ("dy * w + dy", "f32", "dx")])
def test_the_gemma_chain_test_catches_a_changed_step(kind, dt, grad):
    torch = L._torch()
    bad = {"dx": 0, "dw": 0}
    for i, (rows, cols) in enumerate(L.CHAIN_SHAPES):
        T, x, w, dy, ex, ew = _cpu_autograd(torch, dt, rows, cols, 200 + i)
        dx, dw = _mutant(kind)(x.float().numpy(), w.float().numpy(), dy.float().numpy(), 1e-6, dt,
                               **_cpu_pieces(torch))
        bad["dx"] += _ndiff(dx, ex.float().numpy())
        bad["dw"] += _ndiff(dw, ew.float().numpy())
    assert bad[grad] > 0, f"the chain test would not notice '{kind}'"
    assert bad["dx" if grad == "dw" else "dw"] == 0, (kind, bad)


def test_the_gemma_autograd_graph_is_the_documented_one():
    # docs/backward.md, "Gemma": the nodes (the graph does not depend on the device)
    torch = L._torch()

    def names(fn, out):
        if fn is None:
            return out
        out.append(type(fn).__name__)
        for f, _ in fn.next_functions:
            names(f, out)
        return out

    for T, want in [(torch.bfloat16, ["ToCopyBackward0", "MulBackward0", "MulBackward0", "ToCopyBackward0",
                                      "AccumulateGrad", "RsqrtBackward0", "AddBackward0", "MeanBackward1",
                                      "PowBackward0", "ToCopyBackward0", "AccumulateGrad", "AddBackward0",
                                      "ToCopyBackward0", "AccumulateGrad"]),
                    (torch.float32, ["MulBackward0", "MulBackward0", "AccumulateGrad", "RsqrtBackward0",
                                     "AddBackward0", "MeanBackward1", "PowBackward0", "AccumulateGrad",
                                     "AddBackward0", "AccumulateGrad"])]:
        x = torch.randn(2, 8).to(T).requires_grad_(True)
        w = torch.zeros(8, dtype=T, requires_grad=True)
        assert names(_hf_gemma_rms_norm(torch, x, w, 1e-6).grad_fn, []) == want, T


def _block(src: str) -> str:
    m = re.search(r"^// BEGIN kb_configs.*?\n(.*?)^// END kb_configs$", src, re.S | re.M)
    assert m, "a backward kernel lost its BEGIN/END kb_configs block"
    return m.group(1)


def test_the_gemma_kernels_configs_are_llamas():
    # the same Reduce.cuh configurations (row and column sums), which
    # test_backward_order_on_cpu.test_the_kernels_configs_are_backward_pys checks
    assert _block(KSRC.read_text(encoding="utf-8")) == _block(L.KSRC.read_text(encoding="utf-8"))


SOURCES = {
    "kernel": (lambda: KSRC.read_text(encoding="utf-8"), "rms_norm_gemma_bwd_"),
    "reference": (lambda: L.REF_SRC.read_text(encoding="utf-8").split("// Verifier utility")[0],
                  "ref_rms_norm_backward_gemma_"),
}


# The red-team variants of verifier/tests/gpu.rs (gemma_backward/*): each mutation (from, to)
# applied to the kernel's source; the test below holds they are gpu.rs's strings.
GPU_VARIANTS = {
    "gn_rounded": ("template <typename T> KB_DEV float kb_gn(float dy, float w) { return __fmul_rn(dy, __fadd_rn(1.0f, w)); }",
                   "template <typename T> KB_DEV float kb_gn(float dy, float w) { return BT<T>::rnd(__fmul_rn(dy, __fadd_rn(1.0f, w))); }"),
    "dw_terms_rounded": ("template <typename T> KB_DEV float kb_dwt(float dy, float h, float r) { return __fmul_rn(dy, __fmul_rn(h, r)); }",
                         "template <typename T> KB_DEV float kb_dwt(float dy, float h, float r) { return BT<T>::rnd(__fmul_rn(dy, BT<T>::rnd(__fmul_rn(h, r)))); }"),
}


def _source(which: str) -> tuple[str, str]:
    if which in GPU_VARIANTS:
        src = KSRC.read_text(encoding="utf-8")
        a, b = GPU_VARIANTS[which]
        assert src.count(a) == 1, which
        return src.replace(a, b), SOURCES["kernel"][1]
    read, prefix = SOURCES[which]
    return read(), prefix


@lru_cache(maxsize=4)
def _runner(which: str) -> Path:
    src, prefix = _source(which)
    return build_own_main("bwg-", L.MAIN.replace("%P%", prefix), src)


def _run_cases(which, cases, seed):
    exe = _runner(which)
    d = Path(tempfile.mkdtemp(prefix="kz-bwg-cases-"))
    rng = np.random.default_rng(seed)
    jobs, meta = [], []
    for i, (rows, cols, sms, gdx, gdw) in enumerate(cases):
        for dt in DTYPES:
            x = B.round_to(rng.standard_normal((rows, cols)), dt)
            dy = B.round_to(rng.standard_normal((rows, cols)), dt)
            w = B.round_to(_weights(rng, cols), dt)
            fin = d / f"in{i}{dt}"
            fin.write_bytes(to_raw(x, dt) + to_raw(dy, dt) + to_raw(w, dt))
            ctas = B.col_config(rows, cols, num_sms=sms)["ctas"]
            jobs.append(f"{dt} {rows} {cols} 1e-6 {sms} {ctas} {gdx} {gdw} {fin} {d / f'out{i}{dt}'}")
            meta.append((i, dt, rows, cols, sms, x, dy, w))
    (d / "jobs").write_text("\n".join(jobs) + "\n", encoding="utf-8")
    r = subprocess.run([str(exe), str(d / "jobs")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    out = []
    for i, dt, rows, cols, sms, x, dy, w in meta:
        raw = (d / f"out{i}{dt}").read_bytes()
        es = 4 if dt == "f32" else 2
        kdx = from_raw(raw[:es * rows * cols], dt).reshape(rows, cols)
        kdw = from_raw(raw[es * rows * cols:es * (rows * cols + cols)], dt)
        kr = np.frombuffer(raw[es * (rows * cols + cols):], F32)
        out.append(((dt, rows, cols, sms, x, dy, w), (kr, kdx, kdw)))
    return out


@pytest.mark.parametrize("which", ["kernel", "reference"])
def test_the_gemma_kernels_on_the_cpu_equal_the_emulation(which):
    # the bundled kernel's entries, and the verifier's reference (what a candidate is measured
    # against): each equal to the emulation, so to each other
    bad = []
    for (dt, rows, cols, sms, x, dy, w), (kr, kdx, kdw) in _run_cases(which, L.KERNEL_CASES, 20261129):
        edx, edw, parts = B.gemma_rms_norm_backward(x, w, dy, 1e-6, dt, rsqrt=L._harness_rsqrt,
                                                    num_sms=sms, return_parts=True)
        nr, ndx, ndw = _ndiff(kr, parts["r"]), _ndiff(kdx, edx), _ndiff(kdw, edw)
        if nr or ndx or ndw:
            bad.append(f"{dt} [{rows}, {cols}] sms {sms}: r {nr}, dx {ndx}/{rows * cols}, dw {ndw}/{cols}")
    assert not bad, "\n".join(bad)


def test_the_gemma_kernel_is_not_llamas():
    # the harness sees the difference: on the same inputs the llama emulation is off in bf16
    # (dx and dw), and in f32 only dx differs (dw's chain is the same there)
    cases = [(33, 100, 132, 1, 1), (1100, 512, 5, 4, 9)]
    seen = {}
    for (dt, rows, cols, sms, x, dy, w), (kr, kdx, kdw) in _run_cases("kernel", cases, 7):
        ldx, ldw = B.llama_rms_norm_backward(x, w, dy, 1e-6, dt, rsqrt=L._harness_rsqrt, num_sms=sms)
        gdx, gdw = B.gemma_rms_norm_backward(x, w, dy, 1e-6, dt, rsqrt=L._harness_rsqrt, num_sms=sms)
        assert _ndiff(kdx, gdx) == 0 and _ndiff(kdw, gdw) == 0, (dt, rows, cols)
        seen.setdefault(dt, [0, 0])
        seen[dt][0] += _ndiff(kdx, ldx)
        seen[dt][1] += _ndiff(kdw, ldw) if dt != "f32" else 0
    assert all(seen[dt][0] > 0 for dt in DTYPES) and seen["bf16"][1] > 0, seen


def test_in_f32_gemmas_dw_is_llamas_with_the_same_inputs():
    # dw's summand is fl(dy * fl(h * r)) in both chains in f32 (llama's roundings to T are the
    # identity there): the same column sum of the same values
    rng = np.random.default_rng(3)
    for rows, cols, sms in [(7, 64, 132), (1100, 16, 1), (2100, 64, 1)]:
        x = rng.standard_normal((rows, cols)).astype(F32)
        dy = rng.standard_normal((rows, cols)).astype(F32)
        w = _weights(rng, cols).astype(F32)
        _, ldw = B.llama_rms_norm_backward(x, w, dy, 1e-6, "f32", num_sms=sms)
        _, gdw = B.gemma_rms_norm_backward(x, w, dy, 1e-6, "f32", num_sms=sms)
        assert _ndiff(ldw, gdw) == 0, (rows, cols)


def _rust_str(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


@pytest.mark.parametrize("variant,off,exact", [("gn_rounded", "dx", "dw"), ("dw_terms_rounded", "dw", "dx")])
def test_the_gpu_checks_red_team_variants_break_one_gradient(variant, off, exact):
    # verifier/tests/gpu.rs's gemma_backward/<variant> (verified in bf16 there): on the CPU the
    # mutated kernel is off in the one gradient and exact in the other, in bf16 and f16; in f32
    # (rounding to T the identity) exact in both
    gpu = (REPO / "verifier" / "tests" / "gpu.rs").read_text(encoding="utf-8")
    for part in GPU_VARIANTS[variant]:
        assert f'"{_rust_str(part)}"' in gpu, f"gpu.rs's {variant} is not this test's: {part}"
    cases = [(33, 100, 132, 1, 1), (64, 1024, 132, 2, 5), (1100, 512, 5, 4, 9)]
    n = {}
    for (dt, rows, cols, sms, x, dy, w), (kr, kdx, kdw) in _run_cases(variant, cases, 11):
        edx, edw = B.gemma_rms_norm_backward(x, w, dy, 1e-6, dt, rsqrt=L._harness_rsqrt, num_sms=sms)
        d = n.setdefault(dt, {"dx": 0, "dw": 0})
        d["dx"] += _ndiff(kdx, edx)
        d["dw"] += _ndiff(kdw, edw)
    for dt in ("bf16", "f16"):
        assert n[dt][off] > 0 and n[dt][exact] == 0, (variant, dt, n)
    assert n["f32"] == {"dx": 0, "dw": 0}, (variant, n)
