set -u
export PYTHONUNBUFFERED=1
S=.gpu-stage
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
t() { echo "== $1: $(( $(date +%s) - T0 )) s" | tee -a $W/steps.txt; }
stage=$S; . $S/scripts/gpu-unpack
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/env.txt
python3 -c "import torch,sys;print(torch.__version__, torch.version.cuda, sys.version.split()[0])" >> $W/env.txt 2>&1
GPU_CERTS_KERNELS="rms_norm_llama_backward rms_norm_gemma_backward fused_add_rms_norm_backward" timeout 330 bash $S/scripts/gpu-certs $W/certs /nonexistent > $W/certs-console.txt 2>&1
t "certs rc=$?"
cp $W/certs/certificates.tar.gz $OUT/ 2>/dev/null
for g in backward/ gemma_backward/ fused_add_backward/; do
  KERNELIZE_GPU_ONLY=$g KERNELIZE_REQUIRE_GPU=1 KERNELIZE_FIXTURES=$PWD/verifier/tests/fixtures KERNELIZE_KERNELS=$PWD/kernels timeout 120 $S/tests/gpu >> $W/redteam.txt 2>&1
  echo "group $g rc=$?" >> $W/redteam.txt
done
t "red team"
xz -9 $W/certs/log.txt 2>/dev/null
tar czf $OUT/records-a.tgz -C $W .
cat $W/env.txt; tail -12 $W/certs/summary.md 2>/dev/null; tail -5 $W/certs-console.txt
grep -E "^(ok|FAIL)|rc=|passed|failed" $W/redteam.txt | tail -20
cat $W/steps.txt
