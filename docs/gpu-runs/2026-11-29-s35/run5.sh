set -u
S=.gpu-stage
W=$OUT/w; mkdir -p $W; T0=$(date +%s)
stage=$S; . $S/scripts/gpu-unpack
GPU_CERTS_MODELS=1 GPU_CERTS_KERNELS="rms_norm_llama_backward rms_norm_gemma_backward fused_add_rms_norm_backward" timeout 270 bash $S/scripts/gpu-certs $W/certs /nonexistent > $W/certs-console.txt 2>&1
echo "certs rc=$? $(( $(date +%s) - T0 )) s"
cp $W/certs/certificates.tar.gz $OUT/ 2>/dev/null
xz -9 $W/certs/log.txt 2>/dev/null
tar czf $OUT/records.tgz -C $W .
tail -6 $W/certs/summary.md 2>/dev/null; tail -3 $W/certs-console.txt
