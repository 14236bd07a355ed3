# session 34 run 5 (nvidia-h200-x4, run 4's machine): the divergence locator under plain
# torch.compile on the current tree: the seeds, the two blocks and Llama, a dtype per GPU.
set -u
export PYTHONUNBUFFERED=1
L="python3 bench/exact_compile.py \$JOB_OUT/l --phase locate --archs llama --no-shipped"
timeout 250 python3 bench/multi_gpu.py /tmp/r5 --timeout 230 \
  --job bf16="$L --dtypes bf16" --job f16="$L --dtypes f16" --job f32="$L --dtypes f32"
cp /tmp/r5/results.tar.gz /tmp/r5/summary.md $OUT/ 2>/dev/null
cut -c1-260 /tmp/r5/summary.md | grep -v "^$" | head -70
