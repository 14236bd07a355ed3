"""Building programs on the CPU harness (python/tests/cuda_on_cpu): the kernels' CUDA sources
compiled as C++ and run with fibers standing for threads. One home for the compiler, its flags,
the build cache and the build of a runner, shared by the tests that run kernels on the CPU
(test_mean_order_on_cpu, test_elementwise_on_cpu, test_backward_order_on_cpu)."""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parent / "cuda_on_cpu"
CXXFLAGS = ["-std=c++17", "-O1", "-ffp-contract=off", "-fno-strict-aliasing"]


def cxx() -> str:
    """The C++ compiler (CXX, g++, c++ or clang++); skips the test where there is none, or where
    the harness's fiber switch (x86-64 assembly) cannot run."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the CPU harness switches fibers with x86-64 assembly")
    for c in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if c and shutil.which(c):
            return c
    pytest.skip("no C++ compiler (g++/clang++) to run the kernels' sources on the CPU")


def cache_dir(key: str) -> Path:
    """A build folder for `key` (a hash of what is built), kept across runs
    (KERNELIZE_CPU_CUDA_CACHE, default the temp folder's kernelize-cuda-on-cpu)."""
    d = Path(os.environ.get("KERNELIZE_CPU_CUDA_CACHE",
                            Path(tempfile.gettempdir()) / "kernelize-cuda-on-cpu")) / key
    d.mkdir(parents=True, exist_ok=True)
    return d


def build_runner(prefix: str, units: dict[str, tuple[str, list[str]]], syms: list[str]) -> Path:
    """The harness's runner (cuda_on_cpu/main.cpp) linked with `units` (name -> (source, extra
    compiler flags)), dispatching to the `extern "C"` entries `syms`; cached by the hash of
    everything it is built from (`prefix` names the cache folder). Units compile in parallel."""
    c = cxx()
    h = hashlib.sha256()
    for part in [c, " ".join(CXXFLAGS), (HARNESS / "harness.h").read_text(), (HARNESS / "main.cpp").read_text()]:
        h.update(part.encode())
    for k in sorted(units):
        h.update(k.encode() + units[k][0].encode() + " ".join(units[k][1]).encode())
    h.update(" ".join(syms).encode())
    d = cache_dir(prefix + h.hexdigest()[:16])
    exe = d / "run"
    if exe.exists():
        return exe
    (d / "syms.inc").write_text(
        f'#include "{HARNESS / "harness.h"}"\n'
        + "".join(f'extern "C" void {s}(void);\n' for s in syms)
        + "#define KZ_SYMS " + " ".join(f"KZ_SYM({s})" for s in syms) + "\n", encoding="utf-8")
    jobs = []
    for k, (text, defs) in units.items():
        (d / f"{k}.cu").write_text(text, encoding="utf-8")
        jobs.append([c, *CXXFLAGS, *defs, f"-I{HARNESS / 'include'}", "-include", str(HARNESS / "harness.h"),
                     "-x", "c++", "-c", str(d / f"{k}.cu"), "-o", str(d / f"{k}.o")])
    jobs.append([c, *CXXFLAGS, f"-I{d}", "-c", str(HARNESS / "main.cpp"), "-o", str(d / "main.o")])

    def build(cmd):
        return cmd, subprocess.run(cmd, capture_output=True, text=True)

    with cf.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as ex:
        for cmd, r in ex.map(build, jobs):
            assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-4000:]}"
    tmp = d / "run.tmp"
    subprocess.run([c, *[str(d / f"{k}.o") for k in units], str(d / "main.o"), "-o", str(tmp)], check=True)
    tmp.replace(exe)
    return exe


#: What every runner with a main of its own starts with (build_own_main's %PRELUDE%): the
#: headers, the harness, its fiber switch, the trampoline a launch calls (`g_call`, set before
#: each kzcpu::launch) and the job loop: `kz_each_job(path, one)` calls `one(ss, line)` for each
#: non-empty line of the jobs file and stops at the first nonzero status, which it returns.
OWN_MAIN_PRELUDE = r"""
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>
#include "%HARNESS%"
%SWITCH%
inline std::function<void()> g_call;
static void tramp() { g_call(); }
template <class F> int kz_each_job(const char* path, F one) {
  std::ifstream jobs(path);
  std::string line;
  while (std::getline(jobs, line)) {
    if (line.empty()) continue;
    std::istringstream ss(line);
    if (int rc = one(ss, line)) return rc;
  }
  return 0;
}
"""


def build_own_main(prefix: str, main: str, ksrc: str) -> Path:
    """A runner with a main of its own (`main`: C++ source starting with %PRELUDE%, which becomes
    OWN_MAIN_PRELUDE with the harness header's path and the harness's fiber switch, reused
    verbatim from cuda_on_cpu/main.cpp) linked with the kernel source `ksrc`; cached like
    build_runner."""
    assert "%PRELUDE%" in main, "an own main starts with %PRELUDE% (cpu_harness.OWN_MAIN_PRELUDE)"
    c = cxx()
    hm = (HARNESS / "main.cpp").read_text(encoding="utf-8")
    sw = re.search(r'^asm\(R"\(.*?^\)"\);$', hm, re.S | re.M)
    assert sw, "python/tests/cuda_on_cpu/main.cpp lost its kz_switch assembly block"
    prelude = OWN_MAIN_PRELUDE.replace("%HARNESS%", str(HARNESS / "harness.h")).replace("%SWITCH%", sw.group(0))
    main = main.replace("%PRELUDE%", prelude)
    h = hashlib.sha256()
    for part in [c, " ".join(CXXFLAGS), (HARNESS / "harness.h").read_text(), main, ksrc]:
        h.update(part.encode())
    d = cache_dir(prefix + h.hexdigest()[:16])
    exe = d / "run"
    if exe.exists():
        return exe
    (d / "k.cu").write_text(ksrc, encoding="utf-8")
    (d / "main.cpp").write_text(main, encoding="utf-8")
    for cmd in ([c, *CXXFLAGS, f"-I{HARNESS / 'include'}", "-include", str(HARNESS / "harness.h"),
                 "-x", "c++", "-c", str(d / "k.cu"), "-o", str(d / "k.o")],
                [c, *CXXFLAGS, "-c", str(d / "main.cpp"), "-o", str(d / "main.o")]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-4000:]}"
    tmp = d / "run.tmp"
    subprocess.run([c, str(d / "k.o"), str(d / "main.o"), "-o", str(tmp)], check=True)
    tmp.replace(exe)
    return exe


def to_raw(v, dt: str) -> bytes:
    """f32 values of T (bf16, f16, f32) as T's bytes (bf16 rounded to nearest even)."""
    import numpy as np
    from kernelize.backward import round_bf16
    v = np.ascontiguousarray(v, dtype=np.float32)
    if dt == "f32":
        return v.tobytes()
    if dt == "bf16":
        return (round_bf16(v).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return v.astype(np.float16).tobytes()


def from_raw(raw: bytes, dt: str):
    """T's bytes back as f32 values (exact)."""
    import numpy as np
    if dt == "f32":
        return np.frombuffer(raw, np.float32).copy()
    if dt == "bf16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, np.float16).astype(np.float32)
