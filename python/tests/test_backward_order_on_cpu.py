"""HF LlamaRMSNorm's backward under eager autograd (issue 30): the emulation in
kernelize/backward.py and the CUDA kernels in kernels/rms_norm_llama_backward/, checked on the CPU.

1. The formula chain (which ops, in which dtype, where it rounds) against real torch autograd on
   the CPU, with the CPU's own reductions plugged in (the CPU's sums and mean differ from CUDA's,
   the elementwise ops do not): dx and dw bit for bit in bf16, f16 and f32. Mutations of the
   chain (a rounding point dropped or moved, the cube regrouped) must be caught.
2. The row-sum order: backward.row_sum(h*h) * factor equals scripts/eager_order.py's
   eager_mean_sq (the emulator proven bit-exact against eager's mean on an H200) at every row
   class and alignment.
3. The column-sum order: backward.col_sum equals a literal, thread-by-thread transcription of
   Reduce.cuh's outer reduction (thread_reduce_impl, block_y_reduce, global_reduce) on shapes
   with and without the warp-row split and the multi-CTA global reduce; col_config at the
   shapes of the GPU probe.
4. The kernels' configs (kb_configs, compiled with the host C++ compiler) equal backward.py's.
5. The kernels themselves, run on the CPU under cuda_on_cpu/harness.h (rsqrtf = 1/sqrtf there,
   so the emulator is given the same r): dx and dw equal the emulation bit for bit.

What only the GPU can tell (scripts/backward_probe.py): that eager on CUDA really runs this
chain in these orders (torch 2.11's sum kernels, vt0, the SM count's role), and CUDA's rsqrtf.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

REPO = Path(__file__).resolve().parents[2]
KSRC = REPO / "kernels" / "rms_norm_llama_backward" / "kernel.cu"
sys.path.insert(0, str(REPO / "python"))

from kernelize import backward as B  # noqa: E402
from cpu_harness import build_own_main, from_raw, to_raw, cache_dir, cxx as compiler  # noqa: E402
from conftest import load_script  # noqa: E402

F32 = np.float32
DTYPES = ["bf16", "f16", "f32"]


def _eager_order():
    return load_script(REPO / "scripts" / "eager_order.py", "eager_order")


def _bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=F32).view(np.uint32)


def _ndiff(a, b) -> int:
    return int((_bits(a) != _bits(b)).sum())


# ---- 1. the chain against CPU autograd -----------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


def _hf_llama_rms_norm(torch, x, w, eps):
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return w * h.to(x.dtype)


def _cpu_autograd(torch, dt, rows, cols, seed):
    T = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dt]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g).to(T)
    w = (1 + 0.2 * torch.randn(cols, generator=g)).to(T)
    dy = torch.randn(rows, cols, generator=g).to(T)
    xr = x.clone().requires_grad_(True)
    wr = w.clone().requires_grad_(True)
    _hf_llama_rms_norm(torch, xr, wr, 1e-6).backward(dy)
    return T, x, w, dy, xr.grad, wr.grad


def _cpu_pieces(torch, T):
    """The CPU's own kernels for the pieces whose order (or division) differs from CUDA's."""
    return dict(
        mean_sq_fn=lambda h: torch.from_numpy(h).pow(2).mean(-1).numpy(),
        rsqrt=lambda v: torch.rsqrt(torch.from_numpy(np.ascontiguousarray(v))).numpy(),
        row_sum_fn=lambda q: torch.from_numpy(np.ascontiguousarray(q)).sum(-1).numpy(),
        col_sum_fn=lambda v: torch.from_numpy(np.ascontiguousarray(v)).to(T).sum(0).float().numpy(),
        # the CPU divides (CUDA multiplies by 1/N: a CPU scalar divisor, div_true_kernel_cuda)
        div_n_fn=lambda a, n: (torch.from_numpy(np.ascontiguousarray(a)) / n).numpy(),
    )


CHAIN_SHAPES = [(1, 64), (3, 1001), (16, 2048), (33, 4096), (7, 5120), (64, 256), (5, 8192)]


@pytest.mark.parametrize("dt", DTYPES)
def test_the_chain_is_cpu_autograds(dt):
    torch = _torch()
    for i, (rows, cols) in enumerate(CHAIN_SHAPES):
        T, x, w, dy, ex, ew = _cpu_autograd(torch, dt, rows, cols, 100 + i)
        dx, dw = B.llama_rms_norm_backward(x.float().numpy(), w.float().numpy(), dy.float().numpy(),
                                           1e-6, dt, **_cpu_pieces(torch, T))
        assert _ndiff(dx, ex.float().numpy()) == 0, (dt, rows, cols, "dx")
        assert _ndiff(dw, ew.float().numpy()) == 0, (dt, rows, cols, "dw")


def _mutant(kind):
    """backward.llama_rms_norm_backward with one step changed (for the power of test 1)."""
    def run(x, w, dy, eps, dt, *, mean_sq_fn, rsqrt, row_sum_fn, col_sum_fn, div_n_fn):
        h = np.asarray(x, F32); wv = np.asarray(w, F32); g_out = np.asarray(dy, F32)
        rows, cols = h.shape
        r = rsqrt(np.asarray(mean_sq_fn(h), F32) + F32(eps)).astype(F32)
        rc = r[:, None]
        nc = B.round_to(h * rc, dt)
        gn = g_out * wv[None, :]
        if kind != "gn unrounded":
            gn = B.round_to(gn, dt)
        if kind == "dw from unrounded n":
            gw = B.round_to(g_out * (h * rc), dt)
        else:
            gw = B.round_to(g_out * nc, dt)
        dw = B.round_to(col_sum_fn(gw), dt)
        s = np.asarray(row_sum_fn(gn * h), F32)
        if kind == "cube left to right":
            ga = (((s * F32(-0.5)) * r) * r) * r
        else:
            ga = (s * F32(-0.5)) * ((r * r) * r)
        gp = np.asarray(div_n_fn(ga, cols), F32)
        if kind == "rsqrt grad via var":   # -0.5 * g * (var+eps)^-1.5 instead of result^3
            v = np.asarray(mean_sq_fn(h), np.float64) + eps
            gp = np.asarray(div_n_fn(((s * F32(-0.5)).astype(np.float64) * v ** -1.5).astype(F32), cols), F32)
        gh2 = gp[:, None] * (h * F32(2))
        if kind == "gh2 as 2*(gp*h)":
            gh2 = (gp[:, None] * h) * F32(2)
        return B.round_to(gn * rc + gh2, dt), dw
    return run


@pytest.mark.parametrize("kind,dt", [("gn unrounded", "bf16"), ("dw from unrounded n", "bf16"),
                                     ("cube left to right", "f32"), ("rsqrt grad via var", "f32")])
def test_the_chain_test_catches_a_changed_step(kind, dt):
    torch = _torch()
    bad = 0
    for i, (rows, cols) in enumerate(CHAIN_SHAPES):
        T, x, w, dy, ex, ew = _cpu_autograd(torch, dt, rows, cols, 100 + i)
        dx, dw = _mutant(kind)(x.float().numpy(), w.float().numpy(), dy.float().numpy(), 1e-6, dt,
                               **_cpu_pieces(torch, T))
        bad += _ndiff(dx, ex.float().numpy()) + _ndiff(dw, ew.float().numpy())
    assert bad > 0, f"the chain test would not notice '{kind}'"


def test_gh2_regrouping_is_exact():
    # PowBackward0's grad * (2 * h) equals 2 * (grad * h) bit for bit (a power of two scales
    # exactly, away from overflow and subnormals): that step's grouping cannot be told apart.
    rng = np.random.default_rng(5)
    a = rng.standard_normal(100000).astype(F32)
    h = rng.standard_normal(100000).astype(F32)
    assert _ndiff(a * (h * F32(2)), (a * h) * F32(2)) == 0


def test_inv_n_is_the_same_in_float_and_double():
    # div_true_kernel_cuda's reciprocal: older sources 1.0f / float(N), current
    # float(1.0 / double(N)); they agree for every N up to 2^17 + 1000 (all model widths).
    n = np.arange(1, 132072, dtype=np.int64)
    a = (F32(1) / n.astype(F32)).astype(F32)
    b = (1.0 / n.astype(np.float64)).astype(F32)
    assert _ndiff(a, b) == 0


# ---- 2. the row sum is the forward mean's order ----------------------------------------------------

def test_row_sum_is_eager_mean_order():
    EO = _eager_order()
    rng = np.random.default_rng(1)
    for rows in [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33]:
        for cols in [7, 64, 100, 128, 129, 131, 255, 256, 1001, 1002, 1003, 2048, 4096, 5120, 8192, 8195, 16384]:
            h = rng.standard_normal((rows, cols)).astype(F32)
            got = B.row_sum(h * h) * B.mean_factor(rows, cols)
            assert _ndiff(got, EO.eager_mean_sq(h)) == 0, (rows, cols)


def test_row_config_is_eager_orders():
    EO = _eager_order()
    for rows in [1, 2, 3, 4, 7, 8, 15, 16, 17, 100, 4096]:
        for cols in [1, 31, 64, 127, 128, 129, 1000, 2048, 4096, 8160, 8161, 8192, 65536]:
            e = EO.reduce_config(rows, cols)
            c = B.row_config(rows, cols)
            assert (c["bw"], c["bh"], c["split"], c["vec"]) == (
                e["block_width"], e["block_height"], e["split_across_warps"], e["vectorize"]), (rows, cols)


# ---- 3. the column sum -----------------------------------------------------------------------------

def _outer_reduce_literal(v: np.ndarray, cfg: dict) -> np.ndarray:
    """Reduce.cuh's outer reduction of v [rows, cols] (f32 values), transcribed thread by thread:
    thread_reduce_impl (vt0 = 4 accumulators, main loop while idx + 3*stride < end, then the
    tail), block_y_reduce (shared memory, offsets blockDim.y/2 .. 1), global_reduce (the last
    block: thread y sums ident + staged partials y, y + bh, ...; block_y_reduce again)."""
    rows, cols = v.shape
    bh = cfg["bh"]
    by = bh  # blockDim.y
    ymult = 1 if cfg["split"] else 0           # input_mult[1]
    cmult = bh if cfg["ctas"] > 1 else 0        # input_mult[2] = step before the CTA split
    stride = cfg["step_input"]
    out = np.zeros(cols, F32)
    for col in range(cols):
        staged = []
        for cta in range(cfg["ctas"]):
            vals = []
            ys = range(by) if ymult else [0]
            for ty in ys:
                idx = ty * ymult + cta * cmult
                acc = [F32(0)] * 4
                while idx + 3 * stride < rows:
                    for i in range(4):
                        acc[i] = F32(acc[i] + v[idx + i * stride, col])
                    idx += 4 * stride
                for i in range(4):
                    if idx >= rows:
                        break
                    acc[i] = F32(acc[i] + v[idx, col])
                    idx += stride
                a = acc[0]
                for i in range(1, 4):
                    a = F32(a + acc[i])
                vals.append(a)
            if ymult:
                sh = list(vals)
                off = by // 2
                while off > 0:
                    for ty in range(off):
                        sh[ty] = F32(sh[ty] + sh[ty + off])
                    off //= 2
                staged.append(sh[0])
            else:
                staged.append(vals[0])
        if cfg["ctas"] == 1:
            out[col] = staged[0]
            continue
        sh = []
        for ty in range(by):
            val = F32(0)
            k = ty
            while k < cfg["ctas"]:
                val = F32(val + staged[k])
                k += by
            sh.append(val)
        off = by // 2
        while off > 0:
            for ty in range(off):
                sh[ty] = F32(sh[ty] + sh[ty + off])
            off //= 2
        out[col] = sh[0]
    return out


def test_col_config_at_the_probe_shapes():
    c = B.col_config(4096, 8192)            # H100 SXM / H200: 132 SMs, 2048 threads per SM
    assert (c["out_vec"], c["bw"], c["bh"], c["split"], c["ctas"], c["step_input"]) == (4, 32, 4, True, 33, 132)
    c = B.col_config(16384, 4096)
    assert (c["bh"], c["split"], c["ctas"], c["step_input"]) == (4, True, 66, 264)
    c = B.col_config(4096, 8192, num_sms=114)  # H100 PCIe: another order
    assert c["ctas"] == 29
    for rows in range(1, 64):
        c = B.col_config(rows, 4096)
        assert not c["split"] and c["ctas"] == 1, rows   # one thread per column, all rows
    assert B.col_config(64, 4096)["split"] and B.col_config(1020, 4096)["ctas"] == 1
    assert B.col_config(1021, 4096)["ctas"] > 1


@pytest.mark.parametrize("rows,cols,sms", [(5, 12, 132), (70, 12, 132), (300, 7, 132), (2100, 64, 1),
                                          (1100, 16, 1), (530, 10, 2), (4100, 8, 132)])
def test_col_sum_is_the_literal_outer_reduce(rows, cols, sms):
    rng = np.random.default_rng(rows * 7 + cols)
    v = (rng.standard_normal((rows, cols)) * rng.uniform(0.5, 4.0, (rows, 1))).astype(F32)
    cfg = B.col_config(rows, cols, num_sms=sms)
    got = B.col_sum(v, cfg=cfg)
    want = _outer_reduce_literal(v, cfg)
    assert _ndiff(got, want) == 0, cfg
    # and the order matters here: a plain sequential f32 sum differs somewhere (or the shape
    # is one thread's chain anyway)
    seq = np.zeros(cols, F32)
    for i in range(rows):
        seq = seq + v[i]
    if cfg["split"]:
        assert _ndiff(got, seq) > 0 or rows < 8, cfg


# ---- 4. the kernels' configs -----------------------------------------------------------------------

CFG_ROWS = [1, 2, 3, 4, 7, 8, 15, 16, 17, 33, 63, 64, 100, 255, 256, 1000, 1020, 1021, 2048, 4096, 4097, 16384, 65536]
CFG_COLS = [1, 2, 3, 7, 8, 12, 31, 64, 127, 128, 129, 1000, 1001, 1024, 2048, 2560, 4096, 5120, 8160, 8192, 8195, 16384]


def test_the_kernels_configs_are_backward_pys():
    cxx = compiler()
    src = KSRC.read_text(encoding="utf-8")
    m = re.search(r"^// BEGIN kb_configs.*?\n(.*?)^// END kb_configs$", src, re.S | re.M)
    assert m, "kernels/rms_norm_llama_backward/kernel.cu lost its BEGIN/END kb_configs block"
    prog = ("#include <cstdio>\n#define KB_DEV static inline\ntypedef long long i64;\n" + m.group(1) + r"""
