#!/usr/bin/env bash
# Session 38 run 4: the forward kernels with batched streamed units (the tree): verification
# time first (fresh machine), then GPU time per call against the released kernels (.gpu-stage/old)
# and the unbatched lean version certified in run 2 (.gpu-stage/lean1), odd and model widths;
# then the certificates (models included) and the eager grid.
set -u
stage=.gpu-stage; . .gpu-stage/scripts/gpu-unpack
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ; } > "$OUT/times.txt"
t0=$(date +%s)
KEEP_TRACES=1 SKIP_NVCC=1 PASSES=cold KERNELS="layer_norm rms_norm_llama fused_add_layer_norm fused_add_rms_norm rms_norm_gemma rms_norm_torch" bash bench/compile_time.sh "$OUT/verify" > "$OUT/verify.log" 2>&1
echo "verify $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
K=rms_norm_llama,rms_norm_gemma,rms_norm_torch,fused_add_rms_norm,layer_norm,fused_add_layer_norm
PYTHONUNBUFFERED=1 python3 bench/decode_rows.py "$OUT/odd-widths" --before .gpu-stage/old --variant lean1=.gpu-stage/lean1 --large --no-compile --kernels $K \
  --widths 1001,4100 --rows 1,16,64 --large-shapes 4096x1001,4096x4100,32768x4100 > "$OUT/odd-widths.log" 2>&1
echo "odd $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
PYTHONUNBUFFERED=1 python3 bench/decode_rows.py "$OUT/model-widths" --before .gpu-stage/old --variant lean1=.gpu-stage/lean1 --large --no-compile --kernels $K \
  --rows 1,16,64 > "$OUT/model-widths.log" 2>&1
echo "model $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
GPU_CERTS_MODELS=1 GPU_CERTS_KERNELS="rms_norm_llama rms_norm_gemma rms_norm_torch fused_add_rms_norm layer_norm fused_add_layer_norm rms_norm_llama_wbr" bash .gpu-stage/scripts/gpu-certs "$OUT/certs" /nonexistent > "$OUT/certs.log" 2>&1
echo "certs rc $? $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
left=$(( 560 - ($(date +%s) - t0) ))
if [ $left -gt 50 ]; then
  PYTHONUNBUFFERED=1 python3 scripts/eager_grid.py "$OUT/grid" --only rms_norm_llama,rms_norm_gemma,rms_norm_torch,fused_add_rms_norm,layer_norm,fused_add_layer_norm --max-seconds $((left - 20)) > "$OUT/grid.log" 2>&1
  echo "grid rc $? $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
fi
cat "$OUT/times.txt"
grep -A12 "^| kernel" "$OUT/verify/compile-time.txt"; grep " cold " "$OUT/verify/compile-time.txt" | cut -c1-120
grep "^|" "$OUT/odd-widths.log" | tail -56
grep "^|" "$OUT/model-widths.log" | tail -50 | cut -c1-200
tail -8 "$OUT/certs/summary.md" 2>/dev/null; tail -3 "$OUT/grid.log" 2>/dev/null
tar czf /tmp/all.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/all.tgz "$OUT/all.tgz"
