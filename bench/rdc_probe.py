#!/usr/bin/env python3
"""Relocatable device code for the exact norms (issue 29's verification time): does NVRTC's
`-rdc=true` (each device function compiled by ptxas on its own instead of the whole call graph
at once) give the same bits at the same speed, and how long does it take to compile and link?

On the build machine (2 CPUs, NVRTC 13.2) layer_norm bf16 took 19.2 s whole and 7.8-8.4 s
relocatable, rms_norm_llama bf16 9.0 s and 4.4 s; the driver cannot run a relocatable image
until it is linked, so this probe also links it (the driver's `cuLink*`, what the verifier and
the client would call) and times that.

    python3 bench/rdc_probe.py OUT_DIR [--kernels rms_norm_llama,layer_norm,...] [--reps 50]

Per kernel and dtype, on this GPU:
- NVRTC wall seconds of the verifier's module (`kernelize.nvrtc.module_options`, the dtype's
  macro) whole and relocatable, all six at once on threads of their own (as the verifier
  compiles a kernel's dtypes), the first compile of each in this process (NVRTC keeps a cache
  across processes on some machines: run this on a machine that has compiled neither);
- whether the driver loads the relocatable image without a link (`cuModuleLoadData`), the link's
  seconds and whether two links give the same bytes;
- bits: every output of the linked relocatable module against the whole module's and against
  eager (`scripts/bench_kernels.py`'s eager layers) over a grid of rows x widths;
- speed: GPU time per call of both modules in the same process, at decode and large shapes
  (median of CUDA-event-timed launches, L2 flushed before each), and the ratio.
Writes OUT_DIR/rdc_probe.json and prints a markdown table last.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402

import bench_kernels as bk  # noqa: E402
from kernelize import nvrtc  # noqa: E402

CU_JIT_INPUT_CUBIN = 0
DTS = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def device_function_regs(source: str) -> int:
    """The register budget every entry's __launch_bounds__ leaves a thread (the least of them,
    a multiple of 8, at most 255): in a whole-program compile ptxas gives the callees their
    entry's budget; compiled relocatable, they need it said (`--device-function-maxrregcount`)."""
    regs = 255
    for t, b in re.findall(r"__launch_bounds__\(\s*(\d+)\s*,\s*(\d+)\s*\)", source):
        regs = min(regs, (65536 // (int(t) * int(b))) // 8 * 8)
    return regs


def link(image: bytes) -> tuple[bytes, float]:
    """The driver's linker on one relocatable CUBIN; the context must be current."""
    cu = bk.CUDA
    state = ctypes.c_void_p()
    t0 = time.perf_counter()
    bk._cu(cu.cuLinkCreate_v2(0, None, None, ctypes.byref(state)), "cuLinkCreate")
    try:
        bk._cu(cu.cuLinkAddData_v2(state, CU_JIT_INPUT_CUBIN, image, ctypes.c_size_t(len(image)),
                                   b"kernel", 0, None, None), "cuLinkAddData")
        out, size = ctypes.c_void_p(), ctypes.c_size_t()
        bk._cu(cu.cuLinkComplete(state, ctypes.byref(out), ctypes.byref(size)), "cuLinkComplete")
        linked = ctypes.string_at(out, size.value)
    finally:
        cu.cuLinkDestroy(state)
    return linked, time.perf_counter() - t0


def load_entry(k: bk.Kernel, dt: str, image: bytes) -> int:
    """Load one dtype's module into `k` (its entry for `dt`); the driver's first nonzero result
    code (0: loaded and the entry found). An unlinked relocatable image loads, but its entry
    is not found (200, CUDA_ERROR_INVALID_IMAGE: H200, driver 580.159.04, session 32 run 1)."""
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    rc = bk.CUDA.cuModuleLoadData(ctypes.byref(mod), image)
    if rc == 0:
        rc = bk.CUDA.cuModuleGetFunction(ctypes.byref(fn), mod, k.entries[dt].encode())
        if rc == 0:
            k.funcs[dt] = fn
    return int(rc)


KNOWN_OPS = ("rms_norm", "layer_norm", "fused_add_rms_norm")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--kernels", default="rms_norm_llama,rms_norm_gemma,rms_norm_torch,fused_add_rms_norm,"
                   "layer_norm,fused_add_layer_norm")
    p.add_argument("--reps", type=int, default=50)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.cuda.init()
    torch.empty(1, device="cuda")
    major, minor = torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    inc = nvrtc.cuda_include_dir()
    if not Path(inc, "cuda_bf16.h").exists():
        inc = f"{bk.CUDA_HOME}/include"
    env = bk.env_info()
    print(env, flush=True)
    timer = bk.Timer(a.reps)
    rows_out = []
    for name in a.kernels.split(","):
        d = ROOT / "kernels" / name
        whole, rel = bk.Kernel(str(d)), bk.Kernel(str(d))
        regs = device_function_regs(whole.src)
        rdc_opts = ["-rdc=true", f"-Xptxas=--device-function-maxrregcount={regs}"]
        rec = {"kernel": name, "regs": regs, "compile": {}}
        # 1. compile time per dtype module, as the verifier compiles it (every dtype's module
        # at once, one thread each, as Gpu::start_compiles does), whole and relocatable at once
        man = {"name": whole.m["name"], "nvrtc_options": whole.m.get("nvrtc_options", [])}

        def one(job):
            dt, mode = job
            opts = nvrtc.module_options(man, dt, (major, minor), inc) + (rdc_opts if mode == "rdc" else [])
            t0 = time.perf_counter()
            code = nvrtc.compile_program(whole.src, nvrtc.program_name(whole.name, dt), opts)
            return job, code.code, time.perf_counter() - t0

        jobs = [(dt, mode) for dt in whole.entries for mode in ("whole", "rdc")]
        with ThreadPoolExecutor(len(jobs)) as ex:
            done = {job: (img, s) for job, img, s in ex.map(one, jobs)}
        for dt in whole.entries:
            c = {}
            for mode in ("whole", "rdc"):
                img, secs = done[(dt, mode)]
                c[f"{mode}_s"], c[f"{mode}_kib"] = round(secs, 3), len(img) // 1024
                if mode == "whole":
                    c["whole_load_rc"] = load_entry(whole, dt, img)
                else:
                    c["direct_load_rc"] = load_entry(rel, dt, img)
                    linked, ls = link(img)
                    c["linked_load_rc"] = load_entry(rel, dt, linked)
                    c["link_s"] = round(ls, 4)
                    c["linked_kib"] = len(linked) // 1024
                    c["link_deterministic"] = link(img)[0] == linked
            rec["compile"][dt] = c
            print(name, dt, c, flush=True)
        if whole.op not in KNOWN_OPS:   # bench_kernels has no launch of it: compile times only
            rows_out.append(rec)
            continue
        # 2. bits over a grid
        gen = torch.Generator(device="cuda").manual_seed(11)
        cells = diff_rdc = diff_eager = 0
        worst = []
        for dt, T in DTS.items():
            for rows in (1, 2, 3, 4, 5, 8, 16, 17, 32, 33, 64, 65, 512, 4096):
                for cols in (96, 768, 1000, 2048, 4096, 5120, 8192):
                    if rows * cols > (1 << 25):
                        continue
                    inputs = bk.make_inputs(whole.op, T, rows, cols, gen, inject=(rows % 7 == 4))
                    outs = []
                    for k in (whole, rel):
                        go, o = bk.kernel_call(k, dt, inputs, rows, cols, sms)
                        go()
                        outs.append(o)
                    ref = bk.eager_out(whole.op, whole.sem, inputs, cols)
                    torch.cuda.synchronize()
                    cells += 1
                    n1 = sum(bk.bits_mismatch(x, y) for x, y in zip(outs[0], outs[1]))
                    n2 = sum(bk.bits_mismatch(x, y) for x, y in zip(outs[1], ref))
                    diff_rdc += n1 != 0
                    diff_eager += n2 != 0
                    if (n1 or n2) and len(worst) < 10:
                        worst.append(dict(dtype=dt, rows=rows, cols=cols, vs_whole=n1, vs_eager=n2))
        rec.update(cells=cells, cells_differing_from_whole=diff_rdc, cells_differing_from_eager=diff_eager,
                   first_differences=worst)
        # 3. speed, same process, interleaved
        speed = []
        for rows, cols in ((1, 2048), (1, 4096), (8, 4096), (64, 4096), (4096, 8192), (32768, 4096)):
            T = torch.bfloat16
            inputs = bk.make_inputs(whole.op, T, rows, cols, gen)
            us = {}
            for rnd in range(2):
                for label, k in (("whole", whole), ("rdc", rel)):
                    go, _ = bk.kernel_call(k, "bf16", inputs, rows, cols, sms)
                    us.setdefault(label, []).append(timer(go))
            s = dict(rows=rows, cols=cols, whole_us=min(us["whole"]), rdc_us=min(us["rdc"]))
            s["ratio"] = round(s["whole_us"] / s["rdc_us"], 3)
            speed.append(s)
        rec["speed_bf16"] = speed
        rows_out.append(rec)
        print(json.dumps(rec), flush=True)
        (a.out / "rdc_probe.json").write_text(json.dumps(dict(env=env, rows=rows_out), indent=1))
    print("\n| kernel | regs | module s whole / rdc (bf16, f16, f32) | link s | direct load rc | cells | differ from whole | differ from eager | speed whole/rdc (1x2048, 1x4096, 8x4096, 64x4096, 4096x8192, 32768x4096) |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows_out:
        comp = ", ".join(f"{c['whole_s']:.1f}/{c['rdc_s']:.1f}" for c in r["compile"].values())
        link_s = max(c["link_s"] for c in r["compile"].values())
        direct = ",".join(str(c["direct_load_rc"]) for c in r["compile"].values())
        sp = ", ".join(f"{s['ratio']:.2f}" for s in r.get("speed_bf16", []))
        print(f"| {r['kernel']} | {r['regs']} | {comp} | {link_s:.3f} | {direct} | {r.get('cells', '-')} | "
              f"{r.get('cells_differing_from_whole', '-')} | {r.get('cells_differing_from_eager', '-')} | {sp or '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
