set -u
export PYTHONUNBUFFERED=1
S=.gpu-stage
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
t() { echo "== $1: $(( $(date +%s) - T0 )) s" | tee -a $W/steps.txt; }
stage=$S; . $S/scripts/gpu-unpack
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/env.txt
GPU_CERTS_KERNELS="rms_norm_llama_backward rms_norm_gemma_backward fused_add_rms_norm_backward" timeout 300 bash $S/scripts/gpu-certs $W/certs /nonexistent > $W/certs-console.txt 2>&1
t "certs rc=$?"
cp $W/certs/certificates.tar.gz $OUT/ 2>/dev/null
PYTHONPATH=$PWD/python timeout 170 python3 scripts/backward_probe.py $W/llama --against .gpu-bw/release-llama.cu --variant "minb1=-DKB_DX_MINB=1 -DKB_DWP_MINB=1" --timed 4096x8192,16384x4096,8192x2048,2048x8192 > $W/llama.txt 2>&1
t "llama rc=$?"
xz -9 $W/certs/log.txt 2>/dev/null
tar czf $OUT/records.tgz -C $W .
cat $W/env.txt; tail -6 $W/certs/summary.md 2>/dev/null
grep "total differing\|ERROR" $W/llama.txt | head -5
cat $W/steps.txt
