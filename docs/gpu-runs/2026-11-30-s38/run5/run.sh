#!/usr/bin/env bash
# Session 38 run 5: the verifier of bf706a3 (shared launch outputs told apart by pointer, the
# blocked keyed sum): verification times first (fresh machine), then the red team. (The previous
# binary did not fit beside the tree in the device tool's 64 MB for an A/B on one machine.)
# (Rewritten after the run from the session's record of it: the staged copy was removed before
# run 6. The commands are those that ran.)
set -u
stage=.gpu-stage; . .gpu-stage/scripts/gpu-unpack
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ; cat .gpu-stage/COMMIT; } > "$OUT/times.txt"
t0=$(date +%s)
KEEP_TRACES=1 SKIP_NVCC=1 PASSES=cold KERNELS="fused_add_rms_norm fused_add_layer_norm layer_norm rms_norm_llama rms_norm_llama_backward fused_add_rms_norm_backward layer_norm_backward rms_norm_torch_backward rms_norm_gemma_backward" bash bench/compile_time.sh "$OUT/new" > "$OUT/new.log" 2>&1
echo "new $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
s=$(date +%s)
KERNELIZE_GPU_ONLY="tools/,good/,backward/,gemma_backward/,torch_backward/,fused_add_backward/,ln_backward/,gated_backward/,gelu_backward/,activation_backward/,broken/" KERNELIZE_REQUIRE_GPU=1 KERNELIZE_FIXTURES=$PWD/verifier/tests/fixtures KERNELIZE_KERNELS=$PWD/kernels .gpu-stage/tests/gpu > "$OUT/redteam.txt" 2>&1
echo "red team rc $? in $(( $(date +%s) - s )) s; $(grep -c '^ok' "$OUT/redteam.txt") ok" >> "$OUT/times.txt"
cat "$OUT/times.txt"
for f in new; do grep -A14 "^| kernel" "$OUT/$f/compile-time.txt"; grep "round trips" "$OUT/$f/phases.txt"; done
grep -v "^ok" "$OUT/redteam.txt" | tail -5
tar czf /tmp/all.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/all.tgz "$OUT/all.tgz"
