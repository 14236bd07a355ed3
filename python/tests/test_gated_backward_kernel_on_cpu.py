"""The bundled gated-MLP backward kernel (op silu_mul_backward, kernels/silu_mul_backward/kernel.cu;
issue 30, docs/backward-gated.md) on the CPU under cuda_on_cpu/harness.h, against a transcription
of eager autograd's chain for `F.silu(gate) * up` with each rounding to T where eager's kernels
store:

    act = T(g / T32(1 + exp(-g)));  d_up = T(dy * act);  d_act = T(dy * up)
    s = 1 / T32(1 + exp(-g));       d_gate = T(T32(d_act * s) * fma(1 - s, g, 1))

exp is glibc's expf here (the harness's, called through ctypes, so both sides use one function)
and the CPU compiles without contraction, so `1 + exp(-g)` is two roundings here (on the GPU the
kernel has the form eager's SASS has, docs/backward-gated.md):
what this checks is the chain's structure (which values are rounded to T, the operand order,
the 16-byte vectors, the scalar tail, the grid-stride loops at several grids), for bf16, f16 and
f32, including gate values where exp overflows and underflows."""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import lru_cache
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "kernels" / "silu_mul_backward" / "kernel.cu"
sys.path.insert(0, str(REPO / "python"))

from cpu_harness import build_own_main, from_raw, to_raw  # noqa: E402

F32 = np.float32

# Jobs, one a line: DT N GRID BLOCK IN OUT; IN holds dy, gate, up (N each, raw DT); OUT receives
# d_gate, d_up (raw DT).
# The bundled kernel (op silu_mul_backward): entry silu_mul_bwd_<dt>(..., rows, cols), 16-byte
# vector loads, so each tensor gets a buffer of its own (the ABI's 16-byte alignment); the
# same job lines, N split as ROWS x (N / ROWS) where it divides (the entry only uses the product).
BUNDLED_MAIN = r"""
%PRELUDE%
#define ENTRY(N) extern "C" void silu_mul_bwd_##N(void*, void*, const void*, const void*, const void*, long long, long long);
ENTRY(bf16) ENTRY(f16) ENTRY(f32)
int main(int argc, char** argv) {
  return kz_each_job(argv[1], [](std::istringstream& ss, const std::string& line) {
    std::string dt, in, out; long long n; unsigned grid, block;
    ss >> dt >> n >> grid >> block >> in >> out;
    if (!ss) { std::fprintf(stderr, "bad job: %s\n", line.c_str()); return 2; }
    const size_t es = dt == "f32" ? 4 : 2, b = es * (size_t)n;
    std::ifstream f(in, std::ios::binary);
    std::vector<unsigned char> buf((std::istreambuf_iterator<char>(f)), {});
    if (buf.size() != 3 * b) { std::fprintf(stderr, "%s: bad size\n", in.c_str()); return 2; }
    const size_t cap = (b + 15) / 16 * 16;
    unsigned char* t[5];
    for (int i = 0; i < 5; ++i) t[i] = (unsigned char*)std::aligned_alloc(16, cap ? cap : 16);
    for (int i = 0; i < 3; ++i) std::memcpy(t[2 + i], buf.data() + i * b, b);
    std::memset(t[0], 0xA7, cap); std::memset(t[1], 0xA7, cap);
    void (*fn)(void*, void*, const void*, const void*, const void*, long long, long long) =
        dt == "bf16" ? silu_mul_bwd_bf16 : dt == "f16" ? silu_mul_bwd_f16 : silu_mul_bwd_f32;
    const long long rows = n % 7 == 0 ? 7 : 1;
    unsigned char *DG = t[0], *DU = t[1], *DY = t[2], *G = t[3], *U = t[4];
    g_call = [=] { fn(DG, DU, DY, G, U, rows, n / rows); };
    kzcpu::launch(uint3{grid, 1, 1}, uint3{block, 1, 1}, tramp);
    std::ofstream of(out, std::ios::binary);
    of.write((const char*)DG, b);
    of.write((const char*)DU, b);
    for (int i = 0; i < 5; ++i) std::free(t[i]);
    return 0;
  });
}
"""


