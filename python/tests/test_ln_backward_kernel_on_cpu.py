"""nn.LayerNorm's backward kernel (op layer_norm_backward: kernels/layer_norm_backward/kernel.cu,
bundled) and the verifier's reference of the op (verifier/src/reference.cu) run on the CPU under cuda_on_cpu/harness.h (fibers standing for threads),
against the emulation of eager autograd in kernelize/backward_ln.py (docs/backward-layer-norm.md).

1. Both entries (ln_bwd_dx_*, ln_bwd_dwdb_*), bf16 / f16 / f32, every rows x cols of the grid
   below (each dw/db variant: rows < 64, 64..127, 128..255, >= 256; cols below and above one
   block's 512-element span, cols % 4 != 0, cols >= 4096 and even: dw/db's two columns a
   thread), aligned tensors (eager's vectorized dx kernel) and tensors one element off a 16-byte
   boundary (its plain kernel; the emulator models both with the vectorized kernel's order; dw/db
   one column a thread there), at several grids and dw/db blocks (tile widths 8, 16, 32; blockDim.y
   bdy(rows) or more; rows < 64 with blockDim.y = 1 and, staged through shared memory, > 1),
   plus rows whose last round of row groups is partial: dx, dw, db equal the emulation bit for bit.
2. Mutations of the source (the block reduce's warp sums read in another order; dw/db: two
   chains' rows swapped, a group's rows added backwards, the tree over the chains the other way
   round, the staged rows added backwards, the two columns of a 2-column load swapped; s1's two
   roundings fused into one multiply-add) are caught by the same comparison: the check sees
   order slips.
3. The dw/db entry traps with a block of fewer than bdy(rows) chains, a tile width other than 8,
   16, 32, and at rows > 65536 (eager's two-pass variant, not implemented).
4. NVRTC compiles the source for sm_90 (where libnvrtc is found), and its PTX has every f32
   rounding explicit: no add/sub/mul without .rn, and the same PTX with --fmad=false.

What only the GPU can tell: that the kernel compiled by NVRTC gives these bits there (CUDA's
fmaf, shuffles and shared memory: the bf16/f16 bits matched eager on an H200 in session 25), and
eager's f32 dx (the emulator's s1 follows eager's SASS since session 25, not yet run on a GPU).
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
KSRC = REPO / "kernels" / "layer_norm_backward" / "kernel.cu"
# The verifier's reference of the op (its layers up to the verifier's utilities), written apart
# from the kernel: its entries renamed to the kernel's for the runner.
REF_SRC = REPO / "verifier" / "src" / "reference.cu"
sys.path.insert(0, str(REPO / "python"))

from kernelize import backward_ln as L  # noqa: E402
from cpu_harness import build_own_main, from_raw, to_raw  # noqa: E402
from test_ln_backward_on_cpu import _inputs, _ndiff  # noqa: E402 (the emulator's tests' inputs)

F32 = np.float32
DTYPES = ["bf16", "f16", "f32"]

# A runner of its own (like test_backward_order_on_cpu.py): the entries' signatures are not one
# of main.cpp's kinds. Jobs, one a line: DT ROWS COLS OFFSET GRID_DX GRID_DWDB BLOCK_X BLOCK_Y IN OUT;
# IN holds x, dy (rows*cols), w (cols) as raw DTYPE, then mean, rstd (rows f32); every tensor is
# placed OFFSET elements past a 256-byte boundary. OUT receives dx, dw, db (raw DTYPE).
MAIN = r"""
%PRELUDE%
#define ENTRIES(N) \
  extern "C" void ln_bwd_dx_##N(void*, const void*, const void*, const float*, const float*, const void*, long long, long long); \
  extern "C" void ln_bwd_dwdb_##N(void*, void*, const void*, const void*, const float*, const float*, long long, long long);
