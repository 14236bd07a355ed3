#!/usr/bin/env bash
# Session 38 run 1: verification times of the lean-generic forward kernels (tree) against the
# released ones (.gpu-stage/old), and of the backward kernels with session 37's unrun verifier
# changes; then the red team (session 37's review refactor, tools/ included).
set -u
stage=.gpu-stage; . .gpu-stage/scripts/gpu-unpack
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u +%FT%TZ; cat .gpu-stage/COMMIT; } > "$OUT/machine.txt" 2>&1
F="silu layer_norm rms_norm_llama fused_add_layer_norm fused_add_rms_norm rms_norm_gemma rms_norm_torch"
KEEP_TRACES=1 SKIP_NVCC=1 PASSES=cold KERNELS="$F" bash bench/compile_time.sh "$OUT/new" > "$OUT/new.log" 2>&1
KERNELS_ROOT=.gpu-stage/old KEEP_TRACES=1 SKIP_NVCC=1 PASSES=cold KERNELS="${F#silu }" bash bench/compile_time.sh "$OUT/old" > "$OUT/old.log" 2>&1
KEEP_TRACES=1 SKIP_NVCC=1 PASSES=cold KERNELS="layer_norm_backward rms_norm_torch_backward rms_norm_llama_backward fused_add_rms_norm_backward" bash bench/compile_time.sh "$OUT/backward" > "$OUT/backward.log" 2>&1
s=$(date +%s)
KERNELIZE_GPU_ONLY="tools/,good/,backward/,gemma_backward/,torch_backward/,fused_add_backward/,ln_backward/,gated_backward/,gelu_backward/,activation_backward/,broken/" KERNELIZE_REQUIRE_GPU=1 KERNELIZE_FIXTURES=$PWD/verifier/tests/fixtures KERNELIZE_KERNELS=$PWD/kernels .gpu-stage/tests/gpu > "$OUT/redteam.txt" 2>&1
echo "red team rc $? in $(( $(date +%s) - s )) s" | tee -a "$OUT/machine.txt"
for f in new old backward; do echo "== $f"; grep -A40 "^| kernel" "$OUT/$f/compile-time.txt"; grep " cold " "$OUT/$f/compile-time.txt" | cut -c1-160; done
grep -E "test result|FAILED|panicked" "$OUT/redteam.txt" | head -20
