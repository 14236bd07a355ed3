set -u
export PYTHONUNBUFFERED=1
S=.gpu-stage
T0=$(date +%s)
t() { echo "== $1: $(( $(date +%s) - T0 )) s" | tee -a $OUT/steps.txt; }
stage=$S; . $S/scripts/gpu-unpack
for k in rms_norm_llama layer_norm fused_add_rms_norm; do
  s=$(date +%s)
  KERNELIZE_COMPILE_CACHE=0 KERNELIZE_TRACE=1 timeout 90 $S/bin/kernelize verify $S/kernels/$k --json $OUT/v-$k.json > $OUT/v-$k.out 2> $OUT/v-$k.trace
  echo "verify $k rc=$? wall $(( $(date +%s) - s )) s" | tee -a $OUT/verify-time.txt
  for ph in generate "3 candidate launches" reference integrity "determinism+exactness" "batch invariance" "address placements"; do
    grep -F " $ph: " $OUT/v-$k.trace | awk -v ph="$ph" -v k=$k '{for(i=1;i<=NF;i++) if($i=="s" && $(i-1) ~ /^[0-9.]+$/) s+=$(i-1)} END{printf "%s %-24s %.2f s\n", k, ph, s}' >> $OUT/verify-time.txt
  done
  grep -E 'the (bf16|f16|f32) cases now|compile .*NVRTC' $OUT/v-$k.trace | sed 's/^trace //' >> $OUT/verify-time.txt
done
t "verify"
GPU_CERTS_MODELS=1 GPU_CERTS_KERNELS="rms_norm_torch_backward" timeout 150 bash $S/scripts/gpu-certs $OUT/certs /nonexistent > $OUT/certs-console.txt 2>&1
t "certs rc=$?"
timeout 130 python3 $S/scripts/rms_torch_backward_probe.py $OUT/rtb --budget 70 > $OUT/rtb.txt 2>&1
t "rms torch probe rc=$?"
timeout 110 python3 -m pytest -q -rs $S/python/tests/test_gpu.py -k "tiny_gpt2_training" > $OUT/gpt2-training.txt 2>&1
t "gpt2 training tests rc=$?"
cat $OUT/verify-time.txt | grep -v NVRTC
tail -3 $OUT/certs-console.txt; tail -25 $OUT/rtb.txt; tail -3 $OUT/gpt2-training.txt
cat $OUT/steps.txt
