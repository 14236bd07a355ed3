"""The bundled elementwise and gated kernels on the CPU (issue 29: which thread does which
element): every kernel.cu of the elementwise and gated engines runs under cuda_on_cpu/harness.h,
launched with its manifest's launch rule, and must write exactly what a scalar loop over the same
per-element function (kz_act / kz_sam / kz_gate, from the same source) writes, bit for bit.

The kernels choose their shape of work from the grid (kernels/src/activations.cuh): one 16-byte
vector per thread below KZ_EW_BIG_GRID blocks, KZ_EW_NVEC vectors per thread on one block in
KZ_EW_NVEC above. Each kernel is built twice: as shipped (small grids take the one-vector path;
one 2048-block case takes the other) and with -DKZ_EW_BIG_GRID=2, so that every grid of 2 blocks
or more takes the KZ_EW_NVEC path (idle blocks, grid-stride steps, partial last tiles, grids not
a multiple of KZ_EW_NVEC). Both with 16-byte aligned tensors and with tensors one element off
(the scalar and unaligned paths). The harness's expf & co. are glibc's, the same in the kernel
and the loop, so this checks the mapping, not CUDA's math library (the GPU grid does that:
scripts/eager_grid.py). Skipped without a C++ compiler or off x86-64, as
test_mean_order_on_cpu.py; builds cached under $TMPDIR/kernelize-cuda-on-cpu.
"""

from __future__ import annotations

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
from cpu_harness import build_runner  # noqa: E402
from conftest import load_script  # noqa: E402

DTYPES = ["bf16", "f16", "f32"]
SMS = 132  # the launch rules of these kernels do not depend on it (per_element)


def _generator():
    return load_script(REPO / "kernels" / "generate.py", "kz_generate")


GEN = _generator()
# name -> (kind, engine function, its second template argument)
KERNELS = {}
for _k in GEN.KERNELS:
    if _k.engine in ("elementwise", "gated"):
        _m = re.fullmatch(r"(kz_\w+)<T, (\w+)>", _k.call)
        assert _m, _k.call
        KERNELS[_k.name] = ({"kz_unary": "unary", "kz_silu_and_mul": "sam", "kz_gated": "gated"}[_m.group(1)],
                            _m.group(2))

# The scalar loops: one thread of the launch computes every element in order.
REF = {
    "unary": """extern "C" void ref_{name}_{dt}({T}* out, const {T}* x, long long n) {{
  if (blockIdx.x || threadIdx.x) return;
  for (long long i = 0; i < n; ++i) out[i] = KT<{T}>::from(kz_act<{a}>(KT<{T}>::f(x[i])));
}}
""",
    "sam": """extern "C" void ref_{name}_{dt}({T}* out, const {T}* x, long long rows, long long cols) {{
  if (blockIdx.x || threadIdx.x) return;
  for (long long r = 0; r < rows; ++r)
    for (long long c = 0; c < cols; ++c)
      out[r * cols + c] = KT<{T}>::from(kz_sam<{T}, {a}>(KT<{T}>::f(x[r * 2 * cols + c]),
                                                         KT<{T}>::f(x[r * 2 * cols + cols + c])));
}}
""",
    "gated": """extern "C" void ref_{name}_{dt}({T}* out, const {T}* g, const {T}* u, long long rows, long long cols) {{
  if (blockIdx.x || threadIdx.x) return;
  for (long long i = 0; i < rows * cols; ++i)
    out[i] = KT<{T}>::from(kz_gate<{T}, {a}>(KT<{T}>::f(g[i]), KT<{T}>::f(u[i])));
}}
""",
}


@lru_cache(maxsize=1)
def _runner() -> Path:
    """The harness binary: every kernel as shipped (entries NAME_DT), again with
    -DKZ_EW_BIG_GRID=2 (entries NAME_DT_big) and the scalar loops (ref_NAME_DT)."""
    units = {}
    for name, (kind, a) in KERNELS.items():
        src = (REPO / "kernels" / name / "kernel.cu").read_text(encoding="utf-8")
        refs = "".join(REF[kind].format(name=name, dt=dt, T=GEN.CT[dt], a=a) for dt in DTYPES)
        units[name] = (src + "\n" + refs, [])
        # the entries and the dispatchers (the only code the threshold changes) renamed, so that
        # the linker does not merge them with the shipped build's
        big = ["-DKZ_EW_BIG_GRID=2"] + [f"-D{f}={f}_big" for f in ("kz_unary", "kz_silu_and_mul", "kz_gated")]
        units[name + "_big"] = (src, big + [f"-D{name}_{dt}={name}_{dt}_big" for dt in DTYPES])
    syms = [f"{p}{name}_{dt}{s}" for name in KERNELS for dt in DTYPES for p, s in (("", ""), ("", "_big"), ("ref_", ""))]
    return build_runner("ew-", units, syms)


