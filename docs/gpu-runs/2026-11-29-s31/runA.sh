set -u
export PYTHONUNBUFFERED=1
S=.gpu-stage
W=$(mktemp -d)
T0=$(date +%s)
t() { echo "== $1: $(( $(date +%s) - T0 )) s" | tee -a $W/steps.txt; }
stage=$S; . $S/scripts/gpu-unpack
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/env.txt
python3 -c "import torch,sys;print(torch.__version__, torch.version.cuda, sys.version.split()[0])" >> $W/env.txt 2>&1
K6="rms_norm_llama rms_norm_gemma rms_norm_torch fused_add_rms_norm layer_norm fused_add_layer_norm"
GPU_CERTS_MODELS=1 GPU_CERTS_KERNELS="$K6" timeout 470 bash $S/scripts/gpu-certs $W/certs /nonexistent > $W/certs-console.txt 2>&1
t "certs rc=$?"
cp $W/certs/certificates.tar.gz $OUT/ 2>/dev/null
PYTHONPATH=$S/python timeout 80 python3 $S/bench/sdpa_bias_probe.py $W/sdpa --calls 500 --repeats 3 > $W/sdpa.txt 2>&1
t "sdpa probe rc=$?"
xz -9 $W/certs/log.txt 2>/dev/null
tar czf $OUT/records.tgz -C $W .
cat $W/env.txt; tail -12 $W/certs/summary.md 2>/dev/null; tail -5 $W/certs-console.txt
grep -A20 "Where the operator" $W/sdpa.txt | head -24; tail -3 $W/sdpa.txt
cat $W/steps.txt
