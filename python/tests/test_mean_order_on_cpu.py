"""The bundled row kernels' reduction orders, checked on the CPU (issue 14: eager's mean order at
every row count).

Three checks, none needing a GPU:

1. `kz_mean_cfg` in kernels/src/eager.cuh (Reduce.cuh's setReduceConfig, the block the kernels
   follow) is compiled with the host C++ compiler and compared with scripts/eager_order.py's
   `reduce_config` (the emulator that matched eager bit for bit on an H200) on a table of
   (rows, cols); with it, the facts kz_mean_norm's dispatch relies on.
2. The generated kernel.cu of every row kernel of the eager engine and the verifier's reference
   layers (verifier/src/reference.cu) run on the CPU under cuda_on_cpu/harness.h (each
   block's threads as fibers, warp shuffles and __syncthreads as barriers, IEEE float
   arithmetic), launched with the manifest's launch rule, on shapes with 1-33 rows, odd and
   aligned widths, both launch rules and the 8160-column boundary: the kernel's output (and
   residual) must equal the reference's bit for bit, as the verifier requires on the GPU.
3. The reference's HF LlamaRMSNorm / GemmaRMSNorm / residual add + norm outputs equal those
   computed from scripts/eager_order.py's `eager_mean_sq` (eager's mean order, per row count
   and row alignment).

The harness's rsqrtf is 1/sqrtf (not CUDA's), the same function in every code under test, so
(2) and (3) compare orders, not CUDA's math library. Skipped when no C++ compiler is found or
the machine is not x86-64. Builds are cached under $TMPDIR/kernelize-cuda-on-cpu
(KERNELIZE_CPU_CUDA_CACHE), keyed by the hash of their sources.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

from kernelize.manifest import launch_dims, parse_manifest_toml  # noqa: E402
from cpu_harness import build_runner, cache_dir, cxx as compiler  # noqa: E402
from conftest import load_script  # noqa: E402

F32 = np.float32
DTYPES = ["bf16", "f16", "f32"]
# kernel -> (ABI kind, reference entry prefix)
KERNELS = {
    "rms_norm_llama": ("rms", "ref_rms_norm_llama"),
    "rms_norm_gemma": ("rms", "ref_rms_norm_gemma"),
    "fused_add_rms_norm": ("fused", "ref_fused_add_rms_norm_default"),
    # declared llama, weight before rounding: the llama reference's function in f32 only
    "rms_norm_llama_wbr": ("rms", "ref_rms_norm_llama"),
    "rms_norm_torch": ("rms", "ref_rms_norm_torch"),
    "layer_norm": ("ln", "ref_layer_norm_default"),
}


def _eager_order():
    return load_script(REPO / "scripts" / "eager_order.py", "eager_order")


EO = _eager_order()


# ---- 1. the config --------------------------------------------------------------------------

CFG_ROWS = list(range(1, 41)) + [63, 64, 100, 255, 256, 333, 511, 512, 513, 1000, 2048, 4096, 65536]
CFG_COLS = (list(range(1, 140)) + [255, 256, 257, 511, 512, 513, 576, 768, 896, 960, 1000, 1001, 1024,
            1536, 2047, 2048, 2049, 2304, 2560, 3072, 3584, 4096, 4099, 5120, 7680, 7681, 8064,
            8065, 8128, 8129, 8159, 8160, 8161, 8192, 12289, 16384, 65536, 131072, 131073, 200000])


def _config_source() -> str:
    src = (REPO / "kernels" / "src" / "eager.cuh").read_text(encoding="utf-8")
    m = re.search(r"^// BEGIN kz_mean_cfg\n(.*?)^// END kz_mean_cfg$", src, re.S | re.M)
    assert m, "kernels/src/eager.cuh lost its `// BEGIN kz_mean_cfg` ... `// END kz_mean_cfg` block"
    return m.group(1)


@lru_cache(maxsize=1)
def _kernel_configs() -> dict[tuple[int, int], tuple[int, int, bool, int]]:
    cxx = compiler()
    body = _config_source()
    prog = ("#include <cstdio>\n#define KZ_DEV static inline\ntypedef long long i64;\n" + body + """
