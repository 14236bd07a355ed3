# session 33 run 3 (nvidia-h200-x2): decode-row variants of the exact kernels (issue 29), each
# timed beside this checkout's kernels in one process (bench/decode_rows.py, GPU time per call in
# a CUDA graph; bits against eager). The variant folders (.gpu-var/, carried) are copies of
# kernels/ made on the build machine: g64 and g128, the gated kernels (silu_mul, gelu_tanh_mul)
# launched in blocks of 64 or 128 threads instead of 256 (manifest only: a decode row's
# elements over 4x or 2x as many SMs, 2 or 4 warps each); exit, the row kernels' entries
# returning at once in a block of index >= rows (the persistent grid's idle blocks, 395 of 396
# at one row, ran 36 instructions each before exiting: ncu, run 1).
set -u
export PYTHONUNBUFFERED=1
timeout 590 python3 bench/multi_gpu.py /tmp/r3 --timeout 420 \
  --job gated="python3 bench/decode_rows.py \$JOB_OUT/g --variant g64=.gpu-var/g64 --variant g128=.gpu-var/g128 --kernels silu_mul --rows 1,4,16,64 --large" \
  --job norms="python3 bench/decode_rows.py \$JOB_OUT/n --variant exit=.gpu-var/exit --kernels rms_norm_llama,fused_add_rms_norm,layer_norm --rows 1,4,16,64 --large --no-compile"
cp /tmp/r3/results.tar.gz /tmp/r3/summary.md $OUT/ 2>/dev/null
cut -c1-260 /tmp/r3/summary.md | grep -v "^$" | head -90
