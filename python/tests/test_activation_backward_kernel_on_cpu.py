"""The bundled backward kernels of the elementwise activations (ops silu_backward, gelu_backward,
gelu_tanh_backward: kernels/<op>/kernel.cu; issue 30, docs/backward-activations.md) on the CPU
under cuda_on_cpu/harness.h, against a transcription of the one CUDA kernel eager autograd runs
for the node (SiluBackward0, GeluBackward0 'tanh' and 'none'), each rounding and contraction
written out:

    silu:      s = 1 / (1 + expf(-x));  dx = T((dy * s) * fma(1 - s, x, 1))
    gelu_tanh: x2 = x * x;  t = tanhf(fma(x2 * x, kK, x) * kB)
               dx = T(dy * fma(1 + t, 0.5, (0.5x * fma(-t, t, 1)) * (fma(x2, k3, 1) * kB)))
    gelu:      o = 1 + erff(x * kA);  pdf = expf((-0.5x) * x) * kB'
               dx = T(dy * fma(o, 0.5, x * pdf))      candidate B (the kernel's default)
               dx = T(dy * fma(x, pdf, 0.5 * o))      candidate A (-DGB_FMA_XPDF=1)

expf, erff and tanhf are glibc's here on both sides (CUDA's libdevice functions on the GPU, which
the CPU cannot run), and the CPU compiles without contraction (so silu's `1 + expf(-x)` is two
roundings here; on the GPU the kernel has the form eager's SASS has, docs/backward-gated.md). What
this checks is each kernel's structure (which values are rounded, the operand order, the explicit
contractions, the 16-byte vectors, the scalar tail, the grid-stride loops at several grids), in
bf16, f16 and f32, with inputs where exp, erf and tanh saturate; the verifier's reference
(verifier/src/reference.cu, written apart) against the same transcription; the f32 gradients
against CPU torch autograd in f64 (the derivative itself); and that gelu's two candidates give
other bits, so that a GPU run against eager autograd can tell which one eager's binary has
(scripts/activation_backward_probe.py)."""
from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

from cpu_harness import build_own_main, from_raw, to_raw  # noqa: E402

F32 = np.float32
OPS = ("silu_backward", "gelu_backward", "gelu_tanh_backward")

# Jobs, one a line: DT N GRID BLOCK IN OUT; IN holds dy, x (N each, raw DT); OUT receives dx (raw
# DT). The entry <act>_bwd_<dt>(dx, dy, x, n) loads 16 bytes at a time, so each tensor gets a
# 16-byte-aligned buffer of its own (the ABI's alignment).
MAIN = r"""
%PRELUDE%
#define ENTRY(N) extern "C" void ACT_bwd_##N(void*, const void*, const void*, long long);
ENTRY(bf16) ENTRY(f16) ENTRY(f32)
int main(int argc, char** argv) {
  return kz_each_job(argv[1], [](std::istringstream& ss, const std::string& line) {
    std::string dt, in, out; long long n; unsigned grid, block;
    ss >> dt >> n >> grid >> block >> in >> out;
    if (!ss) { std::fprintf(stderr, "bad job: %s\n", line.c_str()); return 2; }
    const size_t es = dt == "f32" ? 4 : 2, b = es * (size_t)n;
    std::ifstream f(in, std::ios::binary);
    std::vector<unsigned char> buf((std::istreambuf_iterator<char>(f)), {});
    if (buf.size() != 2 * b) { std::fprintf(stderr, "%s: bad size\n", in.c_str()); return 2; }
    const size_t cap = (b + 15) / 16 * 16;
    unsigned char* t[3];
    for (int i = 0; i < 3; ++i) t[i] = (unsigned char*)std::aligned_alloc(16, cap ? cap : 16);
    for (int i = 0; i < 2; ++i) std::memcpy(t[1 + i], buf.data() + i * b, b);
    std::memset(t[0], 0xA7, cap);
    void (*fn)(void*, const void*, const void*, long long) =
        dt == "bf16" ? ACT_bwd_bf16 : dt == "f16" ? ACT_bwd_f16 : ACT_bwd_f32;
    unsigned char *DX = t[0], *DY = t[1], *X = t[2];
    g_call = [=] { fn(DX, DY, X, n); };
    kzcpu::launch(uint3{grid, 1, 1}, uint3{block, 1, 1}, tramp);
    std::ofstream of(out, std::ios::binary);
    of.write((const char*)DX, b);
    for (int i = 0; i < 3; ++i) std::free(t[i]);
    return 0;
  });
}
"""


