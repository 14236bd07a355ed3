# session 33 run 5 (nvidia-h200): the field's backward kernels through the hub as a user gets
# them there (issue 30): `kernelize serve` (SQLite, --no-bundled: only these candidates), the
# seven third-party backward candidates submitted with a `submit-python` token, one real
# `kernelize worker --drain --quick` on this GPU (Liger from its wheel, --candidate-packages),
# then the /field page of each backward op and the verdicts' JSON saved.
set -u
export PYTHONUNBUFFERED=1
stage=.gpu-stage
xz -d -f $stage/bin/kernelize.xz && chmod +x $stage/bin/kernelize
K=$PWD/$stage/bin/kernelize
PKG=$(mktemp -d)/site
python3 -m pip install -q --no-deps --no-index --target "$PKG" $stage/wheels/liger_kernel-*.whl
W=/tmp/r5; mkdir -p $W
db=sqlite://$W/field.db
. scripts/gpu-hub
"$K" migrate --db "$db" >/dev/null
start_hub "$db" $W/hub --no-bundled || exit 1
echo "hub at $base"
wt=$("$K" token create --scope worker --name w --db "$db" 2>/dev/null)
st=$("$K" token create --scope submit-python --name s --db "$db" 2>/dev/null)
key=$(mktemp -d)/worker.key
"$K" worker-key init --file "$key" >/dev/null 2>&1
"$K" worker-key register --key-file "$key" --db "$db" >/dev/null 2>&1
BACK="liger_rms_norm_llama_backward compile_llama_rms_norm_backward liger_layer_norm_backward compile_layer_norm_backward liger_swiglu_backward compile_silu_mul_backward liger_geglu_backward"
for c in $BACK; do "$K" submit kernels/third-party/$c --server "$base" --token "$st" 2>&1 | tail -1; done
t0=$(date +%s)
timeout 420 "$K" worker --server "$base" --token "$wt" --key-file "$key" --drain --quick --candidate-packages "$PKG" > $W/worker.txt 2> $W/worker.log
echo "worker rc=$? in $(( $(date +%s) - t0 )) s"; tail -3 $W/worker.txt
python3 - "$base" "$OUT" <<'PY'
import sys, urllib.request, re
base, out = sys.argv[1], sys.argv[2]
for op in ("rms_norm_backward", "layer_norm_backward", "silu_mul_backward", "gelu_tanh_mul_backward"):
    html = urllib.request.urlopen(f"{base}/field?op={op}").read().decode()
    open(f"{out}/field-{op}.html", "w").write(html)
    rows = re.findall(r"<tr[^>]*class=\"[^\"]*\"[^>]*>.*?</tr>", html, re.S)
    print(op, len(html), "bytes;", html.count("/kernels/"), "kernel links")
api = urllib.request.urlopen(f"{base}/v1/kernels").read().decode()
open(f"{out}/kernels.json", "w").write(api)
PY
cp $W/worker.txt $W/worker.log $OUT/ 2>/dev/null