int main() {
  long long r, c, s;
  while (std::scanf("%lld %lld %lld", &r, &c, &s) == 3) {
    const KbRowCfg a = kb_row_cfg(r, c);
    const KbColCfg b = kb_col_cfg(r, c, s, 2048);
    std::printf("%d %d %d %d %d %d %d %d %d %lld\n", a.bw, a.bh, a.lanes, (int)a.vec, (int)a.split,
                b.bw, b.bh, (int)b.split, b.ctas, b.step);
  }
}
""")
    d = cache_dir("bwcfg-" + hashlib.sha256((cxx + prog).encode()).hexdigest()[:16])
    exe = d / "cfg"
    if not exe.exists():
        (d / "cfg.cpp").write_text(prog, encoding="utf-8")
        subprocess.run([cxx, "-std=c++17", "-O1", str(d / "cfg.cpp"), "-o", str(exe)], check=True)
    cases = [(r, c, s) for r in CFG_ROWS for c in CFG_COLS for s in (1, 114, 132)]
    out = subprocess.run([str(exe)], input="".join(f"{r} {c} {s}\n" for r, c, s in cases),
                         capture_output=True, text=True, check=True).stdout.split("\n")
    bad = []
    for (r, c, s), ln in zip(cases, out):
        got = tuple(int(v) for v in ln.split())
        try:
            rc = B.row_config(r, c)
            row = (rc["bw"], rc["bh"], rc["lanes"], int(rc["vec"]), int(rc["split"]))
        except ValueError:  # the multi-CTA row reduce: the kernel does not follow it
            row = got[:5]
        cc = B.col_config(r, c, num_sms=s)
        col = (cc["bw"], cc["bh"], int(cc["split"]), cc["ctas"], cc["step_input"])
        if got != row + col:
            bad.append(f"[{r}, {c}] sms {s}: kernel {got}, backward.py {row + col}")
    assert not bad, "\n".join(bad[:10])


# ---- 5. the kernels on the CPU ---------------------------------------------------------------------


MAIN = r"""
%PRELUDE%
#define ENTRIES(N) \
  extern "C" void %P%dx_##N(void*, float*, const void*, const void*, const void*, long long, long long, float); \
  extern "C" void %P%dwp_##N(float*, const void*, const void*, long long, long long, long long, long long); \
  extern "C" void %P%dw_##N(void*, const float*, long long, long long, long long, long long);
