#!/usr/bin/env bash
# session 37 run 3: the red team with 6378cfa (kz_place, kz_keyed_sums), then three
# verifications with their whole traces kept.
set -u
OUT=${OUT:?}
stage=.gpu-stage; . .gpu-stage/scripts/gpu-unpack
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
s=$(date +%s)
KERNELIZE_GPU_ONLY="tools/,good/,backward/,gemma_backward/,torch_backward/,fused_add_backward/,ln_backward/,gated_backward/,gelu_backward/,activation_backward/,broken/" \
  KERNELIZE_REQUIRE_GPU=1 KERNELIZE_FIXTURES=$PWD/verifier/tests/fixtures KERNELIZE_KERNELS=$PWD/kernels \
  .gpu-stage/tests/gpu > $OUT/redteam.txt 2>&1
echo "redteam rc $? $(( $(date +%s) - s )) s" | tee -a $OUT/redteam.txt
KEEP_TRACES=1 SKIP_NVCC=1 PASSES=cold KERNELS="rms_norm_llama rms_norm_llama_backward silu_mul_backward gelu_tanh_mul_backward fused_add_rms_norm layer_norm layer_norm_backward rms_norm_torch_backward fused_add_rms_norm_backward silu" bash bench/compile_time.sh $OUT/times > /dev/null 2>&1
tail -14 $OUT/times/compile-time.txt
grep -E "^(ok|FAIL|fail)" $OUT/redteam.txt | awk '{print $1}' | sort | uniq -c
tail -2 $OUT/redteam.txt