@lru_cache(maxsize=8)
def _runner(op: str, what: str = "kernel") -> Path:
    """The bundled kernel of `op` (what "kernel"), its candidate A build (what "fma_xpdf", gelu
    only), or the verifier's reference entry for it named as the kernel's (what "reference")."""
    act = op.removesuffix("_backward")
    main = MAIN.replace("ACT_bwd_", f"{act}_bwd_")
    if what == "reference":
        src = (REPO / "verifier" / "src" / "reference.cu").read_text(encoding="utf-8").split("// Verifier utility")[0]
        want = f"ref_{op}_default_grad_##S("
        assert want in src, want
        return build_own_main(f"abr-{act}-", main, src.replace(want, f"{act}_bwd_##S("))
    src = (REPO / "kernels" / op / "kernel.cu").read_text(encoding="utf-8")
    if what == "fma_xpdf":
        assert "#ifndef GB_FMA_XPDF" in src
        src = "#define GB_FMA_XPDF 1\n" + src
    return build_own_main(f"abk-{act}-{what}-", main, src)


@lru_cache(maxsize=3)
def _libm(name):
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    f = getattr(libm, name)
    f.argtypes, f.restype = [ctypes.c_float], ctypes.c_float
    vec = np.vectorize(lambda v: f(float(v)), otypes=[np.float64])

    def call(v):   # the f32 results, exact in f64 (inf where expf overflows, as expf's)
        with np.errstate(over="ignore", invalid="ignore"):
            return vec(v).astype(F32)
    return call


def _rt(v, dt):
    """Round f32 values to T and back (exact in f32)."""
    return from_raw(to_raw(np.asarray(v, F32), dt), dt)


def _fma(a, b, c):
    """fmaf: one rounding (kernelize.backward_ln.fma32: round-to-odd in f64, no double rounding)."""
    from kernelize.backward_ln import fma32
    a, b, c = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32), np.asarray(c, F32))
    return np.asarray(fma32(a, b, c), F32)


def _f(v):
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        return np.asarray(v, F32)


KB, KK = F32(0.79788456080286536), F32(0.044715)     # gelu_tanh's kBeta, kKappa as f32
K3 = F32(F32(3) * KK)                                 # `opmath_t(3) * kKappa`, folded in f32
KA, KBE = F32(0.70710678118654752), F32(0.3989422804014327)   # gelu's kAlpha, kBeta as f32


def silu_dx(dy, x, dt):
    with np.errstate(over="ignore", invalid="ignore"):
        s = _f(F32(1) / _f(F32(1) + _libm("expf")(-x)))
        return _rt(_f(_f(dy * s) * _fma(_f(F32(1) - s), x, F32(1))), dt)


def gelu_tanh_dx(dy, x, dt, tanh_d=None):
    with np.errstate(over="ignore", invalid="ignore"):
        x2 = _f(x * x)
        t = _libm("tanhf")(_f(_fma(_f(x2 * x), KK, x) * KB))
        left, right = _f(F32(0.5) * x), _f(F32(1) + t)
        inner_d = _f(_fma(x2, K3, F32(1)) * KB)
        td = _fma(-t, t, F32(1)) if tanh_d is None else tanh_d(t)
        right_d = _f(_f(left * td) * inner_d)
        return _rt(_f(dy * _fma(right, F32(0.5), right_d)), dt)


