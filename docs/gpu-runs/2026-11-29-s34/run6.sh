# session 34 run 6 (nvidia-h200-x4): default mode's decode b8, the two cells of the standing table
# measured in one round only (Qwen2: 0.49-1.40x in session 25; Mistral: 1.19x in session 27):
# Qwen2 in three jobs at once (a round each, the candidates' order reversed in the second),
# Mistral in one; each candidate in a process of its own.
set -u
export PYTHONUNBUFFERED=1
S="python3 bench/exact_compile.py \$JOB_OUT/s --phase speed --isolate --prefills none --decode 8 --greedy 0"
timeout 200 python3 bench/multi_gpu.py /tmp/r6 --timeout 185 \
  --job qwen2-a="$S --archs qwen2 --candidates compile,kernelize+exact" \
  --job qwen2-b="$S --archs qwen2 --candidates kernelize+exact,compile" \
  --job qwen2-c="$S --archs qwen2 --candidates compile,kernelize+exact" \
  --job mistral="$S --archs mistral --candidates kernelize+exact,compile"
cp /tmp/r6/results.tar.gz /tmp/r6/summary.md $OUT/ 2>/dev/null
cut -c1-240 /tmp/r6/summary.md | grep -v "^$" | head -50
