set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
t() { echo "== $1: $(( $(date +%s) - T0 )) s" | tee -a $W/steps.txt; }
TS=4096x8192,16384x4096,8192x2048,2048x8192
timeout 200 python3 scripts/backward_probe.py $W/llama --against .gpu-bw/release-llama.cu --variant "minb1=-DKB_DX_MINB=1 -DKB_DWP_MINB=1" --timed $TS > $W/llama.txt 2>&1
t "llama rc=$?"
timeout 200 python3 scripts/backward_probe.py $W/gemma --semantics gemma --against .gpu-bw/release-gemma.cu --variant "minb1=-DKB_DX_MINB=1 -DKB_DWP_MINB=1" --timed $TS > $W/gemma.txt 2>&1
t "gemma rc=$?"
timeout 150 python3 scripts/fused_add_backward_probe.py $W/fab --budget 90 > $W/fab.txt 2>&1
t "fused add rc=$?"
tar czf $OUT/records-b.tgz -C $W .
for f in llama gemma; do grep "total differing\|ERROR" $W/$f.txt | head -5; grep -A14 "== timing" $W/$f.txt | cut -c1-330; done
tail -25 $W/fab.txt | cut -c1-300
cat $W/steps.txt
S=.gpu-stage; stage=$S; . $S/scripts/gpu-unpack
KERNELIZE_GPU_ONLY=backward/ KERNELIZE_REQUIRE_GPU=1 KERNELIZE_FIXTURES=$PWD/verifier/tests/fixtures KERNELIZE_KERNELS=$PWD/kernels timeout 120 $S/tests/gpu > $OUT/redteam-backward.txt 2>&1
echo "group backward/ rc=$?"; grep -E "^(ok|FAIL)" $OUT/redteam-backward.txt