ENTRIES(bf16) ENTRIES(f16) ENTRIES(f32)
int main(int argc, char** argv) {
  return kz_each_job(argv[1], [](std::istringstream& ss, const std::string& line) {
    std::string dt, in, out; long long rows, cols, off; unsigned gdx, gdw, bx, by;
    ss >> dt >> rows >> cols >> off >> gdx >> gdw >> bx >> by >> in >> out;
    if (!ss) { std::fprintf(stderr, "bad job: %s\n", line.c_str()); return 2; }
    const size_t es = dt == "f32" ? 4 : 2, ne = (size_t)(rows * cols), o = es * (size_t)off;
    std::ifstream f(in, std::ios::binary);
    std::vector<unsigned char> buf((std::istreambuf_iterator<char>(f)), {});
    if (buf.size() != es * (2 * ne + cols) + 8 * rows) { std::fprintf(stderr, "%s: bad size\n", in.c_str()); return 2; }
    auto al = [](size_t b) { return (unsigned char*)std::aligned_alloc(256, (b + 255) / 256 * 256 + 256); };
    unsigned char *x = al(es * ne + o), *dy = al(es * ne + o), *w = al(es * cols + o);
    unsigned char *dx = al(es * ne + o), *dw = al(es * cols + o), *db = al(es * cols + o);
    float *mean = (float*)al(4 * rows), *rstd = (float*)al(4 * rows);
    std::memcpy(x + o, buf.data(), es * ne);
    std::memcpy(dy + o, buf.data() + es * ne, es * ne);
    std::memcpy(w + o, buf.data() + 2 * es * ne, es * cols);
    std::memcpy(mean, buf.data() + es * (2 * ne + cols), 4 * rows);
    std::memcpy(rstd, buf.data() + es * (2 * ne + cols) + 4 * rows, 4 * rows);
    std::memset(dx, 0xA7, es * ne + o); std::memset(dw, 0xA7, es * cols + o); std::memset(db, 0xA7, es * cols + o);
    void (*fdx)(void*, const void*, const void*, const float*, const float*, const void*, long long, long long);
    void (*fgb)(void*, void*, const void*, const void*, const float*, const float*, long long, long long);
    if (dt == "bf16") { fdx = ln_bwd_dx_bf16; fgb = ln_bwd_dwdb_bf16; }
    else if (dt == "f16") { fdx = ln_bwd_dx_f16; fgb = ln_bwd_dwdb_f16; }
    else { fdx = ln_bwd_dx_f32; fgb = ln_bwd_dwdb_f32; }
    unsigned char *X = x + o, *DY = dy + o, *W = w + o, *DX = dx + o, *DW = dw + o, *DB = db + o;
    g_call = [=] { fdx(DX, DY, X, mean, rstd, W, rows, cols); };
    kzcpu::launch(uint3{gdx, 1, 1}, uint3{128, 1, 1}, tramp);
    g_call = [=] { fgb(DW, DB, DY, X, mean, rstd, rows, cols); };
    kzcpu::launch(uint3{gdw, 1, 1}, uint3{bx, by, 1}, tramp);
    std::ofstream of(out, std::ios::binary);
    of.write((const char*)DX, es * ne);
    of.write((const char*)DW, es * cols);
    of.write((const char*)DB, es * cols);
    std::free(x); std::free(dy); std::free(w); std::free(dx); std::free(dw); std::free(db);
    std::free(mean); std::free(rstd);
    return 0;
  });
}
"""


@lru_cache(maxsize=8)
def _runner(ksrc: str) -> Path:
    return build_own_main("lnbw-", MAIN, ksrc)


def _reference_source() -> str:
    """reference.cu's layers with its layer_norm_backward entries named as the kernel's."""
    src = REF_SRC.read_text(encoding="utf-8").split("// Verifier utility")[0]
    for stage in ("dx", "dwdb"):
        want = f"ref_layer_norm_backward_default_{stage}_##S("
        assert want in src, want
        src = src.replace(want, f"ln_bwd_{stage}_##S(")
    return src


def _bdy(rows: int) -> int:
    return L.gamma_beta_config(rows, 1)["bdy"]


def _run(ksrc: str, cases) -> list[str]:
    """cases: (dt, rows, cols, offset, grid_dx, grid_dwdb, block_x, block_y); the cases whose dx,
    dw or db differ from the emulation, described."""
    exe = _runner(ksrc)
    d = Path(tempfile.mkdtemp(prefix="kz-lnbw-"))
    jobs, meta = [], []
    for i, (dt, rows, cols, off, gdx, gdw, bx, by) in enumerate(cases):
        x, w, dy, mean, rstd = _inputs(dt, rows, cols, seed=1000 * rows + cols + 7 * off)
        fin = d / f"in{i}"
        fin.write_bytes(to_raw(x, dt) + to_raw(dy, dt) + to_raw(w, dt) + mean.tobytes() + rstd.tobytes())
        jobs.append(f"{dt} {rows} {cols} {off} {gdx} {gdw} {bx} {by} {fin} {d / f'out{i}'}")
        meta.append((i, dt, rows, cols, off, x, w, dy, mean, rstd))
    (d / "jobs").write_text("\n".join(jobs) + "\n", encoding="utf-8")
    r = subprocess.run([str(exe), str(d / "jobs")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    bad = []
    for i, dt, rows, cols, off, x, w, dy, mean, rstd in meta:
        raw = (d / f"out{i}").read_bytes()
        es = 4 if dt == "f32" else 2
        ne = rows * cols
        kdx = from_raw(raw[:es * ne], dt).reshape(rows, cols)
        kdw = from_raw(raw[es * ne:es * (ne + cols)], dt)
        kdb = from_raw(raw[es * (ne + cols):], dt)
        edx, edw, edb = L.layer_norm_backward(dy, x, w, mean, rstd, dt)
        n = (_ndiff(kdx, edx), _ndiff(kdw, edw), _ndiff(kdb, edb))
        if any(n):
            bad.append(f"{dt} [{rows}, {cols}] offset {off}: dx {n[0]}/{ne}, dw {n[1]}/{cols}, db {n[2]}/{cols}")
    return bad


ROWS = [1, 2, 7, 63, 64, 100, 128, 200, 256, 300]
COLS = [32, 96, 768, 1000, 1280, 4099, 4100]

# dw/db blocks (block_x, block_y) by bdy(rows), cycled through the grid's shapes: the (32, 32)
# block that always works; tight (x, bdy) blocks of each tile width; for rows < 64 the
# (32, 1) block (a thread walks its column's rows) and blocks with y > 1 (the rows staged
# through shared memory). The tile is block_x columns, or 2 * block_x (cols >= 4096, even,
# aligned): a grid of ceil(cols / block_x) blocks covers it either way (the spare ones idle).
BLOCKS = {1: [(32, 32), (32, 1), (32, 8), (8, 4), (16, 2)],
          8: [(32, 32), (8, 8), (16, 8), (32, 8), (8, 32)],
          16: [(32, 32), (8, 16), (16, 16), (32, 16), (16, 32)],
          32: [(32, 32), (8, 32), (16, 32), (32, 32), (8, 32)]}


def _grid_cases(dt):
    """Every rows x cols, aligned: dx with eager's launch (a block per row), dw/db with a block of
    BLOCKS (in turn) and a block per tile; at every third shape fewer blocks than rows / tiles
    (the loops)."""
    out = []
    for j, (rows, cols) in enumerate((r, c) for r in ROWS for c in COLS):
        bx, by = BLOCKS[_bdy(rows)][j % 5]
        tiles = -(-cols // bx)
        if j % 3 == 2:
            out.append((dt, rows, cols, 0, min(rows, 3), min(tiles, 2), bx, by))
        else:
            out.append((dt, rows, cols, 0, rows, tiles, bx, by))
    return out


# one element off a 16-byte boundary (eager's plain dx kernel; scalar loads in the kernel; dw/db
# one column a thread)
MISALIGNED = [(7, 1000), (63, 768), (100, 4099), (256, 96), (300, 1280), (100, 4100)]
# rows whose last round of row groups is partial or a single tile (bdy 32: rounds of 2 tiles of
# 256 rows with one 16-bit column a thread), with the probe's blocks
ROUNDS = [(520, 96, 8, 32), (1000, 100, 16, 32), (600, 1000, 8, 32)]


@pytest.mark.parametrize("dt", DTYPES)
def test_the_kernel_on_the_cpu_equals_the_emulation(dt):
    cases = _grid_cases(dt)
    cases += [(dt, r, c, 1, r, -(-c // 32), 32, 32) for r, c in MISALIGNED]
    cases += [(dt, r, c, 0, r, -(-c // bx), bx, by) for r, c, bx, by in ROUNDS]
    bad = _run(KSRC.read_text(encoding="utf-8"), cases)
    assert not bad, "\n".join(bad)


# (name, the source's text, its replacement, the cases that must catch it)
MUTATIONS = [
    # BlockReduceSum's second stage reads the warp sums as (w0, w2, w1, w3): ((w0+w1)+(w2+w3))
    ("warp-sums-order", "? lb_w2[lane] : 0.f", "? lb_w2[lane == 1 || lane == 2 ? 3 - lane : lane] : 0.f",
     [("f32", 64, 4099, 0, 64, 129, 32, 32), ("bf16", 100, 1280, 0, 100, 40, 32, 32)]),
    # dw/db: chains 0 and 1 take each other's rows, so the halving tree pairs them with others
    # (a permutation y -> a*y + b, a odd, would only reorder the operands of the tree's adds)
    ("chain-rows", "const i64 y8 = 8 * (i64)ty;", "const i64 y8 = 8 * (i64)(ty < 2 ? ty ^ 1 : ty);",
     [("f32", 300, 96, 0, 300, 3, 32, 32), ("bf16", 200, 768, 0, 200, 96, 8, 16)]),
    # dw/db: each group's 8 rows added last to first
    ("group-rows-backwards",
     "for (int i = 0; i < 8; ++i) {\n      const float m = __shfl_sync(0xffffffffu, ms[u], src | i);",
     "for (int i = 7; i >= 0; --i) {\n      const float m = __shfl_sync(0xffffffffu, ms[u], src | i);",
     [("f32", 300, 96, 0, 300, 12, 8, 32), ("bf16", 520, 96, 0, 520, 6, 16, 32)]),
    # dw/db, rows < 64 staged through shared memory: the rows added last to first
    ("staged-rows-backwards", "for (int row = 0; row < rows; ++row)\n        lb_gb_add(sg",
     "for (int row = rows - 1; row >= 0; --row)\n        lb_gb_add(sg",
     [("f32", 63, 96, 0, 63, 3, 32, 8), ("bf16", 40, 100, 0, 40, 13, 8, 4)]),
    # dw/db: the tree over the chains taken the other way round, ((v0 + v1) + (v2 + v3)) + ...
    ("tree-order", "for (int off = bdy / 2; off > 0; off >>= 1) {\n      __syncthreads();",
     "for (int off = 1; off < bdy; off <<= 1) {\n      __syncthreads();",
     [("f32", 300, 96, 0, 300, 3, 32, 32), ("bf16", 100, 768, 0, 100, 48, 16, 8)]),
    # dw/db, two bf16 columns a thread: the columns of a load swapped
    ("column-pair-swapped", "return __uint_as_float(j ? v & 0xffff0000u : v << 16);",
     "return __uint_as_float(j ? v << 16 : v & 0xffff0000u);",
     [("bf16", 100, 4100, 0, 100, 33, 16, 8)]),
    # s1 as one fused multiply-add instead of eager's two roundings (sessions 22-25's model)
    ("s1-fused", "s1 = __fadd_rn(s1, clg);", "s1 = fmaf(gv[i], wv[i], s1);",
     [("f32", 64, 1000, 0, 64, 32, 32, 32), ("f32", 7, 4099, 0, 7, 129, 32, 32)]),
]


@pytest.mark.parametrize("name,old,new,cases", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_an_order_slip_in_the_source_is_caught(name, old, new, cases):
    src = KSRC.read_text(encoding="utf-8")
    assert src.count(old) == 1, f"{name}: the mutated text is not in the kernel exactly once"
    assert not _run(src, cases), f"{name}: the unmutated kernel must pass these cases"
    bad = _run(src.replace(old, new), cases)
    assert bad, f"{name}: the mutant equals the emulation on every case"


@pytest.mark.parametrize("rows,cols,bx,by", [(300, 96, 32, 16), (100, 64, 32, 4), (65537, 1, 32, 32),
                                             (100, 64, 4, 8)])
def test_the_dwdb_entry_traps_where_it_cannot_follow_eager(rows, cols, bx, by, tmp_path):
    # a block with fewer than bdy(rows) chains, a tile width not 8, 16 or 32, and the two-pass
    # variant's rows (> 65536): __trap() (a block that is not whole warps traps too; the harness
    # runs whole warps only)
    exe = _runner(KSRC.read_text(encoding="utf-8"))
    x, w, dy, mean, rstd = _inputs("bf16", rows, cols, seed=5)
    fin = tmp_path / "in"
    fin.write_bytes(to_raw(x, "bf16") + to_raw(dy, "bf16") + to_raw(w, "bf16") + mean.tobytes() + rstd.tobytes())
    # grid 0 for dx: only the dw/db entry runs
    (tmp_path / "jobs").write_text(f"bf16 {rows} {cols} 0 0 1 {bx} {by} {fin} {tmp_path / 'out'}\n")
    r = subprocess.run([str(exe), str(tmp_path / "jobs")], capture_output=True, text=True)
    # (the harness's exit from inside a fiber may end in a signal rather than status 3)
    assert r.returncode != 0 and "kzcpu: __trap()" in r.stderr, (r.returncode, r.stderr[-500:])


def test_nvrtc_compiles_it_with_every_rounding_explicit():
    # no GPU needed: NVRTC (the verifier's compiler) takes the source for sm_90; its PTX has no
    # contractible f32 arithmetic (add/sub/mul without .rn, which ptxas may fuse), and is the same
    # with and without --fmad=false (so the front end contracted nothing either)
    from kernelize import nvrtc as N
    try:
        nv = N.load_nvrtc()
    except N.NvrtcNotFound:
        pytest.skip("no libnvrtc here")
    inc, _ = N.include_dir_for_client()
    src = KSRC.read_text(encoding="utf-8")
    opts = [f"--include-path={inc}"]
    N.compile_program(src, "layer_norm_backward.cu", ["--gpu-architecture=sm_90", *opts], nv)

    def ptx(*extra):
        code = N.compile_program(src, "layer_norm_backward.cu",
                                 ["--gpu-architecture=compute_90", *opts, *extra], nv).code
        return "\n".join(ln for ln in code.decode("utf-8", "replace").rstrip("\0").splitlines()
                         if not ln.startswith("//"))

    fused, unfused = ptx(), ptx("--fmad=false")
    entries = re.findall(r"\.entry (\w+)", fused)
    assert sorted(entries) == sorted(f"ln_bwd_{e}_{dt}" for e in ("dx", "dwdb") for dt in DTYPES)
    loose = re.findall(r"\b(?:add|sub|mul|fma|mad)(?:\.ftz)?(?:\.sat)?\.f32\b", fused)
    assert not loose, f"contractible f32 arithmetic in the PTX: {sorted(set(loose))}"
    assert re.search(r"\bfma\.rn\.f32\b", fused)
    assert fused == unfused, "the PTX depends on --fmad: some product was left to the compiler"


# The reference at the kernel's shapes (each dw/db chain count, cols % 4 != 0, one block's span),
# launched as the verifier launches it (dx a block a row; dw/db the launch rule's blocks, which
# the reference ignores: one thread a column), and at blocks and grids the rule never picks.
REF_CASES = [(dt, rows, cols, 0, rows, -(-cols // 32), 32, 32) for dt in DTYPES
             for rows in (1, 7, 63, 64, 127, 128, 255, 256, 300) for cols in (32, 1000, 4099)] + [
    ("bf16", 100, 4100, 0, 3, 1, 8, 8), ("f32", 520, 96, 0, 1, 2, 16, 32),
    ("f16", 33, 768, 1, 7, 5, 32, 8), ("f32", 300, 1280, 1, 300, 40, 8, 32)]


def test_the_reference_on_the_cpu_equals_the_emulation():
    # what a candidate is measured against: eager's order as the emulation models it, so the
    # bundled kernel (above) and the reference give the same bits
    bad = _run(_reference_source(), REF_CASES)
    assert not bad, "\n".join(bad)


def test_the_reference_test_catches_an_order_slip():
    # the same comparison fails for a reference whose column sum runs its chains' tree the other
    # way round, or whose dx adds s1 fused
    src = _reference_source()
    for old, new in [("for (int o = bdy / 2; o >= 1; o /= 2)", "for (int o = 1; o <= bdy / 2; o *= 2)"),
                     ("p1[t] = __fadd_rn(p1[t], gw);", "p1[t] = fmaf(f32_of(gr[e]), f32_of(w[e]), p1[t]);")]:
        assert src.count(old) == 1, old
        bad = _run(src.replace(old, new), [c for c in REF_CASES if c[0] == "f32" and c[1] >= 128][:4])
        assert bad, f"not caught: {new}"
