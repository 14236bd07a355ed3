# session 32 run 1 (nvidia-h200-x2): the full GPU exact phase after session 31's rewrites (issue
# 31), one dtype a job; the Python-backward GPU tests and the relocatable-compile probe.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
X="python3 bench/exact_compile.py \$JOB_OUT --phase exact --seed-candidates kernelize+exact-ro,kernelize+exact --candidates kernelize+exact-ro,kernelize+exact --generate 8 --dtypes"
timeout 585 python3 bench/multi_gpu.py /tmp/r1 --timeout 290 \
  --job exact-bf16="$X bf16" --job exact-f16="$X f16" --job exact-f32="$X f32" \
  --job tests="bash .gpu-stage/run1-tests.sh"
cp /tmp/r1/results.tar.gz /tmp/r1/summary.md $OUT/ 2>/dev/null
cut -c1-160 /tmp/r1/summary.md | grep -v "^$" | head -130
