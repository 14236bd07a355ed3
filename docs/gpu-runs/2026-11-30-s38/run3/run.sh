#!/usr/bin/env bash
# Session 38 run 3: GPU time per call of the lean-generic forward kernels (the tree) against the
# released ones (.gpu-stage/old), CUDA graphs, bf16: (a) model widths, rows 1-64 and the large
# shapes (the decode and staged engines, unchanged in source); (b) odd widths (the generic paths).
set -u
K=rms_norm_llama,rms_norm_gemma,rms_norm_torch,fused_add_rms_norm,layer_norm,fused_add_layer_norm
s=$(date +%s)
PYTHONUNBUFFERED=1 python3 bench/decode_rows.py "$OUT/model-widths" --before .gpu-stage/old --large --no-compile --kernels $K > "$OUT/model-widths.log" 2>&1
echo "a rc $? $(( $(date +%s) - s )) s"
PYTHONUNBUFFERED=1 python3 bench/decode_rows.py "$OUT/odd-widths" --before .gpu-stage/old --large --no-compile --kernels $K \
  --widths 1001,4100 --rows 1,16,64 --large-shapes 4096x1001,4096x4100,32768x4100 > "$OUT/odd-widths.log" 2>&1
echo "b rc $? $(( $(date +%s) - s )) s"
tail -60 "$OUT/model-widths.log" | grep "^|" | head -70
tail -60 "$OUT/odd-widths.log" | grep "^|"
