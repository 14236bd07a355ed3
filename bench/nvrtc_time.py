#!/usr/bin/env python3
"""NVRTC compile time per bundled kernel and dtype, and of the verifier's reference layers, on the
CPU alone (issue 29). No GPU is needed: NVRTC and its ptxas run on the host.

Each module is compiled as the verifier compiles it (`verifier/src/cuda.rs` `nvrtc_options`, the
Python client's `kernelize.nvrtc.module_options`): `--gpu-architecture=sm_90`, the include path,
the manifest's `nvrtc_options`, `-DKERNELIZE_DTYPE_<DT>`, program `"<name> (<dt>).cu"`; the
reference layers (`verifier/src/reference.cu`) with the architecture and include path only, as
`"reference layers.cu"`. Modules compile one at a time (`--jobs 1`, the default) so that each
time is the module's own; the verifier compiles a kernel's dtypes and the reference layers at
once, one thread each, so its wall time is about the slowest module's (on enough cores).

    python/.venv/bin/python bench/nvrtc_time.py [--kernels NAME ...] [--reps N] [--json OUT]
        [--nvrtc /path/to/libnvrtc.so.13] [--include DIR] [--sm 90] [--source-dir DIR]

`--source-dir DIR` reads `DIR/<name>/kernel.cu` instead of `kernels/<name>/kernel.cu` (a
variant tree, e.g. one made by applying a bench/variants patch in a copy). Prints a markdown
table: per kernel, per dtype seconds of CPU time of the compiling thread (NVRTC is single
threaded; CPU time is what another process on the machine disturbs least; wall time is in the
`--json` output; with `-Xptxas=--split-compile` ptxas may run on threads of its own, which
`--all-threads` counts too), median of `--reps`, CUBIN and PTX KiB, and the CUBIN's
SHA-256 prefix (to compare with the certificates' `compiled[].code_sha256`, which only match for
the NVRTC version the certificate names).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

from kernelize import nvrtc  # noqa: E402

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib  # type: ignore


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ptx_of(nv, source: bytes, name: str, options: list[str]) -> tuple[int, float]:
    """Bytes of the PTX NVRTC makes for the same program (compiled again, to PTX only), and the
    wall seconds that compile took: NVRTC's front end and optimizer without ptxas, so that the
    CUBIN's time less this one is ptxas's."""
    opts = [o.replace("sm_", "compute_") if o.startswith("--gpu-architecture") else o for o in options]
    t0 = time.perf_counter()
    code = nvrtc.compile_program(source, name, opts, nv=nv)
    return len(code.code), time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", nargs="*", help="kernel folder names (default: every bundled kernel)")
    p.add_argument("--dtypes", nargs="*", default=None, help="only these dtypes")
    p.add_argument("--no-reference", action="store_true", help="skip verifier/src/reference.cu")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1, help="modules compiled at once (default 1)")
    p.add_argument("--ptx", action="store_true", help="also the PTX size and the time of compiling to PTX only (one more compile each; the CUBIN time less it is ptxas's)")
    p.add_argument("--nvrtc", help="libnvrtc to load (default: the client's search)")
    p.add_argument("--include", help="include path (default: the client's cuda_include_dir)")
    p.add_argument("--sm", default="90")
    p.add_argument("--source-dir", type=Path, default=ROOT / "kernels")
    p.add_argument("--reference", type=Path, help="reference.cu to time (default: verifier/src/reference.cu)")
    p.add_argument("--option", action="append", default=[], metavar="OPT",
                   help="one more NVRTC option for every kernel module (repeatable), e.g. "
                        "-Xptxas=--split-compile=0 (ptxas on several threads: the table's seconds "
                        "are then wall seconds, the compiling thread's CPU time being no measure)")
    p.add_argument("--wall", action="store_true", help="the table in wall seconds (default: CPU)")
    p.add_argument("--all-threads", action="store_true",
                   help="CPU time of the whole process, NVRTC's other threads (ptxas's) included "
                        "(getrusage; with --jobs 1 only)")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    if a.option:
        a.wall = True

    nv = nvrtc.load_nvrtc([a.nvrtc]) if a.nvrtc else nvrtc.load_nvrtc()
    inc = a.include or nvrtc.cuda_include_dir()
    if not Path(inc, "cuda_bf16.h").exists():
        for cand in Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/cu13/include"):
            inc = str(cand)
    arch = (int(a.sm[0]), int(a.sm[1:]))
    names = a.kernels or sorted(d.name for d in a.source_dir.iterdir() if (d / "kernel.toml").exists())

    jobs = []  # (kernel, dtype, name, source, options)
    for k in names:
        man = tomllib.loads((a.source_dir / k / "kernel.toml").read_text())
        if man.get("runtime", "cuda") != "cuda":
            continue
        src = (a.source_dir / k / man.get("source", "kernel.cu")).read_bytes()
        for dt in man["entry"]:
            if a.dtypes and dt not in a.dtypes:
                continue
            opts = nvrtc.module_options(man, dt, arch, inc) + a.option
            jobs.append((k, dt, nvrtc.program_name(man["name"], dt), src, opts))
    if not a.no_reference:
        src = (a.reference or ROOT / "verifier" / "src" / "reference.cu").read_bytes()
        jobs.append(("reference layers", "-", "reference layers.cu", src,
                     nvrtc.nvrtc_options(arch, inc, [])))

    if a.all_threads and a.jobs != 1:
        p.error("--all-threads measures the whole process: give it --jobs 1")

    def cpu_now() -> float:
        if a.all_threads:
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime
        return time.thread_time()

    def one(job):
        k, dt, name, src, opts = job
        times, cpu, code = [], [], None
        for _ in range(a.reps):
            t, c = time.perf_counter(), cpu_now()
            code = nvrtc.compile_program(src, name, opts, nv=nv)
            times.append(time.perf_counter() - t)
            cpu.append(cpu_now() - c)
        row = {"kernel": k, "dtype": dt, "s": statistics.median(times if a.wall else cpu), "all_cpu_s": cpu,
               "wall_s": statistics.median(times), "all_wall_s": times,
               "cubin_kib": len(code.code) / 1024, "code_kind": code.code_kind,
               "sha256": hashlib.sha256(code.code).hexdigest()}
        if a.ptx:
            size, row["ptx_s"] = ptx_of(nv, src, name, opts)
            row["ptx_kib"] = size / 1024
        print(f"{k:24} {dt:5} {row['s']:7.2f} s CPU {row['wall_s']:7.2f} s wall  {row['cubin_kib']:6.0f} KiB  {row['sha256'][:10]}",
              file=sys.stderr, flush=True)
        return row

    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.jobs) as ex:
        rows = list(ex.map(one, jobs))
    wall = time.perf_counter() - t0

    head = (f"CPU: {cpu_model()} ({os.cpu_count()} cores), NVRTC {nv.version} ({os.path.basename(nv.path)}), "
            f"sm_{a.sm}, {a.jobs} module(s) at once, median of {a.reps}, "
            f"{'wall seconds' if a.wall else 'CPU seconds of all threads' if a.all_threads else 'seconds of the compiling thread' + chr(39) + 's CPU time'}, "
            f"extra options {a.option or 'none'}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, total {wall:.1f} s")
    print(head)
    print()
    by = {}
    for r in rows:
        by.setdefault(r["kernel"], {})[r["dtype"]] = r
    print("| kernel | bf16 s | f16 s | f32 s | slowest s | CUBIN KiB (bf16) |" + (" PTX KiB (bf16) | to PTX only, s (bf16) |" if a.ptx else ""))
    print("| --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if a.ptx else ""))
    for k, d in by.items():
        cells = [f"{d[dt]['s']:.2f}" if dt in d else "" for dt in ("bf16", "f16", "f32")]
        if "-" in d:
            cells = [f"{d['-']['s']:.2f}", "", ""]
        first = d.get("bf16") or d.get("-") or next(iter(d.values()))
        slowest = max(r["s"] for r in d.values())
        line = f"| {k} | " + " | ".join(cells) + f" | {slowest:.2f} | {first['cubin_kib']:.0f} |"
        if a.ptx:
            line += f" {first.get('ptx_kib', 0):.0f} | {first.get('ptx_s', 0):.2f} |"
        print(line)
    if a.json:
        a.json.write_text(json.dumps({"header": head, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
