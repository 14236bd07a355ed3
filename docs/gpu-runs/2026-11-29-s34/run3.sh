# session 34 run 3 (nvidia-h200-x4): run 1's prefill jobs again (run 1 stopped them at its
# `--decode none`, which exact_compile.py did not take then): prefill 8x2048 under CUDA graphs,
# plain torch.compile(mode="reduce-overhead") against kernelize(compile="reduce-overhead"), each
# candidate in a process of its own, one architecture per GPU (Mistral and Gemma share one).
set -u
export PYTHONUNBUFFERED=1
RO="python3 bench/exact_compile.py \$JOB_OUT/s --phase speed --isolate --candidates compile-ro,kernelize+exact-ro --prefills 8x2048 --decode none --greedy 0"
timeout 500 python3 bench/multi_gpu.py /tmp/r3 --timeout 480 \
  --job llama="$RO --archs llama" \
  --job qwen2="$RO --archs qwen2" \
  --job mistral-gemma="$RO --archs mistral,gemma" \
  --job gpt2="$RO --archs gpt2"
cp /tmp/r3/results.tar.gz /tmp/r3/summary.md $OUT/ 2>/dev/null
cut -c1-240 /tmp/r3/summary.md | grep -v "^$" | head -60
