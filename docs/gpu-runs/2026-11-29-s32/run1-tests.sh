# run 1, job "tests": the Python-backward GPU tests never run on a GPU (issue 30), then the
# relocatable-compile probe (issue 29). From the repository root; JOB_OUT set by multi_gpu.py.
set -u
S=.gpu-stage
for f in $S/tests/*.xz; do xz -d -f "$f"; done; chmod +x $S/tests/*
export KERNELIZE_REQUIRE_GPU=1 KERNELIZE_PYTHON=python3 PYTHONPATH=$PWD/python
T0=$(date +%s); t() { echo "== $1: $(( $(date +%s) - T0 )) s"; }
timeout 100 $S/tests/backward_reference --nocapture > $JOB_OUT/backward_reference.txt 2>&1; t "backward_reference rc=$?"
timeout 150 $S/tests/python_backward --nocapture on_a_gpu > $JOB_OUT/python_backward_gpu.txt 2>&1; t "python_backward on_a_gpu rc=$?"
KERNELIZE_GPU_ONLY=backward/ KERNELIZE_FIXTURES=$PWD/verifier/tests/fixtures KERNELIZE_KERNELS=$PWD/kernels timeout 100 $S/tests/gpu > $JOB_OUT/gpu_backward.txt 2>&1; t "gpu.rs backward/ rc=$?"
grep -E "test result|passed|FAILED|panicked" $JOB_OUT/*.txt | head -20
timeout 250 python3 bench/rdc_probe.py $JOB_OUT/rdc --kernels rms_norm_llama,fused_add_rms_norm,layer_norm,fused_add_layer_norm > $JOB_OUT/rdc_probe.txt 2>&1; t "rdc probe rc=$?"
tail -8 $JOB_OUT/rdc_probe.txt
