"""Whether a kernel's machine code is the same as at a git revision, function by function.

Compiles kernels/K/kernel.cu as it was at REV (one module, every dtype's entries, as before the
kernel had `KERNELIZE_DTYPE_<DT>` guards, or per dtype with --per-dtype-old) and as it is in the
working tree, one module per dtype (`-DKERNELIZE_DTYPE_<DT>`, as the verifier and the client
compile it), with NVRTC for sm_90 and the manifest's nvrtc_options, and compares each entry's
SASS (nvdisasm; label numbers, the numbering of NVRTC's internal helpers and spacing ignored).
Runs on the CPU (no GPU): a content change that leaves every function's SASS the same gives the
same bits. Prints one line per dtype: NVRTC seconds and `same` / `DIFFERS` per function.

    python/.venv/bin/python bench/sass_same.py rms_norm_llama_backward HEAD [--nvdisasm PATH]
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from kernelize import nvrtc  # noqa: E402


def find_nvdisasm() -> str:
    found = shutil.which("nvdisasm") or next(iter(sorted(glob.glob(
        os.path.join(ROOT, "python/.venv/lib/python3*/site-packages/triton/backends/nvidia/bin/nvdisasm")))), None)
    if not found:
        sys.exit("nvdisasm not found: pass --nvdisasm PATH (the CUDA toolkit's, or triton's wheel carries one)")
    return found


def functions(cubin: bytes, nvdisasm: str) -> dict[str, list[str]]:
    """Each function's SASS lines, normalised."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        text = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            name = m.group(1)
            out[name] = []
            continue
        if name is None:
            continue
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)
        line = re.sub(r"\.L_x_\d+", "L", line)
        line = re.sub(r"__internal_\d+_", "__internal_", line)
        line = re.sub(r"\s+", " ", line).strip()
        if line and not line.startswith((".", "//")) and not re.fullmatch(r"\S+:", line):
            out[name].append(line)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernel")
    ap.add_argument("rev", help="the git revision to compare with (HEAD, a commit, a tag)")
    ap.add_argument("--per-dtype-old", action="store_true", help="compile REV's source per dtype too")
    ap.add_argument("--nvdisasm")
    a = ap.parse_args()
    nvd = a.nvdisasm or find_nvdisasm()
    rel = f"kernels/{a.kernel}/kernel.cu"
    old = subprocess.run(["git", "-C", ROOT, "show", f"{a.rev}:{rel}"], capture_output=True, text=True, check=True).stdout
    new = open(os.path.join(ROOT, rel), encoding="utf-8").read()
    man = tomllib.load(open(os.path.join(ROOT, f"kernels/{a.kernel}/kernel.toml"), "rb"))
    base = ["--gpu-architecture=sm_90", f"--include-path={nvrtc.include_dir_for_client()[0]}"]
    base += list(man.get("nvrtc_options", []))
    nv = nvrtc.load_nvrtc()
    print(f"# {a.kernel}: {a.rev} against the working tree; NVRTC {nv.version}")
    old_all = None
    if not a.per_dtype_old:
        c = nvrtc.compile_program(old, a.kernel, base, nv)
        old_all = functions(c.code, nvd)
        print(f"{a.rev}, one module: {c.compile_s:.2f} s, {len(old_all)} functions")
    differ = 0
    for dt in ("bf16", "f16", "f32"):
        opt = [f"-DKERNELIZE_DTYPE_{dt.upper()}"]
        ref = old_all if old_all is not None else functions(nvrtc.compile_program(old, a.kernel, base + opt, nv).code, nvd)
        c = nvrtc.compile_program(new, a.kernel, base + opt, nv)
        got = functions(c.code, nvd)
        cells = []
        for n in sorted(got):
            same = ref.get(n) == got[n]
            differ += not same
            cells.append(f"{n} {'same' if same else 'DIFFERS'} ({len(got[n])} lines)")
        print(f"{dt}: {c.compile_s:.2f} s, {len(got)} functions: " + "; ".join(cells))
    print("every function the same" if differ == 0 else f"{differ} function(s) differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
