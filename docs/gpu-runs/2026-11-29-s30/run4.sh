set -u
export PYTHONUNBUFFERED=1
S=.gpu-stage
W=$(mktemp -d)
T0=$(date +%s)
t() { echo "== $1: $(( $(date +%s) - T0 )) s" | tee -a $W/steps.txt; }
stage=$S; . $S/scripts/gpu-unpack
GPU_CERTS_MODELS=1 GPU_CERTS_KERNELS="rms_norm_torch_backward fused_add_rms_norm_backward" timeout 140 bash $S/scripts/gpu-certs $W/certs /nonexistent > $W/certs-console.txt 2>&1
t "certs rc=$?"
cp $W/certs/certificates.tar.gz $OUT/ 2>/dev/null
timeout 55 python3 $S/scripts/fused_add_backward_probe.py $W/fab --budget 30 > $W/fab.txt 2>&1
t "fused add probe rc=$?"
P=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $P .whl-liger/*.whl > $W/pip.txt 2>&1
timeout 40 python3 $S/scripts/backward_field_check.py $W/field --dtypes bf16 --shapes 7x1000,64x4096,4096x4096 --package-dir $P > $W/field.txt 2>&1
t "field check rc=$?"
timeout 45 python3 $S/scripts/backward_probe.py $W/bwd --rows 1 --cols 1024 --compile > $W/bwd.txt 2>&1
t "llama backward timing rc=$?"
tar czf $OUT/records.tgz -C $W .
tail -4 $W/certs/summary.md 2>/dev/null; tail -4 $W/certs-console.txt
tail -22 $W/fab.txt; tail -30 $W/field.txt; grep -A14 -i 'timing\|speedup' $W/bwd.txt | tail -24
cat $W/steps.txt
