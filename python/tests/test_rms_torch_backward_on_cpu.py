"""F.rms_norm's backward (op rms_norm_backward, semantics torch; docs/backward-rms-torch.md) on the
CPU: the emulation of eager autograd (kernelize/backward_rms_torch.py), the bundled kernel
(kernels/rms_norm_torch_backward/kernel.cu) and the verifier's reference of the semantics
(verifier/src/reference.cu) under the CPU harness (python/tests/cuda_on_cpu: fibers for threads).

1. The emulation's forward rstd equals scripts/eager_order.py's model of F.rms_norm's forward (the
   one that matched eager on an H200 in every row, docs/eager-order.md (c)) in both of its orders.
2. The emulation's dx and dw are within a tolerance of the f64 gradient of F.rms_norm (CPU torch
   autograd in float64): the chain is the right function.
3. The kernel's three entries and the reference's, bf16 / f16 / f32, at every chain count of
   eager's column sum (rows < 64, < 128, < 256, above), both of dwp's modes (the chains left in the
   workspace where Reduce.cuh's ctas reaches bdy, else the tree in the block), the forward's two
   orders (cols % 4), rows of one element to several 512-element spans, at several grids: r, dx and
   dw equal the emulation bit for bit, and nothing is written past the workspace's rows + ctas *
   cols floats.
4. Order slips in the kernel's source are caught by the same comparison.

What only a GPU tells: that eager runs these orders there (scripts/rms_torch_backward_probe.py).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

REPO = Path(__file__).resolve().parents[2]
KSRC = REPO / "kernels" / "rms_norm_torch_backward" / "kernel.cu"
REF_SRC = REPO / "verifier" / "src" / "reference.cu"
sys.path.insert(0, str(REPO / "python"))

from kernelize import backward as B  # noqa: E402
from kernelize import backward_rms_torch as RT  # noqa: E402
from cpu_harness import build_own_main, from_raw, to_raw  # noqa: E402

F32 = np.float32
DTYPES = ["bf16", "f16", "f32"]


def _ndiff(a, b) -> int:
    a = np.asarray(a, F32).reshape(-1)
    b = np.asarray(b, F32).reshape(-1)
    return int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))


def _eager_order():
    spec = importlib.util.spec_from_file_location("eager_order", REPO / "scripts" / "eager_order.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _inputs(dt, rows, cols, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    x = B.round_to(scale * rng.standard_normal((rows, cols)), dt)
    dy = B.round_to(rng.standard_normal((rows, cols)), dt)
    w = B.round_to(1 + 0.2 * rng.standard_normal(cols), dt)
    return x, dy, w


@pytest.mark.parametrize("rows,cols", [(3, 1024), (5, 1000), (2, 4099), (4, 1001), (7, 12), (3, 600)])
def test_the_forward_rstd_is_the_verified_forward_model(rows, cols):
    E = _eager_order()
    for dt in DTYPES:
        x, _, w = _inputs(dt, rows, cols, seed=rows * 7 + cols, scale=3.0)
        _, want, path = E.eager_rms_norm(x, w, eps=1e-6, rsqrt=RT.rsqrt_f32)
        assert path == ("vectorized" if cols % 4 == 0 else "rowwise")
        assert _ndiff(RT.forward_rstd(x, 1e-6), want) == 0, (dt, rows, cols)


def test_the_emulation_is_the_gradient_of_rms_norm():
    torch = pytest.importorskip("torch")
    for dt, tol in [("bf16", 2e-2), ("f16", 3e-3), ("f32", 2e-5)]:
        for rows, cols in [(1, 64), (7, 1001), (70, 768), (300, 96)]:
            x, dy, w = _inputs(dt, rows, cols, seed=rows + 3 * cols)
            r = RT.forward_rstd(x, 1e-6)
            dx, dw = RT.rms_norm_backward(dy, x, w, r, dt)
            xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
            wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
            torch.nn.functional.rms_norm(xt, [cols], wt, 1e-6).backward(torch.tensor(dy, dtype=torch.float64))
            for got, want in [(dx, xt.grad.numpy()), (dw, wt.grad.numpy())]:
                err = np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30)
                assert err < tol, (dt, rows, cols, err)


# A runner of its own: the ABI of rms_norm_backward (dx, dwp, dw); the workspace is exactly
# rows + ctas * cols floats followed by 64 guard floats, which must come back untouched.
# Jobs, one a line: DT ROWS COLS EPS SMS WSF GRID_DX GRID_DWP IN OUT; OUT receives dx, dw (raw DT),
# r (rows f32) and a guard flag (f32 1 = intact).
MAIN = r"""
%PRELUDE%
#define ENTRIES(N) \
  extern "C" void %P%dx_##N(void*, float*, const void*, const void*, const void*, long long, long long, float); \
  extern "C" void %P%dwp_##N(float*, const void*, const void*, long long, long long, long long, long long); \
  extern "C" void %P%dw_##N(void*, const float*, long long, long long, long long, long long);
