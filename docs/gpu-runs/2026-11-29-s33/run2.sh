# session 33 run 2 (nvidia-h200-x2). Job "cands": the seven third-party backward candidates
# verified for the first time (issue 30; scripts/gpu-python-candidates.sh, quick suite, bf16;
# the release binary built with opt-level "s", LTO and panic=abort so that it and the Liger
# wheel fit the device tool's 64 MiB beside the tree). Job "default": default-mode speed of
# Gemma and GPT-2, the two architectures never measured in default mode (issue 31), each
# candidate in its own process, 2 rounds.
set -u
export PYTHONUNBUFFERED=1
xz -d -f .gpu-stage/bin/kernelize.xz && chmod +x .gpu-stage/bin/kernelize
BACK="liger_rms_norm_llama_backward compile_llama_rms_norm_backward liger_layer_norm_backward compile_layer_norm_backward liger_swiglu_backward compile_silu_mul_backward liger_geglu_backward"
timeout 590 python3 bench/multi_gpu.py /tmp/r2 --timeout 560 \
  --job cands="KERNELIZE_BIN=.gpu-stage/bin/kernelize PER_CANDIDATE_S=70 bash scripts/gpu-python-candidates.sh \$JOB_OUT/c $BACK" \
  --job default="python3 bench/exact_compile.py \$JOB_OUT/s --phase speed --isolate --rounds 2 --candidates compile,kernelize+exact --prefills 1x512 --decode 1,8 --greedy 0 --archs gemma,gpt2"
cp /tmp/r2/results.tar.gz /tmp/r2/summary.md $OUT/ 2>/dev/null
cut -c1-240 /tmp/r2/summary.md | grep -v "^$" | head -80
