#!/usr/bin/env python3
"""Which math-library functions inductor computes with eager's bits on this GPU (issue 31).

    python3 bench/math_proofs.py OUT_DIR [--ops tanh,sigmoid,...] [--dtypes bf16,f16,f32]

For each function and dtype, `kernelize.exact.prove` compiles the function alone with inductor
under the exact configuration and compares its output with eager's kernel on every input of the
dtype (65,536 of bf16 and f16; all 2^32 of f32), bit for bit. Where none differs, the exact
backend fuses the function into inductor's code instead of calling eager's kernel
(docs/compile.md). Writes OUT_DIR/proofs.json (each proof's record: inputs, equal, the first
input that differs, seconds) and prints a table. Proofs are made afresh (a temporary
`$KERNELIZE_CACHE`), not read from an earlier run. Where inductor's own lowering differs and a
rewrite of eager's formula exists (`pow(x, 3.0)` as `x * x * x`; sigmoid, and silu and gelu,
which inductor only decomposes, as eager's CUDA formula in f32), the cell says which one holds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from run_env import run_env  # noqa: E402 (bench/ is on the path of a bench script)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from kernelize.discover import TORCH_DTYPES  # noqa: E402

DTYPES = {name: dtype for dtype, name in TORCH_DTYPES.items()}   # "bf16" -> torch.bfloat16
aten = torch.ops.aten
#: name -> (overload, scalar arguments, keyword arguments) as a dynamo graph passes them
OPS = {
    "tanh": (aten.tanh.default, (), {}), "sigmoid": (aten.sigmoid.default, (), {}),
    "exp": (aten.exp.default, (), {}), "exp2": (aten.exp2.default, (), {}),
    "expm1": (aten.expm1.default, (), {}), "log": (aten.log.default, (), {}),
    "log1p": (aten.log1p.default, (), {}), "erf": (aten.erf.default, (), {}),
    "sin": (aten.sin.default, (), {}), "cos": (aten.cos.default, (), {}),
    "rsqrt": (aten.rsqrt.default, (), {}), "reciprocal": (aten.reciprocal.default, (), {}),
    "pow3": (aten.pow.Tensor_Scalar, (3.0,), {}), "pow-2": (aten.pow.Tensor_Scalar, (-2.0,), {}),
    "pow1.5": (aten.pow.Tensor_Scalar, (1.5,), {}),
    "silu": (aten.silu.default, (), {}), "gelu": (aten.gelu.default, (), {}),
    # aten::gelu takes `approximate` by keyword only (a positional "tanh" is refused)
    "gelu_tanh": (aten.gelu.default, (), {"approximate": "tanh"}),
}



def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtypes", default="bf16,f16,f32")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["KERNELIZE_CACHE"] = tempfile.mkdtemp(prefix="kernelize-proofs-")
    from kernelize import exact
    dev = torch.device("cuda", torch.cuda.current_device())
    env = run_env()
    print(env, flush=True)
    rows = []
    for name in a.ops.split(","):
        ov, scalars, kwargs = OPS[name]
        for d in a.dtypes.split(","):
            t0 = time.perf_counter()
            exact.prove(ov, scalars, kwargs, DTYPES[d], dev)
            rec = dict(exact._PROOFS[exact._proof_key(ov, scalars, kwargs, DTYPES[d], dev)],
                       name=name, name_dtype=d, seconds=round(time.perf_counter() - t0, 2))
            print(rec, flush=True)
            rows.append(rec)
    (out / "proofs.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    print("\n| function | " + " | ".join(a.dtypes.split(",")) + " |")
    print("| --- |" + " --- |" * len(a.dtypes.split(",")))
    for name in a.ops.split(","):
        cells = []
        for r in (r for r in rows if r["name"] == name):
            if r["equal"]:
                how = "" if r["lowering"] == "inductor" else f" as {r['lowering']} (inductor's own differs)"
                cells.append(f"eager's bits{how} ({r['inputs']:,} inputs, {r['seconds']} s)")
            elif r.get("error"):
                cells.append(f"not proven: {r['error'][:60]}")
            else:
                fd, mask = r["first_difference"], (1 << (8 * DTYPES[r["name_dtype"]].itemsize)) - 1
                cells.append(f"differs (input 0x{fd['input']:x}: eager 0x{fd['eager'] & mask:x}, "
                             f"inductor 0x{fd['inductor'] & mask:x}; {fd['differing_in_chunk']} in its chunk)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
