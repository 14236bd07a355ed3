#!/usr/bin/env python3
"""The field's backward (issue 30) against eager autograd, on the GPU machine, until the verifier
measures Python candidates of backward ops (docs/backward.md, "The field's backward as Python
candidates"). Not a verdict: no reference layer, oracle, batch or address cases or speed; eager
autograd on the same GPU, bit for bit per gradient, three calls, the inputs checked unchanged.

    PYTHONUNBUFFERED=1 python3 scripts/backward_field_check.py OUT_DIR [NAME ...]
        [--dtypes bf16,f16,f32] [--shapes 1x256,7x1000,64x4096,1021x768,4096x4096]
        [--package-dir DIR]   # e.g. .gpu-stage/pkgs with liger_kernel 0.8.5 (pip --no-deps --target)
        [--device cpu]        # the torch.compile ones on the CPU (Liger's need a GPU)
        [--time-shapes 4096x4096] [--reps 20]   # timed problems ("" for none)

NAME: folders of kernels/third-party/ (default: every candidate of a backward op there). Writes OUT_DIR/backward_field.json
and prints a table: per candidate, dtype and shape, each gradient's differing elements and
largest ulp distance, determinism, inputs changed, or the candidate's error; then, at the timed
shapes, the candidate's median time beside eager's backward alone and eager's forward + backward
(Liger's RMSNorm, SwiGLU and GeGLU and the compiled ones run their forward in the call, so their
time compares with the latter). Exit 0 when it ran (whatever the findings), 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(ROOT, "kernels", "third-party")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("names", nargs="*")
    p.add_argument("--dtypes", default="bf16,f16,f32")
    p.add_argument("--shapes", default="1x256,7x1000,64x4096,1021x768,4096x4096")
    p.add_argument("--package-dir", action="append", default=[])
    p.add_argument("--device", default="cuda")
    p.add_argument("--time-shapes", default="4096x4096")
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    for d in reversed(a.package_dir):
        sys.path.insert(0, os.path.abspath(d))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    from kernelize_verifier import backward_field as BF
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on the GPU machine (or --device cpu for the torch.compile ones)",
              file=sys.stderr)
        return 2
    names = a.names or BF.candidates(FOLDER)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "python": platform.python_version(), "device": a.device,
           "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None,
           "command": " ".join(sys.argv)}
    for pkg in ("liger_kernel", "triton", "transformers"):
        try:
            import importlib.metadata as md
            env[pkg] = md.version(pkg.replace("_", "-"))
        except Exception:  # noqa: BLE001 - not installed: said as such
            env[pkg] = None
    timed_shapes = [tuple(int(v) for v in s.split("x")) for s in a.time_shapes.split(",") if s]
    rows_out, errors, times = [], [], []
    for name in names:
        try:
            manifest, module = BF.load(os.path.join(FOLDER, name))
        except Exception:  # noqa: BLE001 - a candidate that does not load is a finding
            errors.append({"candidate": name, "error": traceback.format_exc()})
            print(errors[-1]["error"], file=sys.stderr)
            continue
        for dt in a.dtypes.split(","):
            fn = BF.entry(manifest, module, dt)  # with its setup, where it has one
            for rows, cols in shapes:
                r = BF.check(fn, manifest["op"], manifest.get("semantics", "default"), dt, rows,
                             cols, a.device)
                r["candidate"] = name
                rows_out.append(r)
            for rows, cols in timed_shapes:
                try:
                    t = BF.timings(fn, manifest["op"], manifest.get("semantics", "default"), dt,
                                   rows, cols, a.device, a.reps)
                except Exception:  # noqa: BLE001 - the check's rows already say what failed
                    t = {"op": manifest["op"], "dtype": dt, "rows": rows, "cols": cols,
                         "error": traceback.format_exc().strip().splitlines()[-1]}
                t["candidate"] = name
                times.append(t)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "backward_field.json"), "w") as f:
        json.dump({"env": env, "rows": rows_out, "times": times, "errors": errors}, f, indent=1)
    print(json.dumps(env))
    print("| candidate | dtype | rows x cols | gradients: differing of elements (max ulp) | deterministic | inputs changed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows_out:
        grads = r["error"] or "; ".join(f"{n} {g['differing']} of {g['elements']} ({g['max_ulp']})"
                                        for n, g in r["gradients"].items())
        print(f"| {r['candidate']} | {r['dtype']} | {r['rows']}x{r['cols']} | {grads} | "
              f"{r['deterministic']} | {', '.join(r['inputs_changed']) or '-'} |")
    if times:
        print("| candidate | dtype | rows x cols | candidate µs | eager backward µs | eager forward + backward µs |")
        print("| --- | --- | --- | ---: | ---: | ---: |")
        fmt = lambda v: f"{v:.1f}" if isinstance(v, float) else "-"  # noqa: E731
        for t in times:
            print(f"| {t['candidate']} | {t['dtype']} | {t['rows']}x{t['cols']} | "
                  f"{t.get('error') or fmt(t.get('candidate_us'))} | {fmt(t.get('eager_backward_us'))} | "
                  f"{fmt(t.get('eager_forward_backward_us'))} |")
    for e in errors:
        print(f"{e['candidate']}: did not load: {e['error'].strip().splitlines()[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
