#!/usr/bin/env bash
# session 37 run 4: 6378cfa + the device-memory pool (uncommitted, .gpu-stage/DIRTY): the red team,
# then three kernels verified with the pool off and on (KERNELIZE_POOL=0/1), whole traces kept.
set -u
OUT=${OUT:?}
stage=.gpu-stage; . .gpu-stage/scripts/gpu-unpack
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
s=$(date +%s)
KERNELIZE_GPU_ONLY="tools/,good/,backward/,gemma_backward/,torch_backward/,fused_add_backward/,ln_backward/,gated_backward/,gelu_backward/,activation_backward/,broken/" \
  KERNELIZE_REQUIRE_GPU=1 KERNELIZE_FIXTURES=$PWD/verifier/tests/fixtures KERNELIZE_KERNELS=$PWD/kernels \
  .gpu-stage/tests/gpu > $OUT/redteam.txt 2>&1
echo "redteam rc $? $(( $(date +%s) - s )) s" | tee -a $OUT/redteam.txt
mkdir -p $OUT/ab; tmp=$(mktemp -d)
for k in rms_norm_llama rms_norm_llama_backward silu_mul_backward; do
  for pool in 0 1; do
    s=$(date +%s.%N)
    KERNELIZE_COMPILE_CACHE=$tmp/c-$k-$pool KERNELIZE_POOL=$pool KERNELIZE_TRACE=1 .gpu-stage/bin/kernelize verify kernels/$k --json $tmp/$k-$pool.json > $tmp/$k.pool$pool.log 2>&1
    rc=$?; e=$(date +%s.%N)
    echo "$k pool=$pool rc $rc wall $(python3 -c "print(f'{$e-$s:.1f}')") s $(grep -m1 '^overall:' $tmp/$k.pool$pool.log | cut -c1-40)" | tee -a $OUT/ab/summary.txt
  done
done
python3 bench/trace_phases.py $tmp/*.log > $OUT/ab/phases.txt
(cd $tmp && tar czf $OUT/ab/traces.tgz ./*.log)
grep -E "cold.log|pool.\.log|round trips" $OUT/ab/phases.txt
grep -E "^(ok|FAIL)" $OUT/redteam.txt | awk '{print $1}' | sort | uniq -c
tail -2 $OUT/redteam.txt