ENTRIES(bf16) ENTRIES(f16) ENTRIES(f32)
int main(int argc, char** argv) {
  return kz_each_job(argv[1], [](std::istringstream& ss, const std::string& line) {
    std::string dt, in, out; long long rows, cols, sms, wsf; float eps; unsigned gdx, gdw;
    ss >> dt >> rows >> cols >> eps >> sms >> wsf >> gdx >> gdw >> in >> out;
    if (!ss) { std::fprintf(stderr, "bad job: %s\n", line.c_str()); return 2; }
    const size_t es = dt == "f32" ? 4 : 2, ne = (size_t)(rows * cols);
    std::ifstream f(in, std::ios::binary);
    std::vector<unsigned char> buf((std::istreambuf_iterator<char>(f)), {});
    auto al = [](size_t b) { return (unsigned char*)std::aligned_alloc(256, (b + 255) / 256 * 256 + 256); };
    unsigned char *x = al(es * ne), *dy = al(es * ne), *w = al(es * cols), *dx = al(es * ne), *dw = al(es * cols);
    float* ws = (float*)al(4 * (size_t)(wsf + 64));
    for (long long i = 0; i < wsf + 64; ++i) ws[i] = -12345.0f;
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
    float guard = 1.0f;
    for (long long i = wsf; i < wsf + 64; ++i) if (ws[i] != -12345.0f) guard = 0.0f;
    std::ofstream of(out, std::ios::binary);
    of.write((const char*)dx, es * ne);
    of.write((const char*)dw, es * cols);
    of.write((const char*)ws, 4 * rows);
    of.write((const char*)&guard, 4);
    std::free(x); std::free(dy); std::free(w); std::free(dx); std::free(dw); std::free(ws);
    return 0;
  });
}
"""

SOURCES = {
    "kernel": (lambda: KSRC.read_text(encoding="utf-8"), "rms_norm_torch_bwd_"),
    "reference": (lambda: REF_SRC.read_text(encoding="utf-8").split("// Verifier utility")[0],
                  "ref_rms_norm_backward_torch_"),
}


@lru_cache(maxsize=4)
def _runner(src: str, prefix: str) -> Path:
    return build_own_main("rtbw-", MAIN.replace("%P%", prefix), src)


# (rows, cols, sms, dx grid, dwp grid): eager's chain counts (bdy 1 / 8 / 16 / 32), the forward's
# two orders (cols % 4 == 0: 128 lanes of 4-vectors; else 512 lanes of Welford), rows shorter
# than a warp's span and longer than several 512-element spans, groups of the dx block left idle
# (rows not a multiple of 4, grids beyond the rows), dwp's two modes: (4100, 64, 132) leaves the
# 32 chains in the workspace (Reduce.cuh's ctas 33 >= 32), (4100, 64, 1) runs the tree in the
# block (ctas 16), as every case under 256 rows... and (300, 7) with ctas 1.
KERNEL_CASES = [
    (1, 64, 132, 1, 1), (2, 1001, 132, 1, 3), (3, 4099, 132, 2, 2), (7, 4096, 132, 3, 1),
    (9, 129, 132, 2, 2), (33, 100, 132, 1, 1), (63, 1000, 132, 2, 2), (64, 1024, 132, 2, 5),
    (100, 127, 132, 3, 2), (128, 768, 132, 1, 3), (200, 1001, 132, 4, 2), (256, 96, 132, 2, 7),
    (300, 7, 132, 3, 2), (520, 100, 132, 5, 3), (17, 2051, 132, 2, 3), (5, 2048, 132, 9, 1),
    (4100, 64, 132, 6, 9), (4100, 64, 1, 6, 9),
]


def _run(which: str, cases, src: str | None = None, eps: float = 1e-6) -> list[str]:
    read, prefix = SOURCES[which]
    exe = _runner(src if src is not None else read(), prefix)
    d = Path(tempfile.mkdtemp(prefix="kz-rtbw-"))
    jobs, meta = [], []
    for i, (rows, cols, sms, gdx, gdw) in enumerate(cases):
        for dt in DTYPES:
            x, dy, w = _inputs(dt, rows, cols, seed=1000 * rows + cols)
            if i % 3 == 1:   # some zero and negative-zero inputs, a zero row
                x[0, : min(cols, 5)] = 0.0
                dy[-1, : min(cols, 3)] = -0.0
            fin = d / f"in{i}{dt}"
            fin.write_bytes(to_raw(x, dt) + to_raw(dy, dt) + to_raw(w, dt))
            wsf = rows + B.col_config(rows, cols, num_sms=sms)["ctas"] * cols
            jobs.append(f"{dt} {rows} {cols} {eps} {sms} {wsf} {gdx} {gdw} {fin} {d / f'out{i}{dt}'}")
            meta.append((i, dt, rows, cols, sms, x, dy, w))
    (d / "jobs").write_text("\n".join(jobs) + "\n", encoding="utf-8")
    r = subprocess.run([str(exe), str(d / "jobs")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    bad = []
    for i, dt, rows, cols, sms, x, dy, w in meta:
        raw = (d / f"out{i}{dt}").read_bytes()
        es = 4 if dt == "f32" else 2
        ne = rows * cols
        kdx = from_raw(raw[:es * ne], dt).reshape(rows, cols)
        kdw = from_raw(raw[es * ne:es * (ne + cols)], dt)
        tail = raw[es * (ne + cols):]
        kr = np.frombuffer(tail[:4 * rows], F32)
        guard = np.frombuffer(tail[4 * rows:], F32)[0]
        er, edx, edw = RT.rms_norm_backward_from_x(dy, x, w, eps, dt, sms=sms)
        n = (_ndiff(kr, er), _ndiff(kdx, edx), _ndiff(kdw, edw))
        if any(n) or guard != 1.0:
            bad.append(f"{dt} [{rows}, {cols}] sms {sms}: r {n[0]}/{rows}, dx {n[1]}/{ne}, dw {n[2]}/{cols}, "
                       f"workspace guard {'intact' if guard == 1.0 else 'written'}")
    return bad


@pytest.mark.parametrize("which", ["kernel", "reference"])
def test_the_kernel_and_the_reference_on_the_cpu_equal_the_emulation(which):
    bad = _run(which, KERNEL_CASES)
    assert not bad, "\n".join(bad)


MUTATIONS = [
    # s2's product in another order: (dy * (w * x)) instead of ((dy * w) * x)
    ("s2 product order", "s2 = fmaf(__fmul_rn(__fmul_rn(gv[i], wv[i]), hv[i]), r, s2)",
     "s2 = fmaf(__fmul_rn(gv[i], __fmul_rn(wv[i], hv[i])), r, s2)", [(5, 1000, 132, 1, 1)]),
    # dx's other contraction: fma(-Bv, s2, fl(A * dy))
    ("dx contraction", "const float f1 = fmaf(__fmul_rn(fH, wv[i]), gv[i], -__fmul_rn(__fmul_rn(hv[i], r), s2));",
     "const float f1 = fmaf(-__fmul_rn(hv[i], r), s2, __fmul_rn(__fmul_rn(fH, wv[i]), gv[i]));",
     [(5, 1000, 132, 1, 1)]),
    # the GPU check's red-team variants (verifier/tests/gpu.rs torch_backward/*): s2's add and
    # dw's chain adds in two roundings each
    ("s2 unfused", "if (i < n) s2 = fmaf(__fmul_rn(__fmul_rn(gv[i], wv[i]), hv[i]), r, s2);",
     "if (i < n) s2 = __fadd_rn(s2, __fmul_rn(__fmul_rn(__fmul_rn(gv[i], wv[i]), hv[i]), r));",
     [(64, 1024, 132, 2, 2)]),
    ("dw chains unfused", "for (int i = 0; i < 8; ++i) acc = fmaf(__fmul_rn(gv[i], hv[i]), rv[i], acc);",
     "for (int i = 0; i < 8; ++i) acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(gv[i], hv[i]), rv[i]));",
     [(300, 96, 132, 2, 2)]),
    # the forward's 4 warp sums in order ((w0 + w1) + w2) + w3
    ("forward warp tree", "__fadd_rn(__fadd_rn(kt_wsq[g][0], kt_wsq[g][2]), __fadd_rn(kt_wsq[g][1], kt_wsq[g][3]))",
     "__fadd_rn(__fadd_rn(__fadd_rn(kt_wsq[g][0], kt_wsq[g][1]), kt_wsq[g][2]), kt_wsq[g][3])",
     [(6, 4096, 132, 2, 1)]),
    # dw's chains 0 and 1 swapped (in the block; the halving tree then pairs chain 1 with chain 16:
    # a swap of all chains by XOR or a rotation would not do, the tree is symmetric under both)
    ("chains swapped", "kt_chain<T>(dy, x, r, rows, cols, c, c < cols, bdy == 1 ? 8 : R, 8 * (i64)y)",
     "kt_chain<T>(dy, x, r, rows, cols, c, c < cols, bdy == 1 ? 8 : R, 8 * (i64)(y < 2 ? 1 - y : y))",
     [(300, 7, 132, 2, 2)]),
    # the same in dwp's other mode (the chains left in the workspace)
    ("chains swapped in ws", "kt_chain<T>(dy, x, r, rows, cols, c, c < cols, R, 8 * y)",
     "kt_chain<T>(dy, x, r, rows, cols, c, c < cols, R, 8 * (y < 2 ? 1 - y : y))", [(4100, 64, 132, 6, 9)]),
]


@pytest.mark.parametrize("name,old,new,cases", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_an_order_slip_in_the_kernel_is_caught(name, old, new, cases):
    src = KSRC.read_text(encoding="utf-8")
    assert old in src, name
    bad = _run("kernel", cases, src=src.replace(old, new))
    assert bad, f"the mutation '{name}' was not caught"


def test_nvrtc_compiles_it_with_every_rounding_explicit():
    # no GPU needed: NVRTC takes the source for sm_90; its PTX has no contractible f32 arithmetic
    # (add/sub/mul without .rn, which ptxas may fuse) and is the same with --fmad=false
    import re
    from kernelize import nvrtc as N
    try:
        nv = N.load_nvrtc()
    except N.NvrtcNotFound:
        pytest.skip("no libnvrtc here")
    inc, _ = N.include_dir_for_client()
    src = KSRC.read_text(encoding="utf-8")
    opts = [f"--include-path={inc}"]
    N.compile_program(src, "rms_norm_torch_backward.cu", ["--gpu-architecture=sm_90", *opts], nv)

    def ptx(*extra):
        code = N.compile_program(src, "rms_norm_torch_backward.cu",
                                 ["--gpu-architecture=compute_90", *opts, *extra], nv).code
        return "\n".join(ln for ln in code.decode("utf-8", "replace").rstrip("\0").splitlines()
                         if not ln.startswith("//"))

    fused, unfused = ptx(), ptx("--fmad=false")
    entries = re.findall(r"\.entry (\w+)", fused)
    assert sorted(entries) == sorted(f"rms_norm_torch_bwd_{e}_{dt}" for e in ("dx", "dwp", "dw")
                                     for dt in DTYPES)
    loose = re.findall(r"\b(?:add|sub|mul|fma|mad)(?:\.ftz)?(?:\.sat)?\.f32\b", fused)
    assert not loose, f"contractible f32 arithmetic in the PTX: {sorted(set(loose))}"
    assert fused == unfused, "the PTX depends on --fmad: some product was left to the compiler"


def test_the_gpu_probe_runs_dry_on_the_cpu(tmp_path):
    # scripts/rms_torch_backward_probe.py's code paths (eager autograd on the CPU, the emulation
    # for the kernel, NVRTC where found): it runs, writes its JSON and raises nothing
    import json
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "rms_torch_backward_probe.py"), str(tmp_path),
                        "--dry-run"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads((tmp_path / "rms_torch_backward_probe.json").read_text(encoding="utf-8"))
    assert rep["dry_run"] and not rep["errors"]
    assert {c["dtype"] for c in rep["cases"]} == set(DTYPES)
    assert all("emu_dx_diff" in c for c in rep["cases"]) and rep["timing"]