def gelu_parts(x):
    """(o, pdf): 1 + erff(x * kA), and expf((-0.5 * x) * x) * kB', each rounded as the kernel."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        o = _f(F32(1) + _libm("erff")(_f(x * KA)))
        pdf = _f(_libm("expf")(_f(_f(F32(-0.5) * x) * x)) * KBE)
        return o, pdf


def gelu_dx(dy, x, dt, candidate="B"):
    o, pdf = gelu_parts(x)
    with np.errstate(over="ignore", invalid="ignore"):
        if candidate == "B":       # cdf's product fused into the sum (the default)
            total = _fma(o, F32(0.5), _f(x * pdf))
        elif candidate == "A":     # x * pdf fused instead
            total = _fma(x, pdf, _f(F32(0.5) * o))
        else:                      # "C": no contraction
            total = _f(_f(F32(0.5) * o) + _f(x * pdf))
        return _rt(_f(dy * total), dt)


TRANSCRIPTION = {"silu_backward": silu_dx, "gelu_backward": gelu_dx, "gelu_tanh_backward": gelu_tanh_dx}
EXTREMES = [-100, -88.7, -87, -20, -10, -9.5, -5, -3, -1, -0.7, -0.5, 0.5, 0.7, 1, 3, 5, 9.5, 10, 20, 87,
            88.8, 100, 1e-3, -1e-3, 1e-30, -1e-30, 0, -0.0, 6e4, -6e4, np.inf, -np.inf, np.nan]


def _inputs(dt, n, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 3).astype(F32)
    # exp's overflow / underflow, erf's and tanh's saturation and branches, signed zeros, huge and
    # non-finite x (eager propagates them: the kernel must too)
    k = max(1, n // 6)
    x[:k] = np.resize(np.array(EXTREMES, F32), k)
    dy = (rng.standard_normal(n) * 0.5).astype(F32)
    if n > 40:
        dy[-3:] = [0.0, -0.0, 6e4]
    return _rt(dy, dt), _rt(x, dt)


def _jobs(seed0=0):
    jobs = []
    for dt in ("bf16", "f16", "f32"):
        # 4099: vectors and a tail; 1001: a tail of 1 (bf16/f16) or 1 (f32); 2048 at a grid of 3:
        # a thread's several vectors
        for n, grid, block in ((1, 1, 32), (7, 1, 32), (1000, 3, 64), (4099, 1, 256), (1001, 2, 32),
                               (2048, 3, 32)):
            dy, x = _inputs(dt, n, seed=seed0 + n + 7 * len(dt))
            jobs.append((dt, dy, x, grid, block))
    return jobs


def _run(jobs, tmp_path, op, what="kernel"):
    lines, outs = [], []
    for i, (dt, dy, x, grid, block) in enumerate(jobs):
        fin, fout = tmp_path / f"{op}-{what}-in{i}", tmp_path / f"{op}-{what}-out{i}"
        fin.write_bytes(to_raw(dy, dt) + to_raw(x, dt))
        lines.append(f"{dt} {len(x)} {grid} {block} {fin} {fout}")
        outs.append((dt, fout))
    jf = tmp_path / f"{op}-{what}-jobs"
    jf.write_text("\n".join(lines) + "\n")
    r = subprocess.run([str(_runner(op, what)), str(jf)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return [from_raw(fout.read_bytes(), dt) for dt, fout in outs]


def _bits(a):
    """The bits, NaNs made one (eager's and the kernel's NaN payloads are not compared)."""
    a = np.ascontiguousarray(a, F32).copy()
    a[np.isnan(a)] = np.nan
    return a.view(np.uint32)


def _differing(a, b):
    return int((_bits(a) != _bits(b)).sum())


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("what", ["kernel", "reference"])
def test_each_kernel_and_reference_equals_its_transcription(op, what, tmp_path):
    """The bundled kernel (gelu: candidate B, its default) and the verifier's reference, each bit
    for bit against the transcription, every dtype, shape and grid."""
    jobs = _jobs()
    got = _run(jobs, tmp_path, op, what)
    for (dt, dy, x, grid, block), dx in zip(jobs, got):
        assert not np.any(_bits(dx) == 0xA7A7A7A7), (op, dt, len(x), "an element left unwritten")
        want = TRANSCRIPTION[op](dy, x, dt)
        assert _differing(dx, want) == 0, (op, what, dt, len(x), grid)


def test_the_gelu_candidate_a_build_equals_its_transcription(tmp_path):
    """-DGB_FMA_XPDF=1 builds candidate A (x * pdf fused), bit for bit its transcription; it and
    the default differ somewhere in f32, so a GPU run against eager can tell them apart."""
    jobs = _jobs()
    got_a = _run(jobs, tmp_path, "gelu_backward", "fma_xpdf")
    got_b = _run(jobs, tmp_path, "gelu_backward")
    apart = {}
    for (dt, dy, x, grid, block), a, b in zip(jobs, got_a, got_b):
        assert _differing(a, gelu_dx(dy, x, dt, "A")) == 0, (dt, len(x))
        apart[dt] = apart.get(dt, 0) + _differing(a, b)
    assert apart["f32"] > 0, apart


def test_the_gelu_candidates_b_and_no_contraction_are_the_same_bits():
    """Candidate B fuses 0.5 * (1 + erf), which is exact, into the sum: the bits of no
    contraction (C) wherever x is finite; A (x * pdf fused) differs on a share of f32 inputs."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(200_000) * 3).astype(F32)
    dy = rng.standard_normal(200_000).astype(F32)
    b, c, a = (gelu_dx(dy, x, "f32", k) for k in "BCA")
    assert _differing(b, c) == 0
    assert 0 < _differing(a, b) < len(x) // 2


