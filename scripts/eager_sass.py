#!/usr/bin/env python3
"""Read what nvcc made of one of eager's CUDA kernels: its SASS from the installed torch's
libtorch_cuda.so, for one GPU architecture, reduced to the instructions that round (issue 30's
question "which adds did nvcc contract?", which the source cannot answer).

    python3 scripts/eager_sass.py OUT_DIR --kernel 'layer_norm_grad_input_kernel_vectorizedIffLb0E' \
        [--arch sm_90] [--cuobjdump PATH] [--lib PATH]

Needs no GPU: cuobjdump reads the fat binary (PyPI's `nvidia-cuda-cuobjdump` has one:
`pip download --no-deps nvidia-cuda-cuobjdump` and unzip it; the GPU machine's CUDA toolkit has
one too). The kernel's mangled names are found in the library's symbols (a substring or regular
expression of the mangled name: `IffLb0E` is <float, float, false>). Writes, per matching
kernel, OUT_DIR/<n>.sass (the whole function for `--arch`) and prints its floating-point and
shuffle instructions (FFMA, FMUL, FADD, MUFU, SHFL, ...) in order: an FFMA where the source
writes `acc += a * b` is a contraction, an FMUL followed by an FADD is not.

The torch here is the build machine's (python/.venv); the GPU machine's torch may be another
version, whose code nvcc may have compiled otherwise: what this reads is evidence for a
hypothesis, which the GPU probes then check against eager's bits.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: The instructions that compute or move floating-point values in a reduction.
FP_OPS = re.compile(r"\b(FFMA|FMUL|FADD|FMNMX|MUFU\.[A-Z0-9]+|SHFL\.[A-Z]+|FCHK|DFMA|DMUL|DADD|HFMA2|HMUL2|HADD2)\b")


def mangled_names(lib: Path, pattern: str) -> list[str]:
    """The mangled kernel names in `lib` matching `pattern` (device stubs and guard variables
    left out)."""
    rx = re.compile(pattern.encode())
    names = set(re.findall(rb"_ZN[A-Za-z0-9_]+", lib.read_bytes()))
    # a function's static locals (`...E5__tmp`, `...E8__handle`) are not kernels
    local = re.compile(rb"E\d+__[A-Za-z_]+$")
    return sorted(n.decode() for n in names
                  if rx.search(n) and b"device_stub" not in n and not local.search(n))


def function_for_arch(sass: str, name: str, arch: str) -> str | None:
    """The SASS of function `name` in the section of `arch` in a cuobjdump -sass listing (its
    header line to the next function or architecture), or None."""
    cur_arch = None
    out: list[str] = []
    taking = False
    for line in sass.splitlines():
        m = re.match(r"\s*arch = (sm_\d+)", line)
        if m:
            cur_arch = m.group(1)
            if taking:
                break
            continue
        if "Function :" in line:
            if taking:
                break
            taking = cur_arch == arch and line.split("Function :", 1)[1].strip() == name
        if taking:
            out.append(line)
    return "\n".join(out) if out else None


def fp_instructions(func: str) -> list[str]:
    """`func`'s floating-point and shuffle instructions, '/*offset*/ OPCODE operands' each."""
    rows = []
    for line in func.splitlines():
        m = re.match(r"\s*(/\*[0-9a-f]+\*/)\s+(.*?)\s*;", line)
        if m and FP_OPS.search(m.group(2)):
            rows.append(f"{m.group(1)} {m.group(2)}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--kernel", required=True, help="substring or regular expression of the mangled name")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--lib", default=None, help="default: the installed torch's lib/libtorch_cuda.so")
    a = ap.parse_args(argv)
    if a.lib is None:
        import torch
        a.lib = str(Path(torch.__file__).parent / "lib" / "libtorch_cuda.so")
    lib = Path(a.lib)
    if not lib.is_file():
        sys.exit(f"eager_sass: no library at {lib} (a CUDA build of torch has lib/libtorch_cuda.so; "
                 "or pass --lib)")
    names = mangled_names(lib, a.kernel)
    if not names:
        sys.exit(f"eager_sass: no kernel in {lib.name} matches {a.kernel!r} (a part of the mangled name)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        try:
            done = subprocess.run([a.cuobjdump, "-sass", "-fun", name, str(lib)], capture_output=True,
                                  text=True, check=False, timeout=900)
        except FileNotFoundError:
            sys.exit(f"eager_sass: no cuobjdump at {a.cuobjdump!r} (pip download --no-deps "
                     "nvidia-cuda-cuobjdump, unzip it, pass --cuobjdump .../bin/cuobjdump)")
        func = function_for_arch(done.stdout, name, a.arch)
        print(f"## {name} ({a.arch})")
        if func is None:
            print(f"   not found for {a.arch} ({done.stderr.strip().splitlines()[-1:] or 'no message'})\n")
            continue
        (out / f"{i}.sass").write_text(func + "\n")
        for row in fp_instructions(func):
            print("   " + row)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
