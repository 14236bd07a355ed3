# session 33 run 1 (nvidia-h200-x2). Job "batches": exact compile at batches 1, 17 and 64 in one
# process for GPT-2, Mistral and Gemma (issue 31; session 32 run 5 did Llama and Qwen2). Job "ncu": Nsight Compute on the exact kernels and inductor's at decode rows (issue 29,
# bench/ncu_decode.py), then Qwen2's reduce-overhead decode b1 with the GPU span and the host's
# issue time per step (issue 31, bench/exact_compile_profile.py). From the repository root.
set -u
export PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
timeout 590 python3 bench/multi_gpu.py /tmp/r1 --timeout 560 \
  --job batches="python3 bench/exact_compile.py \$JOB_OUT/b --phase exact --archs gpt2,mistral,gemma --dtypes bf16 --candidates kernelize+exact-ro,kernelize+exact --no-seeds --no-shipped --batches 1,17,64" \
  --job ncu="timeout 200 $NCU --profile-from-start off --cache-control none --set full --import-source no -f -o \$JOB_OUT/decode python3 bench/ncu_decode.py \$JOB_OUT/n > \$JOB_OUT/ncu.log 2>&1; echo ncu rc=\$?; tail -3 \$JOB_OUT/ncu.log; $NCU --import \$JOB_OUT/decode.ncu-rep --page details --csv > \$JOB_OUT/details.csv 2>&1; $NCU --import \$JOB_OUT/decode.ncu-rep --page raw --csv > \$JOB_OUT/raw.csv 2>&1; $NCU --import \$JOB_OUT/decode.ncu-rep --page source --csv --print-source sass > \$JOB_OUT/sass.csv 2>&1; xz -T0 \$JOB_OUT/raw.csv \$JOB_OUT/sass.csv \$JOB_OUT/decode.ncu-rep; ls -la \$JOB_OUT; timeout 330 python3 bench/exact_compile_profile.py \$JOB_OUT/prof --candidates compile-ro,kernelize+exact-ro --batch 1 --steps 20 --arch qwen2 --isolate 2 > \$JOB_OUT/prof.txt 2>&1; tail -8 \$JOB_OUT/prof.txt"
cp /tmp/r1/results.tar.gz /tmp/r1/summary.md $OUT/ 2>/dev/null
cut -c1-240 /tmp/r1/summary.md | grep -v "^$" | head -70
