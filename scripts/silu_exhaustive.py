#!/usr/bin/env python3
"""The exact SiLU kernels against eager on every input value (issue 29), on a CUDA machine.

    python3 scripts/silu_exhaustive.py OUT_DIR [--kernels-dir DIR ...] [--f32-chunk-log2 28]

kernels/src/activations.cuh computes eager's silu division, h / (1 + expf(-h)), with a short
sequence where it gives __fdiv_rn's bits and __fdiv_rn elsewhere (kz_div_short). Its claim is
about every float h, so this checks every one the kernels can be given:

- bf16 and f16: all 65,536 bit patterns of the input (of the gate for the gated kernels), each
  with 16 values of up (one of them 1.0, so silu's own bits are seen), against F.silu(x),
  and F.silu(g) * u (silu_and_mul reads them as cat([g, u], -1));
- f32: all 2^32 bit patterns, in chunks of 2^N (N = --f32-chunk-log2), silu on each and silu_mul
  and silu_and_mul with a random up.

Kernels: silu, silu_mul and silu_and_mul from each --kernels-dir (default: this checkout's
kernels/), launched through the client's launch path (kernelize.launch). A mismatch is an output
element whose bits differ from eager's; where both are NaN it is counted apart (`nan_payload`)
and not as a mismatch. Writes OUT_DIR/silu_exhaustive.json and prints a table last; exit 1 when a
kernel mismatches anywhere.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from kernelize import launch as L  # noqa: E402
from kernelize.manifest import parse_manifest_toml  # noqa: E402

DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
INT = {2: torch.int16, 4: torch.int32}
KERNELS = ("silu", "silu_mul", "silu_and_mul")


def load(kdir: Path, name: str, dtype: str):
    man = parse_manifest_toml((kdir / name / "kernel.toml").read_text(encoding="utf-8"))
    src = (kdir / name / "kernel.cu").read_text(encoding="utf-8")
    return L.CompiledKernel(man, src, dtype, torch.device("cuda", torch.cuda.current_device()))


def compare(ours: torch.Tensor, want: torch.Tensor) -> tuple[int, int]:
    it = INT[ours.element_size()]
    differ = ours.view(it) != want.view(it)
    both_nan = torch.isnan(ours) & torch.isnan(want)
    return int((differ & ~both_nan).sum()), int((differ & both_nan).sum())


def run(name: str, ck, g: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ours, eager's) for kernel `name` on gate/input g and up u (rows x cols each)."""
    if name == "silu":
        return L.run_elementwise(ck, g), F.silu(g)
    if name == "silu_mul":
        return L.run_gated(ck, g, u), F.silu(g) * u
    return L.run_silu_and_mul(ck, g, u), F.silu(g) * u  # the kernel reads cat([g, u], -1)


def f32_patterns(start: int, n: int, device) -> torch.Tensor:
    """The n floats whose bit patterns are start, start + 1, ... (as unsigned 32-bit integers,
    wrapping past 2^32 - 1)."""
    off = start % (1 << 32)
    off = off - (1 << 32) if off >= (1 << 31) else off
    return (torch.arange(n, dtype=torch.int32, device=device) + off).view(torch.float32)  # int32 addition wraps


def all_half_patterns(dt: torch.dtype, device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """16 rows of the 65,536 bit patterns of a 2-byte float, and up: row 0 all 1.0, the others
    normal values (a fixed seed)."""
    pat = torch.arange(-32768, 32768, dtype=torch.int32, device=device).to(torch.int16).view(dt)
    g = pat.unsqueeze(0).repeat(16, 1).contiguous()
    gen = torch.Generator(device=device).manual_seed(7)
    u = torch.randn(16, 65536, device=device, generator=gen).to(dt)
    u[0] = 1.0
    return g, u


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--kernels-dir", action="append", type=Path, default=[])
    p.add_argument("--f32-chunk-log2", type=int, default=28)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), device=torch.cuda.get_device_name(),
               torch=torch.__version__, cuda=torch.version.cuda, command=" ".join(sys.argv))
    print(env, flush=True)
    dirs = a.kernels_dir or [ROOT / "kernels"]
    rows = []
    with torch.no_grad():
        for kdir in dirs:
            for name in KERNELS:
                version = tomllib.loads((kdir / name / "kernel.toml").read_text(encoding="utf-8"))["version"]
                for dt in ("bf16", "f16", "f32"):
                    ck = load(kdir, name, dt)
                    t0 = time.perf_counter()
                    mism = nanp = n = 0
                    if dt != "f32":
                        g, u = all_half_patterns(DT[dt])
                        m, q = compare(*run(name, ck, g, u))
                        mism, nanp, n = m, q, g.numel()
                    else:
                        chunk = 1 << a.f32_chunk_log2
                        gen = torch.Generator(device="cuda").manual_seed(11)
                        for start in range(0, 1 << 32, chunk):
                            g = f32_patterns(start, chunk, "cuda").view(1, chunk)
                            u = torch.randn(1, chunk, device="cuda", generator=gen)
                            m, q = compare(*run(name, ck, g, u))
                            mism, nanp, n = mism + m, nanp + q, n + chunk
                            del g, u
                    row = dict(kernels_dir=str(kdir), kernel=name, version=version, dtype=dt, elements=n,
                               mismatches=mism, nan_payload=nanp, seconds=round(time.perf_counter() - t0, 2))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    (out / "silu_exhaustive.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    print("\n" + json.dumps(env))
    print("| kernels | kernel | version | dtype | elements | mismatches | both NaN, other payload |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['kernels_dir']} | {r['kernel']} | {r['version']} | {r['dtype']} | {r['elements']:,} | "
              f"{r['mismatches']:,} | {r['nan_payload']:,} |")
    bad = [r for r in rows if r["mismatches"]]
    total = sum(r["elements"] for r in rows)
    if bad:
        print(f"\nFAIL: {len(bad)} of {len(rows)} (kernel, dtype) cells with elements that differ from eager")
        return 1
    print(f"\nsilu exhaustive OK: {len(rows)} (kernel, dtype) cells, {total:,} elements, 0 differing from eager")
    return 0


if __name__ == "__main__":
    sys.exit(main())
