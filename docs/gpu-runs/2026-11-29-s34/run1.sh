# session 34 run 1 (nvidia-h200-x4), issue 31's speed cells not yet measured on an H200:
# - jobs "pre-a", "pre-b": prefill 8x2048 under CUDA graphs, plain torch.compile(mode=
#   "reduce-overhead") against kernelize(compile="reduce-overhead"), each candidate in a process
#   of its own (session 21 measured this column on an H100 in one process);
# - jobs "def-gemma", "def-gpt2": default mode, prefill 1x512 and decode b1/b8, two more rounds
#   (session 33 measured one);
# then the host's cost of one attention call by the way it is made (bench/op_overhead.py).
set -u
export PYTHONUNBUFFERED=1
S="python3 bench/exact_compile.py \$JOB_OUT/s --phase speed --isolate"
RO="$S --candidates compile-ro,kernelize+exact-ro --prefills 8x2048 --decode none --greedy 0"
DEF="$S --rounds 2 --candidates compile,kernelize+exact --prefills 1x512 --decode 1,8 --greedy 0"
timeout 595 python3 bench/multi_gpu.py /tmp/r1 --timeout 570 \
  --job pre-a="$RO --archs llama,qwen2,mistral" \
  --job pre-b="$RO --archs gemma,gpt2; python3 bench/op_overhead.py \$JOB_OUT/o --calls 1000" \
  --job def-gemma="$DEF --archs gemma" \
  --job def-gpt2="$DEF --archs gpt2"
cp /tmp/r1/results.tar.gz /tmp/r1/summary.md $OUT/ 2>/dev/null
cut -c1-240 /tmp/r1/summary.md | grep -v "^$" | head -90
