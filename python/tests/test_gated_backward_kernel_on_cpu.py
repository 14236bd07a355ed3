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
f32, including gate values where exp overflows and underflows.

The bundled kernel of op gelu_tanh_mul_backward (kernels/gelu_tanh_mul_backward/kernel.cu, the same
structure) likewise, against a transcription of eager's chain for `F.gelu(gate, approximate="tanh")
* up` with the contractions eager's SASS has (docs/backward-gated.md, "gelu_tanh_mul_backward"):

    x2 = g * g;  t = tanhf(fma(x2 * g, kK, g) * kB);  act = T(0.5g * (1 + t));  d_up = T(dy * act)
    d_act = T(dy * up);  d_gate = T(d_act * fma(1 + t, 0.5, (0.5g * fma(-t, t, 1)) * (fma(x2, k3, 1) * kB)))

tanhf is glibc's on both sides here (CUDA's libdevice tanhf on the GPU, which the CPU cannot
run): bit for bit against the transcription, and within a tolerance of CPU torch autograd in f64
(the derivative itself, which no transcription slip could match)."""
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
GELU = REPO / "kernels" / "gelu_tanh_mul_backward" / "kernel.cu"
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


@lru_cache(maxsize=3)
def _runner(op="silu_mul_backward") -> Path:
    if op == "gelu_tanh_mul_backward":   # the same main, the other kernel's entries
        return build_own_main("gmbb-", BUNDLED_MAIN.replace("silu_mul_bwd_", "gelu_tanh_mul_bwd_"),
                              GELU.read_text(encoding="utf-8"))
    if op == "gelu_tanh_mul_backward_reference":   # the verifier's reference, named as the kernel
        src = (REPO / "verifier" / "src" / "reference.cu").read_text(encoding="utf-8").split("// Verifier utility")[0]
        want = "ref_gelu_tanh_mul_backward_default_grad_##S("
        assert want in src, want
        return build_own_main("gmbr-", BUNDLED_MAIN.replace("silu_mul_bwd_", "gelu_tanh_mul_bwd_"),
                              src.replace(want, "gelu_tanh_mul_bwd_##S("))
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


def _run(jobs, tmp_path, op="silu_mul_backward"):
    lines, outs = [], []
    for i, (dt, dy, g, u, grid, block) in enumerate(jobs):
        fin, fout = tmp_path / f"in{i}", tmp_path / f"out{i}"
        fin.write_bytes(to_raw(dy, dt) + to_raw(g, dt) + to_raw(u, dt))
        lines.append(f"{dt} {len(g)} {grid} {block} {fin} {fout}")
        outs.append((dt, len(g), fout))
    (tmp_path / "jobs").write_text("\n".join(lines) + "\n")
    import subprocess
    r = subprocess.run([str(_runner(op)), str(tmp_path / "jobs")], capture_output=True, text=True)
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


# ---- gelu_tanh_mul_backward ----------------------------------------------------------------------

@lru_cache(maxsize=1)
def _tanhf():
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    f = libm.tanhf
    f.argtypes, f.restype = [ctypes.c_float], ctypes.c_float
    vec = np.vectorize(lambda v: f(float(v)), otypes=[np.float64])
    return lambda v: vec(v).astype(F32)


KB, KK = F32(0.79788456080286536), F32(0.044715)   # eager's kBeta, kKappa as f32
K3 = (F32(3) * KK).astype(F32)                       # `opmath_t(3) * kKappa`, folded in f32


def _eager_gelu(dy, g, u, dt):
    one = np.ones_like(g)
    x2 = (g * g).astype(F32)
    t = _tanhf()((_fma((x2 * g).astype(F32), np.full_like(g, KK), g) * KB).astype(F32))
    left, right = (F32(0.5) * g).astype(F32), (F32(1) + t).astype(F32)
    act = _rt((left * right).astype(F32), dt)
    d_up = _rt((dy * act).astype(F32), dt)
    d_act = _rt((dy * u).astype(F32), dt)
    inner_d = (_fma(x2, np.full_like(g, K3), one) * KB).astype(F32)
    right_d = ((left * _fma(-t, t, one)).astype(F32) * inner_d).astype(F32)
    d_gate = _rt((d_act * _fma(right, np.full_like(g, F32(0.5)), right_d)).astype(F32), dt)
    return d_gate, d_up, d_act


def _gelu_inputs(dt, n, seed):
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal(n) * 3).astype(F32)
    # tanh's branches (|inner| below 0.6, to 9.01, saturated), signed zeros, large |g|
    g[: n // 8] = np.resize(np.array([-100, -10, -5, -3, -0.7, -0.5, 0.5, 0.7, 3, 5, 10, 100, 1e-3, -1e-3,
                                      0, -0.0, 6e4, -6e4], F32), n // 8)
    u = rng.standard_normal(n).astype(F32)
    dy = (rng.standard_normal(n) * 0.1).astype(F32)
    return tuple(_rt(v, dt) for v in (dy, g, u))


def _gelu_jobs():
    jobs = []
    for dt in ("bf16", "f16", "f32"):
        for n, grid, block in ((1, 1, 32), (1000, 3, 64), (4099, 1, 256), (1001, 2, 32), (2048, 3, 32)):
            dy, g, u = _gelu_inputs(dt, n, seed=n + 3 * len(dt))
            jobs.append((dt, dy, g, u, grid, block))
    return jobs


@pytest.mark.parametrize("op", ["gelu_tanh_mul_backward", "gelu_tanh_mul_backward_reference"])
def test_the_gelu_tanh_chain_equals_its_transcription(op, tmp_path):
    """The bundled kernel, and the verifier's reference (verifier/src/reference.cu, written apart
    from it), each bit for bit against the transcription."""
    jobs = _gelu_jobs()
    for (dt, dy, g, u, grid, block), (kg, ku) in zip(jobs, _run(jobs, tmp_path, op)):
        eg, eu, _ = _eager_gelu(dy, g, u, dt)
        assert (_bits(ku) != _bits(eu)).sum() == 0, (dt, len(g), "d_up")
        assert (_bits(kg) != _bits(eg)).sum() == 0, (dt, len(g), "d_gate")


def test_the_gelu_tanh_chain_is_the_derivative_cpu_autograd_takes(tmp_path):
    """f32: the kernel's gradients against CPU torch autograd of F.gelu(g, approximate="tanh") * u
    in f64 on the same inputs (the derivative, not eager's bits: another tanh, no rounding)."""
    torch = pytest.importorskip("torch")
    jobs = [j for j in _gelu_jobs() if j[0] == "f32"]
    for (dt, dy, g, u, grid, block), (kg, ku) in zip(jobs, _run(jobs, tmp_path, "gelu_tanh_mul_backward")):
        gt = torch.tensor(g, dtype=torch.float64, requires_grad=True)
        ut = torch.tensor(u, dtype=torch.float64, requires_grad=True)
        y = torch.nn.functional.gelu(gt, approximate="tanh") * ut
        tg, tu = (v.numpy() for v in torch.autograd.grad(y, (gt, ut), torch.tensor(dy, dtype=torch.float64)))
        # d_up: act and dy * act rounded once each; d_gate: d_act's rounding and tanhf's few ulp,
        # amplified by |g|^2 through (1 - t^2) * kB * (1 + 3 kK g^2) where tanh is not saturated
        # (1 + t cancels where g < 0: act's error is absolute there, some ulp of 1 times |g|)
        ag = np.abs(g.astype(np.float64))
        assert np.all(np.abs(ku - tu) <= 4e-7 * np.abs(tu) + 4e-7 * np.abs(dy) * ag + 1e-30), (len(g), "d_up")
        d_act = dy * u
        tol = 2e-6 * np.abs(d_act) * (1 + np.minimum(g.astype(np.float64) ** 2, 100.0)) + 1e-30
        assert np.all(np.abs(kg - tg) <= tol), (len(g), "d_gate", float(np.max(np.abs(kg - tg) - tol)))


def test_a_gelu_tanh_contraction_slip_is_caught(tmp_path):
    """The transcription sees the contractions: 1 - t * t as two roundings changes f32 d_gate."""
    dy, g, u = _gelu_inputs("f32", 4099, seed=11)
    (kg, _), = _run([("f32", dy, g, u, 2, 128)], tmp_path, "gelu_tanh_mul_backward")
    _, _, d_act = _eager_gelu(dy, g, u, "f32")
    one = np.ones_like(g)
    x2 = (g * g).astype(F32)
    t = _tanhf()((_fma((x2 * g).astype(F32), np.full_like(g, KK), g) * KB).astype(F32))
    left, right = (F32(0.5) * g).astype(F32), (F32(1) + t).astype(F32)
    inner_d = (_fma(x2, np.full_like(g, K3), one) * KB).astype(F32)
    unfused = ((left * (F32(1) - (t * t).astype(F32)).astype(F32)).astype(F32) * inner_d).astype(F32)
    slip = (d_act * _fma(right, np.full_like(g, F32(0.5)), unfused)).astype(F32)
    assert (_bits(kg) != _bits(slip)).sum() > 0
