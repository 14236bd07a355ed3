set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
t() { echo "== $1: $(( $(date +%s) - T0 )) s" | tee -a $OUT/steps.txt; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch,triton,transformers;print(torch.__version__,torch.version.cuda,triton.__version__,transformers.__version__)" | tee -a $OUT/env.txt
nproc | tee -a $OUT/env.txt
for opt in "" "--option=-Xptxas=--split-compile=0"; do
  timeout 100 python3 bench/nvrtc_time.py --kernels fused_add_layer_norm rms_norm_llama --jobs 4 --wall $opt --json $OUT/nvrtc$( [ -n "$opt" ] && echo -split).json >> $OUT/nvrtc.txt 2>&1
  t "nvrtc '$opt' rc=$?"
done
timeout 200 python3 bench/exact_compile.py $OUT/x --phase exact --archs mistral --dtypes bf16 --candidates kernelize+exact-cppw,compile-cppw --no-seeds > $OUT/exact-cppw.txt 2>&1
t "exact cppw rc=$?"
timeout 280 python3 bench/exact_compile.py $OUT/s --phase speed --isolate --rounds 1 --pin 2-5 --candidates compile,compile-cppw,kernelize+exact,kernelize+exact-cppw --prefills none --decode 1 --archs mistral > $OUT/speed.txt 2>&1
t "speed rc=$?"
tail -5 $OUT/nvrtc.txt; grep -h "mismatched" $OUT/x/*.jsonl 2>/dev/null | cut -c1-300
tail -25 $OUT/speed.txt
cat $OUT/steps.txt
