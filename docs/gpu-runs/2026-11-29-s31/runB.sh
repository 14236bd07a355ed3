set -u
export PYTHONUNBUFFERED=1
S=.gpu-stage
W=$(mktemp -d)
T0=$(date +%s)
t() { echo "== $1: $(( $(date +%s) - T0 )) s" | tee -a $W/steps.txt; }
stage=$S; . $S/scripts/gpu-unpack
export PYTHONPATH=$PWD/$S/python
# 1. verification time of the six re-versioned kernels, nothing compiled before (issue 29)
for k in rms_norm_llama rms_norm_gemma rms_norm_torch fused_add_rms_norm layer_norm fused_add_layer_norm; do
  s=$(date +%s.%N)
  KERNELIZE_COMPILE_CACHE=0 KERNELIZE_TRACE=1 timeout 60 $S/bin/kernelize verify $S/kernels/$k --json $W/v-$k.json > $W/v-$k.out 2> $W/v-$k.trace
  rc=$?
  echo "verify $k rc=$rc wall $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $W/verify-time.txt
  grep -E 'compile .*NVRTC|the (bf16|f16|f32) cases now' $W/v-$k.trace | sed 's/^trace //' >> $W/verify-time.txt
  xz -9 $W/v-$k.trace
done
t "verify"
# 2. the backward red-team checks never run on a GPU (issue 30)
for g in torch_backward/ fused_add_backward/ activation_backward/; do
  KERNELIZE_GPU_ONLY=$g KERNELIZE_REQUIRE_GPU=1 KERNELIZE_FIXTURES=$PWD/verifier/tests/fixtures KERNELIZE_KERNELS=$PWD/$S/kernels timeout 150 $S/tests/gpu >> $W/redteam.txt 2>&1
  echo "group $g rc=$?" >> $W/redteam.txt
done
t "red team"
# 3. exact compile with products of one term pointwise (issue 31): rotary archs, bf16 and f32
timeout 170 python3 bench/exact_compile.py $W/exact --phase exact --archs llama,gemma --dtypes bf16,f32 --candidates kernelize+exact --no-seeds > $W/exact.txt 2>&1
t "exact rc=$?"
# 4. training and backward probes (issue 30)
(cd $S/python && KERNELIZE_BIN=$PWD/../bin/kernelize timeout 100 python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py -k "torch_rms_norms") > $W/torch-rms-training.txt 2>&1
t "nn.RMSNorm training rc=$?"
timeout 90 python3 scripts/backward_probe.py $W/bwd --rows 1 --cols 1024 --compile > $W/bwd.txt 2>&1
t "llama backward timing rc=$?"
timeout 70 python3 scripts/fused_add_backward_probe.py $W/fab --dtypes f32,f16 --budget 45 > $W/fab.txt 2>&1
t "fused add probe f32,f16 rc=$?"
tar czf $OUT/records.tgz -C $W .
grep -v "NVRTC\|cases now" $W/verify-time.txt; grep -E "^(ok|FAIL)|rc=|passed|failed" $W/redteam.txt
tail -14 $W/exact.txt; tail -3 $W/torch-rms-training.txt
grep -iA14 'timing\|speedup' $W/bwd.txt | tail -20; tail -12 $W/fab.txt
cat $W/steps.txt
