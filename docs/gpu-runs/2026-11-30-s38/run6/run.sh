#!/usr/bin/env bash
# Session 38 run 6: the largest cases' host work started with the verification
# (ahead::prefetch_early, c17943d): verification times first (fresh machine), then the same
# kernels with KERNELIZE_AHEAD_EARLY=0 (its cases' round trips: the second pass's NVRTC may hit
# NVRTC's own cache, so its wall times are not compared); then the backward red team.
set -u
stage=.gpu-stage; . .gpu-stage/scripts/gpu-unpack
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ; cat .gpu-stage/COMMIT; } > "$OUT/times.txt"
t0=$(date +%s)
K="rms_norm_llama_backward fused_add_rms_norm_backward layer_norm_backward rms_norm_torch_backward rms_norm_gemma_backward fused_add_rms_norm fused_add_layer_norm"
KEEP_TRACES=1 SKIP_NVCC=1 PASSES=cold KERNELS="$K" bash bench/compile_time.sh "$OUT/early" > "$OUT/early.log" 2>&1
echo "early $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
KERNELIZE_AHEAD_EARLY=0 KEEP_TRACES=1 SKIP_NVCC=1 PASSES=cold KERNELS="$K" bash bench/compile_time.sh "$OUT/no-early" > "$OUT/no-early.log" 2>&1
echo "no-early $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
s=$(date +%s)
KERNELIZE_GPU_ONLY="tools/,backward/,broken/" KERNELIZE_REQUIRE_GPU=1 KERNELIZE_FIXTURES=$PWD/verifier/tests/fixtures KERNELIZE_KERNELS=$PWD/kernels timeout 100 .gpu-stage/tests/gpu > "$OUT/redteam.txt" 2>&1
echo "red team rc $? in $(( $(date +%s) - s )) s; $(grep -c '^ok' "$OUT/redteam.txt") ok" >> "$OUT/times.txt"
cat "$OUT/times.txt"
for f in early no-early; do echo "== $f"; grep -A10 "^| kernel" "$OUT/$f/compile-time.txt"; grep "round trips" "$OUT/$f/phases.txt" | grep -v "small cases" | cut -c1-250; done
grep -v "^ok" "$OUT/redteam.txt" | tail -3
tar czf /tmp/all.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/all.tgz "$OUT/all.tgz"
