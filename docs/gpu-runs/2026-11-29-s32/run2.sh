# session 32 run 2 (nvidia-h200-x2): the reduce-overhead cells under 0.95x in one round, now in
# two rounds (issue 31): Qwen2 prefill 1x512 and decode b1 on one GPU; Llama prefill 1x512 on
# the other, then the relocatable-compile probe (issue 29).
set -u
export PYTHONUNBUFFERED=1
S="python3 bench/exact_compile.py \$JOB_OUT --phase speed --isolate --rounds 2 --candidates compile-ro,kernelize+exact-ro --greedy 0"
timeout 590 python3 bench/multi_gpu.py /tmp/r2 --timeout 580 \
  --job qwen2="$S --prefills 1x512 --decode 1 --archs qwen2" \
  --job llama="$S --prefills 1x512 --decode '' --archs llama; timeout 230 python3 bench/rdc_probe.py \$JOB_OUT/rdc --kernels rms_norm_llama,fused_add_rms_norm,layer_norm,fused_add_layer_norm > \$JOB_OUT/rdc_probe.txt 2>&1; tail -8 \$JOB_OUT/rdc_probe.txt"
cp /tmp/r2/results.tar.gz /tmp/r2/summary.md $OUT/ 2>/dev/null
cut -c1-220 /tmp/r2/summary.md | grep -v "^$" | head -60