@lru_cache(maxsize=1)
def _runner() -> Path:
    return build_own_main("smbb-", BUNDLED_MAIN, BUNDLED.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _expf():
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    f = libm.expf
    f.argtypes, f.restype = [ctypes.c_float], ctypes.c_float
    vec = np.vectorize(lambda v: f(float(v)), otypes=[np.float64])

    def expf(v):   # expf's f32 results, exact in f64 (inf where it overflows, as expf's)
        with np.errstate(over="ignore"):
            return vec(v).astype(F32)
    return expf


def _rt(v, dt):
    """Round f32 values to T and back (exact in f32)."""
    return from_raw(to_raw(v, dt), dt)


def _fma(a, b, c):
    """fmaf: one rounding (kernelize.backward_ln.fma32: round-to-odd in f64, no double rounding)."""
    from kernelize.backward_ln import fma32
    return np.asarray(fma32(a, b, c), F32)


def _eager(dy, g, u, dt):
    e = _expf()(-g)
    act = _rt((g / (F32(1) + e).astype(F32)).astype(F32), dt)
    d_up = _rt((dy * act).astype(F32), dt)
    d_act = _rt((dy * u).astype(F32), dt)
    s = (F32(1) / (F32(1) + e).astype(F32)).astype(F32)
    d_gate = _rt(((d_act * s).astype(F32) * _fma((F32(1) - s).astype(F32), g, np.ones_like(g))).astype(F32), dt)
    return d_gate, d_up


def _inputs(dt, n, seed):
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal(n) * 3).astype(F32)
    g[: n // 8] = np.resize(np.array([-100, -88.7, -87, -20, 20, 87, 88.8, 100, 1e-3, -1e-3, 0, -0.0], F32), n // 8)
    u = rng.standard_normal(n).astype(F32)
    dy = (rng.standard_normal(n) * 0.1).astype(F32)
    return tuple(_rt(v, dt) for v in (dy, g, u))


def _run(jobs, tmp_path):
    lines, outs = [], []
    for i, (dt, dy, g, u, grid, block) in enumerate(jobs):
        fin, fout = tmp_path / f"in{i}", tmp_path / f"out{i}"
        fin.write_bytes(to_raw(dy, dt) + to_raw(g, dt) + to_raw(u, dt))
        lines.append(f"{dt} {len(g)} {grid} {block} {fin} {fout}")
        outs.append((dt, len(g), fout))
    (tmp_path / "jobs").write_text("\n".join(lines) + "\n")
    import subprocess
    r = subprocess.run([str(_runner()), str(tmp_path / "jobs")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    got = []
    for dt, n, fout in outs:
        raw = fout.read_bytes()
        half = len(raw) // 2
        got.append((from_raw(raw[:half], dt), from_raw(raw[half:], dt)))
    return got


def _bits(a):
    return np.ascontiguousarray(a, F32).view(np.uint32)


def test_the_chain_equals_its_transcription(tmp_path):
    jobs = []
    for dt in ("bf16", "f16", "f32"):
        # 4099: vectors and a tail; 1001 = 7 x 143 rows and columns; 2048 at a grid of 3:
        # a thread's several vectors
        for n, grid, block in ((1, 1, 32), (1000, 3, 64), (4099, 1, 256), (1001, 2, 32), (2048, 3, 32)):
            dy, g, u = _inputs(dt, n, seed=n + len(dt))
            jobs.append((dt, dy, g, u, grid, block))
    for (dt, dy, g, u, grid, block), (kg, ku) in zip(jobs, _run(jobs, tmp_path)):
        eg, eu = _eager(dy, g, u, dt)
        assert (_bits(ku) != _bits(eu)).sum() == 0, (dt, len(g), "d_up")
        assert (_bits(kg) != _bits(eg)).sum() == 0, (dt, len(g), "d_gate")


def test_a_rounding_slip_is_caught(tmp_path):
    """The transcription sees the structure: d_act left unrounded to T changes bf16 d_gate."""
    dy, g, u = _inputs("bf16", 4099, seed=5)
    (kg, _), = _run([("bf16", dy, g, u, 2, 128)], tmp_path)
    e = _expf()(-g)
    s = (F32(1) / (F32(1) + e).astype(F32)).astype(F32)
    unrounded = _rt(((dy * u).astype(F32) * s).astype(F32) * _fma((F32(1) - s).astype(F32), g, np.ones_like(g)), "bf16")
    assert (_bits(kg) != _bits(unrounded)).sum() > 0
