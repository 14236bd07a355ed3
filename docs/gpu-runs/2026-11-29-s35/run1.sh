set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch;print(torch.__version__, torch.version.cuda)"
W=$OUT/w; mkdir -p $W
timeout 400 python3 scripts/backward_probe.py $W/llama --against .gpu-bw/release-llama.cu \
  --variant "minb1=-DKB_DX_MINB=1 -DKB_DWP_MINB=1" --variant "minb3=-DKB_DX_MINB=3" --variant "nv2=-DKB_DX_NV=2" \
  --timed 4096x8192,16384x4096,8192x2048,2048x8192 > $W/llama.txt 2>&1
echo "probe rc=$?"
tar czf $OUT/run1.tgz -C $W .
grep -B2 -A40 "== timing" $W/llama.txt | cut -c1-900
grep "total differing\|ERROR" $W/llama.txt | head