ENTRIES(bf16) ENTRIES(f16) ENTRIES(f32)
int main(int argc, char** argv) {
  return kz_each_job(argv[1], [](std::istringstream& ss, const std::string& line) {
    std::string dt, in, out; long long rows, cols, sms, ctas; float eps; unsigned gdx, gdw;
    ss >> dt >> rows >> cols >> eps >> sms >> ctas >> gdx >> gdw >> in >> out;
    const size_t es = dt == "f32" ? 4 : 2, ne = (size_t)(rows * cols);
    std::ifstream f(in, std::ios::binary);
    std::vector<unsigned char> buf((std::istreambuf_iterator<char>(f)), {});
    auto al = [](size_t b) { return (unsigned char*)std::aligned_alloc(256, (b + 255) / 256 * 256 + 256); };
    unsigned char *x = al(es * ne), *dy = al(es * ne), *w = al(es * cols), *dx = al(es * ne), *dw = al(es * cols);
    float* ws = (float*)al(4 * (size_t)(rows + ctas * cols));
    std::memcpy(x, buf.data(), es * ne);
    std::memcpy(dy, buf.data() + es * ne, es * ne);
    std::memcpy(w, buf.data() + 2 * es * ne, es * cols);
    std::memset(dx, 0xA7, es * ne); std::memset(dw, 0xA7, es * cols);
    void (*fdx)(void*, float*, const void*, const void*, const void*, long long, long long, float);
    void (*fdwp)(float*, const void*, const void*, long long, long long, long long, long long);
    void (*fdw)(void*, const float*, long long, long long, long long, long long);
    if (dt == "bf16") { fdx = %P%dx_bf16; fdwp = %P%dwp_bf16; fdw = %P%dw_bf16; }
    else if (dt == "f16") { fdx = %P%dx_f16; fdwp = %P%dwp_f16; fdw = %P%dw_f16; }
    else { fdx = %P%dx_f32; fdwp = %P%dwp_f32; fdw = %P%dw_f32; }
    g_call = [=] { fdx(dx, ws, dy, x, w, rows, cols, eps); };
    kzcpu::launch(uint3{gdx, 1, 1}, uint3{512, 1, 1}, tramp);
    g_call = [=] { fdwp(ws, dy, x, rows, cols, sms, 2048); };
    kzcpu::launch(uint3{gdw, 1, 1}, uint3{128, 1, 1}, tramp);
    g_call = [=] { fdw(dw, ws, rows, cols, sms, 2048); };
    kzcpu::launch(uint3{(unsigned)((cols + 127) / 128), 1, 1}, uint3{128, 1, 1}, tramp);
    std::ofstream of(out, std::ios::binary);
    of.write((const char*)dx, es * ne);
    of.write((const char*)dw, es * cols);
    of.write((const char*)ws, 4 * rows);
    return 0;
  });
}
"""


# The verifier's reference of the op (verifier/src/reference.cu, its layers up to the verifier's
# utilities): the same three entries, written independently of the kernel.
REF_SRC = REPO / "verifier" / "src" / "reference.cu"
SOURCES = {
    "kernel": (lambda: KSRC.read_text(encoding="utf-8"), "rms_norm_llama_bwd_"),
    "reference": (lambda: REF_SRC.read_text(encoding="utf-8").split("// Verifier utility")[0],
                  "ref_rms_norm_backward_llama_"),
}


@lru_cache(maxsize=2)
def _runner(which: str = "kernel") -> Path:
    read, prefix = SOURCES[which]
    return build_own_main("bw-", MAIN.replace("%P%", prefix), read())


def _harness_rsqrt(v):
    v = np.asarray(v, F32)
    return (F32(1) / np.sqrt(v)).astype(F32)  # harness.h: rsqrtf(v) = 1.0f / sqrtf(v)


# (rows, cols, sms, dx grid, dwp grid): every row class of the row order, misaligned rows
# (cols % 4 != 0, single elements <= 128, 512 lanes split), and the column order with and
# without the warp-row split and the global reduce (few SMs make it start at small shapes)
KERNEL_CASES = [
    (1, 64, 132, 1, 1), (2, 1001, 132, 1, 3), (3, 4099, 132, 2, 2), (5, 2048, 132, 1, 1),
    (7, 8192, 132, 3, 1), (9, 129, 132, 2, 2), (15, 1003, 132, 1, 2), (16, 4096, 132, 1, 4),
    (17, 8195, 132, 2, 3), (33, 100, 132, 1, 1), (64, 1024, 132, 2, 5), (70, 12, 132, 1, 2),
    (300, 7, 132, 3, 2), (530, 10, 2, 2, 3), (1100, 16, 1, 4, 7), (2100, 64, 1, 5, 9),
    (1100, 512, 5, 4, 9),  # the model widths' block (32 x 4, output 4-vectors) with 18 CTAs
    # dx's rows kept in registers between its passes (a lane's 4-vectors fit KB_DX_NV): with the
    # split row's two trees by shuffles (8168, 8192: some lanes short of a vector), 32-lane rows
    # (500), and the shared-memory trees of decode rows (3 x 4096)
    (20, 8168, 132, 3, 2), (33, 8192, 132, 5, 4), (40, 500, 132, 1, 2), (3, 4096, 132, 2, 2),
]


@pytest.mark.parametrize("which", ["kernel", "reference"])
def test_the_kernels_on_the_cpu_equal_the_emulation(which):
    # the bundled kernel's entries, and the verifier's reference of the op (what a candidate is
    # measured against): each equal to the emulation, so to each other
    exe = _runner(which)
    d = Path(tempfile.mkdtemp(prefix="kz-bw-cases-"))
    rng = np.random.default_rng(20261127)
    jobs, meta = [], []
    for i, (rows, cols, sms, gdx, gdw) in enumerate(KERNEL_CASES):
        for dt in DTYPES:
            x = B.round_to(rng.standard_normal((rows, cols)), dt)
            dy = B.round_to(rng.standard_normal((rows, cols)), dt)
            w = B.round_to(1 + 0.2 * rng.standard_normal(cols), dt)
            fin = d / f"in{i}{dt}"
            fin.write_bytes(to_raw(x, dt) + to_raw(dy, dt) + to_raw(w, dt))
            ctas = B.col_config(rows, cols, num_sms=sms)["ctas"]
            jobs.append(f"{dt} {rows} {cols} 1e-6 {sms} {ctas} {gdx} {gdw} {fin} {d / f'out{i}{dt}'}")
            meta.append((i, dt, rows, cols, sms, x, dy, w))
    (d / "jobs").write_text("\n".join(jobs) + "\n", encoding="utf-8")
    r = subprocess.run([str(exe), str(d / "jobs")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    bad = []
    for i, dt, rows, cols, sms, x, dy, w in meta:
        raw = (d / f"out{i}{dt}").read_bytes()
        es = 4 if dt == "f32" else 2
        kdx = from_raw(raw[:es * rows * cols], dt).reshape(rows, cols)
        kdw = from_raw(raw[es * rows * cols:es * (rows * cols + cols)], dt)
        kr = np.frombuffer(raw[es * (rows * cols + cols):], F32)
        edx, edw, parts = B.llama_rms_norm_backward(x, w, dy, 1e-6, dt, rsqrt=_harness_rsqrt,
                                                    num_sms=sms, return_parts=True)
        nr, ndx, ndw = _ndiff(kr, parts["r"]), _ndiff(kdx, edx), _ndiff(kdw, edw)
        if nr or ndx or ndw:
            bad.append(f"{dt} [{rows}, {cols}] sms {sms}: r {nr}, dx {ndx}/{rows * cols}, dw {ndw}/{cols}")
    assert not bad, "\n".join(bad)


def test_the_autograd_graph_is_the_documented_one():
    # docs/backward.md's nodes (the graph does not depend on the device)
    torch = _torch()

    def names(fn, out):
        if fn is None:
            return out
        out.append(type(fn).__name__)
        for f, _ in fn.next_functions:
            names(f, out)
        return out

    for T, want in [(torch.bfloat16, ["MulBackward0", "AccumulateGrad", "ToCopyBackward0", "MulBackward0",
                                      "ToCopyBackward0", "AccumulateGrad", "RsqrtBackward0", "AddBackward0",
                                      "MeanBackward1", "PowBackward0", "ToCopyBackward0", "AccumulateGrad"]),
                    (torch.float32, ["MulBackward0", "AccumulateGrad", "MulBackward0", "AccumulateGrad",
                                     "RsqrtBackward0", "AddBackward0", "MeanBackward1", "PowBackward0",
                                     "AccumulateGrad"])]:
        x = torch.randn(2, 8).to(T).requires_grad_(True)
        w = torch.ones(8, dtype=T, requires_grad=True)
        y = _hf_llama_rms_norm(torch, x, w, 1e-6)
        assert names(y.grad_fn, []) == want, T


@pytest.mark.parametrize("seed", [0, 1])
def test_eager_f32_sums_the_input_gradient_in_three_terms(seed):
    """Why mode "training" takes no backward kernel in f32 (docs/backward.md): with the norm's
    input also on the residual stream, eager's f32 input gradient is ((residual + x*r path) +
    pow path), in autograd's order; one dx from a kernel (mul + pow summed first) plus the
    residual's gives other bits. In bf16 the cast node sums the two first, as a kernel does."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(seed)
    rows, cols, eps = 32, 256, 1e-6
    for dt in (torch.float32, torch.bfloat16):
        x0 = torch.randn(rows, cols, generator=g).to(dt)
        w = (torch.rand(cols, generator=g) + 0.5).to(dt)
        lin = (torch.randn(cols, cols, generator=g) / 16).to(dt)
        gy = torch.randn(rows, cols, generator=g).to(dt)

        def parts(hm, hp):  # HF LlamaRMSNorm after its cast, the two uses of it apart
            v = hp.pow(2).mean(-1, keepdim=True)
            return w * (hm * torch.rsqrt(v + eps)).to(dt)

        def hf(x):          # HF LlamaRMSNorm: one cast, used twice
            h = x.to(torch.float32)
            return parts(h, h)

        x = x0.clone().requires_grad_()
        (x + hf(x) @ lin).backward(gy)
        gn = gy @ lin.T     # the norm's output gradient, as autograd's mm backward gives it
        if dt == torch.float32:
            xa, xb = x0.clone().requires_grad_(), x0.clone().requires_grad_()
            g_mul, g_pow = torch.autograd.grad(parts(xa, xb), (xa, xb), gn)
            assert torch.equal(x.grad, (gy + g_mul) + g_pow)
            assert not torch.equal(x.grad, gy + (g_mul + g_pow))
        else:
            x1 = x0.clone().requires_grad_()
            (dx,) = torch.autograd.grad(hf(x1), (x1,), gn)
            assert torch.equal(x.grad, gy + dx)
