#!/usr/bin/env bash
# Verify the third-party Python candidates (kernels/third-party, SPEC 2b) on the GPU machine:
# Liger-Kernel from its PyPI wheel (carried in .gpu-stage/wheels, installed with
# `pip install --no-deps --target`), torch.compile and F.rms_norm from the machine's torch.
# Usage: scripts/gpu-python-candidates.sh OUT_DIR [CANDIDATE...]   (quick suite, bf16;
# DTYPES="f16 f32" verifies those dtypes instead, each candidate's entries permitting)
# MODELS=models also runs the model level (each candidate in the shipped tiny models, in the
# same confined child as its cases; give PER_CANDIDATE_S room for it, e.g. 300).
# Needs target/release/kernelize (built elsewhere: the GPU machine has no Rust toolchain).
set -u
OUT=${1:?OUT_DIR}; shift
BIN=${KERNELIZE_BIN:-target/release/kernelize}
PKG=$(mktemp -d)/site
mkdir -p "$OUT" "$PKG"
python3 -m pip install -q --no-deps --no-index --target "$PKG" .gpu-stage/wheels/liger_kernel-*.whl \
  > "$OUT/pip.log" 2>&1 || { echo "pip install failed:"; tail -5 "$OUT/pip.log"; }
# The candidate's child runs `python3 -I` (no user site-packages): if torch lives there, pass it.
EXTRA=()
if ! python3 -I -c 'import torch' 2>/dev/null; then
  EXTRA=(--candidate-packages "$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')")
  echo "torch is not importable with -I: passing ${EXTRA[*]}"
fi
MODEL_ARGS=()
if [ -n "${MODELS:-}" ]; then
  MODEL_ARGS=(--model "$MODELS")
fi
DT_ARGS=()
for d in ${DTYPES:-bf16}; do DT_ARGS+=(--dtype "$d"); done
CANDS=("$@")
[ ${#CANDS[@]} -gt 0 ] || CANDS=(liger_rms_norm_llama f_rms_norm_as_llama compile_llama_rms_norm
  liger_layer_norm compile_layer_norm liger_swiglu compile_silu_mul liger_geglu
  liger_rms_norm_gemma compile_gemma_rms_norm
  liger_rms_norm_llama_backward compile_llama_rms_norm_backward liger_layer_norm_backward
  compile_layer_norm_backward liger_swiglu_backward compile_silu_mul_backward liger_geglu_backward)
{
  date -u +"date %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu /'
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)'
  python3 -c 'import transformers; print("transformers", transformers.__version__)'
  echo "command: MODELS=${MODELS:-} DTYPES=\"${DTYPES:-bf16}\" scripts/gpu-python-candidates.sh OUT ${CANDS[*]} (kernelize verify --quick ${DT_ARGS[*]} --candidate-packages PKG ${MODEL_ARGS[*]})"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
MEM=32
for c in "${CANDS[@]}"; do
  t0=$(date +%s)
  timeout "${PER_CANDIDATE_S:-60}" "$BIN" verify "kernels/third-party/$c" --quick "${DT_ARGS[@]}" \
    --candidate-packages "$PKG" "${EXTRA[@]}" "${MODEL_ARGS[@]}" --candidate-memory-gib "$MEM" --json "$OUT/$c.json" \
    > "$OUT/$c.log" 2>&1
  rc=$?
  echo "$c: exit $rc in $(( $(date +%s) - t0 )) s"
  if [ $rc -ne 0 ] && [ ! -s "$OUT/$c.json" ]; then tail -4 "$OUT/$c.log"; fi
done
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"\n{'candidate':26} {'dtype':5} {'class':10} {'mism.frac':>9} {'max_ulp':>7} {'det':>4} {'batch':>5} {'integ':>5} {'GB/s@4096x8192':>14} {'speedup':>7}")
for f in sorted(os.listdir(out)):
    if not f.endswith(".json"):
        continue
    r = json.load(open(os.path.join(out, f)))
    for dt, v in r["summary"]["per_dtype"].items():
        gb = v.get("gbps_4096x8192")
        su = v.get("speedup_4096x8192")
        errs = sum(1 for c in r["cases"] if c["status"] == "error" and c["dtype"] == dt)
        print(f"{f[:-5]:26} {dt:5} {str(v['class'])[:10]:10} {v['max_mismatch_fraction']:9.4f} {v['max_ulp']:7d} "
              f"{str(v['deterministic']):>4} {str(v['batch_invariant']):>5} {str(v['integrity_ok']):>5} "
              f"{'-' if gb is None else f'{gb:.0f}':>14} {'-' if su is None else f'{su:.2f}':>7}  errors={errs}")
    print("   python:", json.dumps(r.get("python")))
    for m in r.get("model", []):
        print(f"   model {m['model_name']:12} {m['dtype']:5} max logit diff {m['max_logit_abs_diff']:.3e}"
              f"  argmax {m['argmax_match_fraction']:.4f}  top5 {m['top5_overlap']:.4f}  KL {m['mean_kl']:.2e}")
    for n in r.get("model_notes", []):
        print("   model note:", n)
PY