@pytest.mark.parametrize("op", OPS)
def test_the_f32_gradient_is_the_derivative_cpu_autograd_takes(op, tmp_path):
    """f32, finite inputs: the kernel's dx against CPU torch autograd of the forward in f64 on the
    same inputs (the derivative, not eager's bits: other expf/erff/tanhf, no rounding)."""
    torch = pytest.importorskip("torch")
    fwd = {"silu_backward": torch.nn.functional.silu,
           "gelu_backward": torch.nn.functional.gelu,
           "gelu_tanh_backward": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}[op]
    jobs = [j for j in _jobs(seed0=100) if j[0] == "f32"]
    for (dt, dy, x, grid, block), dx in zip(jobs, _run(jobs, tmp_path, op)):
        ok = np.isfinite(x) & np.isfinite(dy)
        xt = torch.tensor(x[ok], dtype=torch.float64, requires_grad=True)
        (tg,) = torch.autograd.grad(fwd(xt), xt, torch.tensor(dy[ok], dtype=torch.float64))
        tg = tg.numpy()
        ax = np.abs(x[ok].astype(np.float64))
        # a few ulp of f32 of |dy| times the derivative's size (at most ~1.13), more where the
        # derivative cancels (gelu near x = -0.75, silu near -1.28: terms of size |x|)
        tol = 4e-6 * np.abs(dy[ok]) * (1 + np.minimum(ax, 30.0) ** 2) + 1e-30
        bad = np.abs(dx[ok] - tg) > tol
        assert not bad.any(), (op, len(x), x[ok][bad][:5], dx[ok][bad][:5], tg[bad][:5])


def test_the_transcriptions_see_the_contractions(tmp_path):
    """Slips the transcriptions catch in f32: silu's products in the other order (dy * (s * b)),
    gelu_tanh's 1 - t * t in two roundings, gelu's erf argument as x / sqrt(2)."""
    dt = "f32"
    dy, x = _inputs(dt, 4099, seed=11)
    ok = np.isfinite(x)
    got = {op: _run([(dt, dy, x, 2, 128)], tmp_path, op)[0] for op in OPS}
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        s = _f(F32(1) / _f(F32(1) + _libm("expf")(-x)))
        slip = _f(dy * _f(s * _fma(_f(F32(1) - s), x, F32(1))))
        assert _differing(got["silu_backward"][ok], slip[ok]) > 0
        slip = gelu_tanh_dx(dy, x, dt, tanh_d=lambda t: _f(F32(1) - _f(t * t)))
        assert _differing(got["gelu_tanh_backward"][ok], slip[ok]) > 0
        _, pdf = gelu_parts(x)
        o = _f(F32(1) + _libm("erff")(_f(x / F32(np.sqrt(2)))))
        slip = _f(dy * _fma(o, F32(0.5), _f(x * pdf)))
        assert _differing(got["gelu_backward"][ok], slip[ok]) > 0