# (rows, cols): a few elements, a vector's worth and one off, decode rows (one block, several
# blocks, a block and a bit), rows not a multiple of the 16-byte vector (silu_and_mul's scalar
# path), several grid-stride steps of the big path in f32.
SHAPES = [(1, 7), (1, 8), (1, 9), (3, 100), (1, 2048), (1, 5632), (2, 4095), (3, 4100), (5, 2050), (9, 1024),
          (17, 1001)]


def _cases():
    out = []
    for name in KERNELS:
        for dt in DTYPES:
            for rows, cols in SHAPES:
                for build in ("", "_big"):
                    for off in (0, 1):
                        if off and (rows, cols) not in {(1, 9), (3, 4100), (17, 1001)}:
                            continue
                        out.append((name, dt, rows, cols, build, off))
    # the shipped threshold itself: a 2048-block grid (bf16, 256 threads of 8 elements)
    out.append(("silu", "bf16", 2048, 2048, "", 0))
    out.append(("silu_mul", "bf16", 1024, 4096, "", 0))
    return out


def _bits(x: np.ndarray, dt: str) -> bytes:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dt == "f32":
        return x.tobytes()
    if dt == "f16":
        return x.astype(np.float16).tobytes()
    return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # truncation: any bf16 values do


@lru_cache(maxsize=1)
def _run_all():
    exe = _runner()
    d = Path(tempfile.mkdtemp(prefix="kz-cpu-ew-"))
    rng = np.random.default_rng(20261127)
    jobs, meta = [], {}
    for i, (name, dt, rows, cols, build, off) in enumerate(_cases()):
        kind, _ = KERNELS[name]
        man = parse_manifest_toml((REPO / "kernels" / name / "kernel.toml").read_text(encoding="utf-8"))
        (gx, _, _), block, _ = launch_dims(man, rows, cols, SMS)
        nin = rows * cols * (1 if kind == "unary" else 2)
        # values across the activations' interesting range, with a few extremes
        v = rng.standard_normal(nin) * 4
        v[rng.integers(0, nin, size=max(1, nin // 97))] = rng.choice([-100.0, -88.5, -20.0, 0.0, 15.0, 90.0])
        fin = d / f"in{i}"
        fin.write_bytes(_bits(v, dt))
        sym = f"{name}_{dt}{build}"
        jobs.append(f"{kind} {sym} {dt} {rows} {cols} {off} {gx} {block[0]} {block[1]} {fin} {d / f'k{i}'}")
        jobs.append(f"{kind} ref_{name}_{dt} {dt} {rows} {cols} {off} 1 32 1 {fin} {d / f'r{i}'}")
        meta[(name, dt, rows, cols, build, off)] = (i, gx)
    (d / "jobs").write_text("\n".join(jobs) + "\n", encoding="utf-8")
    r = subprocess.run([str(exe), str(d / "jobs")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    res = {case: (gx, (d / f"k{i}").read_bytes(), (d / f"r{i}").read_bytes()) for case, (i, gx) in meta.items()}
    shutil.rmtree(d, ignore_errors=True)
    return res


def test_every_elementwise_kernel_equals_the_scalar_loop_on_the_cpu():
    bad = []
    grids = {"": set(), "_big": set()}
    for (name, dt, rows, cols, build, off), (gx, k, r) in _run_all().items():
        assert len(k) == len(r) == rows * cols * (4 if dt == "f32" else 2)
        a = np.frombuffer(k, np.uint32 if dt == "f32" else np.uint16)
        b = np.frombuffer(r, np.uint32 if dt == "f32" else np.uint16)
        n = int((a != b).sum())
        grids[build].add(gx)
        if n:
            bad.append(f"{name}{build} {dt} [{rows}, {cols}] offset {off}, grid {gx}: {n} of {a.size} elements "
                       "differ from the scalar loop")
    assert not bad, "\n".join(bad[:30]) + (f"\n... {len(bad)} in all" if len(bad) > 30 else "")
    # the big build saw grids that are not a multiple of KZ_EW_NVEC and 1-block grids (the
    # one-vector path); the shipped build a grid at its threshold
    assert 1 in grids["_big"] and any(g > 4 and g % 4 for g in grids["_big"]), grids["_big"]
    assert max(grids[""]) >= 2048, grids[""]


def test_the_shipped_threshold_and_vectors_per_thread():
    # kernels/generate.py's manifests give one 16-byte vector per thread of 2-byte types, which
    # the one-vector path assumes to spread a decode row; the big path's tile is KZ_EW_NVEC of them
    src = (REPO / "kernels" / "src" / "activations.cuh").read_text(encoding="utf-8")
    assert re.search(r"#define KZ_EW_NVEC 4\b", src) and re.search(r"#define KZ_EW_BIG_GRID 2048\b", src)
    for name in KERNELS:
        man = parse_manifest_toml((REPO / "kernels" / name / "kernel.toml").read_text(encoding="utf-8"))
        (rule,) = man["launch"]
        assert rule["grid"] == {"kind": "per_element", "elements_per_thread": 8} and tuple(rule["block"])[0] == 256, name
