# session 33 run 4 (nvidia-h200-x2): default mode's decode b1 under the profiler, plain
# torch.compile() against kernelize(compile=True), each in a process of its own (issue 31's
# remaining misses: Mistral 0.83x, Qwen2 0.81-0.90x): per step the wall, the host's issue
# time, the GPU span and its idle gaps, and the host's own time per operator.
set -u
export PYTHONUNBUFFERED=1
P="python3 bench/exact_compile_profile.py \$JOB_OUT/p --candidates compile,kernelize+exact --batch 1 --steps 20 --isolate 1"
timeout 590 python3 bench/multi_gpu.py /tmp/r4 --timeout 400 \
  --job mistral="$P --arch mistral" \
  --job qwen2="$P --arch qwen2"
cp /tmp/r4/results.tar.gz /tmp/r4/summary.md $OUT/ 2>/dev/null
cut -c1-260 /tmp/r4/summary.md | grep -v "^$" | head -40
