#!/usr/bin/env python3
"""Profile target for Nsight Compute (issue 29): launches the bundled exact LlamaRMSNorm at 1 x
2048 (bf16) and the minimal probe of bench/decode_probe.py a few times each, and writes the
bundled kernel's CUBIN to OUT_DIR/rms_norm_llama_bf16.cubin (for `cuobjdump -res-usage -sass`).

    ncu --set full -k regex:'rms_norm_llama_bf16|probe_bf16' -c 4 python3 bench/ncu_decode.py OUT_DIR
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

from decode_probe import PER_ROW, SRC, manifest  # noqa: E402
from decode_rows import compiled_kernel  # noqa: E402
from kernelize import launch as L  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
ck = compiled_kernel(ROOT / "kernels", "rms_norm_llama", "bf16")
(out / "rms_norm_llama_bf16.cubin").write_bytes(ck.code.code)
pk = L.CompiledKernel(manifest(PER_ROW), SRC, "bf16", torch.device("cuda", 0))
for _ in range(2):
    L.run_rms_norm(ck, x, w, 1e-5)
    L.run_rms_norm(pk, x, w, 1e-5)
torch.cuda.synchronize()