int main() {
  long long r, c;
  while (std::scanf("%lld %lld", &r, &c) == 2) {
    const KzCfg k = kz_mean_cfg(r, c);
    std::printf("%lld %lld %d %d %d %d %d\\n", r, c, k.bw, k.bh, (int)k.split, k.lanes, (int)k.vec);
  }
  return 0;
}
""")
    d = cache_dir(hashlib.sha256((cxx + prog).encode()).hexdigest()[:16])
    exe = d / "cfg"
    if not exe.exists():
        (d / "cfg.cpp").write_text(prog, encoding="utf-8")
        subprocess.run([cxx, "-std=c++17", "-O1", str(d / "cfg.cpp"), "-o", str(exe)], check=True)
    pairs = "".join(f"{r} {c}\n" for r in CFG_ROWS for c in CFG_COLS)
    out = subprocess.run([str(exe)], input=pairs, capture_output=True, text=True, check=True).stdout
    got = {}
    for ln in out.splitlines():
        r, c, bw, bh, split, lanes, vec = map(int, ln.split())
        got[(r, c)] = (bw, bh, bool(split), lanes, bool(vec))
    return got


def test_the_kernels_config_is_reduce_cuh_s():
    got = _kernel_configs()
    bad = []
    for (r, c), (bw, bh, split, lanes, vec) in got.items():
        e = EO.reduce_config(r, c)
        want = (e["block_width"], e["block_height"], e["split_across_warps"],
                e["block_width"] * (e["block_height"] if e["split_across_warps"] else 1), e["vectorize"])
        if (bw, bh, split, lanes, vec) != want:
            bad.append(f"[{r}, {c}]: kernel (bw, bh, split, lanes, vec) = {(bw, bh, split, lanes, vec)}, "
                       f"reduce_config {want}")
    assert len(got) == len(CFG_ROWS) * len(CFG_COLS)
    assert not bad, "\n".join(bad[:20])


def test_the_facts_the_dispatch_relies_on():
    # kz_mean_norm: cols <= 8160 runs one warp per row, so at most 512 lanes (16 per thread);
    # cols > 8160 runs 128 threads per row and needs 512 lanes at every row count; 16 rows and
    # more give bw = 32, bh = 16 (kz_rows's trees) above 128 columns and min(last_pow2, 32)
    # lanes of single elements up to 128; a split always has 512 lanes.
    for (r, c), (bw, bh, split, lanes, vec) in _kernel_configs().items():
        assert lanes & (lanes - 1) == 0 and 1 <= lanes <= 512, (r, c)
        assert vec == (c > 128), (r, c)
        if c > 8160:
            assert lanes == 512 and split, (r, c)
        if split:
            assert lanes == 512 or bh == 1, (r, c)
        if r >= 16 and c > 128:
            assert (bw, bh) == (32, 16) and split == (c > 8160), (r, c)
        if r >= 16 and c <= 128:
            assert lanes == min(EO.last_pow2(c), 32) and not split, (r, c)
        if c <= 128:
            assert not split and lanes <= 128, (r, c)
        if vec:
            assert bw >= 32, (r, c)


# ---- 2. the kernels and the reference on the CPU ---------------------------------------------

def _reference_source() -> str:
    src = (REPO / "verifier" / "src" / "reference.cu").read_text(encoding="utf-8")
    cut = src.find("// Verifier utility (not a reference layer)")
    assert cut > 0, "verifier/src/reference.cu: the reference layers end where `// Verifier utility` starts"
    return src[:cut]


@lru_cache(maxsize=1)
def _runner() -> Path:
    """The harness binary with every kernel of KERNELS and the reference layers (cached by the
    hash of everything it is built from)."""
    units = {name: ((REPO / "kernels" / name / "kernel.cu").read_text(encoding="utf-8"), [])
             for name in KERNELS}
    units["reference"] = (_reference_source(), [])
    syms = [f"{name}_{dt}" for name in KERNELS for dt in DTYPES]
    syms += sorted({f"{ref}_{dt}" for _, ref in KERNELS.values() for dt in DTYPES})
    return build_runner("", units, syms)


def _bits_of(x: np.ndarray, dt: str) -> tuple[bytes, np.ndarray]:
    """f32 values -> (raw bytes in dt, the values as f32 after rounding to dt)."""
    x = np.ascontiguousarray(x, dtype=F32)
    if dt == "f32":
        return x.tobytes(), x
    if dt == "bf16":
        v = EO.round_bf16(x)
        return (v.view(np.uint32) >> 16).astype(np.uint16).tobytes(), v
    v = x.astype(np.float16)
    return v.tobytes(), v.astype(F32)


def _round(v: np.ndarray, dt: str) -> np.ndarray:
    v = np.asarray(v, dtype=F32)
    if dt == "f32":
        return v
    if dt == "bf16":
        return EO.round_bf16(v)
    return v.astype(np.float16).astype(F32)


def _values(raw: bytes, dt: str) -> np.ndarray:
    if dt == "f32":
        return np.frombuffer(raw, F32)
    if dt == "bf16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(F32)
    return np.frombuffer(raw, np.float16).astype(F32)


def _raw_words(raw: bytes, dt: str) -> np.ndarray:
    return np.frombuffer(raw, np.uint32 if dt == "f32" else np.uint16)


# Shapes: every row class of the mean order (1, 2-3, 4-7, 8-15, >= 16) at widths that take each
# path: single elements (<= 128), 4-vectors with every alignment class (cols % 4), one warp per
# row up to 8160 (32 .. 512 lanes, with and without a split) and 128 threads above.
MEAN_ROWS = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33]
# 1004 and 12292: whole 4-vectors but not whole 16-byte chunks in bf16 and f16 (the streamed
# 4-vector paths, kz_rows and kz_mean_rows with VEC, below and above 8160 columns).
MEAN_COLS = [7, 31, 64, 100, 128, 129, 131, 255, 256, 514, 1001, 1002, 1003, 1004, 2048, 4096, 4099,
             8064, 8065, 8128, 8129, 8160, 8161, 8195, 12289, 12292]
LN_SHAPES = [(1, 100), (3, 1001), (7, 2048), (16, 1003), (17, 4096), (2, 8192), (5, 8195), (3, 1004),
             (17, 1004), (2, 4100), (20, 4100)]


def _cases():
    out = []
    for name in ("rms_norm_llama", "fused_add_rms_norm", "rms_norm_gemma"):
        for dt in DTYPES:
            for rows in MEAN_ROWS:
                for cols in MEAN_COLS:
                    if name != "rms_norm_llama" and (rows, cols) not in {(1, 1001), (3, 4099), (5, 8065), (9, 128),
                                                                          (15, 8161), (17, 1003), (2, 12289)}:
                        continue
                    out.append((name, dt, rows, cols))
    for rows, cols in [(1, 4096), (6, 1001), (20, 8195)]:
        out.append(("rms_norm_llama_wbr", "f32", rows, cols))
    for name in ("rms_norm_torch", "layer_norm"):
        for dt in DTYPES:
            for rows, cols in LN_SHAPES:
                out.append((name, dt, rows, cols))
    return [c + (SMS,) for c in out] + _staged_cases()


# The SM count the launch rules are given. With 132 (an H100's) every row count above has a
# block per row, so the aligned model widths take the decode engine (kz_direct); the staged
# engine (tiles of rows, persistent blocks looping) is exercised with one SM's grid instead.
SMS = 132


def _staged_cases():
    out = []
    for name in ("rms_norm_llama", "fused_add_rms_norm", "rms_norm_torch", "layer_norm"):
        for dt in DTYPES:
            for rows in (4, 9, 17, 33):
                for cols in (256, 2048, 4096, 8128):
                    if name != "rms_norm_llama" and (rows + cols) % 3:
                        continue
                    out.append((name, dt, rows, cols, 1))
    return out


@lru_cache(maxsize=1)
def _run_all():
    """Runs every case's kernel and reference once; returns {case: (inputs, kernel out, ref out)}."""
    exe = _runner()
    d = Path(tempfile.mkdtemp(prefix="kz-cpu-cases-"))
    rng = np.random.default_rng(20261123)
    jobs, meta = [], {}
    for i, (name, dt, rows, cols, sms) in enumerate(_cases()):
        kind, ref = KERNELS[name]
        man = parse_manifest_toml((REPO / "kernels" / name / "kernel.toml").read_text(encoding="utf-8"))
        (gx, _, _), block, _ = launch_dims(man, rows, cols, sms)
        bx, by = block[0], block[1]
        xb, x = _bits_of(rng.standard_normal((rows, cols)), dt)
        wsrc = 0.2 * rng.standard_normal(cols) + (0.0 if name == "rms_norm_gemma" else 1.0)
        wb, w = _bits_of(wsrc, dt)
        blob = xb + wb
        extra = None
        if kind == "fused":
            eb, extra = _bits_of(rng.standard_normal((rows, cols)), dt)
            blob += eb
        elif kind == "ln":
            eb, extra = _bits_of(0.2 * rng.standard_normal(cols), dt)
            blob += eb
        fin = d / f"in{i}"
        fin.write_bytes(blob)
        eps = "1e-5" if kind == "ln" else "1e-6"
        jobs.append(f"{kind} {name}_{dt} {dt} {rows} {cols} {eps} {gx} {bx} {by} {fin} {d / f'k{i}'}")
        jobs.append(f"{kind} {ref}_{dt} {dt} {rows} {cols} {eps} {rows} 512 1 {fin} {d / f'r{i}'}")
        meta[(name, dt, rows, cols, sms)] = (i, x, w, extra)
    (d / "jobs").write_text("\n".join(jobs) + "\n", encoding="utf-8")
    r = subprocess.run([str(exe), str(d / "jobs")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    res = {}
    for case, (i, x, w, extra) in meta.items():
        res[case] = (x, w, extra, (d / f"k{i}").read_bytes(), (d / f"r{i}").read_bytes())
    shutil.rmtree(d, ignore_errors=True)
    return res


def test_every_row_kernel_equals_the_reference_on_the_cpu():
    bad = []
    for (name, dt, rows, cols, sms), (_, _, _, k, r) in _run_all().items():
        assert len(k) == len(r) > 0
        a, b = _raw_words(k, dt), _raw_words(r, dt)
        n = int((a != b).sum())
        if n:
            bad.append(f"{name} {dt} [{rows}, {cols}] ({sms} SMs): {n} of {a.size} words differ from the reference")
    assert not bad, "\n".join(bad[:30]) + (f"\n... {len(bad)} in all" if len(bad) > 30 else "")


def test_the_reference_follows_the_eager_mean_order_emulator():
    # HF LlamaRMSNorm / GemmaRMSNorm / residual add + norm from scripts/eager_order.py's mean of
    # squares (eager's order at the tensor's row count and each row's alignment), with the
    # harness's rsqrtf (1/sqrtf); compared with the reference's output on the CPU.
    bad, checked = [], 0
    for (name, dt, rows, cols, _sms), (x, w, extra, _, r) in _run_all().items():
        if name not in ("rms_norm_llama", "rms_norm_gemma", "fused_add_rms_norm"):
            continue
        eps = F32(1e-6)
        x = x.reshape(rows, cols)
        if name == "fused_add_rms_norm":
            h = _round(x + extra.reshape(rows, cols), dt)
        else:
            h = x
        mean = EO.eager_mean_sq(h)
        rstd = (F32(1.0) / np.sqrt((mean + eps).astype(F32))).astype(F32)
        hr = (h * rstd[:, None]).astype(F32)
        if name == "rms_norm_gemma":
            y = _round(hr * (F32(1.0) + w)[None, :], dt)
        else:
            y = _round(w[None, :] * _round(hr, dt), dt)
        got = _values(r[: len(r) // 2] if name == "fused_add_rms_norm" else r, dt).reshape(rows, cols)
        n = int((got.view(np.uint32) != y.view(np.uint32)).sum())
        checked += 1
        if n:
            bad.append(f"{name} {dt} [{rows}, {cols}]: {n} elements differ from the emulator")
    assert checked > 100
    assert not bad, "\n".join(bad[:30])


def _run_jobs(exe: Path, d: Path, jobs: list[str]) -> None:
    """Run the harness binary `exe` on `jobs` (its job lines, written to d/jobs)."""
    (d / "jobs").write_text("\n".join(jobs) + "\n", encoding="utf-8")
    r = subprocess.run([str(exe), str(d / "jobs")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]


def test_the_fused_add_layer_norm_reference_is_the_add_then_the_layer_norm_reference(tmp_path):
    # fused_add_layer_norm (GPT-2's `h = a + residual; ln_2(h)`) is eager's add in the dtype, then
    # eager's nn.LayerNorm of the stored sum: the verifier's reference for it must give, bit for
    # bit, the layer_norm reference's output on round(x + residual), and that sum as the residual.
    units = {"reference": (_reference_source(), [])}
    syms = [f"ref_{op}_default_{dt}" for op in ("layer_norm", "fused_add_layer_norm") for dt in DTYPES]
    exe = build_runner("fused-ln-", units, syms)
    d = tmp_path
    rng = np.random.default_rng(20261128)
    jobs, meta = [], []
    for dt in DTYPES:
        for i, (rows, cols) in enumerate(LN_SHAPES):
            xb, x = _bits_of(rng.standard_normal((rows, cols)), dt)
            rb, res = _bits_of(rng.standard_normal((rows, cols)), dt)
            wb, _ = _bits_of(0.2 * rng.standard_normal(cols) + 1.0, dt)
            bb, _ = _bits_of(0.2 * rng.standard_normal(cols), dt)
            hb, _ = _bits_of(_round(x + res, dt), dt)   # eager's add: the sum rounded to dt
            tag = f"{dt}-{i}"
            (d / f"f{tag}").write_bytes(xb + wb + rb + bb)
            (d / f"l{tag}").write_bytes(hb + wb + bb)
            jobs.append(f"fused_ln ref_fused_add_layer_norm_default_{dt} {dt} {rows} {cols} 1e-5 {rows} 512 1 "
                        f"{d / f'f{tag}'} {d / f'fo{tag}'}")
            jobs.append(f"ln ref_layer_norm_default_{dt} {dt} {rows} {cols} 1e-5 {rows} 512 1 "
                        f"{d / f'l{tag}'} {d / f'lo{tag}'}")
            meta.append((dt, rows, cols, tag, hb))
    _run_jobs(exe, d, jobs)
    bad = []
    for dt, rows, cols, tag, hb in meta:
        fused, ln = (d / f"fo{tag}").read_bytes(), (d / f"lo{tag}").read_bytes()
        out, resid = fused[: len(fused) // 2], fused[len(fused) // 2:]
        assert len(out) == len(ln) == len(hb) > 0
        if out != ln:
            bad.append(f"{dt} [{rows}, {cols}]: out differs from layer_norm(round(x + residual))")
        if resid != hb:
            bad.append(f"{dt} [{rows}, {cols}]: the residual is not round(x + residual)")
    assert len(meta) == 3 * len(LN_SHAPES)
    assert not bad, "\n".join(bad)


def test_the_fused_add_layer_norm_kernel_equals_its_reference_on_the_cpu(tmp_path):
    # the bundled fused_add_layer_norm: out and residual bit for bit the verifier's reference, on
    # every path its launch rules take (its decode path with a block per row, the staged engine on
    # one SM's grid, the row engine for odd widths and cols <= 128), in every dtype
    folder = REPO / "kernels" / "fused_add_layer_norm"
    man = parse_manifest_toml((folder / "kernel.toml").read_text(encoding="utf-8"))
    assert man["op"] == "fused_add_layer_norm"
    units = {"kernel": ((folder / "kernel.cu").read_text(encoding="utf-8"), []),
             "reference": (_reference_source(), [])}
    syms = [f"{p}_{dt}" for p in ("fused_add_layer_norm", "ref_fused_add_layer_norm_default") for dt in DTYPES]
    exe = build_runner("fused-ln-kernel-", units, syms)
    d = tmp_path / "run"
    d.mkdir()
    rng = np.random.default_rng(20261129)
    # the decode path's lanes: even (1536, 2048), uneven (GPT-2's 1280, 2304, 3200) and mostly
    # empty (160: 40 units for 128 lanes) rows; the staged engine on one SM's grid
    decode = [(1, 1280), (8, 1280), (64, 160), (3, 1536), (3, 2304), (2, 3200), (5, 256)]
    shapes = ([(r, c, SMS) for r, c in LN_SHAPES + decode]
              + [(r, c, 1) for r, c in ((4, 256), (9, 2048), (17, 4096))])
    jobs, cases = [], []
    for dt in DTYPES:
        for i, (rows, cols, sms) in enumerate(shapes):
            (gx, _, _), block, _ = launch_dims(man, rows, cols, sms)
            blob = b"".join(_bits_of(a, dt)[0] for a in (
                rng.standard_normal((rows, cols)), 0.2 * rng.standard_normal(cols) + 1.0,
                rng.standard_normal((rows, cols)), 0.2 * rng.standard_normal(cols)))
            tag = f"{dt}-{i}"
            (d / f"in{tag}").write_bytes(blob)
            jobs.append(f"fused_ln fused_add_layer_norm_{dt} {dt} {rows} {cols} 1e-5 {gx} {block[0]} {block[1]} "
                        f"{d / f'in{tag}'} {d / f'k{tag}'}")
            jobs.append(f"fused_ln ref_fused_add_layer_norm_default_{dt} {dt} {rows} {cols} 1e-5 {rows} 512 1 "
                        f"{d / f'in{tag}'} {d / f'r{tag}'}")
            cases.append((dt, rows, cols, sms, tag))
    _run_jobs(exe, d, jobs)
    bad = []
    for dt, rows, cols, sms, tag in cases:
        k, ref = (d / f"k{tag}").read_bytes(), (d / f"r{tag}").read_bytes()
        assert len(k) == len(ref) == 2 * rows * cols * (4 if dt == "f32" else 2)
        a, b = _raw_words(k, dt), _raw_words(ref, dt)
        if (a != b).any():
            half = a.size // 2
            bad.append(f"{dt} [{rows}, {cols}] ({sms} SMs): out {int((a[:half] != b[:half]).sum())}, "
                       f"residual {int((a[half:] != b[half:]).sum())} words differ")
    assert len(cases) == 3 * len(shapes)
    assert not bad, "\n".join(bad)
