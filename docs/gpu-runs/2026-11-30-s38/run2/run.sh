#!/usr/bin/env bash
# Session 38 run 2: certificates of the seven forward kernels of the lean generic paths (models
# included), then the eager grid (real eager layers, odd widths among them) for the exact ones.
set -u
stage=.gpu-stage; . .gpu-stage/scripts/gpu-unpack
s=$(date +%s)
GPU_CERTS_MODELS=1 GPU_CERTS_KERNELS="rms_norm_llama rms_norm_gemma rms_norm_torch fused_add_rms_norm layer_norm fused_add_layer_norm rms_norm_llama_wbr" bash .gpu-stage/scripts/gpu-certs "$OUT/certs" /nonexistent > "$OUT/certs.log" 2>&1
echo "certs rc $? in $(( $(date +%s) - s )) s" | tee "$OUT/times.txt"
left=$(( 540 - ($(date +%s) - s) ))
if [ $left -gt 60 ]; then
  s2=$(date +%s)
  PYTHONUNBUFFERED=1 python3 scripts/eager_grid.py "$OUT/grid" --only rms_norm_llama,rms_norm_gemma,rms_norm_torch,fused_add_rms_norm,layer_norm,fused_add_layer_norm --max-seconds $((left - 30)) > "$OUT/grid.log" 2>&1
  echo "grid rc $? in $(( $(date +%s) - s2 )) s" | tee -a "$OUT/times.txt"
fi
tail -30 "$OUT/certs/summary.md" 2>/dev/null
tail -25 "$OUT/grid.log" 2>/dev/null
tar czf /tmp/all.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/all.tgz "$OUT/all.tgz"
