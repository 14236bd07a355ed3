# session 32 run 3 (nvidia-h200-x2): Gemma's reduce-overhead decode in two rounds; Qwen2's
# decode b1 profiled (each candidate in its own process, 2 rounds), then the shipped models'
# exact rows in every dtype (issue 31).
set -u
export PYTHONUNBUFFERED=1
S="python3 bench/exact_compile.py \$JOB_OUT --phase speed --isolate --rounds 2 --candidates compile-ro,kernelize+exact-ro --greedy 0"
timeout 590 python3 bench/multi_gpu.py /tmp/r3 --timeout 560 \
  --job gemma="$S --prefills none --decode 1,8 --archs gemma" \
  --job qwen2-prof="timeout 330 python3 bench/exact_compile_profile.py \$JOB_OUT/prof --candidates compile-ro,kernelize+exact-ro --batch 1 --steps 20 --arch qwen2 --isolate 2 > \$JOB_OUT/prof.txt 2>&1; tail -8 \$JOB_OUT/prof.txt; timeout 200 python3 bench/exact_compile.py \$JOB_OUT/shipped --phase exact --candidates kernelize+exact-ro,kernelize+exact --generate 8 --no-seeds --archs ''"
cp /tmp/r3/results.tar.gz /tmp/r3/summary.md $OUT/ 2>/dev/null
cut -c1-220 /tmp/r3/summary.md | grep -v "^$" | head -70
