# session 34 run 2 (nvidia-h200-x4).
# - jobs "ln-bf16", "ln-f16", "ln-f32" (issue 30): QuACK PR 136's LayerNorm backward table, one
#   dtype per GPU: scripts/ln_backward_probe.py's timing alone (M 64..8192 x N 256..16384; eager's
#   backward op and autograd, torch.compile, Liger 0.8.5 and the bundled kernel, each with its
#   gradients' bits against eager autograd) and the copy bandwidth in the same job;
# - job "hoist" (issue 31): default-mode Qwen2 decode b1, the exact backend with and without the
#   hoisted mask conversion, and plain compile, each candidate in a process of its own, 2 rounds.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/liger .whl-liger/liger_kernel-*.whl 2>&1 | tail -2
LN="PYTHONPATH=/tmp/liger python3 scripts/ln_backward_probe.py \$JOB_OUT --no-grid --timing-budget 500 --timed-dtypes"
timeout 595 python3 bench/multi_gpu.py /tmp/r2 --timeout 570 \
  --job ln-bf16="$LN bf16" \
  --job ln-f16="$LN f16" \
  --job ln-f32="$LN f32" \
  --job hoist="python3 bench/exact_compile.py \$JOB_OUT/s --phase speed --isolate --rounds 2 --candidates kernelize+exact,kernelize+exact-nohoist,compile --prefills none --decode 1 --greedy 0 --archs qwen2"
cp /tmp/r2/results.tar.gz /tmp/r2/summary.md $OUT/ 2>/dev/null
cut -c1-240 /tmp/r2/summary.md | grep -v "^$" | head -120
