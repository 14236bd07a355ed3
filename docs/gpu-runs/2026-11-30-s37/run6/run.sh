#!/usr/bin/env bash
# session 37 run 6: verifications alone on a fresh machine (nothing compiled before: no red team
# first, whose fixtures leave NVRTC's cross-process cache warm for the bundled sources they share)
set -u
OUT=${OUT:?}
stage=.gpu-stage; . .gpu-stage/scripts/gpu-unpack
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
KEEP_TRACES=1 SKIP_NVCC=1 PASSES=cold KERNELS="silu silu_backward silu_mul_backward gelu_tanh_mul_backward rms_norm_llama_backward fused_add_rms_norm_backward layer_norm_backward rms_norm_torch_backward rms_norm_llama rms_norm_gemma rms_norm_torch fused_add_rms_norm layer_norm fused_add_layer_norm" timeout 300 bash bench/compile_time.sh $OUT/times > /dev/null 2>&1
tail -18 $OUT/times/compile-time.txt
