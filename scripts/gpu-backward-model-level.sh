#!/usr/bin/env bash
# The field's backward candidates at the model level (issue 30, docs/backward.md item 9) on the GPU
# machine: each Python candidate of kernels/third-party/*_backward as the autograd backward of the
# shipped tiny models' layers of its op (scripts/training_check.py --backward-candidate), beside
# eager and a control, bit for bit. Liger-Kernel from its PyPI wheel (.gpu-stage/wheels or
# .whl-liger, installed with `pip install --no-deps --target`); torch.compile's from the machine.
# Usage: scripts/gpu-backward-model-level.sh OUT_DIR [CANDIDATE...]   (STEPS, DTYPES to change the
# defaults: 20 steps; bf16,f16,f32; DRY=1 runs on the CPU, where the torch.compile candidates run)
set -u
OUT=${1:?OUT_DIR}; shift
PKG=$(mktemp -d)/site
mkdir -p "$OUT" "$PKG"
WHEEL=$(ls .gpu-stage/wheels/liger_kernel-*.whl .whl-liger/liger_kernel-*.whl 2>/dev/null | head -1)
if [ -n "$WHEEL" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$PKG" "$WHEEL" > "$OUT/pip.log" 2>&1 \
    || { echo "pip install failed:"; tail -5 "$OUT/pip.log"; }
else
  echo "no Liger-Kernel wheel in .gpu-stage/wheels or .whl-liger: its candidates will fail to import"
fi
CANDS=("$@")
[ ${#CANDS[@]} -gt 0 ] || CANDS=(liger_rms_norm_llama_backward compile_llama_rms_norm_backward
  liger_layer_norm_backward compile_layer_norm_backward liger_swiglu_backward
  compile_silu_mul_backward liger_geglu_backward)
for c in "${CANDS[@]}"; do
  echo "== $c"
  PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 timeout 900 python3 scripts/training_check.py \
    "$OUT/$c" --backward-candidate "kernels/third-party/$c" --models tiny-llama,tiny-gpt2,tiny-gemma \
    --dtypes "${DTYPES:-bf16,f16,f32}" --steps "${STEPS:-20}" ${DRY:+--dry-run} > "$OUT/$c.txt" 2>&1
  echo "rc $?"
  grep '^|' "$OUT/$c.txt" | grep -v '| 0 | no layer'
done
